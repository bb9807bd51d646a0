"""A cluster of three nodes from scripts/cluster, each with its own engine
in its own network namespace, coordinated through three real etcd
members: membership, the directory, quotas over every node, and the
failures of a node, of an etcd member and of etcd's quorum.

The tests run in file order: the failures come last, each restoring what
it broke."""

import asyncio
import hashlib
import hmac
import json
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import ALICE, BOB, CAROL, LEASE, script


def test_every_node_is_up_with_its_figures(cluster):
    status = cluster.until("three nodes up",
                           lambda: (s := cluster.status()) and [n["state"] for n in s.values()] == ["up"] * 3 and s, 30)
    for name, node in status.items():
        assert node["state"] == "up", status
        assert node["figures"]["url"] == cluster.url(name)
        assert node["figures"]["runtimes"] == ["runc"]
        assert node["draining"] is False


def test_a_creation_enters_the_directory_and_a_deletion_leaves_it(cluster):
    sid = cluster.create("n2", ALICE)
    assert cluster.total() == 1, cluster.status()
    cluster.delete("n2", ALICE, sid)
    assert cluster.total() == 0


def test_a_creation_asked_of_one_node_is_placed_on_another_and_used_through_a_third(cluster):
    sid = cluster.create_on("n2", "n1", ALICE)
    status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/python", ALICE, {"code": "print('on n2')"})
    assert status == 200 and ran["stdout"] == "on n2\n", ran
    cluster.delete("n1", ALICE, sid)
    assert cluster.total() == 0
    # With every node draining, a creation is refused and says why.
    for n in cluster.nodes:
        script("ctl", "drain", n)
    try:
        status, body = cluster.api("n1", "POST", "/api/sandboxes", ALICE, {})
        assert status == 503 and "drains" in body["error"], body
    finally:
        for n in cluster.nodes:
            script("ctl", "drain", n, "--undo")


def test_a_tenant_s_quota_holds_over_every_node(cluster):
    # Three for alice, one on each node; a fourth is refused on any node,
    # though each node holds only one of hers.
    made = [(node, cluster.create(node, ALICE)) for node in ("n1", "n2", "n3")]
    for node in ("n1", "n3"):
        status, body = cluster.api(node, "POST", "/api/sandboxes", ALICE, {})
        assert status == 429, body
        assert "3" in body["error"], body
    # Another tenant is not held back by alice's.
    bob = cluster.create("n1", BOB)
    assert cluster.total() == 4
    for node, sid in made:
        cluster.delete(node, ALICE, sid)
    cluster.delete("n1", BOB, bob)


def test_hibernated_sandboxes_leave_the_quota_of_live_ones_over_every_node(cluster):
    # Alice at her three; one of them, asleep, makes room for a fourth once
    # the directory marks it asleep (within a few seconds; creations are
    # rate-limited, so they are not polled); woken, it counts again.
    made = [(node, cluster.create(node, ALICE)) for node in ("n1", "n2", "n3")]
    status, body = cluster.api("n1", "POST", "/api/sandboxes", ALICE, {})
    assert status == 429, body
    status, body = cluster.api("n3", "POST", f"/api/sandboxes/{made[1][1]}/hibernate", ALICE, {})
    assert status == 200 and body["sandbox_id"] == made[1][1], body
    time.sleep(12)  # past two rounds of the directory's upkeep (5 s each)
    status, fourth = cluster.api("n1", "POST", "/api/sandboxes", ALICE, {})
    assert status == 201, fourth
    assert cluster.total() == 4
    status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{made[1][1]}/python", ALICE, {"code": "print(1)"})
    assert status == 200 and "woke from hibernation" in ran["notice"], ran
    # Woken, it counts again: with the fourth gone she is at her three.
    cluster.delete("n1", ALICE, fourth["sandbox_id"])
    time.sleep(12)
    status, body = cluster.api("n3", "POST", "/api/sandboxes", ALICE, {})
    if status == 201:
        cluster.delete("n3", ALICE, body["sandbox_id"])
    assert status == 429 and "already have 3" in body["error"], body
    for node, sid in made:
        cluster.delete(node, ALICE, sid)
    assert cluster.total() == 0


