//! The SQL layer: sandflow's own statements (DDL, SHOW, DESC) run here;
//! queries and DML are planned and run by DataFusion over
//! [`provider`]'s tables.

pub mod access;
pub mod alter;
pub mod coerce;
pub mod copy;
pub mod executor;
mod fast_insert;
pub mod functions;
pub mod parser;
pub mod provider;
pub(crate) mod visible;

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::{ParamValues, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::context::SQLOptions;
use datafusion::logical_expr::{LogicalPlan, WriteOp};
use datafusion::prelude::SessionContext;
use datafusion::sql::parser::Statement as DFStatement;

use crate::catalog::{ColumnSchema, Table, TableSchema, DEFAULT_DATABASE, TTL_INSTANT};
use crate::database::{Core, Output};
use crate::error::{
    DatabaseNotFoundSnafu, Error, InternalSnafu, InvalidDataSnafu, NotFoundSnafu, Result, SqlSnafu,
    UnsupportedSnafu,
};
use parser::{like_match, ComponentSource, CreateTable, Stmt, TableName};
use provider::blocking;

/// Converts a DataFusion error, recovering sandflow errors carried inside it.
pub fn from_df(e: DataFusionError) -> Error {
    if let DataFusionError::External(inner) = e.find_root() {
        if let Some(ours) = inner.downcast_ref::<Error>() {
            return ours.duplicate();
        }
    }
    let root = e.find_root();
    let message = e.strip_backtrace();
    match root {
        DataFusionError::ArrowError(..) | DataFusionError::Execution(_) => {
            InvalidDataSnafu { message }.build()
        }
        DataFusionError::NotImplemented(_) => UnsupportedSnafu { message }.build(),
        DataFusionError::Plan(m) if m.contains("not found") && m.starts_with("table") => {
            NotFoundSnafu {
                message: format!("{m}; create it with CREATE TABLE or check SHOW TABLES"),
            }
            .build()
        }
        _ => SqlSnafu { message }.build(),
    }
}

/// The database a context resolves unqualified table names in (a session's
/// database).
pub fn context_database(ctx: &SessionContext) -> String {
    ctx.state_ref()
        .read()
        .config_options()
        .catalog
        .default_schema
        .clone()
}

/// A context like `ctx` that resolves unqualified table names in `database`.
pub fn context_in(ctx: &SessionContext, database: &str) -> SessionContext {
    let mut state = ctx.state();
    state.config_mut().options_mut().catalog.default_schema = database.to_string();
    SessionContext::new_with_state(state)
}

/// Runs one parsed statement in `ctx` (a session's context), with values for
/// its `$n` parameters if it has any (only DataFusion-planned statements take
/// them here; the session binds sandflow's own statements as literals).
pub(crate) async fn execute_statement(
    core: &Arc<Core>,
    ctx: &SessionContext,
    stmt: Stmt,
    params: Option<ParamValues>,
) -> Result<Output> {
    match (stmt, params) {
        (Stmt::Query(stmt), params) => {
            let no_params = params.as_ref().is_none_or(|p| match p {
                ParamValues::List(v) => v.is_empty(),
                ParamValues::Map(m) => m.is_empty(),
            });
            if no_params {
                if let Some(rows) = fast_insert::try_insert(core, ctx, &stmt).await? {
                    return Ok(affected("INSERT", rows));
                }
            }
            run_datafusion(core, ctx, *stmt, params, core.clock.now_ms()).await
        }
        (other, _) => execute_stmt(core, ctx, other).await,
    }
}

/// What DataFusion may do for a client: query and write sandflow's tables;
/// never its own DDL (`CREATE EXTERNAL TABLE` reads server files, in-memory
/// tables would bypass the durable store) nor its statements (`SET
/// datafusion.*` would change every session).
fn sql_options() -> SQLOptions {
    SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(true)
        .with_allow_statements(false)
}

/// Plans a statement for DataFusion, refusing what clients may not do.
async fn plan_statement(
    core: &Core,
    ctx: &SessionContext,
    stmt: datafusion::sql::sqlparser::ast::Statement,
) -> Result<LogicalPlan> {
    plan_statement_in(core, &ctx.state(), stmt).await
}

/// A session state whose `now()` is `now_ms` (the database's clock).
fn state_at(ctx: &SessionContext, now_ms: i64) -> datafusion::execution::SessionState {
    let mut state = ctx.state();
    if let Some(t) = chrono::DateTime::from_timestamp_millis(now_ms) {
        state.execution_props_mut().query_execution_start_time = Some(t);
    }
    state
}

async fn plan_statement_in(
    core: &Core,
    state: &datafusion::execution::SessionState,
    mut stmt: datafusion::sql::sqlparser::ast::Statement,
) -> Result<LogicalPlan> {
    use datafusion::sql::sqlparser::ast::Statement as Sql;
    crate::flow::system::rewrite_system_tables(&mut stmt);
    let not_yet = match &stmt {
        Sql::Update { .. } => Some(
            "UPDATE is not supported yet; INSERT the whole row again instead: a row with the \
             same primary key and time index replaces the old one",
        ),
        Sql::Truncate { .. } => Some(
            "TRUNCATE is not supported yet; DELETE FROM the table without WHERE deletes every row",
        ),
        Sql::Copy { .. } => Some(
            "COPY to or from a file is not allowed: the server never reads or writes its own \
             files for a client. Use COPY ... TO STDOUT or COPY ... FROM STDIN over the \
             PostgreSQL protocol (psql's \\copy)",
        ),
        _ => None,
    };
    if let Some(message) = not_yet {
        return UnsupportedSnafu { message }.fail();
    }
    let plan = state
        .statement_to_plan(DFStatement::Statement(Box::new(stmt)))
        .await
        .map_err(from_df)?;
    match &plan {
        LogicalPlan::Ddl(ddl) => {
            return UnsupportedSnafu {
                message: format!(
                    "{} is not supported by sandflow; supported DDL: CREATE/DROP TABLE, \
                     CREATE/DROP DATABASE, CREATE/DROP FLOW",
                    ddl.name()
                ),
            }
            .fail()
        }
        LogicalPlan::Copy(_) => {
            return UnsupportedSnafu {
                message: "COPY ... TO a file is not allowed: the server never writes its own \
                          files for a client; use COPY ... TO STDOUT (psql's \\copy)",
            }
            .fail()
        }
        LogicalPlan::Statement(s) => {
            return UnsupportedSnafu {
                message: format!("{} is not supported here", s.name()),
            }
            .fail()
        }
        _ => {}
    }
    sql_options().verify_plan(&plan).map_err(from_df)?;
    visible::authorize_plan(core, state, &plan)?;
    Ok(plan)
}

/// The parameters and result columns of a DataFusion statement.
pub(crate) async fn describe_query(
    core: &Core,
    ctx: &SessionContext,
    stmt: datafusion::sql::sqlparser::ast::Statement,
) -> Result<crate::session::Description> {
    let plan = plan_statement(core, ctx, stmt).await?;
    let types = plan.get_parameter_types().map_err(from_df)?;
    let mut params: Vec<Option<datafusion::arrow::datatypes::DataType>> = Vec::new();
    for (name, ty) in types {
        if let Some(i) = name
            .strip_prefix('$')
            .and_then(|d| d.parse::<usize>().ok())
            .and_then(|i| i.checked_sub(1))
        {
            if params.len() <= i {
                params.resize(i + 1, None);
            }
            params[i] = ty;
        }
    }
    let columns = match &plan {
        LogicalPlan::Dml(_) => None,
        // As it will run: after the analyser's coercions (see
        // `run_datafusion`); as written if the plan does not analyse
        // without its parameters' values.
        _ => {
            let state = ctx.state();
            let analysed =
                state
                    .analyzer()
                    .execute_and_check(plan.clone(), state.config_options(), |_, _| {});
            Some(Arc::new(match analysed {
                Ok(analysed) => analysed.schema().as_arrow().clone(),
                Err(_) => plan.schema().as_arrow().clone(),
            }))
        }
    };
    Ok(crate::session::Description { params, columns })
}

/// The result columns of sandflow's own statements that return rows; `None`
/// for those that do not (and for DataFusion's, see [`describe_query`]).
pub fn result_schema(stmt: &Stmt) -> Option<Arc<Schema>> {
    let strings = |names: &[&str]| {
        Some(Arc::new(Schema::new(
            names
                .iter()
                .map(|c| Field::new(*c, DataType::Utf8, false))
                .collect::<Vec<_>>(),
        )))
    };
    match stmt {
        Stmt::ShowTables { database, .. } => strings(&[&tables_column(
            database.as_deref().unwrap_or(DEFAULT_DATABASE),
        )]),
        Stmt::ShowDatabases { .. } => strings(&["Database"]),
        Stmt::ShowCreateTable(_) => strings(&["Table", "Create Table"]),
        Stmt::Describe(_) => strings(&DESCRIBE_COLUMNS),
        Stmt::ShowFlows { .. } => strings(&["Flows"]),
        Stmt::ShowCreateFlow(_) => strings(&["Flow", "Create Flow"]),
        Stmt::ShowComponents { .. } => strings(&COMPONENT_COLUMNS),
        Stmt::Access(access::AccessStmt::ShowUsers) => strings(&["User", "Superuser", "Createdb"]),
        Stmt::Access(access::AccessStmt::ShowGrants { .. }) => {
            strings(&["User", "Object", "Privileges"])
        }
        Stmt::Admin { function, args } if args.len() == 1 => Some(admin_schema(function, &args[0])),
        _ => None,
    }
}

/// The column of `SHOW TABLES [FROM db]`: `Tables_in_<db>`, as GreptimeDB
/// (and MySQL) name it.
fn tables_column(database: &str) -> String {
    format!("Tables_in_{database}")
}

/// The columns of `DESC TABLE`.
const DESCRIBE_COLUMNS: [&str; 6] = ["Column", "Type", "Key", "Null", "Default", "Semantic Type"];

/// A scalar as a SQL literal the parser reads back to the same value.
pub fn scalar_literal(v: &ScalarValue) -> Result<String> {
    use datafusion::arrow::temporal_conversions as tc;
    if v.is_null() {
        return Ok("NULL".into());
    }
    let out_of_range = |what: &str| {
        InvalidDataSnafu {
            message: format!("{what} parameter out of range"),
        }
        .build()
    };
    let ts = |dt: Option<chrono::NaiveDateTime>, tz: &Option<Arc<str>>| -> Result<String> {
        let dt = dt.ok_or_else(|| out_of_range("timestamp"))?;
        let text = dt.format("%Y-%m-%dT%H:%M:%S%.f").to_string();
        Ok(if tz.is_some() {
            quote_literal(&format!("{text}Z"))
        } else {
            quote_literal(&text)
        })
    };
    Ok(match v {
        ScalarValue::Boolean(Some(b)) => if *b { "TRUE" } else { "FALSE" }.into(),
        ScalarValue::Int8(Some(x)) => x.to_string(),
        ScalarValue::Int16(Some(x)) => x.to_string(),
        ScalarValue::Int32(Some(x)) => x.to_string(),
        ScalarValue::Int64(Some(x)) => x.to_string(),
        ScalarValue::UInt8(Some(x)) => x.to_string(),
        ScalarValue::UInt16(Some(x)) => x.to_string(),
        ScalarValue::UInt32(Some(x)) => x.to_string(),
        ScalarValue::UInt64(Some(x)) => x.to_string(),
        ScalarValue::Float32(Some(x)) => float_literal(*x as f64),
        ScalarValue::Float64(Some(x)) => float_literal(*x),
        ScalarValue::Decimal128(Some(_), _, _) | ScalarValue::Decimal256(Some(_), _, _) => {
            v.to_string()
        }
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => quote_literal(s),
        ScalarValue::TimestampSecond(Some(x), tz) => ts(tc::timestamp_s_to_datetime(*x), tz)?,
        ScalarValue::TimestampMillisecond(Some(x), tz) => ts(tc::timestamp_ms_to_datetime(*x), tz)?,
        ScalarValue::TimestampMicrosecond(Some(x), tz) => ts(tc::timestamp_us_to_datetime(*x), tz)?,
        ScalarValue::TimestampNanosecond(Some(x), tz) => ts(tc::timestamp_ns_to_datetime(*x), tz)?,
        ScalarValue::Date32(Some(d)) => {
            let date = tc::date32_to_datetime(*d).ok_or_else(|| out_of_range("date"))?;
            quote_literal(&date.format("%Y-%m-%d").to_string())
        }
        ScalarValue::Binary(Some(b)) | ScalarValue::LargeBinary(Some(b)) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("X'{hex}'")
        }
        other => quote_literal(&other.to_string()),
    })
}

