//! Flows, differentially, through the library API: random writes, replacing
//! upserts, identical rewrites and deletes on two source tables feeding
//! several flows; after every `ADMIN FLUSH_FLOW` each sink must hold exactly
//! what its query returns when run directly over the sources (DESIGN.md's
//! correctness contract). A second test chains two flows (the second reads
//! the first one's sink) and checks the end of the chain against the
//! two-level query over the source.
//!
//! Seeds: 0..3 by default; `SANDFLOW_SEEDS=N` runs seeds 0..N,
//! `SANDFLOW_SEEDS=a..b` a range, `SANDFLOW_SEEDS=4,9` a list. A failure
//! names its seed.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type, Int64Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sandflow::{Database, Output};

const REQ: &str = "CREATE TABLE req (host STRING, status INT, bytes DOUBLE, \
     ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, status))";
const CPU: &str = "CREATE TABLE cpu (host STRING NULL, usage DOUBLE NULL, \
     ts TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))";
/// The `errors` flow writes into this table, created beforehand with the
/// source's key (the path of SINK TO an existing table); `slow` covers an
/// auto-created sink for a query without GROUP BY.
const ERRORS_SINK: &str = "CREATE TABLE errors_sink (host STRING, status INT, bytes DOUBLE, \
     ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, status))";

/// A flow under test: its name, sink, query and the query's output columns
/// (every one aliased, so the sink's column names are these).
struct Flow {
    name: &'static str,
    sink: &'static str,
    columns: &'static str,
    query: &'static str,
    /// What the sink must equal, when the flow's query cannot run as a
    /// query (hop windows); `None`: the query itself.
    reference: Option<&'static str>,
}

impl Flow {
    fn create_sql(&self) -> String {
        format!(
            "CREATE FLOW {} SINK TO {} AS {}",
            self.name, self.sink, self.query
        )
    }

    /// The sink's contents restricted to the query's columns (auto-created
    /// sinks add `update_at` and maybe `__ts_placeholder`).
    fn sink_sql(&self) -> String {
        format!("SELECT {} FROM {}", self.columns, self.sink)
    }
}

/// Windowed aggregates per host; created before any data.
const WIN: Flow = Flow {
    name: "win",
    sink: "win_sink",
    columns: "host, w, c, s, lo, hi, a",
    query: "SELECT host, date_bin(INTERVAL '1 minute', ts) AS w, count(*) AS c, \
            sum(bytes) AS s, min(bytes) AS lo, max(bytes) AS hi, avg(bytes) AS a \
            FROM req GROUP BY host, w",
    reference: None,
};

/// NULL group keys and NULL aggregate inputs; created before any data.
const CPU_STATS: Flow = Flow {
    name: "cpu_stats",
    sink: "cpu_sink",
    columns: "host, n, s, m",
    query: "SELECT host, count(usage) AS n, sum(usage) AS s, max(usage) AS m \
            FROM cpu GROUP BY host",
    reference: None,
};

/// Statistics computed from each group's multiset: variance, standard
/// deviation and median under upserts, deletes and NULL inputs; created
/// before any data.
const CPU_SPREAD: Flow = Flow {
    name: "cpu_spread",
    sink: "cpu_spread_sink",
    columns: "host, sd, vp, md",
    query: "SELECT host, stddev(usage) AS sd, var_pop(usage) AS vp, median(usage) AS md \
            FROM cpu GROUP BY host",
    reference: None,
};

/// array_agg under upserts, deletes and NULL inputs: in the order of an
/// ORDER BY inside the call, either way, and DISTINCT; created before any
/// data.
const CPU_LISTS: Flow = Flow {
    name: "cpu_lists",
    sink: "cpu_lists_sink",
    columns: "host, seq, newest, vals",
    query: "SELECT host, array_agg(usage ORDER BY ts) AS seq, \
            array_agg(usage ORDER BY ts DESC) AS newest, \
            array_agg(DISTINCT usage ORDER BY usage) AS vals FROM cpu GROUP BY host",
    reference: None,
};

/// array_agg without an ORDER BY: a flow lists the values in ascending
/// order, NULLs last (a query's order is the scan's, which SQL leaves
/// open); created after the first batch, so it back-fills.
const CPU_ANY_ORDER: Flow = Flow {
    name: "cpu_any_order",
    sink: "cpu_any_order_sink",
    columns: "host, vals",
    query: "SELECT host, array_agg(usage) AS vals FROM cpu GROUP BY host",
    reference: Some("SELECT host, array_agg(usage ORDER BY usage) AS vals FROM cpu GROUP BY host"),
};

