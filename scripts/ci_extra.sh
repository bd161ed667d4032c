#!/usr/bin/env bash
# What .ci/run runs after the README's test command: the notebooks, and the hardened-input checks.
#
#   0. notebooks: every notebooks/*.ipynb executed top to bottom against the Python module of
#      build/ (the README's build; configured and built here if missing), any error a failure.
#   1. asan: a sanitizer build of everything (g++, AddressSanitizer + UndefinedBehaviorSanitizer,
#      every report fatal, -O1 -g1) in build-asan/, and the whole ctest suite on it.
#   2. fuzz: the libFuzzer harnesses of tests/fuzz/ (clang++-14, ASan + UBSan too) built in
#      build-fuzz/, each run from its seed corpus for a bounded time.
#   3. cuda: the quickstart trained on the emulated cuda device (build/tests/relgrad_emulated, the
#      CUDA kernels in the emulator) and on the CPU, which must reach the same test accuracy, overall
#      and at every length; then every CUDA kernel compiled for sm_90 and assembled by ptxas, its
#      registers, stack frame, spills and shared memory printed (scripts/kernel_resources.py). With
#      `all` it runs on the second core while the fuzzers run.
#
# Every part always runs; any failing build or test, sanitizer report or fuzzer finding fails the
# script at the end. A finding's input is left in build-fuzz/artifacts/<fuzzer>/; replay it with
# `build-fuzz/tests/fuzz/fuzz_<fuzzer> FILE`.
#
# Usage: scripts/ci_extra.sh [all|notebooks|asan|fuzz|cuda]          (default: all)
# Environment:
#   RELGRAD_FUZZ_SECONDS  seconds each fuzzer runs (default 20)
#   RELGRAD_FUZZERS       which fuzzers (default "npy config data tokenizer checkpoint")
#   RELGRAD_JOBS          build parallelism (default 2)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh  # clang-14 and its sanitizer and fuzzer runtimes among them

what=${1:-all}
case "$what" in all | notebooks | asan | fuzz | cuda) ;; *) echo "usage: $0 [all|notebooks|asan|fuzz|cuda]" >&2; exit 2 ;; esac
fuzz_seconds=${RELGRAD_FUZZ_SECONDS:-20}
fuzzers=${RELGRAD_FUZZERS:-"npy config data tokenizer checkpoint"}
jobs=${RELGRAD_JOBS:-2}

section() { echo; echo "==== $* ($(date +%T))"; }
elapsed() { echo "---- $1: $(($(date +%s) - $2)) s"; }

# The sanitizers' defaults already stop at the first report (ASan always; UBSan through
# -fno-sanitize-recover=all) and look for leaks at exit (LeakSanitizer, on by default on Linux;
# no suppression is needed: OpenBLAS, libgomp and libomp keep their memory reachable). On top:
# - strict_string_checks: the C string functions check their whole argument, not only the bytes
#   they read;
# - check_initialization_order: a static initializer that reads another file's global before it
#   is initialized is a report;
# - print_stacktrace: UBSan says where, not only what.
export ASAN_OPTIONS="strict_string_checks=1:check_initialization_order=1"
export UBSAN_OPTIONS="print_stacktrace=1"

run_notebooks() {
    section "notebooks (against build/python)"
    local start
    start=$(date +%s)
    if [ ! -f build/CMakeCache.txt ]; then
        cmake --preset default -DRELGRAD_WARNINGS_AS_ERRORS=ON || return 1
    fi
    cmake --build build -j"$jobs" --target relgrad_python || return 1
    /usr/bin/python3 scripts/run_notebooks.py --build build || return 1
    elapsed "notebooks" "$start"
}

