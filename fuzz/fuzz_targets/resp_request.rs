//! The RESP request parser, fed as a connection feeds it: the bytes arrive in fragments cut
//! where the fuzzer chooses, the buffer grows, and one parser carries its partial state from
//! read to read. The requests (and whether the stream ends in a protocol error) must be the
//! same as when every byte is there at once, and every parsed request must survive being
//! written back out as a multibulk and parsed again.
//!
//! Input: `[flags][cut count][cuts...][wire...]`. Flag bit 0: the client has authenticated;
//! bit 1: small limits, so the size and count caps are reached.
#![no_main]
use bucketd::testing::{RequestLimits, RequestParser};

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;

type Args = Vec<Vec<u8>>;

/// What a stream parses into: its requests, in order, whether it ended in a protocol error,
/// and how many bytes were left waiting for more.
#[derive(Debug, PartialEq)]
struct Outcome {
    requests: Vec<Args>,
    error: bool,
    left: usize,
}

fn limits(small: bool) -> RequestLimits {
    if small {
        RequestLimits {
            max_bulk_len: 32,
            max_args: 8,
            max_inline_len: 64,
            max_request_bytes: 256,
        }
    } else {
        RequestLimits::default()
    }
}

/// Parses what `buf` holds into `out` until the parser asks for more or refuses; true once
/// it has refused.
fn drain(
    parser: &mut RequestParser,
    buf: &mut BytesMut,
    limits: &RequestLimits,
    authed: bool,
    out: &mut Vec<Args>,
) -> bool {
    loop {
        let before = buf.len();
        match parser.parse(buf, limits, authed) {
            Ok(Some(req)) => {
                assert!(buf.len() < before, "a request consumed nothing");
                // Its arguments lie within the bytes it took (exactly them, for a multibulk).
                assert!(
                    req.wire_len() <= before - buf.len(),
                    "request claims too much"
                );
                out.push(req.to_vec().into_iter().map(|b| b.to_vec()).collect());
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "an incomplete request consumed bytes");
                return false;
            }
            Err(_) => return true,
        }
    }
}

fn parse_whole(wire: &[u8], limits: &RequestLimits, authed: bool) -> Outcome {
    let mut buf = BytesMut::from(wire);
    let mut requests = Vec::new();
    let error = drain(
        &mut RequestParser::default(),
        &mut buf,
        limits,
        authed,
        &mut requests,
    );
    Outcome {
        requests,
        error,
        left: if error { 0 } else { buf.len() },
    }
}

fn parse_in_fragments(
    wire: &[u8],
    cuts: &[usize],
    limits: &RequestLimits,
    authed: bool,
) -> Outcome {
    let mut parser = RequestParser::default();
    let mut buf = BytesMut::new();
    let mut requests = Vec::new();
    let mut from = 0;
    for &to in cuts.iter().chain(std::iter::once(&wire.len())) {
        buf.extend_from_slice(&wire[from..to]);
        from = to;
        if drain(&mut parser, &mut buf, limits, authed, &mut requests) {
            return Outcome {
                requests,
                error: true,
                left: 0,
            };
        }
    }
    Outcome {
        requests,
        error: false,
        left: buf.len(),
    }
}

fn to_multibulk(args: &Args) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((&ncuts, rest)) = rest.split_first() else {
        return;
    };
    let ncuts = usize::from(ncuts % 16).min(rest.len());
    let (cut_bytes, wire) = rest.split_at(ncuts);
    let authed = flags & 1 == 1;
    let limits = limits(flags & 2 == 2);

    // Cut points: each byte picks a place in the wire, in order.
    let mut cuts: Vec<usize> = cut_bytes
        .iter()
        .map(|&c| usize::from(c) * wire.len() / 255)
        .collect();
    cuts.sort_unstable();

    let whole = parse_whole(wire, &limits, authed);
    let pieces = parse_in_fragments(wire, &cuts, &limits, authed);
    assert_eq!(whole, pieces, "cuts {cuts:?}");
    let bytewise: Vec<usize> = (1..wire.len().min(300)).collect();
    if wire.len() < 300 {
        assert_eq!(whole, parse_in_fragments(wire, &bytewise, &limits, authed));
    }

    // A request written back as a multibulk parses to the same arguments (with limits that
    // admit it: an inline request's arguments may be written larger than they arrived).
    for args in whole.requests.iter().filter(|a| !a.is_empty()) {
        let again = parse_whole(&to_multibulk(args), &RequestLimits::default(), true);
        assert_eq!(again.requests, vec![args.clone()]);
        assert!(!again.error && again.left == 0);
    }
});
