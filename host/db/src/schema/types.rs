//! Column types: the SQL names users write, the Arrow types rows travel as,
//! and GreptimeDB's display names (used by DESC TABLE).

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use serde::{Deserialize, Serialize};

use crate::error::{Result, UnsupportedSnafu};

/// The column types sandflow stores. Serialised by these (GreptimeDB) names;
/// a list as `List<Int64>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum ColumnType {
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
    String,
    Binary,
    Date,
    TimestampSecond,
    TimestampMillisecond,
    TimestampMicrosecond,
    TimestampNanosecond,
    /// A list of a scalar type (a flow's `array_agg`); built with
    /// [`ColumnType::list_of`]. Never part of a key.
    List(&'static ColumnType),
}

/// The scalar types, at a `'static` address for [`ColumnType::List`].
static SCALARS: [ColumnType; 18] = [
    ColumnType::Boolean,
    ColumnType::Int8,
    ColumnType::Int16,
    ColumnType::Int32,
    ColumnType::Int64,
    ColumnType::UInt8,
    ColumnType::UInt16,
    ColumnType::UInt32,
    ColumnType::UInt64,
    ColumnType::Float32,
    ColumnType::Float64,
    ColumnType::String,
    ColumnType::Binary,
    ColumnType::Date,
    ColumnType::TimestampSecond,
    ColumnType::TimestampMillisecond,
    ColumnType::TimestampMicrosecond,
    ColumnType::TimestampNanosecond,
];

impl From<ColumnType> for String {
    fn from(t: ColumnType) -> String {
        t.display_name()
    }
}

impl TryFrom<String> for ColumnType {
    type Error = String;

    fn try_from(name: String) -> std::result::Result<ColumnType, String> {
        if let Some(item) = name.strip_prefix("List<").and_then(|n| n.strip_suffix('>')) {
            let item = ColumnType::try_from(item.to_string())?;
            return ColumnType::list_of(item).ok_or_else(|| format!("no list type {name}"));
        }
        SCALARS
            .iter()
            .find(|t| t.display_name() == name)
            .copied()
            .ok_or_else(|| format!("unknown column type {name}"))
    }
}

impl ColumnType {
    /// The list of `item`s; `None` when `item` is itself a list.
    pub fn list_of(item: ColumnType) -> Option<ColumnType> {
        SCALARS.iter().find(|t| **t == item).map(ColumnType::List)
    }

    /// The element type of a list type.
    pub fn item(self) -> Option<ColumnType> {
        match self {
            ColumnType::List(t) => Some(*t),
            _ => None,
        }
    }

    pub fn to_arrow(self) -> DataType {
        match self {
            ColumnType::List(item) => DataType::List(std::sync::Arc::new(
                datafusion::arrow::datatypes::Field::new_list_field(item.to_arrow(), true),
            )),
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::Int8 => DataType::Int8,
            ColumnType::Int16 => DataType::Int16,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::UInt8 => DataType::UInt8,
            ColumnType::UInt16 => DataType::UInt16,
            ColumnType::UInt32 => DataType::UInt32,
            ColumnType::UInt64 => DataType::UInt64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::String => DataType::Utf8,
            ColumnType::Binary => DataType::Binary,
            ColumnType::Date => DataType::Date32,
            ColumnType::TimestampSecond => DataType::Timestamp(TimeUnit::Second, None),
            ColumnType::TimestampMillisecond => DataType::Timestamp(TimeUnit::Millisecond, None),
            ColumnType::TimestampMicrosecond => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnType::TimestampNanosecond => DataType::Timestamp(TimeUnit::Nanosecond, None),
        }
    }

