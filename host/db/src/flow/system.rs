//! `information_schema.flows`: every flow with its definition and run-time
//! status.
//!
//! DataFusion answers `information_schema.*` itself, before any catalog is
//! asked, so queries naming `information_schema.flows` are rewritten (on the
//! parsed statement) to a schema of sandflow's own, [`SYSTEM_SCHEMA`], which
//! the catalog resolves but does not list.

use std::ops::ControlFlow;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Int64Array, StringArray, TimestampMillisecondArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{SchemaProvider, Session, TableProvider};
use datafusion::datasource::MemTable;
use datafusion::error::DataFusionError;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::sqlparser::ast::{
    visit_relations_mut, Ident, ObjectName, ObjectNamePart, Statement, TableAlias, TableFactor,
    VisitMut, VisitorMut,
};

use super::manager::FlowInfo;
use crate::catalog::{DEFAULT_CATALOG, INFORMATION_SCHEMA};
use crate::database::Core;
use crate::nodes::NodeRow;

/// The hidden schema that holds sandflow's system tables.
pub const SYSTEM_SCHEMA: &str = "__sandflow_system";
/// The flows table's name in both schemas.
pub const FLOWS_TABLE: &str = "flows";
/// GreptimeDB's `information_schema.flow_statistics` (what `SHOW FLOW
/// STATUS` shows): run-time facts per flow.
pub const FLOW_STATISTICS_TABLE: &str = "flow_statistics";
/// `information_schema.components`: every version of every user component
/// the user may see.
pub const COMPONENTS_TABLE: &str = "components";
/// `information_schema.flow_logs`: what the flows' guests wrote to stdout
/// and stderr (see [`super::logs`]).
pub const FLOW_LOGS_TABLE: &str = "flow_logs";

/// `information_schema.nodes`: the nodes of the cluster (see
/// [`crate::nodes`]).
pub const NODES_TABLE: &str = "nodes";

/// The system tables, by their names in `information_schema`.
const SYSTEM_TABLES: [&str; 5] = [
    FLOWS_TABLE,
    FLOW_STATISTICS_TABLE,
    COMPONENTS_TABLE,
    FLOW_LOGS_TABLE,
    NODES_TABLE,
];

/// The system table `name` names (`information_schema.flows` in any case,
/// optionally prefixed by the catalog), if it names one.
fn system_table(name: &ObjectName) -> Option<String> {
    let parts: Vec<String> = name
        .0
        .iter()
        .map(|p| match p {
            ObjectNamePart::Identifier(i) if i.quote_style.is_none() => i.value.to_lowercase(),
            ObjectNamePart::Identifier(i) => i.value.clone(),
            other => other.to_string(),
        })
        .collect();
    let table = match parts.as_slice() {
        [s, t] if s == INFORMATION_SCHEMA => Some(t),
        [c, s, t] if c == DEFAULT_CATALOG && s == INFORMATION_SCHEMA => Some(t),
        _ => None,
    };
    table
        .filter(|t| SYSTEM_TABLES.contains(&t.as_str()))
        .cloned()
}

/// Names a system table in FROM by its own name when it has no alias, so
/// that expressions over it name their columns `flows.x`, not after the
/// system schema it is rewritten to.
struct AliasSystemTables;

