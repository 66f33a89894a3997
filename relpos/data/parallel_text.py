"""Parallel text: one sentence per line in a source file and a target file, either possibly
compressed (gzip, bzip2, xz, a zip of one file; recognised by content, not name).

Lines are split on '\\n' only (a trailing '\\r' is removed: `relpos.files.split_lines`), never
on the other line breaks Unicode knows, so a U+2028 inside a sentence cannot shift one side
against the other. A file whose lines end in a bare '\\r' (classic Mac OS) is refused, naming
its line endings (`check_line_endings`): read as one line, it was refused later for its length
or line count, with a remedy that could not help. So is a file whose NUL bytes say it is UTF-16
without a byte order mark (`check_not_utf16`): ASCII text in UTF-16 is valid UTF-8 with a NUL
after (or before) each character, and was read as such, a line more or less than its other side.
Two sides that differ in line count are refused, and the line names what in either file splits
lines otherwise than meant (`line_count_causes`): bare '\\r's among '\\n' endings (a file of
mixed line endings held 40 sentences in 27 lines, which was all it said), and empty lines at
the end of the longer side. A '\\r' inside a line
of files that do line up is read as part of the sentence. A pair with an empty or whitespace-
only side is dropped, and the warning names the first lines dropped.
"""

import itertools
import pathlib
import re
import shlex
import unicodedata
from collections.abc import Iterable, Sequence

from sacremoses import MosesDetokenizer

from relpos.data.data_file import (
  decode_lines,
  decompress_command,
  read_data_file,
  refuse_dangling_link,
  refuse_pipe,
)
from relpos.data.shard import ONE_PROCESS, Shard
from relpos.languages import primary_language
from relpos.messages import warn


def read_lines(path, *, field: str | None = None) -> list[str]:
  """The UTF-8 lines of the text file at `path`, decompressed if it is compressed (gzip,
  bzip2, xz or a zip of one file, whatever its name: `relpos.data.data_file.read_data_file`).

  Prints a warning if most of its non-empty lines hold a tab or start with SGML/XML markup
  (`warn_if_not_plain_text`).

  Args:
    path: str or Path.
    field: the config field that named `path` (e.g. 'config.data.train_src'), for messages.
  Raises:
    FileNotFoundError: `path` is not a file.
    ValueError: `path` is a pipe (`refuse_pipe`); the file is a truncated or corrupt
      compressed file, a zip of several files, not valid UTF-8 (the message has the line),
      its lines end in a bare '\\r', or it looks like UTF-16 (`check_not_utf16`).
  """
  path = pathlib.Path(path)
  refuse_pipe(path, field)
  if not path.is_file():
    refuse_dangling_link(path, field)
    named = f'{field} = ' if field else ''
    raise FileNotFoundError(f'{named}{str(path)!r} is not a file; set it to a text file')
  data = read_data_file(path)
  check_not_utf16(data, path, field)
  check_line_endings(data, path, field)
  lines = decode_lines(data, path)
  warn_if_not_plain_text(lines, path, field)
  return lines


LINE_ENDING_SAMPLE = 1 << 16  # bytes looked at for a file's line endings: its first


def check_line_endings(data: bytes, path, field: str | None = None) -> None:
  """Raises ValueError if the file at `path` (its bytes `data`) ends its lines in a bare
  carriage return, as classic Mac OS wrote text: its first LINE_ENDING_SAMPLE bytes hold more
  than one '\\r' and no '\\n'. Split on '\\n', such a file is one line (a whole eval set
  read as one pair too long for config.data.max_length, a training side as one sentence
  SentencePiece skips); a sentence longer than the sample has no business in either."""
  head = data[:LINE_ENDING_SAMPLE]
  carriage_returns = head.count(b'\r')
  if b'\n' in head or carriage_returns < 2:
    return
  named = f' ({field})' if field else ''
  raise ValueError(
    f"{path}{named} ends its lines in a bare carriage return ('\\r', classic Mac OS line "
    f"endings: {carriage_returns:,} of them and no '\\n' in its first {len(head):,} bytes), so "
    "it reads as one line; lines must end in '\\n' (or '\\r\\n'): convert it, e.g. "
    f'`{_carriage_returns_to_newlines(path)}`, and give that file'
  )


