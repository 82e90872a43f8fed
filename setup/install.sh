#!/usr/bin/env bash
# Create .venv (if missing) and install the workshop into it.
#
#   setup/install.sh          runtime: torch (kept if present), triton (kept if present),
#                             numpy, pandas, matplotlib: what every version needs
#   setup/install.sh test     the same, plus pytest and the notebook runner
#
# Rules (never break a GPU install):
#  * .venv sees the system's site-packages, so a ROCm/CUDA torch (and ROCm's
#    pytorch-triton-rocm) installed from the PyTorch index is used as it is.
#  * torch is installed only when none is importable: TORCH_SPEC (default
#    torch==2.13.0, a CPU wheel on the workshop's CPU machines) from
#    TORCH_INDEX_URL if set (e.g. https://download.pytorch.org/whl/rocm6.4).
#  * triton is installed only when none is importable (V3 needs it everywhere: on a
#    GPU it compiles the kernels, on a CPU it runs them in its interpreter).
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

if ! "$VPY" -c 'import triton' 2>/dev/null; then
    echo "[install] no triton importable: installing triton (V3's kernels; the interpreter on a CPU)"
    pip_install triton
fi
# DeepSpeed's FLOPS profiler (`--profile deepspeed`): the `profile` extra, installed with a
# constraint that pins the importable torch, so pip can only keep it, never upgrade or replace
# it. The pin is safe only where pip sees that same torch (its metadata names the version that
# imports); otherwise DeepSpeed is left out. DS_BUILD_OPS=0: the sdist compiles no ops.
if ! "$VPY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("deepspeed") is None)'; then
    pin="$VENV/torch-pin.txt"
    if "$VPY" -c 'import importlib.metadata as m, torch, sys; sys.exit(m.version("torch") != torch.__version__)' 2>/dev/null; then
        "$VPY" -c 'import torch; print("torch==" + torch.__version__)' >"$pin"
        echo "[install] installing DeepSpeed (--profile deepspeed) with $(cat "$pin") pinned"
        DS_BUILD_OPS=0 pip_install "${isolation[@]}" -c "$pin" -e ".[profile]" ||
            { echo "[install] DeepSpeed did not install: --profile deepspeed stays unavailable" >&2
              [ "$extra" != "test" ] || exit 1; }
    else
        echo "[install] pip does not see the importable torch: not installing DeepSpeed, which could replace it"
    fi
fi
touch "$VENV/.installed${extra:+-$extra}"
echo "[install] done: $("$VPY" -c 'import torch; print("torch", torch.__version__)')"
echo "[install] run scripts with .venv/bin/python, or first: source .venv/bin/activate"