fn float_literal(x: f64) -> String {
    if x.is_finite() {
        // Rust prints the shortest text that reads back to the same f64.
        format!("{x:?}")
    } else if x.is_nan() {
        "CAST('NaN' AS DOUBLE)".into()
    } else if x > 0.0 {
        "CAST('Infinity' AS DOUBLE)".into()
    } else {
        "CAST('-Infinity' AS DOUBLE)".into()
    }
}

/// `'text'` with quotes doubled.
pub fn quote_literal(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push('\'');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

fn affected(tag: &str, rows: u64) -> Output {
    Output::Affected {
        tag: tag.to_string(),
        rows,
    }
}

async fn execute_stmt(core: &Arc<Core>, ctx: &SessionContext, stmt: Stmt) -> Result<Output> {
    let who = visible::principal_of(&ctx.copied_config());
    access::authorize(core, &who, &context_database(ctx), &stmt)?;
    match stmt {
        Stmt::Access(a) => access::execute(core, &who, &context_database(ctx), a).await,
        Stmt::CreateTable(ct) => {
            let (schema, options) = match &ct.like {
                // The other table's columns (defaults and comments too),
                // time index, primary key and options, as GreptimeDB copies
                // them; none of its rows.
                Some(like) => {
                    let source = core.catalog.require_table(&like.database, &like.table)?;
                    (source.schema().clone(), source.info.options.clone())
                }
                None => schema_from_create(&ct)?,
            };
            if core
                .catalog
                .table(&ct.name.database, &ct.name.table)?
                .is_none()
            {
                access::check_table_quota(core, &ct.name.database, 1)?;
            }
            create_table(
                core,
                &ct.name.database,
                &ct.name.table,
                schema,
                options,
                ct.if_not_exists,
            )
            .await?;
            // It may be what a pending flow waits for.
            core.flows.start_pending(core, ctx).await;
            Ok(affected("CREATE TABLE", 0))
        }
        Stmt::AlterTable(at) => alter::alter_table(core, ctx, at).await,
        Stmt::CreateDatabase {
            name,
            if_not_exists,
            options,
        } => {
            let quotas = access::quotas_of(&options)?;
            if let Some(source) = core
                .node_source()
                .filter(|_| !core.catalog.database_exists(&name).unwrap_or(true))
            {
                source
                    .claim_database(&name)
                    .await
                    .map_err(|message| SqlSnafu { message }.build())?;
            }
            let c = core.clone();
            let created = blocking(move || {
                let created = c.catalog.create_database(&c.store, &name, if_not_exists)?;
                if created {
                    c.access.database_created(&c.store, &who, &name, quotas)?;
                }
                Ok(created)
            })
            .await?;
            Ok(affected("CREATE DATABASE", created as u64))
        }
        Stmt::DropTable { names, if_exists } => {
            for n in names {
                drop_table(core, &n.database, &n.table, if_exists).await?;
            }
            Ok(affected("DROP TABLE", 0))
        }
        Stmt::DropDatabase { name, if_exists } => {
            let c = core.clone();
            let released = name.clone();
            let dropped = blocking(move || {
                let dropped = c.catalog.drop_database(&c.store, &name, if_exists)?;
                if dropped.is_some() {
                    c.access.database_dropped(&c.store, &name)?;
                }
                Ok(dropped)
            })
            .await?;
            if dropped.is_some() {
                if let Some(source) = core.node_source() {
                    source.release_database(&released).await;
                }
            }
            for t in dropped.unwrap_or_default() {
                core.forget_defaults(t.id());
                core.flows.table_dropped(core, &t);
            }
            Ok(affected("DROP DATABASE", 0))
        }
        Stmt::ShowTables { database, like } => {
            let database = database.unwrap_or_else(|| DEFAULT_DATABASE.to_string());
            if database == INFORMATION_SCHEMA {
                let names = INFORMATION_SCHEMA_TABLES
                    .iter()
                    .filter(|n| like.as_deref().is_none_or(|p| like_match(p, n)))
                    .map(|n| vec![n.to_string()])
                    .collect();
                return string_rows(&[&tables_column(&database)], names);
            }
            if !core.catalog.database_exists(&database)? {
                return DatabaseNotFoundSnafu {
                    message: format!("database '{database}' does not exist; see SHOW DATABASES"),
                }
                .fail();
            }
            let names: Vec<String> = core
                .catalog
                .tables(&database)?
                .iter()
                .map(|t| t.info.name.clone())
                .filter(|n| like.as_deref().is_none_or(|p| like_match(p, n)))
                .filter(|n| core.access.can_see_table(&who, &database, n))
                .collect();
            string_rows(
                &[&tables_column(&database)],
                names.into_iter().map(|n| vec![n]).collect(),
            )
        }
        Stmt::ShowDatabases { like } => {
            // information_schema too, as GreptimeDB lists it: everyone may
            // read it (each of its tables shows what the user may see).
            let mut names = core.catalog.database_names()?;
            names.push(INFORMATION_SCHEMA.to_string());
            names.sort();
            names.dedup();
            let names: Vec<String> = names
                .into_iter()
                .filter(|n| like.as_deref().is_none_or(|p| like_match(p, n)))
                .filter(|n| n == INFORMATION_SCHEMA || core.access.can_see_database(&who, n))
                .collect();
            string_rows(&["Database"], names.into_iter().map(|n| vec![n]).collect())
        }
        Stmt::ShowCreateTable(name) => {
            let table = core.catalog.require_table(&name.database, &name.table)?;
            string_rows(
                &["Table", "Create Table"],
                vec![vec![table.info.name.clone(), show_create_table(&table)]],
            )
        }
        Stmt::Describe(name) => describe(core, &name),
        // 0 rows, as GreptimeDB reports (whether or not IF [NOT] EXISTS
        // found something to do), like CREATE and DROP TABLE.
        Stmt::CreateFlow(flow) => {
            core.flows.create(core, ctx, flow).await?;
            // Its new sink may be what a pending flow waits for.
            core.flows.start_pending(core, ctx).await;
            Ok(affected("CREATE FLOW", 0))
        }
        Stmt::DropFlow { name, if_exists } => {
            core.flows.drop_flow(core, &name, if_exists).await?;
            Ok(affected("DROP FLOW", 0))
        }
        Stmt::ShowFlows { like } => {
            let names: Vec<Vec<String>> = core
                .flows
                .names()
                .into_iter()
                .filter(|n| like.as_deref().is_none_or(|p| like_match(p, n)))
                .filter(|n| core.flows.check_flow_access(core, &who, n).is_ok())
                .map(|n| vec![n])
                .collect();
            string_rows(&["Flows"], names)
        }
        Stmt::ShowCreateFlow(name) => {
            let def = core.flows.definition(&name)?;
            string_rows(
                &["Flow", "Create Flow"],
                vec![vec![def.name.clone(), def.create_statement()]],
            )
        }
        Stmt::CreateComponent {
            name,
            or_replace,
            source,
        } => {
            let bytes = match source {
                ComponentSource::Bytes(b) => b,
                ComponentSource::Param(n) => {
                    return SqlSnafu {
                        message: format!(
                            "CREATE COMPONENT ... FROM ${n}: the parameter was not bound; send                              the bytes as a bytea parameter"
                        ),
                    }
                    .fail()
                }
            };
            core.flows
                .put_component(core, &who, &name.database, &name.table, bytes, or_replace)
                .await?;
            Ok(affected("CREATE COMPONENT", 0))
        }
        Stmt::DropComponent { name, if_exists } => {
            core.flows.drop_component(core, &name, if_exists).await?;
            Ok(affected("DROP COMPONENT", 0))
        }
        Stmt::ShowComponents { database, like } => {
            let database = database.unwrap_or_else(|| DEFAULT_DATABASE.to_string());
            let rows = crate::flow::components::list(core)?
                .into_iter()
                .filter(|c| c.database == database)
                .filter(|c| like.as_deref().is_none_or(|p| like_match(p, &c.name)))
                .filter(|c| core.access.can_see_database(&who, &c.database))
                .filter_map(|c| {
                    let v = c.latest()?.clone();
                    Some(vec![
                        c.name.clone(),
                        v.version.to_string(),
                        v.digest,
                        v.size.to_string(),
                    ])
                })
                .collect();
            string_rows(&COMPONENT_COLUMNS, rows)
        }
        Stmt::AlterFlowComponent { name, version } => {
            core.flows
                .set_component_version(core, ctx, &name, version)
                .await?;
            Ok(affected("ALTER FLOW", 0))
        }
        Stmt::Admin { function, args } => admin(core, ctx, &function, &args).await,
        // A session changes its own database (Session::use_database); a
        // statement run without one keeps its context's.
        Stmt::Use(database) => {
            if database == INFORMATION_SCHEMA {
                return use_information_schema();
            }
            if !core.catalog.database_exists(&database)? {
                return DatabaseNotFoundSnafu {
                    message: format!("database '{database}' does not exist; see SHOW DATABASES"),
                }
                .fail();
            }
            Ok(affected("USE", 0))
        }
        Stmt::Query(stmt) => run_datafusion(core, ctx, *stmt, None, core.clock.now_ms()).await,
    }
}

pub(crate) use crate::catalog::INFORMATION_SCHEMA;

/// `USE information_schema`: refused, saying how to read it instead.
pub(crate) fn use_information_schema<T>() -> Result<T> {
    UnsupportedSnafu {
        message: "information_schema cannot be the session's database; name its tables \
                  with it, e.g. SELECT * FROM information_schema.tables",
    }
    .fail()
}

/// The tables of `information_schema`, sorted: DataFusion's and sandflow's
/// own (`flow/system.rs`).
const INFORMATION_SCHEMA_TABLES: [&str; 12] = [
    "columns",
    "components",
    "df_settings",
    "flow_logs",
    "flow_statistics",
    "flows",
    "nodes",
    "parameters",
    "routines",
    "schemata",
    "tables",
    "views",
];

/// The columns of `SHOW COMPONENTS`: each component's newest version.
const COMPONENT_COLUMNS: [&str; 4] = ["Component", "Version", "Digest", "Size"];

/// The one result column of `ADMIN FUNCTION('name')`, named as GreptimeDB
/// does (e.g. `ADMIN FLUSH_FLOW('f')`).
fn admin_schema(function: &str, name: &str) -> Arc<Schema> {
    let column = format!("ADMIN {}('{name}')", function.to_uppercase());
    Arc::new(Schema::new(vec![Field::new(
        &column,
        DataType::Int64,
        false,
    )]))
}

/// A one-row, one-integer result of an ADMIN function.
fn admin_output(function: &str, name: &str, value: i64) -> Result<Output> {
    let schema = admin_schema(function, name);
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![Arc::new(datafusion::arrow::array::Int64Array::from(vec![value])) as ArrayRef],
    )
    .map_err(|e| {
        InternalSnafu {
            message: format!("cannot build result: {e}"),
        }
        .build()
    })?;
    Ok(Output::Rows {
        schema,
        batches: vec![batch],
    })
}

