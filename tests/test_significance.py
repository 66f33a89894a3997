"""relpos.studies.significance: the paired t-test over seeds against closed forms of Student's t,
and
its table and command line for a finished sweep's sweep_seeds.csv."""

import math

import pytest

from relpos.studies import significance


def _t_statistic(differences):
  n = len(differences)
  mean = sum(differences) / n
  variance = sum((d - mean) ** 2 for d in differences) / (n - 1)
  return mean / math.sqrt(variance / n)


def test_seed_p_value_is_the_two_sided_paired_t_test():
  # Student's t with 2 degrees of freedom: P(|T| > t) = 1 - t / sqrt(2 + t^2).
  baseline = {0: 12.06, 1: 12.23, 2: 11.35}
  system = {0: 13.03, 1: 13.04, 2: 13.29}
  t = _t_statistic([system[s] - baseline[s] for s in range(3)])
  expected = 1 - abs(t) / math.sqrt(2 + t * t)
  assert significance.seed_p_value(baseline, system) == pytest.approx(expected, rel=1e-9)
  # Symmetric in the two systems, and independent of the dicts' order.
  reordered = {2: 11.35, 0: 12.06, 1: 12.23}
  assert significance.seed_p_value(system, reordered) == pytest.approx(expected, rel=1e-9)


def test_seed_p_value_pairs_seeds_and_uses_only_common_ones():
  # One degree of freedom (seeds 0 and 3 in common): P(|T| > t) = 1 - (2 / pi) arctan(t).
  baseline = {0: 2.5, 1: 9.0, 3: 3.0}
  system = {0: 2.25, 2: 1.0, 3: 2.0}
  t = _t_statistic([-0.25, -1.0])
  expected = 1 - 2 / math.pi * math.atan(abs(t))
  assert significance.seed_p_value(baseline, system) == pytest.approx(expected, rel=1e-9)
  # Pairing matters: the same scores swapped between the seeds give the other test.
  swapped = {0: 2.0, 2: 1.0, 3: 2.25}
  t_swapped = _t_statistic([-0.5, -0.75])
  expected_swapped = 1 - 2 / math.pi * math.atan(abs(t_swapped))
  assert significance.seed_p_value(baseline, swapped) == pytest.approx(expected_swapped, rel=1e-9)
  assert abs(expected - expected_swapped) > 0.1


@pytest.mark.parametrize(
  ('baseline', 'system'),
  [
    ({0: 1.0, 1: 2.0}, {0: 1.5}),  # one common seed
    ({0: 1.0, 1: 2.0}, {2: 1.5, 3: 2.5}),  # none
    ({0: 1.0, 1: 2.1, 2: 3.3}, {0: 1.0, 1: 2.1, 2: 3.3}),  # identical: every difference 0
    ({0: 2.0, 1: 2.1}, {0: 1.5, 1: 1.6}),  # a constant shift, up to rounding
  ],
)
def test_seed_p_value_is_none_without_a_test(baseline, system):
  assert significance.seed_p_value(baseline, system) is None


def test_p_text():
  assert significance.p_text(None) == '–'
  assert significance.p_text(0.0004) == '< 0.001'
  assert significance.p_text(1 / 1001) == '< 0.001'  # the bootstrap's floor: printed 0.001
  assert significance.p_text(0.001) == '0.001'
  assert significance.p_text(0.12345) == '0.123'


def _seeds_csv(path, rows):
  path.write_text(
    'value,seed,bleu,step,workdir\n' + ''.join(f'{v},{s},{b},400,runs/x\n' for v, s, b in rows)
  )
  return path


def test_seed_table_of_a_sweep_seeds_csv(tmp_path):
  rows = [('16', 0, 12.0), ('16', 1, 12.5), ('16', 2, 11.0), ('4', 0, 13.0), ('4', 1, 13.0)]
  rows += [('4', 2, 13.25)]
  table = significance.seed_table(_seeds_csv(tmp_path / 'seeds.csv', rows), '16')
  p_value = significance.seed_p_value({0: 12.0, 1: 12.5, 2: 11.0}, {0: 13.0, 1: 13.0, 2: 13.25})
  assert '| 16 | 3 | 11.833 | 0.764 | (baseline) |' in table
  assert f'| 4 | 3 | 13.083 | 0.144 | {p_value:.3f} |' in table
  assert table.splitlines()[2] == '| value | n | bleu mean | std | p-value (seeds) |'


