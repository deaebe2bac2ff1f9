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
"""Tests of the formats and codecs: ``quantize``, ``dequantize``, ``QArray``.

Grids are checked against ``ml_dtypes`` casts (which we did not write), the
error of every format and scaling mode against the spacing of its grid on
random shapes (hypothesis), and stochastic rounding for unbiasedness.
"""

import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import hypothesis
from hypothesis import strategies as st
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import optax_q
from optax_q._src.codec import packing
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.execution import fusion

ALL_FORMATS = ('bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e2m1',
               'fp4_e2m2u', 'int8', 'int8_dynamic', 'int4', 'e3m2', 'e2m3',
               'e5m6', 'e8m3')
SCALES = ('none', 'tensor', 'row', 'block')
_NATIVE = {
    'bf16': ml_dtypes.bfloat16,
    'fp16': np.float16,
    'fp8_e4m3': ml_dtypes.float8_e4m3fn,
    'fp8_e5m2': ml_dtypes.float8_e5m2,
    # Simulated formats whose finite, saturating grids ml_dtypes also has.
    'e3m2': ml_dtypes.float6_e3m2fn,
    'e2m3': ml_dtypes.float6_e2m3fn,
}


def _float_grid(ebits: int, mbits: int, max_value: float) -> np.ndarray:
  """Every value of a float grid with subnormals, up to ``max_value``."""
  bias = 2 ** (ebits - 1) - 1
  pos = {0.0}
  for e in range(2**ebits):
    for m in range(2**mbits):
      if e == 0:
        v = m * 2.0 ** (1 - bias - mbits)
      else:
        v = (1 + m / 2**mbits) * 2.0 ** (e - bias)
      if v <= max_value:
        pos.add(v)
  pos = np.array(sorted(pos))
  return np.concatenate([-pos[:0:-1], pos])


def _grid(fmt: optax_q.Format) -> np.ndarray | None:
  """The sorted values of a format's grid, or None if too large to list."""
  if fmt.kind == 'codebook':
    return np.unique(np.asarray(fmt.table, np.float64))
  if fmt.kind == 'int':
    q = int(fmt.max_value)
    return np.arange(-q, q + 1, dtype=np.float64)
  if fmt.bits > 10:
    return None
  return _float_grid(fmt.exponent_bits, fmt.mantissa_bits, fmt.max_value)


def _scales(x: np.ndarray, q: optax_q.QArray) -> np.ndarray:
  """Per-element scale, recomputed from ``x`` (independently of the codec)."""
  if q.scale_mode == 'none':
    return np.ones_like(x, np.float64)
  target = qarray_lib.scale_target(q.fmt)
  x2 = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
  if q.scale_mode == 'tensor':
    s = np.full_like(x2, np.max(np.abs(x2), initial=0.0) / target)
  elif q.scale_mode == 'row':
    s = np.broadcast_to(np.max(np.abs(x2), axis=1, keepdims=True) / target,
                        x2.shape)
  else:
    s = np.zeros_like(x2)
    for start in range(0, x2.shape[1], q.block_size):
      blk = x2[:, start:start + q.block_size]
      s[:, start:start + q.block_size] = (
          np.max(np.abs(blk), axis=1, keepdims=True) / target)
  return np.asarray(s, np.float64).reshape(x.shape)


def _error_bound(y: np.ndarray, fmt: optax_q.Format, stochastic: bool):
  """Largest allowed |decoded - y| in grid units (y = x / scale)."""
  grid = _grid(fmt)
  if grid is None:  # Wide float grids: relative spacing 2**-M, subnormals.
    bias = 2 ** (fmt.exponent_bits - 1) - 1
    ulp = np.maximum(np.abs(y), fmt.min_normal) * 2.0**-fmt.mantissa_bits
    ulp = np.maximum(ulp, 2.0 ** (1 - bias - fmt.mantissa_bits))
    over = np.maximum(np.abs(y) - fmt.max_value, 0)
    return (ulp if stochastic else ulp / 2) + over
  yc = np.clip(y, grid[0], grid[-1])
  hi_i = np.clip(np.searchsorted(grid, yc, side='left'), 0, grid.size - 1)
  lo_i = np.clip(hi_i - 1, 0, grid.size - 1)
  hi, lo = grid[hi_i], grid[lo_i]
  lo = np.where(hi == yc, hi, lo)
  gap = hi - lo
  nearest = np.minimum(yc - lo, hi - yc)
  return (gap if stochastic else nearest) + np.abs(y - yc)


