//! The guest's part of a back-fill (tests/benches/whole_path.py's): the
//! rollup `count, sum, min, max per key and minute` over 1,000,000 rows of
//! 1,000 series (10 ms apart, so 6 rows per series and minute), pushed in
//! parts of 8,192 rows as the host reads a table, one tick
//! at the end, then a snapshot. Prints the time of each phase for the guest
//! in wasm and natively, for rows in time order (a table keyed by time
//! first, as tables are made now) and in series order (one keyed by its
//! series first).

use std::time::{Duration, Instant};

use sandflow::runtime::{FlowLimits, RuntimeConfig};
use sandflow_engine::types::{Batch, Column, DataType, Field, SourceSchema};
use sandflow_tests::engine::{plan, Runtime};

const ROWS: usize = 1_000_000;
const KEYS: usize = 1000;
const PART: usize = 8192;
const RUNS: usize = 5;

fn sources() -> Vec<SourceSchema> {
    vec![SourceSchema {
        name: "m".into(),
        fields: vec![
            Field::new("k", DataType::Utf8, false),
            Field::new("ts", DataType::TimestampMillisecond, false),
            Field::new("v", DataType::Float64, false),
        ],
    }]
}

/// The rows in parts: in time order, as a back-fill reads a table keyed by
/// time first, or with `by_series` in series order (keys as strings,
/// sorted), as it reads one keyed by its series first.
fn parts(by_series: bool) -> Vec<Batch> {
    let names: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    let mut rows = Vec::with_capacity(ROWS);
    if by_series {
        let mut keys: Vec<(&String, usize)> = names.iter().zip(0..).collect();
        keys.sort();
        for (name, k) in keys {
            for i in (k..ROWS).step_by(KEYS) {
                rows.push((name.as_str(), 10 * i as i64, (i % 97) as f64 * 1.5));
            }
        }
    } else {
        for i in 0..ROWS {
            rows.push((
                names[i % KEYS].as_str(),
                10 * i as i64,
                (i % 97) as f64 * 1.5,
            ));
        }
    }
    let last = rows.len().div_ceil(PART) - 1;
    rows.chunks(PART)
        .enumerate()
        .map(|(p, chunk)| {
            let mut k = Column::default();
            k.offsets.push(0);
            let mut ts = Column::default();
            let mut v = Column::default();
            for (name, t, x) in chunk {
                k.bytes.extend_from_slice(name.as_bytes());
                k.offsets.push(k.bytes.len() as u32);
                ts.ints.push(*t);
                v.floats.push(*x);
            }
            Batch {
                rows: chunk.len() as u32,
                columns: vec![k, ts, v],
                times: vec![if p == last { 1 } else { i64::MIN }],
                diffs: vec![1],
            }
        })
        .collect()
}

struct Phases {
    push: Duration,
    tick: Duration,
    snapshot: Duration,
    out_rows: u64,
    state: usize,
}

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn report(name: &str, runs: &[Phases]) {
    let m = |f: fn(&Phases) -> Duration| median(runs.iter().map(f).collect());
    let (p, t, s) = (m(|r| r.push), m(|r| r.tick), m(|r| r.snapshot));
    let total = p + t + s;
    println!(
        "{name:22} push {:>6.1} ms  tick {:>5.1} ms  snapshot {:>5.1} ms  total {:>6.1} ms  \
         {:>5.2} M rows/s",
        p.as_secs_f64() * 1e3,
        t.as_secs_f64() * 1e3,
        s.as_secs_f64() * 1e3,
        total.as_secs_f64() * 1e3,
        ROWS as f64 / total.as_secs_f64() / 1e6,
    );
}

/// One back-fill through `push`, `tick` (until it has no more) and
/// `snapshot`, timed phase by phase.
fn run(
    input: &[Batch],
    mut push: impl FnMut(Batch),
    mut tick: impl FnMut() -> (u32, bool),
    snapshot: impl FnOnce() -> usize,
) -> Phases {
    let input = input.to_vec();
    let started = Instant::now();
    for b in input {
        push(b);
    }
    let push = started.elapsed();
    let started = Instant::now();
    let mut out_rows = 0u64;
    loop {
        let (rows, more) = tick();
        out_rows += u64::from(rows);
        if !more {
            break;
        }
    }
    let tick = started.elapsed();
    let started = Instant::now();
    let state = snapshot();
    Phases {
        push,
        tick,
        snapshot: started.elapsed(),
        out_rows,
        state,
    }
}

fn main() {
    let sources = sources();
    let plan = plan(
        "SELECT k, date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS n, sum(v) AS total, \
         min(v) AS lo, max(v) AS hi FROM m GROUP BY k, minute",
        &sources,
    );
    // BACKFILL_ONLY=wasm|native measures one engine; BACKFILL_GUEST=<component.wasm>
    // another build of the guest (e.g. one being tried, built alone in seconds).
    let only = std::env::var("BACKFILL_ONLY").unwrap_or_default();
    let runtime = match std::env::var_os("BACKFILL_GUEST") {
        Some(path) => Runtime::with_component(
            RuntimeConfig::default(),
            &std::fs::read(path).expect("read BACKFILL_GUEST"),
        ),
        None => Runtime::engine(RuntimeConfig::default()),
    }
    .expect("wasm runtime");
    let limits = FlowLimits {
        max_output_rows: u32::MAX,
        ..FlowLimits::default()
    };
    // One output row per (series, minute).
    let groups = (0..ROWS)
        .map(|i| (i % KEYS, 10 * i / 60_000))
        .collect::<std::collections::HashSet<_>>()
        .len() as u64;
    for (order, by_series) in [("time order", false), ("series order", true)] {
        let input = parts(by_series);
        let (mut wasm, mut native) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            if only != "native" {
                let mut flow = runtime
                    .create_flow(&plan, &sources, &[], limits)
                    .expect("wasm flow");
                let flow = std::cell::RefCell::new(&mut flow);
                wasm.push(run(
                    &input,
                    |b| flow.borrow_mut().push(0, b).expect("wasm push"),
                    || {
                        let t = flow.borrow_mut().tick(1).expect("wasm tick");
                        (t.output.rows, t.more)
                    },
                    || flow.borrow_mut().snapshot().expect("wasm snapshot").len(),
                ));
            }
            if only != "wasm" {
                let flow = sandflow_engine::Flow::create(&plan, sources.clone(), vec![])
                    .expect("native flow");
                let flow = std::cell::RefCell::new(flow);
                native.push(run(
                    &input,
                    |b| flow.borrow_mut().push(0, b).expect("native push"),
                    || {
                        let t = flow.borrow_mut().tick(1, u32::MAX).expect("native tick");
                        (t.output.rows, t.more)
                    },
                    || flow.borrow_mut().snapshot().expect("native snapshot").len(),
                ));
            }
        }
        // Every run made every group, and both engines hold the same state.
        let states: Vec<usize> = wasm.iter().chain(&native).map(|p| p.state).collect();
        assert!(
            wasm.iter().chain(&native).all(|p| p.out_rows == groups),
            "a run did not emit one row per group ({groups})"
        );
        assert!(
            states.windows(2).all(|w| w[0] == w[1]),
            "states differ: {states:?}"
        );
        if !wasm.is_empty() {
            report(&format!("wasm, {order}"), &wasm);
        }
        if !native.is_empty() {
            report(&format!("native, {order}"), &native);
        }
    }
}
