//! End-to-end: flows (continuous queries) through the real binary and psql.
//!
//! `CREATE FLOW ... SINK TO ... AS SELECT ...`, `ADMIN FLUSH_FLOW`, `SHOW
//! FLOWS`, `SHOW CREATE FLOW`, `DROP FLOW` and `information_schema.flows`,
//! following GreptimeDB. The contract every test leans on: after
//! `ADMIN FLUSH_FLOW('f')` the sink of `f` equals `f`'s query run over the
//! current contents of its sources, so most assertions compare the sink with
//! the same SELECT run by DataFusion over the source tables, and with rows
//! worked out by hand.
//!
//! What a flow computes is tested in `tests/slt/` (`sandflow test`, both
//! engines); what stays here is what needs the front door, a real process
//! or real time: statements and their errors through psql, auto-created and
//! existing sinks, restarts, ticking without a flush, limits and ttl.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandflow_tests::harness::{lines, Server};

const REQUESTS: &str = "CREATE TABLE requests (host STRING, status INT, bytes DOUBLE, \
                        ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, status))";

/// `ADMIN FLUSH_FLOW(flow)`: the number of sink rows it wrote.
fn flush(s: &Server, flow: &str) -> i64 {
    let out = s.sql(&format!("ADMIN FLUSH_FLOW('{flow}')"));
    out.parse()
        .unwrap_or_else(|e| panic!("FLUSH_FLOW('{flow}') printed {out:?}: {e}"))
}

/// Inserts rows into `requests`: (host, status, bytes, time of day on
/// 2024-01-01 as "HH:MM:SS"). `host` "NULL" is SQL NULL (otherwise it is
/// quoted); `bytes` is an SQL literal ("12", "0.5", "NULL").
fn put(s: &Server, rows: &[(&str, i32, &str, &str)]) {
    let values: Vec<String> = rows
        .iter()
        .map(|(host, status, bytes, time)| {
            let host = if *host == "NULL" {
                "NULL".to_string()
            } else {
                format!("'{host}'")
            };
            format!("({host}, {status}, {bytes}, '2024-01-01T{time}')")
        })
        .collect();
    let out = s.sql(&format!(
        "INSERT INTO requests VALUES {}",
        values.join(", ")
    ));
    assert_eq!(out, format!("INSERT 0 {}", rows.len()));
}

/// How psql prints the timestamp "HH:MM:SS" on 2024-01-01.
fn at(time: &str) -> String {
    format!("2024-01-01 {time}.000000")
}

/// Runs both queries and asserts they print the same; returns the output.
fn assert_same(s: &Server, sink_sql: &str, oracle_sql: &str) -> String {
    let got = s.sql(sink_sql);
    let want = s.sql(oracle_sql);
    assert_eq!(
        got, want,
        "sink query {sink_sql:?} differs from the flow's query {oracle_sql:?}"
    );
    got
}

/// One column of `information_schema.flows` for one flow.
fn flow_info(s: &Server, flow: &str, column: &str) -> String {
    s.sql(&format!(
        "SELECT {column} FROM information_schema.flows WHERE flow_name = '{flow}'"
    ))
}

/// Runs `sql` from a file (statements too long for a command-line argument).
fn sql_file(s: &Server, sql: &str) -> Result<String, String> {
    let path = s.dir().path().join("statement.sql");
    std::fs::write(&path, sql).expect("write statement file");
    s.psql_args(&["-f", path.to_str().expect("utf-8 path")])
}

/// Polls `sql` until it prints `want` (or the time is up); returns the last output.
fn wait_for(s: &Server, sql: &str, want: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let got = s.sql(sql);
        if got == want || Instant::now() >= deadline {
            return got;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `DESC TABLE` reduced to "Column|Type|Key|Semantic Type" lines, in column order.
fn desc(s: &Server, table: &str) -> Vec<String> {
    s.sql(&format!("DESC TABLE {table}"))
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            assert_eq!(f.len(), 6, "DESC line {l:?}");
            format!("{}|{}|{}|{}", f[0], f[1], f[2], f[5])
        })
        .collect()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

// A dashboard flow with count(*), sum, avg, min, max and count(DISTINCT)
// per host and minute over a few dozen rows, then after deletes, upserts and
// more inserts: always equal to the query, integer columns checked by hand.
// CREATE on an existing flow fails ("already exists"); IF NOT EXISTS keeps the
// old definition; OR REPLACE with IF NOT EXISTS is refused; a failed
// replacement leaves the old flow running; OR REPLACE swaps the query and
// keeps the sink's rows; OR REPLACE of a missing flow creates it.
#[test]
fn or_replace_and_if_not_exists() {
    let s = Server::start();
    s.sql(REQUESTS);
    put(
        &s,
        &[
            ("a", 200, "1", "00:00:00"),
            ("a", 500, "1", "00:00:01"),
            ("b", 200, "1", "00:00:02"),
            ("c", 200, "1", "00:00:03"),
        ],
    );
    const OLD: &str = "SELECT host, count(*) AS n FROM requests GROUP BY host";
    const NEW: &str = "SELECT host, count(*) AS n FROM requests \
                       WHERE status < 500 AND host <> 'c' GROUP BY host";
    // psql's command tag has no row count (GreptimeDB reports 0 rows).
    assert_eq!(
        s.sql(&format!("CREATE FLOW hosts SINK TO per_host AS {OLD}")),
        "CREATE FLOW"
    );
    flush(&s, "hosts");
    let sink = "SELECT host, n FROM per_host ORDER BY host";
    assert_eq!(s.sql(sink), "a|2\nb|1\nc|1");
    let show = || s.sql("SHOW CREATE FLOW hosts");
    let old_text = show();
    assert!(old_text.starts_with("hosts|"), "{old_text}");
    assert!(old_text.contains("SINK TO public.per_host"), "{old_text}");
    assert!(old_text.contains(OLD), "{old_text}");

    // Plain CREATE of an existing name.
    let err = s.sql_err(&format!("CREATE FLOW hosts SINK TO per_host AS {NEW}"));
    assert!(err.contains("already exists"), "{err}");
    // IF NOT EXISTS: a no-op, the old query keeps running.
    s.sql(&format!(
        "CREATE FLOW IF NOT EXISTS hosts SINK TO per_host AS {NEW}"
    ));
    assert_eq!(show(), old_text);
    put(&s, &[("a", 404, "1", "00:00:04")]);
    flush(&s, "hosts");
    assert_eq!(s.sql(sink), "a|3\nb|1\nc|1");
    // Both modifiers together.
    let err = s.sql_err(&format!(
        "CREATE OR REPLACE FLOW IF NOT EXISTS hosts SINK TO per_host AS {NEW}"
    ));
    let lower = err.to_lowercase();
    assert!(
        lower.contains("if not exists") || lower.contains("or replace"),
        "{err}"
    );
    assert_eq!(show(), old_text);
    // A replacement that cannot be compiled leaves the old flow in place.
    let err = s.sql_err(&format!(
        "CREATE OR REPLACE FLOW hosts SINK TO per_host AS {NEW} ORDER BY n"
    ));
    assert!(err.contains("not supported in flows"), "{err}");
    assert_eq!(show(), old_text);
    assert_eq!(flow_info(&s, "hosts", "status"), "running");
    put(&s, &[("b", 500, "1", "00:00:05")]);
    flush(&s, "hosts");
    assert_eq!(s.sql(sink), "a|3\nb|2\nc|1");

    // The replacement: new query from now on, old rows of the sink stay.
    s.sql(&format!(
        "CREATE OR REPLACE FLOW hosts SINK TO per_host AS {NEW}"
    ));
    let new_text = show();
    assert!(new_text.contains("SINK TO public.per_host"), "{new_text}");
    assert!(new_text.contains(NEW), "{new_text}");
    flush(&s, "hosts");
    // a: 200 and 404; b: 200; c is filtered out by the new query, its old row stays.
    assert_eq!(s.sql(sink), "a|2\nb|1\nc|1");
    put(
        &s,
        &[
            ("c", 201, "1", "00:00:06"),
            ("a", 503, "1", "00:00:07"),
            ("b", 302, "1", "00:00:08"),
        ],
    );
    flush(&s, "hosts");
    assert_eq!(s.sql(sink), "a|2\nb|2\nc|1");
    assert_eq!(
        s.sql("SELECT host, n FROM per_host WHERE host <> 'c' ORDER BY host"),
        s.sql(&format!("{NEW} ORDER BY host"))
    );
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["hosts"]);

    // OR REPLACE of a flow that does not exist creates it.
    s.sql(&format!(
        "CREATE OR REPLACE FLOW fresh SINK TO per_host_fresh AS {OLD}"
    ));
    flush(&s, "fresh");
    assert_eq!(
        s.sql("SELECT host, n FROM per_host_fresh ORDER BY host"),
        s.sql(&format!("{OLD} ORDER BY host"))
    );
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["fresh", "hosts"]);
}

