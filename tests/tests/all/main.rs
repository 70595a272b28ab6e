//! The one integration-test binary: every area of sandflow's tests as a module
//! of its own, so that the tests link DataFusion and wasmtime once.
//!
//! - `cluster`: nodes in a cluster over a real etcd server;
//! - `database`: the database through its library API;
//! - `engine_flows` (with `engine_common`): the engine natively, against
//!   DataFusion;
//! - `engine_wasm`, `sandbox`: the engine in wasm, and hostile guests;
//! - `e2e_*`: the real binary over psql, drivers and HTTP (`e2e_tls`: TLS on
//!   the front doors; `e2e_components`: user components);
//! - `flows_differential`, `flows_limits`, `hostile_flows`, `crash_flows`:
//!   flows under random writes, limits, attacks and kill -9;
//! - `fuzz`: bounded fuzzing of everything untrusted input reaches;
//! - `recording`: recording flows and replaying them offline;
//! - `slt`: `sandflow test` on the scenario files in `tests/slt/`;
//! - `virtual_time`: the library with an in-memory store and a virtual
//!   clock (deterministic flows, ttl and EXPIRE AFTER), separate metrics.
//!
//! Run one area with `cargo test -p sandflow-tests --test all e2e_pg`.

mod cluster;
mod crash_flows;
mod database;
mod e2e_auth;
mod e2e_cli;
mod e2e_components;
mod e2e_extended;
mod e2e_flows;
mod e2e_http;
mod e2e_mysql;
mod e2e_pg;
mod e2e_restart;
mod e2e_sdk;
mod e2e_tls;
mod engine_common;
mod engine_flows;
mod engine_wasm;
mod flows_differential;
mod flows_limits;
mod fuzz;
mod hostile_flows;
mod recording;
mod sandbox;
mod slt;
mod virtual_time;
