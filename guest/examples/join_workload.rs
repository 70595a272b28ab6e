//! Native measurement of the join workload (`make bench`'s joins benchmark without the host,
//! DataFusion or differential-dataflow, for profiling the engine alone):
//! `cargo run -p sandflow-engine --release --example join_workload`
use std::time::Instant;

use sandflow_engine::bench::{join_dims, join_facts, run_join_workload};

const FACTS: usize = 1_000_000;
const BATCH: usize = 10_000;
const DIMS: i64 = 10_000;
const ATTRS: i64 = 100;

fn main() -> Result<(), sandflow_engine::FlowError> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let mut best = f64::MAX;
    for run in 0..runs {
        let facts: Vec<_> = (0..FACTS / BATCH)
            .map(|b| join_facts(b, BATCH, DIMS))
            .collect();
        let dims = join_dims(DIMS, ATTRS);
        let t0 = Instant::now();
        let (rows, checksum) = run_join_workload(dims, facts)?;
        let dt = t0.elapsed().as_secs_f64();
        best = best.min(dt);
        println!(
            "run {run}: {FACTS} fact rows in {:.1} ms = {:.2} M rows/s ({rows} output rows, \
             checksum {checksum})",
            dt * 1e3,
            FACTS as f64 / dt / 1e6
        );
    }
    println!("best: {:.2} M fact rows/s", FACTS as f64 / best / 1e6);
    Ok(())
}
