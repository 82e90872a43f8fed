#!/usr/bin/env bash
# Run GPU benchmark scripts on a lent/remote GPU machine and pack their outputs.
#   bash benchmarks/gpu/run.sh compare v3        (names of benchmarks/gpu/<name>.sh)
#   GPU_LIMIT=300 bash benchmarks/gpu/run.sh analysis   (each script at most 300 s)
# Outputs: $OUT/<name>.tgz (everything the script wrote) and $OUT/<name>.log.
# Only a few files come back from the device machine, so each script's folder is packed.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-$PWD/.device_out}"
mkdir -p "$OUT"
status=0
for name in "$@"; do
    work="/tmp/gpu_bench/$name"
    rm -rf "$work" && mkdir -p "$work"
    echo "=================== $name ($(date -u +%H:%M:%S))"
    start=$SECONDS
    # GPU_LIMIT (seconds) caps each script, so a call stays inside the device's limit.
    OUT_DIR="$work" timeout "${GPU_LIMIT:-590}" bash "benchmarks/gpu/$name.sh" > "$work/$name.log" 2>&1
    rc=$?
    tail -n 40 "$work/$name.log"
    echo "=================== $name: exit $rc after $((SECONDS - start)) s"
    [ $rc -eq 0 ] || status=1
    cp "$work/$name.log" "$OUT/$name.log"
    tar czf "$OUT/$name.tgz" -C "$work" .
done
exit $status
