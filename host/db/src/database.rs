//! The library API of the database: `Database::open(dir)`, `execute(sql)`,
//! typed batch inserts, the change feed, and the lookups the flow layer uses.
//!
//! ```no_run
//! # async fn demo() -> sandflow::Result<()> {
//! let db = sandflow::Database::open("./data").await?;
//! db.execute("CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))").await?;
//! let mut feed = db.subscribe("t")?;
//! db.execute("INSERT INTO t VALUES ('a', 1.0, '2024-01-01 00:00:00')").await?;
//! let change = feed.recv().await.unwrap(); // diffs: [+1]
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use datafusion::arrow::array::{ArrayRef, RecordBatchOptions};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::DFSchema;
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{cast, Expr};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;
use datafusion::prelude::{SessionConfig, SessionContext};

use crate::auth::{Access, Principal};
use crate::catalog::{
    Catalog, ColumnSchema, Table, TableId, TableSchema, DEFAULT_CATALOG, DEFAULT_DATABASE,
};
use crate::error::{InvalidDataSnafu, Result, SqlSnafu};
use crate::flow::{FlowInfo, FlowManager, FlowSettings};
use crate::metrics::Registry;
use crate::session::{Dialect, Session, SessionDefaults};
use crate::sql::executor::Executor;
use crate::sql::provider::{blocking, SandCatalog};
use crate::storage::{ChangeFeed, CommitInfo, Snapshot, Store, WriteSet};
use sandflow_flows::{Clock, SystemClock, VirtualClock};

/// The result of one statement.
#[derive(Debug, Clone)]
pub enum Output {
    /// A result set (SELECT, SHOW, DESC, ...).
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    /// A command with a tag and a count of affected rows
    /// (tag is e.g. "INSERT", "DELETE", "CREATE TABLE", "DROP TABLE").
    Affected { tag: String, rows: u64 },
}

/// Storage, catalog and column defaults, shared by the database handle and
/// the DataFusion providers.
pub(crate) struct Core {
    pub(crate) store: Arc<Store>,
    pub(crate) catalog: Catalog,
    /// Users, grants, owners and quotas.
    pub(crate) access: Access,
    /// The last measurement of each database's stored bytes (for
    /// `max_storage`), and when it was taken.
    pub(crate) storage_used: std::sync::Mutex<HashMap<String, (std::time::Instant, u64)>>,
    pub(crate) flows: FlowManager,
    /// Runs statements on threads with deep stacks (see [`Executor`]).
    pub(crate) executor: Executor,
    /// The database's time: every read of the time goes through it.
    pub(crate) clock: Arc<dyn Clock>,
    /// This database's metrics (`GET /metrics`); nothing is shared with
    /// another database in the process.
    pub(crate) metrics: Arc<Registry>,
    /// Parses default expressions (a private context: no tables needed).
    expr_ctx: SessionContext,
    defaults: RwLock<HashMap<TableId, Arc<HashMap<String, Expr>>>>,
    /// The cluster's nodes, when the database is part of one (see
    /// [`crate::nodes`]).
    pub(crate) nodes: RwLock<Option<Arc<dyn crate::nodes::NodeSource>>>,
    /// The change export, when `FlowSettings::export_changes` is on.
    pub(crate) export: Option<crate::export::Exporter>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Core")
    }
}

impl Core {
    pub(crate) fn metrics(&self) -> &Registry {
        &self.metrics
    }

    /// The cluster's node source, if the server installed one.
    pub(crate) fn node_source(&self) -> Option<Arc<dyn crate::nodes::NodeSource>> {
        self.nodes.read().ok().and_then(|n| n.clone())
    }

    /// The id of the node this database runs on (`local` alone).
    pub(crate) fn node_id(&self) -> String {
        self.node_source()
            .map(|s| s.local_id())
            .unwrap_or_else(|| crate::nodes::STANDALONE_ID.to_string())
    }

    /// The DataFusion expression of a column's default, cast to its type.
    pub(crate) fn default_expr(&self, column: &ColumnSchema) -> Result<Option<Expr>> {
        let Some(sql) = &column.default else {
            return Ok(None);
        };
        let expr = self
            .expr_ctx
            .parse_sql_expr(sql, &DFSchema::empty())
            .map_err(|e| {
                SqlSnafu {
                    message: format!("invalid DEFAULT {sql} for column '{}': {e}", column.name),
                }
                .build()
            })?;
        Ok(Some(cast(expr, column.data_type.to_arrow())))
    }

