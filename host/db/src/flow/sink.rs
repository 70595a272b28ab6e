//! Sink tables: the schema of an auto-created sink, whether an existing table
//! fits a flow's output, and how a tick's diff rows become upserts and
//! deletes on the sink.
//!
//! Rules (GreptimeDB's, plus what exactness needs):
//! * auto-created sink: the output columns in order; primary key = the GROUP
//!   BY output columns (for a query without GROUP BY: every output column
//!   but the time index, so that distinct result rows stay distinct rows);
//!   time index = the first timestamp column among the group keys (without
//!   GROUP BY: the first timestamp column); then `update_at TIMESTAMP(3)`
//!   (the tick time) and, when no time index was found, `__ts_placeholder
//!   TIMESTAMP(3)` (always 0) as the time index.
//! * an existing sink fits when its columns are the output's (by name, or by
//!   position where only the name differs and the types agree), optionally
//!   followed by one timestamp column written with the tick time and a
//!   `__ts_placeholder`; types are cast when the cast is lossless (or is a
//!   timestamp to a coarser precision, truncated, see [`fits_sink`]). A
//!   timestamp column of the sink's key (time index or primary key) that the
//!   query does not give is 0, like `__ts_placeholder`: with the tick time in
//!   it, each update would add a row instead of replacing one.
//! * a non-aggregate flow whose rows may repeat (it does not output its
//!   source's key) counts them (`__sandflow_n`, see the manager's
//!   `compile_flow`); into a sink with such a 0 column in its key, each copy
//!   is its own row, that column holding the copy's slot ([`copies`]), so
//!   the sink holds the query's rows as a multiset.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, UInt32Array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType as ArrowType, Field as ArrowField, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::row::{RowConverter, SortField};
// hashbrown with foldhash: netting a back-fill's 167k sink rows took
// 15 ms with the standard library's SipHash.
use datafusion::common::HashMap;

use super::arrow::data_type_to_arrow;
use crate::catalog::{ColumnSchema, ColumnType, Table, TableSchema};
use crate::runtime::Field;

/// The column an auto-created sink adds for the tick time.
pub const UPDATE_AT: &str = "update_at";
pub use crate::schema::TS_PLACEHOLDER;

/// Where a sink column's values come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkColumn {
    /// The flow's output column with this index.
    Output(usize),
    /// The tick time (`update_at`).
    TickTime,
    /// Always 0 (`__ts_placeholder`).
    Zero,
    /// Always NULL: a nullable column of an existing sink that the query
    /// does not give (GreptimeDB fills such columns with NULL).
    Null,
}

/// The stored column type of a flow output column.
pub fn column_type(f: &Field) -> Result<ColumnType, String> {
    ColumnType::from_arrow(&data_type_to_arrow(f.data_type)).ok_or_else(|| {
        format!(
            "output column '{}' has type {:?}, which tables cannot store",
            f.name, f.data_type
        )
    })
}

/// The schema of the sink a flow creates when `SINK TO` names no table.
pub fn derive_schema(
    output: &[Field],
    group_keys: &[String],
    aggregates: bool,
    outer_join: bool,
) -> Result<TableSchema, String> {
    let mut columns = Vec::with_capacity(output.len() + 2);
    for f in output {
        columns.push(ColumnSchema::new(f.name.clone(), column_type(f)?, true));
    }
    // Below an outer join, a column of the padded side is NULL where a row
    // has no match: it cannot be the time index.
    let may_be_null =
        |name: &str| outer_join && output.iter().any(|f| f.name == name && f.nullable);
    let is_ts = |c: &ColumnSchema| c.data_type.is_timestamp() && !may_be_null(&c.name);
    let time_index = if aggregates {
        columns
            .iter()
            .find(|c| is_ts(c) && group_keys.contains(&c.name))
            .map(|c| c.name.clone())
    } else {
        columns.iter().find(|c| is_ts(c)).map(|c| c.name.clone())
    };
    let mut primary_key: Vec<String> = if aggregates {
        group_keys.to_vec()
    } else {
        columns.iter().map(|c| c.name.clone()).collect()
    };
    primary_key.retain(|k| Some(k) != time_index.as_ref());
    if let Some(list) = columns
        .iter()
        .find(|c| c.data_type.item().is_some() && primary_key.contains(&c.name))
    {
        return Err(format!(
            "the sink would be keyed by column '{}', a list ({}), and lists are not keys: \
             group by other columns, or create the sink table first with its own PRIMARY KEY",
            list.name,
            list.data_type.sql_name()
        ));
    }
    if !columns.iter().any(|c| c.name == UPDATE_AT) {
        columns.push(ColumnSchema::new(
            UPDATE_AT,
            ColumnType::TimestampMillisecond,
            true,
        ));
    }
    let time_index = match time_index {
        Some(t) => t,
        None => {
            if columns.iter().any(|c| c.name == TS_PLACEHOLDER) {
                return Err(format!(
                    "the query has an output column named {TS_PLACEHOLDER}, which sinks reserve; rename it"
                ));
            }
            columns.push(ColumnSchema::new(
                TS_PLACEHOLDER,
                ColumnType::TimestampMillisecond,
                false,
            ));
            TS_PLACEHOLDER.to_string()
        }
    };
    let pk: Vec<&str> = primary_key.iter().map(String::as_str).collect();
    TableSchema::new(columns, &time_index, &pk, false).map_err(|e| e.to_string())
}

