//! An emulated zoned block device (host-managed, as NVMe ZNS or SMR):
//! the rules of the Linux zoned block device interface, enforced, on
//! DRAM, for testing code that writes to zones on a machine without one.
//!
//! Owns an in-memory image cut into equal zones, each with a write
//! pointer and a condition (empty, implicitly or explicitly open, closed,
//! full). Invariants, checked on every operation (a violation fails the
//! operation with `InvalidInput`, leaves the zone unchanged and is
//! counted in [`ZonedDevice::violations`], so a test can require none):
//! - a write lies within one zone and starts at its write pointer, which
//!   it advances; a full zone takes no write;
//! - writing to an empty or closed zone opens it (implicitly); at most
//!   `max_open` zones are open and at most `max_active` (open or closed)
//!   at once. Where a real device would close an implicitly open zone to
//!   make room, the emulation refuses instead: stricter, so code that
//!   passes here stays within the limits on any device;
//! - a zone is rewritten only after a reset (`BLKRESETZONE`), which
//!   empties it (it reads as zeros); finishing (`BLKFINISHZONE`) makes it
//!   full; `BLKOPENZONE`/`BLKCLOSEZONE` open and close it explicitly.
//!
//! Reads are free anywhere; beyond a write pointer they return zeros.
//! [`Device::discard`] of whole zones resets them.
//!
//! As real ZNS drives, it may start with conventional zones
//! ([`ZonedDevice::with_conventional`]): written anywhere, never reset,
//! outside the open/active accounting (the store keeps its superblocks
//! there). The store's zoned mode runs on it (docs/ARCHITECTURE.md,
//! "Zoned mode").
//!
//! **Crash model** ([`ZonedDevice::plan_crash`]): a process crash after a
//! given number of writes (writes the device refuses are not counted).
//! The write at the crash lands a prefix of its
//! logical blocks (seeded: none to all), its zone's write pointer advanced by that
//! prefix, as a drive that writes a zone in order would leave it; every
//! operation after it fails (the process is gone) until
//! [`ZonedDevice::restart`]. Completed writes stay (the default `Direct`
//! durability's guarantee across a process crash).

use crate::{check_range, AlignedBuf, Device, IoCounters, IoResult, SimRng, ZoneGeometry};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

/// The condition of a zone (the kernel's `BLK_ZONE_COND_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneCond {
    Empty,
    ImplicitOpen,
    ExplicitOpen,
    Closed,
    Full,
    /// A conventional zone (no write pointer: `BLK_ZONE_COND_NOT_WP`).
    NotWp,
}

impl ZoneCond {
    fn open(self) -> bool {
        matches!(self, ZoneCond::ImplicitOpen | ZoneCond::ExplicitOpen)
    }
    fn active(self) -> bool {
        self.open() || self == ZoneCond::Closed
    }
}

/// One zone as a zone report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Zone {
    /// Write pointer, in bytes from the zone's start.
    pub wp: u64,
    pub cond: ZoneCond,
}

struct State {
    bytes: Vec<u8>,
    zones: Vec<Zone>,
    /// Writes left before the planned crash, and its generator.
    plan: Option<(u64, SimRng)>,
    /// The crash happened: every operation fails until a restart.
    crashed: bool,
}

/// See the module doc.
pub struct ZonedDevice {
    state: Mutex<State>,
    zone_bytes: u64,
    /// Zones `0..conventional` are conventional.
    conventional: usize,
    max_open: usize,
    max_active: usize,
    /// The logical block (4096, or 512 with [`ZonedDevice::with_block_bytes`]).
    block_bytes: u32,
    violations: AtomicU64,
    resets: AtomicU64,
    counters: IoCounters,
}

fn violation(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("zone rule violated: {what}"))
}

impl ZonedDevice {
    /// `zones` zones of `zone_bytes` (a multiple of 4096), empty, with at
    /// most `max_open` open and `max_active` active zones.
    pub fn new(zones: usize, zone_bytes: u64, max_open: usize, max_active: usize) -> ZonedDevice {
        assert!(zone_bytes > 0 && zone_bytes.is_multiple_of(4096) && zones > 0);
        assert!(max_open >= 1 && max_active >= max_open);
        ZonedDevice {
            state: Mutex::new(State {
                bytes: vec![0; zones * zone_bytes as usize],
                zones: vec![Zone { wp: 0, cond: ZoneCond::Empty }; zones],
                plan: None,
                crashed: false,
            }),
            zone_bytes,
            conventional: 0,
            max_open,
            max_active,
            block_bytes: 4096,
            violations: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            counters: IoCounters::default(),
        }
    }

