//! Durable orchestrator state: SQLite by default (embedded; one file per
//! run), or a PostgreSQL database (`--state-db postgres://...`, several
//! runs side by side, keyed by run id).
//!
//! The orchestrator's whole state is small (miners, the current epoch's
//! micro-batches, counters) and is saved as one JSON snapshot, in a
//! transaction, whenever the epoch or phase changes and at most every few
//! seconds otherwise. A restarted orchestrator loads it: completed epochs
//! are never lost; micro-batches that were in flight time out and are
//! re-issued.

use std::path::Path;

use anyhow::{Context, Result};
use rusqlite::{Connection, OptionalExtension, params};

use iota_core::{Identity, PeerId};

use crate::orchestrator::Orchestrator;
use crate::settlement::ledger::{self, Entry};

/// Where the state lives.
#[derive(Clone, PartialEq, Eq)]
pub enum StateLocation {
    Sqlite(std::path::PathBuf),
    /// A `postgres://` or `postgresql://` connection URL (it may hold a
    /// password: never printed whole, see `redacted`).
    Postgres(String),
}

impl std::fmt::Debug for StateLocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateLocation::Sqlite(p) => write!(f, "Sqlite({})", p.display()),
            StateLocation::Postgres(u) => write!(f, "Postgres({})", redacted(u)),
        }
    }
}

impl StateLocation {
    /// `postgres://...` or `postgresql://...` is a PostgreSQL database;
    /// anything else a SQLite file.
    pub fn parse(s: &str) -> StateLocation {
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            StateLocation::Postgres(s.to_string())
        } else {
            StateLocation::Sqlite(s.into())
        }
    }
}

/// A connection URL with its password (in the user part or the query)
/// replaced by `***`.
pub fn redacted(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let base = match base.split_once("://").and_then(|(scheme, rest)| Some((scheme, rest.rsplit_once('@')?))) {
        Some((scheme, (auth, host))) => {
            let user = auth.split(':').next().unwrap_or_default();
            let auth = if auth.contains(':') { format!("{user}:***") } else { user.to_string() };
            format!("{scheme}://{auth}@{host}")
        }
        None => base.to_string(),
    };
    match query {
        Some(q) => {
            let q: Vec<&str> = q
                .split('&')
                .map(|kv| if kv.to_ascii_lowercase().starts_with("password=") { "password=***" } else { kv })
                .collect();
            format!("{base}?{}", q.join("&"))
        }
        None => base,
    }
}

enum Backend {
    Sqlite(Connection),
    Postgres(pg::PgState),
}

pub struct StateDb {
    backend: Backend,
}

impl StateDb {
    /// Opens the state at `loc` (creating its tables if needed); a
    /// PostgreSQL database holds `run_id`'s rows beside other runs'.
    pub fn open_at(loc: &StateLocation, run_id: u64) -> Result<StateDb> {
        match loc {
            StateLocation::Sqlite(p) => StateDb::open(p),
            StateLocation::Postgres(url) => {
                Ok(StateDb { backend: Backend::Postgres(pg::PgState::connect(url, run_id as i64)?) })
            }
        }
    }

