//! Flows run by another node (a cluster's flow node): this database keeps
//! their definitions, sinks and snapshots, exports their sources' changes,
//! and takes their commits while their fence is current.
//!
//! [`FlowManager::place_remote`] halts the flow's local run and hands out
//! what the other node needs ([`RemotePlan`]): the compiled plan, the
//! sources, the limits, and where the flow stands (its snapshot and
//! positions). From then on the flow's fence cell holds the placement's
//! fence with [`REMOTE_FENCE`] set, so that it never equals a local run's
//! incarnation: a local run still stepping, or an earlier placement, has its
//! commits refused. [`FlowManager::remote_commit`] writes one tick of the
//! remote run through the same [`StoreSink`] a local run commits with (the
//! sink rows, the positions and the snapshot in one transaction, checked
//! against the fence under the commit lock); a snapshot also lets the
//! sources' logs be trimmed behind it. [`FlowManager::remote_backfill`]
//! gives a source's rows at a commit, for a flow that starts without a
//! snapshot: it then reads the change stream after that commit.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use sandflow_flows::{Batch, Position, Recovery, Runner, RunnerConfig};
use tracing::info;

use super::driver::{AfterStep, Driver, Slot};
use super::manager::{FlowHandle, FlowManager, SinkPlan};
use super::ports::{SandboxGuest, SandboxWaker, StoreSink};
use crate::database::Core;
use crate::error::{Result, SqlSnafu, UnsupportedSnafu};
use crate::runtime::FlowLimits;
use sandflow_contract::SourceSchema;

pub use sandflow_flows::{ChangeLog, Chunk, Commit, Failure, SinkCommitter, Stored};

/// The longest `ADMIN FLUSH_FLOW` waits for a flow on another node.
pub const REMOTE_FLUSH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Set in the fence of a flow placed on another node.
pub const REMOTE_FENCE: u64 = 1 << 63;

/// One source of a remote flow.
#[derive(Debug, Clone)]
pub struct RemoteSource {
    pub table_id: u64,
    pub database: String,
    pub table: String,
    /// Its name and columns as the engine takes them.
    pub schema: SourceSchema,
}

/// What another node needs to run a flow.
#[derive(Debug, Clone)]
pub struct RemotePlan {
    /// Substrait plan bytes (for sandflow's engine).
    pub plan: Vec<u8>,
    /// Options for the engine's `create` (e.g. EXPIRE AFTER).
    pub guest_options: Vec<(String, String)>,
    pub sources: Vec<RemoteSource>,
    pub limits: FlowLimits,
    /// The longest the flow waits to tick (ms).
    pub tick_interval_ms: i64,
    /// Where the flow stands: its last snapshot, `None` without one (it
    /// starts from a back-fill).
    pub stored: Option<Stored>,
}

/// One tick of a remote run, as [`Commit`] with owned parts.
#[derive(Debug, Clone, Default)]
pub struct RemoteCommit {
    pub output: Vec<Batch>,
    pub now: i64,
    pub positions: Vec<Position>,
    pub snapshot: Option<Vec<u8>>,
    pub ticked: bool,
}

/// A flow placed on another node.
pub(crate) struct RemoteRun {
    pub node: String,
    pub fence: u64,
    sink: Mutex<StoreSink>,
    handle: Arc<FlowHandle>,
    /// The plan as placed (its `stored` is read again when asked).
    plan: RemotePlan,
}

