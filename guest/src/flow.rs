//! The flow: buffered input, the operator chain, the output queue, snapshot and restore.

use std::cell::RefCell;
use std::rc::Rc;

use crate::agg::AggOp;
use crate::codec::{checksum, Reader, Writer};
use crate::column::{append, empty_column, range_of, slice, take_chunk, Chunk, Diffs};
use crate::expr::Expr;
use crate::hash::FxHashMap;
use crate::join::JoinOp;
use crate::plan::{lower, HopSpec, Input, OpSpec};
use crate::temporal::TemporalOp;
use crate::types::{
    bad, internal, validate_batch, Batch, Column, DataType, Field, FlowError, SourceSchema,
    TickOutput,
};

pub use sandflow_contract::OPTION_EXPIRE_AFTER_MS;
const KNOWN_OPTIONS: &[&str] = &[OPTION_EXPIRE_AFTER_MS];

const MAGIC: &[u8; 8] = b"SNDFLOW\0";
/// 2: pending input batches carry their source index, and join state follows each stage's
/// aggregates. 3: a max beside a min over the same argument (or the other way round) keeps no
/// multisets of its own, an aggregate keeps its tick in progress, and the checksum is xxh3
/// (`codec::checksum`). 4: a multiset of values each there once is written as its values
/// alone (`MultiSet::write`). Versions 1 (one source, no joins) to 3 are still read.
const VERSION: u32 = 4;

/// One operator of the chain. Stateful operators live in `Rc<RefCell<..>>` so that the
/// snapshot code and the driver can both reach their state.
enum Op {
    Filter {
        pred: Expr,
        in_types: Vec<DataType>,
    },
    Project {
        exprs: Vec<Expr>,
    },
    Aggregate(Rc<RefCell<AggOp>>),
    Temporal(Rc<RefCell<TemporalOp>>),
    Hop {
        spec: HopSpec,
        in_types: Vec<DataType>,
    },
}

/// Where a stage's rows come from.
enum StageInput {
    Source(usize),
    Join {
        left: usize,
        right: usize,
        op: Box<JoinOp>,
    },
    Union(Vec<usize>),
}

/// One stage of the plan: its input, then its chain of operators.
struct Stage {
    input: StageInput,
    ops: Vec<Op>,
}

/// A running flow.
pub struct Flow {
    plan: Vec<u8>,
    sources: Vec<SourceSchema>,
    options: Vec<(String, String)>,
    /// How many stages read each source (rows of a source no stage reads are checked and
    /// dropped).
    readers: Vec<usize>,
    output: Vec<Field>,
    out_types: Vec<DataType>,
    /// In order: each stage's inputs come before it; the last is the output.
    stages: Vec<Stage>,
    /// Whether the chain's output can never hold the same row twice in one tick, so that
    /// consolidation can be skipped (an aggregate whose columns all reach the output unchanged).
    unique_output: bool,
    /// Input not yet due, with its source index.
    pending: Vec<(usize, Batch)>,
    queue: Batch,
    poisoned: Option<String>,
    expire_wakeup: Option<i64>,
    /// Per source, the stage that folds its rows into an aggregate as they are pushed, when
    /// they are already due (see [`Flow::push`]).
    eager: Vec<Option<usize>>,
    /// The latest tick time: rows stamped at or before it are due at every later tick.
    frontier: i64,
}

impl std::fmt::Debug for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flow")
            .field("output", &self.output)
            .field("pending_batches", &self.pending.len())
            .field("queued_rows", &self.queue.rows)
            .finish()
    }
}

fn parse_options(options: &[(String, String)]) -> Result<Option<i64>, FlowError> {
    let mut expire = None;
    for (k, v) in options {
        match k.as_str() {
            OPTION_EXPIRE_AFTER_MS => {
                let ms: i64 = v.trim().parse().map_err(|_| {
                    bad(format!(
                        "option {k} must be a whole number of milliseconds, got {v:?}"
                    ))
                })?;
                if ms < 0 {
                    return Err(bad(format!("option {k} must not be negative")));
                }
                expire = Some(ms);
            }
            other => {
                return Err(bad(format!(
                    "unknown option {other:?}; known options: {}",
                    KNOWN_OPTIONS.join(", ")
                )))
            }
        }
    }
    Ok(expire)
}

fn empty_batch(types: &[DataType]) -> Batch {
    Batch {
        rows: 0,
        columns: types.iter().map(|t| empty_column(*t)).collect(),
        times: Vec::new(),
        diffs: Vec::new(),
    }
}

