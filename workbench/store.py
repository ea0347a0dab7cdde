"""The session store: one SQLite file (WAL) per session, the one contract between producers and views.

Producers (the runner inside verl, the NVML sampler, the supervisor, replay) append rows; views read them
incrementally by row id and get pandas DataFrames. Commands flow back through the `commands` table.

WAL mode lets one writer and many readers work at once without blocking each other; every writer batches
(one transaction per call), so a 10 Hz sampler over 8 GPUs is one small transaction every flush.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import pandas as pd

from .control import STORE_FILE  # noqa: F401 (the store's file name; importers of store.py find it here too)

# Column order of the samples table; NaN where a GPU can't say (see telemetry/).
SAMPLE_COLUMNS = (
    "t", "node", "gpu", "util", "mem_used", "mem_total", "power_w", "sm_clock",
    "sm_active", "sm_occupancy", "tensor_active", "dram_active",
    "pcie_tx", "pcie_rx", "nvlink_tx", "nvlink_rx",
)
PROC_COLUMNS = ("t", "node", "gpu", "pid", "role", "mem_used")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS segments(
    id INTEGER PRIMARY KEY, started_at REAL, ended_at REAL, plan_json TEXT,
    status TEXT, reason TEXT, resumed_from_step INTEGER);
CREATE TABLE IF NOT EXISTS steps(
    id INTEGER PRIMARY KEY, segment_id INTEGER, step INTEGER, t REAL, metrics_json TEXT);
CREATE TABLE IF NOT EXISTS samples(
    id INTEGER PRIMARY KEY, t REAL, node TEXT, gpu INTEGER, util REAL, mem_used REAL, mem_total REAL,
    power_w REAL, sm_clock REAL, sm_active REAL, sm_occupancy REAL, tensor_active REAL, dram_active REAL,
    pcie_tx REAL, pcie_rx REAL, nvlink_tx REAL, nvlink_rx REAL);
CREATE TABLE IF NOT EXISTS procs(
    id INTEGER PRIMARY KEY, t REAL, node TEXT, gpu INTEGER, pid INTEGER, role TEXT, mem_used REAL);
CREATE TABLE IF NOT EXISTS workers(
    id INTEGER PRIMARY KEY, t REAL, node TEXT, pid INTEGER, role TEXT, segment_id INTEGER);
CREATE TABLE IF NOT EXISTS events(
    id INTEGER PRIMARY KEY, t REAL, kind TEXT, text TEXT, data_json TEXT);
CREATE TABLE IF NOT EXISTS commands(
    id INTEGER PRIMARY KEY, t REAL, kind TEXT, payload_json TEXT, state TEXT, result TEXT, done_at REAL);
CREATE INDEX IF NOT EXISTS samples_t ON samples(t);
CREATE INDEX IF NOT EXISTS steps_seg ON steps(segment_id, step);
CREATE INDEX IF NOT EXISTS commands_state ON commands(state);
"""

TABLES = ("meta", "segments", "steps", "samples", "procs", "workers", "events", "commands")
# Tables whose rows only ever get appended: a reader knows what is new from the largest row id.
APPEND_TABLES = ("steps", "samples", "procs", "workers", "events")
# Tables (and meta) whose rows also change in place: each change bumps its revision, kept in meta as rev:<name>.
REVISED = ("meta", "segments", "commands")
_REV_PREFIX = "rev:"
# What poll() reads in one query: the largest id per table, then the revisions, the state and the newest step.
_POLL_SQL = "SELECT " + ", ".join(
    [f"(SELECT COALESCE(MAX(id), 0) FROM {t})" for t in (*APPEND_TABLES, "segments", "commands")]
    + [f"(SELECT COALESCE(MAX(CAST(value AS INTEGER)), 0) FROM meta WHERE key='{_REV_PREFIX}{t}')" for t in REVISED]
    + ["(SELECT value FROM meta WHERE key='state')", "(SELECT value FROM meta WHERE key='supervisor_pid')",
       "(SELECT step FROM steps ORDER BY id DESC LIMIT 1)"]
)
POLL_FIELDS = (*APPEND_TABLES, "segments", "commands", *(f"{_REV_PREFIX}{t}" for t in REVISED),
               "state", "supervisor_pid", "last_step")


