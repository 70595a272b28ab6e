//! The MySQL front door (`--mysql-addr`, default 127.0.0.1:4002, GreptimeDB's
//! port): the `mysql` client and MySQL drivers, over opensrv-mysql.
//!
//! One `Session` per connection, in the generic dialect (as HTTP), so that
//! sandflow's own statements (CREATE FLOW, ADMIN FLUSH_FLOW, SHOW FLOWS) and
//! GreptimeDB's syntax work as on the other doors. Prepared statements
//! (`COM_STMT_PREPARE`) keep their text; at execution each `?` outside
//! literals and quoted names is replaced by the parameter as an SQL literal,
//! and the statement runs like a simple one. What MySQL clients send on
//! their own (`SELECT @@version_comment`, `SET NAMES`, `SET autocommit`,
//! `SELECT DATABASE()`, `SHOW WARNINGS`) is answered here.
//!
//! With a TLS certificate the greeting offers SSL, and a client that asks
//! goes on over TLS; under --require-tls a client that does not is refused
//! with error 3159 (ER_SECURE_TRANSPORT_REQUIRED) before it logs in.
//!
//! Must not know storage, the catalog or flows: only `Database`, `Session`
//! and `Output`.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, NaiveDate, NaiveDateTime};
use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{
    DataType, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, TimeUnit,
    UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::sql::sqlparser::dialect::{GenericDialect, MySqlDialect};
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer};
use opensrv_mysql::{
    AsyncMysqlIntermediary, AsyncMysqlShim, Column, ColumnFlags, ColumnType, ErrorKind, InitWriter,
    IntermediaryOptions, OkResponse, ParamParser, QueryResultWriter, StatementMetaWriter,
    ValueInner,
};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex, Semaphore};
use tracing::{debug, warn};

use sandflow::auth::Principal;
use sandflow::database::{Database, Output};
use sandflow::error::Error;
use sandflow::session::{Session, SessionDefaults};

use crate::tls::Tls;

/// What the server says it is: MySQL 8 compatible, as GreptimeDB does.
const VERSION: &str = "8.4.2-sandflow";

/// Settings of the MySQL door.
#[derive(Debug, Clone)]
pub struct MysqlOptions {
    /// Connections open at once; the next is refused with "too many
    /// connections".
    pub max_connections: usize,
    pub session: SessionDefaults,
    /// Logins.
    pub gate: Arc<crate::auth::Gate>,
    /// TLS offered in the greeting (`None`: not offered).
    pub tls: Option<Tls>,
    /// A client must have logged in within this (as `--startup-timeout`
    /// for PostgreSQL), else its connection is closed and its slot freed.
    pub startup_timeout: std::time::Duration,
}

/// MySQL's ER_SECURE_TRANSPORT_REQUIRED.
const ER_SECURE_TRANSPORT_REQUIRED: u16 = 3159;
/// The refusal of a plaintext login under --require-tls.
pub const TLS_REQUIRED: &str =
    "Connections using insecure transport are prohibited while --require-tls is set";