impl Flow {
    pub fn create(
        plan: &[u8],
        sources: Vec<SourceSchema>,
        options: Vec<(String, String)>,
    ) -> Result<Flow, FlowError> {
        let expire = parse_options(&options)?;
        let lowered = lower(plan, &sources)?;
        let mut readers = vec![0usize; sources.len()];
        let mut stages: Vec<Stage> = Vec::with_capacity(lowered.stages.len());
        let mut stage_types: Vec<Vec<DataType>> = Vec::with_capacity(lowered.stages.len());
        // Which output columns carry which aggregate column unchanged (for unique_output).
        let mut key_map: Option<(Vec<Option<usize>>, usize)> = None;
        for spec in lowered.stages {
            let earlier = |i: usize| {
                stage_types
                    .get(i)
                    .cloned()
                    .ok_or_else(|| internal("a stage reads a later stage"))
            };
            let (input, mut types) = match spec.input {
                Input::Source(si) => {
                    let src = sources
                        .get(si)
                        .ok_or_else(|| internal("source index out of range"))?;
                    if let Some(r) = readers.get_mut(si) {
                        *r += 1;
                    }
                    (
                        StageInput::Source(si),
                        src.fields.iter().map(|f| f.data_type).collect(),
                    )
                }
                Input::Join(j) => {
                    let (left, right) = (j.left, j.right);
                    let op = JoinOp::new(j, earlier(left)?, earlier(right)?, expire)?;
                    let types = op.out_types().to_vec();
                    (
                        StageInput::Join {
                            left,
                            right,
                            op: Box::new(op),
                        },
                        types,
                    )
                }
                Input::Union(ids) => {
                    let first = earlier(*ids.first().ok_or_else(|| internal("empty union"))?)?;
                    for i in &ids {
                        if earlier(*i)? != first {
                            return Err(internal("union inputs of different types"));
                        }
                    }
                    (StageInput::Union(ids), first)
                }
            };
            key_map = None;
            let mut ops = Vec::new();
            for op in spec.ops {
                match op {
                    OpSpec::Filter(pred) => {
                        if pred.ty() != DataType::Boolean {
                            return Err(bad("filter condition is not boolean"));
                        }
                        ops.push(Op::Filter {
                            pred,
                            in_types: types.clone(),
                        })
                    }
                    OpSpec::Project(exprs) => {
                        if let Some((m, k)) = key_map.take() {
                            let nm = exprs
                                .iter()
                                .map(|e| match e {
                                    Expr::Col(i, _) => m.get(*i).copied().flatten(),
                                    _ => None,
                                })
                                .collect();
                            key_map = Some((nm, k));
                        }
                        types = exprs.iter().map(|e| e.ty()).collect();
                        ops.push(Op::Project { exprs });
                    }
                    OpSpec::Temporal(bounds) => {
                        for b in &bounds {
                            if !b.x.ty().is_timestamp() {
                                return Err(bad("now() compared with a value that is not a time"));
                            }
                        }
                        // Rows pass unchanged: the key map stays.
                        ops.push(Op::Temporal(Rc::new(RefCell::new(TemporalOp::new(
                            bounds,
                            types.clone(),
                        )))));
                    }
                    OpSpec::Hop(spec) => {
                        key_map = None;
                        let in_types = types.clone();
                        types.push(spec.out);
                        ops.push(Op::Hop { spec, in_types });
                    }
                    OpSpec::Aggregate(a) => {
                        crate::agg::validate(&a)?;
                        let op = AggOp::new(a, expire);
                        types = op.out_types();
                        // Track every aggregate column, not only the keys: a -old/+new pair
                        // differs in some aggregate column, and stays distinct only if that
                        // column reaches the output.
                        let n = types.len();
                        key_map = Some(((0..n).map(Some).collect(), n));
                        ops.push(Op::Aggregate(Rc::new(RefCell::new(op))));
                    }
                }
            }
            stages.push(Stage { input, ops });
            stage_types.push(types);
        }
        // Unique when every aggregate column of the last stage reaches the output unchanged:
        // group keys make rows of different groups distinct, and the aggregate never emits a
        // -old/+new pair that is equal on all of its columns.
        let unique_output = match &key_map {
            Some((m, n)) => (0..*n).all(|col| m.contains(&Some(col))),
            None => false,
        };
        let types = stage_types.pop().unwrap_or_default();
        let out_types: Vec<DataType> = lowered.output.iter().map(|f| f.data_type).collect();
        if out_types != types {
            return Err(internal(format!(
                "lowered plan produces {types:?} but the output schema says {out_types:?}"
            )));
        }
        let eager = eager_stages(&stages, &readers);
        Ok(Flow {
            plan: plan.to_vec(),
            sources,
            options,
            readers,
            output: lowered.output,
            queue: empty_batch(&out_types),
            out_types,
            stages,
            unique_output,
            pending: Vec::new(),
            poisoned: None,
            expire_wakeup: None,
            eager,
            frontier: i64::MIN,
        })
    }

    pub fn output_schema(&self) -> Vec<Field> {
        self.output.clone()
    }

    fn check_poisoned(&self) -> Result<(), FlowError> {
        match &self.poisoned {
            Some(m) => Err(internal(format!(
                "flow is stopped by an earlier error: {m}"
            ))),
            None => Ok(()),
        }
    }

    pub fn push(&mut self, source: u32, input: Batch) -> Result<(), FlowError> {
        self.check_poisoned()?;
        let src = self.sources.get(source as usize).ok_or_else(|| {
            bad(format!(
                "unknown source index {source} (the flow has {} sources)",
                self.sources.len()
            ))
        })?;
        validate_batch(&src.fields, &input)?;
        if self.readers.get(source as usize).is_some_and(|r| *r > 0) && input.rows > 0 {
            let due = input.times.iter().all(|t| *t <= self.frontier);
            match self.eager.get(source as usize).copied().flatten() {
                Some(stage) if due => {
                    if let Err(e) = self.absorb(stage, input) {
                        self.poisoned = Some(e.to_string());
                        return Err(e);
                    }
                }
                _ => self.pending.push((source as usize, input)),
            }
        }
        Ok(())
    }

    /// Folds rows that are due into the aggregate of `stage` at once, as the next tick would
    /// (its chain up to the aggregate holds no state, and the aggregate does not expire): the
    /// work of a back-fill, whose rows come stamped [`i64::MIN`], is done while the host reads
    /// the next part, and the tick only emits the changed groups.
    fn absorb(&mut self, stage: usize, input: Batch) -> Result<(), FlowError> {
        let Some(stage) = self.stages.get(stage) else {
            return Err(internal("eager stage out of range"));
        };
        let rows = input.rows as usize;
        let chunk = Chunk {
            rows,
            cols: input.columns,
            diffs: Diffs::from_list(input.diffs, rows),
        };
        let mut produced = Vec::new();
        feed(&stage.ops, 0, chunk, self.frontier, &mut produced)?;
        if produced.iter().any(|c| c.rows > 0) {
            return Err(internal(
                "an eager stage produced rows before its aggregate",
            ));
        }
        Ok(())
    }

    pub fn tick(&mut self, now: i64, max_rows: u32) -> Result<TickOutput, FlowError> {
        self.check_poisoned()?;
        self.frontier = self.frontier.max(now);
        if self.queue.rows == 0 {
            if let Err(e) = self.process(now) {
                self.poisoned = Some(e.to_string());
                return Err(e);
            }
        }
        let output = self.drain(max_rows);
        let ready_left = self
            .pending
            .iter()
            .any(|(_, b)| b.times.iter().any(|t| *t <= now));
        let next = self
            .pending
            .iter()
            .flat_map(|(_, b)| b.times.iter().copied())
            .filter(|t| *t > now)
            .min();
        let next_wakeup = match (next, self.expire_wakeup) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Ok(TickOutput {
            output,
            more: self.queue.rows > 0 || ready_left,
            next_wakeup,
        })
    }

