"""The metric catalogue (kubesweep/wire/metrics.py): one definition per metric, and what follows from it; how one
trial's time to accuracy and warm-up are read from its typed results.

The rule a new metric keeps: its name, unit, direction, how repeats meet and how it is shown live in its catalogue
entry alone. `test_no_module_but_the_catalogue_defines_a_metric` holds it: no other module of the package holds a
list or map of metric names that lies outside the catalogue's derived lists, nor spells a metric's column label.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kubesweep.tracking import report_tables
from kubesweep.tracking.columns import cell_columns, trial_columns, trial_fit_order
from kubesweep.tune.metrics import source
from kubesweep.wire import metrics as wm
from kubesweep.wire import trial_metrics as tm
from tests.support.results_docs import GIB, make_results, trial_parts

PACKAGE = Path(wm.__file__).resolve().parents[1]
results = trial_parts
# Modules that choose which of the catalogue's metrics one view shows, in its own order (a view's choice, not a
# definition): the report's comparison tables, the answer's objectives and the MLflow runs view's first columns.
# Each names metrics by name only; labels, units and directions come from the catalogue. (The per-trial table's
# metrics are the catalogue's own: `Metric.per_trial`.)
VIEW_CHOICES = {"kubesweep/tracking/report_tables.py", "kubesweep/tracking/report_answer.py",
                "kubesweep/tracking/view.py"}
# The job writes results.json's fields (which share names with metrics: the measured numbers they are read from)
JOB = "kubesweep/jobs/"


def test_the_catalogue_names_each_metric_once_and_everything_else_follows_from_it() -> None:
    names = [m.name for m in wm.CATALOGUE]
    assert len(names) == len(set(names)) and list(wm.METRICS) == names
    assert len({m.label for m in wm.CATALOGUE}) == len(names)  # no two columns of one header
    assert set(wm.TABLE_METRICS) | set(wm.FIT_ORDER) | set(wm.LOGGED_METRICS) <= set(names)
    assert wm.REPEAT_METRICS == ("samples_per_s", "step_p50_ms", "peak_mem_gib", "tta_s", "cost_per_epoch",
                                 "epoch_s", "latency_p99_ms", "j_per_sample")
    assert {"accuracy", "tta_s", "tta_train_s"} == wm.ACCURACY_METRICS
    assert set(wm.TUNE_METRICS) == set(wm.TUNE_SOURCES) | set(wm.LOGGED_METRICS)  # the job's keys, then the logged
    assert source("samples_per_s") is wm.TUNE_SOURCES["samples_per_s"]
    assert all(m.priority is None or m.column for m in wm.CATALOGUE)  # the fitting orders the table's own figures


def test_the_jobs_summary_keys_carry_fields_of_the_results_schema() -> None:
    """Every key the job logs at its end names a field results.json has (a path that names none reads None), and a
    tune metric's results path is its final key's."""
    training = trial_parts(train_s=120.0)
    training["train"] |= {"tokens_per_s": 9000.0, "tflops_per_s": 3.5, "step_time_s": {"p50": 0.05, "p99": 0.08}}
    training["timings"]["compile_warmup_s"] = 10.0
    inference = {"outcome": "succeeded", "inference": {"samples_per_s": 80.0, "tflops_per_s": 1.0,
                                                        "latency_s": {"p50": 0.1, "p99": 0.2}}}
    for keys, parts in ((wm.TRAINING_KEYS, training), (wm.INFERENCE_KEYS, inference)):
        doc = make_results(**parts).model_dump(mode="json", by_alias=True)
        read = wm.job_summary(keys, doc)
        assert None not in read.values(), read
    assert wm.job_summary({"result/x": ("train", "no_such_field")}, doc) == {"result/x": None}
    for src in wm.TUNE_SOURCES.values():
        if src.results:
            assert {**wm.TRAINING_KEYS, **wm.INFERENCE_KEYS}[str(src.final)] == src.results


def test_the_results_table_columns_come_from_the_catalogue_in_its_order() -> None:
    headers = [c.header for c in cell_columns([]) if c.kind == "metric"]
    assert headers == [wm.METRICS[m].label for m in wm.TABLE_METRICS]
    assert [c.header for c in cell_columns([]) if c.kind == "setting"] == ["task", "gpu", "batch", "precision",
                                                                            "compile"]
    assert set(report_tables.GPU_TABLE_METRICS) | set(report_tables.INFERENCE_METRICS) <= set(wm.METRICS)


def test_the_per_trial_columns_are_the_catalogues_per_trial_metrics_in_its_order() -> None:
    cols = trial_columns()
    assert [c.key for c in cols if c.kind == "metric"] == [m.name for m in wm.CATALOGUE if m.per_trial]
    assert all(c.header == wm.METRICS[c.key].label for c in cols if c.kind == "metric")
    order = [cols[i].key for i in trial_fit_order(cols)]
    headline = [m.name for m in wm.CATALOGUE if m.per_trial == "headline"]
    assert order[:2 + len(headline)] == ["trial", "outcome", *headline]  # then the settings, then the rest


def test_the_answer_states_a_value_in_its_unit() -> None:
    assert wm.METRICS["samples_per_s"].say("5,120") == "5,120 samples/s"
    assert wm.METRICS["cost_per_epoch"].say("0.0123") == "$0.0123 per epoch"
    assert wm.METRICS["kwh_per_epoch"].say("0.10") == "0.10 kWh per epoch"
    assert wm.METRICS["tta_train_s"].say("61.0") == "61.0 s"


def test_peak_memory_is_one_definition_a_cpu_trial_reads_its_peak_rss() -> None:
    """The catalogue's peak memory: the allocator's peak on a GPU, the process's peak RSS on a CPU."""
    cpu = trial_parts(device="cpu")
    cpu["memory"] = {"host_peak_rss_bytes": 3 * GIB}
    values = tm.trial_metrics(make_results(**cpu), "succeeded", gpus=0, price_per_hour=None, target=0.9,
                              peak_tflops=None)
    assert values["peak_mem_gib"] == 3.0


