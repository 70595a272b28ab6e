//! The PostgreSQL wire-protocol front door.
//!
//! datafusion-postgres does the protocol work (pg_catalog for psql's `\d`,
//! SET/SHOW variables, transactions, cursors, parameter decoding). We wrap its
//! handlers: every statement is routed (see [`sqltext::route`]) either to
//! datafusion-postgres over the database's session context, or to
//! [`Database::execute`] for sandflow's own statements and for everything that
//! writes. The extended protocol keeps datafusion-postgres' statement type in
//! the portal store (its hooks expect it); statements for the database are
//! stored with a marker prefix on their text and, when they return rows, a
//! `LogicalPlan::EmptyRelation` carrying the result schema for Describe.

use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{DFSchema, ParamValues, ScalarValue};
use datafusion::logical_expr::{EmptyRelation, LogicalPlan};
use datafusion::sql::sqlparser;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use datafusion_postgres::arrow_pg::datatypes::{
    arrow_schema_to_pg_fields, encode_recordbatch, into_pg_type,
};
use datafusion_postgres::{DfSessionService, Parser as DfParser};
use futures::Sink;
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::database::{Database, Output};
use crate::error::Error;
use crate::server::metrics::FrontDoor;
use crate::server::pg_catalog::pg_session_context;
use crate::server::sqltext::{self, Route};

/// datafusion-postgres' prepared-statement type.
pub type DfStatement = (String, Option<(sqlparser::ast::Statement, LogicalPlan)>);

/// Prefix on the stored text of statements that run through the database.
const DB_MARKER: &str = "/*sandflow:db*/";

/// How long shutdown waits for statements in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// The SQLSTATE for a sandflow error.
pub fn sqlstate(e: &Error) -> &'static str {
    let msg = e.to_string().to_ascii_lowercase();
    #[allow(unreachable_patterns)]
    match e {
        Error::Sql { .. } => {
            if msg.contains("not found") || msg.contains("does not exist") {
                if msg.contains("column") || msg.contains("field") {
                    "42703"
                } else {
                    "42P01"
                }
            } else if msg.contains("already exists") {
                "42P07"
            } else {
                "42601"
            }
        }
        Error::NotFound { .. } => {
            if msg.contains("column") || msg.contains("field") {
                "42703"
            } else if msg.contains("table") || msg.contains("relation") {
                "42P01"
            } else {
                "42704"
            }
        }
        Error::Unsupported { .. } => "0A000",
        // statement_too_complex: the statement guard, not a syntax error.
        Error::TooComplex { .. } => "54001",
        Error::InvalidData { .. } => {
            if msg.contains("null") {
                "23502"
            } else if msg.contains("already exists") {
                "42P07"
            } else {
                "22000"
            }
        }
        Error::Storage { .. } => "58030",
        Error::Flow { .. } => "38000",
        Error::Internal { .. } => "XX000",
        _ => "XX000",
    }
}

fn user_error(code: &str, message: impl Into<String>) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "ERROR".to_owned(),
        code.to_owned(),
        message.into(),
    )))
}

fn db_error(e: Error) -> PgWireError {
    user_error(sqlstate(&e), e.to_string())
}

/// Gives datafusion-postgres' opaque `ApiError`s a SQLSTATE by their text.
fn map_df_error(e: PgWireError) -> PgWireError {
    match e {
        PgWireError::ApiError(inner) => {
            let msg = inner.to_string();
            let lower = msg.to_ascii_lowercase();
            let code = if lower.contains("sql error")
                || lower.contains("parsererror")
                || lower.contains("parser error")
            {
                "42601"
            } else if lower.contains("table") && lower.contains("not found") {
                "42P01"
            } else if lower.contains("no field named")
                || lower.contains("column") && lower.contains("not found")
            {
                "42703"
            } else if lower.contains("not implemented") || lower.contains("unsupported") {
                "0A000"
            } else if lower.contains("internal error") {
                "XX000"
            } else if lower.contains("error during planning") || lower.contains("schema error") {
                "42000"
            } else if lower.contains("cast error") || lower.contains("arrow error") {
                "22000"
            } else {
                "XX000"
            };
            user_error(code, msg)
        }
        other => other,
    }
}

