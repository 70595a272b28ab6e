//! Scenario files in the sqllogictest format (what sqllogictest-rs and
//! DataFusion use), each run against a fresh [`TestDatabase`]: `statement
//! ok`, `statement count N`, `statement error <regex>`, `query <types>
//! [nosort|rowsort|valuesort]` with `----` and the expected rows (values
//! separated by a space, `NULL`, `(empty)`), `control sortmode`, `halt`,
//! `skipif`/`onlyif sandflow`, and for time:
//!
//! - `sleep <duration>` (`5s`, `250ms`): virtual time moves forward; flows
//!   tick as they would have over that span; nothing waits;
//! - `control time <RFC 3339 or integer ms>`: sets the time (forward only);
//! - `control flush`: every flow catches up;
//! - `control restart` / `control crash`: the database closes cleanly / as
//!   a kill -9, and opens again on the same in-memory store.
//!
//! Records are parsed by the sqllogictest crate; the `control` records it
//! does not know split a file into the pieces it parses.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqllogictest::{
    Condition, Control, DefaultColumnType, ExpectedError, QueryExpect, Record, SortMode,
    StatementExpect,
};

use super::TestDatabase;
use crate::Output;

/// The label `skipif` / `onlyif` records name sandflow by.
pub const ENGINE_LABEL: &str = "sandflow";

/// How to run files.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Rewrite the expected rows of queries whose results differ, in place,
    /// leaving every other byte of the file as it was.
    pub override_results: bool,
    /// Where the flows' engines run (the wasm sandbox, or natively).
    pub engine: crate::flow::FlowEngine,
    /// The sandbox every file's database shares (the engine is compiled
    /// once); `None`: one per file.
    pub sandbox: Option<std::sync::Arc<crate::runtime::Sandbox>>,
}

/// One record that did not do what the file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The record's line (1-based).
    pub line: usize,
    /// What went wrong, with a diff of expected against actual for rows.
    pub message: String,
}

/// The outcome of one file.
#[derive(Debug, Clone)]
pub struct FileResult {
    pub path: PathBuf,
    /// The first mismatch (a file stops at it), or `None` if it passed.
    pub failure: Option<Mismatch>,
    /// Query results rewritten by `--override`.
    pub rewritten: usize,
    /// Real time taken.
    pub elapsed: Duration,
}

impl FileResult {
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }

    /// `PASS path (12 ms)`, or `FAIL path (12 ms)` then `path:line: message`.
    pub fn report(&self) -> String {
        let ms = self.elapsed.as_millis();
        let path = self.path.display();
        match &self.failure {
            None if self.rewritten > 0 => format!(
                "PASS {path} ({ms} ms; {} results rewritten)",
                self.rewritten
            ),
            None => format!("PASS {path} ({ms} ms)"),
            Some(m) => format!("FAIL {path} ({ms} ms)\n{path}:{}: {}", m.line, m.message),
        }
    }
}

/// The `.slt` files `paths` name: files as given, directories searched for
/// `*.slt`; sorted within each directory.
pub fn collect_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found)?;
            found.sort();
            out.extend(found);
        } else if p.exists() {
            out.push(p.clone());
        } else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: no such file or directory", p.display()),
            ));
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "slt") {
            out.push(path);
        }
    }
    Ok(())
}

/// A control record sandflow adds to the format.
#[derive(Debug, Clone, PartialEq)]
enum Ours {
    Time(String),
    Flush,
    Restart,
    Crash,
}

/// One piece of a file: records the crate parses, or one of ours.
enum Piece {
    Text { first_line: usize, text: String },
    Control { line: usize, control: Ours },
}

fn our_control(line: &str) -> Option<Ours> {
    let mut words = line.split_whitespace();
    if words.next() != Some("control") {
        return None;
    }
    let what = words.next()?;
    let rest: Vec<&str> = words.collect();
    match (what, rest.as_slice()) {
        ("time", [t]) => Some(Ours::Time(t.to_string())),
        ("flush", []) => Some(Ours::Flush),
        ("restart", []) => Some(Ours::Restart),
        ("crash", []) => Some(Ours::Crash),
        _ => None,
    }
}

