//! Exports kept in memory: [`MemExports`], for tests and demonstrations.
//! Blocks live in a map shared by every connection; an optional delay per
//! block operation stands in for a device, so concurrent requests overlap
//! as they would on one, and the counters show how many ran at once. Two
//! gates make tests of concurrency and ordering deterministic instead of
//! hoping a delay is long enough: a one-shot barrier
//! ([`MemExport::hold_until_together`]: operations on a range wait until
//! enough run at once) and a pause ([`MemExport::pause`]: operations on a
//! range wait until [`MemExport::resume`]).
//!
//! Invariants: as [`crate::Export`] states; a block reading as zeroes is
//! absent from the map (a trim or an all-zero read-modify-write removes
//! it), so [`MemExport::blocks_stored`] counts only blocks holding data.

use crate::export::{Export, ExportInfo, Exports};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Named in-memory exports.
#[derive(Default)]
pub struct MemExports {
    exports: Mutex<BTreeMap<String, Arc<MemExport>>>,
}

impl MemExports {
    pub fn new() -> MemExports {
        MemExports::default()
    }

    /// Add (or replace) export `name`: `size_bytes` of zeroes in blocks of
    /// `block_bytes`.
    pub fn add(&self, name: &str, size_bytes: u64, block_bytes: u32) -> Arc<MemExport> {
        let e = Arc::new(MemExport::new(size_bytes, block_bytes));
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), e.clone());
        e
    }
}

impl Exports for MemExports {
    type Export = MemExport;

    fn list(&self) -> Vec<ExportInfo> {
        let all = self.exports.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|(name, e)| ExportInfo {
                name: name.clone(),
                size_bytes: e.size_bytes,
                block_bytes: e.block_bytes,
                description: e.description(),
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<MemExport>> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }
}

/// One in-memory export.
pub struct MemExport {
    size_bytes: u64,
    block_bytes: u32,
    blocks: Mutex<HashMap<u64, Vec<u8>>>,
    /// Each block operation waits this long first (a device's latency).
    delay: Mutex<Option<Duration>>,
    syncs: AtomicU64,
    block_writes: AtomicU64,
    running: AtomicU64,
    running_max: AtomicU64,
    hold: Mutex<Option<Hold>>,
    /// Operations on the hold's blocks running now.
    held_running: AtomicU64,
    /// The hold was met: enough operations on its blocks ran at once.
    hold_met: AtomicBool,
    /// Blocks whose operations wait until [`MemExport::resume`].
    paused: Mutex<Option<Range<u64>>>,
    /// A read of this block panics (`u64::MAX`: none).
    panic_block: AtomicU64,
}

/// A one-shot barrier: operations on `blocks` wait until `together` of
/// them run at once, or until `limit` after the first of them started.
struct Hold {
    blocks: Range<u64>,
    together: u64,
    limit: Duration,
    /// When the first operation on `blocks` stops waiting, met or not.
    deadline: Option<Instant>,
}

/// Counts a block operation as running while it lives.
struct Running<'a> {
    export: &'a MemExport,
    held: bool,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.export.running.fetch_sub(1, Relaxed);
        if self.held {
            self.export.held_running.fetch_sub(1, Relaxed);
        }
    }
}

impl MemExport {
    /// `size_bytes` of zeroes in blocks of `block_bytes`.
    pub fn new(size_bytes: u64, block_bytes: u32) -> MemExport {
        MemExport {
            size_bytes,
            block_bytes,
            blocks: Mutex::new(HashMap::new()),
            delay: Mutex::new(None),
            syncs: AtomicU64::new(0),
            block_writes: AtomicU64::new(0),
            running: AtomicU64::new(0),
            running_max: AtomicU64::new(0),
            hold: Mutex::new(None),
            held_running: AtomicU64::new(0),
            hold_met: AtomicBool::new(false),
            paused: Mutex::new(None),
            panic_block: AtomicU64::new(u64::MAX),
        }
    }

    /// Make a read of block `n` panic (tests: a request whose task dies
    /// without its reply must not leave its client waiting).
    #[doc(hidden)]
    pub fn panic_on_reading(&self, n: u64) {
        self.panic_block.store(n, Relaxed);
    }

    fn check_panic(&self, blocks: Range<u64>) {
        let n = self.panic_block.load(Relaxed);
        assert!(!blocks.contains(&n), "injected panic: a read of block {n}");
    }

    /// Store `value` as block `n` as it is, shorter than a block or not, as
    /// another client of a store's export may (it reads as zeroes past its
    /// end).
    pub fn put_raw_block(&self, n: u64, value: &[u8]) {
        self.blocks().insert(n, value.to_vec());
    }

