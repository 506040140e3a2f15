//! Naming a device on the command line and in config files: one path (a
//! file or a block device), or a RAID-0 stripe set as a comma-separated list
//! of member paths (`/dev/nvme0n1,/dev/nvme1n1`). [`DeviceSpec`] parses the
//! name and opens or creates what it names.

use crate::stripe::{StripedDevice, LABEL_BYTES};
use crate::{Device, FileDevice, IoBackend, OpenMode};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What a data path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSpec {
    /// One file or block device.
    Single(PathBuf),
    /// A stripe set over these members (in set order when created).
    Striped(Vec<PathBuf>),
}

/// The bytes at the start of a block device that must be zeros for a
/// store to be made on it (a store's superblocks, a member's stripe label
/// and the store's superblocks behind it, the signatures of partition
/// tables and filesystems), and that a failed creation zeroes again.
pub const BLANK_HEAD_BYTES: u64 = 1024 * 1024;

/// Zero the head of block device `p` if it starts with a stripe label.
/// Under the device's exclusive claim: one claimed meanwhile (another
/// creation that found it blank and waited for this one's claim) is left
/// alone.
fn blank_labelled(p: &Path) -> io::Result<()> {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = match std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_EXCL).open(p) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            tracing::warn!(device = %p.display(), "a failed creation's stripe label left as it is: the device is claimed by another program now");
            return Ok(());
        }
        f => f?,
    };
    let mut magic = [0u8; 8];
    f.read_exact(&mut magic)?;
    if magic != crate::stripe::LABEL_MAGIC {
        return Ok(());
    }
    let len = f.seek(SeekFrom::End(0))?.min(BLANK_HEAD_BYTES);
    f.seek(SeekFrom::Start(0))?;
    f.write_all(&vec![0u8; len as usize])?;
    f.sync_all()
}

fn is_block_device(p: &Path) -> bool {
    std::fs::metadata(p).map(|m| m.file_type().is_block_device()).unwrap_or(false)
}

