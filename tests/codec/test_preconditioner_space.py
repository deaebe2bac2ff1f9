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
"""Rounding in preconditioner space (`in_preconditioner_space`).

Checked against the closed form: a value ``v`` between grid values
``g_- <= v <= g_+`` (scales included) goes up with probability
``(f(v) - f(g_-)) / (f(g_+) - f(g_-))``, ``f(x) = -1/(sqrt(x) + eps)``, so
that Adam's preconditioner of the stored value is unbiased; stochastic
rounding that is unbiased in ``v`` overestimates it (Jensen).
"""

import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q

EPS = 1e-8


def _preconditioner(v, eps=EPS):
  return 1.0 / (np.sqrt(np.asarray(v, np.float64)) + eps)


@functools.partial(jax.jit, static_argnames=('fmt', 'scale_mode'))
def _round_trip(x, fmt, scale_mode):
  return optax_q.dequantize(optax_q.quantize(
      x, fmt, rounding='stochastic', scale_mode=scale_mode))


def _draws(v, fmt, n, scale_mode='none'):
  """``n`` stochastic roundings of every element of ``v`` (float64): ``n``
  copies along a new first axis, each drawing its own bits."""
  x = jnp.broadcast_to(jnp.asarray(v, jnp.float32), (n,) + np.shape(v))
  return np.asarray(_round_trip(x, fmt, scale_mode), np.float64)


class FormatTest(parameterized.TestCase):

  def test_name_round_trips(self):
    fmt = optax_q.in_preconditioner_space('ue4m0', 1e-8)
    self.assertEqual(fmt.name, 'ue4m0@rsqrt+1e-08')
    self.assertEqual((fmt.space, fmt.space_offset), ('rsqrt', 1e-8))
    self.assertEqual(optax_q.get_format(fmt.name), fmt)
    self.assertEqual(optax_q.get_format('UE4M0@rsqrt+2.5e-7').space_offset,
                     2.5e-7)
    self.assertEqual(optax_q.unsigned_variant(fmt), fmt)
    # Second moments take the unsigned variant; with eps, a grid may hold
    # zero (which a positive value never rounds to).
    dynamic = optax_q.in_preconditioner_space('int8_dynamic', 1e-8)
    self.assertEqual(dynamic.name, 'int8_dynamic_unsigned@rsqrt+1e-08')
    self.assertTrue(dynamic.positive_floor)
    self.assertEqual(min(dynamic.table), 0.0)
    self.assertEqual(
        optax_q.in_preconditioner_space('int3_mulaw', 1e-8).name,
        'int3_mulaw_unsigned@rsqrt+1e-08')
    # Without eps: the space -1/sqrt(v) of '@rsqrt'.
    self.assertEqual(optax_q.in_preconditioner_space('ue3m0', 0.0).name,
                     'ue3m0@rsqrt')

  @parameterized.named_parameters(
      ('float_grid', 'fp8_e4m3', 1e-8, 'codebook'),
      ('int_grid', 'int8', 1e-8, 'codebook'),
      ('negative_eps', 'ue4m0', -1e-8, 'eps'),
      ('nan_eps', 'ue4m0', float('nan'), 'eps'),
      ('bool_eps', 'ue4m0', True, 'eps'),
      ('str_eps', 'ue4m0', '1e-8', 'eps'),
      ('zero_eps_zero_in_grid', 'int8_dynamic', 0.0, 'positive'),
  )
  def test_bad_arguments(self, fmt, eps, words):
    with self.assertRaisesRegex(ValueError, words):
      optax_q.in_preconditioner_space(fmt, eps)

  def test_bad_names(self):
    for name in ('ue4m0@rsqrt+x', 'ue4m0@log+1e-8', 'fp8_e4m3@rsqrt+1e-8'):
      with self.assertRaises(ValueError):
        optax_q.get_format(name)


