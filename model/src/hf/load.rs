//! Opens a model wherever it is kept: an exported Hugging Face folder, a
//! swarm run directory (its `model/` export), or a trainer checkpoint (a
//! `ckpt-N` folder, or a run directory whose `LATEST` names one).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use iota_core::codec::bf16_to_f32;
use iota_core::train_config::TrainConfig;
use safetensors::tensor::{Dtype, SafeTensors};
use serde_json::Value;

use super::config_json::train_config_of;
use super::weights::{ModelWeights, NamedWeights, Provenance};
use crate::checkpoint;

/// The folder a swarm run directory keeps its finished model in.
pub const RUN_MODEL_DIR: &str = "model";

/// Where a model path leads.
#[derive(Debug, PartialEq)]
pub enum ModelSource {
    /// A folder holding `config.json` and safetensors weights.
    HfFolder(PathBuf),
    /// A trainer checkpoint folder (`model.safetensors` and `state.json`).
    Checkpoint(PathBuf),
}

impl ModelSource {
    /// Resolves a path the user gave.
    pub fn resolve(path: &Path) -> Result<ModelSource> {
        if !path.exists() {
            bail!("{} does not exist", path.display());
        }
        if path.join("config.json").is_file() {
            return Ok(ModelSource::HfFolder(path.to_path_buf()));
        }
        if path.join(RUN_MODEL_DIR).join("config.json").is_file() {
            return Ok(ModelSource::HfFolder(path.join(RUN_MODEL_DIR)));
        }
        if path.join("state.json").is_file() || path.join("LATEST").is_file() {
            return Ok(ModelSource::Checkpoint(checkpoint::resolve(path)?));
        }
        bail!(
            "{} holds no model: expected an exported folder (config.json), a swarm run directory (model/config.json) \
             or a trainer checkpoint (state.json, or LATEST in a run directory)",
            path.display()
        )
    }

    pub fn path(&self) -> &Path {
        match self {
            ModelSource::HfFolder(p) | ModelSource::Checkpoint(p) => p,
        }
    }
}

impl ModelWeights {
    /// Loads the model at `path` (see `ModelSource`). Every tensor the run's
    /// layouts name must be present with its shape and finite values.
    pub fn load(path: &Path) -> Result<ModelWeights> {
        let source = ModelSource::resolve(path)?;
        let w = match &source {
            ModelSource::HfFolder(dir) => load_hf(dir),
            ModelSource::Checkpoint(dir) => load_checkpoint(dir),
        }
        .with_context(|| format!("loading the model in {}", source.path().display()))?;
        w.stage_params().with_context(|| format!("the model in {} is incomplete", source.path().display()))?;
        if let Some((name, _)) = w.tensors.iter().find(|(_, t)| t.data.iter().any(|v| !v.is_finite())) {
            bail!("tensor {name} in {} holds a non-finite value", source.path().display());
        }
        Ok(w)
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_slice(&bytes).with_context(|| format!("{} is not valid JSON", path.display()))
}

fn load_hf(dir: &Path) -> Result<ModelWeights> {
    let config = read_json(&dir.join("config.json"))?;
    let train = train_config_of(&config)?;
    let files: Vec<String> = if dir.join("model.safetensors").is_file() {
        vec!["model.safetensors".into()]
    } else if dir.join("model.safetensors.index.json").is_file() {
        let index = read_json(&dir.join("model.safetensors.index.json"))?;
        let map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .context("model.safetensors.index.json has no weight_map")?;
        let mut files: Vec<String> = map.values().filter_map(Value::as_str).map(String::from).collect();
        files.sort();
        files.dedup();
        if let Some(bad) = files.iter().find(|f| f.contains('/') || f.contains('\\') || f.starts_with('.')) {
            bail!("model.safetensors.index.json names {bad:?}, which is not a file in the folder");
        }
        files
    } else {
        bail!("{} has config.json but no model.safetensors or model.safetensors.index.json", dir.display());
    };
    let mut tensors = BTreeMap::new();
    for f in &files {
        let bytes = std::fs::read(dir.join(f)).with_context(|| format!("reading {}", dir.join(f).display()))?;
        read_tensors(&bytes, &mut tensors).with_context(|| format!("{f} is not a usable safetensors file"))?;
    }
    pad_vocab(&train, &mut tensors)?;
    let iota = config.get("iota");
    let provenance = Provenance {
        trained_for: iota.and_then(|i| i.get("trained_for")).and_then(Value::as_str).map(String::from),
        tokens: iota.and_then(|i| i.get("tokens")).and_then(Value::as_u64),
    };
    Ok(ModelWeights { train, tensors, provenance })
}

fn load_checkpoint(dir: &Path) -> Result<ModelWeights> {
    let state = read_json(&dir.join("state.json"))?;
    let train: TrainConfig = serde_json::from_value(state.get("config").cloned().unwrap_or(Value::Null))
        .context("state.json holds no valid trainer configuration")?;
    train.validate()?;
    let bytes = std::fs::read(dir.join("model.safetensors")).context("reading model.safetensors")?;
    let mut tensors = BTreeMap::new();
    read_tensors(&bytes, &mut tensors).context("model.safetensors is not a usable safetensors file")?;
    let step = state.get("step").and_then(Value::as_u64);
    let provenance = Provenance {
        trained_for: step.map(|s| format!("{s} optimizer steps")),
        tokens: step.map(|s| s * train.tokens_per_step() as u64),
    };
    Ok(ModelWeights { train, tensors, provenance })
}

/// Adds every tensor of a safetensors file (F32 or BF16) to `out`.
fn read_tensors(bytes: &[u8], out: &mut BTreeMap<String, NamedWeights>) -> Result<()> {
    let st = SafeTensors::deserialize(bytes).context("not a safetensors file")?;
    for (name, view) in st.tensors() {
        let data: Vec<f32> = match view.dtype() {
            Dtype::F32 => view.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
            Dtype::BF16 => view.data().chunks_exact(2).map(|c| bf16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
            other => bail!("tensor {name} is {other:?}; F32 and BF16 are supported"),
        };
        if out.insert(name.clone(), NamedWeights { shape: view.shape().to_vec(), data }).is_some() {
            bail!("tensor {name} appears twice");
        }
    }
    Ok(())
}

/// Exports hold the tokenizer's rows of the embedding and the head; the
/// stages allocate the padded vocabulary (zero rows: never looked up, and
/// the head's padded logits are masked).
fn pad_vocab(train: &TrainConfig, tensors: &mut BTreeMap<String, NamedWeights>) -> Result<()> {
    let (real, padded, d) = (train.model.vocab_real, train.model.vocab_size, train.model.d_model);
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        let Some(t) = tensors.get_mut(name) else { continue };
        if t.shape == [padded, d] {
            continue;
        }
        if t.shape != [real, d] {
            bail!("tensor {name} has shape {:?}; the model expects [{real}, {d}]", t.shape);
        }
        t.data.resize(padded * d, 0.0);
        t.shape = vec![padded, d];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_says_what_it_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let e = ModelSource::resolve(dir.path()).unwrap_err().to_string();
        assert!(e.contains("holds no model") && e.contains("config.json"), "{e}");
        let e = ModelSource::resolve(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("does not exist"), "{e}");
        std::fs::create_dir_all(dir.path().join("model")).unwrap();
        std::fs::write(dir.path().join("model/config.json"), "{}").unwrap();
        assert_eq!(ModelSource::resolve(dir.path()).unwrap(), ModelSource::HfFolder(dir.path().join("model")));
    }
}