def test_a_sandbox_made_through_one_node_is_used_through_every_node_in_order(cluster):
    sid = cluster.create("n1", ALICE)
    path = f"/api/sandboxes/{sid}"
    status, ran = cluster.api("n2", "POST", path + "/python", ALICE, {"code": "x = 41\nprint(x + 1)"})
    assert status == 200 and ran["stdout"] == "42\n", ran
    status, ran = cluster.api("n3", "POST", path + "/python", ALICE, {"code": "print(x)"})
    assert status == 200 and ran["stdout"] == "41\n", "one namespace, whichever node: " + str(ran)
    # A slow write through n2, and a read through n3 sent while it runs:
    # one actor on n1 serialises them, so the read sees the write.
    slow = {}
    writer = threading.Thread(target=lambda: slow.update(r=cluster.api(
        "n2", "POST", path + "/shell", ALICE, {"command": "sleep 2; echo written > order.txt"})))
    writer.start()
    time.sleep(0.5)
    status, read = cluster.api("n3", "POST", path + "/shell", ALICE, {"command": "cat order.txt"})
    writer.join()
    assert slow["r"][0] == 200, slow
    assert status == 200 and read["stdout"] == "written\n", read
    # Its files' links are served by every node (as behind a load
    # balancer): the node a link reaches relays the file from the holder.
    status, ran = cluster.api("n2", "POST", path + "/shell", ALICE, {"command": "echo artifact > out.txt"})
    link = ran["file_links"][0]
    route = "/" + link.split("/", 3)[3]
    for node in ("n1", "n2", "n3"):
        assert cluster.get(cluster.url(node) + route) == (200, b"artifact\n"), node
        assert "token=" in route.split("?")[1], route
        forged = cluster.url(node) + route[:-1] + ("1" if route[-1] != "1" else "2")
        assert cluster.get(forged)[0] == 403, node
        bare = cluster.url(node) + route.split("?")[0]
        assert cluster.get(bare, BOB)[0] == 404, node
        assert cluster.get(bare, ALICE) == (200, b"artifact\n"), node
    # Another tenant sees nothing of it through any node.
    for node in ("n1", "n2", "n3"):
        status, body = cluster.api(node, "POST", path + "/python", BOB, {"code": "print(1)"})
        assert status == 404, (node, body)
        status, page = cluster.api(node, "GET", "/api/sandboxes", BOB)
        assert sid not in str(page), (node, page)
    # Its owner lists it, and sees it with its recent calls, through every
    # node; the other tenant gets "not found".
    for node in ("n1", "n2", "n3"):
        status, page = cluster.api(node, "GET", "/api/sandboxes", ALICE)
        assert [s["sandbox_id"] for s in page["sandboxes"]] == [sid], (node, page)
        status, detail = cluster.api(node, "GET", path, ALICE)
        assert status == 200 and detail["sandbox_id"] == sid, (node, detail)
        assert any("order.txt" in c["summary"] for c in detail["history"]), (node, detail)
        assert cluster.api(node, "GET", path, BOB)[0] == 404, node
    # A restart through another node restarts it where it lives: files kept.
    status, info = cluster.api("n3", "POST", path + "/restart", ALICE)
    assert status == 200 and info["sandbox_id"] == sid and info["status"] == "running", info
    status, ran = cluster.api("n2", "POST", path + "/shell", ALICE, {"command": "cat order.txt"})
    assert status == 200 and ran["stdout"] == "written\n", ran
    cluster.delete("n3", ALICE, sid)
    assert cluster.total() == 0


def test_mcp_tools_through_another_node_reach_the_holder_with_progress(cluster):
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    sid = cluster.create_on("n3", "n1", ALICE)
    headers = {"Authorization": f"Bearer {ALICE}"}

    async def go():
        http = create_mcp_http_client(headers=headers)
        async with Client(streamable_http_client(cluster.url("n1") + "/mcp", http_client=http)) as c:
            listed = (await c.call_tool("list_sandboxes", {})).structured_content["sandboxes"]
            assert [s["sandbox_id"] for s in listed] == [sid], listed
            seen = []

            async def progress(done, total, message):
                seen.append(message)

            code = "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.6)"
            r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": code},
                                  progress_callback=progress)
            assert not r.is_error, r.content[0].text
            assert r.structured_content["stdout"] == "step 0\nstep 1\nstep 2\n"
            assert any("step" in (m or "") for m in seen), f"progress relayed from n3: {seen}"
            r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": "print(undefined)"})
            assert "NameError" in r.structured_content["stderr"]
            r = await c.call_tool("delete_sandbox", {"sandbox_id": sid})
            assert not r.is_error, r.content[0].text

    asyncio.run(go())
    assert cluster.status()["n3"]["sandboxes"] == 0


