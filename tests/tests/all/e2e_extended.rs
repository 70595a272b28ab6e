//! End-to-end: the extended query protocol (Parse/Bind/Describe/Execute),
//! from Rust's `postgres` crate and from psycopg 2 and 3.
//!
//! The Python tests need `pip install "psycopg[binary]" psycopg2-binary`; they
//! fail when the modules are missing unless SANDFLOW_SKIP_PYTHON=1.

use postgres::{Client, NoTls, SimpleQueryMessage};
use sandflow_tests::harness::{python_has, run_python, Server};

fn connect(s: &Server) -> Client {
    Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        NoTls,
    )
    .expect("connect")
}

// A result column is described with the type its values have. DataFusion
// coerces a UNION of an integer and a float, or CASE branches of two
// types, when the plan is analysed; a description taken from the plan as
// written said BIGINT, and binary clients read float bits as an integer.
#[test]
fn result_columns_are_described_with_their_values_types() {
    let s = Server::start();
    let mut c = connect(&s);
    c.batch_execute(
        "CREATE TABLE t (v INT, d DOUBLE, ts TIMESTAMP TIME INDEX); \
         INSERT INTO t VALUES (1, 1.5, 1000)",
    )
    .expect("table");
    let floats = |c: &mut Client, sql: &str| -> Vec<f64> {
        // `get` checks the described type: an INT8 column is not an f64.
        c.query(sql, &[])
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(|r| r.get::<_, f64>(0))
            .collect()
    };
    assert_eq!(
        floats(&mut c, "SELECT 1 AS x UNION ALL SELECT 2.5 ORDER BY x"),
        [1.0, 2.5]
    );
    assert_eq!(
        floats(
            &mut c,
            "SELECT CASE WHEN v > 1 THEN v ELSE d END AS x FROM t"
        ),
        [1.5]
    );
    // Prepared: described before it runs, with the same type.
    let stmt = c
        .prepare("SELECT 1 AS x UNION ALL SELECT 2.5")
        .expect("prepare");
    assert_eq!(stmt.columns()[0].type_(), &postgres::types::Type::FLOAT8);
    let mixed: Vec<String> = c
        .query("SELECT 1 AS x UNION ALL SELECT 'asdf' ORDER BY x", &[])
        .expect("text union")
        .iter()
        .map(|r| r.get::<_, String>(0))
        .collect();
    assert_eq!(mixed, ["1", "asdf"]);
    // Over HTTP the schema says what the rows hold.
    let (status, v) = s.http_sql("SELECT 1 AS x UNION ALL SELECT 2.5 ORDER BY x");
    assert_eq!(status, 200, "{v}");
    let records = &v["output"][0]["records"];
    assert_eq!(
        records["schema"]["column_schemas"][0]["data_type"],
        serde_json::json!("Float64"),
        "{v}"
    );
    assert_eq!(records["rows"], serde_json::json!([[1.0], [2.5]]), "{v}");
}

