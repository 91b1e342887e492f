#!/usr/bin/env python3
"""Measures what hostile clients can make a server hold, for bucketd and Redis side by side.

usage:
    python3 benches/hostile.py --server bucketd --bin target/release/bucketd
    python3 benches/hostile.py --server redis
    python3 benches/hostile.py --server bucketd --bin PATH --scenarios bigreq,trickle

Each scenario starts a fresh server on a free loopback port, pinned with `taskset -c 1` (this
script pins itself to core 0), and stops it by pid afterwards:

  bigreq   one connection sends `*65536` and then 64 KiB bulk arguments as fast as the server
           takes them, up to --cap-mb; reports how much the server read before it cut the
           connection, its peak RSS, and its RSS 2 s after the client left.
  bigreq8  the same with 8 MiB bulk arguments.
  unread   `SET big:v <1 MiB>`, then 4 clients each pipeline 1024 `GET big:v` and read nothing;
           a fifth client times 200 PINGs meanwhile; peak RSS, then RSS 5 s after the 4 left.
  trickle  one request `EXISTS` + 65,535 keys (k0..k9 repeated) sent in 14-byte writes about
           50 us apart, while another client PINGs every 10 ms; server CPU time (utime + stime)
           spent until the reply, and whether the reply was the correct `:0`.
  preauth  the server requires a password; one connection sends `*65536` and 8 MiB bulk
           arguments without authenticating; bytes read before the cut and the reply.

"Accepted before cut" is what the server's process read from its socket, not what the client
handed to its kernel: the flood is sent in steps (the array header alone, then growing pieces up
to 1 MiB), and after each step the script waits until the server-side socket's receive queue is
empty (read with sock_diag, as `ss` does). A cut inside a step is reported as the range
"read before the step - written by the end of the step"; where the two are within 5% of each
other only the upper figure is shown. Sizes are in MiB (2^20 bytes); "MB" in the table means MiB.

Python 3 standard library only. Every loop is bounded in count and time; only loopback traffic.
"""

import argparse
import fcntl
import os
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

KIB = 1 << 10
MIB = 1 << 20

SIOCOUTQ = 0x5411  # bytes the peer has not acknowledged yet (sent or still queued)
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR = 2
TCP_ESTABLISHED = 1

PING = b"*1\r\n$4\r\nPING\r\n"
PONG = b"+PONG\r\n"

SCENARIOS = ["bigreq", "bigreq8", "unread", "trickle", "preauth"]
COLUMNS = [
    "scenario",
    "server",
    "accepted before cut",
    "peak RSS MB",
    "RSS after MB",
    "PING p50 ms",
    "PING p99 ms",
    "server CPU s",
    "notes",
]


def resp(*args):
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, str):
            a = a.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(port, timeout=5.0):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def read_line(sock, timeout):
    """Reads until the first CRLF; returns what arrived (possibly without CRLF on EOF/timeout)."""
    deadline = time.monotonic() + timeout
    buf = bytearray()
    while b"\r\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            chunk = sock.recv(4096)
        except (socket.timeout, OSError):
            break
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


# ---- what the server holds, from /proc and sock_diag ------------------------------------------


def proc_status_kb(pid, field):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def rss_mib(pid):
    kb = proc_status_kb(pid, "VmRSS")
    return None if kb is None else kb / 1024


def hwm_mib(pid):
    """Peak RSS over the process's life (VmHWM): a fresh server per scenario makes it the
    scenario's peak."""
    kb = proc_status_kb(pid, "VmHWM")
    return None if kb is None else kb / 1024


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """utime + stime of the whole process (all threads), in seconds."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def outq(sock):
    """Bytes this socket has written that the peer's kernel has not acknowledged."""
    try:
        buf = fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]
    except OSError:
        return None


