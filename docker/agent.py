"""mcp-sandbox in-container agent.

Started once per sandbox as the container's main process (under docker-init).
It listens on a unix socket in a folder that the server bind-mounts, and answers
JSON-line requests one at a time:

  {"id": N, "op": "exec", "code": str, "timeout": s, "output_cap": bytes, "progress": bool}
  {"id": N, "op": "run", "argv": [str], "timeout": s, "output_cap": bytes, "progress": bool}
  {"id": N, "op": "packages"}
  {"id": N, "op": "reset"}              (a fresh Python namespace: the worker is replaced)
  {"id": N, "op": "snapshot", "slot": hex32}   (parks a copy of the worker: "parked",
                                               or "fresh" when no worker runs)
  {"id": N, "op": "restore", "slot": hex32, "python": bool}
                                              (the worker again from that copy: "restored";
                                               "lost" when the copy is gone; "fresh" without python)
  {"id": N, "op": "forget", "slot": hex32}     (ends that copy)
  {"id": N, "op": "dump", "slot": hex32, "from": hex32|null, "timeout": s}
                                              (writes the namespace, or that of the copy parked
                                               under "from", to the fork file of "slot": "carried",
                                               "partial" (names listed in "skipped"), "fresh", "lost")
  {"id": N, "op": "load", "slot": hex32, "timeout": s}
                                              (the namespace from the fork file of "slot", which
                                               the server placed; the file is removed)
  {"id": N, "op": "interrupt"}          (cancels the request in flight)
  {"id": N, "op": "start_process", "command": str, "cwd": str|null, "env": {str: str},
   "name": str|null, "keep": bytes, "max_processes": n}
                                              (a background command under `sh -c`, in a
                                               session of its own: "process")
  {"id": N, "op": "list_processes"}           ("processes": the running and the ended)
  {"id": N, "op": "read_process", "process_id": hex12, "offset": n, "max": bytes,
   "wait": s, "until_end": bool}             (a window of its output from `offset`; with
                                               "wait", answered once output comes, it ends
                                               or the wait is over; "until_end" waits the
                                               whole wait unless it ends)
  {"id": N, "op": "process_input", "process_id": hex12, "text": str}
  {"id": N, "op": "stop_process", "process_id": hex12, "signal": str, "grace": s}
                                              (the signal, then KILL of its session after
                                               the grace; answered once it ended)
  {"id": N, "op": "open_port", "port": n, "relay": bool}
                                              (a TCP connection to that port inside the
                                               sandbox: its descriptor passed with the
                                               answer, or, with "relay", this connection
                                               carries its bytes after the answer)
  {"id": N, "op": "ping"}

Python code runs in a persistent worker process (one namespace, like a notebook
kernel), so each exec costs a pipe round trip instead of an interpreter start.
Output goes to files rather than pipes so that output of subprocesses and C code
is captured too and a flood of output never blocks the program. Stdlib only.

The folders default to the image's; MCP_AGENT_DIR (socket), MCP_AGENT_RESULTS
(results) and MCP_AGENT_SPOOL (output being written) move them, so that
crates/runtime/tests/agent_protocol.rs can run the agent on the host. Reported paths
stay under /app/results either way.
"""

# The agent starts with every sandbox, so its imports are paid by every
# creation: it takes the interpreter's C modules (select, _socket, _signal,
# _json) and a few lines below instead of selectors, socket, signal, json and
# subprocess, whose pure-Python layers (enum, re, threading, collections and
# more) cost a start about 18 ms of CPU, more than the interpreter itself.
import _ast
import _json
import _signal as signal
import _socket
import errno
import os
import select
import stat
import struct
import sys
import time

SOCKET_DIR = os.environ.get("MCP_AGENT_DIR", "/run/mcp-agent")
# The results folder as the server knows it: every path the agent reports lies
# below it, whatever folder it really is.
RESULTS_REPORTED = "/app/results"
# The folder itself. Only an agent run outside its image (the protocol tests
# on the host) sets another one.
RESULTS = os.path.normpath(os.environ.get("MCP_AGENT_RESULTS", RESULTS_REPORTED))
# Our own files under the results folder (full outputs); never reported as artifacts.
PRIVATE = ".mcp-sandbox"
SPOOL = os.environ.get("MCP_AGENT_SPOOL", "/tmp/.mcp-agent")
# The sockets of the worker's parked copies (snapshots of the Python state).
PARKED = os.path.join(SPOOL, "parked")
# The files a namespace is carried in to a fork (see `dump_namespace`), under
# the results folder so that the server, on the host, can move them.
FORKS = os.path.join(RESULTS, PRIVATE, "fork")
# cloudpickle, outside the venv (the sandbox's to rewrite); MCP_AGENT_LIB is
# for the protocol tests on the host. Without it the stdlib's pickle carries
# what it can (not functions or classes defined by the sandbox's code).
AGENT_LIB = os.environ.get("MCP_AGENT_LIB", "/opt/mcp-agent/lib")
FORK_MAGIC = b"MCPFORK1"
# The most names a dump or load lists as not carried, and their reasons' length.
MAX_SKIPPED = 100
MAX_REASON = 200
# The sandbox's virtual environment, which its code may rewrite: the agent
# runs on the image's interpreter, and only the worker (user code) on the
# venv's. MCP_AGENT_WORKER_PYTHON and MCP_AGENT_SITE (the folders whose
# distributions are listed) are for the protocol tests on the host.
VENV = "/app/.venv"
WORKER_PYTHON = os.environ.get("MCP_AGENT_WORKER_PYTHON") or os.path.join(VENV, "bin", "python")
# The agent's source, and beside it the bytecode the image starts the agent
# from (made when the image was built; absent on the protocol tests' host).
AGENT_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent.py")
AGENT_BYTECODE = AGENT_SOURCE + "c"
OUTPUTS_SOURCE = os.path.join(os.path.dirname(AGENT_SOURCE), "outputs.py")
# An uncaught exception's value and traceback as the result carries them.
MAX_ERROR_NAME = 200
MAX_ERROR_VALUE = 2048
MAX_ERROR_TRACEBACK = 8192
# Outputs the agent passes on from one run (the worker keeps 32 and a note).
MAX_OUTPUTS = 33
MAX_REQUEST = 16 * 1024 * 1024
MAX_CONNS = 16
MAX_FILES = 1000
# A results folder of at most this many entries is scanned as each run begins
# and ends (3.5 us an entry in the image) rather than watched: a watch needs
# ctypes, about 3 ms of CPU, which a short-lived sandbox with a few files
# (a burst's, a rollout's) would pay at its start for nothing.
SCAN_AT_MOST = 64
GRACE = 2.0
# How long a parked copy of the worker (or the worker, asked to make one) may take to answer.
QUERY_DEADLINE = 5.0
PROGRESS_EVERY = 1.0
PROGRESS_CHUNK = 16 * 1024
# A shell command is handed to a shell started ahead of it (`Spare`) once
# the agent has been idle this long: the shell's start (exec, dynamic linking
# and, in a virtual machine, the C library's CPU probes) is three quarters of
# a short command's cost, and commands in quick succession, or a burst of
# first calls across many sandboxes, should not pay for starting the next.
SPARE_AFTER = 1.0
# The most a spare shell is handed: one write of at most PIPE_BUF bytes to an
# empty pipe arrives whole, and the shell reads its input 8 KiB at a time,
# so it holds the whole script before the script's first command runs (a
# longer command is started as `sh -c`).
SPARE_SCRIPT_MAX = 4096
# Put before the command: its standard input is /dev/null and `$-` is what
# `sh -c` shows, on the command's own first line (messages keep its line
# numbers).
SPARE_PROLOGUE = b"exec </dev/null; set +s; "
# The shell a spare is: the image's, in the read-only root (see Spare).
SPARE_SHELL = "/bin/sh"
# See Spare.script (a NUL byte is refused too: `sh -c` cannot take one).
SPARE_REFUSES = (b"exec", b"eval", b"source", b". ", b".\t", b".\n", b"\0")
# /dev/null, for what a started program or the worker between runs writes
# and reads (close-on-exec, as every descriptor of the agent's).
DEVNULL = os.open(os.devnull, os.O_RDWR)


# --------------------------------------------------------------------------
# The little of json, socket, selectors and subprocess the agent uses.
# --------------------------------------------------------------------------


class _Decoding:
    """What the C scanner reads of a decoder: json.JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_SCAN = _json.make_scanner(_Decoding())
_WHITESPACE = " \t\n\r"


def _unencodable(o):
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


# (markers, default, string encoder, indent, key and item separators,
# sort_keys, skipkeys, allow_nan): json.dumps's defaults, compact, without
# the check for circular values (the agent's messages have none).
_ENCODE_ASCII = _json.make_encoder(None, _unencodable, _json.encode_basestring_ascii, None, ":", ",", False, False, True)
_ENCODE = _json.make_encoder(None, _unencodable, _json.encode_basestring, None, ":", ",", False, False, True)


def json_loads(text):
    """json.loads: one JSON value, whitespace around it; ValueError otherwise."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode()
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _SCAN(text, start)
    except StopIteration as e:
        raise ValueError(f"Expecting value: char {e.value}") from None
    except SystemError:
        # The scanner reports a malformed value through json.decoder's
        # error class, found only once json is imported (by a sandbox's
        # code, in the worker); otherwise it fails without an exception.
        raise ValueError("malformed JSON") from None
    if text[end:].strip(_WHITESPACE):
        raise ValueError(f"Extra data: char {end}")
    return value


def json_dumps(value, ensure_ascii=True):
    """json.dumps, with compact separators."""
    return "".join((_ENCODE_ASCII if ensure_ascii else _ENCODE)(value, 0))


class Socket(_socket.socket):
    """A socket with what the agent uses of socket.socket: `with` and accept."""

    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def accept(self):
        fd, address = self._accept()
        return Socket(fileno=fd), address


def unix_socket():
    return Socket(_socket.AF_UNIX, _socket.SOCK_STREAM)


def send_fds(conn, buffers, fds):
    """socket.send_fds (descriptors packed with struct: the array module
    imports collections, a few ms of every sandbox's start)."""
    return conn.sendmsg(buffers, [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])


def recv_fds(conn, bufsize, maxfds):
    """socket.recv_fds: (message, received descriptors, flags, address)."""
    msg, ancillary, flags, address = conn.recvmsg(bufsize, _socket.CMSG_LEN(maxfds * 4))
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.extend(struct.unpack(f"{len(data) // 4}i", data[: len(data) - len(data) % 4]))
    return msg, fds, flags, address


