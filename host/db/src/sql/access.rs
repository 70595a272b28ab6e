//! The statements of users and privileges, and the privilege checks of
//! sandflow's own statements.
//!
//! - `CREATE USER name [WITH] [PASSWORD 'pw' | IDENTIFIED BY 'pw']
//!   [SUPERUSER | NOSUPERUSER] [CREATEDB | NOCREATEDB]` (also `CREATE ROLE`,
//!   `IF NOT EXISTS`), `ALTER USER name [WITH] ...`, `DROP USER [IF EXISTS]
//!   a, b`.
//! - `GRANT { ALL [PRIVILEGES] | SELECT, INSERT, DELETE, CREATE } ON
//!   { DATABASE db | [TABLE] t | ALL TABLES IN SCHEMA db } TO u, ...` and
//!   `REVOKE ... FROM u, ...`.
//! - `CREATE DATABASE db WITH (max_flows = 10, ...)` and `ALTER DATABASE db
//!   SET (name = value, ...)`: tenant quotas ([`crate::auth::Quotas`]).
//! - `SHOW USERS`, `SHOW GRANTS`.
//!
//! [`authorize`] says whether the session's principal may run one of
//! sandflow's own statements (DataFusion's are checked on their plans, see
//! [`super::visible`]).

use std::sync::Arc;

use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

use super::parser::{self, Stmt, TableName};
use crate::auth::{GrantTarget, Principal, Privilege, Quotas, UserOptions};
use crate::database::{Core, Output};
use crate::error::{
    DatabaseNotFoundSnafu, PermissionDeniedSnafu, Result, SqlSnafu, UnsupportedSnafu,
};
use crate::sql::provider::blocking;

/// A statement of users, privileges or database options.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessStmt {
    CreateUser {
        name: String,
        options: UserOptions,
        if_not_exists: bool,
    },
    AlterUser {
        name: String,
        options: UserOptions,
    },
    DropUser {
        names: Vec<String>,
        if_exists: bool,
    },
    Grant {
        privileges: Vec<Privilege>,
        target: AccessTarget,
        users: Vec<String>,
        /// REVOKE when false.
        grant: bool,
    },
    AlterDatabase {
        name: String,
        options: Vec<(String, String)>,
    },
    ShowUsers,
    ShowGrants {
        user: Option<String>,
    },
}

/// A GRANT's object before the session's database is known.
#[derive(Debug, Clone, PartialEq)]
pub enum AccessTarget {
    Database(String),
    Table(TableName),
}

fn syntax(message: impl Into<String>) -> crate::error::Error {
    SqlSnafu {
        message: format!("SQL syntax error: {}", message.into()),
    }
    .build()
}

fn word_is(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn peek_is(p: &Parser, n: usize, word: &str) -> bool {
    word_is(&p.peek_nth_token(n).token, word)
}

/// A user name: an identifier or a string (`'alice'`, MySQL's
/// `'alice'@'%'` with the host ignored).
fn user_name(p: &mut Parser) -> Result<String> {
    let name = match p.next_token().token {
        Token::Word(w) => match w.quote_style {
            Some(_) => w.value,
            None => w.value.to_lowercase(),
        },
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
        other => return Err(syntax(format!("expected a user name, found {other}"))),
    };
    // MySQL's user@host: the host part is not used.
    if p.peek_token().token == Token::AtSign {
        p.next_token();
        p.next_token();
    }
    Ok(name)
}

fn user_names(p: &mut Parser) -> Result<Vec<String>> {
    let mut names = vec![user_name(p)?];
    while p.consume_token(&Token::Comma) {
        names.push(user_name(p)?);
    }
    Ok(names)
}

fn string_value(p: &mut Parser, what: &str) -> Result<String> {
    match p.next_token().token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Ok(s),
        Token::EscapedStringLiteral(s) => Ok(s),
        other => Err(syntax(format!(
            "expected {what} as a quoted string, found {other}"
        ))),
    }
}

