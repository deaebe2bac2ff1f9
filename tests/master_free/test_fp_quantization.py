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
"""Floating-point quantization of gradients, weights and moments; Muon.

References are ml_dtypes' casts (which we did not write), Optax at float32
and ``optax.contrib.muon``.
"""

import functools
import tempfile

import helpers

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax

import optax_q
from optax_q._src.codec import formats as formats_lib

# The grids of e4m3fn and e5m2_ieee simulated in a bf16 container (the
# names themselves mean the native one-byte formats).
SIM_E4M3FN = formats_lib._simulated(4, 3, 'fn')  # pylint: disable=protected-access
SIM_E5M2 = formats_lib._simulated(5, 2, '_ieee')  # pylint: disable=protected-access

# (our format, the ml_dtypes dtype with the same grid).
SAME_GRID = (
    ('e4m3', ml_dtypes.float8_e4m3fn),
    (SIM_E4M3FN, ml_dtypes.float8_e4m3fn),
    ('e5m2', ml_dtypes.float8_e5m2),
    (SIM_E5M2, ml_dtypes.float8_e5m2),
    ('e4m3_ieee', ml_dtypes.float8_e4m3),
    ('e3m4_ieee', ml_dtypes.float8_e3m4),
    ('e2m3', ml_dtypes.float6_e2m3fn),
    ('e3m2', ml_dtypes.float6_e3m2fn),
    ('e8m7', ml_dtypes.bfloat16),
    ('bf16', ml_dtypes.bfloat16),
    ('e5m10_ieee', np.float16),
)


def _samples(dtype, n=20000, seed=0):
  """Magnitudes spread log-uniformly from below the smallest subnormal to
  twice the largest value (saturation), both signs, plus the edges."""
  fi = ml_dtypes.finfo(dtype)
  top = min(float(fi.max) * 2, 3e38)
  tiny = float(fi.smallest_subnormal)
  rng = np.random.default_rng(seed)
  mags = np.exp(rng.uniform(np.log(tiny / 4), np.log(top), n))
  x = (mags * rng.choice([-1.0, 1.0], n)).astype(np.float32)
  grid = np.arange(256, dtype=np.uint8)
  if np.dtype(dtype).itemsize == 1:  # Every code, and the midpoints.
    values = grid.view(dtype).astype(np.float32)
    values = np.sort(values[np.isfinite(values)])
    x = np.concatenate([x, values, (values[1:] + values[:-1]) / 2])
  edges = [0.0, -0.0, fi.max, -fi.max, tiny, tiny / 2, 1.5 * tiny,
           2.5 * tiny]
  return np.concatenate([x, np.array(edges, np.float32)]).astype(np.float32)


def _cast(x, dtype):
  """ml_dtypes' rounding (half to even), saturated at the largest value."""
  top = float(ml_dtypes.finfo(dtype).max)
  return np.clip(x, -top, top).astype(dtype).astype(np.float32)


def _nearest(fmt):
  tx = optax_q.quantize_gradients(fmt, rounding='nearest', scale_mode='none')
  return jax.jit(lambda g: tx.update(g, tx.init(g))[0])


