"""`verl-workbench up`: start a session and serve its dashboard — live verl on this machine's GPU, or a recorded
H200 session in replay.

With an NVIDIA GPU and vLLM installed it generates the offline assets (once) and starts a real verl PPO run on them;
otherwise it replays a recording (the page says so). It serves the Voila dashboard (cli/serve.py), prints an
operator URL (with the operator token) and a viewer URL, and prints each step and event as they land. Ctrl-C or
SIGTERM stops the server, its page kernels and the session it started (an attached session goes on).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import textwrap
import time
import webbrowser

from . import described
from .args import port, positive_int, positive_number
from .serve import (DEFAULT_PORT, MAX_PAGES, PAGE_GRACE_S, DashboardServer, check_port, page_url,
                    raise_on_sigterm)
from ..control import ENDED_STATES, TOKEN_FILE

FOLLOW_POLL_S = 0.5
# Without a GPU `up` tells the tuning story recorded on an H200: verl's quickstart settings, the advisor's proposal
# applied (a restart: ~3.2× the tokens/s/GPU), a hot critic budget, stop. At 10× a step of the slow plan takes ~6 s
# and the whole story ~1.5 min (verl's recorded start-ups included); the page offers Play again at its end.
DEFAULT_RECORDING = "h200-tuning"
DEFAULT_SPEED = 10.0


def recordings_epilog() -> str:
    from ..recordings import bundled, describe

    return "recordings (--replay NAME, or a recorded session's directory):\n" + "\n".join(
        f"  {name:<24}{describe(name)}" for name in bundled())


def add_up_commands(subparsers) -> None:
    up = subparsers.add_parser("up", **described("up"), epilog=recordings_epilog(),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    up.description = textwrap.fill(
        up.description + " It prints an operator URL (it carries the session's operator token: whoever opens it "
        "controls the run) and a viewer URL (read-only), and follows the session in the terminal. Ctrl-C or SIGTERM "
        "stops the server, its page kernels and the session `up` started (an attached one goes on).", width=100)
    up.add_argument("--replay", metavar="RECORDING",
                    help=f"replay this recording even with a GPU (default without one: {DEFAULT_RECORDING})")
    up.add_argument("--speed", type=positive_number, default=DEFAULT_SPEED,
                    help=f"replay speed: recorded seconds per second (default {DEFAULT_SPEED:g})")
    up.add_argument("--no-follow", action="store_true",
                    help="replay without the recorded operator's changes: every command is yours")
    up.add_argument("--attach", metavar="SESSION", help="serve an existing session (its id or directory) instead of "
                                                        "starting one")
    up.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"dashboard port (default {DEFAULT_PORT}; 0: a free one)")
    up.add_argument("--ip", default="127.0.0.1",
                    help="address the dashboard listens on (default 127.0.0.1: this machine only; 0.0.0.0 exposes it, "
                         "token and all, over plain HTTP)")
    up.add_argument("--no-browser", action="store_true", help="print the URLs without opening a browser")
    up.add_argument("--no-dashboard", action="store_true", help="follow the session in the terminal only")
    up.add_argument("--for", dest="seconds", type=positive_number, metavar="SECONDS", help="end after this many seconds")
    up.add_argument("--steps", type=positive_int, metavar="N", help="end after this many steps")
    up.add_argument("--max-pages", type=positive_int, default=MAX_PAGES,
                    help=f"dashboard pages served at once (default {MAX_PAGES}); one more is refused, saying so")
    up.add_argument("--page-grace", type=positive_number, default=PAGE_GRACE_S, metavar="SECONDS",
                    help=f"a page's kernel ends this long after its page is gone (default {PAGE_GRACE_S:g})")
    up.set_defaults(func=run_up)


def live_possible() -> tuple[bool, str]:
    from ..lifecycle import gpu_count

    if not gpu_count():
        return False, "no NVIDIA GPU here"
    if importlib.util.find_spec("vllm") is None:
        return False, "vLLM is not installed (pip install -e '.[gpu]')"
    return True, ""


def start_session(args):
    from ..paths import home
    from ..session import Session

    if args.attach:
        return Session.attach(args.attach)
    live, why = (False, "asked for a replay") if args.replay else live_possible()
    if live:
        from ..assets import generate_assets_apart
        from ..assets.plans import offline_plan

        assets = home() / "assets" / "qwen2.5-0.5b"
        print(f"generating offline assets in {assets} (once) ...", flush=True)
        # in a process of its own: its CUDA memory must not stay in this one, which serves the session
        generate_assets_apart(assets, shape="qwen2.5-0.5b", n_train=2048, device="cuda")
        session = Session.start(offline_plan(assets), name="up")
        print(f"live verl session {session.id}: verl needs ~3 min to start", flush=True)
        return session
    recording = args.replay or DEFAULT_RECORDING
    session = Session.replay(recording, speed=args.speed, follow=not args.no_follow)
    print(f"{why}: replaying the recorded H200 session '{recording}' at {args.speed:g}x (session {session.id})", flush=True)
    return session


def follow(session, seconds: float | None = None, steps: int | None = None, out=None, past_end: bool = False) -> int:
    """Print steps and events as they land until the session ends (past_end: until Ctrl-C), `seconds` pass or
    `steps` steps were seen."""
    out = out or sys.stdout
    cursor, seen, ended = None, 0, False
    deadline = time.time() + seconds if seconds else None
    while True:
        poll = session.poll(cursor)
        lines = []  # (t, order, text): events and steps as they happened, whichever table a poll read first
        if "events" in poll.changed:
            for event in session.events(since_id=poll.since["events"]).itertuples():
                lines.append((event.t, event.id, f"  [{event.kind}] {event.text}"))
        if "steps" in poll.changed:
            for row in session.steps(since_id=poll.since["steps"]).to_dict("records"):
                seen += 1
                step_s, gen_s = _number(row.get("timing_s/step")), _number(row.get("timing_s/gen"))
                lines.append((row["t"], row["id"],
                              f"step {row['step']:>4}  segment {row['segment_id']}  {step_s:6.1f} s  "
                              f"gen {100 * gen_s / step_s if step_s else 0:3.0f} %  "
                              f"{_number(row.get('perf/throughput')):7.0f} tok/s/GPU  "
                              f"critic loss {_number(row.get('critic/vf_loss'), float('nan')):.3f}"))
        for _, _, text in sorted(lines, key=lambda line: line[:2]):
            print(text, file=out, flush=True)
        cursor = poll.cursor
        if not ended and poll.state in ENDED_STATES and not poll.changed - {"meta"}:
            ended = True  # and every event up to the end was printed
            print(f"session {session.id} is {poll.state}", file=out, flush=True)
            if not past_end:
                return 0 if poll.state != "lost" else 1
            print("the dashboard keeps serving it: Ctrl-C to end", file=out, flush=True)
        if (steps is not None and seen >= steps) or (deadline is not None and time.time() > deadline):
            return 0
        time.sleep(FOLLOW_POLL_S)


def _number(value, missing: float = 0.0) -> float:
    """A metric as a float; `missing` where the step did not report it (None or NaN)."""
    return missing if value is None or value != value else float(value)


def run_up(args: argparse.Namespace) -> int:
    raise_on_sigterm()  # a SIGTERM cleans up the way Ctrl-C does
    if not args.no_dashboard:
        try:
            check_port(args.ip, args.port)  # before a session is started for nothing
        except OSError as e:
            print(f"verl-workbench up: {e}", file=sys.stderr, flush=True)
            return 1
    started_here = not args.attach
    session = start_session(args)
    server = None
    try:
        print(f"session directory: {session.dir}", flush=True)
        if not args.no_dashboard:
            server = serve_dashboard(session, args)
        return follow(session, seconds=args.seconds, steps=args.steps, past_end=server is not None)
    except KeyboardInterrupt:
        print("\nending ...", flush=True)
        return 0
    except (OSError, RuntimeError) as e:  # the dashboard could not start: say why in one line
        print(f"\nverl-workbench up: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        if server is not None:
            server.stop()
            print("dashboard server stopped", flush=True)
        if started_here:
            try:
                session.stop(now=True)
                session.wait_supervisor_exit(timeout_s=30)  # its state says stopped a moment before it ends
            except (RuntimeError, TimeoutError) as e:
                print(f"stopping session {session.id}: {e}", file=sys.stderr, flush=True)
            print(f"session {session.id} {session.state}; its data stays in {session.dir}", flush=True)
        else:
            print(f"session {session.id} goes on", flush=True)


def serve_dashboard(session, args: argparse.Namespace) -> DashboardServer:
    """Start Voila on the dashboard notebook and print the operator and viewer URLs of this session."""
    from ..paths import home

    print(f"starting the dashboard server (Voila) on {args.ip}:{args.port or 'a free port'} ...", end="", flush=True)
    server = DashboardServer.start(ip=args.ip, port=args.port, log_dir=home() / "logs",
                                   progress=lambda: print(".", end="", flush=True),
                                   max_pages=args.max_pages, page_grace_s=args.page_grace)
    print(" ready", flush=True)
    try:
        token = (session.dir / TOKEN_FILE).read_text().strip()
    except OSError:
        token = None  # not this user's session: a viewer it is
    viewer = page_url(server.base_url, session.id)
    if token:
        print(f"operator dashboard (controls the run; keep it private):\n  {page_url(server.base_url, session.id, token)}")
    print(f"viewer dashboard (read-only):\n  {viewer}", flush=True)
    if not args.no_browser:
        webbrowser.open(page_url(server.base_url, session.id, token))
    return server
