//! End-to-end: the MySQL front door through the `mysql` client and two
//! Python drivers (PyMySQL: text protocol; mysql-connector with
//! `prepared=True`: server-side prepared statements), CREATE FLOW and
//! ADMIN FLUSH_FLOW included.

use std::process::{Command, Stdio};

use sandflow_tests::harness::Server;

/// Runs `sql` through the `mysql` client (batch mode: tab-separated, no
/// headers); Ok(stdout) or Err(stderr).
fn mysql(s: &Server, sql: &str) -> Result<String, String> {
    let out = Command::new("timeout")
        .args(["-k", "5", "60", "mysql", "-h", "127.0.0.1"])
        .args(["-P", &s.mysql_port.to_string(), "-u", "sandflow"])
        .args(["--batch", "--skip-column-names", "-e", sql])
        .stdin(Stdio::null())
        .output()
        .expect("run mysql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn python(script: &str, port: u16) -> String {
    let out = Command::new("timeout")
        .args(["-k", "5", "120", "python3", "-c", script])
        .env("MYSQL_PORT", port.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_mysql_client_creates_a_flow_writes_and_reads_its_sink() {
    let s = Server::start();
    let ok = |sql: &str| mysql(&s, sql).unwrap_or_else(|e| panic!("{sql}: {e}\n{}", s.logs()));
    ok("CREATE TABLE cpu (host STRING, usage DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))");
    ok(
        "CREATE FLOW peak SINK TO peaks AS SELECT host, max(usage) AS highest, count(*) AS n \
        FROM cpu GROUP BY host",
    );
    ok("INSERT INTO cpu VALUES ('a', 0.5, 0), ('b', 0.9, 1000), ('a', 0.7, 2000)");
    ok("ADMIN FLUSH_FLOW('peak')");
    assert_eq!(
        ok("SELECT host, highest, n FROM peaks ORDER BY host"),
        "a\t0.7\t2\nb\t0.9\t1"
    );
    // Timestamps, NULL and several statements in one request.
    ok("INSERT INTO cpu VALUES ('c', NULL, 3000)");
    assert_eq!(
        ok("SELECT host, usage, ts FROM cpu WHERE host = 'c'"),
        "c\tNULL\t1970-01-01 00:00:03"
    );
    // A list (array_agg) prints its NULL elements as NULL.
    ok("CREATE FLOW seq SINK TO seqs AS SELECT host, array_agg(usage ORDER BY ts) AS u FROM cpu GROUP BY host");
    ok("ADMIN FLUSH_FLOW('seq')");
    assert_eq!(
        ok("SELECT host, u FROM seqs ORDER BY host"),
        "a\t[0.5, 0.7]\nb\t[0.9]\nc\t[NULL]"
    );
    assert!(ok("SHOW FLOWS").contains("peak"));
    // What the client asks on its own, and errors with MySQL's codes.
    assert!(ok("SELECT @@version_comment LIMIT 1").contains("sandflow"));
    assert_eq!(ok("SELECT DATABASE()"), "public");
    let e = mysql(&s, "SELECT * FROM nowhere").unwrap_err();
    assert!(e.contains("ERROR 1146") && e.contains("nowhere"), "{e}");
    let e = mysql(&s, "SELEKT 1").unwrap_err();
    assert!(e.contains("ERROR 1064"), "{e}");
    let e = mysql(&s, "USE metrics").unwrap_err();
    assert!(e.contains("ERROR 1049"), "{e}");
    // A database: named at connect (the client's COM_INIT_DB) or by USE.
    ok("CREATE DATABASE metrics; USE metrics; CREATE TABLE m (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k)); INSERT INTO m VALUES ('x', 1, 0)");
    assert_eq!(
        ok("USE metrics; SELECT DATABASE(), count(*) FROM m"),
        "metrics\t1"
    );
    let out = Command::new("mysql")
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            &s.mysql_port.to_string(),
            "-u",
            "sandflow",
        ])
        .args([
            "--batch",
            "--skip-column-names",
            "metrics",
            "-e",
            "SELECT k FROM m",
        ])
        .output()
        .expect("run mysql");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "x", "{out:?}");
}

