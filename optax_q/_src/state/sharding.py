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

A `QArray` keeps the rank of its parameter (codes: the param's shape,
4-bit codes with the last axis halved; scales: the last axis divided into
blocks), so the parameter's ``PartitionSpec`` applies to its codes and to its
scales unchanged, as long as every sharded axis still divides by its mesh
axes after blocking and packing. Where it does not, that axis of that buffer
is replicated (or, with ``strict=True``, a ``ValueError`` says which leaf and
which axis). On a mesh with ``Explicit`` axes, ``init`` and ``update`` give
their state exactly these shardings.

``shard_over`` splits the state further, over mesh axes the parameters do
not use (ZeRO-1: replicated parameters, state split over the data-parallel
axis), in whole blocks, on the first axis of each buffer that divides;
``jax.jit``'s ``in_shardings`` and ``out_shardings`` then keep it split
between steps. ``memory_kind`` places it in another memory between steps
(``'pinned_host'``: host offload).

``optax.tree_utils.tree_map_params(tx, f, state)`` maps ``f`` over every
codes and scales buffer of a quantized state, but it can't pair them with a
tree shaped like the parameters (``tree_map_params(tx, f, state, specs)``):
a QArray holds two buffers where that tree has one leaf, a pytree structure
error. With ``is_leaf=optax_q.is_qarray``, ``f`` gets the whole QArray and
the parameter's leaf, and must give the codes and the scales theirs itself.
`state_shardings` is the way to derive a quantized state's shardings
from the parameters'.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import explicit
from optax_q._src.core import validation
from optax_q._src.state import state_tree


# State fields that hold a transform's constants, not per-parameter buffers
# (Muon's Newton-Schulz coefficients): replicated, never stray.
CONSTANT_FIELDS = ('ns_coeffs',)


def _report(sharding: NamedSharding, out: NamedSharding, shape, *,
            problems: list[str] | None, what: str):
  """Adds to ``problems`` each axis of ``shape`` that ``out`` replicates
  where ``sharding`` shards it (axes reduced to length 1 are fine)."""
  if problems is None or len(sharding.spec) > len(shape):
    return
  for axis, (dim, axes, got) in enumerate(
      zip(shape, sharding.spec, out.spec)):
    if axes is not None and got is None and dim != 1:
      problems.append(
          f'{what}: axis {axis} has {dim} entries, which mesh axes {axes!r} '
          f'(size {explicit.axes_size(sharding.mesh, axes)}) do not divide')


def _unused(sharding: NamedSharding, axes: tuple[str, ...]
            ) -> tuple[str, ...]:
  """The mesh ``axes`` that ``sharding``'s spec does not use."""
  used = {a for entry in sharding.spec for a in explicit.spec_names(entry)}
  return tuple(a for a in axes if a not in used)


def _leaf_sharding(leaf, sharding, *, problems, what, shard_over=()):
  """The sharding of one buffer (a QArray: of its codes and scales), with
  the mesh axes ``shard_over`` that ``sharding`` leaves free added on one
  of its axes (``problems`` lists the buffers where none takes them)."""
  if leaf is None:
    return None
  extra = _unused(sharding, shard_over)
  if qarray_lib.is_qarray(leaf):
    codes, scale = leaf.codec.shardings(leaf.shape, sharding, extra)
    _report(sharding, codes, leaf.codes.shape, problems=problems,
            what=f'{what} (codes)')
    if scale is not None and not leaf.codec.replicated_scales:
      _report(sharding, scale, leaf.scale.shape, problems=problems,
              what=f'{what} (scales)')
    _report_spread(codes, leaf.codes.shape, extra, problems=problems,
                   what=what, block_size=leaf.codec.block_size)
    return dataclasses.replace(leaf, codes=codes, scale=scale)
  if hasattr(leaf, 'shape'):
    out = explicit.fit(sharding, leaf.shape)
    _report(sharding, out, leaf.shape, problems=problems, what=what)
    if extra:
      out = (explicit.spread([(out, leaf.shape)], extra) or [out])[0]
      _report_spread(out, leaf.shape, extra, problems=problems, what=what)
    return out
  return leaf  # MaskedNode and other empty nodes.


def _report_spread(out: NamedSharding, shape, axes: tuple[str, ...], *,
                   problems: list[str] | None, what: str,
                   block_size: int = 0):
  """Adds to ``problems`` a buffer of more than one element that ``out``
  does not shard over the mesh ``axes``."""
  if problems is None or not axes or math.prod(shape) <= 1 or not _unused(
      out, axes):
    return
  blocks = f' in whole blocks of {block_size}' if block_size else ''
  problems.append(
      f'{what}: no axis of its {list(shape)} buffer divides evenly{blocks} '
      f'over mesh axes {axes!r} (size {explicit.axes_size(out.mesh, axes)})'
      f' on top of the parameter\'s spec')


