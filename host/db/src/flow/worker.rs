//! One flow at run time: a thread that owns the flow's guest instance, feeds
//! it the changes of its sources, ticks it, and writes its output into the
//! sink.
//!
//! The thread is the only place that calls into the guest, so a slow or
//! stuck flow never blocks writers or other flows: source commits only
//! enqueue their changes on the flow's channel. Ticks happen when there is
//! input or the guest asked for a wake-up, at most once per tick interval;
//! an idle flow sleeps on its channel. A flush request travels the same
//! channel as the changes, so it sees every change committed before it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use datafusion::arrow::compute::concat_batches;
use tokio::sync::oneshot;
use tracing::{debug, warn};

use super::arrow::{batch_from_arrow, batch_to_arrow, schema_from_fields};
use super::sink::{self, SinkColumn};
use crate::catalog::Table;
use crate::database::Core;
use crate::runtime::{Batch, Digest, Field, FlowInstance, FlowLimits, RuntimeError, Sandbox};
use crate::storage::{ChangeBatch, WriteSet};

/// What a flow's thread is asked to do.
pub(crate) enum Msg {
    /// Changes committed to source `source`.
    Change { source: u32, change: ChangeBatch },
    /// Process everything received so far, write it back, reply with the
    /// number of sink rows written since the previous flush.
    Flush(oneshot::Sender<Result<u64, String>>),
    /// Write back what is pending, snapshot the state, then end the thread
    /// (the database is closing).
    Stop,
    /// End the thread now (the flow is dropped or replaced).
    Halt,
}

/// Run-time facts about a flow, shared with `information_schema.flows`.
#[derive(Debug, Clone, Default)]
pub struct FlowStatus {
    /// Why the flow stopped, if it failed.
    pub error: Option<String>,
    /// Wall-clock ms of the last tick that ran.
    pub last_execution_ms: Option<i64>,
    /// Bytes of operator state, as the guest reports it.
    pub state_size: u64,
    /// Sink rows written (upserts + deletes) since the flow started.
    pub rows_written: u64,
    /// `rows_written` at the last flush.
    pub rows_at_flush: u64,
    /// Whether the flow is asleep: idle for a while, its state kept as a
    /// snapshot and its sandbox released until input arrives.
    pub asleep: bool,
    /// Times the flow failed since the server started.
    pub failures: u64,
    /// Times the flow was restarted (automatically or by `ADMIN
    /// RESUME_FLOW`) since the server started.
    pub restarts: u64,
    /// Automatic restarts in a row without a successful tick in between.
    pub restart_attempts: u32,
    /// When the next automatic restart is due (wall-clock ms), if one is.
    pub next_restart_ms: Option<i64>,
    /// Wall-clock ms at which the oldest source change the sink does not
    /// reflect yet arrived; `None` when the flow is caught up.
    pub pending_since_ms: Option<i64>,
}

impl FlowStatus {
    /// How far the sink is behind its sources at wall-clock `now_ms`: the
    /// age of the oldest change not yet written back, 0 when caught up.
    pub fn lag_ms(&self, now_ms: i64) -> i64 {
        self.pending_since_ms
            .map(|t| now_ms.saturating_sub(t).max(0))
            .unwrap_or(0)
    }

    /// The counters a restarted flow carries over from its previous run.
    pub(crate) fn carried(&self) -> FlowStatus {
        FlowStatus {
            rows_written: self.rows_written,
            rows_at_flush: self.rows_at_flush,
            failures: self.failures,
            restarts: self.restarts,
            restart_attempts: self.restart_attempts,
            pending_since_ms: self.pending_since_ms,
            last_execution_ms: self.last_execution_ms,
            ..FlowStatus::default()
        }
    }
}

/// Why a flow's thread stopped working, and whether trying again later may
/// succeed (a CPU budget missed on a busy machine, a storage error) or not
/// (a trap, the memory cap, a limit the flow's data keeps hitting).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub message: String,
    pub transient: bool,
}

impl Failure {
    fn permanent(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: false,
        }
    }

    fn transient(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: true,
        }
    }
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Failure {
        let transient = matches!(e, RuntimeError::CpuLimit { .. });
        Failure {
            message: e.to_string(),
            transient,
        }
    }
}

