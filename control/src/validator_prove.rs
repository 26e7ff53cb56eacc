//! A validator's proof of a failed inner step, off its loop: the step
//! object its check failed on and the miner's trace of the step, read from
//! the store (each against its announcement), then `Checker::prove`
//! (PROTOCOL.md, "A failed step as a proof").

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use iota_core::PeerId;
use iota_protocol::SharedStore;
use iota_protocol::store_keys::step_proof_key;
use tracing::{debug, warn};

use crate::validation::check::Checker;
use crate::validation::round::ProveJob;

/// Reads `key`, trying again after 0.1, 0.3 and 0.9 s: a store's
/// transient failure is not the miner's.
pub(crate) async fn read_retrying(store: &SharedStore, key: &str) -> Result<Vec<u8>> {
    let mut wait = Duration::from_millis(100);
    for _ in 0..3 {
        match store.get(key).await {
            Ok(bytes) => return Ok(bytes),
            Err(e) => debug!(key, error = %e, "evidence read failed; retrying"),
        }
        tokio::time::sleep(wait).await;
        wait *= 3;
    }
    Ok(store.get(key).await?)
}

/// Builds the proof of `p` on a blocking thread and hands the result to
/// `done`: the encoded `StepProof`, or why there is none (an object that
/// cannot be read, a trace that does not bind or agrees).
pub(crate) fn spawn_prove(
    p: ProveJob,
    store: &SharedStore,
    checker: &Arc<parking_lot::Mutex<Checker>>,
    done: impl FnOnce(ProveJob, Result<Vec<u8>, String>) + Send + 'static,
) {
    let (store, checker) = (store.clone(), checker.clone());
    tokio::spawn(async move {
        let read = async {
            let step = read_retrying(&store, &p.job.object.key).await?;
            let trace = read_retrying(&store, &p.trace.key).await?;
            anyhow::Ok((step, trace))
        };
        let (step, trace) = match read.await {
            Ok(x) => x,
            Err(e) => {
                warn!(error = %e, "a step object or trace cannot be read; voting without a proof");
                return done(p, Err(format!("its objects could not be read: {e:#}")));
            }
        };
        let p2 = p.clone();
        let result = tokio::task::spawn_blocking(move || checker.lock().prove(&p2, &step, &trace))
            .await
            .unwrap_or_else(|e| Err(format!("the proof failed to run: {e}")));
        done(p, result);
    });
}

/// Stores a step proof under this validator's key for the epoch and miner
/// (`store_keys::step_proof_key`), and gives its hash for the verdict; on
/// a failed write, none (the verdict then goes without a proof).
pub(crate) async fn store_step_proof(
    store: &SharedStore,
    (epoch, me, miner): (u64, PeerId, PeerId),
    proof: Vec<u8>,
) -> Vec<u8> {
    let key = step_proof_key(epoch, &me, &miner);
    let hash = *blake3::hash(&proof).as_bytes();
    match store.put(&key, proof).await {
        Ok(()) => hash.to_vec(),
        Err(e) => {
            warn!(key, error = %e, "storing a step proof failed; the verdict goes without it");
            Vec::new()
        }
    }
}
