"""relpos.studies.sweep: values and seeds, the checks before training, the tables with p-values, and
the whole train -> evaluate -> tabulate loop at tiny sizes."""

import collections
import csv
import json
import re
from pathlib import Path

import pytest
from helpers import (
  load_config,
  run_sweep_main,
  tiny_char_config,
  tiny_translate_config,
  write_pair_corpus,
)

from relpos.data import tokenizer
from relpos.files import recorded_source
from relpos.studies import breakdown, significance, sweep, sweep_grid, sweep_tables
from relpos.training import char_lm_task as char_lm
from relpos.training import finished_run, loop, run_config, run_results, tasks
from relpos.training import translation_task as translate_task
from relpos.training.run_config import read_config

REPO = Path(__file__).resolve().parent.parent
RUNS = [('shaw', 0), ('shaw', 1), ('absolute', 0), ('absolute', 1)]  # the sweep's order
train_model = tokenizer.train_model  # the real one, which a test counts the calls of


def test_parse_value_uses_the_field_type():
  config = load_config('char_tiny')
  assert sweep_grid.parse_value(config, 'model.max_relative_position', '4') == 4
  assert sweep_grid.parse_value(config, 'optim.learning_rate', '0.5') == 0.5
  assert sweep_grid.parse_value(config, 'train.same_length', 'true') is True
  # Any case: --values=True,False sweeps both (a cased True read as False trained one twice).
  assert sweep_grid.parse_value(config, 'train.same_length', 'True') is True
  assert sweep_grid.parse_value(config, 'train.same_length', 'YES') is True
  assert sweep_grid.parse_value(config, 'train.same_length', 'False') is False
  assert sweep_grid.parse_value(config, 'model.position', 'absolute') == 'absolute'
  with pytest.raises(ValueError, match='no field'):
    sweep_grid.parse_value(config, 'model.max_relative_positon', '4')
  with pytest.raises(ValueError, match='no section'):
    sweep_grid.parse_value(config, 'modle.mem_len', '4')
  with pytest.raises(ValueError, match=r"--values: 'four' is not a int"):
    sweep_grid.parse_value(config, 'model.max_relative_position', 'four')


def test_with_value_copies():
  config = load_config('char_tiny')
  changed = sweep_grid.with_value(config, 'model.max_relative_position', 2)
  assert changed.model.max_relative_position == 2
  assert config.model.max_relative_position == 16


@pytest.mark.parametrize(
  ('name', 'preset', 'field', 'values', 'metric', 'message'),
  [
    ('char_tiny', 'shaw', 'model.max_relative_position', [4], 'bleu', 'reports bpc, not bleu'),
    ('translate_tiny', 'shaw', 'model.max_relative_position', [4], 'bpc', 'reports bleu, perp'),
    ('translate_tiny', 'absolute', 'model.max_relative_position', [0, 4], 'bleu', 'does not read'),
    ('char_tiny', 'xl', 'model.relative_values', [True, False], 'bpc', 'does not read'),
    ('char_tiny', 'shaw', 'model.untie_r', [True, False], 'bpc', 'does not read'),
    ('translate_tiny', 'shaw', 'model.num_heads', [4, 3], 'bleu', r'at 3: config\.model\.d_model'),
    ('translate_tiny', 'shaw', 'model.position', ['shaw', 'relative'], 'bleu', 'at .relative.'),
    ('char_tiny', 'shaw', 'seed', [0, 1], 'bpc', '--field=seed: every run sets config.seed'),
    # Before, --field=task trained a run recording "task": "2", then refused its own workdir.
    ('char_tiny', 'shaw', 'task', ['2', '4'], 'bpc', "--field=task: every run .* config's task"),
    ('char_tiny', 'shaw', 'eval.clamp_len', [-1, 1], 'bpc', "position='shaw' does not read it"),
  ],
)
def test_a_sweep_that_cannot_work_is_refused_before_training(
  name, preset, field, values, metric, message
):
  with pytest.raises(ValueError, match=message):
    sweep.check_sweep(load_config(name, preset), field, values, [0], metric)


def test_an_evaluation_setting_a_swept_model_never_reads_is_refused_before_training():
  """--evaluations setting eval.clamp_len over a position sweep: eval.py refuses it for the
  shaw runs (`run_config.check_unread_settings`), so the sweep does before any trains; xl's
  runs read it."""
  config = load_config('char_tiny', 'xl')
  evaluations = {'clamp': {'eval.clamp_len': 8}}
  sweep.check_sweep(config, 'model.position', ['xl'], [0], 'bpc', evaluations=evaluations)
  with pytest.raises(ValueError) as refused:
    sweep.check_sweep(
      config, 'model.position', ['shaw', 'xl', 't5'], [0], 'bpc', evaluations=evaluations
    )
  # It said "leave it as the run has it (the swept config has it)": no way out of a mixed grid.
  assert str(refused.value).startswith('--evaluations=clamp for model.position=shaw: eval.')
  assert str(refused.value).endswith(
    'sweep model.position=xl alone with it, or drop it from --evaluations'
  )
  with pytest.raises(ValueError, match=r'shaw: eval.* used; drop it from --evaluations$'):
    sweep.check_sweep(config, 'model.position', ['shaw'], [0], 'bpc', evaluations=evaluations)


def test_fields_read_at_some_value_may_be_swept():
  config = load_config('translate_tiny', 'absolute')
  sweep.check_sweep(config, 'model.position', ['absolute', 'shaw'], [0, 1], 'bleu')
  sweep.check_sweep(config, 'optim.learning_rate', [0.5, 1.0], [0], 'perplexity')
  # k varies a Shaw model: allowed, also when the sweep starts from another position.
  shaw = load_config('translate_tiny', 'shaw')
  sweep.check_sweep(shaw, 'model.max_relative_position', [0, 4], [0], 'bleu')


def _fake_runs(root, field, scores, *, metric='bpc'):
  """eval_results.json of finished runs: {value: [score per seed]}, bpc with segments."""
  for value, per_seed in scores.items():
    for seed, score in enumerate(per_seed):
      run = sweep_grid.run_dir(root, field, value, seed)
      run.mkdir(parents=True)
      segments = [score * 0.6931 * 8 + 0.01 * ((i * 7 + seed) % 5) for i in range(40)]
      results = {metric: score, 'step': 10, 'segment_nats': segments, 'segment_tokens': [8] * 40}
      (run / 'eval_results.json').write_text(json.dumps(results))


def _fake_runs_of_char_tiny_shaw(root, field, scores):
  """`_fake_runs`, each result as a run of char_tiny:shaw at _fake_runs' step scores it (the
  config's config.eval recorded): the config, of whose sweep they are the finished runs."""
  _fake_runs(root, field, scores)
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  for results in root.glob('*/*/eval_results.json'):
    results.write_text(
      json.dumps(json.loads(results.read_text()) | {'eval': config.eval.to_dict()})
    )
  return config


def test_tables_have_mean_std_and_p_values(tmp_path):
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0, 2.1, 2.2], 4: [1.5, 1.6], 16: [2.0, 2.1, 2.2]})
  config = load_config('char_tiny', 'shaw')
  runs = sweep_tables.read_runs(tmp_path, field, [0, 4, 16, 64], [0, 1, 2])  # 64: no runs
  rows = sweep_tables.collect(runs, 'bpc')
  assert [(row['value'], row['seed']) for row in rows] == [
    (0, 0),
    (0, 1),
    (0, 2),
    (4, 0),
    (4, 1),
    (16, 0),
    (16, 1),
    (16, 2),
  ]
  summary = sweep_tables.summarise(config, rows, [0, 4, 16, 64], 'bpc', baseline=0)
  assert [(row['value'], row['n']) for row in summary] == [(0, 3), (4, 2), (16, 3), (64, 0)]
  assert summary[0]['n'] == 3 and summary[0]['mean'] == pytest.approx(2.1)
  assert summary[0]['std'] == pytest.approx(0.1) and summary[0]['p_value'] is None
  assert summary[1]['n'] == 2 and summary[1]['p_value'] < 0.01  # far apart on every segment
  assert summary[2]['p_value'] > 0.5  # the same segments as the baseline
  # Over seeds: 4 is a constant shift (no test), 16 identical to the baseline (no test).
  assert summary[0]['p_seeds'] is None and summary[1]['p_seeds'] is None
  assert summary[2]['p_seeds'] is None
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, field, 'bpc', baseline=0)
  # 4 over the seeds it shares with the baseline, 0 and 1 (the seed test's): not 1.55 - 2.1.
  assert summary[0]['difference'] is None and summary[1]['difference'] == pytest.approx(-0.5)
  assert '| 0 | 3 | 2.100 | 0.100 | (baseline) | (baseline) | (baseline) |' in markdown
  assert '| 4 | 2 | 1.550 | 0.071 | -0.500 | ' in markdown
  assert '| 16 | 3 | 2.100 | 0.100 | +0.000 | ' in markdown
  assert '| 64 | 0 | – | – | – | – | – |' in markdown  # a value with no run keeps its row
  with open(tmp_path / 'sweep.csv') as stream:
    table = list(csv.DictReader(stream))
  assert list(table[0]) == 'value n mean std difference p_value p_seeds diverged'.split()
  assert [row['value'] for row in table] == ['0', '4', '16', '64'] and table[0]['p_value'] == ''
  assert table[0]['difference'] == '' and float(table[1]['difference']) == pytest.approx(-0.5)
  with open(tmp_path / 'sweep_seeds.csv') as stream:
    assert len(list(csv.DictReader(stream))) == 8
  png = sweep_tables.plot(summary, rows, tmp_path, field, 'bpc')
  assert png.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  with pytest.raises(ValueError, match="has no 'bleu'"):
    sweep_tables.collect(sweep_tables.read_runs(tmp_path, field, [0], [0]), 'bleu')


def test_tables_name_the_as_trained_sentinel_and_the_csv_keeps_the_value(tmp_path):
  field = 'eval.max_relative_position'
  summary = [
    dict(value=-1, n=1, mean=21.0, std=None, difference=None, p_value=None, p_seeds=None),
    dict(value=4, n=1, mean=20.5, std=None, difference=-0.5, p_value=0.01, p_seeds=None),
  ]
  rows = [dict(value=-1, seed=0, bleu=21.0, step=9), dict(value=4, seed=0, bleu=20.5, step=9)]
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, field, 'bleu', baseline=-1)
  assert '| -1 (as trained) | 1 | 21.000 |' in markdown
  assert '| -1 (as trained) | 0 | 21.000 | 9 |' in markdown and '| 4 | 0 | 20.500 | 9 |' in markdown
  with open(tmp_path / 'sweep.csv') as stream:
    assert [row['value'] for row in csv.DictReader(stream)] == ['-1', '4']
  assert sweep_tables.value_label('model.max_relative_position', -1) == '-1'