#[test]
fn rust_client_extended_protocol() {
    let s = Server::start();
    let mut c = connect(&s);
    // Sandflow's own statements through Parse/Bind/Execute.
    c.execute(
        "CREATE TABLE t (host STRING, v DOUBLE, n BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
        &[],
    )
    .expect("create");
    // Parameters bound into an INSERT run by the database.
    let n = c
        .execute(
            "INSERT INTO t (host, v, n, ts) VALUES ($1, $2, $3, '2024-01-01T00:00:00')",
            &[&"it's", &1.25f64, &7i64],
        )
        .expect("insert with params");
    assert_eq!(n, 1);
    let n = c
        .execute(
            "INSERT INTO t VALUES ('b', 2.5, 8, '2024-01-01T00:00:00'), ('c', 3.5, 9, '2024-01-01T00:00:00')",
            &[],
        )
        .expect("insert");
    assert_eq!(n, 2);

    // SELECT with a parameter, through datafusion-postgres.
    let rows = c
        .query(
            "SELECT host, v, n FROM t WHERE v > $1 ORDER BY host",
            &[&2.0f64],
        )
        .expect("select");
    let got: Vec<(String, f64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(got, vec![("b".into(), 2.5, 8), ("c".into(), 3.5, 9)]);

    let rows = c
        .query("SELECT host FROM t WHERE host = $1", &[&"it's"])
        .unwrap();
    assert_eq!(rows.len(), 1);

    // SHOW TABLES / DESC TABLE describe their rows in the extended protocol.
    let rows = c.query("SHOW TABLES", &[]).expect("show tables");
    let names: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    assert!(names.iter().any(|n| n == "t"), "{names:?}");
    let rows = c.query("DESC TABLE t", &[]).expect("desc");
    assert!(rows.len() >= 4);

    // Delete with a parameter.
    let n = c
        .execute("DELETE FROM t WHERE host = $1", &[&"b"])
        .expect("delete");
    assert_eq!(n, 1);

    // Errors keep the connection usable.
    assert!(c.execute("SELEC 1", &[]).is_err());
    let e = c.query("SELECT * FROM nope", &[]).unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42P01"), "{e}");
    assert!(c
        .execute(
            "INSERT INTO t (host, v, n, ts) VALUES ('z', 1.0, 1, NULL)",
            &[]
        )
        .is_err());
    let rows = c.query("SELECT count(*) FROM t", &[]).unwrap();
    assert_eq!(rows[0].get::<_, i64>(0), 2);

    // The simple protocol on the same connection.
    let msgs = c.simple_query("SELECT count(*) FROM t").unwrap();
    let row = msgs
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).map(String::from)),
            _ => None,
        })
        .flatten();
    assert_eq!(row.as_deref(), Some("2"));
}

// Flow statements through Parse/Bind/Describe/Execute: the flush runs once
// (Describe learns its columns without running it) and returns its count.
#[test]
fn flows_over_the_extended_protocol() {
    let s = Server::start();
    let mut c = connect(&s);
    c.execute(
        "CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
        &[],
    )
    .expect("create table");
    c.execute(
        "CREATE FLOW f SINK TO f_sink AS SELECT host, count(*) AS n FROM t GROUP BY host",
        &[],
    )
    .expect("create flow");
    c.execute(
        "INSERT INTO t VALUES ($1, 1.0, '2024-01-01T00:00:00'), ('b', 2.0, '2024-01-01T00:00:00')",
        &[&"a"],
    )
    .expect("insert");
    let rows = c.query("ADMIN FLUSH_FLOW('f')", &[]).expect("flush");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].get::<_, i64>(0),
        2,
        "two groups written by this flush"
    );
    let rows = c
        .query(
            "SELECT host, n FROM f_sink WHERE n >= $1 ORDER BY host",
            &[&1i64],
        )
        .expect("select sink");
    let got: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got, vec![("a".into(), 1), ("b".into(), 1)]);
    let rows = c
        .query(
            "SELECT flow_name, status FROM information_schema.flows WHERE flow_name = $1",
            &[&"f"],
        )
        .expect("information_schema.flows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, String>(1), "running");
    let rows = c.query("SHOW FLOWS", &[]).expect("show flows");
    assert_eq!(rows.len(), 1);
    c.execute("DROP FLOW f", &[]).expect("drop flow");
}

fn python_or_skip(module: &str) -> bool {
    if python_has(module) {
        return true;
    }
    if std::env::var_os("SANDFLOW_SKIP_PYTHON").is_some() {
        eprintln!("SKIPPED: python module {module} missing and SANDFLOW_SKIP_PYTHON is set");
        return false;
    }
    panic!(
        "python module {module} is missing: pip install \"psycopg[binary]\" psycopg2-binary \
         (or set SANDFLOW_SKIP_PYTHON=1)"
    );
}

