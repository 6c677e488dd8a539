#!/usr/bin/env bash
# Build the pinned binaries of the test control plane from Go modules and cache them.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler  k8s.io/kubernetes@K8S_VERSION (wrapper module)
#   etcd                                                      go.etcd.io/etcd/server/v3@ETCD_VERSION (wrapper main)
#   kwok, kwokctl                                             go install sigs.k8s.io/kwok/cmd/...@KWOK_VERSION
#   helm                                                      go install helm.sh/helm/v3/cmd/helm@HELM_VERSION
# and the real worker node beside the kwok nodes (see docs/testing.md):
#   kubelet, kube-proxy                                       k8s.io/kubernetes@K8S_VERSION (same wrapper module)
#   containerd, containerd-shim-runc-v2, ctr                  go install github.com/containerd/containerd/v2/cmd/...
#   coredns                                                   a wrapper main around github.com/coredns/coredns with
#                                                             only the plugins the cluster's Corefile uses
#   pause                                                     build/pause/linux/pause.c of k8s.io/kubernetes, static
#   kube-router                                               go install github.com/cloudnativelabs/kube-router/v2/
#                                                             cmd/kube-router@... (the node's NetworkPolicy, firewall only)
#   kueue                                                     go install sigs.k8s.io/kueue/cmd/kueue@KUEUE_VERSION
#                                                             (the queue manager, run beside the control plane when
#                                                             asked: tests/cluster/kueue.py)
#
# Binaries land in ${XDG_CACHE_HOME:-~/.cache}/kubesweep-test/<versions>/bin; a binary already there is not
# rebuilt, so a warm run returns at once. Go's own caches (GOCACHE, GOMODCACHE) keep their defaults, so a rebuild
# after deleting the binaries is incremental.
#
# One run at a time per cache: a run holds a lock on <versions>/build.lock (flock) from before it looks at the
# binaries until it ends, so a second run (another checkout's `make test`, a test fixture) says that it waits,
# waits, then finds what the first built. Each run builds in a work directory of its own (<versions>/work.XXXXXX:
# wrapper modules, freshly built binaries), removed when it ends; one left by a killed run is removed by the next
# run, under the lock, when no run can be using it.
#
# Usage: tests/cluster/build-tools.sh [--print-bin-dir | --check]
#   --print-bin-dir  print the bin directory and exit (builds nothing)
#   --check          exit 0 when every binary is present, 1 when a build is needed (builds nothing, takes no lock)
# Environment:
#   KUBESWEEP_TEST_CACHE   cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubesweep-test)
#   KUBESWEEP_BUILD_JOBS   go build -p (default 2)
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
CONTAINERD_VERSION=v2.2.9
COREDNS_VERSION=v1.14.7
KUBE_ROUTER_VERSION=v2.1.0
KUEUE_VERSION=v0.17.0

CACHE_ROOT=${KUBESWEEP_TEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubesweep-test}
VERSION_KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}"
VERSION_KEY+="_containerd-${CONTAINERD_VERSION}_coredns-${COREDNS_VERSION}"
BIN_DIR="$CACHE_ROOT/$VERSION_KEY/bin"
JOBS=${KUBESWEEP_BUILD_JOBS:-2}

have_all() {
  local b
  for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
CONTAINERD_CMDS=(containerd containerd-shim-runc-v2 ctr)
ALL=("${K8S_CMDS[@]}" etcd kwok kwokctl helm "${CONTAINERD_CMDS[@]}" coredns pause)
# Added after the cache key was set: its version is stamped beside the binary rather than keyed, so adding it did
# not throw away the other binaries (nor the node's image store, kept under the same key).
have_kube_router() {
  [[ -x "$BIN_DIR/kube-router" && "$(cat "$BIN_DIR/kube-router.version" 2>/dev/null)" == "$KUBE_ROUTER_VERSION" ]]
}
have_kueue() {
  [[ -x "$BIN_DIR/kueue" && "$(cat "$BIN_DIR/kueue.version" 2>/dev/null)" == "$KUEUE_VERSION" ]]
}
case "${1:-}" in
  --print-bin-dir) echo "$BIN_DIR"; exit 0 ;;
  --check) have_all "${ALL[@]}" && have_kube_router && have_kueue; exit ;;
  "") ;;
  *) echo "usage: $0 [--print-bin-dir | --check]" >&2; exit 2 ;;
esac

