"""The MCP Inspector CLI (npm, pinned) lists the tools and calls one over
both HTTP transports. Every tool's schemas are portable: no type arrays
(which Gemini and OpenAPI-style function calling reject) and no format
JSON Schema does not define (which the Inspector's validator warns of on
every call)."""

import json
import shutil
import subprocess

import pytest

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"


STANDARD_FORMATS = {"date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uri",
                    "uri-reference", "uuid", "regex"}


def inspector(*args):
    out = subprocess.run(["npx", "-y", INSPECTOR, "--cli", *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "unknown format" not in out.stderr, out.stderr[-2000:]
    return json.loads(out.stdout[out.stdout.index("{"):])


def unportable(schema, path="#"):
    """The places in a schema with a type array or a format JSON Schema
    does not define."""
    found = []
    if isinstance(schema, dict):
        if isinstance(schema.get("type"), list):
            found.append(f"{path}: type {schema['type']}")
        if isinstance(schema.get("format"), str) and schema["format"] not in STANDARD_FORMATS:
            found.append(f"{path}: format {schema['format']}")
        for k, v in schema.items():
            found += unportable(v, f"{path}/{k}")
    elif isinstance(schema, list):
        for i, v in enumerate(schema):
            found += unportable(v, f"{path}/{i}")
    return found


@pytest.mark.skipif(shutil.which("npx") is None, reason="needs Node.js (npx)")
@pytest.mark.parametrize("transport,path", [("http", "/mcp"), ("sse", "/sse")])
def test_inspector_lists_and_calls(server, transport, path):
    url = server.url + path
    tools = inspector(url, "--transport", transport, "--method", "tools/list")
    assert {t["name"] for t in tools["tools"]} >= {"create_sandbox", "execute_python_code", "delete_sandbox"}
    places = [f"{t['name']} {side}{p}" for t in tools["tools"] for side in ("inputSchema", "outputSchema")
              for p in unportable(t.get(side, {}))]
    assert places == [], places
    listed = inspector(url, "--transport", transport, "--method", "tools/call", "--tool-name", "list_sandboxes")
    assert listed.get("isError") is not True
    assert "sandboxes" in listed["structuredContent"]
