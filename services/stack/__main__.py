"""`python -m services.stack up|down|compose`: the local stack behind `make up` / `make down`.

`compose` writes compose.yaml from the same process list (`make compose`); with `--check` it
only says whether the committed file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.common.generated_files import write_or_check
from services.stack.runner import Stack, StackError, stop_from_pid_file
from services.stack.spec import StackConfig

RUN_DIR = Path(".run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.stack")
    parser.add_argument("command", choices=["up", "down", "compose"])
    parser.add_argument("--run-dir", type=Path, default=RUN_DIR, help="pids and logs (.run)")
    parser.add_argument(
        "--check", action="store_true", help="compose: exit 1 if compose.yaml is out of date"
    )
    args = parser.parse_args(argv)
    if args.command == "compose":
        return write_compose(check=args.check)
    if args.command == "down":
        stopped = stop_from_pid_file(args.run_dir)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    if (args.run_dir / "pids.json").is_file():
        print("a stack is already up (run `make down` first)", file=sys.stderr)
        return 1
    try:
        config = StackConfig.from_env()
    except ValueError as exc:
        print(f"make up: error: {exc}", file=sys.stderr)
        return 2
    print(f"model {config.model} (QUIRE_MODEL), {config.num_executors} executors", flush=True)
    stack = Stack(config, args.run_dir)
    try:
        stack.start(progress=True)
    except StackError as exc:
        print(f"make up failed: {exc}", file=sys.stderr)
        return 1
    print(f"\nQuire is up: {config.router_url} (logs in {args.run_dir}/logs)")
    print(f"metrics, dashboard, cluster status, API docs: {config.router_admin_url}\n")
    print(
        f"curl {config.router_url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'  -d \'{{"model": "{Path(config.model).name}", '
        '"messages": [{"role": "user", "content": "What is the capital of France?"}], '
        '"max_tokens": 32, "temperature": 0}\''
    )
    print("\nmake down   # stops everything")
    return 0


def write_compose(check: bool = False) -> int:
    """Render compose.yaml from the process list (or, with `check`, compare it)."""
    from services.stack.compose import COMPOSE_FILE, render

    return write_or_check(COMPOSE_FILE, render(), check, "make compose")


if __name__ == "__main__":
    raise SystemExit(main())