/// The result columns of a statement that must not run twice (ADMIN), for
/// clients that ask before executing (PostgreSQL's Describe); `None` for
/// every other statement.
pub fn result_schema_without_running(sql: &str) -> Option<Arc<Schema>> {
    let stmts = parser::parse(sql).ok()?;
    match stmts.as_slice() {
        [Stmt::Admin { function, args }]
            if (function == "flush_flow" || function == "resume_flow") && args.len() == 1 =>
        {
            Some(admin_schema(function, &args[0]))
        }
        _ => None,
    }
}

/// `ADMIN function(args)`.
async fn admin(
    core: &Arc<Core>,
    ctx: &SessionContext,
    function: &str,
    args: &[String],
) -> Result<Output> {
    match function {
        "flush_flow" => {
            let [name] = args else {
                return SqlSnafu {
                    message:
                        "FLUSH_FLOW takes one argument, the flow's name: ADMIN FLUSH_FLOW('name')",
                }
                .fail();
            };
            let rows = core.flows.flush(name).await?;
            admin_output(function, name, rows as i64)
        }
        "pause_flow" => {
            let [name] = args else {
                return SqlSnafu {
                    message:
                        "PAUSE_FLOW takes one argument, the flow's name: ADMIN PAUSE_FLOW('name')",
                }
                .fail();
            };
            let paused = core.flows.pause(core, name).await?;
            admin_output(function, name, paused as i64)
        }
        "resume_flow" => {
            let [name] = args else {
                return SqlSnafu {
                    message: "RESUME_FLOW takes one argument, the flow's name: ADMIN RESUME_FLOW('name')",
                }
                .fail();
            };
            let resumed = core.flows.resume(core, ctx, name).await?;
            admin_output(function, name, resumed as i64)
        }
        // Every commit is durable when it returns, so there is nothing to
        // flush, and no files to compact: 0, as GreptimeDB answers, once the
        // table is found. COMPACT_TABLE takes GreptimeDB's optional strategy
        // and its options after the name.
        "flush_table" | "compact_table" => {
            let name = match (function, args) {
                ("flush_table", [name]) => name,
                ("compact_table", [name, ..]) if args.len() <= 3 => name,
                _ => {
                    return SqlSnafu {
                        message: format!(
                            "{} takes the table's name: ADMIN {}('name'){}",
                            function.to_uppercase(),
                            function.to_uppercase(),
                            if function == "compact_table" {
                                ", optionally followed by a strategy and its options"
                            } else {
                                ""
                            }
                        ),
                    }
                    .fail();
                }
            };
            let session_database = context_database(ctx);
            let (database, table) = match name.split_once('.') {
                Some((d, t)) => (d, t),
                None => (session_database.as_str(), name.as_str()),
            };
            if core.catalog.table(database, table)?.is_none() {
                return NotFoundSnafu {
                    message: format!("table '{name}' does not exist; see SHOW TABLES"),
                }
                .fail();
            }
            admin_output(function, name, 0)
        }
        "move_flow" => {
            let [name, node] = args else {
                return SqlSnafu {
                    message: "MOVE_FLOW takes the flow's name and a node's id: \
                              ADMIN MOVE_FLOW('flow', 'node') (SHOW NODES lists them)",
                }
                .fail();
            };
            core.flows.definition(name)?;
            let Some(source) = core.node_source() else {
                return UnsupportedSnafu {
                    message: "ADMIN MOVE_FLOW needs a cluster: this server runs alone (start it \
                              with --etcd, --node-id and --nats)",
                }
                .fail();
            };
            source
                .move_flow(name, node)
                .await
                .map_err(|message| SqlSnafu { message }.build())?;
            admin_output(function, name, 1)
        }
        other => UnsupportedSnafu {
            message: format!(
                "ADMIN {other} is not supported; supported: ADMIN FLUSH_FLOW('name'), \
                 ADMIN PAUSE_FLOW('name'), ADMIN RESUME_FLOW('name'), ADMIN FLUSH_TABLE('table'), \
                 ADMIN COMPACT_TABLE('table'), ADMIN MOVE_FLOW('flow', 'node')"
            ),
        }
        .fail(),
    }
}

