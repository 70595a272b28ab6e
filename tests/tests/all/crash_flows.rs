//! Crash recovery of flows, end to end: the real server ingests through
//! PostgreSQL (simple and extended query) and HTTP while four flows tick on
//! their own every 20 ms, and is killed with SIGKILL at a random moment,
//! round after round (one round stops it cleanly with SIGTERM instead).
//! After every restart:
//! * every flow is `running` in `information_schema.flows`;
//! * every acknowledged source row is present exactly once with the values
//!   of its last acknowledged write, and no acknowledged delete came back
//!   (checked for the ids whose every statement was acknowledged; the one
//!   statement in flight at the kill may or may not have been applied);
//! * after `ADMIN FLUSH_FLOW` of every flow (the chained one last), every
//!   sink equals its query run over the sources: nothing missed, nothing
//!   counted twice, no stale row.
//!
//! Rounds: 12 by default, `SANDFLOW_CRASH_ROUNDS=N` for more. Seed: random
//! and printed; `SANDFLOW_CRASH_SEED=S` repeats one (the kill moments still
//! depend on timing). A failure names the seed and the round and shows the
//! logs of the killed run and of the restarted one. To look at some flows
//! alone, `SANDFLOW_CRASH_FLOWS=host_minute,minute_total` creates and checks
//! only those (all four by default). `SANDFLOW_TEST_KEEP_DATA=1` leaves the
//! data directory on disk to look at what was stored.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use postgres::{Client, NoTls, SimpleQueryMessage};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sandflow_tests::harness::{http_request, temp_data_dir, url_encode, Options, Server};

const EV: &str = "CREATE TABLE ev (id BIGINT, host STRING, status INT, bytes DOUBLE, \
                  ts TIMESTAMP TIME INDEX, PRIMARY KEY (id))";

/// A flow under test. `oracle` is a query over the sources (`ev` only)
/// whose result the sink must hold; `columns` are the query's output
/// columns (all aliased, so they are the sink's column names).
struct Flow {
    name: &'static str,
    sink: &'static str,
    columns: &'static str,
    order: &'static str,
    query: &'static str,
    oracle: &'static str,
}

/// Per host and minute: count, sum, min, max.
const HOST_MINUTE_QUERY: &str = "SELECT host, date_bin(INTERVAL '1 minute', ts) AS minute, \
     count(*) AS hits, sum(bytes) AS total, min(bytes) AS lo, max(bytes) AS hi \
     FROM ev GROUP BY host, minute";

/// Per status and minute with HAVING: groups cross the threshold both ways.
const STATUS_MINUTE_QUERY: &str = "SELECT status, date_bin(INTERVAL '1 minute', ts) AS minute, \
     count(*) AS hits, sum(bytes) AS total FROM ev GROUP BY status, minute HAVING count(*) > 3";

/// Filter only: the sink mirrors the matching rows.
const ERRORS_QUERY: &str = "SELECT id, host, status, bytes, ts FROM ev WHERE status >= 500";

/// Chained: reads `host_minute`'s sink.
const MINUTE_TOTAL_QUERY: &str = "SELECT minute, sum(hits) AS hits, sum(total) AS total, \
     count(*) AS hosts FROM host_minute_sink GROUP BY minute";

/// `MINUTE_TOTAL_QUERY` computed from `ev` (the two levels at once).
const MINUTE_TOTAL_ORACLE: &str = "SELECT minute, sum(hits) AS hits, sum(total) AS total, \
     count(*) AS hosts FROM (SELECT host, date_bin(INTERVAL '1 minute', ts) AS minute, \
     count(*) AS hits, sum(bytes) AS total FROM ev GROUP BY host, minute) GROUP BY minute";

/// In dependency order: flushing them in this order flushes a chain fully.
const FLOWS: [Flow; 4] = [
    Flow {
        name: "host_minute",
        sink: "host_minute_sink",
        columns: "host, minute, hits, total, lo, hi",
        order: "host, minute",
        query: HOST_MINUTE_QUERY,
        oracle: HOST_MINUTE_QUERY,
    },
    Flow {
        name: "status_minute",
        sink: "status_minute_sink",
        columns: "status, minute, hits, total",
        order: "status, minute",
        query: STATUS_MINUTE_QUERY,
        oracle: STATUS_MINUTE_QUERY,
    },
    Flow {
        name: "errors",
        sink: "errors_sink",
        columns: "id, host, status, bytes, ts",
        order: "id",
        query: ERRORS_QUERY,
        oracle: ERRORS_QUERY,
    },
    Flow {
        name: "minute_total",
        sink: "minute_total_sink",
        columns: "minute, hits, total, hosts",
        order: "minute",
        query: MINUTE_TOTAL_QUERY,
        oracle: MINUTE_TOTAL_ORACLE,
    },
];

