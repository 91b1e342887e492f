//! The RESP wire format: requests in, replies out. Knows nothing about limits.

pub mod args;
pub mod reply;
pub mod request;

pub use args::{ArgError, Args};
pub use reply::ReplyWriter;
pub use request::{ProtocolError, Request, RequestLimits, RequestParser, parse_request};
