//! The database core through its library API: SQL round trips, errors,
//! restarts, the change feed.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use datafusion::arrow::array::{
    Float64Array, Int64Array, RecordBatch, StringArray, TimestampMillisecondArray,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::arrow::util::pretty::pretty_format_batches;
use sandflow::catalog::{ColumnSchema, ColumnType, TableSchema};
use sandflow::storage::{ChangeBatch, WriteSet};
use sandflow::{Database, Error, Output};

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "sandflow-db-test-{}-{}-{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn run(db: &Database, sql: &str) -> Vec<Output> {
    match db.execute(sql).await {
        Ok(o) => o,
        Err(e) => panic!("{sql}: {e}"),
    }
}

/// The one result set of `sql`, pretty-printed.
async fn query(db: &Database, sql: &str) -> String {
    let mut out = run(db, sql).await;
    assert_eq!(out.len(), 1, "{sql}");
    match out.remove(0) {
        Output::Rows { batches, .. } => pretty_format_batches(&batches).unwrap().to_string(),
        other => panic!("{sql}: expected rows, got {other:?}"),
    }
}

async fn affected(db: &Database, sql: &str) -> (String, u64) {
    let mut out = run(db, sql).await;
    match out.remove(0) {
        Output::Affected { tag, rows } => (tag, rows),
        other => panic!("{sql}: expected a count, got {other:?}"),
    }
}

async fn error(db: &Database, sql: &str) -> Error {
    match db.execute(sql).await {
        Ok(o) => panic!("{sql}: expected an error, got {o:?}"),
        Err(e) => e,
    }
}

/// The one value of a one-row, one-column result, as text.
async fn scalar(db: &Database, sql: &str) -> String {
    let mut out = run(db, sql).await;
    match out.remove(0) {
        Output::Rows { batches, .. } => {
            let b = batches.iter().find(|b| b.num_rows() > 0).expect("a row");
            datafusion::arrow::util::display::array_value_to_string(b.column(0), 0).unwrap()
        }
        other => panic!("{sql}: expected rows, got {other:?}"),
    }
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

const CPU: &str =
    "CREATE TABLE cpu (host STRING, usage DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))";

#[tokio::test]
async fn create_insert_upsert_delete_select() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    assert_eq!(affected(&db, CPU).await, ("CREATE TABLE".into(), 0));
    assert_eq!(
        affected(
            &db,
            "INSERT INTO cpu VALUES ('a', 1.0, '2024-01-01 00:00:00'), ('b', 2.0, '2024-01-01 00:00:00.250'), ('a', 3.0, 1704067201000)"
        )
        .await,
        ("INSERT".into(), 3)
    );
    // Same (host, ts): replaces.
    affected(
        &db,
        "INSERT INTO cpu VALUES ('a', 10.0, '2024-01-01 00:00:00')",
    )
    .await;
    let got = query(&db, "SELECT host, usage, ts FROM cpu ORDER BY host, ts").await;
    assert_eq!(
        lines(&got),
        vec![
            "+------+-------+-------------------------+",
            "| host | usage | ts                      |",
            "+------+-------+-------------------------+",
            "| a    | 10.0  | 2024-01-01T00:00:00     |",
            "| a    | 3.0   | 2024-01-01T00:00:01     |",
            "| b    | 2.0   | 2024-01-01T00:00:00.250 |",
            "+------+-------+-------------------------+",
        ]
    );
    assert_eq!(
        affected(&db, "DELETE FROM cpu WHERE host = 'a' AND usage > 5").await,
        ("DELETE".into(), 1)
    );
    assert!(query(&db, "SELECT count(*) AS n FROM cpu")
        .await
        .contains("| 2 |"));
    affected(
        &db,
        "INSERT INTO cpu VALUES ('old', 1, '2020-01-01 00:00:00')",
    )
    .await;
    assert_eq!(
        affected(
            &db,
            "DELETE FROM cpu WHERE ts < '2021-01-01' AND ts < now()"
        )
        .await,
        ("DELETE".into(), 1)
    );
    let got = query(
        &db,
        "SELECT date_bin(INTERVAL '1 minute', ts) AS m, count(*) AS n FROM cpu GROUP BY m",
    )
    .await;
    assert!(got.contains("| 2024-01-01T00:00:00 | 2 |"), "{got}");
    assert_eq!(affected(&db, "DELETE FROM cpu").await, ("DELETE".into(), 2));
    assert!(query(&db, "SELECT count(*) AS n FROM cpu")
        .await
        .contains("| 0 |"));

    // INSERT ... SELECT, with column list and missing columns (NULL).
    run(&db, "CREATE TABLE cpu2 (host STRING, usage DOUBLE, note STRING, ts TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))").await;
    affected(&db, "INSERT INTO cpu VALUES ('x', 1.5, 0), ('y', 2.5, 0)").await;
    assert_eq!(
        affected(
            &db,
            "INSERT INTO cpu2 (host, usage, ts) SELECT host, usage * 2, ts FROM cpu"
        )
        .await,
        ("INSERT".into(), 2)
    );
    let got = query(&db, "SELECT host, usage, note FROM cpu2 ORDER BY host").await;
    assert!(got.contains("| x    | 3.0   |      |"), "{got}");
    // Several statements, one output each.
    let outs = run(
        &db,
        "SELECT 1; INSERT INTO cpu VALUES ('z', 0, 0); SELECT 2;",
    )
    .await;
    assert_eq!(outs.len(), 3);
    assert!(matches!(&outs[1], Output::Affected { tag, rows: 1 } if tag == "INSERT"));
}

