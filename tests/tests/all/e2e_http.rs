//! End-to-end: the real binary over HTTP (/v1/sql, InfluxDB line protocol,
//! /health, /metrics).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sandflow_tests::harness::{poll_until, temp_data_dir, url_encode, Conn, Options, Server};
use serde_json::json;

/// A query that runs for hours unless it is stopped.
const ENDLESS_QUERY: &str = "SELECT count(*) FROM range(1000000000000) WHERE value % 7 = 3";

/// Opens a connection and sends a `POST /v1/sql` of `sql` on it, without
/// waiting for the answer.
fn send_sql(s: &Server, sql: &str) -> TcpStream {
    let body = format!("sql={}", url_encode(sql));
    let mut sock = TcpStream::connect(("127.0.0.1", s.http_port)).unwrap();
    let req = format!(
        "POST /v1/sql HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        s.http_port,
        body.len()
    );
    sock.write_all(req.as_bytes()).unwrap();
    sock
}

#[test]
fn health_and_metrics() {
    let s = Server::start();
    let (status, body) = s.http("GET", "/health", None, "");
    assert_eq!(status, 200);
    assert_eq!(body.trim(), "{}");

    // Some traffic on both front doors, one error each.
    s.sql("SELECT 1");
    let _ = s.psql("SELECT * FROM no_such_table");
    let (status, _) = s.http_sql("SELECT * FROM no_such_table");
    assert!(status >= 400);

    let (status, text) = s.http("GET", "/metrics", None, "");
    assert_eq!(status, 200);
    for needle in [
        "# TYPE sandflow_requests_total counter",
        "sandflow_requests_total{frontdoor=\"postgres\"}",
        "sandflow_requests_total{frontdoor=\"http\"}",
        "sandflow_request_errors_total{frontdoor=\"postgres\"}",
        "sandflow_request_errors_total{frontdoor=\"http\"}",
        "sandflow_uptime_seconds",
    ] {
        assert!(text.contains(needle), "/metrics lacks {needle}:\n{text}");
    }
    let errors = |door: &str| -> f64 {
        let key = format!("sandflow_request_errors_total{{frontdoor=\"{door}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    assert!(errors("postgres") >= 1.0, "{text}");
    assert!(errors("http") >= 1.0, "{text}");
}

#[test]
fn sql_endpoint() {
    let s = Server::start();
    let (status, v) = s.http_sql(
        "CREATE TABLE m (host STRING, v DOUBLE, n BIGINT, ts TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))",
    );
    assert_eq!(status, 200, "{v}");

    let (status, v) =
        s.http_sql("INSERT INTO m VALUES ('a', 1.5, 7, 1000), ('b', 2.5, NULL, 2000)");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["affectedrows"], json!(2), "{v}");

    // SQL as a query parameter this time.
    let path = format!(
        "/v1/sql?db=public&sql={}",
        url_encode("SELECT host, v, n, ts FROM m ORDER BY host")
    );
    let (status, text) = s.http("POST", &path, None, "");
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let records = &v["output"][0]["records"];
    let names: Vec<&str> = records["schema"]["column_schemas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "v", "n", "ts"], "{v}");
    assert_eq!(records["total_rows"], json!(2), "{v}");
    assert_eq!(records["rows"][0], json!(["a", 1.5, 7, 1000]), "{v}");
    assert_eq!(records["rows"][1], json!(["b", 2.5, null, 2000]), "{v}");
    assert!(v["execution_time_ms"].is_number(), "{v}");

    // Errors: JSON with code and message, 4xx.
    let (status, v) = s.http_sql("SELEC nonsense");
    assert!((400..500).contains(&status), "{status} {v}");
    assert!(v["code"].is_number() && v["error"].is_string(), "{v}");
    let (status, v) = s.http_sql("SELECT * FROM nope");
    assert!((400..500).contains(&status), "{status} {v}");
    let (status, _) = s.http("POST", "/v1/sql", None, "");
    assert_eq!(status, 400);
    // GreptimeDB's codes, for clients that switch on them.
    s.http_sql("CREATE FLOW f SINK TO f_out AS SELECT host, count(*) AS c FROM m GROUP BY host");
    for (sql, code) in [
        ("SELEC nonsense", 2000),
        ("SELECT * FROM nope", 4001),
        ("CREATE TABLE m (ts TIMESTAMP TIME INDEX)", 4000),
        ("CREATE TABLE nodb.t (ts TIMESTAMP TIME INDEX)", 4004),
        ("CREATE FLOW f SINK TO f_out AS SELECT host FROM m", 8000),
        ("DROP FLOW ghost", 8001),
        ("ADMIN FLUSH_FLOW('ghost')", 8001),
        ("SHOW CREATE FLOW ghost", 8001),
    ] {
        let (status, v) = s.http_sql(sql);
        assert!((400..500).contains(&status), "{sql}: {status} {v}");
        assert_eq!(v["code"], json!(code), "{sql}: {v}");
    }
    s.http_sql("DROP FLOW f");

    // Still serving.
    let (status, v) = s.http_sql("SELECT count(*) AS c FROM m");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["records"]["rows"][0][0], json!(2), "{v}");
}

#[test]
fn influx_write_then_select() {
    let s = Server::start();
    let body = "\
# a comment
weather,city=Paris,sensor=a\\ b temp=21.5,hum=40i,ok=true,note=\"say \\\"hi\\\"\" 1700000000000
weather,city=Oslo,sensor=x temp=-3.25,hum=80i,ok=f,note=\"cold, dry\" 1700000001000
";
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=public&precision=ms",
        Some("text/plain"),
        body,
    );
    assert_eq!(status, 204, "{text}\n{}", s.logs());

    let out = s.sql("SELECT city, sensor, temp, hum, ok, note FROM weather ORDER BY city");
    assert_eq!(
        out,
        "Oslo|x|-3.25|80|f|cold, dry\nParis|a b|21.5|40|t|say \"hi\""
    );
    let ts = s.sql("SELECT CAST(ts AS BIGINT) FROM weather ORDER BY city");
    // The time index keeps the written instants (in the table's unit: ms).
    assert_eq!(ts, "1700000001000\n1700000000000");

    // A second write to the same table (upsert of Paris, new row), ns default
    // precision, and a missing timestamp (now).
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=public",
        None,
        "weather,city=Paris,sensor=a\\ b temp=22.5,hum=41i,ok=true,note=\"x\" 1700000000000000000\n\
         weather,city=Rome,sensor=r temp=30,hum=10i,ok=true,note=\"now\"\n",
    );
    assert_eq!(status, 204, "{text}");
    assert_eq!(s.sql("SELECT count(*) FROM weather"), "3");
    assert_eq!(
        s.sql("SELECT temp FROM weather WHERE city = 'Paris'"),
        "22.5"
    );

    // Unsigned integers.
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?precision=s",
        None,
        "counters,k=v c=18446744073709551615u 10\n",
    );
    assert_eq!(status, 204, "{text}");
    assert_eq!(s.sql("SELECT c FROM counters"), "18446744073709551615");

    // `db` names the database: it is created on first write and holds the table.
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=metrics&precision=s",
        None,
        "cpu,host=h1 usage=0.5 10\ncpu,host=h2 usage=0.75 10\n",
    );
    assert_eq!(status, 204, "{text}\n{}", s.logs());
    assert_eq!(
        s.sql("SELECT host, usage FROM metrics.cpu ORDER BY host"),
        "h1|0.5\nh2|0.75"
    );
    assert!(
        !s.sql("SHOW TABLES").lines().any(|t| t == "cpu"),
        "cpu must not land in public"
    );

    // A new tag or field of an existing table becomes its column (a tag a
    // primary-key string), as in GreptimeDB; the rows already there have NULL.
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=metrics&precision=s",
        None,
        "cpu,host=h3 usage=0.1 11
