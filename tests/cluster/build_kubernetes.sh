#!/usr/bin/env bash
# Builds Kubernetes v1.20.2's binaries once from Debian's `kubernetes` source package and caches them
# outside the work tree, keyed by version and by the list of binaries; installs Debian's etcd-server.
# kube-apiserver serves the real-API-server tests (tests/apiserver/); with kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy, kubectl 1.20 and the pause binary it makes the real node of
# tests/cluster/. A warm cache costs nothing; a cold build takes ~9 min of 2 idle cores.
#
# Why from source: no package registry ships a prebuilt kube-apiserver or kubelet; Debian's source package
# (v1.20.2, all Go dependencies vendored) builds offline with Debian's Go (docs/kubernetes.md, "The real
# cluster"; the facts are in ../shared/spec/kubernetes.md §4 and §7).
#
# Progress lines go to fd 9 when it is open (the Makefile's `step` macro opens it on the terminal while
# the build's own output goes to the step's log), else to stdout. Run as root (apt-get).
set -euo pipefail

VERSION=v1.20.2
# What is built: a cache holding a different list (an older checkout's) is rebuilt.
WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kube-proxy cmd/kubelet cmd/kubectl"
CACHE_DIR="${SHALE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shale}/kubernetes-$VERSION"
STAMP="$CACHE_DIR/.built"
START=$SECONDS

if { true >&9; } 2>/dev/null; then exec 8>&9; else exec 8>&1; fi
progress() { echo "  kubernetes $VERSION [$((SECONDS - START))s]: $*" >&8; }
apt_install() {
  apt-get install -y --no-install-recommends "$@" || { apt-get update && apt-get install -y --no-install-recommends "$@"; }
}

# etcd: Debian's etcd-server (3.4, the series kube-apiserver 1.20 was tested with). Its postinst does
# not start a daemon in a container without an init system; the tests start their own on free ports.
if ! command -v etcd >/dev/null; then
  progress "installing Debian's etcd-server with apt-get"
  apt_install etcd-server
fi

mkdir -p "$CACHE_DIR"
# One build at a time per cache (two `make test`s, or two machines sharing a home directory).
exec 7>"$CACHE_DIR/.lock"
flock 7
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WHAT pause" ] \
    && "$CACHE_DIR/kube-apiserver" --version | grep -qx "Kubernetes $VERSION"; then
  progress "cached in $CACHE_DIR (warm, not rebuilt)"
  exit 0
fi

progress "cold cache: building $WHAT from Debian's kubernetes source package (~9 min on 2 idle cores) into $CACHE_DIR"
progress "installing Go and the build tools with apt-get"
apt_install golang-go make rsync gcc libc6-dev golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev

BUILD="$CACHE_DIR/build"
rm -rf "$BUILD" "$STAMP"
mkdir -p "$BUILD/apt/sources.list.d" "$BUILD/apt/lists/partial"
trap 'rm -rf "$BUILD"' EXIT

# The deb-src index is fetched into the build directory with a private sources list, so the machine's
# apt configuration is never changed (the spec's "add a deb-src line, remove it afterwards", without
# the window in which it is there).
cat >"$BUILD/apt/sources.list.d/debian-src.sources" <<SOURCES
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
APT_SRC=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$BUILD/apt/sources.list.d"
  -o "Dir::State::Lists=$BUILD/apt/lists" -o Dir::Cache::pkgcache= -o Dir::Cache::srcpkgcache=)
progress "downloading the kubernetes source package (~35 MB, with a temporary deb-src index of ~20 MB)"
apt-get "${APT_SRC[@]}" update
(cd "$BUILD" && apt-get "${APT_SRC[@]}" source --download-only kubernetes)
ORIG=$(ls "$BUILD"/kubernetes_*.orig.tar.*)
case "$ORIG" in *"${VERSION#v}"*) ;; *) echo "expected kubernetes ${VERSION#v}, Debian ships $ORIG" >&2; exit 1 ;; esac

progress "unpacking $(basename "$ORIG")"
mkdir -p "$BUILD/src"
tar -xf "$ORIG" -C "$BUILD/src" --strip-components=1
cd "$BUILD/src"

# The vendored reflect2 1.0.1 crashes the server under Go >= 1.18 ("fatal error: fault" in mapiterinit on
# the first custom object); Debian's newer reflect2 and json-iterator are drop-in replacements.
for lib in modern-go/reflect2 json-iterator/go; do
  rm -rf "vendor/github.com/$lib"
  cp -r "/usr/share/gocode/src/github.com/$lib" "vendor/github.com/$lib"
done

progress "compiling $WHAT with $(go version | cut -d' ' -f3) (progress every 30 s)"
# GOPROXY=off: everything is vendored. kube's make keeps Go's build cache under _output (removed with the
# tree). kubelet is built with cgo (glibc-dynamic, as upstream builds it); the others are static.
GOPROXY=off GOPATH="$BUILD/.go" make WHAT="$WHAT" &
MAKE_PID=$!
while kill -0 "$MAKE_PID" 2>/dev/null; do
  sleep 30
  kill -0 "$MAKE_PID" 2>/dev/null && progress "still compiling ($(ls _output/bin 2>/dev/null | tr '\n' ' '))"
done
wait "$MAKE_PID"

# The pod sandbox's process: upstream's pause.c, static (no registry serves k8s.gcr.io/pause here).
gcc -Os -static -DVERSION="$VERSION" -o _output/bin/pause build/pause/linux/pause.c

for name in ${WHAT//cmd\//} pause; do
  cp "_output/bin/$name" "$CACHE_DIR/$name.tmp"
  mv "$CACHE_DIR/$name.tmp" "$CACHE_DIR/$name"
done
echo "$WHAT pause" >"$STAMP"
progress "built and cached in $CACHE_DIR ($(du -sm --exclude=build "$CACHE_DIR" | cut -f1) MB); build directory removed"
