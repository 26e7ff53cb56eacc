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

use iota_core::{Identity, PeerId};
use serde::{Deserialize, Serialize};

use super::yuma::{self, YumaInput, YumaOutput};

/// Domain separation for entry hashes.
const ENTRY_DOMAIN: &[u8] = b"iota-rs ledger entry v1\0";

/// How far a recorded emission total may stray from the epoch's emission
/// (relative; sums of f64 shares).
const EMISSION_TOLERANCE: f64 = 1e-9;

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
    /// as a uid does on chain).
    pub miners: Vec<PeerId>,
    pub input: YumaInput,
    pub output: YumaOutput,
    /// The epoch's merge was rolled back.
    pub rolled_back: bool,
    /// Miners the validators' stake convicted this epoch.
    pub convicted: Vec<PeerId>,
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
        if let Some((l, ls)) = &last {
            if s.epoch <= l.epoch || s.run_id != ls.run_id {
                return Err(fail(format!("follows epoch {} of run {}", l.epoch, ls.run_id)));
            }
            if s.validators != ls.validators || !s.miners.starts_with(&ls.miners) {
                return Err(fail("its validators or miner columns do not extend the entry before it".into()));
            }
            if s.input.bonds.as_ref() != Some(&widen(&ls.output.bonds, s.miners.len())) {
                return Err(fail("its bonds are not the ones the entry before it produced".into()));
            }
        } else if s.input.bonds.is_some() {
            return Err(fail("the first entry starts from bonds nobody recorded".into()));
        }
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

    fn settlement(epoch: u64, bonds: Option<Vec<Vec<f64>>>, weights: Vec<Vec<f64>>) -> Settlement {
        let input = YumaInput { stakes: vec![60.0, 40.0], weights, bonds, ..YumaInput::default() };
        let output = yuma::run(&input).unwrap();
        let miners = (0..input.weights[0].len() as u8).map(|i| PeerId([10 + i; 32])).collect();
        Settlement {
            run_id: 7,
            epoch,
            validators: vec![PeerId([1; 32]), PeerId([2; 32])],
            miners,
            input,
            output,
            rolled_back: false,
            convicted: Vec::new(),
        }
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
        let id = Identity::from_seed([3; 32]);
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
        let id = Identity::from_seed([3; 32]);
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
        let id = Identity::from_seed([3; 32]);
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
    }
}
