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
"""Tests of fidelity tracking (``optax_q._src.fidelity.fidelity``)."""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

import helpers
import optax_q

METRICS = ('norm_ratio', 'cosine', 'weight_distance')
_MAX = np.finfo(np.float32).max
_TINY = np.finfo(np.float32).tiny
# Large enough (8192 elements) for the drop-ins to quantize its state.
_TARGET = jax.random.normal(jax.random.key(0), (64, 128))


def _quadratic_params():
  return {'w': jnp.zeros((64, 128)), 'b': jnp.zeros((8,))}


def _quadratic_grads(params):
  return {'w': params['w'] - _TARGET, 'b': params['b'] - 1.0}


def _train(tx, params, steps, grads_fn=_quadratic_grads, **extra_args):
  """``steps`` jitted updates, applied outside the jitted update."""
  state = tx.init(params)
  update = jax.jit(functools.partial(tx.update, **extra_args))
  all_updates = []
  for _ in range(steps):
    updates, state = update(grads_fn(params), state, params)
    all_updates.append(updates)
    params = optax.apply_updates(params, updates)
  return params, state, all_updates


@functools.cache
def _lowbit_runs():
  """Fidelity records of int8 and 4-bit AdamW against float32 AdamW."""
  out = {}
  for name, kw in (
      ('int8', dict(mu_format='int8_dynamic', nu_format='int8_dynamic')),
      ('4bit', dict(mu_format='nf4', nu_format='ue4m0',
                    rounding='stochastic'))):
    tx = optax_q.track_fidelity(optax_q.adamw(1e-3, **kw),
                                optax.adamw(1e-3), steps=50)
    _, state, _ = _train(tx, _quadratic_params(), 50)
    out[name] = state
  return out


# Jitted: compiled once per tree structure, not dispatched op by op.
_update_fidelity = jax.jit(optax_q.update_fidelity)
_weight_distance = jax.jit(optax_q.weight_distance)


def _np_norm(tree):
  return np.sqrt(sum(np.sum(np.asarray(x, np.float64) ** 2)
                     for x in jax.tree.leaves(tree)))