/// Serves connections from `listener` until `stop` turns true; then the
/// open connections are closed.
pub async fn serve(
    listener: TcpListener,
    db: Arc<Database>,
    options: MysqlOptions,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(options.max_connections.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut next_id: u32 = 1;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                warn!("MySQL accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        while tasks.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let id = next_id;
        next_id = next_id.wrapping_add(1).max(1);
        let permit = permits.clone().try_acquire_owned();
        let (db, options) = (db.clone(), options.clone());
        tasks.spawn(async move {
            let Ok(_permit) = permit else {
                refuse(stream).await;
                return;
            };
            debug!(%peer, "MySQL connection");
            let logged_in = Arc::new(AtomicBool::new(false));
            let timeout = options.startup_timeout;
            // A client that does not log in in time (silent, or stuck in
            // the handshake) is dropped: it must not hold a slot for ever.
            let watchdog = {
                let logged_in = logged_in.clone();
                async move {
                    tokio::time::sleep(timeout).await;
                    if logged_in.load(Ordering::Acquire) {
                        std::future::pending::<()>().await;
                    }
                }
            };
            tokio::select! {
                ended = connection(stream, peer, db, options, id, logged_in) => {
                    if let Err(e) = ended {
                        debug!(%peer, "MySQL connection ended: {e}");
                    }
                }
                () = watchdog => {
                    debug!(%peer, "MySQL client did not log in within {timeout:?}; closing");
                }
            }
        });
    }
    tasks.shutdown().await;
}

/// Answers a connection past the cap with MySQL's "too many connections".
async fn refuse(stream: TcpStream) {
    struct Refuser;
    #[async_trait]
    impl<W: AsyncWrite + Send + Unpin> AsyncMysqlShim<W> for Refuser {
        type Error = io::Error;
        async fn authenticate(&self, _: &str, _: &[u8], _: &[u8], _: &[u8]) -> bool {
            false
        }
        async fn on_prepare<'a>(
            &'a mut self,
            _: &'a str,
            w: StatementMetaWriter<'a, W>,
        ) -> io::Result<()> {
            w.error(ErrorKind::ER_CON_COUNT_ERROR, b"too many connections")
                .await
        }
        async fn on_execute<'a>(
            &'a mut self,
            _: u32,
            _: ParamParser<'a>,
            w: QueryResultWriter<'a, W>,
        ) -> io::Result<()> {
            w.error(ErrorKind::ER_CON_COUNT_ERROR, b"too many connections")
                .await
        }
        async fn on_close<'a>(&'a mut self, _: u32)
        where
            W: 'async_trait,
        {
        }
        async fn on_query<'a>(
            &'a mut self,
            _: &'a str,
            w: QueryResultWriter<'a, W>,
        ) -> io::Result<()> {
            w.error(ErrorKind::ER_CON_COUNT_ERROR, b"too many connections")
                .await
        }
    }
    let (r, w) = stream.into_split();
    let _ = AsyncMysqlIntermediary::run_on(Refuser, r, w).await;
}

async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    db: Arc<Database>,
    options: MysqlOptions,
    id: u32,
    logged_in: Arc<AtomicBool>,
) -> io::Result<()> {
    // Until the login succeeds the session acts as nobody (no user of that
    // name can exist): it may do nothing.
    let session = db.session_with(
        &db.session_context(),
        sandflow::session::Dialect::Generic,
        &options.session,
        Principal::User(String::new()),
    );
    // A fresh scramble per connection (never NUL or '$', which the protocol
    // reserves).
    let salt = {
        use rand::RngExt;
        let mut rng = rand::rng();
        let mut s = [0u8; 20];
        for b in &mut s {
            *b = rng.random_range(1u8..=127);
            if *b == b'$' {
                *b += 1;
            }
        }
        s
    };
    let tls = options.tls.clone();
    let shim = Shim {
        session: Mutex::new(session),
        statements: HashMap::new(),
        next_statement: 1,
        id,
        db,
        options,
        peer,
        salt,
        user: std::sync::Mutex::new(None),
        logged_in,
    };
    let (r, mut w) = stream.into_split();
    let Some(tls) = &tls else {
        return AsyncMysqlIntermediary::run_on(shim, r, w).await;
    };
    let mut shim = shim;
    let config = tls.mysql();
    let (secure, init) =
        AsyncMysqlIntermediary::init_before_ssl(&mut shim, r, &mut w, &Some(config.clone()))
            .await?;
    let opts = IntermediaryOptions::default();
    if secure {
        opensrv_mysql::secure_run_with_options(shim, w, opts, config, init).await
    } else if tls.require() {
        // The client's handshake response was packet `seq`; the answer
        // follows it.
        let seq = init.1.wrapping_add(1);
        w.write_all(&error_packet(
            seq,
            ER_SECURE_TRANSPORT_REQUIRED,
            "HY000",
            TLS_REQUIRED,
        ))
        .await?;
        w.shutdown().await
    } else {
        opensrv_mysql::plain_run_with_options(shim, w, opts, init).await
    }
}

/// An ERR packet: header (length, sequence number), 0xFF, the error code,
/// '#' and the SQLSTATE, the message.
fn error_packet(seq: u8, code: u16, sqlstate: &str, message: &str) -> Vec<u8> {
    let mut payload = vec![0xff];
    payload.extend_from_slice(&code.to_le_bytes());
    payload.push(b'#');
    payload.extend_from_slice(sqlstate.as_bytes());
    payload.extend_from_slice(message.as_bytes());
    let len = payload.len() as u32;
    let mut packet = len.to_le_bytes()[..3].to_vec();
    packet.push(seq);
    packet.extend_from_slice(&payload);
    packet
}

