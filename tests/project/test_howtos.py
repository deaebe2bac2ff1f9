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
"""Every how-to script of the documentation runs, and checks what it shows."""

import contextlib
import importlib.util
import io
import os
import pathlib
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import jax
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
HOWTO = ROOT / 'examples' / 'howto'


def _load(name: str):
  spec = importlib.util.spec_from_file_location(
      f'howto_{name}', HOWTO / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class HowToTest(parameterized.TestCase):

  @parameterized.parameters(
      ('nnx_checkpoint', ['--steps', '8', '--save-at', '4'],
       'bit-identical: True'),
      ('linen_train_state', ['--steps', '8', '--save-at', '4'],
       'bit-identical: True'),
      ('formats_and_schedules', ['--steps', '3'], 'int4_unsigned'),
      ('memory_budget', ['--budget-mib', '40'], 'MiB: fp8'),
      ('nnx_adaptive_bits', ['--steps', '6', '--save-at', '3'],
       'bit-identical, formats included: True'),
  )
  def test_runs_and_checks(self, name, argv, expected):
    self._check(name, argv, expected)

  # Slow: each takes 15 to 45 s, nearly all of it compiling, whatever the
  # number of steps. What they show is checked in the default suite:
  # Shampoo's and SOAP's checkpoint round trips in test_second_order.py;
  # ECO with low-bit moments and its checkpoint round trip in test_eco.py;
  # float32 formats equal to Optax, 8-bit Muon and the checkpoint round trip
  # of quantized training in test_fp_quantization.py; A + B + C = R and the
  # switched-off quantizer equal to the plain model in test_quant.py; a
  # plain Orbax checkpoint resumed under optax_q, the loss going on, in
  # test_migration.py.
  @parameterized.parameters(
      ('second_order', ['--steps', '6'], 'bit-identical: True'),
      ('master_free', ['--steps', '6', '--save-at', '3'],
       'bit-identical: True'),
      ('fp_components', ['--steps', '8'], 'bit-identical: True'),
      ('model_quantization', ['--steps', '10'], 'bit-identical: True'),
      ('nnx_master_free', ['--steps', '6', '--save-at', '3'],
       'bit-identical: True'),
      ('migrate_optax', ['--steps', '4'],
       'resumed bit-identical, formats included: True'),
      # On the 8 devices of the test process; the default suite checks the
      # same in tests/state/test_zero.py and test_offload.py.
      ('zero_state', ['--steps', '2'],
       "8 devices; mu codes P('data', None)"),
      ('offload_state', ['--steps', '2'],
       "state in ['pinned_host'] between steps"),
  )
  @pytest.mark.slow
  def test_runs_and_checks_slow(self, name, argv, expected):
    self._check(name, argv, expected)

  def _check(self, name, argv, expected):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      ok = _load(name).main(argv)
    self.assertTrue(ok, out.getvalue())
    self.assertIn(expected, out.getvalue())

  def test_shard_state_on_8_devices(self):
    if jax.device_count() >= 8:
      # A mesh test module asked for 8 devices before jax started: the
      # script runs here (its result is checked as in a fresh process).
      self._check('shard_state', ['--steps', '2'],
                  "8 devices; mu codes P(None, 'model')")
      return
    env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
               JAX_PLATFORMS='cpu')
    result = subprocess.run(
        [sys.executable, str(HOWTO / 'shard_state.py'), '--steps', '2'],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=600,
        check=False)
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    self.assertIn("8 devices; mu codes P(None, 'model')", result.stdout)

  def test_shard_state_multihost_two_processes(self):
    # Two processes of two CPU devices each, on 127.0.0.1 and a free port.
    result = subprocess.run(
        [sys.executable, str(HOWTO / 'shard_state_multihost.py'),
         '--num-processes', '2', '--local-devices', '2', '--steps', '2',
         '--timeout', '90'],
        env=dict(os.environ, JAX_PLATFORMS='cpu'), cwd=ROOT,
        capture_output=True, text=True, timeout=120, check=False)
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
    self.assertIn('2 processes, 4 devices: every shard bit-identical to the '
                  'unsharded run: True', result.stdout)
    for i in range(2):
      self.assertIn(f'process {i}: 2 of 4 devices', result.stdout)

  def test_every_howto_is_tested_and_documented(self):
    scripts = {p.stem for p in HOWTO.glob('*.py')}
    page = (ROOT / 'docs' / 'howto.md').read_text()
    for name in scripts:
      self.assertIn(f'examples/howto/{name}.py', page)
    tested = {'nnx_checkpoint', 'linen_train_state', 'formats_and_schedules',
              'shard_state', 'memory_budget', 'master_free', 'fp_components',
              'second_order', 'model_quantization', 'shard_state_multihost',
              'nnx_adaptive_bits', 'nnx_master_free', 'migrate_optax',
              'zero_state', 'offload_state'}
    self.assertEqual(scripts, tested)


if __name__ == '__main__':
  absltest.main()
