//! Bad miners on purpose (issues 13 and 22): test tools for the liveness
//! and validation tests and chaos runs, never on by default.
//!
//! `Silent`, `Closed`, `Slow` and `Flaky` are unreliable: the miner's shell
//! acts them out. `Noise`, `Zeros` and `Replay` are dishonest: the worker
//! changes the outputs it sends (activations; at the tail, the gradient it
//! sends back), before they are encoded and signed; `LossLie` (a tail)
//! reports a lower loss than it computed; `Copy` (a middle stage) passes
//! its input on; `GradNoise` (a middle stage) adds noise to the gradient
//! it sends upstream; `Lazy` (a middle stage or a tail) sends upstream,
//! for every micro-batch, the gradient it computed for its first one, and a
//! lazy middle stage skips its backward; `MergeEquivocate` sends the two
//! owners of a merge partition different slices; `Nan` and `MergeGarbage`
//! send a pseudo-gradient with a NaN in it or a million times too large;
//! `MergeLie` reports a false hash of the weights its merge ended with.
//! Each does everything else honestly (it trains,
//! commits, and uploads as evidence the frames it really sent), so the
//! only link a validator can catch it on is the recompute.
//! `SkipWeightGrad`, `SkipOptimizer` and `SkipBackward` are lazy where only
//! the recompute of an inner step (`iota_checks::inner_step`) looks: what
//! they send is honest, what they commit is what they did.
//! `FabricatedEvidence` is the exception that tests the other links: it
//! computes and trains honestly but sends cheap garbage on the wire, and
//! uploads as evidence honest frames signed as if they had been sent.

use iota_core::{PeerId, Rng};

