# The part every engine environment shares, sourced by conformance/engines/ENGINE/env.sh once it has set ENV_NAME
# (and ENV_INCOMPLETE, what a failure leaves incomplete):
#   die MESSAGE               exit 1 with "env.sh ENGINE: ERROR: MESSAGE"
#   is_current PY STAMP WANT  the interpreter exists and the stamp file records WANT (nothing to install)
# and at exit a failure says so, with its line and what is incomplete.
die() { echo "env.sh $ENV_NAME: ERROR: $*" >&2; exit 1; }
is_current() { [ -x "$1" ] && [ -f "$2" ] && [ "$(cat "$2")" = "$3" ]; }
trap 'rc=$?; [ $rc -eq 0 ] || echo "env.sh $ENV_NAME: FAILED (exit $rc) at line $LINENO; ${ENV_INCOMPLETE:-}" >&2' EXIT
