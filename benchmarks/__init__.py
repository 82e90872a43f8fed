"""Benchmarks that run on the device, command lines over harness/probes.py and the versions:
the ceilings (ceilings.py), every version compared in one interleaved run
(compare_versions.py), V3's kernels beside PyTorch's (bench_kernels.py: time per call;
host_overhead.py: host time per call; backward_ops.py: what each backward runs;
codegen.py: the compiled code, on any CPU), the rows every published number comes from
(experiments.py) and their reproduction (reproduce.sh)."""