@st.composite
def _cases(draw):
  ndim = draw(st.integers(0, 3))
  shape = tuple(draw(st.lists(st.integers(0, 9) if ndim > 1 else
                              st.integers(0, 300), min_size=ndim,
                              max_size=ndim)))
  if ndim == 1 and draw(st.booleans()):
    shape = (draw(st.integers(0, 9)),)
  block = draw(st.sampled_from([2, 4, 16, 64, 128]))
  scale = draw(st.sampled_from(SCALES))
  magnitude = draw(st.sampled_from([1e-12, 1e-3, 1.0, 1e4, 1e20]))
  seed = draw(st.integers(0, 2**31 - 1))
  return shape, block, scale, magnitude, seed


class GridTest(parameterized.TestCase):

  @parameterized.parameters(*_NATIVE)
  def test_nearest_matches_ml_dtypes(self, name):
    fmt = optax_q.get_format(name)
    rng = np.random.default_rng(0)
    x = np.concatenate([
        rng.standard_normal(4000) * 10.0 ** rng.integers(-12, 8, 4000),
        np.array([0.0, -0.0, fmt.max_value, -fmt.max_value,
                  min(fmt.max_value * 1.01, 3e38), -1e30, 1e30])])
    if fmt.min_normal > 1e-30:  # float32 subnormals are flushed on CPU.
      x = np.concatenate([x, [fmt.min_normal, fmt.min_normal / 3]])
    x = x.astype(np.float32)
    q = optax_q.quantize(x, name, scale_mode='none')
    got = np.asarray(optax_q.dequantize(q), np.float64)
    # ml_dtypes casts saturate for the finite 'fn' grids but overflow to
    # NaN/inf otherwise; we saturate every finite input.
    clipped = np.clip(x, -fmt.max_value, fmt.max_value)
    want = clipped.astype(_NATIVE[name]).astype(np.float64)
    np.testing.assert_array_equal(got, want)

  def test_e2m1_table_is_the_ocp_grid(self):
    fmt = optax_q.get_format('fp4_e2m1')
    codes = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
    want = np.unique(codes.astype(np.float64))
    np.testing.assert_array_equal(np.unique(fmt.table), want)

  def test_e2m2u_grid_is_positive(self):
    fmt = optax_q.get_format('fp4_e2m2u')
    table = np.unique(fmt.table)
    self.assertFalse(fmt.signed)
    self.assertGreater(table[0], 0)
    self.assertLen(table, 15)
    self.assertEqual(table[-1], 7.0)

  def test_dynamic_map_structure(self):
    signed = np.asarray(optax_q.get_format('int8_dynamic').table)
    self.assertLen(signed, 256)
    self.assertTrue(np.all(np.diff(signed) >= 0))
    self.assertIn(0.0, signed)
    self.assertEqual(signed[-1], 1.0)
    self.assertAlmostEqual(signed[0], -0.99297, places=4)
    # Seven decades of dynamic range below 1, as in Dettmers et al.
    pos = signed[signed > 0]
    self.assertLess(pos.min(), 1e-6)
    self.assertGreater(pos.min(), 1e-7)


# The default suite: each format once, the roundings in turn; the other
# rounding of each format in the slow suite.
_PAIRS = [(n, ('nearest', 'stochastic')[(i + j) % 2])
          for i, n in enumerate(ALL_FORMATS) for j in range(2)]
_PROPERTY = hypothesis.settings(
    max_examples=12, deadline=None, derandomize=True,
    suppress_health_check=list(hypothesis.HealthCheck))


