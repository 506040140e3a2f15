//! Moving a store created before secret hash seeds (superblock hash
//! algorithm 1, the public seed) to a secret seed of its own
//! ([`Store::rekey`]), offline.
//!
//! Only the index's checkpoints depend on the key hash on the device (they
//! place entries by it; records, summaries and segment headers hold keys,
//! not hashes). So a re-key drops every checkpoint, then rewrites the
//! superblock with algorithm 2 and a new seed, then opens the store, which
//! rebuilds its index by a log scan under the new seed, and closes it
//! (with a checkpoint placed by it, where the store may write one: a full
//! store or a zoned device without a spare zone closes without).
//!
//! Invariant (crash safety): no open ever loads a checkpoint placed by
//! another seed than the superblock copy it reads names. Every checkpoint
//! records which hash placed it (`Manifest::hash_check`), and an open
//! that meets one of another hash scans the log (older checkpoints
//! included: none is trusted then), which covers a superblock
//! copy B that a crash left naming the old seed while copy A names the new
//! one, should copy A later be unreadable. Beyond that, the checkpoints
//! are freed and flushed before the superblock changes (a crash before
//! that leaves the old seed with some or none of its own checkpoints,
//! each still whole or refused by its segments' headers), and the
//! superblock is rewritten copy A, flush, copy B, flush (a crash between
//! leaves copy A, which readers take first, or copy B whole if A is
//! torn). Each step is safe to repeat: a re-key that failed midway is run
//! again, and one that finds copy A with a secret seed and copy B without
//! it writes copy B alone (the one write made before the device check), by
//! the rules any open for writing mends copies by (`Store::open`,
//! `OpenOptions::clear_torn`).
//! Otherwise the device is checked as an open checks it (size, blocks,
//! zones) before anything is written.
//!
//! Before the checkpoints go, two checks that change nothing the re-key
//! depends on: the store is opened as usual and closed cleanly (a crash's
//! torn records are cleared then, by the rules of any open for writing),
//! then scanned whole by an open that writes nothing. A scan that fails (a
//! read error in a part of the log a checkpoint's open never reads) would
//! fail the re-key's own scan with every checkpoint already gone, leaving
//! a store no open could read: the re-key is refused instead. A record
//! failing its checksum in the log's newest segments, after that clean
//! close, is damage, not a crash's torn write; the re-key's scan would
//! clear it as torn (bringing back the key's older value, or dropping a
//! batch its commit record vouched for), so the re-key is refused, naming
//! `granary verify`.

use crate::error::{Error, Result};
use crate::options::OpenOptions;
use crate::store::Store;
use granary_format::hash::KEY_HASH_ALGO_XXH3_64_SECRET;
use granary_format::segment::{SegmentKind, Stream};
use granary_io::Device;
use std::sync::Arc;

/// What [`Store::rekey`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rekeyed {
    /// The store had a secret seed already; nothing was written but a
    /// superblock copy to mend (copy B a crash left behind, or a damaged
    /// copy: the rules of an open for writing).
    Already,
    /// The store now hashes with a secret seed: `checkpoint_segments`
    /// segments of checkpoints were freed, and the log scan that rebuilt
    /// the index found `keys` keys.
    Done { checkpoint_segments: usize, keys: u64 },
}

