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
"""optax_q where users put it: Optax wrappers, Flax training loops, JAX APIs.

Every ``init`` and ``update`` runs under ``jax.jit``. Shapes are small, and
``min_size=0`` makes sure that every float state leaf really is quantized.
"""

import dataclasses

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

import optax_q

import helpers
from optax_q._src.state import transform

# Structural arguments of the drop-in optimizers: they decide the state
# layout, so optax.inject_hyperparams must keep them static.
STATIC_ARGS = ('mu_format', 'nu_format', 'rounding', 'block_size', 'seed',
               'min_size')


def _params(dtype=jnp.float32):
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
      'w': (jax.random.normal(k1, (16, 256)) * 0.1).astype(dtype),
      'b': (jax.random.normal(k2, (256,)) * 0.1).astype(dtype),
  }


def _grads(step, params):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step),
                          len(leaves))
  return treedef.unflatten(
      [jax.random.normal(k, p.shape, p.dtype) for k, p in zip(keys, leaves)])


def _assert_states_close(a, b):
  """Same layout; decoded values equal up to float32 rounding."""
  la, ta = jax.tree.flatten(a, is_leaf=optax_q.is_qarray)
  lb, tb = jax.tree.flatten(b, is_leaf=optax_q.is_qarray)
  assert ta == tb, (ta, tb)
  for x, y in zip(la, lb, strict=True):
    if optax_q.is_qarray(x):
      x, y = _decoded(x), _decoded(y)
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5,
                               atol=1e-7)


def _qleaves(state):
  return optax_q.quantized_leaves(state)


@jax.jit
def _dequantize(q):
  return optax_q.dequantize(q, jnp.float32)


def _decoded(q):
  return np.asarray(_dequantize(q))


class ChainTest(absltest.TestCase):

  def test_clip_and_decayed_weights_around_quantized_moments(self):
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax_q.quantize_state(optax.scale_by_adam(), formats='int8',
                               rounding='nearest', min_size=0),
        optax.add_decayed_weights(0.1),
        optax.scale(-1e-2),
    )
    params = _params()
    state0 = jax.jit(tx.init)(params)
    update = jax.jit(tx.update)
    huge = jax.tree.map(lambda g: g * 1e6, _grads(0, params))
    _, state = update(huge, state0, params)
    mu = _qleaves(state)
    self.assertEqual(set(mu), {'1/inner_state/mu/w', '1/inner_state/mu/b',
                               '1/inner_state/nu/w', '1/inner_state/nu/b'})
    # The moments saw clipped gradients: ||mu|| = (1 - b1) * 1.
    norm = np.sqrt(sum(np.sum(_decoded(mu[f'1/inner_state/mu/{k}']) ** 2)
                       for k in ('w', 'b')))
    np.testing.assert_allclose(norm, 0.1, rtol=1e-2)
    # Zero gradients give zero Adam directions (zero moments are stored
    # exactly), so the update is the weight decay alone.
    updates, state = update(jax.tree.map(jnp.zeros_like, params), state0,
                            params)
    for k in params:
      np.testing.assert_allclose(updates[k], -1e-3 * params[k], rtol=1e-6)
    self.assertEqual(int(state[1].count), 1)