def test_a_difference_too_small_for_the_means_digits_is_not_printed_as_0(tmp_path):
  """sweep.md showed bpc 7.194 against 7.194 with p < 0.001 and no difference column."""
  summary = [
    dict(value=0, n=1, mean=7.1941, std=None, difference=None, p_value=None, p_seeds=None),
    dict(value=4, n=1, mean=7.1943, std=None, difference=0.0002, p_value=0.0001, p_seeds=None),
  ]
  rows = [dict(value=0, seed=0, bpc=7.1941, step=9), dict(value=4, seed=0, bpc=7.1943, step=9)]
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, 'eval.mem_len', 'bpc', baseline=0)
  assert '| 4 | 1 | 7.194 | – | +0.0002 | < 0.001 | – |' in markdown
  assert significance.difference_text(-0.00012345) == '-0.00012'
  assert significance.difference_text(0.0) == '+0.000'
  assert significance.difference_text(1.23456, 2) == '+1.23'


def test_preset_variants_load_each_preset_with_the_overrides():
  """--field=preset: each value is the config file's preset, with the command line's
  overrides; a preset the file does not have is refused before training."""
  variant_of = sweep_grid.preset_variants(
    REPO / 'configs' / 'translate_tiny.py', ['--config.train.steps=400', '--config.seed=3']
  )
  keys_only, none = variant_of('shaw_keys_only'), variant_of('none')
  assert (keys_only.model.position, keys_only.model.relative_keys) == ('shaw', True)
  assert keys_only.model.relative_values is False and keys_only.train.steps == 400
  assert none.model.position == 'none' and none.train.steps == 400
  runs = list(sweep_grid.runs(None, 'preset', ['shaw', 'none'], [0, 1], variant_of))
  assert [(value, seed, run.seed) for value, seed, run in runs] == [
    ('shaw', 0, 0),
    ('shaw', 1, 1),
    ('none', 0, 0),
    ('none', 1, 1),
  ]
  config = load_config('translate_tiny')
  sweep.check_sweep(config, 'preset', ['shaw', 'shaw_values_only'], [0], 'bleu', variant_of)
  with pytest.raises(
    ValueError, match=r"at 'shaw_both': \S*configs/translate_tiny.py: unknown preset 'shaw_both'"
  ):
    sweep.check_sweep(config, 'preset', ['shaw', 'shaw_both'], [0], 'bleu', variant_of)


def test_print_only_lists_train_and_eval_commands_per_seed(tmp_path, monkeypatch, capsys):
  code = run_sweep_main(
    monkeypatch,
    f'--workdir={tmp_path}',
    '--config=configs/char_tiny.py:shaw',
    '--config.train.steps=5',
    '--values=0,4',
    '--seeds=0,1',
    '--print_only',
  )
  assert code is None
  assert capsys.readouterr().out.strip().splitlines() == [
    f'python {script} --config=configs/char_tiny.py:shaw --config.train.steps=5 '
    f'--config.model.max_relative_position={value} --config.seed={seed} '
    f'--workdir={tmp_path}/max_relative_position={value}/seed={seed}'
    for value in (0, 4)
    for seed in (0, 1)
    for script in ('train.py',)  # train.py scores the run: an eval.py line scored it again
  ]


def test_print_only_sweeps_presets_of_the_config_file(tmp_path, monkeypatch, capsys):
  code = run_sweep_main(
    monkeypatch,
    f'--workdir={tmp_path}',
    '--config=configs/translate_tiny.py',
    '--config.train.steps=5',
    '--field=preset',
    '--values=shaw,shaw_keys_only',
    '--print_only',
  )
  assert code is None
  stdout = capsys.readouterr().out
  assert stdout.strip().splitlines()[:2] == [
    f'python train.py --config=configs/translate_tiny.py:shaw --config.train.steps=5 '
    f'--config.seed=0 --workdir={tmp_path}/preset=shaw/seed=0',
    f'python train.py --config=configs/translate_tiny.py:shaw_keys_only --config.train.steps=5 '
    f'--config.seed=0 --workdir={tmp_path}/preset=shaw_keys_only/seed=0',
  ]


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (['--config=configs/char_tiny.py:xl', '--metric=bleu'], 'reports bpc, not bleu'),
    (['--config=configs/translate_tiny.py:absolute', '--values=0,4'], 'does not read it'),
    (['--config=configs/char_tiny.py:shaw', '--values=2,4', '--baseline=8'], 'not one of'),
    (['--config=configs/char_tiny.py:shaw', '--config.model.n_head=2'], 'model.num_heads'),
    (['--config=configs/char_tiny.py:shaw', '--by_source_length=4'], 'of bleu, not bpc'),
    (['--config=configs/translate_tiny.py:shaw', '--by_position=8'], 'of bpc, not bleu'),
    (
      ['--config=configs/translate_tiny.py:shaw', '--by_source_length=6,4'],
      '--by_source_length must be increasing positive integers',
    ),
    (['--config=configs/char_tiny.py:shaw', '--values='], '--values is empty'),
    (['--config=configs/char_tiny.py:shaw', '--values=2,4,2'], '--values gives 2 more than once'),
    (['--config=configs/char_tiny.py:shaw', '--seeds=0,a'], '--seeds=0,a: give integers'),
    (
      ['--config=configs/char_tiny.py:shaw', '--seeds=1,1'],
      '--seeds=1,1: a value is given more than once',
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--field=train.same_length', '--values=True,Flase'],
      "--values: 'Flase' is not a bool",
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--field=model.max_relative_positon'],
      '--field=model.max_relative_positon: the config has no field',
    ),
    (  # an AttributeError traceback: 'str' object has no attribute 'items'
      ['--config=configs/char_tiny.py:shaw', '--field=model', '--values=1,2'],
      '--field=model: config.model is a section, not a field: give one of its fields, such as '
      'model.',
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--field=task', '--values=2,4', '--print_only'],
      '--field=task: every run of a sweep is of its config',
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--evaluations=tgt_len=abc'],
      "--evaluations=tgt_len=abc: 'abc' is not a int",
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--evaluations=tgt_lenn=64'],
      '--evaluations=tgt_lenn=64: the config has no field eval.tgt_lenn',
    ),
    (
      ['--config=configs/char_tiny.py:shaw', '--config.train.steps=5', '--config.model.postion=x'],
      '--config.model.postion: the config has no field',
    ),
    # --evaluations settings the checks refuse for some value's model: before, the first run
    # trained, then its evaluation failed (docs/studies.md promised otherwise). Refused before
    # anything, --print_only too (which keeps this test from training where they are not).
    (
      [
        '--config=configs/char_tiny.py:shaw',
        '--values=4,2',
        '--evaluations=max_relative_position=3',
        '--print_only',
      ],
      '--evaluations=max_relative_position=3 for model.max_relative_position=2: '
      'config.eval.max_relative_position=3 must be <= the trained',
    ),
    (
      [
        '--config=configs/char_tiny.py:shaw',
        '--values=2',
        '--evaluations=tgt_len=64,tgt_len=0',
        '--print_only',
      ],
      '--evaluations=tgt_len=0 for model.max_relative_position=2: config.eval.tgt_len must be >= 1',
    ),
    (
      [
        '--config=configs/char_tiny.py:shaw',
        '--values=2',
        '--evaluations=tgt_len=64+mem_len=-1',
        '--print_only',
      ],
      '--evaluations=tgt_len=64+mem_len=-1 for model.max_relative_position=2: config.eval.mem_len',
    ),
  ],
)
def test_command_line_errors_are_one_line_before_training(tmp_path, monkeypatch, args, message):
  """The command's flag parser and main in this process: each refusal is a SystemExit whose
  text (what Python prints, exit status 1) is one `error: ` line; any other exception would
  be a traceback, and fails here."""
  code = run_sweep_main(monkeypatch, f'--workdir={tmp_path}', *args)
  assert isinstance(code, str) and code.startswith('error: ') and message in code
  assert code.strip().splitlines() == [code.strip()]
  assert not list(tmp_path.iterdir())  # nothing trained


def test_print_only_takes_config_and_overrides_given_with_a_space(tmp_path, monkeypatch, capsys):
  code = run_sweep_main(
    monkeypatch,
    f'--workdir={tmp_path}',
    '--config',
    'configs/char_tiny.py:shaw',
    '--config.train.steps',
    '5',
    '--values=4',
    '--print_only',
  )
  assert code is None
  assert capsys.readouterr().out.splitlines()[0] == (
    'python train.py --config=configs/char_tiny.py:shaw --config.train.steps=5 '
    f'--config.model.max_relative_position=4 --config.seed=0 '
    f'--workdir={tmp_path}/max_relative_position=4/seed=0'
  )


def test_a_missing_workdir_is_one_line(monkeypatch):
  code = run_sweep_main(monkeypatch, '--config=configs/char_tiny.py:shaw', '--print_only')
  assert code.startswith('error: --workdir is required') and '\n' not in code


def test_a_refused_command_exits_1_with_its_error_line_and_no_traceback(commands, tmp_path):
  """A real `python -m relpos.studies.sweep` process, forked from the command server
  (conftest's `commands`; the in-process cases above share its flag parser and main): exit
  status 1, the error as stderr's last line, nothing trained."""
  result = commands.run(
    [
      '-m',
      'relpos.studies.sweep',
      f'--workdir={tmp_path}',
      '--config=configs/translate_tiny.py:absolute',
      '--values=0,4',
    ]
  )
  assert result.returncode == 1 and 'Traceback' not in result.stderr
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: ') and 'does not read it' in last
  assert not list(tmp_path.iterdir())  # nothing trained


