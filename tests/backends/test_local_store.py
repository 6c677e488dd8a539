"""The local backend's state (`kubesweep.backends._local_store.Store`): a sqlite database under the home that
several processes share; sweeps and trials round-trip, updates can be guarded by the phase."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubesweep.backends._local_store import Store
from kubesweep.backends.base import Phase
from kubesweep.wire.outcomes import Outcome

SPEC = {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "s"}}


def trial(i: int, **over: Any) -> dict[str, Any]:
    row = {"trial_id": f"id{i}", "position": i, "name": f"s-{i}", "label": f"batch_size={8 * (i + 1)}",
           "gpu": None, "gpus": 0, "config": json.dumps({"job": {"batch_size": 8 * (i + 1)}}),
           "axes": json.dumps({"batch_size": 8 * (i + 1)}), "phase": Phase.PENDING.value, "reason": ""}
    return {**row, **over}


def test_a_sweep_and_its_trials_round_trip_and_adding_again_adds_only_new_ones(tmp_path: Path) -> None:
    store = Store(tmp_path / "home")
    assert store.get_sweep("s") is None and store.list_sweeps() == []
    assert not (tmp_path / "home").exists()  # reading a store that was never made makes nothing
    assert store.add_sweep("s", SPEC, "s.yaml", ["python", "job.py"], False, [trial(1), trial(0)]) == 2
    row = store.get_sweep("s")
    assert row is not None and (row.spec, row.source, row.job_argv) == (SPEC, "s.yaml", ["python", "job.py"])
    assert not row.any_gpu and not row.cancel_requested
    rows = store.trials("s")
    assert [r.trial_id for r in rows] == ["id0", "id1"]  # by position
    assert rows[1].axes == {"batch_size": 16} and rows[1].config == {"job": {"batch_size": 16}}
    assert rows[0].phase is Phase.PENDING and rows[0].outcome is None and rows[0].attempts == 0

    store.update("s", "id0", phase=Phase.RUNNING, pid=123)
    # the same trials again (a second submit) and one more: only the new one is added, the others keep their state
    assert store.add_sweep("s", SPEC, "other.yaml", [], True, [trial(0), trial(1), trial(2)]) == 1
    assert store.get_sweep("s").source == "s.yaml"  # type: ignore[union-attr]
    assert [(r.trial_id, r.phase) for r in store.trials("s")] == [
        ("id0", Phase.RUNNING), ("id1", Phase.PENDING), ("id2", Phase.PENDING)]
    assert Store(tmp_path / "home").trials("s")[0].pid == 123  # another process reads what was committed


def test_only_if_guards_an_update_by_the_trials_phase(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_sweep("s", SPEC, "s.yaml", [], False, [trial(0)])
    assert store.update("s", "id0", only_if=Phase.PENDING, phase=Phase.RUNNING, attempts=1, started=10.0)
    assert not store.update("s", "id0", only_if=Phase.PENDING, phase=Phase.RUNNING, attempts=2)  # lost the race
    assert store.trials("s")[0].attempts == 1
    assert store.update("s", "id0", only_if=Phase.RUNNING, phase=Phase.FAILED, outcome=Outcome.OOM,
                        reason="CUDA out of memory", finished=20.0, exit_code=3)
    (row,) = store.trials("s")
    assert (row.phase, row.outcome, row.reason, row.started, row.finished) == (
        Phase.FAILED, Outcome.OOM, "CUDA out of memory", 10.0, 20.0)
    assert not store.update("s", "nope", phase=Phase.RUNNING)  # no such trial
    assert not store.update("other", "id0", phase=Phase.RUNNING)


def test_cancel_flag_listing_deleting_and_the_status_of_a_row(tmp_path: Path) -> None:
    store = Store(tmp_path)
    store.add_sweep("a", SPEC, "a.yaml", [], False, [trial(0)])
    store.add_sweep("b", SPEC, "b.yaml", [], True, [trial(0)])
    assert store.list_sweeps() == ["a", "b"]
    store.set_cancel("a", True)
    assert store.get_sweep("a").cancel_requested and store.get_sweep("b").any_gpu  # type: ignore[union-attr]
    store.set_cancel("a", False)
    assert not store.get_sweep("a").cancel_requested  # type: ignore[union-attr]

    (row,) = store.trials("a")
    status = store.to_status("a", row)
    assert (status.trial_id, status.name, status.phase, status.results_path) == ("id0", "s-0", Phase.PENDING, None)
    results = store.trial_dir("a", "s-0") / "results.json"
    assert results == tmp_path / "sweeps" / "a" / "trials" / "s-0" / "results.json"
    results.parent.mkdir(parents=True)
    results.write_text("{}")
    assert store.to_status("a", row).results_path == str(results)

    store.delete_sweep("a")
    assert store.list_sweeps() == ["b"] and store.get_sweep("a") is None and store.trials("a") == []
    assert len(store.trials("b")) == 1  # the same trial id in another sweep is another trial


def test_a_damaged_store_is_a_clear_backend_error_not_a_traceback(tmp_path: Path) -> None:
    """A `state.db` that is not a database (a disk error, a stray file): `sweep status` says which file and what
    to do, exit 4 (a backend error; 1 means trials failed), and no traceback."""
    import subprocess
    import sys

    from kubesweep.backends._local_store import StoreError

    (tmp_path / "state.db").write_bytes(b"\x00not a database\xff" * 400)
    with pytest.raises(StoreError, match=r"state\.db cannot be used .*file is not a database"):
        Store(tmp_path).list_sweeps()  # found on the first read: the store is opened when used
    proc = subprocess.run([sys.executable, "-m", "kubesweep", "status", "s", "--home", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc
    assert "state.db cannot be used" in proc.stderr and "move it aside" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
