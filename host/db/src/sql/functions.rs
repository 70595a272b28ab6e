//! sandflow's own SQL functions, registered in every session's context:
//! GreptimeDB's `database()`, `tumble()`, `hop()` and its sketch functions (`hll`,
//! `hll_merge`, `hll_count`, `uddsketch_state`, `uddsketch_merge`,
//! `uddsketch_calc`), and the session's `current_user`.
//!
//! The sketches' bytes and numbers are the flow engine's
//! (`sandflow_engine::sketch`), so a state a query computes and one a flow
//! keeps merge with each other, and `hll_count`/`uddsketch_calc` read both.
//! Flows compute the aggregates in the engine, exactly under deletes; these
//! are for queries.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BinaryArray, Float64Array, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{exec_err, plan_err, Result as DfResult, ScalarValue};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, ColumnarValue, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::physical_expr::expressions::Literal;
use datafusion::prelude::SessionContext;
use sandflow_engine::sketch::{self, HllAcc, UddAcc};

/// Registers sandflow's functions in `ctx`.
pub fn register(ctx: &SessionContext) {
    ctx.register_udf(ScalarUDF::from(CurrentDatabase::new()));
    ctx.register_udf(ScalarUDF::from(Tumble::new()));
    ctx.register_udf(ScalarUDF::from(Hop::new()));
    for kind in [
        SketchAgg::Hll,
        SketchAgg::HllMerge,
        SketchAgg::Udd,
        SketchAgg::UddMerge,
    ] {
        ctx.register_udaf(AggregateUDF::from(SketchUdaf::new(kind)));
    }
    ctx.register_udf(ScalarUDF::from(SketchRead::new(ReadKind::HllCount)));
    ctx.register_udf(ScalarUDF::from(SketchRead::new(ReadKind::UddCalc)));
}

/// Registers `current_user`, `session_user` and `user` in a session's
/// context: the name of the user the session acts as.
pub(crate) fn register_user(ctx: &SessionContext, user: &str) {
    for name in ["current_user", "session_user", "user", "current_role"] {
        ctx.register_udf(ScalarUDF::from(SessionUser {
            name,
            user: user.to_string(),
            signature: Signature::nullary(Volatility::Stable),
        }));
    }
}

/// `current_user` and its kin.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SessionUser {
    name: &'static str,
    user: String,
    signature: Signature,
}

impl ScalarUDFImpl for SessionUser {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(
            self.user.clone(),
        ))))
    }
}

/// `tumble(ts, size[, origin])` (also `tumble_start`): the start of the
/// tumbling window of `size` that holds `ts`, windows starting at `origin`
/// (default the Unix epoch) and every `size` from it: `date_bin(size, ts,
/// origin)`, as flows written for older GreptimeDB versions group by it.
/// `size` is an interval or its text (`'5 minutes'`), `origin` a timestamp or
/// its text. The optimiser rewrites each call to `date_bin`, so flows get
/// date_bin's exact, delete-proof windows.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Tumble {
    signature: Signature,
    aliases: Vec<String>,
}

impl Tumble {
    fn new() -> Self {
        Tumble {
            signature: Signature::user_defined(Volatility::Immutable),
            aliases: vec!["tumble_start".to_string()],
        }
    }
}

/// A window size as date_bin takes it: an interval, or interval text.
fn window_size(e: &datafusion::prelude::Expr) -> DfResult<datafusion::prelude::Expr> {
    use datafusion::prelude::Expr;
    match e {
        Expr::Literal(ScalarValue::Utf8(Some(text)) | ScalarValue::LargeUtf8(Some(text)), _) => {
            let ms = crate::schema::interval::parse_interval(text).map_err(|m| {
                datafusion::error::DataFusionError::Plan(format!("window size: {m}"))
            })?;
            if ms <= 0 {
                return plan_err!("the window size must be positive, not '{text}'");
            }
            Ok(Expr::Literal(
                ScalarValue::IntervalMonthDayNano(Some(
                    datafusion::arrow::datatypes::IntervalMonthDayNano::new(
                        0,
                        0,
                        ms.saturating_mul(1_000_000),
                    ),
                )),
                None,
            ))
        }
        other => Ok(other.clone()),
    }
}

