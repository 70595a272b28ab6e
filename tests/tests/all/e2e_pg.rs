//! End-to-end: the real binary over the PostgreSQL wire protocol with psql
//! (simple query protocol).

use std::time::{Duration, Instant};

use sandflow_tests::harness::{lines, poll_until, temp_data_dir, Server};
use sandflow_tests::pgraw::{error_codes, first_value, Raw};

const CREATE: &str = "CREATE TABLE cpu (host STRING, region STRING, usage DOUBLE, \
                      ts TIMESTAMP TIME INDEX, PRIMARY KEY (host, region))";

#[test]
fn create_insert_upsert_delete_select() {
    let s = Server::start();
    let out = s.sql(CREATE);
    assert!(out.contains("CREATE TABLE"), "{out}");

    let out = s.sql(
        "INSERT INTO cpu VALUES ('a', 'eu', 0.5, '2024-01-01T00:00:00'), \
         ('b', 'eu', 1.5, '2024-01-01T00:00:00'), ('a', 'eu', 2.5, '2024-01-01T00:01:00')",
    );
    assert_eq!(out, "INSERT 0 3");

    // Upsert: same (primary key, time index) replaces the row.
    let out = s.sql("INSERT INTO cpu VALUES ('a', 'eu', 9.5, '2024-01-01T00:00:00')");
    assert_eq!(out, "INSERT 0 1");
    let out = s.sql("SELECT host, usage FROM cpu ORDER BY host, ts");
    assert_eq!(out, "a|9.5\na|2.5\nb|1.5");
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "3");

    let out = s.sql("DELETE FROM cpu WHERE host = 'b'");
    assert_eq!(out, "DELETE 1");
    assert_eq!(
        s.sql("SELECT host, usage FROM cpu ORDER BY ts"),
        "a|9.5\na|2.5"
    );

    // Several statements in one simple query.
    let out = s.sql(
        "INSERT INTO cpu VALUES ('c', 'us', 3.0, '2024-01-01T00:02:00'); \
         SELECT count(*) FROM cpu",
    );
    assert_eq!(lines(&out), vec!["3", "INSERT 0 1"]);

    let tables = s.sql("SHOW TABLES");
    assert!(tables.lines().any(|l| l.trim() == "cpu"), "{tables}");
}

#[test]
fn errors_are_reported_and_the_server_keeps_serving() {
    let s = Server::start();
    s.sql(CREATE);
    let cases: [(&str, &str); 6] = [
        ("SELEC 1 FROM", "bad SQL"),
        ("SELECT * FROM no_such_table", "unknown table"),
        (
            "INSERT INTO no_such_table VALUES (1)",
            "insert into unknown table",
        ),
        (
            "INSERT INTO cpu VALUES ('a', 'eu', 'not a number', '2024-01-01T00:00:00')",
            "wrong type",
        ),
        ("CREATE TABLE nots (a INT, b STRING)", "missing time index"),
        (
            "INSERT INTO cpu (host, region, usage, ts) VALUES ('a', 'eu', 1.0, NULL)",
            "NULL time index",
        ),
    ];
    for (sql, what) in cases {
        let err = s.sql_err(sql);
        assert!(err.contains("ERROR"), "{what}: {err}");
        // Still serving, on a new connection, after every error.
        assert_eq!(s.sql("SELECT 1"), "1", "after {what}");
    }
    // Nothing was written by the failed statements.
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "0");

    // Statements not there yet say so, and what to do instead.
    for (sql, hint) in [
        (
            "UPDATE cpu SET usage = 0 WHERE host = 'a'",
            "INSERT the whole row again",
        ),
        ("TRUNCATE TABLE cpu", "DELETE FROM the table without WHERE"),
    ] {
        let err = s.sql_err(sql);
        assert!(
            err.contains("not supported yet") && err.contains(hint),
            "{sql}: {err}"
        );
    }

    // The same connection keeps working after an error (ON_ERROR_STOP off).
    let out = s
        .psql_args(&[
            "-v",
            "ON_ERROR_STOP=0",
            "-c",
            "SELECT * FROM no_such_table",
            "-c",
            "SELECT 42",
        ])
        .unwrap_or_else(|e| e);
    assert!(out.contains("42"), "{out}");
}

