//! Incremental GROUP BY: per-group state maintained under insertions and retractions.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::codec::{Reader, Writer};
use crate::column::{get, Chunk, ColBuilder, Diffs, S};
use crate::expr::Expr;
use crate::hash::IntMap;
use crate::plan::{AggKind, AggSpec, MeasureSpec, SketchKind, StatKind};
use crate::types::{internal, Column, DataType, FlowError, Storage};

/// Sentinel group id for rows that do not take part (expired keys).
const SKIP: u32 = u32::MAX;

/// Whether an integer-stored value belongs to type `t` (booleans 0 or 1, narrow types in range).
fn int_fits(t: DataType, v: i64) -> bool {
    t.wrap_int(v) == v
}

/// A float's bits in the one form keys and multisets hold: every NaN as
/// the one NaN, -0.0 as 0.0 (equal values, equal bytes).
#[inline]
fn canonical_bits(f: f64) -> u64 {
    if f.is_nan() {
        f64::NAN.to_bits()
    } else {
        (f + 0.0).to_bits()
    }
}

/// Maps a value to an i64 whose signed order is the SQL order of the value's type.
pub(crate) fn ord_key(v: S<'_>, t: DataType) -> Option<i64> {
    match v {
        S::I(x) if t == DataType::UInt64 => Some(x ^ i64::MIN),
        S::I(x) => Some(x),
        S::F(f) => Some(float_ord_key(f)),
        _ => None,
    }
}

/// [`ord_key`] of a float: its canonical bits, ordered as the floats are.
#[inline]
fn float_ord_key(f: f64) -> i64 {
    let b = canonical_bits(f);
    let u = if b >> 63 == 1 { !b } else { b | (1 << 63) };
    (u ^ (1 << 63)) as i64
}

fn from_ord_key(k: i64, t: DataType) -> Out {
    match t.storage() {
        Storage::Floats => {
            let u = (k as u64) ^ (1 << 63);
            let b = if u >> 63 == 1 { u & !(1 << 63) } else { !u };
            Out::F(f64::from_bits(b))
        }
        _ if t == DataType::UInt64 => Out::I(k ^ i64::MIN),
        _ => Out::I(k),
    }
}

/// An owned output value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Out {
    Null,
    I(i64),
    F(f64),
    B(Vec<u8>),
}

impl Out {
    fn same(&self, o: &Out) -> bool {
        match (self, o) {
            (Out::F(a), Out::F(b)) => a.to_bits() == b.to_bits(),
            _ => self == o,
        }
    }
    fn as_s(&self) -> S<'_> {
        match self {
            Out::Null => S::Null,
            Out::I(i) => S::I(*i),
            Out::F(f) => S::F(*f),
            Out::B(b) => S::B(b),
        }
    }
}

/// One measure's values for a list of groups, in the form flush compares and emits them.
#[derive(Debug, Clone, Default)]
struct Vals {
    /// Integers, or the bits of floats when `float`; 0 where NULL. Empty when `wide`.
    bits: Vec<i64>,
    /// Empty while no value is NULL, else one flag per value.
    nulls: Vec<bool>,
    /// Byte-string values (min and max of strings and binary), one per value, when `wide`.
    wide: Vec<Out>,
    float: bool,
    is_wide: bool,
}

impl Vals {
    fn new(state: &State, in_ty: Option<DataType>) -> Vals {
        let storage = in_ty.map(|t| t.storage());
        let (float, is_wide) = match state {
            State::Count(_) | State::SumInt { .. } | State::Distinct { .. } => (false, false),
            State::SumFloat { .. } | State::AvgFloat { .. } | State::AvgInt { .. } => (true, false),
            State::MinMax { .. } | State::Mirror { .. } => (
                storage == Some(Storage::Floats),
                storage == Some(Storage::Bytes),
            ),
            State::Sketch { .. } => (false, true),
            State::Stat { kind, .. } => match kind {
                StatKind::Median => (storage == Some(Storage::Floats), false),
                StatKind::BoolAnd | StatKind::BoolOr => (false, false),
                StatKind::FirstValue { ty, .. } => (
                    ty.storage() == Storage::Floats,
                    ty.storage() == Storage::Bytes,
                ),
                StatKind::StringAgg { .. } | StatKind::ArrayAgg { .. } => (false, true),
                _ => (true, false),
            },
        };
        Vals {
            float,
            is_wide,
            ..Vals::default()
        }
    }

    /// Room for `n` more values, so that a tick's values of every changed
    /// group are written without growing the vector step by step.
    fn reserve(&mut self, n: usize) {
        match self.is_wide {
            true => self.wide.reserve(n),
            false => {
                self.bits.reserve(n);
                if !self.nulls.is_empty() {
                    self.nulls.reserve(n);
                }
            }
        }
    }

    /// Room for `n` more earlier values and, after all of them, for as many
    /// new ones: the flush appends each changed group's new value after the
    /// earlier values, and with this room it does not move them.
    fn reserve_halves(&mut self, n: usize) {
        let len = match self.is_wide {
            true => self.wide.len(),
            false => self.bits.len(),
        };
        self.reserve(len + 2 * n);
    }

    #[inline]
    fn push_bits(&mut self, x: i64) {
        self.bits.push(x);
        if !self.nulls.is_empty() {
            self.nulls.push(false);
        }
    }

    fn push_null(&mut self) {
        if self.is_wide {
            self.wide.push(Out::Null);
            return;
        }
        if self.nulls.is_empty() {
            self.nulls.resize(self.bits.len(), false);
        }
        self.bits.push(0);
        self.nulls.push(true);
    }

    /// `n` NULLs at once (see [`Vals::push_null`]).
    fn push_nulls(&mut self, n: usize) {
        if self.is_wide {
            self.wide.resize(self.wide.len() + n, Out::Null);
            return;
        }
        self.bits.resize(self.bits.len() + n, 0);
        // The flags get the values' room (see `reserve_halves`).
        self.nulls
            .reserve(self.bits.capacity().saturating_sub(self.nulls.len()));
        self.nulls.resize(self.bits.len() - n, false);
        self.nulls.resize(self.bits.len(), true);
    }

    fn push_wide(&mut self, v: Out) {
        self.wide.push(v);
    }

    /// Pads the null flags after a bulk extend of `bits`.
    fn fill_nulls(&mut self) {
        if !self.nulls.is_empty() {
            self.nulls.resize(self.bits.len(), false);
        }
    }

    fn is_null(&self, i: usize) -> bool {
        self.nulls.get(i).copied().unwrap_or(false)
    }

    /// With the first half of the values before a tick and the second half after it: clears
    /// `same[i]` where value `i` changed (floats compare by bits).
    fn same_halves(&self, same: &mut [bool]) {
        let t = same.len();
        if self.is_wide {
            let (a, b) = self.wide.split_at(t.min(self.wide.len()));
            for ((s, a), b) in same.iter_mut().zip(a).zip(b) {
                *s &= a.same(b);
            }
            return;
        }
        let (a, b) = self.bits.split_at(t.min(self.bits.len()));
        for ((s, a), b) in same.iter_mut().zip(a).zip(b) {
            *s &= a == b;
        }
        if !self.nulls.is_empty() {
            let (a, b) = self.nulls.split_at(t.min(self.nulls.len()));
            for ((s, a), b) in same.iter_mut().zip(a).zip(b) {
                *s &= a == b;
            }
        }
    }

    fn clear(&mut self) {
        self.bits.clear();
        self.nulls.clear();
        self.wide.clear();
    }

    fn write(&self, w: &mut Writer) {
        w.i64s(&self.bits);
        w.bools(&self.nulls);
        w.u64(self.wide.len() as u64);
        for v in &self.wide {
            match v {
                Out::Null => w.u8(0),
                Out::I(x) => {
                    w.u8(1);
                    w.i64(*x);
                }
                Out::F(x) => {
                    w.u8(2);
                    w.i64(x.to_bits() as i64);
                }
                Out::B(b) => {
                    w.u8(3);
                    w.bytes(b);
                }
            }
        }
    }

    /// Writes what [`Vals::write`] writes for `n` NULLs of this form (the
    /// values of `self` are not stored: see `AggOp::old_unstored`).
    fn write_nulls(&self, w: &mut Writer, n: usize) {
        match self.is_wide {
            true => {
                w.i64s(&[]);
                w.bools(&[]);
                w.u64(n as u64);
                w.each(n, 0..n, |_| [0u8]);
            }
            false => {
                w.u64(n as u64);
                w.each(n, 0..n, |_| 0i64.to_le_bytes());
                w.u64(n as u64);
                w.each(n, 0..n, |_| [1u8]);
                w.u64(0);
            }
        }
    }

    /// Reads what [`Vals::write`] wrote into `self` (made by [`Vals::new`] for the measure):
    /// `n` values of its form.
    fn read(&mut self, r: &mut Reader<'_>, n: usize) -> Result<(), FlowError> {
        let bad = || crate::types::bad("snapshot: a changed group's earlier value is malformed");
        self.bits = r.i64s()?;
        self.nulls = r.bools()?;
        let nw = r.len(1)?;
        let mut wide = Vec::with_capacity(nw);
        for _ in 0..nw {
            wide.push(match r.u8()? {
                0 => Out::Null,
                1 => Out::I(r.i64()?),
                2 => Out::F(f64::from_bits(r.i64()? as u64)),
                3 => Out::B(r.bytes()?.to_vec()),
                _ => return Err(bad()),
            });
        }
        self.wide = wide;
        let (values, others) = match self.is_wide {
            true => (self.wide.len(), self.bits.len() + self.nulls.len()),
            false => (self.bits.len(), self.wide.len()),
        };
        let nulls_fit = self.nulls.is_empty() || self.nulls.len() == self.bits.len();
        if values != n || others != 0 || !nulls_fit {
            return Err(bad());
        }
        Ok(())
    }

    fn scalar(&self, i: usize) -> S<'_> {
        if self.is_wide {
            return self.wide.get(i).map_or(S::Null, |v| v.as_s());
        }
        match self.bits.get(i) {
            None => S::Null,
            Some(_) if self.is_null(i) => S::Null,
            Some(&x) if self.float => S::F(f64::from_bits(x as u64)),
            Some(&x) => S::I(x),
        }
    }
}

/// The output column of one measure. `vals` holds the measure's value for each of the `t`
/// touched groups before the tick, then after it; entry `e` of `emit` is `ti << 1 | new` and
/// selects touched group `ti`'s value before (`new` = 0) or after (1) the tick.
#[inline(never)]
fn measure_column(emit: &[u32], vals: &Vals, t: usize, ty: DataType) -> Column {
    let at = |e: u32| (e >> 1) as usize + (e & 1) as usize * t;
    let direct = !vals.is_wide && vals.float == (ty.storage() == Storage::Floats);
    if !direct || ty.storage() == Storage::Bytes {
        let mut b = ColBuilder::new(ty, emit.len());
        for &e in emit {
            b.push(vals.scalar(at(e)));
        }
        return b.finish();
    }
    let bits = emit
        .iter()
        .map(|&e| vals.bits.get(at(e)).copied().unwrap_or(0));
    let mut col = Column::default();
    if vals.float {
        col.floats = bits.map(|x| f64::from_bits(x as u64)).collect();
    } else {
        col.ints = bits.collect();
    }
    if !vals.nulls.is_empty() {
        col.nulls = emit.iter().map(|&e| vals.is_null(at(e)) as u8).collect();
        if col.nulls.iter().all(|n| *n == 0) {
            col.nulls.clear();
        }
    }
    col
}

/// An ordered multiset of values (value → multiplicity, never 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MultiSet {
    ints: IntCounts,
    bytes: BTreeMap<Vec<u8>, i64>,
}

/// Most values an [`IntCounts`] keeps in its sorted vector.
const SMALL_SET: usize = 32;

/// The integers of a [`MultiSet`] (value → multiplicity) in value order: a
/// sorted vector while it holds at most [`SMALL_SET`] values (one
/// allocation and no tree nodes: most groups of a rollup see a few values),
/// a B-tree beyond. The vector holds the values alone while each is there
/// once (a min/max group's values rarely repeat: half the memory), and
/// (value, multiplicity) pairs from the first that is not.
#[derive(Debug, Clone)]
pub(crate) enum IntCounts {
    Once(Vec<i64>),
    Small(Vec<(i64, i64)>),
    Tree(BTreeMap<i64, i64>),
}

impl Default for IntCounts {
    fn default() -> IntCounts {
        IntCounts::Once(Vec::new())
    }
}

/// The multiplicity of each value of an [`IntCounts::Once`].
static ONCE: i64 = 1;

impl PartialEq for IntCounts {
    fn eq(&self, other: &IntCounts) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// An [`IntCounts`]' entries in value order, either way.
pub(crate) enum IntCountsIter<'a> {
    Once(std::slice::Iter<'a, i64>),
    Small(std::slice::Iter<'a, (i64, i64)>),
    Tree(std::collections::btree_map::Iter<'a, i64, i64>),
}

impl<'a> Iterator for IntCountsIter<'a> {
    type Item = (&'a i64, &'a i64);
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            IntCountsIter::Once(it) => it.next().map(|k| (k, &ONCE)),
            IntCountsIter::Small(it) => it.next().map(|(k, c)| (k, c)),
            IntCountsIter::Tree(it) => it.next(),
        }
    }
}

impl DoubleEndedIterator for IntCountsIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            IntCountsIter::Once(it) => it.next_back().map(|k| (k, &ONCE)),
            IntCountsIter::Small(it) => it.next_back().map(|(k, c)| (k, c)),
            IntCountsIter::Tree(it) => it.next_back(),
        }
    }
}

/// `Vec::insert` for a vector of at most [`SMALL_SET`] entries: the shift
/// as a loop, since in wasm a move of unknown length is `memory.copy`, a
/// call into the runtime, and a group's set is a few entries.
#[inline]
fn insert_small<T>(v: &mut Vec<T>, at: usize, e: T) {
    v.push(e);
    let mut j = v.len() - 1;
    while j > at {
        v.swap(j, j - 1);
        j -= 1;
    }
}

/// `Vec::remove` the same way (see [`insert_small`]).
#[inline]
fn remove_small<T>(v: &mut Vec<T>, at: usize) {
    for j in at + 1..v.len() {
        v.swap(j - 1, j);
    }
    v.pop();
}

