#!/usr/bin/env bash
# Every GPU figure that benchmarks/RESULTS.md still lacks (estimated, never run yet: decode ~9 minutes,
# prefill and train ~5 together on one H100/H200; split them where a call is limited to 10 minutes).
# Writes one log per benchmark under $OUT (default benchmarks/gpu_logs); paste the tables into RESULTS.md.
#   bash benchmarks/run_gpu.sh                 # all three
#   bash benchmarks/run_gpu.sh decode          # then: bash benchmarks/run_gpu.sh prefill train
#   bash benchmarks/run_gpu.sh compile-tests decode-graphs   # static caches, CUDA graphs (not in the default set)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-benchmarks/gpu_logs}"
mkdir -p "$OUT"
python -c "import torch, sys; torch.cuda.is_available() or sys.exit('run_gpu.sh: no CUDA device'); \
print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())" > "$OUT/gpu.txt"

run() {  # name, command...
  local name=$1; shift
  echo "== $name: $*" | tee "$OUT/$name.log"
  "$@" 2>&1 | tee -a "$OUT/$name.log"
}

wanted=("$@")
[ ${#wanted[@]} -eq 0 ] && wanted=(decode prefill train)
for what in "${wanted[@]}"; do
  case "$what" in
    decode)   # paper lengths 512/1024/2048, bf16, three placements; target <= 1.03x
      run decode python benchmarks/decode_overhead.py --device cuda --repeats 3 ;;
    decode-graphs)  # both models on static caches, decode steps compiled and captured as CUDA graphs
      run decode-graphs python benchmarks/decode_overhead.py --device cuda --repeats 3 --cache static \
        --compile reduce-overhead --placements 9-22,1-30 ;;
    compile-tests)  # the GPU-only tests (they skip without CUDA)
      run compile-tests python -m pytest -q -p no:cacheprovider tests/test_compile.py -k cuda ;;
    prefill)  # the paper's (5,26) at depths 2..32, plus narrower placements
      run prefill python benchmarks/prefill.py --device cuda --placements 5-26,9-22,13-18 --repeats 5 ;;
    train)    # full SmolLM2-135M shape, seq 2048, bf16 autocast: fixed depth (<= 2.24x) and the early-stop floor
      run train python benchmarks/train_overhead.py --gpu --repeats 5 --tol 1e9 ;;
    *) echo "unknown benchmark $what (decode, decode-graphs, compile-tests, prefill, train)" >&2; exit 2 ;;
  esac
done
