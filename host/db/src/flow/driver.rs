//! Drives the flows' runners: a few threads step whichever runner has
//! something to do (input, a due timer, a flush, a stop), one step at a time
//! per runner, with the database's clock.
//!
//! A commit to a source only marks its readers' runners as having input and
//! queues them (see [`Driver::wake`]): the rows stay in the change log until
//! the runner pulls them. A runner asks for its next timer in each step's
//! [`Outcome`]; the threads wait for the earliest one.
//!
//! With a virtual clock nothing runs on its own: [`Driver::run_pending`]
//! steps every queued runner in the caller's thread, and
//! [`Driver::advance_to`] moves the clock from timer to timer, stepping the
//! runners whose time has come, so the same inputs at the same virtual times
//! always give the same steps.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use sandflow_flows::{Clock, Event, Failure, Outcome, Runner, VirtualClock};
use tokio::sync::oneshot;

/// Called after every step of a runner, with the step's outcome (to publish
/// its status, handle a failure, trim logs).
pub(crate) type AfterStep = Box<dyn Fn(&Runner, &Outcome) + Send + Sync>;

/// The answer to a flush: sink rows written since the previous flush.
pub(crate) type FlushReply = oneshot::Sender<Result<u64, Failure>>;

#[derive(Default)]
struct Sched {
    queued: bool,
    running: bool,
    input: bool,
    timer_due: bool,
    again: bool,
    flushes: Vec<FlushReply>,
    stop: Option<std::sync::mpsc::Sender<()>>,
    /// The time of the runner's pending timer.
    timer_at: Option<i64>,
    removed: bool,
}

