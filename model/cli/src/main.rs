//! `iota`: single-process training and model tools (see `iota --help`).

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    iota_model::alloc::keep_freed_memory();
    if let Err(e) = iota_cli::run(iota_cli::Cli::parse()) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
