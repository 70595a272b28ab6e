//! The PostgreSQL wire-protocol front door.
//!
//! pgwire does the protocol; every statement runs in the connection's
//! [`Session`] (its settings, its transaction), parsed once by sandflow's
//! parser with the PostgreSQL dialect: the text is split at the `;` tokens of
//! that parser's tokenizer and each piece is parsed by it, so what is split is
//! what runs. Queries from drivers and psql pass through datafusion-postgres'
//! pg_catalog compatibility rewrites; nothing else of DataFusion's SQL surface
//! is reachable (no DataFusion DDL, no file access, no `SET datafusion.*`).
//!
//! Per connection: a session, a cancel handle (a CancelRequest or the
//! client going away stops the running statement), and a COPY FROM STDIN in
//! progress. [`conn`] checks every message's bytes before pgwire decodes them.
//!
//! Must not know storage, the catalog or flows: it talks to [`Database`] and
//! [`Session`] only.

pub mod conn;

use std::collections::HashMap;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::Statement as SqlStatement;
use datafusion_postgres::arrow_pg::datatypes::df::deserialize_parameters_with_server_types;
use datafusion_postgres::arrow_pg::datatypes::{
    arrow_schema_to_pg_fields, encode_recordbatch, into_pg_type,
};
use datafusion_postgres::arrow_pg::encoder::encode_value;
use datafusion_postgres::datafusion_pg_catalog::sql::PostgresCompatibilityParser;
use futures::{Sink, SinkExt};
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    CopyCsvOptions, CopyEncoder, CopyResponse, CopyTextOptions, FieldInfo, QueryResponse, Response,
    Tag,
};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    PgWireServerHandlers, Type, DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::{Bind, BindComplete, Sync as PgSync};
use pgwire::messages::response::{NoticeResponse, ReadyForQuery, TransactionStatus};
use pgwire::messages::startup::ParameterStatus;
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch, Mutex, Notify, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::auth::Gate;
use crate::pg_catalog::pg_session_context;
use conn::{Hangup, Marker};
use sandflow::auth::scram::ScramExchange;
use sandflow::auth::Principal;
use sandflow::database::{Database, Output};
use sandflow::error::Error;
use sandflow::metrics::FrontDoor;
use sandflow::session::{
    Dialect, Session, SessionDefaults, Statement, StatementKind, TransactionStatus as SessionStatus,
};
use sandflow::sql::copy::{CopyFormat, CopySpec};

/// How long shutdown waits for statements in flight.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings of the PostgreSQL door.
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Connections served at once; the next one is refused with 53300.
    pub max_connections: usize,
    /// A client must finish its startup (and, later, authentication) within this.
    pub startup_timeout: Duration,
    /// Settings of new sessions.
    pub session: SessionDefaults,
    /// TLS for clients that send an SSLRequest (`None`: refused with 'N').
    pub tls: Option<crate::tls::Tls>,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            max_connections: 512,
            startup_timeout: Duration::from_secs(60),
            session: SessionDefaults::default(),
            tls: None,
        }
    }
}

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
            } else if msg.contains("invalid value for parameter") {
                "22023"
            } else {
                "42601"
            }
        }
        // undefined_object, duplicate_object, duplicate_table,
        // invalid_catalog_name
        Error::FlowNotFound { .. } => "42704",
        Error::FlowExists { .. } => "42710",
        Error::TableExists { .. } => "42P07",
        // invalid_name
        Error::InvalidName { .. } => "42602",
        Error::DatabaseNotFound { .. } => "3D000",
        Error::NotFound { .. } => {
            if msg.contains("configuration parameter") {
                "42704"
            } else if msg.contains("column") || msg.contains("field") {
                "42703"
            } else if msg.contains("table") || msg.contains("relation") {
                "42P01"
            } else {
                "42704"
            }
        }
        Error::Unsupported { .. } => {
            if msg.contains("cannot be changed") {
                "55P02"
            } else {
                "0A000"
            }
        }
        // statement_too_complex: the statement guard, not a syntax error.
        Error::TooComplex { .. } => "54001",
        // serialization_failure: run it again.
        Error::Conflict { .. } => "40001",
        Error::PermissionDenied { .. } => "42501",
        Error::AuthFailed { .. } => "28P01",
        Error::Cancelled { .. } => "57014",
        Error::Transaction { .. } => {
            if msg.contains("aborted") {
                "25P02"
            } else {
                "25001"
            }
        }
        Error::InvalidEncoding { .. } => "22021",
        // configuration_limit_exceeded
        Error::LimitExceeded { .. } => "53400",
        Error::InvalidData { .. } => {
            if msg.contains("null") && !msg.contains("0x00") {
                "23502"
            } else if msg.contains("already exists") {
                "42P07"
            } else {
                "22000"
            }
        }
        Error::ComponentExists { .. } => "42710",
        Error::ComponentNotFound { .. } => "42704",
        // invalid_function_definition, as for a CREATE FUNCTION body
        Error::InvalidComponent { .. } => "42P13",
        // program_limit_exceeded
        Error::TooLarge { .. } => "54000",
        // dependent_objects_still_exist
        Error::InUse { .. } => "2BP01",
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

