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
"""The leafwise, tiled update of elementwise inner transforms.

References: the untiled leafwise path (``tile_size=None``), which must
give the same bits everywhere (codes, scales, updates, parameters), and the
generic whole-tree path of the same ``quantize_state``, whose stored codes
and scales must be the same bits too. The generic path's updates are those
of the inner transform compiled on the whole tree, where XLA rewrites some
arithmetic (a division by a broadcast bias correction) differently from a
single leaf, as it does for Optax's own update: they agree to float32
rounding.
"""

import dataclasses
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_q

import helpers
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.execution import tiling
from optax_q._src.state import leafwise


def _params():
  keys = jax.random.split(jax.random.key(0), 4)
  return {
      'big': jax.random.normal(keys[0], (64, 384)) * 0.1,  # 8 tiles
      'rank3': jax.random.normal(keys[1], (12, 5, 96)) * 0.1,  # 3 tiles
      'odd': jax.random.normal(keys[2], (40, 130)) * 0.1,  # ragged blocks
      'small': jax.random.normal(keys[3], (200,)),  # not tiled
  }


def _run(tx, params, steps=3):
  state = tx.init(params)
  update = jax.jit(tx.update)
  outs = []
  for i in range(steps):
    u, state = update(helpers.grads(i, params), state, params)
    params = optax.apply_updates(params, u)
    outs.append(u)
  return params, state, outs


def _pair(inner_fn, formats, rounding, **kwargs):
  whole = optax_q.quantize_state(
      inner_fn(), formats, rounding=rounding, min_size=0, **kwargs)
  tiled = optax_q.quantize_state(
      inner_fn(), formats, rounding=rounding, min_size=0, elementwise=True,
      tile_size=4096, **kwargs)
  return whole, tiled


