//! The finished model: at the end of a run the orchestrator reads every
//! stage's merged weights from the store (each object checked against its
//! announcement, as any reader does), assembles them into one model and
//! exports it as a Hugging Face Llama folder in the run directory (and,
//! when the run keeps its objects in a bucket, under `model/` there too).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use iota_model::hf::{ExportOptions, ModelWeights, Provenance, RUN_MODEL_DIR, export};
use iota_protocol::{RunConfig, SharedStore};

use crate::service::OrchestratorService;

/// Object-store prefix of the exported model.
pub const MODEL_PREFIX: &str = "model/";

/// What `export_final_model` did.
pub enum FinalModel {
    /// Written into this folder.
    Written(PathBuf),
    /// The folder already holds this run's model (a finished run started again).
    AlreadyThere(PathBuf),
}

/// Reads the run's current merged weights and writes them to
/// `run_dir/model`. A folder there from an earlier state of the run is
/// moved aside to `model.prev-N` (never deleted).
pub async fn export_final_model(
    svc: &OrchestratorService,
    cfg: &RunConfig,
    store: &SharedStore,
    run_dir: &Path,
    upload: bool,
) -> Result<FinalModel> {
    let stages = cfg.train.stages as u32;
    let (epoch, objects, tokens) = svc.with_state(|o| {
        (o.weights_epoch(), (0..stages).map(|s| o.stage_weights(s)).collect::<Vec<_>>(), o.counters().tokens)
    });
    let Some(epoch) = epoch else { bail!("no epoch has merged yet: there is no trained model to export") };
    let trained_for = format!("{} epoch{}", epoch + 1, if epoch == 0 { "" } else { "s" });
    let dest = run_dir.join(RUN_MODEL_DIR);
    if let Ok(prev) = ModelWeights::load(&dest)
        && prev.provenance.trained_for.as_deref() == Some(trained_for.as_str())
        && prev.train == cfg.train
    {
        return Ok(FinalModel::AlreadyThere(dest));
    }
    let specs = iota_core::StageSpec::split(&cfg.train.model, cfg.train.stages)?;
    let mut weights = Vec::with_capacity(specs.len());
    for (s, spec) in specs.iter().enumerate() {
        let layout = iota_core::ParamLayout::for_stage(&cfg.train.model, spec);
        let (loaded, _bad) = iota_dataplane::miner::merge::load_weights(store, &objects[s], &layout).await;
        weights.push(loaded.with_context(|| format!("reading stage {s}'s merged weights from the store"))?);
    }
    let w = ModelWeights::from_stages(
        &cfg.train,
        &weights,
        Provenance { trained_for: Some(trained_for), tokens: Some(tokens) },
    )?;
    if dest.exists() {
        let aside = (1..)
            .map(|n| run_dir.join(format!("{RUN_MODEL_DIR}.prev-{n}")))
            .find(|p| !p.exists())
            .expect("an unused name");
        std::fs::rename(&dest, &aside)
            .with_context(|| format!("moving the earlier {} aside to {}", dest.display(), aside.display()))?;
        eprintln!("note: the earlier model in {} moved to {}", dest.display(), aside.display());
    }
    let dir = dest.clone();
    let e = tokio::task::spawn_blocking(move || export(&w, &dir, &ExportOptions::default(), &mut |_, _| {}))
        .await
        .context("the export task failed")??;
    if upload {
        for f in &e.files {
            let bytes = std::fs::read(e.dir.join(f)).with_context(|| format!("reading {}", e.dir.join(f).display()))?;
            store
                .put(&format!("{MODEL_PREFIX}{f}"), bytes)
                .await
                .with_context(|| format!("uploading {f} to the run's bucket"))?;
        }
    }
    Ok(FinalModel::Written(dest))
}

/// Exports a finished run's model from its store (the bucket, else the
/// store directory) into `run_dir/model`; the folder, or why there is none.
pub async fn export_for_run(
    svc: &OrchestratorService,
    cfg: &RunConfig,
    bucket: Option<std::sync::Arc<crate::s3_store::S3Store>>,
    store_dir: Option<&Path>,
    run_dir: &Path,
) -> std::result::Result<PathBuf, String> {
    let upload = bucket.is_some();
    let store: SharedStore = match (bucket, store_dir) {
        (Some(b), _) => b,
        (None, Some(dir)) => {
            iota_dataplane::local_store::LocalDirStore::shared(dir, iota_dataplane::fileio::FileIo::start(false))
                .map_err(|e| format!("opening the object store {}: {e}", dir.display()))?
        }
        (None, None) => return Err("the run has no object store".into()),
    };
    eprintln!("assembling the trained model from the stages' merged weights");
    match export_final_model(svc, cfg, &store, run_dir, upload).await {
        Ok(FinalModel::Written(p) | FinalModel::AlreadyThere(p)) => Ok(p),
        Err(e) => Err(format!("{e:#}")),
    }
}
