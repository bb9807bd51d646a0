"""Sandboxes that sleep on disk, through the real server, Docker and the MCP
SDK.

hibernate_sandbox writes the Python namespace to the sandbox's disk,
removes its container and unmounts its disks: nothing of it stays in the
engine or the host's mount table. The next call wakes it with its
variables, functions, imports, files (byte for byte, deleted ones still
deleted) and installed packages, and says so in its notice; calls sent
during the wake keep their order. What does not pickle (a socket) wakes as
`partial`, named. A server killed and started again wakes it the same way.
The Python copies its snapshots parked in memory are written to disk with
the sleep: restored after the wake, or forked, they bring Python back.
An idle sandbox sleeps by itself after `sandbox.hibernate_after_seconds`.
A sleeping sandbox left alone keeps no actor in the server (it is counted
dormant in /metrics) and its next calls wake it the same way, in order.
Another tenant can neither wake, list, hibernate nor delete it, and its
deletion leaves nothing on the host."""

import asyncio
import http.client
import os
import time
import urllib.parse

from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import Server, docker, get, in_sandbox, new_key
from harness import call as ok

KEYS = {name: new_key(name) for name in ("alice", "bob")}

BLOB = os.urandom(300_000)


def server(**env):
    keys = ", ".join(f'{{name = "{n}", key_sha256 = "{sha}"}}' for n, (_, sha) in KEYS.items())
    return Server(MCP_SANDBOX_AUTH_ENABLED="true", MCP_SANDBOX_AUTH_KEYS=f"[{keys}]", **env)


def client(s, who):
    headers = {"Authorization": f"Bearer {KEYS[who][0]}"}
    return Client(streamable_http_client(s.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))


async def refused(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert r.is_error, (tool, r.structured_content)
    return r.content[0].text


def host_traces(s, sid):
    """What of the sandbox the engine and the host's mount table hold."""
    containers = docker("ps", "-aq", "--filter", f"label=io.mcp-sandbox.sandbox={sid}").split()
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f if sid in line.split(" ")[4]]
    return containers, mounts


def preview(s, link):
    """(status, body) of a preview link's page, as a browser gets it: the
    token traded for the cookie, then the page with it."""
    u = urllib.parse.urlsplit(link)
    host = {"Host": f"{u.hostname}:{u.port}"}
    c = http.client.HTTPConnection("127.0.0.1", u.port, timeout=30)
    c.request("GET", f"{u.path}?{u.query}", headers=host)
    r = c.getresponse()
    r.read()
    assert r.status == 303, r.status
    cookie = r.getheader("set-cookie").split(";")[0]
    c.request("GET", r.getheader("location"), headers={**host, "Cookie": cookie})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body


async def status_of(c, sid):
    listed = (await ok(c, "list_sandboxes"))["sandboxes"]
    return next((s["status"] for s in listed if s["sandbox_id"] == sid), None)


