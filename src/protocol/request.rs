//! Parses client requests: RESP arrays of bulk strings, and inline commands.
//!
//! A request is always a list of byte strings, so the parser produces `Vec<Bytes>` directly
//! instead of a general frame tree: the arguments are zero-copy slices of the read buffer.
//! An incomplete request is ordinary control flow (`Ok(None)`), not an error.

use bytes::{Buf, Bytes, BytesMut};
use std::fmt;

/// What a client may make the node hold for one request.
#[derive(Clone, Copy, Debug)]
pub struct RequestLimits {
    /// Largest bulk string, in bytes.
    pub max_bulk_len: usize,
    /// Most arguments in one request (multibulk or inline).
    pub max_args: usize,
    /// Longest inline command line, in bytes.
    pub max_inline_len: usize,
    /// Most bytes one request may span on the wire, every bulk argument included (Redis's
    /// `client-query-buffer-limit`).
    pub max_request_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_bulk_len: 512 * 1024 * 1024,
            max_args: 1024 * 1024,
            max_inline_len: 64 * 1024,
            max_request_bytes: 1024 * 1024 * 1024,
        }
    }
}

/// Before a client has authenticated, Redis refuses requests larger than a handshake needs,
/// so an anonymous peer cannot make the node buffer much.
const PREAUTH_MAX_ARGS: i64 = 10;
const PREAUTH_MAX_BULK: i64 = 16 * 1024;
/// The longest a length line (`*<n>` or `$<n>`) can be: a sign, 19 digits and CRLF, with room.
const MAX_LENGTH_LINE: usize = 32;

/// A violation of the protocol: the connection gets this as an error reply and is then closed,
/// because the stream can no longer be framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Protocol error: {}", self.0)
    }
}

impl std::error::Error for ProtocolError {}

fn perr<T>(msg: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(msg.into()))
}

/// Arguments kept inline before a request spills its spans to the heap; covers every
/// rate-limit command.
const INLINE_ARGS: usize = 8;

/// One request: its bytes as read from the socket, and where each argument lies in them.
///
/// Arguments are not split into separately reference-counted pieces: a command parser reads
/// integers and keywords straight from the frame and takes a counted slice only of what it
/// keeps (a key). That saves two atomic operations per argument on the hot path.
#[derive(Debug, Clone)]
pub struct Request {
    frame: Bytes,
    inline: [(u32, u32); INLINE_ARGS],
    len: usize,
    spilled: Vec<(u32, u32)>,
}

impl Request {
    fn new(frame: Bytes, spans: &[(usize, usize)]) -> Request {
        let mut r = Request::empty();
        for &(a, b) in spans {
            r.push(a, b);
        }
        r.frame = frame;
        r
    }

    fn empty() -> Request {
        Request {
            frame: Bytes::new(),
            inline: [(0, 0); INLINE_ARGS],
            len: 0,
            spilled: Vec::new(),
        }
    }

    /// Records the next argument's span; frames are bounded by the request limits, far below
    /// 4 GiB, so offsets fit in `u32`.
    fn push(&mut self, a: usize, b: usize) {
        let sp = (a as u32, b as u32);
        if self.len < INLINE_ARGS {
            self.inline[self.len] = sp;
        } else {
            if self.len == INLINE_ARGS {
                self.spilled.extend_from_slice(&self.inline);
            }
            self.spilled.push(sp);
        }
        self.len += 1;
    }

    /// A request over `frame`, its arguments at `spans`.
    pub(crate) fn from_frame(frame: Vec<u8>, spans: &[(usize, usize)]) -> Request {
        Request::new(Bytes::from(frame), spans)
    }

