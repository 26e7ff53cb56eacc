//! Node identities: an Ed25519 key per miner, validator and orchestrator.
//! The public key is the node's `PeerId`; frames and requests are signed with
//! the private key, and a miner's TLS certificate carries the same key, so a
//! QUIC peer is authenticated as the identity the control plane published.

use std::fmt;

use curve25519_dalek::edwards::CompressedEdwardsY;
use ed25519_dalek::{Signature, VerifyingKey};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde::{Deserialize, Serialize};

/// A node's public identity (its Ed25519 public key). Serialised as 64 hex
/// characters (readable in state files, usable as a map key in JSON).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerId(pub [u8; 32]);

impl PeerId {
    /// Bytes `8 i .. 8 i + 8` as one big-endian word: words compare as
    /// the bytes do.
    fn word(&self, i: usize) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.0[8 * i..8 * i + 8]);
        u64::from_be_bytes(w)
    }
}

/// The bytes' order (what `derive` gives), compared a word at a time:
/// the derived order called `memcmp` for every comparison, and the maps
/// keyed by peer made it 7% of a 2,000-miner simulation.
impl Ord for PeerId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (0..4).map(|i| self.word(i).cmp(&other.word(i))).find(|o| o.is_ne()).unwrap_or(std::cmp::Ordering::Equal)
    }
}

impl PartialOrd for PeerId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Serialize for PeerId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

impl<'de> Deserialize<'de> for PeerId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        PeerId::from_hex(&s).ok_or_else(|| serde::de::Error::custom("peer id must be 64 hex characters"))
    }
}

impl PeerId {
    /// Verifies an Ed25519 signature by this identity, strictly: the key
    /// must be a canonical encoding of a point that is not of small order,
    /// and the signature's R must be canonical and not of small order and its
    /// S fully reduced. A permissive verifier accepts a small-order key with
    /// a "universal" signature that is valid for every message, and several
    /// encodings of one signature (malleability); both are refused here.
    pub fn verify(&self, msg: &[u8], sig: &[u8; 64]) -> bool {
        if !self.is_acceptable() {
            return false;
        }
        let Ok(key) = VerifyingKey::from_bytes(&self.0) else { return false };
        key.verify_strict(msg, &Signature::from_bytes(sig)).is_ok()
    }

    /// Whether this can be anybody's key: a canonically encoded curve point
    /// of large order. Identities failing this are refused everywhere.
    pub fn is_acceptable(&self) -> bool {
        let Some(point) = CompressedEdwardsY(self.0).decompress() else { return false };
        point.compress().0 == self.0 && !point.is_small_order()
    }

    pub fn to_hex(&self) -> String {
        // Without a `format!` per byte: keys and log lines name peers
        // often (a simulated epoch of 2,000 miners, millions of times).
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push(DIGITS[usize::from(b >> 4)] as char);
            s.push(DIGITS[usize::from(b & 15)] as char);
        }
        s
    }

    pub fn from_hex(s: &str) -> Option<PeerId> {
        if s.len() != 64 || !s.is_ascii() {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(PeerId(out))
    }
}

impl fmt::Display for PeerId {
    /// Short form for logs: the first 8 bytes in hex.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PeerId({self})")
    }
}

/// A node's private identity. `Debug` never shows the secret.
pub struct Identity {
    seed: [u8; 32],
    key: Ed25519KeyPair,
    id: PeerId,
}

/// PKCS#8 v1 prefix of an Ed25519 private key (RFC 8410): the 32-byte seed
/// follows it.
const PKCS8_ED25519_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

impl Identity {
    /// The identity with this 32-byte secret seed.
    pub fn from_seed(seed: [u8; 32]) -> Identity {
        let key = Ed25519KeyPair::from_seed_unchecked(&seed).expect("any 32-byte seed is a valid Ed25519 key");
        let mut pk = [0u8; 32];
        pk.copy_from_slice(key.public_key().as_ref());
        Identity { seed, key, id: PeerId(pk) }
    }

