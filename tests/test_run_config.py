"""The run's config kept in its workdir: a rerun with another config is refused unless allowed."""

import json

import pytest
from helpers import eval_field_sweep_root, load_config

from relpos.config import recorded as recording
from relpos.faults import TaskMismatchError
from relpos.training import run_config, run_results


def test_a_rerun_with_another_config_is_refused_unless_allowed(tmp_path):
  config = load_config('char_tiny')
  recording.record_config(config, tmp_path, allow_change=False)
  recording.record_config(config, tmp_path, allow_change=False)  # same config: fine
  config.eval.mem_len = 64  # evaluation settings may change
  recording.record_config(config, tmp_path, allow_change=False)
  config.train.mem_len = 32
  with pytest.raises(ValueError, match=r'config.train.mem_len: 64 -> 32.*--allow_config_change'):
    recording.record_config(config, tmp_path, allow_change=False)
  recording.record_config(config, tmp_path, allow_change=True)
  assert (tmp_path / 'config.1.json').exists()
  assert '"mem_len": 32' in (tmp_path / 'config.json').read_text()


def test_config_changes_lists_added_removed_and_nested_fields():
  old = {'model': {'k': 1, 'd': 2}, 'seed': 0}
  new = {'model': {'k': 4, 'h': 8}, 'seed': 0}
  assert recording.config_changes(old, new) == [
    "config.model.d: 2 -> '<absent>'",
    "config.model.h: '<absent>' -> 8",
    'config.model.k: 1 -> 4',
  ]


# Fields added after runs were recorded: such runs read each at its declared default, which
# leaves them unchanged (they configure position schemes and options those runs could not use).
NEUTRAL = {
  'model.relative_table_init': 'kernel',
  'model.relative_table_init_scale': 1.0,
  'model.t5_num_buckets': 32,
  'model.t5_max_distance': 128,
  'model.rope_base': 10000.0,
  'model.remat': 'none',
  'model.scan_layers': False,
  'model.attention_implementation': 'auto',
  'train.grad_accum_steps': 1,
  'eval.max_relative_position': -1,
}


def test_a_run_recorded_before_a_field_was_added_reads_its_declared_default(tmp_path):
  """Runs recorded before the T5 / RoPE fields existed still evaluate and resume: a missing
  field reads as its declared default, the value that leaves them unchanged; any other
  difference counts."""
  config = load_config('translate_tiny', 'shaw')
  recording.record_config(config, tmp_path, allow_change=False)
  path = tmp_path / recording.CONFIG_FILE
  recorded = json.loads(path.read_text())
  for name, neutral in NEUTRAL.items():
    section, field = name.split('.')
    assert recorded[section][field] == neutral  # the declared default
    del recorded[section][field]
  path.write_text(json.dumps(recorded))
  assert run_config.read_config(tmp_path).model.t5_num_buckets == 32
  assert recording.changes_from_recorded(config, tmp_path) == []
  config.model.rope_base = 500.0
  assert recording.changes_from_recorded(config, tmp_path) == [
    'config.model.rope_base: 10000.0 -> 500.0'
  ]


def test_a_recorded_old_name_is_not_backfilled_under_its_new_name(tmp_path):
  """A config recorded with a renamed field (model.n_head) keeps it and lacks the new one: the
  change says so instead of reading the new name's default."""
  config = load_config('char_tiny', 'xl')
  recording.record_config(config, tmp_path, allow_change=False)
  path = tmp_path / recording.CONFIG_FILE
  recorded = json.loads(path.read_text())
  recorded['model']['n_head'] = recorded['model'].pop('num_heads')
  path.write_text(json.dumps(recorded))
  changes = recording.changes_from_recorded(config, tmp_path)
  assert changes == [
    f"config.model.n_head: {config.model.num_heads} -> '<absent>'",
    f"config.model.num_heads: '<absent>' -> {config.model.num_heads}",
  ]


