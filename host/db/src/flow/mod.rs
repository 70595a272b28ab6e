//! Flows: continuous queries kept up to date in their own wasm sandboxes.
//!
//! * `compile`: SQL → DataFusion plan → Substrait bytes for the guest.
//! * `arrow`: Arrow record batches ⇄ the contract's columnar batches.
//! * `options`: `EXPIRE AFTER` intervals and `WITH (...)` options.
//! * `sink`: sink tables (derived schema, fit check, diffs → upserts/deletes).
//! * `manager`: CREATE / DROP / FLUSH, the persisted flow definitions.
//! * `ports`: the runner's ports (`sandflow_flows`) over the store, the sink
//!   and the sandbox.
//! * `driver`: the threads (or, with a virtual clock, the caller) that step
//!   the runners.
//! * `status`: a flow's run-time facts for `information_schema.flows`.
//! * `system`: `information_schema.flows` and `components`.
//! * `components`: user components (CREATE / DROP COMPONENT, PUT
//!   /v1/components): validated, compiled off the request path, stored with
//!   their compiled form by digest, loaded by flows that run them.

pub mod arrow;
pub mod compile;
pub mod components;
pub(crate) mod driver;
pub mod logs;
pub mod manager;
pub mod options;
pub(crate) mod ports;
pub mod recording;
pub mod remote;
pub mod sink;
pub mod status;
pub mod system;

pub use compile::{FLOW_MAX_EXPRESSION_DEPTH, FLOW_MAX_PLAN_DEPTH};
#[doc(hidden)]
pub use manager::UntrustedGuest;
pub use manager::{
    default_threads, ComponentCompiler, FlowComponent, FlowDef, FlowEngine, FlowInfo, FlowManager,
    FlowSettings, DEFAULT_COMPONENT_COMPILE_TIMEOUT, DEFAULT_MAX_COMPONENT_SIZE, DEFAULT_MAX_FLOWS,
    DEFAULT_MAX_RESTARTS, DEFAULT_RESTART_BACKOFF, DEFAULT_SLEEP_AFTER, DEFAULT_TICK_INTERVAL,
    MAX_RESTART_BACKOFF,
};
pub use status::FlowStatus;