    /// Evaluates a default for `rows` rows (`now()` is the current time).
    pub(crate) fn eval_default(
        &self,
        column: &ColumnSchema,
        rows: usize,
    ) -> Result<Option<ArrayRef>> {
        let Some(expr) = self.default_expr(column)? else {
            return Ok(None);
        };
        let fail = |e: datafusion::error::DataFusionError| {
            InvalidDataSnafu {
                message: format!(
                    "DEFAULT {} does not give a {} for column '{}': {e}",
                    column.default.as_deref().unwrap_or_default(),
                    column.data_type.sql_name(),
                    column.name
                ),
            }
            .build()
        };
        let schema = DFSchema::empty();
        let simplifier = ExprSimplifier::new(
            SimplifyContext::builder()
                .with_schema(Arc::new(schema.clone()))
                .with_query_execution_start_time(chrono::DateTime::from_timestamp_millis(
                    self.clock.now_ms(),
                ))
                .build(),
        );
        let expr = simplifier.simplify(expr).map_err(fail)?;
        let phys = self
            .expr_ctx
            .create_physical_expr(expr, &schema)
            .map_err(fail)?;
        let batch = RecordBatch::try_new_with_options(
            Arc::new(Schema::empty()),
            vec![],
            &RecordBatchOptions::new().with_row_count(Some(rows)),
        )
        .map_err(|e| fail(e.into()))?;
        let array = phys
            .evaluate(&batch)
            .and_then(|v| v.into_array(rows))
            .map_err(fail)?;
        Ok(Some(array))
    }

    /// Column defaults of a table for DataFusion's INSERT planning (cached).
    /// A `now()` in a default is the time on the database's clock when the
    /// statement is planned.
    pub(crate) fn defaults(&self, table: &Table) -> Arc<HashMap<String, Expr>> {
        self.at_clock_now(self.cached_defaults(table))
    }

    /// `map` with every `now()` replaced by the clock's time.
    fn at_clock_now(&self, map: Arc<HashMap<String, Expr>>) -> Arc<HashMap<String, Expr>> {
        use datafusion::common::tree_node::{Transformed, TreeNode};
        let is_now = |e: &Expr| matches!(e, Expr::ScalarFunction(f) if f.name() == "now");
        let has_now = map
            .values()
            .any(|e| e.exists(|e| Ok(is_now(e))).unwrap_or(false));
        if !has_now {
            return map;
        }
        let now = Expr::Literal(
            datafusion::scalar::ScalarValue::TimestampNanosecond(
                Some(self.clock.now_ms().saturating_mul(1_000_000)),
                Some("+00:00".into()),
            ),
            None,
        );
        let replaced = map
            .iter()
            .map(|(k, e)| {
                let e = e
                    .clone()
                    .transform(|e| {
                        Ok(if is_now(&e) {
                            Transformed::yes(now.clone())
                        } else {
                            Transformed::no(e)
                        })
                    })
                    .map(|t| t.data)
                    .unwrap_or_else(|_| e.clone());
                (k.clone(), e)
            })
            .collect();
        Arc::new(replaced)
    }

    fn cached_defaults(&self, table: &Table) -> Arc<HashMap<String, Expr>> {
        if let Ok(cache) = self.defaults.read() {
            if let Some(d) = cache.get(&table.id()) {
                return d.clone();
            }
        }
        let mut map = HashMap::new();
        for c in &table.schema().columns {
            match self.default_expr(c) {
                Ok(Some(e)) => {
                    map.insert(c.name.clone(), e);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!("ignoring default of {}: {e}", c.name),
            }
        }
        let map = Arc::new(map);
        if let Ok(mut cache) = self.defaults.write() {
            cache.insert(table.id(), map.clone());
        }
        map
    }

    /// Adds DEFAULT columns missing from `batch`.
    pub(crate) fn fill_defaults(&self, table: &Table, batch: RecordBatch) -> Result<RecordBatch> {
        let input = batch.schema();
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        let mut columns = batch.columns().to_vec();
        for col in &table.schema().columns {
            if input.index_of(&col.name).is_ok() {
                continue;
            }
            if let Some(array) = self.eval_default(col, batch.num_rows())? {
                fields.push(Field::new(&col.name, array.data_type().clone(), true));
                columns.push(array);
            }
        }
        if columns.len() == batch.num_columns() {
            return Ok(batch);
        }
        RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(batch.num_rows())),
        )
        .map_err(|e| {
            InvalidDataSnafu {
                message: format!("cannot add default columns: {e}"),
            }
            .build()
        })
    }

    pub(crate) fn forget_defaults(&self, id: TableId) {
        if let Ok(mut cache) = self.defaults.write() {
            cache.remove(&id);
        }
    }

    /// Resolves `t` (default database) or `db.t` for the library API.
    pub(crate) fn resolve(&self, name: &str) -> Result<Arc<Table>> {
        let (database, table) = split_name(name);
        self.catalog.require_table(database, table)
    }
}

