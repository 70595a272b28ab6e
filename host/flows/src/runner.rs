//! One flow at run time, as a state machine: [`Runner::step`] takes an
//! [`Event`] and returns an [`Outcome`]; everything it needs comes through its
//! ports.
//!
//! What a step does:
//!
//! 1. Pulls input: reads each source's change log part by part after its
//!    position and pushes the parts into the guest, stamped with the time
//!    (a back-fill's parts before its last with [`BACKFILL_TIME`], due at
//!    any tick: the engine may fold them in as they come, while the next
//!    part is read).
//!    After a crash the first reads replay, silently, what the sink already
//!    shows (from the snapshot's positions up to the written ones): the guest
//!    catches up and its output is dropped. At most `parts_per_step` parts are
//!    read per step unless the step is a flush or a stop; with more left, the
//!    outcome says to run again at once.
//! 2. Ticks when input is pending and the flow's gap has passed since its
//!    last tick, when the guest asked for a wake-up, and always for a flush
//!    or a stop. The gap adapts to load: [`TICK_COST_FACTOR`] times what the
//!    recent ticks cost in the clock's time (reading, ticking, committing;
//!    ticks that also snapshot or measure the state are left out),
//!    at least a twentieth of the tick interval ([`TICKS_PER_INTERVAL`]), at
//!    most the interval. A flow that has been idle ticks at once; one with
//!    cheap ticks ticks again after the twentieth; a busy one batches its
//!    input, spending at most about a quarter of its time ticking, and its
//!    sink lags by at most the interval. Under a virtual clock ticks cost no
//!    time, so the gap is the twentieth. The tick drains the guest's output at
//!    the tick time (at most `output_rows_per_tick` rows), checks its state
//!    size (at flushes, stops and snapshots, else at most every
//!    [`STATE_SIZE_EVERY_MS`] and after the commit: the engine walks its
//!    state to answer), and commits the output with the positions (and the
//!    state: when forced, or periodically, every `snapshot_interval` or
//!    [`SNAPSHOT_COST_FACTOR`] times what the last snapshot took, whichever
//!    is longer) through the sink port.
//! 3. Says when to wake it next: the next tick, the guest's wake-up, or the
//!    moment it may fall asleep (`sleep_after` without anything to do: the
//!    state is kept as a snapshot and the guest released until input comes).
//!
//! A failure (a trap, a limit, a storage error, a stale fence) stops the
//! runner for good; the driver decides about restarting it.

use std::sync::Arc;

use sandflow_contract::Batch;

use crate::clock::Clock;
use crate::ports::{
    ChangeLog, Commit, Failure, Guest, LateSnapshot, Position, SinkCommitter, Waker,
};

/// A flow with new input ticks again this many times what its recent ticks
/// cost (in the clock's time) after its last tick started, at most a tick
/// interval after: ticking takes at most about 1 / factor of a flow's time,
/// and the wait grows with the load.
pub const TICK_COST_FACTOR: f64 = 4.0;

/// The shortest gap between two ticks is the tick interval divided by this
/// (10 ms at the default 200 ms): every tick with output is a durable
/// commit, so a flow adds at most this many commits per interval however
/// cheap its ticks are.
pub const TICKS_PER_INTERVAL: i64 = 20;

/// A periodic snapshot comes at most once per this many times what the
/// last one took to serialise and commit (in the clock's time), even when
/// `snapshot_interval` is shorter: snapshots take at most about 1 / factor
/// of a flow's time, and a large state's snapshot does not stall its ticks
/// every interval. The replay after a crash grows with the spacing.
pub const SNAPSHOT_COST_FACTOR: u32 = 50;

/// How often (ms) a tick asks the guest for its state size (and checks
/// `state_size_limit`) besides flushes, stops and snapshots: the engine
/// walks its state to answer, which a tick's cost should not follow.
pub const STATE_SIZE_EVERY_MS: i64 = 1_000;

/// The time a back-fill's parts (all but the last) are stamped with: due at
/// every tick, so that the guest may process them when they are pushed
/// rather than all at the tick that ends the back-fill. Rows are processed
/// at a tick whatever their time was, as long as it is not after the tick's.
pub const BACKFILL_TIME: i64 = i64::MIN;

/// What drives a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A source has new changes (or the runner just started).
    Input,
    /// A time the runner asked for has come.
    Timer,
    /// Process everything committed to the sources so far and write it back.
    Flush,
    /// Write back what is pending, snapshot, and stop (a clean shutdown).
    Stop,
}

/// What the driver should do after a step.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Outcome {
    /// Step again with [`Event::Timer`] at this time (ms).
    pub wake_at: Option<i64>,
    /// Step again at once: input is left that the step's budget did not cover.
    pub again: bool,
    /// The answer to a [`Event::Flush`]: sink rows written since the previous
    /// flush, or why the flow cannot flush.
    pub flushed: Option<Result<u64, Failure>>,
    /// The runner failed in this step.
    pub failed: Option<Failure>,
}

/// Settings of a runner.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// The flow's name (for messages).
    pub name: String,
    /// The longest a flow with pending input waits after its last tick
    /// (ms): the bound of the adaptive gap under load.
    pub tick_interval_ms: i64,
    /// How often a tick also commits a snapshot (ms).
    pub snapshot_interval_ms: i64,
    /// Idle time after which the guest is put to sleep; `None`: never.
    pub sleep_after_ms: Option<i64>,
    /// The most sink rows one tick may produce; more fails the flow.
    pub output_rows_per_tick: u64,
    /// The largest state the guest may report; more fails the flow.
    pub state_size_limit: Option<u64>,
    /// Parts of input read per step (flushes and stops read everything).
    pub parts_per_step: usize,
    /// The fence every commit carries.
    pub fence: u64,
}

impl RunnerConfig {
    /// Defaults for a flow called `name`.
    pub fn new(name: impl Into<String>) -> RunnerConfig {
        RunnerConfig {
            name: name.into(),
            tick_interval_ms: 200,
            snapshot_interval_ms: 10_000,
            sleep_after_ms: None,
            output_rows_per_tick: 10_000_000,
            state_size_limit: None,
            parts_per_step: 64,
            fence: 0,
        }
    }
}