/// Sliding windows: each row counts in the two one-minute-slide windows of
/// two minutes that hold it; checked against date_bin over the row and its
/// copy shifted back by the slide. Created before any data.
const SLIDING: Flow = Flow {
    name: "sliding",
    sink: "sliding_sink",
    columns: "host, w, c, s",
    query: "SELECT host, hop(ts, INTERVAL '1 minute', INTERVAL '2 minutes') AS w, \
            count(*) AS c, sum(bytes) AS s FROM req GROUP BY host, w",
    reference: Some(
        "SELECT host, w, count(*) AS c, sum(bytes) AS s FROM \
         (SELECT host, bytes, date_bin(INTERVAL '1 minute', ts) AS w FROM req \
          UNION ALL SELECT host, bytes, date_bin(INTERVAL '1 minute', ts) - INTERVAL '1 minute' \
          FROM req) AS shifted GROUP BY host, w",
    ),
};

/// HAVING: groups enter and leave the sink; created after the first data.
const BUSY: Flow = Flow {
    name: "busy",
    sink: "busy_sink",
    columns: "status, c, s",
    query: "SELECT status, count(*) AS c, sum(bytes) AS s FROM req \
            GROUP BY status HAVING count(*) > 2",
    reference: None,
};

/// Filter and projection only, into a pre-created sink; created after the
/// first data.
const ERRORS: Flow = Flow {
    name: "errors",
    sink: "errors_sink",
    columns: "host, status, bytes, ts",
    query: "SELECT host, status, bytes, ts FROM req WHERE status >= 500",
    reference: None,
};

/// Filter and projection into an auto-created sink (no GROUP BY: every row
/// of the result must stay a row of its own); an upsert that changes `bytes`
/// moves a row in or out, or changes `b2`. Created before any data.
const SLOW: Flow = Flow {
    name: "slow",
    sink: "slow_sink",
    columns: "host, status, b2, ts",
    query: "SELECT host, status, bytes * 2 AS b2, ts FROM req \
            WHERE status = 404 OR bytes >= 15",
    reference: None,
};

/// count(DISTINCT) over an arithmetic group key; created half-way through
/// the steps, over a history of upserts and deletes.
const CLASS_HOSTS: Flow = Flow {
    name: "class_hosts",
    sink: "class_sink",
    columns: "class, hosts, c",
    query: "SELECT status / 100 AS class, count(DISTINCT host) AS hosts, count(*) AS c \
            FROM req GROUP BY class",
    reference: None,
};

/// Chained flows: the first aggregates req per (host, minute), the second
/// reads the first one's sink.
const PER_HOST: Flow = Flow {
    name: "per_host",
    sink: "per_host_sink",
    columns: "host, w, c",
    query: "SELECT host, date_bin(INTERVAL '1 minute', ts) AS w, count(*) AS c \
            FROM req GROUP BY host, w",
    reference: None,
};

const PER_WINDOW: Flow = Flow {
    name: "per_window",
    sink: "per_window_sink",
    columns: "w, total, hosts",
    query: "SELECT w, sum(c) AS total, count(host) AS hosts FROM per_host_sink GROUP BY w",
    reference: None,
};

/// What `per_window`'s sink must equal, computed from req alone.
const PER_WINDOW_FROM_REQ: &str = "SELECT w, sum(c) AS total, count(host) AS hosts FROM \
     (SELECT host, date_bin(INTERVAL '1 minute', ts) AS w, count(*) AS c \
      FROM req GROUP BY host, w) AS per_host GROUP BY w";

/// The dimension table of the join flows: each host's region (maybe NULL)
/// and tier, replaced by upserts.
const HOSTS_TABLE: &str = "CREATE TABLE hosts (host STRING, region STRING NULL, tier INT, \
     ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))";

/// Joins, each created before any data. Inner join then GROUP BY: an
/// upsert of a host's region moves its rows between groups.
const BY_REGION: Flow = Flow {
    name: "by_region",
    sink: "by_region_sink",
    columns: "region, c, s",
    query: "SELECT h.region AS region, count(*) AS c, sum(r.bytes) AS s \
            FROM req r JOIN hosts h ON r.host = h.host GROUP BY h.region",
    reference: None,
};

/// Left join without aggregation: NULL cpu hosts never match.
const CPU_REGION: Flow = Flow {
    name: "cpu_region",
    sink: "cpu_region_sink",
    columns: "host, usage, ts, region",
    query: "SELECT c.host AS host, c.usage AS usage, c.ts AS ts, h.region AS region \
            FROM cpu c LEFT JOIN hosts h ON c.host = h.host",
    reference: None,
};

/// Full outer join with a condition beside the equality, then GROUP BY.
const FULL_TIER: Flow = Flow {
    name: "full_tier",
    sink: "full_tier_sink",
    columns: "hh, rh, c",
    query: "SELECT h.host AS hh, r.host AS rh, count(*) AS c FROM req r \
            FULL JOIN hosts h ON r.host = h.host AND r.bytes > h.tier GROUP BY h.host, r.host",
    reference: None,
};

