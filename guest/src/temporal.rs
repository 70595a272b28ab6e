//! Temporal filters: `WHERE ts > now() - INTERVAL '5 minutes'` (also `>=`, `<`, `<=`, and
//! several at once, as BETWEEN gives), with now() the tick time the host passes in. The
//! engine still reads no clock.
//!
//! Each condition `x op now() + offset` holds, for a given row, while the tick time is in an
//! interval: `x > now() + o` until `x - o`, `x < now() + o` from just after `x - o`. A row
//! passes while the tick time is in every condition's interval, `[lo, hi)` in milliseconds.
//! A change `(row, diff)` arriving at tick `t` therefore means: `(row, diff)` at `max(t, lo)`
//! and `(row, -diff)` at `hi` (nothing if `t >= hi`). What is due now passes at once; the
//! rest waits in a schedule keyed by tick time, consolidated per row (a delete cancels the
//! pending retraction of its insert), and is emitted by the first tick at or after its time.
//! The earliest scheduled time is the flow's `next-wakeup`, so the host ticks then and the
//! result is exact at every tick. A row leaves the schedule once emitted: the state is
//! bounded by the rows that are, or will be, inside their window.

use std::borrow::Cow;
use std::collections::BTreeMap;

use crate::agg::{check_key, encode_row};
use crate::codec::{Reader, Writer};
use crate::column::{take_chunk, Chunk, ColBuilder, Diffs};
use crate::expr::{Cmp, Expr};
use crate::hash::FxHashMap;
use crate::join::decode_into;
use crate::types::{bad, Column, DataType, FlowError};

/// One condition: `x op trunc(now()) + offset_ns`, where `trunc` rounds down to a multiple of
/// `trunc_ns` since the epoch (1: now() itself).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Bound {
    pub x: Expr,
    pub op: Cmp,
    pub offset_ns: i64,
    pub trunc_ns: i64,
}

pub(crate) struct TemporalOp {
    bounds: Vec<Bound>,
    types: Vec<DataType>,
    /// Tick time (ms) → encoded row → diff due then.
    schedule: BTreeMap<i64, FxHashMap<Vec<u8>, i64>>,
    bytes: usize,
}

const NS_PER_MS: i128 = 1_000_000;