// Every CREATE FLOW / DROP error: sink = source, cycles through a chain,
// unknown WITH options, month intervals, unsupported queries, a missing
// table, dropping a missing flow, dropping a table a flow reads or writes;
// none of the failed statements leaves a flow behind.
#[test]
fn create_and_drop_errors() {
    let s = Server::start();
    s.sql(REQUESTS);
    s.sql("CREATE TABLE hosts_info (host STRING, region STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    const OK: &str = "SELECT host, count(*) AS n FROM requests GROUP BY host";

    // The sink is the source.
    s.sql(
        "CREATE TABLE a (host STRING, n BIGINT, update_at TIMESTAMP(3), \
         __ts_placeholder TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))",
    );
    let err = s.sql_err(
        "CREATE FLOW selfish SINK TO a AS SELECT host, count(*) AS n FROM a GROUP BY host",
    );
    assert!(err.contains("sink"), "{err}");

    // A cycle through two flows: a -> b, then b -> a.
    s.sql("CREATE FLOW a_to_b SINK TO b AS SELECT host, count(*) AS n FROM a GROUP BY host");
    let err = s
        .sql_err("CREATE FLOW b_to_a SINK TO a AS SELECT host, count(*) AS n FROM b GROUP BY host");
    assert!(err.contains("cycle"), "{err}");

    // Unknown WITH option: the message lists the known ones.
    let err = s.sql_err(&format!(
        "CREATE FLOW opts SINK TO opts_sink WITH (bogus_option = '1') AS {OK}"
    ));
    for known in ["backfill", "memory_limit", "cpu_limit_per_tick"] {
        assert!(err.contains(known), "{known} missing from {err}");
    }

    // Months have no fixed length.
    for expire in ["'1 month'", "INTERVAL '2 months'"] {
        let err = s.sql_err(&format!(
            "CREATE FLOW monthly SINK TO monthly_sink EXPIRE AFTER {expire} AS {OK}"
        ));
        assert!(err.contains("month"), "{expire}: {err}");
    }

    // Queries a flow cannot maintain.
    let unsupported = [
        (
            "SELECT host, ts, row_number() OVER (PARTITION BY host ORDER BY ts) AS r FROM requests",
            "window",
        ),
        (
            "SELECT r.host, count(*) AS n FROM requests r JOIN hosts_info h ON r.host > h.host \
             GROUP BY r.host",
            "a join without an equality",
        ),
        (
            "SELECT host, count(*) AS n FROM requests GROUP BY host ORDER BY n",
            "ORDER BY",
        ),
        ("SELECT host, status, ts FROM requests LIMIT 3", "LIMIT"),
        (
            "SELECT host, count(*) AS n FROM requests \
             WHERE ts > now() - INTERVAL '1 hour' OR status = 500 GROUP BY host",
            "now()",
        ),
        ("SELECT host, now() AS seen FROM requests", "now()"),
    ];
    for (query, what) in unsupported {
        let err = s.sql_err(&format!("CREATE FLOW nope SINK TO nope_sink AS {query}"));
        assert!(err.contains("not supported in flows"), "{query}: {err}");
        assert!(err.contains(what), "{query}: {err}");
    }

    // A query over a missing table.
    let err = s.sql_err(
        "CREATE FLOW ghostly SINK TO ghostly_sink AS SELECT x, count(*) FROM no_such_table GROUP BY x",
    );
    assert!(err.contains("no_such_table"), "{err}");

    // Only the one valid flow exists.
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["a_to_b"]);

    // DROP FLOW of a missing flow.
    let err = s.sql_err("DROP FLOW ghost");
    assert!(err.contains("ghost"), "{err}");
    s.sql("DROP FLOW IF EXISTS ghost");

    // As in GreptimeDB, a flow's tables may be dropped: the flow stops and
    // says which table went, until DROP FLOW (or CREATE OR REPLACE).
    s.sql("DROP TABLE b");
    assert_eq!(flow_info(&s, "a_to_b", "status"), "failed");
    let why = flow_info(&s, "a_to_b", "last_error");
    assert!(why.contains("sink table 'public.b'"), "{why}");
    let err = s.sql_err("ADMIN FLUSH_FLOW('a_to_b')");
    assert!(err.contains("was dropped"), "{err}");
    s.sql("DROP TABLE a");
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["a_to_b"]);
    s.sql("DROP FLOW a_to_b");
    assert_eq!(s.sql("SHOW FLOWS"), "");
    let tables = lines(&s.sql("SHOW TABLES"));
    assert!(!tables.contains(&"a".to_string()), "{tables:?}");
    assert!(!tables.contains(&"b".to_string()), "{tables:?}");
    assert_eq!(s.sql("SELECT 1"), "1");
}

