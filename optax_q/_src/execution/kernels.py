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
"""The tile pass of the leafwise update as one Pallas kernel.

`tile_map` runs a step over contiguous tiles of rows, one kernel instance
per tile (a Pallas grid): each instance loads its tile of every input,
computes the tile's outputs and writes them to outputs aliased to its
inputs (the codes and scales; where the step still reads the old ones
afterwards, for the update, the compiler copies them first). The step is
the leafwise pass's own (decode, the inner update, block maxima, encode:
the codecs of ``qarray``), traced into the kernel body, so the kernel
holds no second copy of any codec. Interpreted (on CPU, where the tests
compare them bit for bit) its codes are the XLA loop's.

On GPU (Triton) and TPU (Mosaic) the whole step of a tile is one kernel:
the moments decoded, updated, reduced to their block maxima and encoded in
registers and on-chip memory, once. Lowered for a GPU, a tile is a few
thousand elements of whole rows (`tiling.for_gpu`), and only the formats
whose step Triton lowers take it (one-byte float and integer grids with
block scales, rows of a power of two; the dynamic map's lookup and packed
4-bit codes it refuses); lowered for a TPU, the CPU's tiles, compiled by
Mosaic. On an H100 and an H200, before its blocks were cut to a GPU
program's size and its rounding and flags written with operations Triton
has, Triton refused the kernel for every format family (the performance
page's GPU section). Its run on a GPU is not verified yet, so the kernel
runs only where it is asked for (``kernel='pallas'``); ``'auto'``, the
default, takes the XLA path on every platform until it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax import lax
from jax.experimental import pallas as pl
from jax.extend import core as jax_core
from jax.extend.core import primitives
import jax.numpy as jnp

KERNELS = ('auto', 'xla', 'pallas')
"""The values of ``kernel``: ``'xla'`` (what the compiler fuses),
``'pallas'`` (one Pallas kernel per tiled leaf; interpreted where the step
is lowered for CPU, for tests; by Triton on a GPU where it lowers, else the
XLA path there; by Mosaic on a TPU) and ``'auto'`` (the kernel where its
run is verified for the platform: at present none, so XLA)."""


def compiles(stored: list[Any], shape: tuple[int, ...]) -> bool:
  """Whether the tile kernel of a leaf of ``shape`` holding ``stored``
  (`QArray` leaves) lowers with Triton and Mosaic TPU: a matrix, one-byte
  codes of the float and integer grids, block scales whose blocks divide
  its rows, no range expansion (checked by export in the tests; the
  dynamic map's lookup and packed 4-bit codes they refuse). The tiles'
  own shapes are `tiling.plan`'s to check."""
  return bool(stored) and len(shape) == 2 and all(
      x.fmt.kind in ('float', 'int') and not x.fmt.packed
      and not x.fmt.expand and x.scale_mode == 'block'
      and shape[-1] % x.block_size == 0
      and jnp.dtype(x.codes.dtype).itemsize == 1 for x in stored)


def _round_half_even(y, *, rounding_method):
  """``lax.round`` to nearest even from the floor and the (exact) fraction,
  the same bits; at or above 2**23 every float32 is an integer."""
  if rounding_method != lax.RoundingMethod.TO_NEAREST_EVEN:
    return lax.round(y, rounding_method)
  low = jnp.floor(y)
  frac = y - low
  odd = low - 2 * jnp.floor(low * 0.5) == 1
  r = jnp.where((frac > 0.5) | ((frac == 0.5) & odd), low + 1, low)
  return jnp.where(r == 0, y * 0, r)  # -0.5 < y < 0 rounds to -0.0.


def _any(x, *, axes):
  """``reduce_or`` as a maximum of zeros and ones."""
  return jnp.max(jnp.where(x, jnp.float32(1), jnp.float32(0)), axis=axes,
                 initial=0.0) > 0


# The operations Pallas' Triton lowering lacks, written with ones it has.
_TRITON_OPS = {primitives.round_p: _round_half_even,
               primitives.reduce_or_p: _any}


def _with_triton_ops(jaxpr, consts, *args) -> list[Any]:
  """Evaluates ``jaxpr`` with `_TRITON_OPS` in place of those operations
  (inside nested calls too): the kernel body's, so that the codecs keep
  their own operations everywhere else. The bits are the same (the kernel
  tests compare them, interpreted, with the XLA loop's)."""
  env = {}
  read = lambda v: v.val if isinstance(v, jax_core.Literal) else env[v]  # noqa: E731
  env.update(zip(jaxpr.constvars, consts))
  env.update(zip(jaxpr.invars, args))
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    if eqn.primitive in _TRITON_OPS:
      outs = _TRITON_OPS[eqn.primitive](*ins, **eqn.params)
    elif eqn.primitive in (primitives.jit_p, primitives.closed_call_p):
      inner = eqn.params.get('jaxpr') or eqn.params['call_jaxpr']
      outs = _with_triton_ops(inner.jaxpr, inner.consts, *ins)
    else:
      params = eqn.primitive.get_bind_params(eqn.params)
      # (Older Jax returns the nested functions first.)
      subfuns, params = params if isinstance(params, tuple) else ((), params)
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*subfuns, *ins, **params)
    outs = outs if eqn.primitive.multiple_results or isinstance(
        outs, (list, tuple)) else [outs]
    env.update(zip(eqn.outvars, outs))
  return [read(v) for v in jaxpr.outvars]


