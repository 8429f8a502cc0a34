#!/usr/bin/env bash
# Issue 45 on a lent GPU, one part per window (each at most 8 minutes, start-up not counted):
#   bash benchmarks/gpu/run.sh A            # correctness on CUDA, then decode, training-step and prefill costs
#   bash benchmarks/gpu/run.sh A --rehearse # the same steps on this CPU at toy sizes (minutes): run it before a window
#   bash benchmarks/gpu/run.sh B            # pretraining in miniature: `t2mlr experiment pretrain --preset gpu`
# Part C (S5 with all 120 actions) is not prepared yet.
# Every step has its own time limit, so a failing or slow step costs itself only; each writes its log under
# $OUT (default benchmarks/gpu/out), and summary.txt says how each ended. Nothing here needs the network or
# the `datasets` package: the GPU machine has neither.
set -uo pipefail
part=${1:-}
rehearse=${2:-}
cd "$(dirname "$0")/../.."
OUT=${OUT:-benchmarks/gpu/out}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}

step() {  # name, seconds allowed, command...: runs it, logs it, records how it ended
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/$name.log"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >>"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc, $((SECONDS - start)) s$([ $rc -eq 124 ] && echo ' (time limit)')" | tee -a "$OUT/summary.txt"
}

versions() {
  "$PY" - <<'PY'
import platform, subprocess, datetime
import torch, transformers
print("date", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "transformers", transformers.__version__)
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"]
    print("nvidia-smi", subprocess.run(smi, capture_output=True, text=True).stdout.strip())
else:
    print("device cpu (no CUDA)")
PY
}

part_a() {
  local gpu=(--device cuda) tests=(tests/test_cuda.py tests/test_compile.py -k "cuda")
  local decode=(--placements 13-18 --lengths 512,2048 --repeats 3 --cache static --compile reduce-overhead)
  local prefill=(--placements 5-26,13-18 --prompt-length 2048 --depths 4,8,16,32 --repeats 3)
  local train=(--gpu --repeats 3 --warmup 1 --tol 1e9)
  if [ "$rehearse" = "--rehearse" ]; then  # toy sizes on the CPU: every script and argument path, in minutes
    gpu=(--device cpu) tests=(tests/test_cuda.py)
    decode=(--placements 2-3 --hidden 64 --lengths 8,16 --repeats 1 --cache static --compile default)
    prefill=(--placements 2-3 --hidden 64 --prompt-length 32 --depths 4,8 --repeats 1)
    train=(--layers 4 --hidden 64 --vocab 128 --seq 64 --batch 2 --l-start 2 --l-end 3 --repeats 1 --warmup 1 --tol 1e9)
  fi
  versions | tee "$OUT/summary.txt"
  step tests 70 "$PY" -m pytest -q -p no:cacheprovider -rs "${tests[@]}"
  TORCH_LOGS=recompiles step decode 250 "$PY" benchmarks/decode_overhead.py "${gpu[@]}" "${decode[@]}" --plain
  step train 80 bash -c "$PY benchmarks/train_overhead.py ${train[*]} --d-forward 16 --d-backward 4 --json $OUT/train_16_4.json \
    && $PY benchmarks/train_overhead.py ${train[*]} --d-forward 4 --d-backward 2 --json $OUT/train_4_2.json"
  step prefill 70 "$PY" benchmarks/prefill.py "${gpu[@]}" "${prefill[@]}"
}

part_b() {  # T²MLR(5,6) and the matched Transformer, 160 s of training steps each, on the machine's own *.py files
  local settings=()
  if [ "$rehearse" = "--rehearse" ]; then  # toy sizes on the CPU, on this repository's sources
    settings=(task.python_sources=src task.tokenizer_documents=40 task.tokenize_workers=2 task.max_train_documents=null
      task.eval_batches=2 model.base.vocab_size=512 model.base.hidden_size=64 model.base.intermediate_size=128
      model.base.num_hidden_layers=4 model.base.num_attention_heads=2 model.base.num_key_value_heads=1
      model.l_start=2 model.l_end=3 data.seq_len=64 eval.data.seq_len=64 eval.every=10 eval.batch_size=4
      train.global_batch_size=8 train.micro_batch_size=8 train.device=cpu train.precision=fp32 train.max_seconds=8
      schedule.warmup_steps=5)
  fi
  local run=/tmp/pretrain_gpu
  rm -rf "$run"
  versions | tee "$OUT/summary.txt"
  step pretrain 420 "$PY" -m t2mlr experiment pretrain --preset gpu --out "$run" "${settings[@]}"
  cp "$run"/results.md "$run"/results.json "$run"/loss_curves.png "$OUT"/ 2>/dev/null
  for arm in t2mlr_middle transformer; do cp "$run/$arm/metrics.jsonl" "$OUT/${arm}_metrics.jsonl" 2>/dev/null; done
}

case "$part" in
  A) part_a ;;
  B) part_b ;;
  C) echo "run.sh: part C is not prepared yet (issue 45)" >&2; exit 2 ;;
  *) echo "usage: bash benchmarks/gpu/run.sh A|B|C [--rehearse]" >&2; exit 2 ;;
esac
