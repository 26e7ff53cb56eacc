//! Writes a model as a Hugging Face Llama folder: `config.json`,
//! `generation_config.json`, the weights (`model.safetensors`, or shards
//! and `model.safetensors.index.json` above a size), the tokenizer files
//! and a short model card.
//!
//! The folder is written beside its destination and renamed into place
//! when complete, so a crash never leaves a half-written model where a
//! finished one is expected; a destination that exists and is not empty
//! is refused (nothing is overwritten).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use iota_core::codec::f32_to_bf16;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;

use super::config_json::{ConfigInputs, config_json, generation_config_json};
use super::tokenizer_files::write_tokenizer_files;
use super::weights::ModelWeights;

/// The element type of the exported weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportDtype {
    F32,
    Bf16,
}

impl ExportDtype {
    pub fn parse(s: &str) -> Option<ExportDtype> {
        match s {
            "f32" | "fp32" | "float32" => Some(ExportDtype::F32),
            "bf16" | "bfloat16" => Some(ExportDtype::Bf16),
            _ => None,
        }
    }
    /// The name `config.json`'s `torch_dtype` uses.
    pub fn torch_name(self) -> &'static str {
        match self {
            ExportDtype::F32 => "float32",
            ExportDtype::Bf16 => "bfloat16",
        }
    }
}

/// Hugging Face's default shard size (`save_pretrained`'s 5 GB).
pub const DEFAULT_MAX_SHARD_BYTES: u64 = 5_000_000_000;

#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub dtype: ExportDtype,
    /// Weights above this many bytes are split into shards.
    pub max_shard_bytes: u64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        ExportOptions { dtype: ExportDtype::F32, max_shard_bytes: DEFAULT_MAX_SHARD_BYTES }
    }
}

/// What an export wrote.
#[derive(Clone, Debug)]
pub struct Exported {
    pub dir: PathBuf,
    /// File names inside `dir`.
    pub files: Vec<String>,
    /// Bytes of weights written.
    pub weight_bytes: u64,
    pub shards: usize,
}

/// One tensor as exported: its Hugging Face name, shape and bytes.
struct OutTensor {
    name: String,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

/// The tensors in model order (embedding, layers, final norm, head), the
/// embedding and head cut to the tokenizer's rows.
fn out_tensors(w: &ModelWeights, dtype: ExportDtype) -> Result<Vec<OutTensor>> {
    let vocab_real = w.train.model.vocab_real;
    let mut out = Vec::new();
    for layout in w.layouts()? {
        for e in &layout.entries {
            let t = w.get(&e.name)?;
            let (shape, values) = if e.name == "model.embed_tokens.weight" || e.name == "lm_head.weight" {
                let d = e.shape[1];
                (vec![vocab_real, d], &t.data[..vocab_real * d])
            } else {
                (e.shape.clone(), &t.data[..])
            };
            let bytes = match dtype {
                ExportDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                ExportDtype::Bf16 => values.iter().flat_map(|v| f32_to_bf16(*v).to_le_bytes()).collect(),
            };
            out.push(OutTensor { name: e.name.clone(), shape, bytes });
        }
    }
    Ok(out)
}

/// Refuses a destination that exists and holds anything.
pub fn check_destination(dir: &Path) -> Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "{} already exists and is not empty; export into a new folder (nothing was written)",
                    dir.display()
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            bail!("{} is a file, not a folder; nothing was written", dir.display())
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
    }
}

