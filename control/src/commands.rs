//! The `iota-control` command line: the orchestrator, and the local swarm
//! that runs a whole run on one machine.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::cli::RunArgs;
use crate::swarm::{self, SwarmOptions};
use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "iota-control",
    version,
    args_override_self = true,
    about = "iota-rs control plane: orchestrator and local swarm"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
    /// Log lines as text for people, or as one JSON object per line for
    /// log collectors (RUST_LOG filters either).
    #[arg(long, global = true, value_enum, default_value_t = iota_dataplane::LogFormat::Text)]
    pub log_format: iota_dataplane::LogFormat,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Run the orchestrator: miners (`iota-miner run --orchestrator URL`)
    /// register with it and train until the run's epochs are done. State is
    /// kept in RUN_DIR/state.sqlite; restarting resumes the run.
    Orchestrator {
        #[command(flatten)]
        run: RunArgs,
        /// gRPC listen address.
        #[arg(long, default_value = "127.0.0.1:7100")]
        listen: SocketAddr,
        /// Where the run's state is kept: a SQLite file (the default,
        /// RUN_DIR/state.sqlite) or a PostgreSQL database
        /// (postgres://USER[:PASSWORD]@HOST[:PORT]/DB; several runs can
        /// share one, each under its run id). The connection is not
        /// encrypted: keep the database on this host or a private network.
        /// A URL holding a password is better given in the environment
        /// (IOTA_STATE_DB), out of the process list; it is never printed.
        #[arg(long, value_name = "URL|FILE")]
        state_db: Option<String>,
        /// Serve Prometheus metrics at http://ADDR/metrics (off by default;
        /// give a loopback address unless the scraper is elsewhere: the
        /// page is unauthenticated).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
        /// Serve the web dashboard (loss curves, throughput, miners,
        /// pathways, merge, validation, payouts) at http://ADDR/; without
        /// ADDR on 127.0.0.1:7180. Off by default; read-only and
        /// unauthenticated, so keep it on loopback unless told otherwise.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7180")]
        dashboard: Option<SocketAddr>,
        /// The address miners dial (HOST:PORT), put in the join token it
        /// prints; default: the listen address (give it when listening on
        /// 0.0.0.0).
        #[arg(long, value_name = "HOST:PORT")]
        advertise: Option<String>,
        /// Serve plaintext gRPC instead of TLS with the orchestrator's
        /// identity certificate (miners then need --insecure-plaintext
        /// too). For local tests only.
        #[arg(long)]
        insecure_plaintext: bool,
        /// Serve TLS with this CA-issued certificate chain (PEM, leaf first)
        /// instead of the orchestrator's identity certificate; callers then
        /// need --tls-ca with the CA and a URL naming the certificate's host.
        /// The orchestrator's key still signs every reply and command.
        #[arg(long, value_name = "FILE", requires = "tls_key", conflicts_with = "insecure_plaintext")]
        tls_cert: Option<PathBuf>,
        /// The private key (PEM) of --tls-cert.
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Admit only the identities listed in FILE (one 64-hex miner key
        /// per line, '#' comments): any other is refused PERMISSION_DENIED
        /// before its request is even verified. Default: open to all.
        #[arg(long, value_name = "FILE")]
        admit: Option<PathBuf>,
        /// Requests per second one source address may send (IPv6: one
        /// /64), bursts of twice that; more are refused RESOURCE_EXHAUSTED
        /// before their signature is checked.
        #[arg(long, default_value_t = 1000.0, value_name = "N")]
        address_rps: f64,
        /// Requests per second the server takes from everyone together
        /// (bursts of twice that).
        #[arg(long, default_value_t = 10000.0, value_name = "N")]
        server_rps: f64,
        /// Identities (miners and validators) one source address may
        /// register; a re-registration of a known one is always taken.
        #[arg(long, default_value_t = 64, value_name = "N")]
        identities_per_address: usize,
        /// Read flags from a TOML file (keys are flag names; flags given
        /// on the command line win).
        #[arg(long)]
        config_file: Option<PathBuf>,
    },
    /// Validate a run: recompute a sample of every miner's work after each
    /// epoch (on the CPU) and vote on it. The run must list this
    /// validator's key with a stake (`iota-control orchestrator --validator
    /// KEY:STAKE`); run it once with --print-key to learn the key.
    Validator {
        /// The orchestrator's URL (https://HOST:PORT).
        #[arg(long, default_value = "https://127.0.0.1:7100")]
        orchestrator: String,
        /// The orchestrator's key (64 hex), pinned.
        #[arg(long)]
        orchestrator_key: Option<String>,
        /// The orchestrator's join token (`iota://KEY@HOST:PORT`, which it
        /// prints): its URL and its key, pinned, in one.
        #[arg(long, value_name = "TOKEN", conflicts_with_all = ["orchestrator", "orchestrator_key", "insecure_plaintext"])]
        join: Option<String>,
        /// This validator's identity file (made on first use).
        #[arg(long, default_value = "validator.key")]
        identity: PathBuf,
        /// Print this validator's public key and exit.
        #[arg(long)]
        print_key: bool,
        /// The run's object store directory (when the run keeps its objects
        /// in one on this machine; not with a bucket).
        #[arg(long)]
        store: Option<PathBuf>,
        /// The run's corpus (as the miners have it).
        #[arg(long)]
        data: Option<PathBuf>,
        /// This validator's secret sampling seed (default: random).
        #[arg(long)]
        seed: Option<u64>,
        /// Seconds a miner has to deliver the evidence drawn from it.
        #[arg(long, default_value_t = 30)]
        evidence_timeout_s: u64,
        /// Accept a plaintext http:// orchestrator URL (local tests only).
        #[arg(long)]
        insecure_plaintext: bool,
        /// The orchestrator has a CA-issued certificate: check its chain
        /// against the CA certificates (PEM) in FILE and the URL's host.
        #[arg(long, value_name = "FILE", conflicts_with = "insecure_plaintext")]
        tls_ca: Option<PathBuf>,
    },
    /// Run a whole swarm on this machine: an orchestrator and STAGES x
    /// REPLICAS miner processes on loopback. Ctrl-C stops everything;
    /// running the same command again resumes.
    Swarm {
        #[command(flatten)]
        run: RunArgs,
        /// gRPC listen address of the orchestrator (port 0 = any).
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Serve Prometheus metrics at http://ADDR/metrics (off by default;
        /// give a loopback address unless the scraper is elsewhere: the
        /// page is unauthenticated).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
        /// Serve the web dashboard (loss curves, throughput, miners,
        /// pathways, merge, validation, payouts) at http://ADDR/; without
        /// ADDR on 127.0.0.1:7180. Off by default; read-only and
        /// unauthenticated, so keep it on loopback unless told otherwise.
        #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:7180")]
        dashboard: Option<SocketAddr>,
        /// Compute threads per miner process (default: 1 with cpu miners;
        /// with cuda miners the machine's cores shared out among them).
        #[arg(long)]
        threads_per_miner: Option<usize>,
        /// The iota-miner binary (default: next to this one).
        #[arg(long)]
        miner_bin: Option<PathBuf>,
        /// Memory each miner states, in GiB (`iota-miner run --memory-gib`):
        /// to run as on cards of that size, say 16, on a larger one.
        #[arg(long, value_name = "GIB")]
        miner_memory_gib: Option<f64>,
        /// When each miner recomputes activations in the backward
        /// (`iota-miner run --recompute`: auto or always).
        #[arg(long, value_name = "WHEN")]
        miner_recompute: Option<String>,
        /// Where every miner computes: cpu, cuda (all on GPU 0) or cuda:N.
        #[arg(long, default_value = "cpu")]
        miner_device: String,
        /// Validators to run beside the miners (each with stake 100; keys
        /// in RUN_DIR/keys): they recompute a sample of every miner's work
        /// each epoch and vote on it before the merge.
        #[arg(long, default_value_t = 0)]
        validators: u32,
        /// Test tool: make miner K an adversary, MODE@K (the modes
        /// `iota-miner run --adversary` takes: noise, zeros, replay,
        /// loss-lie, copy, grad-noise, lazy, merge-equivocate, nan,
        /// merge-garbage, merge-lie, withholder, lying-owner,
        /// framing-sender, silent, closed, slow, flaky,
        /// hostile-unreachable; not collude or referee-collusion, which
        /// need their accomplices' ids); repeatable.
        #[arg(long, value_name = "MODE@K", hide = true)]
        adversary: Vec<String>,
        /// Read flags from a TOML file (keys are flag names; flags given
        /// on the command line win).
        #[arg(long)]
        config_file: Option<PathBuf>,
    },
    /// Run one epoch of Yuma consensus (subtensor's epoch) on a JSON input; print the result as JSON
    ///
    /// Input, for V validators and M miners (only stakes and weights are required):
    ///   stakes               [V] stake per validator (finite, >= 0, not all zero)
    ///   weights              [V][M] each validator's weights (any scale: rows are normalised)
    ///   bonds                [V][M] the bonds the previous epoch printed (default: none yet)
    ///   validator_permits    [V] who may vote (default: all true)
    ///   active               [V] who set weights recently (default: all true)
    ///   recently_registered  [M] miners whose old bonds are dropped (default: all false)
    ///   params               kappa (default 32767/65535), bonds_moving_average (0.9),
    ///                        bonds_penalty (1), bonds_mode ("classic" or "yuma3"),
    ///                        emission (1), miner_share (0.5)
    ///
    /// Output: active_stake [V], consensus [M], ranks [M], trust [M],
    /// incentive [M], validator_trust [V], dividends [V], bonds [V][M] (feed
    /// them to the next epoch) and emission {miners [M], validators [V]},
    /// which sums to params.emission. Malformed input is refused, naming the
    /// field. See docs/PROTOCOL.md, "Yuma consensus".
    #[command(verbatim_doc_comment)]
    Yuma {
        /// The input JSON file ('-': standard input).
        #[arg(long, value_name = "FILE.json")]
        input: PathBuf,
    },
    /// A running orchestrator's state and payout table (its Status RPC).
    Status(crate::status_cmd::StatusArgs),
    /// The run's settlement ledger: every epoch's payouts, hash-chained and
    /// signed by the orchestrator (in RUN_DIR/state.sqlite).
    Ledger {
        #[command(subcommand)]
        cmd: crate::ledger_cmd::LedgerCmd,
    },
    /// A run's corpus in its object store: `data prepare` tokenizes it once
    /// and writes checked chunks with a manifest, for runs across machines
    /// (`orchestrator --prepared-data`).
    Data {
        #[command(subcommand)]
        cmd: crate::data_cmd::DataCmd,
    },
    /// Export a run's current merged model as a Hugging Face Llama folder
    /// (RUN_DIR/model; an earlier one there moves aside to model.prev-N),
    /// from its saved state and store, whether or not its orchestrator
    /// runs. A swarm or orchestrator does this by itself at the run's end.
    Export {
        /// The run directory (holding run.json, the state and the store).
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// The run's state, when not RUN_DIR/state.sqlite (as given to the
        /// orchestrator: a file or postgres://...; IOTA_STATE_DB works too).
        #[arg(long, value_name = "URL|FILE")]
        state_db: Option<String>,
    },
}

