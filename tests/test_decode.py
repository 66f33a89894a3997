"""Beam search against greedy decoding, exhaustive enumeration and recomputed log-probs."""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos import decode
from relpos.constants import BOS_ID, EOS_ID, PAD_ID
from relpos.decode import _top_extensions, beam_search, gnmt_length_penalty, tile_beams

EOS, BOS, VOCAB = EOS_ID, BOS_ID, 5  # the toy model never emits PAD or BOS
GROWING = (3, 4)  # the tokens it emits besides EOS
HISTORY_BUCKETS = 7


def toy_tables(seed, max_len):
  """float32 logits [prev_token, step, vocab] and [history bucket, vocab]."""
  rng = np.random.default_rng(seed)
  step_table = rng.standard_normal((VOCAB, max_len, VOCAB)).astype(np.float32) * 1.5
  history_table = rng.standard_normal((HISTORY_BUCKETS, VOCAB)).astype(np.float32)
  return step_table, history_table


def toy_logits(xp, step_table, history_table, prev, step, history_T, offset):
  """Next-token logits of the toy model, for one row (xp = np) or rows (xp = jnp).

  The history_table row is picked by a position-weighted sum of every token fed so far.
  """
  bucket = (xp.sum(history_T * (xp.arange(history_T.shape[-1]) + 1), axis=-1) + offset) % (
    HISTORY_BUCKETS
  )
  logits_V = step_table[prev, step] + history_table[bucket]
  return xp.where(xp.isin(xp.arange(VOCAB), xp.array([PAD_ID, BOS])), -xp.inf, logits_V)


def toy_step(step_table, history_table, tokens_N, cache, step):
  """The cache records every token fed, per row; it only stays right if beam search reorders
  it with its hypotheses. `offset` makes the examples of a batch differ."""
  history_NT = cache['history'].at[:, step].set(tokens_N)
  logits_NV = toy_logits(
    jnp, step_table, history_table, tokens_N, step, history_NT, cache['offset']
  )
  return logits_NV, {'history': history_NT, 'offset': cache['offset']}


def search(tables, offsets, *, beam_size, max_len, alpha, max_lengths=None):
  """beam_search over the toy model, unjitted; see `jit_search`."""
  cache = {
    'history': jnp.zeros((len(offsets), max_len + 1), jnp.int32),
    'offset': jnp.asarray(offsets, jnp.int32),
  }
  return beam_search(
    functools.partial(toy_step, *(jnp.asarray(table) for table in tables)),
    cache,
    batch_size=len(offsets),
    beam_size=beam_size,
    max_len=max_len,
    bos_id=BOS,
    eos_id=EOS,
    length_penalty=alpha,
    max_lengths=max_lengths,
  )


@functools.partial(jax.jit, static_argnames=('beam_size', 'max_len'))
def jit_search(tables, offsets, *, beam_size, max_len, alpha, max_lengths=None):
  """Tables, offsets, alpha and max_lengths traced: one compilation per shape."""
  return search(
    tables, offsets, beam_size=beam_size, max_len=max_len, alpha=alpha, max_lengths=max_lengths
  )


def reference_log_probs(tables, offset, tokens):
  """float64 log p(token) of each token under the toy model, BOS first."""
  step_table, history_table = (np.asarray(t, np.float64) for t in tables)
  history = np.zeros(len(tokens) + 1, np.int64)
  history[0] = BOS
  log_probs = []
  for step, token in enumerate(tokens):
    logits = toy_logits(np, step_table, history_table, history[step], step, history, offset)
    log_probs.append(logits[token] - np.logaddexp.reduce(logits))
    history[step + 1] = token
  return np.array(log_probs)


def reference_score(tables, offset, tokens, alpha):
  """Length-penalised log-prob; length counts EOS."""
  return reference_log_probs(tables, offset, tokens).sum() / ((5 + len(tokens)) / 6) ** alpha


