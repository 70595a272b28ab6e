//! The real guest component driven through the host runtime, checked against
//! DataFusion running the same SQL over the current source contents, against
//! the same engine running natively, and across snapshot/restore.

use rand::RngExt;
use sandflow_engine::types::{DataType, Field, SourceSchema};
use sandflow_tests::engine::{
    apply, drain, multiset, oracle, plan, Engine, Multiset, Native, Stream, Wasm,
};

fn sources() -> Vec<SourceSchema> {
    vec![
        SourceSchema {
            name: "t".into(),
            fields: vec![
                Field::new("k", DataType::Int64, true),
                Field::new("g", DataType::Utf8, true),
                Field::new("v", DataType::Float64, true),
                Field::new("n", DataType::Int32, true),
                Field::new("u", DataType::UInt32, false),
                Field::new("b", DataType::Boolean, true),
                Field::new("ts", DataType::TimestampMillisecond, false),
            ],
        },
        SourceSchema {
            name: "s".into(),
            fields: vec![
                Field::new("host", DataType::Utf8, false),
                Field::new("bytes", DataType::Float64, true),
                Field::new("status", DataType::Int16, false),
                Field::new("ts", DataType::TimestampNanosecond, false),
            ],
        },
    ]
}

const QUERIES: &[&str] = &[
    "SELECT k, count(*) AS c, sum(v) AS s FROM t GROUP BY k",
    "SELECT g, count(v) AS c, avg(v) AS a, min(v) AS lo, max(v) AS hi FROM t GROUP BY g",
    "SELECT g, count(DISTINCT k) AS d FROM t GROUP BY g",
    "SELECT date_bin(INTERVAL '1 minute', ts) AS w, count(*) AS c, sum(n) AS s FROM t GROUP BY w",
    "SELECT date_trunc('minute', ts) AS m, max(v) AS hi, min(n) AS lo FROM t GROUP BY m",
    "SELECT k % 3 AS m, sum(CASE WHEN b THEN 1 ELSE 0 END) AS yes FROM t GROUP BY k % 3 HAVING count(*) > 2",
    "SELECT k, g, v * 2 + 1 AS w FROM t WHERE (v > 0 AND g LIKE 'a%') OR k IN (1, 2, 3)",
    "SELECT upper(g) || '-x' AS s, length(g) AS l, lower(g) AS lg, abs(k) AS a, round(v) AS r, trunc(v) AS tr, \
     floor(v) AS f, ceil(v) AS c, CAST(k AS DOUBLE) AS kd, k IS NULL AS kn FROM t WHERE g IS NOT NULL",
    "SELECT count(*) AS c, sum(u) AS su, min(g) AS lo, max(g) AS hi FROM t",
    "SELECT g, min(ts) AS first, max(ts) AS last FROM t GROUP BY g HAVING max(v) > 10",
    "SELECT g, array_agg(v ORDER BY v) AS vs, array_agg(DISTINCT k ORDER BY k DESC) AS ks, \
     array_agg(n ORDER BY n DESC NULLS LAST) AS ns FROM t GROUP BY g",
    "SELECT host, status, count(*) AS hits, sum(bytes) AS total, date_bin(INTERVAL '1 minute', ts) AS minute \
     FROM s GROUP BY host, status, minute",
    "SELECT status / 100 AS class, avg(bytes) AS mean FROM s WHERE status <> 404 AND NOT (host = 'beta') GROUP BY status / 100",
    // Joins of t and s (t.g and s.host draw from the same words), both
    // sides changing: inner with GROUP BY, outer with a condition beside
    // the equality, two keys of different integer types, a self-join,
    // semi and anti joins, UNION ALL and INTERSECT.
    "SELECT t.g, s.status, count(*) AS c, sum(s.bytes) AS b FROM t JOIN s ON t.g = s.host GROUP BY t.g, s.status",
    "SELECT t.k, t.g, s.status FROM t LEFT JOIN s ON t.g = s.host AND s.bytes > t.v",
    "SELECT s.host, count(t.k) AS n FROM t RIGHT JOIN s ON t.g = s.host AND t.n = s.status GROUP BY s.host",
    "SELECT t.g AS tg, s.host AS sh, count(*) AS c FROM t FULL JOIN s ON t.g = s.host GROUP BY t.g, s.host",
    "SELECT a.g, count(*) AS c FROM t a JOIN t b ON a.g = b.g AND a.k < b.k GROUP BY a.g",
    "SELECT k, g FROM t WHERE g IN (SELECT host FROM s WHERE status > 300)",
    "SELECT host, count(*) AS c FROM s WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.g = s.host) GROUP BY host",
    "SELECT g AS x FROM t UNION ALL SELECT host FROM s",
    "SELECT g FROM t INTERSECT SELECT host FROM s",
];

