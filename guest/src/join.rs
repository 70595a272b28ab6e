//! Incremental equi-joins over arrangements.
//!
//! An [`Arrangement`] is one input's rows indexed by join key: each distinct row once, with
//! its multiplicity (the sum of its diffs so far). It is the join's state for that input.
//!
//! **The rule of its times.** Every change of a tick carries the tick's time, and a tick's
//! changes are applied before the next tick starts, so an arrangement holds exactly one
//! version: the sum of all changes applied so far. No reader may look at an older or a newer
//! time, and none needs to: within a tick the join applies its left input's changes first,
//! probing the right arrangement as of the previous tick, then its right input's changes,
//! probing the left arrangement that already holds this tick's left changes. That is
//! `Δ(L ⋈ R) = ΔL ⋈ R + (L + ΔL) ⋈ ΔR`, exact whatever the order of rows inside a tick.
//!
//! **Outer, semi and anti joins** keep, for every stored row of a side whose unmatched (or
//! matched) rows are emitted, how many rows of the other side it matches (`matches`: the sum
//! of their multiplicities for which the residual condition holds). The padded row of an
//! unmatched left row is in the output exactly `mult` times while `matches` is 0; a change of
//! the other side that moves `matches` to or from 0 emits or retracts it. Rows whose key holds
//! a NULL (compared with `=`) never match and are not stored: their padded form is emitted
//! with their own diff.
//!
//! **Bounded state.** A join of windows (a key is a time, e.g. `ON date_bin(..., a.ts) =
//! date_bin(..., b.ts)`) under `EXPIRE AFTER d` drops the rows of every key whose time is
//! older than the tick time minus `d`, and ignores changes that arrive for such keys, as
//! aggregates do with their windows: no later change can reach them, and what they produced
//! stays in the sink.

use std::borrow::Cow;

use std::collections::BTreeMap;

use crate::agg::{check_key, decode_key, encode_row, to_ms, Out};
use crate::codec::{Reader, Writer};
use crate::column::{broadcast, take_chunk, Chunk, ColBuilder, Diffs, S};
use crate::expr::Expr;
use crate::hash::FxHashMap;
use crate::plan::{JoinKind, JoinSpec};
use crate::types::{bad, internal, Column, DataType, FlowError, Storage};

/// One stored row.
#[derive(Debug, Clone)]
struct Slot {
    row: Vec<u8>,
    /// The row's hash, and the next slot whose row has the same hash.
    hash: u64,
    next: u32,
    key: u32,
    /// Index of this slot in its key's list.
    pos: u32,
    mult: i64,
    matches: i64,
}

/// One side's rows by join key. See the module's documentation for its rule.
#[derive(Debug, Clone, Default)]
pub(crate) struct Arrangement {
    /// Row hash → the first slot of the rows with that hash (chained by
    /// `Slot::next`): each row's bytes are kept once, in its slot.
    by_row: FxHashMap<u64, u32>,
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    by_key: FxHashMap<Vec<u8>, u32>,
    /// Per key id: its encoding and its slots.
    keys: Vec<(Vec<u8>, Vec<u32>)>,
    key_free: Vec<u32>,
    bytes: usize,
    /// With a time key under EXPIRE AFTER: each key's time (ms) → the keys created with it.
    by_time: BTreeMap<i64, Vec<Vec<u8>>>,
}

impl Arrangement {
    fn key_slots(&self, key: &[u8]) -> &[u32] {
        match self.by_key.get(key) {
            Some(&k) => self.keys.get(k as usize).map_or(&[], |(_, s)| s.as_slice()),
            None => &[],
        }
    }

    fn slot(&self, s: u32) -> Option<&Slot> {
        self.slots.get(s as usize).and_then(|x| x.as_ref())
    }

    fn slot_mut(&mut self, s: u32) -> Option<&mut Slot> {
        self.slots.get_mut(s as usize).and_then(|x| x.as_mut())
    }

    /// The slot holding `row`, whose hash is `hash`.
    fn find(&self, row: &[u8], hash: u64) -> Option<u32> {
        let mut s = *self.by_row.get(&hash)?;
        while s != NONE {
            let slot = self.slot(s)?;
            if slot.row == row {
                return Some(s);
            }
            s = slot.next;
        }
        None
    }

