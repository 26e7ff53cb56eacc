//! BLAKE3 of a buffer put together from its pieces' chaining values, so a
//! loop that writes a buffer piece by piece (the streamed reduce) can hash
//! each piece while it is still in cache, on whichever thread wrote it,
//! instead of reading the whole buffer back from memory afterwards. The
//! hash is `blake3::hash` of the whole buffer (tested against it): pieces
//! of a power-of-two number of BLAKE3 chunks are whole subtrees of
//! BLAKE3's tree, and every split of that tree above one piece falls on a
//! piece boundary.

use blake3::hazmat::{ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root};

/// Whether pieces of `len` bytes are whole subtrees of BLAKE3's tree (a
/// power of two number of its 1 KiB chunks), as `root_of_pieces` needs.
pub fn is_subtree_len(len: usize) -> bool {
    len >= blake3::CHUNK_LEN && len.is_power_of_two()
}

/// The chaining value of piece `index` of a buffer cut in pieces of
/// `piece_len` bytes (`bytes`: that piece, the last one maybe shorter).
/// Only for a buffer longer than one piece: a buffer of one piece has no
/// pieces, only its root (`blake3::hash`).
pub fn piece_cv(index: usize, piece_len: usize, bytes: &[u8]) -> ChainingValue {
    let offset = (index as u64).saturating_mul(piece_len as u64);
    let mut h = blake3::Hasher::new();
    h.set_input_offset(offset);
    h.update(bytes);
    h.finalize_non_root()
}

/// `blake3::hash` of a `total`-byte buffer from the chaining values of its
/// pieces (`piece_cv`, in order), each `piece_len` bytes but the last.
/// None where the pieces do not make that buffer: `piece_len` not a whole
/// subtree, `total` not longer than one piece, or the wrong number of
/// pieces.
pub fn root_of_pieces(cvs: &[ChainingValue], piece_len: usize, total: u64) -> Option<[u8; 32]> {
    let piece = piece_len as u64;
    if !is_subtree_len(piece_len) || total <= piece || total.div_ceil(piece) != cvs.len() as u64 {
        return None;
    }
    let left = left_subtree_len(total);
    let l = subtree(cvs, piece, 0, left)?;
    let r = subtree(cvs, piece, left / piece, total - left)?;
    Some(*merge_subtrees_root(&l, &r, Mode::Hash).as_bytes())
}

/// The chaining value of the subtree of `len` bytes that starts at piece
/// `first`: a piece's own where it is one piece, else its two children's
/// merged (BLAKE3's split: `left_subtree_len`, a power of two chunks no
/// shorter than a piece, so on a piece boundary).
fn subtree(cvs: &[ChainingValue], piece: u64, first: u64, len: u64) -> Option<ChainingValue> {
    if len <= piece {
        return cvs.get(usize::try_from(first).ok()?).copied();
    }
    let left = left_subtree_len(len);
    let l = subtree(cvs, piece, first, left)?;
    let r = subtree(cvs, piece, first + left / piece, len - left)?;
    Some(merge_subtrees_non_root(&l, &r, Mode::Hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces' root is `blake3::hash` of the whole for buffers of one
    /// piece and a byte up to many pieces, whole or with a short last
    /// piece, and for several piece sizes; anything else is refused.
    #[test]
    fn the_root_of_the_pieces_is_the_hash_of_the_whole() {
        let mut rng = iota_core::Rng::new(5);
        let data: Vec<u8> = (0..(300 << 10)).map(|_| (rng.next_u64() >> 56) as u8).collect();
        for piece in [1024usize, 4096, 32 << 10] {
            for total in [piece + 1, 2 * piece, 2 * piece + 7, 3 * piece, 5 * piece - 1, 9 * piece, data.len()] {
                let total = total.min(data.len());
                if total <= piece {
                    continue;
                }
                let bytes = &data[..total];
                let cvs: Vec<ChainingValue> =
                    bytes.chunks(piece).enumerate().map(|(i, p)| piece_cv(i, piece, p)).collect();
                let root = root_of_pieces(&cvs, piece, total as u64);
                assert_eq!(root, Some(*blake3::hash(bytes).as_bytes()), "piece {piece}, total {total}");
                // One piece short is refused; a piece changed changes the root.
                assert_eq!(root_of_pieces(&cvs[..cvs.len() - 1], piece, total as u64), None);
                let mut changed = bytes.to_vec();
                changed[total / 2] ^= 1;
                let k = total / 2 / piece;
                let mut cvs2 = cvs.clone();
                cvs2[k] = piece_cv(k, piece, changed.chunks(piece).nth(k).unwrap());
                assert_ne!(root_of_pieces(&cvs2, piece, total as u64), root);
            }
        }
        assert!(!is_subtree_len(3 * 1024) && !is_subtree_len(512) && is_subtree_len(1 << 15));
        assert_eq!(root_of_pieces(&[[0; 32]; 2], 3 * 1024, 5000), None, "not a power of two chunks");
        assert_eq!(root_of_pieces(&[[0; 32]], 1024, 1024), None, "one piece is its own root");
    }
}