def _np_dot(a, b):
  return sum(np.sum(np.asarray(x, np.float64) * np.asarray(y, np.float64))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


class UpdateFidelityTest(parameterized.TestCase):

  def test_hand_computed_equals_numpy(self):
    u = {'a': jnp.array([[1.0, -2.0], [0.5, 3.0]]),
         'b': [jnp.array(0.25), jnp.array([1.5, -1.0, 2.0], jnp.bfloat16)]}
    ref = {'a': jnp.array([[0.5, -1.0], [1.0, 2.0]]),
           'b': [jnp.array(-0.5), jnp.array([1.0, 1.0, 1.0], jnp.bfloat16)]}
    fid = _update_fidelity(u, ref)
    self.assertEqual(fid.norm_ratio.dtype, jnp.float32)
    self.assertEqual(fid.cosine.dtype, jnp.float32)
    np.testing.assert_allclose(fid.norm_ratio, _np_norm(u) / _np_norm(ref),
                               rtol=1e-6)
    np.testing.assert_allclose(
        fid.cosine, _np_dot(u, ref) / (_np_norm(u) * _np_norm(ref)),
        rtol=1e-6)

  def test_weight_distance_equals_numpy(self):
    p0 = {'w': jnp.array([1.0, 2.0, 3.0]), 'b': jnp.array(0.5)}
    ref = {'w': jnp.array([1.5, 1.0, 3.5]), 'b': jnp.array(0.0)}
    p = {'w': jnp.array([1.4, 1.2, 3.5], jnp.bfloat16),
         'b': jnp.array(0.1)}
    expected = (_np_norm(jax.tree.map(lambda a, b: np.float32(a) - b, p,
                                      ref))
                / _np_norm(jax.tree.map(lambda a, b: a - b, ref, p0)))
    np.testing.assert_allclose(
        _weight_distance(p, ref, p0), expected, rtol=1e-6)

  def test_identical_trees_exactly(self):
    u = {'w': jax.random.normal(jax.random.key(1), (7, 33)),
         'b': jnp.array([1e-3, -2.0])}
    fid = _update_fidelity(u, u)
    self.assertEqual(float(fid.norm_ratio), 1.0)
    self.assertEqual(float(fid.cosine), 1.0)
    self.assertEqual(float(_update_fidelity(
        u, jax.tree.map(lambda x: -x, u)).cosine), -1.0)
    p0 = jax.tree.map(jnp.zeros_like, u)
    self.assertEqual(float(_weight_distance(u, u, p0)), 0.0)

  def test_zero_conventions(self):
    zero, one = {'w': jnp.zeros(3)}, {'w': jnp.ones(3)}
    both = _update_fidelity(zero, zero)
    self.assertEqual((float(both.norm_ratio), float(both.cosine)),
                     (1.0, 1.0))
    no_ref = _update_fidelity(one, zero)
    np.testing.assert_allclose(no_ref.norm_ratio, np.sqrt(3) / _TINY,
                               rtol=1e-6)
    self.assertEqual(float(no_ref.cosine), 0.0)
    no_update = _update_fidelity(zero, one)
    self.assertEqual((float(no_update.norm_ratio), float(no_update.cosine)),
                     (0.0, 0.0))
    empty = _update_fidelity({}, {})
    self.assertEqual((float(empty.norm_ratio), float(empty.cosine)),
                     (1.0, 1.0))
    # Not moved and not apart: 0; apart from a reference that never moved:
    # finite.
    self.assertEqual(float(_weight_distance(one, one, one)), 0.0)
    apart = _weight_distance(zero, one, one)
    self.assertTrue(np.isfinite(apart))
    self.assertGreater(float(apart), 1e30)

  def test_non_float_leaves_left_out(self):
    u = {'w': jnp.array([3.0, 4.0]), 'n': jnp.array([7, 8], jnp.int32)}
    ref = {'w': jnp.array([6.0, 8.0]), 'n': jnp.array([0, 0], jnp.int32)}
    fid = _update_fidelity(u, ref)
    self.assertEqual((float(fid.norm_ratio), float(fid.cosine)), (0.5, 1.0))

  @parameterized.named_parameters(('huge', 1e30), ('tiny', 1e-30))
  def test_extreme_magnitudes_stay_finite(self, scale):
    x = jax.random.normal(jax.random.key(2), (300,))
    y = x + 0.1 * jax.random.normal(jax.random.key(3), (300,))
    ref = _update_fidelity({'w': x}, {'w': y})
    fid = _update_fidelity({'w': scale * x}, {'w': scale * y})
    np.testing.assert_allclose(fid.norm_ratio, ref.norm_ratio, rtol=1e-5)
    np.testing.assert_allclose(fid.cosine, ref.cosine, rtol=1e-5)
    np.testing.assert_allclose(
        _weight_distance({'w': scale * x}, {'w': scale * y},
                                {'w': jnp.zeros(300)}),
        _weight_distance({'w': x}, {'w': y}, {'w': jnp.zeros(300)}),
        rtol=1e-5)
    # The two scales against each other: capped, never inf or NaN.
    far = _update_fidelity({'w': 1e30 * x}, {'w': 1e-30 * y})
    self.assertEqual(float(far.norm_ratio), _MAX)
    self.assertTrue(np.isfinite(far.cosine))
    self.assertEqual(float(_update_fidelity(
        {'w': 1e-30 * x}, {'w': 1e30 * y}).norm_ratio), 0.0)

  def test_near_float32_max(self):
    # A largest magnitude above 2**126, whose reciprocal is subnormal.
    fid = _update_fidelity({'w': jnp.array([3e38, -3e38])},
                           {'w': jnp.ones(2)})
    np.testing.assert_allclose(float(fid.norm_ratio), 3e38, rtol=1e-6)
    self.assertEqual(float(fid.cosine), 0.0)
    self.assertEqual(float(_update_fidelity(
        {'w': jnp.array([3e38, 3e38])}, {'w': jnp.array([1e-38, 0.0])}
    ).norm_ratio), _MAX)
    fid = _update_fidelity({'w': jnp.array([3e38, 1e38])},
                           {'w': jnp.array([3e38, 1e38])})
    self.assertEqual((float(fid.norm_ratio), float(fid.cosine)), (1.0, 1.0))
    self.assertEqual(float(_weight_distance(
        {'w': jnp.array([3e38, 0.0])}, {'w': jnp.array([3e38, 0.0])},
        {'w': jnp.zeros(2)})), 0.0)

  def test_structure_mismatch(self):
    with self.assertRaisesRegex(ValueError, 'reference_updates.*structure'):
      _update_fidelity({'a': jnp.ones(2)}, {'b': jnp.ones(2)})
    with self.assertRaisesRegex(ValueError, 'initial_params'):
      _weight_distance({'a': jnp.ones(2)}, {'a': jnp.ones(2)},
                              [jnp.ones(2)])


class TrackFidelityTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('adamw', lambda: optax.adamw(1e-3)),
      ('sgd_momentum', lambda: optax.sgd(1e-2, momentum=0.9)))
  def test_identical_transforms_exactly(self, make):
    tx = optax_q.track_fidelity(make(), make(), steps=10)
    params, state, _ = _train(tx, _quadratic_params(), 10)
    np.testing.assert_array_equal(state.norm_ratio, np.ones(10))
    np.testing.assert_array_equal(state.cosine, np.ones(10))
    np.testing.assert_array_equal(state.weight_distance, np.zeros(10))
    jax.tree.map(np.testing.assert_array_equal, state.reference_params,
                 params)

  def test_int8_is_faithful(self):
    state = _lowbit_runs()['int8']
    self.assertEqual(int(state.count), 50)
    self.assertGreater(float(np.min(state.cosine)), 0.99)
    self.assertTrue(np.all((state.norm_ratio >= 0.95)
                           & (state.norm_ratio <= 1.05)),
                    state.norm_ratio)

  def test_4bit_is_less_faithful_than_int8(self):
    int8, four = _lowbit_runs()['int8'], _lowbit_runs()['4bit']
    self.assertLess(float(np.median(four.cosine)),
                    float(np.median(int8.cosine)))
    self.assertGreater(float(np.median(four.weight_distance)),
                       float(np.median(int8.weight_distance)))
    # Larger steps than float32's, as Jensen's inequality predicts for a
    # stochastically rounded second moment.
    self.assertGreater(float(np.median(four.norm_ratio)),
                       float(np.median(int8.norm_ratio)))

  def test_updates_are_the_inner_transforms_bit_for_bit(self):
    inner = optax_q.adamw(1e-3, mu_format='nf4', nu_format='ue4m0',
                          min_size=0)
    tx = optax_q.track_fidelity(inner, optax.adamw(1e-3), steps=2)
    params = _quadratic_params()
    _, state, wrapped = _train(tx, params, 3)
    _, inner_state, plain = _train(inner, params, 3)
    for a, b in zip(wrapped, plain):
      jax.tree.map(np.testing.assert_array_equal, a, b)
    jax.tree.map(np.testing.assert_array_equal, state.inner_state,
                 inner_state)

  def test_records_stop_after_steps(self):
    tx = optax_q.track_fidelity(optax.adam(1e-2), optax.adam(2e-2), steps=3)
    params = _quadratic_params()
    state = tx.init(params)
    np.testing.assert_array_equal(state.norm_ratio, np.full(3, np.nan))
    update = jax.jit(tx.update)
    states = []
    for _ in range(6):
      updates, state = update(_quadratic_grads(params), state, params)
      params = optax.apply_updates(params, updates)
      states.append(state)
    self.assertEqual(int(states[-1].count), 6)
    for name in ('norm_ratio', 'cosine', 'weight_distance',
                 'reference_params', 'reference_state'):
      jax.tree.map(np.testing.assert_array_equal, getattr(states[2], name),
                   getattr(states[-1], name))
    np.testing.assert_allclose(states[-1].norm_ratio, 0.5, rtol=1e-5)
    # NaN beyond what was recorded.
    tx = optax_q.track_fidelity(optax.adam(1e-2), optax.adam(1e-2), steps=5)
    _, state, _ = _train(tx, _quadratic_params(), 3)
    self.assertTrue(np.all(np.isfinite(state.cosine[:3])))
    self.assertTrue(np.all(np.isnan(state.cosine[3:])))
    self.assertEqual(optax_q.fidelity_summary(state)['steps'], 3)

  def test_extreme_gradients_give_finite_metrics(self):
    for scale in (1e30, 1e-30):
      tx = optax_q.track_fidelity(optax.sgd(0.1),
                                  optax.sgd(0.1, momentum=0.9), steps=4)
      _, state, _ = _train(
          tx, _quadratic_params(), 4,
          grads_fn=lambda p, s=scale: jax.tree.map(
              lambda x: s * jnp.ones_like(x), p))
      for name in ('norm_ratio', 'cosine', 'weight_distance'):
        self.assertTrue(np.all(np.isfinite(getattr(state, name))),
                        (scale, name, getattr(state, name)))
      # sgd against momentum: the second step is 1.9x the reference's.
      np.testing.assert_allclose(state.norm_ratio[1], 1 / 1.9, rtol=1e-5)

  def test_chain_jit_mixed_shapes_bf16_and_summary(self):
    params = {'kernel': jnp.ones((5, 3), jnp.bfloat16),
              'layers': [jnp.zeros(()), jnp.arange(4.0)]}
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax_q.track_fidelity(optax_q.adamw(1e-2), optax.adamw(1e-2),
                               steps=8))
    new_params, state, _ = _train(
        tx, params, 5, grads_fn=lambda p: jax.tree.map(
            lambda x: jnp.full(x.shape, 0.1, x.dtype), p))
    self.assertEqual(new_params['kernel'].dtype, jnp.bfloat16)
    found = state[1]
    self.assertIsInstance(found, optax_q.FidelityState)
    self.assertEqual(found.reference_params['kernel'].dtype, jnp.float32)
    summary = optax_q.fidelity_summary(state)
    self.assertEqual(summary['steps'], 5)
    for name in ('norm_ratio', 'cosine', 'weight_distance'):
      x = np.asarray(getattr(found, name)[:5], np.float64)
      self.assertEqual(summary[name], {
          'median': np.median(x), 'p10': np.percentile(x, 10),
          'p90': np.percentile(x, 90), 'mean': np.mean(x), 'last': x[-1]})
    self.assertGreater(summary['cosine']['median'], 0.99)

  def test_inside_multisteps(self):
    tx = optax.MultiSteps(
        optax_q.track_fidelity(optax.adam(1e-2), optax.adam(1e-2), steps=4),
        every_k_schedule=2)
    _, state, _ = _train(tx, _quadratic_params(), 6)
    summary = optax_q.fidelity_summary(state)
    self.assertEqual(summary['steps'], 3)
    self.assertEqual(summary['cosine']['median'], 1.0)

  def test_extra_args_reach_both(self):
    def update_fn(updates, state, params=None, *, scale):
      del params
      return jax.tree.map(lambda u: scale * u, updates), state
    scaled = optax.GradientTransformationExtraArgs(
        lambda params: optax.EmptyState(), update_fn)
    tx = optax_q.track_fidelity(scaled, optax.sgd(-2.0), steps=2)
    _, state, updates = _train(tx, _quadratic_params(), 2, scale=2.0)
    np.testing.assert_array_equal(state.norm_ratio, [1.0, 1.0])
    jax.tree.map(np.testing.assert_array_equal, updates[0], jax.tree.map(
        lambda g: 2.0 * g, _quadratic_grads(_quadratic_params())))

  def test_explicit_mesh(self):
    # The skipped reference's zero updates carry the reference's sharding,
    # so the two branches of the conditional agree.
    mesh = jax.make_mesh((8,), ('x',), axis_types=(AxisType.Explicit,))
    with jax.set_mesh(mesh):
      params = {'w': jax.device_put(jnp.ones((16, 64)),
                                    NamedSharding(mesh, P(None, 'x'))),
                'b': jnp.zeros(3)}
      tx = optax_q.track_fidelity(optax.adamw(1e-2), optax.adamw(1e-2),
                                  steps=2)
      _, state, updates = _train(
          tx, params, 3, grads_fn=lambda p: jax.tree.map(
              lambda x: 0.1 * x + 0.01, p))
      self.assertEqual(jax.typeof(updates[-1]['w']).sharding.spec,
                       P(None, 'x'))
      self.assertEqual(
          jax.typeof(state.reference_params['w']).sharding.spec, P(None, 'x'))
      np.testing.assert_array_equal(state.cosine, [1.0, 1.0])

  def test_summary_before_any_step(self):
    tx = optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1), steps=3)
    summary = optax_q.fidelity_summary(tx.init({'w': jnp.ones(2)}))
    self.assertEqual(summary['steps'], 0)
    self.assertTrue(np.isnan(summary['cosine']['median']))

  def test_init_copies_params(self):
    # Nothing in the state shares a buffer with params (they may be
    # donated).
    params = {'w': jnp.ones(3)}
    state = optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1),
                                   steps=2).init(params)
    self.assertIsNot(state.initial_params['w'], params['w'])
    self.assertIsNot(state.reference_params['w'], state.initial_params['w'])
    self.assertIsNot(state.cosine, state.norm_ratio)
    abstract = jax.eval_shape(
        optax_q.track_fidelity(optax.adam(0.1), optax.adam(0.1),
                               steps=7).init,
        {'w': jax.ShapeDtypeStruct((4, 2), jnp.bfloat16)})
    self.assertEqual(abstract.norm_ratio.shape, (7,))
    self.assertEqual(abstract.reference_params['w'].dtype, jnp.float32)


