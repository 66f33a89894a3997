"""End to end: train a tiny Transformer-XL LM on generated text and evaluate it. Resuming with
memory is tested with real signals in test_preemption.py."""

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from helpers import load_config
from test_transformer_xl import _apply  # the model's forward pass, jitted

from relpos.training import char_lm_task as char_lm
from relpos.training import loop


@pytest.fixture(scope='module')
def text_file(tmp_path_factory):
  """The generated text, written once for the module (no test changes it)."""
  rng = np.random.default_rng(0)
  words = ['the ', 'cat ', 'sat ', 'on ', 'a ', 'mat.\n', 'dog ', 'ran ']
  text = ''.join(rng.choice(words, size=6000))
  path = tmp_path_factory.mktemp('text') / 'corpus.txt'
  path.write_text(text)
  return path


def _config(path, *, steps, position='xl'):
  config = load_config('char_tiny')
  config.data.path = str(path)
  config.model.update(
    position=position, num_layers=2, d_model=32, num_heads=2, head_dim=16, d_ff=64
  )
  config.optim.update(warmup_steps=2)
  config.train.update(
    batch_size=4,
    tgt_len=16,
    mem_len=16,
    steps=steps,
    log_every=2,
    eval_every=4,
    checkpoint_every=4,
  )
  config.eval.update(batch_size=4, tgt_len=16, mem_len=32, max_segments_during_training=3)
  return config