/// A statement's output as a pgwire response. BEGIN, COMMIT and ROLLBACK
/// carry the transaction status change.
fn response(out: Output, format: &Format, options: Arc<FormatOptions>) -> PgWireResult<Response> {
    match out {
        Output::Rows { schema, batches } => Ok(Response::Query(encode_rows(
            &schema, batches, format, options,
        )?)),
        Output::Affected { tag, rows } => Ok(match tag.as_str() {
            "BEGIN" | "START TRANSACTION" => Response::TransactionStart(Tag::new(&tag)),
            "COMMIT" | "ROLLBACK" => Response::TransactionEnd(Tag::new(&tag)),
            _ => Response::Execution(command_tag(&tag, rows)),
        }),
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

/// A `COPY ... FROM STDIN` waiting for its data.
struct CopyIn {
    spec: CopySpec,
    columns: usize,
    data: Vec<u8>,
}

/// What one connection has: its session, its cancel handle, a COPY in
/// progress.
struct Conn {
    session: Mutex<Session>,
    cancel: Arc<ConnectionHandle>,
    hangup: Option<Arc<Hangup>>,
    copy_in: Mutex<Option<CopyIn>>,
    _registration: ConnectionGuard,
    /// Counts against the user's connection limit while the connection lives.
    _user: crate::auth::UserSlot,
}

impl Conn {
    /// A receiver that fires when the running statement must stop: a cancel
    /// request for this connection, or the client going away.
    async fn stop_signal(&self) -> (oneshot::Receiver<()>, tokio::task::JoinHandle<()>) {
        let cancel = self.cancel.start_query().await;
        let hangup = self.hangup.clone();
        let (tx, rx) = oneshot::channel();
        let watcher = tokio::spawn(async move {
            let gone = async {
                match hangup {
                    Some(h) => h.wait().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                r = cancel => if r.is_ok() { let _ = tx.send(()); },
                _ = gone => { let _ = tx.send(()); }
            }
        });
        (rx, watcher)
    }
}

fn conn_of<C: ClientInfo + ?Sized>(client: &C) -> PgWireResult<Arc<Conn>> {
    client
        .session_extensions()
        .get::<Arc<Conn>>()
        .map(|c| c.as_ref().clone())
        .ok_or_else(|| user_error("08003", "the connection has no session; reconnect"))
}

/// A prepared statement of the extended protocol.
#[derive(Debug)]
pub struct PgStatement {
    /// `None` for an empty query string.
    stmt: Option<Statement>,
    /// Parameter types as told to the client.
    params: Vec<Type>,
    /// Parameter types as DataFusion infers them (to decode the values).
    param_types: Vec<Option<DataType>>,
    /// The result columns; `None` for statements without rows.
    columns: Option<SchemaRef>,
}

/// Everything the handlers share; one per server.
pub struct PgService {
    db: Arc<Database>,
    base: SessionContext,
    defaults: SessionDefaults,
    metrics: FrontDoor,
    lifecycle: Arc<Lifecycle>,
    connections: Arc<ConnectionManager>,
    marker: Marker,
    rewriter: Arc<PostgresCompatibilityParser>,
    gate: Arc<Gate>,
}

/// The marker's error, if `text` carries one (see [`conn::Marker`]).
fn marked(marker: &Marker, text: &str) -> PgWireResult<()> {
    match marker.error(text) {
        Some((code, message)) => Err(user_error(&code, message)),
        None => Ok(()),
    }
}

impl PgService {
    /// Parses with the session; queries pass through the pg_catalog rewrites.
    async fn parse(&self, session: &Session, sql: &str) -> PgWireResult<Vec<Statement>> {
        let mut statements = session.parse(sql).await.map_err(db_error)?;
        for s in &mut statements {
            if s.kind() == StatementKind::Rows {
                if let Ok(mut rewritten) = self.rewriter.parse(s.text()) {
                    if let [SqlStatement::Query(_)] = rewritten.as_slice() {
                        if let Some(q) = rewritten.pop() {
                            s.replace_query(q);
                        }
                    }
                }
            }
        }
        Ok(statements)
    }

    /// Sends the session's notices and changed settings to the client.
    async fn report<C>(&self, client: &mut C, session: &mut Session) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        for notice in session.take_notices() {
            let (severity, text) = match notice.split_once(": ") {
                Some((s @ ("WARNING" | "NOTICE"), t)) => (s.to_string(), t.to_string()),
                _ => ("NOTICE".to_string(), notice),
            };
            let code = if severity == "WARNING" {
                "01000"
            } else {
                "00000"
            };
            client
                .feed(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                    ErrorInfo::new(severity, code.to_string(), text),
                )))
                .await?;
        }
        for (name, value) in session.take_reported() {
            if name == "DateStyle" || name == "TimeZone" || name == "IntervalStyle" {
                client.metadata_mut().insert(name.clone(), value.clone());
            }
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    name, value,
                )))
                .await?;
        }
        Ok(())
    }

    /// Starts a COPY: TO STDOUT runs its query and streams the rows; FROM
    /// STDIN waits for the client's data (see [`CopyHandler`]).
    async fn start_copy(
        &self,
        conn: &Conn,
        session: &mut Session,
        stmt: &Statement,
    ) -> PgWireResult<Response> {
        let spec = stmt
            .copy_spec()
            .ok_or_else(|| user_error("XX000", "not a COPY statement"))?
            .map_err(db_error)?;
        if spec.to_client {
            let (stop, watcher) = conn.stop_signal().await;
            let out = session.copy_out(&spec, Some(stop)).await;
            watcher.abort();
            let (schema, batches) = match out.map_err(db_error)? {
                Output::Rows { schema, batches } => (schema, batches),
                Output::Affected { .. } => {
                    return Err(user_error("XX000", "COPY's query returned no rows"))
                }
            };
            return copy_out_response(&spec.format, &schema, batches);
        }
        let columns = match &spec.data {
            sandflow::sql::copy::CopyData::Table { table, columns } => {
                if columns.is_empty() {
                    self.db
                        .table(&format!("{}.{}", table.database, table.table))
                        .map_err(db_error)?
                        .schema()
                        .columns
                        .len()
                } else {
                    columns.len()
                }
            }
            sandflow::sql::copy::CopyData::Query(_) => {
                return Err(user_error("42601", "COPY FROM needs a table"))
            }
        };
        *conn.copy_in.lock().await = Some(CopyIn {
            spec,
            columns,
            data: Vec::new(),
        });
        Ok(Response::CopyIn(CopyResponse::new(
            0,
            columns,
            futures::stream::empty(),
        )))
    }
}

