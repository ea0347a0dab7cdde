"""`verl-workbench up`: start a session and follow it — live verl on this machine's GPU, or a recorded H200 session.

With an NVIDIA GPU and vLLM installed it generates the offline assets (once) and starts a real verl PPO run on them;
otherwise it replays a recording. Either way it prints each step and event as they land; Ctrl-C detaches and leaves
the session running (attach again with `Session.attach(...)` or `verl-workbench up --attach ID`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

from .paths import home

FOLLOW_POLL_S = 0.5
DEFAULT_RECORDING = "h200-proof"


def add_up_commands(subparsers) -> None:
    up = subparsers.add_parser("up", help="start a session (live with a GPU, replay without) and follow it")
    up.add_argument("--replay", metavar="RECORDING", help=f"replay this recording even with a GPU (default without one: {DEFAULT_RECORDING})")
    up.add_argument("--speed", type=float, default=10.0, help="replay speed (recorded seconds per second)")
    up.add_argument("--attach", metavar="SESSION", help="follow an existing session instead of starting one")
    up.add_argument("--for", dest="seconds", type=float, help="stop following after this many seconds")
    up.add_argument("--steps", type=int, help="stop following after this many steps")
    up.set_defaults(func=run_up)


def live_possible() -> tuple[bool, str]:
    from .session import gpu_count

    if not gpu_count():
        return False, "no NVIDIA GPU here"
    if importlib.util.find_spec("vllm") is None:
        return False, "vLLM is not installed (pip install -e '.[gpu]')"
    return True, ""


def start_session(args):
    from .session import Session

    if args.attach:
        return Session.attach(args.attach)
    live, why = (False, "asked for a replay") if args.replay else live_possible()
    if live:
        from .assets import generate_assets
        from .assets.plans import offline_plan

        assets = home() / "assets" / "qwen2.5-0.5b"
        print(f"generating offline assets in {assets} (once) ...", flush=True)
        generate_assets(assets, shape="qwen2.5-0.5b", n_train=2048, device="cuda")
        session = Session.start(offline_plan(assets), name="up")
        print(f"live verl session {session.id}: verl needs ~3 min to start", flush=True)
        return session
    recording = args.replay or DEFAULT_RECORDING
    session = Session.replay(recording, speed=args.speed)
    print(f"{why}: replaying the recorded H200 session '{recording}' at {args.speed:g}x (session {session.id})", flush=True)
    return session


def follow(session, seconds: float | None = None, steps: int | None = None, out=None) -> int:
    """Print steps and events as they land until the session ends, `seconds` pass or `steps` steps were seen."""
    out = out or sys.stdout
    step_id = event_id = 0
    seen = 0
    deadline = time.time() + seconds if seconds else None
    while True:
        for event in session.store.rows("events", since_id=event_id):
            event_id = event["id"]
            print(f"  [{event['kind']}] {event['text']}", file=out, flush=True)
        for row in session.store.rows("steps", since_id=step_id):
            step_id = row["id"]
            seen += 1
            m = row["metrics"]
            step_s, gen_s = m.get("timing_s/step") or 0.0, m.get("timing_s/gen") or 0.0
            print(
                f"step {row['step']:>4}  segment {row['segment_id']}  {step_s:6.1f} s  gen {100 * gen_s / step_s if step_s else 0:3.0f} %"
                f"  {m.get('perf/throughput') or 0:7.0f} tok/s/GPU  critic loss {m.get('critic/vf_loss') or float('nan'):.3f}",
                file=out, flush=True,
            )
        state = session.state
        if state in ("stopped", "finished", "failed", "lost") and session.store.max_id("events") == event_id:
            print(f"session {session.id} is {state}", file=out, flush=True)
            return 0 if state != "lost" else 1
        if (steps is not None and seen >= steps) or (deadline is not None and time.time() > deadline):
            print(f"detached; the session goes on: Session.attach({session.id!r})", file=out, flush=True)
            return 0
        time.sleep(FOLLOW_POLL_S)


def run_up(args: argparse.Namespace) -> int:
    session = start_session(args)
    print(f"session directory: {session.dir}\nnotebook: from workbench.session import Session; s = Session.attach({session.id!r})", flush=True)
    try:
        return follow(session, seconds=args.seconds, steps=args.steps)
    except KeyboardInterrupt:
        print(f"\ndetached; the session goes on: Session.attach({session.id!r})")
        return 0
