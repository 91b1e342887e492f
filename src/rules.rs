//! Named limit rules: loaded from a TOML file, changed at run time, hot-reloaded.
//!
//! Connections read the current set through an `ArcSwap`, so resolving a rule on the hot path
//! takes no lock; a change publishes a whole new set.
//!
//! File format:
//! ```toml
//! [rules]
//! api = "100/1m"
//! login = "sliding:5/1m"
//! burst = "gcra:10/1s:50"
//! search = "shadow:20/1s"   # decided and counted, never refused
//! ```
//!
//! A rule in shadow mode (its spec starts with `shadow:`) is decided and counted like any
//! other, and its checks are answered as allowed: a way to see what a new limit would refuse
//! before it refuses anything.

use crate::limiter::{Rule, parse_spec};
use crate::sync::lock;
use ahash::AHashMap;
use arc_swap::ArcSwap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A named rule, and whether it is in shadow mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedRule {
    pub rule: Rule,
    pub shadow: bool,
}

/// The prefix of a rule spec that puts the rule in shadow mode.
const SHADOW: &str = "shadow:";

impl NamedRule {
    /// Parses a named rule's spec: a limit spec, optionally prefixed with `shadow:`.
    pub fn parse(spec: &str) -> Result<NamedRule, crate::limiter::RuleError> {
        let spec = spec.trim();
        let (shadow, spec) = match spec.get(..SHADOW.len()) {
            Some(p) if p.eq_ignore_ascii_case(SHADOW) => (true, &spec[SHADOW.len()..]),
            _ => (false, spec),
        };
        Ok(NamedRule {
            rule: parse_spec(spec)?,
            shadow,
        })
    }
}

impl std::fmt::Display for NamedRule {
    /// The canonical spec, with `shadow:` in front for a rule in shadow mode.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.shadow {
            f.write_str(SHADOW)?;
        }
        self.rule.fmt(f)
    }
}

/// One immutable set of rules.
#[derive(Debug, Default, Clone)]
pub struct RuleSet {
    rules: AHashMap<String, NamedRule>,
}

impl RuleSet {
    pub fn get(&self, name: &str) -> Option<&Rule> {
        self.rules.get(name).map(|r| &r.rule)
    }

    /// The rule with its mode.
    pub fn named(&self, name: &str) -> Option<&NamedRule> {
        self.rules.get(name)
    }

    /// Whether `name` is a rule in shadow mode.
    pub fn is_shadow(&self, name: &[u8]) -> bool {
        std::str::from_utf8(name)
            .ok()
            .and_then(|n| self.rules.get(n))
            .is_some_and(|r| r.shadow)
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Every rule as its spec, by name.
    pub fn specs(&self) -> std::collections::BTreeMap<String, String> {
        self.rules
            .iter()
            .map(|(k, r)| (k.clone(), r.to_string()))
            .collect()
    }

    /// Rules sorted by name.
    pub fn sorted(&self) -> Vec<(&str, &NamedRule)> {
        let mut v: Vec<_> = self.rules.iter().map(|(k, r)| (k.as_str(), r)).collect();
        v.sort_by(|a, b| a.0.cmp(b.0));
        v
    }

    /// Parses a rules file's text. Every rule must be valid, or the whole file is rejected.
    pub fn parse_toml(text: &str) -> Result<RuleSet, RulesError> {
        let doc: toml::Table = text.parse().map_err(RulesError::Toml)?;
        let mut rules = AHashMap::new();
        let Some(section) = doc.get("rules") else {
            return Ok(RuleSet { rules });
        };
        let table = section.as_table().ok_or(RulesError::NotATable)?;
        for (name, v) in table {
            validate_name(name)?;
            let spec = v
                .as_str()
                .ok_or_else(|| RulesError::NotAString(name.clone()))?;
            let rule = NamedRule::parse(spec).map_err(|error| RulesError::BadSpec {
                name: name.clone(),
                error,
            })?;
            rules.insert(name.clone(), rule);
        }
        Ok(RuleSet { rules })
    }
}

/// Why a rules file, or a rule given at run time, was refused. Its text is what operators and
/// clients are shown.
#[derive(Debug)]
pub enum RulesError {
    /// The file is not TOML.
    Toml(toml::de::Error),
    /// `rules` is there but is not a table.
    NotATable,
    /// A rule's value is not a string.
    NotAString(String),
    /// A rule's spec does not parse.
    BadSpec {
        name: String,
        error: crate::limiter::RuleError,
    },
    /// A rule's name could be taken for an inline spec, or is not printable.
    BadName(String),
    /// The file could not be read.
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A reload was asked for, and the node has no rules file.
    NoFile,
}

impl std::fmt::Display for RulesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RulesError::Toml(e) => write!(f, "invalid TOML: {e}"),
            RulesError::NotATable => f.write_str("'rules' must be a table"),
            RulesError::NotAString(name) => {
                write!(f, "rule '{name}': expected a string like \"100/1m\"")
            }
            RulesError::BadSpec { name, error } => write!(f, "rule '{name}': {error}"),
            RulesError::BadName(name) => write!(
                f,
                "invalid rule name '{name}': 1-128 printable characters, no spaces or '/'"
            ),
            RulesError::Read { path, error } => {
                write!(f, "cannot read rules file {}: {error}", path.display())
            }
            RulesError::NoFile => f.write_str("no rules file configured"),
        }
    }
}

