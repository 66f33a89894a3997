"""End to end: train a tiny translation Transformer on generated parallel text and evaluate it.
Resuming is tested with a real SIGKILL in test_translate_resume.py."""

import hashlib
import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import after_training, tiny_translate_config, write_pair_corpus

from relpos import signals
from relpos.constants import PAD_ID
from relpos.models.transformer import Transformer
from relpos.studies import shaw_tables
from relpos.training import finished_run, restore, run_results, task_base, workdir_setup
from relpos.training import translation_task as translate


@pytest.fixture(scope='module')
def corpus(tmp_path_factory):
  return write_pair_corpus(tmp_path_factory.mktemp('corpus'))


_config = tiny_translate_config


def _train_losses(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return {r['step']: r['train/loss'] for r in map(json.loads, lines) if 'train/loss' in r}


@pytest.fixture(scope='module')
def trained(corpus, tmp_path_factory):
  """(workdir, result) of an 8-step run of `_config` (Shaw, k = 3, checkpoints at 4 and 8),
  which the tests only read: their evaluations write to directories of their own."""
  workdir = tmp_path_factory.mktemp('trained') / 'run'
  return workdir, translate.TASK.train_and_evaluate(_config(corpus, steps=8), workdir)


def test_train_then_evaluate_writes_results(corpus, trained, tmp_path):
  workdir, result = trained
  assert 0 <= result['bleu'] <= 100 and 'tok:13a' in result['signature']
  assert result['sentences'] == 12 and result['step'] == 8
  translations = Path(result['translations']).read_text().splitlines()
  assert len(translations) == 12
  saved = json.loads((workdir / 'eval_results.json').read_text())
  assert saved['bleu'] == result['bleu']
  assert (workdir / 'spm.model').exists() and (workdir / 'config.json').exists()
  losses = _train_losses(workdir)
  assert sorted(losses) == [2, 4, 6, 8] and all(map(math.isfinite, losses.values()))
  evals = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert any('eval/perplexity' in record for record in evals)
  # Scored again with Shaw's distances clipped at 0, into a directory that does not exist yet.
  config = _config(corpus, steps=8)
  config.eval.max_relative_position = 0
  clipped = translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'clipped')
  assert Path(clipped['translations']).parent == tmp_path / 'clipped'
  assert clipped['eval']['max_relative_position'] == 0
  assert clipped['perplexity'] != result['perplexity']
  # The rows of its Shaw tables (k = 3) moved from their initialisation, except the decoder's
  # later distances, which the causal mask hides.
  k, drift, initial_norm = shaw_tables.row_drift(workdir)
  assert k == 3 and initial_norm > 0
  assert np.all(drift['encoder'] > 0) and np.all(drift['decoder'][:4] > 0)
  assert np.all(drift['decoder'][4:] == 0)


def test_a_rerun_of_a_finished_run_reads_no_data(corpus, trained, tmp_path, monkeypatch, capsys):
  """train.py rerun on a finished translation run re-encoded every training pair (37 s on 1M
  pairs) and translated the eval set again, for the same BLEU; now it keeps the result and
  reads no data (`finished_run.kept_result`; its cases: tests/test_loop.py)."""
  workdir = tmp_path / trained[0].parent.name / 'run'  # a copy its results read as the run's
  shutil.copytree(trained[0], workdir)

  def refused(*args, **kwargs):
    raise AssertionError('the data of a finished run was read again')

  monkeypatch.setattr(translate, 'load_translation_data', refused)
  monkeypatch.setattr(translate, 'load_eval_data', refused)
  kept = translate.TASK.train_and_evaluate(_config(corpus, steps=8), workdir)
  assert kept['bleu'] == trained[1]['bleu']
  assert capsys.readouterr().out.startswith(f'the run in {workdir} is finished (step 8')


class _ExitError(BaseException):
  """What the test's os._exit raises, with the status the program would have exited with."""


def _copy_of_run(trained, tmp_path) -> Path:
  """A copy of the trained run, its results read as its own (`run_results.foreign_checkpoint`:
  the run's directory where it was from its result's; results written before that was
  recorded compared the checkpoint's path below the workdir's parent, which this keeps)."""
  workdir = tmp_path / trained[0].parent.name / 'run'
  shutil.copytree(trained[0], workdir)
  return workdir


