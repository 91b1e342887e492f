//! Encodes replies straight into an output buffer, in RESP2 or RESP3.
//!
//! Replies are written as they are computed (no intermediate tree): a shard encodes a whole
//! batch of replies into one buffer, and the connection writes it with one syscall.
//!
//! Every error reply is counted by its code (its first word), for INFO's `errorstats`: the
//! thread that encodes replies for a node's clients names the counters once with
//! `count_errors_in`, and `ReplyWriter::error` then pays one relaxed atomic add per error and
//! nothing on any other reply.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The error codes counted one by one, sorted by name as Redis lists them; any other code is
/// counted in one more bucket, shown as `OTHER`.
pub(crate) const ERROR_CODES: [&str; 19] = [
    "ASK",
    "BUSY",
    "CLUSTERDOWN",
    "CROSSSLOT",
    "ERR",
    "EXECABORT",
    "LOADING",
    "MASTERDOWN",
    "MOVED",
    "NOAUTH",
    "NOPERM",
    "NOPROTO",
    "NOSCRIPT",
    "OOM",
    "READONLY",
    "TRYAGAIN",
    "UNKNOWN",
    "WRONGPASS",
    "WRONGTYPE",
];

/// Counts of error replies by code: one slot per entry of `ERROR_CODES`, then the overflow.
#[derive(Debug, Default)]
pub struct ErrorCounts {
    counts: [AtomicU64; ERROR_CODES.len() + 1],
}

impl ErrorCounts {
    /// Counts one error whose message starts with its code.
    pub fn count(&self, msg: &str) {
        let code = msg.split(' ').next().unwrap_or("");
        let slot = ERROR_CODES
            .iter()
            .position(|c| *c == code)
            .unwrap_or(ERROR_CODES.len());
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
    }

    /// `(code, count)` for every code, the overflow last as `OTHER`.
    pub fn snapshot(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        ERROR_CODES
            .iter()
            .copied()
            .chain(std::iter::once("OTHER"))
            .zip(self.counts.iter().map(|c| c.load(Ordering::Relaxed)))
    }

