//! DataFusion sees sandflow's catalog through these providers: a catalog
//! (`greptime`) whose schemas are sandflow databases and whose tables scan,
//! insert into and delete from the store — so DataFusion-planned DML (also
//! prepared statements from the PostgreSQL extended protocol) takes the same
//! path, with upsert semantics and the change feed.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, UInt64Array};
use datafusion::arrow::compute::and;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::{CatalogProvider, SchemaProvider, Session, TableProvider};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DataFusionError};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::sink::{DataSink, DataSinkExec};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::{
    common::collect, DisplayAs, DisplayFormatType, ExecutionPlan, SendableRecordBatchStream,
};

use crate::catalog::Table;
use crate::database::Core;
use crate::error::{Error, InvalidDataSnafu, UnsupportedSnafu};
use crate::schema::ColumnType;
use crate::session::SessionShared;
use crate::storage::{KeyRange, WriteSet};

fn poisoned() -> Error {
    crate::error::InternalSnafu {
        message: "a session lock was poisoned by an earlier panic; reconnect",
    }
    .build()
}

pub(crate) fn to_df(e: Error) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// Runs blocking storage work (fsync'd commits) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        crate::error::InternalSnafu {
            message: format!("storage task failed: {e}"),
        }
        .build()
    })?
}

/// The `greptime` catalog: one schema per sandflow database.
#[derive(Debug)]
pub struct SandCatalog {
    pub(crate) core: Arc<Core>,
}

impl CatalogProvider for SandCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.core.catalog.database_names().unwrap_or_default()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        if name == crate::flow::system::SYSTEM_SCHEMA {
            return Some(Arc::new(crate::flow::system::SystemSchema {
                core: self.core.clone(),
            }));
        }
        match self.core.catalog.database_exists(name) {
            Ok(true) => Some(Arc::new(SandSchema {
                core: self.core.clone(),
                database: name.to_string(),
            })),
            _ => None,
        }
    }

    fn register_schema(
        &self,
        name: &str,
        _schema: Arc<dyn SchemaProvider>,
    ) -> datafusion::common::Result<Option<Arc<dyn SchemaProvider>>> {
        Err(to_df(
            UnsupportedSnafu {
                message: format!("use CREATE DATABASE {name} to create a database"),
            }
            .build(),
        ))
    }
}

#[derive(Debug)]
pub struct SandSchema {
    core: Arc<Core>,
    database: String,
}

#[async_trait]
impl SchemaProvider for SandSchema {
    fn table_names(&self) -> Vec<String> {
        self.core
            .catalog
            .tables(&self.database)
            .unwrap_or_default()
            .iter()
            .map(|t| t.info.name.clone())
            .collect()
    }

    async fn table(
        &self,
        name: &str,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        let table = self
            .core
            .catalog
            .table(&self.database, name)
            .map_err(to_df)?;
        Ok(table.map(|t| Arc::new(SandTable::new(self.core.clone(), t)) as Arc<dyn TableProvider>))
    }

    fn register_table(
        &self,
        name: String,
        _table: Arc<dyn TableProvider>,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        Err(to_df(
            UnsupportedSnafu {
                message: format!(
                    "cannot register '{name}' as a table; create tables with CREATE TABLE ... TIME INDEX"
                ),
            }
            .build(),
        ))
    }

    fn deregister_table(
        &self,
        name: &str,
    ) -> datafusion::common::Result<Option<Arc<dyn TableProvider>>> {
        Err(to_df(
            UnsupportedSnafu {
                message: format!("use DROP TABLE {name}"),
            }
            .build(),
        ))
    }

    fn table_exist(&self, name: &str) -> bool {
        matches!(self.core.catalog.table(&self.database, name), Ok(Some(_)))
    }
}

/// A stored table as a DataFusion table.
#[derive(Debug)]
pub struct SandTable {
    core: Arc<Core>,
    table: Arc<Table>,
    defaults: Arc<HashMap<String, Expr>>,
    /// The table schema with every column nullable. DataFusion plans INSERT
    /// VALUES with the target's nullability and then fails with an opaque
    /// message on a NULL; with this the store reports it, naming the column.
    schema: SchemaRef,
}