class FormatTest(parameterized.TestCase):

  @parameterized.parameters(*SAME_GRID)
  def test_largest_value_is_the_reference(self, name, dtype):
    self.assertEqual(optax_q.get_format(name).max_value,
                     float(ml_dtypes.finfo(dtype).max))

  def test_e4m3_saturates_at_448(self):
    for fmt in ('e4m3', SIM_E4M3FN):
      self.assertEqual(optax_q.get_format(fmt).max_value, 448.0)
      got = _nearest(fmt)(jnp.array([460.0, 1e6, -500.0]))
      np.testing.assert_array_equal(got, [448.0, 448.0, -448.0])

  def test_native_spellings(self):
    self.assertEqual(optax_q.get_format('e4m3fn').name, 'fp8_e4m3')
    self.assertEqual(optax_q.get_format('e5m2_ieee').name, 'fp8_e5m2')
    self.assertEqual(SIM_E4M3FN.storage_dtype, 'bfloat16')

  @parameterized.parameters('e9m2', 'e0m3', 'e4m24', 'e1m2_ieee', 'e8m3fn',
                            'e1m0fn', 'e4m3x', 'm3e4', 'e04m3', 'e4m03', 3,
                            None, True, 4.0)
  def test_bad_names(self, name):
    with self.assertRaisesRegex(ValueError, 'fmt'):
      optax_q.quantize_gradients(name)

  def test_out_of_range_names_say_the_range(self):
    for name, message in (('e9m2', 'E=9 exponent bits: allowed 1 <= E <= 8'),
                          ('e4m24', 'M=24 mantissa bits'),
                          ('e1m2_ieee', '_ieee needs E >= 2, got E=1'),
                          ('e8m3fn', 'fn .* needs 2 <= E <= 7, got E=8')):
      with self.assertRaisesRegex(ValueError, message):
        optax_q.get_format(name)

  def test_float32_grids_are_identities(self):
    for name in ('fp32', 'e8m23', 'e8m23_ieee'):
      self.assertTrue(optax_q.get_format(name).is_identity, name)
    self.assertFalse(optax_q.get_format('e8m22').is_identity)


class NearestTest(parameterized.TestCase):

  @parameterized.parameters(*SAME_GRID)
  def test_equals_ml_dtypes_cast(self, name, dtype):
    x = _samples(dtype)
    got = np.asarray(_nearest(name)(jnp.asarray(x)))
    np.testing.assert_array_equal(got, _cast(x, dtype))

  def test_e2m1_equals_ml_dtypes_cast(self):
    # fp4 e2m1 is a table (packed codes) that takes scales: a tensor whose
    # largest magnitude is the grid's (6) has a scale of exactly one.
    x = np.clip(_samples(ml_dtypes.float4_e2m1fn, seed=4), -6.0, 6.0)
    x = np.concatenate([x, np.arange(-6.0, 6.25, 0.25, np.float32)])
    tx = optax_q.quantize_gradients('e2m1', rounding='nearest',
                                    scale_mode='tensor')
    got = jax.jit(tx.update)(jnp.asarray(x), tx.init(x))[0]
    np.testing.assert_array_equal(got, _cast(x, ml_dtypes.float4_e2m1fn))

  @parameterized.parameters(('e4m3', ml_dtypes.float8_e4m3fn),
                            ('e5m2', ml_dtypes.float8_e5m2),
                            ('e8m7', ml_dtypes.bfloat16))
  def test_forward_weights_equal_ml_dtypes_cast(self, name, dtype):
    x = _samples(dtype, n=4000, seed=1)
    got = optax_q.fake_quantize_params({'w': jnp.asarray(x)}, name,
                                       scale_mode='none', filter='all')
    np.testing.assert_array_equal(got['w'], _cast(x, dtype))

  def test_rounding_survives_compilation(self):
    # An f32 -> bf16 -> f32 round trip may be dropped under jit as excess
    # precision; the codec's rounding must not be. Compile, check the HLO
    # rounds explicitly, and check the values.
    x = jnp.asarray(np.random.default_rng(2).uniform(-100, 100, 4000),
                    jnp.float32)

    def f(v):
      return optax_q.dequantize(optax_q.quantize(v + 0.1, 'e8m7')) * 2.0

    compiled = jax.jit(f).lower(x).compile()
    text = compiled.as_text()
    self.assertTrue('reduce-precision' in text or 'and(' in text
                    or 'and.' in text, text[:2000])
    want = _cast(np.asarray(x) + np.float32(0.1), ml_dtypes.bfloat16)
    got = np.asarray(compiled(x))
    np.testing.assert_array_equal(got, want * np.float32(2.0))
    self.assertGreater(np.mean(got != np.asarray(x)), 0.9)

  def test_stochastic_e8m23_changes_nothing(self):
    x = jnp.asarray(_samples(np.float32, n=5000))
    tx = optax_q.quantize_gradients('e8m23', scale_mode='none')
    got = jax.jit(tx.update)(x, tx.init(x))[0]
    np.testing.assert_array_equal(got, x)


