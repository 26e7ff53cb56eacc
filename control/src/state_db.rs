//! Durable orchestrator state in SQLite (embedded; one file per run).
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

pub struct StateDb {
    conn: Connection,
}

impl StateDb {
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
        Ok(StateDb { conn })
    }

    /// Saves the state (and the summary of every finished epoch), and
    /// appends the settlements not yet in the ledger, sealed with `id`
    /// (the orchestrator's key), in the same transaction.
    pub fn save(&mut self, o: &Orchestrator, now_ms: u64, id: &Identity) -> Result<()> {
        let json = serde_json::to_string(o)?;
        let mut last = if o.settlements().is_empty() { None } else { self.last_entry()? };
        let tx = self.conn.transaction()?;
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
        let mut q = self
            .conn
            .prepare(&format!("SELECT seq, epoch, prev, hash, signer, signature, body FROM ledger {order}"))?;
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
            let (seq, epoch, prev, hash, signer, signature, body) = row?;
            let bytes = |v: Vec<u8>, what: &str| -> Result<[u8; 32]> {
                v.try_into().map_err(|v: Vec<u8>| anyhow::anyhow!("ledger entry {seq}: {what} has {} bytes", v.len()))
            };
            let signature: [u8; 64] = signature
                .try_into()
                .map_err(|v: Vec<u8>| anyhow::anyhow!("ledger entry {seq}: the signature has {} bytes", v.len()))?;
            out.push(Entry {
                seq: seq as u64,
                epoch: epoch as u64,
                prev: bytes(prev, "the link")?,
                hash: bytes(hash, "the hash")?,
                signer: PeerId(bytes(signer, "the signer")?),
                signature,
                body,
            });
        }
        Ok(out)
    }

    /// The entry the next one links to.
    fn last_entry(&self) -> Result<Option<Entry>> {
        Ok(self.entries("ORDER BY seq DESC LIMIT 1")?.pop())
    }

    /// The last saved state, if any.
    pub fn load(&self) -> Result<Option<Orchestrator>> {
        let json: Option<String> =
            self.conn.query_row("SELECT state FROM snapshot WHERE id = 1", [], |r| r.get(0)).optional()?;
        json.map(|j| serde_json::from_str(&j).context("the saved orchestrator state does not parse")).transpose()
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
            replicas: 1,
            epochs: 1,
            micro_batches_per_epoch: 4,
            batch: 2,
            n_shards: 2,
            max_in_flight: 1,
            route_timeout_ms: 100,
            heartbeat_timeout_ms: 100,
            max_attempts: 2,
            phase_timeout_ms: 100,
            merge: Default::default(),
            miners_per_stage_cap: 0,
            registration_timeout_ms: 30_000,
            bench_after_failures: 2,
            validation: Default::default(),
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
}
