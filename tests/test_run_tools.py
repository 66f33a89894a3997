"""The tools that read a finished run: relpos.tools.translate and relpos.tools.sample
(relpos.studies.plot has its
own module), on tiny runs trained here, and their one-line errors."""

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from helpers import (
  REPO,
  load_config,
  refusal,
  tiny_char_config,
  tiny_translate_config,
  write_pair_corpus,
)
from test_transformer_xl import _apply  # the model's forward pass, jitted

from relpos.config.recorded import record_config
from relpos.data.char_corpus import CharVocab
from relpos.models.transformer_xl import TransformerXL
from relpos.studies import shaw_tables
from relpos.tools import sample, translate
from relpos.training import char_lm_task as char_lm
from relpos.training import data_record, restore
from relpos.training import translation_task as translate_task
from relpos.training.checkpoints import Checkpoints
from relpos.training.task_base import runnable_here


@pytest.fixture(scope='module')
def translation_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('translation')
  config = tiny_translate_config(write_pair_corpus(root / 'corpus'), steps=2)
  config.train.update(eval_every=0, checkpoint_every=0)
  config.eval.beam_size = 1
  workdir = root / 'run'
  result = translate_task.TASK.train_and_evaluate(config, workdir)
  return workdir, config, result


@pytest.fixture(scope='module')
def char_run(tmp_path_factory):
  root = tmp_path_factory.mktemp('char')
  text = root / 'text.txt'
  text.write_text('the cat sat on the mat. ' * 200)
  config = tiny_char_config(text, steps=2)
  workdir = root / 'run'
  char_lm.TASK.train_and_evaluate(config, workdir)
  return workdir, config


@pytest.mark.slow  # trains two tiny runs (about 40 s of compiling), end to end
def test_translate_gives_what_evaluation_wrote(translation_run):
  workdir, config, result = translation_run
  sources = Path(config.data.eval_src).read_text().splitlines()
  written = Path(result['translations']).read_text().splitlines()
  assert translate.translate_lines(workdir, sources[:3], beam_size=1) == written[:3]


@pytest.mark.slow  # trains two tiny runs (about 40 s of compiling), end to end
def test_sample_continues_with_the_model_greedily_and_reproducibly(char_run):
  workdir, config = char_run
  prompt = b'the cat'
  text = sample.sample(workdir, prompt, 12, seed=3)
  assert len(text) == 12 and sample.sample(workdir, prompt, 12, seed=3) == text
  # top_k=1 is greedy: the first character is the argmax of the model on the prompt itself
  # (unpadded), so the padding of the sampler's segment is invisible.
  vocab = CharVocab.from_json((workdir / 'vocab.json').read_text())
  model = TransformerXL(char_lm.model_config(config, vocab.size), rngs=nnx.Rngs(0))
  model, _, _ = restore.restore_model(model, config.eval, workdir)
  logits, _ = model(
    jnp.asarray([vocab.encode(prompt)]), model.init_memory(1, 8), deterministic=True
  )
  greedy = sample.sample(workdir, prompt, 1, top_k=1)
  assert greedy == vocab.decode([int(jnp.argmax(logits[0, -1]))])


def test_filtered_logits_keep_the_top_k_and_the_nucleus():
  logits = jnp.log(jnp.asarray([0.1, 0.4, 0.05, 0.3, 0.15]))
  kept = lambda **kw: np.isfinite(np.asarray(sample.filtered_logits(logits, **kw)))  # noqa: E731
  assert kept(temperature=1.0, top_k=2, top_p=1.0).tolist() == [False, True, False, True, False]
  # 0.4 + 0.3 = 0.7 < 0.75: the third most likely (0.15) is needed to reach it.
  assert kept(temperature=1.0, top_k=0, top_p=0.75).tolist() == [False, True, False, True, True]
  assert kept(temperature=1.0, top_k=0, top_p=0.01).tolist() == [False, True, False, False, False]
  scaled = sample.filtered_logits(logits, temperature=0.5, top_k=0, top_p=1.0)
  np.testing.assert_allclose(scaled, logits / 0.5, rtol=1e-6)
  assert jax.device_get(scaled).shape == (5,)


def test_a_prompt_is_checked_against_the_runs_vocabulary():
  original = CharVocab(tuple(b'abc '))  # as enwik8's 'original' vocabulary: no line break
  assert sample.prompt_tokens(original, None) == [0]  # its first symbol, not a line break
  assert sample.prompt_tokens(CharVocab.bytes(), None) == [ord('\n')]
  assert sample.prompt_tokens(original, b'ca b') == [2, 0, 3, 1]
  with pytest.raises(
    ValueError, match=r"--prompt: byte 122 \(b'z'\) at position 1 is not.*; give a"
  ):
    sample.prompt_tokens(original, b'az')


