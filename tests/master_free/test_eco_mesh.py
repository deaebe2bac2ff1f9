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
"""Quantized parameters and ECO on a 4x2 mesh of 8 simulated CPU devices.

Quantized parameters are sharded like the plain ones (codes and scales
take the parameter's ``PartitionSpec``), and sharded runs equal the
unsharded run bit for bit, on Auto and Explicit meshes.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402

LAYOUT = {
    'fc_in': {'kernel': ((128, 256), P('data', 'model'))},
    'fc_out': {'kernel': ((256, 128), P(('data', 'model'), None))},
    'ln': {'scale': ((128,), P('model'))},
}


def _params():
  key = jax.random.key(0)
  leaves, treedef = jax.tree.flatten(
      LAYOUT, is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2
      and isinstance(x[1], P))
  return treedef.unflatten([
      jax.random.normal(jax.random.fold_in(key, i), shape) * 0.1
      for i, (shape, _) in enumerate(leaves)])


def _shardings(mesh):
  return jax.tree.map(lambda x: NamedSharding(mesh, x[1]), LAYOUT,
                      is_leaf=lambda x: isinstance(x, tuple) and len(x) == 2
                      and isinstance(x[1], P))


def _tx(mu, rounding):
  inner = optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-2),
                      'fp8_e4m3', rounding=rounding)
  if mu is None:
    return inner
  return optax_q.quantize_state(inner, {'mu': mu, 'nu': 'ue4m0'},
                                min_size=0, block_size=32)


def _step(tx):
  def step(qp, st, i):
    w = optax_q.dequantize_params(qp)
    g = jax.tree.map(lambda x: jnp.sin(x * (1.0 + i)), w)
    up, st = tx.update(g, st, qp)
    return optax_q.apply_updates(qp, up), st
  return step


class EcoMeshTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  @parameterized.named_parameters(
      ('explicit_sr_int8', AxisType.Explicit, 'int8', 'stochastic'),
      ('auto_rn_fp32_moments', AxisType.Auto, None, 'nearest'),
  )
  def test_sharded_equals_unsharded(self, axis_type, mu, rounding):
    self._check_sharded_equals_unsharded(axis_type, mu, rounding)

  # Stochastic rounding with int8 moments runs on Explicit axes above, and
  # Auto axes with the fp32 moments' ECO run.
  @parameterized.named_parameters(
      ('auto_sr_int8', AxisType.Auto, 'int8', 'stochastic'),
  )
  @pytest.mark.slow
  def test_sharded_equals_unsharded_slow(self, axis_type, mu, rounding):
    self._check_sharded_equals_unsharded(axis_type, mu, rounding)

  def _check_sharded_equals_unsharded(self, axis_type, mu, rounding):
    mesh = jax.make_mesh((4, 2), ('data', 'model'),
                         axis_types=(axis_type, axis_type))
    tx = _tx(mu, rounding)
    qparams = optax_q.quantize_params(_params(), 'fp8_e4m3')
    plain = _shardings(mesh)
    # Quantized parameters take their parameter's sharding: codes and
    # scales, as optimizer state does.
    param_shardings = optax_q.state_shardings(qparams, plain)
    state_shardings = optax_q.state_shardings(
        jax.eval_shape(tx.init, qparams), plain)
    step = _step(tx)
    p = jax.device_put(qparams, param_shardings)
    s = jax.jit(tx.init, out_shardings=state_shardings)(p)
    sharded_step = jax.jit(step, out_shardings=(param_shardings,
                                                state_shardings))
    q, st = qparams, jax.jit(tx.init)(qparams)
    plain_step = jax.jit(step)
    for i in range(4):
      p, s = sharded_step(p, s, i)
      q, st = plain_step(q, st, i)
    helpers.assert_bits_equal((p, s), (q, st))
    w = p['fc_in']['kernel']
    self.assertTrue(optax_q.is_qarray(w))
    self.assertEqual(w.codes.sharding.spec, P('data', 'model'))
    self.assertEqual(w.scale.sharding.spec, P('data', None))
    self.assertEqual(w.codes.addressable_shards[0].data.shape, (32, 128))



if __name__ == '__main__':
  absltest.main()
