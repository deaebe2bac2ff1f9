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
"""``quantize_state``: any Optax transform with low-precision state.

The wrapper keeps the inner transform's state as :class:`QArray` leaves.
Every ``update`` decodes the state, runs the inner update in float32,
returns the updates computed from the float32 moments, and encodes the new
state for storage (error enters only at write-back). Which leaves are
quantized, and how, is decided at ``init`` from static information only
(field names, global shapes), so the jitted step is one compiled function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
import dataclasses
import math
from typing import Any, NamedTuple, Union

import jax
import jax.numpy as jnp
import optax

from optax_q._src import formats as formats_lib
from optax_q._src import leafwise
from optax_q._src import qarray as qarray_lib
from optax_q._src import rounding as rounding_lib

Format = formats_lib.Format
QArray = qarray_lib.QArray

FormatSpec = Union[
    str, Format, Mapping[str, Union[str, Format, None]],
    Callable[[str, jax.Array], Union[str, Format, None]], None]

# State fields that hold non-negative statistics (second moments): signed
# codebooks are swapped for their unsigned variant there, and an unsigned
# format is only accepted there.
NONNEGATIVE_FIELDS = frozenset({
    'nu', 'v', 'sum_of_squares', 'grad_sum_of_squares', 'nu_hat',
    'exp_avg_sq', 'acc', 'e_g', 'e_x', 'v_row', 'v_col',
})


class QuantizedState(NamedTuple):
  """State of :func:`quantize_state`.

  Attributes:
    count: Steps taken (int32); mixed into the stochastic-rounding bits.
    inner_state: The inner transform's state, with quantized leaves held as
      :class:`QArray`.
    stalled: Same structure as ``inner_state`` with a float32 scalar per
      quantized leaf (the fraction of elements whose stored code did not
      change in the last step; read with ``optax_q.stall_fraction``) and
      ``None`` elsewhere.
  """

  count: jax.Array
  inner_state: optax.OptState
  stalled: Any


def path_str(path) -> str:
  """A readable ``a/b/c`` name for a pytree key path."""
  parts = []
  for k in path:
    if isinstance(k, jax.tree_util.GetAttrKey):
      parts.append(k.name)
    elif isinstance(k, jax.tree_util.DictKey):
      parts.append(str(k.key))
    elif isinstance(k, jax.tree_util.SequenceKey):
      parts.append(str(k.idx))
    else:
      parts.append(str(k))
  return '/'.join(parts)


def field_name(path, root: Any = None) -> str | None:
  """The innermost state field (``GetAttrKey``) on ``path``, e.g. ``'mu'``.

  With ``root`` (the tree ``path`` indexes), the ``value`` attribute of a
  box around a leaf, such as a Flax NNX ``Variable`` or a Linen
  ``Partitioned``, is not taken for a field: under ``nnx.Optimizer`` the
  path of a first moment is ``mu/<param path>/value``.
  """
  name = None
  node = root
  for k in path:
    if isinstance(k, jax.tree_util.GetAttrKey) and not (
        root is not None and k.name == 'value' and not _is_namedtuple(node)):
      name = k.name
    node = _child(node, k)
  return name


def _is_namedtuple(x) -> bool:
  return isinstance(x, tuple) and hasattr(x, '_fields')


def _child(node, key):
  """``node``'s child at ``key``, or None when it can't be resolved."""
  try:
    if isinstance(key, jax.tree_util.GetAttrKey) and _is_namedtuple(node):
      return getattr(node, key.name)
    if isinstance(key, jax.tree_util.DictKey) and isinstance(node, dict):
      return node[key.key]
    if isinstance(key, jax.tree_util.SequenceKey) and isinstance(
        node, (list, tuple)):
      return node[key.idx]
    # Other nodes (boxes, dataclasses): look the key up among the children,
    # without attribute access (which Flax deprecates for ``.value``).
    for path, child in jax.tree_util.tree_flatten_with_path(
        node, is_leaf=lambda y: y is not node)[0]:
      if path == (key,):
        return child
  except Exception:  # pylint: disable=broad-except
    pass
  return None


def _field_names(state) -> set[str]:
  names = set()
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    if _is_float_array(leaf):
      name = field_name(path, state)
      if name is not None:
        names.add(name)
  return names


def _is_box(x) -> bool:
  """Whether ``x`` is a box around one float array, as an ``nnx.Variable``.

  A box is a pytree node other than a NamedTuple, a container or a
  :class:`QArray`, whose only child is a float array under the attribute
  ``value`` (Flax NNX ``Variable``, Linen ``Partitioned``).
  """
  if (x is None or _is_namedtuple(x) or qarray_lib.is_qarray(x)
      or isinstance(x, (list, tuple, dict, jax.Array, jax.ShapeDtypeStruct))
      or jax.tree_util.all_leaves([x])):
    return False
  children = jax.tree_util.tree_flatten_with_path(
      x, is_leaf=lambda y: y is not x)[0]
  return (len(children) == 1
          and children[0][0] == (jax.tree_util.GetAttrKey('value'),)
          and _is_float_array(children[0][1]))


def _buffer_bytes(x) -> int:
  if x is None:
    return 0
  return math.prod(x.shape) * jnp.dtype(x.dtype).itemsize


def _rebox(box, value):
  """``box`` with its one child replaced by ``value`` (metadata kept)."""
  return jax.tree.structure(box).unflatten([value])


def _is_float_array(x) -> bool:
  return (hasattr(x, 'shape') and hasattr(x, 'dtype')
          and jnp.issubdtype(x.dtype, jnp.floating))


def _check_formats(formats: FormatSpec) -> FormatSpec:
  """Resolves format names early (a ValueError names the bad argument)."""
  if formats is None or callable(formats) and not isinstance(formats, Format):
    return formats
  if isinstance(formats, (str, Format)):
    return formats_lib.check_format(formats, 'formats')
  if isinstance(formats, Mapping):
    out = {}
    for key, fmt in formats.items():
      if not isinstance(key, str):
        raise ValueError(
            f'formats keys must be state field names (str), got {key!r}.')
      fmt = (None if fmt is None
             else formats_lib.check_format(fmt, f'formats[{key!r}]'))
      if fmt is not None and not fmt.signed and key not in NONNEGATIVE_FIELDS:
        raise ValueError(
            f'formats[{key!r}]={fmt.name!r} is unsigned, but {key!r} is a '
            'signed state field; unsigned formats are allowed for '
            f'{sorted(NONNEGATIVE_FIELDS)}.')
      out[key] = fmt
    return out
  raise ValueError(
      'formats must be a format name, a Format, a dict {field: format} or a '
      f'callable (path, leaf) -> format, got {type(formats).__name__}.')


def probe_state(inner: optax.GradientTransformation) -> Any:
  """``inner``'s abstract state on a small probe tree, or None if unknown."""
  probe = {'w': jax.ShapeDtypeStruct((8, 8), jnp.float32)}
  try:
    return jax.eval_shape(inner.init, probe)
  except Exception:  # pylint: disable=broad-except
    return None


