"""The web UI in headless Chromium (Debian's package, driven by Playwright)
against the real server and Docker: signing in and out, the sandbox pages,
tenancy in the browser, CSRF, and the REST API's limits. Screenshots of the
main pages are kept under $SANDBOX_TEST_ARTIFACTS and must not be blank."""

import os
import struct
import tempfile
import urllib.request
import zlib
from pathlib import Path

import pytest
from playwright.sync_api import expect

from harness import PNG_CODE, ROOT, Server, api, get, new_key

ALICE, ALICE_SHA = new_key("alice")
BOB, BOB_SHA = new_key("bob")
OPS, OPS_SHA = new_key("ops")
REVOKED, REVOKED_SHA = new_key("gone")
ARTIFACTS = Path(os.environ.get("SANDBOX_TEST_ARTIFACTS", ROOT / "target" / "e2e-artifacts"))
@pytest.fixture(scope="module")
def server():
    keys = (
        f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}, '
        f'{{name = "bob", key_sha256 = "{BOB_SHA}"}}, '
        f'{{name = "ops", key_sha256 = "{OPS_SHA}"}}, '
        f'{{name = "gone", key_sha256 = "{REVOKED_SHA}", revoked = true}}]'
    )
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=keys,
        MCP_SANDBOX_AUTH_ADMIN_KEYS='["ops"]',
        MCP_SANDBOX_UPLOADS_MAX_UPLOAD_MB="1",
        MCP_SANDBOX_GUEST_ENABLED="true",
        MCP_SANDBOX_GUEST_KEYS_PER_IP_PER_HOUR="2",
    ).start()
    yield s
    s.cleanup()


def sign_in(browser, server, key, **context_options):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **context_options)
    page = context.new_page()
    page.goto(server.url + "/ui")
    page.fill("#key", key)
    page.click("#sign-in button[type=submit]")
    return context, page


