//! Writes of an open transaction: staged, readable by that transaction, and
//! committed all together or not at all.
//!
//! A statement in a transaction block does not commit: its rows are encoded
//! into the stored keys and values they will have, and kept here. The
//! transaction reads its tables through [`Store::scan_staged`] (the committed
//! rows with its own writes laid over them), so it sees what it wrote; nobody
//! else does. COMMIT hands the staged writes to [`Store::commit`] as one
//! [`WriteSet`] entry, which applies them in one storage transaction and
//! publishes their diffs against whatever is committed at that moment;
//! ROLLBACK drops them. Reads are READ COMMITTED: each statement sees the
//! latest commit plus the transaction's own writes.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, BooleanArray};
use datafusion::arrow::record_batch::RecordBatch;

use super::codec::{self, RowDecoder};
use super::{conform_batch, readers, Snapshot, Space, Store, SCAN_BATCH_ROWS};
use crate::error::Result;
use crate::schema::{Table, TableId};

/// Visits one stored row (key, value).
type RowVisitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<()> + 'a;

/// What one transaction wrote to one table.
#[derive(Debug, Clone)]
pub(crate) struct StagedTable {
    pub(crate) table: Arc<Table>,
    /// Stored key → the value to write, or `None` to delete it.
    pub(crate) keys: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// New rows of an append-mode or `ttl = 'instant'` table: the key without
    /// its per-commit suffix, and the value (the suffix is given at commit).
    pub(crate) appends: Vec<(Vec<u8>, Vec<u8>)>,
    /// Keys of a `merge_mode = 'last_non_null'` table written after the
    /// transaction deleted them: at commit their values replace the stored
    /// ones instead of merging with them.
    pub(crate) fresh: std::collections::BTreeSet<Vec<u8>>,
}

/// The writes of an open transaction; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Staged {
    pub(crate) tables: BTreeMap<TableId, StagedTable>,
}

impl Staged {
    pub fn new() -> Staged {
        Staged::default()
    }

    /// Whether nothing has been written.
    pub fn is_empty(&self) -> bool {
        self.tables
            .values()
            .all(|t| t.keys.is_empty() && t.appends.is_empty())
    }

    /// Whether the transaction wrote to `table`.
    pub fn touches(&self, table: TableId) -> bool {
        self.tables
            .get(&table)
            .is_some_and(|t| !t.keys.is_empty() || !t.appends.is_empty())
    }

    fn table_mut(&mut self, table: &Arc<Table>) -> &mut StagedTable {
        self.tables
            .entry(table.id())
            .or_insert_with(|| StagedTable {
                table: table.clone(),
                keys: BTreeMap::new(),
                appends: Vec::new(),
                fresh: Default::default(),
            })
    }
}

impl Store {
    /// Stages an upsert of `batch` into `table` (see [`super::WriteSet::upsert`]
    /// for what the batch may look like); returns the rows written.
    pub fn stage_upsert(
        &self,
        staged: &mut Staged,
        table: &Arc<Table>,
        batch: &RecordBatch,
    ) -> Result<u64> {
        let batch = conform_batch(table, batch, false)?;
        let readers = readers(table, &batch);
        let append = table.schema().append_mode || table.instant();
        let target = staged.table_mut(table);
        for row in 0..batch.num_rows() {
            let mut key = Vec::with_capacity(64);
            let mut value = Vec::with_capacity(64);
            codec::encode_key(table, &readers, row, &mut key);
            codec::encode_value(table, &readers, row, &mut value);
            if append {
                target.appends.push((key, value));
            } else if table.last_non_null() {
                // Merged with what the transaction wrote before; with the
                // stored row at commit (unless the transaction deleted it).
                let value = match target.keys.get(&key) {
                    Some(Some(prev)) => codec::merge_last_non_null(table, prev, &value)?,
                    Some(None) => {
                        target.fresh.insert(key.clone());
                        value
                    }
                    None => value,
                };
                target.keys.insert(key, Some(value));
            } else {
                target.keys.insert(key, Some(value));
            }
        }
        Ok(batch.num_rows() as u64)
    }

    /// The rows of `table` as the transaction sees them: the committed ones
    /// with its staged writes laid over them.
    pub fn scan_staged(&self, table: &Arc<Table>, staged: &Staged) -> Result<Snapshot> {
        let Some(mine) = staged.tables.get(&table.id()) else {
            return self.scan(table);
        };
        let mut batches = Vec::new();
        let mut dec = RowDecoder::new(table, SCAN_BATCH_ROWS.min(1024));
        let seq = self.visit_staged(table, mine, &mut |k, v| {
            dec.push(k, v)?;
            if dec.len() >= SCAN_BATCH_ROWS {
                batches.push(dec.finish()?);
            }
            Ok(())
        })?;
        if dec.len() > 0 || batches.is_empty() {
            batches.push(dec.finish()?);
        }
        let batches = super::series_order(table, batches)?;
        Ok(Snapshot { seq, batches })
    }

