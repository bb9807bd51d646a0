"""`mcp-sandbox stdio --connect URL`: a client that launches its server over
stdio (Claude Desktop) reaches the server already running, through the
Python SDK's stdio client: the same sandboxes as its HTTP clients, under the
key it presents, with progress and errors passed through; a wrong key or an
address with no server fails the bridge with a message on stderr."""

import asyncio
import subprocess

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from harness import BINARY, Server, new_key
from harness import call as ok

KEYS = {name: new_key(name) for name in ("alice", "bob")}


def bridge(s, who):
    """The SDK's stdio client on the bridge, from a folder of its own."""
    env = {"MCP_SANDBOX_KEY": KEYS[who][0], "PATH": "/usr/bin:/bin"}
    return Client(StdioServerParameters(command=str(BINARY), args=["stdio", "--connect", s.url + "/mcp"], env=env,
                                        cwd="/"), mode="legacy")


def test_the_stdio_bridge_shows_the_running_server_s_sandboxes_under_its_key():
    keys = ", ".join(f'{{name = "{n}", key_sha256 = "{sha}"}}' for n, (_, sha) in KEYS.items())
    s = Server(MCP_SANDBOX_AUTH_ENABLED="true", MCP_SANDBOX_AUTH_KEYS=f"[{keys}]").start()
    try:
        async def go():
            headers = {"Authorization": f"Bearer {KEYS['alice'][0]}"}
            http = Client(streamable_http_client(s.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))
            async with http as h:
                sid = (await ok(h, "create_sandbox", name="made over HTTP"))["sandbox_id"]
                await ok(h, "execute_python_code", sandbox_id=sid, code="x = 41")
                async with bridge(s, "alice") as b:
                    listed = (await ok(b, "list_sandboxes"))["sandboxes"]
                    assert [x["sandbox_id"] for x in listed] == [sid], listed
                    ran = await ok(b, "execute_python_code", sandbox_id=sid, code="print(x + 1)")
                    assert ran["stdout"] == "42\n", ran
                    bad = await b.call_tool("execute_python_code", {"sandbox_id": "nope", "code": "1"})
                    assert bad.is_error, bad
                # Another key sees none of alice's.
                async with bridge(s, "bob") as b:
                    assert (await ok(b, "list_sandboxes"))["sandboxes"] == []
                await ok(h, "delete_sandbox", sandbox_id=sid)

        asyncio.run(go())
        # Nothing listens there: the bridge ends with why.
        gone = subprocess.run([str(BINARY), "stdio", "--connect", "http://127.0.0.1:9/mcp"], input=
                              '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18",'
                              '"capabilities":{},"clientInfo":{"name":"t","version":"1"}}}\n',
                              capture_output=True, text=True, timeout=60, cwd="/")
        assert gone.returncode != 0 and "127.0.0.1:9" in gone.stderr, gone.stderr[-2000:]
    finally:
        s.cleanup()
