//! envoyproxy/ratelimit's configuration: YAML files of domains and descriptors, read from a file
//! or a directory, and how a request's descriptor finds its limit in them.
//!
//! The format is envoyproxy/ratelimit's, so an existing file loads unchanged:
//! ```yaml
//! domain: messaging
//! descriptors:
//!   - key: message_type
//!     value: marketing
//!     descriptors:
//!       - key: to_number
//!         rate_limit:
//!           unit: day
//!           requests_per_unit: 5
//!   - key: to_number
//!     rate_limit:
//!       unit: day
//!       requests_per_unit: 100
//!       algorithm: gcra      # bucketd's own key; envoyproxy's aligned window by default
//! ```
//! Keys it does not know are refused, as envoyproxy refuses them, and so is anything else it
//! would refuse (an empty key or domain, a bad unit, a unit on an unlimited limit, a descriptor
//! twice at one level, a domain in two files).

use crate::limiter::{Algorithm, Rule};
use ahash::AHashMap;
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// Envoy's `RateLimitResponse.RateLimit.Unit`, as the proto numbers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

impl Unit {
    /// Its length in seconds, as envoyproxy/ratelimit counts it (a month is 30 days, a year
    /// 365).
    pub(crate) fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The unit a proto number names; None for UNKNOWN or a number Envoy does not define.
    pub(crate) fn from_proto(n: i32) -> Option<Unit> {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Month,
            Unit::Year,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| *u as i32 == n)
    }

    fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

/// How a configured limit decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decide {
    /// `unlimited: true`: always OK, nothing counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit (a block list entry).
    Never,
    Rule(Rule),
}

/// One `rate_limit` block, where it sits in the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Limit {
    /// Its name in the metrics: the domain and the descriptor path, as envoyproxy names its
    /// stats (`messaging.message_type_marketing.to_number`).
    pub stat_key: String,
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub decide: Decide,
    pub shadow: bool,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    /// `detailed_metric`: a value matched by a key-only descriptor is added to the stat key.
    pub detailed_metric: bool,
}

impl Limit {
    /// A limit built from what a request's descriptor carries (`limit` override); never in
    /// shadow mode, as in envoyproxy.
    pub(crate) fn override_of(
        stat_key: String,
        requests_per_unit: u32,
        unit: Unit,
        algorithm: Algorithm,
    ) -> Limit {
        Limit {
            stat_key,
            requests_per_unit,
            unit,
            decide: decide_for(requests_per_unit, unit, algorithm),
            shadow: false,
            name: None,
            replaces: Vec::new(),
            detailed_metric: false,
        }
    }
}

fn decide_for(requests_per_unit: u32, unit: Unit, algorithm: Algorithm) -> Decide {
    let period_ns = unit.seconds() * 1_000_000_000;
    match Rule::new(algorithm, u64::from(requests_per_unit), period_ns, None) {
        Ok(rule) => Decide::Rule(rule),
        // Zero requests (the only way `new` can refuse these figures, short of a GCRA rate
        // beyond one per nanosecond, which a u32 per second cannot reach).
        Err(_) => Decide::Never,
    }
}

/// One level of a domain's descriptor tree, by key, so a request's entries are looked up
/// as the `&str`s they are, without building a key for each.
#[derive(Debug, Default)]
struct Level {
    keys: AHashMap<String, Choices>,
}

/// What one key matches at a level.
#[derive(Debug, Default)]
struct Choices {
    /// By exact value.
    values: AHashMap<String, Node>,
    /// The values in `values` that end in `*`, in file order.
    wildcards: Vec<String>,
    /// The key with no value: any value, one counter per value.
    default: Option<Node>,
}

#[derive(Debug, Default)]
struct Node {
    limit: Option<Arc<Limit>>,
    children: Level,
}

/// The configuration in force: every domain's descriptor tree.
#[derive(Debug, Default)]
pub(crate) struct RlsConfig {
    domains: AHashMap<String, Level>,
}

/// What a descriptor matched.
pub(crate) struct Matched {
    pub limit: Arc<Limit>,
    /// The stat key to count under (differs from the limit's own with `detailed_metric`).
    pub stat_key: Option<String>,
}