impl IntCounts {
    fn iter(&self) -> IntCountsIter<'_> {
        match self {
            IntCounts::Once(v) => IntCountsIter::Once(v.iter()),
            IntCounts::Small(v) => IntCountsIter::Small(v.iter()),
            IntCounts::Tree(t) => IntCountsIter::Tree(t.iter()),
        }
    }
    fn keys(&self) -> impl Iterator<Item = &i64> {
        self.iter().map(|(k, _)| k)
    }
    fn values(&self) -> impl Iterator<Item = &i64> {
        self.iter().map(|(_, c)| c)
    }
    fn len(&self) -> usize {
        match self {
            IntCounts::Once(v) => v.len(),
            IntCounts::Small(v) => v.len(),
            IntCounts::Tree(t) => t.len(),
        }
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Sets `k`'s multiplicity to `c` (restoring; 0 is kept for `check`).
    fn insert(&mut self, k: i64, c: i64) {
        match self {
            IntCounts::Once(v) if c == 1 => {
                if let Err(i) = v.binary_search(&k) {
                    insert_small(v, i, k);
                }
            }
            IntCounts::Once(_) => {
                self.count_each();
                return self.insert(k, c);
            }
            IntCounts::Small(v) => match v.binary_search_by_key(&k, |e| e.0) {
                Ok(i) => v[i].1 = c,
                Err(i) => insert_small(v, i, (k, c)),
            },
            IntCounts::Tree(t) => {
                t.insert(k, c);
            }
        }
        self.grow_up();
    }
    /// Adds `d` copies of `k`; returns (old multiplicity, new multiplicity).
    fn add(&mut self, k: i64, d: i64) -> (i64, i64) {
        let (old, new) = match self {
            IntCounts::Once(v) => match (v.binary_search(&k), d) {
                (found, 0) => {
                    let old = i64::from(found.is_ok());
                    (old, old)
                }
                (Ok(i), -1) => {
                    remove_small(v, i);
                    (1, 0)
                }
                (Err(i), 1) => {
                    insert_small(v, i, k);
                    (0, 1)
                }
                // A value there more than once (or fewer than none).
                _ => {
                    self.count_each();
                    return self.add(k, d);
                }
            },
            IntCounts::Small(v) => match v.binary_search_by_key(&k, |e| e.0) {
                Ok(i) => {
                    let old = v[i].1;
                    let new = old.wrapping_add(d);
                    if new == 0 {
                        remove_small(v, i);
                    } else {
                        v[i].1 = new;
                    }
                    (old, new)
                }
                Err(i) => {
                    if d != 0 {
                        insert_small(v, i, (k, d));
                    }
                    (0, d)
                }
            },
            IntCounts::Tree(t) => {
                let e = t.entry(k).or_insert(0);
                let old = *e;
                *e = e.wrapping_add(d);
                let new = *e;
                if new == 0 {
                    t.remove(&k);
                }
                (old, new)
            }
        };
        self.grow_up();
        (old, new)
    }
    /// Moves a vector grown past [`SMALL_SET`] into a tree. Inline: it is
    /// asked after every add, and the answer is nearly always no.
    #[inline]
    fn grow_up(&mut self) {
        if let IntCounts::Once(_) | IntCounts::Small(_) = self {
            if self.len() > SMALL_SET {
                self.make_tree();
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn make_tree(&mut self) {
        match self {
            IntCounts::Once(v) => *self = IntCounts::Tree(v.iter().map(|&k| (k, 1)).collect()),
            IntCounts::Small(v) => *self = IntCounts::Tree(std::mem::take(v).into_iter().collect()),
            IntCounts::Tree(_) => {}
        }
    }

    /// From values alone to values with their multiplicities.
    #[cold]
    #[inline(never)]
    fn count_each(&mut self) {
        if let IntCounts::Once(v) = self {
            *self = IntCounts::Small(v.iter().map(|&k| (k, 1)).collect());
        }
    }

    /// Bytes it holds, roughly.
    fn approx_bytes(&self) -> usize {
        match self {
            IntCounts::Once(v) => v.len() * 8,
            IntCounts::Small(v) => v.len() * 16,
            IntCounts::Tree(t) => t.len() * 24,
        }
    }
}

impl<'a> IntoIterator for &'a IntCounts {
    type Item = (&'a i64, &'a i64);
    type IntoIter = IntCountsIter<'a>;
    fn into_iter(self) -> IntCountsIter<'a> {
        self.iter()
    }
}

impl MultiSet {
    /// Adds `d` copies; returns (old multiplicity, new multiplicity).
    fn add_int(&mut self, k: i64, d: i64) -> (i64, i64) {
        self.ints.add(k, d)
    }
    fn add_bytes(&mut self, k: &[u8], d: i64) -> (i64, i64) {
        if let Some(e) = self.bytes.get_mut(k) {
            let old = *e;
            *e = e.wrapping_add(d);
            let new = *e;
            if new == 0 {
                self.bytes.remove(k);
            }
            (old, new)
        } else {
            if d != 0 {
                self.bytes.insert(k.to_vec(), d);
            }
            (0, d)
        }
    }
    fn min_max(&self, max: bool, t: DataType) -> Out {
        // The first value held, from the end `max` says (no boxed iterator:
        // a tick asks this of every changed group).
        fn held<'a, K: 'a>(mut it: impl Iterator<Item = (K, &'a i64)>) -> Option<K> {
            it.find(|(_, c)| **c > 0).map(|(k, _)| k)
        }
        if t.storage() == Storage::Bytes {
            let found = match max {
                true => held(self.bytes.iter().rev()),
                false => held(self.bytes.iter()),
            };
            found.map_or(Out::Null, |k| Out::B(k.clone()))
        } else {
            let found = match max {
                true => held(self.ints.iter().rev()),
                false => held(self.ints.iter()),
            };
            found.map_or(Out::Null, |k| from_ord_key(*k, t))
        }
    }
    fn is_empty(&self) -> bool {
        self.ints.is_empty() && self.bytes.is_empty()
    }
    /// Checks restored contents: values of type `t` only (in range, UTF-8 for utf8, stored as
    /// [`ord_key`] stores them), none held 0 times.
    fn check(&self, t: DataType) -> Result<(), String> {
        if self
            .ints
            .values()
            .chain(self.bytes.values())
            .any(|c| *c == 0)
        {
            return Err("a multiset holds a value 0 times".into());
        }
        if t.storage() == Storage::Bytes {
            if !self.ints.is_empty() {
                return Err(format!("{t} state holds numbers"));
            }
            if t == DataType::Utf8 && self.bytes.keys().any(|k| std::str::from_utf8(k).is_err()) {
                return Err(format!("{t} state holds invalid UTF-8"));
            }
            return Ok(());
        }
        if !self.bytes.is_empty() {
            return Err(format!("{t} state holds bytes"));
        }
        for &k in self.ints.keys() {
            let v = from_ord_key(k, t);
            if let Out::I(x) = v {
                if !int_fits(t, x) {
                    return Err(format!("{t} state holds {x}, which is out of range"));
                }
            }
            if ord_key(v.as_s(), t) != Some(k) {
                return Err(format!("{t} state holds a value in a non-canonical form"));
            }
        }
        Ok(())
    }
    fn approx_bytes(&self) -> usize {
        self.ints.approx_bytes() + self.bytes.keys().map(|k| k.len() + 40).sum::<usize>()
    }
    /// Writes the multiset (snapshot format 4): one word for its shape,
    /// `n << 2 | bytes << 1 | once`: `n` integers, whether byte strings
    /// follow them, and whether each integer is there once (nearly always:
    /// a rollup's values rarely repeat within a group). Then the integers
    /// in value order, each with its multiplicity unless `once`; then, if
    /// any, the byte strings with theirs.
    fn write(&self, w: &mut Writer) {
        let n = self.ints.len();
        let bytes = !self.bytes.is_empty();
        let shape = ((n as u64) << 2) | (u64::from(bytes) << 1);
        match &self.ints {
            // The values-alone form is written as it is held: one pass over
            // a slice (a snapshot of a million-row rollup writes a million
            // values this way; through the pairs' iterator it took twice as
            // long as the rest of the snapshot).
            IntCounts::Once(v) => {
                w.u64(shape | 1);
                w.each(n, v, |k| k.to_le_bytes());
            }
            ints => {
                let once = ints.values().all(|c| *c == 1);
                w.u64(shape | u64::from(once));
                match once {
                    true => w.each(n, ints.keys(), |k| k.to_le_bytes()),
                    false => w.each(n, ints.iter(), |(k, c)| {
                        let mut b = [0u8; 16];
                        b[..8].copy_from_slice(&k.to_le_bytes());
                        b[8..].copy_from_slice(&c.to_le_bytes());
                        b
                    }),
                }
            }
        }
        if bytes {
            w.u64(self.bytes.len() as u64);
            for (k, c) in &self.bytes {
                w.bytes(k);
                w.i64(*c);
            }
        }
    }

    /// The fewest bytes [`MultiSet::write`] writes for one multiset in
    /// format `version`: an empty one is its shape word alone from format 4
    /// on, two counts before (a list of multisets is checked against this
    /// before anything is allocated, so it must not be more).
    fn min_written(version: u32) -> usize {
        match version {
            0..=3 => 16,
            _ => 8,
        }
    }

    /// Reads what [`MultiSet::write`] wrote into a snapshot of format
    /// `version` (before 4: a count and (value, multiplicity) pairs, then a
    /// count and the byte strings, always).
    fn read(r: &mut Reader<'_>, version: u32) -> Result<MultiSet, FlowError> {
        let mut m = MultiSet::default();
        let (n, once, bytes) = match version {
            0..=3 => (r.len(16)?, false, true),
            _ => {
                let shape = r.u64()?;
                let once = shape & 1 == 1;
                let n = r.fits(shape >> 2, if once { 8 } else { 16 })?;
                (n, once, shape & 2 == 2)
            }
        };
        // As read: maybe out of order or repeated, until checked below.
        let read = match once {
            true => IntCounts::Once(
                r.take(n * 8)?
                    .chunks_exact(8)
                    .map(|b| i64::from_le_bytes(b.try_into().unwrap_or_default()))
                    .collect(),
            ),
            false => {
                let mut ints = Vec::with_capacity(n);
                for _ in 0..n {
                    ints.push((r.i64()?, r.i64()?));
                }
                IntCounts::Small(ints)
            }
        };
        // A snapshot holds them in value order, each once: as they are
        // when few, one by one otherwise (which also takes what is not).
        let ordered = read.iter().zip(read.iter().skip(1)).all(|(a, b)| a.0 < b.0);
        if ordered && n <= SMALL_SET {
            m.ints = read;
        } else {
            for (k, c) in &read {
                m.ints.insert(*k, *c);
            }
        }
        if bytes {
            let n = r.len(12)?;
            for _ in 0..n {
                let k = r.bytes()?.to_vec();
                let c = r.i64()?;
                m.bytes.insert(k, c);
            }
        }
        Ok(m)
    }
}

/// How many rows a measure has counted per group. Until a FILTER or a NULL argument skips a
/// row this is the group's row count, and then nothing is stored: count(*) and the counts of a
/// sum or avg over a column without NULLs cost no per-row work of their own.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counts(Option<Vec<i64>>);

impl Counts {
    #[inline]
    fn get(&self, g: usize, rows: &[i64]) -> i64 {
        self.all(rows).get(g).copied().unwrap_or(0)
    }
    /// Every group's count.
    #[inline]
    fn all<'a>(&'a self, rows: &'a [i64]) -> &'a [i64] {
        self.0.as_deref().unwrap_or(rows)
    }
    /// The stored counts, copied from the row counts `rows` (before the rows now being added)
    /// the first time a row is skipped.
    fn own(&mut self, rows: &[i64]) -> &mut Vec<i64> {
        self.0.get_or_insert_with(|| rows.to_vec())
    }
    fn grow(&mut self, len: usize) {
        if let Some(v) = &mut self.0 {
            v.resize(len, 0);
        }
    }
    fn reset(&mut self, g: usize) {
        if let Some(v) = &mut self.0 {
            set(v, g, 0);
        }
    }
    fn approx_bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |v| v.len() * 8)
    }
    /// Written in full either way, so the snapshot format does not depend on the sharing.
    fn write(&self, w: &mut Writer, rows: &[i64]) {
        w.i64s(self.0.as_deref().unwrap_or(rows));
    }
    fn read(r: &mut Reader<'_>, rows: &[i64]) -> Result<Counts, FlowError> {
        let v = r.i64s()?;
        if v.len() != rows.len() {
            return Err(crate::types::bad(
                "snapshot: aggregate state has the wrong length",
            ));
        }
        Ok(Counts(if v == rows { None } else { Some(v) }))
    }
}

/// Per-measure state, one slot per group id.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Count(Counts),
    SumInt {
        s: Vec<i64>,
        n: Counts,
    },
    SumFloat {
        s: Vec<f64>,
        n: Counts,
    },
    AvgInt {
        s: Vec<i128>,
        n: Counts,
    },
    AvgFloat {
        s: Vec<f64>,
        n: Counts,
    },
    MinMax {
        sets: Vec<MultiSet>,
        max: bool,
    },
    /// A min or max over the same argument and filter as measure `of`, a
    /// [`State::MinMax`]: it reads that measure's multisets and keeps none of
    /// its own (`min(v), max(v)` is the usual rollup; one multiset serves both).
    Mirror {
        of: usize,
        max: bool,
    },
    Distinct {
        sets: Vec<MultiSet>,
        n: Vec<i64>,
    },
    /// A sketch's inputs as a multiset per group; the state is computed
    /// from them when read, so it is exactly a fresh sketch's over the
    /// current rows.
    Sketch {
        sets: Vec<MultiSet>,
        kind: SketchKind,
    },
    /// A statistic's inputs as a multiset per group (see [`StatKind`]).
    Stat {
        sets: Vec<MultiSet>,
        kind: StatKind,
        /// The measure's constant (string_agg's delimiter).
        param: Vec<u8>,
    },
}

impl State {
    fn new(kind: AggKind, in_ty: Option<DataType>, param: &[u8]) -> State {
        let float = in_ty.is_some_and(|t| t.is_float());
        match kind {
            AggKind::CountStar | AggKind::Count => State::Count(Counts::default()),
            AggKind::Sum if float => State::SumFloat {
                s: Vec::new(),
                n: Counts::default(),
            },
            AggKind::Sum => State::SumInt {
                s: Vec::new(),
                n: Counts::default(),
            },
            AggKind::Avg if float => State::AvgFloat {
                s: Vec::new(),
                n: Counts::default(),
            },
            AggKind::Avg => State::AvgInt {
                s: Vec::new(),
                n: Counts::default(),
            },
            AggKind::Min | AggKind::Max => State::MinMax {
                sets: Vec::new(),
                max: kind == AggKind::Max,
            },
            AggKind::CountDistinct => State::Distinct {
                sets: Vec::new(),
                n: Vec::new(),
            },
            AggKind::Sketch(kind) => State::Sketch {
                sets: Vec::new(),
                kind,
            },
            AggKind::Stat(kind) => State::Stat {
                sets: Vec::new(),
                kind,
                param: param.to_vec(),
            },
        }
    }

