//! Who a request is from: the default limit key.

use axum::extract::ConnectInfo;
use http::HeaderName;
use http::request::Parts;
use std::net::{IpAddr, SocketAddr};

/// The authenticated caller, inserted into the request's extensions by upstream
/// authentication middleware; the default key uses it when no API key header is present.
///
/// ```
/// # use bucketd::client::http::AuthenticatedUser;
/// # let mut req = http::Request::new(());
/// req.extensions_mut().insert(AuthenticatedUser("alice".into()));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AuthenticatedUser(pub String);

/// How the default key function identifies a caller.
#[derive(Clone, Debug)]
pub(crate) struct Identify {
    pub(crate) api_key_header: HeaderName,
    pub(crate) trusted_proxies: usize,
}

impl Identify {
    /// `key:<digest of the API key>`, else `user:<name>`, else `ip:<address>`, else `anonymous`.
    pub(crate) fn key(&self, parts: &Parts) -> String {
        if let Some(key) = parts
            .headers
            .get(&self.api_key_header)
            .map(|v| v.as_bytes())
            .filter(|v| !v.is_empty())
        {
            // Limiter keys are visible to anyone who can list bucketd's keys: keep only a
            // digest of the secret.
            return format!("key:{:016x}", fnv1a(key));
        }
        if let Some(AuthenticatedUser(user)) = parts.extensions.get::<AuthenticatedUser>() {
            return format!("user:{user}");
        }
        match self.client_ip(parts) {
            Some(ip) => format!("ip:{ip}"),
            None => "anonymous".to_string(),
        }
    }

    /// With `trusted_proxies = n > 0`, the n-th address from the right of `X-Forwarded-For`
    /// (each trusted proxy appends the address it got the request from, so that entry was
    /// written by the outermost trusted proxy); else the peer address of the connection.
    pub(crate) fn client_ip(&self, parts: &Parts) -> Option<IpAddr> {
        if self.trusted_proxies > 0 {
            let hops: Vec<&str> = parts
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .collect();
            if !hops.is_empty() {
                let i = hops.len().saturating_sub(self.trusted_proxies);
                if let Some(ip) = hops.get(i).and_then(|h| parse_ip(h)) {
                    return Some(ip);
                }
            }
        }
        parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|c| c.0.ip())
            .or_else(|| parts.extensions.get::<SocketAddr>().map(SocketAddr::ip))
    }
}

/// An address as proxies write it: bare, `[v6]`, or with a port.
fn parse_ip(s: &str) -> Option<IpAddr> {
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| {
            s.strip_prefix('[')
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|r| r.parse().ok())
        })
}

/// 64-bit FNV-1a: stable across builds and platforms, so every gateway derives the same key.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(build: impl FnOnce(http::request::Builder) -> http::request::Builder) -> Parts {
        build(http::Request::builder())
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    fn identify(trusted_proxies: usize) -> Identify {
        Identify {
            api_key_header: HeaderName::from_static("x-api-key"),
            trusted_proxies,
        }
    }

    #[test]
    fn api_key_then_user_then_ip() {
        let peer: SocketAddr = "10.1.2.3:5555".parse().unwrap();
        let mut p = parts(|b| b.header("x-api-key", "secret"));
        p.extensions.insert(AuthenticatedUser("alice".into()));
        p.extensions.insert(ConnectInfo(peer));
        let k = identify(0).key(&p);
        assert!(k.starts_with("key:") && !k.contains("secret"), "{k}");
        assert_eq!(k.len(), 4 + 16);
        p.headers.clear();
        assert_eq!(identify(0).key(&p), "user:alice");
        p.extensions.remove::<AuthenticatedUser>();
        assert_eq!(identify(0).key(&p), "ip:10.1.2.3");
        p.extensions.remove::<ConnectInfo<SocketAddr>>();
        assert_eq!(identify(0).key(&p), "anonymous");
        p.extensions.insert(peer);
        assert_eq!(identify(0).key(&p), "ip:10.1.2.3");
    }

    #[test]
    fn forwarded_for_only_when_trusted() {
        let mut p = parts(|b| {
            b.header("x-forwarded-for", "6.6.6.6, 1.1.1.1")
                .header("x-forwarded-for", "[2001:db8::1]:443")
        });
        p.extensions
            .insert(ConnectInfo("127.0.0.1:1".parse::<SocketAddr>().unwrap()));
        assert_eq!(identify(0).key(&p), "ip:127.0.0.1");
        assert_eq!(identify(1).key(&p), "ip:2001:db8::1");
        assert_eq!(identify(2).key(&p), "ip:1.1.1.1");
        assert_eq!(identify(3).key(&p), "ip:6.6.6.6");
        // More hops trusted than present: the leftmost is the best there is.
        assert_eq!(identify(9).key(&p), "ip:6.6.6.6");
        let mut bad = parts(|b| b.header("x-forwarded-for", "not-an-ip"));
        bad.extensions
            .insert(ConnectInfo("127.0.0.1:1".parse::<SocketAddr>().unwrap()));
        assert_eq!(identify(1).key(&bad), "ip:127.0.0.1");
    }

    #[test]
    fn digest_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
