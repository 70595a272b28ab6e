//! The durable change log of the tables somebody reads (flows, library
//! feeds), and how readers pull from it.
//!
//! A commit that changes a table with at least one live [`LogReader`]
//! appends one entry to the table's log space, keyed by the commit sequence
//! (8 bytes, big endian), in the same transaction; then it wakes the
//! readers (a call, no data). Readers pull the entries after their
//! [`Position`] one part (at most [`PART_ROWS`] changes) at a time, in a read
//! transaction: a writer never waits for a reader, and a reader that does not
//! read costs nothing but its log on disk. Entries every reader has behind
//! its `keep_from` position are trimmed by [`Store::trim_logs`].
//!
//! A new reader that wants the table's current rows too (a flow's back-fill)
//! gets a [`TableCursor`]: a read transaction taken at the commit where its
//! log starts, read part by part.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use datafusion::arrow::record_batch::RecordBatch;
pub use sandflow_flows::{Position, PART_ROWS};

use super::codec::RowDecoder;
use super::kv::{KvReadTxn, Space};
use super::{poisoned, ChangeBatch, ReadView, Store};
use crate::error::{Result, StorageSnafu};
use crate::schema::{Table, TableId};

/// Wakes a reader: a commit with this sequence changed its table.
pub type Wake = Box<dyn Fn(u64) + Send + Sync>;

/// One reader of one table's change log. Dropping the last `Arc` of it
/// unregisters it; a table without readers is no longer logged.
pub struct LogReader {
    table: TableId,
    /// The log may be trimmed up to here, as far as this reader is concerned.
    keep_from: Mutex<Position>,
    /// Set when the table is dropped: nothing more will come.
    closed: AtomicBool,
    wake: Wake,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("table", &self.table)
            .field("keep_from", &self.keep_from())
            .finish_non_exhaustive()
    }
}

impl LogReader {
    /// Entries at or before `p` are no longer needed by this reader.
    pub fn keep_from_position(&self, p: Position) {
        if let Ok(mut k) = self.keep_from.lock() {
            *k = (*k).max(p);
        }
    }

    /// The table this reader reads.
    pub fn table(&self) -> TableId {
        self.table
    }

    pub fn keep_from(&self) -> Position {
        self.keep_from.lock().map(|k| *k).unwrap_or_default()
    }

    /// Whether the table was dropped.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(super) fn wake(&self, seq: u64) {
        (self.wake)(seq)
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        (self.wake)(0)
    }
}

/// What [`Store::follow`] hands over.
pub struct Following {
    /// The last commit before the readers were registered: their logs start
    /// after it.
    pub seq: u64,
    /// One reader per table, in the order asked.
    pub readers: Vec<Arc<LogReader>>,
    /// Per table, its rows at `seq` (when asked for).
    pub cursors: Vec<Option<TableCursor>>,
}

/// One part of a table's changes.
#[derive(Debug, Clone)]
pub struct LogPart {
    /// The changes, as a batch in the table's schema with one diff per row.
    pub change: ChangeBatch,
    /// The position after this part.
    pub end: Position,
}

/// A table's rows at one commit, read part by part (a flow's back-fill).
pub struct TableCursor {
    txn: Box<dyn KvReadTxn>,
    table: TableId,
    /// The last key returned.
    last: Option<Vec<u8>>,
    done: bool,
}

impl std::fmt::Debug for TableCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableCursor")
            .field("table", &self.table)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl TableCursor {
    /// The next (at most [`PART_ROWS`]) rows and whether they are the last;
    /// `None` once everything was returned. The read transaction is released
    /// with the last part.
    pub fn next_part(&mut self, table: &Table) -> Result<Option<(RecordBatch, bool)>> {
        if self.done {
            return Ok(None);
        }
        let mut dec = RowDecoder::new(table, PART_ROWS.min(1024));
        let mut failure = None;
        let mut more = false;
        // The key of the last row taken, kept in one buffer (not a copy per row).
        let mut last: Vec<u8> = Vec::new();
        let start = self.last.clone().unwrap_or_default();
        let skip_first = self.last.is_some();
        let mut first = true;
        self.txn
            .scan(Space::Table(self.table), &start, &mut |k, v| {
                if std::mem::take(&mut first) && skip_first && k == start.as_slice() {
                    return Ok(true);
                }
                if dec.len() >= PART_ROWS {
                    more = true;
                    return Ok(false);
                }
                if let Err(e) = dec.push(k, v) {
                    failure = Some(e);
                    return Ok(false);
                }
                last.clear();
                last.extend_from_slice(k);
                Ok(true)
            })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if dec.len() > 0 {
            self.last = Some(last);
        }
        let batch = dec.finish()?;
        if !more {
            self.done = true;
            // Nothing more to read: let the engine reclaim what the snapshot pinned.
            self.txn = Box::new(Released);
        }
        Ok(Some((batch, !more)))
    }
}

