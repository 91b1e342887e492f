//! Turns a request (a list of byte strings) into a typed command, checking arity and every
//! argument, so shards only ever see well-formed work.

pub mod keyed;
pub mod table;

use crate::limiter::cell::CellArgs;
use crate::limiter::{Rule, parse_spec};
use crate::protocol::{ArgError, Args, Request};
use crate::rules::RuleSet;
use bytes::Bytes;
use keyed::{ExpireCond, KeyCmd, SetCond, SetExpiry};
use table::CommandSpec;

/// A parsed request.
pub enum Parsed {
    /// Touches one key (`route` decides the shard).
    Keyed { route: Bytes, cmd: KeyCmd },
    /// Touches several keys, possibly owned by several shards.
    Multi(MultiCmd),
    /// Handled by the node itself (connection state, server info, all-shard operations).
    Node(&'static CommandSpec, Args),
}

pub enum MultiCmd {
    Del(Vec<Bytes>),
    Exists(Vec<Bytes>),
    CheckAll {
        keys: Vec<Bytes>,
        rules: Vec<Rule>,
        cost: u64,
        peek: bool,
    },
}

impl MultiCmd {
    /// The command a single shard runs when it owns every key.
    pub fn into_key_cmd(self) -> KeyCmd {
        match self {
            MultiCmd::Del(k) => KeyCmd::Del(k),
            MultiCmd::Exists(k) => KeyCmd::Exists(k),
            MultiCmd::CheckAll {
                keys,
                rules,
                cost,
                peek,
            } => KeyCmd::CheckAll {
                keys,
                rules,
                cost,
                peek,
            },
        }
    }

