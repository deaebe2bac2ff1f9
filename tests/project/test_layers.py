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
"""The layers of ``optax_q/_src``: every import runs down or within a layer.

``optax_q._src.LAYERS`` names, for each sub-package, the sub-packages it may
import; the QAT/PTQ tools (``optax_q.quant``) count as the layer
``quant``. Imports inside functions count as much as those at the top.
"""

import ast
import pathlib

from absl.testing import absltest

import optax_q
from optax_q import _src

PACKAGE = pathlib.Path(optax_q.__file__).parent


def _layer(module: str) -> str | None:
  """The layer of a dotted module name of optax_q, None for the package."""
  parts = module.split('.')
  if parts[:2] == ['optax_q', 'quant']:
    return 'quant'
  if parts[:2] == ['optax_q', '_src'] and len(parts) > 2:
    return parts[2]
  return None


def _imports(path: pathlib.Path) -> list[tuple[int, str]]:
  """``(line, module)`` of every optax_q import in ``path``."""
  out = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      names = [node.module + '.' + a.name for a in node.names]
      out += [(node.lineno, n) for n in names if n.startswith('optax_q')]
    elif isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names
              if a.name.startswith('optax_q')]
  return out


def wrong_way_imports() -> list[str]:
  """Every import that runs up a layer or sideways, as readable lines."""
  problems = []
  sources = sorted((PACKAGE / '_src').rglob('*.py')) + sorted(
      (PACKAGE / 'quant').rglob('*.py'))
  for path in sources:
    rel = path.relative_to(PACKAGE.parent)
    here = _layer('.'.join(rel.with_suffix('').parts))
    if here is None:
      continue
    for line, module in _imports(path):
      there = _layer(module)
      if there is None and module.startswith('optax_q._src'):
        continue  # The layer map itself.
      if there is None:
        problems.append(f'{rel}:{line} imports {module} (the public package)')
      elif there != here and there not in _src.LAYERS[here]:
        problems.append(f'{rel}:{line} ({here}) imports {module} ({there})')
  return problems


class LayersTest(absltest.TestCase):

  def test_every_sub_package_has_a_layer(self):
    packages = {p.name for p in (PACKAGE / '_src').iterdir()
                if (p / '__init__.py').exists()}
    self.assertEqual(packages | {'quant'}, set(_src.LAYERS))

  def test_every_sub_package_says_what_it_holds(self):
    for name in _src.LAYERS:
      init = (PACKAGE / 'quant' / '_src' / '__init__.py' if name == 'quant'
              else PACKAGE / '_src' / name / '__init__.py')
      self.assertIsNotNone(ast.get_docstring(ast.parse(init.read_text())),
                           name)

  def test_no_module_at_the_top_of_src(self):
    self.assertEqual(
        sorted(p.name for p in (PACKAGE / '_src').glob('*.py')),
        ['__init__.py'])

  def test_imports_run_down_the_layers(self):
    self.assertEqual(wrong_way_imports(), [])

  def test_the_check_sees_a_wrong_way_import(self):
    # The checker itself: an import up a layer is found.
    self.assertEqual(_layer('optax_q._src.dropins.alias'), 'dropins')
    self.assertNotIn('dropins', _src.LAYERS['state'])
    self.assertNotIn('execution', _src.LAYERS['codec'])


if __name__ == '__main__':
  absltest.main()
