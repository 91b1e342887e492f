//! The golden reply corpus: 710 requests in 39 groups from `tests/corpus/requests.txt`, sent
//! to a standalone node (two shards, a manual clock that only moves when a group says so) over
//! raw TCP, each reply's bytes compared with `tests/corpus/replies.golden`.
//!
//! The request file's format:
//! - Groups are separated by blank lines; each runs on a fresh connection, after a FLUSHALL
//!   that is not recorded. `#` starts a comment line.
//! - A group may start with directives: `@resp3` sends `HELLO 3` first (its reply, which holds
//!   the connection's id, is only checked to be a map).
//! - `@advance MS` on a line of its own moves the node's clock forward (nothing is sent).
//! - Any other line is one request, written as shell-like words: `"..."` and bare words take
//!   the escapes `\xNN`, `\r`, `\n`, `\t`, `\0`, `\\`, `\"`, `\'` and `\ ` (a space);
//!   `'...'` is literal; `""` is an empty argument; a whole bare word `{N*c}` is N copies of
//!   the character c. It is sent as a RESP array of bulk strings, and one reply is read.
//! - A request may start with modifiers: `[inline]` sends the rest of the line (escapes
//!   decoded) followed by `\r\n` as an inline command; `[raw]` sends the rest of the line
//!   (escapes decoded) as it is; `[close]` reads everything until the server closes the
//!   connection instead of one reply; `[mask]` replaces every run of digits in the reply by
//!   `#` (for replies that hold a connection's id).
//!
//! A reply cut short by the server closing the connection, and every `[close]` reply, ends in
//! `<closed>` in the golden file. Every HELLO reply has its `id` field's integer replaced by
//! `#`. The whole corpus takes about a second.
//!
//! `BUCKETD_RECORD_CORPUS=1 cargo test --all-features --test reply_corpus` writes the golden
//! file anew from what the node answers.

mod common;

use common::{TestNode, bounded, parse};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one reply, or one close, may take.
const WAIT: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Mods {
    inline: bool,
    raw: bool,
    close: bool,
    mask: bool,
}

enum Step {
    /// Moves the clock forward by this many milliseconds.
    Advance(u64),
    Request {
        /// The line as written, for the golden file and for failures.
        text: String,
        /// The line number in the request file.
        line: usize,
        mods: Mods,
        bytes: Vec<u8>,
    },
}

struct Group {
    line: usize,
    resp3: bool,
    steps: Vec<Step>,
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("corpus")
}

/// Decodes the escapes of a `"..."` or bare word into `out`; `i` is past the backslash.
fn escape(chars: &[char], i: &mut usize, out: &mut Vec<u8>, line: usize) {
    let c = chars
        .get(*i)
        .unwrap_or_else(|| panic!("line {line}: a backslash ends the line"));
    *i += 1;
    match c {
        'r' => out.push(b'\r'),
        'n' => out.push(b'\n'),
        't' => out.push(b'\t'),
        '0' => out.push(0),
        'x' => {
            let hex: String = chars
                .get(*i..*i + 2)
                .unwrap_or_else(|| panic!("line {line}: \\x needs two hex digits"))
                .iter()
                .collect();
            let b = u8::from_str_radix(&hex, 16)
                .unwrap_or_else(|_| panic!("line {line}: bad \\x escape {hex:?}"));
            out.push(b);
            *i += 2;
        }
        '\\' | '"' | '\'' | ' ' => out.push(*c as u8),
        other => panic!("line {line}: unknown escape \\{other}"),
    }
}

fn push_char(out: &mut Vec<u8>, c: char) {
    let mut b = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
}

/// Decodes the escapes of a whole text (for `[inline]` and `[raw]`).
fn unescape(text: &str, line: usize) -> Vec<u8> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        i += 1;
        if c == '\\' {
            escape(&chars, &mut i, &mut out, line);
        } else {
            push_char(&mut out, c);
        }
    }
    out
}