def _train_losses(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return {r['step']: r['train/loss'] for r in map(json.loads, lines) if 'train/loss' in r}


def _logged_steps(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return [r['step'] for r in map(json.loads, lines) if 'train/loss' in r]


@pytest.fixture(scope='module')
def trained(text_file, tmp_path_factory):
  """(workdir, result) of an 8-step run of `_config` (checkpoints at 4 and 8), trained and
  scored once for the module: the tests that need a trained run, not its training, work on
  copies of it (`_copy_of_run`), instead of each training (and tracing) one of their own."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  return workdir, char_lm.TASK.train_and_evaluate(_config(text_file, steps=8), workdir)


def _copy_of_run(trained, destination: Path) -> Path:
  """A copy of the module's trained run at `destination` (its results record where they were
  written, so the copy reads them as its own: `run_results.WRITTEN_TO`)."""
  destination.parent.mkdir(parents=True, exist_ok=True)
  shutil.copytree(trained[0], destination)
  return destination


def test_train_then_evaluate_writes_results(text_file, trained, tmp_path, capsys):
  workdir, result = _copy_of_run(trained, tmp_path / 'run'), trained[1]
  assert math.isfinite(result['bpc']) and 0 < result['bpc'] < 8
  assert result['split'] == 'test' and result['step'] == 8
  saved = json.loads((workdir / 'eval_results.json').read_text())
  assert saved['bpc'] == pytest.approx(result['bpc'])
  assert sorted(_train_losses(workdir)) == [2, 4, 6, 8]
  assert list((workdir / 'tensorboard').iterdir())
  # eval.py path: the same checkpoint gives the same number.
  again = char_lm.TASK.evaluate(_config(text_file, steps=8), workdir)
  assert again['bpc'] == pytest.approx(result['bpc'], rel=1e-6)
  assert again['data'] == _config(text_file, steps=8).data.to_dict()
  assert 'warning: scoring other data' not in capsys.readouterr().err
  # Other data is scored into another directory, with a warning naming it, and the results
  # record it; into the workdir it is refused before scoring (it replaced the run's result).
  other_text = tmp_path / 'other.txt'
  other_text.write_bytes(Path(text_file).read_bytes()[::-1])
  other_data = _config(text_file, steps=8)
  other_data.data.path = str(other_text)
  scored_in_place = (workdir / 'eval_results.json').read_bytes()
  with pytest.raises(ValueError, match=r'scores other data than the run in .*\(data\.path: '):
    char_lm.TASK.evaluate(other_data, workdir)
  assert (workdir / 'eval_results.json').read_bytes() == scored_in_place
  assert char_lm.TASK.evaluate(other_data, workdir, output_dir=tmp_path / 'o')['data'] == (
    other_data.data.to_dict()
  )
  assert (
    f'warning: scoring other data than the run trained with (data.path: trained '
    f"'{text_file}', given '{other_text}')"
  ) in capsys.readouterr().err
  # So is another config.eval into the workdir (fz14b-1: a clipped k, another step or split
  # silently replaced the run's own result); into another directory it is scored.
  other_eval = _config(text_file, steps=8)
  other_eval.eval.update(step=4, mem_len=16)
  with pytest.raises(ValueError) as refused:
    char_lm.TASK.evaluate(other_eval, workdir, output_dir=workdir)
  assert str(refused.value).startswith(
    f'this evaluation scores other config.eval settings than the run in {workdir} was scored '
    "with (eval.mem_len: the run's 32, given 16; eval.step: the run's 0, given 4), and would "
    "replace the run's own result (eval_results.json) with that score: give "
    '--output_dir=<a new directory>'
  )
  assert (workdir / 'eval_results.json').read_bytes() == scored_in_place
  assert char_lm.TASK.evaluate(other_eval, workdir, output_dir=tmp_path / 'e')['step'] == 4
  # And another compute dtype (fz14a-4: a float32 run scored in bfloat16 replaced its result,
  # exit 0); into another directory it is scored, and the result records the dtype.
  assert saved['model'] == {'dtype': 'float32'}
  bf16 = _config(text_file, steps=8)
  bf16.model.dtype = 'bfloat16'
  with pytest.raises(ValueError) as refused:
    char_lm.TASK.evaluate(bf16, workdir)
  assert str(refused.value) == (
    f'this evaluation scores in another config.model than the run in {workdir} trained and '
    "was scored with, which changes its numbers (model.dtype: the run's 'float32', given "
    "'bfloat16'), and would replace the run's own result (eval_results.json) with that score: "
    "give --output_dir=<a new directory> to score it there, or the run's config.model.dtype "
    f'({workdir}/config.json records it)'
  )
  assert (workdir / 'eval_results.json').read_bytes() == scored_in_place
  in_bf16 = char_lm.TASK.evaluate(bf16, workdir, output_dir=tmp_path / 'bf16')
  assert in_bf16['model'] == {'dtype': 'bfloat16'} and in_bf16['bpc'] != result['bpc']
  # Evaluating with another model or vocabulary than the checkpoint's is an error naming the
  # fix, and the checkpoints stay where they are.
  other_model = _config(text_file, steps=8)
  other_model.model.num_layers = 3
  with pytest.raises(
    ValueError, match=r'\(model.num_layers: trained 2, given 3\): give the config'
  ):
    char_lm.TASK.evaluate(other_model, workdir)
  other_vocab = _config(text_file, steps=8)
  other_vocab.data.vocab = 'original'
  with pytest.raises(
    ValueError, match=r"vocab\.json was written for other data .*; give the run's"
  ):
    char_lm.TASK.evaluate(other_vocab, workdir, output_dir=tmp_path / 'vocab')
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['4', '8']


def test_evaluate_without_checkpoint_says_so(text_file, tmp_path):
  with pytest.raises(FileNotFoundError, match='no checkpoint'):
    char_lm.TASK.evaluate(_config(text_file, steps=8), tmp_path / 'empty')


def test_launchers_print_bpc_last(commands, text_file, tmp_path):
  """train.py then eval.py, as a user runs them: each prints `bpc=<float>` as its last line;
  eval.py --output_dir puts eval_results.json there instead of the workdir."""
  overrides = [
    f'--config.data.path={text_file}',
    '--config.model.num_layers=1',
    '--config.model.d_model=16',
    '--config.model.num_heads=2',
    '--config.model.head_dim=8',
    '--config.model.d_ff=32',
    '--config.train.steps=2',
    '--config.train.batch_size=2',
    '--config.eval.batch_size=2',
  ]
  workdir, output_dir = tmp_path / 'run', tmp_path / 'scored'
  for script, extra in (('train.py', []), ('eval.py', [f'--output_dir={output_dir}'])):
    command = [script, '--config=configs/char_tiny.py', f'--workdir={workdir}']
    done = commands.run(command + overrides + extra, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.fullmatch(r'bpc=\d+\.\d+', done.stdout.strip().splitlines()[-1]), done.stdout
  trained = json.loads((workdir / 'eval_results.json').read_text())
  scored = json.loads((output_dir / 'eval_results.json').read_text())
  assert scored['bpc'] == trained['bpc'] and scored['step'] == 2


def test_train_and_resume_without_memory(text_file, tmp_path, capsys):
  config = _config(text_file, steps=4)
  config.train.mem_len = 0
  config.train.checkpoint_every = 2
  config.optim.warmup_steps = 4  # as long as the run: warned as it starts, not on resuming
  workdir = tmp_path / 'run'
  char_lm.TASK.train_and_evaluate(config, workdir)
  warned = 'warning: config.optim.warmup_steps=4 with config.train.steps=4: the learning rate'
  assert capsys.readouterr().err.count(warned) == 1
  shutil.rmtree(workdir / 'checkpoints' / '4')
  result = char_lm.TASK.train_and_evaluate(config, workdir)
  assert _logged_steps(workdir) == [2, 4, 4] and math.isfinite(result['bpc'])
  assert warned not in capsys.readouterr().err


def test_non_finite_loss_stops_with_the_step(text_file, tmp_path):
  config = _config(text_file, steps=4)
  config.optim.update(learning_rate=1e30, final_lr=1e30, warmup_steps=0)  # diverges at once
  with pytest.raises(FloatingPointError, match=r'loss is (nan|inf) at step 2'):
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run')


@pytest.mark.slow
def test_bfloat16_trains_and_evaluates(text_file, tmp_path):
  config = _config(text_file, steps=4)
  config.model.dtype = 'bfloat16'
  config.train.checkpoint_every = 2
  result = char_lm.TASK.train_and_evaluate(config, tmp_path / 'run')
  losses = _train_losses(tmp_path / 'run')
  assert all(map(math.isfinite, losses.values())) and losses[4] < losses[2] + 0.5
  assert math.isfinite(result['bpc']) and 0 < result['bpc'] < 8


def test_missing_and_empty_text_for_the_char_lm(tmp_path):
  config = _config(tmp_path / 'missing.txt', steps=2)
  with pytest.raises(FileNotFoundError, match='missing.txt'):
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run1')
  (tmp_path / 'empty.txt').write_text('')
  config.data.path = str(tmp_path / 'empty.txt')
  with pytest.raises(ValueError, match='empty.txt'):
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run2')


@pytest.mark.parametrize('kind', ['text', 'enwik8'])
def test_an_empty_data_path_is_named_as_empty(tmp_path, kind):
  """`--config.data.path=$DATA` with DATA unset was read as '.': 'config.data.path=. is a
  directory', and with kind='enwik8' the remedy fetched enwik8 into the current directory.
  Refused with the config's checks, so show_config refuses it too."""
  config = _config(tmp_path / 'unused.txt', steps=2)
  config.data.update(path='', kind=kind)
  message = 'config.data.path is empty: set it to the file to read (a text file with config.data'
  with pytest.raises(ValueError, match=re.escape(message)):
    char_lm.TASK.check_config(config)
  with pytest.raises(ValueError, match=re.escape(message)):
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run')
  assert not (tmp_path / 'run').exists()


def test_a_run_reads_its_recorded_vocabulary(tmp_path):
  """Resume and evaluation encode with the vocabulary the run recorded, not one made again
  from the data given: a run recorded when 'original' counted the training split alone reads
  its own, and other data whose bytes are in it is encoded with the run's ids (it was refused
  as 'written for other data' whenever its symbols were fewer)."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text('{}')  # a run has trained here (`has_run`)
  data = tmp_path / 'text.txt'
  data.write_bytes(b'abc\n' * 50)
  config = _config(data, steps=4)
  config.data.vocab = 'original'
  train_only = char_lm.CharVocab.from_data(b'abc\n' * 45, drop_newlines=True)  # the old rule
  (workdir / 'vocab.json').write_text(train_only.to_json())
  for training in (False, True):
    splits, vocab = char_lm._vocab_for_run(config, workdir, training=training)
    assert vocab == train_only
  other = tmp_path / 'other.txt'
  other.write_bytes(b'ca\n' * 50)  # no 'b': its own vocabulary would have 2 symbols
  config.data.path = str(other)
  splits, vocab = char_lm._vocab_for_run(config, workdir, training=False)
  assert vocab.size == 3
  np.testing.assert_array_equal(splits['train'][:4], [2, 0, 2, 0])  # 'caca': the run's ids


def test_an_evaluation_encodes_only_the_split_it_scores(tmp_path):
  """eval.py encoded every split with the run's vocabulary, so a byte outside it in the
  training text refused scoring the test split, which holds none. Now only the scored split
  is encoded; a byte outside the vocabulary there is still the one-line refusal naming the
  split, the file and the byte."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text('{}')  # a run has trained here (`has_run`)
  vocab = char_lm.CharVocab.from_data(b'abc', drop_newlines=True)
  (workdir / 'vocab.json').write_text(vocab.to_json())
  data = tmp_path / 'text.txt'
  data.write_bytes(b'abz\n' * 45 + b'abc\n' * 10)  # 'z' in the train split (its first 90%) only
  config = _config(data, steps=4)
  config.data.vocab = 'original'
  splits, _ = char_lm._vocab_for_run(config, workdir, training=False, encode=('test',))
  assert list(splits) == ['test']
  refusal = rf"^train split of {data}: byte 122 \(b'z'\) at position 2 is not in the 3-symbol"
  with pytest.raises(ValueError, match=refusal):
    char_lm._vocab_for_run(config, workdir, training=False)
  # eval.py's scoring of the test split gets past the vocabulary, to the missing checkpoint.
  config.eval.split = 'test'
  with pytest.raises(FileNotFoundError, match='checkpoint'):
    char_lm.TASK.score(config, workdir)
  config.eval.split = 'train'
  with pytest.raises(ValueError, match=refusal):
    char_lm.TASK.score(config, workdir)


def test_a_start_that_failed_before_training_binds_no_later_run(text_file, tmp_path):
  """A first start that stops on its data (a split too short) leaves neither the vocabulary of
  that data nor config.json (nor the workdir it made, which then held nothing: before, the
  vocabulary stayed); the rerun on other data, in the same workdir and without
  --allow_config_change, trains with its own vocabulary. Once a run has trained, its
  vocabulary is the one it reads: data with a byte outside it is refused, naming
  config.data.vocab and 'bytes'."""
  (tmp_path / 'short.txt').write_text('xyz ' * 30)  # 3 symbols and a space: too short
  config = _config(tmp_path / 'short.txt', steps=4)
  config.data.vocab = 'original'
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=r'the valid split of \S*short\.txt'):
    char_lm.TASK.train_model(config, workdir)
  assert not workdir.exists()
  config.data.path = str(text_file)
  char_lm.TASK.train_model(config, workdir)
  symbols = json.loads((workdir / 'vocab.json').read_text())['symbols']
  assert symbols == sorted(set(text_file.read_bytes()) - {ord('\n')})
  assert json.loads((workdir / 'config.json').read_text())['data']['path'] == str(text_file)
  config.data.path = str(tmp_path / 'short.txt')
  with pytest.raises(ValueError, match='holds a run with another config'):
    char_lm.TASK.train_model(config, workdir)
  with pytest.raises(
    ValueError,
    match=r"train split of \S*short\.txt: byte 120 \(b'x'\) at position 0 is not in the "
    r'\d+-symbol vocabulary \(recorded in \S*vocab\.json\), made by config\.data\.vocab='
    r"'original' .* or train a new run with config\.data\.vocab='bytes'",
  ):
    char_lm.TASK.train_model(config, workdir, allow_config_change=True)