struct Shim {
    session: Mutex<Session>,
    /// Prepared statements: their text.
    statements: HashMap<u32, String>,
    next_statement: u32,
    id: u32,
    db: Arc<Database>,
    options: MysqlOptions,
    peer: std::net::SocketAddr,
    salt: [u8; 20],
    /// The logged-in user's connection slot.
    user: std::sync::Mutex<Option<crate::auth::UserSlot>>,
    /// Set once the login succeeded (the connection's watchdog reads it).
    logged_in: Arc<AtomicBool>,
}

#[async_trait]
impl<W: AsyncWrite + Send + Unpin> AsyncMysqlShim<W> for Shim {
    type Error = io::Error;

    fn version(&self) -> String {
        VERSION.to_string()
    }

    fn connect_id(&self) -> u32 {
        self.id
    }

    fn salt(&self) -> [u8; 20] {
        self.salt
    }

    /// Checks a login; on success the connection's session acts as the user.
    async fn authenticate(
        &self,
        auth_plugin: &str,
        username: &[u8],
        salt: &[u8],
        auth_data: &[u8],
    ) -> bool {
        let gate = &self.options.gate;
        let user = String::from_utf8_lossy(username).to_string();
        let who = if !gate.required() {
            Principal::Root
        } else {
            gate.throttle(self.peer.ip()).await;
            let ok = auth_plugin == "mysql_native_password"
                && self
                    .db
                    .access()
                    .mysql_native(&user)
                    .is_some_and(|h| h.check(salt, auth_data));
            if !ok {
                gate.failed(
                    "mysql",
                    &user,
                    self.peer.ip(),
                    "wrong password or unknown user",
                );
                return false;
            }
            gate.succeeded(self.peer.ip());
            Principal::User(user)
        };
        let slot = match gate.connect(&who) {
            Ok(s) => s,
            Err(e) => {
                warn!(peer = %self.peer, "MySQL login refused: {e}");
                return false;
            }
        };
        let session = self.db.session_with(
            &self.db.session_context(),
            sandflow::session::Dialect::Generic,
            &self.options.session,
            who,
        );
        let mut session = session;
        session.set_peer(self.peer);
        *self.session.lock().await = session;
        *self.user.lock().unwrap_or_else(|p| p.into_inner()) = Some(slot);
        self.logged_in.store(true, Ordering::Release);
        true
    }

    async fn on_prepare<'a>(
        &'a mut self,
        query: &'a str,
        info: StatementMetaWriter<'a, W>,
    ) -> io::Result<()> {
        let params = match placeholders(query) {
            Ok(n) => n,
            Err(e) => return info.error(ErrorKind::ER_PARSE_ERROR, e.as_bytes()).await,
        };
        let id = self.next_statement;
        self.next_statement = self.next_statement.wrapping_add(1).max(1);
        self.statements.insert(id, query.to_string());
        let param = Column {
            table: String::new(),
            column: "?".to_string(),
            coltype: ColumnType::MYSQL_TYPE_VAR_STRING,
            colflags: ColumnFlags::empty(),
        };
        let params: Vec<Column> = vec![param; params];
        info.reply(id, &params, &[]).await
    }

    async fn on_execute<'a>(
        &'a mut self,
        id: u32,
        params: ParamParser<'a>,
        results: QueryResultWriter<'a, W>,
    ) -> io::Result<()> {
        let Some(text) = self.statements.get(&id).cloned() else {
            return results
                .error(
                    ErrorKind::ER_UNKNOWN_STMT_HANDLER,
                    format!("unknown prepared statement {id}; prepare it again").as_bytes(),
                )
                .await;
        };
        let mut literals = Vec::new();
        for p in params {
            match literal(p.value.into_inner()) {
                Ok(l) => literals.push(l),
                Err(e) => {
                    return results
                        .error(ErrorKind::ER_WRONG_ARGUMENTS, e.as_bytes())
                        .await
                }
            }
        }
        let sql = match bind(&text, &literals) {
            Ok(s) => s,
            Err(e) => {
                return results
                    .error(ErrorKind::ER_WRONG_ARGUMENTS, e.as_bytes())
                    .await
            }
        };
        self.run(&sql, results).await
    }

    async fn on_close<'a>(&'a mut self, stmt: u32)
    where
        W: 'async_trait,
    {
        self.statements.remove(&stmt);
    }

    async fn on_query<'a>(
        &'a mut self,
        query: &'a str,
        results: QueryResultWriter<'a, W>,
    ) -> io::Result<()> {
        let query = standard_strings(query);
        self.run(&query, results).await
    }

    async fn on_init<'a>(&'a mut self, database: &'a str, w: InitWriter<'a, W>) -> io::Result<()> {
        if database.is_empty() {
            // Some drivers name no database at connect: the default one.
            return w.ok().await;
        }
        let used = self.session.lock().await.use_database(database);
        match used {
            Ok(()) => w.ok().await,
            Err(e) => {
                w.error(ErrorKind::ER_BAD_DB_ERROR, e.to_string().as_bytes())
                    .await
            }
        }
    }
}