def _is_buffer(x) -> bool:
  """Whether ``x`` is a per-parameter buffer: a QArray or a float array of
  rank >= 1 (step counters, keys and telemetry scalars are not)."""
  if qarray_lib.is_qarray(x):
    return True
  return (hasattr(x, 'shape') and hasattr(x, 'dtype') and len(x.shape) >= 1
          and jnp.issubdtype(x.dtype, jnp.floating))


def _describe(x) -> str:
  if qarray_lib.is_qarray(x):
    return f'a QArray of shape {x.shape}'
  return f'a {jnp.dtype(x.dtype).name}{list(x.shape)} array'


def _check_param_shardings(param_shardings):
  """The leaves and their paths, after checking that they can be used."""
  if param_shardings is None:
    raise ValueError(
        'param_shardings is None; pass the parameters\' shardings, a tree of '
        'jax.sharding.NamedSharding with the parameters\' structure.')
  flat = jax.tree_util.tree_flatten_with_path(
      param_shardings, is_leaf=lambda x: x is None)[0]
  for path, s in flat:
    if not isinstance(s, NamedSharding):
      hint = ''
      if isinstance(s, PartitionSpec):
        hint = ' Wrap each spec as NamedSharding(mesh, spec).'
      elif s is None:
        hint = (' Give every parameter a sharding (NamedSharding(mesh, P()) '
                'replicates it).')
      raise ValueError(
          'param_shardings must be a tree of jax.sharding.NamedSharding, '
          f'but param_shardings{jax.tree_util.keystr(path)} is {s!r}.'
          + hint)
  if not flat:
    raise ValueError(
        'param_shardings must be a non-empty tree of '
        f'jax.sharding.NamedSharding, got {param_shardings!r}.')
  path0, s0 = flat[0]
  for path, s in flat[1:]:
    if s.mesh != s0.mesh:
      raise ValueError(
          'All param_shardings must be on one mesh, but '
          f'param_shardings{jax.tree_util.keystr(path0)} is on {s0.mesh} '
          f'and param_shardings{jax.tree_util.keystr(path)} on {s.mesh}.')
  return flat