/// Splits a request line into its arguments.
fn words(text: &str, line: usize) -> Vec<Vec<u8>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if i == chars.len() {
            return out;
        }
        let mut word = Vec::new();
        let mut plain = String::new();
        let mut quoted = false;
        while i < chars.len() && !chars[i].is_whitespace() {
            let c = chars[i];
            i += 1;
            match c {
                '\\' => escape(&chars, &mut i, &mut word, line),
                '"' => {
                    quoted = true;
                    loop {
                        let c = *chars
                            .get(i)
                            .unwrap_or_else(|| panic!("line {line}: unclosed \""));
                        i += 1;
                        match c {
                            '"' => break,
                            '\\' => escape(&chars, &mut i, &mut word, line),
                            c => push_char(&mut word, c),
                        }
                    }
                }
                '\'' => {
                    quoted = true;
                    loop {
                        let c = *chars
                            .get(i)
                            .unwrap_or_else(|| panic!("line {line}: unclosed '"));
                        i += 1;
                        if c == '\'' {
                            break;
                        }
                        push_char(&mut word, c);
                    }
                }
                c => {
                    plain.push(c);
                    push_char(&mut word, c);
                }
            }
        }
        if !quoted
            && plain.len() == word.len()
            && let Some(rep) = repeat(&plain)
        {
            word = rep;
        }
        out.push(word);
    }
}

/// `{N*c}`: N copies of the character c.
fn repeat(word: &str) -> Option<Vec<u8>> {
    let inner = word.strip_prefix('{')?.strip_suffix('}')?;
    let (n, c) = inner.split_once('*')?;
    let n: usize = n.parse().ok()?;
    let mut chars = c.chars();
    let c = chars.next()?;
    if chars.next().is_some() {
        return None;
    }
    Some(c.to_string().repeat(n).into_bytes())
}

fn parse_corpus(text: &str) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut open = false;
    for (n, raw_line) in text.lines().enumerate() {
        let line = n + 1;
        let trimmed = raw_line.trim();
        if trimmed.is_empty() {
            open = false;
            continue;
        }
        if trimmed.starts_with('#') {
            continue;
        }
        if !open {
            groups.push(Group {
                line,
                resp3: false,
                steps: Vec::new(),
            });
            open = true;
        }
        let g = groups.last_mut().expect("a group is open");
        if trimmed == "@resp3" {
            assert!(g.steps.is_empty(), "line {line}: @resp3 must start a group");
            g.resp3 = true;
            continue;
        }
        if let Some(ms) = trimmed.strip_prefix("@advance ") {
            let ms = ms
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("line {line}: @advance takes milliseconds"));
            g.steps.push(Step::Advance(ms));
            continue;
        }
        assert!(
            !trimmed.starts_with('@'),
            "line {line}: unknown directive {trimmed:?}"
        );
        let mut mods = Mods::default();
        let mut rest = trimmed;
        loop {
            let next = if let Some(r) = rest.strip_prefix("[inline]") {
                mods.inline = true;
                r
            } else if let Some(r) = rest.strip_prefix("[raw]") {
                mods.raw = true;
                r
            } else if let Some(r) = rest.strip_prefix("[close]") {
                mods.close = true;
                r
            } else if let Some(r) = rest.strip_prefix("[mask]") {
                mods.mask = true;
                r
            } else {
                break;
            };
            rest = next.trim_start();
        }
        let bytes = if mods.raw {
            unescape(rest, line)
        } else if mods.inline {
            let mut b = unescape(rest, line);
            b.extend_from_slice(b"\r\n");
            b
        } else {
            let args = words(rest, line);
            assert!(!args.is_empty(), "line {line}: no words");
            common::encode_bytes(&args.iter().map(Vec::as_slice).collect::<Vec<_>>())
        };
        g.steps.push(Step::Request {
            text: trimmed.to_string(),
            line,
            mods,
            bytes,
        });
    }
    groups
}