/// Where a runner starts: after its snapshot (`None`: from an empty state),
/// with the written positions up to which input is replayed silently.
#[derive(Debug, Clone, Default)]
pub struct Recovery {
    /// Per source, the position the guest's state reflects.
    pub positions: Vec<Position>,
    /// Per source, the position the sink reflects (at least `positions`).
    pub written: Vec<Position>,
    /// Whether the state came from a snapshot (else the guest is fresh and
    /// its first tick also snapshots).
    pub from_snapshot: bool,
}

/// A runner's facts for the world: what `information_schema.flows` shows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunStatus {
    /// Why it stopped, if it failed.
    pub failure: Option<Failure>,
    /// The time of the last tick that ran.
    pub last_execution_ms: Option<i64>,
    /// Bytes of operator state at the last tick.
    pub state_size: u64,
    /// Sink rows written by this runner.
    pub rows_written: u64,
    /// When the oldest input the sink does not show yet was noticed.
    pub pending_since_ms: Option<i64>,
    /// Whether the guest is asleep.
    pub asleep: bool,
    /// Per source, the positions of the last committed snapshot (`None`: no
    /// snapshot yet): the change log may be trimmed up to them.
    pub snapshot_positions: Option<Vec<Position>>,
}

enum Slot {
    Awake(Box<dyn Guest>),
    Asleep(Vec<u8>),
    Gone,
}

/// One flow at run time; see the module docs.
pub struct Runner {
    cfg: RunnerConfig,
    clock: Arc<dyn Clock>,
    log: Box<dyn ChangeLog>,
    sink: Box<dyn SinkCommitter>,
    waker: Arc<dyn Waker>,
    guest: Slot,
    /// Per source, the position of the input pushed into the guest.
    consumed: Vec<Position>,
    /// Per source, up to where input is replayed without writing.
    silent_until: Vec<Position>,
    /// Per source, whether its position is inside a back-fill that cannot be
    /// committed (see [`crate::Chunk::durable`]).
    unsettled: Vec<bool>,
    silent: bool,
    /// Input pushed (or noticed) that no tick has written back yet.
    pending: bool,
    /// The first tick of a runner without a snapshot snapshots.
    needs_snapshot: bool,
    last_tick: Option<i64>,
    /// What recent ticks cost in the clock's time (ms, smoothed).
    tick_cost_ms: f64,
    /// What the last snapshot took to serialise and commit (clock ms).
    snapshot_cost_ms: i64,
    last_snapshot: Option<i64>,
    /// When the state size was last asked for.
    last_measured: Option<i64>,
    last_activity: i64,
    guest_wakeup: Option<i64>,
    rows_at_flush: u64,
    /// The latest time read: time never goes backwards for a runner.
    last_now: i64,
    status: RunStatus,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("name", &self.cfg.name)
            .field("consumed", &self.consumed)
            .field("status", &self.status)
            .finish_non_exhaustive()
    }
}

/// The failure of a runner whose guest was dropped by an earlier failure.
fn guest_gone() -> Failure {
    Failure::permanent("the flow's guest is gone after a failure")
}

/// The failure of a flow whose state grew over its `state_size_limit`.
fn over_state_limit(state_size: u64, max: u64) -> Failure {
    Failure::permanent(format!(
        "flow state grew to {state_size} bytes, over its state_size_limit of {max} bytes, and \
         the flow was stopped; raise state_size_limit, add EXPIRE AFTER or reduce the number of \
         groups"
    ))
}

impl Runner {
    /// A runner for a guest at `recovery`'s positions.
    pub fn new(
        cfg: RunnerConfig,
        clock: Arc<dyn Clock>,
        log: Box<dyn ChangeLog>,
        sink: Box<dyn SinkCommitter>,
        waker: Arc<dyn Waker>,
        guest: Box<dyn Guest>,
        recovery: Recovery,
    ) -> Runner {
        let now = clock.now_ms();
        let silent = recovery
            .written
            .iter()
            .zip(&recovery.positions)
            .any(|(w, p)| w > p);
        let snapshot_positions = recovery.from_snapshot.then(|| recovery.positions.clone());
        Runner {
            cfg,
            clock,
            log,
            sink,
            waker,
            guest: Slot::Awake(guest),
            unsettled: vec![false; recovery.positions.len()],
            silent_until: recovery.written,
            consumed: recovery.positions,
            silent,
            pending: false,
            needs_snapshot: !recovery.from_snapshot,
            last_tick: None,
            tick_cost_ms: 0.0,
            snapshot_cost_ms: 0,
            last_snapshot: None,
            last_measured: None,
            last_activity: now,
            guest_wakeup: None,
            rows_at_flush: 0,
            last_now: now,
            status: RunStatus {
                snapshot_positions,
                ..RunStatus::default()
            },
        }
    }

    /// The flow's name.
    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// What the runner shows the world.
    pub fn status(&self) -> &RunStatus {
        &self.status
    }

    /// Per source, the position of the input pushed so far.
    pub fn positions(&self) -> &[Position] {
        &self.consumed
    }

    fn now(&mut self) -> i64 {
        self.last_now = self.last_now.max(self.clock.now_ms());
        self.last_now
    }

    /// Handles one event; see the module docs.
    pub fn step(&mut self, event: Event) -> Outcome {
        let mut out = Outcome::default();
        if let Some(f) = &self.status.failure {
            if event == Event::Flush {
                out.flushed = Some(Err(f.clone()));
            }
            return out;
        }
        match self.run(event, &mut out) {
            Ok(()) => {}
            Err(f) => {
                self.fail(f.clone());
                if event == Event::Flush {
                    out.flushed = Some(Err(f.clone()));
                }
                out.failed = Some(f);
                out.wake_at = None;
                out.again = false;
            }
        }
        out
    }

