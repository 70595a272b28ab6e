//! Conversion between Arrow record batches (storage, SQL) and the contract's
//! columnar [`Batch`]es. Column-at-a-time; no per-row values are built.

use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types as at;
use arrow_array::RecordBatch;
use arrow_array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array,
    Int16Array, Int32Array, Int64Array, Int8Array, ListArray, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use arrow_buffer::{NullBuffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType as ArrowType, Field as ArrowField, Schema, SchemaRef, TimeUnit};

use crate::{Batch, Column, DataType, Field};

/// Why a value could not cross between Arrow and a flow.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertError(pub String);

impl std::fmt::Display for ConvertError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn err<T>(message: impl Into<String>) -> Result<T, ConvertError> {
    Err(ConvertError(message.into()))
}

/// The flow type of an Arrow type, if flows support it.
pub fn data_type_from_arrow(t: &ArrowType) -> Option<DataType> {
    Some(match t {
        ArrowType::Boolean => DataType::Boolean,
        ArrowType::Int8 => DataType::Int8,
        ArrowType::Int16 => DataType::Int16,
        ArrowType::Int32 => DataType::Int32,
        ArrowType::Int64 => DataType::Int64,
        ArrowType::UInt8 => DataType::UInt8,
        ArrowType::UInt16 => DataType::UInt16,
        ArrowType::UInt32 => DataType::UInt32,
        ArrowType::UInt64 => DataType::UInt64,
        ArrowType::Float32 => DataType::Float32,
        ArrowType::Float64 => DataType::Float64,
        ArrowType::Utf8 | ArrowType::LargeUtf8 | ArrowType::Utf8View => DataType::Utf8,
        ArrowType::Binary | ArrowType::LargeBinary | ArrowType::BinaryView => DataType::Binary,
        ArrowType::Timestamp(TimeUnit::Second, _) => DataType::TimestampSecond,
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => DataType::TimestampMillisecond,
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => DataType::TimestampMicrosecond,
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => DataType::TimestampNanosecond,
        ArrowType::Date32 => DataType::Date32,
        ArrowType::List(f) | ArrowType::LargeList(f) => {
            DataType::list_of(data_type_from_arrow(f.data_type())?)?
        }
        _ => return None,
    })
}

/// The Arrow type the database stores a flow type as.
pub fn data_type_to_arrow(t: DataType) -> ArrowType {
    match t {
        DataType::Boolean => ArrowType::Boolean,
        DataType::Int8 => ArrowType::Int8,
        DataType::Int16 => ArrowType::Int16,
        DataType::Int32 => ArrowType::Int32,
        DataType::Int64 => ArrowType::Int64,
        DataType::UInt8 => ArrowType::UInt8,
        DataType::UInt16 => ArrowType::UInt16,
        DataType::UInt32 => ArrowType::UInt32,
        DataType::UInt64 => ArrowType::UInt64,
        DataType::Float32 => ArrowType::Float32,
        DataType::Float64 => ArrowType::Float64,
        DataType::Utf8 => ArrowType::Utf8,
        DataType::Binary => ArrowType::Binary,
        DataType::TimestampSecond => ArrowType::Timestamp(TimeUnit::Second, None),
        DataType::TimestampMillisecond => ArrowType::Timestamp(TimeUnit::Millisecond, None),
        DataType::TimestampMicrosecond => ArrowType::Timestamp(TimeUnit::Microsecond, None),
        DataType::TimestampNanosecond => ArrowType::Timestamp(TimeUnit::Nanosecond, None),
        DataType::Date32 => ArrowType::Date32,
        DataType::List(item) => ArrowType::List(Arc::new(ArrowField::new_list_field(
            data_type_to_arrow(*item),
            true,
        ))),
    }
}

/// Flow fields for an Arrow schema; an unsupported column type is an error
/// that names the column.
pub fn fields_from_arrow(schema: &Schema) -> Result<Vec<Field>, ConvertError> {
    schema
        .fields()
        .iter()
        .map(|f| match data_type_from_arrow(f.data_type()) {
            Some(t) => Ok(Field::new(f.name().clone(), t, f.is_nullable())),
            None => err(format!(
                "column {} has type {}, which flows do not support",
                f.name(),
                f.data_type()
            )),
        })
        .collect()
}

