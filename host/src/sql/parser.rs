//! sandflow's SQL parser: DataFusion's sqlparser plus GreptimeDB's extensions
//! (`TIME INDEX`, `WITH (append_mode = ...)`, `SHOW CREATE TABLE`, `DESC`).
//!
//! Statements sandflow handles itself become [`Stmt`] variants; everything
//! else stays a sqlparser [`Statement`] for DataFusion to plan.

use datafusion::sql::sqlparser::ast::{
    ColumnOption, Expr, Ident, ObjectName, ObjectNamePart, ObjectType, SchemaName, Statement,
};
use datafusion::sql::sqlparser::dialect::GenericDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{IsOptional, Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::catalog::{ColumnType, DEFAULT_CATALOG, DEFAULT_DATABASE};
use crate::error::{Result, SqlSnafu, UnsupportedSnafu};

/// A table name resolved against the default database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub database: String,
    pub table: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&crate::catalog::display_name(&self.database, &self.table))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub data_type: ColumnType,
    /// `None`: not said (nullable unless time index).
    pub nullable: Option<bool>,
    pub default: Option<Expr>,
    pub comment: Option<String>,
    pub time_index: bool,
    pub primary_key: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateTable {
    pub name: TableName,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnDef>,
    /// From a `TIME INDEX (col)` table constraint.
    pub time_index: Option<String>,
    /// From a `PRIMARY KEY (a, b)` table constraint.
    pub primary_key: Option<Vec<String>>,
    /// `WITH (k = 'v')` options, keys lower-cased.
    pub options: Vec<(String, String)>,
}

/// `CREATE [OR REPLACE] FLOW [IF NOT EXISTS] name SINK TO table
/// [EXPIRE AFTER interval] [COMMENT '...'] [WITH (k = 'v', ...)] AS SELECT ...`
#[derive(Debug, Clone, PartialEq)]
pub struct CreateFlow {
    pub name: String,
    pub or_replace: bool,
    pub if_not_exists: bool,
    pub sink: TableName,
    /// The interval text as written (`'5 minutes'`, `INTERVAL '1 hour'` gives `1 hour`).
    pub expire_after: Option<String>,
    pub comment: Option<String>,
    /// `WITH (k = 'v')` options, keys lower-cased, in the order written.
    pub options: Vec<(String, String)>,
    /// The query text exactly as written after `AS`.
    pub query: String,
}

/// One parsed statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    CreateTable(CreateTable),
    CreateDatabase {
        name: String,
        if_not_exists: bool,
    },
    DropTable {
        names: Vec<TableName>,
        if_exists: bool,
    },
    DropDatabase {
        name: String,
        if_exists: bool,
    },
    ShowTables {
        database: Option<String>,
        like: Option<String>,
    },
    ShowDatabases {
        like: Option<String>,
    },
    ShowCreateTable(TableName),
    Describe(TableName),
    CreateFlow(CreateFlow),
    DropFlow {
        name: String,
        if_exists: bool,
    },
    ShowFlows {
        like: Option<String>,
    },
    ShowCreateFlow(String),
    /// `ADMIN func(arg, ...)`: function name lower-cased, arguments as text.
    Admin {
        function: String,
        args: Vec<String>,
    },
    /// Anything else: planned and run by DataFusion.
    Query(Box<Statement>),
}

fn sql_err(e: ParserError) -> crate::error::Error {
    let msg = match e {
        ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
        ParserError::RecursionLimitExceeded => "statement is nested too deeply".to_string(),
    };
    SqlSnafu {
        message: format!("SQL syntax error: {msg}"),
    }
    .build()
}

fn syntax(message: impl Into<String>) -> crate::error::Error {
    SqlSnafu {
        message: format!("SQL syntax error: {}", message.into()),
    }
    .build()
}

/// Unquoted identifiers are case-insensitive (lower-cased), as in DataFusion.
pub fn normalize_ident(ident: &Ident) -> String {
    match ident.quote_style {
        Some(_) => ident.value.clone(),
        None => ident.value.to_lowercase(),
    }
}

