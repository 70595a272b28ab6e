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
//! A memory that is dropped is kept for the next one of the same layout
//! (at most [`SPARE_MEMORIES`]): its accessible bytes are zeroed then (the
//! first [`KEEP_RESIDENT`] by writing zeros over pages that stay resident,
//! the rest handed back to the kernel) and made inaccessible again. A new
//! flow, or a sleeping one that wakes, then starts on warm pages instead of
//! faulting in fresh ones: on the VM this was measured on, the kernel took
//! 29 ms to zero the huge pages of one back-fill's 62 MiB state.
//!
//! When a memory is handed out and no spare of its layout is left, one is
//! prepared once no memory was handed out for [`PREPARE_AFTER`]: on a
//! thread of its own, a new mapping has its first [`KEEP_RESIDENT`] bytes
//! faulted in (zero) and goes to the spares, unless a dropped memory got
//! there first. So a flow created after others, with none dropped in
//! between, starts on warm pages too. Measured with three back-fills of 1M
//! rows after a flow on an empty table: without this, the first (no spare)
//! took 319-372 ms against 214-329 ms for the next two, which found the
//! first one's memory, and 21% of its flow's thread was the kernel zeroing
//! pages; its flow's thread used 260-308 ms of CPU against 155-249. With
//! it, the spare was ready before the first back-fill (43-111 ms of CPU on
//! its own thread) and the first was no slower than the next two (331 and
//! 240 ms against 322-326 and 217-257; no page zeroing in its flow's
//! thread). The price is the spares' resident memory, at most
//! [`SPARE_MEMORIES`] times [`KEEP_RESIDENT`], as when flows are dropped.
//!
//! Must not know what runs in the memory.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags};
use wasmtime::{LinearMemory, MemoryCreator, MemoryType};

/// The size of a transparent huge page on x86-64 and aarch64 (4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Most dropped memories kept for reuse.
pub(crate) const SPARE_MEMORIES: usize = 2;

/// Most bytes of a kept memory that stay resident (zeroed); the rest is
/// handed back to the kernel.
pub(crate) const KEEP_RESIDENT: usize = 64 << 20;

/// How long after a memory was handed out with no spare of its layout left
/// a new spare is prepared: a flow that just started has the machine first.
pub(crate) const PREPARE_AFTER: Duration = Duration::from_secs(1);

/// Makes the memories of an engine (`Config::with_host_memory`).
pub(crate) struct HugePageMemories {
    spare: Arc<Spare>,
    /// When a spare is prepared after a memory is handed out with none
    /// left ([`PREPARE_AFTER`]; `None`: never).
    prepare_after: Option<Duration>,
}

impl Default for HugePageMemories {
    fn default() -> HugePageMemories {
        HugePageMemories {
            spare: Arc::default(),
            prepare_after: Some(PREPARE_AFTER),
        }
    }
}

/// Dropped (or prepared) memories, zeroed and inaccessible, for the next
/// ones.
#[derive(Default)]
struct Spare {
    maps: Mutex<Vec<Mapped>>,
    /// A spare is being prepared (at most one at a time).
    preparing: AtomicBool,
    /// When a memory was last handed out.
    handed_out: Mutex<Option<Instant>>,
}

impl Spare {
    /// A kept memory of this layout, if there is one.
    fn take(&self, reserved: usize, guard: usize) -> Option<Mapped> {
        let mut maps = self.maps.lock().ok()?;
        let at = maps.iter().position(|m| m.has_layout(reserved, guard))?;
        Some(maps.swap_remove(at))
    }

    fn has_room(&self) -> bool {
        self.maps.lock().is_ok_and(|m| m.len() < SPARE_MEMORIES)
    }

    /// Whether a memory of this layout is kept.
    fn holds(&self, reserved: usize, guard: usize) -> bool {
        self.maps
            .lock()
            .is_ok_and(|maps| maps.iter().any(|m| m.has_layout(reserved, guard)))
    }