/// Plans and runs a statement with DataFusion; `now()` is `now_ms`.
async fn run_datafusion(
    core: &Core,
    ctx: &SessionContext,
    stmt: datafusion::sql::sqlparser::ast::Statement,
    params: Option<ParamValues>,
    now_ms: i64,
) -> Result<Output> {
    let state = state_at(ctx, now_ms);
    let mut plan = plan_statement_in(core, &state, stmt).await?;
    if let Some(values) = params {
        plan = plan.with_param_values(values).map_err(from_df)?;
    }
    let tag = match &plan {
        LogicalPlan::Dml(dml) => match dml.op {
            WriteOp::Insert(_) => Some("INSERT"),
            WriteOp::Delete => Some("DELETE"),
            WriteOp::Update => Some("UPDATE"),
            _ => Some("INSERT"),
        },
        _ => None,
    };
    // DDL and statements are refused by `sql_options`; anything else runs
    // in the state whose clock was set.
    let df = match plan {
        LogicalPlan::Ddl(_) | LogicalPlan::Statement(_) => {
            ctx.execute_logical_plan(plan).await.map_err(from_df)?
        }
        plan => datafusion::dataframe::DataFrame::new(state, plan),
    };
    // The schema of the plan that runs: the analyser's coercions (a UNION
    // of an integer and a float, CASE branches of two types) are in it, not
    // in the plan as written, and the batches have its types.
    let task = Arc::new(df.task_ctx());
    let physical = df.create_physical_plan().await.map_err(from_df)?;
    let schema = physical.schema();
    let batches = datafusion::physical_plan::collect(physical, task)
        .await
        .map_err(from_df)?;
    match tag {
        Some(tag) => {
            let rows = batches
                .iter()
                .filter(|b| b.num_columns() > 0)
                .filter_map(|b| b.column(0).as_any().downcast_ref::<UInt64Array>().cloned())
                .map(|a| a.iter().flatten().sum::<u64>())
                .sum();
            Ok(affected(tag, rows))
        }
        None => Ok(Output::Rows { schema, batches }),
    }
}

