//! Binding the node's listening sockets (clients, TLS clients, metrics, the rate limit
//! service), with the one error an operator reads when an address is taken.

use crate::error::StartError;
use std::net::SocketAddr;
use tokio::net::TcpListener;

/// Binds `host:port` (port 0 picks a free one) and returns the listener with the address it
/// got.
pub(crate) async fn bind(host: &str, port: u16) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind((host, port))
        .await
        .map_err(|error| StartError::Listen {
            addr: format!("{host}:{port}"),
            error,
        })?;
    let addr = listener.local_addr().map_err(StartError::Socket)?;
    Ok((listener, addr))
}