/// The flows of this run: `$SANDFLOW_CRASH_FLOWS` (names, comma-separated)
/// or all of them, in dependency order.
fn selected_flows() -> Vec<&'static Flow> {
    let Ok(names) = std::env::var("SANDFLOW_CRASH_FLOWS") else {
        return FLOWS.iter().collect();
    };
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let all: Vec<&str> = FLOWS.iter().map(|f| f.name).collect();
    for n in &names {
        assert!(
            all.contains(n),
            "SANDFLOW_CRASH_FLOWS: no flow {n:?} in {all:?}"
        );
    }
    assert!(
        !names.contains(&FLOWS[3].name) || names.contains(&FLOWS[0].name),
        "SANDFLOW_CRASH_FLOWS: {} reads the sink of {}",
        FLOWS[3].name,
        FLOWS[0].name
    );
    FLOWS.iter().filter(|f| names.contains(&f.name)).collect()
}

const HOSTS: [&str; 5] = ["web-1", "web-2", "db-1", "cache", "edge"];
/// Weighted: 200 is common, the rest rarer (groups near the HAVING bound).
const STATUSES: [i32; 18] = [
    200, 200, 200, 200, 200, 200, 200, 201, 204, 301, 304, 404, 404, 429, 500, 500, 502, 503,
];
/// 2024-01-01T00:00:00Z in ms; every row falls in the next 30 minutes.
const BASE_MS: i64 = 1_704_067_200_000;
const SPAN_MS: i64 = 30 * 60 * 1000;

