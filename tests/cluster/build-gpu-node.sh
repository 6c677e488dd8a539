#!/usr/bin/env bash
# Build what a GPU node needs beyond the test cluster's binaries (tests/cluster/build-tools.sh) and cache it:
#
#   runc                      github.com/opencontainers/runc@RUNC_VERSION, static, with seccomp (libseccomp.a)
#   bridge, host-local,       github.com/containernetworking/plugins@CNI_VERSION (the pod network: one bridge,
#   loopback                  no masquerade, so no iptables on the node)
#   nvidia-device-plugin      github.com/NVIDIA/k8s-device-plugin@DEVICE_PLUGIN_VERSION (CGO: NVML is dlopen'ed)
#   gpu-feature-discovery     the same module's GFD, run once to name the node's GPU
#   nvidia-cdi-hook           github.com/NVIDIA/nvidia-container-toolkit@TOOLKIT_VERSION (CGO): the hooks the device
#                             plugin's CDI spec names (symlinks, ldcache)
#
# Binaries land in ${KUBESWEEP_TEST_CACHE:-~/.cache/kubesweep-test}/gpu-node-<versions>/bin; a binary already
# there is not rebuilt. The whole cache is locked while this runs, as build-tools.sh locks it.
#
# Usage: tests/cluster/build-gpu-node.sh [--print-bin-dir]
set -euo pipefail

RUNC_VERSION=v1.5.2
CNI_VERSION=v1.9.1
DEVICE_PLUGIN_VERSION=v0.19.0
TOOLKIT_VERSION=v1.20.2

CACHE_ROOT=${KUBESWEEP_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubesweep-test}
KEY="gpu-node-runc-${RUNC_VERSION}_cni-${CNI_VERSION}_dp-${DEVICE_PLUGIN_VERSION}_ctk-${TOOLKIT_VERSION}"
BIN_DIR="$CACHE_ROOT/$KEY/bin"
JOBS=${KUBESWEEP_BUILD_JOBS:-2}
CNI_PLUGINS=(bridge host-local loopback)
ALL=(runc "${CNI_PLUGINS[@]}" nvidia-device-plugin gpu-feature-discovery nvidia-cdi-hook)

if [[ "${1:-}" == "--print-bin-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

log() { printf '[build-gpu-node %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
have() { [[ -x "$BIN_DIR/$1" ]]; }

missing=()
for b in "${ALL[@]}"; do have "$b" || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then
  log "all binaries present in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || die "go is not on PATH"
command -v gcc >/dev/null || die "gcc is not on PATH (runc and the device plugin need cgo)"
if [[ ! -f /usr/lib/x86_64-linux-gnu/libseccomp.a ]]; then
  log "installing libseccomp-dev (runc links libseccomp statically)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libseccomp-dev >/dev/null
fi

mkdir -p "$BIN_DIR"
exec 9>"$CACHE_ROOT/.gpu-node.lock"
if ! flock -n 9; then
  log "waiting for another build of the GPU node's binaries"
  flock 9
fi
OUT=$(mktemp -d "$CACHE_ROOT/$KEY/out.XXXXXX")
trap 'rm -rf "$OUT"' EXIT
export GOFLAGS="${GOFLAGS:-} -buildvcs=false" GOTOOLCHAIN=local
start=$(date +%s)

install_bin() {
  "$@" >&2
  mv -f "$OUT/$name" "$BIN_DIR/$name"
  log "installed $BIN_DIR/$name ($(du -h "$BIN_DIR/$name" | cut -f1))"
}

name=runc
have runc || {
  log "runc $RUNC_VERSION (static, seccomp)"
  m=github.com/opencontainers/runc
  CGO_ENABLED=1 GOBIN="$OUT" go install -p "$JOBS" -trimpath -tags "seccomp netgo osusergo urfave_cli_no_docs" \
    -ldflags "-s -w -X main.version=${RUNC_VERSION#v} -extldflags -static" "$m@$RUNC_VERSION"
  install_bin "$OUT/runc" --version
}

for name in "${CNI_PLUGINS[@]}"; do
  have "$name" && continue
  case $name in host-local) path=plugins/ipam/host-local ;; *) path=plugins/main/$name ;; esac
  log "CNI $name $CNI_VERSION"
  CGO_ENABLED=0 GOBIN="$OUT" go install -p "$JOBS" -trimpath \
    -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" \
    "github.com/containernetworking/plugins/$path@$CNI_VERSION"
  install_bin true
done

# NVIDIA's modules: the proxy serves their versions but not their version lists, which `go install pkg@v` reads;
# so the module is downloaded and its commands are built inside it (from its vendor directory where it has one).
module_dir() {
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}
mod_flag() { [[ -f vendor/modules.txt ]] && echo -mod=vendor || echo -mod=readonly; }
dp=github.com/NVIDIA/k8s-device-plugin
for name in nvidia-device-plugin gpu-feature-discovery; do
  have "$name" && continue
  log "$name $DEVICE_PLUGIN_VERSION (cgo)"
  (cd "$(module_dir "$dp@$DEVICE_PLUGIN_VERSION")" && CGO_ENABLED=1 go build "$(mod_flag)" -p "$JOBS" -trimpath \
    -ldflags "-s -w -X $dp/internal/info.version=$DEVICE_PLUGIN_VERSION" -o "$OUT/$name" "./cmd/$name")
  install_bin "$OUT/$name" --version
done

name=nvidia-cdi-hook
have "$name" || {
  log "$name $TOOLKIT_VERSION"
  (cd "$(module_dir "github.com/NVIDIA/nvidia-container-toolkit@$TOOLKIT_VERSION")" &&
    CGO_ENABLED=1 go build "$(mod_flag)" -p "$JOBS" -trimpath -ldflags "-s -w" -o "$OUT/$name" "./cmd/$name")
  install_bin "$OUT/$name" --version
}

cat >"$CACHE_ROOT/$KEY/versions.txt" <<EOF
runc $RUNC_VERSION
cni-plugins $CNI_VERSION
k8s-device-plugin $DEVICE_PLUGIN_VERSION
nvidia-container-toolkit $TOOLKIT_VERSION
go $(go env GOVERSION)
EOF
log "done in $(( $(date +%s) - start ))s: $BIN_DIR"
echo "$BIN_DIR"
