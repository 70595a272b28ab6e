//! The row codec: how a table row becomes a storage key and value and back.
//!
//! Key: the table's key columns (`Table::key_columns`: the time index, then
//! the primary key columns in key order; primary key first for tables made
//! before that order), each in an order-preserving ("memcomparable")
//! encoding, so that byte order equals (time, primary key) order.
//! Append-mode tables add a unique suffix (commit sequence, row number) so
//! equal keys never collide.
//!
//! * nullable key column: `0x00` for NULL, `0x01` + payload otherwise
//! * signed integers, dates, timestamps: 8 bytes big endian, sign bit flipped
//! * unsigned integers: 8 bytes big endian
//! * floats: IEEE bits, all bits flipped when negative, else sign bit flipped
//! * boolean: 1 byte
//! * strings, binary: bytes with `0x00` escaped as `0x00 0xFF`, then `0x00 0x00`
//!
//! Value: a format byte, a NULL bitmap over the value columns (all columns
//! not in the key, in schema order), then each non-NULL cell: zigzag varint
//! for signed integers / dates / timestamps, varint for unsigned, fixed
//! little endian for floats, one byte for booleans, varint length + bytes for
//! strings and binary.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BinaryArray, BinaryBuilder, BooleanArray,
    BooleanBuilder, Date32Builder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, Int8Builder, StringArray, StringBuilder, TimestampMicrosecondBuilder,
    TimestampMillisecondBuilder, TimestampNanosecondBuilder, TimestampSecondBuilder, UInt16Builder,
    UInt32Builder, UInt64Builder, UInt8Builder,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{
    Date32Type, Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type,
    TimestampMicrosecondType, TimestampMillisecondType, TimestampNanosecondType,
    TimestampSecondType, UInt16Type, UInt32Type, UInt64Type, UInt8Type,
};
use datafusion::arrow::record_batch::RecordBatch;

use crate::error::{InternalSnafu, Result};
use crate::schema::{ColumnType, Table};

const VALUE_FORMAT: u8 = 1;

/// One cell read out of an Arrow array.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cell<'a> {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    F32(f32),
    F64(f64),
    Bytes(&'a [u8]),
}

/// Reads cells of one column of a batch whose types equal the table's. The
/// array is looked at once, here, not per cell: a downcast and a call
/// through `dyn Array` for every cell of every row cost as much as encoding
/// the cell.
pub(crate) struct ColumnReader<'a> {
    nulls: Option<&'a NullBuffer>,
    values: Values<'a>,
}