#[tokio::test]
async fn errors_are_clear() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;

    let e = error(&db, "SELEC 1").await;
    assert!(matches!(e, Error::Sql { .. }), "{e:?}");
    assert!(e.to_string().contains("syntax"), "{e}");

    let e = error(&db, "SELECT * FROM nope").await;
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("nope"), "{e}");
    let e = error(&db, "INSERT INTO nope VALUES (1)").await;
    assert!(e.to_string().contains("nope"), "{e}");
    let e = error(&db, "DESC TABLE nope").await;
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    let e = error(&db, "DROP TABLE nope").await;
    assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    run(&db, "DROP TABLE IF EXISTS nope").await;

    let e = error(&db, "INSERT INTO cpu VALUES ('a', 'not a number', 0)").await;
    assert!(matches!(e, Error::InvalidData { .. }), "{e:?}");
    assert!(e.to_string().contains("not a number"), "{e}");

    let e = error(&db, "CREATE TABLE t (a INT, ts TIMESTAMP)").await;
    assert!(e.to_string().contains("time index"), "{e}");

    let e = error(&db, "INSERT INTO cpu VALUES ('a', 1.0, NULL)").await;
    assert!(
        e.to_string()
            .contains("time index column 'ts' cannot be NULL"),
        "{e}"
    );
    let e = error(&db, "INSERT INTO cpu (host, usage) VALUES ('a', 1.0)").await;
    assert!(e.to_string().contains("'ts'"), "{e}");

    let e = error(&db, CPU).await;
    assert!(e.to_string().contains("already exists"), "{e}");
    run(
        &db,
        "CREATE TABLE IF NOT EXISTS cpu (x INT, ts TIMESTAMP TIME INDEX)",
    )
    .await;

    let e = error(
        &db,
        "CREATE TABLE t (a DECIMAL(10, 2), ts TIMESTAMP TIME INDEX)",
    )
    .await;
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    let e = error(
        &db,
        "CREATE TABLE t (a INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (b))",
    )
    .await;
    assert!(e.to_string().contains("'b'"), "{e}");
    let e = error(
        &db,
        "CREATE TABLE t (a INT, ts TIMESTAMP TIME INDEX) WITH (ttl = 'soon')",
    )
    .await;
    assert!(e.to_string().contains("ttl"), "{e}");
    let e = error(
        &db,
        "CREATE TABLE t (a INT, ts TIMESTAMP TIME INDEX) WITH (compaction = 'twcs')",
    )
    .await;
    assert!(
        e.to_string().contains("append_mode, merge_mode, ttl"),
        "{e}"
    );
    let e = error(
        &db,
        "CREATE TABLE t (a INT DEFAULT 'x', ts TIMESTAMP TIME INDEX)",
    )
    .await;
    assert!(e.to_string().contains("DEFAULT"), "{e}");
    let e = error(&db, "CREATE VIEW v AS SELECT 1").await;
    assert!(matches!(e, Error::Unsupported { .. }), "{e:?}");
    // Nothing half-done: no table t.
    assert!(!query(&db, "SHOW TABLES").await.contains("| t "));
    // A batch of statements is one transaction: a failing statement leaves
    // nothing of the earlier ones.
    assert!(db
        .execute("INSERT INTO cpu VALUES ('q', 1, 0); SELECT * FROM nope")
        .await
        .is_err());
    assert!(!query(&db, "SELECT host FROM cpu").await.contains("q"));
}

#[tokio::test]
async fn defaults_units_and_types() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(
        &db,
        "CREATE TABLE m (host VARCHAR(10) NOT NULL, n INT UNSIGNED DEFAULT 7, f FLOAT, b BOOLEAN, \
         s SMALLINT, t TINYINT, bin BYTEA, d DATE, \
         ts TIMESTAMP(0) DEFAULT now() TIME INDEX, PRIMARY KEY (host))",
    )
    .await;
    affected(&db, "INSERT INTO m (host, ts) VALUES ('h', 5)").await;
    affected(&db, "INSERT INTO m (host) VALUES ('now')").await;
    affected(
        &db,
        "INSERT INTO m VALUES ('all', 1, 1.5, true, -2, 3, 'xyz', '2024-02-03', '2024-01-01 00:00:09')",
    )
    .await;
    let got = query(
        &db,
        "SELECT host, n, f, b, s, t, d, ts FROM m WHERE host <> 'now' ORDER BY host",
    )
    .await;
    assert_eq!(
        lines(&got)[3..5],
        [
            "| all  | 1 | 1.5 | true | -2 | 3 | 2024-02-03 | 2024-01-01T00:00:09 |",
            "| h    | 7 |     |      |    |   |            | 1970-01-01T00:00:05 |",
        ]
    );
    // now() default: a recent timestamp.
    let got = query(
        &db,
        "SELECT ts > '2025-01-01' AS recent FROM m WHERE host = 'now'",
    )
    .await;
    assert!(got.contains("| true "), "{got}");
    let e = error(&db, "INSERT INTO m (n, ts) VALUES (1, 0)").await;
    assert!(e.to_string().contains("host"), "{e}");

    // Timestamp units: integers are in the column's unit.
    run(&db, "CREATE TABLE u (v INT, ts TIMESTAMP_NS TIME INDEX)").await;
    affected(&db, "INSERT INTO u VALUES (1, 1500000000)").await;
    let got = query(&db, "SELECT ts FROM u").await;
    assert!(got.contains("1970-01-01T00:00:01.500"), "{got}");
}

#[tokio::test]
async fn show_describe_information_schema() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(
        &db,
        "CREATE TABLE req (host STRING, status INT, bytes DOUBLE DEFAULT 0, ts TIMESTAMP(3) DEFAULT now() TIME INDEX, PRIMARY KEY (host, status)); \
         CREATE TABLE logs (line STRING, ts TIMESTAMP, TIME INDEX (ts)) WITH (append_mode = 'true')",
    )
    .await;
    let got = query(&db, "SHOW TABLES").await;
    assert_eq!(lines(&got)[1], "| Tables_in_public |");
    assert_eq!(
        lines(&got)[3..5],
        ["| logs             |", "| req              |"]
    );
    assert!(query(&db, "SHOW TABLES LIKE 'r%'").await.contains("req"));
    assert!(!query(&db, "SHOW TABLES LIKE 'r%'").await.contains("logs"));

    let got = query(&db, "DESC TABLE req").await;
    assert_eq!(
        lines(&got),
        vec![
            "+--------+----------------------+-----+------+---------+---------------+",
            "| Column | Type                 | Key | Null | Default | Semantic Type |",
            "+--------+----------------------+-----+------+---------+---------------+",
            "| host   | String               | PRI | YES  |         | TAG           |",
            "| status | Int32                | PRI | YES  |         | TAG           |",
            "| bytes  | Float64              |     | YES  | 0       | FIELD         |",
            "| ts     | TimestampMillisecond | PRI | NO   | now()   | TIMESTAMP     |",
            "+--------+----------------------+-----+------+---------+---------------+",
        ]
    );
    assert_eq!(query(&db, "DESCRIBE req").await, got);

    let mut out = run(&db, "SHOW CREATE TABLE logs").await;
    let Output::Rows { batches, .. } = out.remove(0) else {
        panic!()
    };
    let text = batches[0]
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    assert_eq!(
        text,
        "CREATE TABLE IF NOT EXISTS \"logs\" (\n  \"line\" STRING NULL,\n  \"ts\" TIMESTAMP(3) NOT NULL,\n  TIME INDEX (\"ts\")\n)\n\nENGINE=mito\nWITH(\n  append_mode = 'true'\n)"
    );
    // SHOW CREATE TABLE output creates the same table again.
    let mut out = run(&db, "SHOW CREATE TABLE req").await;
    let Output::Rows { batches, .. } = out.remove(0) else {
        panic!()
    };
    let text = batches[0]
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap()
        .value(0)
        .to_string();
    assert!(
        text.contains("PRIMARY KEY (\"host\", \"status\")"),
        "{text}"
    );
    run(&db, "CREATE DATABASE other").await;
    run(&db, &text.replace("\"req\"", "other.req")).await;
    assert_eq!(
        db.table("other.req").unwrap().schema(),
        db.table("req").unwrap().schema()
    );

    let got = query(
        &db,
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_catalog = 'greptime' AND table_schema <> 'information_schema' ORDER BY 1, 2",
    )
    .await;
    assert!(got.contains("| other        | req        |"), "{got}");
    assert!(got.contains("| public       | logs       |"), "{got}");
    let got = query(
        &db,
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns WHERE table_name = 'req' AND table_schema = 'public' ORDER BY ordinal_position",
    )
    .await;
    assert!(got.contains("| host        | Utf8"), "{got}");
    let got = query(&db, "SHOW DATABASES").await;
    assert!(got.contains("other") && got.contains("public"), "{got}");
}

