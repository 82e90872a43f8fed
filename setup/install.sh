#!/usr/bin/env bash
# Create .venv (if missing) and install the workshop into it.
#
#   setup/install.sh          runtime: torch (kept if present), numpy, pandas, matplotlib
#   setup/install.sh test     also pytest, notebook runner, and triton for CPU interpreter tests
#
# Rules (never break a GPU install):
#  * .venv sees the system's site-packages, so a ROCm/CUDA torch (and ROCm's
#    pytorch-triton-rocm) installed from the PyTorch index is used as it is.
#  * torch is installed only when none is importable: TORCH_SPEC (default
#    torch==2.13.0, a CPU wheel on the workshop's CPU machines) from
#    TORCH_INDEX_URL if set (e.g. https://download.pytorch.org/whl/rocm6.4).
#  * triton is installed only when none is importable.
set -euo pipefail
cd "$(dirname "$0")/.."
extra="${1:-}"
PY="${PYTHON:-python3}"
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
    echo "[install] creating $VENV (with system site-packages, so an existing torch is kept)"
    "$PY" -m venv --system-site-packages "$VENV"
fi
VPY="$VENV/bin/python"
pip_install() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }

if "$VPY" -c 'import torch, sys; v = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]); sys.exit(v < (2, 4))' 2>/dev/null; then
    echo "[install] keeping torch $("$VPY" -c 'import torch; print(torch.__version__)')"
else
    spec="${TORCH_SPEC:-torch==2.13.0}"
    echo "[install] no torch >= 2.4 importable: installing $spec"
    if [ -n "${TORCH_INDEX_URL:-}" ]; then pip_install "$spec" --index-url "$TORCH_INDEX_URL"
    else pip_install "$spec"; fi
fi

isolation=()
"$VPY" -c 'import setuptools' 2>/dev/null && isolation=(--no-build-isolation)
pip_install "${isolation[@]}" -e ".${extra:+[$extra]}"

if [ "$extra" = "test" ] && ! "$VPY" -c 'import triton' 2>/dev/null; then
    echo "[install] no triton importable: installing triton (CPU interpreter tests)"
    pip_install triton
fi
touch "$VENV/.installed${extra:+-$extra}"
echo "[install] done: $("$VPY" -c 'import torch; print("torch", torch.__version__)')"