cpu,host=h4,rack=r1 usage=0.2,temp=40 11
",
    );
    assert_eq!(status, 204, "{text}\n{}", s.logs());
    assert_eq!(
        s.sql("SELECT host, rack, usage, temp FROM metrics.cpu ORDER BY host"),
        "h1||0.5|\nh2||0.75|\nh3||0.1|\nh4|r1|0.2|40.0"
    );
    // The new tag is part of the key: the same host with another rack is
    // another row.
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=metrics&precision=s",
        None,
        "cpu,host=h4,rack=r2 usage=0.3 11\n",
    );
    assert_eq!(status, 204, "{text}");
    assert_eq!(
        s.sql("SELECT count(*) FROM metrics.cpu WHERE host = 'h4'"),
        "2"
    );
}

#[test]
fn influx_malformed_writes_nothing() {
    let s = Server::start();
    let body = "good,t=1 v=1i 1\nbad line without fields\n";
    let (status, text) = s.http("POST", "/v1/influxdb/write", None, body);
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("line 2"), "{text}");
    // Nothing was created or written.
    let err = s.sql_err("SELECT * FROM good");
    assert!(err.contains("ERROR"), "{err}");

    for bad in [
        "m v=\"unterminated 1\n",
        "m v=1i,v=2i 1\n",
        "m,t v=1 1\n",
        "m v=12abc 1\n",
        "m v=1 notatime\n",
    ] {
        let (status, text) = s.http("POST", "/v1/influxdb/write", None, bad);
        assert_eq!(status, 400, "{bad:?}: {text}");
    }
    let (status, _) = s.http(
        "POST",
        "/v1/influxdb/write?precision=fortnight",
        None,
        "m v=1 1\n",
    );
    assert_eq!(status, 400);
    // Still serving.
    assert_eq!(s.sql("SELECT 1"), "1");
}

