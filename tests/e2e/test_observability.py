"""What operators see: /metrics parses as Prometheus text (with the
reference parser) and its counters move when tools are called over MCP and
the REST API; logs are JSON lines with one span per tool call naming the
tool and the sandbox, and never hold an API key or the code that ran."""

import asyncio
import json
import uuid

import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from harness import Server, api, get, new_key

ALICE, ALICE_SHA = new_key("alice")
OPS, OPS_SHA = new_key("ops")
CODE_MARKER = "secret_marker_5521"


@pytest.fixture(scope="module")
def server():
    keys = f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, {{name = "ops", key_sha256 = "{OPS_SHA}"}}]'
    s = Server(
        args=["--log-json"],
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=keys,
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
    ).start()
    yield s
    s.cleanup()


def scrape(server):
    """Every sample of /metrics, by name and labels."""
    status, headers, body = get(server.url + "/metrics", {"Authorization": f"Bearer {OPS}"})
    assert status == 200 and headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def test_metrics_are_for_administrators(server):
    assert get(server.url + "/metrics")[0] == 401
    assert get(server.url + "/metrics", {"Authorization": f"Bearer {ALICE}"})[0] == 403


def test_metrics_parse_and_their_counters_move(server):
    before = scrape(server)
    for name in [
        "mcp_sandbox_sandboxes",
        "mcp_sandbox_pool_ready",
        "mcp_sandbox_installs_total",
        "mcp_sandbox_rate_limited_total",
        "mcp_sandbox_container_restarts_total",
    ]:
        assert any(key[0] == name for key in before), name

    async def go():
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers))) as c:
            created = (await c.call_tool("create_sandbox", {"name": "metrics"})).structured_content
            sid = created["sandbox_id"]
            ran = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": f"{CODE_MARKER} = 1\nprint(2)"})
            assert not ran.is_error and ran.structured_content["stdout"] == "2\n"
            missing = await c.call_tool("execute_python_code", {"sandbox_id": str(uuid.uuid4()), "code": "1"})
            assert missing.is_error
            installed = await c.call_tool("install_package_in_sandbox", {"sandbox_id": sid, "package_name": "six"})
            assert installed.structured_content["status"] == "success", installed.structured_content
            return sid

    sid = asyncio.run(go())
    try:
        assert api(server, "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "true"})[0] == 200
        assert api(server, "POST", f"/api/sandboxes/{sid}/restart", ALICE)[0] == 200
        during = scrape(server)
    finally:
        assert api(server, "DELETE", f"/api/sandboxes/{sid}", ALICE)[0] == 200

    def moved(name, **labels):
        return value(during, name, **labels) - value(before, name, **labels)

    calls = "mcp_sandbox_tool_calls_total"
    assert moved(calls, tool="create_sandbox", outcome="ok") == 1
    assert moved(calls, tool="execute_python_code", outcome="ok") == 1
    assert moved(calls, tool="execute_python_code", outcome="not_found") == 1
    assert moved(calls, tool="execute_terminal_command", outcome="ok") == 1, "REST calls count as the same tools"
    assert moved(calls, tool="restart_sandbox", outcome="ok") == 1
    latency = "mcp_sandbox_execution_duration_seconds"
    assert moved(latency + "_count", tool="execute_python_code") == 1
    assert moved(latency + "_bucket", tool="execute_python_code", le="+Inf") == 1
    assert moved("mcp_sandbox_installs_total", outcome="success") == 1
    assert moved("mcp_sandbox_container_restarts_total") == 1
    live = sum(value(during, "mcp_sandbox_sandboxes", status=s) for s in ("running", "paused"))
    assert live >= 1
    after = scrape(server)
    assert value(after, "mcp_sandbox_sandboxes", status="running") == value(during, "mcp_sandbox_sandboxes", status="running") - 1


def test_logs_are_json_with_a_span_per_tool_call_and_no_secrets(server):
    status, created = api(server, "POST", "/api/sandboxes", ALICE, {"name": "logs"})
    assert status == 201
    sid = created["sandbox_id"]
    api(server, "POST", f"/api/sandboxes/{sid}/python", ALICE, {"code": f"{CODE_MARKER} = 2"})
    api(server, "DELETE", f"/api/sandboxes/{sid}", ALICE)
    text = server.log.read_text()
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    calls = [l for l in lines if l.get("fields", {}).get("message") == "tool call"]
    ran = [
        l
        for l in calls
        if l.get("span", {}).get("tool") == "execute_python_code" and l["span"].get("sandbox_id") == sid
    ]
    assert len(ran) == 1, calls[-5:]
    assert ran[0]["level"] == "INFO" and ran[0]["fields"]["outcome"] == "ok"
    assert ran[0]["fields"]["duration_ms"] >= 0
    for secret in (ALICE, OPS, CODE_MARKER):
        assert secret not in text
