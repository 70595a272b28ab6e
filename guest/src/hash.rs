//! A small deterministic Fx-style hasher (same on every platform and process).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(word(c));
        }
        let rest = chunks.remainder().len();
        if rest > 0 {
            self.add(tail(bytes) ^ ((rest as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_i64(&mut self, i: i64) {
        self.add(i as u64);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        // Final avalanche so that sequential integer keys spread over the table's high bits.
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

/// The first eight bytes of `b` (little endian), 0 when it is shorter.
#[inline]
pub(crate) fn word(b: &[u8]) -> u64 {
    b.get(..8)
        .and_then(|w| w.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// The last `b.len() % 8` bytes of `b` as a little-endian integer (the bytes
/// after its whole words), read with one or two loads that may overlap bytes
/// before them, never with a loop or a copy: a loop in wasm pays an
/// epoch check per byte, and bytes stored one by one and read back as a word
/// stall the load. Equal to those bytes copied into a zeroed word.
#[inline]
pub(crate) fn tail(b: &[u8]) -> u64 {
    let n = b.len();
    let rest = n % 8;
    let u32_at = |i: usize| {
        b.get(i..i + 4)
            .and_then(|s| s.try_into().ok())
            .map_or(0, |a| u64::from(u32::from_le_bytes(a)))
    };
    let u16_at = |i: usize| {
        b.get(i..i + 2)
            .and_then(|s| s.try_into().ok())
            .map_or(0, |a| u64::from(u16::from_le_bytes(a)))
    };
    match (rest, n >= 8) {
        (0, _) => 0,
        // The last word, its bytes before the tail shifted out.
        (_, true) => word(b.get(n - 8..).unwrap_or_default()) >> (8 * (8 - rest)),
        // Two overlapping pieces: the overlap holds the same bytes in both.
        (4.., false) => u32_at(0) | (u32_at(n - 4) << (8 * (n - 4))),
        (2.., false) => u16_at(0) | (u16_at(n - 2) << (8 * (n - 2))),
        _ => b.first().map_or(0, |x| u64::from(*x)),
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;
pub(crate) type FxHashMap<K, V> = HashMap<K, V, FxBuild>;

/// Integer group key → group id: open addressing with linear probing, at most half full.
///
/// Replaces a `HashMap<i64, u32>` on the per-row lookup path. The first probe is branch-light
/// and needs no loop (in wasm every loop iteration also pays an epoch-interruption check, and
/// `hashbrown` has no SIMD group matching there). Never iterated, so nothing observable depends
/// on slot order. Ids are below `u32::MAX`, which marks a free slot.
#[derive(Debug, Clone, Default)]
pub(crate) struct IntMap {
    slots: Vec<Slot>,
    len: usize,
    /// `64 - log2(slots.len())`: the home slot is the top bits of the mixed key.
    shift: u32,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: i64,
    gid: u32,
}

const FREE: u32 = u32::MAX;

impl IntMap {
    #[inline]
    fn home(&self, k: i64) -> usize {
        let x = k as u64;
        ((x ^ (x >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len().wrapping_sub(1)
    }

    /// The id stored for `k`.
    #[inline]
    pub fn get(&self, k: i64) -> Option<u32> {
        let i = self.home(k);
        let s = self.slots.get(i)?;
        if s.key == k && s.gid != FREE {
            return Some(s.gid);
        }
        if s.gid == FREE {
            return None;
        }
        self.probe(k, i).ok()
    }

    /// Looks up `ks` in order while each key sits in its home slot, writing each id into
    /// `out`; returns how many were resolved. A key elsewhere on its probe sequence, or
    /// missing, ends the run: the caller resolves that one with [`IntMap::get`] (or creates
    /// it) and calls again. At most half full, so most keys sit at home.
    ///
    /// Kept out of line, free of calls and inner loops, and branch-free within four keys: in
    /// wasm, Cranelift then keeps the loop's state in registers (a call in the loop, even a
    /// cold one, made it spill all of it to the stack, and every inner loop pays an epoch
    /// check). Natively it costs the same as a branchy loop over the home slot.
    #[inline(never)]
    pub fn find_run(&self, ks: &[i64], out: &mut [u32]) -> usize {
        let n = ks.len().min(out.len());
        let (ks, out) = (
            ks.get(..n).unwrap_or_default(),
            out.get_mut(..n).unwrap_or_default(),
        );
        let mut done = 0;
        // Four at a time, branch-free: one exit test per four keys.
        for (o, k) in out.chunks_exact_mut(4).zip(ks.chunks_exact(4)) {
            let g = [
                self.at_home(k[0]),
                self.at_home(k[1]),
                self.at_home(k[2]),
                self.at_home(k[3]),
            ];
            o.copy_from_slice(&g);
            if let Some(stop) = g.iter().position(|&g| g == FREE) {
                return done + stop;
            }
            done += 4;
        }
        for (o, &k) in out.iter_mut().zip(ks).skip(done) {
            let g = self.at_home(k);
            if g == FREE {
                return done;
            }
            *o = g;
            done += 1;
        }
        done
    }

    /// The id of `k` if it sits in its home slot, else FREE (also when `k` is missing, or
    /// when the home slot is free with a stale key equal to `k`). Branch-free.
    #[inline(always)]
    fn at_home(&self, k: i64) -> u32 {
        match self.slots.get(self.home(k)) {
            Some(a) => a.gid | u32::from(a.key != k).wrapping_neg(),
            None => FREE,
        }
    }

    /// Slot of `k` (`Ok`) or the free slot where it would go (`Err`), starting after `i`.
    fn probe(&self, k: i64, mut i: usize) -> Result<u32, usize> {
        let mask = self.mask();
        // At most half full: a free slot is always reached.
        for _ in 0..self.slots.len() {
            i = (i + 1) & mask;
            match self.slots.get(i) {
                Some(s) if s.gid == FREE => return Err(i),
                Some(s) if s.key == k => return Ok(s.gid),
                Some(_) => {}
                None => return Err(i),
            }
        }
        Err(i)
    }

    /// Stores `k → gid` (`gid` must not be `u32::MAX`); returns the id it replaces.
    pub fn insert(&mut self, k: i64, gid: u32) -> Option<u32> {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let i = self.home(k);
        let at = match self.slots.get(i) {
            Some(s) if s.gid == FREE => i,
            Some(s) if s.key == k => i,
            _ => match self.probe(k, i) {
                Ok(_) => self.find(k).unwrap_or(i),
                Err(free) => free,
            },
        };
        let slot = self.slots.get_mut(at)?;
        let old = (slot.gid != FREE).then_some(slot.gid);
        *slot = Slot { key: k, gid };
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    /// Slot index holding `k`.
    fn find(&self, k: i64) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.mask();
        let mut i = self.home(k);
        for _ in 0..self.slots.len() {
            let s = self.slots.get(i)?;
            if s.gid == FREE {
                return None;
            }
            if s.key == k {
                return Some(i);
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Removes `k` (backward-shift deletion: no tombstones).
    pub fn remove(&mut self, k: i64) -> Option<u32> {
        let mut hole = self.find(k)?;
        let mask = self.mask();
        let old = self.slots.get(hole).map(|s| s.gid);
        let mut j = hole;
        for _ in 0..self.slots.len() {
            j = (j + 1) & mask;
            let Some(&s) = self.slots.get(j) else { break };
            if s.gid == FREE {
                break;
            }
            // `s` may fill the hole unless its home lies cyclically in (hole, j].
            let h = self.home(s.key);
            if (j.wrapping_sub(h) & mask) >= (j.wrapping_sub(hole) & mask) {
                if let Some(dst) = self.slots.get_mut(hole) {
                    *dst = s;
                }
                hole = j;
            }
        }
        if let Some(dst) = self.slots.get_mut(hole) {
            dst.gid = FREE;
        }
        self.len -= 1;
        old
    }

    pub fn clear(&mut self) {
        self.slots.clear();
        self.len = 0;
        self.shift = 0;
    }

    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![Slot { key: 0, gid: FREE }; cap]);
        self.shift = 64 - cap.trailing_zeros();
        self.len = 0;
        for s in old {
            if s.gid != FREE {
                self.insert(s.key, s.gid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{tail, FxHasher, IntMap, FREE};
    use std::collections::HashMap;
    use std::hash::Hasher;

    #[test]
    fn tails_and_hashes_are_those_of_the_bytes_copied_into_a_word() {
        // The hash before `tail`: whole words, then the rest copied into a
        // zeroed word. Keys' hashes must not change (nothing stores them,
        // but a changed hash would be a changed behaviour to explain).
        fn reference(bytes: &[u8]) -> u64 {
            let mut h = FxHasher::default();
            let mut chunks = bytes.chunks_exact(8);
            for c in &mut chunks {
                h.add(u64::from_le_bytes(c.try_into().unwrap()));
            }
            let rest = chunks.remainder();
            if !rest.is_empty() {
                let mut w = [0u8; 8];
                w[..rest.len()].copy_from_slice(rest);
                h.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
            }
            h.finish()
        }
        let bytes: Vec<u8> = (0..40u32).map(|i| (i * 37 + 11) as u8 | 0x80).collect();
        for start in 0..4 {
            for n in 0..=(bytes.len() - start) {
                let b = &bytes[start..start + n];
                let rest = &b[n - n % 8..];
                let mut w = [0u8; 8];
                w[..rest.len()].copy_from_slice(rest);
                assert_eq!(tail(b), u64::from_le_bytes(w), "length {n}");
                let mut h = FxHasher::default();
                h.write(b);
                assert_eq!(h.finish(), reference(b), "length {n}");
            }
        }
    }

    #[test]
    fn int_map_matches_a_hash_map() {
        // Deterministic pseudo-random operations over keys that collide a lot.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for spread in [8u64, 64, 1 << 12, u64::MAX] {
            let mut m = IntMap::default();
            let mut r: HashMap<i64, u32> = HashMap::new();
            for step in 0..20_000u32 {
                let k = match spread {
                    u64::MAX => next() as i64,
                    s => ((next() % s) as i64 - (s as i64 / 2)) << (step % 3 * 20),
                };
                match next() % 3 {
                    0 => assert_eq!(m.remove(k), r.remove(&k)),
                    _ => assert_eq!(m.insert(k, step), r.insert(k, step)),
                }
                assert_eq!(m.get(k), r.get(&k).copied());
                assert_eq!(m.len, r.len());
                let probe = [k, k.wrapping_add(1), k];
                let mut out = [u32::MAX; 3];
                let found = m.find_run(&probe, &mut out);
                // A run goes on exactly while each key is stored in its home slot.
                let at_home = |p: &i64| {
                    r.contains_key(p)
                        && m.slots
                            .get(m.home(*p))
                            .is_some_and(|s| s.key == *p && s.gid != FREE)
                };
                let expect = probe.iter().take_while(|p| at_home(p)).count();
                assert_eq!(found, expect);
                for (o, p) in out.iter().zip(&probe).take(found) {
                    assert_eq!(Some(*o), r.get(p).copied());
                }
            }
            for (k, v) in &r {
                assert_eq!(m.get(*k), Some(*v));
            }
            for k in -100..100 {
                assert_eq!(m.get(k), r.get(&k).copied());
            }
        }
    }
}
