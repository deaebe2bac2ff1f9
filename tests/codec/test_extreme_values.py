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
"""Extreme values through the codecs, as an adversarial user sends them.

One huge finite gradient must not poison its block; infinities and NaNs stay
in their elements; float32's largest value, subnormal and empty blocks round
trip; the dynamic maps are bitsandbytes' tables; a checkpoint does not
restore silently into another format.
"""

import hashlib
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp

import optax_q
from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib

BLOCK_SCALED = ('fp8_e4m3', 'fp8_e5m2', 'int8', 'int8_dynamic', 'int4',
                'fp4_e2m1', 'fp4_e2m2u', 'e3m2')
F32_MAX = float(np.finfo(np.float32).max)

# sha256 of the float32 bytes of bitsandbytes 0.50.2's
# ``create_dynamic_map(signed=...)`` (computed with bitsandbytes installed;
# ``test_matches_bitsandbytes`` recomputes them wherever it is).
BNB_SHA256 = {
    True: 'e732639a65f497b4ad684bb166a4467708255edd5207757de8b8f0c7e1fda89c',
    False: '305f002cc11278fb769d13b25b9fd0c7c83c8402c40a878fe086f4039fde6398',
}


def _sha(table) -> str:
  return hashlib.sha256(np.asarray(table, np.float32).tobytes()).hexdigest()


class HugeFiniteGradientTest(parameterized.TestCase):
  """Defect 1: a finite gradient whose square overflows float32."""

  @parameterized.product(fmt=BLOCK_SCALED, big=(2e19, 1e38))
  def test_one_element_behaves_as_float32_adam(self, fmt, big):
    key = jax.random.key(0)
    params = {'w': jax.random.normal(key, (16, 256)) * 0.1}
    mu = 'fp4_e2m1' if fmt == 'fp4_e2m2u' else fmt  # e2m2u is unsigned.
    tx = optax.apply_if_finite(
        optax_q.adamw(1e-3, min_size=0, mu_format=mu, nu_format=fmt), 3)
    ref = optax.adamw(1e-3, weight_decay=1e-4)
    state, ref_state = tx.init(params), ref.init(params)
    p, rp = params, params
    step = jax.jit(tx.update)
    for t in range(5):
      g = {'w': jax.random.normal(jax.random.fold_in(key, t + 1), (16, 256))}
      if t == 1:
        g['w'] = g['w'].at[0, 0].set(big)
      u, state = step(g, state, p)
      p = optax.apply_updates(p, u)
      ru, ref_state = ref.update(g, ref_state, rp)
      rp = optax.apply_updates(rp, ru)
    self.assertTrue(bool(jnp.all(jnp.isfinite(p['w']))))
    # The overflowing element: float32 Adam's bits (its update is m / inf).
    self.assertEqual(float(p['w'][0, 0]), float(rp['w'][0, 0]))
    # The rest of its second-moment block keeps float32 Adam's values (to
    # within the format's rounding): the infinity does not set the scale.
    # (Its first moment holds a finite 2e18 next to values near 0.1, more
    # range than any 8-bit block holds: those neighbours read as zero until
    # the outlier has decayed, as for any finite outlier.)
    nu = [q for name, q in optax_q.quantized_leaves(state).items()
          if '/nu/' in name][0]
    nu = np.asarray(optax_q.dequantize(nu))
    ref_nu = np.asarray(ref_state[0].nu['w'])
    self.assertEqual(nu[0, 0], np.inf)
    np.testing.assert_allclose(nu[0, 1:128], ref_nu[0, 1:128], rtol=0.5,
                               atol=0.05 * ref_nu[0, 1:128].max())
    for q in optax_q.quantized_leaves(state).values():
      self.assertTrue(np.all(np.isfinite(np.asarray(q.scale))))
      if jnp.issubdtype(q.codes.dtype, jnp.floating):
        self.assertTrue(np.all(np.isfinite(np.asarray(
            q.codes.astype(jnp.float32)))))

  @parameterized.product(fmt=BLOCK_SCALED, scale=('block', 'row', 'tensor'))
  def test_infinity_does_not_set_the_scale(self, fmt, scale):
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, (4, 256)).astype(np.float32)
    fmt_obj = optax_q.get_format(fmt)
    if fmt_obj.signed:
      x *= rng.choice([-1.0, 1.0], x.shape).astype(np.float32)
    x_inf = x.copy()
    x_inf[0, 3] = np.inf
    if fmt_obj.signed:
      x_inf[1, 7] = -np.inf
    q = optax_q.quantize(jnp.asarray(x_inf), fmt, scale_mode=scale)
    self.assertTrue(np.all(np.isfinite(np.asarray(q.scale))))
    out = np.asarray(optax_q.dequantize(q))
    self.assertEqual(out[0, 3], np.inf)
    if fmt_obj.signed:
      self.assertEqual(out[1, 7], -np.inf)
    finite = np.isfinite(x_inf)
    self.assertTrue(np.all(np.isfinite(out[finite])))
    # The other elements keep their values to within their own rounding:
    # the scale is set by the finite elements alone.
    step = {'int4': 1 / 7, 'fp4_e2m1': 1 / 3, 'fp4_e2m2u': 1 / 7,
            'e3m2': 1 / 4}.get(fmt, 1 / 8)
    np.testing.assert_allclose(out[finite], x[finite], rtol=step * 1.01,
                               atol=2.0 * step * 1.01)

  def test_nan_stays_in_its_element(self):
    # An infinity that shares a block with a NaN decodes to NaN as well.
    x = jnp.ones((2, 128)).at[0, 5].set(jnp.nan).at[0, 6].set(jnp.inf)
    out = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, 'int8', block_size=64)))
    self.assertTrue(np.all(np.isnan(out[0, 5:7])))
    # Its block's scale is rounded down to 13 mantissa bits.
    np.testing.assert_allclose(np.delete(out[0], [5, 6]), 1.0, rtol=2e-4)
    np.testing.assert_array_equal(out[1], 1.0)


