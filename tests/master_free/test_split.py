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
"""Split master weights: the split's exactness, training equal to float32
master weights bit for bit, composition, meshes, checkpoints, bad input."""

import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import AxisType
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest

import optax_q
from optax_q._src.master_free import split as split_lib

import helpers

_F32_MAX = np.float32(np.finfo(np.float32).max)
_BF16_MAX = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
# The smallest magnitude bf16's nearest value overflows: bf16's largest
# finite plus half its last place (bit pattern 0x7F7F8000).
_OVERFLOW = np.uint32(0x7F7F8000).view(np.float32)


def _from_bits(bits) -> np.ndarray:
  return np.asarray(bits, np.uint32).view(np.float32)


def _round_trip(x, bits=16):
  hi, lo = jax.jit(split_lib.split, static_argnums=1)(x, bits)
  return hi, lo, np.asarray(jax.jit(split_lib.join)(hi, lo))


def _params():
  k = jax.random.key(0)
  n = lambda i, s: jax.random.normal(jax.random.fold_in(k, i), s) * 0.1
  return {
      'embed': {'embedding': n(0, (64, 16))},
      'block': {'fc': {'kernel': n(1, (16, 32)), 'bias': n(2, (32,))},
                'ln': {'scale': 1.0 + n(3, (16,))}},
      'head': {'kernel': n(4, (16, 64))},
      'temperature': jnp.float32(0.5),
  }


def _small_params():
  k = jax.random.key(0)
  return {'fc': {'kernel': jax.random.normal(k, (16, 32)) * 0.1,
                 'bias': jnp.zeros((32,))},
          'temperature': jnp.float32(0.5)}


def _grads(step, params):
  leaves, treedef = jax.tree.flatten(params)
  key = jax.random.fold_in(jax.random.key(1), step)
  return treedef.unflatten([
      jax.random.normal(jax.random.fold_in(key, i), jnp.shape(p))
      for i, p in enumerate(leaves)])


def _run_master(tx, params, steps):
  """float32 master weights: ``tx`` on ``params`` (jitted)."""
  state = jax.jit(tx.init)(params)
  step = jax.jit(helpers.step_fn(tx))
  for i in range(steps):
    params, state = step(params, state, _grads(i, params))
  return params, state


def _split_step(tx):
  def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return optax_q.apply_updates(p, updates), s
  return step


def _run_split(tx, params, steps, remainder='int16', chosen='all'):
  """``tx`` (a split_weights) from float32 ``params``: (bf16 params,
  state, masters)."""
  state = jax.jit(tx.init)(params)
  p = optax_q.split_params(params, remainder, filter=chosen)
  step = jax.jit(_split_step(tx))
  for i in range(steps):
    p, state = step(p, state, _grads(i, params))
  return p, state, optax_q.master_weights(p, state)


