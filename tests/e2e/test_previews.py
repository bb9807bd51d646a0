"""Background processes and preview links through the real server, Docker,
the MCP SDK, plain HTTP clients and headless Chromium.

An app started with start_process (the standard library's http.server, and
a small asyncio app that serves a page and a WebSocket echo) answers through
its expose_port link on the preview port: in a plain HTTP client (the link's
token traded for a cookie of the preview's origin) and in Chromium (the
page's script opens a WebSocket through the link and reads its echo); the
same from a sandbox of a key whose network is `none`, which still cannot
open a socket out. A token for another port, another sandbox or another
tenant's sandbox is refused, as is an expired one; the server's own cookies
never reach the app; stop_process ends the app and its link answers 502
with a reason. Output is paged and followed, and its cap drops the oldest;
the caps on processes, exposed ports, preview connections and request size
are crossed. A domain-mode server serves each preview under a host name of
its own. Processes that ended with a restart say so."""

import asyncio
import base64
import concurrent.futures
import hashlib
import hmac
import http.client
import json
import socket
import time
import urllib.parse

import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import Server, api, new_key
from harness import call as ok

KEYS = {name: new_key(name) for name in ("alice", "bob", "carol")}
EGRESS = {"carol": "none"}

# A page whose script opens a WebSocket next to itself and shows the echo in
# its title; `/headers` answers with what reached the app; stdlib only.
APP = r'''
import asyncio, base64, hashlib, json, sys
PAGE = b"""<!doctype html><title>waiting</title><script>
const u = new URL("ws", location.href); u.protocol = u.protocol.replace("http", "ws");
const ws = new WebSocket(u); ws.onopen = () => ws.send("hello from the page");
ws.onmessage = (e) => { document.title = "echo: " + e.data; };
ws.onerror = () => { document.title = "ws error"; };
</script>"""
CONNECTIONS = 0
async def handle(r, w):
    global CONNECTIONS
    CONNECTIONS += 1
    try:
        while True:
            head = await r.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            method, path, _ = lines[0].split(" ")
            h = {k.lower(): v for k, v in (l.split(": ", 1) for l in lines[1:] if ": " in l)}
            n = int(h.get("content-length", 0))
            body = await r.readexactly(n) if n else b""
            if h.get("upgrade", "").lower() == "websocket":
                acc = base64.b64encode(hashlib.sha1((h["sec-websocket-key"] + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
                w.write(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {acc}\r\n\r\n".encode())
                await w.drain()
                while True:
                    b1, b2 = await r.readexactly(2)
                    op, ln = b1 & 15, b2 & 127
                    if ln == 126:
                        ln = int.from_bytes(await r.readexactly(2), "big")
                    mask = await r.readexactly(4) if b2 & 128 else b"\0\0\0\0"
                    data = bytes(c ^ mask[i % 4] for i, c in enumerate(await r.readexactly(ln)))
                    if op == 8:
                        w.close()
                        return
                    size = bytes([len(data)]) if len(data) < 126 else bytes([126]) + len(data).to_bytes(2, "big")
                    w.write(bytes([0x80 | op]) + size + data)
                    await w.drain()
            if path.startswith("/connections"):
                out, kind = json.dumps({"connections": CONNECTIONS}).encode(), b"application/json"
            elif path.startswith("/headers"):
                out, kind = json.dumps({"path": path, "headers": h, "body": len(body)}).encode(), b"application/json"
            else:
                out, kind = PAGE, b"text/html"
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: " + kind + b"\r\nContent-Length: " + str(len(out)).encode() + b"\r\n\r\n" + out)
            await w.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        w.close()
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("listening on", sys.argv[1], flush=True)
    async with server:
        await server.serve_forever()
asyncio.run(main())
'''


@pytest.fixture(scope="module")
def server():
    keys = ", ".join(
        f'{{name = "{n}", key_sha256 = "{sha}"' + (f', egress = "{EGRESS[n]}"' if n in EGRESS else "") + "}"
        for n, (_, sha) in KEYS.items()
    )
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f"[{keys}]",
        MCP_SANDBOX_SERVER_PREVIEW_PORT=str(free_port()),
        MCP_SANDBOX_PROCESSES_MAX_PER_SANDBOX="3",
        MCP_SANDBOX_PROCESSES_MAX_EXPOSED_PORTS="2",
        MCP_SANDBOX_PROCESSES_OUTPUT_KEPT_KB="64",
        MCP_SANDBOX_PREVIEW_MAX_CONNECTIONS_PER_SANDBOX="3",
        MCP_SANDBOX_PREVIEW_MAX_REQUEST_MB="1",
    ).start()
    yield s
    s.cleanup()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def client(server, who):
    headers = {"Authorization": f"Bearer {KEYS[who][0]}"}
    return Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))