/// The commonest bad miners.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Adversary {
    /// Registers and heartbeats, never works; its advertised data port
    /// swallows packets without an answer.
    Silent,
    /// Like `Silent`, but its advertised data port is closed (refuses).
    Closed,
    /// Works at about a tenth of its speed.
    Slow,
    /// Drops 30% of the pipeline frames it receives.
    Flaky,
    /// Adds noise of about 10% of the output's RMS to every activation it
    /// sends (seeded per micro-batch: the same run sends the same noise).
    Noise,
    /// Sends activations of all zeros.
    Zeros,
    /// Sends, for every micro-batch, the activations it computed for its
    /// first micro-batch of the run (under the new micro-batch's header).
    Replay,
    /// A tail that reports 20% less loss than it computed (and is honest
    /// otherwise).
    LossLie,
    /// A middle stage that passes on the activation it received (a real
    /// activation of the micro-batch, from its upstream) instead of its
    /// own output; it trains honestly.
    Copy,
    /// A middle stage that computes its forward honestly but adds noise of
    /// about 10% of the RMS to the gradient it sends upstream (seeded per
    /// micro-batch); it trains on the honest gradients. Elsewhere it is
    /// honest (the head sends no gradient; a noisy tail is `Noise`).
    GradNoise,
    /// A middle stage or a tail that sends upstream, for every micro-batch,
    /// the gradient it sent for its first one (well formed, signed, right
    /// shape); a middle stage also skips its backward (so its own weights
    /// learn nothing from the micro-batch: the work it is paid for, not
    /// done). A lazy head computes honestly: it sends no gradient, and what
    /// it skips only the weight-gradient checks would see.
    Lazy,
    /// In the butterfly merge, keeps its contribution to one partition from
    /// that partition's other owners and never stores it, while it reports
    /// everything else (`MergeFault::Withhold`); it trains honestly.
    Withholder,
    /// In the butterfly merge, publishes a wrong update for every partition
    /// it owns (`MergeFault::CorruptUpdates`); it trains honestly. At
    /// R = 2 no third replica can referee it.
    LyingOwner,
    /// Two replicas of a stage (each the other's accomplice) that publish
    /// the same wrong update for every partition they own or referee
    /// (`MergeFault::CorruptUpdates`): at R = 3 the one that is not an
    /// owner of a partition the other disputes with an honest owner is its
    /// only possible referee, and sides with its accomplice.
    RefereeCollusion,
    /// Sends the owners its true contribution and, asked to store it for
    /// an audit, stores a different one, signed (`MergeFault::FramingSender`):
    /// the recompute from the store would then name the honest owners.
    FramingSender,
    /// In the butterfly merge, sends each partition's first owner its true
    /// slice of the pseudo-gradient and the other owner the slice tripled
    /// (`MergeFault::Equivocate`); it trains honestly.
    MergeEquivocate,
    /// In the merge, sends a pseudo-gradient with a NaN in every slice
    /// (`MergeFault::NanDelta`); it trains honestly.
    Nan,
    /// In the merge, sends a pseudo-gradient a million times too large
    /// (`MergeFault::HugeDelta`); it trains honestly.
    MergeGarbage,
    /// In the butterfly merge, as an owner of a partition whose other owner
    /// is an accomplice (`MinerOptions::accomplices`, who runs the same
    /// mode), publishes the update negated: both owners agree, so the hash
    /// comparison accepts it, and the partition moves as far as the
    /// replicas' work but against it (`MergeFault::Collude`). With an
    /// honest co-owner it reduces honestly; it trains honestly, and stores
    /// its true contribution when asked.
    Collude,
    /// In the butterfly merge, reports a false hash of its merged weights
    /// (`MergeFault::LieDone`): the stage's recorded start is then a tie
    /// between it and its honest replica, which it wins; it merges and
    /// trains honestly. What it attacks is its honest replicas' next
    /// epoch: their true starting weights no longer match the record.
    MergeLie,
    /// Computes honestly but never sends a pipeline frame on: it reports
    /// the neighbour it would send to (downstream, or at the tail upstream)
    /// UNREACHABLE instead, every time (one hostile miner's word against
    /// every honest neighbour's: without corroboration it benches nobody).
    /// It merges honestly.
    HostileUnreachable,
    /// Sends on the wire, for every micro-batch after its first, the values
    /// it sent for its first one (activations downstream, gradients
    /// upstream: cheap, well formed, signed), while it computes and trains
    /// honestly; its endpoint records instead, signed with the same header
    /// fields, the honest frame it would have sent, and that is what it
    /// uploads when a validator draws the attempt: "evidence made after
    /// the draw". Its neighbours train on the garbage. It takes any
    /// gradient that comes back (an honest miner refuses one that does
    /// not answer what it sent).
    FabricatedEvidence,
    /// Computes every backward's input gradient (what its upstream
    /// neighbour needs, so no neighbour sees anything wrong) but not its
    /// weight gradients: about a third of its compute saved. It steps its
    /// optimizer on what it accumulated (nothing) and commits honestly to
    /// the weights and the optimizer state that gives, and shows its
    /// frames as they were (acted out by dropping each micro-batch's
    /// weight gradient after its backward).
    SkipWeightGrad,
    /// Computes its weight gradients but never steps its optimizer: its
    /// weights stay where the epoch started. It commits honestly to the
    /// unchanged weights and optimizer state.
    SkipOptimizer,
    /// A head that skips its whole backward (about two thirds of its
    /// compute): it takes the gradient that comes back, reports the
    /// micro-batch done and steps on nothing. Elsewhere it is
    /// `SkipWeightGrad` (a middle stage's or a tail's backward gives the
    /// gradient its upstream neighbour needs).
    SkipBackward,
    /// In the butterfly merge, sends (and stores when asked) its
    /// pseudo-gradient scaled by 8 (`MergeFault::ScaledPoison`): well
    /// formed, consistent to every owner and auditor, far under what
    /// owners flag; it trains honestly. Only holding the contribution
    /// against the weights it committed to shows it.
    ScaledPoison,
    /// In the butterfly merge, sends as its contribution to each partition
    /// it owns a copy of a co-owner's, as received
    /// (`MergeFault::CopyPartner`); it trains honestly.
    CopyPartner,
    /// As `CopyPartner`, the co-owner's contribution negated
    /// (`MergeFault::NegatePartner`): at R = 2 the stage stops learning.
    NegatePartner,
    /// With sparse contributions, carries four times the backlog its last
    /// contributions left and commits to that (`MergeFault::
    /// InflatedBacklog`); it trains honestly.
    InflatedBacklog,
}