impl FlowManager {
    /// Places flow `name` on node `node` under `fence` (unique per
    /// placement, e.g. an etcd revision, below 2^63): stops its local run
    /// and returns what that node needs.
    pub(crate) async fn place_remote(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        name: &str,
        node: &str,
        fence: u64,
    ) -> Result<RemotePlan> {
        let _ddl = self.ddl.lock().await;
        let h = self.require(name)?;
        if fence & REMOTE_FENCE != 0 {
            return SqlSnafu {
                message: format!("fence {fence} is too large: placements' fences stay below 2^63"),
            }
            .fail();
        }
        if h.def.pending || h.def.paused || h.def.component.is_some() {
            let why = match (h.def.pending, h.def.paused) {
                (true, _) => "it waits for its source tables",
                (_, true) => "it is paused",
                _ => "it runs a user component, which runs on its storage node in this version",
            };
            return UnsupportedSnafu {
                message: format!("flow '{name}' cannot run on another node: {why}"),
            }
            .fail();
        }
        let stored = super::manager::load_recovery(core, name, h.sources.len())?;
        // Exported from its snapshot on, before the local run stops.
        if let Some(export) = &core.export {
            export.ensure(&h.sources, stored.as_ref().map(|s| &s.positions[..]))?;
        }
        let prepared = self.prepare(core, ctx, &h.def, stored.as_ref()).await?;
        let sink = match &prepared.sink {
            SinkPlan::Existing(t) => t.clone(),
            SinkPlan::Create(_) => {
                return SqlSnafu {
                    message: format!(
                    "flow '{name}' has no sink table: it starts again here when the table exists"
                ),
                }
                .fail()
            }
        };
        // From here on only this placement commits.
        self.halt(&h);
        let cell = self.fence(name);
        let mine = REMOTE_FENCE | fence;
        core.store
            .under_commit_lock(|| cell.store(mine, Ordering::SeqCst))?;
        let handle = self.remote_handle(core, &h);
        let committer = StoreSink {
            core: Arc::downgrade(core),
            name: name.to_string(),
            output: prepared.output.clone(),
            sink,
            mapping: prepared.mapping.clone(),
            fence: cell,
            recording: handle.recording.clone(),
        };
        let plan = RemotePlan {
            plan: prepared.plan.clone(),
            guest_options: prepared.guest_options.clone(),
            sources: h
                .sources
                .iter()
                .zip(&prepared.schemas)
                .map(|(t, schema)| RemoteSource {
                    table_id: t.id(),
                    database: t.info.database.clone(),
                    table: t.info.name.clone(),
                    schema: schema.clone(),
                })
                .collect(),
            limits: prepared.limits,
            tick_interval_ms: super::manager::tick_interval_ms(
                self.settings.tick_interval,
                h.def.eval_interval_ms,
            ),
            stored,
        };
        if let Ok(mut r) = self.remote.lock() {
            r.insert(
                name.to_string(),
                Arc::new(RemoteRun {
                    node: node.to_string(),
                    fence: mine,
                    sink: Mutex::new(committer),
                    handle,
                    plan: plan.clone(),
                }),
            );
        }
        info!(flow = %name, node = %node, fence = fence, "flow placed on another node");
        Ok(plan)
    }

    /// Flow `name`'s placement, if it is under `fence`.
    fn placed_under(&self, name: &str, fence: u64) -> Result<Arc<RemoteRun>> {
        self.remote
            .lock()
            .ok()
            .and_then(|r| r.get(name).cloned())
            .filter(|r| r.fence == REMOTE_FENCE | fence)
            .ok_or_else(|| fenced(name, fence))
    }

    /// The plan of flow `name` placed under `fence`, with its snapshot as
    /// stored now.
    pub(crate) fn remote_plan(&self, core: &Core, name: &str, fence: u64) -> Result<RemotePlan> {
        let run = self.placed_under(name, fence)?;
        let mut plan = run.plan.clone();
        plan.stored = super::manager::load_recovery(core, name, plan.sources.len())?;
        Ok(plan)
    }

    /// One tick of flow `name`'s remote run under `fence`: refused unless
    /// that is the flow's current placement. Returns the sink rows written.
    pub(crate) fn remote_commit(
        &self,
        name: &str,
        fence: u64,
        commit: RemoteCommit,
    ) -> Result<u64> {
        let run = self.placed_under(name, fence)?;
        let mut sink = run.sink.lock().map_err(|_| fenced(name, fence))?;
        // What another node sends is checked as a guest's output is.
        for b in &commit.output {
            sandflow_contract::validate_batch(&sink.output, b).map_err(|e| {
                SqlSnafu {
                    message: format!("flow '{name}': malformed output from its node: {e}"),
                }
                .build()
            })?;
        }
        if commit.positions.len() != run.plan.sources.len() {
            return SqlSnafu {
                message: format!(
                    "flow '{name}': {} positions for {} sources",
                    commit.positions.len(),
                    run.plan.sources.len()
                ),
            }
            .fail();
        }
        let rows = sink
            .commit(Commit {
                output: &commit.output,
                now: commit.now,
                positions: &commit.positions,
                snapshot: commit.snapshot.as_deref(),
                fence: run.fence,
                ticked: commit.ticked,
            })
            .map_err(|f| match f.fenced {
                true => fenced(name, fence),
                false => SqlSnafu {
                    message: format!("flow '{name}': {}", f.message),
                }
                .build(),
            })?;
        if let Ok(mut s) = run.handle.status.lock() {
            s.rows_written += rows;
            if commit.ticked {
                s.last_execution_ms = Some(commit.now);
            }
        }
        // The sink shows the snapshot: the logs may go behind it.
        if commit.snapshot.is_some() {
            for (r, p) in run.handle._readers.iter().zip(&commit.positions) {
                r.keep_from_position(*p);
            }
        }
        Ok(rows)
    }

