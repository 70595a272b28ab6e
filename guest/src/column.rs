//! Internal columnar chunks and helpers to build and gather columns.

use crate::types::{Column, DataType, Storage};

/// A chunk of diff rows flowing between operators (times are already resolved).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Chunk {
    pub rows: usize,
    pub cols: Vec<Column>,
    pub diffs: Diffs,
}

/// The diffs of a chunk's rows: one per row, or one shared by all of them (a write sends
/// one). Kept shared as far as it goes: the aggregate's common updates take a shared diff
/// as a constant instead of reading a list of equal entries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Diffs {
    Each(Vec<i64>),
    All(i64),
}

impl Default for Diffs {
    fn default() -> Diffs {
        Diffs::Each(Vec::new())
    }
}

impl Diffs {
    /// From a batch's list: one entry for several rows is shared by all of them.
    pub fn from_list(v: Vec<i64>, rows: usize) -> Diffs {
        match v.as_slice() {
            [d] if rows != 1 => Diffs::All(*d),
            _ => Diffs::Each(v),
        }
    }

    /// The diff of row `i`.
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Diffs::Each(v) => v.get(i).copied().unwrap_or(0),
            Diffs::All(d) => *d,
        }
    }

    /// One entry per row of `rows` (expanding a shared diff).
    pub fn each(&self, rows: usize) -> std::borrow::Cow<'_, [i64]> {
        match self {
            Diffs::Each(v) => std::borrow::Cow::Borrowed(v),
            Diffs::All(d) => std::borrow::Cow::Owned(vec![*d; rows]),
        }
    }

    /// Owned, one entry per row of `rows`.
    pub fn into_each(self, rows: usize) -> Vec<i64> {
        match self {
            Diffs::Each(v) => v,
            Diffs::All(d) => vec![d; rows],
        }
    }

    /// The diffs of rows `idx`.
    pub fn take(&self, idx: &[u32]) -> Diffs {
        match self {
            Diffs::Each(v) => Diffs::Each(
                idx.iter()
                    .map(|&i| v.get(i as usize).copied().unwrap_or(0))
                    .collect(),
            ),
            Diffs::All(d) => Diffs::All(*d),
        }
    }
}

/// A borrowed scalar read from a column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum S<'a> {
    Null,
    I(i64),
    F(f64),
    B(&'a [u8]),
}

impl S<'_> {
    pub fn is_null(&self) -> bool {
        matches!(self, S::Null)
    }
}

pub(crate) fn get(col: &Column, storage: Storage, i: usize) -> S<'_> {
    if col.is_null(i) {
        return S::Null;
    }
    match storage {
        Storage::Ints => col.ints.get(i).map_or(S::Null, |v| S::I(*v)),
        Storage::Floats => col.floats.get(i).map_or(S::Null, |v| S::F(*v)),
        Storage::Bytes => S::B(col.bytes_at(i)),
    }
}

/// Builds a column row by row. The null mask is only materialised once a null arrives (most
/// output columns have none), so a non-null integer costs one push.
pub(crate) struct ColBuilder {
    storage: Storage,
    col: Column,
    any_null: bool,
}

impl ColBuilder {
    pub fn new(ty: DataType, cap: usize) -> ColBuilder {
        let storage = ty.storage();
        let mut col = Column::default();
        match storage {
            Storage::Ints => col.ints.reserve(cap),
            Storage::Floats => col.floats.reserve(cap),
            Storage::Bytes => {
                col.offsets.reserve(cap + 1);
                col.offsets.push(0);
            }
        }
        ColBuilder {
            storage,
            col,
            any_null: false,
        }
    }

    /// Rows pushed so far.
    fn rows(&self) -> usize {
        match self.storage {
            Storage::Ints => self.col.ints.len(),
            Storage::Floats => self.col.floats.len(),
            Storage::Bytes => self.col.offsets.len().saturating_sub(1),
        }
    }

    #[inline(always)]
    pub fn push(&mut self, v: S<'_>) {
        match (self.storage, v) {
            (Storage::Ints, S::I(x)) if !self.any_null => self.col.ints.push(x),
            _ => self.push_any(v),
        }
    }