/// Whether every value of `from` converts to `to` and back unchanged.
pub fn lossless(from: ColumnType, to: ColumnType) -> bool {
    use ColumnType::*;
    if from == to {
        return true;
    }
    let rank_signed = |t: ColumnType| match t {
        Int8 => Some(1),
        Int16 => Some(2),
        Int32 => Some(3),
        Int64 => Some(4),
        _ => None,
    };
    let rank_unsigned = |t: ColumnType| match t {
        UInt8 => Some(1),
        UInt16 => Some(2),
        UInt32 => Some(3),
        UInt64 => Some(4),
        _ => None,
    };
    let rank_ts = |t: ColumnType| match t {
        Date => Some(0),
        TimestampSecond => Some(1),
        TimestampMillisecond => Some(2),
        TimestampMicrosecond => Some(3),
        TimestampNanosecond => Some(4),
        _ => None,
    };
    match (from, to) {
        (a, b) if rank_signed(a).is_some() && rank_signed(b).is_some() => {
            rank_signed(a) < rank_signed(b)
        }
        (a, b) if rank_unsigned(a).is_some() && rank_unsigned(b).is_some() => {
            rank_unsigned(a) < rank_unsigned(b)
        }
        (a, b) if rank_unsigned(a).is_some() && rank_signed(b).is_some() => {
            rank_unsigned(a) < rank_signed(b)
        }
        (Int8 | Int16 | UInt8 | UInt16, Float32) => true,
        (Int8 | Int16 | Int32 | UInt8 | UInt16 | UInt32 | Float32, Float64) => true,
        (a, b) if rank_ts(a).is_some() && rank_ts(b).is_some() => rank_ts(a) < rank_ts(b),
        _ => false,
    }
}

/// Whether a query's column of type `from` may go into a sink column of type
/// `to`: a lossless cast, or a timestamp into one of coarser precision (as
/// GreptimeDB writes a `TIMESTAMP '...'` literal, nanoseconds, into a
/// millisecond column): the finer part of each value is truncated, as an
/// INSERT into that column would do.
pub fn fits_sink(from: ColumnType, to: ColumnType) -> bool {
    use ColumnType::*;
    let ts = |t: ColumnType| {
        matches!(
            t,
            TimestampSecond | TimestampMillisecond | TimestampMicrosecond | TimestampNanosecond
        )
    };
    lossless(from, to) || (ts(from) && ts(to))
}