@pytest.mark.parametrize(
  ('fields', 'message'),
  [
    (
      {'eval.step': 3},
      'config.eval.step=3: the run will keep checkpoints [2, 4, 6] (config.train.checkpoint_every'
      '=2, keep_checkpoints=3, steps=6); give one of them, or 0 for the newest',
    ),
    (
      {'eval.average_checkpoints': 4},
      'config.eval.average_checkpoints=4: the run will keep 3 checkpoint(s) up to step 6 ([2, 4, '
      '6]; config.train.checkpoint_every=2, keep_checkpoints=3, steps=6); set it to 3 or less',
    ),
    (
      {'eval.step': 4, 'eval.average_checkpoints': 3},
      'config.eval.average_checkpoints=3: the run will keep 2 checkpoint(s) up to step 4',
    ),
  ],
)
def test_an_evaluation_the_checkpoints_cannot_serve_is_refused_before_training(
  text_file, tmp_path, fields, message
):
  config = _config(text_file, steps=6)
  config.train.checkpoint_every = 2
  for path, value in fields.items():
    section, name = path.split('.')
    config[section][name] = value
  with pytest.raises(ValueError) as error:
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run')
  assert str(error.value).startswith(message)
  assert not (tmp_path / 'run' / 'checkpoints').exists()  # refused before training