    /// Stages the deletion of every row of `table`, as the transaction sees
    /// it, for which `predicate` is true (NULL counts as false). Returns how
    /// many rows it deletes.
    pub fn stage_delete_where(
        &self,
        staged: &mut Staged,
        table: &Arc<Table>,
        predicate: &mut dyn FnMut(&RecordBatch) -> Result<BooleanArray>,
    ) -> Result<u64> {
        // A table that keeps no rows has none to delete.
        if table.instant() {
            return Ok(0);
        }
        let mine = staged.tables.get(&table.id()).cloned();
        let empty = StagedTable {
            table: table.clone(),
            keys: BTreeMap::new(),
            appends: Vec::new(),
            fresh: Default::default(),
        };
        let view = mine.as_ref().unwrap_or(&empty);
        // Keys of the rows visible to the transaction, in chunks with their rows.
        let mut doomed: Vec<Vec<u8>> = Vec::new();
        let mut doomed_appends: Vec<usize> = Vec::new();
        let mut keys: Vec<Vec<u8>> = Vec::new();
        let mut dec = RowDecoder::new(table, SCAN_BATCH_ROWS.min(1024));
        let mut take = |dec: &mut RowDecoder,
                        keys: &mut Vec<Vec<u8>>,
                        doomed: &mut Vec<Vec<u8>>|
         -> Result<()> {
            if keys.is_empty() {
                return Ok(());
            }
            let mask = predicate(&dec.finish()?)?;
            for (i, k) in keys.drain(..).enumerate() {
                if mask.is_valid(i) && mask.value(i) {
                    doomed.push(k);
                }
            }
            Ok(())
        };
        // Committed rows and staged keys (not the staged appends, which have no
        // key yet: they are matched by position below).
        let without_appends = StagedTable {
            appends: Vec::new(),
            ..view.clone()
        };
        self.visit_staged(table, &without_appends, &mut |k, v| {
            dec.push(k, v)?;
            keys.push(k.to_vec());
            if keys.len() >= SCAN_BATCH_ROWS {
                take(&mut dec, &mut keys, &mut doomed)?;
            }
            Ok(())
        })?;
        take(&mut dec, &mut keys, &mut doomed)?;
        if !view.appends.is_empty() {
            let mut dec = RowDecoder::new(table, view.appends.len());
            for (k, v) in &view.appends {
                dec.push(k, v)?;
            }
            let mask = predicate(&dec.finish()?)?;
            for i in 0..view.appends.len() {
                if mask.is_valid(i) && mask.value(i) {
                    doomed_appends.push(i);
                }
            }
        }
        let deleted = (doomed.len() + doomed_appends.len()) as u64;
        let target = staged.table_mut(table);
        for k in doomed {
            target.keys.insert(k, None);
        }
        for i in doomed_appends.into_iter().rev() {
            target.appends.remove(i);
        }
        Ok(deleted)
    }