fn user_options(p: &mut Parser) -> Result<UserOptions> {
    let mut o = UserOptions::default();
    let _ = p.parse_keyword(Keyword::WITH);
    loop {
        let t = p.peek_token().token;
        if word_is(&t, "PASSWORD") {
            p.next_token();
            if p.parse_keyword(Keyword::NULL) {
                o.password = Some(None);
            } else {
                o.password = Some(Some(string_value(p, "the password")?));
            }
        } else if word_is(&t, "ENCRYPTED") || word_is(&t, "UNENCRYPTED") {
            p.next_token();
        } else if word_is(&t, "IDENTIFIED") {
            p.next_token();
            if !p.parse_keyword(Keyword::BY) {
                return Err(syntax("expected BY after IDENTIFIED"));
            }
            o.password = Some(Some(string_value(p, "the password")?));
        } else if word_is(&t, "SUPERUSER") {
            p.next_token();
            o.superuser = Some(true);
        } else if word_is(&t, "NOSUPERUSER") {
            p.next_token();
            o.superuser = Some(false);
        } else if word_is(&t, "CREATEDB") {
            p.next_token();
            o.createdb = Some(true);
        } else if word_is(&t, "NOCREATEDB") {
            p.next_token();
            o.createdb = Some(false);
        } else if word_is(&t, "LOGIN") || word_is(&t, "INHERIT") || word_is(&t, "NOINHERIT") {
            p.next_token();
        } else if matches!(t, Token::EOF | Token::SemiColon) {
            return Ok(o);
        } else {
            return Err(syntax(format!(
                "unexpected {t} in a user's options; sandflow knows PASSWORD 'pw', SUPERUSER, \
                 NOSUPERUSER, CREATEDB and NOCREATEDB"
            )));
        }
    }
}

/// `(name = value, ...)` or `name = value, ...` (database options).
fn option_list(p: &mut Parser) -> Result<Vec<(String, String)>> {
    let paren = p.consume_token(&Token::LParen);
    let mut out = Vec::new();
    loop {
        if paren && p.consume_token(&Token::RParen) {
            break;
        }
        let name = match p.next_token().token {
            Token::Word(w) => w.value.to_lowercase(),
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.to_lowercase(),
            other => return Err(syntax(format!("expected an option name, found {other}"))),
        };
        if !p.consume_token(&Token::Eq) {
            return Err(syntax(format!("expected = after option {name}")));
        }
        let value = match p.next_token().token {
            Token::Number(n, _) => n,
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
            Token::Word(w) => w.value,
            other => {
                return Err(syntax(format!(
                    "expected a value for {name}, found {other}"
                )))
            }
        };
        out.push((name, value));
        if !p.consume_token(&Token::Comma) {
            if paren && !p.consume_token(&Token::RParen) {
                return Err(syntax("expected , or ) in the option list"));
            }
            break;
        }
    }
    Ok(out)
}

fn privileges(p: &mut Parser) -> Result<Vec<Privilege>> {
    if p.parse_keyword(Keyword::ALL) {
        let _ = p.parse_keyword(Keyword::PRIVILEGES);
        return Ok(Privilege::EVERY.to_vec());
    }
    let mut out = Vec::new();
    loop {
        let t = p.next_token().token;
        let Token::Word(w) = &t else {
            return Err(syntax(format!("expected a privilege, found {t}")));
        };
        match Privilege::from_name(&w.value) {
            Some(pr) => out.push(pr),
            None if w.value.eq_ignore_ascii_case("UPDATE") => {
                return UnsupportedSnafu {
                    message: "the UPDATE privilege does not exist in sandflow (UPDATE is not \
                              supported; INSERT replaces rows): grant INSERT",
                }
                .fail()
            }
            None => {
                return Err(syntax(format!(
                    "unknown privilege {}; sandflow grants SELECT, INSERT, DELETE, CREATE and ALL",
                    w.value
                )))
            }
        }
        if !p.consume_token(&Token::Comma) {
            return Ok(out);
        }
    }
}

fn target(p: &mut Parser) -> Result<AccessTarget> {
    if p.parse_keyword(Keyword::DATABASE) || p.parse_keyword(Keyword::SCHEMA) {
        let name = p
            .parse_object_name(false)
            .map_err(|e| syntax(e.to_string()))?;
        return Ok(AccessTarget::Database(parser::table_name(&name)?.table));
    }
    if p.parse_keywords(&[Keyword::ALL, Keyword::TABLES, Keyword::IN, Keyword::SCHEMA]) {
        let name = p
            .parse_object_name(false)
            .map_err(|e| syntax(e.to_string()))?;
        return Ok(AccessTarget::Database(parser::table_name(&name)?.table));
    }
    let _ = p.parse_keyword(Keyword::TABLE);
    let name = p
        .parse_object_name(false)
        .map_err(|e| syntax(e.to_string()))?;
    Ok(AccessTarget::Table(parser::table_name(&name)?))
}

fn end(p: &mut Parser) -> Result<()> {
    match p.peek_token().token {
        Token::EOF | Token::SemiColon => Ok(()),
        other => Err(syntax(format!(
            "unexpected {other} at the end of the statement"
        ))),
    }
}

