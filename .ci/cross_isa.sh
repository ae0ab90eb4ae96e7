#!/usr/bin/env bash
# The CPU kernels (src/linattn/ops/native/native.c and every op's src/linattn/ops/*/kernels.c, on
# the shared headers ops/native/common.h, ahead.h and tiles.h) in every vector form they can be
# built in, not only the one -march=native picks on this machine:
#   1. x86-64: compile as a shared library (as linattn._cbuild does) for AVX-512 (+bf16), AVX2,
#      the SSE2 baseline, the scalar form (-DLA_W=1) and -march=native -fopenmp; -Wall, warnings
#      shown, only errors fail. (OpenMP: the kernels' own splitting, la_parallel in common.h;
#      the other forms build its one-thread fallback.)
#   2. x86-64: build the harnesses tests/c/native_harness.c (the linear-attention kernels) and
#      tests/c/delta_harness.c (the gated delta rule), each against a naive double reference, in
#      each of those forms this CPU can run (avx512f/avx512_bf16/avx2 in /proc/cpuinfo) and
#      -march=native -fopenmp under AddressSanitizer + UBSan, and run them. CROSS_ISA_FULL=1 adds widths
#      forced wider than the ISA (-DLA_W=16 on AVX2, -DLA_W=8 on SSE2: legal, slow to build).
#   3. aarch64: cross-compile the shared library (aarch64-linux-gnu-gcc -O3 -march=armv8-a, NEON
#      and -DLA_W=1), and build the harness statically in both forms and run them under
#      qemu-aarch64. The cross compiler and qemu-user come from Debian (installed here when
#      missing, as root, when apt works); where they cannot be had this part prints SKIP and
#      does not fail.
# Builds and harness runs go in parallel (one job per core). Prints PASS, FAIL
# and SKIP lines; exits non-zero on any FAIL.
#
#   bash .ci/cross_isa.sh        (CROSS_ISA_NO_INSTALL=1: never run apt-get; CROSS_ISA_FULL=1)
set -uo pipefail
cd "$(dirname "$0")/.."
# the library's sources (as linattn.ops.native joins them; a kernels.c includes its kernels_*.c
# parts) and every harness tests/c/*_harness.c:
# an op that adds kernels and a harness needs no line here
SRC=(src/linattn/ops/native/native.c src/linattn/ops/*/kernels.c)
HARNESSES=(tests/c/*_harness.c)
CC=${CC:-cc}
XCC=${XCC:-aarch64-linux-gnu-gcc}
JOBS=$(nproc 2>/dev/null || echo 2)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/linattn-isa.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failures=0
t_all=$SECONDS
pass() { echo "PASS: $*"; }
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
skip() { echo "SKIP: $*"; }

# Builds: queue KIND NAME CC FLAGS... (KIND lib: the sources as a shared library; KIND exe: the
# harness). They run in the background, at most $JOBS at once; report waits for them and prints
# the outcome of each in the order queued.
QUEUED=()
queue() {
    local kind=$1 name=$2 cc=$3
    shift 3
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    QUEUED+=("$kind:$name")
    echo "$cc $*" >"$WORK/$kind-$name.cmd"
    if [ "$kind" = lib ]; then
        ( "$cc" "$@" -Wall -fPIC -shared -o "$WORK/lib-$name.so" "${SRC[@]}" -lm \
            >"$WORK/$kind-$name.log" 2>&1; echo $? >"$WORK/$kind-$name.rc" ) &
    else  # every harness, built with the same flags: exe-NAME-HARNESS
        ( rc=0
          for h in "${HARNESSES[@]}"; do
              "$cc" "$@" -Wall -o "$WORK/exe-$name-$(basename "$h" .c)" "$h" -lm \
                  >>"$WORK/$kind-$name.log" 2>&1 || rc=$?
          done
          echo $rc >"$WORK/$kind-$name.rc" ) &
    fi
}
report() {
    wait
    local item kind name nw
    for item in "${QUEUED[@]}"; do
        kind=${item%%:*} name=${item#*:}
        if [ "$(cat "$WORK/$kind-$name.rc")" = 0 ]; then
            if [ "$kind" = lib ]; then
                nw=$(grep -c 'warning:' "$WORK/$kind-$name.log")
                pass "compile $name ($(cat "$WORK/$kind-$name.cmd")): $nw warnings"
                [ "$nw" = 0 ] || sed 's/^/    /' "$WORK/$kind-$name.log" | head -40
            fi
        else
            fail "$([ "$kind" = lib ] && echo compile || echo "build harness") $name ($(cat "$WORK/$kind-$name.cmd"))"
            sed 's/^/    /' "$WORK/$kind-$name.log" | head -60
        fi
    done
    QUEUED=()
}

# Harness runs: run_harness NAME [RUNNER] (RUNNER: e.g. qemu-aarch64) runs a harness built by
# queue in the background (at most $JOBS at once); finish_runs waits and prints each outcome.
RUNS=()
run_harness() {
    local name=$1 runner=${2:-}
    [ "$(cat "$WORK/exe-$name.rc")" = 0 ] || return 0 # its build failed: reported already
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    RUNS+=("$name")
    ( t0=$SECONDS rc=0
      for h in "${HARNESSES[@]}"; do
          $runner "$WORK/exe-$name-$(basename "$h" .c)" >>"$WORK/run-$name.out" 2>&1 || rc=$?
      done
      echo "$rc $((SECONDS - t0))" >"$WORK/run-$name.rc" ) &
}
finish_runs() {
    wait
    local name rc secs
    for name in "${RUNS[@]}"; do
        read -r rc secs <"$WORK/run-$name.rc"
        if [ "$rc" = 0 ]; then
            pass "harnesses $name ($(cat "$WORK/exe-$name.cmd"); run ${secs} s): $(grep '^PASS' "$WORK/run-$name.out" | sed 's/^PASS: //' | paste -sd ';' -)"
        else
            fail "harness $name ($(cat "$WORK/exe-$name.cmd")): exit $rc"
            sed 's/^/    /' "$WORK/run-$name.out" | tail -40
        fi
    done
    RUNS=()
}

echo "== cross_isa: x86-64 ($($CC --version | head -1), $JOBS build jobs)"
t0=$SECONDS
X86_AVX512=(-O3 -mavx512f -mavx512bf16 -mavx512vl -mavx512bw -mfma)
X86_AVX2=(-O3 -mavx2 -mfma)
X86_SSE2=(-O3)
X86_SCALAR=(-O3 -DLA_W=1)
X86_NATIVE=(-O3 -march=native -fno-math-errno -fopenmp) # what linattn.ops.native builds first
if [ "$(uname -m)" = x86_64 ]; then
    flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
    has() { grep -qw "$1" <<<"$flags"; }
    can_avx512=0 can_avx2=0
    has avx512f && has avx512_bf16 && has avx512vl && has avx512bw && has fma && can_avx512=1
    has avx2 && has fma && can_avx2=1
    queue lib avx512 "$CC" "${X86_AVX512[@]}"
    queue lib avx2 "$CC" "${X86_AVX2[@]}"
    queue lib sse2 "$CC" "${X86_SSE2[@]}"
    queue lib scalar "$CC" "${X86_SCALAR[@]}"
    queue lib native "$CC" "${X86_NATIVE[@]}"
    [ $can_avx512 = 1 ] && queue exe avx512 "$CC" "${X86_AVX512[@]}"
    [ $can_avx2 = 1 ] && queue exe avx2 "$CC" "${X86_AVX2[@]}"
    queue exe sse2 "$CC" "${X86_SSE2[@]}"
    queue exe scalar "$CC" "${X86_SCALAR[@]}"
    queue exe native-asan-ubsan "$CC" -O1 -march=native -fopenmp -g -fno-omit-frame-pointer \
        -fsanitize=address,undefined -fno-sanitize-recover=undefined
    if [ "${CROSS_ISA_FULL:-0}" = 1 ]; then
        [ $can_avx2 = 1 ] && queue exe avx2-w16 "$CC" "${X86_AVX2[@]}" -DLA_W=16 -Wno-psabi
        queue exe sse2-w8 "$CC" "${X86_SSE2[@]}" -DLA_W=8 -Wno-psabi
    fi
    report
    if [ $can_avx512 = 1 ]; then
        run_harness avx512
    else
        skip "harness avx512: this CPU lacks avx512f/avx512_bf16/avx512vl/avx512bw"
    fi
    if [ $can_avx2 = 1 ]; then
        run_harness avx2
    else
        skip "harness avx2: this CPU lacks avx2/fma"
    fi
    run_harness sse2
    run_harness scalar
    run_harness native-asan-ubsan
    if [ "${CROSS_ISA_FULL:-0}" = 1 ]; then
        [ $can_avx2 = 1 ] && run_harness avx2-w16
        run_harness sse2-w8
    fi
    finish_runs
else
    skip "x86-64 part: this machine is $(uname -m)"
fi
echo "  (x86-64 part: $((SECONDS - t0)) s)"

echo "== cross_isa: aarch64"
t0=$SECONDS
have_cross() { command -v "$XCC" >/dev/null && command -v qemu-aarch64 >/dev/null; }
if ! have_cross; then
    if [ "${CROSS_ISA_NO_INSTALL:-0}" = 1 ]; then
        echo "  (CROSS_ISA_NO_INSTALL=1: not installing the cross tools)"
    elif [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "  (no cross tools, and not root with apt-get: cannot install them)"
    else
        echo "  installing gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user (apt-get)"
        ti=$SECONDS
        if timeout 180 apt-get update -qq >"$WORK/apt.log" 2>&1 \
            && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq \
                --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user \
                >>"$WORK/apt.log" 2>&1; then
            echo "  (apt-get update + install: $((SECONDS - ti)) s)"
        else
            echo "  apt-get failed after $((SECONDS - ti)) s; its last lines:"
            tail -5 "$WORK/apt.log" | sed 's/^/    /'
        fi
    fi
fi
if have_cross; then
    A64=(-O3 -march=armv8-a)
    queue lib aarch64-neon "$XCC" "${A64[@]}"
    queue lib aarch64-scalar "$XCC" "${A64[@]}" -DLA_W=1
    queue exe aarch64-neon "$XCC" "${A64[@]}" -static
    queue exe aarch64-scalar "$XCC" "${A64[@]}" -static -DLA_W=1
    report
    if "$XCC" -static -o "$WORK/hello" -x c - <<<'int main(void){return 0;}' 2>/dev/null \
            && qemu-aarch64 "$WORK/hello"; then
        run_harness aarch64-neon qemu-aarch64
        run_harness aarch64-scalar qemu-aarch64
        finish_runs
    else
        skip "aarch64 harness: qemu-aarch64 cannot run a static aarch64 binary here"
    fi
else
    skip "aarch64 part: no $XCC / qemu-aarch64 (Debian: gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
fi
echo "  (aarch64 part: $((SECONDS - t0)) s)"

if [ "$failures" = 0 ]; then
    echo "PASS: cross_isa ($((SECONDS - t_all)) s in all)"
else
    echo "FAIL: cross_isa: $failures failed ($((SECONDS - t_all)) s in all)"
    exit 1
fi
