//! Per-flow limits through the library API: a flow that exceeds its CPU
//! budget per tick, its bound on output rows per tick or on state size is
//! marked failed with its reason in `information_schema.flows`, FLUSH_FLOW
//! on it reports the failure, and the other flows and the database carry
//! on. A transient failure (the CPU budget) restarts by itself with backoff;
//! failures, restarts and lag are counted.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use std::time::{Duration, Instant};

use sandflow::flow::FlowSettings;
use sandflow::Database;
use sandflow_tests::db::rows;

/// Creates flow `greedy` over `big` (one group per row) with a 1 ms CPU budget per
/// tick, which aggregating `big` cannot meet; `measures` follow `SELECT s,`.
async fn create_greedy(db: &Database, measures: &str) {
    db.execute(&format!(
        "CREATE FLOW greedy SINK TO greedy_sink WITH (cpu_limit_per_tick = '1ms') AS \
         SELECT s, {measures} FROM big GROUP BY s"
    ))
    .await
    .expect("the CPU budget applies to ticks, not to creating the flow");
}

/// `n` rows of distinct strings, numbered from `start`.
fn big_batch(start: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("s", DataType::Utf8, true),
        Field::new("v", DataType::Int64, true),
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
    ]));
    RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                (start..start + n).map(|i| format!("key-{i:09}-{}", "x".repeat(40))),
            )),
            Arc::new(Int64Array::from_iter_values(start..start + n)),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                (start..start + n).map(|i| i * 1000),
            )),
        ],
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_over_its_cpu_budget_fails_alone() {
    let dir = tempfile::tempdir().unwrap();
    // No automatic restarts: this test resumes by hand.
    let settings = FlowSettings {
        max_restarts: 0,
        ..FlowSettings::default()
    };
    let db = Database::open_with(dir.path(), settings).await.unwrap();
    db.execute("CREATE TABLE big (s STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (s))")
        .await
        .unwrap();
    db.execute("CREATE TABLE small (h STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (h))")
        .await
        .unwrap();
    for i in 0..6 {
        db.insert_batch("big", big_batch(i * 50_000, 50_000))
            .await
            .unwrap();
    }
    // 300,000 distinct groups cannot be aggregated within one 5 ms epoch.
    create_greedy(&db, "count(*) AS n, sum(v) AS total").await;
    db.execute(
        "CREATE FLOW modest SINK TO modest_sink AS \
         SELECT h, count(*) AS n, sum(v) AS total FROM small GROUP BY h",
    )
    .await
    .unwrap();

    let err = db.flush_flow("greedy").await.unwrap_err().to_string();
    assert!(err.contains("CPU budget"), "{err}");
    assert!(err.contains("greedy"), "{err}");
    let info = rows(
        &db,
        "SELECT flow_name, status, last_error FROM information_schema.flows ORDER BY flow_name",
    )
    .await;
    assert_eq!(info[0][0], "greedy");
    assert_eq!(info[0][1], "failed");
    assert!(info[0][2].contains("CPU budget"), "{info:?}");
    assert_eq!(info[1][..2], ["modest".to_string(), "running".to_string()]);

    // The other flow and the database carry on.
    db.execute(
        "INSERT INTO small VALUES ('a', 1, '2024-01-01T00:00:00'), ('a', 2, '2024-01-01T00:00:01'), \
         ('b', 5, '2024-01-01T00:00:00')",
    )
    .await
    .unwrap();
    assert_eq!(db.flush_flow("modest").await.unwrap(), 2);
    assert_eq!(
        rows(&db, "SELECT h, n, total FROM modest_sink ORDER BY h").await,
        vec![vec!["a", "2", "3"], vec!["b", "1", "5"]]
    );
    db.insert_batch("big", big_batch(1_000_000, 10))
        .await
        .unwrap();
    let err = db.flush_flow("greedy").await.unwrap_err().to_string();
    assert!(err.contains("failed"), "{err}");
    assert_eq!(
        rows(&db, "SELECT count(*) FROM big").await,
        vec![vec!["300010"]]
    );

    // Once the cause is gone (far fewer rows), RESUME_FLOW brings it back.
    db.execute("DELETE FROM big WHERE v >= 100").await.unwrap();
    assert_eq!(
        rows(&db, "ADMIN RESUME_FLOW('greedy')").await,
        vec![vec!["1"]]
    );
    db.flush_flow("greedy").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT count(*), sum(n), sum(total) FROM greedy_sink").await,
        vec![vec!["100", "100", "4950"]]
    );
    let info = rows(
        &db,
        "SELECT status FROM information_schema.flows WHERE flow_name = 'greedy'",
    )
    .await;
    assert_eq!(info, vec![vec!["running"]]);
    // Resuming a running flow does nothing.
    assert_eq!(
        rows(&db, "ADMIN RESUME_FLOW('greedy')").await,
        vec![vec!["0"]]
    );

    // Replacing a flow with a sane budget also brings it back.
    db.insert_batch("big", big_batch(2_000_000, 50_000))
        .await
        .unwrap();
    db.execute(
        "CREATE OR REPLACE FLOW greedy SINK TO greedy_sink AS \
         SELECT s, count(*) AS n, sum(v) AS total FROM big GROUP BY s",
    )
    .await
    .unwrap();
    db.flush_flow("greedy").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT count(*), sum(n) FROM greedy_sink").await,
        vec![vec!["50100", "50100"]]
    );
}

