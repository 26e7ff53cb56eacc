//! The stage split and the flat parameter layout of a stage.
//!
//! A stage's parameters live in one contiguous vector (what the optimizer
//! steps, what the butterfly merge slices, what a checkpoint stores). This
//! module fixes the order and the names. Names follow the Hugging Face Llama
//! convention so a checkpoint is readable by other tools; layer indices are
//! global, so the tensors of all stages together form one model.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::config::{BottleneckStyle, ModelConfig};
use crate::error::ConfigError;

/// What a stage holds besides its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StageRole {
    /// Embedding + blocks + final norm + LM head (the unsplit model).
    Whole,
    /// Embedding + blocks.
    Head,
    /// Blocks only.
    Body,
    /// Blocks + final norm + LM head + loss.
    Tail,
}

/// One stage of an S-stage pipeline.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpec {
    pub index: usize,
    pub count: usize,
    pub layers: Range<usize>,
    /// Channels crossing each boundary of this stage: `d_model` when the
    /// bottleneck is off, `bottleneck` when on.
    pub boundary_width: usize,
    /// The first block expands a b-wide input back to d channels.
    pub decode_in: bool,
    /// The last block compresses the d-wide residual to b channels.
    pub encode_out: bool,
}

/// Sizes of a model follow from its layout (here, so that `config` does not
/// depend on `layout`, which reads the config).
impl ModelConfig {
    /// Parameter count of the unsplit model (one stage, so no bottleneck).
    pub fn param_count(&self) -> usize {
        ParamLayout::for_stage(self, &StageSpec::whole(self)).total()
    }

    /// Exact parameter count of every stage when split into `stages` stages
    /// (includes the bottleneck projections at each boundary).
    pub fn stage_param_counts(&self, stages: usize) -> Result<Vec<usize>, ConfigError> {
        Ok(StageSpec::split(self, stages)?.iter().map(|s| ParamLayout::for_stage(self, s).total()).collect())
    }
}

impl StageSpec {
    /// The unsplit model as one stage.
    pub fn whole(cfg: &ModelConfig) -> StageSpec {
        StageSpec {
            index: 0,
            count: 1,
            layers: 0..cfg.n_layers,
            boundary_width: cfg.d_model,
            decode_in: false,
            encode_out: false,
        }
    }

    /// Splits the layers as the config's `stage_layers` says for this many
    /// stages, else as evenly as possible, earlier stages taking the
    /// remainder because the tail also carries the LM head.
    pub fn split(cfg: &ModelConfig, stages: usize) -> Result<Vec<StageSpec>, ConfigError> {
        if stages == 0 || stages > cfg.n_layers {
            return Err(ConfigError::BadStageCount { layers: cfg.n_layers, stages });
        }
        let counts = match &cfg.stage_layers {
            Some(v) if v.len() == stages => {
                if v.contains(&0) || crate::config::checked_total(v) != Some(cfg.n_layers) {
                    return Err(ConfigError::Invalid(format!(
                        "stage_layers {v:?} must give every stage a block and add up to {}",
                        cfg.n_layers
                    )));
                }
                v.clone()
            }
            _ => even_layers(cfg.n_layers, stages),
        };
        let mut start = 0;
        Ok(counts
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let mut s = StageSpec::sized(cfg, i, stages, n);
                s.layers = start..start + n;
                start += n;
                s
            })
            .collect())
    }

    /// A stage of `count` with `layers` blocks at `index` (where the blocks
    /// sit does not change what a stage costs or holds).
    pub fn sized(cfg: &ModelConfig, index: usize, count: usize, layers: usize) -> StageSpec {
        let bn = cfg.bottleneck > 0 && count > 1;
        StageSpec {
            index,
            count,
            layers: 0..layers,
            boundary_width: if bn { cfg.bottleneck } else { cfg.d_model },
            decode_in: bn && index > 0,
            encode_out: bn && index + 1 < count,
        }
    }

    pub fn role(&self) -> StageRole {
        match (self.index == 0, self.index + 1 == self.count) {
            (true, true) => StageRole::Whole,
            (true, false) => StageRole::Head,
            (false, true) => StageRole::Tail,
            (false, false) => StageRole::Body,
        }
    }

    pub fn has_embedding(&self) -> bool {
        self.index == 0
    }

    pub fn has_lm_head(&self) -> bool {
        self.index + 1 == self.count
    }
}

/// `layers` blocks over `stages` stages as evenly as they go, earlier
/// stages taking the remainder.
pub fn even_layers(layers: usize, stages: usize) -> Vec<usize> {
    (0..stages).map(|i| layers / stages + usize::from(i < layers % stages)).collect()
}

/// How a parameter tensor is initialised.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Init {
    /// N(0, std^2).
    Normal(f32),
    /// Constant (norm gains start at 1).
    Const(f32),
}

/// One named tensor inside a stage's flat parameter vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamEntry {
    pub name: String,
    pub shape: Vec<usize>,
    pub offset: usize,
    pub init: Init,
    /// Decoupled weight decay applies to matrices, never to norm gains.
    pub decay: bool,
}