/// COPY TO STDOUT's data, one CopyData per row (and a CSV header).
fn copy_out_response(
    format: &CopyFormat,
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
) -> PgWireResult<Response> {
    let fields = Arc::new(arrow_schema_to_pg_fields(
        schema,
        &Format::UnifiedText,
        None,
    )?);
    let mut encoder = match format {
        CopyFormat::Text { delimiter, null } => CopyEncoder::new_text(
            fields.clone(),
            CopyTextOptions {
                delimiter: delimiter.to_string().into(),
                null_string: null.as_str().into(),
            },
        ),
        CopyFormat::Csv {
            delimiter,
            quote,
            escape,
            null,
            ..
        } => CopyEncoder::new_csv(
            fields.clone(),
            CopyCsvOptions {
                delimiter: delimiter.to_string().into(),
                quote: quote.to_string().into(),
                escape: escape.to_string().into(),
                null_string: null.as_str().into(),
                force_quote: Vec::new(),
            },
        ),
    };
    let mut out: Vec<PgWireResult<CopyData>> = Vec::new();
    if let CopyFormat::Csv {
        header: true,
        delimiter,
        ..
    } = format
    {
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        out.push(Ok(CopyData::new(
            format!("{}\n", names.join(&delimiter.to_string())).into(),
        )));
    }
    for batch in &batches {
        for row in 0..batch.num_rows() {
            for (i, field) in schema.fields().iter().enumerate() {
                encode_value(&mut encoder, batch.column(i), row, field, &fields[i])?;
            }
            out.push(Ok(encoder.take_copy()));
        }
    }
    Ok(Response::CopyOut(CopyResponse::new(
        0,
        schema.fields().len(),
        futures::stream::iter(out),
    )))
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
        self.metrics.requests.inc();
        let conn = conn_of(client)?;
        let mut session = conn.session.lock().await;
        let result = self.simple(client, &conn, &mut session, query).await;
        self.report(client, &mut session).await?;
        if result.is_err() {
            self.metrics.errors.inc();
            session.statement_failed();
        }
        result
    }
}

