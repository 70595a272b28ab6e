//! The flow runner's ports (`sandflow_flows`) over this database: the
//! change log of the store, the sink table and flow metadata, and the guest
//! in the sandbox.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use sandflow_flows::{
    decode_positions, encode_positions, Batch, ChangeLog, Chunk, Commit, Failure, Field, FlowStore,
    Guest, LateSnapshot, Position, SinkCommitter, Stored, TickOutput, Waker,
};

use super::arrow::{batch_from_arrow, batch_to_arrow, schema_from_fields};
use super::recording::RecordingState;
use super::sink::{self, SinkColumn};
use crate::catalog::Table;
use crate::database::Core;
use crate::runtime::{Digest, FlowInstance, FlowLimits, RuntimeError, Sandbox};
use crate::storage::{LateValue, PreparedUpsert, Store, TableCursor, WriteSet};

/// Meta key of a flow's definition (JSON of `FlowDef`).
pub(crate) const DEF_PREFIX: &str = "flow/def/";

/// Meta key of a flow's snapshot (see [`encode_snapshot`]).
pub(crate) fn snapshot_key(name: &str) -> String {
    format!("flow/snap/{name}")
}

/// First bytes of a snapshot in the compressed format: no list of positions
/// starts with them (that would be 2^32 - 2 positions), so the format
/// before it, positions then the raw state, is told apart.
const SNAPSHOT_MAGIC: [u8; 4] = [0xFF, 0xFF, 0xFF, 0xFE];
const STATE_RAW: u8 = 0;
const STATE_SNAPPY: u8 = 1;

/// A snapshot as stored: [`SNAPSHOT_MAGIC`], the positions (as
/// [`encode_positions`] wrote them), a method byte, then the guest's state, Snappy
/// compressed unless too large for Snappy's 32-bit length. Serialised
/// state compresses well (a rollup's 82 MB to a fraction), and the write is
/// on the path of a back-fill and of every periodic snapshot.
pub(crate) fn encode_snapshot(positions: &[u8], state: &[u8]) -> Vec<u8> {
    let mut value = SNAPSHOT_MAGIC.to_vec();
    value.extend_from_slice(positions);
    let compressed = match state.len() < (u32::MAX as usize) / 2 {
        true => snap::raw::Encoder::new().compress_vec(state).ok(),
        false => None,
    };
    match compressed {
        Some(c) => {
            value.push(STATE_SNAPPY);
            value.extend_from_slice(&c);
        }
        None => {
            value.push(STATE_RAW);
            value.extend_from_slice(state);
        }
    }
    value
}

/// Reads [`encode_snapshot`] (and the format before it): the positions and
/// the state. Bytes that do not decompress are returned as they are, for
/// the guest to refuse (its format is checksummed), so that a corrupt
/// snapshot fails its flow as before instead of being silently rebuilt.
pub(crate) fn decode_snapshot(bytes: &[u8]) -> Option<(Vec<Position>, Vec<u8>)> {
    let Some(rest) = bytes.strip_prefix(&SNAPSHOT_MAGIC[..]) else {
        let (positions, state) = decode_positions(bytes)?;
        return Some((positions, state.to_vec()));
    };
    let (positions, rest) = decode_positions(rest)?;
    let (&method, state) = rest.split_first()?;
    let state = match method {
        STATE_SNAPPY => snap::raw::Decoder::new()
            .decompress_vec(state)
            .unwrap_or_else(|_| state.to_vec()),
        _ => state.to_vec(),
    };
    Some((positions, state))
}

/// Meta key of the positions the flow's sink reflects.
pub(crate) fn written_key(name: &str) -> String {
    format!("flow/written/{name}")
}

/// The ids of the tables a flow was built from (sources in guest order,
/// then the sink), stored with its definition.
pub(crate) fn tables_key(name: &str) -> String {
    format!("flow/tables/{name}")
}

