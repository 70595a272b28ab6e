//! sandflow's SQL parser: DataFusion's sqlparser plus GreptimeDB's extensions
//! (`TIME INDEX`, `WITH (append_mode = ...)`, `SHOW CREATE TABLE`, `DESC`).
//!
//! Statements sandflow handles itself become [`Stmt`] variants; everything
//! else stays a sqlparser [`Statement`] for DataFusion to plan.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    visit_expressions_mut, ColumnOption, Expr, Ident, ObjectName, ObjectNamePart, ObjectType,
    SchemaName, Select, Statement, Visit, Visitor,
};
use datafusion::sql::sqlparser::dialect::{
    Dialect as SqlParserDialect, GenericDialect, PostgreSqlDialect,
};
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::{IsOptional, Parser, ParserError};
use datafusion::sql::sqlparser::tokenizer::{Token, TokenWithSpan, Tokenizer};

use crate::catalog::{ColumnType, DEFAULT_CATALOG, DEFAULT_DATABASE};
use crate::error::{Result, SqlSnafu, TooComplexSnafu, UnsupportedSnafu};

/// A table name. An unqualified name is in `public` until
/// [`Stmt::bind_database`] puts it in the session's database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub database: String,
    pub table: String,
    /// Whether the database was written (`db.t`), not taken from the session.
    pub qualified: bool,
}

impl TableName {
    /// Puts an unqualified name in `database`.
    pub fn bind(&mut self, database: &str) {
        if !self.qualified {
            self.database = database.to_string();
        }
    }
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
    /// `FULLTEXT INDEX [WITH (...)]`, `SKIPPING INDEX ...`, `INVERTED INDEX`
    /// as GreptimeDB writes them (normalised text).
    pub index: Option<String>,
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
    /// GreptimeDB's `PARTITION ON COLUMNS (..) (..)` (normalised text).
    pub partition: Option<String>,
    /// `CREATE TABLE name LIKE other`: the table whose columns, keys and
    /// options the new one takes (it has no columns of its own then).
    pub like: Option<TableName>,
}

/// `CREATE [OR REPLACE] FLOW [IF NOT EXISTS] name SINK TO table
/// [EXPIRE AFTER interval] [EVAL INTERVAL interval] [COMMENT '...']
/// [WITH (k = 'v', ...)] AS SELECT ...` (the clauses in any order).
#[derive(Debug, Clone, PartialEq)]
pub struct CreateFlow {
    pub name: String,
    pub or_replace: bool,
    pub if_not_exists: bool,
    pub sink: TableName,
    /// The interval text as written (`'5 minutes'`, `INTERVAL '1 hour'` gives `1 hour`).
    pub expire_after: Option<String>,
    /// `EVAL INTERVAL '1m'`: the interval text as written, like `expire_after`.
    pub eval_interval: Option<String>,
    pub comment: Option<String>,
    /// `WITH (k = 'v')` options, keys lower-cased, in the order written.
    pub options: Vec<(String, String)>,
    /// The query text exactly as written after `AS`.
    pub query: String,
    /// The database its query's unqualified names are in (the session's).
    pub database: String,
    /// `USING COMPONENT c`: the user component the flow runs instead of
    /// sandflow's engine.
    pub component: Option<ComponentRef>,
}

/// A flow's user component: its name and, when the flow already runs one
/// (a rebuild, `ALTER FLOW ... SET COMPONENT VERSION n`), the version; `None`
/// takes the newest.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentRef {
    pub name: TableName,
    pub version: Option<u32>,
}

/// The bytes of `CREATE COMPONENT ... FROM ...`.
#[derive(Clone, PartialEq)]
pub enum ComponentSource {
    Bytes(std::sync::Arc<Vec<u8>>),
    /// `$n`, before the session binds it.
    Param(usize),
}

impl std::fmt::Debug for ComponentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ComponentSource::Bytes(b) => write!(f, "Bytes({} bytes)", b.len()),
            ComponentSource::Param(n) => write!(f, "Param(${n})"),
        }
    }
}

/// `ALTER TABLE name op [, op ...]`.
#[derive(Debug, Clone, PartialEq)]
pub struct AlterTable {
    pub name: TableName,
    pub ops: Vec<AlterOp>,
}

/// Where `ADD COLUMN` puts the new column.
#[derive(Debug, Clone, PartialEq)]
pub enum ColumnPosition {
    First,
    After(String),
}

/// One change of an `ALTER TABLE`.
#[derive(Debug, Clone, PartialEq)]
pub enum AlterOp {
    /// `ADD [COLUMN] [IF NOT EXISTS] def [FIRST | AFTER c]`.
    AddColumn {
        column: Box<ColumnDef>,
        if_not_exists: bool,
        position: Option<ColumnPosition>,
    },
    /// `DROP [COLUMN] [IF EXISTS] c`.
    DropColumn { name: String, if_exists: bool },
    /// `RENAME [COLUMN] a TO b`.
    RenameColumn { from: String, to: String },
    /// `RENAME [TO] t`: the table's new name, in its database.
    RenameTable(String),
    /// `MODIFY [COLUMN] c type` or `ALTER [COLUMN] c [SET DATA] TYPE type`.
    ModifyColumn { name: String, data_type: ColumnType },
    /// `MODIFY [COLUMN] c SET FULLTEXT|SKIPPING|INVERTED INDEX [WITH (...)]`
    /// (`clause` the index as [`ColumnDef::index`] writes it) or `UNSET
    /// ... INDEX` (`clause` `None`).
    ColumnIndex {
        name: String,
        kind: &'static str,
        clause: Option<String>,
    },
    /// `SET 'k' = 'v' [, ...]`: table options.
    SetOptions(Vec<(String, String)>),
    /// `UNSET 'k' [, ...]`.
    UnsetOptions(Vec<String>),
}

/// One parsed statement.
#[derive(Debug, Clone, PartialEq)]
pub enum Stmt {
    CreateTable(CreateTable),
    AlterTable(AlterTable),
    CreateDatabase {
        name: String,
        if_not_exists: bool,
        /// `WITH (...)`: the database's quotas.
        options: Vec<(String, String)>,
    },
    /// Users, privileges and database options (see [`super::access`]).
    Access(super::access::AccessStmt),
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
    /// `ALTER FLOW name SET COMPONENT VERSION n`.
    AlterFlowComponent {
        name: String,
        version: u32,
    },
    /// `CREATE [OR REPLACE] COMPONENT name FROM bytes`.
    CreateComponent {
        name: TableName,
        or_replace: bool,
        source: ComponentSource,
    },
    /// `DROP COMPONENT [IF EXISTS] name`.
    DropComponent {
        name: TableName,
        if_exists: bool,
    },
    /// `SHOW COMPONENTS [FROM db] [LIKE 'p']`.
    ShowComponents {
        database: Option<String>,
        like: Option<String>,
    },
    /// `USE database`: the session's database for unqualified names.
    Use(String),
    /// `ADMIN func(arg, ...)`: function name lower-cased, arguments as text.
    Admin {
        function: String,
        args: Vec<String>,
    },
    /// Anything else: planned and run by DataFusion.
    Query(Box<Statement>),
}

impl Stmt {
    /// Whether running the statement only reads: queries (`SELECT`, `WITH`,
    /// `VALUES`, `TABLE`) without `SELECT ... INTO` and without data-modifying
    /// parts, `EXPLAIN` of such a query (with or without `ANALYZE`), `SHOW ...`
    /// and `DESC ...`. Everything else may change state: DDL, DML, flows,
    /// `ADMIN`, `SET`, transactions, `COPY`, and `EXPLAIN` of a write (planning
    /// a `DELETE` already deletes).
    pub fn is_read_only(&self) -> bool {
        match self {
            Stmt::ShowTables { .. }
            | Stmt::ShowDatabases { .. }
            | Stmt::ShowCreateTable(_)
            | Stmt::Describe(_)
            | Stmt::ShowFlows { .. }
            | Stmt::ShowCreateFlow(_)
            | Stmt::ShowComponents { .. }
            | Stmt::Use(_)
            | Stmt::Access(
                super::access::AccessStmt::ShowUsers | super::access::AccessStmt::ShowGrants { .. },
            ) => true,
            Stmt::Access(_) => false,
            Stmt::CreateTable(_)
            | Stmt::AlterTable(_)
            | Stmt::CreateDatabase { .. }
            | Stmt::DropTable { .. }
            | Stmt::DropDatabase { .. }
            | Stmt::CreateFlow(_)
            | Stmt::DropFlow { .. }
            | Stmt::AlterFlowComponent { .. }
            | Stmt::CreateComponent { .. }
            | Stmt::DropComponent { .. }
            | Stmt::Admin { .. } => false,
            Stmt::Query(stmt) => stmt.visit(&mut ReadOnly).is_continue(),
        }
    }
}

impl Stmt {
    /// Puts the statement's unqualified table names in `database` (the
    /// session's): sandflow's own statements here; DataFusion's through the
    /// session's default schema.
    pub fn bind_database(&mut self, database: &str) {
        match self {
            Stmt::CreateTable(ct) => {
                ct.name.bind(database);
                if let Some(like) = &mut ct.like {
                    like.bind(database);
                }
            }
            Stmt::AlterTable(at) => at.name.bind(database),
            Stmt::DropTable { names, .. } => names.iter_mut().for_each(|n| n.bind(database)),
            Stmt::ShowTables { database: d, .. } => {
                d.get_or_insert_with(|| database.to_string());
            }
            Stmt::ShowCreateTable(n) | Stmt::Describe(n) => n.bind(database),
            Stmt::CreateFlow(cf) => {
                cf.sink.bind(database);
                cf.database = database.to_string();
                if let Some(c) = &mut cf.component {
                    c.name.bind(database);
                }
            }
            Stmt::CreateComponent { name, .. } | Stmt::DropComponent { name, .. } => {
                name.bind(database)
            }
            Stmt::ShowComponents { database: d, .. } => {
                d.get_or_insert_with(|| database.to_string());
            }
            _ => {}
        }
    }
}

/// Walks a sqlparser statement and breaks at the first part that may write.
struct ReadOnly;

impl Visitor for ReadOnly {
    type Break = ();

    fn pre_visit_statement(&mut self, statement: &Statement) -> ControlFlow<()> {
        // Every statement nested in another one is visited too (the statement
        // of an EXPLAIN, an INSERT in a WITH).
        match statement {
            Statement::Query(_)
            | Statement::Explain { .. }
            | Statement::ExplainTable { .. }
            | Statement::ShowFunctions { .. }
            | Statement::ShowVariable { .. }
            | Statement::ShowStatus { .. }
            | Statement::ShowVariables { .. }
            | Statement::ShowCreate { .. }
            | Statement::ShowColumns { .. }
            | Statement::ShowCatalogs { .. }
            | Statement::ShowDatabases { .. }
            | Statement::ShowSchemas { .. }
            | Statement::ShowTables { .. }
            | Statement::ShowViews { .. }
            | Statement::ShowObjects(_)
            | Statement::ShowCollation { .. }
            | Statement::ShowCharset(_) => ControlFlow::Continue(()),
            _ => ControlFlow::Break(()),
        }
    }

    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
        // `SELECT ... INTO t` creates a table.
        match select.into {
            Some(_) => ControlFlow::Break(()),
            None => ControlFlow::Continue(()),
        }
    }
}