    fn run(&mut self, event: Event, out: &mut Outcome) -> Result<(), Failure> {
        let now = self.now();
        let everything = matches!(event, Event::Flush | Event::Stop);
        if event == Event::Input && self.status.pending_since_ms.is_none() {
            self.status.pending_since_ms = Some(now);
        }
        // An idle guest falls asleep when its time comes.
        if event == Event::Timer && self.may_sleep(now) {
            self.sleep()?;
            return Ok(());
        }
        let mut more = self.pull(now, everything)?;
        if self.silent && !more {
            // Caught up with what the sink shows: the replay's tick writes
            // nothing; then the input after it.
            self.tick(now, false, false)?;
            more = self.pull(now, everything)?;
        }
        if self.unsettled.iter().any(|u| *u) {
            // Inside a back-fill: nothing can be committed before its end.
            out.again = more;
            return Ok(());
        }
        if event == Event::Stop && !self.pending && !self.silent {
            if let Slot::Asleep(state) = &self.guest {
                // A sleeping flow's state is its snapshot: keep it without
                // waking the guest.
                if self.status.snapshot_positions.as_deref() != Some(&self.consumed[..]) {
                    let state = state.clone();
                    self.commit(now, &[], Some(&state), false)?;
                    self.status.snapshot_positions = Some(self.consumed.clone());
                }
                return Ok(());
            }
        }
        let gap = self.gap();
        let tick_due = self.pending && self.last_tick.is_none_or(|t| now >= t + gap);
        let wakeup_due = self.guest_wakeup.is_some_and(|w| now >= w);
        if everything || tick_due || wakeup_due {
            let (snapshots, measured) = (self.last_snapshot, self.last_measured);
            let written = self.tick(now, event == Event::Stop, everything)?;
            // The step's cost: reading, pushing, ticking and committing. A
            // tick that also wrote a snapshot (every snapshot_interval) or
            // measured the state (every second) says nothing about the
            // load: it is left out.
            if self.last_snapshot == snapshots && self.last_measured == measured {
                let cost = (self.clock.now_ms() - now).max(0) as f64;
                self.tick_cost_ms = (self.tick_cost_ms + cost) / 2.0;
            }
            if event == Event::Flush {
                let _ = written;
                out.flushed = Some(Ok(self.status.rows_written - self.rows_at_flush));
                self.rows_at_flush = self.status.rows_written;
            }
        }
        if event == Event::Stop {
            return Ok(());
        }
        out.again = more;
        out.wake_at = self.next_wake(now);
        Ok(())
    }

    /// Reads and pushes input; returns whether input is left (the budget ran
    /// out first).
    fn pull(&mut self, now: i64, everything: bool) -> Result<bool, Failure> {
        let sources = self.consumed.len();
        let mut parts = 0usize;
        let mut done = vec![false; sources];
        loop {
            let mut progressed = false;
            #[allow(clippy::needless_range_loop)] // `s` is also the source's number
            for s in 0..sources {
                if done[s] {
                    continue;
                }
                if !everything && parts >= self.cfg.parts_per_step {
                    return Ok(true);
                }
                let after = self.consumed[s];
                if self.silent && after >= self.silent_until[s] {
                    done[s] = true;
                    continue;
                }
                match self.log.read(s as u32, after)? {
                    None => done[s] = true,
                    Some(chunk) => {
                        if chunk.end <= after {
                            return Err(Failure::permanent(format!(
                                "the change log of source {s} did not move past {after:?}"
                            )));
                        }
                        let mut batch = chunk.batch;
                        if batch.rows > 0 {
                            batch.times = match chunk.durable {
                                true => vec![now],
                                false => vec![BACKFILL_TIME],
                            };
                            self.guest()?.push(s as u32, batch)?;
                            if !self.silent {
                                self.pending = true;
                                if self.status.pending_since_ms.is_none() {
                                    self.status.pending_since_ms = Some(now);
                                }
                            }
                        }
                        self.consumed[s] = chunk.end;
                        self.unsettled[s] = !chunk.durable;
                        self.last_activity = now;
                        parts += 1;
                        progressed = true;
                    }
                }
            }
            if done.iter().all(|d| *d) || !progressed {
                return Ok(false);
            }
        }
    }

    fn guest(&mut self) -> Result<&mut Box<dyn Guest>, Failure> {
        if let Slot::Asleep(state) = &self.guest {
            let guest = self.waker.restore(state)?;
            self.guest = Slot::Awake(guest);
            self.status.asleep = false;
        }
        match &mut self.guest {
            Slot::Awake(g) => Ok(g),
            _ => Err(guest_gone()),
        }
    }

    fn may_sleep(&self, now: i64) -> bool {
        matches!(self.guest, Slot::Awake(_))
            && !self.pending
            && !self.silent
            && self.guest_wakeup.is_none()
            && self
                .cfg
                .sleep_after_ms
                .is_some_and(|after| now >= self.last_activity + after)
    }

    /// Keeps the state as a snapshot and releases the guest.
    fn sleep(&mut self) -> Result<(), Failure> {
        let state = self.guest()?.snapshot()?;
        self.guest = Slot::Asleep(state);
        self.status.asleep = true;
        Ok(())
    }