def test_a_hibernated_sandbox_wakes_with_its_state_after_a_server_restart():
    s = server().start()
    try:

        async def before():
            async with client(s, "alice") as c:
                sid = (await ok(c, "create_sandbox"))["sandbox_id"]
                await ok(c, "install_package_in_sandbox", sandbox_id=sid, package_name="six")
                for _ in range(120):
                    st = await ok(c, "check_package_installation_status", sandbox_id=sid, package_name="six")
                    if st["status"] != "installing":
                        break
                    await asyncio.sleep(1)
                assert st["status"] == "success", st
                code = (
                    "import json, socket, six\n"
                    "x = 41\n"
                    "def f(): return x + 1\n"
                    "class Point:\n    def __init__(self, a): self.a = a\n"
                    "p = Point(7)\n"
                    f"open('blob.bin', 'wb').write(bytes.fromhex('{BLOB.hex()}'))\n"
                    "open('gone.txt', 'w').write('soon gone')\n"
                )
                await ok(c, "execute_python_code", sandbox_id=sid, code=code)
                # A snapshot's Python copy, parked in memory, is written out
                # with the sleep.
                snap = (await ok(c, "snapshot_sandbox", sandbox_id=sid))["snapshot_id"]
                await ok(c, "execute_python_code", sandbox_id=sid, code="y = 'after the snapshot'")
                await ok(c, "execute_terminal_command", sandbox_id=sid, command="rm /app/results/gone.txt")
                slept = await ok(c, "hibernate_sandbox", sandbox_id=sid)
                assert slept["python"] == "carried" and slept["python_names"] >= 5, slept
                assert slept["snapshots"] == [{"snapshot_id": snap, "python": "carried", "not_carried": []}], slept
                assert await status_of(c, sid) == "hibernated"
                again = await ok(c, "hibernate_sandbox", sandbox_id=sid)
                assert "already" in again["message"], again
                # Another tenant: no wake, no listing, no hibernation, no delete.
                async with client(s, "bob") as b:
                    for tool in ("execute_python_code", "hibernate_sandbox", "delete_sandbox", "list_files"):
                        args = {"code": "x"} if tool == "execute_python_code" else {}
                        text = await refused(b, tool, sandbox_id=sid, **args)
                        assert "not found" in text, text
                    assert sid not in [x["sandbox_id"] for x in (await ok(b, "list_sandboxes"))["sandboxes"]]
                assert await status_of(c, sid) == "hibernated", "bob's calls woke nothing"
                return sid, snap

        sid, snap = asyncio.run(before())
        containers, mounts = host_traces(s, sid)
        assert containers == [] and mounts == [], (containers, mounts)

        # The server is killed and started again: it stays asleep until called.
        s.kill()
        s.start()
        assert host_traces(s, sid) == ([], [])

        async def after():
            async with client(s, "alice") as c:
                assert await status_of(c, sid) == "hibernated"
                ran = await ok(
                    c,
                    "execute_python_code",
                    sandbox_id=sid,
                    code="import six, hashlib, os\nprint(x, f(), p.a, json.dumps([1]), six.PY3, os.path.exists(six.__cached__))\n"
                    "print(hashlib.sha256(open('blob.bin', 'rb').read()).hexdigest(), os.path.exists('gone.txt'))",
                )
                lines = ran["stdout"].splitlines()
                # The modules it had imported were compiled as it slept.
                assert lines[0] == "41 42 7 [1] True True", ran
                import hashlib

                assert lines[1] == f"{hashlib.sha256(BLOB).hexdigest()} False", ran
                assert "woke from hibernation" in ran["notice"] and "Python: carried" in ran["notice"], ran
                assert await status_of(c, sid) == "running"
                listed = (await ok(c, "list_snapshots", sandbox_id=sid))["snapshots"]
                assert [(x["snapshot_id"], x["python"]) for x in listed] == [(snap, "saved")], listed
                # Restored from disk, as often as asked; a fork of it carries it.
                check = "print(x, p.a, 'y' in dir(), os.path.exists('gone.txt'))"
                for _ in range(2):
                    await ok(c, "execute_python_code", sandbox_id=sid, code="x = -1; y = 1")
                    back = await ok(c, "restore_snapshot", sandbox_id=sid, snapshot_id=snap)
                    assert back["python"] == "restored", back
                    ran = await ok(c, "execute_python_code", sandbox_id=sid, code="import os\n" + check)
                    assert ran["stdout"] == "41 7 False True\n", ran
                fork = (await ok(c, "fork_sandbox", sandbox_id=sid, snapshot_id=snap))["forks"][0]["sandbox_id"]
                ran = await ok(c, "execute_python_code", sandbox_id=fork, code="import os\n" + check)
                assert ran["stdout"] == "41 7 False True\n", ran
                await ok(c, "delete_sandbox", sandbox_id=fork)
                await ok(c, "delete_sandbox", sandbox_id=sid)

        asyncio.run(after())
    finally:
        s.cleanup()


def dormant(s):
    """The server's count of sleeping sandboxes held with no actor."""
    body = get(s.url + "/metrics")[2].decode()
    return int(next(l.split()[1] for l in body.splitlines() if l.startswith("mcp_sandbox_sandboxes_dormant ")))


