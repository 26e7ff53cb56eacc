//! Run directories know which run they hold.
//!
//! A run directory keeps the settings its run started with in `run.json`.
//! Starting a run in a directory that holds another one (different settings,
//! or files of a run whose settings are unknown) is an error naming what
//! differs; `--new-run` moves the old run's files into `archive-<n>/` inside
//! the directory, says so, and starts afresh. Nothing is ever deleted.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// The file holding a run directory's settings.
pub const SETTINGS_FILE: &str = "run.json";

/// What `claim` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The directory held no run; `run.json` now holds these settings.
    Fresh,
    /// The directory holds a run with exactly these settings.
    Same,
    /// `--new-run`: the previous run's files were moved into this folder.
    Archived(PathBuf),
}

/// Makes `dir` hold the run described by `settings`.
///
/// `run_files` are the names (direct children of `dir`) that belong to a run
/// (state databases, checkpoints, logs); `run.json` always does. With
/// `new_run`, an existing run is archived first; without it, a run with
/// other settings, or run files without a `run.json`, are an error.
pub fn claim(dir: &Path, settings: &Value, run_files: &[&str], new_run: bool) -> Result<Claim> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(SETTINGS_FILE);
    let present: Vec<String> = present_run_files(dir, run_files)?;
    let old = match std::fs::read(&path) {
        Ok(bytes) => Some(
            serde_json::from_slice::<Value>(&bytes)
                .with_context(|| format!("{} is not valid JSON; move it away or pass --new-run", path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if new_run && !present.is_empty() {
        let to = archive(dir, &present)?;
        write_settings(&path, settings)?;
        return Ok(Claim::Archived(to));
    }
    match old {
        Some(old) if &old == settings => Ok(Claim::Same),
        Some(old) => {
            let diffs = differences(&old, settings);
            bail!(
                "{} holds another run; its settings differ:\n  {}\nuse another directory, or pass --new-run to move the old run's files into {}/archive-N and start this one there",
                dir.display(),
                diffs.join("\n  "),
                dir.display()
            )
        }
        None if !present.is_empty() => bail!(
            "{} holds files of a run whose settings are unknown ({}); use another directory, or pass --new-run to move them into {}/archive-N and start there",
            dir.display(),
            present.join(", "),
            dir.display()
        ),
        None => {
            write_settings(&path, settings)?;
            Ok(Claim::Fresh)
        }
    }
}

/// The settings a run directory holds, if any.
pub fn read_settings(dir: &Path) -> Result<Option<Value>> {
    let path = dir.join(SETTINGS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            Ok(Some(serde_json::from_slice(&bytes).with_context(|| format!("{} is not valid JSON", path.display()))?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn write_settings(path: &Path, settings: &Value) -> Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(settings)?).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// Direct children of `dir` that belong to a run: `run.json` and every
/// name in `run_files` (a trailing `*` matches a prefix, as in `ckpt-*`).
fn present_run_files(dir: &Path, run_files: &[&str]) -> Result<Vec<String>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    let mut out = Vec::new();
    for e in rd {
        let name = e?.file_name().to_string_lossy().into_owned();
        let matches = name == SETTINGS_FILE
            || run_files.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == *p,
            });
        if matches {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Moves `names` (children of `dir`) into a new `dir/archive-<n>/`.
fn archive(dir: &Path, names: &[String]) -> Result<PathBuf> {
    let to =
        (1u32..).map(|n| dir.join(format!("archive-{n}"))).find(|p| !p.exists()).expect("some archive number is free");
    std::fs::create_dir(&to).with_context(|| format!("creating {}", to.display()))?;
    for n in names {
        std::fs::rename(dir.join(n), to.join(n))
            .with_context(|| format!("moving {} into {}", dir.join(n).display(), to.display()))?;
    }
    Ok(to)
}

/// Every leaf that differs between two settings trees, as
/// `path: old -> new` (`path` in dotted form, `(absent)` for a missing key).
pub fn differences(old: &Value, new: &Value) -> Vec<String> {
    let mut out = Vec::new();
    diff_into("", old, new, &mut out);
    out
}

fn diff_into(path: &str, old: &Value, new: &Value, out: &mut Vec<String>) {
    let child = |k: &str| if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            let absent = Value::String("(absent)".into());
            for k in keys {
                diff_into(&child(k), a.get(k).unwrap_or(&absent), b.get(k).unwrap_or(&absent), out);
            }
        }
        (a, b) if a != b => {
            let show = |v: &Value| {
                let s = v.to_string();
                if s.chars().count() > 80 { format!("{}...", s.chars().take(77).collect::<String>()) } else { s }
            };
            out.push(format!("{}: {} -> {}", if path.is_empty() { "(settings)" } else { path }, show(a), show(b)));
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn fresh_same_and_different_runs() {
        let dir = tempfile::tempdir().unwrap();
        let a = json!({"model": {"name": "tiny", "layers": 2}, "lr": 0.002, "data": null});
        assert_eq!(claim(dir.path(), &a, &["state.sqlite"], false).unwrap(), Claim::Fresh);
        assert_eq!(claim(dir.path(), &a, &["state.sqlite"], false).unwrap(), Claim::Same);
        let b = json!({"model": {"name": "small", "layers": 2}, "lr": 0.001, "data": "kjv.txt"});
        let err = claim(dir.path(), &b, &["state.sqlite"], false).unwrap_err().to_string();
        for want in
            ["model.name: \"tiny\" -> \"small\"", "lr: 0.002 -> 0.001", "data: null -> \"kjv.txt\"", "--new-run"]
        {
            assert!(err.contains(want), "{want} missing from: {err}");
        }
        assert!(!err.contains("layers"), "{err}");
        // The refusal changed nothing.
        assert_eq!(read_settings(dir.path()).unwrap().unwrap(), a);
    }

    #[test]
    fn new_run_archives_and_never_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let a = json!({"seed": 1});
        claim(dir.path(), &a, &["state.sqlite", "ckpt-*"], false).unwrap();
        std::fs::write(dir.path().join("state.sqlite"), b"old state").unwrap();
        std::fs::create_dir(dir.path().join("ckpt-00000010")).unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"the user's").unwrap();
        let b = json!({"seed": 2});
        let Claim::Archived(to) = claim(dir.path(), &b, &["state.sqlite", "ckpt-*"], true).unwrap() else {
            panic!("expected an archive")
        };
        assert_eq!(std::fs::read(to.join("state.sqlite")).unwrap(), b"old state");
        assert!(to.join("ckpt-00000010").is_dir());
        assert_eq!(read_settings(&to).unwrap().unwrap(), a);
        assert_eq!(read_settings(dir.path()).unwrap().unwrap(), b);
        // Files that are not the run's stay where they are.
        assert!(dir.path().join("notes.txt").exists());
        assert!(!dir.path().join("state.sqlite").exists());
        // A second --new-run takes the next archive number.
        let Claim::Archived(to2) = claim(dir.path(), &a, &["state.sqlite"], true).unwrap() else { panic!() };
        assert_ne!(to, to2);
        assert!(to.exists() && to2.exists());
    }

    #[test]
    fn run_files_without_settings_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("state.sqlite"), b"from an older version").unwrap();
        let err = claim(dir.path(), &json!({"seed": 1}), &["state.sqlite"], false).unwrap_err().to_string();
        assert!(err.contains("state.sqlite") && err.contains("--new-run"), "{err}");
        assert!(read_settings(dir.path()).unwrap().is_none());
        // Unrelated files do not make a directory "hold a run".
        let other = tempfile::tempdir().unwrap();
        std::fs::write(other.path().join("README"), b"x").unwrap();
        assert_eq!(claim(other.path(), &json!({"seed": 1}), &["state.sqlite"], false).unwrap(), Claim::Fresh);
    }
}
