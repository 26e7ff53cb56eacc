//! control: what the orchestrator sustains on one core. Registrations and
//! signed heartbeats are fed straight into the gRPC service (the server side
//! of each RPC: envelope checks, strict Ed25519, field checks, the state
//! machine, the signed reply; no network), on a current-thread runtime.
//! Baseline from the same run: one strict Ed25519 verification, the floor of
//! any signed request. Memory: bytes the orchestrator keeps per registered
//! miner at 100 / 1,000 / 10,000 miners, counted by the allocator.

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use iota_control::orchestrator::Orchestrator;
use iota_control::service::OrchestratorService;
use iota_core::{Identity, PeerId};
use iota_model::alloc::live_on_this_thread;
use iota_protocol::auth::{Audience, AuthPolicy, now_ms, sign};
use iota_protocol::client::{HEARTBEAT, REGISTER};
use iota_protocol::pb::orchestrator_server::Orchestrator as _;
use iota_protocol::{RunSpec, pb};

use crate::timing::process_cpu_time;

#[derive(clap::Args)]
pub struct Args {
    /// Miners to register (memory is also reported at 100 and 1,000).
    #[arg(long, default_value_t = 10_000)]
    miners: u32,
    /// Signed heartbeats to time.
    #[arg(long, default_value_t = 20_000)]
    heartbeats: u32,
}

fn spec(miners: u32) -> RunSpec {
    RunSpec {
        run_id: 1,
        stages: 4,
        replicas: 2,
        micro_batches_per_epoch: 4,
        batch: 2,
        n_shards: 2,
        route_timeout_ms: 60_000,
        heartbeat_timeout_ms: 600_000,
        phase_timeout_ms: 60_000,
        merge: Default::default(),
        miners_per_stage_cap: miners.div_ceil(4).max(2),
        registration_timeout_ms: 600_000,
        ..RunSpec::default()
    }
}

fn service(miners: u32) -> Result<(OrchestratorService, Audience)> {
    let id = Arc::new(Identity::from_seed([1; 32]));
    let aud = Audience { run_id: 1, orchestrator: id.peer_id() };
    let svc = OrchestratorService::new(
        Orchestrator::new(spec(miners)).map_err(anyhow::Error::msg)?,
        None,
        "{}".into(),
        AuthPolicy { rate_per_s: 1e9, burst: 1e9, ..AuthPolicy::default() },
        id,
    )?;
    Ok((svc, aud))
}

fn miner(i: u32) -> Identity {
    let mut seed = [9u8; 32];
    seed[..4].copy_from_slice(&i.to_le_bytes());
    Identity::from_seed(seed)
}

fn register_body(i: u32) -> pb::RegisterRequest {
    pb::RegisterRequest {
        role: pb::Role::Miner as i32,
        data_addr: format!("198.{}.{}.{}:4000", 18 + ((i >> 16) & 1), (i >> 8) & 255, i & 255),
        tokens_per_s: 1000.0,
        device: "cuda:0 (bf16 gemms)".into(),
        ..Default::default()
    }
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        // Baseline: strict verification of a registration envelope.
        let (_, aud) = service(a.miners)?;
        let who = miner(0);
        let env = sign(&who, &aud, REGISTER, &register_body(0), now_ms());
        let msg = iota_protocol::auth::signing_bytes(&aud, REGISTER, env.timestamp_ms, &env.nonce, &env.body);
        let sig: [u8; 64] = env.signature.as_slice().try_into()?;
        let n = 5_000;
        let t0 = Instant::now();
        for _ in 0..n {
            assert!(std::hint::black_box(PeerId(who.peer_id().0)).verify(&msg, &sig));
        }
        let verify_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;

        // Memory: envelopes signed inline (their bytes are freed at once), so
        // what stays is what the orchestrator keeps.
        let (svc, aud) = service(a.miners)?;
        let base = live_on_this_thread();
        let mut marks = Vec::new();
        for i in 0..a.miners {
            let env = sign(&miner(i), &aud, REGISTER, &register_body(i), now_ms());
            svc.register(tonic::Request::new(env)).await?;
            if [100, 1_000, 10_000].contains(&(i + 1)) || i + 1 == a.miners {
                marks.push((i + 1, live_on_this_thread() - base));
            }
        }
        marks.dedup();

        // Throughput: envelopes signed beforehand (signing is the caller's cost).
        let (svc, aud) = service(a.miners)?;
        let regs: Vec<pb::Signed> =
            (0..a.miners).map(|i| sign(&miner(i), &aud, REGISTER, &register_body(i), now_ms())).collect();
        // CPU time of the first and the last tenth: flat if registering does
        // not get slower as miners accumulate.
        let tenth = (a.miners / 10).max(1) as usize;
        let (mut first, mut last) = (0.0, 0.0);
        let (c0, t0) = (process_cpu_time(), Instant::now());
        let mut c = c0;
        for (i, env) in regs.into_iter().enumerate() {
            svc.register(tonic::Request::new(env)).await?;
            if i + 1 == tenth {
                first = (process_cpu_time() - c0).as_secs_f64();
            }
            if i + 1 == a.miners as usize - tenth {
                c = process_cpu_time();
            }
        }
        let (reg_wall, reg_cpu) = (t0.elapsed().as_secs_f64(), (process_cpu_time() - c0).as_secs_f64());
        if a.miners as usize > tenth {
            last = (process_cpu_time() - c).as_secs_f64();
        }
        let ids: Vec<Identity> = (0..a.miners.min(1_000)).map(miner).collect();
        let hbs: Vec<pb::Signed> = (0..a.heartbeats)
            .map(|i| {
                let body = pb::HeartbeatRequest { epoch: 0, in_flight: 0, tokens_per_s: 1000.0, ..Default::default() };
                sign(&ids[i as usize % ids.len()], &aud, HEARTBEAT, &body, now_ms())
            })
            .collect();
        let (c0, t0) = (process_cpu_time(), Instant::now());
        for env in hbs {
            svc.heartbeat(tonic::Request::new(env)).await?;
        }
        let (hb_wall, hb_cpu) = (t0.elapsed().as_secs_f64(), (process_cpu_time() - c0).as_secs_f64());

        let reg_us = reg_cpu * 1e6 / a.miners as f64;
        let hb_us = hb_cpu * 1e6 / a.heartbeats as f64;
        let per = |t: f64| t * 1e6 / tenth as f64;
        println!("control plane on one core (in-process service, strict Ed25519, signed replies)");
        println!("  baseline: one strict Ed25519 verification  {verify_us:>8.1} us");
        println!(
            "  registrations: {:>7.0}/s wall, {:>8.1} us CPU each = {:.2}x a verification ({} miners)",
            a.miners as f64 / reg_wall,
            reg_us,
            reg_us / verify_us,
            a.miners
        );
        println!(
            "    first tenth {:.1} us each, last tenth {:.1} us each ({:.2}x)",
            per(first),
            per(last),
            last / first.max(1e-12)
        );
        println!(
            "  heartbeats:    {:>7.0}/s wall, {:>8.1} us CPU each = {:.2}x a verification ({} signed RPCs)",
            a.heartbeats as f64 / hb_wall,
            hb_us,
            hb_us / verify_us,
            a.heartbeats
        );
        for (n, bytes) in marks {
            println!(
                "  memory at {n:>6} miners: {:>8.2} MiB kept, {:>6.0} bytes per miner",
                bytes as f64 / (1 << 20) as f64,
                bytes as f64 / n as f64
            );
        }
        Ok(())
    })
}
