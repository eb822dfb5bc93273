#!/usr/bin/env bash
# The device-dependent checks on a CUDA machine, one summary table (see scripts/gpu_check.py, docs/gpu.md).
# Usage: scripts/gpu_check.sh [--dry-run] [--json PATH]; exit 0 all rows passed, 1 a row failed, 2 no CUDA.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exec "${PYTHON:-python}" scripts/gpu_check.py "$@"