/// Splits a file at our control records (only where a record may start:
/// the first line, or after a blank or comment line).
fn pieces(text: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut first_line = 1;
    let mut at_record_start = true;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let n = i + 1;
        let trimmed = line.trim();
        if at_record_start {
            if let Some(control) = our_control(trimmed) {
                if !current.is_empty() {
                    out.push(Piece::Text {
                        first_line,
                        text: std::mem::take(&mut current),
                    });
                }
                out.push(Piece::Control { line: n, control });
                first_line = n + 1;
                continue;
            }
        }
        if current.is_empty() {
            first_line = n;
        }
        current.push_str(line);
        at_record_start = trimmed.is_empty() || trimmed.starts_with('#');
    }
    if !current.is_empty() {
        out.push(Piece::Text {
            first_line,
            text: current,
        });
    }
    out
}

/// A time as `control time` takes it: integer milliseconds or RFC 3339.
fn parse_time(text: &str) -> Result<i64, String> {
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("control time {text}: not integer milliseconds nor an RFC 3339 time ({e})")
        })
}

/// Runs one file against a fresh database.
pub async fn run_file(path: &Path, options: &Options) -> FileResult {
    let started = Instant::now();
    let mut result = FileResult {
        path: path.to_path_buf(),
        failure: None,
        rewritten: 0,
        elapsed: Duration::ZERO,
    };
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let mut rewrites = Vec::new();
            result.failure = run_text(&text, &path.display().to_string(), options, &mut rewrites)
                .await
                .err();
            if options.override_results && !rewrites.is_empty() {
                let new = rewrite(&text, &rewrites);
                if let Err(e) = std::fs::write(path, new) {
                    result.failure = Some(Mismatch {
                        line: 1,
                        message: format!("cannot rewrite the file: {e}"),
                    });
                } else {
                    result.rewritten = rewrites.len();
                }
            }
        }
        Err(e) => {
            result.failure = Some(Mismatch {
                line: 1,
                message: format!("cannot read the file: {e}"),
            })
        }
    }
    result.elapsed = started.elapsed();
    result
}

/// A query whose expected rows are to be replaced: its line and its rows.
#[derive(Debug, Clone)]
struct Rewrite {
    line: usize,
    rows: Vec<String>,
}

/// Runs a file's text; the first mismatch ends it. With `override_results`,
/// queries whose rows differ are collected in `rewrites` instead.
async fn run_text(
    text: &str,
    name: &str,
    options: &Options,
    rewrites: &mut Vec<Rewrite>,
) -> Result<(), Mismatch> {
    let flows = crate::flow::FlowSettings {
        engine: options.engine,
        sandbox: options.sandbox.clone(),
        ..Default::default()
    };
    let mut t = TestDatabase::with_flows(flows)
        .await
        .map_err(|e| Mismatch {
            line: 1,
            message: format!("cannot open the test database: {e}"),
        })?;
    let labels: HashSet<String> = [ENGINE_LABEL.to_string()].into();
    let mut sort_mode: Option<SortMode> = None;
    for piece in pieces(text) {
        match piece {
            Piece::Control { line, control } => {
                let fail = |message: String| Mismatch { line, message };
                match control {
                    Ours::Time(when) => {
                        let ms = parse_time(&when).map_err(fail)?;
                        if ms < t.now_ms() {
                            return Err(fail(format!(
                                "control time {when}: time cannot go backwards (it is {} ms)",
                                t.now_ms()
                            )));
                        }
                        t.set_time(ms).await.map_err(|e| fail(e.to_string()))?;
                    }
                    Ours::Flush => t.flush().await.map_err(|e| fail(e.to_string()))?,
                    Ours::Restart => t.restart().await.map_err(|e| fail(e.to_string()))?,
                    Ours::Crash => t.crash().await.map_err(|e| fail(e.to_string()))?,
                }
            }
            Piece::Text { first_line, text } => {
                let records = sqllogictest::parse_with_name::<DefaultColumnType>(&text, name)
                    .map_err(|e| Mismatch {
                        line: first_line + e.location().line() as usize - 1,
                        message: format!("cannot parse: {}", e.kind()),
                    })?;
                for record in records {
                    let done = run_record(
                        &t,
                        record,
                        first_line,
                        &labels,
                        &mut sort_mode,
                        options,
                        rewrites,
                    )
                    .await?;
                    if done {
                        return Ok(());
                    }
                }
            }
        }
    }
    Ok(())
}

fn skipped(conditions: &[Condition], labels: &HashSet<String>) -> bool {
    conditions.iter().any(|c| match c {
        Condition::OnlyIf { label } => !labels.contains(label),
        Condition::SkipIf { label } => labels.contains(label),
    })
}

