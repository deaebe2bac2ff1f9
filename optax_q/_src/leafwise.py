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
"""One pass per parameter leaf: the fused update of ``quantize_state``.

Decoding every moment, running the inner update on the whole tree and
encoding every moment leaves the compiler a graph in which each new moment
has several readers (the update, the block maxima, the encoder, the stall
count), so it is written out in float32: the compiled step then holds the
whole state in float32 as temporaries, more than the quantized state saves.

When the inner transform is elementwise (each parameter's new state and
update depend only on that parameter's gradient, state and value, and on
shared scalars such as a step count), the update runs one parameter at a
time, and a large parameter is cut into tiles of whole rows along its first
axis, handled by a loop: decode the tile's codes, run the inner update on
the tile, encode, count unchanged codes, write the new codes. Temporaries
are one tile, the tile stays in cache between decode and encode, and the
new state is that of the whole-tree path (scale blocks lie along the last
axis, inside a row, and the stochastic-rounding bits are drawn at each
element's global index).

The loop writes only the new state. The update itself is computed outside
it, from the whole leaf's old state: it is elementwise, so the compiler
fuses it (decode, moments, update) into its consumer, typically
``optax.apply_updates``, as it fuses ``optax.adamw``'s chain, instead of
the loop writing a float32 update the size of the parameter.

Tile ``t`` of ``T`` holds rows ``t, t + T, t + 2T, ...``: its slice is taken
along a new unsharded axis of a ``(rows / T, T, ...)`` view, so a leaf
sharded along its first axis is tiled shard by shard, without gathering.
"""

from __future__ import annotations

from collections.abc import Callable
import math
from typing import Any

import jax
from jax import lax
import jax.numpy as jnp

from optax_q._src import qarray as qarray_lib
from optax_q._src import rounding as rounding_lib

QArray = qarray_lib.QArray


def passthrough(q: QArray, rounding: str) -> bool:
  """Whether the inner update sees the stored array itself.

  Unscaled formats whose codes are a native float dtype (``bf16``,
  ``fp16``) are handed to the inner transform as they are stored when
  rounding to nearest: the arithmetic then promotes exactly as Optax's own
  ``mu_dtype`` does, so ``mu_format='bf16'`` matches
  ``optax.adamw(mu_dtype=jnp.bfloat16)`` bit for bit. Everything else is
  decoded to float32.
  """
  return (rounding == 'nearest' and q.scale is None
          and q.fmt.kind == 'float' and q.fmt.bits >= 16)


def decode_for_inner(x: Any, rounding: str) -> Any:
  """What the inner transform sees for a stored leaf ``x``."""
  if not qarray_lib.is_qarray(x):
    return x
  if passthrough(x, rounding):
    return x.codes.reshape(x.shape)
  return qarray_lib.decode(x, jnp.float32)


def stall(old: QArray, new: QArray) -> jax.Array:
  """Fraction of elements whose stored code did not change."""
  if old.size == 0:
    return jnp.zeros((), jnp.float32)
  return qarray_lib.unchanged_count(old, new) / jnp.float32(old.size)