    /// The node a flow is placed on, if another one.
    pub(crate) fn remote_node(&self, name: &str) -> Option<String> {
        self.remote
            .lock()
            .ok()
            .and_then(|r| r.get(name).map(|r| r.node.clone()))
    }

    /// `ADMIN FLUSH_FLOW` of a flow placed on another node: waits until the
    /// sink shows every change its sources' logs hold (that node commits
    /// them within its tick interval once the change streams carry them),
    /// at most [`REMOTE_FLUSH_TIMEOUT`]. Returns the sink rows written since
    /// the last flush.
    pub(super) async fn flush_remote(
        &self,
        name: &str,
        node: &str,
        handle: &FlowHandle,
    ) -> Result<u64> {
        let run = self
            .remote
            .lock()
            .ok()
            .and_then(|r| r.get(name).cloned())
            .ok_or_else(|| fenced(name, 0))?;
        let core = run
            .sink
            .lock()
            .ok()
            .and_then(|s| s.core.upgrade())
            .ok_or_else(|| {
                SqlSnafu {
                    message: "the database is closing",
                }
                .build()
            })?;
        let deadline = std::time::Instant::now() + REMOTE_FLUSH_TIMEOUT;
        loop {
            let caught_up = {
                let core = core.clone();
                let (name, sources) = (name.to_string(), handle.sources.clone());
                crate::sql::provider::blocking(move || {
                    let Some(stored) = super::manager::load_recovery(&core, &name, sources.len())?
                    else {
                        return Ok(false);
                    };
                    for (t, written) in sources.iter().zip(&stored.written) {
                        if core.store.read_log_part(t, *written)?.is_some() {
                            return Ok(false);
                        }
                    }
                    Ok(true)
                })
                .await?
            };
            if caught_up {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return SqlSnafu {
                    message: format!(
                        "flow '{name}' on node {node} did not write back its sources' changes \
                         within {}s; see information_schema.flows and that node's log",
                        REMOTE_FLUSH_TIMEOUT.as_secs()
                    ),
                }
                .fail();
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let mut s = handle.status.lock().unwrap_or_else(|p| p.into_inner());
        let rows = s.rows_written.saturating_sub(s.rows_at_flush);
        s.rows_at_flush = s.rows_written;
        Ok(rows)
    }

    /// The run of flow `name` on another node under `fence` failed for good
    /// (a trap, a limit): the flow is kept, failed with `message`, until
    /// ADMIN RESUME_FLOW, as a local run's failure is.
    pub(crate) fn remote_failed(
        &self,
        core: &Arc<Core>,
        name: &str,
        fence: u64,
        message: &str,
    ) -> Result<()> {
        let run = self.placed_under(name, fence)?;
        let message = format!("on node {}: {message}", run.node);
        tracing::warn!(flow = %name, "flow failed {message}");
        self.stop_failed(core, &run.handle, message, true);
        Ok(())
    }

    /// The node and fence of flow `name`'s placement elsewhere, if any.
    pub(crate) fn placement(&self, name: &str) -> Option<(String, u64)> {
        self.remote.lock().ok().and_then(|r| {
            r.get(name)
                .map(|r| (r.node.clone(), r.fence & !REMOTE_FENCE))
        })
    }

    /// Forgets a placement (the flow is dropped, replaced or runs here
    /// again).
    pub(crate) fn forget_remote(&self, name: &str) {
        if let Ok(mut r) = self.remote.lock() {
            r.remove(name);
        }
    }
}

fn fenced(name: &str, fence: u64) -> crate::Error {
    SqlSnafu {
        message: format!(
            "flow '{name}' is not placed here under fence {fence} (it moved, or was dropped): \
             this commit is refused"
        ),
    }
    .build()
}

/// The rows of `table` now, and the commit they are at: a remote flow's
/// back-fill (it then reads the table's changes after that commit).
pub(crate) fn backfill(core: &Core, database: &str, name: &str) -> Result<(u64, Vec<RecordBatch>)> {
    let table = core.catalog.table(database, name)?.ok_or_else(|| {
        SqlSnafu {
            message: format!("no table {database}.{name}: it was dropped"),
        }
        .build()
    })?;
    let snapshot = core.store.scan(&table)?;
    Ok((snapshot.seq, snapshot.batches))
}

/// Wakes a hosted run: new input may have come.
pub type Wake = Arc<dyn Fn() + Send + Sync>;

/// Makes a hosted run's change log, given the run's wake-up.
pub type MakeLog = Box<dyn FnOnce(Wake) -> Box<dyn ChangeLog> + Send>;

/// A flow of another node's database, run here (this node is its flow
/// node): the sandbox guest and the runner as for a local flow, with the
/// change log and the sink given by whoever hosts it (the change streams,
/// the storage node's commit call).
pub struct HostedRun {
    slot: Arc<Slot>,
    driver: Arc<Driver>,
    failure: Arc<Mutex<Option<Failure>>>,
}

impl std::fmt::Debug for HostedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostedRun").finish_non_exhaustive()
    }
}