    /// Adds `diff` copies of `row` (whose key is `key`); a new row starts with `matches`.
    fn update(&mut self, row: &[u8], key: &[u8], diff: i64, matches: i64) {
        let hash = row_hash(row);
        if let Some(s) = self.find(row, hash) {
            let gone = match self.slot_mut(s) {
                Some(slot) => {
                    slot.mult = slot.mult.wrapping_add(diff);
                    slot.mult == 0
                }
                None => false,
            };
            if gone {
                self.remove(s);
            }
            return;
        }
        if diff == 0 {
            return;
        }
        let k = match self.by_key.get(key) {
            Some(&k) => k,
            None => {
                let k = match self.key_free.pop() {
                    Some(k) => {
                        if let Some(e) = self.keys.get_mut(k as usize) {
                            *e = (key.to_vec(), Vec::new());
                        }
                        k
                    }
                    None => {
                        self.keys.push((key.to_vec(), Vec::new()));
                        (self.keys.len() - 1) as u32
                    }
                };
                self.by_key.insert(key.to_vec(), k);
                self.bytes += 2 * key.len() + 48;
                k
            }
        };
        let list = match self.keys.get_mut(k as usize) {
            Some((_, l)) => l,
            None => return,
        };
        let next = self.by_row.get(&hash).copied().unwrap_or(NONE);
        let slot = Slot {
            row: row.to_vec(),
            hash,
            next,
            key: k,
            pos: list.len() as u32,
            mult: diff,
            matches,
        };
        let s = match self.free.pop() {
            Some(s) => {
                if let Some(x) = self.slots.get_mut(s as usize) {
                    *x = Some(slot);
                }
                s
            }
            None => {
                self.slots.push(Some(slot));
                (self.slots.len() - 1) as u32
            }
        };
        list.push(s);
        self.by_row.insert(hash, s);
        self.bytes += row.len() + 80;
    }

    /// Drops every row of the keys whose time is before `threshold`.
    fn expire(&mut self, threshold: i64) {
        while let Some(entry) = self.by_time.first_entry() {
            if *entry.key() >= threshold {
                break;
            }
            for key in entry.remove() {
                let Some(&k) = self.by_key.get(&key) else {
                    continue;
                };
                let slots = self
                    .keys
                    .get(k as usize)
                    .map(|(_, l)| l.clone())
                    .unwrap_or_default();
                for s in slots {
                    self.remove(s);
                }
            }
        }
    }

    fn remove(&mut self, s: u32) {
        let Some(slot) = self.slots.get_mut(s as usize).and_then(|x| x.take()) else {
            return;
        };
        self.free.push(s);
        // Unlink it from its hash chain.
        if self.by_row.get(&slot.hash) == Some(&s) {
            if slot.next == NONE {
                self.by_row.remove(&slot.hash);
            } else {
                self.by_row.insert(slot.hash, slot.next);
            }
        } else {
            let mut at = self.by_row.get(&slot.hash).copied().unwrap_or(NONE);
            while at != NONE {
                let Some(Some(prev)) = self.slots.get_mut(at as usize) else {
                    break;
                };
                if prev.next == s {
                    prev.next = slot.next;
                    break;
                }
                at = prev.next;
            }
        }
        self.bytes = self.bytes.saturating_sub(slot.row.len() + 80);
        let Some((key, list)) = self.keys.get_mut(slot.key as usize) else {
            return;
        };
        let pos = slot.pos as usize;
        if pos < list.len() {
            list.swap_remove(pos);
            if let Some(&moved) = list.get(pos) {
                if let Some(Some(m)) = self.slots.get_mut(moved as usize) {
                    m.pos = pos as u32;
                }
            }
        }
        if list.is_empty() {
            let key = std::mem::take(key);
            self.bytes = self.bytes.saturating_sub(2 * key.len() + 48);
            self.by_key.remove(&key);
            self.key_free.push(slot.key);
        }
    }

    fn live(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().flatten()
    }

    /// Writes the rows key by key, each key's rows in their order, so that a restored
    /// arrangement lists them as this one does (and a join emits in the same order).
    fn write(&self, w: &mut Writer) {
        w.u64(self.live().count() as u64);
        for (key, list) in &self.keys {
            for s in list.iter().filter_map(|s| self.slot(*s)) {
                w.bytes(&s.row);
                w.bytes(key);
                w.i64(s.mult);
                w.i64(s.matches);
            }
        }
    }

