//! Swarms of separate hosts: the S3 server, the orchestrator and each miner
//! in a network namespace of its own with a directory of its own (no shared
//! directory, no shared path), over TLS, with admission and the bucket; and
//! the same swarm under chaos (processes killed with SIGKILL and started
//! again, a miner's link cut). Skipped, saying why, where namespaces cannot
//! be made.

use std::time::Duration;

use iota_tests::netns::{Net, NetSwarm, Wan, epoch_losses, in_namespace, unavailable};
use iota_tests::udp_relay::{LinkShape, UdpRelay};

/// 2 stages x 2 replicas, `tiny`, 16 micro-batches an epoch.
fn shape(epochs: &'static str) -> Vec<&'static str> {
    shape_with(epochs, "16")
}

#[rustfmt::skip]
fn shape_with(epochs: &'static str, micro_batches: &'static str) -> Vec<&'static str> {
    vec![
        "--model", "tiny", "--stages", "2", "--replicas", "2", "--epochs", epochs,
        "--micro-batches", micro_batches, "--batch", "4", "--seq", "64", "--outer-momentum", "0.5",
    ]
}

/// Every epoch accounted for: all its 16 micro-batches completed or counted dropped.
fn every_epoch_accounted(out: &str, epochs: usize) {
    every_epoch_accounted_of(out, epochs, 16)
}

fn every_epoch_accounted_of(out: &str, epochs: usize, per_epoch: u64) {
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("epoch ") && l.contains(": mean loss")).collect();
    let last: Vec<&str> = lines.iter().rev().take(epochs).rev().copied().collect();
    assert_eq!(last.len(), epochs, "{out}");
    for l in last {
        let done = |what: &str| -> u64 {
            l.split(", ").find_map(|p| p.strip_suffix(what)).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
        };
        assert_eq!(done(" micro-batches completed") + done(" dropped"), per_epoch, "{l}");
    }
}

/// The corpus is a text of the test's own, which `data prepare` writes into
/// the bucket: no miner host holds it, or any path to it.
#[test]
fn a_swarm_of_separate_hosts_trains_on_a_bucket_over_tls() {
    let text = iota_model::data::synthetic::grammar_text(7, 300_000);
    let Some(mut s) = NetSwarm::start_prepared(4, &shape("2"), &text) else { return };
    let out = s.wait_done(Duration::from_secs(90));
    println!("{}", out.lines().filter(|l| l.starts_with("epoch")).collect::<Vec<_>>().join("\n"));
    let losses = epoch_losses(&out);
    assert_eq!(losses.len(), 2, "{out}");
    assert!(losses[1] < losses[0], "the loss falls: {losses:?}");
    // Every micro-batch completed and every merge agreed. (A re-route or two
    // may happen on a loaded machine: a hop overdue is what they are for.)
    let summary = out.lines().find(|l| l.starts_with("epoch 2, ")).unwrap_or_else(|| panic!("no run summary: {out}"));
    assert!(summary.starts_with("epoch 2, 32 micro-batches completed, "), "{summary}");
    assert!(summary.ends_with(" re-routed, 0 dropped, 0 divergent merges"), "{summary}");
    // No host has a store directory; the objects are on the bucket's host.
    for i in 0..4 {
        assert!(!s.miner_dir(i).join("store").exists());
    }
    assert!(!s.orchestrator_dir().join("run/store").exists());
    let objects = walk(&s.s3_data());
    assert!(objects.iter().any(|p| p.contains("momentum")), "no momentum in the bucket: {objects:?}");
    assert!(objects.iter().any(|p| p.ends_with("data/manifest.json")), "no corpus in the bucket: {objects:?}");
    // Each miner fetched the corpus through its grants and cached it.
    for i in 0..4 {
        let cached = std::fs::read_dir(s.miner_dir(i).join("iota-cache/corpus")).map(|d| d.count()).unwrap_or(0);
        assert!(cached > 0, "miner {i} cached no corpus chunk");
    }
}

