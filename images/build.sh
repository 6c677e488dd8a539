#!/usr/bin/env bash
# Build the kubesweep job and operator images, push them to REGISTRY and write their digests into the image lock.
#
#   REGISTRY=registry.example/team images/build.sh                      # every image in the lock
#   REGISTRY=registry.example/team images/build.sh --key torch-2.8-cu128  # one PyTorch-CUDA line
#
# The builder is the first of buildah, podman and docker found (BUILDER=... picks one). As root without a
# container runtime, buildah needs BUILDAH_ISOLATION=chroot (set here when unset) and, where overlay mounts are
# refused, --builder-arg=--storage-driver=vfs. Every other flag is passed to `sweep images build` (see --help).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
: "${REGISTRY:?set REGISTRY to the registry and path to push to, e.g. REGISTRY=ghcr.io/myorg}"
export REGISTRY
if [[ "${BUILDER:-}" == "buildah" || ( -z "${BUILDER:-}" && -x "$(command -v buildah || true)" ) ]]; then
  export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"
fi
if command -v sweep >/dev/null 2>&1; then
  sweep=(sweep)
elif [[ -x "$root/.venv/bin/sweep" ]]; then
  sweep=("$root/.venv/bin/sweep")
else
  sweep=("${PYTHON:-python3}" -m kubesweep)
fi
cd "$root"
exec "${sweep[@]}" images build --root "$root" "$@"