#[tokio::test]
async fn databases_and_qualified_names() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    assert_eq!(
        affected(&db, "CREATE DATABASE x").await,
        ("CREATE DATABASE".into(), 1)
    );
    assert!(db.execute("CREATE DATABASE x").await.is_err());
    run(&db, "CREATE DATABASE IF NOT EXISTS x").await;
    run(&db, "CREATE TABLE x.t (v INT, ts TIMESTAMP TIME INDEX)").await;
    run(&db, "CREATE TABLE t (v INT, ts TIMESTAMP TIME INDEX)").await;
    run(
        &db,
        "INSERT INTO x.t VALUES (1, 0); INSERT INTO t VALUES (2, 0)",
    )
    .await;
    assert!(query(&db, "SELECT v FROM x.t").await.contains("| 1 |"));
    assert!(query(&db, "SELECT v FROM greptime.x.t")
        .await
        .contains("| 1 |"));
    assert!(query(&db, "SELECT v FROM t").await.contains("| 2 |"));
    let got = query(&db, "SHOW TABLES FROM x").await;
    assert!(got.contains("| Tables_in_x |"), "{got}");
    assert!(got.contains("| t  "), "{got}");
    let e = error(&db, "CREATE TABLE nodb.t (v INT, ts TIMESTAMP TIME INDEX)").await;
    assert!(e.to_string().contains("CREATE DATABASE nodb"), "{e}");
    run(&db, "DROP DATABASE x").await;
    assert!(db.execute("SELECT * FROM x.t").await.is_err());
}

#[tokio::test]
async fn restart_keeps_every_row_once() {
    let dir = TempDir::new();
    {
        let db = Database::open(&dir.0).await.unwrap();
        run(&db, CPU).await;
        run(
            &db,
            "CREATE TABLE logs (line STRING, ts TIMESTAMP TIME INDEX) WITH (append_mode = 'true')",
        )
        .await;
        run(
            &db,
            "CREATE DATABASE d; CREATE TABLE d.gone (v INT, ts TIMESTAMP TIME INDEX)",
        )
        .await;
        for i in 0..20 {
            run(
                &db,
                &format!("INSERT INTO cpu VALUES ('h{}', {i}, {})", i % 5, i / 5),
            )
            .await;
        }
        run(
            &db,
            "INSERT INTO logs VALUES ('x', 0), ('x', 0); INSERT INTO logs VALUES ('x', 0)",
        )
        .await;
        run(&db, "DROP TABLE d.gone").await;
    }
    let db = Database::open(&dir.0).await.unwrap();
    let got = query(
        &db,
        "SELECT count(*) AS n, count(DISTINCT host) AS h, sum(usage) AS s FROM cpu",
    )
    .await;
    assert!(got.contains("| 20 | 5 | 190.0 |"), "{got}");
    assert!(query(&db, "SELECT count(*) AS n FROM logs")
        .await
        .contains("| 3 |"));
    assert!(db.execute("SELECT * FROM d.gone").await.is_err());
    // Still upserts after a restart, and new table ids do not collide.
    run(&db, "INSERT INTO cpu VALUES ('h0', 100, 0)").await;
    assert!(query(&db, "SELECT count(*) AS n FROM cpu")
        .await
        .contains("| 20 |"));
    run(&db, "CREATE TABLE d.new (v INT, ts TIMESTAMP TIME INDEX)").await;
    assert!(db.table("d.new").unwrap().id() > db.table("logs").unwrap().id());
    assert!(query(&db, "SELECT count(*) AS n FROM d.new")
        .await
        .contains("| 0 |"));
    // DESC survives too.
    assert!(query(&db, "DESC cpu").await.contains("| host   | String"));
}

fn rows(change: &ChangeBatch) -> Vec<String> {
    let host = change
        .batch
        .column(0)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let usage = change
        .batch
        .column(1)
        .as_any()
        .downcast_ref::<Float64Array>()
        .unwrap();
    (0..change.batch.num_rows())
        .map(|i| {
            format!(
                "{}{} {} {}",
                if change.diffs[i] > 0 { "+" } else { "-" },
                change.diffs[i].abs(),
                host.value(i),
                usage.value(i)
            )
        })
        .collect()
}

#[tokio::test]
async fn change_feed() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;
    let mut feed = db.subscribe("cpu").unwrap();

    run(&db, "INSERT INTO cpu VALUES ('a', 1, 0)").await;
    let c1 = feed.recv().await.unwrap();
    assert_eq!(rows(&c1), vec!["+1 a 1"]);
    assert_eq!(c1.table_id, db.table("cpu").unwrap().id());

    // Replacing upsert: -old, +new.
    run(&db, "INSERT INTO cpu VALUES ('a', 2, 0)").await;
    let c2 = feed.recv().await.unwrap();
    assert_eq!(rows(&c2), vec!["-1 a 1", "+1 a 2"]);
    assert!(c2.seq > c1.seq);

    // Identical rewrite: nothing at all.
    run(&db, "INSERT INTO cpu VALUES ('a', 2, 0)").await;
    // Multi-row statement: one batch, one seq.
    run(
        &db,
        "INSERT INTO cpu VALUES ('b', 1, 0), ('c', 1, 0), ('a', 3, 0)",
    )
    .await;
    let c3 = feed.recv().await.unwrap();
    assert_eq!(rows(&c3), vec!["+1 b 1", "+1 c 1", "-1 a 2", "+1 a 3"]);
    assert!(c3.seq > c2.seq + 1, "the identical rewrite still committed");

    // Delete: -1 per row, in one batch.
    run(&db, "DELETE FROM cpu WHERE usage = 1").await;
    let c4 = feed.recv().await.unwrap();
    assert_eq!(rows(&c4), vec!["-1 b 1", "-1 c 1"]);

    // Deleting nothing publishes nothing; nothing else is pending.
    run(&db, "DELETE FROM cpu WHERE host = 'zzz'").await;
    assert!(feed.try_recv().is_err());

    // Typed API: insert_batch, delete_batch, snapshot + feed.
    let (snap, mut feed2) = db.subscribe_with_snapshot("cpu").unwrap();
    assert_eq!(snap.batches.iter().map(|b| b.num_rows()).sum::<usize>(), 1);
    assert_eq!(snap.seq, db.last_seq().unwrap());
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "ts",
            DataType::Timestamp(TimeUnit::Millisecond, None),
            false,
        ),
        Field::new("host", DataType::Utf8, false),
        Field::new("usage", DataType::Int64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema,
        vec![
            Arc::new(TimestampMillisecondArray::from(vec![0, 0])),
            Arc::new(StringArray::from(vec!["a", "d"])),
            Arc::new(Int64Array::from(vec![Some(9), None])),
        ],
    )
    .unwrap();
    assert_eq!(db.insert_batch("cpu", batch.clone()).await.unwrap(), 2);
    let c5 = feed2.recv().await.unwrap();
    assert!(c5.seq > snap.seq);
    assert_eq!(c5.diffs, vec![-1, 1, 1]);
    let c5b = feed.recv().await.unwrap();
    assert_eq!(c5b.seq, c5.seq);
    assert_eq!(
        db.delete_batch("cpu", batch.project(&[0, 1]).unwrap())
            .await
            .unwrap(),
        2
    );
    assert_eq!(feed2.recv().await.unwrap().diffs, vec![-1, -1]);
    assert_eq!(feed.recv().await.unwrap().diffs, vec![-1, -1]);

    // Dropping the table ends the feed.
    run(&db, "DROP TABLE cpu").await;
    assert!(feed.recv().await.is_none());
}