def _names_outside_the_catalogue(path: Path) -> list[str]:
    """What a module defines of metrics that belongs to the catalogue: a literal list, tuple, set or map with two or
    more metric names, or a string that is a metric's column label (where it is not the metric's name too)."""
    names = set(wm.METRICS)
    labels = {m.label for m in wm.CATALOGUE if m.label != m.name} | set(wm.SETTING_LABELS.values())
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        elements = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                    else node.keys if isinstance(node, ast.Dict) else [])
        listed = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in names]
        if len(listed) >= 2:
            found.append(f"line {getattr(node, 'lineno', 0)}: the metrics {listed}")
        if isinstance(node, ast.Constant) and node.value in labels:
            found.append(f"line {getattr(node, 'lineno', 0)}: the label {node.value!r}")
    return found


def test_no_module_but_the_catalogue_defines_a_metric() -> None:
    """Adding a metric read from results.json's numbers touches kubesweep/wire/metrics.py alone (one measured
    anew adds the job's measurement and its results field): no other module lists metrics or spells their labels
    (a view's choice of which metrics it shows, `VIEW_CHOICES`, names them, and nothing else of them)."""
    offending = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel == "kubesweep/wire/metrics.py" or rel.startswith(JOB):
            continue
        found = _names_outside_the_catalogue(path)
        if rel in VIEW_CHOICES:
            found = [f for f in found if "the label" in f]
        if found:
            offending[rel] = found
    assert offending == {}


