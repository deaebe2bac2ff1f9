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
"""The low-bit codecs: grids, 3-bit packing, rounding spaces, bad names.

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
import optax_q
from optax_q._src import packing
from optax_q._src import qarray

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


class OddShapeTest(parameterized.TestCase):

  @parameterized.product(
      name_and_mode=(('nf3', 'block'), ('ue4m0@rsqrt', 'block_pow2'),
                     ('int3_mulaw', 'row'), ('nf3', 'tensor'),
                     ('int4', 'block_pow2'), ('ue3m0', 'block_pow2')),
      shape=((), (0,), (3, 0), (2, 3, 5), (1,), (9,)))
  def test_round_trip(self, name_and_mode, shape):
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
    nan = optax_q.dequantize(optax_q.quantize(
        jnp.array([1.0, jnp.nan, 2.0, 3.0]), name, block_size=2))
    self.assertTrue(np.all(np.isnan(nan[:2])))
    self.assertTrue(np.all(np.isfinite(nan[2:])))


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
    self.assertEqual(keys, ['.codes:nf4:block_pow2:128',
                            '.scale:nf4:block_pow2:128'])


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
    for mu, nu in (('nf4', 'ue4m0@rsqrt'), ('nf3', 'ue3m0')):
      self.assertLess(final(mu_format=mu, nu_format=nu,
                            rounding='stochastic'), 2 * base + 1e-3, (mu, nu))


if __name__ == '__main__':
  absltest.main()