impl PgService {
    async fn simple<C>(
        &self,
        client: &mut C,
        conn: &Conn,
        session: &mut Session,
        query: &str,
    ) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        marked(&self.marker, query)?;
        let mut statements = self.parse(session, query).await?;
        if statements.is_empty() {
            return Ok(vec![Response::EmptyQuery]);
        }
        let copy_at = statements
            .iter()
            .position(|s| matches!(s.kind(), StatementKind::CopyIn | StatementKind::CopyOut));
        let copy = match copy_at {
            Some(i) if i + 1 == statements.len() => statements.pop(),
            Some(_) => {
                return Err(user_error(
                    "0A000",
                    "COPY must be the last statement of a query string",
                ))
            }
            None => None,
        };
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        let (stop, watcher) = conn.stop_signal().await;
        let outcome = session.run_script(statements, Some(stop)).await;
        watcher.abort();
        let mut responses = Vec::with_capacity(outcome.outputs.len() + 1);
        for out in outcome.outputs {
            responses.push(response(out, &Format::UnifiedText, options.clone())?);
        }
        if let Some(e) = outcome.error {
            debug!("statement failed: {e}");
            self.metrics.errors.inc();
            responses.push(Response::Error(Box::new(ErrorInfo::from(db_error(e)))));
            return Ok(responses);
        }
        if let Some(copy) = copy {
            match self.start_copy(conn, session, &copy).await {
                Ok(r) => responses.push(r),
                Err(e) => {
                    session.statement_failed();
                    responses.push(Response::Error(Box::new(ErrorInfo::from(e))));
                }
            }
        }
        Ok(responses)
    }
}

#[async_trait]
impl QueryParser for PgService {
    type Statement = Arc<PgStatement>;

    async fn parse_sql<C>(
        &self,
        client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Self::Statement>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        marked(&self.marker, sql)?;
        let conn = conn_of(client)?;
        let mut session = conn.session.lock().await;
        let parsed = self.prepare(&session, sql, types).await;
        if parsed.is_err() {
            session.statement_failed();
        }
        parsed.map(Some)
    }

    fn get_parameter_types(&self, stmt: &Self::Statement) -> PgWireResult<Vec<Type>> {
        Ok(stmt.params.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &Self::Statement,
        column_format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match &stmt.columns {
            Some(schema) => arrow_schema_to_pg_fields(
                schema,
                column_format.unwrap_or(&Format::UnifiedText),
                None,
            ),
            None => Ok(Vec::new()),
        }
    }
}

impl PgService {
    async fn prepare(
        &self,
        session: &Session,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Arc<PgStatement>> {
        let mut statements = self.parse(session, sql).await?;
        let stmt = match statements.len() {
            0 => {
                return Ok(Arc::new(PgStatement {
                    stmt: None,
                    params: Vec::new(),
                    param_types: Vec::new(),
                    columns: None,
                }))
            }
            1 => statements.remove(0),
            _ => {
                return Err(user_error(
                    "42601",
                    "cannot insert multiple commands into a prepared statement",
                ))
            }
        };
        if matches!(stmt.kind(), StatementKind::CopyIn | StatementKind::CopyOut) {
            return Err(user_error(
                "0A000",
                "COPY runs in the simple query protocol only (as psql's \\copy sends it)",
            ));
        }
        let description = session.describe(&stmt).await.map_err(db_error)?;
        let n = description.params.len().max(types.len());
        let mut params = Vec::with_capacity(n);
        let mut param_types = Vec::with_capacity(n);
        for i in 0..n {
            let inferred = description.params.get(i).cloned().flatten();
            let told = types
                .get(i)
                .cloned()
                .flatten()
                .filter(|t| *t != Type::UNKNOWN);
            let wire = match (&told, &inferred) {
                (Some(t), _) => t.clone(),
                (None, Some(dt)) => into_pg_type(dt).unwrap_or(Type::UNKNOWN),
                (None, None) => Type::UNKNOWN,
            };
            params.push(wire);
            param_types.push(inferred);
        }
        Ok(Arc::new(PgStatement {
            stmt: Some(stmt),
            params,
            param_types,
            columns: description.columns,
        }))
    }
}

#[async_trait]
impl ExtendedQueryHandler for PgService {
    type Statement = Arc<PgStatement>;
    type QueryParser = PgService;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        Arc::new(self.clone_shallow())
    }