    /// The first `n` zones conventional (written anywhere, never reset).
    pub fn with_conventional(mut self, n: usize) -> ZonedDevice {
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        assert!(n < st.zones.len(), "at least one sequential zone");
        for z in &mut st.zones[..n] {
            *z = Zone { wp: 0, cond: ZoneCond::NotWp };
        }
        self.conventional = n;
        self
    }

    /// Logical blocks of `bytes` (512 or 4096), as a ZNS namespace
    /// formatted with 512-byte LBAs: writes are then whole 512-byte blocks.
    pub fn with_block_bytes(mut self, bytes: u32) -> ZonedDevice {
        assert!(bytes == 512 || bytes == 4096, "{bytes}-byte blocks");
        self.block_bytes = bytes;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Crash after `writes` more writes (see the module doc); the torn
    /// prefix is drawn from `seed`.
    pub fn plan_crash(&self, writes: u64, seed: u64) {
        self.lock().plan = Some((writes, SimRng::new(seed)));
    }

    /// Whether the planned crash happened.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// After a crash (or none): the next process opens the device. Its
    /// zones stay as the crash left them (open zones stay open, as across
    /// a process restart); a planned crash that did not come is cancelled.
    pub fn restart(&self) {
        let mut st = self.lock();
        st.crashed = false;
        st.plan = None;
    }

    fn dead(&self) -> io::Error {
        io::Error::other("the emulated zoned device is gone (simulated crash)")
    }

    /// Zones open and active now.
    pub fn open_and_active(&self) -> (usize, usize) {
        Self::counts(&self.lock().zones)
    }

    pub fn zone_bytes(&self) -> u64 {
        self.zone_bytes
    }

    /// Operations refused for breaking a zone rule so far.
    pub fn violations(&self) -> u64 {
        self.violations.load(Relaxed)
    }

    /// Zone resets so far.
    pub fn resets(&self) -> u64 {
        self.resets.load(Relaxed)
    }

    /// Run `f` on the device's bytes (to corrupt or inspect them, as
    /// [`crate::MemDevice::with_bytes_mut`]); changes are kept, the zones'
    /// write pointers and conditions are not touched.
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.lock().bytes)
    }

    /// The zone report (`BLKREPORTZONE`).
    pub fn report(&self) -> Vec<Zone> {
        self.lock().zones.clone()
    }

    fn refuse<T>(&self, what: String) -> io::Result<T> {
        self.violations.fetch_add(1, Relaxed);
        Err(violation(what))
    }

    fn counts(zones: &[Zone]) -> (usize, usize) {
        let open = zones.iter().filter(|z| z.cond.open()).count();
        let active = zones.iter().filter(|z| z.cond.active()).count();
        (open, active)
    }

    /// Whether zone `z` (now `cond`) may become open.
    fn may_open(&self, zones: &[Zone], cond: ZoneCond) -> Result<(), String> {
        let (open, active) = Self::counts(zones);
        if open >= self.max_open {
            return Err(format!("{open} zones open already (max {})", self.max_open));
        }
        if cond == ZoneCond::Empty && active >= self.max_active {
            return Err(format!("{active} zones active already (max {})", self.max_active));
        }
        Ok(())
    }

    /// `z`, if it is a sequential zone.
    fn sequential(&self, z: usize, zones: usize) -> io::Result<usize> {
        if z >= zones {
            return self.refuse(format!("zone {z} does not exist ({zones} zones)"));
        }
        if z < self.conventional {
            return self.refuse(format!("zone {z} is conventional"));
        }
        Ok(z)
    }

    /// Whole sequential zones `offset..offset + len`, for `op`: the whole
    /// range is checked before any zone is touched (as Linux's zone
    /// management does), so a refused range changes nothing.
    fn whole_zones(&self, op: &str, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        if len == 0 || !offset.is_multiple_of(self.zone_bytes) || !len.is_multiple_of(self.zone_bytes) {
            return self.refuse(format!("{op} of {len} bytes at {offset} is not whole zones"));
        }
        let zones = self.lock().zones.len();
        let end = offset.checked_add(len).map(|e| e / self.zone_bytes).filter(|&e| e <= zones as u64);
        let Some(end) = end else {
            return self.refuse(format!("{op} of {len} bytes at {offset} runs past the last zone ({zones} zones)"));
        };
        let first = (offset / self.zone_bytes) as usize;
        self.sequential(first, zones)?;
        Ok(first..end as usize)
    }

    /// `BLKRESETZONE`: empty zone `z` (its write pointer back to 0).
    /// Resetting an empty zone does nothing and is not counted.
    pub fn reset_zone(&self, z: usize) -> io::Result<()> {
        let mut st = self.lock();
        if st.crashed {
            return Err(self.dead());
        }
        let z = self.sequential(z, st.zones.len())?;
        if st.zones[z].cond == ZoneCond::Empty {
            return Ok(());
        }
        let start = z * self.zone_bytes as usize;
        st.bytes[start..start + self.zone_bytes as usize].fill(0);
        st.zones[z] = Zone { wp: 0, cond: ZoneCond::Empty };
        self.resets.fetch_add(1, Relaxed);
        Ok(())
    }

    /// `BLKFINISHZONE`: zone `z` becomes full (no more writes until reset).
    /// An empty zone passes through open on its way, as on a device
    /// (null_blk checks both resources for it): refused when no zone may
    /// be opened or made active.
    pub fn finish_zone(&self, z: usize) -> io::Result<()> {
        let mut st = self.lock();
        if st.crashed {
            return Err(self.dead());
        }
        let z = self.sequential(z, st.zones.len())?;
        if st.zones[z].cond == ZoneCond::Empty {
            if let Err(e) = self.may_open(&st.zones, ZoneCond::Empty) {
                return self.refuse(format!("finishing empty zone {z}: {e}"));
            }
        }
        st.zones[z] = Zone { wp: self.zone_bytes, cond: ZoneCond::Full };
        Ok(())
    }

    /// `BLKOPENZONE`: open zone `z` explicitly.
    pub fn open_zone(&self, z: usize) -> io::Result<()> {
        let mut st = self.lock();
        if st.crashed {
            return Err(self.dead());
        }
        let z = self.sequential(z, st.zones.len())?;
        match st.zones[z].cond {
            ZoneCond::ExplicitOpen => Ok(()),
            ZoneCond::ImplicitOpen => {
                st.zones[z].cond = ZoneCond::ExplicitOpen;
                Ok(())
            }
            ZoneCond::Full => self.refuse(format!("zone {z} is full")),
            cond => match self.may_open(&st.zones, cond) {
                Ok(()) => {
                    st.zones[z].cond = ZoneCond::ExplicitOpen;
                    Ok(())
                }
                Err(e) => self.refuse(format!("opening zone {z}: {e}")),
            },
        }
    }

    /// `BLKCLOSEZONE`: close open zone `z` (it stays active unless empty).
    pub fn close_zone(&self, z: usize) -> io::Result<()> {
        let mut st = self.lock();
        if st.crashed {
            return Err(self.dead());
        }
        let z = self.sequential(z, st.zones.len())?;
        let zone = st.zones[z];
        if zone.cond.open() {
            st.zones[z].cond = if zone.wp == 0 { ZoneCond::Empty } else { ZoneCond::Closed };
        }
        Ok(())
    }
}

