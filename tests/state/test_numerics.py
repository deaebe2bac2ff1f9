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
"""Tests of ``check_numerics`` (``optax_q._src.state.numerics``): each
warning against a step that shows the failure it names, and silence on
healthy setups."""

import functools
import math
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q

_BF16_HALF_ULP_AT_1 = 2.0**-8  # bf16 keeps 7 mantissa bits: ulp(1) = 2**-7.


def _check(*args, **kwargs):
  """``check_numerics`` and the messages of the warnings it emitted."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    found = optax_q.check_numerics(*args, **kwargs)
  return found, [str(w.message) for w in caught
                 if issubclass(w.category, UserWarning)]


def _adam_step(params, grads, lr, **kwargs):
  """Params after one ``optax.adam`` step, applied in their own dtype."""
  tx = optax.adam(lr, **kwargs)
  updates, _ = tx.update(grads, tx.init(params), params)
  return optax.apply_updates(params, updates), updates


_PARAMS = {'w': jnp.zeros((2, 256))}


@functools.cache
def _updates(eps):
  """Jitted updates of Adam with the default low-bit state, and of its
  float32 twin (``b2=0.9``: bias correction fades within 30 steps)."""
  tx = optax_q.adam(1e-3, b2=0.9, eps=eps, min_size=0)
  ref = optax.adam(1e-3, b2=0.9, eps=eps)
  return tx, jax.jit(tx.update), ref, jax.jit(ref.update)


def _small_step_ratio(eps, grads, steps=30):
  """The state after ``steps`` steps on ``grads``, and the ratio of its
  step to float32 Adam's at element (0, 1)."""
  tx, update, ref, ref_update = _updates(eps)
  state, ref_state = tx.init(_PARAMS), ref.init(_PARAMS)
  for _ in range(steps):
    u, state = update(grads, state, _PARAMS)
    u_ref, ref_state = ref_update(grads, ref_state, _PARAMS)
  return float(u['w'][0, 1] / u_ref['w'][0, 1]), state


