"""The Dockerfile, read statically (no Docker engine offline): targets, entrypoints, variants."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from services.stack.spec import CONTAINER_CONFIG

REPO = Path(__file__).resolve().parents[2]
TARGETS = {
    "router": "services.router",
    "executor": "services.executor",
    "memory-manager": "services.memory_manager",
}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions of each named stage."""
    result: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            current = []
            result[rest.split()[-1]] = current
        current.append((keyword, rest))
    return result


def only(stage: list[tuple[str, str]], keyword: str) -> str:
    (value,) = [rest for k, rest in stage if k == keyword]
    return value


@pytest.mark.parametrize("target", TARGETS)
def test_each_service_target_runs_its_module_like_compose(target: str) -> None:
    stage = stages()[target]
    assert stage[0] == ("FROM", f"runtime AS {target}")
    entrypoint = json.loads(only(stage, "ENTRYPOINT"))
    assert entrypoint == ["python", "-m", TARGETS[target]]
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    for service in compose.values():
        if service.get("build", {}).get("target") == target:
            assert service["entrypoint"] == entrypoint


def test_healthchecks_use_the_default_ports() -> None:
    c = CONTAINER_CONFIG
    expected = {
        "router": ["http", f"http://127.0.0.1:{c.router_port}/health"],
        "executor": ["grpc", f"127.0.0.1:{c.executor_base_port}"],
        "memory-manager": ["grpc", f"127.0.0.1:{c.memory_manager_port}"],
    }
    for target, check in expected.items():
        healthcheck = only(stages()[target], "HEALTHCHECK")
        cmd = json.loads(healthcheck[healthcheck.index("CMD") + 3 :].strip())
        assert cmd == ["python", "-m", "services.common.healthcheck", *check]


def test_variants_pick_the_torch_build_and_default_to_cpu() -> None:
    keywords = instructions()
    assert ("ARG", "VARIANT=cpu") in keywords
    all_stages = stages()
    assert "download.pytorch.org/whl/cpu" in only(all_stages["python-cpu"], "ENV")
    assert "gcc" in only(all_stages["python-cuda"], "RUN")  # Triton's launcher build
    for name in ("build", "runtime"):
        assert all_stages[name][0][1].startswith("python-${VARIANT} AS")


def test_runtime_is_non_root_with_stubs_and_model_built_in() -> None:
    all_stages = stages()
    assert only(all_stages["runtime"], "USER") == "10001:10001"
    build = re.sub(r"\s+", " ", " ".join(rest for k, rest in all_stages["build"] if k == "RUN"))
    # The same codegen as `make proto`.
    makefile = (REPO / "Makefile").read_text()
    flags = "-Iprotos --python_out=. --grpc_python_out=. --pyi_out=."
    assert flags in makefile.replace("\t", "")
    assert f"grpc_tools.protoc {flags} protos/services/rpc/*.proto" in build
    assert "quire_tools.gguf_convert --out /models/smollm2-135m-instruct" in build
    assert CONTAINER_CONFIG.model == "/models/smollm2-135m-instruct"


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    rules = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = set()
    for keyword, rest in instructions():
        if keyword == "COPY" and "--from" not in rest:
            copied.update(rest.split()[:-1])
    assert copied == allowed


def test_builds_without_a_registry_from_build_arguments() -> None:
    """Base image and torch source are build arguments; nothing is pulled implicitly."""
    text = (REPO / "Dockerfile").read_text()
    assert not text.startswith("# syntax="), "a syntax line makes BuildKit pull its frontend"
    keywords = instructions()
    assert ("ARG", "PYTHON_IMAGE=python:3.11-slim-bookworm") in keywords
    assert ("ARG", "TORCH_SOURCE=index") in keywords
    build = stages()["build"]
    assert ("ARG", "PIP_CERT") in build  # unset unless given
    assert ("COPY", "deploy/docker/build-context /tmp/build-context") in build
    runs = " ".join(rest for k, rest in build if k == "RUN")
    assert 'index) pip install --index-url "$TORCH_INDEX_URL" "$torch_pin"' in runs
    assert "--no-index --no-deps --find-links /tmp/build-context/wheels" in runs
    assert "TORCH_SOURCE must be index or wheels" in runs  # a typo is an error, not a default
    # The runtime stages never copy the build context (the CA bundle, the wheel).
    for name in ("runtime", "router", "executor", "memory-manager"):
        assert not any("build-context" in rest for _, rest in stages()[name]), name


def test_images_carry_portable_cpu_kernels() -> None:
    build = stages()["build"]
    assert ("ARG", "CPU_KERNELS_MARCH=x86-64-v3") in build
    runs = [rest for k, rest in build if k == "RUN"]
    assert any("g++" in r and "apt-get install" in r for r in runs)
    from quire.kernels import cpp_build

    (kernel_step,) = [r for r in runs if "quire.kernels.cpp_build" in r]
    assert f'{cpp_build.MARCH_ENV_VAR}="$CPU_KERNELS_MARCH"' in kernel_step
    assert "x86-64-v3" in cpp_build._X86_LEVELS  # a level the loader knows how to check


def test_debian_service_images_are_non_root_with_healthchecks() -> None:
    text = (REPO / "deploy" / "docker" / "Dockerfile.debian").read_text()
    for target, user in (("redis", "redis"), ("prometheus", "prometheus")):
        stage = text.split(f"AS {target}\n", 1)[1].split("\nFROM ", 1)[0]
        assert f"USER {user}" in stage and "HEALTHCHECK" in stage, target
        assert "apt-get install" in stage, target


def test_make_targets_for_the_compose_stack_exist_and_stay_out_of_make_test() -> None:
    makefile = (REPO / "Makefile").read_text()
    for target in ("compose-up", "compose-down", "compose-test", "chaos-compose", "images"):
        assert re.search(rf"^{target}:", makefile, re.M), target
    (test_rule,) = re.findall(r"^test:.*$", makefile, re.M)
    assert "compose" not in test_rule and "chaos" not in test_rule
    script = REPO / "deploy" / "docker" / "compose.sh"
    assert script.stat().st_mode & 0o111
    usage = script.read_text()
    for command in ("engine)", "images)", "up)", "down)"):
        assert command in usage
    for path in (script, REPO / "deploy" / "docker" / "base-image.sh"):
        done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert done.returncode == 0, (path.name, done.stderr)
    wrong = subprocess.run([str(script), "sideways"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "usage:" in wrong.stderr
