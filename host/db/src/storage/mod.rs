//! Durable storage of table rows and metadata, with a change feed.
//!
//! Layers, bottom up:
//! * [`kv`]: the engine interface (ordered key spaces, atomic durable
//!   transactions); [`redb`](self::redb) implements it.
//! * [`codec`]: rows ⇄ (key, value) bytes; keys sort by (time, primary key).
//! * [`Store`]: table semantics on top — upsert by (primary key, time index)
//!   or append, deletes, consistent scans, metadata entries.
//! * [`log`]: the durable change log of the tables somebody reads, pulled
//!   by position; [`feed`]: a library subscriber's feed over it.
//!
//! Must not know SQL, flows or DataFusion's planning: it stores the tables
//! the catalog describes and the metadata entries upper layers give it.

pub(crate) mod codec;
pub mod feed;
pub mod kv;
pub mod log;
pub mod redb;
mod staged;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{new_null_array, Array, ArrayRef, BooleanArray};
use datafusion::arrow::compute::{cast_with_options, CastOptions};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{InternalSnafu, InvalidDataSnafu, Result};
use crate::schema::{ColumnType, Table, TableId};
use codec::{ColumnReader, RowDecoder};
pub use feed::{ChangeFeed, TryRecvError};
pub use kv::{KvReadTxn, KvSpace, KvStorage, KvWriteTxn, Space};
pub use log::{Following, LogPart, LogReader, Position, TableCursor, PART_ROWS};
pub use staged::Staged;
use staged::StagedTable;

/// Meta key holding the sequence number of the last commit.
const COMMIT_SEQ_KEY: &[u8] = b"store/commit_seq";
/// Rows per batch produced by scans and feeds.
const SCAN_BATCH_ROWS: usize = 8192;

/// One committed change to one table, as diff rows: `+1` insert, `-1` delete;
/// a replacing upsert is `-old` then `+new`. Read from the change log, so
/// only after the commit is durable, in commit order.
#[derive(Debug, Clone)]
pub struct ChangeBatch {
    pub table_id: TableId,
    /// The commit sequence number of the transaction that made the change.
    pub seq: u64,
    /// Full rows in the table's schema.
    pub batch: RecordBatch,
    /// One diff per row of `batch`.
    pub diffs: Vec<i64>,
}

/// A table's contents at one commit: every later change has a larger `seq`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub seq: u64,
    pub batches: Vec<RecordBatch>,
}

/// The rows of a table a scan reads: those whose stored key is at or after
/// `start`, starts with `prefix` and is before `end` (no bound when None),
/// and, with `series` = (offset, bytes), holds `bytes` from `offset` on
/// (`codec::series_prefix`: the rows of one series of a table keyed by
/// time first, picked out of the range without decoding the others). The
/// default is every row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub prefix: Vec<u8>,
    pub end: Option<Vec<u8>>,
    pub series: Option<(usize, Vec<u8>)>,
}

impl KeyRange {
    /// The rows whose key starts with `prefix` (`codec::key_prefix`: the
    /// rows whose first key columns have given values).
    pub fn prefix(prefix: Vec<u8>) -> KeyRange {
        KeyRange {
            start: prefix.clone(),
            prefix,
            end: None,
            series: None,
        }
    }
}

/// Puts rows read in key order into series order: by primary key, then
/// time (NULLs first, strings and binary by bytes, floats in total
/// order), as GreptimeDB scans return them and as tables that key by
/// primary key first are stored. A table keyed by time first
/// (`TableInfo::time_first`) is sorted here, so that a scan's order does
/// not depend on the layout; others are returned as they are.
fn series_order(table: &Table, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    use datafusion::arrow::compute::{concat_batches, lexsort_to_indices, take_record_batch};
    use datafusion::arrow::compute::{SortColumn, SortOptions};
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let schema = table.schema();
    if !table.info.time_first || rows <= 1 || table.key_columns.len() <= 1 {
        return Ok(batches);
    }
    let fail = |e: datafusion::arrow::error::ArrowError| {
        InternalSnafu {
            message: format!("cannot order the scanned rows: {e}"),
        }
        .build()
    };
    let all = concat_batches(&table.arrow_schema, &batches).map_err(fail)?;
    let options = Some(SortOptions {
        descending: false,
        nulls_first: true,
    });
    let mut columns: Vec<SortColumn> = schema
        .primary_key
        .iter()
        .chain(std::iter::once(&schema.time_index))
        .map(|&c| SortColumn {
            values: all.column(c).clone(),
            options,
        })
        .collect();
    // Equal keys (append mode) keep their stored order (commit, row).
    if schema.append_mode {
        let position: ArrayRef = Arc::new(datafusion::arrow::array::UInt32Array::from_iter_values(
            0..rows as u32,
        ));
        columns.push(SortColumn {
            values: position,
            options,
        });
    }
    let indices = lexsort_to_indices(&columns, None).map_err(fail)?;
    let sorted = take_record_batch(&all, &indices).map_err(fail)?;
    Ok((0..rows)
        .step_by(SCAN_BATCH_ROWS)
        .map(|at| sorted.slice(at, SCAN_BATCH_ROWS.min(rows - at)))
        .collect())
}

/// A change to metadata, committed atomically with the rest of a transaction.
#[derive(Debug, Clone)]
pub enum MetaWrite {
    Put(String, Vec<u8>),
    /// A value made while the commit writes the rest (see [`LateValue`]).
    PutLate(String, LateValue),
    Delete(String),
    /// Creates the (empty) key space of a new table.
    CreateTable(TableId),
    /// Removes a table's key space and rows.
    DropTable(TableId),
}

/// A metadata value made while the commit that carries it writes the rest:
/// the commit calls `make` under the commit lock, after the set's rows, and
/// waits for it. A flow's snapshot is one: the guest serialises its state
/// while its sink rows go into storage, and both still commit together.
/// `make` runs once, however many attempts the commit takes; its error
/// refuses the commit. It must not wait for anything that commits.
#[derive(Clone)]
pub struct LateValue(Arc<LateInner>);

type MakeValue = Box<dyn FnOnce() -> std::result::Result<Vec<u8>, String> + Send>;

struct LateInner {
    make: Mutex<Option<MakeValue>>,
    made: std::sync::OnceLock<std::result::Result<Vec<u8>, String>>,
}

impl LateValue {
    pub fn new(
        make: impl FnOnce() -> std::result::Result<Vec<u8>, String> + Send + 'static,
    ) -> LateValue {
        LateValue(Arc::new(LateInner {
            make: Mutex::new(Some(Box::new(make))),
            made: std::sync::OnceLock::new(),
        }))
    }

    /// The value, made now if it was not yet.
    fn get(&self) -> Result<&[u8]> {
        let made = self.0.made.get_or_init(|| {
            let make = self.0.make.lock().ok().and_then(|mut m| m.take());
            match make {
                Some(make) => make(),
                None => Err("the value was lost".to_string()),
            }
        });
        match made {
            Ok(v) => Ok(v),
            Err(message) => crate::error::FlowSnafu {
                message: message.clone(),
            }
            .fail(),
        }
    }
}

impl std::fmt::Debug for LateValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.0.made.get() {
            None => "pending",
            Some(Ok(_)) => "made",
            Some(Err(_)) => "failed",
        };
        f.debug_tuple("LateValue").field(&state).finish()
    }
}

#[derive(Debug, Clone)]
enum RowOp {
    /// With the rows' keys when they were encoded ahead ([`PreparedUpsert`]).
    Upsert(Arc<Table>, RecordBatch, Option<RowKeys>),
    Delete(Arc<Table>, RecordBatch),
    /// A transaction's staged writes to one table (see [`Staged`]).
    Staged(StagedTable),
}

impl RowOp {
    fn table(&self) -> &Arc<Table> {
        match self {
            RowOp::Upsert(t, _, _) | RowOp::Delete(t, _) => t,
            RowOp::Staged(s) => &s.table,
        }
    }
}

/// A set of writes committed as ONE storage transaction: row upserts and
/// deletes on any number of tables plus metadata entries (e.g. a flow's
/// state blob and its source positions).
#[derive(Clone, Default)]
pub struct WriteSet {
    rows: Vec<RowOp>,
    meta: Vec<MetaWrite>,
    fences: Vec<Fence>,
    /// An ALTER TABLE's rewrite: the table, its new layout version, and
    /// the commit its rows were read at (see [`WriteSet::relayout`]).
    relayout: Option<(TableId, u64, u64)>,
}

impl std::fmt::Debug for WriteSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSet")
            .field("rows", &self.rows)
            .field("meta", &self.meta)
            .field("fences", &self.fences.len())
            .field("relayout", &self.relayout)
            .finish()
    }
}

/// A condition a commit checks under the commit lock, before it writes
/// anything: an error refuses the whole commit (e.g. a flow runner whose
/// run was replaced). See [`Store::under_commit_lock`].
pub type Fence = Arc<dyn Fn() -> Result<()> + Send + Sync>;

