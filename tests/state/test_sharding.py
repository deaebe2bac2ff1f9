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
"""Quantized state on a 4x2 ('data', 'model') mesh of 8 simulated CPU devices.

XLA reads ``--xla_force_host_platform_device_count`` when the CPU backend is
first created, so the flag is set here, before jax is imported. Under pytest
(and pytest-xdist) another module may have created the backend first, with
fewer devices; then the sharded tests skip in this process and
``SubprocessTest`` runs them again in a fresh interpreter with the flag set,
so they always run somewhere.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402
import dataclasses  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import optax_q  # noqa: E402

# A transformer-like tree. With block_size=32 every sharded last axis still
# divides by its mesh axes after blocking (and after nibble packing).
PARAMS = {
    'qkv': ((128, 384), P('data', 'model')),
    'mlp_out': ((256, 128), P('model', 'data')),
    'ln_scale': ((256,), P('model')),
}




def _mesh():
  return jax.make_mesh((4, 2), ('data', 'model'),
                       axis_types=(AxisType.Auto, AxisType.Auto))


def _params(layout):
  key = jax.random.key(0)
  return {name: jax.random.normal(jax.random.fold_in(key, i), shape) * 0.1
          for i, (name, (shape, _)) in enumerate(sorted(layout.items()))}


def _run_both(tx, layout, *, steps=2, strict=True, unsharded=True):
  """Sharded and unsharded runs: (sharded, unsharded, shardings, hlo).

  With ``unsharded=False`` the unsharded run is skipped (None).
  """
  mesh = _mesh()
  params = _params(layout)
  param_shardings = {n: NamedSharding(mesh, spec)
                     for n, (_, spec) in layout.items()}
  abstract = jax.eval_shape(tx.init, params)
  shardings = optax_q.state_shardings(abstract, param_shardings,
                                      strict=strict)
  init = jax.jit(tx.init, in_shardings=(param_shardings,),
                 out_shardings=shardings)
  sharded_params = jax.device_put(params, param_shardings)
  state = init(sharded_params)
  grads = [jax.device_put(helpers.grads(i, params), param_shardings)
           for i in range(steps)]
  step = jax.jit(
      helpers.step_fn(tx),
      in_shardings=(param_shardings, shardings, param_shardings),
      out_shardings=(param_shardings, shardings)).lower(
          sharded_params, state, grads[0]).compile()
  p = sharded_params
  for g in grads:
    p, state = step(p, state, g)
  sharded = (p, state)
  if not unsharded:
    return sharded, None, shardings, step.as_text()

  p, state = params, jax.jit(tx.init)(params)
  plain_step = jax.jit(helpers.step_fn(tx))
  for i in range(steps):
    p, state = plain_step(p, state, helpers.grads(i, params))
  return sharded, (p, state), shardings, step.as_text()


class ShardedUpdateTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  @parameterized.named_parameters(
      ('int4_fp8_stochastic', 'int4', 'fp8_e4m3', 'stochastic'),
      ('int8_dynamic_nearest', 'int8_dynamic', 'int8_dynamic', 'nearest'),
  )
  def test_matches_unsharded_without_all_gather(self, mu, nu, rounding):
    tx = optax_q.adamw(1e-2, mu_format=mu, nu_format=nu, rounding=rounding,
                       block_size=32, min_size=0, track_stalls=True)
    sharded, plain, shardings, hlo = _run_both(tx, PARAMS)
    # Bit for bit: the stochastic-rounding bits are a hash of the global
    # element index, whatever the mesh.
    helpers.assert_trees_equal(sharded, plain)
    # Block-wise formats whose blocks lie inside a shard: no all-gather.
    # (One all-reduce per leaf remains, for the stalled-fraction scalar.)
    self.assertNotIn('all-gather', hlo)
    self.assertNotIn('all-to-all', hlo)
    # Codes and scales carry the parameter's PartitionSpec.
    params, state = sharded
    for name, (_, spec) in PARAMS.items():
      self.assertEqual(params[name].sharding.spec, spec)
      for field in ('mu', 'nu'):
        q = getattr(state[0].inner_state, field)[name]
        self.assertTrue(optax_q.is_qarray(q))
        self.assertEqual(q.codes.sharding.spec, spec, (field, name))
        self.assertEqual(q.scale.sharding.spec, spec, (field, name))
        want = getattr(shardings[0].inner_state, field)[name]
        self.assertEqual(q.codes.sharding, want.codes)
        self.assertEqual(q.scale.sharding, want.scale)
    self.assertEqual(state[0].count.sharding.spec, P())
    self.assertEqual(state[0].stalled.mu['qkv'].sharding.spec, P())
    q = state[0].inner_state.mu['qkv']
    self.assertEqual(q.codes.shape, (128, 192) if mu == 'int4' else (128, 384))
    self.assertEqual(q.scale.shape, (128, 12))
    # Each device holds its own block of codes: 128/4 rows, a half of
    # the columns.
    self.assertEqual(q.codes.addressable_shards[0].data.shape,
                     (32, q.codes.shape[1] // 2))

  def test_tiled_leafwise_update_stays_local(self):
    # Tiles of rows t, t + T, ... are sliced along an unsharded axis of a
    # (rows / T, T, ...) view: each device tiles its own rows.
    tx = optax.chain(
        optax_q.quantize_state(
            optax.scale_by_adam(), {'mu': 'int4', 'nu': 'fp8_e4m3'},
            rounding='stochastic', block_size=32, min_size=0,
            elementwise=True, tile_size=4096),
        optax.scale(-1e-2))
    sharded, plain, _, hlo = _run_both(tx, PARAMS)
    self.assertIn('while', hlo)
    self.assertNotIn('all-gather', hlo)
    self.assertNotIn('all-to-all', hlo)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain)):
      if jnp.issubdtype(a.dtype, jnp.floating):
        np.testing.assert_allclose(np.asarray(a, np.float32),
                                   np.asarray(b, np.float32), rtol=1e-5,
                                   atol=1e-6)
      else:
        self.assertGreater(np.mean(np.asarray(a) == np.asarray(b)), 0.999)

  def test_pallas_tile_kernel_on_a_mesh(self):
    # The kernel (interpreted here) on sharded leaves gives the XLA loop's
    # bits on the same mesh (on accelerators 'auto' keeps the loop under a
    # mesh; the kernel is for one device's arrays, or inside shard_map).
    runs = []
    for kernel in ('xla', 'pallas'):
      tx = optax.chain(
          optax_q.quantize_state(
              optax.scale_by_adam(), {'mu': 'int4', 'nu': 'fp8_e4m3'},
              rounding='stochastic', block_size=32, min_size=0,
              elementwise=True, tile_size=4096, track_stalls=False,
              kernel=kernel),
          optax.scale(-1e-2))
      # Only the sharded runs are compared.
      runs.append(_run_both(tx, PARAMS, unsharded=False)[0])
    helpers.assert_trees_equal(runs[1], runs[0])

  def test_last_axis_indivisible_after_blocking(self):
    # 96 / 32 = 3 blocks, which the 2-way 'model' axis can't split.
    layout = {'odd': ((64, 96), P('data', 'model')),
              'ln_scale': PARAMS['ln_scale']}
    tx = optax_q.adamw(1e-2, mu_format='int8', nu_format='fp8_e4m3',
                       block_size=32, min_size=0)
    abstract = jax.eval_shape(tx.init, _params(layout))
    param_shardings = {n: NamedSharding(_mesh(), spec)
                       for n, (_, spec) in layout.items()}
    with self.assertRaisesRegex(
        ValueError, r"mu\['odd'\] \(scales\): axis 1 has 3"):
      optax_q.state_shardings(abstract, param_shardings, strict=True)
    # By default that axis of the scales is replicated, and it still works.
    sharded, plain, shardings, _ = _run_both(tx, layout, strict=False)
    helpers.assert_trees_equal(sharded, plain)
    q = shardings[0].inner_state.mu['odd']
    self.assertEqual(q.codes.spec, P('data', 'model'))
    self.assertEqual(q.scale.spec, P('data', None))
    q = shardings[0].inner_state.mu['ln_scale']
    self.assertEqual(q.scale.spec, P('model'))


class ExplicitMeshTest(parameterized.TestCase):
  """jax.make_mesh's default axis types (Explicit): shardings in the types."""

  def setUp(self):
    super().setUp()

  @parameterized.parameters(('int4', 'fp8_e4m3'),
                            ('int8_dynamic', 'int8_dynamic'),
                            ('fp4_e2m1', 'int4'))
  def test_types_stable_and_values_match(self, mu, nu):
    # Codebook lookups (int8_dynamic, fp4, the unsigned int4 grid of nu)
    # spell out their output sharding, which explicit meshes require.
    mesh = jax.make_mesh((4, 2), ('data', 'model'))
    layout = {'qkv': PARAMS['qkv'], 'ln_scale': PARAMS['ln_scale']}
    params = _params(layout)
    tx = optax_q.adamw(1e-2, mu_format=mu, nu_format=nu,
                       rounding='stochastic', block_size=32, min_size=0)
    step = jax.jit(helpers.step_fn(tx))
    grads = helpers.grads(0, params)
    p, s = params, jax.jit(tx.init)(params)
    want = step(p, s, grads)
    with jax.set_mesh(mesh):
      shardings = {n: NamedSharding(mesh, spec)
                   for n, (_, spec) in layout.items()}
      p = jax.device_put(params, shardings)
      s = jax.jit(tx.init)(p)
      types0 = jax.tree.map(jax.typeof, s)
      got = step(p, s, jax.device_put(grads, shardings))
      self.assertEqual(jax.tree.map(jax.typeof, got[1]), types0)
    q = got[1][0].inner_state.mu['qkv']
    self.assertEqual(jax.typeof(q.codes).sharding.spec, P('data', 'model'))
    self.assertEqual(jax.typeof(q.scale).sharding.spec, P('data', 'model'))
    self.assertEqual(q.codes.shape, (128, 192 if q.fmt.packed else 384))
    helpers.assert_trees_equal(got, want)


  def test_nnx_optimizer_sharding_metadata(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    mesh = jax.make_mesh((8,), ('x',), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
      init = nnx.with_metadata(nnx.initializers.lecun_normal(),
                               optimizer_sharding=P(None, 'x'))
      model = nnx.Linear(16, 512, kernel_init=init, rngs=nnx.Rngs(0))
      tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='fp8_e4m3',
                         block_size=32, min_size=1024, track_stalls=True)
      opt = nnx.jit(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(model)
      x = jnp.ones((4, 16))

      @nnx.jit
      def train_step(model, opt):
        grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
        opt.update(model, grads)

      for step in range(2):
        state = opt.opt_state[0]
        for field, dtype in (('mu', 'uint8[16,256@x]'),
                             ('nu', 'float8_e4m3fn[16,512@x]')):
          q = getattr(state.inner_state, field)['kernel']
          self.assertEqual(str(jax.typeof(q.codes.get_value())), dtype,
                           (step, field))
          self.assertEqual(str(jax.typeof(q.scale.get_value())),
                           'float32[16,16@x]', (step, field))
        # Telemetry scalars are replicated, not sharded like the kernel.
        self.assertEqual(
            str(jax.typeof(state.stalled.mu['kernel'].get_value())),
            'float32[]')
        train_step(model, opt)


class ShardMapTest(parameterized.TestCase):
  """Under ``shard_map`` each device updates its own rows: the tile loop's
  carry and the fusion device's branches take the manual axes the new
  state varies over, and the result is the unsharded run's, bit for bit."""

  @parameterized.parameters(None, 1024)  # Untiled; 4 tiles per shard.
  def test_per_shard_update_equals_unsharded(self, tile_size):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Explicit,))
    tx = optax.chain(optax_q.quantize_state(
        optax.scale_by_adam(), 'int8_dynamic', rounding='nearest',
        min_size=0, elementwise=True, tile_size=tile_size),
                     optax.scale(-1e-3))
    params = {'w': jax.random.normal(jax.random.key(0), (64, 512)) * 0.1}
    grads = [{'w': jax.random.normal(jax.random.key(k), (64, 512)) * 0.01}
             for k in (1, 2)]

    def run(params, *grads):
      state = tx.init(params)  # Per shard.
      for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
      return params

    want = jax.jit(run)(params, *grads)
    put = lambda t: jax.device_put(  # noqa: E731
        t, NamedSharding(mesh, P('data')))
    got = jax.jit(jax.shard_map(
        run, mesh=mesh, in_specs=P('data'), out_specs=P('data')))(
            put(params), *map(put, grads))
    np.testing.assert_array_equal(got['w'], want['w'])


