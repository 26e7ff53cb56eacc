//! A throwaway PostgreSQL server for tests (Debian's `postgresql`
//! package): its own data directory and port on loopback, trust
//! authentication, gone when dropped. Root cannot run PostgreSQL, so as
//! root the server runs as the package's `postgres` user.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PgServer {
    child: Child,
    _dir: tempfile::TempDir,
    /// `postgres://iota@127.0.0.1:PORT/postgres`
    pub url: String,
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // SIGTERM: a smart shutdown; then make sure.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory holding `initdb` and `postgres`.
fn bin_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("IOTA_TEST_PG_BIN") {
        return Some(d.into());
    }
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir("/usr/lib/postgresql").ok()?.filter_map(|e| e.ok().map(|e| e.path().join("bin"))).collect();
    dirs.sort();
    dirs.into_iter().rev().find(|d| d.join("initdb").exists() && d.join("postgres").exists())
}

/// The uid and gid of user `name`, from /etc/passwd.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    let line = passwd.lines().find(|l| l.split(':').next() == Some(name))?;
    let f: Vec<&str> = line.split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

/// `program args` as the server's user.
fn as_server_user(run_as: Option<&str>, program: &Path) -> Command {
    match run_as {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--"]).arg(program);
            c
        }
        None => Command::new(program),
    }
}

/// Starts a server, or says why it cannot (the caller skips with it).
pub fn start() -> Result<PgServer, String> {
    let bin = bin_dir().ok_or("no PostgreSQL server binaries (apt-get install postgresql, or set IOTA_TEST_PG_BIN)")?;
    let root = unsafe { libc::geteuid() } == 0;
    let run_as = if root { Some("postgres") } else { None };
    let dir = tempfile::Builder::new().prefix("iota-pg").tempdir().map_err(|e| e.to_string())?;
    let (data, sockets) = (dir.path().join("data"), dir.path().join("sockets"));
    std::fs::create_dir_all(&sockets).map_err(|e| e.to_string())?;
    if let Some(user) = run_as {
        let (uid, gid) = user_ids(user).ok_or("running as root and there is no 'postgres' user to run the server")?;
        for p in [dir.path(), sockets.as_path()] {
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(|e| format!("chown {}: {e}", p.display()))?;
        }
    }
    let init = as_server_user(run_as, &bin.join("initdb"))
        .args(["-A", "trust", "-U", "iota", "--no-sync", "-E", "UTF8", "-D"])
        .arg(&data)
        .stdout(Stdio::null())
        .output()
        .map_err(|e| format!("running initdb: {e}"))?;
    if !init.status.success() {
        return Err(format!("initdb failed: {}", String::from_utf8_lossy(&init.stderr)));
    }
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let child = as_server_user(run_as, &bin.join("postgres"))
        .arg("-D")
        .arg(&data)
        .arg("-k")
        .arg(&sockets)
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting postgres: {e}"))?;
    let server = PgServer { child, _dir: dir, url: format!("postgres://iota@127.0.0.1:{port}/postgres") };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if postgres::Client::connect(&server.url, postgres::NoTls).is_ok() {
            return Ok(server);
        }
        if Instant::now() > deadline {
            return Err("the PostgreSQL server did not accept connections within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
