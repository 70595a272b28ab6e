//! End-to-end: TLS on the front doors of the real binary, with a test CA and
//! server certificate made here by the `openssl` CLI. psql, psycopg (with
//! PostgreSQL 17's direct negotiation too), the mariadb client and curl
//! verify the certificate; `--require-tls` refuses plaintext logins; a server
//! without a certificate goes on in plaintext; a certificate that cannot be
//! used stops the server with the reason.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandflow_tests::harness::{server_bin, temp_data_dir, Options, Server};

/// The files of a test PKI.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// A CA that did not sign the server's certificate.
    other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (/usr/bin/openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA (`name`.pem, `name`.key) for 2 days.
fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-subj",
            &format!("/CN=sandflow test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

/// A CA, and a server certificate it signs for localhost and 127.0.0.1.
fn make_pki(dir: &Path) -> Pki {
    make_ca(dir, "ca");
    make_ca(dir, "other-ca");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        other_ca: dir.join("other-ca.pem"),
    }
}

/// A data directory and a PKI made in it.
fn setup() -> (Arc<tempfile::TempDir>, Pki) {
    let dir = temp_data_dir();
    let pki = make_pki(dir.path());
    (dir, pki)
}

fn path(p: &Path) -> String {
    p.to_str().expect("UTF-8 temp path").to_string()
}

/// Output of a client run: Ok(stdout) or Err(stderr and stdout).
fn output(cmd: &mut Command) -> Result<String, String> {
    let out = cmd.stdin(Stdio::null()).output().expect("run client");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// psql with `conninfo` (libpq settings only from it).
fn psql(conninfo: &str, commands: &[&str]) -> Result<String, String> {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "-k",
        "5",
        "60",
        "psql",
        "-X",
        "-A",
        "-t",
        "-v",
        "ON_ERROR_STOP=1",
    ])
    .arg(conninfo);
    for c in commands {
        cmd.args(["-c", c]);
    }
    for var in [
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGHOST",
        "PGPORT",
        "PGSSLNEGOTIATION",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("PGGSSENCMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10");
    output(&mut cmd)
}

fn conninfo(s: &Server, host: &str, settings: &str) -> String {
    format!(
        "host={host} port={} user=sandflow dbname=public {settings}",
        s.pg_port
    )
}

/// Runs a psycopg script with `DSN` set.
fn psycopg(script: &str, dsn: &str) -> Result<String, String> {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "60", "python3", "-c", script])
        .env("DSN", dsn)
        .env("PGGSSENCMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10");
    for var in [
        "PGSSLMODE",
        "PGSSLROOTCERT",
        "PGHOST",
        "PGPORT",
        "PGSSLNEGOTIATION",
    ] {
        cmd.env_remove(var);
    }
    output(&mut cmd)
}

const PSYCOPG_QUERY: &str = r#"
import os, psycopg
with psycopg.connect(os.environ["DSN"], autocommit=True) as conn:
    print("ssl", conn.pgconn.ssl_in_use)
    print("answer", conn.execute("SELECT 40 + 2").fetchone()[0])
"#;

/// The mariadb client over TCP to `host` with `ssl` options.
fn mysql(s: &Server, host: &str, ssl: &[&str], sql: &str) -> Result<String, String> {
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "60", "mysql", "--protocol=TCP", "-h", host])
        .args(["-P", &s.mysql_port.to_string(), "-u", "sandflow"])
        .args(ssl)
        .args(["--connect-timeout=10", "--batch", "--skip-column-names"])
        .args(["-e", sql]);
    output(&mut cmd)
}

/// curl against the HTTP door; `url` is the part after the port. Returns
/// (status, body) or Err(curl's error).
fn curl(
    s: &Server,
    scheme: &str,
    ca: Option<&Path>,
    url: &str,
    args: &[&str],
) -> Result<(u16, String), String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "30", "-w", "\n%{http_code}"])
        // localhost is the name in the certificate; never ::1.
        .args(["--resolve", &format!("localhost:{}:127.0.0.1", s.http_port)]);
    if let Some(ca) = ca {
        cmd.arg("--cacert").arg(ca);
    }
    cmd.args(args)
        .arg(format!("{scheme}://localhost:{}{url}", s.http_port));
    let out = output(&mut cmd)?;
    let (body, status) = out
        .trim_end()
        .rsplit_once('\n')
        .unwrap_or(("", out.trim_end()));
    Ok((status.parse().unwrap_or(0), body.to_string()))
}