/// Right join on two keys' worth of condition, counting the matches.
const ERRORS_PER_HOST: Flow = Flow {
    name: "errors_per_host",
    sink: "errors_per_host_sink",
    columns: "host, tier, n",
    query: "SELECT h.host AS host, h.tier AS tier, count(r.status) AS n FROM req r \
            RIGHT JOIN hosts h ON r.host = h.host AND r.status >= 500 GROUP BY h.host, h.tier",
    reference: None,
};

/// Three tables.
const THREE_WAY: Flow = Flow {
    name: "three_way",
    sink: "three_way_sink",
    columns: "region, c, m",
    query: "SELECT h.region AS region, count(*) AS c, max(c.usage) AS m FROM req r \
            JOIN hosts h ON r.host = h.host JOIN cpu c ON c.host = h.host GROUP BY h.region",
    reference: None,
};

/// A self-join with an inequality beside the equality.
const TIER_PAIRS: Flow = Flow {
    name: "tier_pairs",
    sink: "tier_pairs_sink",
    columns: "region, c",
    query: "SELECT a.region AS region, count(*) AS c FROM hosts a JOIN hosts b \
            ON a.region = b.region AND a.tier < b.tier GROUP BY a.region",
    reference: None,
};

/// IN (SELECT ...): a semi join.
const HIGH_TIER: Flow = Flow {
    name: "high_tier",
    sink: "high_tier_sink",
    columns: "host, c",
    query: "SELECT host, count(*) AS c FROM req \
            WHERE host IN (SELECT host FROM hosts WHERE tier > 2) GROUP BY host",
    reference: None,
};

/// NOT EXISTS: an anti join, with a condition on the subquery's side.
const UNPLACED: Flow = Flow {
    name: "unplaced",
    sink: "unplaced_sink",
    columns: "host, c",
    query: "SELECT host, count(*) AS c FROM cpu c WHERE NOT EXISTS \
            (SELECT 1 FROM hosts h WHERE h.host = c.host AND h.region IS NOT NULL) GROUP BY host",
    reference: None,
};

/// UNION ALL of two tables.
const EVERY_HOST: Flow = Flow {
    name: "every_host",
    sink: "every_host_sink",
    columns: "host, c",
    query: "SELECT host, count(*) AS c FROM \
            (SELECT host FROM req UNION ALL SELECT host FROM hosts) AS u GROUP BY host",
    reference: None,
};

const JOIN_FLOWS: [&Flow; 9] = [
    &BY_REGION,
    &CPU_REGION,
    &FULL_TIER,
    &ERRORS_PER_HOST,
    &THREE_WAY,
    &TIER_PAIRS,
    &HIGH_TIER,
    &UNPLACED,
    &EVERY_HOST,
];
const JOIN_STEPS: usize = 16;

const STEPS: usize = 30;
const CHAINED_STEPS: usize = 15;

const HOSTS: [&str; 5] = ["a", "b", "c", "d", "e"];
const STATUSES: [i32; 4] = [200, 404, 500, 503];
/// Timestamps are `SLOT_SECS`-second slots from 2024-01-01 00:00:00, five
/// minutes' worth, so keys repeat and windows hold several rows.
const SLOTS: i64 = 20;
const SLOT_SECS: i64 = 15;

fn seeds() -> Vec<u64> {
    let Ok(spec) = std::env::var("SANDFLOW_SEEDS") else {
        return (0..3).collect();
    };
    let spec = spec.trim();
    let num = |s: &str| -> u64 {
        s.trim()
            .parse()
            .unwrap_or_else(|e| panic!("SANDFLOW_SEEDS={spec}: {s:?} is not a seed: {e}"))
    };
    if let Some((a, b)) = spec.split_once("..") {
        (num(a)..num(b)).collect()
    } else if spec.contains(',') {
        spec.split(',')
            .filter(|s| !s.trim().is_empty())
            .map(num)
            .collect()
    } else {
        (0..num(spec)).collect()
    }
}

/// Names the seed of a failing run (whatever panicked: an assertion, a
/// statement that errored, a flush).
struct SeedGuard {
    test: &'static str,
    seed: u64,
}

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "{} failed with seed {}; rerun only it with SANDFLOW_SEEDS={}..{}",
                self.test,
                self.seed,
                self.seed,
                self.seed + 1
            );
        }
    }
}

/// Where a run is, for failure messages.
struct At<'a> {
    seed: u64,
    step: usize,
    statements: &'a [String],
}

impl std::fmt::Display for At<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} step {}", self.seed, self.step)?;
        if !self.statements.is_empty() {
            write!(f, " (this step ran:")?;
            for s in self.statements {
                write!(f, "\n    {s}")?;
            }
            write!(f, ")")?;
        }
        Ok(())
    }
}

async fn exec(db: &Database, sql: &str) -> Vec<Output> {
    db.execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}\n  failed: {e}"))
}

/// The batches of a statement that returns rows.
async fn select(db: &Database, sql: &str) -> Vec<RecordBatch> {
    let mut outs = exec(db, sql).await;
    assert_eq!(outs.len(), 1, "{sql}: one statement, one output");
    match outs.pop() {
        Some(Output::Rows { batches, .. }) => batches,
        other => panic!("{sql}: expected rows, got {other:?}"),
    }
}