class RoundingTest(parameterized.TestCase):

  def test_probability_is_the_closed_form(self):
    # Values between ue4m0's 1/16 and 1/8 (a tensor scale of one: the
    # largest value is 1); 2**16 draws each.
    fmt = optax_q.in_preconditioner_space('ue4m0', 1e-3)
    lo, hi = 1 / 16, 1 / 8
    v = np.array([0.07, 0.09, 0.11], np.float32)
    d = _draws(np.append(v, np.float32(1)), fmt, 1 << 16, 'tensor')
    got = np.mean(d[:, :3] == hi, axis=0)
    f = lambda x: -1.0 / (np.sqrt(np.float64(x)) + 1e-3)
    want = (f(v) - f(lo)) / (f(hi) - f(lo))
    sigma = np.sqrt(want * (1 - want) / (1 << 16))
    np.testing.assert_array_less(np.abs(got - want), 5 * sigma)
    # Above the linear fraction (v - lo) / (hi - lo), which overestimates
    # the convex 1/sqrt on average: rounding up more often keeps it
    # unbiased.
    np.testing.assert_array_less((v - lo) / (hi - lo), want)

  def test_eps_is_taken_in_the_values_units(self):
    # eps is in the units of the stored values, whatever their block scale
    # (it acts on the scaled values as eps / sqrt(scale)): near
    # sqrt(v) ~ eps the probabilities move away from those of eps = 0.
    fmt = optax_q.in_preconditioner_space('ue4m0', 3e-4)
    v = np.array([0.07, 0.09, 0.11, 1.0], np.float32)  # block maximum 1
    n = 1 << 15
    for factor in (2.0**-20, 3e-7, 5e4):
      scaled = _draws(v * np.float32(factor), fmt, n, scale_mode='block')
      f = lambda x: -1 / (np.sqrt(x) + 3e-4)
      lo, hi = factor / 16, factor / 8
      want = (f(v[:3] * factor) - f(lo)) / (f(hi) - f(lo))
      got = np.mean(scaled[:, :3] > v[:3] * factor * (1 + 1e-6), axis=0)
      sigma = np.sqrt(want * (1 - want) / n)
      np.testing.assert_array_less(np.abs(got - want), 5 * sigma + 1e-3)

  @parameterized.parameters('block', 'block_pow2', 'rank1', 'tensor')
  def test_preconditioner_unbiased_where_linear_is_not(self, scale_mode):
    rng = np.random.default_rng(0)
    v = np.exp(rng.normal(-12.0, 1.0, (4, 128))).astype(np.float32)
    n = 512
    exact = _preconditioner(v)
    pre = optax_q.in_preconditioner_space('ue4m0', EPS)
    # Elements inside the grid's range in every layout (the smallest
    # values of a block clip at its smallest positive entry).
    inside = v > 2**-12 * v.max()
    biases = {}
    for fmt in ('ue4m0', pre):
      # n copies stacked along the first axis: the same block, row, column
      # and tensor maxima, so the same scales, and n independent draws.
      d = np.asarray(_round_trip(jnp.asarray(np.tile(v, (n, 1))), fmt,
                                 scale_mode), np.float64)
      d = d.reshape((n,) + v.shape)
      biases[fmt if isinstance(fmt, str) else 'pre'] = (
          np.mean(_preconditioner(d), axis=0) / exact - 1)[inside]
    # Linear: the mean preconditioner too large by a few percent; in
    # preconditioner space unbiased to the sampling error.
    self.assertGreater(np.mean(biases['ue4m0']), 0.01)
    self.assertLess(abs(np.mean(biases['pre'])), 0.004)

  def test_on_grid_values_stay_and_extremes_are_finite(self):
    fmt = optax_q.in_preconditioner_space('int4_mulaw', EPS)
    scale = 1e-6
    grid = np.asarray(optax_q.unsigned_variant('int4_mulaw').table)
    v = (grid * scale).astype(np.float32)[None]
    v[0, -1] = scale  # The block's maximum: the grid's end.
    d = _draws(v, fmt, 64, scale_mode='block')
    np.testing.assert_allclose(d, np.broadcast_to(v, d.shape), rtol=1e-6)
    # Huge, tiny, subnormal and zero blocks, one per row.
    x = np.array([3e38, 1e-38, 1e-45, 0.0], np.float32)[:, None]
    blocks = np.repeat(x, 128, axis=1)
    blocks[:, 0] *= np.float32(0.3)
    d = _draws(blocks, fmt, 4, scale_mode='block')
    self.assertTrue(np.all(np.isfinite(d)))
    self.assertTrue(np.all(d >= 0))
    # NaN and infinities decode as with linear rounding.
    for bad in ([[np.nan, 1.0]], [[np.inf, 1.0]]):
      bad = np.array(bad, np.float32)
      np.testing.assert_array_equal(
          _draws(bad, fmt, 2, scale_mode='block'),
          _draws(bad, 'int4_mulaw_unsigned', 2, scale_mode='block'))