class CodecPropertyTest(parameterized.TestCase):

  @parameterized.parameters(_PAIRS[::2])
  @_PROPERTY
  @hypothesis.given(case=_cases())
  def test_error_within_grid_spacing(self, name, rounding, case):
    self._check_error(name, rounding, case)

  @parameterized.parameters(_PAIRS[1::2])
  @pytest.mark.slow
  @_PROPERTY
  @hypothesis.given(case=_cases())
  def test_error_within_grid_spacing_other_rounding(self, name, rounding,
                                                    case):
    self._check_error(name, rounding, case)

  def _check_error(self, name, rounding, case):
    shape, block, scale, magnitude, seed = case
    fmt = optax_q.get_format(name)
    if scale == 'none' and fmt.kind != 'float':
      with self.assertRaisesRegex(ValueError, 'scale'):
        optax_q.quantize(jnp.zeros(shape), name, scale_mode=scale)
      return
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    if not fmt.signed:
      x = np.abs(x)
    q = optax_q.quantize(x, name, scale_mode=scale, block_size=block,
                         rounding=rounding, seed=seed % 1000)
    qarray_lib.check_qarray(q)
    got = np.asarray(optax_q.dequantize(q), np.float64)
    self.assertEqual(got.shape, x.shape)
    self.assertEqual(optax_q.dequantize(q).dtype, jnp.float32)
    self.assertTrue(np.all(np.isfinite(got)))
    s = _scales(x.astype(np.float64), q)
    safe = np.where(s > 0, s, 1.0)
    y = x / safe
    bound = _error_bound(y, fmt, rounding == 'stochastic')
    slack = 1e-5 * np.abs(y) + 1e-30
    np.testing.assert_array_less(np.abs(got - x) / safe, bound + slack)


class LayoutTest(parameterized.TestCase):

  @parameterized.parameters('int4', 'fp4_e2m1', 'fp4_e2m2u')
  def test_four_bit_codes_take_half_a_byte(self, name):
    x = jnp.ones((6, 257))
    q = optax_q.quantize(x, name, block_size=128)
    self.assertEqual(q.codes.shape, (6, 129))
    self.assertEqual(q.codes.dtype, jnp.uint8)
    self.assertEqual(q.scale.shape, (6, 3))
    self.assertEqual(q.nbytes, 6 * 129 + 6 * 3 * 4)
    self.assertEqual(optax_q.state_nbytes(q), q.nbytes)

  def test_pack_roundtrip_odd(self):
    codes = jnp.asarray(np.random.default_rng(0).integers(0, 16, (3, 11)),
                        jnp.uint8)
    packed = packing.pack_nibbles(codes)
    self.assertEqual(packed.shape, (3, 6))
    np.testing.assert_array_equal(packing.unpack_nibbles(packed, 11), codes)

  @parameterized.parameters('int4', 'fp4_e2m1', 'fp8_e4m3', 'int8_dynamic')
  def test_unchanged_count_matches_unpacked_codes(self, name):
    x = jax.random.normal(jax.random.key(0), (5, 7))
    y = x.at[:, ::2].multiply(1.7)
    a, b = optax_q.quantize(x, name), optax_q.quantize(y, name)
    ca, cb = np.asarray(a.codes), np.asarray(b.codes)
    if a.fmt.packed:
      ca = np.asarray(packing.unpack_nibbles(a.codes, 7))
      cb = np.asarray(packing.unpack_nibbles(b.codes, 7))
    want = np.sum(ca.view(np.uint8) == cb.view(np.uint8))
    self.assertEqual(float(qarray_lib.unchanged_count(a, b)), want)
    self.assertLess(want, 35)

  @parameterized.parameters(('tensor', (1, 1, 1)), ('row', (2, 3, 1)),
                            ('block', (2, 3, 2)))
  def test_scale_keeps_rank(self, scale, scale_shape):
    q = optax_q.quantize(jnp.ones((2, 3, 100)), 'int8', scale_mode=scale,
                         block_size=64)
    self.assertEqual(q.codes.shape, (2, 3, 100))
    self.assertEqual(q.scale.shape, scale_shape)

  def test_qarray_is_a_pytree_of_arrays(self):
    q = optax_q.quantize(jnp.ones((4, 256)), 'int4')
    leaves = jax.tree.leaves(q)
    self.assertLen(leaves, 2)
    doubled = jax.tree.map(lambda a: a, q)
    self.assertEqual(doubled.fmt, q.fmt)
    out = jax.jit(optax_q.dequantize)(q)
    np.testing.assert_array_equal(out, optax_q.dequantize(q))

  def test_logical_dtype_is_kept(self):
    x = jnp.ones((3, 130), jnp.bfloat16)
    q = optax_q.quantize(x, 'int8')
    self.assertEqual(optax_q.dequantize(q).dtype, jnp.bfloat16)


