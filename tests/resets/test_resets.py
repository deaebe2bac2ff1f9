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
"""Tests of state resets (``optax_q._src.resets.resets``).

Semantics follow Algorithm 1 of Topollai & Choromanska (arXiv 2603.16731):
the reset happens after the K-th update of a cycle, and the next update
bias-corrects with local age 1, like a fresh Adam moment.
"""

import functools
import math
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import optax_q

import helpers
from optax_q._src.resets import resets
from optax_q._src.resets import theory


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
      'w': jax.random.normal(k1, (8, 128)) * 0.1,
      'v': jax.random.normal(k2, (4, 130)) * 0.1,  # Not a block multiple.
      'b': jnp.zeros((32,)),
  }


def _stepper(tx):
  return jax.jit(helpers.step_fn(tx))


def _run(tx, params, steps, state=None, start=0, step=None):
  state = tx.init(params) if state is None else state
  step = step or _stepper(tx)
  for s in range(start, start + steps):
    params, state = step(params, state, helpers.grads_cycled(s, params))
  return params, state


def _adamw(**kw):
  kw.setdefault('min_size', 0)
  return optax_q.adamw(1e-2, weight_decay=0.1, **kw)


class NoResetParityTest(parameterized.TestCase):

  def test_local_age_adam_is_optax_adam(self):
    for nesterov in (False, True):
      got, _ = _run(optax.chain(
          optax_q.scale_by_adam_local_age(nesterov=nesterov),
          optax.scale(-1e-2)), _params(), 4)
      want, _ = _run(optax.chain(optax.scale_by_adam(nesterov=nesterov),
                                 optax.scale(-1e-2)), _params(), 4)
      helpers.assert_trees_equal(got, want)

  @parameterized.parameters(
      ('fp8_e4m3', 'fp8_e4m3', 'nearest', 10**9),
      ('fp8_e4m3', 'fp8_e4m3', 'stochastic', 10**9),
      ('bf16', 'bf16', 'nearest', {'mu': None, 'nu': None}),
      ('bf16', 'bf16', 'stochastic', {'nu': 10**9}))
  def test_disabled_resets_are_bit_exact(self, mu, nu, rounding, reset_every):
    kw = dict(mu_format=mu, nu_format=nu, rounding=rounding)
    want, _ = _run(_adamw(**kw), _params(), 4)
    got, state = _run(_adamw(reset_every=reset_every, **kw), _params(), 4)
    helpers.assert_trees_equal(got, want)
    self.assertIsInstance(state[0], optax_q.ResetState)


