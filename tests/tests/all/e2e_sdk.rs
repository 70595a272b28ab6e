//! The SDK's example components end to end on the real binary:
//! `guest/sdk/examples/topk` (top-k per key, Rust) and
//! `guest/sdk/examples/anomaly-py` (an anomaly score per key, Python built
//! with componentize-py). Each is uploaded over HTTP, a flow `USING COMPONENT`
//! runs on it, rows are inserted, upserted and deleted, and its sink is
//! checked against the same result computed over the source, before and
//! after a restart, and after a kill -9 during ingest.
//!
//! The components are built by `make examples` (part of `make test`).

use std::time::Duration;

use postgres::{Client, NoTls};
use sandflow_tests::engine::{anomaly_component as anomaly_wasm, topk_component as topk_wasm};
use sandflow_tests::harness::Server;

use super::e2e_components::{connect, put, rows};

/// The `k` largest values per host, by SQL.
fn truth(k: u32) -> String {
    format!(
        "SELECT host, rn, v FROM (SELECT host, v, row_number() OVER \
         (PARTITION BY host ORDER BY v DESC) AS rn FROM m WHERE v IS NOT NULL) t \
         WHERE rn <= {k} ORDER BY host, rn"
    )
}

/// Checks both flows: `top` (the component's defaults, k = 3) and `top2`
/// (its options given in WITH: k = 2); returns the 3 largest per host.
fn assert_top(c: &mut Client, what: &str) -> Vec<String> {
    for (flow, k) in [("top", 3), ("top2", 2)] {
        c.batch_execute(&format!("ADMIN FLUSH_FLOW('{flow}')"))
            .expect("flush");
        let sink = rows(
            c,
            &format!("SELECT host, rank, v FROM {flow}_sink ORDER BY host, rank"),
        );
        assert_eq!(sink, rows(c, &truth(k)), "{flow} (k = {k}) after {what}");
    }
    rows(c, &truth(3))
}

#[test]
fn the_rust_sdk_top_k_example_is_exact_under_upserts_deletes_and_a_restart() {
    let s = Server::start();
    let wasm = topk_wasm();
    let (status, json) = put(&s, "/v1/components/topk", &wasm);
    assert_eq!(status, 200, "upload: {json}");
    assert_eq!(json["version"], 1, "{json}");

    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    )
    .unwrap();
    // Options are the component's defaults: key = the first column (host),
    // value = the first numeric column that is not the key (v), k = 3.
    c.batch_execute(
        "CREATE FLOW top SINK TO top_sink USING COMPONENT topk AS SELECT host, v FROM m",
    )
    .expect("CREATE FLOW ... USING COMPONENT topk");
    // The same component with its own options, which sandflow passes on.
    c.batch_execute(
        "CREATE FLOW top2 SINK TO top2_sink USING COMPONENT topk \
         WITH (key = 'host', value = 'v', k = '2', memory_limit = '64MiB') AS SELECT host, v FROM m",
    )
    .expect("CREATE FLOW ... USING COMPONENT topk WITH (...)");

    // Hand-checked small case first.
    c.batch_execute(
        "INSERT INTO m VALUES ('a', 1.5, 1), ('a', 7, 2), ('a', 3, 3), ('a', 5, 4), \
         ('b', 2, 1), ('b', 2, 2), ('c', NULL, 1)",
    )
    .unwrap();
    let truth = assert_top(&mut c, "the first inserts");
    assert_eq!(
        truth,
        vec!["a|1|7.0", "a|2|5.0", "a|3|3.0", "b|1|2.0", "b|2|2.0"]
    );

    // Upsert (same host and ts, new value), delete, values that tie.
    c.batch_execute("INSERT INTO m VALUES ('a', 0.5, 2)")
        .unwrap();
    c.batch_execute("DELETE FROM m WHERE host = 'a' AND v = 5")
        .unwrap();
    c.batch_execute("INSERT INTO m VALUES ('b', 9, 3), ('c', 4, 2)")
        .unwrap();
    let truth = assert_top(&mut c, "an upsert and a delete");
    assert_eq!(
        truth,
        vec!["a|1|3.0", "a|2|1.5", "a|3|0.5", "b|1|9.0", "b|2|2.0", "b|3|2.0", "c|1|4.0"]
    );

    // Many writes over a few hosts, with upserts and deletes in between.
    for i in 0..60i64 {
        let host = ["x", "y", "z"][(i % 3) as usize];
        let v = (i * 37) % 23;
        c.batch_execute(&format!(
            "INSERT INTO m VALUES ('{host}', {v}, {})",
            100 + i % 20
        ))
        .unwrap();
        if i % 11 == 10 {
            c.batch_execute(&format!("DELETE FROM m WHERE host = '{host}' AND v > 15"))
                .unwrap();
        }
    }
    assert_top(&mut c, "many upserts and deletes");
    c.batch_execute("DELETE FROM m WHERE host = 'b'").unwrap();
    assert_top(&mut c, "deleting a whole key");

    // Restart: the flow goes on from its snapshot, exactly.
    drop(c);
    let s = s.restart();
    let mut c = connect(&s);
    assert_top(&mut c, "the restart");
    c.batch_execute("INSERT INTO m VALUES ('x', 100, 200), ('y', -1, 200), ('b', 1, 200)")
        .unwrap();
    c.batch_execute("DELETE FROM m WHERE host = 'z' AND v < 10")
        .unwrap();
    c.batch_execute("INSERT INTO m VALUES ('x', 50, 200)")
        .unwrap();
    let truth = assert_top(&mut c, "writes after the restart");
    assert!(truth.iter().any(|r| r == "x|1|50.0"), "{truth:?}");
    assert!(truth.iter().any(|r| r == "b|1|1.0"), "{truth:?}");
}