log() { printf '[build-tools %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Held until this script and every process it started have ended (the children inherit the descriptor).
command -v flock >/dev/null || die "flock is not on PATH (util-linux)"
LOCK="$CACHE_ROOT/$VERSION_KEY/build.lock"
mkdir -p "$CACHE_ROOT/$VERSION_KEY"
exec 9>>"$LOCK"
if ! flock --nonblock 9; then
  log "waiting for $LOCK: another build-tools.sh run is using this cache"
  flock 9
  log "got $LOCK"
fi

if have_all "${ALL[@]}" && have_kube_router && have_kueue; then
  log "all binaries present in $BIN_DIR"
  echo "$BIN_DIR"
  exit 0
fi

command -v go >/dev/null || die "go is not on PATH (needed to build the test control plane)"
command -v python3 >/dev/null || die "python3 is not on PATH"

mkdir -p "$BIN_DIR"
# Work directories are made and used only under the lock, so any left now belong to a run that was killed.
for stale in "$CACHE_ROOT/$VERSION_KEY"/work.??????; do
  if [[ -d "$stale" ]]; then
    log "removing $stale (left by a run that did not finish)"
    rm -rf "$stale"
  fi
done
WORK=$(mktemp -d "$CACHE_ROOT/$VERSION_KEY/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGING_OUT="$WORK/out"
mkdir "$STAGING_OUT"

export CGO_ENABLED=0
# No DWARF from the compiler: the linker drops it anyway (-ldflags "-s -w"), so generating it is compile time
# spent on nothing (a stack trace reads the pcln tables, not DWARF). Build flags in GOFLAGS apply to every build
# and install below; `go mod` and `go get` ignore them.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false -gcflags=all=-dwarf=false"
# Go needs no toolchain download: the local go must be new enough for the pinned modules.
export GOTOOLCHAIN=local

start_all=$(date +%s)

# Move freshly built binaries into the cache only when they run, so a half-built file never counts as present.
install_bin() {
  local name=$1
  chmod +x "$STAGING_OUT/$name"
  mv -f "$STAGING_OUT/$name" "$BIN_DIR/$name"
  log "installed $BIN_DIR/$name"
}

module_json() {  # module_json MOD@VER FIELD -> value of FIELD from `go mod download -json` (its Error to stderr)
  go mod download -json "$1" | python3 -c '
import json, sys
d = json.load(sys.stdin)
if d.get("Error"):
    sys.exit("go mod download %s: %s" % (sys.argv[2], d["Error"]))
print(d.get(sys.argv[1]) or "")
' "$2" "$1"
}

# ---------------------------------------------------------------- Kubernetes control-plane components
build_kubernetes() {
  local dir="$WORK/kubernetes" minor stage gomod gitcommit ldflags pkg
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  stage="v0.${K8S_VERSION#v1.}"
  log "kubernetes $K8S_VERSION: staging modules at $stage"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local/kubesweep-k8s-tools >/dev/null 2>&1

  gomod=$(module_json "k8s.io/kubernetes@$K8S_VERSION" GoMod)
  [[ -f "$gomod" ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
  # Every replace of k8s.io/kubernetes' go.mod becomes a replace of the wrapper: the staging directories
  # (./staging/src/k8s.io/X) map to the published k8s.io/X at v0.N.P; versioned replaces are copied as they are.
  # The go directive, godebug and exclude lines are copied so the binaries behave as the upstream build.
  go mod edit -json "$gomod" | python3 -c '
import json, sys
d = json.load(sys.stdin)
stage = sys.argv[1]
args = ["-go=" + d["Go"]]
for g in d.get("GoDebug") or []:
    args.append("-godebug=%s=%s" % (g["Key"], g["Value"]))
for e in d.get("Exclude") or []:
    args.append("-exclude=%s@%s" % (e["Path"], e["Version"]))
n = 0
for r in d.get("Replace") or []:
    old, new = r["Old"], r["New"]
    if new["Path"].startswith("./staging/src/"):
        args.append("-replace=%s=%s@%s" % (old["Path"], old["Path"], stage))
        n += 1
    elif new.get("Version"):
        src = old["Path"] + ("@" + old["Version"] if old.get("Version") else "")
        args.append("-replace=%s=%s@%s" % (src, new["Path"], new["Version"]))
    else:
        sys.exit("unexpected local replace in k8s.io/kubernetes go.mod: %r" % r)
print("derived %d staging replaces" % n, file=sys.stderr)
print("\n".join(args))
' "$stage" >edit-args.txt
  xargs go mod edit <edit-args.txt
  log "go.mod: $(grep -c '=>' go.mod) replace lines"

  log "resolving k8s.io/kubernetes@$K8S_VERSION dependencies (downloads modules on a cold cache)"
  local pkgs=()
  for cmd in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$cmd@$K8S_VERSION"); done
  go get "${pkgs[@]}"

  gitcommit=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash", ""))')
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean"
    [[ -n "$gitcommit" ]] && ldflags+=" -X $pkg.gitCommit=$gitcommit"
  done

  local cmd
  for cmd in "${K8S_CMDS[@]}"; do
    have_all "$cmd" && { log "$cmd present, skipping"; continue; }
    local t0=$(date +%s)
    log "building $cmd $K8S_VERSION (go build -p $JOBS)"
    go build -p "$JOBS" -trimpath -ldflags "$ldflags" -o "$STAGING_OUT/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    "$STAGING_OUT/$cmd" --version >&2
    install_bin "$cmd"
    log "$cmd built in $(( $(date +%s) - t0 ))s"
  done
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  local dir="$WORK/etcd" t0
  t0=$(date +%s)
  log "building etcd $ETCD_VERSION (wrapper main around go.etcd.io/etcd/server/v3/etcdmain)"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local/kubesweep-etcd >/dev/null 2>&1
  cat >main.go <<'EOF'
// Command etcd runs the etcd server of the pinned go.etcd.io/etcd/server/v3 release.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
EOF
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
  go mod tidy
  go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$STAGING_OUT/etcd" .
  "$STAGING_OUT/etcd" --version >&2
  install_bin etcd
  log "etcd built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- kwok, kwokctl
build_kwok() {
  local t0 cmd
  t0=$(date +%s)
  for cmd in kwok kwokctl; do
    have_all "$cmd" && { log "$cmd present, skipping"; continue; }
    log "go install sigs.k8s.io/kwok/cmd/$cmd@$KWOK_VERSION"
    GOBIN="$STAGING_OUT" go install -p "$JOBS" -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/$cmd@$KWOK_VERSION"
    "$STAGING_OUT/$cmd" --version >&2
    install_bin "$cmd"
  done
  log "kwok, kwokctl built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- helm
build_helm() {
  local t0 gomod clientgo k8smajor k8sminor commit ldflags v="helm.sh/helm/v3"
  t0=$(date +%s)
  gomod=$(module_json "$v@$HELM_VERSION" GoMod)
  # As helm's Makefile does: the Kubernetes version helm assumes comes from its client-go (v0.N.P -> 1.N).
  clientgo=$(awk '$1 == "k8s.io/client-go" {print $2; exit}' "$gomod")
  [[ -n "$clientgo" ]] || die "could not find k8s.io/client-go in helm's go.mod"
  clientgo=${clientgo#v}
  k8smajor=$(( ${clientgo%%.*} + 1 ))
  k8sminor=$(echo "$clientgo" | cut -d. -f2)
  commit=$(go mod download -json "$v@$HELM_VERSION" |
    python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash", ""))')
  ldflags="-s -w -X $v/internal/version.version=$HELM_VERSION -X $v/internal/version.gitTreeState=clean"
  [[ -n "$commit" ]] && ldflags+=" -X $v/internal/version.gitCommit=$commit"
  ldflags+=" -X $v/pkg/lint/rules.k8sVersionMajor=$k8smajor -X $v/pkg/lint/rules.k8sVersionMinor=$k8sminor"
  ldflags+=" -X $v/pkg/chartutil.k8sVersionMajor=$k8smajor -X $v/pkg/chartutil.k8sVersionMinor=$k8sminor"
  log "go install $v/cmd/helm@$HELM_VERSION (assumes Kubernetes $k8smajor.$k8sminor)"
  GOBIN="$STAGING_OUT" go install -p "$JOBS" -trimpath -ldflags "$ldflags" "$v/cmd/helm@$HELM_VERSION"
  "$STAGING_OUT/helm" version >&2
  install_bin helm
  log "helm built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- containerd (the real node's CRI runtime)
build_containerd() {
  local t0 cmd commit ldflags m="github.com/containerd/containerd/v2"
  t0=$(date +%s)
  commit=$(go mod download -json "$m@$CONTAINERD_VERSION" |
    python3 -c 'import json,sys; print((json.load(sys.stdin).get("Origin") or {}).get("Hash", ""))')
  # The version variables containerd's Makefile sets. CGO off leaves out the btrfs snapshotter (it needs
  # libbtrfs); the node uses overlayfs.
  ldflags="-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Package=$m"
  [[ -n "$commit" ]] && ldflags+=" -X $m/version.Revision=$commit"
  for cmd in "${CONTAINERD_CMDS[@]}"; do
    have_all "$cmd" && { log "$cmd present, skipping"; continue; }
    log "go install $m/cmd/$cmd@$CONTAINERD_VERSION"
    GOBIN="$STAGING_OUT" go install -p "$JOBS" -trimpath -tags no_btrfs -ldflags "$ldflags" \
      "$m/cmd/$cmd@$CONTAINERD_VERSION"
    install_bin "$cmd"
  done
  "$BIN_DIR/containerd" --version >&2
  log "containerd built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- CoreDNS (the cluster's DNS)
build_coredns() {
  local dir="$WORK/coredns" t0 m="github.com/coredns/coredns"
  t0=$(date +%s)
  log "building coredns $COREDNS_VERSION (wrapper main with the plugins of the test cluster's Corefile)"
  rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
  go mod init local/kubesweep-coredns >/dev/null 2>&1
  # CoreDNS' documented way to build with a chosen set of plugins: import them and set the directive order
  # (the order of its plugin.cfg). Leaving out the cloud backends keeps the build small.
  cat >main.go <<'EOF'
// Command coredns runs CoreDNS of the pinned release with the plugins a Kubernetes cluster's DNS needs.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "loop"}
}

func main() {
	coremain.Run()
}
EOF
  go get "$m@$COREDNS_VERSION"
  go mod tidy
  go build -p "$JOBS" -trimpath -ldflags "-s -w" -o "$STAGING_OUT/coredns" .
  "$STAGING_OUT/coredns" -version >&2
  install_bin coredns
  log "coredns built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- pause (the pods' sandbox process)
build_pause() {
  local src
  command -v gcc >/dev/null || die "gcc is not on PATH (needed to build the pause binary)"
  src="$(go env GOMODCACHE)/k8s.io/kubernetes@$K8S_VERSION/build/pause/linux/pause.c"
  [[ -f "$src" ]] || go mod download "k8s.io/kubernetes@$K8S_VERSION"
  [[ -f "$src" ]] || die "no $src in the k8s.io/kubernetes module"
  log "building pause from $src (static)"
  gcc -Os -Wall -Werror -static -DVERSION="$K8S_VERSION" -o "$STAGING_OUT/pause" "$src"
  strip "$STAGING_OUT/pause"
  "$STAGING_OUT/pause" -v >&2
  install_bin pause
}

# ---------------------------------------------------------------- kube-router (NetworkPolicy on the real node)
build_kube_router() {
  local t0 m="github.com/cloudnativelabs/kube-router/v2"
  t0=$(date +%s)
  log "building kube-router $KUBE_ROUTER_VERSION (the node runs only its network policy controller)"
  GOBIN="$STAGING_OUT" go install -trimpath -ldflags "-s -w -X $m/pkg/version.Version=$KUBE_ROUTER_VERSION" \
    "$m/cmd/kube-router@$KUBE_ROUTER_VERSION"
  "$STAGING_OUT/kube-router" --version >&2
  install_bin kube-router
  echo "$KUBE_ROUTER_VERSION" >"$BIN_DIR/kube-router.version"
  log "kube-router built in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- Kueue (the queue manager of shared GPU clusters)
build_kueue() {
  local t0 m="sigs.k8s.io/kueue"
  t0=$(date +%s)
  log "building kueue $KUEUE_VERSION (its manager; CRDs and webhooks come from the same module's config/)"
  GOBIN="$STAGING_OUT" go install -p "$JOBS" -trimpath -ldflags "-s -w -X $m/pkg/version.GitVersion=$KUEUE_VERSION" \
    "$m/cmd/kueue@$KUEUE_VERSION"
  install_bin kueue
  echo "$KUEUE_VERSION" >"$BIN_DIR/kueue.version"
  log "kueue built in $(( $(date +%s) - t0 ))s"
}

# Two streams at once, each `go build -p $JOBS`: one `go build` alone keeps a 2-core machine about three quarters
# busy (links, and packages waiting on the ones they import), two keep it busy. Go's build and module caches are
# safe for concurrent use; each stream builds in directories of its own. The streams are about even (a fresh
# machine's build, both streams beside the images' build: Kubernetes' five commands 934 s, then CoreDNS and
# kube-router about 160 s; Kueue 750 s, then the other five tools about 350 s), so neither runs long alone.
kubernetes_stream() {
  have_all "${K8S_CMDS[@]}" || build_kubernetes
  have_all pause || build_pause
  have_all coredns || build_coredns
  have_kube_router || build_kube_router
}
tools_stream() {
  have_kueue || build_kueue
  have_all etcd || build_etcd
  have_all kwok kwokctl || build_kwok
  have_all helm || build_helm
  have_all "${CONTAINERD_CMDS[@]}" || build_containerd
}
(kubernetes_stream) & k8s_pid=$!
(tools_stream) & tools_pid=$!
failed=()
wait "$k8s_pid" || failed+=("Kubernetes")
wait "$tools_pid" || failed+=("the other tools")
(( ${#failed[@]} == 0 )) || die "building ${failed[*]} failed (the error is above)"

cat >"$CACHE_ROOT/$VERSION_KEY/versions.txt" <<EOF
kubernetes $K8S_VERSION
etcd $ETCD_VERSION
kwok $KWOK_VERSION
helm $HELM_VERSION
containerd $CONTAINERD_VERSION
coredns $COREDNS_VERSION
kube-router $KUBE_ROUTER_VERSION
kueue $KUEUE_VERSION
go $(go env GOVERSION)
EOF
log "done in $(( $(date +%s) - start_all ))s: $BIN_DIR"
echo "$BIN_DIR"