/// Resolves `t`, `db.t` or `greptime.db.t`.
pub fn table_name(name: &ObjectName) -> Result<TableName> {
    let mut parts = Vec::new();
    for part in &name.0 {
        match part {
            ObjectNamePart::Identifier(i) => parts.push(normalize_ident(i)),
            other => return Err(syntax(format!("unexpected table name part {other}"))),
        }
    }
    match parts.as_slice() {
        [t] => Ok(TableName {
            database: DEFAULT_DATABASE.into(),
            table: t.clone(),
        }),
        [d, t] => Ok(TableName {
            database: d.clone(),
            table: t.clone(),
        }),
        [c, d, t] if c == DEFAULT_CATALOG => Ok(TableName {
            database: d.clone(),
            table: t.clone(),
        }),
        _ => Err(syntax(format!(
            "invalid table name {name}; use table, database.table or {DEFAULT_CATALOG}.database.table"
        ))),
    }
}

fn database_name(name: &ObjectName) -> Result<String> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(i)] => Ok(normalize_ident(i)),
        _ => Err(syntax(format!("invalid database name {name}"))),
    }
}

fn is_kw(p: &Parser, n: usize, kw: Keyword) -> bool {
    matches!(&p.peek_nth_token(n).token, Token::Word(w) if w.keyword == kw)
}

/// Parses `;`-separated statements.
pub fn parse(sql: &str) -> Result<Vec<Stmt>> {
    let dialect = GenericDialect {};
    let mut p = Parser::new(&dialect).try_with_sql(sql).map_err(sql_err)?;
    let mut out = Vec::new();
    loop {
        while p.consume_token(&Token::SemiColon) {}
        if p.peek_token().token == Token::EOF {
            break;
        }
        out.push(parse_one(&mut p, sql)?);
        if !p.consume_token(&Token::SemiColon) && p.peek_token().token != Token::EOF {
            return Err(syntax(format!(
                "expected ; or end of statement, found {}",
                p.peek_token().token
            )));
        }
    }
    Ok(out)
}