    fn read(
        r: &mut Reader<'_>,
        types: &[DataType],
        key_types: &[DataType],
    ) -> Result<Self, FlowError> {
        let corrupt = |m: String| bad(format!("snapshot: join state: {m}"));
        let n = r.len(8 + 8 + 16)?;
        let mut a = Arrangement::default();
        let all_nullable = vec![true; types.len().max(key_types.len())];
        for _ in 0..n {
            let row = r.bytes()?;
            let key = r.bytes()?;
            let mult = r.i64()?;
            let matches = r.i64()?;
            check_key(row, types, &all_nullable).map_err(corrupt)?;
            check_key(key, key_types, &all_nullable).map_err(corrupt)?;
            if mult == 0 || a.find(row, row_hash(row)).is_some() {
                return Err(corrupt("a row is stored twice or with no copies".into()));
            }
            a.update(row, key, mult, matches);
        }
        Ok(a)
    }
}

/// No slot.
const NONE: u32 = u32::MAX;

/// The hash of an encoded row (fixed: no seed).
fn row_hash(row: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    crate::hash::FxBuild::default().hash_one(row)
}

/// Pushes the values of an encoded row (as [`encode_row`] writes them) to `out`.
pub(crate) fn decode_into(mut b: &[u8], types: &[DataType], out: &mut [ColBuilder]) {
    for (t, o) in types.iter().zip(out.iter_mut()) {
        let Some((&tag, rest)) = b.split_first() else {
            o.push_null();
            continue;
        };
        b = rest;
        if tag == 0 {
            o.push_null();
            continue;
        }
        match t.storage() {
            Storage::Ints | Storage::Floats => {
                let Some((x, rest)) = b.split_first_chunk::<8>() else {
                    o.push_null();
                    continue;
                };
                b = rest;
                let x = i64::from_le_bytes(*x);
                o.push(if t.storage() == Storage::Ints {
                    S::I(x)
                } else {
                    S::F(f64::from_bits(x as u64))
                });
            }
            Storage::Bytes => {
                let Some((l, rest)) = b.split_first_chunk::<4>() else {
                    o.push_null();
                    continue;
                };
                let l = u32::from_le_bytes(*l) as usize;
                let v = rest.get(..l).unwrap_or(&[]);
                b = rest.get(l..).unwrap_or(&[]);
                o.push(S::B(v));
            }
        }
    }
}

/// What a side emits besides joined pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Nothing,
    /// Its rows that match nothing (outer joins, padded with NULLs; anti joins, not).
    Unmatched {
        pad: bool,
    },
    /// Its rows that match something, once per copy (semi joins).
    Matched,
}