def _master_free_params(weight_format):
  """The quadratic's params, ``w`` quantized (master-free), ``b`` plain."""
  return optax_q.quantize_params(
      {'w': 0.1 * jax.random.normal(jax.random.key(1), (64, 128)),
       'b': jnp.zeros((8,))}, weight_format, filter='matrices')


def _master_free_grads(params):
  return _quadratic_grads(optax_q.dequantize_params(params, jnp.float32))


def _eco(rounding):
  return optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3),
                     rounding=rounding)


def _train_master_free(tx, params, steps):
  """``_train`` for params with QArray leaves (``optax_q.apply_updates``)."""
  state = tx.init(params)
  update = jax.jit(tx.update)
  all_updates = []
  for _ in range(steps):
    updates, state = update(_master_free_grads(params), state, params)
    all_updates.append(updates)
    params = optax_q.apply_updates(params, updates)
  return params, state, all_updates


@functools.cache
def _master_free_runs():
  """ECO with fp16 (nearest) and fp8 (stochastic) weights against float32
  AdamW: final params, states and updates."""
  return {fmt: _train_master_free(
      optax_q.track_fidelity(_eco(rounding), optax.adamw(1e-3), steps=10),
      _master_free_params(fmt), 10)
          for fmt, rounding in (('fp16', 'nearest'),
                                ('fp8_e4m3', 'stochastic'))}


