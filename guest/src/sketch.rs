//! Exact, invertible accumulators for GreptimeDB's sketch SQL functions.
//!
//! A flow maintains aggregates incrementally under inserts *and* deletes, so
//! every accumulator here takes a signed multiplicity (`diff`, +n / -n) and,
//! after any sequence of adds and removes, produces **the same bytes** a fresh
//! accumulator would produce over the current multiset of inputs.
//!
//! # HyperLogLog: `hll(x)`, `hll_merge(state)`, `hll_count(state)`
//!
//! * `hll(x)` (aggregate -> BINARY) sketches the distinct values of `x`;
//!   `hll_merge(state)` (aggregate -> BINARY) unions `hll` states;
//!   `hll_count(state)` (scalar -> UInt64) estimates the number of distinct
//!   values. Both aggregates are [`HllAcc`]; the scalar is [`hll_count`].
//! * **Hashing rule.** A value is hashed as `xxh3_64` (seed 0) of its
//!   canonical bytes ([`hll_hash_bytes`]):
//!   signed integers -> `i64` little-endian; unsigned integers -> `u64`
//!   little-endian; floats -> `f64::to_bits` little-endian after turning
//!   `-0.0` into `0.0` and every NaN into `f64::NAN`; strings -> their UTF-8
//!   bytes; binary -> the raw bytes; booleans -> `[0]` / `[1]`.
//!   The `hll_hash_*` helpers apply this rule. (So `5_i64` and `5_u64` hash
//!   alike, and so do the string `"a"` and the binary `b"a"`.)
//! * Precision p = 14 (16384 registers). The register index is the top 14
//!   bits of the hash; rho is the number of leading zeros of the remaining
//!   50 bits plus one (1..=51).
//! * Estimate: if some registers are zero and linear counting
//!   `m * ln(m / V)` is at most 11500 (HLL++'s threshold for p = 14), that
//!   value; otherwise Ertl's improved raw estimator ("New cardinality
//!   estimation algorithms for HyperLogLog sketches", 2017), which needs no
//!   bias tables and has no large-range correction. Rounded to u64.
//! * State format (version 1), all integers little-endian:
//!   `b"SFHL"`, version `1`, precision `14`, encoding byte, then either
//!   - encoding `0` (sparse): `u32` n, then n x (`u16` register, `u8` rho),
//!     registers strictly increasing, rho in 1..=51, only nonzero registers;
//!   - encoding `1` (dense): 16384 register bytes, each in 0..=51.
//!
//!   The encoder picks sparse whenever it is smaller than dense; the decoder
//!   accepts both, checks every field and the exact length, and never panics.
//!
//! # UDDSketch: `uddsketch_state`, `uddsketch_merge`, `uddsketch_calc`
//!
//! * `uddsketch_state(max_buckets, error_rate, value)` (aggregate -> BINARY)
//!   and `uddsketch_merge(max_buckets, error_rate, state)` (aggregate ->
//!   BINARY) are [`UddAcc`]; `uddsketch_calc(quantile, state)` (scalar ->
//!   Float64, NULL for an empty sketch) is [`uddsketch_calc`].
//! * The numbers are those of GreptimeDB, which computes these functions
//!   with the `uddsketch-rs` crate (a rewrite of Timescale's UDDSketch that
//!   replaced `timescaledb-toolkit`'s `uddsketch`): `gamma = (1+a)/(1-a)`;
//!   a value `v` goes to the zero bucket if `v == 0`, to a signed infinity
//!   bucket (index `i64::MAX`) if infinite, and otherwise to the bucket
//!   `ceil(ln|v| * inv_ln_gamma)` of its sign, NaN is rejected. One
//!   compaction maps index `i` to `ceil(i / 2)`, squares gamma, halves
//!   `inv_ln_gamma` and sets `a = 2a / (1 + a^2)`; a sketch compacts while it
//!   has more than `max_buckets` buckets. `uddsketch_calc(q)` walks buckets in
//!   value order to the nearest rank `min(floor(n*q) + 1, n)` (computed
//!   exactly) and returns `gamma^(i-1) * (1+a)` (negated for negative
//!   buckets, 0 for zero, +-inf for the infinity buckets).
//! * Limits (GreptimeDB's): `max_buckets` in 7..=1_000_000, `error_rate`
//!   finite in [1e-12, 1), quantile in [0, 1]. Merging states whose
//!   `max_buckets` or `error_rate` differ from the arguments is an error;
//!   empty states are ignored.
//! * State format (version 1), all integers little-endian:
//!   `b"SFUD"`, version `1`, `u8` compaction level, `u32` max_buckets,
//!   `u64` error-rate bits, `u64` count, `u32` n, then n x (`u8` sign tag
//!   0 = negative / 1 = zero / 2 = positive, `i64` index, `u64` count) in
//!   increasing value order. The sum of the values is not kept: no function
//!   here reads it, and a float sum would depend on the order of updates.
//!
//! # Why the accumulators are exact under deletes
//!
//! * HLL registers are maxima, which cannot be undone, so [`HllAcc`] keeps a
//!   signed multiplicity per `(register, rho)` pair instead. A register of
//!   the output is the largest rho whose multiplicity is positive, which is
//!   exactly the register of a fresh sketch (or of a fresh register-wise max
//!   merge of states) over the inputs that are currently present.
//! * [`UddAcc`] keeps a signed multiplicity per `(level, bucket key)`: values
//!   enter at level 0, a state's buckets at the state's level. The key of a
//!   value at level `L` is `ceil(x * 2^-L)` with `x = ln|v| * inv_ln_gamma`,
//!   and scaling by a power of two is exact in binary floating point, so it
//!   equals the level-0 key compacted `L` times: compaction commutes with
//!   insertion. A fresh sketch therefore ends at the smallest level that is
//!   at least the highest level of its inputs and at which the compacted
//!   keys fit in `max_buckets` (it only compacts when the keys of a subset,
//!   hence of the whole, do not fit at the current level), whatever the
//!   order of the adds and merges. [`UddAcc::state`] computes exactly that
//!   from the multiplicities. (Timescale's own crate computes the key at
//!   level `L` as `ln|v| / ln(gamma_L)` with `gamma_L` squared `L` times, so
//!   there the result can depend on insertion order near bucket
//!   boundaries; `uddsketch-rs`, and this module, do not.)

use std::cmp::Ordering;
use std::collections::BTreeMap;

// ---------------------------------------------------------------------------
// HyperLogLog
// ---------------------------------------------------------------------------

/// HLL precision: the register index takes the top `HLL_PRECISION` hash bits.
pub const HLL_PRECISION: u32 = 14;
/// Number of HLL registers (2^14).
pub const HLL_REGISTERS: usize = 1 << HLL_PRECISION;
/// Largest rho: 50 remaining bits, all zero, plus one.
const HLL_MAX_RHO: u8 = (64 - HLL_PRECISION + 1) as u8;
const HLL_MAGIC: &[u8; 4] = b"SFHL";
const HLL_VERSION: u8 = 1;
const HLL_SPARSE: u8 = 0;
const HLL_DENSE: u8 = 1;
const HLL_HEADER_LEN: usize = 7;
/// HLL++'s linear-counting threshold for p = 14.
const HLL_LINEAR_COUNTING_THRESHOLD: f64 = 11500.0;

/// `xxh3_64` (seed 0) of a value's canonical bytes; see the module docs.
pub fn hll_hash_bytes(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Hash of a signed integer (any width, widened to `i64`).
pub fn hll_hash_i64(value: i64) -> u64 {
    hll_hash_bytes(&value.to_le_bytes())
}

/// Hash of an unsigned integer (any width, widened to `u64`).
pub fn hll_hash_u64(value: u64) -> u64 {
    hll_hash_bytes(&value.to_le_bytes())
}

/// Hash of a float (`f32` widened to `f64`): `-0.0` hashes as `0.0`, every NaN alike.
pub fn hll_hash_f64(value: f64) -> u64 {
    let canonical = if value.is_nan() {
        f64::NAN
    } else if value == 0.0 {
        0.0
    } else {
        value
    };
    hll_hash_bytes(&canonical.to_bits().to_le_bytes())
}

/// Hash of a string: its UTF-8 bytes.
pub fn hll_hash_str(value: &str) -> u64 {
    hll_hash_bytes(value.as_bytes())
}

/// Hash of a boolean: `[0]` or `[1]`.
pub fn hll_hash_bool(value: bool) -> u64 {
    hll_hash_bytes(&[u8::from(value)])
}

/// Splits a hash into (register index, rho).
fn hll_split(hash: u64) -> (u16, u8) {
    let register = (hash >> (64 - HLL_PRECISION)) as u16;
    let rest = hash << HLL_PRECISION;
    let rho = if rest == 0 {
        HLL_MAX_RHO
    } else {
        rest.leading_zeros() as u8 + 1
    };
    (register, rho)
}

/// Invertible accumulator behind `hll(x)` and `hll_merge(state)`.
///
/// Keeps a signed multiplicity per `(register, rho)` pair; pairs whose
/// multiplicity returns to zero are dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HllAcc {
    counts: BTreeMap<(u16, u8), i128>,
}

