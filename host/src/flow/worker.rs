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
use crate::runtime::{Batch, Field, FlowInstance};
use crate::storage::{ChangeBatch, WriteSet};

/// What a flow's thread is asked to do.
pub(crate) enum Msg {
    /// Changes committed to source `source`.
    Change { source: u32, change: ChangeBatch },
    /// Process everything received so far, write it back, reply with the
    /// number of sink rows written since the previous flush.
    Flush(oneshot::Sender<Result<u64, String>>),
    /// Write back what is pending, then end the thread.
    Stop,
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
}

pub(crate) type SharedStatus = Arc<Mutex<FlowStatus>>;

/// Wall-clock milliseconds that never go backwards within one flow.
struct Clock {
    last: i64,
}

impl Clock {
    fn now(&mut self) -> i64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        self.last = self.last.max(wall);
        self.last
    }
}

pub(crate) struct Worker {
    pub name: String,
    pub core: Arc<Core>,
    pub instance: FlowInstance,
    pub output: Vec<Field>,
    pub source_fields: Vec<Vec<Field>>,
    pub sink: Arc<Table>,
    pub mapping: Vec<SinkColumn>,
    pub tick_interval: Duration,
    pub status: SharedStatus,
    /// Rows already in the sources at creation (the back-fill), per source.
    pub backfill: Vec<(u32, ChangeBatch)>,
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
        for (source, change) in std::mem::take(&mut self.backfill) {
            self.push(source, &change, &mut clock);
        }
        if self.failed().is_none() {
            self.schedule_input(&mut sched);
        }
        loop {
            let msg = match sched.due {
                Some(due) => match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                },
                None => match rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return,
                },
            };
            match msg {
                Some(Msg::Stop) => {
                    // A clean stop (shutdown, DROP, replace) writes back what is pending.
                    if sched.due.is_some() && self.failed().is_none() {
                        let _ = self.tick(&mut clock, &mut sched);
                    }
                    return;
                }
                Some(Msg::Change { source, change }) => {
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
                                if self.failed().is_none() {
                                    self.push(source, &change, &mut clock);
                                }
                            }
                            Msg::Flush(other) => {
                                let _ = other.send(Err("flushed concurrently".into()));
                            }
                            Msg::Stop => stop = true,
                        }
                    }
                    let result = match self.failed() {
                        Some(e) => Err(e),
                        None => self.tick(&mut clock, &mut sched).map(|_| {
                            // Count what was written since the last flush,
                            // including ticks that ran on their own meanwhile.
                            let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
                            let n = s.rows_written - s.rows_at_flush;
                            s.rows_at_flush = s.rows_written;
                            n
                        }),
                    };
                    let result = result.map_err(|e| {
                        format!(
                            "flow '{}' has failed: {e}; fix the cause and recreate it with CREATE OR REPLACE FLOW",
                            self.name
                        )
                    });
                    let _ = reply.send(result);
                    if stop {
                        return;
                    }
                }
                None => {
                    if self.failed().is_none() {
                        let _ = self.tick(&mut clock, &mut sched);
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

    fn fail(&mut self, error: String) {
        warn!(flow = %self.name, "flow failed: {error}");
        if let Ok(mut s) = self.status.lock() {
            s.error = Some(error);
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
        let Some(fields) = self.source_fields.get(source as usize) else {
            return;
        };
        let batch = match batch_from_arrow(&change.batch, fields, clock.now(), change.diffs.clone())
        {
            Ok(b) => b,
            Err(e) => {
                self.fail(format!("cannot convert source rows: {e}"));
                return;
            }
        };
        if let Err(e) = self.instance.push(source, batch) {
            self.fail(e.to_string());
        }
    }

    /// Ticks the guest at the current time until it has released all its
    /// output, and writes the output back in one commit.
    fn tick(&mut self, clock: &mut Clock, sched: &mut Schedule) -> Result<u64, String> {
        let now = clock.now();
        sched.last_tick = Some(Instant::now());
        sched.due = None;
        let mut batches: Vec<Batch> = Vec::new();
        let wakeup = loop {
            match self.instance.tick(now) {
                Ok(out) => {
                    if out.output.rows > 0 {
                        batches.push(out.output);
                    }
                    if !out.more {
                        break out.next_wakeup;
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    self.fail(e.clone());
                    return Err(e);
                }
            }
        };
        let state_size = self.instance.state_size().unwrap_or(0);
        let written = match self.write_back(&batches, now) {
            Ok(n) => n,
            Err(e) => {
                self.fail(e.clone());
                return Err(e);
            }
        };
        if let Ok(mut s) = self.status.lock() {
            s.last_execution_ms = Some(now);
            s.state_size = state_size;
            s.rows_written += written;
        }
        if let Some(w) = wakeup {
            let wait = Duration::from_millis(w.saturating_sub(now).max(0) as u64);
            let at = (Instant::now() + wait).max(Instant::now() + self.tick_interval);
            sched.due = Some(at);
        }
        debug!(flow = %self.name, rows = written, "tick");
        Ok(written)
    }

    fn write_back(&self, batches: &[Batch], now: i64) -> Result<u64, String> {
        if batches.is_empty() {
            return Ok(0);
        }
        let mut arrow = Vec::with_capacity(batches.len());
        let mut diffs = Vec::new();
        for b in batches {
            arrow.push(batch_to_arrow(b, &self.output).map_err(|e| e.to_string())?);
            diffs.extend_from_slice(&b.diffs);
        }
        let all = concat_batches(&schema_from_fields(&self.output), &arrow)
            .map_err(|e| format!("cannot gather the flow's output: {e}"))?;
        let writes = sink::writes(&self.sink, &self.mapping, &all, &diffs, now)?;
        let rows = writes.rows();
        if rows == 0 {
            return Ok(0);
        }
        // The sink may have been dropped and recreated: write to the live table.
        let sink = self
            .core
            .catalog
            .table(&self.sink.info.database, &self.sink.info.name)
            .map_err(|e| e.to_string())?
            .filter(|t| t.id() == self.sink.id())
            .ok_or_else(|| {
                format!(
                    "sink table '{}' no longer exists",
                    self.sink.qualified_name()
                )
            })?;
        let mut set = WriteSet::new();
        if let Some(d) = writes.deletes {
            set.delete(sink.clone(), d);
        }
        if let Some(u) = writes.upserts {
            set.upsert(sink, u);
        }
        self.core.store.commit(set).map_err(|e| {
            format!(
                "cannot write to sink table '{}': {e}",
                self.sink.qualified_name()
            )
        })?;
        Ok(rows)
    }
}
