//! The sparse codec's tests: its bytes, its backlog, hostile rows.

use super::*;

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect()
}

#[test]
fn keeps_the_largest_values_with_their_signs_at_a_hundredth_of_bf16() {
    let n = 3 * SPARSE_BLOCK + 1000;
    let x = noise(n, 1);
    let density = 1.0 / 64.0;
    let bytes = encode_sparse(&x, density);
    let bf16_bytes = 2 * n;
    let ratio = bf16_bytes as f64 / bytes.len() as f64;
    // 1/64 of a block: 6 low bits and 2 bits of bitvector an index.
    assert!(ratio > 95.0, "{ratio:.1}x fewer bytes than bf16");
    let y = decode_sparse(&bytes, n, SPARSE_BLOCK).unwrap();
    for (b, (xb, yb)) in x.chunks(SPARSE_BLOCK).zip(y.chunks(SPARSE_BLOCK)).enumerate() {
        let k = kept_per_block(xb.len(), density);
        assert_eq!(yb.iter().filter(|v| **v != 0.0).count(), k, "block {b}");
        // Every kept value is at least as large as every dropped one,
        // and keeps its sign.
        let smallest_kept =
            xb.iter().zip(yb).filter(|(_, y)| **y != 0.0).map(|(x, _)| x.abs()).fold(f32::MAX, f32::min);
        let largest_dropped = xb.iter().zip(yb).filter(|(_, y)| **y == 0.0).map(|(x, _)| x.abs()).fold(0.0, f32::max);
        assert!(smallest_kept >= largest_dropped, "block {b}: {smallest_kept} < {largest_dropped}");
        assert!(xb.iter().zip(yb).all(|(x, y)| *y == 0.0 || x.signum() == y.signum()), "block {b}: signs");
    }
    assert_eq!(encode_sparse(&x, density), bytes, "deterministic");
}

#[test]
fn ties_go_to_the_lower_index_and_odd_inputs_encode() {
    let x = vec![1.0f32; 100];
    let y = decode_sparse(&encode_sparse(&x, 0.05), 100, SPARSE_BLOCK).unwrap();
    assert!(y[..5].iter().all(|v| *v == 1.0) && y[5..].iter().all(|v| *v == 0.0), "{y:?}");
    let odd = [0.0, f32::NAN, -0.0, f32::INFINITY, 3.0, -2.0];
    let y = decode_sparse(&encode_sparse(&odd, 0.34), 6, SPARSE_BLOCK).unwrap();
    assert!(y.iter().all(|v| v.is_finite()), "non-finite values are never kept as such: {y:?}");
    assert_eq!(decode_sparse(&encode_sparse(&[], 0.1), 0, 1).unwrap(), Vec::<f32>::new());
}

#[test]
fn error_feedback_sends_everything_eventually() {
    // The same pseudo-gradient every merge: what the codec drops is
    // carried, so what is missing from the sum sent is the residual,
    // which stays bounded while the sum wanted grows.
    let n = 5000;
    let delta = noise(n, 7);
    let mut ef = ErrorFeedback::new(n);
    let mut sent_sum = vec![0.0f64; n];
    let mut off_at = Vec::new();
    for round in 1..=400u32 {
        let bytes = ef.encode(0, &delta, 1.0 / 32.0).unwrap();
        let sent = decode_sparse(&bytes, n, SPARSE_BLOCK).unwrap();
        sent_sum.iter_mut().zip(&sent).for_each(|(s, v)| *s += f64::from(*v));
        if round % 100 == 0 {
            let r = f64::from(round);
            let sq = |e: f64| e * e;
            let want = delta.iter().map(|d| sq(f64::from(*d) * r)).sum::<f64>().sqrt();
            let off = sent_sum.iter().zip(&delta).map(|(s, d)| sq(s - f64::from(*d) * r)).sum::<f64>().sqrt();
            assert!((ef.norm() - off).abs() / want < 1e-3, "round {round}: the residual is what is missing");
            off_at.push(off / want);
        }
    }
    assert!(off_at[3] < off_at[0] / 3.0 && off_at[3] < 0.05, "missing share by round: {off_at:?}");
    assert!(ef.encode(n - 1, &delta[..2], 0.5).is_err(), "a range past the stage");
    // Kept in the sender's weights instead: the residual is this
    // contribution's remainder alone, not added to.
    let mut kept = ErrorFeedback::new(n);
    for _ in 0..3 {
        let sent = decode_sparse(&kept.encode_kept(0, &delta, 1.0 / 32.0).unwrap(), n, SPARSE_BLOCK).unwrap();
        let remainder: Vec<f32> = delta.iter().zip(&sent).map(|(d, s)| d - s).collect();
        assert_eq!(kept.residual(), remainder.as_slice());
    }
}

