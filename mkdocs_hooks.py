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
"""MkDocs hooks: the site opens on the Quick start.

MkDocs makes ``index.md`` (the Guide) the site's home page. The Quick start
is published there instead, and the Guide at ``guide/``; the sources keep
their names, and links between pages (``quickstart.md``, ``index.md``)
resolve to the new addresses.
"""

HOME = 'quickstart.md'
MOVED = {HOME: ('index', 'index.html'), 'index.md': ('guide',
                                                      'guide/index.html')}


def on_files(files, config):
  """Publishes the Quick start as the home page and the Guide at guide/."""
  del config
  for file in files:
    if file.src_uri in MOVED:
      file.name, file.dest_uri = MOVED[file.src_uri]
      # Derived from dest_uri when first read; drop any computed already.
      for derived in ('url', 'abs_dest_path'):
        file.__dict__.pop(derived, None)
  return files