// A line-protocol request is one commit: refused as a whole (400 naming the
// column and both types) when any line conflicts, with nothing written and no
// table created; accepted as a whole otherwise.
#[test]
fn influx_request_is_all_or_nothing() {
    let s = Server::start();
    let write = |body: &str| s.http("POST", "/v1/influxdb/write?precision=s", None, body);
    let (status, text) = write("cpu,host=h1 usage=0.5 1\nzz_mem,host=h1 free=1i 1\n");
    assert_eq!(status, 204, "{text}");
    let tables = || s.sql("SHOW TABLES");
    let count = |t: &str| s.sql(&format!("SELECT count(*) FROM {t}"));

    // The last line's string does not fit the BIGINT column (a new table and
    // a good line come first).
    let (status, text) =
        write("a_new,k=a x=1i 2\ncpu,host=h2 usage=0.75 2\nzz_mem,host=h2 free=\"lots\" 2\n");
    assert_eq!(status, 400, "{text}");
    for needle in ["free", "BIGINT", "STRING", "zz_mem"] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    // An integer is refused for a DOUBLE field, as in InfluxDB.
    let (status, text) = write("b_new,k=a x=1i 2\ncpu,host=h3 usage=1i 3\n");
    assert_eq!(status, 400, "{text}");
    for needle in ["usage", "DOUBLE", "BIGINT", "1i"] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    // Two lines of one request disagree.
    let (status, text) = write("c_new,k=a x=1i 2\nm2 v=1.5 1\nm2 v=2i 2\n");
    assert_eq!(status, 400, "{text}");
    for needle in ["\\\"v\\\"", "DOUBLE", "BIGINT", "line 2", "line 3"] {
        assert!(text.contains(needle), "{needle} missing from {text}");
    }
    // None of them wrote anything or created a table.
    assert_eq!(count("cpu"), "1");
    assert_eq!(count("zz_mem"), "1");
    let t = tables();
    for name in ["a_new", "b_new", "c_new", "m2"] {
        assert!(!t.lines().any(|l| l == name), "{name} was created:\n{t}");
    }

    // A good request over several measurements, new and old: all visible.
    let (status, text) = write(
        "cpu,host=h2 usage=0.75 2\nzz_mem,host=h2 free=5i 2\nc_new,k=z v=true 2\n\
         cpu,host=h3 usage=1 3\n",
    );
    assert_eq!(status, 204, "{text}");
    assert_eq!(
        s.sql("SELECT host, usage FROM cpu ORDER BY host"),
        "h1|0.5\nh2|0.75\nh3|1.0"
    );
    assert_eq!(
        s.sql("SELECT host, free FROM zz_mem ORDER BY host"),
        "h1|1\nh2|5"
    );
    assert_eq!(s.sql("SELECT k, v FROM c_new"), "z|t");
}

