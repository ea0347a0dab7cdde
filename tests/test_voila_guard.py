"""The dashboard server's guard without a server: the v1 frame check, log redaction, one-line page errors, the
page URL's session lookup and the page kernels' cap and grace (tests/test_probe_server.py sends the same attacks to a
served page)."""

from __future__ import annotations

import asyncio
import gc
import json
import platform
import struct
import subprocess
import sys
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.connection.base import serialize_msg_to_ws_v1
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager
from tornado import web

from widgets.voila_guard import (MAX_MESSAGE_BYTES, PageKernelManager, one_line_cell_errors, reclaim_page_memory,
                                 redact, v1_frame_problem)
from workbench.paths import PageSessionError, page_session_dir


def frame(msg_type="comm_msg", channel="shell", buffers=(), header=None) -> bytes:
    header = header if header is not None else json.dumps({"msg_id": "1", "msg_type": msg_type}).encode()
    return serialize_msg_to_ws_v1([header, b"{}", b"{}", b'{"data": {}}', *buffers], channel)


@pytest.mark.parametrize("good", [
    frame(), frame("comm_open"), frame("comm_close"), frame("comm_info_request"),
    frame("kernel_info_request", channel="shell"), frame("comm_msg", buffers=[b"\x00" * 1000, b"\x01" * 10]),
])
def test_what_a_page_sends_passes(good):
    assert v1_frame_problem(good) is None


@pytest.mark.parametrize("bad, words", [
    (struct.pack("<Q", 2 ** 62) + b"\0" * 64, "offsets"),
    (b"\xff" * 8, "offsets"),
    (b"abc", "shorter"),
    (struct.pack("<Q", 6) + b"\0" * 8, "too short"),
    (frame()[:-1], "tile"),
    (frame() + b"x", "tile"),
    (frame(channel="nowhere"), "channel"),
    (frame(header=b"[" * 5000 + b"]" * 5000), "JSON object"),
    (frame(header=b"not json"), "JSON object"),
    (frame(header=b'{"msg_type": "x", "y": "' + b"z" * 70_000 + b'"}'), "header is"),
    (frame("execute_request"), "execute_request"),
    (frame("inspect_request"), "inspect_request"),
    (frame("complete_request"), "complete_request"),
    (frame("debug_request", channel="control"), "debug_request"),
    (frame("history_request"), "history_request"),
    (frame(buffers=[b""] * 100), "offsets"),
    ('{"header": {"msg_type": "execute_request"}}', "text message"),
])
def test_a_bad_frame_is_named_before_anything_parses_it(bad, words):
    started = time.perf_counter()
    problem = v1_frame_problem(bad)
    assert problem is not None and words in problem, problem
    assert time.perf_counter() - started < 0.05, "checking a frame must not cost what it claims"
    assert len(problem) < 200 and "\n" not in problem


def test_the_message_cap_is_above_what_a_page_sends_and_below_tornados_default():
    assert 64 * 1024 < MAX_MESSAGE_BYTES < 10 * 1024 * 1024


def test_logs_lose_kernel_ids_and_tokens_but_keep_a_tag():
    kernel = "badb36e8-c4f4-4668-bc8e-039d98b9b2ce"
    line = f"Kernel started: {kernel} GET /?session=x&token=42dc95c696c1777afbdea3b42cf8474b (127.0.0.1)"
    redacted = redact(line)
    assert kernel not in redacted and "42dc95c6" not in redacted
    assert redact(kernel) == redact(kernel.upper()) and redact(kernel).startswith("kernel#")
    assert "token=<hidden>" in redacted


def test_a_page_error_is_one_line_without_traceback_or_home(monkeypatch, tmp_path):
    monkeypatch.setenv("VERL_WORKBENCH_HOME", str(tmp_path))
    cell = {"cell_type": "code", "outputs": [{
        "output_type": "error", "ename": "StoreError", "evalue": f"{tmp_path}/sessions/x is not a session store\nmore",
        "traceback": ["Traceback (most recent call last):", '  File "/srv/x.py", line 1', "StoreError: ..."]}]}
    output = one_line_cell_errors(None, cell)["outputs"][0]
    assert output["traceback"] == [output["evalue"]]
    assert output["evalue"] == "StoreError: $VERL_WORKBENCH_HOME/sessions/x is not a session store"


