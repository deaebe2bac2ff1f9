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
"""Runs the examples in the library's docstrings."""

import doctest
import importlib
import pkgutil

from absl.testing import absltest
from absl.testing import parameterized

import optax_q
import optax_q._src

# Every module of the implementation, in every layer's sub-package, and of
# the QAT/PTQ package (its modules import Flax and SciPy: the test extra has
# them).
MODULES = sorted(
    m.name for package in (optax_q._src, optax_q.quant)
    for m in pkgutil.walk_packages(package.__path__, f'{package.__name__}.')
)


class DocstringExamplesTest(parameterized.TestCase):

  @parameterized.named_parameters((name.replace('.', '_'), name)
                                  for name in MODULES)
  def test_examples(self, name):
    module = importlib.import_module(name)
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    self.assertEqual(result.failed, 0, f'{result.failed} failed in {name}')

  def test_every_layer_is_walked(self):
    # The sub-packages' modules, not only their __init__ files.
    self.assertIn('optax_q._src.state.transform', MODULES)
    self.assertIn('optax_q._src.dropins.alias', MODULES)
    self.assertIn('optax_q.quant._src.quantizers', MODULES)


if __name__ == '__main__':
  absltest.main()