fn check_stream(sql: &str, seed: u64, steps: usize) {
    let srcs = sources();
    let plan = plan(sql, &srcs);
    let mut stream = Stream::new(seed, srcs.clone());
    let mut native =
        Native::create(&plan, &srcs).unwrap_or_else(|e| panic!("native create {sql}: {e}"));
    let mut wasm = Wasm::create(&plan, &srcs);
    assert_eq!(
        native.output_schema(),
        wasm.output_schema(),
        "{sql}: output schemas differ"
    );
    let mut sink: Vec<(Vec<sandflow_engine::types::Value>, i64)> = Vec::new();
    for step_no in 0..steps {
        let now = step_no as i64 * 1000;
        let step = stream.step(12);
        apply(&mut native, &srcs, &step, now);
        apply(&mut wasm, &srcs, &step, now);
        let out_native = drain(&mut native, now);
        let out_wasm = drain(&mut wasm, now);
        assert_eq!(
            out_native, out_wasm,
            "{sql} seed {seed} step {step_no}: wasm and native outputs differ"
        );
        // Consolidated: every row appears at most once per tick, never with diff 0.
        let keys: std::collections::BTreeSet<String> = out_wasm
            .iter()
            .map(|(r, _)| sandflow_tests::engine::row_key(r))
            .collect();
        assert_eq!(
            keys.len(),
            out_wasm.len(),
            "{sql}: a row appears twice in one tick's output"
        );
        assert!(
            out_wasm.iter().all(|(_, d)| *d != 0),
            "{sql}: output holds a zero diff"
        );
        sink.extend(out_wasm);
        let got: Multiset = multiset(sink.clone());
        for (row, n) in got.values() {
            assert!(
                *n > 0,
                "{sql} seed {seed} step {step_no}: sink holds a negative count for {row:?}"
            );
        }
        let want = multiset(
            oracle(sql, &srcs, &stream.contents)
                .into_iter()
                .map(|r| (r, 1)),
        );
        if got != want {
            let missing: Vec<_> = want
                .iter()
                .filter(|(k, v)| got.get(*k) != Some(v))
                .map(|(_, v)| v)
                .collect();
            let extra: Vec<_> = got
                .iter()
                .filter(|(k, v)| want.get(*k) != Some(v))
                .map(|(_, v)| v)
                .collect();
            panic!("{sql} seed {seed} step {step_no}: sink differs from DataFusion\n missing {missing:?}\n extra {extra:?}");
        }
    }
}

#[test]
fn every_query_matches_datafusion_natively_and_in_wasm() {
    for sql in QUERIES {
        for seed in 0..4 {
            check_stream(sql, seed, 25);
        }
    }
}

#[test]
fn snapshot_restore_continues_identically_in_wasm() {
    let srcs = sources();
    for (qi, sql) in QUERIES.iter().enumerate() {
        let plan = plan(sql, &srcs);
        let mut stream = Stream::new(100 + qi as u64, srcs.clone());
        let mut original = Wasm::create(&plan, &srcs);
        let cut = stream.rng.random_range(3..15);
        for step_no in 0..cut {
            let now = step_no as i64 * 1000;
            let step = stream.step(10);
            apply(&mut original, &srcs, &step, now);
            // Leave the last step's rows pending (not ticked) so they are in the snapshot too.
            if step_no + 1 < cut {
                drain(&mut original, now);
            }
        }
        let state = original.snapshot();
        let mut restored = Wasm::restore(&state);
        let mut native = Native::restore(&state);
        assert_eq!(
            restored.snapshot(),
            state,
            "{sql}: snapshot of a restored flow differs"
        );
        for step_no in cut..cut + 10 {
            let now = step_no as i64 * 1000;
            let step = stream.step(10);
            apply(&mut original, &srcs, &step, now);
            apply(&mut restored, &srcs, &step, now);
            apply(&mut native, &srcs, &step, now);
            let a = drain(&mut original, now);
            let b = drain(&mut restored, now);
            let c = drain(&mut native, now);
            assert_eq!(a, b, "{sql} step {step_no}: restored flow diverged");
            assert_eq!(a, c, "{sql} step {step_no}: native restore diverged");
        }
    }
}

#[test]
fn unsupported_plans_fail_at_create_with_a_named_construct() {
    let srcs = sources();
    let cases = [
        ("SELECT k, row_number() OVER (ORDER BY ts) FROM t", "window"),
        (
            "SELECT t.k FROM t JOIN s ON t.g > s.host",
            "join without an equality",
        ),
    ];
    for (sql, word) in cases {
        let plan = plan(sql, &srcs);
        let err = sandflow_tests::engine::wasm_runtime()
            .create_flow(&plan, &srcs, &[], sandflow_tests::engine::test_limits())
            .err()
            .unwrap_or_else(|| panic!("{sql} was accepted"));
        assert!(
            err.to_string().to_lowercase().contains(word),
            "{sql}: error {err} does not name {word}"
        );
    }
}

#[test]
fn garbage_plan_bytes_are_a_clear_error() {
    let err = sandflow_tests::engine::wasm_runtime()
        .create_flow(
            b"\xff\x00not a plan",
            &sources(),
            &[],
            sandflow_tests::engine::test_limits(),
        )
        .err()
        .expect("garbage accepted");
    let text = err.to_string();
    assert!(!text.is_empty() && !text.contains("trapped"), "{text}");
}
