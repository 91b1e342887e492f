//! A list: elements from head to tail.

/// A list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct List {
    items: std::collections::VecDeque<Vec<u8>>,
}

impl List {
    pub fn new() -> List {
        List::default()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn encoding(&self) -> &'static str {
        "quicklist"
    }

    pub fn mem(&self) -> usize {
        self.items.iter().map(|m| m.len() + 8).sum()
    }

    pub fn to_owned_items(&self) -> Vec<Vec<u8>> {
        self.items.iter().cloned().collect()
    }

    pub fn from_owned_items(items: &[Vec<u8>]) -> List {
        List {
            items: items.iter().cloned().collect(),
        }
    }
}
