//! InfluxDB line protocol: parsing, and writing a request as ONE commit.
//!
//! `measurement[,tag=v...] field=v[,field=v...] [timestamp]`; tags become
//! STRING primary-key columns, fields typed columns (`1i` BIGINT, `1u` BIGINT
//! UNSIGNED, `1.5` DOUBLE, `"s"` STRING, `t`/`false` BOOLEAN) and the
//! timestamp the time index (`ts` in the tables a write creates).
//!
//! A request is checked whole before anything is written: per measurement,
//! the columns its lines bring and their types must agree across its lines
//! and with the existing table. Field types are never converted, as in
//! InfluxDB and GreptimeDB: an integer (`1i`) is refused for a DOUBLE column
//! rather than silently written as 1.0, so a client that sends both learns
//! of it at once. Tables cannot gain columns yet. Then the rows are built as
//! Arrow batches and committed, with the database and tables the request
//! creates, in one storage transaction: all of it or none of it.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt64Array,
};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use crate::auth::{Principal, Privilege};
use crate::catalog::{
    display_name, ColumnSchema, ColumnType, Table, TableSchema, DEFAULT_DATABASE,
};
use crate::database::{Core, Database};
use crate::error::{InvalidDataSnafu, Result};
use crate::sql::provider::blocking;
use crate::storage::WriteSet;

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
    pub fn column_type(self) -> ColumnType {
        match self {
            Precision::Nanos => ColumnType::TimestampNanosecond,
            Precision::Micros => ColumnType::TimestampMicrosecond,
            Precision::Millis => ColumnType::TimestampMillisecond,
            Precision::Seconds => ColumnType::TimestampSecond,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Precision::Nanos => "ns",
            Precision::Micros => "us",
            Precision::Millis => "ms",
            Precision::Seconds => "s",
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
    /// The type of the column that stores the value: the one a new table
    /// gets, and the only one an existing table may have for it.
    pub fn column_type(&self) -> ColumnType {
        match self {
            FieldValue::Int(_) => ColumnType::Int64,
            FieldValue::UInt(_) => ColumnType::UInt64,
            FieldValue::Float(_) => ColumnType::Float64,
            FieldValue::Str(_) => ColumnType::String,
            FieldValue::Bool(_) => ColumnType::Boolean,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            FieldValue::Int(_) => "an integer",
            FieldValue::UInt(_) => "an unsigned integer",
            FieldValue::Float(_) => "a float",
            FieldValue::Str(_) => "a string",
            FieldValue::Bool(_) => "a boolean",
        }
    }
}

/// The value as line protocol spells it (strings cut at 40 characters).
impl fmt::Display for FieldValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FieldValue::Int(v) => write!(f, "{v}i"),
            FieldValue::UInt(v) => write!(f, "{v}u"),
            FieldValue::Float(v) => write!(f, "{v:?}"),
            FieldValue::Bool(b) => write!(f, "{b}"),
            FieldValue::Str(s) => {
                let cut: String = s.chars().take(40).collect();
                let more = if cut.len() < s.len() { "..." } else { "" };
                write!(f, "\"{}{more}\"", cut.replace('"', "\\\""))
            }
        }
    }
}

/// How to write a value for a column of type `t`, if line protocol can.
fn how_to_write(t: ColumnType) -> Option<&'static str> {
    Some(match t {
        ColumnType::Float64 => "a float, such as 1.5 or 1 (no suffix)",
        ColumnType::Int64 => "an integer with the i suffix, such as 1i",
        ColumnType::UInt64 => "an unsigned integer with the u suffix, such as 1u",
        ColumnType::String => "a double-quoted string, such as \"on\"",
        ColumnType::Boolean => "a boolean: t, f, true or false",
        _ => return None,
    })
}

/// One parsed line.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The line of the body it came from (1-based).
    pub line: usize,
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
        let mut point = parse_line(line).map_err(|message| LineError {
            line: i + 1,
            message,
        })?;
        point.line = i + 1;
        points.push(point);
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
        line: 0,
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