impl Shim {
    async fn run<W: AsyncWrite + Send + Unpin>(
        &mut self,
        sql: &str,
        results: QueryResultWriter<'_, W>,
    ) -> io::Result<()> {
        debug!("MySQL: {sql}");
        if let Some(answer) = client_chatter(sql) {
            return match answer {
                Chatter::Ok => results.completed(OkResponse::default()).await,
                Chatter::Rows(columns, row) => {
                    let cols: Vec<Column> = columns.iter().map(|c| text_column(c)).collect();
                    let mut w = results.start(&cols).await?;
                    if let Some(row) = row {
                        for v in row {
                            w.write_col(v)?;
                        }
                        w.end_row().await?;
                    }
                    w.finish().await
                }
            };
        }
        let outputs = self.session.lock().await.execute(sql).await;
        let outputs = match outputs {
            Ok(o) => o,
            Err(e) => {
                return results
                    .error(error_kind(&e), e.to_string().as_bytes())
                    .await
            }
        };
        // The column lists live as long as the writer that sends them.
        let columns: Vec<Vec<Column>> = outputs
            .iter()
            .map(|out| match out {
                Output::Rows { schema, .. } => schema
                    .fields()
                    .iter()
                    .map(|f| Column {
                        table: String::new(),
                        column: f.name().clone(),
                        coltype: column_type(f.data_type()),
                        colflags: if f.data_type().is_unsigned_integer() {
                            ColumnFlags::UNSIGNED_FLAG
                        } else {
                            ColumnFlags::empty()
                        },
                    })
                    .collect(),
                Output::Affected { .. } => Vec::new(),
            })
            .collect();
        let n = outputs.len();
        let mut results = results;
        for (i, (out, cols)) in outputs.into_iter().zip(&columns).enumerate() {
            let last = i + 1 == n;
            match out {
                Output::Affected { rows, .. } => {
                    let ok = OkResponse {
                        affected_rows: rows,
                        ..OkResponse::default()
                    };
                    if last {
                        return results.completed(ok).await;
                    }
                    results = results.complete_one(ok).await?;
                }
                Output::Rows { batches, schema } => {
                    let mut w = results.start(cols).await?;
                    for b in &batches {
                        // The binary protocol refuses a value of another type
                        // than its column's: send what the columns declare.
                        let written = match as_declared(b, &schema) {
                            Ok(b) => write_batch(&mut w, &b).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = written {
                            // The result has started: MySQL's protocol can only
                            // end the connection here.
                            warn!("MySQL: closing the connection, a result could not be sent: {e}");
                            return Err(e);
                        }
                    }
                    if last {
                        return w.finish().await;
                    }
                    results = w.finish_one().await?;
                }
            }
        }
        // No statement at all (only comments).
        results.completed(OkResponse::default()).await
    }
}

/// What MySQL clients send on their own, answered without the database.
enum Chatter {
    Ok,
    /// Column names and one row (or none).
    Rows(Vec<String>, Option<Vec<Option<String>>>),
}

fn client_chatter(sql: &str) -> Option<Chatter> {
    let trimmed = sql.trim().trim_end_matches(';').trim();
    let lower = trimmed.to_ascii_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    match words.as_slice() {
        ["set", rest @ ..] => {
            // MySQL session settings that sandflow has no use for.
            let name = rest
                .first()?
                .trim_start_matches("@@")
                .trim_start_matches("session.")
                .trim_start_matches("local.")
                .split('=')
                .next()?
                .to_string();
            let ignored = matches!(
                name.as_str(),
                "names"
                    | "autocommit"
                    | "sql_mode"
                    | "time_zone"
                    | "character"
                    | "session"
                    | "transaction"
                    | "sql_select_limit"
                    | "net_write_timeout"
            ) || name.starts_with("character_set_")
                || name.starts_with("collation_");
            ignored.then_some(Chatter::Ok)
        }
        ["show", "warnings", ..] => Some(Chatter::Rows(
            vec!["Level".into(), "Code".into(), "Message".into()],
            None,
        )),
        ["select", ..] if lower.contains("@@") || lower.contains("version()") => {
            // `SELECT @@version_comment LIMIT 1`, `SELECT version()`, ...
            let body = trimmed[6..].trim();
            let body = match body.to_ascii_lowercase().find(" limit ") {
                Some(i) => &body[..i],
                None => body,
            };
            let mut names = Vec::new();
            let mut values = Vec::new();
            for item in body.split(',') {
                let item = item.trim();
                let (expr, alias) = match item.to_ascii_lowercase().find(" as ") {
                    Some(i) => (
                        item[..i].trim(),
                        Some(item[i + 4..].trim().trim_matches('`')),
                    ),
                    None => (item, None),
                };
                let value = system_value(expr)?;
                names.push(alias.unwrap_or(expr).to_string());
                values.push(value);
            }
            Some(Chatter::Rows(names, Some(values)))
        }
        _ => None,
    }
}

/// The value of a system variable or function a client asks for; `None`
/// for an expression that is not one (the query then goes to the database).
fn system_value(expr: &str) -> Option<Option<String>> {
    let e = expr.to_ascii_lowercase();
    if e == "version()" {
        return Some(Some(VERSION.into()));
    }
    let name = e
        .strip_prefix("@@")?
        .trim_start_matches("session.")
        .trim_start_matches("global.");
    Some(match name {
        "version_comment" => Some("sandflow".into()),
        "version" => Some(VERSION.into()),
        "autocommit" => Some("1".into()),
        "max_allowed_packet" => Some("16777216".into()),
        "character_set_client"
        | "character_set_connection"
        | "character_set_results"
        | "character_set_server" => Some("utf8mb4".into()),
        "collation_connection" | "collation_server" => Some("utf8mb4_general_ci".into()),
        "sql_mode" => Some(String::new()),
        "time_zone" | "system_time_zone" => Some("UTC".into()),
        "lower_case_table_names" => Some("0".into()),
        "transaction_isolation" | "tx_isolation" => Some("READ-COMMITTED".into()),
        "auto_increment_increment" => Some("1".into()),
        "wait_timeout" | "interactive_timeout" => Some("28800".into()),
        _ => None,
    })
}

fn text_column(name: &str) -> Column {
    Column {
        table: String::new(),
        column: name.to_string(),
        coltype: ColumnType::MYSQL_TYPE_VAR_STRING,
        colflags: ColumnFlags::empty(),
    }
}

fn column_type(t: &DataType) -> ColumnType {
    match t {
        DataType::Boolean => ColumnType::MYSQL_TYPE_TINY,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
            ColumnType::MYSQL_TYPE_LONGLONG
        }
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
            ColumnType::MYSQL_TYPE_LONGLONG
        }
        DataType::Float32 | DataType::Float64 => ColumnType::MYSQL_TYPE_DOUBLE,
        DataType::Timestamp(_, _) => ColumnType::MYSQL_TYPE_DATETIME,
        DataType::Date32 => ColumnType::MYSQL_TYPE_DATE,
        DataType::Binary | DataType::LargeBinary => ColumnType::MYSQL_TYPE_BLOB,
        _ => ColumnType::MYSQL_TYPE_VAR_STRING,
    }
}

