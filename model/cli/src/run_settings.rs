//! What `iota train` keeps in its run directory, and the checks that stop
//! it from mixing two runs: a new run refuses a directory holding another
//! one (`--new-run` archives it), and `--resume` refuses flags that
//! contradict the checkpoint and a corpus other than the one it trained on.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use iota_model::data::CorpusId;
use iota_model::run_dir;
use iota_model::train::TrainConfig;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::args::TrainArgs;

/// Files of an `iota train` run inside its directory (besides `run.json`).
pub const RUN_FILES: &[&str] = &["loss.csv", "LATEST", "ckpt-*"];

/// The corpus a run trains on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataSource {
    /// The file or folder it was loaded from (canonical); None for the
    /// generated toy corpus.
    pub path: Option<PathBuf>,
    pub id: CorpusId,
}

/// The settings that define a run. `steps` is left out: `--resume --steps`
/// may extend a run (the LR schedule's length, `schedule.total`, stays).
pub fn settings(cfg: &TrainConfig, data: &DataSource) -> Result<Value> {
    let mut config = serde_json::to_value(cfg)?;
    if let Value::Object(m) = &mut config {
        m.remove("steps");
    }
    Ok(serde_json::json!({ "config": config, "data": data }))
}

/// The corpus recorded in a run directory's settings, if any.
pub fn recorded_data(run_dir: &Path) -> Result<Option<DataSource>> {
    let Some(v) = run_dir::read_settings(run_dir)? else { return Ok(None) };
    let data = v.get("data").cloned().context("run.json has no data entry")?;
    Ok(Some(serde_json::from_value(data).context("run.json's data entry is malformed")?))
}

/// The run directory a `--resume PATH` belongs to: PATH itself when it is a
/// run directory, the checkpoint folder's parent otherwise.
pub fn run_dir_of(resume: &Path) -> PathBuf {
    if resume.join("LATEST").exists() {
        resume.to_path_buf()
    } else {
        resume.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }
}

/// On `--resume`, every run-defining flag given on the command line must
/// agree with the checkpoint; returns the disagreements as one error.
pub fn check_resume_flags(a: &TrainArgs, ckpt: &TrainConfig) -> Result<()> {
    let run_defining = [
        "config",
        "tokenizer",
        "batch",
        "seq",
        "grad_accum",
        "lr",
        "warmup",
        "min_lr_ratio",
        "weight_decay",
        "grad_clip",
        "optimizer",
        "stages",
        "codec",
        "bottleneck",
        "bottleneck_style",
        "seed",
    ];
    if !a.explicit.iter().any(|f| run_defining.contains(&f.as_str())) {
        return Ok(());
    }
    let want = a.train_config().context("the flags given with --resume")?;
    let mut conflicts = Vec::new();
    for flag in a.explicit.iter().filter(|f| run_defining.contains(&f.as_str())) {
        let (given, saved) = match flag.as_str() {
            "config" => (want.model.name.clone(), ckpt.model.name.clone()),
            "tokenizer" => (want.tokenizer.name().into(), ckpt.tokenizer.name().into()),
            "batch" => (want.batch.to_string(), ckpt.batch.to_string()),
            "seq" => (want.seq.to_string(), ckpt.seq.to_string()),
            "grad_accum" => (want.grad_accum.to_string(), ckpt.grad_accum.to_string()),
            "lr" => (want.schedule.peak.to_string(), ckpt.schedule.peak.to_string()),
            "warmup" => (want.schedule.warmup.to_string(), ckpt.schedule.warmup.to_string()),
            "min_lr_ratio" => (want.schedule.min_ratio.to_string(), ckpt.schedule.min_ratio.to_string()),
            "weight_decay" => (want.adamw.weight_decay.to_string(), ckpt.adamw.weight_decay.to_string()),
            "grad_clip" => (want.adamw.grad_clip.to_string(), ckpt.adamw.grad_clip.to_string()),
            "optimizer" => (want.adamw.optimizer_name().into(), ckpt.adamw.optimizer_name().into()),
            "stages" => (want.stages.to_string(), ckpt.stages.to_string()),
            "codec" => (want.codec.name().into(), ckpt.codec.name().into()),
            "bottleneck" => (want.model.bottleneck.to_string(), ckpt.model.bottleneck.to_string()),
            "bottleneck_style" => {
                (want.model.bottleneck_style.name().into(), ckpt.model.bottleneck_style.name().into())
            }
            "seed" => (want.seed.to_string(), ckpt.seed.to_string()),
            _ => continue,
        };
        // A preset name can match while the shape differs (a JSON config).
        let differs = given != saved || (flag == "config" && want.model != ckpt.model);
        if differs {
            conflicts.push(format!("--{} {given} (the checkpoint has {saved})", flag.replace('_', "-")));
        }
    }
    if conflicts.is_empty() {
        return Ok(());
    }
    bail!(
        "--resume continues a run with its own settings; these flags contradict it: {}. Drop them, or start a new run (another --out, or --new-run)",
        conflicts.join(", ")
    )
}