class InjectHyperparamsTest(absltest.TestCase):

  def test_learning_rate_schedule(self):
    schedule = optax.piecewise_constant_schedule(1e-2, {2: 0.5, 3: 0.0})
    tx = optax.inject_hyperparams(optax_q.adamw, static_args=STATIC_ARGS)(
        learning_rate=schedule, mu_format='int8', nu_format='int8_dynamic',
        block_size=64, min_size=0)
    params = _params()
    grads = [_grads(i, params) for i in range(4)]
    _, state, updates = helpers.run(tx, params, grads)
    self.assertEqual(set(state.hyperparams),
                     {'learning_rate', 'b1', 'b2', 'eps', 'eps_root',
                      'weight_decay'})
    np.testing.assert_array_equal(state.hyperparams['learning_rate'], 0.0)
    # Step 3 ran at learning rate schedule(3) = 0: nothing moves.
    for k in params:
      np.testing.assert_array_equal(updates[3][k], 0.0)
      self.assertGreater(float(jnp.abs(updates[0][k]).max()), 0.0)
    q = _qleaves(state)['inner_state/0/inner_state/mu/w']
    self.assertEqual(q.scale.shape, (16, 4))  # block_size=64 honoured.
    # Same steps as the plain optimizer on the same schedule. Injected b1 and
    # b2 are traced float32 arrays, not Python floats, so the moments may
    # differ in their last bit and a stored code may round the other way at
    # a rounding boundary: a few elements may differ by one code step.
    _, _, want = helpers.run(
        optax_q.adamw(schedule, mu_format='int8', nu_format='int8_dynamic',
                      block_size=64, min_size=0), params, grads)
    for got_u, want_u in zip(updates, want):
      for k in params:
        close = np.isclose(got_u[k], want_u[k], rtol=1e-3, atol=1e-7)
        self.assertGreaterEqual(np.mean(close), 0.999, k)

  def test_traced_block_size_names_static_args(self):
    # Left out, block_size is None (static); given, it is injected.
    tx = optax.inject_hyperparams(
        optax_q.adamw, static_args=('min_size',))(learning_rate=1e-3,
                                                  block_size=64)
    with self.assertRaisesRegex(ValueError, 'block_size.*static_args'):
      jax.jit(tx.init)(_params())

  def test_injected_seed_is_hashed_as_it_is(self):
    # A seed sets no shape: injected (traced) it gives the same codes.
    params = _params()
    grads = [_grads(i, params) for i in range(2)]
    tx = optax.inject_hyperparams(
        optax_q.quantize_state, static_args=('min_size', 'tile_size'))(
            optax.scale_by_adam(), 'int8', seed=3, min_size=0)
    _, state, _ = helpers.run(tx, params, grads)
    _, want, _ = helpers.run(optax_q.quantize_state(
        optax.scale_by_adam(), 'int8', seed=3, min_size=0), params, grads)
    for a, b in zip(jax.tree.leaves(state.inner_state),
                    jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


class MultiStepsTest(absltest.TestCase):

  def test_accumulates_then_steps(self):
    inner = optax_q.adamw(1e-2, mu_format='fp8_e4m3', nu_format='int4',
                          min_size=0)
    tx = optax.MultiSteps(inner, every_k_schedule=2)
    params = {'w': _params()['w']}
    g = [_grads(i, params) for i in range(2)]
    # Each gradient twice: the accumulated mean equals it exactly.
    _, state, updates = helpers.run(tx, params, [g[0], g[0], g[1], g[1]])
    for k in params:
      np.testing.assert_array_equal(updates[0][k], 0.0)
      np.testing.assert_array_equal(updates[2][k], 0.0)
    _, want_state, want = helpers.run(inner, params, g)
    for k in params:
      np.testing.assert_array_equal(updates[1][k], want[0][k])
      # Compiled under MultiSteps' lax.cond, float32 results may differ in
      # the last bit.
      np.testing.assert_allclose(updates[3][k], want[1][k], rtol=1e-5,
                                 atol=1e-8)
    _assert_states_close(state.inner_opt_state, want_state)
    self.assertLen(_qleaves(state.inner_opt_state), 2)


class MaskedPartitionTest(absltest.TestCase):

  def test_masked(self):
    tx = optax.masked(
        optax_q.quantize_state(optax.scale_by_adam(), formats='int8',
                               min_size=0),
        {'w': True, 'b': False})
    params = _params()
    grads = [_grads(i, params) for i in range(2)]
    _, state, updates = helpers.run(tx, params, grads)
    inner = state.inner_state.inner_state
    self.assertTrue(optax_q.is_qarray(inner.mu['w']))
    self.assertTrue(optax_q.is_qarray(inner.nu['w']))
    self.assertIsInstance(inner.mu['b'], optax.MaskedNode)
    np.testing.assert_array_equal(updates[-1]['b'], grads[-1]['b'])
    _, _, want = helpers.run(
        optax_q.quantize_state(optax.scale_by_adam(), formats='int8',
                               min_size=0), {'w': params['w']},
        [{'w': g['w']} for g in grads])
    np.testing.assert_array_equal(updates[-1]['w'], want[-1]['w'])

  def test_partition(self):
    tx = optax.partition(
        {'q': optax_q.adamw(1e-2, min_size=0), 'f': optax.adamw(1e-2)},
        {'w': 'q', 'b': 'f'})
    params = _params()
    grads = [_grads(i, params) for i in range(3)]
    _, state, updates = helpers.run(tx, params, grads)
    self.assertEqual(
        set(_qleaves(state)),
        {'inner_states/q/inner_state/0/inner_state/mu/w',
         'inner_states/q/inner_state/0/inner_state/nu/w'})
    # The float32 part is exactly optax.adamw on its own.
    _, want_state, want = helpers.run(
        optax.adamw(1e-2), {'b': params['b']}, [{'b': g['b']} for g in grads])
    np.testing.assert_array_equal(updates[-1]['b'], want[-1]['b'])
    f_state = state.inner_states['f'].inner_state
    np.testing.assert_array_equal(f_state[0].mu['b'], want_state[0].mu['b'])
    np.testing.assert_array_equal(f_state[0].nu['b'], want_state[0].nu['b'])
    self.assertIsInstance(f_state[0].mu['w'], optax.MaskedNode)


class ApplyIfFiniteTest(absltest.TestCase):

  def test_nan_step_leaves_quantized_state_unchanged(self):
    tx = optax.apply_if_finite(
        optax_q.adamw(1e-2, mu_format='int4', nu_format='fp8_e4m3',
                      min_size=0), max_consecutive_errors=3)
    params = _params()
    state = jax.jit(tx.init)(params)
    update = jax.jit(tx.update)
    _, state = update(_grads(0, params), state, params)
    bad = _grads(1, params)
    bad['w'] = bad['w'].at[3, 7].set(jnp.nan)
    updates, new_state = update(bad, state, params)
    for k in params:
      np.testing.assert_array_equal(updates[k], 0.0)
    helpers.assert_trees_equal(new_state.inner_state, state.inner_state)
    self.assertEqual(int(new_state.notfinite_count), 1)
    self.assertLen(_qleaves(new_state), 4)
    # The next finite step goes on from the untouched state.
    _, after = update(_grads(2, params), new_state, params)
    self.assertEqual(int(after.inner_state[0].count), 2)
    self.assertEqual(int(after.notfinite_count), 0)


class WrappedOptimizersTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('muon', lambda: optax.contrib.muon(1e-2), {'mu': 'int8'}),
      ('lion', lambda: optax.lion(1e-3), 'int8_dynamic'),
  )
  def test_quantize_state(self, make, formats):
    params = _params()
    grads = [_grads(i, params) for i in range(3)]
    tx = optax_q.quantize_state(make(), formats=formats, min_size=0)
    _, state, updates = helpers.run(tx, params, grads)
    _, want_state, want = helpers.run(make(), params, grads)
    mus = {k: v for k, v in _qleaves(state).items() if '/mu/' in k}
    self.assertLen(mus, 2)
    # The first step starts from zero moments, which every format holds
    # exactly: the same updates as the unquantized optimizer (up to the last
    # bit of float32, from compiling Newton-Schulz in another program).
    for k in params:
      np.testing.assert_allclose(updates[0][k], want[0][k], rtol=1e-5,
                                 atol=1e-8)
    # Later, stored moments are the reference ones up to quantization error.
    want_mu = {transform.path_str(p): x for p, x in
               jax.tree_util.tree_flatten_with_path(want_state)[0]}
    for path, q in mus.items():
      ref = np.asarray(want_mu[path.removeprefix('inner_state/')])
      err = np.linalg.norm(_decoded(q) - ref) / np.linalg.norm(ref)
      self.assertLess(err, 0.05, path)


