//! The flow manager: the catalog of flows (persisted as `flow/def/<name>`
//! metadata), CREATE / DROP / FLUSH / RESUME, recovery and automatic
//! restarts. The runners themselves run under the driver (`driver`).
//!
//! Creating a flow: compile its SQL to Substrait (`compile`), instantiate its
//! guest (which accepts or rejects the plan), find the sink and check that it
//! fits, or derive the schema of the sink to create (`sink`), then commit the
//! definition together with the sink it creates in ONE storage transaction
//! (a crash leaves both or neither), then register its readers of the
//! sources' change logs (with a read snapshot for the back-fill) and put its
//! runner under the driver (`launch`). Every check runs before the old flow
//! of an `OR REPLACE` is stopped, and should the commit still fail, the old
//! flow is started again: a failed replacement leaves it running.
//!
//! At start every persisted flow is restored from its snapshot and replays
//! its sources' logs from the snapshot's positions (silently up to what its
//! sink already shows); a flow without a snapshot is rebuilt from its
//! sources.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use datafusion::common::TableReference;
use datafusion::prelude::SessionContext;
use sandflow_flows::{
    Clock, FlowStore, Position, Recovery as RunRecovery, Runner, RunnerConfig, Stored, VirtualClock,
};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use super::compile::{compile, named_tables, CompiledFlow};
use super::driver::{Driver, Slot};
use super::options::{format_interval, parse_interval, parse_options, FlowOptions};
use super::ports::{
    legacy_pos_key, legacy_state_key, snapshot_key, tables_key, written_key, MetaStore,
    NativeGuest, SandboxGuest, SandboxWaker, StoreLog, StoreSink, DEF_PREFIX,
};
use super::recording::{self, RecordingState};
use super::sink;
use super::status::{failure_message, FlowStatus, SharedStatus};
use crate::auth::{Principal, Privilege};
use crate::catalog::{display_name, Table, TableInfo, TableSchema, DEFAULT_DATABASE};
use crate::database::Core;
use crate::error::{
    DatabaseNotFoundSnafu, FlowExistsSnafu, FlowNotFoundSnafu, FlowSnafu, InternalSnafu,
    InvalidDataSnafu, NotFoundSnafu, PermissionDeniedSnafu, Result, SqlSnafu, TooComplexSnafu,
    UnsupportedSnafu,
};
use crate::runtime::{Digest, FlowLimits, RuntimeConfig, RuntimeError, Sandbox};
use crate::schema::TableId;
use crate::sql::parser::{CreateFlow, TableName};
use crate::sql::provider::blocking;
use crate::storage::{LogReader, MetaWrite, WriteSet};

const NEXT_ID_KEY: &str = "flow/next_id";

/// Server-wide settings of flows.
#[derive(Debug, Clone)]
pub struct FlowSettings {
    /// The longest a flow with pending input waits to tick (at least 10 ms);
    /// cheap ticks come sooner (see `sandflow_flows::runner`).
    pub tick_interval: Duration,
    /// Limits of a flow that sets none in `WITH (...)`.
    pub default_limits: FlowLimits,
    /// Where the compiled guest is cached (`None`: compile at every start).
    pub cache_dir: Option<PathBuf>,
    /// How often a busy flow snapshots its state (with its sink writes);
    /// a restart replays at most this much of the change log.
    pub snapshot_interval: Duration,
    /// Automatic restarts in a row of a flow that failed for a transient
    /// reason (CPU budget, storage error); 0 turns them off.
    pub max_restarts: u32,
    /// Wait before the first automatic restart; doubles with each attempt
    /// up to [`MAX_RESTART_BACKOFF`].
    pub restart_backoff: Duration,
    /// How many flows the database runs at most; CREATE FLOW past it is
    /// refused naming the setting.
    pub max_flows: usize,
    /// How long a flow with nothing to do keeps its sandbox; then it sleeps
    /// (its state kept as a snapshot, its memory released) until input
    /// arrives. `None`: never.
    pub sleep_after: Option<Duration>,
    /// Threads that step the flows' runners (with the real clock).
    pub threads: usize,
    /// Where flows' engines run.
    pub engine: FlowEngine,
    /// The sandbox flows run in. `None`: the database makes its own with the
    /// first flow. Databases of one process that are given the same sandbox
    /// share one wasmtime `Engine` and one registry of compiled components.
    pub sandbox: Option<Arc<Sandbox>>,
    /// Only for tests of the sandbox through the whole database: flows this
    /// selects run another guest component instead of sandflow's own. The
    /// server never sets it; nothing in SQL, flags or files can.
    #[doc(hidden)]
    pub untrusted_guest: Option<UntrustedGuest>,
    /// The largest user component (`CREATE COMPONENT`, `PUT
    /// /v1/components/{name}`) in bytes.
    pub max_component_size: usize,
    /// How long compiling an uploaded component may take; past it the
    /// upload fails (the compilation's thread is left to finish on its own,
    /// a compiler process is killed).
    pub component_compile_timeout: Duration,
    /// Where uploaded components are compiled.
    pub component_compiler: ComponentCompiler,
    /// Export the changes of every table a flow reads, for a publisher
    /// outside the database (see [`crate::export`]).
    pub export_changes: bool,
}

/// Where an uploaded component is compiled (see
/// [`FlowSettings::component_compiler`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ComponentCompiler {
    /// On a thread of this process, bounded in time only: a compile bomb
    /// can take this process's memory. For embedders and tests.
    #[default]
    InProcess,
    /// In a child process, `program args...`, which reads the component's
    /// bytes on standard input and writes its compiled form on standard
    /// output (exit status 0), or why it is refused on standard error (exit
    /// status 2). It is killed at the compile timeout; whatever else ends it
    /// (an allocation past its own memory bound, a crash) fails only the
    /// upload. The server runs itself: `sandflow compile-component
    /// --memory-limit BYTES`.
    ///
    /// The program must be built from this same sandflow (wasmtime version
    /// and engine settings): this process loads the compiled form as
    /// machine code, after checking that wasmtime accepts it for its engine.
    Process { program: PathBuf, args: Vec<String> },
}

/// Default of [`FlowSettings::max_component_size`]: 64 MiB.
pub const DEFAULT_MAX_COMPONENT_SIZE: usize = 64 << 20;
/// Default of [`FlowSettings::component_compile_timeout`].
pub const DEFAULT_COMPONENT_COMPILE_TIMEOUT: Duration = Duration::from_secs(60);

/// See [`FlowSettings::untrusted_guest`].
#[doc(hidden)]
#[derive(Clone)]
pub struct UntrustedGuest {
    /// The component's bytes.
    pub component: Arc<Vec<u8>>,
    /// Which flows (by name) run it.
    pub runs: Arc<dyn Fn(&str) -> bool + Send + Sync>,
}

impl std::fmt::Debug for UntrustedGuest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UntrustedGuest({} bytes)", self.component.len())
    }
}

/// Default of [`FlowSettings::max_restarts`].
pub const DEFAULT_MAX_RESTARTS: u32 = 10;
/// Default of [`FlowSettings::restart_backoff`].
pub const DEFAULT_RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between automatic restarts.
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(60);

impl Default for FlowSettings {
    fn default() -> Self {
        FlowSettings {
            tick_interval: DEFAULT_TICK_INTERVAL,
            default_limits: FlowLimits::default(),
            cache_dir: None,
            snapshot_interval: Duration::from_secs(10),
            max_restarts: DEFAULT_MAX_RESTARTS,
            restart_backoff: DEFAULT_RESTART_BACKOFF,
            max_flows: DEFAULT_MAX_FLOWS,
            sleep_after: Some(DEFAULT_SLEEP_AFTER),
            threads: default_threads(),
            engine: FlowEngine::Wasm,
            sandbox: None,
            untrusted_guest: None,
            max_component_size: DEFAULT_MAX_COMPONENT_SIZE,
            component_compile_timeout: DEFAULT_COMPONENT_COMPILE_TIMEOUT,
            component_compiler: ComponentCompiler::InProcess,
            export_changes: false,
        }
    }
}

/// Where flows' engines run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlowEngine {
    /// In the wasm sandbox, each with its memory and CPU limits (production).
    #[default]
    Wasm,
    /// Compiled into this process, without a sandbox and without memory or
    /// CPU limits: for tests (`sandflow test --engine native`), to check
    /// that the engine gives the same results natively and in wasm.
    Native,
}

/// Default of [`FlowSettings::threads`]: the cores, at least 4 (a flow
/// using up its CPU budget holds a thread that long).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(4)
}

/// Under continuous input a flow ticks at most this often; its sink lags its
/// sources by about this much. Each tick is one durable sink commit.
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_millis(200);
/// The id of a database's first flow: GreptimeDB's first user flow id
/// (ids below it are its own), so that ids look alike in both. Databases
/// made before keep counting from where they are.
pub const FIRST_FLOW_ID: u32 = 1024;
/// Default of [`FlowSettings::max_flows`].
pub const DEFAULT_MAX_FLOWS: usize = 10_000;
/// Default of [`FlowSettings::sleep_after`].
pub const DEFAULT_SLEEP_AFTER: Duration = Duration::from_secs(60);

/// Everything persisted about a flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowDef {
    pub name: String,
    pub id: u32,
    pub sink_database: String,
    pub sink_table: String,
    /// The query as written after `AS`.
    pub query: String,
    /// The database the query's unqualified names are in: the session's when
    /// the flow was created.
    #[serde(default = "default_database")]
    pub database: String,
    pub expire_after_ms: Option<i64>,
    /// `EVAL INTERVAL`: the longest the sink may lag its sources while input
    /// is pending, when shorter than the server's tick interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_interval_ms: Option<i64>,
    pub comment: Option<String>,
    /// `WITH (...)` options as written (validated).
    pub options: Vec<(String, String)>,
    /// Source tables `(database, table)` in guest order.
    pub sources: Vec<(String, String)>,
    pub created_ms: i64,
    pub updated_ms: i64,
    /// Whether this flow created its sink table, in the transaction that
    /// stored this definition (false: the table existed, or the flow was
    /// defined by a version that did not record it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sink_created: bool,
    /// Created with `defer_on_missing_source = 'true'` while a source table
    /// did not exist: the flow waits, without a sink or a guest, and starts
    /// when its sources exist. `sources` are then the tables its query
    /// names, as written.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pending: bool,
    /// Stopped by `ADMIN PAUSE_FLOW`: it keeps its position (its snapshot
    /// and its sources' logs from there) and runs again from it at
    /// `ADMIN RESUME_FLOW`, also across restarts of the server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// The user who created the flow; it runs with their privileges (`None`:
    /// created without authentication, unchecked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `USING COMPONENT`: the user component the flow runs (`None`:
    /// sandflow's engine). It keeps running this version's digest until
    /// `ALTER FLOW ... SET COMPONENT VERSION` or CREATE OR REPLACE FLOW.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub component: Option<FlowComponent>,
}

/// The user component a flow runs: which one, which version, and the
/// SHA-256 of its bytes (what the sandbox runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowComponent {
    pub database: String,
    pub name: String,
    pub version: u32,
    /// Hex SHA-256 of the component's bytes.
    pub digest: String,
}

impl FlowComponent {
    /// As `information_schema.flows` and SHOW CREATE FLOW name it.
    pub fn display_name(&self) -> String {
        display_name(&self.database, &self.name)
    }
}

fn default_database() -> String {
    DEFAULT_DATABASE.to_string()
}

impl FlowDef {
    pub fn sink_name(&self) -> String {
        display_name(&self.sink_database, &self.sink_table)
    }

    pub fn source_names(&self) -> Vec<String> {
        self.sources
            .iter()
            .map(|(d, t)| display_name(d, t))
            .collect()
    }

    /// The statement `SHOW CREATE FLOW` prints, shaped as GreptimeDB prints
    /// it: the sink with its database, intervals in seconds, the query as
    /// the SQL parser writes it back (keywords in capitals, one space
    /// between tokens).
    pub fn create_statement(&self) -> String {
        let mut s = format!(
            "CREATE FLOW IF NOT EXISTS {}\nSINK TO {}.{}\n",
            quote_ident(&self.name),
            quote_ident(&self.sink_database),
            quote_ident(&self.sink_table)
        );
        if let Some(c) = &self.component {
            s.push_str(&format!(
                "USING COMPONENT {}.{}\n",
                quote_ident(&c.database),
                quote_ident(&c.name)
            ));
        }
        if let Some(ms) = self.expire_after_ms {
            s.push_str(&format!("EXPIRE AFTER '{}'\n", seconds_text(ms)));
        }
        if let Some(ms) = self.eval_interval_ms {
            s.push_str(&format!("EVAL INTERVAL '{}'\n", seconds_text(ms)));
        }
        if let Some(c) = &self.comment {
            s.push_str(&format!("COMMENT '{}'\n", c.replace('\'', "''")));
        }
        if !self.options.is_empty() {
            let opts: Vec<String> = self
                .options
                .iter()
                .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
                .collect();
            s.push_str(&format!("WITH ({})\n", opts.join(", ")));
        }
        s.push_str("AS ");
        s.push_str(&normalized_query(&self.query));
        s
    }