class SplitTest(parameterized.TestCase):
  """The split of one float32 array: exactness, edges, error bounds."""

  def test_int16_exact_on_normal_weights_across_magnitudes(self):
    k = jax.random.split(jax.random.key(0), 2)
    n = 1 << 18
    x = jax.random.normal(k[0], (n,)) * 10.0 ** jax.random.uniform(
        k[1], (n,), minval=-36.0, maxval=36.0)
    hi, lo, back = _round_trip(x)
    self.assertEqual((hi.dtype, lo.dtype), (jnp.bfloat16, jnp.int16))
    exact = np.mean(helpers.bits(back) == helpers.bits(x))
    self.assertGreaterEqual(exact, 0.999)  # FlashOptim reports 0.9992.
    self.assertEqual(exact, 1.0)  # Measured: every value.

  def test_int16_exact_on_random_bit_patterns(self):
    u = jax.random.bits(jax.random.key(2), (1 << 18,), jnp.uint32)
    x = jax.lax.bitcast_convert_type(u, jnp.float32)
    hi, _, back = _round_trip(x)
    x, u = np.asarray(x), np.asarray(u)
    nan = np.isnan(x)
    below = np.abs(x) < _OVERFLOW
    self.assertTrue(np.array_equal(helpers.bits(back)[below], u[below]))
    self.assertTrue(np.all(np.isnan(back[nan])))
    # Beyond bf16's overflow threshold hi stays finite, the master within
    # 2**-9 relative.
    big = ~below & np.isfinite(x)
    self.assertTrue(np.all(np.isfinite(np.asarray(hi, np.float32)[big])))
    np.testing.assert_array_less(
        np.abs(back[big] - x[big]), 2.0**119 * (1 + 2.0**-20))
    self.assertGreater(below.mean(), 0.99)

  def test_overflow_threshold_as_documented(self):
    # Exact below 2**128 - 2**119 (3.3961775e38), not at it; float32's
    # largest is 2**119 off, a little over 2**-9 relative.
    x = _from_bits([0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF])
    _, _, back = _round_trip(jnp.asarray(x))
    self.assertEqual(float(x[1]), 2.0**128 - 2.0**119)
    self.assertEqual(helpers.bits(back)[0], 0x7F7F7FFF)
    self.assertNotEqual(helpers.bits(back)[1], 0x7F7F8000)
    self.assertLess(float(x[1]), 3.3962e38)
    self.assertEqual(float(x[2]) - float(back[2]), 2.0**119)

  def test_edges(self):
    bits = [
        0x00000000, 0x80000000,  # +-0
        0x00000001, 0x807FFFFF, 0x00008000, 0x0000FFFF,  # subnormals
        0x00800000, 0x3F800000,  # smallest normal, 1
        0x3F808000, 0x3F818000,  # ties below an even / odd bf16 value
        0x3FFFFFFF, 0x3FFF8000, 0xBFFFFFFF,  # round up into the next binade
        0x7F7F0000, 0x7F7F7FFF,  # bf16 max, the largest exact beyond it
        0x7F800000, 0xFF800000,  # +-inf
    ]
    x = _from_bits(bits)
    hi, lo, back = _round_trip(x)
    np.testing.assert_array_equal(helpers.bits(back), np.uint32(bits))
    # hi is bf16's nearest: ties away from zero, the others as a cast.
    hi32 = np.asarray(hi, np.float32)
    cast = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    ties = np.isin(np.uint32(bits),
                   [0x00008000, 0x3F808000, 0x3F818000, 0x3FFF8000])
    np.testing.assert_array_equal(hi32[~ties], cast[~ties])
    np.testing.assert_array_equal(
        hi32[ties], _from_bits([0x00010000, 0x3F810000, 0x3F820000,
                                0x40000000]))
    self.assertEqual(int(lo[8]), -(1 << 15))  # A tie: the lowest code.
    self.assertEqual(np.signbit(np.asarray(hi, np.float32)[1]), True)

  def test_overflow_nan_and_hi_nearest(self):
    x = np.array([_OVERFLOW, -_F32_MAX, np.nan, -np.nan], np.float32)
    hi, lo, back = _round_trip(x)
    hi32 = np.asarray(hi, np.float32)
    np.testing.assert_array_equal(hi32[:2], [_BF16_MAX, -_BF16_MAX])
    np.testing.assert_array_equal(np.asarray(lo)[:2], [32767, 32767])
    np.testing.assert_array_less(np.abs(back[:2] - x[:2]) / np.abs(x[:2]),
                                 2.0**-9 * (1 + 2.0**-20))
    self.assertTrue(np.all(np.isnan(hi32[2:])) and np.all(
        np.isnan(back[2:])))
    np.testing.assert_array_equal(np.asarray(lo)[2:], [0, 0])

  def test_int8_error_bound(self):
    k = jax.random.split(jax.random.key(3), 2)
    n = 1 << 18
    x = jax.random.normal(k[0], (n,)) * 10.0 ** jax.random.uniform(
        k[1], (n,), minval=-30.0, maxval=30.0)
    hi, lo, back = _round_trip(x, 8)
    self.assertEqual(lo.dtype, jnp.int8)
    x = np.asarray(x)
    relative = np.abs(back.astype(np.float64) - x) / np.abs(x)
    self.assertLessEqual(relative.max(), 2.0**-16)
    self.assertGreater(relative.max(), 2.0**-17)  # The bound is tight.
    # The master is x rounded to 16 significant bits: an idempotent split,
    # hi its bf16 nearest value.
    _, _, again = _round_trip(back, 8)
    np.testing.assert_array_equal(helpers.bits(again), helpers.bits(back))
    self.assertLessEqual(
        np.max(np.abs(np.asarray(hi, np.float32) - back) / np.abs(back)),
        2.0**-8)
    # bf16 values and zeros stay exact; the largest magnitudes stay finite.
    y = np.array([0.0, -0.0, 1.5, -3.0, 2.0**-130, _F32_MAX], np.float32)
    hi, _, back = _round_trip(y, 8)
    np.testing.assert_array_equal(helpers.bits(back[:5]),
                                  helpers.bits(y[:5]))
    self.assertTrue(np.isfinite(np.asarray(hi, np.float32)[5]))
    self.assertLess(abs(back[5] - y[5]) / y[5], 2.0**-9 + 2.0**-16)

  @pytest.mark.slow
  def test_eager_equals_jit(self):
    x = jax.random.normal(jax.random.key(4), (8, 33)) * 1e3
    hi, lo = split_lib.split(x)
    hj, lj, back = _round_trip(x)
    helpers.assert_bits_equal((hi, lo), (hj, lj))
    np.testing.assert_array_equal(helpers.bits(split_lib.join(hi, lo)),
                                  helpers.bits(back))


