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
"""``slow_tests.txt`` names tests that exist: a renamed test leaves it."""

import ast
import pathlib
import re

from absl.testing import absltest

import conftest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _defined(path: pathlib.Path) -> set[tuple[str, str]]:
  """``(class, method)`` of every test method in ``path``."""
  out = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.ClassDef):
      out |= {(node.name, f.name) for f in node.body
              if isinstance(f, ast.FunctionDef)}
  return out


class SlowListTest(absltest.TestCase):

  def test_every_listed_test_exists(self):
    missing = []
    defined = {}
    for node_id in sorted(conftest.slow_list()):
      file, cls, name = node_id.split('::')
      path = ROOT / file
      if not path.exists():
        missing.append(node_id)
        continue
      if file not in defined:  # Each file parsed once.
        defined[file] = _defined(path)
      methods = defined[file]
      # Parametrized cases add a suffix to the method's name (an index or
      # the case's name).
      if not any(c == cls and re.fullmatch(re.escape(m) + r'(_?\w*)?', name)
                 for c, m in methods):
        missing.append(node_id)
    self.assertEqual(missing, [])

  def test_the_list_is_not_empty(self):
    self.assertGreater(len(conftest.slow_list()), 100)


if __name__ == '__main__':
  absltest.main()
