//! The RESP wire format: requests in, replies out (a shard's typed replies too). Knows nothing
//! about what a limit means.

pub(crate) mod args;
pub(crate) mod reply;
pub(crate) mod request;

pub(crate) use args::{ArgError, Args};
pub use reply::ReplyWriter;
pub(crate) use request::RequestParser;
pub use request::{Request, RequestLimits, parse_request};
