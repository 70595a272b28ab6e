//! The database as a library with an in-memory store and a virtual clock:
//! flows tick, EXPIRE AFTER drops windows and ttl expires rows exactly at the
//! virtual times, nothing runs unless driven, and the same statements at the
//! same times give byte-identical sinks. Also: two databases in one process
//! share no metrics.

use std::sync::Arc;

use datafusion::arrow::util::display::array_value_to_string;
use sandflow::clock::VirtualClock;
use sandflow::{Database, DatabaseConfig, Output};

/// 2023-11-14T22:13:20Z, a whole second.
const T0: i64 = 1_700_000_000_000;

async fn open_virtual(start_ms: i64) -> (Arc<Database>, Arc<VirtualClock>) {
    let clock = Arc::new(VirtualClock::new(start_ms));
    let db = Database::open_config(DatabaseConfig::in_memory().with_virtual_clock(clock.clone()))
        .await
        .unwrap();
    (db, clock)
}

/// Every row of `sql`'s result, cells joined by `|`, rows by `\n`.
async fn rows(db: &Database, sql: &str) -> String {
    let out = db
        .execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    let Some(Output::Rows { batches, .. }) = out.into_iter().last() else {
        panic!("{sql}: no rows")
    };
    let mut lines = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            let cells: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c, r).unwrap())
                .collect();
            lines.push(cells.join("|"));
        }
    }
    lines.join("\n")
}

/// A flow's `state_size` from `information_schema.flows`.
async fn state_size(db: &Database, flow: &str) -> u64 {
    rows(
        db,
        &format!("SELECT state_size FROM information_schema.flows WHERE flow_name = '{flow}'"),
    )
    .await
    .parse()
    .expect("state_size")
}

async fn run(db: &Database, sql: &str) {
    db.execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    db.run_flows().await.unwrap();
}

const TOTALS: &str = "SELECT host, n FROM totals ORDER BY host";
const PER_SEC: &str = "SELECT host, CAST(sec AS BIGINT) AS ms, n FROM per_sec ORDER BY ms, host";

