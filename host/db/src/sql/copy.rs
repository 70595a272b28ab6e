//! `COPY ... TO STDOUT` and `COPY ... FROM STDIN`: what a COPY statement asks
//! for, and PostgreSQL's text and CSV formats of its rows.
//!
//! Only the client's end of the connection is ever read or written: a COPY to
//! or from a server file or program is refused before anything runs (see
//! `sql::plan_statement` and the session). Must not know the wire protocol.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, ListBuilder, StringArray, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget,
    Statement as SqlStatement,
};

use crate::catalog::Table;
use crate::error::{InternalSnafu, InvalidDataSnafu, Result, SqlSnafu, UnsupportedSnafu};
use crate::sql::parser::{normalize_ident, table_name, TableName};

/// The row format of a COPY.
#[derive(Debug, Clone, PartialEq)]
pub enum CopyFormat {
    /// PostgreSQL's text format: one row per line, `delimiter` between values,
    /// backslash escapes, `null` for NULL.
    Text { delimiter: char, null: String },
    /// CSV.
    Csv {
        delimiter: char,
        quote: char,
        escape: char,
        null: String,
        header: bool,
    },
}

/// What a COPY statement reads from or writes to.
#[derive(Debug, Clone, PartialEq)]
pub enum CopyData {
    /// A table and (empty: all) its columns.
    Table {
        table: TableName,
        columns: Vec<String>,
    },
    /// `COPY (query) TO STDOUT`.
    Query(String),
}

/// A `COPY ... TO STDOUT` or `COPY ... FROM STDIN` statement.
#[derive(Debug, Clone, PartialEq)]
pub struct CopySpec {
    /// `TO STDOUT` (else `FROM STDIN`).
    pub to_client: bool,
    pub data: CopyData,
    pub format: CopyFormat,
}

impl CopySpec {
    /// Reads a COPY statement; a file or program target is refused.
    pub fn from_statement(stmt: &SqlStatement) -> Result<CopySpec> {
        let SqlStatement::Copy {
            source,
            to,
            target,
            options,
            legacy_options,
            ..
        } = stmt
        else {
            return InternalSnafu {
                message: "not a COPY statement",
            }
            .fail();
        };
        match (to, target) {
            (true, CopyTarget::Stdout) | (false, CopyTarget::Stdin) => {}
            _ => {
                return UnsupportedSnafu {
                    message: "COPY to or from a file or program is not allowed: the server never \
                              reads or writes its own files for a client. Use COPY ... TO STDOUT \
                              or COPY ... FROM STDIN (psql's \\copy)",
                }
                .fail()
            }
        }
        let data = match source {
            CopySource::Table {
                table_name: name,
                columns,
            } => CopyData::Table {
                table: table_name(name)?,
                columns: columns.iter().map(normalize_ident).collect(),
            },
            CopySource::Query(q) if *to => CopyData::Query(q.to_string()),
            CopySource::Query(_) => {
                return SqlSnafu {
                    message: "COPY FROM needs a table, not a query",
                }
                .fail()
            }
        };
        let (mut csv, mut delimiter, mut null, mut header) = (false, None, None, false);
        let (mut quote, mut escape) = ('"', None);
        for o in options {
            match o {
                CopyOption::Format(f) => match f.value.to_ascii_lowercase().as_str() {
                    "csv" => csv = true,
                    "text" => csv = false,
                    other => {
                        return UnsupportedSnafu {
                            message: format!(
                                "COPY format {other} is not supported; use text or csv"
                            ),
                        }
                        .fail()
                    }
                },
                CopyOption::Delimiter(c) => delimiter = Some(*c),
                CopyOption::Null(s) => null = Some(s.clone()),
                CopyOption::Header(h) => header = *h,
                CopyOption::Quote(c) => quote = *c,
                CopyOption::Escape(c) => escape = Some(*c),
                CopyOption::Encoding(e)
                    if e.eq_ignore_ascii_case("utf8") || e.eq_ignore_ascii_case("utf-8") => {}
                other => {
                    return UnsupportedSnafu {
                        message: format!("COPY option {other} is not supported"),
                    }
                    .fail()
                }
            }
        }
        for o in legacy_options {
            match o {
                CopyLegacyOption::Csv(opts) => {
                    csv = true;
                    for c in opts {
                        match c {
                            CopyLegacyCsvOption::Header => header = true,
                            CopyLegacyCsvOption::Quote(q) => quote = *q,
                            CopyLegacyCsvOption::Escape(e) => escape = Some(*e),
                            other => {
                                return UnsupportedSnafu {
                                    message: format!("COPY option {other} is not supported"),
                                }
                                .fail()
                            }
                        }
                    }
                }
                CopyLegacyOption::Delimiter(c) => delimiter = Some(*c),
                CopyLegacyOption::Null(s) => null = Some(s.clone()),
                CopyLegacyOption::Header => header = true,
                other => {
                    return UnsupportedSnafu {
                        message: format!("COPY option {other} is not supported"),
                    }
                    .fail()
                }
            }
        }
        let format = if csv {
            CopyFormat::Csv {
                delimiter: delimiter.unwrap_or(','),
                quote,
                escape: escape.unwrap_or(quote),
                null: null.unwrap_or_default(),
                header,
            }
        } else {
            if header {
                return UnsupportedSnafu {
                    message: "COPY HEADER is available only in CSV mode",
                }
                .fail();
            }
            CopyFormat::Text {
                delimiter: delimiter.unwrap_or('\t'),
                null: null.unwrap_or_else(|| "\\N".into()),
            }
        };
        Ok(CopySpec {
            to_client: *to,
            data,
            format,
        })
    }
}