/// A command tag the way PostgreSQL spells it: `INSERT 0 n`, `DELETE n`, ...
pub fn command_tag(tag: &str, rows: u64) -> Tag {
    let rows = rows as usize;
    match tag {
        "INSERT" => Tag::new("INSERT").with_oid(0).with_rows(rows),
        "DELETE" | "UPDATE" | "SELECT" | "MOVE" | "FETCH" | "COPY" | "MERGE" => {
            Tag::new(tag).with_rows(rows)
        }
        other => Tag::new(other),
    }
}

fn encode_rows(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
    format: &Format,
    options: Arc<FormatOptions>,
) -> PgWireResult<QueryResponse> {
    let fields = Arc::new(arrow_schema_to_pg_fields(schema, format, Some(options))?);
    let mut rows = Vec::new();
    for batch in batches {
        rows.extend(encode_recordbatch(fields.clone(), batch));
    }
    Ok(QueryResponse::new(fields, futures::stream::iter(rows)))
}

fn output_response(
    out: Output,
    format: &Format,
    options: Arc<FormatOptions>,
) -> PgWireResult<Response> {
    match out {
        Output::Rows { schema, batches } => Ok(Response::Query(encode_rows(
            &schema, batches, format, options,
        )?)),
        Output::Affected { tag, rows } => Ok(Response::Execution(command_tag(&tag, rows))),
    }
}

/// Shutdown flag and in-flight statement count of the PostgreSQL front door.
#[derive(Default)]
pub struct Lifecycle {
    shutting_down: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

pub struct InFlight(Arc<Lifecycle>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Lifecycle {
    fn begin(self: &Arc<Self>) -> PgWireResult<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self.clone());
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(user_error(
                "57P01",
                "terminating connection due to administrator command",
            ));
        }
        Ok(guard)
    }

    /// Refuses new statements and waits (up to `timeout`) for running ones.
    pub async fn drain(&self, timeout: Duration) -> bool {
        self.shutting_down.store(true, Ordering::SeqCst);
        let wait = async {
            loop {
                let notified = self.idle.notified();
                if self.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait).await.is_ok()
    }
}

/// The query parser: routes Parse messages, keeping datafusion-postgres'
/// statement type.
pub struct SfParser {
    db: Arc<Database>,
    inner: Arc<DfParser>,
    placeholder: sqlparser::ast::Statement,
}

impl SfParser {
    fn db_statement(
        sql: &str,
        plan: Option<(sqlparser::ast::Statement, LogicalPlan)>,
    ) -> DfStatement {
        (format!("{DB_MARKER}{sql}"), plan)
    }

    /// A statement for the database that returns rows: runs it once (with
    /// NULL for every parameter) to learn the result schema for Describe.
    async fn rows_statement(&self, sql: &str) -> PgWireResult<DfStatement> {
        let n = sqltext::param_count(sql);
        let probe = if n > 0 {
            sqltext::bind_params(sql, &vec!["NULL".to_string(); n])
                .map_err(|m| user_error("08P01", m))?
        } else {
            sql.to_string()
        };
        let known = crate::sql::result_schema_without_running(&probe);
        let outputs = match known {
            // Never run a statement with effects (ADMIN) just to learn its columns.
            Some(schema) => vec![Output::Rows {
                schema,
                batches: vec![],
            }],
            None => self.db.execute(&probe).await.map_err(db_error)?,
        };
        let plan = match outputs.into_iter().last() {
            Some(Output::Rows { schema, .. }) => {
                let df_schema = DFSchema::try_from(schema.as_ref().clone())
                    .map_err(|e| user_error("XX000", e.to_string()))?;
                Some((
                    self.placeholder.clone(),
                    LogicalPlan::EmptyRelation(EmptyRelation {
                        produce_one_row: false,
                        schema: Arc::new(df_schema),
                    }),
                ))
            }
            _ => None,
        };
        Ok(Self::db_statement(sql, plan))
    }
}