def run(coro):
    """Runs `coro` on an event loop of its own thread: Playwright's sync API
    holds one in this thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def in_chromium(browser, url):
    """The title the page at `url` shows once its WebSocket echoed."""
    page = browser.new_page()
    try:
        page.goto(url)
        page.wait_for_function("document.title.startsWith('echo')", timeout=20000)
        return page.title()
    finally:
        page.close()


async def refused(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert r.is_error, (tool, r.structured_content)
    return r.content[0].text


def request(url, method="GET", headers=None, body=None):
    """(status, headers, body) of one request, no redirect followed."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    path = u.path + (f"?{u.query}" if u.query else "")
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def open_link(url, path="", headers=None):
    """Opens a link as a browser does: the token traded for the cookie,
    then `path` (relative to the preview) fetched with it."""
    status, h, _ = request(url)
    assert status == 303, (status, h)
    cookie = h["set-cookie"].split(";")[0]
    assert "HttpOnly" in h["set-cookie"] and "mcp_preview_token" not in h["location"]
    base = urllib.parse.urljoin(url, h["location"])
    extra = dict(headers or {})
    cookies = "; ".join(c for c in (cookie, extra.pop("Cookie", None)) if c)
    return request(urllib.parse.urljoin(base, path), headers={"Cookie": cookies, **extra})


async def start_app(c, sid, port=8000):
    await ok(c, "write_file", sandbox_id=sid, path="app.py", content=APP)
    started = await ok(c, "start_process", sandbox_id=sid, command=f"python app.py {port}", name="app")
    assert started["process"]["state"] == "running", started
    pid = started["process"]["process_id"]
    # On a busy machine the app may speak after its first second: follow it.
    seen, offset, deadline = started["output"], started["next_offset"], time.monotonic() + 60
    while f"listening on {port}" not in seen:
        assert time.monotonic() < deadline, seen
        more = await ok(c, "read_process_output", sandbox_id=sid, process_id=pid, offset=offset, wait_seconds=5)
        seen, offset = seen + more["output"], more["next_offset"]
    return pid


