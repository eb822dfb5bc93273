# The part every engine stage shares, sourced by scripts/stage.sh (never run alone):
#   step "what"          start a step: prints "=== <title> stage: what (N s)" and closes the step before it
#   timed NAME CMD...    run CMD as its own timed sub-step (kept in the summary even when it fails)
# At exit, on failure too: every process the stage started is stopped (ids only: nothing is matched by name), and
# the time of each step is printed and written to $OUT/step-times.txt (the engine-neutral budget CI reads).
# Needs: STAGE_TITLE, OUT.
STAGE_STEPS=()
STAGE_STEP=""
STAGE_STEP_T0=0
stage_start=$(date +%s)

_close_step() {
    if [ -n "$STAGE_STEP" ]; then
        STAGE_STEPS+=("$(( $(date +%s) - STAGE_STEP_T0 ))	$STAGE_STEP")
        STAGE_STEP=""
    fi
}

step() {
    _close_step
    STAGE_STEP="$*"
    STAGE_STEP_T0=$(date +%s)
    echo
    echo "=== $STAGE_TITLE stage: $* ($(( $(date +%s) - stage_start )) s)"
}

timed() {
    local name=$1 t0 rc=0
    shift
    t0=$(date +%s)
    "$@" || rc=$?
    STAGE_STEPS+=("$(( $(date +%s) - t0 ))	  $name (within: $STAGE_STEP)")
    return $rc
}

_descendants() {  # every process below PID $1, deepest first
    local child
    for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        _descendants "$child"
        echo "$child"
    done
}

_stage_exit() {
    local rc=$? pids
    _close_step
    pids="$(_descendants $$ | tr '\n' ' ')"
    if [ -n "${pids// /}" ]; then
        kill $pids 2>/dev/null || true
        sleep 1
        kill -9 $pids 2>/dev/null || true
    fi
    {
        echo "$STAGE_TITLE stage: $(( $(date +%s) - stage_start )) s in all (exit $rc); per step:"
        local line
        for line in "${STAGE_STEPS[@]}"; do
            printf '  %6s s  %s\n' "${line%%	*}" "${line#*	}"
        done
    } | tee "$OUT/step-times.txt"
    [ $rc -eq 0 ] || echo "stage $STAGE_TITLE: FAILED (exit $rc) after $(( $(date +%s) - stage_start )) s" >&2
}
trap _stage_exit EXIT
trap 'exit 130' INT TERM

# The steps most stages share (each engine's stage.sh calls them with its own words):
env_step() {  # env_step ENGINE [ARGS...]: the engine's environment, stamped and idempotent
    step "environment"
    bash "$REPO/scripts/env.sh" "$@"
}
export_step() {  # export_step ENGINE FILE WHAT: its checkpoints written and checked against the tables, kept in $OUT/FILE
    step "$3"
    "$PY" -m conformance.engines export "$1" | tee "$OUT/$2"
}
matrix_step() {  # matrix_step ENGINE_OR_ADAPTER NAME WHAT [RUNNER_ARGS...]: the matrix against the recorded verdicts
    local engine=$1 name=$2
    step "$3"
    shift 3
    "$PY" -m conformance.engines "$engine" --out "$OUT/$name" --check-expected "$@"
}
