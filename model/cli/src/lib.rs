//! iota-cli: the `iota` binary, single-process tools: train a model in one
//! process (on the CPU reference or a GPU) and list the presets.
//!
//! It lives beside `iota-model` (whose trainer it drives) rather than in
//! `iota-cuda`, and depends on `iota-cuda` only to offer `--device cuda`.

pub mod args;
pub mod presets;
pub mod train;

use anyhow::Result;

pub use args::{Cli, Cmd};

/// Runs one parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Train(a) => train::train(a),
        Cmd::Presets { stages } => presets::presets(stages),
    }
}