// Sink tables: the auto-created schema (columns, DataFusion display names
// such as "count(*)", primary key, time index, update_at,
// __ts_placeholder), and existing sinks accepted by name (with a lossless
// INT -> BIGINT cast), by position, with a trailing tick column, or
// rejected with the mismatched column named.
#[test]
fn sink_tables_auto_created_and_existing() {
    let s = Server::start();
    s.sql(REQUESTS);

    // Unaliased aggregates keep DataFusion's names.
    const TRAFFIC: &str = "SELECT status, count(*), sum(bytes), \
                           date_bin(INTERVAL '1 minute', ts) AS minute \
                           FROM requests GROUP BY status, minute";
    s.sql(&format!(
        "CREATE FLOW traffic SINK TO traffic_sink AS {TRAFFIC}"
    ));
    assert_eq!(
        desc(&s, "traffic_sink"),
        vec![
            "status|Int32|PRI|TAG",
            "count(*)|Int64||FIELD",
            "sum(requests.bytes)|Float64||FIELD",
            "minute|TimestampMillisecond|PRI|TIMESTAMP",
            "update_at|TimestampMillisecond||FIELD",
        ]
    );
    let ddl = s.sql("SHOW CREATE TABLE traffic_sink");
    assert!(ddl.contains("TIME INDEX (\"minute\")"), "{ddl}");
    assert!(ddl.contains("PRIMARY KEY (\"status\")"), "{ddl}");
    assert_eq!(
        s.sql(
            "SELECT column_name FROM information_schema.columns \
             WHERE table_name = 'traffic_sink' ORDER BY ordinal_position"
        ),
        "status\ncount(*)\nsum(requests.bytes)\nminute\nupdate_at"
    );

    // No timestamp among the keys: __ts_placeholder is the time index.
    const HOSTS: &str = "SELECT host, count(*) AS n FROM requests GROUP BY host";
    s.sql(&format!("CREATE FLOW hosts SINK TO hosts_sink AS {HOSTS}"));
    assert_eq!(
        desc(&s, "hosts_sink"),
        vec![
            "host|String|PRI|TAG",
            "n|Int64||FIELD",
            "update_at|TimestampMillisecond||FIELD",
            "__ts_placeholder|TimestampMillisecond|PRI|TIMESTAMP",
        ]
    );

    // Two timestamp keys: the first one is the time index, the second a key.
    const CLASSES: &str = "SELECT date_bin(INTERVAL '1 hour', ts) AS hour, status / 100 AS class, \
                           date_bin(INTERVAL '1 minute', ts) AS minute, max(bytes) AS hi \
                           FROM requests GROUP BY hour, class, minute";
    s.sql(&format!(
        "CREATE FLOW classes SINK TO classes_sink AS {CLASSES}"
    ));
    let ddl = s.sql("SHOW CREATE TABLE classes_sink");
    assert!(ddl.contains("TIME INDEX (\"hour\")"), "{ddl}");
    assert!(ddl.contains("PRIMARY KEY (\"class\", \"minute\")"), "{ddl}");

    // Existing sinks: by name with INT -> BIGINT, by position, with a tick column.
    const HITS: &str =
        "SELECT status, count(*) AS hits, date_bin(INTERVAL '1 minute', ts) AS minute \
                        FROM requests GROUP BY status, minute";
    s.sql(
        "CREATE TABLE by_name (status BIGINT, hits BIGINT, minute TIMESTAMP(3) TIME INDEX, \
         PRIMARY KEY (status))",
    );
    s.sql(&format!(
        "CREATE FLOW into_by_name SINK TO by_name AS {HITS}"
    ));
    s.sql(
        "CREATE TABLE by_pos (code INT, n BIGINT, w TIMESTAMP(3) TIME INDEX, PRIMARY KEY (code))",
    );
    s.sql(&format!("CREATE FLOW into_by_pos SINK TO by_pos AS {HITS}"));
    s.sql(
        "CREATE TABLE with_tick (host STRING, n BIGINT, seen TIMESTAMP(3), \
         __ts_placeholder TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))",
    );
    s.sql(&format!(
        "CREATE FLOW into_with_tick SINK TO with_tick AS {HOSTS}"
    ));
    assert_eq!(
        desc(&s, "by_name")[0],
        "status|Int64|PRI|TAG",
        "an existing sink is not altered"
    );

    // Mismatches are refused at CREATE, naming the column.
    s.sql(
        "CREATE TABLE lossy (host STRING, total INT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
    );
    let err = s.sql_err(
        "CREATE FLOW into_lossy SINK TO lossy AS \
         SELECT host, sum(bytes) AS total FROM requests GROUP BY host",
    );
    assert!(err.contains("total"), "DOUBLE into INT: {err}");
    s.sql("CREATE TABLE wrong (host STRING, label STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    let err = s.sql_err(
        "CREATE FLOW into_wrong SINK TO wrong AS \
         SELECT host, count(*) AS hits FROM requests GROUP BY host",
    );
    assert!(err.contains("label") || err.contains("hits"), "{err}");
    s.sql("CREATE TABLE short (host STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    let err = s.sql_err(
        "CREATE FLOW into_short SINK TO short AS \
         SELECT host, count(*) AS hits FROM requests GROUP BY host",
    );
    assert!(err.contains("hits"), "{err}");
    assert_eq!(
        lines(&s.sql("SHOW FLOWS")),
        vec![
            "classes",
            "hosts",
            "into_by_name",
            "into_by_pos",
            "into_with_tick",
            "traffic"
        ]
    );

    // All of them hold the right rows.
    put(
        &s,
        &[
            ("a", 200, "1.5", "00:00:01"),
            ("b", 200, "2", "00:00:02"),
            ("a", 404, "NULL", "00:01:03"),
            ("c", 503, "8", "01:02:04"),
        ],
    );
    for f in [
        "traffic",
        "hosts",
        "classes",
        "into_by_name",
        "into_by_pos",
        "into_with_tick",
    ] {
        flush(&s, f);
    }
    assert_same(
        &s,
        "SELECT status, \"count(*)\", \"sum(requests.bytes)\", minute FROM traffic_sink \
         ORDER BY minute, status",
        &format!("{TRAFFIC} ORDER BY minute, status"),
    );
    assert_eq!(
        s.sql("SELECT count(*) FROM traffic_sink WHERE update_at IS NULL"),
        "0"
    );
    assert_same(
        &s,
        "SELECT host, n FROM hosts_sink ORDER BY host",
        &format!("{HOSTS} ORDER BY host"),
    );
    assert_eq!(
        s.sql("SELECT DISTINCT CAST(__ts_placeholder AS BIGINT) FROM hosts_sink"),
        "0"
    );
    assert_same(
        &s,
        "SELECT hour, class, minute, hi FROM classes_sink ORDER BY hour, class, minute",
        &format!("{CLASSES} ORDER BY hour, class, minute"),
    );
    assert_eq!(
        s.sql("SELECT status, hits, minute FROM by_name ORDER BY minute, status"),
        format!(
            "200|2|{}\n404|1|{}\n503|1|{}",
            at("00:00:00"),
            at("00:01:00"),
            at("01:02:00")
        )
    );
    assert_same(
        &s,
        "SELECT status, hits, minute FROM by_name ORDER BY minute, status",
        &format!("{HITS} ORDER BY minute, status"),
    );
    assert_same(
        &s,
        "SELECT code, n, w FROM by_pos ORDER BY w, code",
        &format!("{HITS} ORDER BY minute, status"),
    );
    assert_same(
        &s,
        "SELECT host, n FROM with_tick ORDER BY host",
        &format!("{HOSTS} ORDER BY host"),
    );
    assert_eq!(
        s.sql("SELECT count(*) FROM with_tick WHERE seen IS NULL"),
        "0",
        "the trailing timestamp column carries the tick time"
    );

    // A time index the query does not give is 0, not the tick time: an update
    // replaces the sink row it retracts instead of adding one per tick.
    s.sql(
        "CREATE TABLE keyed_tick (host STRING, n BIGINT, ts TIMESTAMP(3) TIME INDEX, \
         PRIMARY KEY (host))",
    );
    s.sql(&format!(
        "CREATE FLOW into_keyed_tick SINK TO keyed_tick AS {HOSTS}"
    ));
    flush(&s, "into_keyed_tick");
    put(
        &s,
        &[("a", 500, "3", "00:02:00"), ("d", 200, "1", "00:02:01")],
    );
    flush(&s, "into_keyed_tick");
    s.sql("DELETE FROM requests WHERE host = 'b'");
    flush(&s, "into_keyed_tick");
    assert_same(
        &s,
        "SELECT host, n FROM keyed_tick ORDER BY host",
        &format!("{HOSTS} ORDER BY host"),
    );
    assert_eq!(
        s.sql("SELECT DISTINCT CAST(ts AS BIGINT) FROM keyed_tick"),
        "0"
    );
}

