"""Trial records, the input of `sweep results` and the report: from a backend's status and results files (a real
local sweep run with the stand-in job), and from MLflow child runs (`runs.ChildRun` values as `SweepRuns` returns
them; the round trip through a real MLflow server is tests/tracking/test_sweep.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from kubesweep.backends.base import Phase, TrialStatus
from kubesweep.backends.local import LocalBackend
from kubesweep.tracking.records import (
    MAX_TRIAL_FILE_BYTES,
    ResultsDirError,
    ResultsFileError,
    _parse_param,
    axes_job,
    from_backend,
    from_mlflow,
    from_results_dir,
    job_of,
    names_a_directory,
    read_results_file,
    record_from_child,
    record_from_status,
)
from kubesweep.tracking.runs import ChildRun
from kubesweep.wire.config import JobConfig, TrialConfig
from kubesweep.wire.outcomes import Outcome
from kubesweep.wire.results import Results
from tests.backends.contract import CRASH_LR, make_plan
from tests.support.results_docs import make_results
from tests.support.tracked_job import build as stand_in

STAND_IN = Path(__file__).parents[1] / "support" / "stand_in_job.py"


# -- from a backend's status ---------------------------------------------------------------------------------


def status(outcome: Outcome | None, phase: Phase = Phase.SUCCEEDED, reason: str = "", **axes: Any) -> TrialStatus:
    return TrialStatus("tid", "t-1", "cell", "l4", phase, outcome, reason, axes=axes)


def test_the_job_comes_from_the_results_file_then_the_trial_file_then_the_axes(tmp_path: Path) -> None:
    trial_file = tmp_path / "trial.json"
    trial_file.write_text(json.dumps({"job": {"batch_size": 16, "precision": "fp16"}, "gpus_per_trial": 2}))
    s = status(Outcome.SUCCEEDED, batch_size=8, gpu="l4", gpus_per_trial=1, num_nodes=1)
    results = make_results(config={"batch_size": 32}, trial={"repeat": 1, "gpus_per_trial": 4})

    record = record_from_status(s, results, trial_file)
    assert (record.settings, record.gpus, record.repeat) == ({"batch_size": 32}, 4, 1)
    record = record_from_status(s, None, trial_file)
    assert record.settings == {"batch_size": 16, "precision": "fp16"}
    assert record.gpus == 1  # the axes name it before the trial file
    record = record_from_status(status(Outcome.SUCCEEDED), None, trial_file)
    assert record.gpus == 2
    record = record_from_status(s, None, tmp_path / "missing.json")
    assert record.settings == {"batch_size": 8}  # the axes, less the ones that are not job settings
    for damaged in ("{not json", '{"job": ' + "[" * 200_000, " " * (2**20 + 1)):  # a trial may write its own
        trial_file.write_text(damaged)
        assert record_from_status(status(Outcome.SUCCEEDED, batch_size=8), None, trial_file).settings == {
            "batch_size": 8}
        assert record_from_status(status(Outcome.SUCCEEDED), None, trial_file).gpus == 1


def test_settings_read_back_are_typed_and_a_setting_this_version_cannot_read_is_left_out() -> None:
    job = job_of({"batch_size": 64, "precision": "bf16", "no_such_setting": 1, "epochs": "many"})
    assert (job.batch_size, job.precision, job.epochs) == (64, "bf16", 3.0)  # epochs unreadable: the default
    assert set(job.model_fields_set) == {"batch_size", "precision"}
    # settings each valid but refused together by this version (fine-tuning step graphs in fp16) are kept as logged
    kept = job_of({"step_graph": True, "precision": "fp16", "task": "finetune"})
    assert (kept.step_graph, kept.precision) == (True, "fp16")
    assert axes_job({"gpu": "l4", "num_nodes": 2, "batch_size": 8}, {"precision": "fp16"}).model_fields_set == {
        "batch_size", "precision"}


def test_the_outcome_is_the_results_files_unless_the_backend_stopped_or_cancelled_the_trial() -> None:
    oom = make_results(outcome="oom", error={"message": "CUDA out of memory. Tried to allocate 2.00 GiB"})
    record = record_from_status(status(Outcome.FAILED, Phase.FAILED, reason="exit code 3"), oom)
    assert record.outcome == "oom" and record.reason == "CUDA out of memory. Tried to allocate 2.00 GiB"

    terminated = make_results(outcome="failed", error={"message": "terminated (SIGTERM)"})
    for outcome, phase in ((Outcome.STOPPED, Phase.STOPPED), (Outcome.CANCELLED, Phase.CANCELLED)):
        record = record_from_status(status(outcome, phase, reason="stopped early by the search scheduler"),
                                    terminated)
        assert record.outcome == outcome.value

    record = record_from_status(status(Outcome.FAILED, Phase.FAILED, reason="exit code 1"))
    assert (record.outcome, record.reason) == ("failed", "exit code 1")
    record = record_from_status(status(None, Phase.RUNNING, reason="pulling image"))
    assert (record.outcome, record.reason) == ("running", "pulling image")
    assert record_from_status(status(Outcome.SUCCEEDED, reason="done")).reason == ""


def test_records_of_a_local_sweep_read_its_results_and_trial_files(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=4, devices=[])
    p = make_plan("recs", {"batch_size": [8, 256], "learning_rate": [1e-4, CRASH_LR]})
    backend.submit(p)
    backend.wait("recs", timeout=60)
    records = from_backend(backend, "recs")
    assert [r.trial_id for r in records] == [t.id for t in p.trials]
    by_cell = {(r.job.batch_size, r.job.learning_rate): r for r in records}
    assert by_cell[8, 1e-4].outcome == "succeeded" and by_cell[8, 1e-4].results is not None
    assert by_cell[256, 1e-4].outcome == "oom"
    crashed = by_cell[8, CRASH_LR]  # no results file: the job from trial.json, the outcome from the backend
    assert crashed.results is None and crashed.outcome == "failed" and crashed.reason
    assert crashed.job.max_steps == 2
    assert {r.gpus for r in records} == {0}  # CPU trials, as trial.json says


# -- from MLflow child runs ----------------------------------------------------------------------------------


def child(run_id: str, status: str = "FINISHED", tags: dict[str, str] | None = None,
          params: dict[str, str] | None = None) -> ChildRun:
    return ChildRun(run_id, f"run-{run_id}", status, tags or {}, params or {}, {}, None, None)


def test_a_child_run_without_results_gives_its_cell_from_params_and_tags() -> None:
    run = child("r1", tags={"kubesweep.trial_id": "t1", "kubesweep.trial": "s-t1", "kubesweep.gpu": "h100-80gb",
                            "kubesweep.repeat": "2"},
                params={"trial_id": "t1", "sweep": "s", "gpus_per_trial": "2", "batch_size": "64",
                        "precision": "bf16", "compile": "False", "tokenizer": "None", "learning_rate": "2e-05",
                        "model": "bert-base-uncased"})
    record = record_from_child(run, None)
    assert (record.trial_id, record.name, record.gpu, record.gpus, record.repeat, record.run_id) == (
        "t1", "s-t1", "h100-80gb", 2, 2, "r1")
    assert record.settings == {"batch_size": 64, "precision": "bf16", "compile": False, "tokenizer": None,
                               "learning_rate": 2e-05, "model": "bert-base-uncased"}
    assert record.job.batch_size == 64 and record.job.epochs == 3.0  # typed: what it did not name is the default
    assert record.outcome == "succeeded" and record.results is None


@pytest.mark.parametrize(("status", "outcome"), [("RUNNING", "running"), ("SCHEDULED", "pending"),
                                                 ("FINISHED", "succeeded"), ("KILLED", "cancelled"),
                                                 ("FAILED", "failed")])
def test_a_child_runs_outcome_without_results_or_tag_follows_the_run_status(status: str, outcome: str) -> None:
    assert record_from_child(child("r", status), None).outcome == outcome


def test_a_child_runs_results_file_wins_over_its_tags_and_params() -> None:
    run = child("r2", "FINISHED", tags={"kubesweep.outcome": "succeeded", "kubesweep.gpu": "any"},
                params={"batch_size": "16", "gpus_per_trial": "1"})
    results = make_results(outcome="gpu_mismatch", config={"batch_size": 32},
                           trial={"gpu": "l40s", "gpus_per_trial": 4, "repeat": 1},
                           error={"message": "asked for NVIDIA-L40S, found NVIDIA-L4"})
    record = record_from_child(run, results)
    assert (record.outcome, record.settings, record.gpu, record.gpus, record.repeat) == (
        "gpu_mismatch", {"batch_size": 32}, "l40s", 4, 1)
    assert record.reason == "asked for NVIDIA-L40S, found NVIDIA-L4"
    assert record.trial_id == "r2"  # no trial id tag or param: the run id
    assert record_from_child(run, None).outcome == "succeeded"  # the tag, without results
    assert record_from_child(run, None).gpu is None  # "any" GPU


class Runs:
    """What `from_mlflow` reads of a `SweepRuns`: the parent's child runs and their results files."""

    def __init__(self, children: list[ChildRun], files: dict[str, Results | ResultsFileError | None]):
        self._children, self.files = children, files

    def children(self, parent_run_id: str) -> list[ChildRun]:
        assert parent_run_id == "parent"
        return self._children

    def all_results(self, children: list[ChildRun]) -> dict[str, Results | ResultsFileError | None]:
        return {c.run_id: self.files.get(c.run_id) for c in children}


