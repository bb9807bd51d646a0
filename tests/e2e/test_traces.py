"""OpenTelemetry traces: a server with `[telemetry] otlp_endpoint` posts
OTLP/HTTP protobuf to a receiver here (decoded with the opentelemetry-proto
package); each tool call is one trace, a child of the W3C trace context the
client sent in `_meta` (or in the HTTP header), with the spans of the call,
its wait in the sandbox's queue, its job, the agent exchange and engine
calls; no span carries the code, the output or a key."""

import asyncio
import os
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from mcp import Client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from harness import Server, call, new_key

ALICE, ALICE_SHA = new_key("alice")
CODE_MARKER = "trace_marker_7301"
OUTPUT_MARKER = "printed_8802"


class Receiver:
    """An OTLP/HTTP trace receiver: every span posted to /v1/traces, with
    its resource's attributes."""

    def __init__(self):
        self.spans = []
        self.paths = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.paths.append((self.path, self.headers["content-type"]))
                    for rs in request.resource_spans:
                        resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            receiver.spans.extend((resource, s) for s in ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def trace(self, trace_id, names, timeout=60):
        """The spans of `trace_id` once every name in `names` has arrived."""
        deadline = time.time() + timeout
        while True:
            with self.lock:
                spans = [s for _, s in self.spans if s.trace_id.hex() == trace_id]
            if names <= {s.name for s in spans} or time.time() > deadline:
                return spans
            time.sleep(0.2)


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.http.shutdown()


@pytest.fixture(scope="module")
def server(receiver):
    s = Server(
        MCP_SANDBOX_AUTH_ENABLED="true",
        MCP_SANDBOX_AUTH_KEYS=f'[{{name = "alice", key_sha256 = "{ALICE_SHA}"}}]',
        MCP_SANDBOX_TELEMETRY_OTLP_ENDPOINT=receiver.url,
        MCP_SANDBOX_TELEMETRY_SERVICE_NAME="sandbox-under-test",
        # The batch processor's delay: spans reach the receiver in a moment.
        OTEL_BSP_SCHEDULE_DELAY="200",
        # Upkeep that calls the engine (a pool to refill, sandboxes paused
        # between calls) runs meanwhile, and must make no traces.
        MCP_SANDBOX_POOL_MIN="1",
        MCP_SANDBOX_POOL_MAX="1",
        MCP_SANDBOX_SANDBOX_PAUSE_AFTER_SECONDS="1",
    ).start()
    yield s
    s.cleanup()


def context():
    """A fresh W3C trace context: (traceparent, trace id, parent span id)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def client(server, headers=None):
    headers = {"Authorization": f"Bearer {ALICE}", **(headers or {})}
    return Client(streamable_http_client(server.url + "/mcp", http_client=create_mcp_http_client(headers=headers)))


def attrs(span):
    return {a.key: a.value.string_value or a.value.int_value for a in span.attributes}


def by_name(spans, name):
    return [s for s in spans if s.name == name]


def test_a_call_is_one_trace_under_the_callers_context_with_its_queue_job_and_agent(server, receiver):
    run_ctx, run_trace, run_parent = context()
    upload_ctx, upload_trace, _ = context()
    (server.uploads / "data.csv").write_text("a,b\n1,2\n")

    async def go():
        async with client(server) as c:
            sid = (await call(c, "create_sandbox"))["sandbox_id"]
            code = f"{CODE_MARKER} = 1\nprint('{OUTPUT_MARKER}')"
            meta = {"traceparent": run_ctx, "tracestate": "vendor=abc"}
            ran = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": code}, meta=meta)
            assert not ran.is_error and OUTPUT_MARKER in ran.structured_content["stdout"]
            upload = {"sandbox_id": sid, "local_file_path": str(server.uploads / "data.csv")}
            uploaded = await c.call_tool("upload_file_to_sandbox", upload, meta={"traceparent": upload_ctx})
            assert not uploaded.is_error, uploaded.content[0].text
            await call(c, "delete_sandbox", sandbox_id=sid)
            return sid

    sid = asyncio.run(go())
    spans = receiver.trace(run_trace, {"tools/call", "tool", "queued", "job", "agent", "inline_images"})
    names = {s.name for s in spans}
    assert {"tools/call", "tool", "queued", "job", "agent", "inline_images"} <= names, names
    (root,) = by_name(spans, "tools/call")
    assert root.parent_span_id.hex() == run_parent, "the call's span is a child of the client's"
    assert root.trace_state == "vendor=abc"
    assert attrs(root)["tool"] == "execute_python_code"
    (tool,) = by_name(spans, "tool")
    assert tool.parent_span_id == root.span_id
    assert attrs(tool)["sandbox_id"] == sid
    ids = {s.span_id: s for s in spans}
    (queued,) = by_name(spans, "queued")
    (job,) = by_name(spans, "job")
    assert attrs(queued)["job"] == attrs(job)["job"] == "run"
    assert queued.parent_span_id == job.parent_span_id and ids[job.parent_span_id].name in ("tool", "tools/call")
    assert queued.end_time_unix_nano <= job.start_time_unix_nano, "the wait ends before the work starts"
    (agent,) = by_name(spans, "agent")
    assert agent.parent_span_id == job.span_id and attrs(agent)["op"] == "run"

    upload = receiver.trace(upload_trace, {"tools/call", "job", "engine"})
    engine = by_name(upload, "engine")
    assert "upload" in [attrs(e)["op"] for e in engine], [attrs(e) for e in engine]
    assert {attrs(j)["job"] for j in by_name(upload, "job")} == {"upload"}

    time.sleep(4)  # the pool refills and the idle sandbox is paused meanwhile
    with receiver.lock:
        everything = list(receiver.spans)
    assert {r.get("service.name") for r, _ in everything} == {"sandbox-under-test"}
    assert all(path == "/v1/traces" and ctype == "application/x-protobuf" for path, ctype in receiver.paths)
    raw = b"".join(s.SerializeToString() for _, s in everything)
    for secret in (CODE_MARKER, OUTPUT_MARKER, ALICE):
        assert secret.encode() not in raw, f"{secret} in a span"
    assert not any(s.events for _, s in everything), "log events are not exported"
    calls = {s.trace_id for _, s in everything if s.name == "tools/call"}
    assert {s.trace_id for _, s in everything} <= calls, "every trace is a call's (upkeep makes none)"


def test_the_http_header_carries_the_context_and_a_call_without_one_is_a_root(server, receiver):
    header_ctx, header_trace, header_parent = context()

    async def go():
        async with client(server, {"traceparent": header_ctx}) as c:
            listed = await c.call_tool("list_sandboxes", {})
            assert not listed.is_error
        async with client(server) as c:
            created = await call(c, "create_sandbox", name="untraced-parent")
            await call(c, "delete_sandbox", sandbox_id=created["sandbox_id"])
            return created["sandbox_id"]

    sid = asyncio.run(go())
    spans = receiver.trace(header_trace, {"tools/call", "tool"})
    calls = [s for s in by_name(spans, "tools/call") if attrs(s)["tool"] == "list_sandboxes"]
    assert calls and all(s.parent_span_id.hex() == header_parent for s in calls)

    deadline = time.time() + 60
    while time.time() < deadline:
        with receiver.lock:
            tools = [s for _, s in receiver.spans if s.name == "tool" and attrs(s).get("sandbox_id") == sid]
        if tools:
            break
        time.sleep(0.2)
    assert tools, "the delete of the untraced sandbox was traced"
    with receiver.lock:
        roots = {s.span_id: s for _, s in receiver.spans if s.name == "tools/call"}
    parent = roots[tools[0].parent_span_id]
    assert parent.parent_span_id == b"", "a call without a context is a trace of its own"


def root_of_a_call_on(receiver, sid):
    """The `tools/call` span of the one call made on sandbox `sid`."""
    deadline = time.time() + 60
    while time.time() < deadline:
        with receiver.lock:
            spans = [s for _, s in receiver.spans]
        tools = [s for s in spans if s.name == "tool" and attrs(s).get("sandbox_id") == sid]
        roots = {s.span_id: s for s in spans if s.name == "tools/call"}
        if tools and tools[0].parent_span_id in roots:
            return roots[tools[0].parent_span_id]
        time.sleep(0.2)
    raise AssertionError(f"no trace of the call on {sid}")


def test_what_a_client_puts_in_a_context_or_a_tool_name_stays_bounded(server, receiver):
    zero_ctx = f"00-{'0' * 32}-{'1' * 16}-01"
    malformed = ["00-zz-" + "x" * 9000, "ff-" + "a" * 32 + "-" + "b" * 16 + "-01", zero_ctx, "00-" + "A" * 32 + "-" + "B" * 16 + "-01"]
    unsampled_ctx, unsampled_trace, unsampled_parent = context()
    unsampled_ctx = unsampled_ctx[:-2] + "00"
    long_state_ctx, long_state_trace, _ = context()
    name_ctx, name_trace, _ = context()
    missing = [str(uuid.uuid4()) for _ in malformed]

    async def go():
        async with client(server) as c:
            for value, sid in zip(malformed, missing):
                r = await c.call_tool("execute_python_code", {"sandbox_id": sid, "code": "1"}, meta={"traceparent": value})
                assert r.is_error, "an unknown sandbox"
            r = await c.call_tool("list_sandboxes", {}, meta={"traceparent": unsampled_ctx})
            assert not r.is_error
            r = await c.call_tool("list_sandboxes", {}, meta={"traceparent": long_state_ctx, "tracestate": "a=1," * 200})
            assert not r.is_error
            try:
                await c.call_tool("x" * 200_000, {}, meta={"traceparent": name_ctx})
            except Exception:
                pass  # refused: no such tool

    asyncio.run(go())
    for value, sid in zip(malformed, missing):
        root = root_of_a_call_on(receiver, sid)
        assert root.parent_span_id == b"", f"{value[:40]!r} was taken for a context"
    unsampled = receiver.trace(unsampled_trace, {"tools/call", "tool"})
    assert by_name(unsampled, "tools/call"), "a client's unsampled flag does not hide its calls"
    (long_state,) = by_name(receiver.trace(long_state_trace, {"tools/call"}), "tools/call")
    assert long_state.trace_state == "", "an oversized tracestate is dropped"
    (named,) = by_name(receiver.trace(name_trace, {"tools/call"}), "tools/call")
    assert attrs(named)["tool"] == "unknown", "a name of no tool is not recorded"
    assert len(named.SerializeToString()) < 2048
