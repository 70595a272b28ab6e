//! Incremental equi-joins over arrangements.
//!
//! An [`Arrangement`] is one input's rows indexed by join key: per key, its rows' changes
//! in one byte array, consolidated (each distinct row once, with its multiplicity: the sum
//! of its diffs so far, in row order) whenever the other side reads the key, and appended
//! to unsorted in between ([`Rows`] states why that answers alike). It is the join's state
//! for that input. A key of one integer column is looked up by its value.
//!
//! An inner join of a sub-plan with itself on the same keys (a self-join whose two sides
//! read the same columns and filters) keeps one arrangement for both inputs.
//!
//! **Speed.** Per change: one lookup of its key in each arrangement, its row encoded once
//! and appended to its key's bytes; no allocation per row, no index by row. The joins
//! benchmark (`make bench`) and `cargo run -p sandflow-engine --release --example
//! join_workload` (the engine alone) measure it.
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

use crate::agg::{check_key, decode_key, to_ms, Encoded, Out};
use crate::codec::{Reader, Writer};
use crate::column::{broadcast, take_chunk, Chunk, ColBuilder, Diffs, S};
use crate::expr::Expr;
use crate::hash::{FxHashMap, IntMap};
use crate::plan::{JoinKind, JoinSpec};
use crate::types::{bad, internal, Column, DataType, FlowError, Storage};

/// Bytes of an entry before its row: the multiplicity (`i64`), the match count (`i64`) and
/// the row's length (`u32`), little-endian.
const HEAD: usize = 20;

/// No entry.
const NONE: u32 = u32::MAX;

/// One entry of a key's rows, read: its multiplicity, match count and row.
struct Entry<'a> {
    mult: i64,
    matches: i64,
    row: &'a [u8],
}

/// One join key's rows: a list of *entries*, each one change of a row (how many copies it
/// adds or removes, how many rows of the other side the row matches, its bytes), stored one
/// after the other in `data` and addressed by their offset there.
///
/// The first `clean` entries are *consolidated*: sorted by row bytes, each row once, none
/// with a multiplicity of 0. Changes are appended after them unsorted (a row may then
/// appear more than once, or with a negative multiplicity): every computation over the
/// entries is linear in them, and all entries of one row carry the same `matches` (the
/// count depends on the row's bytes and the other side only, and a stored row's count is
/// moved only after its key was consolidated), so the appended form answers like the
/// consolidated one. [`Rows::consolidate`] runs before the other side reads the key, so
/// what a reader sees, and the order of the rows a join emits, depends on the rows only,
/// not on the history of changes (a restored arrangement emits what the original does);
/// when the key's changes sum to zero (its rows were all removed: the key goes); and when
/// the appended part outgrows the consolidated one ([`Rows::overgrown`]), so that memory
/// follows the distinct rows.
#[derive(Debug, Clone, Default)]
struct Rows {
    key: Vec<u8>,
    data: Vec<u8>,
    count: u32,
    clean: u32,
    clean_bytes: u32,
    /// Offset of the last entry when it is an appended one, else [`NONE`].
    last: u32,
    /// Whether an appended entry removes copies (so that consolidating may shrink).
    retractions: bool,
    /// The sum of all multiplicities: 0 after a removal means the key is most likely empty.
    net: i64,
}

fn le_i64(b: &[u8], at: usize) -> i64 {
    b.get(at..at + 8)
        .and_then(|x| <[u8; 8]>::try_from(x).ok())
        .map_or(0, i64::from_le_bytes)
}

impl Rows {
    fn new(key: &[u8]) -> Rows {
        Rows {
            key: key.to_vec(),
            last: NONE,
            ..Rows::default()
        }
    }

    /// The entry at `off`, and the offset of the next one.
    fn at(&self, off: u32) -> Option<(Entry<'_>, u32)> {
        let o = off as usize;
        let head = self.data.get(o..o + HEAD)?;
        let len = u32::from_le_bytes(<[u8; 4]>::try_from(head.get(16..20)?).ok()?) as usize;
        let row = self.data.get(o + HEAD..o + HEAD + len)?;
        Some((
            Entry {
                mult: le_i64(head, 0),
                matches: le_i64(head, 8),
                row,
            },
            (o + HEAD + len) as u32,
        ))
    }

