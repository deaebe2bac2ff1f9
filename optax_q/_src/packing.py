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
"""Nibble packing: two 4-bit codes per uint8 along the last axis.

JAX stores ``int4``/``uint4``/``float4_e2m1fn`` arrays with one byte per
element, so a real 4-bit state needs packing by hand. Element ``2i`` goes to
the low nibble and ``2i + 1`` to the high nibble of byte ``i``; an odd last
axis is padded with a zero nibble. The packed array keeps the rank, and only
the last axis is halved, so a parameter's ``PartitionSpec`` still applies.

Where the codes' type carries their sharding (explicit mesh axes), packed
codes keep it, except along a last axis whose halved length the mesh axes
do not divide: that axis is gathered (replicated) first, as
``state_shardings`` lays it out.
"""

from __future__ import annotations

import jax
from jax import lax
import jax.numpy as jnp

from optax_q._src import explicit


def packed_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  """Shape of the packed codes for a logical ``shape`` (rank >= 1)."""
  return tuple(shape[:-1]) + ((shape[-1] + 1) // 2,)


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
  """Inverse of :func:`pack_nibbles`: uint8 codes, last axis ``n`` long."""
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