    /// A request built from separate arguments (tests, tools).
    pub fn from_args<A: AsRef<[u8]>>(args: &[A]) -> Request {
        let mut frame = Vec::new();
        let mut spans = Vec::with_capacity(args.len());
        for a in args {
            let start = frame.len();
            frame.extend_from_slice(a.as_ref());
            spans.push((start, frame.len()));
        }
        Request::new(Bytes::from(frame), &spans)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// How many bytes the request took on the wire (for inline requests: its arguments).
    pub fn wire_len(&self) -> usize {
        self.frame.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn span(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.len {
            return None;
        }
        let (a, b) = if self.len <= INLINE_ARGS {
            self.inline[i]
        } else {
            self.spilled[i]
        };
        Some((a as usize, b as usize))
    }

    /// Argument `i` (0 is the command name).
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.span(i).map(|(a, b)| &self.frame[a..b])
    }

    /// Argument `i` as a reference-counted slice of the frame, for values that are kept.
    pub fn bytes(&self, i: usize) -> Option<Bytes> {
        self.span(i).map(|(a, b)| self.frame.slice(a..b))
    }

    /// The command name (empty for an empty request).
    pub fn name(&self) -> &[u8] {
        self.get(0).unwrap_or_default()
    }

    /// Every argument as its own slice.
    pub fn to_vec(&self) -> Vec<Bytes> {
        (0..self.len).filter_map(|i| self.bytes(i)).collect()
    }
}

/// Parses one request from the front of `buf`, consuming it. `Ok(None)` means more bytes are
/// needed (nothing is consumed). An empty inline line is consumed and yields an empty request.
///
/// This starts from scratch on every call; a connection keeps a `RequestParser` instead, so a
/// request that arrives in many small reads is scanned once.
pub fn parse_request(
    buf: &mut BytesMut,
    limits: &RequestLimits,
) -> Result<Option<Request>, ProtocolError> {
    RequestParser::default().parse(buf, limits, true)
}

/// A connection's request parser: it remembers how far it got into an incomplete request, so
/// the work done over all the reads of one request is linear in its bytes, whatever the sizes
/// of the writes that carried it.
///
/// Invariant: between calls the caller only appends to the buffer; bytes before the end of
/// the partial request are neither consumed nor changed.
#[derive(Debug, Default)]
pub struct RequestParser {
    partial: Partial,
}

#[derive(Debug, Default)]
enum Partial {
    /// At the start of a request.
    #[default]
    Idle,
    /// Inside a multibulk request: `left` arguments to go, the next one's header at `pos`,
    /// the spans of those already complete in `req`.
    Multi {
        left: usize,
        pos: usize,
        req: Request,
    },
    /// Inside an inline request: no newline in the first `scanned` bytes.
    Inline { scanned: usize },
}

impl RequestParser {
    /// Parses the next request at the front of `buf` (see `parse_request`). `authed` false
    /// applies Redis's limits for clients that have not authenticated yet.
    pub fn parse(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
        authed: bool,
    ) -> Result<Option<Request>, ProtocolError> {
        let res = match std::mem::take(&mut self.partial) {
            Partial::Idle if buf.is_empty() => Ok(None),
            Partial::Idle if buf[0] == b'*' => self.multibulk_header(buf, limits, authed),
            Partial::Idle => self.inline(buf, limits, 0),
            Partial::Multi { left, pos, req } => {
                self.multibulk_args(buf, limits, authed, left, pos, req)
            }
            Partial::Inline { scanned } => self.inline(buf, limits, scanned),
        };
        if res.is_err() {
            self.partial = Partial::Idle;
        }
        res
    }

    /// Whether part of a request has been received and more is awaited.
    #[cfg(test)]
    fn is_mid_request(&self) -> bool {
        !matches!(self.partial, Partial::Idle)
    }

    fn multibulk_header(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
        authed: bool,
    ) -> Result<Option<Request>, ProtocolError> {
        let (end, count) = match length_line(buf, 1) {
            Some((end, n)) => (end, Some(n)),
            None => match find_crlf(buf, 1) {
                Some(end) => (end, parse_len(&buf[1..end])),
                None if buf.len() > MAX_LENGTH_LINE => {
                    return perr("too big mbulk count string");
                }
                None => return Ok(None),
            },
        };
        let count = match count {
            Some(n) if !authed && n > PREAUTH_MAX_ARGS => {
                return perr("unauthenticated multibulk length");
            }
            Some(n) if n > 0 && n as u64 > limits.max_args as u64 => {
                return perr("invalid multibulk length");
            }
            Some(n) => n,
            None => return perr("invalid multibulk length"),
        };
        if count <= 0 {
            buf.advance(end + 2);
            return Ok(Some(Request::empty()));
        }
        self.multibulk_args(
            buf,
            limits,
            authed,
            count as usize,
            end + 2,
            Request::empty(),
        )
    }

