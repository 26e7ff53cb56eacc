//! The faults an adversary or a chaos test injects into a replica's merge.

/// Faults a test or a chaos run injects into one replica's merge; a real
/// miner never sets one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeFault {
    /// Sends a pseudo-gradient a million times too large.
    HugeDelta,
    /// Sends noise of 20 times its pseudo-gradient's RMS: inside the band
    /// owners accept (1,000 times the others' median norm, see
    /// `iota_core::merge::flaws`) unless the others did under a fiftieth of
    /// its work, so only the rule and the validators' rollback stand in its
    /// way; and still far larger than the weights themselves move.
    Overshoot,
    /// Sends a pseudo-gradient with a NaN in it.
    NanDelta,
    /// As an owner, publishes a wrong update.
    CorruptUpdates,
    /// As a partition's writer, announces the right hash and stores other
    /// bytes (another miner overwriting them looks the same to readers).
    LyingWriter,
    /// When a merge starts, plants objects under every other stage's
    /// `weights/` and `momentum/` prefixes and announces them: part names
    /// whose lengths overflow (issue 21's crash inputs) and a part whose
    /// bytes differ from the hash it announces.
    PlantObjects,
    /// Sends each partition's first owner its true slice and the other
    /// owners (the second, a referee) the slice tripled: well formed,
    /// signed, of plausible size (the `merge-equivocate` adversary).
    Equivocate,
    /// As an owner whose every other owner is an accomplice
    /// (`Butterfly::accomplices`), publishes the update negated; the
    /// accomplices do the same, so the owners agree (the `collude`
    /// adversary).
    Collude,
    /// Merges honestly and reports a false hash of its merged weights
    /// (`MergeDone`), the greatest there is: at R = 2 it ties with its
    /// honest replica's, which the orchestrator's record of the stage's
    /// start then took (the `merge-lie` adversary).
    LieDone,
    /// Keeps its contribution to one partition from that partition's other
    /// owners, and does not store it when asked, while it reports
    /// everything else: a partition it is a third party to if there is
    /// one, else (R = 2) the first, which it reports itself (the
    /// `withholder` adversary).
    Withhold,
    /// Sends the owners its true contribution and, asked to store it for
    /// an audit, stores another (tripled), signed: a stored frame that
    /// contradicts what the owners reduced, so that the audit's recompute
    /// would name the honest owners (the `framing-sender` adversary).
    FramingSender,
    /// Sends (and stores when asked) its pseudo-gradient scaled by 8:
    /// well formed, signed, consistent everywhere, far inside the band
    /// owners flag (1,000 times the others' median) and small enough for a
    /// merge to absorb without a rollback, but not the pseudo-gradient of
    /// the weights it committed to (the `scaled-poison` adversary).
    ScaledPoison,
    /// As an owner, waits for another participant's contribution to each
    /// partition it owns and sends (and stores when asked) a copy of it as
    /// its own: a free rider that trained honestly but claims a
    /// co-owner's progress (the `copy-partner` adversary; at R = 2 it owns
    /// every partition).
    CopyPartner,
    /// As `CopyPartner`, the co-owner's contribution negated: the two
    /// cancel and the stage stops learning (the `negate-partner`
    /// adversary).
    NegatePartner,
    /// With sparse contributions: multiplies the backlog it carries by 4
    /// before each merge, then commits to it and contributes from it
    /// honestly: well formed and consistent with everything it reports
    /// that epoch, stale directions pushed four times over, but not the
    /// backlog its contributions of the epoch before left (the
    /// `inflated-backlog` adversary).
    InflatedBacklog,
}