class PeriodicResetTest(parameterized.TestCase):

  def test_symmetric_reset_restarts_like_fresh_adam(self):
    k = 3
    params = _params()
    tx = _adamw(mu_format='fp32', nu_format='fp32', reset_every=k)
    p, state = _run(tx, params, k)
    rs = state[0]
    inner = rs.inner_state.inner_state
    self.assertEqual(int(rs.ages['mu']), 0)
    self.assertEqual(int(rs.resets['nu']), 1)
    self.assertEqual(int(inner.count_mu), 0)
    self.assertEqual(int(inner.count_nu), 0)
    self.assertEqual(int(inner.count), k)  # The global count runs on.
    for x in jax.tree.leaves((inner.mu, inner.nu)):
      np.testing.assert_array_equal(x, 0.0)
    # Step k + 1 is Adam's first step on that gradient.
    g = helpers.grads_cycled(k, p)
    updates, state = jax.jit(tx.update)(g, state, p)
    fresh = optax.adamw(1e-2, weight_decay=0.1)
    want, _ = jax.jit(fresh.update)(g, fresh.init(p), p)
    for x, y in zip(jax.tree.leaves(updates), jax.tree.leaves(want)):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=0)

  def test_asymmetric_reset_keeps_mu(self):
    k = 4
    params = _params()
    kw = dict(mu_format='fp32', nu_format='fp32')
    _, ref = _run(_adamw(**kw), params, k)
    _, state = _run(_adamw(reset_every={'nu': k}, **kw), params, k)
    inner = state[0].inner_state.inner_state
    helpers.assert_trees_equal(inner.mu, ref[0].inner_state.mu)
    self.assertEqual(int(inner.count_mu), k)
    self.assertEqual(int(inner.count_nu), 0)
    for x in jax.tree.leaves(inner.nu):
      np.testing.assert_array_equal(x, 0.0)
    self.assertEqual(sorted(state[0].ages), ['nu'])

  @parameterized.parameters(
      ('fp8_e4m3', 'fp8_e4m3', 'stochastic'),
      ('fp4_e2m1', 'fp4_e2m2u', 'stochastic'),
      ('int8_dynamic', 'int8_dynamic', 'nearest'),
      ('bf16', 'bf16', 'nearest'))
  def test_quantized_leaves_become_encoded_zeros(self, mu, nu, rounding):
    tx = _adamw(mu_format=mu, nu_format=nu, rounding=rounding, reset_every=2)
    params = _params()
    s0 = tx.init(params)
    step = _stepper(tx)
    p1, s1 = _run(tx, params, 1, step=step)
    _, s2 = _run(tx, p1, 1, state=s1, start=1, step=step)
    shapes = lambda s: jax.tree.map(lambda x: (x.shape, x.dtype), s)
    self.assertEqual(shapes(s0), shapes(s2))
    leaves = optax_q.quantized_leaves(s2)
    self.assertLen(leaves, 6)
    for name, q in leaves.items():
      np.testing.assert_array_equal(optax_q.dequantize(q), 0.0, err_msg=name)
    for name, q in optax_q.quantized_leaves(s1).items():
      self.assertGreater(float(jnp.abs(optax_q.dequantize(q)).max()), 0, name)

  def test_auto_period_comes_from_the_stall_model(self):
    for fmt in ('bf16', 'fp8_e4m3', 'fp4_e2m2u'):
      got = resets.resolve_reset_every(
          'auto', optax_q.get_format(fmt), 0.999)
      want = theory.reset_period(fmt, b2=0.999)
      self.assertEqual(got, {'mu': want, 'nu': want})
    self.assertEqual(
        resets.resolve_reset_every({'nu': 'auto'},
                                   optax_q.get_format('fp8_e4m3'), 0.999),
        {'nu': 320})
    tx = _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3',
                reset_every='auto')
    self.assertEqual(sorted(tx.init(_params())[0].ages), ['mu', 'nu'])

  def test_no_recompiles_across_resets(self):
    tx = _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', reset_every=2)
    step = _stepper(tx)
    _, state = _run(tx, _params(), 7, step=step)
    self.assertEqual(int(state[0].resets['nu']), 3)
    # At most one compiled step (a global LRU may have evicted it since).
    self.assertLessEqual(step._cache_size(), 1)  # pylint: disable=protected-access

  def test_checkpoint_resume_is_exact(self):
    tx = _adamw(mu_format='fp8_e4m3', nu_format='fp4_e2m2u',
                rounding='stochastic', reset_every=3)
    params = _params()
    step = _stepper(tx)
    want_p, want_s = _run(tx, params, 8, step=step)
    p, s = _run(tx, params, 4, step=step)
    # A checkpoint holds plain host arrays; restore into the same treedef.
    leaves, treedef = jax.tree.flatten((p, s))
    saved = [np.array(x) for x in leaves]
    p, s = jax.tree.unflatten(treedef, [jnp.asarray(x) for x in saved])
    got_p, got_s = _run(tx, p, 4, state=s, start=4, step=step)
    helpers.assert_trees_equal(got_p, want_p)
    helpers.assert_trees_equal(got_s, want_s)

  def test_multisteps_counts_applied_steps(self):
    inner = _adamw(mu_format='fp32', nu_format='fp32', reset_every=2)
    tx = optax.MultiSteps(inner, every_k_schedule=3)
    _, state = _run(tx, _params(), 6)  # Two applied steps.
    self.assertEqual(int(state.inner_opt_state[0].resets['nu']), 1)


