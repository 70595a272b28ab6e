//! Recordings of flows, and their replay offline.
//!
//! A recording starts at a snapshot of the flow's guest, taken for it, with
//! a copy of the sink as that snapshot's commit left it. From then on every
//! tick of the flow is journaled (its time and, per source, the change log
//! position it had read up to) in the same commit as its output, and the
//! flow's change logs are kept from the start on. A crash loses nothing of
//! it: the start, the journal and the logs are all committed.
//!
//! [`export`] reads everything in one consistent view of the store: the
//! start, the journal, the changes each tick took in and the sink now.
//! [`replay`] restores the guest from the start's state in a sandbox (or
//! natively), loads the start's sink into an in-memory database, pushes
//! each tick's changes and ticks at the recorded times, writing the output
//! with the same code the server uses: the sink must come out equal to the
//! recording's end, value for value (floats bit for bit).
//!
//! The file is JSON, described in `docs/recording.md`. [`VERSION`] goes up
//! when the format changes; [`Recording::from_json`] reads every version up
//! to it.
//!
//! Architecture invariant: the runner knows nothing of recordings; it only
//! answers [`sandflow_flows::SinkCommitter::journaling`] and
//! `wants_snapshot`, which [`RecordingState`] decides.

use std::sync::{Arc, Mutex};

use base64::Engine as _;
use datafusion::arrow::record_batch::RecordBatch;
use sandflow_contract::arrow::{batch_from_arrow, batch_to_arrow, fields_from_arrow};
use sandflow_contract::{Batch, DataType, Field, Value};
use sandflow_flows::{Failure, Guest, Position};
use serde::{Deserialize, Serialize};

use crate::catalog::Table;
use crate::database::{ClockConfig, Database, DatabaseConfig, StorageConfig};
use crate::error::{FlowSnafu, InvalidDataSnafu, NotFoundSnafu, Result};
use crate::flow::{FlowEngine, FlowSettings};
use crate::runtime::{FlowLimits, Sandbox};
use crate::storage::{ReadView, Store, WriteSet};

/// The `format` field of every recording.
pub const FORMAT: &str = "sandflow-recording";
/// The format version this build writes; it reads every version up to it.
pub const VERSION: u32 = 1;

/// A flow's recording: what it is, where it started, what it took in tick
/// by tick, and what its sink was at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format's version ([`VERSION`] when written by this build).
    pub version: u32,
    pub flow: RecordedFlow,
    /// The flow's sources, in the order the flow numbers them.
    pub sources: Vec<RecordedTable>,
    pub sink: RecordedTable,
    pub start: RecordedStart,
    /// Every tick after the start, in order.
    pub ticks: Vec<RecordedTick>,
    pub end: RecordedEnd,
}

/// The flow's definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedFlow {
    pub name: String,
    /// `SHOW CREATE FLOW`'s text.
    pub create_statement: String,
}

/// A table the flow reads or writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedTable {
    pub database: String,
    pub name: String,
    /// `SHOW CREATE TABLE`'s text.
    pub create_statement: String,
    /// The columns as rows are written in this recording.
    pub columns: Vec<RecordedColumn>,
}

/// A column: its name, its type (one of the engine's types, e.g. `Int64`,
/// `Float64`, `Utf8`, `TimestampMillisecond`) and whether it takes NULL.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedColumn {
    pub name: String,
    #[serde(rename = "type")]
    pub data_type: String,
    pub nullable: bool,
}

/// Where the recording starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedStart {
    /// The time (ms since the Unix epoch, the server's clock) of the tick
    /// whose snapshot the recording starts at.
    pub time_ms: i64,
    /// Per source, the change log position the state reflects.
    pub positions: Vec<String>,
    /// The guest's state (base64): what `snapshot` returned.
    pub state: String,
    /// The sink's rows then (in the sink's columns, in key order).
    pub sink: Vec<Vec<serde_json::Value>>,
}