// SHOW FLOWS [LIKE], SHOW CREATE FLOW (two columns), information_schema.flows
// (every column exists; status, sink, expire_after in seconds for each
// interval spelling, comment, options, state size, times), and DROP FLOW
// keeping its sink and rows; the sink can then take a new flow.
#[test]
fn show_information_schema_and_drop() {
    let s = Server::start();
    s.sql(REQUESTS);
    const DAILY: &str = "SELECT host, date_bin(INTERVAL '1 day', ts) AS day, count(*) AS n \
                         FROM requests GROUP BY host, day";
    const PLAIN: &str =
        "SELECT host, count(*) AS n, sum(bytes) AS total FROM requests GROUP BY host";
    s.sql(&format!(
        "CREATE FLOW daily SINK TO per_day EXPIRE AFTER '2 days 1h 2 min' COMMENT 'per day' AS {DAILY}"
    ));
    s.sql(&format!(
        "CREATE FLOW hourly SINK TO per_hour EXPIRE AFTER INTERVAL '1 hour' AS {DAILY}"
    ));
    s.sql(&format!(
        "CREATE FLOW recent SINK TO per_recent EXPIRE AFTER '5 minutes' AS {DAILY}"
    ));
    s.sql(&format!(
        "CREATE FLOW secs SINK TO per_secs EXPIRE AFTER '300 s' AS {DAILY}"
    ));
    s.sql(&format!(
        "CREATE FLOW plain SINK TO per_host WITH (backfill = 'false') AS {PLAIN}"
    ));

    assert_eq!(
        lines(&s.sql("SHOW FLOWS")),
        vec!["daily", "hourly", "plain", "recent", "secs"]
    );
    assert_eq!(
        lines(&s.sql("SHOW FLOWS LIKE '%ly'")),
        vec!["daily", "hourly"]
    );
    assert_eq!(lines(&s.sql("SHOW FLOWS LIKE 'p%'")), vec!["plain"]);
    assert_eq!(s.sql("SHOW FLOWS LIKE 'zzz%'"), "");

    // SHOW CREATE FLOW: (Flow, Create Flow).
    let out = s
        .psql_args(&[
            "-c",
            "\\pset tuples_only off",
            "-c",
            "SHOW CREATE FLOW daily",
        ])
        .expect("SHOW CREATE FLOW");
    assert!(out.contains("Flow|Create Flow"), "{out}");
    let text = s.sql("SHOW CREATE FLOW daily");
    assert!(text.starts_with("daily|"), "{text}");
    assert!(text.contains("CREATE FLOW"), "{text}");
    // As GreptimeDB prints it: the sink with its database, intervals in
    // seconds, the query as the parser writes it back.
    assert!(text.contains("SINK TO public.per_day"), "{text}");
    assert!(text.contains("EXPIRE AFTER '176520 s'"), "{text}");
    assert!(text.contains(DAILY), "{text}");
    let lower = s.sql(
        "CREATE FLOW lower_case SINK TO per_lower AS select host, count(*) as n from requests \
         where   status > 1 group by host",
    );
    assert_eq!(lower, "CREATE FLOW");
    let text = s.sql("SHOW CREATE FLOW lower_case");
    assert!(
        text.contains("AS SELECT host, count(*) AS n FROM requests WHERE status > 1 GROUP BY host"),
        "{text}"
    );
    assert_eq!(
        flow_info(&s, "lower_case", "source_table_names"),
        "greptime.public.requests"
    );
    s.sql("DROP FLOW lower_case");
    s.sql_err("SHOW CREATE FLOW ghost");

    // Every column is there.
    let all = s.sql(
        "SELECT flow_name, flow_id, state_size, table_catalog, flow_definition, comment, \
         expire_after, source_table_ids, sink_table_name, flownode_ids, options, created_time, \
         updated_time, last_execution_time, source_table_names, status, last_error, \
         rows_written, failures, restarts, lag_ms, next_restart_time \
         FROM information_schema.flows",
    );
    assert!(!all.is_empty());
    // Healthy flows: nothing failed or restarted, nothing planned.
    assert_eq!(
        s.sql(
            "SELECT count(*) FROM information_schema.flows WHERE failures = 0 AND restarts = 0 \
             AND lag_ms >= 0 AND next_restart_time IS NULL"
        ),
        "5"
    );
    assert_eq!(
        s.sql(
            "SELECT flow_name, status, expire_after, comment FROM information_schema.flows \
             ORDER BY flow_name"
        ),
        "daily|running|176520|per day\nhourly|running|3600|\nplain|running||\n\
         recent|running|300|\nsecs|running|300|"
    );
    // expire_after is a number of seconds (bigint).
    assert_eq!(flow_info(&s, "recent", "expire_after + 1"), "301");
    assert_eq!(
        s.sql("SELECT count(DISTINCT flow_id) FROM information_schema.flows"),
        "5"
    );
    for (flow, sink) in [("daily", "per_day"), ("plain", "per_host")] {
        let got = flow_info(&s, flow, "sink_table_name");
        assert!(
            got == sink || got.ends_with(&format!(".{sink}")),
            "{flow}: sink_table_name {got:?}"
        );
        let sources = flow_info(&s, flow, "source_table_names");
        assert!(sources.contains("requests"), "{flow}: {sources}");
        let def = flow_info(&s, flow, "flow_definition");
        assert!(def.contains("FROM requests GROUP BY host"), "{flow}: {def}");
        assert_eq!(flow_info(&s, flow, "last_error"), "", "{flow}");
        assert!(!flow_info(&s, flow, "table_catalog").is_empty(), "{flow}");
        assert!(!flow_info(&s, flow, "created_time").is_empty(), "{flow}");
    }
    let options = flow_info(&s, "plain", "options");
    assert!(options.contains("backfill"), "{options}");

    // The plain flow at work, then its state and last execution.
    put(
        &s,
        &[
            ("a", 200, "1", "00:00:00"),
            ("b", 200, "2", "00:00:01"),
            ("a", 500, "3", "00:00:02"),
        ],
    );
    flush(&s, "plain");
    let sink = "SELECT host, n, total FROM per_host ORDER BY host";
    let oracle = format!("SELECT host, n, total FROM ({PLAIN}) ORDER BY host");
    assert_eq!(s.sql(sink), "a|2|4.0\nb|1|2.0");
    assert_same(&s, sink, &oracle);
    let size: i64 = flow_info(&s, "plain", "state_size")
        .parse()
        .expect("state_size is a number");
    assert!(size > 0, "state_size {size}");
    assert!(!flow_info(&s, "plain", "last_execution_time").is_empty());

    // DROP FLOW: gone from SHOW FLOWS and information_schema, sink and rows stay.
    let before = s.sql(sink);
    s.sql("DROP FLOW plain");
    assert_eq!(
        lines(&s.sql("SHOW FLOWS")),
        vec!["daily", "hourly", "recent", "secs"]
    );
    assert_eq!(
        s.sql("SELECT count(*) FROM information_schema.flows WHERE flow_name = 'plain'"),
        "0"
    );
    assert_eq!(s.sql(sink), before);
    s.sql_err("ADMIN FLUSH_FLOW('plain')");
    put(&s, &[("c", 200, "5", "00:00:03")]);
    assert_eq!(s.sql(sink), before, "no flow writes to it any more");
    s.sql("DROP FLOW IF EXISTS plain");

    // The kept sink (with its update_at and placeholder) takes a new flow,
    // which back-fills by default.
    s.sql(&format!("CREATE FLOW plain SINK TO per_host AS {PLAIN}"));
    flush(&s, "plain");
    assert_eq!(s.sql(sink), "a|2|4.0\nb|1|2.0\nc|1|5.0");
    assert_same(&s, sink, &oracle);
}

