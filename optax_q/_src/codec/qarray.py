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
"""``QArray``: a quantized array as a pytree node, and its codecs.

Invariants (the sharding contract): ``codes`` has the logical shape, except
that 4-bit codes are packed two per byte along the last axis (that axis is
``ceil(n / 2)`` long) and 3-bit codes eight per three bytes (``3 ceil(n /
8)``; a scalar's three bytes have shape ``(3,)``); ``scale`` has the same rank as the logical array, with
the last axis divided into blocks (``'block'``), reduced to one (``'row'``),
or every axis reduced to one (``'tensor'``). A parameter's ``PartitionSpec``
therefore applies to codes and scales unchanged, provided the blocked axis
still divides by the mesh axis after blocking (and packing).

Non-finite inputs. An infinity in a scaled format (a second moment whose
``g * g`` overflowed float32, from a huge but finite gradient) takes no part
in its block's scale: it is stored as the grid's end code of its sign, the
block's finite values are mapped a grid step inside the ends, and the
block's scale is stored with its sign bit set. It decodes to the same
infinity, so the element behaves as in float32 Adam (its update is
``m / inf = 0``), while the scale and the other codes of its block stay
finite and the other elements keep their values. A NaN stays in its own
element, as in float32: it takes no part in the scale either, it is stored
at the grid's upper end code, and the block's scale is stored as a NaN that
carries the scale in its payload (`box_scale`: the scale rounded down to 13
mantissa bits); in such a block the end codes decode to NaN (an infinity
that shares a block with a NaN decodes to NaN too) and the other codes to
their values. Rank-1 scales keep a NaN in its element by their own rule,
and power-of-two scales (one byte, as the OCP MX scale) decode a block with
a NaN or an infinity to NaN as a whole. In an unscaled float format NaN stays NaN, and an
infinity stays infinite where the container has infinities (``bf16``,
``fp16``, ``fp8_e5m2``) and becomes NaN where it does not (``fp8_e4m3``).
Finite inputs never decode to a non-finite value: they saturate to the
format's largest value, scales are rounded so that the largest code times
the scale never overflows, and an all-zero block decodes to exact zeros.

Shared power-of-two scales (``scale_mode='block_pow2'``) store each block's
scale as one byte, the OCP MX E8M0 exponent: the smallest power of two that
maps the block's absolute maximum into the grid, so values are scaled
exactly. Byte 0 marks an all-zero block, 255 a block holding a NaN or an
infinity, which decodes to NaN as a whole (there is no sign bit to flag an
infinity with).

Scale arithmetic is one explicit sequence of float32 operations whatever the
shape: the scale is the block maximum times the host-computed reciprocal of
the grid's target (rounded down), and values are multiplied by the scale's
reciprocal (in two exact steps for huge scales, so no reciprocal is a
flushed subnormal). So whole, tiled and sharded encodings of a block give
the same bits.

Checkpoints: the format, scale mode, block size and logical shape are part
of the keys of a QArray's children (``codes:int4:block:128:(36,130)``), so a
checkpoint restored into a state of another layout or shape fails with an
error naming both keys. The shape matters for packed codes, whose own shape
hides the last axis's length: ``(36, 129)`` and ``(36, 130)`` both pack 4-bit
codes into ``(36, 65)`` bytes, and 3-bit codes of 121 to 128 columns into
48, so without it a restore would truncate, or decode the padding as values.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
import math
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import minifloat
from optax_q._src.codec import packing
from optax_q._src.codec import rounding as rounding_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation

Format = formats_lib.Format
# Scale modes with one scale per block of ``block_size`` along the last axis.
BLOCK_MODES = ('block', 'block_pow2')
# Scale modes that dynamic range expansion (``<format>_dre``) works with.
_EXPAND_MODES = ('block', 'row', 'tensor')
_F32_MAX = float(np.finfo(np.float32).max)


@dataclasses.dataclass(frozen=True)
class QArray:
  """A quantized array: ``dequantize(q) ~= x``.

  Attributes:
    codes: Stored codes, the logical shape (4-bit codes packed two per byte
      along the last axis).
    scale: float32 scales of the same rank as the logical array, or None for
      unscaled formats.
    fmt: The static [`Format`][optax_q.Format].
    shape: Static logical shape.
    dtype: Static logical dtype name (what [`dequantize`][optax_q.dequantize]
      returns).
    scale_mode: ``'none'``, ``'tensor'``, ``'row'`` or ``'block'``.
    block_size: Elements per scale along the last axis (``'block'`` only).
  """

  codes: jax.Array
  scale: jax.Array | None
  fmt: Format = dataclasses.field(metadata=dict(static=True))
  shape: tuple[int, ...] = dataclasses.field(metadata=dict(static=True))
  dtype: str = dataclasses.field(metadata=dict(static=True))
  scale_mode: str = dataclasses.field(metadata=dict(static=True))
  block_size: int = dataclasses.field(
      default=0, metadata=dict(static=True))

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def ndim(self) -> int:
    return len(self.shape)

  @property
  def codec(self):
    """The ``Codec`` (format, scale mode, block size) this array is stored
    with (internal: ``optax_q._src.codec.codec``)."""
    # Imported here: the codec module is built on this one.
    from optax_q._src.codec import codec as codec_lib
    return codec_lib.Codec(self.fmt, self.scale_mode, self.block_size)

  @property
  def nbytes(self) -> int:
    """Real bytes of the buffers (codes plus scales)."""
    n = nbytes_of(self.codes)
    if self.scale is not None:
      n += nbytes_of(self.scale)
    return n


def layout_tag(q: QArray) -> str:
  """``'<format>:<scale mode>[:<block size>]'``, e.g. ``'int4:block:128'``."""
  tag = f'{q.fmt.name}:{q.scale_mode}'
  return f'{tag}:{q.block_size}' if q.scale_mode in BLOCK_MODES else tag


def checkpoint_tag(q: QArray) -> str:
  """`layout_tag` and the logical shape, e.g. ``'nf4:block:128:(36,129)'``:
  the suffix of the keys of ``q``'s children."""
  return f"{layout_tag(q)}:{str(tuple(q.shape)).replace(' ', '')}"


def _aux(q: QArray) -> tuple[Any, ...]:
  return (q.fmt, q.shape, q.dtype, q.scale_mode, q.block_size)


def _flatten_with_keys(q: QArray):
  # The layout and the logical shape are part of the children's keys, so a
  # checkpoint written in one format or shape cannot be restored into a
  # state of another (Orbax matches restore targets by key path and names
  # both paths when they differ; the packed codes' own shape does not say
  # the last axis's length).
  tag = checkpoint_tag(q)
  return ((jax.tree_util.GetAttrKey(f'codes:{tag}'), q.codes),
          (jax.tree_util.GetAttrKey(f'scale:{tag}'), q.scale)), _aux(q)


def _flatten(q: QArray):
  return (q.codes, q.scale), _aux(q)


def _unflatten(aux, children) -> QArray:
  return QArray(*children, *aux)


jax.tree_util.register_pytree_with_keys(
    QArray, _flatten_with_keys, _unflatten, _flatten)


def nbytes_of(x: Any) -> int:
  """Bytes of one buffer (an array or its ``ShapeDtypeStruct``); 0 else."""
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return int(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize)
  return 0


def is_qarray(x: Any) -> bool:
  """Whether ``x`` is a [`QArray`][optax_q.QArray] (for ``is_leaf=`` arguments).

  Args:
    x: Anything.

  Returns:
    True for a [`QArray`][optax_q.QArray].

  Examples:
    >>> import jax, jax.numpy as jnp, optax_q
    >>> state = optax_q.adamw(1e-3, min_size=0).init({'w': jnp.ones((2, 256))})
    >>> leaves = jax.tree.leaves(state, is_leaf=optax_q.is_qarray)
    >>> sum(map(optax_q.is_qarray, leaves))
    2
  """
  return isinstance(x, QArray)