#[test]
fn sqlstate_codes() {
    let s = Server::start();
    s.sql(CREATE);
    // psql prints the SQLSTATE with VERBOSITY verbose.
    let verbose = |sql: &str| {
        s.psql_args(&["-v", "VERBOSITY=verbose", "-c", sql])
            .expect_err("should fail")
    };
    let e = verbose("SELECT * FROM no_such_table");
    assert!(e.contains("42P01"), "{e}");
    let e = verbose("SELEC 1");
    assert!(e.contains("42601"), "{e}");
    // The nesting guard: statement_too_complex, not a syntax error.
    let deep = format!("SELECT {}1{}", "(".repeat(70), ")".repeat(70));
    let e = verbose(&deep);
    assert!(e.contains("54001"), "{e}");
    assert!(e.contains("levels deep"), "{e}");
}

#[test]
fn psql_meta_commands() {
    let s = Server::start();
    s.sql(CREATE);
    let dt = s.sql("\\dt");
    assert!(dt.contains("cpu"), "\\dt: {dt}");
    let d = s.sql("\\d cpu");
    for col in ["host", "region", "usage", "ts"] {
        assert!(d.contains(col), "\\d cpu lacks {col}: {d}");
    }
}

#[test]
fn describe_and_show() {
    let s = Server::start();
    s.sql(CREATE);
    let desc = s.sql("DESC TABLE cpu");
    for col in ["host", "region", "usage", "ts"] {
        assert!(desc.contains(col), "DESC lacks {col}: {desc}");
    }
}

// `psql -d db` makes db the session's database: unqualified names are
// there, flows created there remember it. A name that is no database (psql's
// default is the user name) connects to `public`.
#[test]
fn psql_connects_to_a_database() {
    let s = Server::start();
    s.sql("CREATE DATABASE metrics");
    let in_metrics = |sql: &str| {
        s.psql_args(&["-d", "metrics", "-c", sql])
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .trim()
            .to_string()
    };
    assert_eq!(in_metrics("SELECT database()"), "metrics");
    in_metrics("CREATE TABLE m (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))");
    in_metrics(
        "CREATE FLOW totals SINK TO totals_out AS SELECT k, sum(v) AS total FROM m GROUP BY k",
    );
    in_metrics("INSERT INTO m VALUES ('a', 2, 0), ('a', 3, 1)");
    in_metrics("ADMIN FLUSH_FLOW('totals')");
    assert_eq!(in_metrics("SELECT k, total FROM totals_out"), "a|5");
    // From public the tables are metrics.*; unqualified they are not there.
    assert_eq!(s.sql("SELECT k, total FROM metrics.totals_out"), "a|5");
    let err = s.psql("SELECT * FROM totals_out").unwrap_err();
    assert!(err.contains("not found"), "{err}");
    // SET search_path moves the session too, and \dt lists that database.
    assert_eq!(
        s.sql("SET search_path = metrics; SELECT count(*) FROM m"),
        "SET\n2"
    );
    assert_eq!(
        s.psql_args(&["-d", "sandflow", "-c", "SELECT database()"])
            .unwrap()
            .trim(),
        "public"
    );
}

// ---- Hardening: nothing a client sends crashes the server, touches its disk
// or leaks into another session.

fn client(s: &Server) -> postgres::Client {
    postgres::Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        postgres::NoTls,
    )
    .expect("connect")
}