    /// Takes the rows with time <= now out of the pending buffer, per source, in push order.
    fn take_ready(&mut self, now: i64) -> Vec<Vec<Chunk>> {
        let mut by_source: Vec<Vec<Chunk>> = self.sources.iter().map(|_| Vec::new()).collect();
        let mut keep = Vec::new();
        for (si, b) in std::mem::take(&mut self.pending) {
            let Some(ready) = by_source.get_mut(si) else {
                continue;
            };
            let types: Vec<DataType> = self
                .sources
                .get(si)
                .map(|s| s.fields.iter().map(|f| f.data_type).collect())
                .unwrap_or_default();
            let rows = b.rows as usize;
            // A batch with one time for all its rows is ready as a whole or not at all.
            let n_ready = match b.times.as_slice() {
                [t] if *t <= now => rows,
                [_] => 0,
                times => count_at_or_before(times, now),
            };
            if n_ready == rows {
                ready.push(Chunk {
                    rows,
                    cols: b.columns,
                    diffs: Diffs::from_list(b.diffs, rows),
                });
            } else if n_ready == 0 {
                keep.push((si, b));
            } else {
                let (mut now_idx, mut later_idx) = (Vec::new(), Vec::new());
                for (i, t) in b.times.iter().enumerate() {
                    if *t <= now {
                        now_idx.push(i as u32);
                    } else {
                        later_idx.push(i as u32);
                    }
                }
                let all = Chunk {
                    rows,
                    cols: b.columns,
                    diffs: Diffs::from_list(b.diffs, rows),
                };
                ready.push(take_chunk(&all, &types, &now_idx));
                let rest = take_chunk(&all, &types, &later_idx);
                keep.push((
                    si,
                    Batch {
                        rows: rest.rows as u32,
                        columns: rest.cols,
                        times: later_idx
                            .iter()
                            .map(|&i| b.times.get(i as usize).copied().unwrap_or(0))
                            .collect(),
                        diffs: rest.diffs.into_each(rest.rows),
                    },
                ));
            }
        }
        self.pending = keep;
        by_source
    }

    fn process(&mut self, now: i64) -> Result<(), FlowError> {
        let mut ready = self.take_ready(now);
        let mut outs: Vec<Vec<Chunk>> = self.stages.iter().map(|_| Vec::new()).collect();
        let mut wake: Option<i64> = None;
        for s in 0..self.stages.len() {
            let Some(stage) = self.stages.get_mut(s) else {
                break;
            };
            let take = |outs: &mut Vec<Vec<Chunk>>, i: usize| {
                outs.get_mut(i).map(std::mem::take).unwrap_or_default()
            };
            let inputs = match &mut stage.input {
                StageInput::Source(si) => match ready.get_mut(*si) {
                    Some(r) if self.readers.get(*si).is_some_and(|n| *n > 1) => r.clone(),
                    Some(r) => std::mem::take(r),
                    None => Vec::new(),
                },
                StageInput::Join { left, right, op } => {
                    let l = take(&mut outs, *left);
                    let r = take(&mut outs, *right);
                    op.step(l, r, now)?
                }
                StageInput::Union(ids) => {
                    let mut all = Vec::new();
                    for i in ids.iter() {
                        all.extend(take(&mut outs, *i));
                    }
                    all
                }
            };
            let mut produced = Vec::new();
            for c in inputs {
                feed(&stage.ops, 0, c, now, &mut produced)?;
            }
            for i in 0..stage.ops.len() {
                let out = match stage.ops.get(i) {
                    Some(Op::Aggregate(agg)) => {
                        let out = agg.borrow_mut().flush();
                        if let Some(w) = agg.borrow_mut().expire(now) {
                            wake = Some(wake.map_or(w, |x| x.min(w)));
                        }
                        out
                    }
                    Some(Op::Temporal(t)) => {
                        let out = t.borrow_mut().flush(now);
                        if let Some(w) = t.borrow().next_wakeup() {
                            wake = Some(wake.map_or(w, |x| x.min(w)));
                        }
                        out
                    }
                    _ => continue,
                };
                if out.rows > 0 {
                    feed(&stage.ops, i + 1, out, now, &mut produced)?;
                }
            }
            if let Some(o) = outs.get_mut(s) {
                *o = produced;
            }
        }
        self.expire_wakeup = wake;
        let mut outputs = outs.pop().unwrap_or_default();
        let mut merged = match outputs.len() {
            0 => return Ok(()),
            1 => outputs.pop().unwrap_or_default(),
            _ => {
                let mut m = Chunk {
                    rows: 0,
                    cols: self.out_types.iter().map(|t| empty_column(*t)).collect(),
                    diffs: Diffs::default(),
                };
                let mut diffs = Vec::new();
                for c in &outputs {
                    for ((dst, src), t) in m.cols.iter_mut().zip(c.cols.iter()).zip(&self.out_types)
                    {
                        append(dst, src, t.storage(), m.rows);
                    }
                    diffs.extend_from_slice(&c.diffs.each(c.rows));
                    m.rows += c.rows;
                }
                m.diffs = Diffs::Each(diffs);
                m
            }
        };
        if !self.unique_output {
            merged = consolidate(merged, &self.out_types);
        }
        if merged.rows == 0 {
            return Ok(());
        }
        self.queue = Batch {
            rows: merged.rows as u32,
            columns: merged.cols,
            // One time for all rows (the contract allows it; the host expands it).
            times: vec![now],
            diffs: merged.diffs.into_each(merged.rows),
        };
        Ok(())
    }
}

/// Per source, the stage that may fold its due rows in as they are pushed: the only stage
/// reading the source, whose chain holds nothing but row-by-row operators (filters,
/// projections, `hop`) before an aggregate that does not expire.
fn eager_stages(stages: &[Stage], readers: &[usize]) -> Vec<Option<usize>> {
    let eager = |st: &Stage| {
        for op in &st.ops {
            match op {
                Op::Filter { .. } | Op::Project { .. } | Op::Hop { .. } => {}
                Op::Aggregate(a) => return !a.borrow().expires(),
                Op::Temporal(_) => return false,
            }
        }
        false
    };
    readers
        .iter()
        .enumerate()
        .map(|(si, n)| {
            let reads = |st: &Stage| matches!(st.input, StageInput::Source(s) if s == si);
            match n {
                1 => stages.iter().position(|st| reads(st) && eager(st)),
                _ => None,
            }
        })
        .collect()
}

