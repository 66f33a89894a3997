#!/usr/bin/env bash
# Issue 15's GPU figures, for a GPU lent for a few minutes: each part runs under its own time
# limit and writes its own log, so a part that runs out of time loses only itself.
#
#     bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR [PART...]]
#
# The prepared whole run (issues 36, 38, 39: tests, train + kill + resume + eval, BLEU, step and
# kernel tables, OOM, long context) is benchmarks/gpu_run.sh (docs/gpu-runbook.md); this script
# keeps issue 15's other lengths and tile sweeps (attention_512, attention_8192, tiles, xl_tiles).
# Parts, in this order (default: all; the limits add up to about 26 minutes, so under a
# 10-minute limit per command run them in several calls, docs/gpu.md; on an H100 the
# attention parts took 20-35 s each, the native tests 30-50 s):
#   native            the Pallas kernels compiled by Triton and run, against the float64
#                     references (tests/test_pallas.py -k pallas_native), and the char LM with
#                     Pallas kernels against XLA's (tests/test_transformer_xl.py -k
#                     pallas_attention_equals), in 8 pytest workers, beside attention_2048
#                     when both are asked for (their GPU work is milliseconds; summary.txt
#                     gives the times to check they did not overlap its timing, which starts
#                     after its "compiled ... functions" line);
#   attention_2048    benchmarks/attention.py's gpu preset at n = 2048 (the target),
#                     k = 16 and 64, every kernel (the H100 run left XL's Pallas kernel out,
#                     as the H200 had to with its first design);
#   char_lm           enwik8_base shapes, xl with the Pallas kernels ('auto' on a GPU at
#                     1,024 keys) and with XLA's, and absolute: steps/s and memory (the
#                     model-level comparison; four variants did not finish in 130 s on an
#                     H100);
#   translate         wmt_base shapes (Shaw) on toy-ende, 2 real batches, with the Pallas
#                     kernels and with XLA's (one process; 'auto' keeps XLA's below 512 keys,
#                     so both are named; with XLA's alone the H100 ran out of 110 s, the H200
#                     finished);
#   attention_512, attention_8192
#                     the preset's other lengths (8192: one call per timing);
#   tiles             Shaw's Pallas kernel at n = 2048, k = 16 with its default 64 x 64 tiles
#                     and with 128 x 64 and 64 x 128 (8 warps), against vanilla and cuDNN;
#   xl_tiles          XL's Pallas kernel at n = 512 with its default 32 x 32 tiles and with
#                     16 x 16 and 32 x 64.
# Logs: OUT_DIR/PART.log, plus env.log (GPU and versions) and summary.txt (each part's
# command, exit status, 124 if out of time, and clock times). PYTHON picks the interpreter.
set -u
out=${1:?usage: bash benchmarks/gpu_figures.sh OUT_DIR [TOY_ENDE_DIR [PART...]]}
# toy-ende: the slice bundled in relpos/data/samples (.gz) unless a directory of the whole set
# (OpenNMT-py's data/, relpos/data/samples/README.md) is given.
data=${2:-relpos/data/samples/toy_ende}
gz=$([[ -e $data/src-train.txt ]] || echo .gz)
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
# The attention benchmark's gpu preset, as an array: `timeout` runs commands, not functions.
attention=("$py" benchmarks/attention.py --config=configs/attention_benchmark.py:gpu)

parts+=' env '
part env 60 bash -c "nvidia-smi -L; $py -c 'import jax, jaxlib, flax; \
print(jax.__version__, jaxlib.__version__, flax.__version__, jax.devices())'"
# Several test processes share the GPU: none may take XLA's default 75% of its memory.
part native 160 env XLA_PYTHON_CLIENT_PREALLOCATE=false \
  "$py" -m pytest tests/test_pallas.py tests/test_transformer_xl.py \
  -k 'pallas_native or pallas_attention_equals' -n 8 -rA -q -p no:cacheprovider &
part attention_2048 190 "${attention[@]}" --config.lengths=2048 \
  "--config.kernels=('vanilla','cudnn','shaw','shaw_pallas','xl','xl_pallas')"
wait
part char_lm 240 "$py" benchmarks/char_lm_step.py --config=configs/enwik8_base.py \
  --variants=xl,xl_xla,absolute --rounds=20
part translate 300 "$py" benchmarks/translate_step.py --config=configs/wmt_base.py \
  --config.data.kind=text --config.data.vocab_size=8000 \
  --config.data.train_src="$data/src-train.txt$gz" --config.data.train_tgt="$data/tgt-train.txt$gz" \
  --config.data.eval_src="$data/src-val.txt$gz" --config.data.eval_tgt="$data/tgt-val.txt$gz" \
  --positions=shaw --attention_implementations=pallas,xla --batches=2 --rounds=20
part attention_512 150 "${attention[@]}" --config.lengths=512
part attention_8192 300 "${attention[@]}" --config.lengths=8192 --config.repeats=1
part tiles 150 "${attention[@]}" --config.lengths=2048 --config.distances=16 \
  "--config.kernels=('vanilla','cudnn','shaw_pallas','shaw_pallas@128x64','shaw_pallas@64x128')"
part xl_tiles 150 "${attention[@]}" --config.lengths=512 --config.distances=16 --config.repeats=1 \
  "--config.kernels=('vanilla','cudnn','xl','xl_pallas','xl_pallas@16x16','xl_pallas@32x64')"
cat "$out/summary.txt"
