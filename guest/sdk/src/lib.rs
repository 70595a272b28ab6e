//! Write a sandflow flow component in Rust without touching the WIT glue.
//!
//! Implement [`Component`] for a type that serde can serialise, then
//! `sandflow_sdk::export!(MyType);`, and build the crate (a `cdylib`) with
//! `cargo build --target wasm32-wasip2 --release`. The `.wasm` it writes is a
//! component of sandflow's flow world (`sandflow:flow@0.2.0`), ready for
//! `PUT /v1/components/{name}`.
//!
//! What the SDK does for the component:
//! - checks every batch the host pushes against the source's schema and
//!   turns it into rows of [`Value`]s;
//! - holds pushed rows until a tick reaches their time, then hands them to
//!   [`Component::on_rows`] in time order, then calls [`Component::on_tick`];
//! - consolidates what `on_tick` returns (equal rows' diffs summed, zeros
//!   dropped), checks it against the output schema, stamps it with the tick
//!   time and hands it out at most `max-rows` at a time;
//! - snapshots and restores everything (the component with serde, pending
//!   rows, undrained output) in a versioned, checksummed format.
//!
//! It knows nothing of the host beyond the contract (`wit/flow.wit`).

use std::collections::{BTreeMap, VecDeque};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use sandflow_contract::{
    bad, internal, unsupported, validate_batch, Batch, DataType, Field, FlowError, SourceSchema,
    TickOutput, Value,
};
pub use serde;

mod datum;
pub use datum::Datum;

#[cfg(target_arch = "wasm32")]
#[doc(hidden)]
pub mod component;

/// One input row: its values (in the source's column order), its time and its diff
/// (+1 insert, -1 delete; other multiplicities are allowed).
pub type InputRow = (Vec<Value>, i64, i64);

/// One output change: the row's values (in the output schema's order) and its diff.
pub type OutputRow = (Vec<Value>, i64);

/// A flow component. The SDK snapshots the whole value with serde, so every
/// field is state that survives restarts.
pub trait Component: Serialize + DeserializeOwned + Sized {
    /// The version of this type's serialised form. A snapshot written with
    /// another version is refused at restore (bump it when the fields change
    /// incompatibly).
    const STATE_VERSION: u32 = 1;

    /// Builds the component from what `CREATE FLOW` gives: the Substrait plan
    /// of the query (which it may ignore), the schemas of the query's source
    /// tables, and the flow's options.
    fn create(
        plan: &[u8],
        sources: &[SourceSchema],
        options: &[(String, String)],
    ) -> Result<Self, FlowError>;

    /// The columns of the output, in order; asked once, right after `create`.
    fn output_schema(&self) -> Vec<Field>;

    /// Rows of source `source` (an index into `sources` at create) that take
    /// effect now, in time order.
    fn on_rows(&mut self, source: u32, rows: Vec<InputRow>) -> Result<(), FlowError>;

    /// The changes to the output since the previous tick, after every row up
    /// to `now` was handed to `on_rows`. Changes should be consolidated per
    /// row; the SDK sums equal rows anyway.
    fn on_tick(&mut self, now: i64) -> Result<Vec<OutputRow>, FlowError>;

    /// Approximate bytes of state, for the host's limits and metrics.
    fn state_size(&self) -> u64 {
        0
    }

    /// The earliest time at which a tick would produce something without
    /// new input (for components whose output depends on time).
    fn next_wakeup(&self) -> Option<i64> {
        None
    }
}

/// Exports `$ty` (a [`Component`]) as the crate's flow component. Call it
/// once, at the crate's top level. Outside wasm32 it expands to nothing, so
/// the crate also builds and tests natively.
#[macro_export]
macro_rules! export {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __SandflowExport;
            impl $crate::component::bindings::exports::sandflow::flow::engine::Guest
                for __SandflowExport
            {
                type Flow = $crate::component::FlowResource<$ty>;
            }
            $crate::component::bindings::__export_flow_engine!(
                __SandflowExport with_types_in $crate::component::bindings
            );
        };
    };
}

const MAGIC: &[u8; 6] = b"sfsdk\0";
const FORMAT: u8 = 1;
const HEADER: usize = MAGIC.len() + 1 + 4 + 8;

/// Rows waiting for a tick to reach their time: time → (source, values, diff) in arrival order.
type Pending = BTreeMap<i64, Vec<(u32, Vec<Datum>, i64)>>;

/// A component with everything the contract asks around it: pending input,
/// the output queue, snapshots. The wasm export wraps one per flow; tests
/// drive it natively.
pub struct Runner<C> {
    component: C,
    sources: Vec<SourceSchema>,
    output: Vec<Field>,
    pending: Pending,
    pending_rows: u64,
    queue: VecDeque<(Vec<Datum>, i64, i64)>,
}

#[derive(Serialize)]
struct SnapshotRef<'a, C> {
    sources: Vec<(String, Vec<FieldRepr>)>,
    output: Vec<FieldRepr>,
    pending: &'a Pending,
    queue: &'a VecDeque<(Vec<Datum>, i64, i64)>,
    component: &'a C,
}