    /// The sources as GreptimeDB's `information_schema.flows` names them:
    /// `greptime.<database>.<table>`, comma-separated.
    pub fn source_table_names(&self) -> String {
        self.sources
            .iter()
            .map(|(d, t)| format!("greptime.{d}.{t}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `'<n> s'` as GreptimeDB writes intervals, or milliseconds for a part of
/// a second.
fn seconds_text(ms: i64) -> String {
    match ms % 1000 {
        0 => format!("{} s", ms / 1000),
        _ => format!("{ms} ms"),
    }
}

/// The query as the SQL parser writes it back; as written if it does not
/// parse alone.
fn normalized_query(query: &str) -> String {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    match Parser::parse_sql(&GenericDialect {}, query) {
        Ok(statements) if statements.len() == 1 => statements[0].to_string(),
        _ => query.to_string(),
    }
}

fn quote_ident(name: &str) -> String {
    let plain = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// A flow as `information_schema.flows` shows it.
#[derive(Debug, Clone)]
pub struct FlowInfo {
    pub def: FlowDef,
    pub status: FlowStatus,
    pub source_ids: Vec<u64>,
    /// The node the flow is placed on, when it runs on another node.
    pub remote_node: Option<String>,
    /// GreptimeDB's name for the kind of flow this is (see
    /// [`FlowHandle::flow_type`]), shown in `information_schema.flows`.
    pub flow_type: Option<&'static str>,
}

impl FlowInfo {
    /// Whether the flow runs: not waiting for its sources, not paused, not
    /// failed (a sleeping flow runs).
    pub fn is_running(&self) -> bool {
        !self.def.pending && !self.def.paused && self.status.error.is_none()
    }
}

pub(crate) struct FlowHandle {
    pub(super) def: FlowDef,
    pub(super) status: SharedStatus,
    source_ids: Vec<u64>,
    sink_id: Option<u64>,
    /// The flow's runner under the driver; `None` when the flow could not be
    /// started (its status says why).
    slot: Option<Arc<Slot>>,
    /// Its readers of its sources' change logs: while they live, the logs
    /// are kept from the flow's snapshot on (also while it has failed, for
    /// ADMIN RESUME_FLOW).
    pub(super) _readers: Vec<Arc<LogReader>>,
    /// Which run of the flow this is (a restart gets a new one), so that an
    /// automatic restart never replaces a newer run; also the run's fence.
    incarnation: u64,
    /// The flow's recording, if one is on (see [`super::recording`]).
    pub(super) recording: Arc<RecordingState>,
    /// The source tables the run reads, in the guest's order.
    pub(super) sources: Vec<Arc<Table>>,
    /// Whether the query aggregates, once it was compiled (`None` for a
    /// flow that could not start or waits for its sources).
    aggregates: Option<bool>,
}

impl FlowHandle {
    /// GreptimeDB's `flow_type` of this flow, which says which of its two
    /// engines would run it: `batching` for one waiting for its sources or
    /// one that aggregates, `streaming` for one reading a `ttl = 'instant'`
    /// table or one that does not aggregate. sandflow runs both kinds the
    /// same way. `None` when the query was not compiled (a flow that could
    /// not start).
    fn flow_type(&self) -> Option<&'static str> {
        if self.def.pending {
            return Some("batching");
        }
        match self.aggregates {
            Some(aggregates) => Some(greptime_flow_type(aggregates, &self.sources)),
            None if self.sources.iter().any(|t| t.instant()) => Some("streaming"),
            None => None,
        }
    }
}

/// GreptimeDB's engine for a compiled flow: `streaming` when it reads a
/// `ttl = 'instant'` table or does not aggregate, else `batching`.
fn greptime_flow_type(aggregates: bool, sources: &[Arc<Table>]) -> &'static str {
    if !aggregates || sources.iter().any(|t| t.instant()) {
        "streaming"
    } else {
        "batching"
    }
}

/// A sandbox and the digest of sandflow's engine registered in it.
type EngineSandbox = (Arc<Sandbox>, Digest);

/// The flows of one database process.
pub struct FlowManager {
    pub(super) settings: FlowSettings,
    /// The sandbox with sandflow's engine registered in it, set up with the
    /// first flow.
    sandbox: Arc<OnceLock<std::result::Result<EngineSandbox, String>>>,
    /// The digest of [`FlowSettings::untrusted_guest`]'s component, if set.
    untrusted: Arc<OnceLock<std::result::Result<Digest, String>>>,
    flows: RwLock<BTreeMap<String, Arc<FlowHandle>>>,
    /// Serialises CREATE / DROP FLOW, and CREATE / DROP COMPONENT.
    pub(super) ddl: tokio::sync::Mutex<()>,
    /// Component compilations running now (see [`super::components`]).
    pub(super) compiling: Arc<std::sync::atomic::AtomicUsize>,
    /// Automatic restarts asked for by failed flows, each due at a time on
    /// the database's clock (see [`supervise`], [`FlowManager::restart_due`]);
    /// `None` until the supervisor starts, and again at shutdown.
    restarts: Mutex<Option<Vec<RestartRequest>>>,
    /// Wakes the supervisor when a restart is asked for.
    restart_asked: Arc<tokio::sync::Notify>,
    /// Source of [`FlowHandle::incarnation`].
    incarnations: AtomicU64,
    /// Set at shutdown: nothing starts any more.
    closed: std::sync::atomic::AtomicBool,
    /// The database's clock.
    pub(super) clock: Arc<dyn Clock>,
    /// Steps the runners.
    pub(super) driver: Arc<Driver>,
    /// Per flow name, the fence of its current run: a sink commit of any
    /// other run is refused.
    fences: Mutex<HashMap<String, Arc<AtomicU64>>>,
    /// What the flows' guests write to stdout and stderr.
    pub(crate) logs: Arc<super::logs::FlowLogs>,
    /// The flows placed on other nodes (see [`super::remote`]).
    pub(super) remote: Mutex<HashMap<String, Arc<super::remote::RemoteRun>>>,
}

/// A failed flow's request to be restarted at `at_ms` (the database's clock).
#[derive(Debug)]
pub(crate) struct RestartRequest {
    name: String,
    incarnation: u64,
    at_ms: i64,
}

impl std::fmt::Debug for FlowManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlowManager")
    }
}

/// The wait before automatic restart number `attempts + 1`.
fn restart_delay(initial: Duration, attempts: u32) -> Duration {
    initial
        .saturating_mul(1u32 << attempts.min(16))
        .min(MAX_RESTART_BACKOFF)
        .max(Duration::from_millis(10))
}

/// Runs automatic restarts when they are due on the database's (real)
/// clock, one at a time, until the database shuts down or is gone.
async fn supervise(
    core: std::sync::Weak<Core>,
    session: fn(&Arc<Core>) -> SessionContext,
    asked: Arc<tokio::sync::Notify>,
) {
    loop {
        let next = {
            let Some(core) = core.upgrade() else { return };
            let now = core.flows.now_ms();
            let Some((ready, next)) = core.flows.take_due_restarts(now) else {
                return;
            };
            if !ready.is_empty() {
                let ctx = session(&core);
                for req in ready {
                    core.flows.auto_restart(&core, &ctx, req).await;
                }
                continue;
            }
            next.map(|at| Duration::from_millis((at - now).clamp(1, 60_000) as u64))
        };
        match next {
            Some(wait) => {
                tokio::select! {
                    _ = asked.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
            None => asked.notified().await,
        }
    }
}

fn flow_err(message: impl Into<String>) -> crate::error::Error {
    FlowSnafu {
        message: message.into(),
    }
    .build()
}

/// A snapshot that does not restore (in either engine).
fn restore_error(name: &str, e: impl std::fmt::Display) -> crate::error::Error {
    flow_err(format!(
        "cannot restore flow '{name}' from its snapshot: {e}; \
         recreate it with CREATE OR REPLACE FLOW"
    ))
}

/// The native engine's refusal of a flow, as the sandbox's would be.
fn native_error(name: &str, error: crate::runtime::FlowError) -> crate::error::Error {
    let message = format!("cannot create flow '{name}': {error}");
    match error {
        crate::runtime::FlowError::Unsupported(_) => UnsupportedSnafu { message }.build(),
        _ => SqlSnafu { message }.build(),
    }
}

fn guest_error(name: &str, e: RuntimeError) -> crate::error::Error {
    match e {
        RuntimeError::Guest { error } => {
            let message = format!("cannot create flow '{name}': {error}");
            match error {
                crate::runtime::FlowError::Unsupported(_) => UnsupportedSnafu { message }.build(),
                _ => SqlSnafu { message }.build(),
            }
        }
        other => flow_err(format!("cannot create flow '{name}': {other}")),
    }
}

impl FlowManager {
    /// Flows on `clock`: with a virtual clock (`manual`) they run only when
    /// the caller drives them (see [`FlowManager::advance_to`]), else on
    /// [`FlowSettings::threads`] threads.
    pub fn new(
        settings: FlowSettings,
        clock: Arc<dyn Clock>,
        manual: Option<Arc<VirtualClock>>,
    ) -> Result<FlowManager> {
        let driver = Arc::new(match manual {
            Some(c) => Driver::manual(c),
            None => Driver::threaded(clock.clone(), settings.threads)
                .map_err(|e| flow_err(format!("cannot start the threads that run flows: {e}")))?,
        });
        Ok(FlowManager {
            logs: Arc::new(super::logs::FlowLogs::new(clock.clone())),
            clock,
            driver,
            fences: Mutex::new(HashMap::new()),
            remote: Mutex::new(HashMap::new()),
            settings,
            sandbox: Arc::new(OnceLock::new()),
            untrusted: Arc::new(OnceLock::new()),
            flows: RwLock::new(BTreeMap::new()),
            ddl: tokio::sync::Mutex::new(()),
            compiling: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            restarts: Mutex::new(None),
            restart_asked: Arc::new(tokio::sync::Notify::new()),
            incarnations: AtomicU64::new(1),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The time now, on the database's clock (ms since the epoch).
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    /// Steps every flow that has something to do now (a virtual clock; with
    /// the real clock the flows' threads do this on their own).
    pub fn run_pending(&self) {
        self.driver.run_pending();
    }

    /// Moves a virtual clock forward to `to_ms`, ticking every flow at each
    /// time it asked for on the way, in time order. Refused on the real
    /// clock, or backwards.
    pub fn advance_to(&self, to_ms: i64) -> Result<()> {
        self.driver.advance_to(to_ms).map_err(flow_err)
    }

    /// Stops `handle`'s run at once (no last write-back): it is dropped or
    /// replaced. Waits for a step under way.
    pub(super) fn halt(&self, handle: &FlowHandle) {
        if let Some(slot) = &handle.slot {
            self.driver.remove(slot);
        }
    }

    /// The fence cell of flow `name`.
    pub(super) fn fence(&self, name: &str) -> Arc<AtomicU64> {
        let mut f = self.fences.lock().unwrap_or_else(|p| p.into_inner());
        f.entry(name.to_string()).or_default().clone()
    }

    fn handles(&self) -> Vec<Arc<FlowHandle>> {
        self.flows
            .read()
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn get_def(&self, name: &str) -> Option<FlowDef> {
        self.get(name).map(|h| h.def.clone())
    }

    /// The settings the manager was made with.
    pub(super) fn settings(&self) -> &FlowSettings {
        &self.settings
    }

    fn get(&self, name: &str) -> Option<Arc<FlowHandle>> {
        self.flows.read().ok().and_then(|f| f.get(name).cloned())
    }

    /// A flow named in a string argument (`ADMIN FLUSH_FLOW('Name')`): the
    /// exact name, else the one name equal ignoring case, with or without a
    /// `database.` prefix (flow names are server-wide).
    fn find(&self, name: &str) -> Option<Arc<FlowHandle>> {
        if let Some(h) = self.get(name) {
            return Some(h);
        }
        let flows = self.flows.read().ok()?;
        let bare = name.rsplit('.').next().unwrap_or(name);
        if let Some(h) = flows.get(bare) {
            return Some(h.clone());
        }
        let mut matches = flows
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(bare))
            .map(|(_, h)| h.clone());
        match (matches.next(), matches.next()) {
            (Some(h), None) => Some(h),
            _ => None,
        }
    }

    /// Flow names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.flows
            .read()
            .map(|f| f.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Every flow with its run-time status, sorted by name.
    pub fn infos(&self) -> Vec<FlowInfo> {
        self.handles()
            .into_iter()
            .map(|h| FlowInfo {
                def: h.def.clone(),
                status: h.status.lock().map(|s| s.clone()).unwrap_or_default(),
                source_ids: h.source_ids.clone(),
                remote_node: self.remote_node(&h.def.name),
                flow_type: h.flow_type(),
            })
            .collect()
    }

    pub fn definition(&self, name: &str) -> Result<FlowDef> {
        self.get(name)
            .map(|h| h.def.clone())
            .ok_or_else(|| flow_not_found(name))
    }

    /// After DROP TABLE (or DROP DATABASE) of `table`: every running flow
    /// that read or wrote it stops and is marked failed with a reason naming
    /// the table, as GreptimeDB lets the table go. DROP FLOW, or CREATE OR
    /// REPLACE FLOW once the table is back, repairs it. Pending flows keep
    /// waiting.
    pub(crate) fn table_dropped(&self, core: &Arc<Core>, table: &Table) {
        let id = table.id();
        for h in self.handles() {
            let reads = h.source_ids.contains(&id);
            if h.def.pending || !(reads || h.sink_id == Some(id)) {
                continue;
            }
            let role = if reads { "source" } else { "sink" };
            let message = dropped_message(role, &table.qualified_name(), &h.def.name);
            warn!(flow = %h.def.name, "flow stopped: its {role} table {} was dropped", table.qualified_name());
            self.stop_failed(core, &h, message, true);
        }
    }

    /// Stops `h`'s flow and keeps it, failed with `message` (a failure
    /// counted if `failure`), until DROP FLOW, CREATE OR REPLACE FLOW or
    /// ADMIN RESUME_FLOW.
    pub(super) fn stop_failed(
        &self,
        core: &Arc<Core>,
        h: &Arc<FlowHandle>,
        message: String,
        failure: bool,
    ) {
        self.stop_as(core, h, h.def.clone(), Some(message), failure);
    }

    /// Stops `h`'s flow and keeps it stopped, as `def`, with `error` (a
    /// failure counted if `failure`); its log readers stay, so its sources'
    /// logs are kept from its last commit.
    fn stop_as(
        &self,
        core: &Arc<Core>,
        h: &Arc<FlowHandle>,
        def: FlowDef,
        error: Option<String>,
        failure: bool,
    ) {
        self.halt(h);
        // A placement on another node ends too: its commits are refused.
        self.forget_remote(&def.name);
        let mut status = h.status.lock().map(|s| s.clone()).unwrap_or_default();
        status.error = error;
        if failure {
            status.failures += 1;
        }
        status.pending_since_ms = None;
        self.runless_handle(core, h, def, status);
    }

    /// Replaces `h` by a handle of the same flow, as `def`, with `status`
    /// and no local run: the same readers (they keep the logs from its
    /// snapshot on), a new incarnation.
    fn runless_handle(
        &self,
        core: &Arc<Core>,
        h: &Arc<FlowHandle>,
        def: FlowDef,
        status: FlowStatus,
    ) -> Arc<FlowHandle> {
        let status = Arc::new(Mutex::new(status));
        self.register_metrics(core, &def.name, &status);
        let name = def.name.clone();
        let handle = Arc::new(FlowHandle {
            def,
            status,
            source_ids: h.source_ids.clone(),
            sink_id: h.sink_id,
            slot: None,
            _readers: h._readers.clone(),
            incarnation: self.incarnations.fetch_add(1, Ordering::Relaxed),
            recording: h.recording.clone(),
            sources: h.sources.clone(),
            aggregates: h.aggregates,
        });
        if let Ok(mut f) = self.flows.write() {
            f.insert(name, handle.clone());
        }
        handle
    }

    /// The handle of `h`'s flow once it runs on another node: no local run,
    /// its status carried over.
    pub(super) fn remote_handle(&self, core: &Arc<Core>, h: &Arc<FlowHandle>) -> Arc<FlowHandle> {
        let mut status = h.status.lock().map(|s| s.clone()).unwrap_or_default();
        status.error = None;
        status.pending_since_ms = None;
        status.asleep = false;
        self.runless_handle(core, h, h.def.clone(), status)
    }

    /// Before an ALTER TABLE of table `id`: stops the flows that read or
    /// write it (they would read its rows in the layout they were built
    /// for) and returns their definitions for [`FlowManager::table_altered`].
    pub(crate) async fn table_altering(&self, core: &Arc<Core>, table: &Table) -> Vec<FlowDef> {
        let _ddl = self.ddl.lock().await;
        let id = table.id();
        let mut defs = Vec::new();
        for h in self.handles() {
            if h.def.pending || !(h.source_ids.contains(&id) || h.sink_id == Some(id)) {
                continue;
            }
            let message = format!(
                "stopped while ALTER TABLE {} runs; it starts again when it is done",
                table.qualified_name()
            );
            self.stop_failed(core, &h, message, false);
            defs.push(h.def.clone());
        }
        defs
    }

    /// After an ALTER TABLE (or after it failed): starts the flows that
    /// [`FlowManager::table_altering`] stopped again, rebuilt over the
    /// table as it is now (a back-fill), except those that read a column
    /// the ALTER dropped, renamed or retyped, or a table it renamed: they
    /// stay failed with the reason.
    pub(crate) async fn table_altered(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        defs: Vec<FlowDef>,
        change: &TableChange,
    ) {
        let _ddl = self.ddl.lock().await;
        let table = (change.database.clone(), change.table.clone());
        for mut def in defs {
            let reads = def.sources.contains(&table);
            let shown = display_name(&change.database, &change.table);
            let mut why = None;
            if reads {
                if let Some(new) = &change.renamed_to {
                    why = Some(format!(
                        "its source table '{shown}' was renamed to '{new}' (ALTER TABLE)"
                    ));
                }
                for (column, what) in &change.columns {
                    if why.is_none() && query_mentions(&def.query, column) {
                        why = Some(format!(
                            "column '{column}' of its source table '{shown}' {what} (ALTER TABLE)"
                        ));
                    }
                }
            }
            if let Some(why) = why {
                if let Some(h) = self.get(&def.name) {
                    warn!(flow = %def.name, "flow failed: {why}");
                    let message = format!(
                        "{why}; change the query and run CREATE OR REPLACE FLOW, or DROP FLOW {}",
                        def.name
                    );
                    self.stop_failed(core, &h, message, true);
                }
                continue;
            }
            if (def.sink_database.clone(), def.sink_table.clone()) == table {
                if let Some(new) = &change.renamed_to {
                    def.sink_table = new.clone();
                }
            }
            let name = def.name.clone();
            match self
                .create_locked(core, ctx, recreate_statement(&def))
                .await
            {
                // A paused flow stays paused, rebuilt, until RESUME_FLOW.
                Ok(_) if def.paused => {
                    if let Err(e) = self.pause_locked(core, &name) {
                        warn!(flow = %name, "flow cannot be paused again after ALTER TABLE: {e}");
                    }
                }
                Ok(_) => info!(flow = %name, "flow rebuilt after ALTER TABLE {shown}"),
                Err(e) => {
                    if let Some(h) = self.get(&name) {
                        warn!(flow = %name, "flow cannot start after ALTER TABLE: {e}");
                        let message = format!(
                            "cannot start again after ALTER TABLE {shown}: {e}; fix the query or \
                             the table and run CREATE OR REPLACE FLOW, or DROP FLOW {name}"
                        );
                        self.stop_failed(core, &h, message, true);
                    }
                }
            }
        }
    }

    /// `ADMIN PAUSE_FLOW`: stops the flow where it is; its position (its
    /// last commit and its sources' logs from there) is kept, and `ADMIN
    /// RESUME_FLOW` continues from it, so rows written meanwhile reach the
    /// sink exactly once. Returns false if it was paused already.
    pub(crate) async fn pause(&self, core: &Arc<Core>, name: &str) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        self.pause_locked(core, name)
    }

    /// [`FlowManager::pause`] under the DDL lock.
    fn pause_locked(&self, core: &Arc<Core>, name: &str) -> Result<bool> {
        let h = self.require(name)?;
        if h.def.paused {
            return Ok(false);
        }
        if h.def.pending {
            return UnsupportedSnafu {
                message: format!(
                    "flow '{name}' is pending (it waits for its source tables): there is nothing \
                     to pause; DROP FLOW {name} removes it"
                ),
            }
            .fail();
        }
        let mut def = h.def.clone();
        def.paused = true;
        store_definition(core, &def)?;
        self.stop_as(core, &h, def, None, false);
        info!(flow = %name, "flow paused");
        Ok(true)
    }

    /// Flows that read or write table `id`.
    pub fn users_of(&self, id: u64) -> Vec<String> {
        self.handles()
            .iter()
            .filter(|h| h.sink_id == Some(id) || h.source_ids.contains(&id))
            .map(|h| h.def.name.clone())
            .collect()
    }

    /// Marks the manager closed (nothing starts or restarts any more, the
    /// supervisor ends) and takes every flow out of it.
    fn close(&self) -> Vec<Arc<FlowHandle>> {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut r) = self.restarts.lock() {
            r.take();
        }
        self.restart_asked.notify_one();
        match self.flows.write() {
            Ok(mut f) => std::mem::take(&mut *f).into_values().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Stops every flow after its last write-back and snapshot (the
    /// database is closing).
    pub fn shutdown(&self) {
        let handles = self.close();
        // Every flow is told first so that their final write-backs overlap.
        let slots: Vec<Arc<Slot>> = handles.iter().filter_map(|h| h.slot.clone()).collect();
        self.driver.stop(&slots);
        self.driver.close();
    }

    /// Stops every flow where it is, writing nothing more (a simulated
    /// crash; see [`crate::Database::crash`]).
    pub fn halt_all(&self) {
        for h in &self.close() {
            self.halt(h);
        }
        self.driver.close();
    }

    /// Trims the change logs up to where every reader is past, and drops the
    /// logs nobody reads.
    fn trim_logs(&self, core: &Core) {
        if let Err(e) = core.store.trim_logs() {
            warn!("cannot trim the change logs: {e}");
        }
    }

    /// Restarts every persisted flow (at database open). A flow that cannot
    /// start is listed as failed with the reason.
    ///
    /// A flow and the sink it creates are committed together, so no sink
    /// can be left without its flow. Versions before that committed the sink
    /// first: a crash in between left a sink table without a flow. Nothing
    /// recorded which tables a flow created then (`FlowDef::sink_created`
    /// does now), and such a table cannot be told from one a user made with
    /// the same columns, so it stays as an ordinary table: the same CREATE
    /// FLOW adopts it, or DROP TABLE removes it. Dropping it here could
    /// destroy a user's data.
    pub(crate) async fn start_all(&self, core: &Arc<Core>, ctx: &SessionContext) -> Result<()> {
        let defs = MetaStore(core.store.clone())
            .definitions()
            .map_err(|f| flow_err(f.message))?;
        // Every flow registers its log readers (and so keeps the logs of its
        // sources from its snapshot on) before any of them runs: a flow's
        // first step must neither trim log entries another flow has yet to
        // replay nor write into a sink before the flow reading that sink
        // reads its log.
        let mut started = Vec::new();
        for (key, bytes) in defs {
            let def: FlowDef = match serde_json::from_slice(&bytes) {
                Ok(d) => d,
                Err(e) => {
                    warn!("ignoring unreadable definition of flow {key}: {e}");
                    continue;
                }
            };
            let name = def.name.clone();
            if def.pending {
                let handle = self.pending_handle(core, def, FlowStatus::default());
                if let Ok(mut f) = self.flows.write() {
                    f.insert(name, handle);
                }
                continue;
            }
            let recovery = load_recovery(core, &name, def.sources.len())?;
            // A flow whose tables were dropped (and maybe created again)
            // while it was stopped stays failed: its state and sink rows
            // belong to the tables that are gone.
            let stale = stale_tables(core, &def)?;
            let prepared = if let Some(why) = &stale {
                Err(Some(flow_err(why.clone())))
            } else if def.paused {
                Err(None)
            } else {
                match self.prepare(core, ctx, &def, recovery.as_ref()).await {
                    Ok(p) => self
                        .ensure_sink(core, &def, &p.sink)
                        .await
                        .map(|sink| (p, sink))
                        .map_err(Some),
                    Err(e) => Err(Some(e)),
                }
            };
            let handle = match prepared {
                Ok((prepared, sink)) => {
                    match &recovery {
                        Some(r) => info!(
                            flow = %name,
                            "flow restored from its snapshot at commit {}, replaying its sources' changes since",
                            r.positions
                                .iter()
                                .map(|p| p.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                        None => {
                            info!(flow = %name, "flow restarted without a snapshot; rebuilding its state from its sources")
                        }
                    }
                    let handle = self.launch(
                        core,
                        def.clone(),
                        prepared,
                        sink,
                        recovery,
                        false,
                        FlowStatus::default(),
                    )?;
                    started.extend(handle.slot.clone());
                    handle
                }
                Err(e) => {
                    match &e {
                        Some(e) => warn!(flow = %name, "flow cannot start: {e}"),
                        None => {
                            info!(flow = %name, "flow is paused; ADMIN RESUME_FLOW continues it")
                        }
                    }
                    // Its sources' logs are kept from its snapshot on (for
                    // ADMIN RESUME_FLOW).
                    let sources: Vec<Arc<Table>> = def
                        .sources
                        .iter()
                        .filter_map(|(d, t)| core.catalog.table(d, t).ok().flatten())
                        .collect();
                    let source_ids = sources.iter().map(|t| t.id()).collect();
                    let recording = Arc::new(RecordingState::load(&core.store, &name)?);
                    let readers = match (&recovery, sources.len() == def.sources.len()) {
                        (Some(r), true) if stale.is_none() => {
                            let floor = log_floor(&r.positions, &recording);
                            core.store
                                .follow(&sources, Some(&floor), false, &mut |_| Box::new(|_| {}))?
                                .readers
                        }
                        _ => Vec::new(),
                    };
                    let status = Arc::new(Mutex::new(FlowStatus {
                        error: match (&stale, e) {
                            (Some(why), _) => Some(why.clone()),
                            (None, e) => e.map(|e| format!("cannot start after restart: {e}")),
                        },
                        ..Default::default()
                    }));
                    self.register_metrics(core, &name, &status);
                    Arc::new(FlowHandle {
                        status,
                        source_ids,
                        sink_id: None,
                        slot: None,
                        _readers: readers,
                        incarnation: self.incarnations.fetch_add(1, Ordering::Relaxed),
                        recording,
                        sources,
                        def,
                        aggregates: None,
                    })
                }
            };
            if let Ok(mut f) = self.flows.write() {
                f.insert(name, handle);
            }
        }
        // A flow whose owner lost a privilege while the server was down
        // fails before it runs.
        self.recheck_owners_locked(core);
        for slot in &started {
            self.driver.wake(slot);
        }
        // Sources created before a crash, after the flow was stored pending.
        self.start_pending(core, ctx).await;
        Ok(())
    }

    /// `CREATE [OR REPLACE] FLOW [IF NOT EXISTS] ...`. Returns whether a flow was created.
    pub(crate) async fn create(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        stmt: CreateFlow,
    ) -> Result<bool> {
        if stmt.or_replace && stmt.if_not_exists {
            return UnsupportedSnafu {
                message: "CREATE OR REPLACE FLOW and IF NOT EXISTS cannot be used together; \
                          use one of them",
            }
            .fail();
        }
        let _ddl = self.ddl.lock().await;
        self.create_locked(core, ctx, stmt).await
    }

    /// CREATE FLOW under the DDL lock.
    pub(super) async fn create_locked(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        stmt: CreateFlow,
    ) -> Result<bool> {
        let who = crate::sql::visible::principal_of(&ctx.copied_config());
        let old = self.get(&stmt.name);
        if let Some(old) = &old {
            if !stmt.if_not_exists {
                self.check_flow_access(core, &who, &old.def.name)?;
            }
        }
        if old.is_none() {
            crate::catalog::check_name("flow", &stmt.name)?;
            let running = self.flows.read().map(|f| f.len()).unwrap_or(0);
            if running >= self.settings.max_flows {
                return crate::error::LimitExceededSnafu {
                    message: format!(
                        "cannot create flow '{}': the server runs at most {} flows \
                         (--max-flows, [flow] max_flows); drop a flow or raise the setting",
                        stmt.name, self.settings.max_flows
                    ),
                }
                .fail();
            }
        }
        if old.is_some() {
            if stmt.if_not_exists {
                return Ok(false);
            }
            if !stmt.or_replace {
                return FlowExistsSnafu {
                    message: format!(
                        "flow '{}' already exists; use CREATE OR REPLACE FLOW to replace it, \
                         or CREATE FLOW IF NOT EXISTS to keep it",
                        stmt.name
                    ),
                }
                .fail();
            }
        }
        let options = parse_options(&stmt.options, stmt.component.is_some())
            .map_err(|message| InvalidDataSnafu { message }.build())?;
        let expire_after_ms = match &stmt.expire_after {
            Some(text) => Some(parse_interval(text).map_err(|m| {
                SqlSnafu {
                    message: format!("EXPIRE AFTER: {m}"),
                }
                .build()
            })?),
            None => None,
        };
        let eval_interval_ms = match &stmt.eval_interval {
            Some(text) => Some(parse_eval_interval(text)?),
            None => None,
        };
        let component = match &stmt.component {
            Some(c) => Some(self.resolve_component(core, &who, c)?),
            None => None,
        };
        let now = self.now_ms();
        let id = match &old {
            Some(h) => h.def.id,
            None => self.next_id(core)?,
        };
        // The definition as stored: pending (sources from the query's text)
        // or resolved (sources from compiling).
        let define = |sources: Vec<(String, String)>, pending: bool| FlowDef {
            name: stmt.name.clone(),
            id,
            sink_database: stmt.sink.database.clone(),
            sink_table: stmt.sink.table.clone(),
            query: stmt.query.clone(),
            database: stmt.database.clone(),
            expire_after_ms,
            eval_interval_ms,
            comment: stmt.comment.clone(),
            options: stmt.options.clone(),
            sources,
            created_ms: old.as_ref().map_or(now, |h| h.def.created_ms),
            updated_ms: now,
            sink_created: false,
            pending,
            paused: false,
            owner: match &who {
                Principal::Root => None,
                Principal::User(u) => Some(u.clone()),
            },
            component: component.clone(),
        };
        // Sources are resolved by compiling; the definition records them.
        let compiled = match compile_flow(
            core,
            ctx,
            &stmt.database,
            &stmt.name,
            &stmt.query,
            expire_after_ms.is_some(),
        )
        .await
        {
            Ok(compiled) => compiled,
            Err(e) => {
                let missing = self.missing_sources(core, &stmt.query, &stmt.database);
                if missing.is_empty() {
                    return Err(e);
                }
                if !options.defer_on_missing_source() {
                    return Err(missing_sources_error(&stmt.name, &missing));
                }
                let sources = named_tables(&stmt.query, &stmt.database)
                    .into_iter()
                    .map(|t| (t.database, t.table))
                    .collect();
                let def = define(sources, true);
                self.authorize_def(core, &who, &def, old.as_ref().map(|h| &h.def), &options)?;
                return self.create_pending(core, ctx, def, old, &missing).await;
            }
        };
        let mut def = define(source_names(&compiled, &stmt.database), false);
        self.authorize_def(core, &who, &def, old.as_ref().map(|h| &h.def), &options)?;
        self.check_graph(&def)?;
        // Checks everything and derives the sink to create, but writes nothing.
        let prepared = self.prepare(core, ctx, &def, None).await?;
        def.sink_created = matches!(prepared.sink, SinkPlan::Create(_));
        let json = serde_json::to_vec(&def).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode flow definition: {e}"),
            }
            .build()
        })?;
        let next = (id + 1).max(self.peek_next_id(core)?);
        if let Some(old) = &old {
            // The old flow's state must not outlive its definition.
            self.halt(old);
        }
        let (c, committed_def, plan) = (core.clone(), def.clone(), prepared.sink.clone());
        let source_ids = prepared.sources.iter().map(|t| t.id()).collect();
        let flow_type = greptime_flow_type(prepared.aggregates, &prepared.sources);
        let note = sink_description(def.id, flow_type);
        let committed = blocking(move || {
            commit_definition(&c, &committed_def, json, next, plan, source_ids, note)
        })
        .await;
        let sink = match committed {
            Ok(sink) => sink,
            Err(e) => {
                if let Some(old) = old {
                    self.revive(core, ctx, old, &e).await;
                }
                return Err(e);
            }
        };
        let handle = self.launch(core, def, prepared, sink, None, true, FlowStatus::default())?;
        if let Ok(mut f) = self.flows.write() {
            f.insert(stmt.name.clone(), handle);
        }
        self.trim_logs(core);
        info!(flow = %stmt.name, "flow created");
        Ok(true)
    }

    /// Stores a flow whose sources do not all exist yet
    /// (`defer_on_missing_source = 'true'`): its definition only, no sink,
    /// no guest. [`FlowManager::start_pending`] starts it once they exist.
    async fn create_pending(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        def: FlowDef,
        old: Option<Arc<FlowHandle>>,
        missing: &[TableName],
    ) -> Result<bool> {
        self.check_graph(&def)?;
        let json = serde_json::to_vec(&def).map_err(|e| {
            InternalSnafu {
                message: format!("cannot encode flow definition: {e}"),
            }
            .build()
        })?;
        let next = (def.id + 1).max(self.peek_next_id(core)?);
        if let Some(old) = &old {
            self.halt(old);
        }
        let mut writes = vec![
            MetaWrite::Put(format!("{DEF_PREFIX}{}", def.name), json),
            MetaWrite::Put(NEXT_ID_KEY.to_string(), next.to_be_bytes().to_vec()),
        ];
        writes.extend(run_keys(&def.name).into_iter().map(MetaWrite::Delete));
        let c = core.clone();
        if let Err(e) = blocking(move || c.store.commit_meta(writes)).await {
            if let Some(old) = old {
                self.revive(core, ctx, old, &e).await;
            }
            return Err(e);
        }
        let names: Vec<String> = missing
            .iter()
            .map(|t| display_name(&t.database, &t.table))
            .collect();
        info!(flow = %def.name, "flow created pending: it starts once {} exist(s)", names.join(", "));
        let name = def.name.clone();
        let handle = self.pending_handle(core, def, FlowStatus::default());
        if let Ok(mut f) = self.flows.write() {
            f.insert(name, handle);
        }
        self.trim_logs(core);
        Ok(true)
    }

    /// The handle of a pending flow: it runs nothing and reads no log.
    fn pending_handle(
        &self,
        core: &Arc<Core>,
        def: FlowDef,
        status: FlowStatus,
    ) -> Arc<FlowHandle> {
        let status = Arc::new(Mutex::new(status));
        self.register_metrics(core, &def.name, &status);
        Arc::new(FlowHandle {
            status,
            source_ids: def
                .sources
                .iter()
                .filter_map(|(d, t)| core.catalog.table(d, t).ok().flatten())
                .map(|t| t.id())
                .collect(),
            sink_id: None,
            slot: None,
            _readers: Vec::new(),
            incarnation: self.incarnations.fetch_add(1, Ordering::Relaxed),
            recording: Arc::new(RecordingState::default()),
            sources: Vec::new(),
            def,
            aggregates: None,
        })
    }

    /// Starts the pending flows whose source tables all exist now (after a
    /// table was created), as CREATE OR REPLACE FLOW of their definition
    /// would, each at most once per call. One that still cannot start stays
    /// pending, its status saying why.
    pub(crate) async fn start_pending(&self, core: &Arc<Core>, ctx: &SessionContext) {
        let ready = |h: &FlowHandle| {
            h.def.pending
                && h.def
                    .sources
                    .iter()
                    .all(|(d, t)| matches!(core.catalog.table(d, t), Ok(Some(_))))
        };
        if !self.handles().iter().any(|h| ready(h)) {
            return;
        }
        let _ddl = self.ddl.lock().await;
        // A started flow's new sink may be the last source of another: again
        // until a round starts nothing (each round starts one flow at least,
        // or ends).
        let mut tried = HashSet::new();
        while let Some(handle) = self
            .handles()
            .into_iter()
            .find(|h| ready(h) && !tried.contains(&h.def.name))
        {
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            tried.insert(handle.def.name.clone());
            let def = &handle.def;
            match self.create_locked(core, ctx, recreate_statement(def)).await {
                Ok(_) => info!(flow = %def.name, "pending flow started: its sources exist"),
                Err(e) => {
                    warn!(flow = %def.name, "pending flow cannot start: {e}");
                    let mut s = handle.status.lock().unwrap_or_else(|p| p.into_inner());
                    s.error = Some(format!("cannot start: {e}"));
                }
            }
        }
    }

    /// The tables `query` names that do not exist (after its compilation
    /// failed: then a missing table is the likely cause, and says so).
    fn missing_sources(&self, core: &Arc<Core>, query: &str, database: &str) -> Vec<TableName> {
        named_tables(query, database)
            .into_iter()
            .filter(|t| t.database != crate::catalog::INFORMATION_SCHEMA)
            .filter(|t| matches!(core.catalog.table(&t.database, &t.table), Ok(None)))
            .collect()
    }

    /// A replacement failed after the old flow was stopped (its definition
    /// could not be committed): starts the old flow again from its last
    /// snapshot and the log since, as `ADMIN RESUME_FLOW` would.
    async fn revive(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        old: Arc<FlowHandle>,
        why: &crate::error::Error,
    ) {
        if old.def.pending {
            // It ran nothing: it stays as it was, pending.
            info!(flow = %old.def.name, "replacement failed ({why}); the flow stays pending");
            return;
        }
        let def = old.def.clone();
        let carried = old
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .carried();
        let started = async {
            let recovery = load_recovery(core, &def.name, def.sources.len())?;
            let prepared = self.prepare(core, ctx, &def, recovery.as_ref()).await?;
            let sink = self.ensure_sink(core, &def, &prepared.sink).await?;
            self.launch(core, def.clone(), prepared, sink, recovery, true, carried)
        }
        .await;
        match started {
            Ok(handle) => {
                if let Ok(mut f) = self.flows.write() {
                    f.insert(def.name.clone(), handle);
                }
                info!(flow = %def.name, "replacement failed ({why}); the flow runs on as it was");
            }
            Err(e) => {
                warn!(flow = %def.name, "replacement failed ({why}) and the flow cannot start again: {e}");
                let mut s = old.status.lock().unwrap_or_else(|p| p.into_inner());
                s.error = Some(format!(
                    "stopped for CREATE OR REPLACE FLOW, which failed ({why}), and cannot start \
                     again: {e}; run ADMIN RESUME_FLOW('{}') once the cause is fixed",
                    def.name
                ));
            }
        }
    }

    /// `DROP FLOW [IF EXISTS] name`: stops it and forgets it; its sink stays.
    pub(crate) async fn drop_flow(
        &self,
        core: &Arc<Core>,
        name: &str,
        if_exists: bool,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let Some(handle) = self.get(name) else {
            if if_exists {
                return Ok(false);
            }
            return Err(flow_not_found(name));
        };
        self.forget_remote(name);
        if let Ok(mut f) = self.flows.write() {
            f.remove(name);
        }
        unregister_metrics(core, name);
        self.halt(&handle);
        drop(handle);
        self.logs.forget(name);
        let c = core.clone();
        let mut writes = vec![MetaWrite::Delete(format!("{DEF_PREFIX}{name}"))];
        writes.extend(run_keys(name).into_iter().map(MetaWrite::Delete));
        writes.extend(
            recording::stored_keys(&core.store, name)?
                .into_iter()
                .map(MetaWrite::Delete),
        );
        blocking(move || c.store.commit_meta(writes)).await?;
        self.trim_logs(core);
        info!(flow = %name, "flow dropped");
        Ok(true)
    }

    /// `ADMIN RESUME_FLOW('name')`: restarts a failed flow from its last
    /// snapshot, replaying its sources' logged changes since (or, without a
    /// snapshot, from a back-fill). A running flow is left alone (`false`).
    pub(crate) async fn resume(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        name: &str,
    ) -> Result<bool> {
        let _ddl = self.ddl.lock().await;
        let handle = self.require(name)?;
        if let Some(owner) = &handle.def.owner {
            self.owner_may_run(core, owner, &handle.def).map_err(|e| {
                PermissionDeniedSnafu {
                    message: format!(
                        "flow '{}' cannot resume: its owner {owner} lost a privilege it needs: {e}",
                        handle.def.name
                    ),
                }
                .build()
            })?;
        }
        self.restart(core, ctx, handle, false).await
    }

    /// An automatic restart that [`supervise`] runs when its delay is up:
    /// only if the same run of the flow is still failed (it may have been
    /// resumed, replaced or dropped meanwhile). A restart that cannot even
    /// set the flow up counts as another failed attempt.
    async fn auto_restart(&self, core: &Arc<Core>, ctx: &SessionContext, req: RestartRequest) {
        let _ddl = self.ddl.lock().await;
        let Some(handle) = self.get(&req.name) else {
            return;
        };
        if handle.incarnation != req.incarnation {
            return;
        }
        info!(flow = %req.name, "restarting the flow after a transient failure");
        if let Err(e) = self.restart(core, ctx, handle.clone(), true).await {
            let attempts = {
                let mut s = handle.status.lock().unwrap_or_else(|p| p.into_inner());
                s.error = Some(format!("automatic restart failed: {e}"));
                s.failures += 1;
                s.restarts += 1;
                s.restart_attempts += 1;
                s.next_restart_ms = None;
                s.restart_attempts
            };
            self.schedule_restart(&req.name, req.incarnation, &handle.status, attempts);
        }
    }

    /// Restarts `handle`'s flow if it has failed (the caller holds the DDL
    /// lock). Counters carry over; an automatic restart counts as one more
    /// attempt in a row, RESUME_FLOW starts the count afresh.
    async fn restart(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        handle: Arc<FlowHandle>,
        automatic: bool,
    ) -> Result<bool> {
        if handle.def.pending {
            // Started by start_pending once its sources exist.
            return Ok(false);
        }
        let carried = {
            let s = handle.status.lock().unwrap_or_else(|p| p.into_inner());
            if s.error.is_none() && !handle.def.paused {
                return Ok(false);
            }
            let mut c = s.carried();
            c.restarts += 1;
            c.restart_attempts = if automatic { c.restart_attempts + 1 } else { 0 };
            c
        };
        if self.closed.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let mut def = handle.def.clone();
        if let Some(why) = stale_tables(core, &def)? {
            return Err(flow_err(format!(
                "flow '{}' cannot resume: {why}",
                def.name
            )));
        }
        let was_paused = def.paused;
        def.paused = false;
        let recovery = load_recovery(core, &def.name, def.sources.len())?;
        let prepared = self.prepare(core, ctx, &def, recovery.as_ref()).await?;
        let sink = self.ensure_sink(core, &def, &prepared.sink).await?;
        if was_paused {
            store_definition(core, &def)?;
        }
        self.halt(&handle);
        let new = self.launch(core, def.clone(), prepared, sink, recovery, true, carried)?;
        if let Ok(mut f) = self.flows.write() {
            f.insert(def.name.clone(), new.clone());
        }
        drop(handle);
        if self.closed.load(Ordering::SeqCst) {
            // Shut down meanwhile: this run must not outlive the database.
            if let Some(slot) = &new.slot {
                self.driver.stop(std::slice::from_ref(slot));
            }
            return Ok(false);
        }
        info!(flow = %def.name, automatic, "flow restarted");
        Ok(true)
    }

    /// A flow failed for a transient reason after `attempts` automatic
    /// restarts in a row: asks the supervisor to restart it after the
    /// backoff, or gives up (the error then says to resume it by hand).
    pub(crate) fn schedule_restart(
        &self,
        name: &str,
        incarnation: u64,
        status: &SharedStatus,
        attempts: u32,
    ) {
        let max = self.settings.max_restarts;
        let running = self.restarts.lock().map(|r| r.is_some()).unwrap_or(false);
        let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
        if !running || max == 0 {
            return;
        }
        if attempts >= max {
            if let Some(e) = &mut s.error {
                e.push_str(&format!(
                    " (gave up after {attempts} automatic restarts in a row)"
                ));
            }
            s.next_restart_ms = None;
            return;
        }
        let delay = restart_delay(self.settings.restart_backoff, attempts);
        let at_ms = self.now_ms() + delay.as_millis() as i64;
        s.next_restart_ms = Some(at_ms);
        if let Ok(mut r) = self.restarts.lock() {
            if let Some(due) = r.as_mut() {
                due.push(RestartRequest {
                    name: name.to_string(),
                    incarnation,
                    at_ms,
                });
            }
        }
        self.restart_asked.notify_one();
    }

    /// Takes the restarts due at `now_ms`, and says when the next one is.
    fn take_due_restarts(&self, now_ms: i64) -> Option<(Vec<RestartRequest>, Option<i64>)> {
        let mut r = self.restarts.lock().ok()?;
        let all = r.as_mut()?;
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(all)
            .into_iter()
            .partition(|q| q.at_ms <= now_ms);
        let next = later.iter().map(|q| q.at_ms).min();
        *all = later;
        Some((ready, next))
    }

    /// Runs the automatic restarts due now (a virtual clock: they run when
    /// time is moved past them).
    pub(crate) async fn restart_due(&self, core: &Arc<Core>, ctx: &SessionContext) {
        if let Some((ready, _)) = self.take_due_restarts(self.now_ms()) {
            for req in ready {
                self.auto_restart(core, ctx, req).await;
            }
        }
    }

    /// Starts the task that runs automatic restarts when they are due. It
    /// holds only a weak reference to the database and ends at shutdown.
    pub(crate) fn start_supervisor(
        &self,
        core: &Arc<Core>,
        session: fn(&Arc<Core>) -> SessionContext,
    ) {
        if let Ok(mut r) = self.restarts.lock() {
            *r = Some(Vec::new());
        }
        if !self.driver.is_manual() {
            tokio::spawn(supervise(
                Arc::downgrade(core),
                session,
                self.restart_asked.clone(),
            ));
        }
    }

    /// Starts recording flow `name` (see [`super::recording`]), or starts
    /// its recording anew: the flow writes back what is pending and takes a
    /// snapshot, where the recording begins. Returns the start's positions.
    pub async fn start_recording(&self, name: &str) -> Result<Vec<Position>> {
        let handle = self.require(name)?;
        handle.recording.request();
        let flushed = self.flush(name).await;
        let started = handle.recording.started();
        flushed?;
        started.map_err(|e| flow_err(format!("cannot start recording flow '{name}': {e}")))
    }

    /// Stops recording flow `name` and forgets its recording (its logs may
    /// then be trimmed). `false` if it was not being recorded.
    pub(crate) async fn stop_recording(&self, core: &Arc<Core>, name: &str) -> Result<bool> {
        let handle = self.require(name)?;
        let was = handle.recording.stop();
        let keys = recording::stored_keys(&core.store, name)?;
        let any = !keys.is_empty();
        if any {
            let c = core.clone();
            blocking(move || {
                c.store
                    .commit_meta(keys.into_iter().map(MetaWrite::Delete).collect())
            })
            .await?;
        }
        Ok(was || any)
    }

    /// Flow `name`'s recording from its start up to now, after a flush (so
    /// that it holds everything committed to the flow's sources so far).
    pub(crate) async fn recording(
        &self,
        core: &Arc<Core>,
        name: &str,
    ) -> Result<recording::Recording> {
        let handle = self.require(name)?;
        if handle.recording.start_positions().is_none() {
            return Err(recording::not_recorded(name));
        }
        self.flush(name).await?;
        let sink = core
            .catalog
            .require_table(&handle.def.sink_database, &handle.def.sink_table)?;
        let (core, now_ms) = (core.clone(), self.now_ms());
        blocking(move || {
            recording::export(
                &core.store,
                recording::ExportSource {
                    name: &handle.def.name,
                    create_statement: handle.def.create_statement(),
                    sources: &handle.sources,
                    sink: &sink,
                    now_ms,
                },
            )
        })
        .await
    }

    /// The flow named `name` (as [`Self::find`] reads names), or the error
    /// that says there is none.
    pub(super) fn require(&self, name: &str) -> Result<Arc<FlowHandle>> {
        self.find(name).ok_or_else(|| flow_not_found(name))
    }

    /// `ADMIN FLUSH_FLOW('name')`: processes everything committed to the
    /// flow's sources before the call, writes it back, and returns the number
    /// of sink rows written (upserts + deletes) since the previous flush,
    /// counting ticks that ran on their own in between.
    pub async fn flush(&self, name: &str) -> Result<u64> {
        let handle = self.require(name)?;
        let failed = || {
            let s = handle.status.lock().unwrap_or_else(|p| p.into_inner());
            flow_err(failure_message(&handle.def.name, &s, self.now_ms()))
        };
        if handle.def.pending {
            return Err(flow_err(format!(
                "flow '{name}' is pending: it starts once its source tables ({}) exist",
                handle.def.source_names().join(", ")
            )));
        }
        if handle.def.paused {
            return Err(flow_err(format!(
                "flow '{name}' is paused; continue it with ADMIN RESUME_FLOW('{name}')"
            )));
        }
        if let Some((node, _)) = self.placement(name) {
            return self.flush_remote(name, &node, &handle).await;
        }
        let Some(slot) = &handle.slot else {
            return Err(failed());
        };
        let reply = if self.driver.is_manual() {
            // The flush runs in the caller's time: on a blocking thread.
            let (driver, slot) = (self.driver.clone(), slot.clone());
            tokio::task::spawn_blocking(move || driver.flush(&slot))
                .await
                .map_err(|e| flow_err(format!("flush task failed: {e}")))?
        } else {
            self.driver.flush(slot)
        };
        match reply.await {
            Ok(Ok(n)) => Ok(n),
            Ok(Err(f)) if f.fenced => Err(flow_err(format!(
                "flow '{name}' was restarted during the flush; run ADMIN FLUSH_FLOW('{name}') again"
            ))),
            Ok(Err(_)) => Err(failed()),
            Err(_) => Err(flow_err(format!(
                "flow '{name}' was stopped (dropped or replaced) during the flush"
            ))),
        }
    }

    fn peek_next_id(&self, core: &Arc<Core>) -> Result<u32> {
        Ok(match core.store.get_meta(NEXT_ID_KEY)? {
            Some(b) if b.len() == 4 => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            _ => FIRST_FLOW_ID,
        })
    }

    fn next_id(&self, core: &Arc<Core>) -> Result<u32> {
        let stored = self.peek_next_id(core)?;
        let used = self
            .handles()
            .iter()
            .map(|h| h.def.id + 1)
            .max()
            .unwrap_or(FIRST_FLOW_ID);
        Ok(stored.max(used))
    }

    /// Rejects a flow that reads its own sink, or closes a cycle of flows.
    fn check_graph(&self, def: &FlowDef) -> Result<()> {
        let sink = (def.sink_database.clone(), def.sink_table.clone());
        if def.sources.contains(&sink) {
            return UnsupportedSnafu {
                message: format!(
                    "flow '{}' reads its own sink table '{}'; a flow's sink cannot be one of its sources, \
                     choose another SINK TO table",
                    def.name,
                    def.sink_name()
                ),
            }
            .fail();
        }
        // Edges source -> sink of the other flows; is any source reachable from the sink?
        let others: Vec<FlowDef> = self
            .handles()
            .into_iter()
            .filter(|h| h.def.name != def.name)
            .map(|h| h.def.clone())
            .collect();
        let mut path = vec![def.name.clone()];
        let mut seen = HashSet::new();
        if let Some(cycle) = reach(&others, &sink, &def.sources, &mut seen, &mut path) {
            return SqlSnafu {
                message: format!(
                    "flow '{}' would close a cycle of flows ({} -> {}); flows cannot feed themselves",
                    def.name,
                    cycle.join(" -> "),
                    def.name
                ),
            }
            .fail();
        }
        Ok(())
    }

    /// Compiles the flow, instantiates its guest, and finds or creates its sink.
    pub(super) async fn prepare(
        &self,
        core: &Arc<Core>,
        ctx: &SessionContext,
        def: &FlowDef,
        recovery: Option<&Recovery>,
    ) -> Result<Prepared> {
        let options = parse_options(&def.options, def.component.is_some())
            .map_err(|message| SqlSnafu { message }.build())?;
        let compiled = compile_flow(
            core,
            ctx,
            &def.database,
            &def.name,
            &def.query,
            def.expire_after_ms.is_some(),
        )
        .await?;
        let mut sources = Vec::new();
        for (d, t) in source_names(&compiled, &def.database) {
            sources.push(core.catalog.require_table(&d, &t)?);
        }
        let mut limits = limits(&self.settings.default_limits, &options);
        // A flow that sets no CPU budget gets at most its database's quota.
        if options.cpu_limit_per_tick.is_none() {
            if let Some(max) = core
                .access
                .quotas(&def.sink_database)
                .max_cpu_limit_per_tick_ms
            {
                limits.cpu_per_call = limits.cpu_per_call.min(Duration::from_millis(max));
            }
        }
        // A component gets its own options (the engine takes none of them).
        let mut guest_options = options.component.clone();
        if let Some(ms) = def.expire_after_ms {
            guest_options.push((
                sandflow_contract::OPTION_EXPIRE_AFTER_MS.to_string(),
                ms.to_string(),
            ));
        }
        let plan = compiled.plan.clone();
        let remote_options = guest_options.clone();
        let schemas: Vec<_> = compiled.sources.iter().map(|s| s.schema.clone()).collect();
        let remote_schemas = schemas.clone();
        let name = def.name.clone();
        let state = recovery.map(|r| r.state.clone());
        let (guest, waker, output): (
            Box<dyn sandflow_flows::Guest>,
            Arc<dyn sandflow_flows::Waker>,
            Vec<crate::runtime::Field>,
        ) = match self.settings.engine {
            FlowEngine::Native if def.component.is_some() => {
                return UnsupportedSnafu {
                    message: format!(
                        "flow '{}' runs a user component, which runs only in the wasm sandbox, \
                         not with the native engine",
                        def.name
                    ),
                }
                .fail()
            }
            FlowEngine::Native => {
                let (guest, output) = match state {
                    Some(state) => {
                        NativeGuest::start(move || sandflow_engine::Flow::restore(&state), limits)
                            .map_err(|e| restore_error(&name, e))?
                    }
                    None => NativeGuest::start(
                        move || sandflow_engine::Flow::create(&plan, schemas, guest_options),
                        limits,
                    )
                    .map_err(|error| native_error(&name, error))?,
                };
                (
                    Box::new(guest),
                    Arc::new(super::ports::NativeWaker { limits }),
                    output,
                )
            }
            FlowEngine::Wasm => {
                let (sandbox, engine) = self.sandbox().await?;
                let component = match (&def.component, &self.settings.untrusted_guest) {
                    (Some(c), _) => self.load_component(core, &sandbox, c).await?,
                    (None, Some(u)) if (u.runs)(&def.name) => {
                        self.untrusted(u.component.clone()).await?
                    }
                    _ => engine,
                };
                let guest_sandbox = sandbox.clone();
                let name = name.clone();
                let instance = tokio::task::spawn_blocking(move || match state {
                    Some(state) => sandbox
                        .restore_flow(&component, &state, limits)
                        .map_err(|e| restore_error(&name, e)),
                    None => sandbox
                        .create_flow(&component, &plan, &schemas, &guest_options, limits)
                        .map_err(|e| guest_error(&name, e)),
                })
                .await
                .map_err(|e| flow_err(format!("flow setup task failed: {e}")))??;
                let output = instance.output_schema().to_vec();
                let log = Some((self.logs.clone(), def.name.clone()));
                (
                    Box::new(SandboxGuest {
                        instance,
                        log: log.clone(),
                    }),
                    Arc::new(SandboxWaker {
                        sandbox: guest_sandbox,
                        component,
                        limits,
                        log,
                    }),
                    output,
                )
            }
        };
        // Nothing is created here: a new sink commits with the definition.
        let (sink, fitting) = match core.catalog.table(&def.sink_database, &def.sink_table)? {
            Some(t) => (SinkPlan::Existing(t.clone()), t),
            None => {
                if !core.catalog.database_exists(&def.sink_database)? {
                    return DatabaseNotFoundSnafu {
                        message: format!(
                            "database '{0}' does not exist; create it with CREATE DATABASE {0}",
                            def.sink_database
                        ),
                    }
                    .fail();
                }
                let schema = sink::derive_schema(
                    &output[..visible(&output)],
                    &compiled.group_keys,
                    compiled.aggregates && !compiled.counted,
                    compiled.outer_join,
                )
                .map_err(|message| SqlSnafu { message }.build())?;
                let draft = Table::new(TableInfo {
                    id: 0,
                    database: def.sink_database.clone(),
                    name: def.sink_table.clone(),
                    schema: schema.clone(),
                    options: Default::default(),
                    version: 0,
                    time_first: schema.time_index_column().name != sink::TS_PLACEHOLDER,
                    description: None,
                });
                (SinkPlan::Create(schema), draft)
            }
        };
        let mapping = sink::fit(&fitting, &output[..visible(&output)])
            .map_err(|message| SqlSnafu { message }.build())?;
        Ok(Prepared {
            guest,
            waker,
            limits,
            output,
            sources,
            source_fields: compiled
                .sources
                .iter()
                .map(|s| s.schema.fields.clone())
                .collect(),
            sink,
            mapping,
            options,
            // A query without aggregates is compiled wrapped in a count.
            aggregates: compiled.aggregates && !compiled.counted,
            plan: compiled.plan,
            guest_options: remote_options,
            schemas: remote_schemas,
        })
    }

    /// The sink of a flow whose definition is already stored (a restart):
    /// the table, created now if it is missing. Only a flow stored before
    /// its tables were recorded gets here without its sink: for the others
    /// a dropped sink fails the flow first (see [`stale_tables`]).
    async fn ensure_sink(
        &self,
        core: &Arc<Core>,
        def: &FlowDef,
        plan: &SinkPlan,
    ) -> Result<Arc<Table>> {
        match plan {
            SinkPlan::Existing(t) => Ok(t.clone()),
            SinkPlan::Create(schema) => {
                let (table, _) = crate::sql::create_table(
                    core,
                    &def.sink_database,
                    &def.sink_table,
                    schema.clone(),
                    Default::default(),
                    true,
                )
                .await?;
                if table.schema() != schema {
                    return SqlSnafu {
                        message: format!(
                            "sink table '{}' of flow '{}' was created meanwhile with other \
                             columns; run ADMIN RESUME_FLOW('{}') again",
                            def.sink_name(),
                            def.name,
                            def.name
                        ),
                    }
                    .fail();
                }
                Ok(table)
            }
        }
    }

    /// Registers [`FlowSettings::untrusted_guest`]'s component (once).
    async fn untrusted(&self, component: Arc<Vec<u8>>) -> Result<Digest> {
        let (sandbox, _) = self.sandbox().await?;
        let cell = self.untrusted.clone();
        tokio::task::spawn_blocking(move || {
            cell.get_or_init(|| sandbox.register(&component).map_err(|e| e.to_string()))
                .clone()
        })
        .await
        .map_err(|e| flow_err(format!("sandbox setup task failed: {e}")))?
        .map_err(flow_err)
    }

    /// The sandbox and the digest of sandflow's engine in it.
    pub(super) async fn sandbox(&self) -> Result<(Arc<Sandbox>, Digest)> {
        if let Some(sb) = self.sandbox.get() {
            return sb.clone().map_err(flow_err);
        }
        // First flow: compiling or loading the engine takes a while.
        let cell = self.sandbox.clone();
        let cache_dir = self.settings.cache_dir.clone();
        let given = self.settings.sandbox.clone();
        let sb = tokio::task::spawn_blocking(move || {
            cell.get_or_init(|| {
                let sandbox = match given {
                    Some(sandbox) => sandbox,
                    None => {
                        let config = RuntimeConfig {
                            cache_dir,
                            ..RuntimeConfig::default()
                        };
                        Arc::new(Sandbox::new(config).map_err(|e| e.to_string())?)
                    }
                };
                let engine = sandbox
                    .register(crate::engine::component())
                    .map_err(|e| e.to_string())?;
                Ok((sandbox, engine))
            })
            .clone()
        })
        .await
        .map_err(|e| flow_err(format!("sandbox setup task failed: {e}")))?;
        sb.map_err(flow_err)
    }

    /// Registers the flow's log readers and puts its runner under the
    /// driver (stepping at once with `start`, else when woken). A new flow
    /// reads its sources' rows first (the back-fill); a restored one the
    /// logged changes after its snapshot (those up to its last sink write
    /// silently).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        core: &Arc<Core>,
        def: FlowDef,
        p: Prepared,
        sink: Arc<Table>,
        recovery: Option<Recovery>,
        start: bool,
        status: FlowStatus,
    ) -> Result<Arc<FlowHandle>> {
        let mut status = status;
        status.started_ms = Some(self.now_ms());
        let status: SharedStatus = Arc::new(Mutex::new(status));
        // Runs here again: a placement elsewhere is over (its fence is
        // replaced below).
        self.forget_remote(&def.name);
        let incarnation = self.incarnations.fetch_add(1, Ordering::Relaxed);
        // From now on, only this run may write the flow's sink and state.
        let fence = self.fence(&def.name);
        core.store
            .under_commit_lock(|| fence.store(incarnation, Ordering::SeqCst))?;
        let backfill = recovery.is_none() && p.options.backfill();
        // A recording keeps the logs from its start, before the snapshot.
        let recording = Arc::new(match recovery {
            Some(_) => RecordingState::load(&core.store, &def.name)?,
            None => RecordingState::default(),
        });
        let keep_from = recovery
            .as_ref()
            .map(|r| log_floor(&r.positions, &recording));
        // Exported from here on too, before this flow can trim its sources'
        // logs.
        if let Some(export) = &core.export {
            export.ensure(&p.sources, keep_from.as_deref())?;
        }
        // The runner's wake-up is known only once it is under the driver.
        let wake: Arc<OnceLock<Box<dyn Fn() + Send + Sync>>> = Arc::new(OnceLock::new());
        let following =
            core.store
                .follow(&p.sources, keep_from.as_deref(), backfill, &mut |_| {
                    let wake = wake.clone();
                    Box::new(move |_| {
                        if let Some(w) = wake.get() {
                            w()
                        }
                    })
                })?;
        let seq = following.seq;
        let sources = p.sources.len();
        let run_recovery = match recovery {
            Some(r) => RunRecovery {
                positions: r.positions,
                written: r.written,
                from_snapshot: true,
            },
            None => {
                let start = match backfill {
                    true => Position { seq, part: 0 },
                    false => Position::after_commit(seq),
                };
                RunRecovery {
                    positions: vec![start; sources],
                    written: vec![start; sources],
                    from_snapshot: false,
                }
            }
        };
        let limits = p.limits;
        let mut cfg = RunnerConfig::new(def.name.clone());
        cfg.tick_interval_ms = tick_interval_ms(self.settings.tick_interval, def.eval_interval_ms);
        cfg.snapshot_interval_ms = self.settings.snapshot_interval.as_millis() as i64;
        cfg.sleep_after_ms = self.settings.sleep_after.map(|d| d.as_millis() as i64);
        cfg.output_rows_per_tick = limits.output_rows_per_tick;
        cfg.state_size_limit = limits.state_size;
        cfg.fence = incarnation;
        let log = StoreLog::new(
            core.store.clone(),
            p.sources.clone(),
            p.source_fields,
            seq,
            following.cursors,
        );
        let committer = StoreSink {
            core: Arc::downgrade(core),
            name: def.name.clone(),
            output: p.output,
            sink: sink.clone(),
            mapping: p.mapping,
            fence,
            recording: recording.clone(),
        };
        let runner = Runner::new(
            cfg,
            self.clock.clone(),
            Box::new(log),
            Box::new(committer),
            p.waker,
            p.guest,
            run_recovery,
        );
        let after = self.after_step(
            core,
            &def.name,
            incarnation,
            &status,
            &following.readers,
            &recording,
        );
        let slot = self.driver.add(runner, after);
        let _ = wake.set(Box::new(self.driver.waker(&slot)));
        if start {
            self.driver.wake(&slot);
        }
        self.register_metrics(core, &def.name, &status);
        let handle = Arc::new(FlowHandle {
            source_ids: p.sources.iter().map(|t| t.id()).collect(),
            sink_id: Some(sink.id()),
            status,
            slot: Some(slot),
            _readers: following.readers,
            incarnation,
            recording,
            aggregates: Some(p.aggregates),
            sources: p.sources,
            def,
        });
        Ok(handle)
    }

    /// What happens after each step of a flow's runner: its status is
    /// published, a failure recorded (and a transient one restarted after a
    /// while), and a new snapshot lets the logs be trimmed behind it.
    fn after_step(
        &self,
        core: &Arc<Core>,
        name: &str,
        incarnation: u64,
        status: &SharedStatus,
        readers: &[Arc<LogReader>],
        recording: &Arc<RecordingState>,
    ) -> super::driver::AfterStep {
        let recording = recording.clone();
        let core = Arc::downgrade(core);
        let name = name.to_string();
        let status = status.clone();
        let sources: Vec<u64> = readers.iter().map(|r| r.table()).collect();
        let readers: Vec<std::sync::Weak<LogReader>> = readers.iter().map(Arc::downgrade).collect();
        let base = status.lock().map(|s| s.rows_written).unwrap_or(0);
        let snapshot_at: Mutex<Option<Vec<Position>>> = Mutex::new(None);
        Box::new(move |runner: &Runner, out| {
            let run = runner.status();
            let mut failed = None;
            {
                let mut s = status.lock().unwrap_or_else(|p| p.into_inner());
                if run.last_execution_ms.is_some() && run.last_execution_ms != s.last_execution_ms {
                    // A run that ticks has recovered.
                    s.restart_attempts = 0;
                }
                if run.last_execution_ms.is_some() {
                    s.last_execution_ms = run.last_execution_ms;
                }
                s.state_size = run.state_size;
                s.rows_written = base + run.rows_written;
                s.asleep = run.asleep;
                s.pending_since_ms = run.pending_since_ms;
                if let Some(f) = &out.failed {
                    if s.error.is_none() && !f.fenced {
                        warn!(flow = %name, transient = f.transient, "flow failed: {}", f.message);
                        s.error = Some(f.message.clone());
                        s.failures += 1;
                        if f.transient {
                            failed = Some(s.restart_attempts);
                        }
                    }
                }
            }
            let Some(core) = core.upgrade() else { return };
            if let Some(attempts) = failed {
                core.flows
                    .schedule_restart(&name, incarnation, &status, attempts);
            }
            let mut at = snapshot_at.lock().unwrap_or_else(|p| p.into_inner());
            if run.snapshot_positions.is_some() && *at != run.snapshot_positions {
                *at = run.snapshot_positions.clone();
                if let Some(positions) = &*at {
                    // A recording keeps the logs from its start.
                    let start = recording.start_positions().unwrap_or_default();
                    for (i, (r, p)) in readers.iter().zip(positions).enumerate() {
                        let keep = start.get(i).map_or(*p, |s| *s.min(p));
                        if let Some(r) = r.upgrade() {
                            r.keep_from_position(keep);
                        }
                    }
                }
                drop(at);
                // Only this flow's sources can have moved on.
                if let Err(e) = core.store.trim_logs_of(&sources) {
                    warn!(flow = %name, "cannot trim the change logs: {e}");
                }
            }
        })
    }

    fn register_metrics(&self, core: &Arc<Core>, name: &str, status: &SharedStatus) {
        register_metrics(core, name, status, self.clock.clone());
    }
}

fn flow_not_found(name: &str) -> crate::Error {
    FlowNotFoundSnafu {
        message: format!("flow '{name}' does not exist; see SHOW FLOWS"),
    }
    .build()
}

/// Per source, where a flow's change logs must be kept from: its snapshot's
/// positions, or its recording's start if that is earlier.
fn log_floor(snapshot: &[Position], recording: &RecordingState) -> Vec<Position> {
    match recording.start_positions() {
        Some(start) if start.len() == snapshot.len() => snapshot
            .iter()
            .zip(&start)
            .map(|(p, s)| *p.min(s))
            .collect(),
        _ => snapshot.to_vec(),
    }
}

/// Why a flow whose `role` table `table` was dropped is failed, and what
/// repairs it.
fn dropped_message(role: &str, table: &str, flow: &str) -> String {
    format!(
        "{role} table '{table}' was dropped; drop the flow with DROP FLOW {flow}, or create the \
         table again and run CREATE OR REPLACE FLOW"
    )
}

/// The tables a flow was built from, stored with its definition
/// (`flow/tables/<name>`): its state and its sink's rows belong to them.
#[derive(Debug, Serialize, Deserialize)]
struct BoundTables {
    /// In the definition's source order.
    sources: Vec<TableId>,
    sink: TableId,
}

impl BoundTables {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// Why `def`'s flow must not run from its stored state: a source or its
/// sink is not the table the flow was built from (dropped, or dropped and
/// created again under the same name). `None` when they are the same, or
/// for a flow stored before the tables were recorded.
fn stale_tables(core: &Core, def: &FlowDef) -> Result<Option<String>> {
    if def.pending {
        return Ok(None);
    }
    let Some(bytes) = core.store.get_meta(&tables_key(&def.name))? else {
        return Ok(None);
    };
    let Ok(bound) = serde_json::from_slice::<BoundTables>(&bytes) else {
        warn!(flow = %def.name, "unreadable record of the flow's tables; not checked");
        return Ok(None);
    };
    if bound.sources.len() != def.sources.len() {
        return Ok(None);
    }
    let tables = def
        .sources
        .iter()
        .zip(&bound.sources)
        .map(|((d, t), id)| ("source", d, t, *id))
        .chain(std::iter::once((
            "sink",
            &def.sink_database,
            &def.sink_table,
            bound.sink,
        )));
    for (role, database, table, id) in tables {
        // As DROP TABLE's failure names it.
        let shown = format!("{database}.{table}");
        match core.catalog.table(database, table)? {
            None => {
                return Ok(Some(format!(
                    "{role} table '{shown}' no longer exists (dropped or renamed); drop the flow \
                     with DROP FLOW {}, or create the table again and run CREATE OR REPLACE FLOW",
                    def.name
                )))
            }
            Some(now) if now.id() != id => {
                return Ok(Some(format!(
                    "{role} table '{shown}' was dropped and created again since flow '{}' was \
                     built: its state and its sink's rows belong to the dropped table; run \
                     CREATE OR REPLACE FLOW to rebuild it from the table there is now, or DROP \
                     FLOW {}",
                    def.name, def.name
                )))
            }
            Some(_) => {}
        }
    }
    Ok(None)
}

/// The metadata keys of a flow's run (snapshot, written positions, in both
/// formats, and the tables it was built from), deleted with the flow or when
/// it is replaced.
fn run_keys(name: &str) -> Vec<String> {
    vec![
        snapshot_key(name),
        written_key(name),
        tables_key(name),
        legacy_state_key(name),
        legacy_pos_key(name),
    ]
}

const METRICS: [(&str, &str); 7] = [
    (
        "sandflow_flow_failed",
        "1 if the flow has failed (see information_schema.flows.last_error)",
    ),
    (
        "sandflow_flow_sink_rows_written",
        "Sink rows written (upserts + deletes) by the flow since it started",
    ),
    (
        "sandflow_flow_state_bytes",
        "Bytes of operator state the flow's guest reports",
    ),
    (
        "sandflow_flow_last_execution_timestamp_seconds",
        "Wall-clock time of the flow's last tick",
    ),
    (
        "sandflow_flow_failures",
        "Times the flow failed since the server started",
    ),
    (
        "sandflow_flow_restarts",
        "Times the flow was restarted (automatically or by ADMIN RESUME_FLOW) since the server started",
    ),
    (
        "sandflow_flow_lag_seconds",
        "Age of the oldest source change the flow's sink does not reflect yet (0 when caught up)",
    ),
];

/// Per-flow series on /metrics, read from the flow's status at scrape time.
fn register_metrics(core: &Core, name: &str, status: &SharedStatus, clock: Arc<dyn Clock>) {
    let registry = core.metrics();
    for (i, (metric, help)) in METRICS.iter().enumerate() {
        let weak = Arc::downgrade(status);
        let clock = clock.clone();
        registry.gauge_fn(metric, help, &[("flow", name)], move || {
            let Some(s) = weak.upgrade() else { return 0.0 };
            let Ok(s) = s.lock() else { return 0.0 };
            match i {
                0 => s.error.is_some() as u8 as f64,
                1 => s.rows_written as f64,
                2 => s.state_size as f64,
                3 => s.last_execution_ms.unwrap_or(0) as f64 / 1000.0,
                4 => s.failures as f64,
                5 => s.restarts as f64,
                _ => s.lag_ms(clock.now_ms()) as f64 / 1000.0,
            }
        });
    }
}

fn unregister_metrics(core: &Core, name: &str) {
    let registry = core.metrics();
    for (metric, _) in METRICS {
        registry.remove(metric, &[("flow", name)]);
    }
}

/// Where a restarting flow resumes: its snapshot, and per source the
/// positions of the snapshot and of its last sink write.
pub(crate) type Recovery = Stored;

pub(super) fn load_recovery(core: &Core, name: &str, sources: usize) -> Result<Option<Recovery>> {
    MetaStore(core.store.clone())
        .stored(name, sources)
        .map_err(|f| flow_err(f.message))
}

pub(super) struct Prepared {
    /// The flow's engine, created or restored.
    guest: Box<dyn sandflow_flows::Guest>,
    /// Where the engine comes from again after it slept.
    waker: Arc<dyn sandflow_flows::Waker>,
    pub(super) limits: FlowLimits,
    pub(super) output: Vec<crate::runtime::Field>,
    sources: Vec<Arc<Table>>,
    source_fields: Vec<Vec<crate::runtime::Field>>,
    pub(super) sink: SinkPlan,
    pub(super) mapping: Vec<sink::SinkColumn>,
    options: FlowOptions,
    /// The Substrait plan and the engine's options (a remote run's).
    pub(super) plan: Vec<u8>,
    pub(super) guest_options: Vec<(String, String)>,
    pub(super) schemas: Vec<sandflow_contract::SourceSchema>,
    /// Whether the query aggregates (GROUP BY, DISTINCT, an aggregate).
    pub(super) aggregates: bool,
}

/// The sink a prepared flow writes into.
#[derive(Debug, Clone)]
pub(super) enum SinkPlan {
    /// The table exists and fits the flow's output.
    Existing(Arc<Table>),
    /// No such table: the flow creates it with this schema, in the commit
    /// that stores its definition.
    Create(TableSchema),
}

/// The note GreptimeDB leaves on the sink a flow creates, which depends on
/// the engine that would run the flow there ([`greptime_flow_type`]);
/// SHOW CREATE TABLE shows it.
fn sink_description(flow_id: u32, flow_type: &str) -> String {
    match flow_type {
        "streaming" => format!("Sink table for flow flow-id={flow_id}"),
        _ => "Auto created table by flow engine".to_string(),
    }
}

/// Commits a flow's definition (with its id counter, and without a
/// position or snapshot of an earlier flow of that name) and, when it
/// creates one, its sink, in ONE storage transaction under the catalog's
/// DDL lock. Refuses a sink that changed since the flow was prepared.
fn commit_definition(
    core: &Core,
    def: &FlowDef,
    json: Vec<u8>,
    next_id: u32,
    plan: SinkPlan,
    sources: Vec<TableId>,
    sink_note: String,
) -> Result<Arc<Table>> {
    let mut ddl = core.catalog.begin_ddl()?;
    let current = ddl.table(&def.sink_database, &def.sink_table)?;
    let sink = match (plan, current) {
        (SinkPlan::Existing(t), Some(now)) if now.id() == t.id() => now,
        (SinkPlan::Create(schema), None) => ddl.create_table(
            &def.sink_database,
            &def.sink_table,
            schema,
            Default::default(),
            Some(sink_note),
        )?,
        _ => {
            return SqlSnafu {
                message: format!(
                    "sink table '{}' was created, dropped or replaced while flow '{}' was being \
                     created; run the statement again",
                    def.sink_name(),
                    def.name
                ),
            }
            .fail()
        }
    };
    let mut set = WriteSet::new();
    set.put_meta(format!("{DEF_PREFIX}{}", def.name), json)
        .put_meta(NEXT_ID_KEY, next_id.to_be_bytes().to_vec());
    for key in run_keys(&def.name) {
        set.delete_meta(key);
    }
    // After the deletes above: this run's tables replace any before.
    let bound = BoundTables {
        sources,
        sink: sink.id(),
    };
    set.put_meta(tables_key(&def.name), bound.encode());
    for key in recording::stored_keys(&core.store, &def.name)? {
        set.delete_meta(key);
    }
    ddl.commit(&core.store, set)?;
    Ok(sink)
}

/// Why a flow whose sources are `missing` is not created.
fn missing_sources_error(flow: &str, missing: &[TableName]) -> crate::error::Error {
    let names = missing
        .iter()
        .map(|t| display_name(&t.database, &t.table))
        .collect::<Vec<_>>()
        .join(", ");
    NotFoundSnafu {
        message: format!(
            "cannot create flow '{flow}': source table {names} does not exist; create it first, \
             or create the flow WITH (defer_on_missing_source = 'true') to start it once its \
             sources exist"
        ),
    }
    .build()
}

/// `EVAL INTERVAL` as GreptimeDB counts it: a positive number of whole
/// seconds (sandflow keeps the milliseconds written).
fn parse_eval_interval(text: &str) -> Result<i64> {
    let ms = parse_interval(text).map_err(|m| {
        SqlSnafu {
            message: format!("EVAL INTERVAL: {m}"),
        }
        .build()
    })?;
    if ms < 1000 {
        return SqlSnafu {
            message: format!(
                "EVAL INTERVAL '{text}' is shorter than 1 second; GreptimeDB counts it in whole \
                 seconds, so write e.g. '1s' or '1m' (a flow with pending input ticks within \
                 tick_interval anyway, 200ms by default)"
            ),
        }
        .fail();
    }
    Ok(ms)
}

/// A flow's tick interval: the server's, or its `EVAL INTERVAL` when that is
/// shorter (it bounds how long the sink lags; it never slows ticks down).
pub(super) fn tick_interval_ms(server: Duration, eval_interval_ms: Option<i64>) -> i64 {
    let server = server.as_millis().min(i64::MAX as u128) as i64;
    eval_interval_ms.map_or(server, |e| server.min(e))
}

fn limits(defaults: &FlowLimits, options: &FlowOptions) -> FlowLimits {
    FlowLimits {
        memory: options.memory_limit.unwrap_or(defaults.memory),
        cpu_per_call: options.cpu_limit_per_tick.unwrap_or(defaults.cpu_per_call),
        max_output_rows: defaults.max_output_rows,
        output_rows_per_tick: options
            .output_rows_limit_per_tick
            .unwrap_or(defaults.output_rows_per_tick),
        state_size: options.state_size_limit.or(defaults.state_size),
    }
}

/// Stores `def` as the flow's definition (alone in its commit).
fn store_definition(core: &Core, def: &FlowDef) -> Result<()> {
    let json = serde_json::to_vec(def).map_err(|e| {
        InternalSnafu {
            message: format!("cannot encode the definition of flow '{}': {e}", def.name),
        }
        .build()
    })?;
    core.store.commit_meta(vec![crate::storage::MetaWrite::Put(
        format!("{DEF_PREFIX}{}", def.name),
        json,
    )])?;
    Ok(())
}

/// What an ALTER TABLE changed that flows may depend on.
#[derive(Debug, Clone, Default)]
pub(crate) struct TableChange {
    pub database: String,
    /// The table's name before the ALTER.
    pub table: String,
    pub renamed_to: Option<String>,
    /// Columns dropped, renamed or retyped, with what happened to them
    /// (`was dropped`, ...), by their names before the ALTER.
    pub columns: Vec<(String, String)>,
}

/// The `CREATE OR REPLACE FLOW` that defines `def` again.
pub(super) fn recreate_statement(def: &FlowDef) -> CreateFlow {
    CreateFlow {
        name: def.name.clone(),
        or_replace: true,
        if_not_exists: false,
        sink: TableName {
            database: def.sink_database.clone(),
            table: def.sink_table.clone(),
            qualified: true,
        },
        expire_after: def.expire_after_ms.map(format_interval),
        eval_interval: def.eval_interval_ms.map(format_interval),
        comment: def.comment.clone(),
        options: def.options.clone(),
        query: def.query.clone(),
        database: def.database.clone(),
        component: def
            .component
            .as_ref()
            .map(|c| crate::sql::parser::ComponentRef {
                name: TableName {
                    database: c.database.clone(),
                    table: c.name.clone(),
                    qualified: true,
                },
                version: Some(c.version),
            }),
    }
}

/// Whether `query` may read `column`: it names it (as a word, in any case,
/// or quoted exactly) or selects `*`. Errs on the side of yes.
fn query_mentions(query: &str, column: &str) -> bool {
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
    let Ok(tokens) = Tokenizer::new(&GenericDialect {}, query).tokenize() else {
        return true;
    };
    tokens.iter().any(|t| match t {
        Token::Mul => true,
        Token::Word(w) if w.quote_style.is_some() => w.value == column,
        Token::Word(w) => w.value.to_lowercase() == column,
        _ => false,
    })
}

/// Compiles a flow's query with its unqualified names in `database`.
async fn compile_flow(
    core: &Core,
    ctx: &SessionContext,
    database: &str,
    name: &str,
    query: &str,
    expires: bool,
) -> Result<CompiledFlow> {
    let ctx = crate::sql::context_in(ctx, database);
    let fail = |e: super::compile::CompileError| {
        let message = format!("cannot create flow '{name}': {e}");
        if message.contains(super::compile::TOO_COMPLEX) {
            TooComplexSnafu { message }.build()
        } else if message.contains("not found") {
            NotFoundSnafu { message }.build()
        } else if message.contains("not supported") {
            UnsupportedSnafu { message }.build()
        } else {
            SqlSnafu { message }.build()
        }
    };
    let compiled = compile(&ctx, query).await.map_err(fail)?;
    if compiled.aggregates || expires || rows_are_keyed(core, &compiled, database) {
        return Ok(compiled);
    }
    // Rows of a query that does not carry its source's key may repeat:
    // counted, a row leaves the sink only when its last copy goes.
    let columns: Vec<String> = compiled
        .output
        .iter()
        .map(|f| format!("\"{}\"", f.name.replace('"', "\"\"")))
        .collect();
    let counted = format!(
        "SELECT *, count(*) AS \"{HIDDEN_COUNT}\" FROM ({query}) AS \"__sandflow_rows\" \
         GROUP BY {}",
        columns.join(", ")
    );
    match compile(&ctx, &counted).await {
        Ok(c) => Ok(CompiledFlow { counted: true, ..c }),
        // Some outputs cannot be grouped (none that flows make today): the
        // query as it is.
        Err(_) => Ok(compiled),
    }
}

/// The hidden last output column of a non-aggregate flow whose rows may
/// repeat: how many copies of the row the query has. It is not written.
pub(crate) const HIDDEN_COUNT: &str = "__sandflow_n";

/// How many of a guest's output columns go to the sink (all but
/// [`HIDDEN_COUNT`]).
fn visible(output: &[crate::runtime::Field]) -> usize {
    match output.last() {
        Some(f) if f.name == HIDDEN_COUNT => output.len() - 1,
        _ => output.len(),
    }
}

/// Whether a non-aggregate query's rows cannot repeat: it reads one table
/// and outputs every column of that table's key (primary key and time
/// index) under its own name.
fn rows_are_keyed(core: &Core, compiled: &CompiledFlow, database: &str) -> bool {
    let sources = source_names(compiled, database);
    let [(d, t)] = sources.as_slice() else {
        return false;
    };
    let Ok(Some(table)) = core.catalog.table(d, t) else {
        return false;
    };
    let names: Vec<&str> = compiled.output.iter().map(|f| f.name.as_str()).collect();
    table.key_columns.iter().all(|&i| {
        table
            .schema()
            .columns
            .get(i)
            .is_some_and(|c| names.contains(&c.name.as_str()))
    })
}

fn source_names(compiled: &CompiledFlow, database: &str) -> Vec<(String, String)> {
    compiled
        .sources
        .iter()
        .map(|s| match &s.table {
            TableReference::Bare { table } => (database.to_string(), table.to_string()),
            TableReference::Partial { schema, table } => (schema.to_string(), table.to_string()),
            TableReference::Full { schema, table, .. } => (schema.to_string(), table.to_string()),
        })
        .collect()
}

/// Depth-first search from `table` along flows (source -> sink); returns the
/// flow names on a path that reaches one of `targets`.
fn reach(
    flows: &[FlowDef],
    table: &(String, String),
    targets: &[(String, String)],
    seen: &mut HashSet<(String, String)>,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    if targets.contains(table) {
        return Some(path.clone());
    }
    if !seen.insert(table.clone()) {
        return None;
    }
    for f in flows.iter().filter(|f| f.sources.contains(table)) {
        path.push(f.name.clone());
        let sink = (f.sink_database.clone(), f.sink_table.clone());
        if let Some(p) = reach(flows, &sink, targets, seen, path) {
            return Some(p);
        }
        path.pop();
    }
    None
}

/// Who may run what of flows: owners, privileges and quotas.
impl FlowManager {
    /// Whether `who` may see, drop, flush, pause or resume flow `name`: its
    /// owner, a superuser, or a user with CREATE on its sink's database. A
    /// flow that does not exist passes (the statement reports it).
    pub(crate) fn check_flow_access(&self, core: &Core, who: &Principal, name: &str) -> Result<()> {
        if *who == Principal::Root || core.access.is_superuser(who) {
            return Ok(());
        }
        let Some(h) = self.find(name) else {
            return Ok(());
        };
        if h.def.owner.as_deref() == Some(who.name()) {
            return Ok(());
        }
        core.access
            .check(who, Privilege::Create, &h.def.sink_database, None)
            .map_err(|_| {
                PermissionDeniedSnafu {
                    message: format!(
                        "permission denied for flow {}: user {} neither owns it nor has CREATE on \
                         database {}",
                        h.def.name,
                        who.name(),
                        h.def.sink_database
                    ),
                }
                .build()
            })
    }

    /// Whether `owner` still has what flow `def` needs: SELECT on every
    /// source, INSERT on the sink.
    fn owner_may_run(&self, core: &Core, owner: &str, def: &FlowDef) -> Result<()> {
        let who = Principal::User(owner.to_string());
        for (d, t) in &def.sources {
            core.access.check(&who, Privilege::Select, d, Some(t))?;
        }
        core.access.check(
            &who,
            Privilege::Insert,
            &def.sink_database,
            Some(&def.sink_table),
        )
    }

    /// CREATE FLOW's checks of `who`: CREATE on the sink's database, INSERT
    /// on an existing sink, SELECT on every source, and the sink database's
    /// quotas (`replacing`: the definition it replaces, not counted).
    fn authorize_def(
        &self,
        core: &Core,
        who: &Principal,
        def: &FlowDef,
        replacing: Option<&FlowDef>,
        options: &FlowOptions,
    ) -> Result<()> {
        let db = &def.sink_database;
        if *who != Principal::Root && !core.access.is_superuser(who) {
            core.access.check(who, Privilege::Create, db, None)?;
            if core.catalog.table(db, &def.sink_table)?.is_some() {
                core.access
                    .check(who, Privilege::Insert, db, Some(&def.sink_table))?;
            }
            for (d, t) in &def.sources {
                core.access.check(who, Privilege::Select, d, Some(t))?;
            }
        }
        let quotas = core.access.quotas(db);
        if quotas == crate::auth::Quotas::default() {
            return Ok(());
        }
        let others: Vec<FlowDef> = self
            .flows
            .read()
            .map(|f| {
                f.values()
                    .map(|h| h.def.clone())
                    .filter(|d| &d.sink_database == db)
                    .filter(|d| replacing.is_none_or(|r| r.name != d.name))
                    .collect()
            })
            .unwrap_or_default();
        core.access.check_quota(
            db,
            "max_flows",
            quotas.max_flows,
            others.len() as u64,
            1,
            "",
        )?;
        let memory_of = |d: &FlowDef| {
            parse_options(&d.options, d.component.is_some())
                .map(|o| limits(&self.settings.default_limits, &o).memory as u64)
                .unwrap_or(self.settings.default_limits.memory as u64)
        };
        let this = limits(&self.settings.default_limits, options);
        core.access.check_quota(
            db,
            "flow_memory_limit",
            quotas.flow_memory_limit,
            others.iter().map(memory_of).sum(),
            this.memory as u64,
            " bytes",
        )?;
        // A flow without its own CPU budget runs with the quota's.
        if let (Some(max), Some(own)) =
            (quotas.max_cpu_limit_per_tick_ms, options.cpu_limit_per_tick)
        {
            let ms = own.as_millis() as u64;
            if ms > max {
                return crate::error::LimitExceededSnafu {
                    message: format!(
                        "quota max_cpu_limit_per_tick of database {db} exceeded: this flow's \
                         cpu_limit_per_tick is {ms}ms, the quota is {max}ms; give the flow \
                         WITH (cpu_limit_per_tick = '{max}ms') or less"
                    ),
                }
                .fail();
            }
        }
        if core.catalog.table(db, &def.sink_table)?.is_none() {
            crate::sql::access::check_table_quota(core, db, 1)?;
        }
        crate::sql::access::check_storage_quota(core, db)?;
        Ok(())
    }

    /// After a REVOKE, ALTER USER or DROP USER: every running flow whose
    /// owner lost a privilege it needs fails, saying which.
    pub(crate) async fn recheck_owners(&self, core: &Arc<Core>) {
        let _ddl = self.ddl.lock().await;
        self.recheck_owners_locked(core);
    }

    fn recheck_owners_locked(&self, core: &Arc<Core>) {
        let handles: Vec<Arc<FlowHandle>> = self
            .flows
            .read()
            .map(|f| f.values().cloned().collect())
            .unwrap_or_default();
        for h in handles {
            let Some(owner) = h.def.owner.clone() else {
                continue;
            };
            let failed = h.status.lock().map(|s| s.error.is_some()).unwrap_or(false);
            if failed || h.def.paused {
                continue;
            }
            if let Err(e) = self.owner_may_run(core, &owner, &h.def) {
                let reason = format!(
                    "the flow's owner {owner} lost a privilege it needs: {e}. Once it is granted \
                     again, ADMIN RESUME_FLOW('{}') continues from where the flow stopped",
                    h.def.name
                );
                warn!(flow = %h.def.name, "{reason}");
                self.stop_as(core, &h, h.def.clone(), Some(reason), true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::database::{Database, Output};
    use crate::storage::Store;

    async fn rows(db: &Database, sql: &str) -> Vec<String> {
        let out = db.execute(sql).await.unwrap();
        let Some(Output::Rows { batches, .. }) = out.into_iter().last() else {
            panic!("{sql}: no rows")
        };
        let mut all = Vec::new();
        for b in batches {
            for r in 0..b.num_rows() {
                let cells: Vec<String> = b
                    .columns()
                    .iter()
                    .map(|c| datafusion::arrow::util::display::array_value_to_string(c, r).unwrap())
                    .collect();
                all.push(cells.join("|"));
            }
        }
        all
    }

    const SETUP: &str =
        "CREATE TABLE t (h STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (h)); \
         CREATE FLOW f SINK TO f_sink AS SELECT h, count(*) AS n, sum(v) AS s FROM t GROUP BY h; \
         CREATE FLOW g SINK TO g_sink AS SELECT count(*) AS n FROM t";

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn restarts_restore_snapshots_and_corrupt_state_fails_only_its_flow() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::open(dir.path()).await.unwrap();
            db.execute(SETUP).await.unwrap();
            db.execute(
                "INSERT INTO t VALUES ('a', 1, 0), ('b', 2, 0), ('a', 3, 1000); \
                 DELETE FROM t WHERE h = 'b'",
            )
            .await
            .unwrap();
            db.flush_flow("f").await.unwrap();
            db.flush_flow("g").await.unwrap();
            // Dropped: a clean shutdown snapshots every flow.
        }
        {
            let store = Store::open(dir.path()).unwrap();
            for name in ["f", "g"] {
                let state = store.get_meta(&snapshot_key(name)).unwrap().unwrap();
                let pos = store.get_meta(&written_key(name)).unwrap().unwrap();
                let (snapped, _) = crate::flow::ports::decode_snapshot(&state).unwrap();
                let (written, _) = sandflow_flows::decode_positions(&pos).unwrap();
                assert_eq!(snapped, written, "{name}: snapshot at the last write");
            }
            // Corrupt g's snapshot (keep its positions).
            let mut state = store.get_meta(&snapshot_key("g")).unwrap().unwrap();
            let n = state.len();
            assert!(n / 2 > 16);
            state[n / 2 + 4] ^= 0x5a;
            store
                .commit_meta(vec![MetaWrite::Put(snapshot_key("g"), state)])
                .unwrap();
        }
        let db = Database::open(dir.path()).await.unwrap();
        let info = db.flows();
        let g = info.iter().find(|i| i.def.name == "g").unwrap();
        let err = g.status.error.clone().unwrap_or_default();
        assert!(err.contains("cannot restore"), "{err}");
        let f = info.iter().find(|i| i.def.name == "f").unwrap();
        assert!(f.status.error.is_none(), "{:?}", f.status.error);
        // f was restored, not rebuilt: its state continues exactly.
        db.execute("INSERT INTO t VALUES ('a', 10, 2000), ('c', 5, 0)")
            .await
            .unwrap();
        db.flush_flow("f").await.unwrap();
        assert_eq!(
            rows(&db, "SELECT h, n, s FROM f_sink ORDER BY h").await,
            ["a|3|14", "c|1|5"]
        );
        let e = db.flush_flow("g").await.unwrap_err().to_string();
        assert!(e.contains("cannot restore"), "{e}");
        // Replacing the broken flow starts it afresh from a back-fill.
        db.execute("CREATE OR REPLACE FLOW g SINK TO g_sink AS SELECT count(*) AS n FROM t")
            .await
            .unwrap();
        db.flush_flow("g").await.unwrap();
        assert_eq!(rows(&db, "SELECT n FROM g_sink").await, ["4"]);
    }
}
