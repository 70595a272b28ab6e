//! Server settings: flags, environment, TOML file, defaults — in that order of
//! precedence.
//!
//! ```toml
//! data_dir = "/var/lib/sandflow"
//! postgres_addr = "0.0.0.0:4003"
//! http_addr = "0.0.0.0:4000"
//! mysql_addr = "0.0.0.0:4002"
//! max_connections = 1024        # open connections per front door; past it HTTP answers 503, PostgreSQL FATAL 53300
//! startup_timeout = "60s"       # a PostgreSQL or MySQL client must finish its startup and login within it
//! statement_timeout = "0"       # statement_timeout of new PostgreSQL sessions (0: none)
//!
//! [http]
//! allowed_hosts = ["db.example.com"]  # names browsers may use to reach the server (IPs and localhost always)
//! header_read_timeout = "30s"   # a connection that sends no complete request head in time is closed
//! timeout = "300s"              # longest a /v1/sql request runs ("0": no limit); ?timeout= may lower it
//!
//! [auth]
//! mode = "password"             # "none" turns authentication off (only when every address is loopback)
//! max_connections_per_user = 0  # open connections one user may hold per front door (0: only max_connections)
//!
//! [tls]
//! cert = "server.pem"           # PEM certificate chain: PostgreSQL SSLRequest and HTTPS
//! key = "server.key"            # PEM private key
//! require = false               # true: plaintext connections are refused
//!
//! [cluster]                     # leave out to run alone
//! etcd = ["http://127.0.0.1:2379"]  # etcd's client URLs (or one comma-separated string)
//! nats = "nats://127.0.0.1:4222"    # the change streams between nodes
//! node_id = "storage-1"         # this node's id (letters, digits, '-', '_', '.')
//! role = "all"                  # storage, flow or all
//! lease_ttl = "10s"             # a node that stops renewing leaves after this
//! advertise_addr = "10.0.0.5:4000"  # address SHOW NODES shows (default: the HTTP address)
//!
//! [flow]
//! tick_interval = "200ms"      # the longest a flow with new input waits to tick (cheap ticks come sooner)
//! memory_limit = "256MiB"       # default per flow, WITH (memory_limit = ...) overrides
//! cpu_limit_per_tick = "10s"    # default per flow, WITH (cpu_limit_per_tick = ...) overrides
//! output_rows_limit_per_tick = 10000000  # default per flow (WITH overrides)
//! state_size_limit = "1GiB"     # default per flow (WITH overrides); unset: only memory_limit bounds it
//! max_restarts = 10             # automatic restarts after a transient failure (0: never)
//! restart_backoff = "1s"        # first wait before an automatic restart; doubles, at most 60s
//! max_flows = 10000             # flows the server runs at most
//! sleep_after = "60s"           # an idle flow's sandbox is released after this ("0": never)
//! max_component_size = "64MiB"  # largest user component (CREATE COMPONENT, PUT /v1/components)
//! component_compile_memory = "4GiB"  # address space of the process that compiles an upload
//! ```

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde::Deserialize;
use snafu::{ResultExt, Snafu};

pub const DEFAULT_DATA_DIR: &str = "./sandflow-data";
pub const DEFAULT_POSTGRES_ADDR: &str = "127.0.0.1:4003";
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:4000";
/// GreptimeDB's MySQL port.
pub const DEFAULT_MYSQL_ADDR: &str = "127.0.0.1:4002";
pub use sandflow::flow::DEFAULT_TICK_INTERVAL;
/// Open connections each front door accepts at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// A PostgreSQL client must complete its startup within this.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an HTTP client may take to send a complete request head.
pub const DEFAULT_HTTP_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a `/v1/sql` request may run.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Snafu)]
#[snafu(visibility(pub))]
pub enum ConfigError {
    #[snafu(display("cannot read config file {}: {source}", path.display()))]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[snafu(display("invalid config file {}: {source}", path.display()))]
    ParseFile {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[snafu(display("invalid {what} {value:?}: {message}"))]
    InvalidAddr {
        what: String,
        value: String,
        message: String,
    },
    #[snafu(display(
        "invalid duration {value:?} for {what}: {message} (use e.g. \"500ms\", \"1s\", \"2m\")"
    ))]
    InvalidDuration {
        what: String,
        value: String,
        message: String,
    },
    #[snafu(display("invalid number {value:?} for {what}: {message}"))]
    InvalidNumber {
        what: String,
        value: String,
        message: String,
    },
    #[snafu(display("invalid size {value:?} for {what}: {message}"))]
    InvalidSize {
        what: String,
        value: String,
        message: String,
    },
    #[snafu(display(
        "invalid host name {value:?} in http.allowed_hosts: give names only, without scheme, \
         port or path, separated by commas (e.g. \"db.example.com,grafana.local\"); IP \
         addresses and localhost are always allowed"
    ))]
    InvalidHost { value: String },
    #[snafu(display("invalid http.allowed_hosts in the config file: {message}"))]
    InvalidHostList { message: String },
    #[snafu(display(
        "invalid auth mode {value:?}: use \"password\" (the default: every client logs in) \
         or \"none\" (no authentication; only when every listen address is a loopback address)"
    ))]
    InvalidAuthMode { value: String },
    #[snafu(display(
        "--auth none is refused: {addr} ({what}) is not a loopback address, so anyone who can \
         reach it could read, write and drop everything. Listen on 127.0.0.1 or ::1 only, or \
         keep authentication on (the default) and log in as the superuser `sandflow`"
    ))]
    AuthNoneNotLoopback { what: String, addr: SocketAddr },
    #[snafu(display(
        "TLS needs both a certificate and a key: {given} is set but {missing} is not \
         (--tls-cert and --tls-key, SANDFLOW_TLS_CERT/SANDFLOW_TLS_KEY, or [tls] cert/key)"
    ))]
    TlsIncomplete { given: String, missing: String },
    #[snafu(display(
        "--require-tls needs a certificate and key to serve TLS with: set --tls-cert and --tls-key"
    ))]
    RequireTlsWithoutCert,
    #[snafu(display(
        "{setting} belongs to a cluster node: set --etcd too, or leave {setting} out to run alone"
    ))]
    ClusterSettingWithoutEtcd { setting: String },
    #[snafu(display(
        "--etcd needs --node-id: the name this node has in the cluster (e.g. --node-id storage-1)"
    ))]
    EtcdWithoutNodeId,
    #[snafu(display("invalid {what}: {message}"))]
    InvalidCluster { what: String, message: String },
}