def _converted(path, convert: str) -> str:
  """The shell command that writes the text of the file at `path` (decompressed first, where it
  is compressed) through the filter `convert` to fixed.txt: a remedy's conversion."""
  decompress = decompress_command(path)
  if decompress:
    return f'{decompress} | {convert} > fixed.txt'
  return f'{convert} < {shlex.quote(str(path))} > fixed.txt'


def _carriage_returns_to_newlines(path) -> str:
  """`_converted` with each '\\r' made a '\\n'."""
  return _converted(path, "tr '\\r' '\\n'")


NUL_SAMPLE = 1 << 12  # bytes looked at for the NULs of UTF-16: a file's first


def check_not_utf16(data: bytes, path, field: str | None = None) -> None:
  """Raises ValueError if the file at `path` (its bytes `data`) looks like UTF-16: a quarter or
  more of its first NUL_SAMPLE bytes are NUL, most of them at odd offsets (UTF-16LE: 'a\\0')
  or most at even ones (UTF-16BE: '\\0a'). Without a byte order mark, ASCII text so encoded
  is valid UTF-8 and was read as text with a NUL beside each character: a line count off by
  one against its other side, or sentences of NULs. A text file holds no NUL at all, so the
  threshold only keeps a stray one from being called an encoding."""
  head = data[:NUL_SAMPLE]
  odd, even = head[1::2].count(0), head[0::2].count(0)
  if (odd + even) * 4 < len(head) or not head:
    return
  encoding = 'UTF-16LE' if odd > even else 'UTF-16BE'
  named = f' ({field})' if field else ''
  convert = _converted(path, f'iconv -f {encoding} -t UTF-8')
  raise ValueError(
    f'{path}{named} holds NUL bytes ({odd + even:,} of its first {len(head):,}, at '
    f'{"odd" if odd > even else "even"} offsets): it looks like {encoding} text, not UTF-8; '
    f'convert it, e.g. `{convert}`, and give that file'
  )


def line_count_causes(path, lines: Sequence[str], other_count: int) -> str:
  """What in the file at `path` (its `lines`, as `read_lines` split them) splits its lines
  otherwise than meant, for the message of a line count that differs from its other side's
  (`other_count` lines): empty lines at its end where it is the longer side (a file ending in
  '\\n\\n', as editors and `echo >>` leave it), and its bare carriage returns ('\\r' inside a
  line; `read_lines` removed those of '\\r\\n'), Mac OS line endings mixed in among '\\n' ones,
  with the remedy `check_line_endings` gives; '' for none."""
  return _trailing_empty_lines(path, lines, other_count) + _bare_carriage_returns(path, lines)


def _trailing_empty_lines(path, lines: Sequence[str], other_count: int) -> str:
  """'; <path> ends in N empty lines ...' where the longer side `lines` does; '' otherwise."""
  trailing = sum(1 for _ in itertools.takewhile(lambda line: not line.strip(), reversed(lines)))
  if len(lines) <= other_count or not trailing:
    return ''
  if trailing == 1:
    return f"; {path}'s last line is empty (the file ends in a blank line): remove it"
  return (
    f'; the last {trailing} lines of {path} are empty (the file ends in blank lines): remove them'
  )


def _bare_carriage_returns(path, lines: Sequence[str]) -> str:
  """The bare carriage returns of `line_count_causes`; '' for none."""
  bare = sum(line.count('\r') for line in lines)
  if not bare:
    return ''
  held = sum('\r' in line for line in lines)
  return (
    f"; {path} holds {bare:,} bare carriage returns ('\\r' not followed by '\\n', in "
    f'{held:,} of its {len(lines):,} lines), which end no line here: if they end sentences '
    "(classic Mac OS line endings mixed with '\\n' ones), convert them, e.g. "
    f'`{_carriage_returns_to_newlines(path)}`, and give that file'
  )