fn clamp(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

impl TemporalOp {
    pub fn new(bounds: Vec<Bound>, types: Vec<DataType>) -> TemporalOp {
        TemporalOp {
            bounds,
            types,
            schedule: BTreeMap::new(),
            bytes: 0,
        }
    }

    /// The tick times `[lo, hi)` during which each row passes; None for a row that never
    /// does (a NULL time).
    fn windows(&self, c: &Chunk) -> Result<Vec<Option<(i64, i64)>>, FlowError> {
        let mut out = vec![Some((i64::MIN, i64::MAX)); c.rows];
        for b in &self.bounds {
            let v = b.x.eval(c)?;
            let unit = b.x.ty().timestamp_unit_nanos().unwrap_or(1) as i128;
            for (i, w) in out.iter_mut().enumerate() {
                let Some((lo, hi)) = w else { continue };
                if v.is_null(i) {
                    *w = None;
                    continue;
                }
                let x = v.ints.get(i).copied().unwrap_or(0) as i128 * unit;
                // x op trunc(now) + offset  <=>  trunc(now) op t. With u the truncation,
                // trunc(now) < t while now < ceil_u(t); trunc(now) <= t while now <
                // floor_u(t) + u. Then now in ms: now_ns < b  <=>  now < ceil(b / 1 ms), and
                // now_ns >= b  <=>  now >= ceil(b / 1 ms).
                let t = x - b.offset_ns as i128;
                let u = i128::from(b.trunc_ns.max(1));
                let floor = t.div_euclid(u) * u;
                let ceil = floor + if t.rem_euclid(u) != 0 { u } else { 0 };
                let ms = |b: i128| {
                    clamp(b.div_euclid(NS_PER_MS) + (b.rem_euclid(NS_PER_MS) != 0) as i128)
                };
                match b.op {
                    // trunc(now) < t
                    Cmp::Gt => *hi = (*hi).min(ms(ceil)),
                    // trunc(now) <= t
                    Cmp::Ge => *hi = (*hi).min(ms(floor + u)),
                    // trunc(now) > t
                    Cmp::Lt => *lo = (*lo).max(ms(floor + u)),
                    // trunc(now) >= t
                    Cmp::Le => *lo = (*lo).max(ms(ceil)),
                    _ => {}
                }
            }
        }
        Ok(out)
    }

    fn schedule(&mut self, at: i64, row: &[u8], diff: i64) {
        let slot = self.schedule.entry(at).or_default();
        match slot.get_mut(row) {
            Some(d) => {
                *d = d.wrapping_add(diff);
                if *d == 0 {
                    slot.remove(row);
                    self.bytes = self.bytes.saturating_sub(row.len() + 32);
                }
            }
            None => {
                slot.insert(row.to_vec(), diff);
                self.bytes += row.len() + 32;
            }
        }
        if slot.is_empty() {
            self.schedule.remove(&at);
        }
    }

    /// Takes a change at tick `now`: returns the rows that pass now, schedules the rest.
    pub fn absorb(&mut self, c: &Chunk, now: i64) -> Result<Chunk, FlowError> {
        let windows = self.windows(c)?;
        let cols: Vec<Cow<'_, Column>> = c.cols.iter().map(Cow::Borrowed).collect();
        let mut pass = Vec::new();
        let mut buf = Vec::new();
        for (i, w) in windows.iter().enumerate() {
            let Some((lo, hi)) = *w else { continue };
            if lo >= hi || now >= hi {
                continue;
            }
            let d = c.diffs.get(i);
            if now >= lo {
                pass.push(i as u32);
            }
            if now < lo || hi != i64::MAX {
                buf.clear();
                encode_row(&mut buf, &cols, &self.types, i);
                if now < lo {
                    self.schedule(lo, &buf, d);
                }
                if hi != i64::MAX {
                    self.schedule(hi, &buf, d.wrapping_neg());
                }
            }
        }
        Ok(if pass.len() == c.rows {
            c.clone()
        } else {
            take_chunk(c, &self.types, &pass)
        })
    }

    /// The scheduled changes due at or before `now`.
    pub fn flush(&mut self, now: i64) -> Chunk {
        let mut builders: Vec<ColBuilder> =
            self.types.iter().map(|t| ColBuilder::new(*t, 0)).collect();
        let mut diffs = Vec::new();
        while let Some(entry) = self.schedule.first_entry() {
            if *entry.key() > now {
                break;
            }
            let rows = entry.remove();
            for (row, d) in rows {
                decode_into(&row, &self.types, &mut builders);
                diffs.push(d);
                self.bytes = self.bytes.saturating_sub(row.len() + 32);
            }
        }
        Chunk {
            rows: diffs.len(),
            cols: builders.into_iter().map(|b| b.finish()).collect(),
            diffs: Diffs::Each(diffs),
        }
    }

    /// When the next scheduled change is due.
    pub fn next_wakeup(&self) -> Option<i64> {
        self.schedule.keys().next().copied()
    }

    pub fn state_size(&self) -> usize {
        self.bytes
    }

    pub fn write(&self, w: &mut Writer) {
        let n: usize = self.schedule.values().map(|m| m.len()).sum();
        w.u64(n as u64);
        for (at, rows) in &self.schedule {
            // Sorted, so that equal states write equal bytes.
            let mut rows: Vec<_> = rows.iter().collect();
            rows.sort();
            for (row, d) in rows {
                w.i64(*at);
                w.bytes(row);
                w.i64(*d);
            }
        }
    }

    pub fn read(&mut self, r: &mut Reader<'_>) -> Result<(), FlowError> {
        let n = r.len(8 + 8 + 8)?;
        let nullable = vec![true; self.types.len()];
        self.schedule.clear();
        self.bytes = 0;
        for _ in 0..n {
            let at = r.i64()?;
            let row = r.bytes()?;
            let d = r.i64()?;
            check_key(row, &self.types, &nullable)
                .map_err(|m| bad(format!("snapshot: temporal filter: {m}")))?;
            self.schedule(at, row, d);
        }
        Ok(())
    }
}
