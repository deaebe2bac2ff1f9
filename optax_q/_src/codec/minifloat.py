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
"""8-bit float codes from float32 and back, by integer arithmetic.

XLA:CPU converts between float32 and ``float8_e4m3fn``/``float8_e5m2``
correctly, but inside a fused loop the conversion is emitted as branchy
scalar code that the vectorizer gives up on, so an optimizer step that
decodes and encodes its moments spends most of its time there. The same
conversions written as shifts, adds, compares and selects on the float32
bit pattern vectorize, and give bit for bit the codes of the native cast
(round half to even, subnormals, NaN), checked exhaustively in the tests.
Decoding goes through a float16 bit pattern (`decode`).

Layout of an 8-bit float with ``E`` exponent and ``M`` mantissa bits
(``1 + E + M = 8``, bias ``2**(E-1) - 1``): sign in bit 7, then the biased
exponent, then the mantissa. A zero exponent field means a subnormal
``m * 2**(1 - bias - M)``. The all-ones pattern (both signs) is NaN; with
``has_inf`` (e5m2, IEEE-like) the all-ones exponent holds infinities and
NaNs, without it (e4m3fn) only ``0x7F`` and ``0xFF`` are NaN and the rest
of the top exponent is finite.
"""

from __future__ import annotations

import math

import jax
from jax import lax
import jax.numpy as jnp

from optax_q._src.codec import rounding

_U32 = jnp.uint32
_F32_EXP_BIAS = 127
_F32_MANT = 23


# The 8-bit float dtypes laid out as above: (exponent bits, mantissa bits,
# whether the top exponent holds infinities).
LAYOUTS = {
    'float8_e4m3fn': (4, 3, False),
    'float8_e5m2': (5, 2, True),
}


def layout_of(dtype) -> dict[str, int | bool] | None:
  """Keyword arguments of `encode`/`decode` for ``dtype``, or
  None when the dtype is not one of `LAYOUTS`."""
  found = LAYOUTS.get(jnp.dtype(dtype).name)
  if found is None:
    return None
  e, m, has_inf = found
  return dict(exponent_bits=e, mantissa_bits=m, has_inf=has_inf)


def _layout(exponent_bits: int, mantissa_bits: int) -> tuple[int, int]:
  if 1 + exponent_bits + mantissa_bits != 8:
    raise ValueError(
        f'an 8-bit float needs 1 + exponent_bits + mantissa_bits == 8, got '
        f'exponent_bits={exponent_bits}, mantissa_bits={mantissa_bits}.')
  return 2 ** (exponent_bits - 1) - 1, _F32_MANT - mantissa_bits