_NAN_FORMATS = ('int4', 'nf3', 'fp4_e2m2u', 'fp8_e4m3', 'fp8_e4m3_dre',
                'int8', 'nf4', 'fp4_e2m1', 'int8_dynamic', 'fp8_e5m2', 'e3m2',
                'ue2m2')
_roundtrip = jax.jit(
    lambda x, fmt, mode, rounding: optax_q.dequantize(optax_q.quantize(
        x, fmt, scale_mode=mode, block_size=64, rounding=rounding)),
    static_argnums=(1, 2, 3))


def _non_finite_input(fmt):
  """A (4, 200) array with a NaN at (1, 5) and huge finite values at (2, 3)
  (3e38) and (3, 4) (2e19, whose square overflows float32)."""
  x = jax.random.normal(jax.random.key(0), (4, 200))
  x = x if optax_q.get_format(fmt).signed else jnp.abs(x)
  return x.at[1, 5].set(jnp.nan).at[2, 3].set(3e38).at[3, 4].set(2e19)


class NanInItsElementTest(parameterized.TestCase):
  """A NaN stays in its own element in every scaled codec path, as in
  float32, and huge finite values stay finite."""

  def _check(self, out, x):
    out, x = np.asarray(out), np.asarray(x)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(x))
    self.assertTrue(np.all(np.isfinite(out[np.isfinite(x)])))

  @parameterized.product(fmt=_NAN_FORMATS[:5],
                         mode=('block', 'row', 'tensor', 'rank1'))
  def test_codec(self, fmt, mode):
    self._check_codec(fmt, mode)

  @parameterized.product(fmt=_NAN_FORMATS[5:],
                         mode=('block', 'row', 'tensor', 'rank1'))
  @pytest.mark.slow
  def test_codec_slow(self, fmt, mode):
    self._check_codec(fmt, mode)

  def _check_codec(self, fmt, mode):
    if mode == 'rank1' and optax_q.get_format(fmt).expand:
      return  # Range expansion takes block, row and tensor scales.
    x = _non_finite_input(fmt)
    for rounding in ('nearest', 'stochastic'):
      self._check(_roundtrip(x, fmt, mode, rounding), x)
    # The other elements of the NaN's row keep their values, to within the
    # grid's coarsest spacing (nf3) of the row's maximum (without the huge
    # values, which would set a tensor's or a column's scale).
    x = jnp.where(jnp.abs(x) > 1e3, 1.0, x)
    out = np.delete(np.asarray(_roundtrip(x, fmt, mode, 'nearest'))[1], 5)
    row = np.delete(np.asarray(x)[1], 5)
    np.testing.assert_allclose(out, row, rtol=0,
                               atol=0.35 * np.max(np.abs(row)))

  @parameterized.product(fmt=('int8', 'fp8_e4m3', 'nf4'),
                         mode=('block', 'row', 'tensor'))
  def test_gradient_and_weight_paths(self, fmt, mode):
    x = {'w': _non_finite_input(fmt)}
    tx = optax_q.quantize_gradients(fmt, scale_mode=mode)
    self._check(jax.jit(tx.update)(x, tx.init(x))[0]['w'], x['w'])
    q = optax_q.quantize_params(x, fmt, scale_mode=mode, filter='all')
    self._check(optax_q.dequantize_params(q)['w'], x['w'])
    self._check(optax_q.fake_quantize_params(
        x, fmt, scale_mode=mode, filter='all')['w'], x['w'])
    training = optax_q.quantized_training({'g': fmt}, scale_mode=mode)
    tx = training.optimizer(optax.sgd(1.0))
    self._check(-jax.jit(tx.update)(x, tx.init(x))[0]['w'], x['w'])


