"""The adversarial suite: a server with API keys, where tenant B attacks
tenant A's sandbox through every tool and route, keys are missing, wrong or
revoked, link tokens are forged or expired, paths try to escape, arguments
try to inject, one key floods, and a tenant hits its quota. Every rejection
must leave the server serving others normally."""

import asyncio
import json
import time
import urllib.parse
import urllib.request

import pytest
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import Server, docker, get, new_key

ALICE = "alice-key-0123456789abcdef"
CAROL = "carol-key-0123456789abcdef"


BOB, BOB_SHA = new_key("bob")
FLOOD, FLOOD_SHA = new_key("flood")
OPS, OPS_SHA = new_key("ops")


@pytest.fixture(scope="module")
def server():
    keys = (
        f'[{{name = "alice", key = "{ALICE}", max_sandboxes = 2}}, '
        f'{{name = "bob", key_sha256 = "{BOB_SHA}"}}, '
        f'{{name = "carol", key = "{CAROL}", revoked = true}}, '
        f'{{name = "flood", key_sha256 = "{FLOOD_SHA}", requests_per_second = 1}}, '
        f'{{name = "ops", key_sha256 = "{OPS_SHA}"}}]'
    )
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=keys,
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_AUTH_LINK_TTL_SECONDS="3",
    ).start()
    yield s
    s.cleanup()


def client(server, key, path="/mcp"):
    headers = {"Authorization": f"Bearer {key}"}
    if path == "/sse":
        return Client(sse_client(server.url + "/sse", headers=headers), mode="legacy")
    return Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))