/// Runs `c` through `ops` from operator `start`: stops at an aggregate, which absorbs it, or
/// appends what comes out of the last operator to `outputs`.
fn feed(
    ops: &[Op],
    start: usize,
    mut c: Chunk,
    now: i64,
    outputs: &mut Vec<Chunk>,
) -> Result<(), FlowError> {
    for op in ops.iter().skip(start) {
        if c.rows == 0 {
            return Ok(());
        }
        match op {
            Op::Filter { pred, in_types } => {
                let v = pred.eval(&c)?;
                let keep: Vec<u32> = (0..c.rows)
                    .filter(|&i| !v.is_null(i) && v.ints.get(i).copied().unwrap_or(0) != 0)
                    .map(|i| i as u32)
                    .collect();
                if keep.len() != c.rows {
                    let t = take_chunk(&c, in_types, &keep);
                    c = t;
                }
            }
            Op::Project { exprs } => {
                let mut cols: Vec<Option<Column>> = Vec::with_capacity(exprs.len());
                let mut uses = vec![0usize; c.cols.len()];
                for e in exprs {
                    if let Expr::Col(i, _) = e {
                        if let Some(u) = uses.get_mut(*i) {
                            *u += 1;
                        }
                    }
                }
                for e in exprs {
                    match e {
                        Expr::Col(i, _) if uses.get(*i) == Some(&1) => cols.push(None),
                        _ => cols.push(Some(e.eval(&c)?.into_owned())),
                    }
                }
                let mut out = Vec::with_capacity(exprs.len());
                for (e, col) in exprs.iter().zip(cols) {
                    match (col, e) {
                        (Some(col), _) => out.push(col),
                        (None, Expr::Col(i, _)) => out.push(
                            c.cols
                                .get_mut(*i)
                                .map(std::mem::take)
                                .ok_or_else(|| internal("projection out of range"))?,
                        ),
                        (None, _) => return Err(internal("projection bookkeeping")),
                    }
                }
                c.cols = out;
            }
            Op::Aggregate(a) => {
                a.borrow_mut().absorb(&c, now)?;
                return Ok(());
            }
            Op::Temporal(t) => c = t.borrow_mut().absorb(&c, now)?,
            Op::Hop { spec, in_types } => c = hop_windows(&c, spec, in_types)?,
        }
    }
    if c.rows > 0 {
        outputs.push(c);
    }
    Ok(())
}

impl Flow {
    fn drain(&mut self, max_rows: u32) -> Batch {
        let n = self.queue.rows;
        if n <= max_rows {
            return std::mem::replace(&mut self.queue, empty_batch(&self.out_types));
        }
        let q = &self.queue;
        let cut = |start: u32, end: u32| {
            let (start, end) = (start as usize, end as usize);
            Batch {
                rows: (end - start) as u32,
                columns: q
                    .columns
                    .iter()
                    .zip(&self.out_types)
                    .map(|(c, t)| slice(c, t.storage(), start, end))
                    .collect(),
                times: match q.times.as_slice() {
                    [t] if end > start => vec![*t],
                    times => range_of(times, start, end),
                },
                diffs: range_of(&q.diffs, start, end),
            }
        };
        let out = cut(0, max_rows);
        let rest = cut(max_rows, n);
        self.queue = rest;
        out
    }

    pub fn state_size(&self) -> u64 {
        let ops: usize = self
            .stages
            .iter()
            .map(|s| {
                let join = match &s.input {
                    StageInput::Join { op, .. } => op.state_size(),
                    _ => 0,
                };
                join + s
                    .ops
                    .iter()
                    .map(|o| match o {
                        Op::Aggregate(a) => a.borrow().state_size(),
                        Op::Temporal(t) => t.borrow().state_size(),
                        _ => 0,
                    })
                    .sum::<usize>()
            })
            .sum();
        let pending: usize = self
            .pending
            .iter()
            .map(|(_, b)| {
                b.columns.iter().map(|c| c.approx_bytes()).sum::<usize>()
                    + (b.times.len() + b.diffs.len()) * 8
            })
            .sum();
        let queue: usize = self
            .queue
            .columns
            .iter()
            .map(|c| c.approx_bytes())
            .sum::<usize>()
            + (self.queue.times.len() + self.queue.diffs.len()) * 8;
        (ops + pending + queue) as u64
    }

    pub fn snapshot(&self) -> Result<Vec<u8>, FlowError> {
        self.check_poisoned()?;
        let mut w = Writer::default();
        // Section 1: definition.
        let mut d = Writer::default();
        d.bytes(&self.plan);
        d.u64(self.sources.len() as u64);
        for s in &self.sources {
            d.str(&s.name);
            d.u64(s.fields.len() as u64);
            for f in &s.fields {
                d.str(&f.name);
                d.u8(f.data_type.code());
                d.u8(f.nullable as u8);
            }
        }
        d.u64(self.options.len() as u64);
        for (k, v) in &self.options {
            d.str(k);
            d.str(v);
        }
        // Section 2: pending input and queued output.
        let mut q = Writer::default();
        q.u64(self.pending.len() as u64);
        for (si, b) in &self.pending {
            q.u32(*si as u32);
            write_batch(&mut q, b);
        }
        write_batch(&mut q, &self.queue);
        match self.expire_wakeup {
            Some(t) => {
                q.u8(1);
                q.i64(t);
            }
            None => q.u8(0),
        }
        // Section 3: operator state, the bulk of a snapshot, written in place
        // into a buffer of the snapshot's size, counted first.
        let mut state = Writer::counting();
        self.write_state(&mut state);
        let size = MAGIC.len() + 4 + 8 + d.len() + 8 + q.len() + 8 + state.len() + 8;
        w.buf.reserve_exact(size);
        w.buf.extend_from_slice(MAGIC);
        w.u32(VERSION);
        w.bytes(&d.buf);
        w.bytes(&q.buf);
        w.section(|o| self.write_state(o));
        let sum = checksum(VERSION, &w.buf);
        w.u64(sum);
        Ok(w.buf)
    }

    /// The operators' state, section 3 of a snapshot.
    fn write_state(&self, o: &mut Writer) {
        for stage in &self.stages {
            for op in &stage.ops {
                match op {
                    Op::Aggregate(a) => a.borrow().write(o),
                    Op::Temporal(t) => t.borrow().write(o),
                    _ => {}
                }
            }
            if let StageInput::Join { op, .. } = &stage.input {
                op.write(o);
            }
        }
    }

