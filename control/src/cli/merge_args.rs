//! The merge a run's settings describe (`--merge`, `--merge-codec`,
//! `--sparse-density`, the outer optimizer and the slices' limits).

use anyhow::{Context, Result, bail};
use iota_core::merge::{OuterOpt, ReduceRule};
use iota_core::{ModelConfig, ParamLayout, StageSpec, WireCodec};
use iota_protocol::run_spec::SPARSE_OUTER_LR;
use iota_protocol::{MergeMethod, MergeSpec};

use super::RunArgs;

impl RunArgs {
    /// The run's `MergeSpec` for `model` split into `--stages`, its settings
    /// checked.
    pub(super) fn merge_spec(&self, model: &ModelConfig) -> Result<MergeSpec> {
        let sparse = self.merge_codec == "sparse";
        let outer_lr = self.outer_lr.unwrap_or(if sparse { SPARSE_OUTER_LR } else { 1.0 });
        let merge = MergeSpec {
            method: MergeMethod::parse(&self.merge)
                .with_context(|| format!("unknown merge '{}' (butterfly, parameter-server)", self.merge))?,
            slices_per_replica: self.slices_per_replica.max(1),
            codec: match self.merge_codec.as_str() {
                "bf16" | "sparse" => WireCodec::Bf16,
                "int8" => WireCodec::Int8Row,
                "f32" => WireCodec::F32,
                other => bail!("unknown merge codec '{other}' (bf16, int8, f32, sparse)"),
            },
            sparse_density: if sparse { self.sparse_density } else { 0.0 },
            sparse_decay: self.sparse_decay,
            rule: ReduceRule::parse(&self.merge_rule).with_context(|| {
                format!("unknown merge rule '{}' (centered-clip, trimmed-mean, mean)", self.merge_rule)
            })?,
            outer: OuterOpt { lr: outer_lr, momentum: self.outer_momentum },
            outer_momentum_warmup: self.outer_momentum_warmup,
            stage_params: StageSpec::split(model, self.stages as usize)?
                .iter()
                .map(|s| ParamLayout::for_stage(model, s).total() as u64)
                .collect(),
            max_slice_bytes: (self.max_slice_mib * (1u64 << 20) as f64).round() as u64,
            overlap: self.merge_overlap,
            store_mbit: self.store_mbit,
        };
        if self.store_mbit == 0 {
            bail!("--store-mbit must be positive (Mbit/s a miner has to the store)");
        }
        if !(outer_lr > 0.0 && (0.0..1.0).contains(&self.outer_momentum)) {
            bail!("--outer-lr must be positive and --outer-momentum in [0, 1)");
        }
        Ok(merge)
    }
}
