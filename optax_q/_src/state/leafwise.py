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
time. Where the step is lowered for CPU, a large parameter is cut into
tiles of whole rows along its first axis, handled by a loop: decode the
tile's codes, run the inner update on the tile, encode, count unchanged
codes, write the new codes. Temporaries are one tile, and the tile stays
in cache between decode and encode. Lowered for a GPU or TPU, each
parameter is one call that the compiler fuses (`tiling.fused`).
Either way the new state is that of the whole-tree path (scale blocks lie along the last
axis, inside a row, and the stochastic-rounding bits are drawn at each
element's global index).

The loop writes only the new state. The update itself is computed outside
it, from the whole leaf's old state: it is elementwise, so the compiler
fuses it (decode, moments, update) into its consumer, typically
``optax.apply_updates``, as it fuses ``optax.adamw``'s chain, instead of
the loop writing a float32 update the size of the parameter.

This module says what each parameter's update is (decode, inner update,
encode, per tile); how it runs (how many tiles, a loop or a kernel, the CPU
fusion device) is the execution layer's `tiling.plan`.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
from jax import lax
from jax.extend import core as jax_core
import jax.numpy as jnp

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.execution import kernels
from optax_q._src.execution import tiling

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
             shared: list[Any] | None = None, barrier: bool = True,
             again: bool = False):
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
  compiled on its own needs none). ``again`` marks a second evaluation of
  the same call (for the block scales, `_param`): its barrier differs from
  the first's, so the compiler keeps the two apart.

  Returns:
    ``(update, new shaped-slot leaves, new shared slots)``.
  """
  if shared is None:
    shared = shared_slots(lay)
  if barrier:
    g, p, stored, shared, *_ = lax.optimization_barrier(
        (g, p, stored, shared) + ((jnp.int32(1),) if again else ()))
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


def _plan_of(lay: Layout, j: int, tile_size: int | None, *,
             track_stalls: bool, kernel: str) -> tiling.Plan:
  """How parameter ``j``'s update runs (`tiling.plan`).

  A tensor scale and column maxima need the whole leaf; unscaled codes
  (bf16) have no block maxima, and the compiler fuses their step without
  tiles: neither is tiled.
  """
  quantized = [x for _, x, _ in lay.entries(j) if qarray_lib.is_qarray(x)]
  codecs = [x.codec for x in quantized]
  return tiling.plan(
      tuple(lay.grads[j].shape), tile_size=tile_size,
      tileable=bool(codecs) and not any(c.needs_whole_leaf for c in codecs)
      and not all(c.unscaled for c in codecs),
      arrays=[lay.grads[j], lay.param(j)],
      scaled=any(x.scale is not None for x in quantized),
      byte_codes=any(jnp.dtype(x.codes.dtype).itemsize == 1
                     for x in quantized),
      track_stalls=track_stalls, kernel=kernel,
      kernel_ready=kernels.compiles(quantized, lay.grads[j].shape))


class _Run(NamedTuple):
  """One step's per-parameter machinery, shared by tiled and untiled leaves."""

  call: Callable[..., Any]  # ``isolated`` bound to the layout.
  key_for: Callable[[int], jax.Array | None]
  rounding_for: Callable[[int], str]
  track_stalls: bool

  def roundings(self, entries) -> list[str]:
    return [self.rounding_for(i) for _, _, i in entries]


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

  A parameter in one call is `isolated`, its new state encoded here (where
  its plan computes apart, the call's results and the blocks' scales are
  computed apart, as in the tiled loop); a large one goes by `_tiled`.

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
      ``'xla'`` and ``'auto'``, a loop over tiles (lowered for CPU) or one
      fused call (GPU, TPU); ``'pallas'``, one Pallas kernel (interpreted
      where the step is lowered for CPU; on a GPU where Triton lowers it,
      `tiling.for_gpu`; not with ``track_stalls``).

  Returns:
    ``(new_updates, new_inner_state, {flat index: stalled fraction})``, or
    None when the state is not laid out per parameter (see
    `plan_layout`) or holds only unscaled codes and nothing is tiled:
    the caller then takes the whole-tree path.
  """
  lay = plan_layout(updates, old, params)
  if lay is None:
    return None
  plans = [_plan_of(lay, j, tile_size, track_stalls=track_stalls,
                    kernel=kernel) for j in range(len(lay.grads))]
  if all(p.tiles == 1 for p in plans) and not any(
      map(_is_scaled, jax.tree.leaves(old, is_leaf=qarray_lib.is_qarray))):
    # Only unscaled codes (bf16, fp16) and nothing tiled: the whole-tree
    # path, whose arithmetic is Optax's own (``mu_format='bf16'`` is then
    # ``optax.adamw(mu_dtype=jnp.bfloat16)`` bit for bit). Such leaves are
    # never tiled, so tiled and untiled runs still agree.
    return None
  run = _Run(functools.partial(isolated, lay, inner_update, extra_args),
             key_for, rounding_for, track_stalls)
  results, stalled = {}, {}
  # Parameters that are not tiled first, then the large ones; each as its
  # plan asks on the platform the step is lowered for.
  for j in sorted(range(len(plans)), key=lambda j: plans[j].tiles != 1):
    results[j], stalled_j = tiling.per_platform(
        plans[j], functools.partial(_param, run, lay, j))
    stalled.update(stalled_j)
  return _reassemble(lay, results) + (stalled,)


def _param(run: _Run, lay: Layout, j: int, plan: tiling.Plan):
  """Parameter ``j``'s ``((update, new state leaves, shared outputs),
  {flat index: stalled fraction})``: one isolated call, or `_tiled`."""
  if plan.tiles != 1:
    return _tiled(run, lay, j, plan)
  stalled = {}
  entries = lay.entries(j)
  call = lambda again=False: run.call(  # noqa: E731
      lay.grads[j], lay.param(j), [x for _, x, _ in entries],
      run.roundings(entries), again=again)
  (u, shaped, rest), materialize = tiling.computed(call,
                                                   tiling.whole_token(plan))
  # Lowered for a GPU or TPU, the block scales are taken from a second
  # evaluation (`qarray.encode`'s ``scale_source``): the compiler then
  # reduces it without writing the new moments to memory (on an H100 it
  # wrote them in float32 beside their block maxima, and read them back to
  # encode them). On CPU, the values themselves; and where the inner update
  # has effects (a callback), which must happen once.
  sources = shaped
  if any(qarray_lib.is_qarray(x)
         and qarray_lib.reads_scale_source(x.fmt, x.scale_mode)
         for _, x, _ in entries):
    second = jax.make_jaxpr(lambda: call(again=True)[1])()
    if not second.effects:
      sources = lax.platform_dependent(
          shaped, cpu=lambda s: s,
          default=lambda _: jax_core.jaxpr_as_fun(second)())
  new = []
  for (_, x, i), n, source in zip(entries, shaped, sources):
    if qarray_lib.is_qarray(x):
      n = qarray_lib.encode_like(x, n, key=run.key_for(i),
                                 materialize=materialize, scale_source=source)
      if run.track_stalls:
        stalled[i] = stall(x, n)
    new.append(n)
  return (u, new, rest), stalled


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
  tile buffer (`tiling.computed`), before the block maxima, the infinity
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
  shaped, materialize = tiling.computed(
      lambda: run.call(g, p, stored, run.roundings(entries), **call_args)[1],
      row_offset if apart else None)
  outs, counts = [], []
  for (_, x, _), q_old, n, key in zip(entries, stored, shaped, keys):
    if not qarray_lib.is_qarray(x):
      outs.append(n)
      continue
    q = qarray_lib.encode_like(q_old, n, key=key, row_stride=row_stride,
                               row_offset=row_offset, materialize=materialize)
    outs.append((_to_bits(q.codes), q.scale))
    if run.track_stalls:
      counts.append(qarray_lib.unchanged_count(q_old, q))
  return outs, counts


def _tiled(run: _Run, lay: Layout, j: int, plan: tiling.Plan):
  """Parameter ``j`` in ``plan.tiles`` tiles of rows: by one kernel where
  the plan has it (`tiling.by_kernel`), else by a loop (`tiling.loop`).

  Returns ``((update, new state leaves, shared outputs), {flat index:
  stalled fraction})``, as `_param`. The update and the shared outputs (step
  counts) come from one more call of the inner update on the whole leaf,
  outside the loop, whose state outputs are dropped: it is elementwise, so
  the compiler fuses it into whatever consumes it (``apply_updates``)
  instead of the loop writing it out.

  In the kernel, tiles are contiguous blocks of rows (a grid cell each):
  the codes are those of the strided loop, as blocks lie inside rows and
  the rounding bits are drawn at global indices. Interpreted, the kernel's
  body is compiled with the rest of the step, so it keeps the isolation
  barrier and, on XLA:CPU, computes the new moments apart as the loop
  does; compiled on its own, it needs neither.
  """
  g, p, entries = lay.grads[j], lay.param(j), lay.entries(j)
  shape, tiles = tuple(g.shape), plan.tiles
  keys = [run.key_for(i) for _, _, i in entries]
  rows = shape[0] // tiles
  tile_shape = (rows,) + shape[1:]

  def kernel_step(t, src, read, shared):
    return _tile_state(
        run, entries, *read, src, tile_shape, shared[1], row_stride=1,
        row_offset=t * rows, shared=shared[0], barrier=plan.interpret,
        apart=plan.interpret and plan.apart)[0]

  bufs, counts = tiling.by_kernel(plan, kernel_step, (
      _sources(entries), (g, p), (shared_slots(lay), keys))), []
  if bufs is None:
    g_split = tiling.split(g, tiles)
    p_split = None if p is None else tiling.split(p, tiles)
    bufs, counts = tiling.loop(
        plan, lambda t, src: _tile_state(
            run, entries, tiling.take(g_split, t),
            None if p_split is None else tiling.take(p_split, t),
            jax.tree.map(lambda b: tiling.take(b, t), src), tile_shape, keys,
            row_stride=tiles, row_offset=t, apart=plan.apart),
        jax.tree.map(lambda b: tiling.split(b, tiles), _sources(entries)))
  u, _, rest = run.call(g, p, [x for _, x, _ in entries],
                        run.roundings(entries))
  shaped, count_it, stalled = [], iter(counts), {}
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
  return (u, shaped, rest), stalled