fn code(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

/// A statement as long or as deep as an attacker likes is answered with
/// SQLSTATE 54001 and the server goes on; one at the limit runs.
#[test]
fn long_operator_chains_are_refused_and_the_server_keeps_serving() {
    let s = Server::start();
    s.sql(CREATE);
    let verbose = |sql: &str| {
        s.psql_args(&["-v", "VERBOSITY=verbose", "-c", sql])
            .expect_err("should fail")
    };
    for sql in [
        format!("SELECT {}", vec!["1"; 1900].join("+")),
        format!("SELECT 1 WHERE {}", vec!["true"; 1900].join(" OR ")),
        format!("SELECT {}", vec!["'a'"; 1900].join(" || ")),
        vec!["SELECT 1"; 2200].join(" UNION ALL "),
    ] {
        let e = verbose(&sql);
        assert!(e.contains("54001") && e.contains("too complex"), "{e}");
        assert_eq!(s.sql("SELECT 1"), "1");
    }
    // CREATE FLOW: the flow limit names itself.
    let e = verbose(&format!(
        "CREATE FLOW f SINK TO s AS SELECT host, sum({}) AS x FROM cpu GROUP BY host",
        vec!["usage"; 705].join(" + ")
    ));
    assert!(
        e.contains("54001") && e.contains("flows accept at most"),
        "{e}"
    );
    // The same over HTTP.
    let (status, v) = s.http_sql(&format!("SELECT {}", vec!["1"; 1900].join("+")));
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("too complex"), "{v}");
    // Accepted sizes run.
    assert_eq!(
        s.sql(&format!("SELECT {}", vec!["1"; 900].join("+"))),
        "900"
    );
    assert_eq!(s.sql("SELECT 2"), "2");
}

/// No statement reads or writes a file of the server's.
#[test]
fn nothing_touches_the_servers_files() {
    let s = Server::start();
    s.sql(CREATE);
    let dir = temp_data_dir();
    for ext in ["csv", "json", "parquet"] {
        let path = dir.path().join(format!("out.{ext}"));
        let e = s
            .psql(&format!("COPY (SELECT 1 AS x) TO '{}'", path.display()))
            .expect_err("COPY TO a file");
        assert!(e.contains("not allowed"), "{e}");
        let e = s
            .psql(&format!("COPY cpu TO '{}'", path.display()))
            .expect_err("COPY TO a file");
        assert!(e.contains("not allowed"), "{e}");
        assert!(!path.exists(), "{} was written", path.display());
    }
    let e = s
        .psql("CREATE EXTERNAL TABLE leak STORED AS CSV LOCATION '/etc/passwd'")
        .expect_err("external table");
    assert!(e.contains("ERROR"), "{e}");
    assert!(!s.sql("SHOW TABLES").contains("leak"));
    // What datafusion-postgres once ran whole: now three statements, each
    // routed by the same tokenizer that parses it. The view is refused.
    let e = s
        .psql("SELECT 1 AS a$$b$; CREATE SCHEMA x; CREATE VIEW x.v AS SELECT 1; --$b$")
        .expect_err("CREATE VIEW");
    assert!(e.contains("not supported"), "{e}");
    assert!(s.psql("SELECT * FROM x.v").is_err());
    // COPY through the protocol works, both ways.
    let out = s
        .psql_args(&["-c", "\\copy (SELECT 1 AS a, 'x' AS b) TO STDOUT"])
        .unwrap();
    assert_eq!(out.trim(), "1\tx");
}

/// BEGIN ... ROLLBACK keeps nothing, BEGIN ... COMMIT keeps everything, and a
/// Query of several statements that fails keeps nothing.
#[test]
fn transactions_are_honest() {
    let s = Server::start();
    s.sql(CREATE);
    let row = |h: &str| format!("INSERT INTO cpu VALUES ('{h}', 'eu', 1.0, '2024-01-01T00:00:00')");
    s.psql(&format!("BEGIN; {}; ROLLBACK", row("a"))).unwrap();
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "0");
    s.psql(&format!("BEGIN; {}; COMMIT", row("b"))).unwrap();
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "1");
    let e = s
        .psql(&format!("{}; {}; SELECT * FROM nope", row("c"), row("d")))
        .expect_err("third statement fails");
    assert!(e.contains("nope"), "{e}");
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "1");

    // Across messages of one connection, with a driver.
    let mut c = client(&s);
    c.batch_execute("BEGIN").unwrap();
    c.execute(&row("e"), &[]).unwrap();
    let n: i64 = c.query_one("SELECT count(*) FROM cpu", &[]).unwrap().get(0);
    assert_eq!(n, 2, "the transaction sees its own row");
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "1", "others do not");
    c.batch_execute("ROLLBACK").unwrap();
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "1");
    let mut t = c.transaction().unwrap();
    t.execute(&row("f"), &[]).unwrap();
    assert!(t.execute("SELECT * FROM nope", &[]).is_err());
    let e = t.execute(&row("g"), &[]).unwrap_err();
    assert_eq!(code(&e), "25P02", "{e}");
    drop(t);
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "1");
}