    /// Visits the rows of `table` that a transaction with `mine` staged sees,
    /// in key order (staged appends last), and returns the commit sequence of
    /// the committed rows it read.
    fn visit_staged(
        &self,
        table: &Arc<Table>,
        mine: &StagedTable,
        visit: &mut RowVisitor<'_>,
    ) -> Result<u64> {
        let txn = self.kv.begin_read()?;
        let seq = super::read_seq(txn.as_ref())?;
        let mut staged = mine.keys.iter().peekable();
        let mut failure = None;
        if !table.instant() {
            txn.scan(Space::Table(table.id()), &[], &mut |k, v| {
                let step = (|| {
                    // Staged keys before this one that nothing committed has.
                    while let Some((sk, sv)) = staged.peek() {
                        if sk.as_slice() >= k {
                            break;
                        }
                        if let Some(sv) = sv {
                            visit(sk, sv)?;
                        }
                        staged.next();
                    }
                    match staged.peek() {
                        Some((sk, sv)) if sk.as_slice() == k => {
                            if let Some(sv) = sv {
                                visit(sk, sv)?;
                            }
                            staged.next();
                        }
                        _ => visit(k, v)?,
                    }
                    Ok(())
                })();
                match step {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        failure = Some(e);
                        Ok(false)
                    }
                }
            })?;
        }
        if let Some(e) = failure {
            return Err(e);
        }
        for (sk, sv) in staged {
            if let Some(sv) = sv {
                visit(sk, sv)?;
            }
        }
        if !table.instant() {
            for (k, v) in &mine.appends {
                visit(k, v)?;
            }
        }
        Ok(seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{ColumnSchema, ColumnType};
    use crate::storage::WriteSet;
    use datafusion::arrow::array::{Int64Array, StringArray, TimestampMillisecondArray};

    fn setup(append: bool) -> (tempfile::TempDir, Arc<Store>, Arc<Table>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let columns = vec![
            ColumnSchema::new("k", ColumnType::String, true),
            ColumnSchema::new("v", ColumnType::Int64, true),
            ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
        ];
        let t = crate::storage::test_table(&store, 1, columns, append);
        (dir, store, t)
    }

    /// ALTER TABLE's guard: a rewrite read before another write lands is
    /// refused; once a rewrite commits, writes made with the old layout are.
    #[test]
    fn relayout_refuses_stale_rewrites_and_old_layout_writes() {
        let (_dir, store, t) = setup(false);
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch(&t, &[("a", 1)]));
        store.commit(set).unwrap();
        let read = store.scan(&t).unwrap().seq;
        let mut info = t.info.clone();
        info.version = 1;
        let t2 = Table::new(info);
        // A write lands after the rewrite read the rows.
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch(&t, &[("b", 2)]));
        store.commit(set).unwrap();
        let rewrite = |read_seq: u64| {
            let mut set = WriteSet::new();
            set.upsert(t2.clone(), batch(&t2, &[("a", 1)]));
            set.relayout(t2.id(), 1, read_seq);
            store.commit(set)
        };
        let e = rewrite(read).unwrap_err();
        assert!(matches!(e, crate::error::Error::Conflict { .. }), "{e}");
        rewrite(store.scan(&t).unwrap().seq).unwrap();
        // The old layout is refused from now on; the new one is taken.
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch(&t, &[("c", 3)]));
        let e = store.commit(set).unwrap_err();
        assert!(e.to_string().contains("run the statement again"), "{e}");
        let mut set = WriteSet::new();
        set.upsert(t2.clone(), batch(&t2, &[("c", 3)]));
        store.commit(set).unwrap();
        assert_eq!(
            rows(&store.scan(&t2).unwrap()),
            vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
        );
    }

    fn batch(t: &Table, rows: &[(&str, i64)]) -> RecordBatch {
        RecordBatch::try_new(
            t.arrow_schema.clone(),
            vec![
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(TimestampMillisecondArray::from(vec![0; rows.len()])),
            ],
        )
        .unwrap()
    }

    fn rows(snapshot: &Snapshot) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for b in &snapshot.batches {
            let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            for i in 0..b.num_rows() {
                out.push((k.value(i).to_string(), v.value(i)));
            }
        }
        out.sort();
        out
    }

    fn pairs(v: &[(&str, i64)]) -> Vec<(String, i64)> {
        v.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn commit(store: &Store, staged: Staged) {
        let mut set = WriteSet::new();
        set.staged(staged);
        store.commit(set).unwrap();
    }

    #[test]
    fn the_transaction_sees_its_writes_and_nobody_else_until_commit() {
        let (_dir, store, t) = setup(false);
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch(&t, &[("a", 1), ("b", 2)]));
        store.commit(set).unwrap();
        let (mut feed, _) = crate::storage::ChangeFeed::open(&store, t.clone(), false).unwrap();

        let mut staged = Staged::new();
        store
            .stage_upsert(&mut staged, &t, &batch(&t, &[("a", 10), ("c", 3)]))
            .unwrap();
        let gone = store
            .stage_delete_where(&mut staged, &t, &mut |b| {
                let k = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                Ok(k.iter().map(|k| Some(k == Some("b"))).collect())
            })
            .unwrap();
        assert_eq!(gone, 1);
        assert_eq!(
            rows(&store.scan_staged(&t, &staged).unwrap()),
            pairs(&[("a", 10), ("c", 3)])
        );
        // Others still see the committed rows.
        assert_eq!(rows(&store.scan(&t).unwrap()), pairs(&[("a", 1), ("b", 2)]));
        assert!(feed.try_recv().is_err());

        commit(&store, staged);
        assert_eq!(
            rows(&store.scan(&t).unwrap()),
            pairs(&[("a", 10), ("c", 3)])
        );
        // One change, its diffs against what was committed: -a1 +a10 -b2 +c3.
        let change = feed.try_recv().unwrap();
        assert_eq!(change.diffs.iter().sum::<i64>(), 0);
        assert_eq!(change.diffs.len(), 4);
        assert!(feed.try_recv().is_err());
    }

    #[test]
    fn rolled_back_writes_leave_nothing() {
        let (_dir, store, t) = setup(false);
        let mut staged = Staged::new();
        store
            .stage_upsert(&mut staged, &t, &batch(&t, &[("a", 1)]))
            .unwrap();
        assert!(staged.touches(t.id()));
        drop(staged);
        assert!(rows(&store.scan(&t).unwrap()).is_empty());
    }

    #[test]
    fn append_mode_rows_are_kept_and_deleted_by_the_transaction() {
        let (_dir, store, t) = setup(true);
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch(&t, &[("a", 1)]));
        store.commit(set).unwrap();
        let mut staged = Staged::new();
        store
            .stage_upsert(&mut staged, &t, &batch(&t, &[("a", 1), ("a", 2), ("b", 3)]))
            .unwrap();
        assert_eq!(
            rows(&store.scan_staged(&t, &staged).unwrap()),
            pairs(&[("a", 1), ("a", 1), ("a", 2), ("b", 3)])
        );
        // Deletes both a committed row and a staged one.
        let gone = store
            .stage_delete_where(&mut staged, &t, &mut |b| {
                let v = b.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                Ok(v.iter().map(|v| Some(v == Some(1))).collect())
            })
            .unwrap();
        assert_eq!(gone, 2);
        commit(&store, staged);
        assert_eq!(rows(&store.scan(&t).unwrap()), pairs(&[("a", 2), ("b", 3)]));
    }
}