@pytest.mark.slow
def test_translation_sweep_over_positions_and_seeds_end_to_end(
  tmp_path, compilation_cache, capsys, monkeypatch
):
  """The issue's command at tiny sizes: two positions x two seeds, trained, evaluated, tested
  with sacreBLEU's paired bootstrap, tabulated; a second call keeps every finished run. The
  first run trains the vocabulary, and the others, which would train the same one (the same
  data and vocabulary fields; all 400 sentences, so no seeded draw), get a copy of it: every
  run trained its own, the same bytes each time."""
  corpus = write_pair_corpus(tmp_path / 'corpus', train=200, eval=8)
  config = tiny_translate_config(corpus, steps=2)
  config.train.update(eval_every=0, checkpoint_every=0)
  config.data.length_buckets = 1
  config.eval.beam_size = 1
  root = tmp_path / 'sweep'
  trainings = []
  monkeypatch.setattr(
    tokenizer, 'train_model', lambda *args: trainings.append(args) or train_model(*args)
  )
  summary = sweep.sweep(
    config, root, 'model.position', ['shaw', 'absolute'], [0, 1], 'bleu', baseline='shaw'
  )
  captured = capsys.readouterr()
  first = sweep_grid.model_dir(root, 'model.position', 'shaw', 0) / 'spm.model'
  assert len(trainings) == 1 and recorded_source(first) == sweep.TRAINED_BY_SWEEP
  copies = [sweep_grid.model_dir(root, 'model.position', v, s) / 'spm.model' for v, s in RUNS[1:]]
  for copy in copies:
    assert copy.read_bytes() == first.read_bytes()
    assert recorded_source(copy) == f'copied by relpos.studies.sweep from {first}'
    assert f'vocabulary: {first} copied to {copy}, not trained again' in captured.out
  assert 'was there before this run' not in captured.err
  assert train_model(*trainings[0]) == first.read_bytes()  # training again gives the same bytes
  # What tells one run's vocabulary from another's: a field the vocabulary reads, the data.
  _, _, variant = next(sweep_grid.runs(config, 'model.position', ['absolute'], [1]))
  assert translate_task.TASK.vocabulary_changes(variant, first.parent) == []
  variant.data.vocab_train_sentences = 300  # of 400 sentences: a draw, which the seed makes
  assert translate_task.TASK.vocabulary_changes(variant, first.parent) == [
    'data.vocab_train_sentences: trained 1000000, given 300',
    'seed: trained 0, given 1 (the vocabulary trains on a draw of '
    'config.data.vocab_train_sentences=300 sentences it seeds)',
  ]
  assert [(row['value'], row['n']) for row in summary] == [('shaw', 2), ('absolute', 2)]
  assert summary[0]['p_value'] is None and 0 < summary[1]['p_value'] <= 1
  assert summary[0]['p_seeds'] is None and 0 < summary[1]['p_seeds'] <= 1
  with open(root / 'sweep.csv') as stream:
    table = list(csv.DictReader(stream))
  assert list(table[0]) == 'value n mean std difference p_value p_seeds diverged'.split()
  for value in ('shaw', 'absolute'):
    for seed in (0, 1):
      results = json.loads(
        (sweep_grid.run_dir(root, 'model.position', value, seed) / 'eval_results.json').read_text()
      )
      assert results['step'] == 2
  # Seeds differ: the two runs of one position did not train the same model.
  seeds = [sweep_grid.run_dir(root, 'model.position', 'shaw', seed) for seed in (0, 1)]
  first, second = ((run / 'metrics.jsonl').read_text() for run in seeds)
  assert first != second
  # A finished run counts as finished only for its own config (eval settings aside).
  _, _, variant = next(sweep_grid.runs(config, 'model.position', ['shaw'], [0]))
  assert finished_run.is_finished(tasks.get(variant), seeds[0], variant, seeds[0])
  variant.optim.learning_rate = 0.25
  assert not finished_run.is_finished(tasks.get(variant), seeds[0], variant, seeds[0])
  # Results scored before an eval field was added read as scored with its default.
  _, _, variant = next(sweep_grid.runs(config, 'model.position', ['shaw'], [0]))
  path = seeds[0] / 'eval_results.json'
  results = json.loads(path.read_text())
  del results['eval']['max_relative_position']
  path.write_text(json.dumps(results))
  assert finished_run.is_finished(tasks.get(variant), seeds[0], variant, seeds[0])
  variant.eval.max_relative_position = 1
  assert not finished_run.is_finished(tasks.get(variant), seeds[0], variant, seeds[0])
  stamps = {run: (run / 'eval_results.json').stat().st_mtime_ns for run in seeds}
  sweep.sweep(
    config,
    root,
    'model.position',
    ['shaw', 'absolute'],
    [0, 1],
    'bleu',
    'shaw',
    breakdowns=[(breakdown.SOURCE_LENGTH, [3])],
  )
  assert stamps == {run: (run / 'eval_results.json').stat().st_mtime_ns for run in seeds}
  # --by_source_length: every run scored per bucket, the buckets' sentences adding up to all.
  with open(root / 'sweep_by_length.csv') as stream:
    by_bucket = list(csv.DictReader(stream))
  buckets = {row['bucket']: int(row['count']) for row in by_bucket}
  assert set(buckets) <= {'1-3', '4+'} and sum(buckets.values()) == 8
  assert {(row['value'], row['bucket'], row['n']) for row in by_bucket} == {
    (value, bucket, '2') for value in ('shaw', 'absolute') for bucket in buckets
  }
  assert (root / 'sweep_by_length.md').exists() and (root / 'sweep_by_length.png').exists()


@pytest.mark.slow
def test_char_lm_sweep_of_k_end_to_end_with_bpc_p_values(tmp_path, run_compilation_cache):
  text = tmp_path / 'text.txt'
  text.write_text('the cat sat on the mat. ' * 300)
  config = tiny_char_config(text, steps=3, preset='shaw')
  root = tmp_path / 'k'
  summary = sweep.sweep(
    config,
    root,
    'model.max_relative_position',
    [0, 2],
    [0, 1],
    'bpc',
    baseline=0,
    breakdowns=[(breakdown.POSITION, [1, 4])],
  )
  assert [(row['value'], row['n']) for row in summary] == [(0, 2), (2, 2)]
  assert 0 < summary[1]['p_value'] <= 1
  # --by_position: per run, the buckets' bpc weighted by their characters is the run's bpc.
  with open(root / 'sweep_by_position_seeds.csv') as stream:
    per_run = list(csv.DictReader(stream))
  with open(root / 'sweep_by_position.csv') as stream:
    counts = {row['bucket']: int(row['count']) for row in csv.DictReader(stream)}
  assert list(counts) == ['1', '2-4', '5+']
  for value, seed in ((0, 0), (2, 1)):
    results = json.loads(
      (
        sweep_grid.run_dir(root, 'model.max_relative_position', value, seed) / 'eval_results.json'
      ).read_text()
    )
    rows = [r for r in per_run if (r['value'], r['seed']) == (str(value), str(seed))]
    pooled = sum(float(r['bpc']) * counts[r['bucket']] for r in rows) / sum(counts.values())
    assert pooled == pytest.approx(results['bpc'], rel=1e-5)
    assert sum(results['position_tokens']) == results['tokens']


@pytest.mark.slow
def test_an_eval_field_sweep_trains_once_per_seed_and_scores_every_value(
  tmp_path, run_compilation_cache
):
  """--field=eval.mem_len: one training per seed in trained/seed=s, every value scored from
  that checkpoint into its own directory, and the scores are those of eval.py at that value."""
  text = tmp_path / 'text.txt'
  text.write_text('the cat sat on the mat. ' * 300)
  # The model of the k sweep's k = 2 (test_char_lm_sweep_of_k_end_to_end_with_bpc_p_values):
  # whichever runs second loads the training steps the other compiled.
  config = tiny_char_config(text, steps=3, preset='shaw')
  config.model.max_relative_position = 2
  root = tmp_path / 'mem'
  summary = sweep.sweep(config, root, 'eval.mem_len', [0, 4], [0, 1], 'bpc', baseline=0)
  assert [(row['value'], row['n']) for row in summary] == [(0, 2), (4, 2)]
  assert sorted(path.name for path in root.iterdir() if path.is_dir()) == [
    'mem_len=0',
    'mem_len=4',
    'trained',
  ]
  for seed in (0, 1):
    trained = sweep_grid.model_dir(root, 'eval.mem_len', 4, seed)
    assert trained == root / 'trained' / f'seed={seed}'
    assert (trained / 'checkpoints').is_dir()
    # The training keeps the config's own evaluation settings, not the last value scored.
    assert read_config(trained).eval.mem_len == config.eval.mem_len == 8
    scores = {}
    for mem_len in (0, 4):
      results_dir = sweep_grid.run_dir(root, 'eval.mem_len', mem_len, seed)
      assert not (results_dir / 'checkpoints').exists()
      results = json.loads((results_dir / 'eval_results.json').read_text())
      assert results['eval']['mem_len'] == mem_len and results['step'] == 3
      scores[mem_len] = results['bpc']
    assert scores[0] != scores[4]  # the memory changed the score of the same checkpoint
  commands = sweep_grid.commands('c.py', [], root, 'eval.mem_len', [0, 8], [0])
  assert commands == [
    # The one training keeps --config's own eval settings, as the sweep's (`as_trained`).
    f'python train.py --config=c.py --config.seed=0 --workdir={root}/trained/seed=0',
    f'python eval.py --config=c.py --config.eval.mem_len=0 --config.seed=0 '
    f'--workdir={root}/trained/seed=0 --output_dir={root}/mem_len=0/seed=0',
    f'python eval.py --config=c.py --config.eval.mem_len=8 --config.seed=0 '
    f'--workdir={root}/trained/seed=0 --output_dir={root}/mem_len=8/seed=0',
  ]
  # recheck15-4: an override of the swept field in the sweep's command is trained with, as
  # the sweep trains (it was dropped with the swept value, so the line trained otherwise).
  given = sweep_grid.commands('c.py', ['--config.eval.mem_len=16'], root, 'eval.mem_len', [0], [0])
  assert given[0] == (
    f'python train.py --config=c.py --config.eval.mem_len=16 --config.seed=0 '
    f'--workdir={root}/trained/seed=0'
  )


def test_progress_gives_the_run_count_and_an_eta(monkeypatch):
  assert sweep.progress(0, 4, started=100.0) == 'run 1 of 4 to run'
  monkeypatch.setattr(sweep.time, 'monotonic', lambda: 100.0 + 2 * 1800)
  assert sweep.progress(2, 5, started=100.0) == (
    'run 3 of 5 to run, 1h00m so far, about 1h30m left'
  )
  assert sweep.progress(1, 2, started=100.0 + 2 * 1800 - 420) == (
    'run 2 of 2 to run, 7m00s so far, about 7m00s left'
  )


def test_a_run_scored_at_its_eval_step_is_finished(tmp_path):
  """A sweep of config.eval.step scores checkpoint N: its result, at step N, is the finished
  one (it was compared with config.train.steps and scored again at every rerun)."""
  config = load_config('char_tiny', 'shaw')
  config.train.steps, config.eval.step = 4, 2
  results = {'bpc': 1.0, 'step': 2, 'eval': config.eval.to_dict()}
  results |= {'segment_nats': [2.0], 'segment_tokens': [3]}
  (tmp_path / 'eval_results.json').write_text(json.dumps(results))
  assert finished_run.is_finished(tasks.get(config), tmp_path, config, tmp_path / 'trained')
  config.eval.step = 0  # the newest: step 4 is what it would score
  assert not finished_run.is_finished(tasks.get(config), tmp_path, config, tmp_path / 'trained')