def test_a_run_shortened_below_its_step_is_refused_and_left_as_it_was(text_file, trained, tmp_path):
  """config.train.steps lowered below the step a run reached, with --allow_config_change: one
  line naming the steps and how to score an earlier checkpoint; no checkpoint is written
  (the last save would have stored step 8's state as checkpoint 2, beside the real ones)."""
  workdir = _copy_of_run(trained, tmp_path / 'run')
  saved = sorted(p.name for p in (workdir / 'checkpoints').iterdir())
  config = _config(text_file, steps=2)
  with pytest.raises(ValueError) as error:
    char_lm.TASK.train_model(config, workdir, allow_config_change=True)
  assert str(error.value).startswith('config.train.steps=2: the run in ')
  assert 'already at step 8' in str(error.value) and '--config.eval.step=N' in str(error.value)
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == saved
  assert json.loads((workdir / 'config.json').read_text())['train']['steps'] == 8


def test_a_resume_with_another_memory_shape_is_refused_up_front(text_file, trained, tmp_path):
  """The checkpoints carry the XL memory [layers, batch_size, mem_len, d_model]: a resume with
  another config.train.batch_size or mem_len, even with --allow_config_change, is one line
  naming the field, the shape saved and what fits (it read each intact checkpoint as
  unreadable, then said none was readable); the same rows in parts
  (config.train.grad_accum_steps) resume."""
  config = _config(text_file, steps=8)
  workdir = _copy_of_run(trained, tmp_path / 'run')
  recorded = (workdir / 'config.json').read_text()
  for field, value in (('batch_size', 2), ('mem_len', 8), ('mem_len', 0)):
    changed = _config(text_file, steps=12)
    changed.train[field] = value
    with pytest.raises(ValueError) as error:
      char_lm.TASK.train_model(changed, workdir, allow_config_change=True)
    line = str(error.value)
    assert line.startswith(
      f'config.train.{field}={value} (the run has {config.train[field]}): the checkpoints in '
      f'{workdir}/checkpoints were saved with the Transformer-XL memory of 4 rows of 16 '
      'positions'
    ), line
    assert 'not even with --allow_config_change' in line and '\n' not in line
    assert ('--config.train.grad_accum_steps=N' in line) == (field == 'batch_size'), line
  assert (workdir / 'config.json').read_text() == recorded
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['4', '8']
  in_parts = _config(text_file, steps=10)
  in_parts.train.grad_accum_steps = 2
  char_lm.TASK.train_model(in_parts, workdir, allow_config_change=True)
  assert max(_logged_steps(workdir)) == 10


