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
"""Every test process runs on 8 simulated CPU devices; the slow list.

XLA reads ``--xla_force_host_platform_device_count`` when it first creates
the CPU backend. pytest imports this file before any test module (in every
pytest-xdist worker too), so the flag is set before anything imports jax,
and the mesh tests run in the same processes as all the others: no test
module sets the flag itself or runs itself again in a subprocess.

The processes of one run share a compilation cache (JAX's persistent
cache, in a temporary folder made for the run and removed after it): the
tests compile the same steps, encoders and kernels again and again under
new function objects, and a process finds what another compiled. It holds
nothing between runs, so each run compiles from scratch once.

``slow_tests.txt`` lists the tests that run only with ``-m slow``, besides
those marked in their files: the default suite (the README command) keeps
one fast case of each family, and ``python -m pytest -m slow`` runs the
rest, so that every assertion runs in one of the two.
"""

import atexit
import os
import pathlib
import shutil
import tempfile

import pytest

FLAG = '--xla_force_host_platform_device_count=8'
if FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' ' + FLAG).strip()

# Made by the first process of the run (pytest, or pytest-xdist's controller,
# before it starts the workers, which inherit the environment), removed by
# it at exit. A cache folder given by the caller is used as it is.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix='optax_q-tests-jax-cache-')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _CACHE
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0')
os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES', '0')

SLOW_LIST = pathlib.Path(__file__).with_name('slow_tests.txt')


def slow_list() -> set[str]:
  """The node ids of ``slow_tests.txt`` (comments and blanks left out)."""
  lines = SLOW_LIST.read_text().splitlines()
  return {line.split('#')[0].strip() for line in lines} - {''}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  """Marks the listed tests slow, before ``-m`` deselects by marker."""
  del config  # Unused.
  listed = slow_list()
  for item in items:
    if item.nodeid in listed:
      item.add_marker(pytest.mark.slow)
