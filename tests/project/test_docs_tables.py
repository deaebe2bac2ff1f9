# Copyright 2026 The optax_q Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Every markdown table of the documentation is a table: as many header
cells as separator cells as cells in each row (a ``|`` inside a cell, not
escaped and not in a code span, splits it and the page shows raw text)."""

import pathlib
import re

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / 'docs').rglob('*.md')) + [ROOT / 'README.md']
_SEPARATOR = re.compile(r'^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$')


def split_row(line: str) -> list[str]:
  """A table row's cells, as Python-Markdown splits them: on ``|`` outside
  code spans and not escaped, without the outer pipes."""
  cells, cell, code, i = [], '', 0, 0
  while i < len(line):
    c = line[i]
    if c == '\\' and i + 1 < len(line):
      cell += line[i:i + 2]
      i += 2
      continue
    if c == '`':
      run = len(line[i:]) - len(line[i:].lstrip('`'))
      code = 0 if code == run else (run if not code else code)
      cell += line[i:i + run]
      i += run
      continue
    if c == '|' and not code:
      cells.append(cell)
      cell = ''
    else:
      cell += c
    i += 1
  cells.append(cell)
  stripped = line.strip()
  if stripped.startswith('|'):
    cells = cells[1:]
  if stripped.endswith('|') and not stripped.endswith('\\|'):
    cells = cells[:-1]
  return [c.strip() for c in cells]


def tables(text: str):
  """(line number, header, separator, rows) of each table outside fences."""
  lines, fence, i = text.split('\n'), False, 0
  while i < len(lines):
    line = lines[i]
    if line.lstrip().startswith(('```', '~~~')):
      fence = not fence
    elif (not fence and line.lstrip().startswith('|') and i + 1 < len(lines)
          and _SEPARATOR.match(lines[i + 1].strip())):
      j = i + 2
      while j < len(lines) and lines[j].lstrip().startswith('|'):
        j += 1
      yield (i + 1, split_row(line), split_row(lines[i + 1]),
             [split_row(r) for r in lines[i + 2:j]])
      i = j
      continue
    i += 1


class TablesTest(absltest.TestCase):

  def test_split_row(self):
    self.assertEqual(split_row('| a | `|x|` | b \\| c |'),
                     ['a', '`|x|`', 'b \\| c'])
    self.assertLen(split_row('| mu | |u| > 10 max |'), 4)

  def test_every_table_has_as_many_cells_in_every_row(self):
    count = 0
    for page in PAGES:
      for line, header, separator, rows in tables(page.read_text()):
        where = f'{page.relative_to(ROOT)}:{line}'
        count += 1
        self.assertLen(separator, len(header), where)
        for k, row in enumerate(rows):
          self.assertLen(row, len(header), f'{where} row {k + 1}: {row}')
    self.assertGreater(count, 100)  # the results pages' tables are found

  def test_eco_pages_fit_the_column_and_say_their_targets(self):
    # At most six columns a table (the content column shows about that many
    # of these), and targets as sentences, not JSON. A third table where the
    # result has fidelity.
    for name in ('eco', 'eco_first_moment', 'eco_long'):
      text = (ROOT / 'docs' / 'results' / f'{name}.md').read_text()
      found = list(tables(text))
      self.assertLen(found, 3 if '| norm ratio |' in text else 2, name)
      for _, header, _, _ in found:
        self.assertLessEqual(len(header), 6, name)
      self.assertNotIn('{"', text, name)

  def test_wide_study_pages_fit_the_column_and_say_their_claims(self):
    # The pages whose tables had 12 and 14 columns: at most seven a table,
    # and their claims and settings as sentences, not Python or JSON dicts.
    for name, count in (('optimizers_quantization', 5), ('bits', 5)):
      text = (ROOT / 'docs' / 'results' / f'{name}.md').read_text()
      found = list(tables(text))
      self.assertLen(found, count, name)
      for line, header, _, _ in found:
        self.assertLessEqual(len(header), 7, f'{name}.md:{line}')
      for brace in ('{"', "{'"):
        self.assertNotIn(brace, text, name)

if __name__ == '__main__':
  absltest.main()