@pytest.mark.parametrize('same_length', [False, True])
def test_sample_draws_from_the_last_characters_logits_with_full_segments_in_the_memory(
  tmp_path, same_length
):
  """Greedy (top_k=1) sampling reads the text as evaluation does: full segments of
  config.eval.tgt_len move into the memory, and each character comes from the logits of the
  last one written (its segment padded after it), with config.eval.same_length's window (the
  tool passed clamp_len but not same_length, so it drew from another distribution than
  evaluation scores). A prompt of 11 characters with segments of 4: 8 in the memory, 3
  written; the third character sampled starts a new segment. The parameters get noise: at
  the init the logits barely differ."""
  config = tiny_char_config(tmp_path / 'text.txt', steps=1)
  config.eval.update(tgt_len=4, mem_len=8, same_length=same_length)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  record_config(config, workdir, allow_change=False)
  model = TransformerXL(char_lm.model_config(config, 256), rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda p: p + 0.3 * rng.standard_normal(p.shape, 'f4'), params))
  checkpoints = Checkpoints(workdir, writer=True)
  checkpoints.save(1, {'model': nnx.to_pure_dict(nnx.state(model))}, {'step': 1})
  checkpoints.commit()
  checkpoints.close()

  span = {'clamp_len': config.eval.clamp_len, 'same_length': same_length, 'deterministic': True}

  def greedy_next(ids):
    start = (len(ids) - 1) // 4 * 4  # the segment being written: 1 to 4 characters
    memory = model.init_memory(1, 8)
    for segment in range(0, start, 4):
      _, memory = _apply(model, jnp.asarray([ids[segment : segment + 4]]), memory, **span)
    written = ids[start:]  # as evaluation's segment of 4 holds it: padded after
    padded = jnp.asarray([written + [0] * (4 - len(written))])
    logits, _ = _apply(model, padded, memory, **span)  # jitted: op by op, some 50 compiles
    return int(jnp.argmax(logits[0, len(written) - 1]))

  ids = list(b'the cat sat')
  for _ in range(3):
    ids.append(greedy_next(ids))
  assert sample.sample(workdir, b'the cat sat', 3, top_k=1) == bytes(ids[-3:])


def test_sample_runs_a_kernel_this_machine_lacks_as_auto_with_a_warning(tmp_path, capsys):
  """fz14a-3: a run trained with 'cudnn' on a GPU (a bf16 XL run), sampled on a CPU, ended in
  JAX's `RuntimeError: cuDNN is not detected.` with a traceback, and the tool has no flag to
  choose another kernel; it runs 'auto' with one warning line instead."""
  config = tiny_char_config(tmp_path / 'text.txt', steps=1)
  config.model.update(dtype='bfloat16', attention_implementation='cudnn', attention_dropout=0.0)
  workdir = tmp_path / 'run'
  workdir.mkdir()
  record_config(config, workdir, allow_change=False)  # its config.json, as the GPU wrote it
  model = TransformerXL(char_lm.model_config(config, 256), rngs=nnx.Rngs(0))
  checkpoints = Checkpoints(workdir, writer=True)
  checkpoints.save(1, {'model': nnx.to_pure_dict(nnx.state(model))}, {'step': 1})
  checkpoints.commit()
  checkpoints.close()
  assert len(sample.sample(workdir, b'the', 3)) == 3
  assert capsys.readouterr().err.splitlines() == [
    "warning: config.model.attention_implementation='cudnn' runs on gpu devices only "
    f"(cuDNN's flash attention, on NVIDIA GPUs), as {workdir}/config.json records it; this "
    "machine's devices are cpu: running 'auto' (the same model: the implementation is a "
    'compute choice)'
  ]


