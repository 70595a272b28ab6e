//! Many flows on one server: creates `SANDFLOW_BENCH_FLOWS` flows (default
//! 10,000) over HTTP on the real binary, reports the time per CREATE FLOW and
//! the server's resident memory per flow, awake and asleep.
//!
//! Each flow is `SELECT host, count(*) AS n FROM src GROUP BY host` with a
//! sink of its own. The server runs with `--flow-sleep-after 1s`: while the
//! flows are being created most of them are asleep already; the report
//! measures (1) the resident memory right after creation, (2) once every flow
//! is asleep, and (3) the cost of a flow kept awake, from a separate run of
//! `SANDFLOW_BENCH_AWAKE` flows (default 500) with sleeping off.
//!
//! `make bench` runs it; `SANDFLOW_BIN` measures another build of the server.

use std::time::{Duration, Instant};

use sandflow_tests::harness::{poll_until, temp_data_dir, Options, Server};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// (resident bytes, threads) of a process.
fn rss_and_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:") * 1024, field("Threads:"))
}

fn sql_ok(s: &Server, sql: &str) {
    let (status, v) = s.http_sql(sql);
    assert_eq!(status, 200, "{sql}: {v}");
}

fn count(s: &Server, sql: &str) -> u64 {
    let (status, v) = s.http_sql(sql);
    assert_eq!(status, 200, "{sql}: {v}");
    v["output"][0]["records"]["rows"][0][0]
        .as_u64()
        .unwrap_or(0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Creates `n` flows; returns the time each CREATE FLOW took.
fn create_flows(s: &Server, n: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let sql = format!(
            "CREATE FLOW f{i} SINK TO sink{i} AS SELECT host, count(*) AS n FROM src GROUP BY host"
        );
        let started = Instant::now();
        sql_ok(s, &sql);
        times.push(started.elapsed());
        if (i + 1) % 1000 == 0 {
            eprintln!("  {} flows created", i + 1);
        }
    }
    times
}

fn server(sleep_after: &str, max_flows: usize) -> Server {
    Server::start_with(
        temp_data_dir(),
        Options {
            args: vec![
                "--flow-sleep-after".into(),
                sleep_after.into(),
                "--max-flows".into(),
                max_flows.to_string(),
            ],
            ..Default::default()
        },
    )
}

fn setup(s: &Server) {
    sql_ok(
        s,
        "CREATE TABLE src (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    );
    sql_ok(s, "INSERT INTO src VALUES ('a', 1.0, 0), ('b', 2.0, 0)");
    // The first flow loads the compiled guest; it is not counted.
    sql_ok(
        s,
        "CREATE FLOW warmup SINK TO warmup_sink AS SELECT host, count(*) AS n FROM src GROUP BY host",
    );
}

fn main() {
    let n = env_usize("SANDFLOW_BENCH_FLOWS", 10_000);
    let awake_n = env_usize("SANDFLOW_BENCH_AWAKE", 500);
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);

    // Flows that stay awake: the cost of a live sandbox.
    let s = server("0", awake_n + 10);
    setup(&s);
    let (base_rss, base_threads) = rss_and_threads(s.pid());
    create_flows(&s, awake_n);
    let (rss, threads) = rss_and_threads(s.pid());
    let awake_per_flow = rss.saturating_sub(base_rss) / awake_n.max(1) as u64;
    drop(s);

    // Many flows that fall asleep.
    let s = server("1s", n + 10);
    setup(&s);
    let (base_rss_2, _) = rss_and_threads(s.pid());
    let started = Instant::now();
    let mut times = create_flows(&s, n);
    let total = started.elapsed();
    let (rss_created, _) = rss_and_threads(s.pid());
    let all_asleep = poll_until(Duration::from_secs(600), || {
        count(
            &s,
            "SELECT count(*) FROM information_schema.flows WHERE NOT asleep",
        ) == 0
    });
    std::thread::sleep(Duration::from_secs(2));
    let (rss_asleep, threads_asleep) = rss_and_threads(s.pid());
    times.sort();
    let mean = total / n.max(1) as u32;
    let asleep_per_flow = rss_asleep.saturating_sub(base_rss_2) / n.max(1) as u64;

    println!("flows_scale: {n} flows created on one server");
    println!(
        "  CREATE FLOW: mean {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({:.1} s in all)",
        mean.as_secs_f64() * 1e3,
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        percentile(&times, 1.0).as_secs_f64() * 1e3,
        total.as_secs_f64()
    );
    println!(
        "  resident memory: {:.0} MiB before, {:.0} MiB right after creating, {:.0} MiB with every flow asleep{}",
        mib(base_rss_2),
        mib(rss_created),
        mib(rss_asleep),
        if all_asleep { "" } else { " (not all asleep!)" }
    );
    println!(
        "  per idle (asleep) flow: {:.1} KiB resident; threads {threads_asleep}",
        asleep_per_flow as f64 / 1024.0
    );
    println!(
        "  per awake flow ({awake_n} flows, sleeping off): {:.1} KiB resident; threads {base_threads} -> {threads}",
        awake_per_flow as f64 / 1024.0
    );
    assert!(all_asleep, "not every flow fell asleep");
    assert_eq!(
        count(&s, "SELECT count(*) FROM information_schema.flows"),
        n as u64 + 1
    );
}
