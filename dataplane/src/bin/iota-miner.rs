//! `iota-miner`: the daemon a GPU owner runs (see `iota-miner --help`).

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A stage step frees and reallocates the same activations every
    // micro-batch, and a merge the same slices every epoch: keep the pages.
    iota_model::alloc::keep_freed_memory();
    let cli = iota_dataplane::commands::Cli::parse();
    iota_dataplane::init_logging_as(cli.log_format, "info");
    if let Err(e) = iota_dataplane::commands::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
