"""Snapshots with the Python MCP SDK 2.3.0 against the real server and
Docker: a variable, a file and an installed package come back after all
three were changed or deleted; the Python state comes back after the worker
crashed; the bound per sandbox; a deleted snapshot's parked Python copy and
host copy are gone, and so are all of a deleted sandbox's; the REST API.
Another tenant's sandbox id is covered with the other tools in
test_security.py."""

from harness import api, call, in_sandbox


async def py(c, sid, code):
    return (await call(c, "execute_python_code", sandbox_id=sid, code=code))["stdout"]


async def sh(c, sid, command):
    return await call(c, "execute_terminal_command", sandbox_id=sid, command=command)


def test_a_restore_brings_back_a_variable_a_file_and_a_package(server):
    async def scenario(c, sid):
        inst = await call(c, "install_package_in_sandbox", sandbox_id=sid, package_name="six")
        assert inst["status"] in ("success", "installing"), inst
        await py(c, sid, "import six\nx = 41\nopen('data.txt', 'w').write('precious')")
        snap = await call(c, "snapshot_sandbox", sandbox_id=sid, label="before the mess")
        assert snap["python"] == "saved" and snap["packages_saved"] is True, snap
        assert snap["label"] == "before the mess" and snap["files"] > 0, snap

        await py(c, sid, "x = 0\nimport os\nos.remove('data.txt')\nopen('junk.txt', 'w').write('j')")
        # The package is removed as an uninstall would (the venv has no pip).
        await sh(c, sid, "rm -rf /app/.venv/lib/python3*/site-packages/six*")
        assert "No module named" in (await sh(c, sid, "/app/.venv/bin/python -c 'import six'"))["stderr"]

        restored = await call(c, "restore_snapshot", sandbox_id=sid, snapshot_id=snap["snapshot_id"])
        assert restored["python"] == "restored" and restored["packages_restored"] is True, restored
        assert await py(c, sid, "print(x)") == "41\n"
        assert await py(c, sid, "print(open('data.txt').read())") == "precious\n"
        assert (await sh(c, sid, "ls /app/results"))["stdout"] == "data.txt\n"
        imported = await sh(c, sid, "/app/.venv/bin/python -c 'import six; print(six.__name__)'")
        assert imported["stdout"] == "six\n", imported
        listed = await call(c, "list_sandboxes")
        [mine] = [s for s in listed["sandboxes"] if s["sandbox_id"] == sid]
        assert any(p["name"] == "six" for p in mine["installed_packages"]), mine
        assert mine["snapshots"]["count"] == 1, mine

    in_sandbox(server, scenario)


def test_a_restore_after_the_worker_crashed_brings_the_python_state_back(server):
    async def scenario(c, sid):
        await py(c, sid, "data = list(range(100_000))\nfrom collections import Counter\nseen = Counter('mississippi')")
        snap = await call(c, "snapshot_sandbox", sandbox_id=sid)
        crashed = await call(c, "execute_python_code", sandbox_id=sid, code="import os; os._exit(1)")
        assert crashed["exit_code"] != 0
        gone = await call(c, "execute_python_code", sandbox_id=sid, code="print(len(data))")
        assert "NameError" in gone["stderr"], gone
        await call(c, "restore_snapshot", sandbox_id=sid, snapshot_id=snap["snapshot_id"])
        assert await py(c, sid, "print(len(data), seen['s'])") == "100000 4\n"
        # Restored twice from one snapshot, after the restored worker ran on.
        await py(c, sid, "data.clear()")
        await call(c, "restore_snapshot", sandbox_id=sid, snapshot_id=snap["snapshot_id"])
        assert await py(c, sid, "print(len(data))") == "100000\n"

    in_sandbox(server, scenario)


def test_snapshots_are_bounded_and_go_with_their_sandbox(server):
    host = {}

    async def scenario(c, sid):
        await py(c, sid, "x = 1")
        snaps = [await call(c, "snapshot_sandbox", sandbox_id=sid, label=f"s{i}") for i in range(3)]
        parked = lambda: sh(c, sid, "ls /tmp/.mcp-agent/parked | wc -l")  # noqa: E731
        assert (await parked())["stdout"].strip() == "3"
        over = await c.call_tool("snapshot_sandbox", {"sandbox_id": sid})
        assert over.is_error and "delete_snapshot" in over.content[0].text, over.content[0].text
        listed = await call(c, "list_snapshots", sandbox_id=sid)
        assert [s["label"] for s in listed["snapshots"]] == ["s0", "s1", "s2"] and listed["limit"] == 3

        await call(c, "delete_snapshot", sandbox_id=sid, snapshot_id=snaps[0]["snapshot_id"])
        assert (await parked())["stdout"].strip() == "2", "the deleted snapshot's Python copy ended"
        host["dir"] = server.root / "state" / "snapshots" / sid
        assert not (host["dir"] / snaps[0]["snapshot_id"]).exists()
        assert (host["dir"] / snaps[1]["snapshot_id"] / "meta.json").is_file()
        assert [p for p in (host["dir"] / "trees").iterdir() if p.is_dir()], "the folders the others hold stay"
        missing = await c.call_tool("restore_snapshot", {"sandbox_id": sid, "snapshot_id": snaps[0]["snapshot_id"]})
        assert missing.is_error and "list_snapshots" in missing.content[0].text
        bad = await c.call_tool("restore_snapshot", {"sandbox_id": sid, "snapshot_id": "../../etc"})
        assert bad.is_error and "not a snapshot id" in bad.content[0].text

    in_sandbox(server, scenario)
    assert not host["dir"].exists(), "a deleted sandbox's snapshots are removed"


def test_snapshots_over_the_rest_api(server):
    status, created = api(server, "POST", "/api/sandboxes", "none", {})
    assert status == 201, created
    sid = created["sandbox_id"]
    status, ran = api(server, "POST", f"/api/sandboxes/{sid}/python", "none", {"code": "y = 'kept'"})
    assert status == 200 and ran["exit_code"] == 0, ran
    status, snap = api(server, "POST", f"/api/sandboxes/{sid}/snapshots", "none", {"label": "api"})
    assert status == 201 and snap["label"] == "api", snap
    api(server, "POST", f"/api/sandboxes/{sid}/python", "none", {"code": "y = 'changed'"})
    status, listed = api(server, "GET", f"/api/sandboxes/{sid}/snapshots", "none")
    assert status == 200 and [s["snapshot_id"] for s in listed["snapshots"]] == [snap["snapshot_id"]]
    path = f"/api/sandboxes/{sid}/snapshots/{snap['snapshot_id']}"
    status, restored = api(server, "POST", path + "/restore", "none")
    assert status == 200 and restored["python"] == "restored", restored
    status, ran = api(server, "POST", f"/api/sandboxes/{sid}/python", "none", {"code": "print(y)"})
    assert ran["stdout"] == "kept\n", ran
    assert api(server, "DELETE", path, "none")[0] == 200
    assert api(server, "DELETE", path, "none")[0] == 404
    assert api(server, "DELETE", f"/api/sandboxes/{sid}", "none")[0] == 200