    /// Keeps `m` (dropped instead when there is no room left).
    fn put(&self, m: Mapped) {
        if let Ok(mut maps) = self.maps.lock() {
            if maps.len() < SPARE_MEMORIES {
                maps.push(m);
            }
        }
    }

    /// Notes that a memory was handed out now.
    fn handing_out(&self) {
        if let Ok(mut at) = self.handed_out.lock() {
            *at = Some(Instant::now());
        }
    }

    /// How long ago a memory was last handed out.
    fn since_handed_out(&self) -> Duration {
        self.handed_out
            .lock()
            .ok()
            .and_then(|at| at.map(|t| t.elapsed()))
            .unwrap_or(Duration::MAX)
    }

    /// Prepares a spare of this layout on a thread of its own once no
    /// memory was handed out for `after` (flows starting one after another
    /// have the machine to themselves, and give theirs back when dropped),
    /// unless one is kept by then. Only an optimisation: a failure leaves
    /// things as they were.
    fn prepare(self: &Arc<Self>, reserved: usize, guard: usize, after: Duration) {
        if self.preparing.swap(true, Ordering::AcqRel) {
            return;
        }
        let spare = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("sandbox-spare".into())
            .spawn(move || {
                let mut wait = after;
                let spare = loop {
                    std::thread::sleep(wait);
                    let Some(spare) = spare.upgrade() else {
                        return;
                    };
                    match spare.since_handed_out() {
                        quiet if quiet >= after => break spare,
                        quiet => wait = after - quiet,
                    }
                };
                if spare.has_room() && !spare.holds(reserved, guard) {
                    if let Ok(m) = Mapped::prepared(reserved, guard, KEEP_RESIDENT) {
                        spare.put(m);
                    }
                }
                spare.preparing.store(false, Ordering::Release);
            });
        if spawned.is_err() {
            self.preparing.store(false, Ordering::Release);
        }
    }
}

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
        let mut mapped = match self.spare.take(reserved, guard_size_in_bytes) {
            Some(m) => m,
            None => Mapped::new(reserved, guard_size_in_bytes)
                .map_err(|e| format!("cannot map a guest memory of {reserved} bytes: {e}"))?,
        };
        self.spare.handing_out();
        if let Some(after) = self.prepare_after {
            if !self.spare.holds(reserved, guard_size_in_bytes) {
                self.spare.prepare(reserved, guard_size_in_bytes, after);
            }
        }
        mapped
            .grow_to(minimum)
            .map_err(|e| format!("cannot make a guest memory of {minimum} bytes: {e}"))?;
        mapped.spare = Some(self.spare.clone());
        Ok(Box::new(mapped))
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
    /// Inaccessible bytes after the reservation (and at least as many before).
    guard: usize,
    /// Where the memory goes when dropped, to be reused.
    spare: Option<Arc<Spare>>,
}

