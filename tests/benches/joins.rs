//! The join workload (issue "Flows over several sources"): a 10,000-row
//! dimension table `d (k, a)` with a = k % 100, then 1,000,000 fact rows
//! `f (k, v)` with k = i % 10,000 and v = i in batches of 10,000, joined and
//! aggregated: `SELECT d.a, count(*), sum(f.v) FROM f JOIN d ON f.k = d.k
//! GROUP BY d.a`. Every batch's output delta is read back.
//!
//! Runs sandflow's engine in wasm (through the host runtime) and natively,
//! and the same computation in differential-dataflow natively (one timely
//! worker on this thread: join, then reduce), in one run, alternating, and
//! prints rows/s, this thread's CPU time per run and the ratios. All three
//! must produce the same deltas (a checksum of every value and diff).
//!
//! Built only with `--features dd` (`make bench`), so that the tests do not
//! compile differential-dataflow.

use std::time::{Duration, Instant};

use differential_dataflow::input::InputSession;
use sandflow::runtime::{FlowLimits, RuntimeConfig};
use sandflow_engine::types::{Batch, Column, DataType, Field, SourceSchema};
use sandflow_tests::engine::{plan, Runtime};

const FACTS: usize = 1_000_000;
const DIMS: i64 = 10_000;
const ATTRS: i64 = 100;
const BATCH: usize = 10_000;
const RUNS: usize = 3;

fn runs() -> usize {
    std::env::var("SANDFLOW_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(RUNS)
}

fn ints(v: Vec<i64>) -> Column {
    Column {
        ints: v,
        ..Column::default()
    }
}

fn dims() -> Batch {
    Batch {
        rows: DIMS as u32,
        columns: vec![
            ints((0..DIMS).collect()),
            ints((0..DIMS).map(|k| k % ATTRS).collect()),
        ],
        times: vec![0],
        diffs: vec![1],
    }
}

fn facts() -> Vec<Batch> {
    (0..FACTS / BATCH)
        .map(|b| {
            let start = (b * BATCH) as i64;
            let range = start..start + BATCH as i64;
            Batch {
                rows: BATCH as u32,
                columns: vec![
                    ints(range.clone().map(|i| i % DIMS).collect()),
                    ints(range.collect()),
                ],
                times: vec![b as i64 + 1],
                diffs: vec![1],
            }
        })
        .collect()
}

/// This thread's CPU time so far (Linux's schedstat; zero elsewhere).
fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .unwrap_or_default()
}

/// Reads a delta back: (rows, sum of every value and diff).
fn read(out: &Batch) -> (u64, i64) {
    let mut sum = 0i64;
    for c in &out.columns {
        sum = c.ints.iter().fold(sum, |a, v| a.wrapping_add(*v));
    }
    (
        out.rows as u64,
        out.diffs.iter().fold(sum, |a, d| a.wrapping_add(*d)),
    )
}

struct Measured {
    wall: Duration,
    cpu: Duration,
    rows: u64,
    checksum: i64,
}

/// Pushes the dimension table, ticks, then each fact batch and a tick.
fn drive(
    mut push: impl FnMut(u32, Batch),
    mut tick: impl FnMut(i64) -> (u64, i64),
    facts: Vec<Batch>,
) -> Measured {
    let (mut rows, mut checksum) = (0u64, 0i64);
    let cpu = thread_cpu();
    let started = Instant::now();
    push(1, dims());
    let (r, s) = tick(0);
    rows += r;
    checksum = checksum.wrapping_add(s);
    for (i, b) in facts.into_iter().enumerate() {
        push(0, b);
        let (r, s) = tick(i as i64 + 1);
        rows += r;
        checksum = checksum.wrapping_add(s);
    }
    Measured {
        wall: started.elapsed(),
        cpu: thread_cpu().saturating_sub(cpu),
        rows,
        checksum,
    }
}