class CompositionTest(parameterized.TestCase):

  def test_partition_leaves_other_parts_alone(self):
    params = _params()
    labels = {'w': 'q', 'v': 'q', 'b': 'plain'}
    q = optax_q.adam(1e-2, mu_format='fp8_e4m3', nu_format='fp8_e4m3',
                     min_size=0, reset_every=2)
    tx = optax.partition({'q': q, 'plain': optax.adam(1e-2)}, labels)
    ref = optax.partition({'q': optax.adam(1e-2), 'plain': optax.adam(1e-2)},
                          labels)
    _, state = _run(tx, params, 4)
    _, ref_state = _run(ref, params, 4)
    helpers.assert_trees_equal(state.inner_states['plain'],
                        ref_state.inner_states['plain'])
    qleaves = optax_q.quantized_leaves(state.inner_states['q'])
    self.assertNotEmpty(qleaves)
    for x in qleaves.values():
      np.testing.assert_array_equal(optax_q.dequantize(x), 0.0)

  def test_masked_inner_state(self):
    params = _params()
    mask = {'w': True, 'v': False, 'b': True}
    tx = optax.chain(
        optax_q.reset_state(
            optax.masked(optax_q.scale_by_adam_local_age(), mask),
            {'nu': 2}),
        optax.scale(-1e-2))
    _, state = _run(tx, params, 2)
    masked = state[0].inner_state.inner_state
    np.testing.assert_array_equal(masked.nu['w'], 0.0)
    self.assertIsInstance(masked.nu['v'], optax.MaskedNode)
    self.assertGreater(float(jnp.abs(masked.mu['w']).max()), 0.0)
    self.assertEqual(int(masked.count_nu), 0)
    self.assertEqual(int(masked.count_mu), 2)

  def test_shared_count_without_counters_warns(self):
    with self.assertWarnsRegex(UserWarning, 'age counter'):
      optax_q.reset_state(optax.scale_by_adam(), 2)

  def test_shared_count_of_optax_adam(self):
    tx = optax_q.reset_state(optax.scale_by_adam(), 2,
                             counters={'mu': 'count', 'nu': 'count'})
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), _params(), 2)
    self.assertEqual(int(state[0].inner_state.count), 0)

  def test_telemetry_sees_through_the_wrapper(self):
    tx = _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', reset_every=5,
                track_stalls=True)
    _, state = _run(tx, _params(), 2)
    stalls = optax_q.stall_fraction(state)
    self.assertLen(stalls, 6)
    self.assertTrue(all(0.0 <= float(v) <= 1.0 for v in stalls.values()))

  def test_reset_where(self):
    tx = optax_q.quantize_state(optax.scale_by_adam(), 'fp8_e4m3', min_size=0)
    params = _params()
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), params, 1)
    out = jax.jit(lambda s, f: optax_q.reset_where(s, {'nu': f}))(
        state, jnp.asarray(True))
    nu = optax_q.quantized_leaves(out[0].inner_state.nu)
    mu = optax_q.quantized_leaves(out[0].inner_state.mu)
    for x in nu.values():
      np.testing.assert_array_equal(optax_q.dequantize(x), 0.0)
    helpers.assert_trees_equal(mu, optax_q.quantized_leaves(state[0].inner_state.mu))
    helpers.assert_trees_equal(out[0].stalled, state[0].stalled)


class AdaptiveResetTest(parameterized.TestCase):

  @parameterized.parameters('bf16', 'fp8_e4m3')
  def test_stalled_state_triggers_resets(self, fmt):
    # Zero gradients after the first step: with b2=0.999 a bf16 second
    # moment rounded to nearest cannot decay (every update stalls), while
    # the first moment (b1=0.9) keeps moving. In block-scaled fp8 the whole
    # block decays together: the scale moves, the codes stall.
    params = {'w': jnp.zeros((8, 64))}
    tx = optax_q.reset_state(
        optax_q.quantize_state(optax_q.scale_by_adam_local_age(),
                               {'mu': 'bf16', 'nu': fmt},
                               rounding='nearest', min_size=0),
        'adaptive', decay=0.99)
    step = jax.jit(tx.update)
    _, state = step({'w': jnp.full((8, 64), 0.3)}, tx.init(params))
    zeros = {'w': jnp.zeros((8, 64))}
    for _ in range(20):  # A/k = (k-1)/k catches 2b^k/(1+b^k) at k = 15.
      _, state = step(zeros, state)
    self.assertEqual(int(state.resets['mu']), 0)
    self.assertGreater(int(state.resets['nu']), 0)
    np.testing.assert_array_equal(
        optax_q.dequantize(state.inner_state.inner_state.nu['w']), 0.0)

  def test_moving_state_does_not_reset(self):
    tx = optax_q.reset_state(optax_q.scale_by_adam_local_age(), 'adaptive',
                             decay=0.99)
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), _params(), 30)
    self.assertEqual(int(state[0].resets['nu']), 0)
    self.assertEqual(int(state[0].ages['nu']), 30)


