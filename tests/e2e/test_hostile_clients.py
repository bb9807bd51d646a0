"""Attacks by clients on the front end, second round, each performed over
real HTTP against the real server: picking one's own address behind a proxy
that appends X-Forwarded-For, churning IPv6 addresses of one /64, holding
connections with bodies that never finish, sending bodies past the cap or
to no session, and percent-encoding an SSE session id to be charged to
another bucket. This test plays the trusted proxy on 127.0.0.1; only
127.0.0.1 is ever contacted, and documentation addresses (198.51.100.0/24,
203.0.113.0/24, 2001:db8::/32) appear in header values only."""

import http.client
import json
import socket
import time

import pytest

from harness import Server, new_key

OPS, OPS_SHA = new_key("ops")
KEYS_PER_HOUR = 3
BODY_TIMEOUT = 3
GUEST_RPS = 2


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f'[{{name = "ops", key_sha256 = "{OPS_SHA}"}}]',
        MCP_SANDBOX_SERVER_TRUSTED_PROXIES='["127.0.0.1/32"]',
        MCP_SANDBOX_GUEST_ENABLED="true",
        MCP_SANDBOX_GUEST_KEYS_PER_IP_PER_HOUR=str(KEYS_PER_HOUR),
        MCP_SANDBOX_GUEST_REQUESTS_PER_SECOND=str(GUEST_RPS),
        MCP_SANDBOX_LIMITS_BODY_TIMEOUT_SECONDS=str(BODY_TIMEOUT),
        # Larger than the few bytes a second the attack sends.
        MCP_SANDBOX_LIMITS_BODY_MIN_BYTES_PER_SECOND="1024",
    ).start()
    yield s
    s.cleanup()


def guest(server, headers):
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    c.request("POST", "/api/guest", body=b"", headers=headers)
    r = c.getresponse()
    body = json.loads(r.read() or b"null")
    c.close()
    return r.status, body


def test_a_client_behind_an_appending_proxy_cannot_pick_its_address_with_forwarded(server):
    # nginx's $proxy_add_x_forwarded_for appends the address it saw, and
    # passes the client's own Forwarded header through untouched.
    statuses = [
        guest(server, {"X-Forwarded-For": "198.51.100.20", "Forwarded": f"for=203.0.113.{i}"})[0]
        for i in range(1, 9)
    ]
    assert statuses.count(201) == KEYS_PER_HOUR, statuses
    assert statuses[KEYS_PER_HOUR:] == [429] * (8 - KEYS_PER_HOUR), statuses


def test_ipv6_addresses_of_one_prefix_share_one_allowance(server):
    statuses = [guest(server, {"X-Forwarded-For": f"2001:db8:1:2::{i:x}"})[0] for i in range(1, 13)]
    assert statuses.count(201) == KEYS_PER_HOUR, statuses
    # Another /64 is another subscriber.
    assert guest(server, {"X-Forwarded-For": "2001:db8:1:3::1"})[0] == 201


def slow_body(server, path, length, headers=None):
    """A connection that sends the headers of a body of `length` bytes and
    then one byte of it."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}", f"Content-Length: {length}",
            "Content-Type: application/json"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    s.sendall(("\r\n".join(head) + "\r\n\r\n{").encode())
    return s


def test_bodies_that_never_finish_are_cut_off_and_their_connections_closed(server):
    auth = {"Authorization": f"Bearer {OPS}", "Accept": "application/json, text/event-stream"}
    conns = [slow_body(server, "/mcp", 4096, auth) for _ in range(40)]
    started = time.monotonic()
    answers = []
    try:
        for s in conns:
            s.settimeout(max(1.0, BODY_TIMEOUT + 20 - (time.monotonic() - started)))
            got = b""
            try:
                while True:
                    # A byte now and then: not enough to buy time.
                    try:
                        s.sendall(b" ")
                    except OSError:
                        pass
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    got += chunk
            except socket.timeout:
                got += b"<still open>"
            answers.append(got)
    finally:
        for s in conns:
            s.close()
    took = time.monotonic() - started
    assert all(b"<still open>" not in a for a in answers), answers[:3]
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers[:3]
    assert b"did not arrive in time" in answers[0]
    assert took < BODY_TIMEOUT + 20, took


def answer_without_body(server, path, length, headers=None):
    """The answer to headers announcing a body that is never sent."""
    s = slow_body(server, path, length, headers)
    s.settimeout(10)
    try:
        got = b""
        while b"\r\n\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        s.close()


def test_a_body_past_the_cap_is_refused_before_it_is_read(server):
    got = answer_without_body(server, "/mcp", 64 << 20, {"Authorization": f"Bearer {OPS}"})
    assert got.startswith(b"HTTP/1.1 413"), got[:200]
    assert b"connection: close" in got.lower()


def test_a_message_to_no_session_is_answered_before_its_body_is_read(server):
    got = answer_without_body(server, "/messages?sessionId=0123456789abcdef", 8 << 20)
    assert got.startswith(b"HTTP/1.1 404"), got[:200]


def open_sse(server, key):
    """Opens an SSE stream; returns the socket and its session id."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    s.sendall((f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {key}\r\n"
               "Accept: text/event-stream\r\n\r\n").encode())
    got = b""
    while b"sessionId=" not in got or b"\n\n" not in got.split(b"sessionId=", 1)[1]:
        chunk = s.recv(4096)
        assert chunk, got
        got += chunk
    sid = got.split(b"sessionId=", 1)[1].split(b"\n", 1)[0].strip().decode()
    return s, sid


def test_an_encoded_session_id_is_charged_to_the_session_s_tenant(server):
    status, body = guest(server, {"X-Forwarded-For": "198.51.100.99"})
    assert status == 201, body
    stream, sid = open_sse(server, body["key"])
    try:
        encoded = "".join(f"%{ord(c):02x}" for c in sid)
        # Not a message (400 once past the guard): the session stays as it is.
        message = b"{}"
        limited = 0
        for _ in range(20):
            c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            c.request("POST", f"/messages?sessionId={encoded}", body=message,
                      headers={"Content-Type": "application/json", "X-Forwarded-For": "203.0.113.77"})
            r = c.getresponse()
            text = r.read()
            c.close()
            assert r.status in (400, 429), (r.status, text)
            limited += r.status == 429 and b"rate limit" in text
        assert limited > 0, "the guest's messages were charged to another bucket"
    finally:
        stream.close()
