//! sandflow: a time-series database whose continuous queries (flows) each run
//! in their own WebAssembly sandbox. See ARCHITECTURE.md for the map.

pub mod catalog;
pub mod database;
pub mod engine;
pub mod error;
pub mod flow;
pub mod influx;
pub mod metrics;
/// The wasm sandbox flows run in (the `sandflow-sandbox` crate).
pub use sandflow_sandbox as runtime;
pub mod session;
pub mod sql;
pub mod storage;

pub use database::{Database, Output};
pub use error::{Error, Result};
pub use session::{Session, StatementKind, TransactionStatus};