class ArgumentTest(parameterized.TestCase):

  @parameterized.parameters(0, -3, 1.5, True, 'sometimes', '300')
  def test_bad_period(self, value):
    with self.assertRaisesRegex(ValueError, 'reset_every'):
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', reset_every=value)
    with self.assertRaisesRegex(ValueError, 'every'):
      optax_q.reset_state(optax.scale_by_adam(), value)

  def test_traced_period_names_static_args(self):
    with self.assertRaisesRegex(ValueError, 'static_args'):
      _adamw(reset_every=jnp.asarray(3))

  def test_inject_hyperparams(self):
    static = ('reset_every', 'block_size', 'min_size', 'seed')
    make = functools.partial(
        optax.inject_hyperparams(optax_q.adamw, static_args=static,
                                 hyperparam_dtype=jnp.float32),
        learning_rate=1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3',
        min_size=0)
    tx = make(reset_every=2)  # b1, b2, eps are injected (traced) here.
    step = _stepper(tx)
    _, state = _run(tx, _params(), 3, step=step)
    self.assertEqual(int(state.inner_state[0].resets['nu']), 1)
    # At most one compiled step (a global LRU may have evicted it since).
    self.assertLessEqual(step._cache_size(), 1)  # pylint: disable=protected-access
    with self.assertRaisesRegex(ValueError, 'static_args'):
      make(reset_every='auto').init(_params())

  def test_unknown_moment(self):
    with self.assertRaisesRegex(ValueError, r"unknown moment.*'xi'"):
      _adamw(reset_every={'xi': 3})
    with self.assertRaisesRegex(ValueError, r"Unknown state field.*'trace'"):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), {'trace': 3})
    with self.assertRaisesRegex(ValueError, 'counters'):
      optax_q.reset_state(optax.scale_by_adam(), 3,
                          counters={'nu': 'count_nu'})

  @parameterized.parameters(0.0, 1.0, 1.5, -0.1)
  def test_bad_s0(self, s0):
    with self.assertRaisesRegex(ValueError, r's0.*\(0, 1\)'):
      optax_q.reset_state(optax.scale_by_adam(), 'adaptive', s0=s0)

  @parameterized.parameters('int8_dynamic', 'int4', 'fp32')
  def test_auto_needs_a_described_format(self, nu):
    with self.assertRaisesRegex(ValueError, "reset_every='auto'.*nu_format"):
      _adamw(mu_format='int8', nu_format=nu, reset_every='auto')

  def test_warnings(self):
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter('always')
      _adamw(mu_format='fp32', nu_format='fp32', reset_every=100)
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', reset_every=1)
      _adamw(mu_format='bf16', nu_format='bf16', b2=0.9, reset_every=10)
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', eps=1e-8,
             reset_every={'nu': 10})
    text = ' '.join(str(x.message) for x in w)
    self.assertIn('float32', text)
    self.assertIn('sign descent', text)
    self.assertIn('not indicated', text)
    self.assertIn('without mu', text)

  def test_eval_shape_init(self):
    tx = _adamw(mu_format='fp4_e2m1', nu_format='fp4_e2m2u', reset_every=7)
    abstract = jax.eval_shape(tx.init, _params())
    concrete = tx.init(_params())
    self.assertEqual(
        jax.tree.map(lambda x: (x.shape, x.dtype), abstract),
        jax.tree.map(lambda x: (x.shape, x.dtype), concrete))


# Adam's per-coordinate bound |m_hat| / (sqrt(v_hat) + eps) <= C.
def _adam_bound(b1=0.9, b2=0.999):
  return (1 - b1) / (math.sqrt(1 - b2) * (1 - b1 / math.sqrt(b2)))


def _soak_grads(step, shape):
  """0.05 + N(0, 1), with 100x spikes and near-zero steps now and then."""
  key = jax.random.fold_in(jax.random.key(42), step)
  k_g, k_step, k_spike = jax.random.split(key, 3)
  g = 0.05 + jax.random.normal(k_g, shape)
  u = jax.random.uniform(k_step, ())
  scale = jnp.where(u < 0.02, 100.0, jnp.where(u > 0.98, 1e-6, 1.0))
  spikes = jnp.where(jax.random.uniform(k_spike, shape) < 1e-3, 100.0, 1.0)
  return g * scale * spikes