def test_a_resume_as_another_model_is_refused_up_front(text_file, trained, tmp_path):
  """A config.model with other parameters (another position scheme, width or k) cannot
  continue the run's checkpoints: one line naming the change and the first parameter that
  differs, without offering --allow_config_change (it was offered, and then every intact
  checkpoint was read as unreadable); the workdir is left as it was. A model field that keeps
  the parameters (rope_base, pre_layer_norm) is a config change --allow_config_change
  continues, and scanned layers restore the loop's checkpoints."""
  workdir = _copy_of_run(trained, tmp_path / 'run')
  recorded = (workdir / 'config.json').read_text()
  for field, value, differs in (
    ('position', 'shaw', "config.model.position: 'xl' -> 'shaw': another model than the "),
    ('d_ff', 128, 'config.model.d_ff: 64 -> 128: another model than the '),
  ):
    changed = _config(text_file, steps=12)
    changed.model[field] = value
    for allow in (False, True):
      with pytest.raises(ValueError) as error:
        char_lm.TASK.train_model(changed, workdir, allow_config_change=allow)
      line = str(error.value)
      assert line.startswith(differs + f'checkpoints in {workdir}/checkpoints hold ('), line
      assert 'not even --allow_config_change continues' in line and '\n' not in line
  assert '(layers.0.ff.inner.bias is [128] in it, [64] in them)' in line, line
  assert (workdir / 'config.json').read_text() == recorded
  same_parameters = _config(text_file, steps=10)
  same_parameters.model.update(pre_layer_norm=True, scan_layers=True)
  with pytest.raises(ValueError, match='pass --allow_config_change to continue'):
    char_lm.TASK.train_model(same_parameters, workdir)
  loop.check_same_parameters(char_lm.TASK, same_parameters, workdir)  # what the flag allows


@pytest.mark.slow
def test_without_memory_another_batch_size_resumes(text_file, tmp_path):
  """Rows without memory carry nothing from step to step: another batch_size resumes, and a
  memory added later is refused as a shape the checkpoints lack."""
  config = _config(text_file, steps=4)
  config.train.mem_len = 0
  char_lm.TASK.train_model(config, tmp_path / 'nomem')
  config.train.update(steps=6, batch_size=2)
  char_lm.TASK.train_model(config, tmp_path / 'nomem', allow_config_change=True)
  assert max(_logged_steps(tmp_path / 'nomem')) == 6
  config.train.mem_len = 16
  with pytest.raises(
    ValueError,
    match=r'^config.train.mem_len=16 \(the run has 0\): .* were '
    r'saved with no Transformer-XL memory \(config.train.mem_len=0\)',
  ):
    char_lm.TASK.train_model(config, tmp_path / 'nomem', allow_config_change=True)


@pytest.mark.parametrize(
  'fields,message',
  [
    (  # C6: the training split is shorter than one segment
      {'train.tgt_len': 64},
      r'the train split of \S*short\.txt \(config\.data\.path\): 4 rows '
      r'\(config\.train\.batch_size=4\) of 45 tokens hold no full segment of '
      r'config\.train\.tgt_len=64 targets; use a smaller config\.train\.batch_size or '
      r'config\.train\.tgt_len',
    ),
    (  # C8: the valid split is too short for the eval batch, found once training was over
      {'eval.batch_size': 8},
      r'the valid split of \S*short\.txt \(config\.data\.path\): 10 tokens give rows of 1 for '
      r'config\.eval\.batch_size=8; .* use config\.eval\.batch_size <= 5 or more data',
    ),
    (  # a valid split of 1 byte: no batch size gives it a row of 2 tokens
      {'eval.batch_size': 1, 'data.path': 'tiny.txt', 'train.batch_size': 1, 'train.tgt_len': 4},
      r'the valid split of \S*tiny\.txt \(config\.data\.path\): 1 tokens give rows of 1 for '
      r'config\.eval\.batch_size=1; each row needs at least 2 tokens \(an input and its '
      r'target\): give more data$',
    ),
    (  # a test split of newlines only, which vocab='original' drops
      {'data.path': 'newline_tail.txt', 'data.vocab': 'original'},
      r'^the test split of \S*newline_tail\.txt \(config\.data\.path\) is 11 newline bytes, '
      r"which config\.data\.vocab='original' drops .*use config\.data\.vocab='bytes'",
    ),
    (  # the test split: 16 bytes, 14 of them newlines that vocab='original' drops
      {'eval.batch_size': 8, 'data.path': 'short_test.txt', 'data.vocab': 'original'},
      r'the test split of \S*short_test\.txt \(config\.data\.path\): 2 tokens give rows of 0 '
      r'for config\.eval\.batch_size=8',
    ),
  ],
)
def test_splits_too_short_are_refused_before_training(tmp_path, monkeypatch, fields, message):
  (tmp_path / 'short.txt').write_text('the cat sat on a mat. ' * 9 + 'xy')  # 200 bytes: 180/10/10
  (tmp_path / 'tiny.txt').write_text('the cat sat on a mat. ab')  # 24 bytes: 22/1/1
  (tmp_path / 'newline_tail.txt').write_text('the cat sat on a mat. ' * 9 + '\n' * 20)  # 196/11/11
  (tmp_path / 'short_test.txt').write_text(('the cat sat on a mat. ' * 14)[:304] + 'at' + '\n' * 14)
  config = _config(tmp_path / 'short.txt', steps=2)
  for name, value in fields.items():
    section, field = name.split('.')
    config[section][field] = str(tmp_path / value) if field == 'path' else value
  monkeypatch.setattr(char_lm, 'build', lambda *args: pytest.fail('the model was built'))
  with pytest.raises(ValueError, match=message):
    char_lm.TASK.train_and_evaluate(config, tmp_path / 'run')


