#!/usr/bin/env bash
# Issue 15's GPU figures in one command, for a GPU lent for a few minutes: each part runs under
# its own time limit and writes its own log, so a part that runs out of time loses only itself.
#
#     bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR]
#
# Parts (logs in OUT_DIR; summary.txt has each part's command, exit status and times):
#   env.log           the GPU, and the versions of jax, jaxlib and flax;
#   native.log        the Pallas kernels compiled by Triton and run, against the float64
#                     references (tests/test_pallas.py -k pallas_native), in 8 pytest workers, started
#                     beside attention_2048 (their GPU work is milliseconds; summary.txt says
#                     whether they were done before its timing began);
#   attention_2048.log, attention_512_8192.log
#                     benchmarks/attention.py's gpu preset (n = 2048, the target, first);
#   char_lm.log       enwik8_base shapes, xl and absolute, 100 steps each: steps/s and memory;
#   translate.log     wmt_base shapes (Shaw) on toy-ende, 4 real batches x 50 rounds.
# PYTHON picks the interpreter (default python3). The limits add up to under 10 minutes.
set -u
out=${1:?usage: bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR]}
data=${2:-../shared/data/wmt_ende_toy}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

# part NAME SECONDS COMMAND...: runs COMMAND with a time limit, output in NAME.log.
part() {
  local name=$1 limit=$2
  shift 2
  echo "$(date +%T) start $name (limit ${limit} s): $*" >>"$out/summary.txt"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "$(date +%T) end $name: exit $?" >>"$out/summary.txt"
}

part env 60 bash -c "nvidia-smi -L; $py -c 'import jax, jaxlib, flax; \
print(jax.__version__, jaxlib.__version__, flax.__version__, jax.devices())'"

# Several test processes share the GPU: none may take XLA's default 75% of its memory.
part native 160 env XLA_PYTHON_CLIENT_PREALLOCATE=false \
  "$py" -m pytest tests/test_pallas.py -k pallas_native -n 8 -rA -q -p no:cacheprovider &
native=$!
part attention_2048 190 "$py" benchmarks/attention.py \
  --config=configs/attention_benchmark.py:gpu --config.lengths=2048
wait "$native"
part attention_512_8192 160 "$py" benchmarks/attention.py \
  --config=configs/attention_benchmark.py:gpu --config.lengths=512,8192
part char_lm 90 "$py" benchmarks/char_lm_step.py --config=configs/enwik8_base.py \
  --variants=xl,absolute --rounds=100
part translate 110 "$py" benchmarks/translate_step.py --config=configs/wmt_base.py \
  --config.data.kind=text --config.data.vocab_size=8000 \
  --config.data.train_src="$data/src-train.txt" --config.data.train_tgt="$data/tgt-train.txt" \
  --config.data.eval_src="$data/src-val.txt" --config.data.eval_tgt="$data/tgt-val.txt" \
  --positions=shaw --batches=4 --rounds=50
cat "$out/summary.txt"
