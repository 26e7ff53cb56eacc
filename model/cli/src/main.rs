//! `iota`: single-process training and model tools (see `iota --help`).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    iota_model::alloc::keep_freed_memory();
    if let Err(e) = iota_cli::run(iota_cli::parse(std::env::args_os())) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
