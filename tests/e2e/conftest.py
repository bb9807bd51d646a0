import pytest

from harness import Server


@pytest.fixture(scope="module")
def server():
    s = Server().start()
    yield s
    s.cleanup()
