//! Lexical helpers for the front doors: split a query string into statements,
//! decide which engine runs each one, and bind `$n` parameters as literals.
//!
//! These work on text rather than on a parsed AST because sandflow's own
//! statements (CREATE TABLE ... TIME INDEX, CREATE FLOW, ADMIN ...) are not
//! understood by the PostgreSQL parser of datafusion-postgres.

/// One lexical piece of SQL text that matters to the helpers below.
#[derive(Debug, PartialEq)]
enum Piece {
    /// Code outside quotes and comments, as a byte range.
    Code(usize, usize),
    /// A `$n` placeholder (1-based) at a byte range.
    Param(usize, usize, usize),
    /// A quoted string, quoted identifier or comment (left untouched).
    Opaque(usize, usize),
    /// A `;` at this byte offset.
    Semicolon(usize),
}

fn lex(sql: &str) -> Vec<Piece> {
    let b = sql.as_bytes();
    let n = b.len();
    let mut out = Vec::new();
    let mut i = 0;
    let mut code_start = 0;
    let flush = |out: &mut Vec<Piece>, start: usize, end: usize| {
        if end > start {
            out.push(Piece::Code(start, end));
        }
    };
    while i < n {
        let c = b[i];
        let start = i;
        let end = match c {
            b'\'' => {
                // E'..' strings allow backslash escapes.
                let escapes = i > 0
                    && (b[i - 1] == b'e' || b[i - 1] == b'E')
                    && (i < 2 || !is_ident_byte(b[i - 2]));
                let mut j = i + 1;
                loop {
                    if j >= n {
                        break n;
                    }
                    if escapes && b[j] == b'\\' {
                        j += 2;
                        continue;
                    }
                    if b[j] == b'\'' {
                        if j + 1 < n && b[j + 1] == b'\'' {
                            j += 2;
                            continue;
                        }
                        break j + 1;
                    }
                    j += 1;
                }
            }
            b'"' | b'`' => {
                let mut j = i + 1;
                loop {
                    if j >= n {
                        break n;
                    }
                    if b[j] == c {
                        if j + 1 < n && b[j + 1] == c {
                            j += 2;
                            continue;
                        }
                        break j + 1;
                    }
                    j += 1;
                }
            }
            b'-' if i + 1 < n && b[i + 1] == b'-' => match sql[i..].find('\n') {
                Some(p) => i + p + 1,
                None => n,
            },
            b'/' if i + 1 < n && b[i + 1] == b'*' => {
                let mut depth = 0usize;
                let mut j = i;
                loop {
                    if j + 1 >= n {
                        break n;
                    }
                    if b[j] == b'/' && b[j + 1] == b'*' {
                        depth += 1;
                        j += 2;
                    } else if b[j] == b'*' && b[j + 1] == b'/' {
                        depth -= 1;
                        j += 2;
                        if depth == 0 {
                            break j;
                        }
                    } else {
                        j += 1;
                    }
                }
            }
            b'$' => {
                // $n placeholder, or $tag$ ... $tag$ dollar quoting.
                let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
                let prev_ident = i > 0 && is_ident_byte(b[i - 1]);
                if digits > 0 && !prev_ident {
                    let num: usize = sql[i + 1..i + 1 + digits].parse().unwrap_or(0);
                    flush(&mut out, code_start, i);
                    out.push(Piece::Param(i, i + 1 + digits, num));
                    i += 1 + digits;
                    code_start = i;
                    continue;
                }
                let tag_len = b[i + 1..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
                    .count();
                if !prev_ident && i + 1 + tag_len < n && b[i + 1 + tag_len] == b'$' {
                    let tag = &sql[i..i + 2 + tag_len];
                    match sql[i + tag.len()..].find(tag) {
                        Some(p) => i + tag.len() + p + tag.len(),
                        None => n,
                    }
                } else {
                    i += 1;
                    continue;
                }
            }
            b';' => {
                flush(&mut out, code_start, i);
                out.push(Piece::Semicolon(i));
                i += 1;
                code_start = i;
                continue;
            }
            _ => {
                i += 1;
                continue;
            }
        };
        flush(&mut out, code_start, start);
        out.push(Piece::Opaque(start, end));
        i = end;
        code_start = i;
    }
    flush(&mut out, code_start, n);
    out
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80
}

/// Splits `sql` at top-level semicolons, dropping empty statements (only
/// whitespace or comments). Statements keep their text as written.
pub fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut has_code = false;
    for p in lex(sql) {
        match p {
            Piece::Semicolon(at) => {
                if has_code {
                    out.push(sql[start..at].trim().to_string());
                }
                start = at + 1;
                has_code = false;
            }
            Piece::Code(s, e) => has_code |= !sql[s..e].trim().is_empty(),
            Piece::Param(..) => has_code = true,
            Piece::Opaque(s, _) => {
                has_code |= !sql[s..].starts_with("--") && !sql[s..].starts_with("/*")
            }
        }
    }
    if has_code {
        out.push(sql[start..].trim().to_string());
    }
    out
}

