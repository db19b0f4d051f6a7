"""`python -m services.stack up|down`: the local stack behind `make up` / `make down`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from services.stack.runner import Stack, StackError, stop_from_pid_file
from services.stack.spec import StackConfig

RUN_DIR = Path(".run")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.stack")
    parser.add_argument("command", choices=["up", "down"])
    parser.add_argument("--run-dir", type=Path, default=RUN_DIR, help="pids and logs (.run)")
    args = parser.parse_args(argv)
    if args.command == "down":
        stopped = stop_from_pid_file(args.run_dir)
        print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        return 0
    if (args.run_dir / "pids.json").is_file():
        print("a stack is already up (run `make down` first)", file=sys.stderr)
        return 1
    config = StackConfig.from_env()
    stack = Stack(config, args.run_dir)
    try:
        stack.start(progress=True)
    except StackError as exc:
        print(f"make up failed: {exc}", file=sys.stderr)
        return 1
    print(f"\nQuire is up: {config.router_url} (logs in {args.run_dir}/logs)\n")
    print(
        f"curl {config.router_url}/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        f'  -d \'{{"model": "{Path(config.model).name}", '
        '"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}\''
    )
    print("\nmake down   # stops everything")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