/// One runner under the driver.
pub(crate) struct Slot {
    id: u64,
    runner: Mutex<Option<Runner>>,
    sched: Mutex<Sched>,
    after_step: AfterStep,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Queue {
    ready: VecDeque<Arc<Slot>>,
    timers: BinaryHeap<Reverse<(i64, u64)>>,
    slots: HashMap<u64, Weak<Slot>>,
}

struct Inner {
    clock: Arc<dyn Clock>,
    /// Set for a virtual clock: nothing runs but what the caller drives.
    manual: Option<Arc<VirtualClock>>,
    queue: Mutex<Queue>,
    cv: Condvar,
    closed: AtomicBool,
    ids: AtomicU64,
}

/// See the module docs.
pub(crate) struct Driver {
    inner: Arc<Inner>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Driver")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Driver {
    /// A driver on the real clock with `threads` threads.
    pub(crate) fn threaded(clock: Arc<dyn Clock>, threads: usize) -> std::io::Result<Driver> {
        let inner = Inner::new(clock, None);
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let inner = inner.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("flows-{i}"))
                    .spawn(move || work(&inner))?,
            );
        }
        Ok(Driver {
            inner,
            threads: Mutex::new(handles),
        })
    }

    /// A driver on a virtual clock: runners step only in [`Driver::run_pending`]
    /// and [`Driver::advance_to`].
    pub(crate) fn manual(clock: Arc<VirtualClock>) -> Driver {
        Driver {
            inner: Inner::new(clock.clone(), Some(clock)),
            threads: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn is_manual(&self) -> bool {
        self.inner.manual.is_some()
    }

    /// Puts `runner` under the driver; it steps once `start` (or any event) wakes it.
    pub(crate) fn add(&self, runner: Runner, after_step: AfterStep) -> Arc<Slot> {
        let slot = Arc::new(Slot {
            id: self.inner.ids.fetch_add(1, Ordering::Relaxed),
            runner: Mutex::new(Some(runner)),
            sched: Mutex::new(Sched::default()),
            after_step,
        });
        lock(&self.inner.queue)
            .slots
            .insert(slot.id, Arc::downgrade(&slot));
        slot
    }

    /// The runner has new input (a commit to one of its sources, or it just started).
    pub(crate) fn wake(&self, slot: &Arc<Slot>) {
        self.inner.notify(slot, |s| s.input = true);
    }

    /// A waker for a slot that does not keep it alive.
    pub(crate) fn waker(&self, slot: &Arc<Slot>) -> impl Fn() + Send + Sync + 'static {
        let inner = Arc::downgrade(&self.inner);
        let slot = Arc::downgrade(slot);
        move || {
            if let (Some(inner), Some(slot)) = (inner.upgrade(), slot.upgrade()) {
                inner.notify(&slot, |s| s.input = true);
            }
        }
    }

    /// Asks the runner to process everything committed so far; the reply
    /// comes once it has.
    pub(crate) fn flush(&self, slot: &Arc<Slot>) -> oneshot::Receiver<Result<u64, Failure>> {
        let (tx, rx) = oneshot::channel();
        self.inner.notify(slot, |s| s.flushes.push(tx));
        self.run_pending();
        rx
    }

    /// Writes back what is pending and snapshots, then removes the runner;
    /// waits until it has (at most one step).
    pub(crate) fn stop(&self, slots: &[Arc<Slot>]) {
        let mut acks = Vec::new();
        for slot in slots {
            let (tx, rx) = std::sync::mpsc::channel();
            self.inner.notify(slot, |s| s.stop = Some(tx));
            acks.push((slot.clone(), rx));
        }
        self.run_pending();
        for (slot, rx) in acks {
            // Without threads (or once they are gone), nobody else steps it.
            if self.is_manual() || self.inner.closed.load(Ordering::SeqCst) {
                step(&self.inner, &slot);
            }
            let _ = rx.recv_timeout(Duration::from_secs(60));
            self.remove(&slot);
        }
    }

    /// Removes the runner without a last step (the flow is dropped or
    /// replaced); waits for a step under way to end. Pending flushes get an
    /// error.
    pub(crate) fn remove(&self, slot: &Arc<Slot>) {
        lock(&slot.sched).removed = true;
        let runner = lock(&slot.runner).take();
        drop(runner);
        lock(&self.inner.queue).slots.remove(&slot.id);
    }

    /// Steps every queued runner until none is queued (a virtual clock); a
    /// threaded driver's threads do this on their own.
    pub(crate) fn run_pending(&self) {
        if !self.is_manual() {
            return;
        }
        loop {
            let next = lock(&self.inner.queue).ready.pop_front();
            match next {
                Some(slot) => step(&self.inner, &slot),
                None => return,
            }
        }
    }

    /// Moves a virtual clock forward to `to_ms`, stopping at every timer on
    /// the way (in time order) to step the runners whose time has come.
    pub(crate) fn advance_to(&self, to_ms: i64) -> Result<(), String> {
        let Some(clock) = &self.inner.manual else {
            return Err("the database runs on the real clock".to_string());
        };
        if to_ms < clock.now_ms() {
            return Err(format!(
                "time cannot go backwards: it is {} ms, and {to_ms} ms is earlier",
                clock.now_ms()
            ));
        }
        self.run_pending();
        loop {
            let next = lock(&self.inner.queue)
                .timers
                .peek()
                .map(|Reverse((at, _))| *at);
            match next {
                Some(at) if at <= to_ms => {
                    clock.set(at.max(clock.now_ms()))?;
                    self.inner.fire_due(clock.now_ms());
                    self.run_pending();
                }
                _ => break,
            }
        }
        clock.set(to_ms)?;
        self.run_pending();
        Ok(())
    }

    /// Stops the threads (after [`Driver::stop`] of every runner).
    pub(crate) fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.cv.notify_all();
        let threads = std::mem::take(&mut *lock(&self.threads));
        let me = std::thread::current().id();
        for t in threads {
            // Dropped by one of its own threads: that one ends by itself.
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.close();
    }
}

impl Inner {
    fn new(clock: Arc<dyn Clock>, manual: Option<Arc<VirtualClock>>) -> Arc<Inner> {
        Arc::new(Inner {
            clock,
            manual,
            queue: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            closed: AtomicBool::new(false),
            ids: AtomicU64::new(1),
        })
    }

    /// Puts `slot` (marked queued) at the end of the ready queue.
    fn enqueue(&self, slot: &Arc<Slot>) {
        lock(&self.queue).ready.push_back(slot.clone());
        self.cv.notify_one();
    }

