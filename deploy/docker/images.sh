#!/usr/bin/env bash
# The service images a deployment needs, tagged the way k8s/overlays/<variant> names them.
#
#   deploy/docker/images.sh list  VARIANT   # the tags VARIANT's overlay runs, one a line
#   deploy/docker/images.sh build VARIANT   # build them (`make images`)
#   deploy/docker/images.sh push  VARIANT   # tag them REGISTRY/<tag> and push (`make images-push`)
#   deploy/docker/images.sh load  VARIANT   # load them into a local cluster (`make images-load`)
#
# VARIANT is cpu (every service on the CPU image) or cuda (executors on the CUDA image; the
# router and memory managers need no GPU and stay on the CPU images, which are built too).
# Settings (environment): REGISTRY (push: e.g. registry.example.com/team, required),
# K8S_LOADER (load: kind or minikube), KIND_CLUSTER (kind's --name, default kind),
# MINIKUBE_PROFILE (minikube's -p, default minikube).
set -euo pipefail
cd "$(dirname "$0")/../.."
DOCKER=${DOCKER:-docker}

log() { echo "images: $*" >&2; }
die() { log "error: $*"; exit 1; }

tags() {
    case "$1" in
    cpu) echo quire-router:cpu quire-memory-manager:cpu quire-executor:cpu ;;
    cuda) echo quire-router:cpu quire-memory-manager:cpu quire-executor:cuda ;;
    *) die "VARIANT must be cpu or cuda, not '$1'" ;;
    esac
}

build() {
    # The CPU images: the registry-free path (debootstrap base, local torch wheel) where needed.
    deploy/docker/compose.sh images
    if [ "$1" = cuda ]; then
        # PyPI's CUDA torch and python:3.11-slim-bookworm: this build needs a registry.
        log "building quire-executor:cuda"
        $DOCKER build --build-arg VARIANT=cuda --target executor -t quire-executor:cuda . \
            || die "building quire-executor:cuda failed (see the lines above)"
    fi
}

push() {
    [ -n "${REGISTRY:-}" ] || die "set REGISTRY, e.g. REGISTRY=registry.example.com/team"
    local tag
    for tag in $(tags "$1"); do
        $DOCKER image inspect "$tag" >/dev/null 2>&1 || die "$tag is not built: make images VARIANT=$1"
        $DOCKER tag "$tag" "$REGISTRY/$tag"
        $DOCKER push "$REGISTRY/$tag"
    done
    log "pushed; point the overlay at them:"
    for tag in $(tags "$1"); do
        log "  (cd k8s/overlays/$1 && kustomize edit set image ${tag%%:*}=$REGISTRY/$tag)"
    done
}

load() {
    local tag
    for tag in $(tags "$1"); do
        $DOCKER image inspect "$tag" >/dev/null 2>&1 || die "$tag is not built: make images VARIANT=$1"
        case "${K8S_LOADER:-}" in
        kind) kind load docker-image --name "${KIND_CLUSTER:-kind}" "$tag" ;;
        minikube) minikube -p "${MINIKUBE_PROFILE:-minikube}" image load "$tag" ;;
        *) die "set K8S_LOADER=kind or K8S_LOADER=minikube" ;;
        esac
    done
}

[ $# -eq 2 ] || die "usage: $0 list|build|push|load cpu|cuda"
tags "$2" >/dev/null
case "$1" in
list) tags "$2" | tr ' ' '\n' ;;
build) build "$2" ;;
push) push "$2" ;;
load) load "$2" ;;
*) die "usage: $0 list|build|push|load cpu|cuda" ;;
esac