fn split_name(name: &str) -> (&str, &str) {
    match name.split_once('.') {
        Some((d, t)) => (d, t),
        None => (DEFAULT_DATABASE, name),
    }
}

/// How often the rows of a table with a `ttl` are expired: a tenth of the
/// ttl, between 1 s and 10 min. Expired rows stay readable until then.
fn expiry_period(ttl_ms: i64) -> std::time::Duration {
    std::time::Duration::from_millis((ttl_ms / 10).clamp(1_000, 600_000) as u64)
}

/// Expires the rows of tables with a `ttl` whose time has come (see
/// [`crate::storage::Store::expire`]) at `now_ms`; `last` remembers when each
/// table was last expired.
async fn expire_due(c: &Arc<Core>, now_ms: i64, last: &mut HashMap<TableId, i64>) {
    let tables: Vec<Arc<Table>> = c
        .catalog
        .database_names()
        .unwrap_or_default()
        .iter()
        .flat_map(|d| c.catalog.tables(d).unwrap_or_default())
        .collect();
    for t in tables {
        let Some(ttl) = t.ttl_ms() else { continue };
        let due = last
            .get(&t.id())
            .is_none_or(|at| now_ms - at >= expiry_period(ttl).as_millis() as i64);
        if !due {
            continue;
        }
        last.insert(t.id(), now_ms);
        let (store_of, table) = (c.clone(), t.clone());
        let expired =
            blocking(move || store_of.store.expire(&table, now_ms.saturating_sub(ttl))).await;
        match expired {
            Ok(info) if info.rows > 0 => {
                tracing::info!(table = %t.qualified_name(), rows = info.rows, "expired rows past the table's ttl")
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(table = %t.qualified_name(), "cannot expire rows: {e}")
            }
        }
    }
}

/// Expires rows of tables with a `ttl` every second of the real clock until
/// the database is gone.
fn spawn_expiry(core: std::sync::Weak<Core>) {
    tokio::spawn(async move {
        let mut last: HashMap<TableId, i64> = HashMap::new();
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let Some(c) = core.upgrade() else { return };
            let now = c.clock.now_ms();
            expire_due(&c, now, &mut last).await;
        }
    });
}

/// A DataFusion session whose catalog is the database's.
fn session(core: &Arc<Core>) -> SessionContext {
    let config = SessionConfig::new()
        .with_information_schema(true)
        .with_create_default_catalog_and_schema(false)
        .with_default_catalog_and_schema(DEFAULT_CATALOG, DEFAULT_DATABASE);
    let ctx = SessionContext::new_with_config(config);
    ctx.register_catalog(
        DEFAULT_CATALOG,
        Arc::new(SandCatalog { core: core.clone() }),
    );
    crate::sql::functions::register(&ctx);
    crate::sql::coerce::register(&ctx);
    ctx
}

/// Where a database keeps its data.
#[derive(Debug, Clone)]
pub enum StorageConfig {
    /// In a directory (created if missing), durably, with a page cache of
    /// `cache_bytes` (default [`crate::storage::redb::DEFAULT_CACHE_BYTES`]).
    Dir { path: PathBuf, cache_bytes: usize },
    /// In memory: nothing survives the process.
    InMemory,
    /// In this in-memory store (see [`crate::storage::redb::RedbStorage::in_memory`]):
    /// what a database committed there is still there when another opens
    /// it (a test's restart).
    Shared(crate::storage::redb::RedbStorage),
}