def _triton_params():
  """Pallas' Triton backend, four warps per program (imported here: only
  a step lowered for a GPU with ``kernel='pallas'`` needs it)."""
  from jax.experimental.pallas import triton as pl_triton  # pylint: disable=g-import-not-at-top
  return pl_triton.CompilerParams(num_warps=4, num_stages=1)


def _spec(x: jax.Array, tiles: int, tiled: bool) -> pl.BlockSpec:
  ndim = x.ndim
  if not tiled:
    return pl.BlockSpec(tuple(x.shape), lambda t: (0,) * ndim)
  block = (x.shape[0] // tiles,) + tuple(x.shape[1:])
  return pl.BlockSpec(block, lambda t: (t,) + (0,) * (ndim - 1))


def tile_map(
    step: Callable[[jax.Array, Any, Any, Any], Any],
    carried: Any,
    read: Any,
    shared: Any,
    tiles: int,
    *,
    interpret_mode: bool,
    triton: bool = False,
) -> Any:
  """New ``carried``, computed tile by tile and written in its place.

  Args:
    step: ``step(t, carried_tile, read_tile, shared)`` returns the new
      ``carried_tile`` (the same structure); ``t`` is the tile's index (a
      traced int32), and a tile of an array is its rows
      ``t * r, ..., t * r + r - 1`` (``r`` = rows / tiles).
    carried: A pytree of arrays tiled along their first axis (its length a
      multiple of ``tiles``), rewritten: outputs aliased to these inputs.
    read: A pytree of arrays tiled the same way, only read.
    shared: A pytree of small arrays every tile reads whole (step counts,
      rounding keys).
    tiles: Number of tiles.
    interpret_mode: Run the kernel interpreted (CPU).
    triton: Compile it with Pallas' Triton backend (GPU); else with the
      platform's default (Mosaic on TPU).

  Returns:
    The new ``carried``.
  """
  c_leaves, c_def = jax.tree.flatten(carried)
  r_leaves, r_def = jax.tree.flatten(read)
  s_leaves, s_def = jax.tree.flatten(shared)
  tiled = c_leaves + r_leaves
  n_c, n_t = len(c_leaves), len(tiled)
  s_shapes = [jnp.shape(x) for x in s_leaves]

  def flat_step(t, tile_leaves, whole_leaves):
    new = step(t, c_def.unflatten(tile_leaves[:n_c]),
               r_def.unflatten(tile_leaves[n_c:]),
               s_def.unflatten([v.reshape(shape) for v, shape in
                                zip(whole_leaves, s_shapes)]))
    return jax.tree.leaves(new)

  # A kernel may not close over arrays (the codecs' tables): trace the
  # step once, and hand its constants to the kernel as inputs. Inputs
  # read whole travel as (1, n) arrays, scalars too: Mosaic TPU asks the
  # chip's layout of one-dimensional blocks, which an export has not.
  blocks = [jax.ShapeDtypeStruct((x.shape[0] // tiles,) + x.shape[1:],
                                 x.dtype) for x in tiled]
  whole = [jnp.reshape(jnp.asarray(x), (1, -1)) for x in s_leaves]
  closed = jax.make_jaxpr(flat_step)(
      jnp.int32(0), blocks,
      [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in whole])
  const_shapes = [jnp.shape(c) for c in closed.consts]
  whole += [jnp.reshape(jnp.asarray(c), (1, -1)) for c in closed.consts]
  n_in, n_s = n_t + len(whole), len(s_leaves)

  def kernel(*refs):
    loaded = [r[...] for r in refs[:n_in]]
    consts = [c.reshape(shape) for c, shape in
              zip(loaded[n_t + n_s:], const_shapes)]
    new = _with_triton_ops(closed.jaxpr, consts, pl.program_id(0),
                           *loaded[:n_t + n_s])
    for ref, value in zip(refs[n_in:], new):
      ref[...] = value.astype(ref.dtype)

  # Under a manual mesh the outputs vary over its axes as their inputs.
  out_shape = [jax.ShapeDtypeStruct(
      x.shape, x.dtype,
      manual_axis_type=getattr(jax.typeof(x), 'manual_axis_type', None))
               for x in c_leaves]
  new = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(tiles,),
      in_specs=([_spec(x, tiles, True) for x in tiled]
                + [_spec(x, tiles, False) for x in whole]),
      out_specs=[_spec(x, tiles, True) for x in c_leaves],
      input_output_aliases={i: i for i in range(n_c)},
      interpret=interpret_mode, name='optax_q_tile_update',
      compiler_params=_triton_params() if triton else None)(*tiled, *whole)
  return c_def.unflatten(new)
