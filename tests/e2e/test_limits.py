"""Hostile clients against the real server: a tenant holding sessions past
its cap (over both transports), sessions left idle, connections that never
finish their headers, one address opening too many connections, a key
flooding through its SSE session's /messages, and probes of /health during
a flood. Every refusal is 429 or 503 with Retry-After and a JSON message,
and the server keeps serving everyone else. The shipped sandbox quota: three
a key, and twenty without keys (one person on loopback), each crossed."""

import asyncio
import http.client
import json
import os
import socket
import time

import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import Server, get, new_key

ALICE, ALICE_SHA = new_key("alice")
BOB, BOB_SHA = new_key("bob")
SLOW, SLOW_SHA = new_key("slow")
OPS, OPS_SHA = new_key("ops")
SESSIONS_PER_TENANT = 3
IDLE_SECONDS = 3
HEADER_SECONDS = 2
CONNECTIONS_PER_IP = 24
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture(scope="module")
def server():
    keys = (
        f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, '
        f'{{name = "bob", key_sha256 = "{BOB_SHA}"}}, '
        f'{{name = "slow", key_sha256 = "{SLOW_SHA}", requests_per_second = 1}}, '
        f'{{name = "ops", key_sha256 = "{OPS_SHA}"}}]'
    )
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=keys,
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_LIMITS_MAX_SESSIONS_PER_TENANT=str(SESSIONS_PER_TENANT),
        MCP_SANDBOX_LIMITS_SESSION_IDLE_SECONDS=str(IDLE_SECONDS),
        MCP_SANDBOX_LIMITS_HEADER_TIMEOUT_SECONDS=str(HEADER_SECONDS),
        MCP_SANDBOX_LIMITS_MAX_CONNECTIONS_PER_IP=str(CONNECTIONS_PER_IP),
        MCP_SANDBOX_LIMITS_IP_REQUESTS_PER_SECOND="50",
        MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT=None,
    ).start()
    yield s
    s.cleanup()


def conn(server, timeout=10):
    return http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)


def open_http_session(server, key):
    """(status, headers, session id) of a Streamable HTTP initialize."""
    c = conn(server)
    c.request("POST", "/mcp", body=json.dumps(INIT), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream"})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.getheader("mcp-session-id"), body


def close_http_session(server, key, sid):
    c = conn(server)
    c.request("DELETE", "/mcp", headers={"Authorization": f"Bearer {key}", "Mcp-Session-Id": sid,
                                         "Mcp-Protocol-Version": "2025-06-18"})
    status = c.getresponse().status
    c.close()
    return status


class SseStream:
    """A legacy SSE session held open on its own connection."""

    def __init__(self, server, key):
        self.c = conn(server)
        self.c.request("GET", "/sse", headers={"Authorization": f"Bearer {key}", "Accept": "text/event-stream"})
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.headers = {k.lower(): v for k, v in self.r.getheaders()}
        self.endpoint = None
        if self.status == 200:
            while self.endpoint is None:
                line = self.r.readline().decode()
                if line.startswith("data:"):
                    self.endpoint = line[5:].strip()
        else:
            self.body = self.r.read()

    def read_until_closed(self, timeout):
        """Reads until the server ends the stream; the seconds it took."""
        started = time.time()
        self.c.sock.settimeout(timeout)
        while self.r.readline():
            pass
        return time.time() - started

    def close(self):
        self.c.close()


def assert_refusal(status, headers, body, want):
    assert status == want, (status, body)
    assert int(headers["retry-after"]) >= 1
    assert "error" in json.loads(body)


def bob_works(server):
    async def go():
        headers = {"Authorization": f"Bearer {BOB}"}
        async with Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers))) as c:
            r = await c.call_tool("list_sandboxes", {})
            assert not r.is_error
    asyncio.run(go())


def test_a_tenant_past_its_session_cap_is_refused_while_others_work(server):
    first = SseStream(server, ALICE)
    assert first.status == 200 and first.endpoint.startswith("/messages?sessionId=")
    opened = [open_http_session(server, ALICE) for _ in range(SESSIONS_PER_TENANT - 1)]
    assert all(status == 200 and sid for status, _, sid, _ in opened), opened
    # Both transports count against the same cap.
    status, headers, sid, body = open_http_session(server, ALICE)
    assert_refusal(status, headers, body, 429)
    assert sid is None
    refused = SseStream(server, ALICE)
    assert_refusal(refused.status, refused.headers, refused.body, 429)
    refused.close()
    # Another tenant connects and works meanwhile.
    bob_works(server)
    # Closing one frees a place.
    assert close_http_session(server, ALICE, opened[0][2]) in (200, 202, 204)
    status, _, sid, _ = open_http_session(server, ALICE)
    assert status == 200 and sid
    for s in [sid, opened[1][2]]:
        close_http_session(server, ALICE, s)
    first.close()


def test_idle_sessions_are_closed(server):
    stream = SseStream(server, ALICE)
    assert stream.status == 200
    status, _, sid, _ = open_http_session(server, ALICE)
    opened_at = time.monotonic()
    assert status == 200
    took = stream.read_until_closed(timeout=IDLE_SECONDS + 15)
    assert took < IDLE_SECONDS + 10, f"the idle SSE stream ended after {took:.1f} s"
    stream.close()
    # The session opened after the stream, so a later sweep (every quarter
    # of the limit) may close it: wait for that sweep without touching it.
    time.sleep(max(0.0, opened_at + IDLE_SECONDS + 3 - time.monotonic()))
    # The idle Streamable HTTP session is gone too: its id is unknown now.
    c = conn(server)
    c.request("POST", "/mcp", body=json.dumps({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}), headers={
        "Authorization": f"Bearer {ALICE}", "Content-Type": "application/json", "Mcp-Session-Id": sid,
        "Mcp-Protocol-Version": "2025-06-18", "Accept": "application/json, text/event-stream"})
    assert c.getresponse().status == 404
    c.close()
    # And the tenant's places are free again.
    opened = [open_http_session(server, ALICE) for _ in range(SESSIONS_PER_TENANT)]
    assert all(status == 200 for status, *_ in opened)
    for _, _, s, _ in opened:
        close_http_session(server, ALICE, s)


