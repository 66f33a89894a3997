"""Beam search for autoregressive decoding (translation), jittable and generic over the model.

The model is a step function `step_fn(tokens_N, cache, step) -> (logits_NV, cache)` over
N = batch * beam rows, so any decoder with an incremental cache plugs in. Vaswani et al. 2017
and Shaw et al. 2018 decode with beam 4 and length penalty alpha = 0.6.

Each step ranks the 2K best one-token extensions of the K alive hypotheses (K = beam_size):

- those ending in EOS among the first K join the finished set, which keeps the K best by
  length-penalised score (as the Flax WMT example and tensor2tensor keep finished hypotheses
  apart from alive ones);
- the K best not ending in EOS become the alive hypotheses (2K candidates hold at least K of
  them, since each alive hypothesis has one EOS extension).

Only EOS candidates within the top K finish (as in classical beam search and fairseq; Flax and
tensor2tensor admit those in the top 2K). So beam_size = 1 with alpha = 0 is exactly greedy
decoding. With alpha > 0 the greedy hypothesis still finishes, but the search goes on while an
alive hypothesis could beat it under the penalty, and returns a longer one if it scores higher.

The search stops when no alive hypothesis can beat the worst finished one, or after max_len
steps. Log-probabilities only fall as tokens are added, so an alive log-prob divided by the
largest penalty it can still reach bounds every score it can finish with (the bound of the Flax
WMT example and T5X, which divide by the penalty at max_len).

"No hypothesis" is a score of -inf throughout: alive slots before there are K distinct
prefixes, finished slots before K hypotheses have finished, and candidates the model gives
probability 0.
"""

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from relpos.constants import PAD_ID

FLOAT32_MAX = float(jnp.finfo(jnp.float32).max)  # past it, float32 is inf


class _State(NamedTuple):
  """The while-loop carry.

  Attributes:
    step: int32 scalar, tokens generated so far (the alive hypotheses' length).
    alive_tokens: int32 [batch, beam, max_len + 1], BOS then the alive prefixes, then PAD.
    alive_log_probs: float32 [batch, beam], their log-probs, best first.
    finished_tokens: int32 [batch, beam, max_len + 1], BOS then hypotheses ending in EOS, PAD.
    finished_scores: float32 [batch, beam], their length-penalised scores, best first.
    cache: the step function's cache, every leaf [batch * beam, ...].
  """

  step: jax.Array
  alive_tokens: jax.Array
  alive_log_probs: jax.Array
  finished_tokens: jax.Array
  finished_scores: jax.Array
  cache: object


def tile_beams(x, beam_size: int):
  """[batch, ...] -> [batch * beam_size, ...]: each row repeated beam_size times, consecutively."""
  return jnp.repeat(x, beam_size, axis=0)


def gnmt_length_penalty(length, alpha):
  """((5 + length) / 6) ** alpha (Wu et al. 2016), with `length` counting the EOS token.

  A hypothesis scores log p / gnmt_length_penalty(length, alpha); a lone EOS (length 1) scores
  its plain log-prob.
  """
  return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


def largest_length_penalty(max_len: int) -> float:
  """The largest alpha, rounded down to two decimals, whose `gnmt_length_penalty` is finite in
  float32 at length `max_len` (the longest a decode runs), inf where every alpha is
  (`max_len` 1: the penalty is 1). A larger alpha overflows to inf for the longer hypotheses,
  and log p / inf is 0 whatever p is: the search ranks them by nothing, and the translations
  are nonsense."""
  base = (5.0 + max_len) / 6.0
  if base <= 1.0:
    return math.inf
  return math.floor(100 * math.log(FLOAT32_MAX) / math.log(base)) / 100


def check_length_penalty(alpha: float, max_len: int, name: str) -> None:
  """ValueError naming `name` (the config field) for an alpha above `largest_length_penalty`
  at `max_len` (config.model.max_len, the longest a decode runs)."""
  largest = largest_length_penalty(max_len)
  if alpha > largest:
    raise ValueError(
      f'{name}={alpha}: the length penalty ((5 + length) / 6) ** alpha overflows float32 at '
      f'the longest decode length (config.model.max_len={max_len} pieces), which ranks the '
      f'longer hypotheses by nothing; give at most {largest}'
    )


def _gather_beams(x_BK, index_BJ):
  """x_BK[b, index_BJ[b, j]] for every b, j: [batch, beam, ...] -> [batch, J, ...]."""
  return x_BK[jnp.arange(x_BK.shape[0])[:, None], index_BJ]