fn is_word(p: &Parser, n: usize, word: &str) -> bool {
    matches!(&p.peek_nth_token(n).token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

fn parse_one(p: &mut Parser, sql: &str) -> Result<Stmt> {
    if let Some(stmt) = parse_flow_statement(p, sql)? {
        return Ok(stmt);
    }
    if is_kw(p, 0, Keyword::CREATE) && is_kw(p, 1, Keyword::TABLE) {
        p.next_token();
        p.next_token();
        return parse_create_table(p).map(Stmt::CreateTable);
    }
    if is_kw(p, 0, Keyword::SHOW) {
        if is_kw(p, 1, Keyword::TABLES)
            || (is_kw(p, 1, Keyword::FULL) && is_kw(p, 2, Keyword::TABLES))
        {
            p.next_token();
            let _ = p.parse_keyword(Keyword::FULL);
            p.next_token();
            let database = if p
                .parse_one_of_keywords(&[Keyword::FROM, Keyword::IN])
                .is_some()
            {
                Some(database_name(
                    &p.parse_object_name(false).map_err(sql_err)?,
                )?)
            } else {
                None
            };
            let like = parse_like(p)?;
            return Ok(Stmt::ShowTables { database, like });
        }
        if is_kw(p, 1, Keyword::DATABASES) || is_kw(p, 1, Keyword::SCHEMAS) {
            p.next_token();
            p.next_token();
            let like = parse_like(p)?;
            return Ok(Stmt::ShowDatabases { like });
        }
        if is_kw(p, 1, Keyword::CREATE) && is_kw(p, 2, Keyword::TABLE) {
            for _ in 0..3 {
                p.next_token();
            }
            let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
            return Ok(Stmt::ShowCreateTable(name));
        }
    }
    if is_kw(p, 0, Keyword::DESC) || is_kw(p, 0, Keyword::DESCRIBE) {
        let explains = [
            Keyword::SELECT,
            Keyword::WITH,
            Keyword::VALUES,
            Keyword::ANALYZE,
            Keyword::VERBOSE,
            Keyword::FORMAT,
            Keyword::INSERT,
            Keyword::DELETE,
            Keyword::UPDATE,
        ];
        let is_explain =
            explains.iter().any(|&k| is_kw(p, 1, k)) || p.peek_nth_token(1).token == Token::LParen;
        if !is_explain {
            p.next_token();
            let _ = p.parse_keyword(Keyword::TABLE);
            let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
            return Ok(Stmt::Describe(name));
        }
    }
    let stmt = p.parse_statement().map_err(sql_err)?;
    Ok(match stmt {
        Statement::CreateDatabase {
            db_name,
            if_not_exists,
            ..
        } => Stmt::CreateDatabase {
            name: database_name(&db_name)?,
            if_not_exists,
        },
        Statement::CreateSchema {
            schema_name: SchemaName::Simple(name),
            if_not_exists,
            ..
        } => Stmt::CreateDatabase {
            name: database_name(&name)?,
            if_not_exists,
        },
        Statement::Drop {
            object_type: ObjectType::Table,
            if_exists,
            names,
            ..
        } => Stmt::DropTable {
            names: names.iter().map(table_name).collect::<Result<_>>()?,
            if_exists,
        },
        Statement::Drop {
            object_type: ObjectType::Database | ObjectType::Schema,
            if_exists,
            names,
            ..
        } => {
            let [name] = names.as_slice() else {
                return Err(syntax("DROP DATABASE takes one name"));
            };
            Stmt::DropDatabase {
                name: database_name(name)?,
                if_exists,
            }
        }
        Statement::Use(_) => {
            return UnsupportedSnafu {
                message: "USE is not supported; qualify table names instead, e.g. mydb.mytable",
            }
            .fail()
        }
        Statement::CreateTable(_) => {
            return UnsupportedSnafu {
                message: "this form of CREATE TABLE is not supported; use CREATE TABLE t (..., ts TIMESTAMP TIME INDEX, PRIMARY KEY (...))",
            }
            .fail()
        }
        other => Stmt::Query(Box::new(other)),
    })
}

/// The flow statements and ADMIN, or `None` if the statement is none of them.
fn parse_flow_statement(p: &mut Parser, sql: &str) -> Result<Option<Stmt>> {
    if is_kw(p, 0, Keyword::CREATE)
        && (is_word(p, 1, "FLOW")
            || (is_kw(p, 1, Keyword::OR) && is_kw(p, 2, Keyword::REPLACE) && is_word(p, 3, "FLOW")))
    {
        p.next_token();
        let or_replace = p.parse_keywords(&[Keyword::OR, Keyword::REPLACE]);
        p.next_token();
        return parse_create_flow(p, sql, or_replace).map(|f| Some(Stmt::CreateFlow(f)));
    }
    if is_kw(p, 0, Keyword::DROP) && is_word(p, 1, "FLOW") {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let name = flow_name(p)?;
        return Ok(Some(Stmt::DropFlow { name, if_exists }));
    }
    if is_kw(p, 0, Keyword::SHOW) && is_word(p, 1, "FLOWS") {
        p.next_token();
        p.next_token();
        // Flow names are server-wide: `SHOW FLOWS FROM db` lists them all.
        if p.parse_one_of_keywords(&[Keyword::FROM, Keyword::IN])
            .is_some()
        {
            database_name(&p.parse_object_name(false).map_err(sql_err)?)?;
        }
        let like = parse_like(p)?;
        return Ok(Some(Stmt::ShowFlows { like }));
    }
    if is_kw(p, 0, Keyword::SHOW) && is_kw(p, 1, Keyword::CREATE) && is_word(p, 2, "FLOW") {
        for _ in 0..3 {
            p.next_token();
        }
        return Ok(Some(Stmt::ShowCreateFlow(flow_name(p)?)));
    }
    if is_word(p, 0, "ADMIN") {
        p.next_token();
        let function = match p.next_token().token {
            Token::Word(w) => w.value.to_lowercase(),
            other => {
                return Err(syntax(format!(
                    "expected a function after ADMIN (e.g. ADMIN FLUSH_FLOW('name')), found {other}"
                )))
            }
        };
        p.expect_token(&Token::LParen).map_err(sql_err)?;
        let mut args = Vec::new();
        loop {
            if p.consume_token(&Token::RParen) {
                break;
            }
            args.push(match p.next_token().token {
                Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
                Token::Number(n, _) => n,
                Token::Word(w) => match w.quote_style {
                    Some(_) => w.value,
                    None => w.value.to_lowercase(),
                },
                other => {
                    return Err(syntax(format!(
                        "unexpected {other} in ADMIN {function}(...)"
                    )))
                }
            });
            if !p.consume_token(&Token::Comma) {
                p.expect_token(&Token::RParen).map_err(sql_err)?;
                break;
            }
        }
        return Ok(Some(Stmt::Admin { function, args }));
    }
    Ok(None)
}

/// A flow name: an identifier, optionally qualified by a database (ignored:
/// flow names are unique in the whole server).
fn flow_name(p: &mut Parser) -> Result<String> {
    let name = p.parse_object_name(false).map_err(sql_err)?;
    match name.0.last() {
        Some(ObjectNamePart::Identifier(i)) => Ok(normalize_ident(i)),
        _ => Err(syntax(format!("invalid flow name {name}"))),
    }
}

/// Byte offset in `sql` of a tokenizer location (1-based line and column, in chars).
fn byte_offset(sql: &str, line: u64, column: u64) -> usize {
    let mut offset = 0;
    for (i, l) in sql.split_inclusive('\n').enumerate() {
        if i as u64 + 1 == line {
            let col = column.saturating_sub(1) as usize;
            return offset + l.char_indices().nth(col).map_or(l.len(), |(b, _)| b);
        }
        offset += l.len();
    }
    sql.len()
}

fn parse_create_flow(p: &mut Parser, sql: &str, or_replace: bool) -> Result<CreateFlow> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = flow_name(p)?;
    if !(is_word(p, 0, "SINK") && is_kw(p, 1, Keyword::TO)) {
        return Err(syntax(format!(
            "expected SINK TO <table> after CREATE FLOW {name}, found {}",
            p.peek_token().token
        )));
    }
    p.next_token();
    p.next_token();
    let sink = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
    let mut flow = CreateFlow {
        name,
        or_replace,
        if_not_exists,
        sink,
        expire_after: None,
        comment: None,
        options: Vec::new(),
        query: String::new(),
    };
    loop {
        if is_word(p, 0, "EXPIRE") && is_word(p, 1, "AFTER") {
            p.next_token();
            p.next_token();
            let interval = p.parse_keyword(Keyword::INTERVAL);
            let mut text = match p.next_token().token {
                Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
                Token::Number(n, _) if interval => n,
                other => {
                    return Err(syntax(format!(
                        "expected an interval after EXPIRE AFTER (e.g. '1 hour' or INTERVAL '5 minutes'), found {other}"
                    )))
                }
            };
            // INTERVAL '1' HOUR
            if interval {
                if let Token::Word(w) = &p.peek_token().token {
                    if w.keyword != Keyword::COMMENT
                        && w.keyword != Keyword::WITH
                        && w.keyword != Keyword::AS
                    {
                        text = format!("{text} {}", w.value);
                        p.next_token();
                    }
                }
            }
            flow.expire_after = Some(text);
        } else if p.parse_keyword(Keyword::COMMENT) {
            flow.comment = Some(p.parse_literal_string().map_err(sql_err)?);
        } else if p.parse_keyword(Keyword::WITH) {
            flow.options = parse_options(p)?;
        } else {
            break;
        }
    }
    if !p.parse_keyword(Keyword::AS) {
        return Err(syntax(format!(
            "expected AS SELECT ... in CREATE FLOW {}, found {}",
            flow.name,
            p.peek_token().token
        )));
    }
    let start = p.peek_token().span.start;
    p.parse_query().map_err(sql_err)?;
    let end_tok = p.peek_token();
    let from = byte_offset(sql, start.line, start.column);
    let to = match end_tok.token {
        Token::EOF => sql.len(),
        _ => byte_offset(sql, end_tok.span.start.line, end_tok.span.start.column),
    };
    flow.query = sql
        .get(from..to.max(from))
        .unwrap_or_default()
        .trim()
        .to_string();
    Ok(flow)
}

/// `(k = 'v', ...)` after WITH: keys lower-cased, values as written.
fn parse_options(p: &mut Parser) -> Result<Vec<(String, String)>> {
    p.expect_token(&Token::LParen).map_err(sql_err)?;
    let mut options = Vec::new();
    loop {
        if p.consume_token(&Token::RParen) {
            break;
        }
        let key = match p.next_token().token {
            Token::Word(w) => w.value.to_lowercase(),
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s.to_lowercase(),
            other => return Err(syntax(format!("expected an option name, found {other}"))),
        };
        p.expect_token(&Token::Eq).map_err(sql_err)?;
        let value = match p.next_token().token {
            Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
            Token::Number(n, _) => n,
            Token::Word(w) => w.value.to_lowercase(),
            other => return Err(syntax(format!("expected an option value, found {other}"))),
        };
        options.push((key, value));
        if !p.consume_token(&Token::Comma) {
            p.expect_token(&Token::RParen).map_err(sql_err)?;
            break;
        }
    }
    Ok(options)
}

fn parse_like(p: &mut Parser) -> Result<Option<String>> {
    if p.parse_keyword(Keyword::LIKE) {
        Ok(Some(p.parse_literal_string().map_err(sql_err)?))
    } else if p.parse_keyword(Keyword::WHERE) {
        UnsupportedSnafu {
            message:
                "SHOW ... WHERE is not supported; use LIKE 'pattern' or query information_schema",
        }
        .fail()
    } else {
        Ok(None)
    }
}

fn parse_column_type(p: &mut Parser) -> Result<ColumnType> {
    let tok = p.next_token();
    let Token::Word(w) = &tok.token else {
        return Err(syntax(format!(
            "expected a column type, found {}",
            tok.token
        )));
    };
    let mut name = w.value.to_ascii_uppercase();
    if name == "DOUBLE" && p.parse_keyword(Keyword::PRECISION) {
        name = "DOUBLE PRECISION".into();
    }
    if name == "CHARACTER" && p.parse_keyword(Keyword::VARYING) {
        name = "CHARACTER VARYING".into();
    }
    let mut args = Vec::new();
    if p.consume_token(&Token::LParen) {
        args = p
            .parse_comma_separated(|p| p.parse_literal_uint())
            .map_err(sql_err)?;
        p.expect_token(&Token::RParen).map_err(sql_err)?;
    }
    if name == "TIMESTAMP" {
        if p.parse_keywords(&[Keyword::WITH, Keyword::TIME, Keyword::ZONE]) {
            return UnsupportedSnafu {
                message:
                    "TIMESTAMP WITH TIME ZONE is not supported; use TIMESTAMP (values are UTC)",
            }
            .fail();
        }
        let _ = p.parse_keywords(&[Keyword::WITHOUT, Keyword::TIME, Keyword::ZONE]);
    }
    let unsigned = p.parse_keyword(Keyword::UNSIGNED);
    // Text lengths (VARCHAR(255)) do not matter.
    if matches!(
        ColumnType::from_sql(&name, &[], unsigned),
        Ok(ColumnType::String | ColumnType::Binary)
    ) {
        args.clear();
    }
    ColumnType::from_sql(&name, &args, unsigned)
}

fn parse_column(p: &mut Parser) -> Result<ColumnDef> {
    let name = normalize_ident(&p.parse_identifier().map_err(sql_err)?);
    let data_type = parse_column_type(p)?;
    let mut col = ColumnDef {
        name,
        data_type,
        nullable: None,
        default: None,
        comment: None,
        time_index: false,
        primary_key: false,
    };
    loop {
        if p.parse_keywords(&[Keyword::TIME, Keyword::INDEX]) {
            col.time_index = true;
        } else if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
            col.primary_key = true;
        } else {
            match p.parse_optional_column_option().map_err(sql_err)? {
                None => break,
                Some(ColumnOption::NotNull) => col.nullable = Some(false),
                Some(ColumnOption::Null) => col.nullable = Some(true),
                Some(ColumnOption::Default(e)) => col.default = Some(e),
                Some(ColumnOption::Comment(c)) => col.comment = Some(c),
                Some(other) => {
                    return UnsupportedSnafu {
                        message: format!(
                            "column option {other} (column '{}') is not supported; use NULL, NOT NULL, DEFAULT, COMMENT, TIME INDEX or PRIMARY KEY",
                            col.name
                        ),
                    }
                    .fail()
                }
            }
        }
    }
    Ok(col)
}