fn timestamp(v: i64, unit: &TimeUnit) -> Option<NaiveDateTime> {
    let (secs, nanos) = match unit {
        TimeUnit::Second => (v, 0),
        TimeUnit::Millisecond => (v.div_euclid(1_000), v.rem_euclid(1_000) * 1_000_000),
        TimeUnit::Microsecond => (v.div_euclid(1_000_000), v.rem_euclid(1_000_000) * 1_000),
        TimeUnit::Nanosecond => (v.div_euclid(1_000_000_000), v.rem_euclid(1_000_000_000)),
    };
    DateTime::from_timestamp(secs, nanos as u32).map(|d| d.naive_utc())
}

/// `b` with each column of the type `schema` declares for it (cast where
/// it differs, as the columns were announced from the schema).
fn as_declared(
    b: &RecordBatch,
    schema: &datafusion::arrow::datatypes::SchemaRef,
) -> io::Result<RecordBatch> {
    let differs = b
        .columns()
        .iter()
        .zip(schema.fields())
        .any(|(c, f)| c.data_type() != f.data_type());
    if !differs || b.num_columns() != schema.fields().len() {
        return Ok(b.clone());
    }
    let columns = b
        .columns()
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            // A value with no form of the declared type fails, not NULL.
            let strict = datafusion::arrow::compute::CastOptions {
                safe: false,
                ..Default::default()
            };
            datafusion::arrow::compute::cast_with_options(c, f.data_type(), &strict)
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

async fn write_batch<W: AsyncWrite + Send + Unpin>(
    w: &mut opensrv_mysql::RowWriter<'_, W>,
    b: &RecordBatch,
) -> io::Result<()> {
    let bad = |e: String| io::Error::new(io::ErrorKind::InvalidData, e);
    for row in 0..b.num_rows() {
        for col in b.columns() {
            if col.is_null(row) {
                w.write_col(None::<i64>)?;
                continue;
            }
            match col.data_type() {
                DataType::Boolean => w.write_col(col.as_boolean().value(row) as i8)?,
                DataType::Int8 => w.write_col(col.as_primitive::<Int8Type>().value(row) as i64)?,
                DataType::Int16 => w.write_col(col.as_primitive::<Int16Type>().value(row) as i64)?,
                DataType::Int32 => w.write_col(col.as_primitive::<Int32Type>().value(row) as i64)?,
                DataType::Int64 => w.write_col(col.as_primitive::<Int64Type>().value(row))?,
                DataType::UInt8 => w.write_col(col.as_primitive::<UInt8Type>().value(row) as u64)?,
                DataType::UInt16 => {
                    w.write_col(col.as_primitive::<UInt16Type>().value(row) as u64)?
                }
                DataType::UInt32 => {
                    w.write_col(col.as_primitive::<UInt32Type>().value(row) as u64)?
                }
                DataType::UInt64 => w.write_col(col.as_primitive::<UInt64Type>().value(row))?,
                DataType::Float32 => {
                    w.write_col(col.as_primitive::<Float32Type>().value(row) as f64)?
                }
                DataType::Float64 => w.write_col(col.as_primitive::<Float64Type>().value(row))?,
                DataType::Timestamp(unit, _) => {
                    use datafusion::arrow::datatypes::{
                        TimestampMicrosecondType as Us, TimestampMillisecondType as Ms,
                        TimestampNanosecondType as Ns, TimestampSecondType as S,
                    };
                    let v = match unit {
                        TimeUnit::Second => col.as_primitive::<S>().value(row),
                        TimeUnit::Millisecond => col.as_primitive::<Ms>().value(row),
                        TimeUnit::Microsecond => col.as_primitive::<Us>().value(row),
                        TimeUnit::Nanosecond => col.as_primitive::<Ns>().value(row),
                    };
                    let t = timestamp(v, unit)
                        .ok_or_else(|| bad(format!("timestamp {v} is out of range")))?;
                    w.write_col(t)?
                }
                DataType::Date32 => {
                    let days = col
                        .as_primitive::<datafusion::arrow::datatypes::Date32Type>()
                        .value(row);
                    let d = NaiveDate::from_ymd_opt(1970, 1, 1)
                        .and_then(|e| e.checked_add_signed(chrono::Duration::days(days as i64)))
                        .ok_or_else(|| bad(format!("date {days} is out of range")))?;
                    w.write_col(d)?
                }
                DataType::Binary => w.write_col(col.as_binary::<i32>().value(row))?,
                DataType::LargeBinary => w.write_col(col.as_binary::<i64>().value(row))?,
                _ => {
                    // A list's NULL elements print as NULL (not as nothing).
                    let options = FormatOptions::new().with_null("NULL");
                    let s = ArrayFormatter::try_new(col.as_ref(), &options)
                        .map(|f| f.value(row).to_string())
                        .map_err(|e| bad(e.to_string()))?;
                    w.write_col(s)?
                }
            }
        }
        w.end_row().await?;
    }
    Ok(())
}

fn error_kind(e: &Error) -> ErrorKind {
    #[allow(unreachable_patterns)]
    match e {
        Error::Sql { .. } | Error::TooComplex { .. } => ErrorKind::ER_PARSE_ERROR,
        Error::NotFound { .. } => ErrorKind::ER_NO_SUCH_TABLE,
        Error::TableExists { .. } => ErrorKind::ER_TABLE_EXISTS_ERROR,
        Error::DatabaseNotFound { .. } => ErrorKind::ER_BAD_DB_ERROR,
        Error::InvalidName { message } if message.starts_with("Invalid database") => {
            ErrorKind::ER_WRONG_DB_NAME
        }
        Error::InvalidName { .. } => ErrorKind::ER_WRONG_TABLE_NAME,
        Error::FlowNotFound { .. } | Error::FlowExists { .. } => ErrorKind::ER_UNKNOWN_ERROR,
        Error::Unsupported { .. } => ErrorKind::ER_NOT_SUPPORTED_YET,
        Error::InvalidData { .. } | Error::InvalidEncoding { .. } => {
            ErrorKind::ER_WRONG_VALUE_FOR_VAR
        }
        Error::Cancelled { .. } => ErrorKind::ER_QUERY_INTERRUPTED,
        Error::Conflict { .. } => ErrorKind::ER_LOCK_DEADLOCK,
        Error::PermissionDenied { .. } => ErrorKind::ER_TABLEACCESS_DENIED_ERROR,
        Error::AuthFailed { .. } => ErrorKind::ER_ACCESS_DENIED_ERROR,
        _ => ErrorKind::ER_UNKNOWN_ERROR,
    }
}

/// `sql` with MySQL's string literals (backslash escapes: `'it\\'s'`, as
/// PyMySQL and the `mysql` client write them) rewritten as standard SQL
/// literals (`'it''s'`), which the database reads. Text without a
/// backslash, or that MySQL's rules cannot read, is left as it is.
fn standard_strings(sql: &str) -> std::borrow::Cow<'_, str> {
    if !sql.contains('\\') {
        return sql.into();
    }
    match Tokenizer::new(&MySqlDialect {}, sql).tokenize() {
        Ok(tokens) => tokens
            .iter()
            .map(|t| match t {
                Token::SingleQuotedString(v) => format!("'{}'", v.replace('\'', "''")),
                other => other.to_string(),
            })
            .collect::<String>()
            .into(),
        Err(_) => sql.into(),
    }
}