/// The Arrow schema for flow fields.
pub fn schema_from_fields(fields: &[Field]) -> SchemaRef {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|f| ArrowField::new(&f.name, data_type_to_arrow(f.data_type), f.nullable))
            .collect::<Vec<_>>(),
    ))
}

fn nulls_of(a: &dyn Array) -> Vec<u8> {
    match a.logical_nulls() {
        Some(n) if n.null_count() > 0 => n.iter().map(|valid| (!valid) as u8).collect(),
        _ => Vec::new(),
    }
}

fn int_column<T: at::ArrowPrimitiveType>(a: &dyn Array, f: impl Fn(T::Native) -> i64) -> Column {
    let p = a.as_primitive::<T>();
    Column {
        ints: p.values().iter().map(|v| f(*v)).collect(),
        nulls: nulls_of(a),
        ..Column::default()
    }
}

fn bytes_column<'a>(
    a: &dyn Array,
    values: impl Iterator<Item = Option<&'a [u8]>>,
) -> Result<Column, ConvertError> {
    let mut bytes = Vec::new();
    let mut offsets = Vec::with_capacity(a.len() + 1);
    offsets.push(0u32);
    for v in values {
        if let Some(v) = v {
            bytes.extend_from_slice(v);
        }
        let Ok(end) = u32::try_from(bytes.len()) else {
            return err(
                "a string or binary column exceeds 4 GiB in one batch; write smaller batches",
            );
        };
        offsets.push(end);
    }
    Ok(Column {
        bytes,
        offsets,
        nulls: nulls_of(a),
        ..Column::default()
    })
}

/// One Arrow column as a contract column of type `t`.
pub fn column_from_arrow(a: &dyn Array, t: DataType) -> Result<Column, ConvertError> {
    let actual = data_type_from_arrow(a.data_type());
    if actual != Some(t) {
        return err(format!(
            "column of Arrow type {} cannot be read as {t}",
            a.data_type()
        ));
    }
    Ok(match a.data_type() {
        ArrowType::Boolean => {
            let b = a.as_boolean();
            Column {
                ints: b.values().iter().map(|v| v as i64).collect(),
                nulls: nulls_of(a),
                ..Column::default()
            }
        }
        ArrowType::Int8 => int_column::<at::Int8Type>(a, i64::from),
        ArrowType::Int16 => int_column::<at::Int16Type>(a, i64::from),
        ArrowType::Int32 => int_column::<at::Int32Type>(a, i64::from),
        ArrowType::Int64 => int_column::<at::Int64Type>(a, |v| v),
        ArrowType::UInt8 => int_column::<at::UInt8Type>(a, i64::from),
        ArrowType::UInt16 => int_column::<at::UInt16Type>(a, i64::from),
        ArrowType::UInt32 => int_column::<at::UInt32Type>(a, i64::from),
        ArrowType::UInt64 => int_column::<at::UInt64Type>(a, |v| v as i64),
        ArrowType::Float32 => Column {
            floats: a
                .as_primitive::<at::Float32Type>()
                .values()
                .iter()
                .map(|v| *v as f64)
                .collect(),
            nulls: nulls_of(a),
            ..Column::default()
        },
        ArrowType::Float64 => Column {
            floats: a.as_primitive::<at::Float64Type>().values().to_vec(),
            nulls: nulls_of(a),
            ..Column::default()
        },
        ArrowType::Utf8 => {
            bytes_column(a, a.as_string::<i32>().iter().map(|v| v.map(str::as_bytes)))?
        }
        ArrowType::LargeUtf8 => {
            bytes_column(a, a.as_string::<i64>().iter().map(|v| v.map(str::as_bytes)))?
        }
        ArrowType::Utf8View => {
            bytes_column(a, a.as_string_view().iter().map(|v| v.map(str::as_bytes)))?
        }
        ArrowType::Binary => bytes_column(a, a.as_binary::<i32>().iter())?,
        ArrowType::LargeBinary => bytes_column(a, a.as_binary::<i64>().iter())?,
        ArrowType::BinaryView => bytes_column(a, a.as_binary_view().iter())?,
        ArrowType::Timestamp(TimeUnit::Second, _) => {
            int_column::<at::TimestampSecondType>(a, |v| v)
        }
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
            int_column::<at::TimestampMillisecondType>(a, |v| v)
        }
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
            int_column::<at::TimestampMicrosecondType>(a, |v| v)
        }
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
            int_column::<at::TimestampNanosecondType>(a, |v| v)
        }
        ArrowType::Date32 => int_column::<at::Date32Type>(a, i64::from),
        ArrowType::List(_) => {
            let l = a.as_list::<i32>();
            let offsets = l.value_offsets().iter().map(|o| *o as usize);
            list_column(a, l.values().as_ref(), offsets.collect(), t)?
        }
        ArrowType::LargeList(_) => {
            let l = a.as_list::<i64>();
            let offsets = l.value_offsets().iter().map(|o| *o as usize);
            list_column(a, l.values().as_ref(), offsets.collect(), t)?
        }
        other => return err(format!("Arrow type {other} is not supported in flows")),
    })
}