def test_from_mlflow_adds_the_trials_without_a_run_from_the_backend_in_plan_order(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path, job_command=[sys.executable, str(STAND_IN)], cpu_slots=4, devices=[])
    p = make_plan("ml", {"batch_size": [8, 16, 32]})
    backend.submit(p)
    backend.wait("ml", timeout=60)
    last = p.trials[2]
    runs = Runs([child("r-last", tags={"kubesweep.trial_id": last.id, "kubesweep.trial": last.name})],
                {"r-last": make_results(config={"batch_size": 32})})
    records = from_mlflow(runs, "parent", backend, "ml")
    assert [r.trial_id for r in records] == [t.id for t in p.trials]
    assert records[2].run_id == "r-last" and records[0].run_id is None and records[0].outcome == "succeeded"
    assert records[2].results is not None and records[0].results is None  # the run's results file, read
    # a run of a trial the backend does not know (another sweep's, a stray): after the backend's, by name
    stray = child("r-stray", tags={"kubesweep.trial_id": "zz", "kubesweep.trial": "ml-stray"})
    both = Runs([stray, child("r-last", tags={"kubesweep.trial_id": last.id, "kubesweep.trial": last.name})], {})
    assert [r.trial_id for r in from_mlflow(both, "parent", backend, "ml")] == [*(t.id for t in p.trials), "zz"]

    # an unknown sweep on the backend (a BackendError): the runs alone, by name
    two = Runs([child("b", tags={"kubesweep.trial": "s-b"}), child("a", tags={"kubesweep.trial": "s-a"})], {})
    assert [r.name for r in from_mlflow(two, "parent", backend, "nope")] == ["s-a", "s-b"]
    assert [r.name for r in from_mlflow(two, "parent", None, "nope")] == ["s-a", "s-b"]


