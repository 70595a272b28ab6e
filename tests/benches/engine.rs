//! The reference workload (DESIGN.md, "Measuring"): 1,000,000 rows, key =
//! i % 1000, value = i, batches of 10,000, count and sum per key, every
//! batch's output delta read back. Runs the same plan through the guest in
//! wasm (through the host runtime) and natively, and prints one line per
//! engine with rows/s, plus their ratio from this same run. Both engines get
//! the same batches, each with one time and one diff for all its rows (the
//! form the host's write path sends).

use std::time::{Duration, Instant};

use sandflow::runtime::{FlowLimits, RuntimeConfig};
use sandflow_engine::types::Batch;
use sandflow_tests::engine::Runtime;
use sandflow_tests::engine::{plan, reference_batches, reference_sources};

const ROWS: usize = 1_000_000;
const BATCH: usize = 10_000;
const KEYS: i64 = 1000;
const RUNS: usize = 5;

/// Runs per engine: `SANDFLOW_BENCH_RUNS` (e.g. 1 under valgrind), else [`RUNS`].
fn runs() -> usize {
    std::env::var("SANDFLOW_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(RUNS)
}

/// Minor page faults of this process so far (Linux; 0 elsewhere).
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Fields after the command name (which is in parentheses); minflt is field 10.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Runs the workload once; returns the elapsed time, the part of it spent in
/// `push`, the minor page faults taken, and a checksum of the output.
fn run(
    mut push: impl FnMut(Batch),
    mut tick: impl FnMut(i64) -> (u32, i64),
    input: Vec<Batch>,
) -> (Duration, Duration, u64, i64) {
    let mut checksum = 0i64;
    let mut pushing = Duration::ZERO;
    let faults = minor_faults();
    let started = Instant::now();
    for (i, b) in input.into_iter().enumerate() {
        let p = Instant::now();
        push(b);
        pushing += p.elapsed();
        let (rows, sum) = tick(i as i64);
        checksum = checksum.wrapping_add(rows as i64).wrapping_add(sum);
    }
    let elapsed = started.elapsed();
    (elapsed, pushing, minor_faults() - faults, checksum)
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let sources = reference_sources();
    let plan = plan(
        "SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k",
        &sources,
    );
    let input = reference_batches(ROWS, BATCH, KEYS);
    let read = |out: &Batch| -> (u32, i64) {
        // Read the delta back: every value of every column and every diff.
        let mut sum = 0i64;
        for c in &out.columns {
            sum = c.ints.iter().fold(sum, |a, v| a.wrapping_add(*v));
        }
        (
            out.rows,
            out.diffs.iter().fold(sum, |a, d| a.wrapping_add(*d)),
        )
    };

    // SANDFLOW_BENCH_GUEST=<component.wasm> measures another build of the guest
    // (e.g. one built with different flags) instead of the embedded one.
    // One instance is alive at a time; a small pool also fits in valgrind's address space.
    let config = RuntimeConfig {
        pool: Some(2),
        ..RuntimeConfig::default()
    };
    let runtime = match std::env::var_os("SANDFLOW_BENCH_GUEST") {
        Some(path) => {
            let bytes = std::fs::read(&path).expect("read SANDFLOW_BENCH_GUEST");
            Runtime::with_component(config, &bytes)
        }
        None => Runtime::engine(config),
    }
    .expect("wasm runtime");
    let limits = FlowLimits {
        max_output_rows: u32::MAX,
        ..FlowLimits::default()
    };
    let mut wasm_times = Vec::new();
    let mut native_times = Vec::new();
    let mut wasm_push = Vec::new();
    let mut native_push = Vec::new();
    let mut wasm_faults = Vec::new();
    let mut native_faults = Vec::new();
    let mut sums = (0, 0);
    let runs = runs();
    for _ in 0..runs {
        let mut flow = runtime
            .create_flow(&plan, &sources, &[], limits)
            .expect("wasm flow");
        let (t, p, f, s) = {
            let flow = std::cell::RefCell::new(&mut flow);
            run(
                |b| flow.borrow_mut().push(0, b).expect("wasm push"),
                |now| read(&flow.borrow_mut().tick(now).expect("wasm tick").output),
                input.clone(),
            )
        };
        wasm_times.push(t);
        wasm_push.push(p);
        wasm_faults.push(f);
        sums.0 = s;

        let mut native =
            sandflow_engine::Flow::create(&plan, sources.clone(), vec![]).expect("native flow");
        let (t, p, f, s) = {
            let native = std::cell::RefCell::new(&mut native);
            run(
                |b| native.borrow_mut().push(0, b).expect("native push"),
                |now| {
                    read(
                        &native
                            .borrow_mut()
                            .tick(now, u32::MAX)
                            .expect("native tick")
                            .output,
                    )
                },
                input.clone(),
            )
        };
        native_times.push(t);
        native_push.push(p);
        native_faults.push(f);
        sums.1 = s;
    }
    assert_eq!(sums.0, sums.1, "wasm and native outputs differ");
    let wasm = median(wasm_times);
    let native = median(native_times);
    let rate = |d: Duration| ROWS as f64 / d.as_secs_f64() / 1e6;
    println!("reference workload: {ROWS} rows, {KEYS} keys, batches of {BATCH}, count+sum per key, median of {runs} runs");
    println!(
        "wasm   {:>8.1} M rows/s  ({:.1} ms)",
        rate(wasm),
        wasm.as_secs_f64() * 1e3
    );
    println!(
        "native {:>8.1} M rows/s  ({:.1} ms)",
        rate(native),
        native.as_secs_f64() * 1e3
    );
    println!(
        "wasm/native time ratio {:.2}x",
        wasm.as_secs_f64() / native.as_secs_f64()
    );
    let (wp, np) = (median(wasm_push), median(native_push));
    println!(
        "of which push (median): wasm {:.1} ms, native {:.1} ms; tick and read-back: wasm {:.1} ms, native {:.1} ms",
        wp.as_secs_f64() * 1e3,
        np.as_secs_f64() * 1e3,
        wasm.saturating_sub(wp).as_secs_f64() * 1e3,
        native.saturating_sub(np).as_secs_f64() * 1e3
    );
    wasm_faults.sort();
    native_faults.sort();
    println!(
        "minor page faults per run (median): wasm {}, native {}",
        wasm_faults[wasm_faults.len() / 2],
        native_faults[native_faults.len() / 2]
    );
}
