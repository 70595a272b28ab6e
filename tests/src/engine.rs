//! Harness for engine tests: plans from SQL (DataFusion → Substrait), a
//! DataFusion oracle over the current source contents, random diff streams,
//! and one interface over the native engine and the engine inside wasm.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use datafusion::arrow::array::{
    Array, ArrayRef, BinaryArray, BooleanArray, Date32Array, Float32Array, Float64Array,
    Int16Array, Int32Array, Int64Array, Int8Array, RecordBatch, StringArray,
    TimestampMicrosecondArray, TimestampMillisecondArray, TimestampNanosecondArray,
    TimestampSecondArray, UInt16Array, UInt32Array, UInt64Array, UInt8Array,
};
use datafusion::arrow::datatypes::{DataType as ArrowType, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use prost::Message;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sandflow::runtime::{Digest, FlowInstance, FlowLimits, RuntimeConfig, RuntimeError, Sandbox};
use sandflow_engine::types::{Batch, DataType, Field, SourceSchema, TickOutput, Value};

/// A tokio runtime for DataFusion calls from synchronous tests.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
    .block_on(f)
}

/// A sandbox with one component registered: what tests and benchmarks
/// instantiate flows from.
pub struct Runtime {
    pub sandbox: Sandbox,
    pub component: Digest,
}

impl Runtime {
    /// sandflow's own engine (embedded in the `sandflow` crate).
    pub fn engine(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        Runtime::with_component(config, sandflow::engine::component())
    }

    /// Another component, e.g. the hostile guest.
    pub fn with_component(config: RuntimeConfig, bytes: &[u8]) -> Result<Runtime, RuntimeError> {
        let sandbox = Sandbox::new(config)?;
        let component = sandbox.register(bytes)?;
        Ok(Runtime { sandbox, component })
    }

    pub fn create_flow(
        &self,
        plan: &[u8],
        sources: &[SourceSchema],
        options: &[(String, String)],
        limits: FlowLimits,
    ) -> Result<FlowInstance, RuntimeError> {
        self.sandbox
            .create_flow(&self.component, plan, sources, options, limits)
    }

    pub fn restore_flow(
        &self,
        state: &[u8],
        limits: FlowLimits,
    ) -> Result<FlowInstance, RuntimeError> {
        self.sandbox.restore_flow(&self.component, state, limits)
    }
}

/// The reference workload's input (DESIGN.md, "Measuring"): `rows` rows of
/// two Int64 columns `(k, v)` with `k = i % keys` and `v = i`, in batches of
/// `batch` rows, each with one time (its number) and one diff (+1) for all
/// its rows, the form the host's write path sends.
pub fn reference_batches(rows: usize, batch: usize, keys: i64) -> Vec<Batch> {
    (0..rows / batch)
        .map(|b| {
            let start = (b * batch) as i64;
            let ks: Vec<i64> = (start..start + batch as i64).map(|i| i % keys).collect();
            let vs: Vec<i64> = (start..start + batch as i64).collect();
            let col = |ints| sandflow_engine::types::Column {
                ints,
                floats: vec![],
                bytes: vec![],
                offsets: vec![],
                nulls: vec![],
            };
            Batch {
                rows: batch as u32,
                columns: vec![col(ks), col(vs)],
                times: vec![b as i64],
                diffs: vec![1],
            }
        })
        .collect()
}

/// The reference workload's source: `t (k BIGINT, v BIGINT)`.
pub fn reference_sources() -> Vec<SourceSchema> {
    vec![SourceSchema {
        name: "t".into(),
        fields: vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, false),
        ],
    }]
}

/// An example component that `make examples` built (`guest/sdk/examples/`):
/// the file named in `$<env>` if set, else `wasm32-wasip2/release/<file>`
/// under `$CARGO_TARGET_DIR`, else under the target directory of the running
/// test or bench binary (`target/<profile>/deps/<binary>`).
pub fn example_component(file: &str, env: &str) -> Vec<u8> {
    let path = match std::env::var_os(env) {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let target = match std::env::var_os("CARGO_TARGET_DIR") {
                Some(dir) => std::path::PathBuf::from(dir),
                None => {
                    let exe = std::env::current_exe().expect("current_exe");
                    exe.ancestors()
                        .nth(3)
                        .expect("the binary lives in target/<profile>/deps")
                        .to_path_buf()
                }
            };
            target.join("wasm32-wasip2/release").join(file)
        }
    };
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read the example component {}: {e}; build it with `make examples` \
             (or set {env})",
            path.display()
        )
    })
}

