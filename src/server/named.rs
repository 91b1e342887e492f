//! Checks that name a rule (BK.CHECK, BK.LEASE, BK.CHECKALL with a rule name instead of an
//! inline spec): which rules a request names, and how each one's decision is settled once its
//! reply is in. A rule in shadow mode never refuses: its refusal is answered as allowed and
//! counted as shadowed. The metrics by rule count every settled decision.

use crate::cmd::{Reply, summarize};
use crate::protocol::Request;
use crate::rules::RuleSet;
use crate::shard::Verdict;
use bytes::Bytes;

/// A rule a limit command named, and where its decision is in the reply.
pub(super) struct Named {
    /// The index in the round's reply order of the command's reply.
    pub(super) at: usize,
    /// Which of the command's limits it is (BK.CHECKALL has several).
    pos: usize,
    name: Bytes,
    /// BK.LEASE: its reply is the units taken, which shadow mode cannot change.
    lease: bool,
}

impl Named {
    /// The same rule, its decision in the reply at `at` in the round's order.
    pub(super) fn at(self, at: usize) -> Named {
        Named { at, ..self }
    }
}

/// The rules' decisions settled so far, by rule name, for the metrics by rule.
pub(super) type Decided = Vec<(Bytes, Verdict)>;

/// The rule names a limit command gives instead of inline specs (an inline spec has a '/'),
/// for the metrics by rule and for rules in shadow mode. None for every other command,
/// cheaply: most requests are not limit commands that name a rule.
pub(super) fn named_rules(req: &Request) -> Option<Vec<Named>> {
    let name = req.name();
    if name.len() < 8 || !name[..3].eq_ignore_ascii_case(b"bk.") {
        return None;
    }
    let is_name = |i: usize| req.get(i).is_some_and(|s| !s.contains(&b'/'));
    let named = |pos: usize, i: usize, lease: bool| {
        req.bytes(i).map(|name| Named {
            at: 0,
            pos,
            name,
            lease,
        })
    };
    let rest = &name[3..];
    let names: Vec<Named> =
        if rest.eq_ignore_ascii_case(b"check") || rest.eq_ignore_ascii_case(b"lease") {
            if !is_name(2) {
                return None;
            }
            named(0, 2, rest.eq_ignore_ascii_case(b"lease"))
                .into_iter()
                .collect()
        } else if rest.eq_ignore_ascii_case(b"checkall") {
            let n: usize = std::str::from_utf8(req.get(1)?).ok()?.parse().ok()?;
            if n > req.len() {
                return None;
            }
            (n + 2..2 * n + 2)
                .filter(|&i| is_name(i))
                .filter_map(|i| named(i - n - 2, i, false))
                .collect()
        } else {
            return None;
        };
    (!names.is_empty()).then_some(names)
}

/// Settles every rule in `names` against the reply of the command that named them (shadow
/// mode rewrites a refusal in `r`), noting each decision in `decided`.
pub(super) fn settle<'a>(
    r: &mut Reply,
    names: impl IntoIterator<Item = &'a Named>,
    rules: &RuleSet,
    decided: &mut Decided,
) {
    for n in names {
        if let Some(v) = settle_one(r, n, rules) {
            decided.push((n.name.clone(), v));
        }
    }
}

/// How a check that named a rule was decided; a rule in shadow mode that refused is answered
/// as allowed here (BK.CHECKALL's shards already left it out of the set's decision). None for
/// an error reply.
fn settle_one(r: &mut Reply, n: &Named, rules: &RuleSet) -> Option<Verdict> {
    let shadow = rules.is_shadow(&n.name);
    match r {
        Reply::Limit(l) if l[0] > 0 => Some(Verdict::Within),
        Reply::Limit(_) if shadow && n.lease => Some(Verdict::Shadowed),
        Reply::Limit(l) if shadow => {
            l[0] = 1;
            l[3] = -1;
            Some(Verdict::Shadowed)
        }
        Reply::Limit(_) => Some(Verdict::Over),
        Reply::LimitAll(summary, each) => {
            let overall = summary[0] == 1;
            let e = each.get_mut(n.pos)?;
            if shadow && e[0] == 0 {
                e[0] = 1;
                e[3] = -1;
                *summary = summarize(each, overall);
                return Some(Verdict::Shadowed);
            }
            Some(if overall {
                Verdict::Within
            } else {
                Verdict::Over
            })
        }
        _ => None,
    }
}
