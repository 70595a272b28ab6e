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

impl std::fmt::Display for Position {
    /// `seq` after a whole commit, `seq.part` inside one.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.part {
            u32::MAX => write!(f, "{}", self.seq),
            part => write!(f, "{}.{part}", self.seq),
        }
    }
}

impl std::str::FromStr for Position {
    type Err = String;

    /// Reads the [`Display`](std::fmt::Display) form back.
    fn from_str(s: &str) -> Result<Position, String> {
        let bad = || format!("'{s}' is not a change log position (`seq` or `seq.part`)");
        match s.split_once('.') {
            None => Ok(Position::after_commit(s.parse().map_err(|_| bad())?)),
            Some((seq, part)) => Ok(Position {
                seq: seq.parse().map_err(|_| bad())?,
                part: part.parse().map_err(|_| bad())?,
            }),
        }
    }
}

/// Writes positions as `count` (u32, big endian) then 12 bytes each
/// ([`Position::to_bytes`]): the form a [`FlowStore`] keeps them in.
pub fn encode_positions(positions: &[Position]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 12 * positions.len());
    out.extend_from_slice(&(positions.len() as u32).to_be_bytes());
    for p in positions {
        out.extend_from_slice(&p.to_bytes());
    }
    out
}

/// Reads [`encode_positions`]; returns the positions and the bytes after
/// them, or `None` for anything else.
pub fn decode_positions(bytes: &[u8]) -> Option<(Vec<Position>, &[u8])> {
    let n = u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?) as usize;
    let end = n.checked_mul(12)?.checked_add(4)?;
    let body = bytes.get(4..end)?;
    let positions = body
        .chunks_exact(12)
        .map(Position::from_bytes)
        .collect::<Option<Vec<_>>>()?;
    Some((positions, &bytes[end..]))
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
    /// Whether the guest ticked at `now` for this commit (false: a sleeping
    /// flow's state kept as a snapshot at a stop, without a tick).
    pub ticked: bool,
}

/// Writes a flow's output to its sink, atomically with its positions and
/// snapshot. Returns the sink rows written.
pub trait SinkCommitter: Send {
    fn commit(&mut self, commit: Commit<'_>) -> Result<u64, Failure>;

    /// Commits `commit`, which has no snapshot yet, with the guest's state
    /// that `snapshot` brings: the runner's guest is writing it meanwhile on
    /// another thread. The snapshot and the rest must still commit
    /// together (or not at all, when the snapshot fails: its failure is
    /// the commit's). By default, waits for the snapshot, then commits.
    fn commit_late(&mut self, commit: Commit<'_>, snapshot: LateSnapshot) -> Result<u64, Failure> {
        let state = snapshot.wait()?;
        self.commit(Commit {
            snapshot: Some(&state),
            ..commit
        })
    }

    /// Whether every tick must be committed, also one without output or
    /// snapshot (a recording keeps the time of every tick).
    fn journaling(&self) -> bool {
        false
    }

    /// Whether the next tick must carry a snapshot, even if nothing moved
    /// since the last one (a recording starts at a snapshot).
    fn wants_snapshot(&self) -> bool {
        false
    }
}

/// The guest's state, on its way from the thread writing it (see
/// [`SinkCommitter::commit_late`]).
#[derive(Debug)]
pub struct LateSnapshot(std::sync::mpsc::Receiver<Result<Vec<u8>, Failure>>);

impl LateSnapshot {
    /// A snapshot to come, and where its maker sends it.
    pub fn channel() -> (
        std::sync::mpsc::SyncSender<Result<Vec<u8>, Failure>>,
        LateSnapshot,
    ) {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        (tx, LateSnapshot(rx))
    }

    /// Waits for the state (or the failure to write it).
    pub fn wait(self) -> Result<Vec<u8>, Failure> {
        self.0.recv().unwrap_or_else(|_| {
            Err(Failure::permanent(
                "the flow's snapshot was not written; restart the flow",
            ))
        })
    }
}

/// A flow's last snapshot, and what its sink already shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The guest's state at `positions`.
    pub state: Vec<u8>,
    /// Per source, the position the state reflects.
    pub positions: Vec<Position>,
    /// Per source, the position the sink reflects (at least `positions`).
    pub written: Vec<Position>,
}

/// Where flows' definitions and snapshots are kept (what a
/// [`SinkCommitter`] commits, read back when a flow starts again).
pub trait FlowStore: Send + Sync {
    /// Every stored flow definition, by name; opaque to the runner.
    fn definitions(&self) -> Result<Vec<(String, Vec<u8>)>, Failure>;
    /// The flow's last snapshot for `sources` sources, or `None` without
    /// one (or with one of another shape: the flow is rebuilt).
    fn stored(&self, flow: &str, sources: usize) -> Result<Option<Stored>, Failure>;
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
        assert_eq!(format!("{b} {a}"), "3 3.1");
        for p in [a, b, c, Position::START] {
            assert_eq!(p.to_string().parse::<Position>(), Ok(p));
        }
        assert!("3.x".parse::<Position>().is_err());
        assert!("".parse::<Position>().is_err());
    }

    #[test]
    fn position_lists_round_trip_with_the_bytes_behind_them() {
        let ps = vec![Position::after_commit(7), Position { seq: 9, part: 2 }];
        let mut bytes = encode_positions(&ps);
        bytes.extend_from_slice(b"state");
        let (back, rest) = decode_positions(&bytes).unwrap();
        assert_eq!(back, ps);
        assert_eq!(rest, b"state");
        assert!(decode_positions(&[0, 0, 0, 9, 1]).is_none());
        assert!(decode_positions(&[0, 0]).is_none());
    }
}
