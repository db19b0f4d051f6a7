"""The door: overload refused with 429 + Retry-After before the body is read or parsed."""

from __future__ import annotations

from typing import Any

from tests.services.conftest import wait_for
from tests.services.router.conftest import Cluster
from tests.services.router.fake_executor import Script
from tests.services.router.test_errors import assert_error


def test_overload_is_refused_before_the_body_is_parsed(cluster: Cluster, tokenizer: Any) -> None:
    slow = Script(tokens=tokenizer.encode(" tick" * 40, add_special_tokens=False), delay_s=0.1)
    cluster.script(slow)
    router = cluster.router(max_pending_total=1, retry_after_s=3)
    with router.http() as http, router.admin() as admin:
        # With a free slot a malformed body is a 400 naming the problem ...
        assert_error(
            http.post(
                "/v1/completions",
                content=b"{not json",
                headers={"content-type": "application/json"},
            ),
            400,
        )
        with http.stream(
            "POST", "/v1/completions", json={"prompt": "x", "max_tokens": 40, "stream": True}
        ) as held:
            lines = held.iter_lines()
            next(lines)
            # ... without one, the same body is refused at the door: nothing was parsed.
            for path in ("/v1/completions", "/v1/chat/completions"):
                refused = http.post(
                    path, content=b"{not json", headers={"content-type": "application/json"}
                )
                error = assert_error(refused, 429)
                assert refused.headers["retry-after"] == "3"
                assert error["code"] == "rate_limit_exceeded"
                assert "in flight" in error["message"]
            assert http.get("/v1/models").status_code == 200  # only generation is gated
        wait_for(lambda: "quire_router_in_flight_requests 0.0" in admin.get("/metrics").text, 5)
        metrics = admin.get("/metrics").text
        assert 'quire_router_admission_rejections_total{code="429"} 2.0' in metrics
        cluster.script(Script(tokens=[50, 2]))
        assert http.post("/v1/completions", json={"prompt": "z"}).status_code == 200