def check_known_fields(argname: str, names, known: set[str] | None,
                       kind: str) -> None:
  """Raises if ``names`` holds fields the probed state lacks (``known``)."""
  if known is None:
    return
  unknown = sorted(set(names) - known)
  if unknown:
    raise ValueError(
        f'{argname} names unknown state field(s) {unknown}; the state of '
        f'this transform has {kind} fields {sorted(known)}.')


def _probe_fields(inner: optax.GradientTransformation) -> set[str] | None:
  """Field names of ``inner``'s state on a probe tree, or None if unknown."""
  state = probe_state(inner)
  return None if state is None else _field_names(state)


def _leaf_format(formats, path, leaf, root=None) -> Format | None:
  """The format of one state leaf, or None to keep it as it is."""
  name = field_name(path, root)
  if formats is None:
    return None
  if isinstance(formats, Format):
    fmt = formats
  elif isinstance(formats, Mapping):
    fmt = formats.get(name)
  else:
    fmt = formats(path_str(path), leaf)
    fmt = None if fmt is None else formats_lib.get_format(fmt)
  if fmt is None:
    return None
  if name in NONNEGATIVE_FIELDS:
    fmt = formats_lib.unsigned_variant(fmt)
  elif not fmt.signed:
    raise ValueError(
        f'format {fmt.name!r} is unsigned but state leaf '
        f'{path_str(path)!r} may be negative; use a signed format there.')
  return fmt