# A line that starts with an SGML/XML tag or declaration: WMT's `<seg id="1">...</seg>`,
# `<doc ...>`, `</doc>`, `<srcset ...>`, `<p>`, `<?xml ...?>`.
_MARKUP = re.compile(r'\s*<(?:[/?!]|[A-Za-z][\w.:-]*(?:[\s/>]|$))')


def warn_if_not_plain_text(lines: Sequence[str], path, field: str | None = None) -> None:
  """Prints one warning line per cause if more than half of the non-empty `lines` of `path`
  are not sentences: they hold a tab between other characters (a file of tab-separated pairs
  such as Tatoeba's export, given as one side; a tab padding a line's end is no pair), or they
  start with SGML/XML markup (a WMT test set as released, `newstest2014-deen-src.en.sgm`).
  Either would otherwise be read as sentences (training on 'English<TAB>German', scoring
  `<doc ...>` lines as references) without a word."""
  nonempty = [line for line in lines if line.strip()]
  named = f' ({field})' if field else ''
  plain = 'each side must be a plain text file with one sentence per line'
  tabbed = sum('\t' in line.strip() for line in nonempty)  # not padding: ' \t' at the end
  if tabbed * 2 > len(nonempty):
    warn(
      f'{path}{named}: {tabbed} of its {len(nonempty)} non-empty lines hold a tab; {plain} '
      '(a Tatoeba export of tab-separated pairs goes through '
      '`python -m relpos.data.prepare tatoeba --zip=...`)',
    )
  marked_up = sum(bool(_MARKUP.match(line)) for line in nonempty)
  if marked_up * 2 > len(nonempty):
    warn(
      f'{path}{named}: {marked_up} of its {len(nonempty)} non-empty lines start with SGML/XML '
      f'markup (<seg>, <doc>); {plain}: extract the <seg> contents, or take the plain text '
      'from sacrebleu (e.g. `sacrebleu -t wmt14 -l en-de --echo src`, `--echo ref`)',
    )


DROPPED_NAMED = 5  # dropped pairs a warning names by number; the rest it counts


def keep_nonempty(
  pairs: Iterable[tuple[str, str]],
  *,
  limit: int = 0,
  name: str,
  numbers: Iterable[int] | None = None,
  unit: str = 'line',
) -> tuple[list[str], list[str]]:
  """(sources, targets) of the pairs whose sides both hold a non-space character.

  The warning of those dropped names the first DROPPED_NAMED by number, 1-based ('lines 3, 17
  and 2 more'): an eval set's translations file holds a line per pair kept, so it lines up
  with its eval_src again only with those lines left out.

  Args:
    pairs: (source, target) strings.
    limit: keep only the first `limit` such pairs (0: all); `pairs` is read no further.
    name: what the pairs are, for the warning about dropped pairs.
    numbers: the 0-based position of each pair in its files (a shard reads every other
      line, say); default: the pairs' own order.
    unit: what a position counts, for the warning ('line' of a file, 'record' of a dataset).
  """
  sources, targets = [], []
  dropped = []
  positions = itertools.count() if numbers is None else numbers
  for number, (source, target) in zip(positions, pairs, strict=False):  # count() has no end
    if limit and len(sources) == limit:
      break
    if source.strip() and target.strip():
      sources.append(source)
      targets.append(target)
    else:
      dropped.append(number + 1)
  if dropped:
    named = ', '.join(map(str, dropped[:DROPPED_NAMED]))
    more = f' and {len(dropped) - DROPPED_NAMED} more' if len(dropped) > DROPPED_NAMED else ''
    plural = 's' if len(dropped) > 1 else ''
    warn(
      f'{name}: dropped {len(dropped)} pair{plural} with an empty side ({unit}{plural} '
      f'{named}{more})',
      once=True,  # train.py reads the eval files for its validation and again to score
    )
  return sources, targets


