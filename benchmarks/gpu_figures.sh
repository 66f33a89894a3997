#!/usr/bin/env bash
# Issue 15's GPU figures, for a GPU lent for a few minutes: each part runs under its own time
# limit and writes its own log, so a part that runs out of time loses only itself.
#
#     bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR [PART...]]
#
# Parts, in this order (default: all; the limits add up to about 19 minutes, so under a
# 10-minute limit per command run them in two or three calls, README, On a GPU):
#   native            the Pallas kernels compiled by Triton and run, against the float64
#                     references (tests/test_pallas.py -k pallas_native), in 8 pytest workers,
#                     beside attention_2048 when both are asked for (their GPU work is
#                     milliseconds; summary.txt gives the times to check they did not overlap
#                     its timing, which starts after its "compiled ... functions" line);
#   attention_2048    benchmarks/attention.py's gpu preset at n = 2048 (the target),
#                     k = 16 and 64, without XL's Pallas kernel (0.5 s a fwd+bwd call at
#                     n = 512 on an H200; with it, this part ran out of time there; xl_tiles
#                     times it at n = 512);
#   char_lm           enwik8_base shapes, xl and absolute, 30 steps each: steps/s and memory;
#   translate         wmt_base shapes (Shaw) on toy-ende, 2 real batches x 40 rounds;
#   attention_512, attention_8192
#                     the preset's other lengths (8192: one call per timing);
#   tiles             Shaw's Pallas kernel at n = 2048, k = 16 with its default 64 x 64 tiles
#                     and with 128 x 64 and 64 x 128 (8 warps), against vanilla and cuDNN;
#   xl_tiles          XL's Pallas kernel at n = 512 with its default 32 x 32 tiles and with
#                     16 x 16 and 32 x 64 (compiled for sm_90a with the register gather:
#                     at most 532 bytes of spills per thread at 32 x 32, none at 16 x 16,
#                     at most 1,084 at 32 x 64: benchmarks/triton_compile.py).
# Logs: OUT_DIR/PART.log, plus env.log (GPU and versions) and summary.txt (each part's
# command, exit status, 124 if out of time, and clock times). PYTHON picks the interpreter.
set -u
out=${1:?usage: bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR [PART...]]}
data=${2:-../shared/data/wmt_ende_toy}
shift $(($# < 2 ? $# : 2))
parts=" ${*:-native attention_2048 char_lm translate attention_512 attention_8192 tiles xl_tiles} "
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1

# part NAME SECONDS COMMAND...: runs COMMAND with a time limit, if NAME was asked for.
part() {
  local name=$1 limit=$2
  shift 2
  [[ $parts == *" $name "* ]] || return 0
  echo "$(date +%T) start $name (limit ${limit} s): $*" >>"$out/summary.txt"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "$(date +%T) end $name: exit $status" >>"$out/summary.txt"
}

parts+=' env '
part env 60 bash -c "nvidia-smi -L; $py -c 'import jax, jaxlib, flax; \
print(jax.__version__, jaxlib.__version__, flax.__version__, jax.devices())'"
# Several test processes share the GPU: none may take XLA's default 75% of its memory.
part native 160 env XLA_PYTHON_CLIENT_PREALLOCATE=false \
  "$py" -m pytest tests/test_pallas.py -k pallas_native -n 8 -rA -q -p no:cacheprovider &
part attention_2048 190 "$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu --config.lengths=2048 \
  "--config.kernels=('vanilla','cudnn','shaw','shaw_pallas','xl')"
wait
part char_lm 100 "$py" benchmarks/char_lm_step.py --config=configs/enwik8_base.py \
  --variants=xl,absolute --rounds=30
part translate 110 "$py" benchmarks/translate_step.py --config=configs/wmt_base.py \
  --config.data.kind=text --config.data.vocab_size=8000 \
  --config.data.train_src="$data/src-train.txt" --config.data.train_tgt="$data/tgt-train.txt" \
  --config.data.eval_src="$data/src-val.txt" --config.data.eval_tgt="$data/tgt-val.txt" \
  --positions=shaw --batches=2 --rounds=40
part attention_512 150 "$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu --config.lengths=512
part attention_8192 300 "$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu --config.lengths=8192 --config.repeats=1
part tiles 150 "$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu --config.lengths=2048 --config.distances=16 \
  "--config.kernels=('vanilla','cudnn','shaw_pallas','shaw_pallas@128x64','shaw_pallas@64x128')"
part xl_tiles 150 "$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu --config.lengths=512 --config.distances=16 --config.repeats=1 \
  "--config.kernels=('vanilla','cudnn','xl','xl_pallas','xl_pallas@16x16','xl_pallas@32x64')"
cat "$out/summary.txt"