def trim(row):
  """Tokens up to and including the first EOS (all of them without EOS)."""
  row = list(np.asarray(row))
  return row[: row.index(EOS) + 1] if EOS in row else row


def greedy(tables, offset, max_len):
  """Argmax decoding of the toy model, until EOS or max_len tokens."""
  tokens = []
  while len(tokens) < max_len and EOS not in tokens:
    tokens.append(
      max(range(VOCAB), key=lambda t: reference_log_probs(tables, offset, [*tokens, t])[-1])
    )
  return tokens


def exhaustive(tables, offset, max_len, alpha):
  """Every EOS-terminated sequence of at most max_len tokens, best first: [(score, tokens)]."""
  hypotheses = [
    [*prefix, EOS]
    for length in range(max_len)
    for prefix in itertools.product(GROWING, repeat=length)
  ]
  scored = [(reference_score(tables, offset, h, alpha), h) for h in hypotheses]
  return sorted(scored, key=lambda scored_hypothesis: -scored_hypothesis[0])


def assert_well_formed(tokens_BKT, scores_BK):
  """Found hypotheses: EOS then only PAD; empty slots (-inf): only PAD, and after found ones."""
  assert tokens_BKT.dtype == np.int32 and scores_BK.dtype == np.float32
  for row, score in zip(
    tokens_BKT.reshape(-1, tokens_BKT.shape[-1]), scores_BK.reshape(-1), strict=True
  ):
    kept = trim(row)
    assert np.all(row[len(kept) :] == PAD_ID)
    assert (PAD_ID in kept) == (score == -np.inf)
  assert np.all(scores_BK[:, 1:] <= scores_BK[:, :-1]), 'scores not best first'


def test_tile_beams():
  x = jnp.arange(6).reshape(2, 3)
  np.testing.assert_array_equal(tile_beams(x, 2), [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])


def test_length_penalty_counts_eos():
  assert gnmt_length_penalty(1, 0.6) == 1.0
  np.testing.assert_allclose(gnmt_length_penalty(3, 0.6), (8 / 6) ** 0.6, rtol=1e-6)


@pytest.mark.parametrize('seed', [0, 1])
def test_beam_one_alpha_zero_is_greedy(seed):
  max_len, offsets = 6, [0, 3, 5]
  tables = toy_tables(seed, max_len)
  tokens_BKT, scores_BK = jit_search(tables, offsets, beam_size=1, max_len=max_len, alpha=0.0)
  for b, offset in enumerate(offsets):
    expected = greedy(tables, offset, max_len)
    assert trim(tokens_BKT[b, 0]) == expected
    np.testing.assert_allclose(
      scores_BK[b, 0], reference_score(tables, offset, expected, 0.0), atol=1e-5
    )


def test_beam_one_penalised_at_least_greedy():
  """With alpha > 0 greedy's hypothesis still finishes; a longer one may only replace it if it
  scores higher."""
  max_len, offsets = 6, list(range(7))
  tables = toy_tables(2, max_len)
  _, scores_BK = jit_search(tables, offsets, beam_size=1, max_len=max_len, alpha=0.6)
  for b, offset in enumerate(offsets):
    greedy_score = reference_score(tables, offset, greedy(tables, offset, max_len), 0.6)
    assert scores_BK[b, 0] >= greedy_score - 1e-5


@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_wide_beam_is_exhaustive(alpha):
  """K = 32 holds every candidate of every step (at most 8 prefixes x 3 tokens), so the beam
  finds all 15 EOS-terminated sequences of <= 4 tokens, ranked; the other slots stay empty."""
  max_len, offsets = 4, [0, 4]
  tables = toy_tables(3, max_len)
  tokens_BKT, scores_BK = jit_search(tables, offsets, beam_size=32, max_len=max_len, alpha=alpha)
  tokens_BKT, scores_BK = np.asarray(tokens_BKT), np.asarray(scores_BK)
  assert tokens_BKT.shape == (2, 32, max_len) and scores_BK.shape == (2, 32)
  assert_well_formed(tokens_BKT, scores_BK)
  for b, offset in enumerate(offsets):
    expected = exhaustive(tables, offset, max_len, alpha)
    assert [trim(row) for row in tokens_BKT[b, : len(expected)]] == [h for _, h in expected]
    np.testing.assert_allclose(scores_BK[b, : len(expected)], [s for s, _ in expected], atol=1e-5)
    assert np.all(scores_BK[b, len(expected) :] == -np.inf)
  # the examples differ, through the cached history's offset
  assert not np.array_equal(tokens_BKT[0], tokens_BKT[1])