# -- a directory of results files (a sweep run on another machine) -------------------------------------------------


def _results(trial_id: str, product: str, rate: float = 1000.0) -> dict[str, Any]:
    """A whole results file as the job writes it (the stand-in's), of a trial that took any GPU."""
    trial = TrialConfig(sweep="s", trial_id=trial_id, name=f"s-{trial_id}", repeat=1, gpu="h100-80gb",
                        job=JobConfig(batch_size=64))
    results, _ = stand_in(trial, "2026-11-26T00:00:00+00:00")
    results["trial"]["gpu"] = None
    results["environment"] = {"gpus": [{"product": product}]}
    results["train"]["samples_per_s"] = rate
    return results


def _results_file(path: Path, trial_id: str, product: str, rate: float = 1000.0) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "results.json").write_text(json.dumps(_results(trial_id, product, rate)))


def test_records_from_a_directory_of_results_files(tmp_path: Path) -> None:
    _results_file(tmp_path / "sweeps" / "s" / "trials" / "b", "b", "NVIDIA-H200")
    _results_file(tmp_path / "sweeps" / "s" / "trials" / "a", "a", "NVIDIA-H200")
    (tmp_path / "sweeps" / "s" / "trials" / "a" / "trial.json").write_text("{}")  # other files: not read
    records = from_results_dir(tmp_path)
    assert [(r.trial_id, r.repeat, r.gpu, r.gpus, r.outcome, r.job.batch_size) for r in records] == [
        ("a", 1, None, 1, "succeeded", 64), ("b", 1, None, 1, "succeeded", 64)]
    assert records[0].job == JobConfig(batch_size=64)
    [a] = from_results_dir(tmp_path / "sweeps" / "s" / "trials" / "a")
    assert a.results is not None and a.results.train is not None and a.results.train.samples_per_s == 1000.0


