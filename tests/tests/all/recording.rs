//! Recordings of flows through the library: a flow recorded across inserts,
//! deletes, upserts, time passing (EXPIRE AFTER at work), a crash and a
//! clean restart replays offline, in wasm and natively, to the sink the
//! database has, value for value; a recording with a change taken out does
//! not; the file reads back as written.

use std::sync::Arc;
use std::time::Duration;

use sandflow::flow::recording::{replay, RecordedChange, Recording};
use sandflow::flow::{FlowEngine, FlowSettings};
use sandflow::testing::TestDatabase;

/// 2023-11-14T22:13:20Z.
const T0: i64 = 1_700_000_000_000;

fn ts(ms: i64) -> String {
    format!("{}", T0 + ms)
}

/// Runs the scenario on `engine`; returns the recording and the sink as the
/// database shows it (CSV lines, sorted, header first).
async fn record(engine: FlowEngine) -> (Recording, Vec<String>) {
    let mut t = TestDatabase::with_flows(FlowSettings {
        engine,
        ..FlowSettings::default()
    })
    .await
    .unwrap();
    t.set_time(T0).await.unwrap();
    t.execute(
        "CREATE TABLE ev (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    )
    .await
    .unwrap();
    t.execute(
        "CREATE FLOW per_window SINK TO per_window_sink EXPIRE AFTER '30 seconds' AS \
         SELECT date_bin(INTERVAL '10 seconds', ts) AS w, count(*) AS n, sum(v) AS s, \
         min(v) AS lo, max(v) AS hi, array_agg(v ORDER BY v) AS vs FROM ev GROUP BY w",
    )
    .await
    .unwrap();
    t.execute(&format!(
        "INSERT INTO ev VALUES ('a', 1.5, {}), ('b', 0.1, {})",
        ts(0),
        ts(1)
    ))
    .await
    .unwrap();
    t.advance(Duration::from_secs(1)).await.unwrap();
    // Before the recording: in its start (snapshot and sink).
    let start = t.database().start_recording("per_window").await.unwrap();
    assert_eq!(start.len(), 1);
    for round in 0..12i64 {
        let now = t.now_ms() - T0;
        let host = |i: i64| format!("h{}", (round * 3 + i) % 7);
        // Inserts and upserts (a host's row is replaced: the key is host).
        t.execute(&format!(
            "INSERT INTO ev VALUES ('{}', {}, {}), ('{}', {}, {}), ('{}', 0.1, {})",
            host(0),
            round as f64 * 0.7 + 0.2,
            ts(now),
            host(1),
            -(round as f64) / 3.0,
            ts(now - 500),
            host(2),
            ts(now - 15_000),
        ))
        .await
        .unwrap();
        if round % 3 == 1 {
            t.execute(&format!("DELETE FROM ev WHERE host = '{}'", host(4)))
                .await
                .unwrap();
        }
        t.advance(Duration::from_millis(700 + 900 * (round % 4) as u64))
            .await
            .unwrap();
        if round == 4 {
            // Written but not yet ticked when the process dies.
            t.execute(&format!("INSERT INTO ev VALUES ('z', 9.0, {})", ts(now)))
                .await
                .unwrap();
            t.crash().await.unwrap();
        }
        if round == 8 {
            t.restart().await.unwrap();
        }
        if round == 10 {
            // Long enough for EXPIRE AFTER to drop windows from the state.
            t.advance(Duration::from_secs(45)).await.unwrap();
        }
    }
    t.flush().await.unwrap();
    let rec = t.database().recording("per_window").await.unwrap();
    let mut sink: Vec<String> = t
        .query("SELECT * FROM per_window_sink")
        .await
        .unwrap()
        .into_iter()
        .map(|r| csv_line(&r))
        .collect();
    sink.sort();
    (rec, sink)
}

/// A CSV line as the replay writes one (a value holding a comma, a quote
/// or a line break is quoted, its quotes doubled).
fn csv_line(values: &[String]) -> String {
    values
        .iter()
        .map(|v| match v.contains([',', '"', '\n', '\r']) {
            true => format!("\"{}\"", v.replace('"', "\"\"")),
            false => v.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_flow_replays_offline_to_the_same_sink() {
    let (rec, sink) = record(FlowEngine::Wasm).await;
    assert_eq!(rec.format, "sandflow-recording");
    assert_eq!(rec.version, 1);
    assert!(rec.ticks.len() >= 12, "{} ticks", rec.ticks.len());
    let diffs: Vec<i64> = rec
        .ticks
        .iter()
        .flat_map(|t| t.changes.iter().flat_map(|c| c.diffs.clone()))
        .collect();
    assert!(
        diffs.contains(&-1),
        "deletes and upserts are recorded as -1"
    );
    assert!(!rec.start.sink.is_empty(), "the start holds the sink then");
    assert!(!rec.end.sink.is_empty());
    // The file reads back as written.
    let back = Recording::from_json(&rec.to_json()).unwrap();
    assert_eq!(back, rec);
    let sandbox = Arc::new(
        sandflow::runtime::Sandbox::new(sandflow::runtime::RuntimeConfig::default()).unwrap(),
    );
    let wasm = replay(&back, FlowEngine::Wasm, Some(sandbox.clone()))
        .await
        .unwrap();
    assert!(
        wasm.matches_recording(),
        "replayed in wasm:\n{}\nrecorded:\n{:?}",
        wasm.csv(),
        rec.end.sink
    );
    let native = replay(&back, FlowEngine::Native, None).await.unwrap();
    assert!(
        native.matches_recording(),
        "replayed natively:\n{}",
        native.csv()
    );
    assert_eq!(wasm.csv(), native.csv());
    assert_eq!(wasm.ticks, rec.ticks.len());
    // The replay's CSV is the sink the database shows.
    let lines: Vec<&str> = wasm.csv().lines().skip(1).collect();
    assert_eq!(lines, sink.iter().map(String::as_str).collect::<Vec<_>>());

    // A recording missing one change replays to another sink.
    let mut broken = rec.clone();
    let tick = broken
        .ticks
        .iter_mut()
        .find(|t| !t.changes.is_empty())
        .unwrap();
    let dropped: RecordedChange = tick.changes.remove(0);
    assert!(!dropped.rows.is_empty());
    let off = replay(&broken, FlowEngine::Native, None).await.unwrap();
    assert!(!off.matches_recording(), "a missing change must show");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recordings_are_started_read_and_stopped_with_clear_errors() {
    let t = TestDatabase::with_flows(FlowSettings {
        engine: FlowEngine::Native,
        ..FlowSettings::default()
    })
    .await
    .unwrap();
    t.execute("CREATE TABLE m (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))")
        .await
        .unwrap();
    t.execute("CREATE FLOW f SINK TO f_sink AS SELECT k, sum(v) AS total FROM m GROUP BY k")
        .await
        .unwrap();
    let db = t.database();
    let e = db.recording("f").await.unwrap_err().to_string();
    assert!(e.contains("not being recorded"), "{e}");
    let e = db.start_recording("nope").await.unwrap_err().to_string();
    assert!(e.contains("does not exist"), "{e}");
    assert!(!db.stop_recording("f").await.unwrap());
    db.start_recording("f").await.unwrap();
    t.execute("INSERT INTO m VALUES ('a', 2, 0), ('b', 3, 0)")
        .await
        .unwrap();
    let rec = db.recording("f").await.unwrap();
    assert_eq!(rec.end.sink.len(), 2);
    assert!(rec.start.sink.is_empty());
    // Starting again starts anew: the start has the sink as it is now.
    db.start_recording("f").await.unwrap();
    let again = db.recording("f").await.unwrap();
    assert_eq!(again.start.sink.len(), 2);
    assert!(
        again.ticks.iter().all(|t| t.changes.is_empty()),
        "{:?}",
        again.ticks
    );
    assert!(db.stop_recording("f").await.unwrap());
    let e = db.recording("f").await.unwrap_err().to_string();
    assert!(e.contains("not being recorded"), "{e}");
}

/// The real server, killed with SIGKILL at random moments while a writer
/// inserts, upserts and deletes: `sandflow record` fetches the flow's
/// recording over HTTP, `sandflow replay` runs it offline in wasm and
/// natively, and the sink equals the server's (the recording's end, and the
/// server's sink read through psql).
#[test]
fn a_flow_recorded_across_kill9_rounds_replays_to_the_servers_sink() {
    use rand::{RngExt, SeedableRng};
    use sandflow_tests::harness::{server_bin, temp_data_dir, Options, Server};
    use std::process::Command;
    use std::sync::atomic::{AtomicBool, Ordering};

    let seed: u64 = rand::random();
    eprintln!("seed {seed}");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = temp_data_dir();
    let opts = Options {
        args: vec!["--flow-tick-interval".into(), "20ms".into()],
        ..Options::default()
    };
    let mut s = Server::start_with(dir.clone(), opts.clone());
    s.sql(
        "CREATE TABLE ev (id BIGINT, host STRING, bytes DOUBLE, ts TIMESTAMP TIME INDEX, \
         PRIMARY KEY (id))",
    );
    s.sql(
        "CREATE FLOW host_minute SINK TO host_minute_sink AS SELECT host, \
         date_bin(INTERVAL '1 minute', ts) AS minute, count(*) AS hits, sum(bytes) AS total, \
         min(bytes) AS lo, max(bytes) AS hi FROM ev GROUP BY host, minute",
    );
    s.sql("INSERT INTO ev VALUES (1, 'a', 1.5, 0), (2, 'b', 2.25, 1000)");
    s.sql("ADMIN FLUSH_FLOW('host_minute')");
    let record = |s: &Server, args: &[&str]| {
        let out = Command::new(server_bin())
            .arg("record")
            .args(["--http-addr", &format!("127.0.0.1:{}", s.http_port)])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = record(&s, &["--start", "host_minute"]);
    assert!(ok, "record --start: {err}");
    let (ok, _, err) = record(&s, &["--start", "no_such_flow"]);
    assert!(!ok && err.contains("does not exist"), "{err}");

    let mut next_id = 10i64;
    for round in 0..4 {
        let stop = Arc::new(AtomicBool::new(false));
        let port = s.pg_port;
        let start_id = next_id;
        let writer_seed: u64 = rng.random();
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(writer_seed);
                let mut id = start_id;
                while !stop.load(Ordering::Relaxed) {
                    let sql = match rng.random_range(0..4) {
                        0 => format!(
                            "DELETE FROM ev WHERE id = {}",
                            rng.random_range(1..id.max(2))
                        ),
                        1 => format!(
                            "INSERT INTO ev VALUES ({}, 'h{}', {}, {})",
                            rng.random_range(1..id.max(2)),
                            rng.random_range(0..3),
                            rng.random_range(0..1000) as f64 / 8.0,
                            rng.random_range(0..180_000)
                        ),
                        _ => {
                            id += 3;
                            format!(
                                "INSERT INTO ev VALUES ({}, 'h{}', {}, {}), ({}, 'h{}', 0.1, {})",
                                id,
                                rng.random_range(0..3),
                                rng.random_range(0..1000) as f64 / 4.0,
                                rng.random_range(0..180_000),
                                id + 1,
                                rng.random_range(0..3),
                                rng.random_range(0..180_000)
                            )
                        }
                    };
                    let out = Command::new("psql")
                        .args(["-X", "-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                        .args(["-U", "sandflow", "-d", "public", "-c", &sql])
                        .env("PGCONNECT_TIMEOUT", "5")
                        .output();
                    match out {
                        Ok(o) if o.status.success() => {}
                        _ => break,
                    }
                }
                id
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(
            rng.random_range(300..1200),
        ));
        if round == 3 {
            stop.store(true, Ordering::Relaxed);
        }
        s.kill9();
        stop.store(true, Ordering::Relaxed);
        next_id = writer.join().unwrap() + 10;
        s = Server::start_with(dir.clone(), opts.clone());
    }
    s.sql("ADMIN FLUSH_FLOW('host_minute')");
    let file = dir.path().join("host_minute.json");
    let (ok, _, err) = record(&s, &["-o", file.to_str().unwrap(), "host_minute"]);
    assert!(ok, "record: {err}");
    // What the server's sink holds, through psql.
    let server_rows = s.sql("SELECT count(*), sum(hits), sum(total) FROM host_minute_sink");
    let source_rows = s.sql("SELECT count(*), sum(bytes) FROM ev");
    let rec = Recording::from_json(&std::fs::read(&file).unwrap()).unwrap();
    assert!(
        rec.ticks.iter().any(|t| !t.changes.is_empty()),
        "the recording saw changes"
    );
    drop(s);

    let replay = |engine: &str, expect: Option<&std::path::Path>| {
        let mut cmd = Command::new(server_bin());
        cmd.args(["replay", "--engine", engine]);
        if let Some(e) = expect {
            cmd.arg("--expect-sink").arg(e);
        }
        let out = cmd.arg(&file).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, csv, err) = replay("wasm", None);
    assert_eq!(code, Some(0), "replay in wasm: {err}\n{csv}");
    assert!(err.contains("equals the recording's end"), "{err}");
    // The replayed sink is the server's: as many groups, the same sums.
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "host,minute,hits,total,lo,hi,update_at");
    let (mut hits, mut total) = (0i64, 0f64);
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        hits += cells[2].parse::<i64>().unwrap();
        total += cells[3].parse::<f64>().unwrap();
    }
    let want: Vec<&str> = server_rows.split('|').collect();
    assert_eq!(
        lines.len() - 1,
        want[0].parse::<usize>().unwrap(),
        "{server_rows}"
    );
    assert_eq!(hits, want[1].parse::<i64>().unwrap(), "{server_rows}");
    let source: Vec<&str> = source_rows.split('|').collect();
    assert_eq!(hits, source[0].parse::<i64>().unwrap(), "{source_rows}");
    assert!(
        (total - want[2].parse::<f64>().unwrap()).abs() < 1e-6,
        "{server_rows}"
    );

    // Natively, against the wasm replay's sink as the expected file.
    let expected = dir.path().join("expected.csv");
    std::fs::write(&expected, &csv).unwrap();
    let (code, native, err) = replay("native", Some(&expected));
    assert_eq!(code, Some(0), "replay natively: {err}");
    assert_eq!(native, csv);
    assert!(err.contains("the sink equals"), "{err}");
    // A wrong expectation fails with a diff.
    let wrong = dir.path().join("wrong.csv");
    std::fs::write(&wrong, csv.replacen(",1,", ",99,", 1) + "x,y\n").unwrap();
    let (code, _, err) = replay("native", Some(&wrong));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("differs from") && err.contains("+++ replayed"),
        "{err}"
    );
    // Not a recording.
    let (code, _, err) = {
        let out = Command::new(server_bin())
            .args(["replay"])
            .arg(&expected)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("not a sandflow recording"), "{err}");
}