class StateShardingsTest(absltest.TestCase):

  def test_masked_partitioned_and_row_scales(self):
    mesh = jax.make_mesh((1,), ('model',), devices=jax.devices()[:1])
    params = {'w': jnp.zeros((8, 256)), 'b': jnp.zeros((256,))}
    param_shardings = {'w': NamedSharding(mesh, P(None, 'model')),
                       'b': NamedSharding(mesh, P('model'))}
    tx = optax.chain(
        optax.masked(
            optax_q.quantize_state(optax.scale_by_adam(), 'int8',
                                   scale_mode='row', min_size=0),
            {'w': True, 'b': False}),
        optax.add_decayed_weights(0.1))
    abstract = jax.eval_shape(tx.init, params)
    shardings = optax_q.state_shardings(abstract, param_shardings,
                                        strict=True)
    inner = shardings[0].inner_state.inner_state
    self.assertEqual(inner.mu['w'].codes.spec, P(None, 'model'))
    self.assertEqual(inner.mu['w'].scale.spec, P(None, 'model'))
    self.assertIsInstance(inner.mu['b'], optax.MaskedNode)
    self.assertEqual(jax.tree.structure(shardings),
                     jax.tree.structure(abstract))
    with self.assertRaisesRegex(ValueError, 'NamedSharding'):
      optax_q.state_shardings(abstract, {'w': P(), 'b': P()})

  def test_shardings_of_other_parameters_raise(self):
    mesh = jax.make_mesh((1,), ('model',), devices=jax.devices()[:1])
    s = NamedSharding(mesh, P(None, 'model'))
    params = {'w': jnp.zeros((8, 256)), 'b': jnp.zeros((256,))}
    tx = optax_q.adamw(1e-3, mu_format='int4', min_size=0, track_stalls=True)
    abstract = jax.eval_shape(tx.init, params)
    # Another model's names, a missing parameter, a list for a dict: no
    # subtree of the state matches, and nothing may be silently replicated.
    for bad in ({'kernel': s, 'bias': s}, {'w': s}, [s, s]):
      with self.subTest(bad=bad), self.assertRaisesRegex(
          ValueError, r"state\[0\]\.inner_state\.mu\['b'\] is a QArray of "
          r'shape \(256,\), but no subtree of the state is laid out like '
          'param_shardings'):
        optax_q.state_shardings(abstract, bad)
    # A state with buffers of other parameters besides: replicated by
    # default, an error naming them with strict=True.
    other = jax.eval_shape(tx.init, {'v': jnp.zeros((4, 128))})
    good = {'w': s, 'b': NamedSharding(mesh, P('model'))}
    shardings = optax_q.state_shardings((abstract, other), good)
    self.assertEqual(shardings[0][0].inner_state.mu['w'].codes.spec,
                     P(None, 'model'))
    self.assertEqual(shardings[1][0].inner_state.mu['v'].codes.spec, P())
    with self.assertRaisesRegex(
        ValueError, r"state\[1\]\[0\]\.inner_state\.mu\['v'\] is a QArray "
        r'of shape \(4, 128\), but it lies outside the subtrees laid out '
        r'like param_shardings \(state\[0\]'):
      optax_q.state_shardings((abstract, other), good, strict=True)
    # A state without parameter-shaped buffers needs no match.
    counts = jax.eval_shape(optax.scale_by_schedule(lambda n: n).init, params)
    self.assertEqual(optax_q.state_shardings(counts, good).count.spec, P())

  def test_bad_param_shardings(self):
    devices = jax.devices()[:1]
    mesh = jax.make_mesh((1,), ('model',), devices=devices)
    other_mesh = jax.make_mesh((1,), ('data',), devices=devices)
    s = NamedSharding(mesh, P())
    abstract = jax.eval_shape(
        optax_q.adamw(1e-3, min_size=0).init,
        {'w': jnp.zeros((8, 256)), 'b': jnp.zeros((256,))})
    cases = (
        (None, 'param_shardings is None'),
        ({}, 'non-empty'),
        ({'w': s, 'b': None},
         r"param_shardings\['b'\] is None\. Give every parameter"),
        ({'w': s, 'b': P('model')},
         r"param_shardings\['b'\] is P\('model',?\)\. Wrap each spec as "
         r'NamedSharding\(mesh, spec\)'),
        ({'w': s, 'b': jax.sharding.SingleDeviceSharding(devices[0])},
         r"param_shardings\['b'\] is SingleDeviceSharding"),
        ({'w': s, 'b': NamedSharding(other_mesh, P())},
         r"must be on one mesh, but param_shardings\['b'\] is on .*'model'"
         r".* and param_shardings\['w'\] on .*'data'|must be on one mesh.*"),
    )
    for bad, message in cases:
      with self.subTest(bad=bad), self.assertRaisesRegex(ValueError, message):
        optax_q.state_shardings(abstract, bad)


