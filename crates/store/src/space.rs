//! Space: segments of grains, the open segment, per-segment live bytes.
//!
//! Owns the state of every segment (free, open, closed), the sequential
//! allocator of the open segment, and two per-segment figures read without
//! the lock: live bytes (grains of records the index points at) and the stamp
//! of the segment's current use (records carry it; see FORMAT.md).
//!
//! Opening a segment writes its header before any record is allocated in
//! it, so a record on the device always sits in a segment whose header is
//! already there. GC (reclaiming closed segments) is not in this version:
//! when no segment is free, allocation fails with `NoSpace`.

use crate::error::{Error, Result};
use crate::options::Durability;
use granary_format::segment::{SegmentHeader, SegmentKind, Stream};
use granary_format::Superblock;
use granary_io::{AlignedBuf, Device};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SegState {
    Free,
    Open,
    Closed,
}

/// Where a record was placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    pub pba: u64,
    pub seg: u32,
    pub stamp: u32,
    pub grains: u64,
}

#[derive(Debug)]
struct OpenSeg {
    seg: u32,
    /// Next free grain, counted from the segment's start (grain 0 is the header).
    next: u64,
    stamp: u32,
}

struct Inner {
    state: Vec<SegState>,
    free: BTreeSet<u32>,
    open: Option<OpenSeg>,
    next_alloc_seq: u64,
}

pub(crate) struct Space {
    dev: Arc<dyn Device>,
    sb: Superblock,
    durability: Durability,
    live: Box<[AtomicU64]>,
    stamps: Box<[AtomicU32]>,
    inner: Mutex<Inner>,
}

/// What recovery found about one segment.
pub(crate) struct SegmentFound {
    pub seg: u32,
    pub alloc_seq: u64,
}

