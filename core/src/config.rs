//! Model configuration and the named presets.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;

/// Llama-3 style RoPE frequency scaling (long-context extension): low
/// frequencies are divided by `factor`, high ones kept, and a smooth ramp
/// joins the two bands.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: usize,
}

/// A decoder-only Llama-style transformer: RMSNorm, RoPE, grouped-query
/// attention, SwiGLU MLP, no biases, untied embedding and LM head (the two
/// live on different pipeline stages, so they cannot be tied).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    /// Rows of the embedding and LM head. May exceed the tokenizer's vocabulary
    /// (padded to a multiple of 64 for fast GEMMs); padded logits are masked.
    pub vocab_size: usize,
    /// Tokens the tokenizer can actually emit (<= vocab_size).
    pub vocab_real: usize,
    pub d_model: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub ffn_hidden: usize,
    pub max_seq: usize,
    pub rope_theta: f32,
    pub rope_scaling: Option<RopeScaling>,
    pub norm_eps: f32,
    /// Channels that cross a stage boundary (0 = no bottleneck: the full
    /// d-wide residual crosses).
    pub bottleneck: usize,
    pub init_std: f32,
    /// How the bottleneck encodes and decodes (docs/ARCHITECTURE.md, "The
    /// bottleneck"). Left out of saved settings when it is the default
    /// (`linear`), so existing configs keep their serialized form and runs
    /// their id.
    #[serde(default, skip_serializing_if = "BottleneckStyle::is_linear")]
    pub bottleneck_style: BottleneckStyle,
    /// Blocks per pipeline stage, head first, when the layers are not cut
    /// evenly (`--stage-layers`): a pipeline runs at its slowest stage's
    /// pace, and the tail also computes the LM head, so a split by cost
    /// gives the tail fewer blocks. Applies to a split into exactly this
    /// many stages; any other count (one process: one stage) splits
    /// evenly. Left out of saved settings when unset, so existing configs
    /// keep their serialized form and runs their id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_layers: Option<Vec<usize>>,
}

/// The blocks of a split in all (None where the count overflows: the
/// split may come from the network).
pub fn checked_total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |a, &n| a.checked_add(n))
}

/// The shape of the encoder/decoder pair at a stage boundary. Both keep an
/// identity path on the first `b` residual channels; they differ in what is
/// learned around it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BottleneckStyle {
    /// `z = h[:, :b] + rmsnorm(h) @ W_down^T`, `h0 = pad(z) + z @ W_up^T`.
    #[default]
    Linear,
    /// Residual encoder and decoder in the manner of ResBM (Aboudib et al.,
    /// arXiv 2604.11947): the linear pair above plus a SwiGLU branch on each
    /// side, `bottleneck_hidden()` wide:
    /// `z = h[:, :b] + hn @ W_down^T + swiglu(hn @ W_eg^T, hn @ W_eu^T) @ W_eo^T`
    /// with `hn = rmsnorm(h)`, and
    /// `h0 = pad(z) + z @ W_up^T + swiglu(z @ W_dg^T, z @ W_du^T) @ W_do^T`.
    /// The decoder's branch can lift the b numbers onto a curved surface in
    /// d-space, which the next block's RMSNorm does not flatten the way it
    /// flattens a linear lift of 1 or 2 channels. Measured on `small` over
    /// 5 seeds it is within noise of the linear style at 21x to 128x
    /// (docs/BENCHMARKS.md, "Bottleneck quality at equal tokens").
    Residual,
}

impl BottleneckStyle {
    pub fn is_linear(&self) -> bool {
        *self == BottleneckStyle::Linear
    }

    pub fn name(&self) -> &'static str {
        match self {
            BottleneckStyle::Linear => "linear",
            BottleneckStyle::Residual => "residual",
        }
    }

    pub fn parse(s: &str) -> Option<BottleneckStyle> {
        match s {
            "linear" => Some(BottleneckStyle::Linear),
            "residual" | "resbm" => Some(BottleneckStyle::Residual),
            _ => None,
        }
    }
}