/// Keys of the format before per-source positions (one commit sequence):
/// read at start, deleted with the flow.
pub(crate) fn legacy_state_key(name: &str) -> String {
    format!("flow/state/{name}")
}

pub(crate) fn legacy_pos_key(name: &str) -> String {
    format!("flow/pos/{name}")
}

fn failure_of(e: RuntimeError) -> Failure {
    match e {
        RuntimeError::CpuLimit { .. } => Failure::transient(e.to_string()),
        other => Failure::permanent(other.to_string()),
    }
}

/// A source's back-fill: its rows at commit `seq`, read part by part.
struct Backfill {
    seq: u64,
    parts: ReadAhead,
    next_part: u32,
}

type Part = Result<(Batch, bool), Failure>;

/// The parts a reading thread sends ([`read_ahead`]). Dropping it stops the
/// thread and waits for it, so that no read transaction outlives the flow's
/// run (a database reopened at once finds its file free).
struct ReadAhead {
    parts: Option<std::sync::mpsc::Receiver<Part>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ReadAhead {
    fn recv(&self) -> Part {
        match self.parts.as_ref().map(|p| p.recv()) {
            Some(Ok(part)) => part,
            _ => Err(Failure::transient("the back-fill's reader stopped")),
        }
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // A thread blocked sending wakes up with an error; one reading
        // stops after its part.
        self.parts = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Back-fill parts read ahead of the flow: the reading thread converts the
/// next parts while the guest folds in this one (the runner stamps them due
/// at once, see `sandflow_flows::BACKFILL_TIME`).
const READ_AHEAD_PARTS: usize = 4;

/// Reads `cursor` to its end on a thread of its own, at most
/// [`READ_AHEAD_PARTS`] ahead of the flow: each part as the contract's rows
/// and whether it is the last. The thread stops when the flow drops the
/// receiver (and with it releases the read transaction).
fn read_ahead(mut cursor: TableCursor, table: Arc<Table>, fields: Vec<Field>) -> ReadAhead {
    let (tx, rx) = std::sync::mpsc::sync_channel(READ_AHEAD_PARTS);
    let spawned = std::thread::Builder::new()
        .name("backfill-read".into())
        .spawn({
            let tx = tx.clone();
            move || loop {
                let part = match cursor.next_part(&table) {
                    Ok(Some((rows, last))) => {
                        // Every row of a back-fill is an insertion: one diff
                        // for all of them, as the contract allows, which the
                        // guest folds in without reading a diff per row.
                        let diffs = match rows.num_rows() {
                            0 => Vec::new(),
                            _ => vec![1],
                        };
                        convert(&rows, &fields, diffs).map(|b| (b, last))
                    }
                    Ok(None) => Ok((Batch::default(), true)),
                    Err(e) => Err(Failure::transient(format!(
                        "cannot read the back-fill: {e}"
                    ))),
                };
                let stop = !matches!(part, Ok((_, false)));
                if tx.send(part).is_err() || stop {
                    return;
                }
            }
        });
    let thread = match spawned {
        Ok(t) => Some(t),
        Err(e) => {
            let _ = tx.send(Err(Failure::transient(format!(
                "cannot start reading the back-fill: {e}"
            ))));
            None
        }
    };
    ReadAhead {
        parts: Some(rx),
        thread,
    }
}

/// Source rows as the contract's, with `diffs` (one per row, or one for all).
fn convert(
    batch: &datafusion::arrow::record_batch::RecordBatch,
    fields: &[Field],
    diffs: Vec<i64>,
) -> Result<Batch, Failure> {
    batch_from_arrow(batch, fields, 0, diffs)
        .map_err(|e| Failure::permanent(format!("cannot convert source rows: {e}")))
}

/// The changes of a flow's sources: the back-fill first (when the flow is
/// new), then the store's change log.
pub(crate) struct StoreLog {
    store: Arc<Store>,
    sources: Vec<Arc<Table>>,
    fields: Vec<Vec<Field>>,
    backfill: Vec<Option<Backfill>>,
}

impl StoreLog {
    /// `cursors[i]`: source i's rows at `seq`, read before its log (the
    /// runner starts source i at `Position { seq, part: 0 }`).
    pub(crate) fn new(
        store: Arc<Store>,
        sources: Vec<Arc<Table>>,
        fields: Vec<Vec<Field>>,
        seq: u64,
        cursors: Vec<Option<TableCursor>>,
    ) -> StoreLog {
        let backfill = cursors
            .into_iter()
            .zip(sources.iter().zip(&fields))
            .map(|(c, (table, fields))| {
                c.map(|cursor| Backfill {
                    seq,
                    parts: read_ahead(cursor, table.clone(), fields.clone()),
                    next_part: 1,
                })
            })
            .collect();
        StoreLog {
            store,
            sources,
            fields,
            backfill,
        }
    }
}

impl ChangeLog for StoreLog {
    fn read(&mut self, source: u32, after: Position) -> Result<Option<Chunk>, Failure> {
        let s = source as usize;
        let table = self
            .sources
            .get(s)
            .cloned()
            .ok_or_else(|| Failure::permanent(format!("the flow has no source {s}")))?;
        if let Some(b) = &mut self.backfill[s] {
            let seq = b.seq;
            if after.seq == seq && after.part != u32::MAX {
                let part = b.next_part;
                // A failure ends the run; a restart reads the back-fill anew.
                let (batch, last) = b.parts.recv()?;
                b.next_part += 1;
                if last {
                    self.backfill[s] = None;
                }
                let end = if last {
                    Position::after_commit(seq)
                } else {
                    Position { seq, part }
                };
                return Ok(Some(Chunk {
                    batch,
                    end,
                    durable: last,
                }));
            }
            self.backfill[s] = None;
        }
        let part = self
            .store
            .read_log_part(&table, after)
            .map_err(|e| Failure::transient(format!("cannot read the change log: {e}")))?;
        match part {
            None => Ok(None),
            Some(p) => {
                let batch = if p.change.batch.num_rows() == 0 {
                    Batch::default()
                } else {
                    convert(&p.change.batch, &self.fields[s], p.change.diffs)?
                };
                Ok(Some(Chunk {
                    batch,
                    end: p.end,
                    durable: true,
                }))
            }
        }
    }
}

/// A flow's engine in its sandbox.
pub(crate) struct SandboxGuest {
    pub instance: FlowInstance,
    /// Where the guest's stdout and stderr go, and the flow's name.
    pub log: Option<(Arc<super::logs::FlowLogs>, String)>,
}

impl SandboxGuest {
    /// Moves what the guest wrote into the flow's log.
    fn drain_log(&self) {
        if let Some((logs, flow)) = &self.log {
            logs.record(flow, self.instance.take_log());
        }
    }
}

impl Guest for SandboxGuest {
    fn push(&mut self, source: u32, batch: Batch) -> Result<(), Failure> {
        let r = self.instance.push(source, batch).map_err(failure_of);
        self.drain_log();
        r
    }

    fn tick(&mut self, now: i64) -> Result<TickOutput, Failure> {
        let r = self.instance.tick(now).map_err(failure_of);
        self.drain_log();
        r
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, Failure> {
        let r = self.instance.snapshot().map_err(failure_of);
        self.drain_log();
        r
    }

    fn state_size(&mut self) -> Result<u64, Failure> {
        self.instance.state_size().map_err(failure_of)
    }
}

/// A flow's engine compiled into this process, without a sandbox
/// (`FlowEngine::Native`: tests). The engine is not `Send` (its operators
/// share state through `Rc`), so it lives on a thread of its own and each
/// call waits for that thread's answer. Its output is checked and expanded
/// as the sandbox does with a guest's.
pub(crate) struct NativeGuest {
    calls: std::sync::mpsc::Sender<Call>,
}

type Reply<T> = std::sync::mpsc::Sender<Result<T, Failure>>;

enum Call {
    Push(u32, Batch, Reply<()>),
    Tick(i64, Reply<TickOutput>),
    Snapshot(Reply<Vec<u8>>),
    StateSize(Reply<u64>),
}

fn native_failure(e: sandflow_contract::FlowError) -> Failure {
    Failure::permanent(e.to_string())
}

impl NativeGuest {
    /// Starts the engine's thread with the engine `make` builds there;
    /// returns the guest and its output schema, or why `make` failed.
    pub(crate) fn start(
        make: impl FnOnce() -> Result<sandflow_engine::Flow, sandflow_contract::FlowError>
            + Send
            + 'static,
        limits: FlowLimits,
    ) -> Result<(NativeGuest, Vec<Field>), sandflow_contract::FlowError> {
        let (calls, rx) = std::sync::mpsc::channel::<Call>();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("native-flow".into())
            .spawn(move || {
                let mut flow = match make() {
                    Ok(flow) => {
                        let _ = ready_tx.send(Ok(flow.output_schema()));
                        flow
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let output = flow.output_schema();
                while let Ok(call) = rx.recv() {
                    match call {
                        Call::Push(source, batch, reply) => {
                            let _ = reply.send(flow.push(source, batch).map_err(native_failure));
                        }
                        Call::Tick(now, reply) => {
                            let _ = reply.send(native_tick(&mut flow, &output, now, limits));
                        }
                        Call::Snapshot(reply) => {
                            let _ = reply.send(flow.snapshot().map_err(native_failure));
                        }
                        Call::StateSize(reply) => {
                            let _ = reply.send(Ok(flow.state_size()));
                        }
                    }
                }
            })
            .map_err(|e| {
                sandflow_contract::FlowError::Internal(format!(
                    "cannot start the native engine's thread: {e}"
                ))
            })?;
        let output = ready.recv().map_err(|_| {
            sandflow_contract::FlowError::Internal("the native engine's thread ended".into())
        })??;
        Ok((NativeGuest { calls }, output))
    }

    fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Call) -> Result<T, Failure> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.calls
            .send(make(tx))
            .map_err(|_| Failure::permanent("the native engine's thread ended"))?;
        rx.recv()
            .map_err(|_| Failure::permanent("the native engine's thread ended"))?
    }
}

fn native_tick(
    flow: &mut sandflow_engine::Flow,
    output: &[Field],
    now: i64,
    limits: FlowLimits,
) -> Result<TickOutput, Failure> {
    let mut out = flow
        .tick(now, limits.max_output_rows)
        .map_err(native_failure)?;
    sandflow_contract::validate_batch(output, &out.output)
        .map_err(|e| Failure::permanent(format!("malformed output batch: {e}")))?;
    out.expand();
    Ok(out)
}

impl Guest for NativeGuest {
    fn push(&mut self, source: u32, batch: Batch) -> Result<(), Failure> {
        self.call(|r| Call::Push(source, batch, r))
    }

    fn tick(&mut self, now: i64) -> Result<TickOutput, Failure> {
        self.call(|r| Call::Tick(now, r))
    }

    fn snapshot(&mut self) -> Result<Vec<u8>, Failure> {
        self.call(Call::Snapshot)
    }

    fn state_size(&mut self) -> Result<u64, Failure> {
        self.call(Call::StateSize)
    }
}

/// Restores a sleeping native engine.
pub(crate) struct NativeWaker {
    pub limits: FlowLimits,
}

impl Waker for NativeWaker {
    fn restore(&self, state: &[u8]) -> Result<Box<dyn Guest>, Failure> {
        let state = state.to_vec();
        let (guest, _) =
            NativeGuest::start(move || sandflow_engine::Flow::restore(&state), self.limits)
                .map_err(native_failure)?;
        Ok(Box::new(guest))
    }
}

/// Restores a sleeping flow's engine in the sandbox.
pub(crate) struct SandboxWaker {
    pub sandbox: Arc<Sandbox>,
    pub component: Digest,
    pub limits: FlowLimits,
    pub log: Option<(Arc<super::logs::FlowLogs>, String)>,
}

impl Waker for SandboxWaker {
    fn restore(&self, state: &[u8]) -> Result<Box<dyn Guest>, Failure> {
        let instance = self
            .sandbox
            .restore_flow(&self.component, state, self.limits)
            .map_err(failure_of)?;
        let guest = SandboxGuest {
            instance,
            log: self.log.clone(),
        };
        guest.drain_log();
        Ok(Box::new(guest))
    }
}

/// The sink writes of one tick's output (`batches`, in the flow's `output`
/// schema): what a flow's commit writes, and what a replay writes.
pub(crate) fn sink_writes(
    sink: &Arc<Table>,
    output: &[Field],
    mapping: &[SinkColumn],
    batches: &[Batch],
    now: i64,
) -> Result<sink::SinkWrites, Failure> {
    if batches.is_empty() {
        return Ok(sink::SinkWrites::default());
    }
    let mut arrow = Vec::with_capacity(batches.len());
    let mut diffs = Vec::new();
    for b in batches {
        arrow.push(batch_to_arrow(b, output).map_err(|e| Failure::permanent(e.to_string()))?);
        diffs.extend_from_slice(&b.diffs);
    }
    let all = concat_batches(&schema_from_fields(output), &arrow)
        .map_err(|e| Failure::permanent(format!("cannot gather the flow's output: {e}")))?;
    sink::writes(sink, mapping, &all, &diffs, now).map_err(Failure::permanent)
}

/// Writes a flow's output into its sink table, with its positions and
/// snapshot, in one commit, refused once the flow's fence moved on; and
/// journals the commit while the flow is being recorded.
pub(crate) struct StoreSink {
    pub core: std::sync::Weak<Core>,
    pub name: String,
    pub output: Vec<Field>,
    pub sink: Arc<Table>,
    pub mapping: Vec<SinkColumn>,
    /// The fence of the flow's current run.
    pub fence: Arc<AtomicU64>,
    pub recording: Arc<RecordingState>,
}

impl StoreSink {
    /// The sink table as it is now: it may have been dropped and recreated.
    fn live_sink(&self, core: &Core) -> Result<Arc<Table>, Failure> {
        core.catalog
            .table(&self.sink.info.database, &self.sink.info.name)
            .map_err(|e| Failure::transient(e.to_string()))?
            .filter(|t| t.id() == self.sink.id())
            .ok_or_else(|| {
                Failure::permanent(format!(
                    "sink table '{}' no longer exists",
                    self.sink.qualified_name()
                ))
            })
    }
}

impl SinkCommitter for StoreSink {
    fn commit(&mut self, c: Commit<'_>) -> Result<u64, Failure> {
        self.commit_with(c, None)
    }

    fn commit_late(&mut self, c: Commit<'_>, snapshot: LateSnapshot) -> Result<u64, Failure> {
        // A recording's commits use the snapshot's bytes after the commit.
        if self.recording.wants_snapshot() || self.recording.journaling() {
            let state = snapshot.wait()?;
            return self.commit(Commit {
                snapshot: Some(&state),
                ..c
            });
        }
        self.commit_with(c, Some(snapshot))
    }

    fn journaling(&self) -> bool {
        self.recording.journaling()
    }

    fn wants_snapshot(&self) -> bool {
        self.recording.wants_snapshot()
    }
}

impl StoreSink {
    /// Commits `c`, and `late`'s snapshot when there is one: the commit
    /// writes the sink rows, then takes the snapshot (compressed meanwhile
    /// on a thread of its own) under the commit lock (see [`LateValue`]);
    /// its failure is the commit's.
    fn commit_with(&mut self, c: Commit<'_>, late: Option<LateSnapshot>) -> Result<u64, Failure> {
        let core = self
            .core
            .upgrade()
            .ok_or_else(|| Failure::transient("the database is closing"))?;
        let positions = encode_positions(c.positions);
        // The late snapshot is compressed as soon as the guest hands it
        // over, on a thread of its own: while the sink rows are prepared and
        // written, not under the commit lock.
        let encoding = match late {
            Some(late) => {
                let at = positions.clone();
                let encode = move || late.wait().map(|state| encode_snapshot(&at, &state));
                let spawned = std::thread::Builder::new()
                    .name("snapshot-encode".into())
                    .spawn(encode)
                    .map_err(|e| {
                        Failure::transient(format!(
                            "cannot start a thread to store the flow's state: {e}"
                        ))
                    })?;
                Some(spawned)
            }
            None => None,
        };
        let mut set = WriteSet::new();
        let writes = sink_writes(&self.sink, &self.output, &self.mapping, c.output, c.now)?;
        let rows = writes.rows();
        if rows > 0 {
            let sink = self.live_sink(&core)?;
            if let Some(d) = writes.deletes {
                set.delete(sink.clone(), d);
            }
            if let Some(u) = writes.upserts {
                // Keys encoded and sorted here, outside the commit lock.
                let u = PreparedUpsert::new(sink, &u).map_err(|e| {
                    Failure::transient(format!(
                        "cannot write to sink table '{}': {e}",
                        self.sink.qualified_name()
                    ))
                })?;
                set.upsert_prepared(u);
            }
        }
        if let Some(state) = c.snapshot {
            set.put_meta(snapshot_key(&self.name), encode_snapshot(&positions, state));
        }
        let late_failure: Arc<std::sync::Mutex<Option<Failure>>> = Default::default();
        if let Some(encoding) = encoding {
            let failure = late_failure.clone();
            let value = LateValue::new(move || {
                let made = encoding.join().unwrap_or_else(|_| {
                    Err(Failure::transient(
                        "storing the flow's state failed unexpectedly",
                    ))
                });
                made.map_err(|f| {
                    let message = f.message.clone();
                    if let Ok(mut slot) = failure.lock() {
                        *slot = Some(f);
                    }
                    message
                })
            });
            set.put_meta_late(snapshot_key(&self.name), value);
        }
        set.put_meta(written_key(&self.name), positions);
        let entry = match c.ticked {
            true => self.recording.entry(&self.name, c.now, c.positions),
            false => None,
        };
        if let Some((key, value)) = &entry {
            set.put_meta(key.clone(), value.clone());
        }
        let (fence, mine) = (self.fence.clone(), c.fence);
        set.fence(Arc::new(move || {
            if fence.load(Ordering::SeqCst) == mine {
                Ok(())
            } else {
                crate::error::FlowSnafu {
                    message: "a newer run of the flow owns its sink".to_string(),
                }
                .fail()
            }
        }));
        let result = core.store.commit(set);
        if let Some(f) = late_failure.lock().ok().and_then(|mut f| f.take()) {
            // The snapshot failed, and so the commit.
            return Err(f);
        }
        match result {
            Ok(_) => {}
            Err(_) if self.fence.load(Ordering::SeqCst) != mine => {
                return Err(Failure::fenced(format!(
                    "flow '{}' was restarted elsewhere: this run stops without writing",
                    self.name
                )))
            }
            Err(e) => {
                return Err(Failure::transient(format!(
                    "cannot write to sink table '{}': {e}",
                    self.sink.qualified_name()
                )))
            }
        }
        if entry.is_some() {
            self.recording.journaled();
        }
        if let (Some(state), true) = (c.snapshot, self.recording.wants_snapshot()) {
            // This run is the sink's only writer: the sink is still as the
            // commit left it.
            let sink = self.live_sink(&core)?;
            self.recording
                .begin(&core.store, &self.name, &sink, c.now, c.positions, state);
        }
        Ok(rows)
    }
}

/// Flow definitions and snapshots in the store's metadata.
pub(crate) struct MetaStore(pub Arc<Store>);

fn storage_failure(e: crate::Error) -> Failure {
    Failure::transient(format!("cannot read flow metadata: {e}"))
}

impl FlowStore for MetaStore {
    fn definitions(&self) -> Result<Vec<(String, Vec<u8>)>, Failure> {
        let defs = self.0.scan_meta(DEF_PREFIX).map_err(storage_failure)?;
        Ok(defs
            .into_iter()
            .map(|(k, v)| (k[DEF_PREFIX.len()..].to_string(), v))
            .collect())
    }

    /// The current format, or the one before per-source positions (one
    /// commit sequence for all sources).
    fn stored(&self, name: &str, sources: usize) -> Result<Option<Stored>, Failure> {
        let get = |key: String| self.0.get_meta(&key).map_err(storage_failure);
        if let Some(bytes) = get(snapshot_key(name))? {
            let Some((positions, state)) = decode_snapshot(&bytes) else {
                tracing::warn!(flow = %name, "unreadable snapshot; rebuilding the flow from its sources");
                return Ok(None);
            };
            if positions.len() != sources {
                tracing::warn!(flow = %name, "snapshot of another shape; rebuilding the flow from its sources");
                return Ok(None);
            }
            let written = match get(written_key(name))? {
                Some(w) => match decode_positions(&w) {
                    Some((w, _)) if w.len() == sources => w
                        .into_iter()
                        .zip(&positions)
                        .map(|(w, p)| w.max(*p))
                        .collect(),
                    _ => positions.clone(),
                },
                None => positions.clone(),
            };
            return Ok(Some(Stored {
                state,
                positions,
                written,
            }));
        }
        let Some(bytes) = get(legacy_state_key(name))? else {
            return Ok(None);
        };
        let seq_of =
            |b: &[u8]| -> Option<u64> { Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?)) };
        let Some(snapshot_seq) = seq_of(&bytes) else {
            return Ok(None);
        };
        let written_seq = get(legacy_pos_key(name))?
            .and_then(|w| (w.len() == 8).then(|| seq_of(&w)).flatten())
            .unwrap_or(snapshot_seq)
            .max(snapshot_seq);
        Ok(Some(Stored {
            state: bytes[8..].to_vec(),
            positions: vec![Position::after_commit(snapshot_seq); sources],
            written: vec![Position::after_commit(written_seq); sources],
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_round_trip_compressed_and_the_format_before_still_reads() {
        let positions = vec![Position::after_commit(7), Position::START];
        // A state that compresses (repeated integers) and one that does not.
        let mut repetitive = Vec::new();
        for i in 0..100_000u64 {
            repetitive.extend_from_slice(&(i % 1000).to_le_bytes());
            repetitive.extend_from_slice(&1u64.to_le_bytes());
        }
        let mut seed = 1u64;
        let noise: Vec<u8> = (0..10_000)
            .map(|_| {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                (seed >> 56) as u8
            })
            .collect();
        for state in [repetitive.clone(), noise, Vec::new()] {
            let stored = encode_snapshot(&encode_positions(&positions), &state);
            assert_eq!(
                decode_snapshot(&stored),
                Some((positions.clone(), state.clone()))
            );
        }
        let stored = encode_snapshot(&encode_positions(&positions), &repetitive);
        assert!(stored.len() * 4 < repetitive.len(), "{}", stored.len());
        // Positions then the raw state: what earlier versions wrote.
        let mut old = encode_positions(&positions);
        old.extend_from_slice(b"state");
        assert_eq!(
            decode_snapshot(&old),
            Some((positions.clone(), b"state".to_vec()))
        );
        // A damaged compressed state comes back as something the guest's
        // checksum refuses, never as a panic.
        let mut damaged = encode_snapshot(&encode_positions(&positions), &repetitive);
        let at = damaged.len() / 2;
        damaged[at] ^= 0x5a;
        damaged.truncate(damaged.len() - 3);
        let (p, state) = decode_snapshot(&damaged).unwrap();
        assert_eq!(p, positions);
        assert_ne!(state, repetitive);
    }
}