/// A list array (`offsets` into its `values`) as a contract list column.
fn list_column(
    a: &dyn Array,
    values: &dyn Array,
    offsets: Vec<usize>,
    t: DataType,
) -> Result<Column, ConvertError> {
    let Some(item) = t.item() else {
        return err(format!("{t} is not a list type"));
    };
    let v = column_from_arrow(values, item)?;
    let valid = a.logical_nulls();
    let mut bytes = Vec::new();
    let mut out = Vec::with_capacity(a.len() + 1);
    out.push(0u32);
    for (row, w) in offsets.windows(2).enumerate() {
        if valid.as_ref().is_none_or(|n| n.is_valid(row)) {
            for j in w[0]..w[1] {
                crate::list::push(&mut bytes, v.item_at(item.storage(), j));
            }
        }
        let Ok(end) = u32::try_from(bytes.len()) else {
            return err("a list column exceeds 4 GiB in one batch; write smaller batches");
        };
        out.push(end);
    }
    Ok(Column {
        bytes,
        offsets: out,
        nulls: nulls_of(a),
        ..Column::default()
    })
}

/// The elements of a validated list column's rows, as one column of the
/// element type, and each row's first element (rows + 1 offsets).
fn list_items(c: &Column, item: DataType, rows: usize) -> Result<(Column, Vec<i32>), ConvertError> {
    let mut items = Column::default();
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0i32);
    let mut nulls = Vec::new();
    if item.storage() == crate::Storage::Bytes {
        items.offsets.push(0);
    }
    for row in 0..rows {
        let elements =
            crate::list::items(item, c.bytes_at(row)).map_err(|e| ConvertError(e.to_string()))?;
        for e in elements {
            nulls.push(matches!(e, crate::list::Item::Null) as u8);
            items.push_item(item.storage(), e);
            if item.storage() == crate::Storage::Bytes {
                let end = u32::try_from(items.bytes.len())
                    .or_else(|_| err("a list column exceeds 4 GiB"))?;
                items.offsets.push(end);
            }
        }
        let end =
            i32::try_from(nulls.len()).or_else(|_| err("a list column has too many elements"))?;
        offsets.push(end);
    }
    if nulls.iter().any(|n| *n != 0) {
        items.nulls = nulls;
    }
    Ok((items, offsets))
}

