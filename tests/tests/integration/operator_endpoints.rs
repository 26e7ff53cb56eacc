//! What operators scrape (issue 17): the orchestrator's `/metrics` in the
//! Prometheus exposition format, parsed strictly, with values that agree
//! with the run's own counters; and the endpoint's answers to bad requests.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use iota_core::WireCodec;
use iota_tests::{Swarm, tiny_run};

/// One raw HTTP exchange: (status, body).
fn http(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status line");
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// Parses the exposition: every line a `# HELP`, `# TYPE`, `# EOF` (last)
/// or a sample `name{labels} value` of a declared family. Returns samples
/// keyed by `name{labels}`.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut families = std::collections::BTreeSet::new();
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition must end with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            families.insert(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let name = key.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "bad metric name {name}");
        let family = name.strip_suffix("_total").unwrap_or(name);
        assert!(families.contains(family), "{name} has no # TYPE line");
        if let Some(labels) = key.strip_prefix(name)
            && !labels.is_empty()
        {
            assert!(labels.starts_with('{') && labels.ends_with('}'), "bad labels in {line}");
        }
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("not a number: {line}"));
        assert!(samples.insert(key.to_string(), v).is_none(), "duplicate sample {key}");
    }
    samples
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_orchestrator_serves_metrics_that_agree_with_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 2, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let router = iota_control::http_endpoint::orchestrator_router(swarm.service.clone());
    let (addr, server) = iota_control::http_endpoint::serve("127.0.0.1:0".parse().unwrap(), router).await.unwrap();
    // Before any miner: waiting, nothing done.
    let (status, body) =
        tokio::task::spawn_blocking(move || http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")).await.unwrap();
    assert_eq!(status, 200);
    let before = parse_exposition(&body);
    assert_eq!(before["iota_phase{phase=\"waiting\"}"], 1.0);
    assert_eq!(before["iota_micro_batches_completed_total"], 0.0);
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..4).map(|_| swarm.miner(stop.clone())).collect();
    for m in miners {
        tokio::time::timeout(Duration::from_secs(90), m).await.expect("miner in time").unwrap().unwrap();
    }
    let (status, body) =
        tokio::task::spawn_blocking(move || http(addr, "GET /metrics HTTP/1.1\r\n\r\n")).await.unwrap();
    assert_eq!(status, 200);
    let after = parse_exposition(&body);
    let (c, history) = swarm.service.with_state(|o| (o.counters().clone(), o.history().to_vec()));
    assert_eq!(after["iota_phase{phase=\"done\"}"], 1.0);
    assert_eq!(after["iota_phase{phase=\"training\"}"], 0.0);
    assert_eq!(after["iota_micro_batches_completed_total"], c.completed as f64);
    assert_eq!(after["iota_micro_batches_completed_total"], history.iter().map(|e| e.completed).sum::<u64>() as f64);
    assert_eq!(after["iota_tokens_total"], c.tokens as f64);
    assert!(c.tokens > 0);
    assert_eq!(after["iota_epochs"], 2.0);
    let loss = after["iota_epoch_mean_loss"];
    assert!((loss - f64::from(history[1].mean_loss)).abs() < 1e-6, "{loss} vs {:?}", history[1].mean_loss);
    for stage in 0..2 {
        let healthy = after[&format!("iota_miners{{stage=\"{stage}\",state=\"healthy\"}}")];
        let unhealthy = after[&format!("iota_miners{{stage=\"{stage}\",state=\"unhealthy\"}}")];
        assert_eq!(healthy + unhealthy, 2.0, "stage {stage}: two miners");
    }
    // Bad requests get clear statuses; nothing else is served.
    let bad = tokio::task::spawn_blocking(move || {
        (
            http(addr, "GET /nope HTTP/1.1\r\n\r\n"),
            http(addr, "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n"),
            http(addr, "GARBAGE\r\n\r\n"),
            http(addr, &format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(9000))),
        )
    })
    .await
    .unwrap();
    assert_eq!(bad.0.0, 404);
    assert!(bad.0.1.contains("no page at /nope"));
    assert_eq!(bad.1.0, 405);
    assert_eq!(bad.2.0, 400);
    assert_eq!(bad.3.0, 431);
    server.abort();
}