/// Wall-clock milliseconds now.
pub(crate) fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub(crate) type SharedStatus = Arc<Mutex<FlowStatus>>;

/// Wall-clock milliseconds that never go backwards within one flow.
struct Clock {
    last: i64,
}

impl Clock {
    fn now(&mut self) -> i64 {
        self.last = self.last.max(wall_ms());
        self.last
    }
}

pub(crate) struct Worker {
    pub name: String,
    pub core: Arc<Core>,
    /// The flow's sandbox; dropped (its memory returned) when the flow fails
    /// or falls asleep.
    pub instance: Option<FlowInstance>,
    /// Where the instance comes from when a sleeping flow wakes up.
    pub sandbox: Arc<Sandbox>,
    /// The flow's component in the sandbox.
    pub component: Digest,
    /// The state of a sleeping flow (see [`Worker::sleep`]).
    pub asleep: Option<Vec<u8>>,
    /// How long a flow with nothing to do keeps its sandbox before it falls
    /// asleep; `None`: never.
    pub sleep_after: Option<Duration>,
    /// The limits it runs under.
    pub limits: FlowLimits,
    pub output: Vec<Field>,
    pub source_fields: Vec<Vec<Field>>,
    pub sink: Arc<Table>,
    pub mapping: Vec<SinkColumn>,
    pub tick_interval: Duration,
    pub status: SharedStatus,
    /// Rows already in the sources at creation (the back-fill), or logged
    /// changes to replay after a restore, per source.
    pub backfill: Vec<(u32, ChangeBatch)>,
    /// Logged changes whose effect is already in the sink (after a restore):
    /// replayed into the state without writing anything.
    pub silent: Vec<(u32, ChangeBatch)>,
    /// Every change with a sequence number up to this is in the state.
    pub pos: u64,
    /// The position of the last durable snapshot (0: none), shared with
    /// the manager for change-log garbage collection.
    pub snap_pos: Arc<AtomicU64>,
    /// How often the state is snapshotted (with the tick's sink writes).
    pub snapshot_interval: Duration,
    /// Table ids of the sources (for change-log garbage collection).
    pub source_ids: Vec<u64>,
    /// Which run of the flow this is (a restart gets a new one), so that an
    /// automatic restart never replaces a newer run.
    pub incarnation: u64,
}

/// Meta key of a flow's state: 8 bytes position (big endian), then the snapshot.
pub(crate) fn state_key(name: &str) -> String {
    format!("flow/state/{name}")
}

/// Meta key of the position of a flow's last sink write (8 bytes, big endian).
pub(crate) fn pos_key(name: &str) -> String {
    format!("flow/pos/{name}")
}

struct Schedule {
    last_tick: Option<Instant>,
    /// When the next tick is due; `None`: nothing to do until a message.
    due: Option<Instant>,
}