/// Creates a table after checking its column defaults.
pub(crate) async fn create_table(
    core: &Arc<Core>,
    database: &str,
    name: &str,
    schema: TableSchema,
    options: BTreeMap<String, String>,
    if_not_exists: bool,
) -> Result<(Arc<Table>, bool)> {
    schema.validate()?;
    for c in &schema.columns {
        core.eval_default(c, 1)?;
    }
    let mut options = options;
    if schema.append_mode {
        options.insert("append_mode".into(), "true".into());
    }
    let (c, database, name) = (core.clone(), database.to_string(), name.to_string());
    blocking(move || {
        c.catalog
            .create_table(&c.store, &database, &name, schema, options, if_not_exists)
    })
    .await
}

pub(crate) async fn drop_table(
    core: &Arc<Core>,
    database: &str,
    name: &str,
    if_exists: bool,
) -> Result<bool> {
    let (c, database, name) = (core.clone(), database.to_string(), name.to_string());
    let dropped = blocking(move || {
        let dropped = c
            .catalog
            .drop_table(&c.store, &database, &name, if_exists)?;
        if dropped.is_some() {
            c.access.table_dropped(&c.store, &database, &name)?;
        }
        Ok(dropped)
    })
    .await?;
    if let Some(t) = &dropped {
        core.forget_defaults(t.id());
        // As in GreptimeDB, a flow's table may go: the flow fails, naming it.
        core.flows.table_dropped(core, t);
    }
    Ok(dropped.is_some())
}

