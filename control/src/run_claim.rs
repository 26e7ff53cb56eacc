//! The run a command starts or resumes: its configuration from the flags
//! (and the prepared corpus in its store), the run directory claimed for it.

use anyhow::Result;

use crate::cli::RunArgs;

/// The run's configuration (its corpus from the run's store with
/// `--prepared-data`: the bucket, else RUN_DIR/store), the run directory
/// claimed for it.
/// `serve_store`: with no bucket, the orchestrator serves RUN_DIR/store
/// itself (`StoreAccess::Served`), and a `--data` corpus is prepared into
/// it, so miners elsewhere need neither a directory nor a copy.
pub async fn claimed_config(
    run: &RunArgs,
    bucket: Option<&crate::s3_store::S3Store>,
    serve_store: bool,
) -> Result<iota_protocol::RunConfig> {
    let mut cfg = match bucket {
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
    if serve_store && bucket.is_none() {
        cfg.store = iota_protocol::run_config::StoreAccess::Served;
        cfg.corpus_in_store |= run.data.is_some();
    }
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
    if cfg.corpus_in_store && !run.prepared_data {
        prepare_into_run_store(run, &cfg).await?;
    }
    Ok(cfg)
}

/// Writes the run's `--data` corpus into RUN_DIR/store as `data prepare`
/// would, unless it is there already (a resumed run).
async fn prepare_into_run_store(run: &RunArgs, cfg: &iota_protocol::RunConfig) -> Result<()> {
    use iota_dataplane::prepared_corpus::{self, DEFAULT_CHUNK_TOKENS, MANIFEST_KEY, Manifest};
    use iota_protocol::ObjectStore;
    let Some(data) = run.data_path()? else { return Ok(()) };
    let dir = run.store_dir()?;
    let store = iota_dataplane::local_store::LocalDirStore::open(&dir, iota_dataplane::fileio::FileIo::start(false))?;
    if let Ok(bytes) = store.get(MANIFEST_KEY).await
        && Manifest::parse(&bytes).is_ok_and(|m| Some(&m.corpus) == cfg.corpus.as_ref())
    {
        return Ok(());
    }
    let tok = iota_model::data::Tokenizer::new(cfg.train.tokenizer)?;
    let tokens = iota_model::data::load_tokens(&data, &tok)?;
    let m = prepared_corpus::prepare(&store, &tokens, cfg.train.tokenizer, DEFAULT_CHUNK_TOKENS, |_| {}).await?;
    anyhow::ensure!(
        Some(&m.corpus) == cfg.corpus.as_ref(),
        "the corpus prepared from {} is not the one the run was configured with",
        data.display()
    );
    println!(
        "the corpus ({} tokens, {} chunks) is in the run's store: miners without a copy fetch it from there",
        m.corpus.tokens,
        m.chunks.len()
    );
    Ok(())
}
