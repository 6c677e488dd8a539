"""Packed rows (`padding: packed`): every sentence once, at its own positions; a packed sentence's logits, the loss
and the gradients those of the same sentences padded; and a packed fine-tuning run end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from kubesweep.jobs import data
from kubesweep.jobs.flops import ModelShape
from kubesweep.jobs.packed import PackedClassifier
from kubesweep.wire.config import JobConfig
from kubesweep.wire.outcomes import ExitCode
from kubesweep.wire.results import Results
from tests.support.job_fixtures import run_job_in_process, tiny_args

WIDTH = 64


def split(lengths: list[int] | np.ndarray, seed: int = 0) -> data.TokenizedSplit:
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lengths)
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 2000, int(offsets[-1])).astype(np.int32)
    ids[offsets[:-1]] = 101  # each sentence starts with [CLS]
    return data.TokenizedSplit(ids, offsets, rng.integers(0, 2, len(lengths)))


def test_packed_rows_hold_every_sentence_once_at_its_own_positions() -> None:
    lengths = np.random.default_rng(1).integers(2, WIDTH + 1, size=300)
    rows = split(lengths)
    index = np.random.default_rng(2).permutation(len(lengths))[:200]
    batch = data.BatchDataset(rows, [index], "packed", WIDTH, 16)[0]
    ids, positions, segments = batch["input_ids"], batch["position_ids"], batch["segment_ids"]
    assert ids.shape[1] == WIDTH
    assert batch["n_tokens"] == int(lengths[index].sum())
    assert batch["labels"].tolist() == rows.labels[index].tolist()
    # first fit, longest first: on these lengths within 11/9 of the rows the tokens fill, plus one (its bound
    # against the fewest rows possible, Dosa 2007); the rows past the last used one only round the count up
    assert (ids != 0).sum() == batch["n_tokens"]
    used = int((ids != 0).any(dim=1).sum())
    assert (ids[used:] == 0).all() and ids.shape[0] == data.packed_row_count(used)
    assert used <= 11 / 9 * -(-batch["n_tokens"] // WIDTH) + 1
    flat_ids, flat_pos, flat_seg = ids.reshape(-1), positions.reshape(-1), segments.reshape(-1)
    seen = set()
    for k, at in enumerate(batch["cls_index"].tolist()):
        row, n = at // WIDTH, int(lengths[index[k]])
        assert (at % WIDTH) + n <= WIDTH  # a sentence never crosses a row
        sentence = rows.ids[rows.offsets[index[k]] : rows.offsets[index[k] + 1]]
        assert flat_ids[at : at + n].tolist() == sentence.tolist()
        assert flat_pos[at : at + n].tolist() == list(range(n))
        segment = int(flat_seg[at])
        assert segment > 0 and set(flat_seg[at : at + n].tolist()) == {segment} and (row, segment) not in seen
        seen.add((row, segment))
        # the tokens of the sentence's row with its segment are exactly its own
        assert int((segments[row] == segment).sum()) == n
    assert len(seen) == len(index)


def test_the_row_count_rounds_up_by_an_eighth_at_most() -> None:
    assert [data.packed_row_count(n) for n in (1, 7, 8, 15, 16, 17, 33, 104, 105, 130)] == [
        1, 7, 8, 15, 16, 18, 36, 104, 112, 144]
    for n in range(1, 2000):
        assert n <= data.packed_row_count(n) <= n + max(0, n // 8)


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=2048, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForSequenceClassification(config)


def test_a_packed_batch_computes_what_the_same_sentences_padded_compute() -> None:
    """Logits, loss and every gradient of a packed batch equal those of the same batch padded (dynamic), so
    packing changes what the GPU computes on, not what the model learns."""
    rows = split([5, 17, 3, 40, 9, 2, 64, 12, 30, 7, 25, 11])
    index = np.arange(12)
    packed_batch = data.BatchDataset(rows, [index], "packed", WIDTH, 16)[0]
    padded_batch = data.BatchDataset(rows, [index], "dynamic", WIDTH, 16)[0]
    assert packed_batch["input_ids"].numel() < padded_batch["input_ids"].numel()

    model = tiny_bert()
    padded = model(**data.model_inputs(padded_batch))
    padded.loss.backward()
    want = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    packed = PackedClassifier(model)(**data.model_inputs(packed_batch))
    packed.loss.backward()
    got = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    torch.testing.assert_close(packed.logits, padded.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed.loss, padded.loss, rtol=1e-6, atol=1e-6)
    # the pooler's gradient comes from the sentences' [CLS] tokens alone, as padded: not from a row's first token
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_packed_needs_kubesweeps_fine_tuning() -> None:
    for other in ({"task": "inference"}, {"engine": "hf-trainer"}):
        with pytest.raises(ValueError, match="padding packed applies to fine-tuning with kubesweep's engine"):
            JobConfig.model_validate({"padding": "packed", **other})
    with pytest.raises(ValueError, match="flash attention does not take"):
        JobConfig.model_validate({"padding": "packed", "sdpa_backend": "flash"})
    with pytest.raises(TypeError, match="BERT-style classifier"):
        PackedClassifier(torch.nn.Linear(2, 2))
    assert data.eval_padding("packed") == "dynamic" and data.eval_padding("bucketed") == "bucketed"


def test_a_packed_rows_flops_count_the_rows_computed_and_the_head_per_sample() -> None:
    shape = ModelShape(hidden=768, layers=12, intermediate=3072, heads=12, labels=2)
    head = 2 * (768 * 768 + 768 * 2)
    assert shape.forward_flops(13, 128, samples=100) - shape.forward_flops(13, 128) == (100 - 13) * head


def test_a_packed_fine_tuning_run_learns_what_the_padded_one_learns(sst2: Path, token_cache: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The job on packed rows and on the same batches padded (dynamic padding plans the same batches): the same
    loss at every step (no dropout, fp32), the same evaluation (packed training evaluates padded), and the rows it
    computed on counted."""
    def run(padding: str) -> Results:
        args = tiny_args(sst2, token_cache, "--max-steps", "6", "--log-every", "1")
        args[args.index("--padding") + 1] = padding
        at = args.index("--model-overrides") + 1
        args[at] += ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
        done = run_job_in_process(args, tmp_path / padding, monkeypatch)
        assert done.returncode == ExitCode.OK, done.stdout
        return Results.read(done.output_dir / "results.json")

    padded, packed = run("dynamic"), run("packed")
    assert packed.train is not None and padded.train is not None and packed.train.steps == 6
    losses = [p.loss for p in packed.loss_curve]
    assert len(losses) == 6 and losses == pytest.approx([p.loss for p in padded.loss_curve], rel=1e-4, abs=1e-5)
    assert packed.eval and padded.eval and packed.eval[-1].accuracy == pytest.approx(padded.eval[-1].accuracy,
                                                                                      abs=1 / 128)
    train = packed.train
    assert train.tokens_per_s and train.padded_tokens_per_s and train.tokens_per_s <= train.padded_tokens_per_s
    # whole rows of 64 tokens, each step's 16 samples in fewer of them than dynamic padding's 16 rows
    assert train.padded_tokens_per_sample is not None and padded.train.padded_tokens_per_sample is not None
    assert train.padded_tokens_per_sample < padded.train.padded_tokens_per_sample
