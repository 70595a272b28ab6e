//! Top-k per key, exact under deletes: a sandflow user component written
//! with `sandflow-sdk`.
//!
//! It reads one source table and keeps, per key, the multiset of its values
//! (each value with its multiplicity), so a delete or an upsert takes a value
//! out exactly. Its output is `(key, rank, value)`: the k largest values of
//! each key, rank 1 the largest (equal values take one rank each, like
//! `row_number() OVER (PARTITION BY key ORDER BY value DESC)`). On each tick
//! it emits, for the keys that changed, the ranks whose value changed: `-1`
//! for the old row, `+1` for the new one. Rows whose value is NULL are
//! ignored.
//!
//! Options (`CREATE FLOW ... USING COMPONENT topk WITH (...)`):
//! - `key`: the key column (default: the source's first column);
//! - `value`: the value column (default: the first numeric column that is
//!   not the key);
//! - `k`: how many values per key (default 3, at most 10000).
//!
//! The query's plan is not read: only the source's schema and the options.

use std::collections::{BTreeMap, BTreeSet};

use sandflow_sdk::{
    bad, column_index, option, unsupported, Component, DataType, Datum, Field, FlowError, InputRow,
    OutputRow, SourceSchema, Value,
};
use serde::{Deserialize, Serialize};

const DEFAULT_K: usize = 3;
const MAX_K: usize = 10_000;

#[derive(Serialize, Deserialize)]
pub struct TopK {
    k: usize,
    key_column: usize,
    value_column: usize,
    /// Output schema: key name, key type code, key nullable, value name, value type code.
    key: (String, u8, bool),
    value: (String, u8),
    /// key → value → multiplicity (only non-zero multiplicities are kept).
    values: BTreeMap<Datum, BTreeMap<Datum, i64>>,
    /// key → the values last emitted, rank 1 first.
    emitted: BTreeMap<Datum, Vec<Datum>>,
    /// Keys whose values changed since the last tick.
    dirty: BTreeSet<Datum>,
    /// Number of (key, value) entries, for `state_size`.
    entries: u64,
}

impl TopK {
    /// The k largest values of `key` with their multiplicities (positive
    /// multiplicities only), largest first.
    fn top(&self, key: &Datum) -> Vec<Datum> {
        let mut out = Vec::new();
        let Some(values) = self.values.get(key) else {
            return out;
        };
        for (value, n) in values.iter().rev() {
            for _ in 0..(*n).max(0) {
                if out.len() == self.k {
                    return out;
                }
                out.push(value.clone());
            }
        }
        out
    }
}

impl Component for TopK {
    fn create(
        _plan: &[u8],
        sources: &[SourceSchema],
        options: &[(String, String)],
    ) -> Result<Self, FlowError> {
        let [source] = sources else {
            return Err(unsupported(format!(
                "topk reads exactly one source table; the query reads {}",
                sources.len()
            )));
        };
        let fields = &source.fields;
        let key_column = match option(options, "key") {
            Some(name) => column_index(fields, name)?,
            None if fields.is_empty() => return Err(bad("the source has no columns")),
            None => 0,
        };
        let value_column = match option(options, "value") {
            Some(name) => column_index(fields, name)?,
            None => fields
                .iter()
                .enumerate()
                .position(|(i, f)| i != key_column && f.data_type.is_numeric())
                .ok_or_else(|| {
                    bad("no numeric column for the value; name one with WITH (value = '...')")
                })?,
        };
        let k = match option(options, "k") {
            None => DEFAULT_K,
            Some(text) => match text.trim().parse::<usize>() {
                Ok(k) if (1..=MAX_K).contains(&k) => k,
                _ => {
                    return Err(bad(format!(
                        "k must be a whole number from 1 to {MAX_K}, not '{text}'"
                    )))
                }
            },
        };
        let (kf, vf) = (&fields[key_column], &fields[value_column]);
        Ok(TopK {
            k,
            key_column,
            value_column,
            key: (kf.name.clone(), kf.data_type.code(), kf.nullable),
            value: (vf.name.clone(), vf.data_type.code()),
            values: BTreeMap::new(),
            emitted: BTreeMap::new(),
            dirty: BTreeSet::new(),
            entries: 0,
        })
    }

    fn output_schema(&self) -> Vec<Field> {
        let ty = |code| DataType::from_code(code).unwrap_or(DataType::Utf8);
        vec![
            Field::new(self.key.0.clone(), ty(self.key.1), self.key.2),
            Field::new("rank", DataType::Int64, false),
            Field::new(self.value.0.clone(), ty(self.value.1), false),
        ]
    }

    fn on_rows(&mut self, _source: u32, rows: Vec<InputRow>) -> Result<(), FlowError> {
        for (mut values, _time, diff) in rows {
            if values.len() <= self.key_column.max(self.value_column) {
                return Err(bad(format!(
                    "a row of {} values is too short",
                    values.len()
                )));
            }
            let value = Datum::from(std::mem::replace(
                &mut values[self.value_column],
                Value::Null,
            ));
            if value.is_null() {
                continue;
            }
            let key = Datum::from(std::mem::replace(&mut values[self.key_column], Value::Null));
            let per_key = self.values.entry(key.clone()).or_default();
            let n = per_key.entry(value.clone()).or_insert_with(|| {
                self.entries += 1;
                0
            });
            *n = n.saturating_add(diff);
            if *n == 0 {
                per_key.remove(&value);
                self.entries -= 1;
                if per_key.is_empty() {
                    self.values.remove(&key);
                }
            }
            self.dirty.insert(key);
        }
        Ok(())
    }

    fn on_tick(&mut self, _now: i64) -> Result<Vec<OutputRow>, FlowError> {
        let mut out = Vec::new();
        for key in std::mem::take(&mut self.dirty) {
            let new = self.top(&key);
            let old = self.emitted.remove(&key).unwrap_or_default();
            for rank in 0..old.len().max(new.len()) {
                let (was, is) = (old.get(rank), new.get(rank));
                if was == is {
                    continue;
                }
                let row = |v: &Datum| {
                    vec![
                        Value::from(key.clone()),
                        Value::Int(rank as i64 + 1),
                        Value::from(v.clone()),
                    ]
                };
                if let Some(v) = was {
                    out.push((row(v), -1));
                }
                if let Some(v) = is {
                    out.push((row(v), 1));
                }
            }
            if !new.is_empty() {
                self.emitted.insert(key, new);
            }
        }
        Ok(out)
    }

    fn state_size(&self) -> u64 {
        self.entries * 48 + self.emitted.len() as u64 * (48 + 32 * self.k as u64)
    }
}

sandflow_sdk::export!(TopK);

#[cfg(test)]
mod tests;
