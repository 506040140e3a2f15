//! Per-item access state for memcache's meta flags `h` (hit before), `l`
//! (seconds since the last access) and the win token (`W`/`Z`): kept in the
//! index's access words ([`granary_index::IndexConfig::access_words`]),
//! 4 bytes beside every index slot, only when the store is opened with
//! [`crate::OpenOptions::track_access`].
//!
//! A word is `win:1 | fetched:1 | time:30`: `time` is the last access in
//! seconds since the store was opened (saturating after 34 years), so an
//! all-zero word, which is what an entry restored by recovery has, reads
//! "not fetched, last accessed when the store opened, no token sent". The
//! state lives in DRAM only: a restart forgets it (documented in
//! docs/MEMCACHE.md).

/// Bits of the time field.
const TIME_MASK: u32 = (1 << 30) - 1;
const FETCHED: u32 = 1 << 30;
const WIN: u32 = 1 << 31;

/// What the store knows of an item's use (with
/// [`crate::OpenOptions::track_access`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// Read since this version was written (memcache `h`).
    pub fetched: bool,
    /// Unix seconds of the last read or write (memcache `l`).
    pub last_access: u32,
    /// A client was handed the win token for this item (memcache `W`; later
    /// readers see `Z`).
    pub win_sent: bool,
}

/// An item as read with its access state ([`crate::Store::get_item_access`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemAccess {
    pub item: crate::Item,
    /// The state before this read.
    pub prior: Access,
    /// This read was handed the win token.
    pub won: bool,
}

/// Converts between access words and unix seconds, relative to the open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock0 {
    /// Unix seconds when the store was opened.
    pub base: u32,
}

impl Clock0 {
    fn rel(self, now: u32) -> u32 {
        now.saturating_sub(self.base).min(TIME_MASK)
    }

    pub fn decode(self, w: u32) -> Access {
        Access { fetched: w & FETCHED != 0, last_access: self.base + (w & TIME_MASK), win_sent: w & WIN != 0 }
    }

    /// The word after a read at `now`.
    pub fn bumped(self, w: u32, now: u32) -> u32 {
        (w & WIN) | FETCHED | self.rel(now)
    }

    /// `w` with the win token marked sent.
    pub fn won(w: u32) -> u32 {
        w | WIN
    }

    pub fn is_won(w: u32) -> bool {
        w & WIN != 0
    }

    /// Whether the version of word `w` was read since it was written.
    pub fn is_fetched(w: u32) -> bool {
        w & FETCHED != 0
    }

    /// The word of a new version written at `now` replacing one whose
    /// word was `old` (0 for a new key).
    pub fn apply(self, p: Policy, old: u32, now: u32) -> u32 {
        match p {
            Policy::Fresh => self.rel(now),
            Policy::Vivified { read } => self.rel(now) | WIN | if read { FETCHED } else { 0 },
            Policy::FreshKeepWin => self.rel(now) | (old & WIN),
            Policy::Touch { fetch: true } => self.bumped(old, now),
            Policy::Touch { fetch: false } => old,
            Policy::Invalidate => old & !WIN,
        }
    }
}

/// How a write sets the access word of the version it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    /// A new item: not fetched, accessed now.
    Fresh,
    /// A new item created by a read that missed (memcache's vivify): its win
    /// token handed to that reader, and read by it when `read` (as
    /// memcached, whose `mg ... N` without `u` marks the item it creates
    /// fetched).
    Vivified { read: bool },
    /// A new item keeping the token state of the one it replaces (a stale
    /// value stored with `ms ... I`).
    FreshKeepWin,
    /// The same item with new metadata: everything kept; a read too when
    /// `fetch` (memcache `touch`, `gat`).
    Touch { fetch: bool },
    /// The same item marked stale (`md ... I`): kept, but a new token may
    /// be won.
    Invalidate,
}

impl Policy {
    /// A new value with this metadata: a stale one (memcache `ms ... I`)
    /// keeps the win token state of the version it replaces.
    pub fn new_item(meta: &crate::ItemMeta) -> Policy {
        if meta.stale {
            Policy::FreshKeepWin
        } else {
            Policy::Fresh
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_policies_keep_what_they_say() {
        let c = Clock0 { base: 1_000 };
        assert_eq!(c.decode(0), Access { fetched: false, last_access: 1_000, win_sent: false });
        let w = c.apply(Policy::Fresh, u32::MAX, 1_010);
        assert_eq!(c.decode(w), Access { fetched: false, last_access: 1_010, win_sent: false });
        let r = c.bumped(w, 1_020);
        assert_eq!(c.decode(r), Access { fetched: true, last_access: 1_020, win_sent: false });
        let won = Clock0::won(r);
        assert!(Clock0::is_won(won) && !Clock0::is_won(r));
        assert!(c.decode(c.bumped(won, 1_030)).win_sent);
        assert_eq!(c.apply(Policy::Touch { fetch: false }, won, 2_000), won);
        assert_eq!(c.decode(c.apply(Policy::Touch { fetch: true }, won, 2_000)).last_access, 2_000);
        assert_eq!(c.decode(c.apply(Policy::Invalidate, won, 2_000)), c.decode(r));
        assert!(c.decode(c.apply(Policy::FreshKeepWin, won, 2_000)).win_sent);
        assert!(!c.decode(c.apply(Policy::FreshKeepWin, won, 2_000)).fetched);
        assert!(c.decode(c.apply(Policy::Vivified { read: false }, 0, 2_000)).win_sent);
        assert!(!c.decode(c.apply(Policy::Vivified { read: false }, 0, 2_000)).fetched);
        assert!(c.decode(c.apply(Policy::Vivified { read: true }, 0, 2_000)).fetched);
        // Before the open (a clock step back) and far after it saturate.
        assert_eq!(c.decode(c.apply(Policy::Fresh, 0, 5)).last_access, 1_000);
        assert_eq!(c.decode(c.bumped(0, u32::MAX)).last_access, 1_000 + TIME_MASK);
    }
}