/// Every cell of `batches`, row by row, as its display string (None for
/// NULL). With `round`, floats print with 6 decimals, so that `avg`
/// computed in a different order compares equal.
fn cells(batches: &[RecordBatch], round: bool) -> Vec<Vec<Option<String>>> {
    let options = FormatOptions::new();
    let mut rows = Vec::new();
    for batch in batches {
        let columns: Vec<_> = batch
            .columns()
            .iter()
            .map(|c| {
                (
                    c,
                    ArrayFormatter::try_new(c.as_ref(), &options).expect("formatter"),
                )
            })
            .collect();
        for i in 0..batch.num_rows() {
            rows.push(
                columns
                    .iter()
                    .map(|(array, fmt)| {
                        if array.is_null(i) {
                            return None;
                        }
                        let float = match array.data_type() {
                            DataType::Float64 if round => {
                                Some(array.as_primitive::<Float64Type>().value(i))
                            }
                            DataType::Float32 if round => {
                                Some(array.as_primitive::<Float32Type>().value(i) as f64)
                            }
                            _ => None,
                        };
                        Some(match float {
                            // `+ 0.0` turns -0.0 into 0.0.
                            Some(v) => format!("{:.6}", v + 0.0),
                            None => fmt.value(i).to_string(),
                        })
                    })
                    .collect(),
            );
        }
    }
    rows
}

/// The result of `sql` as sorted, comparable row strings.
async fn sorted_rows(db: &Database, sql: &str) -> Vec<String> {
    let mut rows: Vec<String> = cells(&select(db, sql).await, true)
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|c| c.unwrap_or_else(|| "NULL".into()))
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .collect();
    rows.sort();
    rows
}

/// The first differences between two row multisets.
fn diff(expected: &[String], got: &[String]) -> String {
    let mut count: BTreeMap<&str, i64> = BTreeMap::new();
    for r in expected {
        *count.entry(r).or_default() += 1;
    }
    for r in got {
        *count.entry(r).or_default() -= 1;
    }
    let show = |want_missing: bool| -> String {
        let rows: Vec<String> = count
            .iter()
            .filter(|(_, n)| if want_missing { **n > 0 } else { **n < 0 })
            .map(|(r, n)| {
                if n.abs() == 1 {
                    format!("\n    {r}")
                } else {
                    format!("\n    {r}  (x{})", n.abs())
                }
            })
            .collect();
        let total = rows.len();
        let mut s: String = rows.into_iter().take(10).collect();
        if total > 10 {
            s.push_str(&format!("\n    ... and {} more", total - 10));
        }
        if s.is_empty() {
            s.push_str(" none");
        }
        s
    };
    format!(
        "query has {} rows, sink has {}\n  missing from the sink:{}\n  unexpected in the sink:{}",
        expected.len(),
        got.len(),
        show(true),
        show(false)
    )
}

/// `ADMIN FLUSH_FLOW('name')`: one row, one integer column (sink rows
/// written). Returns that number.
async fn flush(db: &Database, name: &str, at: &At<'_>) -> i64 {
    let sql = format!("ADMIN FLUSH_FLOW('{name}')");
    let outs = db
        .execute(&sql)
        .await
        .unwrap_or_else(|e| panic!("{at}: {sql}\n  failed: {e}"));
    let batches = match outs.as_slice() {
        [Output::Rows { batches, .. }] => batches,
        other => panic!("{at}: {sql} should return one row, got {other:?}"),
    };
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 1, "{at}: {sql} should return one row: {batches:?}");
    let batch = batches
        .iter()
        .find(|b| b.num_rows() == 1)
        .expect("the non-empty batch");
    assert_eq!(
        batch.num_columns(),
        1,
        "{at}: {sql} should return one column: {batch:?}"
    );
    let column = batch.column(0);
    assert!(
        column.data_type().is_integer() && !column.is_null(0),
        "{at}: {sql} should return a non-NULL integer, got {column:?}"
    );
    let written = cast(column, &DataType::Int64)
        .expect("integer to Int64")
        .as_primitive::<Int64Type>()
        .value(0);
    assert!(written >= 0, "{at}: {sql} wrote {written} rows");
    written
}

/// Asserts that `sink_sql` over the sink returns what `query` returns over
/// the sources.
async fn compare(db: &Database, flow: &str, sink_sql: &str, query: &str, at: &At<'_>) {
    let expected = sorted_rows(db, query).await;
    let got = sorted_rows(db, sink_sql).await;
    assert_eq!(
        got,
        expected,
        "{at}: flow {flow}: the sink differs from its query\n  sink:  {sink_sql}\n  query: {query}\n  {}",
        diff(&expected, &got)
    );
}