def test_a_result_scored_in_another_compute_dtype_is_not_finished(tmp_path):
  """fz14a-4: eval_results.json records the compute dtype it was scored in; a float32 run's
  result scored in bfloat16 (an --output_dir's, copied) is not its own, and is scored again.
  One written before the dtype was recorded is kept."""
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 4
  results = {'bpc': 1.0, 'step': 4, 'eval': config.eval.to_dict()}
  results |= {'segment_nats': [2.0], 'segment_tokens': [3]}
  task, path = tasks.get(config), tmp_path / 'eval_results.json'
  for model, finished in (({'dtype': 'float32'}, True), ({'dtype': 'bfloat16'}, False), ({}, True)):
    path.write_text(json.dumps(results | {'model': model}))
    assert finished_run.is_finished(task, tmp_path, config, tmp_path / 'trained') == finished
  path.write_text(json.dumps(results | {'model': {'dtype': 'bfloat16'}}))
  reason = finished_run.stale_reason(task, tmp_path, config, tmp_path / 'trained')
  assert reason == 'scored with other config.model fields (dtype)'


def test_a_result_lacking_what_the_tables_read_is_named_and_scored_again(tmp_path):
  """fz14b-5: a result without segment_nats (written before 2026-11-24) ended --collect_only
  and a rerun in `KeyError: 'segment_nats'`. --collect_only names the file and what scores it
  again; the sweep (and train.py's rerun) take it as not finished, and score it again."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  _fake_runs(tmp_path, field, {0: [2.0], 4: [1.5]})
  run = sweep_grid.run_dir(tmp_path, field, 4, 0)
  old = json.loads((run / 'eval_results.json').read_text()) | {'eval': config.eval.to_dict()}
  del old['segment_nats']
  (run / 'eval_results.json').write_text(json.dumps(old))
  with pytest.raises(ValueError) as refused:
    sweep_tables.collect(sweep_tables.read_runs(tmp_path, field, [0, 4], [0]), 'bpc')
  assert str(refused.value).startswith(f"{run / 'eval_results.json'} has no 'segment_nats' (")
  assert str(refused.value).endswith(
    'the sweep command without --collect_only scores that run again'
  )
  scored = sweep_grid.with_value(config, field, 4)
  reason = finished_run.stale_reason(tasks.get(scored), run, scored, run)
  assert reason.endswith('has no segment_nats (written by an older relpos)')


def test_a_non_finite_score_is_a_damaged_result(tmp_path):
  """fz14b-7: a bpc or segment_nats entry NaN or inf, with no divergence record, was tabulated
  (nan means, and the bootstrap's floor, p < 0.001, for NaN differences) and kept by a rerun.
  Now the result is damaged, as a cut file is: --collect_only names it, a rerun scores again."""
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {2: [2.0], 8: [1.5]})
  path = sweep_grid.run_dir(tmp_path, field, 8, 0) / 'eval_results.json'
  results = json.loads(path.read_text())
  for edit, named in (
    ({'bpc': float('nan')}, 'bpc'),
    ({'segment_nats': [1.0, float('inf')]}, 'segment_nats[1]'),
  ):
    path.write_text(json.dumps(results | edit))  # json writes NaN, Infinity
    with pytest.raises(
      ValueError, match=rf'is damaged \(no finite number in {re.escape(named)}, and'
    ):
      sweep_tables.read_runs(tmp_path, field, [2, 8], [0])
  path.write_text(json.dumps({'bpc': float('nan'), 'diverged_at_step': 4}))  # a sweep's record
  assert run_results.read_results(path)['diverged_at_step'] == 4


def test_one_run_has_no_spread_in_the_table(tmp_path):
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0, 2.1], 4: [1.5]})
  rows = sweep_tables.collect(sweep_tables.read_runs(tmp_path, field, [0, 4], [0, 1]), 'bpc')
  summary = sweep_tables.summarise(
    load_config('char_tiny', 'shaw'), rows, [0, 4], 'bpc', baseline=0
  )
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, field, 'bpc', baseline=0)
  assert '| 4 | 1 | 1.500 | – | ' in markdown and '| 0 | 2 | 2.050 | 0.071 |' in markdown
  with open(tmp_path / 'sweep.csv') as stream:  # no spread there either (it said 0.0)
    assert [row['std'] for row in csv.DictReader(stream)] == ['0.07071067811865482', '']


def test_a_damaged_eval_results_is_scored_again_and_named_when_collected(tmp_path, capsys):
  """An eval_results.json cut by a kill mid-write: `error: Unterminated string ...` with no
  file named, and no rerun would score that run again; now the sweep does, with a warning,
  and --collect_only names the file and what to run."""
  results = tmp_path / 'eval_results.json'
  results.write_text('{"bleu": 1.0, "translat')
  config = load_config('translate_tiny', 'shaw')
  assert not finished_run.is_finished(tasks.get(config), tmp_path, config, tmp_path / 'trained')
  err = capsys.readouterr().err  # read_results' line, which names what is wrong in the file
  assert err.startswith(f'warning: {results} is damaged (Unterminated string'), err
  assert err.endswith('; scoring that run again\n') and err.count('\n') == 1, err
  # Another step's result (the sweep scored it again, a full test pass, without a word): named.
  results.write_text(json.dumps({'bleu': 1.0, 'translations': str(tmp_path / 't.txt'), 'step': 3}))
  assert not finished_run.is_finished(tasks.get(config), tmp_path, config, tmp_path / 'trained')
  assert capsys.readouterr().out == (
    f"{results} is not this config's result (scored at step 3, not "
    f'{config.train.steps}): scoring it again\n'
  )
  results.write_text('{"bleu": 1.0, "translat')
  with pytest.raises(ValueError, match=r'eval_results\.json is damaged \(Unterminated string'):
    run_results.read_results(results)
  results.write_text('[1, 2]')
  with pytest.raises(ValueError, match=r'is damaged .not an object.$'):
    run_results.read_results(results)
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0]})
  (sweep_grid.run_dir(tmp_path, field, 0, 0) / 'eval_results.json').write_text('[1, 2]')
  with pytest.raises(ValueError, match='is damaged .not an object.; the sweep command without'):
    sweep_tables.read_runs(tmp_path, field, [0], [0])


def test_a_char_lm_evaluation_table_counts_characters(tmp_path):
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0, 2.1], 4: [1.5, 1.6]})
  rows = sweep_tables.collect(sweep_tables.read_runs(tmp_path, field, [0, 4], [0, 1]), 'bpc')
  by_setting = {'eval.tgt_len=16': rows, 'eval.tgt_len=32': rows}
  sweep_tables.write_evaluations(
    load_config('char_tiny', 'shaw'), by_setting, 0, tmp_path, field, 'bpc'
  )
  markdown = (tmp_path / 'sweep_by_evaluation.md').read_text()
  assert 'characters' in markdown and 'sentences' not in markdown


def test_sweep_md_names_the_evaluation_setting_its_numbers_are_of(tmp_path):
  """With --evaluations, sweep.md holds the first setting's scores, and its heading did not say
  so: a reader took them for the config's own config.eval."""
  field = 'model.max_relative_position'
  settings = {'tgt_len=16': {'eval.tgt_len': 16}, 'tgt_len=32': {'eval.tgt_len': 32}}
  for setting in settings:
    _fake_runs(tmp_path / setting, field, {0: [2.0, 2.1], 4: [1.5, 1.6]})
    for run in (tmp_path / setting).rglob('eval_results.json'):
      target = tmp_path / run.parent.relative_to(tmp_path / setting) / setting
      target.mkdir(parents=True)
      run.rename(target / 'eval_results.json')
  config = load_config('char_tiny', 'shaw')
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False, evaluations=settings)
  heading = (tmp_path / 'sweep.md').read_text().splitlines()[0]
  assert heading.startswith(
    f'{field} against bpc scored at --evaluations setting tgt_len=16 (the first; '
    'sweep_by_evaluation.md has every setting): mean ± std over seeds'
  )


def test_a_run_whose_evaluation_cannot_be_served_is_refused_before_any_trains(
  tmp_path, monkeypatch
):
  """A sweep of config.eval.step with a step the schedule does not keep: refused, naming the
  run, before the first run trains (the sweep calls train_model itself, past train.py's
  check)."""
  config = load_config('char_tiny', 'shaw')
  config.train.update(steps=6, checkpoint_every=2)
  trained = []
  monkeypatch.setattr(char_lm.TASK, 'train_model', lambda *a, **k: trained.append(a))
  with pytest.raises(ValueError) as error:
    sweep.sweep(config, tmp_path, 'eval.step', [2, 3], [0], 'bpc', baseline=2)
  assert str(error.value).startswith('eval.step=3 seed=0: config.eval.step=3: the run will keep')
  assert trained == []


def test_a_resumed_run_keeps_only_the_checkpoints_saved_after_its_newest(tmp_path):
  """Resumed from checkpoint 4 with checkpoint_every=2: it will save 6 and 8, never 2 (it was
  not saved, or is gone), so config.eval.step=2 is refused."""
  config = load_config('char_tiny', 'shaw')
  config.train.update(steps=8, checkpoint_every=2, keep_checkpoints=5)
  (tmp_path / 'checkpoints' / '4').mkdir(parents=True)
  config.eval.step = 2
  with pytest.raises(
    ValueError, match=r'config.eval.step=2: the run will keep checkpoints \[4, 6, 8\]'
  ):
    loop.check_evaluation_plan(config, tmp_path)
  config.eval.step = 6
  loop.check_evaluation_plan(config, tmp_path)


