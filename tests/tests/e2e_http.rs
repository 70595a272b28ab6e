//! End-to-end: the real binary over HTTP (/v1/sql, InfluxDB line protocol,
//! /health, /metrics).

use sandflow_tests::harness::{url_encode, Server};
use serde_json::json;

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

    // A new tag or field of an existing table: 400 naming it, nothing written
    // (not even the request's other, fitting points).
    let (status, text) = s.http(
        "POST",
        "/v1/influxdb/write?db=metrics&precision=s",
        None,
        "cpu,host=h3 usage=0.1 11
cpu,host=h4,rack=r1 usage=0.2,temp=40 11
",
    );
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("rack") && text.contains("temp") && text.contains("cannot add columns"),
        "{text}"
    );
    assert_eq!(s.sql("SELECT count(*) FROM metrics.cpu"), "2");
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
    // A field the table does not have.
    let (status, text) = write("d_new,k=a x=1i 2\ncpu,host=h4 usage=0.1,temp=3 4\n");
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("temp") && text.contains("cannot add columns"),
        "{text}"
    );
    // None of them wrote anything or created a table.
    assert_eq!(count("cpu"), "1");
    assert_eq!(count("zz_mem"), "1");
    let t = tables();
    for name in ["a_new", "b_new", "c_new", "d_new", "m2"] {
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
    ok("CREATE FLOW per_host SINK TO per_host_sink AS \
        SELECT host, count(*) AS n, sum(v) AS total FROM m GROUP BY host");
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
    ok("DROP FLOW per_host");
    let (_, text) = s.http("GET", "/metrics", None, "");
    assert!(!text.contains("flow=\"per_host\""), "{text}");
    let v = ok("SHOW FLOWS");
    assert_eq!(v["output"][0]["records"]["total_rows"], json!(0), "{v}");
}

// `/v1/sql?db=`: `public` (or nothing) runs the statement; another existing
// database is refused as not supported yet, an unknown one as missing.
#[test]
fn sql_db_parameter() {
    let s = Server::start();
    s.sql("CREATE DATABASE metrics");
    let (status, text) = s.http("POST", "/v1/sql?db=public&sql=SELECT%201", None, "");
    assert_eq!(status, 200, "{text}");
    let (status, text) = s.http("POST", "/v1/sql?db=metrics&sql=SELECT%201", None, "");
    assert_eq!(status, 400, "{text}");
    assert!(
        text.contains("not supported yet") && text.contains("metrics.table"),
        "{text}"
    );
    let (status, text) = s.http("POST", "/v1/sql?db=nope&sql=SELECT%201", None, "");
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("'nope' does not exist"), "{text}");
}