class SplitWeightsTest(parameterized.TestCase):
  """Training: float32 master weights bit for bit (int16)."""

  def test_int16_is_float32_master_training(self):
    self._check_int16_is_float32_master_training(
        lambda: optax.adamw(1e-2, weight_decay=0.1), _small_params())

  @pytest.mark.slow
  def test_int16_is_float32_master_training_clipped_sgd(self):
    self._check_int16_is_float32_master_training(lambda: optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.sgd(optax.linear_schedule(0.1, 0.01, 4), momentum=0.9)),
        _params())

  def _check_int16_is_float32_master_training(self, make, params):
    want, _ = _run_master(make(), params, 4)
    p, state, masters = _run_split(optax_q.split_weights(make()), params, 4)
    helpers.assert_bits_equal(masters, want)
    # The model's weights are bf16's nearest of the masters; the scalar
    # (rank 0, not chosen by 'all') stays float32.
    self.assertEqual(p['temperature'].dtype, jnp.float32)
    hi = jax.tree.map(lambda x: split_lib.split(x)[0],
                      {k: v for k, v in want.items() if k != 'temperature'})
    helpers.assert_bits_equal(
        {k: v for k, v in p.items() if k != 'temperature'}, hi)
    remainders = jax.tree.leaves(state.remainder)
    self.assertLen(remainders, len(jax.tree.leaves(params)) - 1)
    self.assertTrue(all(r.dtype == jnp.int16 for r in remainders))

  def test_int8_rounds_each_step_to_16_bits(self):
    params = _small_params()
    tx = optax_q.split_weights(optax.adam(1e-2), 'int8')
    state = tx.init(params)
    p = optax_q.split_params(params, 'int8')
    x0 = optax_q.master_weights(p, state)
    # The masters start as the params rounded to 16 significant bits.
    np.testing.assert_array_less(
        np.abs(x0['fc']['kernel'] - params['fc']['kernel']),
        np.abs(params['fc']['kernel']) * 2.0**-16 + 1e-30)
    # One step: Adam on the masters, then the same rounding.
    ref = optax.adam(1e-2)

    @jax.jit
    def reference(x0, g):
      updates, _ = ref.update(g, ref.init(x0), x0)
      want = jax.tree.map(
          lambda x, u: split_lib.join(*split_lib.split(x + u, 8)), x0,
          updates)
      want['temperature'] = x0['temperature'] + updates['temperature']
      return want

    want = reference(x0, _grads(0, params))
    p, state = jax.jit(_split_step(tx))(p, state, _grads(0, params))
    got = optax_q.master_weights(p, state)
    # Equal, but for a sum the two programs round differently in its last
    # bit at a 16-bit tie: one 16-bit step (256 float32 last places).
    steps = np.concatenate([
        np.abs(helpers.bits(a).astype(np.int64) - helpers.bits(b)).ravel()
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want))])
    self.assertLessEqual(steps.max(), 256)
    self.assertGreater(np.mean(steps == 0), 0.99)
    self.assertEqual(optax_q.state_nbytes(state.remainder),
                     sum(x.size for x in jax.tree.leaves(params)) - 1)

  def test_low_bit_moments_inside(self):
    """8-bit moments inside (an optax_q optimizer): that optimizer on
    float32 params bit for bit."""
    params = _small_params()
    moments = dict(mu_format='int8', nu_format='int8', min_size=0,
                   block_size=16)
    inner = lambda: optax_q.adamw(1e-2, weight_decay=0.1, **moments)
    want, want_state = _run_master(inner(), params, 2)
    _, state, masters = _run_split(optax_q.split_weights(inner()),
                                   params, 2)
    helpers.assert_bits_equal(masters, want)
    helpers.assert_bits_equal(state.inner_state, want_state)

  @pytest.mark.slow
  def test_low_bit_moments_around(self):
    """quantize_state around split_weights equals quantize_state around
    optax.adamw on float32 params (nearest rounding)."""
    params = _params()
    around = lambda tx: optax_q.quantize_state(
        tx, {'mu': 'int8', 'nu': 'int8'}, min_size=0, block_size=16,
        rounding='nearest')
    want, _ = _run_master(around(optax.adamw(1e-2)), params, 3)
    _, state, masters = _run_split(
        around(optax_q.split_weights(optax.adamw(1e-2))), params, 3)
    helpers.assert_bits_equal(masters, want)
    # Bytes: the remainders (2 per split weight) beside 8-bit moments.
    n_split = sum(x.size for x in jax.tree.leaves(params)) - 1
    remainder = optax_q.state_nbytes(
        state.inner_state.remainder)
    self.assertEqual(remainder, 2 * n_split)

  @pytest.mark.slow
  def test_filters_of_quantize_params(self):
    params = _params()
    tx = optax_q.split_weights(optax.adamw(1e-2), filter='linear')
    want, _ = _run_master(optax.adamw(1e-2), params, 2)
    p, state, masters = _run_split(tx, params, 2, chosen='linear')
    dtypes = jax.tree.map(lambda x: x.dtype.name, p)
    self.assertEqual(dtypes['block']['fc']['kernel'], 'bfloat16')
    # Embeddings, the head, biases and norms stay as the user gave them,
    # with plain updates.
    for leaf in (dtypes['embed']['embedding'], dtypes['head']['kernel'],
                 dtypes['block']['fc']['bias'], dtypes['temperature']):
      self.assertEqual(leaf, 'float32')
    self.assertIsNone(state.remainder['head']['kernel'])
    helpers.assert_bits_equal(masters, want)
    chosen = lambda path, leaf: leaf.ndim == 1
    tx = optax_q.split_weights(optax.adamw(1e-2), filter=chosen)
    p, _, masters = _run_split(tx, params, 2, chosen=chosen)
    self.assertEqual(p['block']['ln']['scale'].dtype, jnp.bfloat16)
    self.assertEqual(p['head']['kernel'].dtype, jnp.float32)
    helpers.assert_bits_equal(masters, want)

  def test_gradient_accumulation_around(self):
    # optax.MultiSteps puts zeros in place of the updates between its
    # steps: they keep the weights (not zero them), as float32 masters do.
    params = {'w': _small_params()['fc']['kernel']}
    multi = lambda tx: optax.MultiSteps(tx, every_k_schedule=2)
    want, _ = _run_master(multi(optax.adam(1e-2)), params, 3)
    p, _, masters = _run_split(multi(optax_q.split_weights(
        optax.adam(1e-2))), params, 3)
    helpers.assert_bits_equal(masters, want)
    self.assertEqual(p['w'].dtype, jnp.bfloat16)

  def test_masked_and_multi_transform_around(self):
    # Leaves outside the mask hold a MaskedNode, not a remainder.
    params = {'a': jnp.full((2, 3), 1.0 + 2.0**-12), 'b': jnp.ones(3)}
    split = optax_q.split_weights(optax.sgd(2.0**-4))
    for tx in (optax.masked(split, {'a': True, 'b': False}),
               optax.multi_transform({'s': split, 'p': optax.sgd(1.0)},
                                     {'a': 's', 'b': 'p'})):
      state = tx.init(params)
      p = optax_q.split_params(params, filter=lambda path, leaf: leaf.ndim > 1)
      updates, state = tx.update(jax.tree.map(jnp.ones_like, params), state,
                                 p)
      p = optax_q.apply_updates(p, updates)
      masters = optax_q.master_weights(p, state)
      self.assertEqual(float(masters['a'][0, 0]), 1.0 + 2.0**-12 - 2.0**-4)
      self.assertIs(masters['b'], p['b'])

  def test_none_leaves_in_params(self):
    # None leaves (no parameter) sit in params and updates alike.
    params = {'n': None, 'w': jnp.array([1.0, -2.0])}
    tx = optax_q.split_weights(optax.sgd(2.0**-4))
    state = tx.init(params)
    p = optax_q.split_params(params)
    updates, state = tx.update({'n': None, 'w': jnp.ones(2)}, state, p)
    p = optax_q.apply_updates(p, updates)
    self.assertIsNone(p['n'])
    np.testing.assert_array_equal(
        np.asarray(optax_q.master_weights(p, state)['w']), [0.9375, -2.0625])

  def test_bf16_params_at_init_start_from_zero_remainder(self):
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16),
                          {'w': _small_params()['fc']['kernel']})
    tx = optax_q.split_weights(optax.sgd(1e-3))
    state = tx.init(params)
    self.assertFalse(np.any(np.asarray(state.remainder['w'])))
    helpers.assert_bits_equal(
        optax_q.master_weights(params, state)['w'],
        params['w'].astype(jnp.float32))

  def test_nan_inf_huge_and_tiny(self):
    # NaN and inf params, a NaN gradient, magnitudes near float32's and
    # bf16's largest and subnormal ones: the same as float32 masters.
    x = np.array([np.nan, np.inf, -np.inf, 3e38, -3.3e38, _BF16_MAX,
                  1e-40, -1e-44, 0.0, -0.0, 1.0, 2.0, 3.397e38], np.float32)
    params = {'w': jnp.asarray(x)}
    g = lambda i: {'w': jnp.asarray(
        [1.0, 1.0, 1.0, -1e37, -1e36, 1.0, 1e-42, 1e-45, 0.0, -0.0,
         np.nan if i == 1 else 1.0, 1.0, 0.0], jnp.float32)}
    tx_ref = optax.sgd(1.0)
    tx = optax_q.split_weights(optax.sgd(1.0))
    ref, ref_state = params, tx_ref.init(params)
    state, p = tx.init(params), optax_q.split_params(params)
    for i in range(3):
      ref, ref_state = jax.jit(helpers.step_fn(tx_ref))(ref, ref_state, g(i))
      p, state = jax.jit(_split_step(tx))(p, state, g(i))
    masters = np.asarray(optax_q.master_weights(p, state)['w'])
    np.testing.assert_array_equal(helpers.bits(masters)[1:12],
                                  helpers.bits(ref['w'])[1:12])
    self.assertTrue(np.isnan(masters[0]) and np.isnan(masters[10]))
    hi = np.asarray(p['w'], np.float32)
    self.assertTrue(np.all(np.isfinite(hi[3:10])) and np.isfinite(hi[12]))
    # Beyond bf16's overflow threshold: saturated, within 2**-9.
    self.assertLess(abs(masters[12] / x[12] - 1), 2.0**-9)

  @pytest.mark.slow
  def test_abstract_init_and_tree_map_params(self):
    params = _params()
    tx = optax_q.split_weights(optax.adamw(1e-3), 'int8', filter='matrices')
    abstract = jax.eval_shape(tx.init, params)
    helpers.assert_same_types(abstract, tx.init(params))
    self.assertEqual(abstract.remainder['head']['kernel'].dtype, jnp.int8)
    specs = optax.tree_map_params(
        tx, lambda x: P(*[None] * x.ndim), tx.init(params),
        transform_non_params=lambda x: P())
    self.assertEqual(specs.remainder['embed']['embedding'], P(None, None))
    self.assertIsNone(specs.remainder['block']['fc']['bias'])

  @pytest.mark.slow
  def test_checkpoint_round_trip_resumes_bit_exactly(self):
    params = _params()
    tx = optax_q.split_weights(optax_q.adamw(
        1e-2, mu_format='int8', nu_format='int8', min_size=0), 'int8')
    mid, mid_state, _ = _run_split(tx, params, 2, 'int8')
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'ckpt')
      helpers.save(path, {'params': mid, 'opt_state': mid_state})
      abstract = {'params': jax.eval_shape(
          lambda: optax_q.split_params(params, 'int8')),
                  'opt_state': jax.eval_shape(tx.init, params)}
      restored = helpers.restore(path, abstract)
    helpers.assert_bits_equal(restored, {'params': mid,
                                         'opt_state': mid_state})
    p, s = restored['params'], restored['opt_state']
    step = jax.jit(_split_step(tx))
    for i in range(2, 4):
      p, s = step(p, s, _grads(i, params))
    whole, whole_state, _ = _run_split(tx, params, 4, 'int8')
    helpers.assert_bits_equal((p, s), (whole, whole_state))