def test_a_finished_run_rerun_to_evaluate_keeps_what_it_has(tmp_path):
  """No save is left to make, so nothing is evicted: a lower keep_checkpoints does not hide
  checkpoint 2 of a finished run's 1..6."""
  config = load_config('char_tiny', 'shaw')
  config.train.update(steps=6, checkpoint_every=1, keep_checkpoints=3)
  for step in range(1, 7):
    (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  config.eval.step = 2
  loop.check_evaluation_plan(config, tmp_path)


def test_collect_only_warns_of_results_not_of_the_sweeps_config(tmp_path, capsys):
  """--collect_only tabulates what is there; a result scored at another step, or of a model
  trained with another config, is named with why (before, it was tabulated silently)."""
  from relpos.config.recorded import record_config

  field = 'model.max_relative_position'
  config = _fake_runs_of_char_tiny_shaw(tmp_path, field, {0: [2.0, 2.1], 4: [1.5, 1.6]})
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  assert 'warning' not in capsys.readouterr().err
  stale = sweep_grid.run_dir(tmp_path, field, 4, 1) / 'eval_results.json'
  stale.write_text(json.dumps(json.loads(stale.read_text()) | {'step': 5}))
  other = sweep_grid.with_value(sweep_grid.with_value(config, field, 0), 'model.d_model', 64)
  other.seed = 1
  record_config(other, sweep_grid.model_dir(tmp_path, field, 0, 1), allow_change=False)
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 3, warnings  # and the count of them (`sweep.stale_summary`)
  assert warnings[2].startswith('warning: 2 of the 4 results under ')
  assert warnings[0].startswith('warning: model.max_relative_position=0 seed 1: tabulated as')
  assert 'model.d_model' in warnings[0]
  assert warnings[1].endswith(
    'scored at step 5, not 10, and left out of the p-values over test items; the sweep without '
    '--collect_only trains or scores it again'
  )


def test_collect_only_names_the_command_that_trained_the_sweep(tmp_path, capsys):
  """--collect_only given another config than the sweep trained with (its overrides left out)
  tabulated every result as stale, each named in a warning, and nothing said what to give
  instead: a last warning counts them and names the command that trained the sweep (the
  root's sweep_command.txt) or, without it, the runs' config.json."""
  field = 'model.max_relative_position'
  config = _fake_runs_of_char_tiny_shaw(tmp_path, field, {0: [2.0, 2.1], 4: [1.5, 1.6]})
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  assert 'warning' not in capsys.readouterr().err
  config.train.steps = 20  # every result is of step 10
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 5 and warnings[-1] == (
    f'warning: 4 of the 4 results under {tmp_path} are not of the config given (the warnings '
    "above say why) and are marked so in the tables; each run's config.json records the "
    'config it trained with'
  )
  command = 'python -m relpos.studies.sweep --config=configs/char_tiny.py:shaw --workdir=r'
  (tmp_path / sweep.COMMAND_RECORD).write_text(command + '\n')
  sweep.sweep(config, tmp_path, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  last = capsys.readouterr().err.splitlines()[-1]
  assert last.endswith(f'marked so in the tables; the sweep trained with: {command}'), last


def _recorded_char_run(root, data_path):
  """A fake sweep (`_fake_runs`) of one Shaw char LM run on `data_path`, its config and data
  recorded as train.py records them: (the run's config, its workdir, its eval_results.json's
  contents with the config's config.eval)."""
  from relpos.config.recorded import record_config
  from relpos.training import data_record

  field = 'model.max_relative_position'
  _fake_runs(root, field, {0: [2.0]})
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  trained = sweep_grid.with_value(config, field, 0)
  trained.data.path = str(data_path)
  trained.seed = 0
  workdir = sweep_grid.model_dir(root, field, 0, 0)
  record_config(trained, workdir, allow_change=False)
  data_record.record(workdir, char_lm.TASK.data_files(trained, workdir))
  results = json.loads((workdir / 'eval_results.json').read_text())
  return trained, workdir, results | {'eval': config.eval.to_dict()}


def test_a_result_trained_on_the_same_data_by_another_path_is_kept(tmp_path, capsys):
  """A sweep run again from another clone of the repository gives its data another path, with
  the same bytes: stale_reason compared the path strings ('its model trained with another
  config (data.path: ...)'), so --collect_only warned and a sweep trained and scored the run
  again; it now follows `data_record.same_data`, as train.py's resume does. Other bytes under
  another path are still another config."""
  clone, other_clone = tmp_path / 'clone', tmp_path / 'other_clone'
  for directory in (clone, other_clone):
    directory.mkdir()
    (directory / 'corpus.txt').write_text('the same bytes in both clones\n' * 50)
  trained, workdir, scored = _recorded_char_run(tmp_path / 'sweep', clone / 'corpus.txt')
  (workdir / 'eval_results.json').write_text(json.dumps(scored))
  trained.data.path = str(other_clone / 'corpus.txt')
  assert finished_run.stale_reason(tasks.get(trained), workdir, trained, workdir) is None
  (other_clone / 'corpus.txt').write_text('other bytes\n' * 50)
  assert 'data.path' in finished_run.stale_reason(tasks.get(trained), workdir, trained, workdir)


def test_a_finished_run_whose_training_files_changed_since_is_not_kept(tmp_path):
  """One pair added to train_src/train_tgt, then the sweep extended with a new value: the old
  values' finished runs were kept, the new one trained on the changed files, and the tables
  mixed two corpora, with no word (train.py refused such a run). A data file changed since
  the run recorded it, one only training reads too, makes its result stale
  (`finished_run.stale_reason`, `data_record.changes`); a copy of the same lines is not. The
  line names at most three changed files, as it names a changed config's fields
  (`finished_run.shown`): it named every one."""
  from relpos.config.recorded import record_config
  from relpos.training import data_record

  corpus = write_pair_corpus(tmp_path / 'corpus')
  config = tiny_translate_config(corpus, steps=10)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  record_config(config, workdir, allow_change=False)
  task = tasks.get(config)
  data_record.record(workdir, task.data_files(config, workdir))
  (workdir / 'translations_step10.txt').write_text('Katze\n')
  scored = {'bleu': 1.0, 'step': 10, 'eval': config.eval.to_dict()}
  scored['translations'] = str(workdir / 'translations_step10.txt')
  (workdir / 'eval_results.json').write_text(json.dumps(scored))
  assert finished_run.stale_reason(task, workdir, config, workdir) is None
  for name, line in (('train.en', 'red cat'), ('train.de', 'Katze rot')):
    with open(corpus / name, 'a') as file:
      file.write(f'{line}\n')
  reason = finished_run.stale_reason(task, workdir, config, workdir)
  assert reason.startswith(
    f'a data file changed since its model trained (config.data.train_src: {corpus}/train.en '
    'changed since the run trained on it ('
  )
  assert f'config.data.train_tgt: {corpus}/train.de changed since' in reason
  assert not finished_run.is_finished(task, workdir, config, workdir)
  for name in ('eval.en', 'eval.de'):  # four changed: three named, as of a config's fields
    with open(corpus / name, 'a') as file:
      file.write('more\n')
  reason = finished_run.stale_reason(task, workdir, config, workdir)
  assert reason.count(' changed since the run trained on it') == 3 and reason.endswith('; ...)')


def test_a_sweep_names_finished_runs_whose_data_changed_since(tmp_path, capsys, monkeypatch):
  """--collect_only tabulated runs trained on a data file changed since with no word, and a
  sweep kept them while a new value trained on the new file. --collect_only now warns of each,
  leaving it out of the p-values over items, and the sweep refuses before anything trains,
  naming the run and the file, as it refuses a run of another recorded config."""
  from relpos.config.recorded import record_config
  from relpos.training import data_record

  field, root = 'model.max_relative_position', tmp_path / 'sweep'
  corpus = tmp_path / 'corpus.txt'
  corpus.write_text('the corpus the runs trained on\n' * 50)
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  config.data.path = str(corpus)
  _fake_runs(root, field, {0: [2.0, 2.1], 4: [1.5, 1.6]})
  for value in (0, 4):
    for seed in (0, 1):
      trained = sweep_grid.with_value(config, field, value)
      trained.seed = seed
      workdir = sweep_grid.model_dir(root, field, value, seed)
      record_config(trained, workdir, allow_change=False)
      data_record.record(workdir, char_lm.TASK.data_files(trained, workdir))
      results = workdir / 'eval_results.json'
      results.write_text(
        json.dumps(json.loads(results.read_text()) | {'eval': config.eval.to_dict()})
      )
  sweep.sweep(config, root, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  assert 'warning' not in capsys.readouterr().err
  with open(corpus, 'a') as file:
    file.write('one line added\n')
  summary = sweep.sweep(config, root, field, [0, 4], [0, 1], 'bpc', 0, train=False)
  warnings = capsys.readouterr().err.splitlines()
  assert len(warnings) == 5, warnings  # one a run, and their count
  assert warnings[0] == (
    f'warning: {field}=0 seed 0: tabulated as it is, though a data file changed since its model '
    f'trained (config.data.path: {corpus} changed since the run trained on it (1,550 bytes then, '
    '1,565 now)), and left out of the p-values over test items; the sweep without '
    '--collect_only refuses it (a new --workdir, or the config and data the run trained with)'
  )
  assert summary[1]['p_value'] is None
  monkeypatch.setattr(char_lm.TASK, 'train_model', lambda *a, **k: pytest.fail('trained'))
  with pytest.raises(ValueError) as refused:
    sweep.sweep(config, root, field, [0, 4, 16], [0, 1], 'bpc', 0)
  workdir = sweep_grid.model_dir(root, field, 0, 0)
  assert str(refused.value) == (
    f'{field}=0 seed=0: {workdir} holds a run trained on other data '
    f'(config.data.path: {corpus} changed since the run trained on it (1,550 bytes then, 1,565 '
    'now)): give the sweep a new --workdir to train on the data as it is now, or restore the '
    'data its runs trained on'
  )
  assert '=== ' not in capsys.readouterr().out  # refused before any run was kept or trained


def test_a_result_scored_on_other_data_than_the_run_s_is_stale(tmp_path):
  """eval.py on a sweep's run with other eval data wrote its eval_results.json in place, and
  --collect_only tabulated that score (BLEU of other sentences) as the run's with no word:
  stale_reason never compared the config.data the result records. Now it does, by
  `data_record.same_data` (the run's bytes under another path are the run's data)."""
  (tmp_path / 'corpus.txt').write_text('the corpus the run trained on\n' * 50)
  (tmp_path / 'copy.txt').write_text('the corpus the run trained on\n' * 50)
  (tmp_path / 'other.txt').write_text('other sentences\n' * 50)
  trained, workdir, scored = _recorded_char_run(tmp_path / 'sweep', tmp_path / 'corpus.txt')
  results = workdir / 'eval_results.json'
  for path, stale in (('corpus.txt', False), ('copy.txt', False), ('other.txt', True)):
    data = trained.data.to_dict() | {'path': str(tmp_path / path)}
    results.write_text(json.dumps(scored | {'data': data}))
    reason = finished_run.stale_reason(tasks.get(trained), workdir, trained, workdir)
    assert (reason is not None) == stale, (path, reason)
  assert reason == (
    f"scored on other data than the run's (data.path: trained '{tmp_path / 'corpus.txt'}', "
    f"given '{tmp_path / 'other.txt'}')"
  )
  results.write_text(json.dumps(scored))  # recorded before results recorded config.data
  assert finished_run.stale_reason(tasks.get(trained), workdir, trained, workdir) is None


def test_collect_only_leaves_a_result_of_other_eval_settings_out_of_the_item_test(tmp_path, capsys):
  """eval.py --config.eval.tgt_len=16 on a sweep's run rewrote its eval_results.json with
  other segments: --collect_only warned 'tabulated as it is', then ended with `error: paired
  test: 872 baseline and 1308 system segments`, no tables. Now the tables are written, the row
  in the mean and the seed test, out of the item test, and a note under the table says so."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  _fake_runs(tmp_path, field, {0: [2.0, 2.1], 8: [1.5, 1.6]})
  for results in tmp_path.glob('*/*/eval_results.json'):
    results.write_text(
      json.dumps(json.loads(results.read_text()) | {'eval': config.eval.to_dict()})
    )
  rescored = sweep_grid.run_dir(tmp_path, field, 8, 1) / 'eval_results.json'
  results = json.loads(rescored.read_text())
  results['eval']['tgt_len'] = 16
  results['segment_nats'] *= 2  # twice the segments, half as long
  results['segment_tokens'] = [4] * 80
  rescored.write_text(json.dumps(results))
  summary = sweep.sweep(config, tmp_path, field, [0, 8], [0, 1], 'bpc', 0, train=False)
  warning = capsys.readouterr().err
  assert 'other config.eval fields (tgt_len), and left out of the p-values over' in warning
  assert summary[1]['n'] == 2 and summary[1]['p_value'] < 0.01  # seed 0 alone, paired
  markdown = (tmp_path / 'sweep.md').read_text()
  assert '| 8 | 2 | 1.550 | 0.071 | -0.500 |' in markdown
  assert 'left out of the p-values over items: model.max_relative_position=8 seed 1.' in markdown


def test_a_result_scored_from_another_workdir_is_not_the_runs(tmp_path, capsys):
  """eval.py --workdir=c1 --output_dir=<a sweep run> wrote c1's score there: --collect_only
  tabulated it as the run's own, silently, and a rerun kept it as finished."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  _fake_runs(tmp_path, field, {0: [2.0]})
  run = sweep_grid.run_dir(tmp_path, field, 0, 0)
  results = json.loads((run / 'eval_results.json').read_text()) | {'eval': config.eval.to_dict()}
  scored = sweep_grid.with_value(config, field, 0)
  for checkpoint in (
    run / 'checkpoints' / '10',
    f'{run.relative_to(tmp_path.parent)}/checkpoints/10',
  ):
    (run / 'eval_results.json').write_text(json.dumps(results | {'checkpoint': str(checkpoint)}))
    assert finished_run.is_finished(tasks.get(scored), run, scored, run)
  foreign = tmp_path / 'c1' / 'checkpoints' / '10'
  (run / 'eval_results.json').write_text(json.dumps(results | {'checkpoint': str(foreign)}))
  assert not finished_run.is_finished(tasks.get(scored), run, scored, run)
  sweep.sweep(config, tmp_path, field, [0], [0], 'bpc', 0, train=False)
  warnings = capsys.readouterr().err.splitlines()
  assert (
    len(warnings) == 2 and f'was scored from {foreign}, not from a checkpoint of' in warnings[0]
  )


def _fake_training(monkeypatch, diverges):
  """char_lm's train_model and evaluate replaced: training raises the loop's DivergedError at
  step 10 for the configs `diverges` picks (and records the config, as a real start does),
  evaluation writes a _fake_runs-like result. Returns the list of (value config, seed) trained."""
  from relpos.config.recorded import record_config

  trained = []

  def train_model(config, workdir):
    trained.append((config.optim.learning_rate, config.seed))
    Path(workdir).mkdir(parents=True, exist_ok=True)
    record_config(config, workdir, allow_change=False)
    if diverges(config):
      raise loop.DivergedError('loss is nan at step 10', 10, 'loss is nan at step 10: ...')

  def evaluate(config, workdir, *, output_dir):
    score = 2.0 + config.optim.learning_rate + config.seed / 10
    segments = [score * 0.6931 * 8 + 0.01 * ((i * 7 + config.seed) % 5) for i in range(40)]
    results = {
      'bpc': score,
      'step': config.train.steps,
      'segment_nats': segments,
      'segment_tokens': [8] * 40,
      'split': 'test',
      'tokens': 320,
      'checkpoint': str(Path(workdir) / 'checkpoints' / str(config.train.steps)),
      'eval': config.eval.to_dict(),
    }
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / 'eval_results.json').write_text(json.dumps(results))
    return results

  monkeypatch.setattr(char_lm.TASK, 'train_model', train_model)
  monkeypatch.setattr(char_lm.TASK, 'evaluate', evaluate)
  return trained


def test_a_diverged_run_is_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
  """A value whose loss goes NaN stopped the whole sweep (`error: loss is nan at step 10`),
  at every rerun, and the other values never ran: now it is a result, recorded, warned of once,
  kept on rerun, and listed beside the tables, which leave it out."""
  field, values = 'optim.learning_rate', [0.001, 1e6, 0.002]
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 20
  trained = _fake_training(monkeypatch, lambda c: c.optim.learning_rate > 1)
  summary = sweep.sweep(config, tmp_path, field, values, [0, 1], 'bpc', baseline=0.001)
  assert trained == [(value, seed) for value in values for seed in (0, 1)]
  assert [(row['value'], row['n']) for row in summary] == [(0.001, 2), (1e6, 0), (0.002, 2)]
  output = capsys.readouterr()
  warnings = output.err.splitlines()
  assert warnings == [
    f'warning: optim.learning_rate=1000000.0 seed {seed} diverged (loss is nan at step 10); '
    f'recorded in {sweep_grid.run_dir(tmp_path, field, 1e6, seed)}/eval_results.json, left out of '
    'the tables and p-values; the sweep goes on with the other runs'
    for seed in (0, 1)
  ]
  recorded = run_results.read_results(
    sweep_grid.run_dir(tmp_path, field, 1e6, 0) / 'eval_results.json'
  )
  assert recorded['diverged_at_step'] == 10 and recorded['bpc'] is None
  results_text = (sweep_grid.run_dir(tmp_path, field, 1e6, 0) / 'eval_results.json').read_text()
  assert 'NaN' not in results_text  # standard JSON: null, not NaN
  assert (tmp_path / 'sweep.csv').read_text().splitlines()[2] == '1000000.0,0,,,,,,2'
  assert '| 1000000.0 | 0 (2 diverged) | – | – | – | – | – |' in output.out
  note = (
    'Diverged, so left out of the means and p-values above (sweep_diverged.csv; each '
    'eval_results.json records diverged_at_step): optim.learning_rate=1000000.0 seed 0 at step '
    '10; optim.learning_rate=1000000.0 seed 1 at step 10.'
  )
  assert (tmp_path / 'sweep.md').read_text().endswith('\n\n' + note + '\n')
  with open(tmp_path / 'sweep_diverged.csv') as stream:
    assert [row['seed'] for row in csv.DictReader(stream)] == ['0', '1']
  trained.clear()
  sweep.sweep(config, tmp_path, field, values, [0, 1], 'bpc', baseline=0.001)  # a rerun
  output = capsys.readouterr()
  assert trained == [] and 'warning' not in output.err and note in output.out
  assert output.out.count('finished, kept') == 6


def test_a_baseline_that_diverged_in_every_seed_is_a_warning_naming_baseline(
  tmp_path, monkeypatch, capsys
):
  """The header said 'against ...=1000000.0', every difference and p-value was –, and nothing
  said why; the diverged value had no row. The sweep does not switch baselines by itself."""
  field, values = 'optim.learning_rate', [1e6, 0.001, 0.002]
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 20
  _fake_training(monkeypatch, lambda c: c.optim.learning_rate > 1)
  summary = sweep.sweep(config, tmp_path, field, values, [0, 1], 'bpc', baseline=1e6)
  assert [(row['value'], row['n'], row['diverged']) for row in summary] == [
    (1e6, 0, 2),
    (0.001, 2, 0),
    (0.002, 2, 0),
  ]
  warnings = capsys.readouterr().err.splitlines()
  assert warnings[-1] == (
    'warning: the baseline optim.learning_rate=1000000.0 diverged in all 2 seeds, so the table '
    'has no difference or p-value; pass --baseline with a value that has finished runs (0.001, '
    '0.002)'
  )
  assert (
    '| 1000000.0 | 0 (2 diverged) | – | – | (baseline) |' in (tmp_path / 'sweep.md').read_text()
  )
  one_seed = [{'value': 1e6, 'n': 0, 'diverged': 1}, {'value': 0.001, 'n': 1, 'diverged': 0}]
  sweep_tables.warn_baseline_without_runs(one_seed, field, 1e6, skipped=False)
  assert 'diverged in its one seed, so' in capsys.readouterr().err  # not 'in all 1 seeds'


def test_segments_of_other_lengths_get_no_item_test(tmp_path):
  """A sweep of eval.tgt_len scores other segments at each value: the paired bootstrap cannot
  pair them (it ended the sweep with `error: paired test: ... segments`), so it gives none."""
  field = 'eval.tgt_len'
  _fake_runs(tmp_path, field, {16: [2.0, 2.1], 32: [1.5, 1.6]})
  for seed in (0, 1):
    path = sweep_grid.run_dir(tmp_path, field, 32, seed) / 'eval_results.json'
    results = json.loads(path.read_text())
    halved = {'segment_nats': results['segment_nats'][:20], 'segment_tokens': [16] * 20}
    path.write_text(json.dumps(results | halved))
  rows = sweep_tables.collect(sweep_tables.read_runs(tmp_path, field, [16, 32], [0, 1]), 'bpc')
  summary = sweep_tables.summarise(load_config('char_tiny', 'shaw'), rows, [16, 32], 'bpc', 16)
  assert summary[1]['p_value'] is None and summary[1]['difference'] == pytest.approx(-0.5)


def test_the_difference_pairs_the_seeds_the_tests_pair(tmp_path):
  """With a baseline seed diverged, the difference compared means over other seed sets than
  the seed test paired; now it is over the shared seeds, and a note says so."""
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0, 3.0], 4: [1.5, 1.6]})
  (sweep_grid.run_dir(tmp_path, field, 0, 1) / 'eval_results.json').write_text(
    json.dumps({'bpc': None, 'diverged_at_step': 10})
  )
  runs = sweep_tables.read_runs(tmp_path, field, [0, 4], [0, 1])
  rows, diverged = sweep_tables.collect(runs, 'bpc'), sweep_tables.diverged_runs(runs)
  summary = sweep_tables.summarise(
    load_config('char_tiny', 'shaw'), rows, [0, 4], 'bpc', 0, diverged
  )
  assert summary[1]['difference'] == pytest.approx(-0.5)  # seed 0 only, not 1.55 - 2.0
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, field, 'bpc', baseline=0)
  assert '| 0 | 1 (1 diverged) | 2.000 | – | (baseline) |' in markdown
  assert '| 4 | 2 | 1.550 | 0.071 | -0.500 |' in markdown
  assert (
    'The difference of model.max_relative_position=4 (seeds 0) is over the seeds it shares with '
    'the baseline, which the tests pair, not the difference of the means.' in markdown
  )


