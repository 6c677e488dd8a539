"""The local backend's state: one sqlite database under the kubesweep home, safe for several processes.

`sweep status` in another shell reads it while `sweep submit` writes it; every transition is committed at
once, so a killed supervisor loses no finished trial.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubesweep.backends.base import BackendError, Phase, TrialStatus
from kubesweep.sweep_spec.model import Concurrency, Placement, Resources
from kubesweep.wire.outcomes import Outcome

SCHEMA = """
CREATE TABLE IF NOT EXISTS sweeps (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    source TEXT NOT NULL,
    job_argv TEXT NOT NULL,
    any_gpu INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL,
    driver_pid INTEGER,
    driver_start INTEGER,
    driver_stop TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS trials (
    sweep TEXT NOT NULL REFERENCES sweeps(name) ON DELETE CASCADE,
    trial_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    name TEXT NOT NULL,
    label TEXT NOT NULL,
    gpu TEXT,
    gpus INTEGER NOT NULL,
    config TEXT NOT NULL,
    axes TEXT NOT NULL,
    phase TEXT NOT NULL,
    outcome TEXT,
    reason TEXT NOT NULL DEFAULT '',
    attempts INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    pid_start INTEGER,
    exit_code INTEGER,
    started REAL,
    finished REAL,
    PRIMARY KEY (sweep, trial_id)
);
"""


# columns added since the first stores were made: (table, column, type)
ADDED_COLUMNS = [("trials", "pid_start", "INTEGER"), ("sweeps", "driver_pid", "INTEGER"),
                 ("sweeps", "driver_start", "INTEGER"), ("sweeps", "driver_stop", "TEXT NOT NULL DEFAULT ''")]


class StoreError(BackendError):
    """The store cannot be opened or read (not a database, damaged, locked)."""


class SpecMismatch(Exception):
    """A sweep of this name is recorded with another spec."""


@dataclass
class SweepRow:
    name: str
    spec: dict[str, Any]
    source: str
    job_argv: list[str]
    any_gpu: bool
    cancel_requested: bool
    driver_pid: int | None = None  # the process driving the sweep (its supervisor), while one does
    driver_start: int | None = None  # its start time (/proc stat, clock ticks): pid and start name it
    driver_stop: str = ""  # how the last driver stopped before the sweep ended (a signal), when it could say

    # the parts of the stored spec the backend acts on, typed (a part an older spec lacks: its defaults)

    @property
    def resources(self) -> Resources:
        return Resources.model_validate(self._part("resources"))

    @property
    def concurrency(self) -> Concurrency:
        return Concurrency.model_validate(self._part("concurrency"))

    @property
    def placement(self) -> Placement:
        return Placement.model_validate(self._part("placement"))

    def _part(self, name: str) -> dict[str, Any]:
        part = (self.spec.get("spec") or {}).get(name)
        return part if isinstance(part, dict) else {}


@dataclass
class TrialRow:
    trial_id: str
    name: str
    label: str
    gpu: str | None
    gpus: int
    config: dict[str, Any]
    axes: dict[str, Any]
    phase: Phase
    outcome: Outcome | None
    reason: str
    attempts: int
    pid: int | None
    started: float | None
    finished: float | None
    pid_start: int | None = None  # the process's start time (/proc stat, clock ticks): pid and start name it


INIT_TRIES = 20


class Store:
    """The local backend's sqlite state. Made on its first use, not when opened: a read of a home without it (a
    read-only command, a typo in a sweep's name) finds no sweep and writes nothing."""

    def __init__(self, home: Path):
        self.home = home
        self.path = home / "state.db"
        self._ready = False

    def _make(self) -> None:
        self._ready = True
        self.home.mkdir(parents=True, exist_ok=True)
        for attempt in range(INIT_TRIES):
            try:
                self._init()
                break
            except StoreError as exc:
                # processes opening a fresh home at once: the switch to WAL and the first CREATE upgrade a read lock
                # to a write lock, which SQLite refuses at once (no busy wait) when another process holds one
                if "locked" not in str(exc) or attempt == INIT_TRIES - 1:
                    raise
                time.sleep(0.02 * (attempt + 1))

    def _init(self) -> None:
        with self._open() as db:
            db.execute("PRAGMA journal_mode=WAL")  # kept in the file: later connections need not ask again
            db.executescript(SCHEMA)
            for table, column, kind in ADDED_COLUMNS:  # a store made before them
                if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
                    with contextlib.suppress(sqlite3.OperationalError):  # another process added it first
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")

    @property
    def exists(self) -> bool:
        """Whether the store has been made: a read finds nothing in one that has not."""
        return self._ready or self.path.exists()

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if not self._ready:
            self._make()
        with self._open() as db:
            yield db

    @contextmanager
    def _open(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.DatabaseError as exc:
            raise self._unreadable(exc) from None
        try:
            db.execute("PRAGMA busy_timeout=30000")
            db.execute("PRAGMA foreign_keys=ON")
            db.row_factory = sqlite3.Row
            yield db
        except sqlite3.DatabaseError as exc:  # not a database, a damaged one, or locked for 30 s
            raise self._unreadable(exc) from None
        finally:
            db.close()

    def _unreadable(self, exc: sqlite3.DatabaseError) -> StoreError:
        return StoreError(f"the local backend's store {self.path} cannot be used ({exc}): move it aside to start "
                          f"an empty one (the trials' files under {self.home / 'sweeps'} stay), or pass another "
                          "--home")

    def sweep_dir(self, sweep: str) -> Path:
        return self.home / "sweeps" / sweep

    def trial_dir(self, sweep: str, trial_name: str) -> Path:
        return self.sweep_dir(sweep) / "trials" / trial_name

    # -- sweeps ------------------------------------------------------------------------------------

    def get_sweep(self, name: str) -> SweepRow | None:
        if not self.exists:
            return None
        with self._connect() as db:
            row = db.execute("SELECT * FROM sweeps WHERE name = ?", (name,)).fetchone()
        if row is None:
            return None
        return SweepRow(row["name"], json.loads(row["spec"]), row["source"], json.loads(row["job_argv"]),
                        bool(row["any_gpu"]), bool(row["cancel_requested"]), row["driver_pid"],
                        row["driver_start"], row["driver_stop"])

    def add_sweep(self, name: str, spec: dict[str, Any], source: str, job_argv: list[str], any_gpu: bool,
                  trials: list[dict[str, Any]]) -> int:
        """Record a sweep and its trials; trials already recorded are left as they are. Returns new count.

        Raises SpecMismatch when a sweep of that name is recorded with another spec: the check and the insert are
        one transaction, so of two processes submitting different specs under one name, one is refused."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute("SELECT spec FROM sweeps WHERE name = ?", (name,)).fetchone()
            if row is not None and json.loads(row["spec"]) != spec:
                db.execute("ROLLBACK")
                raise SpecMismatch(name)
            db.execute(
                "INSERT OR IGNORE INTO sweeps (name, spec, source, job_argv, any_gpu, created) VALUES (?,?,?,?,?,?)",
                (name, json.dumps(spec), source, json.dumps(job_argv), int(any_gpu), time.time()),
            )
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO trials (sweep, trial_id, position, name, label, gpu, gpus, config, axes,"
                " phase, reason) VALUES (:sweep, :trial_id, :position, :name, :label, :gpu, :gpus, :config,"
                " :axes, :phase, :reason)",
                [{**t, "sweep": name} for t in trials],
            )
            added = db.total_changes - before
            db.execute("COMMIT")
        return added

    def list_sweeps(self) -> list[str]:
        if not self.exists:
            return []
        with self._connect() as db:
            return [r[0] for r in db.execute("SELECT name FROM sweeps ORDER BY created")]

    def set_cancel(self, name: str, flag: bool) -> None:
        with self._connect() as db:
            db.execute("UPDATE sweeps SET cancel_requested = ? WHERE name = ?", (int(flag), name))

    def set_driver(self, name: str, pid: int | None, start: int | None, stop: str = "") -> None:
        """Record the process driving the sweep (None: none drives it, it ended), and how it stopped."""
        with self._connect() as db:
            db.execute("UPDATE sweeps SET driver_pid = ?, driver_start = ?, driver_stop = ? WHERE name = ?",
                       (pid, start, stop, name))

    def delete_sweep(self, name: str) -> None:
        with self._connect() as db:
            db.execute("DELETE FROM trials WHERE sweep = ?", (name,))
            db.execute("DELETE FROM sweeps WHERE name = ?", (name,))

    # -- trials ------------------------------------------------------------------------------------

    def trials(self, sweep: str) -> list[TrialRow]:
        with self._connect() as db:
            rows = db.execute("SELECT * FROM trials WHERE sweep = ? ORDER BY position", (sweep,)).fetchall()
        return [
            TrialRow(r["trial_id"], r["name"], r["label"], r["gpu"], r["gpus"], json.loads(r["config"]),
                     json.loads(r["axes"]), Phase(r["phase"]), Outcome(r["outcome"]) if r["outcome"] else None,
                     r["reason"], r["attempts"], r["pid"], r["started"], r["finished"], r["pid_start"])
            for r in rows
        ]

    def update(self, sweep: str, trial_id: str, *, only_if: Phase | None = None, **fields: Any) -> bool:
        """Set fields of a trial; with `only_if`, only while it is in that phase. True when it changed."""
        values = {k: (v.value if isinstance(v, (Phase, Outcome)) else v) for k, v in fields.items()}
        sets = ", ".join(f"{k} = :{k}" for k in values)
        where = "sweep = :_sweep AND trial_id = :_id" + (" AND phase = :_only" if only_if else "")
        params = {**values, "_sweep": sweep, "_id": trial_id, "_only": only_if.value if only_if else None}
        with self._connect() as db:
            return db.execute(f"UPDATE trials SET {sets} WHERE {where}", params).rowcount > 0

    def to_status(self, sweep: str, row: TrialRow) -> TrialStatus:
        results = self.trial_dir(sweep, row.name) / "results.json"
        return TrialStatus(
            trial_id=row.trial_id, name=row.name, label=row.label, gpu=row.gpu, phase=row.phase,
            outcome=row.outcome, reason=row.reason, attempts=row.attempts, started_at=row.started,
            finished_at=row.finished, results_path=str(results) if results.exists() else None, axes=row.axes,
        )