def test_max_lengths_is_exhaustive_below_limit():
  """Forcing EOS at the limit prunes longer sequences and keeps the model's EOS log-prob."""
  max_len, offsets, max_lengths = 4, [0, 4, 1], [2, 4, 1]
  tables = toy_tables(4, max_len)
  tokens_BKT, scores_BK = jit_search(
    tables, offsets, beam_size=32, max_len=max_len, alpha=0.6, max_lengths=jnp.array(max_lengths)
  )
  for b, (offset, limit) in enumerate(zip(offsets, max_lengths, strict=True)):
    expected = exhaustive(tables, offset, limit, 0.6)
    assert [trim(row) for row in tokens_BKT[b, : len(expected)]] == [h for _, h in expected]
    np.testing.assert_allclose(scores_BK[b, : len(expected)], [s for s, _ in expected], atol=1e-5)
    assert np.all(scores_BK[b, len(expected) :] == -np.inf)


def test_scores_are_recomputed_log_probs():
  """Beam 4 with early stopping: every hypothesis' score is its penalised log-prob, which only
  holds if the cache followed each hypothesis through the reordering."""
  max_len, offsets = 10, [0, 1, 2, 3, 4, 5]
  tables = toy_tables(5, max_len)
  tokens_BKT, scores_BK = jit_search(tables, offsets, beam_size=4, max_len=max_len, alpha=0.6)
  tokens_BKT, scores_BK = np.asarray(tokens_BKT), np.asarray(scores_BK)
  assert_well_formed(tokens_BKT, scores_BK)
  assert np.all(np.isfinite(scores_BK))
  for b, offset in enumerate(offsets):
    rows = [trim(row) for row in tokens_BKT[b]]
    assert all(row[-1] == EOS for row in rows)
    assert len({tuple(row) for row in rows}) == 4, 'duplicate hypotheses'
    recomputed = [reference_score(tables, offset, row, 0.6) for row in rows]
    np.testing.assert_allclose(scores_BK[b], recomputed, atol=1e-5)


def test_max_lengths_respected():
  max_len, offsets, max_lengths = 8, [0, 1, 2, 3], [1, 3, 8, 20]
  tables = toy_tables(6, max_len)
  tokens_BKT, scores_BK = jit_search(
    tables, offsets, beam_size=4, max_len=max_len, alpha=0.6, max_lengths=jnp.array(max_lengths)
  )
  tokens_BKT, scores_BK = np.asarray(tokens_BKT), np.asarray(scores_BK)
  assert_well_formed(tokens_BKT, scores_BK)
  # a limit of 1 leaves the single hypothesis [EOS]
  assert trim(tokens_BKT[0, 0]) == [EOS] and np.all(scores_BK[0, 1:] == -np.inf)
  for b, limit in enumerate(max_lengths):
    for row, score in zip(tokens_BKT[b], scores_BK[b], strict=True):
      if score > -np.inf:
        assert len(trim(row)) <= min(limit, max_len)
        np.testing.assert_allclose(
          score, reference_score(tables, offsets[b], trim(row), 0.6), atol=1e-5
        )


def fixed_step(log_probs_PV, tokens_N, cache, step):
  """A model whose next-token distribution depends only on the previous token."""
  return jnp.asarray(log_probs_PV)[tokens_N], cache