/// What a finished cursor holds instead of its read transaction.
struct Released;

impl KvReadTxn for Released {
    fn get(&self, _: Space, _: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(None)
    }
    fn scan(&self, _: Space, _: &[u8], _: &mut super::kv::Visitor<'_>) -> Result<()> {
        Ok(())
    }
}

/// Registered readers, per table.
pub(super) type Readers = std::collections::HashMap<TableId, Vec<Weak<LogReader>>>;

/// Whether `table` has a live reader (and so is logged).
pub(super) fn has_readers(readers: &Readers, table: TableId) -> bool {
    readers
        .get(&table)
        .is_some_and(|v| v.iter().any(|r| r.strong_count() > 0))
}

/// Wakes the live readers of `table`, forgetting dead ones.
pub(super) fn wake(readers: &mut Readers, table: TableId, seq: u64) {
    if let Some(v) = readers.get_mut(&table) {
        v.retain(|r| match r.upgrade() {
            Some(r) => {
                r.wake(seq);
                true
            }
            None => false,
        });
        if v.is_empty() {
            readers.remove(&table);
        }
    }
}

impl Store {
    /// Registers one reader per table, all at the same commit (under the
    /// commit lock, so that nothing is missed or seen twice): from the next
    /// commit on, every change to those tables is logged and wakes the
    /// reader. `make(i)` gives the wake-up of `tables[i]`'s reader;
    /// `keep_from[i]` (default: the current commit) is where its log must be
    /// kept from (a restored flow's snapshot). With `cursors`, each table's
    /// current rows can be read too (at the same commit).
    pub fn follow(
        &self,
        tables: &[Arc<Table>],
        keep_from: Option<&[Position]>,
        cursors: bool,
        make: &mut dyn FnMut(usize) -> Wake,
    ) -> Result<Following> {
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        let seq = state.last_seq;
        let mut out = Following {
            seq,
            readers: Vec::with_capacity(tables.len()),
            cursors: Vec::with_capacity(tables.len()),
        };
        for (i, t) in tables.iter().enumerate() {
            let keep = keep_from
                .and_then(|k| k.get(i).copied())
                .unwrap_or(Position::after_commit(seq));
            let reader = Arc::new(LogReader {
                table: t.id(),
                keep_from: Mutex::new(keep),
                closed: AtomicBool::new(false),
                wake: make(i),
            });
            state
                .readers
                .entry(t.id())
                .or_default()
                .push(Arc::downgrade(&reader));
            state.logs.insert(t.id());
            out.readers.push(reader);
            out.cursors.push(if cursors {
                Some(TableCursor {
                    txn: self.kv.begin_read()?,
                    table: t.id(),
                    last: None,
                    done: false,
                })
            } else {
                None
            });
        }
        Ok(out)
    }

    /// The part of `table`'s logged changes right after `after`, or `None`
    /// when there is none yet. A commit's changes are split into parts of
    /// [`PART_ROWS`]: part 0 first; the last part ends at
    /// [`Position::after_commit`].
    pub fn read_log_part(&self, table: &Table, after: Position) -> Result<Option<LogPart>> {
        self.view()?.read_log_part(table, after)
    }

    /// Trims every change log up to where all its readers are past, and
    /// drops the logs of tables nobody reads any more. Finds what to trim in
    /// a read transaction; takes only the engine's write lock to delete.
    pub fn trim_logs(&self) -> Result<()> {
        self.trim(None)
    }

    /// Trims the change logs of `tables` only, up to where all their readers
    /// are past (a reader that moved on: only its tables can shrink).
    pub fn trim_logs_of(&self, tables: &[TableId]) -> Result<()> {
        self.trim(Some(tables))
    }