/// Checks the Python example's flow `anom` against the same statistics
/// computed here over the source's current rows: per host, the count, mean,
/// population standard deviation and the largest |v - mean| / stddev of its
/// non-NULL values. Returns the number of hosts.
fn assert_anomaly(c: &mut Client, what: &str) -> usize {
    c.batch_execute("ADMIN FLUSH_FLOW('anom')").expect("flush");
    let mut values: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for r in c
        .query("SELECT host, v FROM m WHERE v IS NOT NULL", &[])
        .expect("source")
    {
        values
            .entry(r.get::<_, String>(0))
            .or_default()
            .push(r.get::<_, f64>(1));
    }
    let truth: Vec<(String, i64, f64, f64, f64)> = values
        .into_iter()
        .map(|(host, vs)| {
            let n = vs.len() as f64;
            let mean = vs.iter().sum::<f64>() / n;
            let stddev = (vs.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
            let score = if stddev == 0.0 {
                0.0
            } else {
                vs.iter().map(|v| (v - mean).abs()).fold(0.0, f64::max) / stddev
            };
            (host, vs.len() as i64, mean, stddev, score)
        })
        .collect();
    let sink: Vec<(String, i64, f64, f64, f64)> = c
        .query(
            "SELECT host, n, mean, stddev, score FROM anom_sink ORDER BY host",
            &[],
        )
        .expect("sink")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    let same = sink.len() == truth.len()
        && sink.iter().zip(&truth).all(|(s, t)| {
            s.0 == t.0 && s.1 == t.1 && close(s.2, t.2) && close(s.3, t.3) && close(s.4, t.4)
        });
    assert!(
        same,
        "anomaly scores after {what}:\nsink:  {sink:?}\ntruth: {truth:?}"
    );
    truth.len()
}

/// The Python example, built with componentize-py: uploaded over HTTP, a
/// flow on it with its default options, inserts, upserts and deletes, a
/// restart; every sink state equals the statistics over the source.
#[test]
fn the_python_anomaly_example_is_exact_under_upserts_deletes_and_a_restart() {
    let s = Server::start();
    let (status, json) = put(&s, "/v1/components/anomaly", &anomaly_wasm());
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
         CREATE FLOW anom SINK TO anom_sink USING COMPONENT anomaly AS SELECT host, v FROM m",
    )
    .expect("CREATE FLOW ... USING COMPONENT anomaly");

    // Hand-checked: a = {1, 2, 3, 10}: mean 4, stddev sqrt(12.5), the
    // farthest value 10 is 6 / sqrt(12.5) = 1.697 stddevs out; b has one
    // value (stddev 0, score 0); c's only value is NULL (no row).
    c.batch_execute(
        "INSERT INTO m VALUES ('a', 1, 1), ('a', 2, 2), ('a', 3, 3), ('a', 10, 4), \
         ('b', 5, 1), ('c', NULL, 1)",
    )
    .unwrap();
    assert_eq!(assert_anomaly(&mut c, "the first inserts"), 2);
    assert_eq!(
        rows(
            &mut c,
            "SELECT host, n, mean, round(score, 3) FROM anom_sink ORDER BY host"
        ),
        vec!["a|4|4.0|1.697", "b|1|5.0|0"]
    );

    // An upsert moves a's outlier back in; a delete empties b.
    c.batch_execute("INSERT INTO m VALUES ('a', 2.5, 4)")
        .unwrap();
    c.batch_execute("DELETE FROM m WHERE host = 'b'").unwrap();
    c.batch_execute("INSERT INTO m VALUES ('c', 7, 1)").unwrap();
    assert_eq!(assert_anomaly(&mut c, "an upsert and deletes"), 2);
    assert!(
        rows(&mut c, "SELECT host FROM anom_sink WHERE host = 'b'").is_empty(),
        "a key whose rows are all deleted leaves the sink"
    );

    for i in 0..60i64 {
        let host = ["x", "y", "z"][(i % 3) as usize];
        c.batch_execute(&format!(
            "INSERT INTO m VALUES ('{host}', {}, {})",
            (i * 37) % 23,
            100 + i % 20
        ))
        .unwrap();
        if i % 11 == 10 {
            c.batch_execute(&format!("DELETE FROM m WHERE host = '{host}' AND v > 15"))
                .unwrap();
        }
    }
    assert_anomaly(&mut c, "many upserts and deletes");

    drop(c);
    let s = s.restart();
    let mut c = connect(&s);
    assert_anomaly(&mut c, "the restart");
    c.batch_execute("INSERT INTO m VALUES ('x', 1000, 200), ('w', 1, 200)")
        .unwrap();
    c.batch_execute("DELETE FROM m WHERE host = 'y'").unwrap();
    assert_anomaly(&mut c, "writes after the restart");
}