impl Worker {
    /// The thread's body: runs until `Stop` or until every sender is gone.
    pub fn run(mut self, rx: Receiver<Msg>) {
        let mut clock = Clock { last: 0 };
        let mut sched = Schedule {
            last_tick: None,
            due: None,
        };
        let mut last_snapshot: Option<Instant> = None;
        let silent = std::mem::take(&mut self.silent);
        if !silent.is_empty() {
            for (source, change) in silent {
                self.push(source, &change, &mut clock);
            }
            // Catch the state up with what the sink already shows.
            if self.failed().is_none() {
                let now = clock.now();
                if let Err(e) = self.drain(now) {
                    self.fail(e);
                }
            }
        }
        for (source, change) in std::mem::take(&mut self.backfill) {
            self.push(source, &change, &mut clock);
        }
        // A new flow writes its back-fill and a first snapshot right away.
        let fresh = self.snap_pos.load(Ordering::Relaxed) == 0;
        if self.failed().is_none() {
            if fresh {
                let _ = self.tick(&mut clock, &mut sched, &mut last_snapshot, true);
            } else {
                self.schedule_input(&mut sched);
            }
        }
        loop {
            let msg = match sched.due {
                Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                // Nothing to do: after a while, give the sandbox back.
                None => match self.sleep_after.filter(|_| self.instance.is_some()) {
                    Some(after) => match rx.recv_timeout(after) {
                        Ok(m) => Some(m),
                        Err(RecvTimeoutError::Timeout) => {
                            self.sleep();
                            continue;
                        }
                        Err(RecvTimeoutError::Disconnected) => return,
                    },
                    None => match rx.recv() {
                        Ok(m) => Some(m),
                        Err(_) => return,
                    },
                },
            };
            match msg {
                Some(Msg::Stop) => {
                    // A clean shutdown writes back what is pending and
                    // snapshots, so that the restart replays nothing.
                    if self.failed().is_none() {
                        let _ = self.tick(&mut clock, &mut sched, &mut last_snapshot, true);
                    }
                    return;
                }
                Some(Msg::Halt) => return,
                Some(Msg::Change { source, change }) => {
                    self.note_pending();
                    if self.failed().is_none() {
                        self.push(source, &change, &mut clock);
                        self.schedule_input(&mut sched);
                    }
                }
                Some(Msg::Flush(reply)) => {
                    // Everything already queued was committed before the flush.
                    let mut stop = false;
                    while let Ok(m) = rx.try_recv() {
                        match m {
                            Msg::Change { source, change } => {
                                self.note_pending();
                                if self.failed().is_none() {
                                    self.push(source, &change, &mut clock);
                                }
                            }
                            Msg::Flush(other) => {
                                let _ = other.send(Err("flushed concurrently".into()));
                            }
                            Msg::Stop | Msg::Halt => stop = true,
                        }
                    }
                    let result = match self.failed() {
                        Some(_) => Err(()),
                        None => self
                            .tick(&mut clock, &mut sched, &mut last_snapshot, false)
                            .map_err(|_| ())
                            .map(|_| {
                                // Count what was written since the last flush,
                                // including ticks that ran on their own meanwhile.
                                let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
                                let n = s.rows_written - s.rows_at_flush;
                                s.rows_at_flush = s.rows_written;
                                n
                            }),
                    };
                    let result = result.map_err(|()| {
                        let status = self.status.lock().unwrap_or_else(|p| p.into_inner());
                        failure_message(&self.name, &status)
                    });
                    let _ = reply.send(result);
                    if stop {
                        return;
                    }
                }
                None => {
                    if self.failed().is_none() {
                        let _ = self.tick(&mut clock, &mut sched, &mut last_snapshot, false);
                    } else {
                        sched.due = None;
                    }
                }
            }
        }
    }

    fn failed(&self) -> Option<String> {
        self.status.lock().ok().and_then(|s| s.error.clone())
    }

    /// The live guest (a failed flow has none); a sleeping flow wakes up.
    fn guest(&mut self) -> Result<&mut FlowInstance, Failure> {
        if self.instance.is_none() {
            if let Some(state) = self.asleep.take() {
                let instance = self
                    .sandbox
                    .restore_flow(&self.component, &state, self.limits)?;
                self.instance = Some(instance);
                if let Ok(mut s) = self.status.lock() {
                    s.asleep = false;
                }
                debug!(flow = %self.name, "flow woke up");
            }
        }
        self.instance
            .as_mut()
            .ok_or_else(|| Failure::permanent("the flow's guest is gone after a failure"))
    }

    /// Keeps the state as a snapshot and releases the sandbox (its memory).
    /// Only between ticks: nothing is pending, everything is written back.
    fn sleep(&mut self) {
        if self.failed().is_some() {
            return;
        }
        let Some(mut instance) = self.instance.take() else {
            return;
        };
        match instance.snapshot() {
            Ok(state) => {
                self.asleep = Some(state);
                if let Ok(mut s) = self.status.lock() {
                    s.asleep = true;
                }
                debug!(flow = %self.name, "flow fell asleep");
            }
            Err(e) => {
                self.instance = Some(instance);
                self.fail(e.into());
            }
        }
    }

