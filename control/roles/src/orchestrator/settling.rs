//! An epoch's settlement: the validators' weights (or, in a run without
//! validators, the operator's count of credited work) go through Yuma
//! consensus with the validators' stakes and the bonds so far; the result
//! is kept for the ledger (written, signed, by the service's state
//! database) and its bonds carried to the next epoch.

use std::collections::HashMap;

use iota_core::PeerId;
use tracing::{info, warn};

use super::state::{MAX_RECENT_SETTLEMENTS, MAX_UNWRITTEN_SETTLEMENTS, MinerEpoch, PayoutRow};
use super::{MbStatus, Orchestrator};
use crate::settlement::clasp::Clasp;
use crate::settlement::ledger::{ClaspLine, NO_INCENTIVE, Settlement, to_hex, widen};
use crate::settlement::scores::clasp_params;
use crate::settlement::yuma::{self, YumaInput, YumaParams};

/// The operator's stand-in identity before the service names it (tests).
const UNNAMED_OPERATOR: PeerId = PeerId([0; 32]);

impl Orchestrator {
    /// Names the operator (the service's identity): the rater of a run
    /// without validators.
    pub fn set_operator(&mut self, operator: PeerId) {
        self.settlement.operator = Some(operator);
    }

    /// The latest settled epochs, oldest first (all of them are in the
    /// ledger).
    pub fn settlements(&self) -> &[Settlement] {
        &self.settlement.recent
    }

    /// The state database wrote every settlement up to `epoch` to its
    /// ledger: those may now leave the state.
    pub fn settlements_written(&mut self, epoch: u64) {
        self.settlement.written_through = self.settlement.written_through.max(Some(epoch));
    }

    /// Emission paid so far per identity.
    pub fn balances(&self) -> &std::collections::BTreeMap<PeerId, f64> {
        &self.settlement.balances
    }

    /// Every miner settlement knows of: its work, verdicts, last weight and
    /// incentive, and what it was paid over the run (most paid first).
    /// One pass over the history, the verdicts and the last settlement
    /// (the Status RPC, open to anyone, answers with it).
    pub fn payout_table(&self) -> Vec<PayoutRow> {
        let last = self.settlement.recent.last();
        let mut work: HashMap<PeerId, (u64, u64)> = HashMap::new();
        for m in self.history.iter().flat_map(|e| &e.miners) {
            let w = work.entry(m.peer).or_default();
            w.0 += m.completed;
            w.1 += u64::from(m.convicted);
        }
        let mut guilty: HashMap<PeerId, u64> = HashMap::new();
        for v in self.validation.verdicts.iter().filter(|v| v.guilty) {
            *guilty.entry(v.miner).or_default() += 1;
        }
        let clasp: HashMap<PeerId, f64> =
            last.map(|s| s.clasp.iter().map(|l| (l.peer, l.effect)).collect()).unwrap_or_default();
        let mut rows: Vec<PayoutRow> = self
            .settlement
            .miners
            .iter()
            .enumerate()
            .map(|(c, p)| {
                let (completed, convictions) = work.get(p).copied().unwrap_or_default();
                let at = |v: Option<&Vec<f64>>| v.and_then(|v| v.get(c)).copied().unwrap_or(0.0);
                let last_col = last.filter(|s| s.miners.get(c) == Some(p));
                PayoutRow {
                    peer: *p,
                    stage: self.miners.get(p).map_or(0, |m| m.stage),
                    completed,
                    guilty_votes: guilty.get(p).copied().unwrap_or(0),
                    convictions,
                    weight: at(last_col.map(|s| &s.output.consensus)),
                    incentive: at(last_col.map(|s| &s.output.incentive)),
                    clasp_effect: clasp.get(p).copied(),
                    emission: self.settlement.balances.get(p).copied().unwrap_or(0.0),
                }
            })
            .collect();
        rows.sort_by(|a, b| b.emission.total_cmp(&a.emission).then(a.peer.cmp(&b.peer)));
        rows
    }

