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
  Gupta et al, [Deep Learning with Limited Numerical
  Precision](https://arxiv.org/abs/1502.02551), 2015
"""

from __future__ import annotations

import functools

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

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
  # A Python int is taken modulo 2**32 (weights.py's initial step is
  # 2**32 - 1, which int32 cannot hold); arrays wrap as their bits do.
  step = (_U32(step & 0xFFFFFFFF) if isinstance(step, int)
          else jnp.asarray(step).astype(_U32))
  k = hash_u32(k ^ step)
  k = hash_u32(k + jnp.asarray(stream, _U32) * _U32(0x85EBCA6B))
  return k


def element_index(shape, *, row_stride: int = 1,
                  row_offset: jax.Array | int = 0) -> jax.Array:
  """Row-major element index (uint32) of every element of ``shape``.

  Built from broadcasted iotas, so it is partitioned like any other array
  under SPMD: no gather of a global index is ever needed. With
  ``row_stride`` and ``row_offset``, ``shape`` is the tile holding rows
  ``row_offset, row_offset + row_stride, ...`` (first axis) of a larger
  array with the same trailing axes, and the indices are that array's.
  """
  if not shape:
    return jnp.zeros((), _U32)
  index = jnp.zeros(shape, _U32)
  stride = 1
  for axis in range(len(shape) - 1, -1, -1):
    step = stride * (row_stride if axis == 0 else 1)
    iota = lax.broadcasted_iota(_U32, shape, axis)
    index = index + iota * _U32(step & 0xFFFFFFFF)
    stride *= shape[axis]
  if row_stride != 1 or not isinstance(row_offset, int) or row_offset:
    row = stride // shape[0]
    index = index + (jnp.asarray(row_offset).astype(_U32)
                     * _U32(row & 0xFFFFFFFF))
  return index


def uniform(key: jax.Array, shape, *, row_stride: int = 1,
            row_offset: jax.Array | int = 0) -> jax.Array:
  """Uniform float32 in [0, 1), 24 random bits, from ``key`` and position.

  ``row_stride`` and ``row_offset`` draw the bits of a tile of rows of a
  larger array, as `element_index`.

  One "lowbias32" hash per element, with the key mixed in twice (before the
  first multiply and again before the second): two streams whose
  ``index ^ key`` coincide still diverge, which a single keyed hash of a
  32-bit counter could not guarantee.
  """
  x = element_index(shape, row_stride=row_stride,
                    row_offset=row_offset) ^ key
  x = x ^ (x >> 16)
  x = x * _U32(0x7FEB352D)
  x = (x ^ (x >> 15)) + key
  x = x * _U32(0x846CA68B)
  x = x ^ (x >> 16)
  return (x >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def round_int(y: jax.Array, u: jax.Array | None) -> jax.Array:
  """Rounds to integers: half-to-even when ``u`` is None, else stochastic.

  Stochastic: up with probability ``y - floor(y)``, decided by comparing
  ``u`` with ``1 - (y - floor(y))`` (the fraction is exact). Not as
  ``floor(y + u)``: float32 rounds the sum itself, so an integer ``y``
  (a value already on the grid) would go up whenever ``u`` is within half a
  step of ``y`` below one, which from ``2**21`` on is one draw in eight.
  """
  if u is None:
    return jnp.round(y)
  low = jnp.floor(y)
  return low + (u >= jnp.float32(1.0) - (y - low)).astype(y.dtype)


def saturate(y: jax.Array, max_value: float, *,
             infinities: bool = False) -> jax.Array:
  """``y`` with finite magnitudes above ``max_value`` set to it (float32).

  Compares bit patterns as integers: XLA:CPU evaluates float ``min``,
  ``max`` and comparisons with subnormals treated as zero (and rewrites a
  select on a float comparison into ``min``), which would flush a
  subnormal result (bf16 and ``e8m{M}`` grids hold float32's subnormals).
  Infinities and NaN pass through, unless ``infinities``: then infinities
  saturate too (a rounding that carried a finite value into the infinity
  pattern).
  """
  bits = lax.bitcast_convert_type(jnp.asarray(y, jnp.float32), _U32)
  mag = bits & _U32(0x7FFFFFFF)
  limit = int(np.float32(max_value).view(np.uint32))
  top = 0x7F800001 if infinities else 0x7F800000
  over = (mag > _U32(limit)) & (mag < _U32(top))
  return lax.bitcast_convert_type(
      jnp.where(over, (bits & _U32(0x80000000)) | _U32(limit), bits),
      jnp.float32)


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
    # ulp = 2**(max(e, emin) - M), built from exponent bits (exact). It is
    # a power of two, so multiplying by its exact reciprocal gives the same
    # bits as dividing, and is cheaper. Exponents past the grid's top
    # saturate either way; clamping them keeps both powers normal floats.
    emax = int(np.floor(np.log2(max_value)))
    e = (bits >> 23).astype(jnp.int32) - 127
    e = jnp.clip(e, emin, emax + 1)
    ulp = lax.bitcast_convert_type(
        ((e - mantissa_bits + 127) << 23).astype(_U32), jnp.float32)
    inv_ulp = lax.bitcast_convert_type(
        ((mantissa_bits - e + 127) << 23).astype(_U32), jnp.float32)
    y = round_int(ax * inv_ulp, u) * ulp
  # Rounding up from near float32's largest value may carry into the
  # infinity pattern: a finite input saturates (infinite inputs are put
  # back just below).
  y = saturate(y, max_value, infinities=True)
  y = jnp.where(jnp.isfinite(x), y, ax)
  return jnp.copysign(y, x)


def lookup(table, index: jax.Array) -> jax.Array:
  """``table[index]`` for a small replicated table, sharded like ``index``.

  On a mesh with explicit axes a gather needs its output sharding spelled
  out; the result of a table lookup is partitioned exactly as its indices.
  """
  table = jnp.asarray(table)
  return table.at[index].get(out_sharding=jax.typeof(index).sharding)


def in_space(x, space: str, xp=jnp, offset=None):
  """``x`` mapped into a rounding space (float32; ``xp`` is np or jnp).

  ``'linear'``: ``x``; ``'sqrt'``: ``sign(x) sqrt|x|``; ``'log'``:
  ``log x``; ``'rsqrt'``: ``-1/sqrt(x)``, or ``-1/(sqrt(x) + offset)``
  with an ``offset`` (Adam's preconditioner with its ``eps``, in the
  scaled values' units). Every map here is increasing.
  """
  if space == 'linear':
    return x
  if space == 'sqrt':
    return xp.sign(x) * xp.sqrt(xp.abs(x))
  if space == 'log':
    return xp.log(x)
  if space == 'rsqrt':
    root = xp.sqrt(x) if offset is None else xp.sqrt(x) + offset
    return xp.float32(-1.0) / root
  raise ValueError(f'Unknown rounding space {space!r}.')


def _fraction(x, lo_v, hi_v, space: str, xp=jnp, offset=None):
  """Position of ``x`` between ``lo_v`` and ``hi_v``, in ``space``."""
  x, lo_v, hi_v = (in_space(v, space, xp, offset) for v in (x, lo_v, hi_v))
  gap = hi_v - lo_v
  return xp.where(gap > 0, (x - lo_v) / xp.where(gap > 0, gap, 1), 0)


def round_to_table(
    x: jax.Array, table, u: jax.Array | None, space: str = 'linear',
    ties: str = 'down', offset: jax.Array | None = None,
) -> jax.Array:
  """Indices (int32) of ``x`` on a sorted ``table``, nearest or stochastic.

  ``x`` is clipped to ``[table[0], table[-1]]`` first. With ``u``, the upper
  of the two bracketing entries is taken with probability
  ``(x - lo) / (hi - lo)``, so the decoded value is unbiased; with a
  ``space`` other than ``'linear'`` that fraction (and the midpoint of
  nearest rounding) is taken after `in_space`, so the rounding is
  unbiased there instead.

  ``table`` given as a tuple of floats (a format's static table) takes a
  fast path with the same results: the index is a step function of ``x``
  whose exact float32 thresholds are found once, on the host, so the
  search is a few comparisons (16-entry tables) or one bucketed lookup on
  the float's bits (larger tables) instead of a binary search.

  Nearest rounding breaks an exact tie towards the lower entry, or with
  ``ties='even'`` (static tables of float grids, such as ``fp4_e2m1``)
  towards the entry whose magnitude is at an even position among the
  table's magnitudes, zero first: the even mantissa, as IEEE rounding.

  ``offset`` (an array broadcasting against ``x``, with ``space='rsqrt'``)
  is the ``c`` of the space ``-1/(sqrt(x) + c)``: it differs from block to
  block, so nearest rounding too takes the fraction from the bracketing
  entries rather than thresholds found once.
  """
  if isinstance(table, tuple):
    # A static table: the exact index function (`_static_index`); rounding
    # stochastically, the bracketing entries are selected by the floor
    # index (a chain of selections, or gathers for a bucketed table).
    t = np.asarray(table, np.float32)
    x = jnp.clip(x, t[0], t[-1])
    if u is None and offset is None:
      mode = 'nearest_even' if ties == 'even' else 'nearest'
      return _static_index(x, table, mode, space)
    lo = _static_index(x, table, 'floor')
    if not bucketed(table, 'floor'):
      lo_v = jnp.full(x.shape, t[0], jnp.float32)
      hi_v = jnp.full(x.shape, t[1], jnp.float32)
      for i in range(1, t.size - 1):
        hit = lo >= i
        lo_v = jnp.where(hit, t[i], lo_v)
        hi_v = jnp.where(hit, t[i + 1], hi_v)
    else:
      lo_v = lookup(t, lo)
      gaps = _gaps(table) if space == 'linear' else None
      if gaps is not None:
        # The same fraction, each gathered value read once (see
        # `_static_index`): the gap to the next entry from a table.
        return lo + (u < (x - lo_v) / lookup(gaps, lo)).astype(jnp.int32)
      hi_v = lookup(t, lo + 1)
    frac = _fraction(x, lo_v, hi_v, space, offset=offset)
    # Nearest with an offset (no thresholds found once): the midpoint in
    # the space.
    up = frac > 0.5 if u is None else u < frac
    return lo + up.astype(jnp.int32)
  # A traced table.
  n = table.shape[0]
  x = jnp.clip(x, table[0], table[-1])
  # Index of the last entry <= x (binary search over the sorted table).
  lo = jnp.clip(jnp.searchsorted(table, x, side='right', method='scan') - 1,
                0, n - 2).astype(jnp.int32)
  frac = _fraction(x, lookup(table, lo), lookup(table, lo + 1), space,
                   offset=offset)
  if u is None:
    up = frac > 0.5
  else:
    up = u < frac
  return lo + up.astype(jnp.int32)


# --------------------------------------------------------------------------
# Static tables: exact thresholds found on the host, cheap lookups traced.

# Tables up to this size use a chain of comparisons; larger ones a bucketed
# lookup on the float's exponent and top mantissa bits.
_CHAIN_MAX_STEPS = 32
# Steps of the bucketed lookup lie below this offset in their bucket, and
# element offsets are clamped to it: ``(offset - step) * 1024`` fits int32.
_MAX_STEP_OFFSET = 1 << 20


def _ordered(v: np.ndarray) -> np.ndarray:
  """float32 -> int64 keys in the same order as the values (-0 == +0)."""
  b = np.asarray(v, np.float32).view(np.uint32).astype(np.int64)
  mag = b & 0x7FFFFFFF
  return np.where(b >> 31 == 1, -mag, mag)


def _from_ordered(k: np.ndarray) -> np.ndarray:
  k = np.asarray(k, np.int64)
  b = np.where(k < 0, (-k) | 0x80000000, k).astype(np.uint32)
  return b.view(np.float32)


def _table_floor(x: np.ndarray, t: np.ndarray) -> np.ndarray:
  """Reference lower index: the last entry <= x, clipped to [0, n - 2]."""
  return np.clip(np.searchsorted(t, x, side='right') - 1, 0, t.size - 2)


def _table_nearest(x: np.ndarray, t: np.ndarray, space: str,
                   even: np.ndarray | None = None) -> np.ndarray:
  """Reference nearest index, in float32 arithmetic as the traced search;
  a tie goes up where ``even`` marks the upper entry (else down)."""
  x = np.asarray(x, np.float32)
  lo = _table_floor(x, t)
  with np.errstate(invalid='ignore', divide='ignore'):
    frac = _fraction(x, t[lo], t[lo + 1], space, np).astype(np.float32)
  up = frac > np.float32(0.5)
  if even is not None:
    up = up | ((frac == np.float32(0.5)) & even[lo + 1])
  return lo + up


def _even_positions(t: np.ndarray) -> np.ndarray:
  """Whether each entry's magnitude is at an even position among the
  table's distinct magnitudes (zero at position 0): on a float grid, the
  entries with an even mantissa."""
  mags = sorted(set(np.abs(t).tolist()))
  return np.array([mags.index(abs(float(v))) % 2 == 0 for v in t])


@functools.cache
def _table_steps(table: tuple[float, ...], mode: str, space: str = 'linear'):
  """Exact steps of the index function of ``table`` over its range.

  Returns ``(start, thresholds, values)``: the index at ``table[0]``, and
  for each step the smallest float32 where the index changes and the index
  from there on. The index function is monotone in ``x``, so each step is
  found by bisection over the ordered float32 values.
  """
  t = np.asarray(table, np.float32)
  if mode == 'nearest':
    f = functools.partial(_table_nearest, space=space)
  elif mode == 'nearest_even':
    f = functools.partial(_table_nearest, space=space,
                          even=_even_positions(t))
  else:
    f = _table_floor
  code = lambda k: int(f(_from_ordered(np.array([k])), t)[0])
  lo_k, hi_k = int(_ordered(t[:1])[0]), int(_ordered(t[-1:])[0])
  start = code(lo_k)
  thresholds, values = [], []
  a, ca = lo_k, start
  end_code = code(hi_k)
  while ca != end_code:
    lo, hi = a, hi_k  # code(lo) == ca, code(hi) > ca
    while hi - lo > 1:
      mid = (lo + hi) // 2
      if code(mid) == ca:
        lo = mid
      else:
        hi = mid
    a, ca = hi, code(hi)
    thresholds.append(hi)
    values.append(ca)
  thr = _from_ordered(np.array(thresholds, np.int64)) if thresholds else (
      np.zeros((0,), np.float32))
  return start, thr.astype(np.float32), np.array(values, np.int32)


@functools.cache
def _bucket_lut(table: tuple[float, ...], mode: str, space: str):
  """The bucketed lookup of the index function of a big static table.

  A bucket is the sign, the exponent (clamped below at ``elo``) and the top
  ``m`` mantissa bits of a float32; ``m`` grows until every bucket holds at
  most one step of the index function. Each bucket is one int32 word:
  the index at the bucket's smallest value (bits 0-7), the rise of the
  index at the bucket's step (bits 8-9, zero without a step) and the step's
  offset in the bucket (bits 10 and up): the float32 bits of its magnitude
  less the bucket's first magnitude (bucket 0, which takes every magnitude
  below ``elo``, starts at zero). Within a bucket every magnitude shares
  those first bits, so comparing offsets as integers compares the values:
  one gather per element finds the index. A table without negative
  entries keeps only the positive buckets (its clipped inputs are at least
  ``+-0``, and ``-0`` takes the index of ``+0``): half the words, fewer
  cache misses for the gather.

  Returns ``(elo, m, nk, words)`` (``words`` int32), or ``None`` where a
  table does not fit the word (more than 256 entries, a rise over 3, an
  offset of ``_MAX_STEP_OFFSET`` or more); such a table has no bucketed
  lookup.
  """
  start, thr, vals = _table_steps(table, mode, space)
  t = np.asarray(table, np.float32)
  thr_k = _ordered(thr)
  nonzero = np.abs(thr[thr != 0])
  ehi = int((np.float32(np.max(np.abs(t))).view(np.uint32) >> 23) & 0xFF)
  elo = ehi
  if nonzero.size:
    elo = max(0, int((np.min(nonzero).view(np.uint32) >> 23) & 0xFF) - 1)
  for m in range(4, 12):
    nk = (ehi - elo + 1) << m
    w = 1 << (23 - m)
    k = np.arange(nk, dtype=np.int64)
    mag_lo = np.where(k == 0, 0, (elo << 23) + k * w)
    mag_hi = (elo << 23) + (k + 1) * w - 1
    # Ordered keys of each bucket's [min, max] (negative buckets first).
    kmin = np.concatenate([-mag_hi, mag_lo])
    kmax = np.concatenate([-mag_lo, mag_hi])
    first = np.searchsorted(thr_k, kmin, side='right')  # first step > kmin
    last = np.searchsorted(thr_k, kmax, side='right')  # steps <= kmax
    if np.all(last - first <= 1):
      break
  else:
    return None
  code_at = np.concatenate([[start], vals]).astype(np.int64)
  below = code_at[first]  # the index at the bucket's smallest value
  rise = code_at[last] - below
  has = last > first
  step_mag = np.abs(thr_k[np.minimum(first, thr_k.size - 1)])
  offset = np.where(has, step_mag - np.concatenate([mag_lo, mag_lo]), 0)
  if (t.size > 256 or np.any(rise > 3) or np.any(offset < 0)
      or np.any(offset >= _MAX_STEP_OFFSET) or np.any(has & (rise == 0))):
    return None
  words = (below | (rise << 8) | (offset << 10)).astype(np.int32)
  if t[0] >= 0:
    words = words[nk:]
  return elo, m, nk, words


def bucketed(table: tuple[float, ...] | None, mode: str = 'nearest',
             space: str = 'linear') -> bool:
  """Whether a static table is searched by the bucketed lookup (a gather)
  rather than a chain of comparisons (more than ``_CHAIN_MAX_STEPS`` steps
  of its index function)."""
  if not table:
    return False
  return len(_table_steps(table, mode, space)[1]) > _CHAIN_MAX_STEPS


def table_index(x: float, table: tuple[float, ...], space: str = 'linear',
                ties: str = 'down') -> int:
  """The index `round_to_table` gives ``x`` by nearest rounding, found on
  the host from the same exact steps (for constants such as the code of
  zero, which needs no compiled search)."""
  t = np.asarray(table, np.float32)
  x = np.clip(np.float32(x), t[0], t[-1])
  mode = 'nearest_even' if ties == 'even' else 'nearest'
  start, thr, vals = _table_steps(table, mode, space)
  below = int(np.searchsorted(_ordered(thr), _ordered(np.array([x]))[0],
                              side='right'))
  return int(np.concatenate([[start], vals])[below])


def _static_index(x: jax.Array, table: tuple[float, ...], mode: str,
                  space: str = 'linear'):
  """The reference index function of ``mode`` at clipped ``x`` (int32)."""
  if not bucketed(table, mode, space):
    start, thr, vals = _table_steps(table, mode, space)
    idx = jnp.full(x.shape, start, jnp.int32)
    prev = start
    for t, v in zip(thr.tolist(), vals.tolist()):
      idx = idx + jnp.where(x >= jnp.float32(t), jnp.int32(v - prev),
                            jnp.int32(0))
      prev = v
    return idx
  lut = _bucket_lut(table, mode, space)
  if lut is None:
    # Steps too close for the buckets (ue8m0's subnormal powers of two): a
    # binary search over the steps, on order-preserving integer keys (float
    # comparisons may flush subnormals).
    start, thr, vals = _table_steps(table, mode, space)
    bits = lax.bitcast_convert_type(x, jnp.int32)
    mag = bits & jnp.int32(0x7FFFFFFF)
    keys = jnp.where(bits < 0, -mag, mag)
    steps_below = jnp.searchsorted(
        _ordered(thr).astype(np.int32), keys, side='right')
    return lookup(np.concatenate([[start], vals]).astype(np.int32),
                  steps_below.astype(jnp.int32))
  elo, m, nk, words = lut
  shift = 23 - m
  bits = lax.bitcast_convert_type(x, _U32)
  negative = bits >> 31
  mag = bits & _U32(0x7FFFFFFF)
  k = jnp.minimum((jnp.maximum(mag, _U32(elo << 23)) >> shift)
                  - _U32(elo << m), _U32(nk - 1))
  first = jnp.where(k == 0, _U32(0), (k << shift) + _U32(elo << 23))
  # Clamped above every step (bucket 0 takes every magnitude below elo):
  # the comparisons with the step are the same.
  offset = jnp.minimum(mag - first, _U32(_MAX_STEP_OFFSET)).astype(jnp.int32)
  if words.size == nk:
    # No negative entries, no negative buckets: x is +-0 or positive, and
    # -0 is +0 (bucket 0, whose step, if any, lies above zero).
    negative = _U32(0)
  word = lookup(words, (k + (_U32(1) - negative) * _U32(words.size - nk))
                .astype(jnp.int32))
  # The word is read once, as XLA:CPU fuses a gather into its consumer only
  # where the gather has one user (else it writes the words out and reads
  # them back): ``e = (offset - step) * 1024 - low`` with ``low`` the word's
  # bits 0-9 (index and rise), both recovered from ``e``.
  e = (offset << 10) - word
  low = (-e) & jnp.int32(1023)
  diff = (e + low) >> 10  # offset - step
  # x >= the step's value: a larger magnitude for a positive x, a smaller
  # one for a negative x. (A NaN gets some index of the table; the encoders
  # map NaN before searching.)
  above = jnp.where(negative == 1, diff <= 0, diff >= 0)
  return (low & jnp.int32(0xFF)) + jnp.where(above, low >> 8, jnp.int32(0))


@functools.cache
def _gaps(table: tuple[float, ...]) -> np.ndarray | None:
  """``t[i + 1] - t[i]`` in float32 (the traced difference, rounded the
  same), for a table whose entries (but zero) and gaps are all normal
  floats (none flushed, no gap zero: ``_fraction``'s guard never applies);
  else ``None``."""
  t = np.asarray(table, np.float32)
  tiny = np.finfo(np.float32).tiny
  gaps = (t[1:] - t[:-1]).astype(np.float32)
  if not (np.all(gaps >= tiny) and np.all((np.abs(t) >= tiny) | (t == 0))):
    return None
  return gaps