#[test]
fn hostile_payloads_are_refused_without_panics() {
    let x = noise(2 * SPARSE_BLOCK + 77, 3);
    let bytes = encode_sparse(&x, 0.01);
    let n = x.len();
    let max = kept_per_block(SPARSE_BLOCK, 0.01);
    assert!(decode_sparse(&bytes, n, max).is_ok());
    for cut in [0, 1, 5, 6, 100, bytes.len() - 1] {
        assert!(decode_sparse(&bytes[..cut], n, max).is_err(), "cut at {cut}");
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(decode_sparse(&long, n, max).is_err(), "trailing bytes");
    assert!(decode_sparse(&bytes, n, max - 1).is_err(), "denser than agreed");
    let edit = |at: usize, v: &[u8]| {
        let mut b = bytes.clone();
        b[at..at + v.len()].copy_from_slice(v);
        decode_sparse(&b, n, max)
    };
    assert!(edit(0, &u16::MAX.to_le_bytes()).is_err(), "a count past the block");
    assert!(edit(2, &0x7f80u16.to_le_bytes()).is_err(), "an infinite magnitude");
    assert!(edit(4, &0xbf80u16.to_le_bytes()).is_err(), "a negative magnitude");
    let k = kept_per_block(SPARSE_BLOCK, 0.01);
    let last_code = codes_at(k) + k.div_ceil(4) - 1;
    if !k.is_multiple_of(4) {
        let mut b = bytes.clone();
        b[last_code] |= 0xc0;
        assert!(decode_sparse(&b, n, max).is_err(), "bits past the last code");
    }
    // Random bytes: refused or decoded, never a panic.
    for seed in 0..200u64 {
        let junk: Vec<u8> = noise(64, seed).iter().map(|v| v.to_bits() as u8).collect();
        let _ = decode_sparse(&junk, 100, 10);
    }
}

/// The frame form: a fixed size for a length and a density (what the
/// frame header's shape promises), the last block's padding dropped,
/// the same values as the unpadded codec where blocks are whole, and a
/// row keeping more or fewer than the run's count refused.
#[test]
fn frames_have_the_size_their_shape_says_and_refuse_another_density() {
    use iota_core::WireCodec;
    let n = 2 * SPARSE_BLOCK + 300;
    let x = noise(n, 9);
    let density = 1.0 / 32.0;
    let (rows, k) = frame_shape(n as u64, density);
    assert_eq!((rows, k), (3, SPARSE_BLOCK / 32));
    let bytes = encode_frame(&x, k);
    assert_eq!(Some(bytes.len()), WireCodec::SparseTopK.payload_bytes(rows, k));
    assert_eq!(frame_row_bytes(k), WireCodec::SparseTopK.row_bytes(k));
    // A whole block at 1/32: 56x fewer bytes than bf16 (a partial last
    // block is padded, so short slices gain less).
    let ratio = (2 * SPARSE_BLOCK) as f64 / frame_row_bytes(k) as f64;
    assert!(ratio > 56.0, "{ratio:.1}x");
    let mut y = vec![1.0f32; n];
    decode_frame_into(&bytes, &mut y, k).unwrap();
    // Whole blocks: what the unpadded codec keeps.
    let whole = 2 * SPARSE_BLOCK;
    let plain = decode_sparse(&encode_sparse(&x[..whole], density), whole, SPARSE_BLOCK).unwrap();
    assert_eq!(&y[..whole], plain.as_slice());
    // The last block keeps k of its 300 values and the padding's zeros.
    let kept_last = y[whole..].iter().filter(|v| **v != 0.0).count();
    assert_eq!(kept_last, k.min(300));
    assert_eq!(encode_frame(&x, k), bytes, "deterministic");
    // Another density's rows, a cut payload, a row claiming another count.
    assert!(decode_frame_into(&bytes, &mut y, k - 1).is_err());
    assert!(decode_frame_into(&bytes[..bytes.len() - 1], &mut y, k).is_err());
    let mut other = bytes.clone();
    other[0..2].copy_from_slice(&((k - 1) as u16).to_le_bytes());
    assert!(decode_frame_into(&other, &mut y, k).is_err());
    // Error feedback through frames: what is held back is what was not sent.
    let mut ef = ErrorFeedback::new(n + 10);
    let sent_bytes = ef.encode_frame(10, &x, k, 1.0).unwrap();
    let mut sent = vec![0.0f32; n];
    decode_frame_into(&sent_bytes, &mut sent, k).unwrap();
    let left: Vec<f32> = x.iter().zip(&sent).map(|(a, b)| a - b).collect();
    assert_eq!(&ef.residual()[10..], left.as_slice());
    assert!(ef.residual()[..10].iter().all(|r| *r == 0.0));
    // A fading backlog: scaled over the range, nowhere else.
    ef.decay(10..20, 0.5);
    assert_eq!(ef.residual()[10..20], left[..10].iter().map(|v| v * 0.5).collect::<Vec<_>>()[..]);
    assert_eq!(&ef.residual()[20..], &left[10..]);
    // Random bytes as a frame: refused or decoded, never a panic.
    for seed in 0..100u64 {
        let junk: Vec<u8> = noise(frame_row_bytes(4), seed).iter().map(|v| v.to_bits() as u8).collect();
        let _ = decode_frame_into(&junk, &mut y[..SPARSE_BLOCK], 4);
    }
}

/// The integer-key selection is the comparator's: the k largest
/// magnitudes, ties to the lower index, non-finite values as zero.
#[test]
fn the_key_selection_is_the_comparators() {
    let reference = |x: &[f32], k: usize| {
        let mag = |i: u32| x.get(i as usize).map_or(0.0, |v| if v.is_finite() { v.abs() } else { 0.0 });
        let mut order: Vec<u32> = (0..x.len() as u32).collect();
        if k < order.len() {
            order.select_nth_unstable_by(k, |a, b| mag(*b).total_cmp(&mag(*a)).then(a.cmp(b)));
            order.truncate(k);
        }
        order.sort_unstable();
        order
    };
    for seed in 0..20u64 {
        let mut x = noise(SPARSE_BLOCK, seed);
        // Ties, signed zeros and non-finite values among them.
        for j in (0..x.len()).step_by(7) {
            x[j] = x[j / 2];
        }
        for (j, v) in [(3, -0.0), (9, f32::NAN), (11, f32::INFINITY), (13, f32::NEG_INFINITY), (17, 0.0)] {
            x[j] = v;
        }
        for k in [1, 37, 512, SPARSE_BLOCK - 1, SPARSE_BLOCK] {
            assert_eq!(top_k(&x, k), reference(&x, k), "seed {seed} k {k}");
        }
    }
    let flat = vec![0.5f32; 100];
    assert_eq!(top_k(&flat, 3), vec![0, 1, 2]);
}

/// The one-pass backlog update is fading, adding, `encode_frame`,
/// decoding and subtracting done in turn, bit for bit, over several
/// merges with a padded last block.
#[test]
fn the_fused_feedback_is_the_stepwise_one() {
    let n = 3 * SPARSE_BLOCK + 999;
    let k = kept_per_block(SPARSE_BLOCK, 1.0 / 32.0);
    let mut fused = ErrorFeedback::new(n + 5);
    let mut stepwise = vec![0.0f32; n];
    for round in 0..4u64 {
        let delta = noise(n, 40 + round);
        let got = fused.encode_frame(5, &delta, k, 0.95).unwrap();
        stepwise.iter_mut().for_each(|r| *r *= 0.95);
        let wanted: Vec<f32> = delta.iter().zip(&stepwise).map(|(d, r)| d + r).collect();
        let want = encode_frame(&wanted, k);
        let mut sent = vec![0.0f32; n];
        decode_frame_into(&want, &mut sent, k).unwrap();
        stepwise = wanted.iter().zip(&sent).map(|(w, s)| w - s).collect();
        assert_eq!(got, want, "round {round}: the bytes");
        let same_bits = fused.residual()[5..].iter().zip(&stepwise).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same_bits, "round {round}: the backlog");
    }
}