class StochasticTest(parameterized.TestCase):

  @parameterized.parameters(
      ('e4m3', 0.3), ('e4m3', -1e-3),   # normal and subnormal
      ('e5m2', 3.3), ('e2m2', 0.7), ('e3m2', -0.1), ('e8m3', 1.0e-3),
      ('e8m0', 0.3), ('e1m2', 0.8), ('e6m10', -7.77), ('e8m7', 1e-39))
  def test_unbiased(self, name, value):
    n = 200000
    x = jnp.full((n,), value, jnp.float32)
    tx = optax_q.quantize_gradients(name, scale_mode='none', seed=3)
    got = np.asarray(jax.jit(tx.update)(x, tx.init(x))[0], np.float64)
    # Two neighbours on the grid, each chosen with its probability.
    low, high = got.min(), got.max()
    self.assertLessEqual(len(np.unique(got)), 2)
    self.assertLessEqual(low, value)
    self.assertGreaterEqual(high, value)
    std = (high - low) / 2 / np.sqrt(n)
    self.assertLess(abs(got.mean() - value), 5 * std + 1e-12 * abs(value))

  def test_draws_change_with_the_step_and_repeat_with_the_seed(self):
    x = {'w': jnp.full((4096,), 0.3)}
    tx = optax_q.quantize_gradients(SIM_E4M3FN, scale_mode='none', seed=5)
    step = jax.jit(tx.update)
    a, s = step(x, tx.init(x))
    b, _ = step(x, s)
    a2, _ = step(x, tx.init(x))
    self.assertFalse(np.array_equal(a['w'], b['w']))
    np.testing.assert_array_equal(a['w'], a2['w'])


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {'w': jax.random.normal(k1, (64, 128)) * 0.1,
          'b': jax.random.normal(k2, (4096,)) * 0.1,
          'n': jnp.arange(3)}


def _unchanged(p, i):
  del i
  return p


@functools.cache
def _train_step(tx, forward):
  """One compiled step per (transform, forward weights), however many runs
  it makes."""

  def loss(p, i):
    p = forward(p, i)
    return sum(jnp.sum(jnp.sin(v * (1.0 + i)) ** 2)
               for v in jax.tree.leaves(p) if v.dtype == jnp.float32)

  @jax.jit
  def step(p, s, i):
    floats = {k: v for k, v in p.items() if v.dtype == jnp.float32}
    g = jax.grad(lambda f, i: loss({**p, **f}, i))(floats, i)
    g = {**g, 'n': p['n']}
    u, s = tx.update(g, s, p)
    u = {**u, 'n': jnp.zeros_like(p['n'])}
    return optax.apply_updates(p, u), s

  return step


def _train(tx, params, forward=_unchanged, steps=5, start=0, state=None):
  state = tx.init(params) if state is None else state
  step = _train_step(tx, forward)
  for i in range(start, start + steps):
    params, state = step(params, state, i)
  return params, state