impl Adversary {
    /// Every mode, as the command line names them.
    pub const NAMES: [(&'static str, Adversary); 29] = [
        ("silent", Adversary::Silent),
        ("closed", Adversary::Closed),
        ("slow", Adversary::Slow),
        ("flaky", Adversary::Flaky),
        ("noise", Adversary::Noise),
        ("zeros", Adversary::Zeros),
        ("replay", Adversary::Replay),
        ("loss-lie", Adversary::LossLie),
        ("copy", Adversary::Copy),
        ("grad-noise", Adversary::GradNoise),
        ("lazy", Adversary::Lazy),
        ("merge-equivocate", Adversary::MergeEquivocate),
        ("nan", Adversary::Nan),
        ("merge-garbage", Adversary::MergeGarbage),
        ("collude", Adversary::Collude),
        ("merge-lie", Adversary::MergeLie),
        ("hostile-unreachable", Adversary::HostileUnreachable),
        ("withholder", Adversary::Withholder),
        ("lying-owner", Adversary::LyingOwner),
        ("referee-collusion", Adversary::RefereeCollusion),
        ("framing-sender", Adversary::FramingSender),
        ("fabricated-evidence", Adversary::FabricatedEvidence),
        ("skip-weight-grad", Adversary::SkipWeightGrad),
        ("skip-optimizer", Adversary::SkipOptimizer),
        ("skip-backward", Adversary::SkipBackward),
        ("scaled-poison", Adversary::ScaledPoison),
        ("copy-partner", Adversary::CopyPartner),
        ("negate-partner", Adversary::NegatePartner),
        ("inflated-backlog", Adversary::InflatedBacklog),
    ];

    pub fn parse(s: &str) -> Option<Adversary> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, a)| *a)
    }

    /// The merge fault a mode acts out, if it cheats in the merge.
    pub fn merge_fault(self) -> Option<crate::miner::merge::MergeFault> {
        use crate::miner::merge::MergeFault;
        match self {
            Adversary::MergeEquivocate => Some(MergeFault::Equivocate),
            Adversary::Nan => Some(MergeFault::NanDelta),
            Adversary::MergeGarbage => Some(MergeFault::HugeDelta),
            Adversary::Collude => Some(MergeFault::Collude),
            Adversary::MergeLie => Some(MergeFault::LieDone),
            Adversary::Withholder => Some(MergeFault::Withhold),
            Adversary::LyingOwner | Adversary::RefereeCollusion => Some(MergeFault::CorruptUpdates),
            Adversary::FramingSender => Some(MergeFault::FramingSender),
            Adversary::ScaledPoison => Some(MergeFault::ScaledPoison),
            Adversary::CopyPartner => Some(MergeFault::CopyPartner),
            Adversary::NegatePartner => Some(MergeFault::NegatePartner),
            Adversary::InflatedBacklog => Some(MergeFault::InflatedBacklog),
            _ => None,
        }
    }

    /// Whether the mode changes what the miner computes (the worker acts it
    /// out) rather than how it takes part (the shell does).
    pub fn tampers(self) -> bool {
        matches!(
            self,
            Adversary::Noise
                | Adversary::Zeros
                | Adversary::Replay
                | Adversary::LossLie
                | Adversary::Copy
                | Adversary::GradNoise
                | Adversary::Lazy
                | Adversary::FabricatedEvidence
                | Adversary::SkipWeightGrad
                | Adversary::SkipOptimizer
                | Adversary::SkipBackward
        )
    }
}

/// Noise standard deviation relative to the output's RMS.
const NOISE_RELATIVE: f32 = 0.1;

/// Adds noise of `NOISE_RELATIVE` times the RMS of `values`, from a stream
/// seeded by `seed` and the micro-batch attempt `mb`.
fn add_noise(seed: u64, mb: (u64, u32, u64, u32), values: &mut [f32]) {
    let n = values.len().max(1) as f64;
    let rms = (values.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / n).sqrt() as f32;
    let mut rng = Rng::derived(seed, &[mb.0, u64::from(mb.1), mb.2, u64::from(mb.3)]);
    for v in values.iter_mut() {
        *v += rng.normal() * NOISE_RELATIVE * rms;
    }
}