    /// A fresh identity from the OS random generator.
    pub fn generate() -> Identity {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed).expect("OS random generator");
        Identity::from_seed(seed)
    }

    pub fn peer_id(&self) -> PeerId {
        self.id
    }

    /// The secret seed (for storing the identity; never log it).
    pub fn seed(&self) -> &[u8; 32] {
        &self.seed
    }

    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        let mut out = [0u8; 64];
        out.copy_from_slice(self.key.sign(msg).as_ref());
        out
    }

    /// The private key as PKCS#8 DER (what certificate and TLS libraries take).
    pub fn pkcs8_der(&self) -> Vec<u8> {
        let mut v = PKCS8_ED25519_PREFIX.to_vec();
        v.extend_from_slice(&self.seed);
        v
    }
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Identity({}, secret hidden)", self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Peers order as their bytes do: pairs that differ in any one byte
    /// (one word or another, high bits or low), equal pairs, and pairs
    /// sharing long prefixes.
    #[test]
    fn peers_order_as_their_bytes() {
        let mut rng = crate::Rng::new(5);
        for n in 0..20_000 {
            let mut a = [0u8; 32];
            for b in &mut a {
                *b = rng.below(4) as u8 * 85; // few values: many shared prefixes
            }
            let mut b = a;
            if n % 7 != 0 {
                let at = rng.below(32) as usize;
                b[at] = rng.below(256) as u8;
            }
            let (pa, pb) = (PeerId(a), PeerId(b));
            assert_eq!(pa.cmp(&pb), a.cmp(&b), "{a:?} against {b:?}");
            assert_eq!(pa.partial_cmp(&pb), Some(a.cmp(&b)));
        }
    }

    #[test]
    fn sign_verify_and_hex() {
        let a = Identity::from_seed([7; 32]);
        let b = Identity::generate();
        let sig = a.sign(b"frame");
        assert!(a.peer_id().verify(b"frame", &sig));
        assert!(!a.peer_id().verify(b"framf", &sig));
        assert!(!b.peer_id().verify(b"frame", &sig));
        assert_eq!(PeerId::from_hex(&a.peer_id().to_hex()), Some(a.peer_id()));
        assert_eq!(PeerId::from_hex("zz"), None);
        let p = PeerId(std::array::from_fn(|i| (i * 37 + 5) as u8));
        assert_eq!(
            p.to_hex(),
            p.0.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            "lower-case hex, byte by byte"
        );
        assert!(!format!("{a:?}").contains(&format!("{:02x}{:02x}", 7, 7)));
        assert!(a.peer_id().is_acceptable());
        // PKCS#8 form is accepted by ring and yields the same public key.
        let k = Ed25519KeyPair::from_pkcs8_maybe_unchecked(&a.pkcs8_der()).unwrap();
        assert_eq!(k.public_key().as_ref(), &a.peer_id().0);
    }

    /// The eight points of small order, encoded canonically, plus the
    /// non-canonical encodings of the same points (y + p, and the sign bit
    /// set on x = 0): the "weak keys" of the EdDSA literature.
    fn weak_keys() -> Vec<[u8; 32]> {
        use curve25519_dalek::constants::EIGHT_TORSION;
        let mut keys: Vec<[u8; 32]> = EIGHT_TORSION.iter().map(|p| p.compress().0).collect();
        // p = 2^255 - 19; y = 0 and y = 1 have non-canonical twins y + p
        // (both below 2^255): 0 + p and 1 + p.
        let mut p = [0xffu8; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        let mut p1 = p;
        p1[0] = 0xee;
        keys.push(p);
        keys.push(p1);
        // The identity (y = 1, x = 0) with the sign bit set.
        let mut neg_zero = [0u8; 32];
        neg_zero[0] = 1;
        neg_zero[31] = 0x80;
        keys.push(neg_zero);
        keys
    }

    #[test]
    fn weak_keys_and_their_universal_signatures_are_refused() {
        // R = the identity point, S = 0 verifies for every message under a
        // small-order key when the verifier does not check the key's order.
        let mut identity_point = [0u8; 32];
        identity_point[0] = 1;
        let mut universal = [0u8; 64];
        universal[..32].copy_from_slice(&identity_point);
        for key in weak_keys() {
            let peer = PeerId(key);
            for msg in [&b"register"[..], b"anything at all"] {
                assert!(!peer.verify(msg, &universal), "universal signature accepted for {key:02x?}");
            }
            // R = the key itself, S = 0: also valid for any message under a
            // permissive, cofactored check.
            let mut sig = [0u8; 64];
            sig[..32].copy_from_slice(&key);
            assert!(!peer.verify(b"register", &sig), "R = A, S = 0 accepted for {key:02x?}");
            assert!(!peer.is_acceptable(), "{key:02x?} accepted as a key");
        }
    }

    #[test]
    fn malleated_signatures_are_refused() {
        let a = Identity::from_seed([9; 32]);
        let sig = a.sign(b"heartbeat");
        assert!(a.peer_id().verify(b"heartbeat", &sig));
        // S + L encodes the same scalar: a second valid-looking signature.
        const L: [u8; 32] = [
            0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14, 0, 0, 0, 0,
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
        ];
        let mut m = sig;
        let mut carry = 0u16;
        for i in 0..32 {
            let v = m[32 + i] as u16 + L[i] as u16 + carry;
            m[32 + i] = v as u8;
            carry = v >> 8;
        }
        assert_eq!(carry, 0);
        assert!(!a.peer_id().verify(b"heartbeat", &m), "S + L accepted");
        // A small-order R with the honest S does not verify either.
        let mut r = sig;
        r[..32].copy_from_slice(&curve25519_dalek::constants::EIGHT_TORSION[1].compress().0);
        assert!(!a.peer_id().verify(b"heartbeat", &r));
    }
}