def test_files_are_read_and_uploaded_through_a_node_that_does_not_hold_them(cluster):
    from mcp import Client
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    sid = cluster.create_on("n3", "n1", ALICE)
    # A small PNG, made by the sandbox's own Python.
    png = ("import struct, zlib\n"
           "def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
           "raw = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 8 for _ in range(8))\n"
           "open('/app/results/red.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 8, 8, 8, 2, 0, 0, 0))"
           " + chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))\n"
           "open('/app/results/notes.txt', 'w').write('line one\\nline two\\n')")
    status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/python", ALICE, {"code": png})
    assert status == 200 and not ran["stderr"], ran
    # A browser upload through n2: the bytes travel to n3.
    upload = Path("/var/lib/mcp-sandbox-cluster/uploads")
    upload.mkdir(parents=True, exist_ok=True)
    (upload / "from-host.csv").write_text("a,b\n1,2\n")
    data = bytes(range(256)) * 4096  # 1 MiB, every byte value
    req = urllib.request.Request(cluster.url("n2") + f"/api/sandboxes/{sid}/files?name=blob.bin&dest=/app/results",
                                 data=data, method="POST", headers={"Authorization": f"Bearer {ALICE}"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200, r.read()
    req = urllib.request.Request(cluster.url("n2") + f"/api/sandboxes/{sid}/files?name=x.bin",
                                 data=b"x", method="POST", headers={"Authorization": f"Bearer {BOB}"})
    try:
        urllib.request.urlopen(req, timeout=60)
        raise AssertionError("another tenant uploaded into alice's sandbox")
    except urllib.error.HTTPError as e:
        assert e.code == 404, e.read()
    status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/shell", ALICE,
                              {"command": "sha256sum /app/results/blob.bin | cut -c1-64"})
    assert ran["stdout"].strip() == hashlib.sha256(data).hexdigest(), ran
    headers = {"Authorization": f"Bearer {ALICE}"}

    async def go():
        http = create_mcp_http_client(headers=headers)
        async with Client(streamable_http_client(cluster.url("n2") + "/mcp", http_client=http)) as c:
            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "notes.txt", "max_lines": 1})
            assert not r.is_error, r.content[0].text
            assert r.structured_content["content"] == "line one\n", r.structured_content
            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "red.png"})
            assert not r.is_error, r.content[0].text
            assert r.structured_content["image"]["inline"] is True, r.structured_content
            assert [b.type for b in r.content] == ["text", "resource_link", "image"], r.content
            r = await c.call_tool("upload_file_to_sandbox",
                                  {"sandbox_id": sid, "local_file_path": str(upload / "from-host.csv")})
            assert not r.is_error, r.content[0].text
            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "from-host.csv"})
            assert r.structured_content["content"] == "a,b\n1,2\n", r.structured_content

    asyncio.run(go())

    async def bob():
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {BOB}"})
        async with Client(streamable_http_client(cluster.url("n2") + "/mcp", http_client=http)) as c:
            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "notes.txt"})
            assert r.is_error and "not found" in r.content[0].text.lower(), r.content

    asyncio.run(bob())
    cluster.delete("n2", ALICE, sid)


def test_processes_and_preview_links_work_through_nodes_that_do_not_hold_the_sandbox(cluster):
    from urllib.parse import urlsplit

    sid = cluster.create_on("n3", "n1", ALICE)
    status, started = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/processes", ALICE,
                                  {"command": "python -m http.server 8000", "name": "site"})
    assert status == 201 and started["process"]["state"] == "running", started
    status, link = cluster.api("n2", "POST", f"/api/sandboxes/{sid}/ports/8000", ALICE)
    assert status == 200, link
    holder, entry = (urlsplit(cluster.url(n)).hostname for n in ("n3", "n2"))
    assert urlsplit(link["url"]).hostname == holder, link
    # Opened through n2, which relays to n3; the token is checked there.
    via = link["url"].replace(holder, entry, 1)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    for _ in range(30):
        try:
            with opener.open(via, timeout=30) as r:
                body = r.read()
                break
        except urllib.error.HTTPError as e:
            assert e.code == 502, e.read()
            time.sleep(0.5)
    assert b"Directory listing" in body, body[:300]
    forged = via.split("?")[0] + "?mcp_preview_token=1.AAAA"
    try:
        urllib.request.urlopen(forged, timeout=30)
        raise AssertionError("a forged token opened the preview")
    except urllib.error.HTTPError as e:
        assert e.code == 403, e.read()
    status, listed = cluster.api("n1", "GET", f"/api/sandboxes/{sid}/processes", BOB)
    assert status == 404, listed
    pid = started["process"]["process_id"]
    status, stopped = cluster.api("n2", "POST", f"/api/sandboxes/{sid}/processes/{pid}/stop", ALICE)
    assert status == 200 and stopped["process"]["state"] == "exited", stopped
    cluster.delete("n2", ALICE, sid)


