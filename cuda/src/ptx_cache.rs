//! Compiled kernels kept on disk between runs.
//!
//! NVRTC compiles our `.cu` sources at run time: 0.65 s for the programs a
//! GPU opens with, 5.7 s for the flash-attention program at its first use
//! (2-core VM). A miner pays that at every start, and six miners on one
//! machine pay it six times. What NVRTC produces is fixed by the source,
//! the target architecture, the options and NVRTC's version, so the PTX is
//! kept on disk under a hash of exactly those and read back on the next
//! start. (The driver's own cache then covers PTX to machine code.)
//!
//! The cache is the user's local disk, not peer input, but a file can still
//! be cut short or damaged: each entry ends with a hash of its PTX, checked
//! on reading; a damaged entry is compiled again and rewritten. Entries are
//! written to a temporary name and renamed, so concurrent miners never read
//! a half-written one. A cache that cannot be written only costs the
//! compile: it is reported once, never fatal.
//!
//! Every changed kernel source or NVRTC adds an entry (0.1-1 MB of PTX), so
//! the cache is kept bounded: after writing an entry, only the
//! `KEEP_PER_PROGRAM` most recently used entries of that program and
//! architecture stay (a hit marks its entry used), and temporary files a
//! killed process left behind go once they are an hour old. A few versions
//! are kept, not one, so two builds used side by side on one machine do not
//! take turns compiling. Only files named as this cache names them are ever
//! removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::kernels::Kernel;
use crate::runtime::{COMPILE_OPTIONS, CudaError};

/// The trailer that ends every entry: this marker, the hex blake3 of the
/// PTX before it, a newline. PTX reads `//` as a comment.
const TRAILER: &str = "// iota-rs ptx cache, blake3 ";

/// Entries kept per program and architecture: the versions in use.
pub const KEEP_PER_PROGRAM: usize = 4;

/// Temporary files older than this were left by a process that died mid-write.
const STALE_TEMPORARY: Duration = Duration::from_secs(3600);

/// Where a program's PTX came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PtxSource {
    /// Read from the cache.
    Cached,
    /// Compiled by NVRTC (no cache, no entry yet, or a damaged one).
    Compiled,
}

