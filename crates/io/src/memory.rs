//! [`MemDevice`]: a device in DRAM, for tests and for measuring the engine's
//! software overhead without a disk.
//!
//! Reads run concurrently; writes take an exclusive lock. Tests reach the raw
//! bytes with [`MemDevice::with_bytes_mut`] to corrupt or inspect them, and
//! [`MemDevice::fail_writes`] makes every later write fail with EIO.

use crate::{check_range, AlignedBuf, Device, IoCounters, IoResult};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::RwLock;

pub struct MemDevice {
    bytes: RwLock<Vec<u8>>,
    block: u32,
    fail_writes: AtomicBool,
    counters: IoCounters,
}

impl MemDevice {
    /// A zeroed device of `size_bytes` with 512-byte blocks.
    pub fn new(size_bytes: u64) -> MemDevice {
        MemDevice::with_block(size_bytes, 512)
    }

    pub fn with_block(size_bytes: u64, block: u32) -> MemDevice {
        assert!(size_bytes.is_multiple_of(block as u64));
        MemDevice {
            bytes: RwLock::new(vec![0; size_bytes as usize]),
            block,
            fail_writes: AtomicBool::new(false),
            counters: IoCounters::default(),
        }
    }

    /// Run `f` on the raw bytes (tests: corrupt, inspect).
    pub fn with_bytes_mut<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.bytes.write().unwrap_or_else(|e| e.into_inner()))
    }

    /// Make every later write fail with EIO (or succeed again).
    pub fn fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Relaxed);
    }
}

impl Device for MemDevice {
    fn read_at(&self, mut buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        {
            let bytes = self.bytes.read().unwrap_or_else(|e| e.into_inner());
            let o = offset as usize;
            let n = buf.len();
            buf.copy_from_slice(&bytes[o..o + n]);
        }
        self.counters.read(buf.len());
        (buf, Ok(()))
    }

    fn write_at(&self, buf: AlignedBuf, offset: u64) -> IoResult {
        if let Err(e) = check_range(self, buf.len(), offset) {
            return (buf, Err(e));
        }
        if self.fail_writes.load(Relaxed) {
            return (buf, Err(io::Error::from_raw_os_error(libc::EIO)));
        }
        {
            let mut bytes = self.bytes.write().unwrap_or_else(|e| e.into_inner());
            let o = offset as usize;
            bytes[o..o + buf.len()].copy_from_slice(&buf);
        }
        self.counters.write(buf.len());
        (buf, Ok(()))
    }

    fn flush(&self) -> io::Result<()> {
        self.counters.flushes.fetch_add(1, Relaxed);
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.bytes.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }

    fn block_bytes(&self) -> u32 {
        self.block
    }

    fn counters(&self) -> &IoCounters {
        &self.counters
    }

    fn describe(&self) -> String {
        format!("memory device ({} bytes)", self.size_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_injected_eio() {
        let dev = MemDevice::new(1 << 16);
        let mut w = AlignedBuf::zeroed(512);
        w[0] = 42;
        dev.write_at(w, 1024).1.unwrap();
        let (r, res) = dev.read_at(AlignedBuf::zeroed(512), 1024);
        res.unwrap();
        assert_eq!(r[0], 42);
        dev.fail_writes(true);
        let (_, res) = dev.write_at(AlignedBuf::zeroed(512), 0);
        assert_eq!(res.unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(dev.counters().snapshot().writes, 1);
    }
}