/// The time index of row `id`. It is a function of the id, so that a
/// rewrite of the id (same primary key and time) replaces the row and an
/// id is stored at most once.
fn ts_of(id: i64) -> i64 {
    let h = (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 24;
    BASE_MS + (h % SPAN_MS as u64) as i64
}

/// `'2024-01-01T00:MM:SS'` for a whole-second time in ms.
fn ts_literal(ms: i64) -> String {
    let secs = (ms - BASE_MS) / 1000;
    format!(
        "'2024-01-01T{:02}:{:02}:{:02}'",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    )
}

#[derive(Debug, Clone, PartialEq)]
struct Row {
    host: String,
    status: i32,
    /// Multiples of 0.25 (or NULL): sums are exact in any order.
    bytes: Option<f64>,
}

/// One statement the writer sends and the ids it touches.
enum Stmt {
    /// INSERT of new ids and/or replacing upserts of existing ones.
    Write(Vec<(i64, Row)>),
    /// DELETE ... WHERE `pred`; `ids` are the issued ids it matches.
    Delete { pred: String, ids: Vec<i64> },
}

impl Stmt {
    fn sql(&self) -> String {
        match self {
            Stmt::Write(rows) => {
                let values: Vec<String> = rows
                    .iter()
                    .map(|(id, r)| {
                        let bytes = r.bytes.map_or("NULL".to_string(), |b| format!("{b}"));
                        format!(
                            "({id}, '{}', {}, {bytes}, {})",
                            r.host,
                            r.status,
                            ts_of(*id)
                        )
                    })
                    .collect();
                format!(
                    "INSERT INTO ev (id, host, status, bytes, ts) VALUES {}",
                    values.join(", ")
                )
            }
            Stmt::Delete { pred, .. } => format!("DELETE FROM ev WHERE {pred}"),
        }
    }

    fn ids(&self) -> Vec<i64> {
        match self {
            Stmt::Write(rows) => rows.iter().map(|(id, _)| *id).collect(),
            Stmt::Delete { ids, .. } => ids.clone(),
        }
    }
}

/// What the source table must hold according to the acknowledged
/// statements.
#[derive(Default)]
struct Model {
    /// Every id ever sent (`0..next_id`): its row, or `None` when absent.
    rows: BTreeMap<i64, Option<Row>>,
    /// Ids touched by a statement whose fate is unknown (sent, never
    /// acknowledged): their state is only known after the next restart.
    uncertain: BTreeSet<i64>,
    next_id: i64,
}

fn random_row(rng: &mut StdRng) -> Row {
    Row {
        host: HOSTS[rng.random_range(0..HOSTS.len())].to_string(),
        status: STATUSES[rng.random_range(0..STATUSES.len())],
        bytes: if rng.random_range(0..20) == 0 {
            None
        } else {
            Some(f64::from(rng.random_range(0..40_000u32)) / 4.0)
        },
    }
}

impl Model {
    fn present(&self) -> Vec<i64> {
        self.rows
            .iter()
            .filter(|(_, r)| r.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    fn new_rows(&mut self, rng: &mut StdRng, n: usize) -> Vec<(i64, Row)> {
        (0..n)
            .map(|_| {
                let id = self.next_id;
                self.next_id += 1;
                self.rows.entry(id).or_insert(None);
                (id, random_row(rng))
            })
            .collect()
    }

    /// A random next statement: inserts of new ids, upserts of existing
    /// ones (with some new ids in the same statement), deletes by id list,
    /// id range or time range.
    fn next_statement(&mut self, rng: &mut StdRng) -> Stmt {
        let present = self.present();
        let r = rng.random_range(0..100);
        if present.len() < 30 || r < 45 {
            let n = rng.random_range(1..=20);
            return Stmt::Write(self.new_rows(rng, n));
        }
        if r < 75 {
            let n = rng.random_range(1..=10);
            let mut ids: BTreeSet<i64> = BTreeSet::new();
            for _ in 0..n {
                ids.insert(present[rng.random_range(0..present.len())]);
            }
            let mut rows: Vec<(i64, Row)> =
                ids.into_iter().map(|id| (id, random_row(rng))).collect();
            if rng.random_range(0..3) == 0 {
                let n = rng.random_range(1..=3);
                rows.extend(self.new_rows(rng, n));
            }
            return Stmt::Write(rows);
        }
        let d = rng.random_range(0..100);
        if d < 50 {
            let n = rng.random_range(1..=8);
            let ids: BTreeSet<i64> = (0..n)
                .map(|_| present[rng.random_range(0..present.len())])
                .collect();
            let list: Vec<String> = ids.iter().map(i64::to_string).collect();
            Stmt::Delete {
                pred: format!("id IN ({})", list.join(", ")),
                ids: ids.into_iter().collect(),
            }
        } else if d < 85 {
            let from = present[rng.random_range(0..present.len())];
            let to = from + rng.random_range(1..=20);
            Stmt::Delete {
                pred: format!("id >= {from} AND id < {to}"),
                ids: self.rows.range(from..to).map(|(id, _)| *id).collect(),
            }
        } else {
            let from = BASE_MS + rng.random_range(0..SPAN_MS / 1000) * 1000;
            let to = from + rng.random_range(5..=90) * 1000;
            Stmt::Delete {
                pred: format!("ts >= {} AND ts < {}", ts_literal(from), ts_literal(to)),
                ids: self
                    .rows
                    .keys()
                    .copied()
                    .filter(|id| (from..to).contains(&ts_of(*id)))
                    .collect(),
            }
        }
    }

    /// The number of rows an acknowledged `stmt` must report, when every id
    /// it touches is certain.
    fn expected_count(&self, stmt: &Stmt) -> Option<u64> {
        let ids = stmt.ids();
        if ids.iter().any(|id| self.uncertain.contains(id)) {
            return None;
        }
        match stmt {
            Stmt::Write(rows) => Some(rows.len() as u64),
            Stmt::Delete { ids, .. } => Some(
                ids.iter()
                    .filter(|id| matches!(self.rows.get(id), Some(Some(_))))
                    .count() as u64,
            ),
        }
    }

    fn apply(&mut self, stmt: &Stmt) {
        match stmt {
            Stmt::Write(rows) => {
                for (id, row) in rows {
                    self.rows.insert(*id, Some(row.clone()));
                }
            }
            Stmt::Delete { ids, .. } => {
                for id in ids {
                    self.rows.insert(*id, None);
                }
            }
        }
    }
}

/// How a statement was sent.
#[derive(Debug, Clone, Copy)]
enum Door {
    PgSimple,
    PgExtended,
    Http,
}

/// Why a statement was not acknowledged.
enum NotAcked {
    /// The server answered with an error.
    Rejected(String),
    /// No answer (the connection failed): applied or not, unknown.
    Lost(String),
}

fn pg_connect(port: u16) -> Result<Client, postgres::Error> {
    Client::connect(
        &format!("host=127.0.0.1 port={port} user=sandflow dbname=public connect_timeout=10"),
        NoTls,
    )
}

fn pg_fate(e: postgres::Error) -> NotAcked {
    match e.as_db_error() {
        Some(db) => NotAcked::Rejected(format!("{}: {}", db.code().code(), db.message())),
        None => NotAcked::Lost(e.to_string()),
    }
}

/// Sends `sql`; Ok(rows affected) when acknowledged.
fn send(door: Door, pg: &mut Client, http_port: u16, sql: &str) -> Result<u64, NotAcked> {
    match door {
        Door::PgSimple => {
            let msgs = pg.simple_query(sql).map_err(pg_fate)?;
            msgs.iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::CommandComplete(n) => Some(*n),
                    _ => None,
                })
                .ok_or_else(|| NotAcked::Rejected("no CommandComplete".into()))
        }
        Door::PgExtended => pg.execute(sql, &[]).map_err(pg_fate),
        Door::Http => {
            let body = format!("sql={}", url_encode(sql));
            let (status, text) = http_request(
                http_port,
                "POST",
                "/v1/sql?db=public",
                Some("application/x-www-form-urlencoded"),
                &body,
            )
            .map_err(NotAcked::Lost)?;
            if status != 200 {
                return Err(NotAcked::Rejected(format!("HTTP {status}: {text}")));
            }
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| NotAcked::Rejected(format!("not JSON ({e}): {text}")))?;
            v["output"][0]["affectedrows"]
                .as_u64()
                .ok_or_else(|| NotAcked::Rejected(format!("no affectedrows: {text}")))
        }
    }
}

