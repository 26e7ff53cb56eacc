//! `config.json` and `generation_config.json` of an exported model: the
//! Hugging Face Llama fields, plus an `iota` object with what a plain Llama
//! has no field for (the stage split, the bottleneck, the wire codec, the
//! tokenizer and the run's training settings).

use anyhow::{Context, Result, bail};
use iota_core::train_config::{LrSchedule, TokenizerKind, TrainConfig};
use iota_core::{ModelConfig, RopeScaling, WireCodec};
use serde_json::{Value, json};

/// The version of the `iota` object this code writes and reads.
pub const IOTA_FORMAT: u64 = 1;

/// What `config.json` records beside the model's shape.
pub struct ConfigInputs<'a> {
    pub train: &'a TrainConfig,
    pub boundary_layers: &'a [usize],
    pub torch_dtype: &'a str,
    pub trained_for: Option<&'a str>,
    pub tokens: Option<u64>,
}

/// The end-of-text token, the one generation stops at.
pub fn eos_token(kind: TokenizerKind) -> Option<u32> {
    match kind {
        TokenizerKind::Gpt2 => Some(50256),
        TokenizerKind::Byte => None,
    }
}

/// `config.json`. `vocab_size` is the tokenizer's (the padded rows the
/// trainer allocates for fast GEMMs are not exported: a plain Llama would
/// give them probability, ours masks them).
pub fn config_json(c: &ConfigInputs) -> Value {
    let m = &c.train.model;
    let bottleneck = if c.train.stages > 1 { m.bottleneck } else { 0 };
    let rope_scaling = m.rope_scaling.map(|s| {
        json!({
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position,
        })
    });
    let eos = eos_token(c.train.tokenizer);
    let mut v = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": m.d_model,
        "intermediate_size": m.ffn_hidden,
        "num_hidden_layers": m.n_layers,
        "num_attention_heads": m.n_heads,
        "num_key_value_heads": m.n_kv_heads,
        "head_dim": m.head_dim(),
        "vocab_size": m.vocab_real,
        "max_position_embeddings": m.max_seq,
        "rms_norm_eps": m.norm_eps,
        "rope_theta": m.rope_theta,
        "rope_scaling": rope_scaling,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "attention_dropout": 0.0,
        "tie_word_embeddings": false,
        "initializer_range": m.init_std,
        "bos_token_id": eos,
        "eos_token_id": eos,
        "torch_dtype": c.torch_dtype,
        "use_cache": true,
        "iota": {
            "format": IOTA_FORMAT,
            "preset": m.name,
            "stages": c.train.stages,
            "bottleneck": bottleneck,
            "boundary_layers": c.boundary_layers,
            "wire_codec": c.train.codec.name(),
            "tokenizer": c.train.tokenizer.name(),
            "vocab_padded": m.vocab_size,
            "trained_for": c.trained_for,
            "tokens": c.tokens,
            "train_config": c.train,
        },
    });
    // Only when not the default, so the linear style's config.json is as before.
    if bottleneck > 0 && !m.bottleneck_style.is_linear() {
        v["iota"]["bottleneck_style"] = m.bottleneck_style.name().into();
    }
    v
}

/// `generation_config.json`: the sampling defaults `iota generate` uses too.
pub fn generation_config_json(train: &TrainConfig) -> Value {
    let eos = eos_token(train.tokenizer);
    json!({
        "bos_token_id": eos,
        "eos_token_id": eos,
        "do_sample": true,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.95,
    })
}

/// The training settings a `config.json` describes: its `iota` object's
/// `train_config` when present (our exports), else a one-stage run built
/// from the plain Llama fields (a Llama folder from elsewhere, whose
/// tokenizer must be one of ours: GPT-2's 50257 ids or 256 bytes).
pub fn train_config_of(config: &Value) -> Result<TrainConfig> {
    if config.get("model_type").and_then(Value::as_str) != Some("llama") {
        bail!("config.json is not a Llama model's (model_type is not \"llama\")");
    }
    if let Some(iota) = config.get("iota") {
        let format = iota.get("format").and_then(Value::as_u64).unwrap_or(0);
        if format != IOTA_FORMAT {
            bail!("config.json's iota section has format {format}; this build reads format {IOTA_FORMAT}");
        }
        let t: TrainConfig = serde_json::from_value(iota.get("train_config").cloned().unwrap_or(Value::Null))
            .context("config.json's iota.train_config is not a valid training configuration")?;
        t.validate()?;
        return Ok(t);
    }
    let n = |k: &str| -> Result<usize> {
        config
            .get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .with_context(|| format!("config.json has no integer {k}"))
    };
    let f = |k: &str, default: f64| config.get(k).and_then(Value::as_f64).unwrap_or(default) as f32;
    let vocab = n("vocab_size")?;
    let tokenizer =
        [TokenizerKind::Gpt2, TokenizerKind::Byte].into_iter().find(|k| k.vocab_real() == vocab).with_context(
            || format!("vocab_size {vocab} is neither GPT-2's (50257) nor bytes (256): no tokenizer for it"),
        )?;
    let (d, heads) = (n("hidden_size")?, n("num_attention_heads")?);
    if let Some(hd) = config.get("head_dim").and_then(Value::as_u64)
        && hd as usize * heads != d
    {
        bail!("head_dim {hd} x {heads} heads is not hidden_size {d}; only head_dim = hidden_size / heads is supported");
    }
    for k in ["attention_bias", "mlp_bias", "tie_word_embeddings"] {
        if config.get(k).and_then(Value::as_bool) == Some(true) {
            bail!("config.json sets {k}; this implementation has no biases and untied embeddings");
        }
    }
    let rope_scaling = match config.get("rope_scaling") {
        None | Some(Value::Null) => None,
        Some(s) if s.get("rope_type").and_then(Value::as_str) == Some("llama3") => Some(RopeScaling {
            factor: s.get("factor").and_then(Value::as_f64).unwrap_or(1.0) as f32,
            low_freq_factor: s.get("low_freq_factor").and_then(Value::as_f64).unwrap_or(1.0) as f32,
            high_freq_factor: s.get("high_freq_factor").and_then(Value::as_f64).unwrap_or(4.0) as f32,
            original_max_position: s.get("original_max_position_embeddings").and_then(Value::as_u64).unwrap_or(8192)
                as usize,
        }),
        Some(other) => bail!("unsupported rope_scaling {other}"),
    };
    let model = ModelConfig {
        name: "llama".into(),
        vocab_size: vocab,
        vocab_real: vocab,
        d_model: d,
        n_layers: n("num_hidden_layers")?,
        n_heads: heads,
        n_kv_heads: config.get("num_key_value_heads").and_then(Value::as_u64).map_or(heads, |v| v as usize),
        ffn_hidden: n("intermediate_size")?,
        max_seq: n("max_position_embeddings")?,
        rope_theta: f("rope_theta", 10_000.0),
        rope_scaling,
        norm_eps: f("rms_norm_eps", 1e-5),
        bottleneck: 0,
        init_std: f("initializer_range", 0.02),
        bottleneck_style: Default::default(),
        stage_layers: None,
    };
    model.validate()?;
    let seq = model.max_seq.min(128);
    let t = TrainConfig {
        model,
        tokenizer,
        stages: 1,
        batch: 8,
        seq,
        grad_accum: 1,
        steps: 0,
        schedule: LrSchedule { peak: 1e-3, warmup: 1, total: 1, min_ratio: 0.1 },
        adamw: Default::default(),
        codec: WireCodec::F32,
        seed: 0,
    };
    t.validate()?;
    Ok(t)
}