// SAFETY: the mapping belongs to this value alone; wasmtime serialises
// access to the memory it wraps.
unsafe impl Send for Mapped {}
// SAFETY: as for Send; `&Mapped` only reads its fields.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// A new mapping with nothing accessible yet.
    fn new(reserved: usize, guard: usize) -> rustix::io::Result<Mapped> {
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
        let mapped = Mapped {
            map,
            map_len,
            base,
            size: 0,
            reserved,
            guard,
            spare: None,
        };
        if reserved > 0 {
            // Advice only: EINVAL where transparent huge pages are not built
            // in changes nothing but the page size.
            // SAFETY: inside our own mapping; no data is discarded.
            let _ = unsafe { rustix::mm::madvise(base.cast(), reserved, Advice::LinuxHugepage) };
        }
        Ok(mapped)
    }

    /// Whether this mapping has the layout a memory of `reserved` bytes
    /// with `guard` bytes of guard asks for.
    fn has_layout(&self, reserved: usize, guard: usize) -> bool {
        self.reserved == reserved && self.guard == guard
    }

    /// A new mapping whose first `resident` bytes (at most the reservation)
    /// are faulted in, zero, and inaccessible: what a dropped memory leaves.
    fn prepared(reserved: usize, guard: usize, resident: usize) -> rustix::io::Result<Mapped> {
        let m = Mapped::new(reserved, guard)?;
        let n = resident.min(reserved);
        if n == 0 {
            return Ok(m);
        }
        // SAFETY: the start of our own new mapping, which nobody else uses.
        unsafe {
            rustix::mm::mprotect(m.base.cast(), n, MprotectFlags::READ | MprotectFlags::WRITE)
        }?;
        // Faulted in by the kernel (zero pages, huge where it can), or where
        // that is not supported (before Linux 5.14) by a write to each page.
        // SAFETY: inside our own mapping, just made writable.
        let populated =
            unsafe { rustix::mm::madvise(m.base.cast(), n, Advice::LinuxPopulateWrite) };
        if populated.is_err() {
            let page = rustix::param::page_size();
            for at in (0..n).step_by(page) {
                // SAFETY: a writable byte of our own mapping; it is zero
                // already, so writing zero changes nothing but residency.
                unsafe { m.base.wrapping_add(at).write_volatile(0) };
            }
        }
        // SAFETY: inside our own mapping.
        unsafe { rustix::mm::mprotect(m.base.cast(), n, MprotectFlags::empty()) }?;
        Ok(m)
    }

    /// Zeroes what the memory's user could reach and makes it inaccessible
    /// again: the first [`KEEP_RESIDENT`] bytes by writing zeros (the pages
    /// stay), the rest handed back to the kernel (they come back zero).
    fn reset(&mut self) -> rustix::io::Result<()> {
        let keep = self.size.min(KEEP_RESIDENT);
        // SAFETY: the memory's accessible bytes, which nobody uses any more
        // (the memory is being dropped).
        unsafe { std::ptr::write_bytes(self.base, 0, keep) };
        if self.size > keep {
            // SAFETY: inside our own mapping; discarding its contents is
            // the point.
            unsafe {
                rustix::mm::madvise(
                    self.base.wrapping_add(keep).cast(),
                    self.size - keep,
                    Advice::LinuxDontNeed,
                )
            }?;
        }
        if self.size > 0 {
            // SAFETY: inside our own mapping.
            unsafe { rustix::mm::mprotect(self.base.cast(), self.size, MprotectFlags::empty()) }?;
        }
        self.size = 0;
        Ok(())
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
        if self.map.is_null() {
            return;
        }
        if let Some(spare) = self.spare.take() {
            if spare.has_room() && self.reset().is_ok() {
                // The mapping moves into the spare list; this value no
                // longer owns it.
                spare.put(Mapped {
                    map: std::mem::replace(&mut self.map, std::ptr::null_mut()),
                    map_len: self.map_len,
                    base: self.base,
                    size: 0,
                    reserved: self.reserved,
                    guard: self.guard,
                    spare: None,
                });
                return;
            }
        }
        // SAFETY: the whole mapping made in `new`, no longer used.
        let _ = unsafe { rustix::mm::munmap(self.map, self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The field `name` (`VmFlags`, `Rss`, ...) of the mapping that holds
    /// `addr` (/proc/self/smaps).
    fn smaps_field(addr: usize, name: &str) -> String {
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
                if let Some(value) = line.strip_prefix(name).and_then(|l| l.strip_prefix(':')) {
                    return value.trim().to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    /// The `VmFlags` of the mapping that holds `addr`.
    fn vm_flags(addr: usize) -> String {
        smaps_field(addr, "VmFlags")
    }

    /// The resident KiB of the mapping that holds `addr`.
    fn rss_kib(addr: usize) -> u64 {
        let rss = smaps_field(addr, "Rss");
        rss.trim_end_matches("kB").trim().parse().unwrap()
    }

    #[test]
    fn a_memory_is_aligned_zeroed_grows_in_place_and_is_advised_huge() {
        let ty = MemoryType::new(1, None);
        let mem = HugePageMemories::default()
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
    fn a_dropped_memory_is_reused_zeroed_and_inaccessible_past_the_new_size() {
        // No spare prepared behind the test's back: which mapping comes
        // back is the point.
        let creator = HugePageMemories {
            prepare_after: None,
            ..HugePageMemories::default()
        };
        let ty = MemoryType::new(1, None);
        let layout = (Some(64 << 20), 1 << 20);
        let mut first = creator
            .new_memory(ty.clone(), 1 << 20, None, layout.0, layout.1)
            .unwrap();
        first.grow_to(8 << 20).unwrap();
        let base = first.as_ptr();
        // SAFETY: the first 8 MiB are accessible.
        unsafe { std::slice::from_raw_parts_mut(base, 8 << 20) }.fill(0xab);
        drop(first);
        let mut second = creator
            .new_memory(ty.clone(), 64 << 10, None, layout.0, layout.1)
            .unwrap();
        assert_eq!(second.as_ptr(), base, "the dropped mapping is reused");
        assert_eq!(second.byte_size(), 64 << 10);
        let past = vm_flags(base as usize + (64 << 10));
        assert!(!past.contains("rd") && !past.contains("wr"), "{past}");
        second.grow_to(8 << 20).unwrap();
        // SAFETY: the first 8 MiB are accessible again.
        let bytes = unsafe { std::slice::from_raw_parts(base, 8 << 20) };
        assert!(bytes.iter().all(|b| *b == 0), "a reused memory is zero");
        // Another layout does not take it.
        let mut big = creator
            .new_memory(ty, 64 << 10, None, Some(128 << 20), 1 << 20)
            .unwrap();
        assert_ne!(big.as_ptr(), base);
        // Past KEEP_RESIDENT, a kept memory's bytes are handed back to the
        // kernel; they read zero too.
        let size = KEEP_RESIDENT + (8 << 20);
        big.grow_to(size).unwrap();
        let b = big.as_ptr();
        // SAFETY: `size` bytes are accessible.
        unsafe { std::slice::from_raw_parts_mut(b, size) }.fill(1);
        drop(big);
        let again = creator
            .new_memory(
                MemoryType::new(1, None),
                size,
                None,
                Some(128 << 20),
                1 << 20,
            )
            .unwrap();
        assert_eq!(again.as_ptr(), b);
        // SAFETY: `size` bytes are accessible.
        let bytes = unsafe { std::slice::from_raw_parts(b, size) };
        assert!(bytes.iter().all(|x| *x == 0), "a reused memory is zero");
    }

    #[test]
    fn a_spare_is_prepared_resident_and_zero_when_none_is_left() {
        let creator = HugePageMemories {
            prepare_after: Some(Duration::ZERO),
            ..HugePageMemories::default()
        };
        let ty = MemoryType::new(1, None);
        let (reserved, guard) = (16 << 20, 1 << 20);
        let first = creator
            .new_memory(ty.clone(), 64 << 10, None, Some(reserved), guard)
            .unwrap();
        // Prepared on a thread of its own, soon.
        let waited = std::time::Instant::now();
        while !creator.spare.holds(reserved, guard) {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "no spare was prepared"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut second = creator
            .new_memory(ty, 64 << 10, None, Some(reserved), guard)
            .unwrap();
        let base = second.as_ptr();
        assert_ne!(base, first.as_ptr());
        // Past the size: resident already, and not accessible.
        let past = base as usize + (64 << 10);
        let flags = vm_flags(past);
        assert!(!flags.contains("rd") && !flags.contains("wr"), "{flags}");
        assert!(rss_kib(past) >= 8 << 10, "{} KiB resident", rss_kib(past));
        second.grow_to(reserved).unwrap();
        // SAFETY: the whole reservation is accessible now.
        let bytes = unsafe { std::slice::from_raw_parts(base, reserved) };
        assert!(bytes.iter().all(|b| *b == 0), "a prepared memory is zero");
    }

    #[test]
    fn shared_memories_are_refused_with_a_reason() {
        let shared = MemoryType::shared(1, 2);
        let err = HugePageMemories::default()
            .new_memory(shared, 64 << 10, Some(128 << 10), Some(1 << 20), 0)
            .err()
            .unwrap();
        assert!(err.contains("shared"), "{err}");
    }
}
