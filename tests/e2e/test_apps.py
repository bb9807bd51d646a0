"""The sandbox view as an MCP App, in a real host: the ext-apps SDK's
AppBridge (bundled by esbuild) in Debian's headless Chromium loads the
`ui://` resource read from the real server, hands it a run's input and
result, and forwards the view's tools/call to the server over MCP with the
host's session. The view shows the run's plot and the sandbox's files,
packages and calls; a file clicked in the view is read through the host;
another tenant's sandbox id in the view's request is refused."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from harness import PNG_CODE, ROOT, Server, Session, new_key

ALICE, ALICE_SHA = new_key("alice")
BOB, BOB_SHA = new_key("bob")
APPS = {"extensions": {"io.modelcontextprotocol/ui": {"mimeTypes": ["text/html;profile=mcp-app"]}}}
VIEW = "ui://mcp-sandbox/sandbox-view"
HOST = Path(os.environ.get("SANDBOX_TEST_CACHE", "/var/cache/mcp-sandbox-test")) / "app-host"


@pytest.fixture(scope="module")
def server():
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, {{name = "bob", key_sha256 = "{BOB_SHA}"}}]',
    ).start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def host_bundle(tmp_path_factory):
    """The test host, bundled with the SDK that scripts/e2e installed."""
    out = tmp_path_factory.mktemp("app-host") / "host.bundle.js"
    subprocess.run(
        [str(HOST / "node_modules/.bin/esbuild"), str(ROOT / "tests/e2e/app_host/host.js"), "--bundle",
         "--format=esm", "--platform=browser", "--log-level=warning", f"--outfile={out}"],
        env={**os.environ, "NODE_PATH": str(HOST / "node_modules")},
        check=True,
    )
    return out.read_text()


def structured(result):
    assert not result.get("isError"), result
    return result["structuredContent"]


def open_view(browser, bundle, session, html, tool_input, tool_result):
    """A page hosting the view; the tools its view called, as the host forwarded them."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append("a dialog opened: " + d.message), d.dismiss()))
    page.expose_function("callTool", lambda name, arguments: session.request(
        "tools/call", {"name": name, "arguments": arguments})["result"])
    page.add_script_tag(content=bundle, type="module")
    page.wait_for_function("window.runHost !== undefined")
    page.evaluate("([html, input, result]) => window.runHost(html, input, result)", [html, tool_input, tool_result])
    return page, errors


def forwarded(page):
    return [entry[1] for entry in page.evaluate("window.hostLog") if entry[0] == "tools/call"]


def test_only_a_client_of_mcp_apps_is_offered_the_view(server):
    plain = Session(server, ALICE, {})
    tools = plain.request("tools/list", {})["result"]["tools"]
    assert all("_meta" not in t or "ui" not in t["_meta"] for t in tools)
    assert "view_sandbox" not in {t["name"] for t in tools}
    assert plain.request("resources/list", {})["result"]["resources"] == []
    sid = structured(plain.call("create_sandbox"))["sandbox_id"]
    hidden = plain.request("tools/call", {"name": "view_sandbox", "arguments": {"sandbox_id": sid}})
    assert "error" in hidden or hidden["result"].get("isError"), hidden
    structured(plain.call("delete_sandbox", sandbox_id=sid))

    host = Session(server, ALICE, APPS)
    tools = {t["name"]: t for t in host.request("tools/list", {})["result"]["tools"]}
    for name in ("execute_python_code", "list_files", "read_file"):
        assert tools[name]["_meta"]["ui"]["resourceUri"] == VIEW, name
        assert tools[name]["_meta"]["ui/resourceUri"] == VIEW
    assert "_meta" not in tools["create_sandbox"]
    assert tools["view_sandbox"]["_meta"]["ui"]["visibility"] == ["app"]
    (listed,) = host.request("resources/list", {})["result"]["resources"]
    assert listed["uri"] == VIEW and listed["mimeType"] == "text/html;profile=mcp-app"
    (content,) = host.request("resources/read", {"uri": VIEW})["result"]["contents"]
    assert content["mimeType"] == "text/html;profile=mcp-app" and content["text"].startswith("<!doctype html>")