/// sandflow: a time-series database whose continuous queries run in
/// WebAssembly sandboxes.
#[derive(Debug, Parser)]
#[command(name = "sandflow", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start the database server with its PostgreSQL and HTTP front doors.
    ///
    /// Every setting can come from a flag, an environment variable or the
    /// TOML file given with -c; flags win over the environment, the
    /// environment over the file, the file over the defaults. Stop the server
    /// with SIGINT or SIGTERM: it stops accepting, finishes the requests in
    /// flight and closes the database. Log verbosity follows RUST_LOG
    /// (default "info").
    Start(Box<StartArgs>),
    /// Run scenario files (sqllogictest format) against a fresh in-memory
    /// database each, on a virtual clock: `sleep 5s` moves time without
    /// waiting, `control time|flush|restart|crash` drive the database.
    /// Prints one line per file; exits 0 only if every file passes.
    Test(TestArgs),
    /// Fetch a flow's recording from a running server over HTTP (its
    /// definition, a snapshot, every tick since with the source changes it
    /// took in, and the sink at the end), or start or stop one. A recording
    /// starts with --start and goes on until --stop; fetching does not stop
    /// it.
    Record(RecordArgs),
    /// Replay a recording offline in the sandbox (or natively) and print the
    /// sink it gives as CSV. Exits 0 only if the sink equals the recording's
    /// end (and the --expect-sink file, if given), value for value.
    Replay(ReplayArgs),
    /// Internal: compiles one uploaded component read from standard input
    /// and writes its compiled form to standard output (exit 0), or why it
    /// is refused to standard error (exit 2). The server runs it as a child
    /// process so that a compile bomb costs only that process.
    #[command(hide = true)]
    CompileComponent(CompileComponentArgs),
}

/// `sandflow compile-component`.
#[derive(Debug, Clone, Args)]
pub struct CompileComponentArgs {
    /// The process's address-space bound in bytes (RLIMIT_AS), set before
    /// it reads anything.
    #[arg(long, value_name = "BYTES")]
    pub memory_limit: Option<u64>,
}

/// `sandflow record`.
#[derive(Debug, Clone, Args)]
pub struct RecordArgs {
    /// The server's HTTP address (host:port, or an http:// or https:// URL).
    #[arg(long, value_name = "ADDR", default_value = DEFAULT_HTTP_ADDR, env = "SANDFLOW_HTTP_ADDR")]
    pub http_addr: String,
    /// Start the flow's recording (or start it anew) instead of fetching it.
    #[arg(long, conflicts_with = "stop")]
    pub start: bool,
    /// Stop the flow's recording and let its change logs be trimmed.
    #[arg(long)]
    pub stop: bool,
    /// Write the recording to FILE instead of standard output.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The user to log in as (servers with authentication on).
    #[arg(long, short = 'U', value_name = "USER", env = "SANDFLOW_USER")]
    pub user: Option<String>,
    /// For an https:// address: the PEM file of the authority that signed
    /// the server's certificate.
    #[arg(long, value_name = "FILE", env = "SANDFLOW_CACERT")]
    pub cacert: Option<PathBuf>,
    /// The user's password (better given by the environment).
    #[arg(
        long,
        value_name = "PASSWORD",
        env = "SANDFLOW_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// The flow.
    #[arg(value_name = "FLOW")]
    pub flow: String,
}