/// Checks that `table` can hold `output`; returns, per sink column, where its
/// values come from, or an error listing every mismatch.
pub fn fit(table: &Table, output: &[Field]) -> Result<Vec<SinkColumn>, String> {
    let cols = &table.schema().columns;
    let mut problems = Vec::new();
    let mut mapping: Vec<Option<SinkColumn>> = vec![None; cols.len()];
    let out_types: Vec<ColumnType> = output.iter().map(column_type).collect::<Result<_, _>>()?;
    let by_name = output.iter().all(|f| cols.iter().any(|c| c.name == f.name));
    if by_name {
        for (i, f) in output.iter().enumerate() {
            let Some(j) = cols.iter().position(|c| c.name == f.name) else {
                continue;
            };
            if !fits_sink(out_types[i], cols[j].data_type) {
                problems.push(format!(
                    "column '{}' is {} in the sink but the query gives {}, which does not convert without loss",
                    f.name,
                    cols[j].data_type.sql_name(),
                    out_types[i].sql_name()
                ));
            }
            mapping[j] = Some(SinkColumn::Output(i));
        }
    } else {
        for (i, f) in output.iter().enumerate() {
            let Some(c) = cols.get(i) else {
                problems.push(format!(
                    "the query's column '{}' ({}) has no column in the sink",
                    f.name,
                    out_types[i].sql_name()
                ));
                continue;
            };
            let ok = if c.name == f.name {
                fits_sink(out_types[i], c.data_type)
            } else {
                out_types[i] == c.data_type
            };
            if !ok {
                problems.push(format!(
                    "sink column {} '{}' {} does not match the query's column '{}' {}",
                    i + 1,
                    c.name,
                    c.data_type.sql_name(),
                    f.name,
                    out_types[i].sql_name()
                ));
            }
            mapping[i] = Some(SinkColumn::Output(i));
        }
    }
    let mut tick_time_used = false;
    for (j, c) in cols.iter().enumerate() {
        if mapping[j].is_some() {
            continue;
        }
        // A key column (time index or primary key) must not take the tick time:
        // every update would then be a new sink row, and the retraction of the
        // old value would miss it. It is 0, like `__ts_placeholder`.
        let key = table.key_columns.contains(&j);
        if c.data_type.is_timestamp() && (c.name == TS_PLACEHOLDER || key) {
            mapping[j] = Some(SinkColumn::Zero);
        } else if c.data_type.is_timestamp() && !tick_time_used {
            tick_time_used = true;
            mapping[j] = Some(SinkColumn::TickTime);
        } else if c.nullable && !key {
            mapping[j] = Some(SinkColumn::Null);
        } else {
            problems.push(format!(
                "sink column '{}' {} is not an output of the query",
                c.name,
                c.data_type.sql_name()
            ));
        }
    }
    if !problems.is_empty() {
        return Err(format!(
            "sink table '{}' does not fit the flow's output ({}): {}; \
             drop the table or name another one in SINK TO to let the flow create it",
            table.qualified_name(),
            output
                .iter()
                .zip(&out_types)
                .map(|(f, t)| format!("{} {}", f.name, t.sql_name()))
                .collect::<Vec<_>>()
                .join(", "),
            problems.join("; ")
        ));
    }
    Ok(mapping
        .into_iter()
        .map(|m| m.unwrap_or(SinkColumn::Zero))
        .collect())
}

/// Sink writes derived from one tick's output.
#[derive(Debug, Default)]
pub struct SinkWrites {
    /// Rows to upsert (in the sink's schema).
    pub upserts: Option<RecordBatch>,
    /// Rows whose keys are to be deleted.
    pub deletes: Option<RecordBatch>,
}

impl SinkWrites {
    pub fn rows(&self) -> u64 {
        let n = |b: &Option<RecordBatch>| b.as_ref().map_or(0, |b| b.num_rows() as u64);
        n(&self.upserts) + n(&self.deletes)
    }
}

/// Bits of a copy's number in a copy's slot (see [`copies`]): a row may be
/// in the sink this many times at most.
const COPY_BITS: u32 = 10;

