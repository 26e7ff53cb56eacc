//! The stage-sized vectors a validated sparse replica keeps so it can show
//! any partition of its contributions to an auditor: the weights each
//! epoch started from and ended on, and the backlog its contributions
//! started from, of this epoch and the one before (six copies of the
//! stage: about 5.6 GB for a `1.5b` body stage).
//!
//! Each is kept as its leaves' hashes (what every witness carries whole,
//! computed once, not again for every audited partition) and its values:
//! in memory, or past `SPILL_FROM_BYTES`, where the miner has a directory
//! for evidence, in a file there. The file is unlinked as soon as it is
//! created, so it is gone when the record is dropped or the process dies,
//! whatever happens; nothing else in the directory is touched. A partition
//! read back from it is checked against the leaves' hashes, so a file
//! changed on disk is never shown as a witness.
//!
//! A record goes to disk only where its filesystem keeps
//! `MIN_FREE_BYTES` free after it, as the evidence's snapshots do: the
//! records never take the last of the space the snapshots need (work a
//! miner cannot show a validator counts as withheld), and a record that
//! does not fit stays in memory.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use iota_checks::hashes::{WeightsWitness, weights_leaves, weights_root};

use crate::miner::evidence_log::{MIN_FREE_BYTES, free_bytes};

/// Vectors this large or larger go to disk where a directory is given
/// (a `small` stage, 28 MB, does; a `tiny` one stays in memory).
pub(super) const SPILL_FROM_BYTES: usize = 4 << 20;

/// Where a replica's large records go, and when.
#[derive(Clone, Debug)]
pub(super) struct RecordSpill {
    pub(super) dir: PathBuf,
    /// Vectors this many bytes or more go to disk.
    pub(super) from_bytes: usize,
    /// Bytes the directory's filesystem keeps free after a record.
    pub(super) keep_free: u64,
}

impl RecordSpill {
    /// Records from `SPILL_FROM_BYTES` in `dir`, `MIN_FREE_BYTES` left free.
    pub(super) fn new(dir: PathBuf) -> RecordSpill {
        RecordSpill { dir, from_bytes: SPILL_FROM_BYTES, keep_free: MIN_FREE_BYTES }
    }

    /// Whether `bytes` more fit in the directory (created if missing) with
    /// `keep_free` left (false where its free space cannot be read).
    fn has_room(&self, bytes: u64) -> bool {
        std::fs::create_dir_all(&self.dir).is_ok()
            && free_bytes(&self.dir).is_some_and(|free| free >= bytes.saturating_add(self.keep_free))
    }
}

/// One recorded vector.
pub(super) struct Recorded {
    n: usize,
    leaves: Vec<[u8; 32]>,
    values: Values,
}

enum Values {
    Memory(Vec<f32>),
    /// An unlinked file holding the values, f32 little-endian.
    Disk(File),
}

impl Recorded {
    /// Records `values`: on disk in `spill` when given, `values` is at
    /// least its `from_bytes` long and its filesystem has room, else (or
    /// if writing fails: warned) in memory.
    pub(super) fn keep(values: &[f32], spill: Option<&RecordSpill>) -> Recorded {
        let leaves = weights_leaves(values);
        let bytes = values.len().saturating_mul(4);
        let kept = match spill.filter(|s| bytes >= s.from_bytes) {
            Some(s) if !s.has_room(bytes as u64) => {
                tracing::warn!(
                    dir = %s.dir.display(),
                    bytes,
                    keep_free = s.keep_free,
                    "keeping a contribution record in memory: its directory's filesystem has no room for it"
                );
                Values::Memory(values.to_vec())
            }
            Some(s) => match write_unlinked(&s.dir, values) {
                Ok(f) => Values::Disk(f),
                Err(e) => {
                    tracing::warn!(dir = %s.dir.display(), error = %e, "keeping a contribution record in memory: writing it to disk failed");
                    Values::Memory(values.to_vec())
                }
            },
            None => Values::Memory(values.to_vec()),
        };
        Recorded { n: values.len(), leaves, values: kept }
    }

    /// The hash of the whole (`iota_checks::hashes::weights_hash`).
    pub(super) fn hash(&self) -> [u8; 32] {
        weights_root(self.n as u64, &self.leaves)
    }

    pub(super) fn on_disk(&self) -> bool {
        matches!(self.values, Values::Disk(_))
    }