    fn push_any(&mut self, v: S<'_>) {
        match (self.storage, v) {
            (Storage::Ints, S::I(x)) => self.col.ints.push(x),
            (Storage::Ints, S::F(x)) => self.col.ints.push(x as i64),
            (Storage::Floats, S::F(x)) => self.col.floats.push(x),
            (Storage::Floats, S::I(x)) => self.col.floats.push(x as f64),
            (Storage::Bytes, S::B(b)) => {
                self.col.bytes.extend_from_slice(b);
                let off = self.col.bytes.len() as u32;
                self.col.offsets.push(off);
            }
            _ => return self.push_null(),
        }
        if self.any_null {
            self.col.nulls.push(0);
        }
    }

    pub fn push_null(&mut self) {
        if !self.any_null {
            self.any_null = true;
            let rows = self.rows();
            self.col.nulls.resize(rows, 0);
        }
        self.col.nulls.push(1);
        match self.storage {
            Storage::Ints => self.col.ints.push(0),
            Storage::Floats => self.col.floats.push(0.0),
            Storage::Bytes => {
                let off = self.col.bytes.len() as u32;
                self.col.offsets.push(off);
            }
        }
    }

    pub fn push_str(&mut self, s: &str) {
        self.push(S::B(s.as_bytes()));
    }

    pub fn finish(self) -> Column {
        self.col
    }
}

/// Gathers rows `idx` of a column.
pub(crate) fn take(col: &Column, storage: Storage, idx: &[u32]) -> Column {
    let mut out = Column::default();
    match storage {
        Storage::Ints => {
            out.ints = idx
                .iter()
                .map(|&i| col.ints.get(i as usize).copied().unwrap_or(0))
                .collect()
        }
        Storage::Floats => {
            out.floats = idx
                .iter()
                .map(|&i| col.floats.get(i as usize).copied().unwrap_or(0.0))
                .collect()
        }
        Storage::Bytes => {
            out.offsets.reserve(idx.len() + 1);
            out.offsets.push(0);
            for &i in idx {
                out.bytes.extend_from_slice(col.bytes_at(i as usize));
                out.offsets.push(out.bytes.len() as u32);
            }
        }
    }
    if !col.nulls.is_empty() {
        out.nulls = idx
            .iter()
            .map(|&i| col.nulls.get(i as usize).copied().unwrap_or(0))
            .collect();
        if out.nulls.iter().all(|n| *n == 0) {
            out.nulls = Vec::new();
        }
    }
    out
}

/// Entries `start..end` of `v`, copied as one range; those past its end
/// are the default (as [`take`] reads a missing entry).
pub(crate) fn range_of<T: Copy + Default>(v: &[T], start: usize, end: usize) -> Vec<T> {
    let mut out = v
        .get(start.min(v.len())..end.min(v.len()))
        .unwrap_or_default()
        .to_vec();
    out.resize(end.saturating_sub(start), T::default());
    out
}

/// Rows `start..end` of `col`, copied a range at a time: what [`take`] of
/// those rows gives, without reading them one by one.
pub(crate) fn slice(col: &Column, storage: Storage, start: usize, end: usize) -> Column {
    let rows = end.saturating_sub(start);
    let mut out = Column::default();
    match storage {
        Storage::Ints => out.ints = range_of(&col.ints, start, end),
        Storage::Floats => out.floats = range_of(&col.floats, start, end),
        Storage::Bytes => {
            let offsets = col.offsets.get(start..=end).unwrap_or_default();
            let first = offsets.first().map_or(0, |o| *o as usize);
            let last = offsets.last().map_or(0, |o| *o as usize);
            let ordered = offsets.windows(2).all(|w| w[0] <= w[1]);
            match col.bytes.get(first..last) {
                Some(bytes) if ordered && offsets.len() == rows + 1 => {
                    out.bytes = bytes.to_vec();
                    out.offsets = offsets.iter().map(|o| o - first as u32).collect();
                }
                // Offsets that are not one range of the bytes: row by row.
                _ => {
                    let idx: Vec<u32> = (start as u32..end as u32).collect();
                    return take(col, storage, &idx);
                }
            }
        }
    }
    if !col.nulls.is_empty() {
        out.nulls = range_of(&col.nulls, start, end);
        if out.nulls.iter().all(|n| *n == 0) {
            out.nulls = Vec::new();
        }
    }
    out
}

pub(crate) fn take_chunk(c: &Chunk, types: &[DataType], idx: &[u32]) -> Chunk {
    Chunk {
        rows: idx.len(),
        cols: c
            .cols
            .iter()
            .zip(types.iter())
            .map(|(col, t)| take(col, t.storage(), idx))
            .collect(),
        diffs: c.diffs.take(idx),
    }
}

