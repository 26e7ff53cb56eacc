//! A `StepProof`'s bytes (what a verdict carries to its referee), read as
//! hostile: every count is bounded by the stage's shape before anything
//! is allocated, and nothing panics.

// Hostile bytes: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use anyhow::{Result, bail, ensure};

use super::proof::{Claimed, Disputed, ProofEnd, ProofInput, SegmentProof};
use super::prove::{Dispute, StepProof};
use super::record::{MbFrames, Reader, StepHeader};
use super::step_trace::{LeafProof, NormProof};
use crate::hashes::{WEIGHTS_LEAF, WeightsWitness};

const DOMAIN: &[u8] = b"iota-rs step proof v1";

/// Bounds on a proof read from the wire (from the run's shape).
#[derive(Clone, Copy, Debug)]
pub struct ProofLimits {
    /// The stage's weight count.
    pub weights: u64,
    /// Most values of one micro-batch's activations or gradients at any
    /// segment boundary, and most tokens.
    pub activations: u64,
    /// Most records (the epoch's steps, plus a carried one).
    pub max_headers: u64,
    /// Most micro-batches of a step.
    pub max_mbs: u64,
    pub max_frame: u64,
    /// Most bytes of a trace.
    pub max_trace: u64,
}

struct Writer(Vec<u8>);

// Our own bytes: sizes of vectors in memory.
#[allow(clippy::arithmetic_side_effects)]
impl Writer {
    fn u32(&mut self, x: u32) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn f32s(&mut self, v: &[f32]) {
        self.len(v.len());
        v.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn u32s(&mut self, v: &[u32]) {
        self.len(v.len());
        v.iter().for_each(|x| self.0.extend_from_slice(&x.to_le_bytes()));
    }
    fn witness(&mut self, w: &WeightsWitness) {
        self.u64(w.n);
        self.len(w.leaves.len());
        w.leaves.iter().for_each(|l| self.0.extend_from_slice(l));
        self.u64(w.first_leaf);
        self.f32s(&w.values);
    }
    fn frames(&mut self, f: &MbFrames) {
        self.bytes(&f.input);
        self.0.extend_from_slice(&f.input_signer);
        self.bytes(&f.grad);
        self.0.extend_from_slice(&f.grad_signer);
    }
}

impl Reader<'_> {
    fn values(&mut self, max: u64) -> Result<Vec<f32>> {
        let n = self.count(max, 4)?;
        self.f32s(n)
    }
    fn tokens(&mut self, max: u64) -> Result<Vec<u32>> {
        let n = self.count(max, 4)?;
        (0..n).map(|_| self.u32()).collect()
    }
    fn witness(&mut self, weights: u64) -> Result<WeightsWitness> {
        let n = self.u64()?;
        ensure!(n <= weights, "a witness of {n} weights, the stage has {weights}");
        let count = self.count(n.div_ceil(WEIGHTS_LEAF as u64), 32)?;
        let leaves = (0..count).map(|_| self.h32()).collect::<Result<Vec<_>>>()?;
        let first_leaf = self.u64()?;
        let values = self.values(n)?;
        Ok(WeightsWitness { n, leaves, first_leaf, values })
    }
    fn frames(&mut self, max_frame: u64) -> Result<MbFrames> {
        Ok(MbFrames {
            input: self.bytes(max_frame)?,
            input_signer: self.h32()?,
            grad: self.bytes(max_frame)?,
            grad_signer: self.h32()?,
        })
    }
}

