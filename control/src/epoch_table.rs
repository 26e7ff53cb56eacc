//! The swarm's closing table of epochs: a row per epoch, or for a run of
//! many short epochs (`--schedule loss` gives `small`'s demo 72) a row per
//! group of consecutive epochs, so that the table stays readable.

use iota_core::PeerId;

use crate::orchestrator::EpochSummary;

/// Rows the table prints at most.
pub const MAX_ROWS: usize = 24;

/// One row: epochs `first..=last`.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochRow {
    pub first: u64,
    pub last: u64,
    /// Mean loss of the counted micro-batches of these epochs (each epoch's
    /// mean weighted by the micro-batches it counted); NaN if none counted.
    pub mean_loss: f32,
    pub completed: u64,
    pub dropped: u64,
    /// Miners convicted in any of these epochs, once each.
    pub convicted: Vec<PeerId>,
    /// Epochs whose merge the validators rolled back.
    pub rolled_back: u64,
}

/// The history in at most `max_rows` rows of equally many epochs (the last
/// row may hold fewer).
pub fn epoch_rows(history: &[EpochSummary], max_rows: usize) -> Vec<EpochRow> {
    let per_row = history.len().div_ceil(max_rows.max(1)).max(1);
    history
        .chunks(per_row)
        .map(|group| {
            let (mut weighted, mut counted) = (0f64, 0u64);
            let mut convicted: Vec<PeerId> = Vec::new();
            for e in group {
                let n = e.completed.saturating_sub(e.excluded);
                if n > 0 && e.mean_loss.is_finite() {
                    weighted += e.mean_loss as f64 * n as f64;
                    counted += n;
                }
                for p in &e.convicted {
                    if !convicted.contains(p) {
                        convicted.push(*p);
                    }
                }
            }
            EpochRow {
                first: group[0].epoch,
                last: group[group.len() - 1].epoch,
                mean_loss: if counted > 0 { (weighted / counted as f64) as f32 } else { f32::NAN },
                completed: group.iter().map(|e| e.completed).sum(),
                dropped: group.iter().map(|e| e.dropped).sum(),
                convicted,
                rolled_back: group.iter().filter(|e| e.rolled_back).count() as u64,
            }
        })
        .collect()
}

/// The table as `print_summary` prints it, a line each.
pub fn epoch_table(history: &[EpochSummary]) -> Vec<String> {
    let rows = epoch_rows(history, MAX_ROWS);
    let grouped = rows.len() < history.len();
    let mut lines = Vec::with_capacity(rows.len() + 2);
    if grouped {
        lines.push(format!(
            "{} epochs, {} to a row (losses: the mean over the row's micro-batches)",
            history.len(),
            history.len().div_ceil(rows.len().max(1))
        ));
    }
    lines.push(format!(
        "{:>7} {:>10} {:>10} {:>8} {:>10}",
        if grouped { "epochs" } else { "epoch" },
        "mean loss",
        "completed",
        "dropped",
        "convicted"
    ));
    for r in rows {
        let epochs = if r.first == r.last { r.first.to_string() } else { format!("{}-{}", r.first, r.last) };
        let convicted: Vec<String> = r.convicted.iter().map(|p| p.to_hex()[..8].to_string()).collect();
        let convicted = if convicted.is_empty() { "-".to_string() } else { convicted.join(",") };
        let rolled = match r.rolled_back {
            0 => String::new(),
            1 if !grouped => "  (merge rolled back)".to_string(),
            n => format!("  ({n} merges rolled back)"),
        };
        lines.push(format!(
            "{epochs:>7} {:>10.4} {:>10} {:>8} {convicted:>10}{rolled}",
            r.mean_loss, r.completed, r.dropped
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epoch(epoch: u64, mean_loss: f32, completed: u64) -> EpochSummary {
        EpochSummary { epoch, mean_loss, completed, ..EpochSummary::default() }
    }

    #[test]
    fn a_short_run_keeps_a_row_per_epoch() {
        let h: Vec<_> = (0..6).map(|e| epoch(e, 10.0 - e as f32, 48)).collect();
        let rows = epoch_rows(&h, MAX_ROWS);
        assert_eq!(rows.len(), 6);
        assert_eq!((rows[5].first, rows[5].last, rows[5].mean_loss, rows[5].completed), (5, 5, 5.0, 48));
        let lines = epoch_table(&h);
        assert!(lines[0].trim_start().starts_with("epoch "), "{lines:?}");
        assert_eq!(lines.len(), 7);
    }

    #[test]
    fn many_epochs_are_grouped_with_their_losses_weighted_and_their_convictions_kept() {
        let mut h: Vec<_> = (0..72).map(|e| epoch(e, 5.0, 4)).collect();
        // An epoch with one micro-batch counted weighs a quarter of one
        // with four; an epoch with none counts nothing.
        h[1] = epoch(1, 9.0, 1);
        h[2] = EpochSummary { dropped: 4, ..epoch(2, f32::NAN, 0) };
        let cheat = PeerId([7; 32]);
        h[40].convicted = vec![cheat];
        h[41].convicted = vec![cheat];
        h[41].rolled_back = true;
        let rows = epoch_rows(&h, MAX_ROWS);
        assert_eq!(rows.len(), 24, "72 epochs, 3 to a row");
        assert_eq!((rows[0].first, rows[0].last, rows[0].completed, rows[0].dropped), (0, 2, 5, 4));
        assert!((rows[0].mean_loss - (5.0 * 4.0 + 9.0) / 5.0).abs() < 1e-6, "{}", rows[0].mean_loss);
        assert_eq!(
            (rows[13].first, rows[13].last, &rows[13].convicted, rows[13].rolled_back),
            (39, 41, &vec![cheat], 1)
        );
        assert_eq!(rows.iter().map(|r| r.completed).sum::<u64>(), h.iter().map(|e| e.completed).sum::<u64>());
        let lines = epoch_table(&h);
        assert!(lines[0].starts_with("72 epochs, 3 to a row"), "{lines:?}");
        assert!(lines[15].contains("39-41") && lines[15].contains("07070707"), "{}", lines[15]);
        // 73 epochs: 4 to a row, the last row the one left over.
        h.push(epoch(72, 4.0, 4));
        let rows = epoch_rows(&h, MAX_ROWS);
        assert_eq!((rows.len(), rows[18].first, rows[18].last), (19, 72, 72));
    }
}
