//! sandflow-server: the front doors of a sandflow database and the `sandflow`
//! binary. The PostgreSQL wire protocol (`pg`), HTTP with the InfluxDB line
//! protocol (`http`), MySQL (`mysql`), TLS for them (`tls`), the settings
//! from flags, environment and TOML (`config`), `sandflow start` and
//! `sandflow test` (`app`).
//!
//! Must not know storage, the catalog's internals or flows' insides: it
//! reaches the database through `sandflow::Database` and
//! `sandflow::Session` only.

pub mod app;
pub mod auth;
pub mod client;
pub mod cluster;
pub mod config;
pub mod flownode;
pub mod http;
pub mod mysql;
pub mod origin;
pub mod pg;
pub mod pg_catalog;
pub mod sqltext;
pub mod tls;