#[tokio::test]
async fn append_mode_keeps_duplicates() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, "CREATE TABLE logs (host STRING, line STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)) WITH (append_mode = 'true')").await;
    let mut feed = db.subscribe("logs").unwrap();
    run(&db, "INSERT INTO logs VALUES ('a', 'x', 0), ('a', 'x', 0)").await;
    run(&db, "INSERT INTO logs VALUES ('a', 'x', 0)").await;
    assert_eq!(feed.recv().await.unwrap().diffs, vec![1, 1]);
    assert_eq!(feed.recv().await.unwrap().diffs, vec![1]);
    assert!(query(&db, "SELECT count(*) AS n FROM logs")
        .await
        .contains("| 3 |"));
    assert_eq!(
        affected(&db, "DELETE FROM logs WHERE host = 'a'").await.1,
        3
    );
    assert_eq!(feed.recv().await.unwrap().diffs, vec![-1, -1, -1]);
}

// A line-protocol request is ONE commit: one change batch per table, all
// with the same commit sequence, and a refused request leaves no trace (no
// row, no table, no database, no commit).
#[tokio::test]
async fn line_protocol_request_is_one_commit() {
    use sandflow::influx::{write, Precision};
    let s = Precision::Seconds;
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    // Tables made by an earlier request, so that the next one can be watched.
    let n = write(
        &db,
        &sandflow::auth::Principal::Root,
        "",
        "cpu,host=a usage=0.5 1\nmem,host=a free=1i 1",
        s,
    )
    .await
    .unwrap();
    assert_eq!(n, 2);
    let mut cpu = db.subscribe("cpu").unwrap();
    let mut mem = db.subscribe("mem").unwrap();
    let body = "cpu,host=b usage=0.25 2\nmem,host=b free=2i 2\ncpu,host=a usage=0.75 1";
    assert_eq!(
        write(&db, &sandflow::auth::Principal::Root, "public", body, s)
            .await
            .unwrap(),
        3
    );
    let c = cpu.recv().await.unwrap();
    let m = mem.recv().await.unwrap();
    assert_eq!(c.seq, m.seq, "one commit for the whole request");
    assert_eq!(c.seq, db.last_seq().unwrap());
    assert_eq!(rows(&c), ["+1 b 0.25", "-1 a 0.5", "+1 a 0.75"]);
    assert_eq!(m.diffs, [1]);

    // The last line's integer does not go into the DOUBLE column: refused,
    // and nothing of the request is written, not even its new table.
    let before = db.last_seq().unwrap();
    let body = "fresh,k=x v=1i 3\nmem,host=c free=3i 3\ncpu,host=c usage=1i 3";
    let e = write(&db, &sandflow::auth::Principal::Root, "", body, s)
        .await
        .unwrap_err()
        .to_string();
    for needle in ["\"usage\"", "DOUBLE", "BIGINT", "line 3"] {
        assert!(e.contains(needle), "{needle} missing from: {e}");
    }
    assert_eq!(db.last_seq().unwrap(), before);
    assert!(db.table("fresh").is_err());
    assert!(cpu.try_recv().is_err() && mem.try_recv().is_err());

    // A new database and its tables come with the rows, or not at all.
    let bad = "a v=1i 1\nb v=1i 1\nb,t=x v=\"x\" 2";
    assert!(
        write(&db, &sandflow::auth::Principal::Root, "metrics", bad, s)
            .await
            .is_err()
    );
    assert!(!db.database_exists("metrics"));
    assert_eq!(db.last_seq().unwrap(), before);
    write(
        &db,
        &sandflow::auth::Principal::Root,
        "metrics",
        "a v=1i 1\nb v=2.5 1",
        s,
    )
    .await
    .unwrap();
    assert_eq!(scalar(&db, "SELECT count(*) FROM metrics.a").await, "1");
    assert_eq!(scalar(&db, "SELECT v FROM metrics.b").await, "2.5");
    assert_eq!(db.last_seq().unwrap(), before + 1);

    // All of it survives a restart.
    drop((cpu, mem));
    drop(db);
    let db = Database::open(&dir.0).await.unwrap();
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "2");
    assert_eq!(scalar(&db, "SELECT sum(free) FROM mem").await, "3");
    assert_eq!(scalar(&db, "SELECT count(*) FROM metrics.b").await, "1");
    assert!(db.table("fresh").is_err());
}

#[tokio::test]
async fn programmatic_sink_and_one_transaction() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;
    let schema = TableSchema::new(
        vec![
            ColumnSchema::new("host", ColumnType::String, true),
            ColumnSchema::new("n", ColumnType::Int64, true),
            ColumnSchema::new("update_at", ColumnType::TimestampMillisecond, true)
                .with_default("now()"),
            ColumnSchema::new("__ts_placeholder", ColumnType::TimestampMillisecond, false),
        ],
        "__ts_placeholder",
        &["host"],
        false,
    )
    .unwrap();
    let (sink, created) = db.create_table("sink", schema.clone(), true).await.unwrap();
    assert!(created);
    assert!(!db.create_table("sink", schema, true).await.unwrap().1);
    assert_eq!(sink.schema().time_index_column().name, "__ts_placeholder");

    let rows = |hosts: Vec<&str>, n: Vec<i64>| {
        let len = hosts.len();
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("host", DataType::Utf8, true),
                Field::new("n", DataType::Int64, true),
                Field::new(
                    "__ts_placeholder",
                    DataType::Timestamp(TimeUnit::Millisecond, None),
                    false,
                ),
            ])),
            vec![
                Arc::new(StringArray::from(hosts)),
                Arc::new(Int64Array::from(n)),
                Arc::new(TimestampMillisecondArray::from(vec![0; len])),
            ],
        )
        .unwrap()
    };
    let mut set = WriteSet::new();
    set.upsert(sink.clone(), rows(vec!["a", "b"], vec![1, 2]))
        .put_meta("app/f/state", b"blob".to_vec())
        .put_meta("app/f/positions", b"42".to_vec());
    let info = db.commit(set).await.unwrap();
    assert_eq!(info.rows, 2);
    let mut set = WriteSet::new();
    set.delete(sink.clone(), rows(vec!["a"], vec![0]))
        .upsert(sink.clone(), rows(vec!["b"], vec![5]))
        .put_meta("app/f/state", b"blob2".to_vec());
    db.commit(set).await.unwrap();
    assert_eq!(db.get_meta("app/f/state").unwrap(), Some(b"blob2".to_vec()));
    assert_eq!(db.scan_meta("app/f/").unwrap().len(), 2);
    let got = query(&db, "SELECT host, n FROM sink").await;
    assert!(
        got.contains("| b    | 5 |") && !got.contains("| a "),
        "{got}"
    );

    // A failing write set changes nothing (the bad batch is rejected before commit).
    let mut set = WriteSet::new();
    set.upsert(sink.clone(), rows(vec!["c"], vec![1]))
        .upsert(db.table("cpu").unwrap(), rows(vec!["c"], vec![1]))
        .put_meta("app/f/state", b"blob3".to_vec());
    assert!(db.commit(set).await.is_err());
    assert_eq!(db.get_meta("app/f/state").unwrap(), Some(b"blob2".to_vec()));
    assert!(!query(&db, "SELECT host FROM sink").await.contains("| c "));
    // Reserved keys are refused.
    let mut set = WriteSet::new();
    set.put_meta("catalog/x", vec![]);
    assert!(db.commit(set).await.is_err());
    let mut set = WriteSet::new();
    set.put_meta("flow/x/state", vec![]);
    assert!(
        db.commit(set).await.is_err(),
        "flow/ belongs to the flow manager"
    );
}

