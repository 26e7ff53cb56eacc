//! A whole model's weights held by name, with the run settings needed to
//! use it (stage split, bottleneck, wire codec, tokenizer).
//!
//! Names are the stage layouts' (Hugging Face Llama names with global layer
//! indices), and the embedding and LM head keep the padded vocabulary the
//! model trained with, so `stage_params` gives back exactly the flat
//! vectors the stages train on.

use std::collections::BTreeMap;

use anyhow::{Context, Result, bail};
use iota_core::train_config::TrainConfig;
use iota_core::{ParamLayout, StageSpec};

/// One named tensor, row-major f32.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedWeights {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// Where a model came from (for messages and the exported model card).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Provenance {
    /// The swarm epoch or trainer step whose weights these are.
    pub trained_for: Option<String>,
    /// Tokens the model was trained on, when known.
    pub tokens: Option<u64>,
}

/// A whole model: every stage's tensors, by name.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    /// The run's training settings: the model (with its padded vocabulary),
    /// the stage count (which places the bottleneck), the wire codec at
    /// stage boundaries, the tokenizer, and the batch shape and seed that
    /// `iota eval --split val` uses to pick the trainer's validation windows.
    pub train: TrainConfig,
    pub tensors: BTreeMap<String, NamedWeights>,
    pub provenance: Provenance,
}

impl ModelWeights {
    /// The layouts of the run's stages.
    pub fn layouts(&self) -> Result<Vec<ParamLayout>> {
        Ok(StageSpec::split(&self.train.model, self.train.stages)?
            .iter()
            .map(|s| ParamLayout::for_stage(&self.train.model, s))
            .collect())
    }

    /// Assembles a model from each stage's flat parameter vector (what the
    /// swarm's merges and the trainer's stages hold).
    pub fn from_stages(train: &TrainConfig, stages: &[Vec<f32>], provenance: Provenance) -> Result<ModelWeights> {
        let mut w = ModelWeights { train: train.clone(), tensors: BTreeMap::new(), provenance };
        let layouts = w.layouts()?;
        if layouts.len() != stages.len() {
            bail!("the run has {} stages but {} weight vectors were given", layouts.len(), stages.len());
        }
        for (s, (layout, params)) in layouts.iter().zip(stages).enumerate() {
            if params.len() != layout.total() {
                bail!("stage {s} holds {} values, its layout {}", params.len(), layout.total());
            }
            for e in &layout.entries {
                let t = NamedWeights { shape: e.shape.clone(), data: params[e.range()].to_vec() };
                w.tensors.insert(e.name.clone(), t);
            }
        }
        Ok(w)
    }

    /// Each stage's flat parameter vector; every tensor must be present
    /// with its layout's shape.
    pub fn stage_params(&self) -> Result<Vec<Vec<f32>>> {
        self.layouts()?
            .iter()
            .map(|layout| {
                let mut out = vec![0.0; layout.total()];
                for e in &layout.entries {
                    let t = self.get(&e.name)?;
                    if t.shape != e.shape {
                        bail!("tensor {} has shape {:?}; the model expects {:?}", e.name, t.shape, e.shape);
                    }
                    out[e.range()].copy_from_slice(&t.data);
                }
                Ok(out)
            })
            .collect()
    }

    pub fn get(&self, name: &str) -> Result<&NamedWeights> {
        self.tensors.get(name).with_context(|| format!("the model has no tensor {name}"))
    }

    /// Parameters in the model (padded vocabulary rows included).
    pub fn param_count(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// The last layer of each stage but the tail: where the residual crosses
    /// to the next stage (through the bottleneck, when there is one).
    pub fn boundary_layers(&self) -> Result<Vec<usize>> {
        let specs = StageSpec::split(&self.train.model, self.train.stages)?;
        Ok(specs.iter().filter(|s| s.index + 1 < s.count).map(|s| s.layers.end - 1).collect())
    }

    /// True when the stages pass a bottleneck (extra tensors a plain Llama
    /// does not have).
    pub fn has_bottleneck(&self) -> bool {
        self.train.model.bottleneck > 0 && self.train.stages > 1
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::stage::init_params;
    use iota_core::ModelConfig;

    pub fn tiny_train(stages: usize) -> TrainConfig {
        let model = ModelConfig::preset("tiny").unwrap();
        TrainConfig {
            model,
            tokenizer: iota_core::train_config::TokenizerKind::Byte,
            stages,
            batch: 2,
            seq: 16,
            grad_accum: 1,
            steps: 1,
            schedule: iota_core::train_config::LrSchedule { peak: 1e-3, warmup: 1, total: 1, min_ratio: 0.1 },
            adamw: Default::default(),
            codec: iota_core::WireCodec::Int8Row,
            seed: 7,
        }
    }

    #[test]
    fn stages_round_trip_through_names() {
        let t = tiny_train(3);
        let specs = StageSpec::split(&t.model, 3).unwrap();
        let stages: Vec<Vec<f32>> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| init_params(&ParamLayout::for_stage(&t.model, s), 100 + i as u64))
            .collect();
        let w = ModelWeights::from_stages(&t, &stages, Provenance::default()).unwrap();
        assert_eq!(w.stage_params().unwrap(), stages);
        assert_eq!(w.boundary_layers().unwrap(), vec![1, 2]);
        assert!(w.has_bottleneck());
        assert!(w.tensors.contains_key("model.layers.1.bottleneck.down_proj.weight"));
        assert!(w.tensors.contains_key("model.layers.2.bottleneck.up_proj.weight"));
        // A wrong stage count or a short vector is refused.
        assert!(ModelWeights::from_stages(&t, &stages[..2], Provenance::default()).is_err());
        let mut short = stages.clone();
        short[1].pop();
        assert!(ModelWeights::from_stages(&t, &short, Provenance::default()).is_err());
    }
}
