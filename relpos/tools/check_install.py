"""Checks that relpos's install works on this machine's accelerator, in one command.

    python -m relpos.tools.check_install           # README, Install
    python -m relpos.tools.check_install --pallas  # the Pallas kernels too off a GPU (interpreted)

Prints the jax, jaxlib and flax versions, the backend and its devices, then runs a small
`shaw_attention` and `xl_attention` (forward and gradients) with XLA's kernels and, on a GPU (or
with --pallas), with the fused Pallas kernels, and compares the two (float32, matmuls at full
precision). The last line is `OK` or one line naming what failed; the exit status is 0 or 1.
It runs with relpos's process defaults (`relpos.runtime`), as train.py does, so it checks what a
run gets.
"""

import sys

# Shapes: batch, q_len, kv_len (a memory of kv_len - q_len keys), heads, head_dim, Shaw's k.
_BATCH, _Q_LEN, _KV_LEN, _HEADS, _DIM, _K = 2, 48, 80, 2, 32, 8
TOLERANCE = 1e-3  # relative to max(1, max |xla value|); a wrong term is off by far more


def _inputs(kernel: str):
  import jax
  import jax.numpy as jnp

  keys = iter(jax.random.split(jax.random.key(0), 8))

  def normal(*shape):
    return jax.random.normal(next(keys), shape, jnp.float32)

  query = normal(_BATCH, _Q_LEN, _HEADS, _DIM)
  key, value = normal(_BATCH, _KV_LEN, _HEADS, _DIM), normal(_BATCH, _KV_LEN, _HEADS, _DIM)
  if kernel == 'shaw':
    return (query, key, value, normal(2 * _K + 1, _DIM), normal(2 * _K + 1, _DIM))
  rel_key = normal(_KV_LEN, _HEADS, _DIM)
  return (query, key, value, rel_key, normal(_HEADS, _DIM), normal(_HEADS, _DIM))


def run_kernel(kernel: str, implementation: str):
  """(output, gradients of sum(output * fixed cotangent) in every input), as numpy arrays."""
  import jax
  import numpy as np

  from relpos import attention

  function = {'shaw': attention.shaw_attention, 'xl': attention.xl_attention}[kernel]
  args = _inputs(kernel)
  cotangent = jax.random.normal(jax.random.key(1), args[0].shape)

  def loss(*inputs):
    output = function(*inputs, implementation=implementation)
    return (output * cotangent).sum(), output

  with jax.default_matmul_precision('highest'):
    grads, output = jax.jit(jax.grad(loss, argnums=tuple(range(len(args))), has_aux=True))(*args)
  return np.asarray(output), [np.asarray(g) for g in grads]


def compare(want, got) -> float:
  """The largest error of `got` against `want` (output, then each gradient), each on the scale
  max(1, max |want|)."""
  import numpy as np

  pairs = [(want[0], got[0]), *zip(want[1], got[1], strict=True)]
  return max(float(np.max(np.abs(g - w)) / max(1.0, float(np.max(np.abs(w))))) for w, g in pairs)


def check(pallas: bool | None = None, out=print) -> bool:
  """Prints the versions, the devices and one line per kernel check; True when all pass.
  `pallas` None: the Pallas kernels on a GPU only."""
  import flax
  import jax
  import jaxlib
  import numpy as np

  out(f'jax {jax.__version__} | jaxlib {jaxlib.__version__} | flax {flax.__version__}')
  backend = jax.default_backend()
  out(f'backend {backend}: {", ".join(str(device) for device in jax.devices())}')
  if pallas is None:
    pallas = backend == 'gpu'
  failures = []
  for kernel in ('shaw', 'xl'):
    try:
      want = run_kernel(kernel, 'xla')
      if not all(np.isfinite(a).all() for a in (want[0], *want[1])):
        failures.append(f'{kernel}_attention (xla) gave non-finite values')
        continue
      line = f'{kernel}_attention: xla ran, finite'
      if pallas:
        error = compare(want, run_kernel(kernel, 'pallas'))
        line += f'; pallas against xla: max error {error:.2e} (tolerance {TOLERANCE:g})'
        if not error <= TOLERANCE:
          failures.append(f'{kernel}_attention pallas differs from xla by {error:.2e}')
      out(line)
    except Exception as error:  # an install fault: one line naming it
      message = str(error).strip().splitlines()[0] if str(error).strip() else ''
      failures.append(f'{kernel}_attention failed: {type(error).__name__}: {message[:300]}')
  out(f'FAILED: {"; ".join(failures)}' if failures else 'OK')
  return not failures


def main(argv) -> int:
  """The command: `--help` (or `-h`) prints this module's docstring (exit 0); an argument other
  than `--pallas` is one `error:` line (exit 2); else the check (0: OK, 1: failed)."""
  if {'--help', '-h'} & set(argv[1:]):
    print(__doc__.strip())
    return 0
  unknown = [arg for arg in argv[1:] if arg != '--pallas']
  if unknown:
    print(
      f'error: unknown argument {unknown[0]}; usage: python -m relpos.tools.check_install '
      '[--pallas]',
      file=sys.stderr,
    )
    return 2
  return 0 if check(pallas=True if '--pallas' in argv[1:] else None) else 1


if __name__ == '__main__':
  from relpos import runtime

  runtime.apply_defaults()  # what every relpos program runs with, checked as such
  sys.exit(main(sys.argv))