impl VisitorMut for AliasSystemTables {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, alias, .. } = factor {
            if alias.is_none() {
                if let Some(t) = system_table(name) {
                    *alias = Some(TableAlias {
                        explicit: true,
                        name: Ident::new(t),
                        columns: Vec::new(),
                        at: None,
                    });
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Rewrites `information_schema.flows` (any case, optionally prefixed by the
/// catalog) to the system schema's table.
pub fn rewrite_system_tables(stmt: &mut Statement) {
    let _ = stmt.visit(&mut AliasSystemTables);
    let _ = visit_relations_mut(stmt, |name: &mut ObjectName| {
        if let Some(t) = system_table(name) {
            *name = ObjectName(vec![
                ObjectNamePart::Identifier(Ident::new(DEFAULT_CATALOG)),
                ObjectNamePart::Identifier(Ident::with_quote('"', SYSTEM_SCHEMA)),
                ObjectNamePart::Identifier(Ident::new(t.as_str())),
            ]);
        }
        ControlFlow::<()>::Continue(())
    });
}

/// The columns of `information_schema.flows` (GreptimeDB's, plus `status`
/// (`running`, `failed`, or `pending` for a flow waiting for its sources),
/// `last_error`, `rows_written`, `failures`, `restarts`, `lag_ms`,
/// `next_restart_time`, `asleep`: whether the flow is idle, its state kept
/// as a snapshot and its sandbox released until input arrives, and
/// `eval_interval`: its `EVAL INTERVAL` in seconds, as `expire_after`).
pub fn flows_schema() -> SchemaRef {
    let ts = || DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("flow_name", DataType::Utf8, false),
        Field::new("flow_id", DataType::UInt32, false),
        Field::new("state_size", DataType::UInt64, true),
        Field::new("table_catalog", DataType::Utf8, false),
        Field::new("flow_definition", DataType::Utf8, false),
        Field::new("comment", DataType::Utf8, true),
        Field::new("expire_after", DataType::Int64, true),
        Field::new("source_table_ids", DataType::Utf8, true),
        Field::new("sink_table_name", DataType::Utf8, false),
        Field::new("flownode_ids", DataType::Utf8, true),
        Field::new("options", DataType::Utf8, true),
        Field::new("created_time", ts(), false),
        Field::new("updated_time", ts(), false),
        Field::new("last_execution_time", ts(), true),
        Field::new("source_table_names", DataType::Utf8, true),
        Field::new("status", DataType::Utf8, false),
        Field::new("last_error", DataType::Utf8, true),
        Field::new("rows_written", DataType::UInt64, false),
        Field::new("failures", DataType::UInt64, false),
        Field::new("restarts", DataType::UInt64, false),
        Field::new("lag_ms", DataType::Int64, false),
        Field::new("next_restart_time", ts(), true),
        Field::new("asleep", DataType::Boolean, false),
        Field::new("eval_interval", DataType::Int64, true),
        Field::new("component", DataType::Utf8, true),
        Field::new("component_digest", DataType::Utf8, true),
        Field::new("node", DataType::Utf8, true),
    ]))
}

/// The columns of `information_schema.components`: one row per version.
pub fn components_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("database", DataType::Utf8, false),
        Field::new("digest", DataType::Utf8, false),
        Field::new("size", DataType::UInt64, false),
        Field::new("world_version", DataType::Utf8, false),
        Field::new(
            "created",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("owner", DataType::Utf8, true),
        Field::new("version", DataType::UInt32, false),
    ]))
}

/// The rows of `information_schema.components`.
pub fn components_batch(
    components: &[super::components::ComponentDef],
) -> datafusion::common::Result<RecordBatch> {
    let rows: Vec<(
        &super::components::ComponentDef,
        &super::components::ComponentVersion,
    )> = components
        .iter()
        .flat_map(|c| c.versions.iter().map(move |v| (c, v)))
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(c, _)| c.name.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(c, _)| c.database.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(_, v)| v.digest.as_str()),
        )),
        Arc::new(rows.iter().map(|(_, v)| v.size).collect::<UInt64Array>()),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|(_, v)| v.world_version.as_str()),
        )),
        Arc::new(
            rows.iter()
                .map(|(_, v)| Some(v.created_ms))
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            rows.iter()
                .map(|(c, _)| c.owner.clone())
                .collect::<StringArray>(),
        ),
        Arc::new(rows.iter().map(|(_, v)| v.version).collect::<UInt32Array>()),
    ];
    Ok(RecordBatch::try_new(components_schema(), columns)?)
}

fn json_list(items: impl Iterator<Item = String>) -> String {
    serde_json::to_string(&items.collect::<Vec<_>>()).unwrap_or_default()
}

