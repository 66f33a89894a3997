#!/usr/bin/env bash
# Fills gpu_carry/ (git-ignored) with what benchmarks/gpu_run.sh needs on the GPU machine and
# cannot fetch there (it reaches no package index and nothing outside the checkout): run it here,
# before a session's device call, then pass the printed carry list to the device tool's `run`.
# RELPOS_SHARED names the folder that holds the peer harness (peers/) and the corpora (data/).
#
#     RELPOS_SHARED=/path/to/it bash benchmarks/gpu_prepare.sh   # PYTHON (python3) runs pip
#
# gpu_carry/ holds:
#   wheels/     ml_collections, tensorboardX and sacremoses (pure-python wheels, py3-none-any;
#               the GPU image has jax, flax, optax, orbax, absl, PyYAML, protobuf, regex, click,
#               joblib and tqdm, their dependencies, already: docs/gpu-runbook.md);
#   peers/      $RELPOS_SHARED/peers/gpu/ as peers/gpu/, and beside it the official Transformer-XL
#               tarball and xl-modern-torch.patch (the layout run_gpu.sh expects);
#   COMMIT      the commit checked out (gpu_run.sh's log names it where .git did not travel);
#   tatoeba_ende/  the prepared Tatoeba en-de corpus ({train,dev,test}.{en,de}.gz), as
#               `python -m relpos.data.prepare tatoeba --out=data/` lays it out;
#   jax_cache.tar  where gpu_cache/jax_cache.tar (git-ignored) holds the compilation cache an
#               earlier gpu_run.sh brought back: its compiles and 'auto' decisions, reused on
#               the same kind of GPU and software (JAX's and relpos's cache keys say which).
# It stops with one line when a source is missing or the folder grows past 32 MiB (the device
# tool carries 64 MiB in all, the repository's tracked files included).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
[[ -n ${RELPOS_SHARED:-} ]] || {
  echo 'gpu_prepare: set RELPOS_SHARED to the folder holding peers/ and data/' >&2
  exit 1
}
shared=$RELPOS_SHARED
carry=gpu_carry
limit_mib=32

die() {
  echo "gpu_prepare: $*" >&2
  exit 1
}
for path in "$shared/peers/gpu/run_gpu.sh" "$shared/peers/transformer-xl-pytorch-44781ed.tar.gz" \
  "$shared/peers/xl-modern-torch.patch" "$shared/data/tatoeba_ende/train.en.gz"; do
  [[ -e $path ]] || die "missing $path (set RELPOS_SHARED to the folder holding peers/ and data/)"
done
git check-ignore -q "$carry/wheels/x.whl" || die "$carry/ is not git-ignored: add /$carry/ to .gitignore"

rm -rf "$carry"
mkdir -p "$carry/wheels" "$carry/peers/gpu" "$carry/tatoeba_ende"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$carry/wheels" \
  ml_collections==1.1.0 tensorboardX==2.6.5 sacremoses==0.1.1 \
  || die 'pip download failed (no package index here?)'
cp "$shared"/peers/gpu/*.py "$shared"/peers/gpu/*.sh "$shared"/peers/gpu/README.md "$carry/peers/gpu/"
cp "$shared/peers/transformer-xl-pytorch-44781ed.tar.gz" "$shared/peers/xl-modern-torch.patch" \
  "$carry/peers/"
cp "$shared"/data/tatoeba_ende/{train,dev,test}.{en,de}.gz "$carry/tatoeba_ende/"
[[ -f gpu_cache/jax_cache.tar ]] && cp gpu_cache/jax_cache.tar "$carry/"
chmod -R u+w "$carry"
# The device's copy of the tree may lack .git: gpu_run.sh's log names this commit then.
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' with local changes')" >"$carry/COMMIT"

size_kib=$(du -sk "$carry" | cut -f1)
((size_kib < limit_mib * 1024)) || die "$carry/ holds ${size_kib} KiB, over ${limit_mib} MiB"
tracked_kib=$(git ls-files -z | xargs -0 du -ck 2>/dev/null | tail -n 1 | cut -f1)
echo "gpu_carry/: $(find "$carry" -type f | wc -l) files, ${size_kib} KiB; tracked files ${tracked_kib} KiB"
echo "carry list for the device tool's run: [\"$carry\"]"
