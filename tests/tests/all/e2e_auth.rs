//! End-to-end: logins, users, grants and tenant quotas on the real binary,
//! through psql, psycopg, HTTP, the line protocol and the `mysql` client.

use std::process::{Command, Stdio};
use std::time::Duration;

use sandflow_tests::harness::{
    http_request_with, poll_until, python_has, run_python, temp_data_dir, url_encode, Options,
    Server,
};

const ADMIN_PW: &str = "admin-secret";

/// A server with authentication on and the superuser's password set.
fn secured() -> Server {
    Server::start_with(
        temp_data_dir(),
        Options {
            env: vec![
                ("SANDFLOW_AUTH".into(), "password".into()),
                ("SANDFLOW_ADMIN_PASSWORD".into(), ADMIN_PW.into()),
            ],
            ..Default::default()
        },
    )
}

/// psql as `user` with `password` in `database`; Ok(stdout) or Err(stderr).
fn psql_as(
    s: &Server,
    user: &str,
    password: &str,
    database: &str,
    sql: &str,
) -> Result<String, String> {
    let out = Command::new("timeout")
        .args([
            "-k",
            "5",
            "60",
            "psql",
            "-X",
            "-A",
            "-t",
            "-w",
            "-v",
            "ON_ERROR_STOP=1",
        ])
        .args(["-v", "VERBOSITY=verbose"])
        .args(["-h", "127.0.0.1", "-p", &s.pg_port.to_string()])
        .args(["-U", user, "-d", database, "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGSSLMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::null())
        .output()
        .expect("run psql");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `GET /metrics` as `user`; (status, text).
fn metrics_as(s: &Server, user: &str, password: &str) -> (u16, String) {
    http_request_with(
        s.http_port,
        "GET",
        "/metrics",
        &[("Authorization", &format!("Token {user}:{password}"))],
        "",
    )
    .unwrap_or_else(|e| panic!("GET /metrics: {e}"))
}

fn admin(s: &Server, sql: &str) -> String {
    psql_as(s, "sandflow", ADMIN_PW, "public", sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}\n{}", s.logs()))
}

/// `POST /v1/sql` with Basic credentials; (status, body).
fn http_as(s: &Server, user: &str, password: &str, db: &str, sql: &str) -> (u16, String) {
    use base64::Engine;
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    http_request_with(
        s.http_port,
        "POST",
        &format!("/v1/sql?db={db}"),
        &[
            ("Authorization", &format!("Basic {token}")),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &format!("sql={}", url_encode(sql)),
    )
    .unwrap_or_else(|e| panic!("HTTP: {e}"))
}

/// Two tenants, `ta` (user alice) and `tb` (user bob), each with ALL on
/// their database and a table `m` in it.
fn tenants(s: &Server) {
    for (db, user) in [("ta", "alice"), ("tb", "bob")] {
        admin(
            s,
            &format!(
                "CREATE DATABASE {db}; CREATE USER {user} WITH PASSWORD '{user}-pw'; \
                 GRANT ALL ON DATABASE {db} TO {user}"
            ),
        );
        let out = psql_as(
            s,
            user,
            &format!("{user}-pw"),
            db,
            "CREATE TABLE m (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host)); \
             INSERT INTO m VALUES ('h1', 1.0, 1000), ('h2', 2.0, 2000)",
        );
        out.unwrap_or_else(|e| panic!("{user}: {e}"));
    }
}

#[test]
fn wrong_or_missing_passwords_are_refused_on_every_door() {
    let s = secured();
    // psql: the superuser logs in with its password, nobody without it.
    assert_eq!(admin(&s, "SELECT 1"), "1");
    let e = psql_as(&s, "sandflow", "wrong", "public", "SELECT 1").unwrap_err();
    assert!(
        e.contains("password authentication failed for user \"sandflow\""),
        "{e}"
    );
    let e = psql_as(&s, "nobody", "x", "public", "SELECT 1").unwrap_err();
    assert!(
        e.contains("password authentication failed for user \"nobody\""),
        "{e}"
    );
    let e = psql_as(&s, "sandflow", "", "public", "SELECT 1").unwrap_err();
    assert!(e.contains("password"), "{e}");

    // psycopg sees SQLSTATE 28P01.
    if python_has("psycopg") {
        let out = run_python(
            &format!(
                "import os, psycopg\n\
                 try:\n    psycopg.connect(host='127.0.0.1', port=os.environ['PGPORT'], user='sandflow', password='nope', dbname='public', sslmode='disable')\n    print('connected')\n\
                 except psycopg.OperationalError as e:\n    print(getattr(e, 'sqlstate', None) or str(e))\n\
                 c = psycopg.connect(host='127.0.0.1', port=os.environ['PGPORT'], user='sandflow', password='{ADMIN_PW}', dbname='public', sslmode='disable')\n\
                 print(c.execute('SELECT 40 + 2').fetchone()[0])\n"
            ),
            s.pg_port,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].contains("28P01") || lines[0].contains("password authentication failed"),
            "{out}"
        );
        assert_eq!(lines[1], "42", "{out}");
    }

    // HTTP: 401 without or with wrong credentials, 200 with the right ones.
    let (status, body) = s.http(
        "POST",
        "/v1/sql",
        Some("application/x-www-form-urlencoded"),
        "sql=SELECT%201",
    );
    assert_eq!(status, 401, "{body}");
    let (status, body) = http_as(&s, "sandflow", "wrong", "public", "SELECT 1");
    assert_eq!(status, 401, "{body}");
    let (status, body) = http_as(&s, "sandflow", ADMIN_PW, "public", "SELECT 1 AS one");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("one"), "{body}");
    // /metrics needs a login too; /health does not.
    assert_eq!(s.http("GET", "/metrics", None, "").0, 401);
    assert_eq!(s.http("GET", "/health", None, "").0, 200);

    // Line protocol: u/p parameters and Token user:password.
    let line = "cpu,host=a usage=1 1000000000";
    let (status, body) = s.http("POST", "/v1/influxdb/write?db=public", None, line);
    assert_eq!(status, 401, "{body}");
    let (status, body) = s.http(
        "POST",
        &format!("/v1/influxdb/write?db=public&u=sandflow&p={ADMIN_PW}"),
        None,
        line,
    );
    assert_eq!(status, 204, "{body}");
    let (status, body) = http_request_with(
        s.http_port,
        "POST",
        "/v1/influxdb/write?db=public",
        &[("Authorization", &format!("Token sandflow:{ADMIN_PW}"))],
        "cpu,host=b usage=2 1000000000",
    )
    .unwrap();
    assert_eq!(status, 204, "{body}");
    let (status, body) = s.http(
        "POST",
        "/v1/influxdb/write?db=public&u=sandflow&p=bad",
        None,
        line,
    );
    assert_eq!(status, 401, "{body}");
    assert_eq!(admin(&s, "SELECT count(*) FROM cpu"), "2");

    // MySQL: the native password method.
    let mysql = |user: &str, password: &str| {
        Command::new("timeout")
            .args(["-k", "5", "60", "mysql", "-h", "127.0.0.1"])
            .args(["-P", &s.mysql_port.to_string(), "-u", user])
            .arg(format!("-p{password}"))
            .args(["--batch", "--skip-column-names", "-e", "SELECT 7"])
            .stdin(Stdio::null())
            .output()
            .expect("run mysql")
    };
    let ok = mysql("sandflow", ADMIN_PW);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&ok.stdout).trim(), "7");
    let bad = mysql("sandflow", "wrong");
    assert!(!bad.status.success());
    let why = String::from_utf8_lossy(&bad.stderr);
    assert!(why.contains("Authenticate failed"), "{why}");

    // Every failure was logged with the peer and counted.
    let (status, metrics) = metrics_as(&s, "sandflow", ADMIN_PW);
    assert_eq!(status, 200);
    let failures: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sandflow_auth_failures_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(failures >= 7.0, "{metrics}");
    assert!(s.logs().contains("login failed") && s.logs().contains("peer=127.0.0.1"));
}