@pytest.fixture
def sessions(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_WORKBENCH_HOME", str(tmp_path / "home"))
    root = tmp_path / "home" / "sessions"
    (root / "20261201-093000-replay-h200-proof-1a2b3c").mkdir(parents=True)
    (root / "20261201-093000-replay-h200-proof-1a2b3c" / "session.sqlite").write_bytes(b"")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "session.sqlite").write_bytes(b"")
    (root / "linked-out").symlink_to(elsewhere)
    return root, elsewhere


def test_a_page_names_a_session_of_this_server_by_id(sessions):
    root, _ = sessions
    assert page_session_dir("20261201-093000-replay-h200-proof-1a2b3c") == root / "20261201-093000-replay-h200-proof-1a2b3c"
    assert page_session_dir(None).name == "20261201-093000-replay-h200-proof-1a2b3c"


@pytest.mark.parametrize("value", ["../elsewhere", "/tmp", "..", ".", "linked-out", "nope", "a/b", "x" * 300,
                                   "20261201-093000-replay-h200-proof-1a2b3c/..", "~", "a\nb", "%2e%2e"])
def test_a_page_cannot_name_a_path(sessions, value):
    root, elsewhere = sessions
    with pytest.raises(PageSessionError) as refused:
        page_session_dir(value)
    message = str(refused.value)
    assert "\n" not in message and str(root) not in message and str(elsewhere) not in message
    assert len(message) < 250


# ------------------------------------------------------------------------------------------------ page kernels
def run(coroutine):
    """The manager's coroutine on a loop of its own thread (independent of any loop this thread may hold)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@pytest.fixture
def manager(monkeypatch):
    """A PageKernelManager whose kernels are stand-ins: each enters the manager's table before its start returns,
    as jupyter_client's do, and its start takes STARTUP_S; shutdowns are recorded."""

    async def start(self, *, kernel_id=None, **kwargs):
        self._kernels[kernel_id] = SimpleNamespace(execution_state="idle", kernel_name="python3", last_activity=utcnow(),
                                                   kernel_spec=SimpleNamespace(metadata={}))
        self._kernel_connections[kernel_id] = 0
        await asyncio.sleep(STARTUP_S)
        return kernel_id

    monkeypatch.setattr(AsyncMappingKernelManager, "start_kernel", start)
    pages = PageKernelManager(max_pages=3, page_grace_s=GRACE_S)
    pages.ended = []

    async def shutdown(kernel_id, now=False, restart=False):
        pages.ended.append(kernel_id)
        pages._kernels.pop(kernel_id)

    pages.shutdown_kernel = shutdown
    return pages


STARTUP_S = 0.1
GRACE_S = 0.2


def test_pages_arriving_while_others_start_fill_the_cap_and_the_next_is_refused(manager):
    """Each page arrives while the one before is still starting (a loaded server): three fit a cap of three."""

    async def pages():
        starts = []
        for _ in range(3):
            starts.append(asyncio.create_task(manager.start_kernel(kernel_name="python3")))
            await asyncio.sleep(STARTUP_S / 4)
        started = await asyncio.gather(*starts)
        with pytest.raises(web.HTTPError) as refused:
            await manager.start_kernel(kernel_name="python3")
        return started, refused.value

    started, refused = run(pages())
    assert len(set(started)) == 3 and manager.page_kernels() == 3
    assert refused.status_code == 503 and "serves 3 pages at once" in refused.log_message


def test_a_page_kernel_is_never_ended_while_its_page_renders_and_is_after_the_grace(manager):
    """On a loaded machine a page's kernel can take longer to start and run the notebook than the grace time: it is
    not alone until its page was sent; then it ends GRACE_S after, unless the page connected, until it leaves."""

    async def story():
        rendering, connected = [await manager.start_kernel(kernel_name="python3") for _ in range(2)]
        for kernel in (rendering, connected):
            manager.page_rendering(kernel)
        await asyncio.sleep(2 * GRACE_S)
        for kernel in (rendering, connected):
            await manager.cull_kernel_if_idle(kernel)
        seen = {"while rendering": list(manager.ended)}
        manager.notify_connect(connected)  # its page connected before the last of it was sent
        for kernel in (rendering, connected):
            manager.page_rendered(kernel)
        await asyncio.sleep(2 * GRACE_S)
        for kernel in (rendering, connected):
            await manager.cull_kernel_if_idle(kernel)
        seen["a grace after the pages were sent"] = list(manager.ended)
        manager.notify_disconnect(connected)
        await asyncio.sleep(2 * GRACE_S)
        await manager.cull_kernel_if_idle(connected)
        seen["a grace after the connected page left"] = list(manager.ended)
        return rendering, connected, seen

    rendering, connected, seen = run(story())
    assert seen == {"while rendering": [], "a grace after the pages were sent": [rendering],
                    "a grace after the connected page left": [rendering, connected]}


