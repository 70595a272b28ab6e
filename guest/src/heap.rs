//! The component's memory growth: the C library's `sbrk`, which its `malloc`
//! (dlmalloc) asks for more memory, replaced by one that grows the linear
//! memory to whole 2 MiB steps and hands the rest out to later calls.
//!
//! Why: the host backs guest memories with transparent huge pages where the
//! kernel allows (host/sandbox `memory.rs`). The kernel gives a huge page
//! only to a 2 MiB-aligned range that is wholly inside the accessible part
//! of the memory; `malloc` grows the memory by 64 KiB at a time, so most of
//! a growing state was first touched in its last, partial range and got
//! 4 KiB pages. Measured with the `backfill` bench (wasm, 1M rows, time
//! order), huge pages cut push + tick + snapshot by about 10% (180 against
//! 201 ms: page faults and TLB misses; guest/README.md has the figures). `malloc` itself is unchanged: the break still moves by
//! exactly what it asks for, only the memory runs ahead of it.
//!
//! A memory limit that is not a multiple of 2 MiB may refuse the rounded
//! growth (memory.grow returns -1, see the sandbox's limiter); the exact
//! growth is then asked for, so the limit means what it says.
//!
//! Only for wasm32 without threads (the component's target): one thread
//! calls `sbrk`.

/// Bytes of a wasm page.
const PAGE: usize = 64 << 10;

/// Pages of one growth step (2 MiB, the size of a huge page).
const STEP_PAGES: usize = (2 << 20) / PAGE;

/// Pages to grow a memory of `now` pages by so that it holds `want` more
/// pages and ends on a step.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
fn rounded_growth(now: usize, want: usize) -> usize {
    (now + want).next_multiple_of(STEP_PAGES) - now
}

#[cfg(all(target_arch = "wasm32", not(target_feature = "atomics")))]
mod wasm {
    use core::arch::wasm32;
    use core::cell::Cell;

    use super::{rounded_growth, PAGE};

    /// Where the memory handed out by `sbrk` ends (the break), and where the
    /// memory ended after `sbrk` last grew it; 0 before the first call.
    struct Break {
        at: Cell<usize>,
        grown_to: Cell<usize>,
    }

    // SAFETY: the component runs on one thread (wasm32 without the atomics
    // feature has no threads).
    unsafe impl Sync for Break {}

    static BREAK: Break = Break {
        at: Cell::new(0),
        grown_to: Cell::new(0),
    };

    /// `sbrk(increment)`: the old break, after which `increment` bytes are
    /// now the caller's; `(void*)-1` when the memory cannot grow. Like the
    /// C library's: whole pages only, and never shrinking.
    #[no_mangle]
    pub extern "C" fn sbrk(increment: isize) -> *mut u8 {
        const FAILED: *mut u8 = usize::MAX as *mut u8;
        let end = wasm32::memory_size(0) * PAGE;
        // The pages between the break and the end are ours to hand out only
        // if nobody grew the memory since we did.
        let brk = match BREAK.grown_to.get() == end {
            true => BREAK.at.get(),
            false => end,
        };
        if increment < 0 || !(increment as usize).is_multiple_of(PAGE) {
            return FAILED;
        }
        let Some(new) = brk.checked_add(increment as usize) else {
            return FAILED;
        };
        let mut grown_to = end;
        if new > end {
            let want = (new - end) / PAGE;
            let rounded = rounded_growth(end / PAGE, want);
            grown_to = if wasm32::memory_grow(0, rounded) != usize::MAX {
                end + rounded * PAGE
            } else if rounded != want && wasm32::memory_grow(0, want) != usize::MAX {
                new
            } else {
                return FAILED;
            };
        }
        BREAK.at.set(new);
        BREAK.grown_to.set(grown_to);
        brk as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_ends_on_a_step_and_holds_what_was_asked() {
        for now in [0, 1, 17, 31, 32, 33, 100] {
            for want in [0, 1, 5, 32, 40, 1000] {
                let g = rounded_growth(now, want);
                assert!(g >= want, "{now} + {want}: {g}");
                assert_eq!((now + g) % STEP_PAGES, 0, "{now} + {want}: {g}");
                assert!(g < want + STEP_PAGES, "{now} + {want}: {g}");
            }
        }
    }
}