#[test]
fn tenants_cannot_reach_each_other_through_any_door() {
    let s = secured();
    tenants(&s);
    let alice = |sql: &str| psql_as(&s, "alice", "alice-pw", "ta", sql);
    // Alice works in her database, as herself.
    assert_eq!(alice("SELECT count(*) FROM m").unwrap(), "2");
    assert_eq!(alice("SELECT current_user").unwrap(), "alice");
    assert_eq!(alice("SHOW is_superuser").unwrap(), "off");
    let e = alice("EXPLAIN SELECT * FROM tb.m").unwrap_err();
    assert!(e.contains("42501"), "{e}");
    // ... and cannot read, write, delete, drop or alter bob's.
    for sql in [
        "SELECT * FROM tb.m",
        "INSERT INTO tb.m VALUES ('x', 1.0, 5000)",
        "DELETE FROM tb.m",
        "DROP TABLE tb.m",
        "ALTER TABLE tb.m ADD COLUMN z DOUBLE",
        "CREATE TABLE tb.n (ts TIMESTAMP TIME INDEX, v DOUBLE)",
        // Not even the shape of bob's table, in her own database.
        "CREATE TABLE shape LIKE tb.m",
        "SELECT * FROM ta.m WHERE host IN (SELECT host FROM tb.m)",
        "COPY tb.m TO STDOUT",
        "DROP DATABASE tb",
        "USE tb",
    ] {
        let e = alice(sql).unwrap_err();
        assert!(e.contains("42501"), "{sql}: {e}");
    }
    // Nothing of bob's shows in her listings.
    let dbs = alice("SHOW DATABASES").unwrap();
    assert!(!dbs.contains("tb"), "{dbs}");
    let tables = alice(
        "SELECT table_schema || '.' || table_name FROM information_schema.tables \
         WHERE table_schema NOT IN ('information_schema', 'pg_catalog')",
    )
    .unwrap();
    assert_eq!(tables, "ta.m");
    let pg = alice(
        "SELECT n.nspname || '.' || c.relname FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON c.relnamespace = n.oid \
         WHERE c.relkind = 'r' AND n.nspname NOT IN ('pg_catalog', 'information_schema')",
    )
    .unwrap();
    assert_eq!(pg, "ta.m", "{pg}");
    // Bob's rows are untouched.
    assert_eq!(
        psql_as(&s, "bob", "bob-pw", "tb", "SELECT count(*) FROM m").unwrap(),
        "2"
    );

    // Flows: reading or sinking into bob's tables is refused at CREATE FLOW.
    let e = alice(
        "CREATE FLOW steal SINK TO loot AS SELECT host, count(*) AS c FROM tb.m GROUP BY host",
    )
    .unwrap_err();
    assert!(e.contains("42501"), "{e}");
    let e = alice(
        "CREATE FLOW spill SINK TO tb.out AS SELECT host, count(*) AS c FROM m GROUP BY host",
    )
    .unwrap_err();
    assert!(e.contains("42501"), "{e}");
    // Bob's flow, and a flow chained on its sink, stay his.
    psql_as(
        &s,
        "bob",
        "bob-pw",
        "tb",
        "CREATE FLOW per_host SINK TO per_host_out AS SELECT host, count(*) AS c FROM m GROUP BY host",
    )
    .unwrap();
    let e = alice("CREATE FLOW chained SINK TO c2 AS SELECT host, sum(c) AS total FROM tb.per_host_out GROUP BY host")
        .unwrap_err();
    assert!(e.contains("42501"), "{e}");
    for sql in [
        "DROP FLOW per_host",
        "ADMIN FLUSH_FLOW('per_host')",
        "ADMIN PAUSE_FLOW('per_host')",
        "SHOW CREATE FLOW per_host",
    ] {
        let e = alice(sql).unwrap_err();
        assert!(e.contains("42501"), "{sql}: {e}");
    }
    assert_eq!(alice("SHOW FLOWS").unwrap(), "");
    assert_eq!(
        alice("SELECT count(*) FROM information_schema.flows").unwrap(),
        "0"
    );

    // HTTP and line protocol refuse her the same way.
    let (status, body) = http_as(&s, "alice", "alice-pw", "ta", "SELECT * FROM tb.m");
    assert_eq!(status, 403, "{body}");
    let (status, body) = s.http(
        "POST",
        "/v1/influxdb/write?db=tb&u=alice&p=alice-pw",
        None,
        "m,host=x v=9 9000000000",
    );
    assert_eq!(status, 403, "{body}");
    // Her /metrics do not show bob's flow.
    let (status, metrics) = metrics_as(&s, "alice", "alice-pw");
    assert_eq!(status, 200);
    assert!(!metrics.contains("per_host"), "{metrics}");
    let (_, all) = metrics_as(&s, "sandflow", ADMIN_PW);
    assert!(all.contains("flow=\"per_host\""), "{all}");
    assert!(s.logs().contains("statement denied"));
}

