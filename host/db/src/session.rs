//! Sessions: what one connection, one HTTP request or one library caller has
//! of its own.
//!
//! - **Settings.** Each session has its own DataFusion state (the database's
//!   catalog, shared) and its own values of the settings sandflow knows
//!   ([`SETTINGS`]); `SET` changes only this session, an unknown setting is an
//!   error, and DataFusion's own `datafusion.*` settings are the server's.
//! - **Transactions.** `BEGIN ... COMMIT` commits the writes in between
//!   together, `ROLLBACK` discards them: writes in a transaction block are
//!   staged ([`crate::storage::Staged`]) and read back by the transaction
//!   only. A script of several statements (one PostgreSQL Query message, one
//!   HTTP request, one [`Session::execute`]) is one implicit transaction: if a
//!   statement fails, nothing the script wrote is kept. DDL is not
//!   transactional: it takes effect when it runs, and a ROLLBACK says so.
//! - **Stopping.** Each statement runs on the database's executor; a
//!   statement timeout or a cancel request stops it at once, unless it has
//!   begun to commit, in which case it finishes and reports success: a
//!   statement that reports an error has written nothing.
//!
//! A session must not know which front door it serves: the PostgreSQL door
//! and HTTP shape its outputs, notices and errors for their clients.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::ParamValues;
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Set, Statement as SqlStatement, TransactionIsolationLevel, TransactionMode,
    Value,
};
use tokio::sync::oneshot;

use crate::auth::Principal;
use crate::database::{Core, Output};
use crate::error::{
    CancelledSnafu, Error, InternalSnafu, Result, SqlSnafu, TransactionSnafu, UnsupportedSnafu,
};
use crate::sql::copy::{CopyData, CopySpec};
use crate::sql::parser::{self, Stmt};
use crate::storage::{Staged, WriteSet};

pub use crate::sql::parser::Dialect;

/// One parsed statement of a script.
#[derive(Debug, Clone)]
pub struct Statement {
    pub(crate) stmt: Stmt,
    text: String,
}

/// What kind of statement it is, for front doors that must know before
/// running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatementKind {
    /// Returns rows (queries, SHOW, DESC, ADMIN, EXPLAIN).
    Rows,
    /// `COPY ... TO STDOUT`.
    CopyOut,
    /// `COPY ... FROM STDIN`.
    CopyIn,
    /// Anything else (writes, DDL, session and transaction statements).
    Command,
}

impl Statement {
    /// The statement's text as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Replaces a query by an equivalent rewritten one (a front door's
    /// compatibility rewrites of client queries); other statements stay.
    pub fn replace_query(&mut self, query: SqlStatement) {
        if let Stmt::Query(q) = &mut self.stmt {
            if matches!(q.as_ref(), SqlStatement::Query(_))
                && matches!(query, SqlStatement::Query(_))
            {
                **q = query;
            }
        }
    }

    pub fn kind(&self) -> StatementKind {
        use datafusion::sql::sqlparser::ast::CopyTarget;
        match &self.stmt {
            Stmt::Query(q) => match q.as_ref() {
                SqlStatement::Query(_)
                | SqlStatement::Explain { .. }
                | SqlStatement::ExplainTable { .. }
                | SqlStatement::ShowVariable { .. } => StatementKind::Rows,
                SqlStatement::Copy {
                    to: true,
                    target: CopyTarget::Stdout,
                    ..
                } => StatementKind::CopyOut,
                SqlStatement::Copy {
                    to: false,
                    target: CopyTarget::Stdin,
                    ..
                } => StatementKind::CopyIn,
                _ => StatementKind::Command,
            },
            other => {
                if crate::sql::result_schema(other).is_some() {
                    StatementKind::Rows
                } else {
                    StatementKind::Command
                }
            }
        }
    }

    /// What a `COPY ... TO STDOUT` or `COPY ... FROM STDIN` asks for; `None`
    /// for other statements. A COPY to or from a file is an error here.
    pub fn copy_spec(&self) -> Option<Result<CopySpec>> {
        match &self.stmt {
            Stmt::Query(q) if matches!(q.as_ref(), SqlStatement::Copy { .. }) => {
                Some(CopySpec::from_statement(q))
            }
            _ => None,
        }
    }

    /// Whether the statement only reads (a GET request may run it).
    pub fn is_read_only(&self) -> bool {
        self.stmt.is_read_only()
    }

    /// Whether the statement changes the catalog (which transactions do not undo).
    fn is_ddl(&self) -> bool {
        match &self.stmt {
            Stmt::CreateTable(_)
            | Stmt::AlterTable(_)
            | Stmt::CreateDatabase { .. }
            | Stmt::DropTable { .. }
            | Stmt::DropDatabase { .. }
            | Stmt::CreateFlow(_)
            | Stmt::DropFlow { .. }
            | Stmt::AlterFlowComponent { .. }
            | Stmt::CreateComponent { .. }
            | Stmt::DropComponent { .. } => true,
            Stmt::Access(a) => !matches!(
                a,
                crate::sql::access::AccessStmt::ShowUsers
                    | crate::sql::access::AccessStmt::ShowGrants { .. }
            ),
            Stmt::Admin { function, .. } => {
                function == "resume_flow" || function == "pause_flow" || function == "move_flow"
            }
            _ => false,
        }
    }

    /// A short name for messages: `CREATE TABLE`, `INSERT`, ...
    pub fn tag(&self) -> String {
        let words = crate::sql::parser::leading_keywords(&self.text, 2);
        match words.first().map(String::as_str) {
            Some("CREATE" | "DROP" | "ALTER" | "SHOW") => words.join(" "),
            Some(w) => w.to_string(),
            None => "statement".into(),
        }
    }
}

/// Where a session's transaction stands (PostgreSQL's ReadyForQuery status).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionStatus {
    /// No transaction block.
    Idle,
    /// In a transaction block.
    InBlock,
    /// In a transaction block that failed: only COMMIT or ROLLBACK (both roll
    /// back) are accepted.
    Failed,
}

/// What a script did: the outputs of the statements that ran, in order, and
/// the error that stopped it, if one did (the statements after it did not run,
/// and nothing the script wrote was kept unless an explicit COMMIT before the
/// error committed it).
#[derive(Debug, Default)]
pub struct ScriptOutcome {
    pub outputs: Vec<Output>,
    pub error: Option<Error>,
}

