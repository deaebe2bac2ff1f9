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
"""Code packing along the last axis: two 4-bit codes per uint8 (nibbles),
or eight 3-bit codes per three uint8.

JAX stores ``int4``/``uint4``/``float4_e2m1fn`` arrays with one byte per
element, so a real 4-bit state needs packing by hand. Element ``2i`` goes to
the low nibble and ``2i + 1`` to the high nibble of byte ``i``; an odd last
axis is padded with a zero nibble. The packed array keeps the rank, and only
the last axis is halved, so a parameter's ``PartitionSpec`` still applies.
Three-bit codes go in groups of eight: code ``8i + j`` takes bits
``3j .. 3j + 2`` of the little-endian 24-bit word in bytes ``3i .. 3i + 2``;
the last group is padded with zero codes.

Where the codes' type carries their sharding (explicit mesh axes), packed
codes keep it, except along a last axis whose halved length the mesh axes
do not divide: that axis is gathered (replicated) first, as
``state_shardings`` lays it out.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from optax_q._src.core import explicit


def packed_length(n: int, bits: int = 4) -> int:
  """Bytes of ``n`` packed codes of ``bits`` (3 or 4)."""
  if bits == 3:
    return 3 * (-(-n // 8))
  return (n + 1) // 2


def packed_shape(shape: tuple[int, ...], bits: int = 4) -> tuple[int, ...]:
  """Shape of the packed codes for a logical ``shape`` (rank >= 1)."""
  return tuple(shape[:-1]) + (packed_length(shape[-1], bits),)


def pack(codes: jax.Array, bits: int) -> jax.Array:
  """Packs integer codes in ``[0, 2**bits)`` (``bits`` 3 or 4)."""
  return pack_triplets(codes) if bits == 3 else pack_nibbles(codes)


def unpack(packed: jax.Array, n: int, bits: int) -> jax.Array:
  """Inverse of `pack`: uint8 codes, last axis ``n`` long."""
  if bits == 3:
    return unpack_triplets(packed, n)
  return unpack_nibbles(packed, n)


def packed_row(code: int, n: int, bits: int) -> np.ndarray:
  """The packed bytes (uint8, `packed_length` long) of ``n`` copies of one
  ``code``, laid out as `pack` lays them (zero codes pad the last byte or
  group), computed on the host: a constant row, such as the codes of an
  all-zero array, broadcast without packing anything."""
  per = 8 if bits == 3 else 2
  padded = np.zeros(per * (-(-n // per)), np.uint32)
  padded[:n] = code
  groups = padded.reshape(-1, per) << (bits * np.arange(per, dtype=np.uint32))
  words = np.bitwise_or.reduce(groups, axis=-1)
  width = 3 if bits == 3 else 1
  return words.astype('<u4').view(np.uint8).reshape(-1, 4)[:, :width].reshape(-1)


def pack_triplets(codes: jax.Array) -> jax.Array:
  """Packs codes in [0, 8) along the last axis, eight per three uint8."""
  codes = codes.astype(jnp.uint8)
  n = codes.shape[-1]
  groups = -(-n // 8)
  if not explicit.divides(codes, -1, groups):
    codes = explicit.replicate_last_axis(codes)
  if groups * 8 != n:
    pad = [(0, 0)] * (codes.ndim - 1) + [(0, groups * 8 - n)]
    codes = jnp.pad(codes, pad)
  # Four codes read as one little-endian uint32 (one per byte), squeezed
  # to 12 bits by two shift-and-mask steps (bytes to pairs of 6 bits, pairs
  # to 12); two such words make the 24-bit word of a group. Whole words, not
  # a slice per code, so that XLA vectorizes the loop and does not compute
  # the codes once per slice.
  w = lax.bitcast_convert_type(
      codes.reshape(*codes.shape[:-1], groups, 2, 4), jnp.uint32)
  w = (w & 0x00070007) | ((w >> 5) & 0x00380038)
  w = (w & 0x3F) | ((w >> 10) & 0xFC0)
  word = w[..., 0] | (w[..., 1] << 12)
  out = lax.bitcast_convert_type(word, jnp.uint8)[..., :3]
  return out.reshape(*codes.shape[:-1], 3 * groups)


def unpack_triplets(packed: jax.Array, n: int) -> jax.Array:
  """Inverse of `pack_triplets`: uint8 codes, last axis ``n`` long."""
  groups = packed.shape[-1] // 3
  packed = packed.astype(jnp.uint8)
  if not explicit.divides(packed, -1, groups):
    packed = explicit.replicate_last_axis(packed)
  b = packed.reshape(*packed.shape[:-1], groups, 3)
  b = jnp.concatenate([b, jnp.zeros_like(b[..., :1])], axis=-1)
  word = lax.bitcast_convert_type(b, jnp.uint32)
  w = jnp.stack([word & 0xFFF, word >> 12], axis=-1)
  w = (w & 0x3F) | ((w & 0xFC0) << 10)
  w = (w & 0x00070007) | ((w & 0x00380038) << 5)
  codes = lax.bitcast_convert_type(w, jnp.uint8).reshape(
      *packed.shape[:-1], 8 * groups)
  if codes.shape[-1] != n:
    codes = codes[..., :n]
  return codes


def pack_nibbles(codes: jax.Array) -> jax.Array:
  """Packs integer codes in [0, 16) along the last axis into uint8."""
  codes = codes.astype(jnp.uint8)
  n = codes.shape[-1]
  if not explicit.divides(codes, -1, (n + 1) // 2):
    codes = explicit.replicate_last_axis(codes)
  if n % 2:
    pad = [(0, 0)] * (codes.ndim - 1) + [(0, 1)]
    codes = jnp.pad(codes, pad)
  # Each pair of bytes read as one (little-endian) uint16: the loop then
  # runs over contiguous words, which XLA:CPU vectorizes, instead of over
  # interleaved strided pairs, which it does not.
  # Explicit lengths: -1 is ambiguous for an empty array.
  pairs = codes.reshape(*codes.shape[:-1], (n + 1) // 2, 2)
  w = lax.bitcast_convert_type(pairs, jnp.uint16)
  return ((w & 0x0F) | ((w >> 4) & 0xF0)).astype(jnp.uint8)


def unpack_nibbles(packed: jax.Array, n: int) -> jax.Array:
  """Inverse of `pack_nibbles`: uint8 codes, last axis ``n`` long."""
  packed = packed.astype(jnp.uint8)
  if not explicit.divides(packed, -1, n):
    packed = explicit.replicate_last_axis(packed)
  lo = (packed & 0x0F).astype(jnp.uint16)
  hi = (packed >> 4).astype(jnp.uint16)
  pairs = lax.bitcast_convert_type(lo | (hi << 8), jnp.uint8)
  codes = pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])
  if codes.shape[-1] != n:
    codes = codes[..., :n]
  return codes