    pub fn keys(&self) -> &[Bytes] {
        match self {
            MultiCmd::Del(k) | MultiCmd::Exists(k) => k,
            MultiCmd::CheckAll { keys, .. } => keys,
        }
    }
}

/// Why a request was refused before reaching any shard.
pub enum ParseError {
    Unknown(String),
    Arg(ArgError),
}

impl From<ArgError> for ParseError {
    fn from(e: ArgError) -> Self {
        ParseError::Arg(e)
    }
}

impl ParseError {
    pub fn message(&self) -> String {
        match self {
            ParseError::Unknown(m) => m.clone(),
            ParseError::Arg(e) => e.to_string(),
        }
    }
}

fn unknown_command(req: &Request) -> ParseError {
    let name = String::from_utf8_lossy(req.name());
    let mut msg = format!(
        "ERR unknown command '{}', with args beginning with: ",
        truncate(&name)
    );
    for a in (1..req.len().min(9)).filter_map(|i| req.get(i)) {
        msg.push_str(&format!("'{}' ", truncate(&String::from_utf8_lossy(a))));
    }
    ParseError::Unknown(msg)
}

fn truncate(s: &str) -> String {
    s.chars().take(128).collect()
}

/// Resolves a limit argument: an inline spec (it contains '/') or the name of a rule.
pub fn resolve_spec(spec: &[u8], rules: &RuleSet) -> Result<Rule, ArgError> {
    let s =
        std::str::from_utf8(spec).map_err(|_| ArgError::Msg("ERR invalid limit spec".into()))?;
    if s.contains('/') {
        parse_spec(s)
            .map_err(|e| ArgError::Msg(format!("ERR invalid limit spec '{}': {e}", truncate(s))))
    } else {
        rules
            .get(s)
            .copied()
            .ok_or_else(|| ArgError::Msg(format!("ERR no such rule '{}'", truncate(s))))
    }
}

/// Parses `req` (non-empty) into a command.
pub fn parse(req: Request, rules: &RuleSet) -> Result<Parsed, ParseError> {
    let Some(spec) = table::lookup(req.name()) else {
        return Err(unknown_command(&req));
    };
    if !table::arity_ok(spec, req.len()) {
        return Err(ArgError::WrongArity(spec.name.to_string()).into());
    }
    let mut a = Args::new(spec.name, req);
    let keyed = |route: Bytes, cmd: KeyCmd| Ok(Parsed::Keyed { route, cmd });
    match spec.name {
        "get" => {
            let k = a.next_bytes()?;
            keyed(k.clone(), KeyCmd::Get(k))
        }
        "set" => parse_set(&mut a),
        "incr" | "decr" | "incrby" | "decrby" => {
            let key = a.next_bytes()?;
            let delta = match spec.name {
                "incr" => 1,
                "decr" => -1,
                "incrby" => a.next_i64()?,
                _ => a
                    .next_i64()?
                    .checked_neg()
                    .ok_or(ArgError::Msg("ERR decrement would overflow".into()))?,
            };
            keyed(key.clone(), KeyCmd::IncrBy { key, delta })
        }
        "expire" | "pexpire" | "expireat" | "pexpireat" => {
            let key = a.next_bytes()?;
            let n = a.next_i64()?;
            let ms = if spec.name.starts_with('p') {
                Some(n)
            } else {
                n.checked_mul(1000)
            }
            .ok_or_else(|| {
                ArgError::Msg(format!(
                    "ERR invalid expire time in '{}' command",
                    spec.name
                ))
            })?;
            let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
            while let Some(c) = a.next_opt() {
                match c.to_ascii_uppercase().as_slice() {
                    b"NX" => nx = true,
                    b"XX" => xx = true,
                    b"GT" => gt = true,
                    b"LT" => lt = true,
                    _ => {
                        return Err(ArgError::Msg(format!(
                            "ERR Unsupported option {}",
                            String::from_utf8_lossy(&c)
                        ))
                        .into());
                    }
                }
            }
            if nx && (xx || gt || lt) {
                return Err(ArgError::Msg(
                    "ERR NX and XX, GT or LT options at the same time are not compatible".into(),
                )
                .into());
            }
            if gt && lt {
                return Err(ArgError::Msg(
                    "ERR GT and LT options at the same time are not compatible".into(),
                )
                .into());
            }
            // GT already needs an existing TTL, so XX adds nothing to it; LT with XX does.
            let cond = match (nx, xx, gt, lt) {
                (true, ..) => ExpireCond::Nx,
                (_, _, true, _) => ExpireCond::Gt,
                (_, true, _, true) => ExpireCond::XxLt,
                (_, _, _, true) => ExpireCond::Lt,
                (_, true, ..) => ExpireCond::Xx,
                _ => ExpireCond::Always,
            };
            a.finish()?;
            let absolute = spec.name.ends_with("at");
            keyed(
                key.clone(),
                KeyCmd::Expire {
                    key,
                    ms,
                    absolute,
                    cond,
                },
            )
        }
        "persist" => {
            let k = a.next_bytes()?;
            keyed(k.clone(), KeyCmd::Persist(k))
        }
        "ttl" | "pttl" => {
            let key = a.next_bytes()?;
            keyed(
                key.clone(),
                KeyCmd::Ttl {
                    key,
                    ms: spec.name == "pttl",
                },
            )
        }
        "type" => {
            let k = a.next_bytes()?;
            keyed(k.clone(), KeyCmd::Type(k))
        }
        "del" | "unlink" | "bk.reset" => Ok(Parsed::Multi(MultiCmd::Del(a.rest()))),
        "exists" => Ok(Parsed::Multi(MultiCmd::Exists(a.rest()))),
        "cl.throttle" => {
            let key = a.next_bytes()?;
            let max_burst = a.next_i64()?;
            let count = a.next_i64()?;
            let period_s = a.next_i64()?;
            let quantity = if a.remaining() > 0 { a.next_i64()? } else { 1 };
            if a.remaining() > 0 {
                return Err(a.arity_error().into());
            }
            let args = CellArgs {
                max_burst,
                count,
                period_s,
                quantity,
            };
            keyed(key.clone(), KeyCmd::Throttle { key, args })
        }
        "bk.check" => {
            let key = a.next_bytes()?;
            let rule = resolve_spec(&a.next_bytes()?, rules)?;
            let (cost, peek) = parse_cost_peek(&mut a)?;
            keyed(
                key.clone(),
                KeyCmd::Check {
                    key,
                    rule,
                    cost,
                    peek,
                },
            )
        }
        "bk.checkall" => {
            let n = a.next_i64()?;
            let n = usize::try_from(n)
                .ok()
                .filter(|&n| n >= 1 && n * 2 <= a.remaining())
                .ok_or_else(|| {
                    ArgError::Msg(
                        "ERR numkeys must be at least 1 and match the keys and specs given".into(),
                    )
                })?;
            let keys: Vec<Bytes> = (0..n).map(|_| a.next_bytes()).collect::<Result<_, _>>()?;
            let mut rules_v = Vec::with_capacity(n);
            for _ in 0..n {
                rules_v.push(resolve_spec(&a.next_bytes()?, rules)?);
            }
            let (cost, peek) = parse_cost_peek(&mut a)?;
            Ok(Parsed::Multi(MultiCmd::CheckAll {
                keys,
                rules: rules_v,
                cost,
                peek,
            }))
        }
        "bk.lease" => {
            let key = a.next_bytes()?;
            let rule = resolve_spec(&a.next_bytes()?, rules)?;
            let max = a.next_u64()?;
            if max == 0 {
                return Err(ArgError::Msg("ERR lease size must be positive".into()).into());
            }
            keyed(key.clone(), KeyCmd::Lease { key, rule, max })
        }
        _ => Ok(Parsed::Node(spec, a)),
    }
}

/// `[COST n] [PEEK]` in any order.
fn parse_cost_peek(a: &mut Args) -> Result<(u64, bool), ArgError> {
    let mut cost = 1;
    let mut peek = false;
    while a.remaining() > 0 {
        if a.next_is("COST") {
            cost = a.next_u64()?;
        } else if a.next_is("PEEK") {
            peek = true;
        } else {
            return Err(ArgError::Syntax);
        }
    }
    Ok((cost, peek))
}

fn parse_set(a: &mut Args) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    let mut cond = SetCond::Always;
    let mut expiry = SetExpiry::Clear;
    let mut get = false;
    let invalid = || ArgError::Msg("ERR invalid expire time in 'set' command".into());
    while a.remaining() > 0 {
        let opt = a.next_keyword()?;
        match opt.as_str() {
            "NX" if cond == SetCond::Always => cond = SetCond::IfAbsent,
            "XX" if cond == SetCond::Always => cond = SetCond::IfPresent,
            "GET" => get = true,
            "KEEPTTL" if expiry == SetExpiry::Clear => expiry = SetExpiry::KeepTtl,
            "EX" | "PX" | "EXAT" | "PXAT" if expiry == SetExpiry::Clear => {
                let n = a.next_bytes().map_err(|_| ArgError::Syntax)?;
                let n = crate::protocol::args::parse_i64(&n).ok_or(ArgError::NotInteger)?;
                if n <= 0 {
                    return Err(invalid().into());
                }
                let ms = if opt.starts_with('E') {
                    n.checked_mul(1000).ok_or_else(invalid)?
                } else {
                    n
                };
                let ms = u64::try_from(ms).map_err(|_| invalid())?;
                expiry = if opt.ends_with("AT") {
                    SetExpiry::At(ms)
                } else {
                    SetExpiry::In(ms)
                };
            }
            _ => return Err(ArgError::Syntax.into()),
        }
    }
    Ok(Parsed::Keyed {
        route: key.clone(),
        cmd: KeyCmd::Set {
            key,
            value,
            expiry,
            cond,
            get,
        },
    })
}