/// The run's configuration (its corpus from the run's store with
/// `--prepared-data`: the bucket, else RUN_DIR/store), the run directory
/// claimed for it.
async fn claimed_config(run: &RunArgs, bucket: Option<&crate::s3_store::S3Store>) -> Result<iota_protocol::RunConfig> {
    let cfg = match bucket {
        Some(b) => run.run_config_from_store(b).await?,
        None if run.prepared_data => {
            let dir = iota_dataplane::local_store::LocalDirStore::open(
                run.store_dir()?,
                iota_dataplane::fileio::FileIo::start(false),
            )?;
            run.run_config_from_store(&dir).await?
        }
        None => run.run_config()?,
    };
    for note in [run.optimizer_note(&cfg), run.stage_note(&cfg)].into_iter().flatten() {
        eprintln!("{note}");
    }
    eprintln!("{}", run.schedule_note(&cfg)?);
    run.claim_run_dir(&cfg)?;
    if run.prepared_data && bucket.is_none() {
        // A new run in a directory that held another moves the old store
        // aside, and the corpus prepared in it with it.
        let manifest = run.store_dir()?.join(iota_dataplane::prepared_corpus::MANIFEST_KEY);
        anyhow::ensure!(
            manifest.exists(),
            "the prepared corpus left {} with the previous run's store (see the note above): prepare it again",
            run.store_dir()?.display()
        );
    }
    Ok(cfg)
}

