#!/usr/bin/env bash
# Builds the control-plane binaries that the local test clusters run (test/kubeenv) and that
# envtest finds through KUBEBUILDER_ASSETS, at the versions pinned in hack/tools/{k8s,etcd,kwok}:
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok
#   and kwok's node and pod stages (kwok-stages.yaml).
#
# The binaries are built once per user into a versioned cache outside the checkout
#   ${BERTH_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}/k8s-<v>-etcd-<v>-kwok-<v>-<pins>/
# (<pins> is a hash of the pinning go.mod and go.sum files) and linked into bin/k8s, so that
# another clone on the same machine reuses them. What is already in the cache is not rebuilt.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
tools=$root/hack/tools
out=$root/bin/k8s

export GOWORK=off GOFLAGS="${GOFLAGS:-} -mod=readonly" CGO_ENABLED=0

# module_version DIR MODULE prints the version of MODULE that DIR's go.mod selects.
module_version() {
	go list -C "$1" -m -f '{{.Version}}' "$2"
}

k8s_version=$(module_version "$tools/k8s" k8s.io/kubernetes)
etcd_version=$(module_version "$tools/etcd" go.etcd.io/etcd/server/v3)
kwok_version=$(module_version "$tools/kwok" sigs.k8s.io/kwok)
pins=$(cat "$tools"/{k8s,etcd,kwok}/go.{mod,sum} | sha256sum | cut -c1-8)

cache_root=${BERTH_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/berth}
cache=$cache_root/k8s-$k8s_version-etcd-$etcd_version-kwok-$kwok_version-$pins
mkdir -p "$cache" "$out"

# version_ldflags PACKAGE... stamps VERSION (set by the caller) where `--version` and the
# discovery /version endpoint read it.
version_ldflags() {
	local flags="-s -w" major minor pkg
	major=${VERSION#v}; major=${major%%.*}
	minor=${VERSION#v"$major".}; minor=${minor%%.*}
	for pkg in "$@"; do
		flags+=" -X $pkg.gitVersion=$VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean"
	done
	echo "$flags"
}

# build NAME MODULE_DIR PACKAGE LDFLAGS builds one binary into the cache unless it is there.
build() {
	local name=$1 dir=$2 pkg=$3 ldflags=$4 start tmp
	if [[ -x $cache/$name ]]; then
		echo "tools: $name is built ($cache)"
		return
	fi
	echo "tools: building $name from $pkg (the first build takes minutes)"
	start=$SECONDS
	tmp=$(mktemp -d "$cache/.build-XXXXXX")
	go build -C "$dir" -trimpath -ldflags="$ldflags" -o "$tmp/$name" "$pkg"
	mv "$tmp/$name" "$cache/$name"
	rmdir "$tmp"
	echo "tools: built $name in $((SECONDS - start))s"
}

# kwok_stages writes the node and pod `fast` stages and the node heartbeat (so that the node
# lifecycle controller keeps the nodes Ready) from the pinned kwok module as one config file.
kwok_stages() {
	local dir file
	[[ -s $cache/kwok-stages.yaml ]] && return
	go mod download -C "$tools/kwok" sigs.k8s.io/kwok
	dir=$(go list -C "$tools/kwok" -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
	for file in "$dir"/node/fast/node-initialize.yaml \
		"$dir"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
		"$dir"/pod/fast/pod-ready.yaml "$dir"/pod/fast/pod-complete.yaml \
		"$dir"/pod/fast/pod-delete.yaml; do
		echo "---"
		cat "$file"
	done >"$cache/kwok-stages.yaml.tmp"
	mv "$cache/kwok-stages.yaml.tmp" "$cache/kwok-stages.yaml"
	echo "tools: wrote kwok-stages.yaml"
}

k8s_ldflags=$(VERSION=$k8s_version version_ldflags k8s.io/component-base/version k8s.io/client-go/pkg/version)
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
	build "$cmd" "$tools/k8s" "k8s.io/kubernetes/cmd/$cmd" "$k8s_ldflags"
done
build etcd "$tools/etcd" ./cmd/etcd "-s -w"
build kwok "$tools/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
kwok_stages

for name in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwok-stages.yaml; do
	ln -sfn "$cache/$name" "$out/$name"
done
echo "tools: $out -> $cache"