/// What one writer round did.
#[derive(Default)]
struct Outcome {
    acked: usize,
    /// The statement in flight when the server went away, and the error.
    lost: Option<(String, String)>,
    /// Errors the server answered with.
    rejected: Vec<String>,
    /// Acknowledged statements with a wrong affected-row count.
    miscounted: Vec<String>,
}

/// Sends random statements until `stop` or until the server goes away;
/// the model follows exactly the acknowledged statements.
fn write_until_gone(
    pg_port: u16,
    http_port: u16,
    model: &mut Model,
    rng: &mut StdRng,
    stop: &AtomicBool,
) -> Outcome {
    let mut out = Outcome::default();
    let mut pg = match pg_connect(pg_port) {
        Ok(c) => c,
        Err(e) => {
            out.lost = Some(("(connect)".into(), e.to_string()));
            return out;
        }
    };
    while !stop.load(Ordering::SeqCst) && out.acked < 50_000 {
        let stmt = model.next_statement(rng);
        let sql = stmt.sql();
        let door = match rng.random_range(0..3) {
            0 => Door::PgSimple,
            1 => Door::PgExtended,
            _ => Door::Http,
        };
        match send(door, &mut pg, http_port, &sql) {
            Ok(n) => {
                if let Some(want) = model.expected_count(&stmt) {
                    if n != want {
                        out.miscounted.push(format!(
                            "{door:?} {sql}: {n} rows affected, expected {want}"
                        ));
                    }
                }
                model.apply(&stmt);
                out.acked += 1;
            }
            Err(fate) => {
                model.uncertain.extend(stmt.ids());
                match fate {
                    NotAcked::Lost(e) => out.lost = Some((sql, format!("{door:?}: {e}"))),
                    NotAcked::Rejected(e) => out.rejected.push(format!("{door:?} {sql}: {e}")),
                }
                break;
            }
        }
    }
    out
}

fn tail(logs: &str, n: usize) -> String {
    let lines: Vec<&str> = logs.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn shorten(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut end = n;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} bytes)", &s[..end], s.len())
    }
}

/// Lines of `a` not in `b` (as multisets), at most `n`.
fn missing_lines(a: &str, b: &str, n: usize) -> Vec<String> {
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for l in b.lines() {
        *count.entry(l).or_default() += 1;
    }
    let mut out = Vec::new();
    for l in a.lines() {
        let c = count.entry(l).or_default();
        if *c > 0 {
            *c -= 1;
        } else if out.len() < n {
            out.push(l.to_string());
        }
    }
    out
}

/// Failure context: which seed and round, and the logs around the crash.
struct Ctx<'a> {
    seed: u64,
    round: usize,
    how: &'a str,
    killed_log: &'a str,
    writer: &'a str,
}

impl Ctx<'_> {
    fn fail(&self, s: Option<&Server>, what: &str) -> ! {
        panic!(
            "crash_flows: seed {seed} (SANDFLOW_CRASH_SEED={seed}), round {round} ({how}): {what}\n\
             writer: {writer}\n\
             --- log of the run that was stopped (last 120 lines) ---\n{killed}\n\
             --- log since the restart (last 120 lines) ---\n{now}",
            seed = self.seed,
            round = self.round,
            how = self.how,
            writer = self.writer,
            killed = tail(self.killed_log, 120),
            now = s.map(|s| tail(&s.logs(), 120)).unwrap_or_default(),
        )
    }

    fn sql(&self, s: &Server, sql: &str) -> String {
        match s.psql(sql) {
            Ok(out) => out.trim().to_string(),
            Err(e) => self.fail(Some(s), &format!("psql {sql:?} failed: {e}")),
        }
    }
}