// Flows are declared, flushed and inspected over /v1/sql like any statement.
#[test]
fn flows_over_http() {
    let s = Server::start();
    let ok = |sql: &str| {
        let (status, v) = s.http_sql(sql);
        assert_eq!(status, 200, "{sql}: {v}");
        v
    };
    ok("CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP(3) TIME INDEX, PRIMARY KEY (host))");
    ok("INSERT INTO m VALUES ('a', 1.5, 1000), ('b', 2.5, 2000), ('a', 3.0, 3000)");
    // CREATE and DROP FLOW affect 0 rows, as in GreptimeDB.
    let v = ok("CREATE FLOW per_host SINK TO per_host_sink AS \
        SELECT host, count(*) AS n, sum(v) AS total FROM m GROUP BY host");
    assert_eq!(v["output"][0]["affectedrows"], json!(0), "{v}");
    let v = ok(
        "CREATE FLOW IF NOT EXISTS per_host SINK TO per_host_sink AS \
        SELECT host, count(*) AS n, sum(v) AS total FROM m GROUP BY host",
    );
    assert_eq!(v["output"][0]["affectedrows"], json!(0), "{v}");
    let v = ok("ADMIN FLUSH_FLOW('per_host')");
    assert_eq!(v["output"][0]["records"]["rows"][0][0], json!(2), "{v}");
    let v = ok("SELECT host, n, total FROM per_host_sink ORDER BY host");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["a", 2, 4.5], ["b", 1, 2.5]]),
        "{v}"
    );
    ok("DELETE FROM m WHERE host = 'b'");
    let v = ok("ADMIN FLUSH_FLOW('per_host')");
    assert_eq!(v["output"][0]["records"]["rows"][0][0], json!(1), "{v}");
    let v = ok("SELECT host FROM per_host_sink ORDER BY host");
    assert_eq!(v["output"][0]["records"]["rows"], json!([["a"]]), "{v}");
    let v = ok("SELECT flow_name, status, sink_table_name FROM information_schema.flows");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["per_host", "running", "per_host_sink"]]),
        "{v}"
    );
    // Expressions over it name their columns after the table as written,
    // not after where sandflow keeps it.
    let v =
        ok("SELECT upper(flow_name), count(*) FROM information_schema.flows GROUP BY flow_name");
    let names = &v["output"][0]["records"]["schema"]["column_schemas"];
    assert_eq!(names[0]["name"], "upper(flows.flow_name)", "{v}");
    assert_eq!(names[1]["name"], "count(*)", "{v}");
    let v = ok("SELECT f.flow_name FROM information_schema.flows AS f");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["per_host"]]),
        "{v}"
    );
    let (status, v) = s.http_sql("CREATE FLOW per_host SINK TO x AS SELECT host FROM m");
    assert!((400..500).contains(&status), "{status} {v}");
    assert!(
        v["error"].as_str().unwrap_or("").contains("already exists"),
        "{v}"
    );
    // Per-flow series on /metrics.
    let (status, text) = s.http("GET", "/metrics", None, "");
    assert_eq!(status, 200);
    for line in [
        "sandflow_flow_sink_rows_written{flow=\"per_host\"} 3",
        "sandflow_flow_failed{flow=\"per_host\"} 0",
        "sandflow_flow_failures{flow=\"per_host\"} 0",
        "sandflow_flow_restarts{flow=\"per_host\"} 0",
        "sandflow_flow_lag_seconds{flow=\"per_host\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line} missing from\n{text}"
        );
    }
    let v = ok("DROP FLOW per_host");
    assert_eq!(v["output"][0]["affectedrows"], json!(0), "{v}");
    let v = ok("DROP FLOW IF EXISTS per_host");
    assert_eq!(v["output"][0]["affectedrows"], json!(0), "{v}");
    let (_, text) = s.http("GET", "/metrics", None, "");
    assert!(!text.contains("flow=\"per_host\""), "{text}");
    let v = ok("SHOW FLOWS");
    assert_eq!(v["output"][0]["records"]["total_rows"], json!(0), "{v}");
    // SHOW TABLES' column is named as in GreptimeDB; ADMIN FLUSH_TABLE is 0.
    let v = ok("SHOW TABLES");
    assert_eq!(
        v["output"][0]["records"]["schema"]["column_schemas"][0]["name"],
        json!("Tables_in_public"),
        "{v}"
    );
    let v = ok("ADMIN FLUSH_TABLE('m')");
    assert_eq!(v["output"][0]["records"]["rows"], json!([[0]]), "{v}");
}

