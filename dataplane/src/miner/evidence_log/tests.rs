//! What the evidence log keeps, and its bounds.

use std::sync::Arc;

use super::*;

const A: Direction = Direction::Activation;

fn w(x: f32, n: usize) -> Vec<f32> {
    vec![x; n]
}

#[test]
fn each_attempt_gets_the_weights_it_was_computed_with() {
    let mut log = EvidenceLog::new(1 << 20);
    log.begin(3, 1, w(0.0, 8));
    assert!(log.wants_input(3) && !log.wants_input(2));
    assert!(log.forward((3, 0, 0, 0), Some(vec![1; 10]), A));
    log.stepped(3, [1; 32], w(1.0, 8));
    assert!(log.forward((3, 0, 4, 0), Some(vec![2; 10]), A));
    assert!(log.forward((3, 0, 8, 0), None, Direction::ActivationGrad));
    log.stepped(3, [2; 32], w(2.0, 8));
    log.stepped(3, [3; 32], w(3.0, 8));
    assert!(log.forward((3, 0, 12, 1), None, A));
    assert!(!log.forward((2, 0, 0, 0), None, A), "another epoch");
    let info = |k| log.attempt(k).unwrap();
    assert_eq!(info((3, 0, 0, 0)), AttemptInfo { version: 0, output: A, has_input: true, has_backward: false });
    assert_eq!(info((3, 0, 4, 0)).version, 1);
    let tail = AttemptInfo { version: 1, output: Direction::ActivationGrad, has_input: false, has_backward: false };
    assert_eq!(info((3, 0, 8, 0)), tail);
    assert_eq!(info((3, 0, 12, 1)).version, 3);
    assert!(log.attempt((3, 0, 12, 0)).is_none());
    assert_eq!(log.weights(3, 0), Some(w(0.0, 8)));
    assert_eq!(log.weights(3, 1), Some(w(1.0, 8)));
    assert_eq!(log.weights(3, 2), None, "no attempt used it: freed");
    assert_eq!(log.weights(3, 3), Some(w(3.0, 8)));
    assert_eq!(log.bytes(), (3 * 32, 20));
    // The bundle: the right frames, weights and step hashes.
    log.seal(3);
    log.stepped(3, [4; 32], w(4.0, 8)); // after the UploadDone: not committed there
    let b = log.bundle((3, 0, 4, 0), vec![9; 5], None);
    assert_eq!(b, Err("its backward is not kept"), "a middle stage's forward alone is no evidence");
    assert!(log.backward((3, 0, 4, 0), vec![8; 6]));
    let b = log.bundle((3, 0, 4, 0), vec![9; 5], None);
    assert_eq!(b, Err("the gradient frame it sent is not kept"));
    let b = log.bundle((3, 0, 4, 0), vec![9; 5], Some(vec![6; 7])).unwrap();
    let limits = crate::evidence_bundle::BundleLimits { max_frame: 1 << 20, weights: 8, max_steps: 16 };
    let d = EvidenceBundle::decode(&b, limits).unwrap();
    assert_eq!(d.input_frame, Some(vec![2; 10]));
    assert_eq!(d.output_frame, vec![9; 5]);
    assert_eq!(d.weights, w(1.0, 8));
    assert_eq!(d.step_hashes, vec![[1; 32], [2; 32], [3; 32]]);
    // Its backward came after three more inner steps, on the weights its
    // forward ran on (stashed): state 1, not repeated.
    let bw = d.backward.unwrap();
    assert_eq!((bw.received, bw.sent, bw.weights), (vec![8; 6], vec![6; 7], None));
    assert_eq!(log.weights(3, 1), Some(w(1.0, 8)), "lent, then put back");
    assert_eq!(log.bundle((3, 9, 9, 9), Vec::new(), None), Err("the attempt is not kept"));
    // The tail's bundle has no backward; the head's none until the
    // gradient that answered its output is kept, then that alone.
    let tail = EvidenceBundle::decode(&log.bundle((3, 0, 8, 0), vec![1], None).unwrap(), limits).unwrap();
    assert!(tail.backward.is_none());
    let head = (3, 0, 12, 1);
    assert_eq!(log.bundle(head, vec![1], None), Err("the gradient that answered its output is not kept"));
    assert!(log.backward(head, vec![5; 3]));
    let d = EvidenceBundle::decode(&log.bundle(head, vec![1], Some(vec![7])).unwrap(), limits).unwrap();
    let bw = d.backward.unwrap();
    assert_eq!((bw.received, bw.sent, bw.weights), (vec![5; 3], Vec::new(), None), "only what answered it");
    // The next epoch's training frees this one.
    log.begin(4, 1, w(5.0, 8));
    assert_eq!(log.epoch(), Some(4));
    assert!(log.attempt((3, 0, 4, 0)).is_none());
    assert_eq!(log.bytes(), (32, 0));
    assert_eq!(log.step_hashes(4), Some(&[][..]));
}