@pytest.mark.parametrize('signalled', ['while scoring', 'between the writes'])
def test_a_stopped_evaluation_leaves_translations_and_results_of_one_evaluation(
  corpus, trained, tmp_path, monkeypatch, capfd, signalled
):
  """eval.py wrote translations_step<N>.txt seconds before eval_results.json (the loss came
  between): SIGTERM there left the new translations beside the earlier evaluation's results,
  under a line that said the run was unchanged, and a train.py rerun kept that result, naming
  translations its BLEU is not the score of. Now they are written together, the signal held
  back between (`Task._score_into`): a signal while scoring leaves both as they were, one
  between the writes ends eval.py after both, and the line says which."""
  workdir, scored = _copy_of_run(trained, tmp_path), tmp_path / 'scored'
  translate.TASK.evaluate(_config(corpus, steps=8), workdir, output_dir=scored)
  results, translations = scored / 'eval_results.json', scored / 'translations_step8.txt'
  before = {path: (path.stat().st_ino, path.read_bytes()) for path in (results, translations)}
  config = _config(corpus, steps=8)
  # Other settings, results of another evaluation: into an --output_dir (the workdir holds
  # the run's own config.eval's result, `run_results.check_own_result`).
  config.eval.max_decode_extra = 1

  def signal_now():
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_BLOCK, [])  # a bytecode boundary for the handler

  if signalled == 'while scoring':
    eval_loss = translate.eval_loss
    monkeypatch.setattr(translate, 'eval_loss', lambda *a: (signal_now(), eval_loss(*a))[1])
  else:
    write = task_base.write_atomically

    def written_then_signalled(path, content):
      write(path, content)
      if Path(path) == translations:
        signal_now()

    monkeypatch.setattr(task_base, 'write_atomically', written_then_signalled)

  def exit_now(status):
    raise _ExitError(status)

  monkeypatch.setattr(os, '_exit', exit_now)
  capfd.readouterr()
  with pytest.raises(_ExitError) as stopped:
    with signals.stop_at_signals(workdir_setup.stopped_evaluation(scored)):
      translate.TASK.evaluate(config, workdir, output_dir=scored)
  assert stopped.value.args == (143,)
  line = capfd.readouterr().err.splitlines()[-1]
  if signalled == 'while scoring':
    assert line == (
      'error: stopped by SIGTERM before eval.py wrote its results (the eval_results.json there '
      "is an earlier evaluation's): the run is unchanged; rerun the same command to score it"
    )
    assert {path: (path.stat().st_ino, path.read_bytes()) for path in before} == before
  else:
    assert line == (
      f'error: stopped by SIGTERM after eval.py wrote its results, {results}, whole: the run is '
      'scored; that file holds what eval.py would have printed'
    )
    written = json.loads(results.read_text())
    assert written['eval']['max_decode_extra'] == 1 and written['translations'] == str(translations)
    assert written['translations_sha256'] == hashlib.sha256(translations.read_bytes()).hexdigest()


def test_a_result_whose_translations_are_gone_or_others_is_scored_again(
  corpus, trained, tmp_path, capsys
):
  """A train.py rerun kept a finished run's result whose translations file had been deleted
  (naming a file that does not exist), or replaced by other translations (a stopped
  evaluation's, before they were written together): a BLEU of other text. Now such a result
  is not the run's (`finished_run.stale_reason`, the sweep's rule too), so a rerun scores it
  again; one written before its sha256 was recorded is kept while its file is there."""
  workdir = _copy_of_run(trained, tmp_path)
  config = _config(corpus, steps=8)
  result = translate.TASK.evaluate(config, workdir)  # results naming the copy's translations
  translations = Path(result['translations'])
  assert translations == workdir / 'translations_step8.txt'

  def reason():
    return finished_run.stale_reason(translate.TASK, workdir, config, workdir)

  assert reason() is None
  translations.write_text('other\n' * result['sentences'])
  changed = f'{translations} holds other translations than it scored (not the sha256 it records)'
  assert reason() == changed
  assert finished_run.kept_result(translate.TASK, config, workdir, 'python eval.py') is None
  assert capsys.readouterr().out == (  # train.py's rerun says why it scores the run again
    f'the run in {workdir} is trained to step 8, but {workdir}/eval_results.json is not this '
    f"config's result ({changed}): scoring it again\n"
  )
  older = {key: value for key, value in result.items() if key != 'translations_sha256'}
  (workdir / 'eval_results.json').write_text(json.dumps(older))
  assert reason() is None  # written by an older relpos: unchecked while the file is there
  translations.unlink()
  assert reason() == f'{translations}, its translations, is gone (or cannot be read)'
  assert finished_run.kept_result(translate.TASK, config, workdir, 'python eval.py') is None


