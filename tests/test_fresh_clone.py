"""What a fresh clone can run: no file reads a path outside the repository, the config
docstrings render their commands, and the bundled data is what its README says."""

import ast
import gzip
import hashlib
import importlib
import re
import shlex
import subprocess
import warnings

import pytest
from helpers import REPO, load_config

import relpos.data
from relpos.data.translation import read_pairs

# Built from parts so that this file does not name what it looks for.
_OUTSIDE = re.compile(re.escape('..' + '/shared') + '|' + re.escape('/work' + '/shared'))
_CONFIGS = sorted((REPO / 'configs').glob('*.py'))


def _tracked_files() -> list[str]:
  try:
    listed = subprocess.run(
      ['git', 'ls-files'], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
  except (OSError, subprocess.CalledProcessError):
    pytest.skip('not a git checkout')
  return listed.splitlines()


def test_no_tracked_file_outside_readme_and_docs_names_a_path_beside_the_repository():
  """Only the development machines have a shared data folder beside the checkout."""
  offenders = []
  for name in _tracked_files():
    if name == 'README.md' or name.startswith('docs/'):
      continue
    path = REPO / name
    if path.suffix == '.gz' or not path.is_file():
      continue
    text = path.read_text(errors='ignore')
    offenders += [
      f'{name}:{number}'
      for number, line in enumerate(text.splitlines(), 1)
      if _OUTSIDE.search(line)
    ]
  assert not offenders


def _docstring_source(path):
  """(source lines of the module docstring, the docstring as Python reads it)."""
  source = path.read_text()
  node = ast.parse(source).body[0]
  assert isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant), path
  return source.splitlines()[node.lineno - 1 : node.end_lineno], node.value.value


@pytest.mark.parametrize('path', _CONFIGS, ids=lambda path: path.name)
def test_config_docstrings_keep_their_command_continuations(path):
  """A `\\` ending a docstring line must stay in __doc__ with its newline: a lone backslash
  in a plain docstring joins the two lines instead (write `\\\\` or an r-string)."""
  source_lines, doc = _docstring_source(path)
  continued_in_source = sum(line.rstrip().endswith('\\') for line in source_lines)
  continued_in_doc = sum(line.rstrip().endswith('\\') for line in doc.splitlines())
  assert continued_in_doc == continued_in_source


def _commands(doc: str) -> list[list[str]]:
  """The `python ...` commands of a docstring, continuations joined, comments dropped."""
  joined = re.sub(r'\\\n\s*', ' ', doc)
  return [
    shlex.split(line.split('#')[0])
    for line in joined.splitlines()
    if line.strip().startswith('python ')
  ]


@pytest.mark.parametrize('path', _CONFIGS, ids=lambda path: path.name)
def test_config_commands_run_from_a_fresh_clone_or_name_their_prepare_command(path):
  """Each documented command's config and preset load; the repository paths it names exist;
  a config that reads prepared data says in its docstring how to prepare it."""
  _, doc = _docstring_source(path)
  for command in _commands(doc):
    for argument in command:
      name, _, value = argument.partition('=')
      if name == '--config' and value.startswith(f'configs/{path.name}'):
        preset = value.partition(':')[2] or None
        load_config(path.stem, preset)
      if name.startswith('--config.data.') and value.startswith('relpos/'):
        assert (REPO / value).is_file(), argument
      if value.startswith('data/'):
        assert 'relpos.data.prepare' in doc or 'tfds build' in doc, argument


def test_prepared_data_lives_in_the_data_directory(monkeypatch, tmp_path):
  monkeypatch.delenv(relpos.data.DATA_DIR_VARIABLE, raising=False)
  assert relpos.data.data_directory() == REPO / 'data'
  monkeypatch.setenv(relpos.data.DATA_DIR_VARIABLE, str(tmp_path))
  assert relpos.data.data_directory() == tmp_path
  config = load_config('translate_tiny', 'shaw')
  assert config.data.train_src.startswith(str(tmp_path / 'tatoeba_ende'))


def test_bundled_toy_ende_is_what_its_readme_says():
  readme = (relpos.data.SAMPLES / 'README.md').read_text()
  files = sorted(relpos.data.TOY_ENDE.iterdir())
  assert sum(path.stat().st_size for path in files) < 400_000
  for path in files:
    text = gzip.decompress(path.read_bytes())
    lines, md5 = len(text.splitlines()), hashlib.md5(text).hexdigest()
    assert f'| {path.name} | {lines} | {len(text):,} | {md5} |' in readme
  src, tgt = relpos.data.toy_ende('train')
  assert (src, tgt) == (str(files[1]), str(files[4]))
  with pytest.raises(ValueError, match='not .dev.'):
    relpos.data.toy_ende('dev')


