#!/usr/bin/env bash
# Build the venv the ONNX Runtime GenAI stage runs in: onnxruntime-genai (CPU wheel) and what its model builder
# needs but the wheel does not declare.
#
#   bash scripts/env.sh onnxgenai [VENV_DIR]      # default <repo>/.venv-onnxgenai
#
# onnxruntime-genai==0.18.0 declares only numpy and onnxruntime; its model builder
# (`python -m onnxruntime_genai.models.builder`) also imports onnx, onnx_ir, torch and transformers (a finding:
# without them the builder dies with ModuleNotFoundError). They are declared here, pinned: torch==2.13.0 (the CPU
# wheel; never an unpinned torch, which would pull a multi-GB CUDA build), the transformers of the project's own
# python (never changed). The venv sees the system site-packages (torch, transformers and this repository,
# installed editable there by the README's command), so nothing is downloaded twice and the system python is not
# touched: pip installs into the venv only.
#
# Invariant: the venv imports onnxruntime_genai $ORTG_VERSION, onnx, onnx_ir, torch 2.13.0 (CPU), transformers,
# specdec_ref and conformance. A stamp file records the versions; when it matches, nothing is installed
# (idempotent). Any failure exits non-zero with a named message: a missing engine fails the stage, never a skip.
#
# Environment: PYTHON (the project's python, default python3), ONNXGENAI_NICE (default 10).
set -euo pipefail

ORTG_VERSION=0.18.0
ORT_VERSION=1.32.0                  # onnxruntime: the wheel asks for >=1.31.0; pinned to what was certified
TORCH_VERSION=2.13.0
ONNX_VERSION=1.23.1
ONNX_IR_VERSION=1.0.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${1:-$REPO/.venv-onnxgenai}"
SYS_PY="${PYTHON:-python3}"
NICE="${ONNXGENAI_NICE:-10}"
STAMP="$VENV/.specdec-onnxgenai-stamp"

ENV_NAME=onnxgenai
ENV_INCOMPLETE="the venv at $VENV is incomplete"
source "$REPO/scripts/env_lib.sh"

require_project_python transformers
TF_VERSION="$("$SYS_PY" -c 'import importlib.metadata as m; print(m.version("transformers"))')"
WANT="onnxruntime-genai=$ORTG_VERSION onnxruntime=$ORT_VERSION onnx=$ONNX_VERSION onnx_ir=$ONNX_IR_VERSION torch=$TORCH_VERSION transformers=$TF_VERSION python=$PYV"
PY="$VENV/bin/python"

check() {
    "$PY" - "$ORTG_VERSION" "$TORCH_VERSION" <<'EOF' || die "version/import check failed in $VENV"
import importlib.metadata as md
import sys
want_ortg, want_torch = sys.argv[1], sys.argv[2]
import onnxruntime_genai as og, onnx, onnx_ir, torch, transformers  # noqa: E401
import specdec_ref, specdec_properties, conformance  # noqa: E401,F401
v = {n: md.version(n) for n in ("onnxruntime-genai", "onnxruntime", "onnx", "onnx_ir", "torch", "transformers")}
print("env.sh onnxgenai:", " | ".join(f"{k} {x}" for k, x in v.items()))
if v["onnxruntime-genai"] != want_ortg:
    sys.exit(f"onnxruntime-genai {v['onnxruntime-genai']} is not {want_ortg}")
if "+cu" in v["torch"] or not v["torch"].startswith(want_torch):
    sys.exit(f"torch {v['torch']} is not the CPU wheel {want_torch}")
import onnxruntime_genai.models.builder  # noqa: F401 - the builder's own imports (onnx_ir, torch, transformers)
EOF
}

if is_current "$PY" "$STAMP" "$WANT"; then
    echo "env.sh onnxgenai: $VENV is up to date ($WANT); skipping the install"
    check
    exit 0
fi

start=$(date +%s)
echo "env.sh onnxgenai: building $VENV ($WANT)"
rm -f "$STAMP"
[ -x "$PY" ] || "$SYS_PY" -m venv --system-site-packages "$VENV" || die "python -m venv $VENV failed"
PIP=(nice -n "$NICE" "$PY" -m pip --disable-pip-version-check install)
CONSTRAINTS="$VENV/specdec-constraints.txt"
printf 'torch==%s\ntransformers==%s\n' "$TORCH_VERSION" "$TF_VERSION" > "$CONSTRAINTS"
# what the wheel forgets, pinned (torch and transformers are already satisfied by the system site-packages:
# pip keeps them and downloads nothing; torch is pinned so it can never be replaced by a CUDA build)
"${PIP[@]}" -c "$CONSTRAINTS" "onnxruntime-genai==$ORTG_VERSION" "onnxruntime==$ORT_VERSION" "onnx==$ONNX_VERSION" "onnx_ir==$ONNX_IR_VERSION" \
    "torch==$TORCH_VERSION" "transformers==$TF_VERSION" \
    || die "pip install onnxruntime-genai==$ORTG_VERSION onnxruntime onnx onnx_ir torch transformers failed"
check
echo "$WANT" > "$STAMP"
echo "env.sh onnxgenai: done in $(( $(date +%s) - start )) s"