# A training split of at least this many pairs is loaded with a line before each long phase
# (reading, SentencePiece training, encoding: `relpos.data.translation`), and one of text files
# of at least ANNOUNCED_BYTES (about that many pairs of Tatoeba-like sentences, 70 to 90 bytes a
# pair) before it is read, when its pairs are not counted yet: on a million pairs those phases
# ran for over 20 s (docs/translation.md) with nothing on the screen. Fewer pairs load in
# seconds, silently (tiny runs and tests print what they did before).
ANNOUNCED_PAIRS = 100_000
ANNOUNCED_BYTES = 8 << 20


def read_parallel(
  src_path,
  tgt_path,
  *,
  fields: tuple[str, str] | None = None,
  limit: int = 0,
  shard: Shard = ONE_PROCESS,
) -> tuple[list[str], list[str]]:
  """(source lines, target lines) of two line-aligned files, pairs with an empty side dropped.

  Args:
    src_path, tgt_path: str or Path; compressed files are decompressed (`read_lines`).
    fields: the config fields that named the two paths, for messages.
    limit: keep only the first `limit` non-empty pairs (0: all); a shard keeps its part,
      `shard.limit(limit)`, of its own lines.
    shard: keep only this process's lines (every line is still read, to check alignment).
  Raises:
    FileNotFoundError: a path is not a file.
    ValueError: a file is not valid UTF-8, or a broken compressed file, or the files differ
      in line count.
  """
  src_field, tgt_field = fields or (None, None)
  paths = [pathlib.Path(path) for path in (src_path, tgt_path)]
  sizes = [path.stat().st_size for path in paths if path.is_file()]  # `read_lines` names others
  if sum(sizes) >= ANNOUNCED_BYTES:
    print(f'reading {src_path} and {tgt_path} ({sum(sizes) / 1e6:,.0f} MB)', flush=True)
  sources = read_lines(src_path, field=src_field)
  targets = read_lines(tgt_path, field=tgt_field)
  if len(sources) != len(targets):
    raise ValueError(
      f'parallel files differ in line count: {src_path} has {len(sources)} lines, '
      f'{tgt_path} has {len(targets)}; they must be line-aligned'
      + line_count_causes(src_path, sources, len(targets))
      + line_count_causes(tgt_path, targets, len(sources))
    )
  lines = shard.records(len(sources))
  return keep_nonempty(
    ((sources[i], targets[i]) for i in lines),
    limit=shard.limit(limit),
    name=f'{src_path} / {tgt_path}',
    numbers=lines,
  )


# Signs of Moses tokenisation: its XML escapes, and punctuation split off from the word before
# it ('word .'); raw text has the punctuation attached ('word.').
_MOSES_ESCAPE = re.compile(r'&(?:apos|quot|amp|lt|gt|#124|#91|#93);')
_SPLIT_PUNCTUATION = re.compile(r'\w [.,!?;:](?: |$)')
_ATTACHED_PUNCTUATION = re.compile(r'\w[.,!?;:](?: |$)')
MOSES_SAMPLE_LINES = 10_000  # lines looked at: the first of a file