#[test]
fn a_middle_stage_keeps_its_backward_with_the_weights_it_ran_on() {
    let mut log = EvidenceLog::new(1 << 20);
    log.begin(0, 1, w(0.0, 8));
    let (a, b, head) = ((0, 0, 0, 0), (0, 0, 4, 0), (0, 0, 8, 0));
    assert!(log.forward(a, Some(vec![1; 10]), A));
    assert!(log.forward(b, Some(vec![2; 10]), A));
    assert!(log.forward(head, None, A));
    // A kept forward that sent an activation (a middle stage's, a head's)
    // wants its backward kept; a tail's does not.
    assert!(log.wants_backward(a) && log.wants_backward(b) && log.wants_backward(head));
    assert!(!log.wants_backward((0, 9, 0, 0)) && !log.wants_backward((1, 0, 0, 0)));
    assert!(log.forward((0, 0, 12, 0), Some(vec![1; 2]), Direction::ActivationGrad));
    assert!(!log.wants_backward((0, 0, 12, 0)), "a tail's forward");
    assert!(!log.backward((0, 0, 12, 0), vec![0; 4]), "a tail gets no gradient");
    assert!(!log.backward((0, 9, 0, 0), vec![0; 4]), "an attempt without a forward");
    // a's backward before any step, b's after one: both on state 0, the
    // weights their forwards ran on (the stage stashes them).
    assert!(log.backward(a, vec![3; 12]));
    log.stepped(0, [1; 32], w(1.0, 8));
    assert!(log.backward(b, vec![4; 12]));
    log.stepped(0, [2; 32], w(2.0, 8));
    assert_eq!((log.backward_version(a), log.backward_version(b)), (Some(0), Some(0)));
    assert!(log.attempt(a).unwrap().has_backward && !log.attempt(head).unwrap().has_backward);
    assert_eq!(log.weights(0, 0), Some(w(0.0, 8)), "kept: the forwards and backwards ran on it");
    assert_eq!(log.bytes().1, 10 + 10 + 2 + 12 + 12);
    // A repeated backward replaces the frame, counted once.
    assert!(log.backward(b, vec![4; 2]));
    assert_eq!(log.bytes().1, 10 + 10 + 2 + 12 + 2);
    assert_eq!(log.backward_version(b), Some(0));
    let limits = crate::evidence_bundle::BundleLimits { max_frame: 1 << 20, weights: 8, max_steps: 16 };
    let d = EvidenceBundle::decode(&log.bundle(a, vec![9], Some(vec![7])).unwrap(), limits).unwrap();
    assert_eq!(d.backward.unwrap().weights, None, "the same state as its forward: not repeated");
    let d = EvidenceBundle::decode(&log.bundle(b, vec![9], Some(vec![7])).unwrap(), limits).unwrap();
    assert_eq!(d.backward.unwrap().weights, None, "after a step too");
    // The received frames share the frames' bound (a quarter of 256).
    let mut log = EvidenceLog::new(256);
    log.begin(0, 1, w(0.0, 2));
    assert!(log.forward(a, Some(vec![0; 40]), A));
    let warned = logged(|| assert!(!log.backward(a, vec![0; 30]), "over the bound"));
    assert_eq!(warned.matches("budget for received frames").count(), 1, "{warned}");
    assert!(!log.wants_backward(a) && !log.wants_input(0), "nothing more once full");
    assert!(!log.attempt(a).unwrap().has_backward);
    assert_eq!(log.bundle(a, vec![9], Some(vec![7])), Err("its backward is not kept"));
    // Past the snapshot budget a backward is still kept: it ran on its
    // forward's weights, kept with the forward, not on the latest ones.
    let mut log = EvidenceLog::new(64);
    log.begin(0, 1, w(0.0, 8));
    assert!(log.forward(a, Some(vec![0; 4]), A));
    log.stepped(0, [1; 32], w(1.0, 8));
    assert!(log.forward(b, Some(vec![0; 4]), A), "state 1 is used: both snapshots kept");
    log.stepped(0, [2; 32], w(2.0, 8));
    assert_eq!(log.weights(0, 2), None, "past the budget");
    assert!(log.wants_backward(a));
    assert!(log.backward(a, vec![0; 4]));
    assert_eq!(log.backward_version(a), Some(0));
}