// Automatic ticking (--flow-tick-interval 100ms): sink changes arrive
// without any FLUSH_FLOW, for inserts and for deletes.
#[test]
fn ticks_write_results_without_flush() {
    let s = Server::start_with_args(&["--flow-tick-interval", "100ms"]);
    s.sql(REQUESTS);
    s.sql(
        "CREATE FLOW auto SINK TO auto_sink AS \
         SELECT host, count(*) AS n, sum(bytes) AS total FROM requests GROUP BY host",
    );
    let sink = "SELECT host, n, total FROM auto_sink ORDER BY host";
    put(
        &s,
        &[
            ("a", 200, "1", "00:00:00"),
            ("a", 500, "2", "00:00:01"),
            ("b", 200, "4", "00:00:02"),
        ],
    );
    let want = "a|2|3.0\nb|1|4.0";
    assert_eq!(
        wait_for(&s, sink, want, Duration::from_secs(10)),
        want,
        "no tick within 10 s"
    );
    s.sql("DELETE FROM requests WHERE host = 'b'");
    put(&s, &[("c", 200, "8", "00:00:03")]);
    let want = "a|2|3.0\nc|1|8.0";
    assert_eq!(wait_for(&s, sink, want, Duration::from_secs(10)), want);
    assert!(!flow_info(&s, "auto", "last_execution_time").is_empty());
}