/// A statement's parameters and result columns, before it runs.
#[derive(Debug, Clone)]
pub struct Description {
    /// One entry per `$n`, with its type where the statement fixes it.
    pub params: Vec<Option<DataType>>,
    /// The columns of the rows it returns; `None` for statements without rows.
    pub columns: Option<SchemaRef>,
}

/// Shared by a session and the DataFusion providers that run its statements
/// (registered as an extension of the session's DataFusion config).
#[derive(Debug)]
pub(crate) struct SessionShared {
    /// Who the session acts as.
    pub(crate) principal: Principal,
    /// The open transaction's staged writes; `None` outside a transaction.
    pub(crate) staged: Mutex<Option<Staged>>,
    /// The running statement's gate between stopping and committing.
    pub(crate) control: Mutex<Option<Arc<StatementControl>>>,
}

impl Default for SessionShared {
    fn default() -> Self {
        SessionShared {
            principal: Principal::Root,
            staged: Mutex::default(),
            control: Mutex::default(),
        }
    }
}

impl SessionShared {
    /// The running statement's control (a statement outside a session gets
    /// one that is never stopped).
    pub(crate) fn control(&self) -> Arc<StatementControl> {
        self.control
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum ControlState {
    #[default]
    Running,
    Committing,
    Stopped,
}

/// Decides, once, whether a statement commits or is stopped.
#[derive(Debug, Default)]
pub struct StatementControl {
    state: Mutex<ControlState>,
}

impl StatementControl {
    /// Called right before a commit: fails if the statement was stopped;
    /// after it, the statement can no longer be stopped.
    pub fn begin_commit(&self) -> Result<()> {
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        match *s {
            ControlState::Stopped => CancelledSnafu {
                message: "canceling statement before it committed",
            }
            .fail(),
            _ => {
                *s = ControlState::Committing;
                Ok(())
            }
        }
    }

    /// Stops the statement unless it has begun to commit; returns whether it
    /// was stopped.
    fn stop(&self) -> bool {
        match self.state.lock() {
            Ok(mut s) if *s == ControlState::Running => {
                *s = ControlState::Stopped;
                true
            }
            _ => false,
        }
    }
}

fn poisoned() -> Error {
    InternalSnafu {
        message: "a session lock was poisoned by an earlier panic; reconnect",
    }
    .build()
}

/// The transaction block a session is in.
#[derive(Debug)]
struct Block {
    /// Opened by BEGIN (else: the implicit block of a script).
    explicit: bool,
    failed: bool,
    /// DDL that ran in the block: it stays whatever the block's fate.
    ddl: Vec<String>,
    /// Settings changed by `SET LOCAL`, with the values to restore.
    local: Vec<(&'static str, String)>,
}

/// A setting sessions may read and change.
struct SettingDef {
    name: &'static str,
    /// The name PostgreSQL reports it by (ParameterStatus), if it does.
    reported: Option<&'static str>,
    default: &'static str,
    /// Normalises a new value, or says why it is refused.
    check: fn(&str) -> std::result::Result<String, String>,
    description: &'static str,
}

fn any(v: &str) -> std::result::Result<String, String> {
    Ok(v.to_string())
}

fn read_only(_: &str) -> std::result::Result<String, String> {
    Err("cannot be changed".into())
}

fn utf8_only(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_uppercase().replace('-', "").as_str() {
        "UTF8" | "UNICODE" => Ok("UTF8".into()),
        _ => Err(format!("'{v}' is not supported: sandflow speaks UTF8 only")),
    }
}

fn iso_dates(v: &str) -> std::result::Result<String, String> {
    let parts: Vec<String> = v
        .split(',')
        .map(|p| p.trim().to_ascii_uppercase())
        .collect();
    if parts
        .iter()
        .all(|p| matches!(p.as_str(), "ISO" | "MDY" | "DMY" | "YMD" | "US" | "EURO"))
        && parts.iter().any(|p| p == "ISO")
    {
        Ok("ISO, MDY".into())
    } else {
        Err(format!(
            "'{v}' is not supported: dates are written in ISO style only (DateStyle = 'ISO')"
        ))
    }
}

fn time_zone(v: &str) -> std::result::Result<String, String> {
    use std::str::FromStr;
    let v = v.trim();
    let normal = match v.to_ascii_uppercase().as_str() {
        "UTC" | "GMT" | "Z" | "ZULU" | "ETC/UTC" | "UCT" | "DEFAULT" | "LOCAL" => "UTC".to_string(),
        _ => v.to_string(),
    };
    if normal == "UTC" {
        return Ok(normal);
    }
    datafusion::arrow::array::timezone::Tz::from_str(&normal)
        .map(|_| normal.clone())
        .map_err(|e| format!("unknown time zone '{v}': {e}"))
}

fn on_only(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok("on".into()),
        _ => Err(format!("'{v}' is not supported; only 'on' is")),
    }
}

fn off_only(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "off" | "false" | "0" | "no" => Ok("off".into()),
        _ => Err(format!(
            "'{v}' is not supported; only 'off' is (read-only transactions are not supported)"
        )),
    }
}

fn read_committed(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_lowercase().replace('_', " ").as_str() {
        "read committed" | "default" => Ok("read committed".into()),
        _ => Err(format!(
            "isolation level '{v}' is not supported; transactions are READ COMMITTED"
        )),
    }
}

/// A duration as PostgreSQL writes one: a bare number is milliseconds.
fn millis(v: &str) -> std::result::Result<String, String> {
    let v = v.trim();
    if let Ok(n) = v.parse::<i64>() {
        return if n >= 0 {
            Ok(n.to_string())
        } else {
            Err(format!("'{v}' is negative"))
        };
    }
    crate::schema::interval::parse_interval(v).map(|ms| ms.to_string())
}

fn float_digits(v: &str) -> std::result::Result<String, String> {
    match v.trim().parse::<i32>() {
        Ok(n) if (-15..=3).contains(&n) => Ok(n.to_string()),
        _ => Err(format!("'{v}' is not an integer from -15 to 3")),
    }
}

fn search_path(v: &str) -> std::result::Result<String, String> {
    match search_path_database(v) {
        Some(_) => Ok(v.trim().to_string()),
        None => Err("name a database, e.g. SET search_path = public".to_string()),
    }
}

/// The database a `search_path` value names first (`$user` and
/// `pg_catalog` skipped); `public` when it names none.
fn search_path_database(v: &str) -> Option<String> {
    let first = v
        .split(',')
        .map(|s| s.trim().trim_matches('"').trim_matches('\'').to_string())
        .find(|s| s != "$user" && !s.is_empty() && s != "pg_catalog");
    Some(first.unwrap_or_else(|| crate::catalog::DEFAULT_DATABASE.to_string()))
}

fn client_messages(v: &str) -> std::result::Result<String, String> {
    let l = v.to_ascii_lowercase();
    match l.as_str() {
        "debug5" | "debug4" | "debug3" | "debug2" | "debug1" | "debug" | "log" | "notice"
        | "warning" | "error" => Ok(l),
        _ => Err(format!("'{v}' is not a message level")),
    }
}

fn hex_only(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "hex" => Ok("hex".into()),
        _ => Err(format!("'{v}' is not supported; only 'hex' is")),
    }
}

