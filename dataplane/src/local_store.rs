//! The object store in a local directory: the default for a swarm on one
//! machine. Writes go through the file I/O thread (`fileio`), atomically;
//! keys are checked by `iota_protocol::object_store::check_key` so none
//! can escape the root.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use iota_protocol::object_store::{ObjectStore, SharedStore, StoreFuture, check_key};

use crate::fileio::FileIo;

pub struct LocalDirStore {
    root: PathBuf,
    io: FileIo,
}

impl LocalDirStore {
    /// A store in the local directory `root` (created if missing).
    pub fn open(root: impl Into<PathBuf>, io: FileIo) -> io::Result<LocalDirStore> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(LocalDirStore { root, io })
    }

    /// `open`, shared.
    pub fn shared(root: impl Into<PathBuf>, io: FileIo) -> io::Result<SharedStore> {
        Ok(Arc::new(Self::open(root, io)?))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path(&self, key: &str) -> io::Result<PathBuf> {
        check_key(key)?;
        Ok(self.root.join(key))
    }
}

impl ObjectStore for LocalDirStore {
    fn put<'a>(&'a self, key: &'a str, data: Vec<u8>) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let p = self.path(key)?;
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir)?;
            }
            self.io.write(p, data).await
        })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Vec<u8>> {
        Box::pin(async move { self.io.read(self.path(key)?).await })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> StoreFuture<'a, Vec<String>> {
        Box::pin(async move {
            let dir = if prefix.is_empty() { self.root.clone() } else { self.path(prefix.trim_end_matches('/'))? };
            let mut keys = Vec::new();
            let rd = match std::fs::read_dir(&dir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(keys),
                Err(e) => return Err(e),
            };
            for e in rd {
                let e = e?;
                let name = e.file_name().to_string_lossy().into_owned();
                if e.file_type()?.is_file() && !name.ends_with(".tmp") {
                    keys.push(format!("{prefix}{name}"));
                }
            }
            keys.sort();
            Ok(keys)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_get_list_and_key_rules() {
        let dir = tempfile::tempdir().unwrap();
        let s = LocalDirStore::shared(dir.path(), FileIo::start(false)).unwrap();
        s.put("e1/stage-000/a.st", vec![1, 2]).await.unwrap();
        s.put("e1/stage-000/b.st", vec![3]).await.unwrap();
        assert_eq!(s.get("e1/stage-000/a.st").await.unwrap(), vec![1, 2]);
        assert_eq!(s.list("e1/stage-000/").await.unwrap(), vec!["e1/stage-000/a.st", "e1/stage-000/b.st"]);
        assert!(s.list("nothing/").await.unwrap().is_empty());
        for k in ["", "/etc/passwd", "../x", "a/../../x", "a//b"] {
            assert!(s.put(k, vec![]).await.is_err(), "{k}");
        }
        assert!(s.get("e1/missing").await.is_err());
    }
}