@pytest.mark.parametrize(
  'task, preset, recorded, platform, runs',
  [
    ('char_lm', 'xl', 'cudnn', 'cpu', 'auto'),
    ('char_lm', 'xl', 'cudnn', 'gpu', 'cudnn'),
    ('char_lm', 'xl', 'mosaic', 'cpu', 'mosaic'),  # interpreted there
    ('translate', 'shaw', 'pallas', 'tpu', 'auto'),  # Triton kernels, no TPU lowering
    ('translate', 'shaw', 'pallas', 'cpu', 'pallas'),
    ('translate', 'shaw', 'xla', 'tpu', 'xla'),
  ],
)
def test_the_tools_run_auto_where_the_recorded_kernel_does_not_run(
  tmp_path, capsys, task, preset, recorded, platform, runs
):
  """The one rule both tools apply to the implementation a run's config.json records
  (`task_base.runnable_here`): the devices' rule train.py and eval.py refuse by
  (`implementations.RUNS_ON`)."""
  config = load_config({'char_lm': 'char_tiny', 'translate': 'translate_tiny'}[task], preset)
  config.model.update(dtype='bfloat16', attention_implementation=recorded)
  runnable_here(config, tmp_path, platform)
  assert config.model.attention_implementation == runs
  warned = capsys.readouterr().err
  assert (f"'{recorded}' runs on" in warned and f'are {platform}:' in warned) == (runs == 'auto')


def _tool(commands, module, *args):
  return commands.run(['-m', f'relpos.{module}', *args], input='a red cat\n')


@pytest.mark.slow  # trains two tiny runs (about 40 s of compiling), end to end
def test_command_lines(commands, translation_run, char_run):
  done = _tool(commands, 'translate', f'--workdir={translation_run[0]}', '--beam_size=1')
  assert done.returncode == 0 and len(done.stdout.splitlines()) == 1, done.stderr
  done = _tool(commands, 'sample', f'--workdir={char_run[0]}', '--prompt=the ', '--length=5')
  assert done.returncode == 0 and done.stdout.startswith('the '), done.stderr


def _recorded_runs(root):
  """(translation workdir, char-LM workdir), each holding only the config a run records first
  (no checkpoint): all a tool reads before it refuses a workdir."""
  runs = []
  for name, config in (
    ('translation', tiny_translate_config(write_pair_corpus(root / 'corpus'), steps=2)),
    ('char', tiny_char_config(root / 'text.txt', steps=2)),
  ):
    workdir = root / name
    workdir.mkdir(parents=True)
    record_config(config, workdir, allow_change=False)
    runs.append(workdir)
  return runs


def test_a_vocabulary_changed_since_the_run_trained_is_refused(commands, tmp_path):
  """A swapped spm.model (vocab.json) read the model's ids as other pieces: translations of
  nothing, with nothing said. Refused in one line naming the file and the run's own to restore,
  by every tool that reads a run, before it looks for a checkpoint (`Task.trained_model`):
  shaw_tables and decode_speed, which wrote out their own reading of a run, never checked it
  (decode_speed scored the swapped pieces), and sample looked for a checkpoint first."""

  translation, char = _recorded_runs(tmp_path)
  spm_model, vocab_json = translation / 'spm.model', char / 'vocab.json'
  spm_model.write_bytes(b"the run's pieces")
  vocab_json.write_text(CharVocab.bytes().to_json())
  data_record.record(translation, {data_record.VOCABULARY: spm_model})
  data_record.record(char, {data_record.VOCABULARY: vocab_json})
  spm_model.write_bytes(b"another run's pieces")
  vocab_json.write_text(json.dumps({'symbols': list(range(255, -1, -1))}))
  changed = (
    f'the vocabulary: {spm_model} changed since the run trained on it (16 bytes then, 20 now): '
    "the model's ids are the pieces of the vocabulary it trained with, so the run is not "
    "resumed, read or scored (into any directory) with another: restore the run's spm.model "
    '(from a backup or from where the run came from)'
  )
  for read in (
    lambda: translate.translate_lines(translation, ['a red cat']),
    lambda: shaw_tables.row_drift(translation),
  ):
    with pytest.raises(ValueError) as error:
      read()
    assert str(error.value) == changed
  script = REPO / 'benchmarks' / 'decode_speed.py'
  assert refusal(commands, script, f'--workdir={translation}') == f'error: {changed}'
  with pytest.raises(
    ValueError, match=r"vocab\.json changed since .*restore the run's vocab\.json"
  ):
    sample.sample(char, b'the', 3)


def _unusable(tmp_path, other_run, untrained_run):
  """(workdir, message) of workdirs a tool cannot use: absent, not a run, a run of the other
  task, a run with no checkpoint yet."""
  return [
    (tmp_path / 'absent', 'is not a directory'),
    (tmp_path, 'holds no relpos run'),
    (other_run, 'holds a run of task '),
    (untrained_run, 'no checkpoint'),
  ]