/// SET changes only its own connection; DataFusion's settings and unknown
/// names are refused.
#[test]
fn settings_stay_in_their_session() {
    let s = Server::start();
    let mut a = client(&s);
    let mut b = client(&s);
    a.batch_execute("SET statement_timeout = '5s'; SET TIME ZONE 'Europe/Berlin'")
        .unwrap();
    let show = |c: &mut postgres::Client, name: &str| -> String {
        let msgs = c.simple_query(&format!("SHOW {name}")).unwrap();
        msgs.iter()
            .find_map(|m| match m {
                postgres::SimpleQueryMessage::Row(r) => r.get(0).map(String::from),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(show(&mut a, "statement_timeout"), "5s");
    assert_eq!(show(&mut b, "statement_timeout"), "0");
    assert_eq!(show(&mut a, "TimeZone"), "Europe/Berlin");
    assert_eq!(show(&mut b, "TimeZone"), "UTC");
    let e = a
        .batch_execute("SET datafusion.execution.batch_size = 1")
        .unwrap_err();
    assert_eq!(code(&e), "0A000", "{e}");
    let e = a.batch_execute("SET no_such_setting = 1").unwrap_err();
    assert_eq!(code(&e), "42704", "{e}");
    let e = a
        .batch_execute("SET parse_float_as_decimal = true")
        .unwrap_err();
    assert_eq!(code(&e), "42704", "{e}");
    // b's queries are unaffected.
    let n: i64 = b.query_one("SELECT 21 * 2", &[]).unwrap().get(0);
    assert_eq!(n, 42);
}

/// A cancel request and statement_timeout stop a running query with 57014;
/// the connection goes on, and no statement keeps running.
#[test]
fn cancel_and_statement_timeout_stop_a_query() {
    let s = Server::start();
    const LONG: &str = "SELECT count(*) FROM range(1000000000000)";
    let mut c = client(&s);
    let token = c.cancel_token();
    let canceller = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        let at = Instant::now();
        token.cancel_query(postgres::NoTls).unwrap();
        at
    });
    let e = c.simple_query(LONG).unwrap_err();
    let stopped = Instant::now();
    let sent = canceller.join().unwrap();
    assert_eq!(code(&e), "57014", "{e}");
    let cancel_ms = stopped.duration_since(sent).as_millis();
    println!("cancel request to error: {cancel_ms} ms");
    assert!(cancel_ms < 10_000, "{cancel_ms} ms");

    c.batch_execute("SET statement_timeout = 300").unwrap();
    let started = Instant::now();
    let e = c.simple_query(LONG).unwrap_err();
    assert_eq!(code(&e), "57014", "{e}");
    let over_ms = started.elapsed().as_millis().saturating_sub(300);
    println!("statement_timeout overshoot: {over_ms} ms");
    assert!(over_ms < 10_000, "{over_ms} ms");
    let n: i64 = c.query_one("SELECT 7", &[]).unwrap().get(0);
    assert_eq!(n, 7);
    assert!(poll_until(Duration::from_secs(30), || s
        .metric("sandflow_statements_running")
        == Some(0.0)));
}

/// A query whose client went away stops.
#[test]
fn a_query_whose_client_left_stops() {
    let s = Server::start();
    let mut raw = Raw::connect(s.pg_port);
    let mut body = b"SELECT count(*) FROM range(1000000000000)".to_vec();
    body.push(0);
    raw.send(b'Q', &body);
    assert!(poll_until(Duration::from_secs(30), || s
        .metric("sandflow_statements_running")
        == Some(1.0)));
    raw.close();
    assert!(
        poll_until(Duration::from_secs(30), || s
            .metric("sandflow_statements_running")
            == Some(0.0)),
        "the statement kept running"
    );
}

/// Past --max-connections the next client gets FATAL 53300; a silent client
/// is dropped after --startup-timeout.
#[test]
fn connection_cap_and_startup_timeout() {
    let s = Server::start_with_args(&["--max-connections", "3", "--startup-timeout", "1s"]);
    let held: Vec<postgres::Client> = (0..3).map(|_| client(&s)).collect();
    let e = postgres::Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        postgres::NoTls,
    )
    .err()
    .expect("the fourth connection is refused");
    assert_eq!(code(&e), "53300", "{e}");
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(message.contains("max-connections"), "{message}");
    drop(held);
    assert!(poll_until(Duration::from_secs(30), || {
        postgres::Client::connect(
            &format!(
                "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
                s.pg_port
            ),
            postgres::NoTls,
        )
        .is_ok()
    }));
    // A client that connects and says nothing is dropped.
    let mut silent = Raw::connect_bare(s.pg_port);
    let started = Instant::now();
    assert!(silent.closed_by_server());
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// Text that is not UTF-8, NUL in text, and malformed protocol messages are
/// refused, not altered; the connection goes on.
#[test]
fn bad_input_is_refused_not_altered() {
    let s = Server::start();
    s.sql(CREATE);
    let mut raw = Raw::connect(s.pg_port);
    let msgs = raw.query(b"INSERT INTO cpu VALUES ('\xff\xfe', 'eu', 1.0, '2024-01-01T00:00:00')");
    assert_eq!(error_codes(&msgs), vec!["22021"], "{msgs:?}");
    assert_eq!(first_value(&raw.query(b"SELECT 1")).as_deref(), Some("1"));
    let msgs = raw
        .query(b"INSERT INTO cpu VALUES ('a' || chr(0) || 'b', 'eu', 1.0, '2024-01-01T00:00:00')");
    assert_eq!(error_codes(&msgs), vec!["22021"], "{msgs:?}");
    let msgs = raw.query(b"INSERT INTO cpu VALUES (E'a\\000b', 'eu', 1.0, '2024-01-01T00:00:00')");
    assert_eq!(error_codes(&msgs).len(), 1, "{msgs:?}");
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "0");

    // Malformed Bind messages: 08P01, and the connection is usable after Sync.
    raw.parse("SELECT $1::BIGINT");
    raw.bind(&[0], &[(1, b"1"), (1, b"2")], &[]);
    let msgs = raw.execute_sync();
    assert_eq!(
        error_codes(&msgs),
        vec!["08P01"],
        "extra parameter: {msgs:?}"
    );
    raw.parse("SELECT $1::BIGINT");
    raw.bind(&[7], &[(1, b"1")], &[]);
    let msgs = raw.execute_sync();
    assert_eq!(error_codes(&msgs), vec!["08P01"], "format code 7: {msgs:?}");
    raw.parse("SELECT $1::BIGINT");
    raw.bind(&[0], &[(-5, b"")], &[]);
    let msgs = raw.execute_sync();
    assert_eq!(error_codes(&msgs), vec!["08P01"], "length -5: {msgs:?}");
    raw.parse("SELECT $1::BIGINT");
    raw.bind(&[0], &[(1, b"5")], &[]);
    let msgs = raw.execute_sync();
    assert!(error_codes(&msgs).is_empty(), "{msgs:?}");
    assert_eq!(first_value(&msgs).as_deref(), Some("5"));

    // A text parameter with NUL in it, through a driver.
    let mut c = client(&s);
    let e = c
        .execute(
            "INSERT INTO cpu VALUES ($1, 'eu', 1.0, '2024-01-01T00:00:00')",
            &[&"a\0b"],
        )
        .unwrap_err();
    assert_eq!(code(&e), "22021", "{e}");
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "0");
}

