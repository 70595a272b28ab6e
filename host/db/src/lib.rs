//! sandflow: a time-series database whose continuous queries (flows) each run
//! in their own WebAssembly sandbox, as a library ([`Database`],
//! [`DatabaseConfig`]). See ARCHITECTURE.md for the map.
//!
//! Inside, dependencies point one way: `schema` (what a table is) ← `storage`
//! (rows, metadata, the change log) ← `catalog` ← `sql`, `session` and
//! `flow` (the flow host: compile, sink mapping, the driver and the ports of
//! `sandflow-flows`) ← `database`. Storage must not know the catalog, SQL or
//! flows (`make deps` checks it).
//!
//! Must not know the front doors (PostgreSQL, HTTP) or the engine's
//! internals: flows reach the engine through `sandflow-sandbox` (or, for
//! tests, the engine crate behind the same `Guest` port).

pub mod auth;
pub mod catalog;
/// The database's time (the `sandflow-flows` clock port).
pub mod clock {
    pub use sandflow_flows::{Clock, SystemClock, VirtualClock};
}
pub mod database;
pub mod engine;
pub mod error;
pub mod export;
pub mod flow;
pub mod influx;
pub mod metrics;
pub mod nodes;
pub mod schema;
/// The wasm sandbox flows run in (the `sandflow-sandbox` crate).
pub use sandflow_sandbox as runtime;
pub mod session;
pub mod sql;
pub mod storage;
pub mod testing;

pub use database::{ClockConfig, Database, DatabaseConfig, Output, StorageConfig};
pub use error::{Error, Result};
pub use session::{Session, StatementKind, TransactionStatus};
