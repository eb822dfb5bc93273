#!/usr/bin/env bash
# One engine's CI stage: its venv, its checkpoints and their check, its engine tests, its matrix against what is
# recorded for its version.
#
#   bash scripts/stage.sh ENGINE [OUT_DIR]          # ENGINE: a folder of conformance/engines/; default OUT_DIR out/ENGINE
#
# The steps are the engine's own (conformance/engines/ENGINE/stage.sh, sourced here with REPO, OUT, PY and the
# shared library scripts/stage_lib.sh: step, timed, the cleanup at exit and the step times). A stage fails when our
# tooling errors, the engine is missing or does not install, or a verdict differs from the one recorded -- never
# because an engine is NOT CERTIFIED where that is what is recorded. A missing engine is a failure, never a skip.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE="${1:?usage: bash scripts/stage.sh ENGINE [OUT_DIR]}"
OUT="${2:-$REPO/out/$ENGINE}"
ENGINE_DIR="$REPO/conformance/engines/$ENGINE"
[ -f "$ENGINE_DIR/stage.sh" ] || { echo "stage.sh: no engine '$ENGINE' (no $ENGINE_DIR/stage.sh)" >&2; exit 2; }
PY="${PYTHON:-python3}"
cd "$REPO"
mkdir -p "$OUT"
STAGE_TITLE="$ENGINE"
source "$REPO/scripts/stage_lib.sh"
source "$ENGINE_DIR/stage.sh"
