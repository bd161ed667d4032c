#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one run (each step has a time limit; together at most
# 555 s, and less where the steps finish early):
#   1. build with the CUDA backend for the GPU at hand (RELGRAD_CUDA=ON),
#   2. the test suite with its cuda device on the GPU (RELGRAD_CUDA_EMULATOR=0), not the emulator
#      (test_fused_attention's tensor-core cases among them: many key tiles, two query blocks,
#      wide clipping, offsets, narrow and sliding windows, in tf32 and both 16-bit types; and the
#      scalar kernels' gradient check over several tiles),
#   3. the fused attention tests under compute-sanitizer, memcheck and racecheck (all but the
#      registry's gradient check),
#   4. the quickstart on the GPU and on the CPU, side by side,
#   5. the benchmark: relgrad's fused CUDA kernels against PyTorch on the same GPU
#      (bench/cuda_attention.py), in float32 and in bfloat16 (against FlashAttention-2).
# Everything it prints goes to $OUT (default cuda_check/): one file per step, and summary.md.
#
#   scripts/cuda_check.sh            OUT=/some/dir scripts/cuda_check.sh
set -u
cd "$(dirname "$0")/.."
out=${OUT:-cuda_check}
mkdir -p "$out"
jobs=$(nproc)
python=${RELGRAD_CUDA_PYTHON:-python3}  # the Python with PyTorch and a GPU
summary="$out/summary.md"
: > "$summary"
status=0

step() {  # step NAME TIMEOUT_SECONDS COMMAND...: runs it into $out/NAME.txt, notes the outcome
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1
    local code=$?
    echo "- $name: exit $code in $((SECONDS - start)) s" | tee -a "$summary"
    [ $code -eq 0 ] || status=1
    return $code
}

{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nvcc --version | tail -1; } \
    > "$out/machine.txt" 2>&1
cat "$out/machine.txt" >> "$summary"

arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
step build 150 bash -c "cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DRELGRAD_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=${arch:-90} -DRELGRAD_PYTHON=OFF && cmake --build build-cuda -j$jobs" || {
    echo "build failed: see $out/build.txt"
    exit 1
}

# the engine, layer and trainer tests, their cuda device the GPU (the Python, package and PyTorch
# reference tests do not use it)
export RELGRAD_CUDA_EMULATOR=0
step ctest 90 ctest --test-dir build-cuda -j8 --timeout 80 --output-on-failure -E "^(python|package|reference)\."
# (not the registry's gradient check, which launches the scalar kernels thousands of times at one
# tile; their multi-tile gradient check, "on cuda, the scalar kernels pass ...", runs)
step memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 1 build-cuda/tests/test_fused_attention \
    -tce="fused attention passes the gradient check"
step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 1 build-cuda/tests/test_fused_attention \
    -tce="fused attention passes the gradient check"
unset RELGRAD_CUDA_EMULATOR

step quickstart_gpu 45 build-cuda/relgrad train --device cuda --out "$out/quickstart-gpu"
step quickstart_cpu 45 build-cuda/relgrad train --out "$out/quickstart-cpu"
grep -h "test accuracy" "$out/quickstart_gpu.txt" "$out/quickstart_cpu.txt" | tail -2 >> "$summary"

step bench 80 "$python" bench/cuda_attention.py --relgrad build-cuda/bench/bench_cuda_attention --budget 6 \
    --python "$python" --json "$out/bench.json"
cat "$out/bench.txt" >> "$summary"
# bfloat16, where FlashAttention-2 (PyTorch's flash backend) is the reference, at the goal's L = 4096
step bench_bfloat16 40 "$python" bench/cuda_attention.py --relgrad build-cuda/bench/bench_cuda_attention \
    --dtype bfloat16 --lengths 1024 4096 --budget 6 --python "$python" --json "$out/bench_bfloat16.json"
cat "$out/bench_bfloat16.txt" >> "$summary"
exit $status