/// Writes a line-protocol `body` into `database` (`""`: `public`; created
/// if missing) as ONE commit: every point, with the database and the tables
/// the points need, or nothing at all. `precision` is the unit of the
/// timestamps; a point without one gets the time of the request. Returns
/// the number of points written.
///
/// `who` needs INSERT on the tables written, CREATE on the database for
/// tables and columns the points add, and the right to create the database
/// if it does not exist (see [`crate::auth`]).
pub async fn write(
    db: &Database,
    who: &Principal,
    database: &str,
    body: &str,
    precision: Precision,
) -> Result<u64> {
    let core = db.core().clone();
    let database = if database.is_empty() {
        DEFAULT_DATABASE.to_string()
    } else {
        database.to_string()
    };
    let body = body.to_string();
    let now = db.now_ms().saturating_mul(1_000_000);
    let points =
        blocking(move || parse(&body).map_err(|e| invalid(format!("invalid line protocol: {e}"))))
            .await?;
    let new_database = authorize(&core, who, &database, &points)?;
    // New tags and fields of existing tables become their columns first (as
    // GreptimeDB does): tags as primary-key strings, fields by their values.
    for alter in new_columns(&core, &database, &points)? {
        crate::sql::alter::alter_table(&core, &db.session_context(), alter).await?;
    }
    let (c, w) = (core.clone(), who.clone());
    let written = blocking(move || {
        let written = write_points(&c, &database, &points, precision, now)?;
        if new_database {
            c.access
                .database_created(&c.store, &w, &database, Default::default())?;
        }
        Ok(written)
    })
    .await?;
    // A table it created may be what a pending flow waits for.
    core.flows.start_pending(&core, &db.session_context()).await;
    Ok(written)
}

/// Checks that `who` may write `points` into `database`: INSERT on each
/// existing table, CREATE on the database for new tables and columns (and
/// its `max_tables` quota), the right to create the database when it does
/// not exist. Returns whether the write creates the database.
fn authorize(core: &Core, who: &Principal, database: &str, points: &[Point]) -> Result<bool> {
    let exists = core.catalog.database_exists(database)?;
    if !exists {
        core.access.check_create_database(who, &[])?;
    }
    let mut new_tables = 0;
    for shape in shapes(points)? {
        match core.catalog.table(database, shape.measurement)? {
            Some(table) => {
                core.access
                    .check(who, Privilege::Insert, database, Some(shape.measurement))?;
                let schema = table.schema();
                let adds = shape
                    .tags
                    .iter()
                    .any(|(k, _)| schema.column_index(k).is_none())
                    || shape
                        .fields
                        .iter()
                        .any(|(k, _, _)| schema.column_index(k).is_none());
                if adds && exists {
                    core.access.check(who, Privilege::Create, database, None)?;
                }
            }
            None => {
                if exists {
                    core.access.check(who, Privilege::Create, database, None)?;
                }
                new_tables += 1;
            }
        }
    }
    if exists && new_tables > 0 {
        crate::sql::access::check_table_quota(core, database, new_tables)?;
    }
    if exists {
        crate::sql::access::check_storage_quota(core, database)?;
    }
    Ok(!exists)
}

/// The ALTER TABLEs that give existing tables the tags and fields `points`
/// bring and they lack (`ADD COLUMN IF NOT EXISTS`: a concurrent write may
/// add them first).
fn new_columns(
    core: &Core,
    database: &str,
    points: &[Point],
) -> Result<Vec<crate::sql::parser::AlterTable>> {
    use crate::sql::parser::{AlterOp, AlterTable, ColumnDef, TableName};
    let mut alters: Vec<AlterTable> = Vec::new();
    if !core.catalog.database_exists(database)? {
        return Ok(alters);
    }
    for shape in shapes(points)? {
        let Some(table) = core.catalog.table(database, shape.measurement)? else {
            continue;
        };
        let schema = table.schema();
        let column = |name: &str, data_type: ColumnType, tag: bool| AlterOp::AddColumn {
            column: Box::new(ColumnDef {
                name: name.to_string(),
                data_type,
                nullable: Some(true),
                default: None,
                comment: None,
                index: None,
                time_index: false,
                primary_key: tag,
            }),
            if_not_exists: true,
            position: None,
        };
        let mut ops = Vec::new();
        for (k, _) in &shape.tags {
            if schema.column_index(k).is_none() {
                ops.push(column(k, ColumnType::String, true));
            }
        }
        for (k, v, _) in &shape.fields {
            if schema.column_index(k).is_none() {
                ops.push(column(k, v.column_type(), false));
            }
        }
        if !ops.is_empty() {
            alters.push(AlterTable {
                name: TableName {
                    database: database.to_string(),
                    table: shape.measurement.to_string(),
                    qualified: true,
                },
                ops,
            });
        }
    }
    Ok(alters)
}

fn invalid(message: String) -> crate::error::Error {
    InvalidDataSnafu { message }.build()
}

