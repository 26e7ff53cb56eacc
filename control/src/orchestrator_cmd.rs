//! `iota-control orchestrator`: the run's orchestrator as a server: its
//! settings, the gRPC service and operator pages, how miners join, the run
//! followed to its end, and the model exported.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use iota_protocol::RunConfig;

use crate::cli::RunArgs;
use crate::orchestrator::Phase;
use crate::s3_store::S3Store;
use crate::service::OrchestratorService;
use crate::state_db::StateLocation;
use crate::swarm;

#[derive(Args)]
pub struct OrchestratorArgs {
    #[command(flatten)]
    pub run: RunArgs,
    /// gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// Where the run's state is kept: a SQLite file (the default,
    /// RUN_DIR/state.sqlite) or a PostgreSQL database
    /// (postgres://USER[:PASSWORD]@HOST[:PORT]/DB; several runs can
    /// share one, each under its run id). The connection is not
    /// encrypted: keep the database on this host or a private network.
    /// A URL holding a password is better given in the environment
    /// (IOTA_STATE_DB), out of the process list; it is never printed.
    #[arg(long, value_name = "URL|FILE")]
    pub state_db: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off by default;
    /// give a loopback address unless the scraper is elsewhere: the
    /// page is unauthenticated).
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// Serve the web dashboard (loss curves, throughput, miners,
    /// pathways, merge, validation, payouts) at http://ADDR/; without
    /// ADDR on 127.0.0.1:7180. Off by default; read-only and
    /// unauthenticated, so keep it on loopback unless told otherwise.
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7180")]
    pub dashboard: Option<SocketAddr>,
    /// The address miners dial (HOST:PORT), put in the join token it
    /// prints; default: the listen address (give it when listening on
    /// 0.0.0.0).
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise: Option<String>,
    /// Where the run's store is served when it has no --bucket (HTTPS
    /// with the same certificate as the control plane; miners reach it
    /// through grants, so no other set-up is needed). Default: the
    /// --listen address with its port + 1.
    #[arg(long, value_name = "ADDR")]
    pub store_listen: Option<SocketAddr>,
    /// The HOST:PORT miners reach the served store at, in the URLs it
    /// grants; default: --advertise's host (else --listen's) with the
    /// store's port.
    #[arg(long, value_name = "HOST:PORT")]
    pub store_advertise: Option<String>,
    /// Serve plaintext gRPC instead of TLS with the orchestrator's
    /// identity certificate (miners then need --insecure-plaintext
    /// too). For local tests only.
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// Serve TLS with this CA-issued certificate chain (PEM, leaf first)
    /// instead of the orchestrator's identity certificate; callers then
    /// need --tls-ca with the CA and a URL naming the certificate's host.
    /// The orchestrator's key still signs every reply and command.
    #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with = "insecure_plaintext")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Admit only the identities listed in FILE (one 64-hex miner key
    /// per line, '#' comments): any other is refused PERMISSION_DENIED
    /// before its request is even verified. Default: open to all.
    #[arg(long, value_name = "FILE")]
    pub admit: Option<PathBuf>,
    /// Requests per second one source address may send (IPv6: one
    /// /64), bursts of twice that; more are refused RESOURCE_EXHAUSTED
    /// before their signature is checked.
    #[arg(long, default_value_t = 1000.0, value_name = "N")]
    pub address_rps: f64,
    /// Requests per second the server takes from everyone together
    /// (bursts of twice that).
    #[arg(long, default_value_t = 10000.0, value_name = "N")]
    pub server_rps: f64,
    /// Identities (miners and validators) one source address may
    /// register; a re-registration of a known one is always taken.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub identities_per_address: usize,
    /// Read flags from a TOML file (keys are flag names; flags given
    /// on the command line win).
    #[arg(long)]
    pub config_file: Option<PathBuf>,
}

