"""The dashboard server `up` runs: Voila, launched through this module so that hostile clients can't break it.

`python -m widgets.voila_guard NOTEBOOK [Voila options]` is Voila with these guards (what it guards against is
upstream, voila 0.5.13 / jupyter_server 2.21.1; re-check them when either moves):

- **The kernel websocket speaks v1 only.** A client that does not offer the `v1.kernel.websocket.jupyter.org`
  subprotocol is refused before the upgrade (HTTP 400). Upstream, such a "legacy" connection gets the charts' binary
  messages in the old framing, which Voila's `read_header_from_binary_message` then reads as v1: its first 8 bytes
  become a part count near 2^60 and the server loops on it for good, its memory growing 20-50 MB/s.
- **Every v1 frame is checked before anything parses it:** a binary frame, at most MAX_PARTS parts, offsets that
  start right after the offset table, never go backwards and end at the frame's end, a known channel and a JSON
  header whose msg_type is one of the allowed (comm and kernel-info) types. Upstream,
  `deserialize_msg_from_ws_v1` trusts the part count: one frame claiming 2^62 parts hangs the server. A bad frame
  closes that connection (1008) with a one-line log.
- **Messages are capped** (MAX_MESSAGE_BYTES, tornado's `websocket_max_message_size`), and a client that stops
  reading is dropped once MAX_UNREAD_BYTES wait for it, instead of the server buffering the charts for it forever.
- **No code runs from a page:** only comm and kernel-info messages reach a kernel (execute, inspect, complete and
  debug requests are dropped: Voila's own list, checked here again), and pages get no tracebacks.
- **Page kernels end when their page is gone:** a kernel with no websocket for `page_grace_s` after its page was
  rendered (and not busy) is shut down, whatever its activity; a kernel still rendering its page is never (on a
  loaded machine its start alone can outlast the grace); at most `max_pages` page kernels run or start at once,
  and a page beyond them is refused with a 503 that says so (PageKernelManager).
- **A kernel id alone reaches nothing:** the page that started a kernel gets a cookie for it (HttpOnly, SameSite
  Strict, an HMAC of the kernel id under a secret of this server run); its kernel websocket is refused (403) without
  it, so an id read from a process list or an old log can't drive the operator's page.
- **A page serves only this server's sessions:** `?session=` must name a session id under the server's home
  (paths.page_session_dir): anything else is a 404 in one line, before a kernel starts.
- **Memory comes back when pages are gone:** when a page kernel ends, what its page left in the server (handlers,
  websocket, kernel client: reference cycles) is collected and the freed heap handed back, and glibc's malloc is
  tuned for bursts of large messages from short-lived threads (reclaim_page_memory, tune_allocator).
- **Logs hold no kernel ids or operator tokens**: each is replaced, in every log record of this process, by a tag
  that can't be used to reach a kernel (the log file itself is 0600 in a 0700 folder: cli/serve.py).
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import hmac
import json
import logging
import re
import secrets
import sys
import time

from jupyter_server.base.call_context import CallContext
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web
from tornado.iostream import StreamClosedError
from tornado.websocket import WebSocketClosedError, WebSocketHandler
from traitlets import Bool, Float, Integer
from voila import __version__ as voila_version
from voila.app import Voila
from voila.execute import VoilaExecutor
from voila.tornado.handler import TornadoVoilaHandler
from voila.tornado.kernel_websocket_handler import VoilaKernelWebsocketHandler

from workbench.bounds import QUOTE_LIMIT
from workbench.paths import HOME_ENV, PageSessionError, home, page_session_dir

V1_PROTOCOL = "v1.kernel.websocket.jupyter.org"
CHANNELS = frozenset({"shell", "control", "stdin", "iopub"})
# What a page may send a kernel: widget (comm) traffic and the kernel-info handshake; never code.
ALLOWED_MESSAGE_TYPES = ("comm_open", "comm_close", "comm_msg", "comm_info_request", "kernel_info_request",
                         "shutdown_request")
MIN_PARTS = 4  # header, parent header, metadata, content
MAX_PARTS = 64  # those four and binary buffers (a widget sends a few)
MAX_HEADER_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # a page sends clicks and values; the charts go the other way
MAX_UNREAD_BYTES = 64 * 1024 * 1024  # what the server holds for a client that stopped reading before dropping it
DEFAULT_MAX_PAGES = 16
DEFAULT_PAGE_GRACE_S = 60.0
CULL_INTERVAL_S = 10
CLOSE_POLICY = 1008  # websocket close code: policy violation


def v1_frame_problem(frame: bytes | str) -> str | None:
    """Why a kernel-websocket frame from a client can't be passed on (None: it is a well-formed v1 frame of an
    allowed type). Reads at most the offset table and the header: costs O(MAX_PARTS) whatever the frame claims."""
    if not isinstance(frame, bytes):
        return "a text message (this server speaks the v1 binary protocol only)"
    if len(frame) < 8:
        return f"a frame of {len(frame)} bytes (shorter than its part count)"
    count = int.from_bytes(frame[:8], "little")  # offsets: channel start, each part's start, the end
    if not MIN_PARTS + 2 <= count <= MAX_PARTS + 2:
        return f"a frame claiming {count} offsets (allowed: {MIN_PARTS + 2} to {MAX_PARTS + 2})"
    table_end = 8 * (count + 1)
    if table_end > len(frame):
        return f"a frame of {len(frame)} bytes too short for its {count} offsets"
    offsets = [int.from_bytes(frame[8 * (i + 1):8 * (i + 2)], "little") for i in range(count)]
    if offsets[0] != table_end or offsets[-1] != len(frame) or any(b < a for a, b in zip(offsets, offsets[1:])):
        return "a frame whose offsets do not tile it"
    try:
        channel = frame[offsets[0]:offsets[1]].decode("utf-8")
    except UnicodeDecodeError:
        return "a frame whose channel is not text"
    if channel not in CHANNELS:
        return f"a frame on an unknown channel {channel[:40]!r}"
    header = frame[offsets[1]:offsets[2]]
    if len(header) > MAX_HEADER_BYTES:
        return f"a frame whose header is {len(header)} bytes"
    try:
        msg_type = json.loads(header).get("msg_type")
    except (ValueError, AttributeError, RecursionError):
        return "a frame whose header is not a JSON object"
    if msg_type not in ALLOWED_MESSAGE_TYPES:
        return f"a {str(msg_type)[:40]!r} message (a page may send comm and kernel-info messages only)"
    return None


def _outgoing_msg_type(frame: bytes) -> str | None:
    """The msg_type of a v1 frame the server made itself (None where it isn't one)."""
    if len(frame) < 8 or not 3 <= int.from_bytes(frame[:8], "little") <= MAX_PARTS + 2:
        return None
    start, end = (int.from_bytes(frame[8 * i:8 * (i + 1)], "little") for i in (2, 3))
    try:
        return json.loads(frame[start:end]).get("msg_type")
    except (ValueError, AttributeError, RecursionError):
        return None


_PAGE_SECRET = secrets.token_bytes(32)  # this server run's: a restart ends every page anyway


def page_cookie(kernel_id: str) -> tuple[str, str]:
    """The cookie (name, value) that lets the page that started `kernel_id` connect to it."""
    digest = hmac.new(_PAGE_SECRET, kernel_id.encode(), hashlib.sha256).hexdigest()
    return f"wb-page-{digest[:12]}", digest[12:]


class OneLineErrors:
    """An error answer in one line of plain text (the server has no error page of its own to render)."""

    def write_error(self, status_code, **kwargs):
        error = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(error, "log_message", None) or "the server could not answer"
        self.set_header("Content-Type", "text/plain; charset=utf-8")
        self.finish(f"{status_code} {self._reason}: {message}\n")


class GuardedKernelWebsocketHandler(OneLineErrors, VoilaKernelWebsocketHandler):
    """Voila's kernel websocket with the v1 subprotocol required and every frame checked before it is parsed."""

    async def get(self, kernel_id):
        offered = [p.strip() for p in self.request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if V1_PROTOCOL not in offered:
            self.log.warning("refused a kernel websocket without the %s subprotocol", V1_PROTOCOL)
            raise web.HTTPError(400, f"this server speaks the {V1_PROTOCOL} kernel protocol only")
        name, value = page_cookie(kernel_id)
        if not hmac.compare_digest(self.get_cookie(name, "").encode(), value.encode()):
            self.log.warning("refused a kernel websocket from outside the page that started kernel %s", kernel_id)
            raise web.HTTPError(403, "only the page that started this kernel may connect to it")
        if self.kernel_manager.ending(kernel_id):  # upstream would wait 60 s for it and answer with a traceback
            raise web.HTTPError(404, "this page's kernel has ended (no page was connected to it): reload the page")
        await super().get(kernel_id)

    def select_subprotocol(self, subprotocols):
        return V1_PROTOCOL if V1_PROTOCOL in subprotocols else None

    async def open(self, kernel_id):
        if self.ws_connection is not None and getattr(self.ws_connection, "stream", None) is not None:
            self.ws_connection.stream.max_write_buffer_size = MAX_UNREAD_BYTES
        await super().open(kernel_id)

    def on_message(self, message):
        problem = v1_frame_problem(message)
        if problem is not None:
            self.log.warning("closed a kernel websocket that sent %s", problem)
            self.close(CLOSE_POLICY, problem[:120])
            return
        super().on_message(message)

    def write_message(self, message, binary=False):
        # Voila's own write_message reads each binary frame's header as v1 without bounds: every connection here
        # is v1 and every frame the server's own, read here with bounds; execute_input stays hidden as in Voila.
        if isinstance(message, bytes) and _outgoing_msg_type(message) == "execute_input":
            return None
        try:
            sent = WebSocketHandler.write_message(self, message, binary)
        except StreamClosedError:  # past MAX_UNREAD_BYTES: a client that stopped reading is dropped
            self.log.warning("dropped a kernel websocket whose client stopped reading")
            raise WebSocketClosedError() from None
        sent.add_done_callback(self._write_done)
        return sent

    def _write_done(self, sent):
        # A page closed while the charts streamed to it fails every write still pending with WebSocketClosedError.
        # Nothing awaits them upstream: asyncio logged each with a traceback (600 for one closed operator page).
        error = None if sent.cancelled() else sent.exception()
        if error is not None and not isinstance(error, WebSocketClosedError):
            self.log.warning("a write to a kernel websocket failed: %s", str(error)[:QUOTE_LIMIT])


class GuardedVoilaHandler(OneLineErrors, TornadoVoilaHandler):
    """The page: `?session=` checked against this server's sessions before a kernel starts; its kernel's grace time
    starts once the page is rendered (or its client gone)."""

    kernel_id: str | None = None  # the kernel started for this page (PageKernelManager.start_kernel sets it)

    async def prepare(self):
        await super().prepare()
        value = self.get_query_argument("session", None)
        try:
            page_session_dir(value)
        except PageSessionError as error:
            raise web.HTTPError(404, str(error)) from None

    def on_finish(self):
        super().on_finish()
        self._rendered()

    def on_connection_close(self):
        super().on_connection_close()
        self._rendered()

    def _rendered(self):
        if self.kernel_id is not None:
            self.kernel_manager.page_rendered(self.kernel_id)


class PageKernelManager(AsyncMappingKernelManager):
    """Page kernels, at most `max_pages`, each shut down `page_grace_s` after its page was rendered and its last
    websocket closed."""

    max_pages = Integer(DEFAULT_MAX_PAGES, config=True, help="page kernels running at once (more are refused)")
    page_grace_s = Float(DEFAULT_PAGE_GRACE_S, config=True,
                         help="a page kernel with no page connected for this long (and not busy) is shut down")
    # Jupyter's own idle cull, which also runs the check above: a connected page is never culled, a day-idle one is.
    cull_idle_timeout = Integer(24 * 3600, config=True)
    cull_interval = Integer(CULL_INTERVAL_S, config=True)
    cull_connected = Bool(False, config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.allowed_message_types = list(ALLOWED_MESSAGE_TYPES)
        self._starting: set[str] = set()  # ids of kernels being started (not all in self._kernels yet)
        self._rendering: set[str] = set()  # kernels whose page is still being rendered: never alone
        self._alone_since: dict[str, float] = {}  # kernel id -> when its page was rendered or its last websocket closed
        self._ending: set[str] = set()  # kernels being shut down

    def page_kernels(self) -> int:
        """Kernels running or starting, each counted once (a starting kernel enters self._kernels before its start
        returns)."""
        return len(self._starting | set(self._kernels))

    async def start_kernel(self, **kwargs):
        if self.page_kernels() >= self.max_pages:
            self.log.warning("refused a page: %d page kernels run already", self.max_pages)
            raise web.HTTPError(503, f"this dashboard serves {self.max_pages} pages at once and all are open: close "
                                     f"one (its kernel ends within {self.page_grace_s:.0f} s) and reload")
        kernel_id = kwargs.pop("kernel_id", None) or self.new_kernel_id()
        self._starting.add(kernel_id)
        try:
            await super().start_kernel(kernel_id=kernel_id, **kwargs)
        finally:
            self._starting.discard(kernel_id)
        page = CallContext.get(CallContext.JUPYTER_HANDLER)
        if isinstance(page, GuardedVoilaHandler):  # the page being rendered: its headers are not sent yet
            name, value = page_cookie(kernel_id)
            page.set_cookie(name, value, path=page.base_url, httponly=True, samesite="Strict")
            page.kernel_id = kernel_id
            self.page_rendering(kernel_id)
        else:
            self._alone_since[kernel_id] = time.monotonic()
        return kernel_id

    def page_rendering(self, kernel_id):
        """The kernel's page is being rendered: not alone, whatever its state, until page_rendered."""
        self._rendering.add(kernel_id)
        self._alone_since.pop(kernel_id, None)

    def page_rendered(self, kernel_id):
        """The kernel's page was sent (or its client left): its grace time starts unless a page is connected."""
        if kernel_id in self._rendering:
            self._rendering.discard(kernel_id)
            if self._kernel_connections.get(kernel_id, 0) <= 0:
                self._alone_since[kernel_id] = time.monotonic()

    def notify_connect(self, kernel_id):
        super().notify_connect(kernel_id)
        self._alone_since.pop(kernel_id, None)

    def notify_disconnect(self, kernel_id):
        super().notify_disconnect(kernel_id)
        if self._kernel_connections.get(kernel_id, 1) <= 0 and kernel_id not in self._rendering:
            self._alone_since[kernel_id] = time.monotonic()

    def ending(self, kernel_id) -> bool:
        """Whether the kernel is being shut down (a page connecting now would wait for a kernel that never comes)."""
        return kernel_id in self._ending

    async def shutdown_kernel(self, kernel_id, now=False, restart=False):
        if not restart:
            self._alone_since.pop(kernel_id, None)
            self._rendering.discard(kernel_id)
            self._ending.add(kernel_id)
        try:
            return await super().shutdown_kernel(kernel_id, now=now, restart=restart)
        finally:
            self._ending.discard(kernel_id)
            reclaim_page_memory()

    async def cull_kernel_if_idle(self, kernel_id):
        kernel = self._kernels[kernel_id]
        alone_since = self._alone_since.get(kernel_id)
        if alone_since is not None and getattr(kernel, "execution_state", None) == "busy":
            self._alone_since[kernel_id] = alone_since = time.monotonic()  # answering its page's last message
        if alone_since is not None and time.monotonic() - alone_since > self.page_grace_s:
            self.log.info("ending page kernel %s: no page for %.0f s", kernel_id, time.monotonic() - alone_since)
            await self.shutdown_kernel(kernel_id)
            return
        await super().cull_kernel_if_idle(kernel_id)


def reclaim_page_memory() -> None:
    """Give back what an ended page held. Its handlers, websocket and kernel client sit in reference cycles, which
    Python's own full collection reaches only tens of pages later (the server's long-lived objects set its pace):
    2-4 MB a page until then. A full collection here costs milliseconds (the server froze what it loaded to start:
    GuardedVoila.start); then the freed heap goes back to the system (glibc keeps freed chunks for reuse otherwise).
    """
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


M_MMAP_THRESHOLD, M_ARENA_MAX = -3, -8  # mallopt parameters (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's default starting value, kept fixed
MALLOC_ARENAS = 2


def tune_allocator() -> None:
    """glibc's malloc for a server whose traffic is bursts of large messages from short-lived threads. Buffers over
    MMAP_THRESHOLD_BYTES are always mapped (glibc raises the threshold to the largest buffer freed, up to 32 MiB:
    after one big chart message every later one landed in the heap and, freed, stayed there between live objects),
    and at most MALLOC_ARENAS arenas (each page's heartbeat thread got an arena of its own, kept for good). Before any
    thread starts. A no-op off glibc."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_ARENA_MAX, MALLOC_ARENAS)


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------ logs
_KERNEL_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
_TOKEN = re.compile(r"(token=)[^&\s'\"]+")


def redact(text: str) -> str:
    """A log line without kernel ids (a stable tag instead, useless for reaching the kernel) or operator tokens."""
    text = _KERNEL_ID.sub(lambda m: "kernel#" + hashlib.sha256(m.group(0).lower().encode()).hexdigest()[:8], text)
    return _TOKEN.sub(r"\1<hidden>", text)


def redact_log_records() -> None:
    """Every log record of this process is redacted when made (whatever logger, handler or format writes it)."""
    make_record = logging.getLogRecordFactory()

    def redacted_record(*args, **kwargs):
        record = make_record(*args, **kwargs)
        record.msg, record.args = redact(record.getMessage()), ()
        if record.exc_info:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return record

    logging.setLogRecordFactory(redacted_record)


# ------------------------------------------------------------------------------------------------ page errors
def one_line_cell_errors(executor, cell):
    """VoilaExecutor.strip_code_cell_errors, in one line: the error's kind and message, cut to 200 characters,
    without the traceback or the server's home path (Voila's own says only "run with --show_tracebacks")."""
    for output in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
        if output.get("output_type") == "error":
            line = f"{output.get('ename', 'Error')}: {output.get('evalue', '')}".splitlines()[0]
            line = line.replace(str(home()), "$" + HOME_ENV)[:QUOTE_LIMIT]
            output["ename"], output["evalue"], output["traceback"] = "Error", line, [line]
    return cell


# ------------------------------------------------------------------------------------------------ the server
class GuardedVoila(Voila):
    """Voila with the guards above in place of its own page, websocket and kernel manager."""

    def initialize(self, argv=None):
        super().initialize(argv)
        self.voila_configuration.multi_kernel_manager_class = PageKernelManager
        self.voila_configuration.show_tracebacks = False
        VoilaExecutor.strip_code_cell_errors = one_line_cell_errors
        self.tornado_settings = {**self.tornado_settings, "websocket_max_message_size": MAX_MESSAGE_BYTES}

    def init_handlers(self):
        swap = {VoilaKernelWebsocketHandler: GuardedKernelWebsocketHandler, TornadoVoilaHandler: GuardedVoilaHandler}
        handlers = super().init_handlers()
        missing = set(swap) - {spec[1] for spec in handlers}
        if missing:  # another Voila: serving it unguarded is not an option
            raise RuntimeError(f"voila {voila_version} serves no {', '.join(c.__name__ for c in missing)}: the "
                               "dashboard guard (workbench/cli/voila_guard.py) must be brought up to date with it")
        return [(spec[0], swap.get(spec[1], spec[1]), *spec[2:]) for spec in handlers]

    def start(self):
        # What the server loaded to start stays for good: frozen, the collections reclaim_page_memory runs after each
        # ended page scan only what came since (milliseconds, not the 0.1-0.7 s of ~250 000 objects).
        gc.collect()
        gc.freeze()
        super().start()


def main(argv: list[str] | None = None) -> None:
    tune_allocator()
    redact_log_records()
    GuardedVoila.launch_instance(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
