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
"""Data- and tensor-parallel runs on a simulated 8-device CPU mesh.

XLA reads ``--xla_force_host_platform_device_count`` when the CPU backend is
first created, so the flag is set here, before jax is imported. pytest runs
all modules in one process: if another module initialised the backend first
(with fewer devices), these tests skip there, and ``SubprocessTest`` runs
them in a fresh process with 8 devices.
"""


# pylint: disable=g-import-not-at-top,wrong-import-position
import dataclasses  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402
from typing import NamedTuple  # noqa: E402

from absl.testing import absltest  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

from models import data  # noqa: E402
from models import gpt  # noqa: E402
from models import sharding  # noqa: E402
from models import train  # noqa: E402

STEPS = 4


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Blocked:
  """Block-scaled container (as optax_q's QArray): codes + per-block scale."""

  codes: jax.Array  # param shape.
  scale: jax.Array  # shape[:-1] + (shape[-1] // block,).
  block: int = dataclasses.field(default=8, metadata=dict(static=True))


class BlockedState(NamedTuple):
  """State of :func:`blocked_zeros`."""

  count: jax.Array  # shape=(), int32.
  mu: Any  # params-shaped tree of Blocked.


def blocked_zeros(block: int) -> optax.GradientTransformation:
  """Identity transform holding a blocked container per param."""

  def init_fn(params):
    def make(p):
      scale_shape = p.shape[:-1] + (p.shape[-1] // block,)
      return Blocked(jnp.zeros(p.shape, jnp.int8),
                     jnp.zeros(scale_shape, jnp.float32), block)
    return BlockedState(jnp.zeros([], jnp.int32), jax.tree.map(make, params))

  return optax.GradientTransformation(
      init_fn, lambda u, s, p=None: (u, s._replace(count=s.count + 1)))


class MeshTrainTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.corpus = data.stdlib_corpus(max_bytes=200_000)
    cls.model = gpt.GPT(d_model=32, num_layers=1, num_heads=4, max_len=16)
    cls.example = jnp.zeros((8, 16), jnp.int32)
    cls.batches = data.lm_batches(cls.corpus.train, 8, 16, seed=2)
    cls.tx = optax.adamw(3e-3, weight_decay=0.1)
    cls._reference = None

  def setUp(self):
    super().setUp()

  def reference(self):
    if MeshTrainTest._reference is None:
      params = sharding.init_params(self.model, self.example)
      MeshTrainTest._reference = train.train(
          self.model, params, self.tx, self.batches, steps=STEPS,
          progress=False)
    return MeshTrainTest._reference

  def test_data_parallel_matches_single_device(self):
    self.check_matches_single_device('data', (8, 1))

  def test_tensor_parallel_matches_single_device(self):
    self.check_matches_single_device('model', (2, 4))

  @pytest.mark.slow
  def test_fsdp_matches_single_device(self):
    self.check_matches_single_device('fsdp', (4, 2))

  def check_matches_single_device(self, mode, shape):
    mesh = sharding.make_mesh(*shape)
    params, shardings = sharding.init_sharded(
        self.model, self.example, mesh, sharding.logical_rules(mode))
    result = train.train(
        self.model, params, self.tx, self.batches, steps=STEPS, mesh=mesh,
        param_shardings=shardings, progress=False)
    ref = self.reference()
    # Same global batches; only the order of reductions differs.
    np.testing.assert_allclose(result.losses, ref.losses, rtol=1e-5)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), atol=1e-4),
        result.params, ref.params)
    # Params keep their shardings; Adam's moments follow them.
    jax.tree.map(
        lambda p, s: self.assertEqual(p.sharding, s), result.params, shardings)
    mu = result.opt_state[0].mu
    jax.tree.map(lambda m, s: self.assertEqual(m.sharding, s), mu, shardings)
    kernel = shardings['block_0']['mlp']['fc_in']['kernel']
    expected = dict(data=P(None, None), model=P(None, 'model'),
                    fsdp=P('data', 'model'))[mode]
    self.assertEqual(kernel.spec, expected)
    self.assertEqual(result.opt_state[0].count.sharding.spec, P())

  def test_tensor_parallel_resume_is_bit_identical(self):
    # Same mesh and rules as the tensor-parallel test: its compiled step is
  # reused.
    mesh = sharding.make_mesh(2, 4)
    params, shardings = sharding.init_sharded(
        self.model, self.example, mesh, sharding.logical_rules('model'))
    kw = dict(mesh=mesh, param_shardings=shardings, progress=False)
    straight = train.train(
        self.model, params, self.tx, self.batches, steps=STEPS, **kw)
    with tempfile.TemporaryDirectory() as tmp:
      train.train(self.model, params, self.tx, self.batches, steps=2,
                  ckpt_dir=tmp, **kw)
      resumed = train.train(self.model, params, self.tx, self.batches,
                            steps=STEPS, ckpt_dir=tmp, resume=True, **kw)
    self.assertEqual(resumed.start_step, 2)
    for a, b in zip(jax.tree.leaves(straight.opt_state),
                    jax.tree.leaves(resumed.opt_state)):
      self.assertEqual(a.sharding, b.sharding)
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(
        np.asarray(a), np.asarray(b)), straight.params, resumed.params)


class StateShardingTest(absltest.TestCase):

  def setUp(self):
    super().setUp()

  def test_custom_containers_follow_params(self):
    mesh = sharding.make_mesh(2, 4)
    params = {'w': jnp.zeros((16, 64)), 'b': jnp.zeros((64,))}
    spec = jax.sharding.NamedSharding(mesh, P(None, 'model'))
    param_shardings = {'w': spec,
                       'b': jax.sharding.NamedSharding(mesh, P('model'))}
    rep = sharding.replicated(mesh)
    # block 8: scale (16, 8) divides over model=4; block 32: (16, 2) does not.
    for block, scale_ok in ((8, True), (32, False)):
      tx = blocked_zeros(block)
      shardings = sharding.opt_state_shardings(
          tx, params, param_shardings, mesh)
      self.assertEqual(shardings.count, rep)
      self.assertEqual(shardings.mu['w'].codes, spec)
      self.assertEqual(shardings.mu['w'].scale, spec if scale_ok else rep)
      # The harness places the state with them.
      state = jax.jit(tx.init, out_shardings=shardings)(params)
      self.assertEqual(state.mu['w'].codes.sharding, spec)



if __name__ == '__main__':
  absltest.main()
