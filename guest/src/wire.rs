//! A bound on how deeply a plan's protobuf messages nest, checked before the
//! plan is decoded.
//!
//! The decoder (prost, built without its fixed limit of 100, which refused
//! plain flows with 40 `+` terms) and the lowering that follows recurse once
//! per nested message, on the sandbox's stack. So the engine first walks the
//! bytes with an explicit stack, without decoding anything, and refuses a plan
//! whose messages nest deeper than [`MAX_PLAN_NESTING`]. The walk does not know
//! the schema: it takes every length-delimited field that parses as a sequence
//! of well-formed fields for a message, so a string that happens to look like
//! one can only make the measured depth larger, never smaller.

/// How deeply a plan's messages may nest. The host refuses flows whose
/// expressions nest more than 250 levels (about 3 messages each) or whose plan
/// is more than 64 operators deep (2 each), which stays below this.
pub const MAX_PLAN_NESTING: usize = 1000;

/// Reads a varint at `*pos`; `None` if it is malformed or runs past the end.
fn varint(b: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The length-delimited fields of `b` as ranges, if `b` as a whole is a
/// sequence of well-formed fields; `None` otherwise.
fn fields(b: &[u8], base: usize, out: &mut Vec<(usize, usize)>) -> bool {
    let mark = out.len();
    let mut pos = 0;
    while pos < b.len() {
        let Some(tag) = varint(b, &mut pos) else {
            out.truncate(mark);
            return false;
        };
        if tag >> 3 == 0 {
            out.truncate(mark);
            return false;
        }
        let ok = match tag & 7 {
            0 => varint(b, &mut pos).is_some(),
            1 => {
                pos += 8;
                pos <= b.len()
            }
            5 => {
                pos += 4;
                pos <= b.len()
            }
            2 => match varint(b, &mut pos).and_then(|n| usize::try_from(n).ok()) {
                Some(n) if n <= b.len() - pos => {
                    out.push((base + pos, base + pos + n));
                    pos += n;
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !ok {
            out.truncate(mark);
            return false;
        }
    }
    true
}

/// How deeply the messages in `bytes` nest (a message without nested ones is
/// 1), or `Err(depth)` as soon as it exceeds `limit`.
pub fn nesting(bytes: &[u8], limit: usize) -> Result<usize, usize> {
    let mut deepest = 0;
    // (range, depth of the message it holds if it is one)
    let mut todo: Vec<(usize, usize, usize)> = vec![(0, bytes.len(), 1)];
    let mut children = Vec::new();
    while let Some((start, end, depth)) = todo.pop() {
        children.clear();
        if !fields(&bytes[start..end], start, &mut children) {
            continue;
        }
        if depth > limit {
            return Err(depth);
        }
        deepest = deepest.max(depth);
        for &(s, e) in &children {
            if e > s {
                todo.push((s, e, depth + 1));
            }
        }
    }
    Ok(deepest)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message with one length-delimited field 1 holding `inner`.
    fn wrap(inner: Vec<u8>) -> Vec<u8> {
        let mut out = vec![0x0a];
        let mut n = inner.len();
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend(inner);
        out
    }

    #[test]
    fn measures_nested_messages() {
        let leaf = vec![0x08, 0x01]; // field 1 = 1
        assert_eq!(nesting(&leaf, 10), Ok(1));
        let mut m = leaf;
        for _ in 0..5 {
            m = wrap(m);
        }
        assert_eq!(nesting(&m, 10), Ok(6));
        assert_eq!(nesting(&m, 5), Err(6));
        // Not a message at all: nothing nests.
        assert_eq!(nesting(&[0xff, 0xff], 10), Ok(0));
    }

    #[test]
    fn deep_nesting_is_refused_without_recursion() {
        let mut m = vec![0x08, 0x01];
        for _ in 0..100_000 {
            m = wrap(m);
        }
        assert!(nesting(&m, MAX_PLAN_NESTING).is_err());
    }
}
