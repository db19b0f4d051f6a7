"""Property-based requests from the router's own OpenAPI schema: nothing may be a 5xx.

A bounded run (a few examples per operation) against a live router in front of fake
executors, with schemathesis' `not_a_server_error` check only: a 4xx is a fine answer to
a generated body, a 5xx is a router bug. The schema comes from the admin port and describes
the public one, where the requests go.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok

from tests.services.router.conftest import Cluster, RouterHandle
from tests.services.router.fake_executor import Script

MAX_EXAMPLES = 8  # per operation and mode; the whole run stays well under 30 s


@pytest.fixture(scope="module")
def live_router(module_cluster: Cluster, tokenizer: Any) -> RouterHandle:
    module_cluster.script(Script(tokens=tokenizer.encode(" one two", add_special_tokens=False)))
    return module_cluster.router(memory_manager="", request_timeout_s=5.0)


def test_no_server_errors(live_router: RouterHandle) -> None:
    schema = schemathesis.openapi.from_url(f"{live_router.admin_url}/openapi.json")
    operations = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operations.append(result.ok())
    assert {op.path for op in operations} >= {"/v1/completions", "/v1/chat/completions"}
    for operation in operations:
        # Schema-violating bodies too where there is a body (a GET has nothing to violate).
        modes = [GenerationMode.POSITIVE]
        if operation.method.upper() == "POST":
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=MAX_EXAMPLES,
                deadline=None,
                derandomize=True,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                case.call_and_validate(
                    base_url=live_router.base_url, checks=[not_a_server_error], timeout=10
                )

            check()
