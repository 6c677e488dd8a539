"""Precision, attention kernels and torch.compile (whole model or one repeated layer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.jobs import runtime
from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import JobConfig
from kubesweep.wire.outcomes import ExitCode
from tests.support.job_fixtures import run_job, run_job_in_process, tiny_args


def test_compile_scope_layers_compiles_one_layer_for_all_layers_and_shapes() -> None:
    """compile_scope layers: the repeated layer compiles once (static), then once more with dynamic shapes, and
    that serves all layers and every later shape; outputs and state_dict keys stay the model's; under
    `runtime.eager()` nothing compiles."""
    import copy

    import torch
    from torch._dynamo.utils import counters
    from transformers import BertConfig, BertForSequenceClassification

    from kubesweep.jobs import runtime

    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64)
    ).eval()
    reference = copy.deepcopy(model)
    keys = list(model.state_dict())
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = runtime.compile_model(model, JobConfig(compile=True, compile_scope="layers"))
        assert compiled is model and list(model.state_dict()) == keys
        ids = torch.randint(0, 1000, (4, 40))
        mask = torch.ones_like(ids)
        for length in (8, 16, 24, 40):
            got = compiled(input_ids=ids[:, :length], attention_mask=mask[:, :length]).logits
            want = reference(input_ids=ids[:, :length], attention_mask=mask[:, :length]).logits
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert counters["stats"]["unique_graphs"] == 2
        with torch.no_grad(), runtime.eager():
            compiled(input_ids=ids[:, :32], attention_mask=mask[:, :32])
        assert counters["stats"]["unique_graphs"] == 2
    finally:
        torch._dynamo.reset()
    with pytest.raises(UsageError, match="no stack of repeated layers"):
        runtime.repeated_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))


def test_max_autotune_under_the_step_graph_leaves_inductors_own_cuda_graphs_off() -> None:
    """The step graph is the CUDA graph: max-autotune inside it autotunes without recording graphs of its own."""
    import torch

    def options(**job: object) -> dict[str, object] | None:
        mode = runtime.inductor_mode(JobConfig.model_validate(job))
        return None if mode is None else torch._inductor.list_mode_options(mode)

    assert options(compile=True) is None and options(compile=False) is None
    assert options(compile="max-autotune") == torch._inductor.list_mode_options("max-autotune")
    assert options(compile="max-autotune")["triton.cudagraphs"] is True  # type: ignore[index]
    under_graph = options(compile="max-autotune", step_graph=True)
    assert under_graph and under_graph["max_autotune"] is True and not under_graph.get("triton.cudagraphs")
    assert options(compile="reduce-overhead")["triton.cudagraphs"] is True  # type: ignore[index]


def test_attention_kernel_choice() -> None:
    import torch

    from kubesweep.jobs import runtime

    with runtime.attention_kernels(JobConfig(sdpa_backend="math")):
        assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.backends.cuda.flash_sdp_enabled()
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.flash_sdp_enabled()  # restored
    with pytest.raises(ValueError, match="HF Trainer compiles the whole model"):
        JobConfig(engine="hf-trainer", compile=True, compile_scope="layers")


def test_cuda_only_attention_kernels_on_cpu_are_a_usage_error(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = run_job_in_process(tiny_args(sst2, token_cache, "--sdpa-backend", "efficient"), tmp_path, monkeypatch)
    assert run.returncode == ExitCode.USAGE
    assert "sdpa_backend efficient needs a CUDA GPU" in run.stdout


@pytest.mark.slow
def test_a_second_trial_with_the_same_compile_cache_compiles_nothing(
    sst2: Path, token_cache: Path, tmp_path: Path
) -> None:
    """compile_scope layers with dynamic shapes, two job processes sharing one Inductor cache: the second finds
    every graph (AOTAutograd's and Inductor's) in the cache and says so. Fails when a graph is traced twice and
    its first attempt is compiled but never cached (floats left symbolic restart Dynamo's analysis). A trial with
    other attention kernels finds none of them."""
    args = tiny_args(sst2, token_cache, "--compile", "default", "--compile-scope", "layers", "--padding", "bucketed",
                     "--max-steps", "6", "--no-eval-every-epoch")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    first = run_job(args, tmp_path / "first", env=env)
    second = run_job(args, tmp_path / "second", env=env)
    assert first.returncode == 0 and second.returncode == 0
    cold, warm = first.results["compile_cache"], second.results["compile_cache"]
    assert cold["hit"] is False and cold["aot_autograd_misses"] >= 1
    assert warm["hit"] is True, warm
    assert warm["aot_autograd_hits"] == cold["aot_autograd_misses"] and warm["aot_autograd_misses"] == 0
    assert warm["fx_graph_misses"] == 0
    # another choice of attention kernels compiles its own graphs: the caches' keys leave that choice out, and a
    # graph traced under one choice calls its kernels
    # (its first step is enough: without a folder of its own, that step's graphs were found in the cache)
    other = run_job([*args, "--sdpa-backend", "math", "--max-steps", "1"], tmp_path / "math", env=env)
    assert other.returncode == 0
    assert other.results["compile_cache"]["hit"] is False and other.results["compile_cache"]["aot_autograd_hits"] == 0
    assert Path(other.results["compile_cache"]["dir"]) == tmp_path / "inductor" / "sdpa-math"
    assert Path(warm["dir"]) == tmp_path / "inductor" / "sdpa-auto"


@pytest.mark.parametrize(("files", "quota"), [
    ({"cpu.max": "800000 100000\n"}, 8.0), ({"cpu.max": "max 100000\n"}, None), ({"cpu.max": "150000 100000"}, 1.5),
    ({"cpu/cpu.cfs_quota_us": "400000", "cpu/cpu.cfs_period_us": "100000"}, 4.0),
    ({"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None), ({}, None),
])
def test_the_cpu_limit_is_read_from_the_cgroup(tmp_path: Path, files: dict[str, str], quota: float | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert runtime.cpu_quota(tmp_path) == quota


def test_threads_are_cut_to_the_cpu_limit_and_never_raised(tmp_path: Path) -> None:
    """A pod limited to 1.5 CPUs on a node of many cores: PyTorch's pool shrinks to 1 thread (more threads than
    the quota get the whole process throttled, the kernel-launching thread too). No limit: unchanged."""
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(4)
        (tmp_path / "cpu.max").write_text("150000 100000\n")
        assert runtime.limit_threads(tmp_path) == 1 == torch.get_num_threads()
        (tmp_path / "cpu.max").write_text("max 100000\n")
        assert runtime.limit_threads(tmp_path) == 1  # no limit: left as it is
    finally:
        torch.set_num_threads(before)