    pub fn restore(state: &[u8]) -> Result<Flow, FlowError> {
        let corrupt = |m: &str| bad(format!("snapshot: {m}"));
        if state.len() < MAGIC.len() + 4 + 8 || state.get(..MAGIC.len()) != Some(&MAGIC[..]) {
            return Err(corrupt("not a sandflow snapshot (bad magic header)"));
        }
        let (body, sum) = state.split_at(state.len() - 8);
        let mut r = Reader::new(body);
        r.take(MAGIC.len())?;
        let version = r.u32()?;
        if !(1..=VERSION).contains(&version) {
            return Err(corrupt(&format!(
                "unsupported snapshot version {version} (this engine reads {VERSION})"
            )));
        }
        let mut sb = [0u8; 8];
        sb.copy_from_slice(sum);
        if checksum(version, body) != u64::from_le_bytes(sb) {
            return Err(corrupt("checksum mismatch (corrupt or truncated)"));
        }
        let mut d = Reader::new(r.bytes()?);
        let plan = d.bytes()?.to_vec();
        let ns = d.len(16)?;
        let mut sources = Vec::with_capacity(ns);
        for _ in 0..ns {
            let name = d.string()?;
            let nf = d.len(10)?;
            let mut fields = Vec::with_capacity(nf);
            for _ in 0..nf {
                let fname = d.string()?;
                let ty = DataType::from_code(d.u8()?).ok_or_else(|| corrupt("bad type code"))?;
                let nullable = d.u8()? != 0;
                fields.push(Field {
                    name: fname,
                    data_type: ty,
                    nullable,
                });
            }
            sources.push(SourceSchema { name, fields });
        }
        let no = d.len(16)?;
        let mut options = Vec::with_capacity(no);
        for _ in 0..no {
            let k = d.string()?;
            let v = d.string()?;
            options.push((k, v));
        }
        let mut flow = Flow::create(&plan, sources, options)?;
        let mut q = Reader::new(r.bytes()?);
        let np = q.len(8)?;
        // Version 1 flows read one source.
        let only_source = flow.stages.iter().find_map(|s| match s.input {
            StageInput::Source(si) => Some(si),
            _ => None,
        });
        for _ in 0..np {
            let si = match version {
                1 => only_source.unwrap_or(0),
                _ => q.u32()? as usize,
            };
            let b = read_batch(&mut q)?;
            let src = flow
                .sources
                .get(si)
                .ok_or_else(|| corrupt("pending input of an unknown source"))?;
            validate_batch(&src.fields, &b)?;
            flow.pending.push((si, b));
        }
        let queue = read_batch(&mut q)?;
        validate_batch(&flow.output, &queue).map_err(|e| corrupt(&format!("queue: {e}")))?;
        flow.queue = queue;
        flow.expire_wakeup = match q.u8()? {
            0 => None,
            _ => Some(q.i64()?),
        };
        let mut o = Reader::new(r.bytes()?);
        for stage in &mut flow.stages {
            for op in &stage.ops {
                match op {
                    Op::Aggregate(a) => a.borrow_mut().read(&mut o, version)?,
                    Op::Temporal(t) => t.borrow_mut().read(&mut o)?,
                    _ => {}
                }
            }
            if let StageInput::Join { op, .. } = &mut stage.input {
                op.read(&mut o)?;
            }
        }
        if o.remaining() != 0 || r.remaining() != 0 {
            return Err(corrupt("trailing bytes"));
        }
        Ok(flow)
    }
}

fn write_batch(w: &mut Writer, b: &Batch) {
    w.u32(b.rows);
    w.u64(b.columns.len() as u64);
    for c in &b.columns {
        w.i64s(&c.ints);
        w.f64s(&c.floats);
        w.bytes(&c.bytes);
        w.u32s(&c.offsets);
        w.bytes(&c.nulls);
    }
    w.i64s(&b.times);
    w.i64s(&b.diffs);
}

fn read_batch(r: &mut Reader<'_>) -> Result<Batch, FlowError> {
    let rows = r.u32()?;
    let nc = r.len(40)?;
    let mut columns = Vec::with_capacity(nc);
    for _ in 0..nc {
        let ints = r.i64s()?;
        let floats = r.f64s()?;
        let bytes = r.bytes()?.to_vec();
        let offsets = r.u32s()?;
        let nulls = r.bytes()?.to_vec();
        columns.push(Column {
            ints,
            floats,
            bytes,
            offsets,
            nulls,
        });
    }
    let times = r.i64s()?;
    let diffs = r.i64s()?;
    Ok(Batch {
        rows,
        columns,
        times,
        diffs,
    })
}

/// How many of `times` are `<= now` (unrolled by four: in wasm every loop iteration also pays an
/// epoch-interruption check).
fn count_at_or_before(times: &[i64], now: i64) -> usize {
    let mut c4 = times.chunks_exact(4);
    let mut n = 0;
    for c in &mut c4 {
        n += c.iter().filter(|t| **t <= now).count();
    }
    n + c4.remainder().iter().filter(|t| **t <= now).count()
}

/// Sums the diffs of identical rows; drops rows whose diffs cancel. Keeps first-seen order.
fn consolidate(c: Chunk, types: &[DataType]) -> Chunk {
    let mut index: FxHashMap<Vec<u8>, usize> = FxHashMap::default();
    let mut firsts: Vec<u32> = Vec::new();
    let mut sums: Vec<i64> = Vec::new();
    let mut buf = Vec::new();
    let cows: Vec<std::borrow::Cow<'_, Column>> =
        c.cols.iter().map(std::borrow::Cow::Borrowed).collect();
    for i in 0..c.rows {
        buf.clear();
        crate::agg::encode_row(&mut buf, &cows, types, i);
        let d = c.diffs.get(i);
        match index.get(buf.as_slice()) {
            Some(&k) => {
                if let Some(s) = sums.get_mut(k) {
                    *s = s.wrapping_add(d);
                }
            }
            None => {
                index.insert(buf.clone(), firsts.len());
                firsts.push(i as u32);
                sums.push(d);
            }
        }
    }
    if firsts.len() == c.rows && sums.iter().all(|s| *s != 0) {
        return Chunk {
            rows: c.rows,
            cols: c.cols,
            diffs: Diffs::Each(sums),
        };
    }
    let (idx, diffs): (Vec<u32>, Vec<i64>) = firsts
        .into_iter()
        .zip(sums)
        .filter(|(_, s)| *s != 0)
        .unzip();
    let mut out = take_chunk(&c, types, &idx);
    out.diffs = Diffs::Each(diffs);
    out
}

