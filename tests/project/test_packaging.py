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
"""What ``pip install`` puts on a user's machine: the library, its license.

``models/`` is a folder of the repository for the examples and tests, not a
package to install: a top-level ``models`` would clash with users' own.
"""

import importlib.metadata
import pathlib

from absl.testing import absltest

try:
  import tomllib  # pylint: disable=g-import-not-at-top
except ImportError:  # Python 3.10
  tomllib = None

_ROOT = pathlib.Path(__file__).resolve().parents[2]


def _pyproject():
  if tomllib is None:
    raise absltest.SkipTest('tomllib needs Python 3.11')
  return tomllib.loads((_ROOT / 'pyproject.toml').read_text())


def _installed():
  """The installed ``optax_q`` distributions (those with a ``RECORD``)."""
  dists = [d for d in importlib.metadata.distributions(name='optax_q')
           if d.read_text('RECORD') is not None]
  if not dists:
    raise absltest.SkipTest('optax_q is not installed')
  return dists


class PackagingTest(absltest.TestCase):

  def test_only_optax_q_is_found(self):
    try:
      import setuptools  # pylint: disable=g-import-not-at-top
    except ImportError:
      self.skipTest('setuptools is not installed')
    find = _pyproject()['tool']['setuptools']['packages']['find']
    packages = setuptools.find_packages(
        str(_ROOT / find.get('where', ['.'])[0]),
        include=find.get('include', ['*']), exclude=find.get('exclude', []))
    self.assertIn('optax_q', packages)
    self.assertIn('optax_q._src', packages)
    self.assertEqual([p for p in packages if p.split('.')[0] != 'optax_q'],
                     [])

  def test_installed_distribution_has_no_models_package(self):
    for dist in _installed():
      top_level = (dist.read_text('top_level.txt') or '').split()
      self.assertEqual(top_level, ['optax_q'])
      # RECORD lists every installed file (for an editable install, only the
      # hook that maps `optax_q` to the checkout).
      self.assertEqual(
          [str(f) for f in dist.files or () if f.parts[0] == 'models'], [])

  def test_license(self):
    text = (_ROOT / 'LICENSE').read_text()
    self.assertTrue(text.lstrip().startswith(
        'Apache License\n                           Version 2.0, January 2004'))
    self.assertIn('TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND '
                  'DISTRIBUTION', text)
    self.assertIn('END OF TERMS AND CONDITIONS', text)
    project = _pyproject()['project']
    self.assertEqual(project['license'], 'Apache-2.0')
    self.assertEqual(project['license-files'], ['LICENSE'])

  def test_installed_license(self):
    for dist in _installed():
      self.assertEqual(dist.metadata['License-Expression'], 'Apache-2.0')
      self.assertIn('LICENSE', dist.metadata.get_all('License-File'))


if __name__ == '__main__':
  absltest.main()
