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
"""The low-bit codecs: grids, 3-bit packing, rounding spaces, bad names,
fp8 with dynamic range expansion and rank-1 normalisation.

The optimizer matrix (``test_optimizer_matrix.py``) runs AdamW with them
through sharding, tiling, checkpoints, ``inject_hyperparams`` and
``MultiSteps``; ``test_explicit_mesh.py`` encodes them on 8-device meshes.
"""

import math

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from optax_q._src.codec import packing
from optax_q._src.codec import qarray
import pytest

# QLoRA's NF4 values as the paper's code lists them (Dettmers et al. 2023,
# arXiv 2305.14314, appendix E), to 7 decimals.
QLORA_NF4 = (
    -1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734,
    -0.0910500, 0.0, 0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098,
    0.5626170, 0.7229568, 1.0)

NEW_FORMATS = ('nf4', 'nf3', 'ue4m0', 'ue3m1', 'ue3m0', 'ue2m1', 'ue5m3',
               'int4_sqrt', 'int3_sqrt', 'int4_mulaw', 'int3_mulaw',
               'int4_softsign', 'int3_softsign', 'int4_sqrt_unsigned',
               'int3_mulaw_unsigned', 'ue4m0@rsqrt', 'ue3m0@log',
               'int4_sqrt@sqrt', 'fp4_e2m2u@rsqrt', 'nf4@sqrt')


class GridTest(parameterized.TestCase):

  def test_nf4_is_qlora_nf4(self):
    np.testing.assert_allclose(optax_q.get_format('nf4').table, QLORA_NF4,
                               atol=1e-6)

  def test_nf3_is_the_same_construction(self):
    t = optax_q.get_format('nf3').table
    self.assertLen(t, 8)
    self.assertEqual((t[0], t[3], t[-1]), (-1.0, 0.0, 1.0))
    self.assertEqual(sum(v > 0 for v in t), 4)

  def test_unsigned_power_of_two_grids(self):
    self.assertEqual(optax_q.get_format('ue4m0').table,
                     tuple(2.0**-k for k in range(15, -1, -1)))
    t = optax_q.get_format('ue3m1').table
    self.assertEqual((t[0], t[1], t[-1], len(set(t))),
                     (2.0**-7, 1.5 * 2.0**-7, 1.5, 16))
    self.assertEqual(optax_q.get_format('ue3m0').table,
                     tuple(2.0**-k for k in range(7, -1, -1)))

  def test_companded_grids(self):
    sqrt = optax_q.get_format('int4_sqrt_unsigned').table
    np.testing.assert_allclose(sqrt, [((k + 1) / 16)**2 for k in range(16)],
                               rtol=1e-6)
    soft = optax_q.get_format('int4_softsign').table
    np.testing.assert_allclose(soft[-1], 1.0)
    np.testing.assert_allclose(soft[-2], (6 / 7) / (2 - 6 / 7), rtol=1e-6)
    mulaw = optax_q.get_format('int4_mulaw_unsigned').table
    # mu-law: equal ratios between neighbours away from zero.
    ratios = np.array(mulaw[9:]) / np.array(mulaw[8:-1])
    np.testing.assert_allclose(ratios, ratios[-1], rtol=0.01)
    self.assertEqual(mulaw[-1], 1.0)

  @parameterized.parameters(*NEW_FORMATS)
  def test_format_facts(self, name):
    fmt = optax_q.get_format(name)
    self.assertEqual(optax_q.get_format(fmt.name), fmt)
    self.assertEqual(fmt.kind, 'codebook')
    self.assertLessEqual(len(fmt.table), 2**fmt.bits)
    self.assertEqual(list(fmt.table), sorted(fmt.table))
    self.assertTrue(fmt.packed == (fmt.bits in (3, 4)))
    self.assertEqual(fmt.container_bits, fmt.bits if fmt.packed else 8)

  @parameterized.parameters(
      ('int4_sqrt', 'int4_sqrt_unsigned'), ('int3_mulaw', 'int3_mulaw_unsigned'),
      ('ue4m0', 'ue4m0'), ('ue4m0@rsqrt', 'ue4m0@rsqrt'),
      ('int4_softsign@sqrt', 'int4_softsign_unsigned@sqrt'),
      ('fp4_e2m1@sqrt', 'fp4_e2m2u@sqrt'))
  def test_unsigned_variant(self, name, want):
    got = optax_q.unsigned_variant(name)
    self.assertEqual(got.name, want)
    self.assertGreater(min(got.table), 0)