/// The same workload in differential-dataflow: one worker on this thread.
/// `totals`: count and sum as a `(count, sum)` difference accumulated by
/// `count_total` (DD's idiom for sums, no per-group recomputation), else a
/// `reduce` that recomputes each changed group from its values.
fn differential(facts_in: &[Batch], totals: bool) -> Measured {
    use differential_dataflow::operators::CountTotal;
    let facts_in = facts_in.to_vec();
    timely::execute_directly(move |worker| {
        let mut facts = InputSession::<u64, (i64, i64), i64>::new();
        let mut dims_in = InputSession::<u64, (i64, i64), i64>::new();
        let (rows, sum) = (
            std::rc::Rc::new(std::cell::Cell::new(0u64)),
            std::rc::Rc::new(std::cell::Cell::new(0i64)),
        );
        let (r2, s2) = (rows.clone(), sum.clone());
        let probe = worker.dataflow(|scope| {
            let f = facts.to_collection(scope);
            let d = dims_in.to_collection(scope);
            let joined = f.join(d);
            let record = move |a: i64, c: i64, s: i64, diff: i64| {
                r2.set(r2.get() + 1);
                s2.set(
                    s2.get()
                        .wrapping_add(a)
                        .wrapping_add(c)
                        .wrapping_add(s)
                        .wrapping_add(diff),
                );
            };
            let probe = if totals {
                joined
                    .explode(|(_k, (v, a))| Some((a, (1i64, v))))
                    .count_total()
                    .inspect(move |((a, (c, s)), _t, diff)| record(*a, *c, *s, *diff as i64))
                    .probe()
                    .0
            } else {
                joined
                    .map(|(_k, (v, a))| (a, v))
                    .reduce(|_a, input, output: &mut Vec<((i64, i64), i64)>| {
                        let (mut c, mut s) = (0i64, 0i64);
                        for (v, n) in input {
                            c += *n;
                            s += **v * *n;
                        }
                        output.push(((c, s), 1));
                    })
                    .inspect(move |((a, (c, s)), _t, diff)| record(*a, *c, *s, *diff))
                    .probe()
                    .0
            };
            probe
        });
        let cpu = thread_cpu();
        let started = Instant::now();
        let d = dims();
        for (k, a) in d.columns[0].ints.iter().zip(&d.columns[1].ints) {
            dims_in.update((*k, *a), 1);
        }
        let mut time = 1u64;
        facts.advance_to(time);
        dims_in.advance_to(time);
        facts.flush();
        dims_in.flush();
        worker.step_while(|| probe.less_than(facts.time()));
        for b in facts_in {
            for (k, v) in b.columns[0].ints.iter().zip(&b.columns[1].ints) {
                facts.update((*k, *v), 1);
            }
            time += 1;
            facts.advance_to(time);
            dims_in.advance_to(time);
            facts.flush();
            dims_in.flush();
            worker.step_while(|| probe.less_than(facts.time()));
        }
        Measured {
            wall: started.elapsed(),
            cpu: thread_cpu().saturating_sub(cpu),
            rows: rows.get(),
            checksum: sum.get(),
        }
    })
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let sources = vec![
        SourceSchema {
            name: "f".into(),
            fields: vec![
                Field::new("k", DataType::Int64, false),
                Field::new("v", DataType::Int64, false),
            ],
        },
        SourceSchema {
            name: "d".into(),
            fields: vec![
                Field::new("k", DataType::Int64, false),
                Field::new("a", DataType::Int64, false),
            ],
        },
    ];
    let plan = plan(
        "SELECT d.a, count(*) AS c, sum(f.v) AS s FROM f JOIN d ON f.k = d.k GROUP BY d.a",
        &sources,
    );
    let input = facts();
    let runtime = Runtime::engine(RuntimeConfig {
        pool: Some(2),
        ..RuntimeConfig::default()
    })
    .expect("wasm runtime");
    let limits = FlowLimits {
        max_output_rows: u32::MAX,
        memory: 2 << 30,
        cpu_per_call: Duration::from_secs(60),
        ..FlowLimits::default()
    };
    let mut results: [Vec<Measured>; 4] = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..runs() {
        let mut flow = runtime
            .create_flow(&plan, &sources, &[], limits)
            .expect("wasm flow");
        let flow = std::cell::RefCell::new(&mut flow);
        results[0].push(drive(
            |s, b| flow.borrow_mut().push(s, b).expect("wasm push"),
            |now| read(&flow.borrow_mut().tick(now).expect("wasm tick").output),
            input.clone(),
        ));
        let native = std::cell::RefCell::new(
            sandflow_engine::Flow::create(&plan, sources.clone(), vec![]).expect("native flow"),
        );
        results[1].push(drive(
            |s, b| native.borrow_mut().push(s, b).expect("native push"),
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
        ));
        results[2].push(differential(&input, true));
        results[3].push(differential(&input, false));
    }
    let names = [
        "sandflow wasm",
        "sandflow native",
        "differential-dataflow (count_total)",
        "differential-dataflow (reduce)",
    ];
    let first = (results[0][0].rows, results[0][0].checksum);
    for (name, r) in names.iter().zip(&results) {
        for m in r {
            assert_eq!(
                (m.rows, m.checksum),
                first,
                "{name}'s output deltas differ from sandflow wasm's"
            );
        }
    }
    let wall: Vec<Duration> = results
        .iter()
        .map(|r| median(r.iter().map(|m| m.wall).collect()))
        .collect();
    let cpu: Vec<Duration> = results
        .iter()
        .map(|r| median(r.iter().map(|m| m.cpu).collect()))
        .collect();
    println!(
        "join workload: {DIMS} dimension rows, {FACTS} fact rows in batches of {BATCH}, \
         join + count/sum per attribute ({ATTRS}), {} delta rows read back, median of {} runs",
        first.0,
        runs()
    );
    for i in 0..names.len() {
        println!(
            "{:<36} {:>7.2} M fact rows/s  wall {:>7.1} ms  thread CPU {:>7.1} ms",
            names[i],
            FACTS as f64 / wall[i].as_secs_f64() / 1e6,
            wall[i].as_secs_f64() * 1e3,
            cpu[i].as_secs_f64() * 1e3
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    // The faster of the two differential-dataflow programs is the peer.
    let dd = cpu[2].min(cpu[3]);
    println!(
        "differential-dataflow CPU (its faster program) / sandflow wasm CPU: {:.2}x (above 1: \
         sandflow in wasm is faster per CPU-second)",
        ratio(dd, cpu[0])
    );
    println!(
        "differential-dataflow CPU (its faster program) / sandflow native CPU: {:.2}x",
        ratio(dd, cpu[1])
    );
}