/// The highest `$n` placeholder in `sql` (0 when there is none).
pub fn param_count(sql: &str) -> usize {
    lex(sql)
        .iter()
        .filter_map(|p| match p {
            Piece::Param(_, _, n) => Some(*n),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// Replaces every `$n` outside quotes and comments with `literals[n-1]`.
pub fn bind_params(sql: &str, literals: &[String]) -> Result<String, String> {
    let mut out = String::with_capacity(sql.len());
    let mut last = 0;
    for p in lex(sql) {
        if let Piece::Param(s, e, n) = p {
            let lit = n
                .checked_sub(1)
                .and_then(|i| literals.get(i))
                .ok_or_else(|| {
                    format!(
                        "statement uses parameter ${n} but only {} were bound",
                        literals.len()
                    )
                })?;
            out.push_str(&sql[last..s]);
            out.push_str(lit);
            last = e;
        }
    }
    out.push_str(&sql[last..]);
    Ok(out)
}

/// The first `n` words of the statement's code, upper-cased, skipping
/// comments and leading parentheses.
pub fn leading_words(sql: &str, n: usize) -> Vec<String> {
    let mut words = Vec::new();
    for p in lex(sql) {
        match p {
            Piece::Code(s, e) => {
                for w in sql[s..e]
                    .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .filter(|w| !w.is_empty())
                {
                    words.push(w.to_ascii_uppercase());
                    if words.len() >= n {
                        return words;
                    }
                }
            }
            Piece::Opaque(s, _) if sql[s..].starts_with("--") || sql[s..].starts_with("/*") => {}
            // A quoted identifier or string ends the keyword prefix.
            _ => return words,
        }
    }
    words
}

/// Which engine runs a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `Database::execute`: sandflow's own statements and everything that
    /// writes or changes the catalog.
    Database { returns_rows: bool },
    /// datafusion-postgres: queries, pg_catalog, SET/SHOW variables,
    /// transactions, cursors. Queries that DataFusion cannot plan fall back
    /// to the database.
    DataFusion,
}

/// Decides by the leading keywords; see [`Route`].
pub fn route(sql: &str) -> Route {
    let w = leading_words(sql, 3);
    let w: Vec<&str> = w.iter().map(String::as_str).collect();
    let db = |rows: bool| Route::Database { returns_rows: rows };
    match w.as_slice() {
        ["CREATE" | "DROP" | "ALTER" | "TRUNCATE", ..] => db(false),
        ["INSERT" | "DELETE" | "UPDATE" | "REPLACE" | "UPSERT", ..] => db(false),
        ["ADMIN", ..] => db(true),
        ["DESC" | "DESCRIBE", ..] => db(true),
        ["TQL", ..] => db(true),
        ["SHOW", "TABLES" | "FLOWS" | "CREATE" | "DATABASES" | "SCHEMAS" | "COLUMNS" | "FULL" | "INDEX"
        | "VIEWS" | "TABLE" | "FLOW" | "REGIONS", ..] => db(true),
        _ => Route::DataFusion,
    }
}

/// Whether a DataFusion-routed statement is a read-only query that may be
/// retried through the database when DataFusion cannot plan it.
pub fn is_query(sql: &str) -> bool {
    matches!(
        leading_words(sql, 1).first().map(String::as_str),
        Some("SELECT" | "WITH" | "VALUES" | "EXPLAIN" | "TABLE")
    )
}

/// Session statements that datafusion-postgres handles itself (its hooks):
/// their errors are final, never retried through the database.
pub fn is_session_statement(sql: &str) -> bool {
    matches!(
        leading_words(sql, 1).first().map(String::as_str),
        Some(
            "SET"
                | "SHOW"
                | "RESET"
                | "BEGIN"
                | "START"
                | "COMMIT"
                | "END"
                | "ROLLBACK"
                | "ABORT"
                | "SAVEPOINT"
                | "RELEASE"
                | "DECLARE"
                | "FETCH"
                | "MOVE"
                | "CLOSE"
                | "DISCARD"
                | "DEALLOCATE"
                | "PREPARE"
                | "EXECUTE"
                | "LISTEN"
                | "UNLISTEN"
                | "NOTIFY"
        )
    )
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

/// `"ident"` with quotes doubled.
pub fn quote_ident(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' {
            out.push('"');
        }
        out.push(c);
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_outside_quotes_and_comments() {
        let s = split_statements(
            "CREATE TABLE t (a STRING DEFAULT 'x;y', ts TIMESTAMP TIME INDEX); -- c;\n\
             INSERT INTO \"we;ird\" VALUES ($$a;b$$, E'\\';', 1);;  /* x; */ ",
        );
        assert_eq!(s.len(), 2, "{s:?}");
        assert!(s[0].starts_with("CREATE TABLE"));
        assert!(s[1].starts_with("-- c;\nINSERT"), "{s:?}");
        assert!(split_statements("  ; -- nothing\n").is_empty());
    }

    #[test]
    fn binds_params() {
        let sql = "INSERT INTO t VALUES ($1, '$2', $2) -- $3";
        assert_eq!(param_count(sql), 2);
        let out = bind_params(sql, &["1".into(), "'a'".into()]).unwrap();
        assert_eq!(out, "INSERT INTO t VALUES (1, '$2', 'a') -- $3");
        assert!(bind_params(sql, &["1".into()]).is_err());
    }

    #[test]
    fn routes() {
        assert_eq!(
            route("create table t (ts timestamp time index)"),
            Route::Database {
                returns_rows: false
            }
        );
        assert_eq!(
            route("/* hi */ SHOW TABLES"),
            Route::Database { returns_rows: true }
        );
        assert_eq!(route("SHOW search_path"), Route::DataFusion);
        assert_eq!(route("SELECT 1"), Route::DataFusion);
        assert_eq!(
            route("desc table t"),
            Route::Database { returns_rows: true }
        );
        assert!(is_query("(SELECT 1)"));
        assert!(!is_query("SET x = 1"));
    }

    #[test]
    fn quotes() {
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
