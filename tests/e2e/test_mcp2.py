"""End-to-end tests with the Python MCP SDK 2.3.0 against the real server
and the real Docker engine: every transport, the whole workflow, artifacts,
progress, cancellation, output budget and recovery after a server kill."""

import asyncio
import signal
import base64
import hashlib
import urllib.parse

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client

from harness import BINARY, Server, docker, get

TOOLS = {
    "create_sandbox",
    "list_sandboxes",
    "execute_python_code",
    "install_package_in_sandbox",
    "check_package_installation_status",
    "execute_terminal_command",
    "upload_file_to_sandbox",
    "delete_sandbox",
    "list_files",
    "read_file",
    "write_file",
    "reset_python",
    "snapshot_sandbox",
    "restore_snapshot",
    "list_snapshots",
    "delete_snapshot",
    "fork_sandbox",
    "start_process",
    "list_processes",
    "read_process_output",
    "send_process_input",
    "stop_process",
    "expose_port",
    "unexpose_port",
    "hibernate_sandbox",
    "list_templates",
}


def run(coro):
    return asyncio.run(coro)


async def call(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert not r.is_error, r.content[0].text
    return r.structured_content


async def workflow(c, server, tag):
    """create -> install six -> check -> execute importing it -> terminal ->
    upload -> list -> delete, asserting each result."""
    created = await call(c, "create_sandbox", name=f"wf-{tag}")
    sid = created["sandbox_id"]
    assert created["name"] == f"wf-{tag}" and created["status"] == "running"

    inst = await call(c, "install_package_in_sandbox", sandbox_id=sid, package_name="six")
    assert inst["status"] in ("success", "installing"), inst
    checked = await call(c, "check_package_installation_status", sandbox_id=sid, package_name="six")
    assert checked["status"] in ("success", "installing"), checked
    # Runs wait for the install queued before them.
    out = await call(c, "execute_python_code", sandbox_id=sid, code="import six\nprint(six.__name__)")
    assert out["stdout"] == "six\n", out
    checked = await call(c, "check_package_installation_status", sandbox_id=sid, package_name="six")
    assert checked["status"] == "success", checked

    term = await call(c, "execute_terminal_command", sandbox_id=sid, command="echo a | tr a b")
    assert term["stdout"] == "b\n" and term["exit_code"] == 0
    # The tools people reach for in a shell are there.
    tools = await call(c, "execute_terminal_command", sandbox_id=sid,
                       command="curl --version | head -c 5 && ps -o comm= -p $$")
    assert tools["stdout"] == "curl sh\n", tools

    (server.uploads / f"up-{tag}.txt").write_text("uploaded")
    up = await call(c, "upload_file_to_sandbox", sandbox_id=sid, local_file_path=str(server.uploads / f"up-{tag}.txt"))
    assert up["success"] and up["path"] == f"/app/results/up-{tag}.txt"
    out = await call(c, "execute_python_code", sandbox_id=sid, code=f"print(open('up-{tag}.txt').read())")
    assert out["stdout"] == "uploaded\n"

    listed = await c.call_tool("list_sandboxes", {})
    mine = [s for s in listed.structured_content["sandboxes"] if s["sandbox_id"] == sid]
    assert mine and any(p["name"] == "six" for p in mine[0]["installed_packages"]), listed.structured_content
    assert listed.content[0].text.lstrip().startswith("["), "the text item is the bare array"

    deleted = await call(c, "delete_sandbox", sandbox_id=sid)
    assert deleted["success"]
    gone = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": "1"})
    assert gone.is_error and "not found" in gone.content[0].text


def test_tools_are_listed_with_schemas_and_annotations(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert set(tools) == TOOLS
            for t in tools.values():
                assert t.input_schema["type"] == "object" and t.output_schema["type"] == "object", t.name
                assert t.description
            assert tools["list_sandboxes"].annotations.read_only_hint is True
            assert tools["list_files"].annotations.read_only_hint is True
            assert tools["read_file"].annotations.read_only_hint is True
            assert tools["write_file"].annotations.read_only_hint is False
            assert tools["reset_python"].annotations.read_only_hint is False
            assert tools["delete_sandbox"].annotations.destructive_hint is True
            assert tools["list_snapshots"].annotations.read_only_hint is True
            assert tools["snapshot_sandbox"].annotations.destructive_hint is False
            assert tools["restore_snapshot"].annotations.destructive_hint is True
            assert tools["delete_snapshot"].annotations.destructive_hint is True
            fork = tools["fork_sandbox"]
            assert fork.annotations.destructive_hint is False and fork.annotations.idempotent_hint is False
            assert set(fork.input_schema["properties"]) == {"sandbox_id", "count", "snapshot_id"}
            assert fork.input_schema["required"] == ["sandbox_id"]
            assert set(tools["execute_python_code"].input_schema["required"]) == {"sandbox_id", "code"}
            assert set(tools["upload_file_to_sandbox"].input_schema["properties"]) == {"sandbox_id", "local_file_path", "dest_path"}
            assert tools["read_process_output"].annotations.read_only_hint is True
            assert tools["stop_process"].annotations.destructive_hint is True
            assert set(tools["start_process"].input_schema["required"]) == {"sandbox_id", "command"}
            empty = await c.call_tool("list_sandboxes", {})
            assert empty.content[0].text.strip() == "[]" and empty.structured_content == {"sandboxes": []}

    run(go())


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_workflow_streamable_http(server, mode):
    async def go():
        async with Client(server.url + "/mcp", mode=mode) as c:
            if mode == "auto":
                assert c.protocol_version == "2026-07-28"
            await workflow(c, server, mode)

    run(go())


def test_workflow_sse(server):
    async def go():
        async with Client(sse_client(server.url + "/sse"), mode="legacy") as c:
            await workflow(c, server, "sse")

    run(go())


def test_workflow_stdio():
    # A server of its own: two servers never share a state folder.
    server = Server()
    params = StdioServerParameters(command=str(BINARY), args=["stdio"], env=server.env, cwd=str(server.root))

    async def go():
        async with Client(params, mode="legacy") as c:
            await workflow(c, server, "stdio")

    try:
        run(go())
        server.server_id = server.read_server_id()
        assert server.own_objects() == ([], [])
    finally:
        # A failed workflow leaves its sandbox: removed by the server's id.
        server.server_id = server.read_server_id()
        server.cleanup()


def test_artifacts_are_linked_and_served(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            inst = await c.call_tool("install_package_in_sandbox", {"sandbox_id": sid, "package_name": "matplotlib"})
            assert not inst.is_error
            code = (
                "import matplotlib\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.savefig('plot.png')\n"
                "import base64, hashlib\nprint(hashlib.sha256(open('plot.png','rb').read()).hexdigest())"
            )
            out = await call(c, "execute_python_code", sandbox_id=sid, code=code, timeout_seconds=120)
            assert out["exit_code"] == 0, out["stderr"]
            assert out["files"] == ["/app/results/plot.png"]
            [link] = out["file_links"]
            assert link == f"{server.url}/results/{sid}/plot.png"
            status, headers, body = get(link)
            assert status == 200 and headers["content-type"] == "image/png"
            assert body[:8] == b"\x89PNG\r\n\x1a\n"
            assert hashlib.sha256(body).hexdigest() == out["stdout"].strip()

            again = await call(c, "execute_python_code", sandbox_id=sid, code="x = 1")
            assert again["files"] == [] and again["file_links"] == []

            names = ["my plot.png", "图.png", "a#b?c.txt"]
            code = "\n".join(f"open({n!r}, 'wb').write({n!r}.encode())" for n in names)
            r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": code})
            out = r.structured_content
            assert sorted(out["files"]) == sorted(f"/app/results/{n}" for n in names)
            resource_links = [b for b in r.content if b.type == "resource_link"]
            assert len(resource_links) == 3
            for path, link in zip(out["files"], out["file_links"]):
                name = path.rsplit("/", 1)[1]
                assert urllib.parse.unquote(link.rsplit("/", 1)[1]) == name
                status, _, body = get(link)
                assert (status, body) == (200, name.encode())

            for bad in [f"/results/{sid}/nope.png", f"/results/{sid}/..%2f..%2fetc%2fpasswd", f"/results/{sid}/%252e%252e/x"]:
                status, _, body = get(server.url + bad)
                assert status in (400, 404), (bad, status)
                assert b"root:" not in body
            term = await call(c, "execute_terminal_command", sandbox_id=sid, command="ln -s /etc/passwd link && ln -s / rootlink")
            assert term["exit_code"] == 0
            for bad in ["link", "rootlink/etc/passwd"]:
                status, _, body = get(f"{server.url}/results/{sid}/{bad}")
                assert status in (403, 404) and b"root:" not in body, (bad, status)
            await call(c, "delete_sandbox", sandbox_id=sid)
            status, _, _ = get(link)
            assert status == 404

    run(go())


def test_progress_cancellation_and_output_budget(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            seen = []

            async def on_progress(progress, total, message):
                seen.append((progress, message))

            code = "import time\nfor i in range(4):\n    print('tick', i, flush=True)\n    time.sleep(1)"
            r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": code}, progress_callback=on_progress)
            assert r.structured_content["stdout"].count("tick") == 4
            assert len(seen) >= 2, seen
            assert all(b[0] > a[0] for a, b in zip(seen, seen[1:])), "progress increases"
            assert "tick 0" in "".join(m for _, m in seen)

            slow = asyncio.create_task(
                c.call_tool("execute_python_code", {"sandbox_id": sid, "code": "import time\ntime.sleep(60)\nopen('finished','w')"})
            )
            await asyncio.sleep(1.5)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            # Runs are serial: this one runs only after the sleep ended, and the
            # sleep was interrupted rather than finished.
            after = await call(c, "execute_python_code", sandbox_id=sid, code="import os\nprint(os.path.exists('finished'))")
            assert after["stdout"] == "False\n"

            big = await call(c, "execute_python_code", sandbox_id=sid, code="print('x' * (1024 * 1024))")
            assert big["truncated"] and len(big["stdout"]) < 100_000
            [full] = big["output_links"]
            status, _, body = get(full)
            assert status == 200 and len(body) == 1024 * 1024 + 1
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_errors_are_tool_errors_an_llm_can_act_on(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            for args in [
                {"sandbox_id": "00000000-0000-4000-8000-000000000000", "code": "1"},
                {"sandbox_id": "not-a-uuid", "code": "1"},
            ]:
                r = await c.call_tool("execute_python_code", args)
                assert r.is_error
                text = r.content[0].text
                assert "sandbox" in text and ("list_sandboxes" in text or "create_sandbox" in text), text
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            failing = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": "1/0"})
            assert not failing.is_error and failing.structured_content["exit_code"] == 1
            assert "ZeroDivisionError" in failing.structured_content["stderr"]
            bad_pkg = await c.call_tool("install_package_in_sandbox", {"sandbox_id": sid, "package_name": "--index-url http://x six"})
            assert bad_pkg.is_error and "package" in bad_pkg.content[0].text
            outside = await c.call_tool("upload_file_to_sandbox", {"sandbox_id": sid, "local_file_path": "/etc/passwd"})
            assert outside.is_error and "outside" in outside.content[0].text
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_a_slow_sandbox_delays_neither_health_nor_others(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            a = (await call(c, "create_sandbox"))["sandbox_id"]
            b = (await call(c, "create_sandbox"))["sandbox_id"]
            slow = asyncio.create_task(call(c, "execute_python_code", sandbox_id=a, code="import time; time.sleep(5); print('slow')"))
            await asyncio.sleep(0.5)
            fast = await call(c, "execute_python_code", sandbox_id=b, code="print('fast')")
            status, _, _ = await asyncio.to_thread(get, server.url + "/health")
            assert fast["stdout"] == "fast\n" and status == 200
            assert not slow.done(), "the other sandbox answered while the slow run was still going"
            assert (await slow)["stdout"] == "slow\n"
            for sid in (a, b):
                await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_a_killed_server_is_restarted_and_adopts_its_sandboxes():
    server = Server().start()
    try:
        async def create():
            async with Client(server.url + "/mcp") as c:
                sid = (await call(c, "create_sandbox", name="survivor"))["sandbox_id"]
                await call(c, "execute_python_code", sandbox_id=sid, code="x = 'kept'\nopen('f.txt','w').write('file')")
                return sid

        sid = run(create())
        server.kill()
        server.start()

        async def check():
            async with Client(server.url + "/mcp") as c:
                listed = (await call(c, "list_sandboxes"))["sandboxes"]
                assert [s["sandbox_id"] for s in listed] == [sid]
                out = await call(c, "execute_python_code", sandbox_id=sid, code="print(x, open('f.txt').read())")
                assert out["stdout"] == "kept file\n"
                await call(c, "delete_sandbox", sandbox_id=sid)

        run(check())
        assert server.own_objects() == ([], [])
        server.stop()
        networks = docker("network", "ls", "-q", "--filter", f"label=io.mcp-sandbox.server={server.server_id}").split()
        assert networks == [], "a server stopped with no sandboxes removes its network"
    finally:
        server.cleanup()


def test_http_guards(server):
    status, _, _ = get(server.url + "/health", {"Origin": "http://evil.example"})
    assert status == 403
    status, _, _ = get(server.url + "/health", {"Host": "evil.example"})
    assert status == 403
    status, _, body = get(server.url + "/health")
    assert status == 200 and b'"docker":"ok"' in body
    req = __import__("urllib.request").request
    for query, expected in [("", 400), ("?sessionId=nope", 404)]:
        r = req.Request(server.url + "/messages" + query, data=b"{}", method="POST", headers={"Content-Type": "application/json"})
        try:
            req.urlopen(r)
            code = 200
        except __import__("urllib.error").error.HTTPError as e:
            code = e.code
        assert code == expected, (query, code)


def test_a_server_with_open_sse_sessions_stops_on_sigterm():
    server = Server().start()
    try:
        async def hold_session_open_while_stopping():
            async with Client(sse_client(server.url + "/sse"), mode="legacy") as c:
                await ok_list(c)
                server.proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(server.proc.wait, 60)

        try:
            run(hold_session_open_while_stopping())
        except Exception:  # noqa: BLE001 - the stream ends under the client; either outcome is fine
            pass
        assert server.proc.returncode == 0, "stopped cleanly rather than killed"
        assert server.own_objects() == ([], [])
    finally:
        server.cleanup()


async def ok_list(c):
    r = await c.call_tool("list_sandboxes", {})
    assert not r.is_error
