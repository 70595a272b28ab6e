//! Moves data between the engine's native types (shared with the guest crate)
//! and the types generated from the WIT contract, and checks what a guest
//! returns before the host trusts it.

use super::component::bindings::sandflow::flow::types as wit;
use super::{Batch, Column, DataType, Field, FlowError, RuntimeError, SourceSchema, TickOutput};

pub type WitFlowError = wit::FlowError;

pub fn data_type_to_wit(t: DataType) -> wit::DataType {
    match t {
        DataType::Boolean => wit::DataType::Boolean,
        DataType::Int8 => wit::DataType::Int8,
        DataType::Int16 => wit::DataType::Int16,
        DataType::Int32 => wit::DataType::Int32,
        DataType::Int64 => wit::DataType::Int64,
        DataType::UInt8 => wit::DataType::Uint8,
        DataType::UInt16 => wit::DataType::Uint16,
        DataType::UInt32 => wit::DataType::Uint32,
        DataType::UInt64 => wit::DataType::Uint64,
        DataType::Float32 => wit::DataType::Float32,
        DataType::Float64 => wit::DataType::Float64,
        DataType::Utf8 => wit::DataType::Utf8,
        DataType::Binary => wit::DataType::Binary,
        DataType::TimestampSecond => wit::DataType::TimestampSecond,
        DataType::TimestampMillisecond => wit::DataType::TimestampMillisecond,
        DataType::TimestampMicrosecond => wit::DataType::TimestampMicrosecond,
        DataType::TimestampNanosecond => wit::DataType::TimestampNanosecond,
        DataType::Date32 => wit::DataType::Date32,
        DataType::List(_) => wit::DataType::List,
    }
}

/// A scalar WIT type (a list's `item` says its element type: see
/// [`field_from_wit`]).
pub fn data_type_from_wit(t: wit::DataType) -> DataType {
    match t {
        wit::DataType::Boolean => DataType::Boolean,
        wit::DataType::Int8 => DataType::Int8,
        wit::DataType::Int16 => DataType::Int16,
        wit::DataType::Int32 => DataType::Int32,
        wit::DataType::Int64 => DataType::Int64,
        wit::DataType::Uint8 => DataType::UInt8,
        wit::DataType::Uint16 => DataType::UInt16,
        wit::DataType::Uint32 => DataType::UInt32,
        wit::DataType::Uint64 => DataType::UInt64,
        wit::DataType::Float32 => DataType::Float32,
        wit::DataType::Float64 => DataType::Float64,
        wit::DataType::Utf8 => DataType::Utf8,
        wit::DataType::Binary => DataType::Binary,
        wit::DataType::TimestampSecond => DataType::TimestampSecond,
        wit::DataType::TimestampMillisecond => DataType::TimestampMillisecond,
        wit::DataType::TimestampMicrosecond => DataType::TimestampMicrosecond,
        wit::DataType::TimestampNanosecond => DataType::TimestampNanosecond,
        wit::DataType::Date32 => DataType::Date32,
        // Only `field_from_wit` reads a list, with its item.
        wit::DataType::List => DataType::Binary,
    }
}

pub fn field_to_wit(f: &Field) -> wit::Field {
    wit::Field {
        name: f.name.clone(),
        data_type: data_type_to_wit(f.data_type),
        nullable: f.nullable,
        item: f.data_type.item().map(data_type_to_wit),
    }
}

/// A field a guest declared; a list must name a scalar element type, and
/// only a list names one.
pub fn field_from_wit(f: wit::Field) -> Result<Field, RuntimeError> {
    let data_type = match (f.data_type, f.item) {
        (wit::DataType::List, Some(item)) if item != wit::DataType::List => {
            DataType::list_of(data_type_from_wit(item))
        }
        (wit::DataType::List, _) => None,
        (t, None) => Some(data_type_from_wit(t)),
        (_, Some(_)) => None,
    };
    let Some(data_type) = data_type else {
        return Err(RuntimeError::Contract {
            message: format!(
                "output column {} has type {:?} with element type {:?}: a list names a \
                 scalar element type, and only a list names one",
                f.name, f.data_type, f.item
            ),
        });
    };
    Ok(Field {
        name: f.name,
        data_type,
        nullable: f.nullable,
    })
}

