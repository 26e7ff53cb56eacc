//! The SCALE encoding (Substrate's wire format) of the one call the
//! subtensor adapter makes, written out by hand: fixed-width integers are
//! little-endian, a `Vec<T>` is its length as a compact integer followed by
//! its items, and a call is its pallet's index, the call's index, then its
//! arguments in order.

/// Appends `n` as a SCALE compact integer: one byte for n < 2^6, two for
/// n < 2^14, four for n < 2^30 (the value shifted left by two, the low two
/// bits naming the mode, little-endian), and beyond that a byte holding
/// `(bytes - 4) << 2 | 0b11` followed by the value's little-endian bytes
/// with no trailing zeros.
pub fn encode_compact(n: u64, out: &mut Vec<u8>) {
    if n < 1 << 6 {
        out.push((n as u8) << 2);
    } else if n < 1 << 14 {
        out.extend_from_slice(&(((n as u16) << 2) | 0b01).to_le_bytes());
    } else if n < 1 << 30 {
        out.extend_from_slice(&(((n as u32) << 2) | 0b10).to_le_bytes());
    } else {
        let bytes = n.to_le_bytes();
        let len = 8 - n.leading_zeros() as usize / 8;
        out.push((((len - 4) as u8) << 2) | 0b11);
        out.extend_from_slice(&bytes[..len]);
    }
}

/// Appends a `Vec<u16>`: compact length, then each item little-endian.
pub fn encode_vec_u16(xs: &[u16], out: &mut Vec<u8>) {
    encode_compact(xs.len() as u64, out);
    for x in xs {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

/// Where `SubtensorModule.set_weights` sits in the runtime: the pallet's
/// index in `construct_runtime!` and the call's `#[pallet::call_index]`.
/// Both come from the runtime metadata; [`CallIndex::FINNEY_SET_WEIGHTS`]
/// holds the values of subtensor's runtime as of spec version 396.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallIndex {
    pub pallet: u8,
    pub call: u8,
}

impl CallIndex {
    /// `SubtensorModule: pallet_subtensor = 7` in subtensor's
    /// `runtime/src/lib.rs`, and `#[pallet::call_index(0)]` on
    /// `set_weights` in `pallets/subtensor/src/macros/dispatches.rs`.
    /// Check against the live metadata before submitting anything.
    pub const FINNEY_SET_WEIGHTS: CallIndex = CallIndex { pallet: 7, call: 0 };
}

/// The SCALE-encoded call `SubtensorModule.set_weights(netuid: u16, dests:
/// Vec<u16>, weights: Vec<u16>, version_key: u64)` (`NetUid` encodes as a
/// plain `u16`).
pub fn set_weights_call(at: CallIndex, netuid: u16, dests: &[u16], weights: &[u16], version_key: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + 2 + 2 * 5 + 4 * dests.len() + 8);
    out.push(at.pallet);
    out.push(at.call);
    out.extend_from_slice(&netuid.to_le_bytes());
    encode_vec_u16(dests, &mut out);
    encode_vec_u16(weights, &mut out);
    out.extend_from_slice(&version_key.to_le_bytes());
    out
}
