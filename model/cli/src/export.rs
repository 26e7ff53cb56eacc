//! `iota export`: a model as a Hugging Face Llama folder.

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use iota_model::hf::{ExportDtype, ExportOptions, ModelWeights, export as write};

use crate::args::ExportArgs;

/// A byte progress bar for long writes (hidden when stderr is not a terminal).
pub fn bytes_bar(what: &str) -> ProgressBar {
    let bar =
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) { ProgressBar::new(0) } else { ProgressBar::hidden() };
    if let Ok(style) = ProgressStyle::with_template(&format!("{what} [{{bar:30}}] {{bytes}}/{{total_bytes}}")) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// `iota export`.
pub fn export(a: ExportArgs) -> Result<()> {
    let dtype = ExportDtype::parse(&a.dtype).with_context(|| format!("unknown --dtype '{}' (f32, bf16)", a.dtype))?;
    // Refuse a taken destination before the (possibly long) load.
    iota_model::hf::export::check_destination(&a.out)?;
    let w = ModelWeights::load(&a.model)?;
    let opts = ExportOptions { dtype, max_shard_bytes: a.max_shard_mb.max(1) * 1_000_000 };
    let bar = bytes_bar("writing");
    let e = write(&w, &a.out, &opts, &mut |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    println!(
        "exported {} ({:.1}M parameters, {}) to {}: {} file(s), {:.1} MB of weights in {} shard(s)",
        w.train.model.name,
        w.param_count() as f64 / 1e6,
        dtype.torch_name(),
        e.dir.display(),
        e.files.len(),
        e.weight_bytes as f64 / 1e6,
        e.shards
    );
    if w.has_bottleneck() {
        println!(
            "note: the model has a bottleneck between stages; see {}/README.md before loading it elsewhere",
            e.dir.display()
        );
    }
    Ok(())
}
