//! Setting values as they are written: sizes (`512mb`), yes/no words, and why one is refused.

use std::fmt;

/// A setting's value that is not valid. The message names the setting and says what it
/// takes, as the operator reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingError {
    /// Not a size such as `100`, `64kb` or `2gb`.
    InvalidSize(String),
    /// A size past what the machine can count.
    SizeTooLarge(String),
    /// A negative size in the config file.
    Negative(&'static str),
    /// Neither a number nor a size string in the config file.
    NotASize(&'static str),
    /// Not yes or no.
    NotYesNo { name: &'static str, value: String },
    /// A word setting given as something other than a string or a boolean in the file.
    NotAWord(&'static str),
    /// `--rls-response-headers` is not yes or no.
    RlsResponseHeaders(String),
    /// A user's name is empty, too long, or not printable.
    UserName(String),
    /// A `[users.default]` table: the default user's password is `requirepass`.
    DefaultUser,
    /// A user without a password.
    NoPassword(String),
    /// The cluster secret given both as a value and as a file.
    TwoSecrets,
    /// `tls-auth-clients` is not yes, no or optional, in the words of its parser.
    TlsAuthClients(String),
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingError::InvalidSize(s) => write!(f, "invalid size '{s}'"),
            SettingError::SizeTooLarge(s) => write!(f, "size too large '{s}'"),
            SettingError::Negative(name) => write!(f, "{name} must be >= 0"),
            SettingError::NotASize(name) => {
                write!(f, "{name} must be a number or a size like \"512mb\"")
            }
            SettingError::NotYesNo { name, value } => {
                write!(f, "{name} must be yes or no, not '{value}'")
            }
            SettingError::NotAWord(name) => write!(f, "{name} must be a string such as \"yes\""),
            SettingError::RlsResponseHeaders(v) => {
                write!(f, "--rls-response-headers: expected yes or no, got '{v}'")
            }
            SettingError::UserName(name) => write!(f, "invalid user name '{name}'"),
            SettingError::DefaultUser => f.write_str(
                "the default user's password is requirepass, not a [users.default] table",
            ),
            SettingError::NoPassword(name) => write!(f, "user '{name}' needs a password"),
            SettingError::TwoSecrets => {
                f.write_str("give --cluster-secret or --cluster-secret-file, not both")
            }
            SettingError::TlsAuthClients(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for SettingError {}

/// The node's start-up error carries the message: it cannot name this type (it is a leaf).
impl From<SettingError> for crate::error::StartError {
    fn from(e: SettingError) -> Self {
        crate::error::StartError::Setting(e.to_string())
    }
}

/// A yes/no setting, as Redis spells them (`true`/`false` are taken too).
pub(super) fn yes_no(name: &'static str, v: &str) -> Result<bool, SettingError> {
    match v.to_ascii_lowercase().as_str() {
        "yes" | "true" => Ok(true),
        "no" | "false" => Ok(false),
        _ => Err(SettingError::NotYesNo {
            name,
            value: v.to_string(),
        }),
    }
}

/// Parses sizes like `100`, `64kb`, `512mb`, `2gb` (powers of 1024, case-insensitive).
pub fn parse_size(s: &str) -> Result<usize, SettingError> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mult) = [
        ("kb", 1usize << 10),
        ("mb", 1 << 20),
        ("gb", 1 << 30),
        ("k", 1 << 10),
        ("m", 1 << 20),
        ("g", 1 << 30),
        ("b", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n.trim().to_string(), *m)))
    .unwrap_or((t.clone(), 1));
    let n: usize = num
        .parse()
        .map_err(|_| SettingError::InvalidSize(s.to_string()))?;
    n.checked_mul(mult)
        .ok_or_else(|| SettingError::SizeTooLarge(s.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("100"), Ok(100));
        assert_eq!(parse_size("64kb"), Ok(65536));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert!(parse_size("lots").is_err());
    }
}
