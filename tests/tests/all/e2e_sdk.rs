//! The Rust SDK's example component (`guest/sdk/examples/topk`, top-k per
//! key) end to end on the real binary: uploaded over HTTP, a flow `USING
//! COMPONENT` on it, inserts, upserts and deletes, its sink checked against
//! the same top-k computed by SQL over the source, before and after a
//! restart, and after a kill -9 during ingest.
//!
//! The component is built by `make examples` (part of `make test`).

use std::path::PathBuf;
use std::time::Duration;

use postgres::{Client, NoTls};
use sandflow_tests::harness::Server;

use super::e2e_components::{connect, put, rows};

/// Where `make examples` writes the top-k component: `$SANDFLOW_TOPK_WASM`,
/// else under `$CARGO_TARGET_DIR`, else under the target directory of this
/// test binary.
fn topk_wasm() -> Vec<u8> {
    let path = match std::env::var_os("SANDFLOW_TOPK_WASM") {
        Some(p) => PathBuf::from(p),
        None => {
            let target = match std::env::var_os("CARGO_TARGET_DIR") {
                Some(dir) => PathBuf::from(dir),
                None => {
                    // target/<profile>/deps/<test binary>
                    let exe = std::env::current_exe().expect("current_exe");
                    exe.ancestors()
                        .nth(3)
                        .expect("the test binary lives in target/<profile>/deps")
                        .to_path_buf()
                }
            };
            target.join("wasm32-wasip2/release/sandflow_example_topk.wasm")
        }
    };
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the top-k example component {}: {e}; build it with `make examples` \
             (or set SANDFLOW_TOPK_WASM)",
            path.display()
        )
    })
}

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
    let dir = s.dir();
    let mut s = s;
    assert!(s.stop(), "unclean shutdown:\n{}", s.logs());
    let s = Server::start_in(dir);
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

/// kill -9 while rows stream into a component flow's source: after the
/// restart the component's sink is exactly what an uninterrupted run would
/// have written over the rows that were stored (nothing lost, nothing
/// twice), like the built-in flow beside it.
#[test]
fn a_component_flow_is_exact_after_kill9_during_ingest() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;

    let mut s = Server::start();
    let (status, json) = put(&s, "/v1/components/topk", &topk_wasm());
    assert_eq!(status, 200, "upload: {json}");
    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
         CREATE FLOW top SINK TO top_sink USING COMPONENT topk AS SELECT host, v FROM m; \
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