/// A connection that reads whole replies as raw bytes.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(node: &TestNode) -> Conn {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(node.addr))
            .await
            .expect("connect within the timeout")
            .expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match tokio::time::timeout(WAIT, self.stream.write_all(bytes)).await {
            Ok(r) => r,
            Err(_) => Err(std::io::Error::other("write timed out")),
        }
    }

    /// Reads more bytes: `Ok(false)` when the server closed the connection.
    async fn fill(&mut self, what: &str) -> Result<bool, String> {
        let mut chunk = [0u8; 64 * 1024];
        match tokio::time::timeout(WAIT, self.stream.read(&mut chunk)).await {
            Err(_) => Err(format!(
                "no complete {what} within {WAIT:?}; read so far: {:?}",
                String::from_utf8_lossy(&self.buf)
            )),
            Ok(Ok(0)) | Ok(Err(_)) => Ok(false),
            Ok(Ok(n)) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(true)
            }
        }
    }

    /// The raw bytes of one reply, or what arrived before the connection closed (then ending
    /// in `<closed>`).
    async fn reply(&mut self) -> Result<Vec<u8>, String> {
        loop {
            let mut at = 0;
            match parse(&self.buf, &mut at) {
                Ok(Some(_)) => return Ok(self.buf.drain(..at).collect()),
                Ok(None) => {}
                Err(e) => return Err(format!("malformed reply ({e}): {:?}", self.buf)),
            }
            if !self.fill("reply").await? {
                let mut out = std::mem::take(&mut self.buf);
                out.extend_from_slice(b"<closed>");
                return Ok(out);
            }
        }
    }

    /// Everything that arrives until the server closes the connection.
    async fn until_closed(&mut self) -> Result<Vec<u8>, String> {
        while self.fill("close").await? {}
        let mut out = std::mem::take(&mut self.buf);
        out.extend_from_slice(b"<closed>");
        Ok(out)
    }
}

/// Every run of ASCII digits becomes `#`.
fn mask_digits(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_digit() {
            if out.last() != Some(&b'#') {
                out.push(b'#');
            }
        } else {
            out.push(b);
        }
    }
    out
}

/// A HELLO reply's connection id (`id` then an integer) becomes `#`.
fn mask_hello_id(bytes: &[u8]) -> Vec<u8> {
    const FIELD: &[u8] = b"$2\r\nid\r\n:";
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i..].starts_with(FIELD) {
            out.extend_from_slice(FIELD);
            i += FIELD.len();
            let digits = bytes[i..].iter().take_while(|b| b.is_ascii_digit()).count();
            if digits > 0 {
                out.push(b'#');
                i += digits;
            }
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// The reply in the golden file's form: one line per RESP line, `\r` and `\n` escaped, bytes
/// outside printable ASCII as `\xNN`.
fn show(bytes: &[u8]) -> String {
    let mut out = String::from("< ");
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\r' => out.push_str("\\r"),
            b'\n' => {
                out.push_str("\\n");
                if i + 1 < bytes.len() {
                    out.push_str("\n< ");
                }
            }
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            _ => {
                let _ = write!(out, "\\x{b:02x}");
            }
        }
    }
    out.push('\n');
    out
}