/// The time a database runs on.
#[derive(Debug, Clone, Default)]
pub enum ClockConfig {
    /// The system's wall clock; flows run on their own threads.
    #[default]
    System,
    /// A clock that moves only when told ([`Database::advance_time_to`]);
    /// flows run only when driven, so the same statements at the same
    /// virtual times always give the same results.
    Virtual(Arc<VirtualClock>),
}

/// Everything a database is opened with (see [`Database::open_config`]).
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub storage: StorageConfig,
    pub flows: FlowSettings,
    pub clock: ClockConfig,
}

impl DatabaseConfig {
    /// Data in `dir`, default flow settings, the system clock.
    pub fn dir(dir: impl AsRef<Path>) -> DatabaseConfig {
        DatabaseConfig {
            storage: StorageConfig::Dir {
                path: dir.as_ref().to_path_buf(),
                cache_bytes: crate::storage::redb::DEFAULT_CACHE_BYTES,
            },
            flows: FlowSettings::default(),
            clock: ClockConfig::System,
        }
    }

    /// Data in memory, default flow settings, the system clock.
    pub fn in_memory() -> DatabaseConfig {
        DatabaseConfig {
            storage: StorageConfig::InMemory,
            flows: FlowSettings::default(),
            clock: ClockConfig::System,
        }
    }

    pub fn with_flows(mut self, flows: FlowSettings) -> DatabaseConfig {
        self.flows = flows;
        self
    }

    /// Runs on `clock` (see [`ClockConfig::Virtual`]).
    pub fn with_virtual_clock(mut self, clock: Arc<VirtualClock>) -> DatabaseConfig {
        self.clock = ClockConfig::Virtual(clock);
        self
    }
}

/// A sandflow database: open it on a data dir, then run SQL or use the typed API.
pub struct Database {
    core: Arc<Core>,
    ctx: SessionContext,
    /// When each table with a ttl was last expired (a virtual clock).
    expired: tokio::sync::Mutex<HashMap<TableId, i64>>,
}

impl Drop for Database {
    fn drop(&mut self) {
        // Flow threads hold the core; stop them so that it closes.
        self.core.flows.shutdown();
    }
}

impl Database {
    /// Opens (or creates) the database in `dir` with default settings.
    pub async fn open(dir: impl AsRef<Path>) -> Result<Arc<Database>> {
        Self::open_with(dir, FlowSettings::default()).await
    }

    /// Opens (or creates) the database in `dir`; its flows tick and run with
    /// `flows`. Flows defined earlier start again from their snapshots.
    pub async fn open_with(dir: impl AsRef<Path>, flows: FlowSettings) -> Result<Arc<Database>> {
        Self::open_config(DatabaseConfig::dir(dir).with_flows(flows)).await
    }

    /// Opens the database `config` describes: where its data lives, how its
    /// flows run, and its clock.
    pub async fn open_config(config: DatabaseConfig) -> Result<Arc<Database>> {
        let DatabaseConfig {
            storage,
            flows,
            clock: time,
        } = config;
        let mut flows = flows;
        flows.tick_interval = flows
            .tick_interval
            .max(std::time::Duration::from_millis(10));
        let (dir, cache_bytes, shared) = match &storage {
            StorageConfig::Dir { path, cache_bytes } => (Some(path.clone()), *cache_bytes, None),
            StorageConfig::InMemory => (None, 0, None),
            StorageConfig::Shared(kv) => (None, 0, Some(kv.clone())),
        };
        if flows.cache_dir.is_none() {
            flows.cache_dir = dir.as_ref().map(|d| d.join("wasm-cache"));
        }
        let (store, catalog, access) = blocking(move || {
            let store = Arc::new(match (&dir, shared) {
                (Some(dir), _) => Store::open_with_cache(dir, cache_bytes)?,
                (None, Some(kv)) => Store::with_engine(Box::new(kv))?,
                (None, None) => Store::in_memory()?,
            });
            let catalog = Catalog::load(&store)?;
            let access = Access::load(&store)?;
            Ok((store, catalog, access))
        })
        .await?;
        let executor = Executor::with_default_threads()?;
        let export = flows
            .export_changes
            .then(|| crate::export::Exporter::new(store.clone()));
        let (clock, manual): (Arc<dyn Clock>, _) = match time {
            ClockConfig::System => (Arc::new(SystemClock), None),
            ClockConfig::Virtual(v) => (v.clone(), Some(v)),
        };
        let core = Arc::new(Core {
            store,
            catalog,
            access,
            storage_used: Default::default(),
            flows: FlowManager::new(flows, clock.clone(), manual.clone())?,
            executor,
            metrics: Arc::new(Registry::for_database(clock.clone())),
            clock,
            expr_ctx: SessionContext::new(),
            defaults: RwLock::new(HashMap::new()),
            nodes: RwLock::new(None),
            export,
        });
        let ctx = session(&core);
        core.flows.start_all(&core, &ctx).await?;
        core.flows.start_supervisor(&core, session);
        if manual.is_none() {
            spawn_expiry(Arc::downgrade(&core));
        }
        Ok(Arc::new(Database {
            core,
            ctx,
            expired: tokio::sync::Mutex::new(HashMap::new()),
        }))
    }