class SockDiag:
    """Looks up one TCP socket by its addresses (the server's end of a loopback connection)
    and returns its state and queues, as `ss` does; about 10 us per lookup."""

    def __init__(self):
        self.nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG)
        self.nl.settimeout(1.0)
        self.seq = 0

    def close(self):
        self.nl.close()

    def lookup(self, local_port, remote_port):
        """(state, rx_queue, tx_queue) of the socket 127.0.0.1:local_port <-> 127.0.0.1:
        remote_port, or None if there is none (the server closed it)."""
        lo = socket.inet_aton("127.0.0.1") + b"\0" * 12
        no_cookie = 0xFFFFFFFF
        sockid = (
            struct.pack(">HH", local_port, remote_port)
            + lo
            + lo
            + struct.pack("=III", 0, no_cookie, no_cookie)
        )
        req = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        self.seq += 1
        hdr = struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, 1, self.seq, 0)
        self.nl.send(hdr + req)
        data = self.nl.recv(65536)
        _, typ = struct.unpack_from("=IH", data)
        if typ == NLMSG_ERROR:
            return None
        state = data[17]
        sport, dport = struct.unpack_from(">HH", data, 20)
        # An exact lookup that finds no connection falls back to the listening socket.
        if sport != local_port or dport != remote_port:
            return None
        _, rq, wq = struct.unpack_from("=III", data, 16 + 4 + 48)
        return state, rq, wq


# ---- servers ------------------------------------------------------------------------------------