def test_the_scan_finds_a_list_of_metrics_and_a_label(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('FIGURES = ("accuracy", "tta_s")\nHEAD = "peak GiB"\nOK = ("accuracy", "gpu")\n')
    assert _names_outside_the_catalogue(module) == ["line 1: the metrics ['accuracy', 'tta_s']",
                                                    "line 2: the label 'peak GiB'"]


# -- how a trial's values are read ------------------------------------------------------------------------------


def test_time_to_accuracy_charges_warm_up_to_the_first_steps_and_spreads_the_rest_evenly() -> None:
    r = results(train_s=110.0)  # 100 steps, the first 3 took 10 s: 100 s for the other 97
    r["eval"] = [{"step": 50, "accuracy": 0.85}, {"step": 70, "accuracy": 0.905}, {"step": 100, "accuracy": 0.93}]
    assert wm.time_to_accuracy(make_results(**r), 0.90) == pytest.approx(10.0 + (70 - 3) * 100.0 / 97)
    assert wm.time_to_accuracy(make_results(**r), 0.92) == 110.0  # an evaluation at the last step: exactly train_s
    assert wm.time_to_accuracy(make_results(**r), 0.95) is None  # never reached
    r["eval"] = [{"step": 2, "accuracy": 0.95}]
    assert wm.time_to_accuracy(make_results(**r), 0.90) == pytest.approx(10.0 * 2 / 3)  # within the warm-up
    r["timings"] = {}
    r["eval"] = [{"step": 50, "accuracy": 0.95}]
    assert wm.time_to_accuracy(make_results(**r), 0.90) is None  # no training time to interpolate


def test_training_time_to_accuracy_counts_every_step_at_the_steady_step_time_and_no_warm_up() -> None:
    """Two repeats of one setting: the first compiled (a 40 s warm-up), the second read the compile cache (4 s).
    Their TTA differs by the compilation; their training time to the target does not."""
    steps = results()["train"]  # 100 steps, the first 3 the warm-up: 40 s cold, 4 s warm; 100 s for the other 97
    cold = results(train_s=140.0, train={**steps, "warmup_time_s": 40.0})
    warm = results(train_s=104.0, train={**steps, "warmup_time_s": 4.0})
    for r in (cold, warm):
        r["eval"] = [{"step": 50, "accuracy": 0.85}, {"step": 70, "accuracy": 0.905}]
        r["config"] = {"compile": True}
        r["timings"]["compile_warmup_s"] = r["train"]["warmup_time_s"]
    cold["compile_cache"] = {"fx_graph_hits": 0, "fx_graph_misses": 12, "aot_autograd_hits": 0,
                             "aot_autograd_misses": 3, "hit": False}
    warm["compile_cache"] = {"fx_graph_hits": 12, "fx_graph_misses": 0, "aot_autograd_hits": 3,
                             "aot_autograd_misses": 0, "hit": True}
    a, b = make_results(**cold), make_results(**warm)
    assert wm.time_to_accuracy(a, 0.90) - wm.time_to_accuracy(b, 0.90) == pytest.approx(36.0)  # type: ignore[operator]
    assert wm.train_time_to_accuracy(a, 0.90) == wm.train_time_to_accuracy(b, 0.90) == pytest.approx(70 * 100 / 97)
    assert wm.train_time_to_accuracy(a, 0.95) is None  # never reached
    assert wm.warmup_by_cache(a) == (40.0, None) and wm.warmup_by_cache(b) == (None, 4.0)
    eager = make_results(**results())
    assert wm.warmup_by_cache(eager) == (None, None)  # no compile: its warm-up is only warmup_s
    metrics = tm.trial_metrics(a, "succeeded", gpus=1, price_per_hour=None, target=0.90, peak_tflops=None)
    assert metrics["tta_train_s"] == pytest.approx(70 * 100 / 97) and metrics["warmup_cold_s"] == 40.0

@pytest.mark.parametrize(("value", "text"), [(None, "-"), (0, "0"), (12345.6, "12,346"), (123.45, "123.5"),
                                             (1.234, "1.23"), (0.01234, "0.0123"), (0.0001234, "0.000123"),
                                             (-2.5, "-2.50")])
def test_fmt_number(value: float | None, text: str) -> None:
    assert wm.fmt_number(value) == text


