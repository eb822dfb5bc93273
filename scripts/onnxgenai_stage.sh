#!/usr/bin/env bash
# The ONNX Runtime GenAI stage of CI: certify onnxruntime-genai 0.18.0 (CPU) from its outputs and compare with what
# is recorded.
#
#   bash scripts/onnxgenai_stage.sh [OUT_DIR]        # default <repo>/out/onnxgenai
#
# 1. builds (or reuses) .venv-onnxgenai (scripts/onnxgenai_env.sh: the wheel plus what its builder needs and the
#    wheel does not declare);
# 2. converts the exactly-known checkpoints with ORT GenAI's own builder (fp32, cached outside the clone by version
#    and checkpoint hash: ${SPECDEC_CACHE:-~/.cache/specdec-ref}/onnxgenai-0.18.0/) and checks the engine's logits
#    against the tables (bit for bit, whole context and token by token);
# 3. engine tests (engine_tests/test_onnxgenai.py): the findings (undeclared dependencies, --help crash,
#    get_sequence() drops EOS, no ignore_eos), the top-k heap model, the ties case under both tie rules, MTP, n-gram
#    identity;
# 4. the black-box matrix (python -m conformance.engines onnxgenai --check-expected) against
#    conformance/engines/expected/onnxgenai-0.18.0.json, and its verdict table.
# The stage fails when our tooling errors, the engine is missing or does not install, or a verdict differs from the
# recorded one -- never because the engine is NOT CERTIFIED where that is what is recorded.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/out/onnxgenai}"
PY="${PYTHON:-python3}"
VPY="$REPO/.venv-onnxgenai/bin/python"
cd "$REPO"
mkdir -p "$OUT"
stage_start=$(date +%s)
times=()
step() { echo; echo "=== ORT GenAI stage: $* ($(( $(date +%s) - stage_start )) s)"; }
timed() {  # timed NAME CMD...: run, record its seconds
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    "$@" || rc=$?
    times+=("$name: $(( $(date +%s) - t0 )) s")
    return $rc
}

descendants() {  # every process below PID $1, deepest first (ids only: nothing is matched by name)
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        descendants "$child"
        echo "$child"
    done
}
cleanup() {
    local rc=$? pids
    pids="$(descendants $$ | tr '\n' ' ')"
    if [ -n "${pids// /}" ]; then
        kill $pids 2>/dev/null || true
    fi
    [ $rc -eq 0 ] || echo "onnxgenai_stage.sh: FAILED (exit $rc) after $(( $(date +%s) - stage_start )) s" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "environment"
timed env bash scripts/onnxgenai_env.sh
[ -x "$VPY" ] || { echo "onnxgenai_stage.sh: ERROR: $VPY missing after the env script" >&2; exit 1; }

step "conversion (ORT GenAI's builder) and the logits against the tables"
rc=0; timed convert "$VPY" -m conformance.engines.onnxgenai export --check > "$OUT/logit-check.txt" || rc=$?
cat "$OUT/logit-check.txt"
[ $rc -eq 0 ] || { echo "onnxgenai_stage.sh: ERROR: conversion or logit check failed" >&2; exit 1; }

step "engine tests (findings, top-k heap, ties under both rules, MTP, n-gram identity)"
timed engine-tests "$VPY" -m pytest engine_tests/test_onnxgenai.py -q -p no:cacheprovider

step "the black-box matrix"
timed matrix "$PY" -m conformance.engines onnxgenai --out "$OUT/matrix" --check-expected

step "verdict table"
cat "$OUT/matrix/verdicts.md"
"$PY" - "$OUT/matrix/verdicts.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
print("per-configuration worker wall time (s):", ", ".join(f"{n} {c.get('worker_wall_s')}" for n, c in v["configs"].items()))
EOF
echo "step times: ${times[*]}"
step "done: every verdict is the one recorded for ONNX Runtime GenAI 0.18.0"