impl ParamEntry {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn range(&self) -> Range<usize> {
        self.offset..self.offset + self.len()
    }
    /// Whether Muon updates this tensor when it is on: the blocks' and the
    /// bottleneck's weight matrices; never the embedding or the LM head
    /// (each row a token's own vector, not a linear map between hidden
    /// spaces) nor a vector.
    pub fn takes_muon(&self) -> bool {
        self.shape.len() == 2 && !self.name.contains("embed_tokens") && !self.name.starts_with("lm_head")
    }
}

/// The ordered list of a stage's tensors.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamLayout {
    pub entries: Vec<ParamEntry>,
}

impl ParamLayout {
    /// The layout of a stage. Tensors that one fused GEMM reads are adjacent:
    /// q|k|v form one [qkv, d] matrix and gate|up one [2f, d] matrix.
    pub fn for_stage(cfg: &ModelConfig, spec: &StageSpec) -> ParamLayout {
        let (d, b, f) = (cfg.d_model, cfg.bottleneck, cfg.ffn_hidden);
        let (residual, r) = (cfg.bottleneck_style == BottleneckStyle::Residual, cfg.bottleneck_hidden());
        let w = Init::Normal(cfg.init_std);
        let one = Init::Const(1.0);
        let mut l = ParamLayout { entries: Vec::new() };
        if spec.has_embedding() {
            l.push("model.embed_tokens.weight", &[cfg.vocab_size, d], w, true);
        }
        for i in spec.layers.clone() {
            let p = format!("model.layers.{i}");
            if spec.decode_in && i == spec.layers.start {
                l.push(&format!("{p}.bottleneck.up_proj.weight"), &[d, b], w, true);
                if residual {
                    // gate|up adjacent: one [2r, b] GEMM.
                    l.push(&format!("{p}.bottleneck.decoder_mlp.gate_proj.weight"), &[r, b], w, true);
                    l.push(&format!("{p}.bottleneck.decoder_mlp.up_proj.weight"), &[r, b], w, true);
                    l.push(&format!("{p}.bottleneck.decoder_mlp.down_proj.weight"), &[d, r], w, true);
                }
            }
            l.push(&format!("{p}.input_layernorm.weight"), &[d], one, false);
            l.push(&format!("{p}.self_attn.q_proj.weight"), &[cfg.q_dim(), d], w, true);
            l.push(&format!("{p}.self_attn.k_proj.weight"), &[cfg.kv_dim(), d], w, true);
            l.push(&format!("{p}.self_attn.v_proj.weight"), &[cfg.kv_dim(), d], w, true);
            l.push(&format!("{p}.self_attn.o_proj.weight"), &[d, cfg.q_dim()], w, true);
            l.push(&format!("{p}.post_attention_layernorm.weight"), &[d], one, false);
            l.push(&format!("{p}.mlp.gate_proj.weight"), &[f, d], w, true);
            l.push(&format!("{p}.mlp.up_proj.weight"), &[f, d], w, true);
            l.push(&format!("{p}.mlp.down_proj.weight"), &[d, f], w, true);
            if spec.encode_out && i + 1 == spec.layers.end {
                l.push(&format!("{p}.bottleneck.norm.weight"), &[d], one, false);
                l.push(&format!("{p}.bottleneck.down_proj.weight"), &[b, d], w, true);
                if residual {
                    l.push(&format!("{p}.bottleneck.encoder_mlp.gate_proj.weight"), &[r, d], w, true);
                    l.push(&format!("{p}.bottleneck.encoder_mlp.up_proj.weight"), &[r, d], w, true);
                    l.push(&format!("{p}.bottleneck.encoder_mlp.down_proj.weight"), &[b, r], w, true);
                }
            }
        }
        if spec.has_lm_head() {
            l.push("model.norm.weight", &[d], one, false);
            l.push("lm_head.weight", &[cfg.vocab_size, d], w, true);
        }
        l
    }

    fn push(&mut self, name: &str, shape: &[usize], init: Init, decay: bool) {
        let offset = self.total();
        self.entries.push(ParamEntry { name: name.to_string(), shape: shape.to_vec(), offset, init, decay });
    }

    /// Total number of parameters (the flat vector's length).
    pub fn total(&self) -> usize {
        self.entries.last().map_or(0, |e| e.offset + e.len())
    }

    pub fn get(&self, name: &str) -> Option<&ParamEntry> {
        self.entries.iter().find(|e| e.name == name)
    }