impl RlsConfig {
    pub(crate) fn domains(&self) -> usize {
        self.domains.len()
    }

    /// The limit a descriptor (its entries, in order) falls under, found as envoyproxy finds
    /// it: at each level the key and value first, then a wildcard value, then the key alone;
    /// a limit applies only when it sits at the descriptor's last entry.
    pub(crate) fn find(&self, domain: &str, entries: &[(&str, &str)]) -> Option<Matched> {
        let mut level = self.domains.get(domain)?;
        let mut found: Option<Matched> = None;
        for (i, &(key, value)) in entries.iter().enumerate() {
            let Some(choices) = level.keys.get(key) else {
                break;
            };
            let wild = || {
                choices
                    .wildcards
                    .iter()
                    .find(|w| value.starts_with(&w[..w.len() - 1]))
                    .and_then(|w| choices.values.get(w))
            };
            let (next, by_default) = match choices.values.get(value).or_else(wild) {
                Some(n) => (Some(n), false),
                None => (choices.default.as_ref(), true),
            };
            let Some(next) = next else { break };
            if i + 1 == entries.len()
                && let Some(limit) = &next.limit
            {
                let stat_key = (by_default && limit.detailed_metric)
                    .then(|| format!("{}_{value}", limit.stat_key));
                found = Some(Matched {
                    limit: limit.clone(),
                    stat_key,
                });
            }
            if next.children.keys.is_empty() {
                break;
            }
            level = &next.children;
        }
        found
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRoot {
    #[serde(default, deserialize_with = "scalar")]
    domain: String,
    #[serde(default, deserialize_with = "list")]
    descriptors: Vec<YamlDescriptor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlDescriptor {
    #[serde(default, deserialize_with = "scalar")]
    key: String,
    #[serde(default, deserialize_with = "scalar")]
    value: String,
    rate_limit: Option<YamlRateLimit>,
    #[serde(default, deserialize_with = "list")]
    descriptors: Vec<YamlDescriptor>,
    #[serde(default)]
    shadow_mode: bool,
    #[serde(default)]
    detailed_metric: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlRateLimit {
    #[serde(default)]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "scalar")]
    unit: String,
    #[serde(default)]
    unlimited: bool,
    #[serde(default, deserialize_with = "scalar")]
    name: String,
    #[serde(default, deserialize_with = "list")]
    replaces: Vec<YamlReplaces>,
    /// bucketd's own: `aligned` (the default, envoyproxy's window), `fixed`, `sliding` or
    /// `gcra`.
    #[serde(default, deserialize_with = "scalar")]
    algorithm: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct YamlReplaces {
    #[serde(default, deserialize_with = "scalar")]
    name: String,
}

/// A YAML scalar read as text, as envoyproxy's loader reads `value: 123` or `value: true`;
/// an absent or null one is empty.
fn scalar<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    use serde_yaml_ng::Value;
    match Value::deserialize(d)? {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(serde::de::Error::custom("expected a string")),
    }
}

/// A list that may be written as null (`descriptors:` with nothing under it).
fn list<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

/// Most descriptors a configuration may nest, and hold in all: what a request is matched
/// against stays small, whatever a file says.
const MAX_DEPTH: usize = 32;
const MAX_DESCRIPTORS: usize = 100_000;

/// Why the rate limit service's configuration was refused, in envoyproxy/ratelimit's words
/// where it has them.
#[derive(Debug)]
pub(crate) enum ConfigError {
    /// A file could not be read.
    Read { path: String, error: std::io::Error },
    /// The directory could not be listed.
    ReadDir { path: String, error: std::io::Error },
    /// A file does not load: its name and why.
    File { name: String, reason: String },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Read { path, error } => write!(f, "cannot read {path}: {error}"),
            ConfigError::ReadDir { path, error } => {
                write!(f, "cannot read directory {path}: {error}")
            }
            ConfigError::File { name, reason } => write!(f, "{name}: {reason}"),
        }
    }
}

/// Builds a configuration from files' texts, `(name, text)`: every file must load, or the
/// whole set is refused with the first error, prefixed by the file's name.
pub(crate) fn parse(files: &[(String, String)]) -> Result<RlsConfig, ConfigError> {
    let mut config = RlsConfig::default();
    let mut count = 0usize;
    for (name, text) in files {
        let refuse = |reason: String| ConfigError::File {
            name: name.clone(),
            reason,
        };
        let root: YamlRoot = serde_yaml_ng::from_str(text)
            .map_err(|e| refuse(format!("error loading config file: {e}")))?;
        if root.domain.is_empty() {
            return Err(refuse("config file cannot have empty domain".into()));
        }
        if config.domains.contains_key(&root.domain) {
            return Err(refuse(format!(
                "duplicate domain '{}' in config file",
                root.domain
            )));
        }
        let mut level = Level::default();
        load_level(&mut level, &root.descriptors, &root.domain, 0, &mut count).map_err(refuse)?;
        config.domains.insert(root.domain, level);
    }
    Ok(config)
}

fn load_level(
    level: &mut Level,
    descriptors: &[YamlDescriptor],
    parent: &str,
    depth: usize,
    count: &mut usize,
) -> Result<(), String> {
    if depth >= MAX_DEPTH {
        return Err(format!("descriptors nest deeper than {MAX_DEPTH} levels"));
    }
    for d in descriptors {
        *count += 1;
        if *count > MAX_DESCRIPTORS {
            return Err(format!("more than {MAX_DESCRIPTORS} descriptors"));
        }
        if d.key.is_empty() {
            return Err("descriptor has empty key".into());
        }
        let composite = if d.value.is_empty() {
            d.key.clone()
        } else {
            format!("{}_{}", d.key, d.value)
        };
        let path = format!("{parent}.{composite}");
        let choices = level.keys.entry(d.key.clone()).or_default();
        let taken = if d.value.is_empty() {
            choices.default.is_some()
        } else {
            choices.values.contains_key(&d.value)
        };
        if taken {
            return Err(format!("duplicate descriptor composite key '{path}'"));
        }
        let limit = d
            .rate_limit
            .as_ref()
            .map(|r| load_limit(r, d, &path))
            .transpose()?;
        let mut node = Node {
            limit: limit.map(Arc::new),
            children: Level::default(),
        };
        load_level(&mut node.children, &d.descriptors, &path, depth + 1, count)?;
        let choices = level.keys.entry(d.key.clone()).or_default();
        if d.value.is_empty() {
            choices.default = Some(node);
        } else {
            if d.value.ends_with('*') {
                choices.wildcards.push(d.value.clone());
            }
            choices.values.insert(d.value.clone(), node);
        }
    }
    Ok(())
}

fn load_limit(r: &YamlRateLimit, d: &YamlDescriptor, path: &str) -> Result<Limit, String> {
    let unit = (!r.unit.is_empty()).then(|| Unit::parse(&r.unit));
    let algorithm = if r.algorithm.is_empty() {
        Algorithm::Aligned
    } else {
        r.algorithm
            .parse()
            .map_err(|e| format!("{path}: algorithm '{}': {e}", r.algorithm))?
    };
    let (unit, decide) = if r.unlimited {
        if matches!(unit, Some(Some(_))) {
            return Err("should not specify rate limit unit when unlimited".into());
        }
        (Unit::Second, Decide::Unlimited)
    } else {
        match unit {
            Some(Some(u)) => (u, decide_for(r.requests_per_unit, u, algorithm)),
            _ => return Err(format!("invalid rate limit unit '{}'", r.unit)),
        }
    };
    for rep in &r.replaces {
        if rep.name.is_empty() {
            return Err("should not have an empty replaces entry".into());
        }
        if rep.name == r.name {
            return Err("replaces should not contain name of same descriptor".into());
        }
    }
    Ok(Limit {
        stat_key: path.to_string(),
        requests_per_unit: r.requests_per_unit,
        unit,
        decide,
        shadow: d.shadow_mode,
        name: (!r.name.is_empty()).then(|| r.name.clone()),
        replaces: r.replaces.iter().map(|x| x.name.clone()).collect(),
        detailed_metric: d.detailed_metric,
    })
}

/// Reads the configuration's files: the file itself, or every `*.yaml` and `*.yml` file of a
/// directory (not hidden ones), in name order.
pub(crate) fn read_files(path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|error| ConfigError::Read {
            path: p.display().to_string(),
            error,
        })
    };
    if !path.is_dir() {
        return Ok(vec![(path.display().to_string(), read(path)?)]);
    }
    let mut names: Vec<_> = std::fs::read_dir(path)
        .map_err(|error| ConfigError::ReadDir {
            path: path.display().to_string(),
            error,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            !name.starts_with('.')
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && p.is_file()
        })
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| Ok((p.display().to_string(), read(p)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<RlsConfig, String> {
        parse(&[("test.yaml".to_string(), text.to_string())]).map_err(|e| e.to_string())
    }

    const MESSAGING: &str = "
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 7
      algorithm: sliding
  - key: ldap
    rate_limit:
      unlimited: true
";

    #[test]
    fn finds_limits_as_envoyproxy_does() {
        let c = one(MESSAGING).unwrap();
        let l = c
            .find(
                "messaging",
                &[("message_type", "marketing"), ("to_number", "2061111111")],
            )
            .unwrap();
        assert_eq!(l.limit.requests_per_unit, 5);
        assert_eq!(
            l.limit.stat_key,
            "messaging.message_type_marketing.to_number"
        );
        assert_eq!(
            c.find("messaging", &[("to_number", "1")])
                .unwrap()
                .limit
                .requests_per_unit,
            100
        );
        // A descriptor deeper or shallower than the tree matches nothing.
        assert!(
            c.find("messaging", &[("message_type", "marketing")])
                .is_none()
        );
        assert!(
            c.find("messaging", &[("to_number", "1"), ("x", "y")])
                .is_none()
        );
        assert!(c.find("other", &[("to_number", "1")]).is_none());
        assert_eq!(
            c.find("messaging", &[("remote_address", "50.0.0.5")])
                .unwrap()
                .limit
                .decide,
            Decide::Never
        );
        let w = c.find("messaging", &[("path", "/api/users")]).unwrap();
        assert_eq!(w.limit.requests_per_unit, 7);
        assert!(matches!(w.limit.decide, Decide::Rule(r) if r.algorithm == Algorithm::Sliding));
        assert!(c.find("messaging", &[("path", "/other")]).is_none());
        assert_eq!(
            c.find("messaging", &[("ldap", "x")]).unwrap().limit.decide,
            Decide::Unlimited
        );
        let aligned = c.find("messaging", &[("to_number", "1")]).unwrap().limit;
        assert!(matches!(aligned.decide, Decide::Rule(r) if r.algorithm == Algorithm::Aligned));
    }

    #[test]
    fn refuses_what_envoyproxy_refuses() {
        for (text, why) in [
            ("domain: ''\n", "empty domain"),
            ("descriptors: []\n", "empty domain"),
            ("domain: d\nbogus: 1\n", "unknown field"),
            ("domain: d\ndescriptors:\n  - value: v\n", "empty key"),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
                "invalid rate limit unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1\n",
                "invalid rate limit unit",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n",
                "unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
                "duplicate descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n",
                "algorithm",
            ),
            ("domain: d\ndescriptors: [\n", "error loading"),
        ] {
            let e = one(text).err().unwrap_or_default();
            assert!(e.contains(why), "{text:?}: {e}");
        }
        let two = parse(&[
            ("a.yaml".into(), "domain: d\n".into()),
            ("b.yaml".into(), "domain: d\n".into()),
        ]);
        assert!(
            two.err()
                .map(|e| e.to_string())
                .unwrap_or_default()
                .contains("b.yaml: duplicate domain 'd'")
        );
    }

    #[test]
    fn numbers_read_as_text_and_detailed_metrics_name_the_value() {
        let c = one(
            "domain: 7\ndescriptors:\n  - key: port\n    value: 443\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        )
        .unwrap();
        assert!(c.find("7", &[("port", "443")]).is_some());
        let m = c.find("7", &[("user", "bob")]).unwrap();
        assert_eq!(m.stat_key.as_deref(), Some("7.user_bob"));
    }
}
