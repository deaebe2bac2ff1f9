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
"""Walking optimizer-state trees: field names, boxes, leaves by field.

The one place that knows how a state tree is read: a leaf's *field* is the
innermost ``NamedTuple`` attribute on its path (``'mu'`` of
``optax.ScaleByAdamState``, at any depth: inside chains, ``optax.masked``,
``optax.partition`` and the library's own wrappers); a *box* is a pytree
node holding one float array under ``value`` (a Flax NNX ``Variable``, a
Linen ``Partitioned``), whose ``value`` is not a field.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

from optax_q._src.codec import qarray as qarray_lib

_VALUE = jax.tree_util.GetAttrKey('value')


def path_str(path) -> str:
  """A readable ``a/b/c`` name for a pytree key path."""
  return jax.tree_util.keystr(tuple(path), simple=True, separator='/')


def is_namedtuple(x: Any) -> bool:
  return isinstance(x, tuple) and hasattr(x, '_fields')


def is_float_array(x: Any) -> bool:
  """An array (or ``ShapeDtypeStruct``) of a floating dtype."""
  return (hasattr(x, 'shape') and hasattr(x, 'dtype')
          and jnp.issubdtype(x.dtype, jnp.floating))


def _children(node: Any) -> list[tuple[Any, Any]]:
  """``(key, child)`` pairs of one pytree node (empty for a leaf)."""
  flat = jax.tree_util.tree_flatten_with_path(
      node, is_leaf=lambda y: y is not node)[0]
  return [(path[0], child) for path, child in flat if len(path) == 1]


def is_box(x: Any) -> bool:
  """Whether ``x`` is a box around one float array, as an ``nnx.Variable``.

  A box is a pytree node other than a NamedTuple, a container or a
  `QArray`, whose only child is a float array under the attribute
  ``value`` (Flax NNX ``Variable``, Linen ``Partitioned``).
  """
  if (x is None or is_namedtuple(x) or qarray_lib.is_qarray(x)
      or isinstance(x, (list, tuple, dict, jax.Array, jax.ShapeDtypeStruct))
      or jax.tree_util.all_leaves([x])):
    return False
  children = _children(x)
  return (len(children) == 1 and children[0][0] == _VALUE
          and is_float_array(children[0][1]))


def is_telemetry(x: Any) -> bool:
  """Whether ``x`` is a node of per-leaf statistics (its class sets
  ``is_telemetry``): not moments, replicated, not counted as state bits."""
  return getattr(type(x), 'is_telemetry', False) is True


def rebox(box: Any, value: Any) -> Any:
  """``box`` with its one child replaced by ``value`` (metadata kept)."""
  return jax.tree.structure(box).unflatten([value])


def field_name(path, root: Any = None) -> str | None:
  """The innermost state field (``GetAttrKey``) on ``path``, e.g. ``'mu'``.

  With ``root`` (the tree ``path`` indexes), the ``value`` attribute of a
  box around a leaf is not taken for a field: under ``nnx.Optimizer`` the
  path of a first moment is ``mu/<param path>/value``.
  """
  name, node = None, root
  for key in path:
    if isinstance(key, jax.tree_util.GetAttrKey) and not (
        root is not None and key == _VALUE and not is_namedtuple(node)):
      name = key.name
    if root is not None:
      node = dict(_children(node)).get(key) if node is not None else None
  return name


def field_names(state: Any, skip: Callable[[Any], Any] | None = None
                ) -> tuple[set[str], set[str]]:
  """``(float field names, integer field names)`` of a state's leaves.

  Every ``GetAttrKey`` on a leaf's path counts; `QArray` leaves are
  float leaves. ``skip`` is as for `map_fields`: a wrapper's state
  node is read through the subtree it returns (its own counters and
  telemetry are not fields of the wrapped state).
  """
  floats, ints = set(), set()

  def is_node(x):
    return qarray_lib.is_qarray(x) or (skip is not None
                                       and skip(x) is not None)

  flat = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_node)[0]
  for path, leaf in flat:
    inner = None if skip is None else skip(leaf)
    if inner is not None:
      f, i = field_names(inner[0], skip)
      floats, ints = floats | f, ints | i
      continue
    names = {k.name for k in path if isinstance(k, jax.tree_util.GetAttrKey)}
    if qarray_lib.is_qarray(leaf) or is_float_array(leaf):
      floats |= names
    elif hasattr(leaf, 'dtype') and jnp.issubdtype(leaf.dtype, jnp.integer):
      ints |= names
  return floats, ints


def probe_state(inner: optax.GradientTransformation) -> Any:
  """``inner``'s abstract state on a small probe tree, or None if unknown.

  The probe holds a matrix and a vector, so that transforms that treat
  them apart (Muon and its auxiliary Adam) show the fields of both; a
  transform that only takes matrices is probed with the matrix alone.
  """
  matrix = jax.ShapeDtypeStruct((8, 8), jnp.float32)
  for probe in ({'w': matrix, 'b': jax.ShapeDtypeStruct((8,), jnp.float32)},
                {'w': matrix}):
    try:
      return jax.eval_shape(inner.init, probe)
    except Exception:  # pylint: disable=broad-except
      continue
  return None


def probe_field_names(inner: optax.GradientTransformation,
                      skip: Callable[[Any], Any] | None = None
                      ) -> tuple[set[str], set[str]] | None:
  """`field_names` of ``inner``'s state on a probe tree, or None."""
  state = probe_state(inner)
  return None if state is None else field_names(state, skip)


def innermost_of(path, names) -> str | None:
  """The innermost field name on ``path`` that is one of ``names``."""
  found = None
  for key in path:
    if isinstance(key, jax.tree_util.GetAttrKey) and key.name in names:
      found = key.name
  return found


def map_fields(fn: Callable[..., Any], names, state: Any, *rest: Any,
               skip: Callable[[Any], Any] | None = None) -> Any:
  """Maps ``fn(name, leaf, *rest_leaves)`` over the leaves of ``state``.

  ``name`` is the innermost field on the leaf's path that is in ``names``
  (or None). `QArray` leaves are passed whole. ``skip(node)``, where
  given, returns for a wrapper's state node the subtree to descend into in
  its place (``node`` is rebuilt around it) or None for other nodes: the
  quantized state passes its ``inner_state``, so its telemetry and rounding
  counter are not visited.
  """

  def is_node(x):
    return qarray_lib.is_qarray(x) or (skip is not None
                                       and skip(x) is not None)

  def visit(path, x, *xs):
    inner = None if skip is None else skip(x)
    if inner is not None:
      return inner[1](map_fields(fn, names, inner[0],
                                 *(skip(y)[0] for y in xs), skip=skip))
    return fn(innermost_of(path, names), x, *xs)

  return jax.tree_util.tree_map_with_path(visit, state, *rest, is_leaf=is_node)
