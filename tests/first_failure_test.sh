#!/usr/bin/env bash
# The name a test binary leaves in KVGEN_TEST_FIRST_FAILURE (tests/first_failure.h), and the spec scripts/gpu-check.sh
# makes of it to rerun that case alone (scripts/lib/catch_spec.sh).
# usage: first_failure_test.sh KVGEN_TESTS SOURCE_DIR
set -euo pipefail
tests=$1
# shellcheck source=../scripts/lib/catch_spec.sh source-path=SCRIPTDIR
source "$2/scripts/lib/catch_spec.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
want="first_failure.h's fixture, which fails on purpose: a name with a comma, [brackets], \\ \"quotes\" and *"

if KVGEN_TEST_FIRST_FAILURE=$tmp/first "$tests" "[first-failure]" >"$tmp/out" 2>&1; then
    fail "the fixture passed"
fi
[[ $(cat "$tmp/first") == "$want" ]] || fail "first failure: '$(cat "$tmp/first")', expected '$want'"

# The spec selects the fixture alone (hidden cases are listed when named), and running it fails it again.
listed=$("$tests" "$(catch_spec "$want")" --list-test-names-only | grep -v '^$' || true)
[[ $listed == "$want" ]] || fail "the spec $(catch_spec "$want") lists: '$listed'"
! "$tests" "$(catch_spec "$want")" >/dev/null 2>&1 || fail "the fixture passed when run by its spec"

# A run with no failure leaves the file empty.
KVGEN_TEST_FIRST_FAILURE=$tmp/first "$tests" "[half]" >/dev/null
[[ ! -s $tmp/first ]] || fail "a passing run left '$(cat "$tmp/first")'"
echo "first_failure: ok"
