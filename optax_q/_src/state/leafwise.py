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
import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
from jax import lax
import jax.numpy as jnp

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.execution import fusion
from optax_q._src.execution import kernels

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


def _is_scaled(x: Any) -> bool:
  return qarray_lib.is_qarray(x) and x.scale is not None


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where a state's parameter-shaped parts lie.

  Attributes:
    pdef: The parameters' tree structure.
    grads: The incoming updates, one leaf per parameter.
    params: The parameters' leaves, or None.
    slots: The state flattened down to its parameter-shaped subtrees; other
      slots are the leaves the parameters share (step counts).
    sdef: The structure of ``slots``.
    per_param: For each slot, its leaves by parameter, or None if shared.
    base: Flat index (QArrays as leaves) of each slot's first leaf.
  """

  pdef: Any
  grads: list[Any]
  params: list[Any] | None
  slots: list[Any]
  sdef: Any
  per_param: list[list[Any] | None]
  base: list[int]

  @property
  def shaped(self) -> list[int]:
    """The indices of the parameter-shaped slots."""
    return [k for k, leaves in enumerate(self.per_param) if leaves is not None]

  def entries(self, j: int) -> list[tuple[int, Any, int]]:
    """Parameter ``j``'s state leaves: ``(slot, leaf, flat index)``."""
    return [(k, self.per_param[k][j], self.base[k] + j) for k in self.shaped]

  def param(self, j: int) -> Any:
    return None if self.params is None else self.params[j]


def plan_layout(updates: Any, old: Any, params: Any) -> Layout | None:
  """The layout of ``old``, or None where the state is not per parameter.

  None when nothing is quantized, when there are no parameters, or when a
  quantized leaf lies outside every parameter-shaped subtree or holds its
  codes in a box (an ``nnx.Variable``).
  """
  pdef = jax.tree.structure(updates)
  grads = jax.tree.leaves(updates)
  stored = jax.tree.leaves(old, is_leaf=qarray_lib.is_qarray)
  if not grads or not any(map(qarray_lib.is_qarray, stored)):
    return None
  pshapes = [tuple(x.shape) for x in grads]

  def is_param_shaped(x):
    if x is None or _structure(x) != pdef:
      return False
    leaves = jax.tree.leaves(x, is_leaf=qarray_lib.is_qarray)
    return all(hasattr(a, 'shape') and tuple(a.shape) == s
               for a, s in zip(leaves, pshapes))

  slots, sdef = jax.tree.flatten(
      old, is_leaf=lambda x: qarray_lib.is_qarray(x) or is_param_shaped(x))
  per_param, base, offset = [], [], 0
  for slot in slots:
    leaves = jax.tree.leaves(slot, is_leaf=qarray_lib.is_qarray)
    shaped = is_param_shaped(slot)
    quantized = [a for a in leaves if qarray_lib.is_qarray(a)]
    if quantized and not shaped:
      return None
    if any(not isinstance(a.codes, jax.Array) for a in quantized):
      return None  # Codes in a box (an nnx.Variable): keep the whole path.
    per_param.append(leaves if shaped else None)
    base.append(offset)
    offset += len(leaves)
  plist = None if params is None else pdef.flatten_up_to(params)
  return Layout(pdef, grads, plist, slots, sdef, per_param, base)