/// Flushes every flow and checks each sink against its query. Every fifth
/// step also flushes again and expects nothing written (nothing changed).
async fn check(db: &Database, flows: &[&Flow], at: &At<'_>) {
    for flow in flows {
        let written = flush(db, flow.name, at).await;
        let label = format!("{} (flush wrote {written} rows)", flow.name);
        let expected = flow.reference.unwrap_or(flow.query);
        compare(db, &label, &flow.sink_sql(), expected, at).await;
    }
    if at.step.is_multiple_of(5) {
        for flow in flows {
            let again = flush(db, flow.name, at).await;
            assert_eq!(
                again, 0,
                "{at}: flow {}: a second flush with no writes in between wrote {again} rows",
                flow.name
            );
            compare(
                db,
                flow.name,
                &flow.sink_sql(),
                flow.reference.unwrap_or(flow.query),
                at,
            )
            .await;
        }
    }
}

async fn create_flow(db: &Database, flow: &Flow) {
    exec(db, &flow.create_sql()).await;
}

/// A SQL timestamp literal for slot `slot` (may run past the five minutes).
fn ts_lit(slot: i64) -> String {
    let secs = slot * SLOT_SECS;
    format!("'2024-01-01 00:{:02}:{:02}'", secs / 60, secs % 60)
}

/// A cell rendered by [`cells`] (unrounded) back into a SQL literal.
fn lit(cell: &Option<String>, quoted: bool) -> String {
    match cell {
        None => "NULL".into(),
        Some(v) if quoted => format!("'{}'", v.replace('\'', "''")),
        Some(v) => v.clone(),
    }
}

/// Random statements over req and cpu from small domains.
struct Workload {
    rng: StdRng,
}

