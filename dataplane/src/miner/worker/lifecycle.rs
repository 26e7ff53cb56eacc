//! The stage worker's life across epochs: its assignment (building the
//! stage, refusing one its stated memory does not hold), the phases of each
//! epoch (training, upload, merge, done) and catching up on merged weights
//! it missed.

use std::sync::Arc;

use anyhow::{Context, Result};
use iota_core::commitment::Chain;
use iota_core::{PeerId, StageSpec};
use iota_model::optim::AdamW;
use iota_model::{Backend, Stage};
use iota_protocol::pb;
use tracing::{info, warn};

use super::super::events::Output;
use super::super::merge::load_announced;
use super::{StageDoesNotFit, Worker};

impl<B: Backend + 'static> Worker<B> {
    /// Loads the previous epoch's merged weights (as announced in `p`) if
    /// this replica does not hold them: it missed the merge, or joined late.
    pub(super) fn catch_up(&mut self, p: &pb::PhaseChange, out: &mut Vec<Output>) -> Result<()> {
        // The merge whose weights the epoch starts from (None: the seed's):
        // the previous epoch's, or an older one after a rollback.
        let want = p.weights_from.checked_sub(1);
        if self.weights_after == want {
            return Ok(());
        }
        let Some(s) = self.stage.as_mut() else { return Ok(()) };
        let params = match want {
            Some(e) => load_announced(&self.rt, &self.store, &p.weights, self.stage_index, s.layout(), e, out)?,
            None => {
                Stage::new(self.be.clone(), &self.cfg.train.model, s.spec().clone(), self.cfg.train.seed).params_host()
            }
        };
        s.set_params(&params)?;
        if want.is_none_or(|e| e.saturating_add(1) < p.epoch) {
            warn!(epoch = p.epoch, from = ?want, "rolled back: starting from older weights");
        }
        self.weights_after = want;
        info!(epoch = p.epoch, "loaded merged weights");
        Ok(())
    }

    /// Miners this one may exchange frames with (and where to dial them).
    pub(super) fn add_peers(&mut self, peers: &[pb::PeerInfo]) {
        for p in peers {
            let Ok(id) = <[u8; 32]>::try_from(p.peer_id.as_slice()) else { continue };
            let id = PeerId(id);
            if id != self.me {
                self.dir.insert(id, p.data_addr.parse().ok());
            }
        }
    }

    pub(super) fn assign(&mut self, a: pb::Assignment, out: &mut Vec<Output>) -> Result<()> {
        self.add_peers(&a.peers);
        if self.stage.is_some() && self.stage_index == a.stage {
            return Ok(());
        }
        use iota_core::memory_fit::Recompute;
        let mut recompute = self.recompute == Recompute::Always;
        if let Some((bytes, backend)) = self.memory {
            let t = &self.cfg.train;
            let needs = iota_core::memory_fit::RunMemoryNeeds::new(
                &t.model,
                t.stages,
                t.batch,
                t.seq,
                // As many as the orchestrator may route here (service.rs).
                self.cfg.spec.max_in_flight.clamp(1, 256) as usize,
                // AdamW and NAdam keep the same two moments; Muon those and
                // a step's scratch.
                iota_core::memory_plan::InnerOptimizer::of(&t.adamw),
            )?;
            needs.check(backend, a.stage as usize, bytes).map_err(StageDoesNotFit)?;
            if self.recompute == Recompute::Auto {
                recompute = needs.recomputes(backend, a.stage as usize, bytes);
            }
            // The bf16 copies (a cache) get what the stage leaves of the memory.
            let spec = StageSpec::split(&t.model, t.stages)?
                .into_iter()
                .nth(a.stage as usize)
                .context("assigned stage does not exist")?;
            // Fused attention saves less than the probabilities: the backend says.
            let m = &t.model;
            let dims = iota_model::backend::AttnDims {
                batch: t.batch,
                seq: t.seq,
                n_heads: m.n_heads,
                n_kv_heads: m.n_kv_heads,
                head_dim: m.head_dim(),
            };
            let fused = self.be.attention_saved_len(dims) != dims.probs_len();
            let w = iota_core::memory_plan::Workload::of(backend, t.batch, t.seq, self.cfg.spec.max_in_flight as usize)
                .recomputing(recompute)
                .fusing(fused);
            let (wb, ab) = iota_core::memory_plan::stage_memory(&t.model, &spec, &w).copy_limits(bytes);
            self.be.set_copy_limits(wb, ab);
            info!(
                weights_mib = wb >> 20,
                activations_mib = ab >> 20,
                "bf16 copies fitted to the memory beside the stage"
            );
        }
        self.startup.assigned();
        // A new stage starts its training phase afresh when told.
        self.training = None;
        let specs = StageSpec::split(&self.cfg.train.model, self.cfg.train.stages)?;
        let spec = specs.get(a.stage as usize).context("assigned stage does not exist")?.clone();
        let needs_data = spec.has_embedding() || spec.has_lm_head();
        // A stage that has trained (epoch > 0) starts from its merged
        // weights: load them first and build the stage from them, without
        // drawing initial weights only to overwrite them (at `1.5b` the
        // draw is the bulk of a joiner's start-up: 628M normals for a head).
        let t = std::time::Instant::now();
        let merged = if a.weights_key.is_empty() {
            None
        } else {
            let layout = iota_core::ParamLayout::for_stage(&self.cfg.train.model, &spec);
            // The stage's merged weights, as their writers announced them.
            let w =
                load_announced(&self.rt, &self.store, &a.weights, a.stage, &layout, self.epoch.saturating_sub(1), out)?;
            Some(w)
        };
        self.startup.weights += t.elapsed();
        let t = std::time::Instant::now();
        let mut stage = match &merged {
            Some(w) => Stage::with_params(self.be.clone(), &self.cfg.train.model, spec, w)?,
            None => Stage::new(self.be.clone(), &self.cfg.train.model, spec, self.cfg.train.seed),
        };
        self.startup.build += t.elapsed();
        if merged.is_some() {
            self.weights_after = Some(self.epoch.saturating_sub(1));
        }
        drop(merged);
        stage.set_max_in_flight(self.cfg.spec.max_in_flight as usize * 2 + 4);
        if recompute {
            stage.set_recompute(true);
            info!(
                policy = ?self.recompute,
                "recomputing activations in the backward: each held micro-batch keeps one residual per block \
                 (less memory, about a third more compute)"
            );
        }
        if self.cfg.train.adamw.predict_weights {
            stage.set_weight_prediction(Some(self.cfg.train.grad_accum));
        }
        self.optim = Some(AdamW::new(&*self.be, stage.layout().total()));
        if self.records_steps() {
            self.recorder.assigned(stage.layout().total());
        }
        self.stage = Some(stage);
        self.stage_index = a.stage;
        if needs_data && self.corpus.is_none() {
            let (data, cache) = (self.data.as_deref(), self.corpus_cache.as_deref());
            let t = std::time::Instant::now();
            let corpus = crate::corpus::load_run_corpus(&self.cfg, data, &*self.store, &self.rt, cache)?;
            self.corpus = Some(Arc::new(corpus));
            self.startup.corpus += t.elapsed();
        }
        self.startup.ready();
        info!(stage = a.stage, params = self.stage.as_ref().unwrap().layout().total(), "assigned");
        Ok(())
    }

    pub(super) fn phase(&mut self, p: pb::PhaseChange, out: &mut Vec<Output>) -> Result<()> {
        let phase = pb::Phase::try_from(p.phase).unwrap_or(pb::Phase::Unspecified);
        match phase {
            pb::Phase::Training => {
                // A repeat (an orchestrator restarted from saved state says
                // where the run stands) must not restart the epoch: it would
                // drop the accumulation and move the merge's reference point.
                if self.training == Some(p.epoch) {
                    // Sent again when the merge behind this training is re-planned.
                    return self.merge_behind(&p, out);
                }
                self.epoch = p.epoch;
                // The previous epoch's merge may run behind this training:
                // its slices keep coming.
                let oldest = if self.cfg.spec.merge.overlap { p.epoch.saturating_sub(1) } else { p.epoch };
                self.ctx.set_epoch_window(oldest as u32, p.epoch as u32);
                self.routes.retain(|k, _| k.0 == p.epoch);
                self.early.retain(|(k, _)| k.0 == p.epoch);
                self.work = 0;
                self.accumulated = 0;
                if let Some(s) = self.stage.as_mut() {
                    s.zero_grads();
                }
                self.catch_up(&p, out)?;
                if let Some(s) = self.stage.as_ref() {
                    let params = s.params_host();
                    if self.cfg.spec.merge.overlap {
                        // The merge's reference point is set when the epoch
                        // ends (landing): the merge of the previous epoch
                        // may still be running.
                        self.overlap_started = Some(params.clone());
                    } else {
                        self.merge.epoch_started(p.epoch, self.stage_index, &params);
                    }
                    // The previous epoch's evidence goes: its requests came
                    // in its Uploading phase. Only validators ask for it.
                    if !self.cfg.spec.validation.validators.is_empty() {
                        let carried = if self.records_steps() { self.begin_steps(p.epoch, &params) } else { None };
                        self.evidence.begin(p.epoch, self.stage_index, params);
                        if let Some((h, before)) = carried {
                            self.evidence.carry(p.epoch, h, before);
                        }
                    }
                }
                if let Some(sent) = &self.sent {
                    sent.forget_before(p.epoch);
                }
                // Only now: a repeat after a failed weights fetch tries again.
                self.training = Some(p.epoch);
                self.merge_behind(&p, out)?;
            }
            pb::Phase::Uploading => {
                self.training = None;
                // The weights chain as the UploadDone below commits it.
                self.evidence.seal(p.epoch);
                // Peers may start the next epoch before our Training command
                // is processed: accept its frames from now on (held until routed).
                self.ctx.set_epoch_window(p.epoch as u32, p.epoch as u32 + 1);
                let Some(s) = self.stage.as_mut() else { return Ok(()) };
                // A partial accumulation at the epoch's end is dropped, not applied.
                s.zero_grads();
                self.accumulated = 0;
                let params = if self.cfg.spec.merge.overlap { self.land(&p, out)? } else { s.params_host() };
                let Some(s) = self.stage.as_mut() else { return Ok(()) };
                let from = out.len();
                // The contribution is bound to the weights chain (behind
                // compute it is the landed weights', which no chain has).
                let v = &self.cfg.spec.validation;
                if !v.validators.is_empty() && v.bind_contributions && !self.cfg.spec.merge.overlap {
                    let items = self.evidence.step_hashes(p.epoch).map(<[_]>::to_vec).unwrap_or_default();
                    self.merge.bind(items);
                }
                self.merge.contribute(p.epoch, self.stage_index, s.layout(), &params, self.work, out)?;
                if let Some(h) = self.merge.backlog_hash(p.epoch) {
                    self.commitments.lock().backlog(p.epoch, h);
                }
                // The upload carries the epoch's final heads: its training
                // frames and inner steps are all behind it.
                let heads = iota_protocol::commitments_pb::to_pb(&self.commitments.lock().heads());
                for o in &mut out[from..] {
                    if let Output::Report(pb::report::Kind::UploadDone(u)) = o {
                        u.commitments = heads.clone();
                    }
                }
            }
            pb::Phase::Merging => {
                if let Some(s) = self.stage.as_ref() {
                    self.merge.merging(&p, self.stage_index, s.layout(), out)?;
                    self.take_merged()?;
                }
            }
            pb::Phase::Done => {
                self.done = true;
                self.catch_up(&p, out)?;
            }
            pb::Phase::Waiting | pb::Phase::Unspecified => {}
        }
        Ok(())
    }
}

