"""Benchmarks that run on the device, command lines over harness/probes.py and the versions:
the ceilings (ceilings.py), every version compared in
one interleaved run (compare_versions.py), host overhead (host_overhead.py)
and the reproduction of every published number (reproduce.sh)."""
