//! Identity files: the 32-byte secret seed as 64 hex characters, created
//! with owner-only permissions when missing. The secret is never logged.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use iota_core::Identity;

/// Loads the identity at `path`, or creates a new one there.
pub fn load_or_create(path: &Path) -> Result<Identity> {
    if path.exists() {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading identity {}", path.display()))?;
        let hex = text.trim();
        if hex.len() != 64 {
            bail!("{} is not an identity file (expected 64 hex characters)", path.display());
        }
        let mut seed = [0u8; 32];
        for (i, b) in seed.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                .with_context(|| format!("{} is not an identity file (bad hex)", path.display()))?;
        }
        return Ok(Identity::from_seed(seed));
    }
    let id = Identity::generate();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).with_context(|| format!("creating identity {}", path.display()))?;
    let hex: String = id.seed().iter().map(|b| format!("{b:02x}")).collect();
    writeln!(f, "{hex}")?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_load_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("keys/miner.key");
        let a = load_or_create(&p).unwrap();
        let b = load_or_create(&p).unwrap();
        assert_eq!(a.peer_id(), b.peer_id());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(&p, "nothex").unwrap();
        assert!(load_or_create(&p).is_err());
    }
}