    /// Drains the guest at `now` and writes the output back (dropped while
    /// replaying silently). Returns the sink rows written.
    fn tick(&mut self, now: i64, force_snapshot: bool, measure: bool) -> Result<u64, Failure> {
        let limit = self.cfg.output_rows_per_tick;
        let mut output: Vec<Batch> = Vec::new();
        let mut rows = 0u64;
        let wakeup = loop {
            let t = self.guest()?.tick(now)?;
            if t.output.rows > 0 {
                rows += u64::from(t.output.rows);
                if rows > limit {
                    return Err(Failure::permanent(format!(
                        "flow produced more than {limit} sink rows in one tick and was stopped; \
                         raise output_rows_limit_per_tick or make the query produce fewer rows \
                         (fewer groups, a filter, EXPIRE AFTER)"
                    )));
                }
                output.push(t.output);
            }
            if !t.more {
                break t.next_wakeup;
            }
        };
        self.last_tick = Some(now);
        self.last_activity = now;
        self.guest_wakeup = wakeup;
        if self.silent {
            // The sink already shows this: the guest has caught up.
            self.silent = self
                .consumed
                .iter()
                .zip(&self.silent_until)
                .any(|(c, w)| c < w);
            return Ok(0);
        }
        let snapshot_due = force_snapshot
            || self.needs_snapshot
            || self
                .last_snapshot
                .is_none_or(|t| now - t >= self.snapshot_spacing());
        // The state size: at flushes, stops and snapshots before the
        // commit; else at most every STATE_SIZE_EVERY_MS, after the commit,
        // so that the walk over the state does not delay what the tick shows.
        let measure = measure || snapshot_due;
        let measure_after = !measure
            && self
                .last_measured
                .is_none_or(|t| now - t >= STATE_SIZE_EVERY_MS);
        let moved = self.status.snapshot_positions.as_deref() != Some(&self.consumed[..]);
        let wanted = self.sink.wants_snapshot();
        let journaling = self.sink.journaling();
        let take_snapshot = wanted || (snapshot_due && (moved || self.needs_snapshot));
        // Serialising a large state takes long: a periodic snapshot comes
        // in a commit of its own, after the commit that makes the tick's
        // output visible. A crash between them recovers from the older
        // snapshot and replays silently up to what the sink shows. The
        // first snapshot, a recording's tick (its journal entry, its
        // start) and a stop keep both in one commit.
        let apart = take_snapshot
            && rows > 0
            && self.last_snapshot.is_some()
            && !self.needs_snapshot
            && !wanted
            && !journaling
            && !force_snapshot;
        // A snapshot committed with the output: the guest measures beside
        // the commit (see `commit_beside_snapshot`).
        let beside = take_snapshot && rows > 0 && !apart;
        if measure && !beside {
            self.measure_state(now)?;
        }
        let written = if apart {
            let written = self.commit(now, &output, None, true)?;
            let started = self.clock.now_ms();
            let state = self.guest()?.snapshot()?;
            self.commit(now, &[], Some(&state), false)?;
            self.snapshot_cost_ms = (self.clock.now_ms() - started).max(0);
            written
        } else if beside {
            let started = self.clock.now_ms();
            let (size, written) = self.commit_beside_snapshot(&output, now, measure)?;
            self.snapshot_cost_ms = (self.clock.now_ms() - started).max(0);
            if let Some(size) = size {
                self.state_measured(size, now)?;
            }
            written
        } else {
            let snapshot = match take_snapshot {
                true => {
                    let started = self.clock.now_ms();
                    let state = self.guest()?.snapshot()?;
                    self.snapshot_cost_ms = (self.clock.now_ms() - started).max(0);
                    Some(state)
                }
                false => None,
            };
            if rows > 0 || snapshot.is_some() || journaling {
                self.commit(now, &output, snapshot.as_deref(), true)?
            } else {
                0
            }
        };
        if take_snapshot {
            self.last_snapshot = Some(now);
            self.needs_snapshot = false;
            self.status.snapshot_positions = Some(self.consumed.clone());
        }
        self.pending = false;
        self.status.pending_since_ms = None;
        self.status.last_execution_ms = Some(now);
        self.status.rows_written += written;
        if measure_after {
            self.measure_state(now)?;
        }
        Ok(written)
    }

    /// Commits `output` with a snapshot. The sink writes the output on a
    /// thread of its own (`sink-commit`) while the guest measures (when
    /// `measure`) and serialises its state here; the commit then takes the
    /// state (see [`SinkCommitter::commit_late`]). A state over
    /// `state_size_limit` fails the guest's side, and so the commit.
    /// Returns the state size measured and the sink rows written.
    fn commit_beside_snapshot(
        &mut self,
        output: &[Batch],
        now: i64,
        measure: bool,
    ) -> Result<(Option<u64>, u64), Failure> {
        self.guest()?;
        let Slot::Awake(guest) = &mut self.guest else {
            return Err(guest_gone());
        };
        let limit = self.cfg.state_size_limit;
        let sink = &mut self.sink;
        let commit = Commit {
            output,
            now,
            positions: &self.consumed,
            snapshot: None,
            fence: self.cfg.fence,
            ticked: true,
        };
        let (send, late) = LateSnapshot::channel();
        std::thread::scope(|scope| {
            let committing = std::thread::Builder::new()
                .name("sink-commit".into())
                .spawn_scoped(scope, move || sink.commit_late(commit, late))
                .map_err(|e| {
                    Failure::transient(format!(
                        "cannot start a thread to write the flow's output: {e}"
                    ))
                })?;
            let made = (|| {
                let size = match measure {
                    true => Some(guest.state_size()?),
                    false => None,
                };
                if let (Some(size), Some(max)) = (size, limit) {
                    if size > max {
                        return Err(over_state_limit(size, max));
                    }
                }
                Ok((size, guest.snapshot()?))
            })();
            let size = match made {
                Ok((size, state)) => {
                    let _ = send.send(Ok(state));
                    Ok(size)
                }
                Err(f) => {
                    let _ = send.send(Err(f.clone()));
                    Err(f)
                }
            };
            let written = committing.join().unwrap_or_else(|_| {
                Err(Failure::permanent(
                    "writing the flow's output failed unexpectedly; restart the flow",
                ))
            });
            // The guest's failure first: it failed the commit.
            Ok((size?, written?))
        })
    }

    /// Asks the guest for its state size and checks `state_size_limit`.
    fn measure_state(&mut self, now: i64) -> Result<(), Failure> {
        let state_size = self.guest()?.state_size()?;
        self.state_measured(state_size, now)
    }

    /// Checks a state size the guest gave against `state_size_limit`.
    fn state_measured(&mut self, state_size: u64, now: i64) -> Result<(), Failure> {
        if let Some(max) = self.cfg.state_size_limit {
            if state_size > max {
                return Err(over_state_limit(state_size, max));
            }
        }
        self.status.state_size = state_size;
        self.last_measured = Some(now);
        Ok(())
    }

    /// Commits through the sink port at the runner's positions and fence.
    fn commit(
        &mut self,
        now: i64,
        output: &[Batch],
        snapshot: Option<&[u8]>,
        ticked: bool,
    ) -> Result<u64, Failure> {
        self.sink.commit(Commit {
            output,
            now,
            positions: &self.consumed,
            snapshot,
            fence: self.cfg.fence,
            ticked,
        })
    }