/// A counted flow's rows (its output ends with `__sandflow_n`, how many
/// copies of the row the query has) into a sink whose key has a timestamp
/// column the query does not give: each copy becomes its own sink row, that
/// column holding the copy's slot: a hash of the row's values, then the
/// copy's number. So rows that the rest of the key does not tell apart (a
/// row and its copies, or rows that differ only in non-key columns) stay
/// apart, and the sink holds the query's rows as a multiset. `None` when
/// that does not apply. A row with more than 2^COPY_BITS copies keeps that
/// many.
fn copies(
    table: &Table,
    mapping: &[SinkColumn],
    output: &RecordBatch,
    batch: &RecordBatch,
    diffs: &[i64],
) -> Result<Option<(RecordBatch, Vec<i64>)>, String> {
    let schema = output.schema();
    let Some(last) = schema.fields().last() else {
        return Ok(None);
    };
    if last.name() != crate::flow::manager::HIDDEN_COUNT {
        return Ok(None);
    }
    let Some(slot_col) = table
        .key_columns
        .iter()
        .copied()
        .find(|&j| mapping.get(j) == Some(&SinkColumn::Zero))
    else {
        return Ok(None);
    };
    let visible = output.num_columns() - 1;
    let counts = cast(output.column(visible), &ArrowType::Int64).map_err(|e| e.to_string())?;
    let counts = counts
        .as_any()
        .downcast_ref::<Int64Array>()
        .ok_or("the row counts are not integers")?;
    let values: Vec<ArrayRef> = output.columns()[..visible].to_vec();
    let converter = RowConverter::new(
        values
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )
    .map_err(|e| e.to_string())?;
    let encoded = converter
        .convert_columns(&values)
        .map_err(|e| format!("cannot encode the flow's rows: {e}"))?;
    // Slots stay within a few thousand years in the column's own unit.
    let ty = table.schema().columns[slot_col].data_type.to_arrow();
    let bits: u32 = match &ty {
        ArrowType::Timestamp(TimeUnit::Second, _) => 37,
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => 47,
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => 57,
        _ => 61,
    };
    let mut idx = Vec::new();
    let mut slots = Vec::new();
    let mut expanded = Vec::new();
    for (i, d) in diffs.iter().enumerate().take(output.num_rows()) {
        let hash = sandflow_engine::sketch::hll_hash_bytes(encoded.row(i).data());
        let base = ((hash >> (64 - (bits - COPY_BITS))) << COPY_BITS) as i64;
        let n = counts.value(i).clamp(0, 1 << COPY_BITS);
        for copy in 0..n {
            idx.push(i as u32);
            slots.push(base | copy);
            expanded.push(*d);
        }
    }
    let idx = UInt32Array::from(idx);
    let mut columns = batch
        .columns()
        .iter()
        .map(|c| take(c.as_ref(), &idx, None))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let slots = Arc::new(Int64Array::from(slots)) as ArrayRef;
    columns[slot_col] = cast(&slots, &ty).map_err(|e| e.to_string())?;
    let batch = RecordBatch::try_new(batch.schema(), columns).map_err(|e| e.to_string())?;
    Ok(Some((batch, expanded)))
}

