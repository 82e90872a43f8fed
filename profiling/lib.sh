# Shared by every profiling/run_*.sh wrapper: arguments, output folders, tool
# checks, the application command, failure reporting. Source it, do not run it.
#
# Every wrapper takes the same arguments:
#   run_X.sh [VERSION] [--preset P] [--num-steps N] [--warmup-steps N] [--out DIR]
#            [--tag NAME] [wrapper options] [-- options for the training script]
#   VERSION    v1 | v2 | v3 | v4 (or the folder name); optional when run from
#              inside a version folder
#   --out DIR  output root (default: <repo>/profiles/<version>); each tool writes
#              to DIR/<tool>/, always as an absolute path
# Options the wrapper does not know are passed to the training script too
# (e.g. --precision bf16), so `-- ` is only needed for names that clash.
#
# A run replaces the previous profile in DIR/<tool>/ only when it succeeds:
# a failed, skipped or interrupted run leaves the previous profile whole and
# keeps its own log as DIR/<tool>.failed.log.
#
# Exit codes: 0 ran, 77 skipped (tool missing or unusable here - the automake
# "skipped" convention), 2 bad arguments, 130 interrupted (Ctrl-C), anything
# else = the profiled run or the tool failed (its own exit code is passed on).

set -euo pipefail

PROFILING_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$PROFILING_DIR/.." && pwd)"
SKIPPED=77

VERSION=""
PRESET=""
NUM_STEPS=""          # each wrapper picks its default (a few steps: profiles stay quick)
WARMUP_STEPS=3
OUT_ROOT=""
TAG=""
APP_ARGS=()
TOOL_SHIFT=0          # set by a wrapper's tool_option() to the words it consumed
PREVIOUS_PROFILE=""   # set once this run has begun (begin_profile)
PUBLISHED=""          # set once it has succeeded (done_line)

die() {  # die CODE MESSAGE: one line on stderr
    echo "error: $2" >&2
    exit "$1"
}

skip() {  # skip TOOL REASON: the one line run_all_profilers.sh collects
    echo "skipped: $1 $2"
    exit "$SKIPPED"
}

need_value() {  # need_value OPTION "${2-}" [WHAT]: an option's value must follow it
    [[ -n "${2:-}" && "$2" != -* ]] || die 2 "$1 needs ${3:-a value}"
}

need_choice() {  # need_choice OPTION "${2-}" CHOICE...: the value must be one of the choices
    local option=$1 value=$2 choice
    shift 2
    for choice in "$@"; do [[ "$value" == "$choice" ]] && return 0; done
    die 2 "$option must be one of: $* (got ${value:-nothing})"
}

usage() {
    sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
    echo "Common options: VERSION (v1..v4) --preset P --num-steps N --warmup-steps N --out DIR --tag NAME -- [training options]"
}

parse_args() {
    # A wrapper may define tool_option "$@": handle its own option, set
    # TOOL_SHIFT to the number of words used, return 0; return 1 if not its own.
    while (($#)); do
        if [[ "$1" == --*=* ]]; then  # --preset=small -> --preset small
            set -- "${1%%=*}" "${1#*=}" "${@:2}"
        fi
        case "$1" in
            -h|--help) usage; exit 0 ;;
            --preset|--num-steps|--warmup-steps|--out|--tag)
                need_value "$1" "${2-}"
                case "$1" in
                    --preset) PRESET=$2 ;;
                    --num-steps) NUM_STEPS=$2 ;;
                    --warmup-steps) WARMUP_STEPS=$2 ;;
                    --out) OUT_ROOT=$2 ;;
                    --tag) TAG=$2 ;;
                esac
                shift 2 ;;
            --) shift; APP_ARGS+=("$@"); break ;;
            *)
                if declare -F tool_option >/dev/null && tool_option "$@"; then
                    shift "$TOOL_SHIFT"
                elif [[ -z "$VERSION" && "$1" != -* ]]; then
                    VERSION=$1; shift
                else
                    APP_ARGS+=("$1"); shift
                fi ;;
        esac
    done
    [[ "$WARMUP_STEPS" =~ ^[0-9]+$ ]] || die 2 "--warmup-steps must be a number (got $WARMUP_STEPS)"
    [[ -z "$NUM_STEPS" || "$NUM_STEPS" =~ ^[0-9]+$ ]] || die 2 "--num-steps must be a number (got $NUM_STEPS)"
}

