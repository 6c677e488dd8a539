"""The inference benchmark: its figures from `inference.run` on a tiny model, and as the job's task."""

from __future__ import annotations

from pathlib import Path

import pytest

from kubesweep.jobs.errors import UsageError
from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import MINILM, run_job_in_process, tiny_args


def test_run_times_the_asked_batches(sst2: Path, tmp_path: Path) -> None:
    """Full batches only, warm-up apart, fp32 on the CPU; the figures agree with each other."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from kubesweep.jobs import data, inference
    from kubesweep.jobs.distributed import Dist
    from kubesweep.jobs.model import resolve
    from kubesweep.wire.config import JobConfig

    tokenizer = AutoTokenizer.from_pretrained(resolve(MINILM).source)
    rows = data.load_rows(str(sst2), "validation", 40)
    split, _ = data.tokenize_split(rows, tokenizer, 32, "validation", tmp_path)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
    ))  # fmt: skip
    cfg = JobConfig(task="inference", batch_size=8, padding="max_length", max_seq_len=32, inference_batches=7,
                    warmup_batches=2, precision="fp32")
    stats, energy = inference.run(cfg, model, split, Dist())
    assert energy is None  # no GPU, no meter
    assert (stats["batch_size"], stats["seq_len"], stats["dtype"]) == (8, 32, "float32")
    assert stats["batches"] == 7 and stats["latency_s"]["n"] == 7 and stats["warmup_batches"] == 2
    assert stats["warmup_s"] > 0 and stats["latency_s"]["p50"] > 0
    assert stats["samples_per_s"] == pytest.approx(7 * 8 / (stats["latency_s"]["mean"] * 7))
    assert stats["padded_tokens_per_s"] == pytest.approx(stats["samples_per_s"] * 32)
    assert 0 < stats["tokens_per_s"] < stats["padded_tokens_per_s"]  # SST-2 sentences are shorter than 32
    # one forward pass per batch of 8 x 32: matmuls 2N per token, attention, pooler and classifier (flops.py)
    per_batch = 8 * 32 * 2 * (4 * 32 * 32 + 2 * 32 * 64) + 4 * 32 * 8 * 32 * 32 + 2 * 8 * (32 * 32 + 32 * 2)
    assert stats["flops_per_batch"] == per_batch and stats["measured_flops"] == 7 * per_batch
    assert stats["tflops_per_s"] == pytest.approx(7 * per_batch / (stats["latency_s"]["mean"] * 7) / 1e12)
    assert stats["padded_tokens_per_sample"] == 32 and 0 < stats["tokens_per_sample"] < 32
    assert not model.training
    # on the CPU a forward pass returns once computed: no issuing time, no host share (they mean nothing there)
    assert stats["graph"] is False and stats["launch_s"] is None and stats["host_share"] is None
    with pytest.raises(UsageError, match="step_graph needs a CUDA GPU"):
        inference.run(cfg.model_copy(update={"step_graph": True}), model, split, Dist())


def test_inference_benchmark(
    sst2: Path, token_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = tiny_args(
        sst2, token_cache, "--task", "inference", "--batch-size", "8", "--padding", "max_length",
        "--inference-batches", "12", "--warmup-batches", "2", "--precision", "bf16",
    )  # fmt: skip
    run = run_job_in_process(args, tmp_path, monkeypatch)
    assert run.returncode == ExitCode.OK, run.stdout
    inference = Results.read(tmp_path / "results.json").inference
    assert inference is not None
    assert inference.batches == 12 and inference.latency_s.n == 12 and inference.dtype == "bfloat16"
    assert inference.samples_per_s > 0
    assert inference.padded_tokens_per_s == pytest.approx(inference.samples_per_s * 64)
