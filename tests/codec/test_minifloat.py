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
"""The bit-level 8-bit float codec against ``ml_dtypes`` casts.

Decoding is checked on all 256 codes; encoding on every grid value, every
midpoint between neighbours and the float32 values one ulp either side of
it, the subnormal and overflow edges, signed zeros, infinities, NaN and a
million random float32 bit patterns (saturated first, as the encoder
expects).
"""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import optax_q
from optax_q._src.codec import minifloat
from optax_q._src.codec import rounding

_DTYPES = {
    'float8_e4m3fn': ml_dtypes.float8_e4m3fn,
    'float8_e5m2': ml_dtypes.float8_e5m2,
}


def _probe_values(dtype) -> np.ndarray:
  """Grid values, midpoints +- 1 ulp, edges and random bit patterns."""
  grid = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float32)
  grid = np.unique(grid[np.isfinite(grid)])
  mids = (grid[:-1].astype(np.float64) + grid[1:]) / 2
  mids = mids.astype(np.float32)
  near = np.concatenate([np.nextafter(mids, -np.inf), mids,
                         np.nextafter(mids, np.inf),
                         np.nextafter(grid, -np.inf), grid,
                         np.nextafter(grid, np.inf)])
  fmax = float(ml_dtypes.finfo(dtype).max)
  tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
  edges = np.array([0.0, -0.0, tiny / 2, tiny, 1e-30, 1e-45, fmax,
                    np.inf, -np.inf, np.nan], np.float32)
  rng = np.random.default_rng(0)
  bits = rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64)
  random = bits.astype(np.uint32).view(np.float32)
  values = np.concatenate([near, -near, edges, random])
  finite = np.isfinite(values)
  values[finite] = np.clip(values[finite], -fmax, fmax)
  return values


class MinifloatTest(parameterized.TestCase):

  @parameterized.parameters('float8_e4m3fn', 'float8_e5m2')
  def test_decode_all_codes(self, name):
    dtype = _DTYPES[name]
    codes = np.arange(256, dtype=np.uint8)
    got = np.asarray(jax.jit(
        lambda c: minifloat.decode(c, **minifloat.layout_of(name)))(codes))
    want = codes.view(dtype).astype(np.float32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32),
                                  want[ok].view(np.uint32))
    # NaN: the canonical quiet NaN with the code's sign.
    np.testing.assert_array_equal(
        got[~ok].view(np.uint32),
        np.uint32(0x7FC00000) | (codes[~ok].astype(np.uint32) >> 7) << 31)

  def test_decode_refuses_layouts_float16_cannot_hold(self):
    with self.assertRaisesRegex(ValueError, 'exponent_bits=6'):
      minifloat.decode(jnp.zeros((3,), jnp.uint8), exponent_bits=6,
                       mantissa_bits=1, has_inf=False)

  @parameterized.parameters('float8_e4m3fn', 'float8_e5m2')
  def test_encode_matches_cast(self, name):
    dtype = _DTYPES[name]
    values = _probe_values(dtype)
    got = np.asarray(jax.jit(
        lambda y: minifloat.encode(y, **minifloat.layout_of(name)))(values))
    with np.errstate(invalid='ignore'):
      want = values.astype(dtype).view(np.uint8)
    nan = np.isnan(values)
    # NaN encodes to a NaN code (with either sign); everything else to the
    # cast's exact bit pattern (signed zeros and infinities included).
    self.assertTrue(np.all(np.isnan(got[nan].view(dtype).astype(np.float32))))
    mismatch = np.flatnonzero(got[~nan] != want[~nan])
    self.assertEqual(
        mismatch.size, 0,
        msg=f'{mismatch.size} mismatches, e.g. {values[~nan][mismatch[:5]]}')

  @parameterized.parameters('float8_e4m3fn', 'float8_e5m2')
  def test_stochastic_encode_matches_grid_rounding(self, name):
    # Reference: round_float_grid (float arithmetic, from the same draws),
    # then the encoder to nearest. Unclipped values too: finite ones past
    # the largest saturate, including near float32's maximum.
    dtype = _DTYPES[name]
    values = _probe_values(dtype)[::2]
    values = np.concatenate([values, values * np.float32(1.07), np.array(
        [3e38, -3e38, 1e-40, -1e-45], np.float32)])
    layout = minifloat.layout_of(name)
    fmax = float(ml_dtypes.finfo(dtype).max)
    rng = np.random.default_rng(1)
    draws = [rng.integers(0, 2**24, values.size).astype(np.float32) * 2**-24,
             np.zeros(values.size, np.float32),
             np.full(values.size, 1 - 2**-24, np.float32)]
    fused = jax.jit(lambda y, u: minifloat.encode(
        y, **layout, u=u, max_value=fmax))
    reference = jax.jit(lambda y, u: minifloat.encode(
        rounding.round_float_grid(
            y, exponent_bits=layout['exponent_bits'],
            mantissa_bits=layout['mantissa_bits'], max_value=fmax, u=u),
        **layout))
    for u in draws:
      got, want = np.asarray(fused(values, u)), np.asarray(reference(values, u))
      mismatch = np.flatnonzero(got != want)
      self.assertEqual(
          mismatch.size, 0,
          msg=f'{mismatch.size} mismatches, e.g. {values[mismatch[:5]]}')

  def test_infinity_without_inf_code_is_nan(self):
    codes = minifloat.encode(jnp.array([np.inf, -np.inf], jnp.float32),
                             **minifloat.layout_of('float8_e4m3fn'))
    self.assertTrue(np.all(np.isnan(
        np.asarray(codes).view(ml_dtypes.float8_e4m3fn).astype(np.float32))))

  def test_layouts(self):
    self.assertIsNone(minifloat.layout_of(jnp.bfloat16))
    self.assertIsNone(minifloat.layout_of(ml_dtypes.float8_e4m3fnuz))
    with self.assertRaisesRegex(ValueError, 'exponent_bits'):
      minifloat.encode(jnp.zeros(2), exponent_bits=4, mantissa_bits=4,
                       has_inf=False)

  @parameterized.parameters('nearest', 'stochastic')
  def test_quantize_uses_it_and_decodes_exactly(self, rounding):
    # The codecs of quantize/dequantize: every fp8 code decodes to its
    # ml_dtypes value times the block scale, and nearest rounding gives the
    # codes of the native cast of the scaled values.
    x = jax.random.normal(jax.random.key(1), (64, 256)) * 3.0
    for name in ('fp8_e4m3', 'fp8_e5m2'):
      q = optax_q.quantize(x, name, rounding=rounding)
      fmt = optax_q.get_format(name)
      values = np.asarray(q.codes).astype(np.float32)
      blocks = values.reshape(64, -1, 128) * np.asarray(q.scale)[..., None]
      np.testing.assert_array_equal(
          np.asarray(optax_q.dequantize(q)), blocks.reshape(64, 256))
      if rounding == 'nearest':
        scaled = (np.asarray(x).reshape(64, -1, 128)
                  / np.asarray(q.scale)[..., None]).reshape(64, 256)
        want = np.clip(scaled, -fmt.max_value, fmt.max_value).astype(
            q.codes.dtype)
        np.testing.assert_array_equal(np.asarray(q.codes).view(np.uint8),
                                      want.view(np.uint8))


if __name__ == '__main__':
  absltest.main()