def _reorder_cache(cache, parent_BK):
  """Row b * K + k of every cache leaf becomes row b * K + parent_BK[b, k]: a gather on axis 0."""
  batch_size, beam_size = parent_BK.shape
  rows_N = (jnp.arange(batch_size)[:, None] * beam_size + parent_BK).reshape(-1)
  return jax.tree.map(lambda leaf: jnp.take(leaf, rows_N, axis=0, mode='clip'), cache)


def _force_eos(log_probs_BKV, step, max_lengths_B, eos_id: int):
  """-inf for every token but EOS in rows whose next token reaches max_lengths_B."""
  at_limit_B = step + 1 >= max_lengths_B
  not_eos_V = jnp.arange(log_probs_BKV.shape[-1]) != eos_id
  return jnp.where(at_limit_B[:, None, None] & not_eos_V, -jnp.inf, log_probs_BKV)


def _top_extensions(candidates_BKV, count: int):
  """The `count` best (log-prob, parent beam, token) of candidates_BKV [batch, beam, vocab]
  per example, best first, ties to the lower flat index beam * vocab + token.

  Two rounds of top_k: the best `count` of each beam, then the best `count` of those. Equal to
  one top_k over the flattened [batch, beam * vocab] (the winners of the flat one are among
  each beam's best, and the second round sees them beam-major, so ties break the same way),
  but XLA:CPU turns that flat top_k inside the decoding loop into a full sort of every row, at
  a sentence batch's 64 x 16000 candidates about 200 ms a step.
  """
  batch_size, beam_size, vocab_size = candidates_BKV.shape
  per_beam = min(count, vocab_size)
  beam_log_probs_BKC, beam_token_BKC = jax.lax.top_k(candidates_BKV, per_beam)
  top_log_probs_BC, top_index_BC = jax.lax.top_k(beam_log_probs_BKC.reshape(batch_size, -1), count)
  top_token_BC = jnp.take_along_axis(
    beam_token_BKC.reshape(batch_size, -1), top_index_BC, 1, mode='promise_in_bounds'
  )
  return top_log_probs_BC, top_index_BC // per_beam, top_token_BC


def _with_token(tokens_BCT, token_BC, position):
  """tokens_BCT with token_BC written at `position` (traced scalar)."""
  at_position_T = jnp.arange(tokens_BCT.shape[-1]) == position
  return jnp.where(at_position_T, token_BC[..., None], tokens_BCT)


