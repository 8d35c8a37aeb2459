#!/usr/bin/env bash
# The user journey on a real cluster, by hand (not part of `make test`): install the chart, apply a
# Topic, produce and consume through the client Service, read the Topic's status, uninstall.
#
#   KUBECONFIG=~/.kube/config IMAGE=registry.example.com/shale:0.1.0 e2e/journey.sh
#
# Needs kubectl, helm (3.14+ or 4), an image the cluster can pull, and Shale's venv (`make test` or
# `make demo` creates .venv) for the Topic checker (see e2e/README.md).
# KEEP=1 leaves everything installed (also after a failure) for a look around.
set -euo pipefail

IMAGE=${IMAGE:-shale:0.1.0}
NAMESPACE=${NAMESPACE:-shale-e2e}
RELEASE=${RELEASE:-shale}
TOPIC=${TOPIC:-e2e-prices}
KEEP=${KEEP:-0}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}
CHART=${CHART:-$ROOT/helm/shale}
HELM_FLAGS=${HELM_FLAGS:-}

step() { printf '\n== %s\n' "$*"; }
server_version() { kubectl version -o json | "$PYTHON" -c 'import json, sys; v = json.load(sys.stdin)["serverVersion"]; print(v["major"] + "." + v["minor"])'; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }
k() { kubectl -n "$NAMESPACE" "$@"; }
# Waits until the Topic is Ready for its current generation and prints its status (pykube-ng, from KUBECONFIG).
check() { "$PYTHON" -m shale.operator.topic_check -n "$NAMESPACE" --interval 2 "$@"; }

diagnose() {
    step "diagnostics"
    k get all,topics,pvc,configmaps -o wide || true
    k describe topics || true
    k logs -l app.kubernetes.io/instance="$RELEASE",app.kubernetes.io/component=operator --tail=100 || true
    k logs -l app.kubernetes.io/instance="$RELEASE",app.kubernetes.io/component=storage --tail=50 --prefix || true
}

cleanup() {
    local rc=$?
    if [ "$rc" -ne 0 ]; then diagnose; fi
    if [ "$KEEP" = 1 ]; then
        echo "KEEP=1: left release $RELEASE in namespace $NAMESPACE"
        exit "$rc"
    fi
    step "uninstall"
    k delete topics --all --wait --timeout=120s || true          # while the operator runs: it removes its finalizers
    helm uninstall "$RELEASE" -n "$NAMESPACE" --wait || true
    k delete pvc -l app.kubernetes.io/instance="$RELEASE" --wait=false || true
    kubectl delete namespace "$NAMESPACE" --wait=false || true
    exit "$rc"
}
trap cleanup EXIT

command -v kubectl >/dev/null || fail "kubectl not found"
command -v helm >/dev/null || fail "helm not found"
"$PYTHON" -c "import shale.operator.topic_check" || fail "no Shale venv at $PYTHON: run make test (or set PYTHON)"
kubectl version >/dev/null || fail "no cluster: set KUBECONFIG"

step "helm install $RELEASE ($IMAGE) into namespace $NAMESPACE"
repository=${IMAGE%:*}
tag=${IMAGE##*:}
# The journey's client speaks PLAINTEXT: security (on by default, docs/kubernetes.md "Security") is off here.
# shellcheck disable=SC2086  # HELM_FLAGS is a list of flags
helm install "$RELEASE" "$CHART" -n "$NAMESPACE" --create-namespace $HELM_FLAGS \
    --set image.repository="$repository" --set image.tag="$tag" \
    --set security.enabled=false --set networkPolicy.enabled=false --wait --timeout 5m
kubectl wait --for condition=Established crd/topics.shale.dev --timeout=60s
service=$(k get service -l app.kubernetes.io/instance="$RELEASE",shale.dev/service=client -o jsonpath='{.items[0].metadata.name}')
port=$(k get service "$service" -o jsonpath='{.spec.ports[?(@.name=="kafka")].port}')
bootstrap="$service.$NAMESPACE.svc:$port"
echo "bootstrap: $bootstrap"

step "apply Topic $TOPIC and wait for Ready"
k apply -f - <<YAML
apiVersion: shale.dev/v1alpha1
kind: Topic
metadata: {name: $TOPIC}
spec:
  partitions: 3
  config: {cleanup.policy: compact, segment.ms: "100", min.cleanable.dirty.ratio: "0.01"}
YAML
check "$TOPIC" --timeout 180
k get topics

step "a partition decrease and an unknown config key are refused"
if out=$(k patch topic "$TOPIC" --type=merge -p '{"spec":{"partitions":2}}' 2>&1); then
    # An API server before 1.25 does not run the CRD's validation rules (CEL): the operator refuses the
    # change instead, with the same message, in the Topic's Ready condition (reason NotSupported).
    echo "accepted by the API server (no CEL rules: Kubernetes $(server_version)); the operator must refuse it"
    if out=$(check "$TOPIC" --timeout 60 2>&1); then
        fail "partitions 3 -> 2 was accepted by the API server and by the operator"
    fi
    k patch topic "$TOPIC" --type=merge -p '{"spec":{"partitions":3}}'
    check "$TOPIC" --timeout 120 >/dev/null
fi
grep -q "cannot be decreased from 3 to 2" <<<"$out" || fail "unexpected refusal: $out"
echo "refused: $out"
if out=$(k apply -f - 2>&1 <<YAML
apiVersion: shale.dev/v1alpha1
kind: Topic
metadata: {name: $TOPIC}
spec: {partitions: 3, config: {cleanup.policy: compact, retention.msec: "1000"}}
YAML
); then
    fail "an unknown config key was accepted"
fi
# Server-side field validation (1.25+) names the whole path; kubectl's own schema check, before it, the key.
grep -Eq 'unknown field "(spec\.config\.)?retention\.msec"' <<<"$out" || fail "unexpected refusal: $out"
echo "refused: $out"

step "produce 10 keys x 10 updates and consume them back through $bootstrap"
k run e2e-client --image="$IMAGE" --restart=Never --rm -i --quiet \
    --env BOOTSTRAP="$bootstrap" --env TOPIC="$TOPIC" --command -- python -c "$(cat "$HERE/client.py")"

step "status: 100 records over 3 partitions, cleaning reported"
check "$TOPIC" --min-end-offsets 100 --timeout 300
k get topics -o wide
[ "$(k get topic "$TOPIC" -o jsonpath='{.status.conditions[?(@.type=="CleaningStuck")].status}')" = False ] \
    || fail "CleaningStuck is not False"

step "delete the Topic: the operator removes it from the nodes and drops its finalizer"
k delete topic "$TOPIC" --wait --timeout=120s
k get configmap -l app.kubernetes.io/instance="$RELEASE" -o jsonpath='{.items[0].data}' | grep -q "$TOPIC" \
    && fail "the topic's manifest is still in the topics ConfigMap"

step "journey passed"