    /// A settlement column a newcomer may take: the first whose miner did
    /// no work this epoch (`miners`), is no longer registered, and earned
    /// nothing in the last settlement (`NO_INCENTIVE`: its bonds paid no
    /// validator anything); not one already handed on (`taken`).
    fn reusable_column(&self, miners: &[MinerEpoch], taken: &[usize]) -> Option<usize> {
        let working: std::collections::HashSet<PeerId> = miners.iter().map(|m| m.peer).collect();
        let last = self.settlement.recent.last()?;
        (0..self.settlement.miners.len()).find(|c| {
            let p = &self.settlement.miners[*c];
            !taken.contains(c)
                && !working.contains(p)
                && !self.miners.contains_key(p)
                && last.miners.get(*c) == Some(p)
                && last.output.incentive.get(*c).is_some_and(|x| *x <= NO_INCENTIVE)
        })
    }

    /// CLASP over the epoch's completed micro-batches (issue order, pathway,
    /// the tail's loss), with the parameters validators judge by.
    fn clasp_lines(&self, mean_loss: f64) -> Vec<ClaspLine> {
        let mut clasp = Clasp::new(self.spec.stages as usize, self.spec.epoch_len(self.epoch).max(1));
        for (seq, r) in &self.mbs {
            if let MbStatus::Done { loss, pathway, .. } = &r.status {
                let _ = clasp.record(*seq, pathway, *loss);
            }
        }
        clasp
            .estimate(&clasp_params(mean_loss))
            .miners
            .iter()
            .filter_map(|m| {
                let e = m.estimate()?;
                Some(ClaspLine {
                    peer: m.key,
                    stage: m.stage as u32,
                    samples: m.samples,
                    effect: e.effect,
                    lo: e.lo,
                    hi: e.hi,
                    harmful: e.harmful,
                })
            })
            .collect()
    }

    /// The proofs of this epoch's convictions that rest on one (frames
    /// signed twice for one attempt), for the ledger to re-check.
    fn proofs_of(&self, convicted: &[PeerId]) -> Vec<iota_core::frame_equivocation::FrameEquivocation> {
        let of_epoch = |p: &&iota_core::frame_equivocation::FrameEquivocation| {
            p.epoch == self.epoch && convicted.contains(&p.miner)
        };
        self.validation.frame_equivocations.iter().filter(of_epoch).cloned().collect()
    }

    /// Gives this epoch's newcomers their columns (see `settle`): the
    /// column count before, and the columns handed from departed miners.
    fn assign_columns(&mut self, miners: &[MinerEpoch]) -> (usize, Vec<usize>) {
        let before = self.settlement.miners.len();
        let mut known: std::collections::HashSet<PeerId> = self.settlement.miners.iter().copied().collect();
        let mut reused: Vec<usize> = Vec::new();
        for m in miners {
            if known.insert(m.peer) {
                if self.settlement.miners.len() < self.settlement.column_cap() {
                    self.settlement.miners.push(m.peer);
                    continue;
                }
                match self.reusable_column(miners, &reused) {
                    Some(c) => {
                        info!(miner = %m.peer, column = c, departed = %self.settlement.miners[c], "a departed miner's settlement column goes to a newcomer");
                        self.settlement.miners[c] = m.peer;
                        reused.push(c);
                    }
                    None => warn!(miner = %m.peer, "settlement tracks no more miners: this one is not paid"),
                }
            }
        }
        (before, reused)
    }

