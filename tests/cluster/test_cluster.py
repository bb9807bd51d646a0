"""A cluster of three nodes from scripts/cluster, each with its own engine
in its own network namespace, coordinated through three real etcd
members: membership, the directory, quotas over every node, and the
failures of a node, of an etcd member and of etcd's quorum.

The tests run in file order: the failures come last, each restoring what
it broke."""

import subprocess
import time

from conftest import ALICE, BOB, LEASE, script


def test_every_node_is_up_with_its_figures(cluster):
    status = cluster.until("three nodes up", lambda: (s := cluster.status()) and len(s) == 3 and s, 30)
    for name, node in status.items():
        assert node["state"] == "up", status
        assert node["figures"]["url"] == cluster.url(name)
        assert node["figures"]["runtimes"] == ["runc"]
        assert node["draining"] is False


def test_a_creation_enters_the_directory_on_its_node_and_a_deletion_leaves_it(cluster):
    sid = cluster.create("n2", ALICE)
    status = cluster.status()
    assert status["n2"]["sandboxes"] == 1 and status["n1"]["sandboxes"] == 0, status
    cluster.delete("n2", ALICE, sid)
    assert cluster.status()["n2"]["sandboxes"] == 0


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
    assert cluster.status()["n1"]["sandboxes"] == 2
    for node, sid in made:
        cluster.delete(node, ALICE, sid)
    cluster.delete("n1", BOB, bob)


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
    sid = cluster.create("n2", ALICE)
    cluster.delete("n2", ALICE, sid)


def test_a_killed_node_is_down_within_its_lease_and_adopts_its_sandboxes_when_back(cluster):
    sid = cluster.create("n3", ALICE)
    status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/shell", ALICE,
                              {"command": "echo kept > /app/results/kept.txt"})
    assert status == 200 and ran["exit_code"] == 0, ran
    script("kill", "3")
    killed = time.monotonic()
    cluster.until("n3 down", lambda: cluster.status()["n3"]["state"] == "down", LEASE + 5)
    assert time.monotonic() - killed <= LEASE + 3
    status = cluster.status()
    assert status["n3"]["sandboxes"] == 1, "its sandboxes stay in the directory, unreachable"
    # Creations still succeed on the other nodes.
    other = cluster.create("n1", ALICE)
    script("start", "3")
    cluster.until("n3 up", lambda: cluster.status()["n3"]["state"] == "up", 30)
    status, ran = cluster.api("n3", "POST", f"/api/sandboxes/{sid}/shell", ALICE, {"command": "cat /app/results/kept.txt"})
    assert status == 200 and ran["stdout"] == "kept\n", ran
    cluster.delete("n3", ALICE, sid)
    cluster.delete("n1", ALICE, other)


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
    sid = cluster.create("n2", ALICE)
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