fn column_list(p: &mut Parser) -> Result<Vec<String>> {
    let idents = p
        .parse_parenthesized_column_list(IsOptional::Mandatory, false)
        .map_err(sql_err)?;
    Ok(idents.iter().map(normalize_ident).collect())
}

fn parse_create_table(p: &mut Parser) -> Result<CreateTable> {
    let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
    if is_kw(p, 0, Keyword::AS) || is_kw(p, 0, Keyword::LIKE) {
        return UnsupportedSnafu {
            message: "CREATE TABLE ... AS/LIKE is not supported; create the table with its columns, then INSERT INTO t SELECT ...",
        }
        .fail();
    }
    p.expect_token(&Token::LParen).map_err(sql_err)?;
    let mut ct = CreateTable {
        name,
        if_not_exists,
        columns: Vec::new(),
        time_index: None,
        primary_key: None,
        options: Vec::new(),
    };
    loop {
        if p.consume_token(&Token::RParen) {
            break;
        }
        if p.parse_keywords(&[Keyword::TIME, Keyword::INDEX]) {
            let cols = column_list(p)?;
            let [col] = cols.as_slice() else {
                return Err(syntax("TIME INDEX takes exactly one column"));
            };
            if ct.time_index.is_some() {
                return Err(syntax("TIME INDEX is given twice"));
            }
            ct.time_index = Some(col.clone());
        } else if p.parse_keywords(&[Keyword::PRIMARY, Keyword::KEY]) {
            if ct.primary_key.is_some() {
                return Err(syntax("PRIMARY KEY is given twice"));
            }
            ct.primary_key = Some(column_list(p)?);
        } else {
            ct.columns.push(parse_column(p)?);
        }
        if !p.consume_token(&Token::Comma) {
            p.expect_token(&Token::RParen).map_err(sql_err)?;
            break;
        }
    }
    loop {
        if p.parse_keyword(Keyword::ENGINE) {
            let _ = p.consume_token(&Token::Eq);
            p.parse_identifier().map_err(sql_err)?;
        } else if p.parse_keyword(Keyword::WITH) {
            ct.options.extend(parse_options(p)?);
        } else {
            break;
        }
    }
    Ok(ct)
}

