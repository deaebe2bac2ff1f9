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
"""State sharded over a data-parallel mesh axis (ZeRO-1), on 8 devices.

``state_shardings(..., shard_over='data')`` splits every quantized state
buffer over the 'data' axis, which the parameters do not use (replicated
parameters, or parameters sharded over 'model' only), in whole blocks: the
step under ``jax.jit`` with those shardings gives the unsharded run's
result, and each device holds an eighth of the state (a quarter on the
4 x 2 mesh), leaves that no axis divides aside.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402
import math  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402

# Replicated parameters on the ('data',) mesh: a matrix and a vector whose
# 32-element blocks divide by 8, and leaves that nothing divides (a (7,)
# bias, a (3, 5, 257) kernel, a scalar).
ZERO = {
    'w': ((64, 256), P()),
    'v': ((512,), P()),
    'b': ((7,), P()),
    'odd': ((3, 5, 257), P()),
    's': ((), P()),
}
# FSDP-like parameters on the ('data', 'model') mesh: one already sharded
# over 'data' (its state follows it), one over 'model' only (its state
# takes 'data' too), replicated ones.
FSDP = {
    'qkv': ((128, 256), P('data', 'model')),
    'out': ((256, 128), P(None, 'model')),
    'ln': ((256,), P()),
    'b': ((7,), P()),
}


def _mesh(layout, axis_type):
  if layout is ZERO:
    return jax.make_mesh((8,), ('data',), axis_types=(axis_type,))
  return jax.make_mesh((4, 2), ('data', 'model'),
                       axis_types=(axis_type, axis_type))


def _params(layout):
  key = jax.random.key(0)
  return {name: jax.random.normal(jax.random.fold_in(key, i), shape) * 0.1
          for i, (name, (shape, _)) in enumerate(sorted(layout.items()))}


def _reference(tx, params, steps):
  p, state = params, jax.jit(tx.init)(params)
  step = jax.jit(helpers.step_fn(tx))
  for i in range(steps):
    p, state = step(p, state, helpers.grads(i, params))
  return p, state


def _run(tx, layout, axis_type, *, steps=2, **kwargs):
  """The step under jit with ZeRO-1 state shardings: (params, state,
  state shardings, param shardings)."""
  mesh = _mesh(layout, axis_type)
  params = _params(layout)
  param_shardings = {n: NamedSharding(mesh, spec)
                     for n, (_, spec) in layout.items()}
  shardings = optax_q.state_shardings(
      jax.eval_shape(tx.init, params), param_shardings, shard_over='data',
      **kwargs)
  with jax.set_mesh(mesh):
    p = jax.device_put(params, param_shardings)
    state = jax.jit(tx.init, out_shardings=shardings)(p)
    step = jax.jit(helpers.step_fn(tx),
                   in_shardings=(param_shardings, shardings, param_shardings),
                   out_shardings=(param_shardings, shardings))
    for i in range(steps):
      p, state = step(p, state, jax.device_put(helpers.grads(i, params),
                                               param_shardings))
  return p, state, shardings, param_shardings


def device_nbytes(tree) -> int:
  """Bytes of ``tree``'s buffers on the first device."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(
      tree))


def _adamw(fmt):
  return optax_q.adamw(1e-2, mu_format=fmt, nu_format=fmt, block_size=32,
                       min_size=0)


OPTIMIZERS = {
    'adamw_int8': lambda: _adamw('int8'),
    'adamw_fp8': lambda: _adamw('fp8_e4m3'),
    'adamw_int4': lambda: _adamw('int4'),
    'adam': lambda: optax_q.adam(1e-2, block_size=32, min_size=0),
    'lion': lambda: optax_q.lion(1e-2, block_size=32, min_size=0),
    'sgd': lambda: optax_q.sgd(1e-2, momentum=0.9, block_size=32,
                               min_size=0),
    'muon': lambda: optax_q.muon(1e-2, block_size=32, min_size=0),
    'eco': lambda: optax_q.quantize_state(
        optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-2)),
        {'mu': 'int8', 'nu': 'int8'}, block_size=32, min_size=0),
    'adaptive_bits': lambda: optax.chain(
        optax_q.adaptive_bits(optax.scale_by_adam(), period=1, patience=1,
                              min_size=0, block_size=32, anneal_steps=2),
        optax.scale(-1e-2)),
    'shampoo': lambda: optax_q.shampoo(
        1e-2, max_preconditioner_dim=32, precondition_frequency=1,
        block_size=32, min_size=0),
    'soap': lambda: optax_q.soap(
        1e-2, max_preconditioner_dim=32, precondition_frequency=1,
        block_size=32, min_size=0),
}