/// Log lines written while `f` runs.
fn logged(f: impl FnOnce()) -> String {
    #[derive(Clone, Default)]
    struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let w = buf.clone();
    let sub = tracing_subscriber::fmt().with_writer(move || w.clone()).with_ansi(false).finish();
    tracing::subscriber::with_default(sub, f);
    String::from_utf8_lossy(&buf.0.lock()).into_owned()
}

#[test]
fn past_the_budget_no_more_snapshots_are_kept() {
    // Room for two snapshots of 8 weights; input frames get 16 bytes.
    let mut log = EvidenceLog::new(64);
    let warned = logged(|| {
        log.begin(0, 0, w(0.0, 8));
        for i in 1..6 {
            log.forward((0, 0, u64::from(i), 0), None, A);
            log.stepped(0, [i; 32], w(1.0, 8));
        }
    });
    assert_eq!(warned.matches("no more weights snapshots").count(), 1, "warned once: {warned}");
    let mut log = EvidenceLog::new(64);
    log.begin(0, 0, w(0.0, 8));
    assert!(log.forward((0, 0, 0, 0), Some(vec![0; 10]), A));
    log.stepped(0, [1; 32], w(1.0, 8));
    assert!(log.forward((0, 0, 1, 0), None, A));
    log.stepped(0, [2; 32], w(2.0, 8));
    assert!(!log.wants_input(0));
    assert!(!log.forward((0, 0, 2, 0), None, A), "its weights are not kept");
    assert_eq!(log.weights(0, 2), None);
    // And stays so for the epoch.
    log.stepped(0, [3; 32], w(3.0, 8));
    assert!(!log.forward((0, 0, 3, 0), None, A));
    assert_eq!(log.step_hashes(0).unwrap().len(), 3, "the hashes are still all kept");
    assert_eq!(log.bytes().0, 64);
    // Input frames have their own bound.
    let mut log = EvidenceLog::new(64);
    log.begin(0, 0, w(0.0, 2));
    assert!(log.forward((0, 0, 0, 0), Some(vec![0; 10]), A));
    assert!(!log.forward((0, 0, 1, 0), Some(vec![0; 10]), A));
    assert!(!log.wants_input(0));
    assert!(!log.forward((0, 0, 2, 0), None, A), "nothing more once full");
    // A restart of the epoch on another stage keeps the chain's items.
    log.stepped(0, [7; 32], w(1.0, 2));
    log.begin(0, 1, w(9.0, 3));
    assert_eq!(log.step_hashes(0), Some(&[[7; 32]][..]));
    assert!(log.attempt((0, 0, 0, 0)).is_none());
    assert!(log.forward((0, 0, 5, 0), None, A));
    assert_eq!(log.weights(0, 0), Some(w(9.0, 3)));
}

fn spill_dir(max_bytes: u64) -> (tempfile::TempDir, SpillDir) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = SpillDir::open(tmp.path().join("evidence"), max_bytes).unwrap();
    (tmp, dir)
}

fn snap_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).unwrap().filter(|e| e.as_ref().unwrap().path().extension() == Some("snap".as_ref())).count()
}

