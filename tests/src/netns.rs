//! Hosts for tests: Linux network namespaces the test makes itself, joined
//! by veth pairs to a bridge in a hub namespace of their own, addressed from
//! 198.18.0.0/24 (the range set aside for network benchmarks). Nothing of
//! the host's own network is touched; everything is deleted on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::udp_relay::{LinkShape, UdpRelay};

const SUBNET: &str = "198.18.0";

/// Why namespaces cannot be made here, if they cannot (the caller skips).
pub fn unavailable() -> Option<String> {
    let probe = format!("iota-probe-{}", std::process::id());
    match Command::new("ip").args(["netns", "add", &probe]).output() {
        Err(e) => Some(format!("`ip` (iproute2) cannot run: {e}")),
        Ok(o) if !o.status.success() => {
            Some(format!("cannot make a network namespace: {}", String::from_utf8_lossy(&o.stderr).trim()))
        }
        Ok(_) => {
            let _ = Command::new("ip").args(["netns", "del", &probe]).status();
            None
        }
    }
}

/// Runs `f` on a thread of its own inside namespace `ns` (sockets it makes
/// belong there).
pub fn in_namespace<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        crate::udp_relay::enter_namespace(&ns).unwrap_or_else(|e| panic!("entering {ns}: {e}"));
        f()
    })
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

/// A hub with a bridge, and hosts attached to it.
pub struct Net {
    prefix: String,
    hosts: Vec<String>,
}