def readable(fileobj, timeout):
    """Whether `fileobj` (a descriptor or anything with fileno) has something
    to read, or its end, within `timeout` seconds."""
    poll = select.poll()
    poll.register(fileobj, select.POLLIN)
    return bool(poll.poll(max(0, int(timeout * 1000))))


class Key:
    """What Selector.select names: the registered object, and its data."""

    __slots__ = ("fileobj", "fd", "data")

    def __init__(self, fileobj, fd, data):
        self.fileobj, self.fd, self.data = fileobj, fd, data


def _fd_of(fileobj):
    return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class Selector:
    """selectors.EpollSelector's register, unregister and select, for reading."""

    def __init__(self):
        self.epoll = select.epoll()
        self.keys = {}

    def register(self, fileobj, data=None):
        fd = _fd_of(fileobj)
        if fd in self.keys:
            raise KeyError(f"{fileobj!r} is already registered")
        self.epoll.register(fd, select.EPOLLIN)
        self.keys[fd] = Key(fileobj, fd, data)

    def unregister(self, fileobj):
        """KeyError when not registered; an object closed since is found by
        identity, as selectors does."""
        try:
            fd = _fd_of(fileobj)
        except ValueError:
            fd = -1
        key = self.keys.get(fd)
        if key is None or key.fileobj is not fileobj:
            key = next((k for k in self.keys.values() if k.fileobj is fileobj), None)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        del self.keys[key.fd]
        try:
            self.epoll.unregister(key.fd)
        except OSError:
            pass
        return key

    def select(self, timeout=None):
        ready = self.epoll.poll(-1 if timeout is None else max(timeout, 0))
        return [(self.keys[fd], events) for fd, events in ready if fd in self.keys]


class Timeout(Exception):
    """A process did not end within the time given to `wait`."""


class Child:
    """A process watched by pid: `poll` says its exit code once it ended."""

    def wait(self, timeout=5):
        deadline = time.monotonic() + timeout
        while (code := self.poll()) is None:
            if time.monotonic() >= deadline:
                raise Timeout(self.pid)
            time.sleep(0.01)
        return code


class Process(Child):
    """A program started in a session of its own (subprocess.Popen with
    start_new_session), in the agent's folder (the results folder, see
    Agent): standard input and output from and to the given descriptors
    (/dev/null by default), no other descriptor but `pass_fds` (the agent's
    are all close-on-exec). Started by posix_spawn, which does not copy the
    agent's memory as a fork would; a program that cannot be started raises
    OSError here, as Popen does. `program` is the file started, when not
    `argv[0]` found on PATH; `env` the environment, when not the agent's."""

    def __init__(self, argv, stdout=DEVNULL, stderr=DEVNULL, pass_fds=(), stdin=DEVNULL, program=None, env=None):
        self.returncode = None
        actions = [
            (os.POSIX_SPAWN_DUP2, stdin, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, stderr, 2),
        ]
        for fd in pass_fds:
            os.set_inheritable(fd, True)
        try:
            # Ignored signals stay ignored across exec; Python ignores SIGPIPE.
            self.pid = os.posix_spawnp(
                program or argv[0],
                argv,
                os.environ if env is None else env,
                file_actions=actions,
                setsid=True,
                setsigdef=(signal.SIGPIPE, signal.SIGXFSZ),
            )
        finally:
            for fd in pass_fds:
                os.set_inheritable(fd, False)

    def poll(self):
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped elsewhere: its status is lost (Popen says 0 too).
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def abandon(self):
        """Leaves the process to `reap_abandoned` (a zombie would hold a
        place under the sandbox's process limit), as Popen leaves a dropped
        child to the next one."""
        if self.poll() is None:
            ABANDONED.append(self)


class Forked(Child):
    """A child the agent forked (a preview relay), reaped as it ends."""

    def __init__(self, pid):
        self.pid = pid
        self.returncode = None

    poll = Process.poll


# Processes nobody waits for any more, until they end.
ABANDONED = []


def identity(st):
    """A file's identity (device, inode) from its stat: a file replaced at
    the same path is another file."""
    return st.st_dev, st.st_ino


