//! A peer's frame through the stage: accepted (its route, its sender, its
//! shape), then the tail's forward and backward, a forward, or a backward.
// A peer's frame: no unchecked arithmetic or indexing.
#![cfg_attr(not(test), deny(clippy::arithmetic_side_effects, clippy::indexing_slicing))]

use std::sync::atomic::Ordering;

use anyhow::{Context, Result, bail};
use iota_core::wire::Direction;
use iota_model::{Backend, codec};
use iota_protocol::pb;
use tracing::{debug, warn};

use super::{MAX_EARLY, Worker, mb_key, stage_key};
use crate::frame;
use crate::miner::events::Output;
use crate::miner::evidence_log::MbKey;
use crate::sent_frames::SentFrameKey;
use crate::transport::ReceivedFrame;

/// A frame accepted for compute: where it stands on its pathway, its data
/// on the backend, and what its evidence needs.
struct Accepted<B: Backend> {
    key: MbKey,
    route: pb::Route,
    direction: Direction,
    /// The neighbours on this pathway (None: this is the head, the tail).
    prev: Option<Vec<u8>>,
    next: Option<Vec<u8>>,
    batch: usize,
    seq: usize,
    rows: usize,
    width: usize,
    /// The whole input frame, for the evidence of this forward (and a
    /// middle stage's received gradient, for that of its backward).
    input_frame: Option<Vec<u8>>,
    /// What this miner's next frame for the micro-batch answers: the
    /// forward frame it came in (a gradient answers the activation it is
    /// the gradient of).
    answers: [u8; 32],
    data: B::Buf,
    /// A copying adversary keeps the input's values to pass on.
    copied: Option<Vec<f32>>,
}