resolve_version() {
    if [[ -z "$VERSION" ]]; then  # run from inside a version folder?
        case "$(basename "$PWD")" in
            version[1-4]_*) VERSION="$(basename "$PWD")" ;;
            *) die 2 "which version? give v1, v2, v3 or v4 (or run from inside a version folder)" ;;
        esac
    fi
    local n
    case "$VERSION" in
        v[1-4]|[1-4]) n=${VERSION#v} ;;
        version[1-4]_*) n=${VERSION:7:1} ;;
        *) die 2 "unknown version '$VERSION' (use v1, v2, v3 or v4)" ;;
    esac
    VERSION="v$n"
    VERSION_SCRIPT="$(ls "$REPO_ROOT"/version"$n"_*/tiny_llama_v"$n".py 2>/dev/null | head -n 1 || true)"
    [[ -n "$VERSION_SCRIPT" ]] || die 2 "$VERSION is not written yet (no version${n}_*/tiny_llama_v${n}.py)"
}

resolve_python() {
    # $PYTHON if set, else the project's .venv, else python3 - as an absolute
    # path, because profilers start the application themselves.
    local candidate="${PYTHON:-}"
    if [[ -z "$candidate" ]]; then
        if [[ -x "$REPO_ROOT/.venv/bin/python" ]]; then candidate="$REPO_ROOT/.venv/bin/python"
        else candidate=python3; fi
    fi
    PYTHON_BIN="$(command -v "$candidate" || true)"
    [[ -n "$PYTHON_BIN" ]] || die 2 "python not found ($candidate); set PYTHON=/path/to/python"
    export PYTHONPATH="$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
}

setup() {  # setup TOOL DEFAULT_NUM_STEPS: after parse_args; sets TOOL_OUT and APP
    TOOL=$1
    resolve_version
    resolve_python
    NUM_STEPS=${NUM_STEPS:-$2}
    ((NUM_STEPS > WARMUP_STEPS)) || die 2 "--num-steps ($NUM_STEPS) must be above --warmup-steps ($WARMUP_STEPS)"
    OUT_ROOT=${OUT_ROOT:-$REPO_ROOT/profiles/$VERSION}
    mkdir -p "$OUT_ROOT"
    OUT_ROOT="$(cd "$OUT_ROOT" && pwd)"  # profilers change directory: paths must be absolute
    TOOL_OUT="$OUT_ROOT/$TOOL"  # created by run_step: a skipped tool leaves no empty folder
    FAILED_LOG="$(failed_log "$TOOL")"
    TAG=${TAG:-$VERSION${PRESET:+_$PRESET}}
    # The training run itself. Its results JSON goes next to the profile, so
    # a slowed-down profiled run never overwrites results/<version>_*.json.
    APP=("$PYTHON_BIN" "$VERSION_SCRIPT" --num-steps "$NUM_STEPS" --warmup-steps "$WARMUP_STEPS"
         --output "$TOOL_OUT/results.json" --profile-dir "$OUT_ROOT")
    if [[ -n "$PRESET" ]]; then APP+=(--preset "$PRESET"); fi
    APP+=(${APP_ARGS[@]+"${APP_ARGS[@]}"})
}

require_tool() {  # require_tool NAME INSTALL_HINT
    command -v "$1" >/dev/null 2>&1 || skip "$1" "not found ($2)"
}