impl WriteSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes this write set an ALTER TABLE's rewrite of `table`'s rows to
    /// layout `version`, read at commit `read_seq`: it fails (writing
    /// nothing) if a commit wrote the table since, and once it commits,
    /// writes made with an older layout of the table are refused.
    pub fn relayout(&mut self, table: TableId, version: u64, read_seq: u64) -> &mut Self {
        self.relayout = Some((table, version, read_seq));
        self
    }

    /// Writes rows (upsert by key, or append for append-mode tables).
    /// The batch may have the table's columns in any order; missing nullable
    /// columns are NULL, types are cast to the column types.
    pub fn upsert(&mut self, table: Arc<Table>, batch: RecordBatch) -> &mut Self {
        self.rows.push(RowOp::Upsert(table, batch, None));
        self
    }

    /// Writes rows made ready ahead (see [`PreparedUpsert`]), as
    /// [`WriteSet::upsert`] would write their batch.
    pub fn upsert_prepared(&mut self, prepared: PreparedUpsert) -> &mut Self {
        self.rows
            .push(RowOp::Upsert(prepared.table, prepared.batch, prepared.keys));
        self
    }

    /// Deletes the rows whose (primary key, time index) equal those of the
    /// given rows; other columns of `keys` are ignored. In append-mode tables
    /// every row with that key is deleted.
    pub fn delete(&mut self, table: Arc<Table>, keys: RecordBatch) -> &mut Self {
        self.rows.push(RowOp::Delete(table, keys));
        self
    }

    /// Adds a transaction's staged writes (see [`Staged`]), table by table.
    pub fn staged(&mut self, staged: Staged) -> &mut Self {
        for (_, t) in staged.tables {
            if !t.keys.is_empty() || !t.appends.is_empty() {
                self.rows.push(RowOp::Staged(t));
            }
        }
        self
    }

    pub fn put_meta(&mut self, key: impl Into<String>, value: Vec<u8>) -> &mut Self {
        self.meta.push(MetaWrite::Put(key.into(), value));
        self
    }

    /// Puts a metadata value made under the commit lock, after this set's
    /// rows are written (see [`LateValue`]).
    pub fn put_meta_late(&mut self, key: impl Into<String>, value: LateValue) -> &mut Self {
        self.meta.push(MetaWrite::PutLate(key.into(), value));
        self
    }

    pub fn delete_meta(&mut self, key: impl Into<String>) -> &mut Self {
        self.meta.push(MetaWrite::Delete(key.into()));
        self
    }

    /// Adds any metadata change, table creation included: the catalog's
    /// staged DDL commits with the rows it makes room for.
    pub(crate) fn push_meta(&mut self, write: MetaWrite) -> &mut Self {
        self.meta.push(write);
        self
    }

    /// Refuses the commit unless `fence` passes (checked under the commit lock).
    pub fn fence(&mut self, fence: Fence) -> &mut Self {
        self.fences.push(fence);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.meta.is_empty()
    }

    /// Metadata written by users of the library must stay out of the
    /// catalog's and the store's own key ranges.
    pub fn check_user_meta(&self) -> Result<()> {
        for w in &self.meta {
            let key = match w {
                MetaWrite::Put(k, _) | MetaWrite::PutLate(k, _) | MetaWrite::Delete(k) => k,
                MetaWrite::CreateTable(_) | MetaWrite::DropTable(_) => {
                    return InvalidDataSnafu {
                        message: "create and drop tables through the catalog",
                    }
                    .fail()
                }
            };
            if ["catalog/", "store/", "flow/", "auth/", "component/"]
                .iter()
                .any(|p| key.starts_with(p))
            {
                return InvalidDataSnafu {
                    message: format!(
                        "metadata key '{key}' is reserved (catalog/, store/, flow/, auth/ and \
                         component/ belong to sandflow); use another prefix, e.g. app/"
                    ),
                }
                .fail();
            }
        }
        Ok(())
    }
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitInfo {
    pub seq: u64,
    /// Rows written (upserts, including identical rewrites) plus rows deleted.
    pub rows: u64,
}

struct CommitState {
    last_seq: u64,
    /// Per table changed since the store opened: the last commit that wrote
    /// its rows, and its layout version if an ALTER TABLE set one.
    written: HashMap<TableId, u64>,
    layouts: HashMap<TableId, u64>,
    /// Per table, the readers of its change log: a table with a live reader
    /// is logged (see [`log`]).
    readers: log::Readers,
    /// Tables whose log space may hold entries.
    logs: HashSet<TableId>,
}

/// Table storage with upsert semantics and a change feed.
pub struct Store {
    kv: Box<dyn KvStorage>,
    /// Held across a commit and the wake-up of its readers.
    state: Mutex<CommitState>,
    /// Write sets waiting for the commit lock (see [`Store::commit`]).
    queue: Mutex<Vec<Arc<Ticket>>>,
}

/// One (key, value, diff) change collected while applying a write.
type Changes = Vec<(Vec<u8>, Vec<u8>, i64)>;

pub(crate) fn poisoned() -> crate::error::Error {
    InternalSnafu {
        message: "storage lock poisoned by an earlier panic; restart sandflow".to_string(),
    }
    .build()
}

impl Store {
    /// Opens the redb-backed store in `dir` (created if missing) with the
    /// default page cache ([`redb::DEFAULT_CACHE_BYTES`]).
    pub fn open(dir: &Path) -> Result<Store> {
        Store::open_with_cache(dir, redb::DEFAULT_CACHE_BYTES)
    }