fn sql_err(e: ParserError) -> crate::error::Error {
    let msg = match e {
        ParserError::ParserError(m) | ParserError::TokenizerError(m) => m,
        ParserError::RecursionLimitExceeded => {
            return TooComplexSnafu {
                message: "statement is too complex: it nests expressions more deeply than the \
                          parser allows; split it into smaller statements",
            }
            .build()
        }
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
            qualified: false,
        }),
        [d, t] => Ok(TableName {
            database: d.clone(),
            table: t.clone(),
            qualified: true,
        }),
        [c, d, t] if c == DEFAULT_CATALOG => Ok(TableName {
            database: d.clone(),
            table: t.clone(),
            qualified: true,
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

/// How deep expressions may nest: parentheses, brackets, braces and `CASE ... END` together.
pub const MAX_NESTING: usize = 64;

/// How deep a statement's syntax tree may be, counting what the parser builds without
/// nesting in the text: every operator of a chain (`a + b + c`, `x AND y AND z`, `s || t`)
/// wraps the expression before it, every `UNION`/`EXCEPT`/`INTERSECT` the set expression
/// before it, and every `JOIN` (or comma in a FROM clause) the join before it, so that a
/// chain of n of them is a tree n deep. Planning, optimising and running such trees recurse
/// through them, so a bound here keeps a 4 KB statement from exhausting a thread's stack;
/// statements run on threads whose stack holds trees this deep (see `sql::executor`).
pub const MAX_EXPRESSION_DEPTH: usize = 1000;

/// How deep the expressions may nest that sqlparser reads more than once when the text inside
/// them has an error, in "levels" of doubled parse time. sqlparser backtracks: it tries a
/// keyword's own syntax (`CAST(`, `ARRAY[`, `SUBSTRING(`, `CASE` in a `THEN` ...) and then
/// the word as a name, a derived table and then a nested join, a subquery after IN and then
/// a list, and its PostgreSQL dialect reads every function argument twice (as a possible
/// `name => value`). Each nested level multiplies the time to reach the error (24 unclosed
/// `CASE WHEN 1 THEN` took minutes); one that triples it or more counts two or three levels.
/// 12 levels take milliseconds. The costs were measured per construct on sqlparser 0.62
/// (unclosed nesting, both dialects, every keyword before `(` and `[`); re-measure them when
/// upgrading it.
pub const MAX_BACKTRACKING_NESTING: usize = 12;

/// Which sqlparser dialect reads the statement after the guard.
#[derive(Clone, Copy, PartialEq)]
enum Reader {
    /// [`parse`]: `GenericDialect`.
    Generic,
    /// datafusion-postgres: `PostgreSqlDialect`.
    Postgres,
}

/// Words whose own syntax sqlparser tries before reading them as a name, with the levels
/// (about log2 of the time factor) that one nesting of them costs.
fn keyword_levels(kw: Keyword) -> usize {
    match kw {
        Keyword::POSITION => 2,
        Keyword::CAST
        | Keyword::TRY_CAST
        | Keyword::SAFE_CAST
        | Keyword::CONVERT
        | Keyword::TRY_CONVERT
        | Keyword::CEIL
        | Keyword::FLOOR
        | Keyword::SUBSTR
        | Keyword::SUBSTRING
        | Keyword::OVERLAY
        | Keyword::ARRAY
        | Keyword::CURRENT_TIMESTAMP
        | Keyword::CURRENT_TIME
        | Keyword::CURRENT_DATE
        | Keyword::LOCALTIME
        | Keyword::LOCALTIMESTAMP
        | Keyword::MATCH
        | Keyword::LAMBDA
        | Keyword::NOT => 1,
        _ => 0,
    }
}

/// Words before `(` that never start a function call.
fn never_a_call(kw: Keyword) -> bool {
    matches!(kw, Keyword::EXISTS | Keyword::DISTINCT)
}

/// Words before `(` that do not start a function call when they follow an operand
/// (`x AND (`, `t WHERE (`); elsewhere (`SELECT and(`) they are function names.
fn is_structural(kw: Keyword) -> bool {
    matches!(
        kw,
        Keyword::AS
            | Keyword::ON
            | Keyword::USING
            | Keyword::OVER
            | Keyword::FILTER
            | Keyword::WITHIN
            | Keyword::AND
            | Keyword::OR
            | Keyword::SELECT
            | Keyword::WHERE
            | Keyword::INTO
            | Keyword::TABLE
            | Keyword::WITH
            | Keyword::UNION
            | Keyword::INTERSECT
            | Keyword::EXCEPT
            | Keyword::ALL
            | Keyword::LATERAL
            | Keyword::BY
    )
}

/// Words that end a FROM clause (at their own nesting level).
fn ends_from(kw: Keyword) -> bool {
    matches!(
        kw,
        Keyword::WHERE
            | Keyword::GROUP
            | Keyword::HAVING
            | Keyword::ORDER
            | Keyword::LIMIT
            | Keyword::OFFSET
            | Keyword::FETCH
            | Keyword::UNION
            | Keyword::INTERSECT
            | Keyword::EXCEPT
            | Keyword::SELECT
            | Keyword::WINDOW
            | Keyword::QUALIFY
            | Keyword::RETURNING
            | Keyword::SET
            | Keyword::VALUES
    )
}

/// What came just before a token.
#[derive(Clone, Copy, PartialEq)]
enum Prev {
    Other,
    /// A word, and whether it follows an operand (`x AND`, not `SELECT AND`: a keyword in
    /// the place of an operand is read as a function name by the PostgreSQL dialect).
    Word(Keyword, bool),
    Comma,
    LParen,
}

/// Whether a token can end an operand (a name, a literal, a closing bracket).
fn ends_operand(tok: &Token) -> bool {
    match tok {
        Token::Word(w) => w.quote_style.is_some() || w.keyword == Keyword::NoKeyword,
        Token::Number(..)
        | Token::RParen
        | Token::RBracket
        | Token::Placeholder(_)
        | Token::SingleQuotedString(_)
        | Token::DoubleQuotedString(_)
        | Token::DollarQuotedString(_)
        | Token::NationalStringLiteral(_)
        | Token::EscapedStringLiteral(_)
        | Token::UnicodeStringLiteral(_)
        | Token::HexStringLiteral(_) => true,
        _ => false,
    }
}

/// The levels an opening bracket costs after `prev`.
fn bracket_levels(reader: Reader, prev: Prev, bracket: &Token) -> usize {
    let pg = reader == Reader::Postgres;
    match (prev, bracket) {
        // A subquery or a list after IN (tried as one, then as the other); table factors
        // are counted by the caller.
        (Prev::Word(Keyword::IN, _), Token::LParen) => 1 + pg as usize,
        // The PostgreSQL dialect tries every argument as `name => value` first.
        (Prev::Word(kw, after_operand), Token::LParen)
            if pg && !never_a_call(kw) && !(after_operand && is_structural(kw)) =>
        {
            1 + keyword_levels(kw)
        }
        (Prev::Word(kw, _), Token::LParen) => keyword_levels(kw),
        // A subscript of a name (`a.b[`) is also tried as something else first.
        (Prev::Word(kw, _), Token::LBracket) => keyword_levels(kw).max(1),
        _ => 0,
    }
}

/// Where a `CASE` is: after `CASE` (operand), `WHEN`, `THEN` or `ELSE`.
#[derive(Clone, Copy, PartialEq)]
enum CasePart {
    Operand,
    When,
    Then,
    Else,
}

#[derive(Clone, Copy, PartialEq)]
enum Open {
    Paren,
    Bracket,
    Brace,
    Case(CasePart),
}

/// One open construct: what it is, the levels it costs, whether its own level is in a FROM
/// clause, whether it is a table factor (a derived table or nested join) and whether it
/// holds a named argument (`name := value`).
struct Frame {
    open: Open,
    levels: usize,
    from: bool,
    table: bool,
    named: bool,
    /// Operators in the current item (since the last comma or clause keyword).
    ops: usize,
    /// Set operations and joins at this level.
    chain: usize,
}

/// How deep a statement nests, as [`nesting`] measures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Nesting {
    /// Open brackets and CASEs.
    depth: usize,
    /// Levels of backtracking (see [`MAX_BACKTRACKING_NESTING`]).
    levels: usize,
    /// Depth of the syntax tree, operator chains included (see [`MAX_EXPRESSION_DEPTH`]).
    tree: usize,
}

/// Tokens that make the parser wrap the expression before them in a new node.
fn is_operator(tok: &Token) -> bool {
    match tok {
        Token::Word(w) if w.quote_style.is_none() => matches!(
            w.keyword,
            Keyword::AND
                | Keyword::OR
                | Keyword::XOR
                | Keyword::NOT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::ILIKE
                | Keyword::SIMILAR
                | Keyword::REGEXP
                | Keyword::RLIKE
                | Keyword::IN
                | Keyword::BETWEEN
                | Keyword::COLLATE
                | Keyword::DIV
                | Keyword::AT
                | Keyword::OPERATOR
                | Keyword::OVERLAPS
        ),
        Token::Word(_) => false,
        Token::Eq
        | Token::DoubleEq
        | Token::Neq
        | Token::Lt
        | Token::Gt
        | Token::LtEq
        | Token::GtEq
        | Token::Spaceship
        | Token::Plus
        | Token::Minus
        | Token::Mul
        | Token::Div
        | Token::DuckIntDiv
        | Token::Mod
        | Token::StringConcat
        | Token::Caret
        | Token::Ampersand
        | Token::Pipe
        | Token::ShiftLeft
        | Token::ShiftRight
        | Token::Sharp
        | Token::Tilde
        | Token::TildeAsterisk
        | Token::ExclamationMarkTilde
        | Token::ExclamationMarkTildeAsterisk
        | Token::DoubleTilde
        | Token::DoubleTildeAsterisk
        | Token::ExclamationMarkDoubleTilde
        | Token::ExclamationMarkDoubleTildeAsterisk
        | Token::DoubleColon
        | Token::Arrow
        | Token::LongArrow
        | Token::HashArrow
        | Token::HashLongArrow
        | Token::AtArrow
        | Token::ArrowAt
        | Token::HashMinus
        | Token::AtQuestion
        | Token::AtAt
        | Token::Question
        | Token::QuestionAnd
        | Token::QuestionPipe
        | Token::Overlap
        | Token::CustomBinaryOperator(_) => true,
        _ => false,
    }
}

/// Words that start a new expression at their level (a clause or a CASE branch).
fn starts_item(kw: Keyword) -> bool {
    matches!(
        kw,
        Keyword::SELECT
            | Keyword::FROM
            | Keyword::WHERE
            | Keyword::GROUP
            | Keyword::HAVING
            | Keyword::ORDER
            | Keyword::BY
            | Keyword::LIMIT
            | Keyword::OFFSET
            | Keyword::FETCH
            | Keyword::ON
            | Keyword::USING
            | Keyword::WHEN
            | Keyword::THEN
            | Keyword::ELSE
            | Keyword::SET
            | Keyword::VALUES
            | Keyword::RETURNING
            | Keyword::AS
            | Keyword::QUALIFY
            | Keyword::WINDOW
            | Keyword::INTO
    )
}

/// How deeply a statement's tokens nest: (constructs, levels of backtracking); see
/// [`MAX_NESTING`] and [`MAX_BACKTRACKING_NESTING`]. One pass; strings, quoted identifiers
/// and comments are single tokens, so what they hold does not count.
fn nesting(tokens: &[TokenWithSpan], reader: Reader) -> Nesting {
    // Closes the innermost construct if the closer matches it. A closer that does not
    // (`END` as a name inside parentheses, a stray `)` in a CASE) closes nothing: the
    // parser does not take it as closing anything either, or fails there.
    fn close(
        stack: &mut Vec<Frame>,
        levels: &mut usize,
        chained: &mut usize,
        what: fn(&Open) -> bool,
    ) {
        if stack.last().is_some_and(|f| what(&f.open)) {
            if let Some(f) = stack.pop() {
                *levels -= f.levels;
                *chained -= f.ops + f.chain;
            }
        }
    }
    let mut stack: Vec<Frame> = Vec::new();
    // Whether the top level is in a FROM clause.
    let mut top_from = false;
    let (mut levels, mut max_depth, mut max_levels) = (0usize, 0usize, 0usize);
    // Operators of the top level's current item, and its set operations and joins.
    let (mut top_ops, mut top_chain) = (0usize, 0usize);
    // The sum of `ops + chain` over the stack and the top level, and its maximum with
    // the stack's depth added.
    let (mut chained, mut max_tree) = (0usize, 0usize);
    let mut prev = Prev::Other;
    // Whether the token before this one ends an operand.
    let mut operand = false;
    // INTERVAL reads the expression after it twice when it fails, and so does NOT followed
    // by a sign: the levels that the construct starting that expression costs on top of
    // its own. `not`: the token before is NOT.
    let (mut prefix, mut not) = (0usize, false);
    let code = tokens
        .iter()
        .map(|t| &t.token)
        .filter(|t| !matches!(t, Token::Whitespace(_)));
    for tok in code {
        let from = stack.last().map_or(top_from, |f| f.from);
        let mut open = None;
        match tok {
            Token::Word(w) if w.quote_style.is_none() => {
                match w.keyword {
                    Keyword::CASE => {
                        // A CASE in a THEN branch (or outside any CASE) is read again when
                        // something inside it fails; in an operand, a WHEN or an ELSE the
                        // parser gives up at once.
                        let l = match stack.last().map(|f| f.open) {
                            Some(Open::Case(part)) if part != CasePart::Then => 0,
                            _ => 1,
                        };
                        open = Some((Open::Case(CasePart::Operand), l));
                    }
                    Keyword::WHEN | Keyword::THEN | Keyword::ELSE => {
                        if let Some(Frame {
                            open: Open::Case(part),
                            ..
                        }) = stack.last_mut()
                        {
                            *part = match w.keyword {
                                Keyword::WHEN => CasePart::When,
                                Keyword::THEN => CasePart::Then,
                                _ => CasePart::Else,
                            };
                        }
                    }
                    Keyword::END => close(&mut stack, &mut levels, &mut chained, |o| {
                        matches!(o, Open::Case(_))
                    }),
                    _ => {}
                }
                let in_from = match w.keyword {
                    Keyword::FROM | Keyword::JOIN => Some(true),
                    kw if ends_from(kw) => Some(false),
                    _ => None,
                };
                if let Some(in_from) = in_from {
                    match stack.last_mut() {
                        Some(f) => f.from = in_from,
                        None => top_from = in_from,
                    }
                }
            }
            Token::LParen | Token::LBracket => {
                let o = if *tok == Token::LParen {
                    Open::Paren
                } else {
                    Open::Bracket
                };
                open = Some((o, bracket_levels(reader, prev, tok)));
            }
            Token::LBrace => open = Some((Open::Brace, 0)),
            // The generic dialect reads a named argument's value again as an unnamed one
            // when it fails: the call costs a level.
            Token::Assignment | Token::RArrow if reader == Reader::Generic => {
                if let Some(f) = stack
                    .last_mut()
                    .filter(|f| f.open == Open::Paren && !f.named)
                {
                    f.named = true;
                    f.levels += 1;
                    levels += 1;
                    max_levels = max_levels.max(levels);
                }
            }
            Token::RParen => close(&mut stack, &mut levels, &mut chained, |o| *o == Open::Paren),
            Token::RBracket => close(&mut stack, &mut levels, &mut chained, |o| {
                *o == Open::Bracket
            }),
            Token::RBrace => close(&mut stack, &mut levels, &mut chained, |o| *o == Open::Brace),
            _ => {}
        }
        // Operator chains, set operations and joins at the current level.
        {
            let (ops, chain) = match stack.last_mut() {
                Some(f) => (&mut f.ops, &mut f.chain),
                None => (&mut top_ops, &mut top_chain),
            };
            let joins = match tok {
                Token::Comma => from,
                Token::Word(w) if w.quote_style.is_none() => matches!(
                    w.keyword,
                    Keyword::JOIN | Keyword::UNION | Keyword::EXCEPT | Keyword::INTERSECT
                ),
                _ => false,
            };
            let new_item = joins
                || *tok == Token::Comma
                || matches!(tok, Token::Word(w) if w.quote_style.is_none() && starts_item(w.keyword));
            if joins {
                *chain += 1;
                chained += 1;
            }
            if new_item {
                chained -= std::mem::take(ops);
            } else if is_operator(tok) {
                *ops += 1;
                chained += 1;
            }
            max_tree = max_tree.max(chained + stack.len());
        }
        // A table factor: after FROM, JOIN or a comma of a FROM clause, or right inside
        // another table factor (`FROM ((a JOIN b) ...`).
        let table = *tok == Token::LParen
            && match prev {
                Prev::Word(Keyword::FROM | Keyword::JOIN, _) => true,
                Prev::Comma => from,
                Prev::LParen => stack.last().is_some_and(|f| f.table),
                _ => false,
            };
        prev = match tok {
            // A quoted name is a function name like any other.
            Token::Word(w) => Prev::Word(w.keyword, operand),
            Token::Comma => Prev::Comma,
            Token::LParen => Prev::LParen,
            _ => Prev::Other,
        };
        operand = ends_operand(tok);
        if let Some((open, mut l)) = open {
            if table {
                l = l.max(1 + (reader == Reader::Postgres) as usize);
            }
            l += std::mem::take(&mut prefix);
            stack.push(Frame {
                open,
                levels: l,
                from: false,
                table,
                named: false,
                ops: 0,
                chain: 0,
            });
            levels += l;
            max_depth = max_depth.max(stack.len());
            max_levels = max_levels.max(levels);
            max_tree = max_tree.max(chained + stack.len());
        }
        let sign = matches!(
            tok,
            Token::Minus | Token::Plus | Token::Tilde | Token::ExclamationMark
        );
        prefix = match tok {
            Token::Word(w) if w.quote_style.is_none() && w.keyword == Keyword::INTERVAL => {
                prefix + 1 + (reader == Reader::Postgres) as usize
            }
            _ if sign && not => prefix + 1,
            // Still before the expression's first construct.
            Token::Word(_) | Token::Period => prefix,
            _ if sign => prefix,
            _ => 0,
        };
        not = matches!(tok, Token::Word(w) if w.quote_style.is_none() && w.keyword == Keyword::NOT);
    }
    Nesting {
        depth: max_depth,
        levels: max_levels,
        tree: max_tree,
    }
}

/// Refuses statements that nest too deeply (see [`nesting`]), before sqlparser sees them.
fn check_nesting_tokens(tokens: &[TokenWithSpan], reader: Reader) -> Result<()> {
    let Nesting {
        depth: max_depth,
        levels: max_levels,
        tree,
    } = nesting(tokens, reader);
    if tree > MAX_EXPRESSION_DEPTH {
        return TooComplexSnafu {
            message: format!(
                "statement is too complex: its syntax tree is {tree} levels deep, and at most \
                 {MAX_EXPRESSION_DEPTH} are allowed (each operator of a chain such as \
                 a + b + c or x AND y AND z, each UNION and each JOIN adds a level); split it \
                 into smaller statements, or use IN (...) instead of a chain of ORs"
            ),
        }
        .fail();
    }
    if max_depth > MAX_NESTING {
        return TooComplexSnafu {
            message: format!(
                "statement nests expressions {max_depth} levels deep; at most {MAX_NESTING} are allowed"
            ),
        }
        .fail();
    }
    if max_levels > MAX_BACKTRACKING_NESTING {
        return TooComplexSnafu {
            message: format!(
                "statement nests CASE, CAST(, subqueries and similar expressions {max_levels} levels deep; \
                 at most {MAX_BACKTRACKING_NESTING} are allowed"
            ),
        }
        .fail();
    }
    Ok(())
}

fn tokenize(dialect: &dyn SqlParserDialect, sql: &str) -> Result<Vec<TokenWithSpan>> {
    Tokenizer::new(dialect, sql)
        .tokenize_with_location()
        .map_err(|e| sql_err(e.into()))
}

/// The nesting guard of [`parse`] for text another parser reads (the PostgreSQL front
/// door hands statements to datafusion-postgres): tokenizes `sql` as PostgreSQL and rejects
/// it if it nests too deeply. Text that does not tokenize is left to that parser.
pub fn check_nesting(sql: &str) -> Result<()> {
    match tokenize(&PostgreSqlDialect {}, sql) {
        Ok(tokens) => check_nesting_tokens(&tokens, Reader::Postgres),
        Err(_) => Ok(()),
    }
}

/// Which SQL dialect a text is read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// sqlparser's generic dialect (HTTP, the library; GreptimeDB's syntax).
    Generic,
    /// PostgreSQL's (the PostgreSQL front door).
    Postgres,
}

