#!/usr/bin/env python3
"""Writes COUNT RESP-encoded commands, one per distinct key, for `redis-cli --pipe`.

usage: gen_resp.py COUNT OUTFILE ARG [ARG ...]

Each ARG is sent as given, except that `{key}` is replaced by the key of that command:
`bucket:` followed by the 1-based index zero-padded to 12 digits (19 bytes in all, the same
shape as redis-benchmark's `bucket:__rand_int__`).
"""

import sys


def encode_args(args):
    """RESP bulk strings, without the array header."""
    return b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    count = int(sys.argv[1])
    out = sys.argv[2]
    template = [a.encode() for a in sys.argv[3:]]
    key_at = [i for i, a in enumerate(template) if a == b"{key}"]
    if len(key_at) != 1:
        sys.exit("gen_resp.py: exactly one ARG must be {key}")
    # Everything around the key is the same in every command: encode it once.
    at = key_at[0]
    head = b"*%d\r\n" % len(template) + encode_args(template[:at])
    tail = encode_args(template[at + 1 :])
    chunk = []
    with open(out, "wb") as f:
        for i in range(1, count + 1):
            chunk.append(head)
            chunk.append(b"$19\r\nbucket:%012d\r\n" % i)
            chunk.append(tail)
            if len(chunk) >= 30000:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))


if __name__ == "__main__":
    main()