fn postgres_intervals(v: &str) -> std::result::Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "postgres" => Ok("postgres".into()),
        _ => Err(format!("'{v}' is not supported; only 'postgres' is")),
    }
}

/// The settings sessions know. `SET` of anything else is an error.
const SETTINGS: &[SettingDef] = &[
    SettingDef {
        name: "application_name",
        reported: Some("application_name"),
        default: "",
        check: any,
        description: "The name the client gave itself.",
    },
    SettingDef {
        name: "client_encoding",
        reported: Some("client_encoding"),
        default: "UTF8",
        check: utf8_only,
        description: "The client's character set (UTF8 only).",
    },
    SettingDef {
        name: "datestyle",
        reported: Some("DateStyle"),
        default: "ISO, MDY",
        check: iso_dates,
        description: "How dates are written (ISO only).",
    },
    SettingDef {
        name: "timezone",
        reported: Some("TimeZone"),
        default: "UTC",
        check: time_zone,
        description: "The session's time zone, for now() and timestamps with a zone.",
    },
    SettingDef {
        name: "statement_timeout",
        reported: None,
        default: "0",
        check: millis,
        description: "Stops a statement that runs longer (ms; 0: never).",
    },
    SettingDef {
        name: "lock_timeout",
        reported: None,
        default: "0",
        check: millis,
        description: "Accepted for clients that set it; sandflow takes no locks a statement could wait on for long.",
    },
    SettingDef {
        name: "idle_in_transaction_session_timeout",
        reported: None,
        default: "0",
        check: millis,
        description: "Accepted for clients that set it; not enforced.",
    },
    SettingDef {
        name: "extra_float_digits",
        reported: None,
        default: "1",
        check: float_digits,
        description: "Accepted for clients that set it; floats are always written exactly.",
    },
    SettingDef {
        name: "search_path",
        reported: None,
        default: "\"$user\", public",
        check: search_path,
        description: "Where unqualified names are found: its first database is the session's \
                      (as USE sets it).",
    },
    SettingDef {
        name: "standard_conforming_strings",
        reported: Some("standard_conforming_strings"),
        default: "on",
        check: on_only,
        description: "Backslashes in '...' are literal (on only).",
    },
    SettingDef {
        name: "client_min_messages",
        reported: None,
        default: "notice",
        check: client_messages,
        description: "Accepted for clients that set it.",
    },
    SettingDef {
        name: "bytea_output",
        reported: None,
        default: "hex",
        check: hex_only,
        description: "How binary values are written (hex only).",
    },
    SettingDef {
        name: "intervalstyle",
        reported: Some("IntervalStyle"),
        default: "postgres",
        check: postgres_intervals,
        description: "How intervals are written (postgres only).",
    },
    SettingDef {
        name: "transaction_isolation",
        reported: None,
        default: "read committed",
        check: read_committed,
        description: "Transactions are READ COMMITTED.",
    },
    SettingDef {
        name: "default_transaction_isolation",
        reported: None,
        default: "read committed",
        check: read_committed,
        description: "Transactions are READ COMMITTED.",
    },
    SettingDef {
        name: "transaction_read_only",
        reported: None,
        default: "off",
        check: off_only,
        description: "Read-only transactions are not supported.",
    },
    SettingDef {
        name: "default_transaction_read_only",
        reported: None,
        default: "off",
        check: off_only,
        description: "Read-only transactions are not supported.",
    },
    SettingDef {
        name: "server_version",
        reported: Some("server_version"),
        default: "16.6-sandflow",
        check: read_only,
        description: "The PostgreSQL version sandflow answers as.",
    },
    SettingDef {
        name: "server_encoding",
        reported: Some("server_encoding"),
        default: "UTF8",
        check: read_only,
        description: "UTF8.",
    },
    SettingDef {
        name: "integer_datetimes",
        reported: Some("integer_datetimes"),
        default: "on",
        check: read_only,
        description: "Timestamps are integers.",
    },
    SettingDef {
        name: "max_identifier_length",
        reported: None,
        default: "63",
        check: read_only,
        description: "Accepted for clients that read it.",
    },
    SettingDef {
        name: "is_superuser",
        reported: Some("is_superuser"),
        default: "on",
        check: read_only,
        description: "Whether the session's user is a superuser.",
    },
];

/// The canonical name of a setting (`TimeZone` → `timezone`, `TIME ZONE`).
fn setting_def(name: &str) -> Option<&'static SettingDef> {
    let lower = name.trim().to_ascii_lowercase().replace(' ', "_");
    let lower = match lower.as_str() {
        "time_zone" => "timezone".to_string(),
        "transaction_isolation_level" => "transaction_isolation".to_string(),
        _ => lower,
    };
    SETTINGS.iter().find(|d| d.name == lower)
}

/// Defaults for new sessions, from the server's configuration.
#[derive(Debug, Clone, Default)]
pub struct SessionDefaults {
    /// `statement_timeout` of new sessions (none when `None` or zero).
    pub statement_timeout: Option<Duration>,
}

/// A session; see the module docs.
pub struct Session {
    core: Arc<Core>,
    ctx: SessionContext,
    shared: Arc<SessionShared>,
    dialect: Dialect,
    values: BTreeMap<&'static str, String>,
    defaults: BTreeMap<&'static str, String>,
    block: Option<Block>,
    /// When every statement of this session must have ended (see
    /// [`Session::set_deadline`]).
    deadline: Option<tokio::time::Instant>,
    notices: Vec<String>,
    /// Reported settings changed since the last `take_reported`.
    reported: Vec<(String, String)>,
    /// The client's address, for the log.
    peer: Option<String>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("dialect", &self.dialect)
            .field("block", &self.block)
            .finish()
    }
}

