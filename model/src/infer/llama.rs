//! Token-at-a-time inference with a KV cache, on the CPU: each new token
//! costs one pass through the layers (matrix-vector products) and one
//! attention over the cached keys and values, not a forward over the whole
//! prefix.
//!
//! It computes what the training forward computes for the same tokens:
//! the same RoPE angles, grouped-query attention, RMSNorm and SwiGLU, the
//! bottleneck at stage boundaries, and (unless turned off) the wire codec's
//! quantisation of what crosses a boundary. A test holds it to the
//! trainer's full-sequence losses.

use anyhow::{Result, bail};
use iota_core::{StageSpec, WireCodec};
use rayon::prelude::*;

use crate::codec;
use crate::hf::ModelWeights;

/// One block's weights (q|k|v and gate|up fused, as the stages hold them).
struct Layer {
    attn_norm: Vec<f32>,
    qkv: Vec<f32>,
    o: Vec<f32>,
    mlp_norm: Vec<f32>,
    gate_up: Vec<f32>,
    down: Vec<f32>,
    /// This layer starts a stage: its input crossed a boundary.
    starts_stage: bool,
    /// The bottleneck's b -> d expansion before this layer.
    decode: Option<Decoder>,
    /// This layer ends a stage: its output crosses a boundary.
    ends_stage: bool,
    /// The bottleneck's d -> b compression after this layer.
    encode: Option<Encoder>,
}

/// A residual bottleneck's SwiGLU branch (`boundary.rs`): gate|up fused.
struct Branch {
    gate_up: Vec<f32>,
    down: Vec<f32>,
}

impl Branch {
    /// The branch under `prefix`, when the model has one.
    fn load(w: &ModelWeights, prefix: &str) -> Result<Option<Branch>> {
        if !w.tensors.contains_key(&format!("{prefix}.gate_proj.weight")) {
            return Ok(None);
        }
        let t = |s: &str| -> Result<&[f32]> { Ok(&w.get(&format!("{prefix}.{s}_proj.weight"))?.data) };
        Ok(Some(Branch { gate_up: concat(&[t("gate")?, t("up")?]), down: t("down")?.to_vec() }))
    }