class Server:
    def __init__(self, kind, binary, password=None, pin=True):
        self.kind = kind
        self.binary = binary
        self.password = password
        self.pin = pin
        self.proc = None
        self.port = None
        self.dir = None
        self.log = None

    def command(self):
        if self.kind == "redis":
            cmd = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1"]
            cmd += ["--save", "", "--appendonly", "no"]
        else:
            cmd = [self.binary, "--port", str(self.port), "--shards", "1", "--bind", "127.0.0.1"]
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.pin:
            # taskset execs the server, so the pid we hold is the server's.
            cmd = ["taskset", "-c", "1"] + cmd
        return cmd

    def start(self):
        self.dir = tempfile.mkdtemp(prefix="hostile-")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        last = None
        for _ in range(3):  # the free port may be taken between the probe and the bind
            self.port = free_port()
            self.proc = subprocess.Popen(
                self.command(), cwd=self.dir, stdout=self.log, stderr=subprocess.STDOUT
            )
            try:
                self.wait_ready(10.0)
                return
            except RuntimeError as e:
                last = e
                self.stop()
        raise RuntimeError("server did not start: %s" % last)

    def wait_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("exited with %s: %s" % (self.proc.returncode, self.log_tail()))
            try:
                with connect(self.port, timeout=1.0) as s:
                    s.sendall(PING)
                    line = read_line(s, 1.0)
                    if line.startswith(b"+PONG") or line.startswith(b"-NOAUTH"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("no PONG within %.0f s" % timeout)

    def log_tail(self):
        try:
            with open(os.path.join(self.dir, "server.log"), "rb") as f:
                return f.read()[-300:].decode(errors="replace").strip()
        except OSError:
            return ""

    @property
    def pid(self):
        return self.proc.pid

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(3)
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# ---- measurements ------------------------------------------------------------------------------


def fmt_bytes(n):
    if n < KIB:
        return "%d B" % n
    if n < MIB:
        return "%.1f KiB" % (n / KIB)
    return "%.1f MiB" % (n / MIB)


def fmt_range(lo, hi):
    if hi <= 0 or (hi - lo) <= 0.05 * hi:
        return fmt_bytes(hi)
    return "%s - %s" % (fmt_bytes(lo), fmt_bytes(hi))


def fmt_mib(v):
    return "-" if v is None else "%.1f" % v


def fmt_ms(v):
    return "-" if v is None else "%.3f" % v


def fmt_reply(b, n=70):
    text = b.split(b"\r\n", 1)[0].decode(errors="replace")
    if len(text) > n:
        text = text[:n] + "..."
    return "`%s`" % text.replace("|", "\\|") if text else "none"


def percentile(values, p):
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[p - 1]


def ping_stats(lat_ms):
    if not lat_ms:
        return None, None, None
    return percentile(lat_ms, 50), percentile(lat_ms, 99), max(lat_ms)


def ping_once(sock, timeout):
    """Round trip of one PING in ms, or None on timeout / a wrong or missing reply."""
    t0 = time.perf_counter()
    try:
        sock.sendall(PING)
    except OSError:
        return None
    line = read_line(sock, timeout)
    if line != PONG:
        return None
    return (time.perf_counter() - t0) * 1000


class Pinger(threading.Thread):
    """Times a PING every `interval` seconds until stopped, at most `limit` PINGs and for at
    most `budget` seconds. A PING unanswered after `timeout` ends the series (its reply would
    be taken for the next one's); `timed_out` says so."""

    def __init__(self, port, interval, limit, timeout=15.0, budget=60.0):
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.limit = limit
        self.timeout = timeout
        self.budget = budget
        self.lat = []
        self.failed = 0
        self.timed_out = False
        self.stop_evt = threading.Event()

    def run(self):
        try:
            sock = connect(self.port)
        except OSError:
            self.failed += 1
            return
        with sock:
            nxt = time.monotonic()
            end = nxt + self.budget
            for _ in range(self.limit):
                if self.stop_evt.is_set() or time.monotonic() > end:
                    break
                t0 = time.monotonic()
                rtt = ping_once(sock, self.timeout)
                if rtt is None:
                    self.failed += 1
                    self.timed_out = time.monotonic() - t0 >= self.timeout
                    break
                self.lat.append(rtt)
                nxt += self.interval
                self.stop_evt.wait(max(0.0, nxt - time.monotonic()))


def row(scenario, label, **kw):
    r = {c: "-" for c in COLUMNS}
    r["scenario"] = scenario
    r["server"] = label
    r.update(kw)
    return r


def flood(srv, label, scenario, arg_len, cap, time_limit, stall_s=5.0):
    """Sends `*65536` and then bulk arguments of arg_len bytes until the server cuts the
    connection, `cap` bytes have gone, the server stops reading for stall_s, or time_limit."""
    header = b"*65536\r\n"
    bulk_header = b"$%d\r\n" % arg_len
    unit = bulk_header + b"x" * arg_len + b"\r\n"
    step_max = MIB
    tape = memoryview(unit * (-(-(step_max + len(unit)) // len(unit)) + 1))

    def piece(off, n):
        if off < len(header):
            return memoryview(header)[off : off + n]
        p = (off - len(header)) % len(unit)
        return tape[p : p + n]

    steps = [len(header), len(bulk_header), KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB]

    diag = None
    try:
        diag = SockDiag()
    except OSError:
        diag = None
    base = rss_mib(srv.pid)
    cpu0 = cpu_s(srv.pid)
    sock = connect(srv.port)
    sock.setblocking(False)
    cport = sock.getsockname()[1]
    if diag is not None:
        # The server's end exists (accept queue or accepted) as soon as connect() returns.
        if diag.lookup(srv.port, cport) is None:
            diag.close()
            diag = None
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)

    sent = 0  # bytes the client's kernel took
    drained = 0  # bytes the server's process is known to have read
    reply = bytearray()
    cut = None  # why the connection ended
    t0 = time.monotonic()
    last_progress = (t0, -1)

    def consumed_now():
        q = outq(sock)
        if q is None:
            return None
        rx = 0
        if diag is not None:
            info = diag.lookup(srv.port, cport)
            if info is None:
                return None
            rx = info[1]
        return sent - q - rx

    def poll_read(timeout):
        nonlocal cut
        if not sel.select(timeout):
            return
        try:
            chunk = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as e:
            cut = "reset (%s)" % e.__class__.__name__
            return
        if not chunk:
            cut = "closed by server"
        elif len(reply) < 4096:
            reply.extend(chunk)

    step_i = 0
    try:
        while cut is None and sent < cap:
            n = steps[step_i] if step_i < len(steps) else step_max
            step_i += 1
            n = min(n, cap - sent)
            data = piece(sent, n)
            before = drained
            off = 0
            # Hand the step to the kernel.
            while cut is None and off < n:
                try:
                    k = sock.send(data[off:])
                    off += k
                    sent += k
                except BlockingIOError:
                    sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
                    events = sel.select(0.2)
                    sel.modify(sock, selectors.EVENT_READ)
                    if any(ev & selectors.EVENT_READ for _, ev in events):
                        poll_read(0)
                except OSError as e:
                    cut = "write failed (%s)" % e.__class__.__name__
                if cut is None:
                    poll_read(0)
                now = time.monotonic()
                c = consumed_now() if cut is None else None
                if c is not None and c > last_progress[1]:
                    last_progress = (now, c)
                if now - last_progress[0] > stall_s:
                    cut = "stalled"
                if now - t0 > time_limit:
                    cut = "time limit"
            # Wait until the server's process has read all of it.
            while cut is None:
                c = consumed_now()
                now = time.monotonic()
                if c is not None and c >= sent:
                    drained = sent
                    if step_i <= len(steps):
                        # A server that refuses at a header closes right after reading it:
                        # give it a moment, so the cut is placed at this step, not the next.
                        settle = time.monotonic() + 0.05
                        while cut is None and time.monotonic() < settle:
                            poll_read(max(0.0, settle - time.monotonic()))
                    break
                if c is not None and c > last_progress[1]:
                    last_progress = (now, c)
                if now - last_progress[0] > stall_s:
                    cut = "stalled"
                    break
                if now - t0 > time_limit:
                    cut = "time limit"
                    break
                poll_read(0.0003)
        elapsed = time.monotonic() - t0
        if cut is not None and cut.startswith(("closed", "reset", "write")):
            # Collect the rest of the reply the server wrote before closing.
            end = time.monotonic() + 0.5
            while time.monotonic() < end and len(reply) < 4096:
                try:
                    chunk = sock.recv(65536)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                reply.extend(chunk)
        peak = hwm_mib(srv.pid)
        cpu1 = cpu_s(srv.pid)
    finally:
        sel.close()
        sock.close()
        if diag is not None:
            diag.close()
    time.sleep(2.0)
    after = rss_mib(srv.pid)

    notes = []
    if cut is None:
        accepted = "never cut (%s cap)" % fmt_bytes(cap)
    elif cut in ("stalled", "time limit"):
        accepted = "not cut: %s at %s read" % (cut, fmt_bytes(drained))
    else:
        accepted = fmt_range(before, sent)
        if step_i == 1:
            accepted = "%s (at the `*65536` header)" % fmt_bytes(sent)
        elif step_i == 2:
            accepted = "%s (at the first bulk header)" % fmt_bytes(sent)
        notes.append(cut)
    notes.append("reply %s" % fmt_reply(bytes(reply)))
    notes.append("%s written in %.1f s" % (fmt_bytes(sent), elapsed))
    notes.append("RSS before %s MB" % fmt_mib(base))
    if diag is None:
        notes.append("server queue not visible: accepted includes its socket buffer")
    if not srv.alive():
        notes.append("SERVER EXITED rc=%s" % srv.proc.returncode)
    return row(
        scenario,
        label,
        **{
            "accepted before cut": accepted,
            "peak RSS MB": fmt_mib(peak),
            "RSS after MB": fmt_mib(after),
            "server CPU s": "-" if cpu0 is None or cpu1 is None else "%.2f" % (cpu1 - cpu0),
            "notes": "; ".join(notes),
        },
    )


def scen_bigreq(srv, label, args):
    return flood(srv, label, "bigreq", 64 * KIB, args.cap, args.flood_time)


def scen_bigreq8(srv, label, args):
    return flood(srv, label, "bigreq8", 8 * MIB, args.cap, args.flood_time)


def scen_preauth(srv, label, args):
    return flood(srv, label, "preauth", 8 * MIB, args.cap, args.flood_time)


def wait_rss_settles(pid, quiet_s, limit_s):
    """Waits until RSS has not grown by more than 1 MiB for quiet_s (at most limit_s)."""
    t0 = time.monotonic()
    top = rss_mib(pid) or 0
    since = t0
    while time.monotonic() - t0 < limit_s:
        time.sleep(0.05)
        r = rss_mib(pid)
        if r is None:
            return
        if r > top + 1:
            top = r
            since = time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return


def scen_unread(srv, label, args):
    value = b"v" * MIB
    with connect(srv.port) as c:
        c.sendall(resp(b"SET", b"big:v", value))
        ok = read_line(c, 5.0)
    if ok != b"+OK\r\n":
        return row("unread", label, notes="SET failed: %s" % fmt_reply(ok))
    base = rss_mib(srv.pid)
    cpu0 = cpu_s(srv.pid)
    pipeline = resp(b"GET", b"big:v") * 1024
    stalled = []
    diag = None
    try:
        for _ in range(4):
            s = connect(srv.port)
            s.sendall(pipeline)
            stalled.append(s)
        time.sleep(0.3)
        pinger = Pinger(srv.port, interval=0.005, limit=200, timeout=15.0, budget=40.0)
        pinger.start()
        pinger.join(60.0)
        pinger.stop_evt.set()
        wait_rss_settles(srv.pid, quiet_s=1.0, limit_s=8.0)
        peak = hwm_mib(srv.pid)
        cpu1 = cpu_s(srv.pid)
        # Which of the 4 connections the server still holds, and what its kernel has queued.
        open_n, server_q = 0, 0
        try:
            diag = SockDiag()
            for s in stalled:
                info = diag.lookup(srv.port, s.getsockname()[1])
                if info is not None and info[0] == TCP_ESTABLISHED:
                    open_n += 1
                    server_q += info[2]
        except OSError:
            open_n = None
    finally:
        for s in stalled:
            s.close()
        if diag is not None:
            diag.close()
    time.sleep(5.0)
    after = rss_mib(srv.pid)
    p50, p99, mx = ping_stats(pinger.lat)
    notes = ["%d PINGs, max %s ms" % (len(pinger.lat), fmt_ms(mx))]
    if pinger.timed_out:
        notes.append("a PING got no reply within %.0f s" % pinger.timeout)
    elif pinger.failed:
        notes.append("a PING failed")
    if open_n is not None:
        notes.append(
            "%d/4 stalled connections still open, %s in the server's socket send queues"
            % (open_n, fmt_bytes(server_q))
        )
    notes.append("RSS after SET %s MB" % fmt_mib(base))
    if not srv.alive():
        notes.append("SERVER EXITED rc=%s" % srv.proc.returncode)
    return row(
        "unread",
        label,
        **{
            "peak RSS MB": fmt_mib(peak),
            "RSS after MB": fmt_mib(after),
            "PING p50 ms": fmt_ms(p50),
            "PING p99 ms": fmt_ms(p99),
            "server CPU s": "-" if cpu0 is None or cpu1 is None else "%.2f" % (cpu1 - cpu0),
            "notes": "; ".join(notes),
        },
    )


def scen_trickle(srv, label, args):
    # 65,536 arguments in all (the command name and 65,535 keys): the most `max-args` allows.
    keys = [b"k%d" % (i % 10) for i in range(65535)]
    req = memoryview(resp(b"EXISTS", *keys))
    write = 14
    gap = 50e-6
    time_limit = args.trickle_time
    pinger = Pinger(
        srv.port,
        interval=0.010,
        limit=int(time_limit / 0.010) + 3000,
        timeout=15.0,
        budget=time_limit + 40.0,
    )
    sock = connect(srv.port)
    reply = b""
    cut = None
    writes = 0
    try:
        pinger.start()
        time.sleep(0.05)
        cpu0 = cpu_s(srv.pid)
        t0 = time.monotonic()
        sock.settimeout(5.0)
        off = 0
        while off < len(req):
            try:
                sock.sendall(req[off : off + write])
            except socket.timeout:
                cut = "server stopped reading"
                break
            except OSError as e:
                cut = "write failed (%s)" % e.__class__.__name__
                break
            off += write
            writes += 1
            time.sleep(gap)
            if writes % 256 == 0 and time.monotonic() - t0 > time_limit:
                cut = "time limit %.0f s" % time_limit
                break
        t_sent = time.monotonic()
        if cut is None:
            reply = read_line(sock, 30.0)
        t_done = time.monotonic()
        cpu1 = cpu_s(srv.pid)
    finally:
        pinger.stop_evt.set()
        pinger.join(10)
        sock.close()
    p50, p99, mx = ping_stats(pinger.lat)
    correct = reply == b":0\r\n"
    notes = [
        "reply %s (%s)" % (fmt_reply(reply), "correct" if correct else "WRONG or missing"),
        "%s in %d writes over %.1f s (mean gap %.0f us), reply %.2f s after the last"
        % (
            fmt_bytes(off if cut else len(req)),
            writes,
            t_sent - t0,
            (t_sent - t0) / max(writes, 1) * 1e6,
            t_done - t_sent,
        ),
        "%d PINGs, max %s ms" % (len(pinger.lat), fmt_ms(mx)),
    ]
    if cut:
        notes.insert(0, cut)
    if pinger.timed_out:
        notes.append("a PING got no reply within %.0f s" % pinger.timeout)
    elif pinger.failed:
        notes.append("a PING failed")
    if not srv.alive():
        notes.append("SERVER EXITED rc=%s" % srv.proc.returncode)
    return row(
        "trickle",
        label,
        **{
            "PING p50 ms": fmt_ms(p50),
            "PING p99 ms": fmt_ms(p99),
            "server CPU s": "-" if cpu0 is None or cpu1 is None else "%.2f" % (cpu1 - cpu0),
            "notes": "; ".join(notes),
        },
    )


RUNNERS = {
    "bigreq": scen_bigreq,
    "bigreq8": scen_bigreq8,
    "unread": scen_unread,
    "trickle": scen_trickle,
    "preauth": scen_preauth,
}


def md_row(r):
    return "| " + " | ".join(str(r[c]) for c in COLUMNS) + " |"


def md_header():
    return "| " + " | ".join(COLUMNS) + " |\n|" + "|".join("---" for _ in COLUMNS) + "|"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", choices=["bucketd", "redis"], required=True)
    ap.add_argument("--bin", help="bucketd binary (required for --server bucketd)")
    ap.add_argument("--redis-bin", default="redis-server")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--password", default="pw", help="for preauth (--requirepass)")
    ap.add_argument("--cap-mb", type=float, default=1200, help="flood cap in MiB")
    ap.add_argument("--flood-time", type=float, default=40, help="seconds per flood, at most")
    ap.add_argument("--trickle-time", type=float, default=60, help="seconds of trickle, at most")
    ap.add_argument("--no-pin", action="store_true", help="do not use taskset / affinity")
    args = ap.parse_args()
    args.cap = int(args.cap_mb * MIB)

    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in RUNNERS]
    if unknown:
        ap.error("unknown scenario(s) %s; known: %s" % (",".join(unknown), ",".join(SCENARIOS)))
    if args.server == "bucketd":
        if not args.bin:
            ap.error("--server bucketd needs --bin PATH")
        binary = os.path.abspath(args.bin)
        label = "bucketd (%s)" % os.path.basename(binary)
    else:
        binary = shutil.which(args.redis_bin) or args.redis_bin
        try:
            ver = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10)
            v = [w for w in ver.stdout.split() if w.startswith("v=")]
            label = "redis %s" % (v[0][2:] if v else "")
        except (OSError, subprocess.TimeoutExpired):
            label = "redis"
    if not os.access(binary, os.X_OK):
        sys.exit("hostile.py: %s is not an executable" % binary)

    pin = not args.no_pin
    if pin:
        try:
            allowed = os.sched_getaffinity(0)
            if shutil.which("taskset") and {0, 1} <= allowed:
                os.sched_setaffinity(0, {0})
            else:
                pin = False
        except OSError:
            pin = False
    # The trickle's writer sleeps between writes; let the PING thread take the interpreter
    # lock promptly rather than after the default 5 ms.
    sys.setswitchinterval(0.0005)
    # SIGTERM runs the finally clauses below, so the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    print(
        "# hostile clients: %s, pinned: %s, started %s"
        % (label, "server core 1, client core 0" if pin else "no", time.strftime("%F %T")),
        flush=True,
    )
    print("(MB = MiB; one run per figure)\n", flush=True)
    print(md_header(), flush=True)
    rows = []
    t_all = time.monotonic()
    for name in chosen:
        password = args.password if name == "preauth" else None
        srv = Server(args.server, binary, password=password, pin=pin)
        try:
            srv.start()
            r = RUNNERS[name](srv, label, args)
        except Exception as e:  # a scenario that cannot run is reported, the others go on
            r = row(name, label, notes="could not run: %s: %s" % (e.__class__.__name__, e))
        finally:
            srv.stop()
        rows.append(r)
        print(md_row(r), flush=True)
    print("\n## %s (%.0f s)\n" % (label, time.monotonic() - t_all))
    print(md_header())
    for r in rows:
        print(md_row(r))


if __name__ == "__main__":
    main()