    /// Settles the current epoch from its account of work (`miners`) and
    /// the validators' weights of its round.
    pub(super) fn settle(&mut self, miners: &[MinerEpoch], rolled_back: bool, convicted: &[PeerId], mean_loss: f64) {
        // Columns: every miner seen so far keeps its place; this epoch's
        // newcomers are appended (and their stale bonds, none, dropped).
        // Once every column is taken, a newcomer gets a departed miner's
        // column that earned nothing in the last settlement (flagged newly
        // registered, so Yuma starts its bonds from zero), as a uid is
        // recycled on chain.
        let (before, reused) = self.assign_columns(miners);
        let cols = self.settlement.miners.len();
        let columns: HashMap<PeerId, usize> = self.settlement.miners.iter().enumerate().map(|(c, p)| (*p, c)).collect();
        let column = |p: &PeerId| columns.get(p).copied();
        let round = self.validation.round.as_ref().filter(|r| r.epoch == self.epoch);
        let mut signed = Vec::new();
        let (validators, stakes, weights, active) = if self.validation.quorum.is_some() {
            let mut rows = Vec::new();
            let mut active = Vec::new();
            for v in &self.spec.validation.validators {
                let mut row = vec![0.0; cols];
                // A validator is paid for a round it verified: weights sent
                // with verdicts on at least half of the round's miners. One
                // that checks nothing (and copies weights, say) neither
                // votes in consensus nor earns dividends for the epoch.
                let verified = |r: &&super::validation_state::Round| {
                    let n = r.verified.get(&v.peer).map_or(0, |m| m.len());
                    2 * n >= r.miners.len()
                };
                let sent = round.filter(verified).and_then(|r| r.weights.get(&v.peer).map(|w| (r, w)));
                if let Some((r, w)) = sent {
                    // A miner convicted in the epoch (by verdicts, an audit
                    // or a proof that came after a validator rated it) is
                    // paid nothing for it: its column is masked, on record
                    // in the entry's `convicted`.
                    for (p, x) in r.miners.iter().zip(w).filter(|(p, _)| !convicted.contains(p)) {
                        if let Some(c) = column(p) {
                            row[c] = f64::from(*x);
                        }
                    }
                }
                active.push(sent.is_some());
                rows.push(row);
                // (Its signed request is left out with its weights: the
                // entry holds the rows it counted.)
                let request = round.filter(verified).and_then(|r| r.signed_weights.get(&v.peer));
                signed.push(request.map(|b| to_hex(b)).unwrap_or_default());
            }
            let validators: Vec<PeerId> = self.spec.validation.validators.iter().map(|v| v.peer).collect();
            let stakes = self.spec.validation.validators.iter().map(|v| v.stake as f64).collect();
            (validators, stakes, rows, active)
        } else {
            let mut row = vec![0.0; cols];
            for m in miners {
                if let Some(c) = column(&m.peer) {
                    row[c] = m.credited as f64;
                }
            }
            let operator = self.settlement.operator.unwrap_or(UNNAMED_OPERATOR);
            (vec![operator], vec![1.0], vec![row], vec![true])
        };
        let input = YumaInput {
            stakes,
            weights,
            bonds: self.settlement.bonds.as_ref().map(|b| widen(b, cols)),
            validator_permits: None,
            active: Some(active),
            recently_registered: Some((0..cols).map(|c| c >= before || reused.contains(&c)).collect()),
            params: YumaParams::default(),
        };
        match yuma::run(&input) {
            Ok(output) => {
                self.settlement.bonds = Some(output.bonds.clone());
                let settled = Settlement {
                    run_id: self.spec.run_id,
                    epoch: self.epoch,
                    validators,
                    miners: self.settlement.miners.clone(),
                    input,
                    output,
                    rolled_back,
                    convicted: convicted.to_vec(),
                    work_miners: round.map(|r| r.miners.clone()).unwrap_or_default(),
                    signed_weights: signed,
                    clasp: self.clasp_lines(mean_loss),
                    proofs: self.proofs_of(convicted),
                    step_proofs: self
                        .validation
                        .step_proofs
                        .iter()
                        .filter(|p| p.epoch == self.epoch && convicted.contains(&p.miner))
                        .cloned()
                        .collect(),
                };
                for (p, x) in settled.payouts() {
                    *self.settlement.balances.entry(p).or_default() += x;
                }
                self.settlement.recent.push(settled);
                // Only settlements the ledger has are let go: while saves
                // fail they wait, up to a bound past which the loss is an
                // error on record.
                while self.settlement.recent.len() > MAX_RECENT_SETTLEMENTS {
                    let oldest = self.settlement.recent[0].epoch;
                    let written = self.settlement.written_through.is_some_and(|w| oldest <= w);
                    if !written && self.settlement.recent.len() <= MAX_UNWRITTEN_SETTLEMENTS {
                        break;
                    }
                    if !written {
                        self.settlement.lost += 1;
                        tracing::error!(
                            epoch = oldest,
                            "a settlement the ledger never had is dropped (saves keep failing)"
                        );
                    }
                    self.settlement.recent.remove(0);
                }
            }
            Err(e) => {
                self.settlement.failed += 1;
                warn!(epoch = self.epoch, error = %e, "the epoch could not be settled: nobody is paid for it");
            }
        }
    }
}