def test_a_directory_does_not_reach_out_through_links_and_names_the_file_it_cannot_read(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    _results_file(outside, "secret", "NVIDIA-H100-80GB-HBM3")
    mine = tmp_path / "mine"
    _results_file(mine / "t1", "t1", "NVIDIA-H200")
    (mine / "t2").mkdir()
    (mine / "t2" / "results.json").symlink_to(outside / "results.json")  # a file link out of the directory
    (mine / "t3").symlink_to(outside, target_is_directory=True)  # a directory link out of it
    assert [r.trial_id for r in from_results_dir(mine)] == ["t1"]

    (mine / "t4").mkdir()
    (mine / "t4" / "results.json").write_text("{not json")
    with pytest.raises(ResultsFileError, match=r"t4/results.json: not JSON: key must be a string"):
        from_results_dir(mine)
    (mine / "t4" / "results.json").write_text('{"outcome": "succeeded"}')
    with pytest.raises(ResultsFileError, match=r"t4/results.json: exit_code: required, missing"):
        from_results_dir(mine)


def _damaged(edit: Any) -> str:
    return edit(_results("t", "NVIDIA-H200")) if callable(edit) else str(edit)


def _set(path: tuple[str | int, ...], value: Any) -> Any:
    def edit(results: dict[str, Any]) -> str:
        where: Any = results
        for key in path[:-1]:
            where = where[key]
        where[path[-1]] = value
        return json.dumps(results)
    return edit


@pytest.mark.parametrize(("body", "line"), [
    ("[1, 2]", "expected a JSON object (a results file), got list"),
    ('"results"', "expected a JSON object (a results file), got str"),
    ('{"outcome": ', "not JSON: EOF while parsing a value at line 1 column 12"),
    ("[" * 5000 + "]" * 5000, "not JSON: recursion limit exceeded"),
    (_set(("environment", "deep"), json.loads("[" * 300 + "]" * 300)), "not JSON: recursion limit exceeded"),
    (_set(("config", "batch_size"), "abc"), "config.batch_size: expected an integer, got 'abc'"),
    (_set(("config", "batch_size"), [32]), "config.batch_size: expected an integer, got [32]"),
    (_set(("config", "batch_size"), "32"), "config.batch_size: expected an integer, got '32'"),
    (_set(("trial", "gpu"), 7), "trial.gpu: expected a string, got 7"),
    (_set(("train", "samples_per_s"), 1e308), "train.samples_per_s: expected a number within ±1e+15, got 1e+308"),
    (_set(("eval", 0, "accuracy"), -1e300), "eval[0].accuracy: expected a number within ±1e+15, got -1e+300"),
    (_set(("train", "measured_flops"), 1e25), "train.measured_flops: expected a number within ±1e+24, got 1e+25"),
    (_set(("train", "surprise"), 1), "train.surprise: not a field of kubesweep.io/results/v1"),
    (_set(("outcome",), "exploded"), "outcome: not one of the outcomes, got 'exploded'"),
    (_set(("schema",), "kubesweep.io/results/v9"), "schema: 'kubesweep.io/results/v9' is not kubesweep.io/results/v1"),
    (_set(("environment", "gpus"), {"0": {"product": "x"}}), "environment.gpus: expected a list"),
    (_set(("environment", "gpus"), [{"uuid": 7}]), "environment.gpus[0].uuid: expected a string, got 7"),
    (_set(("environment", "boot_id"), ["b"]), "environment.boot_id: expected a string, got ['b']"),
])
def test_a_damaged_results_file_is_one_line_naming_the_file_and_the_field(tmp_path: Path, body: Any,
                                                                          line: str) -> None:
    path = tmp_path / "t" / "results.json"
    path.parent.mkdir()
    path.write_text(_damaged(body))
    with pytest.raises(ResultsFileError) as info:
        read_results_file(path)
    assert str(info.value).startswith(f"{path}: {line}"), str(info.value)
    assert "\n" not in str(info.value)


def test_a_directory_skips_each_damaged_file_in_one_line_and_reads_the_rest(tmp_path: Path) -> None:
    _results_file(tmp_path / "a", "a", "NVIDIA-H200")
    _results_file(tmp_path / "c", "c", "NVIDIA-H200")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(_damaged(_set(("config", "batch_size"), "abc")))
    said: list[str] = []
    assert [r.trial_id for r in from_results_dir(tmp_path, skipped=said.append)] == ["a", "c"]
    assert said == [f"skipped {tmp_path / 'b' / 'results.json'}: config.batch_size: expected an integer, got 'abc' "
                    "(kubesweep.io/results/v1, docs/results-schema.md)"]
    for name in ("a", "c"):
        (tmp_path / name / "results.json").write_text("[]")
    with pytest.raises(ResultsDirError, match="none of its 3 results files is valid"):
        from_results_dir(tmp_path, skipped=said.append)


def test_an_infinite_or_nan_number_is_read_as_null(tmp_path: Path) -> None:
    results = _results("t", "NVIDIA-H200")
    results["train"]["final_loss"] = float("nan")  # a diverged run's loss, as the job writes it
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    train = read_results_file(path).train
    assert train is not None and train.final_loss is None


def test_a_long_runs_flop_count_is_read_whole(tmp_path: Path) -> None:
    """Model FLOPs pass 1e15 within an epoch (100 steps of bert-base at batch 1,024 counted 1.0e15): a count is held
    to the FLOP bound, not to that of the other measurements."""
    results = _results("t", "NVIDIA-H200")
    results["train"].update({"measured_flops": 2.2e15, "flops_per_step": 3.0e15})  # 3 epochs of SST-2, bert-base
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    train = read_results_file(path).train
    assert train is not None and train.measured_flops == 2.2e15 and train.flops_per_step == 3.0e15


def test_a_name_with_a_slash_or_a_leading_dot_or_tilde_is_a_directory_and_a_sweeps_name_is_not() -> None:
    for name in ("./runs", "../runs", "~/runs", ".runs", "runs/", "a/b", "~"):
        assert names_a_directory(name), name
    for name in ("my-sweep", "sweep.v2", "a~b", "x"):
        assert not names_a_directory(name), name


def test_a_results_files_record_names_its_trial_and_gpu_or_takes_the_directorys_name(tmp_path: Path) -> None:
    named = _results("a", "NVIDIA-H200")
    named["trial"].update({"name": "s-a-h200", "gpu": "h200"})
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(named))
    bare = _results("b", "NVIDIA-H200")
    bare["trial"].update({"trial_id": "", "name": "", "gpu": ""})
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps(bare))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "results.json").symlink_to(tmp_path / "a" / "results.json")  # a link within: not read twice
    assert [(r.trial_id, r.name, r.gpu) for r in from_results_dir(tmp_path)] == [("a", "s-a-h200", "h200"),
                                                                                 ("b", "b", None)]