#[test]
fn psycopg3() {
    if !python_or_skip("psycopg") {
        return;
    }
    let s = Server::start();
    let script = r#"
import os, psycopg
conn = psycopg.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="sandflow", dbname="public", autocommit=True)
cur = conn.cursor()
cur.execute("CREATE TABLE p3 (k STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))")
cur.execute("INSERT INTO p3 VALUES (%s, %s, '2024-01-01T00:00:00')", ("a", 1.5))
assert cur.rowcount == 1, cur.rowcount
cur.executemany("INSERT INTO p3 VALUES (%s, %s, '2024-01-01T00:00:00')", [("b", 2.5), ("c", 3.5)])
cur.execute("INSERT INTO p3 VALUES (%s, %s, '2024-01-01T00:00:00')", ("a", 9.5))  # upsert
cur.execute("SELECT k, v FROM p3 WHERE v > %s ORDER BY k", (2.0,))
rows = cur.fetchall()
assert rows == [("a", 9.5), ("b", 2.5), ("c", 3.5)], rows
cur.execute("SHOW TABLES")
assert ("p3",) in [tuple(r[:1]) for r in cur.fetchall()]
try:
    cur.execute("SELECT * FROM nope")
    raise SystemExit("expected an error")
except psycopg.Error as e:
    assert e.sqlstate == "42P01", e.sqlstate
cur.execute("DELETE FROM p3 WHERE k = %s", ("b",))
assert cur.rowcount == 1, cur.rowcount
cur.execute("SELECT count(*) FROM p3")
assert cur.fetchone()[0] == 2
# binary results
bcur = conn.cursor(binary=True)
bcur.execute("SELECT k, v FROM p3 ORDER BY k")
assert bcur.fetchall() == [("a", 9.5), ("c", 3.5)]
# a transaction block (non-autocommit)
conn2 = psycopg.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="sandflow", dbname="public")
with conn2.cursor() as c2:
    c2.execute("SELECT count(*) FROM p3")
    assert c2.fetchone()[0] == 2
conn2.commit()
print("ok")
"#;
    match run_python(script, s.pg_port) {
        Ok(out) => assert!(out.contains("ok"), "{out}"),
        Err(e) => panic!(
            "psycopg3 script failed:\n{e}\n--- server log ---\n{}",
            s.logs()
        ),
    }
}

#[test]
fn psycopg2() {
    if !python_or_skip("psycopg2") {
        return;
    }
    let s = Server::start();
    let script = r#"
import os, psycopg2
conn = psycopg2.connect(host="127.0.0.1", port=int(os.environ["PGPORT"]), user="sandflow", dbname="public")
conn.autocommit = True
cur = conn.cursor()
cur.execute("CREATE TABLE p2 (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))")
cur.execute("INSERT INTO p2 VALUES (%s, %s, %s)", ("o'neil", 1, "2024-01-01T00:00:00"))
assert cur.rowcount == 1, cur.rowcount
cur.execute("SELECT k, v FROM p2 WHERE k = %s", ("o'neil",))
assert cur.fetchall() == [("o'neil", 1)]
try:
    cur.execute("SELEC 1")
    raise SystemExit("expected an error")
except psycopg2.Error as e:
    assert e.pgcode == "42601", e.pgcode
cur.execute("SELECT 1")
assert cur.fetchone() == (1,)
print("ok")
"#;
    match run_python(script, s.pg_port) {
        Ok(out) => assert!(out.contains("ok"), "{out}"),
        Err(e) => panic!(
            "psycopg2 script failed:\n{e}\n--- server log ---\n{}",
            s.logs()
        ),
    }
}

/// pgjdbc (every statement through the extended protocol). Needs `java` and
/// the driver jar (Debian: `apt-get install libpostgresql-jdbc-java`, or set
/// PGJDBC_JAR); skipped with a message when either is missing.
#[test]
fn jdbc() {
    let Some(jar) = sandflow_tests::harness::jdbc_jar() else {
        return;
    };
    let s = Server::start();
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jdbc/Main.java");
    let out = std::process::Command::new("timeout")
        .args(["-k", "5", "180", "java", "-cp", &jar, src])
        .env("PGPORT", s.pg_port.to_string())
        .output()
        .expect("run java");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("ok"),
        "JDBC check failed:\n{stdout}\n{}\n--- server log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.logs()
    );
}
