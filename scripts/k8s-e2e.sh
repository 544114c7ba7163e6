#!/usr/bin/env bash
# End-to-end check of fleetserve on a real Kubernetes cluster (kind, or k3d with CLUSTER_TOOL=k3d).
#
# NOT RUN IN CI: the machines where fleetserve is developed have no Docker daemon and no cluster, so this
# script has never run there; tests/k8s/test_e2e_script.py only checks it with `bash -n`.
#
# What it does:
#   1. creates a cluster (kind or k3d) and loads the fleetserve image into it;
#   2. installs KEDA and the Prometheus operator CRDs from their upstream manifests; Karpenter is SKIPPED
#      (it needs a cloud provider: kind nodes cannot be provisioned), so the example Endpoint has no
#      placement and no NodePool is rendered;
#   3. applies `fleetserve render k8s --install` (CRD, RBAC, operator Deployment, webhook);
#   4. applies an example Endpoint (built-in engine, tiny model, CPU) and waits for DeploymentComplete;
#   5. sends one OpenAI chat completion through the router with the `openai` client;
#   6. deletes the Endpoint and checks that its children are gone.
#
# Needs: docker, kind (or k3d), kubectl, openssl, python with fleetserve[k8s] and openai installed, and the
# image ghcr.io/fleetserve/fleetserve:0.1.0 built locally:
#   podman build -f container/Containerfile -t ghcr.io/fleetserve/fleetserve:0.1.0 .   (or docker build)
#
# Usage: scripts/k8s-e2e.sh            KEEP=1 keeps the cluster; CLUSTER_TOOL=k3d uses k3d.
set -euo pipefail

CLUSTER=${CLUSTER:-fleetserve-e2e}
CLUSTER_TOOL=${CLUSTER_TOOL:-kind}
IMAGE=${IMAGE:-ghcr.io/fleetserve/fleetserve:0.1.0}
KEDA_VERSION=${KEDA_VERSION:-v2.20.2}
PROM_OPERATOR_VERSION=${PROM_OPERATOR_VERSION:-v0.93.0}
NS=${NS:-e2e}
NAME=${NAME:-smollm2}
FLEETSERVE=${FLEETSERVE:-fleetserve}
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)

log() { printf '\n== %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }

cleanup() {
  if [[ "${KEEP:-0}" != 1 ]]; then
    log "deleting cluster $CLUSTER"
    if [[ "$CLUSTER_TOOL" == k3d ]]; then k3d cluster delete "$CLUSTER" || true
    else kind delete cluster --name "$CLUSTER" || true; fi
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in docker kubectl openssl "$CLUSTER_TOOL" "$FLEETSERVE" "$PYTHON"; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

log "1. cluster ($CLUSTER_TOOL) and image"
if [[ "$CLUSTER_TOOL" == k3d ]]; then
  k3d cluster create "$CLUSTER" --wait
  k3d image import "$IMAGE" --cluster "$CLUSTER"
else
  kind create cluster --name "$CLUSTER" --wait 120s
  kind load docker-image "$IMAGE" --name "$CLUSTER"
fi

log "2. KEDA $KEDA_VERSION, Prometheus operator CRDs $PROM_OPERATOR_VERSION (Karpenter skipped: no cloud provider)"
kubectl apply --server-side -f \
  "https://github.com/kedacore/keda/releases/download/${KEDA_VERSION}/keda-${KEDA_VERSION#v}.yaml"
kubectl apply --server-side -f \
  "https://github.com/prometheus-operator/prometheus-operator/releases/download/${PROM_OPERATOR_VERSION}/stripped-down-crds.yaml"
kubectl -n keda rollout status deployment/keda-operator --timeout=300s

log "3. the operator: fleetserve render k8s --install"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -keyout "$WORK/tls.key" -out "$WORK/tls.crt" \
  -subj /CN=webhook -addext "subjectAltName=DNS:fleetserve-operator.fleetserve-system.svc" 2>/dev/null
kubectl create namespace fleetserve-system
kubectl -n fleetserve-system create secret tls fleetserve-operator-webhook-tls \
  --cert="$WORK/tls.crt" --key="$WORK/tls.key"
"$FLEETSERVE" render k8s --install -o "$WORK/install" --image "$IMAGE" --webhook-ca-bundle "$WORK/tls.crt"
kubectl apply -f "$WORK/install"
kubectl -n fleetserve-system rollout status deployment/fleetserve-operator --timeout=300s

log "4. an Endpoint (built-in engine, the SmolLM2-135M demo model, CPU)"
kubectl create namespace "$NS"
kubectl -n "$NS" create secret generic "$NAME-internal" \
  --from-literal=token="$(openssl rand -hex 32)" --from-literal=admin-token="$(openssl rand -hex 32)"
cat > "$WORK/endpoint.yaml" <<YAML
apiVersion: fleetserve.io/v1
kind: Endpoint
metadata: {name: $NAME, namespace: $NS}
spec:
  model: {name: smollm2, source: "builtin:smollm2-135m"}
  replicas: 1
  metrics: {enabled: false}
YAML
kubectl apply -f "$WORK/endpoint.yaml"
for _ in $(seq 1 120); do
  state=$(kubectl -n "$NS" get endpoints.fleetserve.io "$NAME" -o jsonpath='{.status.state}' 2>/dev/null || true)
  echo "state: ${state:-<none>}"
  [[ "$state" == DeploymentComplete ]] && break
  [[ "$state" == DeploymentFailed ]] && { kubectl -n "$NS" get endpoints.fleetserve.io "$NAME" -o yaml; die "failed"; }
  sleep 5
done
[[ "$state" == DeploymentComplete ]] || die "no DeploymentComplete after 10 minutes"
kubectl -n "$NS" get endpoints.fleetserve.io "$NAME" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}{"\n"}{end}'

log "5. one OpenAI request through the router"
kubectl -n "$NS" port-forward "service/$NAME-router" 18080:8080 >"$WORK/port-forward.log" 2>&1 &
PF=$!
sleep 3
"$PYTHON" - <<'PY'
from openai import OpenAI

client = OpenAI(base_url="http://127.0.0.1:18080/v1", api_key="unused")
reply = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hello"}], max_tokens=8)
assert reply.choices[0].message is not None, reply
print("reply:", reply.choices[0].message.content, "| usage:", reply.usage)
PY
kill "$PF"

log "6. delete the Endpoint; its children must go"
kubectl -n "$NS" delete endpoints.fleetserve.io "$NAME" --wait=true --timeout=120s
for _ in $(seq 1 24); do
  left=$(kubectl -n "$NS" get deployments,services,statefulsets,poddisruptionbudgets,scaledobjects \
    -l "fleetserve.io/endpoint=$NAME" -o name 2>/dev/null || true)
  [[ -z "$left" ]] && break
  sleep 5
done
[[ -z "$left" ]] || die "children left after delete: $left"
log "PASS"
