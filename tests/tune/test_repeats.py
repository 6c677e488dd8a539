"""Sequential repeats (`repeats` + `repeat_until`): the stopping rule on known sequences, the spec, and a sweep
run under the rule on the local backend with the stand-in job (tests/support/stand_in_job.py: its samples/s are
exact, 2% apart for two repeats, or 20% apart for ever, by the learning rate), then continued."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesweep.backends.base import BackendError
from kubesweep.backends.kubernetes import KubernetesBackend
from kubesweep.cli.search_view import repeats_lines
from kubesweep.plan import count_trials, make_trial, plan
from kubesweep.session import Options, Session
from kubesweep.sweep_spec import SequentialRepeats, SpecError, parse_sweep
from kubesweep.tracking.report import build
from kubesweep.tune.repeats import (
    AT_MAX,
    HOST_BOUND,
    NO_VALUE,
    REACHED,
    CellRepeats,
    leaders,
    next_repeats,
    run_repeats,
)
from kubesweep.wire.env import TrackingEnv
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.search import RepeatsSummary

STAND_IN = Path(__file__).parents[1] / "support" / "stand_in_job.py"
RULE = SequentialRepeats(min=3, max=6, target=3.0)


def cell(values: list[float], *, repeats: int | None = None, ended: int | None = None,
         group: tuple[str, str] = ("train", "H100")) -> CellRepeats:
    n = repeats if repeats is not None else len(values)
    trials = [make_trial(SWEEP, {"batch_size": 8}, r) for r in range(n)]
    return CellRepeats({"batch_size": 8}, trials, ended=n if ended is None else ended, values=values, group=group)


def doc(repeats: int, until: Any = None, **spec: Any) -> dict[str, Any]:
    more = {"repeat_until": until} if until is not None else {}
    return {"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "reps"},
            "spec": {"job": {"max_steps": 2}, "resources": {"gpus_per_trial": 0, "retries": 0},
                     "matrix": {"batch_size": [8, 16]}, "repeats": repeats, **more, **spec}}


SWEEP = parse_sweep(doc(3, {"max": 6}))


# -- the rule on known sequences ------------------------------------------------------------------------------


def test_a_cell_within_the_target_stops_and_a_wide_one_continues() -> None:
    assert cell([100.0, 100.5, 99.5]).stopped(RULE) == REACHED  # ±1.2%
    wide = cell([100.0, 110.0, 90.0])  # ±24.8%
    assert wide.stopped(RULE) is None
    assert next_repeats([wide], RULE, higher_is_better=True, width=4) == [0]
    # two more repeats at the mean narrow it: [100, 110, 90, 100, 100] reads ±8.8%, still over 3%
    assert cell([100.0, 110.0, 90.0, 100.0, 100.0]).stopped(RULE) is None


def test_a_cell_at_max_stops_without_the_target_and_one_without_values_stops_at_min() -> None:
    assert cell([120.0, 80.0, 120.0, 80.0, 120.0, 80.0]).stopped(RULE) == AT_MAX
    assert cell([], repeats=3, ended=3).stopped(RULE) == NO_VALUE  # every repeat OOM: more would be too
    assert cell([], repeats=2, ended=2).stopped(SequentialRepeats(min=2, max=5)) == NO_VALUE
    # every repeat measured its host: its spread is the host's, it stops at the min with the reason named
    host = cell([120.0, 80.0, 120.0])
    host.host_bound = True
    assert host.stopped(RULE) == HOST_BOUND
    assert next_repeats([host], RULE, higher_is_better=True, width=4) == []
    early = cell([120.0, 80.0], repeats=2, ended=2)
    early.host_bound = True
    assert early.stopped(RULE) is None  # below the min: run the min first, like every cell
    # a host-bound cell already within the target reached it: that is the reason to give
    assert cell([100.0, 100.5, 99.5]).stopped(RULE) == REACHED
    # a repeat still running: judged once it ends, never given another meanwhile
    running = cell([100.0, 130.0], repeats=3, ended=2)
    assert running.stopped(RULE) is None
    assert next_repeats([running], RULE, higher_is_better=True, width=4) == []


def test_repeats_go_first_to_the_leaders_whose_intervals_overlap() -> None:
    best = cell([100.0, 104.0, 96.0])  # 100 ± 9.9
    close = cell([97.0, 101.0, 93.0])  # 97 ± 9.9: overlaps the best, the answer is undecided
    far = cell([50.0, 60.0, 40.0])  # 50 ± 24.8: clearly behind, but wide
    other_gpu = cell([30.0, 33.0, 27.0], group=("train", "H200"))  # the best of its own group
    cells = [far, close, best, other_gpu]
    assert leaders(cells, higher_is_better=True) == {1, 2, 3}
    # one slot: a leader gets it, the widest first (the H200 leader reads ±24.8%, the H100 ones ±9.9%)
    assert next_repeats(cells, RULE, higher_is_better=True, width=1) == [3]
    assert next_repeats(cells, RULE, higher_is_better=True, width=3) == [3, 1, 2]
    assert next_repeats(cells, RULE, higher_is_better=True, width=8) == [3, 1, 2, 0]
    # lower is better (latency): the 50 is the leader, alone
    assert leaders(cells[:3], higher_is_better=False) == {0}
    # extra repeats in flight count against the width; the min repeats do not
    in_flight = cell([100.0, 104.0, 96.0], repeats=4, ended=3)
    assert next_repeats([in_flight, far], RULE, higher_is_better=True, width=1) == []
    assert next_repeats([in_flight, far], RULE, higher_is_better=True, width=2) == [1]


# -- the spec ---------------------------------------------------------------------------------------------------


def test_the_spec_takes_a_rule_beside_the_count_and_says_what_is_wrong() -> None:
    sweep = parse_sweep(doc(2, {"max": 5, "target": "2.5%"}))
    assert sweep.spec.repeat_rule == SequentialRepeats(min=2, max=5, target=2.5, metric="samples_per_s")
    assert sweep.spec.adaptive and sweep.spec.runner == "kubesweep.tune.repeats:run_repeats"
    p = plan(sweep)
    assert sorted(t.repeat for t in p.trials) == [0, 0, 1, 1]  # min of each cell to start with
    assert any("within ±2.5%" in note for note in p.notes)
    assert count_trials(sweep) == 10  # the budget: the rule's max
    assert not parse_sweep(doc(3)).spec.adaptive and parse_sweep(doc(3)).spec.first_repeats == 3
    for repeats, until, words in ((5, {"max": 3}, "spec.repeat_until.max: 3 is fewer than repeats (5)"),
                                  (1, {"max": 3}, "spec.repeats: repeat_until needs repeats of at least 2"),
                                  (3, {"target": 0.03}, "spec.repeat_until.target: must be >= 0.1, got 0.03"),
                                  (3, {"target": "three%"}, "spec.repeat_until.target: expected a number"),
                                  (3, {"metric": "nonsense"}, "'nonsense' is not one of samples_per_s"),
                                  (3, {"min": 2}, "spec.repeat_until.min")):
        with pytest.raises(SpecError) as err:
            parse_sweep(doc(repeats, until))
        assert words in str(err.value), str(err.value)
    with pytest.raises(SpecError) as err:
        parse_sweep(doc(2, {"max": 4}, search={"strategy": "max_batch"}))
    assert "spec.repeat_until: repeat_until repeats the cells of a grid or random search; a max_batch search" \
        in str(err.value)


# -- a sweep under the rule, local backend --------------------------------------------------------------------


def test_a_sweep_repeats_each_cell_until_it_decides_and_a_second_run_continues_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    monkeypatch.delenv("KUBESWEEP_TUNE_STORAGE", raising=False)
    home = tmp_path / "home"
    sweep = parse_sweep({
        "apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "reps"},
        "spec": {"job": {"max_steps": 1}, "resources": {"gpus_per_trial": 0, "retries": 0},
                 "concurrency": {"max_parallel": 4},
                 "matrix": {"batch_size": [8, 256]},  # exact; out of memory
                 "include": [{"batch_size": 16, "learning_rate": 0.321},  # 2% apart twice: within 3% at 4
                             {"batch_size": 32, "learning_rate": 0.789},  # 20% apart: never within
                             # as wide, and its GPU busy 20% of its measured steps: host-bound, stops at the min
                             {"batch_size": 64, "learning_rate": 0.654}],
                 "repeats": 3, "repeat_until": {"max": 5, "target": "3%"}}})
    s = Session(Options(home=home, no_tracking=True, parallel=4))
    assert s.submit(sweep, plan(sweep)) is None  # the rule runs here
    ended = s.run_search(sweep)
    found = ended.found
    assert isinstance(found, RepeatsSummary)
    by_batch = {c.axes["batch_size"]: c for c in found.cells}
    assert {b: (c.repeats, c.stopped) for b, c in by_batch.items()} == {
        8: (3, "reached"), 256: (3, "no value"), 16: (4, "reached"), 32: (5, "max"), 64: (3, "host-bound")}
    assert (by_batch[16].half_width_pct or 99) < 3 < (by_batch[32].half_width_pct or 0)
    assert (found.repeats, found.fixed_min, found.fixed_max, found.at_max) == (18, 15, 25, 1)
    status = s.backend.status("reps")
    assert len(status.trials) == 18 and all(t.phase.terminal for t in status.trials)
    starts = (home / "sweeps" / "reps" / "starts.log").read_text().splitlines()
    assert len(starts) == 18  # no repeat ran twice
    storage = s.search_storage("reps")
    assert json.loads((storage / "repeats.json").read_text()) == found.model_dump(mode="json")
    assert s.search_found("reps", sweep, None) == found
    lines = repeats_lines(found)
    assert "18 repeats over 5 cells (a fixed 3: 15, a fixed 5: 25)" in lines[0]
    assert any("batch_size=32" in line and "stopped at the max of 5 repeats" in line for line in lines[1:])
    assert any("batch_size=256" in line and "no value in 3 repeats" in line for line in lines[1:])
    assert any("batch_size=64" in line and "stopped after 3 repeats at ±" in line and "host-bound" in line
               for line in lines[1:])

    # the report states the rule and the repeats each setting got, from the sweep or its copied directory
    spent = s.repeats_spent(["reps"])
    assert spent == [("reps", found)]
    assert s.repeats_spent([str(home / "sweeps" / "reps")]) == [(str(home / "sweeps" / "reps"), found)]
    results = s.results("reps", experiment=None, target_accuracy=0.9, best_by="samples_per_s")
    built = build(results.cells, tmp_path / "report", sweep="reps", source="files", target=0.9,
                  best_by="samples_per_s", repeats=spent)
    (table,) = [t for t in built.tables if t.title == "repeats per setting"]
    assert "reps: 3 to 5 repeats a setting until the 95% interval of samples_per_s is within ±3.0%, 18 repeats" \
           in table.note
    rows = {row[2]: row for row in table.rows}
    assert [(r[3], r[5]) for s_, r in sorted(rows.items()) if "bs32" in s_] == [("5", "reps: max")]
    assert [(r[3], r[5]) for s_, r in sorted(rows.items()) if "bs16" in s_] == [("4", "target")]
    assert [(r[3], r[5]) for s_, r in sorted(rows.items()) if "bs64" in s_] == [("3", "reps: host-bound")]

    # run again (a resumed sweep): the rule reads the repeats that ran, including the ones it added, and
    # starts none of them again
    (storage / "repeats.json").unlink()
    again = Session(Options(home=home, no_tracking=True, parallel=4))
    resumed, _ = again.resume("reps")
    assert again.run_search(resumed).found == found
    assert len((home / "sweeps" / "reps" / "starts.log").read_text().splitlines()) == 18


def test_the_tuner_and_the_operators_render_run_the_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Under the operator the rule runs as the tuner Job (`python -m kubesweep.tune`), which `render` shows beside
    the trial Jobs of the first repeats; the tuner runs it to its end (here on the local backend)."""
    from kubesweep.manifests import render_plan
    from kubesweep.tune.__main__ import main

    digest = "registry.example/kubesweep-job@sha256:" + "0" * 64
    sweep = parse_sweep({**doc(2, {"max": 3}), "spec": {**doc(2, {"max": 3})["spec"], "image": digest}})
    objects = render_plan(plan(sweep), tuner_image="registry.example/kubesweep-operator@sha256:" + "1" * 64)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert ("Job", "reps-tuner") in kinds and sum(1 for k, _ in kinds if k == "Job") == 1 + 1  # a warm pod + tuner
    off = parse_sweep({**sweep.to_document(), "spec": {**sweep.to_document()["spec"], "warm_pods": False}})
    jobs = [o for o in render_plan(plan(off), tuner_image="registry.example/kubesweep-operator@sha256:" + "1" * 64)
            if o["kind"] == "Job"]
    assert len(jobs) == 4 + 1  # a pod per trial: 2 cells x 2 first repeats, and the tuner

    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    spec = tmp_path / "reps.json"
    spec.write_text(json.dumps(doc(2, {"max": 3})))
    code = main(["--spec", str(spec), "--backend", "local", "--storage", str(tmp_path / "search"),
                 "--home", str(tmp_path / "home")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "repeats until the 95% interval of samples_per_s is within ±3% (2 to 3 per cell): 4 repeats over 2 " \
           "cells" in out
    assert json.loads((tmp_path / "search" / "repeats.json").read_text())["repeats"] == 4


def test_a_cancelled_sweep_gets_no_repeat_after_the_cancel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sweep cancel` while the rule's first extra repeat runs: it ends cancelled and the rule adds none after it,
    though the cell (20% apart) is far from its target."""
    import threading
    import time

    monkeypatch.setenv("KUBESWEEP_JOB_COMMAND", json.dumps([sys.executable, str(STAND_IN)]))
    monkeypatch.setenv("KUBESWEEP_LOCAL_GPUS", "[]")
    monkeypatch.delenv("KUBESWEEP_TUNE_STORAGE", raising=False)
    home = tmp_path / "home"
    sweep = parse_sweep({"apiVersion": "kubesweep.io/v1alpha1", "kind": "Sweep", "metadata": {"name": "reps"},
                         "spec": {"job": {"max_steps": 30, "learning_rate": 0.789},  # 3 s a repeat, 20% apart
                                  "resources": {"gpus_per_trial": 0, "retries": 0},
                                  "matrix": {"batch_size": [32]}, "repeats": 2, "repeat_until": {"max": 8}}})
    s = Session(Options(home=home, no_tracking=True, parallel=2))
    assert s.submit(sweep, plan(sweep)) is None
    ended: list[Any] = []
    runner = threading.Thread(target=lambda: ended.append(s.run_search(sweep)), daemon=True)
    runner.start()
    starts = home / "sweeps" / "reps" / "starts.log"
    deadline = time.monotonic() + 60
    while not (starts.exists() and len(starts.read_text().splitlines()) >= 3):  # the 2 first, then an extra one
        assert time.monotonic() < deadline, "no extra repeat started"
        time.sleep(0.1)
    cancelled, _ = Session(Options(home=home, no_tracking=True)).cancel("reps")
    assert cancelled
    runner.join(60)
    assert not runner.is_alive(), "the rule went on after the cancel"
    assert len(ended) == 1 and isinstance(ended[0].found, RepeatsSummary), "the rule's run ended without its summary"
    status = Session(Options(home=home, no_tracking=True)).backend.status("reps")
    assert len(status.trials) == 3, [t.name for t in status.trials]  # none added after the cancel
    assert status.trials[-1].outcome == Outcome.CANCELLED
    assert all(t.phase.terminal for t in status.trials)


def test_a_backend_that_keeps_no_results_needs_the_sweep_tracked(tmp_path: Path) -> None:
    """On Kubernetes each repeat's figure is read from MLflow: an untracked sweep (or one without its parent run)
    is refused before anything is submitted; a tracked one goes on to the cluster (here: none listening)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}]}))
    backend = KubernetesBackend(kubeconfig=kubeconfig)
    assert not backend.keeps_results
    sweep = parse_sweep(doc(2, {"max": 4}))
    for tracking in (None, TrackingEnv("http://mlflow.example", "e")):
        with pytest.raises(BackendError) as err:
            run_repeats(sweep, backend, storage=tmp_path, tracking=tracking)
        assert str(err.value) == ("sweep 'reps': repeat_until reads each repeat's samples_per_s from MLflow on the "
                                  "kubernetes backend, and this sweep is not tracked (turn tracking on, or drop "
                                  "repeat_until)")
    with pytest.raises(BackendError, match=r"cannot reach the Kubernetes API at https://127\.0\.0\.1:9"):
        run_repeats(sweep, backend, storage=tmp_path, tracking=TrackingEnv("http://mlflow.example", "e", "p1"))
