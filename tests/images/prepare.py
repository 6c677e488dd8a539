"""Build what the image tests use before they run: `python -m tests.images.prepare`.

On a fresh machine the image tests' first step is long: a Debian rootfs, the multi-GB PyTorch stand-in base, the
wheelhouses, then the job and operator images. `make test` runs this while the test cluster's binaries build
(both are builds that no test waits on), so the tests then find every layer cached and rebuild only what the
checkout changed. It does what the image fixtures do (tests/support/image_fixtures.py), against a registry of
its own whose storage then seeds theirs (tests/images/support.py: REGISTRY_SEED).

Exit status: 0 when the images are built; 1 when a step failed (its error is printed; the image tests will fail on
the same step and say so); 2 when this machine cannot build images (a missing tool or not root), as the tests
will also say.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from tests.images import support


def main() -> int:
    missing = support.missing_tools()
    if missing:
        print(f"images: not built: {', '.join(missing)} missing (Debian packages)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("images: not built: buildah runs as root here (chroot isolation)", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kubesweep-images-") as tmp:
        work = Path(tmp)
        try:
            registry = support.start_registry(work / "registry")
        except support.ImageToolError as exc:
            print(f"images: not built: {exc}", file=sys.stderr)
            return 1
        try:
            bh = support.Buildah.cached()
            bases = support.push_standins(registry, bh, work)
            print(f"images: stand-in bases ready in {time.monotonic() - t0:.0f}s", flush=True)
            built = support.build_images(registry, bh, bases, work)
        except support.ImageToolError as exc:
            print(f"images: not built: {exc}", file=sys.stderr)
            return 1
        finally:
            registry.stop(keep_as_seed=True)
    print(f"images: job and operator images built in {built.build_seconds:.0f}s; "
          f"{time.monotonic() - t0:.0f}s in all", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
