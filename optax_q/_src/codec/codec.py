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
"""``Codec``: one stored layout (format, scale mode, block size) as an object.

The other layers ask a codec what they used to decide by comparing scale-mode
strings: which mode a leaf of a given shape gets, whether a leaf can be
updated tile by tile, how its codes and scales are sharded, how many bits
an element takes. The arithmetic stays in `qarray`; a codec only binds a
layout to it.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray
from optax_q._src.core import explicit

Format = formats_lib.Format
QArray = qarray.QArray

# Bits of one stored block scale: float32, or the one-byte E8M0 exponent.
_BLOCK_SCALE_BITS = {'block': 32.0, 'block_pow2': 8.0}


@dataclasses.dataclass(frozen=True)
class Codec:
  """How one array is stored: a format, a scale mode and a block size.

  Static and hashable (it can be a ``jit`` static argument). ``block_size``
  is 0 unless the scale mode has block scales (``'block'``,
  ``'block_pow2'``), as in a `QArray`, so two codecs are equal exactly when
  they store arrays alike.

  Attributes:
    fmt: The number format of the codes.
    scale_mode: ``'none'``, ``'tensor'``, ``'row'``, ``'block'``,
      ``'block_pow2'`` or ``'rank1'``.
    block_size: Elements per scale along the last axis (block modes), else 0.
  """

  fmt: Format
  scale_mode: str
  block_size: int = 0

  def __post_init__(self):
    if self.scale_mode not in qarray.BLOCK_MODES:
      object.__setattr__(self, 'block_size', 0)

  @classmethod
  def for_leaf(cls, fmt: Format, scale_mode: str | None, block_size: int,
               shape: tuple[int, ...]) -> Codec:
    """The codec of an array of ``shape`` stored in ``fmt``.

    ``scale_mode`` None takes the format's default (block scales for grids
    with a narrow range, none for ``bf16`` and ``fp16``); ``'rank1'`` (a
    scale per row and per column) on an array of rank < 2 falls back to
    ``'block'``.

    Args:
      fmt: The storage format.
      scale_mode: A scale mode, or None for the format's default.
      block_size: Elements per block scale (used by block modes).
      shape: The array's logical shape.

    Returns:
      The codec.

    Raises:
      ValueError: if ``fmt`` cannot be stored with the resolved mode.
    """
    mode = scale_mode or qarray.default_scale_mode(fmt)
    if mode == 'rank1' and len(shape) < 2:
      mode = 'block'
    qarray.check_layout(fmt, mode)
    return cls(fmt, mode, block_size)

  @property
  def unscaled(self) -> bool:
    """Whether the codes are stored without scales (``'none'``)."""
    return self.scale_mode == 'none'

  @property
  def needs_whole_leaf(self) -> bool:
    """Whether encoding needs the whole array at once: a tensor scale, and
    rank-1 scales (column maxima), reduce over every row, so such an array
    cannot be encoded row tile by row tile."""
    return self.scale_mode in ('tensor', 'rank1')

  @property
  def replicated_scales(self) -> bool:
    """Whether the scales are replicated on a mesh rather than sharded like
    the array: rank-1 scales (row and column maxima side by side, small)."""
    return self.scale_mode == 'rank1'

  @property
  def stored_bits(self) -> float:
    """Bits per element: the codes plus block scales. Row, tensor and
    rank-1 scales depend on the shape and are not counted."""
    scale = _BLOCK_SCALE_BITS.get(self.scale_mode, 0.0)
    return self.fmt.bits + (scale / self.block_size if scale else 0.0)

  def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of the scales of an array of logical ``shape`` (``()``
    when unscaled)."""
    return qarray.scale_shape(shape, self.scale_mode, self.block_size)

  def buffer_shapes(self, shape: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """Shapes of the codes and the scales (None: unscaled) of an array of
    logical ``shape``."""
    return qarray.buffer_shapes(shape, self.fmt, self.scale_mode,
                                self.block_size)

  def shardings(self, shape: tuple[int, ...], sharding: NamedSharding,
                shard_over: tuple[str, ...] = ()
                ) -> tuple[NamedSharding, NamedSharding | None]:
    """Shardings of the codes and the scales (None: unscaled) of an array of
    logical ``shape`` whose parameter is sharded as ``sharding``.

    Codes and block or row scales follow the parameter's spec axis by axis
    (blocks lie along the last axis, inside a row, and packed bytes hold
    neighbours along it), each axis replicated where its mesh axes do not
    divide the buffer's length there; rank-1 scales are replicated.

    The mesh axes ``shard_over`` (which the parameter's spec does not use)
    are added on one axis, the first where the codes and the scales split
    alike, evenly, and (on the last axis, with block scales) into whole
    blocks: ``shape[-1]`` divides by ``block_size`` times the devices
    along that axis. Where no axis does, they are left out.
    """
    codes, scale = self.buffer_shapes(shape)
    if scale is None:
      scale_sharding = None
    elif self.replicated_scales:
      scale_sharding = NamedSharding(sharding.mesh, PartitionSpec(),
                                     memory_kind=sharding.memory_kind)
    else:
      scale_sharding = explicit.fit(sharding, scale)
    codes_sharding = explicit.fit(sharding, codes)
    if not shard_over:
      return codes_sharding, scale_sharding
    buffers = [(codes_sharding, codes)]
    if scale_sharding is not None and not self.replicated_scales:
      buffers.append((scale_sharding, scale))
    last = len(shape) - 1

    def whole(axis, size):  # Whole blocks in each shard.
      return (axis != last or not self.block_size
              or shape[-1] % (size * self.block_size) == 0)

    spread = explicit.spread(buffers, shard_over, whole)
    if spread is None:
      return codes_sharding, scale_sharding
    return spread[0], spread[1] if len(spread) > 1 else scale_sharding

  def encode(self, x: jax.Array, *, key: jax.Array | None,
             dtype: Any = None, row_stride: int = 1,
             row_offset: jax.Array | int = 0,
             materialize: Callable[[Callable[[], Any]], Any] | None = None,
             ) -> QArray:
    """`qarray.encode` in this layout; ``key`` set means stochastic."""
    return qarray.encode(
        x, self.fmt, scale_mode=self.scale_mode, block_size=self.block_size,
        key=key, dtype=dtype, row_stride=row_stride, row_offset=row_offset,
        materialize=materialize)

  def encode_compiled(self, x: jax.Array, *, key: jax.Array | None,
                      dtype: Any = None) -> QArray:
    """`qarray.encode_compiled` in this layout (compiled once per codec)."""
    return qarray.encode_compiled(
        x, self.fmt, scale_mode=self.scale_mode, block_size=self.block_size,
        key=key, dtype=dtype)

  def decode(self, q: QArray, dtype: Any = jnp.float32) -> jax.Array:
    """`qarray.decode` of ``q``, which must be stored in this layout."""
    if q.codec != self:
      raise ValueError(f'{self} cannot decode a QArray stored as {q.codec}.')
    return qarray.decode(q, dtype)

  def zeros(self, shape: tuple[int, ...], dtype: Any = jnp.float32, *,
            codes_sharding: Any = None, scale_sharding: Any = None
            ) -> QArray:
    """`qarray.zeros`: the encoding of zeros of ``shape``, with nothing
    encoded; the shardings, where given, are the codes' and the scales'."""
    return qarray.zeros(
        shape, self.fmt, scale_mode=self.scale_mode,
        block_size=self.block_size, dtype=dtype,
        codes_sharding=codes_sharding, scale_sharding=scale_sharding)