class DropInTest(parameterized.TestCase):

  def test_adamw_declares_its_eps(self):
    tx = optax_q.adamw(1e-3, eps=1e-6, mu_format='nf4', nu_format='ue4m0',
                       rounding='preconditioner', min_size=0)
    state = tx.init({'w': jnp.zeros((4, 256))})
    names = [q.fmt.name for q in optax_q.quantized_leaves(state).values()]
    self.assertCountEqual(names, ['nf4', 'ue4m0@rsqrt+1e-06'])

  def test_float32_second_moment_has_nothing_to_round(self):
    # Accepted at construction and at init alike: fp32 stays an array.
    tx = optax_q.adamw(1e-3, mu_format='nf4', nu_format='fp32',
                       rounding='preconditioner', min_size=0)
    state = tx.init({'w': jnp.zeros((4, 256))})
    names = [q.fmt.name for q in optax_q.quantized_leaves(state).values()]
    self.assertEqual(names, ['nf4'])

  @parameterized.parameters('shampoo', 'soap')
  def test_second_order_declare_their_grafting_eps(self, name):
    tx = getattr(optax_q, name)(1e-3, eps=1e-7, mu_format='nf4',
                                nu_format='ue4m0', rounding='preconditioner',
                                min_size=0)
    state = tx.init({'w': jnp.zeros((64, 128))})
    names = {q.fmt.name for q in optax_q.quantized_leaves(state).values()}
    self.assertIn('ue4m0@rsqrt+1e-07', names)
    self.assertIn('nf4', names)  # The first moment: plain stochastic.

  def test_quantize_state_needs_the_map(self):
    with self.assertRaisesRegex(ValueError, 'preconditioner='):
      optax_q.quantize_state(optax.scale_by_adam(), 'ue4m0',
                             rounding='preconditioner')
    with self.assertRaisesRegex(ValueError, "'mu'"):
      optax_q.quantize_state(optax.scale_by_adam(), 'nf4',
                             rounding={'mu': 'preconditioner'},
                             preconditioner={'nu': 1e-8})
    with self.assertRaisesRegex(ValueError, 'preconditioner'):
      optax_q.quantize_state(optax.scale_by_adam(), 'nf4',
                             preconditioner={'nu': -1.0})
    with self.assertRaisesRegex(ValueError, 'preconditioner'):
      optax_q.quantize_state(optax.scale_by_adam(), 'nf4',
                             preconditioner={'sum_of_squares': 1e-8})
    with self.assertRaisesRegex(ValueError, 'codebook'):
      optax_q.adamw(1e-3, nu_format='fp8_e4m3', rounding='preconditioner')
    with self.assertRaisesRegex(ValueError, 'lion'):
      optax_q.lion(1e-3, rounding='preconditioner')
    # Gradients, weights and plain arrays have no preconditioner.
    with self.assertRaisesRegex(ValueError, 'rounding'):
      optax_q.quantize_gradients('int8', rounding='preconditioner')
    with self.assertRaisesRegex(ValueError, 'rounding'):
      optax_q.quantize(jnp.ones(4), 'int8', rounding='preconditioner')

  def test_first_moment_rounds_as_stochastic(self):
    # 'preconditioner' leaves the linear first moment to plain stochastic
    # rounding: its codes are those of rounding='stochastic'.
    params = {'w': jax.random.normal(jax.random.key(0), (8, 256))}
    grads = jax.tree.map(lambda x: jnp.sin(3 * x) * 1e-2, params)
    states = []
    for rounding in ('stochastic', 'preconditioner'):
      tx = optax_q.adamw(1e-3, mu_format='nf4', nu_format='ue4m0',
                         rounding=rounding, min_size=0)
      _, state = tx.update(grads, tx.init(params), params)
      states.append(list(optax_q.quantized_leaves(state).values()))
    mu = [[q for q in s if q.fmt.name == 'nf4'][0] for s in states]
    np.testing.assert_array_equal(mu[0].codes, mu[1].codes)


if __name__ == '__main__':
  absltest.main()