def test_a_kernel_being_shut_down_is_known_as_ending_until_it_is_gone(manager, monkeypatch):
    """The kernel websocket refuses a kernel that is ending in one line (upstream waits 60 s, then a traceback)."""
    seen = []

    async def shutdown(self, kernel_id, now=False, restart=False):
        seen.append(self.ending(kernel_id))
        self._kernels.pop(kernel_id)

    monkeypatch.setattr(AsyncMappingKernelManager, "shutdown_kernel", shutdown)
    del manager.shutdown_kernel  # the manager's own, over the stand-in above

    async def story():
        kernel = await manager.start_kernel(kernel_name="python3")
        before = manager.ending(kernel)
        await manager.shutdown_kernel(kernel)
        return before, manager.ending(kernel)

    assert run(story()) == (False, False) and seen == [True]


# ------------------------------------------------------------------------------------------------ server memory
class PageLeftovers:
    """Stands in for what an ended page leaves in the server: objects in a reference cycle (a handler and its
    connection point at each other), holding a buffer."""

    def __init__(self):
        self.buffer = bytearray(1 << 20)
        self.cycle = self


def test_a_page_kernels_end_frees_what_its_page_left_in_reference_cycles():
    """The server's ~250 000 long-lived objects make Python's own full collection rare (tens of pages apart): an
    ended page's handlers, websocket and kernel client, all in cycles, held 2-4 MB each until then (bench
    page_memory: +72 MB after 20 closed pages). A page kernel's end collects them."""
    gc.disable()  # the collector must not happen to run in between: the end of the page kernel must do it
    try:
        leftovers = weakref.ref(PageLeftovers())
        assert leftovers() is not None  # garbage, but only a collection can see it
        reclaim_page_memory()
        assert leftovers() is None
    finally:
        gc.enable()


ALLOCATOR_PROBE = """
import ctypes, json, threading
from widgets.voila_guard import tune_allocator
tune_allocator()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = MallInfo2
libc.free(libc.malloc(8 << 20))  # a large message freed: glibc's dynamic threshold would rise to 8 MiB
before = libc.mallinfo2().hblkhd
chart = libc.malloc(512 << 10)  # the next chart message
mapped = libc.mallinfo2().hblkhd - before
libc.free(chart)

def heartbeat():  # each page's kernel client runs its heartbeat in a thread of its own
    libc.free(libc.malloc(64))
threads = [threading.Thread(target=heartbeat) for _ in range(6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
stream = libc.fopen(b"/dev/stdout", b"w")
print(json.dumps({"chart_bytes_mapped": mapped}), flush=True)
libc.malloc_info(0, stream)
libc.fclose(stream)
"""


@pytest.mark.skipif(not Path("/proc/self/maps").exists() or "glibc" not in " ".join(platform.libc_ver()),
                    reason="glibc's malloc only")
def test_the_server_mmaps_large_messages_and_keeps_two_malloc_arenas():
    """glibc raises its mmap threshold to the largest buffer freed (up to 32 MiB): after one big chart message,
    every later one lands in the heap and, freed, stays there between live objects. And each page's heartbeat thread
    gets a malloc arena of its own, kept for good. The server tunes both away at its start."""
    probe = subprocess.run([sys.executable, "-c", ALLOCATOR_PROBE], capture_output=True, text=True, timeout=120,
                           cwd=Path(__file__).resolve().parents[1])
    assert probe.returncode == 0, probe.stderr[-2000:]
    first_line, malloc_info = probe.stdout.split("\n", 1)
    assert json.loads(first_line)["chart_bytes_mapped"] >= 512 << 10
    assert malloc_info.count("<heap nr=") <= 2, malloc_info
