"""Out of accelerator memory: telling it from other errors, the one line a run prints for it,
and the warning before a step that will not fit.

XLA reports an allocation or a compile that does not fit as RESOURCE_EXHAUSTED; a run turns
that into a `DeviceMemoryError` (exit 71, sysexits.h EX_OSERR) whose line names the shapes of
the step (the config fields below, where the task has them), the devices and what would fit
(docs/faults.md). Before the first step, `step_memory_warning` compares XLA's own estimate of
the compiled step with the memory the device reports, so a run that will not fit says so
before it compiles and fails.
"""

import jax

from relpos.faults import RunFaultError

OUT_OF_MEMORY_EXIT_CODE = 71  # sysexits.h EX_OSERR: the device could not give the memory
# The fields an out-of-memory line reports, where the task's config has them.
_SHAPE_FIELDS = (
  'train.batch_size',
  'data.max_tokens',
  'train.tgt_len',
  'train.mem_len',
  'data.max_length',
  'model.d_model',
  'model.num_layers',
  'model.encoder_layers',
  'model.decoder_layers',
  'model.dtype',
  'train.grad_accum_steps',
  'model.remat',
  'model.scan_layers',
)


class DeviceMemoryError(RunFaultError):
  """XLA ran out of accelerator memory compiling or running a training step."""

  exit_code = OUT_OF_MEMORY_EXIT_CODE


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is an out-of-memory: XLA's RESOURCE_EXHAUSTED (a JaxRuntimeError, which
  jaxlib raises for a compile or an allocation that does not fit, or a ValueError where an
  array is placed on a device), or the host's MemoryError."""
  if isinstance(error, MemoryError):
    return True
  text = str(error)
  return isinstance(error, jax.errors.JaxRuntimeError | ValueError) and (
    'RESOURCE_EXHAUSTED' in text or 'Out of memory' in text or 'out of memory' in text
  )


def _field(config, name: str):
  section, field = name.split('.')
  return config[section][field] if section in config and field in config[section] else None


def out_of_memory_fault(
  config, step: int, last_good: str, fixed: tuple[str, ...] = (), resumes: bool = False
) -> DeviceMemoryError:
  """One line: the shapes of the step that did not fit, the devices, and what would fit.
  `resumes`: the run has checkpoints, so a changed field resumes it only with
  --allow_config_change, which the line says, and a smaller model only in a new --workdir
  (its checkpoints hold the model's shapes); `fixed`: the fields (dotted) a resume cannot
  change at all (`Task.resume_shapes`), never offered."""
  shapes = ', '.join(
    f'{name.split(".")[1]}={value}'
    for name in _SHAPE_FIELDS
    if (value := _field(config, name)) is not None
  )
  devices = jax.devices()
  batch_field = 'train.batch_size' if _field(config, 'train.batch_size') else 'data.max_tokens'
  batch = _field(config, batch_field)
  fixes = (
    [f'--config.{batch_field}={max(1, batch // 2)}'] if batch and batch_field not in fixed else []
  )
  accum = _field(config, 'train.grad_accum_steps')
  if accum is not None:
    fixes.append(f'--config.train.grad_accum_steps={2 * accum} (the same batch, in parts)')
  if _field(config, 'model.remat') == 'none':
    fixes.append('--config.model.remat=full')
  if _field(config, 'model.scan_layers') is False:
    fixes.append('--config.model.scan_layers=True')
  if _field(config, 'model.dtype') == 'float32':
    fixes.append('--config.model.dtype=bfloat16')
  # Where the parameters and Adam's two moments alone do not fit, only a smaller model does.
  vocabulary = ', config.data.vocab_size' if _field(config, 'data.vocab_size') else ''
  smaller = f'a smaller model (config.model sizes or tables{vocabulary})'
  if not resumes:
    fixes.append(smaller)
    how = ''
  else:
    fixes.append(f'{smaller} in a new --workdir')
    how = ' (each but the last resumes the run with --allow_config_change)'
  return DeviceMemoryError(
    f'out of accelerator memory at step {step} ({shapes}; {len(devices)} '
    f'{devices[0].platform} device(s)); {last_good}; what would fit{how}: {" or ".join(fixes)}'
  )


def evaluation_memory_fault(config, workdir) -> DeviceMemoryError:
  """One line for an out-of-memory while evaluating: the evaluation's sizes and what to
  lower (the training's remedies do not apply)."""
  names = ('batch_size', 'tgt_len', 'mem_len', 'beam_size')
  sizes = {name: config.eval[name] for name in names if name in config.eval}
  shown = ', '.join(f'{name}={value}' for name, value in sizes.items())
  lower = ' or '.join(f'config.eval.{name}' for name in sizes if name != 'mem_len' or sizes[name])
  return DeviceMemoryError(
    f'out of memory evaluating ({shown}); the checkpoints in {workdir} are unchanged; a '
    f'smaller {lower} would fit better'
  )


def step_memory_warning(step, state, batch, device=None) -> str | None:
  """A warning (for `warn`) when the compiled step's memory estimate (XLA's `memory_analysis()`: its
  arguments, outputs and temporaries, less the donated buffers it reuses) exceeds the memory
  `device` (default: this process's first) reports (`batch`: the step's batch, or a function
  that makes it, called only then); None when it fits, when the device reports
  no limit (XLA:CPU) or when the estimate cannot be had. On GPUs and TPUs this compiles the
  step ahead of its first call, which then reuses that compile (jax keeps an ahead-of-time
  compile for the jitted function's later calls: seen with jax_log_compiles on a CPU)."""
  device = device or jax.local_devices()[0]
  try:
    limit = (device.memory_stats() or {}).get('bytes_limit')
  except Exception:  # noqa: BLE001 (a backend without memory statistics)
    return None
  if not limit or not hasattr(step, 'lower'):
    return None
  try:
    batch = batch() if callable(batch) else batch
    stats = step.lower(state, batch).compile().memory_analysis()
    needed = (
      stats.argument_size_in_bytes
      + stats.output_size_in_bytes
      + stats.temp_size_in_bytes
      - stats.alias_size_in_bytes
    )
  except Exception:  # noqa: BLE001 (an estimate only: an out-of-memory compile fails again below)
    return None
  if needed <= limit:
    return None
  return (
    f"the training step needs about {needed / 2**30:.2f} GiB per device by XLA's "
    f'estimate and {device.device_kind} reports {limit / 2**30:.2f} GiB: it will likely run out '
    'of memory (a smaller batch, train.grad_accum_steps, model.remat, model.scan_layers or '
    "model.dtype='bfloat16' would fit better; docs/faults.md)"
  )
