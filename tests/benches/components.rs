//! User components beside the built-in engine, in one run:
//!
//! 1. Instantiation: the time to instantiate a component and call its
//!    `create` (what starting or restoring a flow costs before any state is
//!    loaded), with instances from a pool (wasmtime's pooling allocator) and
//!    allocated on demand (the server's default).
//! 2. Per-batch cost on the reference workload (DESIGN.md, "Measuring":
//!    key = i % 1000, value = i, batches of 10,000 rows, every batch's
//!    output read back): push one batch, tick, read the output. The
//!    built-in engine maintains count and sum per key; the Rust example
//!    (`guest/sdk/examples/topk`) the 3 largest values per key; the Python
//!    example (`guest/sdk/examples/anomaly-py`) count, mean, stddev and an
//!    anomaly score per key. All three get the same first batches; the
//!    built-in engine and the Rust example also the whole million rows.
//!
//! The examples are built by `make examples` (`make bench` runs it first).
//! Figures are medians; ratios are to the built-in engine in this same run.

use std::time::{Duration, Instant};

use sandflow::runtime::{Digest, FlowLimits, RuntimeConfig, Sandbox};
use sandflow_engine::types::Batch;
use sandflow_tests::engine::{
    anomaly_component, plan, reference_batches, reference_sources, topk_component,
};

const ROWS: usize = 1_000_000;
const BATCH: usize = 10_000;
const KEYS: i64 = 1000;
/// Batches every subject gets (the Python example recomputes each changed
/// key's statistics over all its values, in CPython inside wasm).
const SHARED_BATCHES: usize = 10;
const INSTANTIATIONS: usize = 20;

