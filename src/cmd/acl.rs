//! What a read-only user may run. Named users come from the config file, each with a password
//! and either full access or read-only access (the server checks who a client is); a
//! read-only user (a dashboard, an operator's shell) can peek at limits and read the server's
//! state, but cannot consume a limit, write a key or change rules, settings or the cluster.

use crate::protocol::Request;

/// Whether a read-only user may run `req`. `None` if it may; otherwise the name Redis gives
/// the refused command in its NOPERM reply (`config|set` for a subcommand).
pub(crate) fn readonly_refusal(req: &Request) -> Option<String> {
    let name = String::from_utf8_lossy(req.name()).to_ascii_lowercase();
    let sub = || {
        req.get(1)
            .map(|s| String::from_utf8_lossy(s).to_ascii_lowercase())
            .unwrap_or_default()
    };
    let allowed = match name.as_str() {
        // A check is a read when it only peeks.
        "bk.check" => has_option(req, 3, b"PEEK"),
        "bk.checkall" => {
            let n = req
                .get(1)
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(|n| n.parse::<usize>().ok());
            n.and_then(|n| n.checked_mul(2))
                .and_then(|n| n.checked_add(2))
                .is_some_and(|from| has_option(req, from, b"PEEK"))
        }
        "bk.rule" => matches!(sub().as_str(), "get" | "list"),
        // A script may write; EVAL_RO and EVALSHA_RO may not.
        "eval" | "evalsha" => false,
        "script" => sub() == "exists",
        "bk.cluster" => sub() == "status",
        "config" => sub() == "get",
        "client" => sub() != "kill",
        _ => match crate::cmd::table::lookup(req.name()) {
            Some(spec) => !spec.flags.iter().any(|f| *f == "write" || *f == "admin"),
            // An unknown command is answered as unknown, whoever asks.
            None => true,
        },
    };
    if allowed {
        return None;
    }
    Some(match name.as_str() {
        "bk.rule" | "bk.cluster" | "config" | "client" => format!("{name}|{}", sub()),
        _ => name,
    })
}

/// Whether one of the arguments from `from` on is the option `opt`.
fn has_option(req: &Request, from: usize, opt: &[u8]) -> bool {
    (from..req.len()).any(|i| req.get(i).is_some_and(|a| a.eq_ignore_ascii_case(opt)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readonly_user_peeks_but_does_not_consume() {
        let ok = |args: &[&str]| readonly_refusal(&Request::from_args(args)).is_none();
        assert!(ok(&["BK.CHECK", "k", "10/1s", "PEEK"]));
        assert!(!ok(&["BK.CHECK", "k", "10/1s"]));
        // A key named PEEK is not the option.
        assert!(!ok(&["BK.CHECK", "PEEK", "10/1s"]));
        assert!(ok(&["BK.CHECKALL", "2", "a", "b", "1/1s", "2/1s", "PEEK"]));
        assert!(!ok(&["BK.CHECKALL", "2", "a", "PEEK", "1/1s", "2/1s"]));
        assert!(!ok(&["CL.THROTTLE", "k", "1", "1", "1"]));
        assert!(!ok(&["BK.ACQUIRE", "k", "1", "1s"]));
        assert!(!ok(&["BK.RELEASE", "k", "1"]));
        assert!(ok(&["BK.INFLIGHT", "k"]));
        assert!(!ok(&["INCR", "k"]));
        assert!(ok(&["GET", "k"]));
        assert!(ok(&["INFO"]));
        assert!(ok(&["BK.RULE", "LIST"]));
        assert_eq!(
            readonly_refusal(&Request::from_args(&["BK.RULE", "SET", "x", "1/1s"])).as_deref(),
            Some("bk.rule|set")
        );
        assert_eq!(
            readonly_refusal(&Request::from_args(&["config", "set", "x", "1"])).as_deref(),
            Some("config|set")
        );
        assert!(!ok(&["FLUSHALL"]));
        assert!(!ok(&["CLIENT", "KILL", "ID", "1"]));
        assert!(ok(&["CLIENT", "LIST"]));
    }
}