#[test]
fn past_the_memory_budget_snapshots_go_to_disk_and_come_back_intact() {
    // Memory for two snapshots of 8 weights; every later state on disk.
    let (tmp, spill) = spill_dir(u64::MAX);
    let dir = spill.dir().to_path_buf();
    let mut log = EvidenceLog::with_spill(64, Some(spill));
    log.begin(0, 1, w(0.0, 8));
    let warned = logged(|| {
        for i in 1..=40u8 {
            // Frames get a quarter of the memory budget: a few have one.
            let frame = (i <= 4).then(|| vec![i; 1]);
            // A tail's attempts (no backward to keep).
            let tail = Direction::ActivationGrad;
            assert!(log.forward((0, 0, u64::from(i), 0), frame, tail), "state {} is kept", i - 1);
            log.stepped(0, [i; 32], w(f32::from(i), 8));
        }
    });
    assert!(!warned.contains("budget reached"), "{warned}");
    assert_eq!(log.bytes().0, 64, "memory holds two snapshots");
    assert_eq!(log.spilled_bytes(), 39 * 32, "39 states on disk (the last one, unused, too)");
    assert!(!log.is_spilled(0, 1) && log.is_spilled(0, 2) && log.is_spilled(0, 40));
    // Every attempt's bundle carries the weights it was computed with.
    log.seal(0);
    let limits = crate::evidence_bundle::BundleLimits { max_frame: 1 << 20, weights: 8, max_steps: 64 };
    for i in [1u8, 2, 17, 40] {
        // Attempt i ran on state i - 1 (the step after it makes state i).
        let b = log.bundle((0, 0, u64::from(i), 0), vec![9], None).unwrap();
        let d = EvidenceBundle::decode(&b, limits).unwrap();
        assert_eq!(d.weights, w(f32::from(i - 1), 8), "attempt {i}");
        assert_eq!(d.input_frame, (i <= 4).then(|| vec![i; 1]));
    }
    assert_eq!(log.weights(0, 40), Some(w(40.0, 8)), "the last write waited for");
    assert_eq!(snap_files(&dir), 39);
    // A spilled file changed on disk is never shown as evidence.
    let victim = dir.join("e0-s1-v20.snap");
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[5] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    assert_eq!(log.bundle((0, 0, 21, 0), vec![9], None), Err("its weights file changed on disk"));
    assert_eq!(log.weights(0, 20), None);
    assert_eq!(log.weights(0, 19), Some(w(19.0, 8)));
    // The next epoch frees this one's files; an unused state's file goes at once.
    log.begin(1, 1, w(0.5, 8));
    assert_eq!(snap_files(&dir), 0, "the previous epoch's snapshots are removed");
    assert!(log.forward((1, 0, 0, 0), None, A));
    log.stepped(1, [1; 32], w(1.5, 8));
    assert!(log.forward((1, 0, 1, 0), None, A));
    log.stepped(1, [2; 32], w(2.5, 8));
    assert!(log.is_spilled(1, 2));
    log.stepped(1, [3; 32], w(3.5, 8));
    assert_eq!(log.weights(1, 3), Some(w(3.5, 8)), "its write waited for");
    assert_eq!(snap_files(&dir), 1, "state 2 was used by nothing: its file is gone");
    drop(log);
    drop(tmp);
}

#[test]
fn the_spill_budget_bounds_the_disk_and_a_restart_clears_stale_snapshots() {
    // Memory for one snapshot of 8 weights, disk for two.
    let (tmp, spill) = spill_dir(64);
    let dir = spill.dir().to_path_buf();
    let mut log = EvidenceLog::with_spill(32, Some(spill));
    log.begin(0, 0, w(0.0, 8));
    let warned = logged(|| {
        for i in 1..=4u8 {
            log.forward((0, 0, u64::from(i), 0), None, A);
            log.stepped(0, [i; 32], w(f32::from(i), 8));
        }
    });
    assert_eq!(warned.matches("no more weights snapshots").count(), 1, "{warned}");
    assert_eq!((log.bytes().0, log.spilled_bytes()), (32, 64));
    assert_eq!(log.weights(0, 2), Some(w(2.0, 8)));
    assert_eq!(log.weights(0, 3), None, "past both budgets");
    assert!(!log.forward((0, 0, 9, 0), None, A));
    // A new life of the miner finds two stale snapshot files and removes
    // them, and nothing else of the directory.
    std::mem::forget(log);
    std::fs::write(dir.join("notes.txt"), b"the owner's").unwrap();
    assert_eq!(snap_files(&dir), 2);
    let again = SpillDir::open(dir.clone(), 64).unwrap();
    assert_eq!(snap_files(&dir), 0);
    assert!(dir.join("notes.txt").exists());
    drop(again);
    drop(tmp);
}