    fn multibulk_args(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
        authed: bool,
        mut left: usize,
        mut pos: usize,
        mut req: Request,
    ) -> Result<Option<Request>, ProtocolError> {
        while left > 0 {
            if pos >= buf.len() {
                return self.wait_multi(buf, limits, left, pos, req);
            }
            if buf[pos] != b'$' {
                return perr(format!("expected '$', got '{}'", char::from(buf[pos])));
            }
            let (line_end, len) = match length_line(buf, pos + 1) {
                Some((end, n)) => (end, Some(n)),
                None => match find_crlf(buf, pos + 1) {
                    Some(end) => (end, parse_len(&buf[pos + 1..end])),
                    None if buf.len() - pos > MAX_LENGTH_LINE => {
                        return perr("invalid bulk length");
                    }
                    None => return self.wait_multi(buf, limits, left, pos, req),
                },
            };
            let len = match len {
                Some(n) if !authed && n > PREAUTH_MAX_BULK => {
                    return perr("unauthenticated bulk length");
                }
                Some(n) if n >= 0 && (n as u64) <= limits.max_bulk_len as u64 => n as usize,
                _ => return perr("invalid bulk length"),
            };
            let start = line_end + 2;
            let stop = start + len;
            // Refuse as soon as the announced size passes the cap, before its bytes arrive.
            if stop + 2 > limits.max_request_bytes {
                return perr("request larger than client-query-buffer-limit");
            }
            if buf.len() < stop + 2 {
                return self.wait_multi(buf, limits, left, pos, req);
            }
            if &buf[stop..stop + 2] != b"\r\n" {
                return perr("bulk string not terminated by CRLF");
            }
            req.push(start, stop);
            pos = stop + 2;
            left -= 1;
        }
        req.frame = buf.split_to(pos).freeze();
        Ok(Some(req))
    }

    /// Remembers an incomplete multibulk request, unless it already passes the size cap.
    fn wait_multi(
        &mut self,
        buf: &BytesMut,
        limits: &RequestLimits,
        left: usize,
        pos: usize,
        req: Request,
    ) -> Result<Option<Request>, ProtocolError> {
        // The request is incomplete, so every buffered byte belongs to it.
        if buf.len() > limits.max_request_bytes {
            return perr("request larger than client-query-buffer-limit");
        }
        self.partial = Partial::Multi { left, pos, req };
        Ok(None)
    }

    fn inline(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
        scanned: usize,
    ) -> Result<Option<Request>, ProtocolError> {
        note_scanned(buf.len() - scanned);
        let Some(off) = buf[scanned..].iter().position(|&b| b == b'\n') else {
            if buf.len() > limits.max_inline_len {
                return perr("too big inline request");
            }
            self.partial = Partial::Inline { scanned: buf.len() };
            return Ok(None);
        };
        let nl = scanned + off;
        if nl > limits.max_inline_len {
            return perr("too big inline request");
        }
        let line = buf.split_to(nl + 1).freeze();
        let mut end = nl;
        if end > 0 && line[end - 1] == b'\r' {
            end -= 1;
        }
        let parts = split_inline(&line[..end])
            .ok_or_else(|| ProtocolError("unbalanced quotes in request".into()))?;
        if parts.len() > limits.max_args {
            return perr("too many arguments in inline request");
        }
        Ok(Some(Request::from_args(&parts)))
    }
}

/// Finds `\r\n` starting at `from`; returns the index of `\r`.
fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    while i + 1 < buf.len() {
        match memchr_cr(&buf[i..]) {
            Some(off) => {
                let at = i + off;
                if at + 1 < buf.len() {
                    if buf[at + 1] == b'\n' {
                        return Some(at);
                    }
                    i = at + 1;
                } else {
                    return None;
                }
            }
            None => return None,
        }
    }
    None
}