/// Deletes the namespaces of earlier test processes that died without
/// dropping their `Net` (killed, or aborted): named `iota<N>-*` where no
/// live process has a pid of N modulo 100,000. Each was a network stack of
/// its own, so they never clash with a new run; they only pile up.
fn delete_dead_runs_namespaces() {
    let Ok(o) = Command::new("ip").args(["netns", "list"]).output() else { return };
    let live: std::collections::HashSet<u32> = std::fs::read_dir("/proc")
        .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok()).map(|p| p % 100_000).collect())
        .unwrap_or_default();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else { continue };
        let Some((owner, _)) = name.strip_prefix("iota").and_then(|r| r.split_once('-')) else { continue };
        if owner.parse::<u32>().is_ok_and(|pid| !live.contains(&pid)) {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

impl Net {
    pub fn new() -> Net {
        delete_dead_runs_namespaces();
        let prefix = format!("iota{}", std::process::id() % 100_000);
        let hub = format!("{prefix}-hub");
        ip(&["netns", "add", &hub]);
        let net = Net { prefix, hosts: vec![hub.clone()] };
        ip(&["-n", &hub, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &hub, "link", "set", "br0", "up"]);
        net
    }

    /// Makes host number `n` (1..=200): its own namespace, one veth to the
    /// hub, address 198.18.0.`n`. Returns the namespace's name.
    pub fn host(&mut self, n: u8) -> String {
        assert!((1..=200).contains(&n));
        let hub = format!("{}-hub", self.prefix);
        let ns = format!("{}-h{n}", self.prefix);
        ip(&["netns", "add", &ns]);
        self.hosts.push(ns.clone());
        let (a, b) = (format!("vh{n}"), format!("vb{n}"));
        ip(&["-n", &ns, "link", "add", &a, "type", "veth", "peer", "name", &b, "netns", &hub]);
        ip(&["-n", &hub, "link", "set", &b, "master", "br0", "up"]);
        ip(&["-n", &ns, "addr", "add", &format!("{SUBNET}.{n}/24"), "dev", &a]);
        ip(&["-n", &ns, "link", "set", &a, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ns
    }

    pub fn addr(n: u8) -> String {
        format!("{SUBNET}.{n}")
    }

    /// Limits host `n`'s link to `mbit` Mbit/s each way: a token bucket
    /// (`tc tbf`) on both ends of its veth, queueing at most 50 ms.
    pub fn limit_rate(&self, n: u8, mbit: u32) {
        let burst = format!("{}b", (mbit as u64 * 1250).max(32 * 1024));
        let rate = format!("{mbit}mbit");
        let tbf = ["root", "tbf", "rate", &rate, "burst", &burst, "latency", "50ms"];
        let host = format!("{}-h{n}", self.prefix);
        let hub = format!("{}-hub", self.prefix);
        for (ns, dev) in [(host, format!("vh{n}")), (hub, format!("vb{n}"))] {
            let args: Vec<&str> = ["-n", &ns, "qdisc", "add", "dev", &dev].into_iter().chain(tbf).collect();
            let o = Command::new("tc").args(&args).output().expect("running tc");
            assert!(o.status.success(), "tc {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
        }
    }
}

/// A wide-area link for every miner: a rate on its veth, and delay,
/// jitter and loss on its data-plane traffic (a relay in front of its QUIC
/// port). The control plane and the bucket (TCP) get the rate only.
#[derive(Clone, Copy, Debug)]
pub struct Wan {
    pub rate_mbit: u32,
    pub link: LinkShape,
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.hosts.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// A process in a namespace, in its own directory, logging to a file there;
/// killed when dropped.
pub struct HostProcess {
    pub child: Child,
    pub log: PathBuf,
    /// How many times this role was started before (its log is numbered).
    pub generation: u32,
}

impl HostProcess {
    pub fn spawn(ns: &str, dir: &Path, program: &Path, args: &[String], env: &[(&str, &str)]) -> HostProcess {
        Self::spawn_numbered(ns, dir, program, args, env, 0)
    }

    /// Like `spawn`, logging to the `generation`-th log of `dir`.
    pub fn spawn_numbered(
        ns: &str,
        dir: &Path,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        generation: u32,
    ) -> HostProcess {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join(log_name(generation));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(program)
            .args(args)
            .current_dir(dir)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        HostProcess { child, log, generation }
    }

    /// Its log so far, without terminal colour codes.
    pub fn output(&self) -> String {
        strip_ansi(&std::fs::read_to_string(&self.log).unwrap_or_default())
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A binary of the workspace, built beside this executable (a binary such
/// as `iota-bench`) or one folder up (a test in `deps/`;
/// `cargo test --workspace --all-targets` builds them).
pub fn workspace_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join(name), dir.parent()?.join(name)].into_iter().find(|p| p.exists())
}

/// A whole swarm of separate hosts: s3s-fs (host 10), the orchestrator
/// (host 11, TLS, `--admit` with the miners' keys, `--bucket`) and miners
/// (hosts 20, 21, ...), each in its own namespace and directory. Processes
/// can be killed (SIGKILL) and started again with the same identity and
/// directory, as an operator's restart would.
pub struct NetSwarm {
    pub net: Net,
    pub root: tempfile::TempDir,
    control: PathBuf,
    miner_bin: PathBuf,
    orch_ns: String,
    miner_ns: Vec<String>,
    orch_args: Vec<String>,
    /// Flags every miner gets besides its identity and addresses.
    miner_flags: Vec<String>,
    orch_key: String,
    pub orchestrator: Option<HostProcess>,
    pub miners: Vec<Option<HostProcess>>,
    s3: Option<HostProcess>,
    s3_ns: String,
    /// None: no S3 server; the orchestrator serves the run's store itself.
    s3_bin: Option<PathBuf>,
    /// One per miner when the links are shaped (each in its miner's host).
    relays: Vec<UdpRelay>,
}

const ACCESS_KEY: &str = "netns-access";
const BUCKET: &str = "s3://iota-netns/run-1";
const SECRET_KEY: &str = "netns-secret-key";

impl NetSwarm {
    /// None (after printing why) where namespaces, the binaries or s3s-fs
    /// are missing. `run_flags`: the run's shape, passed to the orchestrator.
    pub fn start(miners: u8, run_flags: &[&str]) -> Option<NetSwarm> {
        Self::start_with(miners, run_flags, &[])
    }

    /// Like `start`, every miner run with `miner_flags` too.
    pub fn start_with(miners: u8, run_flags: &[&str], miner_flags: &[&str]) -> Option<NetSwarm> {
        Self::start_inner(miners, run_flags, miner_flags, None, None, false)
    }

    /// A swarm with no S3 server at all: the orchestrator serves the run's
    /// store itself and is given the corpus (`corpus`, a text file on its
    /// host only) with `--data`; miners join by the token it prints.
    pub fn start_served(miners: u8, run_flags: &[&str], corpus: &str) -> Option<NetSwarm> {
        Self::start_inner(miners, run_flags, &[], Some(corpus), None, true)
    }

    /// Like `start_with`, every miner's link shaped as `wan` says.
    pub fn start_shaped(miners: u8, run_flags: &[&str], miner_flags: &[&str], wan: Wan) -> Option<NetSwarm> {
        Self::start_inner(miners, run_flags, miner_flags, None, Some(wan), false)
    }

    /// Like `start`, the run training on `corpus` (byte-tokenized text),
    /// which `iota-control data prepare` writes into the bucket from the
    /// orchestrator's host first (`--prepared-data`): miners hold no copy.
    pub fn start_prepared(miners: u8, run_flags: &[&str], corpus: &str) -> Option<NetSwarm> {
        Self::start_inner(miners, run_flags, &[], Some(corpus), None, false)
    }

    fn start_inner(
        miners: u8,
        run_flags: &[&str],
        miner_flags: &[&str],
        corpus: Option<&str>,
        wan: Option<Wan>,
        served: bool,
    ) -> Option<NetSwarm> {
        if let Some(why) = unavailable() {
            println!("skipped: {why}");
            return None;
        }
        let (Some(control), Some(miner_bin)) = (workspace_binary("iota-control"), workspace_binary("iota-miner"))
        else {
            println!("skipped: iota-control and iota-miner are not built (cargo test --workspace --all-targets)");
            return None;
        };
        let s3s = crate::s3::s3s_fs_binary();
        if s3s.is_none() && !served {
            println!("skipped: s3s-fs not found (scripts/test.sh installs it)");
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        let mut net = Net::new();
        let (s3_ns, orch_ns) = (net.host(10), net.host(11));
        let miner_ns: Vec<String> = (0..miners).map(|i| net.host(20 + i)).collect();
        // A shaped miner listens on port 7201 behind a relay on 7200, the
        // port it advertises.
        let mut relays = Vec::new();
        for (i, ns) in miner_ns.iter().enumerate().filter(|_| wan.is_some()) {
            let wan = wan.unwrap();
            let n = 20 + i as u8;
            net.limit_rate(n, wan.rate_mbit);
            let at = |port: u16| format!("{}:{port}", Net::addr(n)).parse().unwrap();
            let link = LinkShape { seed: wan.link.seed.wrapping_add(i as u64), ..wan.link };
            relays.push(UdpRelay::start(Some(ns), at(7200), at(7201), link).expect("starting a link's relay"));
        }
        std::fs::create_dir_all(root.path().join("s3/data")).unwrap();
        // Identities made ahead, each in its own host's directory.
        let orch_dir = root.path().join("orchestrator");
        let orch_key =
            iota_dataplane::identity_file::load_or_create(&orch_dir.join("run/keys/orchestrator.key")).unwrap();
        let mut admitted = String::from("# the miners of this test\n");
        for i in 0..miners {
            let dir = root.path().join(format!("miner-{i}"));
            let id = iota_dataplane::identity_file::load_or_create(&dir.join("miner.key")).unwrap();
            admitted.push_str(&format!("{}\n", id.peer_id().to_hex()));
        }
        std::fs::write(orch_dir.join("admitted.txt"), admitted).unwrap();
        // Listening on every address, as on a real host, and telling miners
        // the one they dial (the join token carries it).
        let advertise = format!("{}:7100", Net::addr(11));
        let endpoint = format!("http://{}:9000", Net::addr(10));
        let store_flags = if served {
            // The corpus is a file on the orchestrator's host only.
            std::fs::write(orch_dir.join("corpus.txt"), corpus.unwrap_or_default()).unwrap();
            vec!["--store-listen", "0.0.0.0:7101", "--data", "corpus.txt"]
        } else {
            let mut f = vec!["--bucket", BUCKET, "--s3-endpoint", &endpoint, "--s3-path-style"];
            f.extend(corpus.map(|_| "--prepared-data"));
            f
        };
        let orch_args = ["orchestrator"]
            .into_iter()
            .chain(run_flags.iter().copied())
            .chain(["--listen", "0.0.0.0:7100", "--advertise", &advertise])
            .chain(["--run-dir", "run", "--admit", "admitted.txt"])
            .chain(store_flags)
            .map(String::from)
            .collect();
        let mut s = NetSwarm {
            net,
            root,
            control,
            miner_bin,
            orch_ns,
            miner_ns,
            orch_args,
            miner_flags: miner_flags.iter().map(|f| f.to_string()).collect(),
            orch_key: orch_key.peer_id().to_hex(),
            orchestrator: None,
            miners: (0..miners).map(|_| None).collect(),
            s3: None,
            s3_ns,
            s3_bin: s3s,
            relays,
        };
        if !served {
            s.start_store();
            if let Some(text) = corpus {
                s.prepare_data(text, &endpoint);
            }
        }
        s.start_orchestrator();
        for i in 0..miners as usize {
            s.start_miner(i);
        }
        Some(s)
    }

    pub fn orchestrator_dir(&self) -> PathBuf {
        self.root.path().join("orchestrator")
    }

    pub fn miner_dir(&self, i: usize) -> PathBuf {
        self.root.path().join(format!("miner-{i}"))
    }

    pub fn s3_data(&self) -> PathBuf {
        self.root.path().join("s3/data")
    }

    /// Runs `iota-control data prepare` on the orchestrator's host, writing
    /// `text` into the bucket (retried while the S3 server starts).
    fn prepare_data(&self, text: &str, endpoint: &str) {
        let dir = self.orchestrator_dir();
        std::fs::write(dir.join("corpus.txt"), text).unwrap();
        let args = ["data", "prepare", "--input", "corpus.txt", "--out", BUCKET, "--tokenizer", "byte"]
            .into_iter()
            .chain(["--s3-endpoint", endpoint, "--s3-path-style"]);
        let mut last = String::new();
        for _ in 0..50 {
            let o = Command::new("ip")
                .args(["netns", "exec", &self.orch_ns])
                .arg(&self.control)
                .args(args.clone())
                .current_dir(&dir)
                .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                .output()
                .unwrap();
            if o.status.success() {
                return;
            }
            last = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        panic!("data prepare failed:\n{last}");
    }

    /// Starts (or starts again) the S3 server on the bucket's directory.
    pub fn start_store(&mut self) {
        let Some(bin) = self.s3_bin.clone() else { return };
        let args = ["--host", &Net::addr(10), "--port", "9000"]
            .into_iter()
            .chain(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY, "data"])
            .map(String::from)
            .collect::<Vec<_>>();
        let n = self.s3.take().map(|p| p.generation + 1).unwrap_or(0);
        let dir = self.root.path().join("s3");
        let mut p = HostProcess::spawn_numbered(&self.s3_ns, &dir, &bin, &args, &[], n);
        p.generation = n;
        self.s3 = Some(p);
    }

    /// Stops the S3 server (SIGKILL): the bucket refuses every connection
    /// until `start_store`.
    pub fn kill_store(&mut self) {
        if let Some(p) = self.s3.as_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Starts (or starts again) the orchestrator; its log goes on after
    /// the last one's.
    pub fn start_orchestrator(&mut self) {
        let env = [("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY)];
        let n = self.orchestrator.take().map(|p| p.generation + 1).unwrap_or(0);
        let mut p = HostProcess::spawn_numbered(
            &self.orch_ns,
            &self.orchestrator_dir(),
            &self.control,
            &self.orch_args,
            &env,
            n,
        );
        p.generation = n;
        self.orchestrator = Some(p);
    }

    /// The join token the orchestrator printed (its URL and key in one),
    /// checked to carry the key made for it.
    fn join_token(&self) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let out = self.orchestrator_output();
            if let Some(t) = out.lines().rev().find_map(|l| l.strip_prefix("join token: ")) {
                assert_eq!(t, format!("iota://{}@{}:7100", self.orch_key, Net::addr(11)));
                return t.to_string();
            }
            assert!(std::time::Instant::now() < deadline, "the orchestrator printed no join token:\n{out}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    pub fn start_miner(&mut self, i: usize) {
        let token = self.join_token();
        let host = Net::addr(20 + i as u8);
        let (listen, advertise) = (format!("{host}:7201"), format!("{host}:7200"));
        let addrs = if self.relays.is_empty() {
            vec!["--listen", &advertise]
        } else {
            vec!["--listen", &listen, "--advertise", &advertise]
        };
        let args: Vec<String> = ["run", "--join", &token, "--identity", "miner.key"]
            .into_iter()
            .chain(addrs)
            .map(String::from)
            .chain(self.miner_flags.iter().cloned())
            .collect();
        let n = self.miners[i].take().map(|p| p.generation + 1).unwrap_or(0);
        let mut p = HostProcess::spawn_numbered(&self.miner_ns[i], &self.miner_dir(i), &self.miner_bin, &args, &[], n);
        p.generation = n;
        self.miners[i] = Some(p);
    }

    /// SIGKILL, as a crash: nothing is flushed or said goodbye.
    pub fn kill_orchestrator(&mut self) {
        if let Some(p) = self.orchestrator.as_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    pub fn kill_miner(&mut self, i: usize) {
        if let Some(p) = self.miners[i].as_mut() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    /// Datagrams the miners' link relays forwarded and dropped, in all.
    pub fn relayed(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        self.relays
            .iter()
            .fold((0, 0), |(f, d), r| (f + r.stats().forwarded.load(Relaxed), d + r.stats().dropped.load(Relaxed)))
    }

    /// Takes host `n`'s link down (`up` false) or up again.
    pub fn set_link(&self, i: usize, up: bool) {
        let ns = &self.miner_ns[i];
        ip(&["-n", ns, "link", "set", &format!("vh{}", 20 + i), if up { "up" } else { "down" }]);
    }

    /// Everything the orchestrator has logged so far (all its lives).
    pub fn orchestrator_output(&self) -> String {
        let dir = self.orchestrator_dir();
        (0..=self.orchestrator.as_ref().map_or(0, |p| p.generation))
            .map(|g| strip_ansi(&std::fs::read_to_string(dir.join(log_name(g))).unwrap_or_default()))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Whether the orchestrator is still running (the run has not ended).
    pub fn orchestrator_running(&mut self) -> bool {
        self.orchestrator.as_mut().is_some_and(|p| p.child.try_wait().ok().flatten().is_none())
    }

    /// Waits for the orchestrator to end the run; its whole output. Panics
    /// with every log after `limit`.
    pub fn wait_done(&mut self, limit: std::time::Duration) -> String {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let p = self.orchestrator.as_mut().expect("an orchestrator is running");
            if let Some(st) = p.child.try_wait().unwrap() {
                let out = self.orchestrator_output();
                assert!(st.success(), "the orchestrator failed: {out}");
                return out;
            }
            if std::time::Instant::now() > deadline {
                let miners: Vec<String> = self.miners.iter().flatten().map(|m| m.output()).collect();
                panic!(
                    "the run did not end within {limit:?}\norchestrator:\n{}\nminers:\n{}",
                    self.orchestrator_output(),
                    miners.join("\n---\n")
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// `s` without ANSI escape sequences (ESC '[' ... final letter).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn log_name(generation: u32) -> String {
    if generation == 0 { "out.log".into() } else { format!("out.{generation}.log") }
}

/// The epoch losses an orchestrator printed at the end of its run.
pub fn epoch_losses(out: &str) -> Vec<f32> {
    out.lines()
        .filter_map(|l| l.strip_prefix("epoch ")?.split_once(": mean loss ")?.1.split(',').next()?.parse().ok())
        .collect()
}
