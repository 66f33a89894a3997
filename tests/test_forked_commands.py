"""The forked command server (tests/forked_commands.py) ends a command as a real interpreter
does: the tests that run relpos's commands through it check exit statuses, stderr lines and
files written at exit, so each way a program ends is compared with `python script.py`."""

import subprocess
import sys

import pytest

ENDINGS = {
  'returns': "print('out')",
  'exit status': 'import sys; sys.exit(3)',
  'exit message': "import sys; sys.exit('error: one line')",
  'exception': "raise ValueError('a traceback')",
  'Ctrl-C': 'raise KeyboardInterrupt',
  'atexit': "import atexit; atexit.register(lambda: print('at exit'))",
  'thread': (
    'import threading, time\n'
    'def late():\n'
    '  time.sleep(0.2)\n'
    "  print('thread done')\n"
    'threading.Thread(target=late).start()\n'
  ),
  'unflushed': "import sys; sys.stdout.write('no newline'); sys.stderr.write('err')",
  'stdout closed': "import sys; print('lost'); sys.stdout.close()",
}


@pytest.mark.parametrize('source', ENDINGS.values(), ids=ENDINGS.keys())
def test_a_forked_command_ends_as_a_real_interpreter_does(commands, tmp_path, source):
  script = tmp_path / 'script.py'
  script.write_text(source)
  real = subprocess.run(
    [sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=60
  )
  forked = commands.run([script], cwd=tmp_path, timeout=60)
  assert (forked.returncode, forked.stdout) == (real.returncode, real.stdout)
  # Tracebacks name the runner's frames in the forked run: the last line is what a user reads.
  assert forked.stderr.splitlines()[-1:] == real.stderr.splitlines()[-1:], forked.stderr