def _soak(tx, steps, shape):
  """(largest |update| of each step, final state) over the soak gradients."""
  params = {'w': jnp.zeros(shape)}

  def body(state, k):
    updates, state = tx.update({'w': _soak_grads(k, shape)}, state, params)
    return state, jnp.max(jnp.abs(updates['w']))

  run = jax.jit(lambda s: jax.lax.scan(body, s, jnp.arange(steps)))
  state, peaks = run(tx.init(params))
  return np.asarray(peaks), state


_POLICIES = (
    ('none', None),
    ('int', 100),
    ('auto', 'auto'),  # K* = 320 for fp8_e4m3 at b2 = 0.999.
    ('adaptive', 'adaptive'),
    ('nu_only', {'nu': 50}),
    ('mu_nu', {'mu': 30, 'nu': 70}),
)


def _soak_cases():
  for name, policy in _POLICIES:
    for fmt in ('fp32', 'fp8_e4m3'):
      if not (policy == 'auto' and fmt == 'fp32'):  # 'auto' needs a grid.
        yield dict(testcase_name=f'{name}_{fmt}', policy=policy, fmt=fmt)


class _SoakMixin:

  def _check_soak(self, policy, fmt, steps, shape):
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # Asymmetric and fp32 resets warn.
      # The moment transform alone: lr = 1 only flips the sign, exactly.
      tx = optax_q.adam(1.0, mu_format=fmt, nu_format=fmt, min_size=0,
                        reset_every=policy)
    peaks, state = _soak(tx, steps, shape)
    bound = _adam_bound()
    worst = int(np.argmax(peaks))
    self.assertLessEqual(
        peaks[worst], bound * (1 + 1e-5),
        f'step {worst}: |update| {peaks[worst]:.4g} > C = {bound:.4g}')
    if policy is not None and not (policy == 'adaptive' and fmt == 'fp32'):
      # Not vacuous: the policy did reset (fp32 moments never stall).
      self.assertGreater(sum(map(int, state[0].resets.values())), 0)
    return peaks, state


class UpdateBoundTest(_SoakMixin, parameterized.TestCase):
  """Every reset policy keeps Adam's bound on the moment transform's output.

  Regression: resetting ``nu`` alone (``{'nu': K}``, or ``'adaptive'``,
  which reset ``nu`` 22 times and ``mu`` twice) divided an old momentum by
  a one-step ``v_hat`` and gave updates of 1e3 to 1e8 (times the learning
  rate) on these gradients.
  """

  @parameterized.named_parameters(*_soak_cases())
  def test_soak_bound(self, policy, fmt):
    self._check_soak(policy, fmt, steps=400, shape=(4, 128))

  def test_bound_binds_only_after_asymmetric_resets(self):
    # The fresh-Adam policies stay far inside C; nu-only resets reach it.
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      tx = optax_q.adam(1.0, mu_format='fp32', nu_format='fp32', min_size=0,
                        reset_every={'nu': 50})
    peaks, _ = _soak(tx, 400, (4, 128))
    np.testing.assert_allclose(peaks.max(), _adam_bound(), rtol=1e-5)

  def test_no_reset_updates_are_optax_adam_bit_for_bit(self):
    # The clip never binds without resets, even on spiky gradients.
    for nesterov in (False, True):
      got, _ = _soak(optax_q.scale_by_adam_local_age(nesterov=nesterov), 300,
                     (4, 128))
      want, _ = _soak(optax.scale_by_adam(nesterov=nesterov), 300, (4, 128))
      np.testing.assert_array_equal(got, want)

  def test_nesterov_bound(self):
    b1, b2 = 0.9, 0.999
    tx = optax_q.reset_state(
        optax_q.scale_by_adam_local_age(b1, b2, nesterov=True), {'nu': 50})
    peaks, _ = _soak(tx, 400, (4, 128))
    bound = b1 * _adam_bound(b1, b2) + 1 / math.sqrt(1 - b2)
    self.assertLessEqual(peaks.max(), bound * (1 + 1e-5))

  def test_injected_hyperparameters_bound(self):
    # b1 and b2 traced by inject_hyperparams: the bound is computed in f32.
    tx = optax_q.reset_state(
        optax.inject_hyperparams(optax_q.scale_by_adam_local_age)(
            b1=0.9, b2=0.999), {'nu': 50},
        counters={'nu': 'count_nu'})
    peaks, _ = _soak(tx, 200, (4, 128))
    self.assertLessEqual(peaks.max(), _adam_bound() * (1 + 1e-5))
    self.assertGreater(peaks.max(), _adam_bound() * (1 - 1e-5))

  def test_no_finite_bound_no_clip(self):
    # b1 >= sqrt(b2): Adam has no finite bound, and nothing is clipped.
    self.assertEqual(resets._update_bound(0.9, 0.8, False), math.inf)
    self.assertEqual(resets._update_bound(0.0, 0.0, True), math.inf)
    got, _ = _soak(optax_q.scale_by_adam_local_age(0.9, 0.8), 50, (2, 16))
    want, _ = _soak(optax.scale_by_adam(0.9, 0.8), 50, (2, 16))
    np.testing.assert_array_equal(got, want)

  def test_adaptive_resets_both_moments_together(self):
    # Regression: 'adaptive' reset nu 22 times and mu twice in 5000 steps.
    tx = _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3',
                reset_every='adaptive')
    _, state = _soak(tx, 400, (4, 128))
    rs = state[0]
    self.assertGreater(int(rs.resets['nu']), 0)
    self.assertEqual(int(rs.resets['mu']), int(rs.resets['nu']))
    self.assertEqual(int(rs.ages['mu']), int(rs.ages['nu']))
    inner = rs.inner_state.inner_state
    self.assertEqual(int(inner.count_mu), int(inner.count_nu))

  def test_same_policy_dict_resets_together(self):
    with warnings.catch_warnings(record=True) as w:
      warnings.simplefilter('always')
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3',
             reset_every={'mu': 'adaptive', 'nu': 'adaptive'})
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', reset_every=300)
    self.assertFalse([x for x in w if 'without mu' in str(x.message)])
    with self.assertWarnsRegex(UserWarning, r"without mu.*C = 31\.8"):
      _adamw(mu_format='fp8_e4m3', nu_format='fp8_e4m3', eps=1e-6,
             reset_every={'mu': 30, 'nu': 70})