/// The number of `?` placeholders of a statement.
fn placeholders(sql: &str) -> Result<usize, String> {
    Ok(tokens(sql)?
        .iter()
        .filter(|t| matches!(t, Token::Placeholder(p) if p == "?"))
        .count())
}

fn tokens(sql: &str) -> Result<Vec<Token>, String> {
    Tokenizer::new(&GenericDialect {}, sql)
        .tokenize()
        .map_err(|e| format!("cannot read the statement: {e}"))
}

/// `sql` with its `?` placeholders replaced by `literals`, in order.
fn bind(sql: &str, literals: &[String]) -> Result<String, String> {
    let tokens = tokens(sql)?;
    let wanted = tokens
        .iter()
        .filter(|t| matches!(t, Token::Placeholder(p) if p == "?"))
        .count();
    if wanted != literals.len() {
        return Err(format!(
            "the statement has {wanted} parameters and {} were given",
            literals.len()
        ));
    }
    let mut it = literals.iter();
    let mut out = String::with_capacity(sql.len());
    for t in &tokens {
        match t {
            Token::Placeholder(p) if p == "?" => out.push_str(it.next().map_or("NULL", |s| s)),
            other => out.push_str(&other.to_string()),
        }
    }
    Ok(out)
}

/// A parameter as an SQL literal.
fn literal(v: ValueInner<'_>) -> Result<String, String> {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    Ok(match v {
        ValueInner::NULL => "NULL".to_string(),
        ValueInner::Int(i) => i.to_string(),
        ValueInner::UInt(u) => u.to_string(),
        ValueInner::Double(f) if f.is_finite() => format!("{f:?}"),
        ValueInner::Double(f) => format!("CAST('{f}' AS DOUBLE)"),
        ValueInner::Bytes(b) => match std::str::from_utf8(b) {
            Ok(s) => quote(s),
            Err(_) => format!("X'{}'", hex::encode(b)),
        },
        ValueInner::Date(b) | ValueInner::Datetime(b) => {
            let t = datetime_of(b)?;
            quote(&t.format("%Y-%m-%d %H:%M:%S%.f").to_string())
        }
        ValueInner::Time(_) => {
            return Err("TIME parameters are not supported; send the time as a string".into())
        }
    })
}