impl HllAcc {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    fn bump(&mut self, pair: (u16, u8), diff: i128) {
        if diff == 0 {
            return;
        }
        let entry = self.counts.entry(pair).or_insert(0);
        *entry += diff;
        if *entry == 0 {
            self.counts.remove(&pair);
        }
    }

    /// Adds (`diff > 0`) or removes (`diff < 0`) `|diff|` copies of a hashed value.
    pub fn add_hash(&mut self, hash: u64, diff: i64) {
        self.bump(hll_split(hash), i128::from(diff));
    }

    /// Adds or removes a value given by its canonical bytes (see the module docs).
    pub fn add_bytes(&mut self, bytes: &[u8], diff: i64) {
        self.add_hash(hll_hash_bytes(bytes), diff);
    }

    /// Adds or removes `|diff|` copies of an HLL state (`hll_merge`): each of
    /// its nonzero `(register, rho)` pairs counts once per copy.
    pub fn add_state(&mut self, state: &[u8], diff: i64) -> Result<(), String> {
        let registers = hll_decode(state)?;
        for (register, &rho) in registers.iter().enumerate() {
            if rho != 0 {
                self.bump((register as u16, rho), i128::from(diff));
            }
        }
        Ok(())
    }

    /// True when every multiplicity is zero (nothing is present).
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// True when some multiplicity is negative (more removes than adds so far).
    pub fn has_negative(&self) -> bool {
        self.counts.values().any(|&count| count < 0)
    }

    /// The 16384 registers: each is the largest rho with a positive multiplicity.
    pub fn registers(&self) -> Vec<u8> {
        let mut registers = vec![0_u8; HLL_REGISTERS];
        for (&(register, rho), &count) in &self.counts {
            let slot = &mut registers[usize::from(register)];
            if count > 0 && rho > *slot {
                *slot = rho;
            }
        }
        registers
    }

    /// The state bytes (format version 1) of the inputs currently present.
    pub fn state(&self) -> Vec<u8> {
        hll_encode(&self.registers())
    }
}

/// Encodes 16384 registers (sparse when that is smaller).
fn hll_encode(registers: &[u8]) -> Vec<u8> {
    debug_assert_eq!(registers.len(), HLL_REGISTERS);
    let nonzero = registers.iter().filter(|&&rho| rho != 0).count();
    let sparse_len = 4 + 3 * nonzero;
    let mut out = Vec::with_capacity(HLL_HEADER_LEN + sparse_len.min(HLL_REGISTERS));
    out.extend_from_slice(HLL_MAGIC);
    out.push(HLL_VERSION);
    out.push(HLL_PRECISION as u8);
    if sparse_len < HLL_REGISTERS {
        out.push(HLL_SPARSE);
        out.extend_from_slice(&(nonzero as u32).to_le_bytes());
        for (register, &rho) in registers.iter().enumerate() {
            if rho != 0 {
                out.extend_from_slice(&(register as u16).to_le_bytes());
                out.push(rho);
            }
        }
    } else {
        out.push(HLL_DENSE);
        out.extend_from_slice(registers);
    }
    out
}

/// Checks a state's magic, version and least length (`format`), naming the
/// functions that make such states (`producers`) when it is not one.
fn check_header(
    state: &[u8],
    (magic, version, header_len): (&[u8], u8, usize),
    what: &str,
    producers: &str,
) -> Result<(), String> {
    if state.len() < header_len || state.get(..magic.len()) != Some(magic) {
        return Err(format!(
            "{what}: not produced by {producers} (bad header, {} bytes)",
            state.len()
        ));
    }
    match state.get(magic.len()) {
        Some(&v) if v == version => Ok(()),
        v => Err(format!(
            "{what}: unsupported format version {} (this build reads version {version})",
            v.copied().unwrap_or_default()
        )),
    }
}

/// Decodes an HLL state into its 16384 registers, rejecting anything malformed.
fn hll_decode(state: &[u8]) -> Result<Vec<u8>, String> {
    const WHAT: &str = "invalid HLL state";
    check_header(
        state,
        (HLL_MAGIC, HLL_VERSION, HLL_HEADER_LEN),
        WHAT,
        "hll() or hll_merge()",
    )?;
    if u32::from(state[5]) != HLL_PRECISION {
        return Err(format!(
            "{WHAT}: precision {} is not supported (only {HLL_PRECISION})",
            state[5]
        ));
    }
    let body = &state[HLL_HEADER_LEN..];
    let mut registers = vec![0_u8; HLL_REGISTERS];
    match state[6] {
        HLL_SPARSE => {
            let Some(n) = body.get(..4) else {
                return Err(format!("{WHAT}: truncated sparse header"));
            };
            let n = u32::from_le_bytes([n[0], n[1], n[2], n[3]]) as usize;
            if n > HLL_REGISTERS {
                return Err(format!(
                    "{WHAT}: {n} sparse entries exceed {HLL_REGISTERS} registers"
                ));
            }
            let entries = &body[4..];
            if entries.len() != 3 * n {
                return Err(format!(
                    "{WHAT}: {n} sparse entries need {} bytes, found {}",
                    3 * n,
                    entries.len()
                ));
            }
            let mut previous: Option<u16> = None;
            for entry in entries.chunks_exact(3) {
                let register = u16::from_le_bytes([entry[0], entry[1]]);
                let rho = entry[2];
                if usize::from(register) >= HLL_REGISTERS {
                    return Err(format!("{WHAT}: register {register} out of range"));
                }
                if previous.is_some_and(|p| p >= register) {
                    return Err(format!(
                        "{WHAT}: sparse registers are not strictly increasing"
                    ));
                }
                if rho == 0 || rho > HLL_MAX_RHO {
                    return Err(format!(
                        "{WHAT}: register value {rho} outside 1..={HLL_MAX_RHO}"
                    ));
                }
                registers[usize::from(register)] = rho;
                previous = Some(register);
            }
        }
        HLL_DENSE => {
            if body.len() != HLL_REGISTERS {
                return Err(format!(
                    "{WHAT}: dense state needs {HLL_REGISTERS} register bytes, found {}",
                    body.len()
                ));
            }
            if let Some(&rho) = body.iter().find(|&&rho| rho > HLL_MAX_RHO) {
                return Err(format!(
                    "{WHAT}: register value {rho} outside 0..={HLL_MAX_RHO}"
                ));
            }
            registers.copy_from_slice(body);
        }
        other => return Err(format!("{WHAT}: unknown encoding {other}")),
    }
    Ok(registers)
}

/// `hll_count(state)`: the estimated number of distinct values, rounded.
pub fn hll_count(state: &[u8]) -> Result<u64, String> {
    Ok(hll_estimate(&hll_decode(state)?).round() as u64)
}

/// Cardinality estimate of 16384 registers (see the module docs).
fn hll_estimate(registers: &[u8]) -> f64 {
    let m = registers.len() as f64;
    let mut histogram = [0_u32; HLL_MAX_RHO as usize + 1];
    for &rho in registers {
        histogram[usize::from(rho)] += 1;
    }
    let zeros = histogram[0];
    if zeros > 0 {
        let linear = m * (m / f64::from(zeros)).ln();
        if linear <= HLL_LINEAR_COUNTING_THRESHOLD {
            return linear;
        }
    }
    // Ertl 2017, algorithm 6; q = 64 - p, registers range over 0..=q+1.
    let q = usize::from(HLL_MAX_RHO) - 1;
    let mut z = m * ertl_tau(1.0 - f64::from(histogram[q + 1]) / m);
    for k in (1..=q).rev() {
        z = 0.5 * (z + f64::from(histogram[k]));
    }
    z += m * ertl_sigma(f64::from(zeros) / m);
    m * m / (2.0 * std::f64::consts::LN_2) / z
}

fn ertl_sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let previous = z;
        z += x * y;
        y += y;
        if z == previous {
            return z;
        }
    }
}

