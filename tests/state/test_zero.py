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
import tempfile  # noqa: E402

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
import zero_worker  # noqa: E402

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
      jax.eval_shape(tx.init, params), param_shardings,
      **{'shard_over': 'data', **kwargs})
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


def _plain(tx, layout, axis_type, *, steps=2):
  """The step with the state sharded as its parameters only."""
  return _run(tx, layout, axis_type, steps=steps, shard_over=None)[:2]


def _spec_axes(x) -> set[str]:
  return {a for entry in x.sharding.spec
          for a in ((entry,) if isinstance(entry, str) else entry or ())}


def _assert_close(test, got, want):
  """Equal up to float32 rounding (the FMA exception of the docs'
  adaptive-bits page): parameters to 1e-5, codes in all but 1% of their
  elements, scales to 1e-4."""
  flat_got = jax.tree_util.tree_flatten_with_path(got)[0]
  flat_want = jax.tree.leaves(want)
  test.assertEqual(len(flat_got), len(flat_want))
  for (path, x), y in zip(flat_got, flat_want):
    x, y = np.asarray(x), np.asarray(y)
    name = jax.tree_util.keystr(path)
    if '.codes' in name:  # The key string goes on with the layout.
      test.assertLessEqual(np.mean(x != y), 0.01, name)
    else:
      np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6, err_msg=name)


# Bit for bit against the unsharded run on this CPU; the others differ by
# float32 rounding where XLA:CPU contracts a multiply-add into an FMA in one
# shard shape's loop and not another's (bit for bit without FMA, with
# --xla_cpu_max_isa=AVX, checked), and Muon with parameters sharded over
# 'model' multiplies matrices whose contracted axes are sharded.
BIT_EXACT = ('adamw_int8', 'adamw_fp8', 'adamw_int4', 'adam', 'lion', 'sgd')


class ZeroTest(parameterized.TestCase):

  def _check(self, name, layout, axis_type):
    tx = OPTIMIZERS[name]()
    p, state, shardings, _ = _run(tx, layout, axis_type)
    if name in ('shampoo', 'soap'):
      # The reference is the run sharded as the parameters, on the same
      # mesh: Shampoo and SOAP on a mesh do not match the unsharded run
      # bit for bit even without shard_over (batched eigendecompositions).
      # On an Explicit mesh the step fuses differently (float32 rounding,
      # the FMA exception).
      want = _plain(tx, layout, axis_type)
      if axis_type == AxisType.Explicit:
        _assert_close(self, (p, state), want)
      else:
        helpers.assert_trees_equal((p, state), want)
    elif name in BIT_EXACT:
      helpers.assert_trees_equal((p, state),
                                 _reference(tx, _params(layout), 2))
    else:
      _assert_close(self, (p, state), _reference(tx, _params(layout), 2))
    for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(shardings)):
      self.assertTrue(x.sharding.is_equivalent_to(s, x.ndim), (x, s))
    return state

  def test_replicated_params_int4_bytes_drop_eightfold(self):
    state = self._check('adamw_int4', ZERO, AxisType.Auto)
    mu = state[0].inner_state.mu
    # Whole blocks of 32 along rows (w) and along the only axis (v); the
    # leaves nothing divides stay whole on every device.
    self.assertEqual(mu['w'].codes.sharding.spec, P('data', None))
    self.assertEqual(mu['w'].scale.sharding.spec, P('data', None))
    self.assertEqual(mu['w'].codes.addressable_shards[0].data.shape,
                     (8, 128))
    self.assertEqual(mu['v'].codes.sharding.spec, P('data'))
    self.assertEqual(mu['v'].scale.addressable_shards[0].data.shape, (2,))
    self.assertEqual(mu['v'].codes.addressable_shards[0].data.shape, (32,))
    for leaf in ('b', 'odd'):
      self.assertEqual(_spec_axes(mu[leaf].codes), set())
    split = [x for x in jax.tree.leaves(state) if 'data' in _spec_axes(x)]
    whole = [x for x in jax.tree.leaves(state)
             if 'data' not in _spec_axes(x)]
    self.assertLen(split, 8)  # codes and scales of w and v, mu and nu.
    total = sum(x.nbytes for x in jax.tree.leaves(state))
    self.assertEqual(device_nbytes(state),
                     sum(x.nbytes for x in split) // 8
                     + sum(x.nbytes for x in whole))
    # The target: an eighth of the state, plus the leaves no axis divides.
    self.assertLessEqual(device_nbytes(state),
                         total / 8 + sum(x.nbytes for x in whole))

  @parameterized.named_parameters(
      (f'{n}_{l}_{a}', n, l, a) for n in OPTIMIZERS
      for l in ('zero', 'fsdp') for a in ('auto', 'explicit')
      # SOAP and Shampoo with replicated parameters differ from the run
      # sharded as the parameters by float32 rounding that the
      # eigendecomposition amplifies (see the docs).
      if not (n in ('shampoo', 'soap') and l == 'zero'))
  @pytest.mark.slow
  def test_every_optimizer(self, name, layout, axis_type):
    layout = ZERO if layout == 'zero' else FSDP
    axis_type = AxisType.Auto if axis_type == 'auto' else AxisType.Explicit
    state = self._check(name, layout, axis_type)
    plain = _plain(OPTIMIZERS[name](), layout, axis_type)[1]
    # Each buffer that 'data' newly splits holds its share of the state
    # sharded as the parameters; the others (already split over 'data',
    # as FSDP's 'qkv', or divided by no axis) hold as much.
    size = 8 if layout is ZERO else 4
    kept = 0
    for x, y in zip(jax.tree.leaves(state), jax.tree.leaves(plain)):
      got = x.addressable_shards[0].data.nbytes
      was = y.addressable_shards[0].data.nbytes
      newly = 'data' in _spec_axes(x) and 'data' not in _spec_axes(y)
      self.assertEqual(got * (size if newly else 1), was, x.sharding)
      kept += 0 if newly else was
    self.assertLessEqual(device_nbytes(state),
                         (device_nbytes(plain) - kept) / size + kept)
    self.assertLess(device_nbytes(state), device_nbytes(plain) / 2)