    /// The stored type for an Arrow type (e.g. a query's output column), if any.
    pub fn from_arrow(data_type: &DataType) -> Option<ColumnType> {
        Some(match data_type {
            DataType::Boolean => ColumnType::Boolean,
            DataType::Int8 => ColumnType::Int8,
            DataType::Int16 => ColumnType::Int16,
            DataType::Int32 => ColumnType::Int32,
            DataType::Int64 => ColumnType::Int64,
            DataType::UInt8 => ColumnType::UInt8,
            DataType::UInt16 => ColumnType::UInt16,
            DataType::UInt32 => ColumnType::UInt32,
            DataType::UInt64 => ColumnType::UInt64,
            DataType::Float16 | DataType::Float32 => ColumnType::Float32,
            DataType::Float64 => ColumnType::Float64,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::String,
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView => ColumnType::Binary,
            DataType::Date32 => ColumnType::Date,
            DataType::Timestamp(unit, _) => ColumnType::timestamp(*unit),
            DataType::List(f) | DataType::LargeList(f) => {
                ColumnType::list_of(ColumnType::from_arrow(f.data_type())?)?
            }
            _ => return None,
        })
    }

    pub fn timestamp(unit: TimeUnit) -> ColumnType {
        match unit {
            TimeUnit::Second => ColumnType::TimestampSecond,
            TimeUnit::Millisecond => ColumnType::TimestampMillisecond,
            TimeUnit::Microsecond => ColumnType::TimestampMicrosecond,
            TimeUnit::Nanosecond => ColumnType::TimestampNanosecond,
        }
    }

    pub fn is_timestamp(self) -> bool {
        matches!(
            self,
            ColumnType::TimestampSecond
                | ColumnType::TimestampMillisecond
                | ColumnType::TimestampMicrosecond
                | ColumnType::TimestampNanosecond
        )
    }

    /// GreptimeDB's name for the type (DESC TABLE, information_schema).
    pub fn display_name(self) -> String {
        match self {
            ColumnType::List(item) => format!("List<{}>", item.display_name()),
            t => t.scalar_name().into(),
        }
    }

