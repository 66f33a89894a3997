"""`python -m relpos.tools.check_install`: versions, devices, the kernels run, OK or one line."""

import functools

import numpy as np

from relpos.tools import check_install


def test_check_runs_the_xla_kernels_and_says_ok():
  lines = []
  assert check_install.check(pallas=False, out=lines.append)
  assert lines[0].startswith('jax ') and lines[1].startswith('backend ')
  assert any(line.startswith('shaw_attention: xla ran') for line in lines)
  assert any(line.startswith('xl_attention: xla ran') for line in lines)
  assert lines[-1] == 'OK'


def test_a_wrong_pallas_result_fails_in_one_line(monkeypatch):
  real = functools.cache(check_install.run_kernel)  # XLA's results, computed once per kernel

  def off_for_pallas(kernel, implementation):
    output, grads = real(kernel, 'xla')
    if implementation == 'pallas':
      output = output + np.float32(0.1)
    return output, grads

  monkeypatch.setattr(check_install, 'run_kernel', off_for_pallas)
  lines = []
  assert not check_install.check(pallas=True, out=lines.append)
  assert lines[-1].startswith('FAILED: shaw_attention pallas differs from xla by ')
  assert 'xl_attention pallas differs' in lines[-1] and len(lines[-1].splitlines()) == 1


def test_unknown_argument(capsys):
  assert check_install.main(['check_install', '--bogus']) == 2
  assert 'unknown argument --bogus' in capsys.readouterr().err


def test_help_prints_the_usage(capsys):
  """`--help` was refused as an unknown argument (exit status 2)."""
  assert check_install.main(['check_install', '--help']) == 0
  assert 'python -m relpos.tools.check_install --pallas' in capsys.readouterr().out