/// Reads `ev`: id -> every stored row with that id.
fn read_source(c: &mut Client) -> Result<BTreeMap<i64, Vec<Row>>, postgres::Error> {
    let mut out: BTreeMap<i64, Vec<Row>> = BTreeMap::new();
    for r in c.query("SELECT id, host, status, bytes FROM ev", &[])? {
        out.entry(r.get(0)).or_default().push(Row {
            host: r.get(1),
            status: r.get(2),
            bytes: r.get(3),
        });
    }
    Ok(out)
}

/// Everything that must hold after a restart; then the model is reset to
/// what the table holds (which makes uncertain ids certain again).
fn verify(ctx: &Ctx, s: &Server, flows: &[&Flow], model: &mut Model) {
    // Every flow came back running.
    let info = ctx.sql(
        s,
        "SELECT flow_name, status, last_error FROM information_schema.flows ORDER BY flow_name",
    );
    let mut want: Vec<&str> = flows.iter().map(|f| f.name).collect();
    want.sort();
    let got: Vec<(&str, &str)> = info
        .lines()
        .map(|l| {
            let mut f = l.splitn(3, '|');
            (f.next().unwrap_or(""), f.next().unwrap_or(""))
        })
        .collect();
    if got.iter().map(|(n, _)| *n).collect::<Vec<_>>() != want
        || got.iter().any(|(_, st)| *st != "running")
    {
        ctx.fail(
            Some(s),
            &format!("information_schema.flows after the restart:\n{info}"),
        );
    }

    // The source: no id twice, every certain id as the acknowledged
    // statements left it.
    let dups = ctx.sql(
        s,
        "SELECT id, count(*) FROM ev GROUP BY id HAVING count(*) > 1",
    );
    if !dups.is_empty() {
        ctx.fail(Some(s), &format!("ids stored more than once:\n{dups}"));
    }
    let truth = pg_connect(s.pg_port)
        .and_then(|mut c| read_source(&mut c))
        .unwrap_or_else(|e| ctx.fail(Some(s), &format!("cannot read ev: {e}")));
    let mut problems = Vec::new();
    for (id, rows) in &truth {
        if rows.len() > 1 {
            problems.push(format!("id {id} stored {} times: {rows:?}", rows.len()));
        }
        if !model.rows.contains_key(id) {
            problems.push(format!("id {id} was never written: {rows:?}"));
        }
    }
    for (id, want) in &model.rows {
        if model.uncertain.contains(id) {
            continue;
        }
        let got = truth.get(id).and_then(|r| r.first());
        if got != want.as_ref() {
            problems.push(format!(
                "id {id}: acknowledged state {want:?}, stored {got:?}"
            ));
        }
    }
    if !problems.is_empty() {
        let n = problems.len();
        problems.truncate(30);
        ctx.fail(
            Some(s),
            &format!(
                "{n} source rows differ from the acknowledged writes:\n{}",
                problems.join("\n")
            ),
        );
    }
    for (id, row) in model.rows.iter_mut() {
        *row = truth.get(id).and_then(|r| r.first()).cloned();
    }
    model.uncertain.clear();

    // Every sink equals its query over the sources.
    for f in flows {
        let out = ctx.sql(s, &format!("ADMIN FLUSH_FLOW('{}')", f.name));
        if out.parse::<u64>().is_err() {
            ctx.fail(
                Some(s),
                &format!("FLUSH_FLOW('{}') printed {out:?}", f.name),
            );
        }
    }
    // Compare them all before failing: one report shows every flow that is off.
    let mut diffs = Vec::new();
    let mut compare = |what: String, sink_sql: String, oracle_sql: String| {
        let got = ctx.sql(s, &sink_sql);
        let want = ctx.sql(s, &oracle_sql);
        if got != want {
            diffs.push(format!(
                "{what} ({} rows in the sink, {} expected)\n\
                 in the sink only (stale or wrong):\n{}\n\
                 in the query only (missing or wrong):\n{}",
                got.lines().count(),
                want.lines().count(),
                missing_lines(&got, &want, 12).join("\n"),
                missing_lines(&want, &got, 12).join("\n"),
            ));
        }
    };
    for f in flows {
        compare(
            format!(
                "sink of flow '{}' differs from its query over the sources",
                f.name
            ),
            format!("SELECT {} FROM {} ORDER BY {}", f.columns, f.sink, f.order),
            format!(
                "SELECT {} FROM ({}) ORDER BY {}",
                f.columns, f.oracle, f.order
            ),
        );
    }
    // The chained flow also equals its own query over the intermediate sink.
    let chained = &FLOWS[3];
    if flows.iter().any(|f| f.name == chained.name) {
        compare(
            format!(
                "sink of flow '{}' differs from its query over {}",
                chained.name, FLOWS[0].sink
            ),
            format!(
                "SELECT {} FROM {} ORDER BY {}",
                chained.columns, chained.sink, chained.order
            ),
            format!(
                "SELECT {} FROM ({}) ORDER BY {}",
                chained.columns, chained.query, chained.order
            ),
        );
    }
    if !diffs.is_empty() {
        ctx.fail(Some(s), &diffs.join("\n"));
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v:?}: {e}")),
    )
}