/// Runs every group and returns the golden text, plus how many requests it holds.
async fn run_corpus(node: &TestNode, groups: &[Group]) -> (String, usize) {
    let mut out = String::from(
        "# The replies to tests/corpus/requests.txt, byte for byte: `>` is a request as written,\n\
         # `<` the raw reply, one line per RESP line. Written by\n\
         # BUCKETD_RECORD_CORPUS=1 cargo test --all-features --test reply_corpus\n",
    );
    let mut count = 0;
    for (gi, g) in groups.iter().enumerate() {
        let _ = write!(out, "\n## group {} (line {})\n", gi + 1, g.line);
        let mut c = Conn::open(node).await;
        c.send(b"*1\r\n$8\r\nFLUSHALL\r\n")
            .await
            .expect("send FLUSHALL");
        let flushed = c.reply().await.expect("FLUSHALL answers");
        assert_eq!(flushed, b"+OK\r\n", "FLUSHALL before group {}", gi + 1);
        if g.resp3 {
            c.send(b"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n")
                .await
                .expect("send HELLO 3");
            let hello = c.reply().await.expect("HELLO 3 answers");
            assert!(
                hello.starts_with(b"%"),
                "HELLO 3 before group {} answered {:?}",
                gi + 1,
                String::from_utf8_lossy(&hello)
            );
            out.push_str("@resp3\n");
        }
        for step in &g.steps {
            match step {
                Step::Advance(ms) => {
                    node.advance_ms(*ms);
                    let _ = writeln!(out, "@advance {ms}");
                }
                Step::Request {
                    text,
                    line,
                    mods,
                    bytes,
                } => {
                    count += 1;
                    let got = match c.send(bytes).await {
                        Ok(()) if mods.close => c.until_closed().await,
                        Ok(()) => c.reply().await,
                        Err(e) => Err(format!("sending failed: {e}")),
                    };
                    let got = got.unwrap_or_else(|e| panic!("line {line}: {text}: no reply: {e}"));
                    let got = mask_hello_id(&got);
                    let got = if mods.mask { mask_digits(&got) } else { got };
                    let _ = writeln!(out, "> {text}");
                    out.push_str(&show(&got));
                }
            }
        }
    }
    (out, count)
}

/// The golden text cut into blocks, one per request (the request line, then its reply), each
/// with the header of its group.
fn blocks(text: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut group = String::new();
    for l in text.lines() {
        if l.starts_with("## ") {
            group = l.to_string();
        }
        if l.starts_with("> ") {
            out.push((group.clone(), String::new()));
        }
        if let Some((_, b)) = out.last_mut()
            && (l.starts_with("> ") || l.starts_with("< "))
        {
            b.push_str(l);
            b.push('\n');
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_match_the_golden_corpus() {
    bounded(async {
        let dir = corpus_dir();
        let requests =
            std::fs::read_to_string(dir.join("requests.txt")).expect("read requests.txt");
        let groups = parse_corpus(&requests);
        let node = TestNode::start().await;
        let (actual, count) = run_corpus(&node, &groups).await;
        node.shutdown().await;
        assert!(count >= 200, "the corpus holds only {count} requests");

        let golden_path = dir.join("replies.golden");
        if std::env::var_os("BUCKETD_RECORD_CORPUS").is_some_and(|v| v == "1") {
            std::fs::write(&golden_path, &actual).expect("write replies.golden");
            eprintln!(
                "recorded {count} requests in {} groups to {}",
                groups.len(),
                golden_path.display()
            );
            return;
        }
        let expected = std::fs::read_to_string(&golden_path)
            .expect("read replies.golden (record it with BUCKETD_RECORD_CORPUS=1)");
        if expected == actual {
            return;
        }
        let (want, got) = (blocks(&expected), blocks(&actual));
        let mut report = String::new();
        let mut differing = 0;
        for ((_, w), (group, g)) in want.iter().zip(&got) {
            if w != g {
                differing += 1;
                if differing <= 5 {
                    let _ = write!(report, "\n{group}\nexpected:\n{w}actual:\n{g}");
                }
            }
        }
        if differing == 0 && want.len() == got.len() {
            report.push_str("\nevery reply matches: the headers or the group layout differ");
        }
        panic!(
            "{differing} of {} replies differ from tests/corpus/replies.golden \
             ({} requests in the golden file, {} run; record it again with \
             BUCKETD_RECORD_CORPUS=1 if the change is meant){report}",
            got.len(),
            want.len(),
            got.len()
        );
    })
    .await;
}