/// What a tampering adversary changes in the activations it sends.
pub(crate) struct Tamper {
    mode: Adversary,
    seed: u64,
    /// `Replay`: the first activations it sent in the run.
    first: Option<Vec<f32>>,
    /// `Lazy`: the first gradient it sent upstream in the run.
    first_gradient: Option<Vec<f32>>,
    /// `FabricatedEvidence`: the first values it sent in each direction.
    first_sent: [Option<Vec<f32>>; 2],
}

impl Tamper {
    /// None for a mode that does not tamper with outputs.
    pub(crate) fn new(mode: Adversary, me: PeerId) -> Option<Tamper> {
        let mut word = [0u8; 8];
        word.copy_from_slice(&me.0[..8]);
        mode.tampers().then(|| Tamper {
            mode,
            seed: u64::from_le_bytes(word),
            first: None,
            first_gradient: None,
            first_sent: [None, None],
        })
    }

    /// Changes `values`, the activations about to be sent for micro-batch
    /// attempt `mb` (epoch, shard, first sample, attempt).
    pub(crate) fn activations(&mut self, mb: (u64, u32, u64, u32), values: &mut [f32]) {
        match self.mode {
            Adversary::Noise => add_noise(self.seed ^ 0x006e_6f69_7365, mb, values),
            Adversary::Zeros => values.fill(0.0),
            Adversary::Replay => match &self.first {
                Some(first) if first.len() == values.len() => values.copy_from_slice(first),
                // A micro-batch of another size has other shapes: it goes
                // out honest (the replay must stay well formed).
                Some(_) => {}
                None => self.first = Some(values.to_vec()),
            },
            Adversary::Copy
            | Adversary::Collude
            | Adversary::GradNoise
            | Adversary::Lazy
            | Adversary::LossLie
            | Adversary::Silent
            | Adversary::Closed
            | Adversary::Slow
            | Adversary::Flaky
            | Adversary::MergeEquivocate
            | Adversary::Nan
            | Adversary::MergeGarbage
            | Adversary::MergeLie
            | Adversary::Withholder
            | Adversary::LyingOwner
            | Adversary::RefereeCollusion
            | Adversary::FramingSender
            | Adversary::HostileUnreachable
            | Adversary::FabricatedEvidence
            | Adversary::SkipWeightGrad
            | Adversary::SkipOptimizer
            | Adversary::SkipBackward
            | Adversary::ScaledPoison
            | Adversary::CopyPartner
            | Adversary::NegatePartner
            | Adversary::InflatedBacklog => {}
        }
    }

    /// Changes `values`, the gradient a middle stage is about to send
    /// upstream for micro-batch attempt `mb` (only `GradNoise` does).
    pub(crate) fn upstream_gradient(&mut self, mb: (u64, u32, u64, u32), values: &mut [f32]) {
        if self.mode == Adversary::GradNoise {
            add_noise(self.seed ^ 0x6772_6164_6e6f, mb, values);
        }
    }

    /// `Lazy`: the stale gradient of `len` values to send upstream instead
    /// of computing one (None while it has sent none of that size: it then
    /// computes honestly, and `sent_gradient` keeps what it sent).
    pub(crate) fn stale_gradient(&self, len: usize) -> Option<Vec<f32>> {
        self.first_gradient.as_ref().filter(|g| self.mode == Adversary::Lazy && g.len() == len).cloned()
    }

    /// A gradient it computed and is about to send upstream (`Lazy` keeps
    /// the first one).
    pub(crate) fn sent_gradient(&mut self, values: &[f32]) {
        if self.mode == Adversary::Lazy && self.first_gradient.is_none() {
            self.first_gradient = Some(values.to_vec());
        }
    }