class FlaxTest(absltest.TestCase):

  def test_nnx_optimizer(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top

    class Model(nnx.Module):

      def __init__(self, rngs):
        self.l1 = nnx.Linear(8, 256, rngs=rngs)
        self.l2 = nnx.Linear(256, 1, rngs=rngs)

      def __call__(self, x):
        return self.l2(jax.nn.relu(self.l1(x)))

    x = jax.random.normal(jax.random.key(2), (32, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    tx = optax_q.adamw(1e-2, mu_format='fp8_e4m3', nu_format='int8_dynamic',
                       min_size=1024)  # The 8x256 kernel only.
    model = Model(nnx.Rngs(0))
    graphdef, params0 = nnx.split(model, nnx.Param)
    params0 = nnx.as_pure(params0)
    opt = nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(model)

    @nnx.jit
    def train_step(model, opt):
      loss, grads = nnx.value_and_grad(
          lambda m: jnp.mean((m(x) - y) ** 2))(model)
      opt.update(model, grads)
      return loss

    losses = [float(train_step(model, opt)) for _ in range(5)]
    self.assertLess(losses[-1], 0.5 * losses[0])
    kernel = opt.opt_state[0].inner_state.mu['l1']['kernel']
    self.assertTrue(optax_q.is_qarray(kernel))
    self.assertEqual(kernel.codes.get_value().dtype, jnp.float8_e4m3fn)
    self.assertEqual(kernel.scale.get_value().shape, (8, 2))
    bias = opt.opt_state[0].inner_state.mu['l1']['bias']
    self.assertFalse(optax_q.is_qarray(bias))
    self.assertEqual(bias.get_value().dtype, jnp.float32)
    # The same steps as a plain optax loop over the same parameters.
    def loss_fn(p):
      return jnp.mean((nnx.merge(graphdef, p)(x) - y) ** 2)

    params = params0
    state = jax.jit(tx.init)(params)

    @jax.jit
    def step(params, state):
      grads = jax.grad(loss_fn)(params)
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    for _ in range(5):
      params, state = step(params, state)
    got = nnx.as_pure(nnx.state(model, nnx.Param))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        got, params)

  def test_linen_train_state(self):
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    from flax.training import train_state  # pylint: disable=g-import-not-at-top

    class Model(nn.Module):

      @nn.compact
      def __call__(self, x):
        return nn.Dense(1)(jax.nn.relu(nn.Dense(256)(x)))

    x = jax.random.normal(jax.random.key(2), (32, 8))
    y = jnp.sin(x).sum(-1, keepdims=True)
    model = Model()
    params = jax.jit(model.init)(jax.random.key(0), x)['params']
    tx = optax_q.adamw(1e-2, nu_format='int4', min_size=1024)
    ts = jax.jit(lambda p: train_state.TrainState.create(
        apply_fn=model.apply, params=p, tx=tx))(params)

    def loss_fn(p):
      return jnp.mean((model.apply({'params': p}, x) - y) ** 2)

    @jax.jit
    def train_step(ts):
      loss, grads = jax.value_and_grad(loss_fn)(ts.params)
      return ts.apply_gradients(grads=grads), loss

    losses = []
    for _ in range(5):
      ts, loss = train_step(ts)
      losses.append(float(loss))
    self.assertLess(losses[-1], 0.5 * losses[0])
    self.assertEqual(int(ts.step), 5)
    q = ts.opt_state[0].inner_state.nu['Dense_1']['kernel']
    self.assertEqual(q.codes.shape, (8, 128))  # Two 4-bit codes per byte.
    self.assertLen(optax_q.quantized_leaves(ts.opt_state), 2)
    # Same trajectory as a hand-written loop.
    p, s = params, jax.jit(tx.init)(params)

    @jax.jit
    def step(p, s):
      u, s = tx.update(jax.grad(loss_fn)(p), s, p)
      return optax.apply_updates(p, u), s

    for _ in range(5):
      p, s = step(p, s)
    helpers.assert_trees_equal(ts.params, p)
    helpers.assert_trees_equal(ts.opt_state, s)


  def test_linen_logical_partitioning(self):
    import flax.linen as nn  # pylint: disable=g-import-not-at-top

    class Model(nn.Module):

      @nn.compact
      def __call__(self, x):
        return nn.Dense(256, kernel_init=nn.with_logical_partitioning(
            nn.initializers.lecun_normal(), ('embed', 'mlp')))(x)

    tx = optax_q.adamw(1e-3, mu_format='int4', min_size=1024,
                       track_stalls=True)

    def init(key):
      params = Model().init(key, jnp.ones((2, 16)))['params']
      return tx.init(params)

    # MaxText-style: logical specs from the abstract (boxed) state. Codes
    # and scales of the quantized kernel share the kernel's logical axes.
    specs = nn.get_partition_spec(jax.eval_shape(init, jax.random.key(0)))
    mu = specs[0].inner_state.mu['Dense_0']
    self.assertTrue(optax_q.is_qarray(mu['kernel']))
    self.assertEqual(mu['kernel'].codes, P('embed', 'mlp'))
    self.assertEqual(mu['kernel'].scale, P('embed', 'mlp'))
    self.assertEqual(mu['kernel'].shape, (16, 256))
    self.assertEqual(mu['bias'], P())  # Small: stays float32, unboxed.
    self.assertEqual(specs[0].stalled.mu['Dense_0']['kernel'], P())


class JaxApisTest(parameterized.TestCase):

  def test_tree_map_params_with_is_leaf(self):
    tx = optax_q.adamw(1e-3, mu_format='int4', min_size=0, track_stalls=True)
    params = _params()
    state = jax.jit(tx.init)(params)
    param_specs = {'w': P(None, 'model'), 'b': P('model')}

    def leaf_spec(leaf, spec):
      if optax_q.is_qarray(leaf):
        return dataclasses.replace(leaf, codes=spec, scale=spec)
      return spec

    specs = optax.tree_utils.tree_map_params(
        tx, leaf_spec, state, param_specs,
        transform_non_params=lambda _: P(), is_leaf=optax_q.is_qarray)
    inner = specs[0].inner_state
    for field in ('mu', 'nu'):
      for k, spec in param_specs.items():
        q = getattr(inner, field)[k]
        self.assertTrue(optax_q.is_qarray(q))
        self.assertEqual((q.codes, q.scale), (spec, spec))
      # Per-leaf telemetry scalars are non-parameters: transform_non_params
      # gets each field's tree of them (a prefix here, as jit accepts).
      self.assertEqual(getattr(specs[0].stalled, field), P())
    self.assertEqual(specs[0].count, P())
    self.assertEqual(inner.count, P())
    # A no-op map gives back the state itself.
    same = optax.tree_utils.tree_map_params(
        tx, lambda x: x, state, is_leaf=optax_q.is_qarray)
    helpers.assert_trees_equal(same, state)

  def test_eval_shape_init(self):
    tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='fp8_e4m3',
                       min_size=0)
    params = _params()
    abstract = jax.eval_shape(tx.init, params)
    state = jax.jit(tx.init)(params)
    self.assertEqual(jax.tree.structure(abstract), jax.tree.structure(state))
    for a, x in zip(jax.tree.leaves(abstract), jax.tree.leaves(state)):
      self.assertIsInstance(a, jax.ShapeDtypeStruct)
      self.assertEqual((a.shape, a.dtype), (x.shape, x.dtype))
    self.assertEqual(optax_q.state_nbytes(abstract),
                     optax_q.state_nbytes(state))
    # From abstract params too.
    abstract2 = jax.eval_shape(
        tx.init, jax.tree.map(
            lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params))
    self.assertEqual(jax.tree.structure(abstract2), jax.tree.structure(state))
    q = abstract[0].inner_state.mu['w']
    self.assertEqual(q.codes.shape, (16, 128))
    self.assertEqual(q.codes.dtype, jnp.uint8)

  def test_quantized_state_is_never_bigger(self):
    # Block scales along a last axis of 1 (the kernel of a Dense(n, 1)) would
    # cost 4 bytes of scale per element: such leaves keep their state.
    tx = optax_q.adamw(1e-3, min_size=0)
    params = {'head': jax.ShapeDtypeStruct((4096, 1), jnp.float32),
              'w': jax.ShapeDtypeStruct((8, 256), jnp.float32)}
    state = jax.eval_shape(tx.init, params)
    self.assertEqual(set(_qleaves(state)),
                     {'0/inner_state/mu/w', '0/inner_state/nu/w'})
    head = state[0].inner_state.mu['head']
    self.assertEqual((head.shape, head.dtype), ((4096, 1), jnp.float32))
    self.assertLess(optax_q.state_nbytes(state),
                    optax_q.state_nbytes(jax.eval_shape(
                        optax.adamw(1e-3).init, params)))

  @parameterized.parameters(
      ('float32', 'nearest'), ('bfloat16', 'stochastic'),
      ('float16', 'stochastic'))
  def test_lax_cond_dtype_stability(self, dtype, rounding):
    params = {'w': _params(jnp.dtype(dtype))['w']}
    tx = optax_q.adamw(1e-2, mu_format='fp8_e4m3', nu_format='int8_dynamic',
                       rounding=rounding, min_size=0)
    state = jax.jit(tx.init)(params)

    @jax.jit
    def step(grads, state, params):
      # Defeat compiler optimization, use lax.cond to check for stability.
      cond = jax.random.randint(jax.random.key(0), (), 0, 2) == 0
      return jax.lax.cond(
          cond, lambda: tx.update(grads, state, params),
          lambda: (params, state))

    updates, new_state = step(_grads(0, params), state, params)
    self.assertEqual(jax.tree.structure(new_state), jax.tree.structure(state))
    self.assertEqual(jax.tree.map(jax.typeof, new_state),
                     jax.tree.map(jax.typeof, state))
    self.assertEqual(updates['w'].dtype, params['w'].dtype)
    self.assertLen(_qleaves(new_state), 2)


if __name__ == '__main__':
  absltest.main()
