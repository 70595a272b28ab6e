//! Flows: compiling a continuous query to a guest plan, moving rows between
//! Arrow (the database's format) and the contract's columnar batches.
//!
//! The flow manager (ticking, writeback, catalog of flows) builds on these.

pub mod arrow;
pub mod compile;