/// MySQL's binary DATE / DATETIME: year (u16), month, day, then hour,
/// minute, second, then microseconds (u32), each part optional.
fn datetime_of(b: &[u8]) -> Result<NaiveDateTime, String> {
    let bad = || "a date or time parameter is malformed".to_string();
    let at = |i: usize| b.get(i).copied().map(u32::from).ok_or_else(bad);
    if !matches!(b.len(), 4 | 7 | 11) {
        return Err(bad());
    }
    let year = i32::from(u16::from_le_bytes([b[0], b[1]]));
    let date = NaiveDate::from_ymd_opt(year, at(2)?, at(3)?).ok_or_else(bad)?;
    let (h, m, s) = match b.len() {
        4 => (0, 0, 0),
        _ => (at(4)?, at(5)?, at(6)?),
    };
    let micros = match b.len() {
        11 => u32::from_le_bytes([b[7], b[8], b[9], b[10]]),
        _ => 0,
    };
    date.and_hms_micro_opt(h, m, s, micros).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_sent_as_their_columns_declare() {
        use datafusion::arrow::array::{Float64Array, Int64Array, StringArray};
        use datafusion::arrow::datatypes::{Field, Schema};
        let declared = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let found = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            found,
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec!["a", "b"])),
            ],
        )
        .unwrap();
        let sent = as_declared(&batch, &declared).unwrap();
        assert_eq!(sent.schema(), declared);
        let x = sent
            .column(0)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        assert_eq!(x.value(0), 1.0);
        assert!(x.is_null(1));
        // A value that has no form of the declared type is an error, not a
        // value of another type.
        let ints = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("s", DataType::Int64, true),
        ]));
        assert!(as_declared(&batch, &ints).is_err());
    }

    #[test]
    fn placeholders_are_found_outside_literals_and_bound_in_order() {
        let sql = "INSERT INTO t VALUES (?, '?', \"?\", ?) -- ?";
        assert_eq!(placeholders(sql).unwrap(), 2);
        let bound = bind(sql, &["1".into(), "'it''s'".into()]).unwrap();
        assert_eq!(bound, "INSERT INTO t VALUES (1, '?', \"?\", 'it''s') -- ?");
        assert!(bind(sql, &["1".into()])
            .unwrap_err()
            .contains("2 parameters"));
    }

    #[test]
    fn mysql_string_escapes_become_standard_literals() {
        assert_eq!(
            standard_strings(r"INSERT INTO t VALUES ('it\'s', 'a\\b', 'x')"),
            r"INSERT INTO t VALUES ('it''s', 'a\b', 'x')"
        );
        assert_eq!(standard_strings("SELECT 'plain'"), "SELECT 'plain'");
    }

    #[test]
    fn clients_chatter_is_answered_and_statements_pass() {
        match client_chatter("select @@version_comment limit 1") {
            Some(Chatter::Rows(names, Some(values))) => {
                assert_eq!(names, vec!["@@version_comment"]);
                assert_eq!(values, vec![Some("sandflow".to_string())]);
            }
            _ => panic!("not answered"),
        }
        assert!(matches!(
            client_chatter("SET NAMES utf8mb4"),
            Some(Chatter::Ok)
        ));
        assert!(matches!(
            client_chatter("SET autocommit=0"),
            Some(Chatter::Ok)
        ));
        assert!(client_chatter("SET statement_timeout = '1s'").is_none());
        assert!(client_chatter("SELECT 1").is_none());
        assert!(client_chatter("SELECT @@nonsense_var_x, 1 + 1").is_none());
    }
}