fn memchr_cr(s: &[u8]) -> Option<usize> {
    let found = s.iter().position(|&b| b == b'\r');
    note_scanned(found.map_or(s.len(), |i| i + 1));
    found
}

#[cfg(test)]
thread_local! {
    /// Bytes the scanning loops have examined on this thread, so tests can check that parsing
    /// is linear in the input.
    static SCANNED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[inline(always)]
fn note_scanned(_n: usize) {
    #[cfg(test)]
    SCANNED.with(|c| c.set(c.get() + _n));
}

/// The common length line, read in one pass: digits from `from` up to a CRLF that is
/// already buffered. Returns where the CR is and the value; `None` for anything else (a sign,
/// another byte, a line not yet complete, more digits than `parse_len` takes), which the
/// general path (`find_crlf`, then `parse_len`) then handles with its own answers.
#[inline(always)]
fn length_line(buf: &[u8], from: usize) -> Option<(usize, i64)> {
    let mut v: i64 = 0;
    let mut i = from;
    while let Some(&c) = buf.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        if i - from == 18 {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
        i += 1;
    }
    note_scanned(i - from + 2);
    (i > from && buf.get(i) == Some(&b'\r') && buf.get(i + 1) == Some(&b'\n')).then_some((i, v))
}

/// Parses a decimal integer as Redis does for lengths: optional '-', digits only.
fn parse_len(digits: &[u8]) -> Option<i64> {
    let (neg, d) = match digits.first() {
        Some(b'-') => (true, &digits[1..]),
        _ => (false, digits),
    };
    if d.is_empty() || d.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Some(if neg { -v } else { v })
}

/// Splits an inline command line into arguments the way redis-cli users expect: whitespace
/// separates, and double or single quotes group (double quotes honour `\n`, `\t`, `\\`, `\"`
/// and `\xHH` escapes).
fn split_inline(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut i = 0;
    let n = line.len();
    loop {
        while i < n && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= n {
            return Some(out);
        }
        let mut cur = Vec::new();
        let mut in_dq = false;
        let mut in_sq = false;
        loop {
            if i >= n {
                if in_dq || in_sq {
                    return None;
                }
                break;
            }
            let c = line[i];
            if in_dq {
                if c == b'\\' && i + 1 < n {
                    let e = line[i + 1];
                    if e == b'x'
                        && i + 3 < n
                        && line[i + 2].is_ascii_hexdigit()
                        && line[i + 3].is_ascii_hexdigit()
                    {
                        let hex = |b: u8| (b as char).to_digit(16).unwrap_or(0) as u8;
                        cur.push(hex(line[i + 2]) * 16 + hex(line[i + 3]));
                        i += 4;
                        continue;
                    }
                    cur.push(match e {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 8,
                        b'a' => 7,
                        other => other,
                    });
                    i += 2;
                    continue;
                }
                if c == b'"' {
                    // A closing quote must be followed by a space or the end.
                    if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    i += 1;
                    break;
                }
                cur.push(c);
                i += 1;
            } else if in_sq {
                if c == b'\\' && i + 1 < n && line[i + 1] == b'\'' {
                    cur.push(b'\'');
                    i += 2;
                    continue;
                }
                if c == b'\'' {
                    if i + 1 < n && !line[i + 1].is_ascii_whitespace() {
                        return None;
                    }
                    i += 1;
                    break;
                }
                cur.push(c);
                i += 1;
            } else {
                match c {
                    b'"' if cur.is_empty() => in_dq = true,
                    b'\'' if cur.is_empty() => in_sq = true,
                    c if c.is_ascii_whitespace() => break,
                    c => cur.push(c),
                }
                i += 1;
            }
        }
        out.push(cur);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(req) = parse_request(&mut buf, &RequestLimits::default())? {
            out.push(req.to_vec().into_iter().map(|b| b.to_vec()).collect());
        }
        Ok(out)
    }

    #[test]
    fn multibulk_and_pipelining() {
        let got = parse_all(b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
        assert_eq!(
            got,
            vec![vec![b"PING".to_vec()], vec![b"GET".to_vec(), b"k".to_vec()]]
        );
    }

    #[test]
    fn incomplete_consumes_nothing_at_every_split() {
        let full = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert!(matches!(
                parse_request(&mut buf, &RequestLimits::default()),
                Ok(None)
            ));
            assert_eq!(buf.len(), cut);
        }
        let got = parse_all(full).unwrap();
        assert_eq!(got[0][2], b"hello");
    }

    #[test]
    fn binary_safe_bulk() {
        let got = parse_all(b"*1\r\n$4\r\na\r\nb\r\n").unwrap();
        assert_eq!(got[0][0], b"a\r\nb");
    }

    #[test]
    fn inline_commands() {
        let got = parse_all(b"PING\r\nset k \"a b\\n\" 'c d'\n\r\n").unwrap();
        assert_eq!(got[0], vec![b"PING".to_vec()]);
        assert_eq!(
            got[1],
            vec![
                b"set".to_vec(),
                b"k".to_vec(),
                b"a b\n".to_vec(),
                b"c d".to_vec()
            ]
        );
        assert!(got[2].is_empty());
    }

    #[test]
    fn protocol_errors() {
        assert!(parse_all(b"*x\r\n").is_err());
        assert!(parse_all(b"*1\r\n+foo\r\n").is_err());
        assert!(parse_all(b"*1\r\n$-5\r\n").is_err());
        assert!(parse_all(b"*1\r\n$3\r\nabcd\r\n").is_err());
        assert!(parse_all(b"set k \"unterminated\r\n").is_err());
        assert!(parse_all(b"*99999999999999999999\r\n").is_err());
    }

    #[test]
    fn limits_are_enforced() {
        let limits = RequestLimits {
            max_bulk_len: 4,
            max_args: 2,
            max_inline_len: 8,
            max_request_bytes: 64,
        };
        let mut b = BytesMut::from(&b"*3\r\n"[..]);
        assert!(parse_request(&mut b, &limits).is_err());
        let mut b = BytesMut::from(&b"*1\r\n$5\r\n"[..]);
        assert!(parse_request(&mut b, &limits).is_err());
        let mut b = BytesMut::from(&b"aaaaaaaaaaaaaaaaaaa"[..]);
        assert!(parse_request(&mut b, &limits).is_err());
        let mut b = BytesMut::from(&b"*1\r\n$4\r\nabcd\r\n"[..]);
        assert!(parse_request(&mut b, &limits).unwrap().is_some());
    }

    #[test]
    fn many_arguments_spill_past_the_inline_spans() {
        let mut wire = b"*12\r\n".to_vec();
        for i in 0..12 {
            wire.extend_from_slice(format!("$2\r\na{}\r\n", i % 10).as_bytes());
        }
        let got = parse_all(&wire).unwrap();
        assert_eq!(got[0].len(), 12);
        assert_eq!(got[0][11], b"a1");
        let r = Request::from_args(&["x", "yy", "", "zzz"]);
        assert_eq!(
            (r.len(), r.get(1), r.get(2), r.get(4)),
            (4, Some(&b"yy"[..]), Some(&b""[..]), None)
        );
    }

    #[test]
    fn empty_array_is_skipped() {
        let got = parse_all(b"*0\r\n*-1\r\n").unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|r| r.is_empty()));
    }

    fn feed_in_pieces(wire: &[u8], piece: usize, authed: bool) -> Vec<Request> {
        let mut p = RequestParser::default();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for chunk in wire.chunks(piece) {
            buf.extend_from_slice(chunk);
            while let Some(r) = p
                .parse(&mut buf, &RequestLimits::default(), authed)
                .unwrap()
            {
                out.push(r);
            }
        }
        assert!(buf.is_empty() && !p.is_mid_request());
        out
    }

    #[test]
    fn a_request_fed_byte_by_byte_parses_the_same() {
        let wire = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\nPING\r\n*1\r\n$4\r\nPING\r\n";
        for piece in [1, 2, 3, 5, 7, 64] {
            let got: Vec<Vec<Bytes>> = feed_in_pieces(wire, piece, true)
                .iter()
                .map(Request::to_vec)
                .collect();
            assert_eq!(got.len(), 3, "piece {piece}");
            assert_eq!(got[0][2], &b"hello"[..]);
            assert_eq!(got[1][0], &b"PING"[..]);
        }
    }

    #[test]
    fn parsing_work_is_linear_in_the_bytes_received() {
        // 65,536 arguments arriving 14 bytes at a time: rescanning from the start on every
        // read would examine billions of bytes.
        let mut wire = b"*65536\r\n".to_vec();
        for _ in 0..65536 {
            wire.extend_from_slice(b"$1\r\nx\r\n");
        }
        SCANNED.with(|c| c.set(0));
        let reqs = feed_in_pieces(&wire, 14, true);
        assert_eq!(reqs[0].len(), 65536);
        let scanned = SCANNED.with(|c| c.get());
        assert!(
            scanned <= 2 * wire.len(),
            "examined {scanned} bytes for a {} byte request",
            wire.len()
        );
        // An inline line trickling in is scanned once too.
        let mut line = vec![b'a'; 60_000];
        line.extend_from_slice(b"\r\n");
        SCANNED.with(|c| c.set(0));
        assert_eq!(feed_in_pieces(&line, 14, true).len(), 1);
        assert!(SCANNED.with(|c| c.get()) <= 2 * line.len());
    }

    #[test]
    fn the_size_cap_counts_bulk_bytes_and_refuses_before_they_arrive() {
        let limits = RequestLimits {
            max_request_bytes: 1024,
            ..RequestLimits::default()
        };
        let mut p = RequestParser::default();
        // The header alone announces more than the cap: refused without waiting for the data.
        let mut b = BytesMut::from(&b"*2\r\n$3\r\nSET\r\n$2000\r\n"[..]);
        let e = p.parse(&mut b, &limits, true).unwrap_err();
        assert!(e.to_string().contains("client-query-buffer-limit"), "{e}");
        // Many small arguments that add up past the cap are refused too.
        let mut p = RequestParser::default();
        let mut b = BytesMut::from(&b"*1000\r\n"[..]);
        let mut refused = false;
        for _ in 0..1000 {
            b.extend_from_slice(b"$1\r\nx\r\n");
            match p.parse(&mut b, &limits, true) {
                Ok(None) => {}
                Ok(Some(_)) => panic!("a request over the cap was accepted"),
                Err(_) => {
                    refused = true;
                    break;
                }
            }
        }
        assert!(refused);
        // Within the cap it parses.
        let mut b = BytesMut::from(&b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"[..]);
        assert!(
            RequestParser::default()
                .parse(&mut b, &limits, true)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn unauthenticated_clients_get_the_handshake_limits() {
        let limits = RequestLimits::default();
        let mut b = BytesMut::from(&b"*11\r\n"[..]);
        let e = RequestParser::default()
            .parse(&mut b, &limits, false)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "Protocol error: unauthenticated multibulk length"
        );
        let mut b = BytesMut::from(&b"*2\r\n$4\r\nAUTH\r\n$16385\r\n"[..]);
        let e = RequestParser::default()
            .parse(&mut b, &limits, false)
            .unwrap_err();
        assert_eq!(e.to_string(), "Protocol error: unauthenticated bulk length");
        let mut b = BytesMut::from(&b"*11\r\n"[..]);
        assert!(matches!(
            RequestParser::default().parse(&mut b, &limits, true),
            Ok(None)
        ));
    }

    #[test]
    fn inline_requests_obey_the_argument_cap() {
        let limits = RequestLimits {
            max_args: 3,
            ..RequestLimits::default()
        };
        let mut b = BytesMut::from(&b"a b c d\r\n"[..]);
        assert!(parse_request(&mut b, &limits).is_err());
        let mut b = BytesMut::from(&b"a b c\r\n"[..]);
        assert!(parse_request(&mut b, &limits).unwrap().is_some());
    }
}