/// GreptimeDB's settings of its own storage engine (memtables, compaction,
/// SST files, WAL) that change no result. sandflow's storage has none of
/// those parts: a table takes them, SHOW CREATE TABLE shows them, nothing
/// else reads them. `storage` (where rows are kept) and the file and
/// metric engines' keys would change what a table is, and are refused.
pub(crate) const TUNING_OPTIONS: [&str; 23] = [
    "write_buffer_size",
    "auto_flush_interval",
    "compaction.type",
    "compaction.override",
    "compaction.twcs.trigger_file_num",
    "compaction.twcs.max_output_file_size",
    "compaction.twcs.time_window",
    "compaction.twcs.remote_compaction",
    "compaction.twcs.fallback_to_local",
    "index.inverted_index.ignore_column_ids",
    "index.inverted_index.segment_row_count",
    "memtable.type",
    "memtable.bulk.merge_threshold",
    "memtable.bulk.encode_row_threshold",
    "memtable.bulk.encode_bytes_threshold",
    "memtable.bulk.max_merge_groups",
    "memtable.partition_tree.index_max_keys_per_shard",
    "memtable.partition_tree.data_freeze_threshold",
    "memtable.partition_tree.fork_dictionary_bytes",
    "sst_format",
    "max_row_group_row_count",
    "skip_wal",
    "repartition.column.hint",
];

/// [`TUNING_OPTIONS`] in a few words, for messages.
const TUNING_SUMMARY: &str = "write_buffer_size, auto_flush_interval, compaction.*, memtable.*, \
     index.inverted_index.*, sst_format, max_row_group_row_count, skip_wal, \
     'repartition.column.hint'";

/// Whether `k` is one of GreptimeDB's storage settings ([`TUNING_OPTIONS`]).
pub(crate) fn is_tuning_option(k: &str) -> bool {
    TUNING_OPTIONS.contains(&k)
}

/// The value kept for storage setting `k`: as written, once it is not
/// empty (`skip_wal` must be a boolean: sandflow writes every commit to
/// disk before it answers, whatever it says).
pub(crate) fn tuning_value(k: &str, v: &str) -> Result<String> {
    let v = v.trim();
    if v.is_empty() {
        return SqlSnafu {
            message: format!("table option '{k}' needs a value"),
        }
        .fail();
    }
    let bad = |what: &str| {
        SqlSnafu {
            message: format!("{k} must be {what}, not '{v}'"),
        }
        .fail()
    };
    match k {
        "skip_wal" if !matches!(v.to_ascii_lowercase().as_str(), "true" | "false") => {
            return bad("'true' or 'false'");
        }
        "auto_flush_interval" | "compaction.twcs.time_window" => {
            match humantime::parse_duration(v) {
                Ok(d) if !d.is_zero() => {}
                _ => return bad("a duration longer than 0, such as '5m' or '1h'"),
            }
        }
        "write_buffer_size" | "compaction.twcs.max_output_file_size" if !is_size(v) => {
            return bad("a size, such as '64MiB' or '1GB'");
        }
        "compaction.twcs.trigger_file_num" | "max_row_group_row_count"
            if !v.parse::<u64>().is_ok_and(|n| n > 0) =>
        {
            return bad("a whole number above 0");
        }
        _ => {}
    }
    Ok(v.to_string())
}

