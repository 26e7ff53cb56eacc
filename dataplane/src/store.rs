//! Object storage for weights (uploads, merged stages, checkpoints).
//!
//! A local directory by default (the local swarm); an S3-compatible store is
//! the production backend and joins this type as another variant. Keys are
//! relative paths (`epoch-000001/stage-002/merged.safetensors`); a key that
//! could escape the root (absolute, `..`, empty segments) is refused.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::fileio::FileIo;

#[derive(Clone)]
pub enum ObjectStore {
    Local { root: PathBuf, io: FileIo },
}

fn bad_key(key: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("invalid object key '{key}'"))
}

impl ObjectStore {
    /// A store in the local directory `root` (created if missing).
    pub fn local(root: impl Into<PathBuf>, io: FileIo) -> io::Result<ObjectStore> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(ObjectStore::Local { root, io })
    }

    fn path(root: &Path, key: &str) -> io::Result<PathBuf> {
        let rel = Path::new(key);
        let segments_ok = key.split('/').all(|s| !s.is_empty() && s != "." && s != "..");
        if !segments_ok || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(bad_key(key));
        }
        Ok(root.join(rel))
    }

    /// Stores `data` under `key`, atomically (readers see all or nothing).
    pub async fn put(&self, key: &str, data: Vec<u8>) -> io::Result<()> {
        match self {
            ObjectStore::Local { root, io } => {
                let p = Self::path(root, key)?;
                if let Some(dir) = p.parent() {
                    std::fs::create_dir_all(dir)?;
                }
                io.write(p, data).await
            }
        }
    }

    pub async fn get(&self, key: &str) -> io::Result<Vec<u8>> {
        match self {
            ObjectStore::Local { root, io } => io.read(Self::path(root, key)?).await,
        }
    }

    /// Keys under `prefix` (a folder-like prefix ending in '/'), sorted.
    pub async fn list(&self, prefix: &str) -> io::Result<Vec<String>> {
        match self {
            ObjectStore::Local { root, .. } => {
                let dir =
                    if prefix.is_empty() { root.clone() } else { Self::path(root, prefix.trim_end_matches('/'))? };
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
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn put_get_list_and_key_rules() {
        let dir = tempfile::tempdir().unwrap();
        let s = ObjectStore::local(dir.path(), FileIo::start(false)).unwrap();
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