def test_unusable_workdirs_are_named(tmp_path):
  translation, char = _recorded_runs(tmp_path / 'runs')
  (tmp_path / 't').mkdir()
  for workdir, message in _unusable(tmp_path / 't', char, translation):
    with pytest.raises((FileNotFoundError, ValueError), match=message):
      translate.translate_lines(workdir, ['a red cat'])
  (tmp_path / 's').mkdir()
  for workdir, message in _unusable(tmp_path / 's', translation, char):
    with pytest.raises((FileNotFoundError, ValueError), match=message):
      sample.sample(workdir, b'the', 3)
  with pytest.raises(ValueError, match='--temperature=0'):
    sample.sample(char, b'the', 3, temperature=0)
  with pytest.raises(ValueError, match='--prompt is empty'):
    sample.sample(char, b'', 3)


def test_decode_speed_refuses_what_it_cannot_time_in_one_line(commands, tmp_path):
  """benchmarks/decode_speed.py reads a finished translation run as relpos.tools.translate
  does: each unusable workdir, and a negative --sentences (it cut the eval set's end off), is
  one error line."""
  translation, char = _recorded_runs(tmp_path / 'runs')
  (tmp_path / 'd').mkdir()
  script = REPO / 'benchmarks' / 'decode_speed.py'
  for workdir, message in _unusable(tmp_path / 'd', char, translation):
    assert message in refusal(commands, script, f'--workdir={workdir}')
  negative = refusal(commands, script, f'--workdir={translation}', '--sentences=-1')
  assert '--sentences=-1: -1 is not a non-negative integer' in negative


@pytest.mark.parametrize('module', ['translate', 'sample'])
def test_command_line_errors_are_one_line(commands, module, tmp_path):
  done = _tool(commands, module, f'--workdir={tmp_path / "absent"}')
  last = done.stderr.strip().splitlines()[-1]
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
  assert last.startswith('error: --workdir=') and 'is not a directory' in last, last
  assert not [line for line in done.stderr.splitlines() if line.startswith('I')], done.stderr


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (['--text=', '--text=  '], 'error: nothing to translate'),
    (['--text=a red cat', '--beam_size=-2'], '--beam_size'),
  ],
)
def test_translate_refuses_no_sentence_and_a_beam_below_1(commands, tmp_path, args, message):
  done = _tool(commands, 'translate', f'--workdir={tmp_path}', *args)
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
  assert message in done.stderr.strip().splitlines()[-1], done.stderr


def test_translate_refuses_text_that_is_not_utf8_in_one_line(commands, tmp_path):
  """Bytes that are not UTF-8 on stdin failed inside SentencePiece with a RuntimeError
  traceback: now one line naming stdin, the line and the byte, as the data files' reader says
  (before the workdir is read)."""
  done = commands.run(
    ['-m', 'relpos.tools.translate', f'--workdir={tmp_path}'], input=b'a cat\nbad \xff\xfe\n'
  )
  assert done.returncode == 1 and 'Traceback' not in done.stderr, done.stderr
  assert done.stderr.strip().splitlines()[-1] == (
    'error: stdin line 2 is not valid UTF-8 (invalid start byte at byte 5 of the line, byte 11 '
    'of the whole, counted from 1); re-encode it as UTF-8'
  )
  # --text, as Python hands on argv's bytes that are not UTF-8: surrogates
  with pytest.raises(ValueError, match=r'^--text line 2 is not valid UTF-8 \(invalid start byte'):
    translate.read_sentences(['a cat', b'bad \xff'.decode('utf-8', 'surrogateescape')], None)
  # Cut as the data files are (`files.split_lines`): on '\n' only, CRLF read as a line end.
  assert translate.read_sentences(None, io.BytesIO('a\r\n\nb\x85c\n'.encode())) == [
    'a',
    '',
    'b\x85c',
  ]
  assert translate.read_sentences(None, io.BytesIO(b'')) == []


def test_translate_refuses_a_beam_wider_than_the_vocabulary(tmp_path):
  translation, _ = _recorded_runs(tmp_path)
  vocab_size = json.loads((translation / 'config.json').read_text())['data']['vocab_size']
  with pytest.raises(ValueError, match=rf'--beam_size={vocab_size + 1}: wider than the run'):
    translate.translate_lines(translation, ['a cat'], beam_size=vocab_size + 1)


def test_a_path_flag_after_an_equals_sign_gets_its_home_expanded():
  """`--workdir=~/runs/x`: the shell expands `~` only where a word starts with it, so absl got
  a literal '~' and train.py made a directory named '~' in the working directory."""
  from absl import flags

  from relpos.config import command_line

  registry = flags.FlagValues()
  flags.DEFINE_string('workdir', None, '', flag_values=registry)
  flags.DEFINE_string('out', None, '', flag_values=registry)
  flags.DEFINE_string('prompt', None, '', flag_values=registry)
  registry(['prog', '--workdir=~/runs/x', '--out=runs/~y', '--prompt=~/not a path'])
  command_line.expand_home(registry)
  assert registry.workdir == os.path.expanduser('~/runs/x') and not registry.workdir.startswith('~')
  assert (registry.out, registry.prompt) == ('runs/~y', '~/not a path')