    /// How long after a periodic snapshot the next one is due (ms):
    /// `snapshot_interval`, or [`SNAPSHOT_COST_FACTOR`] times what the last
    /// one took if that is longer.
    pub fn snapshot_spacing(&self) -> i64 {
        let by_cost = (SNAPSHOT_COST_FACTOR as i64).saturating_mul(self.snapshot_cost_ms);
        self.cfg.snapshot_interval_ms.max(by_cost)
    }

    /// How long a flow with new input waits after its last tick (ms): see
    /// the module docs.
    pub fn gap(&self) -> i64 {
        let interval = self.cfg.tick_interval_ms.max(0);
        let adaptive = (TICK_COST_FACTOR * self.tick_cost_ms).ceil() as i64;
        adaptive.clamp(interval / TICKS_PER_INTERVAL, interval)
    }

    fn next_wake(&self, now: i64) -> Option<i64> {
        let gap = self.gap();
        let mut at: Option<i64> = None;
        let mut earliest = |t: i64| at = Some(at.map_or(t, |a| a.min(t)));
        if self.pending {
            earliest(self.last_tick.map_or(now, |t| t + gap).max(now));
        }
        if let Some(w) = self.guest_wakeup {
            // A wake-up never comes sooner than the gap after a tick.
            let after_tick = self.last_tick.map_or(now, |t| t + gap);
            earliest(w.max(after_tick).max(now));
        }
        if let (Some(after), Slot::Awake(_)) = (self.cfg.sleep_after_ms, &self.guest) {
            if !self.pending && self.guest_wakeup.is_none() {
                earliest((self.last_activity + after).max(now));
            }
        }
        at
    }

