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
/// or a sample `name{labels} value` of a declared family, with the suffix
/// its type gives samples. Returns samples
/// keyed by `name{labels}`.
fn parse_exposition(text: &str) -> BTreeMap<String, f64> {
    let mut families = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "the exposition must end with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            families.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        let (key, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("not a sample: {line}"));
        let name = key.split('{').next().unwrap();
        assert!(name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "bad metric name {name}");
        // Counters' samples end in _total; histograms' in _bucket, _sum, _count.
        let of_kind = |suffix: &str, kind: &str| {
            name.strip_suffix(suffix).filter(|f| families.get(*f).map(String::as_str) == Some(kind))
        };
        let declared = families.contains_key(name)
            || of_kind("_total", "counter").is_some()
            || ["_bucket", "_sum", "_count"].iter().any(|s| of_kind(s, "histogram").is_some());
        assert!(declared, "{name} has no # TYPE line of its kind");
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
    let router = iota_control::http_endpoint::orchestrator_router(
        swarm.service.clone(),
        iota_control::http_endpoint::Pages { metrics: true, dashboard: false },
    );
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

/// A browser for the dashboard test: $IOTA_TEST_CHROMIUM, else the first of
/// Debian's and the usual names on PATH.
fn chromium() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("IOTA_TEST_CHROMIUM") {
        return Some(p.into());
    }
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome", "google-chrome-stable"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

/// Runs headless Chromium on `url` with `args`, 90 s at most; its stdout.
fn headless(browser: &std::path::Path, profile: &std::path::Path, args: &[&str], url: &str) -> String {
    let mut child = std::process::Command::new(browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars"])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("chromium starts");
    let mut out = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium took over 90 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    out.push_str(&reader.join().unwrap());
    out
}

/// The value of `attr="…"` on the element whose id is `id` in a dumped DOM.
fn attr_of(dom: &str, id: &str, attr: &str) -> Option<String> {
    let at = dom.find(&format!("id=\"{id}\""))?;
    let start = dom[..at].rfind('<')?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let v = tag.split(&format!("{attr}=\"")).nth(1)?;
    Some(v[..v.find('"')?].to_string())
}

/// The dashboard of a live `tiny` swarm: its JSON agrees with the run, and
/// in headless Chromium the page draws the loss curve and lists every miner
/// (a screenshot is kept under the test's output); unknown routes are 404.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_dashboard_shows_a_live_run_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 3, 48, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let pages = iota_control::http_endpoint::Pages { metrics: false, dashboard: true };
    let router = iota_control::http_endpoint::orchestrator_router(swarm.service.clone(), pages);
    let (addr, server) = iota_control::http_endpoint::serve("127.0.0.1:0".parse().unwrap(), router).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let miners: Vec<_> = (0..4).map(|_| swarm.miner(stop.clone())).collect();
    // Live: every miner in, micro-batches completing.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (subscribed, completed) =
            swarm.service.with_state(|o| (o.miners().filter(|m| m.subscribed).count(), o.counters().completed));
        if subscribed == 4 && completed >= 6 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the swarm did not get going: {subscribed} miners, {completed} done"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let peers: Vec<String> =
        swarm.service.with_state(|o| o.miners().map(|m| m.peer.to_hex()[..12].to_string()).collect());
    let (status, body) =
        tokio::task::spawn_blocking(move || http(addr, "GET /api/state HTTP/1.1\r\n\r\n")).await.unwrap();
    assert_eq!(status, 200);
    let st: serde_json::Value = serde_json::from_str(&body).expect("the state is JSON");
    assert_eq!(st["epochs"], 3);
    assert_eq!(st["miners"].as_array().unwrap().len(), 4);
    for m in st["miners"].as_array().unwrap() {
        assert!(peers.contains(&m["peer"].as_str().unwrap().to_string()), "{m}");
        assert_eq!(m["device"], "cpu");
    }
    let train = st["train"].as_array().unwrap();
    assert!(train.len() >= 6, "loss points: {}", train.len());
    assert!(train.iter().all(|p| p[1].as_f64().is_some_and(|l| l > 0.0 && l < 20.0)), "{train:?}");
    assert_eq!(st["stages"].as_array().unwrap().len(), 2);
    // Only the dashboard's routes are served here.
    let (page, state_head, metrics, nope) = tokio::task::spawn_blocking(move || {
        (
            http(addr, "GET / HTTP/1.1\r\n\r\n"),
            http(addr, "HEAD /api/state HTTP/1.1\r\n\r\n"),
            http(addr, "GET /metrics HTTP/1.1\r\n\r\n"),
            http(addr, "GET /api/nothing HTTP/1.1\r\n\r\n"),
        )
    })
    .await
    .unwrap();
    assert_eq!(page.0, 200);
    assert!(page.1.contains("id=\"losschart\""));
    assert_eq!(state_head, (200, String::new()), "HEAD has no body");
    assert_eq!(metrics.0, 404, "metrics were not asked for");
    assert_eq!(nope.0, 404);
    assert!(nope.1.contains("no page at /api/nothing"));

    match chromium() {
        None => eprintln!(
            "SKIPPED the browser half of the dashboard test: no chromium on PATH (apt-get install chromium, or set IOTA_TEST_CHROMIUM)"
        ),
        Some(browser) => {
            let url = format!("http://{addr}/");
            let out_dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
            std::fs::create_dir_all(&out_dir).unwrap();
            let shot = out_dir.join("dashboard.png");
            let _ = std::fs::remove_file(&shot);
            let profile = dir.path().join("chromium-profile");
            let (dom, ()) = tokio::task::spawn_blocking({
                let (browser, shot, url) = (browser.clone(), shot.clone(), url.clone());
                move || {
                    // Virtual time runs the page's polls (several of them)
                    // while the swarm goes on training.
                    let dom = headless(&browser, &profile, &["--virtual-time-budget=5000", "--dump-dom"], &url);
                    let shot_arg = format!("--screenshot={}", shot.display());
                    headless(
                        &browser,
                        &profile,
                        &["--virtual-time-budget=5000", "--window-size=1400,1700", &shot_arg],
                        &url,
                    );
                    (dom, ())
                }
            })
            .await
            .unwrap();
            let points: usize = attr_of(&dom, "losschart", "data-points")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no loss chart in the page: {}", &dom[..dom.len().min(2000)]));
            assert!(points >= 6, "the loss chart has {points} points");
            assert_eq!(attr_of(&dom, "miners", "data-rows").as_deref(), Some("4"), "miner rows");
            // The throughput chart's time axis: in seconds, each tick its
            // own label (not 0, 0, 0 where the ticks are under a second
            // apart).
            let ticks = attr_of(&dom, "tpschart", "data-xticks").expect("a throughput chart with a time axis");
            let labels: Vec<&str> = ticks.split('|').collect();
            assert!(labels.len() >= 2 && labels.iter().all(|l| l.ends_with(" s")), "time axis labels: {ticks}");
            let distinct: std::collections::HashSet<&&str> = labels.iter().collect();
            assert_eq!(distinct.len(), labels.len(), "time axis labels repeat: {ticks}");
            for p in &peers {
                assert!(dom.contains(&format!("data-peer=\"{p}\"")), "miner {p} is not in the table");
            }
            // The connection line says when it last updated (the script's
            // own text holds the failure message, so look at the element).
            let conn = dom.split("id=\"conn\"").nth(1).and_then(|t| t.split('>').nth(1)).unwrap_or_default();
            assert!(conn.starts_with("updated"), "the page's connection line: {conn}");
            let png = std::fs::read(&shot).expect("a screenshot");
            assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000, "screenshot of {} bytes", png.len());
            eprintln!("dashboard screenshot: {}", shot.display());
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for m in miners {
        let _ = tokio::time::timeout(Duration::from_secs(60), m).await;
    }
    server.abort();
}

/// A loopback address with a port free just now (for a server that does
/// not say which port it bound).
fn free_loopback_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Each miner's `/metrics` (step times, tokens, bytes and frames per lane,
/// merge times, rejections, store retries) parses strictly and agrees with
/// what it did; the orchestrator's is scraped beside it. The bytes the
/// transports count on the boundary lanes equal, sent and received, what
/// the codec's formula says per token when nothing was sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn miners_serve_metrics_and_count_their_wire_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tiny_run(2, 2, 4, 16, WireCodec::Int8Row);
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let pages = iota_control::http_endpoint::Pages { metrics: true, dashboard: false };
    let router = iota_control::http_endpoint::orchestrator_router(swarm.service.clone(), pages);
    let (orch_addr, server) = iota_control::http_endpoint::serve("127.0.0.1:0".parse().unwrap(), router).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let addrs: Vec<std::net::SocketAddr> = (0..4).map(|_| free_loopback_addr()).collect();
    let miners: Vec<_> = addrs.iter().map(|a| swarm.miner_with(|o| o.metrics = Some(*a), stop.clone())).collect();
    // Past the first merge, mid-run.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while swarm.service.with_state(|o| o.history().is_empty() || o.counters().completed < 20) {
        assert!(std::time::Instant::now() < deadline, "the swarm did not get past its first merge");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each miner hears of the merge's end on its own time: scrape until all
    // four have timed one (a few seconds at most; the run lasts longer).
    let scrapes = tokio::task::spawn_blocking({
        let addrs = addrs.clone();
        move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            loop {
                let miners: Vec<_> = addrs.iter().map(|a| http(*a, "GET /metrics HTTP/1.1\r\n\r\n")).collect();
                let merged = |body: &str| {
                    body.lines().any(|l| l.starts_with("iota_miner_merge_seconds_count ") && !l.ends_with(" 0"))
                };
                // Past its merge, a miner works in the next epoch and says so.
                let moved_on =
                    |body: &str| body.lines().any(|l| l.starts_with("iota_miner_epoch ") && !l.ends_with(" 0"));
                if miners.iter().all(|(_, b)| merged(b) && moved_on(b)) || std::time::Instant::now() > deadline {
                    let orch = http(orch_addr, "GET /metrics HTTP/1.1\r\n\r\n");
                    let status: Vec<_> = addrs.iter().map(|a| http(*a, "GET /status HTTP/1.1\r\n\r\n")).collect();
                    return (miners, orch, http(addrs[0], "GET /dashboard HTTP/1.1\r\n\r\n"), status);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    })
    .await
    .unwrap();
    let (miner_pages, orch_page, unknown, status_pages) = scrapes;
    assert_eq!(unknown.0, 404, "a miner serves /metrics and /status only");
    // Where each miner stands, in one line: mid-run, past a settled epoch,
    // on its stage of two.
    for (code, body) in &status_pages {
        assert_eq!(*code, 200);
        let line = body.trim();
        assert_eq!(line.lines().count(), 1, "{body}");
        let working =
            ["training stage", "merging stage", "uploading stage", "on probation on stage", "the run is over"];
        assert!(working.iter().any(|w| line.starts_with(w)), "{line}");
        assert!(line.contains("micro-batches delivered"), "{line}");
    }
    assert_eq!(orch_page.0, 200);
    let orch = parse_exposition(&orch_page.1);
    assert!(orch["iota_micro_batches_completed_total"] >= 20.0);
    let mut forward_steps = 0.0;
    for (status, body) in &miner_pages {
        assert_eq!(*status, 200);
        let m = parse_exposition(body);
        let get = |k: &str| m.get(k).copied().unwrap_or_else(|| panic!("no {k} in\n{body}"));
        assert!(get("iota_miner_tokens_total") > 0.0);
        forward_steps += get("iota_miner_step_seconds_count{kind=\"forward\"}");
        assert!(get("iota_miner_step_seconds_count{kind=\"command\"}") > 0.0);
        // One merge behind it, timed (a miner sees it from plan to phase).
        assert!(get("iota_miner_merge_seconds_count") >= 1.0, "{body}");
        assert!(get("iota_miner_merge_seconds_sum") > 0.0);
        // The epoch it works in (its heartbeats carry the same gauge).
        assert!(get("iota_miner_epoch") >= 1.0, "{body}");
        // A stage-0 miner sends activations and receives their gradients; a
        // stage-1 miner the other way round.
        let sent = get("iota_miner_sent_bytes_total{lane=\"activations\"}")
            + get("iota_miner_sent_bytes_total{lane=\"activation_grads\"}");
        let received = get("iota_miner_received_bytes_total{lane=\"activations\"}")
            + get("iota_miner_received_bytes_total{lane=\"activation_grads\"}");
        assert!(sent > 0.0 && received > 0.0, "{body}");
        assert_eq!(get("iota_miner_store_retries_total"), 0.0, "a local store never retries");
        assert_eq!(get("iota_miner_send_failures_total"), 0.0);
        assert!(!m.keys().any(|k| k.starts_with("iota_miner_device_memory")), "no device memory on the CPU");
        // Its standing: exactly one state is 1, and its stage is one of two.
        let states: Vec<_> = m.iter().filter(|(k, v)| k.starts_with("iota_miner_standing{") && **v == 1.0).collect();
        assert_eq!(states.len(), 1, "{body}");
        assert!(get("iota_miner_stage") < 2.0);
    }
    assert!(forward_steps >= 20.0, "forward steps: {forward_steps}");
    let mut summaries = Vec::new();
    for m in miners {
        summaries.push(tokio::time::timeout(Duration::from_secs(90), m).await.expect("in time").unwrap().unwrap());
    }
    server.abort();
    let c = swarm.service.with_state(|o| o.counters().clone());
    let lane = |s: &iota_dataplane::miner::MinerSummary, name: &str| s.transport.wire_totals().lanes[name];
    // Every micro-batch went through once, nothing hedged or re-sent: each
    // boundary frame sent was received, and the bytes are the formula's.
    // (A hedge or a re-route sends frames a cancelled attempt's receiver
    // may refuse, so then only bounds hold.)
    let clean = c.rerouted == 0 && c.hedged == 0 && c.dropped == 0;
    let mut sent = 0u64;
    for name in ["activations", "activation_grads"] {
        let (out, got): (Vec<_>, Vec<_>) = summaries.iter().map(|s| (lane(s, name), lane(s, name))).unzip();
        let (bytes_out, frames_out) =
            (out.iter().map(|l| l.bytes_sent).sum::<u64>(), out.iter().map(|l| l.frames_sent).sum::<u64>());
        let (bytes_in, frames_in) =
            (got.iter().map(|l| l.bytes_received).sum::<u64>(), got.iter().map(|l| l.frames_received).sum::<u64>());
        // All of a lane's frames are the same size here (one micro-batch's
        // boundary tensor): bytes are counted per whole frame both ways.
        assert!(frames_out > 0 && bytes_out % frames_out == 0, "{name}: {bytes_out} bytes in {frames_out} frames");
        assert_eq!(bytes_in, frames_in * (bytes_out / frames_out), "{name}: received bytes per frame");
        if clean {
            assert_eq!((bytes_out, frames_out), (bytes_in, frames_in), "{name}: every frame sent was received");
        } else {
            assert!(frames_in <= frames_out, "{name}: {frames_in} received of {frames_out} sent");
        }
        sent += bytes_out;
    }
    assert_eq!(sent, summaries.iter().map(|s| s.transport.wire_totals().boundary_bytes_sent()).sum::<u64>());
    let formula = iota_control::swarm::wire_bytes_per_token(&cfg) * c.tokens as f64;
    if clean {
        assert!(
            (sent as f64 - formula).abs() < 1e-6 * formula,
            "measured {sent} bytes, formula {formula:.0} for {} tokens",
            c.tokens
        );
    } else {
        eprintln!(
            "re-sends in this run ({} re-routed, {} hedged): measured only bounds the formula",
            c.rerouted, c.hedged
        );
        assert!(sent as f64 >= formula, "measured {sent} < formula {formula}");
    }
}

/// `iota-control --log-format json swarm`: the swarm's and its miners' log
/// lines are one JSON object each; the summary reports the boundary bytes
/// per token counted on the wire beside the formula; `--dashboard` and
/// `--metrics` say where they are.
#[test]
fn the_swarm_logs_json_and_reports_measured_wire_bytes() {
    let Some(control) = iota_tests::netns::workspace_binary("iota-control") else {
        eprintln!("SKIPPED: iota-control is not built (cargo build --release --bins)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let out = std::process::Command::new(&control)
        .args(["--log-format", "json", "swarm", "--model", "tiny", "--epochs", "1", "--micro-batches", "8"])
        .args(["--dashboard", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--run-dir"])
        .arg(&run_dir)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "swarm failed:\n{stdout}\n{stderr}");
    let json_lines = |text: &str, whose: &str| {
        let lines: Vec<serde_json::Value> = text
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{whose}: not JSON ({e}): {l}")))
            .collect();
        for v in &lines {
            assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{whose}: {v}");
        }
        lines.len()
    };
    assert!(json_lines(&stderr, "the swarm") > 0, "no JSON log lines:\n{stderr}");
    let miner_log = std::fs::read_to_string(run_dir.join("logs/miner-0.log")).unwrap();
    assert!(json_lines(&miner_log, "miner 0") > 0);
    assert!(miner_log.lines().filter(|l| !l.trim().is_empty()).all(|l| l.starts_with('{')), "{miner_log}");
    assert!(stderr.contains("dashboard at http://127.0.0.1:") && stderr.contains("/metrics"), "{stderr}");
    // "boundary traffic, bytes per token: M measured on the wire (...), F by formula (...)"
    let line = stdout.lines().find(|l| l.starts_with("boundary traffic")).expect("a traffic line");
    let number_before = |marker: &str| -> f64 {
        let head = &line[..line.find(marker).unwrap_or_else(|| panic!("no '{marker}' in {line}"))];
        head.rsplit([' ', ':']).find(|w| !w.is_empty()).unwrap().parse().unwrap()
    };
    let (measured, formula) = (number_before(" measured on the wire"), number_before(" by formula"));
    assert!(formula > 0.0 && measured >= formula - 0.05, "{line}");
    assert!(stdout.contains("model: "), "{stdout}");
    // The miner list: every miner with its device and a measured rate.
    let rows: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("tok/s (mean)"))
        .skip(1)
        .take_while(|l| l.contains(" cpu "))
        .collect();
    assert_eq!(rows.len(), 6, "{stdout}");
    // (stage, rate): every stage's work was measured (a miner that joined
    // late may have carried none in a one-epoch run).
    let rates: Vec<(u32, f64)> = rows
        .iter()
        .map(|r| {
            let f: Vec<&str> = r.split_whitespace().collect();
            (f[1].parse().unwrap(), f.last().unwrap().parse().unwrap())
        })
        .collect();
    for stage in 0..3 {
        assert!(rates.iter().any(|&(s, r)| s == stage && r > 0.0), "stage {stage}: {rows:?}");
    }

    // On demand, from the saved state and the store: the same model, byte
    // for byte; the swarm's own export moved aside, never deleted.
    let export = |dir: &std::path::Path| {
        std::process::Command::new(&control).arg("export").arg("--run-dir").arg(dir).output().unwrap()
    };
    let model = run_dir.join("model");
    let swarm_weights = std::fs::read(model.join("model.safetensors")).unwrap();
    let again = export(&run_dir);
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already holds"),
        "the same state's model is not rewritten"
    );
    std::fs::rename(&model, run_dir.join("model.by-swarm")).unwrap();
    let fresh = export(&run_dir);
    assert!(fresh.status.success(), "{}", String::from_utf8_lossy(&fresh.stderr));
    assert_eq!(std::fs::read(model.join("model.safetensors")).unwrap(), swarm_weights);
    let nowhere = export(&dir.path().join("no-such-run"));
    assert!(!nowhere.status.success());
    assert!(String::from_utf8_lossy(&nowhere.stderr).contains("a run directory?"), "a clear error");
}

/// Issue 59: a miner that finds the run full is queued, says so (its
/// `/status`, and `iota_miner_standing{state="queued"}`), keeps its place by
/// asking again, and takes the place a silent miner leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_miner_queued_for_a_full_run_says_so_and_takes_a_freed_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny_run(2, 1, 200, 16, WireCodec::Int8Row);
    cfg.spec.miners_per_stage_cap = 1;
    let swarm = Swarm::start(&cfg, dir.path().join("state.sqlite")).await;
    let (stop_a, stop_b, stop_c) =
        (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let a = swarm.miner(stop_a.clone());
    let b = swarm.miner(stop_b.clone());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while swarm.service.with_state(|o| o.counters().completed < 4) {
        assert!(std::time::Instant::now() < deadline, "the run did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let at = free_loopback_addr();
    let c = swarm.miner_with(|o| o.metrics = Some(at), stop_c.clone());
    let status = |want: &'static str| async move {
        let deadline = std::time::Instant::now() + Duration::from_secs(40);
        loop {
            let line = std::net::TcpStream::connect(at).ok().map(|_| http(at, "GET /status HTTP/1.1\r\n\r\n").1);
            if let Some(l) = line.as_ref().filter(|l| l.contains(want)) {
                return l.clone();
            }
            assert!(std::time::Instant::now() < deadline, "no {want:?} at /status: {line:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let queued = status("queued at position 1 of 1: every one of the run's 2 places is taken").await;
    assert!(queued.contains("asking again every 5 s keeps this place"), "{queued}");
    let metrics = http(at, "GET /metrics HTTP/1.1\r\n\r\n").1;
    assert!(metrics.lines().any(|l| l == "iota_miner_standing{state=\"queued\"} 1"), "{metrics}");
    assert_eq!(swarm.service.with_state(|o| o.waitlist().len()), 1);
    // Miner b stops: once its place is free (4 heartbeat timeouts), the
    // queued miner takes it, on b's stage, and trains there.
    stop_b.store(true, std::sync::atomic::Ordering::SeqCst);
    let taken = status("training stage ").await;
    let stage: u32 = taken["training stage ".len()..].split(' ').next().unwrap().parse().unwrap();
    let on_stage: Vec<(bool, bool)> = swarm.service.with_state(|o| {
        o.miners()
            .filter(|m| m.stage == stage)
            .map(|m| (m.live(), m.holds_place(iota_protocol::auth::now_ms(), 12_000)))
            .collect()
    });
    assert_eq!(on_stage.len(), 2, "the silent miner and the newcomer on stage {stage}: {on_stage:?}");
    assert!(on_stage.contains(&(false, false)), "the silent one holds no place: {on_stage:?}");
    assert_eq!(swarm.service.with_state(|o| o.waitlist().len()), 0);
    for s in [&stop_a, &stop_c] {
        s.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    for m in [a, b, c] {
        let _ = tokio::time::timeout(Duration::from_secs(30), m).await;
    }
}