/// The Rust SDK's top-k example (`guest/sdk/examples/topk`).
pub fn topk_component() -> Vec<u8> {
    example_component("sandflow_example_topk.wasm", "SANDFLOW_TOPK_WASM")
}

/// The Python anomaly example (`guest/sdk/examples/anomaly-py`), built with
/// componentize-py.
pub fn anomaly_component() -> Vec<u8> {
    example_component("sandflow_example_anomaly.wasm", "SANDFLOW_ANOMALY_WASM")
}

/// One wasm runtime per test process (compiling the guest takes a moment).
pub fn wasm_runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let cache = std::env::temp_dir().join("sandflow-test-guest-cache");
        Runtime::engine(RuntimeConfig {
            cache_dir: Some(cache),
            ..RuntimeConfig::default()
        })
        .expect("wasm runtime with the embedded guest")
    })
}

pub use sandflow::flow::arrow::{
    data_type_to_arrow as arrow_type, schema_from_fields as arrow_schema,
};

/// Builds an Arrow record batch from rows of values.
pub fn record_batch(fields: &[Field], rows: &[Vec<Value>]) -> RecordBatch {
    let col = |i: usize| rows.iter().map(move |r| &r[i]);
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        Value::UInt(u) => Some(*u as i64),
        Value::Bool(b) => Some(*b as i64),
        _ => None,
    };
    let arrays: Vec<ArrayRef> = fields
        .iter()
        .enumerate()
        .map(|(i, f)| -> ArrayRef {
            match f.data_type {
                DataType::List(_) => {
                    let one = [f.clone()];
                    let rows: Vec<Vec<Value>> = col(i).map(|v| vec![v.clone()]).collect();
                    let n = rows.len();
                    let b = Batch::from_rows(&one, &rows, &vec![0; n], &vec![1; n])
                        .expect("list values fit their column");
                    sandflow::flow::arrow::column_to_arrow(&b.columns[0], f.data_type, n)
                        .expect("a list column")
                }
                DataType::Boolean => Arc::new(
                    col(i)
                        .map(|v| {
                            if let Value::Bool(b) = v {
                                Some(*b)
                            } else {
                                None
                            }
                        })
                        .collect::<BooleanArray>(),
                ),
                DataType::Int8 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as i8))
                        .collect::<Int8Array>(),
                ),
                DataType::Int16 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as i16))
                        .collect::<Int16Array>(),
                ),
                DataType::Int32 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as i32))
                        .collect::<Int32Array>(),
                ),
                DataType::Int64 => Arc::new(col(i).map(int).collect::<Int64Array>()),
                DataType::UInt8 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as u8))
                        .collect::<UInt8Array>(),
                ),
                DataType::UInt16 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as u16))
                        .collect::<UInt16Array>(),
                ),
                DataType::UInt32 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as u32))
                        .collect::<UInt32Array>(),
                ),
                DataType::UInt64 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as u64))
                        .collect::<UInt64Array>(),
                ),
                DataType::Float32 => Arc::new(
                    col(i)
                        .map(|v| {
                            if let Value::Float(x) = v {
                                Some(*x as f32)
                            } else {
                                None
                            }
                        })
                        .collect::<Float32Array>(),
                ),
                DataType::Float64 => Arc::new(
                    col(i)
                        .map(|v| {
                            if let Value::Float(x) = v {
                                Some(*x)
                            } else {
                                None
                            }
                        })
                        .collect::<Float64Array>(),
                ),
                DataType::Utf8 => Arc::new(
                    col(i)
                        .map(|v| {
                            if let Value::Str(s) = v {
                                Some(s.as_str())
                            } else {
                                None
                            }
                        })
                        .collect::<StringArray>(),
                ),
                DataType::Binary => Arc::new(
                    col(i)
                        .map(|v| {
                            if let Value::Bytes(b) = v {
                                Some(b.as_slice())
                            } else {
                                None
                            }
                        })
                        .collect::<BinaryArray>(),
                ),
                DataType::TimestampSecond => {
                    Arc::new(col(i).map(int).collect::<TimestampSecondArray>())
                }
                DataType::TimestampMillisecond => {
                    Arc::new(col(i).map(int).collect::<TimestampMillisecondArray>())
                }
                DataType::TimestampMicrosecond => {
                    Arc::new(col(i).map(int).collect::<TimestampMicrosecondArray>())
                }
                DataType::TimestampNanosecond => {
                    Arc::new(col(i).map(int).collect::<TimestampNanosecondArray>())
                }
                DataType::Date32 => Arc::new(
                    col(i)
                        .map(|v| int(v).map(|x| x as i32))
                        .collect::<Date32Array>(),
                ),
            }
        })
        .collect();
    RecordBatch::try_new(arrow_schema(fields), arrays).expect("record batch from rows")
}

