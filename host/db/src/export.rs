//! Change export: the committed changes of the tables flows read, handed to
//! a publisher outside the database (the cluster's change streams) in
//! commit order, by position.
//!
//! Turned on by [`crate::flow::FlowSettings::export_changes`]. A table is
//! exported from the moment a flow that reads it starts (at open, before
//! any flow runs, so that no flow trims what is not exported yet). The
//! database keeps each exported table's change log from the last position
//! the publisher acknowledged, so a publisher that falls behind or restarts
//! loses nothing; the acknowledged positions are persisted (metadata
//! `export/pos/<table id>`, at most once a second) and are where the log is
//! kept from after a restart. A publisher that restarts asks its stream
//! where it stands and [`Exporter::seek`]s there, so nothing is published
//! twice either (and a repeat is dropped by the stream anyway).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::arrow::record_batch::RecordBatch;
use tokio::sync::Notify;

use crate::error::{Result, SqlSnafu};
use crate::schema::{Table, TableId};
use crate::storage::{LogReader, Store, WriteSet};
pub use sandflow_flows::Position;

/// The column of an exported part that holds each row's diff (+1 inserted,
/// -1 deleted), after the table's columns.
pub const DIFF_COLUMN: &str = "__sandflow_diff";

/// How often acknowledged positions are persisted.
const PERSIST_EVERY: Duration = Duration::from_secs(1);

fn position_key(table: TableId) -> String {
    format!("export/pos/{table}")
}

/// One part of one table's changes (at most [`crate::storage::PART_ROWS`]
/// rows), ready to publish.
#[derive(Debug, Clone)]
pub struct ExportPart {
    pub table_id: TableId,
    /// `database.table`.
    pub table: String,
    /// The position after this part.
    pub end: Position,
    /// An Arrow IPC stream of one batch: the table's columns, then
    /// [`DIFF_COLUMN`].
    pub body: Vec<u8>,
}

struct Exported {
    table: Arc<Table>,
    /// Keeps the table's log, from `acked` on.
    reader: Arc<LogReader>,
    /// Parts up to here were handed out.
    handed: Position,
    acked: Position,
    persisted: Position,
}

/// The exported tables and where their publisher stands.
pub(crate) struct Exporter {
    store: Arc<Store>,
    tables: Mutex<HashMap<TableId, Exported>>,
    notify: Arc<Notify>,
    last_persist: Mutex<Instant>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exporter")
    }
}

fn poisoned() -> crate::Error {
    SqlSnafu {
        message: "the change export's state was poisoned by a panic",
    }
    .build()
}

impl Exporter {
    pub(crate) fn new(store: Arc<Store>) -> Exporter {
        Exporter {
            store,
            tables: Mutex::new(HashMap::new()),
            notify: Arc::new(Notify::new()),
            last_persist: Mutex::new(Instant::now()),
        }
    }

    /// Exports `tables` too (those not exported yet), from their persisted
    /// position; a table never exported from `floor` (per table, where its
    /// reader's log is kept from: a restored flow's snapshot), or else from
    /// the next commit on.
    pub(crate) fn ensure(&self, tables: &[Arc<Table>], floor: Option<&[Position]>) -> Result<()> {
        let mut state = self.tables.lock().map_err(|_| poisoned())?;
        let new: Vec<Arc<Table>> = tables
            .iter()
            .filter(|t| !state.contains_key(&t.id()))
            .cloned()
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        let mut stored: Vec<Option<Position>> = Vec::with_capacity(new.len());
        for t in &new {
            let bytes = self.store.get_meta(&position_key(t.id()))?;
            stored.push(bytes.as_deref().and_then(Position::from_bytes));
        }
        // A table never exported starts after the commit the reader is
        // registered at (under the commit lock: nothing missed).
        let keep: Vec<Position> = stored
            .iter()
            .map(|s| s.unwrap_or(Position::START))
            .collect();
        let notify = self.notify.clone();
        let following = self.store.follow(&new, Some(&keep), false, &mut |_| {
            let n = notify.clone();
            Box::new(move |_| n.notify_one())
        })?;
        let now = Position::after_commit(following.seq);
        for ((table, reader), from) in new.into_iter().zip(following.readers).zip(stored) {
            let floor = floor.and_then(|f| {
                tables
                    .iter()
                    .position(|t| t.id() == table.id())
                    .and_then(|i| f.get(i).copied())
            });
            let from = from.or(floor).unwrap_or(now);
            reader.keep_from_position(from);
            state.insert(
                table.id(),
                Exported {
                    table,
                    reader,
                    handed: from,
                    acked: from,
                    persisted: from,
                },
            );
        }
        self.notify.notify_one();
        Ok(())
    }