#[test]
fn grants_open_what_they_name_and_revokes_close_open_sessions() {
    if !python_has("psycopg") {
        eprintln!("skipped: python3 psycopg missing");
        return;
    }
    let s = secured();
    tenants(&s);
    psql_as(
        &s,
        "bob",
        "bob-pw",
        "tb",
        "CREATE TABLE other (ts TIMESTAMP TIME INDEX, v DOUBLE)",
    )
    .unwrap();
    // One psycopg session of alice stays open across the GRANT and REVOKE,
    // which run on another connection (the superuser's, in the script).
    let script = format!(
        "import os, psycopg\n\
         def conn(u, p, d):\n    c = psycopg.connect(host='127.0.0.1', port=os.environ['PGPORT'], user=u, password=p, dbname=d, sslmode='disable', autocommit=True)\n    return c\n\
         a = conn('alice', 'alice-pw', 'ta')\n\
         root = conn('sandflow', '{ADMIN_PW}', 'public')\n\
         def try_(sql):\n    try:\n        return str(a.execute(sql).fetchall())\n    except psycopg.Error as e:\n        return e.sqlstate\n\
         print(try_('SELECT count(*) FROM tb.m'))\n\
         root.execute('GRANT SELECT ON TABLE tb.m TO alice')\n\
         print(try_('SELECT count(*) FROM tb.m'))\n\
         print(try_('SELECT count(*) FROM tb.other'))\n\
         print(try_(\"INSERT INTO tb.m VALUES ('z', 1.0, 9000)\"))\n\
         root.execute('REVOKE SELECT ON TABLE tb.m FROM alice')\n\
         print(try_('SELECT count(*) FROM tb.m'))\n"
    );
    let out = run_python(&script, s.pg_port).unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        ["42501", "[(2,)]", "42501", "42501", "42501"],
        "{out}"
    );

    // A flow runs with its owner's privileges: a revoke fails it, saying why.
    admin(&s, "GRANT SELECT ON TABLE tb.m TO alice");
    psql_as(
        &s,
        "alice",
        "alice-pw",
        "ta",
        "CREATE FLOW mirror SINK TO mirror_out AS SELECT host, count(*) AS c FROM tb.m GROUP BY host",
    )
    .unwrap();
    assert!(poll_until(Duration::from_secs(30), || {
        psql_as(
            &s,
            "alice",
            "alice-pw",
            "ta",
            "SELECT count(*) FROM mirror_out",
        )
        .ok()
            == Some("2".into())
    }));
    admin(&s, "REVOKE SELECT ON TABLE tb.m FROM alice");
    let status = admin(
        &s,
        "SELECT status || ' ' || coalesce(last_error, '') FROM information_schema.flows WHERE flow_name = 'mirror'",
    );
    assert!(
        status.starts_with("failed")
            && status.contains("lost a privilege")
            && status.contains("alice"),
        "{status}"
    );
    let e = psql_as(&s, "alice", "alice-pw", "ta", "ADMIN RESUME_FLOW('mirror')").unwrap_err();
    assert!(e.contains("42501") && e.contains("lost a privilege"), "{e}");
    admin(&s, "GRANT SELECT ON TABLE tb.m TO alice");
    psql_as(&s, "alice", "alice-pw", "ta", "ADMIN RESUME_FLOW('mirror')").unwrap();
}

