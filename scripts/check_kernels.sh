#!/usr/bin/env bash
# CI: compile every CUDA kernel for sm_80 and sm_90 and fail on spills, local memory or a
# missed occupancy target.  See scripts/check_kernels.py for the rules.
set -euo pipefail
exec python3 "$(dirname "$0")/check_kernels.py" "$@"