/// Writes `w` into the new folder `dir`. `progress(done, total)` is called
/// as weight bytes are written.
pub fn export(
    w: &ModelWeights,
    dir: &Path,
    opts: &ExportOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Exported> {
    check_destination(dir)?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let tmp = parent.join(format!(".{name}.partial-{}-{stamp}", std::process::id()));
    std::fs::create_dir(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let written = write_folder(w, &tmp, opts, progress);
    let (files, weight_bytes, shards) = match written {
        Ok(x) => x,
        Err(e) => {
            // Our own partial folder, never the user's: safe to remove.
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    };
    // The destination may have appeared (empty) meanwhile: re-check, then
    // move the finished folder into place.
    check_destination(dir)?;
    if dir.exists() {
        std::fs::remove_dir(dir).with_context(|| format!("replacing the empty folder {}", dir.display()))?;
    }
    std::fs::rename(&tmp, dir).with_context(|| format!("moving the export into {}", dir.display()))?;
    Ok(Exported { dir: dir.to_path_buf(), files, weight_bytes, shards })
}

fn write_folder(
    w: &ModelWeights,
    dir: &Path,
    opts: &ExportOptions,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(Vec<String>, u64, usize)> {
    let tensors = out_tensors(w, opts.dtype)?;
    let total: u64 = tensors.iter().map(|t| t.bytes.len() as u64).sum();
    // Greedy shards in model order; a tensor larger than the limit gets a
    // shard of its own.
    let mut shards: Vec<Vec<&OutTensor>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in &tensors {
        let n = t.bytes.len() as u64;
        if size > 0 && size + n > opts.max_shard_bytes {
            shards.push(Vec::new());
            size = 0;
        }
        shards.last_mut().expect("at least one shard").push(t);
        size += n;
    }
    let count = shards.len();
    let dtype = match opts.dtype {
        ExportDtype::F32 => Dtype::F32,
        ExportDtype::Bf16 => Dtype::BF16,
    };
    let mut files = Vec::new();
    let mut weight_map = BTreeMap::new();
    let mut done = 0u64;
    progress(0, total);
    for (i, shard) in shards.iter().enumerate() {
        let file = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", i + 1)
        };
        let views = shard
            .iter()
            .map(|t| {
                let v = TensorView::new(dtype, t.shape.clone(), &t.bytes)
                    .with_context(|| format!("tensor {} does not match its shape", t.name))?;
                Ok((t.name.clone(), v))
            })
            .collect::<Result<Vec<_>>>()?;
        // transformers reads safetensors whose metadata says "pt".
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), &dir.join(&file))
            .with_context(|| format!("writing {}", dir.join(&file).display()))?;
        for t in shard {
            weight_map.insert(t.name.clone(), file.clone());
            done += t.bytes.len() as u64;
        }
        progress(done, total);
        files.push(file);
    }
    if count > 1 {
        let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
        write_json(dir, "model.safetensors.index.json", &index)?;
        files.push("model.safetensors.index.json".into());
    }
    let boundary_layers = w.boundary_layers()?;
    let config = config_json(&ConfigInputs {
        train: &w.train,
        boundary_layers: &boundary_layers,
        torch_dtype: opts.dtype.torch_name(),
        trained_for: w.provenance.trained_for.as_deref(),
        tokens: w.provenance.tokens,
    });
    write_json(dir, "config.json", &config)?;
    write_json(dir, "generation_config.json", &generation_config_json(&w.train))?;
    files.push("config.json".into());
    files.push("generation_config.json".into());
    for p in write_tokenizer_files(dir, w.train.tokenizer, w.train.model.max_seq)? {
        if let Some(n) = p.file_name().and_then(|n| n.to_str()) {
            files.push(n.to_string());
        }
    }
    std::fs::write(dir.join("README.md"), model_card(w, &boundary_layers)).context("writing README.md")?;
    files.push("README.md".into());
    Ok((files, total, count))
}

fn write_json(dir: &Path, name: &str, v: &serde_json::Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(v)?;
    text.push('\n');
    std::fs::write(dir.join(name), text).with_context(|| format!("writing {}", dir.join(name).display()))
}

/// The folder's README: what the model is and how to load it, including
/// the bottleneck note a plain Llama loader needs.
fn model_card(w: &ModelWeights, boundary_layers: &[usize]) -> String {
    let m = &w.train.model;
    let mut s = format!(
        "# {} (iota-rs)\n\nA Llama-architecture language model trained by iota-rs: {} layers, d_model {}, {} heads ({} KV heads), \
         FFN {}, context {}, {} tokenizer, {:.1}M parameters.\n",
        m.name,
        m.n_layers,
        m.d_model,
        m.n_heads,
        m.n_kv_heads,
        m.ffn_hidden,
        m.max_seq,
        w.train.tokenizer.name(),
        w.param_count() as f64 / 1e6
    );
    if let Some(t) = &w.provenance.trained_for {
        s.push_str(&format!("Trained for {t}"));
        if let Some(n) = w.provenance.tokens {
            s.push_str(&format!(" ({n} tokens)"));
        }
        s.push_str(".\n");
    }
    s.push_str(
        "\nSample from it with `iota generate --model THIS_FOLDER --prompt \"...\"`; measure it with `iota eval`.\n",
    );
    if w.has_bottleneck() {
        s.push_str(&format!(
            "\n## The bottleneck: this is not a plain Llama\n\n\
             The model was trained as {} pipeline stages with a {}-channel bottleneck between them. \
             After layer i in {:?} the residual h is compressed to z = h[:{b}] + (rmsnorm(h) * \
             `model.layers.i.bottleneck.norm.weight`) @ `model.layers.i.bottleneck.down_proj.weight`^T \
             and, before layer i+1, expanded to pad(z) + z @ `model.layers.(i+1).bottleneck.up_proj.weight`^T \
             (pad puts z's {b} channels first and zeros after). In training z also crossed the wire in the {} codec \
             (`iota generate` and `iota eval` do the same unless `--boundary-codec none`).\n\n\
             `transformers`' `LlamaForCausalLM` loads the folder but ignores these tensors (it warns about unused \
             weights), which gives a different and much worse model. Use `iota generate`, or apply the two steps \
             above in a forward hook; `tests/python/llama_reference.py` in the iota-rs repository is a complete \
             reference forward that does.\n",
            w.train.stages,
            m.bottleneck,
            boundary_layers,
            w.train.codec.name(),
            b = m.bottleneck,
        ));
        if m.bottleneck_style == iota_core::BottleneckStyle::Residual {
            s.push_str(
                "\nThe bottleneck is the residual style (`bottleneck_style: residual`): each step above also adds a \
                 SwiGLU branch, swiglu(x; p) = (silu(x @ `p.gate_proj.weight`^T) * (x @ `p.up_proj.weight`^T)) \
                 @ `p.down_proj.weight`^T. The encoder adds swiglu(hn; `model.layers.i.bottleneck.encoder_mlp`) to z, \
                 with hn the normalised h above; the decoder adds swiglu(z; \
                 `model.layers.(i+1).bottleneck.decoder_mlp`) to the expanded residual.\n",
            );
        }
    } else {
        s.push_str(
            "\nIt loads in `transformers` without custom code: \
             `AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)`.\n",
        );
        if w.train.stages > 1 {
            s.push_str(&format!(
                "(In training the residual crossed {} stage boundaries in the {} codec; a plain Llama forward \
                 skips that quantisation, a small difference.)\n",
                w.train.stages - 1,
                w.train.codec.name()
            ));
        }
    }
    s
}
