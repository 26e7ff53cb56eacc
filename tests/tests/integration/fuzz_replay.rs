//! Every fuzz target's body (`iota_tests::fuzz_bodies`) over the committed
//! seeds and past crash inputs in `fuzz/seeds/<target>/`, and over a few
//! hundred inputs from a seeded generator, on every CI run: a regression a
//! fuzzer once found cannot come back unnoticed.

use std::path::PathBuf;

use iota_core::Rng;
use iota_tests::fuzz_bodies::TARGETS;

fn seeds_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds")
}

#[test]
fn every_committed_seed_and_crash_input_replays_clean() {
    let mut replayed = 0;
    for (name, body) in TARGETS {
        let dir = seeds_dir().join(name);
        let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
            Err(e) => panic!("{}: {e} (every target keeps its seeds there)", dir.display()),
        };
        files.sort();
        assert!(!files.is_empty(), "{name} has no seeds");
        for f in files {
            let data = std::fs::read(&f).unwrap();
            // A panic names the input that caused it.
            let r = std::panic::catch_unwind(|| body(&data));
            assert!(r.is_ok(), "{name} panicked on {}", f.display());
            replayed += 1;
        }
    }
    println!("replayed {replayed} seeds");
    // Every seed folder belongs to a target (a renamed target keeps its seeds).
    for e in std::fs::read_dir(seeds_dir()).unwrap() {
        let n = e.unwrap().file_name().into_string().unwrap();
        assert!(TARGETS.iter().any(|(t, _)| *t == n), "fuzz/seeds/{n} names no target");
    }
}

#[test]
fn every_target_survives_generated_inputs() {
    let mut rng = Rng::new(21);
    for (name, body) in TARGETS {
        for i in 0..300 {
            let len = (rng.next_u64() % 600) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            let r = std::panic::catch_unwind(|| body(&data));
            assert!(r.is_ok(), "{name} panicked on generated input {i}: {data:?}");
        }
    }
}

#[test]
fn the_orchestrator_seeds_drive_runs_past_their_first_epoch() {
    for seed in ["parameter-server-run", "butterfly-run"] {
        let data = std::fs::read(seeds_dir().join("orchestrator_events").join(seed)).unwrap();
        let r = iota_tests::fuzz_bodies::orchestrator_run(&data);
        assert!((r.epoch, r.phase) >= (0, 3), "{seed} got only to epoch {} phase {}", r.epoch, r.phase);
    }
    // With validators: evidence asked for, a miner convicted by the
    // stake's verdicts, the merge voted on, the next epoch started.
    let data = std::fs::read(seeds_dir().join("orchestrator_events").join("validated-run")).unwrap();
    let r = iota_tests::fuzz_bodies::orchestrator_run(&data);
    assert!(r.epoch >= 1 && r.verdicts >= 4 && r.convictions >= 1, "validated-run reached only {r:?}");
}

#[test]
fn the_signed_frame_seeds_reach_the_end_of_a_merge() {
    for seed in ["contribution", "update-accepted", "nan-contribution"] {
        let data = std::fs::read(seeds_dir().join("signed_frame").join(seed)).unwrap();
        assert!(iota_tests::fuzz_bodies::signed_frame_run(&data), "{seed} did not finish the replica's merge");
    }
}