def test_a_directory_that_is_not_there_is_named_with_how_the_name_was_read(tmp_path: Path) -> None:
    with pytest.raises(ResultsDirError) as err:
        from_results_dir(tmp_path / "nowhere")
    assert str(err.value) == (f"{tmp_path / 'nowhere'}: no such directory (a name with a '/' is read as a directory "
                              "of results files)")


# -- what each source says, field by field (from the survivors of `make mutation`) --------------------------------


def test_a_param_reads_back_as_json_or_as_pythons_words_for_true_false_and_none() -> None:
    assert [_parse_param(v) for v in ("True", "False", "None", "true", "2e-05", "64", "bert", "[1]")] == [
        True, False, None, True, 2e-05, 64, "bert", [1]]


def test_a_child_run_says_its_id_repeat_gpus_and_outcome_from_its_params_where_it_has_no_tags() -> None:
    run = child("r3", "FINISHED", params={"trial_id": "t9", "repeat": "3", "gpus_per_trial": "two"})
    record = record_from_child(run, None)
    assert (record.trial_id, record.repeat, record.gpus, record.outcome, record.reason) == ("t9", 3, 1, "succeeded",
                                                                                            "")
    assert record_from_child(child("r4", "FINISHED"), None).repeat == 0  # no repeat anywhere: the first
    # the outcome tag the job wrote wins over the run's status
    assert record_from_child(child("r5", "FINISHED", tags={"kubesweep.outcome": "oom"}), None).outcome == "oom"