/// Issue 59: no S3 server anywhere. The orchestrator serves the run's store
/// itself and holds the only copy of the corpus (`--data` on its host);
/// each miner on its own host joins with nothing but the token the
/// orchestrator printed, fetches the corpus and every object through
/// grants over TLS, and the swarm trains with outer momentum on.
#[test]
fn a_swarm_of_separate_hosts_trains_on_the_orchestrators_own_store() {
    let text = iota_model::data::synthetic::grammar_text(11, 300_000);
    let Some(mut s) = NetSwarm::start_served(4, &shape("2"), &text) else { return };
    let out = s.wait_done(Duration::from_secs(90));
    println!("{}", out.lines().filter(|l| l.starts_with("epoch")).collect::<Vec<_>>().join("\n"));
    let losses = epoch_losses(&out);
    assert_eq!(losses.len(), 2, "{out}");
    assert!(losses[1] < losses[0], "the loss falls: {losses:?}");
    every_epoch_accounted(&out, 2);
    let summary = out.lines().find(|l| l.starts_with("epoch 2, ")).unwrap_or_else(|| panic!("no run summary: {out}"));
    assert!(summary.ends_with(" 0 dropped, 0 divergent merges"), "{summary}");
    // The join line as printed is the whole set-up: no --store, no --data.
    let token = out.lines().find_map(|l| l.strip_prefix("join token: ")).expect("a join token");
    let join = out.lines().find_map(|l| l.strip_prefix("miners join with: ")).expect("a join line");
    assert_eq!(join, format!("iota-miner run --join {token}"));
    let served_at = format!("served at https://{}:7101", iota_tests::netns::Net::addr(11));
    assert!(out.contains(&served_at), "{out}");
    // The objects, the corpus and the outer momentum are in the
    // orchestrator's directory; no miner host has a store or the corpus.
    let objects = walk(&s.orchestrator_dir().join("run/store"));
    assert!(objects.iter().any(|p| p.contains("momentum")), "no momentum in the store: {objects:?}");
    assert!(objects.iter().any(|p| p.ends_with("data/manifest.json")), "no corpus in the store: {objects:?}");
    for i in 0..4 {
        assert!(!s.miner_dir(i).join("store").exists());
        assert!(!s.miner_dir(i).join("corpus.txt").exists());
        let cached = std::fs::read_dir(s.miner_dir(i).join("iota-cache/corpus")).map(|d| d.count()).unwrap_or(0);
        assert!(cached > 0, "miner {i} cached no corpus chunk");
    }
}

