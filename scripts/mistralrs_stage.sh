#!/usr/bin/env bash
# The mistral.rs stage of CI: certify mistral.rs 0.9.5 (prebuilt wheel, CPU) from its outputs and compare with what
# is recorded; record 0.6.0 (the last release with draft-model speculation) as it behaves here.
#
#   bash scripts/mistralrs_stage.sh [OUT_DIR]        # default <repo>/out/mistralrs
#
# 1. builds (or reuses) .venv-mistralrs (0.9.5) and .venv-mistralrs-060 (0.6.0) (scripts/mistralrs_env.sh);
# 2. the engine's reported log-probabilities against the tables (the model folders are prepared per session from
#    the shipped checkpoints: a ByteLevel decoder, a verbatim chat template, a plain variant; nothing is cached);
# 3. engine tests (engine_tests/test_mistralrs.py): the findings (head_dim, decoder, seeding, text prompts, the
#    doubled <bos> behind the order2 departure, unstreamed special tokens, n_choices, 0.6.0's SIGILL) and top-k;
# 4. the black-box matrix of 0.9.5 (python -m conformance.engines mistralrs --check-expected) against
#    conformance/engines/expected/mistralrs-0.9.5.json, and its verdict table;
# 5. 0.6.0's draft-model configuration (conformance.engines.mistralrs:ADAPTER_060 --check-expected) against
#    conformance/engines/expected/mistralrs-0.6.0.json, the entry for this CPU (without GFNI: SIGILL at load, engine
#    errors; with GFNI: one token more than asked, and speculating, the greedy completion for every request).
# The stage fails when our tooling errors, an engine is missing or does not install, or a verdict differs from the
# recorded one -- never because the engine is NOT CERTIFIED where that is what is recorded.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/out/mistralrs}"
PY="${PYTHON:-python3}"
VPY="$REPO/.venv-mistralrs/bin/python"
cd "$REPO"
mkdir -p "$OUT"
stage_start=$(date +%s)
times=()
step() { echo; echo "=== mistral.rs stage: $* ($(( $(date +%s) - stage_start )) s)"; }
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
    [ $rc -eq 0 ] || echo "mistralrs_stage.sh: FAILED (exit $rc) after $(( $(date +%s) - stage_start )) s" >&2
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step "environment"
timed env bash scripts/mistralrs_env.sh
[ -x "$VPY" ] || { echo "mistralrs_stage.sh: ERROR: $VPY missing after the env script" >&2; exit 1; }

step "the engine's log-probabilities against the tables"
rc=0; timed logprobs "$VPY" -m conformance.engines.mistralrs check > "$OUT/logprob-check.txt" 2> "$OUT/logprob-check.log" || rc=$?
cat "$OUT/logprob-check.txt"
[ $rc -eq 0 ] || { tail -n 5 "$OUT/logprob-check.log" >&2; echo "mistralrs_stage.sh: ERROR: the log-probability check failed" >&2; exit 1; }

step "engine tests (findings, top-k)"
timed engine-tests "$VPY" -m pytest engine_tests/test_mistralrs.py -q -p no:cacheprovider

step "the black-box matrix (0.9.5)"
timed matrix "$PY" -m conformance.engines mistralrs --out "$OUT/matrix" --check-expected

step "the penalty departure against a model of mistral.rs's penalty order"
"$PY" -m conformance.engines.mistralrs penalty-model "$OUT/matrix/raw/penalty-order/order1/penalty.jsonl"

step "0.6.0's draft-model speculation (recorded)"
timed matrix-060 "$PY" -m conformance.engines conformance.engines.mistralrs:ADAPTER_060 --out "$OUT/matrix-060" \
    --check-expected

step "verdict tables"
cat "$OUT/matrix/verdicts.md"
cat "$OUT/matrix-060/verdicts.md"
echo "step times: ${times[*]}"
step "done: every verdict is the one recorded for mistral.rs 0.9.5 (and 0.6.0)"