impl ScalarUDFImpl for Tumble {
    fn name(&self) -> &str {
        "tumble"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> DfResult<Vec<DataType>> {
        if !(2..=3).contains(&args.len()) {
            return plan_err!("tumble takes (ts, size) or (ts, size, origin)");
        }
        let mut out = args.to_vec();
        if let Some(origin) = out.get_mut(2) {
            if matches!(
                origin,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) {
                *origin = args[0].clone();
            }
        }
        Ok(out)
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        match args.first() {
            Some(t @ DataType::Timestamp(_, _)) => Ok(t.clone()),
            other => plan_err!("tumble's first argument must be a timestamp, not {other:?}"),
        }
    }

    fn simplify(
        &self,
        args: Vec<datafusion::prelude::Expr>,
        _info: &datafusion::logical_expr::simplify::SimplifyContext,
    ) -> DfResult<datafusion::logical_expr::simplify::ExprSimplifyResult> {
        use datafusion::logical_expr::simplify::ExprSimplifyResult;
        let mut args = args.into_iter();
        let (Some(ts), Some(size)) = (args.next(), args.next()) else {
            return plan_err!("tumble takes (ts, size) or (ts, size, origin)");
        };
        let mut call = vec![window_size(&size)?, ts];
        call.extend(args);
        Ok(ExprSimplifyResult::Simplified(
            datafusion::functions::datetime::date_bin().call(call),
        ))
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        exec_err!(
            "tumble(ts, size) is evaluated as date_bin(size, ts); write date_bin where the \
             optimiser does not run"
        )
    }
}

/// `hop(ts, slide, size)`: sliding windows, for flows' GROUP BY. A row
/// belongs to every window `[start, start + size)` that holds `ts`, starts
/// being multiples of `slide` (as date_bin's bins); the value is the
/// window's start. The flow engine expands each row into its windows; a
/// query cannot (one value per row), so calling it outside a flow is an
/// error that says so. `slide` and `size` are intervals or their text.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Hop {
    signature: Signature,
}