    /// The offsets of the entries from `from` on.
    fn offsets_from(&self, from: u32) -> impl Iterator<Item = u32> + '_ {
        let mut off = from;
        std::iter::from_fn(move || {
            let (_, next) = self.at(off)?;
            let this = off;
            off = next;
            Some(this)
        })
    }

    fn set(&mut self, off: u32, field: usize, v: i64) {
        let o = off as usize + field;
        if let Some(d) = self.data.get_mut(o..o + 8) {
            d.copy_from_slice(&v.to_le_bytes());
        }
    }

    fn set_matches(&mut self, off: u32, v: i64) {
        self.set(off, 8, v);
    }

    fn append(&mut self, row: &[u8], mult: i64, matches: i64) {
        let size = HEAD + row.len();
        if self.data.capacity() - self.data.len() < size {
            self.data.reserve(size.max(self.data.len()).max(3 * size));
        }
        self.last = self.data.len() as u32;
        let mut head = [0u8; HEAD];
        head[..8].copy_from_slice(&mult.to_le_bytes());
        head[8..16].copy_from_slice(&matches.to_le_bytes());
        head[16..].copy_from_slice(&(row.len() as u32).to_le_bytes());
        self.data.extend_from_slice(&head);
        self.data.extend_from_slice(row);
        self.count += 1;
    }

    /// Appends a change; returns the change in bytes held.
    fn push(&mut self, row: &[u8], mult: i64, matches: i64) -> isize {
        let before = self.data.len();
        self.net = self.net.wrapping_add(mult);
        // The same row as the last appended change (e.g. rows that differ only in columns
        // projected away, one after the other): one entry.
        if let Some((e, _)) = self.at(self.last).filter(|(e, _)| e.row == row) {
            let sum = e.mult.wrapping_add(mult);
            if sum == 0 {
                self.data.truncate(self.last as usize);
                self.count -= 1;
                self.last = NONE;
            } else {
                self.set(self.last, 0, sum);
            }
        } else {
            self.retractions |= mult < 0;
            self.append(row, mult, matches);
        }
        self.data.len() as isize - before as isize
    }

    fn dirty(&self) -> bool {
        self.clean != self.count
    }

    /// Whether to consolidate now: when the appended entries removed every copy, or
    /// outgrew the consolidated ones (past twice as many when some remove copies, past
    /// four times as many otherwise: appended rows that only add are mostly distinct rows,
    /// which consolidating would only sort).
    fn overgrown(&self) -> bool {
        if self.retractions && self.net == 0 {
            // Every copy removed: consolidating empties the key.
            return true;
        }
        let appended = self.count - self.clean;
        if self.retractions {
            appended > 2 * self.clean + 32
        } else {
            appended > 4 * self.clean + 128
        }
    }

    /// The entries consolidated (see the type's documentation). `Err` when `strict` and a
    /// row appears twice.
    fn merged(&self, strict: bool) -> Result<Rows, ()> {
        let row = |off: &u32| self.at(*off).map_or(&[][..], |(e, _)| e.row);
        let head: Vec<u32> = self.offsets_from(0).take(self.clean as usize).collect();
        let mut tail: Vec<u32> = self.offsets_from(self.clean_bytes).collect();
        tail.sort_by(|a, b| row(a).cmp(row(b)));
        // (offset of the row's first entry, summed multiplicity), in row order.
        let mut sums: Vec<(u32, i64)> = Vec::with_capacity(head.len() + tail.len());
        let (mut h, mut t) = (head.iter().peekable(), tail.iter().peekable());
        loop {
            let next = match (h.peek(), t.peek()) {
                (Some(a), Some(b)) if row(a) <= row(b) => h.next(),
                (Some(_), Some(_)) | (None, Some(_)) => t.next(),
                (Some(_), None) => h.next(),
                (None, None) => None,
            };
            let Some(&off) = next else { break };
            let mult = self.at(off).map_or(0, |(e, _)| e.mult);
            match sums.last_mut() {
                Some(last) if row(&last.0) == row(&off) => {
                    if strict {
                        return Err(());
                    }
                    last.1 = last.1.wrapping_add(mult);
                }
                _ => sums.push((off, mult)),
            }
        }
        let mut out = Rows::new(&self.key);
        for (off, mult) in sums {
            if mult == 0 {
                continue;
            }
            out.net = out.net.wrapping_add(mult);
            if let Some((e, _)) = self.at(off) {
                out.append(e.row, mult, e.matches);
            }
        }
        out.clean = out.count;
        out.clean_bytes = out.data.len() as u32;
        out.last = NONE;
        Ok(out)
    }

    /// Consolidates the entries. Returns the change in bytes held.
    fn consolidate(&mut self) -> isize {
        if !self.dirty() {
            return 0;
        }
        let before = self.data.len();
        if let Ok(m) = self.merged(false) {
            *self = m;
        }
        self.data.len() as isize - before as isize
    }
}

