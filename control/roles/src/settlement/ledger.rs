//! The ledger: an append-only, hash-chained, signed record of every
//! epoch's settlement.
//!
//! Each entry holds one epoch's [`Settlement`] as JSON (the Yuma input,
//! every validator's weights included, and its output), the hash of the
//! entry before it, its own hash, and the orchestrator's Ed25519 signature
//! over that hash. [`verify`] re-checks the whole chain: sequence, links,
//! hashes, signatures, that every Yuma step recomputes to what was
//! recorded, that each epoch's bonds are the previous epoch's, and that
//! emissions add up. A changed byte anywhere is named by its entry.
//!
//! Sans I/O: the orchestrator's state database stores the entries (see
//! `state_db.rs`); `iota-control ledger verify|show` reads them back.

use std::collections::BTreeMap;

use iota_core::frame_equivocation::FrameEquivocation;
use iota_core::{Identity, PeerId};
use serde::{Deserialize, Serialize};

use super::yuma::{self, YumaInput, YumaOutput, YumaParams};

/// Domain separation for entry hashes.
const ENTRY_DOMAIN: &[u8] = b"iota-rs ledger entry v1\0";

/// How far a recorded emission total may stray from the epoch's emission
/// (relative; sums of f64 shares).
const EMISSION_TOLERANCE: f64 = 1e-9;

/// A miner column whose incentive in a settlement is at most this earned
/// nothing there: its bonds paid no validator any dividend (dividends are
/// bonds times incentive), so once its miner has departed the column may
/// go to a newcomer when the columns are all taken. (Bonds themselves do
/// not decay in the classic mode: each column is max-upscaled.)
pub const NO_INCENTIVE: f64 = 1e-12;

/// One epoch's settlement: who was paid what, and everything needed to
/// recompute it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settlement {
    pub run_id: u64,
    pub epoch: u64,
    /// The Yuma rows: the run's validators (or the orchestrator alone, for
    /// a run without validators).
    pub validators: Vec<PeerId>,
    /// The Yuma columns: every miner the run has paid or rated so far, in
    /// order of first appearance (a column keeps its place across epochs,
    /// as a uid does on chain; once every column is taken, a departed
    /// miner's column that earned nothing in the settlement before goes to
    /// a newcomer, flagged newly registered, as a uid is recycled on chain).
    pub miners: Vec<PeerId>,
    pub input: YumaInput,
    pub output: YumaOutput,
    /// The epoch's merge was rolled back.
    pub rolled_back: bool,
    /// Miners the validators' stake convicted this epoch.
    pub convicted: Vec<PeerId>,
    /// The miners of the epoch's `EpochWork`, in its order (that of each
    /// validator's weight vector).
    #[serde(default)]
    pub work_miners: Vec<PeerId>,
    /// Per validator row: its signed `Validate(ValidationDone)` request
    /// (a protobuf `Signed`, hex), or empty when it sent no weights (and
    /// always for the operator of a run without validators).
    #[serde(default)]
    pub signed_weights: Vec<String>,
    /// CLASP over the epoch's completed samples as the orchestrator saw
    /// them (informational: the pathways are not in the ledger, so verify
    /// does not recompute it; validators run their own).
    #[serde(default)]
    pub clasp: Vec<ClaspLine>,
    /// The proofs a conviction of this epoch rests on where one does
    /// (frames a miner signed twice for one attempt: `FrameEquivocation`);
    /// `verify` re-checks each, with no trust in the orchestrator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub proofs: Vec<FrameEquivocation>,
    /// The failed inner steps a conviction of this epoch rests on, proven
    /// (PROTOCOL.md, "A failed step as a proof"): which validator stored
    /// which proof (its hash; the object is `store_keys::step_proof_key`),
    /// re-checked by the orchestrator before it convicted. `verify` checks
    /// each names a miner the entry convicts (re-checking the proof itself
    /// needs the run's store and corpus: not yet).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_proofs: Vec<StepProofRecord>,
}