impl Dialect {
    fn tokens(self, sql: &str) -> Result<Vec<TokenWithSpan>> {
        match self {
            Dialect::Generic => tokenize(&GenericDialect {}, sql),
            Dialect::Postgres => tokenize(&PostgreSqlDialect {}, sql),
        }
    }

    fn reader(self) -> Reader {
        match self {
            Dialect::Generic => Reader::Generic,
            Dialect::Postgres => Reader::Postgres,
        }
    }
}

/// Parses `;`-separated statements in the generic dialect.
pub fn parse(sql: &str) -> Result<Vec<Stmt>> {
    parse_dialect(sql, Dialect::Generic)
}

/// Parses `;`-separated statements in `dialect`.
pub fn parse_dialect(sql: &str, dialect: Dialect) -> Result<Vec<Stmt>> {
    let sql = &greptime_type_names(sql, dialect);
    parse_tokens(dialect.tokens(sql)?, sql, dialect)
}

/// GreptimeDB's type names for timestamps (`'2024-01-01'::TimestampSecond`,
/// `CAST(x AS TimestampNanosecond)`) written as SQL's (`TIMESTAMP(0)`), so
/// that DataFusion plans them; the text is unchanged when it has none (or
/// does not tokenize: the parser then says why).
pub fn greptime_type_names(sql: &str, dialect: Dialect) -> String {
    let precision = |w: &str| match w.to_ascii_lowercase().as_str() {
        "timestampsecond" => Some(0),
        "timestampmillisecond" => Some(3),
        "timestampmicrosecond" => Some(6),
        "timestampnanosecond" => Some(9),
        _ => None,
    };
    let quick = sql.to_ascii_lowercase();
    if !quick.contains("timestamp") {
        return sql.to_string();
    }
    let Ok(tokens) = dialect.tokens(sql) else {
        return sql.to_string();
    };
    let lines = Lines::new(sql);
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    let solid: Vec<&TokenWithSpan> = tokens
        .iter()
        .filter(|t| !matches!(t.token, Token::Whitespace(_)))
        .collect();
    for (i, t) in solid.iter().enumerate() {
        let Token::Word(w) = &t.token else {
            continue;
        };
        let prev = i
            .checked_sub(1)
            .and_then(|j| solid.get(j))
            .map(|t| &t.token);
        let next = solid.get(i + 1).map(|t| &t.token);
        // `x::T`, or `CAST(x AS T)` (an alias `AS T` is not followed by `)`).
        let is_type = matches!(prev, Some(Token::DoubleColon))
            || (matches!(prev, Some(Token::Word(a)) if a.keyword == Keyword::AS)
                && matches!(next, Some(Token::RParen)));
        let Some(p) = precision(&w.value).filter(|_| is_type && w.quote_style.is_none()) else {
            continue;
        };
        let from = lines.offset(t.span.start.line, t.span.start.column);
        let to = lines.offset(t.span.end.line, t.span.end.column);
        if from < last || to > sql.len() || from > to {
            continue;
        }
        out.push_str(&sql[last..from]);
        out.push_str(&format!("TIMESTAMP({p})"));
        last = to;
    }
    out.push_str(&sql[last..]);
    out
}

