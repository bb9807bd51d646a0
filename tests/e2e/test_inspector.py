"""The MCP Inspector CLI (npm, pinned) lists the tools and calls one over
both HTTP transports."""

import json
import shutil
import subprocess

import pytest

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


def inspector(*args):
    out = subprocess.run(["npx", "-y", INSPECTOR, "--cli", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout[out.stdout.index("{"):])


@pytest.mark.skipif(shutil.which("npx") is None, reason="needs Node.js (npx)")
@pytest.mark.parametrize("transport,path", [("http", "/mcp"), ("sse", "/sse")])
def test_inspector_lists_and_calls(server, transport, path):
    url = server.url + path
    tools = inspector(url, "--transport", transport, "--method", "tools/list")
    assert {t["name"] for t in tools["tools"]} >= {"create_sandbox", "execute_python_code", "delete_sandbox"}
    listed = inspector(url, "--transport", transport, "--method", "tools/call", "--tool-name", "list_sandboxes")
    assert listed.get("isError") is not True
    assert "sandboxes" in listed["structuredContent"]
