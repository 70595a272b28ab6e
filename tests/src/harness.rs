//! Runs the real `sandflow` binary for end-to-end tests: free ports, a
//! temporary data directory, readiness, psql and HTTP clients, and a Drop
//! guard that never leaves a server behind.
//!
//! The binary is `$SANDFLOW_BIN` when set; otherwise `sandflow-e2e`, which
//! this package builds from the same `sandflow_server::app::main` as the
//! `sandflow` binary, so `cargo test` always runs a fresh build.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where the server binary is.
pub fn server_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SANDFLOW_BIN") {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<test-binary> -> target/<profile>/sandflow-e2e
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe
        .parent()
        .expect("test binary has a directory")
        .to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join(format!("sandflow-e2e{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} not found: build it with `cargo build -p sandflow-tests --bin sandflow-e2e` or set SANDFLOW_BIN",
        bin.display()
    );
    bin
}

/// A running server; killed (SIGKILL) on drop if still running.
pub struct Server {
    child: Option<Child>,
    pub pg_port: u16,
    pub http_port: u16,
    pub mysql_port: u16,
    /// Whether the HTTP address serves HTTPS (the server has a certificate).
    pub https: bool,
    pub data_dir: PathBuf,
    log: Arc<Mutex<Vec<String>>>,
    _tmp: Option<Arc<tempfile::TempDir>>,
}

/// A temporary data directory that outlives several server runs. With
/// `SANDFLOW_TEST_KEEP_DATA=1` it is left on disk after the test (its path
/// is printed), to look at what a failing run stored.
pub fn temp_data_dir() -> Arc<tempfile::TempDir> {
    let keep = std::env::var_os("SANDFLOW_TEST_KEEP_DATA").is_some_and(|v| v == "1");
    let dir = tempfile::Builder::new()
        .prefix("sandflow-e2e-")
        .disable_cleanup(keep)
        .tempdir()
        .expect("tempdir");
    if keep {
        eprintln!("data directory kept: {}", dir.path().display());
    }
    Arc::new(dir)
}

/// How to start a server.
#[derive(Default, Clone)]
pub struct Options {
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// When set, the harness passes only `start` and `args` (no
    /// --data-dir, --postgres-addr, --http-addr): settings come from the
    /// config file or environment the test provides.
    pub bare: bool,
}

impl Server {
    /// A fresh server on a fresh temporary directory.
    pub fn start() -> Server {
        let tmp = temp_data_dir();
        Self::start_with(tmp, Options::default())
    }

    /// A server on `dir` (kept alive by the returned server).
    pub fn start_in(dir: Arc<tempfile::TempDir>) -> Server {
        Self::start_with(dir, Options::default())
    }

    /// A server on a fresh data directory with these extra flags (e.g.
    /// `["--flow-tick-interval", "100ms"]`) and otherwise default options.
    pub fn start_with_args(args: &[&str]) -> Server {
        Self::start_with(
            temp_data_dir(),
            Options {
                args: args.iter().map(|a| a.to_string()).collect(),
                ..Options::default()
            },
        )
    }