def test_a_seed_test_of_two_seeds_is_noted(tmp_path):
  """A t-test over two paired seeds has one degree of freedom: sweep.md says so under the
  table for each value it concerns, and not for three seeds."""
  field = 'model.max_relative_position'
  _fake_runs(tmp_path, field, {0: [2.0, 2.1, 2.2], 4: [1.5, 1.7], 16: [1.9, 2.0, 2.05]})
  runs = sweep_tables.read_runs(tmp_path, field, [0, 4, 16], [0, 1, 2])
  rows = sweep_tables.collect(runs, 'bpc')
  summary = sweep_tables.summarise(load_config('char_tiny', 'shaw'), rows, [0, 4, 16], 'bpc', 0)
  markdown = sweep_tables.write_tables(summary, rows, tmp_path, field, 'bpc', baseline=0)
  assert (
    'The seed test of model.max_relative_position=4 pairs two seeds: a t-test of 1 degree of '
    'freedom, whose p-value swings with any one run; more seeds make it a test.' in markdown
  )
  assert markdown.count('pairs two seeds') == 1


def test_the_tables_read_each_result_once(tmp_path, monkeypatch):
  """collect and diverged_runs each read every run's eval_results.json, so the tables read each
  twice; now `sweep_tables.read_runs` reads it once for both (here after the sweep's check that
  the run is finished)."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10
  _fake_runs(tmp_path, field, {0: [2.0, 2.1]})
  sweep_grid.run_dir(tmp_path, field, 0, 2).mkdir(parents=True)
  for seed in (0, 1, 2):  # finished at the config's step and eval settings; seed 2 diverged
    path = sweep_grid.run_dir(tmp_path, field, 0, seed) / 'eval_results.json'
    results = json.loads(path.read_text()) if seed < 2 else {'bpc': None, 'diverged_at_step': 10}
    path.write_text(json.dumps(results | {'eval': config.eval.to_dict()}))
  reads, read_results = collections.Counter(), run_results.read_results
  monkeypatch.setattr(
    run_results, 'read_results', lambda path: reads.update([path]) or read_results(path)
  )
  summary = sweep.sweep(config, tmp_path, field, [0], [0, 1, 2], 'bpc', baseline=0)
  assert (summary[0]['n'], summary[0]['diverged']) == (2, 1)
  assert list(reads.values()) == [2, 2, 2]  # is_finished's, then the tables'


def test_collecting_reads_each_result_once_for_every_table(tmp_path, monkeypatch, capsys):
  """--collect_only's staleness check, the p-values (the baseline's results again for each
  value), the --by_position breakdown and the --evaluations table each read the runs'
  eval_results.json again; now `sweep_tables.read_runs` reads each once and the rows carry it."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  settings = {'tgt_len=16': {'eval.tgt_len': 16}, 'tgt_len=32': {'eval.tgt_len': 32}}
  for setting, overrides in settings.items():
    _fake_runs(tmp_path / setting, field, {0: [2.0, 2.1], 4: [1.5, 1.6], 8: [1.7, 1.8]})
    for run in (tmp_path / setting).rglob('eval_results.json'):
      results = json.loads(run.read_text())
      results['eval'] = config.eval.to_dict() | {'tgt_len': overrides['eval.tgt_len']}
      results.update(position_bpc=[results['bpc']] * 4, position_tokens=[10] * 4)
      target = tmp_path / run.parent.relative_to(tmp_path / setting) / setting
      target.mkdir(parents=True)
      (target / 'eval_results.json').write_text(json.dumps(results))
  reads, read_results = collections.Counter(), run_results.read_results
  monkeypatch.setattr(
    run_results, 'read_results', lambda path: reads.update([path]) or read_results(path)
  )
  summary = sweep.sweep(
    config,
    tmp_path,
    field,
    [0, 4, 8],
    [0, 1],
    'bpc',
    0,
    train=False,
    breakdowns=[(breakdown.POSITION, [2])],
    evaluations=settings,
  )
  assert [row['n'] for row in summary] == [2, 2, 2] and summary[1]['p_value'] is not None
  assert (tmp_path / 'sweep_by_position.csv').exists()
  assert (tmp_path / 'sweep_by_evaluation.csv').exists()
  assert len(reads) == 12 and set(reads.values()) == {1}, reads
  assert 'warning' not in capsys.readouterr().err


