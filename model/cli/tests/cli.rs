//! The `iota` binary end to end: a short run writes its loss log and a
//! checkpoint, a resumed run continues it, and bad input gives one clear
//! error line with exit code 2 (never a panic).

use std::path::Path;
use std::process::{Command, Output};

fn iota(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iota")).args(args).output().expect("run iota")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn csv_rows(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("loss.csv")).unwrap().lines().map(String::from).collect()
}

#[test]
fn train_then_resume() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    let data = dir.path().join("corpus.txt");
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(3, 60_000)).unwrap();
    let common =
        ["train", "--config", "tiny", "--data", data.to_str().unwrap(), "--batch", "4", "--seq", "32", "--stages", "2"];
    let o = iota(&[&common[..], &["--steps", "4", "--out", out_s, "--eval-every", "2"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = csv_rows(&out);
    assert_eq!(rows[0], "step,train_loss,val_loss,lr,grad_norm,tokens_per_s,wire_bytes_per_token");
    assert_eq!(rows.len(), 5);
    assert!(out.join("LATEST").exists());
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("checkpoint:"), "{stdout}");

    let o = iota(&[&common[..], &["--steps", "6", "--out", out_s, "--resume", out_s]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("resumed at step 4"), "{}", stderr(&o));
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 7, "resumed run appends steps 4 and 5");
    assert!(rows[6].starts_with("5,"));
    assert!(iota_model::checkpoint::resolve(&out).unwrap().ends_with("ckpt-00000006"));
}

#[test]
fn bad_input_is_one_clear_error_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    let bad_json = dir.path().join("bad.jsonl");
    std::fs::write(&bad_json, "{\"text\": \"ok\"}\nnot json\n").unwrap();
    let odd_bin = dir.path().join("odd.bin");
    std::fs::write(&odd_bin, [1u8, 2, 3]).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--data", "/nonexistent/corpus.txt"], "cannot read"),
        (vec!["--data", bad_json.to_str().unwrap()], "line 2"),
        (vec!["--data", odd_bin.to_str().unwrap()], "whole number"),
        (vec!["--config", "7b"], "unknown model preset"),
        (vec!["--seq", "100000"], "max_seq"),
        (vec!["--stages", "99"], "--stages"),
        (vec!["--codec", "int3"], "unknown codec"),
        (vec!["--resume", "/nonexistent/run"], "resuming"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["train", "--steps", "1", "--out", out_s];
        if extra[0] != "--config" {
            args.extend(["--config", "tiny"]);
        }
        args.extend(&extra);
        let o = iota(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: expected '{want}' in: {err}");
        assert!(!err.contains("panicked"), "{extra:?} panicked: {err}");
        assert_eq!(err.lines().filter(|l| l.starts_with("error:")).count(), 1, "{extra:?}: {err}");
    }
}

/// `--device cuda` on a machine without a GPU: one plain error, exit 2, no
/// panic. On a machine with a GPU the same flag trains one step instead.
#[test]
fn cuda_device_without_gpu_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let args = ["train", "--config", "tiny", "--steps", "1", "--batch", "2", "--seq", "16", "--device", "cuda"];
    let o = iota(&[&args[..], &["--out", out.to_str().unwrap()]].concat());
    let err = stderr(&o);
    assert!(!err.contains("panicked"), "{err}");
    if iota_cuda::driver_present() {
        eprintln!("a CUDA driver is present: checked that one step trains on it");
        assert!(o.status.success(), "{err}");
        assert_eq!(csv_rows(&out).len(), 2);
    } else {
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains("no CUDA driver found"), "{err}");
    }
    let o = iota(&["train", "--device", "tpu"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cpu, cuda, cuda:N"), "{}", stderr(&o));
}