/// A column of `n` copies of one scalar.
pub(crate) fn broadcast(v: S<'_>, ty: DataType, n: usize) -> Column {
    let mut col = Column::default();
    let null = v.is_null();
    match ty.storage() {
        Storage::Ints => {
            col.ints = vec![
                match v {
                    S::I(x) => x,
                    S::F(x) => x as i64,
                    _ => 0,
                };
                n
            ]
        }
        Storage::Floats => {
            col.floats = vec![
                match v {
                    S::F(x) => x,
                    S::I(x) => x as f64,
                    _ => 0.0,
                };
                n
            ]
        }
        Storage::Bytes => {
            let b: &[u8] = match v {
                S::B(b) => b,
                _ => &[],
            };
            col.bytes.reserve(b.len() * n);
            col.offsets.reserve(n + 1);
            col.offsets.push(0);
            for _ in 0..n {
                col.bytes.extend_from_slice(b);
                col.offsets.push(col.bytes.len() as u32);
            }
        }
    }
    if null {
        col.nulls = vec![1; n];
    }
    col
}

/// Appends all rows of `src` to `dst` (same type).
pub(crate) fn append(dst: &mut Column, src: &Column, storage: Storage, dst_rows: usize) {
    let src_rows = match storage {
        Storage::Ints => src.ints.len(),
        Storage::Floats => src.floats.len(),
        Storage::Bytes => src.offsets.len().saturating_sub(1),
    };
    if !src.nulls.is_empty() || !dst.nulls.is_empty() {
        if dst.nulls.is_empty() {
            dst.nulls = vec![0; dst_rows];
        }
        if src.nulls.is_empty() {
            dst.nulls.extend(std::iter::repeat_n(0u8, src_rows));
        } else {
            dst.nulls.extend_from_slice(&src.nulls);
        }
    }
    match storage {
        Storage::Ints => dst.ints.extend_from_slice(&src.ints),
        Storage::Floats => dst.floats.extend_from_slice(&src.floats),
        Storage::Bytes => {
            if dst.offsets.is_empty() {
                dst.offsets.push(0);
            }
            let base = dst.bytes.len() as u32;
            let start = src.offsets.first().copied().unwrap_or(0);
            let end = src.offsets.last().copied().unwrap_or(0);
            dst.bytes
                .extend_from_slice(src.bytes.get(start as usize..end as usize).unwrap_or(&[]));
            dst.offsets.extend(
                src.offsets
                    .iter()
                    .skip(1)
                    .map(|o| base.wrapping_add(o.wrapping_sub(start))),
            );
        }
    }
}

/// An empty column of a type (bytes columns get their leading 0 offset).
pub(crate) fn empty_column(ty: DataType) -> Column {
    let mut c = Column::default();
    if ty.storage() == Storage::Bytes {
        c.offsets.push(0);
    }
    c
}

/// Merges two null masks (either may be empty = no nulls).
pub(crate) fn or_nulls(a: &[u8], b: &[u8], n: usize) -> Vec<u8> {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => Vec::new(),
        (false, true) => a.to_vec(),
        (true, false) => b.to_vec(),
        (false, false) => (0..n)
            .map(|i| a.get(i).copied().unwrap_or(0) | b.get(i).copied().unwrap_or(0))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_is_what_taking_its_rows_gives() {
        let strings = Column {
            bytes: b"abcdefgh".to_vec(),
            offsets: vec![0, 1, 1, 4, 8],
            nulls: vec![0, 1, 0, 0],
            ..Column::default()
        };
        let ints = Column {
            ints: vec![5, -1, 7, 9],
            ..Column::default()
        };
        let floats = Column {
            floats: vec![0.5, 1.5, 2.5, 3.5],
            nulls: vec![0, 0, 0, 1],
            ..Column::default()
        };
        // Offsets out of order: not one range of the bytes.
        let malformed = Column {
            bytes: b"abcd".to_vec(),
            offsets: vec![0, 3, 1, 4, 4],
            ..Column::default()
        };
        for (col, storage) in [
            (&strings, Storage::Bytes),
            (&ints, Storage::Ints),
            (&floats, Storage::Floats),
            (&malformed, Storage::Bytes),
        ] {
            for start in 0..=4 {
                for end in start..=4 {
                    let idx: Vec<u32> = (start as u32..end as u32).collect();
                    assert_eq!(
                        slice(col, storage, start, end),
                        take(col, storage, &idx),
                        "rows {start}..{end} of {col:?}"
                    );
                }
            }
        }
    }
}