    /// What `WeightsWitness::of` would show of `range` of the whole.
    pub(super) fn witness(&self, range: std::ops::Range<usize>) -> Result<WeightsWitness, String> {
        let (first, span) = WeightsWitness::covering(self.n, range.clone());
        let values = match &self.values {
            Values::Memory(v) => v.get(span).unwrap_or(&[]).to_vec(),
            Values::Disk(f) => {
                let mut bytes = vec![0u8; span.len().saturating_mul(4)];
                f.read_exact_at(&mut bytes, (span.start as u64).saturating_mul(4))
                    .map_err(|e| format!("reading a contribution record back: {e}"))?;
                bytes.chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect()
            }
        };
        let w = WeightsWitness { n: self.n as u64, leaves: self.leaves.clone(), first_leaf: first as u64, values };
        if self.on_disk() {
            let shown = range.start.min(self.n) as u64..range.end.min(self.n) as u64;
            w.range(&self.hash(), shown).map_err(|e| format!("a contribution record changed on disk: {e}"))?;
        }
        Ok(w)
    }
}

/// Writes `values` to a new file in `dir` (created if missing), removed
/// from the directory at once: the open handle is all that keeps it.
fn write_unlinked(dir: &Path, values: &[f32]) -> io::Result<File> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::fs::create_dir_all(dir)?;
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let path = dir.join(format!("contribution-record-{}-{n}.tmp", std::process::id()));
    let mut f = std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
    let removed = std::fs::remove_file(&path);
    let written = f.write_all(bytemuck::cast_slice(values)).and_then(|()| f.flush());
    removed?;
    written?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iota_checks::hashes::{WEIGHTS_LEAF, weights_hash};

    fn values(n: usize) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.61).cos() * 1e-3).collect()
    }

    /// Every record in `dir`, however small, as long as the disk has room.
    fn everything_in(dir: &Path) -> RecordSpill {
        RecordSpill { from_bytes: 0, keep_free: 0, ..RecordSpill::new(dir.to_path_buf()) }
    }

    /// On disk or in memory, a record shows every range as the whole
    /// vector's witness would, hashes as the whole does, and leaves no
    /// file behind in its directory.
    #[test]
    fn a_record_on_disk_shows_what_the_whole_vector_would() {
        let dir = tempfile::tempdir().unwrap();
        let v = values(3 * WEIGHTS_LEAF + 777);
        let disk = Recorded::keep(&v, Some(&everything_in(dir.path())));
        let memory = Recorded::keep(&v, None);
        let small = Recorded::keep(&v, Some(&RecordSpill { from_bytes: usize::MAX, ..everything_in(dir.path()) }));
        // A filesystem that cannot keep this much free after the record.
        let full = Recorded::keep(&v, Some(&RecordSpill { keep_free: u64::MAX, ..everything_in(dir.path()) }));
        assert!(disk.on_disk() && !memory.on_disk() && !small.on_disk() && !full.on_disk());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file is unlinked");
        for r in [&disk, &memory, &small, &full] {
            assert_eq!(r.hash(), weights_hash(&v));
        }
        let n = v.len();
        for range in [0..10, 5..WEIGHTS_LEAF + 3, WEIGHTS_LEAF..2 * WEIGHTS_LEAF, n - 5..n, 0..n, n..n, n - 1..n + 9] {
            let whole = WeightsWitness::of(&v, range.clone());
            assert_eq!(disk.witness(range.clone()).unwrap(), whole, "{range:?}");
            assert_eq!(memory.witness(range.clone()).unwrap(), whole, "{range:?}");
            assert_eq!(full.witness(range.clone()).unwrap(), whole, "{range:?}");
        }
    }

    /// A record file changed on disk is refused when read back, not shown.
    #[test]
    fn a_record_changed_on_disk_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let v = values(2 * WEIGHTS_LEAF);
        let r = Recorded::keep(&v, Some(&everything_in(dir.path())));
        let Values::Disk(f) = &r.values else { panic!("on disk") };
        f.write_all_at(&1.5f32.to_le_bytes(), 4 * (WEIGHTS_LEAF as u64 + 3)).unwrap();
        assert!(r.witness(0..10).is_ok(), "the first leaf is untouched");
        let e = r.witness(WEIGHTS_LEAF..WEIGHTS_LEAF + 10).unwrap_err();
        assert!(e.contains("changed on disk"), "{e}");
    }
}
