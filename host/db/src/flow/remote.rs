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
use std::sync::{Arc, Mutex};

use datafusion::arrow::record_batch::RecordBatch;
use datafusion::prelude::SessionContext;
use sandflow_flows::{Batch, Commit, Position, SinkCommitter, Stored};
use tracing::info;

use super::manager::{FlowHandle, FlowManager, SinkPlan};
use super::ports::StoreSink;
use crate::database::Core;
use crate::error::{Result, SqlSnafu, UnsupportedSnafu};
use crate::runtime::FlowLimits;
use sandflow_contract::SourceSchema;

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
        // Exported from here on, before the local run stops trimming.
        if let Some(export) = &core.export {
            export.ensure(&h.sources)?;
        }
        let stored = super::manager::load_recovery(core, name, h.sources.len())?;
        let prepared = self.prepare(core, ctx, &h.def, stored.as_ref()).await?;
        let sink = match &prepared.sink {
            SinkPlan::Existing(t) => t.clone(),
            SinkPlan::Create(_) => return SqlSnafu {
                message: format!(
                    "flow '{name}' has no sink table: it starts again here when the table exists"
                ),
            }
            .fail(),
        };
        // From here on only this placement commits.
        self.halt(&h);
        let cell = self.fence(name);
        let mine = REMOTE_FENCE | fence;
        core.store
            .under_commit_lock(|| cell.store(mine, Ordering::SeqCst))?;
        let handle = self.remote_handle(core, &h, node);
        let committer = StoreSink {
            core: Arc::downgrade(core),
            name: name.to_string(),
            output: prepared.output.clone(),
            sink,
            mapping: prepared.mapping.clone(),
            fence: cell,
            recording: handle.recording.clone(),
        };
        if let Ok(mut r) = self.remote.lock() {
            r.insert(
                name.to_string(),
                Arc::new(RemoteRun {
                    node: node.to_string(),
                    fence: mine,
                    sink: Mutex::new(committer),
                    handle,
                }),
            );
        }
        info!(flow = %name, node = %node, fence = fence, "flow placed on another node");
        Ok(RemotePlan {
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
        })
    }

    /// One tick of flow `name`'s remote run under `fence`: refused unless
    /// that is the flow's current placement. Returns the sink rows written.
    pub(crate) fn remote_commit(
        &self,
        name: &str,
        fence: u64,
        commit: RemoteCommit,
    ) -> Result<u64> {
        let run = self
            .remote
            .lock()
            .ok()
            .and_then(|r| r.get(name).cloned())
            .filter(|r| r.fence == REMOTE_FENCE | fence)
            .ok_or_else(|| fenced(name, fence))?;
        let mut sink = run.sink.lock().map_err(|_| fenced(name, fence))?;
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
    let following = core
        .store
        .follow(std::slice::from_ref(&table), None, true, &mut |_| {
            Box::new(|_| {})
        })?;
    let mut batches = Vec::new();
    if let Some(Some(mut cursor)) = following.cursors.into_iter().next() {
        while let Some((b, _)) = cursor.next_part(&table)? {
            if b.num_rows() > 0 {
                batches.push(b);
            }
        }
    }
    Ok((following.seq, batches))
}