    /// `FabricatedEvidence`: the values to send on the wire instead of
    /// `honest`, about to be sent as a frame of `direction` (None: send
    /// `honest`, as the first frame of each direction and size goes).
    pub(crate) fn wire_instead(&mut self, direction: iota_core::wire::Direction, honest: &[f32]) -> Option<Vec<f32>> {
        if self.mode != Adversary::FabricatedEvidence {
            return None;
        }
        let slot = &mut self.first_sent[usize::from(direction == iota_core::wire::Direction::ActivationGrad)];
        match slot {
            Some(first) if first.len() == honest.len() => Some(first.clone()),
            Some(_) => None,
            None => {
                *slot = Some(honest.to_vec());
                None
            }
        }
    }

    /// Whether the frames it shows as evidence are not the ones it sent
    /// (`FabricatedEvidence`).
    pub(crate) fn shows_other_frames(&self) -> bool {
        self.mode == Adversary::FabricatedEvidence
    }

    /// Whether it drops the weight gradient of every backward it runs
    /// (`SkipWeightGrad`; `SkipBackward` where a backward must run).
    pub(crate) fn skips_weight_grads(&self) -> bool {
        matches!(self.mode, Adversary::SkipWeightGrad | Adversary::SkipBackward)
    }

    /// Whether it never steps its optimizer (`SkipOptimizer`).
    pub(crate) fn skips_optimizer(&self) -> bool {
        self.mode == Adversary::SkipOptimizer
    }

    /// Whether a head skips its whole backward (`SkipBackward`).
    pub(crate) fn skips_head_backward(&self) -> bool {
        self.mode == Adversary::SkipBackward
    }

    /// Whether it passes on its input instead of its output (`Copy`).
    pub(crate) fn copies(&self) -> bool {
        self.mode == Adversary::Copy
    }