impl std::error::Error for RulesError {}

/// A rule name must not look like an inline spec (no '/') and must be printable.
pub(crate) fn validate_name(name: &str) -> Result<(), RulesError> {
    if name.is_empty()
        || name.len() > 128
        || name.contains('/')
        || name.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(RulesError::BadName(name.to_string()));
    }
    Ok(())
}

/// The live rules of a node, and the file they come from.
pub struct RuleStore {
    current: ArcSwap<RuleSet>,
    file: Option<PathBuf>,
    /// Serialises writers (admin commands and the reloader); readers never take it.
    write: Mutex<Watch>,
}

/// What a reloader knows of a watched file: the content last applied (or rejected), and a
/// change seen on the previous poll that is waiting to settle.
#[derive(Default)]
pub(crate) struct Watch {
    applied: Option<u64>,
    pending: Option<u64>,
}

impl Watch {
    /// Starts from content already in force.
    pub(crate) fn applied(hash: u64) -> Watch {
        Watch {
            applied: Some(hash),
            pending: None,
        }
    }

    /// Notes content read now (as applied, or about to be).
    pub(crate) fn set_applied(&mut self, hash: u64) {
        self.pending = None;
        self.applied = Some(hash);
    }

    /// Takes the content seen on one poll: true when it differs from what was applied and
    /// was the same on the previous poll too, so a file caught half-written (which may well
    /// parse, with rules missing) is not applied. It then counts as applied, whether or not it
    /// turns out valid, so a bad file is reported once.
    pub(crate) fn settled_change(&mut self, hash: u64) -> bool {
        if self.applied == Some(hash) {
            self.pending = None;
            return false;
        }
        if self.pending != Some(hash) {
            self.pending = Some(hash);
            return false;
        }
        self.set_applied(hash);
        true
    }
}

/// Identifies a version of a file by its content, so a rewrite is noticed even when its size
/// and modification time do not change.
pub(crate) fn content_hash(text: &str) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = ahash::RandomState::with_seeds(1, 2, 3, 4).build_hasher();
    h.write(text.as_bytes());
    h.finish()
}

pub(crate) fn read_file(path: &Path) -> Result<String, RulesError> {
    std::fs::read_to_string(path).map_err(|error| RulesError::Read {
        path: path.to_path_buf(),
        error,
    })
}

impl RuleStore {
    /// Loads the file if one is given; a bad file at startup is an error.
    pub fn open(file: Option<PathBuf>) -> Result<RuleStore, RulesError> {
        let mut watch = Watch::default();
        let set = match &file {
            Some(p) => {
                let text = read_file(p)?;
                watch = Watch::applied(content_hash(&text));
                RuleSet::parse_toml(&text)?
            }
            None => RuleSet::default(),
        };
        Ok(RuleStore {
            current: ArcSwap::from_pointee(set),
            file,
            write: Mutex::new(watch),
        })
    }

