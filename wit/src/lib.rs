//! The contract between sandflow's host and a flow guest, in Rust: the
//! columnar [`Batch`] of diff rows, [`Field`]s and [`DataType`]s as
//! `wit/flow.wit` defines them, [`validate_batch`] (the one definition of a
//! well-formed batch, which the host applies to whatever a guest returns and
//! the engine to whatever it is given), row helpers, and with the `arrow`
//! feature the one mapping between Arrow record batches and batches.
//!
//! Must not know the engine, the sandbox, SQL or storage: a guest that is not
//! sandflow's own engine is checked by this crate alone.

#[cfg(feature = "arrow")]
pub mod arrow;

/// The `create` option that drops windows older than this many milliseconds
/// before the tick time (a flow's `EXPIRE AFTER`).
pub const OPTION_EXPIRE_AFTER_MS: &str = "expire-after-ms";

// The native mirror of the WIT `types` interface, plus row-oriented helpers for tests and hosts.

use std::fmt;

/// Logical column types (see `wit/flow.wit` for how each travels in a [`Column`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Boolean,
    Int8,
    Int16,
    Int32,
    Int64,
    UInt8,
    UInt16,
    UInt32,
    UInt64,
    Float32,
    Float64,
    Utf8,
    Binary,
    TimestampSecond,
    TimestampMillisecond,
    TimestampMicrosecond,
    TimestampNanosecond,
    Date32,
    /// A list whose elements (which may be NULL) are of a scalar type, e.g.
    /// `array_agg`'s result. Built with [`DataType::list_of`]. Travels as
    /// bytes, each row's elements encoded as [`list`] describes.
    List(&'static DataType),
}

/// The scalar types, at a `'static` address for [`DataType::List`].
static SCALARS: [DataType; 18] = DataType::ALL;

/// How values of a type are stored in a [`Column`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    Ints,
    Floats,
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 18] = [
        DataType::Boolean,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::UInt16,
        DataType::UInt32,
        DataType::UInt64,
        DataType::Float32,
        DataType::Float64,
        DataType::Utf8,
        DataType::Binary,
        DataType::TimestampSecond,
        DataType::TimestampMillisecond,
        DataType::TimestampMicrosecond,
        DataType::TimestampNanosecond,
        DataType::Date32,
    ];

    pub fn storage(self) -> Storage {
        match self {
            DataType::Float32 | DataType::Float64 => Storage::Floats,
            DataType::Utf8 | DataType::Binary | DataType::List(_) => Storage::Bytes,
            _ => Storage::Ints,
        }
    }

    /// The list of `item`s; `None` when `item` is itself a list.
    pub fn list_of(item: DataType) -> Option<DataType> {
        match item {
            DataType::List(_) => None,
            t => SCALARS.get(t.code() as usize).map(DataType::List),
        }
    }

    /// The element type of a list type.
    pub fn item(self) -> Option<DataType> {
        match self {
            DataType::List(t) => Some(*t),
            _ => None,
        }
    }

    /// A byte naming the type (snapshots): a scalar's index in
    /// [`DataType::ALL`], a list's `0x80` + its element's.
    pub fn code(self) -> u8 {
        match self {
            DataType::List(t) => 0x80 | t.code(),
            t => DataType::ALL.iter().position(|a| *a == t).unwrap_or(0) as u8,
        }
    }

    pub fn from_code(code: u8) -> Option<DataType> {
        if code & 0x80 != 0 {
            return DataType::list_of(DataType::from_code(code & 0x7f)?);
        }
        DataType::ALL.get(code as usize).copied()
    }

    pub fn is_timestamp(self) -> bool {
        matches!(
            self,
            DataType::TimestampSecond
                | DataType::TimestampMillisecond
                | DataType::TimestampMicrosecond
                | DataType::TimestampNanosecond
        )
    }

    pub fn is_signed_int(self) -> bool {
        matches!(
            self,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64
        )
    }

    pub fn is_unsigned_int(self) -> bool {
        matches!(
            self,
            DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64
        )
    }

    pub fn is_integer(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    pub fn is_float(self) -> bool {
        matches!(self, DataType::Float32 | DataType::Float64)
    }

    pub fn is_numeric(self) -> bool {
        self.is_integer() || self.is_float()
    }

    /// Nanoseconds per unit of a timestamp type.
    pub fn timestamp_unit_nanos(self) -> Option<i64> {
        match self {
            DataType::TimestampSecond => Some(1_000_000_000),
            DataType::TimestampMillisecond => Some(1_000_000),
            DataType::TimestampMicrosecond => Some(1_000),
            DataType::TimestampNanosecond => Some(1),
            _ => None,
        }
    }

    /// Whether [`DataType::wrap_int`] can change a value (false for the 64-bit types).
    pub fn wraps(self) -> bool {
        matches!(
            self,
            DataType::Boolean
                | DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::Date32
        )
    }

    /// Wraps an integer to this type's width (two's complement), as Arrow's wrapping kernels do.
    pub fn wrap_int(self, v: i64) -> i64 {
        match self {
            DataType::Boolean => (v != 0) as i64,
            DataType::Int8 => v as i8 as i64,
            DataType::Int16 => v as i16 as i64,
            DataType::Int32 => v as i32 as i64,
            DataType::UInt8 => v as u8 as i64,
            DataType::UInt16 => v as u16 as i64,
            DataType::UInt32 => v as u32 as i64,
            DataType::Date32 => v as i32 as i64,
            _ => v,
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataType::List(t) => write!(f, "List<{t}>"),
            t => fmt::Debug::fmt(t, f),
        }
    }
}

