"""Forks with the Python MCP SDK 2.3.0 against the real server and Docker:
a fork of a sandbox holding a DataFrame, a function of its own, an
installed package and links into the host's folders answers in the copy and then goes its own way, with what
could not be carried named; a fork from a snapshot; forks count against the
tenant's quota, all or none; the REST API. Another tenant's fork of a
sandbox or snapshot is refused in test_security.py."""

import asyncio

import pytest

from harness import Server, api, call, in_sandbox

QUOTA = 4


@pytest.fixture(scope="module")
def server():
    s = Server(MCP_SANDBOX_LIMITS_MAX_SANDBOXES_PER_TENANT=str(QUOTA)).start()
    yield s
    s.cleanup()


async def py(c, sid, code):
    ran = await call(c, "execute_python_code", sandbox_id=sid, code=code)
    assert ran["exit_code"] == 0, ran
    return ran["stdout"]


def test_forks_carry_a_dataframe_a_function_a_file_and_a_package(server):
    async def scenario(c, sid):
        inst = await call(c, "install_package_in_sandbox", sandbox_id=sid, package_name="pandas")
        # Up to five minutes: beside the integration tests the install
        # shares the host's two cores.
        for _ in range(300):
            if inst["status"] != "installing":
                break
            await asyncio.sleep(1)
            inst = await call(c, "check_package_installation_status", sandbox_id=sid, package_name="pandas")
        assert inst["status"] == "success", inst
        await py(
            c,
            sid,
            "import pandas as pd\n"
            "df = pd.DataFrame({'a': range(1000), 'b': [i * 0.5 for i in range(1000)]})\n"
            "def double(x):\n    return 2 * x\n"
            "same = df\n"
            "stream = (i for i in range(3))\n"
            "open('notes.txt', 'w').write('from the source')\n"
            # Links the server reads on the host, where they lead into the
            # host's own folders: a fork gets them as links, never their targets.
            "import os\nos.symlink('/root', 'host-root')\nos.symlink('/etc/shadow', 'shadow')",
        )
        forked = await call(c, "fork_sandbox", sandbox_id=sid, count=2)
        assert len(forked["forks"]) == 2 and forked["packages_copied"] is True, forked
        ids = [f["sandbox_id"] for f in forked["forks"]]
        try:
            for f in forked["forks"]:
                assert f["python"] == "partial", f
                assert [n["name"] for n in f["not_carried"]] == ["stream"], f
                assert "generator" in f["not_carried"][0]["reason"], f
                out = await py(c, f["sandbox_id"], "print(df.shape, double(21), same is df, open('notes.txt').read())")
                assert out == "(1000, 2) 42 True from the source\n", out
                links = "import os\nprint([(os.path.islink(n), os.readlink(n)) for n in ('host-root', 'shadow')])"
                assert await py(c, f["sandbox_id"], links) == "[(True, '/root'), (True, '/etc/shadow')]\n"
            # Each goes its own way; the source is untouched.
            await py(c, ids[0], "df = df.head(3)\nopen('notes.txt', 'w').write('changed')")
            assert await py(c, ids[1], "print(len(df), open('notes.txt').read())") == "1000 from the source\n"
            assert await py(c, sid, "print(len(df), open('notes.txt').read())") == "1000 from the source\n"
            listed = {s["sandbox_id"]: s for s in (await call(c, "list_sandboxes"))["sandboxes"]}
            for fork_id in ids:
                assert any(p["name"] == "pandas" for p in listed[fork_id]["installed_packages"]), listed[fork_id]
            for where in [sid, *ids]:
                left = await call(c, "execute_terminal_command", sandbox_id=where, command="ls -A /app/results")
                assert ".mcp-sandbox" not in left["stdout"].split(), f"nothing of the fork stays in {where}"
        finally:
            for fork_id in ids:
                await call(c, "delete_sandbox", sandbox_id=fork_id)
        # Removed in the background once the last fork is seeded.
        for _ in range(300):
            if not list((server.root / "state" / "forks").glob("*")):
                break
            await asyncio.sleep(0.1)
        assert not list((server.root / "state" / "forks").glob("*")), "the fork's copy on the host is gone"

    in_sandbox(server, scenario)


def test_a_fork_from_a_snapshot_and_the_quota(server):
    async def scenario(c, sid):
        await py(c, sid, "x = 'at the snapshot'")
        snap = await call(c, "snapshot_sandbox", sandbox_id=sid)
        await py(c, sid, "x = 'later'")
        over = await c.call_tool("fork_sandbox", {"sandbox_id": sid, "count": QUOTA})
        assert over.is_error and f"may have {QUOTA}, so {QUOTA} more do not fit" in over.content[0].text, over.content[0].text
        assert len((await call(c, "list_sandboxes"))["sandboxes"]) == 1, "all or none"
        bad = await c.call_tool("fork_sandbox", {"sandbox_id": sid, "count": 17})
        assert bad.is_error and "1 to 16" in bad.content[0].text, bad.content[0].text

        forked = await call(c, "fork_sandbox", sandbox_id=sid, snapshot_id=snap["snapshot_id"], count=QUOTA - 1)
        assert forked["snapshot_id"] == snap["snapshot_id"], forked
        for f in forked["forks"]:
            assert f["python"] == "carried", f
            assert await py(c, f["sandbox_id"], "print(x)") == "at the snapshot\n"
        assert await py(c, sid, "print(x)") == "later\n"
        full = await c.call_tool("fork_sandbox", {"sandbox_id": sid})
        assert full.is_error and "delete_sandbox" in full.content[0].text, full.content[0].text
        for f in forked["forks"]:
            await call(c, "delete_sandbox", sandbox_id=f["sandbox_id"])

    in_sandbox(server, scenario)


def test_forks_over_the_rest_api(server):
    status, created = api(server, "POST", "/api/sandboxes", "none", {})
    assert status == 201, created
    sid = created["sandbox_id"]
    api(server, "POST", f"/api/sandboxes/{sid}/python", "none", {"code": "y = 'kept'"})
    status, forked = api(server, "POST", f"/api/sandboxes/{sid}/forks", "none", {"count": 1})
    assert status == 201 and forked["forks"][0]["python"] == "carried", forked
    fork_id = forked["forks"][0]["sandbox_id"]
    status, ran = api(server, "POST", f"/api/sandboxes/{fork_id}/python", "none", {"code": "print(y)"})
    assert ran["stdout"] == "kept\n", ran
    status, err = api(server, "POST", f"/api/sandboxes/{sid}/forks", "none", {"count": 0})
    assert status == 400, err
    for gone in (fork_id, sid):
        assert api(server, "DELETE", f"/api/sandboxes/{gone}", "none")[0] == 200