impl SandTable {
    pub(crate) fn new(core: Arc<Core>, table: Arc<Table>) -> SandTable {
        let defaults = core.defaults(&table);
        let schema = nullable_schema(&table.arrow_schema);
        SandTable {
            core,
            table,
            defaults,
            schema,
        }
    }

    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// For `key_column = literal` (either way round): the column's index
    /// and the literal as a one-row array of the column's type. Float key
    /// columns are left out (-0.0 equals 0.0 but is stored apart), as are
    /// NULL and literals that do not cast exactly.
    fn key_equality(&self, e: &Expr) -> Option<(usize, ArrayRef)> {
        let Expr::BinaryExpr(b) = e else {
            return None;
        };
        if b.op != Operator::Eq {
            return None;
        }
        let (column, value) = match (b.left.as_ref(), b.right.as_ref()) {
            (Expr::Column(c), Expr::Literal(v, _)) | (Expr::Literal(v, _), Expr::Column(c)) => {
                (c, v)
            }
            _ => return None,
        };
        let index = self.table.arrow_schema.index_of(&column.name).ok()?;
        if !self.table.key_columns.contains(&index) || value.is_null() {
            return None;
        }
        let ty = self.table.schema().columns[index].data_type;
        if matches!(ty, ColumnType::Float32 | ColumnType::Float64) {
            return None;
        }
        let target = self.table.arrow_schema.field(index).data_type();
        if value.data_type() != *target {
            return None;
        }
        Some((index, value.to_array().ok()?))
    }