def test_an_eval_field_sweep_trains_a_diverging_seed_once(tmp_path, monkeypatch, capsys):
  config = load_config('char_tiny', 'shaw')
  trained = _fake_training(monkeypatch, lambda c: c.seed == 1)
  command = 'python -m relpos.studies.sweep --config=configs/char_tiny.py:shaw --field=eval.mem_len'
  summary = sweep.sweep(
    config, tmp_path, 'eval.mem_len', [0, 4], [0, 1], 'bpc', baseline=0, command=command
  )
  assert (tmp_path / sweep.COMMAND_RECORD).read_text() == command + '\n'  # what trained it
  assert [seed for _, seed in trained] == [0, 1, 0]  # value-major; seed 1 trained once
  assert [(row['value'], row['n']) for row in summary] == [(0, 1), (4, 1)]
  for value in (0, 4):
    results = sweep_grid.run_dir(tmp_path, 'eval.mem_len', value, 1) / 'eval_results.json'
    assert run_results.read_results(results)['eval']['mem_len'] == value
  assert len(capsys.readouterr().err.splitlines()) == 2  # one warning per run


def test_a_rerun_with_another_config_names_the_sweeps_remedy(tmp_path, monkeypatch):
  """The sweep relayed train.py's `pass --allow_config_change`, a flag it does not take; it
  also trained the runs before the changed one."""
  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  text = tmp_path / 'text.txt'
  text.write_text('the cat sat on the mat. ' * 30)
  config.data.path = str(text)
  trained = _fake_training(monkeypatch, lambda c: False)
  workdir = sweep_grid.model_dir(tmp_path, field, 4, 0)
  workdir.mkdir(parents=True)
  from relpos.config.recorded import record_config
  from relpos.training import data_record

  record_config(sweep_grid.with_value(config, field, 4), workdir, allow_change=False)
  changed = sweep_grid.with_value(config, 'optim.learning_rate', 0.5)
  with pytest.raises(ValueError) as error:
    sweep.sweep(changed, tmp_path, field, [2, 4], [0], 'bpc', baseline=2)
  assert str(error.value).startswith(
    f'model.max_relative_position=4 seed=0: {workdir} holds a run trained with another config '
    '(config.optim.learning_rate: '
  )
  assert str(error.value).endswith(
    'give the sweep a new --workdir for the new config, or the config its runs were trained '
    f'with ({workdir}/config.json records it)'
  )
  data_record.record(workdir, char_lm.TASK.data_files(config, workdir))
  text.write_text('other text')
  with pytest.raises(ValueError, match='trained on other data .*give the sweep a new --workdir'):
    sweep.sweep(config, tmp_path, field, [2, 4], [0], 'bpc', baseline=2)
  assert trained == []  # refused before the first run trained


def test_print_only_quotes_each_argument_for_the_shell(tmp_path):
  """A workdir with a space broke the printed commands into two arguments."""
  import shlex

  root = tmp_path / 'k sweep'
  lines = sweep_grid.commands(
    'c.py:shaw', ['--config.data.path=my text.txt'], root, 'model.k', [2], [0]
  )
  assert [shlex.split(line) for line in lines] == [
    [
      'python',
      'train.py',
      '--config=c.py:shaw',
      '--config.data.path=my text.txt',
      '--config.model.k=2',
      '--config.seed=0',
      f'--workdir={root}/k=2/seed=0',
    ]
  ]


def test_a_second_sweep_on_the_same_root_is_refused_at_once(tmp_path, monkeypatch):
  """Two sweeps on one root, started seconds apart: the second re-scored a run the first had
  just finished, then stopped (exit 75) at the run the first was training. The sweep holds its
  root's lock now, so the second is refused before it does anything; --collect_only reads."""
  from relpos.training import workdir_lock

  field = 'model.max_relative_position'
  config = load_config('char_tiny', 'shaw')
  config.train.steps = 10  # _fake_runs' step
  trained = _fake_training(monkeypatch, lambda c: False)
  _fake_runs(tmp_path, field, {0: [2.0]})
  with workdir_lock.hold(tmp_path):  # the first sweep
    with pytest.raises(workdir_lock.WorkdirInUseError, match=f'--workdir={tmp_path} is in use'):
      sweep.sweep(config, tmp_path, field, [0, 4], [0], 'bpc', baseline=0)
    assert trained == []
    sweep.sweep(config, tmp_path, field, [0], [0], 'bpc', baseline=0, train=False)
  sweep.sweep(config, tmp_path, field, [0, 4], [0], 'bpc', baseline=0)
  assert len(trained) == 2  # once the first let go (_fake_runs' result has no config.eval)


def test_a_value_converts_to_the_declared_type_and_none_resets_an_optional_field():
  """A field that is None by default (data.max_bytes) had no type to convert to: a preset
  sweep's `--config.data.max_bytes=5` ended in `TypeError: NoneType takes no arguments`."""
  config = load_config('char_tiny', 'shaw')
  assert sweep_grid.parse_value(config, 'data.max_bytes', '5') == 5
  assert sweep_grid.parse_value(config, 'data.max_bytes', 'None') is None
  with pytest.raises(ValueError, match=r"--values: 'x' is not a int, as data.max_bytes is"):
    sweep_grid.parse_value(config, 'data.max_bytes', 'x')
  with pytest.raises(ValueError, match=r"'None' is not a int, as train.steps is"):
    sweep_grid.parse_value(config, 'train.steps', 'None')
  variant = sweep_grid.preset_variants(
    REPO / 'configs' / 'char_tiny.py', ['--config.data.max_bytes=5']
  )
  assert variant('xl').data.max_bytes == 5


def test_a_run_directory_is_one_level_inside_the_root_whatever_the_value(tmp_path):
  """A value's text named its directory as it was: a path value `../../../cwdA/data.txt` put
  its run outside the sweep's root, an absolute one nested it deep inside. Now the value is one
  directory name ('/', NUL and the escape '%' as %XX, reversible); the names of numbers, bools
  and names are as they were, so sweeps already on disk find their runs."""
  from urllib.parse import unquote

  field = 'data.path'
  for value in ('../../../cwdA/data.txt', '/root/x/a.txt', '..', '.', 'a/', 'a%2Fb', 'a\0b'):
    run = sweep_grid.run_dir(tmp_path, field, value, 0)
    assert run.parent.parent == tmp_path and run.name == 'seed=0'
    assert run.parent.name not in ('.', '..') and '\0' not in run.parent.name
    assert unquote(run.parent.name) == f'path={value}'
  assert sweep_grid.run_dir(tmp_path, field, 'a/b', 0) != sweep_grid.run_dir(
    tmp_path, field, 'a%2Fb', 0
  )
  assert sweep_grid.run_dir(tmp_path, field, '/root/x/a.txt', 1) == (
    tmp_path / 'path=%2Froot%2Fx%2Fa.txt' / 'seed=1'
  )
  for value in (4, -1, 0.5, 1e-06, 1e6, float('inf'), True, None, 'shaw', 'shaw_keys_only'):
    assert sweep_grid.run_dir(tmp_path, 'model.position', value, 2) == (
      tmp_path / f'position={value}' / 'seed=2'
    )
  setting = 'tgt_len=64+mem_len=64'
  assert sweep_grid.run_dir(tmp_path, 'model.position', 'shaw', 0, setting).name == setting