impl StepProof {
    // Our own bytes: sizes of vectors in memory.
    #[allow(clippy::arithmetic_side_effects)]
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer(DOMAIN.to_vec());
        w.u64(self.epoch);
        w.u32(self.step);
        w.len(self.headers.len());
        self.headers.iter().for_each(|h| w.0.extend_from_slice(&h.encode()));
        w.u32(u32::from(self.carried));
        w.bytes(&self.trace);
        w.0.extend_from_slice(&self.signature);
        match &self.dispute {
            Dispute::Segment { proof: p, frames } => {
                w.u32(0);
                w.len(p.at.mb);
                w.len(p.at.segment);
                w.u32(u32::from(p.at.backward));
                w.u32(p.samples);
                w.u32(p.seq);
                match &p.input {
                    ProofInput::Tokens(t) => {
                        w.u32(0);
                        w.u32s(t);
                    }
                    ProofInput::Values(v) => {
                        w.u32(1);
                        w.f32s(v);
                    }
                }
                match &p.end {
                    ProofEnd::None => w.u32(0),
                    ProofEnd::Grad(g) => {
                        w.u32(1);
                        w.f32s(g);
                    }
                    ProofEnd::Targets { targets, loss_scale } => {
                        w.u32(2);
                        w.u32s(targets);
                        w.u32(loss_scale.to_bits());
                    }
                }
                w.witness(&p.weights);
                w.f32s(&p.grads_before);
                for h in [&p.claimed.output, &p.claimed.input_grad, &p.claimed.grads] {
                    w.0.extend_from_slice(h);
                }
                w.frames(frames);
            }
            Dispute::Norm(n) => {
                w.u32(1);
                w.u32(n.segment);
                w.f32s(&n.grads);
            }
            Dispute::Leaf(l) => {
                w.u32(2);
                w.u64(l.leaf);
                w.u64(l.range.start);
                w.u64(l.range.end);
                for x in [&l.weights, &l.m, &l.v] {
                    w.witness(x);
                }
                w.len(l.grads.len());
                for (k, x) in &l.grads {
                    w.u32(*k);
                    w.witness(x);
                }
            }
        }
        w.0
    }

    pub fn decode(bytes: &[u8], l: ProofLimits) -> Result<StepProof> {
        let mut r = Reader { b: bytes, at: 0 };
        ensure!(r.take(DOMAIN.len())? == DOMAIN, "not a step proof");
        let (epoch, step) = (r.u64()?, r.u32()?);
        let n = r.count(l.max_headers, 8)?;
        let headers = (0..n).map(|_| StepHeader::read(&mut r, l.max_mbs)).collect::<Result<Vec<_>>>()?;
        let carried = match r.u32()? {
            0 => false,
            1 => true,
            x => bail!("carried flag {x}"),
        };
        let trace = r.bytes(l.max_trace)?;
        let signature: [u8; 64] = r.take(64)?.try_into()?;
        let dispute = match r.u32()? {
            0 => read_segment(&mut r, l)?,
            1 => Dispute::Norm(NormProof { segment: r.u32()?, grads: r.values(l.weights)? }),
            2 => {
                let leaf = r.u64()?;
                let range = r.u64()?..r.u64()?;
                let (weights, m, v) = (r.witness(l.weights)?, r.witness(l.weights)?, r.witness(l.weights)?);
                // A range meets a few segments: at most one per 2 values.
                let parts = r.count(l.weights.min(64), 4)?;
                let grads = (0..parts).map(|_| Ok((r.u32()?, r.witness(l.weights)?))).collect::<Result<Vec<_>>>()?;
                Dispute::Leaf(LeafProof { leaf, range, weights, m, v, grads })
            }
            x => bail!("dispute kind {x}"),
        };
        r.done()?;
        Ok(StepProof { epoch, step, headers, carried, trace, signature, dispute })
    }
}

fn read_segment(r: &mut Reader, l: ProofLimits) -> Result<Dispute> {
    let mb = usize::try_from(r.u64()?)?;
    let segment = usize::try_from(r.u64()?)?;
    ensure!((mb as u64) < l.max_mbs.max(1), "micro-batch {mb} of a step");
    let backward = match r.u32()? {
        0 => false,
        1 => true,
        x => bail!("backward flag {x}"),
    };
    let (samples, seq) = (r.u32()?, r.u32()?);
    let input = match r.u32()? {
        0 => ProofInput::Tokens(r.tokens(l.activations)?),
        1 => ProofInput::Values(r.values(l.activations)?),
        x => bail!("input kind {x}"),
    };
    let end = match r.u32()? {
        0 => ProofEnd::None,
        1 => ProofEnd::Grad(r.values(l.activations)?),
        2 => ProofEnd::Targets { targets: r.tokens(l.activations)?, loss_scale: f32::from_bits(r.u32()?) },
        x => bail!("end kind {x}"),
    };
    let weights = r.witness(l.weights)?;
    let grads_before = r.values(l.weights)?;
    let claimed = Claimed { output: r.h32()?, input_grad: r.h32()?, grads: r.h32()? };
    let frames = r.frames(l.max_frame)?;
    let at = Disputed { mb, segment, backward };
    let proof = SegmentProof { at, samples, seq, input, end, weights, grads_before, claimed };
    Ok(Dispute::Segment { proof, frames })
}