/// Parses `;`-separated statements from `tokens`, whose locations are in
/// `sql`, after the nesting guard.
fn parse_tokens(tokens: Vec<TokenWithSpan>, sql: &str, dialect: Dialect) -> Result<Vec<Stmt>> {
    check_nesting_tokens(&tokens, dialect.reader())?;
    let tokens = greptime_values(tokens);
    let mut p = match dialect {
        Dialect::Generic => Parser::new(&GenericDialect {}),
        Dialect::Postgres => Parser::new(&PostgreSqlDialect {}),
    }
    .with_tokens_with_locations(tokens);
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

/// GreptimeDB's reading of an `INSERT ... VALUES` list (MySQL's too): a row
/// element that is one double-quoted token is a string (`VALUES (1, "a")`),
/// and a row may end with a comma (`VALUES (1, 2,)`). Only the elements of
/// the rows themselves: double quotes elsewhere, nested in an expression of
/// a row included, still quote identifiers.
fn greptime_values(mut tokens: Vec<TokenWithSpan>) -> Vec<TokenWithSpan> {
    let code = |t: &TokenWithSpan| !matches!(t.token, Token::Whitespace(_));
    let mut depth = 0usize;
    let mut insert = false;
    let mut in_values = false;
    // Whether the previous code token was `(` or `,` (a row element starts).
    let mut element_start = false;
    let mut drop = Vec::new();
    for i in 0..tokens.len() {
        if !code(&tokens[i]) {
            continue;
        }
        let next = tokens[i + 1..].iter().find(|t| code(t)).map(|t| &t.token);
        match &tokens[i].token {
            Token::SemiColon => {
                (depth, insert, in_values) = (0, false, false);
            }
            Token::LParen => depth += 1,
            Token::RParen => depth = depth.saturating_sub(1),
            Token::Word(w) if depth == 0 && w.keyword == Keyword::INSERT => insert = true,
            Token::Word(w) if depth == 0 && insert && w.keyword == Keyword::VALUES => {
                in_values = true
            }
            Token::Comma if in_values && depth == 1 && next == Some(&Token::RParen) => {
                drop.push(i);
            }
            Token::Word(w)
                if in_values
                    && depth == 1
                    && w.quote_style == Some('"')
                    && element_start
                    && matches!(next, Some(Token::RParen | Token::Comma)) =>
            {
                let value = w.value.clone();
                tokens[i].token = Token::SingleQuotedString(value);
            }
            Token::Comma => {}
            // Past the rows (ON CONFLICT, RETURNING, ...).
            _ if depth == 0 => in_values = false,
            _ => {}
        }
        element_start = matches!(tokens[i].token, Token::LParen | Token::Comma);
    }
    for i in drop.into_iter().rev() {
        tokens.remove(i);
    }
    tokens
}

/// Lexes a script once, cuts it at its `;` tokens (as [`split`] does) and
/// parses each statement from its own tokens; returns each statement's text
/// (trimmed, without the `;`) with its parse. Every statement is parsed
/// before any runs; one that holds only whitespace and comments is dropped.
pub fn parse_script(sql: &str, dialect: Dialect) -> Result<Vec<(String, Stmt)>> {
    let sql = &greptime_type_names(sql, dialect);
    let mut out = Vec::new();
    for (text, tokens) in cut(dialect.tokens(sql)?, sql) {
        let mut stmts = parse_tokens(tokens, sql, dialect)?;
        match stmts.len() {
            0 => {}
            1 => out.extend(stmts.pop().map(|s| (text, s))),
            n => {
                return SqlSnafu {
                    message: format!("expected one statement, found {n} in {text:?}"),
                }
                .fail()
            }
        }
    }
    Ok(out)
}

/// Cuts a script's tokens at its `;` tokens: per statement that holds more
/// than whitespace and comments, its text (trimmed, without the `;`) and its
/// tokens, the `;` included (it ends the statement for the parser too).
fn cut(tokens: Vec<TokenWithSpan>, sql: &str) -> Vec<(String, Vec<TokenWithSpan>)> {
    // Only what the tokenizer reads as whitespace: a no-break space is a
    // token (which the parser refuses), not nothing.
    let trim = |s: &str| s.trim_matches([' ', '\t', '\n', '\r']).to_string();
    let lines = Lines::new(sql);
    let mut out = Vec::new();
    let mut group: Vec<TokenWithSpan> = Vec::new();
    let mut start = 0usize;
    let mut has_code = false;
    for t in tokens {
        match &t.token {
            Token::SemiColon => {
                let at = lines.offset(t.span.start.line, t.span.start.column);
                group.push(t);
                if has_code {
                    out.push((trim(&sql[start..at]), std::mem::take(&mut group)));
                }
                group.clear();
                start = at + 1;
                has_code = false;
                continue;
            }
            Token::Whitespace(_) | Token::EOF => {}
            _ => has_code = true,
        }
        group.push(t);
    }
    if has_code {
        out.push((trim(&sql[start..]), group));
    }
    out
}

/// Byte offsets of tokenizer locations (1-based line and column, in chars) in one text.
struct Lines<'a> {
    sql: &'a str,
    /// Byte offset of each line's start.
    starts: Vec<usize>,
}

