//! The ports a [`crate::Runner`] works through.

use sandflow_contract::{Batch, TickOutput};

/// The most rows in one part of a source's change log: a commit larger than
/// this is read in several parts, so that a runner never holds more than
/// this many rows of input at once. Part boundaries depend only on this
/// constant, so positions stay valid across restarts.
pub const PART_ROWS: usize = 8192;

/// Where a reader stands in one source's change log: every change up to and
/// including part `part` of commit `seq` has been consumed. Orders by
/// `(seq, part)`; [`Position::START`] is before everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    pub seq: u64,
    pub part: u32,
}

impl Position {
    /// Before the first change.
    pub const START: Position = Position { seq: 0, part: 0 };

    /// After every part of commit `seq`.
    pub fn after_commit(seq: u64) -> Position {
        Position {
            seq,
            part: u32::MAX,
        }
    }

    /// 12 bytes: `seq` then `part`, big endian (so that bytes sort as positions).
    pub fn to_bytes(self) -> [u8; 12] {
        let mut out = [0u8; 12];
        out[..8].copy_from_slice(&self.seq.to_be_bytes());
        out[8..].copy_from_slice(&self.part.to_be_bytes());
        out
    }

    /// Reads [`Position::to_bytes`]; `None` for anything else.
    pub fn from_bytes(b: &[u8]) -> Option<Position> {
        let b: [u8; 12] = b.try_into().ok()?;
        Some(Position {
            seq: u64::from_be_bytes(b[..8].try_into().ok()?),
            part: u32::from_be_bytes(b[8..].try_into().ok()?),
        })
    }
}

/// Why a port or the guest failed, and whether trying again later may
/// succeed (a CPU budget missed on a busy machine, a storage error) or not (a
/// trap, a limit, a broken contract).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub transient: bool,
    /// The runner's fence is stale: another run of the flow owns the sink.
    /// The runner stops without writing anything more.
    pub fenced: bool,
}

impl Failure {
    pub fn permanent(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: false,
            fenced: false,
        }
    }

    pub fn transient(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: true,
            fenced: false,
        }
    }

    pub fn fenced(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            transient: false,
            fenced: true,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// The next part of a source's changes.
#[derive(Debug, Clone)]
pub struct Chunk {
    /// The rows (every column of the source) and their diffs; `times` is
    /// left empty (the runner stamps the time it pushes them at).
    pub batch: Batch,
    /// The position after this part.
    pub end: Position,
    /// Whether `end` may be committed as a position. `false` inside a
    /// back-fill read from a snapshot that does not outlive the process: the
    /// runner does not tick (so commits nothing) until it has read past it.
    pub durable: bool,
}

/// The changes of a flow's sources, by position.
pub trait ChangeLog: Send {
    /// The part of `source`'s changes right after `after` (at most
    /// [`PART_ROWS`] rows), or `None` when there is none yet.
    fn read(&mut self, source: u32, after: Position) -> Result<Option<Chunk>, Failure>;
}

/// A flow's engine, in its sandbox.
pub trait Guest: Send {
    /// Buffers diff rows of source `source`.
    fn push(&mut self, source: u32, batch: Batch) -> Result<(), Failure>;
    /// Processes everything at or before `now`; returns (part of) the
    /// consolidated change of the result, already checked against the
    /// contract.
    fn tick(&mut self, now: i64) -> Result<TickOutput, Failure>;
    /// The engine's state.
    fn snapshot(&mut self) -> Result<Vec<u8>, Failure>;
    /// Bytes of operator state, as the engine reports it.
    fn state_size(&mut self) -> Result<u64, Failure>;
}

/// Brings a sleeping flow's engine back from its snapshot.
pub trait Waker: Send + Sync {
    fn restore(&self, state: &[u8]) -> Result<Box<dyn Guest>, Failure>;
}

/// One tick's write-back.
#[derive(Debug)]
pub struct Commit<'a> {
    /// The tick's output, in the guest's output schema.
    pub output: &'a [Batch],
    /// The tick time.
    pub now: i64,
    /// Per source, everything up to this position is in `output` and earlier
    /// commits.
    pub positions: &'a [Position],
    /// The engine's state at `positions`, when a snapshot is due.
    pub snapshot: Option<&'a [u8]>,
    /// The runner's fence; the commit is refused if it is not current.
    pub fence: u64,
}

/// Writes a flow's output to its sink, atomically with its positions and
/// snapshot. Returns the sink rows written.
pub trait SinkCommitter: Send {
    fn commit(&mut self, commit: Commit<'_>) -> Result<u64, Failure>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_order_and_round_trip() {
        let a = Position { seq: 3, part: 1 };
        let b = Position::after_commit(3);
        let c = Position { seq: 4, part: 0 };
        assert!(Position::START < a && a < b && b < c);
        for p in [a, b, c, Position::START] {
            assert_eq!(Position::from_bytes(&p.to_bytes()), Some(p));
            assert!(p.to_bytes() <= c.to_bytes() || p == c);
        }
        assert_eq!(Position::from_bytes(&[1, 2, 3]), None);
    }
}
