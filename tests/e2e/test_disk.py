"""Disk quotas and host guards through the real server and MCP client: a
sandbox writing 3 GB gets "No space left on device" at its cap and says so
in the next result's notice, its use shows in list_sandboxes, the REST API
and /health, its files, links and uploads keep working, the cap holds after
the server is killed and restarted, and a server short of free disk refuses
new sandboxes with a message."""

import asyncio
import json
import os
import urllib.parse

import pytest
from mcp import Client

from harness import Server, api, get

RESULTS_MB = 64
FILL = "dd if=/dev/zero of={dir}/big bs=1M count=3000 2>&1"


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_SANDBOX_RESULTS_MB=str(RESULTS_MB),
        MCP_SANDBOX_SANDBOX_RESULTS_INODES="2000",
        MCP_SANDBOX_SANDBOX_PACKAGES_MB="96",
        MCP_SANDBOX_SANDBOX_PACKAGES_INODES="4000",
    ).start()
    yield s
    s.cleanup()


async def call(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert not r.is_error, r.content[0].text
    return r.structured_content


def free_mb(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // (1 << 20)


def test_a_sandbox_filling_its_disks_stops_at_the_cap_and_keeps_working(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox", name="filler"))["sandbox_id"]
            other = (await call(c, "create_sandbox", name="neighbour"))["sandbox_id"]
            early = await call(c, "execute_python_code", sandbox_id=sid, code="open('early.txt', 'w').write('kept')")
            link = early["file_links"][0]
            before = free_mb(server.root)
            for folder in ("/app/results", "/app/.venv"):
                ran = await call(c, "execute_terminal_command", sandbox_id=sid, command=FILL.format(dir=folder), timeout_seconds=120)
                assert ran["exit_code"] != 0 and "No space left on device" in ran["stdout"], ran
            assert "Disk quota reached" in ran.get("notice", ""), ran
            assert before - free_mb(server.root) < 1024, "the host lost far less than the 6 GB written"

            listed = (await call(c, "list_sandboxes"))["sandboxes"]
            disk = next(s for s in listed if s["sandbox_id"] == sid)["disk"]
            assert disk["results"]["full"] and disk["results"]["quota_mb"] <= RESULTS_MB, disk
            assert disk["packages"]["full"], disk
            status, page = api(server, "GET", "/api/sandboxes", "none")
            assert status == 200
            assert next(s for s in page["sandboxes"] if s["sandbox_id"] == sid)["disk"]["results"]["full"]

            # Files, links, the listing and other tenants keep working; an
            # upload into the full folder fails with an error, not a hang.
            assert get(link)[2] == b"kept"
            status, files = api(server, "GET", f"/api/sandboxes/{sid}/files", "none")
            assert status == 200 and {"early.txt", "big"} <= {f["path"] for f in files["files"]}, files
            req_path = f"/api/sandboxes/{sid}/files?name=up.bin"
            status, _ = api(server, "POST", req_path, "none", body="x" * (2 << 20))
            assert status >= 400
            out = await call(c, "execute_python_code", sandbox_id=sid, code="print(open('early.txt').read())")
            assert out["stdout"] == "kept\n"
            out = await call(c, "execute_terminal_command", sandbox_id=other, command="head -c 10000000 /dev/zero > f && echo ok")
            assert out["stdout"] == "ok\n" and "notice" not in out, out

            freed = await call(c, "execute_terminal_command", sandbox_id=sid, command="rm big /app/.venv/big")
            assert "notice" not in freed, freed
            for s in (sid, other):
                await call(c, "delete_sandbox", sandbox_id=s)

    asyncio.run(go())


def test_health_and_metrics_report_disk_and_memory(server):
    status, _, body = get(server.url + "/health")
    resources = json.loads(body)["resources"]
    assert status == 200 and resources["disk_free_mb"] > 0 and resources["host_memory_mb"] > 0, resources
    assert resources["sandbox_memory_limits_mb"] == 0, "no sandbox, no memory promised"
    metrics = get(server.url + "/metrics")[2].decode()
    assert "mcp_sandbox_disk_free_bytes " in metrics and "mcp_sandbox_memory_limits_bytes 0" in metrics


def test_the_cap_holds_after_the_server_is_killed_and_restarted(server):
    async def create():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox", name="survivor"))["sandbox_id"]
            await call(c, "execute_terminal_command", sandbox_id=sid, command="echo kept > early.txt")
            return sid

    sid = asyncio.run(create())
    server.kill()
    server.start()

    async def check():
        async with Client(server.url + "/mcp") as c:
            ran = await call(c, "execute_terminal_command", sandbox_id=sid, command=FILL.format(dir="/app/results"), timeout_seconds=120)
            assert "No space left on device" in ran["stdout"], ran
            out = await call(c, "execute_terminal_command", sandbox_id=sid, command="cat early.txt")
            assert out["stdout"] == "kept\n"
            await call(c, "delete_sandbox", sandbox_id=sid)

    asyncio.run(check())
    assert server.own_objects() == ([], [])


def test_a_server_short_of_disk_refuses_new_sandboxes():
    s = Server(MCP_SANDBOX_LIMITS_MIN_FREE_DISK_MB=str(1 << 40)).start()
    try:
        async def go():
            async with Client(s.url + "/mcp") as c:
                r = await c.call_tool("create_sandbox", {})
                assert r.is_error and "limits.min_free_disk_mb" in r.content[0].text, r.content[0].text

        asyncio.run(go())
        assert s.own_objects() == ([], [])
    finally:
        s.cleanup()
