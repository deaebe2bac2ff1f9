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
"""The Pallas tile kernel of the leafwise update (interpreted on CPU).

Reference: the XLA loop over tiles (``kernel='xla'``), whose codes the
kernel must reproduce bit for bit; the loop itself is checked against the
whole-tree path in test_leafwise.py.
"""

import dataclasses
import functools
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from optax_q._src.execution import kernels
from optax_q._src.execution import tiling
import pytest

import helpers


def _params():
  keys = jax.random.split(jax.random.key(3), 4)
  return {
      'big': jax.random.normal(keys[0], (21, 384)) * 0.1,  # 3 tiles of 7
      'rank3': jax.random.normal(keys[1], (12, 5, 96)),  # 2 tiles
      'small': jax.random.normal(keys[3], (200,)),  # not tiled
  }


def _grads(i, params):
  g = jax.tree.map(lambda x: jnp.sin(x * (i + 1)) * 0.01, params)
  if i == 1:  # An infinity and a huge finite value in one block.
    g['big'] = g['big'].at[3, 5].set(jnp.inf).at[7, 9].set(3e38)
  return g


def _run(tx, params, steps=2):
  state = tx.init(params)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  updates = []
  for i in range(steps):
    u, state = step(_grads(i, params), state, params)
    updates.append(u)
  return updates, state


def _storage(inner, fmt, kernel, **kwargs):
  return optax_q.quantize_state(
      inner, fmt, min_size=0, elementwise=True, tile_size=4096,
      track_stalls=False, kernel=kernel, **kwargs)


def _uses_kernel(tx, params) -> bool:
  state = tx.init(params)
  jaxpr = jax.make_jaxpr(lambda g, s, p: tx.update(g, s, p))(
      params, state, params)
  return 'pallas_call' in str(jaxpr)


def _plan(kernel, track_stalls=False):
  # A scaled one-byte state on a 2048 x 128 leaf in tiles of 4096 elements.
  return tiling.plan((2048, 128), tile_size=4096, tileable=True, arrays=[],
                     scaled=True, byte_codes=True, track_stalls=track_stalls,
                     kernel=kernel, kernel_ready=True)


