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
"""Tests on 8 simulated CPU devices.

XLA reads ``--xla_force_host_platform_device_count`` when the CPU backend is
first created, so a test module imports this module before jax, which sets
the flag. Under pytest (and pytest-xdist) another module may have created
the backend first, with fewer devices: then the module's mesh tests skip in
that process (:func:`skip_unless_8_devices`) and its subprocess test
(:func:`run_in_8_device_process`) runs them again in a fresh interpreter,
so they always run somewhere.
"""

import os
import subprocess
import sys

FLAG = '--xla_force_host_platform_device_count=8'
if FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' ' + FLAG).strip()

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax  # noqa: E402


def skip_unless_8_devices(test) -> None:
  """Skips ``test`` in a process that has fewer than 8 devices."""
  if jax.device_count() < 8:
    test.skipTest(
        f'jax was initialised with {jax.device_count()} device(s) before '
        'this module set XLA_FLAGS; its subprocess test runs these tests in '
        'a fresh process with 8 devices')


def run_in_8_device_process(test, path: str, selector: str,
                            timeout: int = 1800) -> None:
  """Runs the tests of ``path`` matching ``-k selector`` on 8 devices.

  Skips when this process already has 8 devices (they ran here), and fails
  ``test`` when the run fails or skips anything.
  """
  if jax.device_count() >= 8:
    test.skipTest('the mesh tests run in this process')
  env = dict(os.environ, XLA_FLAGS=FLAG, JAX_PLATFORMS='cpu')
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', os.path.abspath(path), '-q',
       '-p', 'no:cacheprovider', '-p', 'no:xdist', '-k', selector],
      env=env, cwd=root, capture_output=True, text=True, timeout=timeout,
      check=False)
  output = result.stdout[-4000:] + result.stderr[-4000:]
  test.assertEqual(result.returncode, 0, output)
  test.assertNotIn('skipped', result.stdout.splitlines()[-1], output)