def test_evaluation_checks_the_model_fields_against_the_run(tmp_path):
  """`check_model`: any config.model field that defines the function (the position scheme,
  widths) must be the run's; how it is trained or computed, the other sections and a workdir
  without config.json (an older run) are not checked."""
  run_config.check_model(tmp_path, load_config('char_tiny', 'none'))  # no config.json
  recording.record_config(load_config('char_tiny', 'absolute'), tmp_path, allow_change=False)
  config = load_config('char_tiny', 'absolute')
  config.model.update(attention_implementation='xla', dtype='bfloat16', dropout=0.0, remat='full')
  config.eval.update(mem_len=64, max_relative_position=2)
  config.data.path = str(tmp_path / 'other.txt')
  config.train.steps = 1
  run_config.check_model(tmp_path, config)
  config = load_config('char_tiny', 'none')
  config.model.num_heads += 1
  with pytest.raises(ValueError) as caught:
    run_config.check_model(tmp_path, config)
  assert str(caught.value) == (
    f'--workdir={tmp_path} holds a run of another model than the config builds '
    f'(model.num_heads: trained {config.model.num_heads - 1}, given {config.model.num_heads}; '
    f"model.position: trained 'absolute', given 'none'): give the config it was trained with "
    f'({tmp_path}/config.json records it, and eval.py without --config reads it)'
  )


def test_a_run_of_another_task_is_named_by_the_tasks_as_configs_spell_them(tmp_path):
  """The message said 'a translate run' of one and 'a translation run' of the other task."""
  (tmp_path / 'config.json').write_text(json.dumps(load_config('char_tiny').to_dict()))
  with pytest.raises(TaskMismatchError) as caught:
    run_config.check_task(tmp_path, 'translate')
  assert str(caught.value) == (
    f"--workdir={tmp_path} holds a run of task 'char_lm', not 'translate' (the config's task is "
    "'translate'): give the workdir of a run of task 'translate', or a config of task 'char_lm' "
    'for this one'
  )


def test_eval_output_dir_holding_another_run_is_refused(tmp_path, monkeypatch):
  """eval.py --output_dir=B, B another run's directory: its eval_results.json was replaced by a
  score of --workdir's model without a word (and a sweep then tabulated it as B's own)."""
  workdir, other = tmp_path / 'run', tmp_path / 'other'
  (workdir / 'checkpoints' / '20').mkdir(parents=True)
  other.mkdir()
  for name in ('config.json', 'checkpoints'):  # each alone marks a run
    held = other / name
    held.mkdir() if name == 'checkpoints' else held.write_text('{}')
    with pytest.raises(
      ValueError, match=rf'^--output_dir={other} holds another run \(its {name}\)'
    ):
      run_config.check_output_dir(other, workdir)
    (held.rmdir if name == 'checkpoints' else held.unlink)()
  results = other / 'eval_results.json'
  results.write_text(json.dumps({'bpc': 4.5, 'checkpoint': f'{tmp_path}/c1/checkpoints/300'}))
  with pytest.raises(ValueError, match=r'holds the evaluation of another run .*c1/checkpoints/300'):
    run_config.check_output_dir(other, workdir)
  # Fine: earlier evaluations of the same workdir (absolute, or relative to another directory
  # than this one), a damaged file, a new directory, the workdir itself.
  results.write_text(json.dumps({'checkpoint': f'{workdir}/checkpoints/20'}))
  run_config.check_output_dir(other, workdir)
  monkeypatch.chdir(tmp_path)
  results.write_text(json.dumps({'checkpoint': 'run/checkpoints/20'}))
  run_config.check_output_dir(other, workdir)
  run_config.check_output_dir(other, 'run')
  results.write_text('{"bpc": 4.')
  run_config.check_output_dir(other, workdir)
  run_config.check_output_dir(tmp_path / 'new', workdir)
  (workdir / 'config.json').write_text('{}')
  run_config.check_output_dir(workdir, workdir)
  assert run_results.foreign_checkpoint(
    {'checkpoint': 'x/run/checkpoints/20'}, workdir, workdir
  ) == ('x/run/checkpoints/20')
  # A sweep's root (fz14b-10: refused as --workdir, it took an eval_results.json as
  # --output_dir): by its tables alone, or by its runs.
  root = tmp_path / 'root'
  root.mkdir()
  (root / 'sweep.csv').write_text('value,seed\n')
  with pytest.raises(ValueError, match=rf"^--output_dir={root} holds a sweep's runs and tables"):
    run_config.check_output_dir(root, workdir)
  (root / 'sweep.csv').unlink()
  (root / 'k=8' / 'seed=0').mkdir(parents=True)
  with pytest.raises(ValueError, match=r'\(it is the root of a sweep, such as .*k=8/seed=0\)'):
    run_config.check_output_dir(root, workdir)
  run_config.check_output_dir(root / 'k=8' / 'seed=0' / 'clipped', workdir)
  # A sweep's root moved since it was scored: the run's place in it is the same.
  moved = {'checkpoint': '/elsewhere/sweep/k=8/seed=0/checkpoints/20'}
  run = tmp_path / 'sweep2' / 'k=8' / 'seed=0'
  assert run_results.foreign_checkpoint(moved, run, run) is None
  other_run = tmp_path / 'sweep2' / 'k=4' / 'seed=0'
  assert run_results.foreign_checkpoint(moved, other_run, other_run) is not None


