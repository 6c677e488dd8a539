"""The job's settings: JobConfig's rules for combinations it refuses."""

from __future__ import annotations

import pytest

from kubesweep.jobs.config import JobConfig


def test_overrides_need_random_init() -> None:
    with pytest.raises(ValueError, match="random_init"):
        JobConfig(model_overrides={"num_hidden_layers": 2})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"precision": "fp16"}, "step_graph does not support fp16"),
        ({"grad_accum": 2}, "grad_accum > 1"),
        ({"compile": "reduce-overhead"}, "use compile: default"),
        ({"task": "inference"}, "fine-tuning loop only"),
    ],
)
def test_step_graph_rules(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        JobConfig(step_graph=True, **settings)  # type: ignore[arg-type]
    JobConfig(step_graph=True, precision="bf16", compile="default")