class SpecialValuesTest(parameterized.TestCase):

  @parameterized.parameters(*ALL_FORMATS)
  def test_all_zero_block_decodes_to_zero(self, name):
    x = jnp.zeros((2, 256)).at[1, 200].set(3.0)
    fmt = optax_q.get_format(name)
    scale = 'block' if fmt.kind != 'float' or fmt.scaled else 'none'
    out = optax_q.dequantize(
        optax_q.quantize(x, name, scale_mode=scale, block_size=128))
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(out[1, :128], 0.0)

  @parameterized.parameters('fp8_e4m3', 'fp8_e5m2', 'e3m2')
  def test_finite_inputs_never_become_nan(self, name):
    x = jnp.array([1e30, -1e30, 464.0, 465.0, 1e4, 6e4, 7e4, 1e-40])
    for scale in ('none', 'block', 'tensor'):
      out = optax_q.dequantize(optax_q.quantize(x, name, scale_mode=scale))
      self.assertTrue(bool(jnp.all(jnp.isfinite(out))), (name, scale, out))

  def test_non_finite_scaled_block_keeps_nan_in_its_element(self):
    x = jnp.ones((2, 128)).at[0, 5].set(jnp.nan)
    out = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, 'int8', block_size=64)))
    self.assertTrue(np.isnan(out[0, 5]))
    # Its block's scale is rounded down to 13 mantissa bits.
    np.testing.assert_allclose(np.delete(out[0], 5), 1.0, rtol=2e-4)
    np.testing.assert_array_equal(out[1], 1.0)
    x = jnp.ones((128,)).at[3].set(jnp.inf).at[5].set(jnp.nan)
    out = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, 'fp8_e4m3', block_size=64)))
    self.assertTrue(np.all(np.isnan(out[[3, 5]])))
    np.testing.assert_allclose(np.delete(out, [3, 5]), 1.0, rtol=2e-4)

  def test_non_finite_unscaled(self):
    x = jnp.array([jnp.nan, jnp.inf, -jnp.inf, 1.0])
    bf = optax_q.dequantize(optax_q.quantize(x, 'bf16'))
    self.assertTrue(bool(jnp.isnan(bf[0])))
    self.assertEqual(float(bf[1]), np.inf)
    self.assertEqual(float(bf[2]), -np.inf)
    e4 = optax_q.dequantize(optax_q.quantize(x, 'fp8_e4m3', scale_mode='none'))
    self.assertTrue(bool(jnp.all(jnp.isnan(e4[:3]))))
    self.assertEqual(float(e4[3]), 1.0)


class StochasticRoundingTest(parameterized.TestCase):

  @parameterized.parameters('bf16', 'fp8_e4m3', 'fp8_e5m2', 'int8',
                            'int8_dynamic', 'int4', 'fp4_e2m1', 'e3m2')
  def test_unbiased(self, name):
    n = 100_000
    # One 1.0 per block pins the scale; the rest sits between grid points.
    target = 0.3137
    x = jnp.full((n // 100, 100), target).at[:, 0].set(1.0)
    fmt = optax_q.get_format(name)
    scale = 'none' if fmt.kind == 'float' and not fmt.scaled else 'block'
    q = optax_q.quantize(x, name, scale_mode=scale, block_size=100,
                         rounding='stochastic', seed=3)
    vals = np.asarray(optax_q.dequantize(q), np.float64)[:, 1:]
    near = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, name, scale_mode=scale, block_size=100)))[:, 1:]
    self.assertGreater(np.abs(near - target).max(), 1e-4)  # Not on the grid.
    self.assertLen(np.unique(vals), 2)
    gap = np.ptp(np.unique(vals))
    sigma = gap / 2 / math.sqrt(vals.size)
    self.assertLess(abs(vals.mean() - target), 5 * sigma + 1e-7)

  def test_unbiased_over_steps_at_one_element(self):
    x = jnp.array([1.0, 0.3])
    draws = jax.jit(jax.vmap(lambda s: optax_q.dequantize(optax_q.quantize(
        x, 'int4', rounding='stochastic', seed=0, step=s))[1]))(
            jnp.arange(2000))
    # 0.3 * 7 = 2.1 -> 2/7 or 3/7 with p(up) = 0.1.
    self.assertLen(np.unique(np.asarray(draws)), 2)
    self.assertAlmostEqual(float(draws.mean()), 0.3, delta=0.01)

  def test_deterministic_from_seed(self):
    x = jax.random.normal(jax.random.key(0), (64, 256))
    a = optax_q.quantize(x, 'fp8_e4m3', rounding='stochastic', seed=7, step=3)
    b = optax_q.quantize(x, 'fp8_e4m3', rounding='stochastic', seed=7, step=3)
    c = optax_q.quantize(x, 'fp8_e4m3', rounding='stochastic', seed=7, step=4)
    d = optax_q.quantize(x, 'fp8_e4m3', rounding='stochastic', seed=8, step=3)
    codes = lambda q: np.asarray(q.codes).view(np.uint8)
    np.testing.assert_array_equal(codes(a), codes(b))
    self.assertGreater(np.mean(codes(a) != codes(c)), 0.1)
    self.assertGreater(np.mean(codes(a) != codes(d)), 0.1)
    jitted = jax.jit(lambda x: optax_q.quantize(
        x, 'fp8_e4m3', rounding='stochastic', seed=7, step=3))(x)
    np.testing.assert_array_equal(codes(jitted), codes(a))