    pub fn start_with(dir: Arc<tempfile::TempDir>, opts: Options) -> Server {
        let data_dir = dir.path().join("data");
        let mut cmd = Command::new(server_bin());
        cmd.arg("start");
        if !opts.bare {
            cmd.arg("--data-dir").arg(&data_dir);
            cmd.args([
                "--postgres-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--mysql-addr",
                "127.0.0.1:0",
            ]);
        }
        cmd.args(&opts.args);
        cmd.env_remove("SANDFLOW_POSTGRES_ADDR")
            .env_remove("SANDFLOW_HTTP_ADDR")
            .env_remove("SANDFLOW_DATA_DIR")
            .env_remove("SANDFLOW_CONFIG")
            // Servers of tests run side by side: never the fixed default port.
            .env("SANDFLOW_MYSQL_ADDR", "127.0.0.1:0")
            // Tests listen on loopback only; those of authentication set
            // SANDFLOW_AUTH (or --auth) themselves.
            .env("SANDFLOW_AUTH", "none")
            .env_remove("SANDFLOW_ADMIN_PASSWORD");
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn sandflow");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<(String, u16, bool)>();
        {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    for (door, marker) in [
                        ("pg", "PostgreSQL server listening on "),
                        ("http", "HTTP server listening on "),
                        ("mysql", "MySQL server listening on "),
                    ] {
                        if let Some(pos) = line.find(marker) {
                            let mut words = line[pos + marker.len()..].split_whitespace();
                            let addr = words.next().unwrap_or("");
                            let https = words.next() == Some("(https)");
                            if let Some(port) =
                                addr.rsplit(':').next().and_then(|p| p.parse::<u16>().ok())
                            {
                                let _ = tx.send((door.to_string(), port, https));
                            }
                        }
                    }
                    if std::env::var_os("SANDFLOW_E2E_ECHO").is_some() {
                        eprintln!("[sandflow] {line}");
                    }
                    log.lock().unwrap().push(line);
                }
            });
        }
        let mut server = Server {
            child: Some(child),
            pg_port: 0,
            http_port: 0,
            mysql_port: 0,
            https: false,
            data_dir,
            log,
            _tmp: Some(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.pg_port == 0 || server.http_port == 0 || server.mysql_port == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(200))) {
                Ok((door, port, _)) if door == "pg" => server.pg_port = port,
                Ok((door, port, _)) if door == "mysql" => server.mysql_port = port,
                Ok((_, port, https)) => {
                    server.http_port = port;
                    server.https = https;
                }
                Err(_) => {
                    if let Some(status) = server
                        .child
                        .as_mut()
                        .and_then(|c| c.try_wait().ok().flatten())
                    {
                        panic!(
                            "sandflow exited with {status} before listening:\n{}",
                            server.logs()
                        );
                    }
                    if Instant::now() >= deadline {
                        panic!(
                            "sandflow did not report its ports in 60s:\n{}",
                            server.logs()
                        );
                    }
                }
            }
        }
        // Ready when /health answers.
        loop {
            let ready = match server.https {
                false => matches!(server.try_http("GET", "/health", None, ""), Ok((200, _))),
                // Readiness only: the tests of TLS check the certificate.
                true => Command::new("curl")
                    .args([
                        "-sk",
                        "--max-time",
                        "5",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                    ])
                    .arg(format!("https://127.0.0.1:{}/health", server.http_port))
                    .output()
                    .is_ok_and(|o| o.stdout == b"200"),
            };
            if ready {
                break;
            }
            if Instant::now() >= deadline {
                panic!("sandflow /health did not answer:\n{}", server.logs());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// The data directory handle, to restart on the same data.
    pub fn dir(&self) -> Arc<tempfile::TempDir> {
        self._tmp.clone().expect("server has a temp dir")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Everything the server logged so far.
    pub fn logs(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// Stops the server with SIGTERM, asserting a clean exit, and starts it
    /// again on the same data directory, with the default options.
    pub fn restart(mut self) -> Server {
        assert!(self.stop(), "unclean shutdown:\n{}", self.logs());
        Server::start_in(self.dir())
    }

    /// SIGTERM, then wait (SIGKILL after 30 s). Returns whether it exited
    /// cleanly (status 0) within the time.
    pub fn stop(&mut self) -> bool {
        self.stop_with("-TERM")
    }

    /// Sends `signal` (e.g. "-INT"), then waits like [`Server::stop`].
    pub fn stop_with(&mut self, signal: &str) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.success(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return false;
                }
            }
        }
    }

    /// Sends `signal` (e.g. "-STOP", "-CONT") and returns at once.
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Runs `sql` (or a psql meta-command) through psql; Ok(stdout) or
    /// Err(stderr) when psql fails.
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        self.psql_args(&["-c", sql])
    }

    pub fn psql_args(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("timeout")
            .args([
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
            .args(["-h", "127.0.0.1", "-p", &self.pg_port.to_string()])
            .args(["-U", "sandflow", "-d", "public"])
            .args(args)
            .env("PGSSLMODE", "disable")
            .env("PGGSSENCMODE", "disable")
            .env("PGCONNECT_TIMEOUT", "10")
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    }

    /// psql that must succeed; returns trimmed stdout.
    pub fn sql(&self, sql: &str) -> String {
        match self.psql(sql) {
            Ok(s) => s.trim().to_string(),
            Err(e) => panic!(
                "psql {sql:?} failed: {e}\n--- server log ---\n{}",
                self.logs()
            ),
        }
    }

    /// psql that must fail; returns the error text.
    pub fn sql_err(&self, sql: &str) -> String {
        match self.psql(sql) {
            Ok(s) => panic!("psql {sql:?} should fail but printed {s:?}"),
            Err(e) => e,
        }
    }

    pub fn http(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> (u16, String) {
        self.try_http(method, path, content_type, body)
            .unwrap_or_else(|e| panic!("HTTP {method} {path}: {e}\n{}", self.logs()))
    }

    pub fn try_http(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: &str,
    ) -> Result<(u16, String), String> {
        http_request(self.http_port, method, path, content_type, body)
    }

    /// A request with extra headers (e.g. `Origin`, or a `Host` other than
    /// `127.0.0.1:<port>`); (status, body).
    pub fn http_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        http_request_with(self.http_port, method, path, headers, body)
            .unwrap_or_else(|e| panic!("HTTP {method} {path}: {e}\n{}", self.logs()))
    }

    /// The value of the series whose `/metrics` line starts with `series`
    /// (its name and labels, e.g. `sandflow_open_connections{frontdoor="http"}`).
    pub fn metric(&self, series: &str) -> Option<f64> {
        let (status, text) = self.http("GET", "/metrics", None, "");
        assert_eq!(status, 200, "{text}");
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    }

    /// `POST /v1/sql` with the SQL as a form field; (status, JSON).
    pub fn http_sql(&self, sql: &str) -> (u16, serde_json::Value) {
        let body = format!("sql={}", url_encode(sql));
        let (status, text) = self.http(
            "POST",
            "/v1/sql?db=public",
            Some("application/x-www-form-urlencoded"),
            &body,
        );
        let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
        (status, json)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Percent-encodes for a form body or query string.
pub fn url_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A one-shot HTTP/1.1 request to 127.0.0.1:`port`.
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> Result<(u16, String), String> {
    let headers: Vec<(&str, &str)> = content_type
        .map(|ct| vec![("Content-Type", ct)])
        .unwrap_or_default();
    http_request_with(port, method, path, &headers, body)
}

/// A one-shot HTTP/1.1 request to 127.0.0.1:`port` with extra `headers`; a
/// `Host` among them replaces the default `127.0.0.1:<port>`.
pub fn http_request_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let mut req = format!("{method} {path} HTTP/1.1\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: 127.0.0.1:{port}\r\n"));
    }
    req.push_str(&format!(
        "Connection: close\r\nContent-Length: {}\r\n",
        body.len()
    ));
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    read_response(&mut s)
}