/// One side's rows by join key. See the module's documentation for its rule.
#[derive(Debug, Clone, Default)]
pub(crate) struct Arrangement {
    by_key: KeyIndex,
    /// Per key id: its rows (a freed id holds an empty `Rows`).
    keys: Vec<Rows>,
    key_free: Vec<u32>,
    bytes: usize,
    /// With a time key under EXPIRE AFTER: each key's time (ms) → the keys created with it.
    by_time: BTreeMap<i64, Vec<Vec<u8>>>,
}

/// Bytes a key costs besides its rows.
const KEY_BYTES: usize = 64;

/// Encoded join key → key id. A key of one integer column compared with `=` (never NULL
/// here) is looked up by its value.
#[derive(Debug, Clone)]
enum KeyIndex {
    Bytes(FxHashMap<Vec<u8>, u32>),
    Int(IntMap),
}

impl Default for KeyIndex {
    fn default() -> Self {
        KeyIndex::Bytes(FxHashMap::default())
    }
}

/// The value of an encoded non-NULL integer key (tag byte 1, then 8 bytes).
fn int_key(key: &[u8]) -> i64 {
    le_i64(key, 1)
}

impl KeyIndex {
    fn get(&self, key: &[u8]) -> Option<u32> {
        match self {
            KeyIndex::Bytes(m) => m.get(key).copied(),
            KeyIndex::Int(m) => m.get(int_key(key)),
        }
    }

    fn insert(&mut self, key: &[u8], k: u32) {
        match self {
            KeyIndex::Bytes(m) => {
                m.insert(key.to_vec(), k);
            }
            KeyIndex::Int(m) => {
                m.insert(int_key(key), k);
            }
        }
    }

    fn remove(&mut self, key: &[u8]) {
        match self {
            KeyIndex::Bytes(m) => {
                m.remove(key);
            }
            KeyIndex::Int(m) => {
                m.remove(int_key(key));
            }
        }
    }
}

impl Arrangement {
    fn new(int_keys: bool) -> Arrangement {
        Arrangement {
            by_key: if int_keys {
                KeyIndex::Int(IntMap::default())
            } else {
                KeyIndex::Bytes(FxHashMap::default())
            },
            ..Arrangement::default()
        }
    }