def test_checkpoint_averaging_uses_the_last_checkpoints(corpus, trained, tmp_path):
  workdir, single = trained
  config = _config(corpus, steps=8)
  config.data.max_eval_examples = 2
  config.eval.beam_size = 1
  config.eval.average_checkpoints = 2
  averaged = translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'averaged')
  assert single['averaged_steps'] == [8] and averaged['averaged_steps'] == [4, 8]
  config.eval.update(step=4, average_checkpoints=1)
  assert translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'at4')['step'] == 4
  # The averaged parameters are the mean of the two checkpoints' parameters, leaf by leaf.
  params = {}
  for step, average in ((4, 1), (8, 1), (8, 2)):
    eval_config = config.eval.copy_and_resolve_references()
    eval_config.update(step=step, average_checkpoints=average)
    model = Transformer(translate.model_config(config, 40), rngs=nnx.Rngs(1))
    restored, steps, _ = restore.restore_model(model, eval_config, workdir)
    assert steps == ([4, 8] if average == 2 else [step])
    params[step, average] = jax.tree.leaves(nnx.to_pure_dict(nnx.state(restored, nnx.Param)))
  for at4, at8, mean in zip(*params.values(), strict=True):
    assert not np.allclose(at4, at8)
    np.testing.assert_allclose(mean, (np.asarray(at4) + np.asarray(at8)) / 2, rtol=1e-6)
  config.eval.step = 5
  with pytest.raises(FileNotFoundError, match='config.eval.step=5'):
    translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'at5')
  # Another vocabulary or model than the run's: an error that names the fix.
  config.eval.step = 0
  config.data.vocab_size = 41
  with pytest.raises(ValueError, match=r'has 40 pieces but config\.data\.vocab_size is 41'):
    translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'vocab')
  config.data.vocab_size = 40
  config.model.d_ff = 32
  with pytest.raises(ValueError, match=r'another model .*\(model.d_ff: trained \d+, given 32\)'):
    translate.TASK.evaluate(config, workdir, output_dir=tmp_path / 'model')
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['4', '8']


def test_other_eval_data_is_not_scored_over_the_run_s_own_result(corpus, trained, tmp_path):
  """eval.py with other eval files and no --output_dir only warned, then wrote its score (of
  other sentences) over the run's eval_results.json and translations, which a sweep then
  tabulated as the run's. It is refused before anything is scored, naming the fields and
  --output_dir (the workdir given as --output_dir too), and the workdir is left as it was."""
  workdir, _ = trained
  before = {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()}
  config = _config(corpus, steps=8)
  config.data.eval_src, config.data.eval_tgt = config.data.train_src, config.data.train_tgt
  with pytest.raises(ValueError) as error:
    translate.TASK.evaluate(config, workdir)
  assert str(error.value).startswith(
    f'this evaluation scores other data than the run in {workdir} trained with '
    f"(data.eval_src: trained '{corpus / 'eval.en'}', given '{corpus / 'train.en'}'; "
    'data.eval_tgt: trained '
  )
  assert '--output_dir=<a new directory>' in str(error.value)
  with pytest.raises(ValueError, match='scores other data'):  # the workdir given as output_dir
    translate.TASK.evaluate(config, workdir, output_dir=workdir)
  assert {p.name: p.read_bytes() for p in workdir.iterdir() if p.is_file()} == before


def test_other_training_data_alone_is_scored_into_the_run_s_workdir(
  corpus, trained, tmp_path, capsys
):
  """A change only training reads (another training file, another batch size:
  `training_only_data`) scores the same sentences, so eval.py scores into the workdir with a
  warning, where other eval files are refused (above)."""
  workdir = tmp_path / 'run'
  shutil.copytree(trained[0], workdir)
  config = _config(corpus, steps=8)
  other_train = tmp_path / 'other.en'
  other_train.write_text('another training file\n')
  config.data.train_src = str(other_train)
  config.data.max_tokens *= 2
  capsys.readouterr()
  result = translate.TASK.evaluate(config, workdir)
  assert (workdir / 'eval_results.json').is_file() and result['sentences'] > 0
  warnings = capsys.readouterr().err.splitlines()
  (warning,) = [line for line in warnings if 'training reads' in line]
  assert warning.startswith("warning: fields only training reads differ from the run's (")
  assert warning.endswith('): they change nothing this evaluation scores')
  assert 'data.max_tokens: trained ' in warning
  assert f"data.train_src: trained '{corpus / 'train.en'}', given '{other_train}'" in warning
  assert not any('scoring other data' in line for line in warnings)


def test_a_resume_with_other_batch_rows_says_the_data_order_changes(
  corpus, trained, tmp_path, capsys
):
  """W2: a translation run resumed on another device count (rows a multiple of it) trained other
  batches than the uninterrupted run, in silence. Each checkpoint records the batch plan, and
  a resume under another one warns. Here config.train.grad_accum_steps=2 stands in for 2
  devices (the rows are a multiple of devices × micro-batches; this process has one device):
  max_tokens 256 at padded length 17 gives 15 rows, rounded down to 14."""
  workdir = tmp_path / 'run'
  shutil.copytree(trained[0], workdir)
  shutil.rmtree(workdir / 'checkpoints' / '8')
  capsys.readouterr()
  config = _config(corpus, steps=5)
  translate.TASK.train_model(config, workdir, allow_config_change=True)  # the same plan
  assert 'batches planned otherwise' not in capsys.readouterr().err  # so nothing to say
  shutil.rmtree(workdir / 'checkpoints' / '5')
  config.train.grad_accum_steps = 2
  translate.TASK.train_model(config, workdir, allow_config_change=True)
  warnings = [line for line in capsys.readouterr().err.splitlines() if 'planned' in line]
  assert len(warnings) == 1 and warnings[0].startswith(
    'warning: resumed from step 4 with batches planned otherwise than when it was saved (then '
    '1 device(s) in 1 process(es): rows ['
  )
  assert re.search(r'then [^;]*\[15\], \d+ batches per epoch; now [^;]*\[14\], ', warnings[0])
  assert "the data order differs from the uninterrupted run's" in warnings[0]


