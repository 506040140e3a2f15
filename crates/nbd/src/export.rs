//! What the server serves: [`Exports`], the named block devices a client
//! may choose, and [`Export`], one of them as fixed-size blocks with
//! per-block reads, writes, read-modify-writes and trims, and a sync.
//!
//! The server never sees how blocks are stored: the engine's block
//! namespaces implement these traits (`store_export`),
//! and [`crate::mem`] keeps blocks in memory for tests.
//!
//! Invariants an implementation keeps:
//! - a block never written, or trimmed, reads as absent (`None`), which
//!   the server sends as zeroes: a trim is the way to write zeroes;
//! - each block operation is atomic with respect to every other write of
//!   the same block, and [`Export::update_block`] runs its
//!   read-modify-write under the block's lock, so two partial writes of
//!   one block (two 512-byte sectors of a 4 KiB block) both land;
//! - an operation that returned `Ok` is visible to every later read, on
//!   any connection, and durable under the store's durability rule;
//!   [`Export::sync`] returns once every write acknowledged before it was
//!   called is on stable storage.

use crate::limits::{EXPORT_BLOCK_BYTES_MAX, EXPORT_BLOCK_BYTES_MIN};
use std::future::Future;
use std::io;
use std::sync::Arc;

/// An export as `NBD_OPT_LIST` and `NBD_OPT_INFO` describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub size_bytes: u64,
    pub block_bytes: u32,
    /// Text for a human (sent after the name in `NBD_REP_SERVER`, and as
    /// `NBD_INFO_DESCRIPTION`); empty = none.
    pub description: String,
}

/// The exports a server offers. Shared by every executor.
pub trait Exports: Send + Sync + 'static {
    type Export: Export;

    /// Every export, for `NBD_OPT_LIST`.
    fn list(&self) -> Vec<ExportInfo>;

    /// The export named `name` (the empty name is the "default export" of
    /// the protocol, which an implementation may leave unknown); None if
    /// there is none. Called on an executor: it must not block on IO.
    fn open(&self, name: &str) -> Option<Arc<Self::Export>>;
}

/// One export: `size_bytes` bytes in blocks of `block_bytes` (block `n`
/// holds bytes `n * block_bytes ..`; the last block may extend past the
/// end, whose bytes are never read nor written by the server). Its futures
/// run on the connection's executor and need not be `Send`. The server
/// passes only blocks that hold bytes of the export.
pub trait Export: 'static {
    /// The export's size in bytes.
    fn size_bytes(&self) -> u64;

    /// The block size: a power of two in
    /// [`EXPORT_BLOCK_BYTES_MIN`]..=[`EXPORT_BLOCK_BYTES_MAX`] (checked by
    /// [`Geometry::of`]).
    fn block_bytes(&self) -> u32;

    /// Text for a human, empty by default.
    fn description(&self) -> String {
        String::new()
    }

    /// Block `n`'s bytes, or None if it reads as zeroes (never written, or
    /// trimmed). A value shorter than the block reads as zeroes after its
    /// end.
    fn read_block(&self, n: u64) -> impl Future<Output = io::Result<Option<Vec<u8>>>>;

    /// Replace block `n` with `data` (exactly one block).
    fn write_block(&self, n: u64, data: &[u8]) -> impl Future<Output = io::Result<()>>;

    /// Blocks `first .. first + out.len() / block_bytes` into `out` (a
    /// whole number of blocks, zeroes on entry), each block as
    /// [`Export::read_block`] reads it; a block reading as absent, and the
    /// part of a short value past its end, are left zeroes. One call may
    /// share device reads between the blocks (a request's run of whole
    /// blocks is one call); the default reads one block after another.
    fn read_blocks(&self, first: u64, out: &mut [u8]) -> impl Future<Output = io::Result<()>> {
        async move {
            let b = self.block_bytes() as usize;
            for (i, o) in out.chunks_mut(b).enumerate() {
                if let Some(v) = self.read_block(first + i as u64).await? {
                    let n = v.len().min(o.len());
                    o[..n].copy_from_slice(&v[..n]);
                }
            }
            Ok(())
        }
    }

    /// Replace blocks `first .. first + data.len() / block_bytes` with
    /// `data` (a whole number of blocks), each block's write atomic as
    /// [`Export::write_block`]'s; the blocks together are not (after an
    /// error some may hold the new data). One call may share device writes
    /// between the blocks; the default writes one block after another.
    fn write_blocks(&self, first: u64, data: &[u8]) -> impl Future<Output = io::Result<()>> {
        async move {
            let b = self.block_bytes() as usize;
            for (i, d) in data.chunks(b).enumerate() {
                self.write_block(first + i as u64, d).await?;
            }
            Ok(())
        }
    }

    /// Replace bytes `at .. at + data.len()` of block `n` with `data`, the
    /// others kept (zeroes if the block reads as absent), as one atomic
    /// read-modify-write under the block's lock. An implementation may
    /// trim a block that ends up all zeroes.
    fn update_block(&self, n: u64, at: usize, data: &[u8]) -> impl Future<Output = io::Result<()>>;

    /// Make block `n` read as zeroes (its space freed).
    fn trim_block(&self, n: u64) -> impl Future<Output = io::Result<()>>;

    /// Return once every write acknowledged before the call is on stable
    /// storage (every connection's: the barrier is the store's).
    fn sync(&self) -> impl Future<Output = io::Result<()>>;
}

