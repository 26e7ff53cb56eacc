//! Checkpoints in safetensors, written so that a crash never leaves a
//! half-written checkpoint behind.
//!
//! A run directory holds `ckpt-<step>/` folders (each: `model.safetensors`,
//! `optimizer.safetensors`, `state.json`) and a `LATEST` file naming the
//! newest complete one. A checkpoint is written into a temporary folder,
//! renamed into place, and only then does `LATEST` (itself replaced by an
//! atomic rename) point at it.
//!
//! `model.safetensors` holds only weights, under Hugging Face Llama names
//! with global layer indices, so other tools can read it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};

/// A named f32 tensor to write.
pub struct NamedTensor<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: &'a [f32],
}

fn f32_bytes(x: &[f32]) -> &[u8] {
    #[cfg(not(target_endian = "little"))]
    compile_error!("safetensors stores little-endian data; big-endian hosts need a byte swap here");
    // SAFETY: any f32 bit pattern is valid as bytes; the length covers exactly the slice.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

fn views<'a>(tensors: &'a [NamedTensor]) -> Result<Vec<(String, TensorView<'a>)>> {
    tensors
        .iter()
        .map(|t| {
            let v = TensorView::new(Dtype::F32, t.shape.clone(), f32_bytes(t.data))
                .with_context(|| format!("tensor {} does not match its shape {:?}", t.name, t.shape))?;
            Ok((t.name.clone(), v))
        })
        .collect()
}

pub fn write_safetensors(path: &Path, tensors: &[NamedTensor], metadata: BTreeMap<String, String>) -> Result<()> {
    let meta: HashMap<String, String> = metadata.into_iter().collect();
    safetensors::serialize_to_file(views(tensors)?, Some(meta), path)
        .with_context(|| format!("writing {}", path.display()))
}

/// The safetensors encoding of `tensors`, in memory (for object-store uploads).
pub fn safetensors_bytes(tensors: &[NamedTensor], metadata: BTreeMap<String, String>) -> Result<Vec<u8>> {
    let meta: HashMap<String, String> = metadata.into_iter().collect();
    Ok(safetensors::serialize(views(tensors)?, Some(meta))?)
}

/// All tensors of a safetensors file (f32 only) and its metadata.
pub struct LoadedTensors {
    pub tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
    pub metadata: BTreeMap<String, String>,
}

impl LoadedTensors {
    /// Copies tensor `name` into `dst`, checking its shape.
    pub fn copy_into(&self, name: &str, shape: &[usize], dst: &mut [f32]) -> Result<()> {
        let (s, data) = self.tensors.get(name).with_context(|| format!("checkpoint has no tensor {name}"))?;
        if s != shape || data.len() != dst.len() {
            bail!("tensor {name} has shape {s:?} in the checkpoint, the model expects {shape:?}");
        }
        dst.copy_from_slice(data);
        Ok(())
    }
}

pub fn read_safetensors(path: &Path) -> Result<LoadedTensors> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    parse_safetensors(&bytes).with_context(|| format!("{} is not a usable safetensors file", path.display()))
}

/// Parses safetensors bytes (from a file or the network: a malformed
/// header, out-of-range offsets or a non-F32 tensor is an error).
#[cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]
pub fn parse_safetensors(bytes: &[u8]) -> Result<LoadedTensors> {
    let (_, meta) = SafeTensors::read_metadata(bytes).context("not a safetensors file")?;
    let st = SafeTensors::deserialize(bytes).context("not a safetensors file")?;
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != Dtype::F32 {
            bail!("tensor {name} is {:?}; only F32 is supported", view.dtype());
        }
        let data = view.data().chunks_exact(4).filter_map(|c| c.try_into().ok()).map(f32::from_le_bytes).collect();
        tensors.insert(name, (view.shape().to_vec(), data));
    }
    let metadata = meta.metadata().clone().unwrap_or_default().into_iter().collect();
    Ok(LoadedTensors { tensors, metadata })
}

