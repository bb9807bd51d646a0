"""One cluster of three nodes on this machine for the whole tier, started
and removed by the project's own script (scripts/cluster), as a newcomer
would start one."""

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster"
# The keys whose hashes tests/cluster/node.toml holds.
ALICE = "msk_2zg03SdJQg8PDZaqHHiXAjLCeaFDZN_fMRPASdgHGGg"
BOB = "msk_dVo-lAkibRfRIYgQZCKhu_J4lH__sALdW2LJWUhph2s"
CAROL = "msk_LWgWU1Av7GGGjxSQ3pv8UDydLGpbt20ZD4yhaNTGrII"
LEASE = 5  # seconds: the [cluster] default


def script(*args, check=True, timeout=300):
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, check=check, timeout=timeout)


class Cluster:
    def __init__(self, nodes):
        self.nodes = nodes  # name -> base URL

    def url(self, name):
        return self.nodes[name]

    def status(self):
        out = script("status", "--json").stdout
        return {n["name"]: n for n in json.loads(out)}

    def api(self, node, method, path, key, body=None, headers=None):
        """(status, parsed JSON) of a REST call to `node` with `key`."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.nodes[node] + path, data=data, method=method)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        req.add_header("Content-Type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def get(self, url, key=None):
        """(status, body) of a GET, with `key` if given."""
        req = urllib.request.Request(url)
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def create(self, node, key):
        """A sandbox created through `node`, wherever it is placed."""
        status, body = self.api(node, "POST", "/api/sandboxes", key, {})
        assert status in (200, 201), body
        return body["sandbox_id"]

    def create_on(self, target, via, key):
        """A sandbox created through `via` and placed on `target`, the only
        node that does not drain meanwhile."""
        others = [n for n in self.nodes if n != target]
        for n in others:
            script("ctl", "drain", n)
        try:
            before = self.status()[target]["sandboxes"]
            sid = self.create(via, key)
            assert self.status()[target]["sandboxes"] == before + 1, f"placed on {target}"
            return sid
        finally:
            for n in others:
                script("ctl", "drain", n, "--undo")

    def total(self):
        return sum(n["sandboxes"] for n in self.status().values())

    def delete(self, node, key, sid):
        status, body = self.api(node, "DELETE", f"/api/sandboxes/{sid}", key)
        assert status == 200, body

    def until(self, what, check, limit):
        deadline = time.monotonic() + limit
        while True:
            value = check()
            if value:
                return value
            assert time.monotonic() < deadline, f"{what} within {limit} s"
            time.sleep(0.2)


@pytest.fixture(scope="session")
def cluster():
    script("down", check=False)
    up = script("up", "3", "--config", str(REPO / "tests" / "cluster" / "node.toml"), timeout=600)
    lines = up.stdout.splitlines()
    assert len(lines) == 3, f"one line per node on stdout: {up.stdout!r}"
    nodes = dict(line.split(" ", 1) for line in lines)
    try:
        yield Cluster(nodes)
    finally:
        script("down", check=False)
        left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert "mcpsbx" not in left, f"namespaces left behind: {left}"
        assert not os.path.exists("/var/lib/mcp-sandbox-cluster"), "cluster folder left behind"