    async fn on_bind<C>(&self, client: &mut C, message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement_name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        marked(&self.marker, statement_name)?;
        let portal_name = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
        let statement = match client.portal_store().get_statement(statement_name) {
            Some(pgwire::api::store::Entry::Value(s)) => s,
            Some(pgwire::api::store::Entry::Empty) => {
                if !message.parameters.is_empty() {
                    return Err(user_error(
                        "08P01",
                        format!(
                            "bind message supplies {} parameters, but prepared statement \"{}\" requires 0",
                            message.parameters.len(),
                            statement_name
                        ),
                    ));
                }
                client
                    .portal_store()
                    .put_empty_portal(message.portal_name.as_deref().unwrap_or(DEFAULT_NAME));
                client
                    .send(PgWireBackendMessage::BindComplete(BindComplete::new()))
                    .await?;
                return Ok(());
            }
            None => return Err(PgWireError::StatementNotFound(statement_name.to_owned())),
        };
        let expected = statement.statement.params.len();
        if message.parameters.len() != expected {
            return Err(user_error(
                "08P01",
                format!(
                    "bind message supplies {} parameters, but prepared statement \"{}\" requires {expected}",
                    message.parameters.len(),
                    statement_name
                ),
            ));
        }
        let portal = Portal::try_new(&message, statement)?;
        client.portal_store().put_portal(Arc::new(portal));
        debug!("bound portal {portal_name:?} to {statement_name:?}");
        client
            .send(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
    }

    async fn on_sync<C>(&self, client: &mut C, _message: PgSync) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        client.portal_store().rm_portal(DEFAULT_NAME);
        // The session is the truth about the transaction.
        if let Ok(conn) = conn_of(client) {
            let status = match conn.session.lock().await.transaction_status() {
                SessionStatus::Idle => TransactionStatus::Idle,
                SessionStatus::InBlock => TransactionStatus::Transaction,
                SessionStatus::Failed => TransactionStatus::Error,
            };
            client.set_transaction_status(status);
        }
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                client.transaction_status(),
            )))
            .await?;
        client.flush().await?;
        Ok(())
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Self::Statement>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let _in_flight = self.lifecycle.begin()?;
        self.metrics.requests.inc();
        let prepared = portal.statement.statement.clone();
        let Some(stmt) = &prepared.stmt else {
            return Ok(Response::EmptyQuery);
        };
        let conn = conn_of(client)?;
        let mut session = conn.session.lock().await;
        let params = if portal.parameter_len() > 0 {
            let inferred: Vec<Option<&DataType>> =
                prepared.param_types.iter().map(|t| t.as_ref()).collect();
            let wire: Vec<Option<&Type>> = prepared.params.iter().map(Some).collect();
            match deserialize_parameters_with_server_types(portal, &inferred, &wire) {
                Ok(v) => Some(v),
                Err(e) => {
                    session.statement_failed();
                    self.metrics.errors.inc();
                    return Err(parameter_error(e));
                }
            }
        } else {
            None
        };
        let (stop, watcher) = conn.stop_signal().await;
        let result = session.run(stmt, params, Some(stop)).await;
        watcher.abort();
        self.report(client, &mut session).await?;
        let options = Arc::new(FormatOptions::from_client_metadata(client.metadata()));
        match result {
            Ok(Output::Rows { batches, .. }) if prepared.columns.is_none() => {
                // Described as returning nothing: report the count only.
                let n: usize = batches.iter().map(|b| b.num_rows()).sum();
                Ok(Response::Execution(Tag::new("SELECT").with_rows(n)))
            }
            Ok(out) => response(out, &portal.result_column_format, options),
            Err(e) => {
                self.metrics.errors.inc();
                debug!("extended statement failed: {e}");
                Err(db_error(e))
            }
        }
    }
}

/// A parameter that cannot be decoded: text that is not UTF-8 (22021), or a
/// value that does not fit its type (22P02).
fn parameter_error(e: PgWireError) -> PgWireError {
    let text = e.to_string();
    let lower = text.to_ascii_lowercase();
    if lower.contains("utf-8") || lower.contains("utf8") {
        user_error(
            "22021",
            format!("invalid byte sequence for encoding \"UTF8\" in a parameter: {text}"),
        )
    } else {
        user_error("22P02", format!("invalid parameter value: {text}"))
    }
}