/// A record batch as diff rows for a flow: `fields` says how each column is
/// read (it must match the batch's columns), every row gets `time` (sent once
/// for the whole batch, as the contract allows), and `diffs` has one entry per
/// row or one for all rows.
pub fn batch_from_arrow(
    rb: &RecordBatch,
    fields: &[Field],
    time: i64,
    diffs: Vec<i64>,
) -> Result<Batch, ConvertError> {
    if rb.num_columns() != fields.len() {
        return err(format!(
            "batch has {} columns, the flow's source {}",
            rb.num_columns(),
            fields.len()
        ));
    }
    if !crate::per_row_len_ok(diffs.len(), rb.num_rows()) {
        return err(format!("{} diffs for {} rows", diffs.len(), rb.num_rows()));
    }
    let rows = u32::try_from(rb.num_rows()).or_else(|_| err("batch has more than 2^32 rows"))?;
    let columns = rb
        .columns()
        .iter()
        .zip(fields)
        .map(|(a, f)| {
            column_from_arrow(a.as_ref(), f.data_type)
                .map_err(|e| ConvertError(format!("{}: {e}", f.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Batch {
        rows,
        columns,
        times: if rows > 0 { vec![time] } else { Vec::new() },
        diffs,
    })
}

fn null_buffer(c: &Column) -> Option<NullBuffer> {
    if c.nulls.iter().any(|n| *n != 0) {
        Some(NullBuffer::from_iter(c.nulls.iter().map(|n| *n == 0)))
    } else {
        None
    }
}

/// One contract column of type `t` as an Arrow array. The column must have
/// been validated (`types::validate_batch`) for `rows` rows.
pub fn column_to_arrow(c: &Column, t: DataType, rows: usize) -> Result<ArrayRef, ConvertError> {
    let nulls = null_buffer(c);
    // Arrow's constructors panic on these; a malformed batch is an error.
    if let Some(n) = &nulls {
        if n.len() != rows {
            return err(format!(
                "{t} column has {} null flags for {rows} rows",
                n.len()
            ));
        }
    }
    let ints = || -> Result<&[i64], ConvertError> {
        match c.ints.get(..rows) {
            Some(v) => Ok(v),
            None => err(format!(
                "{t} column has {} values for {rows} rows",
                c.ints.len()
            )),
        }
    };
    macro_rules! prim {
        ($arr:ty, $conv:expr) => {{
            let values: ScalarBuffer<_> = ints()?.iter().map($conv).collect();
            Arc::new(<$arr>::new(values, nulls)) as ArrayRef
        }};
    }
    Ok(match t {
        DataType::List(item) => {
            if c.offsets.len() != rows + 1 {
                return err(format!(
                    "{t} column has {} offsets for {rows} rows",
                    c.offsets.len()
                ));
            }
            let (items, offsets) = list_items(c, *item, rows)?;
            let values = column_to_arrow(&items, *item, offsets.last().map_or(0, |o| *o as usize))?;
            let field = Arc::new(ArrowField::new_list_field(data_type_to_arrow(*item), true));
            Arc::new(
                ListArray::try_new(
                    field,
                    OffsetBuffer::new(ScalarBuffer::from(offsets)),
                    values,
                    nulls,
                )
                .map_err(|e| ConvertError(e.to_string()))?,
            )
        }
        DataType::Boolean => {
            let b = BooleanArray::new(ints()?.iter().map(|v| *v != 0).collect(), nulls);
            Arc::new(b)
        }
        DataType::Int8 => prim!(Int8Array, |v| *v as i8),
        DataType::Int16 => prim!(Int16Array, |v| *v as i16),
        DataType::Int32 => prim!(Int32Array, |v| *v as i32),
        DataType::Int64 => prim!(Int64Array, |v| *v),
        DataType::UInt8 => prim!(UInt8Array, |v| *v as u8),
        DataType::UInt16 => prim!(UInt16Array, |v| *v as u16),
        DataType::UInt32 => prim!(UInt32Array, |v| *v as u32),
        DataType::UInt64 => prim!(UInt64Array, |v| *v as u64),
        DataType::TimestampSecond => prim!(TimestampSecondArray, |v| *v),
        DataType::TimestampMillisecond => prim!(TimestampMillisecondArray, |v| *v),
        DataType::TimestampMicrosecond => prim!(TimestampMicrosecondArray, |v| *v),
        DataType::TimestampNanosecond => prim!(TimestampNanosecondArray, |v| *v),
        DataType::Date32 => prim!(Date32Array, |v| *v as i32),
        DataType::Float32 | DataType::Float64 => {
            let Some(values) = c.floats.get(..rows) else {
                return err(format!(
                    "{t} column has {} values for {rows} rows",
                    c.floats.len()
                ));
            };
            if t == DataType::Float32 {
                Arc::new(Float32Array::new(
                    values.iter().map(|v| *v as f32).collect(),
                    nulls,
                ))
            } else {
                Arc::new(Float64Array::new(values.iter().copied().collect(), nulls))
            }
        }
        DataType::Utf8 | DataType::Binary => {
            let offsets: Vec<i32> = c
                .offsets
                .iter()
                .map(|o| i32::try_from(*o).or_else(|_| err("string column larger than 2 GiB")))
                .collect::<Result<_, _>>()?;
            if offsets.len() != rows + 1 {
                return err(format!(
                    "{t} column has {} offsets for {rows} rows",
                    offsets.len()
                ));
            }
            if offsets.first().is_some_and(|o| *o < 0) || offsets.windows(2).any(|w| w[0] > w[1]) {
                return err(format!("{t} column has decreasing or negative offsets"));
            }
            let offsets = OffsetBuffer::new(ScalarBuffer::from(offsets));
            let values = c.bytes.clone().into();
            if t == DataType::Utf8 {
                Arc::new(
                    StringArray::try_new(offsets, values, nulls)
                        .map_err(|e| ConvertError(e.to_string()))?,
                )
            } else {
                Arc::new(
                    BinaryArray::try_new(offsets, values, nulls)
                        .map_err(|e| ConvertError(e.to_string()))?,
                )
            }
        }
    })
}

/// A validated contract batch as an Arrow record batch with `fields`' schema.
pub fn batch_to_arrow(b: &Batch, fields: &[Field]) -> Result<RecordBatch, ConvertError> {
    if b.columns.len() != fields.len() {
        return err(format!(
            "batch has {} columns, schema {}",
            b.columns.len(),
            fields.len()
        ));
    }
    let rows = b.rows as usize;
    let arrays = b
        .columns
        .iter()
        .zip(fields)
        .map(|(c, f)| {
            column_to_arrow(c, f.data_type, rows)
                .map_err(|e| ConvertError(format!("{}: {e}", f.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    RecordBatch::try_new(schema_from_fields(fields), arrays)
        .map_err(|e| ConvertError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Column as C;

    fn sample() -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            ArrowField::new("k", ArrowType::Int64, true),
            ArrowField::new("s", ArrowType::Utf8, true),
            ArrowField::new("v", ArrowType::Float64, false),
            ArrowField::new("b", ArrowType::Boolean, true),
            ArrowField::new("u", ArrowType::UInt64, false),
            ArrowField::new(
                "ts",
                ArrowType::Timestamp(TimeUnit::Millisecond, None),
                false,
            ),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None, Some(-3)])),
                Arc::new(StringArray::from(vec![Some("a"), Some("é"), None])),
                Arc::new(Float64Array::from(vec![1.5, -2.0, 0.0])),
                Arc::new(BooleanArray::from(vec![Some(true), None, Some(false)])),
                Arc::new(UInt64Array::from(vec![0, u64::MAX, 7])),
                Arc::new(TimestampMillisecondArray::from(vec![1, 2, 3])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn arrow_batches_round_trip_through_the_contract_format() {
        let rb = sample();
        let fields = fields_from_arrow(&rb.schema()).unwrap();
        let batch = batch_from_arrow(&rb, &fields, 42, vec![1, -1, 1]).unwrap();
        crate::validate_batch(&fields, &batch).unwrap();
        assert_eq!(batch.times, vec![42], "one time for the whole batch");
        assert_eq!(batch.columns[0].nulls, vec![0, 1, 0]);
        assert_eq!(batch.columns[1].offsets, vec![0, 1, 3, 3]);
        assert_eq!(batch.columns[4].ints[1], -1, "u64::MAX travels bit-cast");
        let back = batch_to_arrow(&batch, &fields).unwrap();
        assert_eq!(back, rb);
    }

    #[test]
    fn lists_round_trip_through_the_contract_format_and_bad_ones_are_refused() {
        use arrow_array::builder::{Float64Builder, ListBuilder, StringBuilder};
        let mut ints = ListBuilder::new(Float64Builder::new());
        ints.append_value([Some(1.5), None, Some(-0.0)]);
        ints.append_null();
        ints.append_value([]);
        let mut strs = ListBuilder::new(StringBuilder::new());
        strs.append_value([Some("é"), None]);
        strs.append_value([Some("")]);
        strs.append_null();
        let (ints, strs) = (Arc::new(ints.finish()), Arc::new(strs.finish()));
        let schema = Arc::new(Schema::new(vec![
            ArrowField::new("f", ints.data_type().clone(), true),
            ArrowField::new("s", strs.data_type().clone(), true),
        ]));
        let rb = RecordBatch::try_new(schema, vec![ints, strs]).unwrap();
        let fields = fields_from_arrow(&rb.schema()).unwrap();
        assert_eq!(
            fields[0].data_type,
            DataType::list_of(DataType::Float64).unwrap()
        );
        assert_eq!(fields[1].data_type.to_string(), "List<Utf8>");
        let batch = batch_from_arrow(&rb, &fields, 0, vec![1]).unwrap();
        crate::validate_batch(&fields, &batch).unwrap();
        let rows = batch.to_rows(&fields);
        use crate::Value as V;
        assert_eq!(
            rows[0].0,
            vec![
                V::List(vec![V::Float(1.5), V::Null, V::Float(-0.0)]),
                V::List(vec![V::Str("é".into()), V::Null])
            ]
        );
        assert_eq!(rows[1].0[0], V::Null);
        assert_eq!(rows[2].0[0], V::List(vec![]));
        assert_eq!(batch_to_arrow(&batch, &fields).unwrap(), rb);
        let rebuilt = Batch::from_rows(
            &fields,
            &rows.iter().map(|r| r.0.clone()).collect::<Vec<_>>(),
            &[0; 3],
            &[1; 3],
        )
        .unwrap();
        assert_eq!(rebuilt.columns, batch.columns);
        let (int_list, str_list) = (
            DataType::list_of(DataType::Int64).unwrap(),
            DataType::list_of(DataType::Utf8).unwrap(),
        );
        for (t, bytes, why) in [
            (int_list, vec![2u8], "element flag 2"),
            (int_list, vec![1u8, 0, 0], "ends inside an element"),
            (
                str_list,
                vec![1u8, 5, 0, 0, 0, b'a'],
                "ends inside an element",
            ),
            (str_list, vec![1u8, 1, 0, 0, 0, 0xff], "not UTF-8"),
        ] {
            let b = Batch {
                rows: 1,
                columns: vec![C {
                    offsets: vec![0, bytes.len() as u32],
                    bytes,
                    ..C::default()
                }],
                times: vec![0],
                diffs: vec![1],
            };
            let e = crate::validate_batch(&[Field::new("l", t, true)], &b).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        let small = DataType::list_of(DataType::Int8).unwrap();
        let mut bytes = Vec::new();
        crate::list::push(&mut bytes, crate::list::Item::Int(300));
        assert!(crate::list::items(small, &bytes).is_err(), "300 is no Int8");
        assert_eq!(DataType::list_of(small), None, "no lists of lists");
        assert_eq!(DataType::from_code(small.code()), Some(small));
    }

    #[test]
    fn mismatches_are_errors_not_panics() {
        let rb = sample();
        let fields = fields_from_arrow(&rb.schema()).unwrap();
        assert!(batch_from_arrow(&rb, &fields[..2], 0, vec![1; 3]).is_err());
        assert!(batch_from_arrow(&rb, &fields, 0, vec![1; 2]).is_err());
        let shared = batch_from_arrow(&rb, &fields, 0, vec![-1]).unwrap();
        assert_eq!(
            shared.diffs,
            vec![-1],
            "one diff for all rows is kept as is"
        );
        let short = Batch {
            rows: 2,
            columns: vec![C {
                ints: vec![1],
                ..C::default()
            }],
            times: vec![0, 0],
            diffs: vec![1, 1],
        };
        assert!(batch_to_arrow(&short, &[Field::new("k", DataType::Int64, false)]).is_err());
        let unsupported = Schema::new(vec![ArrowField::new(
            "d",
            ArrowType::Decimal128(10, 2),
            false,
        )]);
        assert!(fields_from_arrow(&unsupported)
            .unwrap_err()
            .0
            .contains("d has type"));
    }
}