def test_a_usage_report_through_any_node_covers_every_node(cluster):
    # Bob's calls on n1 and on n2; n3, which holds none of his sandboxes,
    # reports them all, as the nodes that hold them do.
    made = [cluster.create_on(node, node, BOB) for node in ("n1", "n2")]
    for sid in made:
        status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/shell", BOB, {"command": "true"})
        assert status == 200, ran

    def calls(node):
        status, report = cluster.api(node, "GET", "/api/usage?granularity=hour", BOB)
        assert status == 200 and "missing_nodes" not in report, report
        return sum(r["calls"] for r in report["rows"])

    counted = cluster.until("bob's calls counted on both nodes",
                            lambda: (c := calls("n3")) >= 2 and calls("n1") == c and calls("n2") == c and c, 30)
    # Rows of one tenant only: alice's report through n3 has none of bob's.
    status, report = cluster.api("n3", "GET", "/api/usage", ALICE)
    assert all(r["tenant"] == "alice" for r in report["rows"]), report
    assert counted >= 2
    for node, sid in zip(("n1", "n2"), made):
        cluster.delete(node, BOB, sid)


def test_the_node_channel_takes_only_calls_signed_with_the_cluster_s_key(cluster):
    # A client that reaches a node's channel routes (a sandbox, a tenant)
    # cannot call them as another node would: without the signature, with
    # another key's, with a signed body changed, or replayed past its
    # window, the call is refused and runs nothing.
    sid = cluster.create("n1", ALICE)
    secret = re.search(r'secret = "([^"]+)"', Path("/var/lib/mcp-sandbox-cluster/admin.toml").read_text()).group(1)

    def signature(path, body, key_secret=secret, at=None):
        key = hashlib.sha256(f"mcp-sandbox node channel v1\0{key_secret}".encode()).hexdigest().encode()
        at = int(time.time()) if at is None else at
        digest = hashlib.sha256(body).hexdigest()
        text = f"POST\n{path}\n{at}\n{digest}"
        return f"{at}.{digest}.{hmac.new(key, text.encode(), hashlib.sha256).hexdigest()}"

    def post(path, body, header):
        req = urllib.request.Request(cluster.url("n2") + path, data=body, method="POST")
        if header:
            req.add_header("x-mcp-sandbox-node", header)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    call = {"caller": {"owner": "bob", "admin": True, "expires_at": None}, "args": {"sandbox_id": sid}}
    body = json.dumps(call).encode()
    ops = "/cluster/v1/ops/delete_sandbox"
    upload = "/cluster/v1/bytes/upload_bytes"
    head = json.dumps({**call, "args": {"sandbox_id": sid, "upload": {"name": "x", "dest": "/app/results"}}}).encode()
    attempts = [
        (ops, body, None),
        (ops, body, signature(ops, body, key_secret="another cluster's secret, 32 chars long")),
        (ops, body, signature(ops, b"{}")),
        (ops, body, signature(ops, body, at=int(time.time()) - 120)),
        (ops, body, signature("/cluster/v1/ops/list_files", body)),
        (upload, head + b"\nx", signature(upload, head + b"\ny")),
    ]
    for path, sent, header in attempts:
        status, answer = post(path, sent, header)
        assert status == 401, (path, header, status, answer)
    status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "ls /app/results"})
    assert status == 200 and "x" not in ran["stdout"].split(), ran
    # A forged upload is refused on its headers, before its body is read:
    # it cannot make a node hold and hash hundreds of megabytes.
    host, port = cluster.url("n2").split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall((f"POST {upload} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 200000000\r\n"
                      f"x-mcp-sandbox-node: {int(time.time())}.{'0' * 64}.{'0' * 64}\r\n\r\n").encode())
        started = time.monotonic()
        answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 401"), answer
        assert time.monotonic() - started < 5
    # Signed with the cluster's key, the same call is taken (as the nodes
    # make it), which shows that the refusals above were the signature's.
    status, answer = post("/cluster/v1/ops/list_sandboxes", b'{"caller": {"owner": "alice", "admin": false, "expires_at": null}, "args": null}',
                          signature("/cluster/v1/ops/list_sandboxes", b'{"caller": {"owner": "alice", "admin": false, "expires_at": null}, "args": null}'))
    assert status == 200 and b'"ok"' in answer, answer
    cluster.delete("n3", ALICE, sid)