/// A proof's dispute kind, for logs.
pub fn dispute_name(d: &Dispute) -> &'static str {
    match d {
        Dispute::Segment { proof, .. } if proof.at.backward => "a segment's backward",
        Dispute::Segment { .. } => "a segment's forward",
        Dispute::Norm(_) => "a segment's squared gradient norm",
        Dispute::Leaf(_) => "a leaf after the optimizer step",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ProofLimits {
        ProofLimits {
            weights: 40_000,
            activations: 4096,
            max_headers: 8,
            max_mbs: 2,
            max_frame: 1 << 16,
            max_trace: 1 << 20,
        }
    }

    fn proofs() -> Vec<StepProof> {
        let w = (0..40_000).map(|i| i as f32 * 1e-3).collect::<Vec<f32>>();
        let wit = WeightsWitness::of(&w, 100..200);
        let h = StepHeader { step: 3, mbs: vec![], ..Default::default() };
        let base = StepProof {
            epoch: 2,
            step: 1,
            headers: vec![h.clone(), h],
            carried: true,
            trace: vec![7; 99],
            signature: [5; 64],
            dispute: Dispute::Norm(NormProof { segment: 3, grads: vec![0.5; 10] }),
        };
        let leaf = LeafProof {
            leaf: 0,
            range: 0..16_384,
            weights: wit.clone(),
            m: wit.clone(),
            v: wit.clone(),
            grads: vec![(0, wit.clone()), (1, wit.clone())],
        };
        let seg = SegmentProof {
            at: Disputed { mb: 1, segment: 2, backward: true },
            samples: 2,
            seq: 16,
            input: ProofInput::Tokens(vec![1, 2, 3]),
            end: ProofEnd::Targets { targets: vec![4, 5], loss_scale: 0.5 },
            weights: wit,
            grads_before: vec![1.0; 7],
            claimed: Claimed { output: [1; 32], input_grad: [2; 32], grads: [3; 32] },
        };
        let frames = MbFrames { input: vec![9; 10], input_signer: [8; 32], grad: vec![], grad_signer: [0; 32] };
        vec![
            base.clone(),
            StepProof { dispute: Dispute::Leaf(leaf), ..base.clone() },
            StepProof { dispute: Dispute::Segment { proof: seg, frames }, ..base },
        ]
    }

    #[test]
    fn proofs_round_trip_and_hostile_bytes_are_refused() {
        for p in proofs() {
            let b = p.encode();
            assert_eq!(StepProof::decode(&b, limits()).unwrap(), p);
            for cut in [0, 20, b.len() / 3, b.len() / 2, b.len() - 1] {
                assert!(StepProof::decode(&b[..cut], limits()).is_err(), "{}: cut at {cut}", dispute_name(&p.dispute));
            }
            let mut longer = b.clone();
            longer.push(1);
            assert!(StepProof::decode(&longer, limits()).is_err(), "bytes after the end");
            let small = ProofLimits { weights: 9, activations: 1, ..limits() };
            assert!(StepProof::decode(&b, small).is_err(), "past the stage's shape");
            // Every byte flipped somewhere: refused or read, never a panic.
            for at in (0..b.len()).step_by(7) {
                let mut x = b.clone();
                x[at] ^= 0xA5;
                let _ = StepProof::decode(&x, limits());
            }
        }
    }
}
