//! The body of a frame from a peer node (what follows its `u32` length): any bytes a peer, or
//! anything else that reaches the cluster port, sends must decode or be refused with an error,
//! never panic and never make the node allocate far beyond the frame's own size.
#![no_main]
use bucketd::testing::decode_peer_frame;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_peer_frame(data);
});
