//! Intervals as users write them (a table's `ttl`, a flow's `EXPIRE AFTER`,
//! duration settings): text ⇄ milliseconds.

/// An interval in milliseconds: `'5 minutes'`, `'1 hour'`, `'2 days 1h 2 min'`,
/// `'300 s'`, `'1.5h'`, `'250ms'`. A bare number is seconds. Months and years
/// are rejected (their length varies).
pub fn parse_interval(text: &str) -> Result<i64, String> {
    let s = text.trim().to_ascii_lowercase();
    if s.is_empty() {
        return Err("empty interval; write e.g. '5 minutes' or '1 hour'".into());
    }
    let b = s.as_bytes();
    let mut i = 0;
    let mut total_ms = 0f64;
    let mut parts = 0;
    while i < b.len() {
        while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
            i += 1;
        }
        if i >= b.len() {
            break;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        let num = &s[start..i];
        if num.is_empty() {
            return Err(format!(
                "invalid interval '{text}': expected a number at '{}'",
                &s[start..]
            ));
        }
        let n: f64 = num
            .parse()
            .map_err(|_| format!("invalid interval '{text}': '{num}' is not a number"))?;
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let ustart = i;
        while i < b.len() && (b[i].is_ascii_alphabetic() || b[i] >= 0x80) {
            i += 1;
        }
        let unit = &s[ustart..i];
        let ms_per: f64 = match unit {
            "" if parts == 0 && i >= b.len() => 1000.0,
            "ns" | "nanosecond" | "nanoseconds" => 1e-6,
            "us" | "µs" | "microsecond" | "microseconds" => 1e-3,
            "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 1.0,
            "s" | "sec" | "secs" | "second" | "seconds" => 1000.0,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000.0,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3_600_000.0,
            "d" | "day" | "days" => 86_400_000.0,
            "w" | "week" | "weeks" => 7.0 * 86_400_000.0,
            "mon" | "mons" | "month" | "months" | "y" | "yr" | "yrs" | "year" | "years" => {
                return Err(format!(
                    "invalid interval '{text}': months and years are not supported \
                     (their length varies); use days, e.g. '30 days'"
                ))
            }
            "" => {
                return Err(format!(
                    "invalid interval '{text}': '{num}' has no unit; write e.g. '{num} minutes'"
                ))
            }
            other => {
                return Err(format!(
                    "invalid interval '{text}': unknown unit '{other}'; use ms, s, min, h, d or w"
                ))
            }
        };
        total_ms += n * ms_per;
        parts += 1;
    }
    if !total_ms.is_finite() || total_ms > 1e15 {
        return Err(format!("interval '{text}' is out of range"));
    }
    if total_ms < 1.0 {
        return Err(format!("interval '{text}' must be at least 1 ms"));
    }
    Ok(total_ms.round() as i64)
}

/// An interval in the form `SHOW CREATE FLOW` prints (parses back to the same value).
pub fn format_interval(ms: i64) -> String {
    let units = [
        (86_400_000, "days"),
        (3_600_000, "hours"),
        (60_000, "minutes"),
        (1000, "seconds"),
    ];
    for (size, name) in units {
        if ms % size == 0 {
            return format!("{} {name}", ms / size);
        }
    }
    format!("{ms} ms")
}