def state_shardings(
    state: Any,
    param_shardings: Any,
    *,
    strict: bool = False,
    shard_over: str | tuple[str, ...] | None = None,
    memory_kind: str | None = None,
) -> Any:
  """``NamedSharding``s for every buffer of ``state``, from the params'.

  Every subtree of ``state`` laid out like the parameters (``mu``, ``nu``,
  ``trace``, masked copies with ``MaskedNode`` holes, a dict of per-
  parameter statistics, ...) takes the parameters' shardings: a plain array
  takes its parameter's sharding, a [`QArray`][optax_q.QArray] gives it to its
  codes and to its scales. A parameter's slot may also hold buffers of other
  shapes, or a subtree of them (preconditioner factors, say); each takes
  the parameter's ``PartitionSpec`` axis by axis, the same rule as codes
  and scales: an axis whose length the mesh axes do not divide is
  replicated, and a buffer of lower rank than its parameter is replicated
  whole. Everything else (step counters, telemetry scalars, statistics not
  keyed by parameter, constants of the transform such as Muon's
  Newton-Schulz coefficients ``ns_coeffs``) is replicated over the same
  mesh.

  This is how to derive a quantized state's shardings: Optax's
  ``tree_map_params`` can't pair a QArray's two buffers with one leaf of a
  parameter-shaped tree.

  Args:
    state: The optimizer state, concrete or abstract (from
      ``jax.eval_shape(tx.init, params)``).
    param_shardings: A tree of ``jax.sharding.NamedSharding``, all on one
      mesh, with the parameters' structure (or one ``NamedSharding`` when
      the parameters are one array).
    strict: For a layout meant to shard every state buffer as its
      parameter: instead of replicating quietly, raise one ``ValueError``
      naming each axis of a state buffer that can't be sharded like its
      parameter's (a block count, a packed length or a preconditioner grid
      that the mesh axes do not divide) and each buffer (a QArray or a
      float array of rank >= 1, not a constant of the transform) outside
      every subtree laid out like the parameters (buffers of parameters
      missing from ``param_shardings``). Every optimizer and wrapper of the
      library passes on a layout whose sharded axes divide. Axes of length
      1 are not counted: a Shampoo/SOAP grid of one block is replicated
      without an error (a smaller ``max_preconditioner_dim`` shards it).
      With ``shard_over``, also each buffer of more than one element that
      no axis lets the extra mesh axes split.
    shard_over: None, or a mesh axis name (or a tuple of them) to split
      every per-parameter state buffer over as well, the parameter's
      sharding aside: ZeRO-1 over a data-parallel axis that replicated
      parameters do not use, or on top of tensor-parallel shardings. The
      extra axes go on one axis of each buffer: the first whose length
      they (combined with the mesh axes the parameter already shards it
      over) divide evenly, codes and scales of a QArray on the same axis,
      and on the blocks' axis (the last) only whole blocks per device
      (its length divides by ``block_size`` times the devices there).
      A buffer that no axis divides (a ``(7,)`` bias, a single block) is
      left as its parameter has it: this JAX version rejects uneven
      shardings. A parameter whose spec already uses one of the axes
      (FSDP: sharded over ``'data'`` itself) is not split over that axis
      again. Replicated state (step counters, telemetry) stays replicated.
    memory_kind: None (each buffer in its parameter's sharding's memory,
      replicated state in device memory), or the memory every state buffer
      is placed in between steps, one of the mesh devices' memory kinds
      (e.g. ``'pinned_host'`` to offload the state to host memory; the
      step then moves it to the device with ``jax.device_put`` to the
      shardings this function gives without ``memory_kind``, or with
      ``memory_kind='device'`` where the parameters' shardings name
      another memory).

  Returns:
    A tree like ``state`` (QArrays included) with ``NamedSharding`` leaves,
    for ``jax.jit(..., in_shardings=..., out_shardings=...)`` or
    ``jax.device_put``.

  Raises:
    ValueError: ``param_shardings`` is not a non-empty tree of
      ``NamedSharding`` on one mesh; or no subtree of ``state`` is laid out
      like it although ``state`` holds buffers (the tree does not match the
      parameters); ``strict`` is not a bool; ``shard_over`` names no axis
      of the mesh, or one twice; ``memory_kind`` is not a memory kind of
      the mesh's devices; or, with ``strict``, as described above.

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

    ZeRO-1: parameters replicated, the state split over ``'data'`` too:

    >>> mesh = jax.make_mesh((1, 1), ('data', 'model'))
    >>> shardings = optax_q.state_shardings(
    ...     abstract, {'w': NamedSharding(mesh, P(None, 'model'))},
    ...     shard_over='data')
    >>> shardings[0].inner_state.mu['w'].codes.spec
    P('data', 'model')
  """
  flat = _check_param_shardings(param_shardings)
  mesh = flat[0][1].mesh
  ctx = _Context(
      jax.tree.structure(param_shardings), [s for _, s in flat],
      [jax.tree_util.keystr(p) for p, _ in flat],
      [] if validation.check_bool(strict, 'strict') else None, [], [],
      _check_shard_over(shard_over, mesh))
  _check_memory_kind(memory_kind, mesh)
  out = _visit(state, '', ctx)
  if ctx.stray and not ctx.matched:
    # Buffers, but no subtree laid out like the parameters.
    path, x = ctx.stray[0]
    names = ctx.names
    params_like = ', '.join(names[:4]) + (', ...' if len(names) > 4 else '')
    raise ValueError(
        f'state{path} is {_describe(x)}, but no subtree of the state is laid '
        f'out like param_shardings, whose leaves are {params_like} '
        f'({len(names)} in all). Pass the shardings of the parameters the '
        'state was initialised from, in their structure.')
  if ctx.problems or (strict and ctx.stray):
    # Strict mode: every buffer, or axis of one, that the rule does not
    # shard like its parameter.
    lines = list(ctx.problems) + [
        f'state{path} is {_describe(x)}, but it lies outside the subtrees '
        'laid out like param_shardings '
        f'({", ".join(f"state{m}" for m in ctx.matched[:3])})'
        for path, x in ctx.stray]
    raise ValueError(
        f'state_shardings(strict=True): {len(lines)} state buffer(s) or '
        'axes would not be sharded like their parameters:\n'
        + '\n'.join(f'  {line}' for line in lines) + '\n'
        'For an axis: pick a block_size (Shampoo and SOAP factors: a '
        'max_preconditioner_dim) so that the number of blocks divides the '
        'mesh axes (4-bit codes: half the axis must divide). For a buffer '
        'outside the parameters\' subtrees: pass the shardings of the '
        'parameters the state was initialised from. Or pass strict=False to '
        'replicate them (with shard_over: to keep them as their parameters '
        'have them).')
  if memory_kind is not None:
    out = jax.tree.map(lambda s: s.with_memory_kind(memory_kind), out)
  return out


def _check_shard_over(shard_over, mesh) -> tuple[str, ...]:
  """``shard_over`` as a tuple of the mesh's axis names (() for None)."""
  if shard_over is None:
    return ()
  axes = (shard_over,) if isinstance(shard_over, str) else shard_over
  # An ordered sequence: the order of the axes is the order of the devices
  # (a set's differs between processes).
  axes = tuple(axes) if isinstance(axes, (tuple, list)) else None
  names = tuple(mesh.axis_names)
  if not axes or not all(isinstance(a, str) for a in axes):
    raise ValueError(
        'shard_over must be None, a mesh axis name or a tuple of them, got '
        f'{validation.short(shard_over)}; the mesh has axes {names}.')
  unknown = [a for a in axes if a not in names]
  if unknown or len(set(axes)) != len(axes):
    raise ValueError(
        f'shard_over={shard_over!r} must name distinct axes of the '
        f'parameters\' mesh, which has axes {names}'
        + (f'; {unknown[0]!r} is not one of them.' if unknown else '.'))
  return axes