    fn grow(&mut self, len: usize) {
        match self {
            State::Count(n) => n.grow(len),
            State::SumInt { s, n } => {
                s.resize(len, 0);
                n.grow(len);
            }
            State::SumFloat { s, n } | State::AvgFloat { s, n } => {
                s.resize(len, 0.0);
                n.grow(len);
            }
            State::AvgInt { s, n } => {
                s.resize(len, 0);
                n.grow(len);
            }
            State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
                sets.resize_with(len, MultiSet::default)
            }
            State::Distinct { sets, n } => {
                sets.resize_with(len, MultiSet::default);
                n.resize(len, 0);
            }
            State::Mirror { .. } => {}
        }
    }

    fn reset(&mut self, g: usize) {
        match self {
            State::Count(n) => n.reset(g),
            State::SumInt { s, n } => {
                set(s, g, 0);
                n.reset(g);
            }
            State::SumFloat { s, n } | State::AvgFloat { s, n } => {
                set(s, g, 0.0);
                n.reset(g);
            }
            State::AvgInt { s, n } => {
                set(s, g, 0);
                n.reset(g);
            }
            State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
                set(sets, g, MultiSet::default())
            }
            State::Distinct { sets, n } => {
                set(sets, g, MultiSet::default());
                set(n, g, 0);
            }
            State::Mirror { .. } => {}
        }
    }

    /// Whether group `g` holds nothing (`rows` are the groups' row counts).
    fn is_empty(&self, g: usize, rows: &[i64]) -> bool {
        match self {
            State::Count(n)
            | State::SumInt { n, .. }
            | State::SumFloat { n, .. }
            | State::AvgFloat { n, .. }
            | State::AvgInt { n, .. } => n.get(g, rows) == 0,
            State::MinMax { sets, .. } | State::Stat { sets, .. } => {
                sets.get(g).is_none_or(|s| s.is_empty())
            }
            State::Distinct { sets, .. } => sets.get(g).is_none_or(|s| s.is_empty()),
            // A group of NULLs only has the empty sketch, not NULL.
            State::Sketch { .. } => rows.get(g).copied().unwrap_or(0) == 0,
            // Its measure answers for it.
            State::Mirror { .. } => true,
        }
    }

    /// Appends the measure's current value for each group of `groups` to `out` (one entry per
    /// group, whether or not the group is present). One loop per kind of state: flush reads
    /// every changed group's values twice per tick.
    /// `all` are the aggregate's states, where a [`State::Mirror`] finds its multisets.
    fn values(
        &self,
        all: &[State],
        groups: &[u32],
        in_ty: Option<DataType>,
        rows: &[i64],
        out: &mut Vals,
    ) {
        let at = |v: &[i64], g: u32| v.get(g as usize).copied().unwrap_or(0);
        out.reserve(groups.len());
        match self {
            State::Count(n) => gather(&mut out.bits, n.all(rows), groups),
            State::Distinct { n, .. } => gather(&mut out.bits, n, groups),
            State::SumInt { s, n } => {
                // The common case in two call-free gathers; NULLs (no counted row) after.
                let from = out.bits.len();
                gather(&mut out.bits, s, groups);
                let counts = n.all(rows);
                if groups.iter().any(|&g| at(counts, g) == 0) {
                    out.nulls.resize(from, false);
                    for (&g, b) in groups
                        .iter()
                        .zip(out.bits.get_mut(from..).unwrap_or_default())
                    {
                        let null = at(counts, g) == 0;
                        if null {
                            *b = 0;
                        }
                        out.nulls.push(null);
                    }
                }
            }
            State::SumFloat { s, n } => {
                for &g in groups {
                    match s.get(g as usize) {
                        Some(x) if n.get(g as usize, rows) != 0 => {
                            out.push_bits(x.to_bits() as i64)
                        }
                        _ => out.push_null(),
                    }
                }
            }
            State::AvgFloat { s, n } => {
                for &g in groups {
                    let c = n.get(g as usize, rows);
                    match s.get(g as usize) {
                        Some(x) if c != 0 => out.push_bits((x / c as f64).to_bits() as i64),
                        _ => out.push_null(),
                    }
                }
            }
            State::AvgInt { s, n } => {
                for &g in groups {
                    let c = n.get(g as usize, rows);
                    match s.get(g as usize) {
                        Some(x) if c != 0 => out.push_bits((*x as f64 / c as f64).to_bits() as i64),
                        _ => out.push_null(),
                    }
                }
            }
            State::MinMax { sets, max } => min_max_values(sets, *max, groups, in_ty, out),
            State::Mirror { of, max } => match all.get(*of) {
                Some(State::MinMax { sets, .. }) => min_max_values(sets, *max, groups, in_ty, out),
                _ => groups.iter().for_each(|_| out.push_null()),
            },
            State::Stat { sets, kind, param } => {
                let t = in_ty.unwrap_or(DataType::Float64);
                let empty = MultiSet::default();
                for &g in groups {
                    match stat_value(*kind, sets.get(g as usize).unwrap_or(&empty), t, param) {
                        Out::I(x) => out.push_bits(x),
                        Out::F(x) => out.push_bits(x.to_bits() as i64),
                        b @ Out::B(_) => out.push_wide(b),
                        _ => out.push_null(),
                    }
                }
            }
            State::Sketch { sets, kind } => {
                let t = in_ty.unwrap_or(DataType::Binary);
                let empty = MultiSet::default();
                for &g in groups {
                    let set = sets.get(g as usize).unwrap_or(&empty);
                    match sketch_state(*kind, set, t) {
                        Some(b) => out.push_wide(Out::B(b)),
                        None => out.push_null(),
                    }
                }
            }
        }
        out.fill_nulls();
    }

    /// Checks restored values against the measure's argument type (the values min and max
    /// emit, and those count(DISTINCT) compares).
    fn check(&self, in_ty: Option<DataType>) -> Result<(), String> {
        match self {
            State::MinMax { sets, .. }
            | State::Distinct { sets, .. }
            | State::Stat { sets, .. } => {
                let t =
                    in_ty.ok_or("a min, max, statistic or count(DISTINCT) without an argument")?;
                sets.iter().try_for_each(|m| m.check(t))
            }
            State::Sketch { sets, kind } => {
                let t = in_ty.ok_or("a sketch function without an argument")?;
                sets.iter().try_for_each(|m| m.check(t))?;
                sets.iter()
                    .try_for_each(|m| check_sketch_inputs(*kind, m, t))
            }
            _ => Ok(()),
        }
    }

    fn approx_bytes(&self) -> usize {
        match self {
            State::Mirror { .. } => 0,
            State::Count(n) => n.approx_bytes(),
            State::SumInt { s, n } => s.len() * 8 + n.approx_bytes(),
            State::SumFloat { s, n } | State::AvgFloat { s, n } => s.len() * 8 + n.approx_bytes(),
            State::AvgInt { s, n } => s.len() * 16 + n.approx_bytes(),
            State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
                sets.iter().map(|s| 48 + s.approx_bytes()).sum()
            }
            State::Distinct { sets, n } => {
                n.len() * 8 + sets.iter().map(|s| 48 + s.approx_bytes()).sum::<usize>()
            }
        }
    }

    fn write(&self, w: &mut Writer, rows: &[i64]) {
        match self {
            State::Mirror { .. } => {}
            State::Count(n) => n.write(w, rows),
            State::SumInt { s, n } => {
                w.i64s(s);
                n.write(w, rows);
            }
            State::SumFloat { s, n } | State::AvgFloat { s, n } => {
                w.f64s(s);
                n.write(w, rows);
            }
            State::AvgInt { s, n } => {
                w.u64(s.len() as u64);
                for x in s {
                    w.i64((*x >> 64) as i64);
                    w.i64(*x as i64);
                }
                n.write(w, rows);
            }
            State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
                w.u64(sets.len() as u64);
                for s in sets {
                    s.write(w);
                }
            }
            State::Distinct { sets, n } => {
                w.u64(sets.len() as u64);
                for s in sets {
                    s.write(w);
                }
                w.i64s(n);
            }
        }
    }

    /// Reads what [`State::write`] wrote; snapshots before `version` 3 also hold a mirror's
    /// own multisets, which are skipped.
    fn read(
        &mut self,
        r: &mut Reader<'_>,
        len: usize,
        rows: &[i64],
        version: u32,
    ) -> Result<(), FlowError> {
        let check = |l: usize| {
            if l == len {
                Ok(())
            } else {
                Err(crate::types::bad(
                    "snapshot: aggregate state has the wrong length",
                ))
            }
        };
        match self {
            State::Mirror { .. } if version >= 3 => {}
            State::Mirror { .. } => {
                let l = r.len(16)?;
                for _ in 0..l {
                    MultiSet::read(r, version)?;
                }
                check(l)?;
            }
            State::Count(n) => *n = Counts::read(r, rows)?,
            State::SumInt { s, n } => {
                *s = r.i64s()?;
                *n = Counts::read(r, rows)?;
                check(s.len())?;
            }
            State::SumFloat { s, n } | State::AvgFloat { s, n } => {
                *s = r.f64s()?;
                *n = Counts::read(r, rows)?;
                check(s.len())?;
            }
            State::AvgInt { s, n } => {
                let l = r.len(16)?;
                let mut v = Vec::with_capacity(l);
                for _ in 0..l {
                    let hi = r.i64()? as i128;
                    let lo = r.i64()? as u64 as i128;
                    v.push((hi << 64) | lo);
                }
                *s = v;
                *n = Counts::read(r, rows)?;
                check(s.len())?;
            }
            State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
                let l = r.len(MultiSet::min_written(version))?;
                let mut v = Vec::with_capacity(l);
                for _ in 0..l {
                    v.push(MultiSet::read(r, version)?);
                }
                *sets = v;
                check(sets.len())?;
            }
            State::Distinct { sets, n } => {
                let l = r.len(MultiSet::min_written(version))?;
                let mut v = Vec::with_capacity(l);
                for _ in 0..l {
                    v.push(MultiSet::read(r, version)?);
                }
                *sets = v;
                *n = r.i64s()?;
                check(sets.len())?;
                check(n.len())?;
            }
        }
        Ok(())
    }
}

fn set<T>(v: &mut [T], g: usize, x: T) {
    if let Some(slot) = v.get_mut(g) {
        *slot = x;
    }
}

/// Group keys → dense group ids.
#[derive(Debug, Clone)]
enum Keys {
    /// No GROUP BY: one group, id 0.
    Global,
    /// One integer-like key.
    Int {
        map: IntMap,
        null_gid: Option<u32>,
        vals: Vec<i64>,
        nulls: Vec<bool>,
    },
    /// Any keys, encoded into bytes.
    Encoded(KeyTable),
}

/// Encoded group keys → group ids. The keys' bytes sit one after the other
/// in one arena (a group's at `spans[g]`), and a hash table holds the group
/// ids, hashed and compared by their keys: a new group appends its key and
/// costs no allocation of its own, and the keys of groups made together
/// (the current window's) sit together. Removed keys leave gaps until they
/// are half of the arena, which is then compacted.
#[derive(Debug, Clone, Default)]
struct KeyTable {
    /// Group ids with 32 bits of their key's hash: growing the table rehashes
    /// without reading keys, and a lookup compares keys only when these agree.
    table: hashbrown::HashTable<(u32, u32)>,
    bytes: Vec<u8>,
    spans: Vec<(usize, usize)>,
    garbage: usize,
}

/// Whether `a` and `b` hold the same bytes, compared eight at a time and
/// inline: a group key is a few words, and in wasm `==` on slices calls
/// the C library's `memcmp`, which compares byte by byte.
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    use crate::hash::{tail, word};
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    // The bytes after the last whole word by one or two loads, no byte loop.
    wa.zip(wb).all(|(x, y)| word(x) == word(y)) && tail(a) == tail(b)
}

/// The storage of column `c` when its first `rows` rows are all there and
/// none is NULL (each then encodes the same way, without a per-row check).
fn dense(c: &Column, storage: Storage, rows: usize) -> Option<Storage> {
    let there = match storage {
        Storage::Bytes => c.offsets.len() > rows,
        Storage::Ints => c.ints.len() >= rows,
        Storage::Floats => c.floats.len() >= rows,
    };
    (there && !c.nulls.iter().any(|n| *n != 0)).then_some(storage)
}

/// The bytes between two neighbouring offsets of a string column (empty
/// when they are not a range of it, as [`Column::bytes_at`] reads them).
#[inline]
fn span<'a>(c: &'a Column, w: &[u32]) -> &'a [u8] {
    match w {
        [s, e] => c.bytes.get(*s as usize..*e as usize).unwrap_or(&[]),
        _ => &[],
    }
}

/// Copies `src` into `dst` (of one length): a short one by at most four
/// word copies that may overlap, since in wasm a copy of unknown length is
/// `memory.copy`, which the runtime serves with a call of its own, and a
/// byte loop pays an epoch check per byte.
#[inline]
fn copy_short(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    let Some(dst) = dst.get_mut(..n) else {
        return;
    };
    fn piece<const W: usize>(dst: &mut [u8], src: &[u8], at: usize) {
        if let (Some(d), Some(s)) = (dst.get_mut(at..at + W), src.get(at..at + W)) {
            d.copy_from_slice(s);
        }
    }
    match n {
        0 => {}
        1 => piece::<1>(dst, src, 0),
        2..=3 => {
            piece::<2>(dst, src, 0);
            piece::<2>(dst, src, n - 2);
        }
        4..=7 => {
            piece::<4>(dst, src, 0);
            piece::<4>(dst, src, n - 4);
        }
        8..=16 => {
            piece::<8>(dst, src, 0);
            piece::<8>(dst, src, n - 8);
        }
        17..=32 => {
            piece::<8>(dst, src, 0);
            piece::<8>(dst, src, 8);
            piece::<8>(dst, src, n - 16);
            piece::<8>(dst, src, n - 8);
        }
        _ => dst.copy_from_slice(src),
    }
}

/// The high half of the key's hash (the better mixed one), never
/// [`REPEAT`].
fn key_hash(key: &[u8]) -> u32 {
    use std::hash::Hasher;
    let mut h = crate::hash::FxHasher::default();
    h.write(key);
    match (h.finish() >> 32) as u32 {
        REPEAT => REPEAT - 1,
        h => h,
    }
}

/// Most slots of [`AggOp::lookup`]'s cache of recently used groups (a
/// power of two; 128 KiB). It is kept from chunk to chunk: a back-fill
/// read in time order brings each group's rows over a minute of the
/// table, which spans two chunks or more, and about 2,400 other groups
/// come between two rows of one group. Measured on the back-fill of
/// tests/benches/whole_path.py (1,000,000 rows, 167,000 groups, in the
/// server, perf at 2,000 Hz over 8 back-fills): probes of the key table
/// went from about 38 to 24 ms per back-fill and the flow's thread from
/// 3,032 to 2,784 samples, against a cache cleared for each chunk.
const RECENT: usize = 16384;

/// Fewest slots of that cache: it grows with the groups, up to
/// [`RECENT`], so that a flow with a few groups keeps a small one.
const RECENT_MIN: usize = 256;

/// In [`AggOp::lookup`]'s hashes, a row whose key is the row before's.
const REPEAT: u32 = u32::MAX;

/// The table's hash of a stored key hash: both halves, for hashbrown's
/// bucket (low bits) and tag (high bits).
#[inline]
fn table_hash(h: u32) -> u64 {
    (u64::from(h) << 32) | u64::from(h)
}

impl KeyTable {
    /// Group `g`'s key (empty for a removed group).
    fn key(&self, g: usize) -> &[u8] {
        self.spans
            .get(g)
            .and_then(|&(s, e)| self.bytes.get(s..e))
            .unwrap_or_default()
    }

    fn get(&self, key: &[u8]) -> Option<u32> {
        self.get_hashed(key, key_hash(key))
    }

    /// [`KeyTable::get`] of a key whose [`key_hash`] is `h`.
    fn get_hashed(&self, key: &[u8], h: u32) -> Option<u32> {
        self.table
            .find(table_hash(h), |&(g, x)| {
                x == h && same_bytes(self.key(g as usize), key)
            })
            .map(|&(g, _)| g)
    }

    /// Gives group `g` the key `key`, which no group has.
    fn insert(&mut self, key: &[u8], g: u32) {
        self.insert_hashed(key, key_hash(key), g)
    }

    /// [`KeyTable::insert`] of a key whose [`key_hash`] is `h`.
    fn insert_hashed(&mut self, key: &[u8], h: u32, g: u32) {
        let start = self.bytes.len();
        if key.len() <= 32 {
            // Whole words, not a copy of unknown length nor a byte loop (see
            // `copy_short`): the last word padded, the padding cut off.
            let mut words = key.chunks_exact(8);
            for c in &mut words {
                if let Ok(w) = <[u8; 8]>::try_from(c) {
                    self.bytes.extend_from_slice(&w);
                }
            }
            if !words.remainder().is_empty() {
                self.bytes
                    .extend_from_slice(&crate::hash::tail(key).to_le_bytes());
                self.bytes.truncate(start + key.len());
            }
        } else {
            self.bytes.extend_from_slice(key);
        }
        let gi = g as usize;
        if self.spans.len() <= gi {
            self.spans.resize(gi + 1, (0, 0));
        }
        self.spans[gi] = (start, self.bytes.len());
        self.table
            .insert_unique(table_hash(h), (g, h), |&(_, x)| table_hash(x));
    }

    fn remove(&mut self, g: u32) {
        let key_len = self.key(g as usize).len();
        let h = key_hash(self.key(g as usize));
        if let Ok(e) = self.table.find_entry(table_hash(h), |&(x, _)| x == g) {
            e.remove();
        }
        if let Some(span) = self.spans.get_mut(g as usize) {
            *span = (0, 0);
        }
        self.garbage += key_len;
        if self.garbage > 4096 && self.garbage * 2 > self.bytes.len() {
            self.compact();
        }
    }

    /// Rewrites the arena without the removed keys' bytes.
    fn compact(&mut self) {
        let mut bytes = Vec::with_capacity(self.bytes.len() - self.garbage);
        for span in &mut self.spans {
            let start = bytes.len();
            bytes.extend_from_slice(self.bytes.get(span.0..span.1).unwrap_or_default());
            *span = (start, bytes.len());
        }
        self.bytes = bytes;
        self.garbage = 0;
    }

    fn clear(&mut self) {
        *self = KeyTable::default();
    }

    fn approx_bytes(&self) -> usize {
        self.bytes.capacity() + self.spans.len() * 16 + self.table.capacity() * 9
    }
}

