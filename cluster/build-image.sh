#!/usr/bin/env bash
# Builds the bucketd container image (default tag bucketd:local) without pulling any base image.
#
#   1. cargo build --profile release      (the host's toolchain, the host's glibc)
#   2. assemble target/docker-rootfs/     the binary, exactly the shared libraries `ldd` lists for
#                                         it (the dynamic loader included) at the same paths, and
#                                         a few /etc files; plus target/docker-rootfs-data/, an
#                                         empty directory that becomes /data, owned by nobody
#   3. docker build -t bucketd:local .    the Dockerfile is FROM scratch + COPY of those two
#
# The image therefore runs on hosts with the same CPU architecture as this one; the libraries
# travel inside it, so the host's glibc version does not matter.
#
# Environment: IMAGE (tag, default bucketd:local), BUCKETD_PROFILE (the Cargo profile built and
# packaged, default release; `.ci/run` uses smoke, optimised without LTO), SKIP_CARGO_BUILD=1
# (package that profile's binary as already built), CARGO_FLAGS (extra flags for cargo build,
# default --locked).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-bucketd:local}
PROFILE=${BUCKETD_PROFILE:-release}
# Cargo puts the dev profile's output under target/debug, every other profile's under its name
# (in CARGO_TARGET_DIR when that is set).
BIN=${CARGO_TARGET_DIR:-target}/$([ "$PROFILE" = dev ] && echo debug || echo "$PROFILE")/bucketd
ROOTFS=target/docker-rootfs
# Empty; the Dockerfile copies it to /data with --chown, which only takes effect on a directory
# that COPY creates (hence not part of the root filesystem above).
DATADIR=target/docker-rootfs-data
# The uid/gid the server runs as inside the container (the conventional "nobody").
RUN_UID=65534
RUN_GID=65534

die() { echo "build-image: $*" >&2; exit 1; }

command -v docker >/dev/null || die "docker is not installed"
command -v ldd >/dev/null || die "ldd is not installed (Debian: libc-bin)"

if [ "${SKIP_CARGO_BUILD:-0}" != 1 ]; then
  # shellcheck disable=SC2086 # CARGO_FLAGS is a list of flags
  cargo build --profile "$PROFILE" ${CARGO_FLAGS---locked}
fi
[ -x "$BIN" ] || die "$BIN is missing; run cargo build --profile $PROFILE"

# A fresh root filesystem every time, so nothing stale ends up in the image.
rm -rf "$ROOTFS" "$DATADIR"
mkdir -p "$ROOTFS/usr/local/bin" "$ROOTFS/etc" "$ROOTFS/tmp" "$DATADIR"
chmod 1777 "$ROOTFS/tmp"
cp "$BIN" "$ROOTFS/usr/local/bin/bucketd"
chmod 0755 "$ROOTFS/usr/local/bin/bucketd"

# Shared libraries, copied (symlinks resolved) to the very paths ldd resolved them to, so the
# loader's default search path finds them without an ld.so.cache. Lines look like
#   libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)
#   /lib64/ld-linux-x86-64.so.2 (0x...)
#   linux-vdso.so.1 (0x...)                       (provided by the kernel: skipped)
ldd_out=$(ldd "$BIN") || die "ldd failed on $BIN (is it a static or foreign binary?)"
if grep -q "not found" <<<"$ldd_out"; then
  die "ldd cannot resolve every library of $BIN:"$'\n'"$ldd_out"
fi
libs=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" | sort -u)
[ -n "$libs" ] || die "ldd listed no libraries for $BIN"
# The program interpreter named in the binary must be among them, or nothing can start it.
if command -v readelf >/dev/null; then
  interp=$(readelf -l "$BIN" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
  if [ -n "$interp" ] && ! grep -qxF "$interp" <<<"$libs"; then
    die "the loader $interp is not in ldd's list:"$'\n'"$ldd_out"
  fi
fi
for lib in $libs; do
  mkdir -p "$ROOTFS$(dirname "$lib")"
  cp -L "$lib" "$ROOTFS$lib"
done

# Name resolution: files first, then DNS (glibc's default without this file is DNS first).
# Docker mounts /etc/hosts, /etc/hostname and /etc/resolv.conf itself.
printf 'hosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"
printf 'root:x:0:0:root:/:/nonexistent\nnobody:x:%s:%s:nobody:/nonexistent:/nonexistent\n' \
  "$RUN_UID" "$RUN_GID" >"$ROOTFS/etc/passwd"
printf 'root:x:0:\nnogroup:x:%s:\n' "$RUN_GID" >"$ROOTFS/etc/group"

echo "build-image: root filesystem $ROOTFS:"
(cd "$ROOTFS" && find . -type f -printf '  /%P (%s bytes)\n' | sort)

# Without the buildx plugin, ask for the classic builder explicitly (newer clients otherwise
# print a deprecation notice and fall back anyway).
if ! docker buildx version >/dev/null 2>&1; then
  export DOCKER_BUILDKIT=0
fi
old_id=$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
docker build -t "$IMAGE" .
# The image the tag pointed at before is left untagged; remove it unless something still uses it.
new_id=$(docker image inspect -f '{{.Id}}' "$IMAGE")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
  docker image rm "$old_id" >/dev/null 2>&1 || true
fi
docker image ls "$IMAGE"