/// Parses a statement of users, privileges or database options; `None`
/// (nothing consumed) for any other statement.
pub(crate) fn parse(p: &mut Parser) -> Result<Option<Stmt>> {
    let user_word = |p: &Parser, n| peek_is(p, n, "USER") || peek_is(p, n, "ROLE");
    if is_kw(p, 0, Keyword::CREATE) && user_word(p, 1) {
        p.next_token();
        p.next_token();
        let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name = user_name(p)?;
        let options = user_options(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::CreateUser {
            name,
            options,
            if_not_exists,
        })));
    }
    if is_kw(p, 0, Keyword::ALTER) && user_word(p, 1) {
        p.next_token();
        p.next_token();
        let name = user_name(p)?;
        let options = user_options(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::AlterUser { name, options })));
    }
    if is_kw(p, 0, Keyword::DROP) && user_word(p, 1) {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let names = user_names(p)?;
        end(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::DropUser {
            names,
            if_exists,
        })));
    }
    if is_kw(p, 0, Keyword::GRANT) || is_kw(p, 0, Keyword::REVOKE) {
        let grant = is_kw(p, 0, Keyword::GRANT);
        p.next_token();
        let privileges = privileges(p)?;
        if !p.parse_keyword(Keyword::ON) {
            return Err(syntax("expected ON after the privileges"));
        }
        let target = target(p)?;
        let word = if grant { Keyword::TO } else { Keyword::FROM };
        if !p.parse_keyword(word) {
            return Err(syntax(if grant {
                "expected TO user after GRANT ... ON ..."
            } else {
                "expected FROM user after REVOKE ... ON ..."
            }));
        }
        let users = user_names(p)?;
        if p.parse_keywords(&[Keyword::WITH, Keyword::GRANT, Keyword::OPTION]) {
            return UnsupportedSnafu {
                message: "WITH GRANT OPTION is not supported: a database's owner and superusers \
                          grant on it",
            }
            .fail();
        }
        let _ = p.parse_keyword(Keyword::CASCADE) || p.parse_keyword(Keyword::RESTRICT);
        end(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::Grant {
            privileges,
            target,
            users,
            grant,
        })));
    }
    if is_kw(p, 0, Keyword::ALTER)
        && (is_kw(p, 1, Keyword::DATABASE) || is_kw(p, 1, Keyword::SCHEMA))
    {
        p.next_token();
        p.next_token();
        let name = p
            .parse_object_name(false)
            .map_err(|e| syntax(e.to_string()))?;
        let name = parser::table_name(&name)?.table;
        if !p.parse_keyword(Keyword::SET) {
            return UnsupportedSnafu {
                message:
                    "ALTER DATABASE supports SET (option = value, ...) only, with the options \
                          max_flows, flow_memory_limit, max_cpu_limit_per_tick, max_tables and \
                          max_storage",
            }
            .fail();
        }
        let options = option_list(p)?;
        end(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::AlterDatabase {
            name,
            options,
        })));
    }
    if is_kw(p, 0, Keyword::CREATE)
        && (is_kw(p, 1, Keyword::DATABASE) || is_kw(p, 1, Keyword::SCHEMA))
    {
        // With options only (the generic parser takes the rest):
        // CREATE DATABASE [IF NOT EXISTS] name WITH (...).
        let name_at = if is_kw(p, 2, Keyword::IF) { 5 } else { 2 };
        if !is_kw(p, name_at + 1, Keyword::WITH) {
            return Ok(None);
        }
        p.next_token();
        p.next_token();
        let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
        let name = p
            .parse_object_name(false)
            .map_err(|e| syntax(e.to_string()))?;
        let name = parser::table_name(&name)?.table;
        let _ = p.parse_keyword(Keyword::WITH);
        let options = option_list(p)?;
        end(p)?;
        return Ok(Some(Stmt::CreateDatabase {
            name,
            if_not_exists,
            options,
        }));
    }
    if is_kw(p, 0, Keyword::SHOW) && (peek_is(p, 1, "USERS") || peek_is(p, 1, "ROLES")) {
        p.next_token();
        p.next_token();
        end(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::ShowUsers)));
    }
    if is_kw(p, 0, Keyword::SHOW) && peek_is(p, 1, "GRANTS") {
        p.next_token();
        p.next_token();
        let user = if p.parse_keyword(Keyword::FOR) {
            Some(user_name(p)?)
        } else {
            None
        };
        end(p)?;
        return Ok(Some(Stmt::Access(AccessStmt::ShowGrants { user })));
    }
    Ok(None)
}