    fn fail(&mut self, failure: Failure) {
        // A failed flow holds no sandbox: its memory goes back now.
        self.instance = None;
        self.asleep = None;
        if let Ok(mut s) = self.status.lock() {
            s.asleep = false;
        }
        warn!(flow = %self.name, transient = failure.transient, "flow failed: {}", failure.message);
        let attempts = {
            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
            if s.error.is_some() {
                // The first reason is the one that counts.
                return;
            }
            s.error = Some(failure.message);
            s.failures += 1;
            s.restart_attempts
        };
        if failure.transient {
            self.core
                .flows
                .schedule_restart(&self.name, self.incarnation, &self.status, attempts);
        }
    }

    /// A source change arrived: the sink is behind from now on (if it was not already).
    fn note_pending(&self) {
        if let Ok(mut s) = self.status.lock() {
            if s.pending_since_ms.is_none() {
                s.pending_since_ms = Some(wall_ms());
            }
        }
    }

    /// Input arrived: tick after the interval since the last tick (now, if
    /// the flow has been idle that long).
    fn schedule_input(&self, sched: &mut Schedule) {
        let earliest = match sched.last_tick {
            Some(t) => t + self.tick_interval,
            None => Instant::now(),
        };
        sched.due = Some(match sched.due {
            Some(d) => d.min(earliest.max(Instant::now())),
            None => earliest.max(Instant::now()),
        });
    }

    fn push(&mut self, source: u32, change: &ChangeBatch, clock: &mut Clock) {
        if self.failed().is_some() {
            return;
        }
        let Some(fields) = self.source_fields.get(source as usize) else {
            return;
        };
        let batch = match batch_from_arrow(&change.batch, fields, clock.now(), change.diffs.clone())
        {
            Ok(b) => b,
            Err(e) => {
                self.fail(Failure::permanent(format!(
                    "cannot convert source rows: {e}"
                )));
                return;
            }
        };
        if let Err(e) = self.guest().and_then(|g| Ok(g.push(source, batch)?)) {
            self.fail(e);
        }
        self.pos = self.pos.max(change.seq);
    }

    /// Ticks at `now` until the guest has released all its output (at most
    /// the flow's bound on output rows per tick).
    fn drain(&mut self, now: i64) -> Result<(Vec<Batch>, Option<i64>), Failure> {
        let mut batches = Vec::new();
        let limit = self.limits.output_rows_per_tick;
        let mut total = 0u64;
        loop {
            let out = self.guest()?.tick(now)?;
            if out.output.rows > 0 {
                total += u64::from(out.output.rows);
                if total > limit {
                    return Err(Failure::permanent(format!(
                        "flow produced more than {limit} sink rows in one tick and was stopped; \
                         raise output_rows_limit_per_tick or make the query produce fewer rows \
                         (fewer groups, a filter, EXPIRE AFTER)"
                    )));
                }
                batches.push(out.output);
            }
            if !out.more {
                return Ok((batches, out.next_wakeup));
            }
        }
    }

    /// Ticks the guest at the current time until it has released all its
    /// output, and writes the output back in one commit together with the
    /// flow's position (and, when due or `force_snapshot`, its state).
    fn tick(
        &mut self,
        clock: &mut Clock,
        sched: &mut Schedule,
        last_snapshot: &mut Option<Instant>,
        force_snapshot: bool,
    ) -> Result<u64, ()> {
        let now = clock.now();
        sched.last_tick = Some(Instant::now());
        sched.due = None;
        let (batches, wakeup) = match self.drain(now) {
            Ok(r) => r,
            Err(e) => {
                self.fail(e);
                return Err(());
            }
        };
        let state_size = match self.guest().and_then(|g| Ok(g.state_size()?)) {
            Ok(n) => n,
            Err(e) => {
                self.fail(e);
                return Err(());
            }
        };
        if let Some(limit) = self.limits.state_size {
            if state_size > limit {
                self.fail(Failure::permanent(format!(
                    "flow state grew to {state_size} bytes, over its state_size_limit of {limit} bytes, \
                     and the flow was stopped; raise state_size_limit, add EXPIRE AFTER or reduce \
                     the number of groups"
                )));
                return Err(());
            }
        }
        let snapshot_due =
            force_snapshot || last_snapshot.is_none_or(|t| t.elapsed() >= self.snapshot_interval);
        let snap_pos = self.snap_pos.load(Ordering::Relaxed);
        let snapshot = snapshot_due && (self.pos > snap_pos || snap_pos == 0);
        let written = match self.write_back(&batches, now, snapshot) {
            Ok(n) => n,
            Err(e) => {
                self.fail(e);
                return Err(());
            }
        };
        if snapshot {
            *last_snapshot = Some(Instant::now());
            self.snap_pos.store(self.pos.max(1), Ordering::Relaxed);
            if let Err(e) = self.core.flows.collect_logs(&self.core, &self.source_ids) {
                warn!(flow = %self.name, "cannot trim the change log: {e}");
            }
        }
        if let Ok(mut s) = self.status.lock() {
            s.last_execution_ms = Some(now);
            s.state_size = state_size;
            s.rows_written += written;
            // Everything received so far is in the sink, and a run that
            // gets this far has recovered.
            s.pending_since_ms = None;
            s.restart_attempts = 0;
        }
        if let Some(w) = wakeup {
            let wait = Duration::from_millis(w.saturating_sub(now).max(0) as u64);
            let at = (Instant::now() + wait).max(Instant::now() + self.tick_interval);
            sched.due = Some(at);
        }
        debug!(flow = %self.name, rows = written, "tick");
        Ok(written)
    }