    /// Makes `information_schema.nodes` and `SHOW NODES` list the nodes
    /// `source` tells (a cluster's), instead of this database alone.
    pub fn set_node_source(&self, source: Arc<dyn crate::nodes::NodeSource>) {
        if let Ok(mut n) = self.core.nodes.write() {
            *n = Some(source);
        }
    }

    /// The change export (`FlowSettings::export_changes`), or an error
    /// saying it is off.
    fn exporter(&self) -> Result<&crate::export::Exporter> {
        self.core.export.as_ref().ok_or_else(|| {
            crate::error::SqlSnafu {
                message:
                    "the change export is off: open the database with FlowSettings::export_changes",
            }
            .build()
        })
    }

    /// The next part of each exported table's changes after what was handed
    /// out (at most one per table), in commit order per table.
    pub async fn export_next(&self) -> Result<Vec<crate::export::ExportPart>> {
        self.exporter()?;
        let core = self.core.clone();
        blocking(move || match &core.export {
            Some(e) => e.next(),
            None => Ok(Vec::new()),
        })
        .await
    }

    /// `table`'s exported parts up to `end` are stored elsewhere: its log
    /// may be trimmed to there.
    pub async fn export_ack(
        &self,
        table: crate::schema::TableId,
        end: sandflow_flows::Position,
    ) -> Result<()> {
        self.exporter()?;
        let core = self.core.clone();
        blocking(move || match &core.export {
            Some(e) => e.ack(table, end),
            None => Ok(()),
        })
        .await
    }

    /// Hands out `table`'s parts after `after` next: where its publisher's
    /// stream stands.
    pub fn export_seek(
        &self,
        table: crate::schema::TableId,
        after: sandflow_flows::Position,
    ) -> Result<()> {
        self.exporter()?.seek(table, after)
    }

    /// The exported tables: id and `database.table`.
    pub fn exported_tables(&self) -> Vec<(crate::schema::TableId, String)> {
        self.core
            .export
            .as_ref()
            .map(|e| e.tables())
            .unwrap_or_default()
    }

    /// Wakes when a commit changes an exported table or a table starts
    /// being exported.
    pub fn export_notify(&self) -> Option<Arc<tokio::sync::Notify>> {
        self.core.export.as_ref().map(|e| e.notify())
    }

    /// Places flow `name` on another node, `node`, under `fence` (unique per
    /// placement, below 2^63, e.g. an etcd revision): its local run stops,
    /// and from now on only commits under this fence reach its sink. Returns
    /// what that node needs to run it. See [`crate::flow::remote`].
    pub async fn place_flow_remote(
        &self,
        name: &str,
        node: &str,
        fence: u64,
    ) -> Result<crate::flow::remote::RemotePlan> {
        self.core
            .flows
            .place_remote(&self.core, &self.ctx, name, node, fence)
            .await
    }

    /// One tick of a flow that runs on another node: its output, positions
    /// and snapshot in one transaction, refused unless `fence` is the flow's
    /// current placement. Returns the sink rows written.
    pub async fn remote_commit(
        &self,
        name: &str,
        fence: u64,
        commit: crate::flow::remote::RemoteCommit,
    ) -> Result<u64> {
        let core = self.core.clone();
        let name = name.to_string();
        blocking(move || core.flows.remote_commit(&name, fence, commit)).await
    }