def test_a_sleeping_sandbox_left_alone_keeps_no_actor_and_its_calls_wake_it_in_order():
    s = Server().start()
    try:

        async def scenario(c, sid):
            await ok(c, "execute_python_code", sandbox_id=sid, code="seen = []")
            await ok(c, "hibernate_sandbox", sandbox_id=sid)
            for _ in range(60):
                if dormant(s) == 1:
                    break
                await asyncio.sleep(1)
            assert dormant(s) == 1, "its actor rested"
            assert await status_of(c, sid) == "hibernated"
            assert dormant(s) == 1, "a listing woke nothing"
            # Calls sent during the wake, 0.2 s apart (each its own HTTP
            # request, which under load may overtake one sent 50 ms
            # earlier): one wake, then each in the order sent.
            async def append(i):
                await asyncio.sleep(i * 0.2)
                return await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": f"seen.append({i})"})

            for r in await asyncio.gather(*(append(i) for i in range(5))):
                assert not r.is_error, r.content[0].text
            ran = await ok(c, "execute_python_code", sandbox_id=sid, code="print(seen)")
            assert ran["stdout"] == "[0, 1, 2, 3, 4]\n", ran
            assert dormant(s) == 0
            assert await status_of(c, sid) == "running"

        in_sandbox(s, scenario)
    finally:
        s.cleanup()


def test_what_does_not_pickle_wakes_partial_calls_keep_their_order_and_deletion_leaves_nothing():
    s = server().start()
    try:

        async def go():
            async with client(s, "alice") as c:
                sid = (await ok(c, "create_sandbox"))["sandbox_id"]
                await ok(c, "execute_python_code", sandbox_id=sid, code="import socket\nsock = socket.socket()\nseen = []")
                # A module of the venv (imported, named by no variable)
                # whose bytecode path is a FIFO: the compile at the sleep
                # must not wait on it (the dump's deadline is 60 s).
                plant = (
                    "def plant():\n"
                    "    import os, sys, importlib, importlib.util\n"
                    "    site = next(p for p in sys.path if p.startswith('/app/.venv') and p.endswith('site-packages'))\n"
                    "    open(os.path.join(site, 'planted.py'), 'w').write('X = 1\\n')\n"
                    "    importlib.invalidate_caches()\n"
                    "    pyc = importlib.util.cache_from_source(importlib.import_module('planted').__file__)\n"
                    "    os.makedirs(os.path.dirname(pyc), exist_ok=True)\n"
                    "    os.mkfifo(pyc)\n"
                    "plant()\ndel plant\n"
                )
                await ok(c, "execute_python_code", sandbox_id=sid, code=plant)
                snap = (await ok(c, "snapshot_sandbox", sandbox_id=sid))["snapshot_id"]
                started = time.monotonic()
                slept = await ok(c, "hibernate_sandbox", sandbox_id=sid)
                assert time.monotonic() - started < 30, "the sleep waited on the FIFO"
                assert slept["python"] == "partial", slept
                assert [n["name"] for n in slept["not_carried"]] == ["sock"], slept
                [written] = slept["snapshots"]
                assert (written["snapshot_id"], written["python"]) == (snap, "partial"), slept
                assert [n["name"] for n in written["not_carried"]] == ["sock"], slept
                # A preview link wakes nothing, and says why.
                link = (await ok(c, "expose_port", sandbox_id=sid, port=8000))["url"]
                status, body = preview(s, link)
                assert status == 503 and b"hibernated" in body, (status, body)
                assert await status_of(c, sid) == "hibernated"

                # Sent one after another without waiting: they run in order,
                # after the wake the first one started. 0.2 s apart, so that
                # on a loaded machine each request reaches the server before
                # the next one (they travel on connections of their own),
                # which is the order that the server keeps.
                async def append(i):
                    await asyncio.sleep(i * 0.2)
                    return await ok(c, "execute_python_code", sandbox_id=sid, code=f"seen.append({i})")

                answers = await asyncio.gather(*(append(i) for i in range(4)))
                notices = [a.get("notice") or "" for a in answers]
                assert sum("woke from hibernation" in n for n in notices) == 1, notices
                woke = next(n for n in notices if "woke" in n)
                assert "Python: partial" in woke and "sock" in woke, woke
                ran = await ok(c, "execute_python_code", sandbox_id=sid, code="print(seen, 'sock' in dir())")
                assert ran["stdout"] == "[0, 1, 2, 3] False\n", ran

                await ok(c, "hibernate_sandbox", sandbox_id=sid)
                await ok(c, "delete_sandbox", sandbox_id=sid)
                return sid

        sid = asyncio.run(go())
        assert host_traces(s, sid) == ([], [])
        leftovers = [p for p in s.root.rglob("*") if sid in p.name]
        assert leftovers == [], leftovers
    finally:
        s.cleanup()