class MasterFreeTest(parameterized.TestCase):
  """Params with QArray leaves, trained by ECO, against float32 AdamW."""

  def test_fine_weights_are_faithful(self):
    # fp16 weights round each step by a few parts in 10^4 of the weight.
    _, state, _ = _master_free_runs()['fp16']
    self.assertEqual(int(state.count), 10)
    for name in METRICS:
      self.assertTrue(np.all(np.isfinite(getattr(state, name))), name)
    self.assertTrue(np.all((state.norm_ratio >= 0.97)
                           & (state.norm_ratio <= 1.03)), state.norm_ratio)
    self.assertGreater(float(np.min(state.cosine)), 0.999)
    self.assertLess(float(np.max(state.weight_distance)), 0.05)

  def test_fp8_is_less_faithful_than_fp16(self):
    # Steps far below the fp8 grid's spacing, stochastically rounded:
    # right on average, much noisier than float32's step.
    fp16, fp8 = (_master_free_runs()[f][1] for f in ('fp16', 'fp8_e4m3'))
    for name in METRICS:
      self.assertTrue(np.all(np.isfinite(getattr(fp8, name))), name)
    self.assertLess(float(np.median(fp8.cosine)),
                    float(np.median(fp16.cosine)))
    self.assertGreater(float(np.median(fp8.norm_ratio)), 1.5)
    self.assertGreater(float(np.median(fp8.weight_distance)),
                       float(np.median(fp16.weight_distance)))

  def test_weights_that_do_not_move_took_no_step(self):
    # Zero gradients and no weight decay: neither eco nor the twin moves a
    # weight, and a weight decoded twice under jit must give a zero step
    # (not the last bits of a fused multiply-subtract), so the records are
    # the conventions at zero: 1, 1 and 0.
    params = _master_free_params('fp8_e4m3')
    tx = optax_q.track_fidelity(
        optax_q.eco(optax.inject_hyperparams(optax.adam)(1e-3),
                    rounding='stochastic'),
        optax.adam(1e-3), steps=3)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like,
                         optax_q.dequantize_params(params, jnp.float32))
    update = jax.jit(tx.update)
    for _ in range(3):
      updates, state = update(zeros, state, params)
      params = optax_q.apply_updates(params, updates)
    np.testing.assert_array_equal(state.norm_ratio, 1.0)
    np.testing.assert_array_equal(state.cosine, 1.0)
    np.testing.assert_array_equal(state.weight_distance, 0.0)

  @parameterized.named_parameters(('fp16', 'fp16', 'nearest'),
                                  ('fp8', 'fp8_e4m3', 'stochastic'))
  def test_updates_are_ecos_bit_for_bit(self, fmt, rounding):
    params, state, wrapped = _master_free_runs()[fmt]
    plain_params, inner_state, plain = _train_master_free(
        _eco(rounding), _master_free_params(fmt), 10)
    helpers.assert_bits_equal(wrapped, plain)
    helpers.assert_bits_equal(params, plain_params)
    helpers.assert_bits_equal(state.inner_state, inner_state)

  def test_records_are_the_landing_steps_of_the_decoded_weights(self):
    # One step by hand: the twin starts from the decoded weights, and is
    # compared with decoded(new) - decoded(old) on the quantized leaf and
    # with the update itself on the plain one.
    params = _master_free_params('fp8_e4m3')
    tx = optax_q.track_fidelity(_eco('nearest'), optax.adamw(1e-3), steps=2)
    state = jax.jit(tx.init)(params)
    p0 = optax_q.dequantize_params(params, jnp.float32)
    helpers.assert_bits_equal(state.initial_params, p0)
    helpers.assert_bits_equal(state.reference_params, p0)
    grads = _master_free_grads(params)
    updates, state = jax.jit(tx.update)(grads, state, params)
    new = optax_q.dequantize_params(
        optax_q.apply_updates(params, updates), jnp.float32)
    ref_updates, _ = optax.adamw(1e-3).update(
        grads, optax.adamw(1e-3).init(p0), p0)
    steps = {'w': new['w'] - p0['w'], 'b': updates['b']}
    fid = _update_fidelity(steps, ref_updates)
    np.testing.assert_allclose(state.norm_ratio[0], fid.norm_ratio,
                               rtol=1e-6)
    np.testing.assert_allclose(state.cosine[0], fid.cosine, rtol=1e-6)
    np.testing.assert_allclose(
        state.weight_distance[0],
        _weight_distance(new, optax.apply_updates(p0, ref_updates), p0),
        rtol=1e-5)
    # A coarse grid: the landing step is not the twin's step.
    self.assertLess(float(state.cosine[0]), 0.999)

  def test_chain_jit_and_summary(self):
    params = _master_free_params('bf16')
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax_q.track_fidelity(
                         optax_q.eco(optax.inject_hyperparams(optax.sgd)(
                             1e-2, momentum=0.9), rounding='nearest'),
                         optax.sgd(1e-2, momentum=0.9), steps=4))
    _, state, _ = _train_master_free(tx, params, 6)
    summary = optax_q.fidelity_summary(state)
    self.assertEqual(summary['steps'], 4)
    for name in METRICS:
      self.assertTrue(np.isfinite(summary[name]['p10']), name)
    # Clipped steps of a few bf16 spacings: the right way, roughly.
    self.assertGreater(summary['cosine']['p10'], 0.5)
    self.assertEqual(state[1].reference_params['w'].dtype, jnp.float32)

  def test_explicit_mesh_equals_unsharded(self):
    mesh = jax.make_mesh((4, 2), ('data', 'model'),
                         axis_types=(AxisType.Explicit,) * 2)
    qparams = _master_free_params('fp8_e4m3')
    _, plain_state, plain = _train_master_free(
        optax_q.track_fidelity(_eco('stochastic'), optax.adamw(1e-3),
                               steps=3), qparams, 3)
    with jax.set_mesh(mesh):
      spec = {'w': P('data', 'model'), 'b': P()}
      shardings = optax_q.state_shardings(
          qparams, jax.tree.map(lambda x: NamedSharding(mesh, x), spec))
      params = jax.device_put(qparams, shardings)
      tx = optax_q.track_fidelity(_eco('stochastic'), optax.adamw(1e-3),
                                  steps=3)
      _, state, updates = _train_master_free(tx, params, 3)
      self.assertEqual(
          jax.typeof(state.reference_params['w']).sharding.spec,
          P('data', 'model'))
    # tx's updates and states are the unsharded run's bit for bit; the
    # records are sums whose order follows the partitioning.
    helpers.assert_bits_equal(updates, plain)
    helpers.assert_bits_equal(state.inner_state, plain_state.inner_state)
    for name in METRICS:
      np.testing.assert_allclose(getattr(state, name),
                                 getattr(plain_state, name), rtol=1e-5)


class BadArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('zero', 0), ('negative', -3), ('bool', True), ('float', 2.0),
      ('str', '5'), ('none', None), ('huge', 2**31))
  def test_steps(self, steps):
    with self.assertRaisesRegex((TypeError, ValueError),
                                r'steps must be a positive int'):
      optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1), steps=steps)

  @parameterized.named_parameters(
      ('none', None), ('factory', optax.adamw), ('int', 3))
  def test_transforms(self, bad):
    with self.assertRaisesRegex(TypeError, 'reference must be an Optax'):
      optax_q.track_fidelity(optax.sgd(0.1), bad, steps=2)
    with self.assertRaisesRegex(TypeError, 'tx must be an Optax'):
      optax_q.track_fidelity(bad, optax.sgd(0.1), steps=2)

  def test_factory_hint(self):
    with self.assertRaisesRegex(TypeError, r'call it first'):
      optax_q.track_fidelity(optax.sgd(0.1), optax.adamw, steps=2)

  def test_update_needs_params(self):
    tx = optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1), steps=2)
    params = {'w': jnp.ones(2)}
    with self.assertRaisesRegex(ValueError, 'track_fidelity needs params'):
      tx.update(params, tx.init(params))

  def test_quantized_params_need_new_weights(self):
    # A float update for a QArray parameter: not a master-free transform.
    tx = optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1), steps=2)
    params = optax_q.quantize_params({'w': jnp.ones((2, 4))}, 'bf16',
                                     filter='all')
    with self.assertRaisesRegex(ValueError, r"\['w'\].*not new quantized"):
      tx.update({'w': jnp.ones((2, 4))}, tx.init(params), params)

  def test_summary_needs_exactly_one_state(self):
    params = {'w': jnp.ones(2)}
    with self.assertRaisesRegex(ValueError, 'found 0'):
      optax_q.fidelity_summary(optax.adam(0.1).init(params))
    track = optax_q.track_fidelity(optax.sgd(0.1), optax.sgd(0.1), steps=2)
    with self.assertRaisesRegex(ValueError, 'found 2'):
      optax_q.fidelity_summary(optax.chain(track, track).init(params))


if __name__ == '__main__':
  absltest.main()