    fn fail(&mut self, f: Failure) {
        // A failed runner holds no guest: its memory goes back now.
        self.guest = Slot::Gone;
        self.status.asleep = false;
        self.status.failure = Some(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::VirtualClock;
    use crate::ports::Chunk;
    use sandflow_contract::{Column, TickOutput};
    use std::sync::Mutex;

    /// A log of integer rows per source: `entries[s]` = (seq, values).
    #[derive(Clone, Default)]
    struct Log(Arc<Mutex<Vec<Entries>>>);

    /// One source's commits: (seq, values).
    type Entries = Vec<(u64, Vec<i64>)>;

    impl ChangeLog for Log {
        fn read(&mut self, source: u32, after: Position) -> Result<Option<Chunk>, Failure> {
            let log = self.0.lock().unwrap();
            let next = log[source as usize]
                .iter()
                .find(|(seq, _)| Position::after_commit(*seq) > after);
            Ok(next.map(|(seq, values)| Chunk {
                batch: Batch {
                    rows: values.len() as u32,
                    columns: vec![Column {
                        ints: values.clone(),
                        floats: vec![],
                        bytes: vec![],
                        offsets: vec![],
                        nulls: vec![0; values.len()],
                    }],
                    times: vec![],
                    diffs: vec![1; values.len()],
                },
                end: Position::after_commit(*seq),
                durable: true,
            }))
        }
    }

    /// Sums what it is given; outputs the sum (as -old +new) at each tick
    /// that saw input. State: the sum and the last output.
    struct SumGuest {
        sum: i64,
        shown: Option<i64>,
        dirty: bool,
    }

    fn one(v: i64, diff: i64) -> Batch {
        Batch {
            rows: 1,
            columns: vec![Column {
                ints: vec![v],
                floats: vec![],
                bytes: vec![],
                offsets: vec![],
                nulls: vec![0],
            }],
            times: vec![0],
            diffs: vec![diff],
        }
    }

    impl Guest for SumGuest {
        fn push(&mut self, _source: u32, batch: Batch) -> Result<(), Failure> {
            self.sum += batch.columns[0].ints.iter().sum::<i64>();
            self.dirty = true;
            Ok(())
        }
        fn tick(&mut self, _now: i64) -> Result<TickOutput, Failure> {
            let mut output = Batch::default();
            if self.dirty && self.shown != Some(self.sum) {
                let mut rows = Vec::new();
                if let Some(old) = self.shown {
                    rows.push(one(old, -1));
                }
                rows.push(one(self.sum, 1));
                output = Batch {
                    rows: rows.len() as u32,
                    columns: vec![Column {
                        ints: rows.iter().map(|b| b.columns[0].ints[0]).collect(),
                        floats: vec![],
                        bytes: vec![],
                        offsets: vec![],
                        nulls: vec![0; rows.len()],
                    }],
                    times: vec![0],
                    diffs: rows.iter().map(|b| b.diffs[0]).collect(),
                };
                self.shown = Some(self.sum);
            }
            self.dirty = false;
            Ok(TickOutput {
                output,
                more: false,
                next_wakeup: None,
            })
        }
        fn snapshot(&mut self) -> Result<Vec<u8>, Failure> {
            let mut v = self.sum.to_le_bytes().to_vec();
            v.extend_from_slice(&self.shown.unwrap_or(i64::MIN).to_le_bytes());
            Ok(v)
        }
        fn state_size(&mut self) -> Result<u64, Failure> {
            STATE_SIZE_CALLS.with(|c| c.set(c.get() + 1));
            Ok(16)
        }
    }

    thread_local! {
        /// How often this test's guests were asked for their state size.
        static STATE_SIZE_CALLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    struct Wake;
    impl Waker for Wake {
        fn restore(&self, state: &[u8]) -> Result<Box<dyn Guest>, Failure> {
            let sum = i64::from_le_bytes(state[..8].try_into().unwrap());
            let shown = i64::from_le_bytes(state[8..16].try_into().unwrap());
            Ok(Box::new(SumGuest {
                sum,
                shown: (shown != i64::MIN).then_some(shown),
                dirty: false,
            }))
        }
    }

    /// The sink: the one value it shows, and every commit.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<SinkState>>);
    #[derive(Default)]
    struct SinkState {
        value: Option<i64>,
        commits: Vec<(i64, Vec<Position>, bool)>,
        snapshot: Option<(Vec<Position>, Vec<u8>)>,
        written: Vec<Position>,
        fence: u64,
        /// Commit every tick (as a recording does).
        journal: bool,
        /// Ask for a snapshot at the next tick (as a recording's start does).
        want_snapshot: bool,
        /// A commit moves this clock by this many ms (what it costs).
        clock: Option<(Arc<VirtualClock>, u64)>,
        /// Each commit's thread.
        threads: Vec<Option<String>>,
    }

    impl SinkCommitter for Sink {
        fn commit(&mut self, c: Commit<'_>) -> Result<u64, Failure> {
            let mut s = self.0.lock().unwrap();
            if c.fence != s.fence {
                return Err(Failure::fenced("stale fence"));
            }
            let mut n = 0;
            for b in c.output {
                for (i, v) in b.columns[0].ints.iter().enumerate() {
                    let d = sandflow_contract::per_row(&b.diffs, i);
                    if d > 0 {
                        s.value = Some(*v);
                    } else if s.value == Some(*v) {
                        s.value = None;
                    }
                    n += 1;
                }
            }
            s.commits
                .push((c.now, c.positions.to_vec(), c.snapshot.is_some()));
            s.threads
                .push(std::thread::current().name().map(str::to_string));
            if let Some(state) = c.snapshot {
                s.snapshot = Some((c.positions.to_vec(), state.to_vec()));
            }
            s.written = c.positions.to_vec();
            if c.snapshot.is_some() {
                s.want_snapshot = false;
            }
            if let Some((clock, cost)) = &s.clock {
                clock.advance(std::time::Duration::from_millis(*cost));
            }
            Ok(n)
        }

        fn journaling(&self) -> bool {
            self.0.lock().unwrap().journal
        }

        fn wants_snapshot(&self) -> bool {
            self.0.lock().unwrap().want_snapshot
        }
    }

    fn runner(clock: &Arc<VirtualClock>, log: &Log, sink: &Sink, recovery: Recovery) -> Runner {
        let mut cfg = RunnerConfig::new("f");
        cfg.tick_interval_ms = 100;
        cfg.snapshot_interval_ms = 1_000;
        cfg.sleep_after_ms = Some(5_000);
        let guest: Box<dyn Guest> = match recovery.from_snapshot {
            true => {
                let state = sink.0.lock().unwrap().snapshot.clone().unwrap().1;
                Wake.restore(&state).unwrap()
            }
            false => Box::new(SumGuest {
                sum: 0,
                shown: None,
                dirty: false,
            }),
        };
        Runner::new(
            cfg,
            clock.clone(),
            Box::new(log.clone()),
            Box::new(sink.clone()),
            Arc::new(Wake),
            guest,
            recovery,
        )
    }

    fn fresh(sources: usize) -> Recovery {
        Recovery {
            positions: vec![Position::START; sources],
            written: vec![Position::START; sources],
            from_snapshot: false,
        }
    }

    #[test]
    fn the_gap_between_ticks_follows_their_cost_up_to_the_interval_and_flush_sees_everything() {
        let clock = Arc::new(VirtualClock::new(1_000));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        sink.0.lock().unwrap().clock = Some((clock.clone(), 10));
        let mut r = runner(&clock, &log, &sink, fresh(1));
        let more = |seq: u64, v: i64| log.0.lock().unwrap()[0].push((seq, vec![v]));
        let value = || sink.0.lock().unwrap().value;
        let ms = std::time::Duration::from_millis;
        // The first input ticks at once (and snapshots: no snapshot yet).
        // A tick that snapshots is left out of the cost: the gap stays the
        // least, a twentieth of the interval.
        let out = r.step(Event::Input);
        assert_eq!(value(), Some(5));
        assert_eq!(
            sink.0.lock().unwrap().commits,
            vec![(1_000, vec![Position::after_commit(1)], true)]
        );
        assert_eq!(out.wake_at, Some(6_000), "asleep after sleep_after");
        assert_eq!(r.gap(), 5);
        // The next commit takes 10 ms: the smoothed cost is 5 ms, the gap
        // 20 ms.
        more(2, 2);
        clock.set(1_020).unwrap();
        r.step(Event::Input);
        assert_eq!(value(), Some(7));
        assert_eq!(r.gap(), 20);
        // More input 15 ms after that tick: it waits for the gap.
        more(3, 1);
        clock.set(1_035).unwrap();
        let out = r.step(Event::Input);
        assert_eq!(out.wake_at, Some(1_040));
        clock.set(1_040).unwrap();
        r.step(Event::Timer);
        assert_eq!(value(), Some(8));
        assert_eq!(r.gap(), 30, "cost (5 + 10) / 2, times 4");
        // Cheap ticks shrink the gap: input after it ticks at once.
        sink.0.lock().unwrap().clock = Some((clock.clone(), 0));
        more(4, 1);
        clock.set(1_100).unwrap();
        r.step(Event::Input);
        assert_eq!(value(), Some(9));
        assert_eq!(r.gap(), 15);
        for (i, seq) in [(0, 30), (1, 31)] {
            more(seq, 0);
            clock.set(1_120 + i * 20).unwrap();
            r.step(Event::Input);
        }
        assert_eq!(r.gap(), 5, "never below a twentieth of the interval");
        more(32, 0);
        clock.set(1_143).unwrap();
        assert_eq!(r.step(Event::Input).wake_at, Some(1_145));
        // Costly ticks grow it, up to the tick interval (100 ms).
        sink.0.lock().unwrap().clock = Some((clock.clone(), 60));
        more(40, 1);
        clock.set(1_200).unwrap();
        r.step(Event::Input);
        assert_eq!(value(), Some(10));
        assert_eq!(r.gap(), 100);
        more(50, 1);
        clock.advance(ms(10));
        let out = r.step(Event::Input);
        assert_eq!(out.wake_at, Some(1_300), "the interval bounds the gap");
        assert_eq!(value(), Some(10));
        // A flush processes what was committed, whatever the gap.
        let out = r.step(Event::Flush);
        assert_eq!(
            out.flushed,
            Some(Ok(11)),
            "rows since the start: +5, -5 +7, -7 +8, -8 +9, -9 +10, -10 +11"
        );
        assert_eq!(value(), Some(11));
    }

    #[test]
    fn output_with_a_snapshot_is_written_on_another_thread_while_the_guest_snapshots() {
        let clock = Arc::new(VirtualClock::new(1_000));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        // The first tick snapshots (there is no snapshot yet): its output
        // is committed by another thread, with the snapshot.
        r.step(Event::Input);
        let on = |name: &str| Some(name.to_string());
        let here = std::thread::current().name().map(str::to_string);
        {
            let s = sink.0.lock().unwrap();
            assert_eq!(s.value, Some(5));
            assert_eq!(
                s.commits,
                vec![(1_000, vec![Position::after_commit(1)], true)]
            );
            assert_eq!(s.snapshot.as_ref().map(|(_, b)| b.len()), Some(16));
            assert_eq!(s.threads, vec![on("sink-commit")]);
        }
        // A tick without a snapshot commits here.
        log.0.lock().unwrap()[0].push((2, vec![2]));
        clock.set(1_100).unwrap();
        r.step(Event::Input);
        assert_eq!(sink.0.lock().unwrap().threads[1], here);
        // A stop snapshots too. A guest whose state is over its limit fails
        // the flow, and nothing is committed.
        r.cfg.state_size_limit = Some(8);
        log.0.lock().unwrap()[0].push((3, vec![1]));
        let out = r.step(Event::Stop);
        let failed = out.failed.map(|f| f.message).unwrap_or_default();
        assert!(
            failed.contains("over its state_size_limit of 8 bytes"),
            "{failed}"
        );
        let s = sink.0.lock().unwrap();
        assert_eq!(s.value, Some(7));
        assert_eq!(s.commits.len(), 2);
    }

    #[test]
    fn a_periodic_snapshot_comes_after_the_output_in_a_commit_of_its_own() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        // The first snapshot comes with the first output.
        r.step(Event::Input);
        let p = |seq| vec![Position::after_commit(seq)];
        assert_eq!(sink.0.lock().unwrap().commits, vec![(0, p(1), true)]);
        // Before the snapshot interval (1 s): output only.
        log.0.lock().unwrap()[0].push((2, vec![2]));
        clock.set(500).unwrap();
        r.step(Event::Input);
        assert_eq!(sink.0.lock().unwrap().commits[1], (500, p(2), false));
        // At it: the output first, then the snapshot, at the same positions.
        log.0.lock().unwrap()[0].push((3, vec![1]));
        clock.set(1_000).unwrap();
        r.step(Event::Input);
        let s = sink.0.lock().unwrap();
        assert_eq!(
            s.commits[2..],
            [(1_000, p(3), false), (1_000, p(3), true)],
            "two commits"
        );
        assert_eq!(s.value, Some(8));
        assert_eq!(s.snapshot.as_ref().map(|(p, _)| p.clone()), Some(p(3)));
    }

    #[test]
    fn periodic_snapshots_are_spaced_by_what_the_last_one_cost() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        r.step(Event::Input);
        // From here each commit costs 40 ms: the periodic snapshot at 1 s
        // (its own commit) costs 40, so the next one is due 50 x 40 = 2 s
        // after it, not 1 s.
        sink.0.lock().unwrap().clock = Some((clock.clone(), 40));
        let snapshots = |s: &Sink| s.0.lock().unwrap().commits.iter().filter(|c| c.2).count();
        for (seq, at) in [(2, 1_000), (3, 2_000), (4, 2_900), (5, 3_000)] {
            log.0.lock().unwrap()[0].push((seq, vec![1]));
            clock.set(at).unwrap();
            r.step(Event::Input);
            let expected = match at {
                1_000 => 2,
                2_000 | 2_900 => 2,
                _ => 3,
            };
            assert_eq!(
                snapshots(&sink),
                expected,
                "snapshots after the tick at {at}"
            );
        }
        assert_eq!(r.snapshot_spacing(), 2_000);
        assert_eq!(sink.0.lock().unwrap().value, Some(9));
    }

    #[test]
    fn a_periodic_state_check_comes_after_the_ticks_output() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        r.step(Event::Input);
        // The guest reports 16 bytes; a limit of 8 fails the flow at the
        // next check, a second later, after that tick's output is written.
        r.cfg.state_size_limit = Some(8);
        log.0.lock().unwrap()[0].push((2, vec![2]));
        clock.set(1_500).unwrap();
        r.cfg.snapshot_interval_ms = 10_000;
        r.step(Event::Input);
        assert_eq!(
            sink.0.lock().unwrap().value,
            Some(7),
            "the output is committed"
        );
        let failure = r.status().failure.as_ref().map(|f| f.to_string());
        assert!(
            failure
                .as_deref()
                .is_some_and(|f| f.contains("state_size_limit")),
            "{failure:?}"
        );
    }

