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
"""Arrays whose type carries their sharding (mesh axes of type Explicit).

On a mesh with ``Explicit`` axes (``jax.make_mesh``'s default),
``jax.typeof(x).sharding`` says how ``x`` is laid out, and a reshape that
splits or merges a sharded axis must be told the sharding of its result, or
it raises ``ShardingTypeError``. On an ``Auto`` mesh, and outside any mesh,
the type names no mesh axis: these helpers then find nothing to do, and the
compiler places the data as before.
"""

from __future__ import annotations

import math
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec


def axes_size(mesh, axes) -> int:
  """Devices along the mesh axes of one ``PartitionSpec`` entry."""
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


def fit(sharding: NamedSharding, shape: tuple[int, ...]) -> NamedSharding:
  """``sharding``'s spec laid on an array of ``shape``, axis by axis: an
  axis its mesh axes do not divide is replicated, and so is an array of
  lower rank than the spec (the memory kind is kept)."""
  mesh, spec = sharding.mesh, tuple(sharding.spec)
  if len(spec) > len(shape):
    return NamedSharding(mesh, PartitionSpec(),
                         memory_kind=sharding.memory_kind)
  out = [axes if dim % axes_size(mesh, axes) == 0 else None
         for dim, axes in zip(shape, spec)]
  return NamedSharding(mesh, PartitionSpec(*out),
                       memory_kind=sharding.memory_kind)


def spec_names(entry) -> tuple[str, ...]:
  """The mesh axis names of one ``PartitionSpec`` entry, as a tuple."""
  if entry is None:
    return ()
  return (entry,) if isinstance(entry, str) else tuple(entry)


def spread(buffers, axes: tuple[str, ...], whole=lambda axis, size: True
           ) -> list[NamedSharding] | None:
  """The shardings of ``buffers`` with mesh ``axes`` added on one axis.

  ``buffers`` are ``(sharding, shape)`` pairs of one rank that split
  together (the codes and the scales of one array). The mesh ``axes`` go
  on the first axis whose entry is the same in every buffer that is longer
  than 1 there, whose combined mesh axes (the entry's, then ``axes``)
  divide each such buffer's length, and where ``whole(axis, size)`` (size:
  the devices along the combined axes) allows it; buffers of length 1
  there keep their entry. None where no axis takes them (buffers of one
  element or none: nothing to split).
  """
  if all(math.prod(shape) <= 1 for _, shape in buffers):
    return None
  rank = len(buffers[0][1])
  mesh = buffers[0][0].mesh
  for axis in range(rank):
    live = [(tuple(s.spec) + (None,) * rank)[axis]
            for s, shape in buffers if shape[axis] != 1]
    if not live or len({spec_names(e) for e in live}) != 1:
      continue
    names = spec_names(live[0]) + tuple(axes)
    size = axes_size(mesh, names)
    if any(shape[axis] % size for _, shape in buffers
           if shape[axis] != 1) or not whole(axis, size):
      continue
    out = []
    for s, shape in buffers:
      spec = list(tuple(s.spec) + (None,) * (len(shape) - len(s.spec)))
      if shape[axis] != 1:
        spec[axis] = names[0] if len(names) == 1 else names
      out.append(s.update(spec=PartitionSpec(*spec)))
    return out
  return None


def sharding_of(x: Any) -> NamedSharding | None:
  """The sharding in ``x``'s type, or None where it names no mesh axis."""
  try:
    sharding = jax.typeof(x).sharding
  except Exception:  # pylint: disable=broad-except
    return None
  if not isinstance(sharding, NamedSharding) or all(
      p is None for p in sharding.spec):
    return None
  return sharding


def type_sharding(x: Any) -> NamedSharding | None:
  """The sharding in ``x``'s type on a mesh with Explicit axes, replicated
  ones included; None on other meshes and outside any mesh."""
  try:
    sharding = jax.typeof(x).sharding
  except Exception:  # pylint: disable=broad-except
    return None
  if not isinstance(sharding, NamedSharding) or (
      jax.sharding.AxisType.Explicit not in sharding.mesh.axis_types):
    return None
  return sharding


def spec_of(x: Any) -> tuple[Any, ...] | None:
  """One ``PartitionSpec`` entry per axis of ``x``, or None (see above)."""
  sharding = sharding_of(x)
  if sharding is None:
    return None
  spec = tuple(sharding.spec)
  return spec + (None,) * (len(x.shape) - len(spec))


def divides(x: Any, axis: int, size: int) -> bool:
  """Whether ``x``'s mesh axes along ``axis`` divide ``size`` entries."""
  spec = spec_of(x)
  if spec is None:
    return True
  return size % axes_size(sharding_of(x).mesh, spec[axis]) == 0


def with_spec(x: Any, spec) -> NamedSharding:
  """``x``'s (explicit) sharding with its ``PartitionSpec`` replaced."""
  return sharding_of(x).update(spec=PartitionSpec(*spec))


def replicate_last_axis(x: jax.Array) -> jax.Array:
  """``x`` with its last axis gathered, its other axes sharded as they are.

  For a reshape whose result can't be sharded like ``x``: the blocks of a
  block-scaled axis, or the byte pairs of a packed one, that straddle
  shards.
  """
  spec = spec_of(x)
  if spec is None or spec[-1] is None:
    return x
  return jax.sharding.reshard(x, with_spec(x, spec[:-1] + (None,)))


def replicated(x: Any) -> Any:
  """``x`` gathered whole on every device (on other meshes: ``x``)."""
  sharding = sharding_of(x)
  if sharding is None:
    return x
  return jax.sharding.reshard(x, sharding.update(spec=PartitionSpec()))


def like(x: Any, ref: Any) -> Any:
  """``x`` sharded as ``ref``'s type says, replicated included (on other
  meshes: ``x``)."""
  sharding = type_sharding(ref)
  if sharding is None or not hasattr(x, 'shape'):
    return x
  return reshard(x, sharding)


def reshard(x: jax.Array, sharding: NamedSharding | None) -> jax.Array:
  """``x`` sharded as ``sharding`` (None, or already so: ``x`` itself)."""
  if sharding is None:
    return x
  spec = spec_of(x) or (None,) * x.ndim
  want = tuple(sharding.spec) + (None,) * (x.ndim - len(sharding.spec))
  if spec == want:
    return x
  return jax.sharding.reshard(x, sharding)


def vary_like(x: jax.Array, ref: Any) -> jax.Array:
  """``x``, varying also over the manual axes ``ref`` varies over.

  Inside ``shard_map`` a value's type says which manual mesh axes it varies
  over; a conditional's branches and a loop's carry must agree on them. A
  value made inside (zeros, a state initialized per shard) varies over
  none: this casts it to ``ref``'s. ``ref`` is an array or an abstract
  value; outside ``shard_map`` ``x`` is returned as it is.
  """
  def varying(v):
    aval = jax.typeof(v) if isinstance(v, jax.Array) else v
    return frozenset(getattr(getattr(aval, 'manual_axis_type', None),
                             'varying', ()))
  missing = varying(ref) - varying(x)
  if not missing:
    return x
  return jax.lax.pcast(x, tuple(sorted(missing)), to='varying')