def test_an_eval_file_gone_by_the_final_evaluation_names_the_saved_run(
  corpus, trained, tmp_path, monkeypatch
):
  """The references moved away while train.py trained: the final evaluation said
  `config.data.eval_tgt = '...' is not a file; set it to a text file`. Now the line says the
  run is saved, and names the file gone since training started."""
  workdir = tmp_path / 'run'
  shutil.copytree(trained[0], workdir)
  (workdir / 'eval_results.json').unlink()  # stopped before its final evaluation
  references, moved = corpus / 'eval.de', tmp_path / 'eval.de'
  after_training(monkeypatch, translate.TASK, lambda: references.rename(moved))
  try:
    with pytest.raises(run_results.UnscoredRunError) as caught:
      translate.TASK.train_and_evaluate(_config(corpus, steps=8), workdir)
  finally:
    if moved.exists():
      moved.rename(references)
  assert str(caught.value).startswith(
    f'training finished and saved its last checkpoint, {workdir}/checkpoints/8 (step 8), but '
    f'config.data.eval_tgt ({references}) is gone since training started'
  )


def test_references_converted_to_crlf_after_training_are_scored_into_the_workdir(
  corpus, trained, tmp_path, capsys
):
  """The test references converted to CRLF line endings after training read as the same
  sentences, yet eval.py refused to score the run into its workdir ('scores other data than
  the run ... trained with (config.data.eval_tgt: ... changed since the run trained on it')."""
  # A copy of the module's run, unscored (as train_model leaves it), and the module's
  # references converted for this test only (their bytes and times put back after it).
  workdir = _copy_of_run(trained, tmp_path)
  (workdir / 'eval_results.json').unlink()
  config = _config(corpus, steps=8)
  references = corpus / 'eval.de'
  original, status = references.read_bytes(), references.stat()
  references.write_bytes(original.replace(b'\n', b'\r\n'))
  try:
    capsys.readouterr()
    result = translate.TASK.evaluate(config, workdir)
  finally:
    references.write_bytes(original)
    os.utime(references, ns=(status.st_atime_ns, status.st_mtime_ns))
  assert result['sentences'] == 12 and (workdir / 'eval_results.json').is_file()
  assert 'other data' not in capsys.readouterr().err


def test_evaluate_without_checkpoint_says_so(corpus, tmp_path):
  with pytest.raises(FileNotFoundError, match='train first'):
    translate.TASK.evaluate(_config(corpus, steps=4), tmp_path / 'empty')


def test_launchers_print_bleu_last(commands, corpus, tmp_path):
  workdir = tmp_path / 'run'
  config = _config(corpus, steps=4)
  overrides = [
    f'--config.data.{field}={config.data[field]}'
    for field in ('train_src', 'train_tgt', 'eval_src', 'eval_tgt', 'vocab_size', 'max_tokens')
  ] + [
    '--config.data.moses_detokenize=False',
    '--config.data.max_eval_examples=4',
    '--config.data.max_length=16',
    '--config.data.length_buckets=1',  # one batch shape: one train-step compile
    '--config.model.encoder_layers=1',
    '--config.model.decoder_layers=1',
    '--config.model.d_model=32',
    '--config.model.num_heads=2',
    '--config.model.d_ff=64',
    '--config.train.steps=2',
    '--config.eval.beam_size=1',
  ]
  command = ['train.py', '--config=configs/translate_tiny.py:absolute']
  trained = commands.run(command + overrides + [f'--workdir={workdir}'])
  assert trained.returncode == 0, trained.stderr[-3000:]
  bleu = trained.stdout.strip().splitlines()[-1]
  assert re.fullmatch(r'bleu=\d+\.\d\d', bleu)
  # --workdir alone: the run's own recorded config (relpos.config.run_file), overrides and all,
  # scores the checkpoint as train.py did (eval.py with --config and overrides is
  # test_char_lm_training's); a config.eval override still applies (another beam is refused
  # into the run's workdir).
  alone = commands.run(['eval.py', f'--workdir={workdir}'])
  assert alone.returncode == 0, alone.stderr[-3000:]
  lines = alone.stdout.strip().splitlines()
  assert lines[-2].startswith('sacreBLEU nrefs:1|') and lines[-1] == bleu
  other = commands.run(['eval.py', f'--workdir={workdir}', '--config.eval.beam_size=2'])
  assert other.returncode == 1 and "eval.beam_size: the run's 1, given 2" in other.stderr
  (tmp_path / 'empty').mkdir()
  refused = commands.run(['eval.py', f'--workdir={tmp_path}/empty'])
  assert refused.returncode == 1 and refused.stderr.strip().splitlines()[-1] == (
    f'error: --config is missing, and --workdir={tmp_path}/empty holds no run (its '
    'config.json) to evaluate with its own config: give the config it trained with'
  )