    #[test]
    fn the_state_size_is_asked_for_at_flushes_snapshots_and_once_a_second() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        let calls = || STATE_SIZE_CALLS.with(|c| c.get());
        r.step(Event::Input);
        assert_eq!((calls(), r.status().state_size), (1, 16), "the first tick");
        for (seq, at) in [(2, 300), (3, 600)] {
            log.0.lock().unwrap()[0].push((seq, vec![1]));
            clock.set(at).unwrap();
            r.step(Event::Input);
        }
        assert_eq!(sink.0.lock().unwrap().value, Some(7), "two more ticks");
        assert_eq!(calls(), 1, "not at every tick");
        r.step(Event::Flush);
        assert_eq!(calls(), 2, "at a flush");
        log.0.lock().unwrap()[0].push((4, vec![1]));
        clock.set(1_000).unwrap();
        r.step(Event::Input);
        assert_eq!(calls(), 3, "with the snapshot (every 1 s here)");
    }

    #[test]
    fn a_journaling_sink_sees_every_tick_and_gets_the_snapshot_it_asks_for() {
        let clock = Arc::new(VirtualClock::new(1_000));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![5])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        r.step(Event::Input);
        assert_eq!(sink.0.lock().unwrap().commits.len(), 1);
        // Input that leaves the output as it is (+0): without a journal, the
        // tick writes nothing.
        log.0.lock().unwrap()[0].push((2, vec![0]));
        clock.set(1_100).unwrap();
        r.step(Event::Input);
        assert_eq!(sink.0.lock().unwrap().commits.len(), 1);
        // With one, it is committed, with its time and positions.
        sink.0.lock().unwrap().journal = true;
        log.0.lock().unwrap()[0].push((3, vec![0]));
        clock.set(1_200).unwrap();
        r.step(Event::Input);
        assert_eq!(
            sink.0.lock().unwrap().commits.last(),
            Some(&(1_200, vec![Position::after_commit(3)], false))
        );
        // A wanted snapshot comes with the next tick, even with nothing new
        // since the last one.
        sink.0.lock().unwrap().want_snapshot = true;
        clock.set(1_300).unwrap();
        r.step(Event::Flush);
        let s = sink.0.lock().unwrap();
        assert_eq!(
            s.commits.last(),
            Some(&(1_300, vec![Position::after_commit(3)], true))
        );
        assert_eq!(
            s.snapshot.as_ref().map(|(p, _)| p.clone()),
            Some(vec![Position::after_commit(3)])
        );
        assert!(!s.want_snapshot);
    }

    #[test]
    fn idle_runners_sleep_and_wake_with_their_state() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![3])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        let out = r.step(Event::Input);
        clock.set(out.wake_at.unwrap()).unwrap();
        r.step(Event::Timer);
        assert!(r.status().asleep);
        log.0.lock().unwrap()[0].push((2, vec![4]));
        clock.advance(std::time::Duration::from_secs(60));
        r.step(Event::Input);
        assert!(!r.status().asleep);
        assert_eq!(sink.0.lock().unwrap().value, Some(7));
    }

    #[test]
    fn a_sleeping_runner_stops_without_waking_its_guest() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![3])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        r.step(Event::Input);
        // More input, written back 100 ms later without a snapshot (the
        // snapshot interval is 1 s).
        log.0.lock().unwrap()[0].push((2, vec![4]));
        clock.set(10).unwrap();
        r.step(Event::Input);
        clock.set(100).unwrap();
        let out = r.step(Event::Timer);
        assert_eq!(sink.0.lock().unwrap().value, Some(7));
        let snapped = sink.0.lock().unwrap().snapshot.clone().unwrap().0;
        assert_eq!(snapped, vec![Position::after_commit(1)]);
        clock.set(out.wake_at.unwrap()).unwrap();
        r.step(Event::Timer);
        assert!(r.status().asleep);
        // Stopping keeps the sleeping state as the snapshot, at its position,
        // without waking the guest.
        let out = r.step(Event::Stop);
        assert_eq!(out.failed, None);
        assert!(r.status().asleep, "still asleep");
        let s = sink.0.lock().unwrap();
        let (positions, state) = s.snapshot.clone().unwrap();
        assert_eq!(positions, vec![Position::after_commit(2)]);
        assert_eq!(&state[..8], &7i64.to_le_bytes());
        drop(s);
        // Stopping again writes nothing more.
        let commits = sink.0.lock().unwrap().commits.len();
        r.step(Event::Stop);
        assert_eq!(sink.0.lock().unwrap().commits.len(), commits);
    }

    #[test]
    fn recovery_replays_silently_what_the_sink_shows() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![1]), (2, vec![2])]])));
        let sink = Sink::default();
        let mut r = runner(&clock, &log, &sink, fresh(1));
        r.step(Event::Input);
        // Later input is written without a snapshot (interval not reached).
        log.0.lock().unwrap()[0].push((3, vec![10]));
        clock.advance(std::time::Duration::from_millis(500));
        r.step(Event::Input);
        let (snap_pos, _) = sink.0.lock().unwrap().snapshot.clone().unwrap();
        let written = sink.0.lock().unwrap().written.clone();
        assert!(snap_pos < written);
        assert_eq!(sink.0.lock().unwrap().value, Some(13));
        // Crash. The new run restores the snapshot, replays 10 silently, then
        // sees new input.
        drop(r);
        log.0.lock().unwrap()[0].push((4, vec![100]));
        let commits_before = sink.0.lock().unwrap().commits.len();
        let mut r = runner(
            &clock,
            &log,
            &sink,
            Recovery {
                positions: snap_pos,
                written,
                from_snapshot: true,
            },
        );
        r.step(Event::Flush);
        assert_eq!(sink.0.lock().unwrap().value, Some(113));
        // One commit: the new input, not the replay.
        assert_eq!(sink.0.lock().unwrap().commits.len(), commits_before + 1);
    }

    #[test]
    fn a_stale_fence_stops_the_runner_without_writing() {
        let clock = Arc::new(VirtualClock::new(0));
        let log = Log(Arc::new(Mutex::new(vec![vec![(1, vec![1])]])));
        let sink = Sink::default();
        sink.0.lock().unwrap().fence = 7;
        let mut r = runner(&clock, &log, &sink, fresh(1));
        let out = r.step(Event::Input);
        assert!(out.failed.is_some_and(|f| f.fenced));
        assert_eq!(sink.0.lock().unwrap().value, None);
        assert!(matches!(r.step(Event::Flush).flushed, Some(Err(_))));
    }

    #[test]
    fn the_same_events_at_the_same_times_give_the_same_commits() {
        let run = || {
            let clock = Arc::new(VirtualClock::new(0));
            let log = Log(Arc::new(Mutex::new(vec![vec![], vec![]])));
            let sink = Sink::default();
            let mut r = runner(&clock, &log, &sink, fresh(2));
            for i in 0..50u64 {
                log.0.lock().unwrap()[(i % 2) as usize].push((i + 1, vec![i as i64]));
                clock.advance(std::time::Duration::from_millis(37));
                let out = r.step(Event::Input);
                if let Some(at) = out.wake_at.filter(|at| *at <= clock.now_ms() + 50) {
                    clock.set(at.max(clock.now_ms())).unwrap();
                    r.step(Event::Timer);
                }
            }
            r.step(Event::Flush);
            let s = sink.0.lock().unwrap();
            (s.value, s.commits.clone())
        };
        let a = run();
        assert_eq!(a.0, Some((0..50).sum()));
        assert_eq!(a, run());
    }
}