class PackingTest(parameterized.TestCase):

  @parameterized.parameters(1, 7, 8, 9, 16, 300, 1025)
  def test_three_bit_round_trip(self, n):
    codes = np.random.default_rng(n).integers(0, 8, (3, n)).astype(np.uint8)
    packed = packing.pack(jnp.asarray(codes), 3)
    self.assertEqual(packed.shape, (3, 3 * math.ceil(n / 8)))
    np.testing.assert_array_equal(packing.unpack(packed, n, 3), codes)

  def test_three_bit_layout(self):
    # Code 8i + j takes bits 3j .. 3j + 2 of the little-endian 24-bit word.
    packed = np.asarray(packing.pack(jnp.arange(8, dtype=jnp.uint8), 3))
    word = int(packed[0]) | int(packed[1]) << 8 | int(packed[2]) << 16
    self.assertEqual([(word >> (3 * j)) & 7 for j in range(8)],
                     list(range(8)))

  @parameterized.parameters(('nf3', 3), ('ue3m0', 3), ('nf4', 4),
                            ('ue5m3', 8))
  def test_real_bytes(self, name, bits):
    x = jnp.ones((64, 1024))
    q = optax_q.quantize(x, name)
    self.assertEqual(q.nbytes, 64 * 1024 * bits // 8 + 64 * 8 * 4)
    self.assertEqual(optax_q.dequantize(q).shape, x.shape)

  def test_unchanged_count_three_bit(self):
    x = jnp.linspace(0.01, 1.0, 300).reshape(3, 100)
    a = optax_q.quantize(x, 'ue3m0')
    b = optax_q.quantize(x.at[2, 5].set(0.1), 'ue3m0')  # Same scales.
    self.assertEqual(float(qarray.unchanged_count(a, a)), 300.0)
    self.assertEqual(float(qarray.unchanged_count(a, b)), 299.0)


def _stochastic(x, fmt, n=4096):
  """Decoded stochastic roundings of ``x`` in a block whose max is 1."""
  block = jnp.full((n, 128), x, jnp.float32).at[:, 0].set(1.0)
  q = optax_q.quantize(block, fmt, rounding='stochastic', seed=5)
  return np.asarray(optax_q.dequantize(q))[:, 1:].ravel()


_ODD_FORMATS = (('nf3', 'block'), ('ue4m0@rsqrt', 'block_pow2'),
                ('int3_mulaw', 'row'), ('nf3', 'tensor'),
                ('int4', 'block_pow2'), ('ue3m0', 'block_pow2'))
_ODD_SHAPES = ((), (0,), (3, 0), (2, 3, 5), (1,), (9,))
# The default suite: every format with three of the shapes and every shape
# with two to four formats, each scale mode with the scalar, an empty shape
# and (block, row, power-of-two) the rank-3 one; every pair is slow.
_SOME_ODD = (
    (_ODD_FORMATS[0], ()), (_ODD_FORMATS[0], (3, 0)),
    (_ODD_FORMATS[0], (2, 3, 5)),
    (_ODD_FORMATS[1], (0,)), (_ODD_FORMATS[1], (1,)), (_ODD_FORMATS[1], (9,)),
    (_ODD_FORMATS[2], ()), (_ODD_FORMATS[2], (0,)),
    (_ODD_FORMATS[2], (2, 3, 5)),
    (_ODD_FORMATS[3], ()), (_ODD_FORMATS[3], (3, 0)), (_ODD_FORMATS[3], (9,)),
    (_ODD_FORMATS[4], ()), (_ODD_FORMATS[4], (2, 3, 5)),
    (_ODD_FORMATS[4], (1,)),
    (_ODD_FORMATS[5], (0,)), (_ODD_FORMATS[5], (3, 0)), (_ODD_FORMATS[5], (9,)),
)


class OddShapeTest(parameterized.TestCase):

  @parameterized.parameters(*_SOME_ODD)
  def test_round_trip(self, name_and_mode, shape):
    self._check_round_trip(name_and_mode, shape)

  @parameterized.product(name_and_mode=_ODD_FORMATS, shape=_ODD_SHAPES)
  @pytest.mark.slow
  def test_round_trip_every_pair(self, name_and_mode, shape):
    self._check_round_trip(name_and_mode, shape)

  def _check_round_trip(self, name_and_mode, shape):
    name, scale_mode = name_and_mode
    # A constant block is its own maximum: exact in every scale mode.
    x = jnp.full(shape, 4.0) if shape else jnp.float32(4.0)
    q = optax_q.quantize(x, name, scale_mode=scale_mode,
                         rounding='stochastic')
    qarray.check_qarray(q)
    y = optax_q.dequantize(q)
    self.assertEqual(y.shape, x.shape)
    np.testing.assert_array_equal(y, x)
    self.assertEqual(float(qarray.unchanged_count(q, q)), x.size)


class RoundingSpaceTest(parameterized.TestCase):

  @parameterized.parameters(*NEW_FORMATS)
  def test_grid_values_are_exact(self, name):
    fmt = optax_q.get_format(name)
    t = jnp.asarray(fmt.table, jnp.float32) / max(map(abs, fmt.table))
    for rounding in ('nearest', 'stochastic'):
      q = optax_q.quantize(t * 3.0, fmt, rounding=rounding)
      np.testing.assert_allclose(optax_q.dequantize(q), t * 3.0, rtol=1e-6)

  @parameterized.parameters(
      # Between 0.5 and 1: midpoints 0.75 (linear), 0.7071 (log),
      # 0.7286 (sqrt), 0.6863 (rsqrt: -1/sqrt(x) halfway).
      ('ue4m0', 0.74, 0.5), ('ue4m0', 0.76, 1.0),
      ('ue4m0@log', 0.70, 0.5), ('ue4m0@log', 0.72, 1.0),
      ('ue4m0@sqrt', 0.72, 0.5), ('ue4m0@sqrt', 0.74, 1.0),
      ('ue4m0@rsqrt', 0.68, 0.5), ('ue4m0@rsqrt', 0.69, 1.0))
  def test_nearest_midpoint_in_its_space(self, name, x, want):
    block = jnp.array([[1.0, x]])
    got = optax_q.dequantize(optax_q.quantize(block, name))
    self.assertEqual(float(got[0, 1]), want)

  @parameterized.parameters(
      ('ue4m0', lambda v: v), ('ue4m0@log', np.log),
      ('ue4m0@sqrt', np.sqrt), ('ue4m0@rsqrt', lambda v: 1 / np.sqrt(v)),
      ('int4_mulaw_unsigned@rsqrt', lambda v: 1 / np.sqrt(v)))
  def test_stochastic_unbiased_in_its_space(self, name, g):
    x = 0.7
    got = _stochastic(x, name)
    self.assertGreater(len(set(got.tolist())), 1)
    mean = float(np.mean(g(got.astype(np.float64))))
    se = float(np.std(g(got.astype(np.float64)))) / math.sqrt(got.size)
    self.assertLess(abs(mean - g(x)), 5 * se + 1e-7)

  def test_update_space_is_biased_in_v(self):
    # Unbiased in the convex, decreasing 1/sqrt(v) means E[v] above v
    # (Jensen): P(up) = (1/sqrt(.5) - 1/sqrt(.7)) / (1/sqrt(.5) - 1) = 0.529,
    # E[v] = 0.764.
    self.assertAlmostEqual(
        float(np.mean(_stochastic(0.7, 'ue4m0@rsqrt'))), 0.764, delta=0.01)

  @parameterized.parameters('ue4m0', 'nf3', 'int4_mulaw', 'ue3m0@rsqrt')
  def test_special_values(self, name):
    x = jnp.array([[1e-30, 3e38, -2.0, 0.0, jnp.inf, 1.0],
                   [0.0] * 6, [1e-38, 1e-37, 1e-36, 1e-35, 1e-34, 1e-33]])
    x = jnp.abs(x) if not optax_q.get_format(name).signed else x
    q = optax_q.quantize(x, name, block_size=2, rounding='stochastic')
    y = np.asarray(optax_q.dequantize(q))
    finite = np.isfinite(np.asarray(x))
    self.assertTrue(np.all(np.isfinite(y[finite])))
    self.assertEqual(y[0, 4], np.inf)
    np.testing.assert_array_equal(y[1], 0.0)
    nan = np.asarray(optax_q.dequantize(optax_q.quantize(
        jnp.array([1.0, jnp.nan, 2.0, 3.0]), name, block_size=2)))
    np.testing.assert_array_equal(np.isnan(nan), [False, True, False, False])


class PowerOfTwoScaleTest(parameterized.TestCase):

  @parameterized.parameters('fp8_e4m3', 'nf4', 'ue4m0', 'int4', 'int8_dynamic',
                            'nf3', 'e3m2')
  def test_smallest_power_of_two(self, name):
    fmt = optax_q.get_format(name)
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(0, 20, (64, 1))) * rng.normal(0, 1, (64, 256))
    x = np.abs(x) if not fmt.signed else x
    x = jnp.asarray(np.clip(x, -1e37, 1e37), jnp.float32)
    q = optax_q.quantize(x, fmt, scale_mode='block_pow2')
    self.assertEqual(q.scale.dtype, jnp.uint8)
    self.assertEqual(q.scale.shape, (64, 2))
    e = np.asarray(q.scale, np.float64) - 127
    absmax = np.abs(np.asarray(x, np.float64)).reshape(64, 2, 128).max(-1)
    target = qarray.scale_target(fmt)
    inside = absmax >= 2.0**-100  # Away from the clipped exponents.
    self.assertTrue(np.all((target * 2**e >= absmax)[inside]))
    self.assertTrue(np.all((target * 2**(e - 1) < absmax)[inside]))
    y = np.asarray(optax_q.dequantize(q))
    self.assertTrue(np.all(np.isfinite(y)))

  def test_bits_and_error_next_to_float32_scales(self):
    x = jax.random.normal(jax.random.key(0), (256, 1024))
    for name in ('nf4', 'fp8_e4m3'):
      f32 = optax_q.quantize(x, name)
      pow2 = optax_q.quantize(x, name, scale_mode='block_pow2')
      self.assertEqual(8 * pow2.nbytes / x.size,
                       8 * f32.nbytes / x.size - 32 / 128 + 8 / 128)
      err = lambda q: float(jnp.linalg.norm(optax_q.dequantize(q) - x))
      # At most one binade of the grid is left unused.
      self.assertLess(err(pow2), 1.5 * err(f32))

  @parameterized.parameters('ue4m0', 'fp8_e4m3', 'nf3')
  def test_special_blocks(self, name):
    x = jnp.array([[0.0, 0.0], [1.0, jnp.inf], [jnp.nan, 1.0],
                   [3e38, 1.0], [2.0, 1e-30]])
    q = optax_q.quantize(x, name, scale_mode='block_pow2', block_size=2,
                         rounding='stochastic')
    np.testing.assert_array_equal(np.asarray(q.scale)[:3, 0], [0, 255, 255])
    y = np.asarray(optax_q.dequantize(q))
    np.testing.assert_array_equal(y[0], 0.0)  # Without a zero code too.
    self.assertTrue(np.all(np.isnan(y[1:3])))
    self.assertTrue(np.all(np.isfinite(y[3:])))

  def test_checkpoint_keys_name_the_mode(self):
    q = optax_q.quantize(jnp.ones((2, 256)), 'nf4', scale_mode='block_pow2')
    keys = [jax.tree_util.keystr(k) for k, _ in
            jax.tree_util.tree_flatten_with_path(q)[0]]
    self.assertEqual(keys, ['.codes:nf4:block_pow2:128:(2,256)',
                            '.scale:nf4:block_pow2:128:(2,256)'])