#[derive(Deserialize)]
struct SnapshotOwned<C> {
    sources: Vec<(String, Vec<FieldRepr>)>,
    output: Vec<FieldRepr>,
    pending: Pending,
    queue: VecDeque<(Vec<Datum>, i64, i64)>,
    component: C,
}

/// A field as the snapshot stores it: name, data type code, nullable.
type FieldRepr = (String, u8, bool);

fn field_repr(f: &Field) -> FieldRepr {
    (f.name.clone(), f.data_type.code(), f.nullable)
}

fn field_from(r: FieldRepr) -> Result<Field, FlowError> {
    let t = DataType::from_code(r.1)
        .ok_or_else(|| bad(format!("snapshot: unknown data type code {}", r.1)))?;
    Ok(Field::new(r.0, t, r.2))
}

/// FNV-1a, 64 bits: catches a snapshot that was cut or changed.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl<C: Component> Runner<C> {
    pub fn create(
        plan: &[u8],
        sources: Vec<SourceSchema>,
        options: &[(String, String)],
    ) -> Result<Self, FlowError> {
        let component = C::create(plan, &sources, options)?;
        let output = component.output_schema();
        if output.is_empty() {
            return Err(bad("the component's output schema has no columns"));
        }
        Ok(Runner {
            component,
            sources,
            output,
            pending: BTreeMap::new(),
            pending_rows: 0,
            queue: VecDeque::new(),
        })
    }

    pub fn component(&self) -> &C {
        &self.component
    }

    pub fn output_schema(&self) -> Vec<Field> {
        self.output.clone()
    }

    /// Checks a batch against source `source`'s schema and keeps its rows until their time.
    pub fn push(&mut self, source: u32, batch: Batch) -> Result<(), FlowError> {
        let schema = self.sources.get(source as usize).ok_or_else(|| {
            bad(format!(
                "unknown source index {source}: the flow has {} source(s)",
                self.sources.len()
            ))
        })?;
        validate_batch(&schema.fields, &batch)
            .map_err(|e| bad(format!("source {}: {}", schema.name, message(&e))))?;
        for (values, time, diff) in batch.to_rows(&schema.fields) {
            if diff == 0 {
                continue;
            }
            let row = values.into_iter().map(Datum::from).collect();
            self.pending
                .entry(time)
                .or_default()
                .push((source, row, diff));
            self.pending_rows += 1;
        }
        Ok(())
    }

    /// Hands every pending row up to `now` to the component, asks it for its
    /// changes and returns at most `max_rows` of them. While output from an
    /// earlier tick is still queued, only drains it (so that one tick's
    /// output never holds a row with both signs).
    pub fn tick(&mut self, now: i64, max_rows: u32) -> Result<TickOutput, FlowError> {
        if self.queue.is_empty() {
            self.deliver(now)?;
            let changes = self.component.on_tick(now)?;
            self.enqueue(now, changes)?;
        }
        let n = self.queue.len().min(max_rows as usize);
        let mut rows = Vec::with_capacity(n);
        let mut times = Vec::with_capacity(n);
        let mut diffs = Vec::with_capacity(n);
        for (row, time, diff) in self.queue.drain(..n) {
            rows.push(row.into_iter().map(Value::from).collect::<Vec<_>>());
            times.push(time);
            diffs.push(diff);
        }
        let output = Batch::from_rows(&self.output, &rows, &times, &diffs)
            .map_err(|e| internal(format!("building the output batch: {}", message(&e))))?;
        let next_wakeup = match (self.pending.keys().next(), self.component.next_wakeup()) {
            (Some(a), Some(b)) => Some((*a).min(b)),
            (a, b) => a.copied().or(b),
        };
        Ok(TickOutput {
            output,
            more: !self.queue.is_empty(),
            next_wakeup,
        })
    }

    fn deliver(&mut self, now: i64) -> Result<(), FlowError> {
        let due = match now.checked_add(1) {
            Some(after) => {
                let later = self.pending.split_off(&after);
                std::mem::replace(&mut self.pending, later)
            }
            None => std::mem::take(&mut self.pending),
        };
        let mut run: Vec<InputRow> = Vec::new();
        let mut run_source = 0u32;
        for (time, rows) in due {
            for (source, values, diff) in rows {
                self.pending_rows = self.pending_rows.saturating_sub(1);
                if source != run_source && !run.is_empty() {
                    self.component
                        .on_rows(run_source, std::mem::take(&mut run))?;
                }
                run_source = source;
                run.push((values.into_iter().map(Value::from).collect(), time, diff));
            }
        }
        if !run.is_empty() {
            self.component.on_rows(run_source, run)?;
        }
        Ok(())
    }

    fn enqueue(&mut self, now: i64, changes: Vec<OutputRow>) -> Result<(), FlowError> {
        let mut summed: BTreeMap<Vec<Datum>, i64> = BTreeMap::new();
        for (values, diff) in changes {
            if values.len() != self.output.len() {
                return Err(internal(format!(
                    "on_tick returned a row of {} values; the output schema has {} columns",
                    values.len(),
                    self.output.len()
                )));
            }
            let row: Vec<Datum> = values.into_iter().map(Datum::from).collect();
            let total = summed.entry(row).or_insert(0);
            *total = total.wrapping_add(diff);
        }
        summed.retain(|_, d| *d != 0);
        // Checked as the host will check it, so that a mistake names the component.
        let rows: Vec<Vec<Value>> = summed
            .keys()
            .map(|r| r.iter().cloned().map(Value::from).collect())
            .collect();
        let diffs: Vec<i64> = summed.values().copied().collect();
        Batch::from_rows(&self.output, &rows, &vec![now; rows.len()], &diffs)
            .and_then(|b| validate_batch(&self.output, &b))
            .map_err(|e| {
                internal(format!(
                    "on_tick returned rows that do not fit the output schema: {}",
                    message(&e)
                ))
            })?;
        self.queue
            .extend(summed.into_iter().map(|(row, diff)| (row, now, diff)));
        Ok(())
    }

    /// The component's estimate plus the rows held for it.
    pub fn state_size(&self) -> u64 {
        let held = self.pending_rows + self.queue.len() as u64;
        self.component
            .state_size()
            .saturating_add(held.saturating_mul(64))
    }

    /// `sfsdk\0`, format version, the component's `STATE_VERSION`, a checksum, then the state.
    pub fn snapshot(&self) -> Result<Vec<u8>, FlowError> {
        let snap = SnapshotRef {
            sources: self
                .sources
                .iter()
                .map(|s| (s.name.clone(), s.fields.iter().map(field_repr).collect()))
                .collect(),
            output: self.output.iter().map(field_repr).collect(),
            pending: &self.pending,
            queue: &self.queue,
            component: &self.component,
        };
        let payload = postcard::to_allocvec(&snap)
            .map_err(|e| internal(format!("serialising the component's state: {e}")))?;
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.push(FORMAT);
        out.extend_from_slice(&C::STATE_VERSION.to_le_bytes());
        out.extend_from_slice(&checksum(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        Ok(out)
    }

    pub fn restore(state: &[u8]) -> Result<Self, FlowError> {
        if state.len() < HEADER || &state[..MAGIC.len()] != MAGIC {
            return Err(bad("not a snapshot written by sandflow-sdk"));
        }
        let format = state[MAGIC.len()];
        if format != FORMAT {
            return Err(bad(format!(
                "snapshot format {format}; this build of sandflow-sdk reads format {FORMAT}"
            )));
        }
        let word = |at: usize, n: usize| -> [u8; 8] {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&state[at..at + n]);
            b
        };
        let version = u64::from_le_bytes(word(MAGIC.len() + 1, 4)) as u32;
        if version != C::STATE_VERSION {
            return Err(bad(format!(
                "snapshot of state version {version}; this component reads version {}",
                C::STATE_VERSION
            )));
        }
        let sum = u64::from_le_bytes(word(MAGIC.len() + 5, 8));
        let payload = &state[HEADER..];
        if checksum(payload) != sum {
            return Err(bad("snapshot checksum mismatch: the state is corrupt"));
        }
        let snap: SnapshotOwned<C> = postcard::from_bytes(payload)
            .map_err(|e| bad(format!("snapshot does not decode: {e}")))?;
        let sources = snap
            .sources
            .into_iter()
            .map(|(name, fields)| {
                Ok(SourceSchema {
                    name,
                    fields: fields
                        .into_iter()
                        .map(field_from)
                        .collect::<Result<_, _>>()?,
                })
            })
            .collect::<Result<Vec<_>, FlowError>>()?;
        let output = snap
            .output
            .into_iter()
            .map(field_from)
            .collect::<Result<Vec<_>, _>>()?;
        let pending_rows = snap.pending.values().map(|v| v.len() as u64).sum();
        Ok(Runner {
            component: snap.component,
            sources,
            output,
            pending: snap.pending,
            pending_rows,
            queue: snap.queue,
        })
    }
}

/// An error's message without its kind.
fn message(e: &FlowError) -> &str {
    match e {
        FlowError::BadInput(m)
        | FlowError::Unsupported(m)
        | FlowError::LimitExceeded(m)
        | FlowError::Internal(m) => m,
    }
}

/// The value of option `name` (names compare without case), if given.
pub fn option<'a>(options: &'a [(String, String)], name: &str) -> Option<&'a str> {
    options
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The index of column `name` in `fields` (names compare without case), or
/// a bad-input error listing the columns there are.
pub fn column_index(fields: &[Field], name: &str) -> Result<usize, FlowError> {
    fields
        .iter()
        .position(|f| f.name.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
            bad(format!(
                "no column '{name}'; the columns are {}",
                names.join(", ")
            ))
        })
}

#[cfg(test)]
mod tests;