class QuantizedTrainingTest(parameterized.TestCase):

  @parameterized.parameters(
      ('adam', lambda: optax.adam(1e-2), True),
      ('adamw', lambda: optax.adamw(1e-2, weight_decay=0.1), True),
      ('sgd', lambda: optax.sgd(1e-2, momentum=0.9), True),
      ('muon', lambda: optax.contrib.muon(1e-2), False))
  def test_float32_formats_equal_optax(self, name, make, elementwise):
    # At M = 23 with 8 exponent bits every component is float32 exactly.
    del name
    want, _ = _train(make(), _params())  # One reference for both roundings.
    for rounding in ('stochastic', 'nearest'):
      q = optax_q.quantized_training('e8m23', rounding=rounding)
      got, _ = _train(q.optimizer(make(), elementwise=elementwise),
                      _params(), q.weights)
      helpers.assert_bits_equal(got, want)

  def test_components_reach_their_leaves(self):
    q = optax_q.quantized_training({'g': 'e5m2', 'm': 'e4m3', 'v': 'e3m4'})
    _, state = _train(q.optimizer(optax.adam(1e-2)), _params())
    leaves = optax_q.quantized_leaves(state)
    self.assertEqual(
        {k: v.fmt.name for k, v in leaves.items()},
        {'1/inner_state/0/mu/w': 'fp8_e4m3', '1/inner_state/0/mu/b':
         'fp8_e4m3', '1/inner_state/0/nu/w': 'e3m4',
         '1/inner_state/0/nu/b': 'e3m4'})
    self.assertEqual(int(state[0].count), 5)

  def test_each_component_changes_the_run(self):
    want, _ = _train(optax.adam(1e-2), _params())
    for component in optax_q.quantized_training({}).formats:
      q = optax_q.quantized_training({component: 'e3m2'})
      got, _ = _train(q.optimizer(optax.adam(1e-2)), _params(), q.weights)
      self.assertFalse(np.array_equal(got['w'], want['w']), component)
      np.testing.assert_allclose(got['w'], want['w'], atol=0.05)

  def test_weights_pass_the_gradient_straight_through(self):
    q = optax_q.quantized_training({'w': 'e2m1'}, rounding='nearest')
    w = {'w': jnp.array([0.3, -0.7, 1.0])}
    g = jax.grad(lambda p: jnp.sum(q.weights(p)['w'] ** 2))(w)
    np.testing.assert_allclose(g['w'], 2 * q.weights(w)['w'])

  @parameterized.parameters(
      ({'x': 'e4m3'}, 'unknown components'),
      ({'gradients': 'e4m3'}, 'unknown components'),
      ({'g': 'e4m24'}, r"formats\['g'\]"),
      ({'g': 'fp4_e2m2u'}, 'unsigned'),
      ({'m': 'ue4m0'}, 'unsigned'),
      (17, 'format'))
  def test_bad_formats(self, formats, message):
    with self.assertRaisesRegex(ValueError, message):
      optax_q.quantized_training(formats)

  def test_bad_arguments(self):
    for kwargs, message in (
        (dict(rounding='up'), 'rounding'), (dict(seed=-1), 'seed'),
        (dict(block_size=3), 'block_size'), (dict(min_size=-1), 'min_size'),
        (dict(scale_mode={'g': 'rank1'}), r"scale_mode\['g'\]='rank1'"),
        (dict(scale_mode={'w': 'row'}), "formats has no 'w'"),
        (dict(scale_mode={'q': 'row'}), 'unknown components'),
        (dict(scale_mode='rows'), 'scale_mode')):
      with self.assertRaisesRegex(ValueError, message):
        optax_q.quantized_training({'g': 'e4m3', 'v': 'e4m3'}, **kwargs)

  def test_missing_moment_is_an_error(self):
    q = optax_q.quantized_training({'v': 'e4m3'})
    with self.assertRaisesRegex(ValueError, r"formats\['v'\].*no field nu"):
      q.optimizer(optax.sgd(1e-2, momentum=0.9))
    # A partition the probe cannot initialise: checked at init.
    params = {'kernel': jnp.ones((8, 8)), 'bias': jnp.ones(8)}
    tx = optax.partition({'a': optax.sgd(0.1), 'f': optax.set_to_zero()},
                         {'kernel': 'a', 'bias': 'f'})
    q = optax_q.quantized_training({'m': 'e4m3'})
    with self.assertRaisesRegex(ValueError, r"formats\['m'\].*no field mu"):
      q.optimizer(tx).init(params)

  def test_one_format_applies_to_the_moments_there_are(self):
    params = {'w': jnp.ones((8, 8))}
    for tx, fields in ((optax.sgd(0.1, momentum=0.9), {'trace'}),
                       (optax.lion(1e-3), {'mu'}),
                       (optax.amsgrad(1e-3), {'mu', 'nu', 'nu_max'})):
      state = optax_q.quantized_training('e4m3').optimizer(tx).init(params)
      got = {k.split('/')[-2] for k in optax_q.quantized_leaves(state)}
      self.assertEqual(got, fields)

  def test_stochastic_weights_need_the_step(self):
    q = optax_q.quantized_training({'w': 'e4m3'})
    with self.assertRaisesRegex(ValueError, 'needs the step'):
      q.weights({'k': jnp.ones(4)})
    w = {'k': jnp.linspace(0.1, 1.0, 64)}
    a = q.weights(w, 1)['k']
    b = q.weights(w, 2)['k']
    self.assertFalse(np.array_equal(a, b))

  def test_checked_when_made_directly(self):
    with self.assertRaisesRegex(ValueError, r"formats\['g'\]"):
      optax_q.QuantizedTraining(formats={'g': 'e44m3'})
    q = optax_q.QuantizedTraining(formats={'g': 'e4m3'})
    self.assertIsNone(q.formats['m'])
    with self.assertRaises(TypeError):
      q.formats['g'] = 'int8'  # Read-only.

  def test_non_float_leaves_and_none_pass(self):
    tx = optax_q.quantize_gradients('e4m3')
    g = {'n': jnp.arange(3), 'none': None, 'w': jnp.ones((3,)) * 0.3}
    out, _ = tx.update(g, tx.init(g))
    np.testing.assert_array_equal(out['n'], g['n'])
    self.assertIsNone(out['none'])

  def test_finite_inputs_stay_finite(self):
    big = float(np.finfo(np.float32).max)
    x = jnp.array([big, -big, 3.4e38, 3e38, 1e-45, 0.0, 1.0, 448.0 * 1.1])
    for fmt in ('e4m3', 'e5m2', 'e2m2', 'e8m7', 'bf16', 'e8m3', 'e8m0',
                'e5m10', 'e3m2_ieee'):
      for mode in ('none', 'block'):
        for rounding in ('nearest', 'stochastic'):
          tx = optax_q.quantize_gradients(fmt, scale_mode=mode,
                                          rounding=rounding)
          out = jax.jit(tx.update)(x, tx.init(x))[0]
          self.assertTrue(np.all(np.isfinite(out)),
                          (fmt, mode, rounding, out))

  def test_narrow_leaves_saturate_at_their_dtype(self):
    h = jnp.array([65504.0, 65400.0, -65504.0, 1.0], jnp.float16)
    tx = optax_q.quantize_gradients('bf16', rounding='nearest')
    out = tx.update(h, tx.init(h))[0]
    self.assertEqual(out.dtype, jnp.float16)
    np.testing.assert_array_equal(out, [65504.0, 65504.0, -65504.0, 1.0])
    w = optax_q.quantized_training({'w': 'e8m3'}, rounding='nearest')
    self.assertTrue(np.all(np.isfinite(w.weights({'k': h})['k'])))