/// Serves the run until it is done (or Ctrl-C), then exports its model.
pub async fn run(args: OrchestratorArgs) -> Result<()> {
    anyhow::ensure!(
        args.address_rps > 0.0 && args.server_rps > 0.0 && args.identities_per_address > 0,
        "--address-rps, --server-rps and --identities-per-address must be positive"
    );
    let run = &args.run;
    let bucket = run.s3_store().await?;
    let cfg = crate::run_claim::claimed_config(run, bucket.as_deref(), true).await?;
    let state = state_location(args.state_db.clone(), run);
    let mut svc = swarm::orchestrator_at(&cfg, &run.run_dir, &state, auth_policy(&args)?)?
        .with_source_policy(source_policy(&args));
    // Miners reach the store through grants, a bucket or the one served here.
    let store_server = match bucket.clone() {
        Some(b) => {
            svc = svc.with_s3(b);
            None
        }
        None => {
            let (served, task) = serve_the_store(&args, &svc).await?;
            svc = svc.with_served_store(served);
            Some(task)
        }
    };
    let store_dir = if bucket.is_some() { None } else { Some(run.store_dir()?) };
    if let Some(store) = swarm::referee_store(bucket.as_ref(), store_dir.as_deref())? {
        let referee = crate::step_referee::StepReferee::new(store, cfg.clone(), run.data_path()?);
        svc = svc.with_referee(referee);
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(iota_protocol::tls_identity::server_config_pem(cert, key)?),
        _ if args.insecure_plaintext => None,
        _ => Some(iota_protocol::tls_identity::server_config(svc.identity())?),
    };
    let (url, server) = swarm::serve_with(svc.clone(), args.listen, tls).await?;
    let ticker = svc.spawn_ticker();
    let state_shown = match &state {
        StateLocation::Sqlite(p) => p.display().to_string(),
        StateLocation::Postgres(u) => crate::state_db::redacted(u),
    };
    println!("orchestrator listening at {url} (run {}, state in {state_shown})", cfg.spec.run_id);
    let page_servers =
        crate::http_endpoint::serve_operator_pages(&svc, args.metrics, args.dashboard, |m| println!("{m}")).await?;
    println!("orchestrator key: {}", svc.identity().peer_id().to_hex());
    // A corpus in the run's store reaches miners through it.
    let data_arg = match run.data_path()? {
        Some(d) if !cfg.corpus_in_store => format!(" --data {}", d.display()),
        _ => String::new(),
    };
    print_how_to_join(&args, &svc, &url, &data_arg)?;
    let trained = follow_the_run(&svc).await;
    linger_while_miners_download(&svc).await;
    svc.save();
    ticker.abort();
    server.abort();
    if let Some(t) = store_server {
        t.abort();
    }
    for t in page_servers {
        t.abort();
    }
    let model = export_model(&svc, &cfg, run, bucket).await?;
    let history = print_run_summary(&svc, trained);
    // A finished run that trained nothing is a failure, said so.
    if let Some(why) = model.and_then(|m| crate::swarm_outcome::trained_nothing(&history, &m, false)) {
        anyhow::bail!("the run trained nothing: {why}");
    }
    Ok(())
}

/// Serves RUN_DIR/store on its own port (`--store-listen`), over the
/// control plane's TLS; says where.
async fn serve_the_store(
    args: &OrchestratorArgs,
    svc: &OrchestratorService,
) -> Result<(std::sync::Arc<crate::served_store::ServedStore>, tokio::task::JoinHandle<()>)> {
    use crate::served_store;
    let listener = served_store::bind(args.store_listen, args.listen).await?;
    let bound = listener.local_addr()?;
    let scheme = if args.insecure_plaintext { "http" } else { "https" };
    let host_port = match (&args.store_advertise, &args.advertise) {
        (Some(a), _) => a.clone(),
        (None, Some(a)) => {
            let host = a.rsplit_once(':').map_or(a.as_str(), |(h, _)| h);
            format!("{host}:{}", bound.port())
        }
        (None, None) => bound.to_string(),
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(iota_protocol::store_tls::server_config_pem(cert, key)?),
        _ if args.insecure_plaintext => None,
        _ => Some(iota_protocol::store_tls::server_config(svc.identity())?),
    };
    let dir = args.run.store_dir()?;
    let store =
        std::sync::Arc::new(served_store::ServedStore::new(&dir, svc.identity(), format!("{scheme}://{host_port}"))?);
    let task = served_store::serve(listener, tls.map(std::sync::Arc::new), store.clone(), crate::service::GRANT_TTL);
    println!(
        "the run's store ({}) served at {} (miners reach it through grants; one on this machine may add --store {})",
        dir.display(),
        store.base(),
        dir.display()
    );
    Ok((store, task))
}

/// Where the run's state is kept: --state-db, else IOTA_STATE_DB, else
/// RUN_DIR/state.sqlite.
fn state_location(state_db: Option<String>, run: &RunArgs) -> StateLocation {
    match state_db.or_else(|| std::env::var("IOTA_STATE_DB").ok().filter(|s| !s.is_empty())) {
        Some(s) => StateLocation::parse(&s),
        None => StateLocation::Sqlite(run.run_dir.join("state.sqlite")),
    }
}

/// Who may call, and how requests are signed (--admit).
fn auth_policy(args: &OrchestratorArgs) -> Result<iota_protocol::auth::AuthPolicy> {
    let mut policy = iota_protocol::auth::AuthPolicy::default();
    if let Some(file) = &args.admit {
        let list = iota_protocol::auth::load_admitted(file)?;
        println!("admitting {} identities listed in {}", list.len(), file.display());
        policy.admitted = Some(std::sync::Arc::new(list));
    }
    Ok(policy)
}