    /// The rows of `database.table` now and the commit they are at: the
    /// back-fill of a flow that runs on another node (it then reads the
    /// table's changes after that commit).
    pub async fn remote_backfill(
        &self,
        database: &str,
        table: &str,
    ) -> Result<(u64, Vec<RecordBatch>)> {
        let core = self.core.clone();
        let (database, table) = (database.to_string(), table.to_string());
        blocking(move || crate::flow::remote::backfill(&core, &database, &table)).await
    }

    /// Runs `plan`, a flow of another node's database, here: its change log
    /// made by `make_log` (given the run's wake-up), its commits through
    /// `sink`. The run stops when the returned handle is dropped.
    pub async fn host_flow(
        &self,
        name: &str,
        plan: &crate::flow::remote::RemotePlan,
        make_log: crate::flow::remote::MakeLog,
        sink: Box<dyn sandflow_flows::SinkCommitter>,
    ) -> Result<crate::flow::remote::HostedRun> {
        self.core.flows.host(name, plan, make_log, sink).await
    }

    /// Where flow `name` is placed, if on another node: the node and the
    /// placement's fence.
    pub fn flow_placement(&self, name: &str) -> Option<(String, u64)> {
        self.core.flows.placement(name)
    }

    /// The run of flow `name` on another node under `fence` failed for good:
    /// the flow is kept failed with `message` (ADMIN RESUME_FLOW restarts
    /// it).
    pub fn remote_failed(&self, name: &str, fence: u64, message: &str) -> Result<()> {
        self.core
            .flows
            .remote_failed(&self.core, name, fence, message)
    }

    /// The remote plan of flow `name` under `fence` again (its snapshot
    /// read now), if it is placed under that fence.
    pub fn remote_plan(&self, name: &str, fence: u64) -> Result<crate::flow::remote::RemotePlan> {
        self.core.flows.remote_plan(&self.core, name, fence)
    }

    /// Closes the database as a crash would: flows stop where they are,
    /// without writing back what they have not written yet; only what was
    /// committed remains (for tests of recovery).
    pub fn crash(self: Arc<Self>) {
        self.core.flows.halt_all();
        drop(self);
    }

    /// This database's metrics registry (what `GET /metrics` renders).
    pub fn metrics(&self) -> &Arc<Registry> {
        &self.core.metrics
    }

    /// The time on the database's clock (ms since the Unix epoch).
    pub fn now_ms(&self) -> i64 {
        self.core.clock.now_ms()
    }

    /// With a virtual clock: moves time forward to `to_ms`. Flows tick at
    /// every time they asked for on the way, as they would have in real
    /// time; then rows past a table's `ttl` at `to_ms` expire. Refused on
    /// the real clock, or backwards.
    pub async fn advance_time_to(&self, to_ms: i64) -> Result<()> {
        let core = self.core.clone();
        blocking(move || core.flows.advance_to(to_ms)).await?;
        // Automatic restarts that came due on the way run now.
        self.core.flows.restart_due(&self.core, &self.ctx).await;
        let mut last = self.expired.lock().await;
        // On a virtual clock, rows expire exactly when their time comes.
        last.clear();
        expire_due(&self.core, to_ms, &mut last).await;
        Ok(())
    }

    /// With a virtual clock: runs every flow that has something to do now
    /// (input committed since), without moving time. With the real clock the
    /// flows do this on their own.
    pub async fn run_flows(&self) -> Result<()> {
        let core = self.core.clone();
        blocking(move || {
            core.flows.run_pending();
            Ok(())
        })
        .await
    }

    /// Processes everything written to the flow's sources so far, writes it
    /// to its sink, and returns the number of sink rows written
    /// (`ADMIN FLUSH_FLOW('name')`).
    pub async fn flush_flow(&self, name: &str) -> Result<u64> {
        self.core.flows.flush(name).await
    }

    /// Starts recording flow `name` (or starts its recording anew): it
    /// begins at a snapshot taken now; returns its positions. See
    /// [`crate::flow::recording`].
    pub async fn start_recording(&self, name: &str) -> Result<Vec<sandflow_flows::Position>> {
        self.core.flows.start_recording(name).await
    }

    /// Stops recording flow `name`; `false` if it was not being recorded.
    pub async fn stop_recording(&self, name: &str) -> Result<bool> {
        self.core.flows.stop_recording(&self.core, name).await
    }

    /// Flow `name`'s recording, from its start up to everything committed
    /// so far; the recording goes on.
    pub async fn recording(&self, name: &str) -> Result<crate::flow::recording::Recording> {
        self.core.flows.recording(&self.core, name).await
    }