/// A range of a checked slice reads as that range of the whole
/// decode; a slice of another density, or junk, fails the check, and
/// junk read unchecked gives no panic.
#[test]
fn ranges_read_as_the_whole_decode_and_checks_refuse_junk() {
    let n = 2 * SPARSE_BLOCK + 1500;
    let k = kept_per_block(SPARSE_BLOCK, 1.0 / 32.0);
    let bytes = encode_frame(&noise(n, 77), k);
    check_frame(&bytes, n as u64, k).unwrap();
    assert!(check_frame(&bytes, n as u64, k + 1).is_err());
    assert!(check_frame(&bytes, n as u64 + SPARSE_BLOCK as u64, k).is_err());
    let mut whole = vec![0.0f32; n];
    decode_frame_into(&bytes, &mut whole, k).unwrap();
    let subs = (0..2 * SPARSE_BLOCK).step_by(1024).map(|at| (at, 1024));
    let odd = [(5, 3), (1023, 2), (SPARSE_BLOCK - 7, 7), (SPARSE_BLOCK, SPARSE_BLOCK), (2 * SPARSE_BLOCK, 1500)];
    for (at, len) in subs.chain(odd) {
        let mut part = vec![9.0f32; len];
        decode_range(&bytes, at, &mut part).unwrap();
        assert_eq!(part.as_slice(), &whole[at..at + len], "{at}+{len}");
    }
    let mut across = vec![0.0f32; 10];
    assert!(decode_range(&bytes, SPARSE_BLOCK - 5, &mut across).is_err());
    let mut bad = bytes.clone();
    let (low, high) = sparse_index_bytes(k);
    bad[6 + low..6 + low + high].fill(0);
    assert!(check_frame(&bad, n as u64, k).is_err(), "no index where k are due");
    for seed in 0..50u64 {
        let junk: Vec<u8> = noise(3 * frame_row_bytes(k), seed).iter().map(|v| v.to_bits() as u8).collect();
        let _ = decode_range(&junk, (seed as usize * 997) % n, &mut across);
    }
}