def open_fds(server):
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


def metric(server, name):
    _, _, body = get(server.url + "/metrics", {"Authorization": f"Bearer {OPS}"})
    line = next(l for l in body.decode().splitlines() if l.startswith(name + " "))
    return float(line.split()[-1])


def test_stalled_headers_are_dropped_and_their_descriptors_released(server):
    time.sleep(HEADER_SECONDS + 1)  # connections of earlier tests are gone
    baseline = open_fds(server)
    timeouts = metric(server, "mcp_sandbox_header_timeouts_total")
    stalled = []
    for _ in range(10):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and never more
        stalled.append(s)
    time.sleep(0.5)
    assert open_fds(server) >= baseline + 10, "the server holds the stalled connections for now"
    started = time.time()
    for s in stalled:
        # The server closes it (socket.timeout here would fail the test),
        # at most with a 408 first.
        s.settimeout(HEADER_SECONDS + 10)
        answer = b""
        while chunk := s.recv(4096):
            answer += chunk
        assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer
        s.close()
    assert time.time() - started < HEADER_SECONDS + 5
    deadline = time.time() + 10
    while open_fds(server) > baseline and time.time() < deadline:
        time.sleep(0.2)
    assert open_fds(server) <= baseline, "their descriptors are released"
    assert metric(server, "mcp_sandbox_header_timeouts_total") >= timeouts + 10


def test_one_address_cannot_hold_every_connection(server):
    time.sleep(HEADER_SECONDS + 1)
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(CONNECTIONS_PER_IP)]
    extra = socket.create_connection(("127.0.0.1", server.port))
    extra.settimeout(5)
    answer = b""
    while chunk := extra.recv(4096):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 429"), answer
    assert b"retry-after: " in head.lower()
    assert "error" in json.loads(body)
    extra.close()
    for s in held:
        s.close()
    # Once they are closed, the address is served again.
    deadline = time.time() + 5
    while time.time() < deadline:
        try:
            status, _, _ = get(server.url + "/health")
            if status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    assert status == 200


def test_messages_are_charged_to_their_sessions_key(server):
    stream = SseStream(server, SLOW)
    assert stream.status == 200
    statuses = []
    messages = [INIT, {"jsonrpc": "2.0", "method": "notifications/initialized"}] + [
        {"jsonrpc": "2.0", "id": 10 + i, "method": "ping"} for i in range(4)]
    for message in messages:
        # No key on the POST: the session id is the capability, and the
        # session's key (1 request/s, burst 2) pays for it. (A connection
        # per message: a refused request's unread body ends its connection.)
        c = conn(server)
        c.request("POST", stream.endpoint, body=json.dumps(message), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
        c.close()
    stream.close()
    assert statuses[0] == 202 and 429 in statuses and 404 not in statuses, statuses


def test_health_answers_during_a_flood_from_the_same_address(server):
    statuses = []
    c = conn(server)
    for _ in range(400):
        c.request("GET", "/api/sandboxes", headers={"Authorization": f"Bearer {ALICE}"})
        r = c.getresponse()
        r.read()
        statuses.append(r.status)
        if r.status == 429:
            break
    assert statuses[-1] == 429, "the flood reached the per-address limit"
    for _ in range(20):
        c.request("GET", "/health")
        r = c.getresponse()
        body = json.loads(r.read())
        assert r.status == 200 and body["docker"] == "ok", body
    c.close()


async def fill_quota(c, want):
    """Creates sandboxes until one is refused; their ids and the refusal."""
    made = []
    while len(made) <= want:
        r = await c.call_tool("create_sandbox", {})
        if r.is_error:
            return made, r.content[0].text
        made.append(r.structured_content["sandbox_id"])
    return made, None


def test_the_shipped_quota_is_three_a_key_and_twenty_without_keys(server):
    async def with_key():
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers))) as c:
            made, refused = await fill_quota(c, 3)
            for sid in made:
                await c.call_tool("delete_sandbox", {"sandbox_id": sid})
            return made, refused

    made, refused = asyncio.run(with_key())
    assert len(made) == 3 and refused and "already have 3 sandboxes" in refused, (made, refused)

    local = Server(MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT=None).start()
    try:
        async def one_person():
            async with Client(local.url + "/mcp") as c:
                # Three sandboxes and a fork of two: the work the quota of
                # three refused to one person before.
                made, _ = await fill_quota(c, 2)
                r = await c.call_tool("fork_sandbox", {"sandbox_id": made[0], "count": 2})
                assert not r.is_error, r.content[0].text
                forks = [f["sandbox_id"] for f in r.structured_content["forks"]]
                more, refused = await fill_quota(c, 20 - len(made) - len(forks))
                for sid in made + forks + more:
                    await c.call_tool("delete_sandbox", {"sandbox_id": sid})
                return len(made + forks + more), refused

        held, refused = asyncio.run(one_person())
        assert held == 20 and refused and "already have 20 sandboxes" in refused, (held, refused)
    finally:
        local.cleanup()
