//! The RESP wire format: requests in, replies out (a shard's typed replies too). Knows nothing
//! about what a limit means.

pub mod args;
pub mod reply;
pub mod request;

pub use args::{ArgError, Args};
pub use reply::{ReplyWriter, encode};
pub use request::{Request, RequestLimits, RequestParser, parse_request};