    /// Opens the redb-backed store in `dir` with a page cache of `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: usize) -> Result<Store> {
        std::fs::create_dir_all(dir).map_err(|e| {
            crate::error::StorageSnafu {
                message: format!("cannot create data dir {}: {e}", dir.display()),
            }
            .build()
        })?;
        let kv = redb::RedbStorage::open(&dir.join("sandflow.redb"), cache_bytes)?;
        Store::with_engine(Box::new(kv))
    }

    /// A store held in memory only: nothing survives the process.
    pub fn in_memory() -> Result<Store> {
        Store::with_engine(Box::new(redb::RedbStorage::in_memory()?))
    }

    pub fn with_engine(kv: Box<dyn KvStorage>) -> Result<Store> {
        let last_seq = read_seq(kv.begin_read()?.as_ref())?;
        Ok(Store {
            kv,
            state: Mutex::new(CommitState {
                last_seq,
                written: HashMap::new(),
                layouts: HashMap::new(),
                readers: HashMap::new(),
                logs: HashSet::new(),
            }),
            queue: Mutex::new(Vec::new()),
        })
    }

    /// Runs `f` under the commit lock: no commit is under way meanwhile, so
    /// a [`Fence`] changed by `f` applies to every later commit.
    pub fn under_commit_lock<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        let _state = self.state.lock().map_err(|_| poisoned())?;
        Ok(f())
    }

    /// The sequence number of the last durable commit.
    pub fn last_seq(&self) -> Result<u64> {
        Ok(self.state.lock().map_err(|_| poisoned())?.last_seq)
    }

    /// Commits metadata changes (catalog DDL) as one transaction.
    pub fn commit_meta(&self, writes: Vec<MetaWrite>) -> Result<u64> {
        let set = WriteSet {
            meta: writes,
            ..WriteSet::default()
        };
        Ok(self.commit(set)?.seq)
    }

    pub fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.view()?.get_meta(key)
    }

    /// All metadata entries whose key starts with `prefix`.
    pub fn scan_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.view()?.scan_meta(prefix)
    }

    /// A consistent view of the store: everything read through it reflects
    /// the same commit, whatever is committed meanwhile.
    pub fn view(&self) -> Result<ReadView> {
        Ok(ReadView {
            txn: self.kv.begin_read()?,
        })
    }

    /// Commits a write set atomically and durably, then wakes the readers of
    /// the tables it changed.
    ///
    /// Group commit: write sets that arrive while another commit holds the
    /// lock wait in a queue; the next thread to take the lock commits every
    /// queued set in one storage transaction, one fsync for all, each with
    /// its own sequence number, checks and result. A set that changes the
    /// catalog's tables (CREATE, DROP, ALTER's rewrite) commits alone. Each
    /// caller returns only once its own set is durable (or refused).
    pub fn commit(&self, mut set: WriteSet) -> Result<CommitInfo> {
        // Validate and normalise every batch before touching storage.
        let mut ops = Vec::with_capacity(set.rows.len());
        for op in std::mem::take(&mut set.rows) {
            ops.push(match op {
                RowOp::Upsert(t, b, None) => {
                    let b = conform_batch(&t, &b, false)?;
                    RowOp::Upsert(t, b, None)
                }
                // Conformed when it was prepared.
                prepared @ RowOp::Upsert(_, _, Some(_)) => prepared,
                RowOp::Delete(t, b) => {
                    let b = conform_batch(&t, &b, true)?;
                    RowOp::Delete(t, b)
                }
                staged @ RowOp::Staged(_) => staged,
            });
        }
        set.rows = ops;
        let ticket = Arc::new(Ticket(Mutex::new(TicketState::Queued(set))));
        self.queue
            .lock()
            .map_err(|_| poisoned())?
            .push(ticket.clone());
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        if let Some(done) = ticket.take_result() {
            // A commit that held the lock took this set along.
            return done;
        }
        let queued = std::mem::take(&mut *self.queue.lock().map_err(|_| poisoned())?);
        let mut rest = &queued[..];
        while !rest.is_empty() {
            let alone = rest[0].changes_tables();
            let n = match alone {
                true => 1,
                false => rest
                    .iter()
                    .position(|t| t.changes_tables())
                    .unwrap_or(rest.len()),
            };
            let (group, after) = rest.split_at(n);
            let sets: Vec<WriteSet> = group.iter().map(|t| t.take_set()).collect();
            let results = self.commit_group(&mut state, &sets);
            for (t, r) in group.iter().zip(results) {
                t.finish(r);
            }
            rest = after;
        }
        drop(state);
        ticket.take_result().unwrap_or_else(|| {
            crate::error::InternalSnafu {
                message: "a commit lost its write set; restart sandflow".to_string(),
            }
            .fail()
        })
    }

    /// Commits `sets` in one transaction, in order, each with its own
    /// sequence number; a set whose checks fail is refused alone. If writing
    /// one of them fails, each is committed again on its own, so that only
    /// the failing one fails.
    fn commit_group(&self, state: &mut CommitState, sets: &[WriteSet]) -> Vec<Result<CommitInfo>> {
        let mut results: Vec<Option<Result<CommitInfo>>> = (0..sets.len()).map(|_| None).collect();
        let mut txn = match self.kv.begin_write() {
            Ok(txn) => txn,
            Err(e) => return sets.iter().map(|_| Err(e.duplicate())).collect(),
        };
        let mut seq = state.last_seq;
        let mut applied: Vec<(usize, Applied)> = Vec::new();
        for (i, set) in sets.iter().enumerate() {
            if let Err(e) = check_set(state, set) {
                results[i] = Some(Err(e));
                continue;
            }
            match apply_set(txn.as_mut(), state, set, seq + 1) {
                Ok(a) => {
                    seq += 1;
                    applied.push((i, a));
                }
                Err(e) if sets.len() == 1 => return vec![Err(e)],
                Err(_) => {
                    // Part of that set may be in the transaction: drop it
                    // and commit each set on its own.
                    drop(txn);
                    return sets
                        .iter()
                        .map(|s| self.commit_group(state, std::slice::from_ref(s)).remove(0))
                        .collect();
                }
            }
        }
        if applied.is_empty() {
            return settled(results);
        }
        if let Err(e) = commit_as(txn, seq) {
            for (i, _) in &applied {
                results[*i] = Some(Err(e.duplicate()));
            }
            return settled(results);
        }
        state.last_seq = seq;
        for (i, a) in applied {
            let set = &sets[i];
            for t in set.rows.iter().map(RowOp::table) {
                state.written.insert(t.id(), a.seq);
            }
            if let Some((id, version, _)) = set.relayout {
                state.layouts.insert(id, version);
            }
            // Durable: wake the readers.
            for table in &a.logged {
                log::wake(&mut state.readers, *table, a.seq);
            }
            for id in a.dropped {
                close_readers(state, id);
            }
            results[i] = Some(Ok(CommitInfo {
                seq: a.seq,
                rows: a.rows,
            }));
        }
        settled(results)
    }

    /// Deletes, in one transaction, every row for which `predicate` is true
    /// (NULL counts as false). `predicate` sees rows in the table schema.
    ///
    /// The rows are found in a read transaction, so writers do not wait for
    /// the scan; only deleting them takes the commit lock. A row changed
    /// since it was read is left alone (the delete happened before that
    /// change). `gate` runs right before anything is written and may refuse
    /// (a statement that was stopped).
    pub fn delete_where(
        &self,
        table: &Arc<Table>,
        predicate: &mut dyn FnMut(&RecordBatch) -> Result<BooleanArray>,
        gate: &dyn Fn() -> Result<()>,
    ) -> Result<CommitInfo> {
        let mut doomed: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        {
            let txn = self.kv.begin_read()?;
            let mut chunk: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut take = |chunk: &mut Vec<(Vec<u8>, Vec<u8>)>,
                            doomed: &mut Vec<(Vec<u8>, Vec<u8>)>|
             -> Result<()> {
                if chunk.is_empty() {
                    return Ok(());
                }
                let mut dec = RowDecoder::new(table, chunk.len());
                for (k, v) in chunk.iter() {
                    dec.push(k, v)?;
                }
                let mask = predicate(&dec.finish()?)?;
                for (i, entry) in chunk.drain(..).enumerate() {
                    if mask.is_valid(i) && mask.value(i) {
                        doomed.push(entry);
                    }
                }
                Ok(())
            };
            let mut failure = None;
            txn.scan(Space::Table(table.id()), &[], &mut |k, v| {
                chunk.push((k.to_vec(), v.to_vec()));
                if chunk.len() >= SCAN_BATCH_ROWS {
                    if let Err(e) = take(&mut chunk, &mut doomed) {
                        failure = Some(e);
                        return Ok(false);
                    }
                }
                Ok(true)
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            take(&mut chunk, &mut doomed)?;
        }
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        if doomed.is_empty() {
            return Ok(CommitInfo {
                seq: state.last_seq,
                rows: 0,
            });
        }
        gate()?;
        let seq = state.last_seq + 1;
        let watched = log::has_readers(&state.readers, table.id());
        let mut txn = self.kv.begin_write()?;
        let mut out: Changes = Vec::new();
        let mut rows = 0u64;
        txn.space(Space::Table(table.id()), &mut |space| {
            for (k, v) in &doomed {
                if space.get(k)?.as_deref() != Some(v.as_slice()) {
                    continue;
                }
                space.delete(k)?;
                rows += 1;
                if watched {
                    out.push((k.clone(), v.clone(), -1));
                }
            }
            Ok(())
        })?;
        if rows == 0 {
            return Ok(CommitInfo {
                seq: state.last_seq,
                rows: 0,
            });
        }
        if watched && !out.is_empty() {
            let bytes = encode_log(&out);
            txn.space(Space::Log(table.id()), &mut |space| {
                space.put(&seq.to_be_bytes(), &bytes)?;
                Ok(())
            })?;
        }
        commit_as(txn, seq)?;
        state.last_seq = seq;
        if !out.is_empty() {
            log::wake(&mut state.readers, table.id(), seq);
        }
        Ok(CommitInfo { seq, rows })
    }

    /// Expires the rows whose time index is before `cutoff_ms` (a table's
    /// `ttl`). Unlike [`Store::delete_where`] nothing is logged: flows keep
    /// what they computed from these rows (as with GreptimeDB's TTL). The
    /// expired keys are found in a read transaction, so writes do not wait for
    /// the scan; only their deletion takes the commit lock, and commits only
    /// if something expired.
    pub fn expire(&self, table: &Arc<Table>, cutoff_ms: i64) -> Result<CommitInfo> {
        let mut doomed: Vec<Vec<u8>> = Vec::new();
        {
            let txn = self.kv.begin_read()?;
            let mut dec = RowDecoder::new(table, SCAN_BATCH_ROWS.min(1024));
            let mut keys: Vec<Vec<u8>> = Vec::new();
            let take =
                |dec: &mut RowDecoder, keys: &mut Vec<Vec<u8>>, doomed: &mut Vec<Vec<u8>>| {
                    let mask = older_than(table, &dec.finish()?, cutoff_ms)?;
                    for (i, k) in keys.drain(..).enumerate() {
                        if mask.is_valid(i) && mask.value(i) {
                            doomed.push(k);
                        }
                    }
                    Ok::<(), crate::Error>(())
                };
            let mut failure = None;
            // A key that starts with the time index: no row at or after
            // this key is expired (rows before it are still checked).
            let end = expire_scan_end(table, cutoff_ms);
            txn.scan(Space::Table(table.id()), &[], &mut |k, v| {
                if end.as_deref().is_some_and(|e| k >= e) {
                    return Ok(false);
                }
                let step = dec.push(k, v).and_then(|()| {
                    keys.push(k.to_vec());
                    if dec.len() >= SCAN_BATCH_ROWS {
                        take(&mut dec, &mut keys, &mut doomed)?;
                    }
                    Ok(())
                });
                match step {
                    Ok(()) => Ok(true),
                    Err(e) => {
                        failure = Some(e);
                        Ok(false)
                    }
                }
            })?;
            if let Some(e) = failure {
                return Err(e);
            }
            if dec.len() > 0 {
                take(&mut dec, &mut keys, &mut doomed)?;
            }
        }
        let mut state = self.state.lock().map_err(|_| poisoned())?;
        if doomed.is_empty() {
            return Ok(CommitInfo {
                seq: state.last_seq,
                rows: 0,
            });
        }
        let seq = state.last_seq + 1;
        let mut txn = self.kv.begin_write()?;
        let mut rows = 0u64;
        txn.space(Space::Table(table.id()), &mut |space| {
            // A key holds its time index: one still there is still expired.
            for k in &doomed {
                if space.delete(k)?.is_some() {
                    rows += 1;
                }
            }
            Ok(())
        })?;
        if rows == 0 {
            // Deleted meanwhile: no commit (dropping the transaction aborts it).
            return Ok(CommitInfo {
                seq: state.last_seq,
                rows: 0,
            });
        }
        commit_as(txn, seq)?;
        state.last_seq = seq;
        Ok(CommitInfo { seq, rows })
    }

    /// A consistent copy of a table's rows (in key order) with the commit
    /// sequence it reflects.
    pub fn scan(&self, table: &Table) -> Result<Snapshot> {
        self.view()?.scan(table)
    }

    /// Like [`Store::scan`], only the rows in `keys`; in series order when
    /// `series_order` (as every other scan), else in the order of the
    /// stored keys (time first on a time-first table), without sorting:
    /// for readers to whom the order cannot show, e.g. a query that reads
    /// no column (`SELECT count(*)`).
    pub fn scan_keys(
        &self,
        table: &Table,
        keys: &KeyRange,
        series_order: bool,
    ) -> Result<Snapshot> {
        self.view()?.scan_from(table, keys, series_order)
    }

    /// Closes the readers of a dropped table (their feeds end).
    pub fn table_dropped(&self, id: TableId) {
        if let Ok(mut state) = self.state.lock() {
            close_readers(&mut state, id);
        }
    }
}

fn close_readers(state: &mut CommitState, id: TableId) {
    if let Some(readers) = state.readers.remove(&id) {
        for r in readers.iter().filter_map(std::sync::Weak::upgrade) {
            r.close();
        }
    }
    state.logs.remove(&id);
}

/// A consistent view of the store (one read transaction); see
/// [`Store::view`]. Holding it keeps the versions it sees alive: drop it
/// soon.
pub struct ReadView {
    txn: Box<dyn KvReadTxn>,
}

impl ReadView {
    pub fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.txn.get(Space::Meta, key.as_bytes())
    }

    /// All metadata entries whose key starts with `prefix`.
    pub fn scan_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut out = Vec::new();
        self.txn.scan(Space::Meta, prefix.as_bytes(), &mut |k, v| {
            if !k.starts_with(prefix.as_bytes()) {
                return Ok(false);
            }
            out.push((String::from_utf8_lossy(k).into_owned(), v.to_vec()));
            Ok(true)
        })?;
        Ok(out)
    }

    /// The bytes a table's rows take: keys and values as stored.
    pub fn table_bytes(&self, table: TableId) -> Result<u64> {
        let mut bytes = 0u64;
        self.txn.scan(Space::Table(table), &[], &mut |k, v| {
            bytes += (k.len() + v.len()) as u64;
            Ok(true)
        })?;
        Ok(bytes)
    }

    /// A copy of a table's rows (in key order) with the commit
    /// sequence it reflects.
    pub fn scan(&self, table: &Table) -> Result<Snapshot> {
        self.scan_from(table, &KeyRange::default(), true)
    }

    /// The rows in `keys`; in series order (see [`series_order`]) when
    /// `ordered`, else in key order.
    fn scan_from(&self, table: &Table, keys: &KeyRange, ordered: bool) -> Result<Snapshot> {
        let (start, prefix, end) = (&keys.start[..], &keys.prefix[..], keys.end.as_deref());
        let txn = &self.txn;
        let seq = read_seq(txn.as_ref())?;
        let mut batches = Vec::new();
        let mut dec = RowDecoder::new(table, SCAN_BATCH_ROWS.min(1024));
        let mut failure = None;
        txn.scan(Space::Table(table.id()), start, &mut |k, v| {
            if !k.starts_with(prefix) || end.is_some_and(|e| k >= e) {
                return Ok(false);
            }
            if let Some((at, bytes)) = &keys.series {
                if !k.get(*at..).is_some_and(|rest| rest.starts_with(bytes)) {
                    return Ok(true);
                }
            }
            if let Err(e) = dec.push(k, v) {
                failure = Some(e);
                return Ok(false);
            }
            if dec.len() >= SCAN_BATCH_ROWS {
                match dec.finish() {
                    Ok(b) => batches.push(b),
                    Err(e) => {
                        failure = Some(e);
                        return Ok(false);
                    }
                }
            }
            Ok(true)
        })?;
        if let Some(e) = failure {
            return Err(e);
        }
        if dec.len() > 0 || batches.is_empty() {
            batches.push(dec.finish()?);
        }
        let batches = match ordered {
            true => series_order(table, batches)?,
            false => batches,
        };
        Ok(Snapshot { seq, batches })
    }
}