    /// For `time_index op literal` (either way round; op one of `<`, `<=`,
    /// `>`, `>=`) and `time_index BETWEEN literal AND literal`: the times
    /// it allows, as (first allowed, first not allowed after it). Only for
    /// tables whose key starts with the time index.
    fn time_bounds(&self, e: &Expr) -> Option<(Option<i64>, Option<i64>)> {
        let index = self.table.schema().time_index;
        if self.table.key_columns.first() != Some(&index) {
            return None;
        }
        let is_time = |e: &Expr| matches!(e, Expr::Column(c) if self.table.arrow_schema.index_of(&c.name).ok() == Some(index));
        let time = |e: &Expr| match e {
            Expr::Literal(v, _) => self.time_literal(v),
            _ => None,
        };
        match e {
            Expr::Between(b) if !b.negated && is_time(&b.expr) => {
                let (low, high) = (time(&b.low)?, time(&b.high)?);
                Some((Some(low), high.checked_add(1)))
            }
            Expr::BinaryExpr(b) => {
                let (op, v) = if is_time(&b.left) {
                    (b.op, time(&b.right)?)
                } else if is_time(&b.right) {
                    (b.op.swap()?, time(&b.left)?)
                } else {
                    return None;
                };
                match op {
                    Operator::Gt => Some((Some(v.checked_add(1)?), None)),
                    Operator::GtEq => Some((Some(v), None)),
                    Operator::Lt => Some((None, Some(v))),
                    Operator::LtEq => Some((None, v.checked_add(1))),
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// A literal of the time index's type (any time zone: the stored count
    /// is UTC either way) as the stored count of its unit.
    fn time_literal(&self, v: &datafusion::scalar::ScalarValue) -> Option<i64> {
        use datafusion::scalar::ScalarValue as S;
        let ty = self.table.schema().time_index_column().data_type;
        match (ty, v) {
            (ColumnType::TimestampSecond, S::TimestampSecond(Some(v), _))
            | (ColumnType::TimestampMillisecond, S::TimestampMillisecond(Some(v), _))
            | (ColumnType::TimestampMicrosecond, S::TimestampMicrosecond(Some(v), _))
            | (ColumnType::TimestampNanosecond, S::TimestampNanosecond(Some(v), _))
            | (ColumnType::Int64, S::Int64(Some(v))) => Some(*v),
            _ => None,
        }
    }

    /// The key range a time range among the filters allows. None when the
    /// filters bound no time.
    fn time_range(&self, filters: &[Expr]) -> Option<KeyRange> {
        let (mut low, mut high): (Option<i64>, Option<i64>) = (None, None);
        let mut any = false;
        for (l, h) in filters.iter().filter_map(|f| self.time_bounds(f)) {
            any = true;
            if let Some(l) = l {
                low = Some(low.map_or(l, |x| x.max(l)));
            }
            if let Some(h) = h {
                high = Some(high.map_or(h, |x| x.min(h)));
            }
        }
        if !any {
            return None;
        }
        let start = match low {
            Some(l) => crate::storage::codec::time_prefix(&self.table, l)?,
            None => Vec::new(),
        };
        let end = match high {
            Some(h) => Some(crate::storage::codec::time_prefix(&self.table, h)?),
            None => None,
        };
        Some(KeyRange {
            start,
            prefix: Vec::new(),
            end,
            series: None,
        })
    }

    /// For a table keyed by time first: the series its leading primary key
    /// columns' equalities with literals pick (`host = 'a'`), which a scan
    /// checks on each key before decoding the row.
    fn series_filter(&self, filters: &[Expr]) -> Option<(usize, Vec<u8>)> {
        let values = self.leading_equalities(filters, 1);
        crate::storage::codec::series_prefix(&self.table, &values)
    }

    /// The literals the filters set the key columns from the `skip`th on
    /// equal to, as long as each next one has an equality.
    fn leading_equalities(&self, filters: &[Expr], skip: usize) -> Vec<ArrayRef> {
        let mut equalities: Vec<(usize, ArrayRef)> = filters
            .iter()
            .filter_map(|f| self.key_equality(f))
            .collect();
        let mut values = Vec::new();
        for &c in self.table.key_columns.iter().skip(skip) {
            match equalities.iter().position(|(i, _)| *i == c) {
                Some(at) => values.push(equalities.swap_remove(at).1),
                None => break,
            }
        }
        values
    }

    /// The key prefix the filters pin down: the values of the leading key
    /// columns that each have an equality with a literal.
    fn key_prefix(&self, filters: &[Expr]) -> Option<Vec<u8>> {
        let values = self.leading_equalities(filters, 0);
        if values.is_empty() {
            return None;
        }
        Some(crate::storage::codec::key_prefix(&self.table, &values))
    }
}

fn nullable_schema(schema: &SchemaRef) -> SchemaRef {
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    Arc::new(Schema::new(fields))
}

#[async_trait]
impl TableProvider for SandTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.defaults.get(column)
    }

    /// `key_column = literal` on the leading key columns, and a time range
    /// on a key that starts with the time index, narrow the scan to a key
    /// range (see [`SandTable::key_prefix`], [`SandTable::time_range`]);
    /// DataFusion still applies every filter.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::common::Result<Vec<TableProviderFilterPushDown>> {
        Ok(filters
            .iter()
            .map(
                |f| match self.key_equality(f).is_some() || self.time_bounds(f).is_some() {
                    true => TableProviderFilterPushDown::Inexact,
                    false => TableProviderFilterPushDown::Unsupported,
                },
            )
            .collect())
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        _limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let keys = match self.key_prefix(filters) {
            Some(p) => KeyRange::prefix(p),
            None => KeyRange {
                series: self.series_filter(filters),
                ..self.time_range(filters).unwrap_or_default()
            },
        };
        // Without columns (`count(*)`) the rows' order cannot show: skip
        // sorting them into series order.
        let series_order = !projection.is_some_and(|p| p.is_empty());
        let scan = || self.core.store.scan_keys(&self.table, &keys, series_order);
        // A transaction reads its own staged writes.
        let shared = state.config().get_extension::<SessionShared>();
        let snapshot = match shared.as_ref().and_then(|s| s.staged.lock().ok()) {
            Some(guard) => match guard.as_ref() {
                Some(staged) if staged.touches(self.table.id()) => {
                    self.core.store.scan_staged(&self.table, staged)
                }
                _ => scan(),
            },
            None => scan(),
        }
        .map_err(to_df)?;
        let batches = snapshot
            .batches
            .into_iter()
            .map(|b| b.with_schema(self.schema.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let exec: Arc<dyn ExecutionPlan> =
            MemorySourceConfig::try_new_exec(&[batches], self.schema.clone(), projection.cloned())?;
        Ok(exec)
    }

    async fn insert_into(
        &self,
        _state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        // REPLACE INTO is an INSERT, as in GreptimeDB: a row replaces the one
        // with its primary key and time index either way.
        if insert_op == InsertOp::Overwrite {
            return Err(to_df(
                UnsupportedSnafu {
                    message: format!(
                        "{insert_op} is not supported; INSERT INTO already replaces rows with the same primary key and time index"
                    ),
                }
                .build(),
            ));
        }
        // Nullability is checked by the store with a message naming the column.
        let sink = SandSink {
            core: self.core.clone(),
            table: self.table.clone(),
            schema: self.schema.clone(),
        };
        Ok(Arc::new(DataSinkExec::new(input, Arc::new(sink), None)))
    }

    async fn delete_from(
        &self,
        state: &dyn Session,
        filters: Vec<Expr>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let df_schema = DFSchema::try_from(self.table.arrow_schema.clone())?;
        let mut predicates = Vec::with_capacity(filters.len());
        for f in filters {
            // Filters name the table (`t.col`); the rows we test have bare columns.
            let f = f
                .transform(|e| {
                    Ok(match e {
                        Expr::Column(c) => {
                            Transformed::yes(Expr::Column(Column::new_unqualified(c.name)))
                        }
                        other => Transformed::no(other),
                    })
                })?
                .data;
            predicates.push(state.create_physical_expr(f, &df_schema)?);
        }
        Ok(Arc::new(DeleteExec::new(
            self.core.clone(),
            self.table.clone(),
            predicates,
            state.config().get_extension::<SessionShared>(),
        )))
    }
}

/// `DELETE ... WHERE`: deletes when it runs, not when it is planned (so that
/// `EXPLAIN DELETE` deletes nothing), and yields the number of rows deleted.
#[derive(Debug)]
struct DeleteExec {
    core: Arc<Core>,
    table: Arc<Table>,
    predicates: Vec<Arc<dyn datafusion::physical_plan::PhysicalExpr>>,
    shared: Option<Arc<SessionShared>>,
    properties: Arc<datafusion::physical_plan::PlanProperties>,
}

impl DeleteExec {
    fn new(
        core: Arc<Core>,
        table: Arc<Table>,
        predicates: Vec<Arc<dyn datafusion::physical_plan::PhysicalExpr>>,
        shared: Option<Arc<SessionShared>>,
    ) -> DeleteExec {
        use datafusion::physical_expr::EquivalenceProperties;
        use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
        use datafusion::physical_plan::{Partitioning, PlanProperties};
        let properties = PlanProperties::new(
            EquivalenceProperties::new(count_schema()),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        );
        DeleteExec {
            core,
            table,
            predicates,
            shared,
            properties: Arc::new(properties),
        }
    }
}

fn count_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(
        "count",
        DataType::UInt64,
        false,
    )]))
}

