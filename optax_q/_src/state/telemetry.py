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
"""Memory accounting and staleness telemetry of optimizer states."""

from __future__ import annotations

import math
from typing import Any

import jax

from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.state import state_tree
from optax_q._src.state import transform


def state_nbytes(state: Any) -> int:
  """Real bytes held by the buffers of ``state`` (any pytree).

  Quantized leaves count their codes and scales as stored (4-bit codes are
  packed two per byte); counters and telemetry scalars are included. Works
  on concrete arrays and on ``jax.eval_shape`` output alike.

  Args:
    state: Any pytree of arrays or ``jax.ShapeDtypeStruct``.

  Returns:
    The bytes, a Python int.

  Examples:
    >>> import jax, jax.numpy as jnp, optax_q
    >>> tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='int4',
    ...                    min_size=0)
    >>> optax_q.state_nbytes(jax.eval_shape(tx.init, {'w': jnp.ones((4, 256))}))
    1096
  """
  return sum(qarray_lib.nbytes_of(x) for x in jax.tree.leaves(state))


def _moment_leaves(state: Any):
  """(elements, bytes, quantized) per state moment buffer (rank >= 1)."""
  out = []
  for x in jax.tree.leaves(state, is_leaf=lambda y: qarray_lib.is_qarray(y)
                           or state_tree.is_telemetry(y)):
    if state_tree.is_telemetry(x):
      continue  # Statistics kept per leaf (adaptive bit-widths), not moments.
    if qarray_lib.is_qarray(x) and x.ndim >= 1:
      out.append((x.size, state_nbytes(x), True))  # Boxed codes too.
    elif state_tree.is_float_array(x) and len(x.shape) >= 1:
      out.append((math.prod(x.shape), qarray_lib.nbytes_of(x), False))
  return out


def state_bits_per_element(state: Any, *, quantized_only: bool = False
                           ) -> float:
  """Stored bits per moment element: moment bytes * 8 / moment elements.

  Moment buffers are the float leaves of rank >= 1 (quantized or not);
  scalar counters and telemetry are left out. An 8-bit block-128 state with
  float32 scales gives 8.25, a 4-bit one 4.25, float32 exactly 32.

  Args:
    state: Any optimizer state.
    quantized_only: Count only the quantized leaves.

  Returns:
    Bits per element, a Python float (NaN when there are no moments).

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> state = optax_q.adamw(1e-3, min_size=0).init({'w': jnp.ones((4, 256))})
    >>> optax_q.state_bits_per_element(state)
    8.25
  """
  quantized_only = validation.check_bool(quantized_only, 'quantized_only')
  leaves = [l for l in _moment_leaves(state) if l[2] or not quantized_only]
  elements = sum(l[0] for l in leaves)
  if not elements:
    return float('nan')
  return 8.0 * sum(l[1] for l in leaves) / elements


def stall_fraction(state: Any) -> dict[str, jax.Array]:
  """Stalled fraction of every quantized state leaf in the last step.

  The fraction of elements whose stored code did not change in the last
  update (zero right after ``init``), one float32 scalar per quantized leaf,
  keyed by the leaf's ``'a/b/c'`` path inside the wrapped transform's state
  (e.g. ``'0/inner_state/0/mu/w'``). The scalars are computed inside the
  update when the state was made with ``track_stalls=True`` (the default of
  [`quantize_state`][optax_q.quantize_state]; the drop-in optimizers such as
  [`adamw`][optax_q.adamw] take it as an argument, off by default, since
  comparing every code is one more pass over the state); leaves without them are
  left out. Works on any state that contains ``quantize_state`` states, inside
  chains, masks and partitions.

  Args:
    state: Any optimizer state.

  Returns:
    ``{path: float32 scalar}``, one entry per tracked quantized leaf.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.adamw(1e-3, min_size=0, track_stalls=True)
    >>> state = tx.init({'w': jnp.ones((2, 256))})
    >>> sorted(optax_q.stall_fraction(state))
    ['0/mu/w', '0/nu/w']

  References:
    Understanding Quantization of Optimizer States in LLM Pre-training:
    Dynamics of State Staleness and Effectiveness of State Resets, 2026
    (arXiv 2603.16731)
  """
  out = {}
  is_qstate = lambda x: isinstance(x, transform.QuantizedState)
  nodes = jax.tree_util.tree_flatten_with_path(state, is_leaf=is_qstate)[0]
  for path, node in nodes:
    if not is_qstate(node) or node.stalled is None:
      continue
    prefix = state_tree.path_str(path)
    for p, v in jax.tree_util.tree_flatten_with_path(node.stalled)[0]:
      name = state_tree.path_str(p)
      out[f'{prefix}/{name}' if prefix else name] = v
  return out
