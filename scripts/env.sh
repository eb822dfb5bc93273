#!/usr/bin/env bash
# One engine's environment (its venv, or its build), stamped and idempotent: bash scripts/env.sh ENGINE [ARGS...]
# runs conformance/engines/ENGINE/env.sh. A failure exits non-zero with a message, never a silent skip.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENGINE="${1:?usage: bash scripts/env.sh ENGINE [ARGS...]}"
shift
[ -f "$REPO/conformance/engines/$ENGINE/env.sh" ] || { echo "env.sh: no engine '$ENGINE'" >&2; exit 2; }
exec bash "$REPO/conformance/engines/$ENGINE/env.sh" "$@"