/// The rows of `information_schema.flows`.
/// `node` is the id of the node this database runs on: the node of every
/// flow that runs (the column is NULL for one that does not).
pub fn flows_batch(
    flows: &[FlowInfo],
    now: i64,
    node: &str,
) -> datafusion::common::Result<RecordBatch> {
    let s = |f: &dyn Fn(&FlowInfo) -> String| -> ArrayRef {
        Arc::new(StringArray::from_iter_values(flows.iter().map(f)))
    };
    let opt = |f: &dyn Fn(&FlowInfo) -> Option<String>| -> ArrayRef {
        Arc::new(flows.iter().map(f).collect::<StringArray>())
    };
    let columns: Vec<ArrayRef> = vec![
        s(&|f| f.def.name.clone()),
        Arc::new(flows.iter().map(|f| f.def.id).collect::<UInt32Array>()),
        Arc::new(
            flows
                .iter()
                .map(|f| Some(f.status.state_size))
                .collect::<UInt64Array>(),
        ),
        s(&|_| DEFAULT_CATALOG.to_string()),
        // The whole statement, as SHOW CREATE FLOW prints it (GreptimeDB's).
        s(&|f| f.def.create_statement()),
        opt(&|f| f.def.comment.clone()),
        Arc::new(
            flows
                .iter()
                .map(|f| f.def.expire_after_ms.map(|ms| ms / 1000))
                .collect::<Int64Array>(),
        ),
        s(&|f| json_list(f.source_ids.iter().map(|i| i.to_string()))),
        s(&|f| f.def.sink_name()),
        // GreptimeDB's map of partition to flownode, as JSON: one partition,
        // none while the flow waits for its sources.
        s(&|f| match f.def.pending {
            true => "{}".to_string(),
            false => r#"{"0":0}"#.to_string(),
        }),
        s(&|f| {
            // The options as written, and GreptimeDB's `flow_type`.
            let mut map: serde_json::Map<String, serde_json::Value> = f
                .def
                .options
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            if let Some(t) = f.flow_type {
                map.insert("flow_type".into(), serde_json::Value::String(t.into()));
            }
            serde_json::Value::Object(map).to_string()
        }),
        Arc::new(
            flows
                .iter()
                .map(|f| Some(f.def.created_ms))
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| Some(f.def.updated_ms))
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.last_execution_ms)
                .collect::<TimestampMillisecondArray>(),
        ),
        s(&|f| f.def.source_table_names()),
        s(&|f| {
            if f.def.pending {
                "pending".to_string()
            } else if f.status.error.is_some() {
                "failed".to_string()
            } else if f.def.paused {
                "paused".to_string()
            } else {
                "running".to_string()
            }
        }),
        opt(&|f| f.status.error.clone()),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.rows_written)
                .collect::<UInt64Array>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.failures)
                .collect::<UInt64Array>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.restarts)
                .collect::<UInt64Array>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.lag_ms(now))
                .collect::<Int64Array>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.status.next_restart_ms)
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| Some(f.status.asleep))
                .collect::<datafusion::arrow::array::BooleanArray>(),
        ),
        Arc::new(
            flows
                .iter()
                .map(|f| f.def.eval_interval_ms.map(|ms| ms / 1000))
                .collect::<Int64Array>(),
        ),
        opt(&|f| f.def.component.as_ref().map(|c| c.display_name())),
        opt(&|f| f.def.component.as_ref().map(|c| c.digest.clone())),
        opt(&|f| match &f.remote_node {
            Some(n) => Some(n.clone()),
            None => f.is_running().then(|| node.to_string()),
        }),
    ];
    Ok(RecordBatch::try_new(flows_schema(), columns)?)
}

/// The columns of `information_schema.flow_statistics`, as GreptimeDB's.
pub fn flow_statistics_schema() -> SchemaRef {
    let ts = || DataType::Timestamp(TimeUnit::Millisecond, None);
    Arc::new(Schema::new(vec![
        Field::new("flow_id", DataType::UInt32, false),
        Field::new("flow_name", DataType::Utf8, false),
        Field::new("start_time", ts(), true),
        Field::new("last_execution_time", ts(), true),
        Field::new("uptime_seconds", DataType::Int64, true),
        Field::new("state_size", DataType::UInt64, true),
    ]))
}