def test_the_result_line_counts_bytes_not_characters():
  """Both vocabularies are over bytes, so the scored count printed after evaluation says
  bytes (a UTF-8 file of accented or CJK text has fewer characters than that)."""
  result = {'split': 'test', 'tokens': 110948, 'checkpoint': 'W/checkpoints/20', 'bpc': 6.25}
  first = char_lm.TASK.result_lines(result)[0]
  assert first.startswith('test split, 110948 bytes scored,')
  assert 'character' not in first


def test_an_averaged_evaluation_names_its_steps_as_translation_does():
  """config.eval.average_checkpoints > 1: the char LM's line named one checkpoint, not the
  steps it averaged (translation's did; eval_results.json records them for both)."""
  from relpos.training import translation_task

  result = {'split': 'test', 'tokens': 80, 'bpc': 2.0, 'checkpoint': 'w/checkpoints/8'}
  averaged = result | {'averaged_steps': [4, 6, 8]}
  assert char_lm.TASK.result_lines(averaged)[0] == (
    'test split, 80 bytes scored, checkpoint w/checkpoints/8 (averaged steps [4, 6, 8])'
  )
  assert char_lm.TASK.result_lines(result | {'averaged_steps': [8]})[0] == (
    'test split, 80 bytes scored, checkpoint w/checkpoints/8'
  )
  translated = averaged | {'sentences': 3, 'signature': 's', 'bleu': 1.0, 'translations': 't'}
  assert translation_task.TASK.result_lines(translated)[0] == (
    '3 sentences, checkpoint w/checkpoints/8 (averaged steps [4, 6, 8]), translations in t'
  )
  # Shaw's tables clipped by config.eval.max_relative_position: another model's figure, said.
  clipped = translated | {'eval': {'max_relative_position': 2}}
  assert translation_task.TASK.result_lines(clipped)[0].startswith(
    '3 sentences, checkpoint w/checkpoints/8 (averaged steps [4, 6, 8]) (Shaw tables clipped '
    'at k=2), translations'
  )
  unclipped = result | {'eval': {'max_relative_position': -1}}
  assert char_lm.TASK.result_lines(unclipped)[0].endswith('checkpoint w/checkpoints/8')


def test_a_trained_original_run_without_its_vocabulary_is_refused(text_file, tmp_path):
  """A vocab='original' run whose vocab.json was removed: eval.py made the vocabulary again from
  the data given (other data shifted the ids: a nonsense bpc, exit 0), a resume trained on the
  remapped embeddings and wrote the new vocab.json, and relpos.tools.sample said `[Errno 2]`.
  All three now refuse in one line naming the file and why it is not rebuilt; a 'bytes' run's
  vocabulary (all 256 byte values) is the same made again."""
  from relpos.config.recorded import record_config
  from relpos.tools import sample

  # The training of test_a_start_that_failed_before_training_binds_no_later_run (4 steps):
  # its compiled step is loaded from the run's compilation cache, not compiled again.
  config = _config(text_file, steps=4)
  config.data.vocab = 'original'
  config.train.eval_every = 0
  workdir = tmp_path / 'run'
  char_lm.TASK.train_model(config, workdir)
  (workdir / 'vocab.json').unlink()
  expected = (
    f'{workdir}/vocab.json is missing: the run in {workdir} trained with the '
    "config.data.vocab='original' vocabulary it held, and one made again from the data could "
    "shift the model's ids, so it is not rebuilt: copy vocab.json back from a backup or from "
    'where the run came from'
  )
  with pytest.raises(FileNotFoundError) as caught:
    char_lm.TASK.evaluate(config, workdir)
  assert str(caught.value) == expected
  config.train.steps = 8
  with pytest.raises(FileNotFoundError, match='vocab.json is missing'):
    char_lm.TASK.train_model(config, workdir, allow_config_change=True)
  assert not (workdir / 'vocab.json').exists()
  with pytest.raises(FileNotFoundError, match='vocab.json is missing'):
    sample.sample(workdir, length=4, prompt=None, temperature=1.0, top_k=0, top_p=1.0, seed=0)
  bytes_run = tmp_path / 'bytes_run'  # a run recorded with vocab='bytes', no vocab.json
  bytes_run.mkdir()
  record_config(_config(text_file, steps=2), bytes_run, allow_change=False)
  assert char_lm.read_vocabulary(bytes_run, 'bytes').size == 256