/// Runs one record; returns true at `halt`.
async fn run_record(
    t: &TestDatabase,
    record: Record<DefaultColumnType>,
    first_line: usize,
    labels: &HashSet<String>,
    sort_mode: &mut Option<SortMode>,
    options: &Options,
    rewrites: &mut Vec<Rewrite>,
) -> Result<bool, Mismatch> {
    let at = |loc: &sqllogictest::Location| first_line + loc.line() as usize - 1;
    match record {
        Record::Statement {
            loc,
            conditions,
            sql,
            expected,
            ..
        } => {
            if skipped(&conditions, labels) {
                return Ok(false);
            }
            let line = at(&loc);
            let fail = |message: String| Mismatch { line, message };
            let out = t.execute(&sql).await;
            match expected {
                StatementExpect::Error(e) => {
                    expect_error("statement", &e, out, &sql).map_err(fail)?
                }
                StatementExpect::Ok => {
                    out.map_err(|err| fail(format!("the statement failed: {err}\n    {sql}")))?;
                }
                StatementExpect::Count(n) => {
                    let out =
                        out.map_err(|err| fail(format!("the statement failed: {err}\n    {sql}")))?;
                    let got = match out.last() {
                        Some(Output::Affected { rows, .. }) => *rows,
                        Some(Output::Rows { batches, .. }) => {
                            batches.iter().map(|b| b.num_rows() as u64).sum()
                        }
                        None => 0,
                    };
                    if got != n {
                        return Err(fail(format!(
                            "statement count {n}: {got} rows were affected\n    {sql}"
                        )));
                    }
                }
            }
        }
        Record::Query {
            loc,
            conditions,
            sql,
            expected,
            ..
        } => {
            if skipped(&conditions, labels) {
                return Ok(false);
            }
            let line = at(&loc);
            let fail = |message: String| Mismatch { line, message };
            let out = t.query(&sql).await;
            match expected {
                QueryExpect::Error(e) => expect_error("query", &e, out, &sql).map_err(fail)?,
                QueryExpect::Results {
                    results,
                    sort_mode: own,
                    ..
                } => {
                    let rows =
                        out.map_err(|err| fail(format!("the query failed: {err}\n    {sql}")))?;
                    let actual = arrange(rows, own.as_ref().or(sort_mode.as_ref()));
                    let expected: Vec<String> = results.iter().map(|r| normalize(r)).collect();
                    if actual != expected {
                        if options.override_results {
                            rewrites.push(Rewrite { line, rows: actual });
                        } else {
                            return Err(fail(format!(
                                "query results differ (- expected, + actual):\n{}\n    {sql}",
                                diff(&expected, &actual)
                            )));
                        }
                    }
                }
            }
        }
        Record::Sleep { duration, .. } => {
            t.advance(duration).await.map_err(|e| Mismatch {
                line: first_line,
                message: format!("sleep: {e}"),
            })?;
        }
        Record::Control(Control::SortMode(mode)) => *sort_mode = Some(mode),
        Record::Halt { .. } => return Ok(true),
        Record::Include { loc, .. } | Record::System { loc, .. } => {
            return Err(Mismatch {
                line: at(&loc),
                message: "include and system records are not supported by sandflow test"
                    .to_string(),
            })
        }
        _ => {}
    }
    Ok(false)
}

/// Whether a statement or query (`what`) that expects error `e` failed so.
fn expect_error<T>(
    what: &str,
    e: &ExpectedError,
    out: crate::Result<T>,
    sql: &str,
) -> Result<(), String> {
    match out {
        Ok(_) => Err(format!(
            "the {what} succeeded, but an error was expected ({e})\n    {sql}"
        )),
        Err(err) => {
            let msg = err.to_string();
            if e.is_match(&msg, None) {
                Ok(())
            } else {
                Err(format!(
                    "the {what} failed, but not as expected:\n    expected: {e}\n    actual:   {msg}\n    {sql}"
                ))
            }
        }
    }
}

/// One value per space, as the expected rows are compared.
fn normalize(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rows as lines, in the order `mode` asks for.
fn arrange(rows: Vec<Vec<String>>, mode: Option<&SortMode>) -> Vec<String> {
    match mode {
        Some(SortMode::ValueSort) => {
            let mut values: Vec<String> = rows.into_iter().flatten().collect();
            values.sort();
            values
        }
        Some(SortMode::RowSort) => {
            let mut lines: Vec<String> = rows.iter().map(|r| normalize(&r.join(" "))).collect();
            lines.sort();
            lines
        }
        _ => rows.iter().map(|r| normalize(&r.join(" "))).collect(),
    }
}

/// A line diff of `expected` against `actual`.
fn diff(expected: &[String], actual: &[String]) -> String {
    let old = expected.join("\n");
    let new = actual.join("\n");
    let d = similar::TextDiff::from_lines(&old, &new);
    let mut out = String::new();
    for change in d.iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => "-",
            similar::ChangeTag::Insert => "+",
            similar::ChangeTag::Equal => " ",
        };
        out.push_str(&format!(
            "    {sign} {}",
            change.value().trim_end_matches('\n')
        ));
        out.push('\n');
    }
    out.trim_end().to_string()
}