/// The presets, in size order.
/// The largest model this build accepts, per dimension (d_model, n_layers,
/// n_heads, ffn_hidden, vocab_size, max_seq): far above every preset
/// (`15b`: d 5120, 50 layers, 40 heads, ffn 13824, vocab 128k, seq 4096)
/// and low enough that the byte counts of a micro-batch within the
/// training limits (`MAX_TOKENS_PER_MICRO_BATCH`, `MAX_TRAIN_SEQ`:
/// attention scores batch x heads x seq^2, logits tokens x vocab) held 256
/// times still fit a u64. `max_seq` only bounds positions (nothing is
/// allocated by it), so imported models with long contexts still load.
pub const MAX_DIMS: [(&str, usize); 6] = [
    ("d_model", 1 << 16),
    ("n_layers", 1 << 10),
    ("n_heads", 1 << 10),
    ("ffn_hidden", 1 << 18),
    ("vocab_size", 1 << 22),
    ("max_seq", 1 << 24),
];

pub const PRESETS: &[&str] = &["tiny", "small", "125m", "1b", "1.5b", "15b"];

/// GPT-2 BPE vocabulary (r50k) and its padded size.
pub const GPT2_VOCAB: usize = 50257;
pub const GPT2_VOCAB_PADDED: usize = 50304;
/// Llama-3 tokenizer vocabulary, used by the presets that mirror IOTA's run.
pub const LLAMA3_VOCAB: usize = 128256;

const LLAMA3_ROPE: RopeScaling =
    RopeScaling { factor: 32.0, low_freq_factor: 1.0, high_freq_factor: 4.0, original_max_position: 8192 };

impl ModelConfig {
    /// Looks up a named preset.
    pub fn preset(name: &str) -> Result<ModelConfig, ConfigError> {
        #[allow(clippy::too_many_arguments)]
        fn mk(
            name: &str,
            vocab: (usize, usize),
            d: usize,
            layers: usize,
            heads: usize,
            kv: usize,
            ffn: usize,
            seq: usize,
            bottleneck: usize,
            theta: f32,
            scaling: Option<RopeScaling>,
        ) -> ModelConfig {
            ModelConfig {
                name: name.to_string(),
                vocab_size: vocab.0,
                vocab_real: vocab.1,
                d_model: d,
                n_layers: layers,
                n_heads: heads,
                n_kv_heads: kv,
                ffn_hidden: ffn,
                max_seq: seq,
                rope_theta: theta,
                rope_scaling: scaling,
                norm_eps: 1e-5,
                bottleneck,
                init_std: 0.02,
                bottleneck_style: BottleneckStyle::Linear,
                stage_layers: None,
            }
        }
        let gpt2 = (GPT2_VOCAB_PADDED, GPT2_VOCAB);
        let llama3 = (LLAMA3_VOCAB, LLAMA3_VOCAB);
        let c = match name {
            // Byte-level vocabulary: trains in seconds on generated data.
            "tiny" => mk("tiny", (256, 256), 64, 4, 4, 2, 192, 64, 16, 10_000.0, None),
            // ~22M parameters, most of them the GPT-2 embedding and LM head.
            "small" => mk("small", gpt2, 192, 6, 6, 2, 512, 256, 16, 10_000.0, None),
            "125m" => mk("125m", gpt2, 768, 8, 12, 4, 2048, 1024, 16, 10_000.0, None),
            "1b" => mk("1b", gpt2, 2048, 16, 16, 8, 5632, 2048, 32, 500_000.0, Some(LLAMA3_ROPE)),
            // IOTA's run: d=2048, 16 layers, 32 heads, 8 KV groups, ffn 8192, bottleneck 32.
            "1.5b" => mk("1.5b", llama3, 2048, 16, 32, 8, 8192, 2048, 32, 500_000.0, Some(LLAMA3_ROPE)),
            "15b" => mk("15b", llama3, 5120, 50, 40, 8, 13824, 4096, 80, 500_000.0, Some(LLAMA3_ROPE)),
            other => {
                return Err(ConfigError::UnknownPreset(other.to_string(), PRESETS.join(", ")));
            }
        };
        c.validate()?;
        Ok(c)
    }