def test_translate_overfit_reads_200_bundled_pairs():
  data = load_config('translate_overfit').data
  sources, targets = read_pairs(data, 'train')
  assert len(sources) == len(targets) == 200
  assert tuple(read_pairs(data, 'eval')) == (sources, targets)


def _heading_anchors(markdown: str) -> set[str]:
  """The anchors GitHub gives a Markdown file's headings: lowercased, punctuation other than
  '-' and '_' dropped, spaces as '-', a repeated anchor suffixed -1, -2, ...; fenced code
  blocks hold no headings."""
  anchors, seen, fenced = set(), {}, False
  for line in markdown.splitlines():
    if line.startswith('```'):
      fenced = not fenced
    heading = None if fenced else re.match(r'#{1,6} (.*)', line)
    if heading:
      anchor = re.sub(r'[^\w\- ]', '', heading.group(1).strip().lower()).replace(' ', '-')
      count = seen.get(anchor, 0)
      seen[anchor] = count + 1
      anchors.add(anchor if count == 0 else f'{anchor}-{count}')
  return anchors


def test_readme_and_docs_links_reach_a_file_and_heading_of_the_repository():
  """Every relative link in README.md and docs/ names a file the clone has and, after '#', a
  heading of it (a renamed heading broke README's links to it, silently)."""
  broken = []
  for page in [REPO / 'README.md', *sorted((REPO / 'docs').rglob('*.md'))]:
    for target in re.findall(r'\]\(([^)\s]+)\)', page.read_text()):
      if re.match(r'[a-z]+:', target):  # https:, mailto:
        continue
      path, _, anchor = target.partition('#')
      linked = (page.parent / path).resolve() if path else page
      if not linked.exists():
        broken.append(f'{page.relative_to(REPO)}: {target} (no such file)')
      elif anchor and linked.suffix == '.md' and anchor not in _heading_anchors(linked.read_text()):
        broken.append(f'{page.relative_to(REPO)}: {target} (no such heading)')
  assert not broken, '\n'.join(broken)


_DOTTED = re.compile(r'(?<![\w/.-])(relpos(?:\.[A-Za-z_]\w*)+)')
_PATH = re.compile(r'(?<![\w/.-])((?:relpos|benchmarks|configs|tests)/[\w/]+\.(?:py|sh))\b')


def _names_something(dotted: str) -> bool:
  """Whether `dotted` (relpos.a.b.c) is a module of relpos or a name inside one."""
  parts = dotted.split('.')
  for split in range(len(parts), 0, -1):
    try:
      found = importlib.import_module('.'.join(parts[:split]))
    except ModuleNotFoundError:
      continue
    for attribute in parts[split:]:
      if not hasattr(found, attribute):
        return False
      found = getattr(found, attribute)
    return True
  return False


def test_every_relpos_name_in_the_docs_and_docstrings_exists():
  """Every dotted `relpos.x.y` that README.md, docs/, the package, the benchmarks and the
  config files mention is a module or a name in one, and every path of a module or script they
  name (relpos/training/loop.py) exists: code moved between modules (the faults,
  the signals, the command-line layer) left docstrings and pages pointing at its old home,
  which nothing else checks."""
  sources = [REPO / 'README.md', *sorted((REPO / 'docs').rglob('*.md'))]
  for folder in ('relpos', 'benchmarks', 'configs'):
    sources += sorted((REPO / folder).rglob('*.py'))
  missing = {}
  with warnings.catch_warnings():
    warnings.simplefilter('ignore', FutureWarning)  # relpos's old module names still resolve
    for source in sources:
      text, where = source.read_text(), str(source.relative_to(REPO))
      for match in _PATH.finditer(text):
        # "`benchmarks/dropout.py` of commit dd4a0a7": a file of the history, named as such.
        of_a_commit = re.match(r'`? (of|at) commit', text[match.end() :])
        if not of_a_commit and not (REPO / match[1]).exists():
          missing.setdefault(match[1], []).append(where)
      for dotted in set(_DOTTED.findall(text)):
        if not _names_something(dotted.rstrip('.')):
          missing.setdefault(dotted, []).append(where)
  assert not missing, '\n'.join(f'{name}: {", ".join(where)}' for name, where in missing.items())
