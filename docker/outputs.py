"""What a Python run shows besides its printed text, as a notebook would:
the value of its last expression, what it passed to `display()`, and the
matplotlib figures it showed or left open. Loaded by the Python worker
(docker/agent.py) the first time a run has something to show; stdlib only.

Every object shown is the sandbox's, hence hostile: its `_repr_*_` methods
and `repr` run under a timer and a time budget per run, and what they
answer is checked (type, size) before it is kept; any failure falls back to
a bounded `repr`, and that to the type's name. Images are written as files
under `/app/results/outputs/` (linked, and shown inline by the server on
the budget of saved images) rather than carried in the answer.
"""
import _signal as signal
import os
import sys
import time

# Most outputs kept from one run; past it, one text says how many were left out.
MAX_OUTPUTS = 32
# Most images (figures, `_repr_png_`) one run writes.
MAX_IMAGES = 16
# Largest text output (repr, Markdown, HTML, JSON), in bytes of UTF-8.
MAX_TEXT = 16 * 1024
# Seconds one object may take to render, and all of a run's together.
RENDER_SECONDS = 2.0
RENDER_TOTAL = 5.0
# A DataFrame's table: rows (head and tail halves), columns, cell width.
MAX_ROWS = 20
MAX_COLUMNS = 20
MAX_CELL = 40
# The folder under the results that images are written to; the run's
# `files` leaves them out (they are its outputs).
FOLDER = "outputs"

# What each IPython `_repr_*_` method gives, in the order an LLM is served
# best: a picture, then structured text, then markup.
RICH = (
    ("_repr_png_", "png"),
    ("_repr_jpeg_", "jpeg"),
    ("_repr_markdown_", "markdown"),
    ("_repr_json_", "json"),
    ("_repr_latex_", "latex"),
    ("_repr_svg_", "svg"),
    ("_repr_html_", "html"),
)


# Seconds of a run's deadline left to it after the last render.
MARGIN = 0.5
# Types whose repr is the interpreter's own, shown even when no time is left.
PLAIN = (int, float, complex, bool, str, bytes)


class RenderTimeout(BaseException):
    """A render ran past its time (a BaseException: code that catches
    Exception does not swallow it)."""


def utf8_size(text):
    return len(text.encode("utf-8", "replace"))


def cut(text, most):
    """`text` within `most` bytes of UTF-8, and whether it was cut."""
    data = text.encode("utf-8", "replace")
    if len(data) <= most:
        return text, False
    note = f"\n... [{len(data) - most} more bytes left out]"
    return data[: max(0, most - len(note))].decode("utf-8", "ignore") + note, True


def type_name(obj):
    t = type(obj)
    module = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or t.__name__
    return name if module == "builtins" else f"{module}.{name}"