impl Hop {
    fn new() -> Self {
        Hop {
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for Hop {
    fn name(&self) -> &str {
        "hop"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> DfResult<Vec<DataType>> {
        if args.len() != 3 {
            return plan_err!("hop takes (ts, slide, size)");
        }
        Ok(args.to_vec())
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        match args.first() {
            Some(t @ DataType::Timestamp(_, _)) => Ok(t.clone()),
            other => plan_err!("hop's first argument must be a timestamp, not {other:?}"),
        }
    }

    fn simplify(
        &self,
        args: Vec<datafusion::prelude::Expr>,
        _info: &datafusion::logical_expr::simplify::SimplifyContext,
    ) -> DfResult<datafusion::logical_expr::simplify::ExprSimplifyResult> {
        use datafusion::logical_expr::simplify::ExprSimplifyResult;
        let text = |e: &datafusion::prelude::Expr| {
            matches!(
                e,
                datafusion::prelude::Expr::Literal(
                    ScalarValue::Utf8(Some(_)) | ScalarValue::LargeUtf8(Some(_)),
                    _
                )
            )
        };
        if !args.iter().skip(1).any(text) {
            return Ok(ExprSimplifyResult::Original(args));
        }
        let mut out = Vec::with_capacity(args.len());
        for (i, a) in args.iter().enumerate() {
            out.push(if i == 0 { a.clone() } else { window_size(a)? });
        }
        Ok(ExprSimplifyResult::Simplified(
            ScalarUDF::from(Hop::new()).call(out),
        ))
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        exec_err!(
            "hop(ts, slide, size) puts a row in several windows: it works in a flow's GROUP BY \
             only; in a query, group by date_bin(slide, ts) and its shifts instead"
        )
    }
}

/// `database()`: the session's database (GreptimeDB's and MySQL's name;
/// `schema()` is the same).
#[derive(Debug, PartialEq, Eq, Hash)]
struct CurrentDatabase {
    signature: Signature,
    aliases: Vec<String>,
}

impl CurrentDatabase {
    fn new() -> Self {
        CurrentDatabase {
            signature: Signature::nullary(Volatility::Stable),
            aliases: vec!["schema".to_string()],
        }
    }
}

impl ScalarUDFImpl for CurrentDatabase {
    fn name(&self) -> &str {
        "database"
    }

    fn aliases(&self) -> &[String] {
        &self.aliases
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let database = args.config_options.catalog.default_schema.clone();
        Ok(ColumnarValue::Scalar(ScalarValue::Utf8(Some(database))))
    }
}

/// Which sketch aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SketchAgg {
    Hll,
    HllMerge,
    Udd,
    UddMerge,
}

impl SketchAgg {
    fn name(self) -> &'static str {
        match self {
            SketchAgg::Hll => "hll",
            SketchAgg::HllMerge => "hll_merge",
            SketchAgg::Udd => "uddsketch_state",
            SketchAgg::UddMerge => "uddsketch_merge",
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SketchUdaf {
    kind: SketchAgg,
    signature: Signature,
}

impl SketchUdaf {
    fn new(kind: SketchAgg) -> Self {
        let signature = match kind {
            SketchAgg::Hll => Signature::any(1, Volatility::Immutable),
            _ => Signature::user_defined(Volatility::Immutable),
        };
        SketchUdaf { kind, signature }
    }
}

impl AggregateUDFImpl for SketchUdaf {
    fn name(&self) -> &str {
        self.kind.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        let name = self.kind.name();
        match (self.kind, arg_types) {
            (SketchAgg::HllMerge, [_]) => Ok(vec![DataType::Binary]),
            (SketchAgg::Udd, [_, _, _]) => {
                Ok(vec![DataType::Int64, DataType::Float64, DataType::Float64])
            }
            (SketchAgg::UddMerge, [_, _, _]) => {
                Ok(vec![DataType::Int64, DataType::Float64, DataType::Binary])
            }
            (SketchAgg::HllMerge, _) => plan_err!("{name} takes one argument, a state of hll"),
            _ => plan_err!(
                "{name} takes three arguments: {name}(max_buckets, error_rate, {})",
                if self.kind == SketchAgg::Udd {
                    "value"
                } else {
                    "state"
                }
            ),
        }
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Binary)
    }

    fn state_fields(&self, args: StateFieldsArgs) -> DfResult<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_state", args.name),
            DataType::Binary,
            true,
        ))])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> DfResult<Box<dyn Accumulator>> {
        let name = self.kind.name();
        Ok(Box::new(match self.kind {
            SketchAgg::Hll | SketchAgg::HllMerge => SketchAcc::Hll(HllAcc::new(), self.kind),
            SketchAgg::Udd | SketchAgg::UddMerge => {
                let literal = |i: usize| {
                    args.exprs
                        .get(i)
                        .and_then(|e| e.downcast_ref::<Literal>())
                        .map(|l| l.value().clone())
                };
                let (Some(b), Some(e)) = (literal(0), literal(1)) else {
                    return plan_err!(
                        "{name}'s max_buckets and error_rate must be literals, e.g. \
                         {name}(128, 0.01, ...)"
                    );
                };
                let max_buckets = match b.cast_to(&DataType::Int64)? {
                    ScalarValue::Int64(Some(b)) => b,
                    _ => return plan_err!("{name}'s max_buckets must not be NULL"),
                };
                let error_rate = match e.cast_to(&DataType::Float64)? {
                    ScalarValue::Float64(Some(e)) => e,
                    _ => return plan_err!("{name}'s error_rate must not be NULL"),
                };
                let acc =
                    UddAcc::new(max_buckets, error_rate).or_else(|m| plan_err!("{name}: {m}"))?;
                SketchAcc::Udd(acc, self.kind)
            }
        }))
    }
}

#[derive(Debug)]
enum SketchAcc {
    Hll(HllAcc, SketchAgg),
    Udd(UddAcc, SketchAgg),
}