#[tokio::test]
async fn datafusion_planned_dml_with_parameters() {
    use datafusion::common::ScalarValue;
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;
    let mut feed = db.subscribe("cpu").unwrap();
    let ctx = db.session_context();
    for (host, v) in [("a", 1.0), ("a", 2.0)] {
        let df = ctx
            .sql("INSERT INTO cpu VALUES ($1, $2, '2024-01-01 00:00:00')")
            .await
            .unwrap()
            .with_param_values(vec![ScalarValue::from(host), ScalarValue::from(v)])
            .unwrap();
        df.collect().await.unwrap();
    }
    assert_eq!(feed.recv().await.unwrap().diffs, vec![1]);
    assert_eq!(feed.recv().await.unwrap().diffs, vec![-1, 1]);
    let df = ctx
        .sql("DELETE FROM cpu WHERE host = $1")
        .await
        .unwrap()
        .with_param_values(vec![ScalarValue::from("a")])
        .unwrap();
    df.collect().await.unwrap();
    assert_eq!(feed.recv().await.unwrap().diffs, vec![-1]);
    let got = ctx
        .sql("SELECT count(*) FROM cpu")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    assert!(pretty_format_batches(&got)
        .unwrap()
        .to_string()
        .contains("| 0 "));
}

/// Statements as long and deep as the guard accepts run; deeper ones are
/// refused with a message naming the limit; neither brings the process down.
#[tokio::test]
async fn long_operator_chains_run_or_are_refused() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(
        &db,
        "CREATE TABLE t (h STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (h))",
    )
    .await;
    run(&db, "INSERT INTO t VALUES ('a', 1, '2024-01-01T00:00:00')").await;
    let max = sandflow::sql::parser::MAX_EXPRESSION_DEPTH;
    let terms = max - 10;
    let plus = format!("SELECT {} AS n", vec!["1"; terms].join(" + "));
    assert_eq!(scalar(&db, &plus).await, format!("{terms}"));
    let and = format!(
        "SELECT count(*) AS n FROM t WHERE {}",
        vec!["v = 1"; terms / 2].join(" AND ")
    );
    assert_eq!(scalar(&db, &and).await, "1");
    let or = format!(
        "DELETE FROM t WHERE {}",
        (0..terms / 2)
            .map(|i| format!("v = {}", i + 2))
            .collect::<Vec<_>>()
            .join(" OR ")
    );
    assert_eq!(affected(&db, &or).await, ("DELETE".to_string(), 0));
    let concat = format!("SELECT {} AS s", vec!["'x'"; terms].join(" || "));
    assert_eq!(scalar(&db, &concat).await.len(), terms);
    let union = format!(
        "SELECT count(*) AS n FROM ({}) u",
        vec!["SELECT 1 AS x"; terms].join(" UNION ALL ")
    );
    assert_eq!(scalar(&db, &union).await, format!("{terms}"));
    for sql in [
        format!("SELECT {}", vec!["1"; 1900].join("+")),
        format!("SELECT 1 WHERE {}", vec!["true"; 1900].join(" OR ")),
        format!("SELECT {}", vec!["'a'"; 1900].join("||")),
        vec!["SELECT 1"; 2200].join(" UNION ALL "),
        format!(
            "SELECT * FROM t {}",
            vec!["JOIN t USING (h)"; 1100].join(" ")
        ),
        format!(
            "CREATE FLOW f SINK TO s AS SELECT h, sum({}) FROM t GROUP BY h",
            vec!["v"; 1100].join("+")
        ),
    ] {
        let e = error(&db, &sql).await;
        assert!(matches!(e, Error::TooComplex { .. }), "{e:?}");
        assert!(e.to_string().contains(&format!("at most {max}")), "{e}");
    }
    // Still serving.
    assert_eq!(scalar(&db, "SELECT count(*) AS n FROM t").await, "1");
}