fn is_kw(p: &Parser, n: usize, kw: Keyword) -> bool {
    matches!(&p.peek_nth_token(n).token, Token::Word(w) if w.keyword == kw)
}

/// Runs a statement of users and privileges as `who`.
pub(crate) async fn execute(
    core: &Arc<Core>,
    who: &Principal,
    database: &str,
    stmt: AccessStmt,
) -> Result<Output> {
    let done = |tag: &str| Output::Affected {
        tag: tag.to_string(),
        rows: 0,
    };
    let (c, w) = (core.clone(), who.clone());
    match stmt {
        AccessStmt::CreateUser {
            name,
            options,
            if_not_exists,
        } => {
            blocking(move || {
                c.access
                    .create_user(&c.store, &w, &name, &options, if_not_exists)
            })
            .await?;
            Ok(done("CREATE ROLE"))
        }
        AccessStmt::AlterUser { name, options } => {
            blocking(move || c.access.alter_user(&c.store, &w, &name, &options)).await?;
            core.flows.recheck_owners(core).await;
            Ok(done("ALTER ROLE"))
        }
        AccessStmt::DropUser { names, if_exists } => {
            blocking(move || {
                for n in &names {
                    c.access.drop_user(&c.store, &w, n, if_exists)?;
                }
                Ok(())
            })
            .await?;
            core.flows.recheck_owners(core).await;
            Ok(done("DROP ROLE"))
        }
        AccessStmt::Grant {
            privileges,
            target,
            users,
            grant,
        } => {
            let target = match target {
                AccessTarget::Database(d) => {
                    require_database(core, &d)?;
                    GrantTarget::Database(d)
                }
                AccessTarget::Table(mut t) => {
                    t.bind(database);
                    core.catalog.require_table(&t.database, &t.table)?;
                    GrantTarget::Table {
                        database: t.database,
                        table: t.table,
                    }
                }
            };
            blocking(move || {
                c.access
                    .grant(&c.store, &w, &privileges, &target, &users, grant)
            })
            .await?;
            if !grant {
                core.flows.recheck_owners(core).await;
            }
            Ok(done(if grant { "GRANT" } else { "REVOKE" }))
        }
        AccessStmt::AlterDatabase { name, options } => {
            require_database(core, &name)?;
            blocking(move || c.access.set_quotas(&c.store, &w, &name, &options)).await?;
            Ok(done("ALTER DATABASE"))
        }
        AccessStmt::ShowUsers => {
            let rows = core
                .access
                .users(who)
                .into_iter()
                .map(|(n, s, d)| vec![n, yes(s), yes(d)])
                .collect();
            super::string_rows(&["User", "Superuser", "Createdb"], rows)
        }
        AccessStmt::ShowGrants { user } => {
            let rows = core
                .access
                .grants(who)
                .into_iter()
                .filter(|(u, ..)| user.as_ref().is_none_or(|x| x == u))
                .map(|(u, d, t, ps)| {
                    let object = match t {
                        Some(t) => format!("TABLE {d}.{t}"),
                        None => format!("DATABASE {d}"),
                    };
                    let ps: Vec<&str> = ps.iter().map(|p| p.name()).collect();
                    vec![u, object, ps.join(", ")]
                })
                .collect();
            super::string_rows(&["User", "Object", "Privileges"], rows)
        }
    }
}

fn yes(b: bool) -> String {
    if b { "yes" } else { "no" }.to_string()
}

fn require_database(core: &Core, name: &str) -> Result<()> {
    if core.catalog.database_exists(name)? {
        return Ok(());
    }
    DatabaseNotFoundSnafu {
        message: format!("database '{name}' does not exist; see SHOW DATABASES"),
    }
    .fail()
}

/// Refuses `adding` tables to `database` past its `max_tables` quota.
pub(crate) fn check_table_quota(core: &Core, database: &str, adding: u64) -> Result<()> {
    let quotas = core.access.quotas(database);
    if quotas.max_tables.is_none() {
        return Ok(());
    }
    let used = core.catalog.tables(database)?.len() as u64;
    core.access
        .check_quota(database, "max_tables", quotas.max_tables, used, adding, "")
}

/// How long a measurement of a database's storage is reused.
const STORAGE_MEASURE_TTL: std::time::Duration = std::time::Duration::from_secs(1);

