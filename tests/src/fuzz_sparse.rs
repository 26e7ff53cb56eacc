//! The sparse merge codec's rows under the `codec_decode` target (codec id
//! 4): hostile rows decode to finite values or are refused, and a frame
//! the reduce's check passes reads by range exactly as it decodes whole.

use iota_dataplane::sparse::{SPARSE_BLOCK, check_frame, decode_frame_into, decode_range, decode_sparse};

/// `len` values of rows keeping `cols` each (clamped to a block), from
/// `payload`.
pub fn sparse_rows(len: usize, cols: usize, payload: &[u8]) {
    let k = cols.min(SPARSE_BLOCK);
    if let Ok(v) = decode_sparse(payload, len, k) {
        assert_eq!(v.len(), len);
        assert!(v.iter().all(|x| x.is_finite()));
        assert!(v.chunks(SPARSE_BLOCK).all(|b| b.iter().filter(|x| **x != 0.0).count() <= k), "more than k kept");
    }
    let checked = check_frame(payload, len as u64, k).is_ok();
    let mut whole = vec![0.0f32; len];
    let decoded = decode_frame_into(payload, &mut whole, k).is_ok();
    assert_eq!(checked, decoded, "the reduce's check and the whole decode disagree");
    // The reduce's windows: within a block, a range of a checked frame is
    // that range of the whole decode; an unchecked one never panics.
    let mut part = vec![0.0f32; 1024];
    for at in (0..len).step_by(1024) {
        let n = 1024.min(len - at).min(SPARSE_BLOCK - at % SPARSE_BLOCK);
        let got = decode_range(payload, at, &mut part[..n]);
        if checked {
            assert!(got.is_ok(), "a checked frame's range at {at}");
            assert_eq!(&part[..n], &whole[at..at + n], "range at {at}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed sparse seeds are frames the check passes (so the
    /// fuzzer starts from rows whose ranges it compares), and a bit
    /// flipped anywhere in them is refused or still reads consistently.
    #[test]
    fn the_sparse_seeds_are_valid_frames() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/codec_decode");
        for (name, len, k) in [("sparse-300x4", 300usize, 4usize), ("sparse-20000x3", 20_000, 3)] {
            let seed = std::fs::read(dir.join(name)).unwrap();
            let payload = &seed[5..];
            assert_eq!(usize::from(u16::from_le_bytes([seed[1], seed[2]])), len, "{name}");
            check_frame(payload, len as u64, k).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            for bit in 0..payload.len() * 8 {
                let mut flipped = payload.to_vec();
                flipped[bit / 8] ^= 1 << (bit % 8);
                sparse_rows(len, k, &flipped);
            }
        }
    }
}
