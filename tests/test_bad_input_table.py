"""Every bad input gets one line and nothing half-done (issue 19, items 6 and 7): a table of bad inputs, each given to
the command line (in this process, as `verl-workbench ARGS`) or to the engine, each asserting the one line, the
exit status or error, and that nothing was written under the workbench home.

The YAML and store files here are synthetic, made by the cases themselves.
"""

from __future__ import annotations

import os
import re
import resource
import sqlite3
import time
from pathlib import Path

import pytest

from workbench.bounds import QUOTE_LIMIT
from workbench.cli import main
from workbench.plan import Plan, PlanError

MESSAGE_LIMIT = QUOTE_LIMIT + 200  # the quoted input and the words around it
BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8))


def tree(home: Path) -> dict[str, tuple[int, int]]:
    """Every file under home with its size and mode: what a refused input must leave as it was."""
    found = {}
    for path in home.rglob("*"):
        stat = path.lstat()
        found[str(path.relative_to(home))] = (stat.st_size if path.is_file() else -1, stat.st_mode)
    return found


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, f"not one line:\n{text}"
    assert "Traceback" not in text and len(lines[0]) <= MESSAGE_LIMIT, lines[0][:2000]
    return lines[0]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.err + (captured.out if code else "")


# ------------------------------------------------------------------------------------------------ files the cases use
def write_files(folder: Path) -> dict[str, Path]:
    folder.mkdir(exist_ok=True)
    files = {
        "selfref.yaml": "data: &loop\n  nested: *loop\n",
        "laughs.yaml": BILLION_LAUGHS,
        "deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n",
    }
    made = {}
    for name, text in files.items():
        made[name] = folder / name
        made[name].write_text(text)
    big = folder / "big.yaml"
    with open(big, "w") as out:
        out.write("data:\n")
        for index in range(30 * 1024):  # 30 MB of distinct keys
            out.write(f"  k{index}: {'x' * 1000}\n")
    made["big.yaml"] = big
    return made