impl Session {
    /// A session over `base`'s catalog and functions (the database's own
    /// context, or one a front door extended, e.g. with pg_catalog).
    pub(crate) fn new(
        core: Arc<Core>,
        base: &SessionContext,
        dialect: Dialect,
        defaults: &SessionDefaults,
        principal: Principal,
    ) -> Session {
        let shared = Arc::new(SessionShared {
            principal: principal.clone(),
            ..SessionShared::default()
        });
        let mut state = base.state();
        let config = state.config().clone().with_extension(shared.clone());
        *state.config_mut() = config;
        if principal != Principal::Root {
            let list = Arc::new(crate::sql::visible::VisibleCatalogs {
                inner: state.catalog_list().clone(),
                core: core.clone(),
                principal: principal.clone(),
            });
            state =
                datafusion::execution::session_state::SessionStateBuilder::new_from_existing(state)
                    .with_catalog_list(list)
                    .build();
        }
        let ctx = SessionContext::new_with_state(state);
        crate::sql::functions::register_user(&ctx, principal.name());
        let mut values = BTreeMap::new();
        for d in SETTINGS {
            values.insert(d.name, d.default.to_string());
        }
        if !core.access.is_superuser(&principal) {
            values.insert("is_superuser", "off".to_string());
        }
        if let Some(t) = defaults.statement_timeout.filter(|t| !t.is_zero()) {
            values.insert("statement_timeout", t.as_millis().to_string());
        }
        Session {
            core,
            ctx,
            shared,
            dialect,
            defaults: values.clone(),
            values,
            block: None,
            deadline: None,
            notices: Vec::new(),
            reported: Vec::new(),
            peer: None,
        }
    }

    /// Names the client's address in what the session logs.
    pub fn set_peer(&mut self, peer: impl std::fmt::Display) {
        self.peer = Some(peer.to_string());
    }

    /// Who the session acts as.
    pub fn principal(&self) -> &Principal {
        &self.shared.principal
    }

    /// The session's DataFusion context (its own settings, the database's
    /// catalog).
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    /// The session's database: where unqualified table names are (`public`
    /// until `USE`, a client's connection parameter or `?db=` changes it).
    pub fn database(&self) -> String {
        crate::sql::context_database(&self.ctx)
    }

    /// Makes `database` the session's database (`USE database`); it must
    /// exist.
    pub fn use_database(&mut self, database: &str) -> Result<()> {
        if database == crate::sql::INFORMATION_SCHEMA {
            return crate::sql::use_information_schema();
        }
        if !self.core.catalog.database_exists(database)? {
            return crate::error::DatabaseNotFoundSnafu {
                message: format!(
                    "database '{database}' does not exist; see SHOW DATABASES, or create it \
                     with CREATE DATABASE {database}"
                ),
            }
            .fail();
        }
        crate::sql::access::authorize(
            &self.core,
            &self.shared.principal,
            database,
            &Stmt::Use(database.to_string()),
        )?;
        let state = self.ctx.state_ref();
        let mut state = state.write();
        state.config_mut().options_mut().catalog.default_schema = database.to_string();
        Ok(())
    }

    /// Parses a script: every statement, before any of them runs. Parsing
    /// runs on the executor's deep stacks.
    pub async fn parse(&self, sql: &str) -> Result<Vec<Statement>> {
        let (sql, dialect) = (sql.to_string(), self.dialect);
        self.core
            .executor
            .run(async move { parse_script(&sql, dialect) })
            .await
    }

    /// Runs a script (see [`Session::run_script`]) and returns its outputs,
    /// or the error that stopped it.
    pub async fn execute(&mut self, sql: &str) -> Result<Vec<Output>> {
        let statements = self.parse(sql).await?;
        let outcome = self.run_script(statements, None).await;
        match outcome.error {
            Some(e) => Err(e),
            None => Ok(outcome.outputs),
        }
    }

    /// Runs statements in order, as one implicit transaction when there are
    /// several and no transaction block is open: the first error stops the
    /// script and discards what it wrote. `cancel` stops the running
    /// statement when it fires.
    pub async fn run_script(
        &mut self,
        statements: Vec<Statement>,
        mut cancel: Option<oneshot::Receiver<()>>,
    ) -> ScriptOutcome {
        let mut outcome = ScriptOutcome::default();
        let several = statements.len() > 1;
        let total = statements.len();
        for (i, stmt) in statements.into_iter().enumerate() {
            if several && self.block.is_none() && i + 1 < total {
                self.open_block(false);
            }
            match self.run_owned(stmt, None, cancel.as_mut()).await {
                Ok(out) => outcome.outputs.push(out),
                Err(e) => {
                    self.fail_block();
                    outcome.error = Some(e);
                    return outcome;
                }
            }
        }
        // The implicit block ends with the script.
        if self.block.as_ref().is_some_and(|b| !b.explicit) {
            if let Err(e) = self.commit_block(cancel.as_mut()).await {
                outcome.error = Some(e);
            }
        }
        outcome
    }

