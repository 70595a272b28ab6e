//! Flows pull their input from the change log. Two measurements, each in
//! this process on the library (`make bench` runs them):
//!
//! 1. **A stalled flow costs no memory.** A database on disk with a virtual
//!    clock, so that its flow runs only when driven: 1,000,000 rows are
//!    written into the flow's source while the flow does not run. The
//!    process's resident memory may grow by less than 64 MiB (the rows wait
//!    in the log on disk); then the flow is released and its sink must be
//!    exact.
//! 2. **A back-fill does not hold writers up.** A writer's INSERT latency
//!    (p50, p99) alone, then while CREATE FLOW back-fills a
//!    1,000,000-row table, in one run; reports the p99 ratio.
//!
//! `SANDFLOW_BENCH_ROWS` changes the row count (default 1,000,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Int64Array, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::record_batch::RecordBatch;
use sandflow::clock::VirtualClock;
use sandflow::database::DatabaseConfig;
use sandflow::{Database, Output};

const MIB: f64 = 1024.0 * 1024.0;
const BATCH: usize = 10_000;

fn rows_wanted() -> usize {
    std::env::var("SANDFLOW_BENCH_ROWS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1_000_000)
}

/// Resident bytes of this process.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

fn batch(from: usize, n: usize) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("v", DataType::Int64, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
    ]));
    let ks: Vec<i64> = (from..from + n).map(|i| i as i64).collect();
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from(ks.clone())),
            Arc::new(Int64Array::from(
                ks.iter().map(|k| k % 7).collect::<Vec<_>>(),
            )),
            Arc::new(TimestampMillisecondArray::from(ks)),
        ],
    )
    .expect("batch")
}

async fn one_row(db: &Database, sql: &str) -> Vec<String> {
    let out = db.execute(sql).await.expect(sql);
    let Some(Output::Rows { batches, .. }) = out.into_iter().last() else {
        panic!("{sql}: no rows");
    };
    let b = &batches[0];
    (0..b.num_columns())
        .map(|c| {
            datafusion::arrow::util::display::array_value_to_string(b.column(c), 0).expect("cell")
        })
        .collect()
}

async fn fill(db: &Database, table: &str, rows: usize) {
    let mut at = 0;
    while at < rows {
        let n = BATCH.min(rows - at);
        db.insert_batch(table, batch(at, n)).await.expect("insert");
        at += n;
    }
}

async fn stalled_flow(rows: usize, with_flow: bool) {
    let dir = tempfile::tempdir().expect("dir");
    let clock = Arc::new(VirtualClock::new(0));
    let db = Database::open_config(DatabaseConfig::dir(dir.path()).with_virtual_clock(clock))
        .await
        .expect("open");
    db.execute("CREATE TABLE src (k BIGINT, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))")
        .await
        .expect("setup");
    if with_flow {
        db.execute("CREATE FLOW f SINK TO out AS SELECT count(*) AS n, sum(v) AS s FROM src")
            .await
            .expect("flow");
        db.run_flows().await.expect("run");
    }
    // Warm up the write path so that the measurement sees the steady state.
    fill(&db, "src", BATCH).await;
    if with_flow {
        db.flush_flow("f").await.expect("flush");
    }
    let before = rss();
    let started = Instant::now();
    // The flow is not driven: it cannot make progress while these go in.
    let mut at = BATCH;
    while at < rows {
        let n = BATCH.min(rows - at);
        db.insert_batch("src", batch(at, n)).await.expect("insert");
        at += n;
    }
    let written = started.elapsed();
    let after = rss();
    let growth = after.saturating_sub(before) as f64 / MIB;
    if !with_flow {
        println!(
            "baseline, no flow: {rows} rows written in {:.1} s; resident memory grew by {growth:.1} MiB",
            written.as_secs_f64()
        );
        return;
    }
    let started = Instant::now();
    db.flush_flow("f").await.expect("flush after the stall");
    let caught_up = started.elapsed();
    let sink = one_row(&db, "SELECT n, s FROM out").await;
    let want_sum: i64 = (0..rows as i64).map(|k| k % 7).sum();
    println!(
        "stalled flow: {rows} rows written in {:.1} s while the flow did not run; resident memory \
         grew by {growth:.1} MiB ({:.1} -> {:.1} MiB); released, it caught up in {:.1} s; sink n={} s={}",
        written.as_secs_f64(),
        before as f64 / MIB,
        after as f64 / MIB,
        caught_up.as_secs_f64(),
        sink[0],
        sink[1]
    );
    assert_eq!(
        sink,
        [rows.to_string(), want_sum.to_string()],
        "the sink is exact"
    );
    assert!(
        growth < 64.0,
        "resident memory grew by {growth:.1} MiB while the flow was stalled (limit 64 MiB)"
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// INSERTs one row at a time until `until` says stop (at least `min` of
/// them); returns their latencies, sorted.
async fn writer(
    db: Arc<Database>,
    start: usize,
    min: usize,
    until: Arc<std::sync::atomic::AtomicBool>,
) -> Vec<Duration> {
    let mut lat = Vec::new();
    let mut i = start;
    while lat.len() < min || !until.load(std::sync::atomic::Ordering::SeqCst) {
        let sql = format!("INSERT INTO w VALUES ({i}, {i})");
        let t = Instant::now();
        db.execute(&sql).await.expect("writer insert");
        lat.push(t.elapsed());
        i += 1;
    }
    lat.sort();
    lat
}

async fn backfill_latency(rows: usize) {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(dir.path()).await.expect("open");
    db.execute(
        "CREATE TABLE big (k BIGINT, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k)); \
         CREATE TABLE w (k BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
    )
    .await
    .expect("setup");
    fill(&db, "big", rows).await;
    let min = 400;
    let done = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let alone = writer(db.clone(), 0, min, done.clone()).await;
    done.store(false, std::sync::atomic::Ordering::SeqCst);
    let w = tokio::spawn(writer(db.clone(), 1_000_000, min, done.clone()));
    let started = Instant::now();
    db.execute("CREATE FLOW fb SINK TO sb AS SELECT count(*) AS n, sum(v) AS s FROM big")
        .await
        .expect("create flow");
    db.flush_flow("fb").await.expect("flush");
    let backfill = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let during = w.await.expect("writer");
    let sink = one_row(&db, "SELECT n FROM sb").await;
    assert_eq!(sink, [rows.to_string()]);
    let (a50, a99) = (percentile(&alone, 0.5), percentile(&alone, 0.99));
    let (b50, b99) = (percentile(&during, 0.5), percentile(&during, 0.99));
    println!(
        "back-fill of {rows} rows took {:.1} s; writer INSERT latency alone: p50 {:.2} ms, p99 {:.2} ms \
         ({} inserts); during the back-fill: p50 {:.2} ms, p99 {:.2} ms ({} inserts); p99 ratio {:.2}",
        backfill.as_secs_f64(),
        a50.as_secs_f64() * 1e3,
        a99.as_secs_f64() * 1e3,
        alone.len(),
        b50.as_secs_f64() * 1e3,
        b99.as_secs_f64() * 1e3,
        during.len(),
        b99.as_secs_f64() / a99.as_secs_f64().max(1e-9)
    );
}

fn main() {
    let rows = rows_wanted();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let only = std::env::var("SANDFLOW_BENCH_ONLY").unwrap_or_default();
        if only.is_empty() || only == "baseline" {
            stalled_flow(rows, false).await;
        }
        if only.is_empty() || only == "stalled" {
            stalled_flow(rows, true).await;
        }
        if only.is_empty() || only == "backfill" {
            backfill_latency(rows).await;
        }
    });
}