/// A kept-open HTTP/1.1 connection to 127.0.0.1:`port`, for tests that hold
/// connections or send partial requests.
pub struct Conn {
    pub stream: TcpStream,
    port: u16,
}

impl Conn {
    /// Connects; reads time out after 60 s.
    pub fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        Conn { stream, port }
    }

    /// Sends a request (keep-alive) and reads its response, which must have a
    /// Content-Length: (status, body).
    pub fn request(&mut self, method: &str, path: &str) -> Result<(u16, String), String> {
        let req = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: 0\r\n\r\n",
            self.port
        );
        self.stream
            .write_all(req.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        let mut byte = [0u8; 1];
        while !raw.ends_with(b"\r\n\r\n") {
            match self.stream.read(&mut byte) {
                Ok(0) => return Err(format!("connection closed after {raw:?}")),
                Ok(_) => raw.push(byte[0]),
                Err(e) => return Err(e.to_string()),
            }
        }
        let head = String::from_utf8_lossy(&raw).into_owned();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("no status in {head:?}"))?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .ok_or_else(|| format!("no Content-Length in {head:?}"))?;
        let mut body = vec![0u8; length];
        self.stream
            .read_exact(&mut body)
            .map_err(|e| e.to_string())?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// Reads an HTTP/1.1 response up to the end of the stream: (status, body).
