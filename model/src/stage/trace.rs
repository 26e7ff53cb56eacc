//! A micro-batch's forward and backward run piece by piece, with a hash of
//! every value that crosses between pieces, and one piece run alone: what
//! narrows a disputed inner step to one layer (PROTOCOL.md, "Inner steps
//! recomputed", the proof of a failed recompute).
//!
//! A stage is a row of segments ([`Segment`]): the embedding (head) or the
//! bottleneck decoder, its blocks, then the bottleneck encoder or the LM
//! head with its loss (tail). [`Stage::traced_mb`] runs one micro-batch
//! through all of them with the same operations, in the same order, as
//! `forward` and `backward` (or `forward_backward`), so the gradients it
//! accumulates are their bits, and records per segment: the hash of its
//! output, of the gradient of its input, and of the stage's gradients over
//! its parameters once its backward has accumulated into them. Two such
//! traces of the same work agree up to the first segment one party
//! computed otherwise; that segment's inputs are values both agree on, so
//! [`Stage::segment_run`] recomputes its outputs from them at the cost of
//! that one segment.
//!
//! The hash is the caller's (the checks' `weights_hash`): this crate makes
//! no commitment of its own.

use std::ops::Range;

use iota_core::{ParamLayout, StageSpec};

use super::{Stage, StageError, StageInput};
use crate::backend::Backend;
use crate::block::{BlockActs, Ctx, LayerIdx, block_backward, block_forward};
use crate::boundary::{
    DecodeActs, DecodeIdx, EncodeActs, EncodeIdx, decode_backward, decode_forward, encode_backward, encode_forward,
};
use crate::lm_head::{HeadIdx, head_forward_backward};

/// Which piece of a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentKind {
    /// Tokens in, the residual out (a head).
    Embedding,
    /// The boundary activations in, the residual out.
    Decode,
    /// The stage's `n`th block (0: its first).
    Block(usize),
    /// The residual in, the boundary activations out.
    Encode,
    /// The residual and the targets in, the per-token losses out (a tail).
    LmHead,
}

/// One piece of a stage and the range of the stage's parameters it owns
/// (the layout keeps each piece's tensors together).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub kind: SegmentKind,
    pub params: Range<usize>,
}

/// What a micro-batch's backward starts from.
#[derive(Clone, Copy, Debug)]
pub enum MbEnd<'a> {
    /// The gradient of the stage's output (a head or middle stage).
    Grad(&'a [f32]),
    /// The targets, and the scale of the mean loss (a tail; `1 / grad_accum`
    /// as the worker runs it).
    Targets { targets: &'a [u32], loss_scale: f32 },
}

/// The hashes of one micro-batch's run, one per segment of each list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MbTrace {
    /// Of the segment's output (the LM head's: its per-token losses).
    pub outputs: Vec<[u8; 32]>,
    /// Of the gradient of the segment's input (the embedding's: of no values).
    pub input_grads: Vec<[u8; 32]>,
    /// Of the stage's gradients over the segment's parameters after its
    /// backward (accumulated over the step's micro-batches so far).
    pub grads: Vec<[u8; 32]>,
}

/// What `traced_mb` gives besides the trace.
pub struct MbTraced {
    pub trace: MbTrace,
    /// The stage's output (a tail's: its per-token losses).
    pub output: Vec<f32>,
    /// The gradient of the stage's input (`None` for a head).
    pub din: Option<Vec<f32>>,
}

/// What one segment run alone gives; its parameter gradients accumulate
/// into the stage's.
pub struct SegmentOut {
    pub output: Vec<f32>,
    /// The gradient of its input (`None`: no backward was asked, or the
    /// embedding's).
    pub din: Option<Vec<f32>>,
}

/// A hash of values.
pub type ValuesHash<'a> = &'a dyn Fn(&[f32]) -> [u8; 32];

/// What a forward keeps of one segment for its backward.
enum Kept<B: Backend> {
    Embedding(Vec<u32>),
    Decode(DecodeActs<B>),
    Block(BlockActs<B>),
    /// Its activations and its input.
    Encode(EncodeActs<B>, B::Buf),
}

/// What flows between segments: tokens into the first of a head, values
/// after.
enum Flow<'a, B: Backend> {
    Tokens(&'a [u32]),
    Values(B::Buf),
}