/// Decodes COPY data in `format` into rows of text values (`None`: NULL),
/// each with exactly `columns` values. Input must be UTF-8 (SQLSTATE 22021
/// otherwise) and may not contain NUL.
pub fn decode(
    format: &CopyFormat,
    data: &[u8],
    columns: usize,
) -> Result<Vec<Vec<Option<String>>>> {
    let text = std::str::from_utf8(data).map_err(|e| {
        crate::error::InvalidEncodingSnafu {
            message: format!(
                "invalid byte sequence for encoding \"UTF8\" in COPY data at byte {}",
                e.valid_up_to()
            ),
        }
        .build()
    })?;
    if text.contains('\0') {
        return crate::error::InvalidEncodingSnafu {
            message: "invalid byte sequence for encoding \"UTF8\": 0x00 in COPY data",
        }
        .fail();
    }
    let rows = match format {
        CopyFormat::Text { delimiter, null } => decode_text(text, *delimiter, null)?,
        CopyFormat::Csv {
            delimiter,
            quote,
            escape,
            null,
            header,
        } => decode_csv(text, *delimiter, *quote, *escape, null, *header)?,
    };
    for (i, r) in rows.iter().enumerate() {
        if r.len() != columns {
            return InvalidDataSnafu {
                message: format!(
                    "COPY data line {} has {} values, the COPY expects {columns}",
                    i + 1,
                    r.len()
                ),
            }
            .fail();
        }
    }
    Ok(rows)
}

fn decode_text(text: &str, delimiter: char, null: &str) -> Result<Vec<Vec<Option<String>>>> {
    let mut rows = Vec::new();
    for (n, line) in text.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line == "\\." {
            break;
        }
        if line.is_empty() && n + 1 == text.split('\n').count() {
            continue;
        }
        let mut row = Vec::new();
        for raw in line.split(delimiter) {
            if raw == null {
                row.push(None);
                continue;
            }
            row.push(Some(unescape(raw).map_err(|m| {
                InvalidDataSnafu {
                    message: format!("COPY data line {}: {m}", n + 1),
                }
                .build()
            })?));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// PostgreSQL's text-format escapes: `\b \f \n \r \t \v \\`, octal `\NNN`, hex `\xHH`.
fn unescape(raw: &str) -> std::result::Result<String, String> {
    if !raw.contains('\\') {
        return Ok(raw.to_string());
    }
    let mut out = Vec::with_capacity(raw.len());
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                let mut k = 0;
                while k < 2 && i < b.len() && (b'0'..=b'7').contains(&b[i]) {
                    v = v * 8 + u32::from(b[i] - b'0');
                    i += 1;
                    k += 1;
                }
                out.push((v & 0xff) as u8);
            }
            b'x' => {
                let mut v = 0u32;
                let mut k = 0;
                while k < 2 && i < b.len() && b[i].is_ascii_hexdigit() {
                    v = v * 16 + (b[i] as char).to_digit(16).unwrap_or(0);
                    i += 1;
                    k += 1;
                }
                if k == 0 {
                    out.push(b'x');
                } else {
                    out.push(v as u8);
                }
            }
            other => out.push(other),
        }
    }
    match String::from_utf8(out) {
        Ok(s) if !s.contains('\0') => Ok(s),
        _ => Err("an escape gives a byte sequence that is not UTF-8 text".into()),
    }
}