def test_seed_table_errors_name_the_file_or_flag(tmp_path):
  seeds = _seeds_csv(tmp_path / 'seeds.csv', [('a', 0, 1.0), ('b', 0, 2.0)])
  with pytest.raises(ValueError, match=r"--baseline=c is not a value of .*seeds.csv: \['a', 'b'\]"):
    significance.seed_table(seeds, 'c')
  other = tmp_path / 'summary.csv'
  other.write_text('value,n,mean,std,p_value\na,3,1.0,0.1,\n')
  with pytest.raises(ValueError, match='summary.csv: not a sweep_seeds.csv'):
    significance.seed_table(other, 'a')
  joined = tmp_path / 'joined.csv'  # two sweeps' files concatenated: a (value, seed) twice
  joined.write_text('value,seed,bleu\na,0,1.0\nb,0,2.0\na,0,1.5\n')
  with pytest.raises(ValueError, match=r'joined.csv line 4: value a seed 0 again \(first on line'):
    significance.seed_table(joined, 'a')
  for line in ('b,0,abc', 'b,0'):  # a metric that is no number, a row cut short
    bad = tmp_path / 'bad.csv'
    bad.write_text(f'value,seed,bleu\na,0,1.0\n{line}\n')
    with pytest.raises(ValueError, match=r'bad.csv line 3: seed .* are not an integer and a'):
      significance.seed_table(bad, 'a')


def test_a_file_it_cannot_read_is_named(tmp_path):
  """A binary file was "error: 'utf-8' codec can't decode byte 0xc0 ...", naming no file; a
  directory "[Errno 21] Is a directory: ..."."""
  binary = tmp_path / 'seeds.bin'
  binary.write_bytes(b'value,seed,bpc\n\xc0\x80\n')
  with pytest.raises(ValueError, match=rf'^{binary} is not a sweep_seeds.csv: not UTF-8 text'):
    significance.seed_table(binary)
  root = tmp_path / 'sweep'
  root.mkdir()
  with pytest.raises(ValueError, match=rf'^{root} is a directory: give a sweep_seeds.csv$'):
    significance.seed_table(root)
  seeds = _seeds_csv(root / 'sweep_seeds.csv', [('a', 0, 1.0)])
  with pytest.raises(ValueError, match=rf'directory: give a sweep_seeds.csv, such as {seeds}$'):
    significance.seed_table(root)
  with pytest.raises(ValueError, match=rf'^cannot read {tmp_path / "nope.csv"}: No such file'):
    significance.seed_table(tmp_path / 'nope.csv')


def test_the_baseline_is_the_first_value_by_default(tmp_path):
  """As the sweep's; absl's 'Flag --baseline must have a value other than None' before."""
  seeds = _seeds_csv(tmp_path / 'seeds.csv', [('4', 0, 2.0), ('16', 0, 1.0)])
  table = significance.seed_table(seeds)
  assert (
    table.splitlines()[0].endswith('against 4') and '| 4 | 1 | 2.000 | – | (baseline) |' in table
  )


def test_seed_table_takes_a_baseline_equal_as_a_number(tmp_path):
  """--baseline=3e5 was 'not a value ... ['300000.0']': the values were compared as text."""
  seeds = _seeds_csv(tmp_path / 'seeds.csv', [('300000.0', 0, 1.0), ('0.001', 0, 2.0)])
  assert '| 300000.0 | 1 | 1.000 | – | (baseline) |' in significance.seed_table(seeds, '3e5')
  with pytest.raises(ValueError, match=r'--baseline=4e5 is not a value'):
    significance.seed_table(seeds, '4e5')


def test_seed_table_refuses_the_list_of_diverged_runs(tmp_path):
  """sweep_diverged.csv (value, seed, diverged_at_step, workdir) was tabulated as if the step
  were a score."""
  diverged = tmp_path / 'sweep_diverged.csv'
  diverged.write_text('value,seed,diverged_at_step,workdir\n1e6,0,20,runs/x\n1e6,1,20,runs/y\n')
  with pytest.raises(ValueError, match=r'sweep_diverged.csv lists diverged runs .* sweep_seeds'):
    significance.seed_table(diverged, '1e6')