/// The scenario; returns everything it saw, and the sinks' whole contents
/// (every column, the flows' update times included) at the end.
async fn scenario() -> (Vec<String>, String) {
    let (db, clock) = open_virtual(T0 - 1_000).await;
    let mut seen = Vec::new();
    run(
        &db,
        "CREATE TABLE req (host STRING, id INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, id)) \
         WITH (ttl = '30s')",
    )
    .await;
    run(
        &db,
        "CREATE FLOW totals SINK TO totals AS SELECT host, count(*) AS n FROM req GROUP BY host",
    )
    .await;
    run(
        &db,
        "CREATE FLOW per_sec SINK TO per_sec EXPIRE AFTER '10 s' AS \
         SELECT host, date_bin(INTERVAL '1 second', ts) AS sec, count(*) AS n \
         FROM req GROUP BY host, sec",
    )
    .await;

    // Ticks: an idle flow ticks at once; under more input, not before its
    // gap after its last tick. Ticks cost no virtual time, so the gap is its
    // least, a twentieth of the tick interval: 10 ms.
    db.advance_time_to(T0).await.unwrap();
    run(
        &db,
        &format!("INSERT INTO req VALUES ('a', 1, {T0}), ('b', 1, {T0})"),
    )
    .await;
    assert_eq!(rows(&db, TOTALS).await, "a|1\nb|1", "ticked at once");
    db.advance_time_to(T0 + 5).await.unwrap();
    run(&db, &format!("INSERT INTO req VALUES ('a', 2, {T0})")).await;
    assert_eq!(rows(&db, TOTALS).await, "a|1\nb|1", "not before the gap");
    db.advance_time_to(T0 + 9).await.unwrap();
    assert_eq!(rows(&db, TOTALS).await, "a|1\nb|1", "not at 9 ms");
    db.advance_time_to(T0 + 10).await.unwrap();
    assert_eq!(rows(&db, TOTALS).await, "a|2\nb|1", "exactly at 10 ms");
    seen.push(rows(&db, PER_SEC).await);
    assert_eq!(seen[0], format!("a|{T0}|2\nb|{T0}|1"));

    // EXPIRE AFTER '10 s': window T0 takes late rows while the tick time is
    // at most T0 + 10 s, and none after.
    db.advance_time_to(T0 + 10_000).await.unwrap();
    run(&db, &format!("INSERT INTO req VALUES ('b', 2, {T0})")).await;
    assert_eq!(
        rows(&db, PER_SEC).await,
        format!("a|{T0}|2\nb|{T0}|2"),
        "a late row at the last moment counts"
    );
    db.advance_time_to(T0 + 10_001).await.unwrap();
    run(&db, &format!("INSERT INTO req VALUES ('a', 3, {T0})")).await;
    // The flows ticked at T0 + 10 s: the next tick is 10 ms later.
    assert_eq!(rows(&db, TOTALS).await, "a|2\nb|2", "not before the gap");
    db.advance_time_to(T0 + 10_010).await.unwrap();
    assert_eq!(
        rows(&db, PER_SEC).await,
        format!("a|{T0}|2\nb|{T0}|2"),
        "a late row 1 ms after the window expired is ignored"
    );
    assert_eq!(
        rows(&db, TOTALS).await,
        "a|3\nb|2",
        "a flow without EXPIRE AFTER counts it"
    );
    seen.push(rows(&db, TOTALS).await);

    // ttl = '30s': rows whose time index is more than 30 s before the clock
    // go, exactly then; the flows keep what they computed.
    db.advance_time_to(T0 + 30_000).await.unwrap();
    assert_eq!(
        rows(&db, "SELECT count(*) FROM req").await,
        "5",
        "kept at 30 s"
    );
    db.advance_time_to(T0 + 30_001).await.unwrap();
    assert_eq!(
        rows(&db, "SELECT count(*) FROM req").await,
        "0",
        "gone 1 ms later"
    );
    seen.push(rows(&db, TOTALS).await);
    assert_eq!(seen[2], "a|3\nb|2");

    // Nothing runs unless driven: an insert is not in the sink until the
    // flows run.
    Box::pin(db.execute(&format!("INSERT INTO req VALUES ('c', 1, {})", T0 + 30_001)))
        .await
        .unwrap();
    assert_eq!(rows(&db, TOTALS).await, "a|3\nb|2");
    db.run_flows().await.unwrap();
    assert_eq!(rows(&db, TOTALS).await, "a|3\nb|2\nc|1");
    assert_eq!(clock.now_ms(), T0 + 30_001);

    // DEFAULT now() is the virtual time.
    run(
        &db,
        "CREATE TABLE d (k INT, ts TIMESTAMP DEFAULT now() TIME INDEX, PRIMARY KEY (k))",
    )
    .await;
    run(&db, "INSERT INTO d (k) VALUES (1)").await;
    assert_eq!(
        rows(&db, "SELECT CAST(ts AS BIGINT) FROM d").await,
        (T0 + 30_001).to_string()
    );

    // So are now() and current_timestamp in queries.
    assert_eq!(
        rows(
            &db,
            "SELECT CAST(now() AS BIGINT), CAST(current_timestamp AS BIGINT)"
        )
        .await,
        format!("{0}|{0}", (T0 + 30_001) * 1_000_000)
    );

    let all = format!(
        "{}\n--\n{}",
        rows(&db, "SELECT * FROM totals ORDER BY host").await,
        rows(&db, "SELECT * FROM per_sec ORDER BY host, sec").await
    );
    (seen, all)
}

use sandflow::clock::Clock as _;

/// Runs `f` on a runtime of its own on a thread with a deep stack (in a
/// debug build the scenario's future takes more than a test thread's 2 MiB).
fn on_big_stack(f: impl std::future::Future<Output = ()> + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(64 << 20)
        .spawn(move || {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap()
                .block_on(f)
        })
        .unwrap()
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e));
}

