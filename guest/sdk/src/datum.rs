//! [`Datum`]: a [`Value`] that serde can store and that orders totally, for
//! state keyed or sorted by values (group keys, ordered multisets).

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

use crate::Value;

/// A value with a total order: NULL first, then by kind (bool, int, uint,
/// float, string, bytes, list), then by value (lists element by element); floats by `f64::total_cmp` (so NaN
/// is a value like any other and `-0.0 < 0.0`). Converts to and from
/// [`Value`] without loss.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Datum {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Datum>),
}

impl Datum {
    fn rank(&self) -> u8 {
        match self {
            Datum::Null => 0,
            Datum::Bool(_) => 1,
            Datum::Int(_) => 2,
            Datum::UInt(_) => 3,
            Datum::Float(_) => 4,
            Datum::Str(_) => 5,
            Datum::Bytes(_) => 6,
            Datum::List(_) => 7,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Datum::Null)
    }
}

impl Ord for Datum {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Datum::Bool(a), Datum::Bool(b)) => a.cmp(b),
            (Datum::Int(a), Datum::Int(b)) => a.cmp(b),
            (Datum::UInt(a), Datum::UInt(b)) => a.cmp(b),
            (Datum::Float(a), Datum::Float(b)) => a.total_cmp(b),
            (Datum::Str(a), Datum::Str(b)) => a.cmp(b),
            (Datum::Bytes(a), Datum::Bytes(b)) => a.cmp(b),
            (Datum::List(a), Datum::List(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

impl PartialOrd for Datum {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Datum {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Datum {}

impl From<Value> for Datum {
    fn from(v: Value) -> Datum {
        match v {
            Value::Null => Datum::Null,
            Value::Bool(b) => Datum::Bool(b),
            Value::Int(i) => Datum::Int(i),
            Value::UInt(u) => Datum::UInt(u),
            Value::Float(f) => Datum::Float(f),
            Value::Str(s) => Datum::Str(s),
            Value::Bytes(b) => Datum::Bytes(b),
            Value::List(items) => Datum::List(items.into_iter().map(Datum::from).collect()),
        }
    }
}

impl From<Datum> for Value {
    fn from(d: Datum) -> Value {
        match d {
            Datum::Null => Value::Null,
            Datum::Bool(b) => Value::Bool(b),
            Datum::Int(i) => Value::Int(i),
            Datum::UInt(u) => Value::UInt(u),
            Datum::Float(f) => Value::Float(f),
            Datum::Str(s) => Value::Str(s),
            Datum::Bytes(b) => Value::Bytes(b),
            Datum::List(items) => Value::List(items.into_iter().map(Value::from).collect()),
        }
    }
}