/// A proof of a failed inner step the orchestrator re-checked and
/// convicted on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepProofRecord {
    pub epoch: u64,
    pub miner: PeerId,
    pub validator: PeerId,
    /// BLAKE3 of the stored `StepProof`, hex.
    pub hash: String,
    /// What the re-check held the proof against: the miner's stage, its
    /// committed steps chain for the epoch, and the miners of the stages
    /// around its (`StepRefereeInputs`), so `ledger verify` can re-check
    /// the stored proof without the run's state.
    #[serde(default)]
    pub stage: u32,
    #[serde(default)]
    pub steps: iota_core::commitment::Chain,
    #[serde(default)]
    pub upstream: Vec<PeerId>,
    #[serde(default)]
    pub downstream: Vec<PeerId>,
}

/// One miner's CLASP estimate: effect on loss in nats per sample against
/// its stage's other replicas, with its confidence bounds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaspLine {
    pub peer: PeerId,
    pub stage: u32,
    pub samples: u64,
    pub effect: f64,
    pub lo: f64,
    pub hi: f64,
    pub harmful: bool,
}

impl Settlement {
    /// Emission per identity (miners' incentive, validators' dividends).
    pub fn payouts(&self) -> Vec<(PeerId, f64)> {
        let e = &self.output.emission;
        self.miners
            .iter()
            .copied()
            .zip(e.miners.iter().copied())
            .chain(self.validators.iter().copied().zip(e.validators.iter().copied()))
            .collect()
    }
}

/// One sealed entry, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    pub epoch: u64,
    pub prev: [u8; 32],
    pub hash: [u8; 32],
    pub signer: PeerId,
    pub signature: [u8; 64],
    /// The settlement as JSON (hashed byte for byte as stored).
    pub body: String,
}

fn entry_hash(seq: u64, epoch: u64, prev: &[u8; 32], body: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(ENTRY_DOMAIN);
    h.update(&seq.to_le_bytes());
    h.update(&epoch.to_le_bytes());
    h.update(prev);
    h.update(body.as_bytes());
    *h.finalize().as_bytes()
}

/// Seals `s` as the entry after `last` (the first when None).
pub fn seal(last: Option<&Entry>, s: &Settlement, id: &Identity) -> Entry {
    let (seq, prev) = last.map_or((0, [0u8; 32]), |l| (l.seq + 1, l.hash));
    let body = serde_json::to_string(s).expect("a settlement serialises");
    let hash = entry_hash(seq, s.epoch, &prev, &body);
    Entry { seq, epoch: s.epoch, prev, hash, signer: id.peer_id(), signature: id.sign(&hash), body }
}

/// What is wrong with a ledger, naming the first entry that breaks it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("ledger entry {seq} (epoch {epoch}): {what}")]
pub struct LedgerError {
    pub seq: u64,
    pub epoch: u64,
    pub what: String,
}

/// What a verified ledger holds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verified {
    pub entries: u64,
    pub signer: Option<PeerId>,
    /// Total emission per identity over every entry.
    pub balances: BTreeMap<PeerId, f64>,
    pub epochs_rolled_back: u64,
}

/// Re-checks every entry (in `seq` order) and recomputes every Yuma step.
/// Each proof of `s` holds on its own (two different frames its miner
/// signed for one attempt and direction of this run and epoch) and names
/// a miner the entry convicts.
fn check_proofs(s: &Settlement) -> Result<(), String> {
    for p in &s.proofs {
        let [a, b] = &p.headers;
        let again = FrameEquivocation::check(s.run_id, p.miner, a, b)
            .map_err(|why| format!("the proof against {} does not hold: {why}", p.miner))?;
        if again != *p || p.epoch != s.epoch {
            return Err(format!("the proof against {} is not what its headers say, or of another epoch", p.miner));
        }
        if !s.convicted.contains(&p.miner) {
            return Err(format!("a proof against {}, whom the entry does not convict", p.miner));
        }
    }
    for p in &s.step_proofs {
        if p.epoch != s.epoch || !s.convicted.contains(&p.miner) {
            return Err(format!(
                "a step proof against {} of another epoch, or whom the entry does not convict",
                p.miner
            ));
        }
    }
    Ok(())
}