def distinct_colours(png: bytes) -> int:
    """Distinct pixel values of an 8-bit RGB(A) PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos : pos + 8])
        data = png[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    previous, colours = bytearray(stride), set()
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if y % 4 == 0:
            colours.update(bytes(line[i : i + bpp]) for i in range(0, stride, bpp * 2))
        previous = line
    return len(colours)


def screenshot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    png = page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    assert distinct_colours(png) >= 8, f"screenshot {name} looks blank"


def test_a_wrong_or_revoked_key_is_refused(server, browser):
    context = browser.new_context()
    page = context.new_page()
    page.goto(server.url + "/ui")
    expect(page.locator("#sign-in")).to_be_visible()
    screenshot(page, "sign-in")
    for key, message in [("msk_not-a-key-at-all-0123456789", "Unknown API key"), (REVOKED, "revoked")]:
        page.fill("#key", key)
        with page.expect_response(lambda r: r.url.endswith("/ui/login")) as response:
            page.click("#sign-in button[type=submit]")
        assert response.value.status == 401
        expect(page.locator("#sign-in-error")).to_contain_text(message)
    assert context.cookies() == [], "no session for a refused key"
    # The API behind the UI refuses too, and without a key at all.
    status, _, _ = get(server.url + "/api/sandboxes")
    assert status == 401
    context.close()


def test_sign_in_works_without_javascript(server, browser):
    context, page = sign_in(browser, server, ALICE, java_script_enabled=False)
    expect(page.locator("h1")).to_have_text("Sandboxes")
    expect(page.locator("#who")).to_have_text("alice")
    cookie = next(c for c in context.cookies() if c["name"] == "mcp_sandbox_key")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    context.close()


def test_a_sandbox_from_creation_to_deletion(server, browser):
    context, page = sign_in(browser, server, ALICE)
    expect(page.locator("#who")).to_have_text("alice")
    page.fill("#create-name", "ui sandbox")
    page.click("#create-form button")
    row = page.locator("#sandboxes tbody tr", has_text="ui sandbox")
    expect(row).to_have_count(1)
    expect(row.locator(".status")).to_have_text("running")
    screenshot(page, "sandboxes")
    sandbox_id = row.get_attribute("data-id")

    row.locator("a.name").click()
    expect(page.locator("#sandbox-name")).to_have_text("ui sandbox")

    # Python: output and exit code, and the PNG it writes is previewed.
    page.fill("#code", PNG_CODE)
    page.click("#python-form button")
    expect(page.locator("#python-exit")).to_have_text("0", timeout=60_000)
    expect(page.locator("#python-stdout")).to_contain_text("wrote")
    preview = page.locator('#files tr[data-path="plot.png"] img.preview')
    expect(preview).to_have_count(1)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=preview.element_handle())
    assert preview.evaluate("img => img.naturalWidth") == 64
    # ... and shown under the run that made it.
    shown = page.locator("#python-outputs img.shown")
    expect(shown).to_have_count(1)
    page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=shown.element_handle())
    assert shown.evaluate("img => img.naturalWidth") == 64

    # The last expression's value and display(), in order, as text (HTML too).
    page.fill("#code", "class H:\n    def _repr_html_(self): return '<b id=\"injected\">h</b>'\ndisplay(H())\n6 * 7")
    page.click("#python-form button")
    expect(page.locator("#python-outputs pre.shown")).to_have_count(2)
    expect(page.locator("#python-outputs pre.shown.html")).to_have_text('<b id="injected">h</b>')
    expect(page.locator("#python-outputs pre.shown.text")).to_have_text("42")
    expect(page.locator("#injected")).to_have_count(0)

    # A failing program shows its stderr and exit code.
    page.fill("#code", "import sys\nprint('bad', file=sys.stderr)\nsys.exit(3)")
    page.click("#python-form button")
    expect(page.locator("#python-exit")).to_have_text("3")
    expect(page.locator("#python-stderr")).to_contain_text("bad")

    # Shell.
    page.fill("#command", "echo from-shell && ls")
    page.click("#shell-form button")
    expect(page.locator("#shell-exit")).to_have_text("0")
    expect(page.locator("#shell-stdout")).to_contain_text("from-shell")

    # Upload from the browser: the file is listed and its bytes arrive.
    with tempfile.TemporaryDirectory() as folder:
        upload = Path(folder) / "données 1.csv"
        upload.write_text("a,b\n1,2\n")
        page.set_input_files("#file", str(upload))
        page.click("#upload-form button")
        expect(page.locator("#upload-status")).to_contain_text("/app/results/données 1.csv")
    expect(page.locator('#files tr[data-path="données 1.csv"]')).to_have_count(1)
    status, ran = api(server, "POST", f"/api/sandboxes/{sandbox_id}/shell", ALICE, {"command": "cat 'données 1.csv'"})
    assert status == 200 and ran["stdout"] == "a,b\n1,2\n"

    # Install: the status changes until success.
    page.fill("#package", "six")
    page.click("#install-form button")
    expect(page.locator("#install-status")).to_have_text("success", timeout=180_000)

    # History shows the calls, newest first.
    history = page.locator("#history tbody tr")
    expect(history.first).to_contain_text("install")
    kinds = history.locator("td:nth-child(2)").all_inner_texts()
    assert {"python", "shell", "upload", "install"} <= set(kinds), kinds
    screenshot(page, "sandbox")

    # Snapshots: take one, change Python and a file, restore from the list.
    page.fill("#code", "kept = 'before'")
    page.click("#python-form button")
    expect(page.locator("#python-exit")).to_have_text("0")
    page.fill("#snapshot-label", "ui snapshot")
    page.click("#snapshot-form button")
    snap = page.locator("#snapshots tbody tr", has_text="ui snapshot")
    expect(snap).to_have_count(1)
    expect(snap.locator("td:nth-child(3)")).to_have_text("saved")
    page.fill("#code", "kept = 'after'\nimport os\nos.remove('plot.png')")
    page.click("#python-form button")
    expect(page.locator('#files tr[data-path="plot.png"]')).to_have_count(0)
    snap.locator('button[data-action="restore"]').click()
    expect(page.locator("#snapshot-status")).to_contain_text("restored: Python restored")
    expect(page.locator('#files tr[data-path="plot.png"]')).to_have_count(1)
    page.fill("#code", "print(kept)")
    page.click("#python-form button")
    expect(page.locator("#python-stdout")).to_contain_text("before")
    # A fork of the snapshot, linked, holds its Python state; it is deleted from the API.
    snap.locator('button[data-action="fork"]').click()
    expect(page.locator("#snapshot-status")).to_contain_text("(Python carried)")
    fork_id = page.locator("#fork-link").get_attribute("href").rsplit("/", 1)[1]
    ran = api(server, "POST", f"/api/sandboxes/{fork_id}/python", ALICE, {"code": "print(kept)"})[1]
    assert ran["stdout"] == "before\n", ran
    assert api(server, "DELETE", f"/api/sandboxes/{fork_id}", ALICE)[0] == 200
    snap.locator('button[data-action="delete"]').click()
    expect(page.locator("#snapshots tbody tr")).to_have_count(0)

    # Restart keeps files; then delete.
    page.click("#restart")
    expect(page.locator('#info dd:has(.status) .status')).to_have_text("running")
    page.click("#delete")
    page.wait_for_url(server.url + "/ui")
    expect(page.locator("#sandboxes")).to_have_attribute("data-loaded", "true")
    expect(page.locator(f'#sandboxes tr[data-id="{sandbox_id}"]')).to_have_count(0)
    assert api(server, "GET", f"/api/sandboxes/{sandbox_id}", ALICE)[0] == 404
    context.close()


def test_tenants_see_only_their_own_and_admins_see_all(server, browser):
    status, created = api(server, "POST", "/api/sandboxes", ALICE, {"name": "alice private"})
    assert status == 201
    alice_id = created["sandbox_id"]
    try:
        context, page = sign_in(browser, server, BOB)
        expect(page.locator("#sandboxes")).to_have_attribute("data-loaded", "true")
        expect(page.locator(f'#sandboxes tr[data-id="{alice_id}"]')).to_have_count(0)
        assert "alice private" not in page.content()
        page.goto(f"{server.url}/ui/sandboxes/{alice_id}")
        expect(page.locator("#error")).to_contain_text("not found")
        assert "alice private" not in page.content()
        for method, path in [("GET", ""), ("GET", "/files"), ("DELETE", ""), ("POST", "/restart"), ("POST", "/forks")]:
            assert api(server, method, f"/api/sandboxes/{alice_id}{path}", BOB)[0] == 404
        context.close()

        context, page = sign_in(browser, server, OPS)
        expect(page.locator("#who")).to_contain_text("ops (administrator)")
        row = page.locator(f'#sandboxes tr[data-id="{alice_id}"]')
        expect(row.locator(".owner")).to_have_text("alice")
        screenshot(page, "sandboxes-admin")
        context.close()
    finally:
        api(server, "DELETE", f"/api/sandboxes/{alice_id}", ALICE)


def test_try_without_a_key(server, browser):
    """A visitor without a key gets a guest key of its own from the sign-in
    page, works in a sandbox of its own, and cannot have more than the
    address's share of guest keys."""
    guests = []
    for _ in range(2):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(server.url + "/ui")
        page.click("#try-as-guest")
        expect(page.locator("h1")).to_have_text("Sandboxes")
        expect(page.locator("#who")).to_contain_text("guest:")
        guests.append((context, page, page.locator("#who").inner_text()))
    (first, page, me), (second, other_page, other) = guests
    assert me != other, "each visitor is a tenant of its own"
    page.fill("#create-name", "guest sandbox")
    page.click("#create-form button")
    row = page.locator("#sandboxes tbody tr", has_text="guest sandbox")
    expect(row).to_have_count(1)
    expect(row.locator(".status")).to_have_text("running", timeout=60_000)
    screenshot(page, "sandboxes-guest")
    other_page.reload()
    expect(other_page.locator("#sandboxes")).to_have_attribute("data-loaded", "true")
    expect(other_page.locator("#sandboxes tbody tr", has_text="guest sandbox")).to_have_count(0)
    row.locator("a.name").click()
    page.fill("#code", "print(6*7)")
    page.click("#python-form button")
    expect(page.locator("#python-stdout")).to_contain_text("42")
    page.click("#delete")
    page.wait_for_url(server.url + "/ui")
    # This address has had its two keys for the hour.
    third = browser.new_context()
    refused = third.new_page()
    refused.goto(server.url + "/ui")
    with refused.expect_response(lambda r: r.url.endswith("/ui/guest")) as response:
        refused.click("#try-as-guest")
    assert response.value.status == 429
    expect(refused.locator("#sign-in-error")).to_contain_text("guest keys")
    for c in (first, second, third):
        c.close()