/// A directory of compiled programs.
#[derive(Clone, Debug)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    pub fn at(dir: impl Into<PathBuf>) -> PtxCache {
        PtxCache { dir: dir.into() }
    }

    /// The cache a run uses: `IOTA_PTX_CACHE` (a directory, or `off`), else
    /// `$XDG_CACHE_HOME/iota-rs/ptx`, else `$HOME/.cache/iota-rs/ptx`;
    /// none when it is off or there is no home to put it in.
    pub fn from_env() -> Option<PtxCache> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    fn from_vars(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PtxCache> {
        let nonempty = |name| var(name).filter(|v| !v.is_empty());
        if let Some(dir) = nonempty("IOTA_PTX_CACHE") {
            return (dir != "off").then(|| PtxCache::at(dir));
        }
        if let Some(base) = nonempty("XDG_CACHE_HOME") {
            return Some(PtxCache::at(PathBuf::from(base).join("iota-rs/ptx")));
        }
        nonempty("HOME").map(|home| PtxCache::at(PathBuf::from(home).join(".cache/iota-rs/ptx")))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The entry's file for a program, architecture and NVRTC version.
    pub fn entry(&self, k: &Kernel, arch: &str, nvrtc: (i32, i32)) -> PathBuf {
        let mut h = blake3::Hasher::new();
        for part in [k.name, arch, &format!("nvrtc {}.{}", nvrtc.0, nvrtc.1)] {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for opt in COMPILE_OPTIONS {
            h.update(&(opt.len() as u64).to_le_bytes());
            h.update(opt.as_bytes());
        }
        h.update(&(k.source.len() as u64).to_le_bytes());
        h.update(k.source.as_bytes());
        let key = h.finalize().to_hex();
        self.dir.join(format!("{}-{arch}-{}.ptx", k.name, &key[..32]))
    }

    /// Marks an entry as just used (its modification time), so pruning
    /// keeps the entries a run reads. Best effort: a read-only cache still
    /// serves its entries.
    pub fn touch(&self, entry: &Path) {
        if let Ok(f) = std::fs::File::options().write(true).open(entry) {
            let _ = f.set_modified(SystemTime::now());
        }
    }

    /// Removes the entries of `entry`'s program and architecture beyond the
    /// `keep` most recently used (never `entry` itself), and temporary files
    /// older than an hour. Returns how many files went. Best effort: a file
    /// that cannot be removed stays.
    pub fn prune(&self, entry: &Path, keep: usize) -> usize {
        let Some(family) = entry.file_name().and_then(|n| n.to_str()).and_then(entry_family) else {
            return 0;
        };
        let Ok(dir) = std::fs::read_dir(&self.dir) else { return 0 };
        let now = SystemTime::now();
        let mut siblings = Vec::new();
        let mut removed = 0;
        for item in dir.flatten() {
            let name = item.file_name();
            let Some(name) = name.to_str() else { continue };
            let modified = item.metadata().and_then(|m| m.modified()).unwrap_or(now);
            if is_temporary(name) {
                if now.duration_since(modified).is_ok_and(|age| age > STALE_TEMPORARY)
                    && std::fs::remove_file(item.path()).is_ok()
                {
                    removed += 1;
                }
            } else if entry_family(name) == Some(family) && item.path() != entry {
                siblings.push((modified, item.path()));
            }
        }
        // Newest first; `entry` itself (just written or used) counts as one kept.
        siblings.sort_by_key(|s| std::cmp::Reverse(s.0));
        for (_, path) in siblings.into_iter().skip(keep.saturating_sub(1)) {
            if std::fs::remove_file(path).is_ok() {
                removed += 1;
            }
        }
        removed
    }

    /// The PTX an entry holds, if it is there and whole.
    pub fn read(&self, entry: &Path) -> Result<Option<String>, String> {
        let text = match std::fs::read_to_string(entry) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot read {}: {e}", entry.display())),
        };
        let damaged = || Err(format!("{} is damaged (its hash does not match); compiling again", entry.display()));
        let Some(at) = text.rfind(TRAILER) else { return damaged() };
        let (ptx, trailer) = text.split_at(at);
        if trailer[TRAILER.len()..].trim_end() != blake3::hash(ptx.as_bytes()).to_hex().as_str() {
            return damaged();
        }
        Ok(Some(ptx.to_string()))
    }

    /// Writes an entry whole or not at all (a temporary file, renamed).
    pub fn write(&self, entry: &Path, ptx: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{}.{}.tmp", std::process::id(), unique()));
        let body = format!("{ptx}{TRAILER}{}\n", blake3::hash(ptx.as_bytes()).to_hex());
        let written = std::fs::write(&tmp, body).and_then(|()| std::fs::rename(&tmp, entry));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }
}

/// `{program}-{arch}` of a file named as an entry (`{program}-{arch}-{32
/// hex}.ptx`), else None: files of any other name are not the cache's.
fn entry_family(name: &str) -> Option<&str> {
    let (family, key) = name.strip_suffix(".ptx")?.rsplit_once('-')?;
    let hex = key.len() == 32 && key.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && family.contains('-')).then_some(family)
}

/// A temporary file `write` makes: `.{pid}.{n}.tmp`.
fn is_temporary(name: &str) -> bool {
    name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")).and_then(|n| n.split_once('.')).is_some_and(
        |(pid, n)| !pid.is_empty() && !n.is_empty() && pid.bytes().chain(n.bytes()).all(|b| b.is_ascii_digit()),
    )
}

/// A number no other call in this process gets (temporary file names).
fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// NVRTC's version (major, minor). NVRTC must be loadable.
fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !crate::runtime::nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); the call writes two ints.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::Compile { name: "nvrtc version", log: format!("{e:?}") })?;
    Ok((major, minor))
}