/// Flows take expressions as deep as the engine does (`FLOW_MAX_EXPRESSION_DEPTH`);
/// 40 `+` terms or 30 ANDs used to fail in the engine's protobuf decoder.
#[tokio::test]
async fn deep_flow_expressions_run_or_are_refused_by_name() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(
        &db,
        "CREATE TABLE t (h STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (h))",
    )
    .await;
    let max = sandflow::flow::FLOW_MAX_EXPRESSION_DEPTH;
    let terms = max - 10;
    run(
        &db,
        &format!(
            "CREATE FLOW f SINK TO s AS SELECT h, sum({}) AS total FROM t WHERE {} GROUP BY h",
            vec!["v"; terms].join(" + "),
            vec!["v > 0"; 60].join(" AND ")
        ),
    )
    .await;
    run(
        &db,
        "INSERT INTO t VALUES ('a', 2, '2024-01-01T00:00:00'), ('b', 0, '2024-01-01T00:00:00')",
    )
    .await;
    db.flush_flow("f").await.unwrap();
    assert_eq!(
        scalar(&db, "SELECT total FROM s WHERE h = 'a'").await,
        format!("{}", 2 * terms)
    );
    assert_eq!(scalar(&db, "SELECT count(*) FROM s").await, "1");
    let e = error(
        &db,
        &format!(
            "CREATE FLOW g SINK TO s2 AS SELECT h, sum({}) AS total FROM t GROUP BY h",
            vec!["v"; max + 10].join(" + ")
        ),
    )
    .await;
    assert!(matches!(e, Error::TooComplex { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains(&format!("flows accept at most {max}")),
        "{e}"
    );
    // The same expression runs as a plain query.
    assert_eq!(
        scalar(
            &db,
            &format!("SELECT sum({}) FROM t", vec!["v"; max + 10].join(" + "))
        )
        .await,
        format!("{}", 2 * (max + 10))
    );
}

/// BEGIN ... COMMIT commits together; ROLLBACK discards; a transaction sees its
/// own writes and nobody else does; a failed block accepts only its end.
#[tokio::test]
async fn transactions_are_real() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;
    let mut a = db.session();
    let mut b = db.session();
    a.execute("BEGIN").await.unwrap();
    a.execute("INSERT INTO cpu VALUES ('a', 1, 0), ('b', 2, 0)")
        .await
        .unwrap();
    a.execute("DELETE FROM cpu WHERE host = 'b'").await.unwrap();
    let seen = |out: Vec<Output>| match out.into_iter().next() {
        Some(Output::Rows { batches, .. }) => pretty_format_batches(&batches).unwrap().to_string(),
        other => panic!("{other:?}"),
    };
    let mine = seen(a.execute("SELECT host FROM cpu").await.unwrap());
    assert!(mine.contains("| a ") && !mine.contains("| b "), "{mine}");
    let theirs = seen(b.execute("SELECT count(*) AS n FROM cpu").await.unwrap());
    assert!(theirs.contains("| 0 "), "{theirs}");
    a.execute("COMMIT").await.unwrap();
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "1");

    a.execute("BEGIN; INSERT INTO cpu VALUES ('c', 3, 0)")
        .await
        .unwrap();
    a.execute("ROLLBACK").await.unwrap();
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "1");

    // A failed block refuses everything but its end; COMMIT then rolls back.
    a.execute("BEGIN").await.unwrap();
    a.execute("INSERT INTO cpu VALUES ('d', 4, 0)")
        .await
        .unwrap();
    assert!(a.execute("SELECT * FROM nope").await.is_err());
    assert_eq!(a.transaction_status(), sandflow::TransactionStatus::Failed);
    let e = a.execute("SELECT 1").await.unwrap_err();
    assert!(matches!(e, Error::Transaction { .. }), "{e:?}");
    match a.execute("COMMIT").await.unwrap().remove(0) {
        Output::Affected { tag, .. } => assert_eq!(tag, "ROLLBACK"),
        other => panic!("{other:?}"),
    }
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "1");

    // DDL is not transactional, and a rollback says so.
    a.execute("BEGIN; CREATE TABLE t2 (x INT, ts TIMESTAMP TIME INDEX)")
        .await
        .unwrap();
    a.take_notices();
    a.execute("ROLLBACK").await.unwrap();
    let notices = a.take_notices().join("\n");
    assert!(notices.contains("CREATE TABLE"), "{notices}");
    assert!(query(&db, "SHOW TABLES").await.contains("t2"));
}

/// A setting changes only its own session; unknown settings and DataFusion's
/// own are refused.
#[tokio::test]
async fn settings_belong_to_their_session() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    let mut a = db.session();
    let b = db.session();
    a.execute("SET statement_timeout = '5s'").await.unwrap();
    a.execute("SET TIME ZONE 'Europe/Berlin'").await.unwrap();
    assert_eq!(a.get("statement_timeout").as_deref(), Some("5000"));
    assert_eq!(b.get("statement_timeout").as_deref(), Some("0"));
    assert_eq!(a.get("TimeZone").as_deref(), Some("Europe/Berlin"));
    assert_eq!(b.get("timezone").as_deref(), Some("UTC"));
    for bad in [
        "SET datafusion.execution.batch_size = 1",
        "SET no_such_setting = 1",
        "SET client_encoding = 'LATIN1'",
        "SET server_version = '1'",
    ] {
        assert!(a.execute(bad).await.is_err(), "{bad}");
    }
    let shown = match a.execute("SHOW statement_timeout").await.unwrap().remove(0) {
        Output::Rows { batches, .. } => pretty_format_batches(&batches).unwrap().to_string(),
        other => panic!("{other:?}"),
    };
    assert!(shown.contains("5s"), "{shown}");
}

/// statement_timeout stops a long statement with SQLSTATE 57014's error, and
/// the session goes on.
#[tokio::test]
async fn statement_timeout_stops_a_long_query() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    let mut s = db.session();
    s.execute("SET statement_timeout = 200").await.unwrap();
    let started = std::time::Instant::now();
    let e = s
        .execute("SELECT count(*) FROM range(100000000000) a")
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Cancelled { .. }), "{e:?}");
    // Generous: a loaded machine may be slow to notice; the point is that it stops.
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    for _ in 0..3000 {
        if db.running_statements() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(db.running_statements(), 0);
    s.execute("SELECT 1").await.unwrap();
}

/// EXPLAIN of a DELETE plans it and deletes nothing; the DELETE itself deletes.
#[tokio::test]
async fn explain_delete_deletes_nothing() {
    let dir = TempDir::new();
    let db = Database::open(&dir.0).await.unwrap();
    run(&db, CPU).await;
    run(&db, "INSERT INTO cpu VALUES ('a', 1, 0), ('b', 2, 0)").await;
    let plan = query(&db, "EXPLAIN DELETE FROM cpu WHERE host = 'a'").await;
    assert!(plan.contains("SandflowDelete"), "{plan}");
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "2");
    assert_eq!(
        affected(&db, "DELETE FROM cpu WHERE host = 'a'").await,
        ("DELETE".to_string(), 1)
    );
    assert_eq!(scalar(&db, "SELECT count(*) FROM cpu").await, "1");
}