class Outputs:
    """One run's outputs, in order, within the run's budget (`cap` bytes of
    text in all); `results` is the results folder, `stamp` names its files."""

    def __init__(self, results, reported, cap, stamp, deadline):
        self.results = results
        self.reported = reported
        self.left = max(1024, int(cap))
        self.stamp = stamp
        # Renders end MARGIN before the run's deadline (CLOCK_MONOTONIC).
        self.deadline = float(deadline) - MARGIN
        self.items = []
        self.dropped = 0
        self.images = 0
        self.render_left = RENDER_TOTAL
        # Whether the timer's signal is for a render (it may arrive just after one).
        self.rendering = False

    # ---- what a run shows -------------------------------------------------
    def value(self, obj):
        """The last expression's value (`None` shows nothing)."""
        if obj is not None:
            self.show(obj, main=True)

    def display(self, *objs):
        """`display(obj, ...)`: each object, in order."""
        for obj in objs:
            self.show(obj)

    def figures(self, every):
        """The open matplotlib figures, each closed once shown: all of them
        (`plt.show()`), or, as a run ends, those with something drawn that
        changed since they were last saved (a saved figure is a file of the
        run, shown as one, and is left open, as before)."""
        pyplot = sys.modules.get("matplotlib.pyplot")
        helpers = sys.modules.get("matplotlib._pylab_helpers")
        if pyplot is None or helpers is None:
            return
        try:
            managers = list(helpers.Gcf.get_all_fig_managers())
        except Exception:  # noqa: BLE001 - a replaced or broken matplotlib
            return
        for manager in managers:
            try:
                fig = manager.canvas.figure
                if not (every or (fig.stale and has_content(fig))):
                    continue
                self.show(fig)
                pyplot.close(fig)
            except RenderTimeout:
                continue
            except Exception:  # noqa: BLE001 - the figure is the sandbox's
                continue

    def result(self):
        items = list(self.items)
        if self.dropped:
            items.append(
                text_item(
                    "text",
                    f"[{self.dropped} more outputs left out: a run shows at most {MAX_OUTPUTS}"
                    " outputs, within its output budget]",
                )
            )
        return items

    # ---- rendering --------------------------------------------------------
    def show(self, obj, main=False):
        if len(self.items) >= MAX_OUTPUTS or self.left <= 0:
            self.dropped += 1
            return
        item = self.timed(lambda: self.render(obj))
        if item is None:
            item = self.timed(lambda: text_item("text", cut(repr(obj), MAX_TEXT)[0]))
        if item is None and type(obj) in PLAIN:
            item = text_item("text", cut(repr(obj), MAX_TEXT)[0])
        if item is None:
            item = text_item("text", f"<{type_name(obj)} object: it could not be shown>")
        if main:
            item["main"] = True
        if "text" in item:
            if item["bytes"] > self.left:
                item["text"], _ = cut(item["text"], self.left)
                item["bytes"] = utf8_size(item["text"])
                item["cut"] = True
            self.left -= item["bytes"]
        self.items.append(item)

    def timed(self, make):
        """`make()` under a timer, within the run's render budget and
        deadline: None when it failed, ran out of time or answered nothing
        usable. Off the main thread (display() from a thread) there is no
        timer, nor where a handler this process cannot restore has SIGALRM."""
        budget = min(RENDER_SECONDS, self.render_left, self.deadline - time.monotonic())
        if budget <= 0:
            return None
        started = time.monotonic()
        try:
            previous = signal.getsignal(signal.SIGALRM)
            timed = previous is not None
            if timed:
                signal.signal(signal.SIGALRM, self.alarm)
        except ValueError:
            timed = False
        timer = signal.setitimer(signal.ITIMER_REAL, budget) if timed else (0, 0)
        self.rendering = timed
        try:
            return make()
        except (RenderTimeout, Exception):  # noqa: BLE001 - the object's own methods failed
            return None
        finally:
            # The signal raises nothing once this is cleared, should it come now.
            self.rendering = False
            elapsed = time.monotonic() - started
            self.render_left -= elapsed
            if timed:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                if timer[0] > 0:
                    # The sandbox's own timer, less the time the render took.
                    signal.setitimer(signal.ITIMER_REAL, max(0.001, timer[0] - elapsed), timer[1])

    def alarm(self, _sig, _frame):
        if self.rendering:
            raise RenderTimeout

    def render(self, obj):
        """The form an LLM is served best by, or None (the caller falls back
        to the repr)."""
        if is_figure(obj):
            return self.figure(obj)
        frame = frame_markdown(obj)
        if frame is not None:
            return text_item("markdown", cut(frame, MAX_TEXT)[0])
        for method, form in RICH:
            if form == "html" and not default_repr(obj):
                # Markup costs an LLM more than the object's own repr says.
                return None
            data = rich(obj, method)
            if data is None:
                continue
            item = self.rich_item(form, data)
            if item is not None:
                return item
        return None

    def rich_item(self, form, data):
        if form in ("png", "jpeg"):
            if isinstance(data, str):
                import base64

                data = base64.b64decode(data)
            if not isinstance(data, (bytes, bytearray)) or len(data) > 32 << 20:
                return None
            return self.image(bytes(data), form)
        if form == "svg":
            if not isinstance(data, str):
                return None
            return self.image(data.encode("utf-8"), "svg")
        if form == "json":
            import json

            text = json.dumps(data, default=str, ensure_ascii=False)
        elif isinstance(data, str):
            text = data
        else:
            return None
        if utf8_size(text) > MAX_TEXT:
            return None
        if form == "latex":
            return text_item("markdown", text)
        return text_item(form, text)

    def figure(self, fig):
        if self.images >= MAX_IMAGES:
            return text_item("text", f"<a figure: at most {MAX_IMAGES} images per run>")
        return self.written("png", lambda f: fig.savefig(f, format="png", dpi="figure"))

    def image(self, data, form):
        if self.images >= MAX_IMAGES:
            return text_item("text", f"<an image: at most {MAX_IMAGES} images per run>")
        return self.written({"jpeg": "jpg"}.get(form, form), lambda f: f.write(data))

    def written(self, ext, write):
        """An image output of a new file that `write(file)` fills: never a
        file that was there (nor a link), and none left half-written."""
        path = self.next_path(ext)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
        except BaseException:
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        return self.image_item(path)

    def next_path(self, ext):
        folder = os.path.join(self.results, FOLDER)
        os.makedirs(folder, exist_ok=True)
        self.images += 1
        return os.path.join(folder, f"{self.stamp}-{self.images}.{ext}")

    def image_item(self, path):
        item = {"type": "image", "path": self.reported(path), "bytes": os.path.getsize(path)}
        size = image_size(path)
        if size is not None:
            item["width"], item["height"] = size
        return item