#[test]
fn flows_ttl_and_expire_after_act_at_virtual_times_and_repeat_exactly() {
    on_big_stack(async {
        let first = Box::pin(scenario()).await;
        let second = Box::pin(scenario()).await;
        assert_eq!(
            first, second,
            "the same statements at the same times give the same sinks"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_only_moves_forward() {
    let (db, _) = open_virtual(T0).await;
    let e = db.advance_time_to(T0 - 1).await.unwrap_err().to_string();
    assert!(e.contains("backwards"), "{e}");
    let real = Database::open_config(DatabaseConfig::in_memory())
        .await
        .unwrap();
    let e = real.advance_time_to(T0).await.unwrap_err().to_string();
    assert!(e.contains("real clock"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_in_one_process_have_separate_metrics() {
    let (one, _) = open_virtual(T0).await;
    let (two, _) = open_virtual(T0 + 5_000).await;
    for (db, flow) in [(&one, "only_in_one"), (&two, "only_in_two")] {
        run(
            db,
            "CREATE TABLE t (k INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
        )
        .await;
        run(
            db,
            &format!("CREATE FLOW {flow} SINK TO s AS SELECT count(*) AS n FROM t"),
        )
        .await;
    }
    let (a, b) = (one.metrics().render(), two.metrics().render());
    assert!(
        a.contains("flow=\"only_in_one\"") && !a.contains("only_in_two"),
        "{a}"
    );
    assert!(
        b.contains("flow=\"only_in_two\"") && !b.contains("only_in_one"),
        "{b}"
    );
    // Each registry is its own: a series added to one is not in the other.
    one.metrics()
        .counter("embedder_events_total", "An embedder's own series.", &[])
        .add(3);
    assert!(one.metrics().render().contains("embedder_events_total 3"));
    assert!(!two.metrics().render().contains("embedder_events_total"));
    // Their clocks are their own too.
    assert_eq!(one.now_ms(), T0);
    assert_eq!(two.now_ms(), T0 + 5_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_databases_can_share_one_sandbox() {
    use sandflow::flow::FlowSettings;
    use sandflow::runtime::{Digest, RuntimeConfig, Sandbox};
    let sandbox = Arc::new(Sandbox::new(RuntimeConfig::default()).unwrap());
    let mut dbs = Vec::new();
    for i in 0..2 {
        let clock = Arc::new(VirtualClock::new(T0));
        let flows = FlowSettings {
            sandbox: Some(sandbox.clone()),
            ..FlowSettings::default()
        };
        let db = Database::open_config(
            DatabaseConfig::in_memory()
                .with_flows(flows)
                .with_virtual_clock(clock),
        )
        .await
        .unwrap();
        run(
            &db,
            "CREATE TABLE t (k INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
        )
        .await;
        run(
            &db,
            "CREATE FLOW f SINK TO s AS SELECT count(*) AS n FROM t",
        )
        .await;
        run(&db, &format!("INSERT INTO t VALUES ({i}, 0), (10, 0)")).await;
        dbs.push(db);
    }
    for db in &dbs {
        db.flush_flow("f").await.unwrap();
        assert_eq!(rows(db, "SELECT n FROM s").await, "2");
    }
    // One engine component in the one registry, compiled once.
    assert!(sandbox.is_registered(&Digest::of(sandflow::engine::component())));
    assert!(
        Arc::strong_count(&sandbox) >= 3,
        "both databases hold the same sandbox"
    );
}

/// `EVAL INTERVAL` takes the place of the server's tick interval when it is
/// shorter: with a server tick interval of 10 s, a flow with `EVAL INTERVAL
/// '2s'` ticks again (in virtual time, where ticks cost nothing) a twentieth
/// of 2 s after its last tick, the one without a twentieth of 10 s after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_interval_bounds_the_tick_interval() {
    use sandflow::flow::FlowSettings;
    let clock = Arc::new(VirtualClock::new(T0 - 60_000));
    let flows = FlowSettings {
        tick_interval: std::time::Duration::from_secs(10),
        ..FlowSettings::default()
    };
    let db = Database::open_config(
        DatabaseConfig::in_memory()
            .with_flows(flows)
            .with_virtual_clock(clock.clone()),
    )
    .await
    .unwrap();
    run(
        &db,
        "CREATE TABLE t (k INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
    )
    .await;
    run(
        &db,
        "CREATE FLOW fast SINK TO fast_out EVAL INTERVAL '2s' AS SELECT count(*) AS n FROM t",
    )
    .await;
    run(
        &db,
        "CREATE FLOW slow SINK TO slow_out AS SELECT count(*) AS n FROM t",
    )
    .await;
    // An idle flow ticks at once.
    db.advance_time_to(T0).await.unwrap();
    run(&db, "INSERT INTO t VALUES (1, 0)").await;
    assert_eq!(rows(&db, "SELECT n FROM fast_out").await, "1");
    assert_eq!(rows(&db, "SELECT n FROM slow_out").await, "1");
    // More input right after: both wait for their next tick.
    db.advance_time_to(T0 + 50).await.unwrap();
    run(&db, "INSERT INTO t VALUES (2, 0)").await;
    db.advance_time_to(T0 + 99).await.unwrap();
    assert_eq!(rows(&db, "SELECT n FROM fast_out").await, "1");
    db.advance_time_to(T0 + 100).await.unwrap();
    assert_eq!(rows(&db, "SELECT n FROM fast_out").await, "2");
    assert_eq!(rows(&db, "SELECT n FROM slow_out").await, "1");
    db.advance_time_to(T0 + 499).await.unwrap();
    assert_eq!(rows(&db, "SELECT n FROM slow_out").await, "1");
    db.advance_time_to(T0 + 500).await.unwrap();
    assert_eq!(rows(&db, "SELECT n FROM slow_out").await, "2");
}

/// Temporal filters: a row is in the sink exactly while its condition on
/// now() holds at the tick time. The flows wake themselves when a row
/// enters or leaves (no write, no flush needed), and under random writes
/// and clock moves every sink equals its query with now() at that time.
#[test]
fn temporal_filters_follow_the_tick_time() {
    on_big_stack(Box::pin(async {
        use rand::{RngExt, SeedableRng};
        let (db, _) = open_virtual(T0).await;
        run(
            &db,
            "CREATE TABLE ev (host STRING, id INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, id))",
        )
        .await;
        let flows = [
            (
                "recent",
                "host, n",
                "SELECT host, count(*) AS n FROM ev WHERE ts > now() - INTERVAL '5 seconds' \
                 GROUP BY host",
            ),
            (
                "window",
                "host, id, ts",
                "SELECT host, id, ts FROM ev \
                 WHERE ts BETWEEN now() - INTERVAL '3 seconds' AND now() AND id % 2 = 0",
            ),
            (
                "due",
                "id, ts",
                "SELECT id, ts FROM ev WHERE now() >= ts + INTERVAL '1 second'",
            ),
        ];
        for (name, _, q) in &flows {
            run(
                &db,
                &format!("CREATE FLOW {name} SINK TO {name}_sink AS {q}"),
            )
            .await;
        }
        let check = |db: Arc<Database>, at: String| async move {
            for (name, cols, q) in &flows {
                let sink = rows(
                    &db,
                    &format!("SELECT {cols} FROM {name}_sink ORDER BY {cols}"),
                )
                .await;
                let want = rows(&db, &format!("SELECT {cols} FROM ({q}) ORDER BY {cols}")).await;
                assert_eq!(sink, want, "{at}: flow {name}");
            }
        };

        // Rows at T0 - 4 s, T0 - 1 s and T0 + 2 s (in the future).
        run(
            &db,
            &format!(
                "INSERT INTO ev VALUES ('a', 2, {}), ('a', 4, {}), ('b', 6, {})",
                T0 - 4_000,
                T0 - 1_000,
                T0 + 2_000
            ),
        )
        .await;
        assert_eq!(
            rows(&db, "SELECT host, n FROM recent_sink ORDER BY host").await,
            "a|2\nb|1"
        );
        // The row of T0 - 4 s leaves at T0 + 1 s, not a millisecond before,
        // by the flow's own wake-up.
        db.advance_time_to(T0 + 999).await.unwrap();
        assert_eq!(
            rows(&db, "SELECT host, n FROM recent_sink ORDER BY host").await,
            "a|2\nb|1"
        );
        db.advance_time_to(T0 + 1_000).await.unwrap();
        assert_eq!(
            rows(&db, "SELECT host, n FROM recent_sink ORDER BY host").await,
            "a|1\nb|1"
        );
        // The future row enters `window` when the clock reaches it.
        let window = "SELECT id FROM window_sink ORDER BY id";
        assert_eq!(rows(&db, window).await, "4");
        db.advance_time_to(T0 + 2_000).await.unwrap();
        assert_eq!(rows(&db, window).await, "4\n6");
        check(db.clone(), "after the scripted part".into()).await;

        // Random writes and clock moves.
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut now = T0 + 2_000;
        for step in 0..40 {
            let mut ran = Vec::new();
            for _ in 0..rng.random_range(1..=3) {
                let sql = if rng.random_range(0..4) == 0 {
                    format!("DELETE FROM ev WHERE id = {}", rng.random_range(0..20))
                } else {
                    format!(
                        "INSERT INTO ev VALUES ('{}', {}, {})",
                        ["a", "b", "c"][rng.random_range(0..3)],
                        rng.random_range(0..20),
                        now + rng.random_range(-8_000..4_000)
                    )
                };
                run(&db, &sql).await;
                ran.push(sql);
            }
            now += rng.random_range(0..2_500);
            db.advance_time_to(now).await.unwrap();
            for (name, _, _) in &flows {
                run(&db, &format!("ADMIN FLUSH_FLOW('{name}')")).await;
            }
            check(
                db.clone(),
                format!("step {step} at T0 + {} ms after {ran:?}", now - T0),
            )
            .await;
        }
    }));
}

/// A join below a temporal filter keeps only the rows inside the window:
/// the filter applies to the joined input, so a row that leaves the window
/// leaves the join's state too, and the state shrinks back as time passes.
#[test]
fn a_temporal_filter_bounds_the_join_state() {
    on_big_stack(Box::pin(async {
        let (db, _) = open_virtual(T0).await;
        run(
            &db,
            "CREATE TABLE m (host STRING, id INT, v DOUBLE, ts TIMESTAMP TIME INDEX, \
             PRIMARY KEY (host, id))",
        )
        .await;
        run(
            &db,
            "CREATE TABLE d (host STRING, region STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
        )
        .await;
        let query =
            "SELECT d.region, count(*) AS n, sum(m.v) AS s FROM m JOIN d ON m.host = d.host \
                     WHERE m.ts > now() - INTERVAL '5 seconds' GROUP BY d.region";
        run(
            &db,
            &format!("CREATE FLOW recent SINK TO recent_sink AS {query}"),
        )
        .await;
        run(&db, "INSERT INTO d VALUES ('a', 'eu', 0), ('b', 'us', 0)").await;
        run(&db, "ADMIN FLUSH_FLOW('recent')").await;
        let empty = state_size(&db, "recent").await;
        for batch in 0..10 {
            let values: Vec<String> = (0..100)
                .map(|i| {
                    format!(
                        "('{}', {}, {i}, {})",
                        ["a", "b"][i % 2],
                        batch * 100 + i,
                        T0 + batch as i64 * 100
                    )
                })
                .collect();
            run(&db, &format!("INSERT INTO m VALUES {}", values.join(", "))).await;
        }
        run(&db, "ADMIN FLUSH_FLOW('recent')").await;
        let sink = "SELECT region, n, s FROM recent_sink ORDER BY region";
        assert_eq!(rows(&db, sink).await, "eu|500|24500.0\nus|500|25000.0");
        let full = state_size(&db, "recent").await;
        assert!(
            full > empty + 1000 * 16,
            "1000 joined rows kept: {empty} -> {full}"
        );
        // Past the window: every row has left the result and the state.
        db.advance_time_to(T0 + 6_000).await.unwrap();
        run(&db, "ADMIN FLUSH_FLOW('recent')").await;
        assert_eq!(rows(&db, sink).await, "");
        assert_eq!(
            rows(&db, &format!("SELECT count(*) FROM ({query})")).await,
            "0"
        );
        let after = state_size(&db, "recent").await;
        assert!(
            after < empty + 1000,
            "the state went back down: {empty} -> {full} -> {after}"
        );
    }));
}

/// A join of windows under EXPIRE AFTER drops the rows of windows older
/// than the tick time minus the expiry, and ignores late rows for them (as
/// aggregates do): the state stays bounded, recent windows stay exact.
#[test]
fn expire_after_drops_the_state_of_a_windowed_join() {
    on_big_stack(Box::pin(async {
        let (db, _) = open_virtual(T0).await;
        for t in ["clicks", "views"] {
            run(
                &db,
                &format!(
                    "CREATE TABLE {t} (host STRING, id INT, ts TIMESTAMP TIME INDEX, \
                     PRIMARY KEY (host, id))"
                ),
            )
            .await;
        }
        run(
            &db,
            "CREATE FLOW pairs SINK TO pairs_sink EXPIRE AFTER '10 s' AS \
             SELECT date_bin(INTERVAL '1 second', c.ts) AS w, count(*) AS n \
             FROM clicks c JOIN views v ON c.host = v.host \
             AND date_bin(INTERVAL '1 second', c.ts) = date_bin(INTERVAL '1 second', v.ts) \
             GROUP BY date_bin(INTERVAL '1 second', c.ts)",
        )
        .await;
        let sink = "SELECT CAST(w AS BIGINT) AS ms, n FROM pairs_sink ORDER BY ms";
        let fill = |at: i64| {
            let c: Vec<String> = (0..200)
                .map(|i| format!("('h{}', {i}, {at})", i % 10))
                .collect();
            let v: Vec<String> = (0..10).map(|i| format!("('h{i}', {i}, {at})")).collect();
            (
                format!("INSERT INTO clicks VALUES {}", c.join(", ")),
                format!("INSERT INTO views VALUES {}", v.join(", ")),
            )
        };
        let (c, v) = fill(T0);
        run(&db, &c).await;
        run(&db, &v).await;
        run(&db, "ADMIN FLUSH_FLOW('pairs')").await;
        assert_eq!(rows(&db, sink).await, format!("{T0}|200"));
        let full = state_size(&db, "pairs").await;
        // 20 s later the window of T0 is past its expiry: its rows go from
        // the join's state, and a late view for it changes nothing.
        db.advance_time_to(T0 + 20_000).await.unwrap();
        run(&db, "ADMIN FLUSH_FLOW('pairs')").await;
        let expired = state_size(&db, "pairs").await;
        assert!(expired * 4 < full, "state {full} -> {expired} after expiry");
        run(&db, &format!("INSERT INTO views VALUES ('h1', 99, {T0})")).await;
        run(&db, "ADMIN FLUSH_FLOW('pairs')").await;
        assert_eq!(
            rows(&db, sink).await,
            format!("{T0}|200"),
            "late row ignored"
        );
        // A recent window joins exactly.
        let (c, v) = fill(T0 + 20_000);
        run(&db, &c).await;
        run(&db, &v).await;
        run(
            &db,
            &format!("INSERT INTO views VALUES ('h1', 98, {})", T0 + 20_000),
        )
        .await;
        run(&db, "ADMIN FLUSH_FLOW('pairs')").await;
        assert_eq!(
            rows(&db, sink).await,
            format!("{T0}|200\n{}|220", T0 + 20_000)
        );
    }));
}
