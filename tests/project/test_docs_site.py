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
import shutil
import tempfile

from absl.testing import absltest
import optax_q
import optax_q.quant

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


class SiteStructureTest(absltest.TestCase):
  """The site opens on the Quick start; results grouped and described; the
  changelog's sections each once."""

  def test_site_opens_on_the_quick_start(self):
    # pylint: disable=g-import-not-at-top
    from mkdocs.structure.files import File, Files
    import mkdocs_hooks
    site = tempfile.mkdtemp()  # Never written to.
    self.addCleanup(shutil.rmtree, site)
    files = Files([File(name, str(DOCS), site, True)
                   for name in ('quickstart.md', 'index.md', 'howto.md')])
    files = mkdocs_hooks.on_files(files, config=None)
    urls = {f.src_uri: f.url for f in files}
    self.assertEqual(urls, {'quickstart.md': './', 'index.md': 'guide/',
                            'howto.md': 'howto/'})
    config = (ROOT / 'mkdocs.yml').read_text()
    self.assertIn('hooks:\n  - mkdocs_hooks.py', config)
    nav = config[config.index('\nnav:'):]
    self.assertEqual(re.findall(r'\S+\.md', nav)[0], 'quickstart.md')

  def test_results_are_grouped_titled_and_described(self):
    index = (DOCS / 'results' / 'index.md').read_text()
    listed = re.findall(r'^\| \[([^\]]+)\]\(([^)]+\.md)\) \| (.+) \|$',
                        index, flags=re.M)
    pages = {p.name for p in (DOCS / 'results').glob('*.md')} - {'index.md'}
    self.assertCountEqual([page for _, page, _ in listed], pages)
    config = (ROOT / 'mkdocs.yml').read_text()
    results = config[config.index('  - Results:'):config.index('  - Changelog')]
    for title, page, description in listed:
      self.assertNotEqual(title, page[:-3])
      self.assertGreater(len(description.split()), 3, page)
      # Under a group of the navigation, with the index's title.
      self.assertIn(f'          - "{title}": results/{page}\n', results)

  def test_changelog_sections_appear_once_each(self):
    text = (ROOT / 'CHANGELOG.md').read_text()
    for release in re.split(r'^## ', text, flags=re.M)[1:]:
      headings = re.findall(r'^### (.+)$', release, flags=re.M)
      self.assertEqual(len(headings), len(set(headings)),
                       release.split('\n')[0])


if __name__ == '__main__':
  absltest.main()
