//! Whether a finished swarm trained anything: a run whose every merge was
//! rolled back, or that left no model, must not look like a success (its
//! command exits non-zero and says why).

use std::collections::BTreeSet;
use std::path::PathBuf;

use iota_core::PeerId;

use crate::orchestrator::EpochSummary;

impl crate::swarm::SwarmReport {
    /// Why the swarm trained nothing, if it did not: no model came out of
    /// a run that was not interrupted, or every epoch's merge was rolled
    /// back (the model is the weights it started from).
    pub fn trained_nothing(&self) -> Option<String> {
        trained_nothing(&self.history, &self.model, self.interrupted)
    }
}

/// Why the swarm trained nothing, if it did not (None for a run the
/// operator interrupted: it resumes).
pub(crate) fn trained_nothing(
    history: &[EpochSummary],
    model: &std::result::Result<PathBuf, String>,
    interrupted: bool,
) -> Option<String> {
    if interrupted {
        return None;
    }
    let convicted: BTreeSet<PeerId> = history.iter().flat_map(|e| e.convicted.clone()).collect();
    let convictions = if convicted.is_empty() {
        String::new()
    } else {
        format!("; {} miners were convicted along the way (the log says why)", convicted.len())
    };
    if !history.is_empty() && history.iter().all(|e| e.rolled_back) {
        return Some(format!(
            "the validators rolled back every one of the {} epochs' merges{convictions}",
            history.len()
        ));
    }
    match model {
        Ok(_) => None,
        Err(why) if history.is_empty() => Some(format!("no epoch finished and no model was exported ({why})")),
        Err(why) => Some(format!("no model was exported ({why}){convictions}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(rolled_back: bool, convicted: Vec<PeerId>) -> EpochSummary {
        EpochSummary { rolled_back, convicted, ..EpochSummary::default() }
    }

    #[test]
    fn a_run_that_kept_no_merge_or_left_no_model_trained_nothing() {
        let model: Result<PathBuf, String> = Ok(PathBuf::from("runs/x/model"));
        let none: Result<PathBuf, String> = Err("stage 0: no stored weights".into());
        let ok = [epoch(true, vec![]), epoch(false, vec![])];
        assert_eq!(trained_nothing(&ok, &model, false), None, "one merge kept, a model: trained");
        let all_back = [epoch(true, vec![PeerId([1; 32])]), epoch(true, vec![PeerId([1; 32]), PeerId([2; 32])])];
        let why = trained_nothing(&all_back, &model, false).unwrap();
        assert!(why.contains("rolled back every one of the 2") && why.contains("2 miners were convicted"), "{why}");
        let why = trained_nothing(&ok, &none, false).unwrap();
        assert!(why.contains("no model was exported (stage 0: no stored weights)"), "{why}");
        assert!(trained_nothing(&[], &none, false).unwrap().contains("no epoch finished"));
        assert_eq!(trained_nothing(&all_back, &none, true), None, "interrupted: it resumes");
    }
}