#[test]
fn quotas_refuse_what_goes_past_them() {
    let s = secured();
    admin(
        &s,
        "CREATE DATABASE tq WITH (max_flows = 1, max_tables = 3, flow_memory_limit = '96MiB', \
         max_cpu_limit_per_tick = '2s'); CREATE USER carol WITH PASSWORD 'c'; \
         GRANT ALL ON DATABASE tq TO carol",
    );
    let carol = |sql: &str| psql_as(&s, "carol", "c", "tq", sql);
    carol("CREATE TABLE a (ts TIMESTAMP TIME INDEX, k STRING, v DOUBLE, PRIMARY KEY (k))").unwrap();
    carol("CREATE TABLE b (ts TIMESTAMP TIME INDEX, v DOUBLE)").unwrap();
    let e = carol(
        "CREATE FLOW big SINK TO s1 WITH (memory_limit = '128MiB') AS SELECT k, count(*) AS c FROM a GROUP BY k",
    )
    .unwrap_err();
    assert!(
        e.contains("flow_memory_limit") && e.contains("quota"),
        "{e}"
    );
    let e = carol(
        "CREATE FLOW slow SINK TO s1 WITH (memory_limit = '64MiB', cpu_limit_per_tick = '5s') AS SELECT k, count(*) AS c FROM a GROUP BY k",
    )
    .unwrap_err();
    assert!(e.contains("max_cpu_limit_per_tick"), "{e}");
    carol("CREATE FLOW f1 SINK TO s1 WITH (memory_limit = '64MiB') AS SELECT k, count(*) AS c FROM a GROUP BY k").unwrap();
    let e = carol("CREATE FLOW f2 SINK TO s2 WITH (memory_limit = '16MiB') AS SELECT k, count(*) AS c FROM a GROUP BY k")
        .unwrap_err();
    assert!(e.contains("max_flows") && e.contains("1 in use"), "{e}");
    // A flow on a user component counts against the same quotas.
    let (status, json) = super::e2e_components::put_as(
        &s,
        "/v1/components/topk?db=tq",
        &sandflow_tests::engine::topk_component(),
        Some("carol:c"),
    );
    assert_eq!(status, 200, "carol uploads to her database: {json}");
    let e = carol(
        "CREATE FLOW f3 SINK TO s3 USING COMPONENT topk WITH (memory_limit = '16MiB') \
         AS SELECT k, v FROM a",
    )
    .unwrap_err();
    assert!(e.contains("max_flows") && e.contains("1 in use"), "{e}");
    // Three tables: a, b and the sink s1.
    let e = carol("CREATE TABLE c (ts TIMESTAMP TIME INDEX, v DOUBLE)").unwrap_err();
    assert!(e.contains("max_tables") && e.contains("3 in use"), "{e}");
    // Only a superuser changes quotas; raising them lets the table in.
    let e = carol("ALTER DATABASE tq SET (max_tables = 10)").unwrap_err();
    assert!(e.contains("42501"), "{e}");
    admin(&s, "ALTER DATABASE tq SET (max_tables = 10)");
    carol("CREATE TABLE c (ts TIMESTAMP TIME INDEX, v DOUBLE)").unwrap();
    // Another tenant is not limited by carol's quotas.
    admin(&s, "CREATE TABLE public.free1 (ts TIMESTAMP TIME INDEX, v DOUBLE); CREATE TABLE public.free2 (ts TIMESTAMP TIME INDEX, v DOUBLE); CREATE TABLE public.free3 (ts TIMESTAMP TIME INDEX, v DOUBLE); CREATE TABLE public.free4 (ts TIMESTAMP TIME INDEX, v DOUBLE)");
}