#[async_trait]
impl QueryParser for SfParser {
    type Statement = DfStatement;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        // datafusion-postgres parses with sqlparser too: same nesting guard as the database.
        crate::sql::parser::check_nesting(sql).map_err(db_error)?;
        match sqltext::route(sql) {
            Route::DataFusion => match self.inner.parse_sql(client, sql, types).await {
                Ok(s) => Ok(s),
                Err(e) if sqltext::is_query(sql) => {
                    debug!("DataFusion cannot plan {sql:?} ({e}); trying the database");
                    self.rows_statement(sql).await.map(Some)
                }
                Err(e) if !sqltext::is_session_statement(sql) => {
                    // Not DataFusion's: the database runs it at Execute
                    // (and reports its own error if it cannot).
                    debug!("DataFusion cannot parse {sql:?} ({e}); leaving it to the database");
                    Ok(Some(Self::db_statement(sql, None)))
                }
                Err(e) => Err(map_df_error(e)),
            },
            Route::Database { returns_rows: true } => self.rows_statement(sql).await.map(Some),
            Route::Database {
                returns_rows: false,
            } => {
                // Plan with DataFusion only to learn parameter types
                // (INSERT ... VALUES ($1, $2)); run by the database.
                let plan = if sqltext::param_count(sql) > 0 {
                    match self.inner.parse_sql(client, sql, types).await {
                        Ok(Some((_, Some((stmt, plan)))))
                            if !matches!(plan, LogicalPlan::EmptyRelation(_)) =>
                        {
                            Some((stmt, plan))
                        }
                        _ => None,
                    }
                } else {
                    None
                };
                Ok(Some(Self::db_statement(sql, plan)))
            }
        }
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        if let Some(sql) = stmt.0.strip_prefix(DB_MARKER) {
            match &stmt.1 {
                Some((_, plan)) if !matches!(plan, LogicalPlan::EmptyRelation(_)) => {
                    self.inner.get_parameter_types(stmt)
                }
                _ => Ok(vec![Type::UNKNOWN; sqltext::param_count(sql)]),
            }
        } else {
            self.inner.get_parameter_types(stmt)
        }
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        self.inner.get_result_schema(stmt, column_format)
    }
}

/// The session service: simple and extended query handlers.
pub struct PgService {
    db: Arc<Database>,
    inner: Arc<DfSessionService>,
    parser: Arc<SfParser>,
    metrics: FrontDoor,
    lifecycle: Arc<Lifecycle>,
}

impl PgService {
    async fn run_database(
        &self,
        sql: &str,
        options: Arc<FormatOptions>,
    ) -> PgWireResult<Vec<Response>> {
        let outputs = self.db.execute(sql).await.map_err(db_error)?;
        outputs
            .into_iter()
            .map(|o| output_response(o, &Format::UnifiedText, options.clone()))
            .collect()
    }

    async fn run_simple<C>(&self, client: &mut C, sql: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        crate::sql::parser::check_nesting(sql).map_err(db_error)?;
        match sqltext::route(sql) {
            Route::Database { .. } => self.run_database(sql, options).await,
            Route::DataFusion => {
                match SimpleQueryHandler::do_query(self.inner.as_ref(), client, sql).await {
                    Ok(r) => Ok(r),
                    Err(e) if !sqltext::is_session_statement(sql) => {
                        debug!("DataFusion cannot run {sql:?} ({e}); trying the database");
                        self.run_database(sql, options).await
                    }
                    Err(e) => Err(map_df_error(e)),
                }
            }
        }
    }

    async fn run_extended<C>(
        &self,
        client: &mut C,
        portal: &Portal<DfStatement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = DfStatement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmt = &portal.statement.statement;
        let Some(sql) = stmt.0.strip_prefix(DB_MARKER) else {
            return ExtendedQueryHandler::do_query(self.inner.as_ref(), client, portal, max_rows)
                .await
                .map_err(map_df_error);
        };
        let sql = if portal.parameter_len() > 0 {
            let literals = decode_literals(portal)?;
            sqltext::bind_params(sql, &literals).map_err(|m| user_error("08P01", m))?
        } else {
            sql.to_string()
        };
        let described_rows = matches!(&stmt.1, Some((_, LogicalPlan::EmptyRelation(_))));
        let outputs = self.db.execute(&sql).await.map_err(db_error)?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        match outputs.into_iter().last() {
            None => Ok(Response::EmptyQuery),
            Some(Output::Rows { batches, .. }) if !described_rows => {
                // Described as returning nothing: report the count only.
                let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                Ok(Response::Execution(Tag::new("SELECT").with_rows(n)))
            }
            Some(out) => output_response(out, &portal.result_column_format, options),
        }
    }
}