def isolated(lay: Layout, inner_update: Callable[..., Any],
             extra_args: dict[str, Any], g, p, stored, roundings, *,
             shared: list[Any] | None = None, barrier: bool = True):
  """The inner update on one parameter (or tile), cut off from the rest.

  ``stored`` holds, per shaped slot, this parameter's stored state (a
  `QArray` or an array), decoded here with ``roundings``. The stored
  inputs, with the shared scalars of the state (step counts), pass through
  an optimization barrier tied to this parameter's gradient, so the
  compiler sees the same graph for a parameter whatever else the tree
  holds, how it is tiled or how it is partitioned: XLA rewrites arithmetic
  such as a division by a broadcast bias correction differently when the
  scalar is shared between leaves (Optax's own update of a leaf changes in
  its last bit with the other leaves of the tree), and contracts
  multiply-adds differently in differently compiled loop bodies. Per leaf,
  the update and the new state are the same bits tiled or not, sharded or
  not. The barrier stands before the decoding, so decoding still fuses
  into the update: no float32 copy of the state is written.

  ``shared`` replaces the shared slots (inside a kernel, which reads them
  from its inputs); ``barrier=False`` leaves the barrier out (a kernel body
  compiled on its own needs none).

  Returns:
    ``(update, new shaped-slot leaves, new shared slots)``.
  """
  if shared is None:
    shared = shared_slots(lay)
  if barrier:
    g, p, stored, shared = lax.optimization_barrier((g, p, stored, shared))
  values = [decode_for_inner(x, r) for x, r in zip(stored, roundings)]
  it_shared, it_values = iter(shared), iter(values)
  state = lay.sdef.unflatten([
      next(it_shared) if leaves is None else [next(it_values)]
      for leaves in lay.per_param])
  us, new = inner_update([g], state, None if p is None else [p], **extra_args)
  new_slots = lay.sdef.flatten_up_to(new)
  shaped = [s[0] for s, leaves in zip(new_slots, lay.per_param)
            if leaves is not None]
  rest = [s for s, leaves in zip(new_slots, lay.per_param) if leaves is None]
  return list(us)[0], shaped, rest


def shared_slots(lay: Layout) -> list[Any]:
  """The slots the parameters share (step counts), in order."""
  return [slot for slot, leaves in zip(lay.slots, lay.per_param)
          if leaves is None]


def _tiles_of(lay: Layout, j: int, tile_size: int | None) -> int:
  """How many tiles parameter ``j`` is updated in (1: one call)."""
  quantized = [x for _, x, _ in lay.entries(j) if qarray_lib.is_qarray(x)]
  if not quantized:
    return 1
  codecs = [x.codec for x in quantized]
  if (any(c.needs_whole_leaf for c in codecs)
      or all(c.unscaled for c in codecs)):
    # A tensor scale and column maxima need the whole leaf; unscaled codes
    # (bf16) have no block maxima, and the compiler fuses their step
    # without tiles.
    return 1
  if any(_explicitly_sharded(x) for x in (lay.grads[j], lay.param(j))
         if x is not None):
    return 1
  return num_tiles(tuple(lay.grads[j].shape), tile_size)


class _Run(NamedTuple):
  """One step's per-parameter machinery, shared by tiled and untiled leaves."""

  call: Callable[..., Any]  # ``isolated`` bound to the layout.
  key_for: Callable[[int], jax.Array | None]
  rounding_for: Callable[[int], str]
  track_stalls: bool
  kernel: str = 'xla'
  lowered: dict[Any, bool] | None = None  # ``'auto'``: kernels that lower.

  def roundings(self, entries) -> list[str]:
    return [self.rounding_for(i) for _, _, i in entries]


def _computes_apart(entries) -> bool:
  """Whether a parameter's update computes its new moments and block scales
  apart (`fusion.apart`): on XLA:CPU, with block-scaled codes, sharded or
  not (a sharded leaf on an Explicit mesh too, so that its bits are the
  unsharded run's)."""
  return fusion.on_cpu() and any(_is_scaled(x) for _, x, _ in entries)


def _untiled(run: _Run, lay: Layout, j: int, stalled: dict[int, Any]):
  """Parameter ``j`` in one isolated call; its new state is encoded here.

  Where `_computes_apart`, the call's results (the update and the new
  moments) and the blocks' scales are computed apart, as in the tiled loop.
  """
  entries = lay.entries(j)
  token = fusion.token() if _computes_apart(entries) else None
  call = lambda: run.call(  # noqa: E731
      lay.grads[j], lay.param(j), [x for _, x, _ in entries],
      run.roundings(entries))
  u, shaped, rest = call() if token is None else fusion.apart(call, token)
  new = []
  for (_, x, i), n in zip(entries, shaped):
    if qarray_lib.is_qarray(x):
      n = qarray_lib.encode_like(x, n, key=run.key_for(i),
                                 materialize=fusion.apart_with(token))
      if run.track_stalls:
        stalled[i] = stall(x, n)
    new.append(n)
  return u, new, rest