    pub fn load(&self) -> arc_swap::Guard<Arc<RuleSet>> {
        self.current.load()
    }

    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    fn modify(&self, f: impl FnOnce(&mut RuleSet)) {
        let _w = lock(&self.write);
        let mut next = RuleSet::clone(&self.current.load());
        f(&mut next);
        self.current.store(Arc::new(next));
    }

    pub fn set(&self, name: &str, rule: NamedRule) -> Result<(), RulesError> {
        validate_name(name)?;
        self.modify(|s| {
            s.rules.insert(name.to_string(), rule);
        });
        Ok(())
    }

    /// Puts the cluster's rules in force, in place of this node's own: specs that do not
    /// parse are left out (and said so).
    pub fn replace_with(&self, specs: &std::collections::BTreeMap<String, String>) {
        let mut rules = AHashMap::new();
        for (name, spec) in specs {
            match NamedRule::parse(spec) {
                Ok(r) => {
                    rules.insert(name.clone(), r);
                }
                Err(e) => tracing::warn!(rule = %name, "a cluster rule does not parse: {e}"),
            }
        }
        let _w = lock(&self.write);
        self.current.store(Arc::new(RuleSet { rules }));
    }

    pub fn remove(&self, name: &str) -> bool {
        let mut removed = false;
        self.modify(|s| removed = s.rules.remove(name).is_some());
        removed
    }

    /// Re-reads the rules file now. On error the old rules stay in force and the error is
    /// returned.
    pub fn reload(&self) -> Result<usize, RulesError> {
        let Some(path) = &self.file else {
            return Err(RulesError::NoFile);
        };
        let mut w = lock(&self.write);
        let text = read_file(path)?;
        w.set_applied(content_hash(&text));
        let set = RuleSet::parse_toml(&text)?;
        let n = set.len();
        self.current.store(Arc::new(set));
        Ok(n)
    }

    /// Called periodically: reloads once the file has changed and then stayed the same for one
    /// more poll, so a file caught half-written (which may well parse, with rules missing) is
    /// not applied. `Ok(None)` when there is nothing to apply.
    pub fn reload_if_changed(&self) -> Result<Option<usize>, RulesError> {
        let Some(path) = &self.file else {
            return Ok(None);
        };
        let Ok(text) = read_file(path) else {
            // A file being replaced may be briefly missing; the next poll sees it again.
            return Ok(None);
        };
        let mut w = lock(&self.write);
        if !w.settled_change(content_hash(&text)) {
            return Ok(None);
        }
        // Settled: apply it, or report it once and keep the rules in force.
        let set = RuleSet::parse_toml(&text)?;
        let n = set.len();
        self.current.store(Arc::new(set));
        Ok(Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_whole_files() {
        let ok =
            RuleSet::parse_toml("[rules]\napi = \"100/1m\"\nlogin = \"sliding:5/1m\"\n").unwrap();
        assert_eq!(ok.len(), 2);
        assert_eq!(ok.get("api").map(|r| r.limit), Some(100));
        assert!(RuleSet::parse_toml("[rules]\napi = \"100/1m\"\nbad = \"x/y\"\n").is_err());
        assert!(RuleSet::parse_toml("[rules]\n\"a/b\" = \"1/1s\"\n").is_err());
        assert!(RuleSet::parse_toml("[rules\n").is_err());
        assert!(RuleSet::parse_toml("").unwrap().is_empty());
        let s = RuleSet::parse_toml("[rules]\nsoft = \"shadow:5/1s\"\nhard = \"5/1s\"\n").unwrap();
        assert!(s.is_shadow(b"soft") && !s.is_shadow(b"hard") && !s.is_shadow(b"none"));
        assert_eq!(s.specs()["soft"], "shadow:gcra:5/1000ms:5");
    }
}
