//! Test harnesses: `engine` for the guest through the runtime and natively,
//! `harness` for the real `sandflow` binary.

pub mod engine;
pub mod harness;
