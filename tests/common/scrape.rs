//! Reads a node's Prometheus endpoint: an HTTP GET over a plain socket, the text parsed into
//! samples, and `promtool check metrics` run on it.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The samples of one scrape, by `name{labels}` exactly as the text writes them.
pub struct Scrape {
    pub text: String,
    pub samples: BTreeMap<String, f64>,
}

impl Scrape {
    /// A sample's value; fails the test if the scrape does not have it.
    pub fn get(&self, series: &str) -> f64 {
        match self.samples.get(series) {
            Some(v) => *v,
            None => panic!("no sample {series} in the scrape:\n{}", self.text),
        }
    }

    /// The sum of every sample of `name` whose labels contain all of `labels`.
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.samples
            .iter()
            .filter(|(k, _)| {
                let (n, l) = k.split_once('{').unwrap_or((k.as_str(), ""));
                n == name && labels.iter().all(|want| l.contains(want))
            })
            .map(|(_, v)| v)
            .sum()
    }
}

/// GETs `/metrics` and checks the answer is a 200 with Prometheus's text content type.
pub async fn scrape(addr: SocketAddr) -> Scrape {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics endpoint accepts");
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await
        .expect("request sent");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.expect("response read");
    let raw = String::from_utf8(raw).expect("utf-8 response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let mut samples = BTreeMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line");
        let v = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        samples.insert(series.to_string(), v);
    }
    Scrape {
        text: body.to_string(),
        samples,
    }
}

/// Runs `promtool check metrics` on a scrape's text; fails the test with promtool's words if
/// it finds a problem (lint problems included).
pub fn promtool_check(text: &str) {
    super::tools::require_tool(super::tools::PROMTOOL);
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("text written to promtool");
    let out = child.wait_with_output().expect("promtool finishes");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