@pytest.mark.slow
class LongSoakTest(_SoakMixin, parameterized.TestCase):
  """The soak at the size of the report: 5000 steps on a (64, 256) leaf."""

  @parameterized.named_parameters(*_soak_cases())
  def test_long_soak_bound(self, policy, fmt):
    self._check_soak(policy, fmt, steps=5000, shape=(64, 256))


class GroupsTest(parameterized.TestCase):

  def test_group_resets_when_either_fires(self):
    tx = optax_q.reset_state(optax_q.scale_by_adam_local_age(),
                             {'mu': 3, 'nu': 5}, groups=(('mu', 'nu'),))
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), _params(), 3)
    rs = state[0]
    self.assertEqual({f: int(n) for f, n in rs.resets.items()},
                     {'mu': 1, 'nu': 1})
    self.assertEqual(int(rs.inner_state.count_nu), 0)
    for x in jax.tree.leaves((rs.inner_state.mu, rs.inner_state.nu)):
      np.testing.assert_array_equal(x, 0.0)

  def test_without_groups_fields_are_independent(self):
    tx = optax_q.reset_state(optax_q.scale_by_adam_local_age(),
                             {'mu': 3, 'nu': 5})
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), _params(), 3)
    self.assertEqual(int(state[0].resets['nu']), 0)
    self.assertEqual(int(state[0].inner_state.count_nu), 3)

  @parameterized.parameters(
      ((('mu', 'trace'),), 'not reset'),
      (('mu', 'nu'), 'sequence of tuples'),
      ('mu', 'sequence of tuples'),
      (None, 'sequence of tuples'),
      ((('mu', 'nu'), ('nu',)), 'more than one group'),
      (((1, 2),), 'sequence of tuples'),
  )
  def test_bad_groups(self, groups, msg):
    with self.assertRaisesRegex(ValueError, f'groups.*{msg}'):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), 3, groups=groups)

  def test_group_needs_reset_fields(self):
    with self.assertRaisesRegex(ValueError, r"groups names field.*\['mu'\]"):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), {'nu': 3},
                          groups=(('mu', 'nu'),))


