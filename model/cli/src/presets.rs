//! `iota presets`.

use anyhow::Result;
use iota_core::codec::boundary_cost;
use iota_core::config::PRESETS;
use iota_core::{ModelConfig, WireCodec};

/// `iota presets`: every preset's size and boundary cost.
pub fn presets(stages: usize) -> Result<()> {
    println!(
        "{:<6} {:>15} {:>5} {:>6} {:>6} {:>6} {:>7} {:>4} | {:>9} {:>9} {:>9} | per-stage params ({stages} stages)",
        "preset", "params", "d", "layers", "heads", "ffn", "vocab", "b", "bf16 B/t", "int8", "int4"
    );
    for name in PRESETS {
        let c = ModelConfig::preset(name)?;
        let cost = |codec| boundary_cost(c.d_model, c.bottleneck, codec);
        let (i8c, i4c) = (cost(WireCodec::Int8Row), cost(WireCodec::Int4Row));
        let per_stage = c
            .stage_param_counts(stages.min(c.n_layers).max(1))?
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(" / ");
        println!(
            "{:<6} {:>15} {:>5} {:>6} {:>6} {:>6} {:>7} {:>4} | {:>9} {:>4}B {:>4.0}x {:>4}B {:>4.0}x | {}",
            name,
            c.param_count(),
            c.d_model,
            c.n_layers,
            format!("{}/{}", c.n_heads, c.n_kv_heads),
            c.ffn_hidden,
            c.vocab_size,
            c.bottleneck,
            2 * c.d_model,
            i8c.bytes_per_token,
            i8c.ratio,
            i4c.bytes_per_token,
            i4c.ratio,
            per_stage
        );
    }
    println!(
        "B/t: bytes per token crossing a stage boundary (one direction); ratio against the bf16 d-wide hidden state."
    );
    Ok(())
}