def warn_of_moses_tokenization(lines: Sequence[str], name: str, *, detokenize: bool) -> None:
  """Prints one warning line (once a process: train.py reads the eval files for its validation
  and again to score) where config.data.moses_detokenize (`detokenize`) does not fit what
  `lines` (named `name`, e.g. 'file (config.data.eval_src)') show of Moses tokenisation, in
  their first MOSES_SAMPLE_LINES: its XML escapes (`&apos;`, `&quot;`, `&amp;`, ...), and
  punctuation split off from the word before it ('word .') against attached ('word.').

  - `detokenize` True, and no escape with more punctuation attached than split off: raw
    text, which detokenising alters (`the 'Grub'` -> `the'Grub'`, `Watzke .` -> `Watzke.`),
    references altered so being scored against in silence.
  - `detokenize` False, and escapes with no more punctuation attached than split off: Moses
    output, trained on and scored as it is, so BLEU counts `&quot;` and split-off
    punctuation as words, against tokenised references: no score sacreBLEU gives on raw text.

  One rule, read both ways; text that shows neither (no punctuation, or escapes in raw text,
  say) gets no warning. On OpenNMT's toy-ende (tokenised) over 90% of lines have split
  punctuation and a tenth an escape; on raw newstest2014 none has an escape and under 0.1%
  split punctuation."""
  sample = lines[:MOSES_SAMPLE_LINES]
  escaped = sum(bool(_MOSES_ESCAPE.search(line)) for line in sample)
  unescaped = [_MOSES_ESCAPE.sub(' ', line) for line in sample]  # `&quot;` is no 't;'
  split = sum(bool(_SPLIT_PUNCTUATION.search(line)) for line in unescaped)
  attached = sum(bool(_ATTACHED_PUNCTUATION.search(line)) for line in unescaped)
  punctuation = (
    f'{attached} of {len(sample)} lines have punctuation attached to a word, {split} split off'
  )
  if detokenize and not escaped and attached > split:
    warn(
      f'{name}: config.data.moses_detokenize=True, but its text shows no Moses tokenisation '
      f'(no &apos;/&quot;/&amp; escapes; {punctuation}), and detokenising raw text alters it; '
      'give config.data.moses_detokenize=False for this data (eval.py takes it for other eval '
      'files)',
      once=True,
    )
  elif not detokenize and escaped and attached <= split:
    warn(
      f'{name}: config.data.moses_detokenize=False, but its text shows Moses tokenisation '
      f'({escaped} of {len(sample)} lines hold &apos;/&quot;/&amp;-style escapes; '
      f'{punctuation}), so it is trained on and scored as escaped, tokenised text, not as '
      'sacreBLEU scores raw text; give config.data.moses_detokenize=True for this data (eval.py '
      'takes it for other eval files)',
      once=True,
    )


def warn_if_not_nfc(references: Sequence[str], name: str) -> None:
  """Prints one warning line (once a process) if some of `references` (named `name`, e.g.
  'file (config.data.eval_tgt)') change under Unicode NFC (decomposed accents: 'a' + U+0308
  for 'ä'), saying how many. Translations come out NFKC-normalised, NFC included
  (SentencePiece's nmt_nfkc normalises the text it is trained on, so its pieces decode
  composed), so they score lower against such references as given: a model that reproduces
  NFD newstest2014.de[:300] exactly scored 90.18 against the NFC references and 72.37 against
  the NFD ones. The references are not changed here: sacreBLEU against the references as given
  is the standard, and the remedy (normalising them) is the user's to choose and report."""
  changed = sum(not unicodedata.is_normalized('NFC', line) for line in references)
  if changed:
    warn(
      f'{name}: {changed} of {len(references)} references ({changed / len(references):.0%}) '
      'change under Unicode NFC (decomposed characters), while translations come out composed '
      "(SentencePiece's NFKC normalisation), so BLEU against these references as given is "
      'lower than against NFC ones; to compare with scores on NFC references, normalise them '
      "(e.g. `uconv -x any-nfc`, or Python's unicodedata.normalize('NFC', line)) and give that "
      'file',
      once=True,
    )


def moses_detokenize(lines: Sequence[str], lang: str) -> list[str]:
  """Moses-detokenised `lines` ('it &apos;s .' -> "it's."), XML escapes undone.

  Args:
    lines: Moses-tokenised sentences, tokens separated by spaces.
    lang: language code for the detokeniser's rules, e.g. 'en', 'de', read as BLEU reads it
      (`relpos.languages.primary_language`): sacremoses knows only the exact two-letter codes
      of the languages it has rules of, and gave 'EN', 'en-US' or 'eng' its
      language-independent rules, silently ("It 's" left apart).
  """
  detokenizer = MosesDetokenizer(primary_language(lang))
  return [detokenizer.detokenize(line.split()) for line in lines]
