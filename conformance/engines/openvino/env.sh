#!/usr/bin/env bash
# Build the two venvs of the OpenVINO GenAI stage.
#
#   bash scripts/env.sh openvino [RUNTIME_VENV [EXPORT_VENV]]   # defaults <repo>/.venv-openvino, <repo>/.venv-ov-export
#
# 1. RUNTIME (.venv-openvino): torch==$TORCH_VERSION (the CPU wheel, pinned first), openvino-genai==$GENAI_VERSION
#    (with the openvino and openvino-tokenizers it pins), this repository editable under a constraints file that
#    holds torch, so `import openvino_genai, specdec_ref, conformance` works in one interpreter (the engine worker).
#    A venv of its own rather than the system python: the project's python is left exactly as the README installs it.
# 2. EXPORTER (.venv-ov-export): optimum-intel==$OPTIMUM_INTEL_VERSION with transformers==$EXPORT_TF_VERSION (what it
#    needs: our pyproject allows >=5.19 only, so the project is NOT installed there), torch==$TORCH_VERSION (pinned, or
#    pip pulls a CUDA build), openvino / openvino-tokenizers at the runtime's version, no torchvision (transformers
#    imports it when present and it cannot load against torch+cpu). Only `optimum-cli export openvino` runs there.
#
# Invariant: each venv has a stamp file with the versions; when it matches, its install is skipped (idempotent).
# Any failure exits non-zero with a message: a missing engine fails the stage, it is never skipped silently.
# Environment: OPENVINO_NICE (default 10; installs run niced on the shared machine).
set -euo pipefail

TORCH_VERSION=2.13.0
GENAI_VERSION=2026.4.1.0
OV_VERSION=2026.4.1            # openvino's version line for genai 2026.4.1.0 (openvino-tokenizers is 2026.4.1.0)
OPTIMUM_INTEL_VERSION=2.2.0
EXPORT_TF_VERSION=5.5.4
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
RUN_VENV="${1:-$REPO/.venv-openvino}"
EXP_VENV="${2:-$REPO/.venv-ov-export}"
NICE="${OPENVINO_NICE:-10}"
PYVER="$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
RUN_WANT="torch=$TORCH_VERSION openvino-genai=$GENAI_VERSION project=editable python=$PYVER"
EXP_WANT="torch=$TORCH_VERSION optimum-intel=$OPTIMUM_INTEL_VERSION transformers=$EXPORT_TF_VERSION openvino=$OV_VERSION python=$PYVER"

ENV_NAME=openvino
ENV_INCOMPLETE="a venv may be incomplete"
source "$REPO/scripts/env_lib.sh"
RUN_WANT+=" project-layout=$(project_layout)"  # the editable install maps the project's installed names

pip_in() {  # pip_in VENV ARGS... (niced)
    local venv=$1
    shift
    nice -n "$NICE" "$venv/bin/python" -m pip --disable-pip-version-check "$@"
}

make_venv() {  # make_venv VENV: a venv with torch==$TORCH_VERSION (CPU) and a constraints file pinning it
    local venv=$1
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv" || die "python3 -m venv $venv failed"
    pip_in "$venv" install "torch==$TORCH_VERSION" || die "pip install torch==$TORCH_VERSION into $venv failed"
    "$venv/bin/python" -c "import torch, sys; sys.exit('+cu' in torch.__version__)" \
        || die "torch in $venv is a CUDA build; expected the CPU wheel"
    echo "torch==$("$venv/bin/python" -c 'import torch; print(torch.__version__)')" > "$venv/specdec-constraints.txt"
}

no_torchvision() {
    pip_in "$1" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
}

check_runtime() {
    "$RUN_VENV/bin/python" - "$GENAI_VERSION" "$TORCH_VERSION" <<'EOF' || die "version/import check failed in $RUN_VENV"
import importlib.metadata as md, sys
want_genai, want_torch = sys.argv[1], sys.argv[2]
v = {n: md.version(n) for n in ("torch", "openvino", "openvino-genai", "openvino-tokenizers", "transformers")}
print(" | ".join(f"{k} {x}" for k, x in v.items()))
if "+cu" in v["torch"] or not v["torch"].startswith(want_torch):
    sys.exit(f"torch {v['torch']} is not the CPU wheel {want_torch}")
if v["openvino-genai"] != want_genai:
    sys.exit(f"openvino-genai {v['openvino-genai']} is not {want_genai}")
import openvino_genai, specdec_ref, specdec_properties, conformance  # noqa: E401,F401
print("import openvino_genai, specdec_ref, conformance: ok")
EOF
}