    /// Width of the residual bottleneck's SwiGLU branches (encoder and
    /// decoder): d_model, so a boundary adds about a quarter of a block's
    /// weights at `small`'s and IOTA's shapes.
    pub fn bottleneck_hidden(&self) -> usize {
        self.d_model
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }

    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim()
    }

    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim()
    }

    /// Width of the fused q|k|v projection output.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }

    /// Checks the invariants the kernels rely on, and the bounds
    /// (`MAX_DIMS`) that keep every size computed from a configuration a
    /// peer sent (parameters, activation and logit bytes) from overflowing.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.d_model == 0 || self.n_layers == 0 || self.n_heads == 0 || self.n_kv_heads == 0 {
            return bad("d_model, n_layers, n_heads and n_kv_heads must be positive".into());
        }
        // In MAX_DIMS's order.
        let dims = [self.d_model, self.n_layers, self.n_heads, self.ffn_hidden, self.vocab_size, self.max_seq];
        for (value, (name, max)) in dims.into_iter().zip(MAX_DIMS) {
            if value > max {
                return bad(format!("{name} {value} exceeds this build's limit of {max}"));
            }
        }
        if !self.d_model.is_multiple_of(self.n_heads) {
            return bad(format!("d_model {} not divisible by n_heads {}", self.d_model, self.n_heads));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim()));
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return bad(format!("n_heads {} not a multiple of n_kv_heads {}", self.n_heads, self.n_kv_heads));
        }
        if self.vocab_real == 0 || self.vocab_real > self.vocab_size {
            return bad(format!("vocab_real {} must be in 1..={}", self.vocab_real, self.vocab_size));
        }
        if self.bottleneck > self.d_model {
            return bad(format!("bottleneck {} exceeds d_model {}", self.bottleneck, self.d_model));
        }
        if self.ffn_hidden == 0 || self.max_seq == 0 {
            return bad("ffn_hidden and max_seq must be positive".into());
        }
        let finite = [self.norm_eps, self.rope_theta, self.init_std].iter().all(|x| x.is_finite());
        if !(finite && self.norm_eps > 0.0 && self.rope_theta > 1.0 && self.init_std > 0.0) {
            return bad("norm_eps, init_std must be finite and > 0, rope_theta finite and > 1".into());
        }
        if let Some(r) = &self.rope_scaling {
            let factors = [r.factor, r.low_freq_factor, r.high_freq_factor];
            if !factors.iter().all(|x| x.is_finite() && *x > 0.0)
                || r.high_freq_factor <= r.low_freq_factor
                || r.original_max_position == 0
            {
                return bad("rope_scaling: factors must be finite and > 0, high_freq_factor > low_freq_factor, \
                     original_max_position > 0"
                    .into());
            }
        }
        if let Some(v) = &self.stage_layers
            && (v.is_empty() || v.contains(&0) || checked_total(v) != Some(self.n_layers))
        {
            return bad(format!(
                "stage_layers {v:?}: every stage needs at least one block, and they must add up to the model's {} layers",
                self.n_layers
            ));
        }
        Ok(())
    }

    /// RoPE inverse frequencies (one per rotated pair), Llama-3 scaled when
    /// the config says so.
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        let hd = self.head_dim();
        (0..hd / 2)
            .map(|i| {
                let f = 1.0 / (self.rope_theta as f64).powf(2.0 * i as f64 / hd as f64);
                match &self.rope_scaling {
                    None => f,
                    Some(s) => llama3_scale(f, s),
                }
            })
            .collect()
    }
}

