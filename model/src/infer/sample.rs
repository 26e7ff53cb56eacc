//! Picking the next token from logits: temperature, top-k, top-p (nucleus),
//! from a seeded generator so a fixed seed gives a fixed text.

use iota_core::Rng;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// 0 = greedy (always the most likely token).
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability
    /// reaches p (1 = all).
    pub top_p: f32,
}

impl Default for SamplerConfig {
    /// The exported `generation_config.json`'s defaults.
    fn default() -> Self {
        SamplerConfig { temperature: 0.8, top_k: 40, top_p: 0.95 }
    }
}

impl SamplerConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!("temperature {} must be a number >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p {} must be in (0, 1]", self.top_p));
        }
        Ok(())
    }
}

/// The next token.
pub fn sample(logits: &[f32], c: &SamplerConfig, rng: &mut Rng) -> u32 {
    let argmax = || {
        logits.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0
            as u32
    };
    if c.temperature == 0.0 || logits.len() <= 1 {
        return argmax();
    }
    // Candidates by descending logit (ties by id: deterministic).
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    if c.top_k > 0 {
        order.truncate(c.top_k);
    }
    let max = logits[order[0]];
    let mut probs: Vec<f64> = order.iter().map(|&i| (((logits[i] - max) / c.temperature) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    probs.iter_mut().for_each(|p| *p /= total);
    let mut cum = 0.0;
    let mut keep = probs.len();
    for (i, p) in probs.iter().enumerate() {
        cum += p;
        if cum >= c.top_p as f64 {
            keep = i + 1;
            break;
        }
    }
    let mass: f64 = probs[..keep].iter().sum();
    let mut r = rng.next_f64() * mass;
    for (i, p) in probs[..keep].iter().enumerate() {
        r -= p;
        if r < 0.0 {
            return order[i] as u32;
        }
    }
    order[keep - 1] as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_top_k_and_top_p() {
        let logits = [0.0f32, 3.0, 1.0, 2.9, -5.0];
        let mut rng = Rng::new(1);
        let greedy = SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0 };
        assert_eq!(sample(&logits, &greedy, &mut rng), 1);
        // top-k 2 only ever yields the two best.
        let k2 = SamplerConfig { temperature: 1.0, top_k: 2, top_p: 1.0 };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            seen.insert(sample(&logits, &k2, &mut rng));
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), vec![1, 3]);
        // A tiny top-p keeps only the best.
        let p = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 0.01 };
        assert!((0..50).all(|_| sample(&logits, &p, &mut rng) == 1));
        // With everything allowed, frequencies follow softmax: token 4 is rare, 1 and 3 common.
        let all = SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0 };
        let mut counts = [0usize; 5];
        for _ in 0..4000 {
            counts[sample(&logits, &all, &mut rng) as usize] += 1;
        }
        assert!(counts[1] > counts[2] && counts[3] > counts[2] && counts[2] > counts[0], "{counts:?}");
        assert!(counts[4] < 20, "{counts:?}");
        // The same seed gives the same draws.
        let draw = |s| {
            let mut r = Rng::new(s);
            (0..20).map(|_| sample(&logits, &all, &mut r)).collect::<Vec<_>>()
        };
        assert_eq!(draw(9), draw(9));
        assert_ne!(draw(9), draw(10));
        assert!(SamplerConfig { temperature: -1.0, ..all.clone() }.validate().is_err());
        assert!(SamplerConfig { top_p: 0.0, ..all }.validate().is_err());
    }
}