/// Reads every row of Arrow batches as values, typed like `Batch::to_rows`.
pub fn rows_of(batches: &[RecordBatch]) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            out.push(
                b.columns()
                    .iter()
                    .map(|c| value_of(c.as_ref(), r))
                    .collect(),
            );
        }
    }
    out
}

/// Row `i` of an Arrow array as a value, typed like `Batch::to_rows`.
pub fn value_of(a: &dyn Array, i: usize) -> Value {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes as t;
    if a.is_null(i) {
        return Value::Null;
    }
    match a.data_type() {
        ArrowType::Boolean => Value::Bool(a.as_boolean().value(i)),
        ArrowType::Int8 => Value::Int(a.as_primitive::<t::Int8Type>().value(i) as i64),
        ArrowType::Int16 => Value::Int(a.as_primitive::<t::Int16Type>().value(i) as i64),
        ArrowType::Int32 => Value::Int(a.as_primitive::<t::Int32Type>().value(i) as i64),
        ArrowType::Int64 => Value::Int(a.as_primitive::<t::Int64Type>().value(i)),
        ArrowType::UInt8 => Value::UInt(a.as_primitive::<t::UInt8Type>().value(i) as u64),
        ArrowType::UInt16 => Value::UInt(a.as_primitive::<t::UInt16Type>().value(i) as u64),
        ArrowType::UInt32 => Value::UInt(a.as_primitive::<t::UInt32Type>().value(i) as u64),
        ArrowType::UInt64 => Value::UInt(a.as_primitive::<t::UInt64Type>().value(i)),
        ArrowType::Float32 => Value::Float(a.as_primitive::<t::Float32Type>().value(i) as f64),
        ArrowType::Float64 => Value::Float(a.as_primitive::<t::Float64Type>().value(i)),
        ArrowType::Utf8 => Value::Str(a.as_string::<i32>().value(i).to_string()),
        ArrowType::LargeUtf8 => Value::Str(a.as_string::<i64>().value(i).to_string()),
        ArrowType::Utf8View => Value::Str(a.as_string_view().value(i).to_string()),
        ArrowType::Binary => Value::Bytes(a.as_binary::<i32>().value(i).to_vec()),
        ArrowType::BinaryView => Value::Bytes(a.as_binary_view().value(i).to_vec()),
        ArrowType::Timestamp(TimeUnit::Second, _) => {
            Value::Int(a.as_primitive::<t::TimestampSecondType>().value(i))
        }
        ArrowType::Timestamp(TimeUnit::Millisecond, _) => {
            Value::Int(a.as_primitive::<t::TimestampMillisecondType>().value(i))
        }
        ArrowType::Timestamp(TimeUnit::Microsecond, _) => {
            Value::Int(a.as_primitive::<t::TimestampMicrosecondType>().value(i))
        }
        ArrowType::Timestamp(TimeUnit::Nanosecond, _) => {
            Value::Int(a.as_primitive::<t::TimestampNanosecondType>().value(i))
        }
        ArrowType::Date32 => Value::Int(a.as_primitive::<t::Date32Type>().value(i) as i64),
        ArrowType::List(_) => {
            let items = a.as_list::<i32>().value(i);
            Value::List(
                (0..items.len())
                    .map(|j| value_of(items.as_ref(), j))
                    .collect(),
            )
        }
        other => panic!("oracle returned a type the harness does not read: {other}"),
    }
}

/// A DataFusion context with one in-memory table per source.
pub fn context(sources: &[SourceSchema], contents: &[Vec<Vec<Value>>]) -> SessionContext {
    let ctx = SessionContext::new();
    for (s, rows) in sources.iter().zip(contents) {
        let batch = record_batch(&s.fields, rows);
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]]).expect("mem table");
        ctx.register_table(s.name.as_str(), Arc::new(table))
            .expect("register table");
    }
    ctx
}

/// Compiles SQL over `sources` to Substrait plan bytes, the way the host does.
pub fn plan(sql: &str, sources: &[SourceSchema]) -> Vec<u8> {
    let empty: Vec<Vec<Vec<Value>>> = sources.iter().map(|_| Vec::new()).collect();
    let ctx = context(sources, &empty);
    block_on(async {
        let df = ctx
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("plan {sql}: {e}"));
        let plan = df.into_optimized_plan().expect("optimized plan");
        let substrait =
            datafusion_substrait::logical_plan::producer::to_substrait_plan(&plan, &ctx.state())
                .unwrap_or_else(|e| panic!("substrait for {sql}: {e}"));
        substrait.encode_to_vec()
    })
}

