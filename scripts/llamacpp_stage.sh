#!/usr/bin/env bash
# The llama.cpp stage of CI: certify llama-server (llama.cpp vendored in llama-cpp-python 0.3.36) from its outputs
# and compare with what is recorded.
#
#   bash scripts/llamacpp_stage.sh [OUT_DIR]        # default <repo>/out/llamacpp
#
# 1. builds (or reuses) llama-server in the versioned cache outside the clone (scripts/llamacpp_env.sh; only a new
#    machine pays the ~6 minute build) and the GGUF writer;
# 2. writes the GGUF files of the exactly-known checkpoints and checks the server's probabilities against the
#    tables (conformance.engines.gguf_export, then python -m conformance.engines.llamacpp --check-gguf);
# 3. engine tests (engine_tests/test_llamacpp.py): conventions (EOS returned, ignore_eos bans EOS, top-k keeps
#    exactly k, the lowest-ids law on every row the matrix reaches), the findings (-md without --spec-type
#    silently ignored; top-k ties are not the lowest ids in general; llama-speculative aborts with -np 4), the
#    exactly-known EAGLE-3 head and MTP block drafting their law's tokens request by request; its reduced matrix
#    run is left to the full matrix below;
# 4. the black-box matrix (python -m conformance.engines llamacpp --check-expected) against
#    conformance/engines/expected/llamacpp-0.3.36.json, and its verdict table.
# The stage fails when our tooling errors, the engine is missing or unbuildable, or a verdict differs from the
# recorded one -- never because llama.cpp is NOT CERTIFIED where that is what is recorded. Every llama-server the
# stage started is stopped at exit, on failure too (the runner also kills each worker's process group).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/out/llamacpp}"
PY="${PYTHON:-python3}"
cd "$REPO"
mkdir -p "$OUT"
stage_start=$(date +%s)
step() { echo; echo "=== llama.cpp stage: $* ($(( $(date +%s) - stage_start )) s)"; }

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
        sleep 1
        kill -9 $pids 2>/dev/null || true
    fi
    [ $rc -eq 0 ] || echo "llamacpp_stage.sh: FAILED (exit $rc) after $(( $(date +%s) - stage_start )) s" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "environment"
bash scripts/llamacpp_env.sh

step "GGUF files and their logits against the tables"
"$PY" -m conformance.engines.gguf_export
"$PY" -m conformance.engines.gguf_heads  # the EAGLE-3 head, its deep target, the qwen35 target with its MTP block
"$PY" -m conformance.engines.llamacpp --check-gguf | tee "$OUT/gguf-check.txt"

step "engine tests (the GGUF check, conventions, findings, per-seed identity on long requests)"
"$PY" -m pytest engine_tests/test_llamacpp.py -q -p no:cacheprovider -k "not reduced_matrix"  # the full matrix follows

step "the black-box matrix"
t0=$(date +%s)
# --jobs 2: two workers (each one -t 1 server) at a time: 323 s wall against 596 s of workers one after another
"$PY" -m conformance.engines llamacpp --out "$OUT/matrix" --check-expected --jobs 2
echo "matrix: $(( $(date +%s) - t0 )) s"

step "verdict table"
cat "$OUT/matrix/verdicts.md"
step "done: every verdict is the one recorded for llama.cpp (llama-cpp-python 0.3.36)"