class SplitWeightsMeshTest(absltest.TestCase):

  def test_sharded_equals_unsharded(self):
    mesh = jax.make_mesh((4, 2), ('data', 'model'),
                         axis_types=(AxisType.Explicit,) * 2)
    params = {'fc': jax.random.normal(jax.random.key(5), (64, 32)),
              'ln': jnp.ones((32,))}
    specs = {'fc': P('data', 'model'), 'ln': P('model')}
    shard = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    tx = optax_q.split_weights(optax.adamw(1e-2), 'int8')
    step = _split_step(tx)
    p = jax.device_put(optax_q.split_params(params, 'int8'), shard)
    s_shard = optax_q.state_shardings(jax.eval_shape(tx.init, params),
                                      shard)
    s = jax.jit(tx.init, out_shardings=s_shard)(
        jax.device_put(params, shard))
    q, st = optax_q.split_params(params, 'int8'), jax.jit(tx.init)(params)
    for i in range(2):
      g = _grads(i, params)
      p, s = jax.jit(step, out_shardings=(shard, s_shard))(
          p, s, jax.device_put(g, shard))
      q, st = jax.jit(step)(q, st, g)
    helpers.assert_bits_equal((p, s), (q, st))
    self.assertEqual(s.remainder['fc'].sharding.spec, P('data', 'model'))
    self.assertEqual(p['fc'].dtype, jnp.bfloat16)


class SplitWeightsErrorsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('remainder_int32', dict(remainder='int32'), 'remainder'),
      ('remainder_dtype', dict(remainder=jnp.int16), 'remainder'),
      ('remainder_bits', dict(remainder=16), 'remainder'),
      ('filter_name', dict(filter='rows'), 'filter'),
      ('filter_number', dict(filter=3), 'filter'),
  )
  def test_bad_arguments(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      optax_q.split_weights(optax.sgd(1e-3), **kwargs)
    with self.assertRaisesRegex(ValueError, name):
      optax_q.split_params({'w': jnp.ones(3)}, **kwargs)

  def test_bad_inner_and_params(self):
    with self.assertRaisesRegex(TypeError, 'inner.*factory'):
      optax_q.split_weights(optax.adamw)
    tx = optax_q.split_weights(optax.sgd(1e-3))
    params = {'w': jnp.ones((2, 3))}
    state = tx.init(params)
    grads = {'w': jnp.ones((2, 3))}
    with self.assertRaisesRegex(ValueError, 'needs params'):
      tx.update(grads, state)
    # The float32 params where the bf16 weights belong.
    with self.assertRaisesRegex(ValueError, "'w'.*split_params"):
      tx.update(grads, state, params)
    with self.assertRaisesRegex(ValueError, 'split_params'):
      tx.update(grads, state, {'w': jnp.ones((3, 2), jnp.bfloat16)})
    with self.assertRaisesRegex(ValueError, 'another structure'):
      tx.update(grads, state, {'v': params['w'].astype(jnp.bfloat16)})
    with self.assertRaisesRegex(ValueError, 'structure of params'):
      tx.update({'w': grads['w'], 'x': 1.0}, state,
                optax_q.split_params(params))
    with self.assertRaisesRegex(ValueError, 'pytree of arrays'):
      optax_q.split_params('weights')
    with self.assertRaisesRegex(ValueError, 'not a floating-point'):
      optax_q.split_params({'n': jnp.arange(3)},
                           filter=lambda path, leaf: True)
    with self.assertRaisesRegex(ValueError, 'exactly one'):
      optax_q.master_weights(params, optax.sgd(1e-3).init(params))
    # A remainder cast to another dtype (uint16 would read -1 as 65535).
    bf16 = optax_q.split_params(params)
    for dtype in (jnp.uint16, jnp.int32, jnp.float32):
      cast = state._replace(remainder={'w': state.remainder['w'].astype(
          dtype)})
      with self.assertRaisesRegex(ValueError, "'w'.*int16 or int8"):
        tx.update(grads, cast, bf16)
      with self.assertRaisesRegex(ValueError, "'w'.*int16 or int8"):
        optax_q.master_weights(bf16, cast)

  def test_wrong_apply_fails_loudly(self):
    tx = optax_q.split_weights(optax.sgd(1e-3))
    params = {'w': jnp.ones((2, 3))}
    state = tx.init(params)
    p = optax_q.split_params(params)
    updates, _ = tx.update({'w': jnp.ones((2, 3))}, state, p)
    with self.assertRaisesRegex(TypeError, 'optax_q.apply_updates'):
      optax.apply_updates(p, updates)
    # A transform after split_weights turns the new weights into floats.
    after = optax.chain(tx, optax.scale(0.5))
    updates, _ = after.update({'w': jnp.ones((2, 3))}, after.init(params), p)
    with self.assertRaisesRegex(ValueError, 'last transform'):
      optax_q.apply_updates(p, updates)
    # The bf16 weights of a split parameter against a float32 parameter.
    with self.assertRaisesRegex(ValueError, 'shape'):
      optax_q.apply_updates(params, updates=tx.update(
          {'w': jnp.ones((2, 3))}, state, p)[0])


if __name__ == '__main__':
  absltest.main()
