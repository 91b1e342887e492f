//! A script's first line `#!lua flags=...`, read as Redis 7 reads it.
//!
//! A script without that line keeps Redis's legacy behaviour (it may write, and EVAL_RO makes
//! it read-only). One with it declares what it needs: without `no-writes` it may write (and
//! EVAL_RO refuses it), with `no-writes` it may not (and EVAL_RO runs it); `no-cluster`
//! scripts are refused by a cluster; without `allow-oom` a script that may write is refused
//! while the node is at its key or memory cap; `allow-stale` and `allow-cross-slot-keys` are
//! carried for whoever enforces them. The line is dropped before the script is compiled, its
//! line feed kept, so line numbers in errors stay the script's own.
//!
//! The flags are read from the script's text wherever they are needed, so they travel with it
//! (in a cluster's log too) without a field of their own.

/// What a script's shebang line declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScriptFlags {
    /// The script starts with a `#!lua` line; without one, none of the flags below apply and
    /// the script keeps Redis's legacy behaviour.
    pub shebang: bool,
    pub no_writes: bool,
    pub allow_oom: bool,
    pub allow_stale: bool,
    pub no_cluster: bool,
    pub allow_cross_slot_keys: bool,
}

impl ScriptFlags {
    /// The script may not write: a write command from it fails.
    pub fn read_only(&self) -> bool {
        self.shebang && self.no_writes
    }

    /// The script declared flags and did not say `no-writes`: EVAL_RO refuses it.
    pub fn declares_writes(&self) -> bool {
        self.shebang && !self.no_writes
    }

    /// A node at its key or memory cap refuses the script (Redis's `allow-oom` rule; a
    /// script that may not write is let through).
    pub fn refused_when_full(&self) -> bool {
        self.shebang && !self.no_writes && !self.allow_oom
    }

    /// A cluster refuses the script.
    pub fn refused_in_cluster(&self) -> bool {
        self.shebang && self.no_cluster
    }
}

/// Why a shebang line is refused; the text is Redis's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShebangError {
    /// `#!` with no line feed after it.
    Unterminated,
    UnexpectedEngine(String),
    UnexpectedFlag(String),
    UnknownOption(String),
}

impl std::fmt::Display for ShebangError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShebangError::Unterminated => f.write_str("ERR Invalid script shebang"),
            ShebangError::UnexpectedEngine(e) => {
                write!(f, "ERR Unexpected engine in script shebang: {e}")
            }
            ShebangError::UnexpectedFlag(flag) => {
                write!(f, "ERR Unexpected flag in script shebang: {flag}")
            }
            ShebangError::UnknownOption(o) => write!(f, "ERR Unknown lua shebang option: {o}"),
        }
    }
}

impl std::error::Error for ShebangError {}

/// Reads the shebang line of `body`: its flags, and how many bytes the line takes (without
/// its line feed; 0 when there is none).
pub(super) fn read(body: &[u8]) -> Result<(ScriptFlags, usize), ShebangError> {
    if !body.starts_with(b"#!") {
        return Ok((ScriptFlags::default(), 0));
    }
    let len = body
        .iter()
        .position(|&b| b == b'\n')
        .ok_or(ShebangError::Unterminated)?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let mut parts = body[..len]
        .split(|b| b.is_ascii_whitespace() || *b == 0x0b)
        .filter(|p| !p.is_empty());
    // The line starts with `#!`, so there is a first word.
    let engine = parts.next().unwrap_or_default();
    if engine != b"#!lua" {
        return Err(ShebangError::UnexpectedEngine(text(engine)));
    }
    let mut flags = ScriptFlags {
        shebang: true,
        ..ScriptFlags::default()
    };
    for part in parts {
        let Some(list) = part.strip_prefix(b"flags=") else {
            return Err(ShebangError::UnknownOption(text(part)));
        };
        if list.is_empty() {
            continue;
        }
        for flag in list.split(|&b| b == b',') {
            match flag {
                b"no-writes" => flags.no_writes = true,
                b"allow-oom" => flags.allow_oom = true,
                b"allow-stale" => flags.allow_stale = true,
                b"no-cluster" => flags.no_cluster = true,
                b"allow-cross-slot-keys" => flags.allow_cross_slot_keys = true,
                other => return Err(ShebangError::UnexpectedFlag(text(other))),
            }
        }
    }
    Ok((flags, len))
}

#[cfg(test)]
mod tests {
    use super::{ScriptFlags, ShebangError, read};

    #[test]
    fn a_script_without_a_shebang_keeps_the_legacy_rules() {
        let (flags, len) = read(b"return 1").unwrap();
        assert_eq!((flags, len), (ScriptFlags::default(), 0));
        assert!(!flags.read_only() && !flags.declares_writes() && !flags.refused_when_full());
    }

    #[test]
    fn flags_are_read_from_the_first_line() {
        let (flags, len) = read(b"#!lua flags=no-writes,allow-stale\nreturn 1").unwrap();
        assert_eq!(len, 33);
        assert!(flags.read_only() && flags.allow_stale && !flags.no_cluster);
        let (flags, len) = read(b"#!lua\nreturn 1").unwrap();
        assert_eq!(len, 5);
        assert!(flags.declares_writes() && flags.refused_when_full());
        let (flags, _) = read(b"#!lua flags=allow-oom,no-cluster,allow-cross-slot-keys\n").unwrap();
        assert!(flags.allow_oom && flags.refused_in_cluster() && flags.allow_cross_slot_keys);
        assert!(!flags.refused_when_full());
        let (flags, _) = read(b"#!lua flags=\n").unwrap();
        assert!(flags.declares_writes());
    }

    #[test]
    fn bad_shebangs_are_refused_in_redis_words() {
        for (body, text) in [
            (&b"#!lua"[..], "ERR Invalid script shebang"),
            (b"#! lua\n", "ERR Unexpected engine in script shebang: #!"),
            (b"#!js\n", "ERR Unexpected engine in script shebang: #!js"),
            (
                b"#!lua flags=no-writes,bogus\n",
                "ERR Unexpected flag in script shebang: bogus",
            ),
            (
                b"#!lua flags=a,,b\n",
                "ERR Unexpected flag in script shebang: a",
            ),
            (b"#!lua name=x\n", "ERR Unknown lua shebang option: name=x"),
        ] {
            let err: ShebangError = read(body).unwrap_err();
            assert_eq!(err.to_string(), text, "{body:?}");
        }
    }
}
