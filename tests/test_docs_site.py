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
"""The documentation site's sources: every page in the navigation, every
public name in the API reference (the strict build itself runs in CI)."""

import pathlib
import re

from absl.testing import absltest
import optax_q
import optax_q.quant

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / 'docs'


def _nav_pages() -> set[str]:
  config = (ROOT / 'mkdocs.yml').read_text()
  nav = config[config.index('\nnav:'):]
  return set(re.findall(r':\s*(\S+\.md)\s*$', nav, flags=re.M))


class DocsSiteTest(absltest.TestCase):

  def test_every_page_is_in_the_navigation(self):
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob('*.md')}
    self.assertEmpty(pages - _nav_pages())
    self.assertEmpty(_nav_pages() - pages)

  def test_every_public_name_in_the_api_reference(self):
    api = (DOCS / 'api.md').read_text()
    entries = re.findall(r'^::: (\S+)\s*$', api, flags=re.M)
    for module in (optax_q, optax_q.quant):
      listed = {e.rpartition('.')[2] for e in entries
                if e.rpartition('.')[0] == module.__name__}
      self.assertEqual(listed, set(module.__all__), module.__name__)
    expected = {f'{m.__name__}.{n}' for m in (optax_q, optax_q.quant)
                for n in m.__all__}
    self.assertEmpty(set(entries) - expected)

  def test_changelog_included(self):
    self.assertIn('--8<-- "CHANGELOG.md"', (DOCS / 'changelog.md').read_text())
    self.assertIn('## Unreleased', (ROOT / 'CHANGELOG.md').read_text())


if __name__ == '__main__':
  absltest.main()