/// `signer`: the orchestrator key the entries must carry (None: the first
/// entry's, which every other must match).
pub fn verify(entries: &[Entry], signer: Option<PeerId>) -> Result<Verified, LedgerError> {
    let mut v = Verified { signer, ..Verified::default() };
    let mut last: Option<(&Entry, Settlement)> = None;
    for (i, e) in entries.iter().enumerate() {
        let fail = |what: String| LedgerError { seq: e.seq, epoch: e.epoch, what };
        if e.seq != i as u64 {
            return Err(fail(format!("out of sequence: expected entry {i}")));
        }
        let prev = last.as_ref().map_or([0u8; 32], |(l, _)| l.hash);
        if e.prev != prev {
            return Err(fail(
                "does not link to the entry before it (an entry was changed, removed or inserted)".into(),
            ));
        }
        if entry_hash(e.seq, e.epoch, &e.prev, &e.body) != e.hash {
            return Err(fail("its content does not match its hash (it was changed)".into()));
        }
        let key = *v.signer.get_or_insert(e.signer);
        if e.signer != key {
            return Err(fail(format!("signed by {}, not the orchestrator {}", e.signer, key)));
        }
        if !e.signer.verify(&e.hash, &e.signature) {
            return Err(fail("the signature does not verify".into()));
        }
        let s: Settlement =
            serde_json::from_str(&e.body).map_err(|err| fail(format!("the settlement does not parse: {err}")))?;
        if s.epoch != e.epoch {
            return Err(fail(format!("records epoch {} inside", s.epoch)));
        }
        check_proofs(&s).map_err(fail)?;
        if let Some((l, ls)) = &last {
            if s.epoch <= l.epoch || s.run_id != ls.run_id {
                return Err(fail(format!("follows epoch {} of run {}", l.epoch, ls.run_id)));
            }
            if s.validators != ls.validators {
                return Err(fail("its validators differ from the entry before it".into()));
            }
            let reused = reused_columns(&s, ls).map_err(fail)?;
            if s.input.bonds.as_ref() != Some(&widen(&ls.output.bonds, s.miners.len())) {
                return Err(fail("its bonds are not the ones the entry before it produced".into()));
            }
            if s.input.stakes != ls.input.stakes {
                return Err(fail("its validators' stakes differ from the entry before it".into()));
            }
            // Established columns are not newcomers (flagging one would wipe
            // its bonds); a reused one is.
            let wiped =
                s.input.recently_registered.as_ref().is_some_and(|r| {
                    r.iter().take(ls.miners.len()).enumerate().any(|(c, x)| *x && !reused.contains(&c))
                });
            if wiped {
                return Err(fail("it marks a miner of the entry before it as newly registered".into()));
            }
        } else if s.input.bonds.is_some() {
            return Err(fail("the first entry starts from bonds nobody recorded".into()));
        }
        check_signed_weights(&s, key).map_err(fail)?;
        check_yuma_settings(&s).map_err(fail)?;
        if s.input.stakes.len() != s.validators.len()
            || s.input.weights.iter().any(|r| r.len() != s.miners.len())
            || s.input.weights.len() != s.validators.len()
        {
            return Err(fail("its Yuma input does not match its validators and miners".into()));
        }
        let again = yuma::run(&s.input).map_err(|err| fail(format!("its Yuma input is refused: {err}")))?;
        if again != s.output {
            return Err(fail("its Yuma output is not what the recorded input gives".into()));
        }
        let paid: f64 = s.payouts().iter().map(|(_, x)| x).sum();
        let total = s.input.params.emission;
        if (paid - total).abs() > EMISSION_TOLERANCE * total.max(1.0) {
            return Err(fail(format!("pays {paid}, not the epoch's emission {total}")));
        }
        for (p, x) in s.payouts() {
            *v.balances.entry(p).or_default() += x;
        }
        v.epochs_rolled_back += u64::from(s.rolled_back);
        v.entries += 1;
        last = Some((e, s));
    }
    Ok(v)
}