def _check_rounding(rounding: Any) -> str | dict[str, str]:
  """A rounding name, or a dict {field: rounding name}, checked early."""
  if isinstance(rounding, Mapping):
    out = {}
    for key, mode in rounding.items():
      if not isinstance(key, str):
        raise ValueError(
            f'rounding keys must be state field names (str), got {key!r}.')
      out[key] = formats_lib.check_rounding(mode, f'rounding[{key!r}]')
    return out
  return formats_lib.check_rounding(rounding)


def check_storage_args(*, rounding: Any, block_size: Any, seed: Any,
                       min_size: Any) -> tuple[Any, int, int, int]:
  """Checks the storage arguments of :func:`quantize_state`.

  Returns ``(rounding, block_size, seed, min_size)``, the numbers as Python
  ints; a ValueError names the bad argument and the allowed values.
  """
  hint = formats_lib.STATIC_HINT
  return (_check_rounding(rounding),
          formats_lib.check_block_size(block_size),
          formats_lib.check_seed(seed, hint=hint),
          formats_lib.check_int(min_size, 'min_size', hint=hint))


def leaf_rounding(rounding: str | Mapping[str, str],
                  field: str | None) -> str:
  """The rounding of a leaf of ``field`` (unlisted fields: stochastic)."""
  if isinstance(rounding, Mapping):
    return rounding.get(field, 'stochastic')
  return rounding


