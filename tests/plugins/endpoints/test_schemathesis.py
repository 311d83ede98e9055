"""Property-based requests against the served OpenAPI spec of the /v1 routes: whatever the
body, the server answers without a 5xx. The server is small (48-token context, 4 sequences)
and the examples per route are few, so the run is bounded.

Schemathesis generates the cases (``APIOperation.as_strategy``); hypothesis runs them,
derandomized so CI sees the same cases every run. ``HOST_FUZZ_RANDOM=1`` and
``HOST_FUZZ_EXAMPLES=200`` turn this into a wider random search when hunting bugs.
"""

from __future__ import annotations

import os

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from helpers import run_server


def test_v1_routes_never_answer_5xx(tmp_path):
    with run_server(tmp_path, ["--max-model-len", "48", "--max-num-seqs", "4"]) as server:
        schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json").include(path_regex="^/v1/")
        operations = [result.ok() for result in schema.get_all_operations()]
        labels = sorted(op.label for op in operations)
        assert "POST /v1/completions" in labels and "POST /v1/chat/completions" in labels
        for op in operations:

            @given(case=op.as_strategy())
            @settings(max_examples=int(os.environ.get("HOST_FUZZ_EXAMPLES", "20")), deadline=None,
                      suppress_health_check=list(HealthCheck), database=None, derandomize=not os.environ.get("HOST_FUZZ_RANDOM"))
            def run(case):
                response = case.call(timeout=60)
                case.validate_response(response, checks=[not_a_server_error])

            run()
        # the server survived all of it
        import httpx

        assert httpx.get(f"{server.url}/health").status_code == 200
