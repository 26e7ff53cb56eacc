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

/// What the run's state says of its current weights.
pub struct MergedWeights {
    /// The epoch whose merge they are (None: the seed's; nothing trained).
    pub epoch: Option<u64>,
    /// Each stage's stored objects.
    pub objects: Vec<Vec<iota_protocol::StoredObject>>,
    /// Training tokens so far.
    pub tokens: u64,
}

impl MergedWeights {
    pub fn of(o: &crate::orchestrator::Orchestrator, stages: u32) -> MergedWeights {
        MergedWeights {
            epoch: o.weights_epoch(),
            objects: (0..stages).map(|s| o.stage_weights(s)).collect(),
            tokens: o.counters().tokens,
        }
    }
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
    let merged = svc.with_state(|o| MergedWeights::of(o, cfg.train.stages as u32));
    export_merged(&merged, cfg, store, run_dir, upload).await
}

/// `export_final_model` from the state's account of the merged weights.
pub async fn export_merged(
    merged: &MergedWeights,
    cfg: &RunConfig,
    store: &SharedStore,
    run_dir: &Path,
    upload: bool,
) -> Result<FinalModel> {
    let (epoch, objects, tokens) = (merged.epoch, &merged.objects, merged.tokens);
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

/// `iota-control export --run-dir DIR`: the model of a run's current
/// merged weights, from its saved state and its store directory, without
/// the orchestrator running (or while it runs: the state is only read).
pub async fn export_run_dir(run_dir: &Path, state: Option<&crate::state_db::StateLocation>) -> Result<PathBuf> {
    let settings_path = run_dir.join(iota_model::run_dir::SETTINGS_FILE);
    let text = std::fs::read_to_string(&settings_path)
        .with_context(|| format!("reading {} (is {} a run directory?)", settings_path.display(), run_dir.display()))?;
    let settings: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} does not parse", settings_path.display()))?;
    if settings.get("bucket").is_some_and(|b| !b.is_null()) {
        bail!(
            "this run keeps its objects in a bucket: its orchestrator exports the model at the run's end (model/ \
             in the bucket and RUN_DIR/model); exporting from a bucket on demand is not supported yet"
        );
    }
    let cfg = crate::cli::config_from_settings(&settings)?;
    let default_state = crate::state_db::StateLocation::Sqlite(run_dir.join("state.sqlite"));
    let state = state.unwrap_or(&default_state);
    let loc = state.clone();
    let run_id = cfg.spec.run_id;
    let saved = tokio::task::spawn_blocking(move || crate::state_db::StateDb::open_at(&loc, run_id)?.load())
        .await
        .context("the state task failed")??
        .with_context(|| format!("no saved state of run {run_id} in {state:?}"))?;
    let merged = MergedWeights::of(&saved, cfg.train.stages as u32);
    let store_dir = run_dir.join("store");
    let store: SharedStore =
        iota_dataplane::local_store::LocalDirStore::shared(&store_dir, iota_dataplane::fileio::FileIo::start(false))
            .with_context(|| format!("opening the object store {}", store_dir.display()))?;
    match export_merged(&merged, &cfg, &store, run_dir, false).await? {
        FinalModel::Written(p) => Ok(p),
        FinalModel::AlreadyThere(p) => {
            eprintln!("{} already holds this state's model", p.display());
            Ok(p)
        }
    }
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
