//! The run a command starts or resumes: its configuration from the flags
//! (and the prepared corpus in its store), the run directory claimed for it.

use anyhow::Result;

use crate::cli::RunArgs;

/// The run's configuration (its corpus from the run's store with
/// `--prepared-data`: the bucket, else RUN_DIR/store), the run directory
/// claimed for it.
pub async fn claimed_config(
    run: &RunArgs,
    bucket: Option<&crate::s3_store::S3Store>,
) -> Result<iota_protocol::RunConfig> {
    let cfg = match bucket {
        Some(b) => run.run_config_from_store(b).await?,
        None if run.prepared_data => {
            let dir = iota_dataplane::local_store::LocalDirStore::open(
                run.store_dir()?,
                iota_dataplane::fileio::FileIo::start(false),
            )?;
            run.run_config_from_store(&dir).await?
        }
        None => run.run_config()?,
    };
    for note in [run.optimizer_note(&cfg), run.stage_note(&cfg)].into_iter().flatten() {
        eprintln!("{note}");
    }
    eprintln!("{}", run.schedule_note(&cfg)?);
    run.claim_run_dir(&cfg)?;
    if run.prepared_data && bucket.is_none() {
        // A new run in a directory that held another moves the old store
        // aside, and the corpus prepared in it with it.
        let manifest = run.store_dir()?.join(iota_dataplane::prepared_corpus::MANIFEST_KEY);
        anyhow::ensure!(
            manifest.exists(),
            "the prepared corpus left {} with the previous run's store (see the note above): prepare it again",
            run.store_dir()?.display()
        );
    }
    Ok(cfg)
}
