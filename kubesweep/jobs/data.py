"""SST-2-style data: loading, tokenization (cached on disk), and the batch plan of each epoch.

Sources: a `datasets` name (`glue/sst2`, i.e. `load_dataset("glue", "sst2")`) or a local directory of GLUE
TSVs (`train.tsv` and `dev.tsv` with a `sentence<TAB>label` header).

Sentences are tokenized once, without padding, truncated to `max_seq_len`, and cached as flat int32 arrays
keyed by the tokenizer's content, the data's fingerprint, the split, the row limit and the length. Padding
happens per batch in `BatchDataset`:
- `max_length`: every batch padded to `max_seq_len` (HF run_glue's recipe, one static shape);
- `dynamic`: to the longest sentence of the batch;
- `bucketed`: sentences grouped by length rounded up to `bucket_multiple`; a batch holds one bucket, so the
  run sees a few static shapes (each compiled once under torch.compile);
- `packed` (fine-tuning): a batch's sentences laid end to end in rows of `max_seq_len` tokens (first fit, longest
  first), each sentence attending only to itself, its positions counted from 0; the row count rounds up
  (`packed_row_count`: few shapes). Evaluation pads dynamically.

The batch plan of an epoch is a pure function of (seed, epoch, lengths, settings), so a resumed run rebuilds
the same plan and skips the batches it already trained on. Under DDP the global plan is dealt round-robin to
ranks and trimmed to a multiple of the world size.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import DataLoader

from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import JobConfig, is_local_path

log = logging.getLogger(__name__)

TOKEN_CACHE_VERSION = 1
SPLIT_FILES = {"train": "train.tsv", "validation": "dev.tsv"}
IntArray = npt.NDArray[np.int64]


@dataclass
class Rows:
    sentences: list[str]
    labels: list[int]
    fingerprint: str  # identifies the source content (file stats or the `datasets` fingerprint)


@dataclass
class TokenizedSplit:
    """Token ids of every row, concatenated; row i is ids[offsets[i]:offsets[i+1]]."""

    ids: npt.NDArray[np.int32]
    offsets: IntArray
    labels: IntArray

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> IntArray:
        return np.diff(self.offsets)


def load_rows(dataset: str, split: str, limit: int | None, revision: str | None = None) -> Rows:
    """Read a split (`train` or `validation`), keeping the first `limit` rows; a `datasets` name at the hub
    commit `revision` (None: the hub's current one)."""
    path = Path(dataset).expanduser()
    if path.is_dir():
        return _read_tsv(path / SPLIT_FILES[split], limit)
    if is_local_path(dataset):
        raise UsageError(f"dataset directory {dataset!r} does not exist")
    return _load_hf(dataset, split, limit, revision)


def _read_tsv(path: Path, limit: int | None) -> Rows:
    if not path.is_file():
        raise UsageError(f"dataset file {str(path)!r} does not exist")
    sentences: list[str] = []
    labels: list[int] = []
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader)
        try:
            s_col, l_col = header.index("sentence"), header.index("label")
        except ValueError as err:
            raise UsageError(f"{path}: expected a header with 'sentence' and 'label' columns") from err
        for row in reader:
            if limit is not None and len(labels) >= limit:
                break
            sentences.append(row[s_col])
            labels.append(int(row[l_col]))
    stat = path.stat()
    return Rows(sentences, labels, f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")


def _load_hf(dataset: str, split: str, limit: int | None, revision: str | None) -> Rows:
    import datasets

    name, _, subset = dataset.partition("/")
    try:
        ds = datasets.load_dataset(name, subset or None, split=split, revision=revision)
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RuntimeError(f"cannot load dataset {dataset!r} split {split}: {first}") from err
    if limit is not None:
        ds = ds.select(range(min(limit, len(ds))))
    if "sentence" not in ds.column_names or "label" not in ds.column_names:
        raise UsageError(f"dataset {dataset!r} has no 'sentence'/'label' columns ({ds.column_names})")
    return Rows(list(ds["sentence"]), [int(x) for x in ds["label"]], f"datasets:{dataset}:{ds._fingerprint}")


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Identifies what the tokenizer does; its transient truncation/padding state is left out."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None)
        spec.pop("padding", None)
        content = json.dumps(spec, sort_keys=True)
    else:
        content = json.dumps(tokenizer.get_vocab(), sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return Path(os.environ.get("KUBESWEEP_CACHE_DIR") or Path.home() / ".cache" / "kubesweep")


def tokenize_split(
    rows: Rows, tokenizer: Any, max_seq_len: int, split: str, cache_dir: Path | None
) -> tuple[TokenizedSplit, bool]:
    """Tokenize (or read the cache). Returns the split and whether it came from the cache."""
    key_src = json.dumps(
        [
            TOKEN_CACHE_VERSION,
            tokenizer_fingerprint(tokenizer),
            rows.fingerprint,
            split,
            len(rows.labels),
            max_seq_len,
        ]
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:24]
    cache_file = cache_dir / "tokens" / f"{split}-{key}.npz" if cache_dir is not None else None
    if cache_file is not None and cache_file.is_file():
        with np.load(cache_file) as saved:
            return TokenizedSplit(saved["ids"], saved["offsets"], saved["labels"]), True
    encoded = tokenizer(rows.sentences, truncation=True, max_length=max_seq_len, padding=False)["input_ids"]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in encoded])
    ids = np.fromiter((t for row in encoded for t in row), dtype=np.int32, count=int(offsets[-1]))
    split_data = TokenizedSplit(ids, offsets, np.asarray(rows.labels, dtype=np.int64))
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # a name of its own: trials in pods share the cache claim and all run as pid 1
        tmp = cache_file.with_suffix(f".{os.getpid()}-{uuid.uuid4().hex[:12]}.tmp.npz")
        np.savez(tmp, ids=split_data.ids, offsets=split_data.offsets, labels=split_data.labels)
        tmp.replace(cache_file)
    return split_data, False