/// Turns output rows (Arrow, in the flow's output schema) and their diffs
/// into sink writes: per sink key, the last row with a positive diff is
/// upserted; a key with only negative diffs is deleted.
pub fn writes(
    table: &Arc<Table>,
    mapping: &[SinkColumn],
    output: &RecordBatch,
    diffs: &[i64],
    tick_ms: i64,
) -> Result<SinkWrites, String> {
    let rows = output.num_rows();
    if rows == 0 {
        return Ok(SinkWrites::default());
    }
    let cols = &table.schema().columns;
    let mut fields = Vec::with_capacity(cols.len());
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(cols.len());
    for (c, m) in cols.iter().zip(mapping) {
        let ty = c.data_type.to_arrow();
        let array: ArrayRef = match m {
            SinkColumn::Output(i) => {
                let a = output
                    .columns()
                    .get(*i)
                    .ok_or_else(|| format!("output has no column {i}"))?;
                cast(a, &ty).map_err(|e| format!("cannot cast column '{}': {e}", c.name))?
            }
            SinkColumn::Null => datafusion::arrow::array::new_null_array(&ty, rows),
            SinkColumn::TickTime | SinkColumn::Zero => {
                let v = if *m == SinkColumn::TickTime {
                    tick_ms
                } else {
                    0
                };
                let ms = Arc::new(Int64Array::from(vec![v; rows])) as ArrayRef;
                let ms = cast(&ms, &ArrowType::Timestamp(TimeUnit::Millisecond, None))
                    .map_err(|e| e.to_string())?;
                cast(&ms, &ty).map_err(|e| format!("cannot fill column '{}': {e}", c.name))?
            }
        };
        fields.push(ArrowField::new(&c.name, ty, true));
        arrays.push(array);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| format!("cannot build sink rows: {e}"))?;
    let copies = copies(table, mapping, output, &batch, diffs)?;
    let (batch, diffs) = match &copies {
        Some((b, d)) => (b, d.as_slice()),
        None => (&batch, diffs),
    };
    let rows = batch.num_rows();
    let keyed = !table.schema().append_mode;
    if keyed && diffs.len() >= rows && diffs.iter().take(rows).all(|d| *d > 0) {
        // Only insertions (a back-fill's, a first tick's) into a table
        // keyed by its primary key: the upsert itself lets the later row
        // of a key win, so there is nothing to net. (An append-mode table
        // would keep both.)
        return Ok(SinkWrites {
            upserts: Some(batch.clone()),
            deletes: None,
        });
    }
    let key_cols: Vec<ArrayRef> = table
        .key_columns
        .iter()
        .map(|&i| batch.column(i).clone())
        .collect();
    let converter = RowConverter::new(
        key_cols
            .iter()
            .map(|a| SortField::new(a.data_type().clone()))
            .collect(),
    )
    .map_err(|e| e.to_string())?;
    let keys = converter
        .convert_columns(&key_cols)
        .map_err(|e| format!("cannot encode sink keys: {e}"))?;
    // Per key, in order of first appearance: (row to upsert, a row to take
    // the key from for a delete). The map holds each key's index.
    let mut index: HashMap<&[u8], u32> = HashMap::with_capacity(rows);
    let mut net: Vec<(Option<u32>, u32)> = Vec::with_capacity(rows);
    for (i, d) in diffs.iter().enumerate().take(rows) {
        let at = *index.entry(keys.row(i).data()).or_insert_with(|| {
            net.push((None, i as u32));
            net.len() as u32 - 1
        });
        if *d > 0 {
            net[at as usize].0 = Some(i as u32);
        }
    }
    let mut up = Vec::new();
    let mut del = Vec::new();
    for (upsert, key_row) in net {
        match upsert {
            Some(i) => up.push(i),
            None => del.push(key_row),
        }
    }
    let pick = |idx: Vec<u32>| -> Result<Option<RecordBatch>, String> {
        if idx.is_empty() {
            return Ok(None);
        }
        let idx = UInt32Array::from(idx);
        let columns = batch
            .columns()
            .iter()
            .map(|c| take(c.as_ref(), &idx, None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        RecordBatch::try_new(batch.schema(), columns)
            .map(Some)
            .map_err(|e| e.to_string())
    };
    Ok(SinkWrites {
        upserts: pick(up)?,
        deletes: pick(del)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::TableInfo;
    use crate::runtime::DataType;
    use datafusion::arrow::array::{Float64Array, StringArray, TimestampMillisecondArray};

    fn f(name: &str, t: DataType) -> Field {
        Field::new(name, t, true)
    }

    fn table(schema: TableSchema) -> Arc<Table> {
        Table::new(TableInfo {
            id: 7,
            database: "public".into(),
            name: "sink".into(),
            schema,
            options: Default::default(),
            version: 0,
            time_first: true,
            description: None,
        })
    }

    #[test]
    fn derived_schemas() {
        let out = vec![
            f("host", DataType::Utf8),
            f("w", DataType::TimestampMillisecond),
            f("c", DataType::Int64),
        ];
        let s = derive_schema(&out, &["host".into(), "w".into()], true, false).unwrap();
        let names: Vec<_> = s.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["host", "w", "c", "update_at"]);
        assert_eq!(s.time_index_column().name, "w");
        assert_eq!(s.primary_key_names(), ["host"]);

        let s = derive_schema(&out[..1], &["host".into()], true, false).unwrap();
        let names: Vec<_> = s.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["host", "update_at", "__ts_placeholder"]);
        assert_eq!(s.time_index_column().name, "__ts_placeholder");

        // Without GROUP BY: first timestamp is the time index, the rest the key.
        let s = derive_schema(&out, &[], false, false).unwrap();
        assert_eq!(s.time_index_column().name, "w");
        assert_eq!(s.primary_key_names(), ["host", "c"]);
    }

    #[test]
    fn lossless_casts() {
        use ColumnType::*;
        assert!(lossless(Int32, Int64));
        assert!(!lossless(Int64, Int32));
        assert!(lossless(UInt32, Int64));
        assert!(!lossless(Int64, Float64));
        assert!(lossless(Int32, Float64));
        assert!(lossless(TimestampMillisecond, TimestampMicrosecond));
        assert!(!lossless(TimestampMicrosecond, TimestampMillisecond));
        assert!(!lossless(Float64, Int32));
        assert!(!lossless(String, Int32));
        assert!(fits_sink(TimestampNanosecond, TimestampMillisecond));
        assert!(!fits_sink(TimestampNanosecond, Date));
        assert!(!fits_sink(Int64, Int32));
    }

    #[test]
    fn fitting_existing_sinks() {
        let out = vec![f("host", DataType::Utf8), f("c", DataType::Int32)];
        let good = TableSchema::new(
            vec![
                ColumnSchema::new("host", ColumnType::String, true),
                ColumnSchema::new("c", ColumnType::Int64, true),
                ColumnSchema::new("updated", ColumnType::TimestampMillisecond, true),
                ColumnSchema::new(TS_PLACEHOLDER, ColumnType::TimestampMillisecond, false),
            ],
            TS_PLACEHOLDER,
            &["host"],
            false,
        )
        .unwrap();
        assert_eq!(
            fit(&table(good), &out).unwrap(),
            vec![
                SinkColumn::Output(0),
                SinkColumn::Output(1),
                SinkColumn::TickTime,
                SinkColumn::Zero
            ]
        );
        // By position: names differ, types agree.
        let renamed = TableSchema::new(
            vec![
                ColumnSchema::new("h", ColumnType::String, true),
                ColumnSchema::new("n", ColumnType::Int32, true),
                ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
            ],
            "ts",
            &["h"],
            false,
        )
        .unwrap();
        // The extra timestamp is the time index: 0, not the tick time, so
        // that an update replaces the row it retracts.
        assert_eq!(
            fit(&table(renamed), &out).unwrap(),
            vec![
                SinkColumn::Output(0),
                SinkColumn::Output(1),
                SinkColumn::Zero
            ]
        );
        let bad = TableSchema::new(
            vec![
                ColumnSchema::new("h", ColumnType::String, true),
                ColumnSchema::new("n", ColumnType::Float32, true),
                ColumnSchema::new("extra", ColumnType::String, false),
                ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
            ],
            "ts",
            &["h"],
            false,
        )
        .unwrap();
        let e = fit(&table(bad), &out).unwrap_err();
        assert!(e.contains("'n'") && e.contains("'extra'"), "{e}");
        // A nullable column the query does not give is NULL.
        let wider = TableSchema::new(
            vec![
                ColumnSchema::new("host", ColumnType::String, true),
                ColumnSchema::new("c", ColumnType::Int32, true),
                ColumnSchema::new("note", ColumnType::String, true),
                ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
            ],
            "ts",
            &["host"],
            false,
        )
        .unwrap();
        assert_eq!(
            fit(&table(wider), &out).unwrap(),
            vec![
                SinkColumn::Output(0),
                SinkColumn::Output(1),
                SinkColumn::Null,
                SinkColumn::Zero
            ]
        );
    }

    #[test]
    fn diffs_become_upserts_and_deletes() {
        let out = vec![
            f("host", DataType::Utf8),
            f("w", DataType::TimestampMillisecond),
            f("v", DataType::Float64),
        ];
        let schema = derive_schema(&out, &["host".into(), "w".into()], true, false).unwrap();
        let t = table(schema);
        let mapping = fit(&t, &out).unwrap();
        let batch = RecordBatch::try_new(
            super::super::arrow::schema_from_fields(&out),
            vec![
                Arc::new(StringArray::from(vec!["a", "a", "b", "c"])),
                Arc::new(TimestampMillisecondArray::from(vec![0, 0, 0, 0])),
                Arc::new(Float64Array::from(vec![1.0, 2.0, 3.0, 4.0])),
            ],
        )
        .unwrap();
        let w = writes(&t, &mapping, &batch, &[-1, 1, -1, 1], 99).unwrap();
        assert_eq!(w.rows(), 3);
        let up = w.upserts.unwrap();
        let del = w.deletes.unwrap();
        assert_eq!(up.num_rows(), 2); // a (new value), c
        assert_eq!(del.num_rows(), 1); // b
        let v = up
            .column(2)
            .as_any()
            .downcast_ref::<Float64Array>()
            .unwrap();
        assert_eq!(v.values(), &[2.0, 4.0]);
        let at = up
            .column(3)
            .as_any()
            .downcast_ref::<TimestampMillisecondArray>()
            .unwrap();
        assert_eq!(at.value(0), 99);
        // Only insertions: every row is upserted as it is (of one key, the
        // store keeps the later), nothing is deleted.
        let upserted = |t: &Arc<Table>| {
            let w = writes(t, &mapping, &batch, &[1, 1, 1, 1], 99).unwrap();
            assert!(w.deletes.is_none());
            let up = w.upserts.unwrap();
            let v = up.column(2).as_any().downcast_ref::<Float64Array>();
            v.unwrap().values().to_vec()
        };
        assert_eq!(upserted(&t), [1.0, 2.0, 3.0, 4.0]);
        // An append-mode sink would keep both rows of a key: there the
        // insertions are still netted to one row a key, the later.
        let mut schema = t.schema().clone();
        schema.append_mode = true;
        let t = table(schema);
        assert_eq!(upserted(&t), [2.0, 3.0, 4.0]);
    }
}