    /// Every flow with its definition and run-time status.
    pub fn flows(&self) -> Vec<FlowInfo> {
        self.core.flows.infos()
    }

    /// Runs one or more `;`-separated statements in a new session, returning
    /// one output each. Several statements are one transaction: if one fails,
    /// nothing the others wrote is kept (DDL excepted: it is not
    /// transactional).
    pub async fn execute(&self, sql: &str) -> Result<Vec<Output>> {
        self.session().execute(sql).await
    }

    /// A new session (generic SQL dialect, default settings): its own
    /// settings and transactions over this database; see [`Session`].
    pub fn session(&self) -> Session {
        Session::new(
            self.core.clone(),
            &self.ctx,
            Dialect::Generic,
            &SessionDefaults::default(),
            Principal::Root,
        )
    }

    /// A new session over `base`'s catalog (a context derived from
    /// [`Database::session_context`], e.g. with pg_catalog added), reading
    /// `dialect`, with server-wide `defaults`, acting as `principal` (whose
    /// privileges every statement is checked against).
    pub fn session_with(
        &self,
        base: &SessionContext,
        dialect: Dialect,
        defaults: &SessionDefaults,
        principal: Principal,
    ) -> Session {
        Session::new(self.core.clone(), base, dialect, defaults, principal)
    }

    /// Whether `who` may see and manage flow `name` (its owner, a superuser,
    /// CREATE on its sink's database).
    pub fn check_flow_access(&self, who: &Principal, name: &str) -> Result<()> {
        self.core.flows.check_flow_access(&self.core, who, name)
    }

    /// `PUT /v1/components/{name}?db=database`: uploads `bytes` as a new
    /// version of component `name` (created if new), as `CREATE OR REPLACE
    /// COMPONENT` does, acting as `who` (CREATE on the database). Checked
    /// and compiled before anything is stored; see [`crate::flow::components`].
    pub async fn put_component(
        &self,
        who: &Principal,
        database: &str,
        name: &str,
        bytes: Vec<u8>,
    ) -> Result<crate::flow::components::Uploaded> {
        let (core, who) = (self.core.clone(), who.clone());
        let (database, name) = (database.to_string(), name.to_string());
        self.core
            .executor
            .run(async move {
                core.flows
                    .put_component(&core, &who, &database, &name, Arc::new(bytes), true)
                    .await
            })
            .await
    }

    /// The flows `who` may see.
    pub fn flows_visible_to(&self, who: &Principal) -> Vec<String> {
        self.core
            .flows
            .names()
            .into_iter()
            .filter(|n| self.check_flow_access(who, n).is_ok())
            .collect()
    }

    /// Users, grants, owners and quotas (for the front doors' logins).
    pub fn access(&self) -> &Access {
        &self.core.access
    }

    /// On a database without users, creates the superuser
    /// [`crate::auth::SUPERUSER`] with `password`; returns whether it did.
    pub async fn bootstrap_superuser(&self, password: &str) -> Result<bool> {
        let (core, password) = (self.core.clone(), password.to_string());
        blocking(move || core.access.bootstrap(&core.store, &password)).await
    }

    /// Whether every statement of `sql` only reads (queries, `SHOW`, `DESC`;
    /// see [`crate::sql::parser::Stmt::is_read_only`]); an error if it does
    /// not parse. Parsed on the executor's deep stacks, like `execute`.
    pub async fn is_read_only(&self, sql: &str) -> Result<bool> {
        let sql = sql.to_string();
        self.core
            .executor
            .run(async move {
                Ok(crate::sql::parser::parse(&sql)?
                    .iter()
                    .all(crate::sql::parser::Stmt::is_read_only))
            })
            .await
    }

    /// The shared core, for the crate's own front doors (line protocol).
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// How many statements are running now (a statement whose client went
    /// away or was cancelled no longer counts).
    pub fn running_statements(&self) -> usize {
        self.core.executor.running()
    }

    /// A DataFusion context whose catalog sees sandflow's tables, for the
    /// PostgreSQL extended-query path (parameter binding of SELECTs and DML).
    pub fn session_context(&self) -> SessionContext {
        self.ctx.clone()
    }

    /// The names of the databases.
    pub fn database_names(&self) -> Result<Vec<String>> {
        self.core.catalog.database_names()
    }

