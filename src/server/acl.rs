//! Who a client is: the named users from the config file, each with a password and either
//! full access or read-only access, found without the reply's timing telling which users
//! exist or how much of a password was right.

use crate::config::User;

/// Compares two byte strings in time that depends only on their lengths, never on where they
/// first differ.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = u8::from(a.len() != b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    diff == 0
}

/// Finds the user `name` whose password is `pass`. Every user's name and the password are
/// compared whether or not an earlier one matched, and a missing user still costs a password
/// comparison, so the reply's timing tells neither which users exist nor how much of a
/// password was right.
pub(crate) fn find_user<'a>(users: &'a [User], name: &[u8], pass: &[u8]) -> Option<&'a User> {
    let mut found: Option<&User> = None;
    for u in users {
        if same_bytes(u.name.as_bytes(), name) {
            found = Some(u);
        }
    }
    let expected = found.map_or(b"\0not a password\0".as_slice(), |u| u.password.as_bytes());
    let pass_ok = same_bytes(expected, pass);
    found.filter(|_| pass_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, pass: &str, readonly: bool) -> User {
        User {
            name: name.into(),
            password: pass.into(),
            readonly,
        }
    }

    #[test]
    fn users_are_found_only_with_their_own_password() {
        let users = [user("gw", "a", false), user("dash", "b", true)];
        assert_eq!(
            find_user(&users, b"gw", b"a").map(|u| u.readonly),
            Some(false)
        );
        assert_eq!(
            find_user(&users, b"dash", b"b").map(|u| u.readonly),
            Some(true)
        );
        assert!(find_user(&users, b"gw", b"b").is_none());
        assert!(find_user(&users, b"nobody", b"a").is_none());
        assert!(find_user(&users, b"g", b"a").is_none());
        assert!(same_bytes(b"", b""));
        assert!(!same_bytes(b"ab", b"abc"));
    }
}