@functools.partial(jax.jit, static_argnames=('beam_size', 'max_len'))
def fixed_search(log_probs_PV, *, beam_size, max_len, alpha):
  return beam_search(
    functools.partial(fixed_step, log_probs_PV),
    {'unused': jnp.zeros((1,))},
    batch_size=1,
    beam_size=beam_size,
    max_len=max_len,
    bos_id=BOS,
    eos_id=EOS,
    length_penalty=alpha,
  )


def test_length_penalty_changes_ranking():
  """log p([EOS]) = -1.0 > log p([3, EOS]) = -1.05, but (7/6)^0.6 = 1.097 lifts the longer one
  to -0.957; a lone EOS (length 1) is never penalised."""
  p_eos_3_by_prev = {BOS: (np.exp(-1.0), 0.6), 3: (np.exp(-1.05) / 0.6, 0.3), 4: (0.5, 0.3)}
  log_probs_PV = np.full((VOCAB, VOCAB), -np.inf, np.float32)
  for prev, (p_eos, p_3) in p_eos_3_by_prev.items():
    log_probs_PV[prev, [EOS, 3, 4]] = np.log([p_eos, p_3, 1 - p_eos - p_3])
  for alpha, best, runner_up in [(0.0, [EOS], [3, EOS]), (0.6, [3, EOS], [EOS])]:
    tokens_BKT, scores_BK = fixed_search(log_probs_PV, beam_size=2, max_len=3, alpha=alpha)
    assert [trim(row) for row in tokens_BKT[0]] == [best, runner_up]
    expected = {(EOS,): -1.0, (3, EOS): -1.05 / (7 / 6) ** alpha}
    np.testing.assert_allclose(
      scores_BK[0], [expected[tuple(best)], expected[tuple(runner_up)]], atol=1e-5
    )


def test_no_finished_returns_alive():
  """A model that never emits EOS: the alive hypotheses come back, max_len tokens each, scored
  with length max_len."""
  log_probs_PV = np.full((VOCAB, VOCAB), -np.inf, np.float32)
  for prev, p_3 in [(BOS, 0.7), (3, 0.6), (4, 0.8)]:
    log_probs_PV[prev, [3, 4]] = np.log([p_3, 1 - p_3])
  tokens_BKT, scores_BK = fixed_search(log_probs_PV, beam_size=3, max_len=3, alpha=0.6)
  assert tokens_BKT.tolist() == [[[3, 3, 3], [3, 4, 3], [3, 3, 4]]]
  expected = np.log([0.7 * 0.6 * 0.6, 0.7 * 0.4 * 0.8, 0.7 * 0.6 * 0.4]) / (8 / 6) ** 0.6
  np.testing.assert_allclose(scores_BK[0], expected, atol=1e-5)


def test_jit_matches_eager():
  max_len, offsets = 5, [1, 2]
  tables = toy_tables(7, max_len)
  eager = search(tables, offsets, beam_size=3, max_len=max_len, alpha=0.6)
  jitted = jit_search(tables, offsets, beam_size=3, max_len=max_len, alpha=0.6)
  np.testing.assert_array_equal(eager[0], jitted[0])
  np.testing.assert_allclose(eager[1], jitted[1], atol=1e-6)


def test_rejects_empty_sizes():
  with pytest.raises(ValueError, match='beam_size=0'):
    fixed_search(np.zeros((VOCAB, VOCAB), np.float32), beam_size=0, max_len=3, alpha=0.6)


def test_stops_early():
  """[EOS] and [3, EOS] finish in 2 steps; the best alive hypothesis, [3, 3] (log p = -4.6),
  cannot reach their scores even at max_len, so the search stops there."""
  log_probs_PV = np.full((VOCAB, VOCAB), -np.inf, np.float32)
  log_probs_PV[:, [EOS, 3]] = np.log([0.9, 0.1])
  steps = []

  def counting_step(tokens_N, cache, step):
    jax.debug.callback(steps.append, step)
    return fixed_step(log_probs_PV, tokens_N, cache, step)

  tokens_BKT, _ = beam_search(
    counting_step, {}, batch_size=1, beam_size=2, max_len=10, bos_id=BOS, eos_id=EOS
  )
  jax.block_until_ready(tokens_BKT)
  assert [trim(row) for row in tokens_BKT[0]] == [[EOS], [3, EOS]]
  assert [int(step) for step in steps] == [0, 1]