def test_an_idle_sandbox_sleeps_by_itself_unless_it_would_lose_state_and_a_file_read_wakes_it():
    s = server(MCP_SANDBOX_SANDBOX_HIBERNATE_AFTER_SECONDS="3", MCP_SANDBOX_SANDBOX_RESULTS_MB="32", MCP_SANDBOX_SANDBOX_RESULTS_INODES="16384").start()
    try:

        async def go():
            async with client(s, "alice") as c:
                sid = (await ok(c, "create_sandbox"))["sandbox_id"]
                await ok(c, "execute_python_code", sandbox_id=sid, code="y = 'still here'\nopen('n.txt','w').write('kept')")
                # One holding a socket would lose it: upkeep leaves it awake.
                holds = (await ok(c, "create_sandbox"))["sandbox_id"]
                await ok(c, "execute_python_code", sandbox_id=holds, code="import socket\nsock = socket.socket()")
                # One whose namespace does not fit its disk is never put to
                # sleep, even when asked: nothing is lost.
                big = (await ok(c, "create_sandbox"))["sandbox_id"]
                await ok(c, "execute_python_code", sandbox_id=big, code="import os\nblob = os.urandom(48 << 20)")
                text = await refused(c, "hibernate_sandbox", sandbox_id=big)
                assert "could not be saved" in text and "nothing was changed" in text, text
                ran = await ok(c, "execute_python_code", sandbox_id=big, code="print(len(blob))")
                assert ran["stdout"] == f"{48 << 20}\n", ran
                deadline = time.time() + 90
                while await status_of(c, sid) != "hibernated":
                    assert time.time() < deadline, "never hibernated"
                    await asyncio.sleep(1)
                assert host_traces(s, sid)[0] == []
                await asyncio.sleep(4)
                assert await status_of(c, holds) != "hibernated"
                assert await status_of(c, big) != "hibernated"
                ran = await ok(c, "execute_python_code", sandbox_id=holds, code="print(type(sock).__name__)")
                assert ran["stdout"] == "socket\n", ran
                read = await ok(c, "read_file", sandbox_id=sid, path="n.txt")
                assert read["content"] == "kept", read
                ran = await ok(c, "execute_python_code", sandbox_id=sid, code="print(y)")
                assert ran["stdout"] == "still here\n", ran
                await ok(c, "delete_sandbox", sandbox_id=sid)

        asyncio.run(go())
    finally:
        s.cleanup()


def test_sleeping_sandboxes_count_against_caps_of_their_own():
    """Live caps count the awake; hibernated ones have caps of their own; a
    wake needs room under the live caps, and one refused leaves the sandbox
    asleep with its state."""
    s = server(
        MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT="2",
        MCP_SANDBOX_LIMITS_MAX_HIBERNATED_PER_TENANT="1",
        MCP_SANDBOX_SANDBOX_HIBERNATE_AFTER_SECONDS="0",
    ).start()
    try:

        async def go():
            async with client(s, "alice") as c:
                a = (await ok(c, "create_sandbox", name="a"))["sandbox_id"]
                b = (await ok(c, "create_sandbox", name="b"))["sandbox_id"]
                assert "2" in await refused(c, "create_sandbox", name="c")
                await ok(c, "execute_python_code", sandbox_id=a, code="kept = 'from a'")
                await ok(c, "hibernate_sandbox", sandbox_id=a)
                # Asleep, it leaves its live place to a new sandbox.
                new = (await ok(c, "create_sandbox", name="c"))["sandbox_id"]
                why = await refused(c, "hibernate_sandbox", sandbox_id=b)
                assert "max_hibernated_per_tenant" in why, why
                assert await status_of(c, b) == "running"
                # No live room: the wake is refused, and a stays asleep with its state.
                why = await refused(c, "execute_python_code", sandbox_id=a, code="print(kept)")
                assert "live sandboxes, your most" in why and "hibernate or delete one" in why, why
                assert await status_of(c, a) == "hibernated"
                await ok(c, "delete_sandbox", sandbox_id=new)
                out = await ok(c, "execute_python_code", sandbox_id=a, code="print(kept)")
                assert out["stdout"] == "from a\n", out
                assert await status_of(c, a) == "running"
                # Awake again, it frees its hibernated place.
                await ok(c, "hibernate_sandbox", sandbox_id=b)
                for sid in (a, b):
                    await ok(c, "delete_sandbox", sandbox_id=sid)

        asyncio.run(go())
    finally:
        s.cleanup()
