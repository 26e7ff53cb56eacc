//! RoPE angle tables (rotate-half convention, as Hugging Face Llama uses).

use iota_core::ModelConfig;

/// `[seq, hd/2]` cosines followed by `[seq, hd/2]` sines; angles are computed
/// in f64 so long positions keep their precision.
pub fn rope_table(cfg: &ModelConfig, seq: usize) -> Vec<f32> {
    let inv = cfg.rope_inv_freq();
    let half = inv.len();
    let mut t = vec![0.0f32; 2 * seq * half];
    let (cos, sin) = t.split_at_mut(seq * half);
    for pos in 0..seq {
        for (i, f) in inv.iter().enumerate() {
            let a = pos as f64 * f;
            cos[pos * half + i] = a.cos() as f32;
            sin[pos * half + i] = a.sin() as f32;
        }
    }
    t
}
