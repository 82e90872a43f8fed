"""Benchmarks that run on the device: the ceilings probe (ceilings.py), the
communication probe of data-parallel runs (comm.py), every version compared in
one interleaved run (compare_versions.py), host overhead (host_overhead.py)
and the reproduction of every published number (reproduce.sh)."""