def test_session_requests_need_the_csrf_token(server, browser):
    context, page = sign_in(browser, server, BOB)
    expect(page.locator("#sandboxes")).to_have_attribute("data-loaded", "true")
    post = """async token => {
        const headers = {'Content-Type': 'application/json'};
        if (token !== null) headers['X-CSRF-Token'] = token;
        const r = await fetch('/api/sandboxes', {method: 'POST', headers, body: '{"name": "csrf"}'});
        return [r.status, await r.json()];
    }"""
    status, body = page.evaluate(post, None)
    assert status == 403 and "CSRF" in body["error"]
    status, _ = page.evaluate(post, "forged-token")
    assert status == 403
    token = page.locator('meta[name="csrf-token"]').get_attribute("content")
    status, body = page.evaluate(post, token)
    assert status == 201, body
    assert api(server, "DELETE", f"/api/sandboxes/{body['sandbox_id']}", BOB)[0] == 200
    # A page of another origin is refused outright.
    status, _, _ = get(server.url + "/api/sandboxes", {"Authorization": f"Bearer {BOB}", "Origin": "https://evil.example"})
    assert status == 403
    # Sign-out needs the token too, then the session is gone.
    page.click("#sign-out")
    expect(page.locator("#sign-in")).to_be_visible()
    assert [c for c in context.cookies() if c["name"] == "mcp_sandbox_key"] == []
    context.close()