# Sample columns a chart aggregates (mean, min and max per bucket).
SAMPLE_METRICS = tuple(c for c in SAMPLE_COLUMNS if c not in ("t", "node", "gpu"))
STALE_ROUNDS = 3  # latest_procs: a node's newest process round is over once it has sampled this many intervals since
LATEST_WINDOW_S = 60.0  # latest_samples: a GPU silent for longer than this before the newest sample is left out


class StoreError(RuntimeError):
    pass


class SessionClosed(RuntimeError):
    """A command for a session whose supervisor takes no more commands (its state says it is exiting)."""


SQLITE_HEADER = b"SQLite format 3\0"


def _damage(path: Path) -> str | None:
    """Why the file at `path` is not a whole SQLite database (None: it may be one). Reads its 100-byte header only:
    a file of another kind, an empty file or one cut short (fewer bytes than the pages its header counts)."""
    with open(path, "rb") as stream:
        header = stream.read(100)
    size = path.stat().st_size
    if size == 0:
        return "an empty file"
    if len(header) < 100 or not header.startswith(SQLITE_HEADER):
        return "not an SQLite database"
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count is valid when its version matches the change counter; a store with a WAL beside it may be
    # being checkpointed (its header can run ahead of its size), and SQLite itself judges it.
    counted = header[92:96] == header[24:28] and not path.with_name(path.name + "-wal").exists()
    if page_size < 512 or (counted and size < page_size * pages):
        return f"cut short ({size:,} of the {page_size * pages:,} bytes its header counts)"
    return None


def _check_ours(db: sqlite3.Connection, path: Path) -> None:
    """Raise StoreError (one line) unless `db` holds a session store's tables: a file that isn't ours is left as
    it was (never given a schema), a damaged one said so."""
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as error:
        raise StoreError(f"{path} is not a readable session store ({error})") from None
    missing = [table for table in TABLES if table not in tables]
    if missing:
        raise StoreError(f"{path} is not a session store (no {', '.join(missing[:3])} table"
                         f"{'s' if len(missing) > 1 else ''}): left as it was")