def load_split(cfg: JobConfig, tokenizer: Any, split: str) -> tuple[TokenizedSplit, bool]:
    limit = cfg.train_samples if split == "train" else cfg.eval_samples
    rows = load_rows(cfg.dataset, split, limit, cfg.dataset_revision)
    if not rows.labels:
        raise UsageError(f"dataset {cfg.dataset!r} split {split} is empty")
    cache_dir = Path(cfg.cache_dir).expanduser() if cfg.cache_dir else default_cache_dir()
    return tokenize_split(rows, tokenizer, cfg.max_seq_len, split, cache_dir)


# ---------------------------------------------------------------------------------------------- batch plans


def packed_row_count(used: int) -> int:
    """The rows of a packed batch whose sentences fill `used` rows: rounded up to a multiple of the largest power
    of two at most an eighth of it (104 stays 104, 105 becomes 112; 7 stays 7), so a run sees a few shapes and
    computes at most about an eighth more rows than it fills."""
    step = 1 << max(0, (used // 8).bit_length() - 1)
    return -(-used // step) * step


def eval_padding(padding: str) -> str:
    """How evaluation batches are padded: as training's, except that packed training evaluates dynamically."""
    return "dynamic" if padding == "packed" else padding


def pack_rows(lengths: IntArray, width: int) -> tuple[IntArray, IntArray]:
    """First-fit decreasing: for sentences of `lengths` (each at most `width`), the row each goes to and where it
    starts there. The rows are those of a batch packed at `width` tokens a row."""
    rows = np.empty(len(lengths), dtype=np.int64)
    starts = np.empty(len(lengths), dtype=np.int64)
    fill = np.zeros(len(lengths), dtype=np.int64)  # never more rows than sentences
    used = 0
    for i in np.argsort(-lengths, kind="stable"):
        room = np.flatnonzero(fill[:used] + lengths[i] <= width)
        row = int(room[0]) if len(room) else used
        used += row == used
        rows[i], starts[i] = row, fill[row]
        fill[row] += lengths[i]
    return rows, starts


def pad_length(batch_max: int, padding: str, max_seq_len: int, bucket_multiple: int) -> int:
    if padding == "max_length":
        return max_seq_len
    if padding == "bucketed":
        return min(max_seq_len, -(-batch_max // bucket_multiple) * bucket_multiple)
    return batch_max


def plan_batches(
    lengths: IntArray,
    batch_size: int,
    *,
    padding: str,
    max_seq_len: int,
    bucket_multiple: int,
    shuffle: bool,
    seed: int,
    epoch: int,
    world_size: int = 1,
    drop_uneven: bool = True,
) -> list[IntArray]:
    """The global list of index batches of one epoch (before dealing them to ranks)."""
    n = len(lengths)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n) if shuffle else np.arange(n)
    if padding == "bucketed":
        batches = _bucketed(order, lengths, batch_size, max_seq_len, bucket_multiple)
        if shuffle:
            # Rank r takes batches r, r + world_size, ...: shuffling whole groups of world_size consecutive
            # batches of the bucket-ordered list hands every rank a batch of the same bucket at each step, so
            # no rank waits at the gradient all-reduce for another's longer sequences.
            if world_size > 1 and drop_uneven:
                batches = batches[: len(batches) - len(batches) % world_size]
            groups = [batches[i : i + world_size] for i in range(0, len(batches), world_size)]
            batches = [batch for g in rng.permutation(len(groups)) for batch in groups[g]]
    else:
        if not shuffle and padding == "dynamic":  # evaluation: similar lengths together, less padding
            order = order[np.argsort(lengths[order], kind="stable")]
        batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]
    if world_size > 1 and drop_uneven:
        batches = batches[: len(batches) - len(batches) % world_size]
    return batches


def _bucketed(
    order: IntArray, lengths: IntArray, batch_size: int, max_seq_len: int, multiple: int
) -> list[IntArray]:
    keys = np.minimum(max_seq_len, -(-lengths[order] // multiple) * multiple)
    batches: list[IntArray] = []
    leftovers: list[IntArray] = []
    for key in np.unique(keys):
        members = order[keys == key]
        full = len(members) - len(members) % batch_size
        batches.extend(members[i : i + batch_size] for i in range(0, full, batch_size))
        if full < len(members):
            leftovers.append(members[full:])
    if leftovers:  # partial buckets merge into full batches, padded to their longest member's bucket
        rest = np.concatenate(leftovers)
        batches.extend(rest[i : i + batch_size] for i in range(0, len(rest), batch_size))
    return batches


class BatchDataset:
    """Item i is batch i of a plan, padded and as tensors; used with DataLoader(batch_size=None)."""

    def __init__(
        self,
        data: TokenizedSplit,
        batches: list[IntArray],
        padding: str,
        max_seq_len: int,
        bucket_multiple: int,
    ) -> None:
        self.data = data
        self.batches = batches
        self.padding = padding
        self.max_seq_len = max_seq_len
        self.bucket_multiple = bucket_multiple

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.padding == "packed":
            return self._packed(self.batches[i])
        index = self.batches[i]
        starts, ends = self.data.offsets[index], self.data.offsets[index + 1]
        lengths = ends - starts
        width = pad_length(int(lengths.max()), self.padding, self.max_seq_len, self.bucket_multiple)
        ids = np.zeros((len(index), width), dtype=np.int64)  # [PAD] is 0 in BERT vocabularies
        mask = np.zeros((len(index), width), dtype=np.int64)
        for row, (start, end) in enumerate(zip(starts, ends, strict=True)):
            ids[row, : end - start] = self.data.ids[start:end]
            mask[row, : end - start] = 1
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(self.data.labels[index]),
            "n_tokens": int(lengths.sum()),
        }

    def _packed(self, index: IntArray) -> dict[str, Any]:
        """The batch's sentences packed into rows of `max_seq_len` tokens: token ids, each token's position in its
        sentence, each token's sentence (1, 2, ... within its row; 0 for padding) and where each sentence's
        first token ([CLS]) sits in the flattened rows, in the order of `labels`."""
        starts, ends = self.data.offsets[index], self.data.offsets[index + 1]
        lengths = ends - starts
        width = self.max_seq_len
        row_of, start_in_row = pack_rows(lengths, width)
        rows = packed_row_count(int(row_of.max()) + 1)
        ids = np.zeros((rows, width), dtype=np.int64)
        positions = np.zeros((rows, width), dtype=np.int64)
        segments = np.zeros((rows, width), dtype=np.int64)
        count = np.zeros(rows, dtype=np.int64)
        for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
            row, at, n = row_of[k], start_in_row[k], end - start
            ids[row, at : at + n] = self.data.ids[start:end]
            positions[row, at : at + n] = np.arange(n)
            count[row] += 1
            segments[row, at : at + n] = count[row]
        return {
            "input_ids": torch.from_numpy(ids),
            "position_ids": torch.from_numpy(positions),
            "segment_ids": torch.from_numpy(segments),
            "cls_index": torch.from_numpy(row_of * width + start_in_row),
            "labels": torch.from_numpy(self.data.labels[index]),
            "n_tokens": int(lengths.sum()),
        }


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch's tensors, the model's inputs (without its counts)."""
    return {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}


def batch_shape(batch: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """The shapes of a batch's inputs: batches of one shape run one compiled graph (and one CUDA graph)."""
    return tuple(tuple(v.shape) for v in model_inputs(batch).values())


def loader(
    cfg: JobConfig,
    data: TokenizedSplit,
    batches: list[IntArray],
    *,
    pin_memory: bool,
    workers: int | None = None,
    padding: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The batches of `batches`, padded as `padding` (default: the trial's) says."""
    dataset = BatchDataset(data, batches, padding or cfg.padding, cfg.max_seq_len, cfg.bucket_multiple)
    n_workers = cfg.num_workers if workers is None else workers
    return iter(
        DataLoader(
            dataset,  # type: ignore[arg-type]  # a map-style dataset without subclassing torch's Dataset
            batch_size=None,
            shuffle=False,
            num_workers=n_workers,
            pin_memory=pin_memory,
            prefetch_factor=4 if n_workers > 0 else None,
            # its own generator: creating a loader must not draw from the global RNG (exact resume)
            generator=torch.Generator().manual_seed(0),
        )
    )