def test_continues_while_alive_can_win():
  """Beam 1, alpha = 2: [EOS] (log p = -0.69) finishes first. [3] (-1.05) could still win at
  length 4 (bound -1.05 / (9/6)^2 = -0.47), though not at length 2 (-0.77), and does:
  [3, 4, EOS] scores -1.15 / (8/6)^2 = -0.65."""
  log_probs_PV = np.full((VOCAB, VOCAB), -np.inf, np.float32)
  log_probs_PV[BOS, [EOS, 3, 4]] = np.log([0.5, 0.35, 0.15])
  log_probs_PV[3, [EOS, 4]] = np.log([0.05, 0.95])
  log_probs_PV[4, [EOS, 3]] = np.log([0.95, 0.05])
  tokens_BKT, scores_BK = fixed_search(log_probs_PV, beam_size=1, max_len=4, alpha=2.0)
  assert trim(tokens_BKT[0, 0]) == [3, 4, EOS]
  np.testing.assert_allclose(scores_BK[0, 0], np.log(0.35 * 0.95**2) / (8 / 6) ** 2, atol=1e-6)


@pytest.mark.parametrize('vocab', [3, 50])
def test_top_extensions_equal_flat_top_k(vocab):
  """Two rounds of top_k pick what one top_k over [batch, beam * vocab] picks, ties included
  (the values are rounded to a few levels so that many candidates tie), also when the vocabulary
  is smaller than the count asked for."""
  rng = np.random.default_rng(0)
  candidates_BKV = np.round(rng.standard_normal((5, 4, vocab)), 0).astype(np.float32)
  candidates_BKV[0, 1:] = -np.inf  # one live beam, as at the first step
  count = 8
  values_BC, parent_BC, token_BC = _top_extensions(jnp.asarray(candidates_BKV), count)
  flat_values_BC, flat_index_BC = jax.lax.top_k(jnp.asarray(candidates_BKV.reshape(5, -1)), count)
  np.testing.assert_array_equal(values_BC, flat_values_BC)
  np.testing.assert_array_equal(parent_BC, flat_index_BC // vocab)
  np.testing.assert_array_equal(token_BC, flat_index_BC % vocab)


def test_a_length_penalty_that_overflows_float32_is_refused_with_the_config():
  """((5 + L) / 6) ** alpha overflowed float32 for long hypotheses (alpha 30 at
  max_len 256), and log p / inf ranks them by nothing: nonsense translations, no word. The
  config checks refuse an alpha past the largest finite one at config.model.max_len."""
  from helpers import load_config

  from relpos.training import translation_task as translate

  largest = decode.largest_length_penalty(256)
  assert largest == 23.51
  assert np.isfinite(decode.gnmt_length_penalty(256, largest))
  assert np.isinf(decode.gnmt_length_penalty(256, largest + 0.01))
  assert decode.largest_length_penalty(1) == math.inf  # the penalty is 1 at length 1
  config = load_config('translate_tiny', 'shaw')
  config.model.max_len = 256
  config.eval.length_penalty = largest
  translate.TASK.check_config(config)
  config.eval.length_penalty = 1e6
  with pytest.raises(ValueError) as error:
    translate.TASK.check_config(config)
  assert str(error.value) == (
    'config.eval.length_penalty=1000000.0: the length penalty ((5 + length) / 6) ** alpha '
    'overflows float32 at the longest decode length (config.model.max_len=256 pieces), which '
    'ranks the longer hypotheses by nothing; give at most 23.51'
  )