/// `sandflow replay`.
#[derive(Debug, Clone, Args)]
pub struct ReplayArgs {
    /// The engine to replay in: `wasm` (the sandbox, as in production) or
    /// `native`.
    #[arg(long, value_name = "wasm|native", default_value = "wasm")]
    pub engine: String,
    /// Also compare the sink with this CSV file (as `sandflow replay`
    /// prints it: a header, then rows in any order); on a difference, print
    /// it and exit 1.
    #[arg(long, value_name = "FILE")]
    pub expect_sink: Option<PathBuf>,
    /// The recording (`sandflow record -o FILE`).
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

/// `sandflow test`.
#[derive(Debug, Clone, Args)]
pub struct TestArgs {
    /// Rewrite the expected rows of queries whose results differ, in place
    /// (every other byte of the file stays).
    #[arg(long = "override")]
    pub override_results: bool,
    /// The engine flows run in: `wasm` (the sandbox, as in production) or
    /// `native`.
    #[arg(long, value_name = "wasm|native", default_value = "wasm")]
    pub engine: String,
    /// Also write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    pub junit: Option<PathBuf>,
    /// Where the compiled engine is kept between runs, so that only the
    /// first run compiles it (about a second; a cached form is used only
    /// if its checksum is the one written when it was compiled).
    /// [default: $XDG_CACHE_HOME/sandflow, else $HOME/.cache/sandflow]
    #[arg(long, value_name = "DIR", env = "SANDFLOW_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Compile the engine in memory and keep nothing on disk.
    #[arg(long)]
    pub no_cache: bool,
    /// Files, or directories searched for `*.slt`.
    #[arg(required = true, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
}

#[derive(Debug, Clone, Default, Args)]
pub struct StartArgs {
    /// TOML file with the settings below (keys data_dir, postgres_addr,
    /// http_addr, mysql_addr, max_connections, startup_timeout, statement_timeout, an
    /// [http] section with allowed_hosts,
    /// header_read_timeout and timeout, and a [flow] section with
    /// tick_interval = "1s").
    #[arg(
        short = 'c',
        long = "config",
        value_name = "FILE",
        env = "SANDFLOW_CONFIG"
    )]
    pub config: Option<PathBuf>,

    /// Directory that holds the database files (created if missing).
    /// [default: ./sandflow-data]
    #[arg(long, value_name = "DIR", env = "SANDFLOW_DATA_DIR")]
    pub data_dir: Option<PathBuf>,

    /// Address of the PostgreSQL wire-protocol front door (port 0 picks a
    /// free port; the log says which). [default: 127.0.0.1:4003]
    #[arg(long, value_name = "HOST:PORT", env = "SANDFLOW_POSTGRES_ADDR")]
    pub postgres_addr: Option<String>,

    /// Address of the HTTP front door (/v1/sql, /v1/influxdb/write, /health,
    /// /metrics). [default: 127.0.0.1:4000]
    #[arg(long, value_name = "HOST:PORT", env = "SANDFLOW_HTTP_ADDR")]
    pub http_addr: Option<String>,

    /// Address of the MySQL wire-protocol front door (the `mysql` client,
    /// MySQL drivers). [default: 127.0.0.1:4002]
    #[arg(long, value_name = "HOST:PORT", env = "SANDFLOW_MYSQL_ADDR")]
    pub mysql_addr: Option<String>,

    /// Most connections each front door keeps open at once; past it the HTTP
    /// front door answers 503 and the PostgreSQL one FATAL 53300 ("too many
    /// clients"), and closes the connection. [default: 1024]
    #[arg(long, value_name = "N", env = "SANDFLOW_MAX_CONNECTIONS")]
    pub max_connections: Option<String>,

    /// How long a PostgreSQL or MySQL client may take to complete its startup
    /// (TLS, authentication) before its connection is closed. [default: 60s]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_STARTUP_TIMEOUT")]
    pub startup_timeout: Option<String>,

    /// The statement_timeout new sessions start with (PostgreSQL
    /// connections; each may SET its own), e.g. "30s"; "0" for none. A
    /// statement running longer is stopped with SQLSTATE 57014 and writes
    /// nothing. [default: 0]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_STATEMENT_TIMEOUT")]
    pub statement_timeout: Option<String>,

    /// Host names, comma-separated, by which web browsers may reach the HTTP
    /// front door (e.g. "db.example.com"). A request that carries an Origin or
    /// Sec-Fetch-Site header (browsers send them) is refused unless its Host
    /// is one of these, an IP address or localhost, and it comes from the
    /// server's own origin; clients such as curl send neither and are not
    /// checked. [default: none]
    #[arg(long, value_name = "HOSTS", env = "SANDFLOW_HTTP_ALLOWED_HOSTS")]
    pub http_allowed_hosts: Option<String>,

    /// How long an HTTP client may take to send a complete request head
    /// before its connection is closed, e.g. "10s". [default: 30s]
    #[arg(
        long,
        value_name = "DURATION",
        env = "SANDFLOW_HTTP_HEADER_READ_TIMEOUT"
    )]
    pub http_header_read_timeout: Option<String>,

    /// Longest a /v1/sql request may run before its statement is stopped
    /// (answer 504), e.g. "30s"; "0" for no limit. A request may ask for less
    /// with its `timeout` parameter. [default: 300s]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_HTTP_TIMEOUT")]
    pub http_timeout: Option<String>,

    /// The longest a flow with new input waits to tick under load, e.g. "100ms", "1s"; an idle flow ticks at once, a busy one after 4x its ticks' cost, at least a twentieth of this. [default: 200ms]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_FLOW_TICK_INTERVAL")]
    pub flow_tick_interval: Option<String>,

    /// Memory cap of a flow that sets none, e.g. "64MiB". [default: 256MiB]
    #[arg(long, value_name = "SIZE", env = "SANDFLOW_FLOW_MEMORY_LIMIT")]
    pub flow_memory_limit: Option<String>,

    /// CPU budget of one tick of a flow that sets none, e.g. "2s". [default: 10s]
    #[arg(
        long,
        value_name = "DURATION",
        env = "SANDFLOW_FLOW_CPU_LIMIT_PER_TICK"
    )]
    pub flow_cpu_limit_per_tick: Option<String>,

    /// Most sink rows one tick of a flow that sets none may produce.
    /// [default: 10000000]
    #[arg(
        long,
        value_name = "ROWS",
        env = "SANDFLOW_FLOW_OUTPUT_ROWS_LIMIT_PER_TICK"
    )]
    pub flow_output_rows_limit_per_tick: Option<String>,

    /// Most operator state of a flow that sets none, e.g. "1GiB".
    /// [default: none, only the memory limit bounds it]
    #[arg(long, value_name = "SIZE", env = "SANDFLOW_FLOW_STATE_SIZE_LIMIT")]
    pub flow_state_size_limit: Option<String>,

    /// How many times in a row a flow that failed for a transient reason
    /// (CPU budget, storage error) restarts by itself; 0 turns automatic
    /// restarts off. [default: 10]
    #[arg(long, value_name = "N", env = "SANDFLOW_FLOW_MAX_RESTARTS")]
    pub flow_max_restarts: Option<String>,

    /// Wait before the first automatic restart; it doubles with each attempt,
    /// up to 60s. [default: 1s]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_FLOW_RESTART_BACKOFF")]
    pub flow_restart_backoff: Option<String>,

    /// Most flows the server runs; CREATE FLOW past it is refused naming this
    /// setting. [default: 10000]
    #[arg(long, value_name = "N", env = "SANDFLOW_MAX_FLOWS")]
    pub max_flows: Option<String>,

    /// Largest user component (CREATE COMPONENT, PUT /v1/components/{name}),
    /// e.g. "16MiB"; a larger upload is refused (HTTP 413, SQLSTATE 54000).
    /// [default: 64MiB]
    #[arg(long, value_name = "SIZE", env = "SANDFLOW_MAX_COMPONENT_SIZE")]
    pub max_component_size: Option<String>,

    /// Bound on the memory (address space) of the process that compiles an
    /// uploaded component, e.g. "2GiB": a component whose compilation needs
    /// more is refused; the server is not touched. [default: 4GiB]
    #[arg(long, value_name = "SIZE", env = "SANDFLOW_COMPONENT_COMPILE_MEMORY")]
    pub component_compile_memory: Option<String>,

    /// How long a flow with nothing to do keeps its sandbox; then it sleeps
    /// (state kept as a snapshot, memory released) until input arrives; "0"
    /// never sleeps. [default: 60s]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_FLOW_SLEEP_AFTER")]
    pub flow_sleep_after: Option<String>,

    /// "password": every client logs in (PostgreSQL SCRAM-SHA-256, HTTP
    /// Basic, MySQL native password); on first start the superuser
    /// `sandflow` gets the password in SANDFLOW_ADMIN_PASSWORD, or a
    /// generated one written to <data-dir>/admin-password. "none": no
    /// authentication, everyone is the superuser; refused unless every listen
    /// address is a loopback address. [default: password]
    #[arg(long, value_name = "MODE", env = "SANDFLOW_AUTH")]
    pub auth: Option<String>,

    /// Most connections one user may hold open at once on each front door;
    /// past it the login is refused with 53300. 0: only --max-connections
    /// limits them. [default: 0]
    #[arg(long, value_name = "N", env = "SANDFLOW_MAX_CONNECTIONS_PER_USER")]
    pub max_connections_per_user: Option<String>,

    /// PEM file with the server's certificate chain: PostgreSQL clients may
    /// then ask for TLS (sslmode=require/verify-full) and HTTP is served as
    /// HTTPS. Needs --tls-key.
    #[arg(long, value_name = "FILE", env = "SANDFLOW_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM file with the private key of --tls-cert.
    #[arg(long, value_name = "FILE", env = "SANDFLOW_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// etcd's client URLs, comma-separated (e.g. "http://127.0.0.1:2379"):
    /// this node joins the cluster they keep. Without it sandflow runs
    /// alone. Needs --node-id.
    #[arg(long, value_name = "URL[,URL]", env = "SANDFLOW_ETCD")]
    pub etcd: Option<String>,

    /// NATS server URL for the change streams between nodes (e.g.
    /// "nats://127.0.0.1:4222"). Needs --etcd.
    #[arg(long, value_name = "URL", env = "SANDFLOW_NATS")]
    pub nats: Option<String>,

    /// This node's id in the cluster: 1 to 64 letters, digits, '-', '_' or
    /// '.'. Needs --etcd.
    #[arg(long, value_name = "ID", env = "SANDFLOW_NODE_ID")]
    pub node_id: Option<String>,

    /// What this node does in the cluster: storage (databases), flow (flows
    /// only) or all. Needs --etcd. [default: all]
    #[arg(long, value_name = "ROLE", env = "SANDFLOW_ROLE")]
    pub role: Option<String>,

    /// How long this node's etcd lease outlives its last renewal: a node
    /// that stops renewing (crash, pause, cut off) leaves the cluster after
    /// it. Whole seconds, at least 2s. Needs --etcd. [default: 10s]
    #[arg(long, value_name = "DURATION", env = "SANDFLOW_LEASE_TTL")]
    pub lease_ttl: Option<String>,

    /// The HTTP address other nodes and operators reach this node at, as
    /// SHOW NODES shows it. Needs --etcd. [default: the HTTP address it
    /// listens on]
    #[arg(long, value_name = "HOST:PORT", env = "SANDFLOW_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,

    /// Refuse connections that do not use TLS (PostgreSQL without SSLRequest,
    /// MySQL, plain HTTP). Needs --tls-cert and --tls-key.
    #[arg(long, env = "SANDFLOW_REQUIRE_TLS")]
    pub require_tls: bool,
}