impl<B: Backend> Stage<B> {
    /// The stage's segments in forward order (`segments_of`).
    pub fn segments(&self) -> Vec<Segment> {
        segments_of(&self.layout, &self.spec)
    }

    /// The values of a segment's input and output per token.
    fn segment_widths(&self, kind: SegmentKind) -> (usize, usize) {
        let (d, b) = (self.cfg.d_model, self.cfg.bottleneck);
        match kind {
            SegmentKind::Embedding => (1, d),
            SegmentKind::Decode => (b, d),
            SegmentKind::Block(_) => (d, d),
            SegmentKind::Encode => (d, b),
            SegmentKind::LmHead => (d, 1),
        }
    }

    /// One micro-batch's forward and backward, segment by segment, as the
    /// worker runs it (the stage's current weights, its gradients
    /// accumulated into), with the hashes of the module text.
    pub fn traced_mb(
        &mut self,
        input: StageInput,
        end: MbEnd,
        batch: usize,
        seq: usize,
        hash: ValuesHash,
    ) -> Result<MbTraced, StageError> {
        self.check_input(&input, batch, seq)?;
        self.check_end(&end, batch, seq, self.spec.boundary_width)?;
        self.ensure_rope(seq);
        let segments = self.segments();
        let mut trace = MbTrace::default();
        let mut flow = match input {
            StageInput::Tokens(t) => Flow::Tokens(t),
            StageInput::Hidden(h) => Flow::Values(self.be.upload(h)),
        };
        let mut kept = Vec::with_capacity(segments.len());
        for seg in &segments {
            if seg.kind == SegmentKind::LmHead {
                break;
            }
            let (k, out) = self.segment_forward(seg.kind, flow, batch, seq);
            trace.outputs.push(hash(&self.be.to_host(&out)));
            kept.push(k);
            flow = Flow::Values(out);
        }
        let Flow::Values(out) = flow else {
            return Err(self.role_err("trace a stage without segments"));
        };
        match end {
            MbEnd::Targets { targets, loss_scale } => {
                let head = segments.last().cloned().ok_or_else(|| self.role_err("trace a stage without segments"))?;
                let (losses, dh) = self.lm_head(&out, targets, loss_scale, batch, seq);
                let head_hashes = (hash(&self.be.to_host(&dh)), hash(&self.grads_in(&head.params)));
                trace.outputs.push(hash(&losses));
                let din = self.traced_backward(&segments, kept, dh, (batch, seq), hash, &mut trace)?;
                trace.input_grads.push(head_hashes.0);
                trace.grads.push(head_hashes.1);
                Ok(MbTraced { trace, output: losses, din })
            }
            MbEnd::Grad(g) => {
                let output = self.be.to_host(&out);
                let dout = self.be.upload(g);
                let din = self.traced_backward(&segments, kept, dout, (batch, seq), hash, &mut trace)?;
                Ok(MbTraced { trace, output, din })
            }
        }
    }

    /// The backward of `kept`'s segments, last first, from `dout`; their
    /// hashes go into `trace` in segment order.
    fn traced_backward(
        &mut self,
        segments: &[Segment],
        kept: Vec<Kept<B>>,
        dout: B::Buf,
        (batch, seq): (usize, usize),
        hash: ValuesHash,
        trace: &mut MbTrace,
    ) -> Result<Option<Vec<f32>>, StageError> {
        let n = kept.len();
        let mut input_grads = vec![[0u8; 32]; n];
        let mut grads = vec![[0u8; 32]; n];
        let mut d = dout;
        for (i, k) in kept.into_iter().enumerate().rev() {
            let seg = segments.get(i).ok_or_else(|| self.role_err("trace a segment it does not have"))?;
            let din = self.segment_backward(seg.kind, k, d, batch, seq);
            input_grads[i] = hash(&din.as_ref().map(|b| self.be.to_host(b)).unwrap_or_default());
            grads[i] = hash(&self.grads_in(&seg.params));
            d = din.unwrap_or_else(|| self.be.zeros(0));
        }
        trace.input_grads = input_grads;
        trace.grads = grads;
        let first_takes_values = segments.first().is_some_and(|s| s.kind != SegmentKind::Embedding);
        Ok(first_takes_values.then(|| self.be.to_host(&d)))
    }

