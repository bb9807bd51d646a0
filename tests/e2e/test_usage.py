"""Usage by tenant with the real binary and engine: a run that keeps a CPU
busy is billed to its tenant from the container's own counters, as its
receipt says; the figures
survive a restart of the server and the sandbox's deletion; the operator's
`mcp-sandbox usage` command prints the same figures as the REST API."""

import csv
import io
import subprocess
import time

import pytest
from playwright.sync_api import expect

from harness import BINARY, Server, api, new_key

ALICE, ALICE_SHA = new_key("alice")
OPS, OPS_SHA = new_key("ops")


@pytest.fixture(scope="module")
def server():
    keys = f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, {{name = "ops", key_sha256 = "{OPS_SHA}"}}]'
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=keys,
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_USAGE_SAMPLE_SECONDS="5",
    ).start()
    yield s
    s.cleanup()


def cpu(server, key, query=""):
    status, report = api(server, "GET", f"/api/usage{query}", key)
    assert status == 200, report
    return sum(r["cpu_seconds"] for r in report["rows"] if r["tenant"] == "alice")


def cli(server, *args):
    out = subprocess.run(
        [str(BINARY), "usage", "--address", f"127.0.0.1:{server.port}", "--key", OPS, *args],
        cwd=server.root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_busy_run_is_billed_and_kept_across_a_restart_and_the_cli_agrees(server, browser):
    status, made = api(server, "POST", "/api/sandboxes", ALICE, {})
    assert status == 201, made
    sid = made["sandbox_id"]
    code = "import time\nt = time.process_time()\nwhile time.process_time() - t < 3: pass"
    status, ran = api(server, "POST", f"/api/sandboxes/{sid}/python", ALICE, {"code": code, "timeout_seconds": 120})
    assert status == 200, ran
    # The run's receipt, from the counters the bill is made of.
    receipt = ran["receipt"]["cpu_seconds"]
    assert 2.9 <= receipt < 6, ran["receipt"]
    deadline = time.time() + 40
    while cpu(server, ALICE) < receipt - 0.05:
        assert time.time() < deadline, "the run's CPU was never sampled"
        time.sleep(1)
    used = cpu(server, ALICE)
    # The bill holds the receipt, and little more: the sandbox's start and idle agent.
    assert used < receipt + 1.5, (used, receipt)

    # The web UI's usage page shows the same, charts and rows, with no
    # complaint from the page's content security policy.
    page = browser.new_context().new_page()
    complaints = []
    # (The browser's own favicon requests get 401 and are not the page's.)
    page.on("console", lambda m: complaints.append(m.text) if "Content Security Policy" in m.text else None)
    page.goto(server.url + "/ui")
    page.fill("#key", ALICE)
    page.click("#sign-in button[type=submit]")
    page.click("#usage-link")
    expect(page.locator("#usage[data-loaded=true]")).to_have_count(1)
    expect(page.locator("#usage tbody tr[data-tenant=alice]")).not_to_have_count(0)
    shown = sum(float(t) for t in page.locator("#usage tbody td.cpu").all_inner_texts())
    assert abs(shown * 3600 - cpu(server, ALICE)) < 3600 * 0.0002 + 5, shown
    # A bar for each day of the month so far, today's among them; a count
    # shows as one, and the header's link reads on the dark header.
    today = time.strftime("%Y-%m-%d", time.gmtime())
    expect(page.locator(".chart[data-measure='CPU hours'] .bar")).to_have_count(int(today[-2:]))
    expect(page.locator(f".chart[data-measure='CPU hours'] .bar[data-day='{today}']")).to_have_count(1)
    calls = page.locator(".chart[data-measure='Calls'] figcaption").inner_text()
    assert calls.removeprefix("Calls: ").isdigit(), calls
    assert "What your sandboxes used this month" in page.locator("#usage-page").inner_text()
    link = page.locator("#usage-link").evaluate("a => getComputedStyle(a).color")
    assert link == "rgb(203, 213, 225)", link
    page.context.close()
    assert complaints == [], complaints

    # The operator's command: the same figures, as CSV and as a table.
    rows = list(csv.DictReader(io.StringIO(cli(server, "--csv", "--tenant", "alice"))))
    assert rows and all(r["tenant"] == "alice" for r in rows), rows
    assert abs(sum(float(r["cpu_seconds"]) for r in rows) - cpu(server, OPS, "?tenant=alice")) < 0.01
    assert "alice" in cli(server, "--granularity", "hour")

    # Deleted, and the server restarted: what the sandbox used stays.
    assert api(server, "DELETE", f"/api/sandboxes/{sid}", ALICE)[0] == 200
    before = cpu(server, ALICE)
    server.stop()
    server.start()
    assert cpu(server, ALICE) >= before - 0.001
    assert cpu(server, ALICE) >= used
