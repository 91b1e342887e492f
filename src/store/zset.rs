//! A sorted set: members ordered by (score, member).

/// A sorted set.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ZSet {
    items: Vec<(f64, Vec<u8>)>,
}

// Scores are never NaN (the commands refuse one), so equality is total.
impl Eq for ZSet {}

impl ZSet {
    pub fn new() -> ZSet {
        ZSet::default()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn encoding(&self) -> &'static str {
        "listpack"
    }

    pub fn mem(&self) -> usize {
        self.items.iter().map(|(_, m)| m.len() + 16).sum()
    }

    pub fn to_owned_pairs(&self) -> Vec<(Vec<u8>, u64)> {
        self.items
            .iter()
            .map(|(s, m)| (m.clone(), s.to_bits()))
            .collect()
    }

    pub fn from_owned_pairs(pairs: &[(Vec<u8>, u64)]) -> ZSet {
        ZSet {
            items: pairs
                .iter()
                .map(|(m, s)| (f64::from_bits(*s), m.clone()))
                .collect(),
        }
    }
}
