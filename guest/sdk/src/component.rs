//! The wit-bindgen export behind [`crate::export!`] (wasm32 only): converts
//! the WIT records to and from the contract's types (moving the lists) and
//! keeps each flow's [`Runner`] in a `RefCell` behind the resource handle.

use std::cell::RefCell;

use crate::{Component, Runner};

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "../../wit",
        world: "flow-engine",
        pub_export_macro: true,
        export_macro_name: "__export_flow_engine",
    });
}

use bindings::exports::sandflow::flow::engine::{Flow, GuestFlow};
use bindings::sandflow::flow::types as w;
use sandflow_contract as n;

/// One flow: the user's component inside a [`Runner`].
pub struct FlowResource<C> {
    inner: RefCell<Runner<C>>,
}

fn dt_in(t: w::DataType) -> n::DataType {
    use n::DataType as N;
    use w::DataType as W;
    match t {
        W::Boolean => N::Boolean,
        W::Int8 => N::Int8,
        W::Int16 => N::Int16,
        W::Int32 => N::Int32,
        W::Int64 => N::Int64,
        W::Uint8 => N::UInt8,
        W::Uint16 => N::UInt16,
        W::Uint32 => N::UInt32,
        W::Uint64 => N::UInt64,
        W::Float32 => N::Float32,
        W::Float64 => N::Float64,
        W::Utf8 => N::Utf8,
        W::Binary => N::Binary,
        W::TimestampSecond => N::TimestampSecond,
        W::TimestampMillisecond => N::TimestampMillisecond,
        W::TimestampMicrosecond => N::TimestampMicrosecond,
        W::TimestampNanosecond => N::TimestampNanosecond,
        W::Date32 => N::Date32,
        // A list is read with its item (`field_in`).
        W::List => N::Binary,
    }
}

fn dt_out(t: n::DataType) -> w::DataType {
    use n::DataType as N;
    use w::DataType as W;
    match t {
        N::Boolean => W::Boolean,
        N::Int8 => W::Int8,
        N::Int16 => W::Int16,
        N::Int32 => W::Int32,
        N::Int64 => W::Int64,
        N::UInt8 => W::Uint8,
        N::UInt16 => W::Uint16,
        N::UInt32 => W::Uint32,
        N::UInt64 => W::Uint64,
        N::Float32 => W::Float32,
        N::Float64 => W::Float64,
        N::Utf8 => W::Utf8,
        N::Binary => W::Binary,
        N::TimestampSecond => W::TimestampSecond,
        N::TimestampMillisecond => W::TimestampMillisecond,
        N::TimestampMicrosecond => W::TimestampMicrosecond,
        N::TimestampNanosecond => W::TimestampNanosecond,
        N::Date32 => W::Date32,
        N::List(_) => W::List,
    }
}

/// A host's field; a list without a scalar element type reads as binary,
/// which the engine refuses to compute with.
fn field_in(f: w::Field) -> n::Field {
    n::Field {
        name: f.name,
        data_type: match (f.data_type, f.item) {
            (w::DataType::List, Some(item)) => {
                n::DataType::list_of(dt_in(item)).unwrap_or(n::DataType::Binary)
            }
            (t, _) => dt_in(t),
        },
        nullable: f.nullable,
    }
}

fn field_out(f: n::Field) -> w::Field {
    w::Field {
        name: f.name,
        data_type: dt_out(f.data_type),
        nullable: f.nullable,
        item: f.data_type.item().map(dt_out),
    }
}

fn err_out(e: n::FlowError) -> w::FlowError {
    match e {
        n::FlowError::BadInput(m) => w::FlowError::BadInput(m),
        n::FlowError::Unsupported(m) => w::FlowError::Unsupported(m),
        n::FlowError::LimitExceeded(m) => w::FlowError::LimitExceeded(m),
        n::FlowError::Internal(m) => w::FlowError::Internal(m),
    }
}

fn batch_in(b: w::Batch) -> n::Batch {
    n::Batch {
        rows: b.rows,
        columns: b
            .columns
            .into_iter()
            .map(|c| n::Column {
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

fn batch_out(b: n::Batch) -> w::Batch {
    w::Batch {
        rows: b.rows,
        columns: b
            .columns
            .into_iter()
            .map(|c| w::Column {
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

impl<C: Component + 'static> GuestFlow for FlowResource<C> {
    fn create(
        plan: Vec<u8>,
        sources: Vec<w::SourceSchema>,
        options: Vec<(String, String)>,
    ) -> Result<Flow, w::FlowError> {
        let sources = sources
            .into_iter()
            .map(|s| n::SourceSchema {
                name: s.name,
                fields: s.fields.into_iter().map(field_in).collect(),
            })
            .collect();
        let runner = Runner::<C>::create(&plan, sources, &options).map_err(err_out)?;
        Ok(Flow::new(FlowResource {
            inner: RefCell::new(runner),
        }))
    }

    fn output_schema(&self) -> Vec<w::Field> {
        self.inner
            .borrow()
            .output_schema()
            .into_iter()
            .map(field_out)
            .collect()
    }

    fn push(&self, source: u32, input: w::Batch) -> Result<(), w::FlowError> {
        self.inner
            .borrow_mut()
            .push(source, batch_in(input))
            .map_err(err_out)
    }

    fn tick(&self, now: i64, max_rows: u32) -> Result<w::TickOutput, w::FlowError> {
        let t = self
            .inner
            .borrow_mut()
            .tick(now, max_rows)
            .map_err(err_out)?;
        Ok(w::TickOutput {
            output: batch_out(t.output),
            more: t.more,
            next_wakeup: t.next_wakeup,
        })
    }

    fn snapshot(&self) -> Result<Vec<u8>, w::FlowError> {
        self.inner.borrow().snapshot().map_err(err_out)
    }

    fn restore(state: Vec<u8>) -> Result<Flow, w::FlowError> {
        let runner = Runner::<C>::restore(&state).map_err(err_out)?;
        Ok(Flow::new(FlowResource {
            inner: RefCell::new(runner),
        }))
    }

    fn state_size(&self) -> u64 {
        self.inner.borrow().state_size()
    }
}