impl DisplayAs for DeleteExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SandflowDelete: table={}", self.table.qualified_name())
    }
}

impl ExecutionPlan for DeleteExec {
    fn name(&self) -> &str {
        "SandflowDelete"
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(
            &Arc<dyn datafusion::physical_plan::PhysicalExpr>,
        ) -> datafusion::common::Result<TreeNodeRecursion>,
    ) -> datafusion::common::Result<TreeNodeRecursion> {
        for p in &self.predicates {
            if f(p)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn properties(&self) -> &Arc<datafusion::physical_plan::PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn with_new_children(
        self: Arc<Self>,
        _children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        Ok(self)
    }

    fn execute(
        &self,
        _partition: usize,
        _context: Arc<TaskContext>,
    ) -> datafusion::common::Result<SendableRecordBatchStream> {
        let core = self.core.clone();
        let table = self.table.clone();
        let predicates = self.predicates.clone();
        let shared = self.shared.clone();
        let rows = async move {
            let deleted = blocking(move || {
                let mut predicate = |batch: &RecordBatch| -> crate::Result<BooleanArray> {
                    let mut mask: Option<BooleanArray> = None;
                    for p in &predicates {
                        let value = p
                            .evaluate(batch)
                            .and_then(|v| v.into_array(batch.num_rows()))
                            .map_err(|e| {
                                InvalidDataSnafu {
                                    message: e.to_string(),
                                }
                                .build()
                            })?;
                        let Some(b) = value.as_any().downcast_ref::<BooleanArray>() else {
                            return InvalidDataSnafu {
                                message: "the DELETE condition is not a boolean expression",
                            }
                            .fail();
                        };
                        mask = Some(match mask {
                            None => b.clone(),
                            Some(m) => and(&m, b).map_err(|e| {
                                InvalidDataSnafu {
                                    message: e.to_string(),
                                }
                                .build()
                            })?,
                        });
                    }
                    Ok(mask.unwrap_or_else(|| BooleanArray::from(vec![true; batch.num_rows()])))
                };
                let control = match &shared {
                    Some(shared) => {
                        let mut guard = shared.staged.lock().map_err(|_| poisoned())?;
                        if let Some(staged) = guard.as_mut() {
                            return core
                                .store
                                .stage_delete_where(staged, &table, &mut predicate);
                        }
                        Some(shared.control())
                    }
                    None => None,
                };
                let gate = || control.as_ref().map_or(Ok(()), |c| c.begin_commit());
                Ok(core.store.delete_where(&table, &mut predicate, &gate)?.rows)
            })
            .await
            .map_err(to_df)?;
            RecordBatch::try_new(
                count_schema(),
                vec![Arc::new(UInt64Array::from(vec![deleted]))],
            )
            .map_err(DataFusionError::from)
        };
        Ok(Box::pin(
            datafusion::physical_plan::stream::RecordBatchStreamAdapter::new(
                count_schema(),
                futures::stream::once(rows),
            ),
        ))
    }
}

/// Writes everything DataFusion inserts into one table as ONE commit.
#[derive(Debug)]
struct SandSink {
    core: Arc<Core>,
    table: Arc<Table>,
    schema: SchemaRef,
}

impl DisplayAs for SandSink {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SandflowSink: table={}", self.table.qualified_name())
    }
}

/// Writes an INSERT's rows into `table`: staged in the session's open
/// transaction block, or committed (after the statement's cancel gate) as
/// one durable commit. Returns the rows affected (0 for a `ttl = 'instant'`
/// table, which stores nothing, as GreptimeDB reports).
pub(crate) async fn write_rows(
    core: &Arc<Core>,
    table: &Arc<Table>,
    batches: Vec<RecordBatch>,
    shared: Option<Arc<SessionShared>>,
) -> crate::error::Result<u64> {
    crate::sql::access::check_storage_quota(core, &table.info.database)?;
    let (c, t) = (core.clone(), table.clone());
    let info = blocking(move || {
        if let Some(shared) = &shared {
            let mut guard = shared.staged.lock().map_err(|_| poisoned())?;
            if let Some(staged) = guard.as_mut() {
                // In a transaction: staged, committed by COMMIT.
                let mut rows = 0;
                for b in &batches {
                    rows += c.store.stage_upsert(staged, &t, b)?;
                }
                return Ok(rows);
            }
            drop(guard);
            shared.control().begin_commit()?;
        }
        let mut set = WriteSet::new();
        for b in batches {
            if b.num_rows() > 0 {
                set.upsert(t.clone(), b);
            }
        }
        if set.is_empty() {
            return Ok(0);
        }
        Ok(c.store.commit(set)?.rows)
    })
    .await?;
    Ok(if table.instant() { 0 } else { info })
}

#[async_trait]
impl DataSink for SandSink {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    async fn write_all(
        &self,
        data: SendableRecordBatchStream,
        context: &Arc<TaskContext>,
    ) -> datafusion::common::Result<u64> {
        let batches = collect(data).await?;
        let shared = context.session_config().get_extension::<SessionShared>();
        write_rows(&self.core, &self.table, batches, shared)
            .await
            .map_err(to_df)
    }
}
