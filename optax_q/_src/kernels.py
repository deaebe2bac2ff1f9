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
compare them bit for bit) its codes are the XLA loop's; compiled by Triton
or Mosaic, a kernel may form fused multiply-adds where XLA does not, which
would move a moment's last bit: unchecked until it runs on an
accelerator.

On GPU (Triton) and TPU (Mosaic) the whole step of a tile is then one
kernel: the moments are decoded, updated, reduced to their block maxima and
encoded in registers and on-chip memory, once. Where a step does not lower
(a table format's gather on Triton, say), ``kernel='auto'`` keeps the XLA
loop: `lowers` compiles the kernel once, at trace time, and says whether
it did.

``'auto'`` takes the kernel only where the step runs on one device: under
a mesh it keeps the XLA loop, which the compiler partitions (a custom call
it cannot split would be gathered whole).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.extend import core as jax_core
import jax.numpy as jnp

KERNELS = ('auto', 'xla', 'pallas')
"""The values of ``kernel``: ``'xla'`` (a loop the compiler fuses),
``'pallas'`` (one Pallas kernel per tiled leaf; interpreted on CPU, for
tests) and ``'auto'`` (Pallas on GPU and TPU where it lowers, else XLA)."""

_ACCELERATORS = ('gpu', 'tpu')


def interpret() -> bool:
  """Whether Pallas kernels run interpreted (on CPU, where none compile)."""
  return jax.default_backend() not in _ACCELERATORS


def accelerated() -> bool:
  """Whether ``kernel='auto'`` may choose Pallas here: a GPU or TPU, one
  device, and no mesh in context."""
  if jax.default_backend() not in _ACCELERATORS:
    return False
  return jax.sharding.get_abstract_mesh().empty and jax.device_count() == 1


def _spec(x: jax.Array, tiles: int, tiled: bool) -> pl.BlockSpec:
  ndim = x.ndim
  if not tiled:
    return pl.BlockSpec(tuple(x.shape), lambda t: (0,) * ndim)
  block = (x.shape[0] // tiles,) + tuple(x.shape[1:])
  return pl.BlockSpec(block, lambda t: (t,) + (0,) * (ndim - 1))


def tile_map(
    step: Callable[[jax.Array, list[jax.Array], list[jax.Array]],
                   list[jax.Array]],
    tiled: Sequence[jax.Array],
    whole: Sequence[jax.Array],
    outputs: Sequence[int],
    tiles: int,
    *,
    interpret_mode: bool,
) -> list[jax.Array]:
  """New values of ``tiled[i]`` for ``i`` in ``outputs``, tile by tile.

  Args:
    step: ``step(t, tile_values, whole_values)`` returns the new tile of
      each output (in the order of ``outputs``); ``t`` is the tile's index
      (a traced int32), ``tile_values`` the tile of every ``tiled`` array
      (rows ``t * r, ..., t * r + r - 1`` along the first axis, ``r`` =
      rows / tiles) and ``whole_values`` the ``whole`` arrays.
    tiled: Arrays tiled along their first axis (its length a multiple of
      ``tiles``).
    whole: Small arrays every tile reads whole (shared scalars, reshaped
      to ``(1,)``).
    outputs: Indices into ``tiled`` of the arrays the step rewrites; each
      output is written in place of its input.
    tiles: Number of tiles.
    interpret_mode: Run the kernel interpreted (CPU).

  Returns:
    The rewritten arrays, in the order of ``outputs``.
  """
  tiled, whole, outputs = list(tiled), list(whole), list(outputs)
  n_tiled = len(tiled)
  # A kernel may not close over arrays (the codecs' tables): trace the
  # step once, and hand its constants to the kernel as inputs.
  blocks = [jax.ShapeDtypeStruct((x.shape[0] // tiles,) + x.shape[1:],
                                 x.dtype) for x in tiled]
  closed = jax.make_jaxpr(
      lambda t, values, shared: step(t, list(values), list(shared)))(
          jnp.int32(0), blocks, [jax.ShapeDtypeStruct(x.shape, x.dtype)
                                 for x in whole])
  consts = [jnp.reshape(jnp.asarray(c), (-1,)) for c in closed.consts]
  const_shapes = [jnp.shape(c) for c in closed.consts]
  whole = whole + consts
  n_in = n_tiled + len(whole)

  def kernel(*refs):
    loaded = [r[...] for r in refs[:n_in]]
    const_values = [c.reshape(s) for c, s in
                    zip(loaded[n_in - len(consts):], const_shapes)]
    new = jax_core.jaxpr_as_fun(
        jax_core.ClosedJaxpr(closed.jaxpr, const_values))(
            pl.program_id(0), *loaded[:n_in - len(consts)])
    for ref, value in zip(refs[n_in:], new):
      ref[...] = value.astype(ref.dtype)

  in_specs = ([_spec(x, tiles, True) for x in tiled]
              + [_spec(x, tiles, False) for x in whole])
  out_specs = [_spec(tiled[i], tiles, True) for i in outputs]
  # Under a manual mesh the outputs vary over its axes as their inputs.
  out_shape = [jax.ShapeDtypeStruct(
      tiled[i].shape, tiled[i].dtype,
      manual_axis_type=getattr(jax.typeof(tiled[i]), 'manual_axis_type',
                               None)) for i in outputs]
  return list(pl.pallas_call(
      kernel, out_shape=out_shape, grid=(tiles,), in_specs=in_specs,
      out_specs=out_specs,
      input_output_aliases={i: k for k, i in enumerate(outputs)},
      interpret=interpret_mode, name='optax_q_tile_update')(*tiled, *whole))


def lowers(fn: Callable[..., Any], args: Sequence[Any]) -> bool:
  """Whether ``fn`` compiles for ``args``' shapes on this backend.

  ``'auto'`` asks this at trace time, before it puts a kernel into the
  step: a kernel that does not lower leaves the step on the XLA loop
  instead of failing it.
  """
  avals = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)),
      tuple(args))
  try:
    jax.jit(fn).lower(*avals).compile()
  except Exception:  # pylint: disable=broad-except
    return False
  return True