/// Checks every point against the request and the catalog, then commits
/// them (see [`write`]); `now_nanos` stamps points without a timestamp.
pub(crate) fn write_points(
    core: &Core,
    database: &str,
    points: &[Point],
    precision: Precision,
    now_nanos: i64,
) -> Result<u64> {
    if points.is_empty() {
        return Ok(0);
    }
    let shapes = shapes(points)?;
    // Under the DDL lock from the first look at the catalog to the commit:
    // no table can appear, change or go in between.
    let mut ddl = core.catalog.begin_ddl()?;
    ddl.create_database(database)?;
    let mut set = WriteSet::new();
    for shape in &shapes {
        let table = match ddl.table(database, shape.measurement)? {
            Some(table) => {
                shape.check_fits(&table)?;
                table
            }
            None => ddl.create_table(
                database,
                shape.measurement,
                shape.schema(precision)?,
                BTreeMap::new(),
                None,
            )?,
        };
        let batch = shape.batch(&table, precision, now_nanos)?;
        let batch = core.fill_defaults(&table, batch)?;
        set.upsert(table, batch);
    }
    ddl.commit(&core.store, set)?;
    Ok(points.len() as u64)
}

/// What the lines of one measurement bring: tags and fields in order of
/// first appearance (with the line that brought each; a field's first value
/// gives its type) and the points themselves.
struct Shape<'a> {
    measurement: &'a str,
    tags: Vec<(&'a str, usize)>,
    fields: Vec<(&'a str, &'a FieldValue, usize)>,
    points: Vec<&'a Point>,
}

/// Groups the points by measurement and refuses what no table could hold:
/// a field with two types, a name that is a tag in one line and a field in
/// another.
fn shapes(points: &[Point]) -> Result<Vec<Shape<'_>>> {
    let mut shapes: Vec<Shape> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for p in points {
        let i = *index.entry(p.measurement.as_str()).or_insert_with(|| {
            shapes.push(Shape {
                measurement: &p.measurement,
                tags: Vec::new(),
                fields: Vec::new(),
                points: Vec::new(),
            });
            shapes.len() - 1
        });
        let shape = &mut shapes[i];
        for (k, _) in &p.tags {
            if !shape.tags.iter().any(|(t, _)| t == k) {
                shape.tags.push((k, p.line));
            }
        }
        for (k, v) in &p.fields {
            match shape.fields.iter().find(|(f, _, _)| f == k) {
                Some((_, first, line)) if first.column_type() != v.column_type() => {
                    return Err(invalid(format!(
                        "field {k:?} of measurement {:?} is {} ({}) on line {line} but {} ({}, \
                         {v}) on line {}; a field has one type: write all its values the same \
                         way (floats as 1.5 or 1, integers as 1i)",
                        p.measurement,
                        first.kind(),
                        first.column_type().sql_name(),
                        v.kind(),
                        v.column_type().sql_name(),
                        p.line
                    )))
                }
                Some(_) => {}
                None => shape.fields.push((k, v, p.line)),
            }
        }
        shape.points.push(p);
    }
    for s in &shapes {
        for (k, tag_line) in &s.tags {
            if let Some((_, _, field_line)) = s.fields.iter().find(|(f, _, _)| f == k) {
                return Err(invalid(format!(
                    "{k:?} is both a tag (line {tag_line}) and a field (line {field_line}) of \
                     measurement {:?}; a column is one or the other: rename one of them",
                    s.measurement
                )));
            }
        }
    }
    Ok(shapes)
}

