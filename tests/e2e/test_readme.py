"""The README's examples run as written: its Python SDK example, with the
address of a test server, prints 42 and leaves no sandbox behind."""

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_example():
    """The README's fenced Python block after "Python SDK"."""
    text = README.read_text()
    after = text[text.index("Python SDK"):]
    return re.search(r"```python\n(.*?)```", after, re.S).group(1)


def test_the_readme_python_example_runs_as_written(server):
    code = python_example()
    assert "http://127.0.0.1:8181/mcp" in code
    code = code.replace("http://127.0.0.1:8181", server.url)
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout == "42\n", ran.stdout
    with urllib.request.urlopen(server.url + "/api/sandboxes", timeout=30) as r:
        left = json.loads(r.read())
    assert left["sandboxes"] == [], left