#[test]
fn python_drivers_run_simple_and_prepared_statements() {
    let s = Server::start();
    let out = python(
        r#"
import os, pymysql
c = pymysql.connect(host="127.0.0.1", port=int(os.environ["MYSQL_PORT"]), user="sandflow", autocommit=True)
cur = c.cursor()
cur.execute("CREATE TABLE m (k STRING, v BIGINT, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))")
cur.execute("CREATE FLOW totals SINK TO totals_sink AS SELECT k, sum(v) AS total FROM m GROUP BY k")
n = cur.execute("INSERT INTO m VALUES (%s, %s, %s), (%s, %s, %s)", ("a", 2, 0, "it's", 3, 0))
print("inserted", n)
cur.execute("DELETE FROM m WHERE k = %s", ("a",))
cur.execute("INSERT INTO m VALUES ('b', 5, 0)")
cur.execute("ADMIN FLUSH_FLOW('totals')")
cur.execute("SELECT k, total FROM totals_sink ORDER BY k")
for row in cur.fetchall():
    print(row[0], row[1])
"#,
        s.mysql_port,
    );
    assert_eq!(out, "inserted 2\nb 5\nit's 3\n", "{}", s.logs());
    let out = python(
        r#"
import os, datetime, mysql.connector
c = mysql.connector.connect(host="127.0.0.1", port=int(os.environ["MYSQL_PORT"]), user="sandflow", autocommit=True)
cur = c.cursor(prepared=True)
cur.execute("INSERT INTO m VALUES (?, ?, ?)", ("c", 7, datetime.datetime(2024, 1, 1, 0, 0, 1)))
cur.execute("INSERT INTO m VALUES (?, ?, ?)", ("d?", -1, 0))
cur.execute("ADMIN FLUSH_FLOW('totals')")
print("flushed", cur.fetchall()[0][0])
cur.execute("SELECT k, total FROM totals_sink WHERE total < ? ORDER BY k", (100,))
for row in cur.fetchall():
    print(row[0], row[1])
cur.execute("SELECT k, ts FROM m WHERE k = ?", ("c",))
print(cur.fetchall())
"#,
        s.mysql_port,
    );
    assert_eq!(
        out,
        "flushed 2\nb 5\nc 7\nd? -1\nit's 3\n[('c', datetime.datetime(2024, 1, 1, 0, 0, 1))]\n",
        "{}",
        s.logs()
    );
}

/// The default MySQL port taken by another process turns the door off with
/// a warning (the server serves PostgreSQL and HTTP); a MySQL address that
/// was asked for and is taken stops the start with an error naming it.
#[test]
fn a_taken_default_mysql_port_turns_the_door_off_but_an_asked_one_fails() {
    use sandflow_tests::harness::{server_bin, temp_data_dir};
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};

    // Hold the default port (or find it held already by someone else).
    let _held = std::net::TcpListener::bind("127.0.0.1:4002");
    let dir = temp_data_dir();
    let mut child = Command::new(server_bin())
        .args(["start", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--postgres-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .env_remove("SANDFLOW_MYSQL_ADDR")
        .env_remove("SANDFLOW_CONFIG")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut off, mut http) = (false, false);
    let mut seen = Vec::new();
    while !(off && http) && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            off |= line.contains("MySQL front door off") && line.contains("--mysql-addr");
            http |= line.contains("HTTP server listening on");
            seen.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(off && http, "{}", seen.join("\n"));

    // Asked for, and taken: the start fails, naming the address.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(server_bin())
        .args(["start", "--data-dir"])
        .arg(dir.path().join("data2"))
        .args([
            "--postgres-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--mysql-addr", &addr])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {addr} for MySQL")),
        "{err}"
    );
}

/// A MySQL client that connects and never logs in is dropped after
/// --startup-timeout, freeing its slot; a client that logs in stays.
#[test]
fn a_client_that_never_logs_in_is_dropped() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let s = Server::start_with_args(&["--max-connections", "1", "--startup-timeout", "1s"]);
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", s.mysql_port)).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    // The greeting, then nothing until the server closes the connection.
    let mut closed = false;
    while started.elapsed() < Duration::from_secs(30) {
        match silent.read(&mut buf) {
            Ok(0) => {
                closed = true;
                break;
            }
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                closed = true;
                break;
            }
            Err(_) => break,
        }
    }
    assert!(closed, "the silent client was never dropped");
    // Its slot is free again: the one allowed connection logs in and stays
    // past the timeout.
    let out = python(
        "import os, time, pymysql\n\
         c = pymysql.connect(host='127.0.0.1', port=int(os.environ['MYSQL_PORT']), user='sandflow')\n\
         time.sleep(1.5)\n\
         cur = c.cursor()\n\
         cur.execute('SELECT 41 + 1')\n\
         print(cur.fetchone()[0])\n",
        s.mysql_port,
    );
    assert_eq!(out.trim(), "42", "{}", s.logs());
}
