//! Property tests of the frame codec: random valid frames round-trip, and
//! random corruption of a valid frame is rejected (or, if it only touched
//! nothing checked, decodes to the same frame) without ever panicking.

use iota_core::wire::Direction;
use iota_core::{Identity, WireCodec};
use iota_dataplane::frame::{FrameLimits, FrameMeta, RunContext, build_header, decode_frame, prefix_bytes};
use proptest::prelude::*;

fn meta_strategy() -> impl Strategy<Value = FrameMeta> {
    (
        0usize..4,
        0u8..4,
        proptest::collection::vec(1u32..40, 1..=4),
        any::<u16>(),
        3u32..5,
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<[u8; 32]>(),
    )
        .prop_map(|(d, c, shape, stage, epoch, shard, first, samples, answers)| FrameMeta {
            direction: Direction::ALL[d],
            codec: WireCodec::from_id(c).unwrap(),
            stage,
            epoch,
            shard,
            first_sample: first,
            samples,
            attempt: (first % 5) as u32,
            shape,
            answers,
        })
}

fn payload_len(m: &FrameMeta) -> usize {
    let (rows, cols) = iota_core::wire::rows_cols(&m.shape).unwrap();
    m.codec.payload_bytes(rows, cols).unwrap()
}

fn ctx() -> RunContext {
    let c = RunContext::new(5, FrameLimits::default());
    c.set_epoch_window(3, 4);
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn random_frames_round_trip(m in meta_strategy(), seq in any::<u64>(), seed in any::<u8>()) {
        let id = Identity::from_seed([seed; 32]);
        let payload: Vec<u8> = (0..payload_len(&m)).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
        let h = build_header(&m, 5, seq, &payload, &id);
        let mut bytes = prefix_bytes(&h);
        bytes.extend_from_slice(&payload);
        let (back, p) = decode_frame(&bytes, &ctx(), id.peer_id()).unwrap();
        prop_assert_eq!(&back, &h);
        prop_assert_eq!(p, &payload[..]);
        prop_assert_eq!(back.dims(), &m.shape[..]);
    }

    #[test]
    fn corruption_is_rejected_never_panics(m in meta_strategy(), flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..8)) {
        let id = Identity::from_seed([1; 32]);
        let payload = vec![7u8; payload_len(&m)];
        let h = build_header(&m, 5, 0, &payload, &id);
        let mut bytes = prefix_bytes(&h);
        bytes.extend_from_slice(&payload);
        let original = bytes.clone();
        for (i, x) in &flips {
            let n = bytes.len();
            bytes[i.index(n)] ^= x;
        }
        if let Ok((back, p)) = decode_frame(&bytes, &ctx(), id.peer_id()) {
            // Only bytes nothing depends on changed (e.g. rkyv padding): same frame.
            prop_assert_eq!(back, h);
            prop_assert_eq!(p, &original[original.len() - payload.len()..]);
        }
    }
}