    /// Runs one statement, with parameter values for its `$n`.
    pub async fn run(
        &mut self,
        stmt: &Statement,
        params: Option<ParamValues>,
        mut cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Output> {
        let result = self.run_owned(stmt.clone(), params, cancel.as_mut()).await;
        if result.is_err() {
            self.fail_block();
        }
        result
    }

    /// The rows a `COPY ... TO STDOUT` writes.
    pub async fn copy_out(
        &mut self,
        spec: &CopySpec,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<Output> {
        let sql = match &spec.data {
            CopyData::Query(q) => q.clone(),
            CopyData::Table { table, columns } => {
                let mut table = table.clone();
                table.bind(&self.database());
                let cols = if columns.is_empty() {
                    "*".to_string()
                } else {
                    columns
                        .iter()
                        .map(|c| quote_ident(c))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                format!(
                    "SELECT {cols} FROM {}.{}",
                    quote_ident(&table.database),
                    quote_ident(&table.table)
                )
            }
        };
        let mut stmts = parse_script(&sql, self.dialect)?;
        if stmts.len() != 1 {
            return SqlSnafu {
                message: "COPY (query) takes exactly one query",
            }
            .fail();
        }
        let stmt = stmts.remove(0);
        self.run(&stmt, None, cancel).await
    }

    /// Writes the rows of a `COPY ... FROM STDIN` (text values, one per
    /// column of the COPY) into its table: in the open transaction if there
    /// is one, else as one commit. Returns the rows written.
    pub async fn copy_in(
        &mut self,
        spec: &CopySpec,
        rows: Vec<Vec<Option<String>>>,
        cancel: Option<oneshot::Receiver<()>>,
    ) -> Result<u64> {
        let CopyData::Table { table, columns } = &spec.data else {
            return SqlSnafu {
                message: "COPY FROM needs a table",
            }
            .fail();
        };
        let mut table = table.clone();
        table.bind(&self.database());
        let target = self
            .core
            .catalog
            .require_table(&table.database, &table.table)?;
        self.core.access.check(
            &self.shared.principal,
            crate::auth::Privilege::Insert,
            &table.database,
            Some(&table.table),
        )?;
        crate::sql::access::check_storage_quota(&self.core, &table.database)?;
        let names: Vec<String> = if columns.is_empty() {
            target
                .schema()
                .columns
                .iter()
                .map(|c| c.name.clone())
                .collect()
        } else {
            columns.clone()
        };
        if let Some(b) = &self.block {
            if b.failed {
                return TransactionSnafu {
                    message: "current transaction is aborted, commands ignored until end of \
                              transaction block (send ROLLBACK)",
                }
                .fail();
            }
        }
        let (core, shared) = (self.core.clone(), self.shared.clone());
        let control = Arc::new(StatementControl::default());
        let gate = control.clone();
        let work = async move {
            let batch = crate::sql::copy::text_batch(&target, &names, &rows)?;
            let batch = core.fill_defaults(&target, batch)?;
            let n = batch.num_rows() as u64;
            let c = core.clone();
            crate::sql::provider::blocking(move || {
                let mut guard = shared.staged.lock().map_err(|_| poisoned())?;
                if let Some(staged) = guard.as_mut() {
                    return c.store.stage_upsert(staged, &target, &batch);
                }
                drop(guard);
                gate.begin_commit()?;
                let mut set = WriteSet::new();
                set.upsert(target, batch);
                c.store.commit(set)?;
                Ok(n)
            })
            .await
            .map(|rows| Output::Affected {
                tag: "COPY".into(),
                rows,
            })
        };
        let mut cancel = cancel;
        let result = self.guarded(control, cancel.as_mut(), work).await;
        match result {
            Ok(Output::Affected { rows, .. }) => Ok(rows),
            Ok(_) => Ok(0),
            Err(e) => {
                self.fail_block();
                Err(e)
            }
        }
    }

    /// Marks the open transaction block failed after an error the session did
    /// not see (a front door's own, e.g. in parsing a message).
    pub fn statement_failed(&mut self) {
        self.fail_block();
    }

    /// The parameters and result columns of a statement, without running it.
    pub async fn describe(&self, stmt: &Statement) -> Result<Description> {
        let params = parser::param_count(&stmt.text, self.dialect);
        match &stmt.stmt {
            Stmt::Query(q) => match q.as_ref() {
                SqlStatement::ShowVariable { variable } => {
                    let name = variable
                        .iter()
                        .map(|i| i.value.clone())
                        .collect::<Vec<_>>()
                        .join(" ");
                    let columns = if name.eq_ignore_ascii_case("all") {
                        show_all_schema()
                    } else {
                        let def = setting_def(&name).ok_or_else(|| unknown_setting(&name))?;
                        one_column(def.name)
                    };
                    Ok(Description {
                        params: vec![None; params],
                        columns: Some(columns),
                    })
                }
                s if session_statement(s) => Ok(Description {
                    params: vec![None; params],
                    columns: None,
                }),
                _ => {
                    let (core, ctx, q) = (self.core.clone(), self.ctx.clone(), q.as_ref().clone());
                    self.core
                        .executor
                        .run(async move { crate::sql::describe_query(&core, &ctx, q).await })
                        .await
                }
            },
            other => {
                let mut types = vec![None; params];
                // CREATE COMPONENT ... FROM $n takes the bytes as a bytea.
                if let Stmt::CreateComponent {
                    source: crate::sql::parser::ComponentSource::Param(n),
                    ..
                } = other
                {
                    if let Some(t) = n.checked_sub(1).and_then(|i| types.get_mut(i)) {
                        *t = Some(datafusion::arrow::datatypes::DataType::Binary);
                    }
                }
                Ok(Description {
                    params: types,
                    columns: crate::sql::result_schema(other),
                })
            }
        }
    }

    /// Where the session's transaction stands.
    pub fn transaction_status(&self) -> TransactionStatus {
        match &self.block {
            Some(b) if b.explicit && b.failed => TransactionStatus::Failed,
            Some(b) if b.explicit => TransactionStatus::InBlock,
            _ => TransactionStatus::Idle,
        }
    }

    /// Messages for the client about statements that succeeded (PostgreSQL's
    /// NOTICE and WARNING), oldest first.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Settings PostgreSQL reports to its clients (ParameterStatus) that
    /// changed since the last call, with their new values.
    pub fn take_reported(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.reported)
    }

    /// Every reported setting with its value (sent once at connection start).
    pub fn reported_settings(&self) -> Vec<(String, String)> {
        SETTINGS
            .iter()
            .filter_map(|d| Some((d.reported?.to_string(), self.values[d.name].clone())))
            .collect()
    }

    /// A setting's value.
    pub fn get(&self, name: &str) -> Option<String> {
        setting_def(name).map(|d| self.values[d.name].clone())
    }

    /// Changes a setting for the rest of the session (also from connection
    /// parameters); an unknown or read-only setting or a value it does not
    /// take is an error.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        self.set_value(name, value, false)
    }

    /// Stops any statement still running at `deadline` (as a statement
    /// timeout does, SQLSTATE 57014): a limit for a whole request.
    pub fn set_deadline(&mut self, deadline: Option<std::time::Instant>) {
        self.deadline = deadline.map(tokio::time::Instant::from_std);
    }

    /// The session's statement timeout, if it has one.
    pub fn statement_timeout(&self) -> Option<Duration> {
        let ms: u64 = self.values["statement_timeout"].parse().unwrap_or(0);
        (ms > 0).then(|| Duration::from_millis(ms))
    }

    fn set_value(&mut self, name: &str, value: &str, local: bool) -> Result<()> {
        if name.trim().to_ascii_lowercase().starts_with("datafusion.") {
            return UnsupportedSnafu {
                message: format!(
                    "cannot set {name}: DataFusion's settings belong to the server, not to a \
                     session; see SHOW ALL for the settings a session may change"
                ),
            }
            .fail();
        }
        let def = setting_def(name).ok_or_else(|| unknown_setting(name))?;
        let value = (def.check)(value).map_err(|why| {
            let message = format!("invalid value for parameter \"{}\": {why}", def.name);
            if why == "cannot be changed" {
                UnsupportedSnafu {
                    message: format!("parameter \"{}\" cannot be changed", def.name),
                }
                .build()
            } else {
                SqlSnafu { message }.build()
            }
        })?;
        if local {
            match self.block.as_mut() {
                Some(b) => {
                    let old = self.values[def.name].clone();
                    b.local.push((def.name, old));
                }
                None => self
                    .notices
                    .push("WARNING: SET LOCAL can only be used in transaction blocks".into()),
            }
            if self.block.is_none() {
                return Ok(());
            }
        }
        self.apply(def, value)
    }

    fn apply(&mut self, def: &'static SettingDef, value: String) -> Result<()> {
        if def.name == "search_path" {
            if let Some(database) = search_path_database(&value) {
                self.use_database(&database)?;
            }
        }
        if def.name == "timezone" {
            let state = self.ctx.state_ref();
            let mut state = state.write();
            state.config_mut().options_mut().execution.time_zone =
                (value != "UTC").then(|| value.clone());
        }
        if let Some(reported) = def.reported {
            if self.values[def.name] != value {
                self.reported.push((reported.to_string(), value.clone()));
            }
        }
        self.values.insert(def.name, value);
        Ok(())
    }

    fn reset(&mut self, name: Option<&str>) -> Result<()> {
        let names: Vec<&'static SettingDef> = match name {
            None => SETTINGS
                .iter()
                .filter(|d| (d.check)(d.default).is_ok())
                .collect(),
            Some(n) => vec![setting_def(n).ok_or_else(|| unknown_setting(n))?],
        };
        for def in names {
            let value = self.defaults[def.name].clone();
            self.apply(def, value)?;
        }
        Ok(())
    }