fn read_seq(txn: &dyn KvReadTxn) -> Result<u64> {
    match txn.get(Space::Meta, COMMIT_SEQ_KEY)? {
        None => Ok(0),
        Some(v) => {
            let bytes: [u8; 8] = v.as_slice().try_into().map_err(|_| {
                InternalSnafu {
                    message: "stored commit sequence is corrupt".to_string(),
                }
                .build()
            })?;
            Ok(u64::from_be_bytes(bytes))
        }
    }
}

/// A write set waiting for a group commit (see [`Store::commit`]).
struct Ticket(Mutex<TicketState>);

enum TicketState {
    Queued(WriteSet),
    Committing,
    Done(Result<CommitInfo>),
}

impl Ticket {
    fn lock(&self) -> std::sync::MutexGuard<'_, TicketState> {
        // The state is only ever replaced whole: a panic elsewhere leaves it
        // consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the set changes which tables exist or their layout: such a
    /// set commits alone.
    fn changes_tables(&self) -> bool {
        match &*self.lock() {
            TicketState::Queued(set) => {
                set.relayout.is_some()
                    || set
                        .meta
                        .iter()
                        .any(|m| matches!(m, MetaWrite::CreateTable(_) | MetaWrite::DropTable(_)))
            }
            _ => false,
        }
    }

    fn take_set(&self) -> WriteSet {
        match std::mem::replace(&mut *self.lock(), TicketState::Committing) {
            TicketState::Queued(set) => set,
            // Only the thread holding the commit lock takes sets, once each.
            _ => WriteSet::default(),
        }
    }

    fn finish(&self, result: Result<CommitInfo>) {
        *self.lock() = TicketState::Done(result);
    }

    fn take_result(&self) -> Option<Result<CommitInfo>> {
        let mut state = self.lock();
        match &*state {
            TicketState::Done(_) => match std::mem::replace(&mut *state, TicketState::Committing) {
                TicketState::Done(r) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Every set of a group has a result by the end of [`Store::commit_group`].
fn settled(results: Vec<Option<Result<CommitInfo>>>) -> Vec<Result<CommitInfo>> {
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                crate::error::InternalSnafu {
                    message: "a write set of a group commit got no result; nothing of it was \
                              written"
                        .to_string(),
                }
                .fail()
            })
        })
        .collect()
}

/// What applying one write set put into a transaction.
struct Applied {
    seq: u64,
    rows: u64,
    /// Tables whose change log got an entry.
    logged: Vec<TableId>,
    dropped: Vec<TableId>,
}

/// The checks a set passes under the commit lock before anything of it is
/// written: its fences, and that no ALTER TABLE changed its tables' layout.
fn check_set(state: &CommitState, set: &WriteSet) -> Result<()> {
    for fence in &set.fences {
        fence()?;
    }
    for t in set.rows.iter().map(RowOp::table) {
        let current = state.layouts.get(&t.id()).copied().unwrap_or(0);
        let relaid = set
            .relayout
            .is_some_and(|(id, v, _)| id == t.id() && v == t.info.version);
        if t.info.version < current && !relaid {
            return crate::error::ConflictSnafu {
                message: format!(
                    "table '{}' was altered (ALTER TABLE) while this statement ran; \
                     nothing was written; run the statement again",
                    t.qualified_name()
                ),
            }
            .fail();
        }
    }
    if let Some((id, _, read_seq)) = set.relayout {
        if state.written.get(&id).is_some_and(|&w| w > read_seq) {
            return crate::error::ConflictSnafu {
                message: "the table was written while ALTER TABLE read it; run it again"
                    .to_string(),
            }
            .fail();
        }
    }
    Ok(())
}

/// Writes one set's rows, change-log entries and metadata into `txn` as
/// commit `seq`.
fn apply_set(
    txn: &mut dyn KvWriteTxn,
    state: &CommitState,
    set: &WriteSet,
    seq: u64,
) -> Result<Applied> {
    let mut rows = 0u64;
    // Per table, in op order: the changes to log (only if read).
    let mut changes: Vec<(Arc<Table>, Changes)> = Vec::new();
    for (op_index, op) in set.rows.iter().enumerate() {
        let table = op.table();
        let watched = log::has_readers(&state.readers, table.id());
        let mut out: Changes = Vec::new();
        txn.space(Space::Table(table.id()), &mut |space| {
            let out = watched.then_some(&mut out);
            rows += match op {
                RowOp::Delete(t, batch) => delete_rows(t, batch, space, out)?,
                RowOp::Upsert(t, batch, keys) => {
                    upsert_rows(t, batch, keys.as_ref(), seq, op_index as u32, space, out)?
                }
                RowOp::Staged(s) => apply_staged(s, seq, op_index as u32, space, out)?,
            };
            Ok(())
        })?;
        if watched && !out.is_empty() {
            match changes.iter_mut().find(|(t, _)| t.id() == table.id()) {
                Some((_, c)) => c.append(&mut out),
                None => changes.push((table.clone(), out)),
            }
        }
    }
    for (table, entries) in &changes {
        let bytes = encode_log(entries);
        txn.space(Space::Log(table.id()), &mut |space| {
            space.put(&seq.to_be_bytes(), &bytes)?;
            Ok(())
        })?;
    }
    if set.meta.iter().any(|w| {
        matches!(
            w,
            MetaWrite::Put(..) | MetaWrite::PutLate(..) | MetaWrite::Delete(_)
        )
    }) {
        txn.space(Space::Meta, &mut |space| {
            for w in &set.meta {
                match w {
                    MetaWrite::Put(k, v) => {
                        space.put(k.as_bytes(), v)?;
                    }
                    MetaWrite::PutLate(k, v) => {
                        space.put(k.as_bytes(), v.get()?)?;
                    }
                    MetaWrite::Delete(k) => {
                        space.delete(k.as_bytes())?;
                    }
                    MetaWrite::CreateTable(_) | MetaWrite::DropTable(_) => {}
                }
            }
            Ok(())
        })?;
    }
    let mut dropped = Vec::new();
    for w in &set.meta {
        match w {
            MetaWrite::CreateTable(id) => txn.space(Space::Table(*id), &mut |_| Ok(()))?,
            MetaWrite::DropTable(id) => {
                txn.drop_space(Space::Table(*id))?;
                txn.drop_space(Space::Log(*id))?;
                dropped.push(*id);
            }
            _ => {}
        }
    }
    Ok(Applied {
        seq,
        rows,
        logged: changes.iter().map(|(t, _)| t.id()).collect(),
        dropped,
    })
}

/// Records `seq` as the last commit and commits `txn`.
fn commit_as(mut txn: Box<dyn KvWriteTxn>, seq: u64) -> Result<()> {
    txn.space(Space::Meta, &mut |space| {
        space.put(COMMIT_SEQ_KEY, &seq.to_be_bytes())?;
        Ok(())
    })?;
    txn.commit()
}

/// For a table whose key starts with its time index: a key after every
/// row whose time is before `cutoff_ms` (rounded up to the column's unit,
/// with a unit to spare), so that expiry reads only the oldest rows.
fn expire_scan_end(table: &Table, cutoff_ms: i64) -> Option<Vec<u8>> {
    let unit_end = match table.schema().time_index_column().data_type {
        ColumnType::TimestampSecond => cutoff_ms.div_euclid(1000).saturating_add(1),
        ColumnType::TimestampMillisecond | ColumnType::Int64 => cutoff_ms.saturating_add(1),
        ColumnType::TimestampMicrosecond => cutoff_ms.saturating_mul(1000).saturating_add(1000),
        ColumnType::TimestampNanosecond => cutoff_ms
            .saturating_mul(1_000_000)
            .saturating_add(1_000_000),
        _ => return None,
    };
    if unit_end == i64::MAX {
        return None;
    }
    codec::time_prefix(table, unit_end)
}

/// Which rows of `batch` (in the table schema) have a time index before `cutoff_ms`.
fn older_than(table: &Table, batch: &RecordBatch, cutoff_ms: i64) -> Result<BooleanArray> {
    use datafusion::arrow::compute::{cast, kernels::cmp::lt};
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    let fail = |e: datafusion::arrow::error::ArrowError| {
        crate::error::InternalSnafu {
            message: format!("cannot compare the time index with the ttl: {e}"),
        }
        .build()
    };
    let ts = batch.column(table.schema().time_index);
    let ms = cast(ts, &DataType::Timestamp(TimeUnit::Millisecond, None)).map_err(fail)?;
    let ms = cast(&ms, &DataType::Int64).map_err(fail)?;
    lt(
        &ms,
        &datafusion::arrow::array::Int64Array::new_scalar(cutoff_ms),
    )
    .map_err(fail)
}

fn readers<'a>(table: &Table, batch: &'a RecordBatch) -> Vec<ColumnReader<'a>> {
    batch
        .columns()
        .iter()
        .zip(&table.schema().columns)
        .map(|(a, c)| ColumnReader::new(a, c.data_type))
        .collect()
}

/// Every row's stored key, encoded once, and the order to write the rows
/// in.
#[derive(Debug, Clone)]
struct RowKeys {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    order: Vec<usize>,
}