    /// Arm a one-shot barrier on the blocks holding bytes `bytes`:
    /// operations on them wait until `together` of them run at once (then
    /// [`MemExport::hold_met`] is true and all go on) or until `limit`
    /// after the first of them started (then they go on and it stays
    /// false). A server that never runs `together` such requests at once
    /// leaves it false, however fast or slow the machine. A sync names no
    /// block: neither the hold nor the pause applies to it.
    pub fn hold_until_together(&self, bytes: Range<u64>, together: u64, limit: Duration) {
        let blocks = self.blocks_of(bytes);
        let mut hold = self.hold.lock().unwrap_or_else(|e| e.into_inner());
        self.hold_met.store(false, Relaxed);
        *hold = Some(Hold { blocks, together, limit, deadline: None });
    }

    /// Whether the hold armed last was released by operations running
    /// together.
    pub fn hold_met(&self) -> bool {
        self.hold_met.load(Relaxed)
    }

    /// Operations on the blocks holding bytes `bytes` wait (already
    /// running ones go on) until [`MemExport::resume`].
    pub fn pause(&self, bytes: Range<u64>) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.blocks_of(bytes));
    }

    /// Let paused operations go on.
    pub fn resume(&self) {
        *self.paused.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn blocks_of(&self, bytes: Range<u64>) -> Range<u64> {
        let b = u64::from(self.block_bytes);
        bytes.start / b..bytes.end.div_ceil(b)
    }

    /// Make every block operation wait `d` first (None: only yield).
    pub fn set_delay(&self, d: Option<Duration>) {
        *self.delay.lock().unwrap_or_else(|e| e.into_inner()) = d;
    }

    /// Syncs served.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Relaxed)
    }

    /// Whole-block writes and read-modify-writes served.
    pub fn block_writes(&self) -> u64 {
        self.block_writes.load(Relaxed)
    }

    /// The most block operations that ran at once.
    pub fn running_max(&self) -> u64 {
        self.running_max.load(Relaxed)
    }

    /// Blocks holding data (not reading as zeroes).
    pub fn blocks_stored(&self) -> usize {
        self.blocks().len()
    }

    /// Bytes `offset .. offset + len` as a client would read them.
    pub fn read_range(&self, offset: u64, len: usize) -> Vec<u8> {
        let b = u64::from(self.block_bytes);
        let blocks = self.blocks();
        (offset..offset + len as u64)
            .map(|p| blocks.get(&(p / b)).and_then(|v| v.get((p % b) as usize).copied()).unwrap_or(0))
            .collect()
    }

    fn blocks(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Vec<u8>>> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait as a device would, counting the operation on blocks `blocks`
    /// as running, after waiting on the pause and on the hold if they
    /// cover its blocks.
    async fn io(&self, blocks: Range<u64>) -> Running<'_> {
        let overlaps = |r: &Range<u64>| r.start < blocks.end && blocks.start < r.end;
        while self.paused.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(overlaps) {
            granary_rt::sleep(Duration::from_millis(1)).await;
        }
        let n = self.running.fetch_add(1, Relaxed) + 1;
        granary_rt::net::raise_high_water(&self.running_max, n);
        let (held, deadline) = {
            let mut hold = self.hold.lock().unwrap_or_else(|e| e.into_inner());
            match hold.as_mut() {
                Some(h) if overlaps(&h.blocks) => {
                    // Counted under the lock: an operation that starts and
                    // ends while the others sleep still meets it.
                    if self.held_running.fetch_add(1, Relaxed) + 1 >= h.together {
                        self.hold_met.store(true, Relaxed);
                    }
                    (true, *h.deadline.get_or_insert_with(|| Instant::now() + h.limit))
                }
                _ => (false, Instant::now()),
            }
        };
        let guard = Running { export: self, held };
        while held && !self.hold_met.load(Relaxed) && Instant::now() < deadline {
            granary_rt::sleep(Duration::from_millis(1)).await;
        }
        let delay = *self.delay.lock().unwrap_or_else(|e| e.into_inner());
        match delay {
            Some(d) => granary_rt::sleep(d).await,
            None => granary_rt::yield_now().await,
        }
        guard
    }
}

impl Export for MemExport {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn block_bytes(&self) -> u32 {
        self.block_bytes
    }

    fn description(&self) -> String {
        "in-memory export".to_string()
    }

    async fn read_block(&self, n: u64) -> io::Result<Option<Vec<u8>>> {
        self.check_panic(n..n + 1);
        let _io = self.io(n..n + 1).await;
        Ok(self.blocks().get(&n).cloned())
    }

    async fn write_block(&self, n: u64, data: &[u8]) -> io::Result<()> {
        debug_assert_eq!(data.len(), self.block_bytes as usize);
        let _io = self.io(n..n + 1).await;
        self.block_writes.fetch_add(1, Relaxed);
        self.blocks().insert(n, data.to_vec());
        Ok(())
    }