/// array_agg's lists in a sink, as psql, psycopg and HTTP show them, after
/// inserts, an upsert and a delete; and through a restart.
#[test]
fn array_agg_lists_reach_every_client() {
    let s = Server::start();
    s.sql(REQUESTS);
    s.sql(
        "CREATE FLOW seqs SINK TO seq_sink AS SELECT host, array_agg(status ORDER BY ts) AS codes, \
         array_agg(DISTINCT bytes) AS sizes FROM requests GROUP BY host",
    );
    put(
        &s,
        &[
            ("a", 200, "1.5", "00:00:00"),
            ("a", 500, "NULL", "00:00:01"),
            ("b", 404, "4", "00:00:02"),
        ],
    );
    flush(&s, "seqs");
    let sink = "SELECT host, codes, sizes FROM seq_sink ORDER BY host";
    assert_eq!(s.sql(sink), "a|{200,500}|{1.5,NULL}\nb|{404}|{4.0}");
    // An upsert replaces (a, 200)'s bytes; b's row goes.
    put(&s, &[("a", 200, "3", "00:00:00")]);
    s.sql("DELETE FROM requests WHERE host = 'b'");
    flush(&s, "seqs");
    assert_eq!(s.sql(sink), "a|{200,500}|{3.0,NULL}");
    let (status, json) = s.http_sql(sink);
    assert_eq!(status, 200, "{json}");
    let records = &json["output"][0]["records"];
    assert_eq!(
        records["rows"],
        serde_json::json!([["a", [200, 500], [3.0, null]]])
    );
    assert_eq!(
        records["schema"]["column_schemas"][1]["data_type"],
        "List<Int32>"
    );
    let py = sandflow_tests::harness::run_python(
        "import os, psycopg\n\
         c = psycopg.connect(host='127.0.0.1', port=os.environ['PGPORT'], user='sandflow', \
         dbname='public', sslmode='disable')\n\
         print(c.execute('SELECT codes, sizes FROM seq_sink').fetchall())",
        s.pg_port,
    );
    assert_eq!(
        py.as_deref().map(str::trim),
        Ok("[([200, 500], [3.0, None])]")
    );
    let s = s.restart();
    assert_eq!(s.sql(sink), "a|{200,500}|{3.0,NULL}");
    put(&s, &[("a", 503, "2", "00:00:09")]);
    flush(&s, "seqs");
    assert_eq!(s.sql(sink), "a|{200,500,503}|{2.0,3.0,NULL}");
}

// Flows survive a clean restart: definitions, status, sink rows, and rows
// written before the stop but never flushed are processed afterwards,
// exactly once (no double back-fill).
#[test]
fn flows_survive_restarts() {
    let s = Server::start();
    s.sql(REQUESTS);
    const AGG: &str = "SELECT status, date_bin(INTERVAL '1 minute', ts) AS minute, \
                       count(*) AS hits, sum(bytes) AS total FROM requests GROUP BY status, minute";
    const FILTER: &str = "SELECT host, status, ts FROM requests WHERE status >= 500";
    s.sql(&format!(
        "CREATE FLOW traffic SINK TO traffic_sink COMMENT 'kept' AS {AGG}"
    ));
    s.sql(&format!(
        "CREATE FLOW errors SINK TO errors_sink AS {FILTER}"
    ));
    let agg_sink = "SELECT status, minute, hits, total FROM traffic_sink ORDER BY minute, status";
    let agg_oracle =
        format!("SELECT status, minute, hits, total FROM ({AGG}) ORDER BY minute, status");
    let filter_sink = "SELECT host, status, ts FROM errors_sink ORDER BY ts, host, status";
    let filter_oracle = format!("{FILTER} ORDER BY ts, host, status");
    let check = |s: &Server| {
        flush(s, "traffic");
        flush(s, "errors");
        assert_same(s, agg_sink, &agg_oracle);
        assert_same(s, filter_sink, &filter_oracle);
    };

    put(
        &s,
        &[
            ("a", 200, "1", "00:00:00"),
            ("b", 500, "2", "00:00:10"),
            ("c", 503, "4", "00:01:10"),
        ],
    );
    check(&s);
    let show_traffic = s.sql("SHOW CREATE FLOW traffic");
    let show_errors = s.sql("SHOW CREATE FLOW errors");
    // Written but not flushed before the stop.
    put(
        &s,
        &[("a", 500, "8", "00:01:20"), ("b", 500, "3", "00:00:10")],
    );
    s.sql("DELETE FROM requests WHERE host = 'c'");

    let s = s.restart();
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["errors", "traffic"]);
    assert_eq!(s.sql("SHOW CREATE FLOW traffic"), show_traffic);
    assert_eq!(s.sql("SHOW CREATE FLOW errors"), show_errors);
    assert_eq!(flow_info(&s, "traffic", "comment"), "kept");
    check(&s);
    assert_eq!(
        s.sql(agg_sink),
        [
            format!("200|{}|1|1.0", at("00:00:00")),
            format!("500|{}|1|3.0", at("00:00:00")),
            format!("500|{}|1|8.0", at("00:01:00")),
        ]
        .join("\n")
    );
    for f in ["traffic", "errors"] {
        assert_eq!(flow_info(&s, f, "status"), "running", "{f}");
    }
    put(
        &s,
        &[("d", 404, "16", "00:02:00"), ("d", 504, "32", "00:02:00")],
    );
    check(&s);

    // After a clean restart the flows keep going.
    put(&s, &[("e", 500, "64", "00:03:00")]);
    s.sql("DELETE FROM requests WHERE host = 'a'");
    check(&s);
    // A crash (kill -9) between a source write and the flow's write-back is
    // the durable-state issue's subject: until flows persist their state and
    // source positions with their sink writes, a restart rebuilds from the
    // sources and cannot retract a sink row whose source rows were deleted
    // while the server was down.
}