impl<B: Backend + 'static> Worker<B> {
    pub(super) fn frame(&mut self, f: ReceivedFrame, out: &mut Vec<Output>) -> Result<()> {
        let Some(a) = self.accept_frame(f)? else { return Ok(()) };
        match (a.direction, a.next.is_none()) {
            (Direction::Activation, true) => self.tail_step(a, out),
            (Direction::Activation, false) => self.forward_step(a, out),
            (Direction::ActivationGrad, _) => self.backward_step(a, out),
            _ => Ok(()),
        }
    }

    /// The frame checked against its route (held back when the route has
    /// not come yet), its sender and its shape, and decoded onto the
    /// backend; None: held back or dropped.
    fn accept_frame(&mut self, f: ReceivedFrame) -> Result<Option<Accepted<B>>> {
        let h = &f.header;
        let key = mb_key(h.epoch as u64, h.shard, h.first_sample, h.attempt);
        let Some(r) = self.routes.get(&key).cloned() else {
            if h.epoch as u64 >= self.epoch {
                if self.early.len() >= MAX_EARLY {
                    self.early.pop_front();
                    self.rejected_frames = self.rejected_frames.saturating_add(1);
                }
                self.early.push_back((key, f));
            }
            return Ok(None);
        };
        let s = self.stage_index as usize;
        // The neighbours on this pathway (the route's length was checked
        // against the stage count when it arrived).
        let prev = s.checked_sub(1).and_then(|i| r.pathway.get(i)).cloned();
        let next = s.checked_add(1).and_then(|i| r.pathway.get(i)).cloned();
        let from_expected = match h.direction {
            Direction::Activation => prev.as_deref() == Some(&f.peer.0[..]),
            Direction::ActivationGrad => next.as_deref() == Some(&f.peer.0[..]),
            _ => false,
        };
        if !from_expected || h.codec != self.cfg.train.codec.id() {
            self.rejected_frames = self.rejected_frames.saturating_add(1);
            debug!(peer = %f.peer, "frame not from the pathway neighbour (or wrong codec); dropped");
            return Ok(None);
        }
        let (batch, seq) = (r.samples as usize, self.cfg.train.seq);
        let width = self.stage.as_ref().context("frame before assignment")?.boundary_width();
        let rows = batch.checked_mul(seq).context("micro-batch size overflows")?;
        if h.dims() != [rows as u32, width as u32] {
            self.rejected_frames = self.rejected_frames.saturating_add(1);
            bail!("frame shape {:?}, expected [{rows}, {width}]", h.dims());
        }
        let direction = h.direction;
        let mut input_frame = None;
        let whole = |f: &ReceivedFrame| {
            let mut whole = frame::prefix_bytes(&f.header);
            whole.extend_from_slice(&f.payload);
            whole
        };
        if direction == Direction::Activation {
            self.tokens.fetch_add(rows as u64, Ordering::Relaxed);
            self.inbound.insert(key, h.frame_id());
            if self.evidence.wants_input(key.0) {
                input_frame = Some(whole(&f));
            }
        } else {
            if !self.answers_what_it_sent(key, h) {
                self.rejected_frames = self.rejected_frames.saturating_add(1);
                warn!(peer = %f.peer, "gradient answering a frame this miner did not send; dropped");
                return Ok(None);
            }
            if self.evidence.wants_backward(key) {
                input_frame = Some(whole(&f));
            }
        }
        let answers = self.inbound.get(&key).copied().unwrap_or([0; 32]);
        // Straight from the pool buffer onto the backend (on a GPU: one
        // asynchronous copy of the wire bytes, decoded on the device).
        let data = self.be.decode_wire(self.cfg.train.codec, rows, width, &f.payload)?;
        let copied = match self.tamper.as_ref() {
            Some(t) if t.copies() => codec::decode(self.cfg.train.codec, rows, width, &f.payload).ok(),
            _ => None,
        };
        drop(f); // the pool buffer goes back before the compute
        Ok(Some(Accepted {
            key,
            route: r,
            direction,
            prev,
            next,
            batch,
            seq,
            rows,
            width,
            input_frame,
            answers,
            data,
            copied,
        }))
    }

    /// The tail: the loss, then the gradient goes back at once.
    fn tail_step(&mut self, a: Accepted<B>, out: &mut Vec<Output>) -> Result<()> {
        let (key, r) = (a.key, &a.route);
        let (_, y) = self.tokens(r)?;
        let k = self.cfg.train.grad_accum as f32;
        let t = self.stage.as_mut().unwrap().forward_backward_buf(a.data, &y, a.batch, a.seq, 1.0 / k)?;
        self.drop_weight_grads_if_lazy();
        self.report_loss(r, &t.losses, out);
        let mut g = t.din.context("tail of a split model returns an input gradient")?;
        if let Some(t) = self.tamper.as_mut() {
            t.activations(key, &mut g);
            match t.stale_gradient(g.len()) {
                Some(stale) => g = stale,
                None => t.sent_gradient(&g),
            }
        }
        let meta = self.frame_meta(r, Direction::ActivationGrad, a.rows, a.width, a.answers);
        self.send(a.prev.as_deref().context("no stage before")?, meta, &g, out)?;
        // With the weights it computed with (before the step below).
        self.evidence.forward(key, a.input_frame, Direction::ActivationGrad);
        self.routes.remove(&key);
        self.finished_one(key, a.route.samples, a.prev.as_deref(), None)
    }

    /// A forward of a stage before the tail, sent on to the next.
    fn forward_step(&mut self, a: Accepted<B>, out: &mut Vec<Output>) -> Result<()> {
        let stage = self.stage.as_mut().unwrap();
        let mut h2 = stage.forward_buf(stage_key(&a.key), a.data, a.batch, a.seq)?;
        let w2 = stage.boundary_width();
        if let Some(t) = self.tamper.as_mut() {
            t.activations(a.key, &mut h2);
        }
        if let Some(c) = a.copied.filter(|c| c.len() == h2.len()) {
            h2 = c;
        }
        let meta = self.frame_meta(&a.route, Direction::Activation, a.rows, w2, a.answers);
        self.send(a.next.as_deref().context("no stage after")?, meta, &h2, out)?;
        self.evidence.forward(a.key, a.input_frame, Direction::Activation);
        if self.records_steps() {
            self.recorder.forwarded(a.key);
        }
        Ok(())
    }

    /// A backward: the gradient goes on to the stage before (the head has
    /// none to send and reports the micro-batch done).
    fn backward_step(&mut self, a: Accepted<B>, out: &mut Vec<Output>) -> Result<()> {
        let (key, r) = (a.key, &a.route);
        // A lazy middle stage skips its backward and sends a stale
        // gradient (a head has none to send: it computes).
        let stale = self
            .tamper
            .as_ref()
            .filter(|_| a.prev.is_some())
            .and_then(|t| t.stale_gradient(a.rows.saturating_mul(a.width)));
        // A head skipping its whole backward (a test tool) only drops it.
        let skip_head = a.prev.is_none() && self.tamper.as_ref().is_some_and(|t| t.skips_head_backward());
        let din = match stale {
            Some(g) => {
                self.stage.as_mut().unwrap().discard(stage_key(&key));
                Some(g)
            }
            None if skip_head => {
                self.stage.as_mut().unwrap().discard(stage_key(&key));
                None
            }
            None => {
                let din = self.stage.as_mut().unwrap().backward_buf(stage_key(&key), a.data)?;
                self.drop_weight_grads_if_lazy();
                din
            }
        };
        self.routes.remove(&key);
        match din {
            Some(mut g) => {
                if let Some(t) = self.tamper.as_mut() {
                    t.upstream_gradient(key, &mut g);
                    t.sent_gradient(&g);
                }
                let meta = self.frame_meta(r, Direction::ActivationGrad, a.rows, a.width, a.answers);
                self.send(a.prev.as_deref().context("no stage before")?, meta, &g, out)?;
                // With the weights it ran on (before the step below).
                if let Some(received) = a.input_frame {
                    self.evidence.backward(key, received);
                }
            }
            None => {
                // The head: the gradient that answered its output.
                if let Some(received) = a.input_frame {
                    self.evidence.backward(key, received);
                }
                out.push(Output::Report(pb::report::Kind::BackwardDone(pb::BackwardDone {
                    epoch: r.epoch,
                    shard: r.shard,
                    first_sample: r.first_sample,
                    attempt: r.attempt,
                })))
            }
        }
        self.finished_one(key, r.samples, a.prev.as_deref(), a.next.as_deref())
    }

    /// `SkipWeightGrad` (a test tool) keeps none of a backward's weight
    /// gradient: acted out by dropping what the backward accumulated (the
    /// adversary drops every one, so nothing else is lost with it).
    fn drop_weight_grads_if_lazy(&mut self) {
        if self.tamper.as_ref().is_some_and(|t| t.skips_weight_grads())
            && let Some(s) = self.stage.as_mut()
        {
            s.zero_grads();
        }
    }

    /// Whether gradient frame `h` answers the activation this miner sent
    /// for attempt `key`, where its endpoint recorded that frame (it does
    /// when validators may ask for evidence). A gradient that answers
    /// anything else would fail this miner's evidence for the attempt
    /// (link 5: the gradient it received answers its output), so a hostile
    /// neighbour could frame it: such a gradient is refused, not trained
    /// on, and the attempt times out and is re-routed. A miner faking its
    /// evidence (a test tool) takes whatever comes.
    fn answers_what_it_sent(&self, key: MbKey, h: &iota_core::wire::FrameHeader) -> bool {
        if self.tamper.as_ref().is_some_and(|t| t.shows_other_frames()) {
            return true;
        }
        let Some(sent) = self.sent.as_ref() else { return true };
        let (epoch, shard, first_sample, attempt) = key;
        let k = SentFrameKey { epoch, shard, first_sample, attempt, direction: Direction::Activation };
        sent.get(&k).is_none_or(|f| f.header.frame_id() == h.answers)
    }
}