class StoredFormatTest(parameterized.TestCase):

  @parameterized.parameters('fp4_e2m1', 'fp4_e2m2u', 'fp4')
  def test_auto_period_of_the_stored_format(self, nu):
    # fp4_e2m1 second moments are stored in fp4_e2m2u (unsigned_variant):
    # K* must come from that grid, whatever the spelling (was 156 vs 224).
    self.assertEqual(resets.resolve_reset_every('auto', nu, 0.999),
                     {'mu': 224, 'nu': 224})
    self.assertEqual(
        resets.resolve_reset_every('auto', optax_q.get_format(nu), 0.999),
        {'mu': 224, 'nu': 224})

  @parameterized.parameters('fp4_e2m1', 'fp4_e2m2u')
  def test_drop_in_resets_at_the_stored_formats_period(self, nu):
    tx = _adamw(mu_format='fp4_e2m1', nu_format=nu, reset_every='auto')
    _, state = _soak(tx, 223, (2, 128))
    self.assertEqual(int(state[0].resets['nu']), 0)
    self.assertEqual(int(state[0].ages['nu']), 223)
    state = jax.jit(tx.update)({'w': jnp.ones((2, 128))}, state,
                               {'w': jnp.zeros((2, 128))})[1]
    self.assertEqual(int(state[0].resets['nu']), 1)