/// Appends the encoding of row `i` of `cols` (null tag + value per column) to `buf`.
pub(crate) fn encode_row(
    buf: &mut Vec<u8>,
    cols: &[Cow<'_, Column>],
    types: &[DataType],
    i: usize,
) {
    for (c, t) in cols.iter().zip(types.iter()) {
        match get(c, t.storage(), i) {
            S::Null => buf.push(0),
            S::I(x) => {
                buf.push(1);
                buf.extend_from_slice(&x.to_le_bytes());
            }
            S::F(f) => {
                buf.push(1);
                buf.extend_from_slice(&canonical_bits(f).to_le_bytes());
            }
            S::B(b) => {
                buf.push(1);
                buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
                buf.extend_from_slice(b);
            }
        }
    }
}

/// Rows `0..rows` of `cols` each encoded as [`encode_row`] does, one after the other:
/// row `i` is `bytes[offsets[i]..offsets[i + 1]]`. Column by column, so that a column of
/// integers without NULLs costs a copy per value.
pub(crate) struct Encoded {
    bytes: Vec<u8>,
    /// Every row's length when all are alike (no NULLs, no strings), else each row's start
    /// and the end in `offsets`.
    width: Option<usize>,
    offsets: Vec<u32>,
}

impl Encoded {
    pub fn new(cols: &[Cow<'_, Column>], types: &[DataType], rows: usize) -> Encoded {
        let fixed = cols.iter().zip(types).all(|(c, t)| match t.storage() {
            Storage::Bytes => false,
            Storage::Ints => c.ints.len() >= rows && !c.nulls.iter().any(|n| *n != 0),
            Storage::Floats => c.floats.len() >= rows && !c.nulls.iter().any(|n| *n != 0),
        });
        // Each row's start.
        let mut offsets: Vec<u32> = Vec::new();
        let width = 9 * cols.len().min(types.len());
        if fixed {
            offsets.push((rows * width) as u32);
        } else {
            offsets.reserve(rows + 1);
            let mut lens = vec![0u32; rows];
            for (c, t) in cols.iter().zip(types) {
                match dense(c, t.storage(), rows) {
                    Some(Storage::Bytes) => {
                        for (l, w) in lens.iter_mut().zip(c.offsets.windows(2)) {
                            *l += 5 + span(c, w).len() as u32;
                        }
                    }
                    Some(_) => lens.iter_mut().for_each(|l| *l += 9),
                    None => {
                        for (i, l) in lens.iter_mut().enumerate() {
                            *l += match get(c, t.storage(), i) {
                                S::Null => 1,
                                S::I(_) | S::F(_) => 9,
                                S::B(b) => 5 + b.len() as u32,
                            };
                        }
                    }
                }
            }
            offsets.push(0);
            let mut at = 0u32;
            for l in lens {
                at += l;
                offsets.push(at);
            }
        }
        let total = offsets.last().copied().unwrap_or(0) as usize;
        let mut bytes = vec![0u8; total];
        if fixed {
            let w = width;
            for (j, (c, t)) in cols.iter().zip(types).enumerate() {
                let o = 9 * j;
                let rows_of = bytes.chunks_exact_mut(w.max(1));
                if t.storage() == Storage::Floats {
                    for (r, f) in rows_of.zip(&c.floats) {
                        if let Some(d) = r.get_mut(o..o + 9) {
                            d[0] = 1;
                            d[1..].copy_from_slice(&canonical_bits(*f).to_le_bytes());
                        }
                    }
                } else {
                    for (r, x) in rows_of.zip(&c.ints) {
                        if let Some(d) = r.get_mut(o..o + 9) {
                            d[0] = 1;
                            d[1..].copy_from_slice(&x.to_le_bytes());
                        }
                    }
                }
            }
            return Encoded {
                bytes,
                width: Some(w),
                offsets,
            };
        }
        // Where the next value of each row goes.
        let mut at: Vec<u32> = offsets.get(..rows).unwrap_or(&[]).to_vec();
        for (c, t) in cols.iter().zip(types) {
            if dense(c, t.storage(), rows) == Some(Storage::Bytes) {
                for (a, w) in at.iter_mut().zip(c.offsets.windows(2)) {
                    let start = *a as usize;
                    let value = span(c, w);
                    let len = value.len() as u32;
                    if let Some(dst) = bytes.get_mut(start..start + 5 + value.len()) {
                        dst[0] = 1;
                        dst[1..5].copy_from_slice(&len.to_le_bytes());
                        copy_short(&mut dst[5..], value);
                    }
                    *a += 5 + len;
                }
                continue;
            }
            // A column of numbers without NULLs (a binned time beside a
            // string key): each value written as it is, no per-row match.
            let put = |bytes: &mut [u8], a: &mut u32, x: u64| {
                let start = *a as usize;
                if let Some(dst) = bytes.get_mut(start..start + 9) {
                    dst[0] = 1;
                    dst[1..].copy_from_slice(&x.to_le_bytes());
                }
                *a += 9;
            };
            match dense(c, t.storage(), rows) {
                Some(Storage::Ints) => {
                    for (a, x) in at.iter_mut().zip(&c.ints) {
                        put(&mut bytes, a, *x as u64);
                    }
                    continue;
                }
                Some(Storage::Floats) => {
                    for (a, f) in at.iter_mut().zip(&c.floats) {
                        put(&mut bytes, a, canonical_bits(*f));
                    }
                    continue;
                }
                _ => {}
            }
            for (i, a) in at.iter_mut().enumerate() {
                let start = *a as usize;
                let (tag, value): (u8, &[u8]) = match get(c, t.storage(), i) {
                    S::Null => (0, &[]),
                    S::B(b) => {
                        if let Some(dst) = bytes.get_mut(start + 1..start + 5) {
                            dst.copy_from_slice(&(b.len() as u32).to_le_bytes());
                        }
                        *a += 4;
                        (1, b)
                    }
                    v => {
                        let x = match v {
                            S::F(f) => canonical_bits(f),
                            S::I(x) => x as u64,
                            _ => 0,
                        };
                        if let Some(dst) = bytes.get_mut(start + 1..start + 9) {
                            dst.copy_from_slice(&x.to_le_bytes());
                        }
                        *a += 8;
                        (1, &[])
                    }
                };
                if let Some(dst) = bytes.get_mut(start) {
                    *dst = tag;
                }
                *a += 1;
                if !value.is_empty() {
                    let v = *a as usize;
                    if let Some(dst) = bytes.get_mut(v..v + value.len()) {
                        copy_short(dst, value);
                    }
                    *a += value.len() as u32;
                }
            }
        }
        Encoded {
            bytes,
            width: None,
            offsets,
        }
    }

    /// Row `i`'s encoding.
    #[inline]
    pub fn row(&self, i: usize) -> &[u8] {
        if let Some(w) = self.width {
            return self.bytes.get(i * w..(i + 1) * w).unwrap_or(&[]);
        }
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => self.bytes.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// Decodes column `want` of an encoded key.
pub(crate) fn decode_key(b: &[u8], types: &[DataType], want: usize) -> Out {
    match key_value(b, types, want) {
        S::Null => Out::Null,
        S::I(x) => Out::I(x),
        S::F(x) => Out::F(x),
        S::B(v) => Out::B(v.to_vec()),
    }
}

/// Column `want` of encoded key `b`, borrowed from it: the columns before
/// it are stepped over, not decoded.
pub(crate) fn key_value<'a>(mut b: &'a [u8], types: &[DataType], want: usize) -> S<'a> {
    for (ci, t) in types.iter().enumerate() {
        let Some((&tag, rest)) = b.split_first() else {
            return S::Null;
        };
        b = rest;
        if tag == 0 {
            if ci == want {
                return S::Null;
            }
            continue;
        }
        let v = match t.storage() {
            Storage::Ints | Storage::Floats => {
                let Some((x, rest)) = b.split_first_chunk::<8>() else {
                    return S::Null;
                };
                b = rest;
                if ci != want {
                    continue;
                }
                if t.storage() == Storage::Ints {
                    S::I(i64::from_le_bytes(*x))
                } else {
                    S::F(f64::from_bits(u64::from_le_bytes(*x)))
                }
            }
            Storage::Bytes => {
                let Some((l, rest)) = b.split_first_chunk::<4>() else {
                    return S::Null;
                };
                let l = u32::from_le_bytes(*l) as usize;
                let Some(v) = rest.get(..l) else {
                    return S::Null;
                };
                b = rest.get(l..).unwrap_or(&[]);
                S::B(v)
            }
        };
        if ci == want {
            return v;
        }
    }
    S::Null
}

/// Checks a restored encoded key: exactly what [`encode_row`] writes for values of `types`
/// (NULL only where the key is nullable, values in range, UTF-8 for utf8).
pub(crate) fn check_key(mut b: &[u8], types: &[DataType], nullable: &[bool]) -> Result<(), String> {
    let short = || "a group key is truncated".to_string();
    for (ci, t) in types.iter().enumerate() {
        let (&tag, rest) = b.split_first().ok_or_else(short)?;
        b = rest;
        match tag {
            0 if nullable.get(ci).copied().unwrap_or(false) => continue,
            0 => return Err(format!("group key {ci} is NULL but cannot be")),
            1 => {}
            _ => return Err("a group key has a bad NULL tag".into()),
        }
        match t.storage() {
            Storage::Ints | Storage::Floats => {
                let (x, rest) = b.split_first_chunk::<8>().ok_or_else(short)?;
                b = rest;
                let x = i64::from_le_bytes(*x);
                if t.storage() == Storage::Ints && !int_fits(*t, x) {
                    return Err(format!("group key {ci} holds {x}, out of range for {t}"));
                }
                let bits = x as u64;
                if t.storage() == Storage::Floats && canonical_bits(f64::from_bits(bits)) != bits {
                    return Err(format!("group key {ci} is a non-canonical float"));
                }
            }
            Storage::Bytes => {
                let (l, rest) = b.split_first_chunk::<4>().ok_or_else(short)?;
                let l = u32::from_le_bytes(*l) as usize;
                let v = rest.get(..l).ok_or_else(short)?;
                b = rest.get(l..).unwrap_or(&[]);
                if *t == DataType::Utf8 && std::str::from_utf8(v).is_err() {
                    return Err(format!("group key {ci} is not valid UTF-8"));
                }
            }
        }
    }
    if b.is_empty() {
        Ok(())
    } else {
        Err("a group key has trailing bytes".into())
    }
}

pub(crate) struct AggOp {
    spec: AggSpec,
    key_types: Vec<DataType>,
    arg_types: Vec<Option<DataType>>,
    keys: Keys,
    rows: Vec<i64>,
    alive: Vec<bool>,
    free: Vec<u32>,
    states: Vec<State>,
    /// Groups changed in the current tick, in order of first change, with their output before it.
    touched: Vec<u32>,
    mark: Vec<bool>,
    /// For `touched[..recorded]`: whether each group was present before the tick, and each
    /// measure's values then (one [`Vals`] per measure; flush appends the values after the
    /// tick to the same `Vals`, so that one gather reads both).
    old_present: Vec<bool>,
    old: Vec<Vals>,
    recorded: usize,
    /// How many of `touched[..recorded]`, from the first, were new groups
    /// whose earlier values (all NULL) are not stored in `old`. Either 0 or
    /// `recorded` (with `old` empty): a tick that makes only new groups (a
    /// back-fill's) stores no earlier value at all, and the first group
    /// that existed before stores those NULLs after all.
    old_unstored: usize,
    initialized: bool,
    global: bool,
    /// Index of the key used for expiry and its type.
    time_key: Option<(usize, DataType)>,
    expire_ms: Option<i64>,
    /// Scratch: each row's key hash in a lookup.
    key_hashes: Vec<u32>,
    /// Up to [`RECENT`] slots of (key hash, group) of groups used lately
    /// (see [`AggOp::lookup`]); a cache, checked at each use, never saved.
    recent: Vec<(u32, u32)>,
    gids: Vec<u32>,
}

pub(crate) fn to_ms(v: i64, t: DataType) -> i64 {
    match t {
        DataType::TimestampSecond => v.saturating_mul(1000),
        DataType::TimestampMillisecond => v,
        DataType::TimestampMicrosecond => v.div_euclid(1000),
        DataType::TimestampNanosecond => v.div_euclid(1_000_000),
        _ => v,
    }
}

impl AggOp {
    pub fn new(spec: AggSpec, expire_ms: Option<i64>) -> AggOp {
        let key_types: Vec<DataType> = spec.keys.iter().map(|k| k.ty()).collect();
        let arg_types: Vec<Option<DataType>> = spec
            .measures
            .iter()
            .map(|m| m.arg.as_ref().map(|a| a.ty()))
            .collect();
        let keys = match key_types.as_slice() {
            [] => Keys::Global,
            [t] if t.storage() == Storage::Ints => Keys::Int {
                map: IntMap::default(),
                null_gid: None,
                vals: Vec::new(),
                nulls: Vec::new(),
            },
            _ => Keys::Encoded(KeyTable::default()),
        };
        let mut states: Vec<State> = Vec::with_capacity(spec.measures.len());
        for (i, (m, t)) in spec.measures.iter().zip(arg_types.iter()).enumerate() {
            let min_max = |m: &MeasureSpec| matches!(m.kind, AggKind::Min | AggKind::Max);
            let twin = spec
                .measures
                .get(..i)
                .unwrap_or_default()
                .iter()
                .position(|o| min_max(o) && min_max(m) && o.arg == m.arg && o.filter == m.filter);
            states.push(match twin {
                Some(of) if matches!(states.get(of), Some(State::MinMax { .. })) => State::Mirror {
                    of,
                    max: m.kind == AggKind::Max,
                },
                _ => State::new(m.kind, *t, &m.param),
            });
        }
        let time_key = key_types
            .iter()
            .enumerate()
            .find(|(_, t)| t.is_timestamp())
            .map(|(i, t)| (i, *t));
        let global = key_types.is_empty();
        let mut op = AggOp {
            spec,
            key_types,
            arg_types,
            keys,
            rows: Vec::new(),
            alive: Vec::new(),
            free: Vec::new(),
            states,
            touched: Vec::new(),
            mark: Vec::new(),
            old_present: Vec::new(),
            old: Vec::new(),
            recorded: 0,
            old_unstored: 0,
            initialized: false,
            global,
            time_key,
            expire_ms,
            key_hashes: Vec::new(),
            recent: Vec::new(),
            gids: Vec::new(),
        };
        op.old = op
            .states
            .iter()
            .zip(&op.arg_types)
            .map(|(s, t)| Vals::new(s, *t))
            .collect();
        if matches!(op.keys, Keys::Global) {
            op.alloc_gid();
        }
        op
    }

    pub fn out_types(&self) -> Vec<DataType> {
        let mut t = self.key_types.clone();
        t.extend(self.spec.measures.iter().map(|m| m.out));
        t
    }

    fn alloc_gid(&mut self) -> u32 {
        if let Some(g) = self.free.pop() {
            set(&mut self.alive, g as usize, true);
            return g;
        }
        let g = self.rows.len();
        let len = g + 1;
        self.rows.push(0);
        self.alive.push(true);
        self.mark.push(false);
        for s in &mut self.states {
            s.grow(len);
        }
        g as u32
    }

    /// Notes that group `g` changes in this tick (its old output is recorded by
    /// [`AggOp::record_old`] before any state changes).
    #[inline]
    fn touch(&mut self, g: u32) {
        let gi = g as usize;
        if self.mark.get(gi).copied().unwrap_or(true) {
            return;
        }
        set(&mut self.mark, gi, true);
        self.touched.push(g);
    }

    /// Records the output before the tick of the groups touched since the last call.
    fn record_old(&mut self) {
        let fresh = self.touched.get(self.recorded..).unwrap_or_default();
        if fresh.is_empty() {
            return;
        }
        let (alive, rows) = (&self.alive, &self.rows);
        if self.global {
            let initialized = self.initialized;
            self.old_present.extend(fresh.iter().map(|_| initialized));
        } else {
            let present = fresh
                .iter()
                .map(|&g| group_present(alive, rows, g as usize));
            self.old_present.extend(present);
        }
        let from = self.old_present.len() - fresh.len();
        let all_new = !self
            .old_present
            .get(from..)
            .unwrap_or_default()
            .contains(&true);
        if all_new && self.old_unstored == self.recorded {
            // Groups without output before (all a back-fill touches):
            // flush never reads their earlier values, so none is stored.
            self.old_unstored += fresh.len();
            self.recorded = self.touched.len();
            return;
        }
        let unstored = std::mem::take(&mut self.old_unstored);
        for ((s, t), vals) in self.states.iter().zip(&self.arg_types).zip(&mut self.old) {
            vals.reserve_halves(unstored + fresh.len());
            vals.push_nulls(unstored);
            match all_new {
                true => vals.push_nulls(fresh.len()),
                false => s.values(&self.states, fresh, *t, &self.rows, vals),
            }
        }
        self.recorded = self.touched.len();
    }

    fn present(&self, g: usize) -> bool {
        match self.global {
            true => self.initialized,
            false => group_present(&self.alive, &self.rows, g),
        }
    }

    /// Expiry threshold in ms for a tick at `now`.
    fn threshold(&self, now: i64) -> Option<i64> {
        match (self.time_key, self.expire_ms) {
            (Some(_), Some(e)) => Some(now.saturating_sub(e)),
            _ => None,
        }
    }

    /// A new group for integer key `k` (or the NULL key), recorded in the key table.
    fn new_int_group(&mut self, k: i64, null: bool) -> u32 {
        let g = self.alloc_gid();
        if let Keys::Int {
            map,
            null_gid,
            vals,
            nulls,
        } = &mut self.keys
        {
            if null {
                *null_gid = Some(g);
            } else {
                map.insert(k, g);
            }
            let gi = g as usize;
            if vals.len() <= gi {
                vals.resize(gi + 1, 0);
                nulls.resize(gi + 1, false);
            }
            set(vals, gi, k);
            set(nulls, gi, null);
        }
        g
    }

    /// Looks up (creating as needed) the group of every row into `self.gids`.
    fn lookup(&mut self, keys: &[Cow<'_, Column>], n: usize, now: i64) {
        let mut gids = std::mem::take(&mut self.gids);
        gids.clear();
        gids.reserve(n);
        let threshold = self.threshold(now);
        let time_key = self.time_key;
        let expired = |i: usize| -> bool {
            match (threshold, time_key) {
                (Some(th), Some((ki, t))) => keys.get(ki).is_some_and(|c| {
                    !c.is_null(i) && to_ms(c.ints.get(i).copied().unwrap_or(0), t) < th
                }),
                _ => false,
            }
        };
        match &self.keys {
            Keys::Global => {
                gids.resize(n, 0);
                if n > 0 {
                    self.touch(0);
                }
                if threshold.is_some() {
                    for (i, g) in gids.iter_mut().enumerate() {
                        if expired(i) {
                            *g = SKIP;
                        }
                    }
                }
            }
            Keys::Int { .. }
                if threshold.is_none() && keys.first().is_some_and(|c| c.nulls.is_empty()) =>
            {
                // Fast path: one non-null integer key, no expiry. Runs of known keys in their
                // home slot are looked up by one small loop; any other key stops it, to be
                // looked up in full or given a new group.
                let empty = Column::default();
                let col = keys.first().map_or(&empty, |c| c.as_ref());
                let ks = col.ints.get(..n).unwrap_or(&col.ints);
                gids.resize(ks.len(), 0);
                let mut i = 0;
                while i < ks.len() {
                    let mut found = None;
                    if let Keys::Int { map, .. } = &self.keys {
                        let (kr, gr) = (ks.get(i..).unwrap_or_default(), gids.get_mut(i..));
                        i += map.find_run(kr, gr.unwrap_or_default());
                        found = ks.get(i).and_then(|&k| map.get(k));
                    }
                    let Some(&k) = ks.get(i) else { break };
                    let g = match found {
                        Some(g) => g,
                        None => self.new_int_group(k, false),
                    };
                    set(&mut gids, i, g);
                    i += 1;
                }
                mark_touched(&mut self.mark, &mut self.touched, &gids);
            }
            Keys::Int { .. } => {
                let col = keys.first().map(|c| c.as_ref());
                let empty = Column::default();
                let col = col.unwrap_or(&empty);
                let has_nulls = !col.nulls.is_empty();
                for i in 0..n {
                    if threshold.is_some() && expired(i) {
                        gids.push(SKIP);
                        continue;
                    }
                    let null = has_nulls && col.is_null(i);
                    let k = col.ints.get(i).copied().unwrap_or(0);
                    let found = match &self.keys {
                        Keys::Int { map, null_gid, .. } => {
                            if null {
                                *null_gid
                            } else {
                                map.get(k)
                            }
                        }
                        _ => None,
                    };
                    let g = match found {
                        Some(g) => g,
                        None => self.new_int_group(k, null),
                    };
                    if !self.mark.get(g as usize).copied().unwrap_or(true) {
                        self.touch(g);
                    }
                    gids.push(g);
                }
            }
            Keys::Encoded { .. } => {
                // All keys encoded first, then all hashed, then looked up:
                // each pass reads what the one before wrote long ago, and
                // the lookups of different rows overlap in the CPU.
                // A row whose key is the row before's (rows that come in
                // runs of a group: a back-fill read by series and time) is
                // marked with `REPEAT` and takes that row's group, without
                // hashing or probing: a word compare of bytes just read.
                // A row whose group was used lately (rows in time order:
                // each series' rows of one minute, a few seconds apart)
                // finds it in `recent`, slots of (key hash, group) by key
                // hash, kept across chunks: a check of the group's key,
                // stored lately and so in cache, instead of probing the
                // table (a cache miss or more). A slot whose group was
                // removed, or given to another key since, fails the check.
                let enc = Encoded::new(keys, &self.key_types, n);
                let mut recent = std::mem::take(&mut self.recent);
                let slots = (self.rows.len() + n)
                    .next_power_of_two()
                    .clamp(RECENT_MIN, RECENT);
                if recent.len() < slots {
                    recent.clear();
                    recent.resize(slots, (0, u32::MAX));
                }
                let mask = recent.len() - 1;
                let mut hashes = std::mem::take(&mut self.key_hashes);
                hashes.clear();
                hashes.reserve(n);
                let mut before: &[u8] = &[];
                for i in 0..n {
                    let key = enc.row(i);
                    let repeat = i > 0 && same_bytes(key, before);
                    hashes.push(if repeat { REPEAT } else { key_hash(key) });
                    before = key;
                }
                for (i, &h) in hashes.iter().enumerate() {
                    if h == REPEAT && i > 0 {
                        if let Some(&g) = gids.last() {
                            gids.push(g);
                            continue;
                        }
                    }
                    if threshold.is_some() && expired(i) {
                        gids.push(SKIP);
                        continue;
                    }
                    let key = enc.row(i);
                    let h = if h == REPEAT { key_hash(key) } else { h };
                    let slot = h as usize & mask;
                    let Keys::Encoded(table) = &self.keys else {
                        break;
                    };
                    let cached = match recent.get(slot) {
                        Some(&(sh, g))
                            if sh == h
                                && self.alive.get(g as usize).copied().unwrap_or(false)
                                && same_bytes(table.key(g as usize), key) =>
                        {
                            Some(g)
                        }
                        _ => None,
                    };
                    let g = match cached.or_else(|| table.get_hashed(key, h)) {
                        Some(g) => g,
                        None => {
                            let g = self.alloc_gid();
                            if let Keys::Encoded(table) = &mut self.keys {
                                table.insert_hashed(key, h, g);
                            }
                            g
                        }
                    };
                    if !self.mark.get(g as usize).copied().unwrap_or(true) {
                        self.touch(g);
                    }
                    if let Some(r) = recent.get_mut(slot) {
                        *r = (h, g);
                    }
                    gids.push(g);
                }
                self.key_hashes = hashes;
                self.recent = recent;
            }
        }
        self.gids = gids;
    }

    /// Folds a chunk of input diffs into the group state.
    #[inline(never)]
    pub fn absorb(&mut self, c: &Chunk, now: i64) -> Result<(), FlowError> {
        let n = c.rows;
        if n == 0 {
            return Ok(());
        }
        // Evaluate everything first so that an evaluation error leaves the state untouched.
        let keys = self
            .spec
            .keys
            .iter()
            .map(|k| k.eval(c))
            .collect::<Result<Vec<_>, _>>()?;
        let mut args: Vec<Option<Cow<'_, Column>>> = Vec::new();
        let mut filters: Vec<Option<Cow<'_, Column>>> = Vec::new();
        for m in &self.spec.measures {
            args.push(match &m.arg {
                Some(a) => Some(a.eval(c)?),
                None => None,
            });
            filters.push(match &m.filter {
                Some(f) => Some(f.eval(c)?),
                None => None,
            });
        }
        self.lookup(&keys, n, now);
        self.record_old();
        let gids = std::mem::take(&mut self.gids);
        let diffs = &c.diffs;
        // The measures first: counts that share the row counts copy them as they were
        // before this chunk.
        for (mi, state) in self.states.iter_mut().enumerate() {
            let arg = args.get(mi).and_then(|a| a.as_deref());
            let filter = filters.get(mi).and_then(|f| f.as_deref());
            let at = self.arg_types.get(mi).copied().flatten();
            if let Err(e) = update(state, &self.rows, &gids, diffs, arg, at, filter) {
                self.gids = gids;
                return Err(e);
            }
        }
        scatter_diffs(&mut self.rows, &gids, diffs);
        self.gids = gids;
        Ok(())
    }

    #[inline]
    fn key_out(&self, g: usize, k: usize) -> Out {
        match &self.keys {
            Keys::Global => Out::Null,
            Keys::Int { vals, nulls, .. } => {
                if nulls.get(g).copied().unwrap_or(true) {
                    Out::Null
                } else {
                    Out::I(vals.get(g).copied().unwrap_or(0))
                }
            }
            Keys::Encoded(table) => decode_key(table.key(g), &self.key_types, k),
        }
    }

    fn remove_group(&mut self, g: u32) {
        let gi = g as usize;
        match &mut self.keys {
            Keys::Global => return,
            Keys::Int {
                map,
                null_gid,
                vals,
                nulls,
            } => {
                if nulls.get(gi).copied().unwrap_or(false) {
                    *null_gid = None;
                } else if let Some(k) = vals.get(gi) {
                    map.remove(*k);
                }
            }
            Keys::Encoded(table) => table.remove(g),
        }
        set(&mut self.rows, gi, 0);
        set(&mut self.alive, gi, false);
        for s in &mut self.states {
            s.reset(gi);
        }
        self.free.push(g);
    }

    /// Emits the tick's changes (-old, +new per changed group, in order of first change) and
    /// clears the tick bookkeeping. Works a column at a time: first which rows to emit, then
    /// each output column gathered from the old and new values.
    #[inline(never)]
    pub fn flush(&mut self) -> Chunk {
        if matches!(self.keys, Keys::Global) && !self.initialized {
            self.touch(0);
            self.record_old();
            self.initialized = true;
        }
        // Every touched group needs its old values: the halves compared below depend on it.
        self.record_old();
        let touched = std::mem::take(&mut self.touched);
        let old_present = std::mem::take(&mut self.old_present);
        let mut vals = std::mem::take(&mut self.old);
        let t = touched.len();
        // Where the values after the tick start: after the earlier ones, or
        // first when none was stored (every group is new, see `old_unstored`).
        let after = match std::mem::take(&mut self.old_unstored) {
            0 => t,
            _ => 0,
        };
        for ((s, ty), v) in self.states.iter().zip(&self.arg_types).zip(&mut vals) {
            if after == 0 {
                v.reserve(t);
            }
            s.values(&self.states, &touched, *ty, &self.rows, v);
        }
        // A group is emitted unless it was and is present with the same values
        // (none of them was present when no earlier value was stored).
        let is: Vec<bool> = touched.iter().map(|&g| self.present(g as usize)).collect();
        let mut same: Vec<bool> = old_present.iter().zip(&is).map(|(&w, &i)| w & i).collect();
        if after == t {
            for v in &vals {
                v.same_halves(&mut same);
            }
        }
        let emit = emit_rows(&old_present, &is, &same);
        let mut cols = Vec::with_capacity(self.key_types.len() + self.states.len());
        for k in 0..self.key_types.len() {
            cols.push(self.key_column(k, &emit, &touched));
        }
        for (v, m) in vals.iter().zip(&self.spec.measures) {
            cols.push(measure_column(&emit, v, after, m.out));
        }
        let diffs: Vec<i64> = emit.iter().map(|e| ((e & 1) as i64) * 2 - 1).collect();
        unmark(&mut self.mark, &touched);
        // Groups left without rows may be gone; looking for them is one call-free pass.
        let rows = &self.rows;
        let emptied = |g: &u32| rows.get(*g as usize).copied() == Some(0);
        if !matches!(self.keys, Keys::Global) && touched.iter().any(emptied) {
            for &g in &touched {
                let gi = g as usize;
                if self.rows.get(gi).copied() == Some(0)
                    && self.states.iter().all(|s| s.is_empty(gi, &self.rows))
                {
                    self.remove_group(g);
                }
            }
        }
        // Reuse the allocations next tick.
        vals.iter_mut().for_each(Vals::clear);
        self.old = vals;
        let (mut touched, mut old_present) = (touched, old_present);
        touched.clear();
        old_present.clear();
        self.touched = touched;
        self.old_present = old_present;
        self.recorded = 0;
        Chunk {
            rows: diffs.len(),
            cols,
            diffs: Diffs::Each(diffs),
        }
    }

    /// Output column of group key `k` for the rows of `emit` (see [`AggOp::flush`]).
    #[inline(never)]
    fn key_column(&self, k: usize, emit: &[u32], touched: &[u32]) -> Column {
        let group = |e: u32| touched.get((e >> 1) as usize).copied().unwrap_or_default() as usize;
        match &self.keys {
            Keys::Int {
                vals,
                nulls,
                null_gid,
                ..
            } => {
                let mut col = Column {
                    ints: emit
                        .iter()
                        .map(|&e| vals.get(group(e)).copied().unwrap_or(0))
                        .collect(),
                    ..Column::default()
                };
                let null = |e: u32| nulls.get(group(e)).copied().unwrap_or(true);
                // Only the NULL key's group (if there is one) has a NULL key.
                if null_gid.is_some() && emit.iter().any(|&e| null(e)) {
                    col.nulls = emit.iter().map(|&e| null(e) as u8).collect();
                    for (v, n) in col.ints.iter_mut().zip(&col.nulls) {
                        if *n != 0 {
                            *v = 0;
                        }
                    }
                }
                col
            }
            _ => {
                let ty = self.key_types.get(k).copied().unwrap_or(DataType::Int64);
                let mut b = ColBuilder::new(ty, emit.len());
                match &self.keys {
                    Keys::Encoded(table) => {
                        for &e in emit {
                            b.push(key_value(table.key(group(e)), &self.key_types, k));
                        }
                    }
                    _ => {
                        for &e in emit {
                            b.push(self.key_out(group(e), k).as_s());
                        }
                    }
                }
                b.finish()
            }
        }
    }

    /// Drops groups whose time key is older than the expiry horizon (emitting nothing).
    /// Returns the earliest time at which another group would expire.
    pub fn expire(&mut self, now: i64) -> Option<i64> {
        let th = self.threshold(now)?;
        let (ki, t) = self.time_key?;
        let e = self.expire_ms?;
        let mut next: Option<i64> = None;
        for g in 0..self.alive.len() {
            if !self.alive.get(g).copied().unwrap_or(false) {
                continue;
            }
            let Out::I(v) = self.key_out(g, ki) else {
                continue;
            };
            let ms = to_ms(v, t);
            if ms < th {
                self.remove_group(g as u32);
            } else {
                let at = ms.saturating_add(e).saturating_add(1);
                next = Some(next.map_or(at, |x: i64| x.min(at)));
            }
        }
        next
    }

    /// How many measures read another's multisets ([`State::Mirror`]).
    #[cfg(test)]
    pub fn mirrors(&self) -> usize {
        let mirror = |s: &&State| matches!(s, State::Mirror { .. });
        self.states.iter().filter(mirror).count()
    }

    pub fn state_size(&self) -> usize {
        let keys = match &self.keys {
            Keys::Global => 0,
            Keys::Int { vals, .. } => vals.len() * (8 + 1 + 16),
            Keys::Encoded(table) => table.approx_bytes(),
        };
        keys + self.rows.len() * 10 + self.states.iter().map(|s| s.approx_bytes()).sum::<usize>()
    }

    pub fn write(&self, w: &mut Writer) {
        w.u8(self.initialized as u8);
        let n = self.rows.len();
        w.u64(n as u64);
        w.i64s(&self.rows);
        w.each(self.alive.len(), &self.alive, |a| [*a as u8]);
        match &self.keys {
            Keys::Global => {}
            Keys::Int { vals, nulls, .. } => {
                for g in 0..n {
                    w.i64(vals.get(g).copied().unwrap_or(0));
                    w.u8(nulls.get(g).copied().unwrap_or(false) as u8);
                }
            }
            Keys::Encoded(table) => {
                for g in 0..n {
                    w.bytes(table.key(g));
                }
            }
        }
        w.u64(self.free.len() as u64);
        for f in &self.free {
            w.u32(*f);
        }
        for s in &self.states {
            s.write(w, &self.rows);
        }
        // A tick in progress (format 3): the groups that rows absorbed as they were pushed
        // (`Flow::push`) changed, with their output before, which the next flush emits.
        w.u32s(self.touched.get(..self.recorded).unwrap_or_default());
        w.bools(self.old_present.get(..self.recorded).unwrap_or_default());
        for v in &self.old {
            match self.old_unstored {
                0 => v.write(w),
                n => v.write_nulls(w, n),
            }
        }
    }

    /// Whether it drops groups after `EXPIRE AFTER` (which depends on the tick time).
    pub fn expires(&self) -> bool {
        self.expire_ms.is_some()
    }

    /// Reads the tick in progress [`AggOp::write`] wrote (`alive`: the restored groups).
    fn read_touched(&mut self, r: &mut Reader<'_>, alive: &[bool]) -> Result<(), FlowError> {
        let snap_err = |m: &str| crate::types::bad(format!("snapshot: {m}"));
        let touched = r.u32s()?;
        let t = touched.len();
        let mut mark = vec![false; alive.len()];
        for &g in &touched {
            match mark.get_mut(g as usize) {
                Some(m) if !*m && alive.get(g as usize) == Some(&true) => *m = true,
                _ => return Err(snap_err("a changed group is unknown or listed twice")),
            }
        }
        let old_present = r.bools()?;
        if old_present.len() != t {
            return Err(snap_err(
                "changed groups and their presence differ in number",
            ));
        }
        let emit: Vec<u32> = (0..t as u32).map(|i| i << 1).collect();
        for (v, m) in self.old.iter_mut().zip(&self.spec.measures) {
            v.read(r, t)?;
            if t > 0 {
                // The earlier values reach the output at the next flush.
                let col = measure_column(&emit, v, t, m.out);
                let field = crate::types::Field::new("measure", m.out, true);
                let batch = crate::types::Batch {
                    rows: t as u32,
                    columns: vec![col],
                    times: vec![0],
                    diffs: vec![-1],
                };
                crate::types::validate_batch(&[field], &batch)
                    .map_err(|e| snap_err(&format!("a changed group's earlier value: {e}")))?;
            }
        }
        self.touched = touched;
        self.old_present = old_present;
        self.recorded = t;
        self.old_unstored = 0;
        self.mark = mark;
        Ok(())
    }

    /// Reads what [`AggOp::write`] wrote into a snapshot of format `version`.
    pub fn read(&mut self, r: &mut Reader<'_>, version: u32) -> Result<(), FlowError> {
        let snap_err = |m: &str| crate::types::bad(format!("snapshot: {m}"));
        self.initialized = r.u8()? != 0;
        let n = r.len(9)?;
        let rows = r.i64s()?;
        if rows.len() != n {
            return Err(snap_err("group count mismatch"));
        }
        let mut alive = Vec::with_capacity(n);
        for _ in 0..n {
            alive.push(r.u8()? != 0);
        }
        if matches!(self.keys, Keys::Global) && n != 1 {
            return Err(snap_err("a global aggregate has exactly one group"));
        }
        match &mut self.keys {
            Keys::Global => {}
            Keys::Int {
                map,
                null_gid,
                vals,
                nulls,
            } => {
                map.clear();
                *null_gid = None;
                vals.clear();
                nulls.clear();
                for g in 0..n {
                    let v = r.i64()?;
                    let nl = r.u8()? != 0;
                    vals.push(v);
                    nulls.push(nl);
                    if alive.get(g).copied().unwrap_or(false) {
                        let dup = if nl {
                            null_gid.replace(g as u32).is_some()
                        } else {
                            map.insert(v, g as u32).is_some()
                        };
                        if dup {
                            return Err(snap_err("duplicate group key"));
                        }
                    }
                }
            }
            Keys::Encoded(table) => {
                table.clear();
                for g in 0..n {
                    let v = r.bytes()?;
                    if alive.get(g).copied().unwrap_or(false) {
                        if table.get(v).is_some() {
                            return Err(snap_err("duplicate group key"));
                        }
                        table.insert(v, g as u32);
                    }
                }
            }
        }
        let nf = r.len(4)?;
        let mut free = Vec::with_capacity(nf);
        for _ in 0..nf {
            let f = r.u32()?;
            if f as usize >= n || alive.get(f as usize).copied().unwrap_or(true) {
                return Err(snap_err("bad free list"));
            }
            free.push(f);
        }
        for s in &mut self.states {
            s.read(r, n, &rows, version)?;
        }
        // Everything that can reach the output must be a value of its column's type.
        match &self.keys {
            Keys::Global => {}
            Keys::Int { vals, nulls, .. } => {
                let t = self.key_types.first().copied().unwrap_or(DataType::Int64);
                let nullable = self.spec.key_nullable.first().copied().unwrap_or(false);
                for g in (0..n).filter(|g| alive.get(*g).copied().unwrap_or(false)) {
                    if nulls.get(g).copied().unwrap_or(false) {
                        if !nullable {
                            return Err(snap_err("group key 0 is NULL but cannot be"));
                        }
                    } else if let Some(v) = vals.get(g).filter(|v| !int_fits(t, **v)) {
                        return Err(snap_err(&format!(
                            "group key 0 holds {v}, out of range for {t}"
                        )));
                    }
                }
            }
            Keys::Encoded(table) => {
                for g in (0..n).filter(|g| alive.get(*g).copied().unwrap_or(false)) {
                    let key = table.key(g);
                    check_key(key, &self.key_types, &self.spec.key_nullable)
                        .map_err(|m| snap_err(&m))?;
                }
            }
        }
        for (s, t) in self.states.iter().zip(&self.arg_types) {
            s.check(*t).map_err(|m| snap_err(&m))?;
        }
        self.mark = vec![false; n];
        self.touched.clear();
        self.old_present.clear();
        self.old.iter_mut().for_each(Vals::clear);
        self.recorded = 0;
        self.old_unstored = 0;
        if version >= 3 {
            self.read_touched(r, &alive)?;
        }
        self.rows = rows;
        self.alive = alive;
        self.free = free;
        Ok(())
    }
}

/// Appends min or max of each group's multiset in `sets` to `out` (see [`State::values`]).
fn min_max_values(
    sets: &[MultiSet],
    max: bool,
    groups: &[u32],
    in_ty: Option<DataType>,
    out: &mut Vals,
) {
    let t = in_ty.unwrap_or(DataType::Int64);
    for &g in groups {
        match sets.get(g as usize).map(|s| s.min_max(max, t)) {
            Some(Out::I(x)) => out.push_bits(x),
            Some(Out::F(x)) => out.push_bits(x.to_bits() as i64),
            Some(b @ Out::B(_)) => out.push_wide(b),
            _ => out.push_null(),
        }
    }
}

/// Clears the touch marks of `groups`.
#[inline(never)]
fn unmark(mark: &mut [bool], groups: &[u32]) {
    for &g in groups {
        if let Some(m) = mark.get_mut(g as usize) {
            *m = false;
        }
    }
}

/// Whether group `g` (of a grouped aggregate) has rows.
#[inline]
fn group_present(alive: &[bool], rows: &[i64], g: usize) -> bool {
    alive.get(g).copied().unwrap_or(false) & (rows.get(g).copied().unwrap_or(0) > 0)
}

/// The rows flush emits, as `ti << 1 | new`: for each touched group `ti` that changed, its old
/// row (`new` = 0) if it was present and its new row (1) if it is. Branch-free: every group
/// writes both candidates and only those emitted move the end.
#[inline(never)]
fn emit_rows(was: &[bool], is: &[bool], same: &[bool]) -> Vec<u32> {
    let mut emit: Vec<u32> = vec![0; same.len() * 2];
    let mut len = 0;
    for (ti, ((&was, &is), &same)) in was.iter().zip(is).zip(same).enumerate() {
        let at = (ti as u32) << 1;
        set(&mut emit, len, at);
        len += usize::from(was & !same);
        set(&mut emit, len, at | 1);
        len += usize::from(is & !same);
    }
    emit.truncate(len);
    emit
}

/// Appends `v[g]` (0 when out of range) for each group of `groups`.
#[inline(never)]
fn gather(out: &mut Vec<i64>, v: &[i64], groups: &[u32]) {
    out.extend(
        groups
            .iter()
            .map(|&g| v.get(g as usize).copied().unwrap_or(0)),
    );
}

/// Marks the groups of `gids` as touched, noting each group's first touch in `touched`.
fn mark_touched(mark: &mut [bool], touched: &mut Vec<u32>, gids: &[u32]) {
    let base = touched.len();
    touched.resize(base + gids.len(), 0);
    let fresh = first_touches(mark, touched.get_mut(base..).unwrap_or_default(), gids);
    touched.truncate(base + fresh);
}

/// Marks each group of `gids` (skipping those out of range, e.g. `SKIP`), writing the groups
/// not marked before into `out` in order; returns how many. Unrolled by four, out of line and
/// free of calls (a `Vec::push` here made Cranelift keep the loop's state on the stack).
#[inline(never)]
fn first_touches(mark: &mut [bool], out: &mut [u32], gids: &[u32]) -> usize {
    let mut n = 0;
    let mut touch = |g: u32| {
        if let Some(m) = mark.get_mut(g as usize) {
            if !*m {
                *m = true;
                if let Some(o) = out.get_mut(n) {
                    *o = g;
                }
                n += 1;
            }
        }
    };
    let mut g4 = gids.chunks_exact(4);
    for c in &mut g4 {
        for &g in c {
            touch(g);
        }
    }
    for &g in g4.remainder() {
        touch(g);
    }
    n
}

/// `v[g[i]] += d[i]` for every row (rows whose group is out of range, e.g. `SKIP`, are left
/// out). Unrolled by four: in wasm every loop iteration also pays an epoch-interruption check.
/// Out of line, like the other per-row loops, so that Cranelift allocates its registers alone.
#[inline(never)]
fn scatter_add(v: &mut [i64], gids: &[u32], diffs: &[i64]) {
    let mut g4 = gids.chunks_exact(4);
    let mut d4 = diffs.chunks_exact(4);
    for (g, d) in (&mut g4).zip(&mut d4) {
        for (g, d) in g.iter().zip(d) {
            if let Some(x) = v.get_mut(*g as usize) {
                *x = x.wrapping_add(*d);
            }
        }
    }
    for (g, d) in g4.remainder().iter().zip(d4.remainder()) {
        if let Some(x) = v.get_mut(*g as usize) {
            *x = x.wrapping_add(*d);
        }
    }
}

/// `v[g[i]] += diff of row i` for every row (see [`scatter_add`]).
fn scatter_diffs(v: &mut [i64], gids: &[u32], diffs: &Diffs) {
    match diffs {
        Diffs::Each(d) => scatter_add(v, gids, d),
        Diffs::All(d) => scatter_add_const(v, gids, *d),
    }
}

/// The [`ord_key`] of each of the first `n` values of `a`, a column of
/// type `t` holding numbers without NULLs.
#[inline(never)]
fn ord_keys(a: &Column, t: DataType, n: usize) -> Vec<i64> {
    match t.storage() {
        Storage::Floats => a.floats.iter().take(n).map(|&f| float_ord_key(f)).collect(),
        _ if t == DataType::UInt64 => a.ints.iter().take(n).map(|&x| x ^ i64::MIN).collect(),
        _ => a.ints.iter().take(n).copied().collect(),
    }
}

/// `v[g[i]] += d` for every row, unrolled like [`scatter_add`].
#[inline(never)]
fn scatter_add_const(v: &mut [i64], gids: &[u32], d: i64) {
    let mut g4 = gids.chunks_exact(4);
    for g in &mut g4 {
        for g in g {
            if let Some(x) = v.get_mut(*g as usize) {
                *x = x.wrapping_add(d);
            }
        }
    }
    for g in g4.remainder() {
        if let Some(x) = v.get_mut(*g as usize) {
            *x = x.wrapping_add(d);
        }
    }
}

/// `v[g[i]] += x[i] * d` (wrapping) for every row: [`scatter_mul_add`] with one diff for all.
#[inline(never)]
fn scatter_scaled_add(v: &mut [i64], gids: &[u32], x: &[i64], d: i64) {
    let n = gids.len().min(x.len());
    let (gids, x) = (
        gids.get(..n).unwrap_or_default(),
        x.get(..n).unwrap_or_default(),
    );
    let mut g4 = gids.chunks_exact(4);
    let mut x4 = x.chunks_exact(4);
    for (g, x) in (&mut g4).zip(&mut x4) {
        for (g, x) in g.iter().zip(x) {
            if let Some(s) = v.get_mut(*g as usize) {
                *s = s.wrapping_add(x.wrapping_mul(d));
            }
        }
    }
    for (g, x) in g4.remainder().iter().zip(x4.remainder()) {
        if let Some(s) = v.get_mut(*g as usize) {
            *s = s.wrapping_add(x.wrapping_mul(d));
        }
    }
}

/// `v[g[i]] += x[i] * d[i]` (wrapping) for every row, unrolled like [`scatter_add`]. Rows past the
/// end of `x` (none in a validated chunk) would add 0 * d = 0 and are left out.
#[inline(never)]
fn scatter_mul_add(v: &mut [i64], gids: &[u32], diffs: &[i64], x: &[i64]) {
    let n = gids.len().min(diffs.len()).min(x.len());
    let gh = gids.get(..n).unwrap_or_default();
    let dh = diffs.get(..n).unwrap_or_default();
    let xh = x.get(..n).unwrap_or_default();
    let mut g4 = gh.chunks_exact(4);
    let mut d4 = dh.chunks_exact(4);
    let mut x4 = xh.chunks_exact(4);
    for ((g, d), x) in (&mut g4).zip(&mut d4).zip(&mut x4) {
        for ((g, d), x) in g.iter().zip(d).zip(x) {
            if let Some(s) = v.get_mut(*g as usize) {
                *s = s.wrapping_add(x.wrapping_mul(*d));
            }
        }
    }
    for ((g, d), x) in g4
        .remainder()
        .iter()
        .zip(d4.remainder())
        .zip(x4.remainder())
    {
        if let Some(s) = v.get_mut(*g as usize) {
            *s = s.wrapping_add(x.wrapping_mul(*d));
        }
    }
}

/// Folds rows into one measure's state. `rows` are the groups' row counts before these rows.
fn update(
    state: &mut State,
    rows: &[i64],
    gids: &[u32],
    diffs: &Diffs,
    arg: Option<&Column>,
    at: Option<DataType>,
    filter: Option<&Column>,
) -> Result<(), FlowError> {
    // Every row counts: the counts follow the row counts (and only add up when stored).
    let simple = filter.is_none() && arg.is_none_or(|a| a.nulls.is_empty());
    let empty = Column::default();
    let a = arg.unwrap_or(&empty);
    if simple {
        match state {
            State::Count(n) => {
                if let Some(v) = &mut n.0 {
                    scatter_diffs(v, gids, diffs);
                }
                return Ok(());
            }
            State::SumInt { s, n } => {
                if let Some(v) = &mut n.0 {
                    scatter_diffs(v, gids, diffs);
                }
                match diffs {
                    Diffs::Each(d) => scatter_mul_add(s, gids, d, &a.ints),
                    Diffs::All(d) => scatter_scaled_add(s, gids, &a.ints, *d),
                }
                return Ok(());
            }
            _ => {}
        }
    }
    let t = at.unwrap_or(DataType::Int64);
    if simple {
        if let State::MinMax { sets, .. } = state {
            // Numbers without NULLs or a filter: every row's value goes in,
            // its order key computed in a loop of its own.
            let n = gids.len();
            if dense(a, t.storage(), n).is_some_and(|s| s != Storage::Bytes) {
                let keys = ord_keys(a, t, n);
                for (i, (g, &k)) in gids.iter().zip(&keys).enumerate() {
                    if let Some(ms) = sets.get_mut(*g as usize) {
                        ms.add_int(k, diffs.get(i));
                    }
                }
                return Ok(());
            }
        }
    }
    let diffs = diffs.each(gids.len());
    let diffs: &[i64] = &diffs;
    let keep = |i: usize| -> bool {
        filter.is_none_or(|f| !f.is_null(i) && f.ints.get(i).copied().unwrap_or(0) != 0)
    };
    let valid = |i: usize| -> bool { arg.is_none_or(|a| !a.is_null(i)) };
    if let State::Sketch { kind, .. } = state {
        // Every input is checked before any is taken: a bad one fails the
        // flow with the state as it was.
        for i in 0..gids.len() {
            if keep(i) && valid(i) {
                check_sketch_input(*kind, get(a, t.storage(), i))?;
            }
        }
    }
    match state {
        State::Count(n) => {
            let v = n.own(rows);
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if keep(i) && valid(i) {
                    if let Some(x) = v.get_mut(*g as usize) {
                        *x = x.wrapping_add(*d);
                    }
                }
            }
        }
        State::SumInt { s, n } => {
            let n = n.own(rows);
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if !(keep(i) && valid(i)) {
                    continue;
                }
                let gi = *g as usize;
                if let (Some(sx), Some(nx)) = (s.get_mut(gi), n.get_mut(gi)) {
                    let v = a.ints.get(i).copied().unwrap_or(0);
                    *sx = sx.wrapping_add(v.wrapping_mul(*d));
                    *nx = nx.wrapping_add(*d);
                }
            }
        }
        State::AvgInt { s, n } => {
            let mut n = if simple {
                n.0.as_mut()
            } else {
                Some(n.own(rows))
            };
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if !(simple || keep(i) && valid(i)) {
                    continue;
                }
                let gi = *g as usize;
                if let Some(sx) = s.get_mut(gi) {
                    let v = a.ints.get(i).copied().unwrap_or(0);
                    let v = if t == DataType::UInt64 {
                        v as u64 as i128
                    } else {
                        v as i128
                    };
                    *sx = sx.wrapping_add(v.wrapping_mul(*d as i128));
                    if let Some(nx) = n.as_deref_mut().and_then(|n| n.get_mut(gi)) {
                        *nx = nx.wrapping_add(*d);
                    }
                }
            }
        }
        State::SumFloat { s, n } | State::AvgFloat { s, n } => {
            let mut n = if simple {
                n.0.as_mut()
            } else {
                Some(n.own(rows))
            };
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if !(simple || keep(i) && valid(i)) {
                    continue;
                }
                let gi = *g as usize;
                if let Some(sx) = s.get_mut(gi) {
                    let v = a.floats.get(i).copied().unwrap_or(0.0);
                    *sx += if *d == 1 { v } else { v * (*d as f64) };
                    if let Some(nx) = n.as_deref_mut().and_then(|n| n.get_mut(gi)) {
                        *nx = nx.wrapping_add(*d);
                    }
                }
            }
        }
        // Its measure's update keeps the multisets.
        State::Mirror { .. } => {}
        State::MinMax { sets, .. } | State::Sketch { sets, .. } | State::Stat { sets, .. } => {
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if !(keep(i) && valid(i)) {
                    continue;
                }
                if let Some(ms) = sets.get_mut(*g as usize) {
                    let v = get(a, t.storage(), i);
                    match v {
                        S::B(b) => {
                            ms.add_bytes(b, *d);
                        }
                        _ => {
                            if let Some(k) = ord_key(v, t) {
                                ms.add_int(k, *d);
                            }
                        }
                    }
                }
            }
        }
        State::Distinct { sets, n } => {
            for (i, (g, d)) in gids.iter().zip(diffs.iter()).enumerate() {
                if !(keep(i) && valid(i)) {
                    continue;
                }
                let gi = *g as usize;
                if let (Some(ms), Some(nx)) = (sets.get_mut(gi), n.get_mut(gi)) {
                    let v = get(a, t.storage(), i);
                    let (old, new) = match v {
                        S::B(b) => ms.add_bytes(b, *d),
                        _ => match ord_key(v, t) {
                            Some(k) => ms.add_int(k, *d),
                            None => (0, 0),
                        },
                    };
                    if old <= 0 && new > 0 {
                        *nx += 1;
                    } else if old > 0 && new <= 0 {
                        *nx -= 1;
                    }
                }
            }
        }
    }
    Ok(())
}