class BadNameTest(parameterized.TestCase):

  @parameterized.parameters(
      ('int4@rsqrt', 'needs a codebook'),
      ('nf4@log', 'grid of positive values'),
      ('int4_sqrt@rsqrt', 'grid of positive values'),
      ('ue4m0@cube', 'unknown rounding space'),
      ('ue9m0', 'Unknown format'), ('ue1m1', 'Unknown format'),
      ('ue0m4', 'Unknown format'), ('int5_sqrt', 'Unknown format'),
      ('nf2', 'Unknown format'), ('int4_cubic', 'Unknown format'),
      ('@rsqrt', 'Unknown format'))
  def test_clear_errors(self, name, message):
    with self.assertRaisesRegex(ValueError, message):
      optax_q.get_format(name)
    with self.assertRaisesRegex(ValueError, 'nu_format'):
      optax_q.adamw(1e-3, nu_format=name)

  def test_errors_name_the_allowed_values(self):
    with self.assertRaisesRegex(ValueError, r'ue\{E\}m\{M\}.*rsqrt'):
      optax_q.get_format('ue0m0')

  def test_stall_model_knows_power_of_two_grids(self):
    # A grid with M mantissa bits, as e{E}m{M}: K* only depends on M.
    self.assertEqual(optax_q.reset_period('ue3m1', b2=0.999),
                     optax_q.reset_period('e3m1', b2=0.999))
    self.assertEqual(optax_q.reset_period('ue4m0', b2=0.999),
                     optax_q.reset_period('e4m0', b2=0.999))


