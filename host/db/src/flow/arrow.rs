//! Arrow record batches ⇄ contract batches: the contract crate's mapping.

pub use sandflow_contract::arrow::*;