def beam_search(
  step_fn,
  cache,
  *,
  batch_size: int,
  beam_size: int,
  max_len: int,
  bos_id: int,
  eos_id: int,
  length_penalty: float = 0.6,
  max_lengths=None,
):
  """Beam search with the GNMT length penalty; jittable with step_fn closed over.

  Args:
    step_fn: `(tokens_N, cache, step) -> (logits_NV, cache)` with N = batch_size * beam_size:
      tokens_N (int32) are the tokens at position `step` (int32 scalar; BOS at step 0) and
      logits_NV (any float dtype, taken to float32) score the token at position step + 1.
    cache: pytree whose every leaf is [batch_size, ...]; it is tiled with `tile_beams` and,
      after each step, reordered along axis 0 to follow each hypothesis's parent beam.
    batch_size, beam_size, max_len: static sizes; at most max_len tokens are generated.
    bos_id, eos_id: token ids.
    length_penalty: alpha of `gnmt_length_penalty`; 0 ranks by plain log-prob.
    max_lengths: optional int32 [batch_size], per-example length limit (EOS included): token
      number max_lengths[b] is forced to be EOS, keeping the model's log-prob of it. Values
      above max_len act as max_len, without forcing; values must be >= 1.

  Returns:
    tokens: int32 [batch_size, beam_size, max_len], without BOS, each ending in EOS followed
      by PAD_ID.
    scores: float32 [batch_size, beam_size], log p(tokens) / gnmt_length_penalty(length,
      length_penalty), best first.
    An example with no finished hypothesis after max_len steps returns its alive ones instead:
    max_len tokens without EOS, scored with length max_len. Slots left without a hypothesis
    (fewer than beam_size finished, or fewer distinct sequences) score -inf and are all PAD.
  """
  if min(batch_size, beam_size, max_len) < 1:
    raise ValueError(f'sizes must be >= 1, got {batch_size=}, {beam_size=}, {max_len=}')
  limit_B = jnp.full((batch_size,), max_len, jnp.int32)
  if max_lengths is not None:
    max_lengths = jnp.asarray(max_lengths, jnp.int32)
    limit_B = jnp.minimum(max_lengths, max_len)

  def search_over(state: _State):
    """Whether some example could still improve its finished set (continuation condition)."""
    best_reach_B = jnp.maximum(
      gnmt_length_penalty(state.step + 1, length_penalty),
      gnmt_length_penalty(limit_B, length_penalty),
    )
    best_alive_bound_B = state.alive_log_probs[:, 0] / best_reach_B
    done_B = state.finished_scores[:, -1] >= best_alive_bound_B
    return (state.step < max_len) & ~jnp.all(done_B)

  def grow(state: _State) -> _State:
    """One decoding step: extend, finish the EOS extensions, keep the best alive ones."""
    step = state.step
    tokens_N = state.alive_tokens[:, :, step].reshape(-1)
    logits_NV, cache = step_fn(tokens_N, state.cache, step)
    log_probs_BKV = jax.nn.log_softmax(logits_NV.astype(jnp.float32), axis=-1)
    log_probs_BKV = log_probs_BKV.reshape(batch_size, beam_size, -1)
    if max_lengths is not None:
      log_probs_BKV = _force_eos(log_probs_BKV, step, max_lengths, eos_id)

    candidates_BKV = state.alive_log_probs[:, :, None] + log_probs_BKV
    top_log_probs_BC, top_parent_BC, top_token_BC = _top_extensions(candidates_BKV, 2 * beam_size)
    top_tokens_BCT = _with_token(
      _gather_beams(state.alive_tokens, top_parent_BC), top_token_BC, step + 1
    )
    top_is_eos_BC = top_token_BC == eos_id

    finishing_BK = jnp.where(
      top_is_eos_BC[:, :beam_size],
      top_log_probs_BC[:, :beam_size] / gnmt_length_penalty(step + 1, length_penalty),
      -jnp.inf,
    )
    finished_scores_BK, finished_index_BK = jax.lax.top_k(
      jnp.concatenate([state.finished_scores, finishing_BK], axis=1), beam_size
    )
    finished_tokens_BKT = _gather_beams(
      jnp.concatenate([state.finished_tokens, top_tokens_BCT[:, :beam_size]], axis=1),
      finished_index_BK,
    )

    alive_log_probs_BK, alive_index_BK = jax.lax.top_k(
      jnp.where(top_is_eos_BC, -jnp.inf, top_log_probs_BC), beam_size
    )
    parent_BK = jnp.take_along_axis(top_parent_BC, alive_index_BK, axis=1, mode='promise_in_bounds')
    return _State(
      step=step + 1,
      alive_tokens=_gather_beams(top_tokens_BCT, alive_index_BK),
      alive_log_probs=alive_log_probs_BK,
      finished_tokens=finished_tokens_BKT,
      finished_scores=finished_scores_BK,
      cache=_reorder_cache(cache, parent_BK),
    )

  tokens_BKT = jnp.full((batch_size, beam_size, max_len + 1), PAD_ID, jnp.int32)
  no_hypothesis_BK = jnp.full((batch_size, beam_size), -jnp.inf, jnp.float32)
  initial = _State(
    step=jnp.array(0, jnp.int32),
    alive_tokens=tokens_BKT.at[:, :, 0].set(bos_id),
    # One live BOS per example, so the first step does not expand K copies of it.
    alive_log_probs=no_hypothesis_BK.at[:, 0].set(0.0),
    finished_tokens=tokens_BKT,
    finished_scores=no_hypothesis_BK,
    cache=jax.tree.map(lambda leaf: tile_beams(leaf, beam_size), cache),
  )
  final = jax.lax.while_loop(search_over, grow, initial)

  alive_scores_BK = final.alive_log_probs / gnmt_length_penalty(final.step, length_penalty)
  any_finished_B = final.finished_scores[:, 0] > -jnp.inf
  scores_BK = jnp.where(any_finished_B[:, None], final.finished_scores, alive_scores_BK)
  tokens_BKT = jnp.where(any_finished_B[:, None, None], final.finished_tokens, final.alive_tokens)
  tokens_BKT = jnp.where(scores_BK[:, :, None] > -jnp.inf, tokens_BKT[:, :, 1:], PAD_ID)
  return tokens_BKT, scores_BK
