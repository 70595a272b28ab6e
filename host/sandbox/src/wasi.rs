//! The store state of one guest: WASI with no capabilities, a memory limiter
//! that remembers when it said no, and a bounded capture of the guest's stderr
//! (where a Rust guest prints its panic message before trapping).

use std::time::Duration;

use wasmtime::component::{Linker, ResourceTable};
use wasmtime::ResourceLimiter;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{HostMonotonicClock, HostWallClock, WasiCtx, WasiCtxView, WasiView};

use super::RuntimeError;

/// The most stderr output kept from a guest (enough for a panic message).
const STDERR_CAPACITY: usize = 4096;

pub struct GuestState {
    wasi: WasiCtx,
    table: ResourceTable,
    stderr: MemoryOutputPipe,
    pub limiter: MemoryLimiter,
}

impl GuestState {
    pub fn new(memory_limit: usize) -> GuestState {
        let stderr = MemoryOutputPipe::new(STDERR_CAPACITY);
        let mut builder = WasiCtx::builder();
        builder
            .stderr(stderr.clone())
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
            stderr,
            limiter: MemoryLimiter {
                limit: memory_limit,
                current: 0,
                hit: false,
            },
        }
    }

    /// What the guest wrote to stderr, trimmed (e.g. a panic message).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.contents())
            .trim()
            .to_string()
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