/// kill -9 while rows stream into the sources of component flows (Rust and
/// Python): after the restart each component's sink is exactly what an uninterrupted run would
/// have written over the rows that were stored (nothing lost, nothing
/// twice), like the built-in flow beside it.
#[test]
fn a_component_flow_is_exact_after_kill9_during_ingest() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let mut s = Server::start();
    let (status, json) = put(&s, "/v1/components/topk", &topk_wasm());
    assert_eq!(status, 200, "upload: {json}");
    let (status, json) = put(&s, "/v1/components/anomaly", &anomaly_wasm());
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
         CREATE FLOW top SINK TO top_sink USING COMPONENT topk AS SELECT host, v FROM m; \
         CREATE FLOW anom SINK TO anom_sink USING COMPONENT anomaly AS SELECT host, v FROM m; \
         CREATE FLOW top2 SINK TO top2_sink USING COMPONENT topk WITH (k = '2') \
           AS SELECT host, v FROM m; \
         CREATE FLOW counts SINK TO counts_sink AS \
           SELECT host, count(*) AS n, sum(v) AS total FROM m GROUP BY host",
    )
    .expect("flows");
    drop(c);

    let acked = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let port = s.pg_port;
    let writer = {
        let (acked, stop) = (acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let Ok(mut c) = Client::connect(
                &format!(
                    "host=127.0.0.1 port={port} user=sandflow dbname=public connect_timeout=10"
                ),
                NoTls,
            ) else {
                return;
            };
            // Bounded: stops at the kill, or after 20k statements. Some
            // rows replace earlier ones (same host and time), some delete.
            for b in 0..20_000i64 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let sql = if b % 7 == 6 {
                    format!("DELETE FROM m WHERE host = 'h{}' AND v < {}", b % 5, b % 13)
                } else {
                    format!(
                        "INSERT INTO m VALUES ('h{}', {}, {}), ('h{}', {}, {})",
                        b % 5,
                        (b * 37) % 101,
                        b % 50,
                        (b + 1) % 5,
                        (b * 11) % 97,
                        b
                    )
                };
                if c.batch_execute(&sql).is_err() {
                    break;
                }
                acked.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while acked.load(Ordering::SeqCst) < 200 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    s.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("writer");
    assert!(
        acked.load(Ordering::SeqCst) >= 200,
        "too few writes before the kill"
    );

    let s = Server::start_in(s.dir());
    let mut c = connect(&s);
    assert_top(&mut c, "the kill -9 and restart");
    assert_anomaly(&mut c, "the kill -9 and restart");
    c.batch_execute("ADMIN FLUSH_FLOW('counts')")
        .expect("flush");
    assert_eq!(
        rows(
            &mut c,
            "SELECT host, n, total FROM counts_sink ORDER BY host"
        ),
        rows(
            &mut c,
            "SELECT host, count(*), sum(v) FROM m GROUP BY host ORDER BY host"
        ),
        "the built-in flow beside it"
    );
}
