//! sandflow: a time-series database whose continuous queries (flows) each run
//! in their own WebAssembly sandbox. See ARCHITECTURE.md for the map.

pub mod catalog;
/// The database's time (the `sandflow-flows` clock port).
pub mod clock {
    pub use sandflow_flows::{Clock, SystemClock, VirtualClock};
}
pub mod database;
pub mod engine;
pub mod error;
pub mod flow;
pub mod influx;
pub mod metrics;
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
