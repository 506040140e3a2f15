//! The engine's shared parts, borrowed together: the log ([`Log`]), the
//! space of segments ([`Space`]), the key-side state ([`Keys`]) and the
//! counters ([`Counters`]). GC, checkpoints, recovery and link settling
//! work on these handles only, never on the whole engine (`store::Core`),
//! so none of them depends on the write path, the read path or the store.

use crate::counters::Counters;
use crate::error::Result;
use crate::keys::Keys;
use crate::log::Log;
use crate::space::Space;
use granary_format::record::RecordHeader;
use granary_index::Entry;
use granary_io::AlignedBuf;

/// Borrowed handles on the engine's shared parts.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub log: &'a Log,
    pub space: &'a Space,
    pub keys: &'a Keys,
    pub counters: &'a Counters,
    /// [`crate::Background::Manual`]: internal work uses one thread, so a
    /// seeded run replays exactly.
    pub manual: bool,
}

impl Parts<'_> {
    /// [`Log::read_record`] in this store's space.
    pub(crate) fn read_record(&self, e: Entry, full: bool) -> Result<(RecordHeader, AlignedBuf)> {
        self.log.read_record(self.space, e, full)
    }

    /// Threads for work that reads independent records (`want`, or one
    /// in manual mode).
    pub(crate) fn threads(&self, want: usize) -> usize {
        if self.manual {
            1
        } else {
            want
        }
    }
}