class LearningRateTest(parameterized.TestCase):

  @parameterized.parameters(1.0, 1.5)
  def test_bf16_weights_that_a_step_leaves_unchanged(self, magnitude):
    params = {'norm': {'scale': jnp.full((16,), magnitude, jnp.bfloat16)}}
    grads = {'norm': {'scale': -jnp.ones((16,), jnp.bfloat16)}}  # Upwards.
    after, _ = _adam_step(params, grads, 1e-3)
    np.testing.assert_array_equal(after['norm']['scale'],
                                  params['norm']['scale'])
    found, messages = _check(params, learning_rate=1e-3)
    self.assertLen(found, 1)
    f = found[0]
    self.assertEqual((f.kind, f.path, f.stored), ('learning_rate',
                                                  'norm/scale', 'bf16'))
    self.assertEqual((f.value, f.threshold, f.fraction),
                     (1e-3, _BF16_HALF_ULP_AT_1, 1.0))
    self.assertLen(messages, 1)
    for part in ('learning_rate=0.001', "'norm/scale' (bf16)", '0.00391',
                 'stochastic rounding', "rounding='stochastic'"):
      self.assertIn(part, messages[0])

  def test_a_healthy_learning_rate_moves_them_and_is_silent(self):
    params = {'scale': jnp.full((16,), 1.5, jnp.bfloat16)}
    after, _ = _adam_step(params, {'scale': -jnp.ones((16,), jnp.bfloat16)},
                          1e-2)
    self.assertTrue(bool(jnp.all(after['scale'] != params['scale'])))
    self.assertEqual(_check(params, learning_rate=1e-2), ([], []))

  def test_frozen_fraction_is_what_a_step_leaves_unchanged(self):
    # Magnitudes over four decades: the small weights move, the large not.
    w = jnp.logspace(-4, 0, 257)[:-1].reshape(16, 16).astype(jnp.bfloat16)
    lr = 1e-3
    (found,), _ = _check({'w': w}, learning_rate=lr, warn=False)
    grown = (w.astype(jnp.float32) + lr).astype(jnp.bfloat16)
    self.assertEqual(found.fraction, float(jnp.mean(grown == w)))
    self.assertGreater(found.fraction, 0.0)
    self.assertLess(found.fraction, 1.0)

  @parameterized.parameters(('fp8_e4m3', 448.0, 32.0), ('int8', 127.0, 1.0))
  def test_row_scaled_weights_use_their_scales(self, fmt, target, spacing):
    w = jax.random.normal(jax.random.key(0), (8, 64)) * 0.05
    q = optax_q.quantize_params({'kernel': w}, fmt, filter='all')
    largest = float(jnp.max(jnp.abs(optax_q.dequantize(q['kernel']))))
    # The largest weight sits at the grid's target; its spacing is the
    # spacing there times the row's scale, largest / target.
    want = spacing * largest / target / 2
    (found,), _ = _check(q, learning_rate=want / 2, warn=False)
    self.assertEqual(found.stored, f'{fmt}:row')
    np.testing.assert_allclose(found.threshold, want, rtol=1e-6)
    self.assertEqual(_check(q, learning_rate=want * 1.01), ([], []))

  def test_stochastic_rounding_turns_the_check_off(self):
    params = {'w': jnp.ones((4,), jnp.bfloat16)}
    self.assertEqual(
        _check(params, learning_rate=1e-5, rounding='stochastic'), ([], []))

  def test_float32_weights_are_healthy_at_usual_rates(self):
    params = {'w': jax.random.normal(jax.random.key(1), (32, 32))}
    self.assertEqual(_check(params, learning_rate=1e-5), ([], []))

  def test_schedules_and_injected_rates(self):
    params = {'w': jnp.ones((4,), jnp.bfloat16)}
    schedule = optax.linear_schedule(1e-2, 1e-4, 100)
    self.assertEqual(_check(params, learning_rate=schedule), ([], []))
    (found,), _ = _check(params, learning_rate=schedule, step=99, warn=False)
    self.assertAlmostEqual(found.value, float(schedule(99)))
    tx = optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(
        learning_rate=1e-4)
    (found,), _ = _check(params, tx.init(params), warn=False)
    self.assertAlmostEqual(found.value, 1e-4)

  def test_odd_params(self):
    params = {
        'zeros': jnp.zeros((8,), jnp.bfloat16),
        'scalar': jnp.asarray(1.5, jnp.bfloat16),
        'bad': jnp.array([jnp.nan, jnp.inf, 1.5], jnp.bfloat16),
        'ints': jnp.arange(4),
        'empty': jnp.zeros((0,), jnp.bfloat16),
        'abstract': jax.ShapeDtypeStruct((4,), jnp.bfloat16),
        'fp8': jnp.ones((3,), jnp.float8_e4m3fn),
    }
    found, _ = _check(params, learning_rate=1e-3, warn=False)
    self.assertEqual(sorted((f.path, f.stored, f.threshold) for f in found),
                     [('bad', 'bf16', 2.0**-8), ('fp8', 'fp8_e4m3', 2.0**-4),
                      ('scalar', 'bf16', 2.0**-8)])
    self.assertEqual([f.fraction for f in found if f.path == 'bad'], [1 / 3])
    self.assertEqual(_check(params, learning_rate=0.0), ([], []))
    (found,), _ = _check(jnp.ones(3, jnp.bfloat16), learning_rate=1e-3,
                         warn=False)
    self.assertEqual(found.path, '.')


  def test_sharded_params(self):
    mesh = jax.make_mesh((8,), ('x',),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    sharding = jax.sharding.NamedSharding(mesh, jax.P(None, 'x'))
    with jax.set_mesh(mesh):
      w = jax.device_put(jnp.full((4, 256), 1.5, jnp.float32), sharding)
      params = optax_q.quantize_params(
          {'plain': w.astype(jnp.bfloat16), 'kernel': w}, 'int8',
          filter=lambda path, leaf: leaf.dtype == jnp.float32)
      found, _ = _check(params, learning_rate=1e-4, warn=False)
    self.assertEqual([(f.path, f.stored) for f in found],
                     [('kernel', 'int8:row'), ('plain', 'bf16')])
    np.testing.assert_allclose([f.threshold for f in found],
                               [1.5 / 254, _BF16_HALF_ULP_AT_1], rtol=1e-6)


class EpsTest(absltest.TestCase):

  def test_fp16_eps_rounds_to_zero_and_steps_give_nan(self):
    params = {'w': jnp.ones((4,), jnp.float16)}
    _, updates = _adam_step(params, {'w': jnp.zeros((4,), jnp.float16)},
                            1e-3)
    self.assertTrue(bool(jnp.all(jnp.isnan(updates['w']))))
    state = optax.adam(1e-3).init(params)
    found, messages = _check(params, state, learning_rate=1e-3, eps=1e-8)
    kinds = {f.kind: f for f in found}
    self.assertEqual(set(kinds), {'eps_underflow', 'nu_floor'})
    self.assertEqual(kinds['eps_underflow'].threshold, 2.0**-24)
    self.assertEqual(kinds['nu_floor'].threshold, 2.0**-12)
    self.assertEqual(kinds['nu_floor'].path, '0/nu/w')
    self.assertLen(messages, 2)
    self.assertIn('0 by 0', messages[0])
    # An eps above both thresholds: finite steps, nothing found.
    _, updates = _adam_step(params, {'w': jnp.zeros((4,), jnp.float16)},
                            1e-3, eps=1e-3)
    self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))
    self.assertEqual(_check(params, state, eps=1e-3), ([], []))

  def test_bf16_and_float32_second_moments_hold_usual_eps(self):
    for dtype in (jnp.bfloat16, jnp.float32):
      params = {'w': jnp.ones((4,), dtype)}
      state = optax.adam(1e-3).init(params)
      self.assertEqual(_check(params, state, eps=1e-8), ([], []))
      # eps = 0: a float32 state is the reference, not flagged.
      self.assertLen(_check(params, state, eps=0.0, warn=False)[0],
                     dtype == jnp.bfloat16)

  def test_bf16_floor_fraction_counts_subnormal_moments(self):
    # bf16's floor is a float32 subnormal, which CPUs compare as zero.
    params = {'w': jnp.ones((4,), jnp.bfloat16)}
    state = optax.adam(1e-3).init(params)
    nu = {'w': jnp.array([1e-40, 1e-39, 0.0, 1.0], jnp.bfloat16)}
    state = (state[0]._replace(nu=nu), *state[1:])
    found, _ = _check(params, state, eps=1e-30, warn=False)
    self.assertEqual([(f.kind, f.fraction) for f in found],
                     [('nu_floor', 0.25)])

  def test_block_floor_and_the_steps_it_distorts(self):
    # Gradients 1 and 1e-4 side by side in every block of the default
    # (int8_dynamic) second moment: the small ones' v sits at the floor.
    grads = {'w': jnp.tile(jnp.array([1.0, 1e-4]), (2, 128))}
    ratio, state = _small_step_ratio(1e-8, grads)
    (found,), messages = _check(_PARAMS, state, eps=1e-8)
    self.assertEqual((found.kind, found.path, found.fraction),
                     ('nu_floor', '0/inner_state/nu/w', 0.5))
    self.assertEqual(found.stored, 'int8_dynamic_unsigned:block:128')
    # The floor: the block's largest v, 1 - 0.9**30, times the unsigned
    # dynamic map's smallest positive value.
    fmt = optax_q.get_format('int8_dynamic_unsigned')
    np.testing.assert_allclose(
        found.threshold, math.sqrt(fmt.min_positive * (1 - 0.9**30)),
        rtol=0.02)
    self.assertLess(ratio, 0.2)  # The small coordinates barely move.
    self.assertIn('bf16, a smaller block_size', messages[0])
    eps = found.threshold * 1.02
    ratio, state = _small_step_ratio(eps, grads)
    self.assertEqual(_check(_PARAMS, state, eps=eps), ([], []))
    self.assertGreater(ratio, 0.45)  # Within a factor of about 2.

  def test_healthy_state_is_silent(self):
    # Fresh gradients each step: the second moments average them, and no
    # block spans the 1750-fold range in gradients that reaches the floor.
    tx, update, _, _ = _updates(1e-8)
    state = tx.init(_PARAMS)
    for i in range(30):
      grads = {'w': jax.random.normal(jax.random.key(i), (2, 256)) * 0.01}
      _, state = update(grads, state, _PARAMS)
    self.assertEqual(_check(_PARAMS, state, learning_rate=1e-3, eps=1e-8),
                     ([], []))

  def test_abstract_state_and_injected_eps(self):
    params = {'w': jnp.ones((4,), jnp.float16)}
    abstract = jax.eval_shape(lambda: params)
    state = jax.eval_shape(optax.adam(1e-3).init, abstract)
    found, _ = _check(abstract, state, learning_rate=1e-3, eps=1e-8,
                      warn=False)
    self.assertEqual([f.kind for f in found], ['eps_underflow', 'nu_floor'])
    self.assertTrue(math.isnan(found[1].fraction))
    # An abstract injected learning rate holds no value: eps is still
    # checked.
    injected = jax.eval_shape(
        optax.inject_hyperparams(optax.adam)(1e-3).init, abstract)
    found, _ = _check(abstract, injected, eps=1e-8, warn=False)
    self.assertEqual([f.kind for f in found], ['eps_underflow', 'nu_floor'])
    tx = optax.inject_hyperparams(optax.adam, hyperparam_dtype=jnp.float32)(
        learning_rate=1e-2, eps=1e-8)
    found, _ = _check(params, tx.init(params), warn=False)
    self.assertEqual([(f.kind, f.value) for f in found],
                     [('eps_underflow', float(np.float32(1e-8))),
                      ('nu_floor', float(np.float32(1e-8)))])


class ArgumentsTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(learning_rate=-1e-3), 'learning_rate'),
      (dict(learning_rate='1e-3'), 'learning_rate'),
      (dict(learning_rate=jnp.ones(2)), 'learning_rate'),
      (dict(learning_rate=1e-3, rounding='up'), 'rounding'),
      (dict(learning_rate=1e-3, step=-1), 'step'),
      (dict(learning_rate=1e-3, warn='yes'), 'warn'),
      (dict(eps=1e-8), 'state'),
      (dict(), 'Nothing to check'),
  )
  def test_bad_arguments_named(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      optax_q.check_numerics({'w': jnp.ones(3)}, **kwargs)

  def test_bad_params_and_state(self):
    with self.assertRaisesRegex(ValueError, 'params must be a pytree'):
      optax_q.check_numerics({'w': 'abc'}, learning_rate=1e-3)
    tx = optax.adam(1e-3)
    with self.assertRaisesRegex(ValueError, 'optimizer state'):
      optax_q.check_numerics({'w': jnp.ones(3)}, tx, eps=1e-8)
    with self.assertRaisesRegex(ValueError, 'eps must be'):
      optax_q.check_numerics({'w': jnp.ones(3)},
                             tx.init({'w': jnp.ones(3)}), eps=-1.0)

  def test_traced_params_are_refused(self):
    with self.assertRaisesRegex(ValueError, 'outside jax.jit'):
      jax.jit(lambda p: optax_q.check_numerics(p, learning_rate=1e-3))(
          {'w': jnp.ones(3)})


if __name__ == '__main__':
  absltest.main()
