//! The directory: an array of `2^d` tables (`d <= 8`), chosen by the low `d`
//! bits of a key's tag. Within a table the home slot is the low bits of the
//! hash (`hash & (homes - 1)`); every table has the same number of homes,
//! fixed when the store is created and persisted in its superblock, so the
//! geometry never depends on the machine the store runs on.
//!
//! Growth doubles the directory: table `t` splits into tables `t` and
//! `t + 2^d` by tag bit `d`, and every entry keeps its slot, because its
//! home slot does not depend on `d`. No key is read. In this version growth
//! takes the directory's write lock for the split (a pause proportional to
//! the index size); the incremental, lock-region-at-a-time resize of uDepot
//! §4.3 is tracked separately.

use crate::entry::Entry;
use crate::table::Table;
use crate::{NEIGHBOURHOOD, REGION_SLOTS_LOG2_DEFAULT, TABLES_LOG2_MAX};
use granary_format::hash;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::RwLock;

/// Geometry of an index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// log2 of the home slots per table (from the superblock).
    pub table_log2: u32,
    /// log2 of the slots per lock region.
    pub region_log2: u32,
    /// log2 of the number of tables to start with.
    pub initial_tables_log2: u32,
}

impl IndexConfig {
    pub fn new(table_log2: u32) -> IndexConfig {
        IndexConfig {
            table_log2,
            region_log2: REGION_SLOTS_LOG2_DEFAULT.min(table_log2.max(5)),
            initial_tables_log2: 0,
        }
    }

    /// Most keys the index can ever address (all tables, every slot).
    pub fn max_slots(&self) -> u64 {
        (1u64 << self.table_log2) << TABLES_LOG2_MAX
    }
}

/// Why an insert failed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexError {
    /// The directory is at its largest and the key's neighbourhood is full.
    Full { tables: usize, entries: u64 },
}

impl fmt::Display for IndexError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IndexError::Full { tables, entries } => write!(
                f,
                "index full: {tables} tables hold {entries} entries and a key's neighbourhood has no free slot; \
                 recreate the store with a larger index (more slots per table)"
            ),
        }
    }
}

impl std::error::Error for IndexError {}

/// Tag-matching entries of one key hash: the candidates a reader checks.
#[derive(Clone, Copy)]
pub struct Candidates {
    n: usize,
    e: [Entry; NEIGHBOURHOOD],
}

impl Candidates {
    pub fn as_slice(&self) -> &[Entry] {
        &self.e[..self.n]
    }
}

/// Point-in-time index figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub entries: u64,
    pub tables: u64,
    pub slots: u64,
    pub memory_bytes: u64,
    pub grows: u64,
}

struct Directory {
    tables: Vec<Table>,
    log2: u32,
}

/// The concurrent index.
pub struct Index {
    cfg: IndexConfig,
    dir: RwLock<Directory>,
    entries: AtomicU64,
    grows: AtomicU64,
}

/// Where a hash lives under a directory of `2^log2` tables.
fn place(cfg: &IndexConfig, log2: u32, h: u64) -> (usize, usize, u8) {
    let tag = hash::tag(h);
    let table = (tag as usize) & ((1 << log2) - 1);
    let home = (h & ((1u64 << cfg.table_log2) - 1)) as usize;
    (table, home, tag)
}

