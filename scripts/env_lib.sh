# The part every engine environment shares, sourced by conformance/engines/ENGINE/env.sh once it has set ENV_NAME
# (and ENV_INCOMPLETE, what a failure leaves incomplete):
#   die MESSAGE               exit 1 with "env.sh ENGINE: ERROR: MESSAGE"
#   is_current PY STAMP WANT  the interpreter exists and the stamp file records WANT (nothing to install)
#   project_layout            the project's installed names (pyproject.toml's package-dir) as a checksum: a venv
#                             holding an editable install of the project records it in its stamp, since an install
#                             made before those names changed still maps the old ones
#   require_project_python [MODULES]  $SYS_PY exists and imports the project's packages (and MODULES, comma-separated);
#                             sets PYV, its major.minor version
# and at exit a failure says so, with its line and what is incomplete.
die() { echo "env.sh $ENV_NAME: ERROR: $*" >&2; exit 1; }
is_current() { [ -x "$1" ] && [ -f "$2" ] && [ "$(cat "$2")" = "$3" ]; }
require_project_python() {
    command -v "$SYS_PY" >/dev/null || die "'$SYS_PY' not found"
    "$SYS_PY" -c "import specdec_ref, specdec_properties, conformance${1:+, $1}" 2>/dev/null \
        || die "the project's python ($SYS_PY) does not import specdec_ref, specdec_properties, conformance${1:+, $1}: run the README's install command first"
    PYV="$("$SYS_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
}
project_layout() { grep -m1 '^package-dir' "$(dirname "${BASH_SOURCE[0]}")/../pyproject.toml" | cksum | cut -d' ' -f1; }
trap 'rc=$?; [ $rc -eq 0 ] || echo "env.sh $ENV_NAME: FAILED (exit $rc) at line $LINENO; ${ENV_INCOMPLETE:-}" >&2' EXIT