    /// The stage's gradients over `range`, on the host.
    fn grads_in(&self, range: &Range<usize>) -> Vec<f32> {
        let mut v = vec![0.0; range.len()];
        self.be.download(&self.grads, range.clone(), &mut v);
        v
    }

    /// One segment's forward.
    fn segment_forward(&self, kind: SegmentKind, x: Flow<B>, batch: usize, seq: usize) -> (Kept<B>, B::Buf) {
        let c: Ctx<B> = ctx!(self, batch, seq);
        let be = &*self.be;
        match (kind, x) {
            (SegmentKind::Embedding, Flow::Tokens(t)) => {
                let mut h = be.zeros(c.n() * self.cfg.d_model);
                let embed = self.embed.clone().unwrap_or_default();
                be.embedding(be.all_mut(&mut h), t, c.p(&embed), self.cfg.d_model);
                (Kept::Embedding(t.to_vec()), h)
            }
            (SegmentKind::Decode, Flow::Values(z)) => {
                let (acts, h) = decode_forward(&c, self.decode.as_ref().expect("a decoder segment"), z);
                (Kept::Decode(acts), h)
            }
            (SegmentKind::Block(n), Flow::Values(x)) => {
                let (acts, out) = block_forward(&c, &self.layers[n], x);
                (Kept::Block(acts), out)
            }
            (SegmentKind::Encode, Flow::Values(h)) => {
                let (acts, z) = encode_forward(&c, self.encode.as_ref().expect("an encoder segment"), &h);
                (Kept::Encode(acts, h), z)
            }
            // The callers pass tokens to the embedding only and never run
            // the LM head here (`lm_head`).
            _ => unreachable!("a segment given the wrong input"),
        }
    }

    /// One segment's backward from the gradient of its output: the
    /// gradient of its input (`None` for the embedding).
    fn segment_backward(
        &mut self,
        kind: SegmentKind,
        k: Kept<B>,
        dout: B::Buf,
        batch: usize,
        seq: usize,
    ) -> Option<B::Buf> {
        let c: Ctx<B> = ctx!(self, batch, seq);
        let be = &*self.be;
        match (kind, k) {
            (SegmentKind::Embedding, Kept::Embedding(tokens)) => {
                let embed = self.embed.clone().unwrap_or_default();
                be.embedding_bwd(be.view_mut(&mut self.grads, embed), be.all(&dout), &tokens, self.cfg.d_model);
                None
            }
            (SegmentKind::Decode, Kept::Decode(acts)) => {
                let idx = self.decode.as_ref().expect("a decoder segment");
                Some(decode_backward(&c, idx, &acts, &dout, &mut self.grads))
            }
            (SegmentKind::Block(n), Kept::Block(acts)) => {
                let mut dres = dout;
                block_backward(&c, &self.layers[n], &acts, &mut dres, &mut self.grads);
                Some(dres)
            }
            (SegmentKind::Encode, Kept::Encode(acts, h)) => {
                let idx = self.encode.as_ref().expect("an encoder segment");
                Some(encode_backward(&c, idx, &acts, &h, &dout, &mut self.grads))
            }
            _ => unreachable!("a segment's backward given another's activations"),
        }
    }

    /// The LM head's loss and backward (a tail's last segment).
    fn lm_head(
        &mut self,
        h: &B::Buf,
        targets: &[u32],
        loss_scale: f32,
        batch: usize,
        seq: usize,
    ) -> (Vec<f32>, B::Buf) {
        let c: Ctx<B> = ctx!(self, batch, seq);
        let n = c.n();
        let head = self.head.as_ref().expect("an LM head segment");
        let (losses, dh) = head_forward_backward(&c, head, h, targets, loss_scale / n as f32, Some(&mut self.grads));
        (losses, dh.expect("gradients were requested"))
    }

    fn check_end(&self, end: &MbEnd, batch: usize, seq: usize, width: usize) -> Result<(), StageError> {
        match end {
            MbEnd::Targets { targets, .. } => self.check_tail(targets, batch, seq),
            MbEnd::Grad(_) if self.spec.has_lm_head() => {
                Err(self.role_err("take an output gradient (it has the loss)"))
            }
            MbEnd::Grad(g) => check_values("output gradient", g, batch * seq * width),
        }
    }

