//! Named users besides `default`, from the config file's `[users.NAME]` tables.

use super::file::UserFile;
use super::values::SettingError;

/// A named user: `AUTH name password`. A read-only user may peek at limits and read the
/// server's state, not consume limits or change keys, rules, settings or the cluster.
#[derive(Clone)]
pub struct User {
    pub name: String,
    pub password: String,
    pub readonly: bool,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("readonly", &self.readonly)
            .finish_non_exhaustive()
    }
}

/// Checks the config file's users: names as Redis allows them, never `default` (its password
/// is `requirepass`), and a password each.
pub(super) fn users_from_file(
    users: std::collections::BTreeMap<String, UserFile>,
) -> Result<Vec<User>, SettingError> {
    users
        .into_iter()
        .map(|(name, u)| {
            if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(SettingError::UserName(name));
            }
            if name == "default" {
                return Err(SettingError::DefaultUser);
            }
            if u.password.is_empty() {
                return Err(SettingError::NoPassword(name));
            }
            Ok(User {
                name,
                password: u.password,
                readonly: u.readonly,
            })
        })
        .collect()
}