impl RowKeys {
    /// The keys of `rows` rows; an append-mode table's with the suffix of
    /// `append` (the commit's sequence and the op's index).
    fn encode(
        table: &Table,
        readers: &[ColumnReader<'_>],
        rows: usize,
        append: Option<(u64, u32)>,
    ) -> RowKeys {
        let mut keys = RowKeys {
            bytes: Vec::with_capacity(rows * 32),
            ends: Vec::with_capacity(rows),
            order: (0..rows).collect(),
        };
        for row in 0..rows {
            codec::encode_key(table, readers, row, &mut keys.bytes);
            if let Some((seq, op_index)) = append {
                codec::append_suffix(seq, op_index, row as u32, &mut keys.bytes);
            }
            keys.ends.push(keys.bytes.len());
        }
        // The rows go into the tree in key order: neighbouring puts then
        // land on the same pages (most of the cost of a large batch is
        // walking and copying pages). The sort is stable, so of two rows
        // with one key the later still wins, and each key's diffs keep
        // their order.
        if !table.instant() {
            keys.order = keys.sorted_order();
        }
        keys
    }

    /// The rows in key order, and of rows with one key the earlier first.
    /// Sorted by each key's first 16 bytes (zero padded, so that they
    /// order as the keys do), then the whole key, then the row: most
    /// comparisons are of two integers, not of two keys behind two
    /// indirections.
    fn sorted_order(&self) -> Vec<usize> {
        let rows = self.ends.len();
        if u32::try_from(rows).is_err() {
            let mut order: Vec<usize> = (0..rows).collect();
            order.sort_by(|a, b| self.key(*a).cmp(self.key(*b)));
            return order;
        }
        let mut heads: Vec<(u128, u32)> = (0..rows)
            .map(|row| {
                let key = self.key(row);
                let mut head = [0u8; 16];
                let n = key.len().min(16);
                head[..n].copy_from_slice(&key[..n]);
                (u128::from_be_bytes(head), row as u32)
            })
            .collect();
        let order = |(ha, a): &(u128, u32), (hb, b): &(u128, u32)| {
            ha.cmp(hb)
                .then_with(|| self.key(*a as usize).cmp(self.key(*b as usize)))
                .then(a.cmp(b))
        };
        // First by the keys' first 8 bytes alone, keeping the order of rows
        // with the same 8 bytes; then each run of those is sorted, if it is
        // not already, alone: many small sorts, each in cache, not one over
        // all rows. Rows that come in order of those bytes (a table keyed by
        // time first, written in time order: a flow's tick) are not moved at
        // all; rows that come in runs of them (a back-fill's output, by
        // series and then time, into a sink keyed by time first) are merged,
        // and come out of it sorted within each time.
        let word = |h: &(u128, u32)| (h.0 >> 64) as u64;
        if !heads.is_sorted_by_key(word) {
            heads.sort_by_key(word);
        }
        for run in heads.chunk_by_mut(|a, b| word(a) == word(b)) {
            if !run.is_sorted_by(|a, b| order(a, b).is_le()) {
                run.sort_unstable_by(order);
            }
        }
        heads.into_iter().map(|(_, row)| row as usize).collect()
    }

    /// Whether the rows can be written as one run of new entries (see
    /// [`KvSpace::append`]): their keys, in order, ascend strictly, and the
    /// first sorts after every key `space` holds.
    fn appendable(&self, space: &dyn KvSpace) -> Result<bool> {
        let Some(&first) = self.order.first() else {
            return Ok(false);
        };
        let ascending = self
            .order
            .windows(2)
            .all(|w| self.key(w[0]) < self.key(w[1]));
        Ok(ascending && space.all_before(self.key(first))?)
    }

    fn key(&self, row: usize) -> &[u8] {
        let start = match row {
            0 => 0,
            _ => self.ends[row - 1],
        };
        &self.bytes[start..self.ends[row]]
    }
}

/// An upsert made ready ahead of its commit: the batch conformed to the
/// table, its rows' stored keys encoded and sorted. That is the part of a
/// large upsert that needs no storage: a flow does it on another thread
/// while its guest writes a snapshot. Committed with
/// [`WriteSet::upsert_prepared`]; refused, like any write, if the table was
/// altered since.
#[derive(Debug, Clone)]
pub struct PreparedUpsert {
    table: Arc<Table>,
    batch: RecordBatch,
    /// `None` for an append-mode table: its keys take the commit's sequence.
    keys: Option<RowKeys>,
}

impl PreparedUpsert {
    /// Prepares an upsert of `batch` into `table` (see [`WriteSet::upsert`]
    /// for what the batch may look like).
    pub fn new(table: Arc<Table>, batch: &RecordBatch) -> Result<PreparedUpsert> {
        let batch = conform_batch(&table, batch, false)?;
        let keys = (!table.schema().append_mode)
            .then(|| RowKeys::encode(&table, &readers(&table, &batch), batch.num_rows(), None));
        Ok(PreparedUpsert { table, batch, keys })
    }
}

fn upsert_rows(
    table: &Table,
    batch: &RecordBatch,
    keys: Option<&RowKeys>,
    seq: u64,
    op_index: u32,
    space: &mut dyn KvSpace,
    mut out: Option<&mut Changes>,
) -> Result<u64> {
    let readers = readers(table, batch);
    let instant = table.instant();
    let mut value = Vec::with_capacity(64);
    let encoded;
    let keys = match keys {
        Some(k) => k,
        None => {
            let append = table.schema().append_mode.then_some((seq, op_index));
            encoded = RowKeys::encode(table, &readers, batch.num_rows(), append);
            &encoded
        }
    };
    // The changes go to the log in the statement's row order, whatever
    // order the rows were stored in: `origin` is each change's row.
    let base = out.as_deref().map_or(0, Vec::len);
    let mut origin: Vec<usize> = Vec::new();
    if !instant && !table.last_non_null() && keys.appendable(space)? {
        // Every key is new and after the stored ones: one run of inserts,
        // each an insertion for the flows.
        space.append(&mut |put| {
            for &row in &keys.order {
                let key = keys.key(row);
                value.clear();
                put(key, value_bytes(table, &readers, row, &mut value))?;
                if let Some(out) = out.as_deref_mut() {
                    out.push((key.to_vec(), value.clone(), 1));
                    origin.push(row);
                }
            }
            Ok(())
        })?;
    } else {
        put_rows(
            table,
            &readers,
            keys,
            space,
            out.as_deref_mut(),
            &mut origin,
        )?;
    }
    if let Some(out) = out {
        if origin.len() == out.len() - base && origin.windows(2).any(|w| w[0] > w[1]) {
            let mut changes: Vec<_> = origin.into_iter().zip(out.drain(base..)).collect();
            changes.sort_by_key(|(row, _)| *row);
            out.extend(changes.into_iter().map(|(_, c)| c));
        }
    }
    Ok(batch.num_rows() as u64)
}

/// Writes the rows one `put` each, in key order; each change to `out` with
/// its row in `origin` (see [`upsert_rows`]).
fn put_rows(
    table: &Table,
    readers: &[ColumnReader<'_>],
    keys: &RowKeys,
    space: &mut dyn KvSpace,
    mut out: Option<&mut Changes>,
    origin: &mut Vec<usize>,
) -> Result<()> {
    let instant = table.instant();
    let mut value = Vec::with_capacity(64);
    for &row in &keys.order {
        value.clear();
        let key = keys.key(row);
        if instant {
            // Nothing is stored, so nothing is replaced: every row is new to the flows.
            if let Some(out) = out.as_deref_mut() {
                let value = value_bytes(table, readers, row, &mut value).to_vec();
                out.push((key.to_vec(), value, 1));
            }
            continue;
        }
        if table.last_non_null() {
            value_bytes(table, readers, row, &mut value);
            if let Some(old) = space.get(key)? {
                value = codec::merge_last_non_null(table, &old, &value)?;
            }
        }
        let old = if table.last_non_null() {
            space.put(key, &value)?
        } else {
            space.put(key, value_bytes(table, readers, row, &mut value))?
        };
        if let Some(out) = out.as_deref_mut() {
            match old {
                Some(old) if old == value => {}
                Some(old) => {
                    out.push((key.to_vec(), old, -1));
                    out.push((key.to_vec(), value.clone(), 1));
                    origin.extend([row, row]);
                }
                None => {
                    out.push((key.to_vec(), value.clone(), 1));
                    origin.push(row);
                }
            }
        }
    }
    Ok(())
}

/// Applies a transaction's staged writes to one table (see [`Staged`]): each
/// staged key is written or deleted, each staged append gets this commit's
/// suffix; the diffs are against what is stored now.
fn apply_staged(
    staged: &StagedTable,
    seq: u64,
    op_index: u32,
    space: &mut dyn KvSpace,
    mut out: Option<&mut Changes>,
) -> Result<u64> {
    let table = &staged.table;
    let mut rows = 0u64;
    if !table.instant() {
        for (key, value) in &staged.keys {
            let merged;
            let value = match value {
                Some(v) if table.last_non_null() && !staged.fresh.contains(key) => {
                    merged = match space.get(key)? {
                        Some(old) => codec::merge_last_non_null(table, &old, v)?,
                        None => v.clone(),
                    };
                    Some(&merged)
                }
                v => v.as_ref(),
            };
            let old = match value {
                Some(v) => space.put(key, v)?,
                None => space.delete(key)?,
            };
            rows += u64::from(value.is_some() || old.is_some());
            if let Some(out) = out.as_deref_mut() {
                match (old, value) {
                    (Some(old), Some(v)) if &old == v => {}
                    (Some(old), v) => {
                        out.push((key.clone(), old, -1));
                        if let Some(v) = v {
                            out.push((key.clone(), v.clone(), 1));
                        }
                    }
                    (None, Some(v)) => out.push((key.clone(), v.clone(), 1)),
                    (None, None) => {}
                }
            }
        }
    }
    for (row, (prefix, value)) in staged.appends.iter().enumerate() {
        let mut key = prefix.clone();
        if table.schema().append_mode {
            codec::append_suffix(seq, op_index, row as u32, &mut key);
        }
        if !table.instant() {
            space.put(&key, value)?;
        }
        rows += 1;
        if let Some(out) = out.as_deref_mut() {
            out.push((key, value.clone(), 1));
        }
    }
    Ok(rows)
}

fn value_bytes<'v>(
    table: &Table,
    readers: &[ColumnReader<'_>],
    row: usize,
    value: &'v mut Vec<u8>,
) -> &'v [u8] {
    codec::encode_value(table, readers, row, value);
    value
}

fn delete_rows(
    table: &Table,
    batch: &RecordBatch,
    space: &mut dyn KvSpace,
    mut out: Option<&mut Changes>,
) -> Result<u64> {
    let readers = readers(table, batch);
    let mut deleted = 0;
    let mut key = Vec::with_capacity(64);
    for row in 0..batch.num_rows() {
        key.clear();
        codec::encode_key(table, &readers, row, &mut key);
        let victims: Vec<(Vec<u8>, Vec<u8>)> = if table.schema().append_mode {
            let mut v = Vec::new();
            space.scan(&key, &mut |k, val| {
                if !k.starts_with(&key) {
                    return Ok(false);
                }
                v.push((k.to_vec(), val.to_vec()));
                Ok(true)
            })?;
            v
        } else {
            match space.get(&key)? {
                Some(v) => vec![(key.clone(), v)],
                None => vec![],
            }
        };
        for (k, v) in victims {
            space.delete(&k)?;
            deleted += 1;
            if let Some(out) = out.as_deref_mut() {
                out.push((k, v, -1));
            }
        }
    }
    Ok(deleted)
}

/// A change log entry: the (key, value, diff) changes of one table in one
/// commit, as `count u32, then per change: key len u32, key, value len u32,
/// value, diff i64` (little endian).
fn encode_log(entries: &Changes) -> Vec<u8> {
    let size: usize = entries.iter().map(|(k, v, _)| k.len() + v.len() + 16).sum();
    let mut out = Vec::with_capacity(size + 4);
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (k, v, d) in entries {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
        out.extend_from_slice(&d.to_le_bytes());
    }
    out
}

/// Reorders, casts and checks a batch against the table schema. For deletes
/// (`keys_only`) only the key columns must be present; the others are NULL.
pub fn conform_batch(table: &Table, batch: &RecordBatch, keys_only: bool) -> Result<RecordBatch> {
    let schema = table.schema();
    let input = batch.schema();
    for f in input.fields() {
        if schema.column_index(f.name()).is_none() {
            return InvalidDataSnafu {
                message: format!(
                    "column '{}' does not exist in table '{}'",
                    f.name(),
                    table.qualified_name()
                ),
            }
            .fail();
        }
    }
    let n = batch.num_rows();
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.columns.len());
    for (i, col) in schema.columns.iter().enumerate() {
        let target = col.data_type.to_arrow();
        let is_key = table.key_columns.contains(&i);
        let array = match input.index_of(&col.name) {
            Ok(idx) => {
                let a = batch.column(idx);
                if a.data_type() == &target {
                    a.clone()
                } else {
                    cast_with_options(a, &target, &options).map_err(|e| {
                        InvalidDataSnafu {
                            message: format!(
                                "column '{}' expects {} but got {}: {e}",
                                col.name,
                                col.data_type.sql_name(),
                                a.data_type()
                            ),
                        }
                        .build()
                    })?
                }
            }
            Err(_) if keys_only && !is_key => new_null_array(&target, n),
            Err(_) if col.nullable => new_null_array(&target, n),
            Err(_) => {
                return InvalidDataSnafu {
                    message: format!(
                        "column '{}' of table '{}' is NOT NULL and has no value; provide it",
                        col.name,
                        table.qualified_name()
                    ),
                }
                .fail()
            }
        };
        if let Some(strings) = array
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
        {
            let offsets = strings.value_offsets();
            let (from, to) = (offsets[0] as usize, offsets[offsets.len() - 1] as usize);
            if strings.value_data()[from..to].contains(&0) {
                return crate::error::InvalidEncodingSnafu {
                    message: format!(
                        "invalid byte sequence for encoding \"UTF8\": 0x00 in column '{}': \
                         text cannot contain NUL characters",
                        col.name
                    ),
                }
                .fail();
            }
        }
        let must_be_set = !col.nullable && (is_key || !keys_only);
        if must_be_set && array.null_count() > 0 {
            let message = if i == schema.time_index {
                format!(
                    "time index column '{}' cannot be NULL; give every row a timestamp",
                    col.name
                )
            } else {
                format!("column '{}' is NOT NULL but a row has NULL", col.name)
            };
            return InvalidDataSnafu { message }.fail();
        }
        columns.push(array);
    }
    // Key-only batches (deletes) carry NULLs in value columns.
    let schema_ref = if keys_only {
        let fields: Vec<_> = table
            .arrow_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        Arc::new(datafusion::arrow::datatypes::Schema::new(fields))
    } else {
        table.arrow_schema.clone()
    };
    RecordBatch::try_new(schema_ref, columns).map_err(|e| {
        InvalidDataSnafu {
            message: format!("rows do not fit table '{}': {e}", table.qualified_name()),
        }
        .build()
    })
}

