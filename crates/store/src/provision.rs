//! Putting a store on a path: open what is there, or create it. `granary
//! serve`, `granary create` and embedded users share these rules, so they
//! are said once:
//!
//! - an interrupted creation (files that still start with
//!   [`granary_io::file::UNFINISHED_MAGIC`]) holds nothing: it is removed
//!   and made again (only where an existing store would be opened);
//! - a path that holds something else is never written over: with
//!   [`IfPresent::Refuse`] the error says what is there and what to do;
//! - the parent folders of new files are created;
//! - a creation that fails (a stop signal during the zero fill, a store
//!   that cannot be written) removes the files it made, and so does
//!   [`Provisioned::discard`] when a later start-up step fails, so a failed
//!   start never leaves a new file behind.

use crate::{CreateOptions, Error, OpenOptions, Result, Store};
use granary_io::{Device, DeviceSpec, IoBackend, OpenMode};
use std::io;
use std::path::Path;
use std::sync::Arc;

/// What to do when the path already holds something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IfPresent {
    /// Open the store that is there (`granary serve`, `create --if-absent`).
    Open,
    /// Refuse, saying what is there (`granary create`). Block devices are
    /// created over: that is how a store is put on one.
    Refuse,
}

/// How to make a store where there is none.
pub struct NewStore<'a> {
    /// Size of new files in all (ignored for block devices, used whole);
    /// 0 is accepted only where every path is a block device.
    pub size_bytes: u64,
    /// Stripe unit of a stripe set.
    pub stripe_bytes: u32,
    /// Geometry of the new store.
    pub create: CreateOptions,
    /// Progress of the new files' zero fill; an error from it cancels the
    /// creation (see [`DeviceSpec::create_with_progress`]).
    pub fill_progress: &'a dyn Fn(u64, u64) -> io::Result<()>,
}

/// An open store and how it came to be.
pub struct Provisioned {
    pub store: Store,
    /// The store was created by this call (its files are new).
    pub created: bool,
    /// An interrupted earlier creation was removed before this one.
    pub removed_unfinished: bool,
    spec: DeviceSpec,
}

impl Provisioned {
    /// What giving up this start must undo, for a caller that moves the
    /// store on (into an `Arc` shared with servers) before the start is
    /// complete: see [`Undo::discard`].
    pub fn undo(&self) -> Undo {
        Undo { new_files: self.created.then(|| self.spec.clone()) }
    }

    /// Give up a start that failed after the store was opened: a store this
    /// call created is closed and its files removed; an existing one is
    /// just closed (dropped, as a crash would leave it).
    pub fn discard(self) {
        let undo = self.undo();
        drop(self.store);
        undo.discard();
    }
}

/// What a failed start must undo: the files of a store it created.
#[must_use = "a failed start calls discard"]
pub struct Undo {
    new_files: Option<DeviceSpec>,
}

impl Undo {
    /// Remove the files of a store the start created (call once the store
    /// is dropped); nothing for a store that was there before.
    pub fn discard(self) {
        if let Some(spec) = self.new_files {
            spec.remove_files();
        }
    }
}

/// A path about to hold a store: what is there, decided before anything is
/// opened or created (so a caller can, e.g., make an open interruptible
/// and a creation not).
pub struct Site {
    spec: DeviceSpec,
    holds_store: bool,
    removed_unfinished: bool,
    /// What the opened device is wrapped in before the store uses it.
    wrap: Option<DeviceWrapper>,
}

/// A wrapper for the device a [`Site`] opens (fault injection in tests).
pub type DeviceWrapper = Box<dyn FnOnce(Arc<dyn Device>) -> Arc<dyn Device>>;

impl Site {
    /// Look at `path`. With [`IfPresent::Open`], an interrupted creation is
    /// removed first; with [`IfPresent::Refuse`], anything there but a
    /// block device is an error that says what it is.
    pub fn inspect(path: &Path, if_present: IfPresent) -> Result<Site> {
        let spec = DeviceSpec::parse(path).map_err(Error::Device)?;
        let (holds_store, removed_unfinished) = match if_present {
            IfPresent::Open => {
                let removed = spec.remove_unfinished().map_err(Error::Device)?;
                // Block devices whose heads are all zeros hold nothing yet:
                // the store is made on them.
                let blank = spec.paths().iter().all(|p| is_block_device(p) && blank_head(p).unwrap_or(false));
                (spec.exists().map_err(Error::Device)? && !blank, removed)
            }
            IfPresent::Refuse => {
                // A stripe set with members missing is an error of its own.
                spec.exists().map_err(Error::Device)?;
                refuse_existing(&spec)?;
                (false, false)
            }
        };
        Ok(Site { spec, holds_store, removed_unfinished, wrap: None })
    }

