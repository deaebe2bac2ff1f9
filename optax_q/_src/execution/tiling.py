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
"""How one parameter's update is run: in one call, or in tiles of rows.

The leafwise pass of the state layer says *what* a parameter's update is:
decode its stored state, run the inner update, encode. This module says
*how* the machine computes it, and is the one place that knows:

- `plan`: one call, or tiles of whole rows along the first axis (how
  many); whether the CPU fusion device (`fusion.apart`) computes the new
  moments and the block scales into buffers of their own; whether a tiled
  leaf's tiles run as a loop or as one Pallas kernel. That is the plan
  for CPU; `for_gpu` gives a GPU's (one fused call, or the kernel compiled
  by Triton in programs of `GPU_BLOCK` elements) and `for_tpu` a TPU's
  (one fused call, `fused`, or the kernel compiled by Mosaic), and
  `per_platform` runs the one of the platform the step is lowered for
  (the fusion device decides by itself, `fusion.apart`).
- `computed`: a value computed as the plan asks, with the ``materialize``
  function the codec's encoder takes to match.
- `loop`: the tiles by a ``lax.fori_loop``, written in place or into
  buffers of their own.
- `by_kernel`: the tiles by one Pallas kernel (`kernels.tile_map`) where
  the plan has it.

In the loop, tile ``t`` of ``T`` holds rows ``t, t + T, t + 2T, ...``: its
slice is taken along a new unsharded axis of a ``(rows / T, T, ...)`` view
(`split`, `take`), so a leaf sharded along its first axis is tiled shard
by shard, without gathering. In the kernel a tile is a contiguous block of
rows (a grid cell).
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import math
from typing import Any

import jax
from jax import lax
from jax.extend import core as jax_core
import jax.numpy as jnp

from optax_q._src.core import explicit
from optax_q._src.execution import fusion
from optax_q._src.execution import kernels


@dataclasses.dataclass(frozen=True)
class Plan:
  """How one parameter's update is computed.

  Attributes:
    tiles: Tiles of rows along the first axis (1: one call).
    apart: Compute the new state and the block scales with the CPU fusion
      device (`fusion.apart`).
    in_place: The tile loop overwrites the old state (else it reads the old
      state and fills buffers of its own, as a stall count reads the old
      tile after the write).
    own_buffer: Each tile's new state is computed into a buffer of its own
      and then copied into place (XLA:CPU runs in-place fusions on one
      core; see the performance page).
    kernel: ``'xla'`` (the loop) or ``'pallas'`` (one kernel).
    interpret: Whether the kernel runs interpreted (lowered for CPU).
    gpu_tiles: Tiles of the kernel where the step is lowered for a GPU
      (`for_gpu`), each a Triton program of at most `GPU_BLOCK` elements;
      0 where the leaf takes the XLA path there.
    tpu_kernel: Whether the kernel is compiled where the step is lowered
      for a TPU (`for_tpu`; else the XLA path there).
    triton: Whether the kernel is compiled by Pallas' Triton backend.
  """

  tiles: int
  apart: bool
  in_place: bool = True
  own_buffer: bool = False
  kernel: str = 'xla'
  interpret: bool = True
  gpu_tiles: int = 0
  tpu_kernel: bool = False
  triton: bool = False


GPU_BLOCK = 4096
"""Elements a GPU kernel program takes at most (whole rows of a leaf, a
power of two: Triton's blocks are), unless one row is longer: up to
`GPU_ROW_MAX`."""

GPU_ROW_MAX = 16384
"""The longest row a GPU kernel program takes whole."""


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


def explicitly_sharded(x: Any) -> bool:
  """Whether ``x`` is traced with a sharding spelled out in its type."""
  try:
    spec = jax.typeof(x).sharding.spec
  except Exception:  # pylint: disable=broad-except
    return False
  return any(s is not None for s in spec)


def plan(shape: tuple[int, ...], *, tile_size: int | None, tileable: bool,
         arrays: list[Any], scaled: bool, byte_codes: bool,
         track_stalls: bool, kernel: str, kernel_ready: bool = False
         ) -> Plan:
  """The plan of one parameter's update as lowered for CPU.

  `per_platform` runs it for CPU, its `for_gpu` twin for a GPU and its
  `for_tpu` twin for a TPU: which one a step takes is decided by
  the platform the step is lowered for, not by the machine that traces it.

  Args:
    shape: The parameter's shape.
    tile_size: Most elements per tile, or None for no tiling.
    tileable: Whether its stored state may be encoded tile by tile (no
      scale needs the whole leaf, and some codes have block scales).
    arrays: The parameter's gradient and value: a leaf whose sharding is
      spelled out in its type (an Explicit mesh) is not tiled.
    scaled: Whether some of its stored state has block scales (on XLA:CPU
      their new values and scales are then computed apart).
    byte_codes: Whether some of its codes are one byte wide.
    track_stalls: Whether unchanged codes are counted (the loop then keeps
      the old state; no kernel).
    kernel: ``'xla'``, ``'pallas'`` or ``'auto'`` (`kernels.KERNELS`).
    kernel_ready: Whether its stored state's kernel lowers with Pallas'
      Triton and Mosaic TPU backends (`kernels.compiles`).
  """
  tiles, gpu_tiles, tpu_kernel = 1, 0, False
  if tileable and not any(explicitly_sharded(x) for x in arrays
                          if x is not None):
    tiles = num_tiles(shape, tile_size)
    rows, cols = shape if len(shape) == 2 else (0, 0)
    asked = (kernel == 'pallas' and not track_stalls and kernel_ready
             and tile_size is not None and rows > 0)
    # Triton's blocks: whole rows of a power of two, GPU_BLOCK elements.
    per_program = max(1, GPU_BLOCK // max(cols, 1))
    if (asked and 0 < cols <= GPU_ROW_MAX and cols & (cols - 1) == 0
        and rows % per_program == 0 and rows > per_program):
      gpu_tiles = rows // per_program
    # Mosaic's: the last two axes in multiples of (8, 128).
    tpu_kernel = asked and tiles > 1 and (rows // tiles) % 8 == 0 and (
        cols % 128 == 0)
  use_kernel = kernel == 'pallas' and not track_stalls and tiles > 1
  return Plan(tiles=tiles, apart=scaled, in_place=not track_stalls,
              own_buffer=byte_codes, kernel='pallas' if use_kernel else 'xla',
              interpret=True, gpu_tiles=gpu_tiles, tpu_kernel=tpu_kernel)


def fused(p: Plan) -> Plan:
  """``p`` on the XLA path as lowered for a GPU or TPU: one call per
  parameter.

  No tiles: the compiler fuses a leaf's decode, inner update, block maxima
  and encode into a few kernels over the whole leaf, where a loop over
  tiles would launch them once per tile (on an H100, a 302M-parameter tree
  in tiles of 2^18 elements ran at 4.7x the float32 step). A one-call plan
  is the CPU's own (the fusion device lowers to nothing there,
  `fusion.apart`).
  """
  if p.tiles == 1 and p.kernel == 'xla':
    return p
  return dataclasses.replace(p, tiles=1, apart=False, own_buffer=False,
                             kernel='xla')


def for_tpu(p: Plan) -> Plan:
  """``p`` as lowered for a TPU: the kernel asked for, compiled by Mosaic
  where its formats and tiles lower (``tpu_kernel``), else `fused`."""
  if p.kernel == 'pallas' and p.tpu_kernel:
    return dataclasses.replace(p, interpret=False)
  return fused(p)


def for_gpu(p: Plan) -> Plan:
  """``p`` as lowered for a GPU (CUDA).

  Where the kernel was asked for and lowers with Triton (``gpu_tiles``),
  the kernel compiled by Triton, one program per `GPU_BLOCK` elements of
  whole rows; elsewhere `fused` (a kernel that Triton does not lower, or
  whose blocks it would refuse, is not tried).

  Args:
    p: A plan of `plan` (for CPU).

  Returns:
    The plan for a GPU.
  """
  if p.gpu_tiles > 1:
    return dataclasses.replace(p, tiles=p.gpu_tiles, apart=False,
                               own_buffer=False, kernel='pallas',
                               interpret=False, triton=True)
  return fused(p)


def per_platform(p: Plan, fn: Callable[[Plan], Any]) -> Any:
  """``fn(p)`` where the step is lowered for CPU, ``fn(for_gpu(p))`` for
  CUDA, ``fn(for_tpu(p))`` for TPU, and ``fn(fused(p))`` elsewhere.

  Args:
    p: A plan of `plan` (for CPU).
    fn: Computes a parameter's update as a plan asks.

  Returns:
    ``fn(p)`` itself where the plans are all the same; else
    `lax.platform_dependent`'s choice (each branch is traced, and the
    lowering keeps the one of its platform).
  """
  xla, gpu, tpu = fused(p), for_gpu(p), for_tpu(p)
  if p == xla == gpu == tpu:
    return fn(p)
  branches = dict(cpu=lambda: fn(p), default=lambda: fn(xla))
  if gpu != xla:
    branches['cuda'] = lambda: fn(gpu)
  if tpu != xla:
    branches['tpu'] = lambda: fn(tpu)
  return lax.platform_dependent(**branches)


def computed(fn: Callable[[], Any], token: jax.Array | None):
  """``fn()``, apart where ``token`` is given (`fusion.apart`).

  Returns:
    ``(fn(), materialize)``: the value, and the ``materialize`` argument
    of the codec's encoder that computes its block scales the same way.
  """
  value = fn() if token is None else fusion.apart(fn, token)
  return value, fusion.apart_with(token)


def whole_token(p: Plan) -> jax.Array | None:
  """The token of a one-call update (`computed`): None without `apart`."""
  return fusion.token() if p.apart else None


def split(x: jax.Array, tiles: int) -> jax.Array:
  """The ``(rows / tiles, tiles, ...)`` view whose axis 1 indexes tiles."""
  return x.reshape((x.shape[0] // tiles, tiles) + tuple(x.shape[1:]))


def take(x: jax.Array, t) -> jax.Array:
  """Tile ``t`` of a `split` view."""
  return lax.dynamic_index_in_dim(x, t, axis=1, keepdims=False)


def loop(p: Plan, step: Callable[[jax.Array, Any], Any], olds: Any):
  """Runs ``step`` over the tiles: ``(new split buffers, summed counts)``.

  ``step(t, src)`` returns tile ``t``'s ``(outputs, counts)``, its outputs
  of the structure of ``olds`` (`split` views). In place, the loop carries
  the old state and overwrites it tile by tile (tile t is read before it is
  written, and by no other tile). A stall count reads the old tile once
  more, after the write, and the compiler would then copy the whole buffer
  on every iteration: without ``in_place`` the loop reads the old state and
  fills separate buffers.
  """
  # Traced once; the loop's body replays the traced program.
  closed, (out_shapes, count_shapes) = jax.make_jaxpr(
      step, return_shape=True)(jnp.int32(0), olds)
  out_tree = jax.tree.structure((out_shapes, count_shapes))
  step = lambda t, src: jax.tree.unflatten(  # noqa: E731
      out_tree, jax_core.jaxpr_as_fun(closed)(t, *jax.tree.leaves(src)))
  full = lambda s: jnp.zeros(  # noqa: E731
      (s.shape[0], p.tiles) + s.shape[1:], s.dtype)
  carry0 = (olds if p.in_place else jax.tree.map(full, out_shapes),
            [jnp.zeros((), jnp.float32) for _ in count_shapes])
  # Under shard_map the new tiles may vary over manual axes the old state
  # (initialized per shard, say) does not: the carry starts as they end.
  carry0 = jax.tree.unflatten(jax.tree.structure(carry0), [
      explicit.vary_like(x, a) for x, a in zip(jax.tree.leaves(carry0),
                                               closed.out_avals)])

  def body(t, carry):
    bufs, counts = carry
    src = bufs if p.in_place else olds
    if p.own_buffer:
      # Computed by fusions the compiler runs on all cores, then copied
      # into place; fused into the in-place update it runs on one core.
      outs, new_counts = fusion.apart(lambda: step(t, src), t)
    else:
      outs, new_counts = step(t, src)
    bufs = jax.tree.map(
        lambda b, v: lax.dynamic_update_index_in_dim(
            b, v.astype(b.dtype), t, axis=1), bufs, outs)
    return bufs, [c + n for c, n in zip(counts, new_counts)]

  return lax.fori_loop(0, p.tiles, body, carry0)


def by_kernel(p: Plan, step: Callable[..., Any], args: tuple[Any, Any, Any]):
  """The tiles by one Pallas kernel, or None where the plan keeps the loop.

  Args:
    p: The plan.
    step: ``step(t, carried_tile, read_tile, shared)``, as for
      `kernels.tile_map`.
    args: ``(carried, read, shared)`` of `kernels.tile_map`.

  Returns:
    The new ``carried``, or None (the plan's kernel is ``'xla'``).
  """
  if p.kernel != 'pallas':
    return None
  return kernels.tile_map(step, *args, tiles=p.tiles,
                          interpret_mode=p.interpret, triton=p.triton)