def test_guest_keys_per_address_are_counted_over_every_node(cluster):
    # Two keys an hour for one address: one through n1, one through n2,
    # and the third refused through n3, though n3 issued none.
    address = {"X-Forwarded-For": "203.0.113.7"}
    for node in ("n1", "n2"):
        status, body = cluster.api(node, "POST", "/api/guest", None, headers=address)
        assert status == 201 and body["key"].startswith("msg_"), body
    status, body = cluster.api("n3", "POST", "/api/guest", None, headers=address)
    assert status == 429, body
    # A key issued by one node works on another (one signing secret).
    status, body = cluster.api("n1", "POST", "/api/guest", None, headers={"X-Forwarded-For": "203.0.113.8"})
    status, page = cluster.api("n3", "GET", "/api/sandboxes", body["key"])
    assert status == 200, page


def test_a_monthly_budget_holds_over_every_node(cluster):
    # Carol's sandbox time is spent on n1; n2, which holds none of hers,
    # refuses her a new sandbox once the nodes have shared their usage.
    sid = cluster.create_on("n1", "n1", CAROL)

    def spent_on_n1():
        status, report = cluster.api("n1", "GET", "/api/usage", CAROL)
        found = []

        def walk(v):
            if isinstance(v, dict):
                found.extend(v.get(k, 0) for k in ("running_seconds", "paused_seconds"))
                for w in v.values():
                    walk(w)
            elif isinstance(v, list):
                for w in v:
                    walk(w)

        walk(report)
        return sum(found) >= 8

    cluster.until("carol's budget spent on n1", spent_on_n1, 60)
    # n1 publishes within 10 s of a sample, and n2 reads within 10 s of that.
    time.sleep(28)
    status, body = cluster.api("n2", "POST", "/api/sandboxes", CAROL, {})
    if status in (200, 201):
        cluster.delete("n2", CAROL, body["sandbox_id"])
    assert status == 429 and "sandbox_hours_per_month" in body["error"], body
    cluster.delete("n1", CAROL, sid)


def test_a_drained_node_is_listed_as_draining_until_undone(cluster):
    script("ctl", "drain", "n2")
    assert cluster.status()["n2"]["draining"] is True
    table = script("status").stdout
    assert any(line.split()[:3] == ["n2", "up", "yes"] for line in table.splitlines()), table
    script("ctl", "drain", "n2", "--undo")
    assert cluster.status()["n2"]["draining"] is False


def test_a_node_cut_off_from_etcd_refuses_new_sandboxes_and_takes_them_again_once_back(cluster):
    # Inside n2's namespace, etcd's ports are dropped: n2 still answers
    # clients but can no longer prove its membership.
    rule = ["-p", "tcp", "--dport", "23791:23799", "-j", "DROP"]
    subprocess.run(["ip", "netns", "exec", "mcpsbx-n2", "iptables", "-I", "OUTPUT", *rule], check=True)
    try:
        def refused():
            status, body = cluster.api("n2", "POST", "/api/sandboxes", ALICE, {})
            if status in (200, 201):
                cluster.delete("n2", ALICE, body["sandbox_id"])
                return None
            return status, body
        status, body = cluster.until("n2 refuses", refused, LEASE + 10)
        assert status == 503 and "etcd" in body["error"], body
        cluster.until("n2 down for the others", lambda: cluster.status()["n2"]["state"] == "down", LEASE + 5)
    finally:
        subprocess.run(["ip", "netns", "exec", "mcpsbx-n2", "iptables", "-D", "OUTPUT", *rule], check=True)
    cluster.until("n2 up again", lambda: cluster.status()["n2"]["state"] == "up", LEASE + 10)

    def created():
        status, body = cluster.api("n2", "POST", "/api/sandboxes", ALICE, {})
        return body["sandbox_id"] if status in (200, 201) else None

    sid = cluster.until("n2 takes sandboxes again", created, LEASE + 10)
    cluster.delete("n2", ALICE, sid)
    assert cluster.total() == 0


