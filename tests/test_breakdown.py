"""relpos.studies.breakdown: a sweep's BLEU by source length and bpc by position, per bucket."""

import pytest

from relpos.studies import breakdown


def test_buckets_are_labelled_and_bad_edges_name_the_flag():
  assert breakdown.buckets(['2', '3', '6'], breakdown.SOURCE_LENGTH) == [
    ('1-2', 1, 2),
    ('3', 3, 3),
    ('4-6', 4, 6),
    ('7+', 7, None),
  ]
  for edges in ([], ['0', '3'], ['4', '4'], ['5', '2'], ['five']):
    with pytest.raises(ValueError, match='--by_position must be increasing positive'):
      breakdown.buckets(edges, breakdown.POSITION)


def test_scores_each_bucket_and_tests_against_the_baseline(tmp_path):
  words = 'the cat sat on a mat by my door with its red hat'.split()
  sources = [' '.join(words[: 2 + i % 6]) for i in range(24)]  # 2..7 words
  references = [f'{source} and {i} more words here' for i, source in enumerate(sources)]
  garbled = [' '.join(reversed(reference.split())) for reference in references]
  members = breakdown._members([len(s.split()) for s in sources], [3], breakdown.SOURCE_LENGTH)
  assert sorted(members['1-3'] + members['4+']) == list(range(24))
  assert all(len(sources[i].split()) <= 3 for i in members['1-3'])
  # 'good' is perfect on short sources only; 'bad' is garbled everywhere; seeds alike.
  good = [references[i] if i in members['1-3'] else garbled[i] for i in range(24)]
  translations = {'bad': {0: garbled, 1: garbled}, 'good': {0: good, 1: list(good)}}
  lengths = [len(source.split()) for source in sources]
  summary, per_run = breakdown.bleu_by_source_length(
    lengths, references, translations, 'bad', [3], target_lang='en'
  )
  assert len(per_run) == 8
  row = {(r['value'], r['bucket']): r for r in summary}
  assert row['good', '1-3']['mean'] == pytest.approx(100.0)
  assert row['good', '1-3']['difference'] > 50 and row['good', '1-3']['p_value'] < 0.01
  assert row['good', '4+']['difference'] == pytest.approx(0.0)
  assert row['bad', '1-3']['difference'] is None  # the baseline
  markdown = breakdown.markdown(summary, breakdown.SOURCE_LENGTH, 'model.position', 'bad', per_run)
  assert '| good | 100.00 ± 0.00 |' in markdown
  assert markdown.endswith('| good | 1.000 ± 0.000 | 1.000 ± 0.000 |\n')  # length ratios
  plotted = breakdown.plot(
    summary, per_run, breakdown.SOURCE_LENGTH, tmp_path, 'model.position', 'bad'
  )
  assert plotted.exists()
  with pytest.raises(ValueError, match='bad seed 0: 3 translations for 24 sources'):
    breakdown.bleu_by_source_length(
      lengths, references, {'bad': {0: garbled[:3]}}, 'bad', [3], target_lang='en'
    )


def test_bpc_by_position_weights_each_position_by_its_characters():
  """Positions 1..4 of two runs; the last, short segment left position 4 with fewer
  characters, so bucket 3+ is a weighted mean; a result without position_bpc is refused."""
  base = {'position_bpc': [4.0, 3.0, 2.0, 1.0], 'position_tokens': [10, 10, 10, 5]}
  other = {'position_bpc': [3.0, 3.0, 2.5, 1.0], 'position_tokens': [10, 10, 10, 5]}
  results = {'base': {0: base, 1: base}, 'other': {0: other, 1: dict(other)}}
  summary, per_run = breakdown.bpc_by_position(results, 'base', [1, 2])
  row = {(r['value'], r['bucket']): r for r in summary}
  assert row['base', '3+']['mean'] == pytest.approx((2.0 * 10 + 1.0 * 5) / 15)
  assert row['base', '3+']['count'] == 15 and row['base', '1']['count'] == 10
  assert row['other', '1']['difference'] == pytest.approx(-1.0)
  assert row['other', '1']['p_value'] is None  # no item test for bpc
  assert row['other', '1']['p_seeds'] is None  # every seed differs by the same amount
  assert len(per_run) == 12
  with pytest.raises(ValueError, match='the baseline gone has no finished runs'):
    breakdown.bpc_by_position(results, 'gone', [1])
  with pytest.raises(ValueError, match='base seed 0: its eval_results.json has no position_bpc'):
    breakdown.bpc_by_position({'base': {0: {'bpc': 2.0}}}, 'base', [1])


def test_a_buckets_difference_is_over_the_seeds_the_tests_pair():
  """With a seed of the baseline missing (diverged), the difference compared means over other
  seed sets than the paired tests."""
  per_run = [
    {'value': 'a', 'seed': 0, 'bucket': '1', 'bpc': 2.0},
    {'value': 'a', 'seed': 1, 'bucket': '1', 'bpc': 3.0},
    {'value': 'b', 'seed': 0, 'bucket': '1', 'bpc': 1.5},
  ]
  summary, _ = breakdown.by_bucket(per_run, {'1': 8}, 'a', 'bpc', None)
  assert summary[1]['difference'] == pytest.approx(-0.5)  # seed 0's, not 1.5 - 2.5