/// Checks that the expressions an aggregate evaluates are well-formed for its input.
/// Checks one input of a sketch function before it is taken: a merge's
/// state must decode, a uddsketch value must be a number.
fn check_sketch_input(kind: SketchKind, v: S<'_>) -> Result<(), FlowError> {
    use crate::sketch::{HllAcc, UddAcc};
    let bad = |f: &str, m: String| crate::types::bad(format!("{f}: {m}"));
    match (kind, v) {
        (SketchKind::HllMerge, S::B(b)) => HllAcc::new()
            .add_state(b, 1)
            .map_err(|m| bad("hll_merge", m)),
        (
            SketchKind::UddMerge {
                max_buckets,
                error_rate,
            },
            S::B(b),
        ) => UddAcc::new(max_buckets, error_rate)
            .and_then(|mut acc| acc.add_state(b, 1))
            .map_err(|m| bad("uddsketch_merge", m)),
        (SketchKind::Udd { .. }, S::F(f)) if f.is_nan() => Err(bad(
            "uddsketch_state",
            "NaN has no quantile; filter it out with WHERE NOT isnan(x)".into(),
        )),
        _ => Ok(()),
    }
}

/// `array_agg`'s list (see `StatKind::ArrayAgg`) of a group's ordered
/// pairs (see `Func::OrderedPair`: sort key in bytes 0..9, the value's null
/// flag in byte 9, then the value), encoded as the contract's `list`.
fn array_agg_value(
    set: &MultiSet,
    reverse: bool,
    distinct: bool,
    by_value: bool,
    nulls_first: bool,
    ty: DataType,
) -> Out {
    use crate::types::list::{push, Item};
    let live = set.bytes.iter().filter(|(_, c)| **c > 0);
    let pairs: Vec<(&Vec<u8>, &i64)> = if reverse {
        live.rev().collect()
    } else {
        live.collect()
    };
    if pairs.is_empty() {
        return Out::Null;
    }
    let mut out = Vec::new();
    let mut nulls = 0;
    for (pair, c) in pairs {
        let times = if distinct { 1 } else { *c };
        let item = match (pair.get(9), pair.get(10..)) {
            (Some(1), Some(v)) if ty.storage() == Storage::Bytes => Item::Bytes(v),
            (Some(1), Some(v)) => match <[u8; 8]>::try_from(v) {
                Ok(b) => match from_ord_key((u64::from_be_bytes(b) ^ (1 << 63)) as i64, ty) {
                    Out::F(f) => Item::Float(f),
                    Out::I(i) => Item::Int(i),
                    _ => Item::Null,
                },
                Err(_) => Item::Null,
            },
            _ if by_value => {
                nulls += times;
                continue;
            }
            _ => Item::Null,
        };
        for _ in 0..times {
            push(&mut out, item);
        }
    }
    if nulls > 0 {
        let mut n = vec![0u8; nulls as usize];
        if nulls_first {
            n.extend_from_slice(&out);
            out = n;
        } else {
            out.extend_from_slice(&n);
        }
    }
    Out::B(out)
}

