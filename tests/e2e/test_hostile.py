"""A hostile sandbox against the real server: it swaps its agent's socket for a
listener that accepts and never answers. Every tool still answers within its
deadline, the sandbox is restarted (which ends what it planted), the server's
descriptors come back to their baseline, and another tenant's sandbox, the
listing, /metrics and the UI's list keep answering meanwhile."""

import asyncio
import os
import shlex
import time

from mcp import Client

from harness import Server, get


def run(coro):
    return asyncio.run(coro)


# A process that leaves the run's session (so it outlives the run) and puts a
# silent listener where the agent's socket was.
SILENT_SOCKET = r"""
import os, socket, sys
if os.fork():
    sys.exit(0)
os.setsid()
path = "/run/mcp-agent/agent.sock"
os.unlink(path)
s = socket.socket(socket.AF_UNIX)
s.bind(path)
s.listen(1000)
held = []
while True:
    held.append(s.accept()[0])
"""


def plant(sid):
    code = f"/usr/bin/python3 -c {shlex.quote(SILENT_SOCKET)} </dev/null >/dev/null 2>&1; sleep 0.5; echo planted"
    return {"sandbox_id": sid, "command": code}


def descriptors(server):
    return len(os.listdir(f"/proc/{server.proc.pid}/fd"))


async def timed(c, tool, args, bound):
    """The tool's answer, which must come within `bound` seconds."""
    try:
        return await asyncio.wait_for(c.call_tool(tool, args), bound)
    except asyncio.TimeoutError:
        raise AssertionError(f"{tool} did not answer within {bound} s") from None


def test_a_sandbox_with_a_silent_socket_never_stalls_the_server():
    server = Server(MCP_SANDBOX_SANDBOX_EXEC_TIMEOUT_SECONDS="10").start()

    async def go():
        async with Client(server.url + "/mcp") as c:
            victim = (await c.call_tool("create_sandbox", {"name": "hostile"})).structured_content["sandbox_id"]
            neighbour = (await c.call_tool("create_sandbox", {"name": "neighbour"})).structured_content["sandbox_id"]
            await c.call_tool("execute_python_code", {"sandbox_id": victim, "code": "print(1)"})
            await c.call_tool("list_sandboxes", {})
            baseline = descriptors(server)

            async def neighbour_keeps_working():
                for _ in range(10):
                    r = await timed(c, "execute_python_code", {"sandbox_id": neighbour, "code": "print(7)"}, 10)
                    assert r.structured_content["stdout"] == "7\n"
                    listed = await timed(c, "list_sandboxes", {}, 10)
                    assert {s["sandbox_id"] for s in listed.structured_content["sandboxes"]} >= {neighbour}
                    for path in ("/metrics", "/api/sandboxes"):
                        started = time.monotonic()
                        status, _, _ = get(server.url + path)
                        assert status == 200 and time.monotonic() - started < 10, path
                    await asyncio.sleep(0.5)

            # 1. An install status that asks the agent gets a tool error in time.
            r = await timed(c, "execute_terminal_command", plant(victim), 30)
            assert r.structured_content["stdout"] == "planted\n", r.structured_content
            status, _ = await asyncio.gather(
                timed(c, "check_package_installation_status", {"sandbox_id": victim, "package_name": "six"}, 40),
                neighbour_keeps_working(),
            )
            assert status.is_error and "did not answer" in status.content[0].text, status.content[0].text
            # The sandbox was restarted: what it planted is gone, and it works.
            r = await timed(c, "execute_python_code", {"sandbox_id": victim, "code": "print('back')"}, 90)
            assert r.structured_content["stdout"] == "back\n", r.structured_content
            r = await timed(c, "check_package_installation_status", {"sandbox_id": victim, "package_name": "six"}, 40)
            assert r.structured_content["status"] == "not_found", r.structured_content

            # 2. After an install, the next run and the delete answer in time.
            r = await timed(c, "execute_terminal_command", plant(victim), 30)
            assert r.structured_content["stdout"] == "planted\n", r.structured_content
            install, _ = await asyncio.gather(
                timed(c, "install_package_in_sandbox", {"sandbox_id": victim, "package_name": "six"}, 60),
                neighbour_keeps_working(),
            )
            assert not install.is_error, install.content[0].text
            r = await timed(c, "execute_python_code", {"sandbox_id": victim, "code": "import six; print('six')"}, 90)
            assert r.structured_content["stdout"] == "six\n", r.structured_content
            r = await timed(c, "delete_sandbox", {"sandbox_id": victim}, 30)
            assert not r.is_error, r.content[0].text

            deadline = time.monotonic() + 30
            while descriptors(server) > baseline + 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            assert descriptors(server) <= baseline + 2, (baseline, descriptors(server))

    try:
        run(go())
    finally:
        server.cleanup()