    /// Opens (creating if needed) the state database at `path`.
    pub fn open(path: &Path) -> Result<StateDb> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let conn = Connection::open(path).with_context(|| format!("opening state database {}", path.display()))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS snapshot (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                run_id INTEGER NOT NULL,
                epoch INTEGER NOT NULL,
                saved_ms INTEGER NOT NULL,
                state TEXT NOT NULL
            );
            CREATE TABLE IF NOT EXISTS epochs (
                run_id INTEGER NOT NULL,
                epoch INTEGER NOT NULL,
                mean_loss REAL,
                completed INTEGER NOT NULL,
                dropped INTEGER NOT NULL,
                PRIMARY KEY (run_id, epoch)
            );
            CREATE TABLE IF NOT EXISTS ledger (
                seq INTEGER PRIMARY KEY,
                epoch INTEGER NOT NULL,
                prev BLOB NOT NULL,
                hash BLOB NOT NULL,
                signer BLOB NOT NULL,
                signature BLOB NOT NULL,
                body TEXT NOT NULL
            );",
        )?;
        Ok(StateDb { backend: Backend::Sqlite(conn) })
    }

    /// Saves the state (and the summary of every finished epoch), and
    /// appends the settlements not yet in the ledger, sealed with `id`
    /// (the orchestrator's key), in the same transaction.
    pub fn save(&mut self, o: &Orchestrator, now_ms: u64, id: &Identity) -> Result<()> {
        let json = serde_json::to_string(o)?;
        let last = if o.settlements().is_empty() { None } else { self.last_entry()? };
        let conn = match &mut self.backend {
            Backend::Sqlite(c) => c,
            Backend::Postgres(p) => return p.save(o, json, now_ms, last, id),
        };
        let mut last = last;
        let tx = conn.transaction()?;
        let written = last.as_ref().map(|l| l.epoch);
        for s in o.settlements().iter().filter(|s| written.is_none_or(|w| s.epoch > w)) {
            let e = ledger::seal(last.as_ref(), s, id);
            tx.execute(
                "INSERT INTO ledger (seq, epoch, prev, hash, signer, signature, body) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    e.seq as i64,
                    e.epoch as i64,
                    &e.prev[..],
                    &e.hash[..],
                    &e.signer.0[..],
                    &e.signature[..],
                    e.body
                ],
            )?;
            last = Some(e);
        }
        tx.execute(
            "INSERT INTO snapshot (id, run_id, epoch, saved_ms, state) VALUES (1, ?1, ?2, ?3, ?4)
             ON CONFLICT(id) DO UPDATE SET run_id = ?1, epoch = ?2, saved_ms = ?3, state = ?4",
            params![o.spec().run_id as i64, o.epoch() as i64, now_ms as i64, json],
        )?;
        for e in o.history() {
            tx.execute(
                "INSERT OR IGNORE INTO epochs (run_id, epoch, mean_loss, completed, dropped) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![o.spec().run_id as i64, e.epoch as i64, e.mean_loss as f64, e.completed as i64, e.dropped as i64],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Every ledger entry, in sequence.
    pub fn ledger(&self) -> Result<Vec<Entry>> {
        self.entries("ORDER BY seq")
    }

    fn entries(&self, order: &str) -> Result<Vec<Entry>> {
        let conn = match &self.backend {
            Backend::Sqlite(c) => c,
            Backend::Postgres(p) => return p.entries(order),
        };
        let mut q =
            conn.prepare(&format!("SELECT seq, epoch, prev, hash, signer, signature, body FROM ledger {order}"))?;
        let rows = q.query_map([], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                r.get::<_, Vec<u8>>(3)?,
                r.get::<_, Vec<u8>>(4)?,
                r.get::<_, Vec<u8>>(5)?,
                r.get::<_, String>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(entry_from_row(row?)?);
        }
        Ok(out)
    }

    /// The entry the next one links to.
    fn last_entry(&self) -> Result<Option<Entry>> {
        Ok(self.entries("ORDER BY seq DESC LIMIT 1")?.pop())
    }

    /// The last saved state, if any.
    pub fn load(&self) -> Result<Option<Orchestrator>> {
        let json: Option<String> = match &self.backend {
            Backend::Sqlite(c) => {
                c.query_row("SELECT state FROM snapshot WHERE id = 1", [], |r| r.get(0)).optional()?
            }
            Backend::Postgres(p) => p.load()?,
        };
        json.map(|j| serde_json::from_str(&j).context("the saved orchestrator state does not parse")).transpose()
    }
}

/// A ledger row: (seq, epoch, prev, hash, signer, signature, body).
type LedgerRow = (i64, i64, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>, String);

/// A ledger entry from its row, its fixed-size fields checked.
fn entry_from_row((seq, epoch, prev, hash, signer, signature, body): LedgerRow) -> Result<Entry> {
    let bytes = |v: Vec<u8>, what: &str| -> Result<[u8; 32]> {
        v.try_into().map_err(|v: Vec<u8>| anyhow::anyhow!("ledger entry {seq}: {what} has {} bytes", v.len()))
    };
    let signature: [u8; 64] = signature
        .try_into()
        .map_err(|v: Vec<u8>| anyhow::anyhow!("ledger entry {seq}: the signature has {} bytes", v.len()))?;
    Ok(Entry {
        seq: seq as u64,
        epoch: epoch as u64,
        prev: bytes(prev, "the link")?,
        hash: bytes(hash, "the hash")?,
        signer: PeerId(bytes(signer, "the signer")?),
        signature,
        body,
    })
}

/// The PostgreSQL backend: one connection owned by its own thread (the
/// `postgres` client runs its own runtime, which must not be nested in the
/// service's), driven by jobs sent from whichever thread saves.
mod pg {
    use super::*;

    type Job = Box<dyn FnOnce(&mut postgres::Client) + Send>;

    pub struct PgState {
        jobs: std::sync::mpsc::Sender<Job>,
        run_id: i64,
    }

    const SCHEMA: &str = "
        CREATE TABLE IF NOT EXISTS iota_snapshot (
            run_id BIGINT PRIMARY KEY,
            epoch BIGINT NOT NULL,
            saved_ms BIGINT NOT NULL,
            state TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS iota_epochs (
            run_id BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            mean_loss DOUBLE PRECISION,
            completed BIGINT NOT NULL,
            dropped BIGINT NOT NULL,
            PRIMARY KEY (run_id, epoch)
        );
        CREATE TABLE IF NOT EXISTS iota_ledger (
            run_id BIGINT NOT NULL,
            seq BIGINT NOT NULL,
            epoch BIGINT NOT NULL,
            prev BYTEA NOT NULL,
            hash BYTEA NOT NULL,
            signer BYTEA NOT NULL,
            signature BYTEA NOT NULL,
            body TEXT NOT NULL,
            PRIMARY KEY (run_id, seq)
        );";

    impl PgState {
        /// Connects to `url` and makes the tables (if missing).
        pub fn connect(url: &str, run_id: i64) -> Result<PgState> {
            let shown = redacted(url);
            let config: postgres::Config =
                url.parse().map_err(|e| anyhow::anyhow!("the state database URL {shown} does not parse: {e}"))?;
            let (jobs, rx) = std::sync::mpsc::channel::<Job>();
            let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<()>>(1);
            std::thread::Builder::new().name("iota-state-pg".into()).spawn(move || {
                let mut client = match config.connect(postgres::NoTls) {
                    Ok(mut c) => match c.batch_execute(SCHEMA) {
                        Ok(()) => {
                            let _ = ready_tx.send(Ok(()));
                            c
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(anyhow::anyhow!("creating the state tables: {e}")));
                            return;
                        }
                    },
                    Err(e) => {
                        let _ = ready_tx.send(Err(anyhow::anyhow!("{e}")));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut client);
                }
            })?;
            ready_rx
                .recv()
                .map_err(|_| anyhow::anyhow!("the PostgreSQL connection thread ended"))?
                .with_context(|| format!("connecting to the state database {shown}"))?;
            Ok(PgState { jobs, run_id })
        }

        /// Runs `f` on the connection's thread and waits for its answer.
        fn call<R: Send + 'static>(
            &self,
            f: impl FnOnce(&mut postgres::Client) -> Result<R> + Send + 'static,
        ) -> Result<R> {
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            self.jobs
                .send(Box::new(move |c| {
                    let _ = tx.send(f(c));
                }))
                .map_err(|_| anyhow::anyhow!("the PostgreSQL connection thread ended"))?;
            rx.recv().map_err(|_| anyhow::anyhow!("the PostgreSQL connection thread ended"))?
        }

        pub fn save(
            &self,
            o: &Orchestrator,
            json: String,
            now_ms: u64,
            mut last: Option<Entry>,
            id: &Identity,
        ) -> Result<()> {
            let run = self.run_id;
            let written = last.as_ref().map(|l| l.epoch);
            let mut sealed = Vec::new();
            for s in o.settlements().iter().filter(|s| written.is_none_or(|w| s.epoch > w)) {
                let e = ledger::seal(last.as_ref(), s, id);
                sealed.push(e.clone());
                last = Some(e);
            }
            let epochs: Vec<(i64, f64, i64, i64)> = o
                .history()
                .iter()
                .map(|e| (e.epoch as i64, e.mean_loss as f64, e.completed as i64, e.dropped as i64))
                .collect();
            let epoch = o.epoch() as i64;
            self.call(move |c| {
                let mut tx = c.transaction()?;
                for e in &sealed {
                    tx.execute(
                        "INSERT INTO iota_ledger (run_id, seq, epoch, prev, hash, signer, signature, body)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                        &[
                            &run,
                            &(e.seq as i64),
                            &(e.epoch as i64),
                            &&e.prev[..],
                            &&e.hash[..],
                            &&e.signer.0[..],
                            &&e.signature[..],
                            &e.body,
                        ],
                    )?;
                }
                tx.execute(
                    "INSERT INTO iota_snapshot (run_id, epoch, saved_ms, state) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (run_id) DO UPDATE SET epoch = $2, saved_ms = $3, state = $4",
                    &[&run, &epoch, &(now_ms as i64), &json],
                )?;
                for (e, loss, completed, dropped) in &epochs {
                    tx.execute(
                        "INSERT INTO iota_epochs (run_id, epoch, mean_loss, completed, dropped)
                         VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                        &[&run, e, loss, completed, dropped],
                    )?;
                }
                tx.commit()?;
                Ok(())
            })
        }

        pub fn entries(&self, order: &str) -> Result<Vec<Entry>> {
            let run = self.run_id;
            let q = format!(
                "SELECT seq, epoch, prev, hash, signer, signature, body FROM iota_ledger WHERE run_id = $1 {order}"
            );
            let rows: Vec<LedgerRow> = self.call(move |c| {
                Ok(c.query(&q, &[&run])?
                    .iter()
                    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6)))
                    .collect())
            })?;
            rows.into_iter().map(entry_from_row).collect()
        }

        pub fn load(&self) -> Result<Option<String>> {
            let run = self.run_id;
            self.call(move |c| {
                Ok(c.query_opt("SELECT state FROM iota_snapshot WHERE run_id = $1", &[&run])?.map(|r| r.get(0)))
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iota_protocol::RunSpec;

    #[test]
    fn save_then_load() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("run/state.sqlite");
        let spec = RunSpec {
            run_id: 3,
            stages: 2,
            micro_batches_per_epoch: 4,
            batch: 2,
            n_shards: 2,
            route_timeout_ms: 100,
            heartbeat_timeout_ms: 100,
            max_attempts: 2,
            phase_timeout_ms: 100,
            merge: Default::default(),
            ..RunSpec::default()
        };
        let o = Orchestrator::new(spec.clone()).unwrap();
        {
            let mut s = StateDb::open(&p).unwrap();
            assert!(s.load().unwrap().is_none());
            let id = Identity::from_seed([1; 32]);
            s.save(&o, 5, &id).unwrap();
            s.save(&o, 6, &id).unwrap();
        }
        let s = StateDb::open(&p).unwrap();
        let back = s.load().unwrap().unwrap();
        assert_eq!(back.spec(), &spec);
    }

    #[test]
    fn locations_parse_and_never_show_a_password() {
        assert_eq!(StateLocation::parse("run/state.sqlite"), StateLocation::Sqlite("run/state.sqlite".into()));
        let url = "postgres://iota:s3cret@db.example:5432/runs?sslmode=disable";
        assert_eq!(StateLocation::parse(url), StateLocation::Postgres(url.into()));
        assert!(matches!(StateLocation::parse("postgresql://h/db"), StateLocation::Postgres(_)));
        let shown = format!("{:?}", StateLocation::parse(url));
        assert!(!shown.contains("s3cret") && shown.contains("iota:***@db.example:5432/runs"), "{shown}");
        assert_eq!(redacted("postgres://h/db?user=a&password=p&x=1"), "postgres://h/db?user=a&password=***&x=1");
        assert_eq!(redacted("postgres://u@h/db"), "postgres://u@h/db");
    }

    #[test]
    fn an_unreachable_postgres_is_a_clear_error_without_the_password() {
        // Port 1 on loopback: nothing listens there.
        let url = "postgres://iota:s3cret@127.0.0.1:1/runs?connect_timeout=2";
        let e = StateDb::open_at(&StateLocation::parse(url), 7).err().expect("no server there");
        let text = format!("{e:#}");
        assert!(text.contains("connecting to the state database") && !text.contains("s3cret"), "{text}");
    }
}