/// Checks restored sketch inputs as [`check_sketch_input`] checks new ones.
fn check_sketch_inputs(kind: SketchKind, m: &MultiSet, t: DataType) -> Result<(), String> {
    for b in m.bytes.keys() {
        check_sketch_input(kind, S::B(b)).map_err(|e| e.to_string())?;
    }
    for k in m.ints.keys() {
        if let Out::F(f) = from_ord_key(*k, t) {
            check_sketch_input(kind, S::F(f)).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The sketch of a group's current inputs (`set`, values of type `t`):
/// what the function gives over those rows. `None` only if the inputs are
/// not what [`check_sketch_input`] lets in.
/// A statistic of a multiset of numbers or booleans, as DataFusion computes
/// it over the same values (variances by Welford's method, merged value by
/// value with its multiplicity, in ascending order; DataFusion's follows the
/// rows' order, so the last bits of a variance may differ).
fn stat_value(kind: StatKind, set: &MultiSet, t: DataType, param: &[u8]) -> Out {
    let values = || {
        set.ints
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(move |(k, c)| (from_ord_key(*k, t), *c))
    };
    if let StatKind::StringAgg { reverse } = kind {
        // The pairs' values (see `Func::OrderedPair`) in order; NULLs skipped.
        let live = set.bytes.iter().filter(|(_, c)| **c > 0);
        let pairs: Vec<(&Vec<u8>, &i64)> = if reverse {
            live.rev().collect()
        } else {
            live.collect()
        };
        let mut out: Option<Vec<u8>> = None;
        for (pair, c) in pairs {
            let (Some(1), Some(v)) = (pair.get(9), pair.get(10..)) else {
                continue;
            };
            for _ in 0..*c {
                match out.as_mut() {
                    Some(o) => {
                        o.extend_from_slice(param);
                        o.extend_from_slice(v);
                    }
                    None => out = Some(v.to_vec()),
                }
            }
        }
        return out.map_or(Out::Null, Out::B);
    }
    if let StatKind::ArrayAgg {
        reverse,
        distinct,
        by_value,
        nulls_first,
        ty,
    } = kind
    {
        return array_agg_value(set, reverse, distinct, by_value, nulls_first, ty);
    }
    if let StatKind::FirstValue { max, ty } = kind {
        // The end of the ordered pairs (see `Func::OrderedPair`): sort key in
        // bytes 0..9, the value's null flag in byte 9, then the value.
        let mut live = set.bytes.iter().filter(|(_, c)| **c > 0).map(|(k, _)| k);
        let end = if max { live.next_back() } else { live.next() };
        let Some(pair) = end else {
            return Out::Null;
        };
        return match (pair.get(9), pair.get(10..)) {
            (Some(1), Some(v)) if ty.storage() == Storage::Bytes => Out::B(v.to_vec()),
            (Some(1), Some(v)) => match <[u8; 8]>::try_from(v) {
                Ok(b) => from_ord_key((u64::from_be_bytes(b) ^ (1 << 63)) as i64, ty),
                Err(_) => Out::Null,
            },
            _ => Out::Null,
        };
    }
    let n: i64 = values().map(|(_, c)| c).sum();
    if n == 0 {
        return Out::Null;
    }
    let float = |v: &Out| match v {
        Out::F(f) => *f,
        Out::I(x) if t.is_unsigned_int() => *x as u64 as f64,
        Out::I(x) => *x as f64,
        _ => 0.0,
    };
    match kind {
        StatKind::FirstValue { .. } | StatKind::StringAgg { .. } | StatKind::ArrayAgg { .. } => {
            Out::Null
        }
        StatKind::BoolAnd => Out::I(values().all(|(v, _)| v != Out::I(0)) as i64),
        StatKind::BoolOr => Out::I(values().any(|(v, _)| v != Out::I(0)) as i64),
        StatKind::Median => {
            // The value at rank r (0-based), counting multiplicities.
            let at = |r: i64| {
                let mut seen = 0;
                for (v, c) in values() {
                    seen += c;
                    if r < seen {
                        return v;
                    }
                }
                Out::Null
            };
            if n % 2 == 1 {
                return at(n / 2);
            }
            let half = |a: i128, b: i128| (a + b) / 2;
            match (at(n / 2 - 1), at(n / 2)) {
                (Out::F(a), Out::F(b)) => Out::F((a + b) / 2.0),
                (Out::I(a), Out::I(b)) if t.is_unsigned_int() => {
                    Out::I(half(a as u64 as i128, b as u64 as i128) as u64 as i64)
                }
                (Out::I(a), Out::I(b)) => Out::I(half(a as i128, b as i128) as i64),
                _ => Out::Null,
            }
        }
        StatKind::VarSamp | StatKind::VarPop | StatKind::StddevSamp | StatKind::StddevPop => {
            let (mut count, mut mean, mut m2) = (0f64, 0f64, 0f64);
            for (v, c) in values() {
                let (x, c) = (float(&v), c as f64);
                let total = count + c;
                let delta = x - mean;
                mean += delta * c / total;
                m2 += delta * delta * count * c / total;
                count = total;
            }
            let var = match kind {
                StatKind::VarPop | StatKind::StddevPop => m2 / count,
                _ if count > 1.0 => m2 / (count - 1.0),
                _ => return Out::Null,
            };
            Out::F(match kind {
                StatKind::StddevSamp | StatKind::StddevPop => var.sqrt(),
                _ => var,
            })
        }
    }
}

fn sketch_state(kind: SketchKind, set: &MultiSet, t: DataType) -> Option<Vec<u8>> {
    use crate::sketch::{self, HllAcc, UddAcc};
    let values = || {
        set.ints
            .iter()
            .filter(|(_, c)| **c > 0)
            .map(move |(k, c)| (from_ord_key(*k, t), *c))
    };
    match kind {
        SketchKind::Hll => {
            let mut acc = HllAcc::new();
            for (v, c) in values() {
                let h = match v {
                    Out::F(f) => sketch::hll_hash_f64(f),
                    Out::I(x) if t == DataType::Boolean => sketch::hll_hash_bool(x != 0),
                    Out::I(x) if t.is_unsigned_int() => sketch::hll_hash_u64(x as u64),
                    Out::I(x) => sketch::hll_hash_i64(x),
                    _ => continue,
                };
                acc.add_hash(h, c);
            }
            for (b, c) in set.bytes.iter().filter(|(_, c)| **c > 0) {
                acc.add_bytes(b, *c);
            }
            Some(acc.state())
        }
        SketchKind::HllMerge => {
            let mut acc = HllAcc::new();
            for (b, c) in set.bytes.iter().filter(|(_, c)| **c > 0) {
                acc.add_state(b, *c).ok()?;
            }
            Some(acc.state())
        }
        SketchKind::Udd {
            max_buckets,
            error_rate,
        } => {
            let mut acc = UddAcc::new(max_buckets, error_rate).ok()?;
            for (v, c) in values() {
                let x = match v {
                    Out::F(f) => f,
                    Out::I(x) if t.is_unsigned_int() => x as u64 as f64,
                    Out::I(x) => x as f64,
                    _ => continue,
                };
                acc.add_value(x, c).ok()?;
            }
            acc.state().ok()
        }
        SketchKind::UddMerge {
            max_buckets,
            error_rate,
        } => {
            let mut acc = UddAcc::new(max_buckets, error_rate).ok()?;
            for (b, c) in set.bytes.iter().filter(|(_, c)| **c > 0) {
                acc.add_state(b, *c).ok()?;
            }
            acc.state().ok()
        }
    }
}

pub(crate) fn validate(spec: &AggSpec) -> Result<(), FlowError> {
    let all: Vec<&Expr> = spec
        .keys
        .iter()
        .chain(spec.measures.iter().filter_map(|m| m.arg.as_ref()))
        .collect();
    if all.len() > 10_000 {
        return Err(internal("too many aggregate expressions"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int_counts_hold_what_a_btree_holds_in_each_of_their_forms() {
        // A fixed pseudo-random walk of adds and removes over 0..80 values.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut counts, mut tree) = (IntCounts::default(), BTreeMap::<i64, i64>::new());
        let (mut was_once, mut was_small, mut was_tree) = (false, false, false);
        for step in 0..20_000 {
            // The first steps add distinct values only (the values-alone
            // form), then any of 0..80.
            let k = match step {
                0..8 => step * 3,
                _ => (next() % 80) as i64 - 40,
            };
            // Mostly adds at first, mostly removals later.
            let d = if step < 8 || (next() % 100) < (if step < 10_000 { 80 } else { 30 }) {
                1
            } else {
                -1
            };
            let e = tree.entry(k).or_insert(0);
            let old = *e;
            *e += d;
            if *e == 0 {
                tree.remove(&k);
            }
            assert_eq!(counts.add(k, d), (old, old + d), "step {step}");
            was_once |= matches!(&counts, IntCounts::Once(v) if v.len() > 1);
            was_small |= matches!(counts, IntCounts::Small(_));
            was_tree |= matches!(counts, IntCounts::Tree(_));
            assert_eq!(counts.len(), tree.len());
            if step % 97 == 0 {
                assert!(counts.iter().eq(tree.iter()), "step {step}");
                assert!(counts.iter().rev().eq(tree.iter().rev()), "step {step}");
            }
        }
        assert!(was_once && was_small, "the walk repeated a value");
        assert!(was_tree, "the walk went past the vector's size");
        // The values-alone form: removing a value, asking after one, adding
        // none, and a removal of a value not there (a count of -1).
        let mut once = IntCounts::default();
        for k in [6, 0, 3] {
            assert_eq!(once.add(k, 1), (0, 1));
        }
        assert_eq!(once.add(3, -1), (1, 0));
        assert_eq!((once.add(0, 0), once.add(1, 0)), ((1, 1), (0, 0)));
        assert!(
            matches!(&once, IntCounts::Once(v) if v == &[0, 6]),
            "{once:?}"
        );
        assert_eq!(once.add(5, -1), (0, -1));
        let held: Vec<(i64, i64)> = once.iter().map(|(k, c)| (*k, *c)).collect();
        assert_eq!(held, [(0, 1), (5, -1), (6, 1)]);
        let mut small = IntCounts::default();
        small.add(3, 1);
        let mut big = IntCounts::Tree(BTreeMap::from([(3, 1)]));
        assert_eq!(small, big, "equal contents are equal in either form");
        big.add(3, -1);
        assert!(big.is_empty());
    }

    #[test]
    fn key_tables_find_every_live_key_through_removals_reuse_and_compaction() {
        let key = |i: u32| format!("key-{i}-{}", "x".repeat((i % 7) as usize)).into_bytes();
        let mut t = KeyTable::default();
        for g in 0..5000 {
            assert_eq!(t.get(&key(g)), None);
            t.insert(&key(g), g);
        }
        // Remove three in four: the arena compacts on the way.
        let before = t.bytes.len();
        for g in (0..5000).filter(|g| g % 4 != 0) {
            t.remove(g);
        }
        assert!(
            t.bytes.len() < before / 2,
            "compacted: {} of {before}",
            t.bytes.len()
        );
        // Removed ids come back with new keys.
        for g in (0..5000).filter(|g| g % 4 == 1) {
            t.insert(&key(g + 10_000), g);
        }
        for g in 0..5000u32 {
            let live = match g % 4 {
                0 => Some(key(g)),
                1 => Some(key(g + 10_000)),
                _ => None,
            };
            assert_eq!(t.key(g as usize), live.as_deref().unwrap_or_default());
            if let Some(k) = &live {
                assert_eq!(t.get(k), Some(g), "{g}");
            }
            if g % 4 != 0 {
                assert_eq!(t.get(&key(g)), None, "{g} was removed");
            }
        }
    }

    #[test]
    fn encoded_rows_are_what_encode_row_writes() {
        let rows = 7;
        let ints = |nulls: bool| Column {
            ints: (0..rows as i64).map(|i| i * 1000 - 3).collect(),
            nulls: if nulls {
                vec![0, 1, 0, 0, 1, 0, 0]
            } else {
                vec![]
            },
            ..Column::default()
        };
        let floats = |nulls: bool| Column {
            floats: vec![1.5, -0.0, f64::NAN, 0.0, f64::INFINITY, -2.25, 1e300],
            nulls: if nulls {
                vec![1, 0, 0, 0, 0, 0, 1]
            } else {
                vec![]
            },
            ..Column::default()
        };
        let strings = |nulls: bool| {
            let mut c = Column {
                offsets: vec![0],
                nulls: if nulls {
                    vec![0, 0, 1, 0, 0, 0, 0]
                } else {
                    vec![]
                },
                ..Column::default()
            };
            for s in ["", "a", "host-1", "é", "", "xyz", "long string value"] {
                c.bytes.extend_from_slice(s.as_bytes());
                c.offsets.push(c.bytes.len() as u32);
            }
            c
        };
        for nulls in [false, true] {
            for (cols, types) in [
                (vec![ints(nulls)], vec![DataType::Int64]),
                (
                    vec![ints(nulls), floats(nulls)],
                    vec![DataType::Int64, DataType::Float64],
                ),
                (vec![strings(nulls)], vec![DataType::Utf8]),
                (
                    vec![strings(nulls), ints(nulls), floats(!nulls), strings(!nulls)],
                    vec![
                        DataType::Utf8,
                        DataType::Int64,
                        DataType::Float64,
                        DataType::Binary,
                    ],
                ),
            ] {
                let cols: Vec<Cow<'_, Column>> = cols.into_iter().map(Cow::Owned).collect();
                let enc = Encoded::new(&cols, &types, rows);
                for i in 0..rows {
                    let mut want = Vec::new();
                    encode_row(&mut want, &cols, &types, i);
                    assert_eq!(
                        enc.row(i),
                        want.as_slice(),
                        "row {i} of {types:?}, nulls {nulls}"
                    );
                }
            }
        }
    }

    /// A string column of `names`.
    fn strings<'a>(names: impl IntoIterator<Item = &'a str>) -> Column {
        let mut c = Column {
            offsets: vec![0],
            ..Column::default()
        };
        for k in names {
            c.bytes.extend_from_slice(k.as_bytes());
            c.offsets.push(c.bytes.len() as u32);
        }
        c
    }

    /// `count(*)` grouped by `keys`.
    fn count_star(keys: Vec<Expr>) -> AggOp {
        let key_nullable = vec![false; keys.len()];
        AggOp::new(
            AggSpec {
                keys,
                key_nullable,
                measures: vec![MeasureSpec {
                    kind: AggKind::CountStar,
                    arg: None,
                    filter: None,
                    out: DataType::Int64,
                    param: Vec::new(),
                }],
            },
            None,
        )
    }

    #[test]
    fn rows_of_a_two_column_key_find_their_group_in_runs_or_apart() -> Result<(), FlowError> {
        // Keys (name, n): runs, a key that comes back after another, and a
        // key that differs from the row before in its second column only.
        let keys = [
            ("a", 1),
            ("a", 1),
            ("b", 1),
            ("a", 1),
            ("a", 2),
            ("a", 2),
            ("b", 1),
        ];
        let chunk = Chunk {
            rows: keys.len(),
            cols: vec![
                strings(keys.iter().map(|&(k, _)| k)),
                Column {
                    ints: keys.iter().map(|&(_, n)| n).collect(),
                    ..Column::default()
                },
            ],
            diffs: Diffs::All(1),
        };
        let mut op = count_star(vec![
            Expr::Col(0, DataType::Utf8),
            Expr::Col(1, DataType::Int64),
        ]);
        // Twice: the second chunk finds the groups the first one made.
        for round in 1..=2 {
            op.absorb(&chunk, 0)?;
            let g = op.gids.clone();
            assert_eq!([g[1], g[3]], [g[0], g[0]], "round {round}: {g:?}");
            assert_eq!([g[5], g[6]], [g[4], g[2]], "round {round}: {g:?}");
            assert!(g[0] != g[2] && g[0] != g[4] && g[2] != g[4], "{g:?}");
            let out = op.flush();
            let diffs = match &out.diffs {
                Diffs::Each(d) => d.clone(),
                Diffs::All(d) => vec![*d; out.rows],
            };
            let mut got: Vec<(i64, i64, i64)> = (0..out.rows)
                .map(|r| (out.cols[1].ints[r], out.cols[2].ints[r], diffs[r]))
                .collect();
            got.sort();
            let counts = |n: i64, d: i64| vec![(1, 2 * n, d), (1, 3 * n, d), (2, 2 * n, d)];
            let mut want = counts(round, 1);
            if round == 2 {
                // The first round's counts, retracted.
                want.extend(counts(1, -1));
                want.sort();
            }
            assert_eq!(got, want, "round {round}");
        }
        Ok(())
    }

    #[test]
    fn short_copies_and_compares_see_every_byte() {
        let src: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(29) ^ 0x5a).collect();
        for n in 0..=40 {
            let s = &src[..n];
            // The bytes after the copy stay as they were.
            let mut dst = vec![0xAAu8; n + 3];
            copy_short(&mut dst, s);
            assert_eq!(&dst[..n], s, "length {n}");
            assert!(dst[n..].iter().all(|b| *b == 0xAA), "length {n}");
            // Keys that differ in any one byte differ.
            assert!(same_bytes(s, &dst[..n]));
            for i in 0..n {
                let mut other = s.to_vec();
                other[i] ^= 1;
                assert!(!same_bytes(s, &other), "length {n}, byte {i}");
            }
            assert!(n == 0 || !same_bytes(s, &s[..n - 1]));
        }
    }

    #[test]
    fn a_group_id_given_to_another_key_is_not_found_for_the_removed_one() -> Result<(), FlowError> {
        // One string key, count(*). Chunks of (key, diff), each ticked.
        let chunk = |rows: &[(&str, i64)]| Chunk {
            rows: rows.len(),
            cols: vec![strings(rows.iter().map(|&(k, _)| k))],
            diffs: Diffs::Each(rows.iter().map(|&(_, d)| d).collect()),
        };
        let mut op = count_star(vec![Expr::Col(0, DataType::Utf8)]);
        // Each row's group, and the tick's output as (key, count, diff).
        type Ticked = (Vec<u32>, Vec<(String, i64, i64)>);
        let mut tick = |rows: &[(&str, i64)]| -> Result<Ticked, FlowError> {
            op.absorb(&chunk(rows), 0)?;
            let gids = op.gids.clone();
            let out = op.flush();
            let diffs = match &out.diffs {
                Diffs::Each(d) => d.clone(),
                Diffs::All(d) => vec![*d; out.rows],
            };
            let mut got: Vec<(String, i64, i64)> = (0..out.rows)
                .map(|r| {
                    let name = out.cols[0].bytes_at(r);
                    (
                        String::from_utf8_lossy(name).into_owned(),
                        out.cols[1].ints[r],
                        diffs[r],
                    )
                })
                .collect();
            got.sort();
            Ok((gids, got))
        };
        let (first, _) = tick(&[("a", 1), ("b", 1)])?;
        // "a" loses its only row: its group goes at the tick, and "c" gets its id.
        tick(&[("a", -1)])?;
        let (third, _) = tick(&[("c", 1)])?;
        assert_eq!(third[0], first[0], "the removed group's id is reused");
        // "a" again: a group of its own, not the one "c" now has.
        let (fourth, got) = tick(&[("a", 1), ("c", 1)])?;
        assert_ne!(fourth[0], fourth[1], "{fourth:?}");
        let want = vec![
            ("a".to_string(), 1, 1),
            ("c".to_string(), 1, -1),
            ("c".to_string(), 2, 1),
        ];
        assert_eq!(got, want);
        Ok(())
    }

    fn key(cols: &[Column], types: &[DataType]) -> Vec<u8> {
        let cows: Vec<Cow<'_, Column>> = cols.iter().map(Cow::Borrowed).collect();
        let mut buf = Vec::new();
        encode_row(&mut buf, &cows, types, 0);
        buf
    }

    #[test]
    fn restored_keys_are_values_of_their_types() {
        let types = [DataType::Int8, DataType::Utf8, DataType::Float64];
        let cols = [
            Column {
                ints: vec![-5],
                ..Column::default()
            },
            Column {
                bytes: b"ok".to_vec(),
                offsets: vec![0, 2],
                ..Column::default()
            },
            Column {
                floats: vec![-0.0],
                nulls: vec![1],
                ..Column::default()
            },
        ];
        let good = key(&cols, &types);
        assert_eq!(check_key(&good, &types, &[false, false, true]), Ok(()));
        let err = |b: &[u8], nullable: [bool; 3]| check_key(b, &types, &nullable).unwrap_err();
        assert!(err(&good, [false, false, false]).contains("NULL but cannot be"));
        let mut b = good.clone();
        b[1..9].copy_from_slice(&1000i64.to_le_bytes());
        assert!(err(&b, [false, false, true]).contains("out of range for Int8"));
        let mut b = good.clone();
        b[14] = 0xff;
        assert!(err(&b, [false, false, true]).contains("not valid UTF-8"));
        let mut b = good.clone();
        b.push(0);
        assert!(err(&b, [false, false, true]).contains("trailing"));
        assert!(err(&good[..good.len() - 3], [false, false, true]).contains("truncated"));
        let mut b = good.clone();
        let last = b.len() - 1;
        b[last] = 1;
        b.extend_from_slice(&(-0.0f64).to_bits().to_le_bytes());
        assert!(err(&b, [false, false, true]).contains("non-canonical"));
    }

    #[test]
    fn restored_multisets_hold_values_of_their_types() {
        let mut m = MultiSet::default();
        m.add_int(ord_key(S::I(-5), DataType::Int8).unwrap(), 2);
        assert_eq!(m.check(DataType::Int8), Ok(()));
        assert!(m.check(DataType::Utf8).unwrap_err().contains("numbers"));
        m.ints.insert(300, 1);
        assert!(m
            .check(DataType::Int8)
            .unwrap_err()
            .contains("out of range"));
        let mut m = MultiSet::default();
        m.ints
            .insert(ord_key(S::I(1), DataType::Boolean).unwrap(), 0);
        assert!(m.check(DataType::Boolean).unwrap_err().contains("0 times"));
        let mut m = MultiSet::default();
        m.add_bytes(b"ok", 1);
        assert_eq!(m.check(DataType::Utf8), Ok(()));
        assert!(m.check(DataType::Int64).unwrap_err().contains("bytes"));
        m.add_bytes(&[0xfa, b'e'], 1);
        assert!(m.check(DataType::Utf8).unwrap_err().contains("UTF-8"));
        assert_eq!(m.check(DataType::Binary), Ok(()));
        let mut m = MultiSet::default();
        m.add_int(ord_key(S::F(-0.0), DataType::Float64).unwrap(), 1);
        assert_eq!(m.check(DataType::Float64), Ok(()));
        let neg_zero = (-0.0f64).to_bits();
        let raw = ((!neg_zero) ^ (1 << 63)) as i64;
        m.ints.insert(raw, 1);
        assert!(m
            .check(DataType::Float64)
            .unwrap_err()
            .contains("non-canonical"));
    }

    #[test]
    fn multisets_are_written_in_their_shape_and_read_back_as_they_were() -> Result<(), FlowError> {
        use crate::codec::{Reader, Writer};
        let written = |m: &MultiSet| {
            let mut w = Writer::default();
            m.write(&mut w);
            let mut counted = Writer::counting();
            m.write(&mut counted);
            assert_eq!(counted.len(), w.buf.len(), "counted as written");
            w.buf
        };
        let shape = |b: &[u8]| u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
        // Values alone: each once, written without multiplicities.
        let mut once = MultiSet::default();
        for k in [7, -3, 12] {
            once.add_int(k, 1);
        }
        assert!(matches!(once.ints, IntCounts::Once(_)));
        // Pairs, each once again (a value added twice, then removed once).
        let mut pairs_once = once.clone();
        pairs_once.add_int(7, 1);
        pairs_once.add_int(7, -1);
        assert!(matches!(pairs_once.ints, IntCounts::Small(_)));
        // Pairs with a value twice; the tree, with byte strings besides.
        let mut twice = once.clone();
        twice.add_int(-3, 1);
        let mut tree = MultiSet::default();
        for k in 0..(SMALL_SET as i64 + 5) {
            tree.add_int(k * 11 - 100, 1 + k % 2);
        }
        tree.add_bytes(b"x", 2);
        assert!(matches!(tree.ints, IntCounts::Tree(_)));
        for (m, once_bit, len) in [
            (&once, 1, 8 + 3 * 8),
            (&pairs_once, 1, 8 + 3 * 8),
            (&twice, 0, 8 + 3 * 16),
            (&tree, 0, 8 + 37 * 16 + 8 + 8 + 1 + 8),
        ] {
            let bytes = written(m);
            assert_eq!(bytes.len(), len, "{m:?}");
            assert_eq!(shape(&bytes) & 1, once_bit, "{m:?}");
            assert_eq!(shape(&bytes) >> 2, m.ints.len() as u64);
            let mut r = Reader::new(&bytes);
            let back = MultiSet::read(&mut r, 4)?;
            assert_eq!(&back, m);
            let values: Vec<(i64, i64)> = back.ints.iter().map(|(k, c)| (*k, *c)).collect();
            let expected: Vec<(i64, i64)> = m.ints.iter().map(|(k, c)| (*k, *c)).collect();
            assert_eq!(values, expected);
        }
        Ok(())
    }
}