class CheckpointTest(parameterized.TestCase):
  """Orbax round trips of the new states: into the same configuration the
  resumed run is bit-identical; into another one restoring fails."""

  def _parts(self, name):
    if name == 'muon8':
      return optax_q.muon(1e-2, min_size=0, block_size=64), None
    q = optax_q.quantized_training(
        {'g': 'e4m3', 'w': 'e5m2', 'm': 'e8m3', 'v': 'e3m4_ieee'})
    return q.optimizer(optax.adam(1e-2), elementwise=True), q.weights

  @parameterized.parameters('components', 'muon8')
  def test_resume_is_bit_identical(self, name):
    tx, forward = self._parts(name)
    fwd = forward or _unchanged  # The same step for all three runs.
    params = _params()
    p2, s2 = _train(tx, params, fwd, steps=2)
    with tempfile.TemporaryDirectory() as tmp:
      helpers.save(f'{tmp}/ckpt', {'params': p2, 'state': s2})
      restored = helpers.restore(f'{tmp}/ckpt', {
          'params': p2, 'state': jax.eval_shape(tx.init, params)})
      other = optax_q.muon(1e-2, mu_format='int4', min_size=0,
                           block_size=64) if name == 'muon8' else (
                               optax_q.quantized_training(
                                   {'m': 'int4'}).optimizer(optax.adam(1e-2)))
      with self.assertRaises(Exception):  # Another layout: shapes differ.
        helpers.restore(f'{tmp}/ckpt', {
            'params': p2, 'state': jax.eval_shape(other.init, params)})
    resumed, _ = _train(tx, restored['params'], fwd, steps=2, start=2,
                        state=restored['state'])
    straight, _ = _train(tx, params, fwd, steps=4)
    helpers.assert_bits_equal(resumed, straight)