def update(
    inner_update: Callable[..., Any],
    updates: Any,
    old: Any,
    params: Any,
    extra_args: dict[str, Any],
    *,
    key_for: Callable[[int], jax.Array | None],
    rounding_for: Callable[[int], str],
    tile_size: int | None,
    track_stalls: bool,
    kernel: str = 'xla',
) -> tuple[Any, Any, dict[int, jax.Array]] | None:
  """The inner update, one parameter leaf (and tile) at a time.

  Args:
    inner_update: The inner transform's ``update`` (extra-args aware).
    updates: The incoming updates (the parameters' tree).
    old: The stored inner state (`QArray` leaves where quantized).
    params: The parameters, or None.
    extra_args: Passed to every call of ``inner_update``.
    key_for: Stochastic-rounding key of the quantized leaf at a flat index
      of ``old`` (flattened with QArrays as leaves), None for nearest.
    rounding_for: Rounding of the quantized leaf at a flat index.
    tile_size: Most elements per tile, or None for no tiling.
    track_stalls: Whether to count unchanged codes.
    kernel: How a tiled leaf's new state is made (``kernels.KERNELS``):
      ``'xla'``, a loop over tiles; ``'pallas'``, one Pallas kernel
      (interpreted where no accelerator compiles it; not with
      ``track_stalls``); ``'auto'``, Pallas on a GPU or TPU where the
      kernel lowers, else the loop.

  Returns:
    ``(new_updates, new_inner_state, {flat index: stalled fraction})``, or
    None when the state is not laid out per parameter (see
    `plan_layout`) or holds only unscaled codes and nothing is tiled:
    the caller then takes the whole-tree path.
  """
  lay = plan_layout(updates, old, params)
  if lay is None:
    return None
  tiles = [_tiles_of(lay, j, tile_size) for j in range(len(lay.grads))]
  if all(t == 1 for t in tiles) and not any(
      map(_is_scaled, jax.tree.leaves(old, is_leaf=qarray_lib.is_qarray))):
    # Only unscaled codes (bf16, fp16) and nothing tiled: the whole-tree
    # path, whose arithmetic is Optax's own (``mu_format='bf16'`` is then
    # ``optax.adamw(mu_dtype=jnp.bfloat16)`` bit for bit). Such leaves are
    # never tiled, so tiled and untiled runs still agree.
    return None
  run = _Run(functools.partial(isolated, lay, inner_update, extra_args),
             key_for, rounding_for, track_stalls, kernel, {})
  results, stalled = {}, {}
  # Parameters that are not tiled: one isolated call each; then the large
  # ones, one tiled loop each.
  for j in sorted(range(len(tiles)), key=lambda j: tiles[j] != 1):
    if tiles[j] == 1:
      results[j] = _untiled(run, lay, j, stalled)
    else:
      results[j] = _tiled(run, lay, j, tiles[j], stalled)
  return _reassemble(lay, results) + (stalled,)


def _reassemble(lay: Layout, results: dict[int, tuple[Any, list, list]]):
  """``(new updates, new state)`` from each parameter's results."""
  order = sorted(results)
  first = next(j for j in results)  # The shared outputs of the first call.
  rest_it = iter(results[first][2])
  by_slot = dict(zip(lay.shaped, zip(*(results[j][1] for j in order))))
  new_slots = [
      lay.pdef.unflatten(list(by_slot[k])) if lay.per_param[k] is not None
      else next(rest_it) for k in range(len(lay.slots))]
  return (lay.pdef.unflatten([results[j][0] for j in order]),
          lay.sdef.unflatten(new_slots))