// `/v1/sql?db=` is the request's database: unqualified names are there (for
// sandflow's statements and DataFusion's), flows created there remember it;
// GreptimeDB's `catalog-database` form is taken too; an unknown database is
// an error with GreptimeDB's code.
#[test]
fn sql_db_parameter() {
    let s = Server::start();
    s.sql("CREATE DATABASE metrics");
    let in_db = |db: &str, sql: &str| {
        let path = format!("/v1/sql?db={db}&sql={}", url_encode(sql));
        let (status, text) = s.http("POST", &path, None, "");
        assert_eq!(status, 200, "{sql}: {text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()
    };
    in_db(
        "metrics",
        "CREATE TABLE m (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))",
    );
    in_db(
        "metrics",
        "CREATE FLOW totals SINK TO totals_out AS SELECT k, sum(v) AS total FROM m GROUP BY k",
    );
    in_db(
        "greptime-metrics",
        "INSERT INTO m VALUES ('a', 2, 0), ('b', 3, 0)",
    );
    in_db("metrics", "ADMIN FLUSH_FLOW('totals')");
    let v = in_db("metrics", "SELECT k, total FROM totals_out ORDER BY k");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["a", 2], ["b", 3]]),
        "{v}"
    );
    let v = in_db("metrics", "SHOW TABLES");
    assert_eq!(
        v["output"][0]["records"]["schema"]["column_schemas"][0]["name"], "Tables_in_metrics",
        "{v}"
    );
    let v = in_db("public", "SELECT count(*) FROM metrics.m");
    assert_eq!(v["output"][0]["records"]["rows"], json!([[2]]), "{v}");
    let (status, text) = s.http(
        "POST",
        "/v1/sql?db=public&sql=SELECT%20*%20FROM%20m",
        None,
        "",
    );
    assert_eq!(status, 404, "{text}");
    let (status, text) = s.http("POST", "/v1/sql?db=nope&sql=SELECT%201", None, "");
    assert_eq!(status, 404, "{text}");
    assert!(text.contains("'nope' does not exist"), "{text}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["code"],
        4004,
        "{text}"
    );
}

// A client that goes away mid-query stops its statement: the server does
// not keep computing an answer nobody will read.
#[test]
fn abandoned_query_stops() {
    let s = Server::start();
    let running = || s.metric("sandflow_statements_running");
    assert_eq!(running(), Some(0.0));
    let sock = send_sql(&s, ENDLESS_QUERY);
    assert!(
        poll_until(Duration::from_secs(30), || running() == Some(1.0)),
        "the query did not start: {:?}\n{}",
        running(),
        s.logs()
    );
    drop(sock);
    assert!(
        poll_until(Duration::from_secs(30), || running() == Some(0.0)),
        "the abandoned query still runs: {:?}\n{}",
        running(),
        s.logs()
    );
    let (status, v) = s.http_sql("SELECT 1 AS one");
    assert_eq!(status, 200, "{v}");
}

fn start_with_args(args: &[&str]) -> Server {
    Server::start_with(
        temp_data_dir(),
        Options {
            args: args.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        },
    )
}

fn tables(s: &Server) -> String {
    s.sql("SHOW TABLES")
}