class TilingTest(parameterized.TestCase):

  def test_num_tiles(self):
    self.assertEqual(tiling.num_tiles((64, 384), 4096), 8)
    self.assertEqual(tiling.num_tiles((12, 5, 96), 4096), 2)
    self.assertEqual(tiling.num_tiles((64, 384), None), 1)
    self.assertEqual(tiling.num_tiles((100_000,), 4096), 1)  # rank 1
    self.assertEqual(tiling.num_tiles((7, 100_000), 4096), 7)  # rows

  def test_row_tile_index_is_the_global_index(self):
    full = rounding_lib.element_index((12, 4, 5))
    for t in range(3):
      tile = rounding_lib.element_index((4, 4, 5), row_stride=3,
                                        row_offset=jnp.int32(t))
      np.testing.assert_array_equal(
          tile, np.asarray(full).reshape(4, 3, 4, 5)[:, t])

  # The default suite: two formats, each rounding and each stall setting
  # (without stall counts the loop overwrites the old state in place) in
  # turn; every combination in the slow suite. Packed 4-bit codes are tiled
  # in the default suite by test_properties.py (tiled against untiled, bit
  # for bit), test_kernels.py and test_sharding.py.
  @parameterized.parameters(
      ('int8_dynamic', 'stochastic', True), ('fp8_e4m3', 'nearest', False))
  def test_tiled_matches_whole_tree(self, fmt, rounding, track_stalls):
    self._check_tiled(fmt, rounding, track_stalls)

  @parameterized.product(
      fmt=('int8_dynamic', 'fp8_e4m3', 'int4', 'fp4_e2m1', 'int8'),
      rounding=('nearest', 'stochastic'),
      track_stalls=(True, False))
  @pytest.mark.slow
  def test_tiled_matches_whole_tree_every_combination(self, fmt, rounding,
                                                      track_stalls):
    self._check_tiled(fmt, rounding, track_stalls)

  def _check_tiled(self, fmt, rounding, track_stalls):
    params = _params()
    whole, tiled = _pair(optax.scale_by_adam, fmt, rounding,
                         track_stalls=track_stalls)
    untiled = optax_q.quantize_state(
        optax.scale_by_adam(), fmt, rounding=rounding, min_size=0,
        elementwise=True, tile_size=None, track_stalls=track_stalls)
    pw, sw, uw = _run(whole, params)
    pt, st, ut = _run(tiled, params)
    pu, su, uu = _run(untiled, params)
    # Tiled and untiled: the same bits everywhere.
    helpers.assert_trees_equal((uu, pu, su), (ut, pt, st))
    # The generic whole-tree path: updates to float32 rounding...
    for a, b in zip(jax.tree.leaves(uw), jax.tree.leaves(ut)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    for a, b in zip(jax.tree.leaves(pw), jax.tree.leaves(pt)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    # ... and the stored state bit for bit (the gradients here do not
    # depend on the parameters).
    qw = optax_q.quantized_leaves(sw)
    qt = optax_q.quantized_leaves(st)
    self.assertEqual(sorted(qw), sorted(qt))
    for name in qw:
      np.testing.assert_array_equal(qw[name].codes, qt[name].codes, name)
      np.testing.assert_array_equal(qw[name].scale, qt[name].scale, name)
    for a, b in zip(jax.tree.leaves(optax_q.stall_fraction(sw)),
                    jax.tree.leaves(optax_q.stall_fraction(st))):
      self.assertEqual(float(a), float(b))

  @pytest.mark.slow  # 40 s; lion's trace is also in test_optimizer_matrix.
  def test_lion_trace_and_mixed_fields(self):
    params = _params()
    for inner_fn, formats in (
        (optax.scale_by_lion, 'int8_dynamic'),
        (lambda: optax.trace(0.9), 'fp8_e4m3'),
        # mu quantized, nu kept in float32: an unquantized leaf in the loop.
        (optax.scale_by_adam, {'mu': 'int8'}),
    ):
      for track_stalls in (True, False):
        whole, tiled = _pair(inner_fn, formats, 'stochastic',
                             track_stalls=track_stalls)
        pw, _, _ = _run(whole, params)
        pt, _, _ = _run(tiled, params)
        for a, b in zip(jax.tree.leaves(pw), jax.tree.leaves(pt)):
          np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)

  def test_resets_and_local_ages(self):
    params = _params()
    results = []
    for elementwise in (False, True):
      inner = optax_q.quantize_state(
          optax_q.scale_by_adam_local_age(), 'int8_dynamic', min_size=0,
          elementwise=elementwise, tile_size=4096)
      tx = optax_q.reset_state(inner, {'mu': 2, 'nu': 3})
      results.append(_run(tx, params, steps=4))
    (pw, sw, _), (pt, st, _) = results
    for a, b in zip(jax.tree.leaves(pw), jax.tree.leaves(pt)):
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    ages = lambda s: s.inner_state.inner_state  # noqa: E731
    self.assertEqual(int(ages(sw).count_mu), int(ages(st).count_mu))
    self.assertEqual(int(ages(sw).count_nu), int(ages(st).count_nu))

  def test_temporaries_are_a_tile_not_the_state(self):
    # The whole-tree step holds the new moments in float32 (8 MiB here, and
    # more for the codebook search); the tiled step holds one tile of them
    # and the new codes (a quarter of the float32 moments).
    params = {'w': jnp.zeros((1024, 1024))}
    grads = {'w': jnp.ones((1024, 1024))}
    temp = {}
    for elementwise in (False, True):
      tx = optax_q.quantize_state(
          optax.scale_by_adam(), 'int8_dynamic', elementwise=elementwise,
          tile_size=2**14)
      state = tx.init(params)
      compiled = jax.jit(tx.update, donate_argnums=1).lower(
          grads, state, params).compile()
      temp[elementwise] = compiled.memory_analysis().temp_size_in_bytes
    state_f32 = 2 * 1024 * 1024 * 4
    self.assertGreater(temp[False], state_f32)
    self.assertLess(temp[True], 0.4 * state_f32)

  def test_unquantized_state_takes_the_inner_update(self):
    # fp32 formats: nothing quantized, Optax's update bit for bit.
    params = _params()
    tx = optax_q.quantize_state(optax.scale_by_adam(), 'fp32',
                                elementwise=True, tile_size=4096)
    got, _, _ = _run(tx, params)
    want, _, _ = _run(optax.scale_by_adam(), params)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


class ApartTest(parameterized.TestCase):
  """On CPU the moments and the block scales are computed apart (tiled and
  untiled leaves), and the tiles of one-byte codes into a buffer of their
  own; that changes where values are computed, never the state or the
  update: the same bits as the fused, in-place program."""

  # Each case compiles every program twice, from empty caches: one in the
  # default suite, the table and packed formats with -m slow.
  def test_same_bits_as_fused(self):
    self._check('fp8_e4m3', 'stochastic')

  @parameterized.parameters(('int8_dynamic', 'stochastic'),
                            ('int4', 'nearest'))
  @pytest.mark.slow
  def test_same_bits_as_fused_tables_and_packed(self, fmt, rounding):
    self._check(fmt, rounding)

  def _check(self, fmt, rounding):
    tx = optax_q.quantize_state(
        optax.scale_by_adam(), fmt, rounding=rounding, min_size=0,
        elementwise=True, tile_size=4096, track_stalls=False)
    params = _params()
    params = {'big': params['big'],  # tiled
              'one_call': params['big'][:8] * 2}  # 3072 elements: untiled
    conds = lambda: jax.jit(tx.update).lower(  # noqa: E731
        params, tx.init(params), params).as_text().count('stablehlo.case')
    # Traces are cached across the two programs: start each afresh.
    jax.clear_caches()
    got, apart = _run(tx, params, steps=1), conds()
    jax.clear_caches()
    # The plan a GPU or TPU lowering takes (no tiles), without the fusion
    # device (which lowers to nothing there), run here on CPU.
    with mock.patch.object(tiling, 'per_platform', lambda p, fn: fn(
        dataclasses.replace(tiling.fused(p), apart=False,
                            own_buffer=False))):
      want, fused = _run(tx, params, steps=1), conds()
    jax.clear_caches()
    self.assertGreater(apart, fused)
    bits = lambda x: np.asarray(x).reshape(-1).view(np.uint8)  # noqa: E731
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(bits(a), bits(b))


class AcceleratorProgramTest(parameterized.TestCase):
  """The step as lowered for a GPU or TPU (each `lax.platform_dependent`
  taking its default branch: one fused call per parameter, the block
  scales from a second evaluation of the new state), run here on CPU:
  the bits of the CPU's own program."""

  @parameterized.parameters(
      ('fp8_e4m3', 'stochastic', 'block'),
      ('int8', 'nearest', 'block'),
      ({'mu': 'nf4', 'nu': 'ue4m0'}, 'stochastic', 'block_pow2'))
  def test_same_bits_as_the_cpu_program(self, fmt, rounding, scale_mode):
    tx = optax_q.quantize_state(
        optax.scale_by_adam(), fmt, rounding=rounding, min_size=0,
        elementwise=True, tile_size=4096, scale_mode=scale_mode,
        track_stalls=False)
    params = _params()
    jax.clear_caches()
    want = _run(tx, params, steps=2)
    jax.clear_caches()
    seen = []

    def accelerated(*args, default=None, **branches):
      seen.append((bool(args), sorted(branches)))
      return default(*args)

    with mock.patch.object(lax, 'platform_dependent', accelerated):
      got = _run(tx, params, steps=2)
    jax.clear_caches()
    # The plans' choice, and the second evaluation's for the scales.
    self.assertIn((False, ['cpu']), seen)
    self.assertIn((True, ['cpu']), seen)
    bits = lambda x: np.asarray(x).reshape(-1).view(np.uint8)  # noqa: E731
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(bits(a), bits(b))


class JaxTransformsTest(absltest.TestCase):
  """The leafwise pass (tiles, the fusion device, the choice of platform)
  keeps what Jax's transformations and effects do with a step."""

  def setUp(self):
    super().setUp()
    self.tx = optax_q.quantize_state(
        optax.scale_by_adam(), 'int8', min_size=0, elementwise=True,
        tile_size=4096)
    self.params = {'w': jnp.ones((64, 256)) * 0.1,  # 4 tiles.
                   'b': jnp.ones((8, 256))}
    self.state = self.tx.init(self.params)

  def test_vmap_over_an_ensemble_is_each_member(self):
    grads = jax.tree.map(lambda p: jnp.stack([p, 2 * p, -3 * p]),
                         self.params)
    states = jax.tree.map(lambda x: jnp.stack([x] * 3), self.state)
    updates, new = jax.jit(jax.vmap(
        lambda g, s: self.tx.update(g, s, self.params)))(grads, states)
    for k in range(3):
      want = jax.jit(self.tx.update)(
          jax.tree.map(lambda x, k=k: x[k], grads), self.state, self.params)
      for a, b in zip(jax.tree.leaves((updates, new)),
                      jax.tree.leaves(want)):
        np.testing.assert_array_equal(a[k], b)

  def test_grad_through_the_update(self):
    def total(grads):
      updates, _ = self.tx.update(grads, self.state, self.params)
      return sum(jnp.sum(u) for u in jax.tree.leaves(updates))

    for g in jax.tree.leaves(jax.jit(jax.grad(total))(self.params)):
      self.assertTrue(np.all(np.isfinite(g)))

  def test_ordered_effects_in_the_inner_update(self):
    adam = optax.scale_by_adam()
    seen = []

    def update(u, s, p=None):
      jax.debug.callback(lambda c: seen.append(int(c)), s.count,
                         ordered=True)
      return adam.update(u, s, p)

    tx = optax_q.quantize_state(
        optax.GradientTransformation(adam.init, update), 'int8', min_size=0,
        elementwise=True, tile_size=4096)
    jax.block_until_ready(jax.jit(tx.update)(
        self.params, tx.init(self.params), self.params))
    self.assertNotEmpty(seen)
    self.assertEqual(set(seen), {0})


class PerFieldRoundingTest(absltest.TestCase):

  def test_each_field_rounds_as_asked(self):
    params = _params()
    runs = {}
    for name, rounding in (('rn', 'nearest'), ('sr', 'stochastic'),
                           ('mix', {'mu': 'nearest', 'nu': 'stochastic'})):
      tx = optax_q.quantize_state(optax.scale_by_adam(), 'int8',
                                  rounding=rounding, min_size=0)
      state = tx.init(params)
      _, state = jax.jit(tx.update)(helpers.grads(0, params), state, params)
      runs[name] = state.inner_state
    np.testing.assert_array_equal(runs['mix'].mu['big'].codes,
                                  runs['rn'].mu['big'].codes)
    np.testing.assert_array_equal(runs['mix'].nu['big'].codes,
                                  runs['sr'].nu['big'].codes)
    self.assertFalse(np.array_equal(runs['rn'].nu['big'].codes,
                                    runs['sr'].nu['big'].codes))

  def test_bad_arguments(self):
    inner = optax.scale_by_adam()
    with self.assertRaisesRegex(ValueError, r"rounding\['nu'\] must be one"):
      optax_q.quantize_state(inner, rounding={'nu': 'floor'})
    with self.assertRaisesRegex(ValueError, r"rounding names unknown .*'v'"):
      optax_q.quantize_state(inner, rounding={'v': 'nearest'})
    with self.assertRaisesRegex(ValueError, 'tile_size must be a positive'):
      optax_q.quantize_state(inner, elementwise=True, tile_size=0)
    with self.assertRaisesRegex(ValueError, 'elementwise must be a bool'):
      optax_q.quantize_state(inner, elementwise='yes')
    with self.assertRaisesRegex(ValueError, r"rounding\['mu'\] must be one"):
      optax_q.adamw(1e-3, rounding={'mu': 'up'})


if __name__ == '__main__':
  absltest.main()