class RuleTest(parameterized.TestCase):
  """Which axis takes the extra mesh axes, on abstract states."""

  def _shardings(self, tx, shapes, mesh, specs=None, **kwargs):
    params = {k: jax.ShapeDtypeStruct(s, 'float32')
              for k, s in shapes.items()}
    specs = specs or {}
    return optax_q.state_shardings(
        jax.eval_shape(tx.init, params),
        {k: NamedSharding(mesh, specs.get(k, P())) for k in shapes},
        **kwargs)

  def test_whole_blocks_on_the_first_axis_that_divides(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Explicit,))
    shapes = {'rows': (64, 256), 'last': (3, 5, 256), 'packed': (4, 512),
              'short': (3, 5, 128), 'odd': (3, 5, 257), 'bias': (7,),
              's': ()}
    out = self._shardings(_adamw('int4'), shapes, mesh, shard_over='data')
    mu = out[0].inner_state.mu
    specs = {k: (q.codes.spec, q.scale.spec) for k, q in mu.items()
             if optax_q.is_qarray(q)}
    self.assertEqual(specs['rows'], (P('data', None), P('data', None)))
    self.assertEqual(specs['last'], (P(None, None, 'data'),) * 2)
    # 4-bit codes: 256 bytes, 16 scales: 32 bytes and 2 blocks a device.
    self.assertEqual(specs['packed'], (P(None, 'data'),) * 2)
    # 4 blocks of 32 per row: 8 devices would split blocks.
    self.assertEqual(specs['short'], (P(),) * 2)
    self.assertEqual(specs['odd'], (P(),) * 2)
    self.assertEqual(specs['bias'], (P(),) * 2)
    self.assertEqual(mu['s'].spec, P())
    self.assertEqual(out[0].count.spec, P())

  def test_tensor_parallel_and_fsdp_parameters(self):
    mesh = jax.make_mesh((4, 2), ('data', 'model'),
                         axis_types=(AxisType.Auto,) * 2)
    shapes = {k: s for k, (s, _) in FSDP.items()}
    specs = {k: spec for k, (_, spec) in FSDP.items()}
    out = self._shardings(_adamw('int8'), shapes, mesh, specs,
                          shard_over='data')
    mu = out[0].inner_state.mu
    self.assertEqual(mu['qkv'].codes.spec, P('data', 'model'))  # As is.
    self.assertEqual(mu['out'].codes.spec, P('data', 'model'))
    self.assertEqual(mu['ln'].codes.spec, P('data'))
    self.assertEqual(mu['b'].codes.spec, P())
    # Two axes at once, on one buffer axis.
    out = self._shardings(_adamw('int8'), {'w': (64, 256)}, mesh,
                          shard_over=('data', 'model'))
    self.assertEqual(out[0].inner_state.mu['w'].scale.spec,
                     P(('data', 'model'), None))
    # A parameter's own axis joins the extra one on the same buffer axis.
    out = self._shardings(_adamw('int8'), {'v': (512,)}, mesh,
                          {'v': P('model')}, shard_over='data')
    self.assertEqual(out[0].inner_state.mu['v'].codes.spec,
                     P(('model', 'data')))

  def test_second_order_statistics(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    out = self._shardings(OPTIMIZERS['shampoo'](), {'w': (64, 256)}, mesh,
                          shard_over='data')
    inner = out[0].inner_state
    # The 2 x 8 grid of 32 x 32 blocks: its second axis takes 'data', for
    # the quantized statistics and the float32 eigenvalues alike.
    self.assertEqual(inner.stats_l['w'].codes.spec,
                     P(None, 'data', None, None))
    self.assertEqual(inner.stats_l['w'].scale.spec,
                     P(None, 'data', None, None))
    self.assertEqual(inner.eigvals_l['w'].spec, P(None, 'data', None))

  def test_strict_names_what_could_not_be_split(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    with self.assertRaisesRegex(ValueError, r"(?s)mu\['odd'\].*whole "
                                r"blocks of 32.*'data',\) \(size 8\)"):
      self._shardings(_adamw('int8'), {'w': (64, 256), 'odd': (3, 5, 257),
                                       's': ()}, mesh, shard_over='data',
                      strict=True)
    out = self._shardings(_adamw('int8'), {'w': (64, 256), 's': ()}, mesh,
                          shard_over='data', strict=True)
    self.assertEqual(out[0].inner_state.mu['s'].spec, P())

  @parameterized.named_parameters(
      ('unknown', 'batch', "'batch' is not one of them"),
      ('twice', ('data', 'data'), 'distinct axes'),
      ('empty', (), 'a mesh axis name'),
      ('not_a_name', 3, 'a mesh axis name'),
      ('names_not_str', ('data', 1), 'a mesh axis name'),
      ('a_set', {'data'}, 'a mesh axis name'),
      ('a_dict', {'data': 8}, 'a mesh axis name'))
  def test_bad_shard_over(self, shard_over, message):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    with self.assertRaisesRegex(ValueError, message):
      self._shardings(_adamw('int8'), {'w': (64, 256)}, mesh,
                      shard_over=shard_over)

  @parameterized.named_parameters(('unknown', 'hbm'), ('not_a_str', 1))
  def test_bad_memory_kind(self, memory_kind):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    with self.assertRaisesRegex(ValueError, "memory_kind must be .*"
                                "'pinned_host'"):
      self._shardings(_adamw('int8'), {'w': (64, 256)}, mesh,
                      memory_kind=memory_kind)

  def test_bad_memory_kind_on_an_abstract_mesh(self):
    mesh = jax.sharding.AbstractMesh((8,), ('data',))
    with self.assertRaisesRegex(ValueError, "memory_kind must be .*"
                                "'pinned_host'.*got 'hbm'"):
      self._shardings(_adamw('int8'), {'w': (64, 256)}, mesh,
                      memory_kind='hbm')
    out = self._shardings(_adamw('int8'), {'w': (64, 256)}, mesh,
                          memory_kind='pinned_host')
    self.assertEqual(out[0].inner_state.mu['w'].codes.memory_kind,
                     'pinned_host')

  def test_memory_kind_of_offloaded_parameters(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    params = {'w': jax.ShapeDtypeStruct((64, 256), 'float32')}
    abstract = jax.eval_shape(_adamw('int8').init, params)
    ps = {'w': NamedSharding(mesh, P(), memory_kind='pinned_host')}
    out = optax_q.state_shardings(abstract, ps, shard_over='data')
    self.assertEqual(out[0].inner_state.mu['w'].codes.memory_kind,
                     'pinned_host')
    self.assertEqual(out[0].count.memory_kind, 'device')
    out = optax_q.state_shardings(abstract, ps, shard_over='data',
                                  memory_kind='device')
    self.assertEqual({s.memory_kind for s in jax.tree.leaves(out)},
                     {'device'})

  def test_memory_kind_on_every_buffer(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    out = self._shardings(_adamw('int8'), {'w': (64, 256), 's': ()}, mesh,
                          shard_over='data', memory_kind='pinned_host')
    self.assertEqual({s.memory_kind for s in jax.tree.leaves(out)},
                     {'pinned_host'})
    self.assertEqual(out[0].inner_state.mu['w'].codes.spec,
                     P('data', None))


class RelayoutTest(absltest.TestCase):

  def test_relayout_keeps_the_state_split(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    params = {'w': np.zeros((64, 256), np.float32)}
    ps = {'w': NamedSharding(mesh, P())}
    tx = optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0)
    state = jax.device_put(tx.init(params), optax_q.state_shardings(
        jax.eval_shape(tx.init, params), ps, shard_over='data'))
    layout = dict(optax_q.bit_layout(state))
    layout['inner_state/inner_state/mu/w'] = 'int8_dynamic/block'
    new = optax_q.relayout(state, layout, param_shardings=ps,
                           shard_over='data')
    mu = new.inner_state.inner_state.mu['w']
    self.assertEqual(mu.fmt.name, 'int8_dynamic')
    self.assertEqual(mu.codes.sharding.spec, P('data', None))
    self.assertEqual(mu.scale.sharding.spec, P('data', None))
    with self.assertRaisesRegex(ValueError, 'param_shardings'):
      optax_q.relayout(state, layout, shard_over='data')

  def test_relayout_checks_the_placement_when_nothing_changes(self):
    mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))
    params = {'w': np.zeros((64, 256), np.float32)}
    ps = {'w': NamedSharding(mesh, P())}
    tx = optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0)
    state = tx.init(params)
    for kwargs in ({}, {'step': 1}):
      with self.assertRaisesRegex(ValueError, "'batch' is not one of them"):
        optax_q.relayout(state, param_shardings=ps, shard_over='batch',
                         **kwargs)
      with self.assertRaisesRegex(ValueError, 'memory_kind must be'):
        optax_q.relayout(state, param_shardings=ps, memory_kind='host',
                         **kwargs)
    self.assertIs(optax_q.relayout(state, param_shardings=ps,
                                   shard_over='data'), state)


class TwoProcessTest(parameterized.TestCase):

  # Slow: two worker processes of two CPU devices each (about 20 s).
  @parameterized.named_parameters(('device', None),
                                  ('host', 'pinned_host'))
  @pytest.mark.slow
  def test_two_processes_equal_the_unsharded_run(self, memory_kind):
    with tempfile.TemporaryDirectory() as tmp:
      outs = zero_worker.launch(tmp, memory_kind=memory_kind)
    single = zero_worker.train()
    for out in outs:
      self.assertEqual(out['digest'], single['digest'])
      self.assertEqual(out['mu_spec'], "P('data', None)")
      self.assertEqual(out['memory_kinds'], [memory_kind or 'device'])
    # Each process holds half the state, each of the four devices a
    # quarter (the (7,) bias, replicated, and the counters aside).
    whole = sum(out['local_bytes'] for out in outs)
    self.assertEqual(outs[0]['local_bytes'], outs[1]['local_bytes'])
    self.assertLess(whole, 2 * single['state_bytes'])
    for out in outs:
      for n in out['device_bytes']:
        self.assertLessEqual(n, single['state_bytes'] / 4 + 2 * (7 + 4 + 4))


if __name__ == '__main__':
  absltest.main()
