# Shared by the end-to-end test scripts (sourced): a temporary folder, pass/fail counters and the two checks.
# shellcheck shell=bash
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0 passed=0

pass() { passed=$((passed + 1)); }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error NAME PATTERN CMD...: exit status 1, stdout empty, stderr exactly one line "kvgen: error: ..."
# containing PATTERN.
expect_error() {
    local name=$1 pattern=$2
    shift 2
    local rc=0
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
    if [[ $rc -ne 1 ]]; then fail "$name: exit status $rc, expected 1 ($(head -c 300 "$tmp/err"))"; return; fi
    if [[ -s $tmp/out ]]; then fail "$name: wrote to stdout"; return; fi
    if [[ $(wc -l <"$tmp/err") -ne 1 ]]; then fail "$name: stderr is not one line: $(cat "$tmp/err")"; return; fi
    if ! grep -q -- "^kvgen\(-synth\)\?: error: .*$pattern" "$tmp/err"; then
        fail "$name: stderr '$(cat "$tmp/err")' lacks '$pattern'"
        return
    fi
    pass
}

expect_ok() {  # expect_ok NAME PATTERN CMD...: exit 0 and PATTERN in stdout
    local name=$1 pattern=$2
    shift 2
    local rc=0
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null || rc=$?
    if [[ $rc -ne 0 ]]; then fail "$name: exit status $rc: $(head -c 300 "$tmp/err")"; return; fi
    if ! grep -q -- "$pattern" "$tmp/out"; then fail "$name: output lacks '$pattern'"; return; fi
    pass
}

finish() {  # the summary line; the exit status says whether everything passed
    echo "$passed passed, $failures failed"
    [[ $failures -eq 0 ]]
}