def bad_store(folder: Path, kind: str) -> Path:
    """A session directory whose store is damaged in one way (synthetic)."""
    directory = folder / f"store-{kind}"
    directory.mkdir()
    (directory / "operator.token").write_text("0" * 32)
    store = directory / "session.sqlite"
    if kind == "empty":
        store.write_bytes(b"")
    elif kind == "random":
        store.write_bytes(os.urandom(8192))
    elif kind == "header only":
        store.write_bytes(b"SQLite format 3\0" + b"\0" * 84)
    elif kind == "foreign":
        db = sqlite3.connect(store)
        db.execute("CREATE TABLE photos(id INTEGER PRIMARY KEY, name TEXT)")
        db.commit()
        db.close()
    elif kind == "truncated":
        from workbench.session import resolve_recording

        data = (resolve_recording("h200-proof") / "session.sqlite").read_bytes()
        store.write_bytes(data[: len(data) // 3])
    return directory


STORE_KINDS = ("empty", "random", "header only", "foreign", "truncated")


# ------------------------------------------------------------------------------------------------ the command line
# (arguments, words the one line holds); each runs with a private home and must write nothing there.
CLI_CASES = [
    (["up", "--attach", "nope"], ("nope",)),
    (["up", "--replay", "nope"], ("nope",)),
    (["up", "--speed", "0"], ("--speed",)),
    (["up", "--speed", "-1"], ("--speed",)),
    (["up", "--speed", "nan"], ("--speed",)),
    (["up", "--speed", "inf"], ("--speed",)),
    (["up", "--port", "99999"], ("--port",)),
    (["up", "--port", "-1"], ("--port",)),
    (["up", "--port", "http"], ("--port",)),
    (["up", "--for", "-5"], ("--for",)),
    (["up", "--for", "nan"], ("--for",)),
    (["up", "--steps", "0"], ("--steps",)),
    (["up", "--max-pages", "0"], ("--max-pages",)),
    (["up", "--page-grace", "-1"], ("--page-grace",)),
    (["up", "--ip", "999.1.1.1"], ("999.1.1.1",)),
    (["up", "--attach", "{x*5000}"], ("not a session",)),
    (["up", "--attach", "../../etc"], ("etc",)),
    (["data", "generate", "{tmp}/assets", "--device", "bogus"], ("--device", "bogus")),
    (["data", "generate", "{tmp}/assets", "--n-train", "0"], ("--n-train",)),
    (["data", "generate", "{tmp}/assets", "--n-test", "-4"], ("--n-test",)),
    (["data", "generate", "{tmp}/assets", "--shape", "huge"], ("--shape",)),
    (["sample", "--gpus", "x,y"], ("--gpus",)),
    (["sample", "--gpus", "-1"], ("--gpus",)),
    (["sample", "--hz", "0"], ("--hz",)),
    (["sample", "--hz", "nan"], ("--hz",)),
    (["sample", "--seconds", "-1"], ("--seconds",)),
    (["balance", "nope"], ("nope",)),
    (["balance", "--since-step", "-1"], ("--since-step",)),
    (["plan", "validate", "--gpu-count", "-3"], ("--gpu-count",)),
    (["plan", "validate", "--gpu-count", "0"], ("--gpu-count",)),
    (["plan", "validate", "--set", "actor_token_budget=1e100"], ("actor_token_budget",)),
    (["plan", "validate", "--set", "actor_token_budget={9*100}"], ("actor_token_budget",)),
    (["plan", "show", "--set", "nope=1"], ("nope",)),
    (["plan", "show", "--set", "{x*100000}=1"], ("unknown knob",)),
    (["plan", "show", "--set", "trainer_mode={y*1000000}"], ("trainer_mode",)),
    (["plan", "show", "--yaml", "{files}/selfref.yaml"], ("selfref.yaml",)),
    (["plan", "show", "--yaml", "{files}/laughs.yaml"], ("laughs.yaml",)),
    (["plan", "show", "--yaml", "{files}/deep.yaml"], ("deep.yaml",)),
    (["plan", "show", "--yaml", "{files}/big.yaml"], ("big.yaml",)),
    (["plan", "show", "--yaml", "{files}/nowhere.yaml"], ("nowhere.yaml",)),
    (["plan", "diff", "{files}/nowhere.json", "{files}/selfref.yaml"], ("nowhere.json",)),
    *[(["balance", "{stores}/store-" + kind], ("store",)) for kind in STORE_KINDS],
    *[(["up", "--no-dashboard", "--attach", "{stores}/store-" + kind], ("store",)) for kind in STORE_KINDS],
]


def expand(argv: list[str], **places: Path) -> list[str]:
    """The arguments with {tmp}, {files} and {stores} filled in and {c*N} made N characters c long (kept short
    in the table, so that a failure's report stays readable)."""
    out = []
    for arg in argv:
        for match in re.findall(r"\{(.)\*(\d+)\}", arg):
            arg = arg.replace(f"{{{match[0]}*{match[1]}}}", match[0] * int(match[1]))
        out.append(arg.format(**places) if "{" in arg and len(arg) < 1000 else arg)
    return out


@pytest.fixture(scope="module")
def case_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    files = write_files(root / "files")
    (root / "stores").mkdir()
    for kind in STORE_KINDS:
        bad_store(root / "stores", kind)
    return root


@pytest.mark.parametrize("argv, words", CLI_CASES, ids=lambda v: " ".join(v)[:60] if isinstance(v, list) else None)
def test_a_bad_argument_gets_one_line_and_writes_nothing(argv, words, case_files, home, capsys):
    argv = expand(argv, tmp=home / "out", files=case_files / "files", stores=case_files / "stores")
    if argv[0] == "up":
        argv += ["--no-browser", "--for", "2"]  # were it taken, it ends by itself
    before, stores_before = tree(home), tree(case_files / "stores")
    started = time.time()
    memory_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, said = run_cli(argv, capsys)
    assert code not in (0, None), f"taken: {said}"
    line = one_line(said)
    for word in words:
        assert word in line, f"{word!r} not in {line!r}"
    assert time.time() - started < 30, "a bad input must be refused at once"
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - memory_before < 300 * 1024, "memory grew > 300 MB"
    assert tree(home) == before, "something was written"
    assert tree(case_files / "stores") == stores_before, "a damaged store was changed"


# ------------------------------------------------------------------------------------------------ the engine
def _plan_error(act) -> str:
    with pytest.raises(PlanError) as caught:
        act()
    return one_line(str(caught.value))


@pytest.mark.parametrize("changes, words", [
    ({"actor_token_budget": 10 ** 100}, ("actor_token_budget",)),
    ({"actor_token_budget": float("inf")}, ("actor_token_budget",)),
    ({"gpus": list(range(9999)) + ["x"]}, ("gpus",)),
    ({"gpus": list(range(10_000))}, ("gpus",)),
    ({"trainer_mode": "z" * 10_000_000}, ("trainer_mode",)),
    ({"critic_lora_target_modules": ["q_proj"] * 100_000}, ("critic_lora_target_modules",)),
    ({1: 2}, ("1", "unknown knob")),
    ({("a",): 2}, ("unknown knob",)),
    ({"x" * 1_000_000: 2}, ("unknown knob",)),
])
def test_unbounded_knob_values_get_one_short_line(changes, words):
    line = _plan_error(lambda: Plan.from_verl([]).with_changes(changes).validate())
    for word in words:
        assert word in line, line


def test_plan_validate_takes_no_negative_gpu_count():
    line = _plan_error(lambda: Plan.from_verl([]).validate(gpu_count=-3))
    assert "gpu_count" in line


@pytest.mark.parametrize("name", ["selfref.yaml", "laughs.yaml", "deep.yaml", "big.yaml"])
def test_a_hostile_yaml_is_refused_at_once(name, case_files):
    # This process's CPU seconds, not the wall clock: an expanding alias or a 30 MB parse burns CPU (over 300 s
    # before the limits), while the wall clock also counts other processes' turns on a loaded machine (10.7 s for
    # deep.yaml at load 17 on 2 cores).
    started = time.process_time()
    line = _plan_error(lambda: Plan.from_yaml(case_files / "files" / name))
    assert name in line and time.process_time() - started < 5


@pytest.mark.parametrize("kind", STORE_KINDS)
def test_a_damaged_store_is_refused_and_left_as_it_was(kind, case_files, tmp_path):
    """An operator (the token file is there) attaching a damaged or foreign store: one line, and the file is not
    given a schema (a 0-byte store stays 0 bytes instead of showing `starting` for ever)."""
    from workbench.session import Session
    from workbench.store import StoreError

    directory = bad_store(tmp_path, kind)
    before = tree(directory)
    with pytest.raises(StoreError) as caught:
        Session.attach(directory)
    line = one_line(str(caught.value))
    assert "store" in line
    assert tree(directory) == before


@pytest.mark.slow
def test_preview_with_a_non_string_knob_name_gets_one_line(home):
    from workbench.session import Session

    session = Session.replay("h200-proof", speed=20, follow=False)
    try:
        preview = session.preview({1: 2})
        assert not preview.ok and "unknown knob" in one_line(str(preview))
        line = _plan_error(lambda: session.apply({1: 2}))
        assert "unknown knob" in line
        assert session.commands().empty or (session.commands()["kind"] != "apply").all()
    finally:
        session.stop(now=True)
        session.close()


# ------------------------------------------------------------------------------------------------ homes and disks
AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups")
HOME_CALLS = {
    "Session.replay": "Session.replay('h200-proof')",
    "Session.list": "Session.list()",
    "Session.attach": "Session.attach()",
}


def _run_as_nobody(home: Path, code: str) -> str:
    """Run `code` as user nobody with VERL_WORKBENCH_HOME=home; what it printed (errors as `Type: message`)."""
    import subprocess
    import sys

    script = ("import sys\nfrom workbench.session import Session\nfrom workbench.cli import main\n"
              f"try:\n    {code}\nexcept Exception as error:\n    print(f'{{type(error).__name__}}: {{error}}')\n")
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([*AS_NOBODY, sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VERL_WORKBENCH_HOME": str(home), "PYTHONPATH": str(repo)}, cwd="/")
    return done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("call", [*HOME_CALLS, "up", "balance"])
def test_an_unreadable_home_gets_one_line(call, tmp_path):
    """VERL_WORKBENCH_HOME that this user can't enter (another user's, 0700): one line, naming the setting."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root to run the case as another user (nobody)")
    home = tmp_path / "home"
    (home / "sessions").mkdir(parents=True)
    home.chmod(0o700)
    tmp_path.chmod(0o755)
    code = HOME_CALLS.get(call) or f"sys.exit(main([{call!r}] + (['--no-browser', '--for', '2'] if {call!r} == 'up' else [])))"
    said = one_line(_run_as_nobody(home, code))
    assert "permission denied" in said and "VERL_WORKBENCH_HOME" in said, said
    assert list((home / "sessions").iterdir()) == []


@pytest.fixture
def full_disk(tmp_path, monkeypatch):
    """A 32 MB tmpfs as VERL_WORKBENCH_HOME, and what fills it to its last byte (root only: mounting needs
    CAP_SYS_ADMIN)."""
    import subprocess

    from tests.test_faults import _fill, _mount_tmpfs

    mount = tmp_path / "disk"
    if not _mount_tmpfs(mount, "32m"):
        pytest.skip("mounting a small tmpfs needs root")
    monkeypatch.setenv("VERL_WORKBENCH_HOME", str(mount / "home"))
    (mount / "home" / "sessions").mkdir(parents=True)
    yield mount, lambda: _fill(mount / "filler")
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_a_full_disk_leaves_no_half_made_session(full_disk, capsys):
    """Session.replay and `up` on a full disk: one line, and no folder holding a 0-byte token is left."""
    from workbench.paths import WorkbenchHomeError
    from workbench.session import Session

    mount, fill = full_disk
    fill()
    with pytest.raises(WorkbenchHomeError) as caught:
        Session.replay("h200-proof", follow=False)
    assert "No space left" in one_line(str(caught.value))
    code, said = run_cli(["up", "--no-browser", "--for", "2"], capsys)
    assert code == 1 and "No space left" in one_line(said)
    assert list((mount / "home" / "sessions").iterdir()) == []


@pytest.mark.slow
def test_stop_on_a_full_disk_gets_one_line_and_ends_the_session(full_disk):
    from workbench.procs import process_alive
    from workbench.session import Session
    from workbench.store import StoreError

    mount, fill = full_disk
    session = Session.replay("h200-lora-critic-sync", speed=2, follow=False, startup_speed=20)  # running in seconds
    session.wait_until(lambda s: s.state == "running", timeout=120)
    pid = int(session.meta["supervisor_pid"])
    fill()
    try:  # the supervisor fails on its own next write, or the store can't take the stop: one line either way
        said = session.stop(timeout=60)
    except StoreError as error:
        said = str(error)
    said = one_line(said)
    assert "full" in said or f"session {session.id} is stopped" in said, said
    deadline = time.time() + 60
    while process_alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    assert not process_alive(pid), "the supervisor goes on after a stop"
    session.close()
