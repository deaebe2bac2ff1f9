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
"""Helpers shared by the tests: gradients, jitted runs, tree comparisons."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax


def grads(step: int, params: dict[str, Any], *, seed: int = 1
          ) -> dict[str, jax.Array]:
  """Standard-normal gradients for a dict of parameters, one key per name.

  The leaves get ``fold_in(fold_in(key(seed), step), i)`` in sorted-name
  order, so a run's gradients do not depend on how the dict was built.
  """
  key = jax.random.fold_in(jax.random.key(seed), step)
  return {name: jax.random.normal(jax.random.fold_in(key, i), p.shape)
          for i, (name, p) in enumerate(sorted(params.items()))}


def step_fn(tx: optax.GradientTransformation):
  """``(params, state, grads) -> (params, state)``: one update, applied."""

  def step(params, state, g):
    updates, state = tx.update(g, state, params)
    return optax.apply_updates(params, updates), state

  return step


def run(tx: optax.GradientTransformation, params, grads_list):
  """Jitted init and updates over ``grads_list``: (params, state, updates)."""
  state = jax.jit(tx.init)(params)

  @jax.jit
  def step(params, state, g):
    updates, state = tx.update(g, state, params)
    return optax.apply_updates(params, updates), state, updates

  all_updates = []
  for g in grads_list:
    params, state, updates = step(params, state, g)
    all_updates.append(updates)
  return params, state, all_updates


def assert_trees_equal(a, b, *, dtypes: bool = False) -> None:
  """Same tree structure and leaves equal bit for bit (and dtypes, if asked).

  Float leaves are compared as values (``NaN`` equals ``NaN``); use
  :func:`assert_bits_equal` where ``-0.0`` and ``0.0`` must differ.
  """
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, (ta, tb)
  for x, y in zip(la, lb, strict=True):
    if dtypes:
      assert x.dtype == y.dtype, (x.dtype, y.dtype)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def bits(x) -> np.ndarray:
  """The bit pattern of an array (floats as unsigned ints of their width)."""
  x = np.asarray(x)
  if np.issubdtype(x.dtype, np.floating) or x.dtype.kind == 'V':
    return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32,
                   8: np.uint64}[x.dtype.itemsize])
  return x


def assert_bits_equal(a, b) -> None:
  """Same tree structure and every leaf equal bit for bit."""
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, (ta, tb)
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_array_equal(bits(x), bits(y))


def assert_same_types(a, b) -> None:
  """Same structure, shapes and dtypes (values aside)."""
  la, ta = jax.tree.flatten(a)
  lb, tb = jax.tree.flatten(b)
  assert ta == tb, (ta, tb)
  for x, y in zip(la, lb, strict=True):
    assert (tuple(x.shape), x.dtype) == (tuple(y.shape), y.dtype), (x, y)


def grads_cycled(step: int, params) -> Any:
  """Normal gradients whose scale cycles 1, 2, 3 with the step (any tree)."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step),
                          len(leaves))
  return treedef.unflatten(
      [jax.random.normal(k, p.shape) * (1 + step % 3)
       for k, p in zip(keys, leaves)])


def save(path, tree) -> None:
  """Saves ``tree`` with Orbax's standard checkpointer."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, tree)


def restore(path, abstract):
  """Restores a tree saved by :func:`save` into ``abstract``'s layout."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  with ocp.StandardCheckpointer() as ckptr:
    return ckptr.restore(path, abstract)


def nnx_adaptive_adamw():
  """An ``nnx.Linear(64, 128)``, an NNX optimizer of AdamW with adaptive
  bits (a decision every step) and its jitted training step on ``x``."""
  from flax import nnx  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  import optax_q  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  model = nnx.Linear(64, 128, rngs=nnx.Rngs(0))
  tx = optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(), period=1, patience=1,
                            min_size=0, block_size=32, elementwise=True),
      optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(1e-3))
  opt = nnx.Optimizer(model, tx, wrt=nnx.Param)

  @nnx.jit
  def step(model, opt, x):
    grads = nnx.grad(lambda m: (m(x) ** 2).mean())(model)
    opt.update(model, grads)

  return model, opt, step