@pytest.mark.slow
def test_overfits_a_tiny_corpus_to_high_bleu(corpus, tmp_path):
  """Decode, detokenise and BLEU fit together: a model that learned its pairs scores ~100."""
  # 600 steps: 400 memorised the pairs (BLEU 93-100) in 11 of 12 runs (seeds 0-5, XLA:CPU's
  # fusion emitters on and off: conftest.py) and reached 79 in one, whose rounding took another
  # path; 600 gave 100 in all 6 runs tried (seeds 0-2, both settings; 2026-11-27).
  config = _config(corpus, steps=600, position='absolute')
  config.data.update(eval_src=config.data.train_src, eval_tgt=config.data.train_tgt)
  config.data.update(max_train_examples=40, max_eval_examples=40, max_length=24)
  config.model.update(dropout=0.0, d_model=64, d_ff=128)
  # 1e-3: memorised (BLEU 97-100) from each of 3 seeds; 3e-3 reached 57-93, by the seed.
  config.optim.update(schedule='constant', learning_rate=1e-3, label_smoothing=0.0)
  config.train.update(eval_every=0, checkpoint_every=0, log_every=50)
  config.eval.beam_size = 4
  result = translate.TASK.train_and_evaluate(config, tmp_path / 'run')
  assert result['bleu'] >= 90, result


def test_missing_and_empty_translation_files_are_named(corpus, tmp_path):
  config = _config(corpus, steps=2)
  config.data.train_tgt = str(tmp_path / 'missing.de')
  with pytest.raises(FileNotFoundError, match='config.data.train_tgt'):
    translate.TASK.train_and_evaluate(config, tmp_path / 'run1')
  (tmp_path / 'empty.en').write_text('')
  (tmp_path / 'empty.de').write_text('')
  config = _config(corpus, steps=2)
  config.data.update(train_src=str(tmp_path / 'empty.en'), train_tgt=str(tmp_path / 'empty.de'))
  with pytest.raises(ValueError, match='empty.en'):
    translate.TASK.train_and_evaluate(config, tmp_path / 'run2')


