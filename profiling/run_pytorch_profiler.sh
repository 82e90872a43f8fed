#!/usr/bin/env bash
# PyTorch profiler: a few steps after warm-up, on any device (CPU, CUDA, ROCm).
#
#   profiling/run_pytorch_profiler.sh v1 --preset small
#
# Runs `python tiny_llama_vN.py --profile pytorch --profile-dir OUT ...`
# (profiling/sessions.py) and writes to OUT/pytorch/:
#   <version>.<time>.pt.trace.json  Chrome/Perfetto trace, also TensorBoard's
#                                   format (tensorboard --logdir OUT/pytorch)
#   operators.csv                   time per aten operator (top-N printed)
#   kernel_table.csv                time per GPU kernel (per operator on a CPU)
# PROFILE_MEMORY=1 adds an allocator snapshot (GPU only) for pytorch.org/memory_viz.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

parse_args "$@"
setup pytorch 6
run_step "${APP[@]}" --profile pytorch
expect_output "*.pt.trace.json"
done_line