/// The Yuma settings the orchestrator fills in itself, which no signature
/// covers: the parameters are the defaults it always uses, no validator
/// permits are set, and a validator is active exactly when its signed
/// request is in the entry (so a signing validator cannot be switched off
/// to hand a minority the consensus).
/// The columns of `prev` that `s` hands to another miner: each must go to
/// a miner new to the columns, be flagged newly registered in `s` (its
/// bonds start from zero), and have earned nothing in `prev`
/// (`NO_INCENTIVE`). Every other column keeps its miner, and new columns
/// come after `prev`'s.
fn reused_columns(s: &Settlement, prev: &Settlement) -> Result<Vec<usize>, String> {
    if s.miners.len() < prev.miners.len() {
        return Err("it has fewer miner columns than the entry before it".into());
    }
    let before: std::collections::HashSet<&PeerId> = prev.miners.iter().collect();
    let mut seen = std::collections::HashSet::new();
    if let Some(p) = s.miners.iter().find(|p| !seen.insert(*p)) {
        return Err(format!("miner {p} has two columns"));
    }
    let mut reused = Vec::new();
    for (c, (now, was)) in s.miners.iter().zip(&prev.miners).enumerate() {
        if now == was {
            continue;
        }
        if before.contains(now) {
            return Err(format!(
                "miner {now} moved to column {c}: the miner columns do not extend the entry before it"
            ));
        }
        let flagged = s.input.recently_registered.as_ref().is_some_and(|r| r.get(c) == Some(&true));
        if !flagged {
            return Err(format!("column {c} went from {was} to {now} without being flagged newly registered"));
        }
        let earned = prev.output.incentive.get(c).copied().unwrap_or(0.0);
        if earned > NO_INCENTIVE {
            return Err(format!("column {c} went from {was} to {now} though it earned {earned} in the entry before"));
        }
        reused.push(c);
    }
    Ok(reused)
}

fn check_yuma_settings(s: &Settlement) -> Result<(), String> {
    if s.input.params != YumaParams::default() {
        return Err("its Yuma parameters are not the orchestrator's".into());
    }
    if s.input.validator_permits.is_some() {
        return Err("it sets validator permits the orchestrator never sets".into());
    }
    let Some(active) = s.input.active.as_ref() else { return Ok(()) };
    let want: Vec<bool> = if s.signed_weights.is_empty() {
        vec![true; s.validators.len()]
    } else {
        s.signed_weights.iter().map(|h| !h.is_empty()).collect()
    };
    if *active != want {
        return Err("its active validators are not the ones whose signed weights it holds".into());
    }
    Ok(())
}