/// How clients prove who they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthMode {
    /// Every client logs in with a user name and password.
    #[default]
    Password,
    /// Nobody logs in; every client is the superuser (loopback only).
    None,
}

/// The `[auth]` section.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// Connections one user may hold per front door (`None`: no own limit).
    pub max_connections_per_user: Option<usize>,
}

/// The `[tls]` section: certificate and key files, and whether plaintext is
/// refused.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TlsConfig {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub require: bool,
}

impl TlsConfig {
    /// Whether TLS is served (a certificate and key are set).
    pub fn enabled(&self) -> bool {
        self.cert.is_some() && self.key.is_some()
    }
}

/// The `[flow]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowConfig {
    /// How often the runtime ticks every flow.
    pub tick_interval: Duration,
    /// Memory cap of a flow without `WITH (memory_limit = ...)`.
    pub memory_limit: usize,
    /// CPU budget per tick of a flow without `WITH (cpu_limit_per_tick = ...)`.
    pub cpu_limit_per_tick: Duration,
    /// Sink rows per tick of a flow without `WITH (output_rows_limit_per_tick = ...)`.
    pub output_rows_limit_per_tick: u64,
    /// State bound of a flow without `WITH (state_size_limit = ...)`.
    pub state_size_limit: Option<u64>,
    /// Automatic restarts in a row after transient failures.
    pub max_restarts: u32,
    /// First wait before an automatic restart.
    pub restart_backoff: Duration,
    /// Most flows the server runs.
    pub max_flows: usize,
    /// Idle time after which a flow sleeps (`None`: never).
    pub sleep_after: Option<Duration>,
    /// Threads that run flows.
    pub threads: usize,
    /// Largest user component in bytes.
    pub max_component_size: usize,
    /// Address-space bound of the process that compiles an upload.
    pub component_compile_memory: usize,
}

/// Default of `component_compile_memory`: 4 GiB.
pub const DEFAULT_COMPONENT_COMPILE_MEMORY: usize = 4 << 30;

impl Default for FlowConfig {
    fn default() -> Self {
        let limits = sandflow::runtime::FlowLimits::default();
        FlowConfig {
            tick_interval: DEFAULT_TICK_INTERVAL,
            memory_limit: limits.memory,
            cpu_limit_per_tick: limits.cpu_per_call,
            output_rows_limit_per_tick: limits.output_rows_per_tick,
            state_size_limit: limits.state_size,
            max_restarts: sandflow::flow::DEFAULT_MAX_RESTARTS,
            restart_backoff: sandflow::flow::DEFAULT_RESTART_BACKOFF,
            max_flows: sandflow::flow::DEFAULT_MAX_FLOWS,
            sleep_after: Some(sandflow::flow::DEFAULT_SLEEP_AFTER),
            threads: sandflow::flow::default_threads(),
            max_component_size: sandflow::flow::DEFAULT_MAX_COMPONENT_SIZE,
            component_compile_memory: DEFAULT_COMPONENT_COMPILE_MEMORY,
        }
    }
}

/// The `[http]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    /// Host names (lower-case) browsers may use besides IP addresses and
    /// `localhost`.
    pub allowed_hosts: Vec<String>,
    /// How long a client may take to send a complete request head.
    pub header_read_timeout: Duration,
    /// Longest a `/v1/sql` request may run; `None`: no limit.
    pub timeout: Option<Duration>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            allowed_hosts: Vec::new(),
            header_read_timeout: DEFAULT_HTTP_HEADER_READ_TIMEOUT,
            timeout: Some(DEFAULT_HTTP_TIMEOUT),
        }
    }
}

/// The `[cluster]` section: how this node joins a cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// etcd's client URLs.
    pub etcd: Vec<String>,
    pub nats: Option<String>,
    pub node_id: String,
    pub role: sandflow_cluster::Role,
    pub lease_ttl: Duration,
    /// What SHOW NODES shows as this node's address (`None`: the HTTP
    /// address it listens on).
    pub advertise_addr: Option<String>,
}

/// The resolved settings of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub data_dir: PathBuf,
    pub postgres_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub mysql_addr: SocketAddr,
    /// Whether `mysql_addr` was set (flag, environment or file). The default
    /// port being taken only turns the MySQL door off, with a warning; a
    /// port that was asked for must be had.
    pub mysql_addr_given: bool,
    /// Open connections each front door accepts at once (at least 1).
    pub max_connections: usize,
    /// A PostgreSQL or MySQL client must complete its startup within this.
    pub startup_timeout: Duration,
    /// The statement_timeout sessions start with (`None`: none).
    pub statement_timeout: Option<Duration>,
    pub http: HttpConfig,
    pub flow: FlowConfig,
    pub auth: AuthConfig,
    pub tls: TlsConfig,
    /// `None`: the server runs alone.
    pub cluster: Option<ClusterConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            postgres_addr: DEFAULT_POSTGRES_ADDR.parse().expect("valid default"),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("valid default"),
            mysql_addr: DEFAULT_MYSQL_ADDR.parse().expect("valid default"),
            mysql_addr_given: false,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            statement_timeout: None,
            http: HttpConfig::default(),
            flow: FlowConfig::default(),
            auth: AuthConfig::default(),
            tls: TlsConfig::default(),
            cluster: None,
        }
    }
}

