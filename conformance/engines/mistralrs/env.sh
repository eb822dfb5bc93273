#!/usr/bin/env bash
# Build the venvs the mistral.rs stage runs in: mistralrs 0.9.5 (the certified engine) and mistralrs 0.6.0 (the
# last release with draft-model speculation, kept for its recorded finding). Both are prebuilt wheels.
#
#   bash scripts/env.sh mistralrs [VENV_DIR [VENV_DIR_060]]   # default <repo>/.venv-mistralrs, <repo>/.venv-mistralrs-060
#
# The venvs see the system site-packages (numpy and this repository, installed editable there by the README's
# command), so the worker imports specdec_ref and conformance; pip installs into the venv only (the system python
# is never touched; no torch is involved). Invariant: each venv imports its pinned mistralrs. A stamp file per venv
# records the versions; when it matches, nothing is installed (idempotent). Any failure exits non-zero with a named
# message: a missing engine fails the stage, never a skip.
#
# Environment: PYTHON (the project's python, default python3), MISTRALRS_NICE (default 10).
set -euo pipefail

VERSION=0.9.5
OLD_VERSION=0.6.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
VENV="${1:-$REPO/.venv-mistralrs}"
VENV_OLD="${2:-$REPO/.venv-mistralrs-060}"
SYS_PY="${PYTHON:-python3}"
NICE="${MISTRALRS_NICE:-10}"

ENV_NAME=mistralrs
ENV_INCOMPLETE="a venv is incomplete"
source "$REPO/scripts/env_lib.sh"

require_project_python numpy

check() {  # check VENV VERSION
    "$1/bin/python" - "$2" <<'EOF' || die "version/import check failed in $1"
import importlib.metadata as md
import sys
want = sys.argv[1]
got = md.version("mistralrs")
if got != want:
    sys.exit(f"mistralrs {got} is not {want}")
import mistralrs  # noqa: F401
import specdec_ref, specdec_properties, conformance  # noqa: E401,F401
print(f"env.sh mistralrs: mistralrs {got} in {sys.prefix}")
EOF
}

build() {  # build VENV VERSION
    local venv=$1 version=$2 stamp="$1/.specdec-mistralrs-stamp" want="mistralrs=$2 python=$PYV" start
    if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        echo "env.sh mistralrs: $venv is up to date ($want); skipping the install"
        check "$venv" "$version"
        return 0
    fi
    start=$(date +%s)
    echo "env.sh mistralrs: building $venv ($want)"
    rm -f "$stamp"
    [ -x "$venv/bin/python" ] || "$SYS_PY" -m venv --system-site-packages "$venv" || die "python -m venv $venv failed"
    nice -n "$NICE" "$venv/bin/python" -m pip --disable-pip-version-check install --only-binary mistralrs \
        "mistralrs==$version" || die "pip install mistralrs==$version (a prebuilt wheel) failed"
    check "$venv" "$version"
    echo "$want" > "$stamp"
    echo "env.sh mistralrs: $venv done in $(( $(date +%s) - start )) s"
}

build "$VENV" "$VERSION"
build "$VENV_OLD" "$OLD_VERSION"