def scale_shape(shape, scale_mode: str, block_size: int) -> tuple[int, ...]:
  """Shape of the scales for a logical ``shape``."""
  if scale_mode == 'none':
    return ()
  if scale_mode == 'rank1':
    return (1,) * (len(shape) - 1) + (sum(shape),)
  if not shape or scale_mode == 'tensor':
    return (1,) * len(shape)
  if scale_mode == 'row':
    return tuple(shape[:-1]) + (1,)
  return tuple(shape[:-1]) + (-(-shape[-1] // block_size),)


def check_layout(fmt: Format, scale_mode: str, name: str = 'scale_mode',
                 shape: tuple[int, ...] | None = None) -> None:
  """Raises unless ``fmt`` can be stored with ``scale_mode`` (for an
  array of ``shape``, where given)."""
  if scale_mode == 'none' and fmt.kind != 'float':
    raise ValueError(
        f"{name}='none' is only valid for float formats, not {fmt.name!r}; "
        f"use one of {formats_lib.SCALE_MODES[1:]}.")
  if shape is not None and scale_mode == 'rank1' and len(shape) < 2:
    raise ValueError(
        f"{name}='rank1' (a scale per row and per column) needs an array "
        f'of rank >= 2, got shape {tuple(shape)}; use one of '
        f'{formats_lib.SCALE_MODES[1:-1]} (quantize_state falls back to '
        "'block' for such leaves).")
  if fmt.expand and scale_mode not in _EXPAND_MODES:
    raise ValueError(
        f'{name}={scale_mode!r}: dynamic range expansion ({fmt.name!r}) '
        f'keeps a float32 maximum and exponent per group; use one of '
        f'{_EXPAND_MODES}.')


def _blocked(x: jax.Array, scale_mode: str, block_size: int) -> jax.Array:
  """Views ``x`` (rank >= 1) as (..., groups, group_size) for its scales.

  Where ``x``'s type carries its sharding (explicit mesh axes), the view is
  sharded like ``x`` as far as the groups allow: a block-scaled last axis
  stays sharded where its mesh axes divide the number of blocks, and is
  gathered first where they do not (blocks then straddle shards); a
  tensor-scaled array is flattened onto all the mesh axes it is sharded
  over. `_unblocked` lays the result out like ``x`` again.
  """
  spec = explicit.spec_of(x)
  if scale_mode == 'tensor':
    if not x.size:
      return x.reshape((1,) * x.ndim + (0,))
    shape = (1,) * x.ndim + (x.size,)
    if spec is None:
      return x.reshape(shape)
    axes = tuple(a for p in spec if p is not None
                 for a in ((p,) if isinstance(p, str) else p))
    return jnp.reshape(x, shape, out_sharding=explicit.with_spec(
        x, (None,) * x.ndim + (axes,)))
  if scale_mode == 'row':
    return x[..., None, :]
  n = x.shape[-1]
  nb = -(-n // block_size)
  if not explicit.divides(x, -1, nb):
    x = explicit.replicate_last_axis(x)
  if nb * block_size != n:
    pad = [(0, 0)] * (x.ndim - 1) + [(0, nb * block_size - n)]
    x = jnp.pad(x, pad)
  shape = (*x.shape[:-1], nb, block_size)
  spec = explicit.spec_of(x)
  if spec is None:
    return x.reshape(shape)
  # The mesh axes of the last axis go to the blocks, never into a block.
  return jnp.reshape(x, shape, out_sharding=explicit.with_spec(
      x, spec[:-1] + (spec[-1], None)))


def _unblocked(y: jax.Array, like: jax.Array) -> jax.Array:
  """Inverse of `_blocked`: ``y`` with the shape and sharding of
  ``like``, the array that was blocked (its dtype does not matter)."""
  shape = tuple(like.shape)
  sharding = explicit.sharding_of(like)
  if math.prod(y.shape) == math.prod(shape):  # No padding: a plain view.
    if sharding is None:
      return y.reshape(shape)
    return jnp.reshape(y, shape, out_sharding=sharding)
  n = shape[-1]
  merged = y.shape[:-2] + (y.shape[-2] * y.shape[-1],)
  # Drop the padding of the last block from a gathered last axis: a slice
  # of a sharded axis has no sharding of its own. Gathering it may leave no
  # sharded axis at all (a last axis shorter than one block).
  y = explicit.replicate_last_axis(y)
  spec = explicit.spec_of(y)
  if spec is None:
    y = y.reshape(merged)
  else:
    y = jnp.reshape(y, merged, out_sharding=explicit.with_spec(
        y, tuple(spec[:-2]) + (None,)))
  if y.shape[-1] != n:
    y = y[..., :n]
  return explicit.reshard(y.reshape(shape), sharding)


def scale_target(fmt: Format) -> float:
  """The value a block's absolute maximum is mapped to before rounding.

  The format's largest value for narrow grids; 1 for grids with float32's
  exponent range (``bf16``, ``e8m*``), where dividing by a huge maximum would
  push the scale into float32's subnormals and lose its precision.
  """
  if fmt.exponent_bits is not None and fmt.exponent_bits >= 8:
    return 1.0
  return fmt.max_value


@functools.cache
def grid_extremes(fmt: Format) -> tuple[float, float, float]:
  """``(lo, hi, inner)``: the grid's ends and the target of a block with
  an infinity.

  ``lo`` and ``hi`` are the most negative and the largest value of the grid
  (``lo`` is 0 or positive for unsigned grids). In a block that holds an
  infinity, the finite values are mapped to at most ``inner``, the largest
  grid magnitude strictly inside both ends (or the ordinary target where
  that is already inside, as for ``bf16``), so that the end codes are left
  to the infinities alone.
  """
  target = scale_target(fmt)
  if fmt.kind == 'codebook':
    values = sorted(set(fmt.table))
    lo, hi = values[0], values[-1]
    inner = max(v for v in values if v < hi)
    if fmt.signed:
      inner = min(inner, max(-v for v in values if v > lo))
    return lo, hi, min(inner, target)
  hi = fmt.max_value
  lo = -hi if fmt.signed else 0.0
  if target < hi:
    return lo, hi, target
  if fmt.kind == 'int':
    return lo, hi, hi - 1.0
  top = math.floor(math.log2(hi))
  # One step below ``hi``: a step of its binade, or of the binade below
  # when ``hi`` is a power of two (e2m0, e3m0_ieee; e3m1fn, whose 1.5 is NaN).
  return lo, hi, hi - 2.0 ** (top - fmt.mantissa_bits - (hi == 2.0**top))


# Scales above this are applied in two exact steps (a power of two, then the
# reciprocal of the rest), so that no reciprocal is a float32 subnormal,
# which the CPU and many accelerators flush to zero.
_BIG_SCALE = 2.0**100
_SPLIT = 2.0**-64


def block_targets(fmt: Format, flagged: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """Per block, its target (`scale_target`, or the inner target where
  ``flagged``: a block holding an infinity) and the target's reciprocal.

  Both are selections between float32 constants rounded on the host: a
  reciprocal computed in the step could be rewritten by the compiler into a
  division in some shardings and fusions and not in others, which moves a
  scale by one ulp between a sharded and an unsharded run.
  """
  _, _, inner = grid_extremes(fmt)
  plain = np.float32(scale_target(fmt))
  inner = np.float32(inner)
  one = np.float32(1.0)
  return (jnp.where(flagged, inner, plain),
          jnp.where(flagged, one / inner, one / plain))


def block_scale(absmax: jax.Array, target: jax.Array,
                inverse: jax.Array) -> jax.Array:
  """``absmax / target``, rounded so that ``target * scale <= absmax``.

  Computed as a product with ``inverse``, the reciprocal of ``target``
  rounded on the host (see `block_targets`), and at most two steps down,
  so the same inputs give the same bits whatever the shape of the array or
  the compiler's fusion, and decoding the largest code (``target * scale``)
  never overflows to infinity.
  """
  target = jnp.asarray(target, jnp.float32)
  # A target below one (a block with an infinity in a grid whose inner
  # value is below one) may take a huge maximum past float32: saturate, and
  # let the encoder clip the values to the target.
  scale = jnp.minimum(absmax * jnp.asarray(inverse, jnp.float32),
                      jnp.float32(_F32_MAX))
  for _ in range(2):
    # One step towards zero is the bit pattern less one (the test holds
    # only for a positive scale): a few integer ops where ``nextafter``
    # takes a dozen, recomputed for every element of the block when the
    # compiler fuses the scale into the encoder.
    down = lax.bitcast_convert_type(
        lax.bitcast_convert_type(scale, jnp.uint32) - jnp.uint32(1),
        jnp.float32)
    scale = jnp.where(scale * target > absmax, down, scale)
  return scale


def apply_inverse_scale(xb: jax.Array, scale: jax.Array) -> jax.Array:
  """``xb / scale[..., None]`` as one explicit, shape-independent product.

  The reciprocal is taken once per block and applied by multiplication:
  XLA may otherwise rewrite a division by a broadcast scale into a product
  with a reciprocal for some shapes and not for others, so that tiled,
  sharded and whole-array encodings of the same block would differ in their
  last bit. Zero and NaN scales leave the values as they are (an all-zero
  block; a NaN block decodes to NaN by its scale).
  """
  return _times_reciprocal(xb, *_reciprocal(scale))


def _times_reciprocal(xb: jax.Array, pre: jax.Array, inv: jax.Array
                      ) -> jax.Array:
  """``(xb * pre[..., None]) * inv[..., None]``: see `_reciprocal`."""
  return (xb * pre[..., None]) * inv[..., None]


def _reciprocal(scale: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``(pre, inv)`` with ``x / scale == (x * pre) * inv``, ``inv`` never a
  flushed subnormal; zero and NaN scales give ``(1, 1)``."""
  safe = jnp.where(scale > 0, scale, jnp.float32(1.0))
  big = safe > jnp.float32(_BIG_SCALE)
  pre = jnp.where(big, jnp.float32(_SPLIT), jnp.float32(1.0))
  return pre, jnp.float32(1.0) / (safe * pre)


def _encode_values(  # pylint: disable=too-many-return-statements
    y: jax.Array, fmt: Format, u: jax.Array | None,
    positive: jax.Array | None = None, clipped: bool = False,
    inverse_scale: jax.Array | None = None,
) -> jax.Array:
  """Encodes scaled float32 values ``y`` into unpacked codes of ``fmt``.

  ``positive`` marks the inputs that were positive before scaling (by
  default ``y > 0``): with ``fmt.positive_floor`` they never encode to zero,
  even where scaling underflowed them. ``clipped`` says that no magnitude
  of ``y`` exceeds the format's largest (block-scaled values clipped to
  their target, infinities marked at the grid's ends): rounding to nearest
  then needs no saturation. ``inverse_scale`` (broadcasting against ``y``;
  one where None) is what ``y`` was multiplied by: a format rounding in
  preconditioner space (``fmt.space_offset``) needs it to put its ``eps``
  in the scaled values' units, ``eps / sqrt(scale)``.
  """
  if fmt.positive_floor:
    # Positive values never round to zero (second moments); NaN stays NaN.
    positive = y > 0 if positive is None else positive
    y = jnp.where(positive, jnp.maximum(y, jnp.float32(fmt.min_positive)), y)
  if fmt.kind == 'float':
    if fmt.is_identity:
      return y
    native = fmt.bits == 8 * fmt.dtype.itemsize
    layout = minifloat.layout_of(fmt.dtype) if native else None
    if layout is not None and u is not None:
      # fp8, stochastically: the bit-level encoder rounds with the draws
      # itself (the codes of ``round_float_grid`` then the encoder).
      return lax.bitcast_convert_type(
          minifloat.encode(y, **layout, u=u, max_value=fmt.max_value),
          fmt.dtype)
    if native and u is None and fmt.bits == 8:
      # Saturate; the fp8 encoder then rounds half to even with correct
      # subnormals. e4m3fn has no infinity: an unclipped overflow would
      # become NaN.
      if not clipped:
        y = rounding_lib.saturate(y, fmt.max_value)
    elif native and u is None and fmt.exponent_bits == 8:
      # bf16: round explicitly before the cast. Under jit, XLA may drop a
      # float32 -> bf16 -> float32 round trip (excess precision), which
      # would leave the value unrounded wherever the codes are decoded in
      # the same computation (the residual of a quantized weight, say);
      # ``reduce_precision`` is never elided, and gives the cast's bits.
      y = lax.reduce_precision(rounding_lib.saturate(y, fmt.max_value),
                               exponent_bits=8,
                               mantissa_bits=fmt.mantissa_bits)
    else:
      # Explicit bit arithmetic (also fp16 to nearest, for the reason
      # above: ``reduce_precision`` would flush its subnormals).
      y = rounding_lib.round_float_grid(
          y, exponent_bits=fmt.exponent_bits,
          mantissa_bits=fmt.mantissa_bits, max_value=fmt.max_value, u=u)
    if layout is not None:  # fp8: the vectorizable bit-level encoder.
      return lax.bitcast_convert_type(minifloat.encode(y, **layout),
                                      fmt.dtype)
    return y.astype(fmt.dtype)
  if fmt.kind == 'int':
    q = fmt.max_value
    c = jnp.clip(rounding_lib.round_int(y, u), -q, q)
    c = jnp.where(jnp.isnan(c), 0, c)
    if fmt.packed:
      return (c + (q + 1)).astype(jnp.uint8)
    return c.astype(fmt.dtype)
  y = jnp.where(jnp.isnan(y), 0, y)
  ties = 'even' if fmt.ties_to_even else 'down'
  # Preconditioner space: eps in the scaled values' units, eps / sqrt(scale).
  offset = None if not fmt.space_offset else jnp.float32(fmt.space_offset) * (
      1.0 if inverse_scale is None else jnp.sqrt(inverse_scale))
  return rounding_lib.round_to_table(y, fmt.table, u, fmt.space, ties,
                                     offset).astype(jnp.uint8)


def _decode_values(codes: jax.Array, fmt: Format) -> jax.Array:
  """Decodes unpacked codes of ``fmt`` to float32 (before scaling)."""
  if fmt.kind == 'float':
    layout = minifloat.layout_of(codes.dtype)
    if layout is not None:
      return minifloat.decode(
          lax.bitcast_convert_type(codes, jnp.uint8), **layout)
    return codes.astype(jnp.float32)
  if fmt.kind == 'int':
    if fmt.packed:
      return codes.astype(jnp.float32) - (fmt.max_value + 1)
    return codes.astype(jnp.float32)
  table = np.asarray(fmt.table, np.float32)
  return rounding_lib.lookup(table, codes.astype(jnp.int32))


def encode(  # pylint: disable=too-many-branches
    x: jax.Array,
    fmt: Format,
    *,
    scale_mode: str,
    block_size: int,
    key: jax.Array | None,
    dtype: Any = None,
    row_stride: int = 1,
    row_offset: jax.Array | int = 0,
    materialize: Callable[[Callable[[], Any]], Any] | None = None,
    scale_source: jax.Array | None = None,
) -> QArray:
  """Encodes ``x`` with a fixed layout; ``key`` set means stochastic.

  ``row_stride`` and ``row_offset`` say that ``x`` is the tile of rows
  ``row_offset, row_offset + row_stride, ...`` of a larger array: its
  stochastic-rounding bits are then that array's (blocks lie along the last
  axis, so a tile's scales and codes equal the larger array's).

  ``materialize``, where given, is how the caller wants the per-block
  values (target, stored scale, reciprocal) of the ``'block'``, ``'row'``
  and ``'tensor'`` layouts computed: it is called with a function of no
  arguments and returns that function's value. The execution layer passes
  one that computes them into buffers of their own on XLA:CPU; the codec
  knows nothing of backends. It must not change the values, only where
  they are computed. (Power-of-two scales, range expansion and rank-1
  maxima ignore it.)

  ``scale_source``, where given, is ``x`` computed a second time, apart
  (the same values, or values that differ from them in the last bits where
  the compiler contracted a multiply and an add differently): the per-block
  values of those same layouts are taken from it, so that a compiler can
  reduce it to its block maxima without writing ``x`` to memory and compute
  ``x`` again where it is encoded. An element of ``x`` above its block's
  target is clipped onto it, as a saturated scale's are. The two must agree
  on which elements are infinite or NaN, as two evaluations of one
  expression do unless a value lies within rounding of float32's largest
  (where one may overflow and the other not). Layouts that take no maxima
  from it ignore it (`reads_scale_source`).
  """
  sr_rows = dict(row_stride=row_stride, row_offset=row_offset)
  shape = tuple(x.shape)
  dtype = jnp.dtype(dtype or x.dtype).name
  xf = jnp.asarray(x, jnp.float32)
  if not shape:
    xf = xf.reshape(1)
  if scale_mode == 'none':
    u = (None if key is None
         else rounding_lib.uniform(key, xf.shape, **sr_rows))
    codes = _encode_values(xf, fmt, u)
    scale = None
  elif scale_mode == 'rank1':
    # Per axis, the maxima of the finite magnitudes of the slices through
    # each index of that axis (NaN where a slice holds a NaN), and their
    # infinity flags; each element is scaled as `_rank1_scales` says.
    is_inf = jnp.isinf(xf)
    maxima = []
    for axis in range(xf.ndim):
      others = tuple(a for a in range(xf.ndim) if a != axis)
      top, has_inf, has_nan = finite_maxima(xf, is_inf, axis=others)
      maxima.append((jnp.where(has_nan, jnp.float32(jnp.nan), top), has_inf))
    _, pre, inv, _ = _rank1_scales(xf, maxima, fmt)
    y = _mark_infinities((xf * pre) * inv, xf, fmt)
    u = (None if key is None
         else rounding_lib.uniform(key, xf.shape, **sr_rows))
    codes = _encode_values(y, fmt, u, positive=xf > 0,
                           inverse_scale=pre * inv)
    # The maxima are stored replicated, one axis after another, a slice
    # holding an infinity negated.
    signed = [jnp.where(f, -m, m) for m, f in maxima]
    replicated = [explicit.reshard(m, None if explicit.spec_of(m) is None
                                   else explicit.with_spec(m, (None,)))
                  for m in signed]
    scale = jnp.concatenate(replicated).reshape(
        (1,) * (xf.ndim - 1) + (sum(xf.shape),))
  else:
    xb = _blocked(xf, scale_mode, block_size)
    is_inf = jnp.isinf(xb)
    # The scale follows the finite values; an infinity takes the grid's end
    # code of its sign, and its block's scale is stored negated (sign bit
    # set) to say so; a NaN takes the upper end code, and its block's scale
    # is stored boxed in a NaN (`box_scale`).
    u = (None if key is None
         else rounding_lib.uniform(key, xb.shape, **sr_rows))
    nan_code = None
    inverse_scale = None
    # The values the block maxima are taken from (`reads_scale_source`).
    sb, sb_inf = xb, is_inf
    if scale_source is not None and reads_scale_source(fmt, scale_mode):
      sb = _blocked(jnp.asarray(scale_source, jnp.float32).reshape(xf.shape),
                    scale_mode, block_size)
      sb_inf = jnp.isinf(sb)
    if scale_mode == 'block_pow2' or fmt.expand:
      absmax, has_inf, has_nan = finite_maxima(sb, sb_inf, axis=-1)
      target, inverse = block_targets(fmt, has_inf)
      if scale_mode == 'block_pow2':
        stored = pow2_scale(absmax, target, has_inf | has_nan)
        y = scale_by_exponent(xb, stored, inverse=True)
        if fmt.space_offset:
          inverse_scale = scale_by_exponent(
              jnp.ones(stored.shape + (1,), jnp.float32), stored,
              inverse=True)
      else:
        # fp8 codes: a NaN keeps its own NaN code.
        steps = range_exponent(xb, ~is_inf, absmax, fmt)
        stored = with_exponent(absmax, steps)
        y = _expand(apply_inverse_scale(xb, group_maximum(stored)), steps,
                    target)
        stored = jnp.where(has_inf, -stored, stored)
    else:
      def per_block():
        absmax, has_inf, has_nan = finite_maxima(sb, sb_inf, axis=-1)
        target, inverse = block_targets(fmt, has_inf | has_nan)
        scale, stored = box_scale(block_scale(absmax, target, inverse),
                                  has_nan)
        stored = jnp.where(has_inf & ~has_nan, -stored, stored)
        return target, stored, _reciprocal(scale)
      target, stored, reciprocal = (
          per_block() if materialize is None else materialize(per_block))
      y = _times_reciprocal(xb, *reciprocal)
      if fmt.space_offset:
        inverse_scale = (reciprocal[0] * reciprocal[1])[..., None]
      nan_code = grid_extremes(fmt)[1]
    # A block's finite values stay inside its target (a saturated scale may
    # leave them above it), so that only infinities (and NaNs) take the end
    # codes.
    limit = target[..., None]
    y = _mark_infinities(jnp.clip(y, -limit, limit), xb, fmt)
    if nan_code is not None:
      y = jnp.where(jnp.isnan(xb), np.float32(nan_code), y)
    codes = _encode_values(y, fmt, u, positive=xb > 0, clipped=fmt.signed,
                           inverse_scale=inverse_scale)
    codes, scale = _unblocked(codes, xf), stored
  if fmt.packed:
    codes = packing.pack(codes, fmt.bits)
  if not shape:
    # A scalar's code, packed: one byte, or three for 3-bit codes (which
    # keep their packed shape (3,)).
    codes = codes.reshape(()) if codes.size == 1 else codes
    if scale is not None:
      scale = scale.reshape(())
  return QArray(codes, scale, fmt, shape, dtype, scale_mode,
                block_size if scale_mode in BLOCK_MODES else 0)


def reads_scale_source(fmt: Format, scale_mode: str) -> bool:
  """Whether `encode` takes the block maxima of this layout from its
  ``scale_source``: every layout of scales but rank-1 maxima and range
  expansion (which reads each element's own exponent)."""
  return scale_mode not in ('none', 'rank1') and not fmt.expand


def _mark_infinities(y: jax.Array, x: jax.Array, fmt: Format) -> jax.Array:
  """Scaled values ``y`` with the infinities of ``x`` at the grid's end
  value of their sign (on the grid, so no saturation is needed for them).

  The test and the choice read ``x``'s bit pattern (an infinity is the
  pattern ``0x7F800000`` under the sign bit): compares and a select that
  the compiler vectorizes inside the encoder's loop. An unsigned grid has
  no negative end: a negative infinity goes below it, and rounds onto its
  lowest value.
  """
  lo, hi, _ = grid_extremes(fmt)
  if not fmt.signed:
    lo = -min(2.0 * fmt.max_value, _F32_MAX)
  bits = lax.bitcast_convert_type(x, jnp.uint32)
  inf = (bits & jnp.uint32(0x7FFFFFFF)) == jnp.uint32(0x7F800000)
  end = jnp.where(bits >= jnp.uint32(0x80000000), np.float32(lo),
                  np.float32(hi))
  return jnp.where(inf, end, y)


def _restore_infinities(out: jax.Array, y: jax.Array, magnitude: jax.Array,
                        flagged: jax.Array, fmt: Format) -> jax.Array:
  """Decoded ``out`` with infinities where a flagged element (a block, or
  every slice through it, held one) has an end code ``y`` of the grid
  (``magnitude + inf``: NaN where the scale is NaN)."""
  lo, hi, _ = grid_extremes(fmt)
  inf = magnitude + jnp.float32(jnp.inf)
  out = jnp.where(flagged & (y >= jnp.float32(hi)), inf, out)
  if fmt.signed:
    out = jnp.where(flagged & (y <= jnp.float32(lo)), -inf, out)
  return out


def finite_maxima(x: jax.Array, is_inf: jax.Array, axis
                  ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The largest finite magnitude along ``axis`` (0 if none), whether an
  infinity is there, and whether a NaN is there.

  Non-finite values are replaced by zeros before the maximum (XLA's CPU
  maximum reduction drops NaNs from rows of 256 and more, vectorized, so a
  NaN must never reach it), and their kinds are found by reductions of
  their own (boolean: a sharded bitwise-or reduction of integers is not
  implemented on CPU). (One variadic reduction
  for both was faster on CPU, but it changed how the compiler fused the
  moment update ahead of it, and with that where it contracted a multiply
  and an add into a fused multiply-add: a sharded run's scales then
  differed from an unsharded run's in their last bit.)
  """
  is_nan = jnp.isnan(x)
  mag = jnp.where(is_nan | is_inf, jnp.float32(0), jnp.abs(x))
  top = jnp.max(mag, axis=axis, initial=0.0)
  return top, jnp.any(is_inf, axis=axis), jnp.any(is_nan, axis=axis)


# A NaN block's scale (`box_scale`): a quiet NaN (exponent all ones, bit 22)
# with bit 21 set, and the scale's bits 30..10 (its exponent and 13 leading
# mantissa bits) in bits 20..0. A NaN without bit 21 (the default NaN)
# decodes its whole block to NaN.
_BOX_TAG = 0x7FE00000
_BOX_SHIFT = 10
_BOX_PAYLOAD = 0x1FFFFF


def box_scale(scale: jax.Array, has_nan: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """``(magnitude, stored)``: the scale a block is encoded with, and the
  float32 it is stored as (``scale`` (>= 0) where ``has_nan`` is False).

  A block holding a NaN stores its scale, rounded down to 13 mantissa bits
  (a relative change below ``2**-13``; rounding down keeps the largest code
  from overflowing), inside the payload of a NaN: the stored scale says both
  that the block's end codes are NaN and what its other codes are scaled by.
  """
  bits = lax.bitcast_convert_type(scale, jnp.uint32)
  payload = bits >> jnp.uint32(_BOX_SHIFT)
  cut = lax.bitcast_convert_type(payload << jnp.uint32(_BOX_SHIFT),
                                 jnp.float32)
  boxed = lax.bitcast_convert_type(payload | jnp.uint32(_BOX_TAG),
                                   jnp.float32)
  return jnp.where(has_nan, cut, scale), jnp.where(has_nan, boxed, scale)


def unbox_scale(stored: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Inverse of `box_scale`, of a stored (signed) scale: ``(|scale|,
  whether the block's end codes are NaN)``."""
  bits = lax.bitcast_convert_type(stored, jnp.uint32)
  boxed = (bits & jnp.uint32(_BOX_TAG)) == jnp.uint32(_BOX_TAG)
  inner = lax.bitcast_convert_type(
      (bits & jnp.uint32(_BOX_PAYLOAD)) << jnp.uint32(_BOX_SHIFT),
      jnp.float32)
  return jnp.where(boxed, inner, jnp.abs(stored)), boxed


# Rank-1 normalisation (``'rank1'``): each element is scaled by the smallest
# of the absolute maxima of the slices through it, one per axis: for a
# matrix the smaller of its row's and its column's maximum (Li et al., 2023),
# for a tensor of rank p the smallest of p. The maxima are stored one axis
# after another as one float32 array of shape (1, ..., 1, sum(shape)); a
# slice holding an infinity has its maximum stored negated, as a flagged
# block's scale is.


def _rank1_scales(x: jax.Array, maxima, fmt: Format):
  """Per-element scales, the factors that apply their inverse (as
  `apply_inverse_scale`'s), and the infinity flags, laid out like ``x``.

  An element's scale is the smallest of its slices' scales, each the
  maximum over the target as `block_scale` rounds it; a slice holding
  an infinity takes the grid's inner target, so that an element of flagged
  slices along every axis (an infinity's place) never reaches an end code
  with a finite value. Its inverse is that slice's reciprocal: everything
  per element is a selection between values computed once per slice, with
  no per-element division. A NaN maximum is never taken over a number, so a
  NaN decodes to NaN and an element with another slice free of NaN keeps
  its value.
  """
  best = None
  for axis, (m, flag) in enumerate(maxima):
    m, flag = _along(m, x, axis), _along(flag, x, axis)
    scale = block_scale(m, *block_targets(fmt, flag))
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    side = [a.reshape(shape) for a in (scale, *_reciprocal(scale), flag)]
    if best is None:
      best = side
      continue
    take = (side[0] < best[0]) | (jnp.isnan(best[0]) & ~jnp.isnan(side[0]))
    best = [jnp.where(take, a, b) for a, b in zip(side[:3], best[:3])] + [
        best[3] & side[3]]
  return tuple(best)


def _along(v: jax.Array, x: jax.Array, axis: int) -> jax.Array:
  """Maxima ``v`` of the slices through each index of ``x``'s ``axis``,
  sharded like that axis (so that broadcasting them back against ``x``
  gathers nothing)."""
  spec = explicit.spec_of(x)
  if spec is None:
    return v
  return explicit.reshard(v, explicit.with_spec(x, (spec[axis],)))


# The expansion exponent ``k`` of ``<format>_dre`` is a power of two in
# [1, K_MAX]: raising to it is repeated squaring and undoing it repeated
# square roots, both correctly rounded, so the same group gives the same bits
# whatever the shape, fusion or backend (a float ``k`` would need exp2 and
# log2, whose compiled approximations differ between vectorized and scalar
# code), and cheap. ``k >= 1`` only expands: a group wider than the grid is
# stored as plain fp8 stores it, and stochastic rounding stays unbiased in
# the expanded value with a bounded error in the value itself. Its
# ``log2`` (0, 1 or 2) is kept in the two lowest mantissa bits of the
# group's float32 maximum, which is rounded down to free them (a relative
# change below 2**-22): the layout, the sharding and the bytes are those of
# plain block scales (8.25 bits per element at block 128).
K_MAX = 4.0
_K_STEPS = 2  # log2(K_MAX)
_STEP_BITS = 3  # The low mantissa bits that hold log2(k).


def with_exponent(absmax: jax.Array, steps: jax.Array) -> jax.Array:
  """A group's stored maximum: ``absmax`` (>= 0) rounded down to a multiple
  of four units in the last place, ``steps`` = log2(k) in the freed bits."""
  bits = lax.bitcast_convert_type(absmax, jnp.uint32)
  bits = (bits & ~jnp.uint32(_STEP_BITS)) | steps.astype(jnp.uint32)
  return lax.bitcast_convert_type(bits, jnp.float32)


def group_maximum(stored: jax.Array) -> jax.Array:
  """The maximum a group's values are scaled by (its low bits cleared)."""
  bits = lax.bitcast_convert_type(jnp.abs(stored), jnp.uint32)
  return lax.bitcast_convert_type(bits & ~jnp.uint32(_STEP_BITS),
                                  jnp.float32)


def exponent_steps(stored: jax.Array) -> jax.Array:
  """``log2(k)`` of a group (int32), from its stored maximum."""
  bits = lax.bitcast_convert_type(jnp.abs(stored), jnp.uint32)
  return (bits & jnp.uint32(_STEP_BITS)).astype(jnp.int32)


def range_exponent(xb: jax.Array, finite: jax.Array, absmax: jax.Array,
                   fmt: Format) -> jax.Array:
  """``log2`` of COAT's exponent ``k`` per group of blocked values ``xb``,
  ``k`` a power of two (int32 in [0, log2(K_MAX)]).

  COAT takes ``k = log(R_fmt) / log(R_x)``: ``R_x`` the ratio of the
  group's largest to its smallest non-zero finite magnitude, ``R_fmt`` that
  of the grid's largest value to its smallest (subnormal) one, so that
  ``(|x| / max|x|)**k`` spans the grid's range. Here ``k`` is the largest
  power of two in [1, ``K_MAX``] with ``(1 / R_x)**k >= 1 / R_fmt``, decided
  by the same repeated squaring that expands the values (exact, so the same
  group gets the same ``k`` whatever the shape): ``floor`` of COAT's ``k``
  to a power of two. A group of one magnitude gets ``K_MAX``. (A ``K_MAX``
  above 4 changed no codec error we measured on Gaussian and Student-t
  moments, and costs one more square root per element in every decode.)

  References:
    Xi et al, [COAT: Compressing Optimizer states and Activation for
    Memory-Efficient FP8 Training](https://arxiv.org/abs/2410.19313), 2024
  """
  # Subnormals count as zero: eager execution flushes them and a compiled
  # fusion may not, and the same group must get the same k either way.
  nonzero = finite & (jnp.abs(xb) >= jnp.float32(np.finfo(np.float32).tiny))
  absmin = jnp.min(jnp.where(nonzero, jnp.abs(xb), jnp.float32(jnp.inf)),
                   axis=-1, initial=jnp.inf)
  usable = jnp.isfinite(absmin) & (absmax > 0) & jnp.isfinite(absmax)
  pre, inv = _reciprocal(jnp.where(usable, absmax, jnp.float32(1.0)))
  ratio = (jnp.where(usable, absmin, jnp.float32(1.0)) * pre) * inv
  floor = jnp.float32(fmt.min_positive / fmt.max_value)
  steps = jnp.zeros(ratio.shape, jnp.int32)
  for _ in range(_K_STEPS):
    ratio = ratio * ratio
    steps = steps + (ratio >= floor).astype(jnp.int32)
  return steps


def _expand(r: jax.Array, steps: jax.Array, target: jax.Array) -> jax.Array:
  """``sign(r) target |r|**k``, per group, for ``|r| <= 1`` (``k`` =
  ``2**steps``: repeated squaring)."""
  steps = steps[..., None]
  y = jnp.abs(r)
  for j in range(_K_STEPS):
    y = jnp.where(steps > j, y * y, y)
  return jnp.copysign(target[..., None] * y, r)


def _contract(yb: jax.Array, steps: jax.Array, flagged: jax.Array,
              fmt: Format) -> jax.Array:
  """Inverse of `_expand` up to the group maximum:
  ``sign(y) (|y| / target)**(1/k)`` by repeated square roots, at most 1."""
  _, _, inner = grid_extremes(fmt)
  inv_t = jnp.where(flagged, jnp.float32(1.0 / inner),
                    jnp.float32(1.0 / scale_target(fmt)))
  r = jnp.abs(yb) * inv_t
  for j in range(_K_STEPS):
    r = jnp.where(steps > j, jnp.sqrt(r), r)
  return jnp.copysign(jnp.minimum(r, jnp.float32(1.0)), yb)


# Shared power-of-two scales (``'block_pow2'``), one byte per block as the
# OCP MX E8M0 scale: code ``c`` in [1, 254] is the scale ``2**(c - 127)``,
# 0 an all-zero block, 255 a block holding a NaN or an infinity.
_E8M0_BIAS = 127
_E8M0_NAN = 255


def pow2_scale(absmax: jax.Array, target: jax.Array,
               has_inf: jax.Array) -> jax.Array:
  """uint8 codes of the smallest ``2**e >= absmax / target``.

  Exact, and free of subnormal intermediates (which CPUs flush to zero):
  with ``absmax = a 2**ka`` and ``target = t 2**kt`` (``frexp``), ``e`` lies
  in ``[ka - kt - 1, ka - kt + 1]``; starting from the lowest, it is raised
  while ``target * 2**e`` (a product by a power of two) falls short of
  ``absmax``. Exponents are clipped to [-126, 127], so a grid whose largest
  value is below 2 saturates blocks above ``2**127`` (1.7e38), and values
  of blocks below ``2**-126`` times the target round on a coarser grid.
  """
  _, ka = jnp.frexp(absmax)
  _, kt = jnp.frexp(target * jnp.ones_like(absmax))
  e = jnp.clip(ka - kt - 1, -126, 127)
  for _ in range(2):
    short = _times_pow2(target * jnp.ones_like(absmax), e) < absmax
    e = jnp.clip(jnp.where(short, e + 1, e), -126, 127)
  code = (e + _E8M0_BIAS).astype(jnp.uint8)
  code = jnp.where(absmax == 0, jnp.uint8(0), code)
  bad = has_inf | jnp.isnan(absmax)
  return jnp.where(bad, jnp.uint8(_E8M0_NAN), code)


def _times_pow2(x: jax.Array, e: jax.Array) -> jax.Array:
  """``x * 2**e`` for |e| <= 127 in two exact products (no factor is a
  subnormal, which CPUs flush to zero)."""
  half = e // 2
  one = jnp.float32(1.0)
  return (x * jnp.ldexp(one, half)) * jnp.ldexp(one, e - half)


def scale_by_exponent(yb: jax.Array, code: jax.Array, *,
                      inverse: bool = False) -> jax.Array:
  """Blocked values times (or over) their E8M0 scales: zero blocks give
  zeros (decoding) or stay as they are (encoding), NaN blocks NaN."""
  e = code.astype(jnp.int32) - _E8M0_BIAS
  out = _times_pow2(yb, (-e if inverse else e)[..., None])
  if not inverse:
    out = jnp.where((code == 0)[..., None], jnp.float32(0), out)
  return jnp.where((code == _E8M0_NAN)[..., None], jnp.float32(jnp.nan), out)


@functools.partial(jax.jit, static_argnames=('fmt', 'scale_mode',
                                             'block_size', 'dtype'))
def encode_compiled(x: jax.Array, fmt: Format, *, scale_mode: str,
                    block_size: int, key: jax.Array | None,
                    dtype: Any = None) -> QArray:
  """`encode`, compiled once per layout: outside ``jit`` (a
  parameter tree quantized at the start, a state's first encoding) one call
  instead of hundreds of small dispatched operations. The same bits."""
  return encode(x, fmt, scale_mode=scale_mode, block_size=block_size,
                key=key, dtype=dtype)


@functools.partial(jax.jit, static_argnames=('dtype',))
def decode_compiled(q: QArray, dtype: Any = jnp.float32) -> jax.Array:
  """`decode`, compiled once per layout and shape: outside ``jit`` (a
  state decoded for export) one call instead of many small ones."""
  return decode(q, dtype)


@functools.cache
def zero_code(fmt: Format) -> np.ndarray:
  """The unpacked code `encode` gives 0.0 (a scalar of the codes' dtype),
  in any scale mode: a zero stays zero after scaling (an all-zero block's
  scale is zero, and its reciprocal taken as one).

  +0.0's bits for float grids, the offset zero of packed integers, and for
  codebooks the index nearest rounding gives zero in the format's rounding
  space (the smallest entry of a grid without zero, such as ``ue4m3``).
  """
  if fmt.kind == 'float':
    return np.zeros((), fmt.dtype)
  if fmt.kind == 'int':
    return np.asarray(fmt.max_value + 1 if fmt.packed else 0, fmt.dtype)
  ties = 'even' if fmt.ties_to_even else 'down'
  # Zero is an entry of a grid in preconditioner space, or below the first.
  space = 'linear' if fmt.space_offset else fmt.space
  return np.asarray(
      rounding_lib.table_index(0.0, fmt.table, space, ties), np.uint8)


@functools.cache
def zero_scale(fmt: Format, scale_mode: str) -> np.ndarray | None:
  """The stored scale `encode` gives an all-zero block (a scalar), or None
  for an unscaled layout.

  Zero for float32 scales (rank-1 maxima included); the E8M0 code 0 for
  ``'block_pow2'``; for range expansion, the maximum zero with the largest
  exponent step in its low bits (`range_exponent` gives a group without
  two distinct magnitudes ``K_MAX``).
  """
  if scale_mode == 'none':
    return None
  if scale_mode == 'block_pow2':
    return np.asarray(0, np.uint8)
  if fmt.expand:
    return np.asarray(_K_STEPS, np.uint32).view(np.float32)
  return np.zeros((), np.float32)


def buffer_shapes(shape: tuple[int, ...], fmt: Format, scale_mode: str,
                  block_size: int
                  ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
  """Shapes of the codes and the scales (None: unscaled) `encode` gives an
  array of logical ``shape``."""
  codes = tuple(shape) or (1,)
  if fmt.packed:
    codes = packing.packed_shape(codes, fmt.bits)
  if not shape and math.prod(codes) == 1:
    codes = ()
  if scale_mode == 'none':
    return codes, None
  return codes, scale_shape(shape, scale_mode, block_size)


def zeros(shape: tuple[int, ...], fmt: Format, *, scale_mode: str,
          block_size: int, dtype: Any = jnp.float32,
          codes_sharding: Any = None, scale_sharding: Any = None) -> QArray:
  """`encode` of an all-zero array of ``shape``, bit for bit, with nothing
  encoded: the codes and scales of zero (`zero_code`, `zero_scale`)
  broadcast, packed codes as `packing.packed_row` lays them out. The
  shardings, where given, are those of the codes and the scales (see
  ``jnp.full``'s ``device``)."""
  shape = tuple(shape)
  codes_shape, scale_shape_ = buffer_shapes(shape, fmt, scale_mode,
                                            block_size)
  code = zero_code(fmt)
  fill = code
  if fmt.packed:
    row = packing.packed_row(int(code), shape[-1] if shape else 1, fmt.bits)
    fill = row[0] if np.all(row == row[0]) else row.reshape(
        codes_shape[-1:])
  if np.ndim(fill):  # A packed row with a partial last byte or group.
    codes = jnp.full(codes_shape, fill, code.dtype)
    codes = codes if codes_sharding is None else jax.device_put(
        codes, codes_sharding)
  else:
    codes = jnp.full(codes_shape, fill, code.dtype, device=codes_sharding)
  scale = None
  if scale_shape_ is not None:
    value = zero_scale(fmt, scale_mode)
    scale = jnp.full(scale_shape_, value, value.dtype, device=scale_sharding)
  return QArray(codes, scale, fmt, shape, jnp.dtype(dtype).name, scale_mode,
                block_size if scale_mode in BLOCK_MODES else 0)


def round_trip(x: jax.Array, fmt: Format, *, scale_mode: str,
               block_size: int, key: jax.Array | None) -> jax.Array:
  """``x`` rounded to ``fmt`` (with its scales) and decoded, in ``x``'s
  dtype: what a quantized gradient or a forward weight is. The rounding is
  the codec's explicit arithmetic, which ``jit`` cannot elide as excess
  precision; a float32 grid (``fp32``, ``e8m23``) returns ``x``."""
  if fmt.is_identity and scale_mode == 'none':
    return x
  y = decode(encode(x, fmt, scale_mode=scale_mode, block_size=block_size,
                    key=key))
  if x.dtype != y.dtype:
    # A grid value past a narrower leaf's range (65504 on a bf16 grid is
    # 65536, infinite in float16) takes the leaf's largest value.
    y = rounding_lib.saturate(y, float(jnp.finfo(x.dtype).max))
  return y.astype(x.dtype)


def encode_like(
    q: QArray,
    x: Any,
    *,
    key: jax.Array | None,
    row_stride: int = 1,
    row_offset: jax.Array | int = 0,
    materialize: Callable[[Callable[[], Any]], Any] | None = None,
    scale_source: jax.Array | None = None,
) -> QArray:
  """Encodes ``x`` with the layout of ``q`` (format, scales, logical dtype).

  The one way the library re-encodes a stored leaf (after an update, at a
  reset, tile by tile): ``x`` is taken as float32. ``key``, ``row_stride``,
  ``row_offset``, ``materialize`` and ``scale_source`` are as for `encode`.
  """
  return encode(
      jnp.asarray(x, jnp.float32), q.fmt, scale_mode=q.scale_mode,
      block_size=q.block_size or 2, key=key, dtype=q.dtype,
      row_stride=row_stride, row_offset=row_offset, materialize=materialize,
      scale_source=scale_source)


def decode(q: QArray, dtype: Any = jnp.float32) -> jax.Array:
  """Decodes a `QArray` to ``dtype`` (float32 by default)."""
  shape = q.shape
  flat_shape = shape or (1,)
  codes = q.codes.reshape(-1) if not shape else q.codes
  if q.fmt.packed:
    codes = packing.unpack(codes, flat_shape[-1], q.fmt.bits)
  y = _decode_values(codes, q.fmt)
  if q.scale is not None and q.scale_mode == 'rank1':
    flat = q.scale.reshape(-1)
    bounds = np.cumsum((0,) + y.shape)
    maxima = [(jnp.abs(flat[a:b]), jnp.signbit(flat[a:b]))
              for a, b in zip(bounds[:-1], bounds[1:])]
    scale, _, _, flagged = _rank1_scales(y, maxima, q.fmt)
    y = _restore_infinities(y * scale, y, scale, flagged, q.fmt)
  elif q.scale is not None and q.scale_mode == 'block_pow2':
    scale = q.scale.reshape(1) if not shape else q.scale
    yb = _blocked(y, q.scale_mode, q.block_size)
    y = _unblocked(scale_by_exponent(yb, scale), y)
  elif q.scale is not None:
    scale = q.scale.reshape(1) if not shape else q.scale
    yb = _blocked(y, q.scale_mode, q.block_size)
    # A block with its scale's sign bit set holds infinities at the grid's
    # end codes (|scale| + inf), a block with a boxed scale NaNs (a NaN
    # scale that is not boxed: NaN, the whole block).
    if q.fmt.expand:
      magnitude = jnp.abs(scale)[..., None]
      flagged = jnp.signbit(scale)[..., None]
      out = group_maximum(scale)[..., None] * _contract(
          yb, exponent_steps(scale)[..., None], flagged, q.fmt)
    else:
      magnitude, boxed = unbox_scale(scale)
      out = yb * magnitude[..., None]
      flagged = (jnp.signbit(scale) | boxed)[..., None]
      # In a NaN block the end codes decode to NaN (NaN + inf).
      magnitude = jnp.where(boxed, jnp.float32(jnp.nan), magnitude)[..., None]
    y = _unblocked(
        _restore_infinities(out, yb, magnitude, flagged, q.fmt), y)
  return y.reshape(shape).astype(dtype)


def default_scale_mode(fmt: Format) -> str:
  return 'block' if fmt.scaled else 'none'


def quantize(
    x: jax.Array,
    fmt: str | Format,
    *,
    scale_mode: str | None = None,
    block_size: int = 128,
    rounding: str = 'nearest',
    seed: int = 0,
    step: int | jax.Array = 0,
    stream: int = 0,
    scale: str | None = None,
) -> QArray:
  r"""Quantizes ``x`` into a [`QArray`][optax_q.QArray].

  Values are divided by a scale (the absolute maximum of their tensor, row
  or block of ``block_size`` elements along the last axis, divided by the
  format's largest value), rounded to the format's grid, and stored as codes.
  Arithmetic is float32 throughout. For an element `x_i` of the group `b`
  that shares its scale, and a grid `G` whose largest value is `t` (1 for
  grids with 8 exponent bits, such as ``bf16`` and ``e8m{M}``):

  ```tex
  s_b = \frac{\max_{j \in b} |x_j|}{t}, \qquad
  c_i = R_G\!\left(\frac{x_i}{s_b}\right), \qquad
  \hat x_i = s_b\, G[c_i],
  ```

  with `s_b` rounded down in float32 so that
  `t\, s_b \le \max_{j \in b} |x_j|` (the largest code never overflows),
  and `R_G` saturating at the grid's ends. `R_G` rounds to the nearest
  value of `G`, or stochastically to one of the two neighbours
  `g_- \le y \le g_+` with `P(g_+) = (y - g_-)/(g_+ - g_-)`, so that
  `E[\hat x_i] = x_i` (a codebook named ``<codec>@<space>`` takes that
  fraction in its space, and is unbiased there). ``'block_pow2'`` takes
  for `s_b` the smallest power of two `\ge \max_{j \in b} |x_j| / t`;
  ``'rank1'`` gives each element the smallest of the scales of the slices
  through it, one per axis; ``'none'`` takes `s_b = 1`. The ``_dre``
  formats round `t\, \mathrm{sign}(x_i)\, (|x_i| / \max_{j \in b} |x_j|)^{k}`
  instead, with a power of two `k \in \{1, 2, 4\}` per group.

  Args:
    x: The array to quantize (any float dtype; scalars and empty arrays are
      fine).
    fmt: A format name or [`Format`][optax_q.Format] (see
      [`get_format`][optax_q.get_format]).
    scale_mode: ``'none'``, ``'tensor'``, ``'row'``, ``'block'`` or
      ``'block_pow2'`` (a power-of-two scale per block in one byte, as the
      OCP MX E8M0 scale; a block with an infinity or NaN decodes to NaN); the
      default is ``'block'`` for formats with a narrow range (fp8, fp4, int,
      dynamic, simulated formats with fewer than 8 exponent bits) and
      ``'none'`` for ``fp32``, ``bf16`` and ``fp16``.
    block_size: Elements per scale along the last axis for ``'block'``; a
      last axis not divisible by it ends in a shorter block.
    rounding: ``'nearest'`` (round half to even) or ``'stochastic'``
      (unbiased; the bits are a hash of ``seed``, ``step``, ``stream`` and
      the element's index, so the result is reproducible).
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]`` (or
      a scalar integer array).
    step: Step counter mixed into the random bits, an int in
      ``[0, 2**32 - 1]`` or a scalar integer array (may be traced).
    stream: Static integer separating independent streams (e.g. leaves), in
      ``[0, 2**32 - 1]``.
    scale: Deprecated name of ``scale_mode``.

  Returns:
    A [`QArray`][optax_q.QArray] whose [`dequantize`][optax_q.dequantize]
      approximates ``x``.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> q = optax_q.quantize(jnp.linspace(-1, 1, 256), 'int8')
    >>> q.codes.dtype, q.scale.shape
    (dtype('int8'), (2,))

  References:
    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022

    Li et al, [Memory Efficient Optimizers with 4-bit
    States](https://arxiv.org/abs/2309.01507), 2023
  """
  name, scale_mode = validation.renamed('scale', scale, 'scale_mode',
                                        scale_mode)
  fmt = formats_lib.check_format(fmt, 'fmt')
  scale_mode = validation.check_scale(
      default_scale_mode(fmt) if scale_mode is None else scale_mode, name)
  block_size = validation.check_block_size(block_size)
  validation.check_rounding(rounding)
  seed = validation.check_seed(seed, traced=True)
  step = validation.check_int(step, 'step', high=formats_lib.UINT32_MAX,
                               traced=True)
  stream = validation.check_int(stream, 'stream',
                                 high=formats_lib.UINT32_MAX)
  check_layout(fmt, scale_mode, name)
  try:
    array = jnp.asarray(x)
  except (TypeError, ValueError):
    array = None
  if array is None or jnp.issubdtype(array.dtype, jnp.complexfloating):
    raise ValueError('x must be an array of real numbers, got '
                     f'{type(x).__name__ if array is None else array.dtype}.')
  x = array
  check_layout(fmt, scale_mode, name, x.shape)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  key = None
  if rounding == 'stochastic':
    key = rounding_lib.stream_key(seed, step, stream)
  return encode(x, fmt, scale_mode=scale_mode, block_size=block_size, key=key)


def dequantize(q: QArray, dtype: Any = None) -> jax.Array:
  """Decodes a [`QArray`][optax_q.QArray] to its logical dtype (or ``dtype``).

  Args:
    q: The quantized array.
    dtype: A float dtype to decode to; None for ``q``'s logical dtype.

  Returns:
    The decoded array, of ``q``'s logical shape.

  Raises:
    ValueError: if ``q`` is not a [`QArray`][optax_q.QArray] or ``dtype`` is not
      a float dtype.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> x = jnp.array([0.5, -1.0, 2.0])
    >>> optax_q.dequantize(optax_q.quantize(x, 'bf16'))
    Array([ 0.5, -1. ,  2. ], dtype=float32)
  """
  if not is_qarray(q):
    raise ValueError(
        f'dequantize expects a QArray (q), got {type(q).__name__}.')
  if dtype is not None:
    try:
      floating = jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
    except TypeError:
      floating = False
    if not floating:
      raise ValueError("dtype must be None or a float dtype such as "
                       f"'float32' or 'bfloat16', got {dtype!r}.")
  return decode(q, dtype or q.dtype)


def unchanged_count(old: QArray, new: QArray) -> jax.Array:
  """How many elements kept their stored code between ``old`` and ``new``.

  Codes are compared as bit patterns (float codes too: -0 and +0 differ,
  NaN equals itself). Packed 4-bit codes are compared nibble by nibble on
  the packed bytes, without unpacking; the zero pad nibble of an odd last
  axis is discounted. Packed 3-bit codes are unpacked first. Returns a float32 scalar.
  """
  a, b = old.codes, new.codes
  if jnp.issubdtype(a.dtype, jnp.floating):
    uint = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[a.dtype.itemsize]
    a = jax.lax.bitcast_convert_type(a, uint)
    b = jax.lax.bitcast_convert_type(b, uint)
  if not old.size:
    return jnp.float32(0)
  if not old.shape:  # One element, whatever its packing.
    return jnp.all(a == b).astype(jnp.float32)
  if not old.fmt.packed:
    return jnp.sum(a == b, dtype=jnp.float32)
  if old.fmt.bits == 3:
    n = old.shape[-1]
    return jnp.sum(packing.unpack(a, n, 3) == packing.unpack(b, n, 3),
                   dtype=jnp.float32)
  diff = a ^ b
  same = (jnp.sum((diff & jnp.uint8(0x0F)) == 0, dtype=jnp.float32)
          + jnp.sum((diff >> 4) == 0, dtype=jnp.float32))
  pad = (old.shape[-1] % 2) * (old.size // old.shape[-1])
  return same - jnp.float32(pad)


def check_qarray(q: QArray) -> None:
  """Checks the layout invariants of ``q`` (skips non-array children)."""
  if not isinstance(q.codes, (jax.Array, np.ndarray)):
    return
  expected = q.shape
  if q.fmt.packed and (q.shape or q.fmt.bits == 3):
    expected = packing.packed_shape(q.shape or (1,), q.fmt.bits)
  if tuple(q.codes.shape) != tuple(expected):
    raise ValueError(f'codes shape {q.codes.shape} != expected {expected}.')
  if q.scale is not None:
    s = scale_shape(q.shape, q.scale_mode, q.block_size)
    if tuple(q.scale.shape) != s:
      raise ValueError(f'scale shape {q.scale.shape} != expected {s}.')
