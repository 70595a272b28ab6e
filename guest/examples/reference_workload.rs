//! Native measurement of the reference workload:
//! `cargo run -p sandflow-engine --release --example reference_workload`
use std::time::Instant;

use sandflow_engine::bench::{reference_batch, run_reference_workload};

fn main() -> Result<(), sandflow_engine::FlowError> {
    let total: u64 = 1_000_000;
    let batch: u32 = 10_000;
    let mut best = f64::MAX;
    for run in 0..5 {
        let batches: Vec<_> = (0..total / batch as u64)
            .map(|i| reference_batch(i * batch as u64, batch))
            .collect();
        let t0 = Instant::now();
        let out = run_reference_workload(batches)?;
        let dt = t0.elapsed().as_secs_f64();
        best = best.min(dt);
        println!(
            "run {run}: {total} rows in {:.1} ms = {:.1} M rows/s ({out} output rows)",
            dt * 1e3,
            total as f64 / dt / 1e6
        );
    }
    println!("best: {:.1} M rows/s", total as f64 / best / 1e6);
    Ok(())
}