def _tree_map_params_cases():
  def adamw(**kw):
    return lambda: optax_q.adamw(1e-3, min_size=1024, **kw)
  return (
      ('adamw_fp8', adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3')),
      ('adamw_int8_dynamic_stalls', adamw(track_stalls=True)),
      ('adamw_int4_resets', adamw(mu_format='int4', reset_every=10,
                                  track_stalls=True)),
      ('adamw_adaptive_resets', adamw(mu_format='int4',
                                      reset_every='adaptive')),
      ('quantize_state', lambda: optax_q.quantize_state(
          optax.scale_by_adam(), 'int8', min_size=1024)),
      ('masked', lambda: optax.masked(
          optax_q.quantize_state(optax.scale_by_adam(), 'int4',
                                 min_size=1024),
          {'w': True, 'b': False})),
  )


class TreeMapParamsTest(parameterized.TestCase):
  """``optax.tree_utils.tree_map_params`` over quantized states."""

  @parameterized.named_parameters(*_tree_map_params_cases())
  def test_maps_codes_and_scales(self, make_tx):
    tx = make_tx()
    # 'b' is below min_size: unquantized, a None hole in the stall tree.
    params = {'w': jnp.ones((8, 256)), 'b': jnp.ones((256,))}
    state = tx.init(params)
    quantized = [q for q in jax.tree.leaves(state, is_leaf=optax_q.is_qarray)
                 if optax_q.is_qarray(q)]
    self.assertNotEmpty(quantized)
    seen = []
    same = optax.tree_utils.tree_map_params(
        tx, lambda x: seen.append(x) or x, state)
    self.assertEqual(jax.tree.structure(same), jax.tree.structure(state))
    for q in quantized:
      for buf in (q.codes, q.scale):
        self.assertTrue(any(x is buf for x in seen), q)
    # f sees parameter-shaped buffers only: no counters, no stall scalars.
    self.assertTrue(all(x.ndim for x in seen), [x.shape for x in seen])

    # Against the parameters' specs: f gets each QArray (is_leaf) and gives
    # its codes and its scales the parameter's spec.
    specs = {'w': P(None, 'model'), 'b': P('model')}

    def leaf_spec(leaf, spec):
      if optax_q.is_qarray(leaf):
        return dataclasses.replace(leaf, codes=spec, scale=spec)
      return leaf if isinstance(leaf, optax.MaskedNode) else spec

    out = optax.tree_utils.tree_map_params(
        tx, leaf_spec, state, specs,
        transform_non_params=lambda x: jax.tree.map(lambda _: P(), x),
        is_leaf=lambda x: optax_q.is_qarray(x) or isinstance(
            x, optax.MaskedNode))
    is_spec = lambda x: isinstance(x, P)  # noqa: E731
    self.assertEqual(jax.tree.structure(out, is_leaf=is_spec),
                     jax.tree.structure(jax.tree.map(lambda _: P(), state),
                                        is_leaf=is_spec))
    out_q = [q for q in jax.tree.leaves(out, is_leaf=optax_q.is_qarray)
             if optax_q.is_qarray(q)]
    self.assertLen(out_q, len(quantized))
    for q in out_q:
      self.assertIn(q.codes, specs.values())
      self.assertEqual(q.scale, q.codes)


# Strict mode on the state of every optimizer and wrapper: on a layout whose
# axes divide, the rule places every leaf (Muon's Newton-Schulz coefficients,
# a constant of the transform, replicated); where it can't, one error names
# every leaf and axis.
STRICT_LAYOUT = {'w': ((256, 1024), P('data', 'model')),
                 'b': ((1024,), P('model'))}


def _strict_cases():
  eco_adamw = optax.inject_hyperparams(optax.adamw)(1e-3)
  return {
      'muon': (optax_q.muon(1e-3, min_size=0), False),
      'muon_int4': (optax_q.muon(1e-3, mu_format='int4', block_size=128,
                                 min_size=0), False),
      'shampoo': (optax_q.shampoo(1e-3, min_size=0), False),
      'soap': (optax_q.soap(1e-3, min_size=0), False),
      'adaptive_bits': (optax.chain(
          optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                                track_stalls=False, min_size=0),
          optax.add_decayed_weights(1e-4),
          optax.scale_by_learning_rate(1e-3)), False),
      'resets': (optax_q.adamw(1e-3, reset_every='adaptive', min_size=0),
                 False),
      'quantized_training': (optax_q.quantized_training(
          {'g': 'e5m2', 'w': 'e4m3', 'm': 'e4m3', 'v': 'e5m2'}).optimizer(
              optax.adam(1e-3)), False),
      'eco_fp8_weights': (optax_q.quantize_state(
          optax_q.eco(eco_adamw, 'fp8_e4m3'),
          {'mu': 'int8_dynamic', 'nu': 'ue4m0'}, min_size=0), True),
  }


class StrictModeTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.shardings = {n: NamedSharding(_mesh(), spec)
                      for n, (_, spec) in STRICT_LAYOUT.items()}

  @parameterized.named_parameters(
      (n, n) for n in ('muon', 'muon_int4', 'shampoo', 'soap',
                       'adaptive_bits', 'resets', 'quantized_training',
                       'eco_fp8_weights'))
  def test_strict_places_every_leaf(self, name):
    tx, quantized = _strict_cases()[name]
    params = _params(STRICT_LAYOUT)
    if quantized:
      params = optax_q.quantize_params(params, 'fp8_e4m3',
                                       filter=lambda path, x: x.ndim == 2)
      # The quantized weights take their parameter's spec too.
      qshardings = optax_q.state_shardings(params, self.shardings,
                                           strict=True)
      self.assertEqual(qshardings['w'].codes.spec, P('data', 'model'))
    abstract = jax.eval_shape(tx.init, params)
    shardings = optax_q.state_shardings(abstract, self.shardings,
                                        strict=True)
    self.assertEqual(jax.tree.structure(shardings),
                     jax.tree.structure(abstract))
    specs = [tuple(s.spec) for s in jax.tree.leaves(shardings)]
    self.assertIn(('model',), specs)  # Sharded as 'b', not replicated.
    if name != 'soap':  # SOAP holds 'w' as a grid of blocks (here 1 x 1).
      self.assertIn(('data', 'model'), specs)
    if name.startswith('muon'):
      muon_state = shardings.inner_state.inner_states['muon'].inner_state[0]
      self.assertEqual(muon_state.ns_coeffs.spec, P())

  def test_strict_error_names_every_leaf(self):
    # 96 / 32 = 3 and 160 / 32 = 5 blocks, which 'model' (2) can't split;
    # and a buffer of a parameter missing from param_shardings.
    layout = {'odd': ((64, 96), P('data', 'model')),
              'odder': ((64, 160), P('data', 'model'))}
    tx = optax_q.adamw(1e-2, mu_format='int8', nu_format='int8',
                       block_size=32, min_size=0)
    abstract = jax.eval_shape(tx.init, _params(layout))
    other = jax.eval_shape(tx.init, {'v': jnp.zeros((4, 128))})
    shardings = {n: NamedSharding(_mesh(), spec)
                 for n, (_, spec) in layout.items()}
    with self.assertRaises(ValueError) as raised:
      optax_q.state_shardings((abstract, other), shardings, strict=True)
    message = str(raised.exception)
    for leaf in ("mu['odd'] (scales): axis 1 has 3",
                 "nu['odd'] (scales): axis 1 has 3",
                 "mu['odder'] (scales): axis 1 has 5",
                 "nu['odder'] (scales): axis 1 has 5",
                 "state[1][0].inner_state.mu['v'] is a QArray",
                 "state[1][0].inner_state.nu['v'] is a QArray"):
      self.assertIn(leaf, message)
    self.assertIn('strict=False', message)
    # Not strict: those axes and buffers are replicated.
    out = optax_q.state_shardings((abstract, other), shardings)
    self.assertEqual(out[0][0].inner_state.mu['odder'].scale.spec,
                     P('data', None))
    self.assertEqual(out[1][0].inner_state.mu['v'].codes.spec, P())



if __name__ == '__main__':
  absltest.main()