/// Request budgets per source address and for the whole server.
fn source_policy(args: &OrchestratorArgs) -> iota_protocol::source_limits::SourcePolicy {
    iota_protocol::source_limits::SourcePolicy {
        per_address_rate_per_s: args.address_rps,
        per_address_burst: 2.0 * args.address_rps,
        global_rate_per_s: args.server_rps,
        global_burst: 2.0 * args.server_rps,
        identities_per_address: args.identities_per_address,
    }
}

/// The command line miners join with (`extra`: their --store and --data),
/// and the join token where there is one.
fn print_how_to_join(args: &OrchestratorArgs, svc: &OrchestratorService, url: &str, extra: &str) -> Result<()> {
    let key = svc.identity().peer_id();
    let dial = match &args.advertise {
        Some(a) if !args.insecure_plaintext => format!("https://{a}"),
        Some(a) => format!("http://{a}"),
        None => url.to_string(),
    };
    let pinned = format!("iota-miner run --orchestrator {dial} --orchestrator-key {}{extra}", key.to_hex());
    if args.tls_cert.is_some() {
        // A join token means the identity certificate; a CA's needs --tls-ca.
        println!("miners join with: {pinned} --tls-ca CA.pem");
    } else if args.insecure_plaintext {
        println!("miners join with: {pinned} --insecure-plaintext");
    } else {
        let token =
            iota_protocol::join_token::JoinToken::new(&dial, key).map_err(|e| anyhow::anyhow!("--advertise: {e}"))?;
        println!("join token: {token}");
        println!("miners join with: iota-miner run --join {token}{extra}");
    }
    Ok(())
}

/// Waits for the run's end (or Ctrl-C). The training time of this
/// process's life and the tokens counted when it began: from the first
/// phase past waiting for miners to the end of the run.
async fn follow_the_run(svc: &OrchestratorService) -> Option<(Duration, u64)> {
    let mut trained_from: Option<(Instant, u64)> = None;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                let (phase, tokens) = svc.with_state(|o| (o.phase().clone(), o.status().tokens));
                if trained_from.is_none() && phase != Phase::Waiting {
                    trained_from = Some((Instant::now(), tokens));
                }
                if phase == Phase::Done {
                    break;
                }
            }
        }
    }
    trained_from.map(|(t0, c0)| (t0.elapsed(), c0))
}

/// Miners fetch the final weights after the run ends (through grants, on a
/// bucket): keep answering until none has been heard from for 3 s, 30 s at
/// most.
async fn linger_while_miners_download(svc: &OrchestratorService) {
    let linger_until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < linger_until {
        let now = iota_protocol::auth::now_ms();
        let heard = svc.with_state(|o| o.miners().map(|m| m.last_seen_ms).max().unwrap_or(0));
        if now.saturating_sub(heard) > 3_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The finished run's model as a Hugging Face folder in the run directory
/// (None: the run did not finish; Some(Err): it finished and exported
/// nothing, why said).
async fn export_model(
    svc: &OrchestratorService,
    cfg: &RunConfig,
    run: &RunArgs,
    bucket: Option<std::sync::Arc<S3Store>>,
) -> Result<Option<std::result::Result<PathBuf, String>>> {
    if !svc.with_state(|o| o.phase() == &Phase::Done) {
        return Ok(None);
    }
    let store_dir = if bucket.is_some() { None } else { Some(run.store_dir()?) };
    let exported = crate::final_model::export_for_run(svc, cfg, bucket, store_dir.as_deref(), &run.run_dir).await;
    match &exported {
        Ok(p) => println!("model: {} (try `iota generate --model {}`)", p.display(), p.display()),
        Err(why) => println!("model: none exported ({why})"),
    }
    Ok(Some(exported))
}

/// Each epoch's loss and counts, the run's totals and its throughput; the
/// epochs' history.
fn print_run_summary(
    svc: &OrchestratorService,
    trained: Option<(Duration, u64)>,
) -> Vec<crate::orchestrator::EpochSummary> {
    let (s, history, divergent) = svc.with_state(|o| (o.status(), o.history().to_vec(), o.counters().divergent_merges));
    for e in &history {
        println!(
            "epoch {}: mean loss {:.4}, {} micro-batches completed, {} dropped",
            e.epoch, e.mean_loss, e.completed, e.dropped
        );
    }
    println!(
        "epoch {}, {} micro-batches completed, {} re-routed, {} dropped, {} divergent merges",
        s.epoch, s.completed, s.rerouted, s.dropped, divergent
    );
    if let Some((took, c0)) = trained {
        let tokens = s.tokens.saturating_sub(c0);
        println!(
            "trained {tokens} tokens in {:.1} s ({:.0} tokens/s, from the first epoch's start to the run's end)",
            took.as_secs_f64(),
            tokens as f64 / took.as_secs_f64().max(1e-9)
        );
    }
    history
}
