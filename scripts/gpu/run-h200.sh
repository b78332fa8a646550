#!/usr/bin/env bash
# The GPU tier on a GPU machine whose Python has torch 2.11 (CUDA 13) but no vLLM: vLLM 0.26.0 and
# its missing dependencies come as a bundle of two parts (scripts/gpu/README.md says how to build
# it), each small enough for one copy onto the machine.
#
#   bash scripts/gpu/run-h200.sh stage PART        # copy one part of the bundle to /tmp/stage
#   bash scripts/gpu/run-h200.sh unpack            # unpack the staged parts into /tmp/site
#   bash scripts/gpu/run-h200.sh recorder OUTDIR   # phases 1 and 2 (about 8 minutes on an H200)
#   bash scripts/gpu/run-h200.sh fault OUTDIR      # phase 3 (about 2 minutes)
#   bash scripts/gpu/run-h200.sh profile OUTDIR PY_SPY   # sampled stacks, R against N (4 minutes)
#
# Results: OUTDIR/gpu-tier-<phase>.json, plus the ends of the sidecar's and each vLLM's log.
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=${FLIGHTREC_GPU_SITE:-/tmp/site}
WORK=${FLIGHTREC_GPU_WORK:-/tmp/flightrec-gpu-tier}
PY=${PYTHON:-python3}

case "${1:-}" in
stage)
    mkdir -p /tmp/stage && cp "$2" /tmp/stage/ && ls -la /tmp/stage
    ;;
unpack)
    mkdir -p "$SITE"
    cat /tmp/stage/part.* | xz -d -T0 | tar -C "$SITE" -xf -
    PYTHONPATH="$SITE" "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    ;;
recorder | fault)
    out=$2
    mkdir -p "$out"
    set +e
    PYTHONUNBUFFERED=1 PYTHONPATH="$SITE" "$PY" scripts/gpu/vllm_gpu_tier.py --phase "$1" --out "$out" \
        --work "$WORK" --site "$SITE" "${@:3}"
    rc=$?
    set -e
    for f in "$WORK/$1"/sidecar.log "$WORK/$1"/vllm-*.log; do
        [ -f "$f" ] && tail -c 3000000 "$f" > "$out/$(basename "$f")"
    done
    exit $rc
    ;;
profile)
    mkdir -p "$2"
    PYTHONUNBUFFERED=1 PYTHONPATH="$SITE" "$PY" scripts/gpu/profile_recorder.py --out "$2" --py-spy "$3" --site "$SITE" "${@:4}"
    ;;
*)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