class StaticTableSearchTest(parameterized.TestCase):
  """The search of big static tables (one packed-word gather per element)
  gives the reference index at every step, next to it and between."""

  @parameterized.product(
      name=('int8_dynamic', 'int8_dynamic_unsigned', 'int8_dynamic@sqrt',
            'ue4m3', 'ue7m1', 'ue8m0'),
      mode=('nearest', 'nearest_even', 'floor'))
  def test_matches_the_reference_index(self, name, mode):
    fmt = optax_q.get_format(name)
    table = fmt.table
    t = np.asarray(table, np.float32)
    _, thr, _ = rounding_lib._table_steps(table, mode, fmt.space)
    self.assertTrue(rounding_lib.bucketed(table, mode, fmt.space))
    rng = np.random.default_rng(0)
    top = np.log10(np.max(np.abs(t)))
    x = np.concatenate([
        thr, np.nextafter(thr, -np.inf), np.nextafter(thr, np.inf),
        t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf),
        [0.0, -0.0, np.inf, -np.inf],
        rng.uniform(t[0], t[-1], 20000),
        np.sign(rng.standard_normal(20000))
        * 10.0 ** rng.uniform(-45, top, 20000)]).astype(np.float32)
    x = np.clip(x, t[0], t[-1])
    if mode == 'floor':
      want = rounding_lib._table_floor(x, t)
    else:
      even = (rounding_lib._even_positions(t) if mode == 'nearest_even'
              else None)
      want = rounding_lib._table_nearest(x, t, fmt.space, even)
    got = jax.jit(lambda v: rounding_lib._static_index(
        v, table, mode, fmt.space))(x)
    np.testing.assert_array_equal(np.asarray(got), want)
    # NaN (mapped away by the encoders) still gets an index of the table.
    nan = jax.jit(lambda v: rounding_lib._static_index(
        v, table, mode, fmt.space))(jnp.full((3,), jnp.nan))
    self.assertTrue(np.all(np.asarray(nan) >= 0))
    self.assertTrue(np.all(np.asarray(nan) < len(table)))

  @parameterized.parameters('int8_dynamic', 'int8_dynamic_unsigned',
                            'int8_dynamic@sqrt', 'ue4m3')
  def test_stochastic_matches_the_binary_search(self, name):
    # The static path (floor search, one gather of the entry and one of the
    # gap) against the traced binary search over the same table, with the
    # draws at the exact fractions too (a fraction one rounding off would
    # flip those). Tables and inputs with normal values only: the binary
    # search's float comparisons may flush subnormals (ue7m1, ue8m0), the
    # static path's integer keys do not.
    fmt = optax_q.get_format(name)
    t = np.asarray(fmt.table, np.float32)
    rng = np.random.default_rng(2)
    x = np.concatenate([
        t, np.nextafter(t, -np.inf), np.nextafter(t, np.inf),
        (t[:-1] + t[1:]) / np.float32(2), [0.0, -0.0],
        rng.uniform(t[0], t[-1], 20000),
        np.sign(rng.standard_normal(20000))
        * 10.0 ** rng.uniform(-37, 0, 20000)]).astype(np.float32)
    x = np.clip(x, t[0], t[-1])  # Normal inputs (see above).
    lo = rounding_lib._table_floor(x, t)
    with np.errstate(invalid='ignore', divide='ignore'):
      frac = rounding_lib._fraction(x, t[lo], t[lo + 1], fmt.space, np)
    frac = np.nan_to_num(frac.astype(np.float32))
    for u in (rng.uniform(0, 1, x.size).astype(np.float32), frac,
              np.nextafter(frac, np.float32(2))):
      static, searched = (jax.jit(lambda v, w, tab=tab: rounding_lib.round_to_table(
          v, tab, w, fmt.space))(x, u) for tab in (fmt.table, jnp.asarray(t)))
      np.testing.assert_array_equal(np.asarray(static), np.asarray(searched))

  def test_searched_word_is_read_once(self):
    # XLA:CPU fuses a gather into its consumer only where the gather has one
    # user; else the gathered words are written out and read back.
    table = optax_q.get_format('int8_dynamic').table
    for mode in ('nearest', 'floor'):
      jaxpr = jax.make_jaxpr(lambda v, mode=mode: rounding_lib._static_index(
          v, table, mode))(jnp.ones((8,), jnp.float32)).jaxpr
      gathers = [e for e in jaxpr.eqns if e.primitive.name == 'gather']
      self.assertLen(gathers, 1)
      out = gathers[0].outvars[0]
      users = [e for e in jaxpr.eqns if any(v is out for v in e.invars)]
      self.assertLen(users, 1)

  @parameterized.parameters('ue7m1', 'ue8m0')
  def test_wide_unsigned_grids_encode(self, name):
    # Their steps were too close for the old buckets (an error at trace).
    x = np.geomspace(1e-12, 1.0, 999).astype(np.float32)
    q = optax_q.quantize(x, name, scale_mode='tensor')
    got = np.asarray(optax_q.dequantize(q))
    self.assertTrue(np.all(np.isfinite(got)))
    np.testing.assert_array_less(np.abs(np.log2(got / x)), 1.0 + 1e-6)