    /// Commits the sink writes of `batches`, the flow's position and, with
    /// `snapshot`, its state, in one transaction.
    fn write_back(&mut self, batches: &[Batch], now: i64, snapshot: bool) -> Result<u64, Failure> {
        let mut set = WriteSet::new();
        let mut rows = 0;
        if !batches.is_empty() {
            let mut arrow = Vec::with_capacity(batches.len());
            let mut diffs = Vec::new();
            for b in batches {
                arrow.push(
                    batch_to_arrow(b, &self.output)
                        .map_err(|e| Failure::permanent(e.to_string()))?,
                );
                diffs.extend_from_slice(&b.diffs);
            }
            let all = concat_batches(&schema_from_fields(&self.output), &arrow)
                .map_err(|e| Failure::permanent(format!("cannot gather the flow's output: {e}")))?;
            let writes = sink::writes(&self.sink, &self.mapping, &all, &diffs, now)
                .map_err(Failure::permanent)?;
            rows = writes.rows();
            if rows > 0 {
                // The sink may have been dropped and recreated: write to the live table.
                let sink = self
                    .core
                    .catalog
                    .table(&self.sink.info.database, &self.sink.info.name)
                    .map_err(|e| Failure::transient(e.to_string()))?
                    .filter(|t| t.id() == self.sink.id())
                    .ok_or_else(|| {
                        Failure::permanent(format!(
                            "sink table '{}' no longer exists",
                            self.sink.qualified_name()
                        ))
                    })?;
                if let Some(d) = writes.deletes {
                    set.delete(sink.clone(), d);
                }
                if let Some(u) = writes.upserts {
                    set.upsert(sink, u);
                }
            }
        }
        if rows == 0 && !snapshot {
            return Ok(0);
        }
        let pos = self.pos.to_be_bytes().to_vec();
        set.put_meta(pos_key(&self.name), pos.clone());
        if snapshot {
            let state = self.guest()?.snapshot()?;
            let mut value = pos;
            value.extend_from_slice(&state);
            set.put_meta(state_key(&self.name), value);
        }
        self.core.store.commit(set).map_err(|e| {
            Failure::transient(format!(
                "cannot write to sink table '{}': {e}",
                self.sink.qualified_name()
            ))
        })?;
        Ok(rows)
    }
}

/// What FLUSH_FLOW says about a failed flow: the reason, and how it comes back.
pub(crate) fn failure_message(name: &str, status: &FlowStatus) -> String {
    let reason = status.error.as_deref().unwrap_or("it is not running");
    match status.next_restart_ms {
        Some(at) => format!(
            "flow '{name}' has failed: {reason}; it restarts by itself in {} ms \
             (automatic restart {} after a transient failure), or run ADMIN RESUME_FLOW('{name}')",
            at.saturating_sub(wall_ms()).max(0),
            status.restart_attempts + 1
        ),
        None => format!(
            "flow '{name}' has failed: {reason}; fix the cause, then run ADMIN RESUME_FLOW('{name}') \
             or recreate it with CREATE OR REPLACE FLOW"
        ),
    }
}