/// Decodes the bound parameters of a database statement and renders each as
/// a SQL literal.
fn decode_literals(portal: &Portal<DfStatement>) -> PgWireResult<Vec<String>> {
    let n = portal.parameter_len();
    let mut inferred: Vec<Option<DataType>> = vec![None; n];
    if let Some((_, plan)) = &portal.statement.statement.1 {
        if !matches!(plan, LogicalPlan::EmptyRelation(_)) {
            if let Ok(types) = plan.get_parameter_types() {
                for (name, ty) in types {
                    if let Some(i) = name
                        .strip_prefix('$')
                        .and_then(|d| d.parse::<usize>().ok())
                        .and_then(|i| i.checked_sub(1))
                    {
                        if i < n {
                            inferred[i] = ty;
                        }
                    }
                }
            }
        }
    }
    let server: Vec<Option<Type>> = inferred
        .iter()
        .map(|t| t.as_ref().and_then(|t| into_pg_type(t).ok()))
        .collect();
    let inferred_refs: Vec<Option<&DataType>> = inferred.iter().map(|t| t.as_ref()).collect();
    let server_refs: Vec<Option<&Type>> = server.iter().map(|t| t.as_ref()).collect();
    let values = deserialize_parameters_with_server_types(portal, &inferred_refs, &server_refs)?;
    let scalars: Vec<ScalarValue> = match values {
        ParamValues::List(v) => v.into_iter().map(|s| s.value).collect(),
        ParamValues::Map(_) => {
            return Err(user_error("08P01", "named parameters are not supported"))
        }
    };
    scalars.iter().map(scalar_literal).collect()
}

/// A scalar as a SQL literal the database's parser reads back to the same
/// value.
pub fn scalar_literal(v: &ScalarValue) -> PgWireResult<String> {
    use datafusion::arrow::temporal_conversions as tc;
    if v.is_null() {
        return Ok("NULL".into());
    }
    let ts = |dt: Option<chrono::NaiveDateTime>, tz: &Option<Arc<str>>| -> PgWireResult<String> {
        let dt = dt.ok_or_else(|| user_error("22008", "timestamp parameter out of range"))?;
        let text = dt.format("%Y-%m-%dT%H:%M:%S%.f").to_string();
        Ok(if tz.is_some() {
            sqltext::quote_literal(&format!("{text}Z"))
        } else {
            sqltext::quote_literal(&text)
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
        | ScalarValue::Utf8View(Some(s)) => sqltext::quote_literal(s),
        ScalarValue::TimestampSecond(Some(x), tz) => ts(tc::timestamp_s_to_datetime(*x), tz)?,
        ScalarValue::TimestampMillisecond(Some(x), tz) => ts(tc::timestamp_ms_to_datetime(*x), tz)?,
        ScalarValue::TimestampMicrosecond(Some(x), tz) => ts(tc::timestamp_us_to_datetime(*x), tz)?,
        ScalarValue::TimestampNanosecond(Some(x), tz) => ts(tc::timestamp_ns_to_datetime(*x), tz)?,
        ScalarValue::Date32(Some(d)) => {
            let date = tc::date32_to_datetime(*d)
                .ok_or_else(|| user_error("22008", "date parameter out of range"))?;
            sqltext::quote_literal(&date.format("%Y-%m-%d").to_string())
        }
        ScalarValue::Binary(Some(b)) | ScalarValue::LargeBinary(Some(b)) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("X'{hex}'")
        }
        other => sqltext::quote_literal(&other.to_string()),
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

#[async_trait]
impl SimpleQueryHandler for PgService {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let _in_flight = self.lifecycle.begin()?;
        let statements = sqltext::split_statements(query);
        if statements.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        let mut responses = Vec::with_capacity(statements.len());
        for sql in statements {
            self.metrics.requests.inc();
            match self.run_simple(client, &sql).await {
                Ok(mut r) => responses.append(&mut r),
                Err(e) => {
                    self.metrics.errors.inc();
                    debug!("statement failed: {sql:?}: {e}");
                    // Earlier statements' results stay; the rest is skipped,
                    // as PostgreSQL does.
                    responses.push(Response::Error(Box::new(ErrorInfo::from(e))));
                    break;
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl ExtendedQueryHandler for PgService {
    type Statement = DfStatement;
    type QueryParser = SfParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let _in_flight = self.lifecycle.begin()?;
        self.metrics.requests.inc();
        let r = self.run_extended(client, portal, max_rows).await;
        if let Err(e) = &r {
            self.metrics.errors.inc();
            debug!("extended statement failed: {e}");
        }
        r
    }
}

pub struct StartupHandler {
    db: Arc<Database>,
    connections: Arc<ConnectionManager>,
}

#[async_trait]
impl NoopStartupHandler for StartupHandler {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.connections.clone())
    }

    /// Statements always run in `public` for now. A connection that names
    /// another existing database is refused, rather than silently running its
    /// statements in `public`. Names that are no database (psql's default, the
    /// user name; `postgres`) keep connecting to `public`.
    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: pgwire::messages::PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let named = client
            .metadata()
            .get(pgwire::api::METADATA_DATABASE)
            .cloned()
            .unwrap_or_default();
        if let Some(message) = self.db.unsupported_session_database(&named) {
            return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "FATAL".to_owned(),
                "0A000".to_owned(),
                message,
            ))));
        }
        Ok(())
    }
}

