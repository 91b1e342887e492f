//! The RESP wire format: requests in, replies out (a shard's typed replies too). Knows nothing
//! about what a limit means.

pub(crate) mod args;
pub(crate) mod reply;
pub(crate) mod request;

// What the rest of the crate uses of this folder.
pub(crate) use args::parse_i64;
pub(crate) use reply::{ErrorCounts, count_errors_in};
pub(crate) use request::ProtocolError;

pub(crate) use args::{ArgError, Args};
pub use reply::ReplyWriter;
pub(crate) use request::RequestParser;
pub use request::{Request, RequestLimits, parse_request};