show() {  # print a command the way a shell accepts it back (quoting only where needed)
    local line="+" word
    for word in "$@"; do
        if [[ "$word" =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $word"
        else line+=" $(printf '%q' "$word")"; fi
    done
    echo "$line"
}

failed_log() {  # failed_log TOOL: where the log of the tool's last unfinished run is kept
    echo "$OUT_ROOT/$1.failed.log"
}

interrupted() {
    echo "interrupted: $TOOL stopped; $TOOL_OUT keeps its previous profile" >&2
    exit 130
}

# The previous profile steps aside (one rename) and this run writes into a fresh
# folder of the final name, so every path it prints and records stays true. Only
# done_line deletes the previous profile; any other exit - a failure, a skip,
# Ctrl-C - removes the partial folder and renames the previous one back.
begin_profile() {
    PREVIOUS_PROFILE="$OUT_ROOT/.$TOOL.previous"
    if [[ -e "$PREVIOUS_PROFILE" ]]; then  # left by a killed run: the one aside is whole,
        rm -rf "$TOOL_OUT"                 # the killed run's folder partial
    elif [[ -e "$TOOL_OUT" ]]; then
        mv "$TOOL_OUT" "$PREVIOUS_PROFILE"
    fi
    mkdir -p "$TOOL_OUT"
    : >"$TOOL_OUT/$TOOL.log"
    trap interrupted INT
    trap 'exit 143' TERM
    trap end_profile EXIT
}

end_profile() {  # the EXIT trap: put the previous profile back unless this run published
    [[ -z "$PUBLISHED" ]] || return 0
    if [[ -s "$TOOL_OUT/$TOOL.log" ]]; then mv -f "$TOOL_OUT/$TOOL.log" "$FAILED_LOG"; fi
    rm -rf "$TOOL_OUT"
    if [[ -e "$PREVIOUS_PROFILE" ]]; then mv "$PREVIOUS_PROFILE" "$TOOL_OUT"; fi
}

publish_profile() {  # this run succeeded: its folder stays, the previous one goes
    PUBLISHED=1
    rm -f "$FAILED_LOG"
    if [[ -e "$PREVIOUS_PROFILE" ]]; then  # renamed first: a half-deleted folder is never
        mv "$PREVIOUS_PROFILE" "$PREVIOUS_PROFILE.discarded-$$"
        rm -rf "$PREVIOUS_PROFILE.discarded-$$"  # taken for the previous profile
    fi
}

run_step() {  # run_step [--to FILE] CMD...: show, run, log; a failure ends the wrapper
    local to=""
    if [[ "$1" == --to ]]; then to=$2; shift 2; fi
    show "$@"
    [[ -n "$PREVIOUS_PROFILE" ]] || begin_profile
    local rc=0 log="$TOOL_OUT/$TOOL.log"
    if [[ -n "$to" ]]; then
        "$@" >"$to" 2>>"$log" || rc=$?   # stdout is data (e.g. a CSV export), not for the screen
    else
        # tee -i outlives Ctrl-C, so the run's last lines still reach the screen and the log
        { "$@" 2>&1 | tee -i -a "$log"; } || rc=$?
    fi
    ((rc != 130)) || interrupted
    if ((rc != 0)); then
        ((rc != SKIPPED)) || rc=1  # 77 means "skipped" to run_all; a failure must not look like it
        echo "error: $TOOL failed (exit $rc) running: $(printf '%q ' "$@")" >&2
        echo "error: log: $FAILED_LOG" >&2
        exit "$rc"
    fi
}

expect_output() {  # expect_output GLOB: the tool must have written a matching file
    if [[ -z "$(find "$TOOL_OUT" -name "$1" -print -quit)" ]]; then
        echo "error: $TOOL exited 0 but wrote no $1 (see $FAILED_LOG)" >&2
        exit 1
    fi
}

kernel_table() {  # kernel_table PATH PARSER: the common kernel table, next to the tool's files
    run_step "$PYTHON_BIN" -m profiling parse "$1" --tool "$2" -o "$TOOL_OUT/kernel_table.csv"
}

detect_backend() {  # rocm | cuda | cpu, as PyTorch sees it (PROFILE_BACKEND overrides)
    if [[ -n "${PROFILE_BACKEND:-}" ]]; then
        echo "$PROFILE_BACKEND"
    else
        "$PYTHON_BIN" -c 'from harness.device import backend; print(backend())' 2>/dev/null || echo cpu
    fi
}

done_line() {  # the wrapper's last line: the run succeeded
    publish_profile
    echo "outputs: $TOOL_OUT"
}