#[test]
fn flows_recover_exactly_after_kill9_at_random_moments() {
    let rounds = env_u64("SANDFLOW_CRASH_ROUNDS").unwrap_or(12) as usize;
    let seed = env_u64("SANDFLOW_CRASH_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    let flows = selected_flows();
    let names: Vec<&str> = flows.iter().map(|f| f.name).collect();
    eprintln!(
        "crash_flows: seed {seed} (SANDFLOW_CRASH_SEED={seed} to repeat), {rounds} rounds, \
         flows {names:?}"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();

    let opts = Options {
        args: vec!["--flow-tick-interval".into(), "20ms".into()],
        ..Default::default()
    };
    let dir = temp_data_dir();
    let mut s = Server::start_with(dir.clone(), opts.clone());
    s.sql(EV);
    for f in &flows {
        s.sql(&format!(
            "CREATE FLOW {} SINK TO {} AS {}",
            f.name, f.sink, f.query
        ));
    }
    let mut model = Model::default();
    // One round stops the server cleanly (SIGTERM) instead of killing it.
    let clean_round = rounds / 2;

    for round in 0..rounds {
        let clean = round == clean_round;
        let pause = Duration::from_millis(rng.random_range(50..=800));
        let writer_seed: u64 = rng.random();
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            let (pg_port, http_port) = (s.pg_port, s.http_port);
            let mut model = std::mem::take(&mut model);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(writer_seed);
                let out = write_until_gone(pg_port, http_port, &mut model, &mut rng, &stop);
                (model, out)
            })
        };
        std::thread::sleep(pause);
        let how = if clean {
            format!("SIGTERM after {} ms", pause.as_millis())
        } else {
            format!("SIGKILL after {} ms", pause.as_millis())
        };
        let stopped_cleanly = if clean {
            stop.store(true, Ordering::SeqCst);
            s.stop()
        } else {
            s.kill9();
            stop.store(true, Ordering::SeqCst);
            true
        };
        let (m, out) = writer.join().expect("writer thread panicked");
        model = m;
        let killed_log = s.logs();
        let writer_summary = format!(
            "{} statements acknowledged; in flight at the stop: {}; rejected: {:?}; \
             miscounted: {:?}",
            out.acked,
            out.lost
                .as_ref()
                .map(|(sql, e)| format!("{} ({e})", shorten(sql, 300)))
                .unwrap_or_else(|| "none".into()),
            out.rejected,
            out.miscounted
        );
        let ctx = Ctx {
            seed,
            round,
            how: &how,
            killed_log: &killed_log,
            writer: &writer_summary,
        };
        if !stopped_cleanly {
            ctx.fail(None, "SIGTERM did not stop the server cleanly");
        }
        if !out.miscounted.is_empty() {
            ctx.fail(None, "acknowledged statements reported wrong row counts");
        }
        // A killed server never answers with an error; a stopping one may
        // refuse new work.
        if !clean && !out.rejected.is_empty() {
            ctx.fail(None, "the server rejected a statement");
        }
        let t = Instant::now();
        let opts = opts.clone();
        let dir = dir.clone();
        s = match catch_unwind(AssertUnwindSafe(move || Server::start_with(dir, opts))) {
            Ok(s) => s,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                ctx.fail(None, &format!("the server did not come back: {msg}"))
            }
        };
        let restart = t.elapsed();
        verify(&ctx, &s, &flows, &mut model);
        eprintln!(
            "round {round}: {how}, {} statements acknowledged{}, {} rows in ev, \
             restart {} ms, checked ({:.1} s in all)",
            out.acked,
            if out.lost.is_some() {
                " + 1 in flight"
            } else {
                ""
            },
            model.present().len(),
            restart.as_millis(),
            started.elapsed().as_secs_f64()
        );
    }
    assert!(
        model.present().len() > 30,
        "the writers barely wrote anything: {} rows",
        model.present().len()
    );
}

/// Column 0 of every row of `sql` (simple query).
fn first_column(c: &mut Client, sql: &str) -> Result<Vec<String>, postgres::Error> {
    Ok(c.simple_query(sql)?
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect())
}