impl Workload {
    fn new(seed: u64) -> Workload {
        Workload {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn host(&mut self) -> &'static str {
        HOSTS[self.rng.random_range(0..HOSTS.len())]
    }

    fn status(&mut self) -> i32 {
        STATUSES[self.rng.random_range(0..STATUSES.len())]
    }

    fn ts(&mut self) -> String {
        ts_lit(self.rng.random_range(0..SLOTS))
    }

    fn bytes(&mut self) -> String {
        // Small integers as doubles: sums are exact in any order.
        format!("{}.0", self.rng.random_range(0..20))
    }

    fn usage(&mut self) -> String {
        if self.rng.random_range(0..5) == 0 {
            "NULL".into()
        } else {
            // Halves are exact too.
            format!("{}", self.rng.random_range(0..20) as f64 / 2.0)
        }
    }

    fn cpu_host(&mut self) -> String {
        if self.rng.random_range(0..6) == 0 {
            "NULL".into()
        } else {
            format!("'{}'", self.host())
        }
    }

    /// New rows (some on existing keys, some repeating a key within the
    /// statement; timestamps in any order).
    fn insert_req(&mut self) -> String {
        let n = self.rng.random_range(1..=8);
        let rows: Vec<String> = (0..n)
            .map(|_| {
                format!(
                    "('{}', {}, {}, {})",
                    self.host(),
                    self.status(),
                    self.bytes(),
                    self.ts()
                )
            })
            .collect();
        format!(
            "INSERT INTO req (host, status, bytes, ts) VALUES {}",
            rows.join(", ")
        )
    }

    fn insert_cpu(&mut self) -> String {
        let n = self.rng.random_range(1..=6);
        let rows: Vec<String> = (0..n)
            .map(|_| format!("({}, {}, {})", self.cpu_host(), self.usage(), self.ts()))
            .collect();
        format!(
            "INSERT INTO cpu (host, usage, ts) VALUES {}",
            rows.join(", ")
        )
    }

    /// Re-inserts 1-3 existing req rows: with a new value (a replacing
    /// upsert) or unchanged (an identical rewrite, no change at all).
    async fn rewrite_req(&mut self, db: &Database, identical: bool) -> Option<String> {
        let existing = cells(
            &select(db, "SELECT host, status, bytes, ts FROM req").await,
            false,
        );
        if existing.is_empty() {
            return None;
        }
        let n = self.rng.random_range(1..=3);
        let rows: Vec<String> = (0..n)
            .map(|_| {
                let row = &existing[self.rng.random_range(0..existing.len())];
                let bytes = if identical {
                    lit(&row[2], false)
                } else {
                    self.bytes()
                };
                format!(
                    "({}, {}, {bytes}, {})",
                    lit(&row[0], true),
                    lit(&row[1], false),
                    lit(&row[3], true)
                )
            })
            .collect();
        Some(format!(
            "INSERT INTO req (host, status, bytes, ts) VALUES {}",
            rows.join(", ")
        ))
    }

    /// Re-inserts 1-3 existing cpu rows (NULL hosts included), each with a
    /// new usage (maybe NULL) or unchanged.
    async fn rewrite_cpu(&mut self, db: &Database) -> Option<String> {
        let existing = cells(&select(db, "SELECT host, usage, ts FROM cpu").await, false);
        if existing.is_empty() {
            return None;
        }
        let n = self.rng.random_range(1..=3);
        let rows: Vec<String> = (0..n)
            .map(|_| {
                let row = &existing[self.rng.random_range(0..existing.len())];
                let usage = if self.rng.random_bool(0.3) {
                    lit(&row[1], false)
                } else {
                    self.usage()
                };
                format!("({}, {usage}, {})", lit(&row[0], true), lit(&row[2], true))
            })
            .collect();
        Some(format!(
            "INSERT INTO cpu (host, usage, ts) VALUES {}",
            rows.join(", ")
        ))
    }

    /// Inserts or replaces 1-3 hosts: a region (NULL one time in five) and
    /// a tier.
    fn upsert_hosts(&mut self) -> String {
        const REGIONS: [&str; 3] = ["eu", "us", "ap"];
        let n = self.rng.random_range(1..=3);
        let rows: Vec<String> = (0..n)
            .map(|_| {
                let region = if self.rng.random_range(0..5) == 0 {
                    "NULL".to_string()
                } else {
                    format!("'{}'", REGIONS[self.rng.random_range(0..REGIONS.len())])
                };
                format!(
                    "('{}', {region}, {}, '2024-01-01 00:00:00')",
                    self.host(),
                    self.rng.random_range(0..20)
                )
            })
            .collect();
        format!(
            "INSERT INTO hosts (host, region, tier, ts) VALUES {}",
            rows.join(", ")
        )
    }

    fn delete_hosts(&mut self) -> String {
        match self.rng.random_range(0..3) {
            0 => format!("DELETE FROM hosts WHERE host = '{}'", self.host()),
            1 => "DELETE FROM hosts WHERE region IS NULL".to_string(),
            _ => format!(
                "DELETE FROM hosts WHERE tier < {}",
                self.rng.random_range(0..10)
            ),
        }
    }

    /// One step of the join test: statements over req, cpu and hosts.
    async fn join_step(&mut self, db: &Database) -> Vec<String> {
        let mut ran = Vec::new();
        for _ in 0..self.rng.random_range(1..=4) {
            let sql = match self.rng.random_range(0..10) {
                0 | 1 => Some(self.insert_req()),
                2 => self.rewrite_req(db, false).await,
                3 => Some(self.delete_req()),
                4 => Some(self.insert_cpu()),
                5 => Some(self.delete_cpu()),
                6..=8 => Some(self.upsert_hosts()),
                _ => Some(self.delete_hosts()),
            };
            if let Some(sql) = sql {
                exec(db, &sql).await;
                ran.push(sql);
            }
        }
        ran
    }

    fn delete_req(&mut self) -> String {
        let predicate = match self.rng.random_range(0..6) {
            0 => format!("host = '{}'", self.host()),
            1 => format!("status = {}", self.status()),
            2 => {
                let from = self.rng.random_range(0..SLOTS);
                let len = self.rng.random_range(1..=4);
                format!("ts >= {} AND ts < {}", ts_lit(from), ts_lit(from + len))
            }
            3 => format!("host = '{}' AND ts < {}", self.host(), self.ts()),
            4 => format!("bytes >= {}", self.rng.random_range(10..20)),
            _ => format!(
                "status >= 500 AND host IN ('{}', '{}')",
                self.host(),
                self.host()
            ),
        };
        format!("DELETE FROM req WHERE {predicate}")
    }

    fn delete_cpu(&mut self) -> String {
        let predicate = match self.rng.random_range(0..6) {
            0 => "host IS NULL".to_string(),
            1 => format!("host = '{}'", self.host()),
            2 => "usage IS NULL".to_string(),
            3 => {
                let from = self.rng.random_range(0..SLOTS);
                let len = self.rng.random_range(1..=4);
                format!("ts >= {} AND ts < {}", ts_lit(from), ts_lit(from + len))
            }
            4 => format!("usage > {}", self.rng.random_range(5..10)),
            _ => format!("host IS NULL AND ts < {}", self.ts()),
        };
        format!("DELETE FROM cpu WHERE {predicate}")
    }

    /// One step: 1-4 random statements (over req, and cpu when `cpu`), run
    /// in order. Returns what ran.
    async fn step(&mut self, db: &Database, cpu: bool) -> Vec<String> {
        let kinds = if cpu { 11 } else { 6 };
        let mut ran = Vec::new();
        for _ in 0..self.rng.random_range(1..=4) {
            let sql = match self.rng.random_range(0..kinds) {
                0..=2 => Some(self.insert_req()),
                3 => self.rewrite_req(db, false).await,
                4 => self.rewrite_req(db, true).await,
                5 => Some(self.delete_req()),
                6..=8 => Some(self.insert_cpu()),
                9 => self.rewrite_cpu(db).await,
                _ => Some(self.delete_cpu()),
            };
            if let Some(sql) = sql {
                exec(db, &sql).await;
                ran.push(sql);
            }
        }
        ran
    }

    /// The first data: plenty of rows in both tables, then a little
    /// history (an upsert, a delete) for the back-fill to reflect.
    async fn first_batch(&mut self, db: &Database) -> Vec<String> {
        let mut ran = Vec::new();
        for _ in 0..4 {
            ran.push(self.insert_req());
            ran.push(self.insert_cpu());
        }
        for sql in &ran {
            exec(db, sql).await;
        }
        if let Some(sql) = self.rewrite_req(db, false).await {
            exec(db, &sql).await;
            ran.push(sql);
        }
        if let Some(sql) = self.rewrite_cpu(db).await {
            exec(db, &sql).await;
            ran.push(sql);
        }
        let sql = self.delete_req();
        exec(db, &sql).await;
        ran.push(sql);
        ran
    }
}

fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sandflow-flows-")
        .tempdir()
        .expect("tempdir")
}