class KernelMatchesLoopTest(parameterized.TestCase):

  # The default suite: a float, a table and a packed format, both
  # roundings; every format with each rounding is slow.
  @parameterized.named_parameters(
      ('fp8_e4m3_stochastic', 'fp8_e4m3', 'stochastic'),
      ('int8_dynamic_nearest', 'int8_dynamic', 'nearest'),
      ('int4_stochastic', 'int4', 'stochastic'),
  )
  def test_adam_state_and_updates_bit_for_bit(self, fmt, rounding):
    self._check_adam(fmt, rounding)

  @parameterized.product(
      fmt=['fp8_e4m3', 'fp8_e5m2', 'int8_dynamic', 'int4', 'fp4_e2m1',
           'nf4', 'int8'],
      rounding=['nearest', 'stochastic'])
  @pytest.mark.slow
  def test_adam_every_format_and_rounding(self, fmt, rounding):
    self._check_adam(fmt, rounding)

  @parameterized.product(fmt=('fp8_e4m3', 'int8'),
                         rounding=('nearest', 'stochastic'))
  def test_gpu_plan_interpreted_matches_the_loop(self, fmt, rounding):
    # The GPU's kernel plan (blocks of whole rows, GPU_BLOCK elements),
    # interpreted here, gives the codes of the XLA loop bit for bit.
    # (A block holding an infinity and a huge value, from `_grads`.)
    params = {'big': jax.random.normal(jax.random.key(5), (32, 1024)) * 0.1,
              'b': jax.random.normal(jax.random.key(6), (200,))}
    tx = optax_q.adamw(1e-2, mu_format=fmt, nu_format=fmt,
                       rounding=rounding, min_size=0, kernel='pallas')
    plans = []

    def gpu_interpreted(p, fn):
      plans.append(tiling.for_gpu(p))
      return fn(dataclasses.replace(plans[-1], interpret=True, triton=False))

    jax.clear_caches()
    with mock.patch.object(tiling, 'per_platform', gpu_interpreted):
      got = _run(tx, params, steps=3)
    self.assertIn(('pallas', 8), [(q.kernel, q.tiles) for q in plans])
    jax.clear_caches()
    with mock.patch.object(tiling, 'per_platform',
                           lambda p, fn: fn(dataclasses.replace(
                               p, kernel='xla'))):
      want = _run(tx, params, steps=3)
    helpers.assert_trees_equal(got, want)

  def _check_adam(self, fmt, rounding):
    params = _params()
    loop = _run(_storage(optax.scale_by_adam(), fmt, 'xla',
                         rounding=rounding), params)
    kernel = _run(_storage(optax.scale_by_adam(), fmt, 'pallas',
                           rounding=rounding), params)
    helpers.assert_trees_equal(kernel, loop)

  @parameterized.named_parameters(
      ('nf3_packed', optax.scale_by_adam, 'nf3', {}),
      ('int8_rows_lion', optax.scale_by_lion, 'int8', dict(scale_mode='row')),
      ('trace', functools.partial(optax.trace, 0.9), 'fp8_e5m2',
       dict(block_size=64)),
      # Rounding in preconditioner space: the offset eps / sqrt(scale) of
      # each block, from its power-of-two scale.
      ('preconditioner_pow2', optax.scale_by_adam,
       {'mu': 'nf4', 'nu': 'ue4m0'},
       dict(rounding='preconditioner', preconditioner={'nu': 1e-8},
            scale_mode='block_pow2')),
  )
  def test_layouts_and_inner_transforms(self, inner, fmt, kwargs):
    self._check_layout(inner, fmt, kwargs)

  @parameterized.named_parameters(
      ('nf4_pow2', optax.scale_by_adam, 'nf4', dict(scale_mode='block_pow2')),
      ('fp8_dre', optax.scale_by_adam, 'fp8_e4m3_dre', {}),
      ('lion_fp8', optax.scale_by_lion, 'fp8_e4m3', {}),
      ('trace_dynamic', functools.partial(optax.trace, 0.9), 'int8_dynamic',
       {}),
  )
  @pytest.mark.slow
  def test_more_layouts_and_inner_transforms(self, inner, fmt, kwargs):
    self._check_layout(inner, fmt, kwargs)

  def _check_layout(self, inner, fmt, kwargs):
    params = _params()
    loop = _run(_storage(inner(), fmt, 'xla', **kwargs), params)
    kernel = _run(_storage(inner(), fmt, 'pallas', **kwargs), params)
    helpers.assert_trees_equal(kernel, loop)

  def test_drop_in_step_with_donation(self):
    params = _params()
    results = []
    for kernel in ('xla', 'pallas'):
      tx = optax_q.adamw(1e-2, mu_format='fp8_e4m3', nu_format='int4',
                         min_size=0, kernel=kernel)
      p, state = params, tx.init(params)
      step = jax.jit(helpers.step_fn(tx), donate_argnums=(0, 1))
      p = jax.tree.map(jnp.copy, p)
      for i in range(3):
        p, state = step(p, state, _grads(i, params))
      results.append((p, state))
    helpers.assert_trees_equal(results[1], results[0])

  def test_huge_and_tiny_gradients_finite_state(self):
    # Magnitudes up to where Adam's own float32 g**2 stays finite, down to
    # float32 subnormals: the state stays finite, and equals the loop's.
    params = {'w': jax.random.normal(jax.random.key(0), (32, 256))}
    states = []
    for kernel in ('xla', 'pallas'):
      tx = _storage(optax.scale_by_adam(), 'fp8_e4m3', kernel)
      state = tx.init(params)
      for scale in (1e18, 1e-30, 1e-44, 1.0):
        _, state = jax.jit(tx.update)(
            jax.tree.map(lambda x, s=scale: x * s, params), state, params)
      for field in ('mu', 'nu'):
        q = getattr(state.inner_state, field)['w']
        self.assertTrue(
            np.all(np.isfinite(np.asarray(optax_q.dequantize(q)))), field)
      states.append(state)
    helpers.assert_trees_equal(states[1], states[0])


