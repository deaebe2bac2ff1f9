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
"""Rounding to a grid: round-to-nearest-even and stochastic rounding.

Random bits for stochastic rounding come from a counter-based integer hash
of ``(seed, step, stream, element index)``, never from ``jax.random`` per
element: the same seed gives the same bits on any mesh, a resumed run
repeats itself exactly, and the cost is a few integer ops per element.

References:
  Gupta et al, `Deep Learning with Limited Numerical Precision
  <https://arxiv.org/abs/1502.02551>`_, 2015
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

_U32 = jnp.uint32


def hash_u32(x: jax.Array) -> jax.Array:
  """The "lowbias32" integer hash (uint32 -> uint32, wrap-around)."""
  x = x.astype(_U32)
  x = x ^ (x >> 16)
  x = x * _U32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * _U32(0x846CA68B)
  x = x ^ (x >> 16)
  return x


def stream_key(seed, step, stream) -> jax.Array:
  """A scalar uint32 key for one (seed, step, stream), well mixed."""
  k = hash_u32(jnp.asarray(seed, _U32) ^ _U32(0x9E3779B9))
  k = hash_u32(k ^ jnp.asarray(step).astype(_U32))
  k = hash_u32(k + jnp.asarray(stream, _U32) * _U32(0x85EBCA6B))
  return k


def element_index(shape) -> jax.Array:
  """Row-major element index (uint32) of every element of ``shape``.

  Built from broadcasted iotas, so it is partitioned like any other array
  under SPMD: no gather of a global index is ever needed.
  """
  if not shape:
    return jnp.zeros((), _U32)
  index = jnp.zeros(shape, _U32)
  stride = 1
  for axis in range(len(shape) - 1, -1, -1):
    iota = lax.broadcasted_iota(_U32, shape, axis)
    index = index + iota * _U32(stride & 0xFFFFFFFF)
    stride *= shape[axis]
  return index


def uniform(key: jax.Array, shape) -> jax.Array:
  """Uniform float32 in [0, 1), 24 random bits, from ``key`` and position."""
  bits = hash_u32(element_index(shape) ^ key)
  bits = hash_u32(bits + key)
  return (bits >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def round_int(y: jax.Array, u: jax.Array | None) -> jax.Array:
  """Rounds to integers: half-to-even when ``u`` is None, else stochastic."""
  if u is None:
    return jnp.round(y)
  return jnp.floor(y + u)


def round_float_grid(
    x: jax.Array,
    *,
    exponent_bits: int,
    mantissa_bits: int,
    max_value: float,
    u: jax.Array | None,
) -> jax.Array:
  """Rounds float32 ``x`` onto a float grid with subnormals, saturating.

  The grid has ``mantissa_bits`` stored mantissa bits, an IEEE exponent bias
  ``2**(E-1) - 1`` and subnormals below the smallest normal; values beyond
  ``max_value`` saturate to ``+-max_value``. Non-finite inputs pass through
  unchanged (NaN stays NaN, +-inf stays +-inf) so the caller can decide.

  Args:
    x: float32 values.
    exponent_bits: E, at most 8.
    mantissa_bits: M, at most 23.
    max_value: Largest finite magnitude of the grid.
    u: Uniform [0, 1) draws of ``x.shape`` for stochastic rounding, or None
      for round-to-nearest-even.

  Returns:
    float32 values on the grid.
  """
  bias = 2 ** (exponent_bits - 1) - 1
  emin = 1 - bias
  ax = jnp.abs(x)
  bits = lax.bitcast_convert_type(ax, _U32)
  if exponent_bits == 8:
    # Same exponent range as float32: drop the low 23-M bits of the pattern.
    drop = 23 - mantissa_bits
    if drop == 0:
      y = ax
    else:
      keep = _U32((0xFFFFFFFF << drop) & 0xFFFFFFFF)
      if u is None:
        half = _U32((1 << (drop - 1)) - 1)
        lsb = (bits >> drop) & _U32(1)
        y_bits = (bits + half + lsb) & keep
      else:
        r = (u * jnp.float32(2.0**drop)).astype(_U32)
        y_bits = (bits + r) & keep
      y = lax.bitcast_convert_type(y_bits, jnp.float32)
  else:
    # ulp = 2**(max(e, emin) - M), built from exponent bits (exact).
    e = (bits >> 23).astype(jnp.int32) - 127
    e = jnp.maximum(e, emin)
    ulp = lax.bitcast_convert_type(
        ((e - mantissa_bits + 127) << 23).astype(_U32), jnp.float32)
    y = round_int(ax / ulp, u) * ulp
  y = jnp.minimum(y, jnp.float32(max_value))
  y = jnp.where(jnp.isfinite(x), y, ax)
  return jnp.copysign(y, x)


def round_to_table(
    x: jax.Array, table: jax.Array, u: jax.Array | None
) -> jax.Array:
  """Indices (int32) of ``x`` on a sorted ``table``, nearest or stochastic.

  ``x`` is clipped to ``[table[0], table[-1]]`` first. With ``u``, the upper
  of the two bracketing entries is taken with probability
  ``(x - lo) / (hi - lo)``, so the decoded value is unbiased.
  """
  n = table.shape[0]
  x = jnp.clip(x, table[0], table[-1])
  # Index of the last entry <= x (binary search over the sorted table).
  lo = jnp.clip(jnp.searchsorted(table, x, side='right', method='scan') - 1,
                0, n - 2).astype(jnp.int32)
  lo_v = table[lo]
  hi_v = table[lo + 1]
  gap = hi_v - lo_v
  frac = jnp.where(gap > 0, (x - lo_v) / jnp.where(gap > 0, gap, 1.0), 0.0)
  if u is None:
    up = frac > 0.5
  else:
    up = u < frac
  return lo + up.astype(jnp.int32)