class MuonTest(parameterized.TestCase):

  def _params(self):
    keys = jax.random.split(jax.random.key(1), 3)
    return {'w': jax.random.normal(keys[0], (64, 128)),
            'v': jax.random.normal(keys[1], (96, 48)),
            'b': jax.random.normal(keys[2], (4096,))}

  def _run(self, tx, steps=5):
    params = self._params()
    state = tx.init(params)
    step = jax.jit(helpers.step_fn(tx))
    for s in range(steps):
      params, state = step(params, state, helpers.grads_cycled(s, params))
    return params, state

  def test_float32_formats_equal_optax_muon(self):
    got, _ = self._run(optax_q.muon(
        1e-2, mu_format='fp32', adam_mu_format='fp32',
        adam_nu_format='fp32', weight_decay=0.01, min_size=0))
    want, _ = self._run(optax.contrib.muon(1e-2, weight_decay=0.01))
    helpers.assert_bits_equal(got, want)

  def test_eight_bit_muon(self):
    got, state = self._run(optax_q.muon(1e-2, min_size=0))
    want, _ = self._run(optax.contrib.muon(1e-2))
    formats = {k: (v.fmt.name, v.block_size) for k, v in
               optax_q.quantized_leaves(state).items()}
    self.assertEqual(formats, {
        'inner_state/inner_states/muon/inner_state/0/mu/w': ('int8', 2048),
        'inner_state/inner_states/muon/inner_state/0/mu/v': ('int8', 2048),
        'inner_state/inner_states/adam/inner_state/0/mu/b': ('int8_dynamic', 2048),
        'inner_state/inner_states/adam/inner_state/0/nu/b': (
            'int8_dynamic_unsigned', 2048)})
    self.assertAlmostEqual(optax_q.state_bits_per_element(state), 8.0,
                           delta=0.3)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(a, b, atol=2e-3)

  def test_dimension_numbers_and_masks_of_the_callers_tree(self):
    params = self._params()
    dims = {'w': optax.contrib.MuonDimensionNumbers(0, 1), 'v': None,
            'b': None}
    mask = {'w': True, 'v': False, 'b': False}
    kwargs = dict(muon_weight_dimension_numbers=dims, weight_decay=0.1,
                  weight_decay_mask=mask)
    got, state = self._run(optax_q.muon(
        1e-2, mu_format='fp32', adam_mu_format='fp32', adam_nu_format='fp32',
        **kwargs))
    want, _ = self._run(optax.contrib.muon(1e-2, **kwargs))
    helpers.assert_bits_equal(got, want)
    _, state = self._run(optax_q.muon(1e-2, min_size=0, **kwargs))
    self.assertIn('inner_state/inner_states/adam/inner_state/0/mu/v',
                  optax_q.quantized_leaves(state))

  def test_four_bit_momentum(self):
    _, state = self._run(optax_q.muon(1e-2, mu_format='int4', block_size=128,
                                      min_size=0))
    leaf = optax_q.quantized_leaves(state)[
        'inner_state/inner_states/muon/inner_state/0/mu/w']
    self.assertEqual(leaf.codes.dtype, jnp.uint8)
    self.assertEqual(leaf.codes.shape, (64, 64))  # Two codes per byte.

  def test_bad_arguments(self):
    for kwargs, message in (
        (dict(beta=1.0), 'beta'), (dict(mu_format='ue4m0'), 'unsigned'),
        (dict(adam_mu_format='fp4_e2m2u'), 'adam_mu_format'),
        (dict(adam_nu_format='e9m9'), 'adam_nu_format'),
        (dict(block_size=7), 'block_size'), (dict(ns_steps=-1), 'ns_steps'),
        (dict(scale_mode='rowz'), 'scale_mode'),
        (dict(learning_rate=-1.0), 'learning_rate')):
      kwargs = {'learning_rate': 1e-2, **kwargs}
      with self.assertRaisesRegex(ValueError, message):
        optax_q.muon(**kwargs)


if __name__ == '__main__':
  absltest.main()
