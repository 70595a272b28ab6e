//! Test helpers: DataFusion-produced Substrait plans and DataFusion as the reference engine.
#![allow(dead_code)]

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array,
    Int16Array, Int32Array, Int64Array, Int8Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{DataType as A, Field as AField, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use prost::Message;
use sandflow_engine::{DataType, Field, SourceSchema, Value};

pub fn arrow_type(t: DataType) -> A {
    sandflow::flow::arrow::data_type_to_arrow(t)
}

pub fn from_arrow_type(t: &A) -> Option<DataType> {
    sandflow::flow::arrow::data_type_from_arrow(t)
}

pub fn arrow_schema(fields: &[Field]) -> Arc<Schema> {
    Arc::new(Schema::new(
        fields
            .iter()
            .map(|f| AField::new(&f.name, arrow_type(f.data_type), f.nullable))
            .collect::<Vec<_>>(),
    ))
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
}

pub fn context(tables: &[SourceSchema], rows: &[Vec<Vec<Value>>]) -> SessionContext {
    let ctx = SessionContext::new();
    for (i, t) in tables.iter().enumerate() {
        let schema = arrow_schema(&t.fields);
        let data = rows.get(i).cloned().unwrap_or_default();
        let batch = to_record_batch(&t.fields, &data, schema.clone());
        let mem = MemTable::try_new(schema, vec![vec![batch]]).expect("memtable");
        ctx.register_table(t.name.as_str(), Arc::new(mem))
            .expect("register");
    }
    ctx
}

/// A column of DataFusion's plan schema: name, type (None if not a sandflow type), nullable.
pub type PlanField = (String, Option<DataType>, bool);

/// Substrait plan bytes for `sql`, as the host produces them, plus DataFusion's output schema.
pub fn plan(
    rt: &tokio::runtime::Runtime,
    sql: &str,
    tables: &[SourceSchema],
    optimized: bool,
) -> Result<(Vec<u8>, Vec<PlanField>), String> {
    let ctx = context(tables, &[]);
    rt.block_on(async {
        let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
        let lp = if optimized {
            df.into_optimized_plan().map_err(|e| e.to_string())?
        } else {
            df.logical_plan().clone()
        };
        let schema = lp
            .schema()
            .fields()
            .iter()
            .map(|f| {
                (
                    f.name().clone(),
                    from_arrow_type(f.data_type()),
                    f.is_nullable(),
                )
            })
            .collect();
        let p = datafusion_substrait::logical_plan::producer::to_substrait_plan(&lp, &ctx.state())
            .map_err(|e| e.to_string())?;
        Ok((p.encode_to_vec(), schema))
    })
}

pub fn to_record_batch(fields: &[Field], rows: &[Vec<Value>], schema: Arc<Schema>) -> RecordBatch {
    let cols: Vec<ArrayRef> = fields
        .iter()
        .enumerate()
        .map(|(ci, f)| {
            let vals = rows.iter().map(move |r| r[ci].clone());
            let int = |v: Value| match v {
                Value::Int(i) => Some(i),
                Value::UInt(u) => Some(u as i64),
                Value::Bool(b) => Some(b as i64),
                _ => None,
            };
            let arr: ArrayRef = match f.data_type {
                DataType::List(_) => sandflow_tests::engine::record_batch(
                    std::slice::from_ref(f),
                    &vals.map(|v| vec![v]).collect::<Vec<_>>(),
                )
                .column(0)
                .clone(),
                DataType::Boolean => Arc::new(BooleanArray::from(
                    vals.map(|v| match v {
                        Value::Bool(b) => Some(b),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                )),
                DataType::Int8 => Arc::new(Int8Array::from(
                    vals.map(|v| int(v).map(|x| x as i8)).collect::<Vec<_>>(),
                )),
                DataType::Int16 => Arc::new(Int16Array::from(
                    vals.map(|v| int(v).map(|x| x as i16)).collect::<Vec<_>>(),
                )),
                DataType::Int32 => Arc::new(Int32Array::from(
                    vals.map(|v| int(v).map(|x| x as i32)).collect::<Vec<_>>(),
                )),
                DataType::Int64 => Arc::new(Int64Array::from(vals.map(int).collect::<Vec<_>>())),
                DataType::UInt8 => Arc::new(UInt8Array::from(
                    vals.map(|v| int(v).map(|x| x as u8)).collect::<Vec<_>>(),
                )),
                DataType::UInt16 => Arc::new(UInt16Array::from(
                    vals.map(|v| int(v).map(|x| x as u16)).collect::<Vec<_>>(),
                )),
                DataType::UInt32 => Arc::new(UInt32Array::from(
                    vals.map(|v| int(v).map(|x| x as u32)).collect::<Vec<_>>(),
                )),
                DataType::UInt64 => Arc::new(UInt64Array::from(
                    vals.map(|v| int(v).map(|x| x as u64)).collect::<Vec<_>>(),
                )),
                DataType::Float32 => Arc::new(Float32Array::from(
                    vals.map(|v| match v {
                        Value::Float(x) => Some(x as f32),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                )),
                DataType::Float64 => Arc::new(Float64Array::from(
                    vals.map(|v| match v {
                        Value::Float(x) => Some(x),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                )),
                DataType::Utf8 => Arc::new(StringArray::from(
                    vals.map(|v| match v {
                        Value::Str(s) => Some(s),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
                )),
                DataType::Binary => {
                    let v: Vec<Option<Vec<u8>>> = vals
                        .map(|v| match v {
                            Value::Bytes(b) => Some(b),
                            _ => None,
                        })
                        .collect();
                    Arc::new(BinaryArray::from(
                        v.iter().map(|x| x.as_deref()).collect::<Vec<_>>(),
                    ))
                }
                DataType::TimestampSecond => Arc::new(TimestampSecondArray::from(
                    vals.map(int).collect::<Vec<_>>(),
                )),
                DataType::TimestampMillisecond => Arc::new(TimestampMillisecondArray::from(
                    vals.map(int).collect::<Vec<_>>(),
                )),
                DataType::TimestampMicrosecond => Arc::new(TimestampMicrosecondArray::from(
                    vals.map(int).collect::<Vec<_>>(),
                )),
                DataType::TimestampNanosecond => Arc::new(TimestampNanosecondArray::from(
                    vals.map(int).collect::<Vec<_>>(),
                )),
                DataType::Date32 => Arc::new(Date32Array::from(
                    vals.map(|v| int(v).map(|x| x as i32)).collect::<Vec<_>>(),
                )),
            };
            arr
        })
        .collect();
    if rows.is_empty() {
        return RecordBatch::new_empty(schema);
    }
    RecordBatch::try_new(schema, cols).expect("record batch")
}

pub fn arrow_value(a: &dyn Array, i: usize) -> Value {
    sandflow_tests::engine::value_of(a, i)
}

/// Runs `sql` in DataFusion over the given table contents.
pub fn run_sql(
    rt: &tokio::runtime::Runtime,
    sql: &str,
    tables: &[SourceSchema],
    rows: &[Vec<Vec<Value>>],
) -> Result<Vec<Vec<Value>>, String> {
    let ctx = context(tables, rows);
    rt.block_on(async {
        let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
        let batches = df.collect().await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for b in batches {
            for i in 0..b.num_rows() {
                out.push(
                    b.columns()
                        .iter()
                        .map(|c| arrow_value(c.as_ref(), i))
                        .collect(),
                );
            }
        }
        Ok(out)
    })
}

fn close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Float(x), Value::Float(y)) => {
            x == y
                || (x.is_nan() && y.is_nan())
                || (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1.0)
        }
        _ => a == b,
    }
}

/// Multiset equality with a float tolerance.
pub fn same_multiset(expected: &[Vec<Value>], actual: &[Vec<Value>]) -> bool {
    if expected.len() != actual.len() {
        return false;
    }
    let mut used = vec![false; actual.len()];
    'outer: for e in expected {
        for (j, a) in actual.iter().enumerate() {
            if !used[j] && a.len() == e.len() && a.iter().zip(e.iter()).all(|(x, y)| close(x, y)) {
                used[j] = true;
                continue 'outer;
            }
        }
        return false;
    }
    true
}

/// Accumulates a flow's output deltas into the current result (a multiset of rows).
#[derive(Default, Debug)]
pub struct Sink {
    pub rows: Vec<(Vec<Value>, i64)>,
}

impl Sink {
    pub fn apply(&mut self, deltas: Vec<(Vec<Value>, i64, i64)>) {
        for (row, _t, d) in deltas {
            let key = format!("{row:?}");
            if let Some(e) = self.rows.iter_mut().find(|(r, _)| format!("{r:?}") == key) {
                e.1 += d;
            } else {
                self.rows.push((row, d));
            }
        }
        self.rows.retain(|(_, c)| *c != 0);
    }
    pub fn contents(&self) -> Vec<Vec<Value>> {
        let mut out = Vec::new();
        for (r, c) in &self.rows {
            assert!(*c > 0, "negative multiplicity {c} for {r:?}");
            for _ in 0..*c {
                out.push(r.clone());
            }
        }
        out
    }
}