def test_a_child_runs_results_are_kept_and_an_invalid_file_fails_the_trial_naming_the_error() -> None:
    results = make_results(outcome="succeeded", error={"message": "a warning the job kept"})
    record = record_from_child(child("r6"), results)
    assert record.results is results and (record.outcome, record.reason) == ("succeeded", "")
    bad = ResultsFileError("run r7's results.json: not JSON: expected value")
    record = record_from_child(child("r7", "FINISHED", tags={"kubesweep.outcome": "succeeded"}), bad)
    assert (record.outcome, record.reason, record.results) == ("failed", "run r7's results.json: not JSON: "
                                                                         "expected value", None)


def test_a_status_record_names_the_trial_its_gpu_its_outcome_and_the_first_repeat() -> None:
    record = record_from_status(status(Outcome.OOM, Phase.FAILED, reason="the backend's words"))
    assert (record.name, record.gpu, record.repeat, record.outcome, record.reason) == (
        "t-1", "l4", 0, "oom", "the backend's words")
    ok = record_from_status(status(Outcome.SUCCEEDED), make_results(outcome="succeeded", error={"message": "m"}))
    assert (ok.outcome, ok.reason) == ("succeeded", "")


def test_a_trial_file_at_the_size_limit_is_read_and_one_byte_over_is_not(tmp_path: Path) -> None:
    trial_file = tmp_path / "trial.json"
    body = json.dumps({"job": {"batch_size": 16}}).encode()
    for size, settings in ((MAX_TRIAL_FILE_BYTES, {"batch_size": 16}), (MAX_TRIAL_FILE_BYTES + 1, {"batch_size": 8})):
        trial_file.write_bytes(body + b" " * (size - len(body)))  # valid JSON either way
        assert record_from_status(status(Outcome.SUCCEEDED, batch_size=8), None, trial_file).settings == settings


def test_a_results_files_record_gives_the_jobs_error_as_its_reason_or_none(tmp_path: Path) -> None:
    failed = _results("f", "NVIDIA-H200")
    failed.update({"outcome": "oom", "exit_code": 1, "error": {"type": "OutOfMemoryError", "message": "CUDA out of "
                                                                "memory"}})
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "results.json").write_text(json.dumps(failed))
    _results_file(tmp_path / "g", "g", "NVIDIA-H200")
    assert [(r.trial_id, r.outcome, r.reason) for r in from_results_dir(tmp_path)] == [
        ("f", "oom", "CUDA out of memory"), ("g", "succeeded", "")]
