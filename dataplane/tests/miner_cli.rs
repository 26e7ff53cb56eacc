//! `iota-miner` command-line behaviour that needs no orchestrator.

use std::process::Command;

fn miner(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_iota-miner")).args(args).output().expect("run iota-miner")
}

/// `run --device cuda` on a machine without a GPU stops before it creates an
/// identity or dials the orchestrator, with one plain error; an unknown
/// device is refused by the argument parser.
#[test]
fn run_on_cuda_without_a_gpu_fails_first_and_plainly() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("miner.key");
    let key_s = key.to_str().unwrap();
    if iota_cuda::driver_present() {
        println!("not checked here: a CUDA driver is present");
    } else {
        let o = miner(&["run", "--device", "cuda:1", "--identity", key_s, "--orchestrator", "http://127.0.0.1:9"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("no CUDA driver found"), "{err}");
        assert!(!key.exists(), "no identity is created for a miner that cannot start");
    }
    let o = miner(&["run", "--device", "gpu0", "--identity", key_s]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("cpu, cuda, cuda:N"));
    let o = miner(&["run", "--gemm", "fp8", "--identity", key_s]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("bf16, fp32"));
}

/// `--adversary` (a test tool) is accepted with the known modes, refused
/// with others, and not shown in `run --help`.
#[test]
fn the_adversary_flag_is_hidden_and_checked() {
    let help = String::from_utf8_lossy(&miner(&["run", "--help"]).stdout).into_owned();
    assert!(help.contains("--orchestrator") && !help.contains("--adversary"), "{help}");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("miner.key");
    let o = miner(&["run", "--adversary", "sloth", "--identity", key.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("silent, closed, slow, flaky, noise, zeros, replay"), "{err}");
    assert!(!key.exists());
}
