//! What a `CREATE FLOW` statement may say besides its query: `EXPIRE AFTER`
//! intervals and `WITH (...)` options, parsed into values with errors that
//! say what is accepted.

use std::time::Duration;

pub use crate::schema::interval::{format_interval, parse_interval};

/// Options `WITH (...)` accepts, in the order error messages list them.
pub const KNOWN_OPTIONS: &[&str] = &[
    "backfill",
    "memory_limit",
    "cpu_limit_per_tick",
    "output_rows_limit_per_tick",
    "state_size_limit",
    "defer_on_missing_source",
    "experimental_enable_incremental_read",
];

/// Parsed `WITH (...)` options of a flow.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlowOptions {
    /// Feed the rows already in the sources at creation (default true).
    pub backfill: Option<bool>,
    /// Cap of the guest's linear memory in bytes.
    pub memory_limit: Option<usize>,
    /// CPU budget of one call into the guest.
    pub cpu_limit_per_tick: Option<Duration>,
    /// Most sink rows one tick may produce.
    pub output_rows_limit_per_tick: Option<u64>,
    /// Most bytes of operator state the flow may keep.
    pub state_size_limit: Option<u64>,
    /// GreptimeDB's `defer_on_missing_source`: create the flow even when a
    /// source table does not exist yet.
    pub defer_on_missing_source: Option<bool>,
    /// GreptimeDB's `experimental_enable_incremental_read`: accepted, and
    /// changes nothing (sandflow's flows always read incrementally).
    pub experimental_enable_incremental_read: Option<bool>,
    /// A component flow's own options (`USING COMPONENT`): every key
    /// sandflow does not know, in the order written, passed to the
    /// component's `create` as they are.
    pub component: Vec<(String, String)>,
}

impl FlowOptions {
    pub fn backfill(&self) -> bool {
        self.backfill.unwrap_or(true)
    }

    pub fn defer_on_missing_source(&self) -> bool {
        self.defer_on_missing_source.unwrap_or(false)
    }
}

/// `'true'` or `'false'`, any case, blanks around ignored.
fn parse_bool(key: &str, value: &str) -> Result<bool, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("{key} must be 'true' or 'false', not '{value}'")),
    }
}

/// Parses `WITH (k = 'v')` pairs; unknown keys are an error naming the known ones.
/// Parses a flow's `WITH (...)`. For a flow on a user component
/// (`component`), keys sandflow does not know are the component's; for
/// others they are an error.
pub fn parse_options(pairs: &[(String, String)], component: bool) -> Result<FlowOptions, String> {
    let mut out = FlowOptions::default();
    for (key, value) in pairs {
        match key.as_str() {
            "backfill" => out.backfill = Some(parse_bool(key, value)?),
            "defer_on_missing_source" => {
                out.defer_on_missing_source = Some(parse_bool(key, value)?)
            }
            "experimental_enable_incremental_read" => {
                out.experimental_enable_incremental_read = Some(parse_bool(key, value)?)
            }
            "memory_limit" => out.memory_limit = Some(parse_size(value)?),
            "cpu_limit_per_tick" => {
                let ms = parse_interval(value)
                    .map_err(|e| format!("invalid cpu_limit_per_tick '{value}': {e}"))?;
                out.cpu_limit_per_tick = Some(Duration::from_millis(ms as u64));
            }
            "output_rows_limit_per_tick" => {
                out.output_rows_limit_per_tick = Some(parse_count(value)?)
            }
            "state_size_limit" => out.state_size_limit = Some(parse_size(value)? as u64),
            _ if component => out.component.push((key.clone(), value.clone())),
            _ => {
                return Err(format!(
                    "unknown flow option '{key}'; known options: {}",
                    KNOWN_OPTIONS.join(", ")
                ))
            }
        }
    }
    Ok(out)
}

/// A positive number of rows: `100000`, `100_000` or `1,000,000`.
pub fn parse_count(text: &str) -> Result<u64, String> {
    let digits: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != ',')
        .collect();
    match digits.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "invalid row count '{text}'; use a positive whole number, e.g. '1000000'"
        )),
    }
}