impl<B: Backend + 'static> Worker<B> {
    /// `epoch`'s steps chain starts, on `params`: led by the record of the
    /// last step this miner took on its stage, committed once however
    /// often the epoch's training restarts, and returned with the chain it
    /// ended (for the evidence log). A miner whose last record is not on
    /// the epoch before's chain (it sat an epoch out) restarts its
    /// optimizer: nothing it could show links that state to its record.
    fn begin_steps(&mut self, epoch: u64, params: &[f32]) -> Option<(iota_checks::inner_step::StepHeader, Chain)> {
        let (carried, lost) = self.recorder.epoch_started(epoch, super::weights_hash(params));
        if lost {
            warn!(epoch, "sat an epoch out: its optimizer state restarts");
            self.optim = Some(AdamW::new(&*self.be, params.len()));
            self.recorder.assigned(params.len());
        }
        let mut c = self.commitments.lock();
        if c.steps_of(epoch).len > 0 {
            return None;
        }
        let (header, before) = carried?;
        c.step(epoch, &header.hash());
        drop(c);
        self.recorder.carried(epoch);
        Some((header, before))
    }

    /// The merge behind compute: a Training phase that carries the previous
    /// epoch's merge plan starts (or re-plans) that merge; training goes on.
    fn merge_behind(&mut self, p: &pb::PhaseChange, out: &mut Vec<Output>) -> Result<()> {
        if !self.cfg.spec.merge.overlap || p.merge_plan.is_none() {
            return Ok(());
        }
        let Some(s) = self.stage.as_ref() else { return Ok(()) };
        self.merge.merging(p, self.stage_index, s.layout(), out)?;
        self.take_merged()
    }

    /// A merge's result with the merge behind compute: held while training
    /// (landed when the epoch ends), applied when it is the synchronous
    /// merge of the run's last epoch, dropped otherwise (a merge this
    /// replica was planned out of finishing late).
    pub(super) fn merged_behind_compute(&mut self, epoch: u64, params: Vec<f32>) -> Result<()> {
        if self.training.is_some() {
            self.overlap_held = Some((epoch, params));
        } else if epoch == self.epoch
            && let Some(s) = self.stage.as_mut()
        {
            s.set_params(&params)?;
            self.weights_after = Some(epoch);
        } else {
            warn!(epoch, at = self.epoch, "a late merge result dropped");
        }
        Ok(())
    }

    /// Lands the previous epoch's merge as this epoch ends (the Uploading
    /// phase `p`): the weights become the merged ones plus what this
    /// replica trained since its epoch started, and the merge of this
    /// epoch starts from the merged ones (so its contribution is exactly
    /// the epoch's own progress). Returns the landed weights.
    fn land(&mut self, p: &pb::PhaseChange, out: &mut Vec<Output>) -> Result<Vec<f32>> {
        let Some(s) = self.stage.as_ref() else { anyhow::bail!("no stage to land a merge on") };
        let own = s.params_host();
        // A replica that never saw this epoch start contributes nothing.
        let started = self.overlap_started.take().unwrap_or_else(|| own.clone());
        let want = p.weights_from.checked_sub(1);
        let held = self.overlap_held.take();
        // (the merge's reference point, the landed weights): nothing to
        // land when the epoch started from the merge it would land.
        let (base, landed) = match (want, held) {
            (None, _) => (started, own),
            (Some(e), Some((h, w))) if h == e && w.len() == own.len() => {
                let landed = land_on(&w, &own, &started)?;
                (w, landed)
            }
            // Loaded at this epoch's start (it joined, or missed a merge).
            (Some(e), _) if self.weights_after == Some(e) => (started, own),
            (Some(e), _) => {
                info!(epoch = p.epoch, merge = e, "loading the merged weights to land on");
                let w = load_announced(&self.rt, &self.store, &p.weights, self.stage_index, s.layout(), e, out)?;
                let landed = land_on(&w, &own, &started)?;
                (w, landed)
            }
        };
        if let Some(s) = self.stage.as_mut() {
            s.set_params(&landed)?;
        }
        self.weights_after = want;
        self.merge.epoch_started(p.epoch, self.stage_index, &base);
        Ok(landed)
    }
}

/// The landed weights: `merged` plus what the replica trained since its
/// epoch started (`own` - `started`).
fn land_on(merged: &[f32], own: &[f32], started: &[f32]) -> Result<Vec<f32>> {
    anyhow::ensure!(
        merged.len() == own.len() && started.len() == own.len(),
        "merged weights of {} values for a stage of {}",
        merged.len(),
        own.len()
    );
    Ok(merged.iter().zip(own).zip(started).map(|((m, o), s0)| m + (o - s0)).collect())
}
