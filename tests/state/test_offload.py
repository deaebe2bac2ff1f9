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
"""The optimizer state offloaded to host memory between steps.

``state_shardings(..., memory_kind='pinned_host')`` places every buffer in
host memory (CPU devices have it too); the step moves the state to the
device with ``jax.device_put`` to the shardings without a memory kind,
updates it, and gives it back to host memory. After every step the state's
arrays say ``pinned_host``, and the result equals the on-device run bit for
bit.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import optax  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402

SHAPES = {'w': (64, 256), 'b': (7,)}


def _params():
  key = jax.random.key(0)
  return {k: jax.random.normal(jax.random.fold_in(key, i), s) * 0.1
          for i, (k, s) in enumerate(sorted(SHAPES.items()))}


def _run(tx, axis_type, *, offload, steps=2):
  """(params, state, kinds after init, compiled step text)."""
  mesh = jax.make_mesh((8,), ('data',), axis_types=(axis_type,))
  params = _params()
  param_shardings = {k: NamedSharding(mesh, P()) for k in SHAPES}
  abstract = jax.eval_shape(tx.init, params)
  on_device = optax_q.state_shardings(abstract, param_shardings,
                                      shard_over='data')
  stored = on_device
  if offload:
    stored = optax_q.state_shardings(abstract, param_shardings,
                                     shard_over='data',
                                     memory_kind='pinned_host')

  def step(p, state, g):
    state = jax.device_put(state, on_device)
    p, state = helpers.step_fn(tx)(p, state, g)
    return p, jax.device_put(state, stored)

  with jax.set_mesh(mesh):
    p = jax.device_put(params, param_shardings)
    state = jax.jit(tx.init, out_shardings=stored)(p)
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(state)}
    step = jax.jit(step, in_shardings=(param_shardings, stored,
                                       param_shardings),
                   out_shardings=(param_shardings, stored),
                   donate_argnums=(1,))
    text = step.lower(p, state, helpers.grads(0, params)).as_text()
    for i in range(steps):
      p, state = step(p, state, jax.device_put(helpers.grads(i, params),
                                               param_shardings))
  return p, state, kinds, text


class OffloadTest(parameterized.TestCase):

  def _check(self, tx, axis_type):
    p, state, kinds, text = _run(tx, axis_type, offload=True)
    self.assertEqual(kinds, {'pinned_host'})
    self.assertEqual({x.sharding.memory_kind for x in jax.tree.leaves(state)},
                     {'pinned_host'})
    # The compiled step moves the state in and out of host memory.
    self.assertIn('pinned_host', text)
    self.assertIn('annotate_device_placement', text)
    mu = state[0].inner_state.mu['w']
    mu = mu.codes if optax_q.is_qarray(mu) else mu
    self.assertEqual(mu.sharding.spec, P('data', None))  # And ZeRO-1.
    want = _run(tx, axis_type, offload=False)
    self.assertEqual({x.sharding.memory_kind for x in jax.tree.leaves(
        want[1])}, {'device'})
    self.assertNotIn('pinned_host', want[3])
    helpers.assert_trees_equal((p, state), want[:2])

  def test_int8_state_in_host_memory(self):
    self._check(optax_q.adamw(1e-2, mu_format='int8', nu_format='int8',
                              block_size=32, min_size=0), AxisType.Auto)

  @parameterized.named_parameters(
      ('int4_explicit', 'int4', AxisType.Explicit),
      ('fp32_auto', 'fp32', AxisType.Auto))
  @pytest.mark.slow
  def test_more(self, fmt, axis_type):
    self._check(optax_q.adamw(1e-2, mu_format=fmt, nu_format=fmt,
                              block_size=32, min_size=0), axis_type)

  @parameterized.named_parameters(('auto', AxisType.Auto),
                                  ('explicit', AxisType.Explicit))
  def test_relayout_of_an_offloaded_state(self, axis_type):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(axis_type,))
    params = _params()
    param_shardings = {k: NamedSharding(mesh, P()) for k in SHAPES}
    tx = optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0,
                               block_size=32)
    stored = optax_q.state_shardings(
        jax.eval_shape(tx.init, params), param_shardings, shard_over='data',
        memory_kind='pinned_host')
    state = jax.jit(tx.init, out_shardings=stored)(params)
    layout = dict(optax_q.bit_layout(state))
    for name in ('w', 'b'):
      layout[f'inner_state/inner_state/mu/{name}'] = 'int8_dynamic/block'
    new = optax_q.relayout(state, layout, param_shardings=param_shardings,
                           shard_over='data', memory_kind='pinned_host')
    self.assertEqual({x.sharding.memory_kind for x in jax.tree.leaves(new)},
                     {'pinned_host'})
    mu = new.inner_state.inner_state.mu['w']
    self.assertEqual(mu.fmt.name, 'int8_dynamic')
    self.assertEqual(mu.codes.sharding.spec, P('data', None))
    helpers.assert_trees_equal(
        new, optax_q.relayout(tx.init(params), layout))


class CheckpointTest(absltest.TestCase):

  def test_unsharded_checkpoint_resumes_split_and_offloaded(self):
    # Saved by a run on one device, restored into another configuration:
    # split over 'data' and in host memory, on an Explicit mesh; the
    # resumed step is the unsharded run's, bit for bit.
    tx = optax_q.adamw(1e-2, block_size=32, min_size=0)
    params = _params()
    step = jax.jit(helpers.step_fn(tx))
    p, state = params, tx.init(params)
    for i in range(2):
      p, state = step(p, state, helpers.grads(i, params))
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Explicit,))
    param_shardings = {k: NamedSharding(mesh, P()) for k in SHAPES}
    abstract = jax.eval_shape(tx.init, params)
    on_device = optax_q.state_shardings(abstract, param_shardings,
                                        shard_over='data')
    stored = optax_q.state_shardings(abstract, param_shardings,
                                     shard_over='data',
                                     memory_kind='pinned_host')
    path = os.path.join(tempfile.mkdtemp(), 'state')
    with ocp.StandardCheckpointer() as checkpointer:
      checkpointer.save(path, state)
    with ocp.StandardCheckpointer() as checkpointer:
      restored = checkpointer.restore(path, jax.tree.map(
          lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
          abstract, stored))
    helpers.assert_trees_equal(restored, state)
    self.assertEqual(restored[0].inner_state.mu['w'].codes.sharding.spec,
                     P('data', None))

    def offloaded(p, state, g):
      p, state = helpers.step_fn(tx)(p, jax.device_put(state, on_device), g)
      return p, jax.device_put(state, stored)

    with jax.set_mesh(mesh):
      got = jax.jit(offloaded, in_shardings=(param_shardings, stored,
                                             param_shardings),
                    out_shardings=(param_shardings, stored))(
                        jax.device_put(p, param_shardings), restored,
                        jax.device_put(helpers.grads(2, params),
                                       param_shardings))
    self.assertEqual({x.sharding.memory_kind for x in jax.tree.leaves(
        got[1])}, {'pinned_host'})
    helpers.assert_trees_equal(got, step(p, state, helpers.grads(2, params)))


if __name__ == '__main__':
  absltest.main()
