//! Test harnesses: `engine` for the guest through the runtime and natively,
//! `harness` for the real `sandflow` binary, `db` for a `Database` driven
//! through the library.

pub mod db;
pub mod engine;
pub mod harness;
pub mod pgraw;