// A flow over its memory_limit is marked failed in information_schema.flows
// with a memory error and FLUSH_FLOW on it fails, while another flow on the
// same server keeps giving correct results and the server keeps answering.
#[test]
fn a_flow_over_its_memory_limit_fails_alone() {
    let s = Server::start();
    s.sql(REQUESTS);
    s.sql("CREATE TABLE big (s STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (s))");
    const GOOD: &str =
        "SELECT host, count(*) AS n, sum(bytes) AS total FROM requests GROUP BY host";
    s.sql(&format!("CREATE FLOW good SINK TO good_sink AS {GOOD}"));
    s.sql(
        "CREATE FLOW hog SINK TO hog_sink WITH (memory_limit = '24MiB') AS \
         SELECT date_bin(INTERVAL '1 day', ts) AS day, count(DISTINCT s) AS d FROM big GROUP BY day",
    );
    let good_sink = "SELECT host, n, total FROM good_sink ORDER BY host";
    let good_oracle = format!("SELECT host, n, total FROM ({GOOD}) ORDER BY host");
    put(
        &s,
        &[("a", 200, "1", "00:00:00"), ("b", 200, "2", "00:00:01")],
    );
    flush(&s, "good");
    assert_eq!(s.sql(good_sink), "a|1|1.0\nb|1|2.0");

    const ROWS: u32 = 2000;
    let mut failed = false;
    for round in 0..120u32 {
        let values: Vec<String> = (0..ROWS)
            .map(|i| {
                let pad: String = (0..488u32)
                    .map(|k| (b'a' + ((k * 7 + i * 13 + round) % 26) as u8) as char)
                    .collect();
                let ts = 1_704_067_200_000u64 + u64::from(round * ROWS + i);
                format!("('{round:05}-{i:05}-{pad}', {ts})")
            })
            .collect();
        let out = sql_file(
            &s,
            &format!("INSERT INTO big VALUES {};", values.join(", ")),
        )
        .unwrap_or_else(|e| panic!("insert round {round}: {e}\n{}", s.logs()));
        assert!(out.contains(&format!("INSERT 0 {ROWS}")), "{out}");
        let flushed = s.psql("ADMIN FLUSH_FLOW('hog')");
        if round == 0 {
            assert!(flushed.is_ok(), "first flush: {flushed:?}");
            assert_same(
                &s,
                "SELECT d FROM hog_sink",
                "SELECT count(DISTINCT s) FROM big",
            );
        }
        if flow_info(&s, "hog", "status") == "failed" {
            failed = true;
            break;
        }
        // A failed flush must mean a failed flow.
        assert!(flushed.is_ok(), "round {round}: {flushed:?}");
    }
    assert!(
        failed,
        "a flow holding ~120 MB of distinct strings must exceed 24 MiB"
    );
    let error = flow_info(&s, "hog", "last_error");
    assert!(error.contains("memory limit"), "{error}");
    s.sql_err("ADMIN FLUSH_FLOW('hog')");

    // Everything else is fine.
    assert_eq!(s.sql("SELECT 1"), "1");
    assert_eq!(lines(&s.sql("SHOW FLOWS")), vec!["good", "hog"]);
    assert_eq!(flow_info(&s, "good", "status"), "running");
    assert_eq!(flow_info(&s, "good", "last_error"), "");
    put(
        &s,
        &[("a", 500, "4", "00:00:02"), ("c", 200, "8", "00:00:03")],
    );
    s.sql("DELETE FROM requests WHERE host = 'b'");
    flush(&s, "good");
    assert_eq!(s.sql(good_sink), "a|2|5.0\nc|1|8.0");
    assert_same(&s, good_sink, &good_oracle);
    // Writes to the failed flow's source are still accepted.
    assert_eq!(
        s.sql("INSERT INTO big VALUES ('after', 1704067200000)"),
        "INSERT 0 1"
    );
    assert_eq!(flow_info(&s, "hog", "status"), "failed");
}

// GreptimeDB's flow-only source: WITH ('ttl' = 'instant') keeps no rows, yet
// its flows see every write, also across a kill -9 before they ticked. Upserts
// replace nothing (there is no stored row), deletes find nothing.
#[test]
fn instant_ttl_tables_only_feed_their_flows() {
    let mut s = Server::start();
    s.sql(
        "CREATE TABLE temp_sensor_data (sensor_id INT, loc STRING, temperature DOUBLE, \
         ts TIMESTAMP TIME INDEX, PRIMARY KEY(sensor_id, loc)) WITH ('ttl' = 'instant')",
    );
    assert!(
        s.sql("SHOW CREATE TABLE temp_sensor_data")
            .contains("ttl = 'instant'"),
        "the option is kept"
    );
    s.sql(
        "CREATE FLOW temp_monitoring SINK TO temp_alerts AS \
         SELECT sensor_id, loc, max(temperature) AS max_temp, count(*) AS n, \
         date_bin(INTERVAL '10 seconds', ts) AS time_window \
         FROM temp_sensor_data GROUP BY sensor_id, loc, time_window",
    );
    let sink = "SELECT sensor_id, loc, max_temp, n, time_window FROM temp_alerts \
                ORDER BY sensor_id, time_window";
    // Nothing is stored: 0 rows affected, as GreptimeDB reports.
    assert_eq!(
        s.sql(
            "INSERT INTO temp_sensor_data VALUES \
             (1, 'room1', 98.5, '2022-01-01 00:00:00'), (2, 'room2', 99.5, '2022-01-01 00:00:01')",
        ),
        "INSERT 0 0"
    );
    assert_eq!(s.sql("SELECT count(*) FROM temp_sensor_data"), "0");
    flush(&s, "temp_monitoring");
    assert_eq!(
        s.sql(sink),
        "1|room1|98.5|1|2022-01-01 00:00:00.000000\n2|room2|99.5|1|2022-01-01 00:00:00.000000"
    );
    // The same key again: nothing stored to replace, so the flow counts it too.
    s.sql("INSERT INTO temp_sensor_data VALUES (1, 'room1', 101.5, '2022-01-01 00:00:00')");
    assert_eq!(
        s.sql("DELETE FROM temp_sensor_data WHERE sensor_id = 2"),
        "DELETE 0"
    );
    // Written, then killed, perhaps before the flow ticked: it still gets the row.
    s.sql("INSERT INTO temp_sensor_data VALUES (2, 'room2', 90, '2022-01-01 00:00:12')");
    let dir = s.dir();
    s.kill9();
    let s = Server::start_in(dir);
    flush(&s, "temp_monitoring");
    assert_eq!(
        s.sql(sink),
        "1|room1|101.5|2|2022-01-01 00:00:00.000000\n\
         2|room2|99.5|1|2022-01-01 00:00:00.000000\n\
         2|room2|90.0|1|2022-01-01 00:00:10.000000"
    );
    assert_eq!(s.sql("SELECT count(*) FROM temp_sensor_data"), "0");

    // A ttl that is no duration is refused, saying why.
    let err =
        s.sql_err("CREATE TABLE kept (v DOUBLE, ts TIMESTAMP TIME INDEX) WITH (ttl = '1 month')");
    assert!(err.contains("ttl") && err.contains("month"), "{err}");
    s.sql("CREATE TABLE forever (v DOUBLE, ts TIMESTAMP TIME INDEX) WITH (ttl = 'forever')");
    s.sql("INSERT INTO forever VALUES (1, '2022-01-01 00:00:00')");
    assert_eq!(s.sql("SELECT count(*) FROM forever"), "1");
}