def test_command_line(tmp_path, commands):
  seeds = _seeds_csv(tmp_path / 'seeds.csv', [('a', 0, 1.0), ('a', 1, 2.0), ('b', 0, 2.0)])

  def run(*args):
    # A real process, forked from conftest's `commands` server (imports done once a run).
    return commands.run(['-m', 'relpos.studies.significance', *args], timeout=120)

  result = run(str(seeds))  # --baseline: the first value, a
  assert result.returncode == 0, result.stderr
  assert '| a | 2 | 1.500 | 0.707 | (baseline) |' in result.stdout
  assert '| b | 1 | 2.000 | – | – |' in result.stdout  # one seed: no std, no test
  for args, named in [((str(tmp_path / 'nope.csv'),), 'nope.csv'), ((), '0 arguments')]:
    failed = run(*args, '--baseline=a')
    assert failed.returncode == 1 and 'Traceback' not in failed.stderr
    assert failed.stderr.strip().splitlines() == [failed.stderr.strip()]  # one line
    assert failed.stderr.startswith('error: ') and named in failed.stderr


def test_bleu_p_value_of_two_systems_with_the_same_bleu_is_one():
  """sacreBLEU's bootstrap gives identical systems p = 1/(samples + 1), about 0.001 (every
  resample ties, and it counts only those strictly above): read as significant. A real
  difference still gets a small p, and the bpc test agrees on identical systems."""
  references = [f'the {w} sat on the mat number {i}' for i, w in enumerate(['cat', 'dog'] * 30)]
  good = list(references)
  bad = [f'a {i} mat' for i in range(60)]
  assert significance.bleu_p_value(good, good, references, target_lang='en') == 1.0
  assert significance.bleu_p_value(bad, good, references, target_lang='en') < 0.01
  assert significance.bpc_p_value([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5, 5, 5]) == 1.0


@pytest.mark.parametrize('name', ['by_position', 'by_length', 'by_evaluation'])
def test_seed_table_names_the_file_to_give_for_a_breakdowns_per_run_file(tmp_path, name):
  """sweep_by_position_seeds.csv (value, seed, bucket, bpc) failed on line 3 with "seed '0'
  and bucket '2-4' are not an integer and a number"."""
  per_run = tmp_path / f'sweep_{name}_seeds.csv'
  per_run.write_text('value,seed,bucket,bpc\n2,0,1,7.53\n2,0,2-4,7.54\n')
  (tmp_path / 'sweep_seeds.csv').write_text('value,seed,bpc,step,workdir\n2,0,7.5,20,w\n')
  with pytest.raises(ValueError) as refused:
    significance.seed_table(per_run)
  assert str(refused.value) == (
    f"{per_run} is a breakdown's per-run file (a row per run and bucket): give the sweep's "
    f'sweep_seeds.csv, {tmp_path / "sweep_seeds.csv"}'
  )


@pytest.mark.parametrize('bad', [math.nan, math.inf])
def test_a_non_finite_score_is_refused_not_tested(tmp_path, bad):
  """fz14b-7: a NaN score printed `nan` as a p-value (the bootstrap its floor, p < 0.001, for
  NaN segments), an inf one numpy's and scipy's RuntimeWarnings. Now the tests refuse it, and
  the command names the line."""
  with pytest.raises(ValueError, match=r'^paired test: system holds a number that is not finite'):
    significance.seed_p_value({0: 1.0, 1: 2.0}, {0: bad, 1: 2.5})
  with pytest.raises(ValueError, match=r'^paired test: baseline holds a number that is not'):
    significance.bpc_p_value([1.0, bad], [1.0, 2.0], [3, 3])
  seeds_csv = tmp_path / 'sweep_seeds.csv'
  seeds_csv.write_text(f'value,seed,bpc\n2,0,7.5\n2,1,7.6\n8,0,7.4\n8,1,{bad}\n')
  with pytest.raises(ValueError) as refused:
    significance.seed_table(seeds_csv)
  assert str(refused.value) == (
    f"{seeds_csv} line 5: value 8 seed 1 has bpc '{bad}', not a finite number: score that run "
    'again, or leave its row out'
  )