impl Mode {
    /// Whether a row that matches `m` rows of the other side is emitted.
    fn emits(self, m: i64) -> bool {
        match self {
            Mode::Nothing => false,
            Mode::Unmatched { .. } => m == 0,
            Mode::Matched => m != 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Left,
    Right,
}

/// A join of two stages' outputs.
pub(crate) struct JoinOp {
    kind: JoinKind,
    keys: [Vec<Expr>; 2],
    null_eq: Vec<bool>,
    residual: Option<Expr>,
    types: [Vec<DataType>; 2],
    key_types: Vec<DataType>,
    out_types: Vec<DataType>,
    state: [Arrangement; 2],
    /// EXPIRE AFTER (ms) and the join key that is a time, with its type.
    expire: Option<(i64, usize, DataType)>,
}

impl JoinOp {
    pub fn new(
        spec: JoinSpec,
        left: Vec<DataType>,
        right: Vec<DataType>,
        expire_ms: Option<i64>,
    ) -> Result<JoinOp, FlowError> {
        let JoinSpec {
            kind,
            left_keys,
            right_keys,
            null_eq,
            residual,
            ..
        } = spec;
        if left_keys.len() != right_keys.len() || left_keys.len() != null_eq.len() {
            return Err(internal("join keys do not pair up"));
        }
        let key_types: Vec<DataType> = left_keys.iter().map(|e| e.ty()).collect();
        let both: Vec<DataType> = left.iter().chain(right.iter()).copied().collect();
        let out_types = match kind {
            JoinKind::LeftSemi | JoinKind::LeftAnti => left.clone(),
            JoinKind::RightSemi | JoinKind::RightAnti => right.clone(),
            _ => both,
        };
        let expire = expire_ms.and_then(|e| {
            let k = key_types.iter().position(|t| t.is_timestamp())?;
            Some((e, k, *key_types.get(k)?))
        });
        Ok(JoinOp {
            expire,
            kind,
            keys: [left_keys, right_keys],
            null_eq,
            residual,
            types: [left, right],
            key_types,
            out_types,
            state: [Arrangement::default(), Arrangement::default()],
        })
    }

    pub fn out_types(&self) -> &[DataType] {
        &self.out_types
    }

    fn pairs(&self) -> bool {
        matches!(
            self.kind,
            JoinKind::Inner | JoinKind::Left | JoinKind::Right | JoinKind::Full
        )
    }

    fn mode(&self, side: Side) -> Mode {
        match (self.kind, side) {
            (JoinKind::Left | JoinKind::Full, Side::Left)
            | (JoinKind::Right | JoinKind::Full, Side::Right) => Mode::Unmatched { pad: true },
            (JoinKind::LeftAnti, Side::Left) | (JoinKind::RightAnti, Side::Right) => {
                Mode::Unmatched { pad: false }
            }
            (JoinKind::LeftSemi, Side::Left) | (JoinKind::RightSemi, Side::Right) => Mode::Matched,
            _ => Mode::Nothing,
        }
    }

    /// Applies this tick's changes of both inputs (left first) and returns the join's changes.
    pub fn step(
        &mut self,
        left: Vec<Chunk>,
        right: Vec<Chunk>,
        now: i64,
    ) -> Result<Vec<Chunk>, FlowError> {
        let threshold = self.expire.map(|(e, _, _)| now.saturating_sub(e));
        if let Some(th) = threshold {
            for a in &mut self.state {
                a.expire(th);
            }
        }
        let mut out = Vec::new();
        for c in left {
            self.apply(Side::Left, &c, threshold, &mut out)?;
        }
        for c in right {
            self.apply(Side::Right, &c, threshold, &mut out)?;
        }
        Ok(out)
    }

    /// Rows of one side with the other side's columns NULL (`pad`), or alone.
    fn side_rows(&self, side: Side, mut c: Chunk, pad: bool) -> Chunk {
        if !pad {
            return c;
        }
        let other = match side {
            Side::Left => &self.types[1],
            Side::Right => &self.types[0],
        };
        let nulls: Vec<Column> = other
            .iter()
            .map(|t| broadcast(S::Null, *t, c.rows))
            .collect();
        c.cols = match side {
            Side::Left => c.cols.into_iter().chain(nulls).collect(),
            Side::Right => nulls.into_iter().chain(c.cols).collect(),
        };
        c
    }

    fn apply(
        &mut self,
        side: Side,
        c: &Chunk,
        threshold: Option<i64>,
        out: &mut Vec<Chunk>,
    ) -> Result<(), FlowError> {
        let c = &self.drop_expired(side, c, threshold)?;
        if c.rows == 0 {
            return Ok(());
        }
        let (this, other) = match side {
            Side::Left => (0usize, 1usize),
            Side::Right => (1, 0),
        };
        let this_mode = self.mode(side);
        let other_side = if side == Side::Left {
            Side::Right
        } else {
            Side::Left
        };
        let other_mode = self.mode(other_side);
        let key_cols: Vec<Cow<'_, Column>> = self.keys[this]
            .iter()
            .map(|e| e.eval(c))
            .collect::<Result<_, _>>()?;
        // Each row's key (a range of `key_bytes`), or None when a NULL keeps it from
        // matching anything.
        let mut keys: Vec<Option<(usize, usize)>> = Vec::with_capacity(c.rows);
        let mut key_bytes: Vec<u8> = Vec::new();
        let mut pair_rows: Vec<u32> = Vec::new();
        let mut pair_slots: Vec<u32> = Vec::new();
        let mut buf = Vec::new();
        for i in 0..c.rows {
            let null = key_cols
                .iter()
                .zip(&self.null_eq)
                .any(|(k, eq)| !*eq && k.is_null(i));
            if null {
                keys.push(None);
                continue;
            }
            let start = key_bytes.len();
            encode_row(&mut key_bytes, &key_cols, &self.key_types, i);
            let key = key_bytes.get(start..).unwrap_or(&[]);
            for &s in self.state[other].key_slots(key) {
                pair_rows.push(i as u32);
                pair_slots.push(s);
            }
            keys.push(Some((start, key_bytes.len())));
        }
        let diffs = c.diffs.each(c.rows);
        let mut matches = vec![0i64; c.rows];
        if !pair_rows.is_empty() {
            // The candidate pairs, left columns first, with the diffs of the joined rows.
            let delta = take_chunk(c, &self.types[this], &pair_rows);
            let other_types = &self.types[other];
            let mut builders: Vec<ColBuilder> = other_types
                .iter()
                .map(|t| ColBuilder::new(*t, pair_slots.len()))
                .collect();
            let mut pair_diffs = Vec::with_capacity(pair_slots.len());
            for (&i, &s) in pair_rows.iter().zip(&pair_slots) {
                let slot = self.state[other]
                    .slot(s)
                    .ok_or_else(|| internal("join index points at a removed row"))?;
                decode_into(&slot.row, other_types, &mut builders);
                let d = diffs.get(i as usize).copied().unwrap_or(0);
                pair_diffs.push(d.wrapping_mul(slot.mult));
            }
            let stored: Vec<Column> = builders.into_iter().map(|b| b.finish()).collect();
            let cols = match side {
                Side::Left => delta.cols.into_iter().chain(stored).collect(),
                Side::Right => stored.into_iter().chain(delta.cols).collect(),
            };
            let pairs = Chunk {
                rows: pair_slots.len(),
                cols,
                diffs: Diffs::Each(pair_diffs),
            };
            let pass: Option<Vec<bool>> = match &self.residual {
                None => None,
                Some(r) => {
                    let v = r.eval(&pairs)?;
                    Some(
                        (0..pairs.rows)
                            .map(|p| !v.is_null(p) && v.ints.get(p).copied().unwrap_or(0) != 0)
                            .collect(),
                    )
                }
            };
            let passes = |p: usize| {
                pass.as_ref()
                    .is_none_or(|v| v.get(p).copied() == Some(true))
            };
            if this_mode != Mode::Nothing {
                for (p, (&i, &s)) in pair_rows.iter().zip(&pair_slots).enumerate() {
                    if passes(p) {
                        let m = self.state[other].slot(s).map_or(0, |x| x.mult);
                        if let Some(x) = matches.get_mut(i as usize) {
                            *x = x.wrapping_add(m);
                        }
                    }
                }
            }
            if other_mode != Mode::Nothing {
                // Move the other side's match counts; emit its rows that cross 0.
                let mut first: FxHashMap<u32, i64> = FxHashMap::default();
                let mut order = Vec::new();
                for (p, (&i, &s)) in pair_rows.iter().zip(&pair_slots).enumerate() {
                    if !passes(p) {
                        continue;
                    }
                    let d = diffs.get(i as usize).copied().unwrap_or(0);
                    if let Some(slot) = self.state[other].slot_mut(s) {
                        first.entry(s).or_insert_with(|| {
                            order.push(s);
                            slot.matches
                        });
                        slot.matches = slot.matches.wrapping_add(d);
                    }
                }
                let mut builders: Vec<ColBuilder> = self.types[other]
                    .iter()
                    .map(|t| ColBuilder::new(*t, order.len()))
                    .collect();
                let mut out_diffs = Vec::new();
                for s in order {
                    let (Some(slot), Some(&was)) = (self.state[other].slot(s), first.get(&s))
                    else {
                        continue;
                    };
                    let d =
                        (other_mode.emits(slot.matches) as i64) - (other_mode.emits(was) as i64);
                    if d != 0 {
                        decode_into(&slot.row, &self.types[other], &mut builders);
                        out_diffs.push(d.wrapping_mul(slot.mult));
                    }
                }
                if !out_diffs.is_empty() {
                    let rows = Chunk {
                        rows: out_diffs.len(),
                        cols: builders.into_iter().map(|b| b.finish()).collect(),
                        diffs: Diffs::Each(out_diffs),
                    };
                    let pad = matches!(other_mode, Mode::Unmatched { pad: true });
                    out.push(self.side_rows(other_side, rows, pad));
                }
            }
            if self.pairs() {
                let joined = match &pass {
                    None => pairs,
                    Some(v) => {
                        let keep: Vec<u32> = (0..pairs.rows as u32)
                            .filter(|&p| v.get(p as usize).copied() == Some(true))
                            .collect();
                        let types: Vec<DataType> = self.types[0]
                            .iter()
                            .chain(&self.types[1])
                            .copied()
                            .collect();
                        take_chunk(&pairs, &types, &keep)
                    }
                };
                if joined.rows > 0 {
                    out.push(joined);
                }
            }
        }
        // This side's rows that are emitted alone (unmatched or matched), with their own diffs.
        if this_mode != Mode::Nothing {
            let emit: Vec<u32> = (0..c.rows)
                .filter(|&i| this_mode.emits(matches.get(i).copied().unwrap_or(0)))
                .map(|i| i as u32)
                .collect();
            if !emit.is_empty() {
                let rows = take_chunk(c, &self.types[this], &emit);
                let pad = matches!(this_mode, Mode::Unmatched { pad: true });
                out.push(self.side_rows(side, rows, pad));
            }
        }
        // Store the changes.
        let cols: Vec<Cow<'_, Column>> = c.cols.iter().map(Cow::Borrowed).collect();
        for (i, range) in keys.iter().enumerate() {
            let Some(key) = range.and_then(|(a, b)| key_bytes.get(a..b)) else {
                continue;
            };
            buf.clear();
            encode_row(&mut buf, &cols, &self.types[this], i);
            let d = diffs.get(i).copied().unwrap_or(0);
            let m = matches.get(i).copied().unwrap_or(0);
            let new_key = self.expire.is_some() && !self.state[this].by_key.contains_key(key);
            self.state[this].update(&buf, key, d, m);
            if new_key {
                if let Some(t) = self.key_time(key) {
                    self.state[this]
                        .by_time
                        .entry(t)
                        .or_default()
                        .push(key.to_vec());
                }
            }
        }
        Ok(())
    }

    /// The time (ms) of an encoded key's time key, when the join expires state.
    fn key_time(&self, key: &[u8]) -> Option<i64> {
        let (_, k, t) = self.expire?;
        match decode_key(key, &self.key_types, k) {
            Out::I(x) => Some(to_ms(x, t)),
            _ => None,
        }
    }

    /// `c` without the rows whose time key is before `threshold` (late changes of expired
    /// windows, ignored).
    fn drop_expired(
        &self,
        side: Side,
        c: &Chunk,
        threshold: Option<i64>,
    ) -> Result<Chunk, FlowError> {
        let (Some(th), Some((_, k, t))) = (threshold, self.expire) else {
            return Ok(c.clone());
        };
        let this = if side == Side::Left { 0 } else { 1 };
        let Some(e) = self.keys[this].get(k) else {
            return Ok(c.clone());
        };
        let v = e.eval(c)?;
        let keep: Vec<u32> = (0..c.rows)
            .filter(|&i| v.is_null(i) || to_ms(v.ints.get(i).copied().unwrap_or(0), t) >= th)
            .map(|i| i as u32)
            .collect();
        Ok(if keep.len() == c.rows {
            c.clone()
        } else {
            take_chunk(c, &self.types[this], &keep)
        })
    }

    pub fn state_size(&self) -> usize {
        self.state.iter().map(|a| a.bytes).sum()
    }

    pub fn write(&self, w: &mut Writer) {
        for a in &self.state {
            a.write(w);
        }
    }

    pub fn read(&mut self, r: &mut Reader<'_>) -> Result<(), FlowError> {
        let left = Arrangement::read(r, &self.types[0], &self.key_types)?;
        let right = Arrangement::read(r, &self.types[1], &self.key_types)?;
        self.state = [left, right];
        if self.expire.is_some() {
            for side in 0..2 {
                let keys: Vec<Vec<u8>> = self.state[side].by_key.keys().cloned().collect();
                for key in keys {
                    if let Some(t) = self.key_time(&key) {
                        self.state[side].by_time.entry(t).or_default().push(key);
                    }
                }
            }
        }
        Ok(())
    }
}
