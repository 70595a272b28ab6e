//! `sandflow start`: resolve settings, open the database, serve both front
//! doors, shut down gracefully on SIGINT/SIGTERM.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::sync::watch;
use tracing::{error, info, warn};
use tracing_subscriber::EnvFilter;

use crate::config::{Cli, Command, Config};
use crate::{http, pg};
use sandflow::database::Database;

/// The whole binary: parses the command line and runs it.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Test(args) => {
            // Quiet unless asked: the report is the output.
            if std::env::var_os("RUST_LOG").is_some() {
                init_tracing();
            }
            run_tests(&args)
        }
        Command::Record(args) => record(&args),
        Command::CompileComponent(args) => compile_component(&args),
        Command::Replay(args) => {
            if std::env::var_os("RUST_LOG").is_some() {
                init_tracing();
            }
            replay(&args)
        }
        Command::Start(args) => {
            init_tracing();
            let config = match Config::resolve(&args) {
                Ok(c) => c,
                Err(e) => {
                    error!("{e}");
                    eprintln!("sandflow: {e}");
                    return ExitCode::from(2);
                }
            };
            let runtime = match runtime("sandflow") {
                Ok(rt) => rt,
                Err(code) => return code,
            };
            let shutdown = {
                let _inside = runtime.enter();
                shutdown_signal()
            };
            match runtime.block_on(start(config, shutdown)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(message) => {
                    error!("{message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// The multi-threaded async runtime, or the exit status after saying why
/// it cannot start (`who` names the command).
fn runtime(who: &str) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("{who}: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        })
}

/// The engine named on a command line, or the exit status after saying why
/// not.
fn engine_arg(who: &str, name: &str) -> Result<sandflow::flow::FlowEngine, ExitCode> {
    match name {
        "wasm" => Ok(sandflow::flow::FlowEngine::Wasm),
        "native" => Ok(sandflow::flow::FlowEngine::Native),
        other => {
            eprintln!("{who}: unknown engine '{other}'; use wasm or native");
            Err(ExitCode::from(2))
        }
    }
}

/// `sandflow record`: one request to the server; the recording goes to the
/// file or standard output.
fn record(args: &crate::config::RecordArgs) -> ExitCode {
    use hyper::Method;
    let runtime = match runtime("sandflow record") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let path = format!(
        "/v1/flows/{}/recording",
        percent_encoding::utf8_percent_encode(&args.flow, percent_encoding::NON_ALPHANUMERIC)
    );
    let method = match (args.start, args.stop) {
        (true, _) => Method::POST,
        (_, true) => Method::DELETE,
        _ => Method::GET,
    };
    let credentials = args
        .user
        .as_deref()
        .map(|u| (u, args.password.as_deref().unwrap_or("")));
    let (status, body) = match runtime.block_on(crate::client::request(
        &args.http_addr,
        method.clone(),
        &path,
        credentials,
        args.cacert.as_deref(),
    )) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandflow record: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !status.is_success() {
        let message = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("error")?.as_str().map(str::to_string))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        eprintln!("sandflow record: {message} (HTTP {status})");
        if status == hyper::StatusCode::UNAUTHORIZED {
            eprintln!(
                "sandflow record: the server wants a login: give --user and SANDFLOW_PASSWORD \
                 (or --password)"
            );
        }
        return ExitCode::FAILURE;
    }
    if method != Method::GET {
        let what = match args.start {
            true => "started",
            false => "stopped",
        };
        eprintln!("sandflow record: recording of flow '{}' {what}", args.flow);
        return ExitCode::SUCCESS;
    }
    let written = match &args.output {
        Some(file) => std::fs::write(file, &body).map_err(|e| format!("{}: {e}", file.display())),
        None => {
            use std::io::Write;
            std::io::stdout()
                .write_all(&body)
                .map_err(|e| format!("standard output: {e}"))
        }
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandflow record: cannot write the recording: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `sandflow replay`: prints the replayed sink as CSV; exit status 0 only if
/// it equals the recording's end (and the expected file), 1 if not, 2 for a
/// file that cannot be used.
fn replay(args: &crate::config::ReplayArgs) -> ExitCode {
    use sandflow::flow::recording::{self, Recording};
    let engine = match engine_arg("sandflow replay", &args.engine) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let rec = match std::fs::read(&args.file)
        .map_err(|e| e.to_string())
        .and_then(|b| Recording::from_json(&b).map_err(|e| e.to_string()))
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandflow replay: {}: {e}", args.file.display());
            return ExitCode::from(2);
        }
    };
    let expected = match &args.expect_sink {
        None => None,
        Some(f) => match std::fs::read_to_string(f) {
            Ok(text) => Some((f, text)),
            Err(e) => {
                eprintln!("sandflow replay: {}: {e}", f.display());
                return ExitCode::from(2);
            }
        },
    };
    let runtime = match runtime("sandflow replay") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let replayed = match runtime.block_on(recording::replay(&rec, engine, None)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sandflow replay: {}: {e}", args.file.display());
            return ExitCode::FAILURE;
        }
    };
    print!("{}", replayed.csv());
    let mut ok = true;
    if replayed.matches_recording() {
        eprintln!(
            "sandflow replay: flow '{}': {} ticks, {} sink rows written; the sink equals the \
             recording's end ({} rows)",
            rec.flow.name,
            replayed.ticks,
            replayed.rows_written,
            replayed.sink.len()
        );
    } else {
        ok = false;
        eprintln!(
            "sandflow replay: flow '{}': the replayed sink ({} rows) differs from the \
             recording's end ({} rows)",
            rec.flow.name,
            replayed.sink.len(),
            replayed.recorded.len()
        );
    }
    if let Some((file, text)) = expected {
        let lines = |t: &str| -> (Option<String>, Vec<String>) {
            let mut it = t.lines().map(|l| l.trim_end_matches('\r').to_string());
            let header = it.next();
            let mut rows: Vec<String> = it.filter(|l| !l.is_empty()).collect();
            rows.sort();
            (header, rows)
        };
        let (want_header, want) = lines(&text);
        let (got_header, got) = lines(replayed.csv());
        if want_header != got_header || want != got {
            ok = false;
            eprintln!("sandflow replay: the sink differs from {}:", file.display());
            let diff = similar::TextDiff::from_lines(
                &text_of(&want_header, &want),
                &text_of(&got_header, &got),
            )
            .unified_diff()
            .header(&file.display().to_string(), "replayed")
            .to_string();
            eprint!("{diff}");
        } else {
            eprintln!("sandflow replay: the sink equals {}", file.display());
        }
    }
    match ok {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    }
}

fn text_of(header: &Option<String>, rows: &[String]) -> String {
    let mut out = header.clone().unwrap_or_default();
    out.push('\n');
    for r in rows {
        out.push_str(r);
        out.push('\n');
    }
    out
}

/// The user's cache for `sandflow test`: `$XDG_CACHE_HOME/sandflow`, else
/// `$HOME/.cache/sandflow`; none when neither is set (or is relative).
fn user_cache_dir() -> Option<std::path::PathBuf> {
    let absolute =
        |v: std::ffi::OsString| Some(std::path::PathBuf::from(v)).filter(|p| p.is_absolute());
    std::env::var_os("XDG_CACHE_HOME")
        .and_then(absolute)
        .or_else(|| {
            std::env::var_os("HOME")
                .and_then(absolute)
                .map(|h| h.join(".cache"))
        })
        .map(|d| d.join("sandflow"))
}

/// `sandflow test`: runs the files, prints a line each, writes the JUnit
/// report; exit status 0 only if every file passed (2 for bad arguments).
fn run_tests(args: &crate::config::TestArgs) -> ExitCode {
    use sandflow::testing::slt;
    let engine = match engine_arg("sandflow test", &args.engine) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let files = match slt::collect_files(&args.paths) {
        Ok(f) if f.is_empty() => {
            eprintln!("sandflow test: no .slt files in the paths given");
            return ExitCode::from(2);
        }
        Ok(f) => f,
        Err(e) => {
            eprintln!("sandflow test: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime("sandflow test") {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // One sandbox for every file: the engine component is compiled once,
    // and kept compiled on disk for the next run unless --no-cache.
    let cache_dir = match args.no_cache {
        true => None,
        false => args.cache_dir.clone().or_else(user_cache_dir),
    };
    let sandbox = match engine {
        sandflow::flow::FlowEngine::Native => None,
        sandflow::flow::FlowEngine::Wasm => {
            let config = sandflow::runtime::RuntimeConfig {
                cache_dir,
                ..Default::default()
            };
            match sandflow::runtime::Sandbox::new(config) {
                Ok(s) => Some(Arc::new(s)),
                Err(e) => {
                    eprintln!("sandflow test: cannot set up the sandbox: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let options = slt::Options {
        override_results: args.override_results,
        engine,
        sandbox,
    };
    let mut results = Vec::new();
    for file in files {
        let r = runtime.block_on(slt::run_file(&file, &options));
        println!("{}", r.report());
        results.push(r);
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    println!(
        "{} files, {} passed, {failed} failed",
        results.len(),
        results.len() - failed
    );
    if let Some(path) = &args.junit {
        if let Err(e) = std::fs::write(path, slt::junit(&results)) {
            eprintln!("sandflow test: cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Resolves when SIGINT or SIGTERM arrives. Call it inside the runtime: the
/// handlers are installed by the call, not when the future is first polled,
/// so that a signal that comes while the server is still starting (its
/// listeners may already answer) is kept for the graceful shutdown instead of
/// ending the process by the default action.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let wait = |name: &'static str, kind: SignalKind| {
            let installed = signal(kind);
            async move {
                match installed {
                    Ok(mut s) => {
                        s.recv().await;
                    }
                    Err(e) => {
                        error!("cannot listen for {name}: {e}");
                        std::future::pending::<()>().await;
                    }
                }
            }
        };
        let int = wait("SIGINT", SignalKind::interrupt());
        let term = wait("SIGTERM", SignalKind::terminate());
        async move {
            tokio::select! {
                _ = int => info!("SIGINT received"),
                _ = term => info!("SIGTERM received"),
            }
        }
    }
    #[cfg(not(unix))]
    async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
        info!("Ctrl-C received");
    }
}

/// Opens the database in `config.data_dir`, serves until `shutdown`
/// resolves, then stops both front doors and closes the database.
pub async fn start(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    // Before anything is opened: a certificate or key that cannot be used
    // stops the server with the reason.
    let tls = crate::tls::Tls::load(&config.tls).map_err(|e| e.to_string())?;
    if let Some(tls) = &tls {
        info!("TLS on: {}", tls.summary());
    }
    info!(data_dir = %config.data_dir.display(), "opening database");
    let mut flows = sandflow::flow::FlowSettings {
        tick_interval: config.flow.tick_interval,
        ..Default::default()
    };
    flows.default_limits.memory = config.flow.memory_limit;
    flows.default_limits.cpu_per_call = config.flow.cpu_limit_per_tick;
    flows.default_limits.output_rows_per_tick = config.flow.output_rows_limit_per_tick;
    flows.default_limits.state_size = config.flow.state_size_limit;
    flows.max_restarts = config.flow.max_restarts;
    flows.restart_backoff = config.flow.restart_backoff;
    flows.max_flows = config.flow.max_flows;
    flows.sleep_after = config.flow.sleep_after;
    flows.threads = config.flow.threads;
    flows.max_component_size = config.flow.max_component_size;
    // A node that stores databases feeds the change streams.
    flows.export_changes = config
        .cluster
        .as_ref()
        .is_some_and(|c| c.role.stores() && c.nats.is_some());
    // Uploads compile in a child process of this binary, bounded in memory
    // and killed at the compile timeout.
    match std::env::current_exe() {
        Ok(program) => {
            flows.component_compiler = sandflow::flow::ComponentCompiler::Process {
                program,
                args: vec![
                    "compile-component".into(),
                    "--memory-limit".into(),
                    config.flow.component_compile_memory.to_string(),
                ],
            }
        }
        Err(e) => warn!(
            error = %e,
            "cannot find this program's path: uploaded components compile in this process, \
             bounded in time but not in memory"
        ),
    }
    let db = Database::open_with(&config.data_dir, flows)
        .await
        .map_err(|e| format!("cannot open database in {}: {e}", config.data_dir.display()))?;
    let weak = Arc::downgrade(&db);
    db.metrics().gauge_fn(
        "sandflow_statements_running",
        "Statements running now (one whose client went away or timed out no longer counts).",
        &[],
        move || {
            weak.upgrade()
                .map_or(0.0, |db| db.running_statements() as f64)
        },
    );

    if config.auth.mode == crate::config::AuthMode::Password {
        crate::auth::bootstrap(&db, &config.data_dir).await?;
    } else {
        tracing::warn!(
            "authentication is off (--auth none): every client of {} and {} is the superuser",
            config.postgres_addr,
            config.http_addr
        );
    }
    let gate = Arc::new(crate::auth::Gate::new(
        db.clone(),
        config.auth.mode,
        config.auth.max_connections_per_user,
    ));
    let pg_listener = pg::bind(config.postgres_addr).await.map_err(|e| {
        format!(
            "cannot listen on {} for PostgreSQL: {e}",
            config.postgres_addr
        )
    })?;
    let http_listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .map_err(|e| format!("cannot listen on {} for HTTP: {e}", config.http_addr))?;
    let mysql_listener = match tokio::net::TcpListener::bind(config.mysql_addr).await {
        Ok(l) => Some(l),
        // The default MySQL port may belong to another server (GreptimeDB's
        // port): without an explicit --mysql-addr, go on without that door.
        Err(e) if !config.mysql_addr_given && e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::warn!(
                "MySQL front door off: {} is in use ({e}); set --mysql-addr to serve MySQL clients",
                config.mysql_addr
            );
            None
        }
        Err(e) => {
            return Err(format!(
                "cannot listen on {} for MySQL: {e}",
                config.mysql_addr
            ))
        }
    };
    let pg_addr = pg_listener.local_addr().map_err(|e| e.to_string())?;
    let http_addr = http_listener.local_addr().map_err(|e| e.to_string())?;
    let mysql_addr = match &mysql_listener {
        Some(l) => Some(l.local_addr().map_err(|e| e.to_string())?),
        None => None,
    };

    // Joined once the doors are bound, so that the address it publishes is
    // the one it serves.
    let hosted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let member = match &config.cluster {
        Some(cluster) => {
            match crate::cluster::join(cluster, http_addr, &db, hosted.clone()).await {
                Ok(m) => Some(m),
                Err(e) => {
                    drop(gate);
                    close_database(db).await;
                    return Err(e);
                }
            }
        }
        None => None,
    };
    let (cluster_stop, cluster_stopped) = watch::channel(false);
    let mut cluster_tasks = Vec::new();
    let mut internal = None;
    let cluster_nats = config.cluster.as_ref().and_then(|c| c.nats.clone());
    if let (Some(url), Some(member)) = (&cluster_nats, &member) {
        let started: Result<(), String> = async {
            let streams = crate::cluster::change_streams(url).await?;
            let candidate: String = {
                use rand::RngExt;
                let bytes: [u8; 32] = rand::rng().random();
                bytes.iter().map(|b| format!("{b:02x}")).collect()
            };
            let secret = member
                .secret(&candidate)
                .await
                .map_err(|e| format!("cannot join the cluster: {e}"))?;
            if member.role().stores() {
                info!("publishing changes to the change streams at {url}");
                cluster_tasks.push(tokio::spawn(crate::cluster::publish_changes(
                    Arc::downgrade(&db),
                    streams.clone(),
                    member.node_id().to_string(),
                    cluster_stopped.clone(),
                )));
                internal = Some(crate::flownode::internal_router(&db, secret.clone()));
                cluster_tasks.push(tokio::spawn(crate::flownode::run_placer(
                    member.clone(),
                    Arc::downgrade(&db),
                    cluster_stopped.clone(),
                )));
            }
            if member.role().runs_flows() {
                cluster_tasks.push(tokio::spawn(crate::flownode::run_flow_node(
                    member.clone(),
                    Arc::downgrade(&db),
                    streams,
                    secret,
                    hosted.clone(),
                    cluster_stopped.clone(),
                )));
            }
            Ok(())
        }
        .await;
        if let Err(e) = started {
            let _ = cluster_stop.send(true);
            let _ = member.leave().await;
            drop(gate);
            close_database(db).await;
            return Err(e);
        }
    }

    let handlers = Arc::new(
        pg::PgHandlers::new(
            db.clone(),
            pg::PgOptions {
                max_connections: config.max_connections,
                startup_timeout: config.startup_timeout,
                session: sandflow::session::SessionDefaults {
                    statement_timeout: config.statement_timeout,
                },
                tls: tls.clone(),
            },
            gate.clone(),
        )
        .map_err(|e| e.to_string())?,
    );
    let (stop_tx, stop_rx) = watch::channel(false);
    let pg_task = tokio::spawn(pg::serve(pg_listener, handlers, stop_rx.clone()));
    let mysql_task = mysql_listener.map(|listener| {
        tokio::spawn(crate::mysql::serve(
            listener,
            db.clone(),
            crate::mysql::MysqlOptions {
                max_connections: config.max_connections,
                session: sandflow::session::SessionDefaults {
                    statement_timeout: config.statement_timeout,
                },
                gate: gate.clone(),
                tls: tls.clone(),
                startup_timeout: config.startup_timeout,
            },
            stop_rx.clone(),
        ))
    });
    let mut http_stop = stop_rx;
    let https = tls.is_some();
    let http_task = tokio::spawn(http::serve(
        http_listener,
        db.clone(),
        http::Settings {
            gate: Some(gate.clone()),
            tls,
            internal,
            ..http::Settings::from_config(&config)
        },
        async move {
            let _ = http_stop.wait_for(|stop| *stop).await;
        },
    ));
    info!("PostgreSQL server listening on {pg_addr}");
    if https {
        info!("HTTP server listening on {http_addr} (https)");
    } else {
        info!("HTTP server listening on {http_addr}");
    }
    if let Some(addr) = mysql_addr {
        info!("MySQL server listening on {addr}");
    }

    shutdown.await;
    info!("shutting down: no new connections, finishing requests in flight");
    let _ = stop_tx.send(true);
    if let Err(e) = pg_task.await {
        error!("PostgreSQL server task failed: {e}");
    }
    if let Some(Err(e)) = match mysql_task {
        Some(task) => Some(task.await),
        None => None,
    } {
        error!("MySQL server task failed: {e}");
    }
    match http_task.await {
        Ok(Ok(())) => info!("HTTP server stopped"),
        Ok(Err(e)) => error!("HTTP server failed: {e}"),
        Err(e) => error!("HTTP server task failed: {e}"),
    }
    let _ = cluster_stop.send(true);
    for t in cluster_tasks {
        let _ = t.await;
    }
    // Out of the cluster at once, not after the lease runs out.
    if let Some(member) = member {
        if let Err(e) = member.leave().await {
            warn!("{e}; the cluster drops this node when its lease runs out");
        }
    }
    // The login gate holds the database too.
    drop(gate);
    close_database(db).await;
    info!("sandflow stopped");
    Ok(())
}

async fn close_database(db: Arc<Database>) {
    // Every front-door task has ended, so this is normally the last handle;
    // dropping it closes the database.
    let others = Arc::strong_count(&db) - 1;
    if others > 0 {
        info!("database still referenced {others} time(s) at shutdown");
    }
    drop(db);
    info!("database closed");
}

/// `sandflow compile-component`: bounds its own address space, reads a
/// component on standard input and compiles it as the server's sandbox
/// would (same wasmtime, same settings), writing the compiled form to
/// standard output. Exit status 2 with the reason on standard error when the
/// component is refused; an allocation past the bound aborts the process,
/// which the server reports as a failed upload.
fn compile_component(args: &crate::config::CompileComponentArgs) -> ExitCode {
    use std::io::{Read, Write};

    if let Some(limit) = args.memory_limit {
        let bound = rustix::process::Rlimit {
            current: Some(limit),
            maximum: Some(limit),
        };
        if let Err(e) = rustix::process::setrlimit(rustix::process::Resource::As, bound) {
            eprintln!("cannot bound the compiler's memory to {limit} bytes: {e}");
            return ExitCode::from(1);
        }
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("cannot read the component from standard input: {e}");
        return ExitCode::from(1);
    }
    let config = sandflow::runtime::RuntimeConfig {
        epochs: sandflow::runtime::Epochs::Manual,
        ..Default::default()
    };
    let sandbox = match sandflow::runtime::Sandbox::new(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    match sandbox.compile_untrusted(&bytes) {
        Ok((_, compiled)) => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(&compiled).and_then(|()| out.flush()) {
                eprintln!("cannot write the compiled component: {e}");
                return ExitCode::from(1);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}