    fn open_block(&mut self, explicit: bool) {
        if let Ok(mut staged) = self.shared.staged.lock() {
            *staged = Some(Staged::new());
        }
        self.block = Some(Block {
            explicit,
            failed: false,
            ddl: Vec::new(),
            local: Vec::new(),
        });
    }

    /// A statement failed: an explicit block is now failed; an implicit one
    /// (a script) is rolled back.
    fn fail_block(&mut self) {
        match self.block.as_mut() {
            Some(b) if b.explicit => b.failed = true,
            Some(_) => {
                if let Some(b) = self.end_block() {
                    if !b.ddl.is_empty() {
                        self.notices.push(format!(
                            "WARNING: nothing this query wrote was kept, but {} took effect \
                             when it ran and stays (sandflow's DDL is not transactional)",
                            b.ddl.join(", ")
                        ));
                    }
                }
            }
            None => {}
        }
    }

    /// Closes the block, discarding staged writes and undoing SET LOCAL;
    /// returns it.
    fn end_block(&mut self) -> Option<Block> {
        if let Ok(mut staged) = self.shared.staged.lock() {
            *staged = None;
        }
        let block = self.block.take()?;
        for (name, old) in block.local.iter().rev() {
            if let Some(def) = setting_def(name) {
                let _ = self.apply(def, old.clone());
            }
        }
        Some(block)
    }

    /// Commits the open block's staged writes in one storage transaction.
    async fn commit_block(&mut self, cancel: Option<&mut oneshot::Receiver<()>>) -> Result<()> {
        let staged = self
            .shared
            .staged
            .lock()
            .map_err(|_| poisoned())?
            .take()
            .unwrap_or_default();
        self.end_block();
        if staged.is_empty() {
            return Ok(());
        }
        let core = self.core.clone();
        let control = Arc::new(StatementControl::default());
        self.guarded(control.clone(), cancel, async move {
            control.begin_commit()?;
            let c = core.clone();
            crate::sql::provider::blocking(move || {
                let mut set = WriteSet::new();
                set.staged(staged);
                c.store.commit(set)
            })
            .await?;
            Ok(Output::Affected {
                tag: "COMMIT".into(),
                rows: 0,
            })
        })
        .await
        .map(|_| ())
    }