// WITH (ttl = '10s'): rows older than now - ttl expire (checked every second
// here: a tenth of the ttl, at least 1 s). As with GreptimeDB, expiry is not a
// DELETE: flows keep what they computed from the expired rows.
#[test]
fn ttl_expires_old_rows_and_flows_keep_their_results() {
    let s = Server::start();
    s.sql(
        "CREATE TABLE readings (id INT, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (id)) \
         WITH (ttl = '10s')",
    );
    let ddl = s.sql("SHOW CREATE TABLE readings");
    assert!(ddl.contains("ttl = '10s'"), "{ddl}");
    s.sql(
        "CREATE FLOW totals SINK TO totals_sink AS SELECT count(*) AS n, sum(v) AS s FROM readings",
    );
    let future = now_ms() + 3_600_000;
    s.sql(&format!(
        "INSERT INTO readings VALUES (1, 1.0, '2022-01-01 00:00:00'), (2, 2.0, {future})"
    ));
    flush(&s, "totals");
    assert_eq!(s.sql("SELECT n, s FROM totals_sink"), "2|3.0");
    assert_eq!(
        wait_for(
            &s,
            "SELECT id FROM readings ORDER BY id",
            "2",
            Duration::from_secs(20)
        ),
        "2",
        "the 2022 row expires, the future one stays"
    );
    flush(&s, "totals");
    assert_eq!(
        s.sql("SELECT n, s FROM totals_sink"),
        "2|3.0",
        "expiry is not a delete"
    );
    s.sql(&format!("INSERT INTO readings VALUES (3, 4.0, {future})"));
    flush(&s, "totals");
    assert_eq!(s.sql("SELECT n, s FROM totals_sink"), "3|7.0");
}

// EXPLAIN of a DELETE or an INSERT writes nothing through either front door
// (rows, sink and the flow's input unchanged); EXPLAIN ANALYZE runs the
// statement once.
#[test]
fn explain_writes_nothing_on_either_door() {
    let s = Server::start();
    s.sql("CREATE TABLE t (k INT, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))");
    s.sql("CREATE FLOW f SINK TO f_out AS SELECT count(*) AS n, sum(v) AS total FROM t");
    s.sql("INSERT INTO t VALUES (1, 1.0, 0), (2, 2.0, 0), (3, 3.0, 0)");
    assert_eq!(flush(&s, "f"), 1);
    let explains = [
        "EXPLAIN DELETE FROM t WHERE k = 2",
        "EXPLAIN DELETE FROM t",
        "EXPLAIN INSERT INTO t VALUES (9, 9.0, 0)",
    ];
    for sql in explains {
        let plan = s.sql(sql);
        assert!(plan.contains("physical_plan"), "{sql}: {plan}");
        let (status, v) = s.http_sql(sql);
        assert_eq!(status, 200, "{sql}: {v}");
    }
    assert_eq!(flush(&s, "f"), 0, "the flow read no change");
    assert_eq!(s.sql("SELECT count(*), sum(v) FROM t"), "3|6.0");
    assert_eq!(s.sql("SELECT n, total FROM f_out"), "3|6.0");
    // EXPLAIN ANALYZE: once through psql, once through HTTP.
    // (A flush after each: the flow may tick by itself between the two, and
    // FLUSH_FLOW counts the sink rows written since the previous flush.)
    s.sql("EXPLAIN ANALYZE DELETE FROM t WHERE k = 2");
    assert_eq!(flush(&s, "f"), 1);
    let (status, v) = s.http_sql("EXPLAIN ANALYZE INSERT INTO t VALUES (9, 9.0, 0)");
    assert_eq!(status, 200, "{v}");
    assert_eq!(flush(&s, "f"), 1);
    assert_eq!(
        s.sql("SELECT k FROM t ORDER BY k"),
        "1\n3\n9",
        "one delete, one insert"
    );
    assert_eq!(s.sql("SELECT n, total FROM f_out"), "3|13.0");
}

// Measurements joined to a dimension table through psql: GROUP BY the
// dimension's region; an upsert of a dimension row moves every affected
// group after a flush, and a delete of it takes its rows out.
#[test]
fn joined_to_a_dimension_table_over_psql() {
    let s = Server::start();
    s.sql(REQUESTS);
    s.sql(
        "CREATE TABLE hosts (host STRING, region STRING, ts TIMESTAMP TIME INDEX, \
         PRIMARY KEY (host))",
    );
    s.sql(
        "CREATE FLOW per_region SINK TO per_region_sink AS \
         SELECT h.region, count(*) AS n, sum(r.bytes) AS total \
         FROM requests r JOIN hosts h ON r.host = h.host GROUP BY h.region",
    );
    s.sql("INSERT INTO hosts VALUES ('a', 'eu', 0), ('b', 'eu', 0), ('c', 'us', 0)");
    put(
        &s,
        &[
            ("a", 200, "1", "00:00:00"),
            ("a", 500, "2", "00:00:01"),
            ("b", 200, "4", "00:00:02"),
            ("c", 200, "8", "00:00:03"),
            ("d", 200, "16", "00:00:04"),
        ],
    );
    flush(&s, "per_region");
    let sink = "SELECT region, n, total FROM per_region_sink ORDER BY region";
    let oracle = "SELECT h.region, count(*) AS n, sum(r.bytes) AS total FROM requests r \
                  JOIN hosts h ON r.host = h.host GROUP BY h.region ORDER BY h.region";
    assert_eq!(assert_same(&s, sink, oracle), "eu|3|7.0\nus|1|8.0");
    // Host a moves to us: both groups move.
    s.sql("INSERT INTO hosts VALUES ('a', 'us', 0)");
    flush(&s, "per_region");
    assert_eq!(assert_same(&s, sink, oracle), "eu|1|4.0\nus|3|11.0");
    // Host d appears in a new region; host b goes.
    s.sql("INSERT INTO hosts VALUES ('d', 'ap', 0)");
    s.sql("DELETE FROM hosts WHERE host = 'b'");
    flush(&s, "per_region");
    assert_eq!(assert_same(&s, sink, oracle), "ap|1|16.0\nus|3|11.0");
}