check_export() {
    "$EXP_VENV/bin/python" - "$OPTIMUM_INTEL_VERSION" "$EXPORT_TF_VERSION" "$TORCH_VERSION" <<'EOF' || die "version/import check failed in $EXP_VENV"
import importlib.metadata as md, sys
want_oi, want_tf, want_torch = sys.argv[1:4]
v = {n: md.version(n) for n in ("torch", "transformers", "optimum-intel", "openvino", "openvino-tokenizers")}
print(" | ".join(f"{k} {x}" for k, x in v.items()))
if "+cu" in v["torch"] or not v["torch"].startswith(want_torch):
    sys.exit(f"torch {v['torch']} is not the CPU wheel {want_torch}")
if v["optimum-intel"] != want_oi or v["transformers"] != want_tf:
    sys.exit(f"optimum-intel {v['optimum-intel']} / transformers {v['transformers']}: want {want_oi} / {want_tf}")
try:
    md.version("torchvision")
    sys.exit("torchvision is installed in the exporter venv; it cannot load against torch+cpu")
except md.PackageNotFoundError:
    pass
import optimum.intel, openvino_tokenizers  # noqa: E401,F401
print("import optimum.intel, openvino_tokenizers: ok")
EOF
    [ -x "$EXP_VENV/bin/optimum-cli" ] || die "$EXP_VENV/bin/optimum-cli missing"
}

# ---------------------------------------------------------------- 1. the runtime venv
if is_current "$RUN_VENV/bin/python" "$RUN_VENV/.specdec-openvino-stamp" "$RUN_WANT"; then
    echo "env.sh openvino: $RUN_VENV is up to date ($RUN_WANT)"
else
    start=$(date +%s)
    echo "env.sh openvino: building $RUN_VENV ($RUN_WANT)"
    rm -f "$RUN_VENV/.specdec-openvino-stamp"
    make_venv "$RUN_VENV"
    C="$RUN_VENV/specdec-constraints.txt"
    pip_in "$RUN_VENV" install -c "$C" "openvino-genai==$GENAI_VERSION" || die "pip install openvino-genai==$GENAI_VERSION failed"
    pip_in "$RUN_VENV" install -c "$C" -e "$REPO" || die "pip install -e $REPO into $RUN_VENV failed"
    no_torchvision "$RUN_VENV"
    check_runtime
    echo "$RUN_WANT" > "$RUN_VENV/.specdec-openvino-stamp"
    echo "env.sh openvino: $RUN_VENV built in $(( $(date +%s) - start )) s"
fi
check_runtime

# ---------------------------------------------------------------- 2. the exporter venv
if is_current "$EXP_VENV/bin/python" "$EXP_VENV/.specdec-ov-export-stamp" "$EXP_WANT"; then
    echo "env.sh openvino: $EXP_VENV is up to date ($EXP_WANT)"
else
    start=$(date +%s)
    echo "env.sh openvino: building $EXP_VENV ($EXP_WANT)"
    rm -f "$EXP_VENV/.specdec-ov-export-stamp"
    make_venv "$EXP_VENV"
    C="$EXP_VENV/specdec-constraints.txt"
    OVT="$("$RUN_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("openvino-tokenizers"))')"
    OVR="$("$RUN_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("openvino"))')"
    echo "transformers==$EXPORT_TF_VERSION" >> "$C"
    echo "openvino==$OVR" >> "$C"
    echo "openvino-tokenizers==$OVT" >> "$C"
    pip_in "$EXP_VENV" install -c "$C" "optimum-intel==$OPTIMUM_INTEL_VERSION" "transformers==$EXPORT_TF_VERSION" \
        "openvino==$OVR" "openvino-tokenizers==$OVT" \
        || die "pip install optimum-intel==$OPTIMUM_INTEL_VERSION transformers==$EXPORT_TF_VERSION failed"
    no_torchvision "$EXP_VENV"
    check_export
    echo "$EXP_WANT" > "$EXP_VENV/.specdec-ov-export-stamp"
    echo "env.sh openvino: $EXP_VENV built in $(( $(date +%s) - start )) s"
fi
check_export
echo "env.sh openvino: ok"