def test_a_value_too_long_for_a_directory_name_gets_a_shortened_one(tmp_path):
  """A long path value (its '/' escaped as %2F) made a run directory's name longer than a
  filesystem takes: the sweep ended in a traceback (OSError: [Errno 36] File name too long).
  Such a name is now shortened deterministically to 255 bytes (its beginning and a hash of the
  whole); two values with the same beginning keep two runs, and a name that fits is as it
  was."""
  long_path = '/data/' + '/'.join(['d' * 60] * 4) + '/corpus.txt'
  other = long_path.replace('corpus.txt', 'other.txt')
  names = {
    sweep_grid.run_dir(tmp_path, 'data.path', value, 0).parent.name for value in (long_path, other)
  }
  assert len(names) == 2
  for name in names:
    assert len(name.encode()) == 255 and name.startswith('path=%2Fdata%2Fdddd')
    (tmp_path / name).mkdir()
  assert sweep_grid.run_dir(tmp_path, 'data.path', long_path, 0) == sweep_grid.run_dir(
    tmp_path, 'data.path', long_path, 0
  )
  wide = 'é' * 200  # 400 bytes: cut on a character's edge, the name valid UTF-8
  name = sweep_grid.directory_name(f'path={wide}')
  assert len(name.encode()) <= 255 and name.encode().decode() == name
  (tmp_path / name).mkdir()
  fits = 'path=' + 'x' * 250  # 255 bytes exactly: as it was
  assert sweep_grid.directory_name(fits) == fits


def test_a_path_value_is_home_expanded_and_the_tables_show_the_value(tmp_path, monkeypatch):
  """`--values=~/a.txt` of a path field looked for a directory named `~` (the shell expands
  `~` only at a word's start); the tables show each value as given, its run inside the root."""
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  config = load_config('char_tiny', 'shaw')
  assert sweep_grid.parse_value(config, 'data.path', '~/a.txt') == f'{tmp_path}/home/a.txt'
  assert sweep_grid.parse_value(config, 'data.path', '../a~/b.txt') == '../a~/b.txt'
  assert sweep_grid.parse_value(config, 'model.position', '~') == '~'  # not a path field
  root = tmp_path / 'sweep'
  values = ['../../cwdA/data.txt', f'{tmp_path}/home/a.txt']
  _fake_runs(root, 'data.path', {values[0]: [1.0, 1.1], values[1]: [1.2, 1.3]})
  sweep.sweep(config, root, 'data.path', values, [0, 1], 'bpc', baseline=values[0], train=False)
  results = list(tmp_path.rglob('eval_results.json'))
  assert len(results) == 4 and all(path.parent.parent.parent == root for path in results)
  with open(root / 'sweep_seeds.csv') as stream:
    rows = list(csv.DictReader(stream))
  assert [row['value'] for row in rows] == [values[0]] * 2 + [values[1]] * 2
  assert all(Path(row['workdir']).parent.parent == root for row in rows)
  with open(root / 'sweep.csv') as stream:
    assert [row['value'] for row in csv.DictReader(stream)] == values


def test_translations_holding_unicode_line_breaks_pair_with_their_references(tmp_path):
  """A target corpus holding U+0085 (cp1252's '…' read as Latin-1) gives translations holding
  it; `sweep_tables._pooled_items` read them with str.splitlines(), which splits there too, so a
  finished sweep ended with `error: paired test: 79 baseline and 79 system translations for 40
  references` and no tables. Translation files are cut on '\\n' only (`files.split_lines`)."""
  lines = ['Er sagte\x85 nein', 'zwei\u2028drei', 'vier\x1cfünf', 'sechs\x0bsieben']
  translations = tmp_path / 'translations_step10.txt'
  translations.write_bytes(''.join(line + '\n' for line in lines).encode())
  rows = [{'seed': 0, 'workdir': str(tmp_path), 'results': {'translations': str(translations)}}]
  assert sweep_tables._pooled_items('bleu', rows) == {0: lines}


def _legacy_run(root: Path, directory: str, seed: int, *, trained: dict | None = None) -> Path:
  """A run directory as a sweep of an older relpos (no root record) left it: a trained run's
  config.json (`trained`), else only an evaluation's eval_results.json."""
  run = root / directory / f'seed={seed}'
  run.mkdir(parents=True)
  if trained is not None:
    (run / run_config.CONFIG_FILE).write_text(json.dumps(trained))
  else:
    (run / run_results.RESULTS_FILE).write_text(json.dumps({'bpc': 7.5}))
  return run


def test_a_sweep_of_another_field_in_a_root_is_refused_before_anything_trains(
  tmp_path, monkeypatch
):
  """An eval.max_relative_position sweep in a root of a model.max_relative_position sweep
  scored into the trained runs (both name directories max_relative_position=v/seed=s); a k
  sweep after an eval one trained its first value, then stopped at the next with eval.py's
  remedy; any two sweeps in one root replaced each other's sweep.csv. The root records its
  field, and a sweep of another refuses it up front in one line; the same field's sweep
  (more values, seeds) goes on."""
  trained = []
  monkeypatch.setattr(sweep, 'train_unfinished', lambda *args: trained.append(args))
  monkeypatch.setattr(sweep_tables, 'read_runs', lambda *args, **kwargs: [])
  config = load_config('char_tiny', 'shaw')
  root = tmp_path / 'k'
  with pytest.raises(FileNotFoundError):  # no finished runs: the training was stubbed
    sweep.sweep(config, root, 'model.max_relative_position', [2, 4], [0], 'bpc', baseline=2)
  assert json.loads((root / sweep_grid.FIELD_RECORD).read_text()) == {
    'field': 'model.max_relative_position'
  }
  for other in ('eval.max_relative_position', 'model.position'):
    with pytest.raises(ValueError) as refused:
      sweep.sweep(config, root, other, [-1, 2], [0], 'bpc', baseline=-1)
    assert str(refused.value).startswith(
      f'--workdir={root} holds the sweep of model.max_relative_position '
      f'(its {sweep_grid.FIELD_RECORD})'
    )
    assert str(refused.value).endswith(f'give the sweep of {other} another --workdir')
  assert len(trained) == 1
  with pytest.raises(FileNotFoundError):  # more values and seeds: the same sweep
    sweep.sweep(config, root, 'model.max_relative_position', [2, 4, 8], [0, 1], 'bpc', 2)
  assert len(trained) == 2


def test_a_root_of_an_older_sweep_is_told_by_its_run_directories(tmp_path):
  """A root an older relpos made has no record: a trained run's config.json names its field,
  a directory holding only eval_results.json (beside trained/) an eval field's; the same
  field's sweep goes on (and records it), another's is refused."""
  k_root = tmp_path / 'k'
  config = load_config('char_tiny', 'shaw').to_dict()
  config['model']['max_relative_position'] = 2
  _legacy_run(k_root, 'max_relative_position=2', 0, trained=config)
  assert sweep_grid.root_fields(k_root) == (['model.max_relative_position'], False)
  sweep_grid.check_root(k_root, 'model.max_relative_position')
  with pytest.raises(ValueError, match='write into; .*sweep of eval.max_relative_position another'):
    sweep_grid.check_root(k_root, 'eval.max_relative_position')
  sweep_grid.record_field(k_root, 'model.max_relative_position')
  assert sweep_grid.root_fields(k_root) == (['model.max_relative_position'], True)

  mem_root = tmp_path / 'mem'
  _legacy_run(mem_root, 'trained', 0, trained=config)
  _legacy_run(mem_root, 'mem_len=0', 0)
  assert sweep_grid.root_fields(mem_root) == (['eval.mem_len'], False)
  sweep_grid.check_root(mem_root, 'eval.mem_len')
  with pytest.raises(ValueError, match='holds the sweep of eval.mem_len .* train.mem_len another'):
    sweep_grid.check_root(mem_root, 'train.mem_len')


def test_print_only_refuses_a_root_of_another_field(tmp_path, monkeypatch, capsys):
  sweep_grid.record_field(tmp_path, 'model.max_relative_position')
  code = run_sweep_main(
    monkeypatch,
    f'--workdir={tmp_path}',
    '--config=configs/char_tiny.py:shaw',
    '--field=eval.max_relative_position',
    '--values=-1,2',
    '--print_only',
  )
  assert code is not None and code != 0
  assert capsys.readouterr().out == ''


def test_the_sweep_table_and_a_breakdown_bucket_give_the_same_statistics(monkeypatch):
  """A sweep's table (`summarise`) and one bucket of a breakdown (`breakdown.by_bucket`) of the
  same per-seed scores agree on n, mean, std (None for one run), the paired difference and the
  seed test: one computation (`significance.against_baseline`). The item test is each one's
  own (stubbed: it reads the runs' files)."""
  scores = {0: {0: 2.0, 1: 2.2, 2: 2.1}, 4: {0: 1.5, 1: 1.8, 2: 1.6}, 16: {1: 2.4}, 64: {}}
  rows = [
    {'value': value, 'seed': seed, 'bpc': score}
    for value, by_seed in scores.items()
    for seed, score in by_seed.items()
  ]
  monkeypatch.setattr(sweep_tables, 'p_value', lambda *args: 0.5)
  table = sweep_tables.summarise(None, rows, list(scores), 'bpc', baseline=0)
  per_run = [row | {'bucket': 'all'} for row in rows]
  bucket, _ = breakdown.by_bucket(per_run, {'all': 10}, 0, 'bpc', lambda *args: 0.5)
  statistics = ('value', 'n', 'mean', 'std', 'difference', 'p_value', 'p_seeds')
  got = [{name: row[name] for name in statistics} for row in table if row['n']]
  assert got == [{name: row[name] for name in statistics} for row in bucket]
  assert [row['std'] is None for row in got] == [False, False, True]
  assert got[2]['difference'] == pytest.approx(0.2) and got[2]['p_seeds'] is None
  assert got[1]['difference'] == pytest.approx(-0.4667, abs=1e-4) and got[1]['p_seeds'] < 0.05
  assert table[-1] | {'diverged': 0} == dict.fromkeys(sweep_tables.SUMMARY_COLUMNS) | {
    'value': 64,
    'n': 0,
    'diverged': 0,
  }