def test_eval_py_refuses_an_output_dir_of_another_run_in_one_line(tmp_path, commands):
  from helpers import one_error_line

  other = tmp_path / 'other'
  other.mkdir()
  (other / 'config.json').write_text('{}')
  result = commands.run(
    [
      'eval.py',
      '--config=configs/char_tiny.py',
      f'--workdir={tmp_path}/run',
      f'--output_dir={other}',
    ]
  )
  assert one_error_line(result).startswith(f'error: --output_dir={other} holds another run')
  assert (other / 'config.json').read_text() == '{}'


def test_eval_refuses_to_overwrite_a_sweeps_record_of_a_divergence(tmp_path):
  """eval.py on a run a sweep recorded as diverged warned, then replaced the record with the
  score of the run's last finite checkpoint. Now it scores that checkpoint only elsewhere."""
  workdir, elsewhere = tmp_path / 'run', tmp_path / 'eval'
  (workdir / 'checkpoints' / '4').mkdir(parents=True)
  record = {'bpc': None, 'diverged_at_step': 8, 'diverged': 'loss is nan at step 8'}
  (workdir / 'eval_results.json').write_text(json.dumps(record))
  refusal = (
    f"{workdir}/eval_results.json records that its run diverged at step 8 (a sweep's record, in "
    'place of a score), which this evaluation would overwrite: give --output_dir to score the '
    "run's last finite checkpoint there"
  )
  with pytest.raises(ValueError) as caught:
    run_config.check_output_dir(None, workdir)
  assert str(caught.value) == refusal
  run_config.check_output_dir(elsewhere, workdir)  # a new directory
  elsewhere.mkdir()
  (elsewhere / 'eval_results.json').write_text(json.dumps(record))  # an eval field's record
  with pytest.raises(ValueError, match='which this evaluation would overwrite: give another --'):
    run_config.check_output_dir(elsewhere, workdir)
  run_config.check_output_dir(None, tmp_path / 'new')  # nothing there yet


def test_eval_py_on_a_run_a_sweep_recorded_as_diverged_is_one_line(tmp_path, commands):
  from helpers import one_error_line

  workdir = tmp_path / 'run'
  workdir.mkdir()
  record = json.dumps({'bpc': None, 'diverged_at_step': 8})
  (workdir / 'eval_results.json').write_text(record)
  result = commands.run(['eval.py', '--config=configs/char_tiny.py', f'--workdir={workdir}'])
  assert one_error_line(result).startswith(
    f'error: {workdir}/eval_results.json records that its run diverged at step 8'
  )
  assert (workdir / 'eval_results.json').read_text() == record


def test_a_sweep_root_or_an_evaluation_only_directory_is_named_as_such(tmp_path):
  """relpos.tools.sample (and translate, shaw_tables) given a sweep's root or a results
  directory said 'holds no relpos run (train first)', though the run is one folder away."""
  trained, scored = eval_field_sweep_root(tmp_path)
  with pytest.raises(FileNotFoundError) as error:
    run_config.read_config(tmp_path)
  assert str(error.value) == (
    f'--workdir={tmp_path} is the root of a sweep, not a run: give its run directories, such '
    f'as {trained}'
  )
  with pytest.raises(FileNotFoundError) as error:
    run_config.read_config(scored)
  assert str(error.value) == (
    f'--workdir={scored} holds only an evaluation (eval_results.json) of the run in {trained}: '
    'give that directory'
  )
  (tmp_path / 'empty').mkdir()
  with pytest.raises(FileNotFoundError, match=r'holds no relpos run \(train first\)'):
    run_config.read_config(tmp_path / 'empty')