    /// The flat range of a tensor; panics on a name the layout does not have,
    /// which would be a bug in the model code, never in input data.
    pub fn range(&self, name: &str) -> Range<usize> {
        self.get(name).unwrap_or_else(|| panic!("parameter {name} not in layout")).range()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_all_layers_once() {
        let c = ModelConfig::preset("small").unwrap();
        for s in 1..=c.n_layers {
            let specs = StageSpec::split(&c, s).unwrap();
            let covered: Vec<usize> = specs.iter().flat_map(|s| s.layers.clone()).collect();
            assert_eq!(covered, (0..c.n_layers).collect::<Vec<_>>());
            assert!(specs.iter().all(|s| !s.layers.is_empty()));
        }
        assert!(StageSpec::split(&c, 0).is_err());
        assert!(StageSpec::split(&c, c.n_layers + 1).is_err());
    }

    #[test]
    fn a_chosen_split_applies_to_its_stage_count_only() {
        let mut c = ModelConfig::preset("1.5b").unwrap();
        let even = StageSpec::split(&c, 3).unwrap();
        assert_eq!(even.iter().map(|s| s.layers.len()).collect::<Vec<_>>(), vec![6, 5, 5]);
        c.stage_layers = Some(vec![7, 7, 2]);
        c.validate().unwrap();
        let specs = StageSpec::split(&c, 3).unwrap();
        assert_eq!(specs.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(), vec![0..7, 7..14, 14..16]);
        for (i, s) in specs.iter().enumerate() {
            assert_eq!(*s, {
                let mut x = StageSpec::sized(&c, i, 3, s.layers.len());
                x.layers = s.layers.clone();
                x
            });
        }
        // The same parameters in all, the blocks moved between stages.
        let counts = c.stage_param_counts(3).unwrap();
        let mut plain = c.clone();
        plain.stage_layers = None;
        assert_eq!(counts.iter().sum::<usize>(), plain.stage_param_counts(3).unwrap().iter().sum::<usize>());
        assert!(counts[2] < plain.stage_param_counts(3).unwrap()[2]);
        // One process, or another stage count: the even split.
        assert_eq!(StageSpec::split(&c, 1).unwrap()[0].layers, 0..16);
        assert_eq!(StageSpec::split(&c, 2).unwrap().iter().map(|s| s.layers.len()).collect::<Vec<_>>(), vec![8, 8]);
        for bad in [vec![8, 8, 0], vec![7, 7, 3], vec![], vec![usize::MAX, 17, 1]] {
            c.stage_layers = Some(bad.clone());
            assert!(c.validate().is_err(), "{bad:?}");
            if bad.len() == 3 {
                assert!(StageSpec::split(&c, 3).is_err(), "{bad:?}");
            }
        }
        // Unset, the field is left out of the saved form (run ids stay).
        c.stage_layers = None;
        assert!(!serde_json::to_string(&c).unwrap().contains("stage_layers"));
    }

    #[test]
    fn stage_counts_add_up_to_model_plus_bottleneck() {
        let c = ModelConfig::preset("1.5b").unwrap();
        let (d, b) = (c.d_model, c.bottleneck);
        for s in 1..=4 {
            let counts = c.stage_param_counts(s).unwrap();
            let boundaries = s - 1;
            // Each boundary adds an encoder norm + d->b projection and a b->d decoder.
            let extra = boundaries * (d + b * d + d * b);
            assert_eq!(counts.iter().sum::<usize>(), c.param_count() + extra);
        }
    }

    #[test]
    fn the_residual_bottleneck_adds_two_swiglu_branches_per_boundary() {
        let mut c = ModelConfig::preset("small").unwrap();
        let linear = c.stage_param_counts(3).unwrap();
        c.bottleneck_style = BottleneckStyle::Residual;
        let residual = c.stage_param_counts(3).unwrap();
        let (d, b, r) = (c.d_model, c.bottleneck, c.bottleneck_hidden());
        let encoder = 2 * r * d + b * r;
        let decoder = 2 * r * b + d * r;
        assert_eq!(residual, vec![linear[0] + encoder, linear[1] + decoder + encoder, linear[2] + decoder]);
        // One stage has no boundary, so no bottleneck of either style.
        assert_eq!(c.param_count(), ModelConfig::preset("small").unwrap().param_count());
        let specs = StageSpec::split(&c, 3).unwrap();
        let body = ParamLayout::for_stage(&c, &specs[1]);
        let up = body.range("model.layers.2.bottleneck.up_proj.weight");
        let g = body.range("model.layers.2.bottleneck.decoder_mlp.gate_proj.weight");
        let u = body.range("model.layers.2.bottleneck.decoder_mlp.up_proj.weight");
        assert_eq!((up.end, g.end), (g.start, u.start), "decoder: up_proj, then gate|up fused");
        let g = body.range("model.layers.3.bottleneck.encoder_mlp.gate_proj.weight");
        let u = body.range("model.layers.3.bottleneck.encoder_mlp.up_proj.weight");
        assert_eq!(g.end, u.start, "encoder: gate|up fused");
        assert!(body.entries.iter().filter(|e| e.name.contains("_mlp.")).all(|e| e.decay));
    }

    #[test]
    fn fused_tensors_are_adjacent() {
        let c = ModelConfig::preset("tiny").unwrap();
        let l = ParamLayout::for_stage(&c, &StageSpec::whole(&c));
        let q = l.range("model.layers.1.self_attn.q_proj.weight");
        let k = l.range("model.layers.1.self_attn.k_proj.weight");
        let v = l.range("model.layers.1.self_attn.v_proj.weight");
        assert_eq!(q.end, k.start);
        assert_eq!(k.end, v.start);
        let g = l.range("model.layers.1.mlp.gate_proj.weight");
        let u = l.range("model.layers.1.mlp.up_proj.weight");
        assert_eq!(g.end, u.start);
    }
}
