//! sandflow's incremental dataflow engine.
//!
//! A flow is built from a Substrait plan ([`Flow::create`]), fed diff rows ([`Flow::push`]) and
//! asked for the consolidated change of its result at each tick ([`Flow::tick`]). The same code
//! runs natively and as a `wasm32-wasip2` component (see `component.rs`).
//!
//! Must not know the host: no SQL, storage, sandbox or clock. It reads no
//! time, environment, file or randomness; everything it sees comes through
//! the contract (`sandflow-contract`), and no input may make it panic.

mod agg;
pub mod bench;
mod codec;
mod column;
mod expr;
mod flow;
mod hash;
mod heap;
mod join;
mod plan;
pub mod sketch;
mod temporal;
pub use sandflow_contract as types;
mod wire;

#[cfg(target_arch = "wasm32")]
mod component;

pub use flow::{Flow, OPTION_EXPIRE_AFTER_MS};
pub use types::{Batch, Column, DataType, Field, FlowError, SourceSchema, TickOutput, Value};
