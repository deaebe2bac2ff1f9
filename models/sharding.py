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
"""Logical-axis sharding rules, meshes and sharded initialisation.

Every parameter of the models in this package is annotated with logical axis
names through :func:`flax.linen.with_logical_partitioning`:

=========== ===================================================
``vocab``   token vocabulary (embedding rows, output-head columns)
``embed``   model width ``d_model``
``mlp``     hidden width of feed-forward layers
``heads``   attention heads
``kv``      per-head width
``length``  positions (learned positional embedding)
``patch``   flattened pixels of one image patch (ViT)
``classes`` output classes (ViT, MLP)
``batch``   the batch axis of activations and inputs
=========== ===================================================

:func:`logical_rules` maps these names onto a mesh with axes
``('data', 'model')``. The same model then runs data-parallel (``'data'``),
tensor-parallel in the Megatron style (``'model'``), or tensor-parallel with
the width also split over ``'data'`` (``'fsdp'``).
"""

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

MESH_AXES = ('data', 'model')
LOGICAL_AXES = (
    'batch', 'vocab', 'embed', 'mlp', 'heads', 'kv', 'length', 'patch',
    'classes',
)

_TENSOR_PARALLEL = {'vocab': 'model', 'mlp': 'model', 'heads': 'model'}


def logical_rules(mode: str = 'data') -> LogicalRules:
  """Logical-axis rules for a mesh with axes ``('data', 'model')``.

  Args:
    mode: ``'data'``: parameters replicated, batch split over ``'data'``.
      ``'model'``: batch split over ``'data'``; ``vocab``, ``mlp`` and
      ``heads`` split over ``'model'`` (column/row-parallel layers).
      ``'fsdp'``: as ``'model'``, and ``embed`` also split over ``'data'``
      (parameters and optimizer state sharded on both mesh axes).

  Returns:
    A tuple of ``(logical_name, mesh_axis_or_None)`` pairs covering every
    logical name used by the models in this package.

  Examples:
    >>> from models import sharding
    >>> dict(sharding.logical_rules('model'))['mlp']
    'model'
  """
  if mode not in ('data', 'model', 'fsdp'):
    raise ValueError(
        f"mode must be 'data', 'model' or 'fsdp', got {mode!r}")
  table = {name: None for name in LOGICAL_AXES}
  table['batch'] = 'data'
  if mode in ('model', 'fsdp'):
    table.update(_TENSOR_PARALLEL)
  if mode == 'fsdp':
    table['embed'] = 'data'
  return tuple(table.items())


