# Sourced by the benchmark scripts: helpers they share.

# free_ports N: N distinct free loopback ports (all bound at once, so none repeats).
free_ports() {
    python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

# CPU time of a process in nanoseconds, summed over its threads (the scheduler's own account:
# finer than clock ticks, so short runs still give a CPU time per request).
cpu_ns() {
    cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { printf "%.0f", s }'
}
