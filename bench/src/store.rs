//! store: a checkpoint's bytes through the run's bucket (`s3s-fs` on
//! loopback), both ways a run moves them: the orchestrator's S3 client
//! (aws-sdk-s3, multipart past 16 MiB) and a miner's presigned URLs
//! (GrantedStore: a grant from the orchestrator over gRPC, then plain HTTP),
//! against a plain file copy of the same bytes on the same disk (the
//! baseline: what a one-machine run's directory store costs).

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use iota_core::Identity;
use iota_dataplane::granted_store::GrantedStore;
use iota_protocol::client::ControlClient;
use iota_protocol::object_store::ObjectStore;
use iota_protocol::store_keys::upload_prefix;
use iota_tests::s3::S3Server;

#[derive(clap::Args)]
pub struct Args {
    /// Size of the checkpoint (MiB).
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// Times each transfer is repeated (the best is reported).
    #[arg(long, default_value_t = 3)]
    repeats: u32,
}

/// The best of `repeats` timings of `op` (seconds).
async fn best<F, Fut>(repeats: u32, mut op: F) -> Result<f64>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let mut best = f64::INFINITY;
    for _ in 0..repeats.max(1) {
        let t0 = Instant::now();
        op().await?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    Ok(best)
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(run_async(a))
}

async fn run_async(a: Args) -> Result<()> {
    let bytes = a.mib << 20;
    // Incompressible, so nothing on the way can shortcut it.
    let mut rng = iota_core::Rng::new(7);
    let data: Vec<u8> = (0..bytes / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
    let gb = bytes as f64 / 1e9;
    let server = S3Server::start().context("s3s-fs is needed (scripts/test.sh installs it; or set IOTA_S3S_FS)")?;
    println!("store: {} MiB through s3s-fs on 127.0.0.1, best of {}", a.mib, a.repeats);

    // The baseline: the same bytes as a file, copied on the same disk.
    let dir = tempfile::tempdir()?;
    let src = dir.path().join("checkpoint");
    std::fs::write(&src, &data)?;
    let dst = dir.path().join("copy");
    let copy = best(a.repeats, || async {
        let _ = std::fs::remove_file(&dst);
        std::fs::copy(&src, &dst)?;
        Ok(())
    })
    .await?;

    // The orchestrator's client.
    let bucket = Arc::new(server.store("iota-bench", "run-1").await);
    let key = "epoch-000000/bench.safetensors";
    let sdk_put = best(a.repeats, || async { Ok(bucket.put(key, data.clone()).await?) }).await?;
    let sdk_get = best(a.repeats, || async {
        let got = bucket.get(key).await?;
        anyhow::ensure!(got.len() == data.len(), "read back {} bytes", got.len());
        Ok(())
    })
    .await?;

    // A miner's: its own upload key, granted by an orchestrator on the bucket.
    // Four miners wanted, one registered: the run waits, and (merging by
    // parameter server) the miner may write its own upload key.
    let mut cfg = iota_tests::tiny_run(2, 2, 1, 8, iota_core::WireCodec::Int8Row);
    cfg.spec.merge.method = iota_protocol::MergeMethod::ParameterServer;
    let swarm = iota_tests::Swarm::start_on_bucket(&cfg, dir.path().join("state.sqlite"), bucket.clone()).await;
    let id = Arc::new(Identity::from_seed([9; 32]));
    let mut c = ControlClient::connect(swarm.url.clone(), id.clone(), Some(swarm.service.identity().peer_id())).await?;
    c.register("127.0.0.1:40009".into(), 1.0, "cpu".into()).await?;
    let stage = swarm.service.with_state(|o| o.miner(&id.peer_id()).map(|m| m.stage)).context("not registered")?;
    let miner = GrantedStore::new(c)?;
    let own = format!("{}stage-{stage:03}/{}.safetensors", upload_prefix(0), id.peer_id().to_hex());
    let url_put = best(a.repeats, || async { Ok(miner.put(&own, data.clone()).await?) }).await?;
    let url_get = best(a.repeats, || async {
        let got = miner.get(&own).await?;
        anyhow::ensure!(got == data, "the bytes read back differ");
        Ok(())
    })
    .await?;

    println!("\n  {:<44} {:>8} {:>10}", "", "GB/s", "vs copy");
    let row = |name: &str, secs: f64| println!("  {name:<44} {:>8.2} {:>9.2}x", gb / secs, copy / secs);
    row("file copy, same disk (baseline)", copy);
    row("orchestrator S3 client: upload (multipart)", sdk_put);
    row("orchestrator S3 client: download", sdk_get);
    row("miner, presigned PUT (grant + HTTP)", url_put);
    row("miner, presigned GET (grant + HTTP)", url_get);
    Ok(())
}