/// Whether `v` is a size as GreptimeDB reads one: a number, then a unit of
/// bytes (`B`, `KB`, `KiB`, ... `PiB`, any case) or none.
fn is_size(v: &str) -> bool {
    let unit_at = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, unit) = v.split_at(unit_at);
    let unit = unit.trim().to_ascii_lowercase();
    number.parse::<f64>().is_ok()
        && matches!(
            unit.as_str(),
            "" | "b"
                | "k"
                | "kb"
                | "kib"
                | "m"
                | "mb"
                | "mib"
                | "g"
                | "gb"
                | "gib"
                | "t"
                | "tb"
                | "tib"
                | "p"
                | "pb"
                | "pib"
        )
}

/// The value stored for table option `k` (`merge_mode` or `ttl`) given as
/// `v`; `None` when it is the default (nothing stored). Other names are
/// refused.
pub(crate) fn row_option(k: &str, v: &str) -> Result<Option<String>> {
    let sql_fail = |message: String| Err(SqlSnafu { message }.build());
    match k {
        // GreptimeDB's: which of the versions of a row (same primary key and
        // time index) a read sees. `last_row`, the default, is what sandflow
        // always does.
        "merge_mode" => match v.trim().to_ascii_lowercase().as_str() {
            "last_row" | "" => Ok(None),
            "last_non_null" => Ok(Some("last_non_null".to_string())),
            _ => sql_fail(format!(
                "merge_mode must be 'last_row' or 'last_non_null', not '{v}'"
            )),
        },
        "ttl" => match v.trim().to_ascii_lowercase().as_str() {
            TTL_INSTANT => Ok(Some(TTL_INSTANT.to_string())),
            // Rows are kept forever anyway.
            "forever" | "" => Ok(None),
            other => {
                crate::schema::interval::parse_interval(other).map_err(|e| {
                    SqlSnafu {
                        message: format!(
                            "ttl: {e}; use a duration such as '7d' or '12 hours', \
                             'instant' or 'forever'"
                        ),
                    }
                    .build()
                })?;
                Ok(Some(other.to_string()))
            }
        },
        _ => UnsupportedSnafu {
            message: format!(
                "table option '{k}' cannot be changed by ALTER TABLE; it sets and unsets \
                 merge_mode, ttl and GreptimeDB's storage settings ({TUNING_SUMMARY})"
            ),
        }
        .fail(),
    }
}

/// Turns a parsed CREATE TABLE into a table schema and options.
pub fn schema_from_create(ct: &CreateTable) -> Result<(TableSchema, BTreeMap<String, String>)> {
    let table = &ct.name;
    let sql_fail = |message: String| Err(SqlSnafu { message }.build());
    let inline_ts: Vec<&str> = ct
        .columns
        .iter()
        .filter(|c| c.time_index)
        .map(|c| c.name.as_str())
        .collect();
    let time_index = match (inline_ts.as_slice(), &ct.time_index) {
        ([], None) => {
            return sql_fail(format!(
                "table '{table}' has no time index; mark one TIMESTAMP column with TIME INDEX, \
                 e.g. `ts TIMESTAMP TIME INDEX`, or add `TIME INDEX (ts)`"
            ))
        }
        ([one], None) => one.to_string(),
        ([], Some(c)) => c.clone(),
        ([one], Some(c)) if *one == c.as_str() => c.clone(),
        _ => {
            return sql_fail(format!(
                "table '{table}' can have only one TIME INDEX column"
            ))
        }
    };
    let inline_pk: Vec<&str> = ct
        .columns
        .iter()
        .filter(|c| c.primary_key)
        .map(|c| c.name.as_str())
        .collect();
    if inline_pk.len() > 1 {
        // GreptimeDB refuses it too: the order of a composite key is the
        // constraint's to say.
        return sql_fail(format!(
            "table '{table}' marks {} columns PRIMARY KEY inline; a key of several columns is \
             declared once, as PRIMARY KEY ({})",
            inline_pk.len(),
            inline_pk.join(", ")
        ));
    }
    let primary_key: Vec<String> = match (&ct.primary_key, inline_pk.is_empty()) {
        (Some(pk), true) => pk.clone(),
        (None, _) => inline_pk.iter().map(|s| s.to_string()).collect(),
        (Some(_), false) => {
            return sql_fail(format!(
                "table '{table}' declares PRIMARY KEY both on columns and as a constraint; use one"
            ))
        }
    };
    for name in primary_key.iter().chain(std::iter::once(&time_index)) {
        if !ct.columns.iter().any(|c| &c.name == name) {
            return sql_fail(format!(
                "column '{name}' in TIME INDEX / PRIMARY KEY is not defined in table '{table}'"
            ));
        }
    }
    let mut columns = Vec::with_capacity(ct.columns.len());
    for c in &ct.columns {
        let is_ts = c.name == time_index;
        if is_ts && c.nullable == Some(true) {
            return sql_fail(format!("time index column '{}' cannot be NULL", c.name));
        }
        if is_ts && !c.data_type.is_timestamp() {
            return sql_fail(format!(
                "time index column '{}' must be a TIMESTAMP, not {}",
                c.name,
                c.data_type.sql_name()
            ));
        }
        columns.push(ColumnSchema {
            name: c.name.clone(),
            data_type: c.data_type,
            nullable: !is_ts && c.nullable.unwrap_or(true),
            default: c.default.as_ref().map(|e| e.to_string()),
            comment: c.comment.clone(),
            index: c.index.clone(),
        });
    }
    let mut append_mode = false;
    let mut options = BTreeMap::new();
    for (k, v) in &ct.options {
        match k.as_str() {
            "append_mode" => {
                append_mode = match v.to_ascii_lowercase().as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return sql_fail(format!(
                            "append_mode must be 'true' or 'false', not '{v}'"
                        ))
                    }
                };
                if append_mode {
                    options.insert(k.clone(), "true".to_string());
                }
            }
            "merge_mode" | "ttl" => {
                if let Some(value) = row_option(k, v)? {
                    options.insert(k.clone(), value);
                }
            }
            // GreptimeDB's table comment: kept and shown by SHOW CREATE TABLE.
            "comment" => {
                options.insert(k.clone(), v.clone());
            }
            k if is_tuning_option(k) => {
                options.insert(k.to_string(), tuning_value(k, v)?);
            }
            _ => {
                return UnsupportedSnafu {
                    message: format!(
                        "table option '{k}' is not supported; supported: append_mode, \
                         merge_mode, ttl, comment, and GreptimeDB's storage settings \
                         ({TUNING_SUMMARY}), which are kept but change nothing"
                    ),
                }
                .fail()
            }
        }
    }
    if append_mode && options.contains_key("merge_mode") {
        return sql_fail(
            "merge_mode = 'last_non_null' merges the versions of a row, and an append-mode \
             table keeps every version: choose one of the two options"
                .to_string(),
        );
    }
    let pk: Vec<&str> = primary_key.iter().map(String::as_str).collect();
    let mut schema = TableSchema::new(columns, &time_index, &pk, append_mode)?;
    schema.partition = ct.partition.clone();
    Ok((schema, options))
}

