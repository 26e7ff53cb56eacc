//! `iota-control`: the run operator's tool (see `iota-control --help`).

use clap::Parser;
use iota_control::cli::expand_config_file;
use iota_control::commands::{Cli, run};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // Validators recompute stage work: the same buffers again and again.
    iota_model::alloc::keep_freed_memory();
    let args = match expand_config_file(std::env::args().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args);
    iota_dataplane::init_logging_as(cli.log_format, "warn");
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