impl Shape<'_> {
    fn names(&self) -> impl Iterator<Item = (&str, &'static str, usize)> + '_ {
        self.tags
            .iter()
            .map(|(k, line)| (*k, "tag", *line))
            .chain(self.fields.iter().map(|(k, _, line)| (*k, "field", *line)))
    }

    /// The schema of the table a write creates: tags (STRING, the primary
    /// key), then fields, then `ts` at the request's precision.
    fn schema(&self, precision: Precision) -> Result<TableSchema> {
        if let Some((k, what, line)) = self.names().find(|(k, _, _)| *k == TIME_INDEX) {
            return Err(invalid(format!(
                "{what} {k:?} of measurement {:?} (line {line}): the name {TIME_INDEX:?} is \
                 reserved for the time index of the tables line protocol creates; rename the {what}",
                self.measurement
            )));
        }
        let mut columns: Vec<ColumnSchema> = self
            .tags
            .iter()
            .map(|(k, _)| ColumnSchema::new(*k, ColumnType::String, true))
            .collect();
        columns.extend(
            self.fields
                .iter()
                .map(|(k, v, _)| ColumnSchema::new(*k, v.column_type(), true)),
        );
        columns.push(ColumnSchema::new(
            TIME_INDEX,
            precision.column_type(),
            false,
        ));
        let pk: Vec<&str> = self.tags.iter().map(|(k, _)| *k).collect();
        TableSchema::new(columns, TIME_INDEX, &pk, false)
    }

    /// Refuses points an existing table cannot take as they are: a tag or
    /// field it lacks, one that names its time index, a value of another type.
    fn check_fits(&self, table: &Table) -> Result<()> {
        let schema = table.schema();
        let name = display_name(&table.info.database, &table.info.name);
        let time_index = &schema.time_index_column().name;
        if let Some((k, what, line)) = self.names().find(|(k, _, _)| k == time_index) {
            return Err(invalid(format!(
                "{what} {k:?} (line {line}) is the time index of table {name:?}, which takes \
                 the line's timestamp; rename the {what}"
            )));
        }
        let missing: Vec<&str> = self
            .names()
            .map(|(k, _, _)| k)
            .filter(|k| schema.column_index(k).is_none())
            .collect();
        if !missing.is_empty() {
            let existing: Vec<&str> = schema.columns.iter().map(|c| c.name.as_str()).collect();
            return Err(invalid(format!(
                "table {name:?} has no column{} {} (its columns: {}): they were dropped while \
                 this write ran; write the point again, without {} if it should stay so",
                if missing.len() == 1 { "" } else { "s" },
                missing
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                existing.join(", "),
                if missing.len() == 1 { "it" } else { "them" }
            )));
        }
        let column_type = |k: &str| {
            let i = schema.column_index(k).unwrap_or(schema.time_index);
            schema.columns[i].data_type
        };
        for (k, line) in &self.tags {
            let t = column_type(k);
            if t != ColumnType::String {
                return Err(invalid(format!(
                    "tag {k:?} (line {line}) is a string, but column {k:?} of table {name:?} is {}; \
                     tag values are always strings: send {k:?} as a field of that type instead",
                    t.sql_name()
                )));
            }
        }
        for (k, v, line) in &self.fields {
            let t = column_type(k);
            if t != v.column_type() {
                let fix = match how_to_write(t) {
                    Some(how) => format!("write it as {how}"),
                    None => format!(
                        "line protocol cannot write a {} column: write {k:?} with SQL INSERT",
                        t.sql_name()
                    ),
                };
                return Err(invalid(format!(
                    "field type conflict: field {k:?} is {} in table {name:?}, but line {line} \
                     has {} ({v}, {}); line protocol does not convert between types: {fix}",
                    t.sql_name(),
                    v.kind(),
                    v.column_type().sql_name()
                )));
            }
        }
        Ok(())
    }

    /// The points as rows of `table` (which fits them): the tags and fields
    /// they bring, NULL where a point lacks one, and the time index in the
    /// table's unit.
    fn batch(&self, table: &Table, precision: Precision, now_nanos: i64) -> Result<RecordBatch> {
        let mut fields = Vec::with_capacity(self.tags.len() + self.fields.len() + 1);
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(fields.capacity());
        for (k, _) in &self.tags {
            let values: StringArray = self
                .points
                .iter()
                .map(|p| p.tags.iter().find(|(t, _)| t == k).map(|(_, v)| v.as_str()))
                .collect();
            fields.push(Field::new(*k, values.data_type().clone(), true));
            columns.push(Arc::new(values));
        }
        for (k, first, _) in &self.fields {
            let values = || {
                self.points
                    .iter()
                    .map(|p| p.fields.iter().find(|(f, _)| f == k).map(|(_, v)| v))
            };
            // Every value of the field has the type of the first (see `shapes`).
            let array: ArrayRef = match first {
                FieldValue::Int(_) => Arc::new(Int64Array::from_iter(values().map(|v| match v {
                    Some(FieldValue::Int(i)) => Some(*i),
                    _ => None,
                }))),
                FieldValue::UInt(_) => {
                    Arc::new(UInt64Array::from_iter(values().map(|v| match v {
                        Some(FieldValue::UInt(u)) => Some(*u),
                        _ => None,
                    })))
                }
                FieldValue::Float(_) => {
                    Arc::new(Float64Array::from_iter(values().map(|v| match v {
                        Some(FieldValue::Float(f)) => Some(*f),
                        _ => None,
                    })))
                }
                FieldValue::Str(_) => Arc::new(StringArray::from_iter(values().map(|v| match v {
                    Some(FieldValue::Str(s)) => Some(s.as_str()),
                    _ => None,
                }))),
                FieldValue::Bool(_) => {
                    Arc::new(BooleanArray::from_iter(values().map(|v| match v {
                        Some(FieldValue::Bool(b)) => Some(*b),
                        _ => None,
                    })))
                }
            };
            fields.push(Field::new(*k, array.data_type().clone(), true));
            columns.push(array);
        }
        let ts = table.schema().time_index_column();
        let unit = unit_nanos(ts.data_type).ok_or_else(|| {
            invalid(format!(
                "the time index {:?} of table {:?} is {}, which line protocol cannot write",
                ts.name,
                table.info.name,
                ts.data_type.sql_name()
            ))
        })?;
        let mut times = Vec::with_capacity(self.points.len());
        for p in &self.points {
            let t = match p.timestamp {
                Some(t) => convert_time(t, precision.nanos_per_unit(), unit),
                None => convert_time(now_nanos, 1, unit),
            };
            times.push(t.ok_or_else(|| {
                invalid(format!(
                    "timestamp {} on line {} is out of range for the time index {:?} ({}) at \
                     precision {}; check the precision parameter",
                    p.timestamp.unwrap_or(now_nanos),
                    p.line,
                    ts.name,
                    ts.data_type.sql_name(),
                    precision.name()
                ))
            })?);
        }
        let times: ArrayRef = match ts.data_type {
            ColumnType::TimestampSecond => Arc::new(TimestampSecondArray::from(times)),
            ColumnType::TimestampMillisecond => Arc::new(TimestampMillisecondArray::from(times)),
            ColumnType::TimestampMicrosecond => Arc::new(TimestampMicrosecondArray::from(times)),
            _ => Arc::new(TimestampNanosecondArray::from(times)),
        };
        fields.push(Field::new(&ts.name, times.data_type().clone(), false));
        columns.push(times);
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| {
            invalid(format!(
                "cannot build the rows of measurement {:?}: {e}",
                self.measurement
            ))
        })
    }
}

