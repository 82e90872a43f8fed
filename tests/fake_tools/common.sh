# Shared by the fake profilers in bin/: tests put bin/ first on PATH, so the
# wrappers run these instead of the real tools. Each fake
#   * appends its command line to $FAKE_LOG (one line: tool name + %q-quoted args),
#   * writes the files the real tool would write, at the real paths, copied
#     from tests/fixtures/profilers/,
#   * runs the application after "--" when FAKE_RUN_APP=1 and returns its exit code,
#   * exits with CODE when FAKE_FAIL=<tool>:<CODE> names it (a crashing tool),
#   * presses Ctrl-C when FAKE_CTRL_C=<tool> names it: SIGINT to its whole process
#     group, as a terminal does (run the wrapper in a session of its own).
set -euo pipefail
FIXTURES="$(cd "$(dirname "${BASH_SOURCE[0]}")/../fixtures/profilers" && pwd)"
FAKE_NAME="$(basename "$0")"

{ printf '%s' "$FAKE_NAME"; printf ' %q' "$@"; printf '\n'; } >>"${FAKE_LOG:-/dev/null}"

fake_fail_if_asked() {
    if [[ "${FAKE_CTRL_C:-}" == "$FAKE_NAME" ]]; then
        kill -INT 0
    fi
    if [[ "${FAKE_FAIL:-}" == "$FAKE_NAME:"* ]]; then
        echo "$FAKE_NAME (fake): failing on request" >&2
        exit "${FAKE_FAIL#*:}"
    fi
}

app_after_dashdash() {  # sets APP to the words after the first "--"
    APP=()
    local seen=0 word
    for word in "$@"; do
        if ((seen)); then APP+=("$word"); elif [[ "$word" == -- ]]; then seen=1; fi
    done
}

run_app_if_asked() {
    if [[ "${FAKE_RUN_APP:-0}" == 1 && ${#APP[@]} -gt 0 ]]; then
        "${APP[@]}"
    fi
}

option_value() {  # option_value NAME ARGS...: the word after NAME (empty if absent)
    local name=$1 prev=""
    shift
    for word in "$@"; do
        [[ "$word" == -- ]] && break
        if [[ "$prev" == "$name" ]]; then echo "$word"; return; fi
        prev=$word
    done
}