/// Starts a server with TLS from flags (`extra` added).
fn tls_server(dir: &Arc<tempfile::TempDir>, pki: &Pki, extra: &[&str]) -> Server {
    let mut args = vec![
        "--tls-cert".to_string(),
        path(&pki.cert),
        "--tls-key".to_string(),
        path(&pki.key),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    Server::start_with(
        dir.clone(),
        Options {
            args,
            ..Default::default()
        },
    )
}

/// A raw connection that has sent an SSLRequest; the server's one-byte
/// answer.
fn ssl_request(port: u16) -> (TcpStream, u8) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = 8i32.to_be_bytes().to_vec();
    request.extend_from_slice(&80_877_103i32.to_be_bytes());
    stream.write_all(&request).unwrap();
    let mut answer = [0u8; 1];
    stream
        .read_exact(&mut answer)
        .expect("answer to SSLRequest");
    (stream, answer[0])
}

/// Waits for the server to close `stream`; false if it is still open after
/// `within`.
fn closed_within(mut stream: TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// PostgreSQL over TLS, verified against the test CA: psql and psycopg (with
/// both negotiations); a wrong CA fails; plaintext still works without
/// --require-tls. HTTPS with curl, MySQL with the mariadb client.
#[test]
fn verify_full_against_a_test_ca() {
    let (dir, pki) = setup();
    let s = tls_server(&dir, &pki, &[]);
    assert!(s.https, "the log says HTTPS:\n{}", s.logs());
    assert!(s.logs().contains("TLS on: certificate"), "{}", s.logs());
    let verify = format!("sslmode=verify-full sslrootcert={}", path(&pki.ca));

    // psql: the connection is TLS, statements run.
    let info = conninfo(&s, "localhost", &verify);
    let out = psql(
        &info,
        &[
            "\\conninfo",
            "CREATE TABLE t (host STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (host))",
            "INSERT INTO t VALUES ('a', 1.5, '2024-01-01T00:00:00')",
            "SELECT host, v FROM t",
        ],
    )
    .unwrap_or_else(|e| panic!("psql over TLS: {e}\n{}", s.logs()));
    assert!(out.contains("SSL connection (protocol: TLSv1."), "{out}");
    assert!(out.contains("a|1.5"), "{out}");
    // The certificate names 127.0.0.1 too.
    let out = psql(&conninfo(&s, "127.0.0.1", &verify), &["SELECT 1 + 1"]).unwrap();
    assert_eq!(out.trim(), "2");

    // A CA that did not sign the certificate: refused by the client.
    let wrong = format!("sslmode=verify-full sslrootcert={}", path(&pki.other_ca));
    let e = psql(&conninfo(&s, "localhost", &wrong), &["SELECT 1"]).unwrap_err();
    assert!(e.contains("certificate verify failed"), "{e}");

    // psycopg with the same settings, by SSLRequest and by direct TLS.
    let out = psycopg(PSYCOPG_QUERY, &info).unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert!(
        out.contains("ssl True") && out.contains("answer 42"),
        "{out}"
    );
    let direct = format!("{info} sslnegotiation=direct");
    let out = psycopg(PSYCOPG_QUERY, &direct).unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert!(
        out.contains("ssl True") && out.contains("answer 42"),
        "{out}"
    );
    let e = psycopg(PSYCOPG_QUERY, &conninfo(&s, "localhost", &wrong)).unwrap_err();
    assert!(e.contains("certificate verify failed"), "{e}");

    // Without --require-tls, plaintext still works, and is not TLS.
    let out = psql(
        &conninfo(&s, "127.0.0.1", "sslmode=disable"),
        &["\\conninfo", "SELECT 7"],
    )
    .unwrap();
    assert!(
        !out.contains("SSL connection") && out.contains('7'),
        "{out}"
    );

    // A client that sends garbage instead of a TLS handshake is dropped; the
    // server goes on.
    let (mut raw, answer) = ssl_request(s.pg_port);
    assert_eq!(answer, b'S');
    raw.write_all(b"GET / HTTP/1.1\r\n\r\n not a TLS record")
        .unwrap();
    assert!(closed_within(raw, Duration::from_secs(20)));

    // HTTPS: every route, verified with the CA.
    let (status, body) = curl(
        &s,
        "https",
        Some(&pki.ca),
        "/v1/sql?db=public",
        &["--data-urlencode", "sql=SELECT 40 + 2 AS answer"],
    )
    .unwrap_or_else(|e| panic!("curl https: {e}\n{}", s.logs()));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("42"), "{body}");
    let line = "cpu_tls,host=b usage=2.5 1704067260000000000";
    let (status, body) = curl(
        &s,
        "https",
        Some(&pki.ca),
        "/v1/influxdb/write?db=public",
        &["--data-binary", line],
    )
    .unwrap();
    assert_eq!(status, 204, "{body}");
    for route in ["/health", "/metrics"] {
        let (status, body) = curl(&s, "https", Some(&pki.ca), route, &[]).unwrap();
        assert_eq!(status, 200, "{route}: {body}");
    }
    // Plain HTTP on that address: refused, and the statement never runs.
    let (status, body) = curl(
        &s,
        "http",
        None,
        "/v1/sql?db=public",
        &["--data-urlencode", "sql=DELETE FROM t"],
    )
    .unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("HTTPS only"), "{body}");
    // A CA that did not sign it: curl refuses (exit 60).
    let e = curl(&s, "https", Some(&pki.other_ca), "/health", &[]).unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    let out = psql(
        &conninfo(&s, "localhost", &verify),
        &["SELECT count(*) FROM t", "SELECT host FROM cpu_tls"],
    )
    .unwrap();
    assert_eq!(
        out.trim(),
        "1\nb",
        "the write over HTTPS landed, the DELETE over HTTP did not"
    );

    // MySQL: TLS verified against the CA; a wrong CA fails; plaintext is
    // still accepted without --require-tls.
    let ca = format!("--ssl-ca={}", path(&pki.ca));
    let out = mysql(
        &s,
        "localhost",
        &["--ssl", &ca, "--ssl-verify-server-cert"],
        "SELECT count(*) FROM t",
    )
    .unwrap_or_else(|e| panic!("mysql over TLS: {e}\n{}", s.logs()));
    assert_eq!(out.trim(), "1");
    let other = format!("--ssl-ca={}", path(&pki.other_ca));
    let e = mysql(
        &s,
        "localhost",
        &["--ssl", &other, "--ssl-verify-server-cert"],
        "SELECT 1",
    )
    .unwrap_err();
    assert!(e.contains("SSL") || e.contains("certificate"), "{e}");
    let out = mysql(&s, "127.0.0.1", &["--skip-ssl"], "SELECT 3").unwrap();
    assert_eq!(out.trim(), "3");
}

