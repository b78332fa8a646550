#!/usr/bin/env bash
# Build a bundle that runs a real vLLM 0.26.0 (plus this project) on a GPU machine whose image has
# Python 3.12 and torch 2.11.0+cu130 but no vLLM (the H200 image of docs/gpu-runs). vLLM 0.20-0.26
# pin torch==2.11.0 and 0.26 is built for CUDA 13: the image's torch serves it as is. Newer vLLM
# pins a newer torch (GBs more to carry).
#
#   bash scripts/gpu/build-vllm-gpu-bundle.sh PROJECT_DIR OUT_DIR
#
# OUT_DIR gets part.aa, part.ab, ... of equal size, each at most 58 MB: with the checkout (about
# 4.5 MB) under the 64 MiB a machine takes per copy (two parts for the bundle of 112.5 MB).
# py-spy comes with it (the hang drill's stacks; the image has none): its wheel carries a static
# binary, which the --target install puts in SITE/bin.
# There: scripts/gpu/run-h200.sh stage PART (each part), then unpack (into /tmp/site), then the
# phases. gpu-image-packages.txt lists what the image already has (left out of the bundle);
# vllm-0.26-runtime-reqs.txt what vLLM's OpenAI server needs at run time.
set -euo pipefail
PROJ=$(cd "$1" && pwd); OUTD=$(mkdir -p "$2" && cd "$2" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux_2_26_x86_64 --platform any)
# py-spy's wheel is tagged manylinux1 / manylinux_2_5 only: its own download, and the install
# below accepts those tags for the wheels it is given (no resolution happens there)
OLD_PLAT=(--platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
python3 -m venv "$W/pip" && "$W/pip/bin/pip" install -q -U pip
PIP="$W/pip/bin/pip"
"$PIP" download -q --no-deps "${PLAT[@]}" -d "$W/vllm" vllm==0.26.0
# runtime dependencies of vLLM's OpenAI server and of this project, with their own dependencies
"$PIP" download -q "${PLAT[@]}" -d "$W/deps" -r "$HERE/vllm-0.26-runtime-reqs.txt" \
    "sqlalchemy>=2.0.25" "alembic>=1.13" "pydantic-settings>=2.2" python-dotenv swagger-ui-bundle
"$PIP" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${OLD_PLAT[@]}" -d "$W/pyspy" "py-spy==0.4.3"
# drop what the GPU image already has (torch, CUDA libraries, numpy, transformers, ...)
HAVE="$HERE/gpu-image-packages.txt"
mkdir -p "$W/keep"
for f in "$W"/deps/*.whl; do
  n=$(basename "$f" | cut -d- -f1 | tr 'A-Z_' 'a-z-')
  case "$n" in torch|triton|nvidia-*|cuda-*) continue;; esac
  grep -qx "$n" "$HAVE" && continue
  cp "$f" "$W/keep/"
done
"$PIP" wheel -q --no-deps -w "$W/proj" "$PROJ"
mkdir -p "$W/site" && (cd "$W/site" && unzip -q "$W"/vllm/vllm-0.26.0-*.whl \
    -x 'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/_moe_C_stable_libtorch.abi3.so' 'vllm/vllm-rs' \
       'vllm/third_party/fmha_sm100/*')   # FA2, MoE kernels, the Rust front end: not used by a dense model on Hopper
"$PIP" install -q --no-deps --no-compile --target "$W/site" "${PLAT[@]}" "${OLD_PLAT[@]}" "$W"/keep/*.whl "$W"/proj/*.whl "$W"/pyspy/*.whl
test -x "$W/site/bin/py-spy"
tar -C "$W/site" -cf - . | xz -T0 -6 > "$W/site.tar.xz"
size=$(stat -c %s "$W/site.tar.xz")
(cd "$OUTD" && rm -f part.* && split -n $(( (size + 57999999) / 58000000 )) "$W/site.tar.xz" part.)
ls -la "$OUTD"
[ ! -e "$OUTD/part.ac" ] || echo "three parts: each is one copy onto the machine (run-h200.sh stage PART), all within its warm window" >&2