    /// out `[o]` += swiglu(x @ gate_up^T) @ down^T.
    fn add_to(&self, out: &mut [f32], x: &[f32]) {
        let r = self.down.len() / out.len();
        let gu = matvec(&self.gate_up, x, 2 * r, x.len());
        let m: Vec<f32> = gu[..r].iter().zip(&gu[r..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let y = matvec(&self.down, &m, out.len(), r);
        for (o, y) in out.iter_mut().zip(y) {
            *o += y;
        }
    }
}

/// `h0 = pad(z) + z @ up^T (+ branch(z))`.
struct Decoder {
    up: Vec<f32>,
    branch: Option<Branch>,
}

/// `z = h[:b] + hn @ down^T (+ branch(hn))`, `hn = rmsnorm(h) * gain`.
struct Encoder {
    gain: Vec<f32>,
    down: Vec<f32>,
    branch: Option<Branch>,
}

/// A model ready for generation.
pub struct Llama {
    pub cfg: iota_core::ModelConfig,
    /// Logits are over the tokenizer's ids (the padded rows are never used).
    pub vocab: usize,
    /// Quantisation applied to what crosses a stage boundary (None: exact).
    pub boundary_codec: Option<WireCodec>,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    lm_head: Vec<f32>,
    inv_freq: Vec<f64>,
}

/// The keys and values of every position seen so far, per layer.
pub struct KvCache {
    pos: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvCache {
    /// Positions already in the cache (the next token's position).
    pub fn len(&self) -> usize {
        self.pos
    }
    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }
}

fn concat(parts: &[&[f32]]) -> Vec<f32> {
    parts.concat()
}

impl Llama {
    /// Builds the model from `w`; `exact_boundaries` skips the wire codec's
    /// quantisation at stage boundaries (a plain Llama's forward).
    pub fn new(w: &ModelWeights, exact_boundaries: bool) -> Result<Llama> {
        let cfg = w.train.model.clone();
        let specs = StageSpec::split(&cfg, w.train.stages)?;
        let t = |name: String| -> Result<&[f32]> { Ok(&w.get(&name)?.data) };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for spec in &specs {
            for i in spec.layers.clone() {
                let p = format!("model.layers.{i}");
                let first = i == spec.layers.start && spec.index > 0;
                let last = i + 1 == spec.layers.end && spec.index + 1 < spec.count;
                layers.push(Layer {
                    attn_norm: t(format!("{p}.input_layernorm.weight"))?.to_vec(),
                    qkv: concat(&[
                        t(format!("{p}.self_attn.q_proj.weight"))?,
                        t(format!("{p}.self_attn.k_proj.weight"))?,
                        t(format!("{p}.self_attn.v_proj.weight"))?,
                    ]),
                    o: t(format!("{p}.self_attn.o_proj.weight"))?.to_vec(),
                    mlp_norm: t(format!("{p}.post_attention_layernorm.weight"))?.to_vec(),
                    gate_up: concat(&[t(format!("{p}.mlp.gate_proj.weight"))?, t(format!("{p}.mlp.up_proj.weight"))?]),
                    down: t(format!("{p}.mlp.down_proj.weight"))?.to_vec(),
                    starts_stage: first,
                    decode: if spec.decode_in && first {
                        Some(Decoder {
                            up: t(format!("{p}.bottleneck.up_proj.weight"))?.to_vec(),
                            branch: Branch::load(w, &format!("{p}.bottleneck.decoder_mlp"))?,
                        })
                    } else {
                        None
                    },
                    ends_stage: last,
                    encode: if spec.encode_out && last {
                        Some(Encoder {
                            gain: t(format!("{p}.bottleneck.norm.weight"))?.to_vec(),
                            down: t(format!("{p}.bottleneck.down_proj.weight"))?.to_vec(),
                            branch: Branch::load(w, &format!("{p}.bottleneck.encoder_mlp"))?,
                        })
                    } else {
                        None
                    },
                });
            }
        }
        let vocab = cfg.vocab_real;
        let d = cfg.d_model;
        let embed = t("model.embed_tokens.weight".into())?[..vocab * d].to_vec();
        let lm_head = t("lm_head.weight".into())?[..vocab * d].to_vec();
        let norm = t("model.norm.weight".into())?.to_vec();
        let codec = (!exact_boundaries && w.train.stages > 1).then_some(w.train.codec);
        Ok(Llama { inv_freq: cfg.rope_inv_freq(), cfg, vocab, boundary_codec: codec, embed, layers, norm, lm_head })
    }

    pub fn new_cache(&self) -> KvCache {
        let n = self.layers.len();
        KvCache { pos: 0, k: vec![Vec::new(); n], v: vec![Vec::new(); n] }
    }

    /// Feeds one token at the cache's next position; returns the logits of
    /// the token after it (over the tokenizer's ids).
    pub fn step(&self, cache: &mut KvCache, token: u32) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let (d, f) = (cfg.d_model, cfg.ffn_hidden);
        let (hd, heads, kv_heads) = (cfg.head_dim(), cfg.n_heads, cfg.n_kv_heads);
        let (qd, kvd) = (cfg.q_dim(), cfg.kv_dim());
        if token as usize >= self.vocab {
            bail!("token {token} is outside the model's vocabulary of {}", self.vocab);
        }
        if cache.pos >= cfg.max_seq {
            bail!("the context is full: the model was built for {} positions", cfg.max_seq);
        }
        let pos = cache.pos;
        let t = token as usize;
        let mut h = self.embed[t * d..(t + 1) * d].to_vec();
        let (cos, sin): (Vec<f32>, Vec<f32>) = self
            .inv_freq
            .iter()
            .map(|fr| {
                let a = pos as f64 * fr;
                (a.cos() as f32, a.sin() as f32)
            })
            .unzip();
        let mut z: Vec<f32> = Vec::new();
        for (li, l) in self.layers.iter().enumerate() {
            if l.starts_stage {
                h = match &l.decode {
                    Some(dec) => {
                        let b = z.len();
                        let mut h0 = matvec(&dec.up, &z, d, b);
                        for (o, zi) in h0.iter_mut().zip(&z) {
                            *o += zi;
                        }
                        if let Some(br) = &dec.branch {
                            br.add_to(&mut h0, &z);
                        }
                        h0
                    }
                    None => std::mem::take(&mut z),
                };
            }
            // Attention.
            let xn = rmsnorm(&h, &l.attn_norm, cfg.norm_eps);
            let mut qkv = matvec(&l.qkv, &xn, qd + 2 * kvd, d);
            for head in 0..heads + kv_heads {
                rope_rotate(&mut qkv[head * hd..(head + 1) * hd], &cos, &sin);
            }
            cache.k[li].extend_from_slice(&qkv[qd..qd + kvd]);
            cache.v[li].extend_from_slice(&qkv[qd + kvd..]);
            let att = attend(&qkv[..qd], &cache.k[li], &cache.v[li], heads, kv_heads, hd);
            let o = matvec(&l.o, &att, d, qd);
            for (x, y) in h.iter_mut().zip(&o) {
                *x += y;
            }
            // MLP.
            let xn = rmsnorm(&h, &l.mlp_norm, cfg.norm_eps);
            let gu = matvec(&l.gate_up, &xn, 2 * f, d);
            let m: Vec<f32> = gu[..f].iter().zip(&gu[f..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let down = matvec(&l.down, &m, d, f);
            for (x, y) in h.iter_mut().zip(&down) {
                *x += y;
            }
            if l.ends_stage {
                z = match &l.encode {
                    Some(enc) => {
                        let b = enc.down.len() / d;
                        let hn = rmsnorm(&h, &enc.gain, cfg.norm_eps);
                        let mut z = matvec(&enc.down, &hn, b, d);
                        for (zi, hi) in z.iter_mut().zip(&h) {
                            *zi += hi;
                        }
                        if let Some(br) = &enc.branch {
                            br.add_to(&mut z, &hn);
                        }
                        z
                    }
                    None => h.clone(),
                };
                if let Some(c) = self.boundary_codec {
                    let width = z.len();
                    codec::round_trip(c, 1, width, &mut z)?;
                }
            }
        }
        cache.pos += 1;
        let hn = rmsnorm(&h, &self.norm, cfg.norm_eps);
        Ok(matvec(&self.lm_head, &hn, self.vocab, d))
    }
}

/// `w [rows, cols]` times `x [cols]`, rows in parallel when it pays.
fn matvec(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    debug_assert_eq!(w.len(), rows * cols);
    let dot = |r: &[f32]| -> f32 {
        // Eight partial sums: vectorises, and rounds like a blocked GEMM.
        let mut acc = [0f32; 8];
        let chunks = r.len() / 8 * 8;
        for (rc, xc) in r[..chunks].chunks_exact(8).zip(x[..chunks].chunks_exact(8)) {
            for k in 0..8 {
                acc[k] += rc[k] * xc[k];
            }
        }
        let tail: f32 = r[chunks..].iter().zip(&x[chunks..]).map(|(a, b)| a * b).sum();
        acc.iter().sum::<f32>() + tail
    };
    if rows * cols >= 1 << 16 { w.par_chunks(cols).map(dot).collect() } else { w.chunks(cols).map(dot).collect() }
}

fn rmsnorm(x: &[f32], gain: &[f32], eps: f32) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(gain).map(|(v, g)| v * r * g).collect()
}

/// Rotate-half RoPE on one head.
fn rope_rotate(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    let (a, b) = x.split_at_mut(half);
    for i in 0..half {
        let (x1, x2) = (a[i], b[i]);
        a[i] = x1 * cos[i] - x2 * sin[i];
        b[i] = x2 * cos[i] + x1 * sin[i];
    }
}

/// Causal attention of one query row over every cached position.
fn attend(q: &[f32], k: &[f32], v: &[f32], heads: usize, kv_heads: usize, hd: usize) -> Vec<f32> {
    let kvd = kv_heads * hd;
    let n = k.len() / kvd;
    let group = heads / kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let mut out = vec![0f32; heads * hd];
    let mut scores = vec![0f32; n];
    for h in 0..heads {
        let qh = &q[h * hd..(h + 1) * hd];
        let kh = (h / group) * hd;
        for (j, s) in scores.iter_mut().enumerate() {
            let kj = &k[j * kvd + kh..j * kvd + kh + hd];
            *s = qh.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
        }
        let max = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        let oh = &mut out[h * hd..(h + 1) * hd];
        for (j, s) in scores.iter().enumerate() {
            let p = s / sum;
            let vj = &v[j * kvd + kh..j * kvd + kh + hd];
            for (o, x) in oh.iter_mut().zip(vj) {
                *o += p * x;
            }
        }
    }
    out
}