/// The rows of `information_schema.flow_statistics`: flows that run (a
/// failed or pending flow has no run to describe).
pub fn flow_statistics_batch(
    flows: &[FlowInfo],
    now: i64,
) -> datafusion::common::Result<RecordBatch> {
    let running: Vec<&FlowInfo> = flows
        .iter()
        .filter(|f| !f.def.pending && f.status.error.is_none())
        .collect();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(running.iter().map(|f| f.def.id).collect::<UInt32Array>()),
        Arc::new(StringArray::from_iter_values(
            running.iter().map(|f| f.def.name.as_str()),
        )),
        Arc::new(
            running
                .iter()
                .map(|f| f.status.started_ms)
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            running
                .iter()
                .map(|f| f.status.last_execution_ms)
                .collect::<TimestampMillisecondArray>(),
        ),
        Arc::new(
            running
                .iter()
                .map(|f| f.status.started_ms.map(|s| (now - s).max(0) / 1000))
                .collect::<Int64Array>(),
        ),
        Arc::new(
            running
                .iter()
                .map(|f| Some(f.status.state_size))
                .collect::<UInt64Array>(),
        ),
    ];
    Ok(RecordBatch::try_new(flow_statistics_schema(), columns)?)
}

/// The hidden system schema.
#[derive(Debug)]
pub struct SystemSchema {
    pub(crate) core: Arc<Core>,
}

#[async_trait]
impl SchemaProvider for SystemSchema {
    fn table_names(&self) -> Vec<String> {
        SYSTEM_TABLES.iter().map(|t| t.to_string()).collect()
    }

    async fn table(
        &self,
        name: &str,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        let statistics = match name {
            FLOWS_TABLE => false,
            FLOW_STATISTICS_TABLE => true,
            COMPONENTS_TABLE => {
                return Ok(Some(Arc::new(ComponentsTable {
                    core: self.core.clone(),
                }) as Arc<dyn TableProvider>))
            }
            FLOW_LOGS_TABLE => {
                return Ok(Some(Arc::new(FlowLogsTable {
                    core: self.core.clone(),
                }) as Arc<dyn TableProvider>))
            }
            NODES_TABLE => {
                return Ok(Some(Arc::new(NodesTable {
                    core: self.core.clone(),
                }) as Arc<dyn TableProvider>))
            }
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(FlowsTable {
            core: self.core.clone(),
            statistics,
        }) as Arc<dyn TableProvider>))
    }

    fn table_exist(&self, name: &str) -> bool {
        SYSTEM_TABLES.contains(&name)
    }
}

/// `information_schema.flows` (or `flow_statistics`), read at scan time.
#[derive(Debug)]
struct FlowsTable {
    core: Arc<Core>,
    statistics: bool,
}

#[async_trait]
impl TableProvider for FlowsTable {
    fn schema(&self) -> SchemaRef {
        match self.statistics {
            true => flow_statistics_schema(),
            false => flows_schema(),
        }
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let (infos, now) = (self.core.flows.infos(), self.core.flows.now_ms());
        // Each user sees the flows they may manage (see check_flow_access).
        let who = crate::sql::visible::principal_of(state.config());
        let infos: Vec<FlowInfo> = infos
            .into_iter()
            .filter(|i| {
                self.core
                    .flows
                    .check_flow_access(&self.core, &who, &i.def.name)
                    .is_ok()
            })
            .collect();
        let batch = match self.statistics {
            true => flow_statistics_batch(&infos, now)?,
            false => flows_batch(&infos, now, &self.core.node_id())?,
        };
        let mem = MemTable::try_new(self.schema(), vec![vec![batch]])?;
        mem.scan(state, projection, filters, limit).await
    }
}

/// The columns of `information_schema.nodes`: each live node's id, role
/// (`storage`, `flow` or `all`), HTTP address, the seconds left of its
/// lease and how many flows it runs.
pub fn nodes_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("id", DataType::Utf8, false),
        Field::new("role", DataType::Utf8, false),
        Field::new("address", DataType::Utf8, true),
        Field::new("lease", DataType::Int64, true),
        Field::new("flows", DataType::Int64, false),
    ]))
}

