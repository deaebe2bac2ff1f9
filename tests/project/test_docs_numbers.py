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
"""The step times, losses and memory the README and the docs quote are
their JSON rendered (``examples/quoted_results.py``), never typed."""

import json
import pathlib
import re
import sys
from unittest import mock

from absl.testing import absltest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / 'examples'))
import quoted_results  # noqa: E402  pylint: disable=g-import-not-at-top

# The pages that quote results, and their quotes.
QUOTES = {
    'README.md': ['eco_summary', 'step_cost_summary', 'precision_summary'],
    'docs/quickstart.md': ['step_cost_table', 'precision_summary'],
    'docs/comparison.md': ['peers_step_table', 'lowbit_quality_table'],
    'docs/index.md': ['leafwise_summary', 'positive_floor_effect'],
}
# A step time, a ratio, a memory size, a percentage or bytes per parameter,
# typed outside a quote.
_TYPED = re.compile(r'\b\d+(\.\d+)?\s*ms\b|\b\d+(\.\d+)?(-\d+(\.\d+)?)?x\b'
                    r'|\b\d+(\.\d+)?\s*MiB\b|[+-]?\d+(\.\d+)?\s*%'
                    r'|\b\d+(\.\d+)?\s+bytes per param')
# A table row whose cells after the first are all numbers: a results table.
_NUMBER_ROW = re.compile(r'^\|[^|\n]*(\|\s*-?\d+\.\d+\s*)+\|\s*$', re.M)


class QuotedResultsTest(absltest.TestCase):

  def test_every_quote_is_its_json_rendered(self):
    for page in quoted_results.PAGES:
      text = page.read_text()
      self.assertEqual(quoted_results.render(text), text,
                       f'{page.relative_to(ROOT)}: run python '
                       'examples/quoted_results.py')

  def test_step_times_are_quoted_not_typed(self):
    for name, expected in QUOTES.items():
      text = (ROOT / name).read_text()
      self.assertEqual(quoted_results.blocks(text), expected, name)
      outside = quoted_results.BLOCK.sub('', text)
      typed = [m.group(0) for m in _TYPED.finditer(outside)]
      self.assertEmpty(typed, f'{name} types results: {typed}')
      rows = _NUMBER_ROW.findall(outside)
      self.assertEmpty(rows, f'{name} types a results table: {rows}')

  def test_a_quote_follows_its_json(self):
    load = quoted_results._load  # pylint: disable=protected-access

    def slower(name):
      result = load(name)
      if name == 'bench_step':
        for row in result['rows']:
          if row['config'] == quoted_results.BASELINE:
            row['step_ms_median'] = 123.456
      return result

    with mock.patch.object(quoted_results, '_load', slower):
      self.assertIn('| `optax.adamw`, float32 | 123.46 ms |',
                    quoted_results.step_cost_table())
    baseline = {r['config']: r for r in json.loads(
        (ROOT / 'docs/results/bench_step.json').read_text())['rows']}[
            quoted_results.BASELINE]
    self.assertIn(f"{baseline['step_ms_median']:.2f} ms",
                  (ROOT / 'docs/quickstart.md').read_text())

  def test_eco_and_lowbit_quotes_follow_their_json(self):
    load = quoted_results._load  # pylint: disable=protected-access

    def changed(name):
      result = load(name)
      for row in result.get('summary', []):
        if row['config'] == 'fp8 ECO sr + m8/v4':
          row['bytes_per_param'], row['delta_pct'] = 9.876, 1.234
        if row['config'] == 'torchao AdamW4bit':
          row['ratio'] = 7.891
      return result

    with mock.patch.object(quoted_results, '_load', changed):
      eco = quoted_results.eco_summary()
      lowbit = quoted_results.lowbit_quality_table()
    self.assertIn('9.88 bytes per parameter', eco)
    self.assertIn('+1.23% from `bf16 w/ MW`', eco)
    self.assertIn('| torchao `AdamW4bit` | 5.27 | 7.89 |', lowbit)

  def test_unknown_quote_is_refused(self):
    with self.assertRaisesRegex(ValueError, 'unknown quote'):
      quoted_results.render('<!-- results: nope -->\n<!-- /results -->')


if __name__ == '__main__':
  absltest.main()
