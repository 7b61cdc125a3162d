#!/usr/bin/env bash
# The one test command: installs what is missing, then runs the whole suite with pytest.
#
#   ./run_tests.sh            # everything this machine can run
#   ./run_tests.sh -k nvfp4   # extra arguments go to pytest
#
# Without a GPU it runs the CPU suite: reference numerics, scale-factor layouts, can_implement,
# and cross-compilation of every kernel configuration for sm_100a / sm_90a with PTX and SASS checks.
# On a B200 (sm_100) it adds the Blackwell GPU suite; on an H100/H200 (sm_90) the Hopper GPU suite.
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
# The rest of requirements.txt (a no-op when everything is there already).
"$PY" -m pip install -q -r requirements.txt

gpu=$("$PY" - <<'PYEOF'
import torch
if torch.cuda.is_available():
    major, minor = torch.cuda.get_device_capability()
    print(f"{torch.cuda.get_device_name()} (sm_{major}{minor})")
else:
    print("none")
PYEOF
)
case "$gpu" in
  *"(sm_100)"*|*"(sm_103)"*) suite="CPU suite + Blackwell GPU suite" ;;
  *"(sm_90)"*) suite="CPU suite + Hopper GPU suite" ;;
  none) suite="CPU suite only (the GPU tests skip: no CUDA device)" ;;
  *) suite="CPU suite only (the GPU tests skip: $gpu is neither sm_100 nor sm_90)" ;;
esac
echo "run_tests.sh: GPU: $gpu -> running the $suite"
exec "$PY" -m pytest tests -ra "$@"