class DynamicMapTest(parameterized.TestCase):
  """Defect 2: the dynamic maps are bitsandbytes', value for value."""

  @parameterized.parameters(True, False)
  def test_structure(self, signed):
    table = np.asarray(formats_lib.dynamic_map(signed=signed), np.float32)
    self.assertLen(table, 256)
    self.assertLen(np.unique(table), 256)  # No duplicates, no truncation.
    self.assertEqual(table[-1], 1.0)
    self.assertIn(0.0, table)
    pos = table[table > 0]
    # Decade 10**(i - 6), i = 0..6, holds 2**i (signed) or 2**(i + 1)
    # (unsigned) bin midpoints of [0.1, 1]; plus the 1.0.
    for i in range(7):
      lo, hi = 10.0 ** (i - 7), 10.0 ** (i - 6)
      n = np.sum((pos > lo) & (pos < hi))
      self.assertEqual(n, 2**i if signed else 2 ** (i + 1), (signed, i))
    if signed:
      np.testing.assert_array_equal(-table[table < 0][::-1],
                                    pos[:-1])  # symmetric but for the 1.0
      self.assertEqual(table[0], np.float32(-0.99296874))
      self.assertEqual(pos[0], np.float32(5.5000004e-07))
    else:
      self.assertGreaterEqual(table.min(), 0.0)
      self.assertEqual(pos[0], np.float32(3.2500003e-07))
      self.assertEqual(pos[1], np.float32(7.7499999e-07))

  @parameterized.parameters(True, False)
  def test_pinned_bitsandbytes_tables(self, signed):
    self.assertEqual(_sha(formats_lib.dynamic_map(signed=signed)),
                     BNB_SHA256[signed])

  def test_formats_use_the_maps(self):
    for name, signed in (('int8_dynamic', True),
                         ('int8_dynamic_unsigned', False)):
      np.testing.assert_array_equal(
          np.asarray(optax_q.get_format(name).table, np.float32),
          np.asarray(formats_lib.dynamic_map(signed=signed), np.float32))
    unsigned = optax_q.unsigned_variant(optax_q.get_format('int8_dynamic'))
    self.assertEqual(unsigned.max_value, 1.0)

  @parameterized.parameters(True, False)
  def test_matches_bitsandbytes(self, signed):
    try:
      # pylint: disable=g-import-not-at-top
      from bitsandbytes import functional as bnb_functional
    except Exception:  # pylint: disable=broad-except
      self.skipTest('bitsandbytes is not installed (a benchmark-only peer).')
    ref = bnb_functional.create_dynamic_map(signed=signed).numpy()
    np.testing.assert_array_equal(
        np.asarray(formats_lib.dynamic_map(signed=signed), np.float32),
        ref.astype(np.float32))

  @parameterized.product(name=('int8_dynamic', 'int8_dynamic_unsigned'),
                         peak=(1e30, 1e37, 4e37, 1e38, F32_MAX))
  def test_huge_blocks_decode(self, name, peak):
    x = np.linspace(0.0, 1.0, 256, dtype=np.float32) * np.float32(peak)
    fmt = optax_q.get_format(name)
    q = qarray_lib.encode(jnp.asarray(x), fmt, scale_mode='block',
                          block_size=128, key=None)
    out = np.asarray(optax_q.dequantize(q))
    self.assertTrue(np.all(np.isfinite(out)))
    np.testing.assert_allclose(out[-1], x[-1], rtol=1e-6)
    # Within half a bin of the map (bins of 1.4% of the block maximum in
    # its top decade), relative to the block maximum.
    np.testing.assert_allclose(out, x, rtol=0, atol=0.01 * peak)