class KernelChoiceTest(absltest.TestCase):

  def test_pallas_puts_a_kernel_in_the_step(self):
    params = _params()
    self.assertTrue(_uses_kernel(
        _storage(optax.scale_by_adam(), 'fp8_e4m3', 'pallas'), params))
    self.assertFalse(_uses_kernel(
        _storage(optax.scale_by_adam(), 'fp8_e4m3', 'xla'), params))

  def test_auto_is_the_xla_path_on_every_platform(self):
    # No kernel's lowering is verified for a GPU or TPU yet: 'auto' takes
    # the XLA path, in the CPU branch and in the accelerators' branch.
    self.assertFalse(_uses_kernel(
        optax_q.adamw(1e-3, mu_format='fp8', nu_format='fp8', min_size=0),
        _params()))
    for kernel in ('auto', 'xla'):
      p = _plan(kernel)
      self.assertEqual((p.kernel, p.tiles), ('xla', 64))
      self.assertEqual(tiling.for_tpu(p).tiles, 1)

  def test_pallas_is_interpreted_for_cpu_compiled_elsewhere(self):
    p = _plan('pallas')
    self.assertEqual((p.kernel, p.interpret), ('pallas', True))
    accelerated = tiling.for_tpu(p)
    self.assertEqual((accelerated.kernel, accelerated.interpret,
                      accelerated.tiles), ('pallas', False, 64))

  def test_gpu_kernel_where_triton_lowers(self):
    def gpu(shape, kernel='pallas', ready=True, **kwargs):
      return tiling.for_gpu(tiling.plan(
          shape, tile_size=2**18, tileable=True, arrays=[], scaled=True,
          byte_codes=True, track_stalls=False, kernel=kernel,
          kernel_ready=ready, **kwargs))
    # Programs of GPU_BLOCK elements of whole rows, compiled by Triton.
    p = gpu((1024, 1024))
    self.assertEqual((p.kernel, p.tiles, p.triton, p.interpret),
                     ('pallas', 1024 * 1024 // tiling.GPU_BLOCK, True, False))
    self.assertEqual(gpu((64, tiling.GPU_ROW_MAX)).tiles, 64)
    # Elsewhere the XLA path of the TPU plan's kind: one fused call.
    for q in (gpu((1024, 3072)), gpu((1024, 2 * tiling.GPU_ROW_MAX)),
              gpu((1022, 1024)), gpu((1024, 1024), ready=False),
              gpu((1024, 1024), kernel='auto'), gpu((16, 4, 1024))):
      self.assertEqual((q.kernel, q.tiles, q.triton), ('xla', 1, False))
    # A TPU keeps the CPU's tiles, compiled by Mosaic.
    tpu = tiling.for_tpu(tiling.plan(
        (1024, 1024), tile_size=2**18, tileable=True, arrays=[], scaled=True,
        byte_codes=True, track_stalls=False, kernel='pallas',
        kernel_ready=True))
    self.assertEqual((tpu.kernel, tpu.tiles, tpu.triton), ('pallas', 4, False))

  def test_stall_telemetry_keeps_the_loop(self):
    p = _plan('pallas', track_stalls=True)
    self.assertEqual(p.kernel, 'xla')
    self.assertFalse(p.in_place)

  def test_bad_arguments(self):
    for bad in ('gpu', 'PALLAS', None, 1, True):
      with self.assertRaisesRegex(ValueError, 'kernel must be one of'):
        optax_q.adamw(1e-3, kernel=bad)
      with self.assertRaisesRegex(ValueError, 'kernel must be one of'):
        optax_q.quantize_state(optax.scale_by_adam(), kernel=bad)
    with self.assertRaisesRegex(ValueError, 'track_stalls=False'):
      optax_q.quantize_state(optax.scale_by_adam(), kernel='pallas')
    with self.assertRaisesRegex(ValueError, 'track_stalls=False'):
      optax_q.adamw(1e-3, kernel='pallas', track_stalls=True)
    with self.assertRaisesRegex(ValueError, 'elementwise=True'):
      optax_q.quantize_state(optax.scale_by_adam(), kernel='pallas',
                             track_stalls=False)
    with self.assertRaisesRegex(ValueError, 'arguments of the optimizer'):
      optax_q.adamw(1e-3, bits={'kernel': 'pallas'})


class TileMapTest(absltest.TestCase):

  def test_tiles_constants_and_shared_inputs(self):
    table = np.arange(8, dtype=np.float32) ** 2  # A captured constant.
    x = jnp.arange(6 * 8, dtype=jnp.int32).reshape(6, 8) % 8
    y = jnp.zeros((6, 8), jnp.float32)
    shift = jnp.asarray([5.0])

    def step(t, carried, codes, shared):
      del carried  # Rewritten, not read.
      return {'y': jnp.asarray(table)[codes] + shared['shift']
                   + t.astype(jnp.float32)}

    out = kernels.tile_map(step, {'y': y}, x, {'shift': shift[0]}, tiles=3,
                           interpret_mode=True)['y']
    want = table[np.asarray(x)] + 5.0 + np.repeat(np.arange(3), 2)[:, None]
    np.testing.assert_array_equal(np.asarray(out), want)


if __name__ == '__main__':
  absltest.main()