/// Each row of `c` once per hop window that holds its time, with the
/// window's start appended: windows `[start, start + size)`, starts at the
/// multiples of `slide` (as date_bin's bins). A row without a time is in no
/// window.
fn hop_windows(c: &Chunk, spec: &HopSpec, in_types: &[DataType]) -> Result<Chunk, FlowError> {
    let v = spec.ts.eval(c)?;
    let unit = spec.ts.ty().timestamp_unit_nanos().unwrap_or(1) as i128;
    let out_unit = spec.out.timestamp_unit_nanos().unwrap_or(1) as i128;
    let (slide, size) = (spec.slide_ns as i128, spec.size_ns as i128);
    let mut take = Vec::new();
    let mut starts = Vec::new();
    for (i, x) in v.ints.iter().enumerate().take(c.rows) {
        if v.is_null(i) {
            continue;
        }
        let ns = *x as i128 * unit;
        let mut start = ns.div_euclid(slide) * slide;
        while start > ns - size {
            take.push(i as u32);
            starts.push(start.div_euclid(out_unit) as i64);
            start -= slide;
        }
    }
    let mut out = take_chunk(c, in_types, &take);
    out.cols.push(Column {
        ints: starts,
        ..Column::default()
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Column;

    /// Rows of the rollup in `testdata/snapshot-v2-rollup.bin`: keys k0..k2, a row every 7 s,
    /// values -3.5..6.5 with repeats.
    fn rows(range: std::ops::Range<usize>, diff: i64) -> Batch {
        let base = 1_767_225_600_000i64;
        let mut k = Column::default();
        k.offsets.push(0);
        let (mut ts, mut v) = (Column::default(), Column::default());
        for i in range.clone() {
            k.bytes.extend_from_slice(format!("k{}", i % 3).as_bytes());
            k.offsets.push(k.bytes.len() as u32);
            ts.ints.push(base + 7_000 * i as i64);
            v.floats.push(((i * 7) % 11) as f64 - 3.5);
        }
        Batch {
            rows: range.len() as u32,
            columns: vec![k, ts, v],
            times: vec![0],
            diffs: vec![diff],
        }
    }

    fn at(mut b: Batch, time: i64) -> Batch {
        b.times = vec![time];
        b
    }

    fn sorted(
        flow: &mut Flow,
        now: i64,
    ) -> Result<Vec<(Vec<crate::types::Value>, i64, i64)>, FlowError> {
        let out = flow.output_schema();
        let mut got = flow.tick(now, u32::MAX)?.output.to_rows(&out);
        got.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        Ok(got)
    }

    /// Rows that are due when pushed (stamped at or before the last tick, or `i64::MIN`) are
    /// folded into the aggregate at once; the output, also across a snapshot taken before the
    /// tick, is what a tick over the same rows left pending gives.
    #[test]
    fn due_rows_fold_in_as_pushed_and_snapshots_keep_the_tick_in_progress() -> Result<(), FlowError>
    {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let (plan, sources) = (old.plan.clone(), old.sources.clone());
        let mut eager = Flow::create(&plan, sources.clone(), vec![])?;
        let mut late = Flow::create(&plan, sources, vec![])?;
        assert_eq!(eager.eager, vec![Some(0)]);
        eager.push(0, at(rows(0..40, 1), i64::MIN))?;
        assert!(eager.pending.is_empty(), "folded in at once");
        late.push(0, at(rows(0..40, 1), 5))?;
        assert_eq!(late.pending.len(), 1, "not due before a tick at 5");
        let mut eager = Flow::restore(&eager.snapshot()?)?;
        let first = sorted(&mut eager, 5)?;
        assert_eq!(first.len(), 15);
        assert_eq!(first, sorted(&mut late, 5)?);
        // After a tick at 5, rows stamped 5 or earlier are due; deletions move some minimums
        // and maximums, and groups change twice before the next tick.
        eager.push(0, at(rows(0..12, -1), 5))?;
        eager.push(0, at(rows(40..60, 1), 3))?;
        let mut eager = Flow::restore(&eager.snapshot()?)?;
        eager.push(0, at(rows(0..3, 1), i64::MIN))?;
        eager.push(0, at(rows(60..64, 1), 9))?;
        assert_eq!(
            eager.pending.len(),
            1,
            "rows stamped after the last tick wait"
        );
        for (b, t) in [
            (rows(0..12, -1), 6),
            (rows(40..60, 1), 6),
            (rows(0..3, 1), 6),
        ] {
            late.push(0, at(b, t))?;
        }
        late.push(0, at(rows(60..64, 1), 9))?;
        let second = sorted(&mut eager, 9)?;
        assert!(second.iter().any(|(_, _, d)| *d < 0));
        assert_eq!(second, sorted(&mut late, 9)?);
        assert_eq!(eager.snapshot()?, late.snapshot()?);
        Ok(())
    }

    /// A tick whose first changes make only new groups stores no earlier values for them; a
    /// later change to a group that existed before stores them after all. Either order of the
    /// same changes, and a snapshot taken in between, give the same output.
    #[test]
    fn new_groups_first_or_last_in_a_tick_give_the_same_output() -> Result<(), FlowError> {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let (plan, sources) = (old.plan.clone(), old.sources.clone());
        let mut flows = Vec::new();
        for _ in 0..3 {
            let mut f = Flow::create(&plan, sources.clone(), vec![])?;
            f.push(0, at(rows(0..30, 1), i64::MIN))?;
            assert_eq!(sorted(&mut f, 5)?.len(), 12);
            flows.push(f);
        }
        let (new, existing) = (|| rows(60..90, 1), || rows(0..8, -1));
        // New groups first (their earlier values not stored), then groups that existed.
        flows[0].push(0, at(new(), i64::MIN))?;
        flows[0].push(0, at(existing(), i64::MIN))?;
        // The other order: every earlier value stored.
        flows[1].push(0, at(existing(), i64::MIN))?;
        flows[1].push(0, at(new(), i64::MIN))?;
        // New groups first, across a snapshot of the tick in progress.
        flows[2].push(0, at(new(), i64::MIN))?;
        let mut restored = Flow::restore(&flows[2].snapshot()?)?;
        restored.push(0, at(existing(), i64::MIN))?;
        flows[2] = restored;
        let outputs = flows
            .iter_mut()
            .map(|f| sorted(f, 9))
            .collect::<Result<Vec<_>, _>>()?;
        assert!(outputs[0].iter().any(|(_, _, d)| *d < 0), "groups changed");
        assert!(outputs[0].iter().filter(|(_, _, d)| *d > 0).count() > 8);
        assert_eq!(outputs[0], outputs[1]);
        assert_eq!(outputs[0], outputs[2]);
        // A tick of new groups alone, across a snapshot: each once, none retracted.
        let mut f = Flow::create(&plan, sources.clone(), vec![])?;
        f.push(0, at(rows(0..30, 1), i64::MIN))?;
        let mut f = Flow::restore(&f.snapshot()?)?;
        let first = sorted(&mut f, 5)?;
        assert!(first.iter().all(|(_, _, d)| *d == 1));
        let mut g = Flow::create(&plan, sources, vec![])?;
        g.push(0, at(rows(0..30, 1), 5))?;
        assert_eq!(first, sorted(&mut g, 5)?);
        Ok(())
    }

    /// A snapshot is written into a buffer made its exact size at once (counted first), not
    /// grown step by step; the counting writes nothing, so the snapshot restores as before.
    #[test]
    fn a_snapshot_is_written_into_a_buffer_of_its_size() -> Result<(), FlowError> {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let mut flow = Flow::create(&old.plan, old.sources.clone(), vec![])?;
        for (range, diff, time) in [(0..40, 1, 0), (0..6, -1, 0), (40..300, 1, 9)] {
            flow.push(0, at(rows(range, diff), time))?;
        }
        flow.tick(1, u32::MAX)?;
        let snapshot = flow.snapshot()?;
        assert!(snapshot.len() > 4096);
        assert_eq!(snapshot.capacity(), snapshot.len());
        let mut counted = Writer::counting();
        flow.write_state(&mut counted);
        let mut written = Writer::default();
        flow.write_state(&mut written);
        assert_eq!(counted.len(), written.buf.len());
        assert!(counted.buf.is_empty());
        let mut restored = Flow::restore(&snapshot)?;
        assert_eq!(restored.snapshot()?, snapshot);
        assert_eq!(sorted(&mut restored, 9)?, sorted(&mut flow, 9)?);
        Ok(())
    }

    /// Rows of many keys interleaved in one chunk (as a table keyed by time first is read),
    /// more distinct keys than `lookup`'s cache of the chunk's keys has slots, so that keys
    /// share slots: the same result as the same rows one key after the other.
    #[test]
    fn interleaved_keys_in_a_chunk_give_what_runs_of_keys_give() -> Result<(), FlowError> {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let keys = 6000usize;
        let batch = |order: &[(usize, usize)]| {
            let mut k = Column::default();
            k.offsets.push(0);
            let (mut ts, mut v) = (Column::default(), Column::default());
            for &(key, i) in order {
                k.bytes.extend_from_slice(format!("key-{key}").as_bytes());
                k.offsets.push(k.bytes.len() as u32);
                ts.ints.push(1_767_225_630_000 + 10_000 * i as i64);
                v.floats.push(((key * 7 + i) % 13) as f64);
            }
            Batch {
                rows: order.len() as u32,
                columns: vec![k, ts, v],
                times: vec![0],
                diffs: vec![1],
            }
        };
        let by_time: Vec<(usize, usize)> = (0..4)
            .flat_map(|i| (0..keys).map(move |key| (key, i)))
            .collect();
        let mut by_key = by_time.clone();
        by_key.sort();
        let mut outputs = Vec::new();
        for order in [&by_time, &by_key] {
            let mut f = Flow::create(&old.plan, old.sources.clone(), vec![])?;
            f.push(0, batch(order))?;
            outputs.push(sorted(&mut f, 1)?);
        }
        // Small chunks get a cache of their own size: 12 rows, three keys
        // interleaved, in 16 slots.
        let mut f = Flow::create(&old.plan, old.sources.clone(), vec![])?;
        for block in 0..keys / 3 {
            let part: Vec<(usize, usize)> = (0..4)
                .flat_map(|i| (0..3).map(move |j| (block * 3 + j, i)))
                .collect();
            f.push(0, batch(&part))?;
        }
        outputs.push(sorted(&mut f, 1)?);
        // Four rows per key, at 30, 40, 50 s and the next minute: two groups each.
        assert_eq!(outputs[0].len(), 2 * keys);
        assert_eq!(outputs[0], outputs[1]);
        assert_eq!(outputs[0], outputs[2]);
        Ok(())
    }

    /// min/max of numbers without NULLs take their own loop (`ord_keys`); a column with a NULL
    /// takes the general one. Both give the same groups, for signed zeros, NaN, infinities and
    /// retractions, with one diff for all rows and one per row.
    #[test]
    fn min_max_of_numbers_without_nulls_is_what_the_general_path_gives() -> Result<(), FlowError> {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let values = [
            -0.0,
            0.0,
            f64::NAN,
            -2.5,
            7.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
        ];
        // (key, value index, diff) rows, and whether a NULL row of a key of its own comes last.
        let batch = |rows: &[(usize, usize, i64)], null: bool| {
            let mut k = Column::default();
            k.offsets.push(0);
            let (mut ts, mut v) = (Column::default(), Column::default());
            for &(key, i, _) in rows {
                k.bytes.extend_from_slice(format!("key-{key}").as_bytes());
                k.offsets.push(k.bytes.len() as u32);
                ts.ints.push(1_767_225_600_000 + 1_000 * i as i64);
                v.floats.push(values[i % values.len()]);
            }
            let mut diffs: Vec<i64> = rows.iter().map(|r| r.2).collect();
            if null {
                k.bytes.extend_from_slice(b"null-key");
                k.offsets.push(k.bytes.len() as u32);
                ts.ints.push(1_767_225_600_000);
                v.floats.push(0.0);
                v.nulls = vec![0; rows.len()];
                v.nulls.push(1);
                diffs.push(1);
            }
            let n = k.offsets.len() - 1;
            if diffs.iter().all(|d| *d == 1) {
                diffs = vec![1];
            }
            Batch {
                rows: n as u32,
                columns: vec![k, ts, v],
                times: vec![0],
                diffs,
            }
        };
        let inserts: Vec<(usize, usize, i64)> = (0..40)
            .flat_map(|key| (0..values.len()).map(move |i| (key, i + key, 1)))
            .collect();
        // Retract some values again, among new ones: one diff per row.
        let mixed: Vec<(usize, usize, i64)> = (0..40)
            .flat_map(|key| [(key, key, -1), (key, key + 3, -1), (key, key + 5, 1)])
            .collect();
        let mut outputs = Vec::new();
        for null in [false, true] {
            let mut f = Flow::create(&old.plan, old.sources.clone(), vec![])?;
            f.push(0, batch(&inserts, null))?;
            let first = sorted(&mut f, 1)?;
            f.push(0, batch(&mixed, null))?;
            let second = sorted(&mut f, 2)?;
            let no_null_key = |rows: Vec<(Vec<crate::types::Value>, i64, i64)>| {
                rows.into_iter()
                    .filter(|r| !format!("{:?}", r.0).contains("null-key"))
                    .collect::<Vec<_>>()
            };
            outputs.push((no_null_key(first), no_null_key(second)));
        }
        assert_eq!(outputs[0].0.len(), 40, "one group per key");
        assert!(
            outputs[0].1.iter().any(|r| r.2 < 0),
            "retractions change groups"
        );
        assert_eq!(format!("{:?}", outputs[0]), format!("{:?}", outputs[1]));
        Ok(())
    }

    /// A group whose rows were all deleted keeps an empty min/max multiset, which format 4
    /// writes in one word: a snapshot of a rollup with mostly such groups is shorter than 16
    /// bytes per multiset, and must still restore (it was refused as truncated).
    #[test]
    fn a_snapshot_of_mostly_emptied_groups_restores() -> Result<(), FlowError> {
        let old = Flow::restore(include_bytes!("../testdata/snapshot-v2-rollup.bin"))?;
        let mut flow = Flow::create(&old.plan, old.sources.clone(), vec![])?;
        flow.push(0, rows(0..300, 1))?;
        assert!(sorted(&mut flow, 1)?.len() > 100);
        flow.push(0, rows(0..295, -1))?;
        let retracted = sorted(&mut flow, 2)?;
        assert!(retracted.iter().filter(|(_, _, d)| *d < 0).count() > 100);
        let snapshot = flow.snapshot()?;
        let mut restored = Flow::restore(&snapshot)?;
        assert_eq!(restored.snapshot()?, snapshot);
        for f in [&mut flow, &mut restored] {
            f.push(0, rows(290..295, 1))?;
            f.push(0, rows(296..298, -1))?;
        }
        let after = sorted(&mut restored, 3)?;
        assert!(!after.is_empty());
        assert_eq!(after, sorted(&mut flow, 3)?);
        Ok(())
    }

    fn mirrors(flow: &Flow) -> usize {
        let mut n = 0;
        for stage in &flow.stages {
            for op in &stage.ops {
                if let Op::Aggregate(a) = op {
                    n += a.borrow().mirrors();
                }
            }
        }
        n
    }

    /// A snapshot of format 3, where every multiset value was written with its multiplicity,
    /// written by the engine before format 4 (the flow of the format 2 snapshot below, then
    /// rows 40..70 and, a second time, rows 10..20: some values are there twice), goes on
    /// exactly as a flow that saw the same rows.
    #[test]
    fn snapshots_of_format_3_restore_with_their_multiplicities() -> Result<(), FlowError> {
        let old = include_bytes!("../testdata/snapshot-v3-rollup.bin");
        assert_eq!(old.get(8..12), Some(&3u32.to_le_bytes()[..]));
        let mut restored = Flow::restore(old)?;
        let mut fresh = Flow::create(&restored.plan, restored.sources.clone(), vec![])?;
        fresh.push(0, rows(0..40, 1))?;
        fresh.tick(0, u32::MAX)?;
        fresh.push(0, rows(0..6, -1))?;
        fresh.tick(1, u32::MAX)?;
        fresh.push(0, rows(40..70, 1))?;
        fresh.push(0, rows(10..20, 1))?;
        fresh.tick(2, u32::MAX)?;
        let now = restored.snapshot()?;
        assert_eq!(now.get(8..12), Some(&VERSION.to_le_bytes()[..]));
        assert!(now.len() < old.len(), "values there once are written alone");
        assert_eq!(now, fresh.snapshot()?);
        // Deleting one copy of a doubled row leaves its value in the group; deleting both
        // moves the minimum or maximum of some groups.
        let mut outputs = Vec::new();
        for flow in [&mut restored, &mut fresh] {
            flow.push(0, rows(10..15, -1))?;
            flow.push(0, rows(15..20, -2))?;
            flow.push(0, rows(40..45, -1))?;
            outputs.push(sorted(flow, 3)?);
        }
        assert!(outputs[0].len() > 5);
        assert_eq!(outputs[0], outputs[1]);
        assert_eq!(restored.snapshot()?, fresh.snapshot()?);
        Ok(())
    }

    /// A snapshot of format 2, where `max(v)` beside `min(v)` kept its own multisets, written by
    /// the engine before format 3 (`SELECT k, date_bin('1 minute', ts), count(*), sum(v),
    /// min(v), max(v) ... GROUP BY 1, 2` after rows 0..40 and the deletion of rows 0..6), goes
    /// on exactly as a flow that saw the same rows.
    #[test]
    fn snapshots_of_format_2_restore_into_shared_min_max() -> Result<(), FlowError> {
        let old = include_bytes!("../testdata/snapshot-v2-rollup.bin");
        assert_eq!(old.get(8..12), Some(&2u32.to_le_bytes()[..]));
        let mut restored = Flow::restore(old)?;
        let mut fresh = Flow::create(&restored.plan, restored.sources.clone(), vec![])?;
        assert_eq!(mirrors(&fresh), 1, "max(v) reads min(v)'s multisets");
        fresh.push(0, rows(0..40, 1))?;
        fresh.tick(0, u32::MAX)?;
        fresh.push(0, rows(0..6, -1))?;
        fresh.tick(1, u32::MAX)?;
        assert_eq!(restored.snapshot()?, fresh.snapshot()?);
        // Deletions that move the minimum and the maximum of some groups, and new rows.
        let mut outputs = Vec::new();
        for flow in [&mut restored, &mut fresh] {
            flow.push(0, rows(6..20, -1))?;
            flow.push(0, rows(40..70, 1))?;
            outputs.push(sorted(flow, 2)?);
        }
        assert!(outputs[0].len() > 10);
        assert_eq!(outputs[0], outputs[1]);
        assert_eq!(restored.snapshot()?, fresh.snapshot()?);
        Ok(())
    }
}
