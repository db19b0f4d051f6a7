#!/usr/bin/env bash
# `make compose-up` / `make compose-down` / `make images`: the compose stack on a machine with
# or without a container registry.
#
#   deploy/docker/compose.sh engine   # Docker Engine + Compose from Debian's packages if missing; start dockerd
#   deploy/docker/compose.sh images   # build the images (a debootstrap base when BASE_IMAGE cannot be pulled)
#   deploy/docker/compose.sh up       # engine, images, `docker-compose up -d`, wait for the router's /health
#   deploy/docker/compose.sh down     # `docker-compose down` (QUIRE_COMPOSE_DOWN_ARGS=-v also drops volumes)
#   deploy/docker/compose.sh compose ARGS  # docker-compose ARGS on the stack `up` made (its files)
#
# Settings (environment): BASE_IMAGE (python:3.11-slim-bookworm), LOCAL_BASE_IMAGE
# (quire-debian:bookworm-py3.11), TORCH_SOURCE (auto: the wheel pip's find-links holds, else the
# index), QUIRE_COMPOSE_HEALTH_TIMEOUT_S (900), QUIRE_COMPOSE_SERVICES (the stack + Prometheus,
# + Grafana when its image is here). QUIRE_MODEL, QUIRE_NUM_KV_BLOCKS, QUIRE_DTYPE choose the
# model as for `make up` (docs/configuration.md); a QUIRE_MODEL that names a directory on this
# machine is mounted into the containers at the same path (deploy/compose.model.yaml).
set -euo pipefail
cd "$(dirname "$0")/../.."
export COMPOSE_PROJECT_NAME=quire
DOCKER=${DOCKER:-docker}
CONTEXT=deploy/docker/build-context
STATE=.run/compose           # what `images` chose, for `up` and the tests
ROUTER_URL=http://127.0.0.1:8000
ADMIN_URL=http://127.0.0.1:8001   # the router's /metrics, /dashboard, /cluster/status, /docs
HEALTH_TIMEOUT_S=${QUIRE_COMPOSE_HEALTH_TIMEOUT_S:-900}
PY=${PY:-.venv/bin/python}

log() { echo "compose: $*" >&2; }
die() { log "error: $*"; exit 1; }

engine() {
    if ! command -v dockerd >/dev/null || ! command -v docker-compose >/dev/null; then
        log "installing Docker Engine and Compose (Debian packages docker.io, docker-compose)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io docker-compose \
            || die "apt-get could not install docker.io docker-compose"
    fi
    if ! $DOCKER info >/dev/null 2>&1; then
        mkdir -p .run
        log "starting dockerd (log: .run/dockerd.log)"
        nohup dockerd >.run/dockerd.log 2>&1 &
        for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 1; done
        $DOCKER info >/dev/null 2>&1 || die "dockerd did not start; see .run/dockerd.log"
    fi
    log "engine $($DOCKER version --format '{{.Server.Version}}'), $(docker-compose version --short 2>/dev/null || echo compose)"
}

# A CLI that builds with BuildKit (only the stages a target needs): one with buildx, or the
# Engine's own 20.10+ CLI; else the classic builder.
docker_build() {
    if $DOCKER buildx version >/dev/null 2>&1; then
        DOCKER_BUILDKIT=1 $DOCKER build --progress=plain "$@"
    elif [ -x /usr/bin/docker ] && /usr/bin/docker version --format '{{.Client.Version}}' 2>/dev/null | grep -qE '^(2[0-4])\.'; then
        DOCKER_BUILDKIT=1 /usr/bin/docker build --progress=plain "$@"
    else
        DOCKER_BUILDKIT=0 $DOCKER build "$@"
    fi
}

# Is `image` here, or can it be pulled (60 s at most)?
have_image() {
    $DOCKER image inspect "$1" >/dev/null 2>&1 || timeout 60 $DOCKER pull -q "$1" >/dev/null 2>&1
}