/// psql's \copy in and out, text and CSV, through COPY FROM STDIN / TO STDOUT.
#[test]
fn copy_in_and_out_through_the_protocol() {
    let s = Server::start();
    s.sql(CREATE);
    let dir = temp_data_dir();
    let text = dir.path().join("in.txt");
    std::fs::write(
        &text,
        "a\teu\t0.5\t2024-01-01 00:00:00\nb\tus\t\\N\t2024-01-01 00:01:00\n",
    )
    .unwrap();
    let out = s
        .psql_args(&["-c", &format!("\\copy cpu FROM '{}'", text.display())])
        .unwrap();
    assert!(out.contains("COPY 2"), "{out}");
    let csv = dir.path().join("in.csv");
    std::fs::write(
        &csv,
        "host,region,usage,ts\n\"c,d\",eu,1.5,2024-01-01T00:02:00\n",
    )
    .unwrap();
    s.psql_args(&[
        "-c",
        &format!(
            "\\copy cpu FROM '{}' WITH (FORMAT csv, HEADER true)",
            csv.display()
        ),
    ])
    .unwrap();
    assert_eq!(
        s.sql("SELECT host, usage FROM cpu ORDER BY host"),
        "a|0.5\nb|\nc,d|1.5"
    );
    let back = dir.path().join("out.csv");
    s.psql_args(&[
        "-c",
        &format!(
            "\\copy (SELECT host, usage FROM cpu ORDER BY host) TO '{}' WITH (FORMAT csv)",
            back.display()
        ),
    ])
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "a,0.5\nb,\n\"c,d\",1.5\n"
    );
    // A bad value fails the whole COPY.
    std::fs::write(
        &text,
        "x\teu\t1.0\t2024-01-01 00:00:00\ny\teu\tnot-a-number\t2024-01-01 00:00:00\n",
    )
    .unwrap();
    assert!(s
        .psql_args(&["-c", &format!("\\copy cpu FROM '{}'", text.display())])
        .is_err());
    assert_eq!(s.sql("SELECT count(*) FROM cpu"), "3");

    // Lists go out as PostgreSQL's array text and come back in from it.
    s.sql("CREATE TABLE l (k STRING, xs BIGINT[], ss STRING[], ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))");
    let lists = r#"a	{1,NULL,3}	{"x,y","q\\"z",NULL,""}	1970-01-01 00:00:00.000000
