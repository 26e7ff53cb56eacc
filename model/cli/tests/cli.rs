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
        (vec!["--bottleneck-style", "cubic"], "unknown bottleneck style"),
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

/// A run directory holds one run: another run there is refused with the
/// settings that differ, the same run again points at --resume, and
/// --new-run archives the old files instead of overwriting them.
#[test]
fn a_run_directory_is_never_silently_reused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    let data = dir.path().join("corpus.txt");
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(5, 40_000)).unwrap();
    let base = ["train", "--config", "tiny", "--data", data.to_str().unwrap(), "--batch", "2", "--seq", "16"];
    let o = iota(&[&base[..], &["--steps", "2", "--out", out_s]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    let log_before = std::fs::read(out.join("loss.csv")).unwrap();

    // Different settings: refused, naming each difference; nothing touched.
    let o = iota(&[&base[..], &["--steps", "2", "--out", out_s, "--lr", "0.001", "--seed", "7"]].concat());
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for want in ["holds another run", "schedule.peak: 0.002", "seed: 42 -> 7", "--new-run"] {
        assert!(err.contains(want), "expected '{want}' in: {err}");
    }
    assert_eq!(std::fs::read(out.join("loss.csv")).unwrap(), log_before);

    // The same run again would overwrite it: refused, pointing at --resume.
    let o = iota(&[&base[..], &["--steps", "2", "--out", out_s]].concat());
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("loss.csv")).unwrap(), log_before);

    // --new-run: the old run moves into archive-1, the new one starts.
    let o = iota(&[&base[..], &["--steps", "2", "--out", out_s, "--seed", "7", "--new-run"]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("archive-1"), "{}", stderr(&o));
    assert_eq!(std::fs::read(out.join("archive-1").join("loss.csv")).unwrap(), log_before);
    assert!(iota_model::checkpoint::resolve(&out.join("archive-1")).is_ok());
    assert!(iota_model::checkpoint::resolve(&out).unwrap().ends_with("ckpt-00000002"));
}

/// --resume continues with the run's own settings and corpus: contradicting
/// flags and another corpus are refused; without --data it reloads the
/// corpus the run recorded.
#[test]
fn resume_refuses_conflicting_flags_and_another_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let out_s = out.to_str().unwrap();
    let data = dir.path().join("corpus.txt");
    let other = dir.path().join("other.txt");
    std::fs::write(&data, iota_model::data::synthetic::grammar_text(5, 40_000)).unwrap();
    std::fs::write(&other, iota_model::data::synthetic::grammar_text(6, 40_000)).unwrap();
    let args = ["train", "--config", "tiny", "--batch", "2", "--seq", "16", "--steps", "2"];
    let o = iota(&[&args[..], &["--data", data.to_str().unwrap(), "--out", out_s]].concat());
    assert!(o.status.success(), "{}", stderr(&o));
    // `tiny` at 32 tokens a step: Muon would cost more than the step.
    assert!(stderr(&o).contains("optimizer: adamw (auto: Muon's Newton-Schulz steps would add"), "{}", stderr(&o));

    let o = iota(&["train", "--resume", out_s, "--steps", "3", "--optimizer", "muon"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--optimizer muon (the checkpoint has adamw)"), "{err}");
    let o = iota(&["train", "--resume", out_s, "--steps", "3", "--lr", "0.01", "--batch", "4"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--lr 0.01 (the checkpoint has 0.002)"), "{err}");
    assert!(err.contains("--batch 4 (the checkpoint has 2)"), "{err}");
    let o = iota(&["train", "--resume", out_s, "--steps", "3", "--bottleneck-style", "residual"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--bottleneck-style residual (the checkpoint has linear)"), "{err}");

    let o = iota(&["train", "--resume", out_s, "--steps", "3", "--data", other.to_str().unwrap()]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not the one this run trained on"), "{err}");

    // Agreeing flags are fine; the corpus comes from run.json; the
    // checkpoint goes back into the run's own directory.
    let o = iota(&["train", "--resume", out_s, "--steps", "3", "--batch", "2"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("toy corpus"), "{err}");
    assert!(iota_model::checkpoint::resolve(&out).unwrap().ends_with("ckpt-00000003"));
}
