"""Results like a notebook's, over MCP with the Python SDK against the real
server: the last expression's value, display(), figures without savefig,
DataFrames as Markdown tables, errors as data, and each run's receipt;
hostile reprs (raising, looping, huge) fall back to a bounded repr within
the run's deadline, and code that prints sees its results unchanged."""

import asyncio
import base64
import struct
import time

from mcp import Client

from harness import call, in_sandbox

STANDARD = {"stdout", "stderr", "exit_code", "files", "file_links", "duration_ms", "timed_out", "truncated", "state_lost"}


async def run(c, sid, code, timeout=120):
    """The whole MCP result of a run and its structured content."""
    r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": code, "timeout_seconds": timeout})
    assert not r.is_error, r.content[0].text
    return r, r.structured_content


def texts(r):
    """The text items after the result's own JSON."""
    return [b.text for b in r.content[1:] if b.type == "text"]


def test_values_display_and_errors_come_back_as_a_notebook_shows_them(server):
    async def scenario(c, sid):
        r, out = await run(c, sid, "x = 1")
        assert "outputs" not in out and len(r.content) == 1
        r, out = await run(c, sid, "x")
        assert out["outputs"] == [{"type": "text", "text": "1", "bytes": 1, "main": True}]
        assert texts(r) == ["1"]
        assert '"text":' not in r.content[0].text, "the JSON item leaves out what follows it"
        _, out = await run(c, sid, "x;  # a notebook shows nothing")
        assert "outputs" not in out
        _, out = await run(c, sid, "None")
        assert "outputs" not in out

        # display() keeps order among its own outputs; printed text stays in stdout.
        r, out = await run(c, sid, "print('a')\ndisplay(2, {'k': [1, 2]})\nprint('b')\n'last'")
        assert out["stdout"] == "a\nb\n"
        assert [(o["text"], o.get("main", False)) for o in out["outputs"]] == [
            ("2", False),
            ("{'k': [1, 2]}", False),
            ("'last'", True),
        ]
        assert texts(r) == ["2", "{'k': [1, 2]}", "'last'"]

        # Code that prints sees the fields it always saw, and nothing more but its receipt.
        _, out = await run(c, sid, "print('hi')")
        assert set(out) - {"receipt"} == STANDARD, out
        assert out["stdout"] == "hi\n"

        # Errors as data, with the user's frames only.
        _, out = await run(c, sid, "def f():\n    return {}['missing']\n\nf()")
        assert out["exit_code"] == 1
        err = out["error"]
        assert (err["name"], err["value"]) == ("KeyError", "'missing'")
        assert 'File "<sandbox>", line 4, in <module>' in err["traceback"]
        assert 'line 2, in f' in err["traceback"]
        assert "agent" not in err["traceback"] and "exec(" not in err["traceback"], err["traceback"]
        assert err["traceback"] in out["stderr"]
        _, out = await run(c, sid, "def (")
        assert out["error"]["name"] == "SyntaxError"

        # Rich forms: Markdown, JSON and HTML where the repr says nothing.
        r, out = await run(
            c,
            sid,
            "class M:\n    def _repr_markdown_(self): return '**bold**'\n"
            "class J:\n    def _repr_json_(self): return {'a': 1}\n"
            "class H:\n    def _repr_html_(self): return '<b>h</b>'\n"
            "class R:\n    def _repr_html_(self): return '<b>r</b>'\n    def __repr__(self): return 'R()'\n"
            "display(M(), J(), H(), R())",
        )
        assert [(o["type"], o["text"]) for o in out["outputs"]] == [
            ("markdown", "**bold**"),
            ("json", '{"a": 1}'),
            ("html", "<b>h</b>"),
            ("text", "R()"),
        ]

    in_sandbox(server, scenario)


def test_hostile_reprs_fall_back_to_a_bounded_repr_within_the_deadline(server):
    async def scenario(c, sid):
        code = (
            "class Raises:\n    def _repr_markdown_(self): raise ValueError('no')\n    def __repr__(self): return 'Raises()'\n"
            "class Loops:\n    def _repr_markdown_(self):\n        while True: pass\n    def __repr__(self): return 'Loops()'\n"
            "class Huge:\n    def _repr_markdown_(self): return 'x' * 10**7\n    def __repr__(self): return 'Huge()'\n"
            "class HugeRepr:\n    def __repr__(self): return 'y' * 10**7\n"
            "class Nothing:\n    def __repr__(self):\n        while True: pass\n"
            "display(Raises(), Loops(), Huge(), HugeRepr(), Nothing())"
        )
        started = time.monotonic()
        _, out = await run(c, sid, code, timeout=60)
        took = time.monotonic() - started
        assert out["exit_code"] == 0, out["stderr"]
        assert took < 30, f"the renders are timed ({took:.1f} s)"
        kinds = [(o["type"], o["text"][:10]) for o in out["outputs"]]
        assert kinds[:3] == [("text", "Raises()"), ("text", "Loops()"), ("text", "Huge()")], kinds
        huge = out["outputs"][3]
        assert huge["text"].startswith("yyyy") and huge["bytes"] <= 16 * 1024, huge["bytes"]
        assert "more bytes left out" in huge["text"]
        assert "could not be shown" in out["outputs"][4]["text"], out["outputs"][4]
        # The worker is intact and its namespace kept.
        _, out = await run(c, sid, "Raises")
        assert out["outputs"][0]["text"] == "<class '__main__.Raises'>"

        # A run's outputs stay within its output budget and count.
        _, out = await run(c, sid, "display(*['z' * 3000] * 40)")
        sizes = sum(o["bytes"] for o in out["outputs"])
        assert sizes <= 64 * 1024 + 256, sizes
        assert "more outputs left out" in out["outputs"][-1]["text"]

    in_sandbox(server, scenario)