/// Each validator's row of the Yuma input must be the weights its signed
/// request carried (placed in the miner columns), and a row without one
/// must be empty: the orchestrator cannot put weights in a validator's
/// name.
fn check_signed_weights(s: &Settlement, orchestrator: PeerId) -> Result<(), String> {
    use iota_wire::pb;
    use prost::Message;
    if s.signed_weights.is_empty() {
        // A run without validators: its single row is the operator's
        // (the entry's signer), rating the work it counted.
        return if s.validators == [orchestrator] || s.input.weights.iter().all(|r| r.iter().all(|x| *x == 0.0)) {
            Ok(())
        } else {
            Err("its weights carry no validator's signature".into())
        };
    }
    if s.signed_weights.len() != s.validators.len() {
        return Err("one signed request per validator is expected".into());
    }
    let distinct: std::collections::HashSet<&PeerId> = s.work_miners.iter().collect();
    if distinct.len() != s.work_miners.len() {
        return Err("its work lists a miner twice".into());
    }
    let aud = iota_wire::auth::Audience { run_id: s.run_id, orchestrator };
    let columns: std::collections::HashMap<PeerId, usize> = s.miners.iter().enumerate().map(|(c, p)| (*p, c)).collect();
    for (i, (v, hex)) in s.validators.iter().zip(&s.signed_weights).enumerate() {
        let row = s.input.weights.get(i).ok_or("a validator without its row")?;
        if hex.is_empty() {
            if row.iter().any(|x| *x != 0.0) {
                return Err(format!("validator {v} has weights but no signed request"));
            }
            continue;
        }
        let bytes = from_hex(hex).ok_or_else(|| format!("validator {v}'s signed request is not hex"))?;
        let env = pb::Signed::decode(bytes.as_slice()).map_err(|e| format!("validator {v}'s signed request: {e}"))?;
        let sig: [u8; 64] =
            env.signature.as_slice().try_into().map_err(|_| format!("validator {v}'s signature is not 64 bytes"))?;
        let signing =
            iota_wire::auth::signing_bytes(&aud, iota_wire::methods::VALIDATE, env.timestamp_ms, &env.nonce, &env.body);
        if env.peer_id != v.0 || !v.verify(&signing, &sig) {
            return Err(format!("validator {v}'s signed request does not verify under its key"));
        }
        let report = pb::ValidatorReport::decode(env.body.as_slice())
            .map_err(|e| format!("validator {v}'s signed request: {e}"))?;
        let Some(pb::validator_report::Kind::Done(done)) = report.kind else {
            return Err(format!("validator {v}'s signed request is not its ValidationDone"));
        };
        if done.epoch != s.epoch || done.weights.len() != s.work_miners.len() {
            return Err(format!("validator {v}'s signed weights are for another epoch or other miners"));
        }
        // The signed hash of the miners the weights rate (requests before
        // it existed carry none): the work's miners may not be reordered.
        if !done.miners_hash.is_empty()
            && done.miners_hash[..] != crate::validation::sample::work_miners_hash(s.epoch, &s.work_miners)[..]
        {
            return Err(format!("validator {v}'s signed weights rate other miners than the entry's work"));
        }
        let mut want = vec![0.0; s.miners.len()];
        // The epoch's convicted miners are masked (settling.rs).
        for (p, w) in s.work_miners.iter().zip(&done.weights).filter(|(p, _)| !s.convicted.contains(p)) {
            let c = *columns.get(p).ok_or_else(|| format!("miner {p} has no column"))?;
            want[c] = f64::from(*w);
        }
        if *row != want {
            return Err(format!("validator {v}'s row is not the weights it signed"));
        }
    }
    Ok(())
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn from_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok())).collect()
}

