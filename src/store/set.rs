//! A set of members.

/// A set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberSet {
    members: Vec<Vec<u8>>,
}

impl MemberSet {
    pub fn new() -> MemberSet {
        MemberSet::default()
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    pub fn encoding(&self) -> &'static str {
        "hashtable"
    }

    pub fn mem(&self) -> usize {
        self.members.iter().map(|m| m.len() + 8).sum()
    }

    pub fn to_owned_members(&self) -> Vec<Vec<u8>> {
        self.members.clone()
    }

    pub fn from_owned_members(members: &[Vec<u8>]) -> MemberSet {
        MemberSet {
            members: members.to_vec(),
        }
    }
}