async fn open(dir: &tempfile::TempDir) -> Arc<Database> {
    Database::open(dir.path())
        .await
        .unwrap_or_else(|e| panic!("open {}: {e}", dir.path().display()))
}

async fn sinks_follow_queries(seed: u64) {
    let dir = temp_dir();
    let db = open(&dir).await;
    exec(&db, REQ).await;
    exec(&db, CPU).await;
    exec(&db, ERRORS_SINK).await;
    let mut work = Workload::new(seed);
    let mut flows: Vec<&Flow> = Vec::new();

    // Flows over empty sources.
    for flow in [&WIN, &CPU_STATS, &CPU_SPREAD, &CPU_LISTS, &SLIDING, &SLOW] {
        create_flow(&db, flow).await;
        flows.push(flow);
    }
    let none: &[String] = &[];
    check(
        &db,
        &flows,
        &At {
            seed,
            step: 0,
            statements: none,
        },
    )
    .await;

    // A first batch, then flows that must back-fill it.
    let first = work.first_batch(&db).await;
    let at = At {
        seed,
        step: 0,
        statements: &first,
    };
    check(&db, &flows, &at).await;
    for flow in [&BUSY, &ERRORS, &CPU_ANY_ORDER] {
        create_flow(&db, flow).await;
        flows.push(flow);
    }
    check(&db, &flows, &at).await;

    for step in 1..=STEPS {
        let ran = work.step(&db, true).await;
        if step == STEPS / 2 {
            // Back-fill over a table with a history of upserts and deletes.
            create_flow(&db, &CLASS_HOSTS).await;
            flows.push(&CLASS_HOSTS);
        }
        check(
            &db,
            &flows,
            &At {
                seed,
                step,
                statements: &ran,
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sinks_equal_their_queries_after_every_flush() {
    for seed in seeds() {
        let _guard = SeedGuard {
            test: "sinks_equal_their_queries_after_every_flush",
            seed,
        };
        sinks_follow_queries(seed).await;
    }
}

/// Join flows over req, cpu and hosts under random inserts, upserts and
/// deletes on every side; half-way the database is closed and opened again,
/// so the flows go on from their snapshots.
async fn join_sinks_follow_queries(seed: u64) {
    let dir = temp_dir();
    let mut db = open(&dir).await;
    for t in [REQ, CPU, HOSTS_TABLE] {
        exec(&db, t).await;
    }
    for flow in JOIN_FLOWS {
        create_flow(&db, flow).await;
    }
    let mut work = Workload::new(seed ^ 0x701a_5eed);
    let mut first = work.first_batch(&db).await;
    for _ in 0..2 {
        let sql = work.upsert_hosts();
        exec(&db, &sql).await;
        first.push(sql);
    }
    let at = At {
        seed,
        step: 0,
        statements: &first,
    };
    check(&db, &JOIN_FLOWS, &at).await;
    for step in 1..=JOIN_STEPS {
        if step == JOIN_STEPS / 2 {
            drop(db);
            db = open(&dir).await;
        }
        let ran = work.join_step(&db).await;
        check(
            &db,
            &JOIN_FLOWS,
            &At {
                seed,
                step,
                statements: &ran,
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_sinks_equal_their_queries_after_every_flush() {
    for seed in seeds() {
        let _guard = SeedGuard {
            test: "join_sinks_equal_their_queries_after_every_flush",
            seed,
        };
        join_sinks_follow_queries(seed).await;
    }
}

async fn chained_flows_follow_req(seed: u64) {
    let dir = temp_dir();
    let db = open(&dir).await;
    exec(&db, REQ).await;
    create_flow(&db, &PER_HOST).await;
    create_flow(&db, &PER_WINDOW).await;
    // A different stream from the first test's for the same seed.
    let mut work = Workload::new(seed ^ 0xc4a1_4ed0);
    for step in 1..=CHAINED_STEPS {
        let ran = work.step(&db, false).await;
        let at = At {
            seed,
            step,
            statements: &ran,
        };
        // Upstream first: its writes to per_host_sink are per_window's input.
        let up = flush(&db, PER_HOST.name, &at).await;
        let down = flush(&db, PER_WINDOW.name, &at).await;
        compare(
            &db,
            &format!("{} (flush wrote {up} rows)", PER_HOST.name),
            &PER_HOST.sink_sql(),
            PER_HOST.query,
            &at,
        )
        .await;
        compare(
            &db,
            &format!(
                "{} over {} (flush wrote {down} rows)",
                PER_WINDOW.name, PER_HOST.name
            ),
            &PER_WINDOW.sink_sql(),
            PER_WINDOW_FROM_REQ,
            &at,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chained_flow_equals_two_level_query() {
    for seed in seeds() {
        let _guard = SeedGuard {
            test: "chained_flow_equals_two_level_query",
            seed,
        };
        chained_flows_follow_req(seed).await;
    }
}

/// A source of many back-fill parts (`PART_ROWS` rows each):
/// the parts before the last reach the guest due at once, and a flow whose
/// chain ends in an aggregate folds them in as they come.
const BIG: &str = "CREATE TABLE big (host STRING, status INT, bytes DOUBLE NULL, \
     ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, status))";

/// Folded in as pushed: a rollup whose max and min share their multisets.
const BIG_WIN: Flow = Flow {
    name: "big_win",
    sink: "big_win_sink",
    columns: "host, w, c, s, lo, hi, n",
    query: "SELECT host, date_bin(INTERVAL '1 minute', ts) AS w, count(*) AS c, \
            sum(bytes) AS s, min(bytes) AS lo, max(bytes) AS hi, count(bytes) AS n \
            FROM big GROUP BY host, w",
    reference: None,
};

/// Folded in as pushed: a filter before the aggregate, a HAVING after it.
const BIG_BUSY: Flow = Flow {
    name: "big_busy",
    sink: "big_busy_sink",
    columns: "host, status, c, hi",
    query: "SELECT host, status, count(*) AS c, max(bytes) AS hi FROM big \
            WHERE status >= 300 GROUP BY host, status HAVING count(*) > 150",
    reference: None,
};

/// Left for the tick (the source is read twice: a self-join).
const BIG_PAIRS: Flow = Flow {
    name: "big_pairs",
    sink: "big_pairs_sink",
    columns: "host, c",
    query: "SELECT a.host AS host, count(*) AS c FROM big a JOIN big b \
            ON a.host = b.host AND a.ts = b.ts AND a.status = 200 AND b.status = 500 \
            GROUP BY a.host",
    reference: None,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_back_fill_of_many_parts_equals_its_query() {
    let dir = temp_dir();
    let db = open(&dir).await;
    exec(&db, BIG).await;
    let rows = 3 * sandflow::storage::PART_ROWS + 1_234;
    let row = |i: usize| {
        let bytes = match i % 13 {
            0 => "NULL".to_string(),
            _ => format!("{}.5", (i * 7_919) % 1_000),
        };
        // Two statuses per (host, second): the self-join finds pairs.
        let (host, status) = (i / 2 % 37, [200, 500, 301, 404][i % 4]);
        format!(
            "('h{host}', {status}, {bytes}, '2024-01-01 00:00:00'::timestamp + INTERVAL '{} seconds')",
            i / 2
        )
    };
    for start in (0..rows).step_by(2_000) {
        let values: Vec<String> = (start..rows.min(start + 2_000)).map(row).collect();
        exec(
            &db,
            &format!("INSERT INTO big VALUES {}", values.join(", ")),
        )
        .await;
    }
    // History for the back-fill to reflect: replacing upserts and deletes.
    exec(
        &db,
        "INSERT INTO big VALUES ('h3', 404, 99999.5, '2024-01-01 00:00:10'), \
               ('h5', 200, NULL, '2024-01-01 00:00:20')",
    )
    .await;
    exec(&db, "DELETE FROM big WHERE host = 'h7' AND status = 301").await;
    let flows = [&BIG_WIN, &BIG_BUSY, &BIG_PAIRS];
    for flow in flows {
        create_flow(&db, flow).await;
    }
    // Closed while back-filling (the readers stop with it, so the file is
    // free at once), the flows back-fill again when it opens.
    let db = {
        drop(db);
        open(&dir).await
    };
    let statements = Vec::new();
    let at = At {
        seed: 0,
        step: 0,
        statements: &statements,
    };
    check(&db, &flows, &at).await;
    // After the back-fill, changes reach the sinks as they come.
    exec(&db, "DELETE FROM big WHERE host = 'h11'").await;
    exec(
        &db,
        "INSERT INTO big VALUES ('h12', 301, -1.5, '2024-01-01 00:01:00')",
    )
    .await;
    check(&db, &flows, &At { step: 1, ..at }).await;
    let db = {
        drop(db);
        open(&dir).await
    };
    check(&db, &flows, &At { step: 2, ..at }).await;
}