class ArgumentErrorsTest(parameterized.TestCase):
  """Errors at construction that name the argument and the allowed values."""

  def _state(self):
    tx = optax.scale_by_adam()
    params = {'w': jnp.ones(3)}
    return tx.update(params, tx.init(params))[1]

  @parameterized.parameters(3, None, 1.5, (('count_nu', 3),))
  def test_counters_value(self, value):
    with self.assertRaisesRegex(
        ValueError, r"counters\['nu'\] must be an integer state field name"):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), 3,
                          counters={'nu': value})

  def test_counters_container_and_keys(self):
    inner = optax_q.scale_by_adam_local_age()
    with self.assertRaisesRegex(ValueError, 'counters must be a dict'):
      optax_q.reset_state(inner, 3, counters=['count_nu'])
    with self.assertRaisesRegex(ValueError, 'counters keys must be'):
      optax_q.reset_state(inner, 3, counters={1: 'count_nu'})
    # A misspelt key used to leave nu's age running after its resets.
    with self.assertRaisesRegex(
        ValueError, r"counters names field\(s\) \['nuu'\].*\['mu', 'nu'\]"):
      optax_q.reset_state(inner, 3, counters={'nuu': 'count_nu'})

  def test_auto_with_b2_zero_names_b2(self):
    with self.assertRaisesRegex(ValueError, r'b2.*\(0, 1\).*b2=0\.0') as cm:
      optax_q.adamw(1e-3, b2=0.0, reset_every='auto', nu_format='fp8_e4m3')
    self.assertNotIn('nu_format', str(cm.exception))

  def test_adaptive_with_b2_zero_names_b2(self):
    with self.assertRaisesRegex(ValueError, r"'adaptive'.*b2 must lie"):
      optax_q.adamw(1e-3, b2=0.0, reset_every='adaptive',
                    nu_format='fp8_e4m3')

  def test_periodic_resets_accept_b2_zero(self):
    # b2 = 0 is valid Adam; periodic resets do not read any decay.
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      tx = optax_q.adamw(1e-3, b2=0.0, reset_every=5, nu_format='fp8_e4m3')
    _run(tx, _params(), 1)

  def test_auto_names_the_users_format(self):
    with self.assertRaisesRegex(
        ValueError, r"nu_format='int8_dynamic' \(stored as "
        r'int8_dynamic_unsigned\)'):
      resets.resolve_reset_every('auto', 'int8_dynamic', 0.999)

  @parameterized.parameters('nu', 'mu')
  def test_reset_where_bare_string(self, fields):
    with self.assertRaisesRegex(ValueError, 'fields must be a sequence.*'
                                'got the string'):
      optax_q.reset_where(self._state(), True, fields=fields)

  def test_reset_where_unknown_field(self):
    with self.assertRaisesRegex(
        ValueError, r"\['nuu'\].*fields are \['count', 'mu', 'nu'\]"):
      optax_q.reset_where(self._state(), True, fields=('nuu',))

  @parameterized.parameters(1, 'yes', None, (np.ones(2, bool),), 0.0)
  def test_reset_where_bad_flag(self, flag):
    with self.assertRaisesRegex(ValueError, 'where must be a boolean scalar'):
      optax_q.reset_where(self._state(), flag)
    with self.assertRaisesRegex(ValueError, r"where\['nu'\] must be a bool"):
      optax_q.reset_where(self._state(), {'nu': flag})

  def test_reset_where_numpy_and_traced_flags(self):
    state = self._state()
    out = optax_q.reset_where(state, np.bool_(True), fields=('nu',))
    np.testing.assert_array_equal(out.nu['w'], 0.0)
    out = jax.jit(lambda s, f: optax_q.reset_where(s, f, ('mu',)))(
        state, jnp.asarray(True))
    np.testing.assert_array_equal(out.mu['w'], 0.0)

  @parameterized.parameters(2**31, np.int64(2**40), 10**30, -1, 0, 2.0,
                            float('nan'), float('inf'), True)
  def test_bad_period_values(self, value):
    with self.assertRaisesRegex(ValueError,
                                r'every must be None, an int in \[1, 2\*\*31'):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), value)
    with self.assertRaisesRegex(ValueError, 'reset_every'):
      resets.resolve_reset_every(value, 'fp8_e4m3', 0.999)

  @parameterized.parameters(
      ('decay', float('nan')), ('decay', 1.0), ('decay', '0.9'),
      ('decay', np.float32(-0.5)), ('s0', float('inf')), ('s0', None),
      ('p_ss', float('nan')), ('p_ss', 0.0), ('p_ss', np.float64(1.5)),
      ('p_ss', True),
  )
  def test_bad_adaptive_numbers(self, name, value):
    with self.assertRaisesRegex(ValueError, f'{name} must'):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), 'adaptive',
                          **{name: value})

  @parameterized.parameters(
      ('b1', float('nan')), ('b1', 1.0), ('b2', -0.1), ('b2', '0.999'),
      ('eps', -1e-8), ('eps', float('inf')), ('eps_root', float('nan')),
      ('nesterov', 'yes'),
  )
  def test_bad_local_age_adam_arguments(self, name, value):
    with self.assertRaisesRegex(ValueError, f'{name} must'):
      optax_q.scale_by_adam_local_age(**{name: value})

  def test_inner_must_be_a_transformation(self):
    with self.assertRaisesRegex(ValueError, 'inner must be an Optax'):
      optax_q.reset_state(lambda g: g, 3)

  def test_fields_must_be_names(self):
    inner = optax_q.scale_by_adam_local_age()
    for fields in ('nu', 3, [1, 2], None):
      with self.assertRaisesRegex(ValueError, 'fields must be a sequence'):
        optax_q.reset_state(inner, 3, fields=fields)

  def test_numpy_scalars_are_accepted(self):
    inner = optax_q.scale_by_adam_local_age(
        np.float32(0.9), np.float64(0.999), np.float32(1e-8), np.float64(0))
    tx = optax_q.reset_state(inner, {'mu': np.int64(3), 'nu': 'adaptive'},
                             decay=np.float32(0.99), s0=np.float64(0.6),
                             p_ss=np.float32(1.0))
    _, state = _run(optax.chain(tx, optax.scale(-1e-2)), _params(), 3)
    self.assertEqual(int(state[0].resets['mu']), 1)
    self.assertEqual(
        resets.resolve_reset_every(np.int32(7), 'fp8_e4m3', 0.999),
        {'mu': 7, 'nu': 7})
    self.assertEqual(
        resets.resolve_reset_every('auto', 'fp8_e4m3', np.float64(0.999)),
        {'mu': 320, 'nu': 320})
    self.assertEqual(
        resets.resolve_reset_every('auto', 'fp8_e4m3', np.array(0.999)),
        {'mu': 320, 'nu': 320})


class WarningLocationTest(parameterized.TestCase):
  """Warnings point at the caller's line, not at a library frame (a fixed
  stacklevel pointed inside optax_q/_src/dropins/alias.py)."""

  @parameterized.named_parameters(
      ('float32_resets', lambda: optax_q.adamw(
          1e-3, mu_format='fp32', nu_format='fp32', reset_every=100)),
      ('nu_without_mu', lambda: optax_q.adamw(
          1e-3, eps=1e-8, reset_every={'nu': 4})),
      ('period_one', lambda: optax_q.adam_with_resets(reset_every=1)),
      ('deprecated_name', lambda: optax_q.quantize(
          jnp.ones(8), 'int8', scale='tensor')),
  )
  def test_points_at_the_caller(self, make):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always')
      make()
    self.assertNotEmpty(caught)
    for w in caught:
      self.assertEqual(w.filename, __file__, str(w.message))
    self.assertNotIn('ablation', ' '.join(str(w.message) for w in caught))


if __name__ == '__main__':
  absltest.main()
