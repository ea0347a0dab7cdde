"""The dashboard server behind `verl-workbench up`: Voila serving notebooks/dashboard.ipynb for one session.

The page finds its session in its URL: `?session=ID` (a viewer: every chart, controls disabled) plus
`&token=TOKEN` for the operator. A Voila kernel runs as the session's own OS user, so reading the token file proves
nothing there: control comes from the URL alone. (Voila runs without a login of its own, so it leaves `token` to
the page.)

Voila runs through widgets.voila_guard (hostile clients refused, page kernels capped and ended when their
page is gone, no tracebacks to pages, logs without kernel ids or tokens), in its own process session, so a Ctrl-C
in the terminal reaches `up` alone, and `up` ends Voila and the page kernels it started, in that order, leaving
nothing behind. Its log is the owner's alone (0600 in a 0700 folder).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import psutil

from ..procs import end, end_child, process_alive, tree
from ..paths import private_dir

DASHBOARD_NOTEBOOK = "dashboard.ipynb"
# The page's Voila template (Voila's lab template without stylesheets from a CDN), found through JUPYTER_PATH.
TEMPLATE, TEMPLATES_ROOT = "workbench", Path(__file__).with_name("jupyter")
DEFAULT_PORT = 8866  # Voila's own default
SESSION_KEY, TOKEN_KEY = "session", "token"
# A page kernel whose page is gone (closed, a browser killed, a plain GET that never connected) ends this long after
# (voila_guard.PageKernelManager); one with a page connected is never ended. Beyond MAX_PAGES a page is refused.
PAGE_GRACE_S = 60.0
MAX_PAGES = 16
START_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


def notebooks_dir() -> Path:
    """The tutorials and the dashboard: the source checkout's notebooks/ (an editable install, a clone), else the
    copy installed with the package (pyproject's data-files: <prefix>/share/verl-workbench/notebooks)."""
    candidates = [
        Path(__file__).resolve().parents[2] / "notebooks",
        Path(sysconfig.get_path("data")) / "share" / "verl-workbench" / "notebooks",
        Path(sys.prefix) / "share" / "verl-workbench" / "notebooks",
    ]
    for candidate in candidates:
        if (candidate / DASHBOARD_NOTEBOOK).exists():
            return candidate
    raise FileNotFoundError(
        f"{DASHBOARD_NOTEBOOK} not found in {' or '.join(map(str, candidates))}: reinstall verl-workbench "
        "(bash scripts/setup.sh)"
    )


def page_url(base_url: str, session_id: str, token: str | None = None) -> str:
    """The dashboard page of a session: the operator's with the token, a viewer's without."""
    query = {SESSION_KEY: session_id}
    if token:
        query[TOKEN_KEY] = token
    return f"{base_url}?{urlencode(query)}"


def free_port(ip: str) -> int:
    with socket.socket() as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


def check_port(ip: str, port: int | None) -> None:
    """Raise OSError, in words, when ip:port can't be served (0 or None: any free port will do)."""
    if not port:
        return
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as s:
        try:
            s.bind((ip, port))
        except OSError as e:
            raise OSError(f"port {port} on {ip} is in use or not ours ({e.strerror}): pick another with --port N "
                          "(or --port 0 for a free one)") from None


def display_host(ip: str) -> str:
    """The host a browser should use: the bound address, or this machine's name when bound to all interfaces."""
    if ip in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{ip}]" if ":" in ip else ip


@dataclass
class DashboardServer:
    """A running Voila server (its own process session) serving the dashboard notebook at base_url."""

    process: subprocess.Popen
    base_url: str
    log_path: Path

    @classmethod
    def start(cls, *, ip: str = "127.0.0.1", port: int | None = DEFAULT_PORT, log_dir: Path,
              notebook: Path | None = None, timeout: float = START_TIMEOUT_S, progress=None,
              max_pages: int = MAX_PAGES, page_grace_s: float = PAGE_GRACE_S) -> "DashboardServer":
        """Start Voila on ip:port (port 0 or None: a free one) and wait until it answers.

        The port is given to Voila with no retries, so the printed URL is the one it serves: a taken port is an
        error in words, not a server somewhere else."""
        notebook = notebook or notebooks_dir() / DASHBOARD_NOTEBOOK
        check_port(ip, port)
        port = port or free_port(ip)
        log_path = private_dir(log_dir) / "voila.log"
        os.chmod(log_dir, 0o700)  # the workbench's own folder, made 0755 by older versions
        command = [
            sys.executable, "-m", "widgets.voila_guard", str(notebook), "--no-browser",
            f"--Voila.ip={ip}", f"--Voila.port={port}", "--Voila.port_retries=0",
            f"--template={TEMPLATE}",
            f"--PageKernelManager.max_pages={max_pages}", f"--PageKernelManager.page_grace_s={page_grace_s}",
        ]
        jupyter_path = os.pathsep.join(p for p in (str(TEMPLATES_ROOT), os.environ.get("JUPYTER_PATH")) if p)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(log_fd, 0o600)  # a log an older version made world-readable
        with open(log_fd, "ab") as log:
            process = subprocess.Popen(
                command, cwd=notebook.parent, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, "JUPYTER_PATH": jupyter_path},
                start_new_session=True,
            )
        server = cls(process, f"http://{display_host(ip)}:{port}/", log_path)
        try:
            server._wait_ready(f"http://{'127.0.0.1' if ip in ('', '0.0.0.0') else display_host(ip)}:{port}/", timeout, progress)
        except BaseException:
            server.stop()
            raise
        return server

    def _wait_ready(self, probe_base: str, timeout: float, progress) -> None:
        # A static file answers once the server listens, without starting a page kernel.
        probe = probe_base + "voila/static/voila.js"
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the dashboard server (Voila) exited with code {self.process.returncode}: "
                                   f"see {self.log_path}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(probe, timeout=2):
                    return
            except urllib.error.HTTPError:
                return  # it answers (a 404 for the probe file is an answer too)
            except (urllib.error.URLError, OSError):
                if progress:
                    progress()
                time.sleep(0.5)
        raise TimeoutError(f"the dashboard server (Voila) did not answer within {timeout:.0f} s: see {self.log_path}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def processes(self) -> list[psutil.Process]:
        """Voila and everything it started (page kernels sit in process sessions of their own)."""
        return tree(self.process.pid)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """End Voila (it shuts its kernels down), then whatever of its tree is left."""
        procs = self.processes()
        end_child(self.process, grace_s)
        end([p for p in procs if process_alive(p.pid)], grace_s)


def raise_on_sigterm() -> None:
    """Make SIGTERM end `up` the way Ctrl-C does (KeyboardInterrupt), so the same clean-up runs."""

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


__all__ = ["DashboardServer", "page_url", "notebooks_dir", "DEFAULT_PORT", "SESSION_KEY", "TOKEN_KEY",
           "raise_on_sigterm", "check_port"]