class RangeExpansionTest(parameterized.TestCase):
  """fp8 with dynamic range expansion (COAT): ``<fp8 format>_dre``."""

  @parameterized.parameters((1e-3, 1.0), (1e-2, 2.0), (0.1, 4.0), (0.5, 4.0),
                            (1.0, 4.0), (1e-30, 1.0))
  def test_exponent_is_coats_floored_to_a_power_of_two(self, low, want):
    # One block from `low` to 1 (and a zero): COAT's k = log(R_fmt) /
    # log(R_x) with e4m3's whole range 448 / 2^-9, floored to a power of
    # two in [1, 4].
    x = jnp.concatenate([jnp.geomspace(low, 1.0, 127),
                         jnp.zeros(1)])[None, :]
    q = optax_q.quantize(x, 'fp8_e4m3_dre')
    self.assertEqual(q.scale.shape, (1, 1))
    # log2(k) in the two low mantissa bits of the stored maximum.
    absmax = float(qarray.group_maximum(q.scale)[0, 0])
    k = 2.0 ** int(qarray.exponent_steps(q.scale)[0, 0])
    self.assertEqual((absmax, k), (1.0, want))
    coat = math.log(448 * 512) / math.log(1 / low) if low < 1 else 99
    self.assertEqual(k, min(max(2.0**math.floor(math.log2(coat)), 1),
                            qarray.K_MAX))
    y = np.asarray(optax_q.dequantize(q))
    # Magnitudes expanded into e4m3's normal range keep its relative
    # precision divided by k; the group's smallest may land among the
    # subnormals (COAT's range counts them); zero stays zero.
    xs = np.asarray(x)[0, :127]
    normal = 448 * xs**k >= 2.0**-6
    rel = np.abs(y[0, :127] - xs) / xs
    self.assertLess(rel[normal].max(), 2.0**-4 / k * 1.01)
    self.assertLess(rel[448 * xs**k >= 2.0**-9].max(), 0.5)
    self.assertEqual(y[0, 127], 0.0)

  def test_smaller_error_than_fp8_on_gaussian_moments(self):
    x = jax.random.normal(jax.random.key(0), (64, 1024)) * 1e-3
    err = lambda name: float(jnp.linalg.norm(
        optax_q.dequantize(optax_q.quantize(x, name)) - x))
    for base, ratio in (('fp8_e4m3', 0.8), ('fp8_e5m2', 0.5)):
      self.assertLess(err(base + '_dre'), ratio * err(base), base)

  def test_bits_and_checkpoint_keys(self):
    q = optax_q.quantize(jnp.ones((4, 256)), 'fp8_e4m3_dre')
    self.assertEqual(8 * q.nbytes / 1024, 8 + 32 / 128)
    keys = [jax.tree_util.keystr(k) for k, _ in
            jax.tree_util.tree_flatten_with_path(q)[0]]
    self.assertEqual(keys[0], '.codes:fp8_e4m3_dre:block:128:(4,256)')

  @parameterized.product(mode=('block', 'row', 'tensor'),
                         rounding=('nearest', 'stochastic'))
  def test_special_values(self, mode, rounding):
    x = jnp.array([[0.0, 0.0, 0.0, 0.0], [7.0, 7.0, -7.0, 7.0],
                   [1.0, jnp.inf, 2.0, -jnp.inf], [3e38, -3.4e38, 1.0, 0.0],
                   [1e-30, 2e-37, 4e-37, 0.0]])
    q = optax_q.quantize(x[:, None, :] if mode != 'block' else x,
                         'fp8_e4m3_dre', scale_mode=mode, block_size=4,
                         rounding=rounding)
    y = np.asarray(optax_q.dequantize(q)).reshape(x.shape)
    if mode == 'tensor':
      # One group spanning 2^250 (k = K_MIN): the infinities decode as
      # such, zeros as zeros, nothing decodes to NaN.
      self.assertEqual(list(y[2, [1, 3]]), [np.inf, -np.inf])
      np.testing.assert_array_equal(y[0], 0.0)
      self.assertFalse(np.any(np.isnan(y)))
      return
    np.testing.assert_array_equal(y[:2], x[:2])  # Zeros; equal magnitudes.
    self.assertEqual(list(y[2, [1, 3]]), [np.inf, -np.inf])
    np.testing.assert_allclose(y[2, [0, 2]], [1.0, 2.0], rtol=0.07)
    self.assertTrue(np.all(np.isfinite(y[3:])))
    # Groups wider than the grid's range are stored as plain fp8 (k = 1).
    np.testing.assert_allclose(y[3, :2], [3e38, -3.4e38], rtol=2.0**-4)
    np.testing.assert_array_equal(y[3, 2:], 0.0)
    np.testing.assert_allclose(y[4], [1e-30, 0, 0, 0], rtol=2.0**-4)

  def test_nan_stays_in_its_element(self):
    q = optax_q.quantize(jnp.array([[1.0, jnp.nan], [1.0, 2.0]]),
                         'fp8_e4m3_dre', block_size=2)
    y = np.asarray(optax_q.dequantize(q))
    self.assertTrue(np.isnan(y[0, 1]))
    np.testing.assert_allclose(y[[0, 1, 1], [0, 0, 1]], [1.0, 1.0, 2.0],
                               rtol=2.0**-4)

  def test_second_moment_never_decodes_positive_to_zero(self):
    v = jnp.exp(jax.random.normal(jax.random.key(1), (8, 256)) * 6 - 20)
    q = optax_q.quantize(v, optax_q.unsigned_variant('fp8_e4m3_dre'),
                         rounding='stochastic')
    self.assertTrue(q.fmt.positive_floor)
    self.assertTrue(np.all(np.asarray(optax_q.dequantize(q)) > 0))

  @parameterized.parameters(
      ('nf4_dre', 'option of the fp8'), ('bf16_dre', 'option of the fp8'),
      ('e8m3_dre', 'option of the fp8'), ('fp8_dre_dre', 'Unknown format'),
      ('int8_dre', 'option of the fp8'), ('e3m2_dre', 'option of the fp8'),
      ('e1m0_dre', 'option of the fp8'), ('e2m1_dre', 'option of the fp8'),
      ('_dre', 'Unknown format'))
  def test_bad_names(self, name, message):
    with self.assertRaisesRegex(ValueError, message):
      optax_q.get_format(name)
    with self.assertRaisesRegex(ValueError, 'mu_format'):
      optax_q.adamw(1e-3, mu_format=name)

  @parameterized.parameters('block_pow2', 'none', 'rank1')
  def test_bad_scale_modes(self, mode):
    with self.assertRaisesRegex(ValueError, 'scale_mode.*dynamic range'):
      optax_q.quantize(jnp.ones((2, 4)), 'fp8_e4m3_dre', scale_mode=mode)

  def test_stall_model_uses_the_base_grid(self):
    for name in ('fp8_e4m3', 'fp8_e5m2'):
      self.assertEqual(optax_q.reset_period(name + '_dre', b2=0.999),
                       optax_q.reset_period(name, b2=0.999))
      self.assertEqual(
          optax_q.reset_period(optax_q.get_format(name + '_dre'), b2=0.999),
          optax_q.reset_period(name, b2=0.999))

  def test_alias(self):
    self.assertEqual(optax_q.get_format('fp8_dre').name, 'fp8_e4m3_dre')
    self.assertTrue(optax_q.get_format('e5m2_dre').expand)

  @parameterized.parameters('row', 'tensor', 'block')
  def test_empty_arrays(self, mode):
    for shape in ((0,), (4, 0), (0, 4)):
      q = optax_q.quantize(jnp.zeros(shape), 'fp8_e4m3_dre', scale_mode=mode)
      self.assertEqual(optax_q.dequantize(q).shape, shape)

  def test_stochastic_rounding_is_bounded(self):
    # A group spanning more than the grid: k = 1, as plain fp8. No seed
    # may blow a small element up (a k below 1 would decode the smallest
    # subnormal code as y**(1/k)).
    x = jnp.array([3e37, -0.3, 0.5, 1.0])
    q = jax.vmap(lambda seed: optax_q.dequantize(optax_q.quantize(
        x, 'fp8_e4m3_dre', rounding='stochastic', seed=seed, block_size=4)))(
            jnp.arange(4096, dtype=jnp.uint32))
    self.assertLessEqual(float(jnp.max(jnp.abs(q[:, 1:]))), 1e35 * 2**-9)
    self.assertEqual(float(jnp.max(jnp.abs(q[:, 0] - 3e37) / 3e37)) < 0.07,
                     True)

  def test_subnormals_give_the_same_bits_eager_and_jitted(self):
    x = jnp.array([[1.0, 1e-40, 0.5, 0.25], [1e-37, 1e-38, 5e-38, 2e-38]])
    enc = lambda x: optax_q.quantize(x, 'fp8_e4m3_dre', block_size=4)
    eager, jitted = enc(x), jax.jit(enc)(x)
    np.testing.assert_array_equal(np.asarray(eager.scale).view(np.uint32),
                                  np.asarray(jitted.scale).view(np.uint32))
    np.testing.assert_array_equal(np.asarray(eager.codes),
                                  np.asarray(jitted.codes))

  def test_same_bits_eager_jit_and_by_row(self):
    x = jax.random.normal(jax.random.key(3), (3, 130)) * jnp.exp(
        jax.random.normal(jax.random.key(4), (3, 130)))
    enc = lambda x: optax_q.quantize(x, 'fp8_e4m3_dre', block_size=4)
    eager, jitted = enc(x), jax.jit(enc)(x)
    for a, b in ((eager.codes, jitted.codes), (eager.scale, jitted.scale)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    whole = jax.jit(optax_q.dequantize)(jitted)
    np.testing.assert_array_equal(optax_q.dequantize(eager), whole)
    row = jax.jit(optax_q.dequantize)(jax.jit(enc)(x[:1]))
    np.testing.assert_array_equal(row, whole[:1])


class RankOneTest(parameterized.TestCase):
  """Rank-1 normalisation (Li et al., 2023): ``scale_mode='rank1'``."""

  def test_scale_is_the_smaller_maximum(self):
    x = np.array([[1.0, -8.0, 2.0], [4.0, 0.5, -0.25], [0.0, 2.0, 1.0]],
                 np.float32)
    q = optax_q.quantize(x, 'int8', scale_mode='rank1')
    np.testing.assert_array_equal(q.scale, [[8, 4, 2, 4, 8, 2]])
    y = np.asarray(optax_q.dequantize(q))
    scale = np.minimum(np.abs(x).max(1)[:, None], np.abs(x).max(0)[None])
    np.testing.assert_allclose(y, np.round(x / scale * 127) * scale / 127,
                               rtol=1e-6)
    # An element that is its row's or column's maximum is exact.
    exact = np.abs(x) == scale
    self.assertEqual(exact.sum(), 4)
    np.testing.assert_array_equal(y[exact], x[exact])

  def test_helps_a_second_moment_with_row_and_column_structure(self):
    rng = np.random.default_rng(0)
    v = (np.exp(rng.normal(0, 2, (256, 1)) + rng.normal(0, 2, (1, 512)))
         * np.exp(rng.normal(-14, 0.5, (256, 512)))).astype(np.float32)
    def err(name, mode):
      q = optax_q.quantize(v, optax_q.unsigned_variant(name), scale_mode=mode)
      y = np.asarray(optax_q.dequantize(q))
      return np.linalg.norm(np.sqrt(y) - np.sqrt(v)) / np.linalg.norm(
          np.sqrt(v))
    for name in ('int4', 'ue3m0', 'fp4_e2m1'):
      self.assertLess(err(name, 'rank1'), 0.5 * err(name, 'block'), name)
    q = optax_q.quantize(v, 'int4', scale_mode='rank1')
    self.assertEqual(q.scale.shape, (1, 768))
    self.assertEqual(8 * q.nbytes / v.size, 4 + 32 * 768 / v.size)

  def test_a_tensor_takes_the_smallest_of_its_slices_maxima(self):
    x = jax.random.normal(jax.random.key(0), (3, 8, 16))
    q = optax_q.quantize(x, 'int8', scale_mode='rank1', rounding='stochastic')
    self.assertEqual(q.scale.shape, (1, 1, 27))
    a = np.abs(np.asarray(x))
    want = np.concatenate([a.max((1, 2)), a.max((0, 2)), a.max((0, 1))])
    np.testing.assert_array_equal(np.asarray(q.scale).reshape(-1), want)
    scale = np.minimum(np.minimum(a.max((1, 2))[:, None, None],
                                  a.max((0, 2))[None, :, None]),
                       a.max((0, 1))[None, None, :])
    y = np.asarray(optax_q.dequantize(q))
    self.assertLessEqual(np.max(np.abs(y - np.asarray(x)) / scale), 1 / 127)

  def test_infinity_and_nan(self):
    x = jnp.array([[1.0, jnp.inf, 2.0], [3.0, 4.0, 5.0],
                   [0.0, 0.0, -jnp.inf]])
    y = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, 'int8', scale_mode='rank1')))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(x))
    np.testing.assert_allclose(y, x, rtol=0.02)
    x = jnp.array([[1.0, jnp.nan, 2.0], [3.0, 4.0, 5.0], [0.0, 7.0, 1.0]])
    y = np.asarray(optax_q.dequantize(
        optax_q.quantize(x, 'int8', scale_mode='rank1')))
    # A NaN decodes to NaN; its row and column keep their other scale.
    np.testing.assert_array_equal(np.isnan(y), np.isnan(x))
    np.testing.assert_allclose(y[1:], x[1:], rtol=0.03)

  def test_huge_and_tiny_stay_finite(self):
    x = jnp.array([[3e38, 1e-30], [0.0, -3.4e38], [1e-38, 1e-37]])
    for name in ('fp8_e4m3', 'int4', 'ue4m0'):
      fmt = optax_q.get_format(name)
      q = optax_q.quantize(jnp.abs(x) if not fmt.signed else x, fmt,
                           scale_mode='rank1', rounding='stochastic')
      self.assertTrue(np.all(np.isfinite(optax_q.dequantize(q))), name)

  @parameterized.parameters(((),), ((5,),), ((0,),))
  def test_rank_below_two_is_refused(self, shape):
    with self.assertRaisesRegex(ValueError, "scale_mode='rank1'.*rank >= 2"):
      optax_q.quantize(jnp.ones(shape), 'int4', scale_mode='rank1')

  def test_quantize_state_falls_back_to_block_below_rank_two(self):
    tx = optax_q.adamw(1e-3, mu_format='nf4', nu_format='ue4m0', min_size=0,
                       scale_mode={'nu': 'rank1'})
    state = tx.init({'w': jnp.ones((8, 256)), 'b': jnp.ones((256,))})
    nu = state[0].inner_state.nu
    self.assertEqual((nu['w'].scale_mode, nu['b'].scale_mode),
                     ('rank1', 'block'))
    self.assertEqual(state[0].inner_state.mu['w'].scale_mode, 'block')

  def test_state_shardings_replicate_the_maxima(self):
    mesh = jax.make_mesh((1,), ('x',))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
        'x', None))
    tx = optax_q.adamw(1e-3, nu_format='ue4m0', scale_mode='rank1',
                       min_size=0)
    state = jax.eval_shape(tx.init, {'w': jnp.ones((8, 256))})
    shardings = optax_q.state_shardings(state, {'w': sharding})
    nu = shardings[0].inner_state.nu['w']
    self.assertEqual(tuple(nu.scale.spec), ())
    self.assertEqual(tuple(nu.codes.spec), ('x', None))

  def test_bad_scale_mode_maps(self):
    with self.assertRaisesRegex(ValueError, r"scale_mode\['nu'\]"):
      optax_q.adamw(1e-3, scale_mode={'nu': 'rank2'})
    with self.assertRaisesRegex(ValueError, 'unknown state field'):
      optax_q.adamw(1e-3, scale_mode={'nuu': 'rank1'})
    # At construction where the format is known.
    with self.assertRaisesRegex(ValueError, r"scale_mode\['mu'\]=.*dynamic"):
      optax_q.adamw(1e-3, mu_format='fp8_e4m3_dre', scale_mode={'mu': 'rank1'})
    with self.assertRaisesRegex(ValueError, 'scale_mode=.*dynamic range'):
      optax_q.quantize_state(optax.scale_by_adam(), 'fp8_e5m2_dre',
                             scale_mode='block_pow2')


class TrainingTest(absltest.TestCase):

  def test_four_bit_adam_tracks_fp32(self):
    # A quadratic: 4-bit codecs with stochastic rounding reach fp32's loss.
    target = jax.random.normal(jax.random.key(0), (64, 256))
    loss = lambda p: jnp.mean((p['w'] - target) ** 2)

    def final(**kw):
      tx = optax_q.adamw(1e-2, min_size=0, seed=1, **kw)
      params = {'w': jnp.zeros((64, 256))}
      state = tx.init(params)

      @jax.jit
      def step(params, state):
        g = jax.grad(loss)(params)
        u, state = tx.update(g, state, params)
        return jax.tree.map(jnp.add, params, u), state
      for _ in range(300):
        params, state = step(params, state)
      return float(loss(params))
    base = final(mu_format='fp32', nu_format='fp32')
    for mu, nu, mode in (('nf4', 'ue4m0@rsqrt', None), ('nf3', 'ue3m0', None),
                         ('fp8_e4m3_dre', 'int4', {'nu': 'rank1'})):
      self.assertLess(final(mu_format=mu, nu_format=nu, scale_mode=mode,
                            rounding='stochastic'), 2 * base + 1e-3, (mu, nu))


if __name__ == '__main__':
  absltest.main()
