#!/usr/bin/env bash
# The base image of every Quire image: BASE_IMAGE when it exists locally or can be pulled,
# else a Debian 12 root filesystem made by debootstrap (minbase + Python 3.11, venv, CA
# certificates: what python:3.11-slim-bookworm offers) and imported under LOCAL_BASE_IMAGE.
#
#   deploy/docker/base-image.sh                 # prints the image name to build FROM
#   BASE_IMAGE=python:3.11-slim-bookworm LOCAL_BASE_IMAGE=quire-debian:bookworm-py3.11
set -euo pipefail
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim-bookworm}
LOCAL_BASE_IMAGE=${LOCAL_BASE_IMAGE:-quire-debian:bookworm-py3.11}
DOCKER=${DOCKER:-docker}
SUITE=bookworm
PACKAGES=python3,python3-venv,python-is-python3,ca-certificates

log() { echo "base-image: $*" >&2; }

if $DOCKER image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "$BASE_IMAGE"; exit 0
fi
log "pulling $BASE_IMAGE ..."
if timeout 60 $DOCKER pull -q "$BASE_IMAGE" >/dev/null 2>&1; then
    echo "$BASE_IMAGE"; exit 0
fi
if $DOCKER image inspect "$LOCAL_BASE_IMAGE" >/dev/null 2>&1; then
    log "$BASE_IMAGE cannot be pulled; using $LOCAL_BASE_IMAGE (built earlier by debootstrap)"
    echo "$LOCAL_BASE_IMAGE"; exit 0
fi
log "$BASE_IMAGE cannot be pulled; building $LOCAL_BASE_IMAGE with debootstrap (Debian $SUITE)"
command -v debootstrap >/dev/null || {
    log "installing debootstrap (Debian package)"
    apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
}
rootfs=$(mktemp -d /var/tmp/quire-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
start=$SECONDS
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" >&2 \
    || { log "debootstrap failed (see the lines above)"; exit 1; }
# The same trims as Debian's official images: no apt caches or package lists in the layer.
chroot "$rootfs" apt-get clean
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin
tar -C "$rootfs" -c . | $DOCKER import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' - "$LOCAL_BASE_IMAGE" >/dev/null
log "built $LOCAL_BASE_IMAGE in $((SECONDS - start)) s"
echo "$LOCAL_BASE_IMAGE"