run_asan() {
    section "sanitizer build (build-asan: g++, ASan + UBSan, -O1 -g1)"
    local start
    start=$(date +%s)
    # Debug with -O1: fast enough for the suite, and no -DNDEBUG. -g1: line tables, all a report's
    # stack trace needs (file:line of every frame), at a third less build time than -g (GCC spends
    # it on the debug info of xtensor's and doctest's templates). Benchmarks are run by hand, never
    # by ctest: not built, nor the Python module (an instrumented module would need the sanitizer
    # runtimes preloaded into Python; build/ runs its tests), nor the CUDA backend for nvcc (its
    # kernels run in the suite, on the emulated cuda device). Warnings are not errors here: the README's build already holds them at
    # zero with the flags users build with, and sanitizers make GCC warn falsely
    # (-Wmaybe-uninitialized and the like). Nor MPI: its tests run mpirun and Open MPI's runtime,
    # neither of them instrumented; the README's build runs them, and this one the trainer
    # without MPI, as a build without it trains.
    cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
        -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
        -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DRELGRAD_BUILD_BENCH=OFF \
        -DRELGRAD_PYTHON=OFF -DRELGRAD_CUDA=OFF -DRELGRAD_MPI=OFF || return 1
    cmake --build build-asan -j"$jobs" || return 1
    elapsed "sanitizer build" "$start"

    section "ctest on the sanitizer build"
    start=$(date +%s)
    # Every test runs, none excluded: reference.pytorch's Python starts the instrumented relgrad
    # as a child process (Python itself is not instrumented, nor needs to be), and
    # package.find_package builds an outside project against the installed, instrumented static
    # libraries: LDFLAGS, which CMake reads when it configures that project, links the sanitizer
    # runtimes they need (set for the suite only, never for the configure above). Two tests at a
    # time (each declares two processors: -j$((2 * jobs)) on $jobs cores), their OpenMP threads
    # waiting passively: the sanitized tests are slow, and spinning threads of two tests would
    # take the cores from each other (docs/performance.md); 310 s one at a time, 132 s so.
    local status=0
    OMP_WAIT_POLICY=passive LDFLAGS="-fsanitize=address,undefined" \
        ctest --test-dir build-asan --output-on-failure --timeout 900 -j$((2 * jobs)) || status=1
    elapsed "ctest on the sanitizer build" "$start"
    return $status
}

