"""Long calls as tasks (the io.modelcontextprotocol/tasks extension) against
the real server: raw JSON-RPC over Streamable HTTP, since the pinned Python
SDK has no tasks client. A `time.sleep(12)` run becomes a task, shows its output so far in the
status message and is polled to completion through tasks/get; a
second run is cancelled and its sandbox runs the next call; another tenant
polling or cancelling the task is told it does not exist; a client without
the extension gets the plain result; a tenant at its cap of tasks gets the
plain result too, and a fetched result frees its place."""

import time

import pytest

from harness import Server, Session, new_key

ALICE, ALICE_SHA = new_key("alice")
BOB, BOB_SHA = new_key("bob")
TASKS = {"extensions": {"io.modelcontextprotocol/tasks": {}}}
PER_TENANT = 3


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=(
            f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, {{name = "bob", key_sha256 = "{BOB_SHA}"}}]'
        ),
        MCP_SANDBOX_TASKS_THRESHOLD_MS="1000",
        MCP_SANDBOX_TASKS_TTL_SECONDS="600",
        MCP_SANDBOX_TASKS_MAX_PER_TENANT=str(PER_TENANT),
    ).start()
    yield s
    s.cleanup()


def structured(result):
    assert not result.get("isError"), result
    return result["structuredContent"]


def poll(session, task_id, deadline):
    """The task's state once terminal, and the status messages seen on the way."""
    messages = []
    while time.time() < deadline:
        task = session.get_task(task_id)["result"]
        if task["status"] in ("completed", "failed", "cancelled"):
            return task, messages
        messages.append(task.get("statusMessage") or "")
        time.sleep(task.get("pollIntervalMs", 1000) / 1000)
    raise AssertionError(f"task {task_id} did not finish")


def test_long_calls_become_tasks_for_their_tenant_only(server):
    alice = Session(server, ALICE, TASKS)
    bob = Session(server, BOB, TASKS)
    plain = Session(server, ALICE, {})
    first = structured(alice.call("create_sandbox", name="slow"))["sandbox_id"]
    second = structured(alice.call("create_sandbox", name="cancelled"))["sandbox_id"]

    # Within the threshold a tasks client gets the plain result too.
    assert structured(alice.call("execute_python_code", sandbox_id=first, code="print(6 * 7)"))["stdout"] == "42\n"

    started = time.time()
    slow = alice.call("execute_python_code", sandbox_id=first, timeout_seconds=150,
                      code="import time\nprint('started', flush=True)\ntime.sleep(12)\nprint('done')")
    assert slow["resultType"] == "task", slow
    slow_id = slow["taskId"]
    assert slow["status"] == "working" and slow["ttlMs"] == 600_000
    # While it runs, its status message is the output so far.
    messages = []
    while not any("started" in m for m in messages) and time.time() < started + 10:
        task = alice.get_task(slow_id)["result"]
        assert task["status"] == "working", task
        messages.append(task.get("statusMessage") or "")
        time.sleep(0.5)
    assert any("started" in m for m in messages), messages

    # Another tenant cannot read or cancel it: the id is unknown to it.
    for method in ("tasks/get", "tasks/cancel"):
        refused = bob.request(method, {"taskId": slow_id})
        assert "error" in refused and "unknown task" in refused["error"]["message"], refused

    # A second run becomes a task, is cancelled, and its sandbox keeps working.
    doomed = alice.call("execute_terminal_command", sandbox_id=second, command="sleep 60; echo never")
    assert doomed["resultType"] == "task", doomed
    doomed_id = doomed["taskId"]
    assert "result" in alice.request("tasks/cancel", {"taskId": doomed_id})
    cancelled, _ = poll(alice, doomed_id, time.time() + 30)
    assert cancelled["status"] == "cancelled", cancelled
    after = structured(alice.call("execute_terminal_command", sandbox_id=second, command="echo alive"))
    assert after["stdout"] == "alive\n" and after["exit_code"] == 0

    # A client without the extension keeps the plain result, past the threshold too.
    ran = structured(plain.call("execute_terminal_command", sandbox_id=second, command="sleep 2; echo plain"))
    assert ran["stdout"] == "plain\n"

    # The tenant's cap counts running tasks and finished ones not yet fetched
    # (the cancelled one was: its place is free). Two more fill it, and the
    # next long call is not refused: it answers its plain result.
    third = alice.call("execute_terminal_command", sandbox_id=second, command="sleep 2")
    fourth = alice.call("execute_terminal_command", sandbox_id=second, command="sleep 2")
    assert third["resultType"] == "task" and fourth["resultType"] == "task", (third, fourth)
    at_cap = alice.call("execute_terminal_command", sandbox_id=second, command="sleep 2; echo at-cap")
    assert "taskId" not in at_cap and structured(at_cap)["stdout"] == "at-cap\n", at_cap
    # A fetched result frees its place: the next long call is a task again.
    finished, _ = poll(alice, third["taskId"], time.time() + 60)
    assert finished["status"] == "completed", finished
    again = alice.call("execute_terminal_command", sandbox_id=second, command="sleep 2")
    assert again["resultType"] == "task", again
    bobs = structured(bob.call("create_sandbox"))["sandbox_id"]
    assert structured(bob.call("execute_python_code", sandbox_id=bobs, code="print('bob')"))["stdout"] == "bob\n"

    # The slow run is polled to its end (a 90 s one, past the clients' cuts,
    # is polled on the paused clock in src/tests/tasks.rs).
    done, _ = poll(alice, slow_id, started + 140)
    assert done["status"] == "completed", done
    result = done["result"]
    assert result["structuredContent"]["stdout"] == "started\ndone\n", result
    assert time.time() - started >= 12
    # The result survives: polled again, it is still there.
    assert alice.get_task(slow_id)["result"]["result"] == result