    /// Whether a store (or at least something to open as one) is there.
    pub fn holds_store(&self) -> bool {
        self.holds_store
    }

    /// Whether [`Site::inspect`] removed an interrupted creation.
    pub fn removed_unfinished(&self) -> bool {
        self.removed_unfinished
    }

    /// Hand the device to `wrap` once it is opened or created, and the
    /// store what it returns (`granary serve`'s fault injection for tests).
    pub fn wrap_device(mut self, wrap: DeviceWrapper) -> Site {
        self.wrap = Some(wrap);
        self
    }

    fn wrapped(wrap: Option<DeviceWrapper>, dev: Arc<dyn Device>) -> Arc<dyn Device> {
        match wrap {
            Some(w) => w(dev),
            None => dev,
        }
    }

    /// Open the store that is there.
    pub fn open(self, mode: OpenMode, backend: IoBackend, opts: &OpenOptions) -> Result<Provisioned> {
        let wrap = self.wrap;
        let store = self
            .spec
            .open(mode, backend)
            .map_err(Error::Device)
            .and_then(|d| Store::open(Site::wrapped(wrap, d), opts))?;
        Ok(Provisioned { store, created: false, removed_unfinished: self.removed_unfinished, spec: self.spec })
    }

    /// Create a store there (files, their folders, the zero fill, the
    /// superblocks); on failure, the files made are removed.
    pub fn create(self, mode: OpenMode, backend: IoBackend, new: &NewStore, opts: &OpenOptions) -> Result<Provisioned> {
        let spec = self.spec;
        let all_block = spec.paths().iter().all(|p| is_block_device(p));
        if new.size_bytes == 0 && !all_block {
            return Err(Error::InvalidOptions("a size is needed to create a store in a file (`--size`)".into()));
        }
        if !all_block {
            // Settings the store would refuse are refused before the files
            // are made and zero-filled (which takes a while on a large one).
            Store::check_geometry(new.size_bytes, &new.create, opts)?;
        }
        for p in spec.paths() {
            if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::Device(io::Error::new(e.kind(), format!("cannot create {}: {e}", dir.display())))
                })?;
            }
        }
        let dev = spec
            .create_with_progress(new.size_bytes, new.stripe_bytes, mode, backend, new.fill_progress)
            .map_err(Error::Device)?;
        let dev = Site::wrapped(self.wrap, dev);
        let store = Store::create(dev, &new.create, opts).inspect_err(|_| spec.remove_files())?;
        Ok(Provisioned { store, created: true, removed_unfinished: self.removed_unfinished, spec })
    }
}

/// Open the store at `path`, or create it there with `new` (None: a
/// missing store is an error). `existing` opens a store that was there;
/// `opts` a new one.
pub fn provision(
    path: &Path,
    mode: OpenMode,
    backend: IoBackend,
    if_present: IfPresent,
    new: Option<&NewStore>,
    existing: &OpenOptions,
    opts: &OpenOptions,
) -> Result<Provisioned> {
    let site = Site::inspect(path, if_present)?;
    if site.holds_store() {
        return site.open(mode, backend, existing);
    }
    match new {
        Some(new) => site.create(mode, backend, new, opts),
        None => Err(Error::Device(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: no store here (`granary create` makes one)", path.display()),
        ))),
    }
}

fn is_block_device(p: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device())
}

/// Bytes at the start of a block device that must all be zero for
/// `granary create` to write over it: a store's superblock, a stripe
/// label, and the signatures of partition tables and filesystems (ext4's
/// superblock at 1 KiB, XFS's at 0, a GPT header at 512 bytes, btrfs's and
/// reiserfs's at 64 KiB...) lie in them, as in what `wipefs` probes.
pub const DEVICE_HEAD_BYTES: usize = granary_io::spec::BLANK_HEAD_BYTES as usize;

