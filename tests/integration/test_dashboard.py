"""GET /dashboard in headless Chromium: the block grid follows real load on the real stack.

The page is on the router's admin port; the load goes to its public port.

Chromium is the system one (`make chromium` installs it); without it this test fails.
The screenshot taken under load is kept at bench/results/dashboard.png.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page, sync_playwright

from services.stack.runner import Stack
from tests.integration.conftest import REPO, wait_idle

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOT = REPO / "bench" / "results" / "dashboard.png"
# Tokens each load stream asks for: six of them (prompts of ~155 tokens) fit one executor's
# 512 blocks of the test stack and stay under the tiny model's 2,048-token context.
LONG_STREAM_TOKENS = 1000
TENANTS = [
    (
        "You are the support assistant of a paged attention serving system. Answer briefly, "
        "cite the block manager when asked about memory, and never invent numbers. "
    )
    * 3,
    (
        "You translate release notes into plain language for operators who run large "
        "language models in production, keeping every version number exactly as written. "
    )
    * 3,
]

# Cells of each state on the page, summed over executors, and the stats column.
COUNT_JS = """() => {
  const n = (s) => document.querySelectorAll(s).length;
  const stats = {};
  for (const td of document.querySelectorAll('td[data-stat]')) {
    stats[td.dataset.stat] = (stats[td.dataset.stat] || []).concat([td.textContent]);
  }
  return {cells: n('.cell'), used: n('.cell.used'), shared: n('.cell.shared'),
          cached: n('.cell.cached'), executors: n('section.exec'), stats};
}"""


def knows_memory_manager(stack: Stack) -> str:
    """The router URL; the stack tells the router where the memory manager is."""
    argv = stack.specs["router"].argv
    assert "--memory-manager" in argv, "the stack must pass --memory-manager to the router"
    assert argv[argv.index("--memory-manager") + 1].endswith(f":{stack.config.memory_manager_port}")
    return stack.config.router_url


def stream_completion(
    url: str,
    prompt: str,
    max_tokens: int,
    errors: list[str],
    first_token: threading.Event | None = None,
    hang_up: threading.Event | None = None,
) -> None:
    """Stream one completion; set `first_token` once its first chunk arrives. Once `hang_up`
    is set the client closes the stream (the router aborts the request), not an error."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as resp:
            lines = []
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    lines.append(line)
                    if first_token is not None:
                        first_token.set()
                if hang_up is not None and hang_up.is_set() and resp.status_code == 200:
                    return
        if resp.status_code != 200 or lines[-1] != "data: [DONE]":
            errors.append(f"{resp.status_code}: {lines[-2:]}")
    except httpx.HTTPError as exc:
        errors.append(repr(exc))


def counts(page: Page) -> dict[str, Any]:
    result: dict[str, Any] = page.evaluate(COUNT_JS)
    return result


def test_dashboard_grid_follows_load(stack: Stack, tmp_path: Path) -> None:
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make chromium` installs it"
    url = knows_memory_manager(stack)
    admin_url = stack.config.router_admin_url  # the dashboard is on the admin port
    wait_idle(stack)
    total = stack.config.num_executors * stack.config.num_kv_blocks
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 860},
        )
        try:
            page = context.new_page()
            page.goto(f"{admin_url}/dashboard")
            page.wait_for_function(f"document.querySelectorAll('.cell').length === {total}")
            before = counts(page)
            assert before["executors"] == stack.config.num_executors
            assert before["used"] == before["shared"] == 0, before
            assert "memory manager" in page.inner_text("#status")
            assert not page.is_visible("#error"), page.inner_text("#error")

            # A finished request first (its full blocks stay cached), then six streams of
            # two tenants, each tenant sharing a system prompt. The first stream of each
            # tenant is under way (its prompt prefilled, its full blocks committed) before
            # the others start, so that they hit those blocks however slow the machine is.
            # The streams are long enough to outlast several of the page's polls however fast
            # the machine is; once the page has shown shared blocks, the clients hang up.
            errors: list[str] = []
            stream_completion(url, "Warm the cache with an unrelated prompt. " * 8, 4, errors)
            started = [threading.Event() for _ in range(6)]
            hang_up = threading.Event()
            threads = [
                threading.Thread(
                    target=stream_completion,
                    args=(
                        url,
                        f"{TENANTS[i % 2]}Question {i}: how are blocks freed?",
                        LONG_STREAM_TOKENS,
                        errors,
                        started[i],
                        hang_up,
                    ),
                )
                for i in range(6)
            ]
            peak = {"used": 0, "shared": 0}
            shot_at = 0  # blocks in use when the screenshot was last taken
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            leaders, followers = threads[:2], threads[2:]
            for thread in leaders:
                thread.start()
            for event in started[:2]:
                assert event.wait(timeout=60), "a tenant's first stream sent nothing"
            for thread in followers:
                thread.start()
            while any(t.is_alive() for t in threads):
                now = counts(page)
                peak = {k: max(peak[k], now[k]) for k in peak}
                if now["used"] + now["shared"] > shot_at + 10:  # keep the busiest view
                    page.screenshot(path=str(SCREENSHOT), full_page=True)
                    shot_at = now["used"] + now["shared"]
                if peak["shared"] and shot_at:
                    hang_up.set()  # seen: the rest of the streams is not needed
                time.sleep(0.1)
            for thread in threads:
                thread.join()
            assert not errors, errors
            assert peak["used"] > 0, peak
            assert peak["shared"] > 0, peak  # the common system prompt's blocks
            assert shot_at > 0, "no screenshot under load"

            # Finished requests leave their full blocks cached, nothing in use.
            page.wait_for_function(
                "document.querySelectorAll('.cell.used, .cell.shared').length === 0"
                " && document.querySelectorAll('.cell.cached').length > 0",
                timeout=5000,
            )
            after = counts(page)
            state = httpx.get(f"{admin_url}/dashboard/state").json()
            assert state["error"] is None
            assert after["cached"] == sum(e["num_blocks_cached"] for e in state["executors"])
            assert any(e["prefix_hit_rate"] for e in state["executors"]), state["executors"]
            assert any(rate != "–" for rate in after["stats"]["hit_rate"]), after["stats"]
        finally:
            context.close()


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/state"])
def test_dashboard_needs_no_external_assets(stack: Stack, path: str) -> None:
    resp = httpx.get(f"{stack.config.router_admin_url}{path}")
    assert resp.status_code == 200
    if path == "/dashboard":
        assert "http://" not in resp.text and "https://" not in resp.text
        assert "<script src" not in resp.text and "<link" not in resp.text
