//! Hosts for tests: Linux network namespaces the test makes itself, joined
//! by veth pairs to a bridge in a hub namespace of their own, addressed from
//! 198.18.0.0/24 (the range set aside for network benchmarks). Nothing of
//! the host's own network is touched; everything is deleted on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

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

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("running ip");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

/// A hub with a bridge, and hosts attached to it.
pub struct Net {
    prefix: String,
    hosts: Vec<String>,
}

impl Net {
    pub fn new() -> Net {
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
}

impl HostProcess {
    pub fn spawn(ns: &str, dir: &Path, program: &Path, args: &[String], env: &[(&str, &str)]) -> HostProcess {
        std::fs::create_dir_all(dir).unwrap();
        let log = dir.join("out.log");
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
        HostProcess { child, log }
    }

    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A binary of the workspace, built beside this test executable
/// (`cargo test --workspace --all-targets` builds them).
pub fn workspace_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?.parent()?;
    Some(dir.join(name)).filter(|p| p.exists())
}