impl HostedRun {
    /// Why the run stopped, if it failed (or was fenced off).
    pub fn failure(&self) -> Option<Failure> {
        self.failure.lock().ok().and_then(|f| f.clone())
    }
}

impl Drop for HostedRun {
    /// Stops the run at once (what it has not committed is redone by the
    /// next run, from the storage node's snapshot).
    fn drop(&mut self) {
        self.driver.remove(&self.slot);
    }
}

impl FlowManager {
    /// Runs `plan` (a flow of another node's database) here, reading
    /// `make_log`'s change log and committing through `sink`.
    pub(crate) async fn host(
        &self,
        name: &str,
        plan: &RemotePlan,
        make_log: MakeLog,
        sink: Box<dyn SinkCommitter>,
    ) -> Result<HostedRun> {
        let (sandbox, engine) = self.sandbox().await?;
        let limits = plan.limits;
        let state = plan.stored.as_ref().map(|s| s.state.clone());
        let (bytes, options) = (plan.plan.clone(), plan.guest_options.clone());
        let schemas: Vec<SourceSchema> = plan.sources.iter().map(|s| s.schema.clone()).collect();
        let (sb, component) = (sandbox.clone(), engine);
        let instance = tokio::task::spawn_blocking(move || match state {
            Some(state) => sb.restore_flow(&component, &state, limits),
            None => sb.create_flow(&component, &bytes, &schemas, &options, limits),
        })
        .await
        .map_err(|e| {
            SqlSnafu {
                message: format!("flow setup task failed: {e}"),
            }
            .build()
        })?
        .map_err(|e| {
            SqlSnafu {
                message: format!("flow '{name}' cannot start here: {e}"),
            }
            .build()
        })?;
        let log = Some((self.logs.clone(), name.to_string()));
        let guest = SandboxGuest {
            instance,
            log: log.clone(),
        };
        let waker = Arc::new(SandboxWaker {
            sandbox,
            component: engine,
            limits,
            log,
        });
        let sources = plan.sources.len();
        let recovery = match &plan.stored {
            Some(s) => Recovery {
                positions: s.positions.clone(),
                written: s.written.clone(),
                from_snapshot: true,
            },
            None => Recovery {
                positions: vec![Position::START; sources],
                written: vec![Position::START; sources],
                from_snapshot: false,
            },
        };
        let mut cfg = RunnerConfig::new(name);
        cfg.tick_interval_ms = plan.tick_interval_ms;
        cfg.snapshot_interval_ms = self.settings.snapshot_interval.as_millis() as i64;
        cfg.output_rows_per_tick = limits.output_rows_per_tick;
        cfg.state_size_limit = limits.state_size;
        let cell: Arc<OnceLock<Box<dyn Fn() + Send + Sync>>> = Arc::new(OnceLock::new());
        let wake = cell.clone();
        let log = make_log(Arc::new(move || {
            if let Some(w) = wake.get() {
                w()
            }
        }));
        let runner = Runner::new(
            cfg,
            self.clock.clone(),
            log,
            sink,
            waker,
            Box::new(guest),
            recovery,
        );
        let failure: Arc<Mutex<Option<Failure>>> = Arc::new(Mutex::new(None));
        let f = failure.clone();
        let after: AfterStep = Box::new(move |runner, _| {
            if let Some(failure) = &runner.status().failure {
                if let Ok(mut f) = f.lock() {
                    *f = Some(failure.clone());
                }
            }
        });
        let slot = self.driver.add(runner, after);
        let _ = cell.set(Box::new(self.driver.waker(&slot)));
        self.driver.wake(&slot);
        Ok(HostedRun {
            slot,
            driver: self.driver.clone(),
            failure,
        })
    }
}
