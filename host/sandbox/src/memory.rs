//! Guests' linear memories, mapped by the sandbox (Linux): wasmtime's own
//! layout, plus transparent huge pages where the kernel allows them.
//!
//! The layout is what wasmtime's compiled code relies on to leave out
//! bounds checks: `reserved` bytes that never move, of which only the
//! memory's current size is accessible, followed by `guard` inaccessible
//! bytes; as wasmtime does by default, as many inaccessible bytes come
//! before the memory too. Growing makes the next pages accessible
//! (`mprotect`); nothing past the memory's size ever is, so an access
//! beyond it traps exactly as with wasmtime's own memories. Fresh anonymous
//! pages are zero, as a new memory must be.
//!
//! The difference: the memory starts on a 2 MiB boundary and is advised
//! `MADV_HUGEPAGE`, so that on a kernel whose transparent huge pages are in
//! `madvise` mode (the common default) the guest's pages come 2 MiB at a
//! time instead of 4 KiB. A back-fill that builds 100 MB of state otherwise
//! takes about 25,000 page faults, 10-15% of the flow's thread, and misses
//! the TLB on each random probe of its group table. The guest grows its
//! memory in 2 MiB steps (guest `heap.rs`), so the newest pages are in whole
//! huge pages too. With transparent huge pages off, or where the kernel
//! cannot find one, the advice changes nothing.
//!
//! Must not know what runs in the memory.

use std::ffi::c_void;

use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags};
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// The size of a transparent huge page on x86-64 and aarch64 (4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Makes the memories of an engine (`Config::with_host_memory`).
pub(crate) struct HugePageMemories;

// SAFETY: every memory is a private mapping of its own, laid out as
// `new_memory`'s contract asks (see `Mapped::new`).
unsafe impl MemoryCreator for HugePageMemories {
    fn new_memory(
        &self,
        ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        if ty.is_shared() {
            return Err("shared memories are not supported by the sandbox".into());
        }
        let page = rustix::param::page_size();
        if !ty.page_size().is_multiple_of(page as u64) {
            return Err(format!(
                "memories with {}-byte pages are not supported by the sandbox",
                ty.page_size()
            ));
        }
        // Without a reservation the memory may be bounds-checked against
        // its size and may move; reserving its maximum keeps it in place.
        let reserved = match reserved_size_in_bytes {
            Some(r) => r,
            None => maximum.unwrap_or(minimum).max(minimum),
        };
        let reserved = reserved
            .checked_next_multiple_of(page)
            .ok_or("memory reservation too large")?;
        if minimum > reserved {
            return Err(format!(
                "memory of {minimum} bytes does not fit its reservation of {reserved} bytes"
            ));
        }
        Mapped::new(reserved, guard_size_in_bytes, minimum)
            .map(|m| Box::new(m) as Box<dyn LinearMemory>)
            .map_err(|e| format!("cannot map a guest memory of {reserved} bytes: {e}"))
    }
}

/// One memory: `[guard][pad][memory: reserved][guard][pad]`, where the pad
/// puts the memory on a 2 MiB boundary.
struct Mapped {
    /// The whole mapping, unmapped on drop.
    map: *mut c_void,
    map_len: usize,
    /// The memory's first byte (inside `map`).
    base: *mut u8,
    /// Accessible bytes from `base`.
    size: usize,
    /// Bytes from `base` that may become accessible.
    reserved: usize,
}

// SAFETY: the mapping belongs to this value alone; wasmtime serialises
// access to the memory it wraps.
unsafe impl Send for Mapped {}
// SAFETY: as for Send; `&Mapped` only reads its fields.
unsafe impl Sync for Mapped {}