    fn trim(&self, only: Option<&[TableId]>) -> Result<()> {
        let (trim, gone) = {
            let mut state = self.state.lock().map_err(|_| poisoned())?;
            let mut trim: Vec<(TableId, Position)> = Vec::new();
            let mut gone: Vec<TableId> = Vec::new();
            let tables: Vec<TableId> = match only {
                Some(only) => only
                    .iter()
                    .copied()
                    .filter(|t| state.logs.contains(t))
                    .collect(),
                None => state.logs.iter().copied().collect(),
            };
            for t in tables {
                let live: Vec<Arc<LogReader>> = state
                    .readers
                    .get(&t)
                    .map(|v| v.iter().filter_map(Weak::upgrade).collect())
                    .unwrap_or_default();
                if live.is_empty() {
                    state.readers.remove(&t);
                    state.logs.remove(&t);
                    gone.push(t);
                } else if let Some(min) = live.iter().map(|r| r.keep_from()).min() {
                    trim.push((t, min));
                }
            }
            (trim, gone)
        };
        let txn = self.kv.begin_read()?;
        let mut doomed: Vec<(TableId, Vec<Vec<u8>>)> = Vec::new();
        for (t, keep) in trim {
            // Whole commits before `keep` (and `keep`'s own when it is complete).
            let upto = match keep.part {
                u32::MAX => keep.seq,
                _ => keep.seq.saturating_sub(1),
            };
            let mut keys = Vec::new();
            txn.scan(
                Space::Log(t),
                &[],
                &mut |k, _| match <[u8; 8]>::try_from(k) {
                    Ok(b) if u64::from_be_bytes(b) <= upto => {
                        keys.push(k.to_vec());
                        Ok(true)
                    }
                    Ok(_) => Ok(false),
                    Err(_) => Ok(true),
                },
            )?;
            if !keys.is_empty() {
                doomed.push((t, keys));
            }
        }
        drop(txn);
        if doomed.is_empty() && gone.is_empty() {
            return Ok(());
        }
        if !doomed.is_empty() {
            // Without the commit lock: only whole commits before every
            // reader's position go, and the log only grows at its end.
            let mut txn = self.kv.begin_write()?;
            for (t, keys) in &doomed {
                txn.space(Space::Log(*t), &mut |space| {
                    for k in keys {
                        space.delete(k)?;
                    }
                    Ok(())
                })?;
            }
            txn.commit()?;
        }
        if !gone.is_empty() {
            // In the commit's lock order (state, then the engine), so that a
            // reader registered meanwhile keeps its log.
            let state = self.state.lock().map_err(|_| poisoned())?;
            let gone: Vec<TableId> = gone
                .into_iter()
                .filter(|t| !has_readers(&state.readers, *t))
                .collect();
            if !gone.is_empty() {
                let mut txn = self.kv.begin_write()?;
                for t in &gone {
                    txn.drop_space(Space::Log(*t))?;
                }
                txn.commit()?;
            }
        }
        Ok(())
    }

    /// Entries in `table`'s log (for tests and diagnostics).
    pub fn log_len(&self, table: TableId) -> Result<usize> {
        let txn = self.kv.begin_read()?;
        let mut n = 0;
        txn.scan(Space::Log(table), &[], &mut |_, _| {
            n += 1;
            Ok(true)
        })?;
        Ok(n)
    }
}

impl ReadView {
    /// [`Store::read_log_part`] in this view.
    pub fn read_log_part(&self, table: &Table, after: Position) -> Result<Option<LogPart>> {
        let txn = &self.txn;
        let (start, part) = if after.part == u32::MAX {
            (after.seq.saturating_add(1), 0u32)
        } else {
            (after.seq, after.part.saturating_add(1))
        };
        // Decoded where it lies: a commit's entry may be large, and only one
        // part of it is wanted.
        let mut found: Option<Result<(Position, ChangeBatch, bool)>> = None;
        txn.scan(Space::Log(table.id()), &start.to_be_bytes(), &mut |k, v| {
            let Ok(b) = <[u8; 8]>::try_from(k) else {
                return Ok(true);
            };
            let seq = u64::from_be_bytes(b);
            // The rest of `after.seq` (a later part), or the next commit from its start.
            let at = Position {
                seq,
                part: if seq == after.seq { part } else { 0 },
            };
            found = Some(decode_part(table, seq, v, at.part).map(|(c, last)| (at, c, last)));
            Ok(false)
        })?;
        let Some(found) = found else {
            return Ok(None);
        };
        let (at, change, last) = found?;
        let end = if last {
            Position::after_commit(at.seq)
        } else {
            at
        };
        Ok(Some(LogPart { change, end }))
    }
}

fn corrupt() -> crate::Error {
    StorageSnafu {
        message: "corrupt change log entry".to_string(),
    }
    .build()
}