/// One tick: the changes it took in, then the time it ran at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedTick {
    pub time_ms: i64,
    /// Per source, the change log position read up to before the tick.
    pub positions: Vec<String>,
    /// The changes read since the previous tick, part by part.
    pub changes: Vec<RecordedChange>,
}

/// One part of a source's changes: rows in the source's columns, each with
/// its diff (+1 added, -1 removed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedChange {
    pub source: u32,
    /// The change log position after this part.
    pub end: String,
    pub rows: Vec<Vec<serde_json::Value>>,
    pub diffs: Vec<i64>,
}

/// The end of the recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedEnd {
    /// When the recording was read (the server's clock).
    pub time_ms: i64,
    /// The sink's rows then, as the server had them.
    pub sink: Vec<Vec<serde_json::Value>>,
}

impl Recording {
    /// Reads a recording of this or an earlier version.
    pub fn from_json(text: &[u8]) -> Result<Recording> {
        #[derive(Deserialize)]
        struct Header {
            format: Option<String>,
            version: Option<u32>,
        }
        let header: Header = serde_json::from_slice(text).map_err(|e| {
            invalid(format!(
                "this is not a sandflow recording (not JSON of one): {e}"
            ))
        })?;
        if header.format.as_deref() != Some(FORMAT) {
            return Err(invalid(format!(
                "this is not a sandflow recording: its \"format\" is not \"{FORMAT}\""
            )));
        }
        match header.version {
            Some(v) if (1..=VERSION).contains(&v) => {}
            Some(v) => {
                return Err(invalid(format!(
                    "recording format version {v} is newer than this sandflow reads (up to \
                     {VERSION}); replay it with a newer sandflow"
                )))
            }
            None => return Err(invalid("the recording has no \"version\"")),
        }
        serde_json::from_slice(text)
            .map_err(|e| invalid(format!("the recording is malformed: {e}")))
    }

    /// The recording as JSON (pretty-printed).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).unwrap_or_default()
    }
}

fn invalid(message: impl Into<String>) -> crate::Error {
    InvalidDataSnafu {
        message: message.into(),
    }
    .build()
}

fn flow_error(message: impl Into<String>) -> crate::Error {
    FlowSnafu {
        message: message.into(),
    }
    .build()
}

// ---------------------------------------------------------------------------
// Values as JSON

/// `value` as JSON: integers as numbers, floats as strings of their
/// shortest exact form (`"0.1"`, `"NaN"`, `"inf"`, `"-0"`), strings as
/// strings, binary as hex, NULL as null.
fn value_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::UInt(u) => J::from(*u),
        Value::Float(f) => J::String(f.to_string()),
        Value::Str(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(hex::encode(b)),
        Value::List(items) => J::Array(items.iter().map(value_json).collect()),
    }
}

fn json_value(j: &serde_json::Value, f: &Field) -> Result<Value> {
    use serde_json::Value as J;
    let bad = || {
        invalid(format!(
            "value {j} does not fit column '{}' of type {:?}",
            f.name, f.data_type
        ))
    };
    if j.is_null() {
        return Ok(Value::Null);
    }
    Ok(match f.data_type {
        DataType::List(item) => {
            let item = Field::new(f.name.clone(), *item, true);
            let items = j.as_array().ok_or_else(bad)?;
            Value::List(
                items
                    .iter()
                    .map(|j| json_value(j, &item))
                    .collect::<Result<_>>()?,
            )
        }
        DataType::Boolean => Value::Bool(j.as_bool().ok_or_else(bad)?),
        t if t.is_unsigned_int() => Value::UInt(j.as_u64().ok_or_else(bad)?),
        DataType::Float32 | DataType::Float64 => match j {
            J::String(s) => Value::Float(s.parse().map_err(|_| bad())?),
            _ => Value::Float(j.as_f64().ok_or_else(bad)?),
        },
        DataType::Utf8 => Value::Str(j.as_str().ok_or_else(bad)?.to_string()),
        DataType::Binary => {
            Value::Bytes(hex::decode(j.as_str().ok_or_else(bad)?).map_err(|_| bad())?)
        }
        _ => Value::Int(j.as_i64().ok_or_else(bad)?),
    })
}

