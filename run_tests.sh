#!/usr/bin/env bash
# The one test command: installs what is missing, then runs the whole suite with pytest.
#
#   ./run_tests.sh            # everything this machine can run
#   ./run_tests.sh -k nvfp4   # extra arguments go to pytest
#
# Without a GPU it runs the CPU suite: reference numerics, scale-factor layouts, can_implement,
# and cross-compilation of every kernel configuration for sm_100f / sm_100a / sm_90a with PTX and
# SASS checks.
# On a B200/GB200 or B300/GB300 (sm_100, sm_103) it adds the Blackwell GPU suite; on an H100/H200
# (sm_90) the Hopper GPU suite.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

# torch: never reinstall over a user's (CUDA) build; install one only when none is importable.
if ! "$PY" -c "import torch; torch.float4_e2m1fn_x2; torch.float8_e8m0fnu" 2>/dev/null; then
  if "$PY" -c "import torch" 2>/dev/null; then
    echo "run_tests.sh: the installed torch lacks float4_e2m1fn_x2 / float8_e8m0fnu; torch>=2.8 is needed" >&2
    exit 2
  fi
  echo "run_tests.sh: installing torch==2.13.0"
  "$PY" -m pip install -q torch==2.13.0
fi
# This checkout as the installed package (editable: the tests import it as users do), with the
# test tools and the Hugging Face extra (pyproject.toml; a no-op when all is there already).
"$PY" -m pip install -q -e ".[test,hf]"

# Which GPU suite runs: the Blackwell GPUs are the kernel's own list (the same one its CLI and the
# tests' skip conditions use); the Hopper one is sm_90.
read -r family gpu < <("$PY" - <<'PYEOF'
import torch
if not torch.cuda.is_available():
    print("none none")
else:
    from blockwise_gemm_fp4 import BLACKWELL_CAPABILITIES
    cap = torch.cuda.get_device_capability()
    family = "blackwell" if cap in BLACKWELL_CAPABILITIES else "hopper" if cap == (9, 0) else "other"
    print(family, f"{torch.cuda.get_device_name()} (sm_{cap[0]}{cap[1]})")
PYEOF
)
case "$family" in
  blackwell) suite="CPU suite + Blackwell GPU suite" ;;
  hopper) suite="CPU suite + Hopper GPU suite" ;;
  none) suite="CPU suite only (the GPU tests skip: no CUDA device)" ;;
  *) suite="CPU suite only (the GPU tests skip: $gpu is neither datacenter Blackwell nor sm_90)" ;;
esac
echo "run_tests.sh: GPU: $gpu -> running the $suite"
exec "$PY" -m pytest tests -ra "$@"
