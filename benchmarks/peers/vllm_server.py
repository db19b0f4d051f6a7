"""vLLM's OpenAI-compatible server as a benchmark peer, and vLLM's own benchmark client.

    with vllm_server("models/quire-bench", port=8100, cores=[0, 1]) as base_url:
        result = run_vllm_bench_client(base_url, "quire-bench", "models/quire-bench",
                                       sharegpt_path, num_prompts=64, request_rate=2.0,
                                       seed=0, result_path=Path("bench/results/vllm.json"))

Both run in the peer venv (`make peer-vllm`) as subprocesses; nothing here imports vllm. The
client targets any OpenAI-compatible server (Quire's router too). It streams
/v1/completions (backend "openai": the ShareGPT prompt as raw text, `max_tokens`) or
/v1/chat/completions ("openai-chat": one user message whose content is a list of one text
part, `max_completion_tokens`, the server applies the chat template), with the request's
ShareGPT output length as the limit, temperature 0, `repetition_penalty` 1.0,
`stream_options.include_usage` (output tokens are counted from the usage chunk) and
`ignore_eos` (a vLLM extension, accepted by Quire's router) so every request produces that
many tokens.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from benchmarks.common.server_process import log_tail, serving_process
from benchmarks.peers.vllm_env import PEERS_DIR, ensure_installed, vllm_environment

# The non-deprecated home of `python -m vllm.entrypoints.openai.api_server` (same main()).
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
BENCH_CLIENT_SCRIPT = PEERS_DIR / "vllm_bench_serve.py"
ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}


class PeerServerError(RuntimeError):
    """The peer server died or never became healthy."""


def _is_port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


@contextmanager
def vllm_server(
    model: str | Path,
    port: int,
    dtype: str = "float32",
    cores: list[int] | None = None,
    kv_space_gib: int = 4,
    max_model_len: int = 2048,
    extra_args: Sequence[str] = (),
    served_model_name: str | None = None,
    host: str = "127.0.0.1",
    startup_timeout_s: float = 900,
    log_path: Path | None = None,
) -> Iterator[str]:
    """Run vLLM's OpenAI-compatible server on `host:port` and yield its base URL.

    The server is healthy (GET /health answers 200) when this yields; it is stopped, with its
    whole process group, when the block exits, however it exits. `served_model_name`
    defaults to the model directory's name. The server's output goes to `log_path` (a
    temporary file by default), whose tail is in the error if the server dies or times out.
    Start-up on the CPU includes a torch.compile warm-up (about a minute for a small model).
    """
    python = ensure_installed()
    model = Path(model).resolve()
    if not (model / "config.json").is_file():
        raise FileNotFoundError(f"no model at {model} (config.json missing)")
    name = served_model_name or model.name
    if not _is_port_free(host, port):
        raise PeerServerError(f"port {host}:{port} is already in use")
    command = [
        str(python),
        "-m",
        SERVER_MODULE,
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--disable-uvicorn-access-log",
        *extra_args,
    ]
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="vllm-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    base_url = f"http://{host}:{port}"
    env = vllm_environment(cores, kv_space_gib)
    # Its own process group, so the engine core and worker stop with it.
    with serving_process(
        "vLLM server",
        command,
        base_url,
        log_path,
        env=env,
        startup_timeout_s=startup_timeout_s,
        error=PeerServerError,
    ):
        yield base_url


def run_vllm_bench_client(
    base_url: str,
    model_name: str,
    tokenizer_dir: str | Path,
    dataset_path: str | Path,
    num_prompts: int,
    request_rate: float,
    seed: int,
    result_path: Path,
    dataset_name: Literal["sharegpt", "custom"] = "sharegpt",
    backend: Literal["openai", "openai-chat"] = "openai",
    ignore_eos: bool = True,
    max_concurrency: int | None = None,
    detailed: bool = False,
    api_key: str | None = None,
    cores: list[int] | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Run `vllm bench serve` on a dataset file against `base_url` and return its result.

    `dataset_name` "sharegpt" samples a ShareGPT file by vLLM's rule; "custom" sends a JSONL
    file's requests exactly, in the file's order (`{"prompt": text, "output_tokens": n}` per
    line, the prompt as it is, no chat template), `num_prompts` of them.

    Any OpenAI-compatible server will do; `model_name` is the name it serves (sent as
    "model"), `tokenizer_dir` the tokenizer the client counts prompt tokens with and samples
    the dataset by. `request_rate` is requests/s of a Poisson process (`float("inf")` sends
    all at once). `detailed` keeps the per-request lists (ttfts, itls, output_lens, errors).
    `api_key` goes out as a Bearer token. `cores` pins the client process. The result JSON
    is written to `result_path` and returned; the client's output goes to a `.log` beside it.
    """
    python = ensure_installed()
    if backend not in ENDPOINTS:
        raise ValueError(f"backend must be one of {sorted(ENDPOINTS)}, got {backend!r}")
    result_path = Path(result_path).resolve()
    result_path.parent.mkdir(parents=True, exist_ok=True)
    result_path.unlink(missing_ok=True)
    command = [
        str(python),
        str(BENCH_CLIENT_SCRIPT),
        "--backend",
        backend,
        "--base-url",
        base_url.rstrip("/"),
        "--endpoint",
        ENDPOINTS[backend],
        "--model",
        model_name,
        "--served-model-name",
        model_name,
        "--tokenizer",
        str(Path(tokenizer_dir).resolve()),
        "--dataset-name",
        dataset_name,
        "--dataset-path",
        str(Path(dataset_path).resolve()),
        "--num-prompts",
        str(num_prompts),
        "--request-rate",
        str(request_rate),
        "--seed",
        str(seed),
        # Greedy: the client leaves temperature to the server's default otherwise.
        "--temperature",
        "0",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--disable-tqdm",
        "--save-result",
        "--result-filename",
        str(result_path),
    ]
    if dataset_name == "custom":
        command += ["--skip-chat-template", "--disable-shuffle", "--no-oversample"]
        command += ["--custom-output-len", "-1"]
    if ignore_eos:
        command.append("--ignore-eos")
    if max_concurrency is not None:
        command += ["--max-concurrency", str(max_concurrency)]
    if detailed:
        command.append("--save-detailed")
    command += list(extra_args)
    env = vllm_environment(cores)
    env.pop("OPENAI_API_KEY", None)
    if api_key is not None:
        env["OPENAI_API_KEY"] = api_key
    log_path = result_path.with_suffix(".log")
    with open(log_path, "wb") as log:
        completed = subprocess.run(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=timeout_s,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
    if completed.returncode != 0 or not result_path.exists():
        raise RuntimeError(
            f"vllm bench serve failed ({completed.returncode}); {log_path} ends:\n"
            f"{log_tail(log_path)}"
        )
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result