def test_a_model_field_the_scheme_never_reads_may_differ_at_evaluation(tmp_path):
  """`check_model` with the task's `unread_fields`: a t5 run trained with
  model.max_relative_position=8 (which t5 never reads) is scored with another value, in either
  direction, as a sweep script passing shared flags to every scheme does; a field it reads is
  still the run's."""
  from relpos.training import tasks

  trained = load_config('char_tiny', 't5')
  trained.model.max_relative_position = 8
  recording.record_config(trained, tmp_path, allow_change=False)
  config = load_config('char_tiny', 't5')
  config.model.max_relative_position = 16
  unread = tasks.get(config).unread_fields(config)
  assert 'max_relative_position' in unread
  run_config.check_model(tmp_path, config, unread)
  config.model.num_heads += 1
  with pytest.raises(ValueError, match=r'\(model.num_heads: trained 4, given 5\)'):
    run_config.check_model(tmp_path, config, unread)


def test_an_evaluation_setting_the_model_never_reads_is_refused_unless_it_is_the_run_s():
  """`check_unread_settings`: eval.clamp_len=5 on a shaw run (trained with char_tiny's -1) was
  accepted, changed nothing and was recorded in eval_results.json; it is refused now, while
  the run's own value passes (enwik8_base's default 820 on any scheme), and xl reads it."""
  from relpos.training import tasks

  trained = load_config('char_tiny', 'shaw').to_dict()
  config = load_config('char_tiny', 'shaw')
  config.eval.update(mem_len=64)  # a setting shaw reads
  unread = tasks.get(config).unread_run_fields(config)
  run_config.check_unread_settings(config, unread, trained, 'leave it as the run has it')
  run_config.check_unread_settings(config, unread, None, '')  # no record: not checked
  config.eval.clamp_len = 5
  with pytest.raises(ValueError) as caught:
    run_config.check_unread_settings(config, unread, trained, 'leave it as the run has it')
  assert str(caught.value) == (
    "eval.clamp_len: trained -1, given 5: config.model.position='shaw' never reads it, so the "
    'score would be the same and eval_results.json would record the setting as used; leave it '
    'as the run has it'
  )
  xl = load_config('char_tiny', 'xl')
  xl.eval.clamp_len = 5
  run_config.check_unread_settings(xl, tasks.get(xl).unread_run_fields(xl), trained, '')


def test_another_tfds_data_dir_is_the_same_data(tmp_path):
  """tfds finds its data by config.data.tfds_name and the split, in whichever data_dir holds
  them: a copied prepared directory was "other data" (an evaluation refused to score into the
  workdir, a sweep called the run stale). The name and the splits still count."""
  config = load_config('translate_tiny', 'shaw')
  config.data.update(kind='tfds', tfds_data_dir=str(tmp_path / 'tfds'))
  recording.record_config(config, tmp_path, allow_change=False)
  config.data.tfds_data_dir = str(tmp_path / 'copied')
  assert run_config.data_changes(tmp_path, config, {}) == []
  assert recording.changes_from_recorded(config, tmp_path) == []
  config.data.tfds_eval_split = 'validation'
  assert run_config.data_changes(tmp_path, config, {}) == [
    "data.tfds_eval_split: trained 'test', given 'validation'"
  ]


def test_another_programs_config_json_is_no_run_of_task_none(tmp_path):
  """A HuggingFace model's directory (a config.json with no task) was 'a run of task None',
  and the line asked for 'a config of task None'."""
  (tmp_path / 'config.json').write_text(json.dumps({'architectures': ['BertModel']}))
  for task in ('char_lm', None):
    with pytest.raises(TaskMismatchError) as caught:
      run_config.check_task(tmp_path, task)
    assert str(caught.value) == (
      f"--workdir={tmp_path}: {tmp_path}/config.json is not a relpos run's config (it has no "
      'task): give the directory of a relpos run, or an empty or new directory to train in'
    )
