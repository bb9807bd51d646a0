"""Client addresses behind a reverse proxy, with authentication off (the
tenant is the address): this test plays the proxy on 127.0.0.1, which the
server trusts. Visitors it forwards for are tenants apart, a spoofed
left-most X-Forwarded-For entry never picks the tenant, per-address rate
limits follow the forwarded address, and a peer the server does not trust
(127.0.0.2) that sends forwarding headers is refused rather than merged
with everyone else behind it. Only 127.0.0.1 is ever contacted;
documentation addresses (198.51.100.0/24, 203.0.113.0/24) appear in header
values only."""

import http.client
import json

import pytest

from harness import Server


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_SERVER_TRUSTED_PROXIES='["127.0.0.1/32"]',
        MCP_SANDBOX_LIMITS_IP_REQUESTS_PER_SECOND="5",
    ).start()
    yield s
    s.cleanup()


def call(server, method, path, forwarded_for=None, body=None, source="127.0.0.1"):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60, source_address=(source, 0))
    headers = {"Content-Type": "application/json"}
    if forwarded_for:
        headers["X-Forwarded-For"] = forwarded_for
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data or b"null")


def ids(server, forwarded_for):
    status, body = call(server, "GET", "/api/sandboxes", forwarded_for)
    assert status == 200, body
    return [s["sandbox_id"] for s in body["sandboxes"]]


def test_forwarded_visitors_are_tenants_apart(server):
    status, created = call(server, "POST", "/api/sandboxes", "198.51.100.9", {"name": "visitor 9"})
    assert status == 201, created
    sid = created["sandbox_id"]
    assert ids(server, "198.51.100.9") == [sid]
    # The proxy appends the address it saw: what the client wrote before it
    # is the client's own claim, and never picks the tenant.
    assert ids(server, "198.51.100.9, 198.51.100.10") == []
    assert ids(server, "203.0.113.1, 198.51.100.9") == [sid]
    assert ids(server, "198.51.100.10") == []
    assert ids(server, None) == [], "the proxy's own requests are the local tenant"
    assert call(server, "DELETE", f"/api/sandboxes/{sid}", "198.51.100.10")[0] == 404
    assert call(server, "DELETE", f"/api/sandboxes/{sid}", "198.51.100.9")[0] == 200


def test_per_address_limits_follow_the_forwarded_address(server):
    statuses = [call(server, "GET", "/api/sandboxes", "203.0.113.5")[0] for _ in range(30)]
    assert 429 in statuses, statuses
    assert call(server, "GET", "/api/sandboxes", "203.0.113.6")[0] == 200, "another visitor is not limited"
    # Counted against the address the proxy saw (the right-most), not the
    # one the client wrote: .5's bucket, which gives a request back every
    # 200 ms (a slow machine may take that long between two calls), runs
    # dry again within eight, while .6's (a burst of ten), with nine calls
    # in all, would not.
    statuses = [call(server, "GET", "/api/sandboxes", "203.0.113.6, 203.0.113.5")[0] for _ in range(8)]
    assert 429 in statuses, statuses


def test_an_untrusted_proxy_is_refused_instead_of_merging_its_visitors(server):
    status, body = call(server, "GET", "/api/sandboxes", "198.51.100.9", source="127.0.0.2")
    assert status == 403 and "server.trusted_proxies" in body["error"], body
    status, body = call(server, "GET", "/api/sandboxes", None, source="127.0.0.2")
    assert status == 200, "without forwarding headers it is a client like any other"
