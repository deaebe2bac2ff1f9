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

import optax_q._src

MODULES = sorted(m.name for m in pkgutil.iter_modules(optax_q._src.__path__))


class DocstringExamplesTest(parameterized.TestCase):

  @parameterized.parameters(*MODULES)
  def test_examples(self, name):
    module = importlib.import_module(f'optax_q._src.{name}')
    result = doctest.testmod(
        module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    self.assertEqual(result.failed, 0, f'{result.failed} failed in {name}')


if __name__ == '__main__':
  absltest.main()