/// `bonds` (V x M0) widened with zero columns to M >= M0 miners.
pub fn widen(bonds: &[Vec<f64>], m: usize) -> Vec<Vec<f64>> {
    bonds
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.resize(m.max(r.len()), 0.0);
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORCHESTRATOR: [u8; 32] = [3; 32];

    /// A validator's signed `ValidationDone` (see the orchestrator's tests).
    pub(crate) fn signed_done(
        v: &Identity,
        run_id: u64,
        epoch: u64,
        weights: &[f32],
        miners: &[PeerId],
        orch: PeerId,
    ) -> Vec<u8> {
        use iota_wire::pb;
        use prost::Message;
        let miners_hash = crate::validation::sample::work_miners_hash(epoch, miners).to_vec();
        let done = pb::ValidationDone { epoch, weights: weights.to_vec(), miners_hash };
        let report = pb::ValidatorReport { kind: Some(pb::validator_report::Kind::Done(done)) };
        let body = report.encode_to_vec();
        let aud = iota_wire::auth::Audience { run_id, orchestrator: orch };
        let nonce = vec![epoch as u8; 16];
        let signing = iota_wire::auth::signing_bytes(&aud, iota_wire::methods::VALIDATE, 1_000, &nonce, &body);
        let signature = v.sign(&signing).to_vec();
        pb::Signed { peer_id: v.peer_id().0.to_vec(), timestamp_ms: 1_000, nonce, body, signature }.encode_to_vec()
    }

    /// Two validators (stakes 60 and 40) rating `weights[v]` (f32, as sent).
    fn settlement(epoch: u64, bonds: Option<Vec<Vec<f64>>>, weights: Vec<Vec<f32>>) -> Settlement {
        let miners: Vec<PeerId> = (0..weights[0].len() as u8).map(|i| PeerId([10 + i; 32])).collect();
        settlement_of(epoch, bonds, weights, miners, None)
    }

    /// `settlement` over these miner columns, these flagged newly registered.
    fn settlement_of(
        epoch: u64,
        bonds: Option<Vec<Vec<f64>>>,
        weights: Vec<Vec<f32>>,
        miners: Vec<PeerId>,
        recently_registered: Option<Vec<bool>>,
    ) -> Settlement {
        let validators = [Identity::from_seed([1; 32]), Identity::from_seed([2; 32])];
        let orch = Identity::from_seed(ORCHESTRATOR).peer_id();
        let signed_weights =
            validators.iter().zip(&weights).map(|(v, w)| to_hex(&signed_done(v, 7, epoch, w, &miners, orch))).collect();
        let rows = weights.iter().map(|r| r.iter().map(|x| f64::from(*x)).collect()).collect();
        let input =
            YumaInput { stakes: vec![60.0, 40.0], weights: rows, bonds, recently_registered, ..YumaInput::default() };
        let output = yuma::run(&input).unwrap();
        Settlement {
            run_id: 7,
            epoch,
            validators: validators.iter().map(|v| v.peer_id()).collect(),
            work_miners: miners.clone(),
            miners,
            input,
            output,
            rolled_back: false,
            convicted: Vec::new(),
            signed_weights,
            clasp: Vec::new(),
            proofs: Vec::new(),
            step_proofs: Vec::new(),
        }
    }

    /// The archived header of a gradient frame `id` signed for run 7,
    /// epoch `epoch`'s attempt (0, 8, 0), payload hash `payload`.
    fn frame_header(id: &Identity, epoch: u32, payload: u8) -> Vec<u8> {
        let grad = iota_core::wire::Direction::ActivationGrad;
        iota_core::frame_equivocation::signed_test_header(id, 7, epoch, 0, grad, payload)
    }

    /// An entry convicting a miner on a proof verifies, and `verify`
    /// re-checks the proof: an altered header, a proof of another epoch
    /// or against a miner the entry does not convict fails it.
    #[test]
    fn a_conviction_on_a_proof_verifies_and_a_forged_proof_does_not() {
        let id = Identity::from_seed(ORCHESTRATOR);
        let cheat = Identity::from_seed([42; 32]);
        let miners = vec![PeerId([10; 32]), PeerId([11; 32]), cheat.peer_id()];
        let weights = vec![vec![0.5, 0.5, 0.0], vec![0.4, 0.6, 0.0]];
        let with = |proofs: Vec<FrameEquivocation>, convicted: Vec<PeerId>| {
            let mut s = settlement_of(0, None, weights.clone(), miners.clone(), None);
            (s.proofs, s.convicted) = (proofs, convicted);
            verify(&[seal(None, &s, &id)], Some(id.peer_id()))
        };
        let (a, b) = (frame_header(&cheat, 0, 1), frame_header(&cheat, 0, 2));
        let proof = FrameEquivocation::check(7, cheat.peer_id(), &a, &b).unwrap();
        assert!(with(vec![proof.clone()], vec![cheat.peer_id()]).is_ok());
        let err = |r: Result<Verified, LedgerError>| r.unwrap_err().what;
        assert!(err(with(vec![proof.clone()], Vec::new())).contains("does not convict"));
        let mut altered = proof.clone();
        let n = altered.headers[1].len();
        altered.headers[1][n - 10] ^= 1;
        assert!(err(with(vec![altered], vec![cheat.peer_id()])).contains("does not hold"));
        let mut renamed = proof.clone();
        renamed.attempt = 5;
        assert!(err(with(vec![renamed], vec![cheat.peer_id()])).contains("not what its headers say"));
        let (c, d) = (frame_header(&cheat, 1, 1), frame_header(&cheat, 1, 2));
        let later = FrameEquivocation::check(7, cheat.peer_id(), &c, &d).unwrap();
        assert!(err(with(vec![later], vec![cheat.peer_id()])).contains("another epoch"));
    }

    fn chain(id: &Identity) -> Vec<Entry> {
        let s0 = settlement(0, None, vec![vec![0.5, 0.5, 0.0], vec![0.4, 0.6, 0.0]]);
        let b0 = widen(&s0.output.bonds, 4);
        let s1 = settlement(1, Some(b0), vec![vec![0.3, 0.3, 0.0, 0.4], vec![0.2, 0.4, 0.0, 0.4]]);
        let e0 = seal(None, &s0, id);
        let e1 = seal(Some(&e0), &s1, id);
        vec![e0, e1]
    }

    #[test]
    fn a_sealed_chain_verifies_and_sums_the_balances() {
        let id = Identity::from_seed(ORCHESTRATOR);
        let entries = chain(&id);
        let v = verify(&entries, Some(id.peer_id())).unwrap();
        assert_eq!(v.entries, 2);
        let total: f64 = v.balances.values().sum();
        assert!((total - 2.0).abs() < 1e-9, "two epochs of emission 1: {total}");
        assert_eq!(v.balances.get(&PeerId([12; 32])).copied().unwrap_or(0.0), 0.0, "rated zero by everyone");
        assert!(v.balances[&PeerId([13; 32])] > 0.0, "a miner that joined in epoch 1 is paid");
    }

    #[test]
    fn every_flipped_byte_is_caught_and_named() {
        let id = Identity::from_seed(ORCHESTRATOR);
        let entries = chain(&id);
        // A flipped byte in each part of the second entry (the body at
        // several places), and in the first entry's body.
        for at in [0usize, 10, 200, 400] {
            let mut t = entries.clone();
            let mut body = t[1].body.clone().into_bytes();
            let at = at.min(body.len() - 1);
            body[at] ^= 0x01;
            t[1].body = String::from_utf8_lossy(&body).into_owned();
            let e = verify(&t, Some(id.peer_id())).unwrap_err();
            assert_eq!(e.seq, 1, "{e}");
        }
        let mut t = entries.clone();
        t[0].body = t[0].body.replacen("0.5", "0.6", 1);
        assert_eq!(verify(&t, None).unwrap_err().seq, 0);
        let mut t = entries.clone();
        t[1].signature[5] ^= 1;
        assert!(verify(&t, None).unwrap_err().what.contains("signature"));
        let mut t = entries.clone();
        t[0].prev[0] ^= 1;
        assert!(verify(&t, None).unwrap_err().what.contains("link"));
        // Re-sealed by someone else: the signer does not match.
        let mallory = Identity::from_seed([4; 32]);
        let s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
        let forged = vec![entries[0].clone(), seal(Some(&entries[0]), &s1, &mallory)];
        assert!(verify(&forged, None).unwrap_err().what.contains("not the orchestrator"));
        // A removed entry breaks the sequence.
        assert!(verify(&entries[1..], None).is_err());
    }

    #[test]
    fn a_re_signed_lie_is_caught_by_the_recompute() {
        // The orchestrator's own key cannot make a wrong payout verify: the
        // recorded output must be what the recorded input gives, and the
        // bonds must follow from the entry before.
        let id = Identity::from_seed(ORCHESTRATOR);
        let entries = chain(&id);
        let mut s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
        s1.output.emission.miners.swap(0, 3);
        let lie = vec![entries[0].clone(), seal(Some(&entries[0]), &s1, &id)];
        assert!(verify(&lie, None).unwrap_err().what.contains("Yuma output"));
        let mut s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
        s1.input.bonds = Some(vec![vec![0.0; 4]; 2]);
        s1.output = yuma::run(&s1.input).unwrap();
        let reset = vec![entries[0].clone(), seal(Some(&entries[0]), &s1, &id)];
        assert!(verify(&reset, None).unwrap_err().what.contains("bonds"));
        // The validators' signed weights moved onto other miners (the
        // work's order changed, rows and output recomputed): caught by
        // the signed miners hash. A miner listed twice too.
        let mut s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
        s1.work_miners.swap(0, 1);
        for row in &mut s1.input.weights {
            row.swap(0, 1);
        }
        s1.output = yuma::run(&s1.input).unwrap();
        let moved = vec![entries[0].clone(), seal(Some(&entries[0]), &s1, &id)];
        assert!(verify(&moved, None).unwrap_err().what.contains("other miners"), "{:?}", verify(&moved, None));
        let mut s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
        let first = s1.work_miners[0];
        s1.work_miners[1] = first;
        let twice = vec![entries[0].clone(), seal(Some(&entries[0]), &s1, &id)];
        assert!(verify(&twice, None).unwrap_err().what.contains("twice"));
        // The settings no signature covers, each changed with the output
        // recomputed: a signing validator switched off, other stakes,
        // another emission split, an established miner's bonds wiped.
        let tamper = |change: &dyn Fn(&mut Settlement)| {
            let mut s1: Settlement = serde_json::from_str(&entries[1].body).unwrap();
            change(&mut s1);
            s1.output = yuma::run(&s1.input).unwrap();
            verify(&[entries[0].clone(), seal(Some(&entries[0]), &s1, &id)], None).unwrap_err().what
        };
        assert!(tamper(&|s| s.input.active = Some(vec![false, true])).contains("active"));
        assert!(tamper(&|s| s.input.stakes = vec![40.0, 60.0]).contains("stakes"));
        assert!(tamper(&|s| s.input.params.miner_share = 0.0).contains("parameters"));
        assert!(tamper(&|s| s.input.validator_permits = Some(vec![true, false])).contains("permits"));
        assert!(tamper(&|s| s.input.recently_registered = Some(vec![true; 4])).contains("newly registered"));
    }

    /// Once the columns are all taken, a departed miner's column that earned
    /// nothing may go to a newcomer, flagged newly registered; any other
    /// change of a column's miner is refused and named.
    #[test]
    fn a_column_that_earned_nothing_may_go_to_a_newcomer_and_nothing_else_may_change_hands() {
        let id = Identity::from_seed(ORCHESTRATOR);
        let m = |i: u8| PeerId([10 + i; 32]);
        // Miner 2 is rated zero by everyone: its column earns nothing.
        let s0 = settlement(0, None, vec![vec![0.5, 0.5, 0.0], vec![0.4, 0.6, 0.0]]);
        assert!(s0.output.incentive[2] <= NO_INCENTIVE && s0.output.incentive[0] > 0.0, "{:?}", s0.output);
        let e0 = seal(None, &s0, &id);
        let next = |miners: Vec<PeerId>, flagged: Option<Vec<bool>>| {
            let b0 = widen(&s0.output.bonds, 3);
            let s1 = settlement_of(1, Some(b0), vec![vec![0.3, 0.3, 0.4], vec![0.2, 0.4, 0.4]], miners, flagged);
            verify(&[e0.clone(), seal(Some(&e0), &s1, &id)], None)
        };
        let newcomer = PeerId([77; 32]);
        let v = next(vec![m(0), m(1), newcomer], Some(vec![false, false, true])).unwrap();
        assert!(v.balances[&newcomer] > 0.0, "the newcomer in the reused column is paid");
        let refused = |miners, flagged| next(miners, flagged).unwrap_err().what;
        assert!(refused(vec![m(0), m(1), newcomer], None).contains("flagged newly registered"));
        // Column 0 earned: it is not the newcomer's to take.
        assert!(refused(vec![newcomer, m(1), m(2)], Some(vec![true, false, false])).contains("earned"));
        // An established miner moved onto another's column.
        assert!(refused(vec![m(0), m(1), m(0)], Some(vec![false, false, true])).contains("two columns"));
        assert!(refused(vec![m(0), m(2), newcomer], Some(vec![false, true, true])).contains("moved"));
        assert!(refused(vec![m(0), m(1)], None).contains("fewer miner columns"));
    }
}