pub fn source_to_wit(s: &SourceSchema) -> wit::SourceSchema {
    wit::SourceSchema {
        name: s.name.clone(),
        fields: s.fields.iter().map(field_to_wit).collect(),
    }
}

/// A per-row list whose entries are all equal, as its single shared entry (the contract
/// allows it): a batch from one write has one time and one diff, and this halves what crosses.
fn shared_per_row(v: Vec<i64>) -> Vec<i64> {
    match v.split_first() {
        Some((first, rest)) if !rest.is_empty() && all_equal(rest, *first) => vec![*first],
        _ => v,
    }
}

/// Whether every entry of `v` is `x`: a branch-free OR of differences per block of 64
/// entries (which the compiler vectorises), stopping at the first block that differs.
fn all_equal(v: &[i64], x: i64) -> bool {
    v.chunks(64)
        .all(|block| block.iter().fold(0, |acc, y| acc | (y ^ x)) == 0)
}

pub fn batch_to_wit(b: Batch) -> wit::Batch {
    wit::Batch {
        rows: b.rows,
        columns: b
            .columns
            .into_iter()
            .map(|c| wit::Column {
                ints: c.ints,
                floats: c.floats,
                bytes: c.bytes,
                offsets: c.offsets,
                nulls: c.nulls,
            })
            .collect(),
        times: shared_per_row(b.times),
        diffs: shared_per_row(b.diffs),
    }
}

pub fn batch_from_wit(b: wit::Batch) -> Batch {
    Batch {
        rows: b.rows,
        columns: b
            .columns
            .into_iter()
            .map(|c| Column {
                ints: c.ints,
                floats: c.floats,
                bytes: c.bytes,
                offsets: c.offsets,
                nulls: c.nulls,
            })
            .collect(),
        times: b.times,
        diffs: b.diffs,
    }
}

pub fn tick_output_from_wit(t: wit::TickOutput) -> TickOutput {
    TickOutput {
        output: batch_from_wit(t.output),
        more: t.more,
        next_wakeup: t.next_wakeup,
    }
}

pub fn error_from_wit(e: wit::FlowError) -> FlowError {
    match e {
        wit::FlowError::BadInput(m) => FlowError::BadInput(m),
        wit::FlowError::Unsupported(m) => FlowError::Unsupported(m),
        wit::FlowError::LimitExceeded(m) => FlowError::LimitExceeded(m),
        wit::FlowError::Internal(m) => FlowError::Internal(m),
    }
}

/// Checks a guest's output against the contract: at most `max_rows` rows and
/// a batch that matches the output schema exactly (list lengths, offsets,
/// UTF-8, nullability, value ranges). A guest is untrusted: nothing it returns
/// is used before this passes.
pub fn validate_output(
    out: &TickOutput,
    schema: &[Field],
    max_rows: u32,
) -> Result<(), RuntimeError> {
    if out.output.rows > max_rows {
        return Err(RuntimeError::Contract {
            message: format!(
                "returned {} rows, more than the {max_rows} allowed per tick",
                out.output.rows
            ),
        });
    }
    sandflow_contract::validate_batch(schema, &out.output).map_err(|e| RuntimeError::Contract {
        message: format!("malformed output batch: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_times_and_diffs_cross_as_one_entry() {
        assert_eq!(shared_per_row(vec![7, 7, 7]), vec![7]);
        assert_eq!(shared_per_row(vec![7, 8, 7]), vec![7, 8, 7]);
        assert_eq!(shared_per_row(vec![7]), vec![7]);
        assert_eq!(shared_per_row(vec![]), Vec::<i64>::new());
        let mut long = vec![3; 200];
        assert_eq!(shared_per_row(long.clone()), vec![3]);
        long[130] = 4;
        assert_eq!(shared_per_row(long.clone()), long);
    }

    #[test]
    fn shared_output_entries_are_expanded_per_row() {
        let mut out = TickOutput {
            output: Batch {
                rows: 3,
                columns: vec![],
                times: vec![5],
                diffs: vec![-1],
            },
            more: false,
            next_wakeup: None,
        };
        out.expand();
        assert_eq!(out.output.times, vec![5; 3]);
        assert_eq!(out.output.diffs, vec![-1; 3]);
    }
}