/// An idle flow sleeps (state kept, sandbox released) and wakes up on input
/// with its state intact; --max-flows bounds the flows, naming the setting.
#[tokio::test]
async fn idle_flows_sleep_and_wake_and_max_flows_is_a_setting() {
    let dir = TempDir::new();
    let settings = sandflow::flow::FlowSettings {
        sleep_after: Some(std::time::Duration::from_millis(100)),
        max_flows: 2,
        ..Default::default()
    };
    let db = Database::open_with(&dir.0, settings).await.unwrap();
    run(&db, CPU).await;
    run(
        &db,
        "CREATE FLOW f SINK TO s AS SELECT host, count(*) AS n, sum(usage) AS u FROM cpu GROUP BY host",
    )
    .await;
    run(
        &db,
        "INSERT INTO cpu VALUES ('a', 1, 0), ('a', 2, 1000), ('b', 5, 0)",
    )
    .await;
    db.flush_flow("f").await.unwrap();
    let asleep = |db: &Database| {
        db.flows()
            .iter()
            .any(|f| f.def.name == "f" && f.status.asleep)
    };
    let mut slept = false;
    for _ in 0..600 {
        if asleep(&db) {
            slept = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(slept, "the idle flow never fell asleep");
    // Input wakes it, and its state is what it was.
    run(&db, "INSERT INTO cpu VALUES ('a', 4, 2000)").await;
    run(&db, "DELETE FROM cpu WHERE host = 'b'").await;
    db.flush_flow("f").await.unwrap();
    assert_eq!(scalar(&db, "SELECT n FROM s WHERE host = 'a'").await, "3");
    assert_eq!(scalar(&db, "SELECT u FROM s WHERE host = 'a'").await, "7.0");
    assert_eq!(scalar(&db, "SELECT count(*) FROM s").await, "1");

    run(&db, "CREATE FLOW g SINK TO s2 AS SELECT host FROM cpu").await;
    let e = error(&db, "CREATE FLOW h SINK TO s3 AS SELECT host FROM cpu").await;
    assert!(matches!(e, Error::LimitExceeded { .. }), "{e:?}");
    assert!(e.to_string().contains("--max-flows"), "{e}");
    // Replacing an existing flow is no new flow.
    run(
        &db,
        "CREATE OR REPLACE FLOW g SINK TO s2 AS SELECT host FROM cpu",
    )
    .await;
}

/// Literal `INSERT ... VALUES` takes a path without DataFusion; it must give
/// what DataFusion gives. Each statement runs on two tables of the same
/// schema: as written (the fast path), and with a `WITH` clause that the
/// fast path leaves to DataFusion. Both must succeed with the same rows or
/// fail with the same message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn literal_inserts_equal_datafusions_inserts() {
    let db = Database::open_config(sandflow::DatabaseConfig::in_memory())
        .await
        .unwrap();
    for t in ["fast", "planned"] {
        run(
            &db,
            &format!(
                "CREATE TABLE {t} (k STRING, n INT, b BIGINT, f DOUBLE, ok BOOLEAN, \
                 note STRING NOT NULL DEFAULT 'none', at TIMESTAMP DEFAULT '2020-01-01T00:00:00Z', \
                 ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))"
            ),
        )
        .await;
    }
    let cases = [
        "VALUES ('a', 1, 2, 3.5, true, 'x', '2024-01-01 00:00:00', 0)",
        "VALUES ('b', -1, -2, -3, false, 'y', 1700000000000, '2024-01-01T00:00:00Z')",
        "(k, ts) VALUES ('c', '2024-01-01 00:00:00.123+02:00')",
        "(ts, k, f) VALUES (5, 'd', 1), (6, 'd', 2.25), (7, 'e', NULL)",
        "(k, n, ts) VALUES ('f', '42', 1), ('g', NULL, 2)",
        "(k, ok, ts) VALUES ('h', 'true', 1), ('i', 'f', 2)",
        "(k, n, ts) VALUES ('j', 1.5, 1)",
        "(k, b, ts) VALUES ('k', 9223372036854775807, 1)",
        "(k, b, ts) VALUES ('k', 9223372036854775808, 1)",
        "(k, f, ts) VALUES ('l', 1e3, 1), ('l', -2.5E-1, 2)",
        "(k, n, ts) VALUES ('m', 3000000000, 1)",
        "(k, note, ts) VALUES ('n', NULL, 1)",
        "(k, ts) VALUES ('o', 'not a time')",
        "(k, n, ts) VALUES ('p', 'x', 1)",
        "(k, ts) VALUES ('q', NULL)",
        "(k, nope, ts) VALUES ('r', 1, 1)",
        "(k, k, ts) VALUES ('s', 's', 1)",
        "(k, ts) VALUES ('t', 1, 2)",
        "(k, ts) VALUES ('u', 1), ('u', 1), ('v', 2)",
        "(k, n, ts) VALUES ('w', 1, 1), ('w', '2', 1)",
        "(K, TS) VALUES ('x', 3)",
        "(k, ts, at) VALUES ('y', 1, -1)",
    ];
    let mut both_ok = 0;
    for case in cases {
        let fast = db.execute(&format!("INSERT INTO fast {case}")).await;
        let (columns, values) = case.split_at(case.find("VALUES").unwrap());
        let planned = db
            .execute(&format!(
                "INSERT INTO planned {columns} WITH unused AS (SELECT 1) {values}"
            ))
            .await;
        match (&fast, &planned) {
            (Ok(a), Ok(b)) => {
                assert_eq!(format!("{a:?}"), format!("{b:?}"), "{case}");
                both_ok += 1;
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{case}"),
            _ => panic!("{case}: fast path {fast:?}, DataFusion {planned:?}"),
        }
        let columns = "k, n, b, f, ok, note, at, ts";
        assert_eq!(
            query(&db, &format!("SELECT {columns} FROM fast ORDER BY k, ts")).await,
            query(
                &db,
                &format!("SELECT {columns} FROM planned ORDER BY k, ts")
            )
            .await,
            "after {case}"
        );
    }
    assert!(both_ok >= 10, "only {both_ok} statements succeeded");
}

/// `key_column = literal` reads only that key range of the table; the rows
/// must be the ones a full scan filters out. Each query is compared with
/// the same query written so that nothing narrows the scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_equality_and_time_range_scans_equal_full_scans() {
    let db = Database::open_config(sandflow::DatabaseConfig::in_memory())
        .await
        .unwrap();
    run(
        &db,
        "CREATE TABLE t (host STRING, n INT, v DOUBLE, ts TIMESTAMP TIME INDEX, \
         PRIMARY KEY (host, n))",
    )
    .await;
    run(
        &db,
        "INSERT INTO t VALUES ('a', 1, 1.0, 0), ('a', 1, 2.0, 1000), ('a', 2, 3.0, 0), \
         ('ab', 1, 4.0, 0), ('b', -1, 5.0, 0), (NULL, 1, 6.0, 0), ('', 1, 7.0, 0), \
         ('b', 3000000, 9.0, '2024-01-01T00:00:00Z')",
    )
    .await;
    let cases = [
        ("host = 'a'", "host || '' = 'a'"),
        ("'a' = host", "'a' = host || ''"),
        ("host = 'ab'", "host || '' = 'ab'"),
        ("host = ''", "host || '' = ''"),
        ("host = 'zz'", "host || '' = 'zz'"),
        ("host = 'a' AND n = 1", "host || '' = 'a' AND n + 0 = 1"),
        (
            "host = 'a' AND n = 1 AND ts = '1970-01-01T00:00:01Z'",
            "host || '' = 'a' AND n + 0 = 1 AND ts = '1970-01-01T00:00:01Z'",
        ),
        ("host = 'b' AND n = -1", "host || '' = 'b' AND n + 0 = -1"),
        ("n = 1", "n + 0 = 1"),
        ("host = 'a' OR n = 2", "host || '' = 'a' OR n + 0 = 2"),
        ("host = 'a' AND v > 1.5", "host || '' = 'a' AND v > 1.5"),
        (
            "host = 'b' AND ts = '2024-01-01T00:00:00Z'",
            "host || '' = 'b' AND ts = '2024-01-01T00:00:00Z'",
        ),
        ("host IS NULL AND n = 1", "host IS NULL AND n + 0 = 1"),
        // Time ranges (the key starts with the time index).
        ("ts >= '1970-01-01T00:00:01Z'", "CAST(ts AS BIGINT) >= 1000"),
        ("ts > '1970-01-01T00:00:00Z'", "CAST(ts AS BIGINT) > 0"),
        ("ts < '1970-01-01T00:00:01Z'", "CAST(ts AS BIGINT) < 1000"),
        ("ts <= '1970-01-01T00:00:01Z'", "CAST(ts AS BIGINT) <= 1000"),
        ("'1970-01-01T00:00:01Z' > ts", "1000 > CAST(ts AS BIGINT)"),
        (
            "ts BETWEEN '1970-01-01T00:00:00Z' AND '1970-01-01T00:00:01Z'",
            "CAST(ts AS BIGINT) BETWEEN 0 AND 1000",
        ),
        (
            "ts >= '1970-01-01T00:00:01Z' AND ts < '2025-01-01T00:00:00Z'",
            "CAST(ts AS BIGINT) >= 1000 AND CAST(ts AS BIGINT) < 1735689600000",
        ),
        (
            "ts > '1970-01-01T00:00:00Z' AND ts < '1970-01-01T00:00:01Z'",
            "CAST(ts AS BIGINT) > 0 AND CAST(ts AS BIGINT) < 1000",
        ),
        (
            "ts > '2030-01-01T00:00:00Z'",
            "CAST(ts AS BIGINT) > 1893456000000",
        ),
        (
            "ts >= '1970-01-01T00:00:00Z' AND host = 'a'",
            "CAST(ts AS BIGINT) >= 0 AND host || '' = 'a'",
        ),
        (
            "ts = '1970-01-01T00:00:00Z' AND host = 'a'",
            "CAST(ts AS BIGINT) = 0 AND host || '' = 'a'",
        ),
        // A series within a time range (both narrow the scan).
        (
            "host = 'b' AND ts > '1970-01-01T00:00:00Z'",
            "host || '' = 'b' AND CAST(ts AS BIGINT) > 0",
        ),
        (
            "host = 'a' AND n = 1 AND ts < '1970-01-01T00:00:01Z'",
            "host || '' = 'a' AND n + 0 = 1 AND CAST(ts AS BIGINT) < 1000",
        ),
        ("host = 'a' AND n = 3", "host || '' = 'a' AND n + 0 = 3"),
    ];
    for (narrowed, full) in cases {
        let q = |w: &str| format!("SELECT host, n, v, ts FROM t WHERE {w} ORDER BY host, n, ts");
        assert_eq!(
            query(&db, &q(narrowed)).await,
            query(&db, &q(full)).await,
            "{narrowed}"
        );
        // No column read (the scan skips series order).
        let q = |w: &str| format!("SELECT count(*) FROM t WHERE {w}");
        assert_eq!(
            query(&db, &q(narrowed)).await,
            query(&db, &q(full)).await,
            "count: {narrowed}"
        );
    }
    assert!(query(&db, "SELECT count(*) FROM t").await.contains("| 8 "));
    let a = query(&db, "SELECT v FROM t WHERE host = 'a' ORDER BY v").await;
    assert!(
        a.contains("| 1.0 |") && a.contains("| 3.0 |") && !a.contains("4.0"),
        "{a}"
    );

    // Inside a transaction the staged rows count too.
    let mut s = db.session();
    s.execute("BEGIN").await.unwrap();
    s.execute("INSERT INTO t VALUES ('a', 9, 10.0, 0)")
        .await
        .unwrap();
    let out = s
        .execute("SELECT count(*) FROM t WHERE host = 'a'")
        .await
        .unwrap();
    assert!(format!("{out:?}").contains("4"), "{out:?}");
    s.execute("ROLLBACK").await.unwrap();
}

/// A flow placed on another node: its local run stops, the other node (here
/// the test, with the engine compiled in) restores it from what the
/// placement hands out, reads the exported changes after the snapshot, and
/// commits through `remote_commit`; only the current placement's fence is
/// taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_placed_on_another_node_commits_only_under_its_fence() {
    use sandflow::flow::remote::RemoteCommit;
    let dir = TempDir::new();
    let flows = sandflow::flow::FlowSettings {
        export_changes: true,
        ..Default::default()
    };
    let db = Database::open_with(&dir.0, flows).await.unwrap();
    run(
        &db,
        "CREATE TABLE m (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    )
    .await;
    run(
        &db,
        "INSERT INTO m VALUES ('a', 1, 0), ('b', 2, 0), ('a', 3, 1000)",
    )
    .await;
    let q = "SELECT host, count(v) AS n, sum(v) AS total FROM m GROUP BY host";
    run(&db, &format!("CREATE FLOW f SINK TO s AS {q}")).await;
    db.flush_flow("f").await.unwrap();
    let sink = "SELECT host, n, total FROM s ORDER BY host";
    let want = format!("{q} ORDER BY host");
    assert_eq!(query(&db, sink).await, query(&db, &want).await);

    let plan = db.place_flow_remote("f", "n2", 7).await.unwrap();
    let stored = plan
        .stored
        .clone()
        .expect("the flow ran here and snapshotted");
    assert_eq!(
        stored.positions, stored.written,
        "the snapshot is what the sink shows"
    );
    assert_eq!(plan.sources.len(), 1);
    assert_eq!(
        scalar(&db, "SELECT node FROM information_schema.flows").await,
        "n2"
    );

    // Writes after the placement: the local run no longer follows them.
    let before = query(&db, sink).await;
    run(&db, "INSERT INTO m VALUES ('c', 5, 0), ('b', 20, 0)").await;
    run(
        &db,
        "DELETE FROM m WHERE host = 'a' AND ts = '1970-01-01 00:00:00'",
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(query(&db, sink).await, before);

    // The other node: the engine from the snapshot, the changes after it.
    let mut flow = sandflow_engine::Flow::restore(&stored.state).unwrap();
    let fields = plan.sources[0].schema.fields.clone();
    let mut position = stored.positions[0];
    loop {
        let parts = db.export_next().await.unwrap();
        if parts.is_empty() {
            break;
        }
        for p in parts {
            assert_eq!(p.table_id, plan.sources[0].table_id);
            if p.end <= position {
                continue;
            }
            let (rows, diffs) = sandflow::export::decode(&p.body).unwrap();
            let batch = sandflow::flow::arrow::batch_from_arrow(&rows, &fields, 0, diffs).unwrap();
            flow.push(0, batch).unwrap();
            position = p.end;
        }
    }
    let mut out = flow.tick(1, u32::MAX).unwrap();
    out.expand();
    let commit = RemoteCommit {
        output: vec![out.output],
        now: 1,
        positions: vec![position],
        snapshot: Some(flow.snapshot().unwrap()),
        ticked: true,
    };
    // A stale fence is refused and writes nothing.
    let e = db.remote_commit("f", 6, commit.clone()).await.unwrap_err();
    assert!(
        e.to_string().contains("is not placed here under fence 6"),
        "{e}"
    );
    assert_eq!(query(&db, sink).await, before);
    assert!(db.remote_commit("f", 7, commit.clone()).await.unwrap() > 0);
    assert_eq!(query(&db, sink).await, query(&db, &want).await);

    // Placed again (another node, a newer fence): the old one is refused.
    db.place_flow_remote("f", "n3", 8).await.unwrap();
    let e = db.remote_commit("f", 7, commit).await.unwrap_err();
    assert!(e.to_string().contains("under fence 7"), "{e}");
    assert_eq!(
        scalar(&db, "SELECT node FROM information_schema.flows").await,
        "n3"
    );

    // A back-fill for a flow without a snapshot: the rows now, at a commit.
    let (seq, batches) = db.remote_backfill("public", "m").await.unwrap();
    assert!(seq > 0);
    assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 3);
}