impl Mapped {
    fn new(reserved: usize, guard: usize, minimum: usize) -> rustix::io::Result<Mapped> {
        let too_large = rustix::io::Errno::NOMEM;
        let map_len = guard
            .checked_add(HUGE_PAGE)
            .and_then(|n| n.checked_add(reserved))
            .and_then(|n| n.checked_add(guard))
            .ok_or(too_large)?;
        // SAFETY: a new private mapping at an address the kernel picks: it
        // aliases nothing.
        let map = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                map_len,
                ProtFlags::empty(),
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )?
        };
        let start = map as usize;
        let base = (start + guard).next_multiple_of(HUGE_PAGE);
        // `base - start` < guard + HUGE_PAGE, so the memory and the guard
        // after it lie inside the mapping.
        let base = map.cast::<u8>().wrapping_add(base - start);
        let mut mapped = Mapped {
            map,
            map_len,
            base,
            size: 0,
            reserved,
        };
        if reserved > 0 {
            // Advice only: EINVAL where transparent huge pages are not built
            // in changes nothing but the page size.
            // SAFETY: inside our own mapping; no data is discarded.
            let _ = unsafe { rustix::mm::madvise(base.cast(), reserved, Advice::LinuxHugepage) };
        }
        mapped.grow_to(minimum).map_err(|_| too_large)?;
        Ok(mapped)
    }
}

// SAFETY: `base` stays put; the first `size` bytes are readable and
// writable, and the `reserved - size` bytes after them and the guard beyond
// are not, as wasmtime's code expects.
unsafe impl LinearMemory for Mapped {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.reserved
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.reserved {
            wasmtime::bail!(
                "a guest memory cannot grow to {new_size} bytes past its reservation of {} bytes",
                self.reserved
            );
        }
        if new_size <= self.size {
            return Ok(());
        }
        let page = rustix::param::page_size();
        if !new_size.is_multiple_of(page) {
            wasmtime::bail!("a guest memory cannot grow to {new_size} bytes: not whole host pages");
        }
        // SAFETY: pages of our own mapping, inside the reservation.
        unsafe {
            rustix::mm::mprotect(
                self.base.wrapping_add(self.size).cast(),
                new_size - self.size,
                MprotectFlags::READ | MprotectFlags::WRITE,
            )
        }
        .map_err(|e| {
            wasmtime::format_err!("cannot grow a guest memory to {new_size} bytes: {e}")
        })?;
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `new`, no longer used.
        let _ = unsafe { rustix::mm::munmap(self.map, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `VmFlags` of the mapping that holds `addr` (/proc/self/smaps).
    fn vm_flags(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = a <= addr && addr < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(flags) = line.strip_prefix("VmFlags:") {
                    return flags.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn a_memory_is_aligned_zeroed_grows_in_place_and_is_advised_huge() {
        let ty = MemoryType::new(1, None);
        let mem = HugePageMemories
            .new_memory(ty, 64 << 10, None, Some(64 << 20), 1 << 20)
            .unwrap();
        let mut mem = mem;
        let base = mem.as_ptr();
        assert_eq!(base as usize % HUGE_PAGE, 0);
        assert_eq!((mem.byte_size(), mem.byte_capacity()), (64 << 10, 64 << 20));
        mem.grow_to(4 << 20).unwrap();
        assert_eq!(mem.as_ptr(), base, "a memory never moves");
        assert_eq!(mem.byte_size(), 4 << 20);
        // SAFETY: the first 4 MiB are accessible now.
        let bytes = unsafe { std::slice::from_raw_parts_mut(base, 4 << 20) };
        assert!(bytes.iter().all(|b| *b == 0), "new memory is zero");
        bytes[(4 << 20) - 1] = 7;
        // Accessible pages read and write; the advice is on the reservation.
        let flags = vm_flags(base as usize);
        assert!(flags.contains("rd") && flags.contains("wr"), "{flags}");
        if std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"))
        {
            assert!(flags.contains("hg"), "{flags}");
        }
        // Past the size: not accessible.
        let past = vm_flags(base as usize + (4 << 20));
        assert!(!past.contains("rd") && !past.contains("wr"), "{past}");
        // Past the reservation it cannot grow.
        let err = mem.grow_to((64 << 20) + (64 << 10)).unwrap_err();
        assert!(format!("{err}").contains("reservation"), "{err}");
        assert_eq!(mem.byte_size(), 4 << 20);
    }

    #[test]
    fn shared_memories_are_refused_with_a_reason() {
        let shared = MemoryType::shared(1, 2);
        let err = HugePageMemories
            .new_memory(shared, 64 << 10, Some(128 << 10), Some(1 << 20), 0)
            .err()
            .unwrap();
        assert!(err.contains("shared"), "{err}");
    }
}
