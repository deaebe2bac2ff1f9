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
"""Migration between plain Optax states and optax_q states.

``to_optax`` removes the library's wrapper nodes from a state and decodes
its quantized leaves; ``from_optax`` is its inverse on the state of a given
transform: it lays a plain state over ``tx.init(params)`` leaf for leaf and
encodes each quantized leaf with that leaf's own codec.

A *wrapper node* is a state ``NamedTuple`` of optax_q with the fields
``count`` and ``inner_state`` (`QuantizedState`, and the states of the
features built on it, such as adaptive bits, resets and ECO): its
``inner_state`` is where the wrapped transform's state lives.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.state import state_tree

QArray = qarray_lib.QArray

_ARRAYS = (jax.Array, np.ndarray, np.generic)
_NNX_HINT = (' (for the state of a Flax NNX optimizer, pass the arrays it '
             'holds: nnx.as_pure(opt.opt_state))')


def is_wrapper(x: Any) -> bool:
  """Whether ``x`` is a wrapper node: a state ``NamedTuple`` of optax_q
  with the fields ``count`` and ``inner_state``."""
  return (state_tree.is_namedtuple(x)
          and {'count', 'inner_state'} <= set(x._fields)
          and type(x).__module__.partition('.')[0] == 'optax_q')


def _is_node(x: Any) -> bool:
  return qarray_lib.is_qarray(x) or is_wrapper(x)


def _strip(state: Any, leaf_fn) -> Any:
  """``state`` with every wrapper node replaced by its stripped
  ``inner_state`` and every `QArray` by ``leaf_fn(q)``."""

  def visit(x):
    if is_wrapper(x):
      return _strip(x.inner_state, leaf_fn)
    return leaf_fn(x) if qarray_lib.is_qarray(x) else x

  return jax.tree.map(visit, state, is_leaf=_is_node)


def _decoded(q: QArray) -> Any:
  """``q`` decoded (abstract in, abstract out)."""
  if isinstance(q.codes, jax.ShapeDtypeStruct):
    return jax.ShapeDtypeStruct(q.shape, jnp.dtype(q.dtype))
  if not isinstance(q.codes, _ARRAYS):
    raise ValueError(
        f'to_optax decodes arrays, but the codes of a {q.fmt.name} QArray '
        f'are held in a {type(q.codes).__name__}{_NNX_HINT}.')
  return qarray_lib.decode_compiled(q, jnp.dtype(q.dtype))


def to_optax(state: optax.OptState) -> optax.OptState:
  r"""The plain Optax state of an optax_q state: moments decoded, wrappers
  removed.

  Every [`QArray`][optax_q.QArray] is decoded to its logical dtype (that of
  the leaf the wrapped transform made: float32 for float32 parameters),

  ```tex
  \hat x_i = s_b\, c_i \quad (i \in \text{block } b),
  ```

  and every wrapper node ([`QuantizedState`][optax_q.QuantizedState],
  [`AdaptiveBitsState`][optax_q.AdaptiveBitsState], the reset and ECO
  states: a state of optax_q with ``count`` and ``inner_state`` fields) is
  replaced by its inner state. The result is the state the same chain has
  without the wrappers: for the drop-ins ``optax_q.adamw``, ``adam``,
  ``lion``, ``sgd`` and ``muon`` (without ``reset_every``, whose moments
  are [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age]'s), the
  state of ``optax.adamw``, ``optax.adam``, ``optax.lion``,
  ``optax.sgd`` and ``optax.contrib.muon`` with the same arguments, in
  which any of them resumes. Counts of the inner transforms are carried
  over as they are; what only the wrappers hold (their step counters,
  stalled fractions, reset ages, adaptive-bits statistics and layout) is
  dropped. A state with no wrapper and no quantized leaf (a plain Optax
  state) is returned as it is. [`from_optax`][optax_q.from_optax] goes the
  other way.

  Pure and structural: it runs under ``jax.jit``, and on an abstract state
  (``jax.eval_shape``) it gives the abstract plain state.

  Args:
    state: Any optimizer state, concrete or abstract, holding optax_q state
      anywhere (inside ``optax.chain``, ``optax.masked``,
      ``optax.inject_hyperparams`` ...); of an ``nnx.Optimizer``, the
      arrays it holds, ``nnx.as_pure(opt.opt_state)``.

  Returns:
    The plain state, as a tree of arrays.

  Examples:
    >>> import jax, jax.numpy as jnp, optax, optax_q
    >>> params = {'w': jnp.zeros((4, 256))}
    >>> state = optax_q.adamw(1e-3, min_size=0).init(params)
    >>> plain = optax_q.to_optax(state)
    >>> (jax.tree.structure(plain)
    ...  == jax.tree.structure(optax.adamw(1e-3).init(params)))
    True

  References:
    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022
  """
  return _strip(state, _decoded)


def _one_level(node: Any) -> tuple[Any, list[tuple[Any, Any]]]:
  """``(node type and static data, [(key, child)])`` of one pytree node."""
  treedef = jax.tree.structure(node, is_leaf=lambda y: y is not node)
  flat = jax.tree_util.tree_flatten_with_path(
      node, is_leaf=lambda y: y is not node)[0]
  return treedef.node_data(), [(p[0], c) for p, c in flat if len(p) == 1]


def _describe(x: Any) -> str:
  if hasattr(x, 'shape') and hasattr(x, 'dtype'):
    return f'{jnp.dtype(x.dtype).name}{list(np.shape(x))}'
  return type(x).__name__


def _same_kind(a: Any, b: Any) -> bool:
  """Both float, both integer, or the same dtype."""
  a, b = jnp.dtype(a), jnp.dtype(b)
  return a == b or any(jnp.issubdtype(a, k) and jnp.issubdtype(b, k)
                       for k in (jnp.floating, jnp.integer))


def _leaf_difference(plain: Any, like: jax.ShapeDtypeStruct, where: str
                     ) -> str | None:
  """Whether ``plain`` fits an array leaf ``like`` (same shape, both float
  or both integer), as for `_difference`."""
  if not isinstance(plain, _ARRAYS):
    return (f'at {where} the state of tx has an array {_describe(like)}, '
            f'optax_state has a {type(plain).__name__}{_NNX_HINT}')
  if (tuple(np.shape(plain)) != like.shape
      or not _same_kind(plain.dtype, like.dtype)):
    return (f'at {where} the state of tx has {_describe(like)}, '
            f'optax_state has {_describe(plain)}')
  return None


def _names(children: list[tuple[Any, Any]]) -> list[str]:
  return [state_tree.path_str((k,)) for k, _ in children]


def _difference(plain: Any, like: Any, path: tuple[Any, ...]) -> str | None:
  """Where ``plain`` first departs from ``like`` (an abstract plain state),
  as a message naming the path and both sides; None if it fits."""
  where = state_tree.path_str(path) or '(the root)'
  if isinstance(like, jax.ShapeDtypeStruct):
    return _leaf_difference(plain, like, where)
  (like_type, like_aux), like_children = _one_level(like)
  if plain is not None and jax.tree_util.all_leaves([plain]):
    return (f'at {where} the state of tx has a {like_type.__name__} with '
            f'{_names(like_children)}, optax_state has {_describe(plain)}')
  (plain_type, plain_aux), plain_children = _one_level(plain)
  if (plain_type is not like_type
      or _names(plain_children) != _names(like_children)):
    return (f'at {where} the state of tx has a {like_type.__name__} with '
            f'{_names(like_children)}, optax_state has a '
            f'{plain_type.__name__} with {_names(plain_children)}')
  if not _equal(plain_aux, like_aux):
    return (f'at {where} the {like_type.__name__} of optax_state differs '
            f'from that of the state of tx: {validation.short(plain_aux)} '
            f'against {validation.short(like_aux)}')
  for (key, p), (_, l) in zip(plain_children, like_children):
    found = _difference(p, l, (*path, key))
    if found is not None:
      return found
  return None


def _equal(a: Any, b: Any) -> bool:
  try:
    return bool(a == b)
  except Exception:  # pylint: disable=broad-exception-caught
    return a is b


def _steps(plain: Any) -> Any:
  """The step count of a plain state: its first integer scalar ``count``
  field (``ScaleByAdamState.count``...), or 0 where it has none."""
  for path, x in jax.tree_util.tree_flatten_with_path(plain)[0]:
    if (path and isinstance(path[-1], jax.tree_util.GetAttrKey)
        and path[-1].name == 'count' and np.shape(x) == ()
        and jnp.issubdtype(x.dtype, jnp.integer)):
      return x
  return 0


def _fill(template: Any, plain: Any, count: Any) -> Any:
  """``template`` (a state of tx) with the values of ``plain`` (checked to
  fit its stripped form)."""
  parts, treedef = jax.tree.flatten(template, is_leaf=_is_node)
  subtrees = treedef.flatten_up_to(plain)
  return treedef.unflatten([
      _fill_part(t, p, count) for t, p in zip(parts, subtrees)])


def _fill_part(template: Any, plain: Any, count: Any) -> Any:
  if is_wrapper(template):
    steps = _steps(plain) if count is None else count
    return template._replace(
        count=jnp.asarray(steps, template.count.dtype),
        inner_state=_fill(template.inner_state, plain, count))
  if qarray_lib.is_qarray(template):
    # Compiled once per layout and shape: the leaves of a model's layers
    # share their encoders.
    return template.codec.encode_compiled(
        jnp.asarray(plain, jnp.float32), key=None, dtype=template.dtype)
  return jnp.asarray(plain, template.dtype)


def _check_plain(optax_state: Any) -> None:
  flat = jax.tree_util.tree_flatten_with_path(
      optax_state, is_leaf=_is_node)[0]
  for path, x in flat:
    if _is_node(x):
      raise ValueError(
          'from_optax takes a plain Optax state, but optax_state holds '
          f'optax_q state (a {type(x).__name__} at '
          f'{state_tree.path_str(path) or "the root"}): to move an optax_q '
          'state to another optax_q optimizer (another precision, say), '
          'pass to_optax(state).')


def from_optax(optax_state: optax.OptState,
               tx: optax.GradientTransformation,
               params: optax.Params, *,
               count: int | jax.Array | None = None) -> optax.OptState:
  r"""The state of ``tx`` holding the values of a plain Optax state.

  ``tx.init(params)`` is the template: ``optax_state`` must have its
  structure once the template's wrapper nodes are replaced by their inner
  states and its [`QArray`][optax_q.QArray] leaves by arrays of their
  logical shape (the structure [`to_optax`][optax_q.to_optax] gives), that
  is, be the state of the same chain without optax_q's wrappers: of
  ``optax.adamw`` for ``optax_q.adamw``, of ``optax.contrib.muon`` for
  ``optax_q.muon`` and so on. Each leaf the template quantizes is encoded
  with that leaf's own codec (format, scales, block size), rounding to the
  nearest grid value whatever the rounding ``tx`` uses in its steps (a
  one-off conversion has no bias to average out):

  ```tex
  s_b = \frac{\max_{i \in b} |x_i|}{g_{\max}}, \qquad
  c_i = \operatorname{round}_G\!\left(\frac{x_i}{s_b}\right),
  ```

  so that ``to_optax(from_optax(s, tx, params))`` is ``s`` to within half a
  grid step of each block (at the ends of a grid that does not reach both
  ends of the block's range, such as ``int8_dynamic``'s ``[-0.993, 1]``,
  the distance to the grid's end), and exactly ``s`` where ``tx`` keeps a
  leaf in float32. The other leaves (counts, small leaves kept in float32,
  Muon's coefficients, and the hyperparameters ``optax.inject_hyperparams``
  holds, which therefore come from ``optax_state``, not from ``tx``) are
  copied, float leaves cast to the template's dtype (a ``bfloat16`` moment
  of ``optax.adam(mu_dtype=...)`` is accepted).

  Encoding a decoded state of optax_q again
  (``from_optax(to_optax(state), tx, params)``) gives its codes back, but
  for the sign of zero (``fp4_e2m1``'s ``-0`` comes back as ``+0``) and
  for the blocks of a signed ``int8_dynamic`` leaf whose largest magnitude
  is negative: that decodes to ``0.993 s_b``, so the block takes a scale
  0.7% smaller and a few of its codes move one step. Scales may differ in
  their last bit.

  What only the wrappers hold starts as ``tx.init`` sets it: stalled
  fractions at zero, reset ages and excess at zero, adaptive-bits
  statistics empty and every adapted leaf in its initial format (call
  [`relayout`][optax_q.relayout] with a saved layout to change it). Each
  wrapper's own ``count`` (the stochastic-rounding stream, the
  adaptive-bits period) is set to ``count``, or where that is None to the
  step count of the plain state it wraps (its first integer ``count``
  field, such as ``ScaleByAdamState.count``; 0 where it has none, as
  ``optax.trace``).

  With Flax NNX, pass the arrays the optimizers hold and put the result
  back as an ``nnx.Optimizer`` wraps a state:

  ```python
  from flax.nnx.training.optimizer import to_opt_state
  new = optax_q.from_optax(nnx.as_pure(plain_opt.opt_state), tx,
                           nnx.as_pure(nnx.state(model, nnx.Param)))
  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
  opt.opt_state = nnx.data(to_opt_state(new))
  ```

  Args:
    optax_state: A plain Optax state (concrete arrays, as restored by Orbax
      into ``jax.eval_shape`` of the plain optimizer's ``init``).
    tx: The optax_q transform to resume with, e.g. ``optax_q.adamw(...)``.
    params: The parameters (or their ``jax.ShapeDtypeStruct`` leaves where
      ``tx.init`` takes them), from which ``tx.init`` builds the template.
    count: The steps already taken, for the wrappers' counters; None: read
      from ``optax_state``.

  Returns:
    The state of ``tx``.

  Raises:
    ValueError: if ``tx`` is not a gradient transformation, ``count`` is
      not an int in ``[0, 2**31 - 1]`` (the wrappers' int32 counters),
      ``optax_state`` already holds optax_q state, or its structure, shapes
      or dtypes do not fit the template (the message names the first path
      that differs and both sides).

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> params = {'w': jnp.ones((4, 256))}
    >>> plain = optax.adamw(1e-3).init(params)
    >>> tx = optax_q.adamw(1e-3, min_size=0)
    >>> state = optax_q.from_optax(plain, tx, params)
    >>> sorted(optax_q.quantized_leaves(state))
    ['0/inner_state/mu/w', '0/inner_state/nu/w']

  References:
    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022
  """
  validation.check_transform(tx, 'tx')
  if count is not None:
    # The wrappers count in int32.
    count = validation.check_int(count, 'count', high=2**31 - 1,
                                 traced=True)
  _check_plain(optax_state)
  template = tx.init(params)
  like = to_optax(jax.tree.map(_abstract, template))
  found = _difference(optax_state, like, ())
  if found is not None:
    raise ValueError(
        f'optax_state does not fit the state of tx: {found}. from_optax takes '
        'the state of the plain Optax optimizer that tx quantizes (that of '
        'optax.adamw for optax_q.adamw, ...), built on the same params; '
        'restore a checkpoint of it into its abstract state (without a '
        'target Orbax gives dicts and lists).')
  return _fill(template, optax_state, count)


def _abstract(x: Any) -> Any:
  return jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x))