struct Subject {
    name: &'static str,
    bytes: Vec<u8>,
    plan: Vec<u8>,
    options: Vec<(String, String)>,
    /// Whether it gets the whole workload, not only the shared batches.
    whole: bool,
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn limits() -> FlowLimits {
    FlowLimits {
        memory: 1 << 30,
        cpu_per_call: Duration::from_secs(600),
        max_output_rows: u32::MAX,
        output_rows_per_tick: u64::MAX,
        state_size: None,
    }
}

/// Registers every subject in `sandbox` (user components as the server
/// does: checked, then compiled); returns their digests.
fn register(sandbox: &Sandbox, subjects: &[Subject]) -> Vec<Digest> {
    subjects
        .iter()
        .map(|s| {
            if s.name == "built-in" {
                sandbox.register(&s.bytes).expect("register the engine")
            } else {
                sandbox
                    .compile_untrusted(&s.bytes)
                    .unwrap_or_else(|e| panic!("{}: {e}", s.name))
                    .0
            }
        })
        .collect()
}

/// Median time of instantiating a flow (instance + `create`) and dropping it.
fn instantiation(sandbox: &Sandbox, digest: &Digest, s: &Subject) -> Duration {
    let sources = reference_sources();
    let times = (0..INSTANTIATIONS)
        .map(|_| {
            let started = Instant::now();
            let flow = sandbox
                .create_flow(digest, &s.plan, &sources, &s.options, limits())
                .unwrap_or_else(|e| panic!("{}: {e}", s.name));
            let t = started.elapsed();
            drop(flow);
            t
        })
        .collect();
    median(times)
}

/// Pushes and ticks `input` batch by batch, reading every output back;
/// returns each batch's time and the number of output rows.
fn per_batch(
    sandbox: &Sandbox,
    digest: &Digest,
    s: &Subject,
    input: &[Batch],
) -> (Vec<Duration>, u64) {
    let mut flow = sandbox
        .create_flow(digest, &s.plan, &reference_sources(), &s.options, limits())
        .unwrap_or_else(|e| panic!("{}: {e}", s.name));
    let mut out_rows = 0u64;
    let mut checksum = 0i64;
    let times = input
        .iter()
        .enumerate()
        .map(|(b, batch)| {
            let started = Instant::now();
            flow.push(0, batch.clone())
                .unwrap_or_else(|e| panic!("{} push: {e}", s.name));
            let out = flow
                .tick(b as i64)
                .unwrap_or_else(|e| panic!("{} tick: {e}", s.name))
                .output;
            // Read the delta back: every value of every column and every diff.
            for c in &out.columns {
                checksum = c.ints.iter().fold(checksum, |a, v| a.wrapping_add(*v));
                checksum = c
                    .floats
                    .iter()
                    .fold(checksum, |a, v| a.wrapping_add(v.to_bits() as i64));
                checksum = checksum.wrapping_add(c.bytes.len() as i64);
            }
            checksum = out.diffs.iter().fold(checksum, |a, d| a.wrapping_add(*d));
            out_rows += out.rows as u64;
            started.elapsed()
        })
        .collect();
    std::hint::black_box(checksum);
    (times, out_rows)
}

fn main() {
    let sources = reference_sources();
    let passthrough = plan("SELECT k, v FROM t", &sources);
    let options = vec![
        ("key".to_string(), "k".to_string()),
        ("value".to_string(), "v".to_string()),
    ];
    let subjects = vec![
        Subject {
            name: "built-in",
            bytes: sandflow::engine::component().to_vec(),
            plan: plan(
                "SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k",
                &sources,
            ),
            options: vec![],
            whole: true,
        },
        Subject {
            name: "rust topk",
            bytes: topk_component(),
            plan: passthrough.clone(),
            options: options.clone(),
            whole: true,
        },
        Subject {
            name: "python anomaly",
            bytes: anomaly_component(),
            plan: passthrough,
            options,
            whole: false,
        },
    ];
    let input = reference_batches(ROWS, BATCH, KEYS);

    println!(
        "component flows beside the built-in engine ({} instantiations each, medians)",
        INSTANTIATIONS
    );
    println!("instantiation (instance + create):");
    let pooled = Sandbox::new(RuntimeConfig {
        pool: Some(4),
        ..RuntimeConfig::default()
    })
    .expect("pooled sandbox");
    let on_demand = Sandbox::new(RuntimeConfig::default()).expect("sandbox");
    let (pooled_ids, on_demand_ids) = (
        register(&pooled, &subjects),
        register(&on_demand, &subjects),
    );
    let mut base = None;
    for (i, s) in subjects.iter().enumerate() {
        let p = instantiation(&pooled, &pooled_ids[i], s);
        let d = instantiation(&on_demand, &on_demand_ids[i], s);
        let b = *base.get_or_insert(p);
        println!(
            "  {:<15} pooled {:>8.3} ms  on demand {:>8.3} ms  (pooled: {:>6.1}x built-in; component {:.1} MB)",
            s.name,
            ms(p),
            ms(d),
            p.as_secs_f64() / b.as_secs_f64(),
            s.bytes.len() as f64 / 1e6
        );
    }

    println!(
        "per batch on the reference workload (push {BATCH} rows, tick, read the output back):"
    );
    let mut base_shared = None;
    let mut base_whole = None;
    for (i, s) in subjects.iter().enumerate() {
        let n = if s.whole { input.len() } else { SHARED_BATCHES };
        let (times, out_rows) = per_batch(&pooled, &pooled_ids[i], s, &input[..n]);
        let shared = median(times[..SHARED_BATCHES].to_vec());
        let bs = *base_shared.get_or_insert(shared);
        let mut line = format!(
            "  {:<15} first {SHARED_BATCHES} batches: {:>9.3} ms/batch ({:>7.1}x built-in)",
            s.name,
            ms(shared),
            shared.as_secs_f64() / bs.as_secs_f64()
        );
        if s.whole {
            let total: Duration = times.iter().sum();
            let all = median(times);
            let bw = *base_whole.get_or_insert(all);
            line += &format!(
                "; all {n} batches: {:>8.3} ms/batch ({:>5.1}x), {:>6.2} M rows/s, {out_rows} output rows",
                ms(all),
                all.as_secs_f64() / bw.as_secs_f64(),
                (n * BATCH) as f64 / total.as_secs_f64() / 1e6
            );
        }
        println!("{line}");
    }
}