def make_mesh(
    data: int | None = None,
    model: int = 1,
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """A ``('data', 'model')`` mesh with ``Auto`` axes (GSPMD propagation).

  Args:
    data: size of the ``'data'`` axis; by default all devices not used by
      ``model``.
    model: size of the ``'model'`` axis.
    devices: devices to use; by default ``jax.devices()`` (all processes).

  Returns:
    A :class:`jax.sharding.Mesh`.
  """
  devices = list(jax.devices() if devices is None else devices)
  if data is None:
    if len(devices) % model:
      raise ValueError(
          f'{len(devices)} devices do not split into model={model}')
    data = len(devices) // model
  if data * model > len(devices):
    raise ValueError(
        f'mesh ({data}, {model}) needs {data * model} devices, '
        f'only {len(devices)} available')
  grid = np.asarray(devices[:data * model]).reshape(data, model)
  return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 2)


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Sharding for inputs: leading (batch) axis split over ``'data'``."""
  return NamedSharding(mesh, P('data'))


def replicated(mesh: Mesh) -> NamedSharding:
  """A fully replicated sharding on ``mesh``."""
  return NamedSharding(mesh, P())


def _init_fn(
    model: nn.Module, example_input: Any,
) -> Callable[[jax.Array], Any]:
  def init(rng):
    return model.init(rng, example_input)['params']
  return init


def abstract_params(model: nn.Module, example_input: Any, *, seed: int = 0):
  """Boxed abstract parameters (``nn.LogicallyPartitioned`` of shapes)."""
  return jax.eval_shape(_init_fn(model, example_input), jax.random.key(seed))


def param_logical_specs(model: nn.Module, example_input: Any) -> Any:
  """Per-parameter ``PartitionSpec`` of *logical* axis names (unboxed tree)."""
  return nn.get_partition_spec(abstract_params(model, example_input))


def init_params(model: nn.Module, example_input: Any, *, seed: int = 0) -> Any:
  """Initialise ``model`` on the default device; returns unboxed params."""
  init = _init_fn(model, example_input)
  return jax.jit(lambda rng: nn.meta.unbox(init(rng)))(jax.random.key(seed))


def init_sharded(
    model: nn.Module,
    example_input: Any,
    mesh: Mesh,
    rules: LogicalRules,
    *,
    seed: int = 0,
) -> tuple[Any, Any]:
  """Initialise ``model`` directly into its shardings on ``mesh``.

  The values equal those of :func:`init_params` with the same seed: the
  sharding is only a layout.

  Args:
    model: a Flax Linen module whose params carry logical annotations.
    example_input: an input batch used to trace ``model.init``; only its
      shape and dtype matter.
    mesh: a mesh with axes ``('data', 'model')`` (see :func:`make_mesh`).
    rules: logical-axis rules, e.g. ``logical_rules('model')``.
    seed: PRNG seed for the initialisers.

  Returns:
    ``(params, param_shardings)``: plain (unboxed) pytrees of ``jax.Array``
    and of :class:`jax.sharding.NamedSharding` with the same structure.

  Examples:
    >>> import jax.numpy as jnp
    >>> from models import gpt, sharding
    >>> model = gpt.GPT(d_model=32, num_layers=1, num_heads=2, max_len=8)
    >>> mesh = sharding.make_mesh(1, 1)
    >>> params, shardings = sharding.init_sharded(
    ...     model, jnp.zeros((1, 8), jnp.int32), mesh,
    ...     sharding.logical_rules('data'))
  """
  init = _init_fn(model, example_input)
  rng = jax.random.key(seed)
  boxed = jax.eval_shape(init, rng)
  logical = nn.get_partition_spec(boxed)
  shardings = nn.logical_to_mesh_sharding(logical, mesh, rules)
  params = jax.jit(
      lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(rng)
  return params, shardings


# A pytree node that carries a sharding as static aux data. Optimizer `init`
# functions map over params leaf by leaf, so a boxed param yields boxed state:
# this is how the state learns which param it belongs to (the same trick as
# MaxText's `get_abstract_state` with Linen's `LogicallyPartitioned`).
class _ShardingBox:
  __slots__ = ('value', 'sharding')

  def __init__(self, value, sharding):
    self.value = value
    self.sharding = sharding


jax.tree_util.register_pytree_node(
    _ShardingBox,
    lambda b: ((b.value,), b.sharding),
    lambda sharding, children: _ShardingBox(children[0], sharding),
)


def _fits(sharding: jax.sharding.Sharding, leaf: Any) -> bool:
  shape = getattr(leaf, 'shape', None)
  if shape is None:
    return False
  try:
    sharding.shard_shape(tuple(shape))
  except Exception:  # pylint: disable=broad-except
    return False
  return True


def opt_state_shardings(
    tx: Any,
    params: Any,
    param_shardings: Any,
    mesh: Mesh,
) -> Any:
  """Shardings for ``tx.init(params)`` that follow the params' shardings.

  Each param is wrapped in a box carrying its sharding and ``tx.init`` is
  traced with :func:`jax.eval_shape`. State built by mapping over params
  (moments, quantized containers such as ``QArray``) inherits the sharding
  of its param; every leaf of a container gets it. Leaves outside any box
  (step counts), and leaves the param's sharding cannot split evenly (e.g.
  a block-scale axis not divisible by the mesh), are replicated.

  Plain ``jax.jit(tx.init)`` does not do this: sharding propagation does not
  reach constants such as ``zeros_like(param)``, so the state would come out
  replicated (checked with jax 0.10.2).

  Args:
    tx: an ``optax.GradientTransformation``.
    params: params or their abstract shapes.
    param_shardings: a tree of shardings with the structure of ``params``.
    mesh: the mesh (used for the replicated fallback).

  Returns:
    A tree of shardings with the structure of ``tx.init(params)``.
  """
  rep = replicated(mesh)
  boxed = jax.tree.map(
      lambda p, s: _ShardingBox(jax.ShapeDtypeStruct(p.shape, p.dtype), s),
      params, param_shardings)
  try:
    abstract = jax.eval_shape(tx.init, boxed)
  except Exception:  # pylint: disable=broad-except
    # The transform's init does not accept boxes (it looks inside params);
    # fall back to a replicated state.
    abstract = jax.eval_shape(tx.init, params)
    return jax.tree.map(lambda _: rep, abstract)

  def leaf_shardings(node):
    if isinstance(node, _ShardingBox):
      return jax.tree.map(
          lambda l: node.sharding if _fits(node.sharding, l) else rep,
          node.value)
    return rep

  return jax.tree.map(
      leaf_shardings, abstract,
      is_leaf=lambda x: isinstance(x, _ShardingBox))
