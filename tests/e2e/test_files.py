"""The file tools and reset_python with the Python MCP SDK 2.3.0 against the
real server and Docker: a 10 MB text file paged through read_file, an image
shown as an image item next to its link (test_images.py has large and
hostile ones), a binary returned as a link, bytes written and read back as
base64, list_files and write_file with their limits, moments to the millisecond,
what a hostile sandbox plants (links to host files, a link loop, a FIFO)
refused while the server stays responsive, and a Python reset that forgets a
variable and keeps a file. Another tenant's sandbox id is covered with the
other tools in test_security.py."""

import asyncio
import base64
import hashlib
import re
import struct
import time

from mcp import Client

from harness import get

MAX_READ = 262144


def run(coro):
    return asyncio.run(coro)


async def call(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert not r.is_error, r.content[0].text
    return r.structured_content


async def refused(c, tool, **args):
    r = await c.call_tool(tool, args)
    assert r.is_error, (tool, args, r.structured_content)
    text = r.content[0].text
    assert "root:" not in text, text
    return text


# A 10 MB text file of numbered lines, some with non-ASCII characters so
# that windows fall inside characters.
BIG = (
    "import hashlib\n"
    "with open('big.txt', 'w', encoding='utf-8') as f:\n"
    "    for i in range(400_000):\n"
    "        f.write(f'{i:07d} ' + ('é' if i % 3 else 'x') * 16 + '\\n')\n"
    "data = open('big.txt', 'rb').read()\n"
    "print(len(data), hashlib.sha256(data).hexdigest())\n"
)

# A 2 x 3 PNG, from the standard library only.
PNG = (
    "import struct, zlib\n"
    "def chunk(kind, data):\n"
    "    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))\n"
    "raw = b''.join(b'\\0' + b'\\xff\\x00\\x00' * 2 for _ in range(3))\n"
    "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 2, 3, 8, 2, 0, 0, 0))\n"
    "png += chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b'')\n"
    "open('plots/dot.png', 'wb').write(png)\n"
    "open('blob.bin', 'wb').write(bytes(range(256)) * 4)\n"
)


def test_read_file_pages_through_a_10_mb_text_file(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            made = await call(c, "execute_python_code", sandbox_id=sid, code=BIG, timeout_seconds=120)
            size, digest = made["stdout"].split()
            size = int(size)
            assert size > 10_000_000, size

            first = await call(c, "read_file", sandbox_id=sid, path="big.txt")
            assert first["type"] == "text" and first["size"] == size and first["mime_type"] == "text/plain"
            assert first["offset"] == 0 and len(first["content"].encode()) <= 16384, "the default window"
            assert first["content"].startswith("0000000 xxxx")
            assert first["tail"].startswith("0") and first["tail"].endswith("0399999 xxxxxxxxxxxxxxxx\n"), first["tail"][-60:]
            assert first["link"].startswith(f"{server.url}/results/{sid}/big.txt")

            pages, offset, parts = 0, 0, []
            while True:
                page = await call(c, "read_file", sandbox_id=sid, path="/app/results/big.txt", offset=offset, max_bytes=MAX_READ)
                assert page["offset"] == offset and len(page["content"].encode()) <= MAX_READ
                assert "\ufffd" not in page["content"], "a window never cuts a character"
                assert offset == 0 or "tail" not in page, "the tail comes with the first window only"
                parts.append(page["content"])
                pages += 1
                if "next_offset" not in page:
                    break
                offset = page["next_offset"]
            whole = "".join(parts).encode()
            assert pages == -(-size // MAX_READ) or pages == -(-size // MAX_READ) + 1, pages
            assert len(whole) == size and hashlib.sha256(whole).hexdigest() == digest

            lines = await call(c, "read_file", sandbox_id=sid, path="big.txt", offset=first["next_offset"], max_lines=2)
            assert lines["content"].count("\n") == 2 and lines["next_offset"] == first["next_offset"] + len(lines["content"].encode())
            too_big = await refused(c, "read_file", sandbox_id=sid, path="big.txt", max_bytes=MAX_READ + 1)
            assert "max_bytes" in too_big and str(MAX_READ) in too_big, too_big
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_an_image_comes_inline_a_binary_as_a_link_and_folders_are_listed(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            wrote = await call(c, "write_file", sandbox_id=sid, path="plots/readme.md", content="# plots\n")
            assert wrote["path"] == "/app/results/plots/readme.md" and wrote["size"] == 8
            made = await call(c, "execute_python_code", sandbox_id=sid, code=PNG)
            assert made["exit_code"] == 0, made["stderr"]

            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "plots/dot.png"})
            image = r.structured_content
            assert not r.is_error and image["type"] == "image" and image["mime_type"] == "image/png", image
            assert "content" not in image and image["size"] > 50
            assert [b.type for b in r.content] == ["text", "resource_link", "image"]
            [resource] = [b for b in r.content if b.type == "resource_link"]
            assert str(resource.uri) == image["link"] and resource.name == "dot.png"
            status, headers, body = get(image["link"])
            assert status == 200 and headers["content-type"] == "image/png" and body[:4] == b"\x89PNG"
            assert len(body) == image["size"]
            # Small enough to go as it is: the file itself, 2 x 3.
            [item] = [b for b in r.content if b.type == "image"]
            shown = base64.b64decode(item.data)
            assert item.mime_type == "image/png" and shown == body
            assert struct.unpack(">II", shown[16:24]) == (2, 3)
            assert image["image"] == {"path": "/app/results/plots/dot.png", "inline": True, "width": 2, "height": 3}
            await call(c, "write_file", sandbox_id=sid, path="plots/line.svg", content='<svg xmlns="http://www.w3.org/2000/svg"/>')
            r = await c.call_tool("read_file", {"sandbox_id": sid, "path": "plots/line.svg"})
            svg = r.structured_content
            assert svg["type"] == "image" and svg["mime_type"] == "image/svg+xml", svg
            assert [b.type for b in r.content] == ["text", "resource_link"]
            assert not svg["image"]["inline"] and "SVG is only linked" in svg["image"]["reason"], svg

            blob = await call(c, "read_file", sandbox_id=sid, path="blob.bin")
            assert blob["type"] == "binary" and blob["size"] == 1024 and "content" not in blob
            assert get(blob["link"])[2] == bytes(range(256)) * 4

            listed = await call(c, "list_files", sandbox_id=sid)
            entries = {e["path"]: e for e in listed["entries"]}
            assert listed["path"] == "/app/results" and not listed["truncated"]
            assert entries["/app/results/plots"]["type"] == "folder" and "link" not in entries["/app/results/plots"]
            dot = entries["/app/results/plots/dot.png"]
            assert dot["type"] == "file" and dot["size"] == image["size"] and dot["link"] == image["link"]
            # Every moment is written to the millisecond, in UTC.
            listed_sandboxes = (await call(c, "list_sandboxes"))["sandboxes"]
            moments = [dot["modified"]] + [s["created_at"] for s in listed_sandboxes]
            assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", m) for m in moments), moments
            shallow = await call(c, "list_files", sandbox_id=sid, path="/app/results", depth=1)
            assert "/app/results/plots/dot.png" not in {e["path"] for e in shallow["entries"]}
            cut = await call(c, "list_files", sandbox_id=sid, max_entries=1)
            assert len(cut["entries"]) == 1 and cut["truncated"]
            inner = await call(c, "list_files", sandbox_id=sid, path="plots")
            assert {e["path"] for e in inner["entries"]} == {f"/app/results/plots/{n}" for n in ("dot.png", "line.svg", "readme.md")}

            assert "depth" in await refused(c, "list_files", sandbox_id=sid, depth=17)
            assert "max_entries" in await refused(c, "list_files", sandbox_id=sid, max_entries=1001)
            assert "does not exist" in await refused(c, "read_file", sandbox_id=sid, path="nope.txt")
            assert "folder" in await refused(c, "read_file", sandbox_id=sid, path="plots")
            assert "not a folder" in await refused(c, "list_files", sandbox_id=sid, path="blob.bin")
            assert "1048576" in await refused(c, "write_file", sandbox_id=sid, path="big.txt", content="x" * (1024 * 1024 + 1))
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_write_file_runs_in_turn_with_the_sandbox_calls(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            # A write sent while a run is going waits for it, and is done when it answers.
            code = "import os, time\ntime.sleep(2)\nprint(os.path.exists('deep/er/notes.txt'))"
            running = asyncio.create_task(call(c, "execute_python_code", sandbox_id=sid, code=code))
            await asyncio.sleep(0.7)
            started = time.monotonic()
            wrote = await call(c, "write_file", sandbox_id=sid, path="deep/er/notes.txt", content="n" * 1024 * 1024)
            assert wrote["success"] and time.monotonic() - started > 0.5, "the write queued behind the run"
            assert (await running)["stdout"] == "False\n"
            ran = await call(c, "execute_python_code", sandbox_id=sid, code="import os\nprint(os.path.getsize('deep/er/notes.txt'))")
            assert ran["stdout"] == f"{1024 * 1024}\n", ran
            shell = await call(c, "execute_terminal_command", sandbox_id=sid, command="stat -c %u deep/er/notes.txt && echo x >> deep/er/notes.txt && echo ok")
            assert shell["stdout"] == "1000\nok\n", shell
            # Bytes that are no text, as base64, land byte for byte; too
            # many, or no base64, are refused and name what to do.
            blob = bytes(range(256)) * 4096
            wrote = await call(c, "write_file", sandbox_id=sid, path="data.bin", content=base64.b64encode(blob).decode(),
                               encoding="base64")
            assert wrote["size"] == len(blob), wrote
            ran = await call(c, "execute_python_code", sandbox_id=sid,
                             code="import hashlib\nprint(hashlib.sha256(open('data.bin', 'rb').read()).hexdigest())")
            assert ran["stdout"] == hashlib.sha256(blob).hexdigest() + "\n", ran
            # And they come back the same way: 64 KiB a call unless asked
            # for up to 256 KiB.
            first = await call(c, "read_file", sandbox_id=sid, path="data.bin", encoding="base64")
            assert len(base64.b64decode(first["content"])) == 65536 and first["next_offset"] == 65536, first["size"]
            got, offset, calls = b"", 0, 0
            while offset is not None:
                window = await call(c, "read_file", sandbox_id=sid, path="data.bin", offset=offset, max_bytes=MAX_READ,
                                    encoding="base64")
                assert window["type"] == "bytes" and window["encoding"] == "base64" and window["offset"] == offset, window
                got += base64.b64decode(window["content"])
                offset, calls = window.get("next_offset"), calls + 1
            assert (hashlib.sha256(got).hexdigest(), calls) == (hashlib.sha256(blob).hexdigest(), 4)
            small = await call(c, "read_file", sandbox_id=sid, path="data.bin", offset=255, max_bytes=3, encoding="base64")
            assert base64.b64decode(small["content"]) == b"\xff\x00\x01" and small["next_offset"] == 258, small
            assert "262144" in await refused(c, "read_file", sandbox_id=sid, path="data.bin", max_bytes=MAX_READ + 1,
                                             encoding="base64")
            for content, said in ((base64.b64encode(b"x" * (1024 * 1024 + 1)).decode(), "at most 1048576"),
                                  (base64.b64encode(b"x" * (2 * 1024 * 1024)).decode(), "upload_file_to_sandbox"),
                                  ("not base64!", "not standard base64")):
                r = await c.call_tool("write_file", {"sandbox_id": sid, "path": "big.bin", "content": content,
                                                     "encoding": "base64"})
                assert r.is_error and said in r.content[0].text, r.content[0].text
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())


def test_hostile_files_are_refused_and_the_server_stays_responsive(server):
    passwd = open("/etc/passwd", "rb").read()

    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            other = (await call(c, "create_sandbox"))["sandbox_id"]
            plant = "ln -s /etc/passwd passwd && ln -s / root && ln -s loop loop && mkfifo fifo && mkdir d && echo planted"
            assert (await call(c, "execute_terminal_command", sandbox_id=sid, command=plant))["stdout"] == "planted\n"

            started = time.monotonic()
            for path in ["../../etc/passwd", "/etc/passwd", "/app/results/../../etc/passwd", "passwd", "root/etc/passwd", "loop", "fifo"]:
                text = await refused(c, "read_file", sandbox_id=sid, path=path)
                assert any(w in text for w in ("outside", "link", "not a regular file")), (path, text)
            for path in ["root", "root/etc", "../..", "/etc"]:
                await refused(c, "list_files", sandbox_id=sid, path=path)
            for path in ["passwd", "root/etc/passwd", "fifo", "d", "../x", "/tmp/x"]:
                await refused(c, "write_file", sandbox_id=sid, path=path, content="owned")
            assert time.monotonic() - started < 30, "refusals are quick"
            assert open("/etc/passwd", "rb").read() == passwd

            # A FIFO read in flight blocks nothing: others, health and this sandbox answer.
            reads = [asyncio.create_task(c.call_tool("read_file", {"sandbox_id": sid, "path": "fifo"})) for _ in range(5)]
            assert (await call(c, "execute_python_code", sandbox_id=other, code="print('fine')"))["stdout"] == "fine\n"
            assert (await asyncio.to_thread(get, server.url + "/health"))[0] == 200
            assert all(r.is_error for r in await asyncio.gather(*reads))

            listed = await call(c, "list_files", sandbox_id=sid, depth=16)
            entries = {e["path"]: e for e in listed["entries"]}
            assert entries["/app/results/passwd"]["type"] == "link" and "link" not in entries["/app/results/passwd"]
            assert entries["/app/results/fifo"]["type"] == "other"
            assert not any(p.startswith("/app/results/root/") for p in entries), "links are never followed"
            assert (await call(c, "execute_python_code", sandbox_id=sid, code="print('alive')"))["stdout"] == "alive\n"
            for s in (sid, other):
                await call(c, "delete_sandbox", sandbox_id=s)

    run(go())


def test_reset_python_forgets_a_variable_and_keeps_a_file(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            await call(c, "execute_python_code", sandbox_id=sid, code="x = 41\nopen('kept.txt', 'w').write('kept')")
            started = time.monotonic()
            reset = await call(c, "reset_python", sandbox_id=sid)
            took = time.monotonic() - started
            assert reset["success"] and "notice" not in reset, reset
            assert reset["duration_ms"] < 1000 and took < 2, (reset, took)
            gone = await call(c, "execute_python_code", sandbox_id=sid, code="print(x)")
            assert gone["exit_code"] == 1 and "NameError" in gone["stderr"] and not gone["state_lost"]
            kept = await call(c, "read_file", sandbox_id=sid, path="kept.txt")
            assert kept["content"] == "kept"
            again = await call(c, "execute_python_code", sandbox_id=sid, code="y = 1\nprint(y + 1)")
            assert again["stdout"] == "2\n"
            await call(c, "delete_sandbox", sandbox_id=sid)

    run(go())