def _split(x: jax.Array, tiles: int) -> jax.Array:
  """The ``(rows / tiles, tiles, ...)`` view whose axis 1 indexes tiles."""
  return x.reshape((x.shape[0] // tiles, tiles) + tuple(x.shape[1:]))


def _take(x: jax.Array, t) -> jax.Array:
  return lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)


def _sources(entries) -> list[Any]:
  """Per entry: the (codes bits, scales) of a QArray, else the array."""
  return [(_to_bits(x.codes), x.scale) if qarray_lib.is_qarray(x) else x
          for _, x, _ in entries]


def _tile_state(run: _Run, entries, g, p, src, tile_shape, keys, *,
                row_stride: int, row_offset, apart: bool = False,
                **call_args):
  """One tile's new state from its sources: decode, inner update, encode.

  ``src`` holds, per entry, the tile's (codes bits, scales) of a `QArray`,
  else its array; ``keys`` the entries' stochastic-rounding keys (None:
  nearest). The tile is rows ``row_offset, row_offset + row_stride, ...``
  of the leaf. With ``apart``, the new moments are computed once, into a
  tile buffer (see `fusion.apart`), before the block maxima, the infinity
  flags and the encoder read them, and so are the blocks' scales before
  the encoder reads them. Returns ``(outputs, unchanged counts)``.
  """
  stored = []
  for (_, x, _), old in zip(entries, src):
    if qarray_lib.is_qarray(x):
      codes, scale = old
      old = QArray(_from_bits(codes, x.codes.dtype), scale, x.fmt,
                   tile_shape, x.dtype, x.scale_mode, x.block_size)
    stored.append(old)
  inner = lambda: run.call(  # noqa: E731
      g, p, stored, run.roundings(entries), **call_args)[1]
  shaped = fusion.apart(inner, row_offset) if apart else inner()
  outs, counts = [], []
  for (_, x, _), q_old, n, key in zip(entries, stored, shaped, keys):
    if not qarray_lib.is_qarray(x):
      outs.append(n)
      continue
    q = qarray_lib.encode_like(q_old, n, key=key, row_stride=row_stride,
                               row_offset=row_offset,
                               materialize=fusion.apart_with(
                                   row_offset if apart else None))
    outs.append((_to_bits(q.codes), q.scale))
    if run.track_stalls:
      counts.append(qarray_lib.unchanged_count(q_old, q))
  return outs, counts


def _tile_step(run: _Run, entries, g_split, p_split, tiles: int,
               tile_shape, t, src):
  """Tile ``t`` of the strided split: ``(outputs, counts)``."""
  return _tile_state(
      run, entries, _take(g_split, t),
      None if p_split is None else _take(p_split, t),
      jax.tree.map(lambda b: _take(b, t), src), tile_shape,
      [run.key_for(i) for _, _, i in entries], row_stride=tiles,
      row_offset=t, apart=_computes_apart(entries))


def _tiled(run: _Run, lay: Layout, j: int, tiles: int,
           stalled: dict[int, Any]):
  """Parameter ``j`` in ``tiles`` tiles of rows, by a loop.

  Returns its update, new state leaves and the shared outputs, and records
  stalled fractions in ``stalled``. The update and the shared outputs (step
  counts) come from one more call of the inner update on the whole leaf,
  outside the loop, whose state outputs are dropped: it is elementwise, so
  the compiler fuses it into whatever consumes it (``apply_updates``)
  instead of the loop writing it out.
  """
  g, p, entries = lay.grads[j], lay.param(j), lay.entries(j)
  shape = tuple(g.shape)
  bufs, counts = None, []
  if run.kernel != 'xla' and not run.track_stalls:
    bufs = _tile_kernel(run, lay, entries, g, p, tiles,
                        required=run.kernel == 'pallas')
  if bufs is None:
    step = functools.partial(
        _tile_step, run, entries, _split(g, tiles),
        None if p is None else _split(p, tiles), tiles,
        (shape[0] // tiles,) + shape[1:])
    bufs, counts = _tile_loop(
        run, entries, step,
        jax.tree.map(lambda b: _split(b, tiles), _sources(entries)), tiles)
  u, _, rest = run.call(g, p, [x for _, x, _ in entries],
                        run.roundings(entries))
  shaped, count_it = [], iter(counts)
  for (_, x, i), buf in zip(entries, bufs):
    if not qarray_lib.is_qarray(x):
      shaped.append(buf.reshape(shape))
      continue
    codes, scale = buf
    shaped.append(QArray(
        _from_bits(codes.reshape(x.codes.shape), x.codes.dtype),
        None if scale is None else scale.reshape(x.scale.shape), x.fmt,
        x.shape, x.dtype, x.scale_mode, x.block_size))
    if run.track_stalls:
      stalled[i] = next(count_it) / jnp.float32(max(x.size, 1))
  return u, shaped, rest


def _tile_kernel(run: _Run, lay: Layout, entries, g, p, tiles: int, *,
                 required: bool):
  """The new state of a tiled leaf by one Pallas kernel (see `kernels`).

  Tiles are contiguous blocks of rows here (a grid cell each): the codes
  are those of the strided loop, as blocks lie inside rows and the
  rounding bits are drawn at global indices. Returns the entries' new
  (codes bits, scales) or arrays, or None where ``'auto'`` keeps the loop
  (no accelerator, a mesh, or a kernel that does not lower).
  """
  if not required and not kernels.accelerated():
    return None
  # Interpreted, the kernel's body is compiled with the rest of the step,
  # so it keeps the isolation barrier and, on XLA:CPU, computes the new
  # moments apart as the loop does; compiled on its own, it needs neither.
  interpret = kernels.interpret()
  rows = g.shape[0] // tiles
  tile_shape = (rows,) + tuple(g.shape[1:])
  keys = [run.key_for(i) for _, _, i in entries]
  args = (_sources(entries), (g, p), (shared_slots(lay), keys))

  def step(t, src, read, shared):
    outs, _ = _tile_state(
        run, entries, *read, src, tile_shape, shared[1], row_stride=1,
        row_offset=t * rows, shared=shared[0], barrier=interpret,
        apart=interpret and fusion.on_cpu())
    return outs

  run_kernel = functools.partial(kernels.tile_map, step, tiles=tiles,
                                 interpret_mode=interpret)
  if not required:
    # One compile per distinct kernel of the step: parameters of one
    # shape whose states have the same layout and rounding share it.
    signature = (tiles, tuple(run.roundings(entries)), tuple(
        (x.fmt, x.scale_mode, x.block_size, x.dtype)
        if qarray_lib.is_qarray(x) else None for _, x, _ in entries),
                 jax.tree.structure(args), tuple(
                     (jnp.shape(a), jnp.result_type(a))
                     for a in jax.tree.leaves(args)))
    if signature not in run.lowered:
      run.lowered[signature] = kernels.lowers(run_kernel, args)
    if not run.lowered[signature]:
      return None
  return run_kernel(*args)


def _tile_loop(run: _Run, entries, step, olds, tiles: int):
  """Runs ``step`` over the tiles: ``(new split buffers, unchanged counts)``.

  Without stall counts the loop carries the old state and overwrites it
  tile by tile (tile t is read before it is written, and by no other tile).
  The stall count reads the old tile once more, after the write, and the
  compiler would then copy the whole buffer on every iteration: with it,
  the loop reads the old state and fills separate buffers. (256-entry
  tables, int8_dynamic, once took separate buffers too: their gathers made
  the in-place loop up to 17% slower on XLA:CPU while each reader of the
  new moments recomputed them; computed apart, both ways time the same.)
  """
  out_shapes, count_shapes = jax.eval_shape(lambda: step(jnp.int32(0), olds))
  full = lambda s: jnp.zeros(  # noqa: E731
      (s.shape[0], tiles) + s.shape[1:], s.dtype)
  in_place = not run.track_stalls
  own_buffer = fusion.on_cpu() and any(
      qarray_lib.is_qarray(x) and jnp.dtype(x.codes.dtype).itemsize == 1
      for _, x, _ in entries)
  carry0 = (olds if in_place else jax.tree.map(full, out_shapes),
            [jnp.zeros((), jnp.float32) for _ in count_shapes])

  def body(t, carry):
    bufs, counts = carry
    src = bufs if in_place else olds
    if own_buffer:
      # The tile's new state computed into a buffer of its own, by fusions
      # the compiler runs on all cores, and copied into place; fused into
      # the in-place update it runs on one core (XLA:CPU does not split
      # in-place fusions). Measured side by side on one 2048 x 2048 leaf:
      # int4 19.6 -> 15.1 ms (nearest) and 22.9 -> 17.1 ms (stochastic);
      # with the block scales computed apart and the table search's
      # gather fused, fp8_e4m3 nearest 13.1 -> 11.5 ms (three runs, 10-12%
      # each) and int8_dynamic nearest 3-7% (two runs of three). Codes
      # stored in 16 bits (bf16, and the float grids simulated in bf16)
      # keep the in-place fusion.
      outs, new_counts = fusion.apart(lambda: step(t, src), t)
    else:
      outs, new_counts = step(t, src)
    bufs = jax.tree.map(
        lambda b, v: lax.dynamic_update_index_in_dim(
            b, v.astype(b.dtype), t, axis=1), bufs, outs)
    return bufs, [c + n for c, n in zip(counts, new_counts)]

  return lax.fori_loop(0, tiles, body, carry0)