/// The TOML file, every key optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub data_dir: Option<PathBuf>,
    pub postgres_addr: Option<String>,
    pub http_addr: Option<String>,
    pub mysql_addr: Option<String>,
    pub max_connections: Option<toml::Value>,
    pub startup_timeout: Option<String>,
    pub statement_timeout: Option<String>,
    #[serde(default)]
    pub http: FileHttpConfig,
    #[serde(default)]
    pub flow: FileFlowConfig,
    #[serde(default)]
    pub auth: FileAuthConfig,
    #[serde(default)]
    pub tls: FileTlsConfig,
    #[serde(default)]
    pub cluster: FileClusterConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileClusterConfig {
    /// A list of URLs, or one comma-separated string.
    pub etcd: Option<toml::Value>,
    pub nats: Option<String>,
    pub node_id: Option<String>,
    pub role: Option<String>,
    pub lease_ttl: Option<String>,
    pub advertise_addr: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAuthConfig {
    pub mode: Option<String>,
    pub max_connections_per_user: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTlsConfig {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub require: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileHttpConfig {
    /// A list of names, or one comma-separated string.
    pub allowed_hosts: Option<toml::Value>,
    pub header_read_timeout: Option<String>,
    pub timeout: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFlowConfig {
    pub tick_interval: Option<String>,
    pub memory_limit: Option<String>,
    pub cpu_limit_per_tick: Option<String>,
    pub output_rows_limit_per_tick: Option<toml::Value>,
    pub state_size_limit: Option<String>,
    pub max_restarts: Option<toml::Value>,
    pub restart_backoff: Option<String>,
    pub max_flows: Option<toml::Value>,
    pub sleep_after: Option<String>,
    pub max_component_size: Option<String>,
    pub component_compile_memory: Option<String>,
}

impl FileConfig {
    pub fn from_path(path: &Path) -> Result<FileConfig, ConfigError> {
        let text = std::fs::read_to_string(path).context(ReadFileSnafu { path })?;
        toml::from_str(&text).context(ParseFileSnafu { path })
    }
}

impl Config {
    /// Resolves `args` (which clap already filled from flags or environment)
    /// over the file named by `args.config` over the defaults.
    pub fn resolve(args: &StartArgs) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => FileConfig::from_path(path)?,
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    /// Flags/environment (`args`) over `file` over defaults.
    pub fn merge(args: &StartArgs, file: FileConfig) -> Result<Config, ConfigError> {
        let data_dir = args
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_DATA_DIR));
        let postgres_addr = parse_addr(
            "postgres_addr",
            args.postgres_addr
                .as_deref()
                .or(file.postgres_addr.as_deref())
                .unwrap_or(DEFAULT_POSTGRES_ADDR),
        )?;
        let http_addr = parse_addr(
            "http_addr",
            args.http_addr
                .as_deref()
                .or(file.http_addr.as_deref())
                .unwrap_or(DEFAULT_HTTP_ADDR),
        )?;
        let mysql_addr = parse_addr(
            "mysql_addr",
            args.mysql_addr
                .as_deref()
                .or(file.mysql_addr.as_deref())
                .unwrap_or(DEFAULT_MYSQL_ADDR),
        )?;
        let tick_interval = match args
            .flow_tick_interval
            .as_deref()
            .or(file.flow.tick_interval.as_deref())
        {
            Some(s) => {
                let d = parse_duration("flow.tick_interval", s)?;
                if d < Duration::from_millis(10) {
                    return Err(ConfigError::InvalidDuration {
                        what: "flow.tick_interval".into(),
                        value: s.to_string(),
                        message: "must be at least 10ms".into(),
                    });
                }
                d
            }
            None => DEFAULT_TICK_INTERVAL,
        };
        let defaults = FlowConfig::default();
        let memory_limit = match args
            .flow_memory_limit
            .as_deref()
            .or(file.flow.memory_limit.as_deref())
        {
            Some(s) => sandflow::flow::options::parse_size(s).map_err(|message| {
                ConfigError::InvalidSize {
                    what: "flow.memory_limit".into(),
                    value: s.to_string(),
                    message,
                }
            })?,
            None => defaults.memory_limit,
        };
        let max_component_size = match args
            .max_component_size
            .as_deref()
            .or(file.flow.max_component_size.as_deref())
        {
            Some(s) => sandflow::flow::options::parse_size(s).map_err(|message| {
                ConfigError::InvalidSize {
                    what: "flow.max_component_size".into(),
                    value: s.to_string(),
                    message,
                }
            })?,
            None => defaults.max_component_size,
        };
        let component_compile_memory = match args
            .component_compile_memory
            .as_deref()
            .or(file.flow.component_compile_memory.as_deref())
        {
            Some(s) => sandflow::flow::options::parse_size(s).map_err(|message| {
                ConfigError::InvalidSize {
                    what: "flow.component_compile_memory".into(),
                    value: s.to_string(),
                    message,
                }
            })?,
            None => defaults.component_compile_memory,
        };
        let cpu_limit_per_tick = match args
            .flow_cpu_limit_per_tick
            .as_deref()
            .or(file.flow.cpu_limit_per_tick.as_deref())
        {
            Some(s) => parse_duration("flow.cpu_limit_per_tick", s)?,
            None => defaults.cpu_limit_per_tick,
        };
        let count = |what: &str, value: String| {
            sandflow::flow::options::parse_count(&value).map_err(|message| {
                ConfigError::InvalidNumber {
                    what: what.into(),
                    value,
                    message,
                }
            })
        };
        let output_rows_limit_per_tick = match args
            .flow_output_rows_limit_per_tick
            .clone()
            .or(file.flow.output_rows_limit_per_tick.map(toml_text))
        {
            Some(s) => count("flow.output_rows_limit_per_tick", s)?,
            None => defaults.output_rows_limit_per_tick,
        };
        let state_size_limit = match args
            .flow_state_size_limit
            .as_deref()
            .or(file.flow.state_size_limit.as_deref())
        {
            Some(s) => Some(sandflow::flow::options::parse_size(s).map_err(|message| {
                ConfigError::InvalidSize {
                    what: "flow.state_size_limit".into(),
                    value: s.to_string(),
                    message,
                }
            })? as u64),
            None => defaults.state_size_limit,
        };
        let max_restarts = match args
            .flow_max_restarts
            .clone()
            .or(file.flow.max_restarts.map(toml_text))
        {
            Some(s) => s
                .trim()
                .parse::<u32>()
                .map_err(|_| ConfigError::InvalidNumber {
                    what: "flow.max_restarts".into(),
                    value: s.clone(),
                    message: "use a whole number, 0 to turn automatic restarts off".into(),
                })?,
            None => defaults.max_restarts,
        };
        let restart_backoff = match args
            .flow_restart_backoff
            .as_deref()
            .or(file.flow.restart_backoff.as_deref())
        {
            Some(s) => parse_duration("flow.restart_backoff", s)?,
            None => defaults.restart_backoff,
        };
        let max_flows = match args
            .max_flows
            .clone()
            .or(file.flow.max_flows.map(toml_text))
        {
            Some(s) => match s.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(ConfigError::InvalidNumber {
                        what: "flow.max_flows".into(),
                        value: s,
                        message: "use a whole number of at least 1".into(),
                    })
                }
            },
            None => defaults.max_flows,
        };
        let sleep_after = match args
            .flow_sleep_after
            .as_deref()
            .or(file.flow.sleep_after.as_deref())
        {
            Some(s) => Some(parse_duration("flow.sleep_after", s)?).filter(|d| !d.is_zero()),
            None => defaults.sleep_after,
        };
        let max_connections = match args
            .max_connections
            .clone()
            .or(file.max_connections.map(toml_text))
        {
            Some(s) => match s.trim().parse::<usize>() {
                Ok(n) if n >= 1 => n,
                _ => {
                    return Err(ConfigError::InvalidNumber {
                        what: "max_connections".into(),
                        value: s,
                        message: "use a whole number of at least 1".into(),
                    })
                }
            },
            None => DEFAULT_MAX_CONNECTIONS,
        };
        let allowed_hosts = match &args.http_allowed_hosts {
            Some(s) => parse_hosts(s.split(','))?,
            None => match file.http.allowed_hosts {
                None => Vec::new(),
                Some(toml::Value::String(s)) => parse_hosts(s.split(','))?,
                Some(toml::Value::Array(items)) => {
                    let names = items
                        .into_iter()
                        .map(|v| match v {
                            toml::Value::String(s) => Ok(s),
                            other => Err(ConfigError::InvalidHostList {
                                message: format!("{other} is not a string; write allowed_hosts = [\"db.example.com\"]"),
                            }),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    parse_hosts(names.iter().map(String::as_str))?
                }
                Some(other) => {
                    return Err(ConfigError::InvalidHostList {
                        message: format!(
                            "{other} is not a list of names; write allowed_hosts = [\"db.example.com\"]"
                        ),
                    })
                }
            },
        };
        let header_read_timeout = match args
            .http_header_read_timeout
            .as_deref()
            .or(file.http.header_read_timeout.as_deref())
        {
            Some(s) => {
                let d = parse_duration("http.header_read_timeout", s)?;
                if d < Duration::from_millis(1) {
                    return Err(ConfigError::InvalidDuration {
                        what: "http.header_read_timeout".into(),
                        value: s.to_string(),
                        message: "must be at least 1ms".into(),
                    });
                }
                d
            }
            None => DEFAULT_HTTP_HEADER_READ_TIMEOUT,
        };
        let timeout = match args
            .http_timeout
            .as_deref()
            .or(file.http.timeout.as_deref())
        {
            Some(s) => Some(parse_duration("http.timeout", s)?).filter(|d| !d.is_zero()),
            None => Some(DEFAULT_HTTP_TIMEOUT),
        };
        let startup_timeout = match args
            .startup_timeout
            .as_deref()
            .or(file.startup_timeout.as_deref())
        {
            Some(s) => {
                let d = parse_duration("startup_timeout", s)?;
                if d < Duration::from_millis(1) {
                    return Err(ConfigError::InvalidDuration {
                        what: "startup_timeout".into(),
                        value: s.to_string(),
                        message: "must be at least 1ms".into(),
                    });
                }
                d
            }
            None => DEFAULT_STARTUP_TIMEOUT,
        };
        let statement_timeout = match args
            .statement_timeout
            .as_deref()
            .or(file.statement_timeout.as_deref())
        {
            Some(s) => Some(parse_duration("statement_timeout", s)?).filter(|d| !d.is_zero()),
            None => None,
        };
        let mode = match args.auth.as_deref().or(file.auth.mode.as_deref()) {
            None => AuthMode::Password,
            Some(m) => match m.trim().to_ascii_lowercase().as_str() {
                "password" | "scram" | "on" => AuthMode::Password,
                "none" | "off" => AuthMode::None,
                _ => {
                    return Err(ConfigError::InvalidAuthMode {
                        value: m.to_string(),
                    })
                }
            },
        };
        let max_connections_per_user = match args
            .max_connections_per_user
            .clone()
            .or(file.auth.max_connections_per_user.map(toml_text))
        {
            Some(s) => match s.trim().parse::<usize>() {
                Ok(0) => None,
                Ok(n) => Some(n),
                Err(_) => {
                    return Err(ConfigError::InvalidNumber {
                        what: "auth.max_connections_per_user".into(),
                        value: s,
                        message: "use a whole number, 0 for no limit of its own".into(),
                    })
                }
            },
            None => None,
        };
        let tls = TlsConfig {
            cert: args.tls_cert.clone().or(file.tls.cert),
            key: args.tls_key.clone().or(file.tls.key),
            require: args.require_tls || file.tls.require.unwrap_or(false),
        };
        match (&tls.cert, &tls.key) {
            (Some(_), None) => {
                return Err(ConfigError::TlsIncomplete {
                    given: "tls cert".into(),
                    missing: "tls key".into(),
                })
            }
            (None, Some(_)) => {
                return Err(ConfigError::TlsIncomplete {
                    given: "tls key".into(),
                    missing: "tls cert".into(),
                })
            }
            _ => {}
        }
        if tls.require && !tls.enabled() {
            return Err(ConfigError::RequireTlsWithoutCert);
        }
        let mysql_addr_given = args.mysql_addr.is_some() || file.mysql_addr.is_some();
        if mode == AuthMode::None {
            for (what, addr) in [
                ("postgres_addr", postgres_addr),
                ("http_addr", http_addr),
                ("mysql_addr", mysql_addr),
            ] {
                if !addr.ip().is_loopback() {
                    return Err(ConfigError::AuthNoneNotLoopback {
                        what: what.into(),
                        addr,
                    });
                }
            }
        }
        let cluster = cluster_config(args, file.cluster)?;
        Ok(Config {
            cluster,
            auth: AuthConfig {
                mode,
                max_connections_per_user,
            },
            tls,
            data_dir,
            postgres_addr,
            http_addr,
            mysql_addr,
            mysql_addr_given,
            max_connections,
            startup_timeout,
            statement_timeout,
            http: HttpConfig {
                allowed_hosts,
                header_read_timeout,
                timeout,
            },
            flow: FlowConfig {
                tick_interval,
                memory_limit,
                cpu_limit_per_tick,
                output_rows_limit_per_tick,
                state_size_limit,
                max_restarts,
                restart_backoff,
                max_flows,
                sleep_after,
                threads: defaults.threads,
                max_component_size,
                component_compile_memory,
            },
        })
    }
}

/// The `[cluster]` settings, flags over file; `None` without etcd. The
/// other cluster settings without etcd are refused rather than ignored.
fn cluster_config(
    args: &StartArgs,
    file: FileClusterConfig,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let etcd: Vec<String> = match (&args.etcd, file.etcd) {
        (Some(s), _) => s.split(',').map(|u| u.trim().to_string()).collect(),
        (None, Some(toml::Value::String(s))) => {
            s.split(',').map(|u| u.trim().to_string()).collect()
        }
        (None, Some(toml::Value::Array(list))) => list
            .iter()
            .map(|v| match v {
                toml::Value::String(s) => Ok(s.trim().to_string()),
                other => Err(ConfigError::InvalidCluster {
                    what: "cluster.etcd".into(),
                    message: format!("expected URLs as strings, found {other}"),
                }),
            })
            .collect::<Result<_, _>>()?,
        (None, Some(other)) => {
            return Err(ConfigError::InvalidCluster {
                what: "cluster.etcd".into(),
                message: format!("expected a URL or a list of URLs, found {other}"),
            })
        }
        (None, None) => Vec::new(),
    };
    let etcd: Vec<String> = etcd.into_iter().filter(|u| !u.is_empty()).collect();
    let nats = args.nats.clone().or(file.nats);
    let node_id = args.node_id.clone().or(file.node_id);
    let role = args.role.clone().or(file.role);
    let lease_ttl = args.lease_ttl.clone().or(file.lease_ttl);
    let advertise_addr = args.advertise_addr.clone().or(file.advertise_addr);
    if etcd.is_empty() {
        for (setting, given) in [
            ("--nats", nats.is_some()),
            ("--node-id", node_id.is_some()),
            ("--role", role.is_some()),
            ("--lease-ttl", lease_ttl.is_some()),
            ("--advertise-addr", advertise_addr.is_some()),
        ] {
            if given {
                return Err(ConfigError::ClusterSettingWithoutEtcd {
                    setting: setting.into(),
                });
            }
        }
        return Ok(None);
    }
    let node_id = node_id.ok_or(ConfigError::EtcdWithoutNodeId)?;
    sandflow_cluster::check_node_id(&node_id).map_err(|e| ConfigError::InvalidCluster {
        what: "--node-id".into(),
        message: e.to_string(),
    })?;
    let role = match role {
        Some(r) => r.parse().map_err(|message| ConfigError::InvalidCluster {
            what: "--role".into(),
            message,
        })?,
        None => sandflow_cluster::Role::All,
    };
    let lease_ttl = match lease_ttl {
        Some(s) => {
            let d = parse_duration("--lease-ttl", &s)?;
            if d < Duration::from_secs(2) || d.subsec_nanos() != 0 {
                return Err(ConfigError::InvalidDuration {
                    what: "--lease-ttl".into(),
                    value: s,
                    message: "must be whole seconds, at least 2s (etcd's shortest lease)".into(),
                });
            }
            d
        }
        None => sandflow_cluster::DEFAULT_LEASE_TTL,
    };
    if let Some(nats) = &nats {
        if !(nats.starts_with("nats://") || nats.starts_with("tls://")) || nats.len() < 8 {
            return Err(ConfigError::InvalidCluster {
                what: "--nats".into(),
                message: format!("{nats:?} is not a NATS URL; use e.g. nats://127.0.0.1:4222"),
            });
        }
    }
    for url in &etcd {
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .unwrap_or(url);
        if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
            return Err(ConfigError::InvalidCluster {
                what: "--etcd".into(),
                message: format!(
                    "{url:?} is not an etcd client URL; use e.g. http://127.0.0.1:2379"
                ),
            });
        }
    }
    Ok(Some(ClusterConfig {
        etcd,
        nats,
        node_id,
        role,
        lease_ttl,
        advertise_addr,
    }))
}

/// Host names for `http.allowed_hosts`, lower-cased; empty entries are
/// skipped.
fn parse_hosts<'a>(names: impl Iterator<Item = &'a str>) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for name in names.map(str::trim).filter(|n| !n.is_empty()) {
        let valid = name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
        if !valid {
            return Err(ConfigError::InvalidHost {
                value: name.to_string(),
            });
        }
        out.push(name.to_ascii_lowercase());
    }
    Ok(out)
}