def test_the_view_shows_a_run_and_calls_tools_through_the_host(server, host_bundle, browser):
    alice = Session(server, ALICE, APPS)
    html = alice.request("resources/read", {"uri": VIEW})["result"]["contents"][0]["text"]
    sid = structured(alice.call("create_sandbox", name="viewed"))["sandbox_id"]
    structured(alice.call("write_file", sandbox_id=sid, path="notes.txt", content="hello from the sandbox <b>not bold</b>"))
    installed = structured(alice.call("install_package_in_sandbox", sandbox_id=sid, package_name="six"))
    for _ in range(120):
        if installed["status"] != "installing":
            break
        time.sleep(1)
        installed = structured(alice.call("check_package_installation_status", sandbox_id=sid, package_name="six"))
    assert installed["status"] == "success", installed
    # Names and output of the sandbox's own choosing, markup included.
    code = PNG_CODE + "\nprint('drew the plot <i>markup</i>')\nopen('<img src=x onerror=alert(1)>.txt', 'w').write('x')"
    ran = alice.call("execute_python_code", sandbox_id=sid, code=code)
    assert any(c["type"] == "image" for c in ran["content"]), "the run's image comes inline"

    page, errors = open_view(browser, host_bundle, alice, html, {"sandbox_id": sid, "code": code}, ran)
    frame = page.frame_locator("iframe")
    expect(frame.locator("#stdout")).to_contain_text("drew the plot <i>markup</i>")
    assert frame.locator("#stdout i").count() == 0
    plot = frame.locator("#images img")
    expect(plot).to_have_count(1)
    assert plot.evaluate("img => img.naturalWidth") == 64, "the plot is decoded, not a broken image"
    # What the view asked the server for through the host.
    expect(frame.locator("#title")).to_have_text("viewed")
    expect(frame.locator("#files button[data-path='/app/results/plot.png']")).to_be_visible()
    expect(frame.locator("#history")).to_contain_text("python")
    expect(frame.locator("#files button", has_text="<img src=x onerror=alert(1)>.txt")).to_have_count(1)
    assert frame.locator("#files img").count() == 0
    expect(frame.locator("#packages")).to_contain_text("six ")
    assert forwarded(page) == ["view_sandbox"]

    # A button in the view reads a file through the host; sandbox text stays text.
    frame.locator("#files button[data-path='/app/results/notes.txt']").click()
    expect(frame.locator("#preview-text")).to_have_text("hello from the sandbox <b>not bold</b>")
    assert frame.locator("#preview-text b").count() == 0
    assert forwarded(page) == ["view_sandbox", "read_file"]
    frame.locator("#files tr", has_text="plot.png").get_by_role("button", name="open").click()
    page.wait_for_function("window.hostLog.some(e => e[0] === 'open-link')")
    (url,) = [e[1] for e in page.evaluate("window.hostLog") if e[0] == "open-link"]
    assert url.startswith(server.url) and "plot.png" in url
    page.screenshot(path=str(ROOT / "target" / "e2e-artifacts" / "app-view.png"), full_page=True)
    assert errors == [], errors
    page.close()

    # Beside a listing (no run), the view shows the newest images instead.
    listing = alice.call("list_files", sandbox_id=sid)
    page, errors = open_view(browser, host_bundle, alice, html, {"sandbox_id": sid}, listing)
    frame = page.frame_locator("iframe")
    newest = frame.locator("#newest img")
    expect(newest).to_have_count(1)
    assert newest.evaluate("img => img.naturalWidth") == 64
    assert frame.locator("#run").is_hidden()
    assert forwarded(page) == ["view_sandbox", "read_file"]
    assert errors == [], errors
    page.close()
    structured(alice.call("delete_sandbox", sandbox_id=sid))


def test_another_tenants_sandbox_in_the_views_request_is_refused(server, host_bundle, browser):
    bob = Session(server, BOB, APPS)
    theirs = structured(bob.call("create_sandbox", name="bobs"))["sandbox_id"]
    structured(bob.call("write_file", sandbox_id=theirs, path="secret-plan.txt", content="bob's"))
    alice = Session(server, ALICE, APPS)
    html = alice.request("resources/read", {"uri": VIEW})["result"]["contents"][0]["text"]
    # A result and input naming bob's sandbox, handed to alice's host.
    result = {"content": [{"type": "text", "text": json.dumps({"entries": []})}], "structuredContent": {"entries": []}}
    page, _ = open_view(browser, host_bundle, alice, html, {"sandbox_id": theirs}, result)
    frame = page.frame_locator("iframe")
    expect(frame.locator("#error")).to_contain_text("not found")
    assert forwarded(page) == ["view_sandbox"]
    assert "secret-plan" not in frame.locator("body").inner_text()
    expect(frame.locator("#title")).to_have_text("Sandbox")
    page.close()
    structured(bob.call("delete_sandbox", sandbox_id=theirs))
