//! Flows: continuous queries kept up to date in their own wasm sandboxes.
//!
//! * `compile`: SQL → DataFusion plan → Substrait bytes for the guest.
//! * `arrow`: Arrow record batches ⇄ the contract's columnar batches.
//! * `options`: `EXPIRE AFTER` intervals and `WITH (...)` options.
//! * `sink`: sink tables (derived schema, fit check, diffs → upserts/deletes).
//! * `manager`: CREATE / DROP / FLUSH, the persisted flow definitions.
//! * `worker`: one thread per flow: feed, tick, write back.
//! * `system`: `information_schema.flows`.

pub mod arrow;
pub mod compile;
pub mod manager;
pub mod options;
pub mod sink;
pub mod system;
pub(crate) mod worker;

pub use compile::{FLOW_MAX_EXPRESSION_DEPTH, FLOW_MAX_PLAN_DEPTH};
#[doc(hidden)]
pub use manager::UntrustedGuest;
pub use manager::{
    FlowDef, FlowInfo, FlowManager, FlowSettings, DEFAULT_MAX_FLOWS, DEFAULT_MAX_RESTARTS,
    DEFAULT_RESTART_BACKOFF, DEFAULT_SLEEP_AFTER, DEFAULT_TICK_INTERVAL, MAX_RESTART_BACKOFF,
};
pub use worker::FlowStatus;