/// One DDL statement of [`create_flow_is_atomic_across_kill9`].
#[derive(Debug, Clone)]
struct FlowDdl {
    flow: String,
    sink: String,
    replace: bool,
}

impl FlowDdl {
    fn sql(&self) -> String {
        format!(
            "CREATE {}FLOW {} SINK TO {} AS SELECT host, count(*) AS n, sum(bytes) AS b \
             FROM ev GROUP BY host",
            if self.replace { "OR REPLACE " } else { "" },
            self.flow,
            self.sink
        )
    }
}

/// Sends CREATE [OR REPLACE] FLOW statements, each with a sink table of its
/// own that the flow creates, until the server goes away. Returns the
/// acknowledged statements and the one in flight.
fn create_flows_until_gone(
    pg_port: u16,
    round: usize,
    rng: &mut StdRng,
) -> (Vec<FlowDdl>, Option<(FlowDdl, String)>) {
    let mut acked: Vec<FlowDdl> = Vec::new();
    let mut pg = match pg_connect(pg_port) {
        Ok(c) => c,
        Err(_) => return (acked, None),
    };
    for i in 0.. {
        let sink = format!("s{round}_{i}");
        // Now and then replace an acknowledged flow, moving it to a new sink.
        let replace = !acked.is_empty() && rng.random_range(0..4) == 0;
        let flow = if replace {
            acked[rng.random_range(0..acked.len())].flow.clone()
        } else {
            format!("f{round}_{i}")
        };
        let ddl = FlowDdl {
            flow,
            sink,
            replace,
        };
        match pg.simple_query(&ddl.sql()) {
            Ok(_) => acked.push(ddl),
            Err(e) => return (acked, Some((ddl, e.to_string()))),
        }
    }
    unreachable!()
}