def _bump(db: sqlite3.Connection, name: str) -> None:
    """Count a change in place (meta, segments, commands) so poll() sees it without reading the rows."""
    db.execute(
        "INSERT INTO meta(key, value) VALUES(?, '1') "
        "ON CONFLICT(key) DO UPDATE SET value=CAST(value AS INTEGER) + 1", (_REV_PREFIX + name,),
    )


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection: no writes, no schema script, no journal-mode change.

    A WAL store needs its -shm file to be read; where the reader can't create it (a finished session of another
    user, in a directory the reader can't write) the store is opened as immutable: a finished session's supervisor
    has checkpointed its WAL into the main file on exit, so nothing is missed."""
    uri = path.resolve().as_uri()
    for mode in ("mode=ro", "immutable=1"):
        db = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            _check_ours(db, path)
            return db
        except sqlite3.OperationalError as error:
            db.close()
            last = error
        except BaseException:
            db.close()
            raise
    raise StoreError(f"cannot read the session store {path}: {last}")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_json_default, allow_nan=True)


def _json_default(o: Any):
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    return str(o)


def _decoded(text: Any) -> Any:
    """A JSON column's value, or None where it is not JSON: any process that can write the store can write a row,
    and one bad row must not stop a reader (a command's taker refuses what isn't a JSON object, see
    control.SignatureCheck.refusal)."""
    try:
        return json.loads(text) if isinstance(text, (str, bytes)) else None
    except (ValueError, RecursionError):
        return None


def _object(text: Any) -> dict:
    value = _decoded(text)
    return value if isinstance(value, dict) else {}


def _nan_to_none(v: Any) -> Any:
    return None if isinstance(v, float) and math.isnan(v) else v


class Store:
    """One session's SQLite store. Safe to share between threads of one process; open one per process."""

    def __init__(self, path: str | os.PathLike, *, readonly: bool = False, create: bool = True):
        path = Path(path)
        if path.is_dir() or path.suffix != ".sqlite":
            path = path / STORE_FILE
        if not path.exists() and (readonly or not create):
            raise StoreError(f"no session store at {path}")
        self.path = path
        self.readonly = readonly
        self._lock = threading.RLock()
        existing = path.exists()
        if existing:
            damage = _damage(path)
            if damage:
                raise StoreError(f"{path} is not a session store: {damage}; it was left as it was")
        if readonly:
            self._db = _connect_readonly(path)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if not existing:
            # The owner's alone (SQLite gives its -wal and -shm files the same mode): a store holds what a run did.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        self._db = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA busy_timeout=30000")
            if existing:
                _check_ours(self._db, path)  # before WAL mode or a schema touch it
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as error:
            self._db.close()
            raise StoreError(f"cannot open the session store {path}: {error}") from None
        except BaseException:
            self._db.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.readonly:
            raise StoreError("this store was opened read-only")
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    yield self._db
                except BaseException:
                    self._rollback()
                    raise
                self._db.execute("COMMIT")
            except sqlite3.Error as error:  # e.g. a full disk: said in one line, the transaction undone
                self._rollback()
                raise StoreError(f"cannot write the session store {self.path}: {error}") from None

    def _rollback(self) -> None:
        if self._db.in_transaction:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:  # SQLite rolled back itself (a full disk may do that)
                pass

    def _query(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, tuple(args)).fetchall()

    # ------------------------------------------------------------------ meta
    def set_meta(self, **values: Any) -> None:
        with self._tx() as db:
            db.executemany(
                "INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                [(k, _dumps(v)) for k, v in values.items()],
            )
            _bump(db, "meta")

    def meta(self) -> dict[str, Any]:
        return {k: _decoded(v) for k, v in self._query("SELECT key, value FROM meta")
                if not k.startswith(_REV_PREFIX)}

    def poll_row(self) -> tuple:
        """One cheap query: the largest row id per table, the revisions of what changes in place, the raw state
        and supervisor pid (JSON text, not decoded) and the newest step (see POLL_FIELDS)."""
        return self._query(_POLL_SQL)[0]

    # ------------------------------------------------------------------ segments
    def begin_segment(self, plan_json: str, reason: str = "", resumed_from_step: int | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO segments(started_at, plan_json, status, reason, resumed_from_step) VALUES(?,?,?,?,?)",
                (time.time(), plan_json, "running", reason, resumed_from_step),
            )
            return int(cur.lastrowid)

    def end_segment(self, segment_id: int, status: str, reason: str | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE segments SET ended_at=?, status=?, reason=COALESCE(?, reason) WHERE id=?",
                (time.time(), status, reason, segment_id),
            )
            _bump(db, "segments")

    def segment(self, segment_id: int) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM segments WHERE id=?", (segment_id,))
        return self._as_dicts("segments", rows)[0] if rows else None

    def last_segment(self) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM segments ORDER BY id DESC LIMIT 1")
        return self._as_dicts("segments", rows)[0] if rows else None

    # ------------------------------------------------------------------ producers
    def add_step(self, segment_id: int, step: int, metrics: dict[str, Any], t: float | None = None) -> int:
        clean = {k: _nan_to_none(v) for k, v in metrics.items()}
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO steps(segment_id, step, t, metrics_json) VALUES(?,?,?,?)",
                (segment_id, int(step), t or time.time(), _dumps(clean)),
            )
            return int(cur.lastrowid)

    def add_samples(self, rows: Iterable[dict[str, Any] | tuple]) -> None:
        self._insert_many("samples", SAMPLE_COLUMNS, rows)

    def add_procs(self, rows: Iterable[dict[str, Any] | tuple]) -> None:
        self._insert_many("procs", PROC_COLUMNS, rows)

    def add_worker(self, pid: int, role: str, node: str, segment_id: int | None = None) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO workers(t, node, pid, role, segment_id) VALUES(?,?,?,?,?)",
                (time.time(), node, int(pid), role, segment_id),
            )

    def add_event(self, kind: str, text: str, data: dict[str, Any] | None = None, t: float | None = None) -> int:
        with self._tx() as db:
            cur = db.execute(
                "INSERT INTO events(t, kind, text, data_json) VALUES(?,?,?,?)",
                (t or time.time(), kind, text, _dumps(data or {})),
            )
            return int(cur.lastrowid)

    def _insert_many(self, table: str, columns: tuple[str, ...], rows: Iterable[dict[str, Any] | tuple]) -> None:
        values = [
            tuple(_nan_to_none(r.get(c)) for c in columns) if isinstance(r, dict) else tuple(map(_nan_to_none, r))
            for r in rows
        ]
        if not values:
            return
        marks = ",".join("?" * len(columns))
        with self._tx() as db:
            db.executemany(f"INSERT INTO {table}({','.join(columns)}) VALUES({marks})", values)

    # ------------------------------------------------------------------ commands (views -> supervisor -> runner)
    def put_command(self, kind: str, payload: dict[str, Any] | None = None, *, unless_state: Iterable[str] = ()) -> int:
        """Queue a command; SessionClosed instead when the session's state is one of `unless_state`, read in the same
        transaction (a supervisor that has written such a state never sees a command queued after it)."""
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key='state'").fetchone()
            state = _decoded(row[0]) if row else None
            if state in tuple(unless_state):
                raise SessionClosed(f"{kind}: the session is {state}: its supervisor takes no more commands")
            cur = db.execute(
                "INSERT INTO commands(t, kind, payload_json, state) VALUES(?,?,?,'queued')",
                (time.time(), kind, _dumps(payload or {})),
            )
            return int(cur.lastrowid)

    def take_commands(self, kinds: Iterable[str] | None = None, taker: str = "taken",
                      limit: int | None = None) -> list[dict[str, Any]]:
        """Atomically claim queued commands (oldest first), optionally only of some kinds, at most `limit` of them."""
        kinds = tuple(kinds) if kinds is not None else None
        with self._tx() as db:
            sql = "SELECT id, t, kind, payload_json FROM commands WHERE state='queued'"
            args: tuple = ()
            if kinds is not None:
                sql += f" AND kind IN ({','.join('?' * len(kinds))})"
                args = kinds
            sql += " ORDER BY id"
            if limit is not None:
                sql += f" LIMIT {int(limit)}"
            rows = db.execute(sql, args).fetchall()
            db.executemany("UPDATE commands SET state=? WHERE id=?", [(taker, r[0]) for r in rows])
            if rows:
                _bump(db, "commands")
        return [dict(id=r[0], t=r[1], kind=r[2], payload=_decoded(r[3])) for r in rows]

    def finish_command(self, command_id: int, state: str, result: Any = None, *, final: bool = True) -> None:
        """Answer a command; final=False for a state it moves on from (an apply accepted, restarting)."""
        with self._tx() as db:
            db.execute(
                "UPDATE commands SET state=?, result=?, done_at=? WHERE id=?",
                (state, _dumps(result), time.time() if final else None, command_id),
            )
            _bump(db, "commands")

    def commands_in(self, states: Iterable[str], kinds: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Commands in any of `states` (optionally only of some kinds), oldest first, results decoded."""
        states = tuple(states)
        sql = f"SELECT * FROM commands WHERE state IN ({','.join('?' * len(states))})"
        args: tuple = states
        if kinds is not None:
            kinds = tuple(kinds)
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += kinds
        out = self._as_dicts("commands", self._query(sql + " ORDER BY id", args))
        for command in out:
            command["result"] = _decoded(command["result"]) if command["result"] else None
        return out

    def command(self, command_id: int) -> dict[str, Any] | None:
        rows = self._query("SELECT * FROM commands WHERE id=?", (command_id,))
        return self._as_dicts("commands", rows)[0] if rows else None

    # ------------------------------------------------------------------ readers
    def rows(self, table: str, since_id: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        if table not in TABLES or table == "meta":
            raise StoreError(f"unknown table {table!r}")
        sql = f"SELECT * FROM {table} WHERE id > ? ORDER BY id"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self._as_dicts(table, self._query(sql, (since_id,)))

    def frame(self, table: str, since_id: int = 0) -> pd.DataFrame:
        """All rows of a table after `since_id` as a DataFrame; JSON columns are expanded."""
        if table not in TABLES or table == "meta":
            raise StoreError(f"unknown table {table!r}")
        with self._lock:
            df = pd.read_sql_query(f"SELECT * FROM {table} WHERE id > ? ORDER BY id", self._db, params=(since_id,))
        return _expand_json(table, df)

    def last_step(self) -> int | None:
        """The step of the newest step row (where the session stands), or None before its first step."""
        rows = self._query("SELECT step FROM steps ORDER BY id DESC LIMIT 1")
        return int(rows[0][0]) if rows else None

    def sample_buckets(
        self, every_s: float, window_s: float | None = None, gpus: Iterable[int] | None = None,
        metrics: Iterable[str] | None = None, since_t: float | None = None,
    ) -> pd.DataFrame:
        """Samples aggregated in SQL per `every_s` bucket (aligned to multiples of it) and GPU: t (bucket start,
        epoch s), node, gpu, n, and for each metric m (default: all of SAMPLE_METRICS): m (mean), m_min, m_max.
        window_s: only the last that many seconds before the newest sample; since_t: only samples with t >= since_t
        (a live view re-reading its newest buckets: the index finds them). Each aggregate costs time per row:
        ask only for the metrics shown."""
        if not every_s > 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        metrics = SAMPLE_METRICS if metrics is None else tuple(metrics)
        unknown = sorted(set(metrics) - set(SAMPLE_METRICS))
        if unknown:
            raise ValueError(f"unknown sample metrics {unknown}: choose from {', '.join(SAMPLE_METRICS)}")
        aggregates = ", ".join(f"AVG({m}), MIN({m}), MAX({m})" for m in metrics)
        where, args = self._sample_filter(window_s, gpus, since_t)
        sql = (f"SELECT CAST(t / ? AS INTEGER) AS bucket, node, gpu, COUNT(*) AS n, {aggregates} FROM samples"
               f"{where} GROUP BY bucket, node, gpu ORDER BY bucket, node, gpu")
        rows = self._query(sql, (every_s, *args))
        return _bucket_frame(rows, metrics, float(every_s))

    def samples_window(self, window_s: float | None = None, gpus: Iterable[int] | None = None) -> pd.DataFrame:
        """Raw sample rows of the last `window_s` seconds before the newest sample, optionally of some GPUs."""
        where, args = self._sample_filter(window_s, gpus)
        with self._lock:
            df = pd.read_sql_query(f"SELECT * FROM samples{where} ORDER BY id", self._db, params=args)
        return _expand_json("samples", df)

    def _sample_filter(self, window_s: float | None, gpus: Iterable[int] | None,
                       since_t: float | None = None) -> tuple[str, tuple]:
        clauses, args = [], []
        if window_s is not None:
            clauses.append("t > (SELECT MAX(t) FROM samples) - ?")
            args.append(float(window_s))
        if since_t is not None:
            clauses.append("t >= ?")
            args.append(float(since_t))
        if gpus is not None:
            gpus = [int(g) for g in gpus]
            clauses.append(f"gpu IN ({','.join('?' * len(gpus))})")
            args += gpus
        return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(args)

    def latest_samples(self) -> pd.DataFrame:
        """The newest sample per (node, gpu), of GPUs heard from in the last LATEST_WINDOW_S before the newest."""
        sql = ("SELECT * FROM samples WHERE id IN (SELECT MAX(id) FROM samples WHERE t >= "
               "(SELECT MAX(t) FROM samples) - ? GROUP BY node, gpu) ORDER BY node, gpu")
        with self._lock:
            df = pd.read_sql_query(sql, self._db, params=(LATEST_WINDOW_S,))
        return _expand_json("samples", df)

    def latest_procs(self) -> pd.DataFrame:
        """The processes alive now: each node's newest sampling round (the sampler writes a round's rows with one t),
        unless the node has sampled its GPUs for more than STALE_ROUNDS round intervals since (its processes ended:
        a restart, a crash, the end of the run). Never a process of a round before (no dead PIDs summed)."""
        sql = f"""
            WITH newest AS (SELECT node, MAX(t) AS t FROM procs GROUP BY node),
            rounds AS (
                SELECT n.node, n.t,
                       (SELECT MAX(q.t) FROM procs q WHERE q.node = n.node AND q.t < n.t) AS previous,
                       (SELECT MAX(s.t) FROM samples s WHERE s.node = n.node) AS sampled
                FROM newest n)
            SELECT p.* FROM procs p JOIN rounds r ON p.node = r.node AND p.t = r.t
            WHERE r.sampled IS NULL OR r.previous IS NULL OR r.sampled - r.t <= {STALE_ROUNDS} * (r.t - r.previous)
            ORDER BY p.node, p.gpu, p.pid"""
        with self._lock:
            df = pd.read_sql_query(sql, self._db)
        return _expand_json("procs", df)

    def step_figures(self, since_segment: int = 0) -> pd.DataFrame:
        """Per segment (id > since_segment): steps, first/last step, mean step time and throughput, in SQL."""
        sql = ("SELECT segment_id, COUNT(*) AS steps, MIN(step) AS first_step, MAX(step) AS last_step, "
               "AVG(json_extract(metrics_json, '$.\"timing_s/step\"')) AS step_time_s, "
               "AVG(json_extract(metrics_json, '$.\"perf/throughput\"')) AS throughput "
               "FROM steps WHERE segment_id > ? GROUP BY segment_id")
        with self._lock:
            return pd.read_sql_query(sql, self._db, params=(since_segment,))

    def sample_figures(self, start: float, end: float | None, gpus: Iterable[int] | None = None) -> dict[str, float]:
        """Mean utilization, mean SM activity and peak memory (GB) of samples with start < t <= end."""
        where, args = self._sample_filter(None, gpus)
        where += (" AND " if where else " WHERE ") + "t > ? AND t <= ?"
        row = self._query(f"SELECT AVG(util), AVG(sm_active), MAX(mem_used) FROM samples{where}",
                          (*args, start, math.inf if end is None else end))[0]
        nan = float("nan")
        return {"util_mean": nan if row[0] is None else row[0], "sm_active_mean": nan if row[1] is None else row[1],
                "mem_peak_gb": nan if row[2] is None else row[2] / 1024}

    def max_id(self, table: str) -> int:
        return int(self._query(f"SELECT COALESCE(MAX(id), 0) FROM {table}")[0][0])

    def _as_dicts(self, table: str, rows: list[tuple]) -> list[dict[str, Any]]:
        cols = [r[1] for r in self._query(f"PRAGMA table_info({table})")]
        out = []
        for r in rows:
            d = dict(zip(cols, r))
            for k in ("metrics_json", "data_json", "payload_json"):
                if k in d and d[k] is not None:
                    d[k[: -len("_json")]] = _decoded(d.pop(k))
            out.append(d)
        return out


# Measurement columns: a column a GPU never reported is all NULL, which pandas would read as object dtype of None.
_FLOAT_COLUMNS = {
    "samples": [c for c in SAMPLE_COLUMNS if c not in ("node", "gpu")],
    "procs": ["t", "mem_used"],
}


def _bucket_frame(rows: list[tuple], metrics: tuple[str, ...], every_s: float) -> pd.DataFrame:
    """sample_buckets' rows (bucket, node, gpu, n, then mean, min, max per metric) as a DataFrame whose measurements
    are one float64 block: built from numpy, not pandas.read_sql_query (a block per column, which made every later
    slice, concat and group of a live window cost ~10x more)."""
    names = [f"{m}{suffix}" for m in metrics for suffix in ("", "_min", "_max")]
    values = np.array([row[4:] for row in rows], dtype=np.float64).reshape(len(rows), len(names))  # NULL -> NaN
    keys = pd.DataFrame({
        "t": np.array([row[0] for row in rows], dtype=np.int64) * every_s,
        "node": pd.array([row[1] for row in rows], dtype="str"),
        "gpu": np.array([row[2] for row in rows], dtype=np.int64),
        "n": np.array([row[3] for row in rows], dtype=np.int64),
    })
    return pd.concat([keys, pd.DataFrame(values, columns=names)], axis=1)


def _expand_json(table: str, df: pd.DataFrame) -> pd.DataFrame:
    if table in _FLOAT_COLUMNS:
        df = df.astype({c: "float64" for c in _FLOAT_COLUMNS[table]})
    elif table == "steps":
        metrics = pd.DataFrame([_object(s) for s in df.pop("metrics_json")], index=df.index)
        df = pd.concat([df, metrics.astype("float64", errors="ignore")], axis=1)
    elif table == "events":
        df["data"] = [_object(s) for s in df.pop("data_json")]
    elif table == "commands":
        df["payload"] = [_decoded(s) for s in df.pop("payload_json")]
    return df
