"""End-to-end tests with the Python MCP SDK 1.x (ClientSession) over the
legacy SSE transport and Streamable HTTP, as existing agents use it."""

import asyncio

import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client


def transports(server):
    return {
        "sse": lambda: sse_client(server.url + "/sse"),
        "http": lambda: streamablehttp_client(server.url + "/mcp"),
    }


async def call(s, tool, **args):
    r = await s.call_tool(tool, args)
    assert not r.isError, r.content[0].text
    return r.structuredContent


@pytest.mark.parametrize("kind", ["sse", "http"])
def test_workflow(server, kind):
    async def go():
        async with transports(server)[kind]() as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                tools = (await s.list_tools()).tools
                assert len(tools) == 26 and all(t.outputSchema for t in tools)
                sid = (await call(s, "create_sandbox", name=kind))["sandbox_id"]
                inst = await call(s, "install_package_in_sandbox", sandbox_id=sid, package_name="six")
                assert inst["status"] in ("success", "installing")
                out = await call(s, "execute_python_code", sandbox_id=sid, code="import six\nprint(six.PY3)")
                assert out["stdout"] == "True\n", out
                assert (await call(s, "check_package_installation_status", sandbox_id=sid, package_name="six"))["status"] == "success"
                assert (await call(s, "execute_terminal_command", sandbox_id=sid, command="echo a | tr a b"))["stdout"] == "b\n"
                (server.uploads / f"{kind}.csv").write_text("a,b\n1,2\n")
                up = await call(s, "upload_file_to_sandbox", sandbox_id=sid, local_file_path=str(server.uploads / f"{kind}.csv"), dest_path="/app/results/in")
                assert up["path"] == f"/app/results/in/{kind}.csv"
                listed = (await call(s, "list_sandboxes"))["sandboxes"]
                assert sid in [x["sandbox_id"] for x in listed]
                await call(s, "delete_sandbox", sandbox_id=sid)
                assert sid not in [x["sandbox_id"] for x in (await call(s, "list_sandboxes"))["sandboxes"]]

    asyncio.run(go())