/// The first [`DEVICE_HEAD_BYTES`] of `p` (fewer if it is smaller).
fn device_head(p: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let mut head = Vec::with_capacity(DEVICE_HEAD_BYTES);
    std::fs::File::open(p)?.take(DEVICE_HEAD_BYTES as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// Whether `p`'s head is all zeros.
fn blank_head(p: &Path) -> io::Result<bool> {
    Ok(device_head(p)?.iter().all(|&b| b == 0))
}

/// Creating over a file that exists: say what is there and what to do,
/// instead of the system's bare "File exists". Block devices (and links
/// to them) pass; anything else that is not a regular file is refused
/// unread (a FIFO would block the read).
fn refuse_existing(spec: &DeviceSpec) -> Result<()> {
    use std::io::Read;
    for p in spec.paths() {
        // Follows links, as the device code does.
        let Ok(meta) = std::fs::metadata(p) else { continue };
        let refuse = |what: String| Err(Error::Device(io::Error::new(io::ErrorKind::AlreadyExists, what)));
        if is_block_device(p) {
            // Written over only when its head is all zeros: a store, a
            // filesystem or a partition table there is never destroyed by
            // a mistyped path.
            let head = device_head(p).map_err(|e| {
                Error::Device(io::Error::new(e.kind(), format!("{}: cannot read the device: {e}", p.display())))
            })?;
            if head.iter().all(|&b| b == 0) {
                continue;
            }
            let store = head.len() >= 8
                && (head[..8] == granary_format::superblock::SUPERBLOCK_MAGIC.to_le_bytes()
                    || head[..8] == granary_io::stripe::LABEL_MAGIC);
            let what = if store {
                "already holds a Granary store: left as it is (`--if-absent` accepts an existing store)"
            } else {
                "holds data (a filesystem, a partition table or another store?): not overwritten"
            };
            return refuse(format!(
                "{}: {what}; to use the device anyway, zero its first {} KiB first (`dd if=/dev/zero of={} \
                 bs=1M count=1`)",
                p.display(),
                DEVICE_HEAD_BYTES / 1024,
                p.display()
            ));
        }
        if !meta.is_file() {
            return refuse(format!("{}: exists and is not a regular file or a block device", p.display()));
        }
        let mut head = Vec::with_capacity(8);
        let read = std::fs::File::open(p).and_then(|f| f.take(8).read_to_end(&mut head));
        let what = match read {
            Ok(8) if head[..] == granary_io::file::UNFINISHED_MAGIC => {
                "holds an earlier creation that was interrupted before the store was written (it holds \
                 nothing), or one still running: `granary create --if-absent` (or `granary serve`) removes \
                 and makes it again unless another process holds it"
            }
            Ok(8)
                if head[..] == granary_format::superblock::SUPERBLOCK_MAGIC.to_le_bytes()
                    || head[..] == granary_io::stripe::LABEL_MAGIC =>
            {
                "already holds a Granary store: left as it is (`--if-absent` accepts an existing store; \
                 remove the file to start over)"
            }
            Ok(_) => "exists and is not a Granary store: not overwritten",
            Err(e) => return refuse(format!("{}: exists and cannot be read: {e}", p.display())),
        };
        return refuse(format!("{}: {what}", p.display()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn new_store(size_bytes: u64) -> NewStore<'static> {
        NewStore {
            size_bytes,
            stripe_bytes: granary_io::stripe::STRIPE_BYTES_DEFAULT,
            create: CreateOptions { segment_bytes: Some(1 << 20), ..CreateOptions::default() },
            fill_progress: &|_, _| Ok(()),
        }
    }

    fn provision_at(path: &Path, if_present: IfPresent, new: Option<&NewStore>) -> Result<Provisioned> {
        let o = OpenOptions::default();
        provision(path, OpenMode::Buffered, IoBackend::Sync, if_present, new, &o, &o)
    }

    #[test]
    fn creates_then_opens_and_discard_removes_only_what_it_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/s.db");
        let p = provision_at(&path, IfPresent::Open, Some(&new_store(16 << 20))).unwrap();
        assert!(p.created && !p.removed_unfinished);
        p.store.put(b"k", b"v").unwrap();
        p.store.close().unwrap();
        let p = provision_at(&path, IfPresent::Open, Some(&new_store(16 << 20))).unwrap();
        assert!(!p.created);
        assert_eq!(p.store.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
        p.discard();
        assert!(path.exists(), "discarding an existing store keeps its file");
        let fresh = dir.path().join("fresh.db");
        provision_at(&fresh, IfPresent::Open, Some(&new_store(16 << 20))).unwrap().discard();
        assert!(!fresh.exists(), "discarding a store this call created removes its file");
    }

    #[test]
    fn refuses_to_create_over_a_store_or_a_foreign_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        provision_at(&path, IfPresent::Refuse, Some(&new_store(16 << 20))).unwrap().store.close().unwrap();
        let e = provision_at(&path, IfPresent::Refuse, Some(&new_store(16 << 20))).err().unwrap();
        assert!(e.to_string().contains("already holds a Granary store"), "{e}");
        let foreign = dir.path().join("notes.txt");
        std::fs::write(&foreign, b"hello, world").unwrap();
        let e = provision_at(&foreign, IfPresent::Refuse, Some(&new_store(16 << 20))).err().unwrap();
        assert!(e.to_string().contains("is not a Granary store"), "{e}");
        assert_eq!(std::fs::read(&foreign).unwrap(), b"hello, world");
    }

    #[test]
    fn a_missing_store_without_a_recipe_or_size_is_an_error_that_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let e = provision_at(&path, IfPresent::Open, None).err().unwrap();
        assert!(e.to_string().contains("no store here"), "{e}");
        let e = provision_at(&path, IfPresent::Open, Some(&new_store(0))).err().unwrap();
        assert!(e.to_string().contains("a size is needed"), "{e}");
        assert!(!path.exists());
    }

    /// Settings the store refuses are refused before any file is made or
    /// zero-filled.
    #[test]
    fn bad_settings_are_refused_before_the_zero_fill() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("s.db");
        let filled = std::sync::atomic::AtomicU64::new(0);
        let count = |done: u64, _: u64| {
            filled.store(done, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        };
        let o = OpenOptions::default();
        for (create, what) in [
            (CreateOptions { segment_bytes: Some(3 << 20), ..CreateOptions::default() }, "segment_bytes"),
            (CreateOptions { segment_bytes: Some(16 << 20), ..CreateOptions::default() }, "fewer than two segments"),
            (CreateOptions { grain_bytes: Some(1000), ..CreateOptions::default() }, "grain size"),
        ] {
            let new = NewStore { create, fill_progress: &count, ..new_store(16 << 20) };
            let r = provision(&path, OpenMode::Direct, IoBackend::Sync, IfPresent::Open, Some(&new), &o, &o);
            let e = r.err().expect("refused").to_string();
            assert!(e.contains(what), "{e}");
            assert_eq!(filled.load(std::sync::atomic::Ordering::Relaxed), 0, "{what}: zero-filled first");
            assert!(!path.exists());
        }
        // A stripe set's unit and member count, too.
        let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
        let set = dir.path().join("a.db,b.db");
        for (stripe_bytes, what) in [(100 << 10, "power of two"), (2048, "at least 4096")] {
            let new = NewStore { stripe_bytes, fill_progress: &count, ..new_store(16 << 20) };
            let r = provision(&set, OpenMode::Direct, IoBackend::Sync, IfPresent::Open, Some(&new), &o, &o);
            let e = r.err().expect("refused").to_string();
            assert!(e.contains(what), "{e}");
            assert_eq!(filled.load(std::sync::atomic::Ordering::Relaxed), 0, "{what}: zero-filled first");
            assert!(!a.exists() && !b.exists());
        }
    }

    #[test]
    fn a_cancelled_zero_fill_leaves_no_file() {
        // Direct IO (the zero fill runs only then) needs a real filesystem.
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let path = dir.path().join("s.db");
        let stop = |_: u64, _: u64| Err(io::Error::new(io::ErrorKind::Interrupted, "stopped"));
        let new = NewStore { fill_progress: &stop, ..new_store(16 << 20) };
        let o = OpenOptions::default();
        let r = provision(&path, OpenMode::Direct, IoBackend::Sync, IfPresent::Open, Some(&new), &o, &o);
        assert!(r.err().expect("the fill was cancelled").to_string().contains("stopped"));
        assert!(!path.exists());
    }
}