#[test]
fn first_start_generates_the_superuser_password() {
    let dir = temp_data_dir();
    let s = Server::start_with(
        dir.clone(),
        Options {
            env: vec![("SANDFLOW_AUTH".into(), "password".into())],
            ..Default::default()
        },
    );
    let path = s.data_dir.join("admin-password");
    let password = std::fs::read_to_string(&path).unwrap().trim().to_string();
    assert!(password.len() >= 16, "{password}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    assert_eq!(
        psql_as(&s, "sandflow", &password, "public", "SELECT 1").unwrap(),
        "1"
    );
    assert_eq!(s.logs().matches(&password).count(), 1, "logged once");
}

#[test]
fn auth_none_is_refused_on_a_non_loopback_address() {
    let dir = temp_data_dir();
    let out = Command::new(sandflow_tests::harness::server_bin())
        .args(["start", "--auth", "none", "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--postgres-addr",
            "0.0.0.0:0",
            "--http-addr",
            "127.0.0.1:0",
            "--mysql-addr",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run sandflow");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--auth none is refused") && err.contains("0.0.0.0"),
        "{err}"
    );
}

#[test]
fn storage_quota_and_connections_per_user() {
    let s = Server::start_with(
        temp_data_dir(),
        Options {
            env: vec![
                ("SANDFLOW_AUTH".into(), "password".into()),
                ("SANDFLOW_ADMIN_PASSWORD".into(), ADMIN_PW.into()),
                ("SANDFLOW_MAX_CONNECTIONS_PER_USER".into(), "2".into()),
            ],
            ..Default::default()
        },
    );
    admin(
        &s,
        "CREATE DATABASE ts WITH (max_storage = '4KiB'); CREATE USER dave WITH PASSWORD 'd'; \
         GRANT ALL ON DATABASE ts TO dave",
    );
    let dave = |sql: &str| psql_as(&s, "dave", "d", "ts", sql);
    dave("CREATE TABLE t (k STRING, v STRING, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k))").unwrap();
    let rows: Vec<String> = (0..40)
        .map(|i| format!("('key-{i:04}', '{}', {i})", "x".repeat(40)))
        .collect();
    let mut n = 0;
    let refused = poll_until(Duration::from_secs(30), || {
        n += 1;
        let batch = rows
            .iter()
            .map(|r| r.replace("key-", &format!("k{n}-")))
            .collect::<Vec<_>>()
            .join(", ");
        match dave(&format!("INSERT INTO t VALUES {batch}")) {
            Ok(_) => {
                std::thread::sleep(Duration::from_millis(300));
                false
            }
            Err(e) => {
                assert!(e.contains("max_storage") && e.contains("53400"), "{e}");
                true
            }
        }
    });
    assert!(refused, "the storage quota never refused a write");
    // The line protocol is refused too; a raised quota lets writes in.
    let (status, body) = s.http(
        "POST",
        "/v1/influxdb/write?db=ts&u=dave&p=d",
        None,
        "t,k=z v=\"y\" 1000000000",
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("max_storage"), "{body}");
    admin(&s, "ALTER DATABASE ts SET (max_storage = '1GiB')");
    std::thread::sleep(Duration::from_millis(1100));
    dave("INSERT INTO t VALUES ('late', 'y', 1)").unwrap();

    // Two connections per user: a third is refused with 53300.
    if python_has("psycopg") {
        let out = run_python(
            "import os, psycopg\n\
             def c():\n    return psycopg.connect(host='127.0.0.1', port=os.environ['PGPORT'], user='dave', password='d', dbname='ts', sslmode='disable')\n\
             a, b = c(), c()\n\
             try:\n    c()\n    print('third connected')\n\
             except psycopg.OperationalError as e:\n    print(str(e).strip().splitlines()[-1])\n\
             a.close()\n\
             print(c().execute('SELECT 1').fetchone()[0])\n",
            s.pg_port,
        )
        .unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].contains("too many connections for user \"dave\""),
            "{out}"
        );
        assert_eq!(lines[1], "1", "{out}");
    }
}