pip_setting() {  # the host pip's value of one setting (env first, then its config files)
    local env="PIP_${1^^}"; env=${env//-/_}
    if [ -n "${!env:-}" ]; then echo "${!env}"; return; fi
    python3 -m pip config get "global.$1" 2>/dev/null || true
}

images() {
    local start=$SECONDS base torch_source=${TORCH_SOURCE:-auto} args=() wheel="" cert
    mkdir -p "$STATE"
    base=$(deploy/docker/base-image.sh)
    log "base image: $base"
    find "$CONTEXT" -mindepth 1 ! -name README.md -exec rm -rf {} +
    if [ "$torch_source" = auto ]; then
        torch_source=index
        local pin; pin=$(grep -oE '"torch==[^"]+"' pyproject.toml | tr -d '"' | cut -d= -f3)
        for dir in $(pip_setting find-links); do
            wheel=$(ls "$dir"/torch-"$pin"+cpu-cp311-*.whl 2>/dev/null | head -1 || true)
            [ -n "$wheel" ] && break
        done
        [ -n "$wheel" ] && torch_source=wheels
    fi
    if [ "$torch_source" = wheels ]; then
        [ -n "$wheel" ] || die "TORCH_SOURCE=wheels: put the torch wheel in $CONTEXT/wheels/ or leave TORCH_SOURCE=auto"
        mkdir -p "$CONTEXT/wheels" && cp "$wheel" "$CONTEXT/wheels/"
        log "torch from the local wheel $(basename "$wheel")"
    else
        log "torch from the package index"
    fi
    cert=$(pip_setting cert)
    if [ -n "$cert" ] && [ -f "$cert" ]; then
        cp "$cert" "$CONTEXT/pip-cert.pem"
        args+=(--build-arg PIP_CERT=/tmp/build-context/pip-cert.pem)
        log "pip inside the build uses the host's CA bundle ($cert)"
    fi
    for target in memory-manager executor router; do
        log "building quire-$target:cpu"
        docker_build --build-arg VARIANT=cpu --build-arg PYTHON_IMAGE="$base" \
            --build-arg TORCH_SOURCE="$torch_source" "${args[@]}" \
            --target "$target" -t "quire-$target:cpu" . \
            || die "building quire-$target:cpu failed (see the lines above)"
    done
    # Redis and Prometheus: upstream images where they can be had, else Debian's packages.
    local files="-f compose.yaml"
    if have_image redis:7.4-alpine && have_image prom/prometheus:v3.5.0; then
        log "Redis and Prometheus: upstream images"
    else
        log "Redis and Prometheus cannot be pulled: building them from Debian's packages"
        for target in redis prometheus; do
            docker_build -f deploy/docker/Dockerfile.debian --build-arg BASE_IMAGE="$base" \
                --target "$target" -t "quire-$target:bookworm" deploy/docker \
                || die "building quire-$target:bookworm failed"
        done
        files="$files -f deploy/compose.debian.yaml"
    fi
    echo "$files" >"$STATE/files"
    echo "$((SECONDS - start))" >"$STATE/build_s"
    log "images built in $((SECONDS - start)) s"
}

# Grafana has no default admin password: GRAFANA_ADMIN_PASSWORD from the environment, else one
# generated once and kept (mode 600) in .run/compose/grafana-admin-password.
grafana_password() {
    if [ -n "${GRAFANA_ADMIN_PASSWORD:-}" ]; then return; fi
    local file="$STATE/grafana-admin-password"
    if [ ! -s "$file" ]; then
        mkdir -p "$STATE"
        (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(16))' >"$file")
        log "Grafana admin password generated: $file (user admin)"
    fi
    GRAFANA_ADMIN_PASSWORD=$(cat "$file")
    export GRAFANA_ADMIN_PASSWORD
}

compose() {
    local files model=""
    files=$(cat "$STATE/files" 2>/dev/null || echo -f compose.yaml)
    # A QUIRE_MODEL that is a directory on this machine: its absolute path, mounted read-only
    # at that same path in the router and the executors. Anything else is a path in the image.
    if [ -n "${QUIRE_MODEL:-}" ] && [ -d "$QUIRE_MODEL" ]; then
        QUIRE_MODEL=$(realpath "$QUIRE_MODEL")
        export QUIRE_MODEL
        model="-f deploy/compose.model.yaml"
    fi
    grafana_password
    # shellcheck disable=SC2086
    docker-compose $files $model "$@"
}

# The first Quire container that has restarted, if any: one that exits at start (a QUIRE_MODEL
# that is not a supported checkpoint, a bad setting) restarts forever under `unless-stopped`.
restarted() {
    local id
    for id in $(compose ps -q 2>/dev/null); do
        if [ "$($DOCKER inspect -f '{{.RestartCount}}' "$id" 2>/dev/null || echo 0)" -gt 0 ]; then
            echo "$id"
            return
        fi
    done
}

services() {
    if [ -n "${QUIRE_COMPOSE_SERVICES:-}" ]; then echo "$QUIRE_COMPOSE_SERVICES"; return; fi
    local list="redis memory-manager executor-0 executor-1 router prometheus"
    if $DOCKER image inspect grafana/grafana:12.1.1 >/dev/null 2>&1; then
        list="$list grafana"
    else
        log "Grafana: its image (grafana/grafana:12.1.1) is not here and cannot be built from Debian's packages; running without it"
    fi
    echo "$list"
}

wait_healthy() {  # $1: when `up` began (SECONDS), for the time to healthy
    local start=${1:-$SECONDS}
    log "waiting for $ROUTER_URL/health (at most $HEALTH_TIMEOUT_S s) "
    local crashed
    until curl -sf "$ROUTER_URL/health" >/dev/null 2>&1; do
        crashed=$(restarted)
        if [ -n "$crashed" ]; then
            $DOCKER logs --tail 20 "$crashed" >&2 || true
            die "$($DOCKER inspect -f '{{.Name}}' "$crashed" | tr -d /) exited at start (its log above)"
        fi
        if [ $((SECONDS - start)) -ge "$HEALTH_TIMEOUT_S" ]; then
            compose ps >&2; compose logs --tail=30 >&2
            die "the router was not healthy after $HEALTH_TIMEOUT_S s"
        fi
        if [ $(((SECONDS - start) % 10)) -eq 0 ]; then
            log "  $((SECONDS - start)) s: $(compose ps --services --filter status=running 2>/dev/null | wc -l) containers running"
        fi
        sleep 1
    done
    echo "$((SECONDS - start))" >"$STATE/healthy_s"
    log "router healthy $((SECONDS - start)) s after docker-compose up"
}

up() {
    engine
    images
    local start=$SECONDS
    # Compose itself waits for each dependency's health check before starting the next.
    # shellcheck disable=SC2046
    compose up -d --no-build $(services) || die "docker-compose up failed"
    wait_healthy "$start"
    local served
    served=$(basename "${QUIRE_MODEL:-/models/smollm2-135m-instruct}")
    cat <<EXAMPLE

Quire is up (docker-compose project "quire", model $served); metrics, dashboard, cluster
status and API docs on $ADMIN_URL. The README's example:

curl $ROUTER_URL/v1/chat/completions -H 'Content-Type: application/json' \\
  -d '{"model": "$served", "messages": [{"role": "user",
       "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0}'

\`make compose-test\` checks the stack, \`make chaos-compose\` injects faults, \`make compose-down\` stops it.
EXAMPLE
}

down() {
    $DOCKER info >/dev/null 2>&1 || { log "dockerd is not running: nothing to stop"; return; }
    # shellcheck disable=SC2086
    compose down ${QUIRE_COMPOSE_DOWN_ARGS:-}
}

case "${1:-}" in
    engine) engine ;;
    images) engine; images ;;
    up) up ;;
    down) down ;;
    wait) wait_healthy ;;
    compose) shift; compose "$@" ;;
    *) echo "usage: $0 engine|images|up|down|wait|compose ARGS..." >&2; exit 2 ;;
esac