impl PgService {
    fn clone_shallow(&self) -> PgService {
        PgService {
            db: self.db.clone(),
            base: self.base.clone(),
            defaults: self.defaults.clone(),
            metrics: self.metrics.clone(),
            lifecycle: self.lifecycle.clone(),
            connections: self.connections.clone(),
            marker: self.marker.clone(),
            rewriter: self.rewriter.clone(),
            gate: self.gate.clone(),
        }
    }
}

#[async_trait]
impl CopyHandler for PgService {
    async fn on_copy_data<C>(&self, client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let conn = conn_of(client)?;
        let mut copy = conn.copy_in.lock().await;
        if let Some(c) = copy.as_mut() {
            if c.data.len() + copy_data.data.len() > conn::MAX_MESSAGE {
                *copy = None;
                return Err(user_error(
                    "54000",
                    format!(
                        "COPY FROM STDIN data exceeds {} bytes in one statement; split it into \
                         several COPYs",
                        conn::MAX_MESSAGE
                    ),
                ));
            }
            c.data.extend_from_slice(&copy_data.data);
        }
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let conn = conn_of(client)?;
        let Some(copy) = conn.copy_in.lock().await.take() else {
            return Err(user_error("08P01", "CopyDone without a COPY FROM STDIN"));
        };
        let mut session = conn.session.lock().await;
        let result = async {
            let rows = sandflow::sql::copy::decode(&copy.spec.format, &copy.data, copy.columns)
                .map_err(db_error)?;
            let (stop, watcher) = conn.stop_signal().await;
            let n = session.copy_in(&copy.spec, rows, Some(stop)).await;
            watcher.abort();
            n.map_err(db_error)
        }
        .await;
        match result {
            Ok(n) => {
                client
                    .send(PgWireBackendMessage::CommandComplete(
                        command_tag("COPY", n).into(),
                    ))
                    .await?;
                Ok(())
            }
            Err(e) => {
                session.statement_failed();
                Err(e)
            }
        }
    }

    async fn on_copy_fail<C>(&self, client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Ok(conn) = conn_of(client) {
            *conn.copy_in.lock().await = None;
            conn.session.lock().await.statement_failed();
        }
        user_error("57014", format!("COPY from stdin failed: {}", fail.message))
    }
}

/// Creates each connection's session at startup.
pub struct StartupHandler {
    service: Arc<PgService>,
}

/// Applies connection parameters to a new session: the known settings, and
/// `options` (`-c name=value`). Names that are no setting are ignored.
fn apply_startup_parameters(
    session: &mut Session,
    params: &HashMap<String, String>,
) -> Result<(), Error> {
    for (name, value) in params {
        match name.as_str() {
            "user" | "database" | "replication" => {}
            "options" => {
                let mut words = value.split_whitespace();
                while let Some(w) = words.next() {
                    let pair = match w {
                        "-c" => words.next().unwrap_or_default(),
                        other => other
                            .strip_prefix("-c")
                            .or_else(|| other.strip_prefix("--"))
                            .unwrap_or(""),
                    };
                    if let Some((k, v)) = pair.split_once('=') {
                        session.set(&k.replace('-', "_"), v)?;
                    }
                }
            }
            other => {
                if session.get(other).is_some() {
                    session.set(other, value)?;
                }
            }
        }
    }
    Ok(())
}

/// A connection's login in progress (in the client's session extensions).
#[derive(Default)]
struct Login {
    user: String,
    exchange: Option<ScramExchange>,
}

fn fatal(code: &str, message: String) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        code.to_owned(),
        message,
    )))
}

fn sasl_text(bytes: Option<&[u8]>) -> PgWireResult<String> {
    let bytes = bytes.unwrap_or_default();
    String::from_utf8(bytes.to_vec())
        .map_err(|_| fatal("08P01", "SCRAM message is not UTF-8".into()))
}