def text_item(form, text):
    # Valid UTF-8 only (no lone surrogates): the answer crosses JSON twice.
    text = text.encode("utf-8", "replace").decode("utf-8")
    return {"type": form, "text": text, "bytes": utf8_size(text)}


def rich(obj, method):
    """What `obj.<method>()` answers (the data of a `(data, metadata)` pair),
    or None. Looked up on the type, as IPython does for most: an object
    whose `__getattr__` answers any name is not taken to have them all."""
    if isinstance(obj, type):
        return None
    fn = getattr(type(obj), method, None)
    if fn is None or not callable(fn):
        return None
    data = getattr(obj, method)()
    if isinstance(data, tuple) and len(data) == 2:
        data = data[0]
    return data


def default_repr(obj):
    """Whether `repr(obj)` is object's own (`<... object at 0x...>`)."""
    return type(obj).__repr__ is object.__repr__


def is_figure(obj):
    t = type(obj)
    return t.__name__ == "Figure" and (getattr(t, "__module__", "") or "").startswith("matplotlib.")


def has_content(fig):
    return bool(fig.axes or fig.images or fig.texts or fig.lines or fig.patches or fig.artists)


def image_size(path):
    """Width and height from a PNG's, JPEG's or GIF's header, or None."""
    import struct

    try:
        with open(path, "rb") as f:
            head = f.read(64 * 1024)
    except OSError:
        return None
    if head[:8] == b"\x89PNG\r\n\x1a\n" and len(head) >= 24:
        return struct.unpack(">II", head[16:24])
    if head[:6] in (b"GIF87a", b"GIF89a") and len(head) >= 10:
        return struct.unpack("<HH", head[6:10])
    if head[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(head):
            if head[i] != 0xFF:
                return None
            marker = head[i + 1]
            length = struct.unpack(">H", head[i + 2 : i + 4])[0]
            if marker in (0xC0, 0xC1, 0xC2):
                h, w = struct.unpack(">HH", head[i + 5 : i + 9])
                return w, h
            i += 2 + length
    return None


# ---- pandas -----------------------------------------------------------------


def frame_markdown(obj):
    """A pandas DataFrame or Series as a Markdown table with its shape, cut
    to MAX_ROWS rows (head and tail) and MAX_COLUMNS columns with the cut
    said; None for anything else. pandas is not imported for it: the object
    is one of its types only if pandas is loaded already."""
    pandas = sys.modules.get("pandas")
    if pandas is None:
        return None
    if isinstance(obj, pandas.Series):
        name = obj.name if obj.name is not None else "value"
        frame = obj.to_frame(name=name)
        title = f"Series {obj.name!r}: " if obj.name is not None else "Series: "
        title += f"{len(obj):,} rows, dtype {obj.dtype}"
    elif isinstance(obj, pandas.DataFrame):
        frame = obj
        rows, columns = obj.shape
        title = f"DataFrame: {rows:,} rows × {columns:,} columns"
    else:
        return None
    rows, columns = frame.shape
    shown_columns = min(columns, MAX_COLUMNS)
    part = frame.iloc[:, :shown_columns]
    if rows > MAX_ROWS:
        half = MAX_ROWS // 2
        pieces = [(part.iloc[:half], 0), (part.iloc[rows - half :], rows - half)]
    else:
        pieces = [(part, 0)]
    header = [cell(frame.index.name or "")] + [cell(c) for c in part.columns]
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for n, (piece, _start) in enumerate(pieces):
        if n:
            lines.append("| … |" + " … |" * shown_columns)
        for index, row in zip(piece.index, piece.itertuples(index=False, name=None)):
            lines.append("| " + " | ".join([cell(index)] + [cell(v) for v in row]) + " |")
    cuts = []
    if rows > MAX_ROWS:
        cuts.append(f"the first and last {MAX_ROWS // 2} of {rows:,} rows")
    if columns > MAX_COLUMNS:
        cuts.append(f"the first {MAX_COLUMNS} of {columns:,} columns")
    if cuts:
        lines += ["", "Showing " + " and ".join(cuts) + "."]
    return "\n".join(lines)


def cell(value):
    text = str(value).replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
