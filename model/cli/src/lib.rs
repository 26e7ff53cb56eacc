//! iota-cli: the `iota` binary, single-process tools: train a model in one
//! process (on the CPU reference or a GPU), use a trained model (generate,
//! eval, export, logits) and list the presets.
//!
//! It lives beside `iota-model` (whose trainer it drives) rather than in
//! `iota-cuda`, and depends on `iota-cuda` only to offer `--device cuda`.

pub mod args;
pub mod eval;
pub mod export;
pub mod generate;
pub mod presets;
pub mod run_settings;
pub mod train;

use std::ffi::OsString;

use anyhow::Result;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};

pub use args::{Cli, Cmd};

/// Parses a command line (printing help or a usage error and exiting as
/// clap does) and notes which flags were given explicitly.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Cli {
    let matches = Cli::command().get_matches_from(args);
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if let (Cmd::Train(a), Some(("train", m))) = (&mut cli.cmd, matches.subcommand()) {
        a.explicit = m
            .ids()
            .filter(|id| m.value_source(id.as_str()) == Some(ValueSource::CommandLine))
            .map(|id| id.as_str().to_string())
            .collect();
    }
    cli
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Train(a) => train::train(a),
        Cmd::Generate(a) => generate::generate(a),
        Cmd::Logits(a) => generate::logits(a),
        Cmd::Eval(a) => eval::eval(a),
        Cmd::Export(a) => export::export(a),
        Cmd::Presets { stages } => presets::presets(stages),
    }
}