    pub fn reset(&self) {
        for c in &self.counts {
            c.store(0, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// Where this thread's error replies are counted; none on threads that serve no node.
    static ERROR_SINK: RefCell<Option<Arc<ErrorCounts>>> = const { RefCell::new(None) };
}

/// Counts every error reply encoded on this thread from now on in `counts`.
pub(crate) fn count_errors_in(counts: Arc<ErrorCounts>) {
    ERROR_SINK.with_borrow_mut(|s| *s = Some(counts));
}

/// Appends RESP-encoded values to `buf`. `resp3` selects the protocol negotiated with `HELLO`.
pub struct ReplyWriter<'a> {
    pub buf: &'a mut Vec<u8>,
    pub resp3: bool,
}

/// Appends `kind`, `v` in decimal and CRLF as one copy: integer replies, aggregate headers and
/// bulk lengths are most of what a rate-limit reply is made of.
fn push_line(buf: &mut Vec<u8>, kind: u8, v: i64) {
    // The kind, a sign and 19 digits (i64's widest), CRLF.
    let mut tmp = [0u8; 23];
    tmp[21] = b'\r';
    tmp[22] = b'\n';
    let i = digits_before(&mut tmp, 21, v) - 1;
    tmp[i] = kind;
    buf.extend_from_slice(&tmp[i..]);
}

/// Writes `v` in decimal into `tmp`, ending just before `end`; returns where it starts. `end`
/// must leave room for 20 bytes (a sign and i64's 19 digits).
fn digits_before(tmp: &mut [u8], end: usize, v: i64) -> usize {
    let neg = v < 0;
    let mut n = v.unsigned_abs();
    let mut i = end;
    loop {
        i -= 1;
        tmp[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if neg {
        i -= 1;
        tmp[i] = b'-';
    }
    i
}

impl<'a> ReplyWriter<'a> {
    pub fn new(buf: &'a mut Vec<u8>, resp3: bool) -> Self {
        ReplyWriter { buf, resp3 }
    }

    pub fn ok(&mut self) {
        self.buf.extend_from_slice(b"+OK\r\n");
    }

    /// A simple string; `s` must not contain CR or LF.
    pub fn simple(&mut self, s: &str) {
        self.buf.push(b'+');
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.extend_from_slice(b"\r\n");
    }

    /// An error reply; `msg` starts with its code (`ERR ...`, `WRONGTYPE ...`). Line breaks in
    /// the message are replaced so the reply stays one line.
    pub fn error(&mut self, msg: &str) {
        ERROR_SINK.with_borrow(|s| {
            if let Some(counts) = s {
                counts.count(msg);
            }
        });
        self.buf.push(b'-');
        for &b in msg.as_bytes() {
            self.buf
                .push(if b == b'\r' || b == b'\n' { b' ' } else { b });
        }
        self.buf.extend_from_slice(b"\r\n");
    }

    pub fn int(&mut self, v: i64) {
        push_line(self.buf, b':', v);
    }

    /// An array of integers, such as a rate-limit reply, written with one copy: the lines are
    /// laid out back to front in a buffer on the stack, since digits come lowest first.
    pub fn int_array(&mut self, vals: &[i64]) {
        /// Values laid out on the stack; longer arrays go line by line.
        const MAX: usize = 8;
        /// `:`, a sign and 19 digits, CRLF.
        const LINE: usize = 23;
        if vals.len() > MAX {
            self.array(vals.len());
            for &v in vals {
                self.int(v);
            }
            return;
        }
        // The header, `*N` and CRLF with N a single digit, then the lines.
        let mut tmp = [0u8; 4 + MAX * LINE];
        let mut i = tmp.len();
        for &v in vals.iter().rev() {
            i -= 2;
            tmp[i] = b'\r';
            tmp[i + 1] = b'\n';
            i = digits_before(&mut tmp, i, v) - 1;
            tmp[i] = b':';
        }
        i -= 4;
        tmp[i..i + 4].copy_from_slice(&[b'*', b'0' + vals.len() as u8, b'\r', b'\n']);
        self.buf.extend_from_slice(&tmp[i..]);
    }

    pub fn bulk(&mut self, data: &[u8]) {
        push_line(self.buf, b'$', data.len() as i64);
        self.buf.extend_from_slice(data);
        self.buf.extend_from_slice(b"\r\n");
    }

    /// A bulk string holding the decimal form of `v` (what GET returns for a counter).
    pub fn bulk_int(&mut self, v: i64) {
        let mut tmp = [0u8; 20];
        let start = digits_before(&mut tmp, 20, v);
        let s = &tmp[start..];
        push_line(self.buf, b'$', s.len() as i64);
        self.buf.extend_from_slice(s);
        self.buf.extend_from_slice(b"\r\n");
    }

    /// The null reply: `$-1` in RESP2, `_` in RESP3.
    pub fn null(&mut self) {
        if self.resp3 {
            self.buf.extend_from_slice(b"_\r\n");
        } else {
            self.buf.extend_from_slice(b"$-1\r\n");
        }
    }

    /// The null array: `*-1` in RESP2, `_` in RESP3.
    pub fn null_array(&mut self) {
        if self.resp3 {
            self.buf.extend_from_slice(b"_\r\n");
        } else {
            self.buf.extend_from_slice(b"*-1\r\n");
        }
    }

    pub fn array(&mut self, len: usize) {
        self.header(b'*', len);
    }

    /// A map of `len` pairs; RESP2 flattens it into an array of `2 * len` elements.
    pub fn map(&mut self, len: usize) {
        if self.resp3 {
            self.header(b'%', len);
        } else {
            self.header(b'*', len * 2);
        }
    }

    /// A set; RESP2 sends it as an array.
    pub fn set(&mut self, len: usize) {
        self.header(if self.resp3 { b'~' } else { b'*' }, len);
    }

    /// A verbatim text reply (INFO, CLUSTER NODES): `=` with `txt:` in RESP3, bulk in RESP2.
    pub fn verbatim(&mut self, text: &str) {
        if self.resp3 {
            push_line(self.buf, b'=', text.len() as i64 + 4);
            self.buf.extend_from_slice(b"txt:");
            self.buf.extend_from_slice(text.as_bytes());
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(text.as_bytes());
        }
    }

    /// A double, given as its text (`%.17g`, `inf`, `-inf`, `nan`): `,` in RESP3, a bulk
    /// string in RESP2.
    pub fn double(&mut self, text: &[u8]) {
        if self.resp3 {
            self.buf.push(b',');
            self.buf.extend_from_slice(text);
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(text);
        }
    }

    /// A boolean: `#t`/`#f` in RESP3, the integer 1 or 0 in RESP2.
    pub fn boolean(&mut self, b: bool) {
        if self.resp3 {
            self.buf
                .extend_from_slice(if b { b"#t\r\n" } else { b"#f\r\n" });
        } else {
            self.int(i64::from(b));
        }
    }

    /// A big number, given as its digits: `(` in RESP3, a bulk string in RESP2.
    pub fn big_number(&mut self, digits: &[u8]) {
        if self.resp3 {
            self.buf.push(b'(');
            self.buf.extend_from_slice(digits);
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(digits);
        }
    }

    /// A verbatim string with its three-byte `format`: `=` in RESP3, a bulk string of the
    /// text alone in RESP2.
    pub fn verbatim_as(&mut self, format: &[u8; 3], text: &[u8]) {
        if self.resp3 {
            push_line(self.buf, b'=', text.len() as i64 + 4);
            self.buf.extend_from_slice(format);
            self.buf.push(b':');
            self.buf.extend_from_slice(text);
            self.buf.extend_from_slice(b"\r\n");
        } else {
            self.bulk(text);
        }
    }

    fn header(&mut self, kind: u8, len: usize) {
        push_line(self.buf, kind, len as i64);
    }

    /// Writes a map entry whose key is a bulk string and whose value is an integer.
    pub fn kv_int(&mut self, key: &str, v: i64) {
        self.bulk(key.as_bytes());
        self.int(v);
    }

    /// Writes a map entry whose key and value are bulk strings.
    pub fn kv_str(&mut self, key: &str, v: &str) {
        self.bulk(key.as_bytes());
        self.bulk(v.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(resp3: bool, f: impl FnOnce(&mut ReplyWriter)) -> String {
        let mut buf = Vec::new();
        f(&mut ReplyWriter::new(&mut buf, resp3));
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn scalars() {
        assert_eq!(enc(false, |w| w.int(-42)), ":-42\r\n");
        assert_eq!(enc(false, |w| w.int(i64::MIN)), ":-9223372036854775808\r\n");
        assert_eq!(enc(false, |w| w.int(0)), ":0\r\n");
        assert_eq!(enc(false, |w| w.bulk(b"hi")), "$2\r\nhi\r\n");
        assert_eq!(enc(false, |w| w.bulk_int(-7)), "$2\r\n-7\r\n");
        assert_eq!(
            enc(false, |w| w.bulk_int(i64::MIN)),
            "$20\r\n-9223372036854775808\r\n"
        );
        assert_eq!(enc(true, |w| w.verbatim("ab")), "=6\r\ntxt:ab\r\n");
        assert_eq!(enc(false, |w| w.error("ERR a\r\nb")), "-ERR a  b\r\n");
    }

    #[test]
    fn an_int_array_is_what_a_header_and_its_ints_write() {
        let extremes = [i64::MIN, i64::MAX, -1, 0, 9, 10, -10, 1 << 40];
        for len in 0..=extremes.len() + 2 {
            let vals: Vec<i64> = extremes.iter().copied().cycle().take(len).collect();
            for resp3 in [false, true] {
                let one_by_one = enc(resp3, |w| {
                    w.array(vals.len());
                    for &v in &vals {
                        w.int(v);
                    }
                });
                assert_eq!(enc(resp3, |w| w.int_array(&vals)), one_by_one, "{vals:?}");
            }
        }
    }

    #[test]
    fn errors_are_counted_by_code_on_a_counting_thread() {
        let counts = Arc::new(ErrorCounts::default());
        let c = counts.clone();
        std::thread::spawn(move || {
            count_errors_in(c);
            for m in ["ERR x", "WRONGTYPE y", "ERR", "NOTACODE z", "MOVED 1 h:1"] {
                enc(false, |w| w.error(m));
            }
            enc(false, |w| w.ok());
        })
        .join()
        .unwrap();
        let got: Vec<_> = counts.snapshot().filter(|(_, n)| *n > 0).collect();
        assert_eq!(
            got,
            [("ERR", 2), ("MOVED", 1), ("WRONGTYPE", 1), ("OTHER", 1)]
        );
        // Threads that serve no node count nothing.
        enc(false, |w| w.error("ERR not counted"));
        assert_eq!(counts.snapshot().map(|(_, n)| n).sum::<u64>(), 5);
    }

    #[test]
    fn protocol_dependent_shapes() {
        assert_eq!(enc(false, |w| w.null()), "$-1\r\n");
        assert_eq!(enc(true, |w| w.null()), "_\r\n");
        assert_eq!(enc(false, |w| w.map(2)), "*4\r\n");
        assert_eq!(enc(true, |w| w.map(2)), "%2\r\n");
        assert_eq!(enc(true, |w| w.verbatim("ab")), "=6\r\ntxt:ab\r\n");
        assert_eq!(enc(false, |w| w.verbatim("ab")), "$2\r\nab\r\n");
    }
}
