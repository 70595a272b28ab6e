//! Recovery time of a flow over a large source: a restart that restores the
//! flow's snapshot versus one that must rebuild the state from the sources
//! (what happens without a snapshot). Run with `make bench`;
//! SANDFLOW_RECOVERY_ROWS sets the source size (default 1,000,000).

use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{Int64Array, RecordBatch, TimestampMillisecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use sandflow::storage::{MetaWrite, Store};
use sandflow::Database;

const KEYS: i64 = 1000;
const BATCH: i64 = 50_000;

fn batch(start: i64, n: i64) -> RecordBatch {
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, true),
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
            Arc::new(Int64Array::from_iter_values(
                (start..start + n).map(|i| i % KEYS),
            )),
            Arc::new(Int64Array::from_iter_values(start..start + n)),
            Arc::new(TimestampMillisecondArray::from_iter_values(
                start..start + n,
            )),
        ],
    )
    .expect("batch")
}

/// Opens the database and waits until the flow has caught up.
async fn open_and_flush(dir: &std::path::Path) -> (Arc<Database>, Duration) {
    let started = Instant::now();
    let db = Database::open(dir).await.expect("open");
    db.flush_flow("per_key").await.expect("flush");
    (db, started.elapsed())
}

async fn check(db: &Database, rows: i64) {
    let out = db
        .execute("SELECT count(*), sum(n) FROM per_key_sink")
        .await
        .expect("query sink");
    let Some(sandflow::Output::Rows { batches, .. }) = out.into_iter().last() else {
        panic!("no rows");
    };
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches)
        .expect("format")
        .to_string();
    assert!(
        text.contains(&format!("| {} ", KEYS.min(rows))) && text.contains(&format!(" {rows} ")),
        "sink does not hold {rows} rows in {KEYS} keys:\n{text}"
    );
}

fn main() {
    let rows: i64 = std::env::var("SANDFLOW_RECOVERY_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let db = Database::open(dir.path()).await.expect("open");
        db.execute(
            "CREATE TABLE src (k BIGINT, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
        )
        .await
        .expect("create table");
        let load = Instant::now();
        let mut start = 0;
        while start < rows {
            let n = BATCH.min(rows - start);
            db.insert_batch("src", batch(start, n)).await.expect("insert");
            start += n;
        }
        let load = load.elapsed();
        let created = Instant::now();
        db.execute(
            "CREATE FLOW per_key SINK TO per_key_sink AS \
             SELECT k, count(*) AS n, sum(v) AS total FROM src GROUP BY k",
        )
        .await
        .expect("create flow");
        db.flush_flow("per_key").await.expect("flush");
        let backfill = created.elapsed();
        check(&db, rows).await;
        drop(db); // clean shutdown: the flow snapshots its state

        let (db, with_snapshot) = open_and_flush(dir.path()).await;
        check(&db, rows).await;
        drop(db);

        // Without a snapshot the flow must rebuild from its source.
        {
            let store = Store::open(dir.path()).expect("store");
            store
                .commit_meta(vec![MetaWrite::Delete("flow/state/per_key".into())])
                .expect("forget snapshot");
        }
        let (db, rebuilt) = open_and_flush(dir.path()).await;
        check(&db, rows).await;
        drop(db);

        println!(
            "recovery: {rows} source rows, {KEYS} groups; load {:.1} s, create + back-fill {:.2} s",
            load.as_secs_f64(),
            backfill.as_secs_f64()
        );
        println!(
            "recovery: restart with snapshot {:.3} s, without snapshot (rebuild) {:.3} s, rebuild/snapshot {:.1}x",
            with_snapshot.as_secs_f64(),
            rebuilt.as_secs_f64(),
            rebuilt.as_secs_f64() / with_snapshot.as_secs_f64().max(1e-9)
        );
    });
}
