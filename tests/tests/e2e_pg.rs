//! End-to-end: the real binary over the PostgreSQL wire protocol with psql
//! (simple query protocol).

use sandflow_tests::harness::{lines, Server};

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
        ("ALTER TABLE cpu ADD COLUMN x INT", "create a new table"),
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

// Statements run in `public`: a connection naming another existing database
// is refused at startup instead of silently running there; a name that is no
// database (psql's default is the user name) still connects to `public`.
#[test]
fn connecting_to_another_database_is_refused_by_name() {
    let s = Server::start();
    s.sql("CREATE DATABASE metrics");
    let err = s
        .psql_args(&["-d", "metrics", "-c", "SELECT 1"])
        .expect_err("metrics is not public");
    assert!(
        err.contains("database 'metrics'") && err.contains("not supported yet"),
        "{err}"
    );
    assert_eq!(
        s.psql_args(&["-d", "sandflow", "-c", "SELECT 1"])
            .unwrap()
            .trim(),
        "1"
    );
    assert_eq!(s.sql("SELECT 1"), "1");
}