    fn scalar_name(self) -> &'static str {
        match self {
            ColumnType::List(_) => "List",
            ColumnType::Boolean => "Boolean",
            ColumnType::Int8 => "Int8",
            ColumnType::Int16 => "Int16",
            ColumnType::Int32 => "Int32",
            ColumnType::Int64 => "Int64",
            ColumnType::UInt8 => "UInt8",
            ColumnType::UInt16 => "UInt16",
            ColumnType::UInt32 => "UInt32",
            ColumnType::UInt64 => "UInt64",
            ColumnType::Float32 => "Float32",
            ColumnType::Float64 => "Float64",
            ColumnType::String => "String",
            ColumnType::Binary => "Binary",
            ColumnType::Date => "Date",
            ColumnType::TimestampSecond => "TimestampSecond",
            ColumnType::TimestampMillisecond => "TimestampMillisecond",
            ColumnType::TimestampMicrosecond => "TimestampMicrosecond",
            ColumnType::TimestampNanosecond => "TimestampNanosecond",
        }
    }

    /// The SQL spelling used by SHOW CREATE TABLE (parses back to the same type).
    pub fn sql_name(self) -> String {
        match self {
            ColumnType::List(item) => format!("{}[]", item.sql_name()),
            t => t.scalar_sql_name().into(),
        }
    }

    fn scalar_sql_name(self) -> &'static str {
        match self {
            ColumnType::List(_) => "",
            ColumnType::Boolean => "BOOLEAN",
            ColumnType::Int8 => "TINYINT",
            ColumnType::Int16 => "SMALLINT",
            ColumnType::Int32 => "INT",
            ColumnType::Int64 => "BIGINT",
            ColumnType::UInt8 => "TINYINT UNSIGNED",
            ColumnType::UInt16 => "SMALLINT UNSIGNED",
            ColumnType::UInt32 => "INT UNSIGNED",
            ColumnType::UInt64 => "BIGINT UNSIGNED",
            ColumnType::Float32 => "FLOAT",
            ColumnType::Float64 => "DOUBLE",
            ColumnType::String => "STRING",
            ColumnType::Binary => "BINARY",
            ColumnType::Date => "DATE",
            ColumnType::TimestampSecond => "TIMESTAMP(0)",
            ColumnType::TimestampMillisecond => "TIMESTAMP(3)",
            ColumnType::TimestampMicrosecond => "TIMESTAMP(6)",
            ColumnType::TimestampNanosecond => "TIMESTAMP(9)",
        }
    }

    /// Maps a SQL type name (upper case words, e.g. `INT`, `DOUBLE PRECISION`,
    /// `TIMESTAMP_MS`), its parenthesised arguments and `UNSIGNED` to a type.
    pub fn from_sql(name: &str, args: &[u64], unsigned: bool) -> Result<ColumnType> {
        let name = name.to_ascii_uppercase();
        let signed = |s: ColumnType, u: ColumnType| if unsigned { u } else { s };
        let ty = match name.as_str() {
            "BOOL" | "BOOLEAN" => ColumnType::Boolean,
            "TINYINT" | "INT8" => signed(ColumnType::Int8, ColumnType::UInt8),
            "SMALLINT" | "INT16" | "INT2" => signed(ColumnType::Int16, ColumnType::UInt16),
            "INT" | "INTEGER" | "INT32" | "INT4" | "MEDIUMINT" => {
                signed(ColumnType::Int32, ColumnType::UInt32)
            }
            "BIGINT" | "INT64" => signed(ColumnType::Int64, ColumnType::UInt64),
            "UINT8" => ColumnType::UInt8,
            "UINT16" => ColumnType::UInt16,
            "UINT32" => ColumnType::UInt32,
            "UINT64" => ColumnType::UInt64,
            "FLOAT" | "FLOAT4" | "FLOAT32" | "REAL" => ColumnType::Float32,
            "DOUBLE" | "DOUBLE PRECISION" | "FLOAT8" | "FLOAT64" => ColumnType::Float64,
            "STRING" | "TEXT" | "VARCHAR" | "CHAR" | "CHARACTER VARYING" | "CHARACTER"
            | "TINYTEXT" | "MEDIUMTEXT" | "LONGTEXT" => ColumnType::String,
            // GreptimeDB's JSON: kept as its text.
            "JSON" => ColumnType::String,
            "BINARY" | "VARBINARY" | "BYTEA" | "BLOB" | "BYTES" => ColumnType::Binary,
            "DATE" => ColumnType::Date,
            "TIMESTAMP" | "DATETIME" | "TIMESTAMP WITHOUT TIME ZONE" => match args {
                [] => ColumnType::TimestampMillisecond,
                [0] => ColumnType::TimestampSecond,
                [3] => ColumnType::TimestampMillisecond,
                [6] => ColumnType::TimestampMicrosecond,
                [9] => ColumnType::TimestampNanosecond,
                _ => {
                    return UnsupportedSnafu {
                        message: format!(
                            "TIMESTAMP precision {args:?} is not supported; use TIMESTAMP(0), (3), (6) or (9)"
                        ),
                    }
                    .fail()
                }
            },
            "TIMESTAMP_S" | "TIMESTAMP_SEC" | "TIMESTAMPSECOND" | "TIMESTAMP_SECOND" => {
                ColumnType::TimestampSecond
            }
            "TIMESTAMP_MS" | "TIMESTAMPMILLISECOND" | "TIMESTAMP_MILLISECOND" => {
                ColumnType::TimestampMillisecond
            }
            "TIMESTAMP_US" | "TIMESTAMPMICROSECOND" | "TIMESTAMP_MICROSECOND" => {
                ColumnType::TimestampMicrosecond
            }
            "TIMESTAMP_NS" | "TIMESTAMPNANOSECOND" | "TIMESTAMP_NANOSECOND" => {
                ColumnType::TimestampNanosecond
            }
            _ => {
                return UnsupportedSnafu {
                    message: format!(
                        "column type {name} is not supported; use one of STRING, BOOLEAN, \
                         TINYINT, SMALLINT, INT, BIGINT (optionally UNSIGNED), FLOAT, DOUBLE, \
                         DATE, BINARY, TIMESTAMP[(0|3|6|9)]"
                    ),
                }
                .fail()
            }
        };
        if unsigned
            && !matches!(
                ty,
                ColumnType::UInt8 | ColumnType::UInt16 | ColumnType::UInt32 | ColumnType::UInt64
            )
        {
            return UnsupportedSnafu {
                message: format!("{name} cannot be UNSIGNED"),
            }
            .fail();
        }
        Ok(ty)
    }
}
