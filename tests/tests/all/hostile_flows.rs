//! The hostile-guest suite driven through the whole database: flows that run
//! a deliberately evil guest component (tests/hostile-guest) next to flows
//! that run sandflow's own engine, in one `Database`. Every attack — an
//! infinite loop, unbounded allocation, deep recursion, a panic, a read past its memory, output past
//! the per-call and per-tick row bounds, malformed batches — fails only its
//! own flow, with a clear error in FLUSH_FLOW and `information_schema.flows`,
//! and the real flows keep producing exactly their queries' results.
//!
//! The server binary can only ever run its own guest; the library takes
//! another one only through the doc-hidden `FlowSettings::untrusted_guest`,
//! which exists for this suite.

use std::sync::Arc;
use std::time::Duration;

use sandflow::flow::{FlowSettings, UntrustedGuest};
use sandflow::runtime::FlowLimits;
use sandflow::Database;
use sandflow_tests::db::rows;

fn settings() -> FlowSettings {
    let bytes = std::fs::read(env!("HOSTILE_GUEST_WASM"))
        .expect("the hostile guest is built by tests/build.rs");
    FlowSettings {
        default_limits: FlowLimits {
            memory: 32 << 20,
            cpu_per_call: Duration::from_millis(300),
            max_output_rows: 1000,
            output_rows_per_tick: 5000,
            state_size: None,
        },
        // Every failure here is permanent or must stay visible: no retries.
        max_restarts: 0,
        untrusted_guest: Some(UntrustedGuest {
            component: Arc::new(bytes),
            runs: Arc::new(|name: &str| name.starts_with("evil_")),
        }),
        ..FlowSettings::default()
    }
}

/// (mode, words the flow's error must contain)
const ATTACKS: &[(&str, &[&str])] = &[
    ("loop", &["CPU budget"]),
    ("alloc", &["memory limit"]),
    ("recurse", &["trapped"]),
    ("panic", &["trapped", "panics on purpose"]),
    ("out-of-bounds", &["trapped", "out of bounds"]),
    ("huge-output", &["broke the contract"]),
    ("endless-output", &["output_rows_limit_per_tick"]),
    ("wrong-lengths", &["broke the contract"]),
    ("bad-offsets", &["broke the contract"]),
    ("bad-utf8", &["broke the contract"]),
    ("extra-columns", &["broke the contract"]),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_flow_fails_alone_and_the_real_flows_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open_with(dir.path(), settings()).await.unwrap();
    db.execute(
        "CREATE TABLE metrics (host STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
         CREATE FLOW per_host SINK TO per_host_sink AS \
           SELECT host, count(*) AS n, sum(v) AS total FROM metrics GROUP BY host; \
         CREATE TABLE hostile_ok (x BIGINT, ts TIMESTAMP TIME INDEX); \
         CREATE FLOW evil_ok SINK TO evil_ok_sink AS SELECT x FROM hostile_ok",
    )
    .await
    .unwrap();

    let mut expected: std::collections::BTreeMap<String, (i64, i64)> = Default::default();
    let mut t = 0i64;
    for (i, (mode, words)) in ATTACKS.iter().enumerate() {
        let table = format!("hostile_{}", mode.replace('-', "_"));
        let flow = format!("evil_{}", mode.replace('-', "_"));
        db.execute(&format!(
            "CREATE TABLE {table} (x BIGINT, ts TIMESTAMP TIME INDEX); \
             INSERT INTO {table} VALUES (1, 0); \
             CREATE FLOW {flow} SINK TO {flow}_sink AS SELECT x FROM {table}"
        ))
        .await
        .unwrap_or_else(|e| panic!("{mode}: creating the flow failed: {e}"));
        let err = db
            .flush_flow(&flow)
            .await
            .expect_err(&format!("{mode}: the hostile flow flushed"))
            .to_string();
        for w in *words {
            assert!(err.contains(w), "{mode}: error lacks '{w}': {err}");
        }
        assert!(err.contains(&flow), "{mode}: {err}");
        let info = rows(
            &db,
            &format!(
                "SELECT status, last_error, failures FROM information_schema.flows \
                 WHERE flow_name = '{flow}'"
            ),
        )
        .await;
        assert_eq!(info[0][0], "failed", "{mode}: {info:?}");
        assert!(info[0][1].contains(words[0]), "{mode}: {info:?}");
        assert_eq!(info[0][2], "1", "{mode}: {info:?}");
        // Its sink got nothing from it.
        assert_eq!(
            rows(&db, &format!("SELECT count(*) FROM {flow}_sink")).await,
            vec![vec!["0"]],
            "{mode}"
        );

        // The real flow, and the well-behaved flow of the same untrusted
        // component, carry on.
        let host = format!("h{}", i % 3);
        for v in [i as i64, 10 * i as i64 + 1] {
            t += 1000;
            db.execute(&format!(
                "INSERT INTO metrics VALUES ('{host}', {v}, {t}); INSERT INTO hostile_ok VALUES ({v}, {t})"
            ))
            .await
            .unwrap();
            let e = expected.entry(host.clone()).or_default();
            e.0 += 1;
            e.1 += v;
        }
        db.flush_flow("per_host")
            .await
            .unwrap_or_else(|e| panic!("after {mode}: {e}"));
        db.flush_flow("evil_ok")
            .await
            .unwrap_or_else(|e| panic!("after {mode}: {e}"));
        let want: Vec<Vec<String>> = expected
            .iter()
            .map(|(h, (n, s))| vec![h.clone(), n.to_string(), s.to_string()])
            .collect();
        assert_eq!(
            rows(
                &db,
                "SELECT host, n, total FROM per_host_sink ORDER BY host"
            )
            .await,
            want,
            "after {mode}"
        );
    }

    let info = rows(
        &db,
        "SELECT flow_name, status FROM information_schema.flows ORDER BY flow_name",
    )
    .await;
    for row in &info {
        let want = if row[0] == "per_host" || row[0] == "evil_ok" {
            "running"
        } else {
            "failed"
        };
        assert_eq!(row[1], want, "{info:?}");
    }
    assert_eq!(info.len(), ATTACKS.len() + 2);
    let ok_rows = rows(&db, "SELECT count(*) FROM evil_ok_sink").await;
    assert_ne!(
        ok_rows,
        vec![vec!["0"]],
        "the well-behaved guest wrote nothing"
    );

    // A failed hostile flow stays failed on RESUME (its cause is in its
    // code), and resuming it harms nobody.
    assert_eq!(
        rows(&db, "ADMIN RESUME_FLOW('evil_panic')").await,
        vec![vec!["1"]]
    );
    let e = db.flush_flow("evil_panic").await.unwrap_err().to_string();
    assert!(e.contains("panics on purpose"), "{e}");
    db.execute("INSERT INTO metrics VALUES ('h0', 1000, 999000)")
        .await
        .unwrap();
    db.flush_flow("per_host").await.unwrap();
    let n = expected.get("h0").map_or(0, |e| e.0) + 1;
    let got = rows(&db, "SELECT n FROM per_host_sink WHERE host = 'h0'").await;
    assert_eq!(got, vec![vec![n.to_string()]]);
}