class ScalesApartTest(parameterized.TestCase):
  """Block scales computed apart (the tiled loop on CPU) change nothing:
  the same codes and scales as the fused encoder, bit for bit."""

  @parameterized.product(
      name=('fp8_e4m3', 'int8_dynamic', 'int8_dynamic_unsigned', 'int4',
            'fp4_e2m1', 'nf4'),
      stochastic=(False, True))
  def test_same_codes_and_scales(self, name, stochastic):
    fmt = optax_q.get_format(name)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((24, 384))
         * 10.0 ** rng.uniform(-40, 30, (24, 1))).astype(np.float32)
    if not fmt.signed:
      x = np.abs(x)
    x[0, :5] = [np.inf, -np.inf, np.nan, 0.0, 1e-45]
    x[1, 128:256] = 0.0
    x[2, :] = np.float32(3e38)
    key = jnp.uint32(7) if stochastic else None

    def encode(v, t, apart):
      q = qarray_lib.encode(v, fmt, scale_mode='block', block_size=128,
                            key=key, row_stride=3, row_offset=t,
                            materialize=fusion.apart_with(
                                t if apart else None))
      return q.codes, q.scale

    fused = jax.jit(functools.partial(encode, apart=False))(x, jnp.int32(2))
    apart = jax.jit(functools.partial(encode, apart=True))(x, jnp.int32(2))
    for a, b in zip(fused, apart):
      np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                    np.asarray(b).view(np.uint8))
    # Lowered for CPU the scales are a conditional's results.
    lowered = jax.jit(functools.partial(encode, apart=True)).lower(
        x, jnp.int32(2)).as_text()
    self.assertIn('stablehlo.case', lowered)


