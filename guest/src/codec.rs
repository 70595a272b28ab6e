//! The little binary format used by snapshots: little-endian fixed-width integers and
//! u64-length-prefixed lists. Every length is checked against the bytes that remain before
//! anything is allocated.

use crate::types::{bad, FlowError};

#[derive(Default)]
pub(crate) struct Writer {
    pub buf: Vec<u8>,
    /// A counting writer stores nothing: it adds up what it would write (see
    /// [`Writer::counting`]).
    counted: Option<usize>,
}

impl Writer {
    /// A writer that only counts the bytes written through it, so that a
    /// large snapshot's buffer can be made its exact size at once: grown
    /// step by step, it is copied at each step into memory the guest never
    /// touched before (each page of which the host then faults in).
    pub fn counting() -> Writer {
        Writer {
            buf: Vec::new(),
            counted: Some(0),
        }
    }
    /// The bytes written so far (stored or counted).
    pub fn len(&self) -> usize {
        self.counted.unwrap_or(self.buf.len())
    }
    #[inline]
    fn put(&mut self, b: &[u8]) {
        match &mut self.counted {
            Some(n) => *n += b.len(),
            None => self.buf.extend_from_slice(b),
        }
    }
    pub fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    pub fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.put(&v.to_le_bytes());
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.put(b);
    }
    /// Writes what `f` writes as [`Writer::bytes`] would, without a buffer of its own to copy.
    pub fn section(&mut self, f: impl FnOnce(&mut Writer)) {
        let at = self.len();
        self.u64(0);
        f(self);
        let len = (self.len() - at - 8) as u64;
        if let Some(l) = self.buf.get_mut(at..at + 8) {
            l.copy_from_slice(&len.to_le_bytes());
        }
    }
    pub fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    /// Writes the `n` items of `items`, `W` bytes each as `f` makes them:
    /// one check of the buffer's room for all of them, not one per item,
    /// and a counting writer adds `n * W` without looking at them.
    #[inline]
    pub fn each<T, const W: usize>(
        &mut self,
        n: usize,
        items: impl IntoIterator<Item = T>,
        f: impl Fn(T) -> [u8; W],
    ) {
        match &mut self.counted {
            Some(count) => *count += n * W,
            None => {
                let start = self.buf.len();
                self.buf.resize(start + n * W, 0);
                let slots = self.buf.get_mut(start..).unwrap_or_default();
                for (slot, x) in slots.chunks_exact_mut(W).zip(items) {
                    slot.copy_from_slice(&f(x));
                }
            }
        }
    }
    pub fn i64s(&mut self, v: &[i64]) {
        self.u64(v.len() as u64);
        self.each(v.len(), v, |x| x.to_le_bytes());
    }
    pub fn f64s(&mut self, v: &[f64]) {
        self.u64(v.len() as u64);
        self.each(v.len(), v, |x| x.to_bits().to_le_bytes());
    }
    pub fn bools(&mut self, v: &[bool]) {
        self.u64(v.len() as u64);
        self.each(v.len(), v, |x| [*x as u8]);
    }
    pub fn u32s(&mut self, v: &[u32]) {
        self.u64(v.len() as u64);
        self.each(v.len(), v, |x| x.to_le_bytes());
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn truncated() -> FlowError {
    bad("snapshot is truncated or corrupt")
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }
    pub fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], FlowError> {
        let end = self.pos.checked_add(n).ok_or_else(truncated)?;
        let s = self.buf.get(self.pos..end).ok_or_else(truncated)?;
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> Result<[u8; N], FlowError> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    pub fn u8(&mut self) -> Result<u8, FlowError> {
        Ok(self.arr::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, FlowError> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    pub fn u64(&mut self) -> Result<u64, FlowError> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    pub fn i64(&mut self) -> Result<i64, FlowError> {
        Ok(i64::from_le_bytes(self.arr()?))
    }
    /// Reads a list length whose elements take at least `min_elem` bytes each.
    pub fn len(&mut self, min_elem: usize) -> Result<usize, FlowError> {
        let n = self.u64()?;
        self.fits(n, min_elem)
    }
    /// `n`, a list length read some other way, if that many elements of at
    /// least `min_elem` bytes each fit in what is left.
    pub fn fits(&self, n: u64, min_elem: usize) -> Result<usize, FlowError> {
        let n = usize::try_from(n).map_err(|_| truncated())?;
        if n.saturating_mul(min_elem.max(1)) > self.remaining() {
            return Err(truncated());
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], FlowError> {
        let n = self.len(1)?;
        self.take(n)
    }
    pub fn string(&mut self) -> Result<String, FlowError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| bad("snapshot holds invalid UTF-8"))
    }
    pub fn i64s(&mut self) -> Result<Vec<i64>, FlowError> {
        let n = self.len(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.i64()?);
        }
        Ok(v)
    }
    pub fn f64s(&mut self) -> Result<Vec<f64>, FlowError> {
        let n = self.len(8)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(f64::from_bits(self.u64()?));
        }
        Ok(v)
    }
    pub fn bools(&mut self) -> Result<Vec<bool>, FlowError> {
        let n = self.len(1)?;
        (0..n).map(|_| self.u8().map(|b| b != 0)).collect()
    }
    pub fn u32s(&mut self) -> Result<Vec<u32>, FlowError> {
        let n = self.len(4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(self.u32()?);
        }
        Ok(v)
    }
}