def num_tiles(shape: tuple[int, ...], tile_size: int | None) -> int:
  """Tiles along the first axis for a leaf of ``shape`` (1: no loop).

  The smallest divisor ``T`` of ``shape[0]`` that brings a tile to at most
  ``tile_size`` elements (``shape[0]`` itself if none does).
  """
  size = math.prod(shape)
  if tile_size is None or len(shape) < 2 or size <= tile_size:
    return 1
  rows = shape[0]
  for t in range(2, rows + 1):
    if rows % t == 0 and -(-size // t) <= tile_size:
      return t
  return rows


def _explicitly_sharded(x: Any) -> bool:
  """Whether ``x`` is traced with a sharding spelled out in its type."""
  try:
    spec = jax.typeof(x).sharding.spec
  except Exception:  # pylint: disable=broad-except
    return False
  return any(s is not None for s in spec)


def _to_bits(codes: jax.Array) -> jax.Array:
  """Float codes as unsigned bits (a loop updates those in place)."""
  if jnp.issubdtype(codes.dtype, jnp.floating):
    uint = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[codes.dtype.itemsize]
    return lax.bitcast_convert_type(codes, uint)
  return codes


def _from_bits(bits: jax.Array, dtype) -> jax.Array:
  if bits.dtype != dtype:
    return lax.bitcast_convert_type(bits, dtype)
  return bits


def _structure(x):
  return jax.tree.structure(x, is_leaf=qarray_lib.is_qarray)


def update(
    inner_update: Callable[..., Any],
    updates: Any,
    old: Any,
    params: Any,
    extra_args: dict[str, Any],
    *,
    key_for: Callable[[int], jax.Array | None],
    rounding_for: Callable[[int], str],
    block_size: int,
    tile_size: int | None,
    track_stalls: bool,
) -> tuple[Any, Any, dict[int, jax.Array]] | None:
  """The inner update, one parameter leaf (and tile) at a time.

  Args:
    inner_update: The inner transform's ``update`` (extra-args aware).
    updates: The incoming updates (the parameters' tree).
    old: The stored inner state (:class:`QArray` leaves where quantized).
    params: The parameters, or None.
    extra_args: Passed to every call of ``inner_update``.
    key_for: Stochastic-rounding key of the quantized leaf at a flat index
      of ``old`` (flattened with QArrays as leaves), None for nearest.
    rounding_for: Rounding of the quantized leaf at a flat index.
    block_size: Default block size for encoding.
    tile_size: Most elements per tile, or None for no tiling.
    track_stalls: Whether to count unchanged codes.

  Returns:
    ``(new_updates, new_inner_state, {flat index: stalled fraction})``, or
    None when the state is not laid out per parameter (a quantized leaf
    outside a subtree shaped like the parameters, boxed codes, no
    parameters): the caller then takes the whole-tree path.
  """
  pdef = jax.tree.structure(updates)
  pleaves = jax.tree.leaves(updates)
  if not pleaves:
    return None
  pshapes = [tuple(x.shape) for x in pleaves]
  plist = None if params is None else pdef.flatten_up_to(params)

  def is_param_shaped(x):
    if x is None or _structure(x) != pdef:
      return False
    leaves = jax.tree.leaves(x, is_leaf=qarray_lib.is_qarray)
    return all(hasattr(a, 'shape') and tuple(a.shape) == s
               for a, s in zip(leaves, pshapes))

  if not any(qarray_lib.is_qarray(x) for x in jax.tree.leaves(
      old, is_leaf=qarray_lib.is_qarray)):
    return None  # Nothing quantized: the inner update as it is.
  slots, sdef = jax.tree.flatten(
      old, is_leaf=lambda x: qarray_lib.is_qarray(x) or is_param_shaped(x))
  per_param = []  # For each slot: its leaves by parameter, or None.
  base = []  # Flat index (QArrays as leaves) of each slot's first leaf.
  offset = 0
  for slot in slots:
    leaves = jax.tree.leaves(slot, is_leaf=qarray_lib.is_qarray)
    shaped = is_param_shaped(slot)
    if not shaped and any(qarray_lib.is_qarray(a) for a in leaves):
      return None
    if shaped and any(
        qarray_lib.is_qarray(a) and not isinstance(a.codes, jax.Array)
        for a in leaves):
      return None  # Codes in a box (an nnx.Variable): keep the whole path.
    per_param.append(leaves if shaped else None)
    base.append(offset)
    offset += len(leaves)

  def isolated(g, p, stored, roundings):
    """The inner update on one parameter (or tile), cut off from the rest.

    ``stored`` holds, per shaped slot, this parameter's stored state (a
    :class:`QArray` or an array), decoded here with ``roundings``. The
    stored inputs, with the shared scalars of the state (step counts), pass
    through an optimization barrier tied to this parameter's gradient, so
    the compiler sees the same graph for a parameter whatever else the tree
    holds, how it is tiled or how it is partitioned: XLA rewrites arithmetic
    such as a division by a broadcast bias correction differently when the
    scalar is shared between leaves (Optax's own update of a leaf changes in
    its last bit with the other leaves of the tree), and contracts
    multiply-adds differently in differently compiled loop bodies. Per
    leaf, the update and the new state are the same bits tiled or not,
    sharded or not. The barrier stands before the decoding, so decoding
    still fuses into the update: no float32 copy of the state is written.
    """
    shared = [slot for slot, leaves in zip(slots, per_param)
              if leaves is None]
    g, p, stored, shared = lax.optimization_barrier((g, p, stored, shared))
    values = [decode_for_inner(x, r) for x, r in zip(stored, roundings)]
    it_shared, it_values = iter(shared), iter(values)
    state = sdef.unflatten([
        next(it_shared) if leaves is None else [next(it_values)]
        for leaves in per_param])
    us, new = inner_update([g], state, None if p is None else [p],
                           **extra_args)
    new_slots = sdef.flatten_up_to(new)
    shaped = [s[0] for s, leaves in zip(new_slots, per_param)
              if leaves is not None]
    rest = [s for s, leaves in zip(new_slots, per_param) if leaves is None]
    return list(us)[0], shaped, rest

  shaped_slots = [k for k, leaves in enumerate(per_param) if leaves is not None]

  def entries_of(j):
    return [(k, per_param[k][j], base[k] + j) for k in shaped_slots]

  def tiles_of(j):
    entries = entries_of(j)
    if not any(qarray_lib.is_qarray(x) for _, x, _ in entries):
      return 1
    modes = {x.scale_mode for _, x, _ in entries if qarray_lib.is_qarray(x)}
    if 'tensor' in modes or modes == {'none'}:
      # A tensor scale needs the whole leaf; unscaled codes (bf16) have no
      # block maxima, and the compiler fuses their step without tiles.
      return 1
    if any(_explicitly_sharded(x) for x in (pleaves[j], None if plist is None
                                            else plist[j]) if x is not None):
      return 1
    return num_tiles(pshapes[j], tile_size)

  tiles = [tiles_of(j) for j in range(len(pleaves))]
  if all(t == 1 for t in tiles) and not any(
      qarray_lib.is_qarray(x) and x.scale is not None
      for x in jax.tree.leaves(old, is_leaf=qarray_lib.is_qarray)):
    # Only unscaled codes (bf16, fp16) and nothing tiled: the whole-tree
    # path, whose arithmetic is Optax's own (``mu_format='bf16'`` is then
    # ``optax.adamw(mu_dtype=jnp.bfloat16)`` bit for bit). Such leaves are
    # never tiled, so tiled and untiled runs still agree.
    return None

  new_leaves = [[None] * len(pleaves) if leaves is not None else None
                for leaves in per_param]
  new_updates = [None] * len(pleaves)
  stalled = {}
  rest_out = None
  # Parameters that are not tiled: one isolated call each.
  for j, t in enumerate(tiles):
    if t != 1:
      continue
    entries = entries_of(j)
    u, shaped, rest = isolated(
        pleaves[j], None if plist is None else plist[j],
        [x for _, x, _ in entries], [rounding_for(i) for _, _, i in entries])
    new_updates[j] = u
    if rest_out is None:
      rest_out = rest
    for (k, x, i), n in zip(entries, shaped):
      if qarray_lib.is_qarray(x):
        n = qarray_lib.encode(
            jnp.asarray(n, jnp.float32), x.fmt, scale_mode=x.scale_mode,
            block_size=x.block_size or block_size, key=key_for(i),
            dtype=x.dtype)
        if track_stalls:
          stalled[i] = stall(x, n)
      new_leaves[k][j] = n
  # Large parameters: one tiled loop each.
  for j, t in enumerate(tiles):
    if t == 1:
      continue
    p = None if plist is None else plist[j]
    entries = entries_of(j)
    u, shaped, rest = _tiled(
        isolated, pleaves[j], p, entries, t, key_for=key_for,
        rounding_for=rounding_for, block_size=block_size,
        track_stalls=track_stalls, stalled=stalled)
    for (k, _, _), n in zip(entries, shaped):
      new_leaves[k][j] = n
    new_updates[j] = u
    if rest_out is None:
      rest_out = rest

  rest_it = iter(rest_out)
  new_slots = [
      pdef.unflatten(new_leaves[k]) if per_param[k] is not None
      else next(rest_it) for k in range(len(slots))]
  return pdef.unflatten(new_updates), sdef.unflatten(new_slots), stalled


def _tiled(isolated, g, p, entries, tiles, *, key_for, rounding_for,
           block_size, track_stalls, stalled):
  """One parameter in ``tiles`` tiles of rows, by a loop.

  ``entries`` are its state leaves ``(slot, leaf, flat index)``; returns its
  update, new state leaves and the shared outputs, and records stalled
  fractions in ``stalled``. The new state overwrites the old one tile by
  tile, in place, unless stalls are counted (see the loop). The update and
  the shared outputs (step counts) come from one more call of the inner
  update on the whole leaf, outside the loop, whose state outputs are
  dropped.
  """
  shape = tuple(g.shape)
  rows = shape[0] // tiles
  tile_shape = (rows,) + shape[1:]

  def split(x):
    return x.reshape((rows, tiles) + tuple(x.shape[1:]))

  def take(x, t):
    return lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)

  def put(x, v, t):
    return lax.dynamic_update_index_in_dim(x, v, t, axis=1)

  g_split = split(g)
  p_split = None if p is None else split(p)
  olds = []  # Per entry: (codes bits, scales) of a QArray, else the array.
  for _, x, _ in entries:
    if qarray_lib.is_qarray(x):
      olds.append((split(_to_bits(x.codes)),
                   None if x.scale is None else split(x.scale)))
    else:
      olds.append(split(x))

  def tile_step(t, src):
    src = jax.tree.map(lambda b: take(b, t), src)
    stored, old_q = [], []
    for (_, x, _), old in zip(entries, src):
      if qarray_lib.is_qarray(x):
        codes, scale = old
        q = QArray(_from_bits(codes, x.codes.dtype), scale, x.fmt,
                   tile_shape, x.dtype, x.scale_mode, x.block_size)
        stored.append(q)
        old_q.append(q)
      else:
        stored.append(old)
        old_q.append(None)
    _, shaped, _ = isolated(
        take(g_split, t), None if p_split is None else take(p_split, t),
        stored, [rounding_for(i) for _, _, i in entries])
    outs, counts = [], []
    for (_, x, i), q_old, n in zip(entries, old_q, shaped):
      if q_old is None:
        outs.append(n)
        continue
      q = qarray_lib.encode(
          jnp.asarray(n, jnp.float32), x.fmt, scale_mode=x.scale_mode,
          block_size=x.block_size or block_size, key=key_for(i),
          dtype=x.dtype, row_stride=tiles, row_offset=t)
      outs.append((_to_bits(q.codes), q.scale))
      if track_stalls:
        counts.append(qarray_lib.unchanged_count(q_old, q))
    return outs, counts

  # The new state, written tile by tile, and the unchanged-code counts.
  # Without stall counts the loop carries the old state and overwrites it
  # tile by tile (tile t is read before it is written, and by no other
  # tile). The stall count reads the old tile once more, after the write,
  # and the compiler would then copy the whole buffer on every iteration:
  # with it, the loop reads the old state and fills separate buffers. So it
  # does for 256-entry tables (int8_dynamic), whose gathers made the
  # in-place loop up to 17% slower on XLA:CPU, measured side by side (fp8,
  # int4 and fp4 steps were 1-18% faster in place, with less memory).
  out_shapes, count_shapes = jax.eval_shape(
      lambda: tile_step(jnp.int32(0), olds))
  full = lambda s: jnp.zeros((rows, tiles) + s.shape[1:], s.dtype)  # noqa: E731
  in_place = not track_stalls and not any(
      qarray_lib.is_qarray(x) and rounding_lib.bucketed(x.fmt.table)
      for _, x, _ in entries)
  carry0 = (olds if in_place else jax.tree.map(full, out_shapes),
            [jnp.zeros((), jnp.float32) for _ in count_shapes])

  def body(t, carry):
    bufs, counts = carry
    outs, new_counts = tile_step(t, bufs if in_place else olds)
    bufs = jax.tree.map(lambda b, v: put(b, v.astype(b.dtype), t), bufs, outs)
    counts = [c + n for c, n in zip(counts, new_counts)]
    return bufs, counts

  bufs, counts = lax.fori_loop(0, tiles, body, carry0)

  # The update, from the whole leaf's old state: elementwise, so the
  # compiler fuses it into whatever consumes it (``apply_updates``) instead
  # of the loop writing it out; the inner update's state outputs are unused
  # here, and dropped.
  u, _, rest = isolated(g, p, [x for _, x, _ in entries],
                        [rounding_for(i) for _, _, i in entries])

  shaped, count_it = [], iter(counts)
  for (_, x, i), buf in zip(entries, bufs):
    if qarray_lib.is_qarray(x):
      codes, scale = buf
      shaped.append(QArray(
          _from_bits(codes.reshape(x.codes.shape), x.codes.dtype),
          None if scale is None else scale.reshape(x.scale.shape), x.fmt,
          x.shape, x.dtype, x.scale_mode, x.block_size))
      if track_stalls:
        stalled[i] = next(count_it) / jnp.float32(max(x.size, 1))
    else:
      shaped.append(buf.reshape(shape))
  return u, shaped, rest