def test_a_moved_run_keeps_its_result_and_is_not_trained_again_without_checkpoints(
  text_file, trained, tmp_path, capsys
):
  """recheck15-1/2: a finished run moved to another parent (runs/c1 -> archive/c1) read its own
  result as another workdir's: a rerun scored it again, and once its checkpoints were deleted
  train.py trained it again from step 0 in silence (eval.py said 'train first'). The result
  records where it was written (`run_results.WRITTEN_TO`), so a moved run's is its own."""
  config = _config(text_file, steps=8)
  before = _copy_of_run(trained, tmp_path / 'runs' / 'c1')  # as trained and scored there
  moved = tmp_path / 'archive' / 'c1'
  moved.parent.mkdir()
  shutil.move(before, moved)
  capsys.readouterr()
  char_lm.TASK.train_and_evaluate(config, moved)
  assert f'the run in {moved} is finished (step 8, this config) and scored' in (
    capsys.readouterr().out
  )
  shutil.rmtree(moved / 'checkpoints')
  metrics = (moved / 'metrics.jsonl').read_bytes()
  with pytest.raises(FileNotFoundError, match=r'was trained to step 8 \(.*\), but its checkpoints'):
    char_lm.TASK.train_and_evaluate(config, moved)
  assert (moved / 'metrics.jsonl').read_bytes() == metrics


def test_an_evaluation_that_ends_after_a_newer_result_keeps_it(
  text_file, trained, tmp_path, monkeypatch, capsys
):
  """fuzz15b-1: eval.py scoring a run that trains ended after train.py's final evaluation and
  replaced the run's result of its last step with the older checkpoint's score it had
  restored, exit 0. A newer result of the run, whose checkpoint is there, is kept now, with a
  warning (`run_results.newer_result`); where that checkpoint is gone, the write goes on."""
  config = _config(text_file, steps=8)
  workdir = _copy_of_run(trained, tmp_path / 'run')  # trained to 8 and scored, checkpoint 4 kept
  results = workdir / 'eval_results.json'
  kept = results.read_bytes()
  score = char_lm.TASK.score
  # What a slow evaluation started at step 4 returns once the run has finished and scored.
  monkeypatch.setattr(char_lm.TASK, 'score', lambda *args: {**score(*args), 'step': 4})
  capsys.readouterr()
  char_lm.TASK.evaluate(config, workdir)
  assert results.read_bytes() == kept
  assert capsys.readouterr().err == (
    f'warning: {workdir}/eval_results.json holds the score of step 8, written while this '
    'evaluation of step 4 ran (the run trained on and scored a newer checkpoint): kept, and '
    'this score of step 4 is printed only, not written\n'
  )
  shutil.rmtree(workdir / 'checkpoints' / '8')  # removed as damaged, say: step 4 is the newest
  char_lm.TASK.evaluate(config, workdir)
  assert json.loads(results.read_text())['step'] == 4


def test_the_memory_starts_empty_where_an_epoch_starts(tmp_path):
  """The rows start over at each epoch, so the step that begins one must drop the memory the
  last segment left (states of the end of the rows): given any memory, it scores as from an
  empty one, while a step inside the epoch reads the memory it is given."""
  import jax
  import jax.numpy as jnp

  from relpos.training.mesh import data_mesh

  text = tmp_path / 'short.txt'
  text.write_text('the cat sat on a mat. ' * 20)  # 396 training bytes: 4 rows, 6 segments
  config = _config(text, steps=8)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  run = char_lm.TASK.training(config, workdir, data_mesh())
  starts = [s for s in range(1, 8) if run.batch(s)[2]]
  assert starts == [6]
  noise = np.random.default_rng(0).normal(0.0, 100.0, run.state['memory']['hidden'].shape)

  def loss(step, memory):
    """The loss of step `step` from the fresh state with a full memory of noise or an empty one
    (a copy of the state: the step donates it)."""
    state = jax.tree.map(jnp.copy, run.state)
    if memory == 'noise':
      hidden, length = state['memory']['hidden'], state['memory']['length']
      state['memory'] = {
        'hidden': hidden + jnp.asarray(noise, hidden.dtype),
        'length': jnp.full_like(length, config.train.mem_len),
      }
    return float(run.step(state, run.batch(step))[1]['loss'])

  inside = loss(5, 'noise'), loss(5, 'empty')
  assert abs(inside[0] - inside[1]) > 1e-4 * inside[1]  # the memory matters inside an epoch
  assert loss(6, 'noise') == pytest.approx(loss(6, 'empty'), rel=1e-6)