def test_a_killed_node_is_down_within_its_lease_and_adopts_its_sandboxes_when_back(cluster):
    sid = cluster.create_on("n3", "n3", ALICE)
    status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/shell", ALICE,
                              {"command": "echo kept > /app/results/kept.txt"})
    assert status == 200 and ran["exit_code"] == 0, ran
    script("kill", "3")
    killed = time.monotonic()
    cluster.until("n3 down", lambda: cluster.status()["n3"]["state"] == "down", LEASE + 5)
    assert time.monotonic() - killed <= LEASE + 3
    status = cluster.status()
    assert status["n3"]["sandboxes"] == 1, "its sandboxes stay in the directory, unreachable"
    # Through another node it is listed as unreachable, and a call to it
    # says what happened and what to do.
    status, page = cluster.api("n1", "GET", "/api/sandboxes", ALICE)
    assert [(s["sandbox_id"], s["status"]) for s in page["sandboxes"]] == [(sid, "unreachable")], page
    status, body = cluster.api("n2", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "true"})
    assert status == 503 and "unreachable" in body["error"] and "n3" in body["error"], body
    # A usage report says whose figures it lacks.
    status, report = cluster.api("n1", "GET", "/api/usage", ALICE)
    assert status == 200 and report["missing_nodes"] == ["n3"], report
    # Creations still succeed on the other nodes.
    other = cluster.create("n1", ALICE)
    script("start", "3")
    cluster.until("n3 up", lambda: cluster.status()["n3"]["state"] == "up", 30)
    status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "cat /app/results/kept.txt"})
    assert status == 200 and ran["stdout"] == "kept\n", ran
    cluster.delete("n3", ALICE, sid)
    cluster.delete("n1", ALICE, other)


def test_a_node_partitioned_by_its_link_is_unreachable_for_the_others_and_loses_nothing(cluster):
    sid = cluster.create_on("n2", "n2", ALICE)
    status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/shell", ALICE,
                              {"command": "echo acknowledged > kept.txt"})
    assert status == 200 and ran["exit_code"] == 0, ran
    subprocess.run(["ip", "link", "set", "mcpsbx-h2", "down"], check=True)
    try:
        cluster.until("n2 down for the others", lambda: cluster.status()["n2"]["state"] == "down", LEASE + 5)
        status, body = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "true"})
        assert status == 503 and "unreachable" in body["error"], body
        status, page = cluster.api("n3", "GET", "/api/sandboxes", ALICE)
        assert [(s["sandbox_id"], s["status"]) for s in page["sandboxes"]] == [(sid, "unreachable")], page
        # The others go on taking sandboxes meanwhile.
        other = cluster.create("n1", ALICE)
        cluster.delete("n1", ALICE, other)
    finally:
        subprocess.run(["ip", "link", "set", "mcpsbx-h2", "up"], check=True)
    cluster.until("n2 back", lambda: cluster.status()["n2"]["state"] == "up", LEASE + 15)

    def read_back():
        status, ran = cluster.api("n1", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "cat kept.txt"})
        return ran if status == 200 else None

    ran = cluster.until("the sandbox answers through n1 again", read_back, 30)
    assert ran["stdout"] == "acknowledged\n", ran
    cluster.delete("n1", ALICE, sid)


def test_one_etcd_member_lost_changes_nothing(cluster):
    script("kill-etcd", "1")
    try:
        made = [cluster.create(node, BOB) for node in ("n1", "n2", "n3")]
        assert all(cluster.status()[n]["state"] == "up" for n in ("n1", "n2", "n3"))
        for node, sid in zip(("n1", "n2", "n3"), made):
            cluster.delete(node, BOB, sid)
    finally:
        script("start-etcd", "1")


def test_without_quorum_creations_are_refused_and_known_sandboxes_keep_working(cluster):
    sid = cluster.create_on("n2", "n2", ALICE)
    script("kill-etcd", "1")
    script("kill-etcd", "2")
    try:
        status, body = cluster.api("n1", "POST", "/api/sandboxes", ALICE, {})
        assert status == 503, body
        assert "etcd" in body["error"] and "try again" in body["error"].lower(), body
        status, ran = cluster.api("n2", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "echo still"})
        assert status == 200 and ran["stdout"] == "still\n", ran
    finally:
        script("start-etcd", "1")
        script("start-etcd", "2")
    def created():
        status, body = cluster.api("n1", "POST", "/api/sandboxes", ALICE, {})
        return body["sandbox_id"] if status in (200, 201) else None

    back = cluster.until("creations again once quorum is back", created, 30)
    cluster.delete("n1", ALICE, back)
    cluster.delete("n2", ALICE, sid)
