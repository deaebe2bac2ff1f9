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
"""optax_q.quant on a 4x2 mesh of 8 simulated devices, Auto and Explicit.

Data-parallel PTQ forward passes equal the unsharded ones bit for bit (QAT
and gradients: within float32 rounding, from matmuls compiled for the
shard's batch), and so do the quantizers on arrays sharded along the quantized axis
(round to nearest: the absolute maximum does not depend on the order of
the reduction). With kernels sharded over 'model' the plain model itself
differs from the unsharded one by float32 rounding (XLA:CPU partitions the
matmuls), and rounding to 16 levels turns some of those differences into
a level: that is asserted to come from the plain model.
"""


import functools  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
from optax_q import quant  # noqa: E402
import pytest  # noqa: E402

from models import gpt  # noqa: E402
from models import sharding  # noqa: E402

QUANTIZERS = {'off': quant.quantize_linear(), 'ptq': quant.ptq(4),
              'qat': quant.qat(4, hadamard_block=32)}


def _mesh(axis_type):
  return jax.make_mesh((4, 2), ('data', 'model'),
                       axis_types=(axis_type, axis_type))


@functools.cache
def _gpt():
  """The GPT, its tokens and its unsharded parameters (initialised once)."""
  model = gpt.GPT(d_model=64, num_layers=2, num_heads=4, max_len=32)
  tokens = jax.random.randint(jax.random.key(1), (8, 32), 0, 256)
  return model, tokens, sharding.init_params(model, tokens)


@functools.cache
def _sharded_gpt(mode):
  """The mesh and the GPT's parameters initialised into ``mode``'s rules."""
  model, tokens, _ = _gpt()
  mesh = _mesh(AxisType.Auto)
  params, _ = sharding.init_sharded(model, tokens, mesh,
                                    sharding.logical_rules(mode))
  return mesh, params


class MLP(nn.Module):

  @nn.compact
  def __call__(self, x):
    x = nn.gelu(nn.Dense(64, name='fc_in')(x))
    return nn.Dense(16, use_bias=False, name='fc_out')(x)


class QuantMeshTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  @parameterized.parameters('off', 'ptq', 'qat')
  def test_data_parallel_gpt_equals_unsharded(self, name):
    model, tokens, unsharded = _gpt()
    q = QUANTIZERS[name]
    fwd = jax.jit(lambda p, x: q(model.apply)({'params': p}, x))
    want = fwd(unsharded, tokens)
    mesh, params = _sharded_gpt('data')
    got = fwd(params, jax.device_put(tokens, NamedSharding(mesh, P('data'))))
    np.testing.assert_array_equal(got, want)

  # The default suite: PTQ on Auto axes and QAT on Explicit ones; the other
  # two pairs are slow.
  @parameterized.parameters(('ptq', AxisType.Auto), ('qat', AxisType.Explicit))
  def test_data_parallel_mlp_equals_unsharded(self, name, axis_type):
    self._check_data_parallel_mlp(name, axis_type)

  @parameterized.parameters(('ptq', AxisType.Explicit), ('qat', AxisType.Auto))
  @pytest.mark.slow
  def test_data_parallel_mlp_equals_unsharded_other_axes(self, name,
                                                          axis_type):
    self._check_data_parallel_mlp(name, axis_type)

  def _check_data_parallel_mlp(self, name, axis_type):
    model, q = MLP(), QUANTIZERS[name]
    x = jax.random.normal(jax.random.key(2), (16, 4, 32))
    params = model.init(jax.random.key(0), x)
    forward = jax.jit(q(model.apply))
    one = lambda p, x: jnp.sum(q(model.apply)(p, x[None]) ** 2)
    # Per-example gradients: no reduction over the sharded batch.
    grads = jax.jit(jax.vmap(jax.grad(one), in_axes=(None, 0)))
    want_out, want_grad = forward(params, x), grads(params, x)
    mesh = _mesh(axis_type)
    with jax.set_mesh(mesh):
      ps = jax.device_put(params, NamedSharding(mesh, P()))
      xs = jax.device_put(x, NamedSharding(mesh, P('data')))
      got_out, got_grad = forward(ps, xs), grads(ps, xs)
    if name == 'ptq':
      np.testing.assert_array_equal(got_out, want_out)
    else:
      # QuEST's Hadamard products are matmuls compiled for 2 examples per
      # device: float32 rounding of their own (the GPT test above happens
      # to be bit-identical).
      np.testing.assert_allclose(got_out, want_out, rtol=1e-5, atol=1e-6)
    # Compiled for 2 examples per device, the gradients' float32 products
    # accumulate in another order (as the plain model's do).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(
        a, b, rtol=1e-4, atol=1e-5), got_grad, want_grad)

  @parameterized.product(
      spec=(P('data', 'model'), P(None, ('data', 'model'))),
      axis_type=(AxisType.Auto, AxisType.Explicit),
      q=('rtn', 'rtn_tensor'))
  def test_quantizers_on_sharded_rows_equal_unsharded(self, spec, axis_type,
                                                      q):
    quantizer = {'rtn': quant.rtn(4),
                 'rtn_tensor': quant.rtn(3, granularity='tensor',
                                         grid='midtread')}[q]
    x = jax.random.normal(jax.random.key(3), (16, 64)) * jnp.linspace(
        0.1, 10, 64)
    want = jax.jit(quantizer.__call__)(x)
    mesh = _mesh(axis_type)
    with jax.set_mesh(mesh):
      xs = jax.device_put(x, NamedSharding(mesh, spec))
      got = jax.jit(quantizer.__call__)(xs)
      grad = jax.jit(jax.grad(lambda x: jnp.sum(quantizer(x) * x)))(xs)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        grad, jax.jit(jax.grad(lambda x: jnp.sum(quantizer(x) * x)))(x))

  def test_model_parallel_differences_come_from_the_plain_model(self):
    model, tokens, unsharded = _gpt()
    mesh, params = _sharded_gpt('model')
    xs = jax.device_put(tokens, NamedSharding(mesh, P('data')))
    for name in ('off', 'ptq'):
      q = QUANTIZERS[name]
      fwd = jax.jit(lambda p, x, q=q: q(model.apply)({'params': p}, x))
      diff = float(jnp.max(jnp.abs(fwd(params, xs) - fwd(unsharded, tokens))))
      if name == 'off':
        self.assertLess(diff, 1e-5)  # float32 rounding of the matmuls
      else:
        self.assertLess(diff, 0.5)   # some values one level away
    # The linear inputs of the sharded plain model are within float32
    # rounding of the unsharded ones.
    inputs = jax.jit(quant.linear_inputs(
        lambda p, x: model.apply({'params': p}, x)))
    for a, b in zip(jax.tree.leaves(inputs(params, xs)[1]),
                    jax.tree.leaves(inputs(unsharded, tokens)[1])):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)



if __name__ == '__main__':
  absltest.main()