def test_bits_per_char_runs_the_spans_memory_clamp_and_window(text_file):
  """bits_per_char reads `span`'s mem_len, clamp_len and same_length: a memory of 4 with the
  same-length window and XL distances clamped at 2 scores as the model run segment by segment
  with them, and each of the three changes the score here (the parameters get noise: at the
  init the position terms barely move it)."""
  import jax
  import jax.numpy as jnp

  from relpos.data.ordered import OrderedBatches
  from relpos.models.transformer_xl import nats_per_token

  config = _config(text_file, steps=1)
  config.eval.update(mem_len=4, clamp_len=2, same_length=True)
  model = char_lm.TASK.build_model(config, vocab_size=256)
  rng = np.random.default_rng(0)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape, 'f4'), params))
  tokens = np.frombuffer(text_file.read_bytes()[:26], np.uint8)
  batches = OrderedBatches(tokens, batch_size=2, tgt_len=4)  # rows of 13: 12 targets, 4 + 4 + 4
  rows = jnp.asarray(batches.rows_BN, jnp.int32)

  def bpc(mem_len, **settings):
    memory, nats = model.init_memory(2, mem_len), []
    for start in (0, 4, 8):
      logits, memory = _apply(
        model, rows[:, start : start + 4], memory, deterministic=True, **settings
      )
      nats.append(np.asarray(nats_per_token(logits, rows[:, start + 1 : start + 5])))
    return np.concatenate(nats, axis=1).astype(np.float64).mean() / math.log(2)

  expected = bpc(4, clamp_len=2, same_length=True)
  assert char_lm.bits_per_char(model, batches, config.eval)['bpc'] == pytest.approx(
    expected, rel=1e-5
  )
  for mem_len, clamp_len, same_length in ((4, 2, False), (4, 0, True), (8, 2, True)):
    other = bpc(mem_len, clamp_len=clamp_len, same_length=same_length)
    assert abs(other - expected) > 1e-3, (mem_len, clamp_len, same_length)


def test_bits_per_char_pools_segments_and_positions(text_file):
  """bits_per_char's totals, per-segment items (the bootstrap's) and per-position bpc (the
  breakdown's) against one pass over whole rows: with a memory at least as long as the rows,
  segment-wise evaluation sees the same context. The last segment is short, so the later
  positions count fewer characters."""
  import jax.numpy as jnp

  from relpos.data.ordered import OrderedBatches
  from relpos.models.transformer_xl import nats_per_token

  config = _config(text_file, steps=1)
  model = char_lm.TASK.build_model(config, vocab_size=256)
  tokens = np.frombuffer(text_file.read_bytes()[:22], np.uint8)
  batches = OrderedBatches(tokens, batch_size=2, tgt_len=4)  # rows of 11: 10 targets, 4 + 4 + 2
  result = char_lm.bits_per_char(model, batches, config.eval)  # eval.mem_len 32 >= 10

  def nats(start, end):
    """float64 [2, end - start]: the nats of targets start..end-1 from inputs start..end-1
    alone (no memory)."""
    rows = jnp.asarray(batches.rows_BN, jnp.int32)
    logits, _ = _apply(
      model,
      rows[:, start:end],
      model.init_memory(2, 0),
      deterministic=True,
      clamp_len=config.eval.clamp_len,
      same_length=config.eval.same_length,
    )
    return np.asarray(nats_per_token(logits, rows[:, start + 1 : end + 1]), np.float64)

  whole = nats(0, 10)
  alone = np.concatenate([nats(0, 4), nats(4, 8), nats(8, 10)], axis=1)  # no memory carried
  assert result['tokens'] == 20 and result['segment_tokens'] == [8, 8, 4]
  assert result['position_tokens'] == [6, 6, 4, 4]
  bpc = {name: n.mean() / math.log(2) for name, n in (('whole', whole), ('alone', alone))}
  assert result['bpc'] == pytest.approx(bpc['whole'], rel=1e-5)
  # The memory reached the later segments: far closer to one pass than to segments alone.
  assert abs(result['bpc'] - bpc['whole']) < 0.1 * abs(bpc['alone'] - bpc['whole'])
  np.testing.assert_allclose(
    result['segment_nats'], [whole[:, s : s + 4].sum() for s in (0, 4, 8)], rtol=1e-5
  )
  expected = [whole[:, p::4].mean() / math.log(2) for p in range(4)]
  np.testing.assert_allclose(result['position_bpc'], expected, rtol=1e-5)


def test_bits_per_char_compiles_once_per_segment_shape_for_a_placed_model(text_file):
  """The parameters of a trained or restored model are placed on the devices (committed); the
  first segment's memory, made by init_memory, is placed as they are, so it takes the program
  the later segments take: one compile per segment shape (here 4, 4, 2: two), where the first
  segment compiled one of its own."""
  import jax

  from relpos.data.ordered import OrderedBatches

  config = _config(text_file, steps=1)
  graphdef, state = nnx.split(char_lm.TASK.build_model(config, vocab_size=256))
  model = nnx.merge(graphdef, jax.device_put(state, jax.devices()[0]))
  tokens = np.frombuffer(text_file.read_bytes()[:22], np.uint8)
  char_lm.score_segment.clear_cache()
  char_lm.bits_per_char(model, OrderedBatches(tokens, batch_size=2, tgt_len=4), config.eval)
  assert char_lm.score_segment._cache_size() == 2