impl Store {
    /// Give a store created before secret hash seeds a secret one (module
    /// docs), offline: nothing else may have the device open. `open` is
    /// used for the scan's open (its progress hook shows the scan) and its
    /// entropy draws the seed. The store is closed again on return.
    pub fn rekey(dev: Arc<dyn Device>, open: &OpenOptions) -> Result<Rekeyed> {
        dev.claim().map_err(Error::Device)?;
        let sb = Self::read_superblock(dev.as_ref())?;
        if sb.hash_algo == KEY_HASH_ALGO_XXH3_64_SECRET {
            // A re-key cut short between the superblock's copies: copy B
            // still names the public seed. Make it copy A's, by the rules
            // an open for writing mends copies by.
            Self::mend_superblocks(dev.as_ref(), &sb)?;
            return Ok(Rekeyed::Already);
        }
        Self::check_device(dev.as_ref(), &sb, open)?;
        Self::rekey_checks(&dev, open)?;
        // The checks' closes let the device go: take it back (an error if
        // another process took it meanwhile; nothing was written), and read
        // the superblock again (the checks' open may have turned a feature
        // flag on, which a rewrite of the copy read before would clear).
        dev.claim().map_err(Error::Device)?;
        let sb = Self::read_superblock(dev.as_ref())?;
        if sb.hash_algo == KEY_HASH_ALGO_XXH3_64_SECRET {
            return Err(Error::InvalidOptions("the store was re-keyed by another process meanwhile".into()));
        }
        let zoned = Self::check_device(dev.as_ref(), &sb, open)?;
        let headers = crate::log::read_segment_headers(dev.as_ref(), &sb)?;
        for &(seg, _) in &headers.index {
            let offset = sb.segment_offset(seg);
            if zoned {
                // A reset zone reads as zeros: free, as GC leaves it.
                dev.reset_zones(offset, sb.segment_bytes).map_err(|source| Error::Io {
                    op: "zone reset",
                    offset,
                    source,
                })?;
            } else {
                // A free header, as a released checkpoint's segment gets
                // (its alloc_seq at most the highest handed out).
                let buf = crate::space::header_buf(&sb, seg, SegmentKind::Free, Stream::User, headers.max_alloc, 0);
                let (_, r) = dev.write_at(buf, offset);
                r.map_err(|source| Error::Io { op: "write of a segment header", offset, source })?;
            }
        }
        dev.flush().map_err(|source| Error::Io { op: "flush", offset: 0, source })?;
        let mut new = sb.clone();
        new.version = granary_format::superblock::SUPERBLOCK_VERSION;
        new.hash_algo = KEY_HASH_ALGO_XXH3_64_SECRET;
        new.hash_seed = open.entropy.draw_u64().map_err(Error::Device)?;
        crate::space::write_superblocks(dev.as_ref(), &new)?;
        tracing::info!(
            checkpoint_segments = headers.index.len(),
            "the store's key hash now has a secret seed; rebuilding its index by a log scan"
        );
        let opened = OpenOptions { use_checkpoint: true, checkpoint_on_close: true, ..open.clone() };
        let store = Store::open(dev, &opened)?;
        let keys = store.stats().keys;
        store.close()?;
        Ok(Rekeyed::Done { checkpoint_segments: headers.index.len(), keys })
    }

    /// The checks a re-key makes before it writes (module docs): the store
    /// opens and closes cleanly, then a log scan that writes nothing reads
    /// it whole and finds no record failing its checksum in the tail.
    fn rekey_checks(dev: &Arc<dyn Device>, open: &OpenOptions) -> Result<()> {
        let usual = OpenOptions { use_checkpoint: true, checkpoint_on_close: true, ..open.clone() };
        Store::open(dev.clone(), &usual)?.close()?;
        // Writes nothing: no GC, no checkpoints (periodic or at its close).
        let scan = OpenOptions {
            use_checkpoint: false,
            clear_torn: false,
            checkpoint_on_close: false,
            gc: false,
            checkpoint_interval: None,
            ..open.clone()
        };
        let scanned = Store::open(dev.clone(), &scan).map_err(|e| {
            tracing::error!(error = %e, "the re-key's log scan would fail: nothing was changed");
            e
        })?;
        let torn = scanned.stats().recovery.torn_records;
        scanned.close()?;
        if torn > 0 {
            return Err(Error::Corruption {
                offset: 0,
                detail: format!(
                    "{torn} records in the log's newest segments fail their checksums though the store was just \
                     closed cleanly: damage, which a re-key would clear as torn writes; nothing was changed \
                     (`granary verify` lists them)"
                ),
            });
        }
        Ok(())
    }

    /// [`Store::rekey`] of the store at `path` (a file, a block device, or
    /// a stripe set's members separated by commas, as for
    /// [`Store::open_path`]).
    pub fn rekey_path(path: &std::path::Path, mode: granary_io::OpenMode, open: &OpenOptions) -> Result<Rekeyed> {
        let dev = granary_io::DeviceSpec::parse(path)
            .and_then(|s| s.open(mode, granary_io::IoBackend::Sync))
            .map_err(Error::Device)?;
        Self::rekey(dev, open)
    }
}