/// The hash `hll` takes of row `i` of `a`, by the engine's rule (see
/// `sandflow_engine::sketch`); `None` for NULL.
fn hll_hash(a: &ArrayRef, i: usize) -> DfResult<Option<u64>> {
    if a.is_null(i) {
        return Ok(None);
    }
    Ok(Some(match ScalarValue::try_from_array(a, i)? {
        ScalarValue::Boolean(Some(b)) => sketch::hll_hash_bool(b),
        ScalarValue::Int8(Some(x)) => sketch::hll_hash_i64(x.into()),
        ScalarValue::Int16(Some(x)) => sketch::hll_hash_i64(x.into()),
        ScalarValue::Int32(Some(x)) => sketch::hll_hash_i64(x.into()),
        ScalarValue::Int64(Some(x)) => sketch::hll_hash_i64(x),
        ScalarValue::UInt8(Some(x)) => sketch::hll_hash_u64(x.into()),
        ScalarValue::UInt16(Some(x)) => sketch::hll_hash_u64(x.into()),
        ScalarValue::UInt32(Some(x)) => sketch::hll_hash_u64(x.into()),
        ScalarValue::UInt64(Some(x)) => sketch::hll_hash_u64(x),
        ScalarValue::Float32(Some(x)) => sketch::hll_hash_f64(x.into()),
        ScalarValue::Float64(Some(x)) => sketch::hll_hash_f64(x),
        ScalarValue::Utf8(Some(s))
        | ScalarValue::LargeUtf8(Some(s))
        | ScalarValue::Utf8View(Some(s)) => sketch::hll_hash_str(&s),
        ScalarValue::Binary(Some(b))
        | ScalarValue::LargeBinary(Some(b))
        | ScalarValue::BinaryView(Some(b)) => sketch::hll_hash_bytes(&b),
        ScalarValue::Date32(Some(x)) => sketch::hll_hash_i64(x.into()),
        ScalarValue::TimestampSecond(Some(x), _)
        | ScalarValue::TimestampMillisecond(Some(x), _)
        | ScalarValue::TimestampMicrosecond(Some(x), _)
        | ScalarValue::TimestampNanosecond(Some(x), _) => sketch::hll_hash_i64(x),
        other => return exec_err!("hll does not take values of type {}", other.data_type()),
    }))
}

fn binary_at(a: &ArrayRef, i: usize) -> DfResult<Option<Vec<u8>>> {
    if a.is_null(i) {
        return Ok(None);
    }
    match ScalarValue::try_from_array(a, i)? {
        ScalarValue::Binary(b) | ScalarValue::LargeBinary(b) | ScalarValue::BinaryView(b) => Ok(b),
        other => exec_err!("a sketch state is BINARY, not {}", other.data_type()),
    }
}

impl SketchAcc {
    fn merge_states(&mut self, states: &ArrayRef) -> DfResult<()> {
        for i in 0..states.len() {
            if let Some(b) = binary_at(states, i)? {
                match self {
                    SketchAcc::Hll(acc, _) => acc
                        .add_state(&b, 1)
                        .or_else(|m| exec_err!("hll_merge: {m}"))?,
                    SketchAcc::Udd(acc, _) => acc
                        .add_state(&b, 1)
                        .or_else(|m| exec_err!("uddsketch_merge: {m}"))?,
                }
            }
        }
        Ok(())
    }
}

impl Accumulator for SketchAcc {
    fn update_batch(&mut self, values: &[ArrayRef]) -> DfResult<()> {
        let Some(v) = values.last() else {
            return Ok(());
        };
        match self {
            SketchAcc::Hll(acc, SketchAgg::Hll) => {
                for i in 0..v.len() {
                    if let Some(h) = hll_hash(v, i)? {
                        acc.add_hash(h, 1);
                    }
                }
                Ok(())
            }
            SketchAcc::Udd(acc, SketchAgg::Udd) => {
                let Some(f) = v.as_any().downcast_ref::<Float64Array>() else {
                    return exec_err!("uddsketch_state takes a number");
                };
                for x in f.iter().flatten() {
                    acc.add_value(x, 1)
                        .or_else(|m| exec_err!("uddsketch_state: {m}"))?;
                }
                Ok(())
            }
            _ => self.merge_states(v),
        }
    }

    fn evaluate(&mut self) -> DfResult<ScalarValue> {
        Ok(ScalarValue::Binary(Some(match self {
            SketchAcc::Hll(acc, _) => acc.state(),
            SketchAcc::Udd(acc, _) => acc.state().or_else(|m| exec_err!("uddsketch: {m}"))?,
        })))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + 16 * 1024
    }

    fn state(&mut self) -> DfResult<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> DfResult<()> {
        match states.first() {
            Some(s) => self.merge_states(s),
            None => Ok(()),
        }
    }
}

/// The scalar functions that read a sketch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum ReadKind {
    /// `hll_count(state)`: the estimated number of distinct values.
    HllCount,
    /// `uddsketch_calc(quantile, state)`: the estimated quantile.
    UddCalc,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct SketchRead {
    kind: ReadKind,
    signature: Signature,
}

