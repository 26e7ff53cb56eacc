//! A generated, learnable corpus: sentences from a small grammar. Tests use
//! it instead of downloaded text.

use iota_core::Rng;

const SUBJECTS: &[&str] =
    &["the cat", "a dog", "the old man", "my sister", "the bird", "a child", "the king", "our teacher"];
const VERBS: &[&str] = &["sees", "likes", "finds", "follows", "paints", "helps", "calls", "keeps"];
const OBJECTS: &[&str] =
    &["the red ball", "a small house", "the river", "an apple", "the green door", "a long road", "the moon", "a song"];
const ENDINGS: &[&str] = &[".", " today.", " again.", " at night."];

/// About `bytes` bytes of sentences, the same for the same seed.
pub fn grammar_text(seed: u64, bytes: usize) -> String {
    let mut rng = Rng::new(seed);
    let mut s = String::with_capacity(bytes + 64);
    let pick = |rng: &mut Rng, xs: &[&'static str]| xs[rng.below(xs.len() as u64) as usize];
    while s.len() < bytes {
        s.push_str(pick(&mut rng, SUBJECTS));
        s.push(' ');
        s.push_str(pick(&mut rng, VERBS));
        s.push(' ');
        s.push_str(pick(&mut rng, OBJECTS));
        s.push_str(pick(&mut rng, ENDINGS));
        s.push('\n');
    }
    s
}
