//! Spilling and loading large buffers (checkpoints, weight uploads) on a
//! dedicated I/O thread, through io_uring where the kernel allows it.
//!
//! At start the thread tries to build a tokio-uring runtime; if the kernel
//! (or a seccomp policy) refuses io_uring, it falls back to std file I/O and
//! says so once in the log. Callers see the same async API either way.
//! Writes are atomic: data goes to `<path>.tmp`, is synced, then renamed.

use std::io;
use std::path::{Path, PathBuf};

use tokio::sync::{mpsc, oneshot};
use tracing::info;

/// Which implementation serves the requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoBackend {
    IoUring,
    /// std file I/O; the string says why io_uring is not used.
    Std(String),
}

enum Job {
    Write { path: PathBuf, data: Vec<u8>, reply: oneshot::Sender<io::Result<()>> },
    Read { path: PathBuf, reply: oneshot::Sender<io::Result<Vec<u8>>> },
}

/// Handle to the I/O thread (cheap to clone; the thread ends when the last
/// handle drops).
#[derive(Clone)]
pub struct FileIo {
    tx: mpsc::UnboundedSender<Job>,
    backend: IoBackend,
}

/// Chunk size of io_uring reads and writes.
const CHUNK: usize = 4 << 20;

/// A temporary name of this write alone: two writers of one path (two
/// replicas storing one merged slice, two processes on one store
/// directory) must not rename each other's temporary file away.
fn tmp_path(path: &Path) -> PathBuf {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".{}-{n}.tmp", std::process::id()));
    PathBuf::from(p)
}

impl FileIo {
    /// Starts the I/O thread, with io_uring if available (`force_std` skips it).
    pub fn start(force_std: bool) -> FileIo {
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("iota-file-io".into())
            .spawn(move || run(rx, force_std, ready_tx))
            .expect("spawning the file I/O thread");
        let backend = ready_rx.recv().unwrap_or(IoBackend::Std("I/O thread failed to start".into()));
        match &backend {
            IoBackend::IoUring => info!("file I/O: io_uring"),
            IoBackend::Std(why) => info!("file I/O: std (io_uring unavailable: {why})"),
        }
        FileIo { tx, backend }
    }

    pub fn backend(&self) -> &IoBackend {
        &self.backend
    }

    /// Writes `data` to `path` atomically (temporary file, sync, rename).
    pub async fn write(&self, path: impl Into<PathBuf>, data: Vec<u8>) -> io::Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job::Write { path: path.into(), data, reply }).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }

    /// Reads the whole file at `path`.
    pub async fn read(&self, path: impl Into<PathBuf>) -> io::Result<Vec<u8>> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Job::Read { path: path.into(), reply }).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

fn gone() -> io::Error {
    io::Error::other("file I/O thread has stopped")
}

fn run(mut rx: mpsc::UnboundedReceiver<Job>, force_std: bool, ready: std::sync::mpsc::Sender<IoBackend>) {
    #[cfg(target_os = "linux")]
    if !force_std {
        match tokio_uring::Runtime::new(&tokio_uring::builder()) {
            Ok(rt) => {
                let _ = ready.send(IoBackend::IoUring);
                rt.block_on(async move {
                    while let Some(job) = rx.recv().await {
                        tokio_uring::spawn(uring::serve(job));
                    }
                });
                return;
            }
            Err(e) => {
                let _ = ready.send(IoBackend::Std(e.to_string()));
                return serve_std(rx);
            }
        }
    }
    let why = if force_std { "disabled by configuration" } else { "not Linux" };
    let _ = ready.send(IoBackend::Std(why.into()));
    serve_std(rx)
}

fn serve_std(mut rx: mpsc::UnboundedReceiver<Job>) {
    while let Some(job) = rx.blocking_recv() {
        match job {
            Job::Write { path, data, reply } => {
                let _ = reply.send(std_write(&path, &data));
            }
            Job::Read { path, reply } => {
                let _ = reply.send(std::fs::read(&path));
            }
        }
    }
}

fn std_write(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = tmp_path(path);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

#[cfg(target_os = "linux")]
mod uring {
    use super::*;

    pub(super) async fn serve(job: Job) {
        match job {
            Job::Write { path, data, reply } => {
                let _ = reply.send(write(&path, data).await);
            }
            Job::Read { path, reply } => {
                let _ = reply.send(read(&path).await);
            }
        }
    }

    async fn write(path: &Path, data: Vec<u8>) -> io::Result<()> {
        let tmp = tmp_path(path);
        let f = tokio_uring::fs::File::create(&tmp).await?;
        let mut buf = Vec::with_capacity(CHUNK.min(data.len()));
        let mut pos = 0usize;
        while pos < data.len() {
            let end = (pos + CHUNK).min(data.len());
            buf.clear();
            buf.extend_from_slice(&data[pos..end]);
            let (r, b) = f.write_all_at(buf, pos as u64).await;
            r?;
            buf = b;
            pos = end;
        }
        f.sync_all().await?;
        f.close().await?;
        std::fs::rename(&tmp, path)
    }

    async fn read(path: &Path) -> io::Result<Vec<u8>> {
        let len = std::fs::metadata(path)?.len() as usize;
        let f = tokio_uring::fs::File::open(path).await?;
        let mut out = Vec::with_capacity(len);
        let mut pos = 0usize;
        while pos < len {
            let want = CHUNK.min(len - pos);
            let (r, b) = f.read_exact_at(Vec::with_capacity(want), pos as u64).await;
            r?;
            out.extend_from_slice(&b);
            pos += want;
        }
        f.close().await?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn round_trip(io: &FileIo, dir: &Path) {
        let path = dir.join("blob.bin");
        let data: Vec<u8> = (0..(9 << 20) + 123).map(|i| (i * 7 % 251) as u8).collect();
        io.write(&path, data.clone()).await.unwrap();
        let names: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("blob.bin")], "temporary file renamed away");
        assert_eq!(io.read(&path).await.unwrap(), data);
        io.write(&path, vec![1, 2, 3]).await.unwrap();
        assert_eq!(io.read(&path).await.unwrap(), vec![1, 2, 3]);
        assert!(io.read(dir.join("missing")).await.is_err());
    }

    #[tokio::test]
    async fn both_backends_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let auto = FileIo::start(false);
        // Whichever backend the kernel allows must work; report which one ran.
        println!("auto-detected file I/O backend: {:?}", auto.backend());
        round_trip(&auto, dir.path()).await;
        let std_io = FileIo::start(true);
        assert_eq!(std_io.backend(), &IoBackend::Std("disabled by configuration".into()));
        round_trip(&std_io, dir.path()).await;
    }

    /// Two I/O threads writing one path at once (two replicas storing one
    /// merged slice): every write succeeds and the file is one of them whole.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writers_of_one_path_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slice.f32");
        let (a, b) = (FileIo::start(true), FileIo::start(true));
        let writes: Vec<_> = (0..16u8)
            .map(|i| {
                let io = if i % 2 == 0 { a.clone() } else { b.clone() };
                let path = path.clone();
                tokio::spawn(async move { io.write(&path, vec![i; 1 << 16]).await })
            })
            .collect();
        for w in writes {
            w.await.unwrap().expect("a concurrent write failed");
        }
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len(), 1 << 16);
        assert!(got.iter().all(|&x| x == got[0]), "two writes interleaved");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "a temporary file was left");
    }
}
