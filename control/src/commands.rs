//! The `iota-control` command line: the orchestrator, and the local swarm
//! that runs a whole run on one machine.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

pub use crate::orchestrator_cmd::OrchestratorArgs;
pub use crate::swarm_cmd::SwarmArgs;
pub use crate::validator_cmd::ValidatorArgs;

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
    Orchestrator(OrchestratorArgs),
    /// Validate a run: recompute a sample of every miner's work after each
    /// epoch (on the CPU) and vote on it. The run must list this
    /// validator's key with a stake (`iota-control orchestrator --validator
    /// KEY:STAKE`); run it once with --print-key to learn the key.
    Validator(ValidatorArgs),
    /// Run a whole swarm on this machine: an orchestrator and STAGES x
    /// REPLICAS miner processes on loopback. Ctrl-C stops everything;
    /// running the same command again resumes.
    Swarm(SwarmArgs),
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

/// Runs one parsed command line (on its own tokio runtime).
pub fn run(cli: Cli) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the tokio runtime")?;
    rt.block_on(run_async(cli))
}

async fn run_async(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Orchestrator(args) => crate::orchestrator_cmd::run(args).await,
        Cmd::Validator(args) => crate::validator_cmd::run(args).await,
        Cmd::Swarm(args) => crate::swarm_cmd::run(args, cli.log_format).await,
        Cmd::Ledger { cmd } => crate::ledger_cmd::run(cmd).await,
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
        let Cmd::Swarm(SwarmArgs { validators, adversary, run, .. }) = swarm.cmd else { panic!("not the swarm") };
        assert_eq!((validators, adversary), (2, vec!["noise@1".to_string()]));
        assert_eq!(run.validation().unwrap().validators[0].stake, 5);
        assert!(Cli::try_parse_from(["iota-control", "validator", "--print-key"]).is_ok());
        let yuma = Cli::try_parse_from(["iota-control", "yuma", "--input", "in.json"]).unwrap();
        assert!(matches!(yuma.cmd, Cmd::Yuma { input } if input == std::path::Path::new("in.json")));
    }
}