/// A row of one whole block naming `order` (hostile or not) with
/// magnitudes 1 and 2, and its count as `k`.
fn row_naming(order: &[u32], k: usize) -> Vec<u8> {
    let mut row = (k as u16).to_le_bytes().to_vec();
    row.extend_from_slice(&f32_to_bf16(1.0).to_le_bytes());
    row.extend_from_slice(&f32_to_bf16(2.0).to_le_bytes());
    indices::write(order, &mut row);
    row.resize(sparse_row_bytes(k), 0);
    row
}

/// Rows whose index sections lie: out of order, repeated, fewer or
/// more set bits than the count, padding bits set, an index past a
/// short block. Each is refused; the honest row beside them decodes.
#[test]
fn lying_index_sections_are_refused() {
    let k = 64;
    let honest: Vec<u32> = (0..k as u32).map(|j| j * 200 + 3).collect();
    let decode = |row: &[u8], len: usize| decode_sparse(row, len, k);
    assert!(decode(&row_naming(&honest, k), SPARSE_BLOCK).is_ok());
    let mut swapped = honest.clone();
    swapped.swap(10, 11);
    assert!(decode(&row_naming(&swapped, k), SPARSE_BLOCK).is_err(), "out of order");
    let mut repeated = honest.clone();
    repeated[11] = repeated[10];
    assert!(decode(&row_naming(&repeated, k), SPARSE_BLOCK).is_err(), "repeated");
    // Within one high part the low bits alone order them.
    let l = iota_core::codec::sparse_low_bits(k);
    let mut same_high = honest.clone();
    same_high[10] = (honest[10] >> l << l) | 5;
    same_high[11] = (honest[10] >> l << l) | 4;
    assert!(decode(&row_naming(&same_high, k), SPARSE_BLOCK).is_err(), "falling low bits");
    let (low, high) = sparse_index_bytes(k);
    let high_at = BLOCK_HEADER + low;
    let mut fewer = row_naming(&honest, k);
    let first_set = (high_at..high_at + high).find(|&b| fewer[b] != 0).unwrap();
    fewer[first_set] &= fewer[first_set] - 1;
    assert!(decode(&fewer, SPARSE_BLOCK).is_err(), "a set bit short");
    let mut more = row_naming(&honest, k);
    more[high_at + high - 1] |= 0x80;
    assert!(decode(&more, SPARSE_BLOCK).is_err(), "a set bit in the bitvector's padding");
    let used = k * l as usize;
    if used < low * 8 {
        let mut pad = row_naming(&honest, k);
        pad[high_at - 1] |= 0x80;
        assert!(decode(&pad, SPARSE_BLOCK).is_err(), "a low section's padding bit");
    }
    let short = *honest.last().unwrap() as usize;
    assert!(decode(&row_naming(&honest, k), short).is_err(), "an index past a short block");
    assert!(decode(&row_naming(&honest, k), short + 1).is_ok());
}