/// Everything a connection needs; one per server.
pub struct PgHandlers {
    service: Arc<PgService>,
    startup: Arc<StartupHandler>,
    cancel: Arc<DefaultCancelHandler>,
}

impl PgWireServerHandlers for PgHandlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.service.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.service.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.startup.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.cancel.clone()
    }
}

impl PgHandlers {
    /// Installs pg_catalog into the database's session context and builds
    /// the handlers.
    pub fn new(db: Arc<Database>) -> crate::Result<PgHandlers> {
        let ctx = pg_session_context(&db.session_context()).map_err(|e| Error::Internal {
            message: format!("cannot install pg_catalog: {e}"),
        })?;
        let inner = Arc::new(DfSessionService::new(Arc::new(ctx)));
        let placeholder = sqlparser::parser::Parser::parse_sql(
            &sqlparser::dialect::PostgreSqlDialect {},
            "SELECT 1",
        )
        .ok()
        .and_then(|mut v| v.pop())
        .ok_or_else(|| Error::Internal {
            message: "cannot build placeholder statement".into(),
        })?;
        let parser = Arc::new(SfParser {
            db: db.clone(),
            inner: inner.query_parser(),
            placeholder,
        });
        let connections = Arc::new(ConnectionManager::new());
        Ok(PgHandlers {
            service: Arc::new(PgService {
                db: db.clone(),
                inner,
                parser,
                metrics: FrontDoor::new("postgres"),
                lifecycle: Arc::new(Lifecycle::default()),
            }),
            startup: Arc::new(StartupHandler {
                db: db.clone(),
                connections: connections.clone(),
            }),
            cancel: Arc::new(DefaultCancelHandler::new(connections)),
        })
    }

    pub fn lifecycle(&self) -> Arc<Lifecycle> {
        self.service.lifecycle.clone()
    }
}

struct ConnGauge(FrontDoor);

impl Drop for ConnGauge {
    fn drop(&mut self) {
        self.0.connections.dec();
    }
}

/// Serves connections from `listener` until `shutdown` turns true, then
/// stops accepting, lets running statements finish and closes the
/// connections.
pub async fn serve(
    listener: TcpListener,
    handlers: Arc<PgHandlers>,
    mut shutdown: watch::Receiver<bool>,
) {
    let metrics = handlers.service.metrics.clone();
    let mut conns = JoinSet::new();
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let handlers = handlers.clone();
                    metrics.connections.inc();
                    let gauge = ConnGauge(metrics.clone());
                    conns.spawn(async move {
                        let _gauge = gauge;
                        let _ = socket.set_nodelay(true);
                        if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
                            debug!("postgres connection from {peer} ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    warn!("postgres accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    info!("PostgreSQL server stops accepting; draining statements in flight");
    if !handlers.lifecycle().drain(DRAIN_TIMEOUT).await {
        warn!("statements still running after {DRAIN_TIMEOUT:?}; closing anyway");
    }
    conns.abort_all();
    while conns.join_next().await.is_some() {}
    info!("PostgreSQL server stopped");
}

/// Binds the PostgreSQL front door.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::sqlstate;

    #[test]
    fn nesting_guard_is_statement_too_complex_and_syntax_errors_stay_42601() {
        let deep = format!("SELECT {}1{}", "(".repeat(70), ")".repeat(70));
        let e = crate::sql::parser::check_nesting(&deep).unwrap_err();
        assert_eq!(sqlstate(&e), "54001", "{e}");
        let e = crate::sql::parser::parse("SELEC 1").unwrap_err();
        assert_eq!(sqlstate(&e), "42601", "{e}");
    }
}