/// Runs `sql` with DataFusion over the given source contents.
pub fn oracle(
    sql: &str,
    sources: &[SourceSchema],
    contents: &[Vec<Vec<Value>>],
) -> Vec<Vec<Value>> {
    let ctx = context(sources, contents);
    block_on(async {
        let df = ctx
            .sql(sql)
            .await
            .unwrap_or_else(|e| panic!("oracle {sql}: {e}"));
        rows_of(
            &df.collect()
                .await
                .unwrap_or_else(|e| panic!("oracle run {sql}: {e}")),
        )
    })
}

/// A total order key for a row, so result sets compare as multisets.
/// Floats are rounded to 9 significant digits to absorb summation order.
pub fn row_key(row: &[Value]) -> String {
    row.iter()
        .map(|v| match v {
            Value::Float(x) if x.is_finite() && *x != 0.0 => format!("F{:.8e}", x),
            Value::Float(x) => format!("F{x}"),
            other => format!("{other:?}"),
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// A multiset of rows: key → (row, count).
pub type Multiset = BTreeMap<String, (Vec<Value>, i64)>;

pub fn multiset(rows: impl IntoIterator<Item = (Vec<Value>, i64)>) -> Multiset {
    let mut m = Multiset::new();
    for (row, diff) in rows {
        let e = m.entry(row_key(&row)).or_insert((row, 0));
        e.1 += diff;
    }
    m.retain(|_, (_, n)| *n != 0);
    m
}

/// An engine under test: the native library or the guest in wasm.
pub trait Engine {
    fn push(&mut self, source: u32, batch: Batch);
    fn tick(&mut self, now: i64) -> TickOutput;
    fn snapshot(&mut self) -> Vec<u8>;
    fn output_schema(&self) -> Vec<Field>;
}

pub struct Native(pub sandflow_engine::Flow);

impl Native {
    pub fn create(
        plan: &[u8],
        sources: &[SourceSchema],
    ) -> Result<Native, sandflow_engine::types::FlowError> {
        sandflow_engine::Flow::create(plan, sources.to_vec(), vec![]).map(Native)
    }
    pub fn restore(state: &[u8]) -> Native {
        Native(sandflow_engine::Flow::restore(state).expect("native restore"))
    }
}

impl Engine for Native {
    fn push(&mut self, source: u32, batch: Batch) {
        self.0.push(source, batch).expect("native push");
    }
    fn tick(&mut self, now: i64) -> TickOutput {
        self.0.tick(now, u32::MAX).expect("native tick")
    }
    fn snapshot(&mut self) -> Vec<u8> {
        self.0.snapshot().expect("native snapshot")
    }
    fn output_schema(&self) -> Vec<Field> {
        self.0.output_schema()
    }
}

pub struct Wasm(pub FlowInstance);

pub fn test_limits() -> FlowLimits {
    FlowLimits {
        max_output_rows: u32::MAX,
        ..FlowLimits::default()
    }
}

impl Wasm {
    pub fn create(plan: &[u8], sources: &[SourceSchema]) -> Wasm {
        Wasm(
            wasm_runtime()
                .create_flow(plan, sources, &[], test_limits())
                .expect("wasm create"),
        )
    }
    pub fn restore(state: &[u8]) -> Wasm {
        Wasm(
            wasm_runtime()
                .restore_flow(state, test_limits())
                .expect("wasm restore"),
        )
    }
}

impl Engine for Wasm {
    fn push(&mut self, source: u32, batch: Batch) {
        self.0.push(source, batch).expect("wasm push");
    }
    fn tick(&mut self, now: i64) -> TickOutput {
        self.0.tick(now).expect("wasm tick")
    }
    fn snapshot(&mut self) -> Vec<u8> {
        self.0.snapshot().expect("wasm snapshot")
    }
    fn output_schema(&self) -> Vec<Field> {
        self.0.output_schema().to_vec()
    }
}

/// Random source rows for a schema: small domains so that keys repeat and
/// retractions hit existing groups; NULLs in nullable columns.
pub fn random_row(rng: &mut StdRng, fields: &[Field]) -> Vec<Value> {
    fields
        .iter()
        .map(|f| {
            if f.nullable && rng.random_range(0..8) == 0 {
                return Value::Null;
            }
            match f.data_type {
                DataType::Boolean => Value::Bool(rng.random()),
                DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => {
                    Value::Int(rng.random_range(-20..50))
                }
                DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => {
                    Value::UInt(rng.random_range(0..50))
                }
                DataType::Float32 | DataType::Float64 => {
                    Value::Float((rng.random_range(-1000..1000) as f64) / 8.0)
                }
                DataType::Utf8 => {
                    let words = [
                        "alpha", "beta", "gamma", "Delta", "eps_1", "zeta%", "", "éta",
                    ];
                    Value::Str(words[rng.random_range(0..words.len())].to_string())
                }
                DataType::Binary => {
                    Value::Bytes(vec![rng.random_range(0..4u8); rng.random_range(0..3)])
                }
                DataType::TimestampSecond => Value::Int(1_700_000_000 + rng.random_range(0..600)),
                DataType::TimestampMillisecond => {
                    Value::Int(1_700_000_000_000 + rng.random_range(0..600_000))
                }
                DataType::TimestampMicrosecond => {
                    Value::Int(1_700_000_000_000_000 + rng.random_range(0..600_000_000i64))
                }
                DataType::TimestampNanosecond => {
                    Value::Int(1_700_000_000_000_000_000 + rng.random_range(0..600_000_000_000i64))
                }
                DataType::Date32 => Value::Int(19_000 + rng.random_range(0..30)),
                DataType::List(_) => Value::List(vec![Value::Null; rng.random_range(0..3)]),
            }
        })
        .collect()
}

/// One step of a random stream: rows to push per source (with diffs).
pub struct Step {
    pub pushes: Vec<(u32, Vec<Vec<Value>>, Vec<i64>)>,
    /// Push each run of equal diffs as one batch with one time and one diff for all its rows
    /// (the form the host's write path sends) instead of one time and diff per row.
    pub shared: bool,
}

/// Generates random inserts and retractions of existing rows, keeping the
/// current contents of every source up to date.
pub struct Stream {
    pub rng: StdRng,
    pub sources: Vec<SourceSchema>,
    pub contents: Vec<Vec<Vec<Value>>>,
}

impl Stream {
    pub fn new(seed: u64, sources: Vec<SourceSchema>) -> Stream {
        let contents = sources.iter().map(|_| Vec::new()).collect();
        Stream {
            rng: StdRng::seed_from_u64(seed),
            sources,
            contents,
        }
    }

    pub fn step(&mut self, max_rows: usize) -> Step {
        let mut pushes = Vec::new();
        for s in 0..self.sources.len() {
            let n = self.rng.random_range(0..=max_rows);
            let mut rows = Vec::new();
            let mut diffs = Vec::new();
            for _ in 0..n {
                let current = &mut self.contents[s];
                if !current.is_empty() && self.rng.random_range(0..3) == 0 {
                    let i = self.rng.random_range(0..current.len());
                    rows.push(current.swap_remove(i));
                    diffs.push(-1);
                } else {
                    let row = random_row(&mut self.rng, &self.sources[s].fields);
                    current.push(row.clone());
                    rows.push(row);
                    diffs.push(1);
                }
            }
            if !rows.is_empty() {
                pushes.push((s as u32, rows, diffs));
            }
        }
        Step {
            pushes,
            shared: self.rng.random_bool(0.5),
        }
    }
}

/// Applies a step to an engine: every row stamped with time `now` (see [`Step::shared`]).
pub fn apply(engine: &mut dyn Engine, sources: &[SourceSchema], step: &Step, now: i64) {
    for (s, rows, diffs) in &step.pushes {
        let fields = &sources[*s as usize].fields;
        let batch = |rows: &[Vec<Value>], diffs: &[i64]| {
            let times = vec![now; rows.len()];
            Batch::from_rows(fields, rows, &times, diffs).expect("batch from rows")
        };
        if !step.shared {
            engine.push(*s, batch(rows, diffs));
            continue;
        }
        let mut start = 0;
        while let Some(&d) = diffs.get(start) {
            let run = diffs[start..].iter().take_while(|x| **x == d).count();
            let mut b = batch(&rows[start..start + run], &diffs[start..start + run]);
            b.times = vec![now];
            b.diffs = vec![d];
            engine.push(*s, b);
            start += run;
        }
    }
}

/// Ticks until the engine has no more output; returns the output rows with diffs.
pub fn drain(engine: &mut dyn Engine, now: i64) -> Vec<(Vec<Value>, i64)> {
    let schema = engine.output_schema();
    let mut out = Vec::new();
    loop {
        let t = engine.tick(now);
        out.extend(
            t.output
                .to_rows(&schema)
                .into_iter()
                .map(|(r, _, d)| (r, d)),
        );
        if !t.more {
            return out;
        }
    }
}