fn columns_of(fields: &[Field]) -> Vec<RecordedColumn> {
    fields
        .iter()
        .map(|f| RecordedColumn {
            name: f.name.clone(),
            data_type: format!("{:?}", f.data_type),
            nullable: f.nullable,
        })
        .collect()
}

fn fields_of(columns: &[RecordedColumn]) -> Result<Vec<Field>> {
    columns
        .iter()
        .map(|c| {
            let t = DataType::ALL
                .iter()
                .flat_map(|t| [Some(*t), DataType::list_of(*t)])
                .flatten()
                .find(|t| format!("{t:?}") == c.data_type)
                .ok_or_else(|| {
                    invalid(format!(
                        "column '{}' has type '{}', which this sandflow does not know",
                        c.name, c.data_type
                    ))
                })?;
            Ok(Field::new(c.name.clone(), t, c.nullable))
        })
        .collect()
}

/// Rows (with their diffs) of a batch, as JSON.
fn rows_json(batch: &Batch, fields: &[Field]) -> (Vec<Vec<serde_json::Value>>, Vec<i64>) {
    batch
        .to_rows(fields)
        .into_iter()
        .map(|(row, _, diff)| (row.iter().map(value_json).collect(), diff))
        .unzip()
}

fn batch_of(
    rows: &[Vec<serde_json::Value>],
    diffs: &[i64],
    fields: &[Field],
    time: i64,
) -> Result<Batch> {
    let values = rows
        .iter()
        .map(|r| {
            if r.len() != fields.len() {
                return Err(invalid(format!(
                    "a row has {} values where the table has {} columns",
                    r.len(),
                    fields.len()
                )));
            }
            r.iter()
                .zip(fields)
                .map(|(j, f)| json_value(j, f))
                .collect()
        })
        .collect::<Result<Vec<Vec<Value>>>>()?;
    Batch::from_rows(fields, &values, &vec![time; values.len()], diffs)
        .map_err(|e| invalid(format!("recorded rows do not fit their columns: {e}")))
}

/// The rows of a table (in key order) as JSON.
fn table_rows(
    view: &ReadView,
    table: &Table,
    fields: &[Field],
) -> Result<Vec<Vec<serde_json::Value>>> {
    rows_of(&view.scan(table)?.batches, table, fields)
}

/// Scanned rows of `table` as JSON.
fn rows_of(
    batches: &[RecordBatch],
    table: &Table,
    fields: &[Field],
) -> Result<Vec<Vec<serde_json::Value>>> {
    let mut rows = Vec::new();
    for b in batches {
        let batch = batch_from_arrow(b, fields, 0, vec![1; b.num_rows()]).map_err(|e| {
            invalid(format!(
                "cannot read table '{}': {e}",
                table.qualified_name()
            ))
        })?;
        rows.extend(rows_json(&batch, fields).0);
    }
    Ok(rows)
}

fn table_fields(table: &Table) -> Result<Vec<Field>> {
    fields_from_arrow(&table.arrow_schema).map_err(|e| {
        invalid(format!(
            "table '{}' has a column a recording cannot hold: {e}",
            table.qualified_name()
        ))
    })
}

fn positions_text(ps: &[Position]) -> Vec<String> {
    ps.iter().map(Position::to_string).collect()
}

fn positions_of(ps: &[String]) -> Result<Vec<Position>> {
    ps.iter()
        .map(|p| p.parse::<Position>().map_err(invalid))
        .collect()
}

// ---------------------------------------------------------------------------
// The recording of a running flow

/// Meta keys of flow `name`'s recording start: `flow/rec/<len>/<name>/`
/// (the length keeps one flow's keys apart from another's whose name starts
/// with this one's and a `/`).
pub(crate) fn key_prefix(name: &str) -> String {
    format!("flow/rec/{}/{name}/", name.len())
}