/// `text` with the expected rows of each rewritten query replaced by its
/// actual rows; every other byte stays.
fn rewrite(text: &str, rewrites: &[Rewrite]) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let mut pending: Vec<&Rewrite> = rewrites.iter().collect();
    pending.sort_by_key(|r| r.line);
    let mut next = pending.into_iter().peekable();
    while i < lines.len() {
        let n = i + 1;
        match next.peek() {
            Some(r) if r.line == n => {
                let r = next.next().expect("peeked");
                // The record's header and SQL, up to `----` or a blank line.
                let mut j = i;
                while j < lines.len() && lines[j].trim() != "----" && !lines[j].trim().is_empty() {
                    out.push_str(lines[j]);
                    j += 1;
                }
                let had_results = j < lines.len() && lines[j].trim() == "----";
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push_str("----\n");
                for row in &r.rows {
                    out.push_str(row);
                    out.push('\n');
                }
                if had_results {
                    j += 1;
                    while j < lines.len() && !lines[j].trim().is_empty() {
                        j += 1;
                    }
                }
                i = j;
            }
            _ => {
                out.push_str(lines[i]);
                i += 1;
            }
        }
    }
    out
}

/// A JUnit XML report of `results` (one test case per file).
pub fn junit(results: &[FileResult]) -> String {
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let failures = results.iter().filter(|r| !r.passed()).count();
    let total: f64 = results.iter().map(|r| r.elapsed.as_secs_f64()).sum();
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites><testsuite name=\"sandflow test\" tests=\"{}\" failures=\"{failures}\" time=\"{total:.3}\">\n",
        results.len()
    ));
    for r in results {
        let name = esc(&r.path.display().to_string());
        out.push_str(&format!(
            "  <testcase name=\"{name}\" classname=\"slt\" time=\"{:.3}\">",
            r.elapsed.as_secs_f64()
        ));
        if let Some(m) = &r.failure {
            out.push_str(&format!(
                "<failure message=\"{}:{}\">{}</failure>",
                name,
                m.line,
                esc(&m.message)
            ));
        }
        out.push_str("</testcase>\n");
    }
    out.push_str("</testsuite></testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_at_our_controls_only_where_records_start() {
        let text = "statement ok\nSELECT 1\n\ncontrol time 5000\nsleep 1s\n\ncontrol flush\n";
        let p = pieces(text);
        assert_eq!(p.len(), 4);
        assert!(matches!(&p[1], Piece::Control { line: 4, control: Ours::Time(t) } if t == "5000"));
        assert!(matches!(&p[2], Piece::Text { first_line: 5, .. }));
        assert!(matches!(
            &p[3],
            Piece::Control {
                line: 7,
                control: Ours::Flush
            }
        ));
        // Inside a query's rows, "control flush" is a row.
        let text = "query T\nSELECT 'control flush'\n----\ncontrol flush\n";
        assert_eq!(pieces(text).len(), 1);
    }

    #[test]
    fn times_are_integers_or_rfc3339() {
        assert_eq!(parse_time("1500"), Ok(1500));
        assert_eq!(parse_time("1970-01-01T00:00:01.5Z"), Ok(1500));
        assert!(parse_time("tomorrow").is_err());
    }

    #[test]
    fn rewrite_replaces_only_the_rows() {
        let text = "# keep\nquery I\nSELECT 1\n----\n2\n\nstatement ok\nSELECT 1\n";
        let out = rewrite(
            text,
            &[Rewrite {
                line: 2,
                rows: vec!["1".into()],
            }],
        );
        assert_eq!(
            out,
            "# keep\nquery I\nSELECT 1\n----\n1\n\nstatement ok\nSELECT 1\n"
        );
        // A query without rows gets them.
        let text = "query I\nSELECT 1\n\n# end\n";
        let out = rewrite(
            text,
            &[Rewrite {
                line: 1,
                rows: vec!["1".into()],
            }],
        );
        assert_eq!(out, "query I\nSELECT 1\n----\n1\n\n# end\n");
    }
}
