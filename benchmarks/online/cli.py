"""The online benchmark's command line."""

from __future__ import annotations

import argparse

import benchmarks.online
from benchmarks.online.config import DEFAULTS, QUICK, REPO


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The benchmark's options over DEFAULTS (and QUICK with --quick)."""
    p = argparse.ArgumentParser(
        description=benchmarks.online.__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    p.add_argument("--model", help=f"checkpoint dir (default {DEFAULTS['model']})")
    p.add_argument(
        "--dataset",
        choices=("sharegpt", "random"),
        help="ShareGPT requests (default) or random token ids of lognormal lengths",
    )
    p.add_argument("--data", help=f"ShareGPT JSON (default {DEFAULTS['data']}, from make data)")
    p.add_argument(
        "--peers",
        help=f"baselines to run, comma-separated, from vllm,transformers "
        f"(default {DEFAULTS['peers']}; the first is the main one)",
    )
    p.add_argument("--burst", type=int, help="requests sent all at once per system (0: none)")
    p.add_argument(
        "--no-vllm-client",
        dest="vllm_client",
        action="store_false",
        default=None,
        help="skip vLLM's own benchmark client",
    )
    p.add_argument("--rates", help=f"request rates, req/s (default {DEFAULTS['rates']})")
    p.add_argument("--num-prompts", type=int, help="requests per rate")
    p.add_argument("--input-len", type=float, help="mean prompt length (tokens)")
    p.add_argument("--output-len", type=float, help="mean output length (tokens)")
    p.add_argument("--max-input-len", type=int)
    p.add_argument("--max-output-len", type=int)
    p.add_argument(
        "--shared-prefix-len",
        type=int,
        help="tokens of a shared tenant prefix before each prompt (default 0: none)",
    )
    p.add_argument(
        "--num-shared-prefixes",
        type=int,
        help=f"distinct shared prefixes; request i gets prefix i %% K "
        f"(default {DEFAULTS['num_shared_prefixes']})",
    )
    p.add_argument("--slo-ttft-ms", type=float, default=DEFAULTS["slo_ttft_ms"])
    p.add_argument("--slo-tpot-ms", type=float, default=DEFAULTS["slo_tpot_ms"])
    p.add_argument("--warmup", type=int, help="warmup requests per system (not measured)")
    p.add_argument(
        "--num-executors",
        type=int,
        help=f"Quire executors (default {DEFAULTS['num_executors']}; --quick: 1)",
    )
    p.add_argument("--skip-baseline", action="store_true", help="no baselines (Quire only)")
    p.add_argument("--skip-quire", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(REPO / "bench" / "results"))
    p.add_argument(
        "--rescore",
        metavar="SERVING_JSON",
        help="judge a finished run again at --slo-ttft-ms / --slo-tpot-ms (no servers started)",
    )
    p.add_argument("--quick", action="store_true", help="smoke test (~30 s)")
    args = p.parse_args(argv)
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    if args.shared_prefix_len < 0:
        p.error("--shared-prefix-len must be >= 0")
    if args.num_shared_prefixes < 1:
        p.error("--num-shared-prefixes must be >= 1")
    if args.shared_prefix_len > 0 and args.dataset == "sharegpt":
        p.error("--shared-prefix-len needs --dataset random")
    args.peers = [] if args.skip_baseline else [x for x in str(args.peers).split(",") if x]
    unknown = set(args.peers) - {"vllm", "transformers"}
    if unknown:
        p.error(f"--peers: unknown {sorted(unknown)}; choose from vllm, transformers")
    if args.burst < 0:
        p.error("--burst must be >= 0")
    return args