def test_token_losses_equal_smoothed_cross_entropy_and_its_gradient():
  """token_losses against a float64 transcription of label-smoothed cross-entropy,
  -Σ_v ((1 - a)·[v = y] + a/V) log softmax(z)_v, and of its gradient softmax(z) - target;
  PAD targets give 0."""
  rng = np.random.default_rng(17)
  batch, length, vocab, smoothing = 3, 5, 11, 0.1
  logits = rng.standard_normal((batch, length, vocab)).astype(np.float32) * 3
  targets = rng.integers(1, vocab, (batch, length))
  targets[0, 3:] = PAD_ID
  targets[2, 4] = PAD_ID
  loss, nll = (np.asarray(x) for x in translate.token_losses(logits, targets, smoothing))
  z = logits.astype(np.float64)
  log_p = z - z.max(-1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
  smoothed = (1 - smoothing) * np.eye(vocab)[targets] + smoothing / vocab
  real = targets != PAD_ID
  np.testing.assert_allclose(loss, -(smoothed * log_p).sum(-1) * real, rtol=1e-5, atol=1e-6)
  picked = np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(nll, -picked * real, rtol=1e-5, atol=1e-6)
  assert (loss[~real] == 0).all() and (nll[~real] == 0).all()

  def total_loss(z):
    return jnp.sum(translate.token_losses(z, targets, smoothing)[0])

  # d loss / d z = softmax(z) - smoothed target, on real tokens only
  want_grad = (np.exp(log_p) - smoothed) * real[..., None]
  np.testing.assert_allclose(np.asarray(jax.grad(total_loss)(logits)), want_grad, atol=1e-6)


def test_validation_compiles_its_loss_once_per_batch_shape(monkeypatch):
  """`eval_loss`, which training calls at every validation, traces its jitted loss once per
  model and batch shape: a second call with new parameters of the same model reuses it."""
  from relpos.config import load_config_file
  from relpos.data.token_batches import TokenBatches

  config = load_config_file(Path(__file__).parent.parent / 'configs/translate_tiny.py', 'shaw')
  config.model.update(encoder_layers=1, decoder_layers=1, d_model=32, num_heads=2, d_ff=64)
  model = Transformer(translate.model_config(config, 40), rngs=nnx.Rngs(0))
  batches = TokenBatches(
    [([5, 6, 7], [8, 9]), ([5, 6], [7, 8, 9])], max_length=7, rows=2, boundaries=[8]
  )
  traced = []
  real = translate.token_losses
  monkeypatch.setattr(translate, 'token_losses', lambda *args: traced.append(1) or real(*args))
  first = translate.eval_loss(model, batches)
  graphdef, state = nnx.split(model)
  moved = jax.tree.map(lambda x: x * 1.01 if jnp.issubdtype(x.dtype, jnp.floating) else x, state)
  second = translate.eval_loss(nnx.merge(graphdef, moved), batches)
  assert len(traced) == 1
  assert first['tokens'] == second['tokens'] and first['nll'] != second['nll']


class _WordLengthTokenizer:
  """A stand-in tokenizer: one piece per word (its length), decoded as the pieces' numbers."""

  def encode(self, text):
    return [4 + len(word) % 30 for word in text.split()]

  def decode(self, ids):
    return ' '.join(map(str, ids))


def test_sources_longer_than_max_len_are_cut_with_one_warning(capsys):
  """Decoding cut a source past config.model.max_len - 1 pieces without a word (T5, X5); the
  cut source (19 pieces + EOS) is padded to max_len=20 rows, not 32, which a learned position
  table of 20 rows would refuse."""
  from relpos.config.translation_defaults import translate_config

  config = translate_config()
  config.model.update(
    position='learned', max_len=20, encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32
  )
  config.model.num_heads = 2
  model = Transformer(translate.model_config(config, 40), rngs=nnx.Rngs(0))
  config.eval.update(beam_size=1, max_decode_extra=2, batch_size=2)
  sources = ['a bb ccc ' * 10, 'a bb', 'dddd ' * 19]  # 30, 2 and 19 pieces
  translations = translate.translate_sentences(
    model, _WordLengthTokenizer(), sources, config.eval, max_len=20
  )
  assert len(translations) == 3
  warnings = capsys.readouterr().err.strip().split('\n')
  assert len(warnings) == 1 and warnings[0].startswith(
    'warning: 1 of 3 sources are longer than 19 pieces and were cut to their first 19 for '
    'decoding (config.model.max_len=20'
  )


def test_a_vocabulary_placed_in_a_new_workdir_is_used_not_trained_over(corpus, tmp_path, capsys):
  """An spm.model copied into a new workdir, to share a vocabulary across runs, was trained
  over in silence. It is used now, with one warning line that says how to train one instead;
  the run records it as its own (`data_record`) at its first step."""
  from relpos.data import tokenizer
  from relpos.training import mesh as mesh_lib

  config = _config(corpus, steps=2)
  workdir = tmp_path / 'shared'
  sentences = [*(corpus / 'train.de').read_text().splitlines(), 'Ein ganz anderer Satz.'] * 2
  tokenizer.train_or_load(tmp_path / 'other' / 'spm.model', sentences, 40, max_sentences=0, seed=0)
  workdir.mkdir()
  shutil.copy(tmp_path / 'other' / 'spm.model', workdir / 'spm.model')  # the file alone
  placed = (workdir / 'spm.model').read_bytes()
  capsys.readouterr()
  translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert (workdir / 'spm.model').read_bytes() == placed
  assert (
    f'warning: {workdir}/spm.model was there before this run: it trains with that vocabulary '
    '(the run records it as its own); remove it to train one on config.data.train_src/'
    'train_tgt instead'
  ) in capsys.readouterr().err.splitlines()


def test_a_sweep_hands_a_vocabulary_on_to_a_run_that_would_train_it_again(
  corpus, trained, tmp_path, capsys, monkeypatch
):
  """A translation sweep over k trained the same SentencePiece model, byte for byte, in every
  run (50-83 s each on 1M pairs). Now a run whose vocabulary would be that of a run the sweep
  trained (the same data, vocabulary fields and draw: `vocabulary_changes`) gets a copy before
  it starts, with a line saying so, a record of where it came from, and no warning of a
  placed vocabulary at its start. A run of another vocabulary field, or a donor the sweep did
  not train (a vocabulary placed by hand, say), trains its own."""
  from relpos.files import made_here, record_source, recorded_source, write_marked
  from relpos.studies import sweep
  from relpos.training import mesh as mesh_lib

  donor = tmp_path / 'max_relative_position=3' / 'seed=0'
  shutil.copytree(trained[0], donor)
  vocabulary = donor / 'spm.model'
  config = _config(corpus, steps=8)
  config.model.max_relative_position = 5  # the swept field: the model's, not the vocabulary's
  workdir = tmp_path / 'max_relative_position=5' / 'seed=0'
  sweep.reuse_vocabulary(translate.TASK, config, workdir, [donor, workdir])
  assert not workdir.exists(), 'a vocabulary the sweep did not train was handed on'
  record_source(vocabulary, sweep.TRAINED_BY_SWEEP)
  sweep.reuse_vocabulary(translate.TASK, config, workdir, [donor, workdir])
  copy = workdir / 'spm.model'
  assert copy.read_bytes() == vocabulary.read_bytes()
  assert recorded_source(copy) == f'copied by relpos.studies.sweep from {vocabulary}'
  assert capsys.readouterr().out == (
    f'vocabulary: {vocabulary} copied to {copy}, not trained again (the same training data, '
    'vocabulary fields and draw)\n'
  )
  translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert copy.read_bytes() == vocabulary.read_bytes() and not made_here(copy)
  assert 'was there before this run' not in capsys.readouterr().err
  other = tmp_path / 'vocab_size=41' / 'seed=0'
  config.data.vocab_size = 41
  sweep.reuse_vocabulary(translate.TASK, config, other, [donor, workdir, other])
  assert not other.exists()
  # A vocabulary a sweep's run trains itself is recorded as the sweep's, for the runs after it.
  trains = tmp_path / 'trains'

  def train_model(config, workdir):
    workdir.mkdir()
    write_marked(workdir / 'spm.model', b'the vocabulary it trained')  # as train_or_load does
    (workdir / 'config.json').write_text('{}')  # the run recorded

  monkeypatch.setattr(translate.TASK, 'train_model', train_model)
  sweep.train_run(translate.TASK, config, trains, [trains])
  assert recorded_source(trains / 'spm.model') == sweep.TRAINED_BY_SWEEP


def test_a_copied_vocabulary_a_start_that_died_left_is_decided_again(trained, tmp_path, capsys):
  """A sweep copied a vocabulary into a run's workdir, then the start died before it recorded
  its run (SIGKILL, a refusal for a missing eval file): the copy stayed, and after the training
  files changed the next sweep found it there and kept it (`reuse_vocabulary` returned early),
  and the start trained on the new data with the old data's vocabulary, exit 0, no word. A
  copy no recorded run owns is decided again, by the sweep and by train.py's start alike
  (`workdir_setup.remove_stale_copy`): kept while it is still its donor's, else removed with
  a line, and the run trains its own (the copy's record read once: it was read again to name
  it)."""
  from relpos.config.recorded import record_config
  from relpos.files import copy_with_source, made_here, record_source, recorded_source
  from relpos.studies import sweep
  from relpos.training import data_record, workdir_setup
  from relpos.training import mesh as mesh_lib

  corpus = write_pair_corpus(tmp_path / 'corpus')  # the module's corpus, which this one changes
  config = _config(corpus, steps=8)
  donor = tmp_path / 'd_ff=64' / 'seed=0'  # a sweep's finished run, trained on `corpus`
  donor.mkdir(parents=True)
  shutil.copy(trained[0] / 'spm.model', donor / 'spm.model')  # the same pairs' vocabulary
  record_config(config, donor, allow_change=False)
  data_record.record(donor, translate.TASK.data_files(config, donor))
  record_source(donor / 'spm.model', sweep.TRAINED_BY_SWEEP)
  workdir = tmp_path / 'd_ff=96' / 'seed=0'
  config.model.d_ff = 96
  sweep.reuse_vocabulary(translate.TASK, config, workdir, [donor, workdir])
  copy = workdir / 'spm.model'
  assert recorded_source(copy) == f'copied by relpos.studies.sweep from {donor / "spm.model"}'
  capsys.readouterr()
  # The start died: the copy is left, with no run. Still its donor's, it is kept and used.
  sweep.reuse_vocabulary(translate.TASK, config, workdir, [donor, workdir])
  assert copy.exists() and capsys.readouterr().out == ''
  translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert copy.read_bytes() == (donor / 'spm.model').read_bytes() and not made_here(copy)
  assert 'vocabulary' not in capsys.readouterr().err
  # The training files changed: the next sweep removes the copy and copies none.
  for name, line in (('train.en', 'red cat'), ('train.de', 'Katze rot')):
    with open(corpus / name, 'a') as file:
      file.write(f'{line}\n')
  originals, recorded_original = [], workdir_setup.recorded_original
  with pytest.MonkeyPatch.context() as patched:  # the copy's record read once for the decision
    patched.setattr(
      workdir_setup,
      'recorded_original',
      lambda path: originals.append(path) or recorded_original(path),
    )
    sweep.reuse_vocabulary(translate.TASK, config, workdir, [donor, workdir])
  assert originals == [copy]
  assert not copy.exists() and not (workdir / 'spm.model.source').exists()
  removed = capsys.readouterr().out
  assert removed.startswith(
    f'vocabulary: {copy}, copied from {donor / "spm.model"} for a start that stopped before its '
    'run was recorded, removed: it is not the vocabulary this run would train (config.data.'
    f'train_src: {corpus}/train.en changed since the run trained on it ('
  )
  # train.py's start on such a leftover copy trains its own, with the same line.
  copy_with_source(donor / 'spm.model', copy, f'copied by relpos.studies.sweep from {donor}')
  translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert made_here(copy) and not (workdir / 'spm.model.source').exists()
  assert capsys.readouterr().out.startswith(removed.splitlines()[0].split(' (config.data')[0])


def test_a_placed_vocabulary_that_cannot_serve_is_named_with_its_ways_out(corpus, tmp_path):
  """A placed spm.model of 250 pieces against config.data.vocab_size=40 was refused as "the
  workdir was made with config.data.vocab_size=250; pass that (the config its run recorded)",
  where no run exists, and a garbage one with "rerun train.py, which trains it again". Each now
  names the placed file, what it holds and the ways out."""
  from relpos.data import tokenizer
  from relpos.training import mesh as mesh_lib

  config = _config(corpus, steps=2)
  sentences = [*(corpus / 'train.de').read_text().splitlines(), 'Ein ganz anderer Satz.'] * 2
  tokenizer.train_or_load(tmp_path / 'other' / 'spm.model', sentences, 41, max_sentences=0, seed=0)
  workdir = tmp_path / 'placed'
  workdir.mkdir()
  shutil.copy(tmp_path / 'other' / 'spm.model', workdir / 'spm.model')
  with pytest.raises(ValueError) as refused:
    translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert str(refused.value) == (
    f'{workdir}/spm.model, placed in the workdir before its first run, has 41 pieces but '
    'config.data.vocab_size is 40: pass --config.data.vocab_size=41 to train with it, or '
    'remove it, and the run trains one on config.data.train_src/train_tgt of 40 pieces'
  )
  (workdir / 'spm.model').write_bytes(b'\x00garbage' * 20)
  with pytest.raises(ValueError) as refused:
    translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert str(refused.value).startswith(f'{workdir}/spm.model, placed in the workdir before its ')
  assert str(refused.value).endswith(
    'is no SentencePiece model (INTERNAL: could not parse ModelProto from '
    f'{workdir}/spm.model); copy the vocabulary there again, or remove it, and the run trains '
    'one on config.data.train_src/train_tgt'
  )


def test_a_vocabulary_a_killed_start_left_is_trained_again_not_taken_as_placed(
  corpus, tmp_path, capsys
):
  """A start killed (SIGKILL) after it wrote spm.model and before it recorded its run left the
  file, which the restart (with other training files) took as placed: it kept that vocabulary
  and recorded it as its own. relpos marks the vocabulary it trains (`files.write_marked`), so
  the restart trains it again, in silence; a placed file has no mark (the test above)."""
  from relpos.data import tokenizer
  from relpos.training import mesh as mesh_lib

  config = _config(corpus, steps=2)
  workdir = tmp_path / 'killed'
  sentences = [*(corpus / 'train.de').read_text().splitlines(), 'Ein ganz anderer Satz.'] * 2
  tokenizer.train_or_load(workdir / 'spm.model', sentences, 40, max_sentences=0, seed=0)
  leftover = (workdir / 'spm.model').read_bytes()
  capsys.readouterr()
  translate.TASK.training(config, workdir, mesh_lib.data_mesh())
  assert (workdir / 'spm.model').read_bytes() != leftover
  assert 'was there before this run' not in capsys.readouterr().err


def test_a_start_that_fails_before_its_run_is_recorded_removes_the_vocabulary_it_made(
  corpus, tmp_path
):
  """What a start that failed left in the workdir (its vocabulary, of data then fixed) would
  meet the next start as one placed there to share: it is removed with the failure. One that
  was there before stays."""
  config = _config(corpus, steps=2)
  config.data.eval_src = str(tmp_path / 'missing.en')  # read after the vocabulary is trained
  workdir = tmp_path / 'mine'
  workdir.mkdir()
  with pytest.raises(FileNotFoundError, match='missing.en'):
    translate.TASK.train_model(config, workdir)
  assert sorted(path.name for path in workdir.iterdir()) == ['.relpos.lock']
  (workdir / 'spm.model').write_bytes(b'placed')
  with pytest.raises(ValueError, match='spm.model, placed in the workdir before its first run'):
    translate.TASK.train_model(_config(corpus, steps=2), workdir)
  assert (workdir / 'spm.model').read_bytes() == b'placed'


def test_the_translate_tool_on_a_run_before_its_first_checkpoint_is_busy(trained, tmp_path, capsys):
  """relpos.tools.translate (which caught only FileNotFoundError and ValueError) on a workdir
  where train.py trains but has saved nothing yet: the busy line and exit 75, no traceback."""
  from helpers import call_absl_main

  from relpos.tools import translate as translate_tool
  from relpos.training import workdir_lock

  workdir = tmp_path / 'run'
  shutil.copytree(trained[0], workdir, ignore=shutil.ignore_patterns('checkpoints'))
  with workdir_lock.hold(workdir):
    code = call_absl_main(
      translate_tool.define_flags,
      translate_tool.main,
      ['translate', f'--workdir={workdir}', '--text=red cat'],
    )
  assert code == 75
  assert capsys.readouterr().err.startswith(
    f'error: --workdir={workdir} has no checkpoint yet: process '
  )