def encode(
    y: jax.Array, *, exponent_bits: int, mantissa_bits: int, has_inf: bool,
    u: jax.Array | None = None, max_value: float | None = None,
) -> jax.Array:
  """uint8 codes of float32 ``y``, rounding half to even, or stochastically.

  To nearest (``u`` None), ``y`` must already be saturated: finite values
  at most the format's largest finite magnitude (the caller clips).
  Stochastically, ``u`` holds uniform [0, 1) draws with 24 random bits (as
  `rounding.uniform`), and finite magnitudes that round past
  ``max_value`` saturate to it: the codes are those of
  `rounding.round_float_grid` followed by this encoder to nearest, from
  the same draws (checked in the tests), without the float arithmetic of
  the grid rounding. Infinities become the infinity code with ``has_inf``
  and NaN without, NaN stays NaN.
  """
  bias, drop = _layout(exponent_bits, mantissa_bits)
  if u is not None and max_value is None:
    raise ValueError('encode with draws u needs max_value, the largest '
                     'finite magnitude rounding saturates to.')
  bits = lax.bitcast_convert_type(jnp.asarray(y, jnp.float32), _U32)
  sign = (bits >> 24) & _U32(0x80)
  a = bits & _U32(0x7FFFFFFF)
  # Normal range: round the float32 pattern to M mantissa bits (half to
  # even), then move the exponent from float32's bias to the format's.
  # Stochastically: add the top ``drop`` of the 24 random bits below the
  # kept ones and truncate; that goes up exactly when ``u >= 1 - frac``
  # (``frac``, the dropped fraction, has ``drop <= 24`` bits).
  if u is None:
    rounded = a + _U32((1 << (drop - 1)) - 1) + ((a >> drop) & _U32(1))
  else:
    random = (u * jnp.float32(2.0**24)).astype(_U32)
    rounded = a + (random >> (24 - drop))
  normal = (rounded >> drop) - _U32((_F32_EXP_BIAS - bias) << mantissa_bits)
  # Subnormal range: the code is |y| in units of the smallest subnormal.
  unit = 2.0 ** (bias - 1 + mantissa_bits)
  sub = rounding.round_int(
      lax.bitcast_convert_type(a, jnp.float32) * jnp.float32(unit), u)
  min_normal_bits = (_F32_EXP_BIAS + 1 - bias) << _F32_MANT
  code = jnp.where(a < _U32(min_normal_bits), sub.astype(_U32), normal)
  if u is not None:
    code = jnp.minimum(code, _U32(_magnitude_code(
        max_value, exponent_bits=exponent_bits, mantissa_bits=mantissa_bits)))
  nan_code = _U32(0x7F)
  inf_code = _U32(0x7F - ((1 << mantissa_bits) - 1)) if has_inf else nan_code
  code = jnp.where(a >= _U32(0x7F800000),
                   jnp.where(a == _U32(0x7F800000), inf_code, nan_code), code)
  return (code | sign).astype(jnp.uint8)


def _magnitude_code(value: float, *, exponent_bits: int,
                    mantissa_bits: int) -> int:
  """The code (sign bit clear) of a positive normal ``value`` of the grid."""
  bias, _ = _layout(exponent_bits, mantissa_bits)
  e = math.floor(math.log2(value))
  mantissa = (value / 2.0**e - 1.0) * 2**mantissa_bits
  if mantissa != int(mantissa) or not 1 - bias <= e <= bias + 1:
    raise ValueError(f'{value} is not a normal value of the e{exponent_bits}'
                     f'm{mantissa_bits} grid.')
  return ((e + bias) << mantissa_bits) | int(mantissa)


def decode(
    codes: jax.Array, *, exponent_bits: int, mantissa_bits: int,
    has_inf: bool
) -> jax.Array:
  """float32 values of uint8 ``codes`` (exact; NaN as ``+-NaN``, the
  code's sign on the canonical quiet NaN).

  Through float16: a code's exponent and mantissa bits placed at the low
  end of a float16's exponent field and the top of its mantissa make a
  float16 worth the code's value times ``2**(bias - 15)``, subnormals
  included (both halve their unit in step), and float16 -> float32 is one
  conversion instruction on common CPUs; a multiply by a power of two
  restores the value (exact). Only the NaN codes (and, with ``has_inf``,
  the top exponent's NaNs, whose payloads float16 would keep) are
  selected apart.
  """
  bias, _ = _layout(exponent_bits, mantissa_bits)
  if exponent_bits > 5:
    raise ValueError(
        f'decode goes through float16, which holds at most 5 exponent bits, '
        f'got exponent_bits={exponent_bits}.')
  c = codes.astype(jnp.uint16)
  a = c & jnp.uint16(0x7F)
  half = (a << (10 - mantissa_bits)) | ((c & jnp.uint16(0x80)) << 8)
  value = lax.bitcast_convert_type(half, jnp.float16).astype(jnp.float32)
  if bias != 15:
    value = value * jnp.float32(2.0 ** (15 - bias))
  if has_inf:
    top = ((1 << exponent_bits) - 1) << mantissa_bits
    nan = a > jnp.uint16(top)
  else:
    nan = a == jnp.uint16(0x7F)
  return jnp.where(nan, jnp.copysign(jnp.float32(jnp.nan), value), value)