fn ertl_tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let previous = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == previous {
            return z / 3.0;
        }
    }
}

// ---------------------------------------------------------------------------
// UDDSketch
// ---------------------------------------------------------------------------

/// Smallest `max_buckets` (GreptimeDB's limit: both signs' finite and
/// infinite buckets plus zero must fit after full compaction).
pub const UDD_MIN_BUCKETS: u32 = 7;
/// Largest `max_buckets` GreptimeDB accepts.
pub const UDD_MAX_BUCKETS: u32 = 1_000_000;
/// Smallest accepted error rate.
pub const UDD_MIN_ERROR: f64 = 1e-12;
const UDD_MAX_LEVEL: u8 = 63;
const UDD_INFINITY_INDEX: i64 = i64::MAX;
const UDD_MAGIC: &[u8; 4] = b"SFUD";
const UDD_VERSION: u8 = 1;
const UDD_HEADER_LEN: usize = 30;
const UDD_BUCKET_LEN: usize = 17;

/// A bucket: ordered by the values it holds (negative indices descend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum UddKey {
    Negative(i64),
    Zero,
    Positive(i64),
}

impl Ord for UddKey {
    fn cmp(&self, other: &Self) -> Ordering {
        use UddKey::{Negative, Positive, Zero};
        match (self, other) {
            (Negative(a), Negative(b)) => b.cmp(a),
            (Positive(a), Positive(b)) => a.cmp(b),
            (Zero, Zero) => Ordering::Equal,
            (Negative(_), _) | (Zero, Positive(_)) => Ordering::Less,
            (_, Negative(_)) | (Positive(_), Zero) => Ordering::Greater,
        }
    }
}

impl PartialOrd for UddKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// `ceil(index / 2^levels)`, the index after `levels` compactions; the
/// infinity sentinel stays put.
fn udd_compact_index(index: i64, levels: u8) -> i64 {
    if index == UDD_INFINITY_INDEX || levels == 0 {
        return index;
    }
    let divisor = 1_i128 << levels;
    (i128::from(index) + divisor - 1).div_euclid(divisor) as i64
}

impl UddKey {
    fn compact(self, levels: u8) -> Self {
        match self {
            UddKey::Negative(index) => UddKey::Negative(udd_compact_index(index, levels)),
            UddKey::Zero => UddKey::Zero,
            UddKey::Positive(index) => UddKey::Positive(udd_compact_index(index, levels)),
        }
    }
}

/// The value-to-bucket mapping at one compaction level.
#[derive(Clone, Copy, Debug)]
struct UddMapping {
    alpha: f64,
    gamma: f64,
    inv_ln_gamma: f64,
}

impl UddMapping {
    /// The mapping after `level` compactions, computed step by step exactly as
    /// GreptimeDB does (so every float is bit-identical).
    fn at_level(error_rate: f64, level: u8) -> Self {
        let gamma = (1.0 + error_rate) / (1.0 - error_rate);
        let mut mapping = Self {
            alpha: error_rate,
            gamma,
            inv_ln_gamma: gamma.ln().recip(),
        };
        for _ in 0..level {
            mapping.inv_ln_gamma *= 0.5;
            mapping.gamma *= mapping.gamma;
            mapping.alpha = 2.0 * mapping.alpha / (1.0 + mapping.alpha * mapping.alpha);
        }
        mapping
    }

    /// Bucket of a value; NaN has none.
    fn key(&self, value: f64) -> Option<UddKey> {
        if value.is_nan() {
            return None;
        }
        if value == 0.0 {
            return Some(UddKey::Zero);
        }
        let index = if value.is_infinite() {
            UDD_INFINITY_INDEX
        } else {
            (value.abs().ln() * self.inv_ln_gamma).ceil() as i64
        };
        Some(if value.is_sign_negative() {
            UddKey::Negative(index)
        } else {
            UddKey::Positive(index)
        })
    }

    /// Inclusive range of indices that finite nonzero magnitudes reach.
    fn finite_index_bounds(&self) -> (i64, i64) {
        let low = (f64::from_bits(1).ln() * self.inv_ln_gamma).ceil() as i64;
        let high = (f64::MAX.ln() * self.inv_ln_gamma).ceil() as i64;
        (low, high)
    }

    /// The estimate a bucket stands for.
    fn bucket_value(&self, key: UddKey) -> f64 {
        match key {
            UddKey::Zero => 0.0,
            UddKey::Positive(UDD_INFINITY_INDEX) => f64::INFINITY,
            UddKey::Negative(UDD_INFINITY_INDEX) => f64::NEG_INFINITY,
            UddKey::Positive(index) => self.magnitude(index),
            UddKey::Negative(index) => -self.magnitude(index),
        }
    }

    /// `gamma^(i-1) * (1 + alpha)`; at the extremes of the f64 range, where
    /// that overflows or rounds out of its own bucket, a nearby value that
    /// maps back to the bucket (GreptimeDB's rule).
    fn magnitude(&self, index: i64) -> f64 {
        let maps_back = |candidate: f64| {
            candidate.is_finite()
                && candidate > 0.0
                && self.key(candidate) == Some(UddKey::Positive(index))
        };
        let representative = self.gamma.powf(index as f64 - 1.0) * (1.0 + self.alpha);
        if maps_back(representative) {
            return representative;
        }
        let lower = self.gamma.powf(index as f64 - 1.0);
        let upper = self.gamma.powf(index as f64);
        [
            representative,
            representative.next_down(),
            representative.next_up(),
            lower,
            lower.next_up(),
            upper,
            upper.next_down(),
            f64::from_bits(1),
            f64::MAX,
        ]
        .into_iter()
        .find(|&candidate| maps_back(candidate))
        .unwrap_or_else(|| representative.clamp(f64::from_bits(1), f64::MAX))
    }
}

/// Checks `uddsketch_state` / `uddsketch_merge` arguments.
fn udd_check_params(max_buckets: i64, error_rate: f64) -> Result<(u32, f64), String> {
    let buckets = u32::try_from(max_buckets)
        .ok()
        .filter(|b| (UDD_MIN_BUCKETS..=UDD_MAX_BUCKETS).contains(b))
        .ok_or_else(|| {
            format!(
                "uddsketch: max_buckets must be between {UDD_MIN_BUCKETS} and {UDD_MAX_BUCKETS}, got {max_buckets}"
            )
        })?;
    if !error_rate.is_finite() || !(UDD_MIN_ERROR..1.0).contains(&error_rate) {
        return Err(format!(
            "uddsketch: error_rate must be at least {UDD_MIN_ERROR} and below 1 (e.g. 0.01), got {error_rate}"
        ));
    }
    Ok((buckets, error_rate))
}

/// A decoded UDDSketch state.
#[derive(Clone, Debug)]
struct UddState {
    max_buckets: u32,
    error_rate: f64,
    level: u8,
    count: u64,
    buckets: Vec<(UddKey, u64)>,
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0_u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

impl UddState {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(UDD_HEADER_LEN + UDD_BUCKET_LEN * self.buckets.len());
        out.extend_from_slice(UDD_MAGIC);
        out.push(UDD_VERSION);
        out.push(self.level);
        out.extend_from_slice(&self.max_buckets.to_le_bytes());
        out.extend_from_slice(&self.error_rate.to_bits().to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&(self.buckets.len() as u32).to_le_bytes());
        for &(key, count) in &self.buckets {
            let (tag, index) = match key {
                UddKey::Negative(index) => (0_u8, index),
                UddKey::Zero => (1, 0),
                UddKey::Positive(index) => (2, index),
            };
            out.push(tag);
            out.extend_from_slice(&index.to_le_bytes());
            out.extend_from_slice(&count.to_le_bytes());
        }
        out
    }

