//! Node settings: built-in defaults, overridden by a TOML file, overridden by flags.
//!
//! `flags` is the command line, `file` the `--config` file's shape, `users` the named users,
//! `cluster` the cluster settings both give, `values` the parsing of sizes and yes/no words,
//! and `settings` the resolved settings that combine them.

mod cluster;
mod file;
mod flags;
mod settings;
mod users;
mod values;

pub use flags::Flags;
pub use settings::{SecretSource, Settings};
pub use users::User;
pub use values::{SettingError, parse_size};