class FiniteInFiniteOutTest(parameterized.TestCase):
  """Defect 8: the largest float32 decodes to itself, not infinity."""

  @parameterized.product(
      fmt=('int8', 'int4', 'fp16', 'e5m10', 'e6m20', 'fp8_e4m3', 'fp8_e5m2',
           'int8_dynamic', 'fp4_e2m1', 'bf16', 'e3m2'),
      scale=('row', 'block'),
      sign=(1.0, -1.0))
  def test_float32_max(self, fmt, scale, sign):
    x = jnp.full((3, 130), sign * F32_MAX).at[1, 5].set(0.5)
    q = optax_q.quantize(x, fmt, scale_mode=scale)
    out = np.asarray(optax_q.dequantize(q))
    self.assertTrue(np.all(np.isfinite(out)), (fmt, scale, out[0, :3]))
    self.assertTrue(np.all(np.isfinite(np.asarray(q.scale))))
    # The signed dynamic map ends at -0.99297 below (bitsandbytes' map).
    rtol = 8e-3 if fmt == 'int8_dynamic' and sign < 0 else 1e-6
    np.testing.assert_allclose(out[0, 0], sign * F32_MAX, rtol=rtol)

  @parameterized.parameters('int8', 'fp8_e4m3', 'int8_dynamic', 'int4')
  def test_tiny_and_subnormal_blocks(self, fmt):
    for peak in (1e-30, 1e-38, 1e-44):
      x = jnp.full((2, 128), peak, jnp.float32)
      out = np.asarray(optax_q.dequantize(optax_q.quantize(x, fmt)))
      self.assertTrue(np.all(np.isfinite(out)))


class NarrowSimulatedGridTest(parameterized.TestCase):
  """Simulated grids of 3 and 4 bits are values in bf16, never packed."""

  @parameterized.parameters('e1m2', 'e1m1', 'e2m0', 'e3m0')
  def test_round_trip_on_the_grid(self, name):
    fmt = optax_q.get_format(name)
    self.assertFalse(fmt.packed)
    grid = formats_lib._float_grid(fmt.exponent_bits, fmt.mantissa_bits,
                                   fmt.max_value)
    x = jnp.asarray([v / fmt.max_value for v in grid if v > 0], jnp.float32)
    q = optax_q.quantize(x, name, scale_mode='tensor')
    np.testing.assert_allclose(optax_q.dequantize(q), x, rtol=1e-6)
    self.assertEqual(q.codes.dtype, jnp.bfloat16)


class WideStochasticRoundingTest(parameterized.TestCase):
  """Stochastic rounding of grids with 21 or more mantissa bits."""

  @parameterized.parameters('e7m23', 'e6m22', 'e7m21')
  def test_values_on_the_grid_stay(self, name):
    # 2.0 and 1e-3 next to infinities: their block's scale makes them
    # values above 2^22 on the integer grid, where y + u would round.
    x = jnp.array([jnp.inf, -jnp.inf, 2.0, 1e-3])
    for seed in range(8):
      y = optax_q.dequantize(optax_q.quantize(
          x, name, rounding='stochastic', block_size=4, seed=seed))
      np.testing.assert_array_equal(np.isinf(y), np.isinf(x))
      np.testing.assert_allclose(y[2:], x[2:], rtol=1e-5)

  def test_unbiased_above_two_to_the_22(self):
    from optax_q._src.codec import rounding  # pylint: disable=g-import-not-at-top
    y = jnp.full((4096,), 2.0**22 + 0.5)
    u = rounding.uniform(jnp.uint32(7), y.shape)
    r = rounding.round_int(y, u)
    self.assertEqual(set(np.unique(np.asarray(r))), {2.0**22, 2.0**22 + 1})
    self.assertAlmostEqual(float(jnp.mean(r - 2.0**22)), 0.5, delta=0.03)
    np.testing.assert_array_equal(rounding.round_int(y - 0.5, u), y - 0.5)


class InfinityNextToHugeTest(parameterized.TestCase):
  """A block with an infinity and a value near float32's maximum, in a grid
  whose inner target is below one: the finite value stays finite."""

  @parameterized.product(name=('nf4', 'ue4m0', 'int4_mulaw', 'nf3'),
                         mode=('block', 'row', 'tensor'))
  def test_finite_stays_finite(self, name, mode):
    x = jnp.array([jnp.inf, 3e38, 1.0, 2.0])
    fmt = optax_q.get_format(name)
    q = optax_q.quantize(x if fmt.signed else jnp.abs(x), fmt,
                         scale_mode=mode, block_size=4)
    y = np.asarray(optax_q.dequantize(q))
    self.assertEqual(y[0], np.inf)
    self.assertTrue(np.all(np.isfinite(y[1:])), y)
    self.assertGreater(y[1], 1e38)