    fn decode(state: &[u8]) -> Result<Self, String> {
        const WHAT: &str = "invalid UDDSketch state";
        check_header(
            state,
            (UDD_MAGIC, UDD_VERSION, UDD_HEADER_LEN),
            WHAT,
            "uddsketch_state() or uddsketch_merge()",
        )?;
        let level = state[5];
        if level > UDD_MAX_LEVEL {
            return Err(format!(
                "{WHAT}: compaction level {level} exceeds {UDD_MAX_LEVEL}"
            ));
        }
        let max_buckets = read_u32(state, 6);
        let error_rate = f64::from_bits(read_u64(state, 10));
        udd_check_params(i64::from(max_buckets), error_rate).map_err(|e| format!("{WHAT}: {e}"))?;
        let count = read_u64(state, 18);
        let n = read_u32(state, 26) as usize;
        if n > max_buckets as usize {
            return Err(format!(
                "{WHAT}: {n} buckets exceed its max_buckets {max_buckets}"
            ));
        }
        let body = &state[UDD_HEADER_LEN..];
        if body.len() != n * UDD_BUCKET_LEN {
            return Err(format!(
                "{WHAT}: {n} buckets need {} bytes, found {}",
                n * UDD_BUCKET_LEN,
                body.len()
            ));
        }
        let mapping = UddMapping::at_level(error_rate, level);
        let (low, high) = mapping.finite_index_bounds();
        let attainable = |index: i64| index == UDD_INFINITY_INDEX || (low..=high).contains(&index);
        let mut buckets = Vec::with_capacity(n);
        let mut total = 0_u64;
        for bucket in body.chunks_exact(UDD_BUCKET_LEN) {
            let index = read_u64(bucket, 1) as i64;
            let key = match bucket[0] {
                0 => UddKey::Negative(index),
                1 if index == 0 => UddKey::Zero,
                2 => UddKey::Positive(index),
                tag => return Err(format!("{WHAT}: bad bucket tag {tag} / index {index}")),
            };
            if let UddKey::Negative(index) | UddKey::Positive(index) = key {
                if !attainable(index) {
                    return Err(format!(
                        "{WHAT}: bucket index {index} is impossible at level {level}"
                    ));
                }
            }
            let bucket_count = read_u64(bucket, 9);
            if bucket_count == 0 {
                return Err(format!("{WHAT}: empty bucket"));
            }
            if buckets.last().is_some_and(|&(previous, _)| previous >= key) {
                return Err(format!("{WHAT}: buckets are not in increasing order"));
            }
            total = total
                .checked_add(bucket_count)
                .ok_or_else(|| format!("{WHAT}: bucket counts overflow"))?;
            buckets.push((key, bucket_count));
        }
        if total != count {
            return Err(format!(
                "{WHAT}: bucket counts add up to {total}, header says {count}"
            ));
        }
        Ok(Self {
            max_buckets,
            error_rate,
            level,
            count,
            buckets,
        })
    }
}

/// One-based nearest rank `min(floor(count * q) + 1, count)`, computed
/// exactly from the binary expansion of `q` (as GreptimeDB does).
fn udd_nearest_rank(count: u64, quantile: f64) -> u64 {
    if quantile == 1.0 {
        return count;
    }
    let bits = quantile.to_bits();
    let exponent = ((bits >> 52) & 0x7ff) as u32;
    let fraction = bits & ((1_u64 << 52) - 1);
    let (significand, shift) = if exponent == 0 {
        (fraction, 1074_u32)
    } else {
        ((1_u64 << 52) | fraction, 1075 - exponent)
    };
    let product = u128::from(count) * u128::from(significand);
    let floor = if shift >= 128 {
        0
    } else {
        (product >> shift) as u64
    };
    floor.saturating_add(1).min(count)
}

/// `uddsketch_calc(quantile, state)`: the estimated value at `quantile`
/// (0 ..= 1), or `None` for an empty sketch.
pub fn uddsketch_calc(quantile: f64, state: &[u8]) -> Result<Option<f64>, String> {
    if !quantile.is_finite() || !(0.0..=1.0).contains(&quantile) {
        return Err(format!(
            "uddsketch_calc: quantile must be between 0 and 1 (e.g. 0.99 for p99), got {quantile}"
        ));
    }
    let sketch = UddState::decode(state)?;
    if sketch.count == 0 {
        return Ok(None);
    }
    let target = udd_nearest_rank(sketch.count, quantile);
    let mapping = UddMapping::at_level(sketch.error_rate, sketch.level);
    let mut seen = 0_u64;
    for &(key, count) in &sketch.buckets {
        seen += count;
        if seen >= target {
            return Ok(Some(mapping.bucket_value(key)));
        }
    }
    // decode() guarantees the counts add up to `count`.
    Err("invalid UDDSketch state: bucket counts do not reach the quantile".to_string())
}

/// Invertible accumulator behind `uddsketch_state(max_buckets, error_rate, value)`
/// and `uddsketch_merge(max_buckets, error_rate, state)`.
///
/// Keeps a signed multiplicity per `(level, bucket)`; see the module docs.
#[derive(Clone, Debug)]
pub struct UddAcc {
    max_buckets: u32,
    error_rate: f64,
    base: UddMapping,
    counts: BTreeMap<(u8, UddKey), i128>,
}

impl UddAcc {
    /// An empty accumulator; `max_buckets` and `error_rate` are the SQL arguments.
    pub fn new(max_buckets: i64, error_rate: f64) -> Result<Self, String> {
        let (max_buckets, error_rate) = udd_check_params(max_buckets, error_rate)?;
        Ok(Self {
            max_buckets,
            error_rate,
            base: UddMapping::at_level(error_rate, 0),
            counts: BTreeMap::new(),
        })
    }

    /// The `max_buckets` argument.
    pub fn max_buckets(&self) -> u32 {
        self.max_buckets
    }

    /// The `error_rate` argument.
    pub fn error_rate(&self) -> f64 {
        self.error_rate
    }

    fn bump(&mut self, slot: (u8, UddKey), diff: i128) -> Result<(), String> {
        if diff == 0 {
            return Ok(());
        }
        let entry = self.counts.entry(slot).or_insert(0);
        *entry = entry
            .checked_add(diff)
            .ok_or_else(|| "uddsketch: bucket count overflow".to_string())?;
        if *entry == 0 {
            self.counts.remove(&slot);
        }
        Ok(())
    }

    /// Adds (`diff > 0`) or removes (`diff < 0`) `|diff|` copies of a value
    /// (`uddsketch_state`). NaN is rejected, as GreptimeDB does.
    pub fn add_value(&mut self, value: f64, diff: i64) -> Result<(), String> {
        let key = self
            .base
            .key(value)
            .ok_or_else(|| "uddsketch_state: NaN values are not supported".to_string())?;
        self.bump((0, key), i128::from(diff))
    }

    /// Adds or removes `|diff|` copies of a state (`uddsketch_merge`). Empty
    /// states are ignored; others must have this accumulator's parameters.
    pub fn add_state(&mut self, state: &[u8], diff: i64) -> Result<(), String> {
        let sketch = UddState::decode(state)?;
        if sketch.count == 0 {
            return Ok(());
        }
        if sketch.max_buckets != self.max_buckets
            || sketch.error_rate.to_bits() != self.error_rate.to_bits()
        {
            return Err(format!(
                "Merging UDDSketch with different parameters: arguments={:?} vs actual input={:?}",
                (self.max_buckets, self.error_rate),
                (sketch.max_buckets, sketch.error_rate)
            ));
        }
        let diff = i128::from(diff);
        for (key, count) in sketch.buckets {
            let delta = i128::from(count)
                .checked_mul(diff)
                .ok_or_else(|| "uddsketch: bucket count overflow".to_string())?;
            self.bump((sketch.level, key), delta)?;
        }
        Ok(())
    }