    /// Whether a database of that name exists.
    pub fn database_exists(&self, name: &str) -> bool {
        self.core.catalog.database_exists(name).unwrap_or(false)
    }

    /// A table by name: `t` (database `public`) or `db.t`. Its
    /// [`Table::schema`] gives columns, time index and primary key.
    pub fn table(&self, name: &str) -> Result<Arc<Table>> {
        self.core.resolve(name)
    }

    /// All tables of a database, by name.
    pub fn tables(&self, database: &str) -> Result<Vec<Arc<Table>>> {
        self.core.catalog.tables(database)
    }

    /// Creates a table programmatically (e.g. a flow's sink). `name` is `t`
    /// or `db.t`. Returns the table and whether it was created now.
    pub async fn create_table(
        &self,
        name: &str,
        schema: TableSchema,
        if_not_exists: bool,
    ) -> Result<(Arc<Table>, bool)> {
        let (database, table) = split_name(name);
        crate::sql::create_table(
            &self.core,
            database,
            table,
            schema,
            Default::default(),
            if_not_exists,
        )
        .await
    }

    /// Drops a table; `Ok(false)` if it did not exist and `if_exists`.
    pub async fn drop_table(&self, name: &str, if_exists: bool) -> Result<bool> {
        let (database, table) = split_name(name);
        crate::sql::drop_table(&self.core, database, table, if_exists).await
    }

    /// Writes a batch of rows in one durable commit. Columns are matched by
    /// name; missing columns take their DEFAULT or NULL; types are cast.
    /// Returns the number of rows written.
    pub async fn insert_batch(&self, table: &str, batch: RecordBatch) -> Result<u64> {
        let table = self.core.resolve(table)?;
        let batch = self.core.fill_defaults(&table, batch)?;
        let mut set = WriteSet::new();
        set.upsert(table, batch);
        Ok(self.commit(set).await?.rows)
    }

    /// Deletes the rows with the (primary key, time index) of `keys`' rows.
    /// Returns how many rows were deleted.
    pub async fn delete_batch(&self, table: &str, keys: RecordBatch) -> Result<u64> {
        let table = self.core.resolve(table)?;
        let mut set = WriteSet::new();
        set.delete(table, keys);
        Ok(self.commit(set).await?.rows)
    }

    /// Commits a [`WriteSet`] (upserts and deletes on several tables plus
    /// metadata entries) as ONE durable transaction, then publishes its
    /// changes. Metadata keys must not start with `catalog/`, `store/` or
    /// `flow/` (sandflow's own).
    pub async fn commit(&self, set: WriteSet) -> Result<CommitInfo> {
        set.check_user_meta()?;
        let core = self.core.clone();
        blocking(move || core.store.commit(set)).await
    }

    /// Reads a metadata entry written through [`Database::commit`].
    pub fn get_meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.core.store.get_meta(key)
    }

    /// Metadata entries whose key starts with `prefix`, in key order.
    pub fn scan_meta(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.core.store.scan_meta(prefix)
    }

    /// Every change to `table` committed from now on, as diff batches,
    /// pulled from the table's change log (a slow reader holds no rows in
    /// memory; the log waits on disk).
    pub fn subscribe(&self, table: &str) -> Result<ChangeFeed> {
        let table = self.core.resolve(table)?;
        Ok(ChangeFeed::open(&self.core.store, table, false)?.0)
    }

    /// The table's current rows plus a feed of every later change (no gap,
    /// no overlap): the back-fill for a new flow.
    pub fn subscribe_with_snapshot(&self, table: &str) -> Result<(Snapshot, ChangeFeed)> {
        let table = self.core.resolve(table)?;
        let (feed, snapshot) = ChangeFeed::open(&self.core.store, table, true)?;
        let snapshot = snapshot.ok_or_else(|| {
            crate::error::InternalSnafu {
                message: "the feed came without its snapshot".to_string(),
            }
            .build()
        })?;
        Ok((snapshot, feed))
    }

    /// A consistent copy of the table's rows with the commit sequence it reflects.
    pub fn snapshot(&self, table: &str) -> Result<Snapshot> {
        let table = self.core.resolve(table)?;
        self.core.store.scan(&table)
    }

    /// The sequence number of the last durable commit.
    pub fn last_seq(&self) -> Result<u64> {
        self.core.store.last_seq()
    }
}
