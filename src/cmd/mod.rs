//! Turns a request (a list of byte strings) into a typed command, checking arity and every
//! argument, so shards only ever see well-formed work.

pub mod float;
pub mod keyed;
pub mod table;

use crate::limiter::cell::{self, CellArgs, CellError};
use crate::limiter::{Rule, parse_spec};
use crate::protocol::{ArgError, Args, Request};
use crate::rules::RuleSet;
use bytes::Bytes;
use keyed::{ExpireCond, GetExOpt, KeyCmd, SetCond, SetExpiry, TimeCmd};
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
    MGet(Vec<Bytes>),
    /// `keys[i]` gets `values[i]`. On one shard MSET is atomic (every key or none); keys on
    /// several shards are set shard by shard, each shard's share atomically, with no isolation
    /// between the shares: a reader may see one shard's keys set before another's.
    MSet {
        keys: Vec<Bytes>,
        values: Vec<Bytes>,
    },
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
            MultiCmd::MGet(k) => KeyCmd::MGet(k),
            MultiCmd::MSet { keys, values } => KeyCmd::MSet { keys, values },
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
            MultiCmd::Del(k) | MultiCmd::Exists(k) | MultiCmd::MGet(k) => k,
            MultiCmd::MSet { keys, .. } | MultiCmd::CheckAll { keys, .. } => keys,
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
        "expire" | "pexpire" | "expireat" | "pexpireat" => parse_expire(spec.name, &mut a),
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
            // redis-cell's own checks and words, in its order: the argument count, each number
            // as Rust parses an i64, then the rate.
            let cell_err = |e: CellError| ParseError::Arg(ArgError::Msg(e.to_string()));
            if !matches!(a.remaining(), 4 | 5) {
                return Err(cell_err(CellError::Usage));
            }
            let key = a.next_bytes()?;
            let num = |a: &mut Args| -> Result<i64, ParseError> {
                cell::parse_arg(&a.next_bytes()?).map_err(cell_err)
            };
            let max_burst = num(&mut a)?;
            let count = num(&mut a)?;
            let period_s = num(&mut a)?;
            let quantity = if a.remaining() > 0 { num(&mut a)? } else { 1 };
            let args = CellArgs {
                max_burst,
                count,
                period_s,
                quantity,
            };
            cell::validate(&args).map_err(cell_err)?;
            keyed(key.clone(), KeyCmd::Throttle { key, args })
        }
        "setex" | "psetex" => {
            let key = a.next_bytes()?;
            let time = a.next_bytes()?;
            let value = a.next_bytes()?;
            let (cmd, unit) = if spec.name == "setex" {
                (TimeCmd::SetEx, ExpireUnit::Ex)
            } else {
                (TimeCmd::PSetEx, ExpireUnit::Px)
            };
            let ms = expire_ms(unit, &time).map_err(|e| e.into_arg(cmd))?;
            keyed(
                key.clone(),
                KeyCmd::SetEx {
                    key,
                    value,
                    ms,
                    cmd,
                },
            )
        }
        "setnx" | "getset" => {
            let key = a.next_bytes()?;
            let value = a.next_bytes()?;
            let cmd = if spec.name == "setnx" {
                KeyCmd::SetNx {
                    key: key.clone(),
                    value,
                }
            } else {
                KeyCmd::GetSet {
                    key: key.clone(),
                    value,
                }
            };
            keyed(key, cmd)
        }
        "getdel" => {
            let k = a.next_bytes()?;
            keyed(k.clone(), KeyCmd::GetDel(k))
        }
        "getex" => {
            let key = a.next_bytes()?;
            let o = parse_string_opts(&mut a, false)?;
            let opt = match o.expire {
                None if o.persist => GetExOpt::Persist,
                None => GetExOpt::Keep,
                Some((unit, raw)) => match expire_ms(unit, &raw) {
                    Ok(ms) if unit.absolute() => GetExOpt::At(ms),
                    Ok(ms) => GetExOpt::In(ms),
                    Err(BadExpire::NotInteger) => GetExOpt::NotInteger,
                    Err(BadExpire::Invalid) => GetExOpt::Invalid,
                },
            };
            keyed(key.clone(), KeyCmd::GetEx { key, opt })
        }
        "expiretime" | "pexpiretime" => {
            let key = a.next_bytes()?;
            keyed(
                key.clone(),
                KeyCmd::ExpireTime {
                    key,
                    ms: spec.name == "pexpiretime",
                },
            )
        }
        "incrbyfloat" => {
            let key = a.next_bytes()?;
            let incr = a.next_bytes()?;
            keyed(key.clone(), KeyCmd::IncrByFloat { key, incr })
        }
        "mget" => Ok(Parsed::Multi(MultiCmd::MGet(a.rest()))),
        "mset" => {
            if !a.remaining().is_multiple_of(2) {
                return Err(a.arity_error().into());
            }
            let rest = a.rest();
            let (mut keys, mut values) = (Vec::new(), Vec::new());
            for pair in rest.chunks_exact(2) {
                keys.push(pair[0].clone());
                values.push(pair[1].clone());
            }
            Ok(Parsed::Multi(MultiCmd::MSet { keys, values }))
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

/// An argument as Redis's C code compares it: up to its first NUL byte.
fn c_str(arg: &[u8]) -> &[u8] {
    arg.split(|&b| b == 0).next().unwrap_or(arg)
}

fn parse_expire(name: &'static str, a: &mut Args) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let param = a.next_bytes()?;
    // Redis reads the options before the time: a bad option wins over a bad number.
    let (mut nx, mut xx, mut gt, mut lt) = (false, false, false, false);
    while let Some(c) = a.next_opt() {
        let opt = c_str(&c);
        match opt.to_ascii_uppercase().as_slice() {
            b"NX" => nx = true,
            b"XX" => xx = true,
            b"GT" => gt = true,
            b"LT" => lt = true,
            _ => {
                return Err(ArgError::Msg(format!(
                    "ERR Unsupported option {}",
                    String::from_utf8_lossy(opt)
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
    let cmd = match name {
        "expire" => TimeCmd::Expire,
        "pexpire" => TimeCmd::PExpire,
        "expireat" => TimeCmd::ExpireAt,
        _ => TimeCmd::PExpireAt,
    };
    let n = crate::protocol::args::parse_i64(&param).ok_or(ArgError::NotInteger)?;
    // Seconds that overflow when made milliseconds are refused here; a time from now that
    // overflows once the current time is added is refused by the shard, which knows the time.
    let ms = if matches!(cmd, TimeCmd::Expire | TimeCmd::ExpireAt) {
        n.checked_mul(1000)
            .ok_or_else(|| ArgError::Msg(cmd.invalid_expire().into()))?
    } else {
        n
    };
    Ok(Parsed::Keyed {
        route: key.clone(),
        cmd: KeyCmd::ExpireChecked { key, ms, cond, cmd },
    })
}

/// The unit of an EX / PX / EXAT / PXAT option.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ExpireUnit {
    Ex,
    Px,
    ExAt,
    PxAt,
}

impl ExpireUnit {
    fn of(opt: &[u8]) -> Option<ExpireUnit> {
        [
            ("EX", ExpireUnit::Ex),
            ("PX", ExpireUnit::Px),
            ("EXAT", ExpireUnit::ExAt),
            ("PXAT", ExpireUnit::PxAt),
        ]
        .into_iter()
        .find(|(name, _)| opt.eq_ignore_ascii_case(name.as_bytes()))
        .map(|(_, u)| u)
    }

    fn seconds(self) -> bool {
        matches!(self, ExpireUnit::Ex | ExpireUnit::ExAt)
    }

    fn absolute(self) -> bool {
        matches!(self, ExpireUnit::ExAt | ExpireUnit::PxAt)
    }
}

/// Why an expire time was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BadExpire {
    NotInteger,
    /// Zero, negative, or too large to be milliseconds.
    Invalid,
}

impl BadExpire {
    fn into_arg(self, cmd: TimeCmd) -> ArgError {
        match self {
            BadExpire::NotInteger => ArgError::NotInteger,
            BadExpire::Invalid => ArgError::Msg(cmd.invalid_expire().into()),
        }
    }
}

/// The time of an expire option in milliseconds, checked as Redis's
/// `getExpireMillisecondsOrReply` does before it adds the current time.
fn expire_ms(unit: ExpireUnit, raw: &[u8]) -> Result<u64, BadExpire> {
    let n = crate::protocol::args::parse_i64(raw).ok_or(BadExpire::NotInteger)?;
    if n <= 0 || (unit.seconds() && n > i64::MAX / 1000) {
        return Err(BadExpire::Invalid);
    }
    let ms = if unit.seconds() { n * 1000 } else { n };
    u64::try_from(ms).map_err(|_| BadExpire::Invalid)
}

/// SET's and GETEX's options, accepted exactly as Redis's `parseExtendedStringArgumentsOrReply`
/// accepts them: an option may repeat (the last time given wins), options that contradict each
/// other are a syntax error. The time itself is only read afterwards.
#[derive(Default)]
struct StringOpts {
    nx: bool,
    xx: bool,
    get: bool,
    keepttl: bool,
    persist: bool,
    expire: Option<(ExpireUnit, Bytes)>,
}

fn parse_string_opts(a: &mut Args, set: bool) -> Result<StringOpts, ArgError> {
    let mut o = StringOpts::default();
    while let Some(arg) = a.next_opt() {
        let opt = c_str(&arg);
        let is = |kw: &str| opt.eq_ignore_ascii_case(kw.as_bytes());
        let unit = o.expire.as_ref().map(|(u, _)| *u);
        if set && is("NX") && !o.xx {
            o.nx = true;
        } else if set && is("XX") && !o.nx {
            o.xx = true;
        } else if set && is("GET") {
            o.get = true;
        } else if set && is("KEEPTTL") && unit.is_none() {
            o.keepttl = true;
        } else if !set && is("PERSIST") && unit.is_none() {
            o.persist = true;
        } else if let Some(u) = ExpireUnit::of(opt)
            && !o.keepttl
            && !o.persist
            && unit.is_none_or(|prev| prev == u)
            && a.remaining() > 0
        {
            o.expire = Some((u, a.next_bytes()?));
        } else {
            return Err(ArgError::Syntax);
        }
    }
    Ok(o)
}

fn parse_set(a: &mut Args) -> Result<Parsed, ParseError> {
    let key = a.next_bytes()?;
    let value = a.next_bytes()?;
    let o = parse_string_opts(a, true)?;
    let cond = match (o.nx, o.xx) {
        (true, _) => SetCond::IfAbsent,
        (_, true) => SetCond::IfPresent,
        _ => SetCond::Always,
    };
    let expiry = match o.expire {
        None if o.keepttl => SetExpiry::KeepTtl,
        None => SetExpiry::Clear,
        Some((unit, raw)) => {
            let ms = expire_ms(unit, &raw).map_err(|e| e.into_arg(TimeCmd::Set))?;
            if unit.absolute() {
                SetExpiry::At(ms)
            } else {
                SetExpiry::In(ms)
            }
        }
    };
    Ok(Parsed::Keyed {
        route: key.clone(),
        cmd: KeyCmd::Set {
            key,
            value,
            expiry,
            cond,
            get: o.get,
        },
    })
}