/// Runs one parsed command line (on its own tokio runtime).
pub fn run(cli: Cli) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(run_async(cli))
}

async fn run_async(cli: Cli) -> Result<()> {
    let log_format = cli.log_format;
    match cli.cmd {
        Cmd::Orchestrator {
            run,
            listen,
            advertise,
            insecure_plaintext,
            tls_cert,
            tls_key,
            admit,
            metrics,
            dashboard,
            state_db,
            address_rps,
            server_rps,
            identities_per_address,
            ..
        } => {
            anyhow::ensure!(
                address_rps > 0.0 && server_rps > 0.0 && identities_per_address > 0,
                "--address-rps, --server-rps and --identities-per-address must be positive"
            );
            let bucket = run.s3_store().await?;
            let cfg = claimed_config(&run, bucket.as_deref()).await?;
            let mut policy = iota_protocol::auth::AuthPolicy::default();
            if let Some(file) = &admit {
                let list = iota_protocol::auth::load_admitted(file)?;
                println!("admitting {} identities listed in {}", list.len(), file.display());
                policy.admitted = Some(std::sync::Arc::new(list));
            }
            let sources = iota_protocol::source_limits::SourcePolicy {
                per_address_rate_per_s: address_rps,
                per_address_burst: 2.0 * address_rps,
                global_rate_per_s: server_rps,
                global_burst: 2.0 * server_rps,
                identities_per_address,
            };
            let state = match state_db.or_else(|| std::env::var("IOTA_STATE_DB").ok().filter(|s| !s.is_empty())) {
                Some(s) => crate::state_db::StateLocation::parse(&s),
                None => crate::state_db::StateLocation::Sqlite(run.run_dir.join("state.sqlite")),
            };
            let mut svc = swarm::orchestrator_at(&cfg, &run.run_dir, &state, policy)?.with_source_policy(sources);
            let store_arg = match &bucket {
                // Miners reach the bucket through grants: nothing to share.
                Some(_) => String::new(),
                None => format!(" --store {}", run.store_dir()?.display()),
            };
            let export_bucket = bucket.clone();
            if let Some(b) = bucket {
                svc = svc.with_s3(b);
            }
            let tls = match (&tls_cert, &tls_key) {
                (Some(cert), Some(key)) => Some(iota_protocol::tls_identity::server_config_pem(cert, key)?),
                _ if insecure_plaintext => None,
                _ => Some(iota_protocol::tls_identity::server_config(svc.identity())?),
            };
            let (url, server) = swarm::serve_with(svc.clone(), listen, tls).await?;
            let ticker = svc.spawn_ticker();
            let state_shown = match &state {
                crate::state_db::StateLocation::Sqlite(p) => p.display().to_string(),
                crate::state_db::StateLocation::Postgres(u) => crate::state_db::redacted(u),
            };
            println!("orchestrator listening at {url} (run {}, state in {state_shown})", cfg.spec.run_id);
            let page_servers =
                crate::http_endpoint::serve_operator_pages(&svc, metrics, dashboard, |m| println!("{m}")).await?;
            println!("orchestrator key: {}", svc.identity().peer_id().to_hex());
            let data_arg = run.data_path()?.map_or(String::new(), |d| format!(" --data {}", d.display()));
            let key = svc.identity().peer_id();
            let dial = match &advertise {
                Some(a) if !insecure_plaintext => format!("https://{a}"),
                Some(a) => format!("http://{a}"),
                None => url.clone(),
            };
            if tls_cert.is_some() {
                // A join token means the identity certificate; a CA's needs --tls-ca.
                println!(
                    "miners join with: iota-miner run --orchestrator {dial} --orchestrator-key {}{store_arg}{data_arg} --tls-ca CA.pem",
                    key.to_hex()
                );
            } else if insecure_plaintext {
                println!(
                    "miners join with: iota-miner run --orchestrator {dial} --orchestrator-key {}{store_arg}{data_arg} --insecure-plaintext",
                    key.to_hex()
                );
            } else {
                let token = iota_protocol::join_token::JoinToken::new(&dial, key)
                    .map_err(|e| anyhow::anyhow!("--advertise: {e}"))?;
                println!("join token: {token}");
                println!("miners join with: iota-miner run --join {token}{store_arg}{data_arg}");
            }
            // The training time of this process's life: from the first
            // phase past waiting for miners to the end of the run.
            let mut trained_from: Option<(std::time::Instant, u64)> = None;
            loop {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => break,
                    _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {
                        let (phase, tokens) = svc.with_state(|o| (o.phase().clone(), o.status().tokens));
                        if trained_from.is_none() && phase != crate::orchestrator::Phase::Waiting {
                            trained_from = Some((std::time::Instant::now(), tokens));
                        }
                        if phase == crate::orchestrator::Phase::Done {
                            break;
                        }
                    }
                }
            }
            let trained = trained_from.map(|(t0, c0)| (t0.elapsed(), c0));
            // Miners fetch the final weights after the run ends (through
            // grants, on a bucket): keep answering until none has been heard
            // from for 3 s, 30 s at most.
            let linger_until = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while std::time::Instant::now() < linger_until {
                let now = iota_protocol::auth::now_ms();
                let heard = svc.with_state(|o| o.miners().map(|m| m.last_seen_ms).max().unwrap_or(0));
                if now.saturating_sub(heard) > 3_000 {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            svc.save();
            ticker.abort();
            server.abort();
            for t in page_servers {
                t.abort();
            }
            let mut model = None;
            if svc.with_state(|o| o.phase() == &crate::orchestrator::Phase::Done) {
                let store_dir = if export_bucket.is_some() { None } else { Some(run.store_dir()?) };
                let exported =
                    crate::final_model::export_for_run(&svc, &cfg, export_bucket, store_dir.as_deref(), &run.run_dir)
                        .await;
                match &exported {
                    Ok(p) => println!("model: {} (try `iota generate --model {}`)", p.display(), p.display()),
                    Err(why) => println!("model: none exported ({why})"),
                }
                model = Some(exported);
            }
            let (s, history, divergent) =
                svc.with_state(|o| (o.status(), o.history().to_vec(), o.counters().divergent_merges));
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
            // A finished run that trained nothing is a failure, said so.
            if let Some(why) = model.and_then(|m| crate::swarm_outcome::trained_nothing(&history, &m, false)) {
                anyhow::bail!("the run trained nothing: {why}");
            }
            Ok(())
        }
        Cmd::Validator {
            mut orchestrator,
            mut orchestrator_key,
            join,
            identity,
            print_key,
            store,
            data,
            seed,
            evidence_timeout_s,
            insecure_plaintext,
            tls_ca,
        } => {
            if let Some(t) = join {
                let t = iota_protocol::join_token::JoinToken::parse(&t).map_err(anyhow::Error::msg)?;
                orchestrator = t.url();
                orchestrator_key = Some(t.key.to_hex());
            }
            let id = iota_dataplane::identity_file::load_or_create(&identity)?;
            if print_key {
                println!("{}", id.peer_id().to_hex());
                return Ok(());
            }
            let key = orchestrator_key
                .map(|k| iota_core::PeerId::from_hex(&k).context("--orchestrator-key is not 64 hex characters"))
                .transpose()?;
            let mut opts = crate::validator::ValidatorOptions::local(
                orchestrator,
                seed.unwrap_or_else(crate::validator::random_seed),
            );
            opts.orchestrator_key = key;
            opts.insecure_plaintext = insecure_plaintext;
            opts.tls_ca = tls_ca;
            opts.store = store;
            opts.data = data;
            opts.evidence_timeout = std::time::Duration::from_secs(evidence_timeout_s);
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = crate::validator::run(opts, id, stop).await?;
            println!(
                "validated {} rounds: {} evidence objects checked, {} cleared, {} guilty",
                s.rounds,
                s.checked,
                s.cleared_votes,
                s.guilty_votes.len()
            );
            for (epoch, miner, why) in &s.guilty_votes {
                println!("  guilty: epoch {epoch} miner {miner}: {why}");
            }
            Ok(())
        }
        Cmd::Swarm {
            mut run,
            listen,
            metrics,
            dashboard,
            threads_per_miner,
            miner_bin,
            miner_device,
            validators,
            adversary,
            miner_memory_gib,
            miner_recompute,
            ..
        } => {
            if let Some(r) = miner_recompute.as_deref()
                && iota_core::memory_fit::Recompute::parse(r).is_none()
            {
                anyhow::bail!("--miner-recompute '{r}': auto or always");
            }
            if let Some(g) = miner_memory_gib
                && !(g.is_finite() && g > 0.0)
            {
                anyhow::bail!("--miner-memory-gib {g}: a positive number of GiB");
            }
            // It starts the miners here: `--schedule auto` decides from their device.
            run.local_miner_device = Some(miner_device.clone());
            // The swarm's validators are listed in the run (stake 100 each).
            let mut validator_ids = Vec::new();
            for i in 0..validators {
                let path = run.run_dir.join("keys").join(format!("validator-{i}.key"));
                let id = iota_dataplane::identity_file::load_or_create(&path)?;
                run.validator_stakes.push(format!("{}:100", id.peer_id().to_hex()));
                validator_ids.push(id);
            }
            let adversaries = adversary
                .iter()
                .map(|a| {
                    let (mode, k) = a.split_once('@').with_context(|| format!("--adversary {a}: want MODE@K"))?;
                    if iota_dataplane::miner::Adversary::parse(mode).is_none() {
                        let names: Vec<&str> =
                            iota_dataplane::miner::Adversary::NAMES.iter().map(|(n, _)| *n).collect();
                        anyhow::bail!("--adversary {a}: unknown mode '{mode}' ({})", names.join(", "));
                    }
                    if mode == "collude" {
                        anyhow::bail!(
                            "--adversary {a}: colluders need each other's peer ids, which the swarm does not \
                             hand out; run them with `iota-miner run --adversary collude --accomplices HEX,...`"
                        );
                    }
                    Ok((
                        k.parse::<u32>().with_context(|| format!("--adversary {a}: K is a miner index"))?,
                        mode.to_string(),
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            let cfg = claimed_config(&run, None).await?;
            let miner_bin = match miner_bin {
                Some(p) => p,
                None => std::env::current_exe()?.parent().context("no binary directory")?.join("iota-miner"),
            };
            if !miner_bin.exists() {
                anyhow::bail!(
                    "{} not found; build it (package iota-dataplane) or pass --miner-bin",
                    miner_bin.display()
                );
            }
            let report = swarm::run(SwarmOptions {
                cfg: cfg.clone(),
                data: run.data_path()?,
                store: if run.bucket.is_some() { None } else { Some(run.store_dir()?) },
                bucket: run.s3_store().await?,
                run_dir: run.run_dir.clone(),
                listen,
                metrics,
                dashboard,
                log_format,
                miner_bin,
                threads_per_miner: threads_per_miner.unwrap_or_else(|| {
                    swarm::default_threads_per_miner(&miner_device, (cfg.spec.stages * cfg.spec.replicas) as usize)
                }),
                miner_device,
                validators: validator_ids,
                adversaries,
                extra_miner_args: crate::swarm::miner_memory_args(miner_memory_gib, miner_recompute.as_deref()),
            })
            .await?;
            swarm::print_summary(&cfg, &report);
            if report.interrupted {
                std::process::exit(130);
            }
            if let Some(why) = report.trained_nothing() {
                anyhow::bail!("the swarm trained nothing: {why}");
            }
            Ok(())
        }
        Cmd::Ledger { cmd } => crate::ledger_cmd::run(cmd),
        Cmd::Data { cmd } => crate::data_cmd::run(cmd).await,
        Cmd::Status(a) => crate::status_cmd::run(a).await,
        Cmd::Export { run_dir, state_db } => {
            let state = state_db
                .or_else(|| std::env::var("IOTA_STATE_DB").ok().filter(|s| !s.is_empty()))
                .map(|s| crate::state_db::StateLocation::parse(&s));
            let dir = crate::final_model::export_run_dir(&run_dir, state.as_ref()).await?;
            println!("model: {} (try `iota generate --model {} --prompt \"...\"`)", dir.display(), dir.display());
            Ok(())
        }
        Cmd::Yuma { input } => {
            let (json, name) = if input.as_os_str() == "-" {
                (std::io::read_to_string(std::io::stdin()), "standard input".to_string())
            } else {
                (std::fs::read_to_string(&input), input.display().to_string())
            };
            let json = json.with_context(|| format!("reading {name}"))?;
            let output = crate::settlement::yuma::run_json(&json).with_context(|| name)?;
            println!("{output}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_command_line_is_well_formed() {
        // clap's own checks (unique argument names, ...) run only when a
        // command is built: a clash would panic every run of the binary.
        Cli::command().debug_assert();
        let swarm = Cli::try_parse_from([
            "iota-control",
            "swarm",
            "--validators",
            "2",
            "--adversary",
            "noise@1",
            "--validator",
            &format!("{}:5", "ab".repeat(32)),
        ])
        .unwrap();
        let Cmd::Swarm { validators, adversary, run, .. } = swarm.cmd else { panic!("not the swarm") };
        assert_eq!((validators, adversary), (2, vec!["noise@1".to_string()]));
        assert_eq!(run.validation().unwrap().validators[0].stake, 5);
        assert!(Cli::try_parse_from(["iota-control", "validator", "--print-key"]).is_ok());
        let yuma = Cli::try_parse_from(["iota-control", "yuma", "--input", "in.json"]).unwrap();
        assert!(matches!(yuma.cmd, Cmd::Yuma { input } if input == std::path::Path::new("in.json")));
    }
}