/// Nanoseconds per unit of a timestamp column type.
fn unit_nanos(t: ColumnType) -> Option<i64> {
    Some(match t {
        ColumnType::TimestampSecond => 1_000_000_000,
        ColumnType::TimestampMillisecond => 1_000_000,
        ColumnType::TimestampMicrosecond => 1_000,
        ColumnType::TimestampNanosecond => 1,
        _ => return None,
    })
}

/// `value` units of `from_nanos` ns as units of `to_nanos` ns (rounded
/// down when the target unit is coarser); `None` when it overflows.
fn convert_time(value: i64, from_nanos: i64, to_nanos: i64) -> Option<i64> {
    if from_nanos >= to_nanos {
        value.checked_mul(from_nanos / to_nanos)
    } else {
        Some(value.div_euclid(to_nanos / from_nanos))
    }
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

    fn table(sql_columns: &[(&str, ColumnType)], time_index: &str, pk: &[&str]) -> Arc<Table> {
        let columns = sql_columns
            .iter()
            .map(|(n, t)| ColumnSchema::new(*n, *t, true))
            .collect();
        Table::new(crate::catalog::TableInfo {
            id: 1,
            database: "public".into(),
            name: "cpu".into(),
            schema: TableSchema::new(columns, time_index, pk, false).unwrap(),
            options: BTreeMap::new(),
            version: 0,
            time_first: true,
            description: None,
        })
    }

    #[test]
    fn a_new_table_gets_tags_fields_and_ts_and_rows_get_nulls_where_lines_lack_a_value() {
        let pts = parse("m,host=h\"1 v=1i,s=\"it's\" 5\nm v=2i 6\nm v=3i").unwrap();
        let shapes = shapes(&pts).unwrap();
        assert_eq!(shapes.len(), 1);
        let schema = shapes[0].schema(Precision::Seconds).unwrap();
        let cols: Vec<String> = schema
            .columns
            .iter()
            .map(|c| format!("{} {}", c.name, c.data_type.sql_name()))
            .collect();
        assert_eq!(
            cols,
            ["host STRING", "v BIGINT", "s STRING", "ts TIMESTAMP(0)"]
        );
        assert_eq!(schema.primary_key_names(), ["host"]);
        assert_eq!(schema.time_index_column().name, "ts");
        let t = Table::new(crate::catalog::TableInfo {
            id: 1,
            database: "public".into(),
            name: "m".into(),
            schema,
            options: BTreeMap::new(),
            version: 0,
            time_first: true,
            description: None,
        });
        let batch = shapes[0]
            .batch(&t, Precision::Seconds, 7_500_000_000)
            .unwrap();
        let text = datafusion::arrow::util::pretty::pretty_format_batches(&[batch])
            .unwrap()
            .to_string();
        let rows: Vec<&str> = text
            .lines()
            .skip(3)
            .filter(|l| l.starts_with('|'))
            .collect();
        assert_eq!(
            rows,
            [
                "| h\"1  | 1 | it's | 1970-01-01T00:00:05 |",
                "|      | 2 |      | 1970-01-01T00:00:06 |",
                "|      | 3 |      | 1970-01-01T00:00:07 |",
            ],
            "{text}"
        );
    }

    #[test]
    fn conflicts_within_a_request_are_refused_by_name_and_line() {
        let e = shapes(&parse("m v=1.5 1\nother x=1i\nm v=2i 2").unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("\"v\"") && e.contains("DOUBLE") && e.contains("BIGINT"),
            "{e}"
        );
        assert!(e.contains("line 1") && e.contains("line 3"), "{e}");
        let e = shapes(&parse("m,x=a v=1\nm x=2").unwrap())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("both a tag (line 1) and a field (line 2)"),
            "{e}"
        );
        let e = shapes(&parse("m ts=1i 5").unwrap()).unwrap()[0]
            .schema(Precision::Nanos)
            .unwrap_err()
            .to_string();
        assert!(e.contains("reserved for the time index"), "{e}");
    }

    #[test]
    fn an_existing_table_refuses_missing_columns_and_other_types_by_name() {
        let cpu = table(
            &[
                ("host", ColumnType::String),
                ("v", ColumnType::Float64),
                ("n", ColumnType::Int32),
                ("ts", ColumnType::TimestampMillisecond),
            ],
            "ts",
            &["host"],
        );
        let fits = |body: &str| shapes(&parse(body).unwrap()).unwrap()[0].check_fits(&cpu);
        assert!(fits("cpu,host=a v=1 5").is_ok());
        let e = fits("cpu,host=a,rack=r v=1,w=2i 5")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"rack\", \"w\"") && e.contains("host, v, n, ts"),
            "{e}"
        );
        assert!(e.contains("dropped while this write ran"), "{e}");
        // An integer is not written into a DOUBLE column (InfluxDB: "field type conflict").
        let e = fits("\ncpu,host=b v=1i").unwrap_err().to_string();
        for needle in ["\"v\"", "DOUBLE", "BIGINT", "1i", "line 2", "1.5 or 1"] {
            assert!(e.contains(needle), "{needle} missing: {e}");
        }
        let e = fits("cpu,host=a n=1i").unwrap_err().to_string();
        assert!(e.contains("INT") && e.contains("SQL INSERT"), "{e}");
        let e = fits("cpu host=1i,v=2").unwrap_err();
        assert!(e.to_string().contains("STRING"), "{e}");
        let e = fits("cpu,host=a ts=1i").unwrap_err().to_string();
        assert!(e.contains("time index"), "{e}");
        let tagged = fits("cpu,v=x host=\"a\"").unwrap_err().to_string();
        assert!(
            tagged.contains("tag \"v\"") && tagged.contains("DOUBLE"),
            "{tagged}"
        );
    }

    #[test]
    fn timestamps_take_the_unit_of_the_time_index() {
        let cpu = table(
            &[
                ("v", ColumnType::Float64),
                ("ts", ColumnType::TimestampMillisecond),
            ],
            "ts",
            &[],
        );
        let pts = parse("cpu v=1 1700000000123456789\ncpu v=2 -1\ncpu v=3").unwrap();
        let batch = shapes(&pts).unwrap()[0]
            .batch(&cpu, Precision::Nanos, 42_000_000)
            .unwrap();
        let ts = batch
            .column(1)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(ts.values().to_vec(), [1_700_000_000_123, -1, 42]);
        let pts = parse("cpu v=1 9223372036854775807").unwrap();
        let e = shapes(&pts).unwrap()[0]
            .batch(&cpu, Precision::Seconds, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range") && e.contains("line 1"), "{e}");
    }
}
