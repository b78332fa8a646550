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
#   bash scripts/gpu/run-h200.sh spin-selftest OUTDIR     # the hang drill's kernel alone (seconds)
#   bash scripts/gpu/run-h200.sh cost OUTDIR [ARGS]       # open-loop cost, R against N (1.1B; --shape)
#   bash scripts/gpu/run-h200.sh cost-hang OUTDIR [ARGS]  # the cost, then a real GPU hang on R
#   bash scripts/gpu/run-h200.sh hang OUTDIR [ARGS]       # the hang alone
#
# cost, cost-hang and hang end by FLIGHTREC_GPU_END_BY (epoch seconds; default 570 s from their
# start): set it at the start of a command that stages and unpacks first.
# Results: OUTDIR/gpu-tier-<phase>.json, plus the ends of the sidecar's and each vLLM's log.
set -euo pipefail
cd "$(dirname "$0")/../.."
SITE=${FLIGHTREC_GPU_SITE:-/tmp/site}
WORK=${FLIGHTREC_GPU_WORK:-/tmp/flightrec-gpu-tier}
PY=${PYTHON:-python3}

need_site() {  # a fresh machine has none: each call's machine is the last one only while warm
    if [ ! -d "$SITE/vllm" ]; then
        echo "no vLLM bundle unpacked in $SITE on this machine (a fresh one?): stage both parts and unpack again" >&2
        exit 3
    fi
}

case "${1:-}" in
stage)
    mkdir -p /tmp/stage && cp "$2" /tmp/stage/ && ls -la /tmp/stage
    ;;
unpack)
    mkdir -p "$SITE"
    cat /tmp/stage/part.* | xz -d -T0 | tar -C "$SITE" -xf -
    PYTHONPATH="$SITE" "$PY" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
    ;;
spin-selftest)
    mkdir -p "$2"
    # bounded: a kernel that ignored its release would still end at its own limit (32 s)
    PYTHONPATH="$SITE" timeout -k 5 60 "$PY" scripts/gpu/probe/flightrec_spin.py --selftest --out "$2/spin-selftest.json"
    ;;
cost | cost-hang | hang)
    need_site
    out=$2
    mkdir -p "$out"
    end_by=${FLIGHTREC_GPU_END_BY:-$(($(date +%s) + 570))}
    case "$1" in cost) phases=(cost) ;; cost-hang) phases=(cost hang) ;; hang) phases=(hang) ;; esac
    # the script's own watchdog ends it 3 s before end_by; timeout is the backstop
    PYTHONUNBUFFERED=1 PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" timeout -k 5 $((end_by - $(date +%s) + 10)) \
        "$PY" scripts/gpu/vllm_gpu_cost_hang.py --phases "${phases[@]}" --out "$out" --work "$WORK" --site "$SITE" \
        --end-by "$end_by" "${@:3}"
    ;;
recorder | fault)
    need_site
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
    need_site
    mkdir -p "$2"
    PYTHONUNBUFFERED=1 PYTHONPATH="$SITE" "$PY" scripts/gpu/profile_recorder.py --out "$2" --py-spy "$3" --site "$SITE" "${@:4}"
    ;;
*)
    sed -n '2,/^set /p' "$0" | sed '$d'
    exit 2
    ;;
esac
