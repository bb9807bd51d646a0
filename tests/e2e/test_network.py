"""Network policy through the real server and MCP client: the server's
policy is `packages` with a warm pool; keys override it (bob `open`, carol
`none`, so carol's pooled sandbox takes its policy at claim). Tenants never
reach each other; pip works under `packages` while another registry is
refused by the proxy with a reason, and /metrics counts the refusal; under
`none` only installs work, through the installer container. Targets: this
machine and package-registry hosts only."""

import asyncio

import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from prometheus_client.parser import text_string_to_metric_families

from harness import Server, get, new_key

KEYS = {name: new_key(name) for name in ("alice", "bob", "carol", "ops")}
EGRESS = {"bob": "open", "carol": "none"}

PROBE = """
import os, socket
try:
    socket.create_connection(("{ip}", 8000), timeout=3).close()
    print("tcp reached")
except OSError as e:
    print("tcp blocked", type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(2)
try:
    u.sendto(b"ping", ("{ip}", 9999))
    print("udp answered", u.recv(16))
except OSError as e:
    print("udp unanswered")
if os.environ.get("HTTP_PROXY"):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"GET http://{ip}:8000/s.txt HTTP/1.1\\r\\nHost: {ip}:8000\\r\\n\\r\\n")
    print("proxy", s.recv(4096).decode().split("\\r\\n")[0])
"""

LISTEN = """
import subprocess, socket, time
open("s.txt", "w").write("secret of B")
subprocess.Popen(["setsid", "python3", "-m", "http.server", "8000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(["setsid", "python3", "-c", "import socket\\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\\ns.bind(('0.0.0.0', 9999))\\nwhile True:\\n    d, a = s.recvfrom(64)\\n    s.sendto(d, a)"])
time.sleep(1.5)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.connect(("192.0.2.1", 9))
print(s.getsockname()[0])
"""

FETCH = """
import urllib.request
try:
    print("fetched", urllib.request.urlopen("{url}", timeout=30).status)
except OSError as e:
    print("failed", e)
"""


@pytest.fixture(scope="module")
def server():
    keys = ", ".join(
        f'{{name = "{n}", key_sha256 = "{sha}"' + (f', egress = "{EGRESS[n]}"' if n in EGRESS else "") + "}"
        for n, (_, sha) in KEYS.items()
    )
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f"[{keys}]",
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_SANDBOX_NETWORK="packages",
        MCP_SANDBOX_POOL_SIZE="2",
    ).start()
    yield s
    s.cleanup()


def call(server, who, tool, args):
    async def go():
        headers = {"Authorization": f"Bearer {KEYS[who][0]}"}
        http = create_mcp_http_client(headers=headers)
        async with Client(streamable_http_client(server.url + "/mcp", http_client=http)) as c:
            result = await c.call_tool(tool, args)
            assert not result.is_error, result.content
            return result.structured_content

    return asyncio.run(go())


def python(server, who, sid, code):
    out = call(server, who, "execute_python_code", {"sandbox_id": sid, "code": code, "timeout_seconds": 60})
    assert out["exit_code"] == 0, out["stderr"]
    return out["stdout"]


def denied(server, reason):
    status, _, body = get(server.url + "/metrics", {"Authorization": f"Bearer {KEYS['ops'][0]}"})
    assert status == 200
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name == "mcp_sandbox_egress_denied_total" and s.labels == {"reason": reason}:
                return s.value
    raise AssertionError("no mcp_sandbox_egress_denied_total sample")


@pytest.fixture(scope="module")
def sandboxes(server):
    return {who: call(server, who, "create_sandbox", {"name": who})["sandbox_id"] for who in ("alice", "bob", "carol")}


def test_tenants_never_reach_each_other(server, sandboxes):
    ip = python(server, "bob", sandboxes["bob"], LISTEN).strip()
    own = python(server, "bob", sandboxes["bob"], PROBE.format(ip=ip))
    assert "tcp reached" in own and "udp answered" in own, own  # the control
    for who in ("alice", "carol"):
        out = python(server, who, sandboxes[who], PROBE.format(ip=ip))
        assert "tcp blocked" in out and "udp unanswered" in out, (who, out)
        assert "proxy HTTP/1.1 403" in out, (who, out)


def test_packages_installs_from_the_sandbox_and_refuses_other_registries(server, sandboxes):
    sid = sandboxes["alice"]
    before = denied(server, "policy")
    ran = call(server, "alice", "execute_terminal_command", {"sandbox_id": sid, "command": "pip install six 2>&1", "timeout_seconds": 180})
    assert ran["exit_code"] == 0, ran["stdout"]
    assert python(server, "alice", sid, "import six; print(six.__name__)") == "six\n"
    out = python(server, "alice", sid, FETCH.format(url="https://registry.npmjs.org/"))
    assert "Tunnel connection failed: 403" in out, out
    assert denied(server, "policy") >= before + 1


def test_a_key_without_network_installs_through_the_installer(server, sandboxes):
    sid = sandboxes["carol"]
    out = python(server, "carol", sid, FETCH.format(url="https://pypi.org/simple/"))
    assert "Tunnel connection failed: 403" in out, out
    done = call(server, "carol", "install_package_in_sandbox", {"sandbox_id": sid, "package_name": "six"})
    if done["status"] == "installing":
        for _ in range(60):
            done = call(server, "carol", "check_package_installation_status", {"sandbox_id": sid, "package_name": "six"})
            if done["status"] != "installing":
                break
    assert done["status"] == "success", done
    assert python(server, "carol", sid, "import six; print('ok')") == "ok\n"