fn start_key(name: &str) -> String {
    format!("{}start", key_prefix(name))
}

fn tick_key(name: &str, n: u64) -> String {
    format!("{}tick/{n:020}", key_prefix(name))
}

/// A journaled tick as stored.
#[derive(Serialize, Deserialize)]
struct StoredTick {
    t: i64,
    p: Vec<String>,
}

/// The start as stored: the file's start, with the sink's columns.
#[derive(Serialize, Deserialize)]
struct StoredStart {
    start: RecordedStart,
    sink_columns: Vec<RecordedColumn>,
}

/// Whether flow is being recorded, shared by its sink port (which journals
/// and starts the recording), the manager and the log trimming.
#[derive(Debug, Default)]
pub(crate) struct RecordingState(Mutex<RecInner>);

#[derive(Debug, Default)]
struct RecInner {
    /// A start was asked for: the next snapshot commit begins the recording.
    requested: bool,
    /// Why the last start failed.
    start_error: Option<String>,
    active: Option<Active>,
}

#[derive(Debug, Clone)]
struct Active {
    /// Per source, where the recording starts: the logs are kept from here.
    positions: Vec<Position>,
    /// The number of the next journaled tick.
    next_tick: u64,
}

impl RecordingState {
    /// The state of `name`'s recording as stored.
    pub(crate) fn load(store: &Store, name: &str) -> Result<RecordingState> {
        let view = store.view()?;
        let state = RecordingState::default();
        if let Some(bytes) = view.get_meta(&start_key(name))? {
            let stored: StoredStart = serde_json::from_slice(&bytes)
                .map_err(|e| invalid(format!("flow '{name}' has an unreadable recording: {e}")))?;
            let ticks = view.scan_meta(&format!("{}tick/", key_prefix(name)))?;
            let next_tick = ticks
                .last()
                .and_then(|(k, _)| k.rsplit('/').next()?.parse::<u64>().ok())
                .map_or(0, |n| n + 1);
            state.lock().active = Some(Active {
                positions: positions_of(&stored.start.positions)?,
                next_tick,
            });
        }
        Ok(state)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether every tick is to be committed.
    pub(crate) fn journaling(&self) -> bool {
        let s = self.lock();
        s.requested || s.active.is_some()
    }

    pub(crate) fn wants_snapshot(&self) -> bool {
        self.lock().requested
    }

    /// Per source, where the recording starts (the logs are kept from there).
    pub(crate) fn start_positions(&self) -> Option<Vec<Position>> {
        self.lock().active.as_ref().map(|a| a.positions.clone())
    }

    /// The journal entry of a commit, if the recording is on and the commit
    /// comes from a tick: `(key, value)`.
    pub(crate) fn entry(
        &self,
        name: &str,
        now: i64,
        positions: &[Position],
    ) -> Option<(String, Vec<u8>)> {
        let s = self.lock();
        let active = s.active.as_ref()?;
        let value = serde_json::to_vec(&StoredTick {
            t: now,
            p: positions_text(positions),
        })
        .ok()?;
        Some((tick_key(name, active.next_tick), value))
    }

    /// A commit with a journal entry went through.
    pub(crate) fn journaled(&self) {
        if let Some(a) = self.lock().active.as_mut() {
            a.next_tick += 1;
        }
    }

    /// Begins the recording at a commit that carried a snapshot: stores the
    /// start with the sink as the commit left it. Called by the flow's only
    /// writer of its sink, right after that commit.
    pub(crate) fn begin(
        &self,
        store: &Store,
        name: &str,
        sink: &Table,
        now: i64,
        positions: &[Position],
        state: &[u8],
    ) {
        let result = (|| -> Result<()> {
            let fields = table_fields(sink)?;
            let view = store.view()?;
            let start = StoredStart {
                start: RecordedStart {
                    time_ms: now,
                    positions: positions_text(positions),
                    state: base64::engine::general_purpose::STANDARD.encode(state),
                    sink: table_rows(&view, sink, &fields)?,
                },
                sink_columns: columns_of(&fields),
            };
            let mut set = WriteSet::new();
            for (k, _) in view.scan_meta(&key_prefix(name))? {
                set.delete_meta(k);
            }
            drop(view);
            let bytes = serde_json::to_vec(&start)
                .map_err(|e| invalid(format!("cannot encode the recording's start: {e}")))?;
            set.put_meta(start_key(name), bytes);
            store.commit(set)?;
            Ok(())
        })();
        let mut s = self.lock();
        s.requested = false;
        match result {
            Ok(()) => {
                s.start_error = None;
                s.active = Some(Active {
                    positions: positions.to_vec(),
                    next_tick: 0,
                });
            }
            Err(e) => {
                tracing::warn!(flow = %name, "cannot start the recording: {e}");
                s.start_error = Some(e.to_string());
            }
        }
    }

    /// Asks for a start at the flow's next snapshot.
    pub(crate) fn request(&self) {
        let mut s = self.lock();
        s.requested = true;
        s.start_error = None;
    }

    /// After a flush that should have started the recording: `Ok` with the
    /// start positions, or why not.
    pub(crate) fn started(&self) -> std::result::Result<Vec<Position>, String> {
        let mut s = self.lock();
        if let Some(e) = s.start_error.take() {
            s.requested = false;
            return Err(e);
        }
        if s.requested {
            s.requested = false;
            return Err("the flow took no snapshot for it; try again".to_string());
        }
        s.active
            .as_ref()
            .map(|a| a.positions.clone())
            .ok_or_else(|| "the recording did not start".to_string())
    }

    /// Forgets the recording (its keys are deleted by the caller).
    pub(crate) fn stop(&self) -> bool {
        let mut s = self.lock();
        s.requested = false;
        s.active.take().is_some()
    }
}

/// The metadata keys of `name`'s recording (to delete them).
pub(crate) fn stored_keys(store: &Store, name: &str) -> Result<Vec<String>> {
    Ok(store
        .scan_meta(&key_prefix(name))?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

/// The error for a flow that has no recording.
pub(crate) fn not_recorded(name: &str) -> crate::Error {
    NotFoundSnafu {
        message: format!(
            "flow '{name}' is not being recorded; start a recording first \
             (POST /v1/flows/{name}/recording, or `sandflow record --start {name}`)"
        ),
    }
    .build()
}

/// What [`export`] needs of a flow.
pub(crate) struct ExportSource<'a> {
    pub name: &'a str,
    pub create_statement: String,
    pub sources: &'a [Arc<Table>],
    pub sink: &'a Table,
    pub now_ms: i64,
}

/// Reads flow `f`'s recording in one consistent view of the store.
pub(crate) fn export(store: &Store, f: ExportSource<'_>) -> Result<Recording> {
    let view = store.view()?;
    let Some(bytes) = view.get_meta(&start_key(f.name))? else {
        return Err(not_recorded(f.name));
    };
    let stored: StoredStart = serde_json::from_slice(&bytes).map_err(|e| {
        invalid(format!(
            "flow '{}' has an unreadable recording: {e}",
            f.name
        ))
    })?;
    let source_fields = f
        .sources
        .iter()
        .map(|t| table_fields(t))
        .collect::<Result<Vec<_>>>()?;
    let mut at = positions_of(&stored.start.positions)?;
    if at.len() != f.sources.len() {
        return Err(invalid(format!(
            "flow '{}' has a recording of another shape (its sources changed); stop it and \
             start a new one",
            f.name
        )));
    }
    let mut ticks = Vec::new();
    for (_, v) in view.scan_meta(&format!("{}tick/", key_prefix(f.name)))? {
        let t: StoredTick = serde_json::from_slice(&v)
            .map_err(|e| invalid(format!("flow '{}' has an unreadable journal: {e}", f.name)))?;
        let to = positions_of(&t.p)?;
        let mut changes = Vec::new();
        for (s, table) in f.sources.iter().enumerate() {
            let target = to.get(s).copied().unwrap_or_default();
            while at[s] < target {
                let Some(part) = view.read_log_part(table, at[s])? else {
                    return Err(flow_error(format!(
                        "the change log of '{}' no longer holds what flow '{}' read after \
                         position {}; the recording cannot be read",
                        table.qualified_name(),
                        f.name,
                        at[s]
                    )));
                };
                let batch = batch_from_arrow(
                    &part.change.batch,
                    &source_fields[s],
                    0,
                    part.change.diffs.clone(),
                )
                .map_err(|e| invalid(format!("cannot read a logged change: {e}")))?;
                let (rows, diffs) = rows_json(&batch, &source_fields[s]);
                if !rows.is_empty() {
                    changes.push(RecordedChange {
                        source: s as u32,
                        end: part.end.to_string(),
                        rows,
                        diffs,
                    });
                }
                at[s] = part.end;
            }
        }
        ticks.push(RecordedTick {
            time_ms: t.t,
            positions: t.p,
            changes,
        });
    }
    let sink_fields = fields_of(&stored.sink_columns)?;
    let end_sink = table_rows(&view, f.sink, &sink_fields)?;
    let table = |t: &Table, fields: &[Field]| RecordedTable {
        database: t.info.database.clone(),
        name: t.info.name.clone(),
        create_statement: crate::sql::show_create_table(t),
        columns: columns_of(fields),
    };
    Ok(Recording {
        format: FORMAT.to_string(),
        version: VERSION,
        flow: RecordedFlow {
            name: f.name.to_string(),
            create_statement: f.create_statement,
        },
        sources: f
            .sources
            .iter()
            .zip(&source_fields)
            .map(|(t, fields)| table(t, fields))
            .collect(),
        sink: table(f.sink, &sink_fields),
        start: stored.start,
        ticks,
        end: RecordedEnd {
            time_ms: f.now_ms,
            sink: end_sink,
        },
    })
}

// ---------------------------------------------------------------------------
// Replay

/// What a replay gave.
#[derive(Debug, Clone)]
pub struct Replayed {
    /// The sink's column names.
    pub columns: Vec<String>,
    /// The sink after the last tick (in key order), each row as JSON values.
    pub sink: Vec<Vec<serde_json::Value>>,
    /// Ticks run.
    pub ticks: usize,
    /// Sink rows written (upserts + deletes).
    pub rows_written: u64,
    /// The sink as the recording's end has it.
    pub recorded: Vec<Vec<serde_json::Value>>,
    /// The sink as CSV (see [`Replayed::csv`]).
    csv: String,
}

impl Replayed {
    /// Whether the replayed sink is the recorded one, value for value.
    pub fn matches_recording(&self) -> bool {
        sorted(&self.sink) == sorted(&self.recorded)
    }

    /// The sink as CSV: a header of column names, then one line per row in
    /// order of the rows' text; NULL as `NULL`, an empty string as
    /// `(empty)` (as `sandflow test` writes values).
    pub fn csv(&self) -> &str {
        &self.csv
    }
}

fn sorted(rows: &[Vec<serde_json::Value>]) -> Vec<String> {
    let mut v: Vec<String> = rows
        .iter()
        .map(|r| serde_json::Value::Array(r.clone()).to_string())
        .collect();
    v.sort();
    v
}

/// Runs `rec` offline in `engine` (in `sandbox` for wasm, or a new one) and
/// returns the sink it gives.
pub async fn replay(
    rec: &Recording,
    engine: FlowEngine,
    sandbox: Option<Arc<Sandbox>>,
) -> Result<Replayed> {
    let clock = Arc::new(sandflow_flows::VirtualClock::new(rec.start.time_ms));
    let db = Database::open_config(DatabaseConfig {
        storage: StorageConfig::InMemory,
        flows: FlowSettings {
            engine,
            ..FlowSettings::default()
        },
        clock: ClockConfig::Virtual(clock),
    })
    .await?;
    db.execute(&rec.sink.create_statement).await.map_err(|e| {
        invalid(format!(
            "cannot create the recorded sink table '{}': {e}",
            rec.sink.name
        ))
    })?;
    let core = db.core().clone();
    let sink = core.catalog.require_table("public", &rec.sink.name)?;
    let sink_fields = fields_of(&rec.sink.columns)?;
    let source_fields = rec
        .sources
        .iter()
        .map(|t| fields_of(&t.columns))
        .collect::<Result<Vec<_>>>()?;
    if !rec.start.sink.is_empty() {
        let batch = batch_of(
            &rec.start.sink,
            &vec![1; rec.start.sink.len()],
            &sink_fields,
            0,
        )?;
        let arrow = batch_to_arrow(&batch, &sink_fields)
            .map_err(|e| invalid(format!("cannot load the recorded sink: {e}")))?;
        let mut set = WriteSet::new();
        set.upsert(sink.clone(), arrow);
        core.store.commit(set)?;
    }
    let state = base64::engine::general_purpose::STANDARD
        .decode(&rec.start.state)
        .map_err(|e| invalid(format!("the recorded state is not base64: {e}")))?;
    let rec = rec.clone();
    let store = core.store.clone();
    let sink_table = sink.clone();
    let (rows_written, ticks) = tokio::task::spawn_blocking(move || -> Result<(u64, usize)> {
        let (mut guest, output) = restore_guest(engine, sandbox, state)?;
        let mapping = super::sink::fit(&sink_table, &output)
            .map_err(|e| invalid(format!("the recorded sink does not fit the flow: {e}")))?;
        let mut written = 0;
        for (n, tick) in rec.ticks.iter().enumerate() {
            let at =
                |e: Failure| flow_error(format!("tick {n} at {} ms: {}", tick.time_ms, e.message));
            for c in &tick.changes {
                let fields = source_fields.get(c.source as usize).ok_or_else(|| {
                    invalid(format!(
                        "a change of source {} the flow does not have",
                        c.source
                    ))
                })?;
                let batch = batch_of(&c.rows, &c.diffs, fields, tick.time_ms)?;
                guest.push(c.source, batch).map_err(at)?;
            }
            let mut out = Vec::new();
            loop {
                let t = guest.tick(tick.time_ms).map_err(at)?;
                if t.output.rows > 0 {
                    out.push(t.output);
                }
                if !t.more {
                    break;
                }
            }
            let writes =
                super::ports::sink_writes(&sink_table, &output, &mapping, &out, tick.time_ms)
                    .map_err(at)?;
            written += writes.rows();
            if writes.rows() > 0 {
                let mut set = WriteSet::new();
                if let Some(d) = writes.deletes {
                    set.delete(sink_table.clone(), d);
                }
                if let Some(u) = writes.upserts {
                    set.upsert(sink_table.clone(), u);
                }
                store.commit(set)?;
            }
        }
        Ok((written, rec.ticks.len()))
    })
    .await
    .map_err(|e| flow_error(format!("the replay failed: {e}")))??;
    // One scan for both the values and their text.
    let snapshot = core.store.scan(&sink)?;
    let rows = rows_of(&snapshot.batches, &sink, &sink_fields)?;
    let csv = csv_of(
        &sink
            .arrow_schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect::<Vec<_>>(),
        &snapshot.batches,
    );
    Ok(Replayed {
        columns: sink_fields.iter().map(|f| f.name.clone()).collect(),
        sink: rows,
        ticks,
        rows_written,
        recorded: rec.end.sink.clone(),
        csv,
    })
}

fn csv_of(columns: &[String], batches: &[RecordBatch]) -> String {
    let mut lines: Vec<String> = crate::testing::rows_of(batches)
        .into_iter()
        .map(|r| csv_line(&r))
        .collect();
    lines.sort();
    let mut out = csv_line(columns);
    out.push('\n');
    for l in lines {
        out.push_str(&l);
        out.push('\n');
    }
    out
}

fn csv_line(values: &[String]) -> String {
    let mut w = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let _ = w.write_record(values);
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .trim_end_matches('\n')
        .to_string()
}

/// A guest restored from `state`, with its output schema.
fn restore_guest(
    engine: FlowEngine,
    sandbox: Option<Arc<Sandbox>>,
    state: Vec<u8>,
) -> Result<(Box<dyn Guest>, Vec<Field>)> {
    let limits = FlowLimits {
        // Offline, nothing else shares the machine: only the memory cap holds.
        cpu_per_call: std::time::Duration::from_secs(3600),
        output_rows_per_tick: u64::MAX,
        state_size: None,
        ..FlowLimits::default()
    };
    let cannot = |e: String| flow_error(format!("cannot restore the recorded flow state: {e}"));
    match engine {
        FlowEngine::Native => {
            let (guest, output) = super::ports::NativeGuest::start(
                move || sandflow_engine::Flow::restore(&state),
                limits,
            )
            .map_err(|e| cannot(e.to_string()))?;
            Ok((Box::new(guest), output))
        }
        FlowEngine::Wasm => {
            let sandbox = match sandbox {
                Some(s) => s,
                None => Arc::new(
                    Sandbox::new(crate::runtime::RuntimeConfig::default())
                        .map_err(|e| cannot(e.to_string()))?,
                ),
            };
            let engine = sandbox
                .register(crate::engine::component())
                .map_err(|e| cannot(e.to_string()))?;
            let instance = sandbox
                .restore_flow(&engine, &state, limits)
                .map_err(|e| cannot(e.to_string()))?;
            let output = instance.output_schema().to_vec();
            Ok((
                Box::new(super::ports::SandboxGuest {
                    instance,
                    log: None,
                }),
                output,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_survive_json_bit_for_bit() {
        let fields = vec![
            Field::new("f", DataType::Float64, true),
            Field::new("i", DataType::Int64, true),
            Field::new("u", DataType::UInt64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Binary, true),
            Field::new("t", DataType::Boolean, true),
        ];
        let floats = [
            0.1,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-310,
            f64::MAX,
        ];
        let rows: Vec<Vec<Value>> = floats
            .iter()
            .map(|f| {
                vec![
                    Value::Float(*f),
                    Value::Int(i64::MIN),
                    Value::UInt(u64::MAX),
                    Value::Str("a \"b\"\n".into()),
                    Value::Bytes(vec![0, 255]),
                    Value::Bool(true),
                ]
            })
            .chain([vec![Value::Null; 6]])
            .collect();
        let n = rows.len();
        let batch = Batch::from_rows(&fields, &rows, &vec![0; n], &vec![1; n]).unwrap();
        let (json, diffs) = rows_json(&batch, &fields);
        let text = serde_json::to_string(&json).unwrap();
        let back: Vec<Vec<serde_json::Value>> = serde_json::from_str(&text).unwrap();
        let again = batch_of(&back, &diffs, &fields, 0).unwrap();
        for (a, b) in batch.to_rows(&fields).iter().zip(again.to_rows(&fields)) {
            for (x, y) in a.0.iter().zip(&b.0) {
                match (x, y) {
                    (Value::Float(x), Value::Float(y)) => assert_eq!(x.to_bits(), y.to_bits()),
                    _ => assert_eq!(x, y),
                }
            }
        }
    }

    #[test]
    fn newer_or_foreign_files_are_refused_with_a_reason() {
        let e = Recording::from_json(b"{\"format\":\"sandflow-recording\",\"version\":99}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("newer"), "{e}");
        let e = Recording::from_json(b"{\"format\":\"x\"}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a sandflow recording"), "{e}");
        let e = Recording::from_json(b"not json").unwrap_err().to_string();
        assert!(e.contains("not JSON"), "{e}");
    }
}