/// Tables for the storage tests: columns `columns`, primary key `k`, time
/// index `ts`, created in `store`.
#[cfg(test)]
pub(crate) fn test_table(
    store: &Store,
    id: TableId,
    columns: Vec<crate::schema::ColumnSchema>,
    append: bool,
) -> Arc<Table> {
    use crate::schema::{TableInfo, TableSchema};
    let schema = TableSchema::new(columns, "ts", &["k"], append).expect("a valid test schema");
    let t = Table::new(TableInfo {
        id,
        database: "public".into(),
        name: "t".into(),
        schema,
        options: Default::default(),
        version: 0,
        time_first: true,
        description: None,
    });
    store
        .commit_meta(vec![MetaWrite::CreateTable(t.id())])
        .expect("the test table is created");
    t
}

#[cfg(test)]
mod tests {
    use super::kv::{KvReadTxn, KvSpace, KvStorage, KvWriteTxn, Space};
    use super::*;
    use crate::schema::{ColumnSchema, ColumnType};
    use datafusion::arrow::array::{Int64Array, TimestampMillisecondArray};
    use std::sync::atomic::{AtomicU64, Ordering};

    /// `k BIGINT NOT NULL, ts TIMESTAMP NOT NULL`.
    pub(crate) fn key_and_time() -> Vec<ColumnSchema> {
        vec![
            ColumnSchema::new("k", ColumnType::Int64, false),
            ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
        ]
    }

    /// redb in memory, counting durable commits; the first one is slow, so
    /// that the commits started meanwhile queue up behind it.
    /// It also counts runs written with [`KvSpace::append`].
    struct Counting {
        inner: redb::RedbStorage,
        commits: Arc<AtomicU64>,
        slow_first: bool,
        appends: Arc<AtomicU64>,
    }

    struct CountingTxn {
        inner: Box<dyn KvWriteTxn>,
        commits: Arc<AtomicU64>,
        slow: bool,
        appends: Arc<AtomicU64>,
    }

