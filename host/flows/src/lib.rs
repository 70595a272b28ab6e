//! sandflow-flows: what a running flow does, as a state machine over ports.
//!
//! A [`Runner`] is one flow at run time. It is driven by events
//! ([`Event`]: input arrived, a timer fired, flush, stop) and answers each
//! [`Runner::step`] with what its driver should do next ([`Outcome`]: wake it
//! at a time, run it again at once, the flush's result, a failure). During a
//! step it uses its ports and nothing else:
//!
//! - [`Clock`]: the time (the wall clock in production, a [`VirtualClock`]
//!   in tests, so that the same events at the same times give the same
//!   sink, byte for byte);
//! - [`ChangeLog`]: the changes of each source after a [`Position`], one
//!   part (at most [`PART_ROWS`] rows) at a time: back-fill, the silent
//!   replay after a crash and live input are the same reads;
//! - [`Guest`]: the flow's engine (in the sandbox), and [`Waker`], which
//!   restores a flow that fell asleep;
//! - [`SinkCommitter`]: the tick's output, the flow's positions and (now and
//!   then) its snapshot, committed atomically, refused if the runner's
//!   fence is stale;
//! - [`FlowStore`]: the definitions and snapshots kept, where a flow that
//!   starts again finds its [`Stored`] state and positions.
//!
//! Positions are per source, so that a log on another machine can supply
//! them. Must not know tokio, redb, DataFusion or wasmtime.

pub mod clock;
pub mod ports;
pub mod runner;

pub use clock::{Clock, SystemClock, VirtualClock};
pub use ports::{
    decode_positions, encode_positions, ChangeLog, Chunk, Commit, Failure, FlowStore, Guest,
    LateSnapshot, Position, SinkCommitter, Stored, Waker, PART_ROWS,
};
pub use runner::{Event, Outcome, Recovery, RunStatus, Runner, RunnerConfig};
pub use sandflow_contract::{Batch, Field, TickOutput};