/// 64-bit FNV-1a, used as the snapshot checksum.
/// The checksum that ends a snapshot of format `version` over everything before it: xxh3-64
/// from format 3 on, 64-bit FNV-1a before. FNV multiplies once per byte: it took 40 ms of the
/// 70 ms a 28 MB rollup snapshot took to write; xxh3 reads 8 bytes a step, in wasm too.
pub(crate) fn checksum(version: u32, b: &[u8]) -> u64 {
    match version {
        0..=2 => fnv64(b),
        _ => xxhash_rust::xxh3::xxh3_64(b),
    }
}

fn fnv64(b: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in b {
        h ^= *x as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lists' bytes are the snapshot format: a u64 length, then each
    /// item little-endian at its width. Snapshots written before must keep
    /// restoring, so the bytes are spelled out here.
    #[test]
    fn lists_are_written_as_the_format_says_and_counted_alike() {
        let write = |w: &mut Writer| {
            w.i64s(&[1, -2]);
            w.f64s(&[0.5]);
            w.bools(&[true, false, true]);
            w.u32s(&[7]);
            w.each(2, [(3u8, 4u8), (5, 6)], |(a, b)| [a, b]);
        };
        let mut written = Writer::default();
        write(&mut written);
        let mut want: Vec<u8> = Vec::new();
        want.extend(2u64.to_le_bytes());
        want.extend(1i64.to_le_bytes());
        want.extend((-2i64).to_le_bytes());
        want.extend(1u64.to_le_bytes());
        want.extend(0.5f64.to_bits().to_le_bytes());
        want.extend(3u64.to_le_bytes());
        want.extend([1, 0, 1]);
        want.extend(1u64.to_le_bytes());
        want.extend(7u32.to_le_bytes());
        want.extend([3, 4, 5, 6]);
        assert_eq!(written.buf, want);
        let mut counted = Writer::counting();
        write(&mut counted);
        assert_eq!(counted.len(), want.len());
        assert!(counted.buf.is_empty());
        let mut r = Reader::new(&written.buf);
        assert_eq!(r.i64s().ok(), Some(vec![1, -2]));
        assert_eq!(r.f64s().ok(), Some(vec![0.5]));
        assert_eq!(r.bools().ok(), Some(vec![true, false, true]));
        assert_eq!(r.u32s().ok(), Some(vec![7]));
    }
}