/// A byte size: `1048576`, `64MiB`, `64 MB`, `1GiB`, `512KiB` (KB and KiB are
/// both 1024 bytes, as memory sizes usually mean).
pub fn parse_size(text: &str) -> Result<usize, String> {
    let s = text.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid size '{text}'; use e.g. '64MiB' or a number of bytes"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => {
            return Err(format!(
                "invalid size '{text}': unknown unit '{}'; use B, KiB, MiB or GiB",
                unit.trim()
            ))
        }
    };
    let bytes = n * mult;
    if !bytes.is_finite() || bytes < 1.0 || bytes > (1u64 << 48) as f64 {
        return Err(format!("size '{text}' is out of range"));
    }
    Ok(bytes as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("5 minutes"), Ok(300_000));
        assert_eq!(parse_interval("1 hour"), Ok(3_600_000));
        assert_eq!(
            parse_interval("2 days 1h 2 min"),
            Ok(2 * 86_400_000 + 3_600_000 + 120_000)
        );
        assert_eq!(parse_interval("300 s"), Ok(300_000));
        assert_eq!(parse_interval("300"), Ok(300_000));
        assert_eq!(parse_interval("1.5h"), Ok(5_400_000));
        assert_eq!(parse_interval("250ms"), Ok(250));
        assert_eq!(parse_interval("1 HOUR"), Ok(3_600_000));
        assert!(parse_interval("1 month").unwrap_err().contains("months"));
        assert!(parse_interval("2 years").unwrap_err().contains("months"));
        assert!(parse_interval("5 fortnights").unwrap_err().contains("unit"));
        assert!(parse_interval("").is_err());
        assert!(parse_interval("1 h 5").is_err());
        assert!(parse_interval("0 s").is_err());
        assert!(parse_interval("hour").is_err());
        assert_eq!(format_interval(3_600_000), "1 hours");
        assert_eq!(format_interval(90_000), "90 seconds");
        assert_eq!(parse_interval(&format_interval(1234)), Ok(1234));
    }

    #[test]
    fn options() {
        let o = parse_options(
            &[
                ("backfill".into(), "FALSE".into()),
                ("memory_limit".into(), "64MiB".into()),
                ("cpu_limit_per_tick".into(), "100ms".into()),
            ],
            false,
        )
        .unwrap();
        assert_eq!(o.backfill, Some(false));
        assert_eq!(o.memory_limit, Some(64 << 20));
        assert_eq!(o.cpu_limit_per_tick, Some(Duration::from_millis(100)));
        let e = parse_options(&[("nope".into(), "1".into())], false).unwrap_err();
        assert!(
            e.contains(
                "backfill, memory_limit, cpu_limit_per_tick, output_rows_limit_per_tick, \
                        state_size_limit, defer_on_missing_source, \
                        experimental_enable_incremental_read"
            ),
            "{e}"
        );
        let o = parse_options(
            &[
                ("output_rows_limit_per_tick".into(), "1_000".into()),
                ("state_size_limit".into(), "1MiB".into()),
            ],
            false,
        )
        .unwrap();
        assert_eq!(o.output_rows_limit_per_tick, Some(1000));
        assert_eq!(o.state_size_limit, Some(1 << 20));
        assert!(
            parse_options(&[("output_rows_limit_per_tick".into(), "0".into())], false).is_err()
        );
        assert!(parse_options(
            &[("output_rows_limit_per_tick".into(), "many".into())],
            false
        )
        .is_err());
        assert!(parse_options(&[("backfill".into(), "maybe".into())], false).is_err());
        let o = parse_options(
            &[
                ("defer_on_missing_source".into(), "TRUE".into()),
                (
                    "experimental_enable_incremental_read".into(),
                    " false ".into(),
                ),
            ],
            false,
        )
        .unwrap();
        assert!(o.defer_on_missing_source());
        assert_eq!(o.experimental_enable_incremental_read, Some(false));
        assert!(!FlowOptions::default().defer_on_missing_source());
        let e =
            parse_options(&[("defer_on_missing_source".into(), "1".into())], false).unwrap_err();
        assert!(
            e.contains("defer_on_missing_source must be 'true' or 'false'"),
            "{e}"
        );
        assert!(parse_size("12 parsecs").is_err());
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
    }
}