    /// True when every multiplicity is zero (nothing is present).
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The state bytes of the sketch a fresh GreptimeDB sketch would hold over
    /// the inputs currently present. Errors if some multiplicity is negative.
    pub fn state(&self) -> Result<Vec<u8>, String> {
        if self.counts.values().any(|&count| count < 0) {
            return Err(
                "uddsketch: more rows were removed than added (negative bucket count)".to_string(),
            );
        }
        let level = self
            .counts
            .keys()
            .map(|&(level, _)| level)
            .max()
            .unwrap_or(0);
        let too_many = || "uddsketch: more than 2^64 rows".to_string();
        let mut total = 0_u64;
        let mut buckets: BTreeMap<UddKey, u64> = BTreeMap::new();
        for (&(from, key), &count) in &self.counts {
            let count = u64::try_from(count).map_err(|_| too_many())?;
            total = total.checked_add(count).ok_or_else(too_many)?;
            // Cannot overflow: every bucket is at most `total`.
            *buckets.entry(key.compact(level - from)).or_insert(0) += count;
        }
        let mut level = level;
        while buckets.len() > self.max_buckets as usize {
            if level >= UDD_MAX_LEVEL {
                return Err("uddsketch: cannot compact further".to_string());
            }
            level += 1;
            let mut next: BTreeMap<UddKey, u64> = BTreeMap::new();
            for (key, count) in buckets {
                *next.entry(key.compact(1)).or_insert(0) += count;
            }
            buckets = next;
        }
        let out: Vec<(UddKey, u64)> = buckets.into_iter().collect();
        Ok(UddState {
            max_buckets: self.max_buckets,
            error_rate: self.error_rate,
            level,
            count: total,
            buckets: out,
        }
        .encode())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic test randomness (splitmix64).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }

        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1_u64 << 53) as f64
        }
    }

    // ----- HLL -----

    fn hll_of(values: impl IntoIterator<Item = u64>) -> Vec<u8> {
        let mut acc = HllAcc::new();
        for v in values {
            acc.add_hash(hll_hash_u64(v), 1);
        }
        acc.state()
    }

    #[test]
    fn hll_split_takes_top_bits_and_counts_zeros() {
        assert_eq!(hll_split(u64::MAX), (16383, 1));
        assert_eq!(hll_split(0), (0, 51));
        assert_eq!(hll_split(1), (0, 50));
        assert_eq!(hll_split(1 << 49), (0, 1));
        assert_eq!(hll_split(1 << 50), (1, 51));
        assert_eq!(hll_split((3 << 50) | (1 << 40)), (3, 10));
    }

    #[test]
    fn hll_hash_rules() {
        assert_eq!(hll_hash_i64(-1), hll_hash_bytes(&[0xff; 8]));
        assert_eq!(hll_hash_u64(7), hll_hash_i64(7));
        assert_eq!(hll_hash_f64(-0.0), hll_hash_f64(0.0));
        assert_eq!(
            hll_hash_f64(f64::from_bits(0x7ff0_0000_0000_0001)),
            hll_hash_f64(-f64::NAN)
        );
        assert_eq!(
            hll_hash_f64(1.5),
            hll_hash_bytes(&1.5_f64.to_bits().to_le_bytes())
        );
        assert_eq!(hll_hash_str("abc"), hll_hash_bytes(b"abc"));
        assert_eq!(hll_hash_bool(true), hll_hash_bytes(&[1]));
        assert_ne!(hll_hash_bool(false), hll_hash_bool(true));
        // xxh3_64 of the empty input, seed 0 (reference value).
        assert_eq!(hll_hash_bytes(b""), 0x2d06_8005_38d3_94c2);
    }

    #[test]
    fn hll_empty_counts_zero() {
        let acc = HllAcc::new();
        assert!(acc.is_empty());
        assert_eq!(hll_count(&acc.state()).unwrap(), 0);
        assert_eq!(acc.state().len(), HLL_HEADER_LEN + 4);
    }

    #[test]
    fn hll_accuracy() {
        for (n, tolerance) in [
            (1_u64, 0.0),
            (2, 0.0),
            (3, 0.0),
            (10, 0.0),
            (100, 0.01),
            (1000, 0.01),
            (10_000, 0.02),
            (100_000, 0.02),
        ] {
            for salt in [0_u64, 1 << 40] {
                let estimate = hll_count(&hll_of((0..n).map(|i| i + salt))).unwrap() as f64;
                let error = (estimate - n as f64).abs() / n as f64;
                assert!(
                    error <= tolerance,
                    "n={n} salt={salt}: estimate {estimate}, error {error}"
                );
            }
        }
    }

    #[test]
    fn hll_estimate_is_smooth_across_the_threshold() {
        // Around the linear-counting threshold and through the range where the
        // raw HLL estimate is biased.
        for n in [
            8_000_u64, 11_000, 12_000, 14_000, 20_000, 30_000, 50_000, 80_000,
        ] {
            let estimate = hll_count(&hll_of(0..n)).unwrap() as f64;
            let error = (estimate - n as f64).abs() / n as f64;
            assert!(error <= 0.03, "n={n}: estimate {estimate}, error {error}");
        }
    }

    #[test]
    fn hll_strings_and_duplicates() {
        // GreptimeDB's hll.result cases: 10 then 12 distinct strings.
        let first = [
            "a", "b", "e", "f", "g", "h", "i", "j", "i", "j", "i", "n", "o",
        ];
        let second = ["b", "i", "j", "s", "t"];
        let mut acc = HllAcc::new();
        for s in first {
            acc.add_hash(hll_hash_str(s), 1);
        }
        assert_eq!(hll_count(&acc.state()).unwrap(), 10);
        let one = acc.state();
        for s in second {
            acc.add_hash(hll_hash_str(s), 1);
        }
        let both = acc.state();
        assert_eq!(hll_count(&both).unwrap(), 12);
        let mut merged = HllAcc::new();
        merged.add_state(&both, 1).unwrap();
        merged.add_state(&both, 1).unwrap();
        merged.add_state(&one, 1).unwrap();
        assert_eq!(merged.state(), both);
        assert_eq!(hll_count(&merged.state()).unwrap(), 12);
    }

    #[test]
    fn hll_removes_equal_fresh() {
        let mut rng = Rng(7);
        let values: Vec<u64> = (0..20_000).map(|_| rng.below(30_000)).collect();
        let mut acc = HllAcc::new();
        for &v in &values {
            acc.add_hash(hll_hash_u64(v), 1);
        }
        let mut kept = HllAcc::new();
        for (i, &v) in values.iter().enumerate() {
            if i % 3 == 0 {
                acc.add_hash(hll_hash_u64(v), -1);
            } else {
                kept.add_hash(hll_hash_u64(v), 1);
            }
        }
        assert_eq!(acc.state(), kept.state());
        assert_eq!(acc, kept);
        // Multiplicities: +3 then -2 leaves one copy.
        let mut a = HllAcc::new();
        a.add_hash(42, 3);
        a.add_hash(42, -2);
        let mut b = HllAcc::new();
        b.add_hash(42, 1);
        assert_eq!(a.state(), b.state());
        a.add_hash(42, -1);
        assert!(a.is_empty());
        // A remove before its add is fine once they balance.
        let mut c = HllAcc::new();
        c.add_hash(9, -1);
        assert!(c.has_negative());
        c.add_hash(9, 1);
        assert!(c.is_empty() && !c.has_negative());
    }

    #[test]
    fn hll_merge_removes_equal_fresh() {
        let states: Vec<Vec<u8>> = (0..6_u64)
            .map(|g| hll_of((0..(g + 1) * 1500).map(|i| i * 7 + g)))
            .collect();
        let mut acc = HllAcc::new();
        for s in &states {
            acc.add_state(s, 1).unwrap();
        }
        acc.add_state(&states[1], 2).unwrap();
        acc.add_state(&states[1], -3).unwrap();
        acc.add_state(&states[4], -1).unwrap();
        let mut fresh = HllAcc::new();
        for (i, s) in states.iter().enumerate() {
            if i != 1 && i != 4 {
                fresh.add_state(s, 1).unwrap();
            }
        }
        assert_eq!(acc.state(), fresh.state());
        // Register-wise max of the remaining states.
        let mut max = vec![0_u8; HLL_REGISTERS];
        for i in [0, 2, 3, 5] {
            for (m, r) in max.iter_mut().zip(hll_decode(&states[i]).unwrap()) {
                *m = (*m).max(r);
            }
        }
        assert_eq!(fresh.state(), hll_encode(&max));
    }

    #[test]
    fn hll_formats_round_trip() {
        for n in [0_u64, 1, 5, 3000, 6000, 50_000] {
            let state = hll_of(0..n);
            let registers = hll_decode(&state).unwrap();
            assert_eq!(hll_encode(&registers), state);
            let nonzero = registers.iter().filter(|&&r| r != 0).count();
            let dense = 4 + 3 * nonzero >= HLL_REGISTERS;
            assert_eq!(state[6], u8::from(dense), "n={n}");
            // The other encoding of the same registers decodes the same.
            let mut other = state[..6].to_vec();
            if dense {
                other.push(HLL_SPARSE);
                other.extend_from_slice(&(nonzero as u32).to_le_bytes());
                for (i, &r) in registers.iter().enumerate() {
                    if r != 0 {
                        other.extend_from_slice(&(i as u16).to_le_bytes());
                        other.push(r);
                    }
                }
            } else {
                other.push(HLL_DENSE);
                other.extend_from_slice(&registers);
            }
            assert_eq!(hll_decode(&other).unwrap(), registers);
        }
    }

    #[test]
    fn hll_decode_rejects_garbage() {
        let good = hll_of(0..10);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "bad header"),
            (b"SFHL".to_vec(), "bad header"),
            ([&b"XXXX"[..], &good[4..]].concat(), "bad header"),
            ([&good[..4], &[2], &good[5..]].concat(), "version 2"),
            ([&good[..5], &[12], &good[6..]].concat(), "precision 12"),
            ([&good[..6], &[9], &good[7..]].concat(), "unknown encoding"),
            (good[..good.len() - 1].to_vec(), "need 30 bytes"),
            ([&good[..], &[0]].concat(), "need 30 bytes"),
            ([&good[..6], &[1], &[0; 10]].concat(), "dense state"),
            (
                [&good[..6], &[1], &[60; HLL_REGISTERS]].concat(),
                "register value 60",
            ),
            (
                [&good[..6], &[0, 1, 0, 0, 0, 0, 0x40, 1]].concat(),
                "out of range",
            ),
            (
                [&good[..6], &[0, 1, 0, 0, 0, 5, 0, 0]].concat(),
                "outside 1..=51",
            ),
            (
                [&good[..6], &[0, 2, 0, 0, 0, 5, 0, 1, 5, 0, 1]].concat(),
                "strictly increasing",
            ),
            (
                [&good[..6], &[0, 0xff, 0xff, 0xff, 0xff]].concat(),
                "exceed",
            ),
        ];
        for (bytes, expected) in cases {
            let err = hll_count(&bytes).unwrap_err();
            assert!(
                err.contains(expected),
                "{err:?} should mention {expected:?}"
            );
            assert!(HllAcc::new().add_state(&bytes, 1).is_err());
        }
    }

    #[test]
    fn hll_decode_fuzz_never_panics() {
        let mut rng = Rng(99);
        let seeds = [hll_of(0..10), hll_of(0..20_000), hll_of(0..0)];
        for round in 0..20_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = rng.below(64) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                if round % 4 == 0 && b.len() >= 7 {
                    b[..7].copy_from_slice(&[b'S', b'F', b'H', b'L', 1, 14, (round / 4 % 2) as u8]);
                }
                b
            } else {
                let mut b = seeds[round % 3].clone();
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next() as u8;
                }
                if rng.below(4) == 0 {
                    b.truncate(rng.below(b.len() as u64 + 1) as usize);
                }
                b
            };
            if let Ok(registers) = hll_decode(&bytes) {
                assert_eq!(registers.len(), HLL_REGISTERS);
                let _ = hll_count(&bytes).unwrap();
            }
        }
    }

    // ----- UDDSketch -----

    fn udd_state_of(max_buckets: i64, error: f64, values: &[f64]) -> Vec<u8> {
        let mut acc = UddAcc::new(max_buckets, error).unwrap();
        for &v in values {
            acc.add_value(v, 1).unwrap();
        }
        acc.state().unwrap()
    }

    fn calc(q: f64, state: &[u8]) -> f64 {
        uddsketch_calc(q, state).unwrap().unwrap()
    }

    #[test]
    fn udd_greptimedb_results() {
        let a = udd_state_of(128, 0.01, &[10.0, 20.0, 30.0, 40.0]);
        assert_eq!(calc(0.99, &a), 40.04777053326359);
        let b = udd_state_of(128, 0.01, &[50.0, 60.0]);
        assert_eq!(calc(0.99, &b), 59.745049810145126);
        let mut merged = UddAcc::new(128, 0.01).unwrap();
        merged.add_state(&a, 1).unwrap();
        merged.add_state(&b, 1).unwrap();
        assert_eq!(calc(0.99, &merged.state().unwrap()), 59.745049810145126);
    }

    #[test]
    fn udd_greptimedb_sqlness_results() {
        // tests/cases/standalone/common/aggregate/uddsketch.result
        let values: Vec<f64> = (1..=10).map(|i| f64::from(i) * 10.0).collect();
        let state = udd_state_of(128, 0.01, &values);
        assert_eq!(calc(0.1, &state), 19.886670240866184);
        assert_eq!(calc(0.5, &state), 59.745049810145126);
        assert_eq!(calc(0.75, &state), 80.648188221533);
        assert_eq!(calc(0.95, &state), 100.49456770856492);
        // Grouped by id/5*5 (ids 1..=10 -> groups 0, 5, 10), then merged.
        let groups: Vec<Vec<u8>> = [&values[0..4], &values[4..9], &values[9..10]]
            .iter()
            .map(|g| udd_state_of(128, 0.01, g))
            .collect();
        let mut merged = UddAcc::new(128, 0.01).unwrap();
        for g in &groups {
            merged.add_state(g, 1).unwrap();
        }
        let merged = merged.state().unwrap();
        assert_eq!(merged, state);
        assert_eq!(calc(0.1, &merged), 19.886670240866184);
        for (buckets, error, shown) in [(128, 0.1, "(128, 0.1)"), (64, 0.01, "(64, 0.01)")] {
            let err = UddAcc::new(buckets, error)
                .unwrap()
                .add_state(&groups[0], 1)
                .unwrap_err();
            assert_eq!(
                err,
                format!(
                    "Merging UDDSketch with different parameters: arguments={shown} vs actual input=(128, 0.01)"
                )
            );
        }
    }

    /// Values and quantiles checked against `uddsketch-rs` 0.1.0 (the crate
    /// GreptimeDB uses) on the same inputs: `(max_buckets, error, seed, len,
    /// level, [(q, f64 bits)])`.
    #[test]
    fn udd_matches_reference_crate() {
        for &(max_buckets, error, seed, len, level, expected) in REFERENCE {
            let values = reference_values(seed, len);
            let state = udd_state_of(max_buckets, error, &values);
            assert_eq!(state[5], level, "seed {seed}: level");
            for &(q, bits) in expected {
                let got = calc(q, &state);
                assert_eq!(
                    got.to_bits(),
                    bits,
                    "seed {seed} q {q}: got {got}, want {}",
                    f64::from_bits(bits)
                );
            }
        }
    }

    /// Test inputs shared with the reference run: a mix of magnitudes, signs,
    /// zeros and repeats.
    fn reference_values(seed: u64, len: usize) -> Vec<f64> {
        let mut rng = Rng(seed);
        (0..len)
            .map(|_| {
                let kind = rng.below(10);
                let magnitude = (rng.unit() * 40.0 - 20.0).exp();
                match kind {
                    0 => 0.0,
                    1..=2 => -magnitude,
                    3 => (rng.below(100) as f64) / 4.0,
                    _ => magnitude,
                }
            })
            .collect()
    }

    /// (max_buckets, error, seed, len, level, [(quantile, f64 bits)])
    type Reference = (i64, f64, u64, usize, u8, &'static [(f64, u64)]);
    #[rustfmt::skip]
    const REFERENCE: &[Reference] = &[
        (128, 0.01, 1, 10, 0, &[(0.0, 0xc0e1ea6ff1a70671), (0.01, 0xc0e1ea6ff1a70671), (0.1, 0x0), (0.25, 0x0), (0.5, 0x400ad3dec3fe95f9), (0.7, 0x4050d7353f9741d1), (0.75, 0x40d227075e3f66af), (0.9, 0x41520fe29442f586), (0.95, 0x41520fe29442f586), (0.99, 0x41520fe29442f586), (1.0, 0x41520fe29442f586), ]),
        (128, 0.01, 2, 1000, 5, &[(0.0, 0xc1b106c2e31dd4d6), (0.01, 0xc183f7deed3794d5), (0.1, 0xc003de42f07af97b), (0.25, 0x0), (0.5, 0x3f61d21648222819), (0.7, 0x4030f0ecc3c9dccb), (0.75, 0x4040108907e5f136), (0.9, 0x412b76f0d6b89140), (0.95, 0x416634eba35f1b2b), (0.99, 0x41a1f495e57a5d30), (1.0, 0x41c0253dec8e0902), ]),
        (7, 0.01, 3, 500, 10, &[(0.0, 0xbfffffffff50d436), (0.01, 0xbfffffffff50d436), (0.1, 0xbfffffffff50d436), (0.25, 0x0), (0.5, 0x3e25e5794f008c2f), (0.7, 0x3fffffffff50d436), (0.75, 0x3fffffffff50d436), (0.9, 0x3fffffffff50d436), (0.95, 0x3fffffffff50d436), (0.99, 0x3fffffffff50d436), (1.0, 0x3fffffffff50d436), ]),
        (10, 0.05, 4, 300, 7, &[(0.0, 0xc126586a99c7c732), (0.01, 0xc126586a99c7c732), (0.1, 0xbed6e9b34c06376a), (0.25, 0x0), (0.5, 0x3ed6e9b34c06376a), (0.7, 0x3ffffffa45932cfe), (0.75, 0x3ffffffa45932cfe), (0.9, 0x4126586a99c7c732), (0.95, 0x4126586a99c7c732), (0.99, 0x4126586a99c7c732), (1.0, 0x4126586a99c7c732), ]),
        (20, 0.001, 5, 2000, 12, &[(0.0, 0xc178e0705e9195eb), (0.01, 0xc178e0705e9195eb), (0.1, 0xbf4223a29b16ed15), (0.25, 0x0), (0.5, 0x3f4223a29b16ed15), (0.7, 0x3ffffdbb8bac9d22), (0.75, 0x3ffffdbb8bac9d22), (0.9, 0x40bc35e5e93a5212), (0.95, 0x4178e0705e9195eb), (0.99, 0x4178e0705e9195eb), (1.0, 0x4178e0705e9195eb), ]),
        (64, 0.1, 6, 5000, 3, &[(0.0, 0xc1b714ade884d2ee), (0.01, 0xc1928a3b8376eead), (0.1, 0xbffaa606e5ff9718), (0.25, 0x0), (0.5, 0x3f41d2da0940a517), (0.7, 0x402096704853b685), (0.75, 0x4044a679da31d9b4), (0.9, 0x412337e2006cd730), (0.95, 0x416dc8f5d74e987e), (0.99, 0x41b714ade884d2ee), (1.0, 0x41b714ade884d2ee), ]),
        (200, 0.0001, 7, 3000, 11, &[(0.0, 0xc1b8c2a26c0c68b1), (0.01, 0xc180f6bcc85e8c23), (0.1, 0xbfba5a28499f490f), (0.25, 0x0), (0.5, 0x3f5c0fffa3791baa), (0.7, 0x402c120ef4159d66), (0.75, 0x403fd772cfc39a4c), (0.9, 0x4117fcad8abfa3fb), (0.95, 0x4163db7f06415609), (0.99, 0x41b07051bfae25e5), (1.0, 0x41b8c2a26c0c68b1), ]),
        (1000, 0.01, 8, 20000, 3, &[(0.0, 0xc1baa0930f902872), (0.01, 0xc19252c053f231de), (0.1, 0xbff44675701b5540), (0.25, 0x0), (0.5, 0x3f522f8bc9e48ec0), (0.7, 0x402bf07d6fc3c24c), (0.75, 0x403a7e6cc96b5c25), (0.9, 0x41234c7b896b9fc7), (0.95, 0x416d97f77abcfe90), (0.99, 0x41ac1480b5a77166), (1.0, 0x41baa0930f902872), ]),
        (50, 1e-12, 9, 100, 39, &[(0.0, 0xc1a77df9d2c9935f), (0.01, 0xc18f4aa4af125928), (0.1, 0xc0a9d070215ee322), (0.25, 0xbec7668f3b9445e6), (0.5, 0x3efa60d50a8274d8), (0.7, 0x404450b2d15f96a6), (0.75, 0x4091313c1b00e6d8), (0.9, 0x40f5d892bf437423), (0.95, 0x415bc262efb8cc74), (0.99, 0x41a77df9d2c9935f), (1.0, 0x41a77df9d2c9935f), ]),
        (30, 0.5, 10, 400, 2, &[(0.0, 0xc19446a507e7063e), (0.01, 0xc1300540063e7064), (0.1, 0xbf98f9c18f9c18f9), (0.25, 0x0), (0.5, 0x3f33bbdb4eb439a9), (0.7, 0x3fff9c18f9c18f9c), (0.75, 0x406400c7ce0c7ce1), (0.9, 0x41300540063e7064), (0.95, 0x41300540063e7064), (0.99, 0x419446a507e7063e), (1.0, 0x419446a507e7063e), ]),
    ];

    #[test]
    fn udd_empty_and_special_values() {
        let empty = UddAcc::new(128, 0.01).unwrap();
        assert!(empty.is_empty());
        let state = empty.state().unwrap();
        assert_eq!(uddsketch_calc(0.5, &state).unwrap(), None);
        let s = udd_state_of(
            7,
            0.01,
            &[-0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, -3.0],
        );
        assert_eq!(calc(0.0, &s), f64::NEG_INFINITY);
        assert_eq!(calc(0.5, &s), 0.0);
        assert_eq!(calc(1.0, &s), f64::INFINITY);
        let mut acc = UddAcc::new(128, 0.01).unwrap();
        let err = acc.add_value(f64::NAN, 1).unwrap_err();
        assert!(err.contains("NaN"), "{err}");
        // Extremes keep a finite estimate within the error bound.
        for v in [f64::from_bits(1), f64::MIN_POSITIVE, f64::MAX, -f64::MAX] {
            let got = calc(0.5, &udd_state_of(50, 0.1, &[v]));
            assert!(
                got.is_finite() && (got - v).abs() / v.abs() <= 0.1,
                "{v:e} -> {got:e}"
            );
        }
    }

    #[test]
    fn udd_invalid_arguments() {
        for (buckets, error) in [
            (0, 0.01),
            (6, 0.01),
            (-1, 0.01),
            (1_000_001, 0.01),
            (i64::MAX, 0.01),
            (128, 0.0),
            (128, 1.0),
            (128, -0.5),
            (128, f64::NAN),
            (128, f64::INFINITY),
            (128, 1e-13),
        ] {
            let err = UddAcc::new(buckets, error).unwrap_err();
            assert!(err.starts_with("uddsketch: "), "{err}");
        }
        let state = udd_state_of(128, 0.01, &[1.0]);
        for q in [-0.1, 1.1, f64::NAN, f64::INFINITY] {
            let err = uddsketch_calc(q, &state).unwrap_err();
            assert!(err.contains("quantile must be between 0 and 1"), "{err}");
        }
        assert_eq!(calc(0.0, &state), calc(1.0, &state));
        // Empty states merge into anything, like GreptimeDB.
        let empty = UddAcc::new(64, 0.5).unwrap().state().unwrap();
        let mut acc = UddAcc::new(128, 0.01).unwrap();
        acc.add_state(&empty, 1).unwrap();
        assert!(acc.is_empty());
    }

    #[test]
    fn udd_nearest_rank_is_exact() {
        assert_eq!(udd_nearest_rank(10, 0.7), 7); // 10 * 0.7 rounds up to 7.0 in f64
        assert_eq!(udd_nearest_rank(10, 0.1), 2);
        assert_eq!(udd_nearest_rank(10, 0.0), 1);
        assert_eq!(udd_nearest_rank(10, 1.0), 10);
        assert_eq!(udd_nearest_rank(10, 0.99), 10);
        assert_eq!(udd_nearest_rank(u64::MAX, 0.5), 1 << 63);
        assert_eq!(udd_nearest_rank(3, f64::from_bits(1)), 1);
    }

    #[test]
    fn udd_compaction_is_ceiling_halving() {
        for index in [
            -9_i64,
            -4,
            -3,
            -2,
            -1,
            0,
            1,
            2,
            3,
            4,
            9,
            1 << 50,
            -(1 << 50),
        ] {
            let mut stepwise = index;
            for levels in 0..=63_u8 {
                assert_eq!(
                    udd_compact_index(index, levels),
                    stepwise,
                    "{index} {levels}"
                );
                stepwise = if stepwise > 0 {
                    (stepwise + 1) / 2
                } else {
                    stepwise / 2
                };
            }
        }
        assert_eq!(udd_compact_index(i64::MAX, 5), i64::MAX);
        assert_eq!(udd_compact_index(i64::MIN, 63), -1);
    }

    #[test]
    fn udd_compacted_key_equals_key_at_level() {
        // The exactness claim: the level-L key of a value is its level-0 key
        // compacted L times, for every value and level.
        let mut rng = Rng(3);
        for error in [0.01, 0.001, 0.3, 1e-12] {
            let base = UddMapping::at_level(error, 0);
            for level in 0..=40_u8 {
                let mapping = UddMapping::at_level(error, level);
                for _ in 0..300 {
                    let v = match rng.below(3) {
                        0 => f64::from_bits(rng.next() >> 1),
                        1 => (rng.unit() * 60.0 - 30.0).exp(),
                        _ => {
                            // Right at a level-0 bucket boundary.
                            let i = rng.below(2000) as f64 - 1000.0;
                            base.gamma.powf(i)
                        }
                    };
                    if !v.is_finite() || v == 0.0 {
                        continue;
                    }
                    assert_eq!(
                        base.key(v).unwrap().compact(level),
                        mapping.key(v).unwrap(),
                        "{v:e} error {error} level {level}"
                    );
                }
            }
        }
    }

    #[test]
    fn udd_compacts_to_fit() {
        let values: Vec<f64> = (-20..=20).map(|e| 1.5_f64.powi(e)).collect();
        let state = udd_state_of(7, 0.01, &values);
        let sketch = UddState::decode(&state).unwrap();
        assert!(sketch.level > 0 && sketch.buckets.len() <= 7);
        assert_eq!(sketch.count, 41);
        // One level fewer would not fit.
        let mapping = UddMapping::at_level(0.01, sketch.level - 1);
        let mut keys: Vec<UddKey> = values.iter().map(|&v| mapping.key(v).unwrap()).collect();
        keys.sort();
        keys.dedup();
        assert!(keys.len() > 7);
        // Full compaction of every sign domain fits the minimum bucket count.
        let wide = [
            f64::MAX,
            f64::from_bits(1),
            -f64::MAX,
            -f64::from_bits(1),
            f64::INFINITY,
            f64::NEG_INFINITY,
            0.0,
            1.0,
            -1.0,
        ];
        let state = udd_state_of(7, 1e-12, &wide);
        assert!(UddState::decode(&state).unwrap().buckets.len() <= 7);
    }

    #[test]
    fn udd_removes_equal_fresh() {
        let mut rng = Rng(11);
        for round in 0..40 {
            let max_buckets = [7_i64, 10, 20, 64, 128][round % 5];
            let error = [0.01, 0.05, 0.001, 0.2][round % 4];
            let len = 1 + rng.below(600) as usize;
            let values = reference_values(rng.next(), len);
            let mut acc = UddAcc::new(max_buckets, error).unwrap();
            for &v in &values {
                acc.add_value(v, 1).unwrap();
            }
            let mut kept = Vec::new();
            for &v in &values {
                if rng.below(3) == 0 {
                    acc.add_value(v, -1).unwrap();
                } else {
                    kept.push(v);
                }
            }
            // The rest, in a different order, in a fresh accumulator.
            kept.reverse();
            let fresh = udd_state_of(max_buckets, error, &kept);
            assert_eq!(acc.state().unwrap(), fresh, "round {round}");
            assert_eq!(acc.is_empty(), kept.is_empty());
        }
    }

    #[test]
    fn udd_merge_removes_equal_fresh() {
        let mut rng = Rng(12);
        for round in 0..30 {
            let max_buckets = [7_i64, 12, 30][round % 3];
            let error = [0.01, 0.002][round % 2];
            let groups: Vec<Vec<f64>> = (0..5)
                .map(|_| {
                    let len = rng.below(300) as usize;
                    reference_values(rng.next(), len)
                })
                .collect();
            let states: Vec<Vec<u8>> = groups
                .iter()
                .map(|g| udd_state_of(max_buckets, error, g))
                .collect();
            let mut acc = UddAcc::new(max_buckets, error).unwrap();
            for s in &states {
                acc.add_state(s, 1).unwrap();
            }
            // Mixed: a raw value and a weighted state, then take some back.
            acc.add_value(1234.5, 2).unwrap();
            acc.add_state(&states[2], 3).unwrap();
            acc.add_state(&states[2], -4).unwrap();
            acc.add_state(&states[0], -1).unwrap();
            acc.add_value(1234.5, -2).unwrap();
            let mut fresh = UddAcc::new(max_buckets, error).unwrap();
            for i in [4, 3, 1] {
                fresh.add_state(&states[i], 1).unwrap();
            }
            assert_eq!(
                acc.state().unwrap(),
                fresh.state().unwrap(),
                "round {round}"
            );
            // Merging states of a partition is merging values only when no
            // group had to compact beyond what the whole needs; the level is
            // the max of the group levels at least.
            let merged = UddState::decode(&fresh.state().unwrap()).unwrap();
            let top = [4, 3, 1]
                .iter()
                .map(|&i| UddState::decode(&states[i]).unwrap())
                .filter(|s| s.count > 0)
                .map(|s| s.level)
                .max()
                .unwrap_or(0);
            assert!(merged.level >= top);
        }
    }

    #[test]
    fn udd_negative_counts_are_an_error_until_balanced() {
        let mut acc = UddAcc::new(128, 0.01).unwrap();
        acc.add_value(5.0, -1).unwrap();
        assert!(acc.state().unwrap_err().contains("removed than added"));
        acc.add_value(5.0, 1).unwrap();
        assert!(acc.is_empty());
        assert_eq!(
            acc.state().unwrap(),
            UddAcc::new(128, 0.01).unwrap().state().unwrap()
        );
    }

    #[test]
    fn udd_state_round_trips() {
        let values = reference_values(5, 500);
        let state = udd_state_of(20, 0.01, &values);
        let decoded = UddState::decode(&state).unwrap();
        assert_eq!(decoded.encode(), state);
        assert_eq!(decoded.count, 500);
        assert_eq!(decoded.max_buckets, 20);
        assert_eq!(decoded.error_rate, 0.01);
        let mut acc = UddAcc::new(20, 0.01).unwrap();
        acc.add_state(&state, 1).unwrap();
        assert_eq!(acc.state().unwrap(), state);
    }

    #[test]
    fn udd_decode_rejects_garbage() {
        let good = udd_state_of(128, 0.01, &[1.0, 2.0, -3.0, 0.0]);
        let with = |at: usize, bytes: &[u8]| {
            let mut b = good.clone();
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        let bucket = |i: usize| UDD_HEADER_LEN + i * UDD_BUCKET_LEN;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![], "bad header"),
            (good[..UDD_HEADER_LEN - 1].to_vec(), "bad header"),
            (with(0, b"SFHL"), "bad header"),
            (with(4, &[9]), "version 9"),
            (with(5, &[64]), "level 64"),
            (with(6, &3_u32.to_le_bytes()), "max_buckets"),
            (with(10, &2.0_f64.to_bits().to_le_bytes()), "error_rate"),
            (with(10, &f64::NAN.to_bits().to_le_bytes()), "error_rate"),
            (with(18, &5_u64.to_le_bytes()), "add up to 4"),
            (with(26, &5_u32.to_le_bytes()), "need 85 bytes"),
            (with(26, &500_u32.to_le_bytes()), "exceed"),
            (good[..good.len() - 1].to_vec(), "need 68 bytes"),
            ([&good[..], &[0]].concat(), "need 68 bytes"),
            (with(bucket(0), &[7]), "bad bucket tag"),
            (with(bucket(1) + 1, &[1]), "bad bucket tag"),
            (with(bucket(0) + 9, &0_u64.to_le_bytes()), "empty bucket"),
            (with(bucket(0) + 9, &u64::MAX.to_le_bytes()), "overflow"),
            (
                with(bucket(3) + 1, &0_i64.to_le_bytes()),
                "increasing order",
            ),
            (with(bucket(0), &[2]), "increasing order"),
            (
                with(bucket(3) + 1, &(1_i64 << 60).to_le_bytes()),
                "impossible",
            ),
        ];
        for (bytes, expected) in cases {
            let err = uddsketch_calc(0.5, &bytes).unwrap_err();
            assert!(
                err.contains(expected),
                "{err:?} should mention {expected:?}"
            );
            assert!(UddAcc::new(128, 0.01)
                .unwrap()
                .add_state(&bytes, 1)
                .is_err());
        }
    }

    #[test]
    fn udd_decode_fuzz_never_panics() {
        let mut rng = Rng(1234);
        let seeds = [
            udd_state_of(128, 0.01, &reference_values(1, 300)),
            udd_state_of(7, 0.01, &reference_values(2, 300)),
            udd_state_of(128, 0.01, &[]),
        ];
        for round in 0..20_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = rng.below(120) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                if round % 4 == 0 && b.len() >= 5 {
                    b[..5].copy_from_slice(b"SFUD\x01");
                }
                b
            } else {
                let mut b = seeds[round % 3].clone();
                for _ in 0..1 + rng.below(3) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next() as u8;
                }
                if rng.below(4) == 0 {
                    b.truncate(rng.below(b.len() as u64 + 1) as usize);
                }
                b
            };
            for q in [0.0, 0.5, 1.0] {
                let _ = uddsketch_calc(q, &bytes);
            }
            let mut acc = UddAcc::new(128, 0.01).unwrap();
            if acc.add_state(&bytes, 1).is_ok() {
                let _ = acc.state().unwrap();
            }
        }
    }
}
