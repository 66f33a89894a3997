"""relpos.by_length: BLEU per bucket of source length, with the sweep's two p-values."""

import pytest

from relpos import by_length


def test_buckets_are_labelled_and_bad_edges_name_the_flag():
  assert by_length.buckets(['2', '3', '6']) == [
    ('1-2', 1, 2),
    ('3', 3, 3),
    ('4-6', 4, 6),
    ('7+', 7, None),
  ]
  for edges in ([], ['0', '3'], ['4', '4'], ['5', '2'], ['five']):
    with pytest.raises(ValueError, match='--by_source_length must be increasing positive'):
      by_length.buckets(edges)


def test_scores_each_bucket_and_tests_against_the_baseline(tmp_path):
  words = 'the cat sat on a mat by my door with its red hat'.split()
  sources = [' '.join(words[: 2 + i % 6]) for i in range(24)]  # 2..7 words
  references = [f'{source} and {i} more words here' for i, source in enumerate(sources)]
  garbled = [' '.join(reversed(reference.split())) for reference in references]
  members = by_length.bucket_members(sources, [3])
  assert sorted(members['1-3'] + members['4+']) == list(range(24))
  assert all(len(sources[i].split()) <= 3 for i in members['1-3'])
  # 'good' is perfect on short sources only; 'bad' is garbled everywhere; seeds alike.
  good = [references[i] if i in members['1-3'] else garbled[i] for i in range(24)]
  translations = {'bad': {0: garbled, 1: garbled}, 'good': {0: good, 1: list(good)}}
  summary, per_run = by_length.score(sources, references, translations, 'bad', [3])
  assert len(per_run) == 8
  row = {(r['value'], r['bucket']): r for r in summary}
  assert row['good', '1-3']['mean'] == pytest.approx(100.0)
  assert row['good', '1-3']['difference'] > 50 and row['good', '1-3']['p_value'] < 0.01
  assert row['good', '4+']['difference'] == pytest.approx(0.0)
  assert row['bad', '1-3']['difference'] is None  # the baseline
  markdown = by_length.markdown(summary, 'model.position', 'bad')
  assert '| good | 100.00 ± 0.00 |' in markdown
  assert by_length.plot(summary, tmp_path, 'model.position').exists()
  with pytest.raises(ValueError, match='bad seed 0: 3 translations for 24 sources'):
    by_length.score(sources, references, {'bad': {0: garbled[:3]}}, 'bad', [3])