    /// Segment `index` alone, on the stage's current weights: its forward
    /// from `input` and, with `end`, its backward (which the LM head always
    /// runs, from its targets), its parameter gradients accumulated into
    /// the stage's. Every length is checked (the values may come from a
    /// hostile proof).
    pub fn segment_run(
        &mut self,
        index: usize,
        input: StageInput,
        end: Option<MbEnd>,
        batch: usize,
        seq: usize,
    ) -> Result<SegmentOut, StageError> {
        let seg = self.segments().get(index).cloned().ok_or_else(|| self.role_err("run a segment it does not have"))?;
        if seq == 0 || seq > self.cfg.max_seq {
            return Err(StageError::SeqLen { seq, max: self.cfg.max_seq });
        }
        let n = batch * seq;
        let (win, wout) = self.segment_widths(seg.kind);
        let flow = match (seg.kind, input) {
            (SegmentKind::Embedding, StageInput::Tokens(t)) => {
                self.check_tokens("tokens", t, n)?;
                Flow::Tokens(t)
            }
            (SegmentKind::Embedding, StageInput::Hidden(_)) => return Err(self.role_err("embed values")),
            (_, StageInput::Tokens(_)) => return Err(self.role_err("take tokens into a segment past the embedding")),
            (_, StageInput::Hidden(h)) => {
                check_values("segment input", h, n * win)?;
                Flow::Values(self.be.upload(h))
            }
        };
        self.ensure_rope(seq);
        if seg.kind == SegmentKind::LmHead {
            let Some(MbEnd::Targets { targets, loss_scale }) = end else {
                return Err(self.role_err("run its LM head without targets"));
            };
            self.check_tail(targets, batch, seq)?;
            let Flow::Values(h) = flow else { return Err(self.role_err("embed values")) };
            let (losses, dh) = self.lm_head(&h, targets, loss_scale, batch, seq);
            return Ok(SegmentOut { output: losses, din: Some(self.be.to_host(&dh)) });
        }
        let (k, out) = self.segment_forward(seg.kind, flow, batch, seq);
        let output = self.be.to_host(&out);
        let din = match end {
            None => None,
            Some(MbEnd::Targets { .. }) => return Err(self.role_err("take targets into a segment but its LM head")),
            Some(MbEnd::Grad(g)) => {
                check_values("segment output gradient", g, n * wout)?;
                let d = self.segment_backward(seg.kind, k, self.be.upload(g), batch, seq);
                d.map(|d| self.be.to_host(&d))
            }
        };
        Ok(SegmentOut { output, din })
    }
}

/// The segments of the stage `spec` with parameters laid out as `layout`
/// (`ParamLayout::for_stage`), in forward order; their parameter ranges
/// tile its parameters. A referee needs no stage to know them.
pub fn segments_of(layout: &ParamLayout, spec: &StageSpec) -> Vec<Segment> {
    use SegmentKind as K;
    let mut s = Vec::new();
    if spec.has_embedding() {
        s.push(Segment { kind: K::Embedding, params: layout.range("model.embed_tokens.weight") });
    }
    if spec.decode_in {
        let d = DecodeIdx::new(layout, spec.layers.start);
        let end = d.mlp.as_ref().map_or(d.up.end, |m| m.down.end);
        s.push(Segment { kind: K::Decode, params: d.up.start..end });
    }
    for (n, layer) in spec.layers.clone().enumerate() {
        let li = LayerIdx::new(layout, layer);
        s.push(Segment { kind: K::Block(n), params: li.attn_norm.start..li.down.end });
    }
    if spec.encode_out {
        let e = EncodeIdx::new(layout, spec.layers.end.saturating_sub(1));
        let end = e.mlp.as_ref().map_or(e.down.end, |m| m.down.end);
        s.push(Segment { kind: K::Encode, params: e.norm.start..end });
    }
    if spec.has_lm_head() {
        let h = HeadIdx::new(layout);
        s.push(Segment { kind: K::LmHead, params: h.norm.start..h.lm.end });
    }
    s
}

/// `n` finite values.
fn check_values(what: &'static str, v: &[f32], n: usize) -> Result<(), StageError> {
    if v.len() != n {
        return Err(StageError::Shape { what, expected: n, got: v.len() });
    }
    if v.iter().any(|x| !x.is_finite()) {
        return Err(StageError::NonFinite(what));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