def test_blank_sources_translate_to_empty_lines_without_decoding(monkeypatch):
  """An empty or blank source is an empty translation (relpos.tools.translate's docstring),
  not whatever the model makes of EOS alone; the others are decoded in their order."""
  decoded_rows = []

  def make_translator(model, eval_config, *, max_len):
    def translate(src_BS):
      decoded_rows.extend(src_BS.tolist())
      return src_BS[:, :1] + 100  # a "translation" naming its source's first piece

    return translate

  class Words:
    def encode(self, text):
      return [len(word) + 3 for word in text.split()]

    def decode(self, ids):
      return ' '.join(str(i) for i in ids)

  monkeypatch.setattr(translate_task, 'make_translator', make_translator)
  eval_config = ml_collections.ConfigDict({'batch_size': 2})
  sources = ['ab c', '', '   ', 'abcd', '\t']
  got = translate_task.translate_sentences(None, Words(), sources, eval_config, max_len=16)
  assert got == ['105', '', '', '107', '']
  assert len(decoded_rows) == 2 and all(row[0] != translate_task.EOS_ID for row in decoded_rows)


def test_an_old_module_name_runs_with_one_warning_line():
  """`python -m relpos.sweep` (now relpos.studies.sweep) warns once, though the CPU defaults
  re-execute the program (which found the module again and warned twice)."""
  done = subprocess.run(
    [sys.executable, '-m', 'relpos.sweep', '--help'],
    capture_output=True,
    text=True,
    cwd=REPO,
    env={k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', 'XLA_FLAGS')},
  )
  assert 'Sweep one' in done.stdout, done.stderr  # absl's --help (exit status 1)
  warnings = [line for line in done.stderr.splitlines() if 'FutureWarning' in line]
  assert len(warnings) == 1, done.stderr
  assert warnings[0].endswith('FutureWarning: relpos.sweep is now relpos.studies.sweep')


@pytest.mark.parametrize(
  ('program', 'own_flag'), [('train.py', '--[no]allow_config_change'), ('eval.py', '--output_dir')]
)
def test_the_launchers_help_lists_their_flags(commands, program, own_flag):
  """`train.py --help` listed no flag (they are defined in relpos.training.tasks, and absl's
  --help shows the program's own)."""
  done = commands.run([program, '--help'])
  for flag in ('--config:', '--workdir:', '--[no]traceback:', own_flag):
    assert f'\n  {flag}' in done.stdout, done.stdout


def test_fewer_sources_than_a_batch_are_not_padded_to_its_rows():
  """8 sentences with config.eval.batch_size=2**31 - 1 were padded to that many rows (2 TiB)."""
  batches = list(translate_task._source_batches([[5, 6], [7], [8, 9, 10]], 2**31 - 1, 16))
  assert len(batches) == 1 and batches[0][1].shape[0] == 3
  assert [b[1].shape[0] for b in translate_task._source_batches([[5]] * 5, 2, 16)] == [2, 2, 2]


def test_translate_names_its_checkpoint_flags_where_the_run_lacks_the_checkpoints(tmp_path):
  """--step and --average_checkpoints (the tool's docstring said config.eval.step applied, and
  the tool took no flag for it) are checked against the checkpoints the run kept, each refusal
  naming its flag; the restore's own lines would name config.eval, which the tool takes no
  flag of. A run without checkpoints is left to the restore's 'train first'."""
  translate.check_checkpoints(tmp_path, 7, 9)  # none kept: the restore's line
  for step in (10, 20, 30):
    (tmp_path / 'checkpoints' / str(step)).mkdir(parents=True)
  translate.check_checkpoints(tmp_path, 20, 2)
  translate.check_checkpoints(tmp_path, None, 3)
  with pytest.raises(FileNotFoundError) as refused:
    translate.check_checkpoints(tmp_path, 7, None)
  assert str(refused.value) == (
    f'--step=7: no such checkpoint in {tmp_path}/checkpoints (have [10, 20, 30])'
  )
  with pytest.raises(ValueError) as refused:
    translate.check_checkpoints(tmp_path, 20, 3)
  assert str(refused.value) == (
    f'--average_checkpoints=3: {tmp_path}/checkpoints holds 2 checkpoint(s) up to step 20 '
    '([10, 20]): set it to 2 or less'
  )