def test_receipts_say_what_a_run_cost(server):
    async def scenario(c, sid):
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 2: pass"
        _, out = await run(c, sid, burn)
        receipt = out["receipt"]
        assert 1.9 <= receipt["cpu_seconds"] <= 8, receipt
        assert receipt["wall_ms"] >= 1900, receipt
        _, out = await run(c, sid, "b = bytearray(200 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\ndel b")
        assert out["receipt"]["peak_memory_bytes"] >= 200 * 1024 * 1024, out["receipt"]
        _, out = await run(c, sid, "pass")
        assert out["receipt"]["cpu_seconds"] < 1.9 and out["receipt"]["peak_memory_bytes"] < 200 * 1024 * 1024
        r = await c.call_tool("execute_terminal_command", {"sandbox_id": sid, "command": "true"})
        assert "cpu_seconds" in r.structured_content["receipt"]

    in_sandbox(server, scenario)


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_dataframes_and_figures_come_back_without_print_or_savefig(server):
    async def go():
        async with Client(server.url + "/mcp") as c:
            sid = await call(c, "create_sandbox")
            sid = sid["sandbox_id"]
            for package in ("pandas", "matplotlib"):
                inst = await call(c, "install_package_in_sandbox", sandbox_id=sid, package_name=package)
                assert inst["status"] in ("success", "installing"), inst
            code = (
                "import pandas as pd\n"
                "df = pd.DataFrame({'a': range(1000), 'b': [i * 0.5 for i in range(1000)], 'c': ['x|y'] * 1000})\n"
                "df.head()"
            )
            r, out = await run(c, sid, code, timeout=300)
            [table] = out["outputs"]
            assert table["type"] == "markdown" and table["main"]
            lines = table["text"].splitlines()
            assert lines[0] == "DataFrame: 5 rows × 3 columns", lines
            assert lines[2] == "|  | a | b | c |" and len(lines) == 4 + 5, lines
            assert lines[4] == "| 0 | 0 | 0.0 | x\\|y |", lines
            assert texts(r) == [table["text"]]

            _, out = await run(c, sid, "import numpy as np\npd.DataFrame(np.zeros((5000, 60)))")
            text = out["outputs"][0]["text"]
            assert text.startswith("DataFrame: 5,000 rows × 60 columns")
            assert "Showing the first and last 10 of 5,000 rows and the first 20 of 60 columns." in text
            assert len(text.splitlines()) == 2 + 2 + 21 + 2

            # plt.show() without savefig: an inline image of the figure's size, a saved file
            # outside `files`, in order with what was displayed.
            code = (
                "import matplotlib.pyplot as plt\n"
                "display('before')\n"
                "plt.figure(figsize=(4, 3))\nplt.plot([1, 3, 2])\nplt.show()\n"
                "display('after')\nprint(plt.get_fignums())"
            )
            r, out = await run(c, sid, code)
            assert out["stdout"] == "[]\n", "the figure is closed once shown"
            kinds = [o["type"] for o in out["outputs"]]
            assert kinds == ["text", "image", "text"], out["outputs"]
            image = out["outputs"][1]
            assert image["path"].startswith("/app/results/outputs/") and image["path"].endswith(".png")
            assert (image["width"], image["height"]) == (400, 300)
            assert out["files"] == [], "a shown figure is an output, not one of the run's files"
            assert out["images"] == [{"path": image["path"], "inline": True, "width": 400, "height": 300}]
            items = [b.type for b in r.content]
            assert items == ["text", "text", "resource_link", "image", "text"], items
            picture = next(b for b in r.content if b.type == "image")
            assert png_size(base64.b64decode(picture.data)) == (400, 300)
            link = next(b for b in r.content if b.type == "resource_link")
            assert link.uri == image["link"] and image["link"] not in r.content[0].text

            # A figure left open is shown as the run ends; one saved is not shown twice.
            _, out = await run(c, sid, "plt.plot([1, 2]);")
            assert [o["type"] for o in out["outputs"]] == ["image"], out.get("outputs")
            assert (out["outputs"][0]["width"], out["outputs"][0]["height"]) == (640, 480)
            _, out = await run(c, sid, "plt.figure(); plt.plot([2, 1]); plt.savefig('saved.png')")
            assert "outputs" not in out and out["files"] == ["/app/results/saved.png"], out
            _, out = await run(c, sid, "plt.title('changed since saved');")
            assert [o["type"] for o in out["outputs"]] == ["image"], out.get("outputs")
            await call(c, "delete_sandbox", sandbox_id=sid)

    asyncio.run(go())