class ScaleSourceTest(parameterized.TestCase):
  """Scales taken from a second evaluation of the values (``scale_source``,
  the plan of a GPU or TPU): the same bits where it equals them; where it
  differs in the last bits, as a differently contracted multiply-add makes
  it, finite codes within a code step of the values."""

  def _x(self, fmt):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((16, 384))
         * 10.0 ** rng.uniform(-30, 30, (16, 1))).astype(np.float32)
    if not fmt.signed:
      x = np.abs(x)
    x[0, :5] = [np.inf, -np.inf if fmt.signed else np.inf, np.nan, 0.0,
                1e-45]
    x[1, 128:256] = 0.0
    x[2, :] = np.float32(3e38)
    return x

  @parameterized.product(
      name=('fp8_e4m3', 'int8_dynamic', 'nf4', 'ue4m0'),
      scale_mode=('block', 'block_pow2'), stochastic=(False, True))
  def test_same_bits_when_equal(self, name, scale_mode, stochastic):
    fmt = optax_q.get_format(name)
    x = self._x(fmt)
    key = jnp.uint32(7) if stochastic else None
    encode = jax.jit(lambda v, s: qarray_lib.encode(
        v, fmt, scale_mode=scale_mode, block_size=128, key=key,
        scale_source=s))
    plain = qarray_lib.encode(x, fmt, scale_mode=scale_mode, block_size=128,
                              key=key)
    # A copy the compiler cannot tell is the same array.
    got = encode(x, jnp.asarray(x.copy()))
    for a, b in ((plain.codes, got.codes), (plain.scale, got.scale)):
      np.testing.assert_array_equal(np.asarray(a).view(np.uint8),
                                    np.asarray(b).view(np.uint8))

  @parameterized.parameters('fp8_e4m3', 'int8_dynamic', 'int4', 'ue4m0')
  def test_last_bits_apart_are_clipped(self, name):
    fmt = optax_q.get_format(name)
    x = self._x(fmt)
    finite = np.isfinite(x).all(axis=1)
    x, source = x[finite], np.nextafter(x[finite], np.float32(0))
    q = qarray_lib.encode(x, fmt, scale_mode='block', block_size=128,
                          key=None, scale_source=source)
    want = qarray_lib.encode(source, fmt, scale_mode='block',
                             block_size=128, key=None)
    got = np.asarray(qarray_lib.decode(q))
    self.assertTrue(np.all(np.isfinite(got)))
    np.testing.assert_array_equal(np.asarray(q.scale), np.asarray(want.scale))
    # One ulp apart with the same scales, the values take the source's
    # codes but where the source sits on a rounding boundary.
    same = got == np.asarray(qarray_lib.decode(want))
    self.assertGreater(same.mean(), 0.995)


class BadInputTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(fmt='fp7'), 'Unknown format'),
      (dict(fmt='e9m3'), 'Unknown format'),
      (dict(fmt=3), 'format must be'),
      (dict(rounding='up'), 'rounding must be one of'),
      (dict(scale='col'), 'scale must be one of'),
      (dict(block_size=0), 'block_size'),
      (dict(block_size=-4), 'block_size'),
      (dict(block_size=3), 'block_size'),
      (dict(block_size=2.0), 'block_size'),
      (dict(fmt='int8', scale='none'), "scale='none'"),
  )
  def test_value_errors(self, kwargs, msg):
    kwargs = dict(dict(fmt='fp8_e4m3'), **kwargs)
    fmt = kwargs.pop('fmt')
    with self.assertRaisesRegex(ValueError, msg):
      optax_q.quantize(jnp.ones((4, 8)), fmt, **kwargs)

  def test_dequantize_needs_a_qarray(self):
    with self.assertRaisesRegex(ValueError, 'QArray'):
      optax_q.dequantize(jnp.ones(3))

  def test_error_lists_allowed_formats(self):
    with self.assertRaisesRegex(ValueError, 'int8_dynamic'):
      optax_q.get_format('nope')


if __name__ == '__main__':
  absltest.main()