/// CREATE FLOW commits its auto-created sink table and its definition in
/// one transaction: the server is killed with SIGKILL at a random moment
/// while CREATE [OR REPLACE] FLOW statements follow each other, round after
/// round, and after every restart
/// * every acknowledged flow exists (with the sink of its last acknowledged
///   statement, or of the one in flight when that replaced it) and runs;
/// * every flow's sink table exists;
/// * a sink table exists only if a flow writes into it or the statement
///   that created it was acknowledged: the statement in flight left either
///   its flow and its sink, or neither.
///
/// Rounds: 24 by default, `SANDFLOW_CRASH_DDL_ROUNDS=N` for more; seed as
/// for the test above (`SANDFLOW_CRASH_SEED`).
#[test]
fn create_flow_is_atomic_across_kill9() {
    let rounds = env_u64("SANDFLOW_CRASH_DDL_ROUNDS").unwrap_or(24) as usize;
    let seed = env_u64("SANDFLOW_CRASH_SEED").unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    eprintln!(
        "create_flow_is_atomic_across_kill9: seed {seed} (SANDFLOW_CRASH_SEED={seed} to repeat), \
         {rounds} rounds"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let dir = temp_data_dir();
    let opts = Options::default();
    let mut s = Server::start_with(dir.clone(), opts.clone());
    s.sql(EV);
    s.sql("INSERT INTO ev VALUES (1, 'a', 200, 1.5, 0), (2, 'b', 500, 2.5, 0)");
    // A flow that stays: every start loads the guest, so that a CREATE FLOW
    // in a round costs only itself.
    s.sql("CREATE FLOW keep SINK TO keep_sink AS SELECT host, count(*) AS n FROM ev GROUP BY host");
    let (mut flows_made, mut kills_in_flight) = (0usize, 0usize);
    for round in 0..rounds {
        let pause = Duration::from_millis(rng.random_range(20..=400));
        let writer_seed: u64 = rng.random();
        let pg_port = s.pg_port;
        let writer = std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(writer_seed);
            create_flows_until_gone(pg_port, round, &mut rng)
        });
        std::thread::sleep(pause);
        s.kill9();
        let (acked, in_flight) = writer.join().expect("writer thread panicked");
        let killed_log = s.logs();
        let writer_summary = format!(
            "{} statements acknowledged: {:?}; in flight at the kill: {:?}",
            acked.len(),
            acked.iter().map(FlowDdl::sql).collect::<Vec<_>>(),
            in_flight
        );
        let how = format!("SIGKILL after {} ms", pause.as_millis());
        let ctx = Ctx {
            seed,
            round,
            how: &how,
            killed_log: &killed_log,
            writer: &writer_summary,
        };
        let (dir, o) = (dir.clone(), opts.clone());
        s = match catch_unwind(AssertUnwindSafe(move || Server::start_with(dir, o))) {
            Ok(s) => s,
            Err(_) => ctx.fail(None, "the server did not come back"),
        };
        let mut pg = pg_connect(s.pg_port)
            .unwrap_or_else(|e| ctx.fail(Some(&s), &format!("cannot connect: {e}")));
        let flows: BTreeMap<String, (String, String)> = pg
            .simple_query("SELECT flow_name, sink_table_name, status FROM information_schema.flows")
            .unwrap_or_else(|e| ctx.fail(Some(&s), &format!("information_schema.flows: {e}")))
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some((
                    r.get(0).unwrap_or("").to_string(),
                    (
                        r.get(1).unwrap_or("").to_string(),
                        r.get(2).unwrap_or("").to_string(),
                    ),
                )),
                _ => None,
            })
            .collect();
        let shown: BTreeSet<String> = first_column(&mut pg, "SHOW FLOWS")
            .unwrap_or_else(|e| ctx.fail(Some(&s), &format!("SHOW FLOWS: {e}")))
            .into_iter()
            .collect();
        let tables: BTreeSet<String> = first_column(&mut pg, "SHOW TABLES")
            .unwrap_or_else(|e| ctx.fail(Some(&s), &format!("SHOW TABLES: {e}")))
            .into_iter()
            .collect();
        let mut problems = Vec::new();
        if shown != flows.keys().cloned().collect::<BTreeSet<_>>() {
            problems.push(format!(
                "SHOW FLOWS {shown:?} != information_schema.flows {flows:?}"
            ));
        }
        for (flow, (sink, status)) in &flows {
            if !tables.contains(sink) {
                problems.push(format!("flow {flow} exists, its sink {sink} does not"));
            }
            if status != "running" {
                problems.push(format!("flow {flow} is {status}"));
            }
        }
        // The sink each acknowledged flow must have (its last acknowledged statement).
        let mut want: BTreeMap<&str, &str> = BTreeMap::new();
        for d in &acked {
            want.insert(&d.flow, &d.sink);
        }
        for (flow, sink) in &want {
            let may_be_replaced = in_flight
                .as_ref()
                .is_some_and(|(d, _)| d.replace && d.flow == *flow);
            match flows.get(*flow) {
                None => problems.push(format!("acknowledged flow {flow} is gone")),
                Some((got, _)) if got == sink => {}
                Some((got, _))
                    if may_be_replaced && Some(got) == in_flight.as_ref().map(|(d, _)| &d.sink) => {
                }
                Some((got, _)) => {
                    problems.push(format!("flow {flow} writes into {got}, expected {sink}"))
                }
            }
        }
        let acked_sinks: BTreeSet<&str> = acked.iter().map(|d| d.sink.as_str()).collect();
        let flow_sinks: BTreeSet<&str> = flows.values().map(|(t, _)| t.as_str()).collect();
        for t in tables
            .iter()
            .filter(|t| t.starts_with(&format!("s{round}_")))
        {
            if !acked_sinks.contains(t.as_str()) && !flow_sinks.contains(t.as_str()) {
                problems.push(format!(
                    "table {t} exists without its flow: an auto-created sink whose CREATE FLOW \
                     was not acknowledged and did not commit"
                ));
            }
        }
        if !problems.is_empty() {
            ctx.fail(Some(&s), &problems.join("\n"));
        }
        if let Some((d, _)) = &in_flight {
            if flows.get(&d.flow).is_some_and(|(t, _)| *t == d.sink) {
                kills_in_flight += 1;
            }
        }
        flows_made += acked.len();
        // Start the next round from `keep` alone.
        for flow in flows.keys().filter(|f| *f != "keep") {
            ctx.sql(&s, &format!("DROP FLOW {flow}"));
        }
        for t in tables
            .iter()
            .filter(|t| t.starts_with(&format!("s{round}_")))
        {
            ctx.sql(&s, &format!("DROP TABLE {t}"));
        }
        eprintln!(
            "round {round}: {how}, {} statements acknowledged, in flight: {} ({:.1} s in all)",
            acked.len(),
            in_flight
                .as_ref()
                .map(
                    |(d, _)| if flows.get(&d.flow).is_some_and(|(t, _)| *t == d.sink) {
                        "committed"
                    } else {
                        "not committed"
                    }
                )
                .unwrap_or("none"),
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "create_flow_is_atomic_across_kill9: {flows_made} statements acknowledged, \
         {kills_in_flight} in-flight statements committed before the kill"
    );
    assert!(
        flows_made > rounds,
        "barely any CREATE FLOW ran: {flows_made}"
    );
}