def test_api_limits_and_bad_input(server):
    status, created = api(server, "POST", "/api/sandboxes", BOB, {"name": "limits"})
    assert status == 201
    sid = created["sandbox_id"]
    try:
        base = f"/api/sandboxes/{sid}"

        def upload(name, data, dest=None):
            query = "name=" + urllib.request.quote(name) + (f"&dest={urllib.request.quote(dest)}" if dest else "")
            req = urllib.request.Request(f"{server.url}{base}/files?{query}", data=data, method="POST")
            req.add_header("Authorization", f"Bearer {BOB}")
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code

        assert upload("ok.bin", b"x" * 1000) == 200
        assert upload("big.bin", b"x" * (1024 * 1024 + 1)) == 413, "uploads.max_upload_mb = 1"
        for bad in ["../escape", "a/b", "..", ""]:
            assert upload(bad, b"x") == 400, bad
        assert upload("x.txt", b"x", dest="/etc") == 400
        assert upload("x.txt", b"x", dest="/app/results/../../etc") == 400
        assert api(server, "POST", f"{base}/python", BOB, {"cod": "1"})[0] == 422
        assert api(server, "POST", f"{base}/python", BOB, {"code": "1", "timeout_seconds": 0})[0] == 400
        assert api(server, "POST", f"{base}/python", BOB, {"code": "x" * (1024 * 1024 + 1)})[0] == 400
        assert api(server, "POST", f"{base}/packages", BOB, {"package_name": "six; rm -rf /"})[0] == 400
        assert api(server, "GET", "/api/sandboxes/not-an-id", BOB)[0] == 400
        status, listed = api(server, "GET", f"{base}/files", BOB)
        assert status == 200 and [f["path"] for f in listed["files"]] == ["ok.bin"]
    finally:
        api(server, "DELETE", f"/api/sandboxes/{sid}", BOB)