    /// The encoded keys that have rows.
    fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.keys
            .iter()
            .filter(|r| r.count > 0)
            .map(|r| r.key.as_slice())
    }

    /// The id of `key`, its rows consolidated for reading; `None` when it has no rows.
    fn probe(&mut self, key: &[u8]) -> Option<u32> {
        let k = self.by_key.get(key)?;
        let rows = self.keys.get_mut(k as usize)?;
        if rows.dirty() {
            let delta = rows.consolidate();
            let empty = rows.count == 0;
            self.bytes = self.bytes.saturating_add_signed(delta);
            if empty {
                self.drop_key(k);
                return None;
            }
        }
        Some(k)
    }

    fn rows(&self, k: u32) -> Option<&Rows> {
        self.keys.get(k as usize)
    }

    /// The entry at `off` of key `k`.
    fn entry(&self, k: u32, off: u32) -> Option<Entry<'_>> {
        Some(self.keys.get(k as usize)?.at(off)?.0)
    }

    fn set_matches(&mut self, k: u32, off: u32, v: i64) {
        if let Some(rows) = self.keys.get_mut(k as usize) {
            rows.set_matches(off, v);
        }
    }

    /// The id of `key`, created when new.
    fn key_id(&mut self, key: &[u8]) -> u32 {
        if let Some(k) = self.by_key.get(key) {
            return k;
        }
        let rows = Rows::new(key);
        let k = match self.key_free.pop() {
            Some(k) => {
                if let Some(e) = self.keys.get_mut(k as usize) {
                    *e = rows;
                }
                k
            }
            None => {
                self.keys.push(rows);
                (self.keys.len() - 1) as u32
            }
        };
        self.by_key.insert(key, k);
        self.bytes += 2 * key.len() + KEY_BYTES;
        k
    }

    /// Adds `diff` copies of `row` (whose key is `key`); a new row starts with `matches`.
    fn update(&mut self, row: &[u8], key: &[u8], diff: i64, matches: i64) {
        if diff == 0 {
            return;
        }
        let k = self.key_id(key);
        let Some(rows) = self.keys.get_mut(k as usize) else {
            return;
        };
        let mut delta = rows.push(row, diff, matches);
        if rows.overgrown() {
            delta += rows.consolidate();
        }
        let empty = rows.count == 0;
        self.bytes = self.bytes.saturating_add_signed(delta);
        if empty {
            self.drop_key(k);
        }
    }

    /// For each row of `keys` that may match (not `null_key`), every entry with its key:
    /// the row's index in `pair_rows`, (key id, entry offset) in `pair_slots`. Out of line,
    /// as the engine's other per-row loops (guest/README.md, "Speed").
    #[inline(never)]
    fn probe_rows(
        &mut self,
        keys: &Encoded,
        null_key: &[bool],
        pair_rows: &mut Vec<u32>,
        pair_slots: &mut Vec<(u32, u32)>,
    ) {
        for (i, &null) in null_key.iter().enumerate() {
            if null {
                continue;
            }
            let Some(k) = self.probe(keys.row(i)) else {
                continue;
            };
            if let Some(rows) = self.rows(k) {
                for off in rows.offsets_from(0) {
                    pair_rows.push(i as u32);
                    pair_slots.push((k, off));
                }
            }
        }
    }

    /// Stores each row of `rows` that may match (not `null_key`) under its key, with its
    /// diff and match count.
    #[inline(never)]
    fn store_rows(
        &mut self,
        rows: &Encoded,
        keys: &Encoded,
        null_key: &[bool],
        diffs: &[i64],
        matches: &[i64],
    ) {
        for (i, ((&null, &d), &m)) in null_key.iter().zip(diffs).zip(matches).enumerate() {
            if !null {
                self.update(rows.row(i), keys.row(i), d, m);
            }
        }
    }

    /// Forgets key `k` and its rows.
    fn drop_key(&mut self, k: u32) {
        let Some(rows) = self.keys.get_mut(k as usize) else {
            return;
        };
        let rows = std::mem::take(rows);
        self.bytes = self
            .bytes
            .saturating_sub(rows.data.len() + 2 * rows.key.len() + KEY_BYTES);
        self.by_key.remove(&rows.key);
        self.key_free.push(k);
    }

    /// Drops every row of the keys whose time is before `threshold`.
    fn expire(&mut self, threshold: i64) {
        while let Some(entry) = self.by_time.first_entry() {
            if *entry.key() >= threshold {
                break;
            }
            for key in entry.remove() {
                if let Some(k) = self.by_key.get(&key) {
                    self.drop_key(k);
                }
            }
        }
    }

    /// Writes the rows key by key, each key's rows consolidated (in row order), so that a
    /// restored arrangement lists them as this one does when they are read.
    fn write(&self, w: &mut Writer) {
        let merged: Vec<Cow<'_, Rows>> = self
            .keys
            .iter()
            .filter(|r| r.count > 0)
            .map(|r| {
                if r.dirty() {
                    Cow::Owned(r.merged(false).unwrap_or_default())
                } else {
                    Cow::Borrowed(r)
                }
            })
            .collect();
        w.u64(merged.iter().map(|r| r.count as u64).sum());
        for rows in &merged {
            for off in rows.offsets_from(0) {
                if let Some((e, _)) = rows.at(off) {
                    w.bytes(e.row);
                    w.bytes(&rows.key);
                    w.i64(e.mult);
                    w.i64(e.matches);
                }
            }
        }
    }

    fn read(
        r: &mut Reader<'_>,
        types: &[DataType],
        key_types: &[DataType],
        int_keys: bool,
    ) -> Result<Self, FlowError> {
        let corrupt = |m: &str| bad(format!("snapshot: join state: {m}"));
        let n = r.len(8 + 8 + 16)?;
        let mut a = Arrangement::new(int_keys);
        let all_nullable = vec![true; types.len().max(key_types.len())];
        for _ in 0..n {
            let row = r.bytes()?;
            let key = r.bytes()?;
            let mult = r.i64()?;
            let matches = r.i64()?;
            check_key(row, types, &all_nullable).map_err(|m| corrupt(&m))?;
            check_key(key, key_types, &all_nullable).map_err(|m| corrupt(&m))?;
            if mult == 0 {
                return Err(corrupt("a row is stored with no copies"));
            }
            let k = a.key_id(key);
            if let Some(rows) = a.keys.get_mut(k as usize) {
                rows.append(row, mult, matches);
            }
        }
        a.bytes = 0;
        for rows in &mut a.keys {
            *rows = rows
                .merged(true)
                .map_err(|()| corrupt("a row is stored twice"))?;
            a.bytes += rows.data.len() + 2 * rows.key.len() + KEY_BYTES;
        }
        Ok(a)
    }
}

