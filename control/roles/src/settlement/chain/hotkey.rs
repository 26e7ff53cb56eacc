//! Bittensor hotkeys: sr25519 keypairs (Schnorr signatures over
//! Ristretto255, the `schnorrkel` crate) and their SS58 addresses.
//!
//! A hotkey comes from a 32-byte mini-secret seed, expanded the way
//! Substrate's `sr25519::Pair::from_seed` does (Ed25519-style expansion),
//! so the same seed gives the same public key and address as `btcli` and
//! the Python SDK's `Keypair.create_from_seed`. Messages are signed in
//! Substrate's signing context (`b"substrate"`), so a signature made here
//! verifies with any Substrate tool and vice versa. The public key's SS58
//! address (prefix 42 on Bittensor) is
//! `base58(prefix || key || blake2b-512("SS58PRE" || prefix || key)[..2])`.

use blake2::{Blake2b512, Digest};
use schnorrkel::{ExpansionMode, Keypair, MiniSecretKey, PublicKey, Signature};

/// Bittensor's SS58 address prefix (Substrate's generic one).
pub const BITTENSOR_SS58_PREFIX: u8 = 42;

/// The signing context Substrate's sr25519 keys sign and verify in.
const SIGNING_CONTEXT: &[u8] = b"substrate";

/// Domain of the SS58 checksum.
const SS58_PRE: &[u8] = b"SS58PRE";

/// An sr25519 hotkey. Its `Debug` shows the address only.
pub struct Hotkey {
    pair: Keypair,
}

impl Hotkey {
    /// The keypair of a 32-byte mini-secret seed (Substrate's "secret
    /// seed", as `subkey inspect` prints it).
    pub fn from_seed(seed: &[u8; 32]) -> Hotkey {
        let mini = MiniSecretKey::from_bytes(seed).expect("any 32 bytes are a mini-secret key");
        Hotkey { pair: mini.expand_to_keypair(ExpansionMode::Ed25519) }
    }

    /// The 32-byte public key (the on-chain account id).
    pub fn public(&self) -> [u8; 32] {
        self.pair.public.to_bytes()
    }

    /// The SS58 address on Bittensor (prefix 42).
    pub fn ss58(&self) -> String {
        ss58_encode(BITTENSOR_SS58_PREFIX, &self.public()).expect("42 is a one-byte prefix")
    }

    /// A signature over `msg` in Substrate's signing context. Randomised
    /// (schnorrkel mixes OS randomness into the nonce), so two signatures
    /// of one message differ; both verify.
    pub fn sign(&self, msg: &[u8]) -> [u8; 64] {
        self.pair.sign_simple(SIGNING_CONTEXT, msg).to_bytes()
    }
}

impl std::fmt::Debug for Hotkey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Hotkey").field(&self.ss58()).finish()
    }
}

/// Whether `sig` is `public`'s signature of `msg` (Substrate's context).
/// False for a malformed key or signature.
pub fn verify(public: &[u8; 32], msg: &[u8], sig: &[u8; 64]) -> bool {
    let (Ok(key), Ok(sig)) = (PublicKey::from_bytes(public), Signature::from_bytes(sig)) else {
        return false;
    };
    key.verify_simple(SIGNING_CONTEXT, msg, &sig).is_ok()
}

/// What is wrong with an SS58 address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ss58Error {
    #[error("prefix {0} needs the two-byte SS58 form, which is not supported (0..=63 are)")]
    UnsupportedPrefix(u16),
    #[error("not base58")]
    NotBase58,
    #[error("{0} bytes: a one-byte-prefix address of a 32-byte key has 35")]
    BadLength(usize),
    #[error("the checksum does not match")]
    BadChecksum,
}

fn checksum(prefix: u8, key: &[u8; 32]) -> [u8; 2] {
    let mut h = Blake2b512::new();
    h.update(SS58_PRE);
    h.update([prefix]);
    h.update(key);
    let d = h.finalize();
    [d[0], d[1]]
}

/// The SS58 address of a 32-byte public key under a one-byte prefix
/// (0..=63; Bittensor's is 42).
pub fn ss58_encode(prefix: u8, key: &[u8; 32]) -> Result<String, Ss58Error> {
    if prefix > 63 {
        return Err(Ss58Error::UnsupportedPrefix(u16::from(prefix)));
    }
    let mut raw = Vec::with_capacity(35);
    raw.push(prefix);
    raw.extend_from_slice(key);
    raw.extend_from_slice(&checksum(prefix, key));
    Ok(bs58::encode(raw).into_string())
}

/// The prefix and public key of an SS58 address (one-byte prefixes only:
/// a two-byte-prefix address is refused for its length), its checksum
/// checked.
pub fn ss58_decode(addr: &str) -> Result<(u8, [u8; 32]), Ss58Error> {
    let raw = bs58::decode(addr).into_vec().map_err(|_| Ss58Error::NotBase58)?;
    if raw.len() != 35 {
        return Err(Ss58Error::BadLength(raw.len()));
    }
    let prefix = raw[0];
    if prefix > 63 {
        return Err(Ss58Error::UnsupportedPrefix(u16::from(prefix)));
    }
    let key: [u8; 32] = raw[1..33].try_into().expect("32 bytes");
    if raw[33..] != checksum(prefix, &key) {
        return Err(Ss58Error::BadChecksum);
    }
    Ok((prefix, key))
}
