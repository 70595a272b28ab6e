//! A flow's run-time facts as `information_schema.flows` and `/metrics`
//! show them.

use std::sync::{Arc, Mutex};

/// Run-time facts about a flow, shared with `information_schema.flows`.
#[derive(Debug, Clone, Default)]
pub struct FlowStatus {
    /// Why the flow stopped, if it failed.
    pub error: Option<String>,
    /// Wall-clock ms of the last tick that ran.
    pub last_execution_ms: Option<i64>,
    /// Bytes of operator state, as the guest reports it.
    pub state_size: u64,
    /// Sink rows written (upserts + deletes) since the flow started.
    pub rows_written: u64,
    /// `rows_written` at the last flush.
    pub rows_at_flush: u64,
    /// Whether the flow is asleep: idle for a while, its state kept as a
    /// snapshot and its sandbox released until input arrives.
    pub asleep: bool,
    /// Times the flow failed since the server started.
    pub failures: u64,
    /// Times the flow was restarted (automatically or by `ADMIN
    /// RESUME_FLOW`) since the server started.
    pub restarts: u64,
    /// Automatic restarts in a row without a successful tick in between.
    pub restart_attempts: u32,
    /// When the next automatic restart is due (wall-clock ms), if one is.
    pub next_restart_ms: Option<i64>,
    /// Wall-clock ms at which the oldest source change the sink does not
    /// reflect yet arrived; `None` when the flow is caught up.
    pub pending_since_ms: Option<i64>,
    /// When the flow's current run started (the database's clock).
    pub started_ms: Option<i64>,
}

impl FlowStatus {
    /// How far the sink is behind its sources at wall-clock `now_ms`: the
    /// age of the oldest change not yet written back, 0 when caught up.
    pub fn lag_ms(&self, now_ms: i64) -> i64 {
        self.pending_since_ms
            .map(|t| now_ms.saturating_sub(t).max(0))
            .unwrap_or(0)
    }

    /// The counters a restarted flow carries over from its previous run.
    pub(crate) fn carried(&self) -> FlowStatus {
        FlowStatus {
            rows_written: self.rows_written,
            rows_at_flush: self.rows_at_flush,
            failures: self.failures,
            restarts: self.restarts,
            restart_attempts: self.restart_attempts,
            pending_since_ms: self.pending_since_ms,
            last_execution_ms: self.last_execution_ms,
            ..FlowStatus::default()
        }
    }
}

pub(crate) type SharedStatus = Arc<Mutex<FlowStatus>>;

/// What FLUSH_FLOW says about a failed flow: the reason, and how it comes back.
pub(crate) fn failure_message(name: &str, status: &FlowStatus, now_ms: i64) -> String {
    let reason = status.error.as_deref().unwrap_or("it is not running");
    match status.next_restart_ms {
        Some(at) => format!(
            "flow '{name}' has failed: {reason}; it restarts by itself in {} ms \
             (automatic restart {} after a transient failure), or run ADMIN RESUME_FLOW('{name}')",
            at.saturating_sub(now_ms).max(0),
            status.restart_attempts + 1
        ),
        // A reason that says what repairs the flow (a dropped table's: not
        // RESUME_FLOW) gets no second, contradicting hint.
        None if names_a_repair(reason) => format!("flow '{name}' has failed: {reason}"),
        None => format!(
            "flow '{name}' has failed: {reason}; fix the cause, then run ADMIN RESUME_FLOW('{name}') \
             or recreate it with CREATE OR REPLACE FLOW"
        ),
    }
}

/// Whether a failure's reason already names the statement that repairs it.
fn names_a_repair(reason: &str) -> bool {
    ["RESUME_FLOW", "CREATE OR REPLACE FLOW", "DROP FLOW"]
        .iter()
        .any(|s| reason.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_gets_one_repair_hint() {
        let failed = |error: &str| FlowStatus {
            error: Some(error.to_string()),
            ..FlowStatus::default()
        };
        let trap = failure_message("f", &failed("the guest trapped"), 0);
        assert!(
            trap.contains("fix the cause, then run ADMIN RESUME_FLOW('f')"),
            "{trap}"
        );
        let dropped = "source table 'public.t' was dropped; drop the flow with DROP FLOW f, or \
                       create the table again and run CREATE OR REPLACE FLOW";
        let message = failure_message("f", &failed(dropped), 0);
        assert_eq!(message, format!("flow 'f' has failed: {dropped}"));
        assert!(!message.contains("RESUME_FLOW"), "{message}");
    }
}
