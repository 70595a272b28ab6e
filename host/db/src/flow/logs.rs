//! What flows' guests write to stdout and stderr: `information_schema.flow_logs`
//! (flow, time, line) and the server log at debug level.
//!
//! Bounded three times over, so that a guest that prints without end costs
//! its neighbours nothing: the sandbox keeps at most
//! [`sandflow_sandbox::LOG_LINES`] lines of [`sandflow_sandbox::LOG_LINE_BYTES`]
//! per call, here each flow may add [`LINES_PER_SECOND`] lines a second on
//! average (bursts up to [`BURST`]), and each flow keeps its last
//! [`MAX_LINES`] lines and [`MAX_BYTES`] bytes. What is not kept is counted
//! in a line that says so.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sandflow_flows::clock::Clock;
use sandflow_sandbox::GuestLog;

/// Lines a flow may log per second, on average.
pub const LINES_PER_SECOND: f64 = 100.0;
/// Lines a flow may log at once.
pub const BURST: f64 = 1000.0;
/// Lines kept per flow.
pub const MAX_LINES: usize = 1000;
/// Bytes of lines kept per flow.
pub const MAX_BYTES: usize = 256 * 1024;

/// One line of a flow's log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine {
    pub flow: String,
    /// When the host read it (the database's clock, ms).
    pub at_ms: i64,
    pub line: String,
}

#[derive(Debug)]
struct Ring {
    lines: VecDeque<(i64, String)>,
    bytes: usize,
    tokens: f64,
    refilled_ms: i64,
}

/// Every flow's recent log lines.
pub struct FlowLogs {
    clock: Arc<dyn Clock>,
    by_flow: Mutex<HashMap<String, Ring>>,
}

impl std::fmt::Debug for FlowLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowLogs").finish_non_exhaustive()
    }
}

impl FlowLogs {
    pub fn new(clock: Arc<dyn Clock>) -> FlowLogs {
        FlowLogs {
            clock,
            by_flow: Mutex::new(HashMap::new()),
        }
    }

    /// Keeps what `flow`'s guest wrote, within the bounds.
    pub fn record(&self, flow: &str, log: GuestLog) {
        if log.lines.is_empty() && log.dropped == 0 {
            return;
        }
        let now = self.clock.now_ms();
        let Ok(mut all) = self.by_flow.lock() else {
            return;
        };
        let ring = all.entry(flow.to_string()).or_insert_with(|| Ring {
            lines: VecDeque::new(),
            bytes: 0,
            tokens: BURST,
            refilled_ms: now,
        });
        let elapsed = (now - ring.refilled_ms).max(0) as f64 / 1000.0;
        ring.tokens = (ring.tokens + elapsed * LINES_PER_SECOND).min(BURST);
        ring.refilled_ms = now;
        let mut dropped = log.dropped;
        for line in log.lines {
            if ring.tokens < 1.0 {
                dropped += 1;
                continue;
            }
            ring.tokens -= 1.0;
            tracing::debug!(flow, "guest: {line}");
            push(ring, now, line);
        }
        if dropped > 0 {
            push(
                ring,
                now,
                format!(
                    "[sandflow: {dropped} more lines were not kept; a flow keeps up to \
                     {LINES_PER_SECOND} lines a second and {} lines a call]",
                    sandflow_sandbox::LOG_LINES
                ),
            );
        }
    }

    /// Every kept line, flow by flow, oldest first.
    pub fn lines(&self) -> Vec<LogLine> {
        let Ok(all) = self.by_flow.lock() else {
            return Vec::new();
        };
        let mut names: Vec<&String> = all.keys().collect();
        names.sort();
        names
            .into_iter()
            .flat_map(|name| {
                all.get(name)
                    .into_iter()
                    .flat_map(|r| r.lines.iter())
                    .map(move |(at, line)| LogLine {
                        flow: name.clone(),
                        at_ms: *at,
                        line: line.clone(),
                    })
            })
            .collect()
    }

    /// Forgets a dropped flow's lines.
    pub fn forget(&self, flow: &str) {
        if let Ok(mut all) = self.by_flow.lock() {
            all.remove(flow);
        }
    }
}

fn push(ring: &mut Ring, now: i64, line: String) {
    ring.bytes += line.len();
    ring.lines.push_back((now, line));
    while ring.lines.len() > MAX_LINES || ring.bytes > MAX_BYTES {
        match ring.lines.pop_front() {
            Some((_, old)) => ring.bytes = ring.bytes.saturating_sub(old.len()),
            None => break,
        }
    }
}