fn llama3_scale(freq: f64, s: &RopeScaling) -> f64 {
    let old = s.original_max_position as f64;
    let low_wavelen = old / s.low_freq_factor as f64;
    let high_wavelen = old / s.high_freq_factor as f64;
    let wavelen = std::f64::consts::TAU / freq;
    if wavelen < high_wavelen {
        freq
    } else if wavelen > low_wavelen {
        freq / s.factor as f64
    } else {
        let smooth =
            (old / wavelen - s.low_freq_factor as f64) / (s.high_freq_factor as f64 - s.low_freq_factor as f64);
        (1.0 - smooth) * freq / s.factor as f64 + smooth * freq
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dimension_past_its_limit_is_refused_by_its_name() {
        for (i, (name, max)) in MAX_DIMS.iter().enumerate() {
            let mut c = ModelConfig::preset("15b").unwrap();
            let field =
                [&mut c.d_model, &mut c.n_layers, &mut c.n_heads, &mut c.ffn_hidden, &mut c.vocab_size, &mut c.max_seq];
            *field.into_iter().nth(i).unwrap() = max + 1;
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("{name} {} exceeds", max + 1)), "{name}: {e}");
        }
    }

    #[test]
    fn every_preset_is_valid() {
        for p in PRESETS {
            let c = ModelConfig::preset(p).unwrap();
            assert_eq!(&c.name, p);
        }
        assert!(matches!(ModelConfig::preset("7b"), Err(ConfigError::UnknownPreset(..))));
    }

    #[test]
    fn existing_configs_keep_their_serialized_form() {
        // Run ids hash the settings' JSON, the model's included: a preset
        // must serialize exactly as it did before `bottleneck_style` existed.
        let c = ModelConfig::preset("small").unwrap();
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(
            json,
            "{\"name\":\"small\",\"vocab_size\":50304,\"vocab_real\":50257,\"d_model\":192,\"n_layers\":6,\
             \"n_heads\":6,\"n_kv_heads\":2,\"ffn_hidden\":512,\"max_seq\":256,\"rope_theta\":10000.0,\
             \"rope_scaling\":null,\"norm_eps\":0.00001,\"bottleneck\":16,\"init_std\":0.02}"
        );
        // And an old config (no style field) reads back as the linear style.
        let back: ModelConfig = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.bottleneck_style, BottleneckStyle::Linear);
        // The residual style is written, and read back.
        let mut r = c.clone();
        r.bottleneck_style = BottleneckStyle::Residual;
        let rj = serde_json::to_string(&r).unwrap();
        assert!(rj.ends_with(",\"bottleneck_style\":\"residual\"}"), "{rj}");
        assert_eq!(serde_json::from_str::<ModelConfig>(&rj).unwrap(), r);
        for s in [BottleneckStyle::Linear, BottleneckStyle::Residual] {
            assert_eq!(BottleneckStyle::parse(s.name()), Some(s));
        }
        assert_eq!(BottleneckStyle::parse("cubic"), None);
    }

    #[test]
    fn iota_run_preset_counts() {
        // IOTA's 1.5B run: embeddings 2 x 128256 x 2048 plus 16 Llama blocks.
        let c = ModelConfig::preset("1.5b").unwrap();
        let block = 2048 * 2048 * 2 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048;
        assert_eq!(c.param_count(), 2 * 128256 * 2048 + 16 * block + 2048);
        let c15 = ModelConfig::preset("15b").unwrap();
        let p = c15.param_count() as f64;
        assert!((14.5e9..15.5e9).contains(&p), "{p}");
        let small = ModelConfig::preset("small").unwrap().param_count() as f64;
        assert!((18e6..25e6).contains(&small), "{small}");
    }

    #[test]
    fn llama3_scaling_bands() {
        let s = LLAMA3_ROPE;
        // High frequency (short wavelength): untouched.
        assert_eq!(llama3_scale(1.0, &s), 1.0);
        // Very low frequency: divided by factor.
        let f = 1e-5;
        assert!((llama3_scale(f, &s) - f / 32.0).abs() < 1e-18);
        // Inside the ramp the result lies between the two.
        let mid = std::f64::consts::TAU / 4096.0;
        let r = llama3_scale(mid, &s);
        assert!(r < mid && r > mid / 32.0);
    }
}