#[async_trait]
impl pgwire::api::auth::StartupHandler for StartupHandler {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: pgwire::messages::PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use pgwire::messages::startup::Authentication;
        use pgwire::messages::PgWireFrontendMessage as Msg;
        let gate = &self.service.gate;
        let peer = client.socket_addr().ip();
        match message {
            Msg::Startup(ref startup) => {
                pgwire::api::auth::protocol_negotiation(client, startup).await?;
                pgwire::api::auth::save_startup_parameters_to_metadata(client, startup);
                if !gate.required() {
                    return self.complete(client, Principal::Root).await;
                }
                let user = client
                    .metadata()
                    .get(pgwire::api::METADATA_USER)
                    .cloned()
                    .unwrap_or_default();
                if user.is_empty() {
                    return Err(fatal(
                        "28000",
                        "no user name given: connect with -U name".into(),
                    ));
                }
                client
                    .session_extensions()
                    .insert::<Arc<std::sync::Mutex<Login>>>(Arc::new(std::sync::Mutex::new(
                        Login {
                            user,
                            exchange: None,
                        },
                    )));
                client.set_state(pgwire::api::PgWireConnectionState::AuthenticationInProgress);
                client
                    .send(PgWireBackendMessage::Authentication(Authentication::SASL(
                        vec!["SCRAM-SHA-256".to_string()],
                    )))
                    .await?;
                Ok(())
            }
            Msg::PasswordMessageFamily(msg) => {
                let Some(login) = client
                    .session_extensions()
                    .get::<Arc<std::sync::Mutex<Login>>>()
                    .map(|l| l.as_ref().clone())
                else {
                    return Err(fatal("08P01", "unexpected password message".into()));
                };
                let (user, exchange) = {
                    let mut l = login.lock().unwrap_or_else(|p| p.into_inner());
                    (l.user.clone(), l.exchange.take())
                };
                match exchange {
                    None => {
                        let first = msg.into_sasl_initial_response()?;
                        if first.auth_method != "SCRAM-SHA-256" {
                            return Err(fatal(
                                "28000",
                                format!(
                                    "SASL mechanism {} is not supported; use SCRAM-SHA-256",
                                    first.auth_method
                                ),
                            ));
                        }
                        gate.throttle(peer).await;
                        let text = sasl_text(first.data.as_deref())?;
                        let verifier = self.service.db.access().verifier(&user);
                        let (exchange, server_first) =
                            ScramExchange::start(verifier.as_ref(), &text).map_err(|e| {
                                let e = gate.failed("postgres", &user, peer, &format!("{e:?}"));
                                fatal("28P01", e.to_string())
                            })?;
                        login.lock().unwrap_or_else(|p| p.into_inner()).exchange = Some(exchange);
                        client
                            .send(PgWireBackendMessage::Authentication(
                                Authentication::SASLContinue(server_first.into_bytes().into()),
                            ))
                            .await?;
                        Ok(())
                    }
                    Some(exchange) => {
                        let last = msg.into_sasl_response()?;
                        let text = sasl_text(Some(&last.data))?;
                        match exchange.finish(&text) {
                            Ok(server_final) => {
                                gate.succeeded(peer);
                                client
                                    .feed(PgWireBackendMessage::Authentication(
                                        Authentication::SASLFinal(server_final.into_bytes().into()),
                                    ))
                                    .await?;
                                self.complete(client, Principal::User(user)).await
                            }
                            Err(e) => {
                                let e = gate.failed("postgres", &user, peer, &format!("{e:?}"));
                                Err(fatal("28P01", e.to_string()))
                            }
                        }
                    }
                }
            }
            _ => Ok(()),
        }
    }
}

impl StartupHandler {
    /// Ends a successful login: the session, its settings, the backend key
    /// and ReadyForQuery.
    async fn complete<C>(&self, client: &mut C, who: Principal) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        use pgwire::api::auth::ServerParameterProvider;
        use pgwire::api::PidSecretKeyGenerator;
        let svc = &self.service;
        let slot = svc
            .gate
            .connect(&who)
            .map_err(|e| fatal("53300", e.to_string()))?;
        let (pid, secret) = pgwire::api::RandomPidSecretKeyGenerator::default().generate(client);
        client.set_pid_and_secret_key(pid, secret.clone());
        client
            .feed(PgWireBackendMessage::Authentication(
                pgwire::messages::startup::Authentication::Ok,
            ))
            .await?;
        let defaults = pgwire::api::auth::DefaultServerParameterProvider::default();
        for (k, v) in defaults.server_parameters(client).unwrap_or_default() {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    k, v,
                )))
                .await?;
        }
        client
            .feed(PgWireBackendMessage::BackendKeyData(
                pgwire::messages::startup::BackendKeyData::new(pid, secret.clone()),
            ))
            .await?;
        let named = client
            .metadata()
            .get(pgwire::api::METADATA_DATABASE)
            .cloned()
            .unwrap_or_default();
        // A user's pg_catalog lists only what the user may see: it is built
        // over the session's own (filtered) catalog.
        let base = match &who {
            Principal::Root => svc.base.clone(),
            Principal::User(_) => {
                let probe = svc.db.session_with(
                    &svc.db.session_context(),
                    Dialect::Postgres,
                    &svc.defaults,
                    who.clone(),
                );
                pg_session_context(probe.context())
                    .map_err(|e| fatal("XX000", format!("cannot install pg_catalog: {e}")))?
            }
        };
        let mut session = svc
            .db
            .session_with(&base, Dialect::Postgres, &svc.defaults, who);
        session.set_peer(client.socket_addr());
        // psql names the user's name when no database is given: a database
        // that does not exist is the default one, `public`.
        if svc.db.database_exists(&named) {
            session
                .use_database(&named)
                .map_err(|e| fatal(sqlstate(&e), e.to_string()))?;
        }
        apply_startup_parameters(&mut session, client.metadata())
            .map_err(|e| fatal(sqlstate(&e), e.to_string()))?;
        for (name, value) in session.reported_settings() {
            client
                .feed(PgWireBackendMessage::ParameterStatus(ParameterStatus::new(
                    name, value,
                )))
                .await?;
        }
        let (cancel, registration) = svc.connections.register(pid, secret);
        let hangup = client
            .session_extensions()
            .get::<Arc<Hangup>>()
            .map(|h| h.as_ref().clone());
        client
            .session_extensions()
            .insert::<Arc<Conn>>(Arc::new(Conn {
                session: Mutex::new(session),
                cancel,
                hangup,
                copy_in: Mutex::new(None),
                _registration: registration,
                _user: slot,
            }));
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                TransactionStatus::Idle,
            )))
            .await?;
        client.set_state(pgwire::api::PgWireConnectionState::ReadyForQuery);
        Ok(())
    }
}

