//! A swarm across hosts: the S3 server, the orchestrator and each miner in
//! a network namespace of its own with a directory of its own (no shared
//! directory, no shared path), over TLS, with admission and the bucket.
//! Skipped, saying why, where namespaces cannot be made.

use std::time::{Duration, Instant};

use iota_tests::netns::{HostProcess, Net, unavailable, workspace_binary};

#[test]
fn a_swarm_of_separate_hosts_trains_on_a_bucket_over_tls() {
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let (Some(control), Some(miner)) = (workspace_binary("iota-control"), workspace_binary("iota-miner")) else {
        println!(
            "skipped: iota-control and iota-miner are not built (cargo test --workspace --all-targets builds them)"
        );
        return;
    };
    let Some(s3s) = iota_tests::s3::s3s_fs_binary() else {
        println!("skipped: s3s-fs not found (scripts/test.sh installs it)");
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let mut net = Net::new();
    let (s3_ns, orch_ns) = (net.host(10), net.host(11));
    let miner_ns: Vec<String> = (0..4).map(|i| net.host(20 + i)).collect();

    // The bucket's server, with its own credentials.
    let s3_dir = root.path().join("s3");
    std::fs::create_dir_all(s3_dir.join("data")).unwrap();
    let (ak, sk) = ("netns-access", "netns-secret-key");
    let s3_args: Vec<String> =
        ["--host", &Net::addr(10), "--port", "9000", "--access-key", ak, "--secret-key", sk, "data"]
            .map(String::from)
            .to_vec();
    let _s3 = HostProcess::spawn(&s3_ns, &s3_dir, &s3s, &s3_args, &[]);

    // Identities made ahead, each in its own host's directory: the
    // orchestrator's (miners pin it) and the miners' (the admission list).
    let orch_dir = root.path().join("orchestrator");
    let orch_key = iota_dataplane::identity_file::load_or_create(&orch_dir.join("run/keys/orchestrator.key")).unwrap();
    let mut admitted = String::from("# the four miners of this test\n");
    let miner_dirs: Vec<_> = (0..4).map(|i| root.path().join(format!("miner-{i}"))).collect();
    for d in &miner_dirs {
        let id = iota_dataplane::identity_file::load_or_create(&d.join("miner.key")).unwrap();
        admitted.push_str(&format!("{}\n", id.peer_id().to_hex()));
    }
    std::fs::write(orch_dir.join("admitted.txt"), admitted).unwrap();

    let orch_args: Vec<String> = [
        "orchestrator",
        "--model",
        "tiny",
        "--stages",
        "2",
        "--replicas",
        "2",
        "--epochs",
        "2",
        "--micro-batches",
        "16",
        "--batch",
        "4",
        "--seq",
        "64",
        "--outer-momentum",
        "0.5",
        "--listen",
        &format!("{}:7100", Net::addr(11)),
        "--run-dir",
        "run",
        "--admit",
        "admitted.txt",
        "--bucket",
        "s3://iota-netns/run-1",
        "--s3-endpoint",
        &format!("http://{}:9000", Net::addr(10)),
        "--s3-path-style",
    ]
    .map(String::from)
    .to_vec();
    let orch = HostProcess::spawn(
        &orch_ns,
        &orch_dir,
        &control,
        &orch_args,
        &[("AWS_ACCESS_KEY_ID", ak), ("AWS_SECRET_ACCESS_KEY", sk)],
    );
    let mut miners = Vec::new();
    for (i, (ns, dir)) in miner_ns.iter().zip(&miner_dirs).enumerate() {
        let args: Vec<String> = [
            "run",
            "--orchestrator",
            &format!("https://{}:7100", Net::addr(11)),
            "--orchestrator-key",
            &orch_key.peer_id().to_hex(),
            "--identity",
            "miner.key",
            "--listen",
            &format!("{}:7200", Net::addr(20 + i as u8)),
        ]
        .map(String::from)
        .to_vec();
        miners.push(HostProcess::spawn(ns, dir, &miner, &args, &[]));
    }

    let mut orch = orch;
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(st) = orch.child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = miners.iter().map(|m| m.output()).collect();
            panic!("the run did not end in 90 s\norchestrator:\n{}\nminers:\n{}", orch.output(), logs.join("\n---\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = orch.output();
    assert!(status.success(), "orchestrator: {out}");
    println!("{}", out.lines().filter(|l| l.starts_with("epoch")).collect::<Vec<_>>().join("\n"));
    // Both epochs, every micro-batch completed, replicas merged to the same weights.
    let losses: Vec<f32> = out
        .lines()
        .filter_map(|l| l.strip_prefix("epoch ")?.split_once(": mean loss ")?.1.split(',').next()?.parse().ok())
        .collect();
    assert_eq!(losses.len(), 2, "{out}");
    assert!(losses[1] < losses[0], "the loss falls: {losses:?}");
    assert!(out.contains("32 micro-batches completed, 0 re-routed, 0 dropped, 0 divergent merges"), "{out}");
    // No host has a store directory; the objects are in the bucket's host.
    for d in &miner_dirs {
        let entries: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!d.join("store").exists(), "{entries:?}");
    }
    assert!(!orch_dir.join("run/store").exists());
    let objects = walk(&s3_dir.join("data"));
    assert!(objects.iter().any(|p| p.contains("momentum")), "no momentum in the bucket: {objects:?}");
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p.to_string_lossy().into_owned());
        }
    }
    out
}
