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
"""Tests of ``quantize_state``, the drop-in optimizers and memory accounting.

The reference is Optax itself: with ``fp32`` formats (and with a simulated
float32 grid) the quantized optimizers must reproduce Optax's bit for bit.
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q

import helpers


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
      'w': jax.random.normal(k1, (64, 128)) * 0.1,
      'v': jax.random.normal(k2, (40, 130)) * 0.1,  # Not a block multiple.
      'b': jnp.zeros((128,)),  # Small: stays float32.
  }


def _run(tx, params, steps=5):
  state = tx.init(params)
  step = jax.jit(helpers.step_fn(tx))
  for s in range(steps):
    params, state = step(params, state, helpers.grads_cycled(s, params))
  return params, state


def _assert_trees_equal(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class OptaxParityTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('adamw', functools.partial(optax_q.adamw, 1e-2, weight_decay=0.1),
       functools.partial(optax.adamw, 1e-2, weight_decay=0.1)),
      ('adam', functools.partial(optax_q.adam, 1e-2),
       functools.partial(optax.adam, 1e-2)),
      ('adamw_nesterov',
       functools.partial(optax_q.adamw, 1e-2, nesterov=True),
       functools.partial(optax.adamw, 1e-2, nesterov=True)),
  )
  def test_adam_family_fp32_bit_exact(self, ours, theirs):
    want, _ = _run(theirs(), _params())
    got, _ = _run(ours(mu_format='fp32', nu_format='fp32', min_size=0),
                  _params())
    _assert_trees_equal(got, want)
    # A simulated float32 grid goes through the whole codec; XLA may fuse
    # the decoded arithmetic differently, so allow one float32 ulp.
    got, _ = _run(ours(mu_format='e8m23', nu_format='e8m23',
                       rounding='nearest', min_size=0), _params())
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-8)

  def test_lion_fp32_bit_exact(self):
    got, _ = _run(optax_q.lion(1e-3, mu_format='fp32'), _params())
    want, _ = _run(optax.lion(1e-3), _params())
    _assert_trees_equal(got, want)

  def test_sgd_momentum_fp32_bit_exact(self):
    for fmt in ('fp32', 'e8m23'):
      got, _ = _run(optax_q.sgd(1e-2, momentum=0.9, mu_format=fmt,
                                rounding='nearest', min_size=0), _params())
      want, _ = _run(optax.sgd(1e-2, momentum=0.9), _params())
      _assert_trees_equal(got, want)

  def test_sgd_without_momentum_is_sgd(self):
    got, _ = _run(optax_q.sgd(1e-2), _params())
    want, _ = _run(optax.sgd(1e-2), _params())
    _assert_trees_equal(got, want)

  def test_bf16_mu_matches_optax_mu_dtype(self):
    got, gs = _run(optax_q.adamw(1e-2, mu_format='bf16', nu_format='fp32',
                                 rounding='nearest', min_size=0), _params())
    want, ws = _run(optax.adamw(1e-2, mu_dtype=jnp.bfloat16), _params())
    _assert_trees_equal(got, want)
    mu = optax_q.dequantize(gs[0].inner_state.mu['w'])
    np.testing.assert_array_equal(mu.astype(jnp.bfloat16), ws[0].mu['w'])

  @parameterized.parameters('fp8_e4m3', 'int8_dynamic', 'int4', 'fp4_e2m1')
  def test_low_precision_stays_close_to_fp32(self, fmt):
    nu = 'fp4_e2m2u' if fmt == 'fp4_e2m1' else fmt
    got, state = _run(optax_q.adamw(1e-3, mu_format=fmt, nu_format=nu),
                      _params(), steps=10)
    want, _ = _run(optax.adamw(1e-3), _params(), steps=10)
    init = _params()
    for k in got:
      moved = np.abs(np.asarray(want[k] - init[k])).mean()
      diff = np.abs(np.asarray(got[k] - want[k])).mean()
      if moved:
        self.assertLess(diff, 0.25 * moved, (fmt, k))
    self.assertNotEmpty(optax_q.quantized_leaves(state))


class QuantizeStateTest(parameterized.TestCase):

  def test_leaf_selection(self):
    tx = optax_q.quantize_state(optax.scale_by_adam(),
                                {'mu': 'int8', 'nu': 'fp8_e4m3'},
                                min_size=4096)
    state = jax.eval_shape(tx.init, _params())
    leaves = optax_q.quantized_leaves(state)
    self.assertEqual(sorted(leaves), ['inner_state/mu/v', 'inner_state/mu/w',
                                      'inner_state/nu/v', 'inner_state/nu/w'])
    self.assertEqual(leaves['inner_state/mu/w'].fmt.name, 'int8')
    self.assertEqual(leaves['inner_state/nu/w'].fmt.name, 'fp8_e4m3')
    self.assertEqual(state.inner_state.mu['b'].dtype, jnp.float32)

  def test_callable_formats_by_path(self):
    def policy(path, leaf):
      return 'int4' if path.endswith('/w') else None
    tx = optax_q.quantize_state(optax.scale_by_adam(), policy, min_size=0)
    leaves = optax_q.quantized_leaves(tx.init(_params()))
    self.assertEqual(sorted(leaves), ['inner_state/mu/w', 'inner_state/nu/w'])
    self.assertEqual(leaves['inner_state/nu/w'].fmt.name, 'int4_unsigned')

  def test_dynamic_map_is_unsigned_for_nu(self):
    tx = optax_q.quantize_state(optax.scale_by_adam(), 'int8_dynamic',
                                min_size=0)
    leaves = optax_q.quantized_leaves(tx.init(_params()))
    self.assertEqual(leaves['inner_state/mu/w'].fmt.name, 'int8_dynamic')
    self.assertEqual(leaves['inner_state/nu/w'].fmt.name,
                     'int8_dynamic_unsigned')

  @parameterized.parameters(('int4', 'int4_unsigned'),
                            ('fp4_e2m1', 'fp4_e2m2u'))
  def test_second_moment_grid_has_no_zero(self, fmt, nu_name):
    tx = optax_q.quantize_state(optax.scale_by_adam(), fmt, min_size=0)
    params = {'w': jnp.zeros((4, 256))}
    grads = {'w': jnp.ones((4, 256)).at[:, ::2].set(1e-4)}
    _, state = jax.jit(tx.update)(grads, tx.init(params))
    nu = state.inner_state.nu['w']
    self.assertEqual(nu.fmt.name, nu_name)
    self.assertTrue(bool(jnp.all(optax_q.dequantize(nu) > 0)))

  @parameterized.parameters('fp8_e4m3', 'fp8_e5m2', 'int8_dynamic', 'int8',
                            'bf16', 'e3m2')
  def test_second_moment_never_rounds_to_zero(self, fmt):
    # A coordinate whose gradient is 1e-6 of its block's maximum has a
    # second moment 1e-12 of it: below every 8-bit grid's smallest value.
    # It must be stored as that smallest value, not as zero (the first
    # moment, a signed field, keeps plain rounding).
    params = {'w': jnp.zeros((4, 256))}
    grads = {'w': jnp.ones((4, 256)).at[:, ::2].set(1e-6).at[0, 1].set(0.0)}
    for rounding in ('nearest', 'stochastic'):
      tx = optax_q.quantize_state(optax.scale_by_adam(), fmt, min_size=0,
                                  rounding=rounding)
      _, state = jax.jit(tx.update)(grads, tx.init(params))
      nu = state.inner_state.nu['w']
      self.assertTrue(nu.fmt.positive_floor)
      self.assertFalse(state.inner_state.mu['w'].fmt.positive_floor)
      decoded = optax_q.dequantize(nu)
      self.assertTrue(bool(jnp.all(decoded[grads['w'] != 0] > 0)),
                      rounding)
      self.assertEqual(float(decoded[0, 1]), 0.0)  # zero stays zero

  @parameterized.parameters('fp8_e4m3', 'int8_dynamic')
  def test_tiny_gradients_do_not_blow_up_the_update(self, fmt):
    # Found in the precision study: fp8 e4m3 second moments of coordinates
    # with 1e-5 gradients (next to 1.0 in the same block) were stored as
    # zero, and their Adam update became m / eps, 1000x the largest float32
    # update.
    params = {'w': jnp.zeros((8, 512))}
    grads = {'w': jnp.ones((8, 512)).at[:, ::3].set(1e-5)}
    tx = optax_q.adam(1.0, mu_format=fmt, nu_format=fmt, min_size=0,
                      rounding='stochastic')
    ref = optax.adam(1.0)
    state, ref_state = tx.init(params), ref.init(params)
    update, ref_update = jax.jit(tx.update), jax.jit(ref.update)
    for _ in range(10):
      u, state = update(grads, state, params)
      r, ref_state = ref_update(grads, ref_state, params)
      self.assertTrue(bool(jnp.all(jnp.isfinite(u['w']))))
      self.assertLessEqual(float(jnp.max(jnp.abs(u['w']))),
                           1.1 * float(jnp.max(jnp.abs(r['w']))))

  def test_state_dtypes_are_stable(self):
    tx = optax_q.adamw(1e-3, mu_format='fp8_e4m3', nu_format='int4',
                       min_size=0)
    params = _params()
    s0 = tx.init(params)
    _, s1 = jax.jit(tx.update)(helpers.grads_cycled(0, params), s0, params)
    self.assertEqual(jax.tree.map(lambda x: (x.shape, x.dtype), s0),
                     jax.tree.map(lambda x: (x.shape, x.dtype), s1))

  def test_stochastic_rounding_keeps_bf16_nu_decaying(self):
    # bf16(0.999) == 1: with nearest rounding a bf16 second moment cannot
    # decay by 1e-3 per step; stochastic rounding keeps it on course.
    params = {'w': jnp.zeros((64, 64))}
    out = {}
    for rounding in ('nearest', 'stochastic'):
      tx = optax_q.quantize_state(optax.scale_by_adam(b2=0.999),
                                  {'nu': 'bf16'}, rounding=rounding,
                                  min_size=0)
      state = tx.init(params)
      update = jax.jit(tx.update)
      _, state = update({'w': jnp.ones((64, 64))}, state)
      zeros = {'w': jnp.zeros((64, 64))}
      state = jax.lax.fori_loop(
          0, 1000, lambda _, s: update(zeros, s)[1], state)
      nu = optax_q.dequantize(state.inner_state.nu['w'])
      out[rounding] = float(jnp.mean(nu))
    exact = 1e-3 * 0.999**1000
    self.assertGreater(out['nearest'], 2 * exact)
    self.assertAlmostEqual(out['stochastic'], exact, delta=0.02 * exact)

  def test_stall_fraction_reported(self):
    tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='int4', min_size=0,
                       track_stalls=True)
    _, state = _run(tx, _params(), steps=3)
    stalls = optax_q.stall_fraction(state)
    self.assertNotEmpty(stalls)
    for v in stalls.values():
      self.assertEqual(v.shape, ())
      self.assertBetween(float(v), 0.0, 1.0)

  def test_drop_ins_skip_stall_telemetry_by_default(self):
    # Opt-in: the comparison of every stored code is a pass over the state.
    # The state after one update, traced (its structure is what is checked;
    # nothing needs compiling).
    def updated_state(tx):
      params = _params()
      state = jax.eval_shape(tx.init, params)
      return jax.eval_shape(tx.update, params, state, params)[1]

    for make in (lambda: optax_q.adamw(1e-3, min_size=0),
                 lambda: optax_q.lion(1e-3, min_size=0),
                 lambda: optax_q.adamw(1e-3, min_size=0, reset_every=5)):
      self.assertEmpty(optax_q.stall_fraction(updated_state(make())))
    plain = optax_q.quantize_state(optax.scale_by_adam(), min_size=0)
    self.assertNotEmpty(optax_q.stall_fraction(updated_state(plain)))


class MemoryTest(parameterized.TestCase):

  @parameterized.parameters(
      ('fp32', 'fp32', 32.0), ('bf16', 'bf16', 16.0),
      ('int8_dynamic', 'int8_dynamic', 8.25), ('fp8_e4m3', 'fp8_e4m3', 8.25),
      ('int8', 'int8', 8.25), ('int4', 'int4', 4.25),
      ('fp4_e2m1', 'fp4_e2m2u', 4.25))
  def test_bits_per_element(self, mu, nu, bits):
    params = {'w': jnp.zeros((256, 1024)), 'u': jnp.zeros((512, 256))}
    tx = optax_q.adamw(1e-3, mu_format=mu, nu_format=nu, block_size=128)
    state = tx.init(params)
    self.assertEqual(optax_q.state_bits_per_element(state), bits)

  def test_state_nbytes_counts_real_buffers(self):
    params = {'w': jnp.zeros((256, 1024))}
    tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='int4')
    state = tx.init(params)
    real = sum(x.nbytes for x in jax.tree.leaves(state))
    self.assertEqual(optax_q.state_nbytes(state), real)
    codes = optax_q.quantized_leaves(state)['0/inner_state/mu/w'].codes
    self.assertEqual(codes.nbytes, 256 * 1024 // 2)
    self.assertEqual(optax_q.state_nbytes(jax.eval_shape(tx.init, params)),
                     real)


class BadInputTest(parameterized.TestCase):

  @parameterized.parameters(
      (dict(mu_format='fp7'), 'Unknown format'),
      (dict(nu_format='int3'), 'Unknown format'),
      (dict(mu_format='fp4_e2m2u'), 'mu_format'),
      (dict(rounding='floor'), 'rounding'),
      (dict(block_size=0), 'block_size'),
      (dict(block_size=-128), 'block_size'),
      (dict(b1=1.0), 'b1'),
      (dict(b1=-0.1), 'b1'),
      (dict(b2=1.5), 'b2'),
      (dict(learning_rate=-1e-3), 'learning_rate'),
      (dict(eps=-1e-8), 'eps'),
      (dict(weight_decay=-0.1), 'weight_decay'),
      (dict(min_size=-1), 'min_size'),
      (dict(seed='zero'), 'seed'),
      (dict(track_stalls='yes'), 'track_stalls'),
  )
  def test_adamw_value_errors(self, kwargs, msg):
    kwargs = dict(dict(learning_rate=1e-3), **kwargs)
    with self.assertRaisesRegex(ValueError, msg):
      optax_q.adamw(**kwargs)

  def test_lion_and_sgd_errors(self):
    with self.assertRaisesRegex(ValueError, 'b2'):
      optax_q.lion(1e-3, b2=1.0)
    with self.assertRaisesRegex(ValueError, 'momentum'):
      optax_q.sgd(1e-3, momentum=1.2)
    with self.assertRaisesRegex(ValueError, 'learning_rate'):
      optax_q.sgd(-1.0, momentum=0.9)

  def test_unknown_field_name(self):
    with self.assertRaisesRegex(ValueError, r"unknown state field.*'nu'"):
      optax_q.quantize_state(optax.scale_by_adam(), {'nuu': 'int8'})

  def test_unsigned_format_on_signed_field(self):
    with self.assertRaisesRegex(ValueError, 'unsigned'):
      optax_q.quantize_state(optax.scale_by_adam(), {'mu': 'fp4_e2m2u'})

  def test_bad_formats_type(self):
    with self.assertRaisesRegex(ValueError, 'formats must be'):
      optax_q.quantize_state(optax.scale_by_adam(), 8)


if __name__ == '__main__':
  absltest.main()