def _check_memory_kind(memory_kind, mesh) -> None:
  """Raises unless ``memory_kind`` is None or one the mesh's devices have."""
  if memory_kind is None:
    return
  # An AbstractMesh has no devices to ask: NamedSharding checks the kind
  # against the default backend's devices, and so does this.
  concrete = isinstance(mesh, jax.sharding.Mesh) and mesh.devices.size
  device = mesh.devices.flat[0] if concrete else jax.local_devices()[0]
  kinds = tuple(m.kind for m in device.addressable_memories())
  if not isinstance(memory_kind, str) or memory_kind not in kinds:
    raise ValueError(
        f'memory_kind must be None or a memory kind of the mesh\'s devices '
        f'{kinds}, got {validation.short(memory_kind)}.')


class _Context(NamedTuple):
  """What `_visit` matches against, and what it found."""

  param_def: Any
  shardings: list[NamedSharding]
  names: list[str]  # The parameters' key strings.
  problems: list[str] | None  # Strict mode: what can't be placed.
  matched: list[str]  # Paths of the subtrees laid out like the parameters.
  stray: list[tuple[str, Any]]  # (path, leaf) of buffers outside them.
  shard_over: tuple[str, ...] = ()  # Mesh axes added to each buffer.

  @property
  def single(self) -> bool:
    return self.param_def.num_nodes == 1  # The params are one array.


def _is_leaf(x) -> bool:
  return qarray_lib.is_qarray(x) or jax.tree_util.all_leaves([x])


def _visit(  # pylint: disable=too-many-return-statements
    node, path: str, ctx: _Context):
  """Shardings of ``node`` at ``path`` (a key string) of the state."""
  if node is None:
    return None
  if ctx.single and _is_leaf(node):
    ctx.matched.append(path)
    return _leaf_sharding(node, ctx.shardings[0], problems=ctx.problems,
                          what=f'state{path}', shard_over=ctx.shard_over)
  # A subtree laid out like the parameters (one slot per parameter, and
  # buffers in the slots) takes their shardings, slot by slot: each buffer
  # or QArray of a slot (a leaf or a subtree) takes its parameter's.
  slots = None
  if not (ctx.single or _is_leaf(node)):
    try:
      slots = ctx.param_def.flatten_up_to(node)
    except (ValueError, TypeError):
      slots = None
  if slots is not None and any(
      qarray_lib.is_qarray(x) or hasattr(x, 'shape')
      or any(hasattr(y, 'shape') for y in jax.tree.leaves(x))
      for x in slots):
    ctx.matched.append(path)
    out = []
    for slot, sharding, name in zip(slots, ctx.shardings, ctx.names):
      flat, slot_def = jax.tree_util.tree_flatten_with_path(
          slot, is_leaf=qarray_lib.is_qarray)
      out.append(slot_def.unflatten([
          _leaf_sharding(x, sharding, problems=ctx.problems,
                         what=f'state{path}{name}' + jax.tree_util.keystr(p),
                         shard_over=ctx.shard_over)
          for p, x in flat]))
    return ctx.param_def.unflatten(out)
  rep = NamedSharding(ctx.shardings[0].mesh, PartitionSpec())
  if state_tree.is_telemetry(node):  # Per-leaf statistics: replicated.
    return jax.tree.map(lambda _: rep, node)
  if _is_leaf(node):
    # Outside the per-parameter subtrees: replicated. Its buffers are stray,
    # unless they are constants of the transform (the field is the
    # innermost attribute of the key string: ``.mu['w']``, mu).
    for p, x in jax.tree_util.tree_flatten_with_path(
        node, is_leaf=qarray_lib.is_qarray)[0]:
      where = path + jax.tree_util.keystr(p)
      fields = re.findall(r'\.(\w+)', where)
      if _is_buffer(x) and (
          fields[-1] if fields else None) not in CONSTANT_FIELDS:
        ctx.stray.append((where, x))
    if qarray_lib.is_qarray(node):
      return dataclasses.replace(
          node, codes=rep, scale=None if node.scale is None else rep)
    return jax.tree.map(lambda _: rep, node)
  children, node_def = jax.tree_util.tree_flatten_with_path(
      node, is_leaf=lambda y: y is not node)
  return node_def.unflatten([
      _visit(c, path + jax.tree_util.keystr(p), ctx) for p, c in children])