/// A column's values, typed (see [`ColumnReader`]).
enum Values<'a> {
    Bool(&'a BooleanArray),
    I8(&'a [i8]),
    I16(&'a [i16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
    U8(&'a [u8]),
    U16(&'a [u16]),
    U32(&'a [u32]),
    U64(&'a [u64]),
    F32(&'a [f32]),
    F64(&'a [f64]),
    Str(&'a StringArray),
    Bin(&'a BinaryArray),
    /// A list column's rows in the contract's list encoding, which is also
    /// how a list cell is stored.
    List(Option<sandflow_contract::Column>),
    /// An array not of the column's type: every cell reads as NULL (rows
    /// are conformed to their table before they are read).
    Other,
}

/// Cell `row` of `v` made by `f` (NULL past the end).
#[inline]
fn at<T: Copy>(v: &[T], row: usize, f: impl Fn(T) -> Cell<'static>) -> Cell<'static> {
    v.get(row).copied().map_or(Cell::Null, f)
}

fn prim<T: ArrowPrimitiveType>(a: &dyn Array) -> Option<&[T::Native]> {
    a.as_primitive_opt::<T>().map(|p| p.values().as_ref())
}

impl<'a> ColumnReader<'a> {
    pub fn new(array: &'a ArrayRef, ty: ColumnType) -> Self {
        let a = array.as_ref();
        let values = match ty {
            ColumnType::List(_) => Some(Values::List(
                sandflow_contract::arrow::data_type_from_arrow(a.data_type())
                    .and_then(|t| sandflow_contract::arrow::column_from_arrow(a, t).ok()),
            )),
            ColumnType::Boolean => a.as_boolean_opt().map(Values::Bool),
            ColumnType::Int8 => prim::<Int8Type>(a).map(Values::I8),
            ColumnType::Int16 => prim::<Int16Type>(a).map(Values::I16),
            ColumnType::Int32 => prim::<Int32Type>(a).map(Values::I32),
            ColumnType::Int64 => prim::<Int64Type>(a).map(Values::I64),
            ColumnType::UInt8 => prim::<UInt8Type>(a).map(Values::U8),
            ColumnType::UInt16 => prim::<UInt16Type>(a).map(Values::U16),
            ColumnType::UInt32 => prim::<UInt32Type>(a).map(Values::U32),
            ColumnType::UInt64 => prim::<UInt64Type>(a).map(Values::U64),
            ColumnType::Float32 => prim::<Float32Type>(a).map(Values::F32),
            ColumnType::Float64 => prim::<Float64Type>(a).map(Values::F64),
            ColumnType::String => a.as_string_opt::<i32>().map(Values::Str),
            ColumnType::Binary => a.as_binary_opt::<i32>().map(Values::Bin),
            ColumnType::Date => prim::<Date32Type>(a).map(Values::I32),
            ColumnType::TimestampSecond => prim::<TimestampSecondType>(a).map(Values::I64),
            ColumnType::TimestampMillisecond => {
                prim::<TimestampMillisecondType>(a).map(Values::I64)
            }
            ColumnType::TimestampMicrosecond => {
                prim::<TimestampMicrosecondType>(a).map(Values::I64)
            }
            ColumnType::TimestampNanosecond => prim::<TimestampNanosecondType>(a).map(Values::I64),
        };
        ColumnReader {
            nulls: a.nulls(),
            values: values.unwrap_or(Values::Other),
        }
    }

    #[inline]
    pub fn cell(&self, row: usize) -> Cell<'_> {
        if self.nulls.is_some_and(|n| n.is_null(row)) {
            return Cell::Null;
        }
        match &self.values {
            Values::Bool(a) => Cell::Bool(a.value(row)),
            Values::I8(v) => at(v, row, |x: i8| Cell::Int(x as i64)),
            Values::I16(v) => at(v, row, |x: i16| Cell::Int(x as i64)),
            Values::I32(v) => at(v, row, |x: i32| Cell::Int(x as i64)),
            Values::I64(v) => at(v, row, Cell::Int),
            Values::U8(v) => at(v, row, |x: u8| Cell::UInt(x as u64)),
            Values::U16(v) => at(v, row, |x: u16| Cell::UInt(x as u64)),
            Values::U32(v) => at(v, row, |x: u32| Cell::UInt(x as u64)),
            Values::U64(v) => at(v, row, Cell::UInt),
            Values::F32(v) => at(v, row, Cell::F32),
            Values::F64(v) => at(v, row, Cell::F64),
            Values::Str(a) => Cell::Bytes(a.value(row).as_bytes()),
            Values::Bin(a) => Cell::Bytes(a.value(row)),
            Values::List(Some(l)) => Cell::Bytes(l.bytes_at(row)),
            Values::List(None) | Values::Other => Cell::Null,
        }
    }
}

fn corrupt(what: &str) -> crate::error::Error {
    InternalSnafu {
        message: format!("stored row is corrupt ({what}); the data file may be damaged"),
    }
    .build()
}

// ---------------------------------------------------------------- key ---

fn key_cell(cell: Cell<'_>, nullable: bool, out: &mut Vec<u8>) {
    if nullable {
        if matches!(cell, Cell::Null) {
            out.push(0);
            return;
        }
        out.push(1);
    }
    match cell {
        Cell::Null => {}
        Cell::Bool(b) => out.push(b as u8),
        Cell::Int(v) => out.extend_from_slice(&((v as u64) ^ (1 << 63)).to_be_bytes()),
        Cell::UInt(v) => out.extend_from_slice(&v.to_be_bytes()),
        Cell::F32(f) => {
            let bits = f.to_bits();
            let bits = if bits >> 31 == 1 {
                !bits
            } else {
                bits ^ (1 << 31)
            };
            out.extend_from_slice(&bits.to_be_bytes());
        }
        Cell::F64(f) => {
            let bits = f.to_bits();
            let bits = if bits >> 63 == 1 {
                !bits
            } else {
                bits ^ (1 << 63)
            };
            out.extend_from_slice(&bits.to_be_bytes());
        }
        Cell::Bytes(bytes) => {
            for &b in bytes {
                out.push(b);
                if b == 0 {
                    out.push(0xFF);
                }
            }
            out.extend_from_slice(&[0, 0]);
        }
    }
}

/// Encodes the key of `row`: its key columns in key order (no append suffix).
pub(crate) fn encode_key(
    table: &Table,
    readers: &[ColumnReader<'_>],
    row: usize,
    out: &mut Vec<u8>,
) {
    let columns = &table.schema().columns;
    for &c in &table.key_columns {
        key_cell(readers[c].cell(row), columns[c].nullable, out);
    }
}

/// The key prefix of the rows whose first key columns (in key order) equal
/// `values`: one array per column, of the column's type, whose row 0 is the
/// value. Every stored key of such a row starts with it, and no other
/// row's does (strings end in a terminator; the other types have fixed
/// widths).
pub(crate) fn key_prefix(table: &Table, values: &[ArrayRef]) -> Vec<u8> {
    let columns = &table.schema().columns;
    let mut out = Vec::new();
    for (&c, array) in table.key_columns.iter().zip(values) {
        let reader = ColumnReader::new(array, columns[c].data_type);
        key_cell(reader.cell(0), columns[c].nullable, &mut out);
    }
    out
}

/// The key prefix of the rows whose time index is `time` (a count of the
/// column's unit), for a table whose key starts with its time index
/// (`TableInfo::time_first`); None for other tables. Rows with a later
/// time sort after it, rows with an earlier time before it.
pub(crate) fn time_prefix(table: &Table, time: i64) -> Option<Vec<u8>> {
    let index = table.schema().time_index;
    if table.key_columns.first() != Some(&index) {
        return None;
    }
    let mut out = Vec::with_capacity(9);
    key_cell(
        Cell::Int(time),
        table.schema().columns[index].nullable,
        &mut out,
    );
    Some(out)
}

/// For a table keyed by time first (`TableInfo::time_first`): where its
/// primary key starts in a stored key (after the time index), and the
/// encoding of `values` of its leading primary key columns, in key order. A
/// row whose key holds these bytes there belongs to that series. None for
/// other tables.
pub(crate) fn series_prefix(table: &Table, values: &[ArrayRef]) -> Option<(usize, Vec<u8>)> {
    if values.is_empty() {
        return None;
    }
    let at = time_prefix(table, 0)?.len();
    let columns = &table.schema().columns;
    let mut out = Vec::new();
    for (&c, array) in table.key_columns.iter().skip(1).zip(values) {
        let reader = ColumnReader::new(array, columns[c].data_type);
        key_cell(reader.cell(0), columns[c].nullable, &mut out);
    }
    Some((at, out))
}

/// The suffix that makes append-mode keys unique.
pub(crate) fn append_suffix(seq: u64, op: u32, row: u32, out: &mut Vec<u8>) {
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&op.to_be_bytes());
    out.extend_from_slice(&row.to_be_bytes());
}

struct Input<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Input<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| corrupt("truncated"))?;
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn byte(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }
    fn varint(&mut self) -> Result<u64> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= ((b & 0x7F) as u64) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(corrupt("varint too long"))
    }
}

fn decode_key_cell<'s>(
    ty: ColumnType,
    nullable: bool,
    input: &mut Input<'_>,
    scratch: &'s mut Vec<u8>,
) -> Result<Cell<'s>> {
    if nullable && input.byte()? == 0 {
        return Ok(Cell::Null);
    }
    Ok(match ty {
        ColumnType::Boolean => Cell::Bool(input.byte()? != 0),
        ColumnType::UInt8 | ColumnType::UInt16 | ColumnType::UInt32 | ColumnType::UInt64 => {
            Cell::UInt(u64::from_be_bytes(input.array()?))
        }
        ColumnType::Float32 => {
            let bits = u32::from_be_bytes(input.array()?);
            let bits = if bits >> 31 == 1 {
                bits ^ (1 << 31)
            } else {
                !bits
            };
            Cell::F32(f32::from_bits(bits))
        }
        ColumnType::Float64 => {
            let bits = u64::from_be_bytes(input.array()?);
            let bits = if bits >> 63 == 1 {
                bits ^ (1 << 63)
            } else {
                !bits
            };
            Cell::F64(f64::from_bits(bits))
        }
        ColumnType::String | ColumnType::Binary => {
            scratch.clear();
            loop {
                let b = input.byte()?;
                if b != 0 {
                    scratch.push(b);
                    continue;
                }
                match input.byte()? {
                    0xFF => scratch.push(0),
                    0 => break,
                    _ => return Err(corrupt("bad string escape in key")),
                }
            }
            Cell::Bytes(scratch.as_slice())
        }
        _ => Cell::Int((u64::from_be_bytes(input.array()?) ^ (1 << 63)) as i64),
    })
}

// -------------------------------------------------------------- value ---

fn put_varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Encodes the value of `row`: all non-key columns.
pub(crate) fn encode_value(
    table: &Table,
    readers: &[ColumnReader<'_>],
    row: usize,
    out: &mut Vec<u8>,
) {
    out.push(VALUE_FORMAT);
    let n = table.value_columns.len();
    let bitmap_at = out.len();
    out.resize(bitmap_at + n.div_ceil(8), 0);
    for (i, &c) in table.value_columns.iter().enumerate() {
        match readers[c].cell(row) {
            Cell::Null => out[bitmap_at + i / 8] |= 1 << (i % 8),
            Cell::Bool(b) => out.push(b as u8),
            Cell::Int(v) => put_varint(((v << 1) ^ (v >> 63)) as u64, out),
            Cell::UInt(v) => put_varint(v, out),
            Cell::F32(f) => out.extend_from_slice(&f.to_le_bytes()),
            Cell::F64(f) => out.extend_from_slice(&f.to_le_bytes()),
            Cell::Bytes(b) => {
                put_varint(b.len() as u64, out);
                out.extend_from_slice(b);
            }
        }
    }
}

/// Each value column's encoded bytes in `value` (`None`: NULL).
fn value_spans<'a>(table: &Table, value: &'a [u8]) -> Result<Vec<Option<&'a [u8]>>> {
    let columns = &table.schema().columns;
    let mut input = Input {
        bytes: value,
        pos: 0,
    };
    if input.byte()? != VALUE_FORMAT {
        return Err(corrupt("unknown value format"));
    }
    let n = table.value_columns.len();
    let bitmap = input.take(n.div_ceil(8))?;
    let mut spans = Vec::with_capacity(n);
    for (i, &c) in table.value_columns.iter().enumerate() {
        if bitmap[i / 8] & (1 << (i % 8)) != 0 {
            spans.push(None);
        } else {
            let start = input.pos;
            decode_value_cell(columns[c].data_type, &mut input)?;
            spans.push(Some(&value[start..input.pos]));
        }
    }
    Ok(spans)
}

/// The value `merge_mode = 'last_non_null'` keeps when `new` replaces
/// `old` (both encoded values of `table`): each column's value from `new`
/// unless it is NULL there, else from `old`.
pub(crate) fn merge_last_non_null(table: &Table, old: &[u8], new: &[u8]) -> Result<Vec<u8>> {
    let (old, new) = (value_spans(table, old)?, value_spans(table, new)?);
    let n = table.value_columns.len();
    let mut out = Vec::with_capacity(64);
    out.push(VALUE_FORMAT);
    let bitmap_at = out.len();
    out.resize(bitmap_at + n.div_ceil(8), 0);
    for (i, (o, n)) in old.iter().zip(&new).enumerate() {
        match n.or(*o) {
            Some(bytes) => out.extend_from_slice(bytes),
            None => out[bitmap_at + i / 8] |= 1 << (i % 8),
        }
    }
    Ok(out)
}

fn decode_value_cell<'a>(ty: ColumnType, input: &mut Input<'a>) -> Result<Cell<'a>> {
    Ok(match ty {
        ColumnType::Boolean => Cell::Bool(input.byte()? != 0),
        ColumnType::UInt8 | ColumnType::UInt16 | ColumnType::UInt32 | ColumnType::UInt64 => {
            Cell::UInt(input.varint()?)
        }
        ColumnType::Float32 => Cell::F32(f32::from_le_bytes(input.array()?)),
        ColumnType::Float64 => Cell::F64(f64::from_le_bytes(input.array()?)),
        ColumnType::String | ColumnType::Binary | ColumnType::List(_) => {
            let len = input.varint()?;
            let len = usize::try_from(len).map_err(|_| corrupt("length"))?;
            Cell::Bytes(input.take(len)?)
        }
        _ => {
            let z = input.varint()?;
            Cell::Int(((z >> 1) as i64) ^ -((z & 1) as i64))
        }
    })
}

// ------------------------------------------------------------ decoding ---

enum Builder {
    Bool(BooleanBuilder),
    I8(Int8Builder),
    I16(Int16Builder),
    I32(Int32Builder),
    I64(Int64Builder),
    U8(UInt8Builder),
    U16(UInt16Builder),
    U32(UInt32Builder),
    U64(UInt64Builder),
    F32(Float32Builder),
    F64(Float64Builder),
    Str(StringBuilder),
    Bin(BinaryBuilder),
    Date(Date32Builder),
    TsS(TimestampSecondBuilder),
    TsMs(TimestampMillisecondBuilder),
    TsUs(TimestampMicrosecondBuilder),
    TsNs(TimestampNanosecondBuilder),
    /// A list column: the stored (contract) encodings, turned into a list
    /// array when finished.
    List(BinaryBuilder, ColumnType),
}

impl Builder {
    fn new(ty: ColumnType, capacity: usize) -> Builder {
        match ty {
            ColumnType::Boolean => Builder::Bool(BooleanBuilder::with_capacity(capacity)),
            ColumnType::Int8 => Builder::I8(Int8Builder::with_capacity(capacity)),
            ColumnType::Int16 => Builder::I16(Int16Builder::with_capacity(capacity)),
            ColumnType::Int32 => Builder::I32(Int32Builder::with_capacity(capacity)),
            ColumnType::Int64 => Builder::I64(Int64Builder::with_capacity(capacity)),
            ColumnType::UInt8 => Builder::U8(UInt8Builder::with_capacity(capacity)),
            ColumnType::UInt16 => Builder::U16(UInt16Builder::with_capacity(capacity)),
            ColumnType::UInt32 => Builder::U32(UInt32Builder::with_capacity(capacity)),
            ColumnType::UInt64 => Builder::U64(UInt64Builder::with_capacity(capacity)),
            ColumnType::Float32 => Builder::F32(Float32Builder::with_capacity(capacity)),
            ColumnType::Float64 => Builder::F64(Float64Builder::with_capacity(capacity)),
            ColumnType::String => {
                Builder::Str(StringBuilder::with_capacity(capacity, capacity * 8))
            }
            ColumnType::Binary => {
                Builder::Bin(BinaryBuilder::with_capacity(capacity, capacity * 8))
            }
            ColumnType::Date => Builder::Date(Date32Builder::with_capacity(capacity)),
            ColumnType::TimestampSecond => {
                Builder::TsS(TimestampSecondBuilder::with_capacity(capacity))
            }
            ColumnType::TimestampMillisecond => {
                Builder::TsMs(TimestampMillisecondBuilder::with_capacity(capacity))
            }
            ColumnType::TimestampMicrosecond => {
                Builder::TsUs(TimestampMicrosecondBuilder::with_capacity(capacity))
            }
            ColumnType::TimestampNanosecond => {
                Builder::TsNs(TimestampNanosecondBuilder::with_capacity(capacity))
            }
            ColumnType::List(_) => Builder::List(BinaryBuilder::with_capacity(capacity, 0), ty),
        }
    }

    fn push(&mut self, cell: Cell<'_>) -> Result<()> {
        macro_rules! put {
            ($b:expr, $v:expr) => {
                $b.append_value($v)
            };
        }
        let int = || match cell {
            Cell::Int(v) => Ok(v),
            _ => Err(corrupt("expected an integer")),
        };
        let uint = || match cell {
            Cell::UInt(v) => Ok(v),
            _ => Err(corrupt("expected an unsigned integer")),
        };
        if matches!(cell, Cell::Null) {
            match self {
                Builder::Bool(b) => b.append_null(),
                Builder::I8(b) => b.append_null(),
                Builder::I16(b) => b.append_null(),
                Builder::I32(b) => b.append_null(),
                Builder::I64(b) => b.append_null(),
                Builder::U8(b) => b.append_null(),
                Builder::U16(b) => b.append_null(),
                Builder::U32(b) => b.append_null(),
                Builder::U64(b) => b.append_null(),
                Builder::F32(b) => b.append_null(),
                Builder::F64(b) => b.append_null(),
                Builder::Str(b) => b.append_null(),
                Builder::Bin(b) => b.append_null(),
                Builder::Date(b) => b.append_null(),
                Builder::TsS(b) => b.append_null(),
                Builder::TsMs(b) => b.append_null(),
                Builder::TsUs(b) => b.append_null(),
                Builder::TsNs(b) => b.append_null(),
                Builder::List(b, _) => b.append_null(),
            }
            return Ok(());
        }
        match self {
            Builder::Bool(b) => match cell {
                Cell::Bool(v) => b.append_value(v),
                _ => return Err(corrupt("expected a boolean")),
            },
            Builder::I8(b) => put!(b, int()? as i8),
            Builder::I16(b) => put!(b, int()? as i16),
            Builder::I32(b) => put!(b, int()? as i32),
            Builder::I64(b) => put!(b, int()?),
            Builder::U8(b) => put!(b, uint()? as u8),
            Builder::U16(b) => put!(b, uint()? as u16),
            Builder::U32(b) => put!(b, uint()? as u32),
            Builder::U64(b) => put!(b, uint()?),
            Builder::F32(b) => match cell {
                Cell::F32(v) => b.append_value(v),
                _ => return Err(corrupt("expected a float")),
            },
            Builder::F64(b) => match cell {
                Cell::F64(v) => b.append_value(v),
                _ => return Err(corrupt("expected a double")),
            },
            Builder::Str(b) => match cell {
                Cell::Bytes(v) => {
                    b.append_value(std::str::from_utf8(v).map_err(|_| corrupt("invalid UTF-8"))?)
                }
                _ => return Err(corrupt("expected a string")),
            },
            Builder::Bin(b) | Builder::List(b, _) => match cell {
                Cell::Bytes(v) => b.append_value(v),
                _ => return Err(corrupt("expected bytes")),
            },
            Builder::Date(b) => put!(b, int()? as i32),
            Builder::TsS(b) => put!(b, int()?),
            Builder::TsMs(b) => put!(b, int()?),
            Builder::TsUs(b) => put!(b, int()?),
            Builder::TsNs(b) => put!(b, int()?),
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<ArrayRef> {
        if let Builder::List(b, ty) = self {
            use sandflow_contract::arrow::{
                column_from_arrow, column_to_arrow, data_type_from_arrow,
            };
            let encoded = b.finish();
            let t = data_type_from_arrow(&ty.to_arrow()).ok_or_else(|| corrupt("list type"))?;
            let column = column_from_arrow(&encoded, sandflow_contract::DataType::Binary)
                .map_err(|e| corrupt(&e.0))?;
            return column_to_arrow(&column, t, encoded.len()).map_err(|e| corrupt(&e.0));
        }
        Ok(match self {
            Builder::Bool(b) => Arc::new(b.finish()),
            Builder::I8(b) => Arc::new(b.finish()),
            Builder::I16(b) => Arc::new(b.finish()),
            Builder::I32(b) => Arc::new(b.finish()),
            Builder::I64(b) => Arc::new(b.finish()),
            Builder::U8(b) => Arc::new(b.finish()),
            Builder::U16(b) => Arc::new(b.finish()),
            Builder::U32(b) => Arc::new(b.finish()),
            Builder::U64(b) => Arc::new(b.finish()),
            Builder::F32(b) => Arc::new(b.finish()),
            Builder::F64(b) => Arc::new(b.finish()),
            Builder::Str(b) => Arc::new(b.finish()),
            Builder::Bin(b) => Arc::new(b.finish()),
            Builder::Date(b) => Arc::new(b.finish()),
            Builder::TsS(b) => Arc::new(b.finish()),
            Builder::TsMs(b) => Arc::new(b.finish()),
            Builder::TsUs(b) => Arc::new(b.finish()),
            Builder::TsNs(b) => Arc::new(b.finish()),
            Builder::List(..) => return Err(corrupt("list column")),
        })
    }
}

/// Turns stored (key, value) pairs back into Arrow rows of the table schema.
pub(crate) struct RowDecoder<'t> {
    table: &'t Table,
    builders: Vec<Builder>,
    rows: usize,
    scratch: Vec<u8>,
}

impl<'t> RowDecoder<'t> {
    pub fn new(table: &'t Table, capacity: usize) -> Self {
        let builders = table
            .schema()
            .columns
            .iter()
            .map(|c| Builder::new(c.data_type, capacity))
            .collect();
        RowDecoder {
            table,
            builders,
            rows: 0,
            scratch: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn push(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let columns = &self.table.schema().columns;
        let mut input = Input { bytes: key, pos: 0 };
        for &c in &self.table.key_columns {
            let col = &columns[c];
            let cell = decode_key_cell(col.data_type, col.nullable, &mut input, &mut self.scratch)?;
            self.builders[c].push(cell)?;
        }
        let mut input = Input {
            bytes: value,
            pos: 0,
        };
        if input.byte()? != VALUE_FORMAT {
            return Err(corrupt("unknown value format"));
        }
        let n = self.table.value_columns.len();
        let bitmap = input.take(n.div_ceil(8))?;
        for (i, &c) in self.table.value_columns.iter().enumerate() {
            let cell = if bitmap[i / 8] & (1 << (i % 8)) != 0 {
                Cell::Null
            } else {
                decode_value_cell(columns[c].data_type, &mut input)?
            };
            self.builders[c].push(cell)?;
        }
        self.rows += 1;
        Ok(())
    }

    /// Finishes the rows pushed so far into a batch and starts a new one.
    pub fn finish(&mut self) -> Result<RecordBatch> {
        let arrays = self
            .builders
            .iter_mut()
            .map(|b| b.finish())
            .collect::<Result<Vec<ArrayRef>>>()?;
        self.rows = 0;
        RecordBatch::try_new(self.table.arrow_schema.clone(), arrays).map_err(|e| {
            InternalSnafu {
                message: format!("cannot assemble rows: {e}"),
            }
            .build()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{ColumnSchema, TableInfo, TableSchema};
    use datafusion::arrow::array::{
        Float64Array, Int32Array, StringArray, TimestampMillisecondArray,
    };

    fn table(time_first: bool) -> Arc<Table> {
        let schema = TableSchema::new(
            vec![
                ColumnSchema::new("host", ColumnType::String, true),
                ColumnSchema::new("v", ColumnType::Float64, true),
                ColumnSchema::new("n", ColumnType::Int32, true),
                ColumnSchema::new("ts", ColumnType::TimestampMillisecond, false),
            ],
            "ts",
            &["host"],
            false,
        )
        .unwrap();
        Table::new(TableInfo {
            id: 1,
            database: "public".into(),
            name: "t".into(),
            schema,
            options: Default::default(),
            version: 0,
            time_first,
            description: None,
        })
    }

    #[test]
    fn round_trip_and_order() {
        // Time first: by time, then host. Before: by host, then time.
        for (time_first, expected) in [(true, [3, 1, 2, 0]), (false, [1, 3, 2, 0])] {
            round_trip_and_order_of(table(time_first), expected);
        }
    }

    fn round_trip_and_order_of(t: Arc<Table>, expected: [usize; 4]) {
        let batch = RecordBatch::try_new(
            t.arrow_schema.clone(),
            vec![
                Arc::new(StringArray::from(vec![
                    Some("b"),
                    None,
                    Some("a\0x"),
                    Some("a"),
                ])),
                Arc::new(Float64Array::from(vec![
                    Some(-1.5),
                    None,
                    Some(2.0),
                    Some(f64::MAX),
                ])),
                Arc::new(Int32Array::from(vec![
                    Some(-7),
                    Some(i32::MAX),
                    None,
                    Some(0),
                ])),
                Arc::new(TimestampMillisecondArray::from(vec![5, -3, 0, i64::MIN])),
            ],
        )
        .unwrap();
        let readers: Vec<_> = batch
            .columns()
            .iter()
            .zip(&t.schema().columns)
            .map(|(a, c)| ColumnReader::new(a, c.data_type))
            .collect();
        let mut entries = Vec::new();
        for row in 0..batch.num_rows() {
            let (mut k, mut v) = (Vec::new(), Vec::new());
            encode_key(&t, &readers, row, &mut k);
            encode_value(&t, &readers, row, &mut v);
            entries.push((k, v, row));
        }
        let mut dec = RowDecoder::new(&t, 4);
        for (k, v, _) in &entries {
            dec.push(k, v).unwrap();
        }
        assert_eq!(dec.finish().unwrap(), batch);
        entries.sort();
        let order: Vec<usize> = entries.iter().map(|e| e.2).collect();
        // Host: NULL first, then "a", "a\0x", "b". Time: MIN, -3, 0, 5.
        assert_eq!(order, expected);
    }
}