impl SketchRead {
    fn new(kind: ReadKind) -> Self {
        SketchRead {
            kind,
            signature: Signature::user_defined(Volatility::Immutable),
        }
    }
}

impl ScalarUDFImpl for SketchRead {
    fn name(&self) -> &str {
        match self.kind {
            ReadKind::HllCount => "hll_count",
            ReadKind::UddCalc => "uddsketch_calc",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        match (self.kind, arg_types.len()) {
            (ReadKind::HllCount, 1) => Ok(vec![DataType::Binary]),
            (ReadKind::UddCalc, 2) => Ok(vec![DataType::Float64, DataType::Binary]),
            (ReadKind::HllCount, _) => plan_err!("hll_count takes one argument, a state of hll"),
            (ReadKind::UddCalc, _) => {
                plan_err!("uddsketch_calc takes two arguments: uddsketch_calc(quantile, state)")
            }
        }
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(match self.kind {
            ReadKind::HllCount => DataType::UInt64,
            ReadKind::UddCalc => DataType::Float64,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let n = args.number_rows;
        let arrays = ColumnarValue::values_to_arrays(&args.args)?;
        let state = arrays
            .last()
            .and_then(|a| a.as_any().downcast_ref::<BinaryArray>())
            .ok_or_else(|| {
                datafusion::error::DataFusionError::Execution(
                    "a sketch state is BINARY".to_string(),
                )
            })?;
        let out: ArrayRef = match self.kind {
            ReadKind::HllCount => {
                let mut v = Vec::with_capacity(n);
                for s in state.iter() {
                    v.push(match s {
                        Some(b) => {
                            Some(sketch::hll_count(b).or_else(|m| exec_err!("hll_count: {m}"))?)
                        }
                        None => None,
                    });
                }
                Arc::new(UInt64Array::from(v))
            }
            ReadKind::UddCalc => {
                let q = arrays
                    .first()
                    .and_then(|a| a.as_any().downcast_ref::<Float64Array>())
                    .ok_or_else(|| {
                        datafusion::error::DataFusionError::Execution(
                            "uddsketch_calc's quantile is a number".to_string(),
                        )
                    })?;
                let mut v = Vec::with_capacity(n);
                for (q, s) in q.iter().zip(state.iter()) {
                    v.push(match (q, s) {
                        (Some(q), Some(b)) => sketch::uddsketch_calc(q, b)
                            .or_else(|m| exec_err!("uddsketch_calc: {m}"))?,
                        _ => None,
                    });
                }
                Arc::new(Float64Array::from(v))
            }
        };
        Ok(ColumnarValue::Array(out))
    }
}

/// `flow_now_cmp(x, offset_ns, op, trunc_ns)`: `x op trunc(now()) + offset`
/// where now() is the flow's tick time and `trunc` rounds down to a multiple
/// of `trunc_ns` since the epoch (1: none; `date_trunc('minute', now())`).
/// A flow's compiler writes it in place of a temporal filter (`WHERE ts >
/// now() - INTERVAL '5 minutes'`) so that DataFusion neither folds now()
/// into the time the flow was planned nor moves the condition; the engine keeps each row in the result exactly while the
/// condition holds at the tick time. Never registered: it cannot be called
/// from SQL, and a query never runs it.
#[derive(Debug, PartialEq, Eq, Hash)]
pub(crate) struct FlowNowCmp {
    signature: Signature,
}

/// The name the engine recognises.
pub(crate) const FLOW_NOW_CMP: &str = "flow_now_cmp";

impl FlowNowCmp {
    pub(crate) fn udf() -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::from(FlowNowCmp {
            // Stable: not folded while it reads a column, and still pushed
            // below joins and into scans like any other condition.
            signature: Signature::any(4, Volatility::Stable),
        }))
    }
}

impl ScalarUDFImpl for FlowNowCmp {
    fn name(&self) -> &str {
        FLOW_NOW_CMP
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> DfResult<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        exec_err!(
            "now() compares with a row's own time only in a flow's WHERE, e.g. WHERE ts > now() \
             - INTERVAL '5 minutes'; compare it with a column, not a constant"
        )
    }
}