/// An export's size and block size, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub size_bytes: u64,
    pub block_bytes: u32,
}

impl Geometry {
    /// `e`'s geometry, or why the server cannot serve it.
    pub fn of<E: Export + ?Sized>(e: &E) -> Result<Geometry, String> {
        let (size_bytes, block_bytes) = (e.size_bytes(), e.block_bytes());
        if !block_bytes.is_power_of_two() || !(EXPORT_BLOCK_BYTES_MIN..=EXPORT_BLOCK_BYTES_MAX).contains(&block_bytes) {
            return Err(format!(
                "block size {block_bytes} is not a power of two in {EXPORT_BLOCK_BYTES_MIN}..={EXPORT_BLOCK_BYTES_MAX}"
            ));
        }
        Ok(Geometry { size_bytes, block_bytes })
    }

    /// The info of export `name` with this geometry.
    pub fn info(&self, name: &str, description: String) -> ExportInfo {
        ExportInfo { name: name.to_string(), size_bytes: self.size_bytes, block_bytes: self.block_bytes, description }
    }
}

/// One block's part of a byte range: bytes `at .. at + len` of block
/// `block`, which are bytes `from .. from + len` of the range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub block: u64,
    pub at: usize,
    pub len: usize,
    pub from: usize,
}

impl Span {
    /// Whether the span is its whole block.
    pub fn whole(&self, block_bytes: u32) -> bool {
        self.at == 0 && self.len == block_bytes as usize
    }
}

/// A request's range as the server runs it: runs of whole blocks, each at
/// most `run_bytes` (and at least one block), and the partial blocks at
/// its edges, one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Blocks `first .. first + count`: bytes `from .. from + count * block_bytes`
    /// of the range.
    Run { first: u64, count: usize, from: usize },
    /// A block written or read partially.
    Edge(Span),
}

impl Part {
    /// Bytes of the range it covers.
    pub fn len(&self, block_bytes: u32) -> usize {
        match self {
            Part::Run { count, .. } => count * block_bytes as usize,
            Part::Edge(s) => s.len,
        }
    }
}

/// The parts of `offset .. offset + len` in blocks of `block_bytes`, in
/// order (see [`Part`]).
pub(crate) fn parts(offset: u64, len: u64, block_bytes: u32, run_bytes: usize) -> impl Iterator<Item = Part> {
    let most = (run_bytes / block_bytes as usize).max(1);
    let mut spans = spans(offset, len, block_bytes).peekable();
    std::iter::from_fn(move || {
        let s = spans.next()?;
        if !s.whole(block_bytes) {
            return Some(Part::Edge(s));
        }
        let mut count = 1;
        while count < most && spans.peek().is_some_and(|n| n.whole(block_bytes)) {
            spans.next();
            count += 1;
        }
        Some(Part::Run { first: s.block, count, from: s.from })
    })
}

/// The spans of `offset .. offset + len` in blocks of `block_bytes`, in
/// order. The range must be within `u64` (the caller checked it against
/// the export's size).
pub(crate) fn spans(offset: u64, len: u64, block_bytes: u32) -> impl Iterator<Item = Span> {
    let b = u64::from(block_bytes);
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let block = pos / b;
        let at = pos % b;
        let n = (b - at).min(end - pos);
        let s = Span { block, at: at as usize, len: n as usize, from: (pos - offset) as usize };
        pos += n;
        Some(s)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_the_range_once() {
        let all: Vec<Span> = spans(1000, 9000, 4096).collect();
        assert_eq!(
            all,
            vec![
                Span { block: 0, at: 1000, len: 3096, from: 0 },
                Span { block: 1, at: 0, len: 4096, from: 3096 },
                Span { block: 2, at: 0, len: 1808, from: 7192 },
            ]
        );
        assert!(all[1].whole(4096) && !all[0].whole(4096));
        assert_eq!(spans(8192, 8192, 4096).count(), 2);
        assert_eq!(spans(5, 0, 4096).count(), 0);
        assert_eq!(spans(4095, 2, 4096).map(|s| s.len).collect::<Vec<_>>(), vec![1, 1]);
    }

    #[test]
    fn parts_group_whole_blocks_into_runs() {
        let all: Vec<Part> = parts(1000, 5 * 4096, 4096, 8192).collect();
        assert_eq!(
            all,
            vec![
                Part::Edge(Span { block: 0, at: 1000, len: 3096, from: 0 }),
                Part::Run { first: 1, count: 2, from: 3096 },
                Part::Run { first: 3, count: 2, from: 3096 + 8192 },
                Part::Edge(Span { block: 5, at: 0, len: 1000, from: 3096 + 16384 }),
            ]
        );
        assert_eq!(all.iter().map(|p| p.len(4096)).sum::<usize>(), 5 * 4096);
        // A run holds at least one block, whatever its limit.
        assert_eq!(parts(0, 3 * 4096, 4096, 100).count(), 3);
        assert_eq!(
            parts(0, 1 << 20, 4096, 1 << 20).collect::<Vec<_>>(),
            vec![Part::Run { first: 0, count: 256, from: 0 }]
        );
        assert_eq!(parts(512, 512, 4096, 1 << 20).count(), 1);
    }
}