/// The orchestrator is killed (SIGKILL) in the middle of the second epoch's
/// training and started again on the same run directory: the run resumes
/// and ends, every epoch accounted for, no committed epoch lost.
#[test]
fn chaos_the_orchestrator_killed_mid_training_resumes_the_run() {
    // Micro-batches in flight at the crash are lost with it; a short route
    // timeout re-issues them sooner than the production default.
    // 48 micro-batches an epoch: long enough that the kill, 300 ms after
    // the first merge, lands in the second epoch's training (at 16 a
    // miner's epoch of `tiny` can end sooner, and the kill then lands in
    // the merge, which is another test's case).
    let flags = [shape_with("3", "48"), vec!["--route-timeout-s", "5"]].concat();
    let Some(mut s) = NetSwarm::start(4, &flags) else { return };
    wait_for_line(&s, "miner", 0, "butterfly merge complete epoch=0", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    s.kill_orchestrator();
    std::thread::sleep(Duration::from_secs(1));
    s.start_orchestrator();
    let out = s.wait_done(Duration::from_secs(60));
    assert!(out.contains("resuming run from saved state"), "{out}");
    assert!(out.contains("phase=Training"), "the kill was to land in training: {out}");
    every_epoch_accounted_of(&out, 3, 48);
    assert!(out.contains(" 0 divergent merges"), "{out}");
}

/// A miner is killed (SIGKILL) during the second epoch's training and
/// started again with its identity and directory: the run ends with every
/// epoch accounted for, and the miner rejoins by downloading the merged
/// weights from the bucket. (Killed during a merge instead, the partitions
/// it was to write may never be stored: see the note.)
#[test]
fn chaos_a_miner_killed_mid_training_rejoins_from_the_bucket() {
    let Some(mut s) = NetSwarm::start(4, &shape_with("3", "48")) else { return };
    wait_for_line(&s, "miner", 1, "butterfly merge complete epoch=0", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(200));
    s.kill_miner(1);
    std::thread::sleep(Duration::from_millis(500));
    s.start_miner(1);
    let out = s.wait_done(Duration::from_secs(60));
    every_epoch_accounted_of(&out, 3, 48);
    let restarted = s.miners[1].as_ref().unwrap().output();
    assert!(
        restarted.contains("loaded merged weights"),
        "the restarted miner did not load merged weights:\n{restarted}"
    );
    assert!(!restarted.contains("stage worker error"), "stale work reached the restarted miner:\n{restarted}");
}

/// A miner is killed (SIGKILL) early in the run, when it may be in the
/// first epoch's training or in the middle of its merge, and started again:
/// a partition it was to write is written by its stage's other replica, so
/// the run ends with every epoch accounted for and the restarted miner loads
/// complete merged weights.
#[test]
fn chaos_a_miner_killed_around_the_first_merge_rejoins() {
    let flags = [shape("3"), vec!["--route-timeout-s", "5"]].concat();
    let Some(mut s) = NetSwarm::start(4, &flags) else { return };
    wait_for_line(&s, "miner", 1, "assigned stage", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    s.kill_miner(1);
    std::thread::sleep(Duration::from_secs(1));
    s.start_miner(1);
    let out = s.wait_done(Duration::from_secs(60));
    every_epoch_accounted(&out, 3);
    let restarted = s.miners[1].as_ref().unwrap().output();
    assert!(!restarted.contains("stage worker error"), "{restarted}");
    // Back within the first epoch it starts from the seed's weights and
    // merges with its replica; later, it loads the merged ones.
    let rejoined = restarted.contains("loaded merged weights") || restarted.contains("butterfly merge complete");
    assert!(rejoined, "{restarted}");
}

/// One miner's link is cut for 5 s mid-training: its work is re-routed to
/// its stage's other replica, and the run ends with every epoch accounted for.
#[test]
fn chaos_a_miners_link_cut_mid_training_stalls_nobody() {
    let Some(mut s) = NetSwarm::start(4, &shape("3")) else { return };
    wait_for_line(&s, "miner", 2, "assigned stage", Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    s.set_link(2, false);
    std::thread::sleep(Duration::from_secs(5));
    s.set_link(2, true);
    let out = s.wait_done(Duration::from_secs(90));
    every_epoch_accounted(&out, 3);
}

/// The S3 server is stopped (SIGKILL: every connection to the bucket is
/// refused) for 20 s after the first merge, then started again on the same
/// data: the run waits it out and ends with every epoch accounted for and
/// every merge agreed, and the loss still falls.
#[test]
fn chaos_the_bucket_down_for_20_s_delays_the_run_and_loses_nothing() {
    let Some(mut s) = NetSwarm::start(4, &shape("4")) else { return };
    wait_for_line(&s, "miner", 0, "butterfly merge complete epoch=0", Duration::from_secs(60));
    s.kill_store();
    std::thread::sleep(Duration::from_secs(20));
    // The outage mattered only if the run was still going.
    assert!(s.orchestrator_running(), "the run ended while the bucket was down:\n{}", s.orchestrator_output());
    s.start_store();
    let out = s.wait_done(Duration::from_secs(60));
    every_epoch_accounted(&out, 4);
    assert!(out.contains(" 0 divergent merges"), "{out}");
    let losses = epoch_losses(&out);
    assert!(losses.last() < losses.first(), "the loss falls: {losses:?}");
}

/// One miner's link is cut for 30 s mid-training, longer than the heartbeat
/// timeout: the others train on without it, and once its link is back it
/// rejoins by downloading the current merged weights from the bucket; every
/// epoch is accounted for.
#[test]
fn chaos_a_miners_link_cut_for_30_s_and_it_rejoins_from_the_bucket() {
    // Every frame of work takes at least 100 ms: with one replica left in
    // a stage an epoch's 16 micro-batches take it 32 frames, so the cut
    // spans at most 9.4 of the 12 epochs on any machine.
    let t0 = std::time::Instant::now();
    let Some(mut s) = NetSwarm::start_with(4, &shape_with("12", "16"), &["--min-frame-ms", "100"]) else { return };
    wait_for_line(&s, "miner", 2, "butterfly merge complete epoch=0", Duration::from_secs(60));
    s.set_link(2, false);
    std::thread::sleep(Duration::from_secs(30));
    assert!(s.orchestrator_running(), "the run ended while the link was cut:\n{}", s.orchestrator_output());
    s.set_link(2, true);
    let out = s.wait_done(Duration::from_secs(60));
    println!("the run ended {:?} after it started", t0.elapsed());
    every_epoch_accounted(&out, 12);
    let miner = s.miners[2].as_ref().unwrap().output();
    assert!(miner.contains("loaded merged weights"), "the cut-off miner did not load merged weights:\n{miner}");
}

/// The link shaping the WAN tests use does what it says: through a relay
/// of 15 ms (+ up to 5 ms jitter) each way and 10% loss each way, a round
/// trip takes at least 30 ms and about 81% of them come back, every missing
/// one counted as dropped by the relay; over `tc tbf` at 20 Mbit/s, a bulk
/// TCP transfer goes no faster than that.
#[test]
fn a_shaped_link_holds_its_delay_loss_and_rate() {
    use std::net::{TcpListener, TcpStream, UdpSocket};
    if let Some(why) = unavailable() {
        println!("skipped: {why}");
        return;
    }
    let mut net = Net::new();
    let (a, b) = (net.host(1), net.host(2));
    net.limit_rate(2, 20);
    let at = |port: u16| -> std::net::SocketAddr { format!("{}:{port}", Net::addr(2)).parse().unwrap() };
    let echo = in_namespace(&b, move || {
        let s = UdpSocket::bind(at(7301)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut buf = [0u8; 64];
        // Ends after 3 s without a ping.
        while let Ok((n, from)) = s.recv_from(&mut buf) {
            s.send_to(&buf[..n], from).unwrap();
        }
    });
    let shape = LinkShape { delay: Duration::from_millis(15), jitter: Duration::from_millis(5), loss: 0.1, seed: 3 };
    let relay = UdpRelay::start(Some(&b), at(7300), at(7301), shape).unwrap();
    const PINGS: u32 = 300;
    let rtts = in_namespace(&a, move || {
        let s = UdpSocket::bind((Net::addr(1), 0)).unwrap();
        s.connect(at(7300)).unwrap();
        let mut rtts = Vec::new();
        let mut buf = [0u8; 4];
        for i in 0..PINGS {
            let t0 = std::time::Instant::now();
            s.send(&i.to_le_bytes()).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(400))).unwrap();
            // An answer to an earlier ping (late) is skipped.
            while let Ok(4) = s.recv(&mut buf) {
                if u32::from_le_bytes(buf) == i {
                    rtts.push(t0.elapsed());
                    break;
                }
            }
        }
        rtts
    })
    .join()
    .unwrap();
    let dropped = relay.stats().dropped.load(std::sync::atomic::Ordering::Relaxed);
    let min = rtts.iter().min().copied().unwrap_or_default();
    let max = rtts.iter().max().copied().unwrap_or_default();
    println!("{} of {PINGS} round trips, {dropped} datagrams dropped, rtt {min:?}..{max:?}", rtts.len());
    assert!(min >= Duration::from_millis(30), "a round trip took {min:?}");
    let back = rtts.len() as f64 / PINGS as f64;
    assert!((0.7..0.92).contains(&back), "{back} of the round trips came back, for an expected 0.81");
    assert_eq!(dropped as usize + rtts.len(), PINGS as usize, "a missing round trip the relay did not drop");
    drop(relay);
    echo.join().unwrap();

    // 3 MB one way over TCP, timed by the receiver.
    const BYTES: usize = 3 << 20;
    let sink = in_namespace(&b, move || {
        let l = TcpListener::bind(at(7302)).unwrap();
        let (mut c, _) = l.accept().unwrap();
        let t0 = std::time::Instant::now();
        let n = std::io::copy(&mut c, &mut std::io::sink()).unwrap();
        (n, t0.elapsed())
    });
    in_namespace(&a, move || {
        let mut c = (0..100)
            .find_map(|_| {
                TcpStream::connect(at(7302)).ok().or_else(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    None
                })
            })
            .expect("connecting to the sink");
        std::io::Write::write_all(&mut c, &vec![7u8; BYTES]).unwrap();
    })
    .join()
    .unwrap();
    let (n, took) = sink.join().unwrap();
    assert_eq!(n as usize, BYTES);
    let mbit = n as f64 * 8.0 / took.as_secs_f64() / 1e6;
    println!("{n} bytes in {took:?}: {mbit:.1} Mbit/s through a 20 Mbit/s link");
    assert!(mbit < 20.0 * 1.15, "{mbit:.1} Mbit/s through a 20 Mbit/s link");
}

/// Every miner on a slow, lossy link (20 Mbit/s, 10 ms (+3 ms jitter) each
/// way on the data plane, 1% of datagrams lost each way): the run ends,
/// every epoch accounted for, and the loss falls.
#[test]
fn the_swarm_trains_over_slow_lossy_links() {
    let link = LinkShape { delay: Duration::from_millis(10), jitter: Duration::from_millis(3), loss: 0.01, seed: 5 };
    let Some(mut s) = NetSwarm::start_shaped(4, &shape("2"), &[], Wan { rate_mbit: 20, link }) else { return };
    let out = s.wait_done(Duration::from_secs(120));
    let (forwarded, dropped) = s.relayed();
    println!("relays: {forwarded} datagrams forwarded, {dropped} dropped");
    every_epoch_accounted(&out, 2);
    let losses = epoch_losses(&out);
    assert!(losses[1] < losses[0], "the loss falls: {losses:?}");
    assert!(dropped > 0 && forwarded > 1_000, "the data plane went around the relays: {forwarded}, {dropped}");
}

/// Waits until `role` `i`'s log (all its lives) holds `text`.
fn wait_for_line(s: &NetSwarm, role: &str, i: usize, text: &str, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let log = match role {
            "miner" => s.miners[i].as_ref().map(|m| m.output()).unwrap_or_default(),
            _ => s.orchestrator_output(),
        };
        if log.contains(text) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{role} {i} never logged {text:?}:\n{log}\norchestrator:\n{}",
            s.orchestrator_output()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
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