impl<'a> Lines<'a> {
    fn new(sql: &'a str) -> Lines<'a> {
        let mut starts = vec![0];
        starts.extend(sql.match_indices('\n').map(|(i, _)| i + 1));
        Lines { sql, starts }
    }

    fn offset(&self, line: u64, column: u64) -> usize {
        let Some(&start) = usize::try_from(line)
            .ok()
            .and_then(|l| l.checked_sub(1))
            .and_then(|l| self.starts.get(l))
        else {
            return self.sql.len();
        };
        let col = column.saturating_sub(1) as usize;
        let rest = &self.sql[start..];
        if rest.is_char_boundary(col.min(rest.len())) && rest[..col.min(rest.len())].is_ascii() {
            return start + col.min(rest.len());
        }
        start + rest.char_indices().nth(col).map_or(rest.len(), |(b, _)| b)
    }
}

/// Splits a script into its statements' texts at the `;` tokens of `dialect`'s
/// tokenizer (the one that then reads each statement, so that what is split is
/// what runs), dropping statements that hold only whitespace and comments.
pub fn split(sql: &str, dialect: Dialect) -> Result<Vec<String>> {
    Ok(cut(dialect.tokens(sql)?, sql)
        .into_iter()
        .map(|(text, _)| text)
        .collect())
}

/// The highest `$n` placeholder of a statement (0 when it has none).
pub fn param_count(sql: &str, dialect: Dialect) -> usize {
    dialect
        .tokens(sql)
        .map(|tokens| {
            tokens
                .iter()
                .filter_map(|t| match &t.token {
                    Token::Placeholder(p) => p.strip_prefix('$')?.parse::<usize>().ok(),
                    _ => None,
                })
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0)
}

/// Replaces each `$n` placeholder token with `literals[n-1]`.
pub fn bind_params(sql: &str, literals: &[String], dialect: Dialect) -> Result<String> {
    let tokens = dialect.tokens(sql)?;
    let lines = Lines::new(sql);
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    for t in &tokens {
        let Token::Placeholder(p) = &t.token else {
            continue;
        };
        let Some(n) = p.strip_prefix('$').and_then(|d| d.parse::<usize>().ok()) else {
            continue;
        };
        let literal = n
            .checked_sub(1)
            .and_then(|i| literals.get(i))
            .ok_or_else(|| {
                SqlSnafu {
                    message: format!(
                        "statement uses parameter ${n} but only {} were bound",
                        literals.len()
                    ),
                }
                .build()
            })?;
        let from = lines.offset(t.span.start.line, t.span.start.column);
        let to = lines.offset(t.span.end.line, t.span.end.column);
        out.push_str(&sql[last..from]);
        out.push_str(literal);
        last = to;
    }
    out.push_str(&sql[last..]);
    Ok(out)
}

/// The first `n` words of a statement, upper-cased (for messages).
pub fn leading_keywords(sql: &str, n: usize) -> Vec<String> {
    let Ok(tokens) = Dialect::Generic.tokens(sql) else {
        return Vec::new();
    };
    tokens
        .iter()
        .filter_map(|t| match &t.token {
            Token::Word(w) if w.quote_style.is_none() => Some(w.value.to_ascii_uppercase()),
            _ => None,
        })
        .take(n)
        .collect()
}

fn is_word(p: &Parser, n: usize, word: &str) -> bool {
    matches!(&p.peek_nth_token(n).token, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// GreptimeDB's `TQL EVAL | EXPLAIN | ANALYZE (...) <PromQL>`: refused by
/// name rather than as a syntax error.
fn refuse_tql(p: &Parser) -> Result<()> {
    if !is_word(p, 0, "tql") {
        return Ok(());
    }
    UnsupportedSnafu {
        message: "TQL (PromQL) is not supported: sandflow reads SQL only; write the query in \
                  SQL, e.g. SELECT sensor, avg(value) FROM t WHERE ts > now() - INTERVAL '1 \
                  minute' GROUP BY sensor",
    }
    .fail()
}

fn parse_one(p: &mut Parser, sql: &str) -> Result<Stmt> {
    refuse_tql(p)?;
    if let Some(stmt) = parse_flow_statement(p, sql)? {
        return Ok(stmt);
    }
    if let Some(stmt) = super::access::parse(p)? {
        return Ok(stmt);
    }
    if is_kw(p, 0, Keyword::CREATE) && is_kw(p, 1, Keyword::TABLE) {
        p.next_token();
        p.next_token();
        return parse_create_table(p).map(Stmt::CreateTable);
    }
    if is_kw(p, 0, Keyword::ALTER) && is_kw(p, 1, Keyword::TABLE) {
        p.next_token();
        p.next_token();
        return parse_alter_table(p).map(Stmt::AlterTable);
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
        if is_kw(p, 1, Keyword::INDEX) || is_word(p, 1, "INDEXES") || is_kw(p, 1, Keyword::KEYS) {
            return UnsupportedSnafu {
                message: "SHOW INDEX is not supported; SHOW CREATE TABLE shows a table's time \
                          index, primary key and index clauses",
            }
            .fail();
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
            options: Vec::new(),
        },
        Statement::CreateSchema {
            schema_name: SchemaName::Simple(name),
            if_not_exists,
            ..
        } => Stmt::CreateDatabase {
            name: database_name(&name)?,
            if_not_exists,
            options: Vec::new(),
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
        Statement::Use(u) => {
            use datafusion::sql::sqlparser::ast::Use;
            match u {
                Use::Object(name) | Use::Database(name) | Use::Schema(name) => {
                    Stmt::Use(database_name(&name)?)
                }
                other => {
                    return UnsupportedSnafu {
                        message: format!(
                            "{other} is not supported; write USE database to choose the \
                             session's database"
                        ),
                    }
                    .fail()
                }
            }
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
    if let Some(stmt) = parse_component_statement(p)? {
        return Ok(Some(stmt));
    }
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
    if is_kw(p, 0, Keyword::SHOW) && is_word(p, 1, "NODES") {
        // A query over information_schema.nodes.
        p.next_token();
        p.next_token();
        let filter = match parse_like(p)? {
            Some(pattern) => format!(" WHERE id LIKE '{}'", pattern.replace('\'', "''")),
            None => String::new(),
        };
        let sql = format!(
            "SELECT id, role, address, lease, flows FROM information_schema.nodes{filter} ORDER BY id"
        );
        let mut stmts = Parser::parse_sql(&GenericDialect {}, &sql).map_err(sql_err)?;
        return match stmts.pop() {
            Some(stmt) => Ok(Some(Stmt::Query(Box::new(stmt)))),
            None => Err(syntax("SHOW NODES")),
        };
    }
    if is_kw(p, 0, Keyword::SHOW) && is_word(p, 1, "FLOW") && is_word(p, 2, "STATUS") {
        // GreptimeDB's SHOW FLOW STATUS [LIKE 'p']: a query over
        // information_schema.flow_statistics.
        for _ in 0..3 {
            p.next_token();
        }
        if p.parse_one_of_keywords(&[Keyword::FROM, Keyword::IN])
            .is_some()
        {
            database_name(&p.parse_object_name(false).map_err(sql_err)?)?;
        }
        let filter = match parse_like(p)? {
            Some(pattern) => format!(" WHERE flow_name LIKE '{}'", pattern.replace('\'', "''")),
            None => String::new(),
        };
        let sql = format!(
            "SELECT flow_id, flow_name, start_time, last_execution_time, uptime_seconds, \
             state_size FROM information_schema.flow_statistics{filter} ORDER BY flow_name"
        );
        let mut stmts = Parser::parse_sql(&GenericDialect {}, &sql).map_err(sql_err)?;
        return match stmts.pop() {
            Some(stmt) => Ok(Some(Stmt::Query(Box::new(stmt)))),
            None => Err(syntax("SHOW FLOW STATUS")),
        };
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

/// `CREATE [OR REPLACE] COMPONENT`, `DROP COMPONENT`, `SHOW COMPONENTS` and
/// `ALTER FLOW ... SET COMPONENT VERSION n`, or `None`.
fn parse_component_statement(p: &mut Parser) -> Result<Option<Stmt>> {
    if is_kw(p, 0, Keyword::CREATE)
        && (is_word(p, 1, "COMPONENT")
            || (is_kw(p, 1, Keyword::OR)
                && is_kw(p, 2, Keyword::REPLACE)
                && is_word(p, 3, "COMPONENT")))
    {
        p.next_token();
        let or_replace = p.parse_keywords(&[Keyword::OR, Keyword::REPLACE]);
        p.next_token();
        let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
        if !p.parse_keyword(Keyword::FROM) {
            return Err(syntax(format!(
                "expected FROM <bytes> after CREATE COMPONENT {name} (a bytea literal such as \
                 '\\x0061736d...', decode('0061736d...', 'hex') or a $1 parameter), found {}",
                p.peek_token().token
            )));
        }
        let source = component_bytes(p)?;
        return Ok(Some(Stmt::CreateComponent {
            name,
            or_replace,
            source,
        }));
    }
    if is_kw(p, 0, Keyword::DROP) && is_word(p, 1, "COMPONENT") {
        p.next_token();
        p.next_token();
        let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
        let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
        return Ok(Some(Stmt::DropComponent { name, if_exists }));
    }
    if is_kw(p, 0, Keyword::SHOW) && is_word(p, 1, "COMPONENTS") {
        p.next_token();
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
        return Ok(Some(Stmt::ShowComponents { database, like }));
    }
    if is_kw(p, 0, Keyword::ALTER) && is_word(p, 1, "FLOW") {
        p.next_token();
        p.next_token();
        let name = flow_name(p)?;
        if !(is_kw(p, 0, Keyword::SET) && is_word(p, 1, "COMPONENT") && is_word(p, 2, "VERSION")) {
            return Err(syntax(format!(
                "expected SET COMPONENT VERSION <n> after ALTER FLOW {name} (the only ALTER FLOW \
                 there is), found {}",
                p.peek_token().token
            )));
        }
        for _ in 0..3 {
            p.next_token();
        }
        let version = match p.next_token().token {
            Token::Number(n, _) => n.parse::<u32>().ok().filter(|v| *v >= 1),
            _ => None,
        }
        .ok_or_else(|| {
            syntax(format!(
                "ALTER FLOW {name} SET COMPONENT VERSION takes a version number (1, 2, ...; see \
                 information_schema.components)"
            ))
        })?;
        return Ok(Some(Stmt::AlterFlowComponent { name, version }));
    }
    Ok(None)
}

/// The bytes after `CREATE COMPONENT name FROM`: `'\x<hex>'` (bytea's hex
/// format), `X'<hex>'`, `decode('<hex>', 'hex')`, `decode('<b64>',
/// 'base64')`, or a `$n` parameter.
fn component_bytes(p: &mut Parser) -> Result<ComponentSource> {
    let bytea = |text: &str| -> Result<Vec<u8>> {
        let Some(hex_digits) = text
            .strip_prefix("\\x")
            .or_else(|| text.strip_prefix("\\X"))
        else {
            return Err(syntax(
                "the component's bytes must be a bytea literal in hex format ('\\x0061736d...'), \
                 X'0061736d...', decode('...', 'hex'|'base64') or a $1 parameter",
            ));
        };
        from_hex(hex_digits)
    };
    let tok = p.next_token();
    let bytes = match tok.token {
        Token::Placeholder(ph) => {
            let n = ph
                .strip_prefix('$')
                .and_then(|d| d.parse::<usize>().ok())
                .ok_or_else(|| syntax(format!("unsupported parameter {ph}; use $1")))?;
            return Ok(ComponentSource::Param(n));
        }
        Token::SingleQuotedString(s) | Token::EscapedStringLiteral(s) => bytea(&s)?,
        Token::HexStringLiteral(h) => from_hex(&h)?,
        Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case("decode") => {
            p.expect_token(&Token::LParen).map_err(sql_err)?;
            let text = p.parse_literal_string().map_err(sql_err)?;
            p.expect_token(&Token::Comma).map_err(sql_err)?;
            let format = p.parse_literal_string().map_err(sql_err)?;
            p.expect_token(&Token::RParen).map_err(sql_err)?;
            match format.to_ascii_lowercase().as_str() {
                "hex" => from_hex(&text)?,
                "base64" => {
                    use base64::Engine;
                    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
                    base64::engine::general_purpose::STANDARD
                        .decode(clean)
                        .map_err(|e| syntax(format!("decode(..., 'base64'): {e}")))?
                }
                other => {
                    return Err(syntax(format!(
                        "decode(..., '{other}'): use 'hex' or 'base64'"
                    )))
                }
            }
        }
        other => {
            return Err(syntax(format!(
                "expected the component's bytes after FROM ('\\x0061736d...', decode('...', \
                 'hex') or $1), found {other}"
            )))
        }
    };
    Ok(ComponentSource::Bytes(std::sync::Arc::new(bytes)))
}

fn from_hex(text: &str) -> Result<Vec<u8>> {
    let clean: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    hex::decode(clean).map_err(|e| {
        syntax(format!(
            "the component's bytes are not valid hex ({e}); write '\\x' followed by two hex \
             digits per byte"
        ))
    })
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
        eval_interval: None,
        comment: None,
        options: Vec::new(),
        query: String::new(),
        database: DEFAULT_DATABASE.into(),
        component: None,
    };
    loop {
        if is_word(p, 0, "EXPIRE") && is_word(p, 1, "AFTER") {
            p.next_token();
            p.next_token();
            flow.expire_after = Some(interval_text(p, "EXPIRE AFTER")?);
        } else if is_word(p, 0, "EVAL") && is_kw(p, 1, Keyword::INTERVAL) {
            p.next_token();
            p.next_token();
            flow.eval_interval = Some(interval_text(p, "EVAL INTERVAL")?);
        } else if p.parse_keyword(Keyword::COMMENT) {
            flow.comment = Some(p.parse_literal_string().map_err(sql_err)?);
        } else if p.parse_keyword(Keyword::WITH) {
            flow.options = parse_options(p)?;
        } else if p.parse_keyword(Keyword::USING) {
            if !is_word(p, 0, "COMPONENT") {
                return Err(syntax(format!(
                    "expected COMPONENT <name> after USING in CREATE FLOW {}, found {}",
                    flow.name,
                    p.peek_token().token
                )));
            }
            p.next_token();
            flow.component = Some(ComponentRef {
                name: table_name(&p.parse_object_name(false).map_err(sql_err)?)?,
                version: None,
            });
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
    refuse_tql(p)?;
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

/// The interval after `EXPIRE AFTER` or `EVAL INTERVAL`, as text: `'1 hour'`,
/// `INTERVAL '5 minutes'` (gives `5 minutes`) or `INTERVAL '1' HOUR` (gives
/// `1 HOUR`).
fn interval_text(p: &mut Parser, clause: &str) -> Result<String> {
    let interval = p.parse_keyword(Keyword::INTERVAL);
    let mut text = match p.next_token().token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => s,
        Token::Number(n, _) if interval => n,
        other => {
            return Err(syntax(format!(
                "expected an interval after {clause} (e.g. '1 hour' or INTERVAL '5 minutes'), found {other}"
            )))
        }
    };
    // INTERVAL '1' HOUR: only a unit, not the next clause (EVAL, COMMENT, ...).
    if interval {
        if let Token::Word(w) = &p.peek_token().token {
            if w.quote_style.is_none() && is_interval_unit(&w.value) {
                text = format!("{text} {}", w.value);
                p.next_token();
            }
        }
    }
    Ok(text)
}

fn is_interval_unit(word: &str) -> bool {
    const UNITS: &[&str] = &[
        "millisecond",
        "milliseconds",
        "second",
        "seconds",
        "minute",
        "minutes",
        "hour",
        "hours",
        "day",
        "days",
        "week",
        "weeks",
        "month",
        "months",
        "year",
        "years",
    ];
    UNITS.iter().any(|u| u.eq_ignore_ascii_case(word))
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
    let ty = ColumnType::from_sql(&name, &args, unsigned)?;
    // `BIGINT[]`: a list (what a flow's array_agg writes).
    if p.consume_token(&Token::LBracket) {
        p.expect_token(&Token::RBracket).map_err(sql_err)?;
        if p.peek_token().token == Token::LBracket {
            return UnsupportedSnafu {
                message: "lists of lists are not supported",
            }
            .fail();
        }
        return Ok(ColumnType::list_of(ty).unwrap_or(ty));
    }
    Ok(ty)
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
        index: None,
        time_index: false,
        primary_key: false,
    };
    loop {
        if let Some(kind) = index_kind(p) {
            let clause = parse_index_clause(p, kind)?;
            col.index = set_index_clause(col.index.as_deref(), kind, Some(clause));
        } else if p.parse_keywords(&[Keyword::TIME, Keyword::INDEX]) {
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

/// The kinds of index GreptimeDB's columns take, in the order it shows them.
pub const INDEX_KINDS: [&str; 3] = ["FULLTEXT", "SKIPPING", "INVERTED"];

/// The kind of the index clause that starts here (`FULLTEXT INDEX`, ...).
fn index_kind(p: &Parser) -> Option<&'static str> {
    INDEX_KINDS
        .into_iter()
        .find(|k| is_word(p, 0, k) && is_kw(p, 1, Keyword::INDEX))
}

/// `KIND INDEX [WITH (...)]`, as [`ColumnDef::index`] writes it.
fn parse_index_clause(p: &mut Parser, kind: &str) -> Result<String> {
    p.next_token();
    p.next_token();
    let mut text = format!("{kind} INDEX");
    if p.parse_keyword(Keyword::WITH) {
        let opts: Vec<String> = parse_options(p)?
            .into_iter()
            .map(|(k, v)| format!("{k} = '{}'", v.replace('\'', "''")))
            .collect();
        text.push_str(&format!(" WITH({})", opts.join(", ")));
    }
    Ok(text)
}

/// A column's index clauses (`index`, as [`ColumnDef::index`] holds them)
/// with the one of `kind` set to `clause`, or removed when `None`; the
/// clauses in GreptimeDB's order, `None` when none is left.
pub fn set_index_clause(
    index: Option<&str>,
    kind: &'static str,
    clause: Option<String>,
) -> Option<String> {
    let text = index.unwrap_or_default();
    // Where each clause starts: a kind's name followed by INDEX, outside
    // the quotes of its options.
    let mut starts: Vec<(usize, &str)> = Vec::new();
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        if c == '\'' {
            quoted = !quoted;
        }
        if quoted || (i > 0 && !text[..i].ends_with(' ')) {
            continue;
        }
        let rest = &text[i..];
        if let Some(k) = INDEX_KINDS.into_iter().find(|k| {
            rest.strip_prefix(k)
                .is_some_and(|r| r.starts_with(" INDEX"))
        }) {
            starts.push((i, k));
        }
    }
    let mut clauses: Vec<(&str, String)> = starts
        .iter()
        .enumerate()
        .map(|(n, &(at, k))| {
            let end = starts.get(n + 1).map_or(text.len(), |&(e, _)| e);
            (k, text[at..end].trim().to_string())
        })
        .filter(|(k, _)| *k != kind)
        .collect();
    if let Some(clause) = clause {
        clauses.push((kind, clause));
    }
    clauses.sort_by_key(|(k, _)| INDEX_KINDS.iter().position(|x| x == k));
    let joined: Vec<String> = clauses.into_iter().map(|(_, c)| c).collect();
    (!joined.is_empty()).then(|| joined.join(" "))
}

/// An option name or value in `SET` / `UNSET`: quoted or a word.
fn option_text(p: &mut Parser, what: &str) -> Result<String> {
    match p.next_token().token {
        Token::SingleQuotedString(s) | Token::DoubleQuotedString(s) => Ok(s),
        Token::Word(w) => Ok(w.value),
        Token::Number(n, _) => Ok(n),
        other => Err(syntax(format!("expected {what}, found {other}"))),
    }
}

fn parse_alter_table(p: &mut Parser) -> Result<AlterTable> {
    let name = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
    let ident = |p: &mut Parser| -> Result<String> {
        Ok(normalize_ident(&p.parse_identifier().map_err(sql_err)?))
    };
    let mut ops = Vec::new();
    loop {
        let op = if p.parse_keyword(Keyword::ADD) {
            let _ = p.parse_keyword(Keyword::COLUMN);
            let if_not_exists = p.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
            let column = Box::new(parse_column(p)?);
            let position = if p.parse_keyword(Keyword::FIRST) {
                Some(ColumnPosition::First)
            } else if p.parse_keyword(Keyword::AFTER) {
                Some(ColumnPosition::After(ident(p)?))
            } else {
                None
            };
            AlterOp::AddColumn {
                column,
                if_not_exists,
                position,
            }
        } else if p.parse_keyword(Keyword::DROP) {
            let _ = p.parse_keyword(Keyword::COLUMN);
            let if_exists = p.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            AlterOp::DropColumn {
                name: ident(p)?,
                if_exists,
            }
        } else if p.parse_keyword(Keyword::RENAME) {
            if p.parse_keyword(Keyword::COLUMN) {
                let from = ident(p)?;
                p.expect_keyword(Keyword::TO).map_err(sql_err)?;
                AlterOp::RenameColumn {
                    from,
                    to: ident(p)?,
                }
            } else if p.parse_keyword(Keyword::TO) {
                AlterOp::RenameTable(new_table_name(p, &name)?)
            } else {
                // `RENAME a TO b` (a column) or `RENAME t` (the table).
                let first = ident(p)?;
                if p.parse_keyword(Keyword::TO) {
                    AlterOp::RenameColumn {
                        from: first,
                        to: ident(p)?,
                    }
                } else {
                    AlterOp::RenameTable(first)
                }
            }
        } else if p.parse_keyword(Keyword::MODIFY) {
            let _ = p.parse_keyword(Keyword::COLUMN);
            let name = ident(p)?;
            let set = is_kw(p, 0, Keyword::SET);
            if set || is_kw(p, 0, Keyword::UNSET) {
                p.next_token();
                let Some(kind) = index_kind(p) else {
                    return Err(syntax(format!(
                        "expected FULLTEXT INDEX, SKIPPING INDEX or INVERTED INDEX after \
                         MODIFY COLUMN {name} {}, found {}",
                        if set { "SET" } else { "UNSET" },
                        p.peek_token().token
                    )));
                };
                let clause = parse_index_clause(p, kind)?;
                AlterOp::ColumnIndex {
                    name,
                    kind,
                    clause: set.then_some(clause),
                }
            } else {
                let _ = p.parse_keyword(Keyword::TYPE);
                AlterOp::ModifyColumn {
                    name,
                    data_type: parse_column_type(p)?,
                }
            }
        } else if p.parse_keyword(Keyword::ALTER) {
            let _ = p.parse_keyword(Keyword::COLUMN);
            let name = ident(p)?;
            let _ = p.parse_keywords(&[Keyword::SET, Keyword::DATA]);
            p.expect_keyword(Keyword::TYPE).map_err(sql_err)?;
            AlterOp::ModifyColumn {
                name,
                data_type: parse_column_type(p)?,
            }
        } else if p.parse_keyword(Keyword::SET) {
            let mut options = Vec::new();
            loop {
                let key = option_text(p, "an option name")?.to_lowercase();
                p.expect_token(&Token::Eq).map_err(sql_err)?;
                // `= NULL` (the word, not the string): the option's default.
                let value = match p.peek_token().token {
                    Token::Word(w) if w.quote_style.is_none() && w.keyword == Keyword::NULL => {
                        p.next_token();
                        String::new()
                    }
                    _ => option_text(p, "an option value")?,
                };
                options.push((key, value));
                if !p.consume_token(&Token::Comma) || !is_option_start(p) {
                    break;
                }
            }
            AlterOp::SetOptions(options)
        } else if is_word(p, 0, "UNSET") {
            p.next_token();
            let mut keys = Vec::new();
            loop {
                keys.push(option_text(p, "an option name")?.to_lowercase());
                if !p.consume_token(&Token::Comma) || !is_option_start(p) {
                    break;
                }
            }
            AlterOp::UnsetOptions(keys)
        } else {
            return Err(syntax(format!(
                "ALTER TABLE {name}: expected ADD COLUMN, DROP COLUMN, RENAME COLUMN, RENAME TO, \
                 MODIFY COLUMN, SET or UNSET, found {}",
                p.peek_token().token
            )));
        };
        ops.push(op);
        // `, ADD ...`: the comma of a SET list was taken there already.
        if p.consume_token(&Token::Comma) {
            continue;
        }
        if matches!(
            ops.last(),
            Some(AlterOp::SetOptions(_) | AlterOp::UnsetOptions(_))
        ) && (is_kw(p, 0, Keyword::ADD)
            || is_kw(p, 0, Keyword::DROP)
            || is_kw(p, 0, Keyword::RENAME)
            || is_kw(p, 0, Keyword::MODIFY))
        {
            continue;
        }
        break;
    }
    Ok(AlterTable { name, ops })
}

/// Whether the next token starts another option of a SET / UNSET list
/// (not another ALTER TABLE operation).
fn is_option_start(p: &Parser) -> bool {
    let next = p.peek_token().token;
    let op = matches!(&next, Token::Word(w) if matches!(
        w.keyword,
        Keyword::ADD | Keyword::DROP | Keyword::RENAME | Keyword::MODIFY | Keyword::ALTER | Keyword::SET
    ) || w.value.eq_ignore_ascii_case("UNSET"));
    !op
}

/// The new name in `RENAME TO t`: a bare name, or the same database's.
fn new_table_name(p: &mut Parser, old: &TableName) -> Result<String> {
    let new = table_name(&p.parse_object_name(false).map_err(sql_err)?)?;
    if new.qualified && new.database != old.database {
        return UnsupportedSnafu {
            message: format!(
                "ALTER TABLE ... RENAME TO cannot move table '{old}' to database '{}'; \
                 a table keeps its database",
                new.database
            ),
        }
        .fail();
    }
    Ok(new.table)
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
    if is_kw(p, 0, Keyword::AS) {
        return UnsupportedSnafu {
            message: "CREATE TABLE ... AS is not supported; create the table with its columns \
                      (or LIKE another table), then INSERT INTO t SELECT ...",
        }
        .fail();
    }
    let mut ct = CreateTable {
        name,
        if_not_exists,
        columns: Vec::new(),
        time_index: None,
        primary_key: None,
        options: Vec::new(),
        partition: None,
        like: None,
    };
    // GreptimeDB's `CREATE TABLE t LIKE other`: nothing may follow.
    if p.parse_keyword(Keyword::LIKE) {
        ct.like = Some(table_name(&p.parse_object_name(false).map_err(sql_err)?)?);
        return Ok(ct);
    }
    p.expect_token(&Token::LParen).map_err(sql_err)?;
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
        if p.parse_keywords(&[Keyword::PARTITION, Keyword::ON, Keyword::COLUMNS]) {
            let cols = column_list(p)?;
            p.expect_token(&Token::LParen).map_err(sql_err)?;
            let rules = match p.consume_token(&Token::RParen) {
                true => Vec::new(),
                false => {
                    let rules = p
                        .parse_comma_separated(|p| p.parse_expr())
                        .map_err(sql_err)?;
                    p.expect_token(&Token::RParen).map_err(sql_err)?;
                    rules
                }
            };
            // Column names in the rules unquoted, as GreptimeDB prints them.
            let mut rules = rules;
            let _ = visit_expressions_mut(&mut rules, |e: &mut Expr| {
                if let Expr::Identifier(ident) = e {
                    ident.quote_style = None;
                }
                ControlFlow::<()>::Continue(())
            });
            let rules: Vec<String> = rules.iter().map(|r| format!("  {r}")).collect();
            ct.partition = Some(format!(
                "PARTITION ON COLUMNS ({}) (\n{}\n)",
                cols.iter()
                    .map(|c| format!("\"{c}\""))
                    .collect::<Vec<_>>()
                    .join(", "),
                rules.join(",\n")
            ));
        } else if p.parse_keyword(Keyword::ENGINE) {
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
mod greptime_type_tests {
    use super::*;

    #[test]
    fn greptime_timestamp_type_names_become_sql() {
        let g = |s: &str| greptime_type_names(s, Dialect::Generic);
        assert_eq!(
            g("SELECT 0::TimestampSecond, CAST(x AS timestampnanosecond) AS TimestampMillisecond"),
            "SELECT 0::TIMESTAMP(0), CAST(x AS TIMESTAMP(9)) AS TimestampMillisecond"
        );
        assert_eq!(
            g("SELECT 'x::TimestampSecond'"),
            "SELECT 'x::TimestampSecond'"
        );
        assert_eq!(
            g("SELECT TimestampSecond FROM t"),
            "SELECT TimestampSecond FROM t"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_lexed_once_and_cut_at_its_semicolons() {
        let script = "-- lead\nCREATE FLOW f SINK TO s AS\n  SELECT 'a;b' AS x FROM t;  ;\n\
                      /* only a comment */ ;\nINSERT INTO t VALUES (1, ';')\n";
        for dialect in [Dialect::Generic, Dialect::Postgres] {
            let stmts = parse_script(script, dialect).unwrap();
            let texts: Vec<&str> = stmts.iter().map(|(t, _)| t.as_str()).collect();
            assert_eq!(
                texts,
                [
                    "-- lead\nCREATE FLOW f SINK TO s AS\n  SELECT 'a;b' AS x FROM t",
                    "INSERT INTO t VALUES (1, ';')"
                ],
                "the same pieces as split: {:?}",
                split(script, dialect).unwrap()
            );
            assert_eq!(split(script, dialect).unwrap(), texts);
            let Stmt::CreateFlow(f) = &stmts[0].1 else {
                panic!("{:?}", stmts[0].1)
            };
            // The flow's query ends at its own `;`, not at the script's end.
            assert_eq!(f.query, "SELECT 'a;b' AS x FROM t");
        }
        // A statement that does not parse fails the whole script, naming it.
        let e = parse_script("SELECT 1; SELEC 2", Dialect::Generic).unwrap_err();
        assert!(e.to_string().contains("SELEC"), "{e}");
        assert!(parse_script("  ; -- nothing\n", Dialect::Generic)
            .unwrap()
            .is_empty());
        // A no-break space is a token, not whitespace: it stays in its
        // piece (and fails to parse) instead of leaving an empty statement.
        assert_eq!(split(" \u{a0};\t", Dialect::Postgres).unwrap(), ["\u{a0}"]);
        assert!(parse_script("\u{a0}", Dialect::Postgres).is_err());
    }

    #[test]
    fn tql_is_refused_by_name_in_queries_and_flows() {
        for sql in [
            "TQL EVAL (0, 10, '5s') avg by(sensor) (readings)",
            "tql explain (0, 10, '5s') readings",
            "CREATE FLOW f SINK TO s EVAL INTERVAL '1m' AS TQL EVAL (now() - '1m'::interval, \
             now(), '1m') avg by(sensor) (readings)",
        ] {
            let e = parse(sql).unwrap_err();
            assert!(
                matches!(e, crate::Error::Unsupported { .. }),
                "{sql}: {e:?}"
            );
            assert!(
                e.to_string().contains("TQL (PromQL) is not supported"),
                "{e}"
            );
        }
        // A table or column named tql is still a name.
        assert!(parse("SELECT tql FROM \"tql\"").is_ok());
    }

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
    fn component_statements() {
        let bytes = |s: &Stmt| match s {
            Stmt::CreateComponent {
                source: ComponentSource::Bytes(b),
                ..
            } => b.as_ref().clone(),
            other => panic!("{other:?}"),
        };
        let wasm = vec![0x00, 0x61, 0x73, 0x6d];
        for sql in [
            "CREATE COMPONENT c FROM '\\x0061736d'",
            "CREATE COMPONENT c FROM E'\\\\x0061736D'",
            "CREATE COMPONENT c FROM X'0061736d'",
            "CREATE COMPONENT c FROM decode('0061736d', 'hex')",
            "CREATE COMPONENT c FROM decode('AGFzbQ==', 'base64')",
        ] {
            let s = parse(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
            assert_eq!(bytes(&s[0]), wasm, "{sql}");
        }
        let s = parse("CREATE OR REPLACE COMPONENT db.c FROM $1").unwrap();
        assert!(matches!(
            &s[0],
            Stmt::CreateComponent { name, or_replace: true, source: ComponentSource::Param(1) }
                if name.database == "db" && name.table == "c"
        ));
        for bad in [
            "CREATE COMPONENT c FROM 'plain text'",
            "CREATE COMPONENT c FROM '\\xZZ'",
            "CREATE COMPONENT c FROM decode('00', 'rot13')",
            "CREATE COMPONENT c",
            "ALTER FLOW f SET COMPONENT VERSION 0",
            "ALTER FLOW f RENAME TO g",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let s = parse(
            "DROP COMPONENT IF EXISTS c; SHOW COMPONENTS LIKE 'c%'; \
             ALTER FLOW f SET COMPONENT VERSION 2",
        )
        .unwrap();
        assert!(matches!(
            &s[0],
            Stmt::DropComponent {
                if_exists: true,
                ..
            }
        ));
        assert!(matches!(&s[1], Stmt::ShowComponents { like: Some(p), .. } if p == "c%"));
        assert!(matches!(&s[2], Stmt::AlterFlowComponent { name, version: 2 } if name == "f"));
        let s = parse(
            "CREATE FLOW f SINK TO o USING COMPONENT other.c WITH (backfill = 'false') \
             AS SELECT x FROM t",
        )
        .unwrap();
        let Stmt::CreateFlow(f) = &s[0] else { panic!() };
        let c = f.component.as_ref().unwrap();
        assert_eq!(
            (c.name.database.as_str(), c.name.table.as_str()),
            ("other", "c")
        );
        assert_eq!(
            f.options,
            vec![("backfill".to_string(), "false".to_string())]
        );
    }

    #[test]
    fn greptime_values_lists() {
        let one = |sql: &str, dialect: Dialect| -> String {
            match parse_dialect(sql, dialect).unwrap().as_slice() {
                [Stmt::Query(q)] => q.to_string(),
                other => panic!("{other:?}"),
            }
        };
        for dialect in [Dialect::Generic, Dialect::Postgres] {
            assert_eq!(
                one(
                    "INSERT INTO \"T\" (\"c\", d) VALUES (20, \"2021-07-01 00:00:00.200\"), (\"x\" , 1 ,)",
                    dialect
                ),
                "INSERT INTO \"T\" (\"c\", d) VALUES (20, '2021-07-01 00:00:00.200'), ('x', 1)"
            );
            // Nested in an expression, in a query, after the rows: identifiers.
            assert_eq!(
                one("INSERT INTO t VALUES (upper(\"a\"), \"b\" || 'c')", dialect),
                "INSERT INTO t VALUES (upper(\"a\"), \"b\" || 'c')"
            );
            assert_eq!(
                one("INSERT INTO t SELECT \"a\", 1 FROM u", dialect),
                "INSERT INTO t SELECT \"a\", 1 FROM u"
            );
            assert_eq!(
                one("SELECT * FROM (VALUES (\"a\", 1)) AS v", dialect),
                "SELECT * FROM (VALUES (\"a\", 1)) AS v"
            );
            // A trailing comma only inside a row of the VALUES list.
            assert!(parse_dialect("SELECT f(1,) FROM t", dialect).is_err());
            assert!(parse_dialect("INSERT INTO t VALUES (f(1,))", dialect).is_err());
            assert!(parse_dialect("INSERT INTO t VALUES (1),", dialect).is_err());
            // Each statement of a script on its own.
            let script = parse_script(
                "INSERT INTO t VALUES (\"a\",); SELECT \"a\" FROM t",
                dialect,
            )
            .unwrap();
            assert_eq!(script.len(), 2);
            assert!(
                matches!(&script[1].1, Stmt::Query(q) if q.to_string() == "SELECT \"a\" FROM t")
            );
        }
        // EXPLAIN INSERT reads its rows the same way.
        assert_eq!(
            one("EXPLAIN INSERT INTO t VALUES (\"a\",)", Dialect::Generic),
            "EXPLAIN INSERT INTO t VALUES ('a')"
        );
    }

    #[test]
    fn eval_interval() {
        // GreptimeDB's order: EXPIRE AFTER, EVAL INTERVAL, COMMENT, WITH.
        let s = parse(
            "CREATE FLOW f SINK TO o EXPIRE AFTER INTERVAL '1' HOUR EVAL INTERVAL '1m' \
             COMMENT 'c' WITH (backfill = 'false') AS SELECT x FROM t",
        )
        .unwrap();
        let Stmt::CreateFlow(f) = &s[0] else { panic!() };
        assert_eq!(f.expire_after.as_deref(), Some("1 HOUR"));
        assert_eq!(f.eval_interval.as_deref(), Some("1m"));
        assert_eq!(f.comment.as_deref(), Some("c"));
        assert_eq!(f.query, "SELECT x FROM t");
        // INTERVAL '...' after EVAL INTERVAL's own INTERVAL, and a unit word.
        let s = parse("CREATE FLOW f SINK TO o EXPIRE AFTER INTERVAL '5 minutes' EVAL INTERVAL INTERVAL '30' SECOND AS SELECT x FROM t").unwrap();
        let Stmt::CreateFlow(f) = &s[0] else { panic!() };
        assert_eq!(f.expire_after.as_deref(), Some("5 minutes"));
        assert_eq!(f.eval_interval.as_deref(), Some("30 SECOND"));
        let Stmt::CreateFlow(f) = &parse("CREATE FLOW f SINK TO o AS SELECT x FROM t").unwrap()[0]
        else {
            panic!()
        };
        assert_eq!(f.eval_interval, None);
        let e = parse("CREATE FLOW f SINK TO o EVAL INTERVAL AS SELECT x FROM t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("EVAL INTERVAL"), "{e}");
    }

    fn guard_message(sql: &str) -> String {
        match check_nesting_tokens(&tokenize(&GenericDialect {}, sql).unwrap(), Reader::Generic) {
            Ok(()) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn nesting_guard_refuses_what_the_parser_would_backtrack_on() {
        let over = format!("at most {MAX_BACKTRACKING_NESTING} are allowed");
        for open in [
            "CASE WHEN 1 THEN ",
            "ARRAY[",
            "CAST(",
            "SUBSTRING(",
            "1 + CASE WHEN 1 THEN ",
        ] {
            let sql = format!("SELECT {}1", open.repeat(24));
            let e = parse(&sql).unwrap_err().to_string();
            assert!(
                e.contains("nests CASE, CAST(, subqueries and similar expressions 24 levels deep"),
                "{sql}: {e}"
            );
            assert!(e.contains(&over), "{e}");
            // Closed or not, the limit is the same.
            let sql = format!("SELECT {}1{}", open.repeat(13), ")".repeat(13));
            assert!(guard_message(&sql).contains(&over), "{sql}");
            let sql = format!("SELECT {}1", open.repeat(MAX_BACKTRACKING_NESTING));
            assert_eq!(guard_message(&sql), "", "{sql}");
        }
        // POSITION( triples the time per level: it counts twice.
        assert!(guard_message(&format!("SELECT {}1", "POSITION(".repeat(7))).contains(&over));
        assert_eq!(
            guard_message(&format!("SELECT {}1", "POSITION(".repeat(6))),
            ""
        );
        // Siblings do not add up.
        let sibling = "CAST(CAST(CAST(1 AS INT) AS INT) AS INT)";
        let sql = format!("SELECT {}", vec![sibling; 40].join(" + "));
        assert!(parse(&sql).is_ok(), "{sql}");
    }

    #[test]
    fn nesting_guard_counts_only_nesting_the_parser_sees() {
        // CASE chains in ELSE (and CASE in WHEN) fail fast: deep chains are fine.
        let chain = format!(
            "SELECT {} 0 {} FROM t",
            "CASE WHEN x = 1 THEN 1 ELSE ".repeat(20),
            "END ".repeat(20)
        );
        assert_eq!(guard_message(&chain), "");
        assert!(parse(&chain).is_ok(), "{chain}");
        // Parentheses, strings, quoted identifiers and comments.
        let sql = "SELECT ((((((((((((((((1)))))))))))))))) AS \"CASE(CAST(\", \
                   'CASE WHEN ARRAY[CAST((((' -- CAST(CAST(CAST(CAST(CAST(CAST(CAST(\n\
                   FROM t /* CASE CASE CASE CASE CASE CASE CASE CASE CASE CASE CASE CASE CASE */";
        assert_eq!(guard_message(sql), "");
        assert!(parse(sql).is_ok());
        let deep = format!("SELECT {}1{}", "(".repeat(65), ")".repeat(65));
        let e = parse(&deep).unwrap_err().to_string();
        assert_eq!(
            e,
            "statement nests expressions 65 levels deep; at most 64 are allowed"
        );
        // Unbalanced closers do not underflow anything ...
        assert_eq!(guard_message("SELECT 1)))]]]}}} END END"), "");
        // ... and close only what they match: END as a name does not end a CASE.
        let sql = format!(
            "SELECT CASE WHEN 1 THEN f(END - {}1",
            "CAST(".repeat(MAX_BACKTRACKING_NESTING)
        );
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        // Derived tables and nested joins are tried as one, then as the other.
        let sql = format!("SELECT 1 FROM {}t", "(SELECT 1 FROM t, ".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        let sql = format!("SELECT 1 FROM {}t", "(".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        // INTERVAL and NOT before a sign read the next expression twice.
        let sql = format!("SELECT {}1", "INTERVAL -f(".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        let sql = format!("SELECT {}1", "NOT -f(".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        // The generic dialect reads `name := value` arguments twice.
        let sql = format!("SELECT {}1", "f(x := ".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
        // CURRENT_TIMESTAMP( and friends are read twice too.
        let sql = format!("SELECT {}1", "CURRENT_TIMESTAMP(".repeat(13));
        assert!(guard_message(&sql).contains("at most"), "{sql}");
    }

    #[test]
    fn nesting_guard_for_the_postgresql_dialect() {
        // Its parser reads every function argument twice: each call is a level.
        let calls = |n: usize| format!("SELECT {}x{}", "f(".repeat(n), ")".repeat(n));
        assert!(check_nesting(&calls(MAX_BACKTRACKING_NESTING)).is_ok());
        let e = check_nesting(&calls(13)).unwrap_err().to_string();
        assert!(e.contains("13 levels deep"), "{e}");
        assert_eq!(
            guard_message(&calls(40)),
            "",
            "linear in the generic dialect"
        );
        // CAST( triples the time there, POSITION( more than quintuples it.
        assert!(check_nesting(&format!("SELECT {}1", "CAST(".repeat(6))).is_ok());
        assert!(check_nesting(&format!("SELECT {}1", "CAST(".repeat(7))).is_err());
        assert!(check_nesting(&format!("SELECT {}1", "POSITION(".repeat(4))).is_ok());
        assert!(check_nesting(&format!("SELECT {}1", "POSITION(".repeat(5))).is_err());
        // Parentheses that are not calls do not count.
        let sql = format!(
            "SELECT * FROM t WHERE {} x IN (1) {}",
            "EXISTS (SELECT 1 FROM u WHERE x AND (".repeat(8),
            "))".repeat(8)
        );
        assert!(check_nesting(&sql).is_ok(), "{sql}");
        // ... but a keyword in the place of an operand is a function name there.
        let sql = format!("SELECT {}1", "and(".repeat(13));
        assert!(check_nesting(&sql).is_err(), "{sql}");
        // A subquery after IN is tried as a list first: two levels there, one here.
        let sql = format!(
            "SELECT 1 WHERE {}",
            "x IN (SELECT y FROM t WHERE ".repeat(7)
        );
        assert!(check_nesting(&sql).is_err(), "{sql}");
        assert_eq!(guard_message(&sql), "", "{sql}");
        // The PostgreSQL front door's check reads dollar quoting.
        assert!(check_nesting(
            "SELECT $q$ CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST(CAST( $q$"
        )
        .is_ok());
        assert!(check_nesting(&format!("SELECT {}1", "CAST(".repeat(13))).is_err());
        assert!(check_nesting("SELECT 'unterminated").is_ok());
    }

    #[test]
    fn read_only_statements() {
        let read_only = |sql: &str| parse(sql).unwrap().iter().all(Stmt::is_read_only);
        for sql in [
            "SELECT 1",
            "select * from t where x in (select y from u)",
            "WITH a AS (SELECT 1 AS x) SELECT x FROM a",
            "VALUES (1), (2)",
            "SELECT 1 UNION ALL SELECT 2",
            "EXPLAIN SELECT 1",
            "EXPLAIN ANALYZE SELECT count(*) FROM t",
            "SHOW TABLES",
            "SHOW DATABASES",
            "SHOW CREATE TABLE t",
            "SHOW FLOWS",
            "SHOW CREATE FLOW f",
            "SHOW COLUMNS FROM t",
            "SHOW ALL",
            "DESC TABLE t",
            "DESCRIBE t",
            "SELECT 1; SHOW TABLES",
        ] {
            assert!(read_only(sql), "{sql}");
        }
        for sql in [
            "INSERT INTO t VALUES (1)",
            "DELETE FROM t",
            "UPDATE t SET x = 1",
            "DROP TABLE t",
            "CREATE TABLE t (ts TIMESTAMP TIME INDEX)",
            "CREATE DATABASE d",
            "DROP DATABASE d",
            "CREATE FLOW f SINK TO s AS SELECT 1",
            "DROP FLOW f",
            "ADMIN FLUSH_FLOW('f')",
            "SET datafusion.execution.batch_size = 1",
            "BEGIN",
            "COPY t TO '/tmp/x.csv'",
            "CREATE VIEW v AS SELECT 1",
            "SELECT * INTO t2 FROM t",
            "WITH a AS (SELECT 1) INSERT INTO t SELECT * FROM a",
            "EXPLAIN DELETE FROM t",
            "EXPLAIN ANALYZE INSERT INTO t VALUES (1)",
            "EXPLAIN INSERT INTO t VALUES (1)",
            "SELECT 1; DROP TABLE t",
        ] {
            assert!(!read_only(sql), "{sql}");
        }
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