/// Everything a connection needs; one per server.
pub struct PgHandlers {
    service: Arc<PgService>,
    startup: Arc<StartupHandler>,
    cancel: Arc<DefaultCancelHandler>,
    options: PgOptions,
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

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.service.clone()
    }
}

impl PgHandlers {
    /// Installs pg_catalog into a context over the database's catalog and
    /// builds the handlers.
    pub fn new(
        db: Arc<Database>,
        options: PgOptions,
        gate: Arc<Gate>,
    ) -> sandflow::Result<PgHandlers> {
        let base = pg_session_context(&db.session_context()).map_err(|e| Error::Internal {
            message: format!("cannot install pg_catalog: {e}"),
        })?;
        let connections = Arc::new(ConnectionManager::new());
        let service = Arc::new(PgService {
            db: db.clone(),
            base,
            defaults: options.session.clone(),
            metrics: FrontDoor::new(db.metrics(), "postgres"),
            lifecycle: Arc::new(Lifecycle::default()),
            connections: connections.clone(),
            marker: Marker::new(),
            rewriter: Arc::new(PostgresCompatibilityParser::new()),
            gate,
        });
        Ok(PgHandlers {
            startup: Arc::new(StartupHandler {
                service: service.clone(),
            }),
            service,
            cancel: Arc::new(DefaultCancelHandler::new(connections)),
            options,
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

/// Refuses a connection past the cap as PostgreSQL does: answers its
/// SSLRequest (with TLS when the server has it, so that a client that
/// requires TLS reads the reason), reads its startup, answers FATAL 53300,
/// closes.
async fn refuse_connection(
    socket: tokio::net::TcpStream,
    max: usize,
    tls: Option<crate::tls::Tls>,
) {
    let work = async {
        let Some((transport, head)) = conn::negotiate(socket, tls.as_ref()).await? else {
            return Ok::<(), std::io::Error>(());
        };
        let message = format!(
            "sorry, too many clients already: {max} connections are open \
             (the server's --max-connections)"
        );
        conn::refuse(transport, head, "53300", &message).await
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), work).await;
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
    let slots = Arc::new(Semaphore::new(handlers.options.max_connections.max(1)));
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
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        warn!("refusing postgres connection from {peer}: {} connections open", handlers.options.max_connections);
                        tokio::spawn(refuse_connection(
                            socket,
                            handlers.options.max_connections,
                            handlers.options.tls.clone(),
                        ));
                        continue;
                    };
                    let handlers = handlers.clone();
                    metrics.connections.inc();
                    let gauge = ConnGauge(metrics.clone());
                    conns.spawn(async move {
                        let _gauge = gauge;
                        let _permit = permit;
                        let marker = handlers.service.marker.clone();
                        let timeout = handlers.options.startup_timeout;
                        let tls = handlers.options.tls.clone();
                        if let Err(e) = conn::serve(socket, peer, handlers, marker, timeout, tls).await {
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
        let e = sandflow::sql::parser::parse(&deep).unwrap_err();
        assert_eq!(sqlstate(&e), "54001", "{e}");
        let e = sandflow::sql::parser::parse("SELEC 1").unwrap_err();
        assert_eq!(sqlstate(&e), "42601", "{e}");
    }
}