/// Part `part` of a log entry (see `encode_log`), and whether it is the last.
fn decode_part(table: &Table, seq: u64, bytes: &[u8], part: u32) -> Result<(ChangeBatch, bool)> {
    let mut pos = 0usize;
    let mut take = |n: usize| -> Result<&[u8]> {
        let end = pos.checked_add(n).ok_or_else(corrupt)?;
        let s = bytes.get(pos..end).ok_or_else(corrupt)?;
        pos = end;
        Ok(s)
    };
    let u32_of = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let count = u32_of(take(4)?);
    let from = (part as usize).saturating_mul(PART_ROWS).min(count);
    let to = from.saturating_add(PART_ROWS).min(count);
    let mut dec = RowDecoder::new(table, to - from);
    let mut diffs = Vec::with_capacity(to - from);
    for i in 0..to {
        let kl = u32_of(take(4)?);
        let k = take(kl)?;
        let vl = u32_of(take(4)?);
        let v = take(vl)?;
        let d = take(8)?;
        if i >= from {
            let d = i64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
            dec.push(k, v)?;
            diffs.push(d);
        }
    }
    Ok((
        ChangeBatch {
            table_id: table.id(),
            seq,
            batch: dec.finish()?,
            diffs,
        },
        to >= count,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::WriteSet;
    use datafusion::arrow::array::{Int64Array, TimestampMillisecondArray};

    fn setup() -> (Arc<Store>, Arc<Table>) {
        let store = Arc::new(Store::in_memory().unwrap());
        let t = crate::storage::test_table(&store, 7, crate::storage::tests::key_and_time(), false);
        (store, t)
    }

    fn insert(store: &Store, t: &Arc<Table>, keys: std::ops::Range<i64>) -> u64 {
        let n = keys.clone().count();
        let batch = RecordBatch::try_new(
            t.arrow_schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(keys)),
                Arc::new(TimestampMillisecondArray::from(vec![0; n])),
            ],
        )
        .unwrap();
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch);
        store.commit(set).unwrap().seq
    }

    fn keys(b: &RecordBatch) -> Vec<i64> {
        let a = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
        a.values().to_vec()
    }

    #[test]
    fn a_large_commit_is_read_in_parts_from_any_position() {
        let (store, t) = setup();
        // Rows before the reader: its back-fill, read in parts at that commit.
        insert(&store, &t, 0..10_000);
        let mut f = store
            .follow(std::slice::from_ref(&t), None, true, &mut |_| {
                Box::new(|_| {})
            })
            .unwrap();
        let mut cursor = f.cursors.pop().flatten().unwrap();
        let (a, last_a) = cursor.next_part(&t).unwrap().unwrap();
        let (b, last_b) = cursor.next_part(&t).unwrap().unwrap();
        assert_eq!(
            (a.num_rows(), last_a, b.num_rows(), last_b),
            (PART_ROWS, false, 10_000 - PART_ROWS, true)
        );
        assert_eq!(
            keys(&b)[0],
            PART_ROWS as i64,
            "the second part goes on after the first"
        );
        assert!(cursor.next_part(&t).unwrap().is_none());
        // Not logged: the commit before the reader.
        let start = Position::after_commit(f.seq);
        assert!(store.read_log_part(&t, start).unwrap().is_none());

        // A commit of 20,000 changes after it: three parts.
        let seq = insert(&store, &t, 100_000..120_000);
        let p0 = store.read_log_part(&t, start).unwrap().unwrap();
        assert_eq!(p0.end, Position { seq, part: 0 });
        assert_eq!(p0.change.batch.num_rows(), PART_ROWS);
        let p1 = store.read_log_part(&t, p0.end).unwrap().unwrap();
        assert_eq!(p1.end, Position { seq, part: 1 });
        let p2 = store.read_log_part(&t, p1.end).unwrap().unwrap();
        assert_eq!(p2.end, Position::after_commit(seq));
        assert_eq!(p2.change.batch.num_rows(), 20_000 - 2 * PART_ROWS);
        let mut all = keys(&p0.change.batch);
        all.extend(keys(&p1.change.batch));
        all.extend(keys(&p2.change.batch));
        assert_eq!(
            all,
            (100_000..120_000).collect::<Vec<_>>(),
            "every change once, in order"
        );
        assert!(store.read_log_part(&t, p2.end).unwrap().is_none());
        // A reader that stopped inside the commit (a restart) goes on from there.
        let again = store
            .read_log_part(&t, Position { seq, part: 1 })
            .unwrap()
            .unwrap();
        assert_eq!(keys(&again.change.batch), keys(&p2.change.batch));

        // Trimming keeps what the reader has not passed, then drops it.
        let reader = f.readers.pop().unwrap();
        assert_eq!(store.log_len(t.id()).unwrap(), 1);
        reader.keep_from_position(p1.end);
        store.trim_logs().unwrap();
        assert_eq!(store.log_len(t.id()).unwrap(), 1, "inside the commit: kept");
        reader.keep_from_position(p2.end);
        store.trim_logs().unwrap();
        assert_eq!(store.log_len(t.id()).unwrap(), 0);
        // No reader left: the table is no longer logged.
        drop(reader);
        store.trim_logs().unwrap();
        insert(&store, &t, 0..5);
        assert_eq!(store.log_len(t.id()).unwrap(), 0);
    }
}
