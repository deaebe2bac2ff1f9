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
"""Tests of state resets (``optax_q._src.resets``).

Semantics follow Algorithm 1 of Topollai & Choromanska (arXiv 2603.16731):
the reset happens after the K-th update of a cycle, and the next update
bias-corrects with local age 1, like a fresh Adam moment.
"""

import functools
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q
from optax_q._src import resets
from optax_q._src import theory


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
      'w': jax.random.normal(k1, (8, 128)) * 0.1,
      'v': jax.random.normal(k2, (4, 130)) * 0.1,  # Not a block multiple.
      'b': jnp.zeros((32,)),
  }


def _grads(step, params):
  keys = jax.random.split(jax.random.fold_in(jax.random.key(1), step), 3)
  leaves, treedef = jax.tree.flatten(params)
  return treedef.unflatten(
      [jax.random.normal(k, p.shape) * (1 + step % 3)
       for k, p in zip(keys, leaves)])


def _stepper(tx):
  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state
  return step


def _run(tx, params, steps, state=None, start=0, step=None):
  state = tx.init(params) if state is None else state
  step = step or _stepper(tx)
  for s in range(start, start + steps):
    params, state = step(params, state, _grads(s, params))
  return params, state


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


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
      _assert_trees_equal(got, want)

  @parameterized.parameters(
      ('fp8_e4m3', 'fp8_e4m3', 'nearest', 10**9),
      ('fp8_e4m3', 'fp8_e4m3', 'stochastic', 10**9),
      ('bf16', 'bf16', 'nearest', {'mu': None, 'nu': None}),
      ('bf16', 'bf16', 'stochastic', {'nu': 10**9}))
  def test_disabled_resets_are_bit_exact(self, mu, nu, rounding, reset_every):
    kw = dict(mu_format=mu, nu_format=nu, rounding=rounding)
    want, _ = _run(_adamw(**kw), _params(), 4)
    got, state = _run(_adamw(reset_every=reset_every, **kw), _params(), 4)
    _assert_trees_equal(got, want)
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
    g = _grads(k, p)
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
    _assert_trees_equal(inner.mu, ref[0].inner_state.mu)
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
    self.assertEqual(step._cache_size(), 1)  # pylint: disable=protected-access

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
    _assert_trees_equal(got_p, want_p)
    _assert_trees_equal(got_s, want_s)

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
    _assert_trees_equal(state.inner_states['plain'],
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
    _assert_trees_equal(mu, optax_q.quantized_leaves(state[0].inner_state.mu))
    _assert_trees_equal(out[0].stalled, state[0].stalled)


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
    self.assertEqual(step._cache_size(), 1)  # pylint: disable=protected-access
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


if __name__ == '__main__':
  absltest.main()