impl DeviceSpec {
    /// Parse a data path: a comma separates stripe members.
    pub fn parse(path: &Path) -> io::Result<DeviceSpec> {
        let bytes = path.as_os_str().as_bytes();
        if !bytes.contains(&b',') {
            return Ok(DeviceSpec::Single(path.to_owned()));
        }
        let members: Vec<PathBuf> =
            bytes.split(|&b| b == b',').map(|p| PathBuf::from(std::ffi::OsStr::from_bytes(p))).collect();
        if members.iter().any(|m| m.as_os_str().is_empty()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: an empty member in the stripe set's list", path.display()),
            ));
        }
        for (i, m) in members.iter().enumerate() {
            if members[..i].contains(m) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is named twice in the stripe set", m.display()),
                ));
            }
        }
        Ok(DeviceSpec::Striped(members))
    }

    /// The paths it names.
    pub fn paths(&self) -> Vec<&Path> {
        match self {
            DeviceSpec::Single(p) => vec![p.as_path()],
            DeviceSpec::Striped(ms) => ms.iter().map(|m| m.as_path()).collect(),
        }
    }

    /// Whether the device exists: every path does. A stripe set with some
    /// members present and others not is an error (a lost member is not
    /// silently replaced by a new empty file).
    pub fn exists(&self) -> io::Result<bool> {
        let paths = self.paths();
        let present: Vec<&Path> = paths.iter().copied().filter(|p| p.exists()).collect();
        if present.is_empty() {
            return Ok(false);
        }
        if present.len() == paths.len() {
            return Ok(true);
        }
        let absent: Vec<String> = paths.iter().filter(|p| !p.exists()).map(|p| p.display().to_string()).collect();
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("stripe member(s) {} missing while others exist", absent.join(", ")),
        ))
    }

    /// Open an existing device.
    pub fn open(&self, mode: OpenMode, backend: IoBackend) -> io::Result<Arc<dyn Device>> {
        self.open_as(mode, backend, false)
    }

    /// [`DeviceSpec::open`] for reading only ([`FileDevice::open_read_only`]).
    pub fn open_read_only(&self, mode: OpenMode, backend: IoBackend) -> io::Result<Arc<dyn Device>> {
        self.open_as(mode, backend, true)
    }

    fn open_as(&self, mode: OpenMode, backend: IoBackend, read_only: bool) -> io::Result<Arc<dyn Device>> {
        let open_one = |p: &Path| -> io::Result<Arc<dyn Device>> {
            let d = if read_only { FileDevice::open_read_only(p, mode)? } else { FileDevice::open(p, mode)? };
            Ok(Arc::new(d.with_backend(backend)))
        };
        match self {
            DeviceSpec::Single(p) => open_one(p),
            DeviceSpec::Striped(ms) => {
                let members = ms.iter().map(|m| open_one(m)).collect::<io::Result<Vec<_>>>()?;
                Ok(Arc::new(StripedDevice::open(members)?))
            }
        }
    }

    /// Create the device: files of `size_bytes` in all (split evenly over a
    /// stripe set's members, plus each member's label); block devices are
    /// used whole. A stripe set gets `stripe_bytes` stripes. On failure the
    /// files this call created are removed.
    pub fn create(
        &self,
        size_bytes: u64,
        stripe_bytes: u32,
        mode: OpenMode,
        backend: IoBackend,
    ) -> io::Result<Arc<dyn Device>> {
        self.create_with_progress(size_bytes, stripe_bytes, mode, backend, &|_, _| Ok(()))
    }

    /// [`DeviceSpec::create`], reporting the new files' zero fill
    /// ([`FileDevice::create_with_progress`]) as `progress(bytes_done,
    /// bytes_total)` over all members; an error from `progress` cancels
    /// the creation (the files made so far are removed).
    pub fn create_with_progress(
        &self,
        size_bytes: u64,
        stripe_bytes: u32,
        mode: OpenMode,
        backend: IoBackend,
        progress: &dyn Fn(u64, u64) -> io::Result<()>,
    ) -> io::Result<Arc<dyn Device>> {
        if let DeviceSpec::Striped(ms) = self {
            crate::stripe::check_settings(ms.len(), stripe_bytes)?;
        }
        let files: Vec<&Path> = self.paths().into_iter().filter(|p| !is_block_device(p)).collect();
        let per = match self {
            DeviceSpec::Single(_) => size_bytes,
            DeviceSpec::Striped(ms) => {
                (size_bytes / ms.len() as u64).next_multiple_of(stripe_bytes.max(1) as u64) + LABEL_BYTES
            }
        };
        // Each file's fill reports its own bytes; the sum goes out.
        let total = per * files.len() as u64;
        let mut before = 0u64;
        let mut created: Vec<PathBuf> = Vec::new();
        let mut make = |p: &Path| -> io::Result<Arc<dyn Device>> {
            let d = if is_block_device(p) {
                FileDevice::open(p, mode)?
            } else {
                let d = FileDevice::create_with_progress(p, per, mode, &|done, _| progress(before + done, total))?;
                created.push(p.to_owned());
                before += per;
                d
            };
            Ok(Arc::new(d.with_backend(backend)))
        };
        let r = match self {
            DeviceSpec::Single(p) => make(p),
            DeviceSpec::Striped(ms) => ms
                .iter()
                .map(|m| make(m))
                .collect::<io::Result<Vec<_>>>()
                .and_then(|members| Ok(Arc::new(StripedDevice::create(members, stripe_bytes)?) as Arc<dyn Device>)),
        };
        if r.is_err() {
            for p in created {
                let _ = std::fs::remove_file(p);
            }
        }
        r
    }

    /// Remove the files of an interrupted creation: when every file of
    /// the device that exists still starts with
    /// [`crate::file::UNFINISHED_MAGIC`] (the creation was killed before
    /// it wrote the store or the stripe labels, so they hold nothing),
    /// remove them and return true; otherwise touch nothing and return
    /// false. Each is locked first: a file another process holds (a
    /// creation still running, a store in use) is left alone, for the
    /// open that follows to report. Only regular files are looked at:
    /// block devices are never removed, and anything else (a FIFO, whose
    /// open would wait for a writer) is left for the open to refuse.
    pub fn remove_unfinished(&self) -> io::Result<bool> {
        // Follows links, as the device code does.
        let regular = |p: &&Path| std::fs::metadata(p).is_ok_and(|m| m.is_file());
        let files: Vec<&Path> = self.paths().into_iter().filter(regular).collect();
        let mut held = Vec::with_capacity(files.len());
        for p in &files {
            match crate::file::lock_if_unfinished(p)? {
                Some(f) => held.push(f),
                None => return Ok(false),
            }
        }
        for p in &files {
            std::fs::remove_file(p)
                .map_err(|e| io::Error::new(e.kind(), format!("cannot remove {}: {e}", p.display())))?;
        }
        Ok(!files.is_empty())
    }

    /// Undo a creation that made the device (the files, or the stripe
    /// set's labels) and then failed: remove the files, and give each
    /// block device of a stripe set that now starts with a stripe label
    /// its blank head back ([`BLANK_HEAD_BYTES`] of zeros: a creation
    /// writes on a block device only over a blank head), so the next try
    /// makes the set again rather than find labels with no store behind
    /// them. Best effort: a device that cannot be blanked is logged, and
    /// one another process claims now is left alone.
    pub fn remove_files(&self) {
        for p in self.paths() {
            if !is_block_device(p) {
                let _ = std::fs::remove_file(p);
            }
        }
        self.blank_labels();
    }

    /// Zero the head of each block device of a stripe set that starts with
    /// a stripe label (see [`DeviceSpec::remove_files`]).
    fn blank_labels(&self) {
        let DeviceSpec::Striped(members) = self else { return };
        for p in members.iter().filter(|p| is_block_device(p)) {
            if let Err(e) = blank_labelled(p) {
                tracing::warn!(device = %p.display(), error = %e, "cannot zero the stripe label a failed creation wrote");
            }
        }
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ps: Vec<String> = self.paths().iter().map(|p| p.display().to_string()).collect();
        f.write_str(&ps.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_single_and_striped() {
        assert_eq!(DeviceSpec::parse(Path::new("a/b.db")).unwrap(), DeviceSpec::Single("a/b.db".into()));
        assert_eq!(DeviceSpec::parse(Path::new("a,b")).unwrap(), DeviceSpec::Striped(vec!["a".into(), "b".into()]));
        assert!(DeviceSpec::parse(Path::new("a,,b")).is_err());
        assert!(DeviceSpec::parse(Path::new("a,b,a")).unwrap_err().to_string().contains("named twice"));
    }

    /// A new file starts with the unfinished mark until something is
    /// written over it; `remove_unfinished` removes such files only, and
    /// never one a live device (a creation under way) holds locked.
    #[test]
    fn only_an_unfinished_creation_is_removed() {
        use crate::file::{is_unfinished, UNFINISHED_MAGIC};
        use crate::Device;
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let a = dir.path().join("a");
        let spec = DeviceSpec::parse(&a).unwrap();
        assert!(!spec.remove_unfinished().unwrap(), "nothing there");
        for mode in [OpenMode::Direct, OpenMode::Buffered] {
            let d = FileDevice::create(&a, 8 << 20, mode).unwrap();
            assert!(is_unfinished(&a).unwrap(), "{mode:?}");
            // Still held by its creator: left alone.
            assert!(!spec.remove_unfinished().unwrap());
            assert!(a.exists());
            drop(d);
            assert!(spec.remove_unfinished().unwrap(), "{mode:?}");
            assert!(!a.exists());
        }
        // Written over (as the store's superblock is at offset 0): kept.
        let d = FileDevice::create(&a, 8 << 20, OpenMode::Direct).unwrap();
        let mut block = crate::AlignedBuf::zeroed(4096);
        block[..8].copy_from_slice(b"GRANARY\0");
        let (_, r) = d.write_at(block, 0);
        r.unwrap();
        drop(d);
        assert!(!is_unfinished(&a).unwrap());
        assert!(!spec.remove_unfinished().unwrap());
        assert!(a.exists());
        std::fs::remove_file(&a).unwrap();
        // A stripe set's labels are written over every member's mark; a
        // set whose members all kept it goes whole.
        let (b, c) = (dir.path().join("b"), dir.path().join("c"));
        let set = DeviceSpec::parse(Path::new(&format!("{},{}", b.display(), c.display()))).unwrap();
        drop(set.create(16 << 20, 64 * 1024, OpenMode::Direct, IoBackend::Sync).unwrap());
        assert!(!is_unfinished(&b).unwrap() && !is_unfinished(&c).unwrap());
        assert!(!set.remove_unfinished().unwrap());
        for p in [&b, &c] {
            std::fs::remove_file(p).unwrap();
            drop(FileDevice::create(p, 8 << 20, OpenMode::Direct).unwrap());
            assert_eq!(std::fs::read(p).unwrap()[..8], UNFINISHED_MAGIC);
        }
        assert!(set.remove_unfinished().unwrap());
        assert!(!b.exists() && !c.exists());
    }

    /// Cancelled (the progress callback's error) in the second member's
    /// fill, a stripe set's creation removes the first member too.
    #[test]
    fn a_cancelled_stripe_set_creation_leaves_no_member() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let spec = DeviceSpec::parse(Path::new(&format!("{},{}", a.display(), b.display()))).unwrap();
        let e = spec
            .create_with_progress(64 << 20, 64 * 1024, OpenMode::Direct, IoBackend::Sync, &|d, t| {
                if d > t / 2 {
                    assert!(a.exists() && b.exists());
                    return Err(io::Error::new(io::ErrorKind::Interrupted, "cancelled"));
                }
                Ok(())
            })
            .err()
            .expect("cancelled");
        assert_eq!(e.kind(), io::ErrorKind::Interrupted);
        assert!(!a.exists() && !b.exists(), "no member is left");
    }

    #[test]
    fn create_then_open_a_stripe_set_of_files() {
        let dir = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        let spec = DeviceSpec::parse(Path::new(&format!("{},{}", a.display(), b.display()))).unwrap();
        assert!(!spec.exists().unwrap());
        // The members' zero fills are reported as one sum, growing to it.
        let seen = std::sync::Mutex::new(Vec::new());
        let d = spec
            .create_with_progress(1 << 20, 64 * 1024, OpenMode::Direct, IoBackend::Sync, &|d, t| {
                seen.lock().unwrap().push((d, t));
                Ok(())
            })
            .unwrap();
        let seen = seen.into_inner().unwrap();
        let total = 2 * ((1 << 19) + LABEL_BYTES);
        assert!(seen.iter().all(|&(_, t)| t == total), "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
        assert_eq!(seen.last(), Some(&(total, total)));
        assert!(seen.contains(&(total / 2, total)), "the first member's end: {seen:?}");
        assert_eq!(d.size_bytes(), 1 << 20);
        assert!(d.describe().starts_with("RAID-0 of 2 members"), "{}", d.describe());
        drop(d);
        assert!(spec.exists().unwrap());
        let d = spec.open(OpenMode::Direct, IoBackend::Sync).unwrap();
        assert_eq!(d.size_bytes(), 1 << 20);
        drop(d);
        // Named in the other order: the labels put them back.
        let swapped = DeviceSpec::parse(Path::new(&format!("{},{}", b.display(), a.display()))).unwrap();
        swapped.open(OpenMode::Direct, IoBackend::Sync).unwrap();
        std::fs::remove_file(&b).unwrap();
        assert!(spec.exists().unwrap_err().to_string().contains("missing while others exist"));
        // A failed create removes what it made: the second member is a directory.
        let c = dir.path().join("c");
        let bad = DeviceSpec::Striped(vec![c.clone(), dir.path().to_owned()]);
        assert!(bad.create(1 << 20, 64 * 1024, OpenMode::Direct, IoBackend::Sync).is_err());
        assert!(!c.exists());
    }
}