/// A program's PTX for `arch`: from `cache` when it holds a whole entry for
/// this source, architecture and NVRTC, else compiled (and stored). Cache
/// trouble is reported on stderr once per program and never fails the
/// compile.
pub fn compile_cached(
    cache: Option<&PtxCache>,
    k: &Kernel,
    include: &Path,
    arch: &'static str,
) -> Result<(cudarc::nvrtc::Ptx, PtxSource), CudaError> {
    let Some(cache) = cache else {
        return Ok((crate::runtime::compile(k, include, arch)?, PtxSource::Compiled));
    };
    let entry = cache.entry(k, arch, nvrtc_version()?);
    match cache.read(&entry) {
        Ok(Some(ptx)) => {
            cache.touch(&entry);
            return Ok((cudarc::nvrtc::Ptx::from_src(ptx), PtxSource::Cached));
        }
        Ok(None) => {}
        Err(why) => eprintln!("note: kernel cache: {why}"),
    }
    let ptx = crate::runtime::compile(k, include, arch)?;
    if let Err(e) = cache.write(&entry, &ptx.to_src()) {
        eprintln!(
            "note: kernel cache: cannot write {} ({e}); kernels will be compiled again next start (set IOTA_PTX_CACHE to a writable directory, or to off)",
            entry.display()
        );
    } else {
        cache.prune(&entry, KEEP_PER_PROGRAM);
    }
    Ok((ptx, PtxSource::Compiled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let pairs: Vec<(String, OsString)> = pairs.iter().map(|(k, v)| (k.to_string(), OsString::from(v))).collect();
        move |name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn the_cache_directory_follows_the_environment() {
        let dir = |p: &[(&str, &str)]| PtxCache::from_vars(vars(p)).map(|c| c.dir().to_path_buf());
        assert_eq!(dir(&[("IOTA_PTX_CACHE", "/x"), ("HOME", "/h")]), Some(PathBuf::from("/x")));
        assert_eq!(dir(&[("IOTA_PTX_CACHE", "off"), ("HOME", "/h")]), None);
        assert_eq!(dir(&[("XDG_CACHE_HOME", "/c"), ("HOME", "/h")]), Some(PathBuf::from("/c/iota-rs/ptx")));
        assert_eq!(dir(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")]), Some(PathBuf::from("/h/.cache/iota-rs/ptx")));
        assert_eq!(dir(&[]), None);
    }

    fn kernel(name: &'static str, source: &'static str) -> Kernel {
        Kernel { name, source, functions: &[], lazy: false }
    }

    #[test]
    fn an_entry_is_keyed_by_everything_that_decides_the_ptx() {
        let cache = PtxCache::at("/c");
        let a = kernel("ops", "int x;");
        let base = cache.entry(&a, "compute_90", (13, 0));
        assert_eq!(base, cache.entry(&a, "compute_90", (13, 0)));
        for other in [
            cache.entry(&kernel("ops", "int y;"), "compute_90", (13, 0)),
            cache.entry(&kernel("flash", "int x;"), "compute_90", (13, 0)),
            cache.entry(&a, "compute_80", (13, 0)),
            cache.entry(&a, "compute_90", (13, 1)),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn an_entry_reads_back_whole_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::at(dir.path().join("deeper"));
        let entry = cache.entry(&kernel("ops", "int x;"), "compute_90", (13, 0));
        assert_eq!(cache.read(&entry), Ok(None));
        let ptx = ".version 9.0\n.target sm_90\n// body\n";
        cache.write(&entry, ptx).unwrap();
        assert_eq!(cache.read(&entry).unwrap().as_deref(), Some(ptx));
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(cache.dir()).unwrap().count(), 1);
        let whole = std::fs::read(&entry).unwrap();
        // One changed byte, a cut anywhere, and the trailer gone are all refused.
        let mut flipped = whole.clone();
        flipped[3] ^= 1;
        for damaged in [flipped, whole[..whole.len() - 10].to_vec(), whole[..ptx.len()].to_vec(), Vec::new()] {
            std::fs::write(&entry, &damaged).unwrap();
            let err = cache.read(&entry).unwrap_err();
            assert!(err.contains("damaged"), "{err}");
        }
    }

    fn set_age(path: &Path, secs_ago: u64) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(secs_ago)).unwrap();
    }

    #[test]
    fn pruning_keeps_the_recently_used_versions_of_a_program_and_nothing_else_goes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::at(dir.path());
        // Six versions of `ops` on compute_90, the oldest first.
        let versions: Vec<PathBuf> = (0..6)
            .map(|i| {
                let source: &'static str = Box::leak(format!("int v{i};").into_boxed_str());
                let e = cache.entry(&kernel("ops", source), "compute_90", (13, 0));
                cache.write(&e, "ptx").unwrap();
                set_age(&e, 1000 - 100 * i);
                e
            })
            .collect();
        // The oldest is used again: it counts as recent.
        cache.touch(&versions[0]);
        // Another program, another architecture, files that are not entries, a fresh and a stale temporary file.
        let flash = cache.entry(&kernel("flash", "int v0;"), "compute_90", (13, 0));
        let ops80 = cache.entry(&kernel("ops", "int v0;"), "compute_80", (13, 0));
        for e in [&flash, &ops80] {
            cache.write(e, "ptx").unwrap();
            set_age(e, 5000);
        }
        let foreign = ["notes.txt", "ops-compute_90-short.ptx", "ops-compute_90-0123456789abcdef0123456789ABCDEF.ptx"];
        for f in foreign {
            std::fs::write(dir.path().join(f), "mine").unwrap();
            set_age(&dir.path().join(f), 9000);
        }
        let (fresh_tmp, stale_tmp) = (dir.path().join(".12.0.tmp"), dir.path().join(".12.1.tmp"));
        std::fs::write(&fresh_tmp, "half").unwrap();
        std::fs::write(&stale_tmp, "half").unwrap();
        set_age(&stale_tmp, 7200);

        // A new version is written: it and the three most recently used stay.
        let newest = cache.entry(&kernel("ops", "int v6;"), "compute_90", (13, 0));
        cache.write(&newest, "ptx").unwrap();
        assert_eq!(cache.prune(&newest, KEEP_PER_PROGRAM), 4, "three old versions and the stale temporary file");
        let exists = |p: &PathBuf| p.exists();
        assert!(exists(&newest) && exists(&versions[0]) && exists(&versions[5]) && exists(&versions[4]));
        assert!(!exists(&versions[1]) && !exists(&versions[2]) && !exists(&versions[3]));
        assert!(exists(&flash) && exists(&ops80) && exists(&fresh_tmp) && !exists(&stale_tmp));
        for f in foreign {
            assert!(dir.path().join(f).exists(), "{f} is not the cache's to remove");
        }
        // Pruning again removes nothing more; a cache with no directory is no error.
        assert_eq!(cache.prune(&newest, KEEP_PER_PROGRAM), 0);
        assert_eq!(PtxCache::at(dir.path().join("absent")).prune(&newest, KEEP_PER_PROGRAM), 0);
    }

    #[test]
    fn only_names_the_cache_writes_count_as_its_files() {
        assert_eq!(entry_family("ops-compute_90-0123456789abcdef0123456789abcdef.ptx"), Some("ops-compute_90"));
        assert_eq!(
            entry_family("flash-bwd-compute_90-0123456789abcdef0123456789abcdef.ptx"),
            Some("flash-bwd-compute_90")
        );
        for name in [
            "ops.ptx",
            "ops-compute_90-0123.ptx",
            "compute_90-0123456789abcdef0123456789abcdef.ptx",
            "x-y-0123456789abcdef0123456789abcdeg.ptx",
        ] {
            assert_eq!(entry_family(name), None, "{name}");
        }
        assert!(is_temporary(".123.4.tmp"));
        for name in [".123.tmp", "123.4.tmp", ".a.4.tmp", "..4.tmp", ".123.4.tmp.bak"] {
            assert!(!is_temporary(name), "{name}");
        }
    }
}