/// SQL `LIKE` matching (`%` any run, `_` one character), case-sensitive.
pub fn like_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '_' || p[pi] == t[ti]) && p[pi] != '%' {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '%' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '%' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_table_forms() {
        let stmts = parse(
            "CREATE TABLE IF NOT EXISTS m.t (host STRING NULL, v DOUBLE DEFAULT 0 NOT NULL, \
             n INT UNSIGNED, ts TIMESTAMP(3) DEFAULT now() TIME INDEX, PRIMARY KEY (host)) \
             WITH (append_mode = 'true'); \
             CREATE TABLE u (\"Ts\" TIMESTAMP_NS NOT NULL, x VARCHAR(20), TIME INDEX (\"Ts\"));",
        )
        .unwrap();
        assert_eq!(stmts.len(), 2);
        let Stmt::CreateTable(ct) = &stmts[0] else {
            panic!()
        };
        assert_eq!(ct.name.database, "m");
        assert!(ct.if_not_exists);
        assert_eq!(ct.columns.len(), 4);
        assert_eq!(ct.columns[1].nullable, Some(false));
        assert_eq!(ct.columns[1].default.as_ref().unwrap().to_string(), "0");
        assert_eq!(ct.columns[2].data_type, ColumnType::UInt32);
        assert!(ct.columns[3].time_index);
        assert_eq!(ct.columns[3].default.as_ref().unwrap().to_string(), "now()");
        assert_eq!(ct.primary_key, Some(vec!["host".to_string()]));
        assert_eq!(ct.options, vec![("append_mode".into(), "true".into())]);
        let Stmt::CreateTable(ct) = &stmts[1] else {
            panic!()
        };
        assert_eq!(ct.time_index.as_deref(), Some("Ts"));
        assert_eq!(ct.columns[0].data_type, ColumnType::TimestampNanosecond);
    }

    #[test]
    fn other_statements() {
        let s = parse("show tables; SHOW CREATE TABLE x.y; desc table t; describe t; select 1; drop table if exists a, b").unwrap();
        assert!(matches!(
            &s[0],
            Stmt::ShowTables {
                database: None,
                like: None
            }
        ));
        assert!(matches!(&s[1], Stmt::ShowCreateTable(n) if n.database == "x"));
        assert!(matches!(&s[2], Stmt::Describe(_)));
        assert!(matches!(&s[3], Stmt::Describe(_)));
        assert!(matches!(&s[4], Stmt::Query(_)));
        assert!(matches!(&s[5], Stmt::DropTable { names, if_exists: true } if names.len() == 2));
        assert!(parse("selec 1").is_err());
        assert!(parse("CREATE TABLE t (a DECIMAL(10,2), ts TIMESTAMP TIME INDEX)").is_err());
    }

    #[test]
    fn flow_statements() {
        let sql = "CREATE OR REPLACE FLOW IF NOT EXISTS f SINK TO db.out EXPIRE AFTER INTERVAL '1 hour' \
                   COMMENT 'hi' WITH (backfill = 'false') AS\n  SELECT host, count(*) FROM t GROUP BY host;\
                   drop flow if exists f; SHOW FLOWS LIKE 'f%'; show create flow \"F\"; ADMIN flush_flow('f')";
        let s = parse(sql).unwrap();
        let Stmt::CreateFlow(f) = &s[0] else {
            panic!("{:?}", s[0])
        };
        assert!(f.or_replace && f.if_not_exists);
        assert_eq!(f.name, "f");
        assert_eq!(f.sink.database, "db");
        assert_eq!(f.sink.table, "out");
        assert_eq!(f.expire_after.as_deref(), Some("1 hour"));
        assert_eq!(f.comment.as_deref(), Some("hi"));
        assert_eq!(f.options, vec![("backfill".into(), "false".into())]);
        assert_eq!(f.query, "SELECT host, count(*) FROM t GROUP BY host");
        assert!(matches!(&s[1], Stmt::DropFlow { name, if_exists: true } if name == "f"));
        assert!(matches!(&s[2], Stmt::ShowFlows { like: Some(l) } if l == "f%"));
        assert!(matches!(
            parse("SHOW FLOWS FROM public LIKE 'x'").unwrap().as_slice(),
            [Stmt::ShowFlows { like: Some(_) }]
        ));
        assert!(matches!(&s[3], Stmt::ShowCreateFlow(n) if n == "F"));
        assert!(
            matches!(&s[4], Stmt::Admin { function, args } if function == "flush_flow" && args == &["f".to_string()])
        );
        let s = parse("CREATE FLOW g SINK TO o EXPIRE AFTER '2 days 1h' AS SELECT 'é', x FROM t")
            .unwrap();
        let Stmt::CreateFlow(f) = &s[0] else { panic!() };
        assert_eq!(f.query, "SELECT 'é', x FROM t");
        assert_eq!(f.expire_after.as_deref(), Some("2 days 1h"));
        assert!(parse("CREATE FLOW g SINK o AS SELECT 1").is_err());
        assert!(parse("CREATE FLOW g SINK TO o SELECT 1").is_err());
    }

    #[test]
    fn like() {
        assert!(like_match("a%", "abc"));
        assert!(like_match("%b%", "abc"));
        assert!(like_match("a_c", "abc"));
        assert!(!like_match("a_c", "abbc"));
        assert!(like_match("%", ""));
    }
}
