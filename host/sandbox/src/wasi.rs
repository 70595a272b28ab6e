//! The store state of one guest: WASI with no capabilities, a memory limiter
//! that remembers when it said no, and the guest's stdout and stderr: the
//! lines it writes, bounded, for the flow's log, and the last bytes of
//! stderr (where a Rust guest prints its panic message before trapping).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::ResourceLimiter;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::RuntimeError;

/// The most stderr output kept for a trap's message (enough for a panic).
const STDERR_TAIL: usize = 4096;
/// The most lines kept between two reads of a guest's log; more are counted
/// as dropped.
pub const LOG_LINES: usize = 256;
/// The longest line kept (longer ones are cut, marked with `…`).
pub const LOG_LINE_BYTES: usize = 1024;

/// What a guest wrote to stdout and stderr since it was last read.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct GuestLog {
    /// Whole lines, in order, at most [`LOG_LINES`].
    pub lines: Vec<String>,
    /// Lines written past the bound and not kept.
    pub dropped: u64,
}

#[derive(Debug, Default)]
struct LogBuf {
    lines: VecDeque<String>,
    dropped: u64,
    /// The line being written (up to [`LOG_LINE_BYTES`]).
    partial: Vec<u8>,
    cut: bool,
    /// The last bytes of stderr.
    tail: VecDeque<u8>,
}

/// A guest's stdout or stderr: accepts every write (a guest that prints a
/// lot must not fail for it), keeps bounded whole lines for the log and,
/// for stderr, the last bytes for error messages.
#[derive(Debug, Clone)]
pub struct LogPipe {
    buf: Arc<Mutex<LogBuf>>,
    tail: bool,
}

impl LogPipe {
    fn write_bytes(&self, bytes: &[u8]) {
        let Ok(mut b) = self.buf.lock() else { return };
        if self.tail {
            b.tail.extend(bytes.iter().copied());
            let extra = b.tail.len().saturating_sub(STDERR_TAIL);
            b.tail.drain(..extra);
        }
        for &c in bytes {
            if c == b'\n' {
                let mut line = String::from_utf8_lossy(&b.partial).into_owned();
                if b.cut {
                    line.push('…');
                }
                b.partial.clear();
                b.cut = false;
                if b.lines.len() < LOG_LINES {
                    b.lines.push_back(line);
                } else {
                    b.dropped += 1;
                }
            } else if b.partial.len() < LOG_LINE_BYTES {
                b.partial.push(c);
            } else {
                b.cut = true;
            }
        }
    }
}

impl IsTerminal for LogPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for LogPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Only WASIp2 is linked: nothing writes through this one.
        Box::new(wasmtime_wasi::p2::pipe::MemoryOutputPipe::new(0))
    }
}

impl OutputStream for LogPipe {
    fn write(&mut self, bytes: bytes::Bytes) -> Result<(), StreamError> {
        self.write_bytes(&bytes);
        Ok(())
    }
    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }
    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for LogPipe {
    async fn ready(&mut self) {}
}

pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    log: Arc<Mutex<LogBuf>>,
    pub limiter: MemoryLimiter,
}

impl GuestState {
    pub fn new(memory_limit: usize) -> GuestState {
        let log = Arc::new(Mutex::new(LogBuf::default()));
        let stderr = LogPipe {
            buf: log.clone(),
            tail: true,
        };
        let stdout = LogPipe {
            buf: log.clone(),
            tail: false,
        };
        let mut builder = WasiCtx::builder();
        builder
            .stderr(stderr)
            .stdout(stdout)
            .wall_clock(FrozenClock)
            .monotonic_clock(FrozenClock)
            .secure_random(FixedRandom::new(0x5eed_f10e))
            .insecure_random(FixedRandom::new(0x1a5e_c0de))
            .insecure_random_seed(0)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        GuestState {
            wasi: builder.build(),
            table: ResourceTable::new(),
            log,
            limiter: MemoryLimiter {
                limit: memory_limit,
                current: 0,
                hit: false,
            },
        }
    }