    /// The next part of each exported table that has one after what was
    /// handed out (at most one per table), and marks them handed out.
    pub(crate) fn next(&self) -> Result<Vec<ExportPart>> {
        let mut state = self.tables.lock().map_err(|_| poisoned())?;
        let mut out = Vec::new();
        for e in state.values_mut() {
            if e.reader.is_closed() {
                continue;
            }
            let Some(part) = self.store.read_log_part(&e.table, e.handed)? else {
                continue;
            };
            out.push(ExportPart {
                table_id: e.table.id(),
                table: e.table.qualified_name(),
                end: part.end,
                body: encode(&part.change.batch, part.change.diffs)?,
            });
            e.handed = part.end;
        }
        // Dropped tables: nothing more will come.
        state.retain(|_, e| !e.reader.is_closed());
        Ok(out)
    }

    /// Hands out `table`'s parts after `after` next (what its stream
    /// already holds, when the publisher starts).
    pub(crate) fn seek(&self, table: TableId, after: Position) -> Result<()> {
        let mut state = self.tables.lock().map_err(|_| poisoned())?;
        if let Some(e) = state.get_mut(&table) {
            e.handed = after;
            if after > e.acked {
                e.acked = after;
                e.reader.keep_from_position(after);
            }
        }
        Ok(())
    }

    /// `table`'s parts up to `end` are safe elsewhere: its log may be
    /// trimmed to there. Persists the acknowledged positions at most once a
    /// second.
    pub(crate) fn ack(&self, table: TableId, end: Position) -> Result<()> {
        let mut due: Vec<(TableId, Position)> = Vec::new();
        {
            let mut state = self.tables.lock().map_err(|_| poisoned())?;
            if let Some(e) = state.get_mut(&table) {
                if end > e.acked {
                    e.acked = end;
                }
            }
            let mut last = self.last_persist.lock().map_err(|_| poisoned())?;
            if last.elapsed() >= PERSIST_EVERY {
                *last = Instant::now();
                for (id, e) in state.iter() {
                    if e.acked > e.persisted {
                        due.push((*id, e.acked));
                    }
                }
            }
        }
        if due.is_empty() {
            return Ok(());
        }
        let mut set = WriteSet::new();
        for (id, p) in &due {
            set.put_meta(position_key(*id), p.to_bytes().to_vec());
        }
        self.store.commit(set)?;
        let mut state = self.tables.lock().map_err(|_| poisoned())?;
        let mut trimmed = Vec::new();
        for (id, p) in due {
            if let Some(e) = state.get_mut(&id) {
                e.persisted = p;
                e.reader.keep_from_position(p);
                trimmed.push(id);
            }
        }
        drop(state);
        self.store.trim_logs_of(&trimmed)
    }

    /// The exported tables: id and `database.table`.
    pub(crate) fn tables(&self) -> Vec<(TableId, String)> {
        self.tables
            .lock()
            .map(|s| {
                s.values()
                    .map(|e| (e.table.id(), e.table.qualified_name()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Woken by every commit to an exported table (and a new export).
    pub(crate) fn notify(&self) -> Arc<Notify> {
        self.notify.clone()
    }
}

/// An Arrow IPC stream of `batch` with the diffs as a last column.
fn encode(batch: &RecordBatch, diffs: Vec<i64>) -> Result<Vec<u8>> {
    let err = |e: datafusion::arrow::error::ArrowError| {
        SqlSnafu {
            message: format!("cannot encode changes for the change stream: {e}"),
        }
        .build()
    };
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.push(Field::new(DIFF_COLUMN, DataType::Int64, false));
    let schema = Arc::new(Schema::new(fields));
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    let diffs = match batch.num_rows() {
        0 => Vec::new(),
        _ => diffs,
    };
    columns.push(Arc::new(Int64Array::from(diffs)));
    let with_diffs = RecordBatch::try_new(schema.clone(), columns).map_err(err)?;
    let mut out = Vec::new();
    let mut writer = StreamWriter::try_new(&mut out, &schema).map_err(err)?;
    writer.write(&with_diffs).map_err(err)?;
    writer.finish().map_err(err)?;
    drop(writer);
    Ok(out)
}

/// Reads a part [`ExportPart::body`] holds: the rows, and their diffs.
pub fn decode(body: &[u8]) -> Result<(RecordBatch, Vec<i64>)> {
    let err = |m: String| {
        SqlSnafu {
            message: format!("unreadable part of a change stream: {m}"),
        }
        .build()
    };
    let reader = datafusion::arrow::ipc::reader::StreamReader::try_new(body, None)
        .map_err(|e| err(e.to_string()))?;
    let mut batches = Vec::new();
    for b in reader {
        batches.push(b.map_err(|e| err(e.to_string()))?);
    }
    let [batch] = <[RecordBatch; 1]>::try_from(batches)
        .map_err(|b| err(format!("{} batches, expected 1", b.len())))?;
    let n = batch.num_columns();
    if n == 0 || batch.schema().field(n - 1).name() != DIFF_COLUMN {
        return Err(err(format!("no {DIFF_COLUMN} column")));
    }
    let diffs = batch
        .column(n - 1)
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or_else(|| err(format!("{DIFF_COLUMN} is not BIGINT")))?
        .values()
        .to_vec();
    let rows = batch
        .project(&(0..n - 1).collect::<Vec<_>>())
        .map_err(|e| err(e.to_string()))?;
    Ok((rows, diffs))
}