    /// The loss a tail reports for a micro-batch whose mean loss is `loss`.
    pub(crate) fn reported_loss(&self, loss: f32) -> f32 {
        if self.mode == Adversary::LossLie { loss * 0.8 } else { loss }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rms(v: &[f32]) -> f32 {
        (v.iter().map(|x| x * x).sum::<f32>() / v.len() as f32).sqrt()
    }

    #[test]
    fn modes_parse_and_only_dishonest_ones_tamper() {
        for (name, a) in Adversary::NAMES {
            assert_eq!(Adversary::parse(name), Some(a));
            assert_eq!(Tamper::new(a, PeerId([1; 32])).is_some(), a.tampers());
        }
        assert_eq!(Adversary::parse("lazy"), Some(Adversary::Lazy));
        assert_eq!(Adversary::parse("sloth"), None);
    }

    #[test]
    fn each_mode_changes_activations_as_described() {
        let honest: Vec<f32> = (0..4096).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let mb = (0, 3, 64, 0);
        let me = PeerId([7; 32]);
        let mut noise = Tamper::new(Adversary::Noise, me).unwrap();
        let mut a = honest.clone();
        noise.activations(mb, &mut a);
        let diff: Vec<f32> = a.iter().zip(&honest).map(|(x, y)| x - y).collect();
        let rel = rms(&diff) / rms(&honest);
        assert!((0.08..0.12).contains(&rel), "noise {rel} of the RMS");
        let mut again = honest.clone();
        noise.activations(mb, &mut again);
        assert_eq!(a, again, "seeded per micro-batch");
        let mut other = honest.clone();
        noise.activations((0, 3, 72, 0), &mut other);
        assert_ne!(a, other);

        let mut zeros = Tamper::new(Adversary::Zeros, me).unwrap();
        let mut z = honest.clone();
        zeros.activations(mb, &mut z);
        assert!(z.iter().all(|&v| v == 0.0));

        let mut replay = Tamper::new(Adversary::Replay, me).unwrap();
        let mut first = honest.clone();
        replay.activations(mb, &mut first);
        assert_eq!(first, honest, "the first micro-batch goes out honest");
        let mut second: Vec<f32> = honest.iter().map(|v| v * 2.0).collect();
        replay.activations((0, 3, 72, 0), &mut second);
        assert_eq!(second, honest, "later ones carry the first one's values");
        let mut short = vec![5.0; 10];
        replay.activations((0, 3, 80, 0), &mut short);
        assert_eq!(short, vec![5.0; 10]);
    }

    #[test]
    fn lazy_sends_its_first_gradient_for_every_micro_batch() {
        let mut t = Tamper::new(Adversary::Lazy, PeerId([3; 32])).unwrap();
        assert_eq!(t.stale_gradient(4), None, "the first one is computed");
        t.sent_gradient(&[1.0, 2.0, 3.0, 4.0]);
        t.sent_gradient(&[5.0, 6.0, 7.0, 8.0]);
        assert_eq!(t.stale_gradient(4), Some(vec![1.0, 2.0, 3.0, 4.0]));
        assert_eq!(t.stale_gradient(6), None, "another size is computed honestly");
        let mut a = vec![0.5; 4];
        t.activations((0, 1, 2, 0), &mut a);
        assert_eq!(a, vec![0.5; 4], "its forward is honest");
        // Other modes keep nothing.
        let mut noise = Tamper::new(Adversary::Noise, PeerId([3; 32])).unwrap();
        noise.sent_gradient(&[1.0; 4]);
        assert_eq!(noise.stale_gradient(4), None);
    }

    #[test]
    fn fabricated_evidence_replays_its_first_frame_of_each_direction_on_the_wire() {
        use iota_core::wire::Direction;
        let mut t = Tamper::new(Adversary::FabricatedEvidence, PeerId([4; 32])).unwrap();
        assert!(t.shows_other_frames());
        let (a1, a2, g1) = (vec![1.0f32; 4], vec![2.0f32; 4], vec![-1.0f32; 4]);
        assert_eq!(t.wire_instead(Direction::Activation, &a1), None, "the first goes out honest");
        assert_eq!(t.wire_instead(Direction::Activation, &a2), Some(a1.clone()), "later ones: the first's values");
        assert_eq!(t.wire_instead(Direction::ActivationGrad, &g1), None, "each direction has its own first");
        assert_eq!(t.wire_instead(Direction::ActivationGrad, &a2), Some(g1));
        assert_eq!(t.wire_instead(Direction::Activation, &[3.0; 6]), None, "another size goes out honest");
        // What it computes is untouched; other modes never fabricate.
        let mut a = a2.clone();
        t.activations((0, 1, 2, 0), &mut a);
        assert_eq!(a, a2);
        let mut noise = Tamper::new(Adversary::Noise, PeerId([4; 32])).unwrap();
        assert!(!noise.shows_other_frames());
        assert_eq!(noise.wire_instead(Direction::Activation, &a1), None);
        assert_eq!(noise.wire_instead(Direction::Activation, &a2), None);
    }

    #[test]
    fn grad_noise_changes_only_the_upstream_gradient() {
        let honest: Vec<f32> = (0..4096).map(|i| ((i * 53) % 97) as f32 / 4e3 - 0.01).collect();
        let (mb, me) = ((1, 2, 32, 1), PeerId([9; 32]));
        let mut t = Tamper::new(Adversary::GradNoise, me).unwrap();
        assert_eq!(Adversary::parse("grad-noise"), Some(Adversary::GradNoise));
        let mut a = honest.clone();
        t.activations(mb, &mut a);
        assert_eq!(a, honest, "its forward is honest");
        let mut g = honest.clone();
        t.upstream_gradient(mb, &mut g);
        let diff: Vec<f32> = g.iter().zip(&honest).map(|(x, y)| x - y).collect();
        let rel = rms(&diff) / rms(&honest);
        assert!((0.08..0.12).contains(&rel), "noise {rel} of the RMS");
        let mut again = honest.clone();
        t.upstream_gradient(mb, &mut again);
        assert_eq!(g, again, "seeded per micro-batch");
        let mut other = honest.clone();
        t.upstream_gradient((1, 2, 40, 1), &mut other);
        assert_ne!(g, other);
        // Other modes leave the upstream gradient alone.
        let mut noise = Tamper::new(Adversary::Noise, me).unwrap();
        let mut g = honest.clone();
        noise.upstream_gradient(mb, &mut g);
        assert_eq!(g, honest);
    }
}