/// Refuses a write into `database` once its rows take `max_storage` bytes
/// or more. The bytes are measured (keys and values as stored), at most once
/// a second per database: a burst of writes may go a little past the quota
/// before the next measurement sees it.
pub(crate) fn check_storage_quota(core: &Core, database: &str) -> Result<()> {
    let Some(limit) = core.access.quotas(database).max_storage else {
        return Ok(());
    };
    let cached = core
        .storage_used
        .lock()
        .ok()
        .and_then(|m| m.get(database).copied())
        .filter(|(at, _)| at.elapsed() < STORAGE_MEASURE_TTL)
        .map(|(_, used)| used);
    let used = match cached {
        Some(used) => used,
        None => {
            let view = core.store.view()?;
            let mut used = 0;
            for t in core.catalog.tables(database)? {
                used += view.table_bytes(t.id())?;
            }
            if let Ok(mut m) = core.storage_used.lock() {
                m.insert(database.to_string(), (std::time::Instant::now(), used));
            }
            used
        }
    };
    if used < limit {
        return Ok(());
    }
    crate::error::LimitExceededSnafu {
        message: format!(
            "quota max_storage of database {database} exceeded: its tables take {used} bytes, \
             the quota is {limit} bytes; delete rows or drop tables, or a superuser can raise it \
             with ALTER DATABASE {database} SET (max_storage = ...)"
        ),
    }
    .fail()
}

/// The quotas a `CREATE DATABASE ... WITH (...)` sets.
pub(crate) fn quotas_of(options: &[(String, String)]) -> Result<Quotas> {
    let mut q = Quotas::default();
    q.apply(options)?;
    Ok(q)
}

/// Whether `who` may run sandflow's own statement `stmt` (bound to the
/// session's database). Listings are filtered where they run; flows are
/// checked where they are created.
pub(crate) fn authorize(core: &Core, who: &Principal, database: &str, stmt: &Stmt) -> Result<()> {
    if *who == Principal::Root || core.access.is_superuser(who) {
        return Ok(());
    }
    let access = &core.access;
    let see_table = |t: &TableName| -> Result<()> {
        if access.can_see_table(who, &t.database, &t.table) {
            return Ok(());
        }
        PermissionDeniedSnafu {
            message: format!(
                "permission denied for table {}.{}: user {} has no privilege on it",
                t.database,
                t.table,
                who.name()
            ),
        }
        .fail()
    };
    match stmt {
        Stmt::CreateTable(ct) => {
            // LIKE reads the other table's definition, as SHOW CREATE TABLE does.
            if let Some(like) = &ct.like {
                see_table(like)?;
            }
            access.check(who, Privilege::Create, &ct.name.database, None)
        }
        Stmt::AlterTable(at) => access.check(who, Privilege::Create, &at.name.database, None),
        Stmt::DropTable { names, .. } => {
            for n in names {
                access.check(who, Privilege::Create, &n.database, None)?;
            }
            Ok(())
        }
        Stmt::CreateDatabase { options, .. } => access.check_create_database(who, options),
        Stmt::DropDatabase { name, .. } => {
            if access.owner(name).as_deref() == Some(who.name()) {
                return Ok(());
            }
            PermissionDeniedSnafu {
                message: format!(
                    "permission denied: only a superuser or the owner of database {name} may \
                     drop it"
                ),
            }
            .fail()
        }
        Stmt::ShowCreateTable(t) | Stmt::Describe(t) => see_table(t),
        Stmt::Use(d) => {
            if access.can_see_database(who, d) || !core.catalog.database_exists(d)? {
                return Ok(());
            }
            PermissionDeniedSnafu {
                message: format!(
                    "permission denied for database {d}: user {} has no privilege on it",
                    who.name()
                ),
            }
            .fail()
        }
        Stmt::DropFlow { name, .. }
        | Stmt::ShowCreateFlow(name)
        | Stmt::AlterFlowComponent { name, .. } => core.flows.check_flow_access(core, who, name),
        // A component belongs to its database like a table: creating and
        // dropping one needs CREATE on it (the flow manager checks the
        // upload again, for the HTTP door).
        Stmt::CreateComponent { name, .. } | Stmt::DropComponent { name, .. } => {
            access.check(who, Privilege::Create, &name.database, None)
        }
        Stmt::Admin { function, args } => match (function.as_str(), args.first()) {
            ("flush_flow" | "pause_flow" | "resume_flow" | "move_flow", Some(name)) => {
                core.flows.check_flow_access(core, who, name)
            }
            ("flush_table" | "compact_table", Some(name)) => {
                let (d, t) = name.split_once('.').unwrap_or((database, name));
                see_table(&TableName {
                    database: d.to_string(),
                    table: t.to_string(),
                    qualified: true,
                })
            }
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}