/// Polls `sql` until its first cell equals `want` (at most 60 s).
async fn wait_for(db: &Database, sql: &str, want: &str) -> Vec<Vec<String>> {
    let started = Instant::now();
    loop {
        let got = rows(db, sql).await;
        if got.first().and_then(|r| r.first()).map(String::as_str) == Some(want) {
            return got;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{sql}: still {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn create_big(db: &Database, n: i64) {
    db.execute("CREATE TABLE big (s STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (s))")
        .await
        .unwrap();
    let mut at = 0;
    while at < n {
        let k = (n - at).min(50_000);
        db.insert_batch("big", big_batch(at, k)).await.unwrap();
        at += k;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_failure_restarts_by_itself_with_backoff() {
    let dir = tempfile::tempdir().unwrap();
    let settings = FlowSettings {
        restart_backoff: Duration::from_millis(100),
        ..FlowSettings::default()
    };
    let db = Database::open_with(dir.path(), settings).await.unwrap();
    create_big(&db, 100_000).await;
    create_greedy(&db, "count(*) AS n, sum(v) AS total").await;
    let err = db.flush_flow("greedy").await.unwrap_err().to_string();
    assert!(err.contains("CPU budget"), "{err}");
    // It keeps failing while the cause is there, and keeps trying.
    wait_for(
        &db,
        "SELECT restarts >= 2, failures >= 3 FROM information_schema.flows",
        "true",
    )
    .await;
    // The cause goes away: the next automatic restart succeeds, no RESUME needed.
    db.execute("DELETE FROM big WHERE v >= 100").await.unwrap();
    let started = Instant::now();
    loop {
        wait_for(
            &db,
            "SELECT status FROM information_schema.flows WHERE flow_name = 'greedy'",
            "running",
        )
        .await;
        // A restart launched before the DELETE committed back-fills the
        // whole table and fails once more; only a later one must succeed.
        match db.flush_flow("greedy").await {
            Ok(_) => break,
            Err(e) => {
                let e = e.to_string();
                assert!(e.contains("CPU budget"), "{e}");
                assert!(started.elapsed() < Duration::from_secs(60), "{e}");
            }
        }
    }
    assert_eq!(
        rows(&db, "SELECT count(*), sum(n), sum(total) FROM greedy_sink").await,
        vec![vec!["100", "100", "4950"]]
    );
    let info = rows(
        &db,
        "SELECT last_error IS NULL, next_restart_time IS NULL, restarts > 0, failures > 0 \
         FROM information_schema.flows",
    )
    .await;
    assert_eq!(info, vec![vec!["true"; 4]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_restarts_give_up_after_max_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let settings = FlowSettings {
        restart_backoff: Duration::from_millis(20),
        max_restarts: 2,
        ..FlowSettings::default()
    };
    let db = Database::open_with(dir.path(), settings).await.unwrap();
    create_big(&db, 100_000).await;
    create_greedy(&db, "count(*) AS n").await;
    let info = wait_for(
        &db,
        "SELECT last_error LIKE '%gave up after 2 automatic restarts%', restarts, failures, \
         next_restart_time IS NULL FROM information_schema.flows",
        "true",
    )
    .await;
    assert_eq!(info[0][1..], ["2", "3", "true"], "{info:?}");
    let err = db.flush_flow("greedy").await.unwrap_err().to_string();
    assert!(err.contains("ADMIN RESUME_FLOW('greedy')"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_row_and_state_bounds_fail_only_their_flow() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open(dir.path()).await.unwrap();
    create_big(&db, 2_000).await;
    db.execute(
        "CREATE FLOW wide SINK TO wide_sink WITH (output_rows_limit_per_tick = '1000') AS \
         SELECT s, count(*) AS n FROM big GROUP BY s; \
         CREATE FLOW fat SINK TO fat_sink WITH (state_size_limit = '64KiB') AS \
         SELECT s, max(v) AS m FROM big GROUP BY s; \
         CREATE FLOW fine SINK TO fine_sink AS SELECT count(*) AS n, sum(v) AS total FROM big",
    )
    .await
    .unwrap();
    let e = db.flush_flow("wide").await.unwrap_err().to_string();
    assert!(e.contains("more than 1000 sink rows in one tick"), "{e}");
    assert!(e.contains("output_rows_limit_per_tick"), "{e}");
    let e = db.flush_flow("fat").await.unwrap_err().to_string();
    assert!(e.contains("state_size_limit of 65536 bytes"), "{e}");
    db.flush_flow("fine").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT n, total FROM fine_sink").await,
        vec![vec!["2000", "1999000"]]
    );
    // Bounds are permanent failures: no automatic restart is planned.
    let info = rows(
        &db,
        "SELECT flow_name, status, restarts, next_restart_time IS NULL \
         FROM information_schema.flows ORDER BY flow_name",
    )
    .await;
    assert_eq!(
        info,
        vec![
            vec!["fat", "failed", "0", "true"],
            vec!["fine", "running", "0", "true"],
            vec!["wide", "failed", "0", "true"],
        ]
    );
    // Nothing was written by the failed flows; a larger bound brings them back.
    assert_eq!(
        rows(&db, "SELECT count(*) FROM wide_sink").await,
        vec![vec!["0"]]
    );
    db.execute(
        "CREATE OR REPLACE FLOW wide SINK TO wide_sink WITH (output_rows_limit_per_tick = '5000') AS \
         SELECT s, count(*) AS n FROM big GROUP BY s",
    )
    .await
    .unwrap();
    assert_eq!(db.flush_flow("wide").await.unwrap(), 2000);
    let e = db
        .execute("CREATE FLOW bad SINK TO bad_sink WITH (output_rows_limit_per_tick = 'lots') AS SELECT count(*) FROM big")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("positive whole number"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_shows_how_far_a_sink_is_behind() {
    let dir = tempfile::tempdir().unwrap();
    // A long tick interval keeps input pending until the flush.
    let settings = FlowSettings {
        tick_interval: Duration::from_secs(30),
        ..FlowSettings::default()
    };
    let db = Database::open_with(dir.path(), settings).await.unwrap();
    db.execute(
        "CREATE TABLE t (h STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (h)); \
         CREATE FLOW f SINK TO f_sink AS SELECT h, count(*) AS n FROM t GROUP BY h",
    )
    .await
    .unwrap();
    db.flush_flow("f").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT lag_ms FROM information_schema.flows").await,
        vec![vec!["0"]]
    );
    db.execute("INSERT INTO t VALUES ('a', 1, 0)")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lag: i64 = rows(&db, "SELECT lag_ms FROM information_schema.flows").await[0][0]
        .parse()
        .unwrap();
    assert!(lag >= 400, "lag {lag} ms while a change waits for the tick");
    db.flush_flow("f").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT lag_ms FROM information_schema.flows").await,
        vec![vec!["0"]]
    );
}