/// pgjdbc logs in with SCRAM-SHA-256 and sees 28P01 and 42501; skipped
/// with a message without `java` and the driver jar (see e2e_extended).
#[test]
fn jdbc_logins_and_grants() {
    let Some(jar) = sandflow_tests::harness::jdbc_jar() else {
        return;
    };
    let s = secured();
    tenants(&s);
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/jdbc/Auth.java");
    let out = Command::new("timeout")
        .args(["-k", "5", "180", "java", "-cp", &jar, src])
        .env("PGPORT", s.pg_port.to_string())
        .env("ADMIN_PW", ADMIN_PW)
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

/// `sandflow record` logs in with --user and SANDFLOW_PASSWORD.
#[test]
fn record_logs_in() {
    let s = secured();
    admin(
        &s,
        "CREATE TABLE r (k STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k)); \
         CREATE FLOW rf SINK TO rf_out AS SELECT k, sum(v) AS s FROM r GROUP BY k",
    );
    let record = |user: Option<&str>| {
        let mut cmd = Command::new(sandflow_tests::harness::server_bin());
        cmd.args(["record", "--start", "--http-addr"])
            .arg(format!("127.0.0.1:{}", s.http_port))
            .env_remove("SANDFLOW_USER")
            .env("SANDFLOW_PASSWORD", ADMIN_PW);
        if let Some(u) = user {
            cmd.args(["--user", u]);
        }
        cmd.arg("rf")
            .stdin(Stdio::null())
            .output()
            .expect("run sandflow record")
    };
    let refused = record(None);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("401") && why.contains("--user"), "{why}");
    let ok = record(Some("sandflow"));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}
