//! Typed scalar expressions evaluated over whole column vectors.

use std::borrow::Cow;
use std::cmp::Ordering;

use crate::column::{broadcast, get, or_nulls, take_chunk, Chunk, ColBuilder, S};
use crate::types::{bad, unsupported, Column, DataType, FlowError, Storage};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Lit {
    Null,
    Int(i64),
    Float(f64),
    Bytes(Vec<u8>),
}

impl Lit {
    pub fn as_s(&self) -> S<'_> {
        match self {
            Lit::Null => S::Null,
            Lit::Int(i) => S::I(*i),
            Lit::Float(f) => S::F(*f),
            Lit::Bytes(b) => S::B(b),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arith {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Cmp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    Distinct,
    NotDistinct,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TruncUnit {
    Microsecond,
    Millisecond,
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Quarter,
    Year,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Func {
    Arith(Arith),
    Cmp(Cmp),
    And,
    Or,
    Not,
    Negate,
    IsNull,
    IsNotNull,
    IsTrue,
    IsFalse,
    IsNotTrue,
    IsNotFalse,
    Like {
        case_insensitive: bool,
    },
    Abs,
    Round,
    Trunc,
    Floor,
    Ceil,
    /// `concat(...)`: NULL arguments are skipped.
    Concat,
    /// `a || b`: NULL if any argument is NULL.
    StrConcat,
    Lower,
    Upper,
    CharLength,
    Coalesce,
    /// `date_bin(stride, ts[, origin])`: stride and origin in nanoseconds, args[0] is the timestamp.
    DateBin {
        stride_ns: i64,
        origin_ns: i64,
    },
    /// The row of `first_value(v ORDER BY k)` / `last_value`: args[0] is the sort key,
    /// args[1] the value, encoded as bytes that order as the sort does (ascending;
    /// NULL keys first or last as asked), then the value. Never NULL (a NULL value is
    /// kept as such). `agg.rs` keeps these in an ordered multiset and decodes the end.
    OrderedPair {
        nulls_low: bool,
    },
    /// `date_trunc(unit, ts)`: args[0] is the timestamp.
    DateTrunc(TruncUnit),
    /// `regexp_like(s, pattern[, flags])`, `s ~ pattern`, `~*`, `!~`, `!~*`: whether the
    /// pattern (a literal, compiled when the plan is lowered) matches anywhere in args[0],
    /// the opposite when `negated`; NULL where args[0] is NULL.
    RegexMatch {
        re: Pattern,
        negated: bool,
    },
    /// `args[0] op now() + offset_ns`, now() being the tick time (truncated to a multiple of
    /// `trunc_ns` since the epoch when that is over 1, as `date_trunc('minute', now())`
    /// gives): a temporal filter. Never evaluated as an expression: `plan.rs` takes it out of
    /// a WHERE into the temporal operator (`temporal.rs`), and refuses it anywhere else.
    NowCmp {
        op: Cmp,
        offset_ns: i64,
        trunc_ns: i64,
    },
}

/// A regular expression compiled once, when the plan is lowered, exactly as DataFusion 55
/// compiles it for `regexp_like` and `~` (arrow's `regexp_is_match_scalar`): the flags are
/// prepended as `(?flags)` and the result is built by `regex::Regex::new`, with its default
/// limits (so a pattern DataFusion accepts is accepted here too).
#[derive(Debug, Clone)]
pub(crate) struct Pattern(regex::Regex);

impl Pattern {
    /// Compiles `pattern` with optional `flags` (`i`, `m`, `s`, `U`, `u`, `R`, `x`, `-`),
    /// or explains on one line why it does not compile (e.g. empty flags: `(?)` is an error).
    pub fn new(pattern: &str, flags: Option<&str>) -> Result<Self, FlowError> {
        let full = match flags {
            Some(f) => format!("(?{f}){pattern}"),
            None => pattern.to_string(),
        };
        regex::Regex::new(&full).map(Pattern).map_err(|e| {
            // A syntax error is several lines (the pattern, a caret, then "error: why").
            let msg = e.to_string();
            let why = msg.lines().last().unwrap_or_default();
            let why = why.strip_prefix("error: ").unwrap_or(why);
            bad(format!(
                "regular expression {full:?} did not compile: {why}"
            ))
        })
    }

    /// The pattern as compiled (flags included).
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Expr {
    Col(usize, DataType),
    Lit(Lit, DataType),
    Call(Func, Vec<Expr>, DataType),
    Cast(Box<Expr>, DataType),
    Case(Vec<(Expr, Expr)>, Option<Box<Expr>>, DataType),
    InList(Box<Expr>, Vec<Expr>),
}

fn err_div0() -> FlowError {
    bad("Arrow error: Divide by zero error")
}

impl Expr {
    pub fn ty(&self) -> DataType {
        match self {
            Expr::Col(_, t) | Expr::Lit(_, t) | Expr::Call(_, _, t) | Expr::Cast(_, t) => *t,
            Expr::Case(_, _, t) => *t,
            Expr::InList(..) => DataType::Boolean,
        }
    }

    /// Evaluates over a chunk, returning one value per row.
    pub fn eval<'a>(&self, c: &'a Chunk) -> Result<Cow<'a, Column>, FlowError> {
        let n = c.rows;
        Ok(match self {
            Expr::Col(i, _) => Cow::Borrowed(
                c.cols
                    .get(*i)
                    .ok_or_else(|| crate::types::internal("column index out of range"))?,
            ),
            Expr::Lit(l, t) => Cow::Owned(broadcast(l.as_s(), *t, n)),
            Expr::Cast(e, t) => {
                let v = e.eval(c)?;
                Cow::Owned(cast_column(&v, e.ty(), *t, n)?)
            }
            Expr::Call(f, args, t) => Cow::Owned(eval_call(f, args, *t, c)?),
            Expr::Case(whens, els, t) => Cow::Owned(eval_case(whens, els.as_deref(), *t, c)?),
            Expr::InList(e, list) => {
                let v = e.eval(c)?;
                let et = e.ty();
                let items = list
                    .iter()
                    .map(|x| x.eval(c))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut b = ColBuilder::new(DataType::Boolean, n);
                for i in 0..n {
                    let x = get(&v, et.storage(), i);
                    if x.is_null() {
                        b.push_null();
                        continue;
                    }
                    let mut found = false;
                    let mut saw_null = false;
                    for (it, ie) in items.iter().zip(list.iter()) {
                        let y = get(it, ie.ty().storage(), i);
                        if y.is_null() {
                            saw_null = true;
                        } else if cmp_s(x, y, et, ie.ty()) == Some(Ordering::Equal) {
                            found = true;
                            break;
                        }
                    }
                    if found {
                        b.push(S::I(1));
                    } else if saw_null {
                        b.push_null();
                    } else {
                        b.push(S::I(0));
                    }
                }
                Cow::Owned(b.finish())
            }
        })
    }
}

/// Compares two non-null scalars of the given types.
pub(crate) fn cmp_s(a: S<'_>, b: S<'_>, at: DataType, bt: DataType) -> Option<Ordering> {
    match (a, b) {
        (S::I(x), S::I(y)) => {
            if at == DataType::UInt64 || bt == DataType::UInt64 {
                Some((x as u64).cmp(&(y as u64)))
            } else {
                Some(x.cmp(&y))
            }
        }
        (S::F(x), S::F(y)) => Some(x.total_cmp(&y)),
        (S::I(x), S::F(y)) => (int_as_f64(x, at)).partial_cmp(&y),
        (S::F(x), S::I(y)) => x.partial_cmp(&int_as_f64(y, bt)),
        (S::B(x), S::B(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

fn int_as_f64(v: i64, t: DataType) -> f64 {
    if t == DataType::UInt64 {
        v as u64 as f64
    } else {
        v as f64
    }
}

fn bool_col(vals: Vec<i64>, nulls: Vec<u8>) -> Column {
    Column {
        ints: vals,
        nulls,
        ..Column::default()
    }
}

fn arg(args: &[Expr], i: usize) -> Result<&Expr, FlowError> {
    args.get(i)
        .ok_or_else(|| crate::types::internal("missing function argument"))
}

fn eval_call(f: &Func, args: &[Expr], t: DataType, c: &Chunk) -> Result<Column, FlowError> {
    let n = c.rows;
    match f {
        Func::Arith(op) => {
            let (a, b) = (arg(args, 0)?, arg(args, 1)?);
            let (va, vb) = (a.eval(c)?, b.eval(c)?);
            arith(*op, &va, a.ty(), &vb, b.ty(), t, n)
        }
        Func::Cmp(op) => {
            let (a, b) = (arg(args, 0)?, arg(args, 1)?);
            let (va, vb) = (a.eval(c)?, b.eval(c)?);
            Ok(compare(*op, &va, a.ty(), &vb, b.ty(), n))
        }
        Func::And | Func::Or => {
            let is_and = matches!(f, Func::And);
            let mut acc: Option<Column> = None;
            for a in args {
                let v = a.eval(c)?;
                acc = Some(match acc {
                    None => v.into_owned(),
                    Some(prev) => kleene(is_and, &prev, &v, n),
                });
            }
            Ok(acc.unwrap_or_else(|| bool_col(vec![is_and as i64; n], Vec::new())))
        }
        Func::Not => {
            let v = arg(args, 0)?.eval(c)?;
            Ok(bool_col(
                v.ints.iter().map(|x| (*x == 0) as i64).collect(),
                v.nulls.clone(),
            ))
        }
        Func::IsNull | Func::IsNotNull => {
            let v = arg(args, 0)?.eval(c)?;
            let want = matches!(f, Func::IsNull) as i64;
            Ok(bool_col(
                (0..n)
                    .map(|i| if v.is_null(i) { want } else { 1 - want })
                    .collect(),
                Vec::new(),
            ))
        }
        Func::IsTrue | Func::IsFalse | Func::IsNotTrue | Func::IsNotFalse => {
            let v = arg(args, 0)?.eval(c)?;
            Ok(bool_col(
                (0..n)
                    .map(|i| {
                        let x = if v.is_null(i) {
                            None
                        } else {
                            v.ints.get(i).map(|x| *x != 0)
                        };
                        (match f {
                            Func::IsTrue => x == Some(true),
                            Func::IsFalse => x == Some(false),
                            Func::IsNotTrue => x != Some(true),
                            _ => x != Some(false),
                        }) as i64
                    })
                    .collect(),
                Vec::new(),
            ))
        }
        Func::Negate => {
            let a = arg(args, 0)?;
            let v = a.eval(c)?;
            let mut out = v.into_owned();
            if t.is_float() {
                out.floats.iter_mut().for_each(|x| *x = -*x);
            } else {
                out.ints
                    .iter_mut()
                    .for_each(|x| *x = t.wrap_int(x.wrapping_neg()));
            }
            Ok(out)
        }
        Func::Abs => {
            let v = arg(args, 0)?.eval(c)?;
            let mut out = v.into_owned();
            if t.is_float() {
                out.floats.iter_mut().for_each(|x| *x = x.abs());
            } else if !t.is_unsigned_int() {
                out.ints
                    .iter_mut()
                    .for_each(|x| *x = t.wrap_int(x.wrapping_abs()));
            }
            Ok(out)
        }
        Func::Round | Func::Trunc | Func::Floor | Func::Ceil => {
            let a = arg(args, 0)?;
            let av = a.eval(c)?;
            let v = cast_column(&av, a.ty(), DataType::Float64, n)?;
            let digits = match args.get(1) {
                Some(d) => {
                    let dv = d.eval(c)?;
                    Some(cast_column(&dv, d.ty(), DataType::Int64, n)?)
                }
                None => None,
            };
            let mut out = Column {
                floats: Vec::with_capacity(n),
                nulls: v.nulls.clone(),
                ..Column::default()
            };
            for i in 0..n {
                let x = v.floats.get(i).copied().unwrap_or(0.0);
                let d = digits
                    .as_ref()
                    .and_then(|d| d.ints.get(i).copied())
                    .unwrap_or(0);
                let r = match f {
                    Func::Floor => x.floor(),
                    Func::Ceil => x.ceil(),
                    _ => {
                        let p = 10f64.powi(d.clamp(-300, 300) as i32);
                        if matches!(f, Func::Round) {
                            (x * p).round() / p
                        } else {
                            (x * p).trunc() / p
                        }
                    }
                };
                out.floats.push(r);
            }
            if let Some(d) = &digits {
                out.nulls = or_nulls(&out.nulls, &d.nulls, n);
            }
            cast_column(&out, DataType::Float64, t, n)
        }
        Func::Concat | Func::StrConcat => {
            let vals = args
                .iter()
                .map(|a| {
                    let v = a.eval(c)?;
                    if a.ty() == DataType::Utf8 {
                        Ok(v.into_owned())
                    } else {
                        // Binary arguments are checked to be UTF-8 (as Arrow's cast does).
                        cast_column(&v, a.ty(), DataType::Utf8, n)
                    }
                })
                .collect::<Result<Vec<_>, FlowError>>()?;
            let mut b = ColBuilder::new(t, n);
            let mut buf = Vec::new();
            for i in 0..n {
                buf.clear();
                let mut null = false;
                for v in &vals {
                    if v.is_null(i) {
                        null = true;
                    } else {
                        buf.extend_from_slice(v.bytes_at(i));
                    }
                }
                if null && matches!(f, Func::StrConcat) {
                    b.push_null();
                } else {
                    b.push(S::B(&buf));
                }
            }
            Ok(b.finish())
        }
        Func::Lower | Func::Upper => {
            let v = arg(args, 0)?.eval(c)?;
            let mut b = ColBuilder::new(t, n);
            for i in 0..n {
                if v.is_null(i) {
                    b.push_null();
                    continue;
                }
                let s = String::from_utf8_lossy(v.bytes_at(i));
                if matches!(f, Func::Lower) {
                    b.push_str(&s.to_lowercase());
                } else {
                    b.push_str(&s.to_uppercase());
                }
            }
            Ok(b.finish())
        }
        Func::CharLength => {
            let v = arg(args, 0)?.eval(c)?;
            Ok(Column {
                ints: (0..n)
                    .map(|i| {
                        t.wrap_int(String::from_utf8_lossy(v.bytes_at(i)).chars().count() as i64)
                    })
                    .collect(),
                nulls: v.nulls.clone(),
                ..Column::default()
            })
        }
        Func::Like { case_insensitive } => {
            let (a, p) = (arg(args, 0)?, arg(args, 1)?);
            let (va, vp) = (a.eval(c)?, p.eval(c)?);
            let esc = match args.get(2) {
                Some(Expr::Lit(Lit::Bytes(b), _)) => {
                    String::from_utf8_lossy(b).chars().next().unwrap_or('\\')
                }
                _ => '\\',
            };
            let nulls = or_nulls(&va.nulls, &vp.nulls, n);
            let mut out = Vec::with_capacity(n);
            let mut cache: Option<(Vec<u8>, Vec<char>)> = None;
            for i in 0..n {
                let (s, pat) = (va.bytes_at(i), vp.bytes_at(i));
                let pchars = match &cache {
                    Some((raw, chars)) if raw.as_slice() == pat => chars.clone(),
                    _ => {
                        let ps = String::from_utf8_lossy(pat);
                        let chars: Vec<char> = if *case_insensitive {
                            ps.to_lowercase().chars().collect()
                        } else {
                            ps.chars().collect()
                        };
                        cache = Some((pat.to_vec(), chars.clone()));
                        chars
                    }
                };
                let ss = String::from_utf8_lossy(s);
                let schars: Vec<char> = if *case_insensitive {
                    ss.to_lowercase().chars().collect()
                } else {
                    ss.chars().collect()
                };
                out.push(like_match(&schars, &pchars, esc) as i64);
            }
            Ok(bool_col(out, nulls))
        }
        Func::Coalesce => {
            let vals = args
                .iter()
                .map(|a| {
                    let v = a.eval(c)?;
                    cast_column(&v, a.ty(), t, n)
                })
                .collect::<Result<Vec<_>, FlowError>>()?;
            let mut b = ColBuilder::new(t, n);
            for i in 0..n {
                match vals.iter().find(|v| !v.is_null(i)) {
                    Some(v) => b.push(get(v, t.storage(), i)),
                    None => b.push_null(),
                }
            }
            Ok(b.finish())
        }
        Func::DateBin {
            stride_ns,
            origin_ns,
        } => {
            let a = arg(args, 0)?;
            let v = a.eval(c)?;
            let bins = DateBins::new(
                a.ty().timestamp_unit_nanos().unwrap_or(1),
                *stride_ns,
                *origin_ns,
                t.timestamp_unit_nanos().unwrap_or(1),
            );
            let out = v.ints.iter().map(|x| bins.bin(*x)).collect();
            Ok(Column {
                ints: out,
                nulls: v.nulls.clone(),
                ..Column::default()
            })
        }
        Func::DateTrunc(u) => {
            let a = arg(args, 0)?;
            let v = a.eval(c)?;
            let unit = a.ty().timestamp_unit_nanos().unwrap_or(1) as i128;
            let out_unit = t.timestamp_unit_nanos().unwrap_or(1) as i128;
            let out = date_trunc_column(&v.ints, *u, unit, out_unit);
            Ok(Column {
                ints: out,
                nulls: v.nulls.clone(),
                ..Column::default()
            })
        }
        Func::NowCmp { .. } => Err(unsupported(
            "now() is not supported in flows except in a WHERE condition that compares a row's time \
             with now() plus or minus an interval (e.g. ts > now() - INTERVAL '5 minutes'), \
             not inside OR, NOT or CASE",
        )),
        Func::RegexMatch { re, negated } => {
            let v = arg(args, 0)?.eval(c)?;
            Ok(bool_col(
                regex_matches(&re.0, &v, *negated, n),
                v.nulls.clone(),
            ))
        }
        Func::OrderedPair { nulls_low } => {
            let (k, v) = (arg(args, 0)?, arg(args, 1)?);
            let (kt, vt) = (k.ty(), v.ty());
            let (kc, vc) = (k.eval(c)?, v.eval(c)?);
            let mut out = ColBuilder::new(DataType::Binary, n);
            let mut buf = Vec::with_capacity(32);
            for i in 0..n {
                buf.clear();
                match crate::agg::ord_key(get(&kc, kt.storage(), i), kt) {
                    Some(key) => {
                        buf.push(1);
                        buf.extend_from_slice(&((key as u64) ^ (1 << 63)).to_be_bytes());
                    }
                    None => {
                        buf.push(if *nulls_low { 0 } else { 2 });
                        buf.extend_from_slice(&[0; 8]);
                    }
                }
                match get(&vc, vt.storage(), i) {
                    S::Null => buf.push(0),
                    S::B(b) => {
                        buf.push(1);
                        buf.extend_from_slice(b);
                    }
                    x => {
                        buf.push(1);
                        let key = crate::agg::ord_key(x, vt).unwrap_or(0);
                        buf.extend_from_slice(&((key as u64) ^ (1 << 63)).to_be_bytes());
                    }
                }
                out.push(S::B(&buf));
            }
            Ok(out.finish())
        }
    }
}

/// Whether `re` matches each of the first `n` strings of `v` (0 for NULL rows, which the
/// caller marks NULL), inverted when `negated`.
#[inline(never)]
fn regex_matches(re: &regex::Regex, v: &Column, negated: bool, n: usize) -> Vec<i64> {
    (0..n)
        .map(|i| {
            if v.is_null(i) {
                return 0;
            }
            let b = v.bytes_at(i);
            // Strings are valid UTF-8 (validate_batch); the lossy path only keeps this total.
            let hit = match std::str::from_utf8(b) {
                Ok(s) => re.is_match(s),
                Err(_) => re.is_match(&String::from_utf8_lossy(b)),
            };
            (hit != negated) as i64
        })
        .collect()
}

/// `date_bin(stride, ts, origin)` of values in one unit, as values in
/// another (units in nanoseconds).
struct DateBins {
    unit: i128,
    stride: i128,
    origin: i128,
    out_unit: i128,
    /// The stride and origin in the input unit, when both are whole units
    /// of it and the output has that unit too (`date_bin('1 minute', ts)`
    /// of a millisecond column): then the same bins come out of i64
    /// arithmetic, without 128-bit division.
    same_unit: Option<(i64, i64)>,
}

impl DateBins {
    fn new(unit: i64, stride_ns: i64, origin_ns: i64, out_unit: i64) -> DateBins {
        let (unit, stride, origin) = (unit as i128, stride_ns as i128, origin_ns as i128);
        let out_unit = out_unit as i128;
        let whole = |ns: i128| unit != 0 && ns % unit == 0;
        let same_unit = (stride > 0 && whole(stride) && whole(origin) && out_unit == unit)
            .then(|| {
                Some((
                    i64::try_from(stride / unit).ok()?,
                    i64::try_from(origin / unit).ok()?,
                ))
            })
            .flatten();
        DateBins {
            unit,
            stride,
            origin,
            out_unit,
            same_unit,
        }
    }

    #[inline]
    fn bin(&self, x: i64) -> i64 {
        if let Some((s, o)) = self.same_unit {
            let b = x
                .checked_sub(o)
                .and_then(|d| floor_multiple(d, s))
                .and_then(|b| b.checked_add(o));
            if let Some(b) = b {
                return b;
            }
        }
        self.bin_wide(x)
    }

    /// The general case, in nanoseconds.
    fn bin_wide(&self, x: i64) -> i64 {
        let ns = x as i128 * self.unit;
        let binned = if self.stride > 0 {
            self.origin + (ns - self.origin).div_euclid(self.stride) * self.stride
        } else {
            ns
        };
        binned.div_euclid(self.out_unit.max(1)) as i64
    }
}

const NS_PER_DAY: i128 = 86_400_000_000_000;

/// `date_trunc(u, x)` of each `x` (a count of `unit` ns) as a count of
/// `out_unit` ns.
fn date_trunc_column(xs: &[i64], u: TruncUnit, unit: i128, out_unit: i128) -> Vec<i64> {
    let wide = |x: i64| (date_trunc_ns(x as i128 * unit, u).div_euclid(out_unit)) as i64;
    // A fixed step that is a whole number of the column's unit, in and
    // out: the same in 64 bits, without wasm's software 128-bit multiply
    // and divide per row.
    let step = match (fixed_step_ns(u), unit == out_unit) {
        (Some(step), true) if step % unit == 0 => i64::try_from(step / unit).ok(),
        _ => None,
    };
    match step {
        Some(s) => xs
            .iter()
            .map(|&x| floor_multiple(x, s).unwrap_or_else(|| wide(x)))
            .collect(),
        None => xs.iter().map(|&x| wide(x)).collect(),
    }
}

/// The largest multiple of `s` (> 0) at or below `d`, when it fits an
/// i64. Without a checked multiply, which in wasm is a call: the multiple
/// lies in `(d - s, d]`, so it fits unless `d` is within `s` of the
/// smallest i64.
#[inline]
fn floor_multiple(d: i64, s: i64) -> Option<i64> {
    (s > 0 && d > i64::MIN + s).then(|| d.div_euclid(s) * s)
}

/// The length of `u` in nanoseconds, when every one is as long.
fn fixed_step_ns(u: TruncUnit) -> Option<i128> {
    match u {
        TruncUnit::Microsecond => Some(1_000),
        TruncUnit::Millisecond => Some(1_000_000),
        TruncUnit::Second => Some(1_000_000_000),
        TruncUnit::Minute => Some(60_000_000_000),
        TruncUnit::Hour => Some(3_600_000_000_000),
        TruncUnit::Day => Some(NS_PER_DAY),
        TruncUnit::Week | TruncUnit::Month | TruncUnit::Quarter | TruncUnit::Year => None,
    }
}

fn date_trunc_ns(ns: i128, u: TruncUnit) -> i128 {
    match u {
        TruncUnit::Week => {
            // 1970-01-01 was a Thursday; weeks start on Monday (1969-12-29).
            let days = ns.div_euclid(NS_PER_DAY);
            (days - (days + 3).rem_euclid(7)) * NS_PER_DAY
        }
        TruncUnit::Month | TruncUnit::Quarter | TruncUnit::Year => {
            let days = ns.div_euclid(NS_PER_DAY) as i64;
            let (y, m, _) = civil_from_days(days);
            let m = match u {
                TruncUnit::Month => m,
                TruncUnit::Quarter => (m - 1) / 3 * 3 + 1,
                _ => 1,
            };
            days_from_civil(y, m, 1) as i128 * NS_PER_DAY
        }
        _ => {
            let step = fixed_step_ns(u).unwrap_or(1);
            ns.div_euclid(step) * step
        }
    }
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar.
pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn like_match(s: &[char], p: &[char], esc: char) -> bool {
    // Iterative wildcard matching with backtracking on the last '%'.
    let (mut si, mut pi) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() {
            let pc = p[pi];
            if pc == '%' {
                star = Some((pi + 1, si));
                pi += 1;
                continue;
            }
            if si < s.len() {
                let (lit, adv) = if pc == esc && pi + 1 < p.len() {
                    (Some(p[pi + 1]), 2)
                } else if pc == '_' {
                    (None, 1)
                } else {
                    (Some(pc), 1)
                };
                if lit.is_none_or(|l| l == s[si]) {
                    si += 1;
                    pi += adv;
                    continue;
                }
            }
        } else if si == s.len() {
            return true;
        }
        match star {
            Some((sp, ss)) if ss < s.len() => {
                star = Some((sp, ss + 1));
                pi = sp;
                si = ss + 1;
            }
            _ => return false,
        }
    }
}

fn kleene(is_and: bool, a: &Column, b: &Column, n: usize) -> Column {
    let mut vals = Vec::with_capacity(n);
    let mut nulls = Vec::new();
    let any_nulls = !a.nulls.is_empty() || !b.nulls.is_empty();
    if any_nulls {
        nulls.reserve(n);
    }
    for i in 0..n {
        let x = (!a.is_null(i)).then(|| a.ints.get(i).copied().unwrap_or(0) != 0);
        let y = (!b.is_null(i)).then(|| b.ints.get(i).copied().unwrap_or(0) != 0);
        let r = if is_and {
            match (x, y) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            }
        } else {
            match (x, y) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            }
        };
        vals.push(r.unwrap_or(false) as i64);
        if any_nulls {
            nulls.push(r.is_none() as u8);
        }
    }
    bool_col(vals, nulls)
}

fn arith(
    op: Arith,
    a: &Column,
    at: DataType,
    b: &Column,
    bt: DataType,
    t: DataType,
    n: usize,
) -> Result<Column, FlowError> {
    let nulls = or_nulls(&a.nulls, &b.nulls, n);
    if t.is_float() {
        let fa = cast_column(a, at, DataType::Float64, n)?;
        let fb = cast_column(b, bt, DataType::Float64, n)?;
        let f32out = t == DataType::Float32;
        let vals = fa
            .floats
            .iter()
            .zip(fb.floats.iter())
            .map(|(x, y)| {
                let r = match op {
                    Arith::Add => x + y,
                    Arith::Sub => x - y,
                    Arith::Mul => x * y,
                    Arith::Div => x / y,
                    Arith::Mod => x % y,
                };
                if f32out {
                    r as f32 as f64
                } else {
                    r
                }
            })
            .collect();
        return Ok(Column {
            floats: vals,
            nulls,
            ..Column::default()
        });
    }
    if t.storage() != Storage::Ints
        || at.storage() != Storage::Ints
        || bt.storage() != Storage::Ints
    {
        return Err(bad(format!("arithmetic on {at} and {bt} is not supported")));
    }
    let unsigned = t == DataType::UInt64;
    let mut vals = Vec::with_capacity(n);
    let (xa, xb) = (&a.ints, &b.ints);
    match op {
        Arith::Add => vals.extend(
            xa.iter()
                .zip(xb.iter())
                .map(|(x, y)| t.wrap_int(x.wrapping_add(*y))),
        ),
        Arith::Sub => vals.extend(
            xa.iter()
                .zip(xb.iter())
                .map(|(x, y)| t.wrap_int(x.wrapping_sub(*y))),
        ),
        Arith::Mul => vals.extend(
            xa.iter()
                .zip(xb.iter())
                .map(|(x, y)| t.wrap_int(x.wrapping_mul(*y))),
        ),
        Arith::Div | Arith::Mod => {
            for i in 0..n {
                let (x, y) = (
                    xa.get(i).copied().unwrap_or(0),
                    xb.get(i).copied().unwrap_or(0),
                );
                let null = nulls.get(i).is_some_and(|v| *v != 0);
                if y == 0 {
                    if null {
                        vals.push(0);
                        continue;
                    }
                    return Err(err_div0());
                }
                let r = if unsigned {
                    let (x, y) = (x as u64, y as u64);
                    (if op == Arith::Div { x / y } else { x % y }) as i64
                } else if op == Arith::Div {
                    if x == i64::MIN && y == -1 && !null && t == DataType::Int64 {
                        return Err(bad("Arrow error: Arithmetic overflow: Overflow happened on: -9223372036854775808 / -1"));
                    }
                    x.wrapping_div(y)
                } else {
                    x.wrapping_rem(y)
                };
                vals.push(t.wrap_int(r));
            }
        }
    }
    Ok(Column {
        ints: vals,
        nulls,
        ..Column::default()
    })
}

fn compare(op: Cmp, a: &Column, at: DataType, b: &Column, bt: DataType, n: usize) -> Column {
    let distinct_ops = matches!(op, Cmp::Distinct | Cmp::NotDistinct);
    let nulls = if distinct_ops {
        Vec::new()
    } else {
        or_nulls(&a.nulls, &b.nulls, n)
    };
    let test = |o: Ordering| -> bool {
        match op {
            Cmp::Eq | Cmp::NotDistinct => o == Ordering::Equal,
            Cmp::Ne | Cmp::Distinct => o != Ordering::Equal,
            Cmp::Lt => o == Ordering::Less,
            Cmp::Le => o != Ordering::Greater,
            Cmp::Gt => o == Ordering::Greater,
            Cmp::Ge => o != Ordering::Less,
        }
    };
    let fast_int = at.storage() == Storage::Ints
        && bt.storage() == Storage::Ints
        && at != DataType::UInt64
        && bt != DataType::UInt64
        && !distinct_ops;
    let vals: Vec<i64> = if fast_int {
        a.ints
            .iter()
            .zip(b.ints.iter())
            .map(|(x, y)| test(x.cmp(y)) as i64)
            .collect()
    } else {
        (0..n)
            .map(|i| {
                let (x, y) = (get(a, at.storage(), i), get(b, bt.storage(), i));
                match (x.is_null(), y.is_null()) {
                    (false, false) => cmp_s(x, y, at, bt).is_some_and(test) as i64,
                    (xn, yn) => {
                        if distinct_ops {
                            let same = xn && yn;
                            (if op == Cmp::NotDistinct { same } else { !same }) as i64
                        } else {
                            0
                        }
                    }
                }
            })
            .collect()
    };
    bool_col(vals, nulls)
}

fn eval_case(
    whens: &[(Expr, Expr)],
    els: Option<&Expr>,
    t: DataType,
    c: &Chunk,
) -> Result<Column, FlowError> {
    let n = c.rows;
    // Which branch produced each row, and the branch outputs (evaluated on matching rows only,
    // so that e.g. a division guarded by the WHEN is never evaluated on rows it does not cover).
    let mut remaining: Vec<u32> = (0..n as u32).collect();
    let mut pieces: Vec<(Vec<u32>, Column)> = Vec::new();
    let col_types = chunk_types_unknown(c);
    for (cond, then) in whens {
        if remaining.is_empty() {
            break;
        }
        let sub = take_chunk(c, &col_types, &remaining);
        let cv = cond.eval(&sub)?;
        let mut hit = Vec::new();
        let mut rest = Vec::new();
        for (j, &row) in remaining.iter().enumerate() {
            if !cv.is_null(j) && cv.ints.get(j).copied().unwrap_or(0) != 0 {
                hit.push(row);
            } else {
                rest.push(row);
            }
        }
        if !hit.is_empty() {
            let sub = take_chunk(c, &col_types, &hit);
            let v = then.eval(&sub)?;
            let v = cast_column(&v, then.ty(), t, hit.len())?;
            pieces.push((hit, v));
        }
        remaining = rest;
    }
    if !remaining.is_empty() {
        if let Some(e) = els {
            let sub = take_chunk(c, &col_types, &remaining);
            let v = e.eval(&sub)?;
            let v = cast_column(&v, e.ty(), t, remaining.len())?;
            pieces.push((remaining, v));
        }
    }
    // Scatter.
    let mut src: Vec<Option<(usize, usize)>> = vec![None; n];
    for (pi, (rows, _)) in pieces.iter().enumerate() {
        for (j, &r) in rows.iter().enumerate() {
            if let Some(slot) = src.get_mut(r as usize) {
                *slot = Some((pi, j));
            }
        }
    }
    let mut b = ColBuilder::new(t, n);
    for s in src {
        match s.and_then(|(pi, j)| pieces.get(pi).map(|p| get(&p.1, t.storage(), j))) {
            Some(v) => b.push(v),
            None => b.push_null(),
        }
    }
    Ok(b.finish())
}

/// Recovers each column's storage from its contents (chunks do not carry types).
fn chunk_types_unknown(c: &Chunk) -> Vec<DataType> {
    c.cols
        .iter()
        .map(|col| {
            if !col.offsets.is_empty() {
                DataType::Binary
            } else if !col.floats.is_empty() {
                DataType::Float64
            } else {
                DataType::Int64
            }
        })
        .collect()
}

/// Casts a column between types, following Arrow's (non-safe) cast rules for the supported pairs.
pub(crate) fn cast_column(
    v: &Column,
    from: DataType,
    to: DataType,
    n: usize,
) -> Result<Column, FlowError> {
    if from == to {
        return Ok(v.clone());
    }
    let nulls = v.nulls.clone();
    let ints = |vals: Vec<i64>| Column {
        ints: vals,
        nulls: nulls.clone(),
        ..Column::default()
    };
    let cast_err = |what: String| bad(format!("Cast error: {what}"));
    match (from.storage(), to.storage()) {
        (Storage::Ints, Storage::Ints) => {
            let mut out = Vec::with_capacity(n);
            // Date32 targets (from timestamps or integers) must fit 32 bits like the integers.
            let check_range = to.wraps() && to != DataType::Boolean;
            for (i, x) in v.ints.iter().enumerate() {
                let x = *x;
                let null = v.is_null(i);
                let r = if let (Some(fu), Some(tu)) =
                    (from.timestamp_unit_nanos(), to.timestamp_unit_nanos())
                {
                    if fu >= tu {
                        x.wrapping_mul(fu / tu)
                    } else {
                        x / (tu / fu)
                    }
                } else if from == DataType::Date32 && to.is_timestamp() {
                    let per_day = 86_400_000_000_000 / to.timestamp_unit_nanos().unwrap_or(1);
                    x.wrapping_mul(per_day)
                } else if from.is_timestamp() && to == DataType::Date32 {
                    let per_day = 86_400_000_000_000 / from.timestamp_unit_nanos().unwrap_or(1);
                    x.div_euclid(per_day)
                } else if to == DataType::Boolean {
                    (x != 0) as i64
                } else if to.is_integer() {
                    let wrapped = to.wrap_int(x);
                    let fits = if from == DataType::UInt64 && to != DataType::UInt64 {
                        x >= 0 && wrapped == x
                    } else if to == DataType::UInt64 {
                        from == DataType::UInt64 || x >= 0
                    } else {
                        wrapped == x
                    };
                    if !fits && !null {
                        return Err(cast_err(format!("Can't cast value {x} to type {to}")));
                    }
                    wrapped
                } else {
                    x
                };
                let r = if check_range && to.wrap_int(r) != r {
                    if !null {
                        return Err(cast_err(format!("Can't cast value {x} to type {to}")));
                    }
                    to.wrap_int(r)
                } else {
                    r
                };
                out.push(r);
            }
            Ok(ints(out))
        }
        (Storage::Ints, Storage::Floats) => {
            let f32out = to == DataType::Float32;
            Ok(Column {
                floats: v
                    .ints
                    .iter()
                    .map(|x| {
                        let f = int_as_f64(*x, from);
                        if f32out {
                            f as f32 as f64
                        } else {
                            f
                        }
                    })
                    .collect(),
                nulls,
                ..Column::default()
            })
        }
        (Storage::Floats, Storage::Floats) => Ok(Column {
            floats: v.floats.iter().map(|x| *x as f32 as f64).collect(),
            nulls,
            ..Column::default()
        }),
        (Storage::Floats, Storage::Ints) if to.is_integer() || to == DataType::Boolean => {
            let mut out = Vec::with_capacity(n);
            for (i, x) in v.floats.iter().enumerate() {
                if to == DataType::Boolean {
                    out.push((*x != 0.0) as i64);
                    continue;
                }
                let tr = x.trunc();
                let ok = tr.is_finite()
                    && if to == DataType::UInt64 {
                        (0.0..18_446_744_073_709_551_616.0).contains(&tr)
                    } else {
                        (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&tr)
                            && to.wrap_int(tr as i64) == tr as i64
                    };
                if !ok && !v.is_null(i) {
                    return Err(cast_err(format!("Can't cast value {x} to type {to}")));
                }
                out.push(if to == DataType::UInt64 {
                    tr as u64 as i64
                } else {
                    tr as i64
                });
            }
            Ok(ints(out))
        }
        (Storage::Ints, Storage::Bytes) | (Storage::Floats, Storage::Bytes) => {
            let mut b = ColBuilder::new(to, n);
            for i in 0..n {
                match get(v, from.storage(), i) {
                    S::Null => b.push_null(),
                    S::I(x) => {
                        let s = if from == DataType::Boolean {
                            (if x != 0 { "true" } else { "false" }).to_string()
                        } else if from == DataType::UInt64 {
                            (x as u64).to_string()
                        } else if from.is_integer() {
                            x.to_string()
                        } else {
                            return Err(cast_err(format!(
                                "casting {from} to {to} is not supported"
                            )));
                        };
                        b.push_str(&s);
                    }
                    S::F(x) => b.push_str(&format_float(x)),
                    S::B(_) => b.push_null(),
                }
            }
            Ok(b.finish())
        }
        (Storage::Bytes, Storage::Bytes) if from == DataType::Binary && to == DataType::Utf8 => {
            let mut b = ColBuilder::new(to, n);
            for i in 0..n {
                if v.is_null(i) {
                    b.push_null();
                    continue;
                }
                let s = std::str::from_utf8(v.bytes_at(i)).map_err(|_| {
                    cast_err("Cannot cast binary to string: not valid UTF-8".into())
                })?;
                b.push_str(s);
            }
            Ok(b.finish())
        }
        (Storage::Bytes, Storage::Bytes) => Ok(v.clone()),
        (Storage::Bytes, Storage::Ints) | (Storage::Bytes, Storage::Floats)
            if from == DataType::Utf8 && (to.is_numeric() || to == DataType::Boolean) =>
        {
            let mut b = ColBuilder::new(to, n);
            for i in 0..n {
                if v.is_null(i) {
                    b.push_null();
                    continue;
                }
                let s = String::from_utf8_lossy(v.bytes_at(i));
                let s = s.trim();
                let bad_value =
                    || cast_err(format!("Cannot cast string '{s}' to value of {to} type"));
                if to == DataType::Boolean {
                    match s.to_ascii_lowercase().as_str() {
                        "true" | "t" | "1" | "yes" | "on" => b.push(S::I(1)),
                        "false" | "f" | "0" | "no" | "off" => b.push(S::I(0)),
                        _ => return Err(bad_value()),
                    }
                } else if to.is_float() {
                    let f: f64 = s.parse().map_err(|_| bad_value())?;
                    b.push(S::F(if to == DataType::Float32 {
                        f as f32 as f64
                    } else {
                        f
                    }));
                } else if to == DataType::UInt64 {
                    let x: u64 = s.parse().map_err(|_| bad_value())?;
                    b.push(S::I(x as i64));
                } else {
                    let x: i64 = s.parse().map_err(|_| bad_value())?;
                    if to.wrap_int(x) != x || (to.is_unsigned_int() && x < 0) {
                        return Err(bad_value());
                    }
                    b.push(S::I(x));
                }
            }
            Ok(b.finish())
        }
        _ => Err(cast_err(format!("casting {from} to {to} is not supported"))),
    }
}

/// Whether [`cast_column`] handles a pair of types.
pub(crate) fn cast_supported(from: DataType, to: DataType) -> bool {
    use Storage::*;
    if from == to {
        return true;
    }
    match (from.storage(), to.storage()) {
        (Ints, Ints) => {
            let tsish = |t: DataType| t.is_timestamp() || t == DataType::Date32;
            if tsish(from) && tsish(to) {
                true
            } else {
                !(tsish(to) && from == DataType::Boolean)
            }
        }
        (Ints, Floats) => !from.is_timestamp() && from != DataType::Date32,
        (Floats, Floats) => true,
        (Floats, Ints) => to.is_integer() || to == DataType::Boolean,
        (Ints, Bytes) => from.is_integer() || from == DataType::Boolean,
        (Floats, Bytes) => true,
        (Bytes, Bytes) => true,
        (Bytes, _) => from == DataType::Utf8 && (to.is_numeric() || to == DataType::Boolean),
    }
}

fn format_float(x: f64) -> String {
    if x.is_nan() {
        "NaN".to_string()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.to_string()
    } else if x == x.trunc() && x.abs() < 1e16 {
        format!("{x:.1}")
    } else {
        format!("{x}")
    }
}

#[cfg(test)]
mod date_bin_tests {
    use super::{date_trunc_column, date_trunc_ns, DateBins, TruncUnit};

    /// Values around zero, a minute, a day, now, and the ends of an i64.
    const EDGES: [i64; 13] = [
        i64::MIN,
        i64::MIN + 1,
        -86_400_001,
        -60_001,
        -60_000,
        -1,
        0,
        1,
        59_999,
        60_000,
        1_767_225_600_123,
        i64::MAX - 1,
        i64::MAX,
    ];

    #[test]
    fn date_trunc_in_64_bits_is_what_it_is_in_nanoseconds() {
        let xs = EDGES;
        let units = [1, 1_000, 1_000_000, 1_000_000_000];
        let all = [
            TruncUnit::Microsecond,
            TruncUnit::Millisecond,
            TruncUnit::Second,
            TruncUnit::Minute,
            TruncUnit::Hour,
            TruncUnit::Day,
            TruncUnit::Week,
            TruncUnit::Month,
        ];
        for u in all {
            for unit in units {
                for out_unit in units {
                    let got = date_trunc_column(&xs, u, unit, out_unit);
                    for (x, g) in xs.iter().zip(got) {
                        let wide =
                            (date_trunc_ns(*x as i128 * unit, u).div_euclid(out_unit)) as i64;
                        assert_eq!(
                            g, wide,
                            "date_trunc({u:?}, {x}) in {unit} ns, out {out_unit} ns"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_unit_path_bins_exactly_as_nanoseconds_do() {
        let xs = EDGES;
        let ms = 1_000_000;
        for (unit, stride, origin, out_unit) in [
            (ms, 60_000 * ms, 0, ms),
            (ms, 60_000 * ms, 7 * ms, ms),
            (ms, 60_000 * ms, -30_000 * ms, ms),
            (ms, 7 * ms, 3 * ms, ms),
            (1_000_000_000, 86_400_000_000_000, 0, 1_000_000_000),
            (1, 1_000, 0, 1),
            (1_000, 1_000_000, 500, 1_000), // an origin inside a unit: general path
            (ms, 60_000 * ms, 0, 1),        // another output unit: general path
            (ms, 0, 0, ms),                 // no stride: the value itself
        ] {
            let bins = DateBins::new(unit, stride, origin, out_unit);
            for x in xs {
                // Values whose nanoseconds do not fit an i64 are out of range
                // for a timestamp column of that unit anyway.
                if (x as i128 * unit as i128).abs() > i64::MAX as i128 {
                    continue;
                }
                assert_eq!(
                    bins.bin(x),
                    bins.bin_wide(x),
                    "date_bin of {x} (unit {unit} ns, stride {stride}, origin {origin})"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_patterns() {
        let m = |s: &str, p: &str| {
            like_match(
                &s.chars().collect::<Vec<_>>(),
                &p.chars().collect::<Vec<_>>(),
                '\\',
            )
        };
        assert!(m("hello", "h%"));
        assert!(m("hello", "%llo"));
        assert!(m("hello", "h_llo"));
        assert!(!m("hello", "h_lo"));
        assert!(m("", "%"));
        assert!(m("a%b", "a\\%b"));
        assert!(!m("axb", "a\\%b"));
        assert!(m("abcabc", "%b%c"));
    }

    #[test]
    fn casts_give_values_of_the_target_type() {
        let binary = crate::types::Batch::from_rows(
            &[crate::types::Field::new("b", DataType::Binary, true)],
            &[
                vec![crate::types::Value::Bytes(b"ok".to_vec())],
                vec![crate::types::Value::Null],
            ],
            &[0, 0],
            &[1, 1],
        )
        .unwrap();
        let mut col = binary.columns[0].clone();
        let s = cast_column(&col, DataType::Binary, DataType::Utf8, 2).unwrap();
        assert_eq!(s.bytes_at(0), b"ok");
        assert!(s.is_null(1));
        // Bytes held by a NULL row do not reach the string column.
        col.bytes.push(0xff);
        if let Some(last) = col.offsets.last_mut() {
            *last += 1;
        }
        let s = cast_column(&col, DataType::Binary, DataType::Utf8, 2).unwrap();
        let b = crate::types::Batch {
            rows: 2,
            columns: vec![s],
            times: vec![0, 0],
            diffs: vec![1, 1],
        };
        let fields = [crate::types::Field::new("s", DataType::Utf8, true)];
        crate::types::validate_batch(&fields, &b).unwrap();
        // Invalid UTF-8 in a row is a cast error, as in Arrow.
        col.nulls.clear();
        assert!(cast_column(&col, DataType::Binary, DataType::Utf8, 2).is_err());
        // Date32 is 32 bits wide, from integers and from timestamps.
        let ints = Column {
            ints: vec![1 << 62],
            ..Column::default()
        };
        assert!(cast_column(&ints, DataType::Int64, DataType::Date32, 1).is_err());
        assert!(cast_column(&ints, DataType::TimestampSecond, DataType::Date32, 1).is_err());
        let ok = cast_column(&ints, DataType::TimestampNanosecond, DataType::Date32, 1).unwrap();
        assert_eq!(ok.ints, vec![(1i64 << 62) / 86_400_000_000_000]);
        let null = Column {
            ints: vec![1 << 40],
            nulls: vec![1],
            ..Column::default()
        };
        let wrapped = cast_column(&null, DataType::Int64, DataType::Date32, 1).unwrap();
        assert_eq!(DataType::Date32.wrap_int(wrapped.ints[0]), wrapped.ints[0]);
    }

    #[test]
    fn civil_round_trip() {
        for d in [-800_000i64, -1, 0, 1, 59, 365, 11_016, 20_000, 2_932_896] {
            let (y, m, dd) = civil_from_days(d);
            assert_eq!(days_from_civil(y, m, dd), d);
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
    }
}
