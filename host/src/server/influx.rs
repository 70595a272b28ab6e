//! InfluxDB line protocol: parsing and translation into sandflow SQL.
//!
//! `measurement[,tag=v...] field=v[,field=v...] [timestamp]`; tags become
//! STRING primary-key columns, fields typed columns (`1i` BIGINT, `1u` BIGINT
//! UNSIGNED, `1.5` DOUBLE, `"s"` STRING, `t`/`false` BOOLEAN) and the
//! timestamp the `ts` time index.

use std::collections::BTreeMap;
use std::fmt;

use crate::server::sqltext::{quote_ident, quote_literal};

/// The name of the time-index column of auto-created tables.
pub const TIME_INDEX: &str = "ts";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Nanos,
    Micros,
    Millis,
    Seconds,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Precision> {
        Some(match s {
            "ns" | "n" => Precision::Nanos,
            "us" | "u" | "µs" => Precision::Micros,
            "ms" => Precision::Millis,
            "s" => Precision::Seconds,
            _ => return None,
        })
    }

    /// The time-index type of a table created by a write at this precision.
    pub fn sql_type(self) -> &'static str {
        match self {
            Precision::Nanos => "TIMESTAMP(9)",
            Precision::Micros => "TIMESTAMP(6)",
            Precision::Millis => "TIMESTAMP(3)",
            Precision::Seconds => "TIMESTAMP(0)",
        }
    }

    fn nanos_per_unit(self) -> i64 {
        match self {
            Precision::Nanos => 1,
            Precision::Micros => 1_000,
            Precision::Millis => 1_000_000,
            Precision::Seconds => 1_000_000_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bool(bool),
}

impl FieldValue {
    fn sql_type(&self) -> &'static str {
        match self {
            FieldValue::Int(_) => "BIGINT",
            FieldValue::UInt(_) => "BIGINT UNSIGNED",
            FieldValue::Float(_) => "DOUBLE",
            FieldValue::Str(_) => "STRING",
            FieldValue::Bool(_) => "BOOLEAN",
        }
    }

    fn literal(&self) -> String {
        match self {
            FieldValue::Int(v) => v.to_string(),
            FieldValue::UInt(v) => v.to_string(),
            FieldValue::Float(v) => format!("{v:?}"),
            FieldValue::Str(s) => quote_literal(s),
            FieldValue::Bool(b) => if *b { "TRUE" } else { "FALSE" }.to_string(),
        }
    }
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub measurement: String,
    pub tags: Vec<(String, String)>,
    pub fields: Vec<(String, FieldValue)>,
    /// In the request's precision; `None` means "now".
    pub timestamp: Option<i64>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Parses a whole body; the first malformed line fails it all.
pub fn parse(body: &str) -> Result<Vec<Point>, LineError> {
    let mut points = Vec::new();
    for (i, raw) in body.split('\n').enumerate() {
        let line = raw.trim_end_matches('\r').trim_start();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        points.push(parse_line(line).map_err(|message| LineError {
            line: i + 1,
            message,
        })?);
    }
    Ok(points)
}

/// Splits at unescaped `sep` outside double quotes.
fn split_unescaped(s: &str, sep: char, respect_quotes: bool) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' if respect_quotes => in_quotes = !in_quotes,
            c if c == sep && !in_quotes => {
                out.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn first_unescaped_space(s: &str, respect_quotes: bool) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' if respect_quotes => in_quotes = !in_quotes,
            ' ' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Removes backslashes before the given special characters (and before a
/// backslash); other backslashes stay literal, as in InfluxDB.
fn unescape(s: &str, specials: &[char]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(&n) = chars.peek() {
                if specials.contains(&n) || n == '\\' {
                    out.push(n);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

fn parse_line(line: &str) -> Result<Point, String> {
    // The series (measurement and tags) ends at the first unescaped space;
    // quotes are literal there. The fields end at the first unescaped space
    // outside a quoted string value.
    let series_end = first_unescaped_space(line, false).ok_or("missing fields")?;
    let series = &line[..series_end];
    let rest = line[series_end..].trim_start_matches(' ');
    let (fields, ts) = match first_unescaped_space(rest, true) {
        None => (rest, None),
        Some(end) => {
            let ts = rest[end..].trim_matches(' ');
            if ts.contains(' ') {
                return Err("too many space-separated sections (unescaped space?)".into());
            }
            (&rest[..end], if ts.is_empty() { None } else { Some(ts) })
        }
    };
    if fields.is_empty() {
        return Err("missing fields".into());
    }

    let mut parts = split_unescaped(series, ',', false).into_iter();
    let measurement = unescape(parts.next().unwrap_or(""), &[',', ' ']);
    if measurement.is_empty() {
        return Err("missing measurement".into());
    }
    let mut tags = Vec::new();
    for tag in parts {
        let kv = split_unescaped(tag, '=', false);
        let [k, v] = kv.as_slice() else {
            return Err(format!("invalid tag {tag:?}: expected key=value"));
        };
        let (k, v) = (unescape(k, &[',', '=', ' ']), unescape(v, &[',', '=', ' ']));
        if k.is_empty() || v.is_empty() {
            return Err(format!("invalid tag {tag:?}: empty key or value"));
        }
        if tags.iter().any(|(t, _): &(String, String)| *t == k) {
            return Err(format!("duplicate tag {k:?}"));
        }
        tags.push((k, v));
    }

    let mut out_fields: Vec<(String, FieldValue)> = Vec::new();
    for field in split_unescaped(fields, ',', true) {
        // The key ends at the first unescaped '='.
        let mut split_at = None;
        let mut escaped = false;
        for (i, c) in field.char_indices() {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '=' {
                split_at = Some(i);
                break;
            }
        }
        let Some(at) = split_at else {
            return Err(format!("invalid field {field:?}: expected key=value"));
        };
        let key = unescape(&field[..at], &[',', '=', ' ']);
        if key.is_empty() {
            return Err(format!("invalid field {field:?}: empty key"));
        }
        let value = parse_field_value(&field[at + 1..])
            .map_err(|m| format!("invalid value for field {key:?}: {m}"))?;
        if out_fields.iter().any(|(k, _)| *k == key) {
            return Err(format!("duplicate field {key:?}"));
        }
        out_fields.push((key, value));
    }
    if out_fields.is_empty() {
        return Err("missing fields".into());
    }
    let timestamp = match ts {
        None => None,
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("invalid timestamp {t:?}"))?,
        ),
    };
    Ok(Point {
        measurement,
        tags,
        fields: out_fields,
        timestamp,
    })
}

fn parse_field_value(v: &str) -> Result<FieldValue, String> {
    if v.is_empty() {
        return Err("empty".into());
    }
    if let Some(rest) = v.strip_prefix('"') {
        let Some(inner) = rest.strip_suffix('"') else {
            return Err("unterminated string".into());
        };
        if inner.ends_with('\\') && !inner.ends_with("\\\\") {
            return Err("unterminated string".into());
        }
        return Ok(FieldValue::Str(unescape(inner, &['"'])));
    }
    match v {
        "t" | "T" | "true" | "True" | "TRUE" => return Ok(FieldValue::Bool(true)),
        "f" | "F" | "false" | "False" | "FALSE" => return Ok(FieldValue::Bool(false)),
        _ => {}
    }
    if let Some(n) = v.strip_suffix('i') {
        return n
            .parse::<i64>()
            .map(FieldValue::Int)
            .map_err(|_| format!("invalid integer {v:?}"));
    }
    if let Some(n) = v.strip_suffix('u') {
        return n
            .parse::<u64>()
            .map(FieldValue::UInt)
            .map_err(|_| format!("invalid unsigned integer {v:?}"));
    }
    let valid_chars = v
        .chars()
        .all(|c| c.is_ascii_digit() || matches!(c, '.' | '-' | '+' | 'e' | 'E'));
    match v.parse::<f64>() {
        Ok(f) if valid_chars && f.is_finite() => Ok(FieldValue::Float(f)),
        _ => Err(format!("invalid number {v:?}")),
    }
}

/// Renders nanoseconds since the epoch as an ISO-8601 UTC literal (readable
/// into a time index of any precision).
fn ts_literal(nanos: i64) -> Result<String, String> {
    let secs = nanos.div_euclid(1_000_000_000);
    let sub = nanos.rem_euclid(1_000_000_000) as u32;
    let dt = chrono::DateTime::from_timestamp(secs, sub).ok_or("timestamp out of range")?;
    Ok(quote_literal(
        &dt.naive_utc().format("%Y-%m-%dT%H:%M:%S%.9f").to_string(),
    ))
}

/// Refuses a write that names a tag or field its measurement's existing table
/// lacks (`columns` gives an existing table's column names): tables cannot
/// gain columns yet, and the INSERT would fail with a bare schema error.
pub fn check_columns(
    points: &[Point],
    columns: impl Fn(&str) -> Option<Vec<String>>,
) -> Result<(), String> {
    let mut seen: BTreeMap<&str, Option<Vec<String>>> = BTreeMap::new();
    for p in points {
        let existing = seen
            .entry(p.measurement.as_str())
            .or_insert_with(|| columns(&p.measurement));
        let Some(existing) = existing else { continue };
        let names = p
            .tags
            .iter()
            .map(|(k, _)| k)
            .chain(p.fields.iter().map(|(k, _)| k));
        let missing: Vec<&String> = names.filter(|k| !existing.contains(k)).collect();
        if !missing.is_empty() {
            return Err(format!(
                "table {:?} has no column{} {}; sandflow cannot add columns to an existing \
                 table yet (its columns: {}). Write the point without {}, or to a new \
                 measurement",
                p.measurement,
                if missing.len() == 1 { "" } else { "s" },
                missing
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                existing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            ));
        }
    }
    Ok(())
}

/// The SQL for a write: per measurement one `CREATE TABLE IF NOT EXISTS` and
/// one multi-row `INSERT`. `now_nanos` stamps points without a timestamp.
/// With a `database` other than `public`, that database is created if needed
/// and the tables live in it.
pub fn to_sql(
    points: &[Point],
    precision: Precision,
    now_nanos: i64,
    database: Option<&str>,
) -> Result<Vec<String>, String> {
    let database = database.filter(|d| !d.is_empty() && *d != "public");
    let table_name = |name: &str| match database {
        Some(db) => format!("{}.{}", quote_ident(db), quote_ident(name)),
        None => quote_ident(name),
    };
    struct Table<'a> {
        tags: Vec<&'a str>,
        fields: BTreeMap<&'a str, &'static str>,
        field_order: Vec<&'a str>,
        points: Vec<&'a Point>,
    }
    let mut tables: BTreeMap<&str, Table> = BTreeMap::new();
    for p in points {
        let t = tables
            .entry(p.measurement.as_str())
            .or_insert_with(|| Table {
                tags: Vec::new(),
                fields: BTreeMap::new(),
                field_order: Vec::new(),
                points: Vec::new(),
            });
        for (k, _) in &p.tags {
            if k == TIME_INDEX {
                return Err(format!(
                    "tag name {TIME_INDEX:?} is reserved for the time index"
                ));
            }
            if !t.tags.contains(&k.as_str()) {
                t.tags.push(k);
            }
        }
        for (k, v) in &p.fields {
            if k == TIME_INDEX {
                return Err(format!(
                    "field name {TIME_INDEX:?} is reserved for the time index"
                ));
            }
            match t.fields.get(k.as_str()) {
                Some(ty) if *ty != v.sql_type() => {
                    return Err(format!(
                        "field {k:?} of {:?} has type {} in one line and {} in another",
                        p.measurement,
                        ty,
                        v.sql_type()
                    ))
                }
                Some(_) => {}
                None => {
                    t.fields.insert(k, v.sql_type());
                    t.field_order.push(k);
                }
            }
        }
        t.points.push(p);
    }
    let mut sql = Vec::new();
    if let Some(db) = database {
        sql.push(format!("CREATE DATABASE IF NOT EXISTS {}", quote_ident(db)));
    }
    for (name, t) in &tables {
        if let Some(dup) = t.tags.iter().find(|k| t.fields.contains_key(**k)) {
            return Err(format!("{dup:?} is both a tag and a field of {name:?}"));
        }
        let mut cols: Vec<String> = t
            .tags
            .iter()
            .map(|k| format!("{} STRING", quote_ident(k)))
            .collect();
        cols.extend(
            t.field_order
                .iter()
                .map(|k| format!("{} {}", quote_ident(k), t.fields[k])),
        );
        cols.push(format!(
            "{} {} TIME INDEX",
            quote_ident(TIME_INDEX),
            precision.sql_type()
        ));
        if !t.tags.is_empty() {
            let pk: Vec<String> = t.tags.iter().map(|k| quote_ident(k)).collect();
            cols.push(format!("PRIMARY KEY ({})", pk.join(", ")));
        }
        sql.push(format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            table_name(name),
            cols.join(", ")
        ));

        let mut names: Vec<String> = t.tags.iter().map(|k| quote_ident(k)).collect();
        names.extend(t.field_order.iter().map(|k| quote_ident(k)));
        names.push(quote_ident(TIME_INDEX));
        let mut rows = Vec::with_capacity(t.points.len());
        for p in &t.points {
            let mut vals: Vec<String> = Vec::with_capacity(names.len());
            for k in &t.tags {
                vals.push(match p.tags.iter().find(|(n, _)| n == k) {
                    Some((_, v)) => quote_literal(v),
                    None => "NULL".into(),
                });
            }
            for k in &t.field_order {
                vals.push(match p.fields.iter().find(|(n, _)| n == k) {
                    Some((_, v)) => v.literal(),
                    None => "NULL".into(),
                });
            }
            let nanos = match p.timestamp {
                Some(ts) => ts
                    .checked_mul(precision.nanos_per_unit())
                    .ok_or_else(|| format!("timestamp {ts} out of range"))?,
                None => now_nanos,
            };
            vals.push(ts_literal(nanos)?);
            rows.push(format!("({})", vals.join(", ")));
        }
        sql.push(format!(
            "INSERT INTO {} ({}) VALUES {}",
            table_name(name),
            names.join(", "),
            rows.join(", ")
        ));
    }
    Ok(sql)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_types_and_escapes() {
        let pts = parse(
            "# comment\n\
             cpu\\,x,host=a\\ b,region=us\\=w usage=1.5,n=3i,u=4u,s=\"say \\\"hi\\\", ok\",b=t 1700000000000000000\n\
             \n\
             mem free=2\r\n",
        )
        .unwrap();
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[0].measurement, "cpu,x");
        assert_eq!(
            pts[0].tags,
            vec![
                ("host".into(), "a b".into()),
                ("region".into(), "us=w".into())
            ]
        );
        assert_eq!(pts[0].fields[0], ("usage".into(), FieldValue::Float(1.5)));
        assert_eq!(pts[0].fields[1].1, FieldValue::Int(3));
        assert_eq!(pts[0].fields[2].1, FieldValue::UInt(4));
        assert_eq!(pts[0].fields[3].1, FieldValue::Str("say \"hi\", ok".into()));
        assert_eq!(pts[0].fields[4].1, FieldValue::Bool(true));
        assert_eq!(pts[0].timestamp, Some(1_700_000_000_000_000_000));
        assert_eq!(pts[1].timestamp, None);
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "cpu",
            "cpu value",
            "cpu value=",
            "cpu value=abc",
            "cpu value=1 notatime",
            "cpu,host value=1",
            "cpu value=\"open",
            ",host=a value=1",
            "cpu value=1i2",
            "cpu a=1,a=2",
            "cpu value=1 1 extra",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should fail");
        }
        assert_eq!(parse("ok v=1\nbad").unwrap_err().line, 2);
    }

    #[test]
    fn builds_sql() {
        let pts = parse("m,host=h\"1 v=1i,s=\"it's\" 5\nm v=2i 6").unwrap();
        let sql = to_sql(&pts, Precision::Seconds, 0, None).unwrap();
        assert_eq!(
            sql[0],
            "CREATE TABLE IF NOT EXISTS \"m\" (\"host\" STRING, \"v\" BIGINT, \"s\" STRING, \"ts\" TIMESTAMP(0) TIME INDEX, PRIMARY KEY (\"host\"))"
        );
        assert_eq!(
            sql[1],
            "INSERT INTO \"m\" (\"host\", \"v\", \"s\", \"ts\") VALUES ('h\"1', 1, 'it''s', '1970-01-01T00:00:05.000000000'), (NULL, 2, NULL, '1970-01-01T00:00:06.000000000')"
        );
        let conflict = parse("m v=1i\nm v=1.5").unwrap();
        assert!(to_sql(&conflict, Precision::Nanos, 0, None).is_err());
    }

    #[test]
    fn a_database_other_than_public_qualifies_the_tables() {
        let pts = parse("m v=1i 5").unwrap();
        let sql = to_sql(&pts, Precision::Seconds, 0, Some("metrics")).unwrap();
        assert_eq!(sql[0], "CREATE DATABASE IF NOT EXISTS \"metrics\"");
        assert!(
            sql[1].starts_with("CREATE TABLE IF NOT EXISTS \"metrics\".\"m\" ("),
            "{}",
            sql[1]
        );
        assert!(
            sql[2].starts_with("INSERT INTO \"metrics\".\"m\" ("),
            "{}",
            sql[2]
        );
        let public = to_sql(&pts, Precision::Seconds, 0, Some("public")).unwrap();
        assert_eq!(public.len(), 2);
        assert!(public[0].starts_with("CREATE TABLE IF NOT EXISTS \"m\""));
    }

    #[test]
    fn new_tags_or_fields_of_an_existing_table_are_refused_by_name() {
        let columns = |m: &str| (m == "cpu").then(|| vec!["host".into(), "v".into(), "ts".into()]);
        let ok = parse("cpu,host=a v=1 5\nnew,x=1 y=2 5").unwrap();
        assert_eq!(check_columns(&ok, columns), Ok(()));
        let e =
            check_columns(&parse("cpu,host=a,rack=r v=1,w=2i 5").unwrap(), columns).unwrap_err();
        assert!(
            e.contains("\"rack\", \"w\"") && e.contains("host, v, ts"),
            "{e}"
        );
        assert!(e.contains("cannot add columns"), "{e}");
    }
}
