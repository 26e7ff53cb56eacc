//! Maps with structured keys, saved as lists of pairs: JSON maps take only
//! string keys, and the orchestrator's state is saved as JSON (a map keyed
//! by a struct fails every save). Use as `#[serde(with = "crate::serde_pairs")]`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub fn serialize<K: Serialize, V: Serialize, S: Serializer>(m: &BTreeMap<K, V>, s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(m.iter())
}

pub fn deserialize<'de, K, V, D>(d: D) -> Result<BTreeMap<K, V>, D::Error>
where
    K: Deserialize<'de> + Ord,
    V: Deserialize<'de>,
    D: Deserializer<'de>,
{
    Ok(Vec::<(K, V)>::deserialize(d)?.into_iter().collect())
}