run_fuzz() {
    section "fuzz build (build-fuzz: clang++-14, libFuzzer + ASan + UBSan)"
    local start
    start=$(date +%s)
    # The libraries and harnesses only: the doctest programs do not compile with clang in C++17
    # (structured bindings captured by lambdas), and build-asan runs them already. -g1 as there.
    cmake -S . -B build-fuzz -DCMAKE_CXX_COMPILER=clang++-14 -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DRELGRAD_FUZZ=ON -DRELGRAD_BUILD_TESTS=OFF \
        -DRELGRAD_BUILD_BENCH=OFF -DRELGRAD_PYTHON=OFF -DRELGRAD_CUDA=OFF -DRELGRAD_MPI=OFF || return 1
    cmake --build build-fuzz -j"$jobs" --target fuzzers || return 1
    elapsed "fuzz build" "$start"

    # One thread: the harnesses set OpenMP's (fuzz_common.hpp); OpenBLAS keeps a pool of its
    # own, held to one too, so that no idle threads compete with the fuzzer for the cores.
    local failed=()
    for name in $fuzzers; do
        section "fuzz_$name for $fuzz_seconds s"
        start=$(date +%s)
        # New inputs go to build-fuzz/corpus/<name>, the first directory (kept between runs on
        # one machine, so fuzzing goes on where it stopped); the committed seeds are only read.
        # -max_len=1000000: the seeds nested 100,000 levels deep must be read whole, and the
        # fuzzer may go deeper. -timeout: one input taking 30 s is a hang, a finding.
        mkdir -p "build-fuzz/corpus/$name" "build-fuzz/artifacts/$name"
        local dict=tests/fuzz/json.dict
        case "$name" in npy | checkpoint) dict=tests/fuzz/npy.dict ;; esac
        if OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "build-fuzz/tests/fuzz/fuzz_$name" \
            -max_total_time="$fuzz_seconds" -max_len=1000000 -timeout=30 -rss_limit_mb=4096 \
            -print_final_stats=1 -dict="$dict" -artifact_prefix="build-fuzz/artifacts/$name/" \
            "build-fuzz/corpus/$name" "tests/fuzz/corpus/$name"; then
            elapsed "fuzz_$name" "$start"
        else
            elapsed "fuzz_$name (FAILED)" "$start"
            failed+=("$name")
        fi
    done
    if [ ${#failed[@]} -gt 0 ]; then
        echo "ci_extra: findings by ${failed[*]}; their inputs:" >&2
        for name in "${failed[@]}"; do ls -l "build-fuzz/artifacts/$name/" >&2; done
        return 1
    fi
}

run_cuda() {
    section "the quickstart on the emulated cuda device and on the CPU"
    local start
    start=$(date +%s)
    if [ ! -x build/tests/relgrad_emulated ]; then
        cmake --preset default -DRELGRAD_WARNINGS_AS_ERRORS=ON || return 1
        cmake --build build -j"$jobs" --target relgrad relgrad_emulated || return 1
    fi
    rm -rf build/quickstart-cpu build/quickstart-cuda
    build/relgrad train --threads 1 --out build/quickstart-cpu || return 1
    build/tests/relgrad_emulated train --device cuda --threads 1 --out build/quickstart-cuda || return 1
    /usr/bin/python3 - <<'EOF' || return 1
import json, sys
cpu, cuda = (json.load(open(f"build/quickstart-{d}/summary.json"))["final"] for d in ("cpu", "cuda"))
pairs = [("all", cpu["accuracy"], cuda["accuracy"])]
pairs += [(n, cpu["by_length"][n]["accuracy"], cuda["by_length"][n]["accuracy"]) for n in cpu["by_length"]]
for name, a, b in pairs:
    print(f"test accuracy, {name}: cpu {a:.4f}, cuda {b:.4f}")
sys.exit(0 if all(abs(a - b) <= 0.01 for _, a, b in pairs) else "the accuracies differ by more than 0.01")
EOF
    elapsed "the quickstart on cuda and on the CPU" "$start"

    section "a CPU program's memory: the CUDA backend is a module opened only for a cuda device"
    local rss_kib
    rss_kib=$(/usr/bin/python3 -c "import resource, subprocess
subprocess.run(['build/relgrad', '--help'], stdout=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)") || return 1  # KiB
    echo "relgrad --help: $((rss_kib / 1024)) MiB of RSS (goal: under 80)"
    [ "$rss_kib" -lt $((80 * 1024)) ] || return 1

    section "the CUDA kernels' resources on sm_90 (nvcc, ptxas)"
    start=$(date +%s)
    /usr/bin/python3 scripts/kernel_resources.py --tensor-cores mma_forward_kernel \
        --tensor-cores mma_query_gradients_kernel --tensor-cores mma_key_gradients_kernel \
        --tensor-cores mma_distance_bias_gradient_kernel || return 1
    elapsed "the CUDA kernels' resources" "$start"
}

total=$(date +%s)
failed=()
if [ "$what" = all ] || [ "$what" = notebooks ]; then run_notebooks || failed+=(notebooks); fi
if [ "$what" = all ] || [ "$what" = asan ]; then run_asan || failed+=(asan); fi
if [ "$what" = all ]; then  # the fuzzers take one core, the quickstart the other
    run_cuda > build/cuda.log 2>&1 &
    quickstart=$!
fi
if [ "$what" = all ] || [ "$what" = fuzz ]; then run_fuzz || failed+=(fuzz); fi
if [ "$what" = all ]; then
    wait "$quickstart" || failed+=(cuda)
    cat build/cuda.log
fi
if [ "$what" = cuda ]; then run_cuda || failed+=(cuda); fi
elapsed "ci_extra $what" "$total"
if [ ${#failed[@]} -gt 0 ]; then
    echo "ci_extra: FAILED: ${failed[*]}" >&2
    exit 1
fi