/// The rows of `information_schema.nodes`, by id.
pub fn nodes_batch(nodes: &[NodeRow]) -> datafusion::common::Result<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(nodes.iter().map(|n| &n.id))),
        Arc::new(StringArray::from_iter_values(nodes.iter().map(|n| &n.role))),
        Arc::new(
            nodes
                .iter()
                .map(|n| n.address.as_deref())
                .collect::<StringArray>(),
        ),
        Arc::new(
            nodes
                .iter()
                .map(|n| n.lease_seconds)
                .collect::<Int64Array>(),
        ),
        Arc::new(Int64Array::from_iter_values(
            nodes.iter().map(|n| n.flows as i64),
        )),
    ];
    Ok(RecordBatch::try_new(nodes_schema(), columns)?)
}

/// `information_schema.nodes`, asked of the node source at scan time.
#[derive(Debug)]
struct NodesTable {
    core: Arc<Core>,
}

#[async_trait]
impl TableProvider for NodesTable {
    fn schema(&self) -> SchemaRef {
        nodes_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let mut nodes = match self.core.node_source() {
            Some(source) => source.nodes().await.map_err(|e| {
                DataFusionError::External(format!("cannot list the cluster's nodes: {e}").into())
            })?,
            None => {
                let running = self
                    .core
                    .flows
                    .infos()
                    .iter()
                    .filter(|f| f.is_running() && f.remote_node.is_none())
                    .count() as u64;
                vec![crate::nodes::standalone_row(running)]
            }
        };
        nodes.sort_by(|a, b| a.id.cmp(&b.id));
        let mem = MemTable::try_new(self.schema(), vec![vec![nodes_batch(&nodes)?]])?;
        mem.scan(state, projection, filters, limit).await
    }
}

/// `information_schema.components`, read at scan time: the components of
/// the databases the user may see.
#[derive(Debug)]
struct ComponentsTable {
    core: Arc<Core>,
}

#[async_trait]
impl TableProvider for ComponentsTable {
    fn schema(&self) -> SchemaRef {
        components_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let who = crate::sql::visible::principal_of(state.config());
        let components: Vec<_> = super::components::list(&self.core)
            .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?
            .into_iter()
            .filter(|c| self.core.access.can_see_database(&who, &c.database))
            .collect();
        let batch = components_batch(&components)?;
        let mem = MemTable::try_new(self.schema(), vec![vec![batch]])?;
        mem.scan(state, projection, filters, limit).await
    }
}

/// The columns of `information_schema.flow_logs`: flow, time, line.
pub fn flow_logs_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("flow", DataType::Utf8, false),
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("line", DataType::Utf8, false),
    ]))
}

/// `information_schema.flow_logs`, read at scan time: the lines of the
/// flows the user may manage.
#[derive(Debug)]
struct FlowLogsTable {
    core: Arc<Core>,
}

#[async_trait]
impl TableProvider for FlowLogsTable {
    fn schema(&self) -> SchemaRef {
        flow_logs_schema()
    }

    fn table_type(&self) -> TableType {
        TableType::View
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let who = crate::sql::visible::principal_of(state.config());
        let flows = &self.core.flows;
        let lines: Vec<_> = flows
            .logs
            .lines()
            .into_iter()
            .filter(|l| flows.check_flow_access(&self.core, &who, &l.flow).is_ok())
            .collect();
        let columns: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(
                lines.iter().map(|l| l.flow.as_str()),
            )),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                lines.iter().map(|l| l.at_ms),
            )),
            Arc::new(StringArray::from_iter_values(
                lines.iter().map(|l| l.line.as_str()),
            )),
        ];
        let batch = RecordBatch::try_new(self.schema(), columns)?;
        let mem = MemTable::try_new(self.schema(), vec![vec![batch]])?;
        mem.scan(state, projection, filters, limit).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::GenericDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    #[test]
    fn rewrites_only_the_flows_table() {
        let sql = "SELECT f.flow_name FROM information_schema.flows f \
                   JOIN INFORMATION_SCHEMA.FLOWS g ON true, information_schema.tables";
        let mut stmt = Parser::parse_sql(&GenericDialect {}, sql)
            .unwrap()
            .remove(0);
        rewrite_system_tables(&mut stmt);
        let text = stmt.to_string();
        assert_eq!(
            text.matches("greptime.\"__sandflow_system\".flows").count(),
            2,
            "{text}"
        );
        assert!(text.contains("information_schema.tables"), "{text}");
    }
}