/// --require-tls (here from the environment): plaintext PostgreSQL logins get
/// FATAL 28000, MySQL's get error 3159; TLS logins work; a plaintext
/// CancelRequest is still taken. The startup timeout covers the handshake,
/// and a client past --max-connections reads its 53300 over TLS.
#[test]
fn require_tls_refuses_plaintext_logins() {
    let (dir, pki) = setup();
    let s = Server::start_with(
        dir.clone(),
        Options {
            args: vec![
                "--startup-timeout".into(),
                "2s".into(),
                "--max-connections".into(),
                "2".into(),
            ],
            env: vec![
                ("SANDFLOW_TLS_CERT".into(), path(&pki.cert)),
                ("SANDFLOW_TLS_KEY".into(), path(&pki.key)),
                ("SANDFLOW_REQUIRE_TLS".into(), "true".into()),
            ],
            ..Default::default()
        },
    );
    assert!(
        s.logs().contains("logins are refused (--require-tls)"),
        "{}",
        s.logs()
    );

    // psql without TLS: refused with the reason.
    let e = psql(&conninfo(&s, "127.0.0.1", "sslmode=disable"), &["SELECT 1"]).unwrap_err();
    assert!(e.contains("FATAL:  this server requires TLS"), "{e}");
    assert!(e.contains("sslmode=require"), "{e}");
    // The SQLSTATE, as a driver reads it.
    let e = postgres::Client::connect(
        &format!(
            "host=127.0.0.1 port={} user=sandflow dbname=public connect_timeout=10",
            s.pg_port
        ),
        postgres::NoTls,
    )
    .err()
    .expect("a plaintext login is refused");
    let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
    assert_eq!(code, "28000", "{e}");

    // With TLS: sslmode=require (no verification) and verify-full.
    let out = psql(
        &conninfo(&s, "localhost", "sslmode=require"),
        &["\\conninfo", "SELECT 5"],
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert!(out.contains("SSL connection") && out.contains('5'), "{out}");
    let verify = format!("sslmode=verify-full sslrootcert={}", path(&pki.ca));
    let out = psycopg(PSYCOPG_QUERY, &conninfo(&s, "localhost", &verify)).unwrap();
    assert!(
        out.contains("ssl True") && out.contains("answer 42"),
        "{out}"
    );

    // A plaintext CancelRequest is taken (closed without an error), not
    // answered 28000.
    let mut cancel = TcpStream::connect(("127.0.0.1", s.pg_port)).unwrap();
    cancel
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut request = 16i32.to_be_bytes().to_vec();
    request.extend_from_slice(&80_877_102i32.to_be_bytes());
    request.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 2]);
    cancel.write_all(&request).unwrap();
    let mut answer = Vec::new();
    let _ = cancel.read_to_end(&mut answer);
    assert!(answer.is_empty(), "a cancel got {answer:?}");

    // MySQL: plaintext refused with 3159, TLS works.
    let e = mysql(&s, "127.0.0.1", &["--skip-ssl"], "SELECT 1").unwrap_err();
    assert!(e.contains("3159"), "{e}");
    assert!(e.contains("insecure transport are prohibited"), "{e}");
    let ca = format!("--ssl-ca={}", path(&pki.ca));
    let out = mysql(
        &s,
        "localhost",
        &["--ssl", &ca, "--ssl-verify-server-cert"],
        "SELECT 6",
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", s.logs()));
    assert_eq!(out.trim(), "6");

    // HTTPS only.
    let (status, body) = curl(&s, "https", Some(&pki.ca), "/health", &[]).unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = curl(&s, "http", None, "/health", &[]).unwrap();
    assert_eq!(status, 400);

    // Two clients that never finish their TLS handshake hold both slots: the
    // next one reads "too many clients" over TLS, and the two are dropped by
    // the startup timeout.
    let (first, answer) = ssl_request(s.pg_port);
    assert_eq!(answer, b'S');
    let (second, answer) = ssl_request(s.pg_port);
    assert_eq!(answer, b'S');
    let e = psql(&conninfo(&s, "localhost", &verify), &["SELECT 1"]).unwrap_err();
    assert!(e.contains("too many clients"), "{e}");
    let started = Instant::now();
    assert!(closed_within(first, Duration::from_secs(20)));
    assert!(closed_within(second, Duration::from_secs(20)));
    assert!(started.elapsed() < Duration::from_secs(15));
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(out) = psql(&conninfo(&s, "localhost", &verify), &["SELECT 8"]) {
            ok = out.trim() == "8";
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "the slots came back\n{}", s.logs());
}