fn json_error(text: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    assert!(v["code"].is_number(), "{v}");
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

// A web page on another origin cannot use the API: a browser sends its
// Origin (or Sec-Fetch-Site), and the request is refused before it runs.
// Clients that send neither (curl, libraries, backends) are not checked.
#[test]
fn cross_origin_requests_are_refused() {
    let s = Server::start();
    s.sql("CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    let evil = [("Origin", "http://evil.example")];
    let drop_t = format!("/v1/sql?sql={}", url_encode("DROP TABLE t"));

    let (status, text) = s.http_with("GET", &drop_t, &evil, "");
    assert_eq!(status, 403, "{text}");
    assert!(json_error(&text).contains("cross-origin"), "{text}");
    let (status, text) = s.http_with(
        "POST",
        "/v1/sql",
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "sql=DROP%20TABLE%20t",
    );
    assert_eq!(status, 403, "{text}");
    assert!(json_error(&text).contains("cross-origin"), "{text}");
    let (status, text) = s.http_with(
        "POST",
        "/v1/influxdb/write?precision=s",
        &evil,
        "t,host=h v=1 10\n",
    );
    assert_eq!(status, 403, "{text}");
    // A cross-site GET without Origin (an image, a link) is refused too.
    let select = format!("/v1/sql?sql={}", url_encode("SELECT count(*) FROM t"));
    let (status, text) = s.http_with("GET", &select, &[("Sec-Fetch-Site", "cross-site")], "");
    assert_eq!(status, 403, "{text}");
    assert!(json_error(&text).contains("cross-site"), "{text}");
    // Nothing was dropped or written.
    assert_eq!(tables(&s), "t");
    assert_eq!(s.sql("SELECT count(*) FROM t"), "0");

    // The server's own origin, and the address bar, are fine.
    let own = format!("http://127.0.0.1:{}", s.http_port);
    let (status, text) = s.http_with(
        "GET",
        &select,
        &[("Origin", own.as_str()), ("Sec-Fetch-Site", "same-origin")],
        "",
    );
    assert_eq!(status, 200, "{text}");
    let (status, text) = s.http_with("GET", &select, &[("Sec-Fetch-Site", "none")], "");
    assert_eq!(status, 200, "{text}");
    // /health and /metrics stay open.
    for path in ["/health", "/metrics"] {
        let (status, text) = s.http_with("GET", path, &evil, "");
        assert_eq!(status, 200, "{path}: {text}");
    }
}

// Clients without Origin or Sec-Fetch-Site are not checked, whatever name
// they reach the server by (a backend behind a DNS name, curl, requests).
#[test]
fn clients_without_browser_headers_still_work() {
    let s = Server::start();
    s.sql("CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    let (status, text) = s.http_with(
        "POST",
        "/v1/influxdb/write?precision=s",
        &[("Host", "sandflow.internal:4000")],
        "t,host=h v=1 10\n",
    );
    assert_eq!(status, 204, "{text}");
    let (status, text) = s.http_with(
        "POST",
        "/v1/sql",
        &[
            ("Host", "sandflow.internal"),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "sql=DROP%20TABLE%20t",
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(tables(&s), "");
}

// DNS rebinding: a page on evil.example whose name now resolves to the
// server's address talks to it as its own origin. Its Host names no name of
// the server's, so it is refused, unless the name was allowed.
#[test]
fn dns_rebinding_is_refused() {
    let s = start_with_args(&["--http-allowed-hosts", "db.example,grafana.example"]);
    s.sql("CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    let port = s.http_port;
    let select = format!("/v1/sql?sql={}", url_encode("SELECT count(*) FROM t"));
    let evil_host = format!("evil.example:{port}");
    let evil_origin = format!("http://evil.example:{port}");
    let (status, text) = s.http_with(
        "GET",
        &select,
        &[
            ("Host", evil_host.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        "",
    );
    assert_eq!(status, 403, "{text}");
    let message = json_error(&text);
    assert!(
        message.contains("evil.example") && message.contains("--http-allowed-hosts"),
        "{message}"
    );
    let (status, text) = s.http_with(
        "POST",
        "/v1/sql",
        &[
            ("Host", evil_host.as_str()),
            ("Origin", evil_origin.as_str()),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        "sql=DROP%20TABLE%20t",
    );
    assert_eq!(status, 403, "{text}");
    assert_eq!(tables(&s), "t");

    // A name given with --http-allowed-hosts is the server's own.
    let host = format!("db.example:{port}");
    let origin = format!("http://db.example:{port}");
    let (status, text) = s.http_with(
        "GET",
        &select,
        &[
            ("Host", host.as_str()),
            ("Origin", origin.as_str()),
            ("Sec-Fetch-Site", "same-origin"),
        ],
        "",
    );
    assert_eq!(status, 200, "{text}");
}

// GET /v1/sql runs only statements that read; anything else must be POSTed.
#[test]
fn get_runs_only_reads() {
    let s = Server::start();
    s.sql("CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    s.sql("INSERT INTO t VALUES ('a', 1, 1000)");
    let get = |sql: &str| s.http("GET", &format!("/v1/sql?sql={}", url_encode(sql)), None, "");
    for sql in [
        "SELECT count(*) FROM t",
        "SHOW TABLES",
        "DESC TABLE t",
        "EXPLAIN SELECT * FROM t",
        "WITH x AS (SELECT 1 AS one) SELECT one FROM x",
    ] {
        let (status, text) = get(sql);
        assert_eq!(status, 200, "{sql}: {text}");
    }
    for sql in [
        "DROP TABLE t",
        "DELETE FROM t",
        "INSERT INTO t VALUES ('b', 2, 2000)",
        "SELECT 1; DROP TABLE t",
        "EXPLAIN DELETE FROM t",
        "CREATE TABLE u (ts TIMESTAMP TIME INDEX)",
        "ADMIN FLUSH_FLOW('f')",
        "SET datafusion.execution.batch_size = 1",
        "DROPP TABLE t",
    ] {
        let (status, text) = get(sql);
        assert_eq!(status, 405, "{sql}: {text}");
        let message = json_error(&text);
        assert!(message.contains("POST"), "{message}");
    }
    // A query with a typo gets its syntax error, as over POST.
    let (status, text) = get("SELECT (1 FROM t");
    assert_eq!(status, 400, "{text}");
    assert!(json_error(&text).contains("syntax"), "{text}");
    assert_eq!(tables(&s), "t");
    assert_eq!(s.sql("SELECT count(*) FROM t"), "1");
    // The same statements work over POST.
    let (status, v) = s.http_sql("DELETE FROM t");
    assert_eq!(status, 200, "{v}");
    assert_eq!(s.sql("SELECT count(*) FROM t"), "0");
}

// Past --max-connections the next connection is answered 503 and closed;
// once connections close, new ones are served again.
#[test]
fn connection_cap() {
    let s = start_with_args(&["--max-connections", "3"]);
    // A kept-open connection that watches the count (it holds one of the 3).
    let mut watch = Conn::open(s.http_port);
    let open = |c: &mut Conn| -> f64 {
        let (status, text) = c.request("GET", "/metrics").unwrap();
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix("sandflow_open_connections{frontdoor=\"http\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(-1.0)
    };
    assert!(
        poll_until(Duration::from_secs(30), || open(&mut watch) == 1.0),
        "connections of the harness still open: {}",
        open(&mut watch)
    );
    let mut idle = [Conn::open(s.http_port), Conn::open(s.http_port)];
    let (status, text) = s.http("GET", "/health", None, "");
    assert_eq!(status, 503, "{text}");
    let message = json_error(&text);
    assert!(message.contains("--max-connections"), "{message}");
    // Also when the client has not sent anything yet: the answer comes, and
    // the connection is closed.
    let mut silent = TcpStream::connect(("127.0.0.1", s.http_port)).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    silent.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    // The connections that hold the slots are served.
    for c in &mut idle {
        let (status, text) = c.request("GET", "/health").unwrap();
        assert_eq!(status, 200, "{text}");
    }
    assert_eq!(open(&mut watch), 3.0);
    drop(idle);
    assert!(
        poll_until(Duration::from_secs(30), || s
            .try_http("GET", "/health", None, "")
            .is_ok_and(|(status, _)| status == 200)),
        "no connection served after the others closed"
    );
}

// A connection that does not send a complete request head within
// --http-header-read-timeout is closed.
#[test]
fn header_read_timeout() {
    let s = start_with_args(&["--http-header-read-timeout", "1s"]);
    let mut slow = TcpStream::connect(("127.0.0.1", s.http_port)).unwrap();
    slow.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    // Closed by the server well before this read gives up.
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    let read = slow.read_to_end(&mut answer);
    assert!(read.is_ok(), "still open: {read:?}");
    let answer = String::from_utf8_lossy(&answer);
    assert!(!answer.contains(" 200 "), "{answer}");
    // Complete requests are served.
    let (status, _) = s.http("GET", "/health", None, "");
    assert_eq!(status, 200);
}

// A /v1/sql request that runs longer than --http-timeout (or its own
// `timeout`, which may only lower it) is stopped and answered 504.
#[test]
fn request_timeout() {
    let s = start_with_args(&["--http-timeout", "2s"]);
    let running = || s.metric("sandflow_statements_running");
    let post = |path: &str| {
        let (status, text) = s.http(
            "POST",
            path,
            Some("application/x-www-form-urlencoded"),
            &format!("sql={}", url_encode(ENDLESS_QUERY)),
        );
        let v: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, v)
    };
    for (path, limit) in [
        ("/v1/sql", "2s"),
        ("/v1/sql?timeout=300ms", "300ms"),
        ("/v1/sql?timeout=1h", "2s"),
    ] {
        let (status, v) = post(path);
        assert_eq!(status, 504, "{path}: {v}");
        assert_eq!(v["code"], json!(1008), "{v}");
        let message = v["error"].as_str().unwrap();
        assert!(
            message.contains("timed out") && message.contains(&format!("longer than {limit}")),
            "{path}: {message}"
        );
        assert!(v["execution_time_ms"].is_number(), "{v}");
    }
    assert!(
        poll_until(Duration::from_secs(30), || running() == Some(0.0)),
        "a statement that timed out still runs: {:?}",
        running()
    );
    let (status, text) = s.http("POST", "/v1/sql?timeout=soon&sql=SELECT%201", None, "");
    assert_eq!(status, 400, "{text}");
    assert!(json_error(&text).contains("timeout"), "{text}");
    // Still serving, and quick statements are unaffected.
    let (status, v) = s.http_sql("SELECT 1 AS one");
    assert_eq!(status, 200, "{v}");
}

// SIGTERM stops accepting but lets a request in flight finish: here one
// whose body is still arriving when the signal comes.
#[test]
fn shutdown_finishes_requests_in_flight() {
    let mut s = Server::start();
    let body = format!("sql={}", url_encode("SELECT 41 + 1 AS answer"));
    let (first, rest) = body.split_at(10);
    let mut conn = TcpStream::connect(("127.0.0.1", s.http_port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "POST /v1/sql HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{first}",
        s.http_port,
        body.len()
    );
    // The server must have read the head, so that the request is in flight
    // (a connection that has sent no complete head counts as idle and is
    // closed at shutdown): wait until the request counter shows it. Each
    // read of /metrics counts itself too.
    let requests = || {
        s.metric("sandflow_requests_total{frontdoor=\"http\"}")
            .unwrap_or(0.0)
    };
    let before = requests();
    conn.write_all(head.as_bytes()).unwrap();
    let mut polls = 0.0;
    assert!(
        poll_until(Duration::from_secs(30), || {
            polls += 1.0;
            requests() >= before + polls + 1.0
        }),
        "the request never reached the server"
    );
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(
        poll_until(Duration::from_secs(30), || s
            .logs()
            .contains("shutting down")),
        "{}",
        s.logs()
    );
    conn.write_all(rest.as_bytes()).unwrap();
    let (status, text) = sandflow_tests::harness::read_response(&mut conn).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["output"][0]["records"]["rows"], json!([[42]]), "{v}");
    assert!(s.stop(), "not a clean exit:\n{}", s.logs());
}

// Text that is not UTF-8 is refused, not stored as U+FFFD; NUL in text too.
#[test]
fn invalid_text_is_refused_not_altered() {
    let s = Server::start();
    let (status, v) =
        s.http_sql("CREATE TABLE t (k STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))");
    assert_eq!(status, 200, "{v}");
    let body = "sql=INSERT%20INTO%20t%20VALUES%20(%27%FF%FE%27,%200)";
    let (status, text) = s.http(
        "POST",
        "/v1/sql",
        Some("application/x-www-form-urlencoded"),
        body,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("UTF8"), "{text}");
    let (status, text) = s.http("GET", "/v1/sql?sql=SELECT%20%27%FF%27", None, "");
    assert_eq!(status, 400, "{text}");
    let (status, v) = s.http_sql("INSERT INTO t VALUES ('a' || chr(0) || 'b', 0)");
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("0x00"), "{v}");
    let (_, v) = s.http_sql("SELECT count(*) FROM t");
    assert_eq!(v["output"][0]["records"]["rows"][0][0], 0, "{v}");
}

// A pending flow (defer_on_missing_source) over a measurement that line
// protocol creates starts with that write and back-fills its rows: the
// table and its first rows come in one commit.
#[test]
fn influx_write_starts_a_pending_flow() {
    let s = Server::start();
    let (status, v) = s.http_sql(
        "CREATE FLOW per_city SINK TO per_city_out WITH (defer_on_missing_source = 'true') \
         AS SELECT city, count(*) AS n FROM weather GROUP BY city",
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"][0]["affectedrows"], json!(0), "{v}");
    let (_, v) = s.http_sql("SELECT status FROM information_schema.flows");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["pending"]]),
        "{v}"
    );
    let body = "weather,city=Paris temp=21.5 1700000000000\n\
                weather,city=Oslo temp=-3.25 1700000001000\n\
                weather,city=Paris temp=22 1700000002000\n";
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=public&precision=ms",
        Some("text/plain"),
        body,
    );
    assert_eq!(status, 204, "{text}");
    let (_, v) = s.http_sql("SELECT status FROM information_schema.flows");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["running"]]),
        "{v}"
    );
    let (status, v) = s.http_sql("ADMIN FLUSH_FLOW('per_city')");
    assert_eq!(status, 200, "{v}");
    let (_, v) = s.http_sql("SELECT city, n FROM per_city_out ORDER BY city");
    assert_eq!(
        v["output"][0]["records"]["rows"],
        json!([["Oslo", 1], ["Paris", 2]]),
        "{v}"
    );
}