impl Device for ZonedDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let st = self.lock();
        if st.crashed {
            drop(st);
            return (buf, Err(self.dead()));
        }
        let o = offset as usize;
        let n = buf.len();
        buf.copy_from_slice(&st.bytes[o..o + n]);
        drop(st);
        self.counters.count_read(n);
        (buf, Ok(()))
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        let n = buf.len() as u64;
        if n == 0 {
            // Nothing to write (even at the device's end, past the last
            // zone), as the other devices.
            return (buf, Ok(()));
        }
        let z = (offset / self.zone_bytes) as usize;
        let mut st = self.lock();
        if st.crashed {
            drop(st);
            return (buf, Err(self.dead()));
        }
        let conventional = z < self.conventional;
        let start = z as u64 * self.zone_bytes;
        let zone = st.zones[z];
        let refused = if conventional {
            (offset + n > self.conventional as u64 * self.zone_bytes)
                .then(|| format!("write of {n} bytes at {offset} crosses into the sequential zones"))
        } else if offset + n > start + self.zone_bytes {
            Some(format!("write of {n} bytes at {offset} crosses the end of zone {z}"))
        } else if zone.cond == ZoneCond::Full {
            Some(format!("write at {offset} into full zone {z}"))
        } else if offset != start + zone.wp {
            Some(format!("write at {offset}, zone {z}'s write pointer is at {}", start + zone.wp))
        } else if !zone.cond.open() {
            self.may_open(&st.zones, zone.cond).err().map(|e| format!("write opening zone {z}: {e}"))
        } else {
            None
        };
        if let Some(what) = refused {
            // Refused before it reaches the media: not counted toward the
            // planned crash.
            drop(st);
            return (buf, self.refuse(what));
        }
        // The planned crash: this write lands a prefix of its blocks.
        // (Even all of it: the process is gone before the write returns.)
        let (mut land, mut crash) = (n, false);
        if let Some((left, rng)) = &mut st.plan {
            if *left == 0 {
                let block = self.block_bytes as u64;
                land = rng.below(n / block + 1) * block;
                crash = true;
            } else {
                *left -= 1;
            }
        }
        st.bytes[offset as usize..(offset + land) as usize].copy_from_slice(&buf[..land as usize]);
        if !conventional {
            let wp = zone.wp + land;
            let cond = if wp == self.zone_bytes {
                ZoneCond::Full
            } else if zone.cond.open() {
                zone.cond
            } else if wp == 0 {
                ZoneCond::Empty
            } else {
                ZoneCond::ImplicitOpen
            };
            st.zones[z] = Zone { wp, cond };
        }
        if crash {
            st.crashed = true;
            st.plan = None;
            drop(st);
            return (buf, Err(self.dead()));
        }
        drop(st);
        self.counters.count_write(n as usize);
        (buf, Ok(()))
    }

    /// Whole sequential zones only: each is reset.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.reset_zones(offset, len)?;
        self.counters.discard(len);
        Ok(())
    }

    /// Reads are copies out of DRAM, as the memory device's (the store
    /// then defaults to no blind overwrites, as there: zoned and
    /// conventional runs in memory compare like for like).
    fn in_memory(&self) -> bool {
        true
    }

    fn zones(&self) -> Option<ZoneGeometry> {
        Some(ZoneGeometry {
            zone_bytes: self.zone_bytes,
            conventional_bytes: self.conventional as u64 * self.zone_bytes,
            max_open: self.max_open,
            max_active: self.max_active,
        })
    }

    fn reset_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        for z in self.whole_zones("reset", offset, len)? {
            self.reset_zone(z)?;
        }
        Ok(())
    }

    fn finish_zones(&self, offset: u64, len: u64) -> io::Result<()> {
        for z in self.whole_zones("finish", offset, len)? {
            self.finish_zone(z)?;
        }
        Ok(())
    }

    fn write_pointer(&self, offset: u64) -> io::Result<u64> {
        let st = self.lock();
        if st.crashed {
            return Err(self.dead());
        }
        let z = self.sequential((offset / self.zone_bytes) as usize, st.zones.len())?;
        Ok(z as u64 * self.zone_bytes + st.zones[z].wp)
    }

    fn flush(&self) -> io::Result<()> {
        if self.lock().crashed {
            return Err(self.dead());
        }
        self.counters.flushes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.lock().zones.len() as u64 * self.zone_bytes
    }

    fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!("emulated zoned device ({} MiB zones)", self.zone_bytes >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZONE: u64 = 64 << 10;

    fn block(v: u8) -> AlignedBuf {
        let mut b = AlignedBuf::zeroed(4096);
        b.fill(v);
        b
    }

    #[test]
    fn writes_go_at_the_write_pointer_and_fill_the_zone() {
        let d = ZonedDevice::new(4, ZONE, 2, 3);
        d.write_at(block(1), 0).1.unwrap();
        d.write_at(block(2), 4096).1.unwrap();
        assert_eq!(d.report()[0], Zone { wp: 8192, cond: ZoneCond::ImplicitOpen });
        // Not at the write pointer: behind it, or ahead of it.
        assert!(d.write_at(block(3), 0).1.is_err());
        assert!(d.write_at(block(3), 12288).1.is_err());
        assert_eq!(d.violations(), 2);
        let (r, res) = d.read_at(AlignedBuf::zeroed(8192), 0);
        res.unwrap();
        assert!(r[..4096].iter().all(|&b| b == 1) && r[4096..].iter().all(|&b| b == 2));
        for i in 2..ZONE / 4096 {
            d.write_at(block(4), i * 4096).1.unwrap();
        }
        assert_eq!(d.report()[0].cond, ZoneCond::Full);
        assert!(d.write_at(block(5), ZONE - 4096).1.is_err(), "a full zone takes no write");
        // A write crossing into the next zone is refused.
        assert!(d.write_at(AlignedBuf::zeroed(8192), 2 * ZONE - 4096).1.is_err());
    }

    #[test]
    fn open_and_active_limits_are_enforced() {
        let d = ZonedDevice::new(4, ZONE, 2, 3);
        d.write_at(block(1), 0).1.unwrap();
        d.write_at(block(1), ZONE).1.unwrap();
        let e = d.write_at(block(1), 2 * ZONE).1.unwrap_err();
        assert!(e.to_string().contains("open already"), "{e}");
        d.close_zone(0).unwrap();
        assert_eq!(d.report()[0].cond, ZoneCond::Closed);
        d.write_at(block(1), 2 * ZONE).1.unwrap();
        // Three active (one closed, two open): a fourth may not open.
        d.close_zone(1).unwrap();
        let e = d.write_at(block(1), 3 * ZONE).1.unwrap_err();
        assert!(e.to_string().contains("active already"), "{e}");
        // Finishing one frees an active slot.
        d.finish_zone(0).unwrap();
        d.write_at(block(1), 3 * ZONE).1.unwrap();
        assert_eq!(d.violations(), 2);
    }

    /// An empty zone finished passes through open: refused while no zone
    /// may open or become active; a zone holding data is finished at any
    /// time (it is active already).
    #[test]
    fn finishing_an_empty_zone_needs_room_to_open_it() {
        let d = ZonedDevice::new(4, ZONE, 2, 2);
        d.write_at(block(1), 0).1.unwrap();
        d.write_at(block(1), ZONE).1.unwrap();
        let e = d.finish_zone(2).unwrap_err();
        assert!(e.to_string().contains("finishing empty zone 2"), "{e}");
        assert_eq!(d.report()[2].cond, ZoneCond::Empty);
        d.finish_zone(0).unwrap();
        d.finish_zone(2).unwrap();
        assert_eq!(d.report()[2].cond, ZoneCond::Full);
        assert_eq!(d.violations(), 1);
    }

    #[test]
    fn reset_empties_a_zone_for_rewriting_and_discard_resets_whole_zones() {
        let d = ZonedDevice::new(2, ZONE, 2, 2);
        d.write_at(block(9), 0).1.unwrap();
        d.reset_zone(0).unwrap();
        assert_eq!(d.report()[0], Zone { wp: 0, cond: ZoneCond::Empty });
        let (r, _) = d.read_at(AlignedBuf::zeroed(4096), 0);
        assert!(r.iter().all(|&b| b == 0));
        d.write_at(block(7), 0).1.unwrap();
        d.discard(0, ZONE).unwrap();
        assert_eq!(d.report()[0].wp, 0);
        assert!(d.discard(4096, 4096).is_err(), "part of a zone");
        assert_eq!((d.resets(), d.violations()), (2, 1));
        d.open_zone(1).unwrap();
        assert_eq!(d.report()[1].cond, ZoneCond::ExplicitOpen);
        assert!(d.reset_zone(5).is_err());
        // Resetting an empty zone is no reset.
        d.reset_zone(0).unwrap();
        assert_eq!(d.resets(), 2);
    }

    /// A zone command over a range that is empty, runs past the last zone
    /// or starts in a conventional zone is refused before any zone is
    /// touched (a reset running past the end emptied the zones before it).
    #[test]
    fn zone_ranges_are_checked_before_any_zone_changes() {
        let d = ZonedDevice::new(4, ZONE, 2, 2).with_conventional(1);
        d.write_at(block(3), 2 * ZONE).1.unwrap();
        let before = d.report();
        assert!(d.reset_zones(2 * ZONE, 4 * ZONE).is_err(), "past the last zone");
        assert!(d.finish_zones(2 * ZONE, 4 * ZONE).is_err(), "past the last zone");
        assert!(d.reset_zones(2 * ZONE, u64::MAX - ZONE + 1).is_err(), "an end that wraps");
        assert!(d.reset_zones(0, 3 * ZONE).is_err(), "from a conventional zone");
        assert!(d.reset_zones(2 * ZONE, 0).is_err(), "no zone");
        assert_eq!(d.report(), before, "nothing changed");
        assert_eq!(d.violations(), 5);
        d.reset_zones(2 * ZONE, 2 * ZONE).unwrap();
        assert_eq!(d.report()[2], Zone { wp: 0, cond: ZoneCond::Empty });
    }

    /// A write of no bytes at the device's end (past the last zone) does
    /// nothing, as on the other devices (it indexed one zone too far).
    #[test]
    fn an_empty_write_at_the_end_does_nothing() {
        let d = ZonedDevice::new(2, ZONE, 2, 2);
        d.write_at(AlignedBuf::zeroed(0), 2 * ZONE).1.unwrap();
        d.write_at(AlignedBuf::zeroed(0), ZONE).1.unwrap();
        assert_eq!(d.report(), vec![Zone { wp: 0, cond: ZoneCond::Empty }; 2]);
    }

    #[test]
    fn conventional_zones_take_writes_anywhere_and_no_zone_commands() {
        let d = ZonedDevice::new(4, ZONE, 1, 1).with_conventional(2);
        d.write_at(block(1), 4096).1.unwrap();
        d.write_at(block(2), 0).1.unwrap();
        d.write_at(block(3), 4096).1.unwrap();
        d.write_at(block(4), ZONE + 8192).1.unwrap();
        let (r, _) = d.read_at(AlignedBuf::zeroed(8192), 0);
        assert!(r[..4096].iter().all(|&b| b == 2) && r[4096..].iter().all(|&b| b == 3));
        assert_eq!(d.open_and_active(), (0, 0), "conventional zones are never open");
        assert!(d.write_at(AlignedBuf::zeroed(8192), 2 * ZONE - 4096).1.is_err(), "into a sequential zone");
        assert!(d.reset_zone(1).is_err() && d.finish_zones(0, ZONE).is_err());
        assert!(d.write_pointer(0).is_err());
        assert_eq!(d.write_pointer(2 * ZONE).unwrap(), 2 * ZONE);
        d.write_at(block(5), 2 * ZONE).1.unwrap();
        assert_eq!(d.write_pointer(2 * ZONE + 100).unwrap(), 2 * ZONE + 4096);
        let g = d.zones().unwrap();
        assert_eq!((g.zone_bytes, g.conventional_bytes, g.max_open, g.max_active), (ZONE, 2 * ZONE, 1, 1));
        d.finish_zones(2 * ZONE, ZONE).unwrap();
        assert_eq!(d.report()[2].cond, ZoneCond::Full);
        d.reset_zones(2 * ZONE, 2 * ZONE).unwrap();
        assert_eq!(d.report()[2], Zone { wp: 0, cond: ZoneCond::Empty });
    }

    /// The planned crash lands a prefix of the write, keeps the writes
    /// before it, fails everything after it until the restart.
    #[test]
    fn a_crash_tears_the_write_at_the_write_pointer_and_stops_the_device() {
        for seed in 0..20 {
            let d = ZonedDevice::new(2, ZONE, 2, 2);
            d.plan_crash(2, seed);
            d.write_at(block(1), 0).1.unwrap();
            d.write_at(block(2), 4096).1.unwrap();
            let mut big = AlignedBuf::zeroed(4 * 4096);
            big.fill(3);
            assert!(d.write_at(big, 8192).1.is_err(), "seed {seed}: the crash");
            assert!(d.crashed());
            assert!(d.read_at(AlignedBuf::zeroed(4096), 0).1.is_err() && d.flush().is_err());
            d.restart();
            let wp = d.write_pointer(0).unwrap();
            assert!((8192..=8192 + 4 * 4096).contains(&wp) && wp.is_multiple_of(4096), "seed {seed}: {wp}");
            let (r, _) = d.read_at(AlignedBuf::zeroed(ZONE as usize), 0);
            assert!(r[..4096].iter().all(|&b| b == 1) && r[4096..8192].iter().all(|&b| b == 2));
            assert!(r[8192..wp as usize].iter().all(|&b| b == 3) && r[wp as usize..].iter().all(|&b| b == 0));
            d.write_at(block(4), wp).1.unwrap();
            assert_eq!(d.violations(), 0);
        }
    }

    /// A write the device refuses (here: not at the write pointer) never
    /// reaches the media, so it does not count toward a planned crash.
    #[test]
    fn a_refused_write_does_not_count_toward_the_planned_crash() {
        let d = ZonedDevice::new(4, ZONE, 4, 4);
        d.plan_crash(1, 5);
        assert!(d.write_at(block(9), 4096).1.is_err(), "not at the write pointer");
        assert!(!d.crashed(), "a refused write is not the crash");
        d.write_at(block(1), 0).1.unwrap();
        assert!(d.write_at(block(2), 4096).1.is_err() && d.crashed(), "the crash comes at the second write");
        assert_eq!(d.violations(), 1);
    }
}