/// A server without a certificate answers SSLRequest 'N': sslmode=prefer goes
/// on in plaintext, sslmode=require fails on the client with the reason.
#[test]
fn without_tls_prefer_is_plaintext_and_require_fails() {
    let s = Server::start();
    assert!(!s.https);
    let out = psql(
        &conninfo(&s, "127.0.0.1", "sslmode=prefer"),
        &["\\conninfo", "SELECT 4"],
    )
    .unwrap();
    assert!(
        !out.contains("SSL connection") && out.contains('4'),
        "{out}"
    );
    let e = psql(&conninfo(&s, "127.0.0.1", "sslmode=require"), &["SELECT 1"]).unwrap_err();
    assert!(e.contains("server does not support SSL"), "{e}");
    let (_raw, answer) = ssl_request(s.pg_port);
    assert_eq!(answer, b'N');
}

/// A certificate and key that do not go together stop the server before it
/// opens anything, with a message that names the files; here from the TOML
/// file's [tls] section.
#[test]
fn an_unusable_certificate_stops_the_server() {
    let (dir, pki) = setup();
    let config = dir.path().join("sandflow.toml");
    std::fs::write(
        &config,
        format!(
            "[tls]\ncert = {:?}\nkey = {:?}\n",
            path(&pki.cert),
            path(&dir.path().join("ca.key"))
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let mut cmd = Command::new("timeout");
    cmd.args(["-k", "5", "60"])
        .arg(server_bin())
        .arg("start")
        .arg("--config")
        .arg(&config)
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--postgres-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .args(["--mysql-addr", "127.0.0.1:0"])
        .env("SANDFLOW_AUTH", "none");
    for var in [
        "SANDFLOW_TLS_CERT",
        "SANDFLOW_TLS_KEY",
        "SANDFLOW_REQUIRE_TLS",
        "SANDFLOW_CONFIG",
    ] {
        cmd.env_remove(var);
    }
    let e = output(&mut cmd).expect_err("the server must not start");
    assert!(e.contains("is not the key of the certificate"), "{e}");
    assert!(e.contains("ca.key") && e.contains("server.pem"), "{e}");
    assert!(!e.contains("listening on"), "{e}");
    assert!(!data.exists(), "the database was not opened");
}

#[test]
fn passwords_travel_over_verified_tls_and_plaintext_logins_are_refused() {
    let (dir, pki) = setup();
    let s = Server::start_with(
        dir.clone(),
        Options {
            args: vec![
                "--tls-cert".into(),
                path(&pki.cert),
                "--tls-key".into(),
                path(&pki.key),
                "--require-tls".into(),
                "--auth".into(),
                "password".into(),
            ],
            env: vec![("SANDFLOW_ADMIN_PASSWORD".into(), "tls-admin".into())],
            ..Default::default()
        },
    );
    let verified = conninfo(
        &s,
        "localhost",
        &format!(
            "sslmode=verify-full sslrootcert={} password=tls-admin",
            path(&pki.ca)
        ),
    );
    assert_eq!(psql(&verified, &["SELECT 6 * 7"]).unwrap().trim(), "42");
    let wrong = conninfo(
        &s,
        "localhost",
        &format!(
            "sslmode=verify-full sslrootcert={} password=nope",
            path(&pki.ca)
        ),
    );
    let e = psql(&wrong, &["SELECT 1"]).unwrap_err();
    assert!(e.contains("password authentication failed"), "{e}");
    // The right password over plaintext is refused before it is asked for.
    let plain = conninfo(&s, "127.0.0.1", "sslmode=disable password=tls-admin");
    let e = psql(&plain, &["SELECT 1"]).unwrap_err();
    assert!(e.contains("requires TLS"), "{e}");
    if sandflow_tests::harness::python_has("psycopg") {
        let out = psycopg(PSYCOPG_QUERY, &verified).unwrap();
        assert!(
            out.contains("ssl True") && out.contains("answer 42"),
            "{out}"
        );
    }
    // HTTPS with Basic credentials.
    let (status, body) = curl(
        &s,
        "https",
        Some(&pki.ca),
        "/v1/sql",
        &[
            "-u",
            "sandflow:tls-admin",
            "--data-urlencode",
            "sql=SELECT 1 AS one",
        ],
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = curl(
        &s,
        "https",
        Some(&pki.ca),
        "/v1/sql",
        &["--data-urlencode", "sql=SELECT 1"],
    )
    .unwrap();
    assert_eq!(status, 401);
}

/// `sandflow record` reaches an HTTPS server, trusting the CA it is given.
#[test]
fn record_over_https() {
    let (dir, pki) = setup();
    let s = tls_server(&dir, &pki, &[]);
    let (status, body) = curl(
        &s,
        "https",
        Some(&pki.ca),
        "/v1/sql",
        &[
            "--data-urlencode",
            "sql=CREATE TABLE r (k STRING, v DOUBLE, ts TIMESTAMP TIME INDEX, PRIMARY KEY (k)); \
             CREATE FLOW rf SINK TO rf_out AS SELECT k, sum(v) AS s FROM r GROUP BY k",
        ],
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let record = |ca: Option<&Path>| {
        let mut cmd = Command::new(sandflow_tests::harness::server_bin());
        cmd.args(["record", "--start", "--http-addr"])
            .arg(format!("https://localhost:{}", s.http_port))
            .env_remove("SANDFLOW_CACERT");
        if let Some(ca) = ca {
            cmd.arg("--cacert").arg(ca);
        }
        cmd.arg("rf")
            .stdin(Stdio::null())
            .output()
            .expect("run sandflow record")
    };
    let ok = record(Some(&pki.ca));
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let no_ca = record(None);
    assert!(!no_ca.status.success());
    assert!(String::from_utf8_lossy(&no_ca.stderr).contains("--cacert"));
    let wrong = record(Some(&pki.other_ca));
    assert!(!wrong.status.success());
    assert!(String::from_utf8_lossy(&wrong.stderr).contains("TLS"));
}
