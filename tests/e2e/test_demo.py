"""The public demo as the README configures it: authentication on, guest
keys on, the TLS proxy (here: this test, on 127.0.0.1) trusted, bound
beyond loopback with its public name checked; only the guests' request
rate is raised here (test_hostile_clients.py crosses the shipped one).
Guests are tenants apart on every transport, issuance is limited per
client address (the address the trusted proxy forwards for, never a
spoofed left-most entry), an expired guest key gets 401 and its
sandboxes are removed, and other Host names are refused. Only 127.0.0.1
is ever contacted; documentation addresses (198.51.100.0/24,
203.0.113.0/24) appear in header values only."""

import asyncio
import http.client
import json
import time
import urllib.request

import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import Server, api, get, new_key

OPS, OPS_SHA = new_key("ops")
KEY_TTL = 10
KEYS_PER_HOUR = 3
PUBLIC_HOST = "demo.example.test"


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_SERVER_HOST="0.0.0.0",
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f'[{{name = "ops", key_sha256 = "{OPS_SHA}"}}]',
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_SERVER_TRUSTED_PROXIES='["127.0.0.1/32"]',
        MCP_SANDBOX_GUEST_ENABLED="true",
        MCP_SANDBOX_GUEST_KEY_TTL_SECONDS=str(KEY_TTL),
        MCP_SANDBOX_GUEST_KEYS_PER_IP_PER_HOUR=str(KEYS_PER_HOUR),
        # Each MCP call here is several requests (a session's start, the
        # call, its end), and a guest's few calls in a second or two could
        # meet the shipped guest rate (5 a second, burst 10): that rate has
        # its own test (test_hostile_clients.py).
        MCP_SANDBOX_GUEST_REQUESTS_PER_SECOND="100",
    )
    s.env["MCP_SANDBOX_SERVER_PUBLIC_URL"] = f"http://{PUBLIC_HOST}:{s.port}"
    s.start()
    yield s
    s.cleanup()


def post(server, path, headers=None, body=b""):
    req = urllib.request.Request(server.url + path, data=body, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, json.loads(e.read())


def guest_key(server, forwarded_for):
    status, _, body = post(server, "/api/guest", {"X-Forwarded-For": forwarded_for})
    assert status == 201, body
    assert body["key"].startswith("msg_") and body["expires_at"].endswith("Z")
    return body["key"]


async def tool(server, key, transport, tool_name, **args):
    headers = {"Authorization": f"Bearer {key}"}
    if transport == "sse":
        c = Client(sse_client(server.url + "/sse", headers=headers), mode="legacy")
    else:
        c = Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))
    async with c:
        r = await c.call_tool(tool_name, args)
        return r


def test_guests_are_tenants_apart_on_every_transport(server):
    a = guest_key(server, "198.51.100.1")
    b = guest_key(server, "198.51.100.2")
    created = asyncio.run(tool(server, a, "http", "create_sandbox", name="guest a"))
    assert not created.is_error, created.content[0].text
    sid = created.structured_content["sandbox_id"]
    assert created.structured_content["expires_at"], "a guest's sandbox ends with its key"
    listed = asyncio.run(tool(server, a, "sse", "list_sandboxes"))
    assert [s["sandbox_id"] for s in listed.structured_content["sandboxes"]] == [sid]
    assert asyncio.run(tool(server, b, "http", "list_sandboxes")).structured_content["sandboxes"] == []
    run = asyncio.run(tool(server, b, "sse", "execute_python_code", sandbox_id=sid, code="print(1)"))
    assert run.is_error, "guest b cannot reach guest a's sandbox"
    assert api(server, "GET", f"/api/sandboxes/{sid}", b)[0] == 404
    assert api(server, "GET", f"/api/sandboxes/{sid}", a)[0] == 200
    # The guest tier holds one sandbox.
    second = asyncio.run(tool(server, a, "http", "create_sandbox"))
    assert second.is_error and "delete" in second.content[0].text
    assert api(server, "DELETE", f"/api/sandboxes/{sid}", a)[0] == 200


def test_guest_keys_per_address_are_limited_by_the_forwarded_address(server):
    for _ in range(KEYS_PER_HOUR):
        guest_key(server, "203.0.113.50")
    status, headers, body = post(server, "/api/guest", {"X-Forwarded-For": "203.0.113.50"})
    assert status == 429 and int(headers["retry-after"]) > 60 and "error" in body
    # A client cannot pick the address it is charged to: the proxy appends
    # the real one, and only the right-most untrusted entry counts.
    status, _, _ = post(server, "/api/guest", {"X-Forwarded-For": "198.51.100.77, 203.0.113.50"})
    assert status == 429, "a spoofed left-most entry does not escape the limit"
    guest_key(server, "203.0.113.50, 203.0.113.51")
    # This proxy sets X-Forwarded-For (server.forwarded_header): a Forwarded
    # header is the client's own and does not move it to a fresh address.
    status, _, _ = post(server, "/api/guest", {"X-Forwarded-For": "203.0.113.50", "Forwarded": "for=198.51.100.3"})
    assert status == 429


def test_an_expired_guest_key_gets_401_and_its_sandboxes_go(server):
    key = guest_key(server, "198.51.100.9")
    status, created = api(server, "POST", "/api/sandboxes", key, {"name": "short-lived"})
    assert status == 201, created
    containers, _ = server.own_objects()
    assert containers, "the guest's sandbox has a container"
    # A session the key opened ends with the key.
    stream = http.client.HTTPConnection("127.0.0.1", server.port, timeout=KEY_TTL + 15)
    stream.request("GET", "/sse", headers={"Authorization": f"Bearer {key}"})
    events = stream.getresponse()
    assert events.status == 200
    opened = time.time()
    while events.readline():
        pass
    assert time.time() - opened < KEY_TTL + 10, "the guest's SSE stream outlived its key"
    stream.close()
    time.sleep(max(0, opened + KEY_TTL + 1 - time.time()))
    status, body = api(server, "GET", "/api/sandboxes", key)
    assert status == 401 and "expired" in body["error"], body
    deadline = time.time() + 30
    while time.time() < deadline:
        listed = asyncio.run(tool(server, OPS, "http", "list_sandboxes")).structured_content["sandboxes"]
        if not any(s["sandbox_id"] == created["sandbox_id"] for s in listed) and not server.own_objects()[0]:
            break
        time.sleep(1)
    else:
        pytest.fail("the expired guest's sandbox was not removed")


def test_other_host_names_are_refused(server):
    for host, want in [("evil.example", 403), (f"{PUBLIC_HOST}:{server.port}", 200), ("127.0.0.1", 200)]:
        status, _, body = get(server.url + "/api/sandboxes", {"Host": host, "Authorization": f"Bearer {OPS}"})
        assert status == want, (host, status, body)
    status, _, body = get(server.url + "/api/sandboxes", {"Host": "evil.example", "Authorization": f"Bearer {OPS}"})
    assert b"DNS-rebinding" in body