pub fn read_response(s: &mut TcpStream) -> Result<(u16, String), String> {
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("malformed response: {text:?}"))?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Whether a Python module can be imported.
/// The PostgreSQL JDBC driver's jar (`PGJDBC_JAR`, else Debian's), if it
/// and `java` are there; `None` (saying the test is skipped) otherwise.
pub fn jdbc_jar() -> Option<String> {
    let jar =
        std::env::var("PGJDBC_JAR").unwrap_or_else(|_| "/usr/share/java/postgresql.jar".into());
    let have_java = Command::new("java")
        .arg("-version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have_java || !Path::new(&jar).exists() {
        eprintln!("SKIPPED: the jdbc test needs java and {jar}");
        return None;
    }
    Some(jar)
}

pub fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Runs a Python script with `PGPORT` set; Ok(stdout) or Err(output).
pub fn run_python(script: &str, pg_port: u16) -> Result<String, String> {
    let out = Command::new("timeout")
        .args(["-k", "5", "120", "python3", "-c", script])
        .env("PGPORT", pg_port.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "status {}\nstdout:\n{}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Sorted non-empty lines.
pub fn lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    v.sort();
    v
}

/// Waits until `path` exists or the time is up.
pub fn wait_for_file(path: &Path, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Calls `done` every 50 ms until it returns true or `timeout` has passed;
/// returns whether it did.
pub fn poll_until(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A free TCP port on loopback (free when asked; a test binds it soon).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// A program from Debian's packages, by name, in PATH or an sbin directory
/// (`nats-server` is in /usr/sbin); `make setup` installs them.
pub fn system_program(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/local/sbin".into(), "/sbin".into()])
        .map(|d: PathBuf| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("{name} not found: install Debian's {package} (`make setup` does)")
        })
}

/// A real etcd server on loopback with a temporary data directory; killed on
/// drop.
pub struct Etcd {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Etcd {
    pub fn start() -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("sandflow-etcd-")
            .tempdir()
            .expect("tempdir");
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.path().join("etcd.log")).expect("etcd log");
        let child = Command::new(system_program("etcd", "etcd-server"))
            .args(["--name", "t", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        let etcd = Etcd {
            child,
            port,
            _dir: dir,
        };
        let healthy = poll_until(Duration::from_secs(30), || {
            matches!(http_request(port, "GET", "/health", None, ""),
                Ok((200, body)) if body.contains("true"))
        });
        assert!(healthy, "etcd did not become healthy on port {port}");
        etcd
    }

    /// The client URL, as `--etcd` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A real nats-server with JetStream on loopback, storing in a temporary
/// directory; killed on drop.
pub struct Nats {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl Nats {
    pub fn start() -> Nats {
        let dir = tempfile::Builder::new()
            .prefix("sandflow-nats-")
            .tempdir()
            .expect("tempdir");
        let (port, monitor) = (free_port(), free_port());
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("nats log");
        let child = Command::new(system_program("nats-server", "nats-server"))
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string(), "-sd"])
            .arg(dir.path().join("js"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nats-server");
        let nats = Nats {
            child,
            port,
            _dir: dir,
        };
        let healthy = poll_until(Duration::from_secs(30), || {
            matches!(
                http_request(monitor, "GET", "/healthz", None, ""),
                Ok((200, _))
            )
        });
        assert!(healthy, "nats-server did not become healthy on port {port}");
        nats
    }

    /// The URL, as `--nats` takes it.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Sends the server `signal` (e.g. "-STOP", "-CONT").
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
