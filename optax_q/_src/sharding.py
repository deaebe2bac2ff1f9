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
"""Shardings of optimizer state, derived from the parameters' shardings.

A :class:`QArray` keeps the rank of its parameter (codes: the param's shape,
4-bit codes with the last axis halved; scales: the last axis divided into
blocks), so the parameter's ``PartitionSpec`` applies to its codes and to its
scales unchanged, as long as every sharded axis still divides by its mesh
axes after blocking and packing. Where it does not, that axis of that buffer
is replicated (or, with ``strict=True``, a ``ValueError`` says which leaf and
which axis).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from optax_q._src import qarray as qarray_lib


def _axes_size(mesh, axes) -> int:
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


def _fit(sharding: NamedSharding, shape, *, strict: bool, what: str
         ) -> NamedSharding:
  """``sharding``'s spec on ``shape``, replicating axes that don't divide."""
  mesh = sharding.mesh
  spec = tuple(sharding.spec)
  if len(spec) > len(shape):
    # A lower-rank leaf in a params-shaped tree (e.g. per-leaf telemetry
    # scalars): replicated.
    return NamedSharding(mesh, PartitionSpec(),
                         memory_kind=sharding.memory_kind)
  out = []
  for axis, (dim, axes) in enumerate(zip(shape, spec)):
    size = _axes_size(mesh, axes)
    if dim % size == 0:
      out.append(axes)
      continue
    if strict and dim != 1:  # Axes reduced to 1 (row, tensor scales): fine.
      raise ValueError(
          f'{what}: axis {axis} has {dim} entries, which mesh axes {axes!r} '
          f'(size {size}) do not divide. Pick a block_size so that the '
          'number of blocks divides the mesh axis (4-bit codes: half the '
          'axis must divide), or pass strict=False to replicate this axis.')
    out.append(None)
  return NamedSharding(mesh, PartitionSpec(*out),
                       memory_kind=sharding.memory_kind)


def _leaf_sharding(leaf, sharding, *, strict, what):
  if leaf is None:
    return None
  if qarray_lib.is_qarray(leaf):
    return dataclasses.replace(
        leaf,
        codes=_fit(sharding, leaf.codes.shape, strict=strict,
                   what=f'{what} (codes)'),
        scale=None if leaf.scale is None else _fit(
            sharding, leaf.scale.shape, strict=strict,
            what=f'{what} (scales)'))
  if hasattr(leaf, 'shape'):
    return _fit(sharding, leaf.shape, strict=strict, what=what)
  return leaf  # MaskedNode and other empty nodes.


def _replicated(tree, mesh):
  def rep(x):
    if qarray_lib.is_qarray(x):
      return dataclasses.replace(
          x, codes=NamedSharding(mesh, PartitionSpec()),
          scale=None if x.scale is None else NamedSharding(
              mesh, PartitionSpec()))
    return NamedSharding(mesh, PartitionSpec())
  return jax.tree.map(rep, tree, is_leaf=qarray_lib.is_qarray)


def state_shardings(
    state: Any,
    param_shardings: Any,
    *,
    strict: bool = False,
) -> Any:
  """``NamedSharding``s for every buffer of ``state``, from the params'.

  Every subtree of ``state`` laid out like the parameters (``mu``, ``nu``,
  ``trace``, masked copies with ``MaskedNode`` holes, ...) takes the
  parameters' shardings: a plain array takes its parameter's sharding, a
  :class:`QArray` gives it to its codes and to its scales. Everything else
  (step counters, telemetry scalars) is replicated over the same mesh.

  Args:
    state: The optimizer state, concrete or abstract (from
      ``jax.eval_shape(tx.init, params)``).
    param_shardings: A tree of ``jax.sharding.NamedSharding`` with the
      parameters' structure.
    strict: Raise a ``ValueError`` when an axis of a state buffer can't be
      sharded like its parameter's (a block count or a packed length that
      the mesh axes do not divide) instead of replicating that axis.

  Returns:
    A tree like ``state`` (QArrays included) with ``NamedSharding`` leaves,
    for ``jax.jit(..., in_shardings=..., out_shardings=...)`` or
    ``jax.device_put``.

  Examples:
    >>> import jax, jax.numpy as jnp, optax_q
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ('model',))
    >>> params = {'w': jnp.zeros((8, 256))}
    >>> tx = optax_q.adamw(1e-3, min_size=0)
    >>> abstract = jax.eval_shape(tx.init, params)
    >>> shardings = optax_q.state_shardings(
    ...     abstract, {'w': NamedSharding(mesh, P(None, 'model'))})
    >>> shardings[0].inner_state.mu['w'].scale.spec
    P(None, 'model')
  """
  param_leaves, param_def = jax.tree.flatten(param_shardings)
  if not param_leaves or not all(
      isinstance(s, NamedSharding) for s in param_leaves):
    raise ValueError(
        'param_shardings must be a non-empty tree of NamedSharding, got '
        f'{param_shardings!r}.')
  mesh = param_leaves[0].mesh

  names = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_flatten_with_path(param_shardings)[0]]
  single = param_def.num_nodes == 1  # The params are one array.

  def is_leaf(x):
    return qarray_lib.is_qarray(x) or jax.tree_util.all_leaves([x])

  def visit(node, path):
    if node is None:
      return None
    if single and is_leaf(node):
      return _leaf_sharding(node, param_leaves[0], strict=strict,
                            what=f'state{path}')
    if not single and not is_leaf(node):
      try:
        leaves = param_def.flatten_up_to(node)
      except (ValueError, TypeError):
        leaves = None
      if leaves is not None and any(
          qarray_lib.is_qarray(x) or hasattr(x, 'shape') for x in leaves):
        return param_def.unflatten([
            _leaf_sharding(x, s, strict=strict, what=f'state{path}{n}')
            for x, s, n in zip(leaves, param_leaves, names)])
    if is_leaf(node):
      return _replicated(node, mesh)
    children, node_def = jax.tree_util.tree_flatten_with_path(
        node, is_leaf=lambda y: y is not node)
    return node_def.unflatten([
        visit(c, path + jax.tree_util.keystr(p)) for p, c in children])

  return visit(state, '')