    /// Runs `work` on the executor under the session's statement timeout and
    /// `cancel`, through `control`'s gate.
    async fn guarded(
        &self,
        control: Arc<StatementControl>,
        cancel: Option<&mut oneshot::Receiver<()>>,
        work: impl std::future::Future<Output = Result<Output>> + Send + 'static,
    ) -> Result<Output> {
        if let Ok(mut c) = self.shared.control.lock() {
            *c = Some(control.clone());
        }
        let run = self.core.executor.run(work);
        tokio::pin!(run);
        let now = tokio::time::Instant::now();
        let until = match (self.statement_timeout().map(|t| now + t), self.deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = until;
        let sleep =
            tokio::time::sleep_until(until.unwrap_or(now + Duration::from_secs(86_400 * 365)));
        tokio::pin!(sleep);
        let mut cancel = cancel;
        let mut waiting_for_commit = false;
        let result = loop {
            tokio::select! {
                r = &mut run => break r,
                _ = &mut sleep, if timeout.is_some() && !waiting_for_commit => {
                    if control.stop() {
                        break CancelledSnafu {
                            message: "canceling statement due to statement timeout",
                        }
                        .fail();
                    }
                    waiting_for_commit = true;
                }
                r = async { cancel.as_mut().expect("guarded by is_some").await },
                    if cancel.is_some() && !waiting_for_commit =>
                {
                    if r.is_ok() && control.stop() {
                        break CancelledSnafu {
                            message: "canceling statement due to user request",
                        }
                        .fail();
                    }
                    if r.is_err() {
                        // The canceller went away: nobody can cancel any more.
                        cancel = None;
                    } else {
                        waiting_for_commit = true;
                    }
                }
            }
        };
        if let Ok(mut c) = self.shared.control.lock() {
            *c = None;
        }
        result
    }

    /// Runs one statement; a statement refused for lack of privileges is
    /// logged with the user and the client's address, and counted in
    /// `sandflow_permission_denied_total`.
    async fn run_owned(
        &mut self,
        stmt: Statement,
        params: Option<ParamValues>,
        cancel: Option<&mut oneshot::Receiver<()>>,
    ) -> Result<Output> {
        let tag = stmt.tag();
        // Boxed: a statement's future is large, and callers poll theirs on
        // their own (test, door) threads' stacks.
        let result = Box::pin(self.run_checked(stmt, params, cancel)).await;
        if let Err(e @ Error::PermissionDenied { .. }) = &result {
            tracing::warn!(
                user = self.shared.principal.name(),
                peer = self.peer.as_deref().unwrap_or(""),
                statement = %tag,
                "statement denied: {e}"
            );
            self.core
                .metrics
                .counter(
                    "sandflow_permission_denied_total",
                    "Statements refused because the session's user lacks a privilege.",
                    &[],
                )
                .inc();
        }
        result
    }

    async fn run_checked(
        &mut self,
        stmt: Statement,
        params: Option<ParamValues>,
        mut cancel: Option<&mut oneshot::Receiver<()>>,
    ) -> Result<Output> {
        if let Some(b) = &self.block {
            if b.failed && !ends_block(&stmt.stmt) {
                return TransactionSnafu {
                    message: "current transaction is aborted, commands ignored until end of \
                              transaction block (send ROLLBACK)",
                }
                .fail();
            }
        }
        // Parameters of sandflow's own statements are bound as literals.
        let stmt = match (&stmt.stmt, &params) {
            (Stmt::Query(_), _) | (_, None) => stmt,
            (_, Some(values)) => {
                let literals = literals(values)?;
                let text = parser::bind_params(&stmt.text, &literals, self.dialect)?;
                let mut again = parse_script(&text, self.dialect)?;
                if again.len() != 1 {
                    return SqlSnafu {
                        message: "a parameter turned one statement into several",
                    }
                    .fail();
                }
                again.remove(0)
            }
        };
        if let Stmt::Query(q) = &stmt.stmt {
            if let Some(out) = self.session_statement(q, cancel.as_deref_mut()).await? {
                return Ok(out);
            }
        }
        if let Stmt::Use(database) = &stmt.stmt {
            self.use_database(database)?;
            return Ok(Output::Affected {
                tag: "USE".into(),
                rows: 0,
            });
        }
        let mut stmt = stmt;
        stmt.stmt.bind_database(&self.database());
        let ddl = stmt.is_ddl();
        if ddl {
            if let Some(b) = self.block.as_mut() {
                let tag = stmt.tag();
                if b.explicit {
                    self.notices.push(format!(
                        "WARNING: {tag} takes effect now and stays even if this transaction \
                         is rolled back: sandflow's DDL is not transactional"
                    ));
                }
                b.ddl.push(tag);
            }
        }
        let control = Arc::new(StatementControl::default());
        let (core, ctx) = (self.core.clone(), self.ctx.clone());
        let work =
            async move { crate::sql::execute_statement(&core, &ctx, stmt.stmt, params).await };
        self.guarded(control, cancel, work).await
    }

    /// Session and transaction statements; `None` for every other statement.
    async fn session_statement(
        &mut self,
        q: &SqlStatement,
        cancel: Option<&mut oneshot::Receiver<()>>,
    ) -> Result<Option<Output>> {
        let done = |tag: &str| {
            Ok(Some(Output::Affected {
                tag: tag.to_string(),
                rows: 0,
            }))
        };
        match q {
            SqlStatement::StartTransaction { modes, .. } => {
                check_modes(modes)?;
                match self.block.as_mut() {
                    Some(b) if b.explicit => self
                        .notices
                        .push("WARNING: there is already a transaction in progress".into()),
                    // BEGIN inside a script: its implicit block becomes explicit.
                    Some(b) => b.explicit = true,
                    None => self.open_block(true),
                }
                done("BEGIN")
            }
            SqlStatement::Commit { .. } => {
                let failed = self.block.as_ref().is_some_and(|b| b.failed);
                match &self.block {
                    None => {
                        self.notices
                            .push("WARNING: there is no transaction in progress".into());
                        done("COMMIT")
                    }
                    Some(_) if failed => {
                        self.end_block();
                        done("ROLLBACK")
                    }
                    Some(_) => {
                        self.commit_block(cancel).await?;
                        done("COMMIT")
                    }
                }
            }
            SqlStatement::Rollback {
                savepoint: Some(_), ..
            } => UnsupportedSnafu {
                message: "savepoints are not supported; ROLLBACK the whole transaction",
            }
            .fail(),
            SqlStatement::Rollback { .. } => {
                match self.end_block() {
                    None => self
                        .notices
                        .push("WARNING: there is no transaction in progress".into()),
                    Some(b) if !b.ddl.is_empty() => self.notices.push(format!(
                        "WARNING: ROLLBACK discarded the transaction's writes; {} took effect \
                         when it ran and was not undone (sandflow's DDL is not transactional)",
                        b.ddl.join(", ")
                    )),
                    Some(_) => {}
                }
                done("ROLLBACK")
            }
            SqlStatement::Savepoint { .. } | SqlStatement::ReleaseSavepoint { .. } => {
                UnsupportedSnafu {
                    message: "savepoints are not supported; use one transaction block",
                }
                .fail()
            }
            SqlStatement::Set(set) => {
                self.set_statement(set)?;
                done("SET")
            }
            SqlStatement::Reset(r) => {
                use datafusion::sql::sqlparser::ast::Reset;
                match &r.reset {
                    Reset::ALL => self.reset(None)?,
                    Reset::ConfigurationParameter(name) => self.reset(Some(&name.to_string()))?,
                }
                done("RESET")
            }
            SqlStatement::ShowVariable { variable } => {
                let name = variable
                    .iter()
                    .map(|i| i.value.clone())
                    .collect::<Vec<_>>()
                    .join(" ");
                Ok(Some(self.show(&name)?))
            }
            SqlStatement::Discard { .. } => {
                if self.block.is_some() {
                    return TransactionSnafu {
                        message: "DISCARD cannot run inside a transaction block",
                    }
                    .fail();
                }
                self.reset(None)?;
                done("DISCARD ALL")
            }
            SqlStatement::Copy { .. } => UnsupportedSnafu {
                message: "COPY to or from a file or program is not allowed: the server never \
                          reads or writes its own files for a client. Use COPY ... TO STDOUT or \
                          COPY ... FROM STDIN over the PostgreSQL protocol (psql's \\copy)",
            }
            .fail(),
            SqlStatement::Prepare { .. }
            | SqlStatement::Execute { .. }
            | SqlStatement::Deallocate { .. } => UnsupportedSnafu {
                message: "SQL-level PREPARE/EXECUTE is not supported; use your driver's \
                          prepared statements (the extended query protocol)",
            }
            .fail(),
            SqlStatement::Declare { .. }
            | SqlStatement::Fetch { .. }
            | SqlStatement::Close { .. } => UnsupportedSnafu {
                message: "cursors are not supported; use LIMIT and OFFSET, or your driver's \
                          row streaming",
            }
            .fail(),
            SqlStatement::LISTEN { .. }
            | SqlStatement::UNLISTEN { .. }
            | SqlStatement::NOTIFY { .. } => UnsupportedSnafu {
                message: "LISTEN/NOTIFY is not supported; flows keep query results up to date",
            }
            .fail(),
            _ => Ok(None),
        }
    }

    fn set_statement(&mut self, set: &Set) -> Result<()> {
        match set {
            Set::SingleAssignment {
                scope,
                variable,
                values,
                ..
            } => {
                use datafusion::sql::sqlparser::ast::ContextModifier;
                let local = matches!(scope, Some(ContextModifier::Local));
                let name = variable.to_string();
                let value = values
                    .iter()
                    .map(setting_text)
                    .collect::<Vec<_>>()
                    .join(", ");
                if value.eq_ignore_ascii_case("default") {
                    return self.reset(Some(&name));
                }
                self.set_value(&name, &value, local)
            }
            Set::SetTimeZone { local, value } => {
                self.set_value("timezone", &setting_text(value), *local)
            }
            Set::SetNames { charset_name, .. } => {
                self.set_value("client_encoding", &charset_name.value, false)
            }
            Set::SetTransaction { modes, .. } => check_modes(modes),
            Set::MultipleAssignments { assignments } => {
                for a in assignments {
                    self.set_value(&a.name.to_string(), &setting_text(&a.value), false)?;
                }
                Ok(())
            }
            other => UnsupportedSnafu {
                message: format!("{other} is not supported"),
            }
            .fail(),
        }
    }

    fn show(&self, name: &str) -> Result<Output> {
        if name.eq_ignore_ascii_case("all") {
            let rows: Vec<Vec<String>> = SETTINGS
                .iter()
                .map(|d| {
                    vec![
                        d.reported.unwrap_or(d.name).to_string(),
                        self.values[d.name].clone(),
                        d.description.to_string(),
                    ]
                })
                .collect();
            return string_output(show_all_schema(), rows);
        }
        let def = setting_def(name).ok_or_else(|| unknown_setting(name))?;
        let mut value = self.values[def.name].clone();
        if def.name == "statement_timeout" || def.name.ends_with("_timeout") {
            value = pg_millis(&value);
        }
        string_output(one_column(def.name), vec![vec![value]])
    }
}

/// `"ident"` with quotes doubled.
fn quote_ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// `5000` ms as PostgreSQL shows it (`5s`); 0 stays 0.
fn pg_millis(ms: &str) -> String {
    match ms.parse::<u64>() {
        Ok(0) => "0".into(),
        Ok(n) if n % 60_000 == 0 => format!("{}min", n / 60_000),
        Ok(n) if n % 1000 == 0 => format!("{}s", n / 1000),
        Ok(n) => format!("{n}ms"),
        Err(_) => ms.to_string(),
    }
}

/// The text of a setting's value as written (`'x'`, `x`, `5`, `-1`).
fn setting_text(e: &SqlExpr) -> String {
    match e {
        SqlExpr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
            Value::Number(n, _) => n.to_string(),
            Value::Boolean(b) => if *b { "on" } else { "off" }.to_string(),
            other => other.to_string(),
        },
        SqlExpr::Identifier(i) => i.value.clone(),
        other => other.to_string(),
    }
}