def websocket(url_or_host, path, token=None):
    """A WebSocket handshake over a raw socket: (socket, status line)."""
    host, port = url_or_host
    s = socket.create_connection((host, port), timeout=10)
    q = f"?mcp_preview_token={token}" if token else ""
    s.sendall(
        f"GET {path}{q} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        if not chunk:
            break
        head += chunk
    return s, head.split(b"\r\n")[0].decode()


def ws_echo(s, text):
    data = text.encode()
    s.sendall(bytes([0x81, 0x80 | len(data)]) + b"\0\0\0\0" + data)
    got = b""
    while len(got) < 2 + len(data):
        got += s.recv(4096)
    return got[2:].decode()


def token_of(url):
    return urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["mcp_preview_token"][0]


def link_parts(url):
    u = urllib.parse.urlsplit(url)
    return (u.hostname, u.port), u.path


def test_an_app_answers_through_its_link_in_a_plain_client_and_in_chromium(server, browser):
    async def start():
        async with client(server, "alice") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            pid = await start_app(c, sid)
            listed = (await ok(c, "list_processes", sandbox_id=sid))["processes"]
            assert [(p["process_id"], p["state"], p["name"]) for p in listed] == [(pid, "running", "app")]
            link = await ok(c, "expose_port", sandbox_id=sid, port=8000)
            assert link["exposed_ports"] == [8000] and link["url"].startswith("http://127.0.0.1:")
            return sid, pid, link["url"]

    sid, pid, link = run(start())
    # The page, and what reached the app: no server cookie, no token.
    status, _, body = open_link(link)
    assert status == 200 and b"new WebSocket" in body
    status, _, body = open_link(link, "headers?x=1", headers={"Cookie": "mcp_sandbox_key=secret-key; app=kept"})
    seen = json.loads(body)
    assert status == 200 and seen["path"] == "/headers?x=1", seen
    assert seen["headers"].get("cookie") == "app=kept", seen
    assert "secret-key" not in body.decode() and "mcp_preview" not in body.decode()
    assert seen["headers"]["x-forwarded-prefix"].startswith("/p8000-")
    # A WebSocket through the link, from a plain client.
    where, path = link_parts(link)
    s, line = websocket(where, path + "ws", token_of(link))
    assert "101" in line, line
    assert ws_echo(s, "ping") == "ping"
    s.close()
    # Chromium: the page's own script opens the WebSocket.
    assert in_chromium(browser, link) == "echo: hello from the page"

    async def finish():
        async with client(server, "alice") as c:
            # python -m http.server as a second app, on another port.
            await ok(c, "write_file", sandbox_id=sid, path="site/index.html", content="<h1>static site</h1>")
            await ok(c, "start_process", sandbox_id=sid, command="python -m http.server 8001", cwd="/app/results/site")
            second = (await ok(c, "expose_port", sandbox_id=sid, port=8001))["url"]
            for _ in range(50):
                status, _, body = open_link(second)
                if status == 200:
                    break
                await asyncio.sleep(0.2)
            assert status == 200 and b"static site" in body
            # Stopped: the link answers 502 and says why.
            stopped = await ok(c, "stop_process", sandbox_id=sid, process_id=pid)
            assert stopped["process"]["state"] == "exited", stopped
            status, _, body = open_link(link)
            assert status == 502 and b"Nothing answers on port 8000" in body, body
            # Unexposed: the link opens nothing, even with its token.
            await ok(c, "unexpose_port", sandbox_id=sid, port=8001)
            status, _, body = open_link(second)
            assert status == 404 and b"not exposed" in body, body
            await ok(c, "delete_sandbox", sandbox_id=sid)
            status, _, body = open_link(link)
            assert status == 404 and b"no longer exists" in body, body

    run(finish())


def test_requests_reuse_kept_connections_that_never_outlive_the_exposure(server):
    async def start():
        async with client(server, "alice") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            await start_app(c, sid)
            return sid, (await ok(c, "expose_port", sandbox_id=sid, port=8000))["url"]

    sid, link = run(start())
    status, h, _ = request(link)
    assert status == 303, h
    base = urllib.parse.urljoin(link, h["location"])
    cookie = {"Cookie": h["set-cookie"].split(";")[0]}
    for i in range(20):
        status, _, body = request(urllib.parse.urljoin(base, f"headers?n={i}"), headers=cookie)
        assert status == 200 and json.loads(body)["path"] == f"/headers?n={i}", body
    status, _, body = request(urllib.parse.urljoin(base, "connections"), headers=cookie)
    # One after another, the requests share a connection or two to the app.
    assert status == 200 and json.loads(body)["connections"] <= 3, body

    async def unexpose():
        async with client(server, "alice") as c:
            await ok(c, "unexpose_port", sandbox_id=sid, port=8000)

    run(unexpose())
    # A kept connection carries nothing past the exposure.
    status, _, body = request(urllib.parse.urljoin(base, "headers"), headers=cookie)
    assert status == 404 and b"not exposed" in body, body

    async def finish():
        async with client(server, "alice") as c:
            await ok(c, "delete_sandbox", sandbox_id=sid)

    run(finish())


def test_tokens_open_only_their_own_sandbox_and_port_and_expire(server):
    async def go():
        async with client(server, "alice") as a, client(server, "bob") as b:
            mine = (await ok(a, "create_sandbox"))["sandbox_id"]
            theirs = (await ok(b, "create_sandbox"))["sandbox_id"]
            await start_app(a, mine)
            await start_app(b, theirs)
            link = (await ok(a, "expose_port", sandbox_id=mine, port=8000))["url"]
            other_port = (await ok(a, "expose_port", sandbox_id=mine, port=8001))["url"]
            bobs = (await ok(b, "expose_port", sandbox_id=theirs, port=8000))["url"]
            # Bob cannot expose, stop or list alice's sandbox.
            assert "not found" in (await refused(b, "expose_port", sandbox_id=mine, port=8000)).lower()
            assert "not found" in (await refused(b, "list_processes", sandbox_id=mine)).lower()
            token = token_of(link)
            swapped = [
                other_port.split("?")[0] + f"?mcp_preview_token={token}",  # another port
                bobs.split("?")[0] + f"?mcp_preview_token={token}",  # another tenant's sandbox
            ]
            for url in swapped:
                status, _, body = request(url)
                assert status == 403 and b"not for this sandbox and port" in body, (url, body)
            status, _, body = request(link.split("?")[0])
            assert status == 401, body
            # An expired token, signed with the server's own preview key.
            secret = (server.root / "state" / "link-secret").read_bytes()
            key = hmac.new(secret, b"preview links v1", hashlib.sha256).digest()
            expiry = int(time.time()) - 5
            mac = hmac.new(key, f"{mine}\npreview:8000\n{expiry}".encode(), hashlib.sha256).digest()
            expired = f"{expiry}.{base64.urlsafe_b64encode(mac).decode().rstrip('=')}"
            status, _, body = request(link.split("?")[0] + f"?mcp_preview_token={expired}")
            assert status == 403 and b"expired" in body, body
            # The real one works; a forged cookie does not.
            assert open_link(link)[0] == 200
            status, _, _ = request(link.split("?")[0], headers={"Cookie": f"mcp_preview={expired}"})
            assert status == 401
            for c, sid in ((a, mine), (b, theirs)):
                await ok(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_a_sandbox_without_network_serves_its_link_and_still_reaches_nothing(server):
    probe = (
        "import socket\n"
        "for where in [('1.1.1.1', 80), ('172.17.0.1', %d)]:\n"
        "    try:\n"
        "        socket.create_connection(where, timeout=3).close(); print('reached', where)\n"
        "    except OSError as e:\n"
        "        print('blocked', type(e).__name__)\n"
    ) % server.port

    async def go():
        async with client(server, "carol") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            await start_app(c, sid)
            link = (await ok(c, "expose_port", sandbox_id=sid, port=8000))["url"]
            status, _, body = open_link(link)
            assert status == 200 and b"new WebSocket" in body
            out = (await ok(c, "execute_python_code", sandbox_id=sid, code=probe))["stdout"]
            assert "reached" not in out and out.count("blocked") == 2, out
            await ok(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_output_is_paged_followed_and_capped(server):
    async def go():
        async with client(server, "alice") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            slow = await ok(
                c,
                "start_process",
                sandbox_id=sid,
                command="echo first; echo oops >&2; sleep 2; echo second; read line; echo got $line; exit 3",
                env={"GREETING": "hi"},
            )
            pid = slow["process"]["process_id"]
            assert slow["output"] == "first\noops\n" and slow["next_offset"] == 11, slow
            # Following: the read waits for the next line instead of answering empty.
            started = time.monotonic()
            more = await ok(c, "read_process_output", sandbox_id=sid, process_id=pid, offset=11, wait_seconds=8)
            assert more["output"] == "second\n" and time.monotonic() - started < 8, more
            sent = await ok(c, "send_process_input", sandbox_id=sid, process_id=pid, text="abc\n")
            assert sent["written"] == 4
            end = await ok(c, "read_process_output", sandbox_id=sid, process_id=pid, offset=18, wait_seconds=8)
            assert end["output"] == "got abc\n" and end["process"]["state"] == "exited", end
            assert end["process"]["exit_code"] == 3
            # Paging in small windows.
            window = await ok(c, "read_process_output", sandbox_id=sid, process_id=pid, offset=0, max_bytes=6)
            assert window["output"] == "first\n" and window["next_offset"] == 6
            # 200 KB into a 64 KiB cap: the oldest is dropped, and said so.
            big = await ok(c, "start_process", sandbox_id=sid, command="python -c \"print('x' * 200000)\"")
            bid = big["process"]["process_id"]
            for _ in range(50):
                r = await ok(c, "read_process_output", sandbox_id=sid, process_id=bid, offset=0, max_bytes=262144)
                if r["process"]["state"] == "exited":
                    break
            assert r["skipped"] > 100000 and r["offset"] == r["skipped"], {k: r[k] for k in ("offset", "skipped")}
            assert r["next_offset"] == 200001 and "no longer kept" in r["message"]
            # Bad input is refused with what is wrong.
            assert "process id" in await refused(c, "read_process_output", sandbox_id=sid, process_id="../x")
            assert "wait_seconds" in await refused(
                c, "read_process_output", sandbox_id=sid, process_id=pid, wait_seconds=99
            )
            assert "no process" in await refused(
                c, "stop_process", sandbox_id=sid, process_id="0123456789ab"
            )
            assert "env" in await refused(c, "start_process", sandbox_id=sid, command="true", env={"A=B": "1"})
            # A restart ends them, and the list says so.
            await ok(c, "start_process", sandbox_id=sid, command="sleep 600")
            status, _ = api(server, "POST", f"/api/sandboxes/{sid}/restart", KEYS["alice"][0])
            assert status == 200
            after = (await ok(c, "list_processes", sandbox_id=sid))["processes"]
            assert after and all(p["state"] == "exited" for p in after), after
            assert any("ended with its container" in (p.get("note") or "") for p in after), after
            await ok(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_the_caps_on_processes_ports_connections_and_requests(server):
    async def go():
        async with client(server, "alice") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            await start_app(c, sid)
            for _ in range(2):
                await ok(c, "start_process", sandbox_id=sid, command="sleep 600")
            text = await refused(c, "start_process", sandbox_id=sid, command="sleep 600")
            assert "already runs 3 processes" in text, text
            link = (await ok(c, "expose_port", sandbox_id=sid, port=8000))["url"]
            await ok(c, "expose_port", sandbox_id=sid, port=8001)
            text = await refused(c, "expose_port", sandbox_id=sid, port=8002)
            assert "already exposes 2 ports" in text, text
            # Three WebSockets held open: a fourth connection is refused.
            where, path = link_parts(link)
            token = token_of(link)
            held = [websocket(where, path + "ws", token) for _ in range(3)]
            assert all("101" in line for _, line in held), held
            s, line = websocket(where, path + "ws", token)
            assert "429" in line, line
            s.close()
            for s, _ in held:
                s.close()
            time.sleep(0.5)
            # A request body over preview.max_request_mb.
            big = b"x" * (2 * 1024 * 1024)
            status, _, body = request(link, method="POST", body=big, headers={"Content-Type": "text/plain"})
            assert status == 413, (status, body)
            await ok(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_a_preview_domain_gives_each_sandbox_and_port_a_host_of_its_own(browser):
    # A server on loopback serves previews under `localhost` by default.
    s = Server().start()
    try:

        async def start():
            async with Client(s.url + "/mcp") as c:
                sid = (await ok(c, "create_sandbox"))["sandbox_id"]
                await start_app(c, sid)
                return sid, (await ok(c, "expose_port", sandbox_id=sid, port=8000))["url"]

        sid, link = run(start())
        host = urllib.parse.urlsplit(link).hostname
        assert host == f"p8000-{sid}.localhost" and urllib.parse.urlsplit(link).port == s.port, link
        # A plain client, by Host header; the server's own routes are not
        # served under that host.
        via = f"http://127.0.0.1:{s.port}/?mcp_preview_token={token_of(link)}"
        status, h, _ = request(via, headers={"Host": f"{host}:{s.port}"})
        assert status == 303 and h["location"] == "/", h
        # The redirect never leaves the preview's origin.
        for sneaky in ("//evil.example/", "/\\evil.example/"):
            status, h2, _ = request(
                f"http://127.0.0.1:{s.port}{sneaky}?mcp_preview_token={token_of(link)}",
                headers={"Host": f"{host}:{s.port}"},
            )
            assert status == 303 and h2["location"] == "/evil.example/", h2
        cookie = h["set-cookie"].split(";")[0]
        status, _, body = request(
            f"http://127.0.0.1:{s.port}/api/sandboxes", headers={"Host": f"{host}:{s.port}", "Cookie": cookie}
        )
        assert status == 200 and b"new WebSocket" in body, body
        # Chromium resolves *.localhost itself.
        assert in_chromium(browser, link) == "echo: hello from the page"
    finally:
        s.cleanup()


def test_the_web_ui_starts_stops_and_links_processes(server, browser):
    async def start():
        async with client(server, "alice") as c:
            sid = (await ok(c, "create_sandbox"))["sandbox_id"]
            await ok(c, "write_file", sandbox_id=sid, path="app.py", content=APP)
            return sid

    sid = run(start())
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/ui")
    page.fill("#key", KEYS["alice"][0])
    page.click("#sign-in button[type=submit]")
    page.goto(f"{server.url}/ui/sandboxes/{sid}")
    # The app speaks only after its first second: the page follows its output.
    page.fill("#process-command", "sleep 2; python app.py 8000")
    page.click("#process-form button[type=submit]")
    page.locator("#process-output", has_text="listening on 8000").wait_for()
    row = page.locator("#processes tbody tr").first
    row.locator("text=running").wait_for()
    page.fill("#expose-port", "8000")
    page.click("#expose-form button[type=submit]")
    page.locator('#ports li[data-port="8000"]').wait_for()
    # The port opens in a new tab, through a fresh link, on the preview's origin.
    with context.expect_page() as opened:
        page.locator('#ports button[data-action="open"]').click()
    preview = opened.value
    preview.wait_for_function("document.title.startsWith('echo')", timeout=20000)
    assert preview.url.startswith(f"http://127.0.0.1:{server.env['MCP_SANDBOX_SERVER_PREVIEW_PORT']}/p8000-")
    preview.close()
    row.locator('button[data-action="output"]').click()
    page.locator("#process-output", has_text="listening").wait_for()
    row.locator('button[data-action="stop"]').click()
    page.locator("#processes tbody tr").first.locator("text=exited").wait_for()
    page.locator('#ports button[data-action="unexpose"]').click()
    page.locator("#ports li").wait_for(state="detached")
    context.close()

    async def finish():
        async with client(server, "alice") as c:
            await ok(c, "delete_sandbox", sandbox_id=sid)

    run(finish())
