//! Per-flow limits through the library API: a flow that exceeds its CPU
//! budget per tick or its memory cap is marked failed with its reason in
//! `information_schema.flows`, FLUSH_FLOW on it reports the failure, and the
//! other flows and the database carry on.

use std::sync::Arc;

use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sandflow::database::Output;
use sandflow::Database;

async fn rows(db: &Database, sql: &str) -> Vec<Vec<String>> {
    let out = db
        .execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let Some(Output::Rows { batches, .. }) = out.into_iter().last() else {
        panic!("{sql}: no rows");
    };
    let mut all = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            all.push(
                b.columns()
                    .iter()
                    .map(|c| {
                        datafusion::arrow::util::display::array_value_to_string(c, r)
                            .unwrap_or_default()
                    })
                    .collect(),
            );
        }
    }
    all
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
    let db = Database::open(dir.path()).await.unwrap();
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
    db.execute(
        "CREATE FLOW greedy SINK TO greedy_sink WITH (cpu_limit_per_tick = '1ms') AS \
         SELECT s, count(*) AS n, sum(v) AS total FROM big GROUP BY s",
    )
    .await
    .expect("the CPU budget applies to ticks, not to creating the flow");
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