fn string_rows(columns: &[&str], rows: Vec<Vec<String>>) -> Result<Output> {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(*c, DataType::Utf8, false))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = (0..columns.len())
        .map(|i| {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r[i].as_str()),
            )) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), arrays).map_err(|e| {
        InternalSnafu {
            message: format!("cannot build result: {e}"),
        }
        .build()
    })?;
    Ok(Output::Rows {
        schema,
        batches: vec![batch],
    })
}

fn describe(core: &Core, name: &TableName) -> Result<Output> {
    let table = core.catalog.require_table(&name.database, &name.table)?;
    let schema = table.schema();
    let rows = schema
        .columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let semantic = schema.semantic_type(i);
            let key = if semantic == crate::catalog::SemanticType::Field {
                ""
            } else {
                "PRI"
            };
            vec![
                c.name.clone(),
                c.data_type.display_name().to_string(),
                key.to_string(),
                if c.nullable { "YES" } else { "NO" }.to_string(),
                c.default.as_deref().map(shown_default).unwrap_or_default(),
                semantic.as_str().to_string(),
            ]
        })
        .collect();
    string_rows(&DESCRIBE_COLUMNS, rows)
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// GreptimeDB-style `SHOW CREATE TABLE` text (parses back to the same table).
pub fn show_create_table(table: &Table) -> String {
    let schema = table.schema();
    let mut lines = Vec::new();
    for c in &schema.columns {
        let mut line = format!(
            "  {} {} {}",
            quote(&c.name),
            c.data_type.sql_name(),
            if c.nullable { "NULL" } else { "NOT NULL" }
        );
        if let Some(d) = &c.default {
            line.push_str(&format!(" DEFAULT {}", shown_default(d)));
        }
        if let Some(index) = &c.index {
            line.push_str(&format!(" {index}"));
        }
        if let Some(comment) = &c.comment {
            line.push_str(&format!(" COMMENT '{}'", comment.replace('\'', "''")));
        }
        lines.push(line);
    }
    lines.push(format!(
        "  TIME INDEX ({})",
        quote(&schema.time_index_column().name)
    ));
    if !schema.primary_key.is_empty() {
        let pk: Vec<String> = schema
            .primary_key_names()
            .iter()
            .map(|n| quote(n))
            .collect();
        lines.push(format!("  PRIMARY KEY ({})", pk.join(", ")));
    }
    // GreptimeDB's layout: the partition rules, or an empty line, then the
    // engine, then the options (if any) sorted by name, a table's
    // description first, keys with a dot quoted.
    let mut out = format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}\n)\n{}\nENGINE=mito\n",
        quote(&table.info.name),
        lines.join(",\n"),
        schema.partition.as_deref().unwrap_or_default()
    );
    let options = &table.info.options;
    let description = table
        .info
        .description
        .as_ref()
        .filter(|_| !options.contains_key("comment"))
        .map(|d| ("'comment'".to_string(), d.clone()));
    let opts: Vec<String> = description
        .into_iter()
        .chain(options.iter().map(|(k, v)| {
            let key = if k.contains('.') {
                format!("'{k}'")
            } else {
                k.clone()
            };
            let value = if k == "ttl" { shown_ttl(v) } else { v.clone() };
            (key, value)
        }))
        .map(|(k, v)| format!("  {k} = '{}'", v.replace('\'', "''")))
        .collect();
    if !opts.is_empty() {
        out.push_str(&format!("WITH(\n{}\n)", opts.join(",\n")));
    }
    out
}

/// A column's DEFAULT as GreptimeDB shows it: `CURRENT_TIMESTAMP` in any
/// case, with or without parentheses, as `current_timestamp()`; anything
/// else as written.
pub(crate) fn shown_default(default: &str) -> String {
    let lower = default.trim().to_ascii_lowercase();
    match lower.as_str() {
        "current_timestamp" | "current_timestamp()" => "current_timestamp()".to_string(),
        "now()" => lower,
        _ => default.to_string(),
    }
}

/// A stored `ttl` as GreptimeDB shows it: a duration in its largest units
/// (`7d` as `7days`, `90 minutes` as `1h 30m`); `instant` as it is.
fn shown_ttl(ttl: &str) -> String {
    match crate::schema::interval::parse_interval(ttl) {
        Ok(ms) if ms > 0 => {
            humantime::format_duration(std::time::Duration::from_millis(ms as u64)).to_string()
        }
        _ => ttl.to_string(),
    }
}
