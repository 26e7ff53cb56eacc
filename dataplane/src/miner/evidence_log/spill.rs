//! Weights snapshots past the evidence log's memory budget, kept in files
//! of the miner's cache directory until the epoch's evidence is freed.
//!
//! A validator may draw any attempt of an epoch, so an honest miner must
//! be able to show the weights of every inner step it took. A `small`
//! stage's snapshot is about 28 MB, a `1.5b` stage's about 2 GB: memory
//! holds a few, a disk holds an epoch's. Each snapshot is written by a
//! thread of its own (the worker goes on computing) with at most one write
//! in flight, so memory holds at most one snapshot past its budget. The
//! writer hashes what it wrote; a read checks the length and the hash, so
//! a file changed or cut short on disk is never shown as evidence.
//!
//! Files are named `e{epoch}-s{stage}-v{state}.snap` in a directory of
//! this miner's own (its peer id): a file is removed as its snapshot is
//! freed, and a miner starting up removes the `.snap` files an earlier
//! life of it left there (their index died with that process). Nothing
//! else in the directory is touched.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use tracing::warn;

/// Where a snapshot (a weights state, or an optimizer state) is.
pub(super) enum Snapshot {
    Memory(Vec<f32>),
    Disk(Spilled),
    /// Over the budgets, freed because no attempt used it, or lost.
    None,
}

impl Snapshot {
    /// A copy of what it holds (read back from disk where it was spilled).
    pub(super) fn load(&mut self) -> Result<Vec<f32>, &'static str> {
        match self {
            Snapshot::Memory(w) => Ok(w.clone()),
            Snapshot::Disk(s) => s.load(),
            Snapshot::None => Err("not kept"),
        }
    }
}

/// Kept free on the directory's filesystem whatever the budget says.
pub const MIN_FREE_BYTES: u64 = 1 << 30;

/// Where snapshots past the memory budget go, and how much may go there.
#[derive(Debug)]
pub struct SpillDir {
    dir: PathBuf,
    max_bytes: u64,
}

impl SpillDir {
    /// Opens `dir` (created if missing) for snapshots, at most `max_bytes`
    /// of them per epoch (u64::MAX: as much as the filesystem holds with
    /// `MIN_FREE_BYTES` left free), and removes the snapshot files an
    /// earlier life of this miner left in it.
    pub fn open(dir: PathBuf, max_bytes: u64) -> io::Result<SpillDir> {
        std::fs::create_dir_all(&dir)?;
        let mut removed = 0usize;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if is_snapshot_name(&path) && std::fs::remove_file(&path).is_ok() {
                removed = removed.saturating_add(1);
            }
        }
        if removed > 0 {
            warn!(dir = %dir.display(), removed, "removed evidence snapshots an earlier run of this miner left");
        }
        Ok(SpillDir { dir, max_bytes })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether `bytes` more fit, with `used` already spilled this epoch.
    pub fn has_room(&self, used: u64, bytes: u64) -> bool {
        let within_budget = used.checked_add(bytes).is_some_and(|t| t <= self.max_bytes);
        within_budget && free_bytes(&self.dir).is_some_and(|free| free >= bytes.saturating_add(MIN_FREE_BYTES))
    }

    /// Starts writing `weights` as state `version` of `epoch` on `stage`.
    pub fn spill(&self, epoch: u64, stage: u32, version: usize, weights: Vec<f32>) -> io::Result<Spilled> {
        let path = self.dir.join(format!("e{epoch}-s{stage}-v{version}.snap"));
        let floats = weights.len();
        let target = path.clone();
        let write = std::thread::Builder::new()
            .name("evidence-spill".into())
            .spawn(move || write_snapshot(&target, &weights))?;
        Ok(Spilled { path, floats, write: Some(write), hash: None })
    }
}

fn is_snapshot_name(path: &Path) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.starts_with('e') && name.ends_with(".snap")
}

fn write_snapshot(path: &Path, weights: &[f32]) -> io::Result<[u8; 32]> {
    let bytes: &[u8] = bytemuck::cast_slice(weights);
    let mut f = std::fs::File::create(path)?;
    f.write_all(bytes)?;
    f.flush()?;
    Ok(*blake3::hash(bytes).as_bytes())
}

/// Bytes free to an unprivileged writer on the filesystem holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value of that plain C struct.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and outlives the call; `s` is a
    // valid place for the result.
    let rc = unsafe { libc::statvfs(path.as_ptr(), &mut s) };
    // The fields are u64 on 64-bit Linux, narrower elsewhere.
    #[allow(clippy::useless_conversion, reason = "the statvfs field types differ across platforms")]
    let (avail, frsize) = (u64::from(s.f_bavail), u64::from(s.f_frsize));
    (rc == 0).then(|| avail.saturating_mul(frsize))
}

/// One snapshot on disk (or being written there).
#[derive(Debug)]
pub struct Spilled {
    path: PathBuf,
    floats: usize,
    write: Option<JoinHandle<io::Result<[u8; 32]>>>,
    /// The BLAKE3 of the bytes written, once the write finished well.
    hash: Option<[u8; 32]>,
}

impl Spilled {
    pub fn bytes(&self) -> u64 {
        (self.floats as u64).saturating_mul(4)
    }

    /// Waits for its write; false if it failed (warned).
    pub fn settle(&mut self) -> bool {
        if let Some(w) = self.write.take() {
            match w.join() {
                Ok(Ok(h)) => self.hash = Some(h),
                Ok(Err(e)) => warn!(path = %self.path.display(), error = %e, "writing an evidence snapshot failed"),
                Err(_) => warn!(path = %self.path.display(), "the evidence snapshot writer panicked"),
            }
        }
        self.hash.is_some()
    }

    /// Whether its write is still running.
    pub fn writing(&self) -> bool {
        self.write.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// Reads it back, checked against the length and hash written.
    pub fn load(&mut self) -> Result<Vec<f32>, &'static str> {
        if !self.settle() {
            return Err("its weights could not be written to disk");
        }
        let bytes = std::fs::read(&self.path).map_err(|_| "its weights file cannot be read")?;
        if bytes.len() as u64 != self.bytes() || Some(*blake3::hash(&bytes).as_bytes()) != self.hash {
            return Err("its weights file changed on disk");
        }
        Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

impl Drop for Spilled {
    fn drop(&mut self) {
        // The writer first, so the file is not created after its removal.
        if let Some(w) = self.write.take() {
            let _ = w.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