async def ok(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert not r.is_error, r.content[0].text
    return r.structured_content


def post_json(url, body, headers=None):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def test_requests_without_a_valid_key_get_401(server):
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    for headers, word in [({}, "API key is required"), ({"Authorization": "Bearer nope-nope-nope"}, "unknown"),
                          ({"X-API-Key": CAROL}, "revoked"), ({"Authorization": f"Basic {ALICE}"}, "required")]:
        status, h, body = post_json(server.url + "/mcp", init, headers)
        assert status == 401, (headers, status)
        assert word in json.loads(body)["error"], body
    status, h, body = get(server.url + "/sse")
    assert status == 401 and "Bearer" in h.get("www-authenticate", "")
    status, _, body = get(server.url + "/sse?api_key=" + CAROL)
    assert status == 401
    status, _, _ = post_json(server.url + "/mcp", init, {"X-API-Key": ALICE})
    assert status == 200


def test_tenants_cannot_touch_each_other(server):
    async def go():
        async with client(server, ALICE) as a, client(server, BOB) as b:
            sid = (await ok(a, "create_sandbox", name="alice's"))["sandbox_id"]
            made = await ok(a, "execute_python_code", sandbox_id=sid, code="open('secret.txt','w').write('alice-data')\nprint('ok')")
            snap = (await ok(a, "snapshot_sandbox", sandbox_id=sid))["snapshot_id"]
            [link] = made["file_links"]
            assert "token=" in link and ALICE not in link

            assert (await ok(b, "list_sandboxes"))["sandboxes"] == []
            unknown = await b.call_tool("execute_python_code", {"sandbox_id": "00000000-0000-4000-8000-000000000000", "code": "1"})
            for tool, args in [
                ("execute_python_code", {"code": "print(open('secret.txt').read())"}),
                ("execute_terminal_command", {"command": "cat secret.txt"}),
                ("install_package_in_sandbox", {"package_name": "six"}),
                ("check_package_installation_status", {"package_name": "six"}),
                ("upload_file_to_sandbox", {"local_file_path": str(server.uploads / "x")}),
                ("list_files", {}),
                ("read_file", {"path": "secret.txt"}),
                ("write_file", {"path": "secret.txt", "content": "bob was here"}),
                ("reset_python", {}),
                ("snapshot_sandbox", {}),
                ("list_snapshots", {}),
                ("restore_snapshot", {"snapshot_id": snap}),
                ("delete_snapshot", {"snapshot_id": snap}),
                ("fork_sandbox", {}),
                ("fork_sandbox", {"snapshot_id": snap}),
                ("delete_sandbox", {}),
            ]:
                r = await b.call_tool(tool, {"sandbox_id": sid, **args})
                assert r.is_error, tool
                # A foreign id reads exactly like an id that does not exist.
                assert r.content[0].text.replace(sid, "ID") == unknown.content[0].text.replace("00000000-0000-4000-8000-000000000000", "ID"), tool
                assert "alice-data" not in r.content[0].text

            # Artifacts: the token opens this one file, for a short time.
            path = urllib.parse.urlsplit(link).path
            token = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["token"][0]
            status, _, body = get(link)
            assert (status, body) == (200, b"alice-data")
            assert get(server.url + path)[0] == 401, "no token, no key"
            assert get(server.url + path, {"Authorization": f"Bearer {BOB}"})[0] == 404, "bob's key is not alice's"
            assert get(server.url + path, {"Authorization": f"Bearer {ALICE}"})[0] == 200, "the owner's key works too"
            expiry, sig = token.split(".")
            for forged in [f"{int(expiry) + 3600}.{sig}", f"{expiry}.{sig[:-2]}AA", "garbage"]:
                assert get(f"{server.url}{path}?token={forged}")[0] == 403, forged
            other = path.replace("secret.txt", "other.txt")
            await ok(a, "execute_python_code", sandbox_id=sid, code="open('other.txt','w').write('o')")
            assert get(f"{server.url}{other}?token={token}")[0] == 403, "a token is bound to its path"
            time.sleep(4.5)
            assert get(link)[0] == 403, "links expire"
            assert (await ok(b, "list_sandboxes"))["sandboxes"] == [], "bob forked nothing"
            assert [s["sandbox_id"] for s in (await ok(a, "list_sandboxes"))["sandboxes"]] == [sid], "alice is unaffected"
            assert (await ok(a, "read_file", sandbox_id=sid, path="secret.txt"))["content"] == "alice-data"
            assert [s["snapshot_id"] for s in (await ok(a, "list_snapshots", sandbox_id=sid))["snapshots"]] == [snap]
            await ok(a, "delete_sandbox", sandbox_id=sid)

    asyncio.run(go())


def test_sse_sessions_belong_to_their_key(server):
    session = {}
    ping = {"jsonrpc": "2.0", "id": 99, "method": "ping"}

    async def go():
        # The key in the URL, as clients that cannot set headers pass it.
        transport = sse_client(f"{server.url}/sse?api_key={ALICE}", on_session_created=lambda s: session.update(id=s))
        async with Client(transport, mode="legacy") as a:
            sid = (await ok(a, "create_sandbox"))["sandbox_id"]
            assert (await ok(a, "execute_python_code", sandbox_id=sid, code="print(2)"))["stdout"] == "2\n"
            url = f"{server.url}/messages?sessionId={session['id']}"
            assert post_json(url, ping, {"X-API-Key": BOB})[0] == 404, "bob cannot post into alice's session"
            assert post_json(url, ping, {"X-API-Key": "wrong-wrong-wrong"})[0] == 401
            assert post_json(url, ping)[0] == 202, "the session id from the authenticated stream suffices"
            async with client(server, BOB, "/sse") as b:
                assert (await ok(b, "list_sandboxes"))["sandboxes"] == []
            await ok(a, "delete_sandbox", sandbox_id=sid)

    asyncio.run(go())


def test_paths_and_arguments_do_not_escape(server):
    marker = server.root / "host-marker"

    async def go():
        async with client(server, ALICE) as a:
            sid = (await ok(a, "create_sandbox"))["sandbox_id"]
            for local in ["/etc/passwd", str(server.uploads / ".." / "state" / "records.redb"), str(server.root / "state" / "link-secret")]:
                r = await a.call_tool("upload_file_to_sandbox", {"sandbox_id": sid, "local_file_path": local})
                assert r.is_error, local
            (server.uploads / "f.txt").write_text("f")
            (server.uploads / "evil").symlink_to("/etc/passwd")
            r = await a.call_tool("upload_file_to_sandbox", {"sandbox_id": sid, "local_file_path": str(server.uploads / "evil")})
            assert r.is_error, "a symlink out of the allowed folder"
            for dest in ["/etc", "/app/results/../../etc", "/app/.venv/bin", "relative"]:
                r = await a.call_tool("upload_file_to_sandbox", {"sandbox_id": sid, "local_file_path": str(server.uploads / "f.txt"), "dest_path": dest})
                assert r.is_error, dest

            for pkg in ["--index-url http://127.0.0.1:1/simple six", "-r /etc/passwd", f"six; touch {marker}", "six && id", "$(touch x)"]:
                r = await a.call_tool("install_package_in_sandbox", {"sandbox_id": sid, "package_name": pkg})
                assert r.is_error and "package" in r.content[0].text, pkg
            # A command runs inside the sandbox, as its user, and nowhere else.
            out = await ok(a, "execute_terminal_command", sandbox_id=sid, command=f"id -u; touch {marker} 2>&1; ls /var/run/docker.sock 2>&1; echo done")
            assert out["stdout"].splitlines()[0] == "1000" and out["stdout"].endswith("done\n")
            assert not marker.exists(), "the command reached the host"
            assert "No such file" in out["stdout"], "the Docker socket never enters a sandbox"

            # Symlinks the sandbox plants do not lead the server out.
            await ok(a, "execute_terminal_command", sandbox_id=sid, command="ln -s /etc/passwd p && ln -s / r")
            made = await ok(a, "execute_python_code", sandbox_id=sid, code="open('real.txt','w').write('r')")
            token_link = made["file_links"][0]
            base = token_link.split("/real.txt")[0]
            for bad in ["p", "r/etc/passwd", "..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd", "%252e%252e%252fetc"]:
                status, _, body = get(f"{base}/{bad}", {"Authorization": f"Bearer {ALICE}"})
                assert status in (400, 403, 404) and b"root:" not in body, (bad, status)
            await ok(a, "delete_sandbox", sandbox_id=sid)

    asyncio.run(go())


def rate_limited(server):
    """Requests refused by a rate limit so far, from /metrics."""
    status, _, body = get(server.url + "/metrics", {"Authorization": f"Bearer {OPS}"})
    assert status == 200
    line = next(l for l in body.decode().splitlines() if l.startswith("mcp_sandbox_rate_limited_total "))
    return int(line.split()[1])


def test_quota_and_flood_limits_leave_others_served(server):
    def containers():
        return len(docker("ps", "-aq", "--filter", f"label=io.mcp-sandbox.server={server.server_id}").split())

    async def go():
        async with client(server, ALICE) as a:
            ids = [(await ok(a, "create_sandbox"))["sandbox_id"] for _ in range(2)]
            before = containers()
            r = await a.call_tool("create_sandbox", {})
            assert r.is_error and "delete_sandbox" in r.content[0].text, r.content[0].text
            assert containers() == before, "nothing was created past the quota"

            # One key floods: it gets 429 with Retry-After; others go on.
            rejected_before = rate_limited(server)
            statuses = []
            for _ in range(15):
                status, headers, _ = post_json(server.url + "/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"X-API-Key": FLOOD})
                statuses.append(status)
                if status == 429:
                    assert int(headers["retry-after"]) >= 1
            assert 429 in statuses, statuses
            assert rate_limited(server) - rejected_before == statuses.count(429)
            assert (await ok(a, "execute_python_code", sandbox_id=ids[0], code="print('still served')"))["stdout"] == "still served\n"
            for sid in ids:
                await ok(a, "delete_sandbox", sandbox_id=sid)
        assert get(server.url + "/health")[0] == 200

    asyncio.run(go())