/// The columns of encoded rows (as [`encode_row`](crate::agg::encode_row) writes them).
fn decode_rows(rows: &[&[u8]], types: &[DataType]) -> Vec<Column> {
    // Numbers only, none NULL (a NULL is one byte, and only strings vary): 9 bytes each,
    // read column by column.
    let w = 9 * types.len();
    if types.iter().all(|t| t.storage() != Storage::Bytes) && rows.iter().all(|r| r.len() == w) {
        return types
            .iter()
            .enumerate()
            .map(|(j, t)| {
                let values = rows.iter().map(|r| le_i64(r, 9 * j + 1));
                match t.storage() {
                    Storage::Floats => Column {
                        floats: values.map(|x| f64::from_bits(x as u64)).collect(),
                        ..Column::default()
                    },
                    _ => Column {
                        ints: values.collect(),
                        ..Column::default()
                    },
                }
            })
            .collect();
    }
    let mut builders: Vec<ColBuilder> = types
        .iter()
        .map(|t| ColBuilder::new(*t, rows.len()))
        .collect();
    for r in rows {
        decode_into(r, types, &mut builders);
    }
    builders.into_iter().map(|b| b.finish()).collect()
}

/// Pushes the values of an encoded row (as [`encode_row`](crate::agg::encode_row) writes them)
/// to `out`.
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
    /// An inner join of a sub-plan with itself on the same keys: one arrangement (the
    /// left's) holds the rows of both inputs. The left changes probe it before they are
    /// stored (the right input as of the previous tick), the right changes after (the left
    /// input with this tick's changes), and the right changes are not stored again.
    shared: bool,
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
            same_inputs,
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
        let shared =
            same_inputs && kind == JoinKind::Inner && left_keys == right_keys && left == right;
        Ok(JoinOp {
            expire,
            shared,
            kind,
            keys: [left_keys, right_keys],
            null_eq,
            residual,
            types: [left, right],
            key_types,
            out_types,
            state: [Arrangement::default(), Arrangement::default()],
        }
        .with_arrangements())
    }

    /// Whether the arrangements index keys by integer value: one key column of integers
    /// compared with `=` (so never NULL when stored).
    fn int_keys(&self) -> bool {
        matches!(self.key_types.as_slice(), [t] if t.storage() == Storage::Ints)
            && self.null_eq.iter().all(|eq| !eq)
    }

    fn with_arrangements(mut self) -> JoinOp {
        let int_keys = self.int_keys();
        self.state = [Arrangement::new(int_keys), Arrangement::new(int_keys)];
        self
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
        if self.shared {
            // Every left change probes the right input as of the previous tick: all of them
            // before any is stored in the arrangement both inputs share.
            for c in &left {
                self.apply(Side::Left, c, threshold, &mut out, false)?;
            }
            for c in &left {
                self.store_shared(c, threshold)?;
            }
        } else {
            for c in &left {
                self.apply(Side::Left, c, threshold, &mut out, true)?;
            }
        }
        for c in right {
            self.apply(Side::Right, &c, threshold, &mut out, true)?;
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

    /// Joins the changes `c` of one input with the other input's arrangement, then stores
    /// them (unless `store` is false).
    fn apply(
        &mut self,
        side: Side,
        c: &Chunk,
        threshold: Option<i64>,
        out: &mut Vec<Chunk>,
        store: bool,
    ) -> Result<(), FlowError> {
        let c = &self.drop_expired(side, c, threshold)?;
        if c.rows == 0 {
            return Ok(());
        }
        let (this, other) = match side {
            Side::Left => (0usize, 1usize),
            Side::Right => (1, 0),
        };
        // The arrangements to store into and to probe.
        let (this_arr, other_arr) = if self.shared { (0, 0) } else { (this, other) };
        let this_mode = self.mode(side);
        let other_side = if side == Side::Left {
            Side::Right
        } else {
            Side::Left
        };
        let other_mode = self.mode(other_side);
        let (key_enc, null_key) = self.keys_of(this, c)?;
        let mut pair_rows: Vec<u32> = Vec::new();
        // (key id, entry offset) in the other side's arrangement.
        let mut pair_slots: Vec<(u32, u32)> = Vec::new();
        self.state[other_arr].probe_rows(&key_enc, &null_key, &mut pair_rows, &mut pair_slots);
        let diffs = c.diffs.each(c.rows);
        let mut matches = vec![0i64; c.rows];
        if !pair_rows.is_empty() {
            // The candidate pairs, left columns first, with the diffs of the joined rows.
            let delta = take_chunk(c, &self.types[this], &pair_rows);
            let other_types = &self.types[other];
            let mut pair_diffs = Vec::with_capacity(pair_slots.len());
            let mut stored_rows: Vec<&[u8]> = Vec::with_capacity(pair_slots.len());
            for (&i, &(k, e)) in pair_rows.iter().zip(&pair_slots) {
                let entry = self.state[other_arr]
                    .entry(k, e)
                    .ok_or_else(|| internal("join index points at a removed row"))?;
                stored_rows.push(entry.row);
                let d = diffs.get(i as usize).copied().unwrap_or(0);
                pair_diffs.push(d.wrapping_mul(entry.mult));
            }
            let stored = decode_rows(&stored_rows, other_types);
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
                        let m = self.state[other_arr].entry(s.0, s.1).map_or(0, |x| x.mult);
                        if let Some(x) = matches.get_mut(i as usize) {
                            *x = x.wrapping_add(m);
                        }
                    }
                }
            }
            if other_mode != Mode::Nothing {
                // Move the other side's match counts; emit its rows that cross 0.
                let mut first: FxHashMap<(u32, u32), i64> = FxHashMap::default();
                let mut order = Vec::new();
                for (p, (&i, &s)) in pair_rows.iter().zip(&pair_slots).enumerate() {
                    if !passes(p) {
                        continue;
                    }
                    let d = diffs.get(i as usize).copied().unwrap_or(0);
                    if let Some(was) = self.state[other_arr].entry(s.0, s.1).map(|e| e.matches) {
                        first.entry(s).or_insert_with(|| {
                            order.push(s);
                            was
                        });
                        self.state[other_arr].set_matches(s.0, s.1, was.wrapping_add(d));
                    }
                }
                let mut builders: Vec<ColBuilder> = self.types[other]
                    .iter()
                    .map(|t| ColBuilder::new(*t, order.len()))
                    .collect();
                let mut out_diffs = Vec::new();
                for s in order {
                    let (Some(entry), Some(&was)) =
                        (self.state[other_arr].entry(s.0, s.1), first.get(&s))
                    else {
                        continue;
                    };
                    let d =
                        (other_mode.emits(entry.matches) as i64) - (other_mode.emits(was) as i64);
                    if d != 0 {
                        decode_into(entry.row, &self.types[other], &mut builders);
                        out_diffs.push(d.wrapping_mul(entry.mult));
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
        if self.shared && side == Side::Right {
            // Stored with the left input's changes, which are the same.
            return Ok(());
        }
        if store {
            self.store(this_arr, this, c, &key_enc, &null_key, &diffs, &matches);
        }
        Ok(())
    }

    /// Each row's encoded key (of input `side`: 0 left, 1 right), and whether a NULL keeps
    /// it from matching anything.
    fn keys_of(&self, side: usize, c: &Chunk) -> Result<(Encoded, Vec<bool>), FlowError> {
        let key_cols: Vec<Cow<'_, Column>> = self.keys[side]
            .iter()
            .map(|e| e.eval(c))
            .collect::<Result<_, _>>()?;
        let key_enc = Encoded::new(&key_cols, &self.key_types, c.rows);
        let mut null_key = vec![false; c.rows];
        for (k, eq) in key_cols.iter().zip(&self.null_eq) {
            if !*eq && k.nulls.iter().any(|n| *n != 0) {
                for (i, n) in null_key.iter_mut().enumerate() {
                    *n |= k.is_null(i);
                }
            }
        }
        Ok((key_enc, null_key))
    }

    /// Stores the changes `c` of input `side` into arrangement `arr`.
    #[allow(clippy::too_many_arguments)]
    fn store(
        &mut self,
        arr: usize,
        side: usize,
        c: &Chunk,
        key_enc: &Encoded,
        null_key: &[bool],
        diffs: &[i64],
        matches: &[i64],
    ) {
        let cols: Vec<Cow<'_, Column>> = c.cols.iter().map(Cow::Borrowed).collect();
        let row_enc = Encoded::new(&cols, &self.types[side], c.rows);
        if self.expire.is_none() {
            self.state[arr].store_rows(&row_enc, key_enc, null_key, diffs, matches);
            return;
        }
        for (i, &null) in null_key.iter().enumerate() {
            if null {
                continue;
            }
            let key = key_enc.row(i);
            let d = diffs.get(i).copied().unwrap_or(0);
            let m = matches.get(i).copied().unwrap_or(0);
            let new_key = self.state[arr].by_key.get(key).is_none();
            self.state[arr].update(row_enc.row(i), key, d, m);
            if new_key {
                if let Some(t) = self.key_time(key) {
                    self.state[arr]
                        .by_time
                        .entry(t)
                        .or_default()
                        .push(key.to_vec());
                }
            }
        }
    }

    /// Stores the left input's changes `c` into the shared arrangement (see `shared`).
    fn store_shared(&mut self, c: &Chunk, threshold: Option<i64>) -> Result<(), FlowError> {
        let c = &self.drop_expired(Side::Left, c, threshold)?;
        let (key_enc, null_key) = self.keys_of(0, c)?;
        let diffs = c.diffs.each(c.rows);
        // An inner join keeps no match counts.
        let matches = vec![0i64; c.rows];
        self.store(0, 0, c, &key_enc, &null_key, &diffs, &matches);
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
        let int_keys = self.int_keys();
        let left = Arrangement::read(r, &self.types[0], &self.key_types, int_keys)?;
        let right = Arrangement::read(r, &self.types[1], &self.key_types, int_keys)?;
        // Shared: the left arrangement holds both inputs (a snapshot of an engine that did
        // not share holds them twice).
        self.state = if self.shared {
            [left, Arrangement::new(int_keys)]
        } else {
            [left, right]
        };
        if self.expire.is_some() {
            for side in 0..2 {
                let keys: Vec<Vec<u8>> = self.state[side].keys().map(<[u8]>::to_vec).collect();
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A small deterministic generator (xorshift).
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }
    }

    /// An encoded non-NULL Int64 (as `encode_row` writes it).
    fn int(x: i64) -> Vec<u8> {
        let mut b = vec![1];
        b.extend_from_slice(&x.to_le_bytes());
        b
    }

    /// What a reader of `key` sees: (row, multiplicity) in the order it reads them.
    fn read_key(a: &mut Arrangement, key: &[u8]) -> Vec<(Vec<u8>, i64)> {
        let Some(k) = a.probe(key) else {
            return Vec::new();
        };
        let rows = a.rows(k).expect("probed key has rows");
        rows.offsets_from(0)
            .filter_map(|off| rows.at(off))
            .map(|(e, _)| (e.row.to_vec(), e.mult))
            .collect()
    }

    #[test]
    fn an_arrangement_reads_as_the_sum_of_its_changes_in_row_order() {
        for (seed, int_keys) in (1..40u64).zip([true, false].into_iter().cycle()) {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut a = Arrangement::new(int_keys);
            let mut want: BTreeMap<Vec<u8>, BTreeMap<Vec<u8>, i64>> = BTreeMap::new();
            for step in 0..3_000 {
                let key = int(rng.below(5) as i64);
                // Few distinct rows per key, so that rows repeat, cancel and come back.
                let mut row = key.clone();
                row.extend_from_slice(&int(rng.below(7) as i64));
                let diff = [1, 1, 2, -1, -1, -2][rng.below(6) as usize];
                a.update(&row, &key, diff, 0);
                let sums = want.entry(key.clone()).or_default();
                *sums.entry(row).or_default() += diff;
                sums.retain(|_, m| *m != 0);
                // Read a key now and then (reading consolidates it).
                if step % 7 == 0 {
                    let probe = int(rng.below(5) as i64);
                    let expect: Vec<(Vec<u8>, i64)> = want
                        .get(&probe)
                        .map(|m| m.iter().map(|(r, m)| (r.clone(), *m)).collect())
                        .unwrap_or_default();
                    assert_eq!(read_key(&mut a, &probe), expect, "seed {seed} step {step}");
                }
            }
            // A snapshot restores to what the original reads.
            let mut w = Writer::default();
            a.write(&mut w);
            let types = [DataType::Int64, DataType::Int64];
            let mut restored =
                Arrangement::read(&mut Reader::new(&w.buf), &types, &types[..1], int_keys)
                    .expect("restores");
            for k in 0..5 {
                let key = int(k);
                let original = read_key(&mut a, &key);
                assert_eq!(read_key(&mut restored, &key), original, "seed {seed}");
                let expect: Vec<(Vec<u8>, i64)> = want
                    .get(&key)
                    .map(|m| m.iter().map(|(r, m)| (r.clone(), *m)).collect())
                    .unwrap_or_default();
                assert_eq!(original, expect, "seed {seed}");
            }
        }
    }

    #[test]
    fn removing_every_row_of_a_key_frees_its_state_without_a_reader() {
        for int_keys in [true, false] {
            let mut a = Arrangement::new(int_keys);
            for v in 0..300 {
                let mut row = int(v % 2);
                row.extend_from_slice(&int(v));
                a.update(&row, &int(v % 2), 1, 0);
            }
            assert!(a.bytes > 300 * 18, "{}", a.bytes);
            for v in (0..300).rev() {
                let mut row = int(v % 2);
                row.extend_from_slice(&int(v));
                a.update(&row, &int(v % 2), -1, 0);
            }
            assert_eq!(a.bytes, 0, "int keys: {int_keys}");
            assert_eq!(a.keys().count(), 0);
        }
    }

    /// The consolidated sum of chunks: row (as its values) → multiplicity.
    fn total(chunks: &[Chunk]) -> BTreeMap<Vec<i64>, i64> {
        let mut m: BTreeMap<Vec<i64>, i64> = BTreeMap::new();
        for c in chunks {
            for i in 0..c.rows {
                let row: Vec<i64> = c.cols.iter().map(|col| col.ints[i]).collect();
                *m.entry(row).or_default() += c.diffs.get(i);
            }
        }
        m.retain(|_, d| *d != 0);
        m
    }

    #[test]
    fn a_self_join_with_one_arrangement_equals_one_with_two() {
        let types = vec![DataType::Int64, DataType::Int64];
        let op = |same_inputs: bool| {
            let spec = JoinSpec {
                left: 0,
                right: 0,
                kind: JoinKind::Inner,
                left_keys: vec![Expr::Col(0, DataType::Int64)],
                right_keys: vec![Expr::Col(0, DataType::Int64)],
                null_eq: vec![false],
                residual: None,
                same_inputs,
            };
            JoinOp::new(spec, types.clone(), types.clone(), None).expect("join")
        };
        let (mut shared, mut apart) = (op(true), op(false));
        assert!(shared.shared && !apart.shared);
        let mut rng = Rng(7);
        let (mut out_shared, mut out_apart) = (Vec::new(), Vec::new());
        let mut live: Vec<(i64, i64)> = Vec::new();
        for tick in 0..60 {
            // Several chunks a tick (the left changes must all see the previous tick).
            let chunks: Vec<Chunk> = (0..1 + rng.below(3))
                .map(|_| {
                    let (mut ks, mut vs, mut ds) = (Vec::new(), Vec::new(), Vec::new());
                    for _ in 0..1 + rng.below(6) {
                        if !live.is_empty() && rng.below(3) == 0 {
                            let (k, v) = live.swap_remove(rng.below(live.len() as u64) as usize);
                            ks.push(k);
                            vs.push(v);
                            ds.push(-1);
                        } else {
                            let (k, v) = (rng.below(4) as i64, rng.below(5) as i64);
                            live.push((k, v));
                            ks.push(k);
                            vs.push(v);
                            ds.push(1);
                        }
                    }
                    Chunk {
                        rows: ks.len(),
                        cols: vec![
                            Column {
                                ints: ks,
                                ..Column::default()
                            },
                            Column {
                                ints: vs,
                                ..Column::default()
                            },
                        ],
                        diffs: Diffs::Each(ds),
                    }
                })
                .collect();
            out_shared.extend(
                shared
                    .step(chunks.clone(), chunks.clone(), tick)
                    .expect("step"),
            );
            out_apart.extend(apart.step(chunks.clone(), chunks, tick).expect("step"));
            assert_eq!(total(&out_shared), total(&out_apart), "tick {tick}");
        }
        // The result is the self-join of what is live.
        let mut want: BTreeMap<Vec<i64>, i64> = BTreeMap::new();
        for a in &live {
            for b in live.iter().filter(|b| b.0 == a.0) {
                *want.entry(vec![a.0, a.1, b.0, b.1]).or_default() += 1;
            }
        }
        assert_eq!(total(&out_shared), want);
        assert!(
            shared.state_size() < apart.state_size(),
            "one arrangement, not two"
        );
        // A snapshot of either restores into a shared join.
        for from in [&shared, &apart] {
            let mut w = Writer::default();
            from.write(&mut w);
            let mut restored = op(true);
            restored.read(&mut Reader::new(&w.buf)).expect("restores");
            assert_eq!(restored.state_size(), shared.state_size());
        }
    }

    #[test]
    fn a_snapshot_with_a_row_twice_is_refused() {
        let mut w = Writer::default();
        w.u64(2);
        for _ in 0..2 {
            let mut row = int(1);
            row.extend_from_slice(&int(2));
            w.bytes(&row);
            w.bytes(&int(1));
            w.i64(1);
            w.i64(0);
        }
        let types = [DataType::Int64, DataType::Int64];
        let err = Arrangement::read(&mut Reader::new(&w.buf), &types, &types[..1], true)
            .expect_err("a row stored twice");
        assert!(err.to_string().contains("stored twice"), "{err}");
    }
}
