#!/usr/bin/env bash
# The whole GPU run of issues 36, 38 and 39, for a GPU lent for minutes (docs/gpu-runbook.md):
# one command, each part under its own time limit and all of them under one budget, a failed
# part never stopping the rest, and a markdown log written after every part.
#
#     bash benchmarks/gpu_run.sh [PART...]          # default: every part, in the order below
#
# Before it, here: `bash benchmarks/gpu_prepare.sh` (fills gpu_carry/, which the device call
# carries). Parts, most valuable first (limits in seconds on a GPU; the budget cuts the last).
# On an H200 a step variant at enwik8_base's size took 45 to 60 s to build (compile, and the
# attention autotuning of an 'auto' variant), so the step parts name few variants each
# (docs/gpu.md, "One NVIDIA H200, 2026-11-27 evening"):
#   env             carried wheels installed (pip --no-index), GPU, versions, devices      (60)
#   native | mosaic_native | resume | translate_bleu   run at the same time (untimed checks,
#                   no preallocation):
#     native        the Pallas kernels through Triton against float64 references, the char
#                   LM with Pallas kernels against XLA's, XL through cuDNN against XLA (pytest
#                   -k 'pallas_native or pallas_attention_equals or cudnn_native', 4 workers)
#                                                                                         (150)
#     mosaic_native the Mosaic GPU kernels compiled, every reference and gradient case of
#                   their tests (the 'native' variants) and through implementation='mosaic'
#                   at a ragged length (pytest -v -k 'native or ragged_length', 4 workers:
#                   each test named as it ends, so a timeout shows which did not)     (190)
#     resume        train.py at enwik8_base width on the bundled text, 200 steps, checkpoints
#                   every 50, killed (SIGKILL) after step 130 and resumed from step 100; the
#                   losses of steps 110 to 130, logged before the kill and again after the
#                   resume, step for step (deterministic XLA ops); eval.py bpc             (200)
#     translate_bleu  translate_tiny (Shaw) on the carried Tatoeba to a BLEU, XLA's kernels
#                   and 3 length buckets (the pipeline; 'auto' is timed by the parts below) (200)
#   steps_xl        benchmarks/char_lm_step.py at enwik8_base in float32: xl with 'auto',
#                   'xla' and 'pallas' (its 'auto check' line; the kernels 'auto' chose at
#                   every call are its own program, not built again: two builds, not three)
#                                                                                         (170)
#   steps_shaw      the same for shaw                                                     (170)
#   translate_step  benchmarks/translate_step.py at wmt_base shapes (Tatoeba), shaw with
#                   'auto', 'xla' and 'pallas', each profiled                             (200)
#   steps_bf16      steps_xl in bf16 with xl through 'cudnn' too, then xl without dropout and
#                   with dropout_bits='hash'; each variant profiled                       (270)
#   steps_bf16_shaw steps_shaw in bf16, each variant profiled                             (180)
#   translate_step_bf16  translate_step in bf16 (wmt_base's 40% MFU target)               (200)
#   flags_off       the bf16 xl and shaw Pallas steps again with RELPOS_GPU_FLAGS=off (XLA's
#                   dot merging back on): what relpos's GPU flag is worth in time         (130)
#   oom             train.py with an oversized batch: its exit status and last line        (60)
#   kernels         benchmarks/attention.py bf16 fwd+bwd n = 2048, k = 16 and 64: vanilla,
#                   cuDNN, JAX's Pallas flash (Triton, Mosaic GPU), shaw/xl (xla and pallas,
#                   xl also cudnn); then the peers' torch SDPA and
#                   FlexAttention forms at k = 16 and 64 (issue 39's table); XL's and
#                   Shaw's Pallas fwd+bwd traced, kernel by kernel                        (190)
#   xl_official     the official Transformer-XL step (PyTorch) at the same shapes          (70)
#   mosaic          benchmarks/mosaic_shaw.py at n = 2048, k = 16 and 64, batch 16, then at
#                   enwik8_base's 512 queries over 1,024 keys, k = 16, batch 22: the Mosaic
#                   GPU Shaw kernels (one warpgroup, warp-specialised) checked against XLA
#                   and timed beside the Triton kernel, XLA and cuDNN; benchmarks/mosaic_xl.py
#                   at enwik8_base's shape the same way, then XL through cuDNN taken apart (170)
#   steps_mosaic    char_lm_step.py bf16: xl and shaw with 'auto' (Mosaic among its candidates),
#                   'xla' and 'mosaic'                                                    (120)
#   long_context    the largest n = tgt_len = mem_len that trains, xl and shaw, mosaic,
#                   pallas and xla, bf16, doubling from just below gpu_compile.py's predicted
#                   limit (xla 4096, the kernels 65536; batch 1, enwik8_base width)      (180)
#   autotune        python -m relpos.tools.pretune's tables for enwik8_base and wmt_base, train
#                   steps and (forward passes alone) evaluations
#                   (the decisions the parts above logged, in one table each)             (120)
# Environment: OUT (default ./gpu_out) gets gpu_run.md (the log: device, date, versions,
# commit, a table of the parts, each part's result lines and log tail), raw_logs.tar.gz
# (every part's whole log) and jax_cache.tar (the compilation cache, at most 15 MiB: keep it as
# gpu_cache/jax_cache.tar, and gpu_prepare.sh carries it to the next run); the runs' workdirs go
# to a temporary folder (GPU_RUN_WORK), never to OUT. GPU_RUN_BUDGET (default 480 s): all parts together; a part gets what is left of it
# at most, and none starts with under 20 s left (the log lists it as skipped). PYTHON (default
# python3). GPU_RUN_SLOW (default 1; 3 with GPU_RUN_SMOKE) multiplies each part's limit.
# GPU_CARRY (default gpu_carry). GPU_RUN_SMOKE=1: every part at tiny sizes on the
# CPU (the plumbing: paths, flags, checkers, log); PYTHON=echo, the dry run: no part runs, each
# prints its commands, and the log marks it "dry run", not "ok"; its OUT defaults to the work
# folder, so it never replaces a real run's gpu_out/gpu_run.md (tests/test_gpu_run.py).
set -uo pipefail # not -e: a part that fails must not stop the others
cd "$(dirname "$0")/.."
root=$PWD
all_parts=(env native mosaic_native resume translate_bleu steps_xl steps_shaw translate_step
  steps_bf16 steps_bf16_shaw translate_step_bf16 flags_off oom kernels xl_official mosaic
  steps_mosaic long_context autotune)
