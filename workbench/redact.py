"""Credentials (API keys, tokens, passwords) and how the workbench keeps them out of everything it writes.

A plan's overrides may carry credentials, e.g. `+ray_kwargs.ray_init.runtime_env.env_vars.WANDB_API_KEY=...`. A
Plan keeps their values apart (`Plan.secrets`) and writes SECRET_PLACEHOLDER in their place wherever it shows or
stores itself (overrides, YAML, command, JSON, repr), so no store row, event, export or recording holds one.

The values travel by environment only, never through the store (which every viewer of a session can read):
`Session.start` hands them to the supervisor in SECRETS_ENV (a JSON object: config key -> value); the
supervisor's runs inherit its environment; the runner puts them into the config verl runs, in memory
(runner/runtime.py). A process's environment is readable by its user alone (/proc/PID/environ). verl prints its
config to the run's log, which lies in the owner-only session directory (paths.private_dir).

Recordings: `scrub_store` removes the operator's credentials from command payloads (the operator token that
stores of old kept, and the signatures) and any credential value from the stored plans, then rewrites the file so
the bytes are gone too. Whatever becomes a recording goes through it (bench/gpu/session_proof.py).
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
from pathlib import Path
from typing import Any, Iterable

SECRET_PLACEHOLDER = "<secret>"
SECRETS_ENV = "WORKBENCH_SECRETS"
# Command payload fields that carry the operator's credentials: the token itself (stores of old), a signature.
CREDENTIAL_FIELDS = ("token", "nonce", "signature")

# Words that name a credential in any case; verl's own keys never contain them (e.g. `data.prompt_key` is not one).
_CREDENTIAL_WORDS = re.compile(r"secret|passw(?:or)?d|api_?key|access_?key|private_?key|credential|(?:^|_)token$",
                               re.IGNORECASE)
# Environment variable names (upper case) ending like a credential: WANDB_API_KEY, HF_TOKEN, GITHUB_PAT.
_CREDENTIAL_ENV = re.compile(r"(?:^|_)(?:KEY|TOKEN|PAT|AUTH)$")


def is_secret_name(name: Any) -> bool:
    """Whether a config key's last part or an environment variable's name looks like it holds a credential."""
    name = str(name)
    return bool(_CREDENTIAL_WORDS.search(name)) or (name.isupper() and bool(_CREDENTIAL_ENV.search(name)))


def _split_value(key: str, value: Any, secrets: dict[str, Any]) -> Any:
    """`value` with every credential under `key` replaced by the placeholder; the credentials go into `secrets`."""
    if is_secret_name(key.rsplit(".", 1)[-1]) and not isinstance(value, (dict, list)):
        if value != SECRET_PLACEHOLDER:  # a stored plan read back: its credential was never in it
            secrets[key] = value
        return SECRET_PLACEHOLDER
    if isinstance(value, dict):
        return {name: _split_value(f"{key}.{name}", item, secrets) for name, item in value.items()}
    return value


def split_overrides(overrides: Iterable[str]) -> tuple[tuple[str, ...], dict[str, Any]]:
    """(overrides with each credential's value replaced by the placeholder, {config key: credential value}).

    Overrides that set no credential stay exactly as written. The overrides must parse (Hydra's grammar)."""
    from .verl_config import OverridesParser, hydra_value  # Hydra imported whole, once (verl_config says why)

    overrides = tuple(overrides)
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    kept: list[str] = []
    secrets: dict[str, Any] = {}
    for text, override in zip(overrides, parsed, strict=True):
        if override.is_delete():
            kept.append(text)
            continue
        key = override.key_or_group
        found: dict[str, Any] = {}
        value = _split_value(key, override.value(), found)
        if not found:
            kept.append(text)
            continue
        secrets.update(found)
        prefix = re.match(r"\s*(\+\+|\+)?", text).group(1) or ""
        kept.append(f"{prefix}{key}={hydra_value(value)}")
    return tuple(kept), secrets


def placeholders(container: Any, prefix: str = "") -> list[str]:
    """Dotted keys in a plain config container that still hold the placeholder (a credential not filled in)."""
    if isinstance(container, dict):
        return [key for name, item in container.items() for key in placeholders(item, f"{prefix}{name}.")]
    return [prefix.rstrip(".")] if container == SECRET_PLACEHOLDER else []


def secrets_from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The credentials handed to this process (SECRETS_ENV), by config key."""
    text = (os.environ if environ is None else environ).get(SECRETS_ENV) or "{}"
    return json.loads(text)


# ------------------------------------------------------------------------------------------------ stored sessions
def _scrub_plan_json(text: str | None) -> str | None:
    """A stored plan (Plan.to_json's document) with credential values replaced; other text unchanged."""
    if not text:
        return text
    try:
        document = json.loads(text)
        overrides = document["overrides"]
    except (ValueError, KeyError, TypeError):
        return text
    kept, secrets = split_overrides(overrides)
    if not secrets:
        return text
    return json.dumps({**document, "overrides": list(kept)})


def _scrub_payload(text: str) -> str:
    payload = json.loads(text)
    clean = {name: value for name, value in payload.items() if name not in CREDENTIAL_FIELDS}
    if isinstance(clean.get("plan_json"), str):
        clean["plan_json"] = _scrub_plan_json(clean["plan_json"])
    return text if clean == payload else json.dumps(clean)


def scrub_store(session_dir: str | os.PathLike) -> int:
    """Remove operator credentials and credential values from a finished session's store, in place; returns the
    number of rows changed. The file is then rewritten (VACUUM): SQLite keeps deleted text in free pages."""
    from .store import STORE_FILE

    db = sqlite3.connect(str(Path(session_dir) / STORE_FILE), isolation_level=None)
    changed = 0
    try:
        db.execute("BEGIN IMMEDIATE")
        updates = {
            "commands": ("payload_json", _scrub_payload),
            "segments": ("plan_json", _scrub_plan_json),
        }
        for table, (column, scrub) in updates.items():
            for row_id, text in db.execute(f"SELECT id, {column} FROM {table}").fetchall():
                clean = scrub(text)
                if clean != text:
                    db.execute(f"UPDATE {table} SET {column}=? WHERE id=?", (clean, row_id))
                    changed += 1
        row = db.execute("SELECT value FROM meta WHERE key='initial_plan'").fetchone()
        if row is not None:
            clean = json.dumps(_scrub_plan_json(json.loads(row[0])))
            if clean != row[0]:
                db.execute("UPDATE meta SET value=? WHERE key='initial_plan'", (clean,))
                changed += 1
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("VACUUM")
        # A recording is read by replays and viewers: in WAL mode each reader would leave -shm/-wal files beside it.
        db.execute("PRAGMA journal_mode=DELETE")
    finally:
        db.close()
    return changed


def main(argv: list[str] | None = None) -> int:
    """`python -m workbench.redact SESSION_DIR…`: scrub stores before they are shipped as recordings."""
    import sys

    for directory in (sys.argv[1:] if argv is None else argv):
        print(f"{directory}: {scrub_store(directory)} rows scrubbed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
