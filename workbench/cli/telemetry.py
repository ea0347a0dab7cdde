"""`verl-workbench balance` and `verl-workbench sample`: GPU load balance of a session, and standalone NVML sampling."""

from __future__ import annotations

import argparse
import csv
import math
import sys
import time
from typing import IO, Any

import pandas as pd

from ..session import Session
from ..store import SAMPLE_COLUMNS
from ..telemetry.balance import balance_frame, balance_verdicts
from ..telemetry.nvml import NvmlReader, NvmlUnavailable
from .args import gpu_list, nonnegative_int, positive_number
from ..telemetry.sampling import EXIT_NO_NVML, Sampler
from . import described


def add_telemetry_commands(subparsers: argparse._SubParsersAction) -> None:
    balance = subparsers.add_parser("balance", **described("balance"))
    balance.add_argument("session", nargs="?", default=None, help="session directory or id (default: the newest)")
    balance.add_argument("--since-step", type=nonnegative_int, default=None, metavar="N", help="only the samples from step N on")
    balance.set_defaults(func=balance_command)

    sample = subparsers.add_parser("sample", **described("sample"))
    sample.add_argument("--hz", type=positive_number, default=10.0, help="samples per second (default 10)")
    sample.add_argument("--seconds", type=positive_number, default=None, metavar="N", help="stop after N seconds (default: at Ctrl-C)")
    sample.add_argument("--out", default=None, metavar="CSV", help="write to this file (default: stdout)")
    sample.add_argument("--gpus", type=gpu_list, default=None, help="GPU indices, e.g. 0,1 (default: all)")
    sample.set_defaults(func=sample_command)


# ---------------------------------------------------------------------------------------------------------- balance


def step_start_time(steps: pd.DataFrame, step: int) -> float:
    """When step `step` began: its log time minus its timing_s/step (the latest segment's, if it ran twice)."""
    rows = steps[steps["step"] == step]
    if rows.empty:
        logged = sorted(steps["step"].unique())
        raise LookupError(f"no step {step} in this session (steps logged: {logged[0]}..{logged[-1]})" if logged else "no steps logged yet")
    row = rows.iloc[-1]
    duration = row.get("timing_s/step", math.nan)
    return float(row["t"] - duration) if pd.notna(duration) else float(row["t"])


def _formatted(frame: pd.DataFrame) -> str:
    shares = {c: "{:.0%}".format for c in ("idle_share", "mem_used_share")}
    return frame.to_string(index=False, formatters=shares, float_format="{:.1f}".format, na_rep="-")


def balance_command(args: argparse.Namespace) -> int:
    try:
        session = Session.attach(args.session, read_only=True)
    except FileNotFoundError as e:
        print(f"balance: {e}", file=sys.stderr)
        return 2
    t0 = None
    if args.since_step is not None:
        try:
            t0 = step_start_time(session.steps(), args.since_step)
        except LookupError as e:
            print(f"balance: {e}", file=sys.stderr)
            return 2
    frame = balance_frame(session.samples(), t0=t0)
    if frame.empty:
        print(f"balance: no GPU samples in session {session.dir}{' since that step' if t0 is not None else ''}",
              file=sys.stderr)
        return 1
    print(_formatted(frame))
    verdicts = balance_verdicts(frame)
    print()
    print("\n".join(f"- {v}" for v in verdicts) if verdicts else "no imbalance found")
    return 0


# ---------------------------------------------------------------------------------------------------------- sample


class CsvSink:
    """A sampler sink that writes sample rows as CSV in the store's column names (empty cells where NaN)."""

    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._writer = csv.DictWriter(stream, fieldnames=SAMPLE_COLUMNS, extrasaction="ignore")
        self._writer.writeheader()

    def add_samples(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._writer.writerow({k: "" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()})
        self._stream.flush()

    def add_event(self, kind: str, text: str, data: dict[str, Any] | None = None) -> None:
        print(f"{kind}: {text}", file=sys.stderr)


def sample_command(args: argparse.Namespace) -> int:
    try:
        reader = NvmlReader(args.gpus)
    except NvmlUnavailable as e:
        print(f"sample: {e}", file=sys.stderr)
        return EXIT_NO_NVML
    out = open(args.out, "w", newline="") if args.out else sys.stdout
    sampler = Sampler(CsvSink(out), reader, hz=args.hz, procs_every_s=None).start()
    try:
        if args.seconds is None:
            while True:
                time.sleep(3600)
        time.sleep(args.seconds)
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        reader.close()
        if args.out:
            out.close()
    return 0