/// The encoding of a list value: its elements in order, each one byte 0
/// (NULL) or 1 (a value) followed for a value by 8 bytes little endian (the
/// integer or float the element's type carries in a column) or, for utf8 and
/// binary elements, a u32 little-endian length and the bytes.
pub mod list {
    use super::{bad, DataType, FlowError, Storage};

    /// One value as a column carries it (its storage's integer, float or
    /// bytes, or NULL): a column's cell, or an element of a list value.
    #[derive(Debug, Clone, Copy, PartialEq)]
    pub enum Item<'a> {
        Null,
        Int(i64),
        Float(f64),
        Bytes(&'a [u8]),
    }

    /// Appends one element.
    pub fn push(out: &mut Vec<u8>, item: Item<'_>) {
        match item {
            Item::Null => out.push(0),
            Item::Int(v) => {
                out.push(1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Item::Float(v) => {
                out.push(1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Item::Bytes(b) => {
                out.push(1);
                out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                out.extend_from_slice(b);
            }
        }
    }

    /// The elements of one list value of `item`s, checked: each is complete,
    /// utf8 elements are UTF-8, integers fit their type.
    pub fn items(item: DataType, mut bytes: &[u8]) -> Result<Vec<Item<'_>>, FlowError> {
        let mut out = Vec::new();
        let short = || bad(format!("a list of {item} ends inside an element"));
        while let Some((&flag, rest)) = bytes.split_first() {
            bytes = rest;
            if flag == 0 {
                out.push(Item::Null);
                continue;
            }
            if flag != 1 {
                return Err(bad(format!("a list of {item} has an element flag {flag}")));
            }
            let (v, rest) = match item.storage() {
                Storage::Ints | Storage::Floats => {
                    let (b, rest) = bytes.split_first_chunk::<8>().ok_or_else(short)?;
                    let v = if item.storage() == Storage::Floats {
                        Item::Float(f64::from_le_bytes(*b))
                    } else {
                        let i = i64::from_le_bytes(*b);
                        if item.wrap_int(i) != i || (item == DataType::Boolean && i != 1 && i != 0)
                        {
                            return Err(bad(format!(
                                "a list element {i} is out of range for {item}"
                            )));
                        }
                        Item::Int(i)
                    };
                    (v, rest)
                }
                Storage::Bytes => {
                    let (len, rest) = bytes.split_first_chunk::<4>().ok_or_else(short)?;
                    let len = u32::from_le_bytes(*len) as usize;
                    let b = rest.get(..len).ok_or_else(short)?;
                    if item == DataType::Utf8 && std::str::from_utf8(b).is_err() {
                        return Err(bad("a list of Utf8 has an element that is not UTF-8"));
                    }
                    (Item::Bytes(b), &rest[len..])
                }
            };
            out.push(v);
            bytes = rest;
        }
        Ok(out)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Field {
    pub name: String,
    /// For a list, [`DataType::List`] names the element type (the WIT
    /// record's `item`).
    pub data_type: DataType,
    pub nullable: bool,
}

impl Field {
    pub fn new(name: impl Into<String>, data_type: DataType, nullable: bool) -> Field {
        Field {
            name: name.into(),
            data_type,
            nullable,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSchema {
    pub name: String,
    pub fields: Vec<Field>,
}

/// One column of a batch; only the list matching the column's type is filled.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Column {
    pub ints: Vec<i64>,
    pub floats: Vec<f64>,
    pub bytes: Vec<u8>,
    pub offsets: Vec<u32>,
    pub nulls: Vec<u8>,
}

impl Column {
    pub fn is_null(&self, i: usize) -> bool {
        self.nulls.get(i).is_some_and(|n| *n != 0)
    }

    /// Bytes of row `i` of a utf8/binary column (empty when out of range).
    pub fn bytes_at(&self, i: usize) -> &[u8] {
        let (Some(&s), Some(&e)) = (self.offsets.get(i), self.offsets.get(i + 1)) else {
            return &[];
        };
        self.bytes.get(s as usize..e as usize).unwrap_or(&[])
    }

    /// Row `i` of a column of `storage` as one value (NULL when flagged;
    /// a missing slot reads as 0 or empty).
    pub fn item_at(&self, storage: Storage, i: usize) -> list::Item<'_> {
        if self.is_null(i) {
            return list::Item::Null;
        }
        match storage {
            Storage::Ints => list::Item::Int(self.ints.get(i).copied().unwrap_or(0)),
            Storage::Floats => list::Item::Float(self.floats.get(i).copied().unwrap_or(0.0)),
            Storage::Bytes => list::Item::Bytes(self.bytes_at(i)),
        }
    }

    /// Appends one value to a column of `storage`, without its null flag
    /// (a NULL takes a 0 slot) and, for bytes, without its end offset.
    pub fn push_item(&mut self, storage: Storage, item: list::Item<'_>) {
        match (storage, item) {
            (Storage::Ints, list::Item::Int(v)) => self.ints.push(v),
            (Storage::Ints, _) => self.ints.push(0),
            (Storage::Floats, list::Item::Float(v)) => self.floats.push(v),
            (Storage::Floats, _) => self.floats.push(0.0),
            (Storage::Bytes, list::Item::Bytes(b)) => self.bytes.extend_from_slice(b),
            (Storage::Bytes, _) => {}
        }
    }

    pub fn approx_bytes(&self) -> usize {
        self.ints.len() * 8
            + self.floats.len() * 8
            + self.bytes.len()
            + self.offsets.len() * 4
            + self.nulls.len()
    }
}

/// A batch of diff rows: row i is (columns[..][i], times[i], diffs[i]). `times` and `diffs`
/// each have one entry per row, or (when `rows > 0`) a single entry that holds for every row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    pub rows: u32,
    pub columns: Vec<Column>,
    pub times: Vec<i64>,
    pub diffs: Vec<i64>,
}

/// Entry `i` of a per-row list that may hold a single entry for every row.
#[inline]
pub fn per_row(v: &[i64], i: usize) -> i64 {
    match v {
        [one] => *one,
        _ => v.get(i).copied().unwrap_or(0),
    }
}

/// Whether a per-row list of `len` entries fits `rows` rows (one each, or one for all).
pub fn per_row_len_ok(len: usize, rows: usize) -> bool {
    len == rows || (len == 1 && rows > 0)
}

/// A per-row list with one entry per row (expanding a single shared entry).
pub fn expand_per_row(v: Vec<i64>, rows: usize) -> Vec<i64> {
    match v.as_slice() {
        [one] if rows != 1 => vec![*one; rows],
        _ => v,
    }
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct TickOutput {
    pub output: Batch,
    pub more: bool,
    pub next_wakeup: Option<i64>,
}

impl TickOutput {
    /// Gives the output batch one time and one diff per row, as a host
    /// expects after checking it (the contract lets a guest send one entry
    /// for all rows).
    pub fn expand(&mut self) {
        let rows = self.output.rows as usize;
        let b = &mut self.output;
        b.times = expand_per_row(std::mem::take(&mut b.times), rows);
        b.diffs = expand_per_row(std::mem::take(&mut b.diffs), rows);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowError {
    BadInput(String),
    Unsupported(String),
    LimitExceeded(String),
    Internal(String),
}

impl fmt::Display for FlowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowError::BadInput(m) => write!(f, "bad input: {m}"),
            FlowError::Unsupported(m) => write!(f, "unsupported: {m}"),
            FlowError::LimitExceeded(m) => write!(f, "limit exceeded: {m}"),
            FlowError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for FlowError {}

/// A `bad-input` error.
pub fn bad(msg: impl Into<String>) -> FlowError {
    FlowError::BadInput(msg.into())
}

/// An `unsupported` error.
pub fn unsupported(msg: impl Into<String>) -> FlowError {
    FlowError::Unsupported(msg.into())
}

/// An `internal` error.
pub fn internal(msg: impl Into<String>) -> FlowError {
    FlowError::Internal(msg.into())
}

/// A row-oriented value, for building and reading batches in tests and hosts.
///
/// Booleans read back as `Bool`, signed integers, timestamps and dates as `Int`,
/// unsigned integers as `UInt`, floats as `Float`, utf8 as `Str`, binary as `Bytes`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    /// A list's elements.
    List(Vec<Value>),
}

/// How a value of the scalar type `ty` is carried (see [`list::Item`]); None
/// when `v` does not fit the type.
fn scalar_item(ty: DataType, v: &Value) -> Option<list::Item<'_>> {
    use list::Item;
    Some(match (ty.storage(), v) {
        (_, Value::Null) => Item::Null,
        (Storage::Ints, Value::Bool(b)) => Item::Int(*b as i64),
        (Storage::Ints, Value::Int(i)) => Item::Int(ty.wrap_int(*i)),
        (Storage::Ints, Value::UInt(u)) => Item::Int(ty.wrap_int(*u as i64)),
        (Storage::Floats, Value::Float(x)) => Item::Float(*x),
        (Storage::Floats, Value::Int(i)) => Item::Float(*i as f64),
        (Storage::Floats, Value::UInt(u)) => Item::Float(*u as f64),
        (Storage::Bytes, Value::Str(s)) => Item::Bytes(s.as_bytes()),
        (Storage::Bytes, Value::Bytes(b)) => Item::Bytes(b),
        _ => return None,
    })
}

/// The value a scalar of type `ty` carried as `item` reads as: booleans as
/// `Bool`, unsigned integers as `UInt`, other integers, timestamps and dates
/// as `Int`, utf8 as `Str`.
fn item_value(ty: DataType, item: list::Item<'_>) -> Value {
    use list::Item;
    match item {
        Item::Null => Value::Null,
        Item::Int(v) if ty == DataType::Boolean => Value::Bool(v != 0),
        Item::Int(v) if ty.is_unsigned_int() => Value::UInt(v as u64),
        Item::Int(v) => Value::Int(v),
        Item::Float(v) => Value::Float(v),
        Item::Bytes(b) if ty == DataType::Utf8 => {
            Value::Str(String::from_utf8_lossy(b).into_owned())
        }
        Item::Bytes(b) => Value::Bytes(b.to_vec()),
    }
}

impl Batch {
    /// Builds a batch from rows of values (one `Vec<Value>` per row, in `fields` order).
    pub fn from_rows(
        fields: &[Field],
        rows: &[Vec<Value>],
        times: &[i64],
        diffs: &[i64],
    ) -> Result<Batch, FlowError> {
        if times.len() != rows.len() || diffs.len() != rows.len() {
            return Err(bad("rows, times and diffs must have the same length"));
        }
        let n = u32::try_from(rows.len()).map_err(|_| bad("too many rows"))?;
        let mut columns: Vec<Column> = fields.iter().map(|_| Column::default()).collect();
        for (ci, (f, col)) in fields.iter().zip(columns.iter_mut()).enumerate() {
            let any_null = rows
                .iter()
                .any(|r| matches!(r.get(ci), Some(Value::Null) | None));
            if any_null {
                col.nulls = Vec::with_capacity(rows.len());
            }
            if f.data_type.storage() == Storage::Bytes {
                col.offsets.push(0);
            }
            for r in rows {
                if r.len() != fields.len() {
                    return Err(bad(format!(
                        "row has {} values, schema has {} fields",
                        r.len(),
                        fields.len()
                    )));
                }
                let v = r.get(ci).unwrap_or(&Value::Null);
                if any_null {
                    col.nulls.push(matches!(v, Value::Null) as u8);
                }
                let storage = f.data_type.storage();
                match (v, f.data_type.item()) {
                    (Value::List(items), Some(item)) => {
                        for v in items {
                            let it = scalar_item(item, v).ok_or_else(|| {
                                bad(format!("value {v:?} does not fit a list of {item}"))
                            })?;
                            list::push(&mut col.bytes, it);
                        }
                    }
                    _ => {
                        let it = scalar_item(f.data_type, v).ok_or_else(|| {
                            bad(format!(
                                "value {v:?} does not fit column {} of type {}",
                                f.name, f.data_type
                            ))
                        })?;
                        col.push_item(storage, it);
                    }
                }
                if storage == Storage::Bytes {
                    let off = u32::try_from(col.bytes.len())
                        .map_err(|_| bad("column bytes exceed 4 GiB"))?;
                    col.offsets.push(off);
                }
            }
        }
        Ok(Batch {
            rows: n,
            columns,
            times: times.to_vec(),
            diffs: diffs.to_vec(),
        })
    }

    /// Reads a batch back as rows: (values, time, diff).
    pub fn to_rows(&self, fields: &[Field]) -> Vec<(Vec<Value>, i64, i64)> {
        let n = self.rows as usize;
        (0..n)
            .map(|i| {
                let vals = fields
                    .iter()
                    .zip(self.columns.iter())
                    .map(|(f, c)| value_at(f.data_type, c, i))
                    .collect();
                (vals, per_row(&self.times, i), per_row(&self.diffs, i))
            })
            .collect()
    }
}

/// Reads one value of a column as a [`Value`].
pub fn value_at(ty: DataType, c: &Column, i: usize) -> Value {
    match ty.item() {
        Some(item) if !c.is_null(i) => Value::List(
            list::items(item, c.bytes_at(i))
                .unwrap_or_default()
                .into_iter()
                .map(|it| item_value(item, it))
                .collect(),
        ),
        _ => item_value(ty, c.item_at(ty.storage(), i)),
    }
}

/// Checks that the bytes of a utf8 column (which end exactly at its last offset) are UTF-8
/// and that no offset splits a character: one pass over the blob plus one check per row.
fn check_utf8(name: &str, bytes: &[u8], offsets: &[u32]) -> Result<(), FlowError> {
    // The row holding byte `pos`.
    let row_at = |pos: usize| {
        offsets
            .partition_point(|o| *o as usize <= pos)
            .saturating_sub(1)
    };
    let s = std::str::from_utf8(bytes).map_err(|e| {
        bad(format!(
            "column {name}: row {} is not valid UTF-8",
            row_at(e.valid_up_to())
        ))
    })?;
    match offsets
        .iter()
        .position(|o| !s.is_char_boundary(*o as usize))
    {
        Some(i) => Err(bad(format!(
            "column {name}: row {} is not valid UTF-8 (an offset splits a character)",
            i.saturating_sub(1)
        ))),
        None => Ok(()),
    }
}

/// Checks that a batch matches `fields` exactly as the WIT contract describes.
///
/// The bytes of a utf8/binary column are exactly the rows' bytes: they end at the last offset
/// (as every producer builds them, and as Arrow checks a whole utf8 buffer).
pub fn validate_batch(fields: &[Field], b: &Batch) -> Result<(), FlowError> {
    let n = b.rows as usize;
    if b.columns.len() != fields.len() {
        return Err(bad(format!(
            "batch has {} columns, source has {}",
            b.columns.len(),
            fields.len()
        )));
    }
    if !per_row_len_ok(b.times.len(), n) || !per_row_len_ok(b.diffs.len(), n) {
        return Err(bad(format!(
            "batch of {n} rows has {} times and {} diffs (give one per row, or one for all rows)",
            b.times.len(),
            b.diffs.len()
        )));
    }
    for (f, c) in fields.iter().zip(b.columns.iter()) {
        let name = &f.name;
        if !(c.nulls.is_empty() || c.nulls.len() == n) {
            return Err(bad(format!(
                "column {name}: nulls must be empty or have one byte per row"
            )));
        }
        if !f.nullable && c.nulls.iter().any(|x| *x != 0) {
            return Err(bad(format!("column {name} is not nullable but has nulls")));
        }
        let (ni, nf, nb) = match f.data_type.storage() {
            Storage::Ints => (n, 0, false),
            Storage::Floats => (0, n, false),
            Storage::Bytes => (0, 0, true),
        };
        if c.ints.len() != ni || c.floats.len() != nf {
            return Err(bad(format!(
                "column {name} of type {}: expected {ni} ints and {nf} floats, got {} and {}",
                f.data_type,
                c.ints.len(),
                c.floats.len()
            )));
        }
        if nb {
            if c.offsets.len() != n + 1 {
                return Err(bad(format!(
                    "column {name}: offsets must have rows + 1 = {} entries, got {}",
                    n + 1,
                    c.offsets.len()
                )));
            }
            if c.offsets.first() != Some(&0) {
                return Err(bad(format!("column {name}: offsets must start at 0")));
            }
            if c.offsets.windows(2).any(|w| w[0] > w[1]) {
                return Err(bad(format!("column {name}: offsets are not monotone")));
            }
            let end = c.offsets.last().copied().unwrap_or(0) as usize;
            if end > c.bytes.len() {
                return Err(bad(format!("column {name}: offsets run past the bytes")));
            }
            if end < c.bytes.len() {
                return Err(bad(format!(
                    "column {name}: the bytes must end at the last offset ({end}) but run on to {}",
                    c.bytes.len()
                )));
            }
            if f.data_type == DataType::Utf8 {
                check_utf8(name, &c.bytes, &c.offsets)?;
            }
            if let Some(item) = f.data_type.item() {
                for i in 0..n {
                    list::items(item, c.bytes_at(i))
                        .map_err(|e| bad(format!("column {name}: row {i}: {e}")))?;
                }
            }
        } else if !c.bytes.is_empty() || !c.offsets.is_empty() {
            return Err(bad(format!(
                "column {name} of type {} must not carry bytes or offsets",
                f.data_type
            )));
        }
        if f.data_type == DataType::Boolean && c.ints.iter().any(|v| *v != 0 && *v != 1) {
            return Err(bad(format!("column {name}: booleans must be 0 or 1")));
        }
        let t = f.data_type;
        if t.wraps() && c.ints.iter().any(|v| t.wrap_int(*v) != *v) {
            return Err(bad(format!("column {name}: value out of range for {t}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{validate_batch, Batch, Column, DataType, Field, FlowError};

    fn one_column(t: DataType, bytes: &[u8], offsets: &[u32]) -> Result<(), FlowError> {
        let rows = offsets.len().saturating_sub(1);
        let b = Batch {
            rows: rows as u32,
            columns: vec![Column {
                bytes: bytes.to_vec(),
                offsets: offsets.to_vec(),
                ..Column::default()
            }],
            times: vec![0; rows],
            diffs: vec![1; rows],
        };
        validate_batch(&[Field::new("c", t, true)], &b)
    }

    fn message(r: Result<(), FlowError>) -> String {
        match r {
            Err(FlowError::BadInput(m)) => m,
            other => panic!("expected a bad-input error, got {other:?}"),
        }
    }

    #[test]
    fn bytes_end_at_the_last_offset() {
        for t in [DataType::Utf8, DataType::Binary] {
            assert_eq!(one_column(t, b"abc", &[0, 1, 3]), Ok(()));
            assert_eq!(one_column(t, b"", &[0]), Ok(()));
            assert_eq!(one_column(t, b"", &[0, 0, 0]), Ok(()));
            let m = message(one_column(t, b"abcd", &[0, 1, 3]));
            assert!(m.contains("must end at the last offset (3)"), "{m}");
            let m = message(one_column(t, &[0xc3], &[0]));
            assert!(m.contains("must end at the last offset (0)"), "{m}");
            let m = message(one_column(t, b"ab", &[0, 3]));
            assert!(m.contains("offsets run past the bytes"), "{m}");
        }
    }

    #[test]
    fn utf8_is_checked_over_the_whole_blob_and_at_every_offset() {
        assert_eq!(
            one_column(DataType::Utf8, "aé€".as_bytes(), &[0, 1, 3, 6]),
            Ok(())
        );
        // "é" split between two rows: the blob is UTF-8, the rows are not.
        let m = message(one_column(DataType::Utf8, "aé".as_bytes(), &[0, 2, 3]));
        assert!(m.contains("row 0 is not valid UTF-8"), "{m}");
        // Invalid bytes name their row (empty rows before it included).
        let m = message(one_column(DataType::Utf8, b"ab\xffc", &[0, 0, 2, 2, 4]));
        assert!(m.contains("row 3 is not valid UTF-8"), "{m}");
        let m = message(one_column(DataType::Utf8, &[0xff], &[0, 0, 1]));
        assert!(m.contains("row 1 is not valid UTF-8"), "{m}");
        // Binary columns carry any bytes.
        assert_eq!(
            one_column(DataType::Binary, &[0xff, 0xc3], &[0, 1, 2]),
            Ok(())
        );
    }

    #[test]
    fn wraps_says_when_wrap_int_can_change_a_value() {
        let probes = [i64::MIN, -129, -1, 0, 1, 128, 256, 1 << 40, i64::MAX];
        for t in DataType::ALL {
            let changes = probes.iter().any(|v| t.wrap_int(*v) != *v);
            assert_eq!(changes, t.wraps(), "{t}");
        }
    }
}