    /// Records an event for `slot` and queues it unless it is queued or
    /// running (a running slot is queued again when its step ends).
    fn notify(&self, slot: &Arc<Slot>, event: impl FnOnce(&mut Sched)) {
        let queue = {
            let mut s = lock(&slot.sched);
            if s.removed {
                return;
            }
            event(&mut s);
            let queue = !s.queued && !s.running;
            if queue {
                s.queued = true;
            }
            queue
        };
        if queue {
            self.enqueue(slot);
        }
    }

    /// Queues the runners whose timer is at or before `now`.
    fn fire_due(&self, now: i64) {
        let mut due = Vec::new();
        {
            let mut q = lock(&self.queue);
            while let Some(Reverse((at, id))) = q.timers.peek().copied() {
                if at > now {
                    break;
                }
                q.timers.pop();
                if let Some(slot) = q.slots.get(&id).and_then(Weak::upgrade) {
                    due.push((at, slot));
                }
            }
        }
        for (at, slot) in due {
            self.notify(&slot, |s| {
                if s.timer_at == Some(at) {
                    s.timer_at = None;
                    s.timer_due = true;
                }
            });
        }
    }
}

/// A thread of a threaded driver.
fn work(inner: &Arc<Inner>) {
    loop {
        let slot = {
            let mut q = lock(&inner.queue);
            loop {
                if inner.closed.load(Ordering::SeqCst) {
                    return;
                }
                let now = inner.clock.now_ms();
                let due = q.timers.peek().is_some_and(|Reverse((at, _))| *at <= now);
                if due {
                    drop(q);
                    inner.fire_due(now);
                    q = lock(&inner.queue);
                    continue;
                }
                if let Some(slot) = q.ready.pop_front() {
                    break slot;
                }
                let wait = q
                    .timers
                    .peek()
                    .map(
                        |Reverse((at, _))| Duration::from_millis((at - now).clamp(1, 1_000) as u64),
                    )
                    .unwrap_or(Duration::from_secs(1));
                q = inner
                    .cv
                    .wait_timeout(q, wait)
                    .map(|(q, _)| q)
                    .unwrap_or_else(|p| p.into_inner().0);
            }
        };
        step(inner, &slot);
    }
}

/// One step of `slot`'s runner with its most urgent event, then what the
/// outcome asks for.
fn step(inner: &Inner, slot: &Arc<Slot>) {
    let (event, flushes, stop) = {
        let mut s = lock(&slot.sched);
        if s.removed || s.running {
            s.queued = false;
            return;
        }
        s.queued = false;
        s.running = true;
        let stop = s.stop.take();
        let flushes = std::mem::take(&mut s.flushes);
        let input = std::mem::take(&mut s.input) | std::mem::take(&mut s.again);
        let event = if stop.is_some() {
            Event::Stop
        } else if !flushes.is_empty() {
            Event::Flush
        } else if input {
            Event::Input
        } else {
            Event::Timer
        };
        // Whatever the event, the step reads everything pending and the time.
        s.timer_due = false;
        (event, flushes, stop)
    };
    let outcome = {
        let mut runner = lock(&slot.runner);
        match runner.as_mut() {
            Some(r) => {
                let out = r.step(event);
                (slot.after_step)(r, &out);
                Some(out)
            }
            None => None,
        }
    };
    let failed = Failure::permanent("the flow was stopped");
    for f in flushes {
        let answer = outcome
            .as_ref()
            .and_then(|o| o.flushed.clone())
            .unwrap_or_else(|| Err(failed.clone()));
        let _ = f.send(answer);
    }
    if let Some(ack) = stop {
        let _ = ack.send(());
    }
    let requeue = {
        let mut s = lock(&slot.sched);
        s.running = false;
        if let Some(out) = &outcome {
            s.again |= out.again;
            if let Some(at) = out.wake_at {
                if s.timer_at.is_none_or(|t| t != at) {
                    s.timer_at = Some(at);
                    lock(&inner.queue).timers.push(Reverse((at, slot.id)));
                    inner.cv.notify_one();
                }
            }
        }
        let work = s.input || s.again || !s.flushes.is_empty() || s.stop.is_some() || s.timer_due;
        let requeue = !s.removed && work && !s.queued && event != Event::Stop;
        if requeue {
            s.queued = true;
        }
        requeue
    };
    if requeue {
        inner.enqueue(slot);
    }
}
