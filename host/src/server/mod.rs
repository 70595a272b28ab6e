//! The front doors: PostgreSQL wire protocol and HTTP, and the `sandflow`
//! command line that starts them.

pub mod app;
pub mod http;
pub mod influx;
pub mod metrics;
pub mod origin;
pub mod pg;
pub mod pg_catalog;
pub mod sqltext;
