"""`residual_precision: half`: the residual stream between layers stored in autocast's 16-bit type (LayerNorm
still computing in fp32), fp32 again where autocast is off (exports), and a bf16 run that learns what the fp32
residual stream's run learns."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from kubesweep.jobs import runtime
from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import JobConfig
from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import run_job_in_process, tiny_args


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=2048, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def layer_output_types(model: BertForSequenceClassification, *, autocast: bool) -> list[torch.dtype]:
    """The types of what the embeddings and each layer hand on (the residual stream), and of the gradient that
    reaches the embeddings' output."""
    seen: list[torch.dtype] = []

    def embedded(module: torch.nn.Module, args: object, out: torch.Tensor) -> None:
        seen.append(out.dtype)
        out.register_hook(lambda grad: seen.append(grad.dtype))

    hooks = [model.bert.embeddings.register_forward_hook(embedded)]
    hooks += [layer.register_forward_hook(lambda m, a, out: seen.append(out[0].dtype if isinstance(out, tuple)
                                                                         else out.dtype))
              for layer in model.bert.encoder.layer]
    ids = torch.randint(1000, 2000, (4, 12))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(input_ids=ids, labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    for h in hooks:
        h.remove()
    return seen


def test_half_stores_the_residual_stream_in_autocasts_type_and_only_under_autocast() -> None:
    model = tiny_bert()
    assert layer_output_types(model, autocast=True) == [torch.float32] * 4  # autocast alone: fp32 norms
    cfg = JobConfig(precision="bf16", residual_precision="half")
    assert runtime.store_residual(model, cfg) == 5  # the embeddings' norm and two a layer
    assert layer_output_types(model, autocast=True) == [torch.bfloat16] * 4
    # no autocast (an export, an fp32 check): the model computes as it was written
    assert layer_output_types(model, autocast=False) == [torch.float32] * 4
    assert runtime.store_residual(tiny_bert(), JobConfig(precision="bf16")) == 0
    with pytest.raises(UsageError, match="no LayerNorm"):
        runtime.store_residual(torch.nn.Linear(2, 2), cfg)


def test_half_applies_to_16_bit_fine_tuning_with_kubesweeps_engine() -> None:
    for precision in ("fp32", "tf32"):
        with pytest.raises(ValueError, match=f"applies to bf16 and fp16.*precision {precision} keeps every"):
            JobConfig(precision=precision, residual_precision="half")
    for other in ({"task": "inference"}, {"engine": "hf-trainer"}):
        with pytest.raises(ValueError, match="residual_precision half applies to fine-tuning with kubesweep's"):
            JobConfig.model_validate({"precision": "bf16", "residual_precision": "half", **other})
    assert JobConfig(precision="fp16", residual_precision="half").residual_precision == "half"


def test_a_bf16_run_with_a_half_residual_stream_learns_what_the_fp32_one_learns(
        sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job in bf16 with each residual stream: losses within bf16's rounding of each other at every step, and
    the same evaluation."""
    def run(residual: str) -> Results:
        args = tiny_args(sst2, token_cache, "--max-steps", "8", "--log-every", "1", "--precision", "bf16",
                         "--residual-precision", residual)
        done = run_job_in_process(args, tmp_path / residual, monkeypatch)
        assert done.returncode == ExitCode.OK, done.stdout
        return Results.read(done.output_dir / "results.json")

    fp32, half = run("fp32"), run("half")
    losses = [p.loss for p in half.loss_curve]
    assert len(losses) == 8 and losses == pytest.approx([p.loss for p in fp32.loss_curve], rel=2e-2)
    assert losses != [p.loss for p in fp32.loss_curve]  # the stream did change type
    assert half.eval and fp32.eval and half.eval[-1].accuracy == pytest.approx(fp32.eval[-1].accuracy, abs=0.05)
