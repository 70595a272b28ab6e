//! Server settings: flags, environment, TOML file, defaults — in that order of
//! precedence.
//!
//! ```toml
//! data_dir = "/var/lib/sandflow"
//! postgres_addr = "0.0.0.0:4003"
//! http_addr = "0.0.0.0:4000"
//!
//! [flow]
//! tick_interval = "1s"
//! memory_limit = "256MiB"       # default per flow, WITH (memory_limit = ...) overrides
//! cpu_limit_per_tick = "10s"    # default per flow, WITH (cpu_limit_per_tick = ...) overrides
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
pub const DEFAULT_TICK_INTERVAL: Duration = Duration::from_secs(1);

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
    #[snafu(display("invalid size {value:?} for {what}: {message}"))]
    InvalidSize {
        what: String,
        value: String,
        message: String,
    },
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
    Start(StartArgs),
}

#[derive(Debug, Clone, Default, Args)]
pub struct StartArgs {
    /// TOML file with the settings below (keys data_dir, postgres_addr,
    /// http_addr, and a [flow] section with tick_interval = "1s").
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

    /// How often flows are ticked, e.g. "500ms", "1s". [default: 1s]
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
}

impl Default for FlowConfig {
    fn default() -> Self {
        let limits = crate::runtime::FlowLimits::default();
        FlowConfig {
            tick_interval: DEFAULT_TICK_INTERVAL,
            memory_limit: limits.memory,
            cpu_limit_per_tick: limits.cpu_per_call,
        }
    }
}

/// The resolved settings of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub data_dir: PathBuf,
    pub postgres_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub flow: FlowConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            postgres_addr: DEFAULT_POSTGRES_ADDR.parse().expect("valid default"),
            http_addr: DEFAULT_HTTP_ADDR.parse().expect("valid default"),
            flow: FlowConfig::default(),
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
    #[serde(default)]
    pub flow: FileFlowConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileFlowConfig {
    pub tick_interval: Option<String>,
    pub memory_limit: Option<String>,
    pub cpu_limit_per_tick: Option<String>,
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
            Some(s) => {
                crate::flow::options::parse_size(s).map_err(|message| ConfigError::InvalidSize {
                    what: "flow.memory_limit".into(),
                    value: s.to_string(),
                    message,
                })?
            }
            None => defaults.memory_limit,
        };
        let cpu_limit_per_tick = match args
            .flow_cpu_limit_per_tick
            .as_deref()
            .or(file.flow.cpu_limit_per_tick.as_deref())
        {
            Some(s) => parse_duration("flow.cpu_limit_per_tick", s)?,
            None => defaults.cpu_limit_per_tick,
        };
        Ok(Config {
            data_dir,
            postgres_addr,
            http_addr,
            flow: FlowConfig {
                tick_interval,
                memory_limit,
                cpu_limit_per_tick,
            },
        })
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
    fn rejects_unknown_keys_and_bad_values() {
        assert!(toml::from_str::<FileConfig>("dat_dir = \"x\"").is_err());
        assert!(parse_addr("x", "nonsense").is_err());
        assert!(parse_addr("x", "localhost:4000").is_ok());
        assert!(parse_duration("x", "1 fortnight").is_err());
        assert!(parse_duration("x", "").is_err());
        assert_eq!(parse_duration("x", "2m").unwrap(), Duration::from_secs(120));
    }
}