impl Index {
    pub fn new(cfg: IndexConfig) -> Index {
        assert!(cfg.table_log2 <= hash::SLOT_BITS);
        assert!(cfg.initial_tables_log2 <= TABLES_LOG2_MAX);
        assert!((1usize << cfg.region_log2) >= NEIGHBOURHOOD);
        let n = 1usize << cfg.initial_tables_log2;
        let tables = (0..n)
            .map(|_| Table::new(1 << cfg.table_log2, cfg.region_log2))
            .collect();
        Index {
            cfg,
            dir: RwLock::new(Directory {
                tables,
                log2: cfg.initial_tables_log2,
            }),
            entries: AtomicU64::new(0),
            grows: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> IndexConfig {
        self.cfg
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Directory> {
        self.dir.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Entries whose home and tag match `h`: the key's candidates.
    pub fn lookup(&self, h: u64) -> Candidates {
        let dir = self.read();
        let (t, home, tag) = place(&self.cfg, dir.log2, h);
        let table = &dir.tables[t];
        let held = table.lock_neighbourhood(home);
        let mut c = Candidates {
            n: 0,
            e: [Entry::FREE; NEIGHBOURHOOD],
        };
        table.matches(&held, home, tag, |_, e| {
            c.e[c.n] = e;
            c.n += 1;
        });
        c
    }

    /// Add an entry for a key not yet in the index. Grows when the key's
    /// neighbourhood is full.
    pub fn insert(&self, h: u64, kv_size: u64, pba: u64) -> Result<(), IndexError> {
        loop {
            let log2 = {
                let dir = self.read();
                let (t, home, tag) = place(&self.cfg, dir.log2, h);
                let table = &dir.tables[t];
                let held = table.lock_for_insert(home);
                if table.insert(&held, home, Entry::new(0, tag, kv_size, pba)) {
                    self.entries.fetch_add(1, Relaxed);
                    return Ok(());
                }
                dir.log2
            };
            self.grow(log2)?;
        }
    }

    /// Point the entry of `h` that points at `old_pba` to a new record.
    /// Returns false if no such entry exists (it was changed concurrently).
    pub fn replace(&self, h: u64, old_pba: u64, kv_size: u64, pba: u64) -> bool {
        let dir = self.read();
        let (t, home, tag) = place(&self.cfg, dir.log2, h);
        let table = &dir.tables[t];
        let held = table.lock_neighbourhood(home);
        table.replace(&held, home, tag, old_pba, Entry::new(0, tag, kv_size, pba))
    }

    /// Remove the entry of `h` that points at `pba`.
    pub fn remove(&self, h: u64, pba: u64) -> bool {
        let dir = self.read();
        let (t, home, tag) = place(&self.cfg, dir.log2, h);
        let table = &dir.tables[t];
        let held = table.lock_neighbourhood(home);
        let done = table.remove(&held, home, tag, pba);
        if done {
            self.entries.fetch_sub(1, Relaxed);
        }
        done
    }

    /// Double the directory if it still has `2^seen_log2` tables.
    fn grow(&self, seen_log2: u32) -> Result<(), IndexError> {
        let mut dir = self.dir.write().unwrap_or_else(|e| e.into_inner());
        if dir.log2 != seen_log2 {
            return Ok(()); // another thread grew it first
        }
        if dir.log2 >= TABLES_LOG2_MAX {
            return Err(IndexError::Full {
                tables: dir.tables.len(),
                entries: self.entries.load(Relaxed),
            });
        }
        let n = dir.tables.len();
        let homes = 1usize << self.cfg.table_log2;
        let mut next: Vec<Table> = (0..2 * n)
            .map(|_| Table::new(homes, self.cfg.region_log2))
            .collect();
        let (lo, hi) = next.split_at_mut(n);
        for (t, old) in dir.tables.iter().enumerate() {
            old.split_into(dir.log2, &lo[t], &hi[t]);
        }
        dir.tables = next;
        dir.log2 += 1;
        self.grows.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Visit every entry with the fingerprint rebuilt from its position:
    /// `f(fingerprint, entry)`, where the fingerprint is the hash's 27 slot
    /// bits (as far as the table uses them) and its tag.
    pub fn for_each(&self, mut f: impl FnMut(u64, Entry)) {
        let dir = self.read();
        for (t, table) in dir.tables.iter().enumerate() {
            // Lock each region in turn so concurrent writers stay correct;
            // each entry is visited once, at the region holding its slot.
            let region = 1usize << self.cfg.region_log2;
            let mut start = 0;
            while start < table.len() {
                let held = table.lock_for_insert(start);
                let end = (start + region).min(table.len());
                for slot in start..end {
                    let e = table.get(slot);
                    if e.is_free() {
                        continue;
                    }
                    let ehome = slot - e.neigh_off() as usize;
                    debug_assert_eq!(e.tag() as usize & ((1 << dir.log2) - 1), t);
                    f(hash::fingerprint(ehome as u64, e.tag()), e);
                }
                drop(held);
                start = end;
            }
        }
    }

    pub fn stats(&self) -> IndexStats {
        let dir = self.read();
        IndexStats {
            entries: self.entries.load(Relaxed),
            tables: dir.tables.len() as u64,
            slots: dir.tables.iter().map(|t| t.len() as u64).sum(),
            memory_bytes: dir.tables.iter().map(|t| t.memory_bytes() as u64).sum(),
            grows: self.grows.load(Relaxed),
        }
    }
}