# The command line and the numbers are checked before anything is made (OUT, the work
# folder): a mistake is one line and exit 2, and leaves nothing behind.
refuse() {
  echo "gpu_run: $*" >&2
  exit 2
}
body=''
if [[ ${1:-} == --body ]]; then # internal: part() runs each part's body so
  [[ ${2:-} ]] || refuse "--body needs a part name (part() passes it); parts: ${all_parts[*]}"
  body=$2 && set -- "$2"
fi
if (($#)); then parts=("$@"); else parts=("${all_parts[@]}"); fi
for name in "${parts[@]}"; do
  [[ " ${all_parts[*]} " == *" $name "* ]] || refuse "no part $name; parts: ${all_parts[*]}"
done
for setting in GPU_RUN_SMOKE GPU_RUN_BUDGET GPU_RUN_SLOW; do
  [[ ${!setting:-0} =~ ^[0-9]+$ ]] ||
    refuse "$setting=${!setting}: must be a whole number"
done
py=${PYTHON:-python3}
dry=0
if [[ $(basename "$py") == echo ]]; then
  dry=1
  python() { echo python "$@"; } # the dry run's interpreter: prints each command it is given
  py=python
fi
work=${GPU_RUN_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_run.XXXXXX")}
logs=$work/logs
mkdir -p "$logs"
if ((dry)); then out=${OUT:-$work/out}; else out=${OUT:-$root/gpu_out}; fi
mkdir -p "$out" && out=$(cd "$out" && pwd)
carry=${GPU_CARRY:-$root/gpu_carry}
smoke=${GPU_RUN_SMOKE:-0}
budget=${GPU_RUN_BUDGET:-480}
slow=${GPU_RUN_SLOW:-$((smoke ? 3 : 1))} # multiplies every part's limit
md=$out/gpu_run.md
wanted() { [[ " ${parts[*]} " == *" $1 "* ]]; }
# Commands other than python: run for real, except in the dry run, where they are printed.
x=()
((dry)) && x=(echo)
export PYTHONUNBUFFERED=1 PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}

# --- sizes: enwik8_base on a GPU; tiny, on the CPU, for GPU_RUN_SMOKE=1 -------------------
char=configs/enwik8_base.py
text=(--config.data.kind=text --config.data.path=relpos/data/samples/tinyshakespeare.txt)
tatoeba=$carry/tatoeba_ende
translate_data=(--config.data.train_src="$tatoeba/train.en.gz" --config.data.train_tgt="$tatoeba/train.de.gz"
  --config.data.eval_src="$tatoeba/test.en.gz" --config.data.eval_tgt="$tatoeba/test.de.gz")
if ((smoke)); then
  tiny=(--config.model.num_layers=1 --config.model.d_model=32 --config.model.num_heads=2
    --config.model.head_dim=16 --config.model.d_ff=64 --config.train.batch_size=2
    --config.train.tgt_len=16 --config.train.mem_len=16)
  train_sizes=("${tiny[@]}" --config.data.max_bytes=100000 --config.train.steps=40
    --config.train.checkpoint_every=10 --config.train.log_every=5 --config.eval.batch_size=2
    --config.eval.tgt_len=32 --config.eval.mem_len=32 --config.eval.clamp_len=-1)
  kill_after=25 rounds=1 native_k=pallas_native mosaic_native_k=ragged_length
  translate_tiny=(--config.train.steps=20 --config.train.checkpoint_every=10
    --config.model.encoder_layers=1 --config.model.decoder_layers=1 --config.model.d_model=32
    --config.model.d_ff=64 --config.data.max_train_examples=2000 --config.data.vocab_size=500
    --config.data.vocab_train_sentences=2000 --config.data.max_eval_examples=20
    --config.eval.beam_size=1)
  wmt=(--config.model.encoder_layers=1 --config.model.decoder_layers=1 --config.model.d_model=32
    --config.model.d_ff=64 --config.data.max_train_examples=2000 --config.data.vocab_size=500
    --config.data.vocab_train_sentences=2000 --config.data.max_tokens=256
    --config.data.max_length=48)
  wmt_sizes=(--config.model.encoder_layers=1 --config.model.decoder_layers=1
    --config.model.d_model=32 --config.model.d_ff=64 --config.data.max_tokens=256
    --config.data.max_length=48)
  # CPU: no real out-of-memory; a config error stands in, to check the part's plumbing.
  oom_sizes=("${tiny[@]}" --config.train.batch_size=3) oom_expect='multiple of'
  attention=(--config=configs/attention_benchmark.py:quick --config.lengths=64 --config.distances=16
    "--config.kernels=('vanilla','shaw','xl')" "--config.profile=('xl',)")
  torch_lengths=64 long=("${tiny[@]}") long_start=32 long_max=128 long_impls=pallas,xla
  long_starts=pallas:64
  mosaic=(--interpret --lengths=128 --distances=3 --kernels=mosaic --batch=1 --heads=1)
  mosaic_memory=("${mosaic[@]}" --memory=64 --lengths=64)
  mosaic_xl=(--interpret --lengths=64 --memory=64 --batch=1 --heads=1)
else
  tiny=()
  train_sizes=(--config.train.steps=200 --config.train.checkpoint_every=50
    --config.train.log_every=10 --config.train.eval_every=0)
  kill_after=130 rounds=10 native_k='pallas_native or pallas_attention_equals or cudnn_native'
  mosaic_native_k='native or ragged_length'
  translate_tiny=()
  wmt=(--config.data.vocab_size=8000) wmt_sizes=()
  oom_sizes=(--config.train.batch_size=64 --config.train.tgt_len=4096 --config.train.mem_len=4096
    --config.model.attention_implementation=xla --config.train.steps=1)
  oom_expect='memory|RESOURCE_EXHAUSTED'
  attention=(--config=configs/attention_benchmark.py:gpu --config.lengths=2048)
  # One scanned layer body to compile per size (the step is the same): more sizes in the time.
  # bf16, which the Mosaic kernels need; 'mosaic' first: where it fails, it fails at once.
  torch_lengths=2048 long=(--config.model.scan_layers=True --config.model.dtype=bfloat16)
  # From just below the boundary benchmarks/gpu_compile.py predicts (docs/gpu.md: XL and Shaw
  # at 4,096 to 8,192 with 'xla', 65,536 with either kernel): two sizes each, fit and fail.
  long_start=4096 long_max=131072 long_impls=mosaic,pallas,xla
  long_starts=xla:4096,pallas:65536,mosaic:65536
  mosaic=(--lengths=2048 --distances=16,64 --batch=16 --heads=8 --head_dim=64)
  mosaic_memory=(--lengths=512 --memory=512 --distances=16 --batch=22 --heads=8 --head_dim=64)
  mosaic_xl=(--lengths=512 --memory=512 --batch=22 --heads=8 --head_dim=64)
fi
cuda_torch() { "$py" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; }
export PYTHONPATH=$PYTHONPATH:$work/site
# The run's compilation cache (relpos.runtime: JAX's executables, XLA's GEMM autotuning and the
# 'auto' decisions): restored from gpu_carry/jax_cache.tar where an earlier run brought one back
# (gpu_prepare.sh), and packed into OUT/jax_cache.tar after each phase for the next run. It sits
# outside the call's temporary folder, so that a second call to the still-warm machine (the
# parts the first call's budget left out) reads what the first compiled and decided instead of
# compiling and tuning again; a fresh machine starts it empty. Entries are keyed by program,
# device, versions and flags (and the decisions by the kernels' source), so an older entry is
# never misread, only not found.
export RELPOS_COMPILATION_CACHE=${RELPOS_COMPILATION_CACHE:-${TMPDIR:-/tmp}/relpos-gpu-run-cache}

# --- the parts' bodies: each runs in its own `bash gpu_run.sh --body NAME` under `timeout` ----
p_env() {
  if ! "$py" -c 'import ml_collections, tensorboardX, sacremoses' 2>/dev/null; then
    "${x[@]}" "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target "$work/site" "$carry"/wheels/*.whl || return 1
  fi
  if [[ -f $carry/jax_cache.tar ]]; then
    mkdir -p "$RELPOS_COMPILATION_CACHE" &&
      "${x[@]}" tar -xf "$carry/jax_cache.tar" -C "$RELPOS_COMPILATION_CACHE" &&
      echo "RESULT: compilation cache carried in: $(tar -tf "$carry/jax_cache.tar" | wc -l) files"
  fi
  "${x[@]}" nvidia-smi -L 2>/dev/null || echo 'nvidia-smi: none here'
  "$py" -c 'import jax, jaxlib, flax; print(jax.__version__, jaxlib.__version__, flax.__version__, jax.devices())'
}
p_native() {
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" -m pytest tests/test_pallas.py tests/test_transformer_xl.py tests/test_xl_cudnn.py \
    -k "$native_k" -m 'slow or not slow' -n "$((smoke ? 0 : 4))" -rA -q -p no:cacheprovider
}
p_mosaic_native() {
  # Apart from `native`, under its own limit: a kernel never run on hardware that hangs (a
  # barrier never arrived at) must not cost the Triton kernels' results.
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" -m pytest tests/test_mosaic_shaw.py tests/test_mosaic_xl.py \
    tests/test_mosaic_implementation.py -k "$mosaic_native_k" -m 'slow or not slow' \
    -n "$((smoke ? 0 : 4))" -rA -v -p no:cacheprovider
}
p_resume() {
  # Deterministic GPU reductions, so that a resumed run can match bit for bit; a jaxlib that no
  # longer knows the flag (XLA aborts on unknown flags) runs without it, and says so.
  local flags="--xla_gpu_deterministic_ops=true ${XLA_FLAGS:-}"
  XLA_FLAGS=$flags "$py" -c 'import jax.numpy as jnp; jnp.zeros(1).block_until_ready()' ||
    { echo 'RESULT: this jaxlib rejects --xla_gpu_deterministic_ops; resuming without it'; flags=${XLA_FLAGS:-}; }
  XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS=$flags \
    "$py" benchmarks/gpu_run.py resume --config="$char" --work="$work/resume" --logs="$logs" \
    --seconds="$((${GPU_RUN_LIMIT:-200} - 10))" --kill_after=$kill_after -- "${text[@]}" "${train_sizes[@]}"
}
p_translate_bleu() {
  local status
  # XLA's kernels and 3 length buckets: on an H200, 'auto' timing each bucket's calls and six
  # step compiles held the first run to 8 steps in 200 s beside three other parts.
  XLA_PYTHON_CLIENT_PREALLOCATE=false "$py" train.py --config=configs/translate_tiny.py:shaw \
    --workdir="$work/translate_tiny" "${translate_data[@]}" "${translate_tiny[@]}" \
    --config.model.attention_implementation=xla --config.data.length_buckets=3 \
    >"$logs/translate_bleu_train.log" 2>&1
  status=$?
  tail -n 30 "$logs/translate_bleu_train.log"
  echo "RESULT: train.py exit $status; $(grep -E '^(bleu|step [0-9]+/)' "$logs/translate_bleu_train.log" | tail -n 2 | tr '\n' ' ')"
  return $status
}
# char_lm_step.py at enwik8_base: 'auto' first (the ratios' base), then each kernel it chose
# between, in one run ('auto check': 'auto' against the faster kernel named).
char_steps() {
  "$py" benchmarks/char_lm_step.py --config="$char" "${tiny[@]}" --rounds=$rounds "$@" \
    --variants="$variants" --seconds="$((${GPU_RUN_LIMIT:-160} - 20))"
}
p_steps_xl() { variants=xl,xl_xla,xl_pallas char_steps; }
p_steps_shaw() { variants=shaw,shaw_xla,shaw_pallas char_steps; }
# bf16 also profiles each variant: 2 traced steps, their time by op category and pass
# (benchmarks/step_profile.py); each variant's headline goes into the markdown log.
p_steps_bf16() {
  local cudnn=xl_cudnn, # cuDNN's kernels: NVIDIA GPUs only
  ((smoke)) && cudnn=''
  # In order of need, since a part cut short by its time limit leaves the last out: 'auto'
  # (cuDNN's kernels, on the H200) against each kernel named, then what dropout costs, and what
  # its bits cost from relpos.counter_hash instead of threefry.
  variants=xl,${cudnn}xl_xla,xl_pallas,xl_nodropout,xl_hash_dropout profiled char_steps \
    --config.model.dtype=bfloat16 --profile_steps=2
}
p_steps_bf16_shaw() {
  variants=shaw,shaw_xla,shaw_pallas profiled char_steps --config.model.dtype=bfloat16 \
    --profile_steps=2
}
# relpos.runtime's GPU flags off in this process only, against the xl_pallas and shaw_pallas
# rows of steps_bf16 and steps_bf16_shaw (same machine and call; docs/gpu.md, "Three cuts to
# the fused-kernel steps' floor"). The kernels named: 'auto' would tune again, its decisions
# being keyed by XLA_FLAGS.
p_flags_off() {
  RELPOS_GPU_FLAGS=off variants=xl_pallas,shaw_pallas char_steps --config.model.dtype=bfloat16
}
# The Mosaic GPU kernels inside the bf16 step, in a process of their own (a kernel that hangs
# or faults on its first GPU run takes only this part), 'auto' with them as candidates
# (RELPOS_AUTOTUNE_MOSAIC=1), against 'xla'.
p_steps_mosaic() {
  local names=xl_mosaic,shaw_mosaic # Mosaic GPU: NVIDIA GPUs only
  ((smoke)) && names=xl_pallas,shaw_pallas
  RELPOS_AUTOTUNE_MOSAIC=1 RELPOS_AUTOTUNE_CACHE=$work/autotune_mosaic.json \
    variants=xl,xl_xla,shaw,shaw_xla,$names char_steps --config.model.dtype=bfloat16
}
# RESULT lines of a step benchmark's profiles: each variant's busy/idle line and top categories,
# named by the benchmark run they come from.
# A part's command that profiles: its output also to $logs/PART.profile, whose headlines then
# become RESULT lines (`profile_results`); the command's exit status.
profiled() {
  "$@" | tee "$logs/$body.profile"
  local status=${PIPESTATUS[0]}
  profile_results "$logs/$body.profile"
  return $status
}
profile_results() {
  { set +x; } 2>/dev/null # the body's trace would copy this program into the markdown log
  awk '/^(num_layers=|[0-9]+\+[0-9]+ layers)/{run++}
    /^### profile: /{name="run " run ", " substr($0, 14)}
    /^profile of /{print "RESULT: profile " name ": " $0}
    /^\| (matmuls|attention kernels|random bits|layout copies|elementwise fusions|reductions|gather)/{
      print "RESULT: profile " name ": " $0}' "$1"
}
p_translate_step() {
  profiled "$py" benchmarks/translate_step.py --config=configs/wmt_base.py:shaw \
    --config.data.kind=text "${translate_data[@]}" "${wmt[@]}" --positions=shaw \
    --attention_implementations=auto,xla,pallas --batches=2 --rounds=$rounds --profile_steps=1 "$@"
}
# wmt_base's step in bf16: issue 39's 40% MFU target for translation, and where its time goes.
p_translate_step_bf16() { p_translate_step --config.model.dtype=bfloat16; }
# The PyTorch peers come from the maintainers' shared folder (gpu_prepare.sh with RELPOS_SHARED),
# not the repository: without them, the parts that compare against them skip that comparison.
no_peers() {
  [[ -d $carry/peers/gpu ]] && return 1
  echo "RESULT: skipped: no peers in $carry/peers/gpu ($1; gpu_prepare.sh with RELPOS_SHARED puts them there)"
}
p_xl_official() {
  no_peers 'the official Transformer-XL step' && return 0
  local xl=$work/xl_official
  rm -rf "$xl" && mkdir -p "$xl" &&
    "${x[@]}" tar -xzf "$carry/peers/transformer-xl-pytorch-44781ed.tar.gz" -C "$xl" &&
    "${x[@]}" patch -d "$xl" -p1 --quiet -i "$carry/peers/xl-modern-torch.patch" || return 1
  if ((smoke)) && ! cuda_torch; then
    echo 'RESULT: smoke: unpacked and patched; no CUDA torch here, so the step is not run'
    return 0
  fi
  "$py" "$carry/peers/gpu/xl_official_step.py" "$xl/pytorch"
}
p_autotune() {
  if ! "$py" -c 'import importlib.util as u, sys; sys.exit(not u.find_spec("relpos.tools.pretune"))'; then
    echo 'RESULT: skipped: this checkout has no relpos.tools.pretune'
    return 0
  fi
  local status=0
  "$py" -m relpos.tools.pretune --config="$char" "${tiny[@]}" || status=1
  "$py" -m relpos.tools.pretune --config=configs/wmt_base.py:shaw "${wmt_sizes[@]}" || status=1
  return $status
}
p_oom() {
  "$py" benchmarks/gpu_run.py oom --config="$char" --work="$work/oom" \
    --seconds="$((${GPU_RUN_LIMIT:-60} - 10))" --expect="$oom_expect" -- "${text[@]}" "${oom_sizes[@]}"
}
p_kernels() {
  local status=0 k
  "$py" benchmarks/attention.py "${attention[@]}" || status=1
  no_peers 'torch SDPA and FlexAttention' && return $status
  for k in 16 64; do
    if ((smoke)) && ! cuda_torch; then
      echo "RESULT: smoke: no CUDA torch here; torch_attention.py $torch_lengths $k not run"
      continue
    fi
    "$py" "$carry/peers/gpu/torch_attention.py" "$torch_lengths" "$k" || status=1
  done
  return $status
}
p_mosaic() {
  local status=0
  "$py" benchmarks/mosaic_shaw.py "${mosaic[@]}" || status=1
  # enwik8_base's own shape: 512 queries over 1,024 keys (the memory first), k = 16
  "$py" benchmarks/mosaic_shaw.py "${mosaic_memory[@]}" || status=1
  "$py" benchmarks/mosaic_xl.py "${mosaic_xl[@]}" || status=1
  return $status
}
p_long_context() {
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$py" benchmarks/gpu_run.py long_context --config="$char" \
    --seconds="$((${GPU_RUN_LIMIT:-180} - 15))" --start=$long_start --starts=$long_starts --max=$long_max \
    --implementations=$long_impls -- "${long[@]}"
}
if [[ $body ]]; then
  set -x
  "p_$body"
  exit
fi

start=$SECONDS
export GPU_RUN_WORK=$work
# part NAME LIMIT: runs part NAME's body under the smaller of LIMIT and what is left of the
# budget, output to $logs/NAME.log, status to $logs/NAME.status.
part() {
  local name=$1 limit=$2
  wanted "$name" || return 0
  local left=$((budget - (SECONDS - start)))
  if ((left < 20)); then
    echo "skipped 0 0 0 budget spent" >"$logs/$name.status"
    echo "$(date -u +%T) skip $name: budget spent" | tee -a "$logs/summary.txt"
    return 0
  fi
  limit=$((limit * slow))
  ((limit > left)) && limit=$left
  local began=$SECONDS status result
  echo "$(date -u +%T) start $name (limit $limit s)" | tee -a "$logs/summary.txt"
  GPU_RUN_LIMIT=$limit timeout -k 10 "$limit" bash "$root/benchmarks/gpu_run.sh" --body "$name" >"$logs/$name.log" 2>&1
  status=$?
  if ((status == 124 || status == 137)); then
    result=timeout
  elif ((status != 0)); then
    result=fail
  elif ((dry)); then
    result=dry_run # nothing ran: not "ok" (the log's table shows it as "dry run")
  else
    result=ok
  fi
  echo "$result $status $((SECONDS - began)) $limit" >"$logs/$name.status"
  local ended
  ended="$(date -u +%T) end $name: ${result//_/ } (exit $status, $((SECONDS - began)) s)"
  # The dry run's commands, under the part's end line, in one write (parts run side by side).
  ((dry)) && ended+=$'\n'$(grep -v '^+' "$logs/$name.log" | sed 's/^/    /')
  printf '%s\n' "$ended" | tee -a "$logs/summary.txt"
}

# The markdown log, rewritten after each phase (so a run cut short keeps what it did), and
# every log in one archive (the device tool brings back 8 files at most).
report() {
  {
    echo "# relpos GPU run, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    if git rev-parse --short HEAD >/dev/null 2>&1; then
      echo "- commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with local changes)')"
    else # the device's copy of the tree may have no .git: gpu_prepare.sh noted the commit
      echo "- commit: $(cat "$carry/COMMIT" 2>/dev/null || echo unknown) (when gpu_prepare.sh ran)"
    fi
    echo "- parts: ${parts[*]}; budget $budget s; smoke $smoke; $((SECONDS - start)) s so far"
    ((dry)) && echo "- dry run (PYTHON=echo): nothing ran; each part's section lists its commands"
    [[ -f $logs/cache.txt ]] && echo "- $(tail -n 1 "$logs/cache.txt") (at the last report)"
    sed 's/^/- /' "$logs/env.txt" 2>/dev/null
    echo
    echo '| part | result | exit | seconds | limit |'
    echo '|---|---|---|---|---|'
    local name result status seconds limit rest
    for name in "${parts[@]}"; do
      if [[ -f $logs/$name.status ]]; then
        read -r result status seconds limit rest <"$logs/$name.status"
        echo "| $name | ${result//_/ }${rest:+: $rest} | $status | $seconds | $limit |"
      else
        echo "| $name | not reached | | | |"
      fi
    done
    for name in "${parts[@]}"; do
      [[ -f $logs/$name.log ]] || continue
      printf '\n## %s\n\n' "$name"
      grep -h '^RESULT' "$logs/$name.log" | sed 's/^/- /'
      echo '```'
      grep -v '^[WIE][0-9]\{4\} \|^WARNING: All log messages\|^ *warnings.warn\|^+' "$logs/$name.log" |
        tail -n 40
      echo '```'
    done
  } >"$md.tmp" && mv "$md.tmp" "$md"
  tar -czf "$out/raw_logs.tar.gz" -C "$work" logs 2>/dev/null
  ((dry)) || "$py" "$root/benchmarks/gpu_run.py" pack_cache --cache="$RELPOS_COMPILATION_CACHE" \
    --out="$out/jax_cache.tar" >"$logs/cache.txt" 2>&1
}
trap report EXIT

if wanted env; then
  part env 60
  {
    echo "device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "python: $("$py" -c 'import sys, jax, jaxlib, flax; print(sys.version.split()[0], "| jax", jax.__version__, "| jaxlib", jaxlib.__version__, "| flax", flax.__version__, "|", jax.devices())' 2>&1 | tail -n 1)"
    echo "torch: $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo absent)"
  } >"$logs/env.txt"
  report
fi
# Untimed checks, at the same time (no preallocation): native tests, kill + resume, BLEU.
part native 150 &
part mosaic_native 190 & # 29 of its 38 tests passed in 120 s on the first run
part resume 200 &
part translate_bleu 200 &
wait
report
# Timed, one at a time.
part steps_xl 170 # with steps_shaw and translate_step, issue 36's 'auto check' lines
part steps_shaw 170
part translate_step 200
report
part steps_bf16 270 # issue 39's steps, where their time goes, and what the GPU flag is worth
part steps_bf16_shaw 180
part translate_step_bf16 200
part flags_off 130
report
part oom 60
part kernels 190
part xl_official 70
report
part mosaic 170
part steps_mosaic 120 # the Mosaic kernels in the step, after their own part ran them alone
report
part long_context 180
part autotune 120
echo "log: $md; every part's log: $out/raw_logs.tar.gz"