b	{}	\N	1970-01-01 00:00:00.000000
"#;
    std::fs::write(&text, lists).unwrap();
    s.psql_args(&["-c", &format!("\\copy l FROM '{}'", text.display())])
        .unwrap();
    assert_eq!(
        s.sql("SELECT k, xs[3], cardinality(xs), ss[2] FROM l ORDER BY k"),
        "a|3|3|q\"z\nb||0|"
    );
    s.psql_args(&["-c", &format!("\\copy l TO '{}'", back.display())])
        .unwrap();
    assert_eq!(std::fs::read_to_string(&back).unwrap(), lists);
    std::fs::write(&text, "c\t{1,{2}}\t\\N\t1970-01-01 00:00:00\n").unwrap();
    let e = s
        .psql_args(&["-c", &format!("\\copy l FROM '{}'", text.display())])
        .unwrap_err();
    assert!(e.contains("lists of lists are not supported"), "{e}");
}

// ALTER TABLE over psql: a new column reads as its DEFAULT for the rows
// already there; a lossy type change is refused with SQLSTATE 0A000.
#[test]
fn psql_alter_table() {
    let s = Server::start();
    s.sql(CREATE);
    s.sql("INSERT INTO cpu (host, region, usage, ts) VALUES ('a', 'eu', 0.5, 0)");
    assert_eq!(
        s.sql("ALTER TABLE cpu ADD COLUMN rack STRING DEFAULT 'r1' AFTER host"),
        "ALTER TABLE"
    );
    assert_eq!(s.sql("SELECT host, rack, usage FROM cpu"), "a|r1|0.5");
    let d = s.sql("\\d cpu");
    assert!(d.contains("rack"), "{d}");
    let err = s.sql_err("ALTER TABLE cpu MODIFY COLUMN usage INT");
    assert!(
        err.contains("0A000") || err.contains("without loss"),
        "{err}"
    );
    assert_eq!(s.sql("ALTER TABLE cpu RENAME TO cpu2"), "ALTER TABLE");
    assert_eq!(s.sql("SELECT count(*) FROM cpu2"), "1");
}