def quantize_state(
    inner: optax.GradientTransformation,
    formats: FormatSpec = 'int8_dynamic',
    *,
    rounding: str | Mapping[str, str] = 'stochastic',
    seed: int = 0,
    min_size: int = 4096,
    block_size: int = 128,
    scale: str | None = None,
    track_stalls: bool = True,
    elementwise: bool = False,
    tile_size: int | None = 2**18,
) -> optax.GradientTransformationExtraArgs:
  """Keeps the state of ``inner`` in low-precision formats.

  ``update`` decodes the stored state to float32, runs ``inner.update``,
  returns the updates it computed from the float32 state, and encodes the
  new state for storage with the chosen rounding. Which leaves are
  quantized is decided once, at ``init``: float leaves of the inner state
  that have at least ``min_size`` elements (counted on the global shape, so
  sharding does not change the decision), a format other than ``fp32``, and
  whose codes and scales take fewer bytes than the leaf (not so for block
  scales along a last axis of one or two elements).
  Everything else (counters, small leaves, biases and norms of small models)
  is kept as the inner transform made it.

  Second-moment fields (``nu``, ``sum_of_squares``, ... see
  ``NONNEGATIVE_FIELDS``) use the unsigned variant of a codebook format
  (``int8_dynamic`` becomes the unsigned dynamic map, as in bitsandbytes);
  an unsigned format such as ``fp4_e2m2u`` is rejected on a signed field.

  Args:
    inner: Any Optax gradient transformation.
    formats: One format for every quantizable leaf (a name or
      :class:`Format`), a dict ``{field: format}`` keyed by the state field
      (``'mu'``, ``'nu'``, ``'trace'``, ...; unlisted fields stay as they
      are), or a callable ``(path, leaf) -> format or None`` where ``path``
      is the leaf's ``'a/b/c'`` name in the inner state.
    rounding: ``'nearest'`` (round half to even) or ``'stochastic'``
      (unbiased, from a counter-based hash of seed, step, leaf and element),
      or a dict ``{field: rounding}`` such as ``{'mu': 'nearest', 'nu':
      'stochastic'}`` (unlisted fields round stochastically).
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``.
    min_size: Leaves with fewer elements stay unquantized (bitsandbytes uses
      4096).
    block_size: Elements per scale along the last axis for block scaling,
      an even int in ``[2, 2**20]``.
    scale: ``'block'``, ``'row'``, ``'tensor'`` or ``'none'``; the default is
      ``'block'`` for formats with a narrow range and ``'none'`` for ``bf16``
      and ``fp16``.
    track_stalls: Keep the per-leaf stalled fraction of the last step in the
      state (one float32 scalar per quantized leaf).
    elementwise: Declares that ``inner`` is elementwise: each parameter's
      new state and update depend only on that parameter's gradient, state
      and value and on shared scalars (``scale_by_adam``, ``scale_by_lion``,
      ``trace``; not ``scale_by_adafactor`` or global-norm clipping). The
      update then runs one parameter at a time, large ones in tiles of
      rows, so that no float32 copy of the whole state is ever alive, and
      the update is left to fuse into ``apply_updates``; the new state is
      that of the whole-tree path, the updates agree with it to float32
      rounding. The drop-in
      optimizers set it. A state not laid out per parameter (or codes held
      in ``nnx.Variable`` boxes) takes the whole-tree path.
    tile_size: With ``elementwise``, the most elements per tile of a large
      parameter (whole rows along its first axis); None turns tiling off.

  Returns:
    A gradient transformation whose state is a :class:`QuantizedState`.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax_q.quantize_state(optax.scale_by_adam(),
    ...                             formats={'mu': 'int8', 'nu': 'int8_dynamic'},
    ...                             min_size=0)
    >>> state = tx.init({'w': jnp.zeros((4, 256))})
    >>> optax_q.state_nbytes(state) < 2 * 4 * 4 * 256
    True

  References:
    Dettmers et al, `8-bit Optimizers via Block-wise Quantization
    <https://arxiv.org/abs/2110.02861>`_, 2022

    Li et al, `Memory Efficient Optimizers with 4-bit States
    <https://arxiv.org/abs/2309.01507>`_, 2023
  """
  if not (callable(getattr(inner, 'init', None))
          and callable(getattr(inner, 'update', None))):
    raise ValueError(
        'inner must be an Optax GradientTransformation (with init and '
        f'update), got {type(inner).__name__}.')
  formats = _check_formats(formats)
  rounding, block_size, seed, min_size = check_storage_args(
      rounding=rounding, block_size=block_size, seed=seed, min_size=min_size)
  if scale is not None:
    scale = formats_lib.check_scale(scale)
  elementwise = formats_lib.check_bool(elementwise, 'elementwise')
  track_stalls = formats_lib.check_bool(track_stalls, 'track_stalls')
  if tile_size is not None:
    tile_size = formats_lib.check_int(
        tile_size, 'tile_size', low=1, what='a positive int or None')
  if isinstance(formats, Mapping) or isinstance(rounding, Mapping):
    known = _probe_fields(inner)
    if isinstance(formats, Mapping):
      check_known_fields('formats', formats, known, 'float')
    if isinstance(rounding, Mapping):
      check_known_fields('rounding', rounding, known, 'float')

  def encode_new(x, fmt, scale_mode, key):
    return qarray_lib.encode(
        x, fmt, scale_mode=scale_mode, block_size=block_size, key=key)

  def init_fn(params):
    state = inner.init(params)

    def quantize_leaf(path, leaf):
      box = None
      if _is_box(leaf):  # e.g. an nnx.Variable: quantize what it holds
        box, leaf = leaf, jax.tree.leaves(leaf)[0]
        path = (*path, jax.tree_util.GetAttrKey('value'))
      if not _is_float_array(leaf) or leaf.size < max(min_size, 1):
        return leaf if box is None else box
      fmt = _leaf_format(formats, path, leaf, state)
      if fmt is None or fmt.is_identity:
        return leaf if box is None else box
      scale_mode = scale or qarray_lib.default_scale_mode(fmt)
      qarray_lib._check_layout(fmt, scale_mode)  # pylint: disable=protected-access
      q = encode_new(leaf, fmt, scale_mode, None)
      if _buffer_bytes(q.codes) + _buffer_bytes(q.scale) >= _buffer_bytes(
          leaf):
        # Blocks along a very short last axis (a (n, 1) kernel has one scale
        # per element): the "quantized" leaf would be bigger. Keep it.
        return leaf if box is None else box
      if box is not None:
        # The box (with its metadata, e.g. a sharding) goes around the codes
        # and around the scales, never around the QArray: the codes and
        # scales have the param's rank, and Flax NNX's ``nnx.update`` would
        # turn a QArray held in a Variable into a plain State.
        q = dataclasses.replace(
            q, codes=_rebox(box, q.codes),
            scale=None if q.scale is None else _rebox(box, q.scale))
      return q

    qstate = jax.tree_util.tree_map_with_path(
        quantize_leaf, state, is_leaf=_is_box)
    stalled = None
    if track_stalls:
      # The stalled fractions are telemetry, not a copy of the parameters:
      # where ``optax.tree_map_params`` passed its parameters placeholder,
      # one scalar stands in for it, so that they are mapped as the other
      # non-parameters are (their ``None`` holes match no parameter tree).
      stalled = jax.tree.map(
          lambda x: jnp.zeros([], jnp.float32)
          if _is_params_placeholder(x) else x,
          _stall_tree(qstate, None), is_leaf=_is_params_placeholder)
    return QuantizedState(
        count=jnp.zeros([], jnp.int32), inner_state=qstate, stalled=stalled)

  def update_fn(updates, state, params=None, **extra_args):
    old = state.inner_state
    inner_update = optax.with_extra_args_support(inner).update
    flat_old, treedef = jax.tree.flatten(old, is_leaf=qarray_lib.is_qarray)
    fields = [field_name(path, old) for path, _ in
              jax.tree_util.tree_flatten_with_path(
                  old, is_leaf=qarray_lib.is_qarray)[0]]

    def rounding_for(index):
      return leaf_rounding(rounding, fields[index])

    def key_for(index):
      if rounding_for(index) != 'stochastic':
        return None
      return rounding_lib.stream_key(seed, state.count, index)

    result = None
    if elementwise:
      result = leafwise.update(
          inner_update, updates, old, params, extra_args, key_for=key_for,
          rounding_for=rounding_for, block_size=block_size,
          tile_size=tile_size, track_stalls=track_stalls)
    if result is not None:
      new_updates, new_qstate, stall_at = result
      stalled = None
      if track_stalls:
        stalled = treedef.unflatten([
            stall_at[i] if qarray_lib.is_qarray(o) else None
            for i, o in enumerate(flat_old)])
    else:
      decoded = treedef.unflatten([
          leafwise.decode_for_inner(o, rounding_for(i))
          for i, o in enumerate(flat_old)])
      new_updates, new_inner = inner_update(
          updates, decoded, params, **extra_args)
      flat_new = treedef.flatten_up_to(new_inner)
      out = []
      for index, (o, n) in enumerate(zip(flat_old, flat_new)):
        if qarray_lib.is_qarray(o):
          n = qarray_lib.encode(
              jnp.asarray(n, jnp.float32), o.fmt, scale_mode=o.scale_mode,
              block_size=o.block_size or block_size, key=key_for(index),
              dtype=o.dtype)
        out.append(n)
      new_qstate = treedef.unflatten(out)
      stalled = _stall_tree(new_qstate, old) if track_stalls else None
    new_updates = jax.tree.map(
        lambda u, g: u if g is None or u is None else u.astype(g.dtype),
        new_updates, updates, is_leaf=lambda x: x is None)
    return new_updates, QuantizedState(
        count=optax.safe_increment(state.count), inner_state=new_qstate,
        stalled=stalled)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _is_params_placeholder(x) -> bool:
  """Whether ``x`` is what ``optax.tree_map_params`` passes for the params."""
  return type(x).__name__ == '_ParamsPlaceholder'


def _stall_tree(new, old):
  """Per-quantized-leaf stalled fractions (zeros at init), None elsewhere."""
  if old is None:
    return jax.tree.map(
        lambda x: jnp.zeros([], jnp.float32) if qarray_lib.is_qarray(x)
        else None, new, is_leaf=qarray_lib.is_qarray)
  return jax.tree.map(
      lambda n, o: leafwise.stall(o, n) if qarray_lib.is_qarray(n) else None,
      new, old, is_leaf=qarray_lib.is_qarray)


def quantized_leaves(state) -> dict[str, QArray]:
  """All :class:`QArray` leaves of any state, by ``'a/b/c'`` path."""
  flat = jax.tree_util.tree_flatten_with_path(
      state, is_leaf=qarray_lib.is_qarray)[0]
  return {path_str(p): x for p, x in flat if qarray_lib.is_qarray(x)}