impl Space {
    /// Space with every segment free, `next_alloc_seq` 1.
    pub(crate) fn new(dev: Arc<dyn Device>, sb: Superblock, durability: Durability) -> Space {
        let n = sb.segment_count as usize;
        Space {
            dev,
            durability,
            live: (0..n).map(|_| AtomicU64::new(0)).collect(),
            stamps: (0..n).map(|_| AtomicU32::new(0)).collect(),
            inner: Mutex::new(Inner {
                state: vec![SegState::Free; n],
                free: (0..n as u32).collect(),
                open: None,
                next_alloc_seq: 1,
            }),
            sb,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Install what recovery found: `used` segments (in any order) are
    /// closed, except `resume`, which becomes the open segment with its next
    /// free grain at `resume_next`.
    pub(crate) fn install(&self, used: &[SegmentFound], resume: Option<(u32, u64)>) {
        let mut inner = self.lock();
        for s in used {
            inner.state[s.seg as usize] = SegState::Closed;
            inner.free.remove(&s.seg);
            self.stamps[s.seg as usize].store(s.alloc_seq as u32, Relaxed);
            inner.next_alloc_seq = inner.next_alloc_seq.max(s.alloc_seq + 1);
        }
        if let Some((seg, next)) = resume {
            if next < self.sb.segment_grains() {
                inner.state[seg as usize] = SegState::Open;
                let stamp = self.stamps[seg as usize].load(Relaxed);
                inner.open = Some(OpenSeg { seg, next, stamp });
            }
        }
    }

    /// Allocate `grains` contiguous grains in the open segment, opening a new
    /// one (and writing its header) when the current one is too full.
    /// `next_seq` is recorded in a new segment's header.
    pub(crate) fn alloc(&self, grains: u64, next_seq: u64) -> Result<Loc> {
        let seg_grains = self.sb.segment_grains();
        assert!(
            grains >= 1 && grains < seg_grains,
            "record larger than a segment reached the allocator"
        );
        let mut inner = self.lock();
        if let Some(open) = &mut inner.open {
            if open.next + grains <= seg_grains {
                let loc = Loc {
                    pba: self.pba(open.seg, open.next),
                    seg: open.seg,
                    stamp: open.stamp,
                    grains,
                };
                open.next += grains;
                return Ok(loc);
            }
            let seg = open.seg;
            inner.state[seg as usize] = SegState::Closed;
            inner.open = None;
        }
        let Some(seg) = inner.free.pop_first() else {
            return Err(Error::NoSpace {
                needed_bytes: grains * self.sb.grain_bytes as u64,
                segments: self.sb.segment_count,
            });
        };
        let alloc_seq = inner.next_alloc_seq;
        inner.next_alloc_seq += 1;
        if let Err(e) = self.write_header(seg, alloc_seq, next_seq) {
            inner.free.insert(seg);
            return Err(e);
        }
        let stamp = alloc_seq as u32;
        self.stamps[seg as usize].store(stamp, Relaxed);
        self.live[seg as usize].store(0, Relaxed);
        inner.state[seg as usize] = SegState::Open;
        inner.open = Some(OpenSeg {
            seg,
            next: 1 + grains,
            stamp,
        });
        Ok(Loc {
            pba: self.pba(seg, 1),
            seg,
            stamp,
            grains,
        })
    }

    fn write_header(&self, seg: u32, alloc_seq: u64, first_seq: u64) -> Result<()> {
        let g = self.sb.grain_bytes as usize;
        let mut buf = AlignedBuf::zeroed(g);
        SegmentHeader {
            kind: SegmentKind::Kv,
            stream: Stream::User,
            alloc_seq,
            uuid: self.sb.uuid,
            grain_bytes: self.sb.grain_bytes,
            segment_index: seg,
            segment_bytes: self.sb.segment_bytes,
            first_seq,
        }
        .encode(&mut buf);
        let offset = self.sb.segment_offset(seg);
        let (_, r) = self.dev.write_at(buf, offset);
        r.map_err(|source| Error::Io {
            op: "write of a segment header",
            offset,
            source,
        })?;
        if self.durability == Durability::Flush {
            self.dev.flush().map_err(|source| Error::Io {
                op: "flush",
                offset,
                source,
            })?;
        }
        Ok(())
    }

    pub(crate) fn pba(&self, seg: u32, grain: u64) -> u64 {
        self.sb.segment_offset(seg) / self.sb.grain_bytes as u64 + grain
    }

    pub(crate) fn add_live(&self, seg: u32, bytes: u64) {
        self.live[seg as usize].fetch_add(bytes, Relaxed);
    }

    pub(crate) fn sub_live(&self, seg: u32, bytes: u64) {
        let prev = self.live[seg as usize].fetch_sub(bytes, Relaxed);
        debug_assert!(prev >= bytes, "live bytes of segment {seg} went negative");
    }

    /// The stamp records of segment `seg`'s current use carry.
    pub(crate) fn stamp(&self, seg: u32) -> u32 {
        self.stamps[seg as usize].load(Relaxed)
    }

    pub(crate) fn live_of(&self, seg: u32) -> u64 {
        self.live[seg as usize].load(Relaxed)
    }

    pub(crate) fn live_bytes(&self) -> u64 {
        self.live.iter().map(|x| x.load(Relaxed)).sum()
    }

    /// (free, open, closed) segment counts.
    pub(crate) fn counts(&self) -> (u64, u64, u64) {
        let inner = self.lock();
        let mut c = (0, 0, 0);
        for s in &inner.state {
            match s {
                SegState::Free => c.0 += 1,
                SegState::Open => c.1 += 1,
                SegState::Closed => c.2 += 1,
            }
        }
        c
    }

    /// Segments that hold records, in no particular order.
    pub(crate) fn used_segments(&self) -> Vec<u32> {
        let inner = self.lock();
        (0..inner.state.len() as u32)
            .filter(|&s| inner.state[s as usize] != SegState::Free)
            .collect()
    }
}
