#!/usr/bin/env bash
# FLOP counters: count the FLOPs of ONE training step and compare them with
# the analytic model of harness/flops.py.
#
#   profiling/run_flops.sh v1 [--counter flopcounter|deepspeed]
#
#   flopcounter (default) torch.utils.flop_counter.FlopCounterMode, built into
#               PyTorch: matmuls and attention, forward + backward
#   deepspeed   DeepSpeed's FLOPS profiler (the 'profile' extra, which setup/install.sh
#               installs with torch pinned): forward only, elementwise work included
# Writes OUT/<counter>/flops.json (counted, analytic, ratio, per-op counts, notes).
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

COUNTER=flopcounter
tool_option() {
    case "$1" in
        --counter) need_choice "$1" "${2-}" flopcounter deepspeed; COUNTER=$2; TOOL_SHIFT=2 ;;
        *) return 1 ;;
    esac
}
parse_args "$@"
setup "$COUNTER" 6
if [[ "$COUNTER" == deepspeed ]] &&
   ! "$PYTHON_BIN" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("deepspeed") is None)'; then
    skip deepspeed "not found (bash setup/install.sh installs it, keeping torch; never pip --only-binary, which picks a 2020 wheel)"
fi
run_step "${APP[@]}" --profile "$COUNTER"
expect_output "flops.json"
done_line
