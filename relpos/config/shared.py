"""The sections and fields both tasks declare with the same meaning: the top-level fields, the
optimizer, the training loop's cadence and the checkpoint evaluation restores.

Each is a `relpos.config.fields.section`; a task extends it with its own fields and gives
inherited ones its own defaults (`relpos.config.char_lm_defaults`,
`relpos.config.translation_defaults`). The defaults here are the character LM's (Transformer-XL
on enwik8). The readers: `relpos.training.loop` (train.*, eval.step, eval.average_checkpoints,
seed), `relpos.training.optim` (optim.*), `relpos.training.restore.restore_model`
(eval.max_relative_position).
"""

from relpos.config import checks
from relpos.config.fields import field, section


@section
class RunFields:
  """The top-level fields of every task's config."""

  task: str = field('', checks.TEXT, 'which relpos.training task train.py / eval.py run')
  seed: int = field(
    0, checks.integer(0, checks.SEED_MAX), 'seeds initialisation, dropout and data order'
  )


@section
class OptimConfig:
  """config.optim: Adam on a learning-rate schedule after global-norm clipping."""

  schedule: str = field(
    'cosine',
    checks.one_of('cosine', 'constant', 'rsqrt'),
    "'cosine' / 'constant' after a linear warmup; 'rsqrt': learning_rate * d_model^-0.5 * "
    'min(step^-0.5, step * warmup^-1.5) (Vaswani et al.)',
  )
  learning_rate: float = field(2.5e-4, checks.positive(), 'the peak (or scale, for rsqrt)')
  final_lr: float = field(0.0, checks.number(0.0), 'where the cosine decay ends')
  warmup_steps: int = field(
    0, checks.integer(0), 'steps of linear warmup (train.py warns if the run ends before the peak)'
  )
  b1: float = field(0.9, checks.fraction(), "Adam's beta1")
  b2: float = field(0.999, checks.fraction(), "Adam's beta2")
  eps: float = field(1e-8, checks.positive(), "Adam's epsilon")
  clip_norm: float = field(0.25, checks.number(0.0), 'global gradient norm clip (0: none)')


@section
class TrainConfig:
  """config.train: the training loop's cadence."""

  steps: int = field(400_000, checks.integer(1), 'optimizer steps')
  log_every: int = field(200, checks.integer(1), 'steps between progress lines')
  eval_every: int = field(
    4000, checks.integer(0), 'steps between validations, and one at the last step (0: none)'
  )
  checkpoint_every: int = field(
    4000, checks.integer(0), 'steps between checkpoints (0: only at the end and on SIGTERM)'
  )
  keep_checkpoints: int = field(3, checks.integer(1), 'the newest checkpoints kept')
  grad_accum_steps: int = field(
    1, checks.integer(1), 'micro-batches per step, for a batch beyond memory'
  )


@section
class EvalConfig:
  """config.eval: which checkpoint evaluation restores, and how."""

  step: int = field(0, checks.integer(0), 'the checkpoint scored (0: the newest)')
  average_checkpoints: int = field(
    1, checks.integer(1), 'average the parameters of the last N checkpoints'
  )
  max_relative_position: int = field(
    -1,
    checks.integer(-1),
    "score with Shaw's distances clipped at this k instead of the trained "
    'config.model.max_relative_position (-1: as trained)',
  )


def check_eval_fields(config, unread_model_fields) -> None:
  """Raises ValueError naming the field for a config.eval.max_relative_position the model
  cannot honour: a clip with no Shaw tables (max_relative_position among the model's
  `unread_model_fields`), or beyond the trained k."""
  clipped = config.eval.max_relative_position
  if clipped >= 0 and 'max_relative_position' in unread_model_fields:
    raise ValueError(
      f"config.eval.max_relative_position={clipped} clips Shaw's tables, but "
      f'config.model.position={config.model.position!r} has none: leave it at -1'
    )
  if clipped > config.model.max_relative_position:
    raise ValueError(
      f'config.eval.max_relative_position={clipped} must be <= the trained '
      f'config.model.max_relative_position={config.model.max_relative_position}: the '
      'tables have no rows beyond it'
    )
