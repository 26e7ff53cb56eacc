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

use std::path::{Path, PathBuf};

use crate::kernels::Kernel;
use crate::runtime::{COMPILE_OPTIONS, CudaError};

/// The trailer that ends every entry: this marker, the hex blake3 of the
/// PTX before it, a newline. PTX reads `//` as a comment.
const TRAILER: &str = "// iota-rs ptx cache, blake3 ";

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
        Ok(Some(ptx)) => return Ok((cudarc::nvrtc::Ptx::from_src(ptx), PtxSource::Cached)),
        Ok(None) => {}
        Err(why) => eprintln!("note: kernel cache: {why}"),
    }
    let ptx = crate::runtime::compile(k, include, arch)?;
    if let Err(e) = cache.write(&entry, &ptx.to_src()) {
        eprintln!(
            "note: kernel cache: cannot write {} ({e}); kernels will be compiled again next start (set IOTA_PTX_CACHE to a writable directory, or to off)",
            entry.display()
        );
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
}