class NaNInLongRowsTest(parameterized.TestCase):
  """A NaN surfaces whatever the shape (XLA's CPU maximum drops NaNs from
  long rows)."""

  @parameterized.product(shape=((8, 512), (4096,)),
                         mode=('block', 'rank1'),
                         name=('int8', 'fp8_e4m3_dre'))
  def test_nan_decodes_to_nan(self, shape, mode, name):
    if mode == 'rank1' and len(shape) < 2:
      return
    if name == 'fp8_e4m3_dre' and mode == 'rank1':
      return
    x = jnp.ones(shape).at[(0,) * (len(shape) - 1) + (7,)].set(jnp.nan)
    for fn in (lambda x: optax_q.dequantize(optax_q.quantize(
        x, name, scale_mode=mode)),):
      for run in (fn, jax.jit(fn)):
        y = np.asarray(run(x))
        self.assertTrue(np.isnan(y.reshape(-1)[7]), (shape, mode, name))


class EmptyArrayTest(parameterized.TestCase):

  @parameterized.product(fmt=('fp4_e2m1', 'int4', 'int8', 'fp8_e4m3'),
                         shape=((0, 7), (7, 0), (0,), (0, 3, 5)))
  def test_empty_arrays_round_trip(self, fmt, shape):
    q = optax_q.quantize(jnp.zeros(shape), fmt)
    self.assertEqual(optax_q.dequantize(q).shape, shape)


class CheckpointFormatTest(parameterized.TestCase):
  """Defect 5: a restore into another layout is refused, naming both."""

  def _roundtrip(self, saved_kwargs, target_kwargs):
    params = {'w': jnp.ones((36, 130)) * 0.1}
    tx_a = optax_q.adamw(1e-3, min_size=0, **saved_kwargs)
    tx_b = optax_q.adamw(1e-3, min_size=0, **target_kwargs)
    state = tx_a.init(params)
    _, state = jax.jit(tx_a.update)(params, state, params)
    path = os.path.join(tempfile.mkdtemp(), 'state')
    with ocp.StandardCheckpointer() as ckptr:
      ckptr.save(path, state)
    target = jax.eval_shape(tx_b.init, params)
    with ocp.StandardCheckpointer() as ckptr:
      return state, ckptr.restore(path, target)

  @parameterized.named_parameters(
      ('int4_to_fp4', dict(mu_format='int4'), dict(mu_format='fp4_e2m1'),
       'int4', 'fp4_e2m1'),
      ('fp8_to_dynamic', dict(mu_format='fp8_e4m3'),
       dict(mu_format='int8_dynamic'), 'fp8_e4m3', 'int8_dynamic'),
      ('e4m3_to_e5m2', dict(mu_format='fp8_e4m3'),
       dict(mu_format='fp8_e5m2'), 'fp8_e4m3', 'fp8_e5m2'),
      ('int8_to_dynamic', dict(nu_format='int8'),
       dict(nu_format='int8_dynamic'), 'int8', 'int8_dynamic_unsigned'),
      ('block_size', dict(block_size=128), dict(block_size=64),
       'block:128', 'block:64'),
  )
  def test_other_layout_is_refused(self, saved, target, name_a, name_b):
    with self.assertRaises(ValueError) as cm:
      self._roundtrip(saved, target)
    message = str(cm.exception)
    self.assertIn(name_a, message)
    self.assertIn(name_b, message)
    self.assertRegex(message, r"'w'")  # the leaf

  @parameterized.parameters('int4', 'fp8_e4m3', 'int8_dynamic', 'bf16')
  def test_same_layout_is_bit_exact(self, fmt):
    state, restored = self._roundtrip(dict(mu_format=fmt), dict(mu_format=fmt))
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored),
                    strict=True):
      self.assertEqual(a.dtype, b.dtype)
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  def test_layout_tag_in_keys(self):
    q = optax_q.quantize(jnp.ones((4, 256)), 'int4', block_size=64)
    keys = [jax.tree_util.keystr(p)
            for p, _ in jax.tree_util.tree_flatten_with_path(q)[0]]
    self.assertEqual(keys, ['.codes:int4:block:64:(4,256)',
                            '.scale:int4:block:64:(4,256)'])


if __name__ == '__main__':
  absltest.main()