    /// One device operation for the whole run, as a device reads it.
    async fn read_blocks(&self, first: u64, out: &mut [u8]) -> io::Result<()> {
        self.check_panic(first..first + (out.len() as u64).div_ceil(u64::from(self.block_bytes)));
        let _io = self.io(first..first + (out.len() as u64).div_ceil(u64::from(self.block_bytes))).await;
        let blocks = self.blocks();
        for (i, o) in out.chunks_mut(self.block_bytes as usize).enumerate() {
            if let Some(v) = blocks.get(&(first + i as u64)) {
                let n = v.len().min(o.len());
                o[..n].copy_from_slice(&v[..n]);
            }
        }
        Ok(())
    }

    /// One device operation for the whole run, as a device writes it.
    async fn write_blocks(&self, first: u64, data: &[u8]) -> io::Result<()> {
        let b = self.block_bytes as usize;
        debug_assert_eq!(data.len() % b, 0);
        let _io = self.io(first..first + (data.len() / b) as u64).await;
        self.block_writes.fetch_add((data.len() / b) as u64, Relaxed);
        let mut blocks = self.blocks();
        for (i, d) in data.chunks(b).enumerate() {
            blocks.insert(first + i as u64, d.to_vec());
        }
        Ok(())
    }

    async fn update_block(&self, n: u64, at: usize, data: &[u8]) -> io::Result<()> {
        let _io = self.io(n..n + 1).await;
        self.block_writes.fetch_add(1, Relaxed);
        let mut blocks = self.blocks();
        let mut v = blocks.remove(&n).unwrap_or_default();
        v.resize(self.block_bytes as usize, 0);
        v[at..at + data.len()].copy_from_slice(data);
        if v.iter().any(|&x| x != 0) {
            blocks.insert(n, v);
        }
        Ok(())
    }

    async fn trim_block(&self, n: u64) -> io::Result<()> {
        let _io = self.io(n..n + 1).await;
        self.blocks().remove(&n);
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        let _io = self.io(0..0).await;
        self.syncs.fetch_add(1, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use granary_rt::{Runtime, RuntimeConfig};

    fn run<F: std::future::Future<Output = io::Result<()>> + Send + 'static>(rt: &Runtime, f: F) {
        rt.block_on(f).unwrap().unwrap();
    }

    /// The hold is met only by operations on its blocks running together:
    /// one operation alone waits out the limit and leaves it unmet; an
    /// operation elsewhere does not count toward it; three together meet it.
    #[test]
    fn the_hold_is_met_only_by_operations_on_its_blocks_running_together() {
        let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
        let e = Arc::new(MemExport::new(1 << 20, 4096));

        e.hold_until_together(0..8192, 2, Duration::from_millis(20));
        let d = e.clone();
        run(&rt, async move { d.write_blocks(0, &[1u8; 8192]).await });
        assert!(!e.hold_met(), "one operation alone met the hold");

        e.hold_until_together(4096..12288, 3, Duration::from_secs(60));
        let d = e.clone();
        run(&rt, async move { d.write_block(100, &[2u8; 4096]).await });
        assert!(!e.hold_met());
        let d = e.clone();
        run(&rt, async move {
            let a = granary_rt::spawn({
                let d = d.clone();
                async move { d.write_block(1, &[3u8; 4096]).await }
            });
            let b = granary_rt::spawn({
                let d = d.clone();
                async move { d.read_blocks(0, &mut [0u8; 8192]).await }
            });
            let c = granary_rt::spawn({
                let d = d.clone();
                async move { d.trim_block(2).await }
            });
            a.await.unwrap()?;
            b.await.unwrap()?;
            c.await.unwrap()
        });
        assert!(e.hold_met(), "three operations on the hold's blocks ran together and did not meet it");
        assert_eq!(e.running_max(), 3);
        assert_eq!(e.read_range(4096, 4096), vec![3u8; 4096]);
    }

    /// A paused range's operations wait until resumed; others go on.
    #[test]
    fn paused_operations_wait_until_resumed() {
        let rt = Runtime::new(RuntimeConfig { threads: 1, pin: false, ..Default::default() }).unwrap();
        let e = Arc::new(MemExport::new(1 << 20, 4096));
        e.pause(4096..8192);
        let d = e.clone();
        let paused = rt.spawn(async move { d.write_block(1, &[7u8; 4096]).await });
        let d = e.clone();
        run(&rt, async move { d.write_block(0, &[8u8; 4096]).await });
        assert!(!paused.is_finished());
        assert_eq!(e.read_range(4096, 4096), vec![0u8; 4096], "a paused write landed");
        e.resume();
        paused.join().unwrap().unwrap();
        assert_eq!(e.read_range(0, 8192), [vec![8u8; 4096], vec![7u8; 4096]].concat());
    }
}
