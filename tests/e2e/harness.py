"""Starts the real mcp-sandbox binary against the real Docker engine, each
server with its own state, results and upload folders (hence its own server
id), and removes exactly the Docker objects labelled with that id."""

import asyncio
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("SANDBOX_TEST_BIN", ROOT / "target" / "debug" / "mcp-sandbox"))
SERVER_LABEL = "io.mcp-sandbox.server"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def docker(*args):
    return subprocess.run(["docker", *args], capture_output=True, text=True).stdout


class Server:
    def __init__(self, args=(), **env):
        self.args = list(args)
        self.root = Path(tempfile.mkdtemp(prefix="mcp-sandbox-e2e-"))
        self.uploads = self.root / "uploads"
        self.uploads.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "RUST_LOG": "info,rmcp=warn",
            "MCP_SANDBOX_SERVER_STATE_DIR": str(self.root / "state"),
            "MCP_SANDBOX_RESULTS_DIR": str(self.root / "results"),
            "MCP_SANDBOX_UPLOADS_ALLOWED_DIRS": json.dumps([str(self.uploads)]),
            # Tests call faster than any agent; the security tests set their own limits.
            "MCP_SANDBOX_LIMITS_REQUESTS_PER_SECOND": "1000",
            "MCP_SANDBOX_LIMITS_BURST": "2000",
            "MCP_SANDBOX_LIMITS_IP_REQUESTS_PER_SECOND": "10000",
            "MCP_SANDBOX_LIMITS_CREATIONS_PER_MINUTE": "1000",
            "MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT": "20",
            # Tests count the objects a server made; the pool test sets its own.
            "MCP_SANDBOX_POOL_MIN": "0",
            "MCP_SANDBOX_POOL_MAX": "0",
            **{k: str(v) for k, v in env.items()},
        }
        # None unsets a variable: the server's own default applies.
        self.env = {k: v for k, v in self.env.items() if env.get(k, "") is not None}
        self.proc = None
        self.server_id = None
        self.log = self.root / "server.log"

    def read_server_id(self):
        """The id a server keeps in its state folder: the value of the
        server label on every Docker object it creates."""
        path = self.root / "state" / "server-id"
        return path.read_text().strip() if path.exists() else None

    def start(self):
        self.log_file = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(BINARY), *self.args, "serve", "--port", str(self.port)],
            cwd=self.root,
            env=self.env,
            stdout=self.log_file,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 300  # the first start may build the image
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        else:
            raise RuntimeError("server did not become healthy")
        self.server_id = self.read_server_id()
        return self

    def kill(self):
        """Kills the server process outright (no clean shutdown)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log_file.close()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log_file.close()

    def own_objects(self):
        f = f"label={SERVER_LABEL}={self.server_id}"
        return docker("ps", "-aq", "--filter", f).split(), docker("volume", "ls", "-q", "--filter", f).split()

    def cleanup(self):
        self.stop()
        if self.server_id:
            containers, volumes = self.own_objects()
            if containers:
                docker("rm", "-f", "-v", *containers)
            if volumes:
                docker("volume", "rm", "-f", *volumes)
            for network in docker("network", "ls", "-q", "--filter", f"label={SERVER_LABEL}={self.server_id}").split():
                docker("network", "rm", network)
            # The template images it built (labelled as its own).
            for image in docker("images", "-q", "--filter", f"label={SERVER_LABEL}={self.server_id}").split():
                docker("image", "rm", "-f", image)
            tag = f"mcp-sandbox:{self.server_id}"
            for table, chain in (("filter", "INPUT"), ("filter", "DOCKER-USER"), ("raw", "PREROUTING"), ("mangle", "FORWARD")):
                rules = subprocess.run(["iptables", "-w", "-t", table, "-S", chain], capture_output=True, text=True).stdout
                for line in rules.splitlines():
                    if tag in line:
                        subprocess.run(["iptables", "-w", "-t", table, "-D", *shlex.split(line)[1:]], capture_output=True)
        unmount_under(self.root)
        shutil.rmtree(self.root, ignore_errors=True)


def unmount_under(root):
    """Detaches every file system mounted under root (the sandboxes' disk
    images and agent folders), deepest first, so that removing the folder
    removes only folders."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f]
    mine = [m for m in mounts if Path(m).is_relative_to(root)]
    for m in sorted(mine, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True)


def new_key(name):
    """A fresh API key and its SHA-256, from the binary itself."""
    out = subprocess.run([str(BINARY), "key", "new", name], capture_output=True, text=True, check=True).stdout
    key = next(line.strip() for line in out.splitlines() if line.strip().startswith("msk_"))
    sha = out.split('key_sha256 = "')[1].split('"')[0]
    return key, sha


def get(url, headers=None):
    """(status, headers, body) of a GET, errors included."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def api(server, method, path, key, body=None, headers=None):
    """(status, parsed JSON) of a REST API call with a key."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(server.url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {key}")
    req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


async def call(c, tool, **args):
    """A tool's structured result, asserting that the call worked."""
    r = await c.call_tool(tool, args)
    assert not r.is_error, r.content[0].text
    return r.structured_content


def in_sandbox(server, scenario):
    """Runs `scenario(client, sandbox_id)` on a new sandbox over Streamable
    HTTP with the Python SDK, and deletes the sandbox after it."""
    from mcp import Client

    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            await scenario(c, sid)
            await call(c, "delete_sandbox", sandbox_id=sid)

    asyncio.run(go())


# Headless Chromium as these machines run it: no GPU, no sandbox as root,
# and none of the background connections a closed network refuses.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Writes a 64x48 PNG with the standard library only (no plotting package).
PNG_CODE = """
import struct, zlib
w, h = 64, 48
raw = b"".join(b"\\x00" + b"".join(bytes((x * 4 % 256, y * 5 % 256, 128)) for x in range(w)) for y in range(h))
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
png = b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open("plot.png", "wb").write(png)
print("wrote", len(png), "bytes")
"""


PROTOCOL = "2025-06-18"


class Session:
    """A Streamable HTTP session that speaks JSON-RPC by hand."""

    def __init__(self, server, key, capabilities, protocol=PROTOCOL):
        self.protocol = protocol
        self.server, self.key, self.next_id, self.sid = server, key, 0, None
        init = self.request("initialize", {"protocolVersion": protocol, "capabilities": capabilities,
                                           "clientInfo": {"name": "e2e-raw", "version": "1"}})
        assert "result" in init, init
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message):
        c = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=200)
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json",
                   "Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": self.protocol}
        if self.sid:
            headers["Mcp-Session-Id"] = self.sid
        c.request("POST", "/mcp", body=json.dumps(message), headers=headers)
        r = c.getresponse()
        body = r.read().decode()
        self.sid = self.sid or r.getheader("mcp-session-id")
        c.close()
        assert r.status in (200, 202), (r.status, body)
        return body

    def request(self, method, params):
        self.next_id += 1
        body = self.post({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        for line in body.splitlines() if not body.startswith("{") else ["data:" + body]:
            if line.startswith("data:") and line[5:].strip():
                msg = json.loads(line[5:])
                if msg.get("id") == self.next_id:
                    return msg
        raise AssertionError(f"no response to {method}: {body}")

    def call(self, tool, **arguments):
        return self.request("tools/call", {"name": tool, "arguments": arguments})["result"]

    def get_task(self, task_id):
        return self.request("tasks/get", {"taskId": task_id})