    /// A key space that counts its appends.
    struct CountingSpace<'a> {
        inner: &'a mut dyn KvSpace,
        appends: &'a AtomicU64,
    }

    impl KvSpace for CountingSpace<'_> {
        fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
            self.inner.get(key)
        }
        fn put(&mut self, key: &[u8], value: &[u8]) -> Result<Option<Vec<u8>>> {
            self.inner.put(key, value)
        }
        fn delete(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
            self.inner.delete(key)
        }
        fn scan(&self, start: &[u8], visit: &mut kv::Visitor<'_>) -> Result<()> {
            self.inner.scan(start, visit)
        }
        fn append(&mut self, fill: &mut kv::Fill<'_>) -> Result<()> {
            self.appends.fetch_add(1, Ordering::SeqCst);
            self.inner.append(fill)
        }
    }

    impl KvStorage for Counting {
        fn begin_write(&self) -> Result<Box<dyn KvWriteTxn>> {
            let slow = self.slow_first && self.commits.load(Ordering::SeqCst) == 1;
            Ok(Box::new(CountingTxn {
                inner: self.inner.begin_write()?,
                commits: self.commits.clone(),
                slow,
                appends: self.appends.clone(),
            }))
        }
        fn begin_read(&self) -> Result<Box<dyn KvReadTxn>> {
            self.inner.begin_read()
        }
    }

    impl KvWriteTxn for CountingTxn {
        fn space(
            &mut self,
            space: Space,
            f: &mut dyn FnMut(&mut dyn KvSpace) -> Result<()>,
        ) -> Result<()> {
            let appends = &self.appends;
            self.inner.space(space, &mut |inner| {
                f(&mut CountingSpace {
                    inner,
                    appends: appends.as_ref(),
                })
            })
        }
        fn drop_space(&mut self, space: Space) -> Result<()> {
            self.inner.drop_space(space)
        }
        fn commit(self: Box<Self>) -> Result<()> {
            if self.slow {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            self.commits.fetch_add(1, Ordering::SeqCst);
            self.inner.commit()
        }
    }

    /// A store whose first commit after the first holds the commit lock
    /// for 300 ms, and its count of storage commits.
    fn slow_first_store() -> (Arc<Store>, Arc<AtomicU64>) {
        let commits = Arc::new(AtomicU64::new(0));
        let store = Store::with_engine(Box::new(Counting {
            inner: redb::RedbStorage::in_memory().unwrap(),
            commits: commits.clone(),
            slow_first: true,
            appends: Arc::default(),
        }))
        .unwrap();
        (Arc::new(store), commits)
    }

    /// How many rows a scan of `t` returns.
    fn scanned_rows(store: &Store, t: &Table) -> usize {
        let s = store.scan(t).unwrap();
        s.batches.iter().map(|b| b.num_rows()).sum()
    }

    #[test]
    fn a_time_first_table_scans_in_the_same_order_as_a_key_first_one() {
        use crate::schema::{TableInfo, TableSchema};
        use datafusion::arrow::array::{Float64Array, StringArray};
        let store = Store::in_memory().unwrap();
        let make = |id: TableId, time_first: bool, append: bool| {
            let columns = vec![
                ColumnSchema::new("host", ColumnType::String, true),
                ColumnSchema::new("x", ColumnType::Float64, true),
                ColumnSchema::new("v", ColumnType::Int64, true),
                ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
            ];
            let schema = TableSchema::new(columns, "ts", &["host", "x"], append).unwrap();
            let t = Table::new(TableInfo {
                id,
                database: "public".into(),
                name: format!("t{id}"),
                schema,
                options: Default::default(),
                version: 0,
                time_first,
                description: None,
            });
            store
                .commit_meta(vec![MetaWrite::CreateTable(t.id())])
                .unwrap();
            t
        };
        let hosts = [None, Some(""), Some("a"), Some("a b"), Some("é"), Some("b")];
        let xs = [
            None,
            Some(-0.0),
            Some(0.0),
            Some(-1.5),
            Some(f64::NAN),
            Some(2.0),
        ];
        for append in [false, true] {
            let (old, new) = (
                make(20 + append as u64 * 2, false, append),
                make(21 + append as u64 * 2, true, append),
            );
            // Several commits of rows over every (host, x) at shuffled times,
            // some repeated (upserts, or more rows in append mode).
            let mut seed = 7u64;
            for round in 0..4i64 {
                let (mut h, mut x, mut v, mut ts) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                for (i, host) in hosts.iter().enumerate() {
                    for (j, xv) in xs.iter().enumerate() {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        h.push(*host);
                        x.push(*xv);
                        v.push(Some(round * 100 + (i * 10 + j) as i64));
                        ts.push((seed >> 33) as i64 % 5 - 2);
                    }
                }
                for t in [&old, &new] {
                    let batch = RecordBatch::try_new(
                        t.arrow_schema.clone(),
                        vec![
                            Arc::new(StringArray::from(h.clone())),
                            Arc::new(Float64Array::from(x.clone())),
                            Arc::new(Int64Array::from(v.clone())),
                            Arc::new(TimestampMillisecondArray::from(ts.clone())),
                        ],
                    )
                    .unwrap();
                    let mut set = WriteSet::new();
                    set.upsert(t.clone(), batch);
                    store.commit(set).unwrap();
                }
            }
            let rows = |t: &Arc<Table>| {
                let s = store.scan(t).unwrap();
                datafusion::arrow::compute::concat_batches(&t.arrow_schema, &s.batches).unwrap()
            };
            let (a, b) = (rows(&old), rows(&new));
            assert!(a.num_rows() > 30, "{}", a.num_rows());
            assert_eq!(a, b, "append mode: {append}");
            // One host's series: picked by its key prefix in the old
            // layout, by `series` in the new one; the same rows.
            for host in hosts {
                let value: ArrayRef = Arc::new(StringArray::from(vec![host]));
                let by_prefix =
                    KeyRange::prefix(codec::key_prefix(&old, std::slice::from_ref(&value)));
                let by_series = KeyRange {
                    series: codec::series_prefix(&new, std::slice::from_ref(&value)),
                    ..KeyRange::default()
                };
                assert!(by_series.series.is_some());
                assert_eq!(codec::series_prefix(&old, &[value]), None, "key first");
                let scan = |t: &Arc<Table>, k: &KeyRange| {
                    let s = store.scan_keys(t, k, true).unwrap();
                    datafusion::arrow::compute::concat_batches(&t.arrow_schema, &s.batches).unwrap()
                };
                let (a, b) = (scan(&old, &by_prefix), scan(&new, &by_series));
                assert!(a.num_rows() >= xs.len(), "{host:?}: {}", a.num_rows());
                assert_eq!(a, b, "{host:?}, append mode: {append}");
            }
            assert_eq!(codec::series_prefix(&new, &[]), None);
        }
    }

    #[test]
    fn expiry_deletes_exactly_the_rows_before_the_cutoff_in_every_time_unit() {
        use datafusion::arrow::array::{
            TimestampMicrosecondArray, TimestampNanosecondArray, TimestampSecondArray,
        };
        let store = Store::in_memory().unwrap();
        let cutoff_ms = 10_000;
        // Times in each unit: just before, at and after the cutoff, for
        // three keys (keys interleave with times in the key order).
        let cases: [(ColumnType, i64, Vec<i64>); 4] = [
            (ColumnType::TimestampSecond, 1, vec![-5, 9, 10, 11, 3_000]),
            (
                ColumnType::TimestampMillisecond,
                1_000,
                vec![-1, 9_999, 10_000, 10_001],
            ),
            (
                ColumnType::TimestampMicrosecond,
                1_000_000,
                vec![9_999_999, 9_999_000, 10_000_000, 10_000_001, -1],
            ),
            (
                ColumnType::TimestampNanosecond,
                1_000_000_000,
                vec![9_999_999_999, 9_999_000_001, 10_000_000_000, 10_000_999_999],
            ),
        ];
        for (id, (ty, per_s, times)) in cases.into_iter().enumerate() {
            let columns = vec![
                ColumnSchema::new("k", ColumnType::Int64, false),
                ColumnSchema::new("ts", ty, false),
            ];
            let t = test_table(&store, 10 + id as TableId, columns, false);
            let (mut ks, mut ts) = (Vec::new(), Vec::new());
            for k in 0..3i64 {
                for &time in &times {
                    ks.push(k);
                    ts.push(time);
                }
            }
            let time: ArrayRef = match ty {
                ColumnType::TimestampSecond => Arc::new(TimestampSecondArray::from(ts.clone())),
                ColumnType::TimestampMillisecond => {
                    Arc::new(TimestampMillisecondArray::from(ts.clone()))
                }
                ColumnType::TimestampMicrosecond => {
                    Arc::new(TimestampMicrosecondArray::from(ts.clone()))
                }
                _ => Arc::new(TimestampNanosecondArray::from(ts.clone())),
            };
            let batch = RecordBatch::try_new(
                t.arrow_schema.clone(),
                vec![Arc::new(Int64Array::from(ks)), time],
            )
            .unwrap();
            let mut set = WriteSet::new();
            set.upsert(t.clone(), batch);
            store.commit(set).unwrap();
            let expired = times
                .iter()
                .filter(|&&x| x * 1000 / per_s < cutoff_ms)
                .count();
            let info = store.expire(&t, cutoff_ms).unwrap();
            assert_eq!(info.rows, 3 * expired as u64, "{ty:?}");
            assert_eq!(
                scanned_rows(&store, &t),
                3 * (times.len() - expired),
                "{ty:?}"
            );
        }
    }

    fn rows(t: &Arc<Table>, keys: std::ops::Range<i64>) -> RecordBatch {
        let n = keys.clone().count();
        RecordBatch::try_new(
            t.arrow_schema.clone(),
            vec![
                Arc::new(Int64Array::from_iter_values(keys)),
                Arc::new(TimestampMillisecondArray::from(vec![0; n])),
            ],
        )
        .unwrap()
    }

    /// Table `id` of `k BIGINT, v BIGINT, ts`, with a log reader, so that its
    /// commits are logged while the returned `Following` lives.
    fn followed_key_value_table(store: &Store, id: TableId) -> (Arc<Table>, log::Following) {
        let mut columns = key_and_time();
        columns.insert(1, ColumnSchema::new("v", ColumnType::Int64, true));
        let t = test_table(store, id, columns, false);
        let follow = store
            .follow(std::slice::from_ref(&t), None, false, &mut |_| {
                Box::new(|_| {})
            })
            .unwrap();
        (t, follow)
    }

    /// Column `c` of `b`, a BIGINT column.
    fn ints(b: &RecordBatch, c: usize) -> Vec<i64> {
        b.column(c)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap()
            .values()
            .to_vec()
    }

    #[test]
    fn within_one_batch_the_later_row_of_a_key_wins_and_the_log_keeps_the_row_order() {
        let store = Store::in_memory().unwrap();
        let (t, follow) = followed_key_value_table(&store, 9);
        let batch = RecordBatch::try_new(
            t.arrow_schema.clone(),
            vec![
                Arc::new(Int64Array::from(vec![3, 1, 3, 2, 1])),
                Arc::new(Int64Array::from(vec![1, 2, 3, 4, 5])),
                Arc::new(TimestampMillisecondArray::from(vec![0; 5])),
            ],
        )
        .unwrap();
        let mut set = WriteSet::new();
        set.upsert(t.clone(), batch);
        assert_eq!(store.commit(set).unwrap().rows, 5);
        let snapshot = store.scan(&t).unwrap();
        let b = &snapshot.batches[0];
        assert_eq!((ints(b, 0), ints(b, 1)), (vec![1, 2, 3], vec![5, 4, 3]));
        let part = store
            .read_log_part(&t, Position::after_commit(follow.seq))
            .unwrap()
            .unwrap();
        let (k, v) = (ints(&part.change.batch, 0), ints(&part.change.batch, 1));
        let of = |key: i64| -> Vec<(i64, i64)> {
            (0..k.len())
                .filter(|i| k[*i] == key)
                .map(|i| (v[i], part.change.diffs[i]))
                .collect()
        };
        assert_eq!(of(3), vec![(1, 1), (1, -1), (3, 1)]);
        assert_eq!(of(1), vec![(2, 1), (2, -1), (5, 1)]);
        assert_eq!(of(2), vec![(4, 1)]);
        // The log has the changes in the statement's row order.
        assert_eq!(k, vec![3, 1, 3, 3, 2, 1, 1]);
        assert_eq!(part.change.diffs, vec![1, 1, -1, 1, 1, -1, 1]);
    }

    /// Rows whose keys are all new and after the stored ones (a fresh sink's,
    /// rows of later times in a table keyed by time first) are written as one
    /// run; any other batch row by row. Either way a scan and the change log
    /// show what one put per row would.
    #[test]
    fn rows_after_every_stored_key_are_appended_and_others_put_one_by_one() {
        let appends = Arc::new(AtomicU64::new(0));
        let store = Store::with_engine(Box::new(Counting {
            inner: redb::RedbStorage::in_memory().unwrap(),
            commits: Arc::default(),
            slow_first: false,
            appends: appends.clone(),
        }))
        .unwrap();
        let (t, follow) = followed_key_value_table(&store, 11);
        let mut after = Position::after_commit(follow.seq);
        // (keys, values, appended?, the log's (key, value, diff) in row order)
        type Step = (Vec<i64>, Vec<i64>, bool, Vec<(i64, i64, i64)>);
        let steps: Vec<Step> = vec![
            // Into the empty table.
            (
                vec![12, 10, 11],
                vec![1, 2, 3],
                true,
                vec![(12, 1, 1), (10, 2, 1), (11, 3, 1)],
            ),
            // All after the stored keys, in any row order.
            (vec![30, 20], vec![4, 5], true, vec![(30, 4, 1), (20, 5, 1)]),
            // One before them.
            (vec![40, 5], vec![6, 7], false, vec![(40, 6, 1), (5, 7, 1)]),
            // The first equal to the last stored key: replaced, not appended.
            (
                vec![40, 50],
                vec![8, 9],
                false,
                vec![(40, 6, -1), (40, 8, 1), (50, 9, 1)],
            ),
            // One key twice: the later row wins.
            (
                vec![60, 60],
                vec![1, 2],
                false,
                vec![(60, 1, 1), (60, 1, -1), (60, 2, 1)],
            ),
        ];
        for (i, (keys, values, appended, logged)) in steps.into_iter().enumerate() {
            let before = appends.load(Ordering::SeqCst);
            let n = keys.len();
            let batch = RecordBatch::try_new(
                t.arrow_schema.clone(),
                vec![
                    Arc::new(Int64Array::from(keys)),
                    Arc::new(Int64Array::from(values)),
                    Arc::new(TimestampMillisecondArray::from(vec![0; n])),
                ],
            )
            .unwrap();
            let mut set = WriteSet::new();
            set.upsert(t.clone(), batch);
            assert_eq!(store.commit(set).unwrap().rows, n as u64, "step {i}");
            assert_eq!(
                appends.load(Ordering::SeqCst) > before,
                appended,
                "step {i}"
            );
            let part = store.read_log_part(&t, after).unwrap().unwrap();
            after = part.end;
            let (k, v) = (ints(&part.change.batch, 0), ints(&part.change.batch, 1));
            let got: Vec<(i64, i64, i64)> = (0..k.len())
                .map(|r| (k[r], v[r], part.change.diffs[r]))
                .collect();
            assert_eq!(got, logged, "step {i}");
        }
        let snapshot = store.scan(&t).unwrap();
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for b in &snapshot.batches {
            k.extend(ints(b, 0));
            v.extend(ints(b, 1));
        }
        assert_eq!(k, vec![5, 10, 11, 12, 20, 30, 40, 50, 60]);
        assert_eq!(v, vec![7, 2, 3, 1, 5, 4, 8, 9, 2]);
    }

    #[test]
    fn concurrent_commits_share_a_storage_commit_and_each_keeps_its_own_result() {
        let (store, commits) = slow_first_store();
        let t = test_table(&store, 7, key_and_time(), false);
        let mut follow = store
            .follow(std::slice::from_ref(&t), None, false, &mut |_| {
                Box::new(|_| {})
            })
            .unwrap();
        let start = Position::after_commit(follow.seq);
        assert_eq!(commits.load(Ordering::SeqCst), 1);

        // 16 writers at once; writer 5's fence refuses its set.
        let writers = 16i64;
        let barrier = Arc::new(std::sync::Barrier::new(writers as usize));
        let handles: Vec<_> = (0..writers)
            .map(|w| {
                let (store, t, barrier) = (store.clone(), t.clone(), barrier.clone());
                std::thread::spawn(move || {
                    let mut set = WriteSet::new();
                    set.upsert(t.clone(), rows(&t, w * 100..w * 100 + 10));
                    set.put_meta(format!("app/{w}"), b"x".to_vec());
                    if w == 5 {
                        set.fence(Arc::new(|| {
                            crate::error::ConflictSnafu {
                                message: "stale".to_string(),
                            }
                            .fail()
                        }));
                    }
                    if w > 0 {
                        // Writer 0 goes first and holds the lock for 300 ms.
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    barrier.wait();
                    (w, store.commit(set))
                })
            })
            .collect();
        let mut seqs = Vec::new();
        for h in handles {
            let (w, r) = h.join().unwrap();
            match w {
                5 => assert!(
                    matches!(&r, Err(crate::error::Error::Conflict { .. })),
                    "{r:?}"
                ),
                _ => {
                    let info = r.unwrap();
                    assert_eq!(info.rows, 10);
                    seqs.push(info.seq);
                }
            }
        }
        seqs.sort_unstable();
        let first = seqs[0];
        assert_eq!(
            seqs,
            (first..first + 15).collect::<Vec<_>>(),
            "one sequence number per committed set"
        );
        let storage_commits = commits.load(Ordering::SeqCst) - 1;
        assert!(
            storage_commits < 8,
            "15 sets took {storage_commits} storage commits"
        );
        assert_eq!(store.last_seq().unwrap(), first + 14);

        // The refused set wrote nothing; each other one is in the table, in
        // the metadata and in the change log as its own entry.
        let mut logged = Vec::new();
        let mut at = start;
        while let Some(part) = store.read_log_part(&t, at).unwrap() {
            let keys = part
                .change
                .batch
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            logged.push((part.end.seq, keys.values().to_vec()));
            at = part.end;
        }
        assert_eq!(logged.len(), 15);
        for (seq, keys) in &logged {
            assert_eq!(keys.len(), 10, "commit {seq}");
            assert_ne!(keys[0], 500);
        }
        assert_eq!(scanned_rows(&store, &t), 150);
        assert!(store.get_meta("app/5").unwrap().is_none());
        assert!(store.get_meta("app/6").unwrap().is_some());
        drop(follow.readers.pop());
    }

    #[test]
    fn a_late_value_is_made_once_and_its_failure_refuses_only_its_set() {
        let (store, commits) = slow_first_store();
        let t = test_table(&store, 7, key_and_time(), false);
        assert_eq!(commits.load(Ordering::SeqCst), 1);
        // Writer 0 holds the commit lock for 300 ms; meanwhile writer 1,
        // whose late value fails, and writer 2 queue up and commit in one
        // group, which is tried again set by set once writer 1 fails.
        let made = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..3i64)
            .map(|w| {
                let (store, t, made) = (store.clone(), t.clone(), made.clone());
                std::thread::spawn(move || {
                    let mut set = WriteSet::new();
                    set.upsert(t.clone(), rows(&t, w * 100..w * 100 + 10));
                    set.put_meta(format!("app/{w}"), b"x".to_vec());
                    if w > 0 {
                        let value = LateValue::new(move || {
                            made.fetch_add(1, Ordering::SeqCst);
                            match w {
                                1 => Err("the state could not be written".to_string()),
                                _ => Ok(vec![w as u8]),
                            }
                        });
                        set.put_meta_late(format!("app/late/{w}"), value);
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    store.commit(set)
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results[0].as_ref().unwrap().rows, 10);
        let refused = format!("{:?}", results[1]);
        assert!(
            refused.contains("the state could not be written"),
            "{refused}"
        );
        assert_eq!(results[2].as_ref().unwrap().rows, 10);
        assert_eq!(made.load(Ordering::SeqCst), 2, "each late value made once");
        assert_eq!(store.get_meta("app/late/2").unwrap(), Some(vec![2]));
        assert!(store.get_meta("app/late/1").unwrap().is_none());
        assert!(store.get_meta("app/1").unwrap().is_none());
        assert_eq!(scanned_rows(&store, &t), 20);
    }

    #[test]
    fn rows_are_ordered_by_key_and_of_one_key_the_earlier_first() {
        // Keys that tie on their first 16 bytes, share prefixes, end in
        // zero bytes or are short; each several times.
        let long = |tail: &[u8]| [b"0123456789abcdef".as_slice(), tail].concat();
        let distinct: Vec<Vec<u8>> = vec![
            long(b"b"),
            long(b"a"),
            long(b""),
            long(b"a\0"),
            b"ab".to_vec(),
            b"ab\0".to_vec(),
            b"a".to_vec(),
            Vec::new(),
            b"\xff".to_vec(),
        ];
        // The rows of `stream`, one key each, and their order by key.
        let keys_of = |stream: &[Vec<u8>]| {
            let keys = RowKeys {
                bytes: stream.concat(),
                ends: stream
                    .iter()
                    .scan(0, |end, key| {
                        *end += key.len();
                        Some(*end)
                    })
                    .collect(),
                order: Vec::new(),
            };
            let mut expected: Vec<usize> = (0..stream.len()).collect();
            expected.sort_by(|a, b| stream[*a].cmp(&stream[*b]));
            (keys, expected)
        };
        let stream: Vec<Vec<u8>> = (0..60usize)
            .map(|i| distinct[(i * 7) % distinct.len()].clone())
            .collect();
        let (keys, expected) = keys_of(&stream);
        assert_eq!(keys.sorted_order(), expected);
        // Already in order: kept as it is.
        let in_order: Vec<Vec<u8>> = expected.iter().map(|&r| stream[r].clone()).collect();
        let (sorted, _) = keys_of(&in_order);
        assert_eq!(sorted.sorted_order(), (0..stream.len()).collect::<Vec<_>>());
        // Runs of one first word in order, each run shuffled (as a flow's
        // output in a table keyed by time first comes), and the same rows
        // with one run out of place: both sorted in full.
        let word_runs: Vec<Vec<u8>> = (0..40u64)
            .map(|i| {
                let mut key = (i / 10).to_be_bytes().to_vec();
                key.extend_from_slice(&distinct[(i as usize * 7) % distinct.len()]);
                key
            })
            .collect();
        let mut out_of_place = word_runs.clone();
        out_of_place.swap(0, 39);
        // A back-fill's output into a table keyed by time first: by series,
        // each series' times ascending (one first word per time), with
        // series names that tie on their first bytes.
        let by_series: Vec<Vec<u8>> = (0..6u64)
            .flat_map(|series| {
                (0..9u64).map(move |time| {
                    let mut key = (time * 60_000).to_be_bytes().to_vec();
                    key.extend_from_slice(b"host-0000000");
                    key.push(b'a' + series as u8);
                    key
                })
            })
            .collect();
        for stream in [word_runs, out_of_place, by_series] {
            let (keys, expected) = keys_of(&stream);
            assert_eq!(keys.sorted_order(), expected);
        }
    }

    #[test]
    fn a_prepared_upsert_writes_what_the_batch_would_and_is_refused_once_its_table_is_altered() {
        let store = Store::in_memory().unwrap();
        let t = test_table(&store, 7, key_and_time(), false);
        let mut set = WriteSet::new();
        set.upsert_prepared(PreparedUpsert::new(t.clone(), &rows(&t, 0..10)).unwrap());
        assert_eq!(store.commit(set).unwrap().rows, 10);
        assert_eq!(scanned_rows(&store, &t), 10);
        // Prepared for layout 0; the table is then relaid out as version 1.
        let stale = PreparedUpsert::new(t.clone(), &rows(&t, 10..20)).unwrap();
        let seq = store.last_seq().unwrap();
        let mut info = t.info.clone();
        info.version = 1;
        let mut relayout = WriteSet::new();
        relayout.relayout(t.id(), 1, seq);
        relayout.upsert(Table::new(info), rows(&t, 20..21));
        store.commit(relayout).unwrap();
        let mut set = WriteSet::new();
        set.upsert_prepared(stale);
        let refused = format!("{:?}", store.commit(set));
        assert!(refused.contains("was altered"), "{refused}");
        assert_eq!(scanned_rows(&store, &t), 11);
    }
}
