# Shared by the benchmark scripts (sourced): errors in one line, a command line written back as one line, and the
# machine and source a measurement was taken on.
# shellcheck shell=bash disable=SC2034  # date, commit and machine are read by the scripts that source this file

# die MESSAGE: "SCRIPT: error: MESSAGE" on stderr, exit status 1.
die() {
    echo "$(basename "$0"): error: $*" >&2
    exit 1
}

# need_value "$@" (in an option loop, $1 the option): dies unless a value follows it.
need_value() {
    (($# >= 2)) || die "$1 needs a value (see --help)"
}

# run_logged ERRFILE CMD...: runs CMD with its stderr in ERRFILE; when it fails, dies with CMD's error line (kvgen's
# "kvgen: error: ..."), or the last line it wrote.
run_logged() {
    local err=$1 rc=0
    shift
    "$@" 2>"$err" || rc=$?
    ((rc == 0)) && return 0
    die "$(basename "$1") failed (exit status $rc): $(grep -m 1 'error:' "$err" || tail -n 1 "$err")"
}

# words ARGS...: the arguments as one line a shell reads back, quoted only where needed.
words() {
    local a line=()
    for a; do
        if [[ $a =~ ^[A-Za-z0-9_./,:=+@%-]+$ ]]; then line+=("$a"); else line+=("'${a//\'/\'\\\'\'}'"); fi
    done
    echo "${line[*]}"
}

# run_context ROOT [CPUINFO]: sets date (UTC), commit (short, -dirty with local changes) and machine (CPU model,
# CPUs, memory, the CPU flags kvgen's kernels use; CPUINFO: /proc/cpuinfo unless given).
# note: each field is read by a sed that stops at its first match, not sed | head: a container on a large host lists
# hundreds of CPUs there, and head leaving early killed sed with SIGPIPE, which pipefail and set -e made a silent exit.
run_context() {
    local root=$1 cpuinfo=${2:-/proc/cpuinfo} cpu have f flags=() mem_gib
    date=$(date -u '+%Y-%m-%d %H:%M UTC')
    commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) || commit=unknown
    [[ $commit != unknown ]] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null && commit+=-dirty
    cpu=$(sed -n '/^model name[[:space:]]*: /{s///p;q}' "$cpuinfo" 2>/dev/null) || cpu=""
    have=" $(sed -n '/^flags[[:space:]]*: /{s///p;q}' "$cpuinfo" 2>/dev/null || true) "
    for f in avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni; do [[ $have == *" $f "* ]] && flags+=("$f"); done
    mem_gib=$(awk '/^MemTotal:/ {printf "%.0f", $2 / 1048576}' /proc/meminfo 2>/dev/null || true)
    machine="${cpu:-$(uname -m)}, $(nproc) CPUs${mem_gib:+, $mem_gib GiB}; CPU flags: ${flags[*]:-none of avx2, avx512f, avx512_vnni}"
}