    /// The last bytes the guest wrote to stderr, trimmed (e.g. a panic
    /// message).
    pub fn stderr_text(&self) -> String {
        let Ok(b) = self.log.lock() else {
            return String::new();
        };
        let bytes: Vec<u8> = b.tail.iter().copied().collect();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }

    /// The lines written since the last call (a line still being written
    /// waits for its end).
    pub fn take_log(&self) -> GuestLog {
        let Ok(mut b) = self.log.lock() else {
            return GuestLog::default();
        };
        GuestLog {
            lines: b.lines.drain(..).collect(),
            dropped: std::mem::take(&mut b.dropped),
        }
    }
}

impl WasiView for GuestState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Adds the WASI interfaces a Rust `wasm32-wasip2` guest imports, backed by a
/// context without capabilities. Nothing else is linked: a component that
/// imports anything more fails `instantiate_pre`.
pub fn add_wasi(linker: &mut Linker<GuestState>) -> Result<(), RuntimeError> {
    wasmtime_wasi::p2::add_to_linker_sync(linker).map_err(|e| RuntimeError::Setup {
        message: format!("cannot link WASI: {e:#}"),
    })
}

/// The step in which sandflow's engine grows its memory (huge pages, see
/// `memory.rs`).
const GROWTH_STEP: usize = 2 << 20;

/// Caps linear memory; `hit` records that the cap was the reason a call failed.
pub struct MemoryLimiter {
    limit: usize,
    pub current: usize,
    pub hit: bool,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            // A growth to a 2 MiB boundary that overshoots a limit which is
            // not one is refused (memory.grow returns -1) rather than
            // trapped: the engine's allocator grows in such steps (guest
            // heap.rs) and then asks for only what it needs.
            if desired.is_multiple_of(GROWTH_STEP) && desired - self.limit < GROWTH_STEP {
                return Ok(false);
            }
            self.hit = true;
            // Trap at once with a clear reason instead of letting the guest's
            // allocator abort with a less helpful message.
            return Err(wasmtime::format_err!(
                "memory limit of {} bytes exceeded (wanted {desired})",
                self.limit
            ));
        }
        self.current = desired;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1 << 20)
    }
}

/// A clock that never moves: guests must take time from `tick(now)` only.
struct FrozenClock;

impl HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A deterministic generator (splitmix64) so that a guest's "random" numbers,
/// e.g. hash seeds, are the same on every run.
struct FixedRandom {
    state: u64,
}

impl FixedRandom {
    fn new(seed: u64) -> FixedRandom {
        FixedRandom { state: seed }
    }
}

impl rand::TryRng for FixedRandom {
    type Error = std::convert::Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Self::Error> {
        Ok((self.try_next_u64()? >> 32) as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Self::Error> {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Ok(z ^ (z >> 31))
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Self::Error> {
        for chunk in dst.chunks_mut(8) {
            let v = self.try_next_u64()?.to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(limit: usize) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            current: 0,
            hit: false,
        }
    }

    #[test]
    fn a_growth_step_past_an_odd_limit_is_refused_and_a_growth_past_any_limit_traps() {
        let mib = 1 << 20;
        let mut odd = limiter(25 * mib);
        // To the step past the limit: refused, no trap, not a hit.
        assert!(!odd.memory_growing(24 * mib, 26 * mib, None).unwrap());
        assert!(!odd.hit);
        // What fits is granted.
        assert!(odd.memory_growing(24 * mib, 25 * mib, None).unwrap());
        assert_eq!(odd.current, 25 * mib);
        // Past the limit otherwise: a trap that names the limit.
        let err = odd
            .memory_growing(25 * mib, 25 * mib + 65536, None)
            .unwrap_err();
        assert!(err.to_string().contains("memory limit"), "{err}");
        assert!(odd.hit);
        // A limit on a step boundary: a step past it traps.
        let mut even = limiter(24 * mib);
        assert!(even.memory_growing(24 * mib, 26 * mib, None).is_err());
        assert!(even.hit);
    }
}