/// A stage's flat parameter vector as safetensors (Llama names).
pub fn stage_bytes(
    layout: &iota_core::ParamLayout,
    params: &[f32],
    metadata: BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let tensors: Vec<NamedTensor> = layout
        .entries
        .iter()
        .map(|e| NamedTensor { name: e.name.clone(), shape: e.shape.clone(), data: &params[e.range()] })
        .collect();
    safetensors_bytes(&tensors, metadata)
}

/// The flat parameter vector of `layout` from safetensors bytes; every
/// tensor must be present with the right shape.
pub fn stage_params(layout: &iota_core::ParamLayout, bytes: &[u8]) -> Result<Vec<f32>> {
    let t = parse_safetensors(bytes)?;
    let mut out = vec![0.0; layout.total()];
    for e in &layout.entries {
        t.copy_into(&e.name, &e.shape, &mut out[e.range()])?;
    }
    Ok(out)
}

/// Publishes a fully written checkpoint folder `tmp` as `ckpt-<step>` in
/// `run_dir`, points `LATEST` at it, and prunes older checkpoints of this
/// run so that the newest `keep` (counting this one) remain.
///
/// Pruning goes by the step number parsed from each folder name, and only
/// touches checkpoints with a *lower* step than the one just written: a
/// folder with a higher step belongs to another timeline (a run resumed from
/// an earlier checkpoint, or an older run in the same directory) and is left
/// alone, as is anything whose name is not exactly `ckpt-<digits>`.
pub fn publish(run_dir: &Path, tmp: &Path, step: u64, keep: usize) -> Result<PathBuf> {
    let name = format!("ckpt-{step:08}");
    let dst = run_dir.join(&name);
    if dst.exists() {
        // The same step written again (a resumed run re-saving the step it
        // resumed at): the contents are the same training state.
        std::fs::remove_dir_all(&dst).with_context(|| format!("replacing {}", dst.display()))?;
    }
    std::fs::rename(tmp, &dst).with_context(|| format!("moving checkpoint into {}", dst.display()))?;
    let latest_tmp = run_dir.join("LATEST.tmp");
    std::fs::write(&latest_tmp, format!("{name}\n")).context("writing LATEST")?;
    std::fs::rename(&latest_tmp, run_dir.join("LATEST")).context("updating LATEST")?;
    let mut older: Vec<(u64, PathBuf)> = std::fs::read_dir(run_dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let s = checkpoint_step(e.file_name().to_str()?)?;
            (s < step && e.file_type().ok()?.is_dir()).then(|| (s, e.path()))
        })
        .collect();
    older.sort();
    let drop = older.len().saturating_sub(keep.max(1) - 1);
    for (_, p) in older.into_iter().take(drop) {
        std::fs::remove_dir_all(&p).with_context(|| format!("pruning {}", p.display()))?;
    }
    Ok(dst)
}