fn check_modes(modes: &[TransactionMode]) -> Result<()> {
    for m in modes {
        match m {
            TransactionMode::IsolationLevel(TransactionIsolationLevel::ReadCommitted) => {}
            TransactionMode::AccessMode(
                datafusion::sql::sqlparser::ast::TransactionAccessMode::ReadWrite,
            ) => {}
            other => {
                return UnsupportedSnafu {
                    message: format!(
                        "{other} is not supported: transactions are READ COMMITTED and read-write"
                    ),
                }
                .fail()
            }
        }
    }
    Ok(())
}

/// Statements a session handles itself (not DataFusion, not the catalog).
fn session_statement(s: &SqlStatement) -> bool {
    matches!(
        s,
        SqlStatement::StartTransaction { .. }
            | SqlStatement::Commit { .. }
            | SqlStatement::Rollback { .. }
            | SqlStatement::Savepoint { .. }
            | SqlStatement::ReleaseSavepoint { .. }
            | SqlStatement::Set(_)
            | SqlStatement::Reset(_)
            | SqlStatement::Discard { .. }
    )
}

fn ends_block(stmt: &Stmt) -> bool {
    matches!(stmt, Stmt::Query(q) if matches!(q.as_ref(), SqlStatement::Commit { .. } | SqlStatement::Rollback { savepoint: None, .. }))
}

fn unknown_setting(name: &str) -> Error {
    crate::error::NotFoundSnafu {
        message: format!(
            "unrecognized configuration parameter \"{}\"; SHOW ALL lists the settings a session \
             may read and change",
            name.trim()
        ),
    }
    .build()
}

fn one_column(name: &str) -> SchemaRef {
    Arc::new(Schema::new(vec![Field::new(name, DataType::Utf8, false)]))
}

fn show_all_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("name", DataType::Utf8, false),
        Field::new("setting", DataType::Utf8, false),
        Field::new("description", DataType::Utf8, false),
    ]))
}

fn string_output(schema: SchemaRef, rows: Vec<Vec<String>>) -> Result<Output> {
    let columns: Vec<ArrayRef> = (0..schema.fields().len())
        .map(|i| {
            Arc::new(StringArray::from_iter_values(
                rows.iter().map(|r| r[i].as_str()),
            )) as ArrayRef
        })
        .collect();
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(|e| {
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

/// Parameter values as SQL literals, for sandflow's own statements.
fn literals(values: &ParamValues) -> Result<Vec<String>> {
    match values {
        ParamValues::List(v) => v
            .iter()
            .map(|s| crate::sql::scalar_literal(&s.value))
            .collect(),
        ParamValues::Map(_) => UnsupportedSnafu {
            message: "named parameters are not supported; use $1, $2, ...",
        }
        .fail(),
    }
}

/// Parses a script (lexed once); every statement is parsed before any runs.
fn parse_script(sql: &str, dialect: Dialect) -> Result<Vec<Statement>> {
    Ok(parser::parse_script(sql, dialect)?
        .into_iter()
        .map(|(text, stmt)| Statement { stmt, text })
        .collect())
}