/// A TOML value as text: `10` and `"10"` both mean 10.
fn toml_text(v: toml::Value) -> String {
    match v {
        toml::Value::String(s) => s,
        other => other.to_string(),
    }
}

/// `HOST:PORT`, where HOST may be a name (resolved once, first address wins).
pub fn parse_addr(what: &str, value: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = value.parse::<SocketAddr>() {
        return Ok(a);
    }
    let err = |message: String| ConfigError::InvalidAddr {
        what: what.to_string(),
        value: value.to_string(),
        message,
    };
    if !value.contains(':') {
        return Err(err("expected HOST:PORT".into()));
    }
    let mut addrs = value
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve: {e}")))?;
    addrs
        .next()
        .ok_or_else(|| err("resolves to no address".into()))
}

/// "250ms", "1s", "1.5s", "2m", "1h", "100us", "10ns"; a bare number is seconds.
pub fn parse_duration(what: &str, value: &str) -> Result<Duration, ConfigError> {
    let err = |message: &str| ConfigError::InvalidDuration {
        what: what.to_string(),
        value: value.to_string(),
        message: message.to_string(),
    };
    let s = value.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(err("missing number"));
    }
    let n: f64 = num.parse().map_err(|_| err("not a number"))?;
    let secs_per_unit = match unit.trim() {
        "" | "s" | "sec" | "secs" => 1.0,
        "ms" => 1e-3,
        "us" | "µs" => 1e-6,
        "ns" => 1e-9,
        "m" | "min" | "mins" => 60.0,
        "h" | "hr" | "hrs" => 3600.0,
        _ => return Err(err("unknown unit")),
    };
    let secs = n * secs_per_unit;
    if !secs.is_finite() || secs > 1e9 {
        return Err(err("out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::merge(&StartArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn cluster_section_flags_over_file() {
        let file: FileConfig = toml::from_str(
            "[cluster]\netcd = [\"http://127.0.0.1:2379\", \"127.0.0.1:2380\"]\nnode_id = \"s1\"\nrole = \"storage\"\nlease_ttl = \"5s\"\n",
        )
        .unwrap();
        let args = StartArgs {
            role: Some("flow".into()),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap().cluster.unwrap();
        assert_eq!(c.etcd, ["http://127.0.0.1:2379", "127.0.0.1:2380"]);
        assert_eq!(c.node_id, "s1");
        assert_eq!(c.role, sandflow_cluster::Role::Flow);
        assert_eq!(c.lease_ttl, Duration::from_secs(5));
        let bad = |args: StartArgs| {
            Config::merge(&args, FileConfig::default())
                .unwrap_err()
                .to_string()
        };
        let etcd = || Some("http://127.0.0.1:2379".to_string());
        for (args, want) in [
            (
                StartArgs {
                    lease_ttl: Some("1500ms".into()),
                    etcd: etcd(),
                    node_id: Some("a".into()),
                    ..Default::default()
                },
                "at least 2s",
            ),
            (
                StartArgs {
                    nats: Some("127.0.0.1:4222".into()),
                    etcd: etcd(),
                    node_id: Some("a".into()),
                    ..Default::default()
                },
                "is not a NATS URL",
            ),
            (
                StartArgs {
                    etcd: Some("http://h:1/x".into()),
                    node_id: Some("a".into()),
                    ..Default::default()
                },
                "is not an etcd client URL",
            ),
            (
                StartArgs {
                    etcd: etcd(),
                    node_id: Some("a b".into()),
                    ..Default::default()
                },
                "invalid node id",
            ),
            (
                StartArgs {
                    nats: Some("nats://h:1".into()),
                    ..Default::default()
                },
                "--nats belongs to a cluster node",
            ),
        ] {
            let e = bad(args);
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn args_beat_file_beat_defaults() {
        let file: FileConfig = toml::from_str(
            "data_dir = \"/f\"\npostgres_addr = \"127.0.0.1:1\"\nhttp_addr = \"127.0.0.1:2\"\n[flow]\ntick_interval = \"250ms\"\nmemory_limit = \"64MiB\"\n",
        )
        .unwrap();
        let args = StartArgs {
            http_addr: Some("127.0.0.1:3".into()),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/f"));
        assert_eq!(c.postgres_addr.port(), 1);
        assert_eq!(c.http_addr.port(), 3);
        assert_eq!(c.flow.tick_interval, Duration::from_millis(250));
        assert_eq!(c.flow.memory_limit, 64 << 20);
        assert_eq!(c.flow.cpu_limit_per_tick, Duration::from_secs(10));
        let args = StartArgs {
            flow_memory_limit: Some("12 parsecs".into()),
            ..Default::default()
        };
        let e = Config::merge(&args, FileConfig::default()).unwrap_err();
        assert!(e.to_string().contains("flow.memory_limit"), "{e}");
    }

    #[test]
    fn flow_bounds_and_restarts() {
        let file: FileConfig = toml::from_str(
            "[flow]\noutput_rows_limit_per_tick = 5000\nstate_size_limit = \"1MiB\"\nmax_restarts = 3\nrestart_backoff = \"250ms\"\n",
        )
        .unwrap();
        let args = StartArgs {
            flow_max_restarts: Some("0".into()),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap();
        assert_eq!(c.flow.output_rows_limit_per_tick, 5000);
        assert_eq!(c.flow.state_size_limit, Some(1 << 20));
        assert_eq!(c.flow.max_restarts, 0);
        assert_eq!(c.flow.restart_backoff, Duration::from_millis(250));
        let d = Config::merge(&StartArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(d.flow.max_restarts, sandflow::flow::DEFAULT_MAX_RESTARTS);
        assert_eq!(d.flow.state_size_limit, None);
        for (args, what) in [
            (
                StartArgs {
                    flow_output_rows_limit_per_tick: Some("-1".into()),
                    ..Default::default()
                },
                "flow.output_rows_limit_per_tick",
            ),
            (
                StartArgs {
                    flow_max_restarts: Some("often".into()),
                    ..Default::default()
                },
                "flow.max_restarts",
            ),
            (
                StartArgs {
                    flow_state_size_limit: Some("huge".into()),
                    ..Default::default()
                },
                "flow.state_size_limit",
            ),
        ] {
            let e = Config::merge(&args, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
    }

    #[test]
    fn connections_and_http_settings() {
        let file: FileConfig = toml::from_str(
            "max_connections = 64\n[http]\nallowed_hosts = [\"DB.example.com\", \"grafana\"]\nheader_read_timeout = \"5s\"\ntimeout = \"0\"\n",
        )
        .unwrap();
        let c = Config::merge(&StartArgs::default(), file).unwrap();
        assert_eq!(c.max_connections, 64);
        assert_eq!(c.http.allowed_hosts, ["db.example.com", "grafana"]);
        assert_eq!(c.http.header_read_timeout, Duration::from_secs(5));
        assert_eq!(c.http.timeout, None);

        let file: FileConfig = toml::from_str(
            "max_connections = 64\n[http]\nallowed_hosts = \"a.example\"\ntimeout = \"10s\"\n",
        )
        .unwrap();
        let args = StartArgs {
            max_connections: Some("2".into()),
            http_allowed_hosts: Some("x.example, y.example,".into()),
            http_timeout: Some("250ms".into()),
            ..Default::default()
        };
        let c = Config::merge(&args, file).unwrap();
        assert_eq!(c.max_connections, 2);
        assert_eq!(c.http.allowed_hosts, ["x.example", "y.example"]);
        assert_eq!(c.http.timeout, Some(Duration::from_millis(250)));
        assert_eq!(c.http.header_read_timeout, DEFAULT_HTTP_HEADER_READ_TIMEOUT);

        let d = Config::merge(&StartArgs::default(), FileConfig::default()).unwrap();
        assert_eq!(d.max_connections, 1024);
        assert_eq!(d.http.timeout, Some(Duration::from_secs(300)));
        assert!(d.http.allowed_hosts.is_empty());

        for (args, what) in [
            (
                StartArgs {
                    max_connections: Some("0".into()),
                    ..Default::default()
                },
                "max_connections",
            ),
            (
                StartArgs {
                    http_allowed_hosts: Some("http://db.example.com:4000".into()),
                    ..Default::default()
                },
                "allowed_hosts",
            ),
            (
                StartArgs {
                    http_header_read_timeout: Some("0".into()),
                    ..Default::default()
                },
                "http.header_read_timeout",
            ),
            (
                StartArgs {
                    http_timeout: Some("soon".into()),
                    ..Default::default()
                },
                "http.timeout",
            ),
        ] {
            let e = Config::merge(&args, FileConfig::default()).unwrap_err();
            assert!(e.to_string().contains(what), "{e}");
        }
        let file: FileConfig = toml::from_str("[http]\nallowed_hosts = [1]\n").unwrap();
        let e = Config::merge(&StartArgs::default(), file).unwrap_err();
        assert!(e.to_string().contains("allowed_hosts"), "{e}");
    }

    #[test]
    fn rejects_unknown_keys_and_bad_values() {
        assert!(toml::from_str::<FileConfig>("dat_dir = \"x\"").is_err());
        assert!(parse_addr("x", "nonsense").is_err());
        assert!(parse_addr("x", "localhost:4000").is_ok());
        assert!(parse_duration("x", "1 fortnight").is_err());
        assert!(parse_duration("x", "").is_err());
        assert_eq!(parse_duration("x", "2m").unwrap(), Duration::from_secs(120));
    }
}