def found_on_path(name):
    """The identity of the file a spawn finds as `name` on PATH now, the
    first regular, executable one; None if there is none."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and os.access(path, os.X_OK):
            return identity(st)
    return None


class Spare:
    """A shell started ahead of the next shell command: `sh -s`, in a
    session of its own, its output already in spool files, waiting on a
    pipe for its script. A command handed to it runs as `sh -c COMMAND`
    would (the same messages and line numbers, `$0`, `$#`, `$-`, standard
    input from /dev/null, exit codes; dash forks a last command under
    `sh -c` too); only its command line (`ps`) says `sh -s`."""

    def __init__(self, out, err):
        self.out, self.err = out, err
        # The image's shell, in the read-only root, and only while it is the
        # `sh` that PATH finds: a `sh` a run put earlier on PATH (the venv's
        # bin folder is the sandbox's) is never started by the agent on its
        # own, say while an install runs; commands go to it as `sh -c`.
        self.sh = identity(os.stat(SPARE_SHELL))
        if found_on_path("sh") != self.sh:
            raise OSError(f"sh on PATH is not {SPARE_SHELL}")
        fds = []
        try:
            for path in (out, err):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                # Made afresh, never opened as found: the agent opens these
                # on its own, and a FIFO planted at the name by a run's code
                # would block it, a link would point its writes elsewhere.
                fds.append(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            self.files = [identity(os.stat(fd)) for fd in fds]
            r, self.w = os.pipe()
            try:
                # A pipe a run's code filled (through /proc, as the same
                # user) refuses the script rather than blocking the agent.
                os.set_blocking(self.w, False)
                self.proc = Process(["sh", "-s"], stdout=fds[0], stderr=fds[1], stdin=r, program=SPARE_SHELL)
            except BaseException:
                os.close(self.w)
                raise
            finally:
                os.close(r)
        finally:
            for fd in fds:
                os.close(fd)

    @staticmethod
    def script(argv):
        """What a spare shell is handed for `argv`, when it can take it: a
        shell command (the server's `sh -c`) short enough to arrive whole,
        and in which no word can turn the shell's own standard input to a
        file (`exec <file`, also through `eval`, `.` or `source`): the
        spare shell would read the rest of its script from there, where
        `sh -c` has all of its script in its argument."""
        if len(argv) != 3 or argv[:2] != ["sh", "-c"]:
            return None
        try:
            command = os.fsencode(argv[2])
        except UnicodeError:
            return None
        if len(SPARE_PROLOGUE) + len(command) > SPARE_SCRIPT_MAX or any(w in command for w in SPARE_REFUSES):
            return None
        return SPARE_PROLOGUE + command

    def hand(self, script):
        """Starts `script`; False (the spare discarded) when the shell is gone,
        `sh` on PATH is now another program, its pipe does not take the
        script at once, or its spool files were replaced (by a run's code:
        the agent's user is the sandbox's)."""
        try:
            intact = (
                self.proc.poll() is None
                and [identity(os.stat(f)) for f in (self.out, self.err)] == self.files
                and found_on_path("sh") == self.sh
                and os.write(self.w, script) == len(script)
            )
        except OSError:
            intact = False
        if not intact:
            self.discard()
            return False
        os.close(self.w)
        return True

    def discard(self):
        os.close(self.w)
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.abandon()
        for path in (self.out, self.err):
            try:
                os.unlink(path)
            except OSError:
                pass


def reap_abandoned():
    """Collects the abandoned processes that ended. Never waits for any
    process (a run's, the worker) that somebody still watches."""
    ABANDONED[:] = [p for p in ABANDONED if p.poll() is None]


def is_slot(slot):
    """A snapshot's or fork's name in the agent's folders: 32 hex digits."""
    return isinstance(slot, str) and len(slot) == 32 and all(c in "0123456789abcdef" for c in slot)


def reported(path):
    """A path under the results folder as the server knows it."""
    if RESULTS == RESULTS_REPORTED or not path.startswith(RESULTS + "/"):
        return path
    return RESULTS_REPORTED + path[len(RESULTS) :]


def coarse_now_ns():
    """The clock file timestamps are taken from, so a file written right after
    a run starts never looks older than the run."""
    try:
        return time.clock_gettime_ns(time.CLOCK_REALTIME_COARSE)
    except (AttributeError, OSError):
        return time.time_ns() - 10_000_000


# --------------------------------------------------------------------------
# Worker: runs user code in one persistent namespace.
# --------------------------------------------------------------------------


class Kernel:
    """The worker's side: one namespace that runs user code, request by
    request. It can leave a parked copy of itself (a copy-on-write fork, see
    `park`), which a later `resume` turns into the worker again: a snapshot
    of the Python state. Threads other than the main one do not survive a
    fork, so a snapshot holds none of them."""

    def __init__(self):
        import builtins

        self.namespace = {"__name__": "__main__", "__builtins__": builtins}
        self.running = False
        # The current run's outputs (made when it first shows something),
        # what it may show (output cap, file stamp), and the module that
        # renders them (loaded then).
        self.outputs = None
        self.showing = None
        self.renderer = None
        # `display` where IPython has it (a builtin): not a name of the
        # namespace, so forks and hibernation never try to carry it.
        builtins.display = self.display
        sys.meta_path.insert(0, PyplotHook(self.show_figures))
        signal.signal(signal.SIGINT, self.on_sigint)
        try:
            # Make the worker, not the agent, the first choice of the OOM killer.
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass

    def on_sigint(self, _sig, _frame):
        if self.running:
            raise KeyboardInterrupt

    def serve(self, reply_fd, request_fd):
        import importlib

        replies = os.fdopen(reply_fd, "w", buffering=1)
        requests = os.fdopen(request_fd, "rb")
        my_pid = os.getpid()
        while True:
            line = requests.readline()
            if not line:
                os._exit(0)
            req = json_loads(line)
            reap_children()
            if "park" in req:
                replies.write(json_dumps({"parked": self.park(req["park"], (reply_fd, request_fd))}) + "\n")
                continue
            if "dump" in req or "load" in req:
                replies.write(json_dumps(self.carry(req)) + "\n")
                continue
            out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(out, 1)
            os.dup2(err, 2)
            os.close(out)
            os.close(err)
            exit_code = 0
            error = None
            interrupted = False
            self.outputs = None
            self.showing = (
                req.get("output_cap") or 65536,
                req.get("stamp") or str(time.time_ns()),
                req.get("deadline") or time.monotonic() + 30,
            )
            self.running = True
            try:
                try:
                    os.chdir(RESULTS)
                except OSError:
                    pass
                importlib.invalidate_caches()
                self.run(req["code"])
            except SystemExit as e:
                exit_code = system_exit_code(e)
            except BaseException as e:  # noqa: BLE001 - every failure is reported to the caller
                exit_code = 1
                interrupted = isinstance(e, KeyboardInterrupt)
                error = error_of(e)
                sys.stderr.write(error["traceback"])
            finally:
                if os.getpid() != my_pid:
                    # A process forked by user code must never become a second worker.
                    os._exit(exit_code)
            try:
                if not interrupted:
                    # The figures left open, as a notebook's cell shows them.
                    self.show_figures(every=False)
            except KeyboardInterrupt:
                pass
            finally:
                self.running = False
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001 - user code may have replaced or closed it
                    pass
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
            os.dup2(DEVNULL, 1)
            os.dup2(DEVNULL, 2)
            reply = {"exit_code": exit_code}
            if self.outputs is not None:
                reply["outputs"] = self.outputs.result()
            if error is not None:
                reply["error"] = error
            self.outputs = self.showing = None
            replies.write(json_dumps(reply) + "\n")

    def run(self, code):
        """Runs `code` as a notebook cell: a last statement that is an
        expression (not ended by `;`) is evaluated apart, and its value shown."""
        tree = compile(code, "<sandbox>", "exec", _ast.PyCF_ONLY_AST)
        last = None
        if tree.body and isinstance(tree.body[-1], _ast.Expr) and not ends_with_semicolon(code, tree.body[-1]):
            last = tree.body.pop()
        exec(compile(tree, "<sandbox>", "exec"), self.namespace)
        if last is not None:
            value = eval(compile(_ast.Expression(last.value), "<sandbox>", "eval"), self.namespace)
            if value is not None:
                self.run_outputs().value(value)

    def run_outputs(self):
        """The current run's outputs, made on first use (the renderer is
        loaded then: runs that show nothing never load it)."""
        if self.outputs is None:
            if self.renderer is None:
                self.renderer = load_renderer()
            cap, stamp, deadline = self.showing
            self.outputs = self.renderer.Outputs(RESULTS, reported, cap, stamp, deadline)
        return self.outputs

    def display(self, *objs, **_options):
        """IPython's `display`: each object becomes an output of the run, in
        order with the others (printed text stays in stdout)."""
        if self.showing is None:
            # Outside a run (a thread that outlived it): nothing to show it in.
            return
        self.run_outputs().display(*objs)

    def show_figures(self, every=True):
        """`plt.show()` (every open figure), and a run's end (those changed
        since last saved): each shown as an image and closed."""
        if self.showing is None or "matplotlib.pyplot" not in sys.modules:
            return
        try:
            self.run_outputs().figures(every)
        except KeyboardInterrupt:
            raise
        except BaseException:  # noqa: BLE001 - the figures are the sandbox's
            pass

    def carry(self, req):
        """Writes the namespace to, or reads it from, a fork file; an
        interrupt (the agent's deadline) ends either."""
        self.running = True
        try:
            if "dump" in req:
                answer = dump_namespace(self.namespace, req["dump"])
                try:
                    compile_imported()
                except BaseException:  # noqa: BLE001 - the dump is written: it answers
                    pass
                return {"answer": answer}
            return {"answer": load_namespace(self.namespace, req["load"])}
        except BaseException as e:  # noqa: BLE001 - reported to the server
            return {"error": reason(e)}
        finally:
            self.running = False
            reap_children()

    def park(self, path, channel):
        """Leaves a copy of this process listening at `path`, in a session of
        its own (so that ending a run's processes spares it); answers its pid,
        or None when the copy could not be made."""
        listener = unix_socket()
        ready_r, ready_w = os.pipe()
        try:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            listener.bind(path)
            os.chmod(path, 0o600)
            listener.listen(4)
            pid = os.fork()
        except OSError:
            listener.close()
            os.close(ready_r)
            os.close(ready_w)
            return None
        if pid == 0:
            try:
                os.close(ready_r)
                self.parked(listener, channel, ready_w)
            finally:
                os._exit(0)
        listener.close()
        os.close(ready_w)
        # Answer only once the copy has left this session: the end of the
        # next run kills whatever is still in it.
        # Within less than the agent waits for this answer, so the agent
        # always hears it.
        left = readable(ready_r, QUERY_DEADLINE / 2) and os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        if not left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            return None
        return pid

    def parked(self, listener, channel, ready):
        """The parked copy: holds the namespace and, asked to `resume` with a
        pair of pipe ends, forks a worker that serves on them (the copy stays,
        so one snapshot restores any number of times); asked to `exit`, ends."""
        for fd in channel:
            os.close(fd)
        os.setsid()
        os.write(ready, b"1")
        os.close(ready)
        # Resumed workers are reaped by the kernel, not by this process.
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(QUERY_DEADLINE)
                try:
                    msg, fds, _flags, _addr = recv_fds(conn, 4096, 2)
                    op = json_loads(msg.decode()).get("op")
                except (OSError, ValueError, AttributeError):
                    continue
                if op == "exit":
                    os._exit(0)
                if op != "resume" or len(fds) != 2:
                    for fd in fds:
                        os.close(fd)
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    conn.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, self.on_sigint)
                    os.setsid()
                    self.serve(fds[0], fds[1])
                for fd in fds:
                    os.close(fd)
                try:
                    conn.sendall((json_dumps({"pid": pid}) + "\n").encode())
                except OSError:
                    pass


def reason(e):
    """Why a name was not carried, or a dump or load failed: short."""
    return f"{type(e).__name__}: {e}"[:MAX_REASON]


def carried(python, names=0, skipped=()):
    """The answer to a dump or load: what became of the namespace."""
    return {"python": python, "names": names, "skipped": list(skipped)[:MAX_SKIPPED]}


def lost(why):
    """Nothing carried, and why (as the whole namespace, "*")."""
    return carried("lost", skipped=[["*", why]])


def pickler():
    """cloudpickle (which carries functions and classes by value) where the
    image has it, otherwise the stdlib's pickle."""
    sys.path.insert(0, AGENT_LIB)
    try:
        import cloudpickle

        return cloudpickle
    except ImportError:
        import pickle

        return pickle
    finally:
        try:
            sys.path.remove(AGENT_LIB)
        except ValueError:
            pass


def clear_forks():
    """Removes fork files left behind (by a server or agent that stopped
    mid-fork): each holds a whole namespace, on the sandbox's disk. Not at
    the agent's start: a new fork's file may be placed before it starts."""
    try:
        for name in os.listdir(FORKS):
            os.unlink(os.path.join(FORKS, name))
    except OSError:
        pass
    remove_empty_folders()


def remove_empty_folders():
    """Removes the folder of fork files and the agent's own folder in the
    results when nothing is left in them (the user sees the results)."""
    for folder in (FORKS, os.path.join(RESULTS, PRIVATE)):
        try:
            os.rmdir(folder)
        except OSError:
            return


def carried_names(namespace):
    """The names a fork carries: all but the interpreter's own (dunders)."""
    return [n for n in namespace if not (n.startswith("__") and n.endswith("__"))]


class Discard:
    """A file that keeps nothing: a trial pickling's sink. Large payloads
    come as buffers (a numpy array's `PickleBuffer`), not bytes."""

    def write(self, data):
        return memoryview(data).nbytes


def dump_namespace(namespace, path):
    """Writes the namespace to `path` as one pickle, so that two names that
    share an object still share it in the fork. When it does not pickle
    whole, each name is tried on its own first and those that do not pickle
    (open sockets, threads, generators...) are left out and listed. The
    file: a magic, then the pickle of a dict of names."""
    module = pickler()
    names = carried_names(namespace)
    skipped = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(FORK_MAGIC)
            try:
                module.dump({n: namespace[n] for n in names}, f, protocol=5)
            except (KeyboardInterrupt, MemoryError, OSError):
                raise
            except Exception:  # noqa: BLE001 - some name does not pickle: find which
                for name in names:
                    try:
                        module.dump(namespace[name], Discard(), protocol=5)
                    except (KeyboardInterrupt, MemoryError, OSError):
                        raise
                    except Exception as e:  # noqa: BLE001 - listed for the caller
                        skipped.append([name, reason(e)])
                left_out = {name for name, _ in skipped}
                f.seek(len(FORK_MAGIC))
                f.truncate()
                module.dump({n: namespace[n] for n in names if n not in left_out}, f, protocol=5)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    return carried("partial" if skipped else "carried", len(names) - len(skipped), skipped)


COMPILE_FOR = 3.0
COMPILE_AT_MOST = 2 * 1024 * 1024
COMPILE_STOPS = (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS)


def compile_imported(budget=COMPILE_FOR):
    """Writes the bytecode of the modules imported from the venv that have
    none, or a stale one, for the worker that loads this namespace (a wake
    or a fork) and every later process: Python writes no bytecode at import
    in a sandbox (PYTHONDONTWRITEBYTECODE) and uv installs none, so each of
    them compiled numpy from source again, twice its import's time. Within
    `budget` seconds, sources up to COMPILE_AT_MOST bytes, and only until a
    write fails for want of room or rights; a module that does not compile
    is left to compile at import, as before. Plain modules only, read
    through their dict: the sandbox's objects in sys.modules run no code
    here."""
    import importlib.util
    import py_compile
    from types import ModuleType

    deadline = time.monotonic() + budget
    venv = VENV + os.sep
    for module in list(sys.modules.values()):
        if time.monotonic() > deadline:
            return
        if type(module) is not ModuleType:
            continue
        source = vars(module).get("__file__")
        if type(source) is not str or not source.endswith(".py"):
            continue
        try:
            source = os.path.realpath(source)
            if not source.startswith(venv):
                continue
            st = os.stat(source)
            # A FIFO in the sandbox's venv would hold the read forever.
            if not stat.S_ISREG(st.st_mode) or st.st_size > COMPILE_AT_MOST:
                continue
            cached = importlib.util.cache_from_source(source)
            if bytecode_current(cached, st):
                continue
            py_compile.compile(source, cfile=cached, doraise=True)
        except OSError as e:
            if e.errno in COMPILE_STOPS:
                return
        except Exception:  # noqa: BLE001 - a source that does not compile, an odd path
            continue


def bytecode_current(cached, st):
    """Whether `cached` is bytecode of the source `st` describes, as Python
    checks it: its header's magic, then the source's mtime and size (a
    hash-based one Python checks itself)."""
    import importlib.util

    try:
        # Not followed, never waited on: the venv is the sandbox's to fill.
        fd = os.open(cached, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            header = f.read(16)
    except OSError:
        return False
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    if int.from_bytes(header[4:8], "little") != 0:
        return True
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF


def load_namespace(namespace, path):
    """Reads a file `dump_namespace` wrote into the namespace, and removes it."""
    import pickle

    pickler()  # loads cloudpickle, whose functions the pickle names
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if f.read(len(FORK_MAGIC)) != FORK_MAGIC:
                raise ValueError("not a fork file")
            names = pickle.load(f)
        if not isinstance(names, dict):
            raise ValueError("not a fork file")
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001 - a module missing in the fork, say
        return lost(reason(e))
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        remove_empty_folders()
    namespace.update(names)
    return carried("carried", len(names))


def worker_main(reply_fd, request_fd):
    Kernel().serve(reply_fd, request_fd)


def user_traceback(e):
    """A traceback without the agent's own frames (the exec call and the
    interrupt handler), so it reads as if the user's code ran as a script."""
    import traceback

    # The file the agent's frames name: its source's, also when it runs from
    # bytecode (whose `__file__` is the bytecode's).
    agent = user_traceback.__code__.co_filename
    frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != agent]
    lines = ["Traceback (most recent call last):\n"] if frames else []
    lines += traceback.format_list(frames)
    lines += traceback.format_exception_only(type(e), e)
    return "".join(lines)


def error_of(e):
    """An uncaught exception as the result carries it: its type's name, its
    message and the traceback of the user's frames (printed to stderr as
    well), each bounded; the traceback keeps its end, where the error is."""
    try:
        text = user_traceback(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__, say
        text = f"{type(e).__name__}: (its message could not be read)\n"
    try:
        value = str(e)
    except BaseException:  # noqa: BLE001 - as above
        value = ""
    return {
        "name": utf8_head(type(e).__name__, MAX_ERROR_NAME),
        "value": utf8_head(value, MAX_ERROR_VALUE),
        "traceback": utf8_tail(text, MAX_ERROR_TRACEBACK),
    }


def utf8_head(text, most):
    """The start of `text` within `most` bytes of UTF-8, without lone
    surrogates (the answer crosses JSON twice)."""
    return text.encode("utf-8", "replace")[:most].decode("utf-8", "ignore")


def utf8_tail(text, most):
    """The end of `text` within `most` bytes of UTF-8, as `utf8_head`."""
    data = text.encode("utf-8", "replace")
    return data[len(data) - min(most, len(data)) :].decode("utf-8", "ignore")


def ends_with_semicolon(code, node):
    """Whether the statement `node` (the last one) is followed by `;`, which
    keeps a notebook from showing its value."""
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    line = lines[node.end_lineno - 1].encode("utf-8")[node.end_col_offset :].decode("utf-8", "replace")
    rest = "\n".join([line] + lines[node.end_lineno :])
    return rest.lstrip(" \t\n\\\x0c").startswith(";")


def load_renderer():
    """docker/outputs.py, beside this file, as a module of its own that
    the sandbox's code never finds in sys.modules."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mcp_sandbox_outputs", OUTPUTS_SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class PyplotHook:
    """Makes `matplotlib.pyplot.show()` show the figures as a notebook does
    (under the Agg backend it does nothing), and a saved figure count as
    drawn (its `stale` flag cleared, as a draw clears it), so that a run's
    end shows only figures changed since they were saved: when pyplot is
    imported, its `show` and `Figure.savefig` are replaced. Imports of
    anything else are not touched."""

    def __init__(self, show):
        self.show = show

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = ShowingLoader(spec.loader, self.show)
                return spec
        return None


class ShowingLoader:
    """pyplot's own loader, whose module then gets the worker's `show`, and
    whose `Figure.savefig` leaves the figure drawn. Anything else is the
    wrapped loader's."""

    def __init__(self, loader, show):
        self.loader = loader
        self.show = show

    def __getattr__(self, name):
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        show = self.show

        def pyplot_show(*_args, **_kwargs):
            """Shows every open figure as an image of this run's result and closes it."""
            show(every=True)

        module.show = pyplot_show
        figure = getattr(module, "Figure", None)
        savefig = getattr(figure, "savefig", None)
        if savefig is None:
            return

        def drawn_savefig(fig, *args, **kwargs):
            result = savefig(fig, *args, **kwargs)
            # Saving drew it; only a later change makes it stale again
            # (savefig restores the dpi it drew at, which marks it stale).
            try:
                fig.stale = False
            except Exception:  # noqa: BLE001 - the figure is the sandbox's
                pass
            return result

        drawn_savefig.__doc__ = savefig.__doc__
        drawn_savefig.__wrapped__ = savefig
        figure.savefig = drawn_savefig


def system_exit_code(e):
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else 1
    print(code, file=sys.stderr)
    return 1


class Adopted(Child):
    """A worker resumed from a parked copy: a child of that copy, not of the
    agent, so it is watched by pid; its exit code is not known here."""

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        try:
            with open(f"/proc/{self.pid}/stat", "rb") as f:
                stat_line = f.read()
            if stat_line[stat_line.rindex(b")") + 2 :].split()[0] != b"Z":
                return None
        except (OSError, ValueError, IndexError):
            pass
        return 1


def worker_script():
    """What the worker starts from. A script named on the command line is
    compiled at every start (about 11 ms of CPU, paid by every warm pooled
    sandbox and every first Python call); bytecode is not, but only the
    interpreter version that made it runs it: the image's bytecode when the
    venv's interpreter is still the image's own (the agent's), the source
    otherwise (the sandbox may have replaced its venv's interpreter)."""
    try:
        # The kernel follows the links (realpath would recurse once a link,
        # and a chain the sandbox made would end the agent).
        same = os.path.samestat(os.stat(WORKER_PYTHON), os.stat(sys.executable))
    except OSError:
        same = False
    if same and os.path.isfile(AGENT_BYTECODE):
        return AGENT_BYTECODE
    return AGENT_SOURCE


class Worker:
    """Handle on the worker process, started lazily and again after it dies."""

    def __init__(self):
        self.proc = None
        self.replies = None
        self.requests = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ensure(self):
        if self.alive():
            return
        self.close()
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        try:
            self.proc = Process(
                [WORKER_PYTHON, "-u", worker_script(), "--worker", str(rep_w), str(req_r)],
                pass_fds=(rep_w, req_r),
            )
        except BaseException:
            os.close(req_w)
            os.close(rep_r)
            raise
        finally:
            os.close(req_r)
            os.close(rep_w)
        self.requests = os.fdopen(req_w, "wb", buffering=0)
        self.replies = os.fdopen(rep_r, "rb")

    def park(self, path):
        """Leaves a parked copy of the worker at `path`: "parked"; or "fresh"
        when there is no worker (the next exec starts with a fresh namespace,
        which is then the state to keep)."""
        if not self.alive():
            return "fresh"
        self.requests.write((json_dumps({"park": path}) + "\n").encode())
        answered = readable(self.replies, QUERY_DEADLINE)
        try:
            answer = json_loads(self.replies.readline()) if answered else None
            pid = answer["parked"]
        except (ValueError, KeyError, TypeError):
            # A worker that does not answer in time (or answers wrongly) may
            # answer later, mistaken for a run's reply: it is replaced.
            self.close()
            raise OSError("the Python worker did not answer; its state is lost") from None
        if not isinstance(pid, int):
            raise OSError("the Python worker could not be copied (the sandbox's process or memory limit?)")
        return "parked"

    def resume(self, path):
        """Replaces the worker with one forked from the copy parked at
        `path`: "restored"; "lost" (a fresh worker) when the copy is gone."""
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        pid = None
        try:
            with unix_socket() as conn:
                conn.settimeout(QUERY_DEADLINE)
                conn.connect(path)
                send_fds(conn, [b'{"op": "resume"}\n'], [rep_w, req_r])
                answer = b""
                while not answer.endswith(b"\n") and len(answer) < 4096:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
                pid = json_loads(answer)["pid"]
        except (OSError, ValueError, KeyError, TypeError):
            pid = None
        finally:
            os.close(rep_w)
            os.close(req_r)
        self.close()
        if not isinstance(pid, int) or pid <= 1:
            os.close(req_w)
            os.close(rep_r)
            self.ensure()
            return "lost"
        self.proc = Adopted(pid)
        self.requests = os.fdopen(req_w, "wb", buffering=0)
        self.replies = os.fdopen(rep_r, "rb")
        return "restored"

    def close(self):
        for f in (self.requests, self.replies):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
        self.requests = self.replies = None
        if self.proc is not None:
            kill_session(self.proc.pid, include_leader=True)
            try:
                self.proc.wait(timeout=5)
            except Timeout:
                if isinstance(self.proc, Process):
                    self.proc.abandon()
        self.proc = None


def unpark(path):
    """Ends the copy parked at `path`, if it is still there."""
    try:
        with unix_socket() as conn:
            conn.settimeout(QUERY_DEADLINE)
            conn.connect(path)
            conn.sendall(b'{"op": "exit"}\n')
    except OSError:
        pass
    try:
        os.unlink(path)
    except OSError:
        pass


def session_members(sid, include_leader):
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid == sid and not include_leader:
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat_line = f.read()
            fields = stat_line[stat_line.rindex(b")") + 2 :].split()
            # Zombies (state Z) are already dead; their parent reaps them.
            if int(fields[3]) == sid and fields[0] != b"Z":
                members.append(pid)
        except (OSError, ValueError, IndexError):
            continue
    return members


def kill_session(sid, include_leader):
    """SIGKILL every process in session `sid` (what a run started, a fork bomb
    included). Each round freezes the processes it finds before killing them,
    so none can fork meanwhile; rounds repeat until none is left."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        victims = session_members(sid, include_leader)
        if not victims:
            return
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in victims:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        time.sleep(0.005)


def reap_children():
    """Collects children that ended (killed with the previous run's session):
    a zombie keeps its PID, and PIDs are limited."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


# --------------------------------------------------------------------------
# Background processes (start_process): commands that outlive runs, whose
# output the agent keeps and whose end it notes.
# --------------------------------------------------------------------------

# Their output logs and records, on the sandbox's own disk (under its quota)
# and beside the full outputs of runs: never reported as artifacts.
PROCESSES = os.path.join(RESULTS, PRIVATE, "processes")
# A started command goes through a second shell given the folder and the
# command as its arguments: nothing the caller sent is ever spliced into
# shell text.
PROCESS_SHELL = 'cd -- "$0" || exit 127; exec /bin/sh -c "$1"'
PROCESS_SIGNALS = {"TERM": 15, "INT": 2, "HUP": 1, "QUIT": 3, "KILL": 9, "USR1": 10, "USR2": 12}
# The most of a record read back after a restart, of a command reported,
# and of the reads that wait for output at once.
MAX_RECORD = 8192
MAX_COMMAND = 2000
MAX_FOLLOWERS = 64
# What one read of a process's pipe takes (its output is drained as it
# comes), and how many reads one turn of the agent's loop makes of it.
OUTPUT_CHUNK = 65536
DRAIN_CHUNKS = 4
# How long the agent waits for a port's connection to complete: on the
# sandbox's own loopback it completes at once unless the app's backlog is
# full, and the agent serves nothing else meanwhile.
CONNECT_WAIT = 0.5
# How long a stop waits past its grace for the killed session to end.
STOP_SLACK = 5.0


def is_process_id(pid):
    return isinstance(pid, str) and len(pid) == 12 and all(c in "0123456789abcdef" for c in pid)


def utf8_cut(data):
    """`data` without a last character that it cuts in two."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


class Background:
    """One started command: the read end of its output pipe (stdout and
    stderr together, in the order written), the write end of its input,
    and its log, which keeps the last `keep` bytes: offsets count every
    byte it ever wrote, and `dropped` of them are no longer kept."""

    def __init__(self, pid, record, keep):
        self.id = pid
        self.record = record
        self.keep = keep
        self.proc = None
        self.out = None
        self.stdin = None
        self.log = os.path.join(PROCESSES, pid + ".log")
        self.log_fd = None
        self.total = int(record.get("output_bytes") or 0)
        self.dropped = int(record.get("dropped") or 0)
        self.stop_at = None

    @property
    def running(self):
        return self.record.get("state") == "running"

    def info(self):
        r = self.record
        return {
            "process_id": self.id,
            "name": r.get("name"),
            "command": r.get("command"),
            "cwd": r.get("cwd"),
            "state": r.get("state"),
            "exit_code": r.get("exit_code"),
            "started_at": r.get("started_at"),
            "ended_at": r.get("ended_at"),
            "output_bytes": self.total,
            "note": r.get("note"),
        }

    def save(self):
        """Its record, for the agent of a later start of the container
        (which reports it ended with the container)."""
        self.record["output_bytes"] = self.total
        self.record["dropped"] = self.dropped
        path = os.path.join(PROCESSES, self.id + ".json")
        try:
            fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with open(fd, "w") as f:
                f.write(json_dumps(self.record))
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def remove(self):
        for path in (self.log, os.path.join(PROCESSES, self.id + ".json")):
            try:
                os.unlink(path)
            except OSError:
                pass

    def take(self, data):
        """Appends output to the log, dropping the oldest past `keep`."""
        self.total += len(data)
        try:
            if self.log_fd is None:
                self.log_fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.write(self.log_fd, data)
        except OSError as e:
            self.record["note"] = f"output was lost: {e.strerror}"
            self.dropped = self.total
            self.truncate(b"")
            return
        if self.total - self.dropped > self.keep:
            self.truncate(self.read(self.total - self.keep // 2, self.keep // 2))
            self.dropped = self.total - self.keep // 2

    def truncate(self, tail):
        """Replaces the log with `tail`."""
        try:
            if self.log_fd is not None:
                os.close(self.log_fd)
            self.log_fd = os.open(self.log, os.O_WRONLY | os.O_TRUNC | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            os.write(self.log_fd, tail)
        except OSError:
            self.log_fd = None

    def read(self, start, count):
        """Up to `count` kept bytes from offset `start`."""
        try:
            fd = os.open(self.log, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return b""
        try:
            return os.pread(fd, count, max(0, start - self.dropped))
        except OSError:
            return b""
        finally:
            os.close(fd)

    def window(self, offset, most):
        start = max(int(offset), self.dropped)
        start = min(start, self.total)
        data = self.read(start, min(most, self.total - start))
        if start + len(data) < self.total:
            data = utf8_cut(data)
        return {
            "output": data.decode("utf-8", "replace"),
            "offset": start,
            "next_offset": start + len(data),
            "skipped": max(0, start - int(offset)),
            "process": self.info(),
        }

    def ended(self, code, note=None):
        r = self.record
        r["state"] = "exited"
        r["exit_code"] = code
        r["ended_at"] = time.time()
        if note:
            r["note"] = note
        if self.stdin is not None:
            os.close(self.stdin)
            self.stdin = None
        self.save()


class Follower:
    """A read or stop waiting for a process: answered when it has output
    past `offset` (a read that does not wait `until_end`), when it ends,
    or at `deadline`."""

    def __init__(self, conn, req, bg, deadline):
        self.conn, self.req, self.bg, self.deadline = conn, req, bg, deadline
        self.rid = req.get("id")

    def due(self, now):
        if now >= self.deadline or not self.bg.running:
            return True
        return self.req["op"] == "read_process" and not self.req.get("until_end") and self.bg.total > self.offset()

    def offset(self):
        return int(self.req.get("offset") or 0)

    def answer(self):
        if self.req["op"] == "stop_process":
            return {"process": self.bg.info()}
        return self.bg.window(self.offset(), read_most(self.req))


def read_most(req):
    return max(1, min(int(req.get("max") or 65536), 1 << 20))


def process_env(env):
    """The agent's environment with the caller's names (checked by the
    server too) on top."""
    merged = dict(os.environ)
    for k, v in (env or {}).items():
        if not (isinstance(k, str) and isinstance(v, str)) or not k or "=" in k or "\0" in k + v:
            raise ValueError(f"not an environment variable: {k!r}")
        merged[k] = v
    return merged


def load_records(keep):
    """The processes an earlier start of the container left records of:
    each ended with that container. The records are the sandbox's to
    rewrite, so each is read as untrusted (bounded, checked)."""
    table = {}
    try:
        names = sorted(os.listdir(PROCESSES))
    except OSError:
        return table
    for name in names:
        pid = name[:-5]
        if not (name.endswith(".json") and is_process_id(pid)) or len(table) >= 2 * MAX_FOLLOWERS:
            continue
        try:
            fd = os.open(os.path.join(PROCESSES, name), os.O_RDONLY | os.O_NOFOLLOW)
            with open(fd, "rb") as f:
                record = json_loads(f.read(MAX_RECORD))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict):
            continue
        clean = {k: record.get(k) for k in ("name", "command", "cwd", "state", "exit_code", "started_at", "ended_at", "note")}
        for k in ("name", "command", "cwd", "state", "note"):
            if not isinstance(clean[k], (str, type(None))):
                clean[k] = None
        clean["command"] = clean["command"] or ""
        for k in ("exit_code", "started_at", "ended_at", "output_bytes", "dropped"):
            if not isinstance(record.get(k), (int, float)) or isinstance(record.get(k), bool):
                record[k] = None
            if k in clean:
                clean[k] = record[k]
        clean["output_bytes"] = record["output_bytes"]
        clean["dropped"] = record["dropped"]
        bg = Background(pid, clean, keep)
        if bg.running or clean["state"] != "exited":
            bg.ended(None, "ended with its container (the sandbox was restarted, revived, forked or restored)")
        table[pid] = bg
    return table


def relay(a, b):
    """Carries bytes both ways between two connected sockets until both
    directions end (a preview connection of a runtime that cannot pass
    descriptors). Runs in a child of the agent."""
    a.setblocking(True)
    b.setblocking(True)
    poll = select.poll()
    ends = {a.fileno(): (a, b), b.fileno(): (b, a)}
    for fd in ends:
        poll.register(fd, select.POLLIN)
    while ends:
        for fd, _ in poll.poll():
            src, dst = ends[fd]
            try:
                data = src.recv(262144)
            except OSError:
                data = b""
            try:
                if data:
                    dst.sendall(data)
                    continue
                dst.shutdown(_socket.SHUT_WR)
            except OSError:
                return
            poll.unregister(fd)
            del ends[fd]


def connect_port(port):
    """A connection to `port` inside the sandbox (IPv4 loopback, then IPv6)
    made within CONNECT_WAIT each; the IPv4 attempt's error when neither works."""
    first = None
    for family, host in ((_socket.AF_INET, "127.0.0.1"), (_socket.AF_INET6, "::1")):
        s = Socket(family, _socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect((host, port))
            return s
        except BlockingIOError:
            poll = select.poll()
            poll.register(s, select.POLLOUT)
            err = s.getsockopt(_socket.SOL_SOCKET, _socket.SO_ERROR) if poll.poll(int(CONNECT_WAIT * 1000)) else 110
            if err == 0:
                return s
            first = first or OSError(err, os.strerror(err))
        except OSError as e:
            first = first or e
        s.close()
    raise first

# --------------------------------------------------------------------------
# Agent: socket server, jobs, output and artifact collection.
# --------------------------------------------------------------------------


class Watcher:
    """Files created or changed under the results folder, from inotify, so a
    run costs O(files it touched) rather than a scan of every file. Reports
    `None` when it cannot be sure (no inotify, the watch limit reached, the
    event queue overflowed); the caller then scans."""

    IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE = 0x2, 0x4, 0x8
    IN_MOVED_TO, IN_CREATE = 0x80, 0x100
    IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_ISDIR = 0x4000, 0x8000, 0x1000000, 0x40000000
    IN_DONT_FOLLOW = 0x2000000
    MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
    HEADER = struct.Struct("iIII")

    def __init__(self):
        import ctypes

        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = -1
        self.reset()

    def reset(self):
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self.dirs = {}
        self.changed = set()
        self.sure = self.fd >= 0
        if self.sure:
            self.watch_tree(RESULTS, record=False)

    def watch_tree(self, top, record):
        for root, dirs, files in os.walk(top):
            if root == RESULTS and PRIVATE in dirs:
                dirs.remove(PRIVATE)
            wd = self.libc.inotify_add_watch(self.fd, root.encode(), self.MASK | self.IN_ONLYDIR | self.IN_DONT_FOLLOW)
            if wd < 0:
                self.sure = False
                return
            self.dirs[wd] = root
            if record:
                # A folder made during the run: what it holds is new.
                self.changed.update(os.path.join(root, f) for f in files)

    def drain(self):
        while self.sure:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = self.HEADER.unpack_from(data, offset)
                name = data[offset + 16 : offset + 16 + size].rstrip(b"\0").decode("utf-8", "surrogateescape")
                offset += 16 + size
                if mask & self.IN_Q_OVERFLOW:
                    self.sure = False
                    return
                if mask & self.IN_IGNORED:
                    self.dirs.pop(wd, None)
                    continue
                parent = self.dirs.get(wd)
                if parent is None or not name:
                    continue
                path = os.path.join(parent, name)
                if mask & self.IN_ISDIR:
                    if mask & (self.IN_CREATE | self.IN_MOVED_TO) and not (parent == RESULTS and name == PRIVATE):
                        self.watch_tree(path, record=True)
                else:
                    self.changed.add(path)

    def begin(self):
        """A run starts: forget changes made before it."""
        if not self.sure:
            self.reset()
        self.drain()
        self.changed.clear()

    def changes(self):
        """Regular files the run created or changed, or None if unsure."""
        self.drain()
        if not self.sure:
            return None
        found = []
        for path in self.changed:
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    found.append(path)
            except OSError:
                pass
        found.sort()
        return found[:MAX_FILES]


WORKER_JOBS = ("exec", "dump", "load")


class Job:
    """One request in flight: a Python exec in the worker, a process run, or
    a dump or load of the namespace."""

    def __init__(self, req, conn, seq):
        self.req = req
        self.id = req.get("id")
        self.conn = conn
        self.kind = req["op"]
        self.timeout = max(0.001, float(req.get("timeout") or 30))
        self.cap = max(1024, int(req.get("output_cap") or 65536))
        self.progress = bool(req.get("progress"))
        self.started = time.monotonic()
        self.started_ns = coarse_now_ns()
        self.deadline = self.started + self.timeout
        self.grace_deadline = None
        self.timed_out = False
        self.cancelled = False
        self.proc = None
        # The worker an exec, dump or load runs in.
        self.worker = None
        # The fork file of a dump or load.
        self.carry_path = None
        # An exec's answer from the worker: its outputs and error.
        self.shown = {}
        self.out = os.path.join(SPOOL, f"{seq}.out")
        self.err = os.path.join(SPOOL, f"{seq}.err")
        self.sent = [0, 0]
        self.next_progress = self.started + PROGRESS_EVERY


class Agent:
    def __init__(self):
        # The folder runs and the worker start in (the image's working
        # folder already; the protocol tests move it).
        os.chdir(RESULTS)
        os.makedirs(SPOOL, exist_ok=True)
        self.sel = Selector()
        path = os.path.join(SOCKET_DIR, "agent.sock")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.listener = unix_socket()
        self.listener.bind(path)
        os.chmod(path, 0o600)
        self.listener.listen(64)
        self.listener.setblocking(False)
        self.sel.register(self.listener, "listen")
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        self.sel.register(self.wake_r, "wake")
        self.conns = {}
        self.worker = Worker()
        self.job = None
        self.seq = 0
        # The shell the next shell command is handed to, and when the next
        # is made (the agent idle for SPARE_AFTER; None: not before a run).
        self.spare = None
        self.spare_due = time.monotonic() + SPARE_AFTER
        # (path, ctime_ns, size) of the files a scan saw changed at the current
        # run's clock tick or later as it began: a file written in the same
        # tick before the run is not reported as the run's.
        self.recent = set()
        # Entries the last scan of the results folder met: past SCAN_AT_MOST,
        # runs are watched from then on (where inotify works).
        self.scanned = 0
        self.watcher = None
        self.can_watch = True
        # Background processes by id (read from their records on the first
        # process request), and the reads and stops waiting on them.
        self.procs = None
        self.followers = []

    def begin_tracking(self, started_ns):
        """Readies the account of what a run starting at `started_ns`
        changes under the results folder: a scan of what is there (which
        also tells whether it has grown too large to scan), or the watch."""
        if self.watcher is None:
            if self.can_watch or self.scanned <= SCAN_AT_MOST:
                self.recent = self.recent_files(started_ns)
            if self.scanned <= SCAN_AT_MOST or not self.can_watch:
                return
            try:
                self.watcher = Watcher()
            except (OSError, AttributeError, ImportError):  # no inotify here: scan instead
                self.can_watch = False
                return
        self.watcher.begin()

    # ---- connections ----------------------------------------------------
    # Several may be open: the server's request stream and short-lived ones
    # for queries. A run belongs to the connection that asked for it.
    def accept(self):
        conn, _ = self.listener.accept()
        if len(self.conns) >= MAX_CONNS:
            conn.close()
            return
        conn.setblocking(True)
        self.conns[conn] = b""
        self.sel.register(conn, "conn")

    def drop_conn(self, conn):
        if conn not in self.conns:
            return
        del self.conns[conn]
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()
        self.followers = [f for f in self.followers if f.conn is not conn]
        if self.job is not None and self.job.conn is conn:
            # Nobody waits for this run any more (the server restarted).
            self.job.cancelled = True
            self.stop_job(self.job)

    def send(self, conn, msg):
        if conn not in self.conns:
            return
        data = (json_dumps(msg, ensure_ascii=False) + "\n").encode()
        try:
            conn.sendall(data)
        except OSError:
            self.drop_conn(conn)

    def read_conn(self, conn):
        try:
            data = conn.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self.drop_conn(conn)
            return
        buf = self.conns[conn] + data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if line.strip():
                self.handle(conn, line)
            if conn not in self.conns:
                return
        if len(buf) > MAX_REQUEST:
            self.drop_conn(conn)
            return
        self.conns[conn] = buf

    def handle(self, conn, line):
        try:
            req = json_loads(line)
            op = req["op"]
        except (ValueError, KeyError, TypeError):
            self.send(conn, {"type": "error", "error": "malformed request"})
            return
        rid = req.get("id")
        if op == "ping":
            self.send(conn, {"id": rid, "type": "result", "pong": True})
        elif op == "interrupt":
            if self.job is not None and self.job.conn is conn:
                self.job.cancelled = True
                self.stop_job(self.job)
        elif op == "packages":
            self.send(conn, {"id": rid, "type": "result", "packages": list_packages()})
        elif op == "reset":
            if self.job is not None:
                self.send(conn, {"id": rid, "type": "error", "error": "busy"})
                return
            self.reset_worker()
            self.send(conn, {"id": rid, "type": "result", "reset": True})
        elif op in ("snapshot", "restore", "forget"):
            if op != "forget" and self.job is not None:
                self.send(conn, {"id": rid, "type": "error", "error": "busy"})
                return
            slot = req.get("slot")
            if not is_slot(slot):
                self.send(conn, {"id": rid, "type": "error", "error": "malformed request"})
                return
            path = os.path.join(PARKED, slot + ".sock")
            try:
                if op == "snapshot":
                    os.makedirs(PARKED, mode=0o700, exist_ok=True)
                    unpark(path)
                    try:
                        answer = {"python": self.worker.park(path)}
                    except OSError:
                        unpark(path)  # a copy made too late is not left behind
                        raise
                elif op == "restore":
                    answer = {"python": self.worker.resume(path) if req.get("python") else self.fresh_worker()}
                else:
                    unpark(path)
                    answer = {"forgotten": True}
            except OSError as e:
                self.send(conn, {"id": rid, "type": "error", "error": f"could not {op}: {e}"})
                return
            self.send(conn, {"id": rid, "type": "result", **answer})
        elif op in ("dump", "load"):
            if self.job is not None:
                self.send(conn, {"id": rid, "type": "error", "error": "busy"})
                return
            slots = [req.get("slot")] + ([req["from"]] if op == "dump" and req.get("from") is not None else [])
            if not all(is_slot(s) for s in slots):
                self.send(conn, {"id": rid, "type": "error", "error": "malformed request"})
                return
            try:
                answer = self.start_carry(req, conn)
            except Exception as e:  # noqa: BLE001 - reported to the caller
                self.job = None
                self.send(conn, {"id": rid, "type": "error", "error": f"could not {op}: {e}"})
                return
            if answer is not None:
                self.send(conn, {"id": rid, "type": "result", **answer})
        elif op in ("start_process", "list_processes", "read_process", "process_input", "stop_process"):
            try:
                answer = self.process_request(conn, req)
            except (OSError, ValueError, TypeError, KeyError) as e:
                self.send(conn, {"id": rid, "type": "error", "error": f"process: {reason(e)}"})
                return
            if answer is not None:
                self.send(conn, {"id": rid, "type": "result", **answer})
        elif op == "open_port":
            self.open_port(conn, req)
        elif op in ("exec", "run"):
            if self.job is not None:
                self.send(conn, {"id": rid, "type": "error", "error": "busy"})
                return
            try:
                self.start_job(req, conn)
            except Exception as e:  # noqa: BLE001 - reported to the caller
                self.job = None
                self.send(conn, {"id": rid, "type": "error", "error": f"could not start: {e}"})
        else:
            self.send(conn, {"id": rid, "type": "error", "error": f"unknown op {op!r}"})

    # ---- background processes ----------------------------------------------
    def process_table(self, keep):
        if self.procs is None:
            self.procs = load_records(keep)
        return self.procs

    def process_request(self, conn, req):
        """Answers a process request, or None when a follower will."""
        op = req["op"]
        keep = max(4096, int(req.get("keep") or 1 << 20))
        table = self.process_table(keep)
        if op == "start_process":
            return {"process": self.start_process(req, table, keep).info()}
        if op == "list_processes":
            return {"processes": [bg.info() for bg in table.values()]}
        bg = table.get(req.get("process_id")) if is_process_id(req.get("process_id")) else None
        if bg is None:
            raise KeyError(f"no process {req.get('process_id')!r} in this sandbox")
        if op == "process_input":
            if not bg.running or bg.stdin is None:
                raise ValueError("the process has ended")
            data = str(req["text"]).encode()
            try:
                written = os.write(bg.stdin, data)
            except BlockingIOError:
                written = 0
            return {"written": written, "process": bg.info()}
        now = time.monotonic()
        if op == "stop_process":
            sig = PROCESS_SIGNALS.get(req.get("signal") or "TERM")
            if sig is None:
                raise ValueError(f"unknown signal {req.get('signal')!r}")
            if not bg.running:
                return {"process": bg.info()}
            grace = max(0.0, min(float(req.get("grace") or 0), 60.0))
            if sig == signal.SIGKILL or grace == 0:
                kill_session(bg.proc.pid, include_leader=True)
            else:
                try:
                    os.killpg(bg.proc.pid, sig)
                except OSError:
                    pass
                bg.stop_at = now + grace
            deadline = now + grace + STOP_SLACK
        else:
            deadline = now + max(0.0, min(float(req.get("wait") or 0), 30.0))
        follower = Follower(conn, req, bg, deadline)
        self.poll_processes()
        if follower.due(now) or len(self.followers) >= MAX_FOLLOWERS:
            return follower.answer()
        self.followers.append(follower)
        return None

    def start_process(self, req, table, keep):
        most = max(1, int(req.get("max_processes") or 16))
        if sum(bg.running for bg in table.values()) >= most:
            raise ValueError(f"this sandbox already runs {most} processes; stop one with stop_process first")
        # Ended ones beyond the cap go, oldest first, with their output.
        ended = sorted((bg for bg in table.values() if not bg.running), key=lambda bg: bg.record.get("ended_at") or 0)
        while len(table) >= 2 * most and ended:
            gone = ended.pop(0)
            gone.remove()
            del table[gone.id]
        command = req["command"]
        if not isinstance(command, str) or not command.strip() or "\0" in command:
            raise ValueError("the command must be a non-empty string without NUL")
        cwd = req.get("cwd") or RESULTS_REPORTED
        if not isinstance(cwd, str) or "\0" in cwd:
            raise ValueError("cwd must be a path")
        if cwd == RESULTS_REPORTED or cwd.startswith(RESULTS_REPORTED + "/"):
            cwd = RESULTS + cwd[len(RESULTS_REPORTED) :]
        env = process_env(req.get("env"))
        os.makedirs(PROCESSES, mode=0o700, exist_ok=True)
        pid = os.urandom(6).hex()
        name = req.get("name")
        record = {
            "name": name[:200] if isinstance(name, str) and name else None,
            "command": command[:MAX_COMMAND],
            "cwd": req.get("cwd") or RESULTS_REPORTED,
            "state": "running",
            "exit_code": None,
            "started_at": time.time(),
            "ended_at": None,
            "note": None,
        }
        bg = Background(pid, record, keep)
        out_r, out_w = os.pipe()
        in_r, in_w = os.pipe()
        try:
            bg.proc = Process(["/bin/sh", "-c", PROCESS_SHELL, cwd, command], stdout=out_w, stderr=out_w, stdin=in_r, env=env)
        except BaseException:
            for fd in (out_r, in_w):
                os.close(fd)
            raise
        finally:
            os.close(out_w)
            os.close(in_r)
        os.set_blocking(out_r, False)
        os.set_blocking(in_w, False)
        bg.out, bg.stdin = out_r, in_w
        self.sel.register(out_r, ("output", bg))
        table[pid] = bg
        bg.save()
        return bg

    def drain(self, bg, most=DRAIN_CHUNKS):
        """Reads what a process wrote (its pipe is closed at its end): a few
        chunks a turn, so that a process that never stops writing does not
        keep the agent from its other work."""
        while bg.out is not None and most > 0:
            most -= 1
            try:
                data = os.read(bg.out, OUTPUT_CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                try:
                    self.sel.unregister(bg.out)
                except (KeyError, ValueError):
                    pass
                os.close(bg.out)
                bg.out = None
                return
            bg.take(data)

    def poll_processes(self):
        """Notes the processes that ended, kills those past their grace,
        and answers the followers that are due."""
        if not self.procs:
            return
        now = time.monotonic()
        for bg in self.procs.values():
            if not bg.running:
                continue
            if bg.stop_at is not None and now >= bg.stop_at:
                bg.stop_at = None
                kill_session(bg.proc.pid, include_leader=True)
            code = bg.proc.poll()
            if code is not None:
                # Its session's strays end with it; then what they all wrote.
                kill_session(bg.proc.pid, include_leader=False)
                self.drain(bg, most=64)
                bg.ended(128 - code if code < 0 else code)
        if self.followers:
            waiting = []
            for f in self.followers:
                if f.due(now):
                    self.send(f.conn, {"id": f.rid, "type": "result", **f.answer()})
                else:
                    waiting.append(f)
            self.followers = waiting

    def process_timeout(self, now):
        marks = [f.deadline for f in self.followers]
        marks += [bg.stop_at for bg in (self.procs or {}).values() if bg.stop_at is not None]
        if any(bg.running for bg in (self.procs or {}).values()):
            marks.append(now + 1.0)  # SIGCHLD wakes us; this only bounds a missed one
        return min(marks) - now if marks else None

    # ---- preview connections ----------------------------------------------
    def open_port(self, conn, req):
        """Connects to a port inside the sandbox for the server, which then
        owns the connection: passed as a descriptor (the sandbox gains no
        network by it; the server reaches only what the sandbox's own
        loopback reaches), or relayed over `conn` by a child of the agent."""
        rid = req.get("id")
        port = req.get("port")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            self.send(conn, {"id": rid, "type": "error", "error": "malformed request"})
            return
        try:
            target = connect_port(port)
        except OSError as e:
            self.send(conn, {"id": rid, "type": "error", "error": f"port {port}: {e.strerror or e}"})
            return
        line = (json_dumps({"id": rid, "type": "result", "connected": port}) + "\n").encode()
        with target:
            if not req.get("relay"):
                try:
                    send_fds(conn, [line], [target.fileno()])
                except OSError as e:
                    self.send(conn, {"id": rid, "type": "error", "error": f"could not pass the connection: {e}"})
                return
            try:
                conn.sendall(line)
                child = os.fork()
            except OSError as e:
                self.send(conn, {"id": rid, "type": "error", "error": f"could not relay: {e}"})
                return
            if child == 0:
                try:
                    signal.set_wakeup_fd(-1)
                    keep = (conn.fileno(), target.fileno())
                    os.closerange(3, min(keep))
                    os.closerange(min(keep) + 1, max(keep))
                    os.closerange(max(keep) + 1, 65536)
                    relay(conn, target)
                finally:
                    os._exit(0)
            ABANDONED.append(Forked(child))
        # The connection is the server's (or the relay's) from here on.
        self.drop_conn(conn)

    # ---- jobs -----------------------------------------------------------
    def reset_worker(self):
        """Replaces the worker (and what its runs left in its session) with a
        fresh one, started now so that the next exec finds it ready. Files and
        packages are untouched. If it cannot start now, the next exec starts it."""
        self.worker.close()
        try:
            self.worker.ensure()
        except OSError:
            self.worker.close()

    def fresh_worker(self):
        self.reset_worker()
        return "fresh"

    def start_carry(self, req, conn):
        """Starts a dump or load of the namespace as a job. A dump runs in a
        worker of its own, resumed from a parked copy (the snapshot's, or
        one made for it now), so that a dump that has to be killed never
        takes the sandbox's worker with it; a load runs in the sandbox's
        worker (a new fork's). Answers at once, without a job, when there is
        nothing to carry."""
        path = os.path.join(FORKS, req["slot"] + ".pickle")
        worker = self.worker
        if req["op"] == "dump":
            clear_forks()
            os.makedirs(FORKS, mode=0o700, exist_ok=True)
            worker = Worker()
            if req.get("from") is not None:
                resumed = worker.resume(os.path.join(PARKED, req["from"] + ".sock"))
            elif not self.worker.alive():
                return carried("fresh")
            else:
                # A copy parked for the time of the resume: the one it forks
                # lives on, reparented, after the copy is ended.
                os.makedirs(PARKED, mode=0o700, exist_ok=True)
                parked = os.path.join(PARKED, req["slot"] + ".sock")
                try:
                    self.worker.park(parked)
                    resumed = worker.resume(parked)
                finally:
                    unpark(parked)
            if resumed != "restored":
                worker.close()
                return lost("the snapshot's saved Python state is gone (the sandbox was restarted since)")
        else:
            worker.ensure()
        self.seq += 1
        job = Job(req, conn, self.seq)
        job.worker = worker
        job.carry_path = path
        try:
            self.sel.register(worker.replies, "worker")
            worker.requests.write((json_dumps({req["op"]: path}) + "\n").encode())
        except BaseException:
            try:
                self.sel.unregister(worker.replies)
            except (KeyError, ValueError):
                pass
            if worker is not self.worker:
                worker.close()
            raise
        self.job = job
        return None

    def start_job(self, req, conn):
        self.seq += 1
        job = Job(req, conn, self.seq)
        self.begin_tracking(job.started_ns)
        if job.kind == "exec":
            self.worker.ensure()
            job.worker = self.worker
            self.sel.register(self.worker.replies, "worker")
            msg = {
                "code": req["code"],
                "stdout": job.out,
                "stderr": job.err,
                "output_cap": job.cap,
                "stamp": f"{time.strftime('%Y%m%dT%H%M%S')}-{self.seq}",
                # CLOCK_MONOTONIC, the same in every process of the sandbox.
                "deadline": job.deadline,
            }
            self.worker.requests.write((json_dumps(msg) + "\n").encode())
        else:
            argv = [str(a) for a in req["argv"]]
            spare, script = self.spare, Spare.script(argv)
            if spare is not None and script is not None:
                self.spare = None
                if spare.hand(script):
                    job.out, job.err, job.proc = spare.out, spare.err, spare.proc
            if job.proc is None:
                with open(job.out, "wb") as out, open(job.err, "wb") as err:
                    job.proc = Process(argv, stdout=out.fileno(), stderr=err.fileno())
        self.job = job

    def stop_job(self, job):
        """Interrupt first (state survives); kill after the grace period."""
        if job.grace_deadline is not None:
            return
        job.grace_deadline = time.monotonic() + GRACE
        if job.kind in WORKER_JOBS:
            try:
                os.kill(job.worker.proc.pid, signal.SIGINT)
            except (OSError, AttributeError):
                pass
        else:
            kill_session(job.proc.pid, include_leader=True)

    def tick(self):
        reap_abandoned()
        self.poll_processes()
        job = self.job
        now = time.monotonic()
        if job is None:
            self.make_spare(now)
            return
        self.spare_due = now + SPARE_AFTER
        if job.kind == "run" and job.proc.poll() is not None:
            self.finish(job, job.proc.returncode)
            return
        if job.kind in WORKER_JOBS and job.worker.proc.poll() is not None:
            self.finish(job, None)
            return
        if job.grace_deadline is None and now >= job.deadline:
            job.timed_out = True
            self.stop_job(job)
        elif job.grace_deadline is not None and now >= job.grace_deadline:
            if job.kind in WORKER_JOBS:
                kill_session(job.worker.proc.pid, include_leader=True)
            else:
                kill_session(job.proc.pid, include_leader=True)
        if job.progress and now >= job.next_progress:
            job.next_progress = now + PROGRESS_EVERY
            self.send_progress(job)

    def make_spare(self, now):
        """Starts the spare shell when it is due; one that cannot start (the
        process limit reached, /tmp full) is not tried again before a run."""
        if self.spare is not None or self.spare_due is None or now < self.spare_due:
            return
        self.spare_due = None
        try:
            self.spare = Spare(os.path.join(SPOOL, "spare.out"), os.path.join(SPOOL, "spare.err"))
        except OSError:
            pass

    def send_progress(self, job):
        chunks = []
        for i, path in enumerate((job.out, job.err)):
            try:
                with open(path, "rb") as f:
                    f.seek(job.sent[i])
                    data = f.read(PROGRESS_CHUNK)
            except OSError:
                data = b""
            job.sent[i] += len(data)
            chunks.append(data.decode("utf-8", "replace"))
        if chunks[0] or chunks[1]:
            self.send(job.conn, {"id": job.id, "type": "progress", "stdout": chunks[0], "stderr": chunks[1]})

    def worker_replied(self):
        job = self.job
        line = job.worker.replies.readline()
        if not line:
            self.finish(job, None)
        elif job.kind == "exec":
            try:
                reply = json_loads(line)
            except ValueError:
                reply = None
            if not isinstance(reply, dict) or type(reply.get("exit_code")) is not int:
                # Not the worker's answer (the sandbox's code wrote to its pipe).
                reply = {"exit_code": 1}
            job.shown = reply
            self.finish(job, reply["exit_code"])
        else:
            try:
                reply = json_loads(line)
            except ValueError:
                reply = {"error": "the worker's answer was malformed"}
            self.finish(job, reply if isinstance(reply, dict) else {"error": "the worker's answer was malformed"})

    def finish_carry(self, job, reply):
        """Ends a dump or load: `reply` is the worker's, None when it died.
        A dump's own worker goes; the sandbox's worker (a load's) goes only
        if it died. A dump or load that failed answers "lost", with why, as
        the name "*", and its file is removed."""
        try:
            self.sel.unregister(job.worker.replies)
        except (KeyError, ValueError):
            pass
        if job.worker is not self.worker or reply is None:
            job.worker.close()
        self.job = None
        answer = reply.get("answer") if reply is not None else None
        if not isinstance(answer, dict):
            # What a failed or killed dump or load leaves is of no use.
            try:
                os.unlink(job.carry_path)
            except OSError:
                pass
            if job.timed_out:
                why = f"timed out after {job.timeout:g} s"
            elif reply is None:
                why = "the Python worker died"
            else:
                why = str(reply.get("error"))[:MAX_REASON]
            # Not an error of the protocol: the fork goes on without the state.
            self.send(job.conn, {"id": job.id, "type": "result", **lost(f"could not {job.kind} the namespace: {why}")})
            return
        # The worker ran the sandbox's code (a __reduce__) while it answered:
        # only the fields of an answer go back, under the job's own id.
        fields = {k: answer.get(k) for k in ("python", "names", "skipped")}
        self.send(job.conn, {**fields, "id": job.id, "type": "result"})

    def finish(self, job, exit_code):
        if job.kind in ("dump", "load"):
            self.finish_carry(job, exit_code)
            return
        state_lost = False
        note = ""
        if job.kind == "exec":
            try:
                self.sel.unregister(self.worker.replies)
            except (KeyError, ValueError):
                pass
            if exit_code is None:
                # The worker died: OOM kill, killed after ignoring an interrupt,
                # or user code that killed it. The namespace is gone.
                try:
                    code = self.worker.proc.wait(timeout=5)
                except Timeout:
                    code = -signal.SIGKILL
                exit_code = 128 + (-code) if code < 0 else (code or 1)
                state_lost = True
                self.worker.close()
                note = (
                    "\n[mcp-sandbox] The Python worker was killed"
                    + (" (memory limit?)" if exit_code == 137 and not job.grace_deadline else "")
                    + "; variables and imports were lost. Files are kept.\n"
                )
            else:
                # Processes a run started end with it (a fork bomb included);
                # one meant to outlive the run must leave the session (setsid).
                kill_session(self.worker.proc.pid, include_leader=False)
        else:
            kill_session(job.proc.pid, include_leader=True)
            if exit_code < 0:
                exit_code = 128 - exit_code
        if job.timed_out:
            exit_code = 124
            note += f"\n[mcp-sandbox] Timed out after {job.timeout:g} s.\n"
        elif job.cancelled:
            exit_code = 130
            note += "\n[mcp-sandbox] Cancelled.\n"
        stdout, out_trunc, out_file = collect_output(job.out, job.cap, job.id, "stdout")
        stderr, err_trunc, err_file = collect_output(job.err, job.cap, job.id, "stderr")
        # The spool is read: a file left behind (a full output that could not
        # be moved, say) would fill /tmp run after run until no run works.
        for spool in (job.out, job.err):
            try:
                os.unlink(spool)
            except OSError:
                pass
        result = {
            "id": job.id,
            "type": "result",
            "stdout": stdout,
            "stderr": stderr + note,
            "exit_code": exit_code,
            "timed_out": job.timed_out,
            "cancelled": job.cancelled,
            "state_lost": state_lost,
            "truncated": out_trunc or err_trunc,
            "output_files": [reported(f) for f in (out_file, err_file) if f],
            "duration_ms": round((time.monotonic() - job.started) * 1000, 3),
        }
        watched = self.watcher.changes() if self.watcher is not None else None
        changed = watched if watched is not None else self.changed_files(job.started_ns)
        outputs = checked_outputs(job.shown.get("outputs"))
        if outputs:
            result["outputs"] = outputs
        error = job.shown.get("error")
        if isinstance(error, dict) and all(isinstance(error.get(k), str) for k in ("name", "value", "traceback")):
            result["error"] = {k: error[k] for k in ("name", "value", "traceback")}
        # The images the run showed are among its outputs, not its files.
        shown = {o["path"] for o in outputs if "path" in o}
        result["files"] = [f for f in map(reported, changed) if f not in shown]
        self.job = None
        self.send(job.conn, result)

    def changed_files(self, since_ns):
        """What a scan finds (a small results folder, or no inotify): every
        file whose change time is not older than the run, less those that
        had that change time already when it began (written in the same
        clock tick before it, or by the end of the run before)."""
        current = self.recent_files(since_ns)
        found = sorted(key[0] for key in current if key not in self.recent)
        self.recent = current
        return found[:MAX_FILES]

    def recent_files(self, since_ns):
        """(path, change time, size) of the regular files under the results
        folder changed at `since_ns` or later (at most MAX_FILES), counting
        the entries met into `self.scanned`. (The size tells a file the run
        rewrote within the clock tick it was written in before the run.)"""
        found = set()
        stack = [RESULTS]
        scanned = 0
        while stack and len(found) < MAX_FILES:
            top = stack.pop()
            try:
                entries = list(os.scandir(top))
            except OSError:
                continue
            scanned += len(entries)
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if not (top == RESULTS and entry.name == PRIVATE):
                            stack.append(entry.path)
                        continue
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_ctime_ns >= since_ns:
                    found.add((entry.path, st.st_ctime_ns, st.st_size))
        self.scanned = scanned
        return found

    # ---- loop -------------------------------------------------------------
    def timeout(self):
        job = self.job
        now = time.monotonic()
        waits = self.process_timeout(now)
        if job is None:
            due = self.spare_due if self.spare is None else None
            marks = [m for m in (None if due is None else due - now, waits) if m is not None]
            return max(0.0, min(marks)) if marks else None
        marks = [job.grace_deadline or job.deadline]
        if waits is not None:
            marks.append(now + waits)
        if job.progress:
            marks.append(job.next_progress)
        if job.kind == "run":
            marks.append(now + 0.5)  # SIGCHLD wakes us; this only bounds a missed one
        return max(0.0, min(marks) - now)

    def serve(self):
        while True:
            for key, _ in self.sel.select(self.timeout()):
                what = key.data
                if what == "listen":
                    self.accept()
                elif what == "conn" and key.fileobj in self.conns:
                    self.read_conn(key.fileobj)
                elif what == "worker" and self.job is not None:
                    self.worker_replied()
                elif isinstance(what, tuple):
                    self.drain(what[1])
                elif what == "wake":
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
            self.tick()


def checked_outputs(outputs):
    """The outputs of the worker's answer that have the shape it gives them
    (its pipe is writable by the sandbox's code), at most MAX_OUTPUTS."""
    kept = []
    for o in outputs if isinstance(outputs, list) else ():
        if len(kept) == MAX_OUTPUTS:
            break
        if not isinstance(o, dict) or not isinstance(o.get("type"), str):
            continue
        item = {"type": o["type"], "bytes": o.get("bytes") if type(o.get("bytes")) is int else 0}
        for key, kind in (("text", str), ("path", str), ("width", int), ("height", int), ("main", bool), ("cut", bool)):
            if type(o.get(key)) is kind:
                item[key] = o[key]
        kept.append(item)
    return kept


def collect_output(path, cap, job_id, name):
    """Whole output when it fits the cap; otherwise head and tail, and the full
    output moved under the results folder so the server can link to it."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if size <= cap:
                return f.read().decode("utf-8", "replace"), False, None
            half = cap // 2
            head = f.read(half)
            f.seek(size - half)
            tail = f.read(half)
    except OSError:
        return "", False, None
    text = (
        head.decode("utf-8", "replace")
        + f"\n... [{size - 2 * half} bytes omitted; full output in the linked file] ...\n"
        + tail.decode("utf-8", "replace")
    )
    kept = None
    try:
        folder = os.path.join(RESULTS, PRIVATE, "output")
        os.makedirs(folder, exist_ok=True)
        kept = os.path.join(folder, f"{time.strftime('%Y%m%dT%H%M%S')}-{job_id}-{name}.txt")
        import shutil

        shutil.move(path, kept)
    except OSError:
        kept = None
    return text, True, kept


def package_path():
    """The folders the venv's distributions live in (read as data: nothing
    of the venv is imported by the agent)."""
    if os.environ.get("MCP_AGENT_SITE"):
        return os.environ["MCP_AGENT_SITE"].split(os.pathsep)
    import glob

    return sorted(glob.glob(os.path.join(VENV, "lib", "python*", "site-packages")))


def list_packages():
    from importlib import metadata

    seen = {}
    for dist in metadata.distributions(path=package_path()):
        # A distribution being written (an install in another container) or
        # broken by the sandbox's code is left out, not fatal.
        try:
            name, version = dist.metadata.get("Name"), dist.version
        except Exception:  # noqa: BLE001
            continue
        if name and isinstance(version, str) and name not in seen:
            seen[name] = version
    return [{"name": n, "version": v} for n, v in sorted(seen.items(), key=lambda kv: kv[0].lower())]


def start_egress_relay():
    """In a sandbox without network (an egress policy other than `open`) the
    relay to the server's egress proxy runs beside the agent, in a session of
    its own so that ending a run's processes never ends it. The agent serves
    only once the relay listens, so a sandbox's first run finds it there."""
    if os.environ.get("MCP_EGRESS_SOCKET"):
        relay = os.path.join(os.path.dirname(AGENT_SOURCE), "egress_relay.py")
        ready_r, ready_w = os.pipe()
        try:
            # Reaped if the sandbox's code ends it.
            Process([sys.executable, "-I", "-S", relay], stdout=ready_w, stderr=2).abandon()
        finally:
            os.close(ready_w)
        readable(ready_r, 5)
        os.close(ready_r)


def close_inherited_on_exec():
    """Marks the descriptors this process was started with (beyond the
    standard three) close-on-exec, as all of its own are: the programs it
    starts get none of them."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2:
            try:
                os.set_inheritable(fd, False)
            except OSError:
                pass


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        close_inherited_on_exec()
        start_egress_relay()
        Agent().serve()