/// A guest that prints without end: its lines reach
/// `information_schema.flow_logs`, bounded per call, per line and per
/// flow, with a line that counts what was not kept; the flow itself keeps
/// running (before, writing more than 4 KiB to stderr trapped it), and a
/// dropped flow's lines go with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chatty_guest_is_logged_within_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::open_with(dir.path(), settings()).await.unwrap();
    db.execute(
        "CREATE TABLE hostile_chatty (x BIGINT, ts TIMESTAMP TIME INDEX); \
         CREATE FLOW evil_chatty SINK TO evil_chatty_sink AS SELECT x FROM hostile_chatty; \
         INSERT INTO hostile_chatty VALUES (1, 0)",
    )
    .await
    .unwrap();
    for _ in 0..3 {
        db.flush_flow("evil_chatty")
            .await
            .expect("a chatty flow runs");
    }
    let status = rows(
        &db,
        "SELECT status FROM information_schema.flows WHERE flow_name = 'evil_chatty'",
    )
    .await;
    assert_eq!(status, vec![vec!["running"]]);
    let lines: Vec<String> = rows(
        &db,
        "SELECT line FROM information_schema.flow_logs WHERE flow = 'evil_chatty'",
    )
    .await
    .into_iter()
    .map(|r| r[0].clone())
    .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("chatty says hello at tick")),
        "stdout is logged: {:?}",
        &lines[..lines.len().min(3)]
    );
    assert!(
        lines.iter().any(|l| l.starts_with("chatty tick")),
        "stderr is logged"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.len() <= sandflow::runtime::LOG_LINE_BYTES + 4),
        "a long line is cut"
    );
    assert!(
        lines.iter().any(|l| l.contains("more lines were not kept")),
        "what was not kept is counted"
    );
    assert!(
        lines.len() <= sandflow::flow::logs::MAX_LINES,
        "{}",
        lines.len()
    );
    // DROP FLOW forgets the flow's lines.
    db.execute("DROP FLOW evil_chatty").await.unwrap();
    assert_eq!(
        rows(&db, "SELECT count(*) FROM information_schema.flow_logs").await,
        vec![vec!["0"]]
    );
}