fn decode_csv(
    text: &str,
    delimiter: char,
    quote: char,
    escape: char,
    null: &str,
    header: bool,
) -> Result<Vec<Vec<Option<String>>>> {
    let byte = |c: char, what: &str| {
        u8::try_from(c).map_err(|_| {
            UnsupportedSnafu {
                message: format!("COPY {what} must be a single-byte character"),
            }
            .build()
        })
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(header)
        .delimiter(byte(delimiter, "DELIMITER")?)
        .quote(byte(quote, "QUOTE")?)
        .escape((escape != quote).then_some(byte(escape, "ESCAPE")?))
        .double_quote(escape == quote)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut rows = Vec::new();
    for (i, record) in reader.byte_records().enumerate() {
        let record = record.map_err(|e| {
            InvalidDataSnafu {
                message: format!("COPY CSV data record {}: {e}", i + 1),
            }
            .build()
        })?;
        let pos = record.position().map_or(0, |p| p.byte() as usize);
        let raw_line = text.get(pos..).unwrap_or_default();
        if raw_line.starts_with("\\.") {
            break;
        }
        let mut row = Vec::with_capacity(record.len());
        let mut start = 0usize;
        for field in record.iter() {
            // An unquoted value equal to the NULL string is NULL; a quoted one is text.
            let quoted = raw_line.get(start..).is_some_and(|s| s.starts_with(quote));
            let value = String::from_utf8_lossy(field).into_owned();
            start += field.len() + 1 + if quoted { 2 } else { 0 };
            row.push(if !quoted && value == null {
                None
            } else {
                Some(value)
            });
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Text rows as a batch of string columns named `names`; a column that is a
/// list in `table` becomes a list of strings, each value read as
/// PostgreSQL writes an array (`{1,NULL,"a,b"}`, what COPY TO writes).
/// Storage casts both to the columns' types.
pub fn text_batch(
    table: &Table,
    names: &[String],
    rows: &[Vec<Option<String>>],
) -> Result<RecordBatch> {
    let is_list = |n: &String| {
        let schema = table.schema();
        schema
            .column_index(n)
            .is_some_and(|i| schema.columns[i].data_type.item().is_some())
    };
    let text_list = DataType::List(Arc::new(Field::new_list_field(DataType::Utf8, true)));
    let schema = Arc::new(Schema::new(
        names
            .iter()
            .map(|n| match is_list(n) {
                true => Field::new(n, text_list.clone(), true),
                false => Field::new(n, DataType::Utf8, true),
            })
            .collect::<Vec<_>>(),
    ));
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        if !is_list(name) {
            columns.push(Arc::new(StringArray::from_iter(
                rows.iter().map(|r| r[i].as_deref()),
            )));
            continue;
        }
        let mut list = ListBuilder::new(StringBuilder::new());
        for (row, r) in rows.iter().enumerate() {
            match &r[i] {
                None => list.append_null(),
                Some(text) => {
                    let items = pg_array(text).map_err(|m| {
                        InvalidDataSnafu {
                            message: format!("row {}, column '{name}': {m}", row + 1),
                        }
                        .build()
                    })?;
                    list.append_value(items);
                }
            }
        }
        columns.push(Arc::new(list.finish()));
    }
    RecordBatch::try_new_with_options(
        schema,
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows.len())),
    )
    .map_err(|e| {
        InternalSnafu {
            message: format!("cannot build COPY rows: {e}"),
        }
        .build()
    })
}

/// The elements of PostgreSQL's text form of a one-dimensional array:
/// `{` elements separated by commas `}`; an element double-quoted (with
/// backslash escapes) or bare (trimmed, backslash escapes; a bare `NULL`
/// is NULL).
fn pg_array(text: &str) -> std::result::Result<Vec<Option<String>>, String> {
    let bad = |why: &str| format!("{text:?} is not a list ({why}); write it as {{1,2,NULL}}");
    let inner = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or_else(|| bad("it must be in braces"))?;
    let mut items = Vec::new();
    if inner.trim().is_empty() {
        return Ok(items);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let item = match chars.peek() {
            Some('{') => return Err(bad("lists of lists are not supported")),
            Some('"') => {
                chars.next();
                let mut s = String::new();
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => {
                            s.push(chars.next().ok_or_else(|| bad("a quote is not closed"))?)
                        }
                        Some(c) => s.push(c),
                        None => return Err(bad("a quote is not closed")),
                    }
                }
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                Some(s)
            }
            _ => {
                let (mut s, mut escaped) = (String::new(), false);
                while let Some(c) = chars.next_if(|c| *c != ',') {
                    match c {
                        '\\' => {
                            escaped = true;
                            s.push(chars.next().ok_or_else(|| bad("it ends in a backslash"))?);
                        }
                        '"' | '{' | '}' => {
                            return Err(bad("a bare element holds a quote or brace"))
                        }
                        c => s.push(c),
                    }
                }
                let s = s.trim_end().to_string();
                if s.is_empty() && !escaped {
                    return Err(bad("an element is empty; write \"\" for an empty string"));
                }
                (escaped || !s.eq_ignore_ascii_case("NULL")).then_some(s)
            }
        };
        items.push(item);
        match chars.next() {
            None => return Ok(items),
            Some(',') => {}
            Some(_) => return Err(bad("elements are separated by commas")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_arrays_read_as_copy_to_writes_them() {
        let s = |v: &str| Some(v.to_string());
        assert_eq!(pg_array("{1,NULL,3}"), Ok(vec![s("1"), None, s("3")]));
        assert_eq!(pg_array(" { } "), Ok(vec![]));
        assert_eq!(
            pg_array(r#"{"x,y","q\"z",NULL,"",null, a b ,"NULL",\N\ULL}"#),
            Ok(vec![
                s("x,y"),
                s("q\"z"),
                None,
                s(""),
                None,
                s("a b"),
                s("NULL"),
                s("NULL")
            ])
        );
        for bad in [
            "1,2", "{1,}", "{,1}", "{{1}}", "{\"a}", "{a\"b}", "{1 2\"}", "{a\\}",
        ] {
            assert!(pg_array(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn text_format() {
        let f = CopyFormat::Text {
            delimiter: '\t',
            null: "\\N".into(),
        };
        let rows = decode(&f, b"a\t1\t\\N\nb\\tc\t2\tx\\ny\n", 3).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Some("a".into()), Some("1".into()), None],
                vec![Some("b\tc".into()), Some("2".into()), Some("x\ny".into())],
            ]
        );
        assert!(decode(&f, b"a\t1\n", 3).is_err());
        assert!(decode(&f, b"\xff\t1\t2\n", 3).is_err());
        assert!(decode(&f, b"a\\000\t1\t2\n", 3).is_err());
    }

    #[test]
    fn csv_format() {
        let f = CopyFormat::Csv {
            delimiter: ',',
            quote: '"',
            escape: '"',
            null: String::new(),
            header: true,
        };
        let rows = decode(&f, b"k,v\n\"a,b\",1\n,\"\"\n", 2).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![Some("a,b".into()), Some("1".into())],
                vec![None, Some(String::new())],
            ]
        );
    }
}
