# bucketd: a Redis-compatible rate-limit server, as a container image built FROM scratch.
#
# Build the image with the script, not with a bare `docker build`:
#
#     cluster/build-image.sh          # tags bucketd:local (IMAGE=... for another tag)
#
# The script runs `cargo build --release` on the host, assembles target/docker-rootfs/ (the
# binary, the shared libraries and dynamic loader `ldd` lists for it, a few /etc files) and an
# empty target/docker-rootfs-data/, then runs `docker build -t bucketd:local .` with this file.
# No base image is pulled.
#
# Run a standalone node (clients on port 6379):
#
#     docker run --rm -p 6379:6379 bucketd:local
#
# Arguments after the image name replace the defaults below, e.g.
#     docker run --rm --network host bucketd:local --bind 127.0.0.1 --port 7001
# A three-node cluster: cluster/docker-compose.yml (its check: cluster/docker-smoke.sh).
FROM scratch

COPY target/docker-rootfs/ /
# Cluster mode keeps its Raft logs under /data (mount a volume there); the server runs as
# nobody and must be able to write it. When bind-mounting a host directory instead, make it
# writable for uid 65534 or run with --user 0.
COPY --chown=65534:65534 target/docker-rootfs-data/ /data/

# Container logs are files, not terminals: no colour codes in them.
ENV NO_COLOR=1
USER 65534:65534
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/bucketd"]
CMD ["--bind", "0.0.0.0", "--port", "6379"]
