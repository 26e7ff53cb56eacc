//! `iota-miner`: the daemon a GPU owner runs (see `iota-miner --help`).

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    iota_dataplane::init_logging();
    if let Err(e) = iota_dataplane::commands::run(iota_dataplane::commands::Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