/// The step of a checkpoint folder named `ckpt-<digits>`.
pub fn checkpoint_step(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("ckpt-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Resolves `--resume PATH`: a checkpoint folder itself, or a run directory
/// whose `LATEST` names one.
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.join("model.safetensors").exists() {
        return Ok(path.to_path_buf());
    }
    let latest = path.join("LATEST");
    let name = std::fs::read_to_string(&latest).with_context(|| {
        format!("{} is neither a checkpoint nor a run directory with a LATEST file", path.display())
    })?;
    let dir = path.join(name.trim());
    if !dir.join("model.safetensors").exists() {
        bail!("{} points at {}, which holds no model.safetensors", latest.display(), dir.display());
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safetensors_round_trip_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.safetensors");
        let a = vec![1.0f32, -2.5, 3.25, 0.0, 7.0, f32::MIN_POSITIVE];
        let b = vec![0.5f32; 4];
        let tensors = vec![
            NamedTensor { name: "x.weight".into(), shape: vec![2, 3], data: &a },
            NamedTensor { name: "y".into(), shape: vec![4], data: &b },
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        write_safetensors(&p, &tensors, meta).unwrap();
        let l = read_safetensors(&p).unwrap();
        assert_eq!(l.metadata["format"], "pt");
        let mut out = vec![0.0; 6];
        l.copy_into("x.weight", &[2, 3], &mut out).unwrap();
        assert_eq!(out, a);
        assert!(l.copy_into("x.weight", &[3, 2], &mut out).is_err());
        assert!(l.copy_into("z", &[1], &mut out[..1]).is_err());
        std::fs::write(&p, b"garbage").unwrap();
        assert!(read_safetensors(&p).is_err());
    }

    #[test]
    fn publish_keeps_latest_and_prunes() {
        let dir = tempfile::tempdir().unwrap();
        for step in [10u64, 20, 30] {
            let tmp = dir.path().join("ckpt.tmp");
            std::fs::create_dir_all(&tmp).unwrap();
            std::fs::write(tmp.join("model.safetensors"), step.to_string()).unwrap();
            publish(dir.path(), &tmp, step, 2).unwrap();
        }
        let got = resolve(dir.path()).unwrap();
        assert!(got.ends_with("ckpt-00000030"));
        assert!(!dir.path().join("ckpt-00000010").exists());
        assert!(dir.path().join("ckpt-00000020").exists());
        assert!(resolve(&dir.path().join("missing")).is_err());
    }

    fn write_ckpt(dir: &Path, step: u64, keep: usize) -> PathBuf {
        let tmp = dir.join(format!("ckpt-{step:08}.tmp"));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join("model.safetensors"), step.to_string()).unwrap();
        publish(dir, &tmp, step, keep).unwrap()
    }

    #[test]
    fn a_restarted_run_keeps_the_checkpoint_it_just_wrote() {
        // An earlier run left steps 200 and 300; a new run in the same
        // directory writes step 10. Sorting names pruned step 10 itself.
        let dir = tempfile::tempdir().unwrap();
        write_ckpt(dir.path(), 200, 2);
        write_ckpt(dir.path(), 300, 2);
        let just = write_ckpt(dir.path(), 10, 2);
        assert!(just.join("model.safetensors").exists(), "the checkpoint just written was pruned");
        assert_eq!(resolve(dir.path()).unwrap(), just);
        // The other timeline's checkpoints are not this run's to prune.
        assert!(dir.path().join("ckpt-00000200").exists());
        assert!(dir.path().join("ckpt-00000300").exists());
        // This run's own older checkpoints are pruned as it goes on.
        write_ckpt(dir.path(), 20, 2);
        write_ckpt(dir.path(), 30, 2);
        assert!(!dir.path().join("ckpt-00000010").exists());
        assert!(dir.path().join("ckpt-00000020").exists());
        assert!(dir.path().join("ckpt-00000030").exists());
    }

    #[test]
    fn pruning_orders_by_step_number_not_by_name() {
        // Steps past the zero padding sort wrongly as names.
        let dir = tempfile::tempdir().unwrap();
        write_ckpt(dir.path(), 99_999_999, 2);
        write_ckpt(dir.path(), 100_000_000, 2);
        let last = write_ckpt(dir.path(), 100_000_001, 2);
        assert!(last.exists());
        assert!(dir.path().join("ckpt-100000000").exists());
        assert!(!dir.path().join("ckpt-99999999").exists());
        // Names that are not exactly ckpt-<digits> are never touched.
        std::fs::create_dir_all(dir.path().join("ckpt-notes")).unwrap();
        std::fs::create_dir_all(dir.path().join("ckpt-00000001.bak")).unwrap();
        write_ckpt(dir.path(), 100_000_002, 1);
        assert!(dir.path().join("ckpt-notes").exists());
        assert!(dir.path().join("ckpt-00000001.bak").exists());
        assert_eq!(checkpoint_step("ckpt-00000042"), Some(42));
        assert_eq!(checkpoint_step("ckpt-"), None);
        assert_eq!(checkpoint_step("ckpt-+1"), None);
    }
}
