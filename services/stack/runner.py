"""Start, watch and stop the processes of a stack on this machine (no Docker needed)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from services.stack.spec import ProcessSpec, StackConfig, stack_processes


class StackError(RuntimeError):
    """A process of the stack failed to start or become ready."""


def terminate(proc: subprocess.Popen[bytes], timeout_s: float) -> int:
    """SIGTERM `proc`, SIGKILL it if it still runs after `timeout_s`, and reap it; its exit
    code (at once if it has already exited)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def _tcp_ready(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _http_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


class Stack:
    """The processes of one stack; their pids and logs live in `run_dir`."""

    def __init__(
        self,
        config: StackConfig,
        run_dir: Path,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`env`: variables every process gets on top of this one's environment (a service's
        setting that StackConfig does not carry)."""
        self.config = config
        self.env = dict(env or {})
        self.run_dir = run_dir
        self.cwd = cwd or Path.cwd()
        self.specs = {p.name: p for p in stack_processes(config)}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def pid_file(self) -> Path:
        return self.run_dir / "pids.json"

    def log_path(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    def start(self, timeout_s: float = 120.0, progress: bool = False) -> None:
        """Start every process once the ones it depends on are ready (the executors together),
        then wait until each is ready."""
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        ready: set[str] = set()

        def wait(name: str) -> None:
            if name not in ready:
                self.wait_ready(name, timeout_s)
                ready.add(name)

        try:
            for spec in self.specs.values():
                for dependency in spec.depends_on:
                    wait(dependency)
                if progress:
                    print(f"starting {spec.name} ...", flush=True)
                self.start_one(spec.name)
            for name in self.specs:
                wait(name)
        except BaseException:
            self.stop()
            raise

    def start_one(self, name: str) -> None:
        spec = self.specs[name]
        log = self.log_path(name).open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env, **spec.env}
        self.procs[name] = subprocess.Popen(
            spec.argv,
            cwd=self.cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        log.close()
        self._write_pids()

    def wait_ready(self, name: str, timeout_s: float) -> None:
        spec: ProcessSpec = self.specs[name]
        kind, target = spec.ready
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                log = self.log_path(name)
                tail = log.read_text(errors="replace")[-3000:]
                raise StackError(f"{name} exited with {proc.returncode} (log: {log}):\n{tail}")
            ok = _tcp_ready(self.config.host, int(target)) if kind == "tcp" else _http_ready(target)
            if ok:
                return
            time.sleep(0.2)
        raise StackError(f"{name} was not ready within {timeout_s:.0f} s")

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs[name]
        if proc.poll() is None:
            os.killpg(proc.pid, sig)

    def stop_one(self, name: str, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (drain), then SIGKILL after `timeout_s`; the exit code."""
        proc = self.procs.get(name)
        if proc is None:
            return None
        if proc.poll() is None:
            self.signal(name, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.signal(name, signal.SIGKILL)
                proc.wait()
        return proc.returncode

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop everything, each process once nothing still running depends on it (the router
        first, the executors together, Redis last): SIGTERM, then SIGKILL after `timeout_s`."""
        left = [name for name in reversed(list(self.specs)) if name in self.procs]
        while left:
            needed = {d for name in left for d in self.specs[name].depends_on}
            wave = [name for name in left if name not in needed] or left
            for name in wave:
                with contextlib.suppress(ProcessLookupError):  # it has just exited
                    self.signal(name, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            for name in wave:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.procs[name].wait(max(0.0, deadline - time.monotonic()))
                if self.procs[name].poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        self.signal(name, signal.SIGKILL)
                    self.procs[name].wait()
            left = [name for name in left if name not in wave]
        self.pid_file.unlink(missing_ok=True)

    def _write_pids(self) -> None:
        self.pid_file.write_text(json.dumps({n: p.pid for n, p in self.procs.items()}))


def stop_from_pid_file(run_dir: Path, timeout_s: float = 15.0) -> list[str]:
    """`make down`: stop the processes a previous `make up` recorded."""
    pid_file = run_dir / "pids.json"
    if not pid_file.is_file():
        return []
    pids: dict[str, int] = json.loads(pid_file.read_text())
    stopped = []
    for name, pid in reversed(list(pids.items())):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        stopped.append(name)
    pid_file.unlink()
    return stopped
