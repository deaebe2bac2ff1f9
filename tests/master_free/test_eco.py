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
"""Quantized parameters and ECO: the paper's oracles, traps, bad input."""

import functools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax

import optax_q
from optax_q._src.codec import qarray as qarray_lib

import helpers


def _inject(opt, *args, **kwargs):
  return optax.inject_hyperparams(opt)(*args, **kwargs)


def _sgd(lr=0.05, momentum=0.9):
  return _inject(optax.sgd, lr, momentum=momentum)


def _problem(seed=0, shape=(64, 32)):
  """A least-squares problem: gradient function and initial weights."""
  k = jax.random.split(jax.random.key(seed), 3)
  a = jax.random.normal(k[0], (64, shape[0])) / 8
  target = jax.random.normal(k[1], (64, shape[1]))
  w0 = jax.random.normal(k[2], shape) * 0.5
  grad = lambda w: a.T @ (a @ w - target)
  loss = lambda w: 0.5 * jnp.sum((a @ w - target) ** 2)
  return grad, loss, w0


def _gpt_like():
  k = jax.random.key(0)
  n = lambda i, s: jax.random.normal(jax.random.fold_in(k, i), s) * 0.02
  return {
      'embed': {'embedding': n(0, (256, 64))},
      'pos_embed': n(1, (16, 64)),
      'block_0': {
          'attn': {'query': {'kernel': n(2, (64, 4, 16)),
                             'bias': jnp.zeros((4, 16))}},
          'mlp': {'fc_in': {'kernel': n(3, (64, 256)),
                            'bias': jnp.zeros(256)}},
          'ln_mlp': {'scale': jnp.ones(64)},
      },
      'head': {'kernel': n(4, (64, 256))},
  }


def _train(tx, qparams, grad, steps, *, jit=True):
  state = tx.init(qparams)

  def step(qp, st):
    g = {'kernel': grad(optax_q.dequantize_params(qp)['kernel'])}
    up, st = tx.update(g, st, qp)
    return optax_q.apply_updates(qp, up), st

  step = jax.jit(step) if jit else step
  for _ in range(steps):
    qparams, state = step(qparams, state)
  return qparams, state


class QuantizeParamsTest(parameterized.TestCase):

  def test_default_filter_takes_block_kernels_only(self):
    q = optax_q.quantize_params(_gpt_like())
    self.assertEqual(sorted(optax_q.quantized_leaves(q)), [
        'block_0/attn/query/kernel', 'block_0/mlp/fc_in/kernel'])
    for name in ('matrices', 'all'):
      got = optax_q.quantized_leaves(jax.jit(functools.partial(
          optax_q.quantize_params, filter=name))(_gpt_like()))
      self.assertIn('embed/embedding', got)
      self.assertIn('head/kernel', got)
      self.assertEqual('block_0/ln_mlp/scale' in got, name == 'all')

  def test_stochastic_rounding_is_unbiased_over_seeds(self):
    # Its first draws take a step of 2**32 - 1, which failed to convert.
    x = jnp.linspace(-1.0, 1.0, 8 * 64).reshape(8, 64)
    def decoded(seed, rounding='stochastic'):
      return optax_q.dequantize_params(optax_q.quantize_params(
          {'kernel': x}, 'int4', rounding=rounding, seed=seed))['kernel']

    runs = jnp.stack([decoded(s) for s in range(100)])
    self.assertFalse(bool(jnp.all(runs[0] == decoded(0, 'nearest'))))
    np.testing.assert_array_equal(runs[7], decoded(7))
    self.assertLess(float(jnp.abs(jnp.mean(runs, axis=0) - x).max()), 0.04)

  @parameterized.parameters(
      ('fp8_e4m3', None, 'float8_e4m3fn', (64, 4, 1)),
      ('int4', None, 'uint8', (64, 4, 1)),
      ('int4', 'tensor', 'uint8', (1, 1, 1)),
      ('int8', 'block', 'int8', (64, 4, 1)),
      ('bf16', None, 'bfloat16', None),
  )
  def test_layouts(self, fmt, scale_mode, codes, scale_shape):
    q = optax_q.quantize_params(_gpt_like(), fmt, scale_mode=scale_mode,
                                block_size=16)
    w = q['block_0']['attn']['query']['kernel']
    self.assertEqual(w.codes.dtype, np.dtype(codes))
    self.assertEqual(None if w.scale is None else w.scale.shape, scale_shape)
    x = _gpt_like()['block_0']['attn']['query']['kernel']
    err = jnp.abs(optax_q.dequantize_params(q)['block_0']['attn']['query'][
        'kernel'] - x).max()
    self.assertLess(float(err), 0.3 * float(jnp.abs(x).max()))
    self.assertLess(w.nbytes, x.nbytes)

  def test_custom_filter_and_dtype(self):
    params = {'a': jnp.ones((4, 8), jnp.bfloat16), 'b': jnp.ones((4, 8))}
    q = optax_q.quantize_params(params, 'int8',
                                filter=lambda path, leaf: leaf.ndim == 2)
    self.assertEqual(q['a'].dtype, 'bfloat16')
    self.assertEqual(optax_q.dequantize_params(q)['a'].dtype, jnp.bfloat16)
    self.assertEqual(optax_q.dequantize_params(q, jnp.float32)['a'].dtype,
                     jnp.float32)

  @parameterized.named_parameters(
      ('format', dict(fmt='fp9'), 'fmt'),
      ('scale_mode', dict(scale_mode='columns'), 'scale_mode'),
      ('none_int', dict(fmt='int4', scale_mode='none'), 'scale_mode'),
      ('filter', dict(filter='kernels'), 'filter'),
      ('filter_type', dict(filter=3), 'filter'),
      ('rounding', dict(rounding='up'), 'rounding'),
      ('block', dict(block_size=3), 'block_size'),
      ('seed', dict(seed=-1), 'seed'),
  )
  def test_bad_arguments(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      optax_q.quantize_params(_gpt_like(), **kwargs)

  @parameterized.parameters('fp4_e2m2u', 'ue4m0', 'int4_unsigned')
  def test_unsigned_formats_refused(self, fmt):
    with self.assertRaisesRegex(ValueError, 'fmt.*unsigned'):
      optax_q.quantize_params(_gpt_like(), fmt)
    with self.assertRaisesRegex(ValueError, 'fmt.*unsigned'):
      optax_q.fake_quantize_params(_gpt_like(), fmt)
    with self.assertRaisesRegex(ValueError, 'weight_format.*unsigned'):
      optax_q.eco(_sgd(), fmt)

  def test_nothing_chosen_is_an_error(self):
    with self.assertRaisesRegex(ValueError, 'filter chose no parameter'):
      optax_q.quantize_params({'w': jnp.ones((4, 8))})
    self.assertLen(optax_q.quantized_leaves(optax_q.quantize_params(
        {'w': jnp.ones((4, 8))}, filter='matrices')), 1)

  def test_nnx_state(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top
    model = nnx.Linear(8, 16, rngs=nnx.Rngs(0))
    _, state = nnx.split(model, nnx.Param)
    q = optax_q.quantize_params(state)
    self.assertLen(optax_q.quantized_leaves(q), 1)

  def test_non_float_and_already_quantized(self):
    with self.assertRaisesRegex(ValueError, 'not a floating-point'):
      optax_q.quantize_params({'k': jnp.ones((4, 4), jnp.int32)},
                              filter=lambda p, x: True)
    q = optax_q.quantize_params(_gpt_like())
    with self.assertRaisesRegex(ValueError, 'already quantized'):
      optax_q.quantize_params(q)

  @parameterized.parameters('fp8_e4m3', 'int4', 'bf16')
  def test_extreme_magnitudes_stay_finite(self, fmt):
    x = jnp.array([[3e38, -1e-30, 1e-45, 0.0], [1e-30, 2e-30, -0.0, 5e-31]])
    out = optax_q.dequantize_params(
        optax_q.quantize_params({'kernel': x}, fmt))['kernel']
    self.assertTrue(bool(jnp.all(jnp.isfinite(out))))
    odd = optax_q.quantize_params({'kernel': jnp.ones((3, 0))}, fmt)
    self.assertEqual(optax_q.dequantize_params(odd)['kernel'].shape, (3, 0))

  def test_fake_quantize_is_straight_through(self):
    w = {'kernel': jax.random.normal(jax.random.key(0), (8, 16))}
    fq = optax_q.fake_quantize_params(w, 'int4')
    q = optax_q.dequantize_params(optax_q.quantize_params(w, 'int4'))
    np.testing.assert_array_equal(fq['kernel'], q['kernel'])
    g = jax.grad(lambda w: jnp.sum(optax_q.fake_quantize_params(
        w, 'int4')['kernel'] * 3.0))(w)
    np.testing.assert_array_equal(g['kernel'], 3.0 * jnp.ones((8, 16)))
    # Stochastic rounding: unbiased over steps, and traced seeds work.
    fq = jax.jit(jax.vmap(lambda s: optax_q.fake_quantize_params(
        w, 'int4', rounding='stochastic', step=s)['kernel']))
    mean = jnp.mean(fq(jnp.arange(200)), axis=0)
    self.assertLess(float(jnp.abs(mean - w['kernel']).max()), 0.05)


class ApplyUpdatesTest(absltest.TestCase):

  def test_plain_trees_are_optax(self):
    p = {'a': jnp.ones(3, jnp.bfloat16), 'b': None}
    u = {'a': jnp.full(3, 0.25), 'b': None}
    helpers.assert_trees_equal(optax_q.apply_updates(p, u),
                               optax.apply_updates(p, u), dtypes=True)

  def test_bad_updates(self):
    q = optax_q.quantize_params({'kernel': jnp.ones((4, 8)),
                                 'bias': jnp.ones(8)})
    tx = optax_q.eco(_inject(optax.adamw, 1e-3))
    updates, _ = tx.update({'kernel': jnp.ones((4, 8)), 'bias': jnp.ones(8)},
                           tx.init(q), q)
    with self.assertRaisesRegex(ValueError, 'structure'):
      optax_q.apply_updates(q, {'kernel': jnp.ones((4, 8))})
    with self.assertRaisesRegex(ValueError, 'plain array, not new weights'):
      optax_q.apply_updates(q, {'kernel': jnp.ones((4, 8)),
                                'bias': jnp.ones(8)})
    with self.assertRaisesRegex(ValueError, 'parameter is a plain array'):
      optax_q.apply_updates(q, {'kernel': updates['kernel'],
                                'bias': updates['kernel']})
    other = optax_q.quantize_params({'kernel': jnp.ones((4, 8)),
                                     'bias': jnp.ones(8)}, 'int4')
    with self.assertRaisesRegex(ValueError, 'layout'):
      optax_q.apply_updates(other, updates)
    # Optax's own apply_updates (and Flax's optimizers, which call it)
    # cannot add eco's new weights to codes: a structure error.
    with self.assertRaises((ValueError, TypeError)):
      optax.apply_updates(q, updates)
    # A transform after eco changes the new weights: refused.
    scaled = optax.scale(0.5).update(updates, optax.scale(0.5).init(q))[0]
    with self.assertRaisesRegex(ValueError, 'last transform'):
      optax_q.apply_updates(q, scaled)


class EcoArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('format', dict(weight_format='fp9'), 'weight_format'),
      ('rounding', dict(rounding='down'), 'rounding'),
      ('variant', dict(variant='kahan'), 'variant'),
      ('decay_factor', dict(decay_factor='yes'), 'decay_factor'),
      ('seed', dict(seed=2**33), 'seed'),
      ('quantizer', dict(quantizer=3), 'quantizer'),
  )
  def test_bad_arguments(self, kwargs, name):
    with self.assertRaisesRegex(ValueError, name):
      optax_q.eco(_sgd(), **kwargs)

  @parameterized.named_parameters(
      ('plain_optax', lambda: optax.adamw(1e-3), 'inject_hyperparams'),
      ('not_a_transform', lambda: 'adamw', 'inner'),
      ('no_momentum', lambda: _inject(optax.sgd, 0.1), 'momentum'),
      ('zero_momentum', lambda: _sgd(momentum=0.0), r'momentum must be in'),
      ('zero_b1', lambda: _inject(optax.adam, 1e-3, b1=0.0), r'b1 must be'),
      ('negative_lr', lambda: _inject(optax.adam, -1e-3), 'learning_rate'),
      ('nan_lr', lambda: _inject(optax.adam, float('nan')), 'learning_rate'),
      ('lion', lambda: _inject(optax.lion, 1e-3), 'momentum'),
      ('lr_array', lambda: _inject(optax.adam, jnp.ones(2)), 'scalar'),
      ('lr_string', lambda: _inject(optax.adam, 'fast'), 'numeric'),
      ('nesterov_sgd', lambda: _inject(optax.sgd, 0.1, momentum=0.9,
                                       nesterov=True), 'Nesterov'),
      ('nesterov_adam', lambda: _inject(optax.adam, 1e-3, nesterov=True),
       'Nesterov'),
      ('nadam', lambda: _inject(optax.nadam, 1e-3), 'NAdam'),
      ('adamax', lambda: _inject(optax.adamax, 1e-3), 'AdaMax'),
      ('radam', lambda: _inject(optax.radam, 1e-3), 'RAdam'),
      ('lamb', lambda: _inject(optax.lamb, 1e-3), 'LAMB'),
      ('scale_after', lambda: optax.chain(_sgd(), optax.scale(2.0)),
       'after the optimizer'),
      # Quantized moments inside eco (they go around it).
      ('optax_q_adamw', lambda: _inject(optax_q.adamw, 1e-3),
       'quantize around eco'),
      ('optax_q_adamw_small', lambda: optax.inject_hyperparams(
          optax_q.adamw, static_args=('min_size',))(1e-3, min_size=0),
       'quantize around eco'),
      ('optax_q_sgd', lambda: _inject(optax_q.sgd, 0.1, momentum=0.9),
       'quantize around eco'),
  )
  def test_bad_inner(self, make, pattern):
    with self.assertRaisesRegex(ValueError, pattern):
      optax_q.eco(make())

  def test_supported_inner_optimizers(self):
    no_decay = lambda p: jax.tree.map(lambda x: False, p)
    for inner in (
        _inject(optax.adamw, optax.linear_schedule(0.0, 1e-2, 2)),
        optax.inject_hyperparams(optax.adamw, static_args=('mask',))(
            1e-3, weight_decay=0.1, mask=no_decay),
        _inject(optax.adam, 1e-3, eps_root=1e-8),
        _sgd(),
    ):
      optax_q.eco(inner)

  def test_format_checked_at_init_and_params_required(self):
    q = optax_q.quantize_params({'kernel': jnp.ones((4, 8))}, 'int4')
    with self.assertRaisesRegex(ValueError, 'weight_format'):
      optax_q.eco(_sgd(), 'fp8_e4m3').init(q)
    tx = optax_q.eco(_sgd())
    state = tx.init(q)
    with self.assertRaisesRegex(ValueError, 'params'):
      tx.update({'kernel': jnp.ones((4, 8))}, state)
    with self.assertRaisesRegex(ValueError, 'structure'):
      tx.update({'w': jnp.ones((4, 8))}, state, q)


class EcoOraclesTest(parameterized.TestCase):
  """The paper's free oracles (Nikdan et al., 2026)."""

  @parameterized.parameters(('fp8_e4m3', 'none'), ('fp8_e4m3', 'row'),
                            ('int4', 'row'))
  def test_exact_variant_is_master_weight_sgd(self, fmt, scale_mode):
    # Appendix A: with a stored residual, quantized training reproduces SGD
    # with momentum and master weights, gradients at q(theta).
    grad, _, w0 = _problem()
    lr, beta, steps = 0.05, 0.9, 30
    qp = optax_q.quantize_params({'kernel': w0}, fmt, scale_mode=scale_mode)
    q = lambda x: qarray_lib.decode(
        qarray_lib.encode_like(qp['kernel'], x, key=None))
    tx = optax_q.eco(_sgd(lr, beta), variant='exact', rounding='nearest')
    state = tx.init(qp)
    step = jax.jit(lambda qp, st: tx.update(
        {'kernel': grad(optax_q.dequantize_params(qp)['kernel'])}, st, qp))
    theta = optax_q.dequantize_params(qp)['kernel']
    m = jnp.zeros_like(theta)
    for _ in range(steps):
      m = beta * m + grad(q(theta))
      theta = theta - lr * m
      updates, state = step(qp, state)
      qp = optax_q.apply_updates(qp, updates)
      got = optax_q.dequantize_params(qp)['kernel']
      if scale_mode == 'none':
        # Bit for bit: every quantized weight is q(master weight). (With
        # scales, the master and ECO sums differ by float32 rounding, and
        # so do the row maxima the scales come from; on a finer grid such
        # as bf16's a weight within a float32 ulp of a rounding boundary
        # may also land one step away.)
        helpers.assert_bits_equal(got, q(theta))
      # The master weight is the quantized one plus the stored residual.
      np.testing.assert_allclose(got + state.error['kernel'], theta,
                                 atol=2e-5)

  @parameterized.parameters(('fp8_e4m3', 'stochastic'), ('int4', 'nearest'),
                            ('bf16', 'stochastic'))
  def test_virtual_sequence(self, fmt, rounding):
    # Lemma 3.5, for Optax's heavy-ball momentum (m = beta m + g, step lr):
    # x_t = w_t - lr beta / (1 - beta) m_t moves by -lr / (1 - beta) g(w_t)
    # exactly, whatever the quantizer.
    grad, _, w0 = _problem(1)
    lr, beta = 0.02, 0.8
    qp = optax_q.quantize_params({'kernel': w0}, fmt)
    tx = optax_q.eco(_sgd(lr, beta), rounding=rounding)
    state = tx.init(qp)
    c = lr * beta / (1 - beta)
    virtual = lambda qp, st: (optax_q.dequantize_params(qp)['kernel']
                              - c * st.inner_state.inner_state[0].trace[
                                  'kernel'])
    for _ in range(15):
      w = optax_q.dequantize_params(qp)['kernel']
      before = virtual(qp, state)
      updates, state = tx.update({'kernel': grad(w)}, state, qp)
      qp = optax_q.apply_updates(qp, updates)
      np.testing.assert_allclose(virtual(qp, state),
                                 before - lr / (1 - beta) * grad(w),
                                 atol=3e-5)

  def test_quadratic_closed_forms(self):
    # Section 3.4 / Appendix C: f = L x^2 / 2, q(x) = x + noise; the
    # stationary E[x_hat^2] of master weights, naive removal and ECO.
    big_l, eta, beta, sigma = 1.0, 0.05, 0.9, 0.01
    s2 = sigma**2
    want = dict(
        mw=big_l * eta * s2 * (1 + beta)
        / (2 * (1 + beta) - big_l * eta * (1 - beta)) + s2,
        naive=s2 * ((1 - beta**2) + 2 * beta * big_l * eta)
        / (big_l * eta * (2 * (1 - beta**2) - big_l * eta * (1 - beta)**2)),
        eco=2 * s2 / (2 * (1 - beta**2) - big_l * eta * (1 - beta)**2))
    lanes, steps, burn = 20000, 4000, 1000
    # The paper's EMA momentum with step eta is Optax's heavy ball with
    # step eta (1 - beta).
    lr = eta * (1 - beta)
    noise = lambda w, key: w + sigma * jax.random.normal(key, w.shape)

    def simulate(variant):
      if variant == 'mw':
        tx = optax.sgd(lr, momentum=beta)
      else:
        tx = optax_q.eco(_sgd(lr, beta), variant=variant, quantizer=noise)
      params = {'w': jnp.zeros(lanes)}

      def body(carry, t):
        p, st = carry
        if variant == 'mw':
          w_hat = noise(p['w'], jax.random.key(t))
        else:
          w_hat = p['w']
        updates, st = tx.update({'w': big_l * w_hat}, st, p)
        return (optax_q.apply_updates(p, updates), st), jnp.mean(w_hat**2)

      _, m = jax.jit(lambda c: jax.lax.scan(body, c, jnp.arange(steps)))(
          (params, tx.init(params)))
      return float(jnp.mean(m[burn:]))

    for variant, value in want.items():
      self.assertAlmostEqual(simulate(variant) / value, 1.0, delta=0.03,
                             msg=variant)
    # ECO's floor is 1 / (1 - beta^2) times master weights' as eta -> 0,
    # naive removal's grows like 1 / eta.
    self.assertLess(want['mw'], want['eco'])
    self.assertLess(want['eco'], want['naive'])

  def test_naive_nearest_freezes_eco_progresses(self):
    # Updates below half a grid step are lost without feedback.
    grad, loss, w0 = _problem(2)
    # A fixed grid (no scales: row maxima would move it with every update
    # of a row's largest weight).
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3',
                                 scale_mode='none')
    lr = 1e-5
    out = {}
    for variant in ('naive', 'eco'):
      tx = optax_q.eco(_sgd(lr, 0.9), variant=variant, rounding='nearest')
      final, _ = _train(tx, qp, grad, 100)
      out[variant] = optax_q.dequantize_params(final)['kernel']
    np.testing.assert_array_equal(out['naive'],
                                  optax_q.dequantize_params(qp)['kernel'])
    w_init = optax_q.dequantize_params(qp)['kernel']
    self.assertGreater(float(jnp.mean(out['eco'] != w_init)), 0.01)
    self.assertLess(float(loss(out['eco'])), float(loss(w_init)) - 0.5)

  @parameterized.parameters(optax.adamw, optax.adam)
  def test_fp32_weights_are_optax(self, opt):
    # At float32 the residual is zero: ECO is the inner optimizer.
    grad, _, w0 = _problem(3)
    sched = optax.linear_schedule(0.0, 1e-2, 5)
    # quantize_params refuses fp32 (it quantizes nothing); the codec's
    # identity layout is the oracle here.
    qp = {'kernel': optax_q.quantize(w0, 'fp32')}
    tx = optax_q.eco(_inject(opt, sched))
    # Eager on both sides: compiled, XLA may contract a product and a sum
    # into one fused multiply-add in one program and not in the other.
    final, _ = _train(tx, qp, grad, 10, jit=False)
    ref = optax.inject_hyperparams(opt)(sched)
    p, st = {'kernel': w0}, ref.init({'kernel': w0})
    for _ in range(10):
      up, st = ref.update({'kernel': grad(p['kernel'])}, st, p)
      p = optax.apply_updates(p, up)
    helpers.assert_bits_equal(optax_q.dequantize_params(final), p)

  def test_adam_feedback_beats_naive(self):
    grad, loss, w0 = _problem(4)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3')
    final = {}
    for variant in ('naive', 'eco'):
      tx = optax_q.eco(_inject(optax.adamw, 3e-4, weight_decay=0.0),
                       variant=variant, rounding='nearest')
      out, state = _train(tx, qp, grad, 60)
      final[variant] = float(loss(optax_q.dequantize_params(out)['kernel']))
      self.assertTrue(all(bool(jnp.all(jnp.isfinite(x)))
                          for x in jax.tree.leaves(state)))
    ref = {'kernel': w0}
    tx = optax.adamw(3e-4, weight_decay=0.0)
    st = tx.init(ref)
    for _ in range(60):
      up, st = tx.update({'kernel': grad(ref['kernel'])}, st, ref)
      ref = optax.apply_updates(ref, up)
    mw = float(loss(ref['kernel']))
    self.assertLess(final['eco'], final['naive'])
    self.assertLess(abs(final['eco'] - mw), abs(final['naive'] - mw))


class EcoTrapsTest(parameterized.TestCase):

  def test_exact_variant_keeps_residual_over_zero_learning_rate(self):
    # A step without feedback keeps the residual still due (exactness with
    # master weights is for a fixed learning rate only).
    grad, _, w0 = _problem(10)
    sched = lambda t: jnp.where((t >= 5) & (t < 7), 0.0, 0.05)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3',
                                 scale_mode='none')
    tx = optax_q.eco(_inject(optax.sgd, sched, momentum=0.9),
                     variant='exact', rounding='nearest')
    five, state5 = _train(tx, qp, grad, 5)
    state = state5
    step = jax.jit(lambda qp, st: tx.update(
        {'kernel': grad(optax_q.dequantize_params(qp)['kernel'])}, st, qp))
    p = five
    for _ in range(2):
      updates, state = step(p, state)
      p = optax_q.apply_updates(p, updates)
    self.assertGreater(float(jnp.abs(state5.error['kernel']).max()), 0)
    helpers.assert_trees_equal(state.error, state5.error)
    helpers.assert_trees_equal(optax_q.dequantize_params(p),
                               optax_q.dequantize_params(five))

  def test_zero_learning_rate_skips_feedback(self):
    grad, _, w0 = _problem(5)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3')
    sched = optax.linear_schedule(0.0, 1e-2, 3)
    tx = optax_q.eco(_inject(optax.adamw, sched))
    naive = optax_q.eco(_inject(optax.adamw, sched), variant='naive')
    s1, s2 = tx.init(qp), naive.init(qp)
    g = {'kernel': grad(w0)}
    u1, s1 = tx.update(g, s1, qp)
    u2, s2 = naive.update(g, s2, qp)
    helpers.assert_bits_equal(s1, s2)  # lr = 0 at step 1: no feedback.
    # And the weights did not move.
    helpers.assert_bits_equal(optax_q.apply_updates(qp, u1), qp)
    out, state = _train(tx, qp, grad, 5)
    for x in jax.tree.leaves((out, state)):
      self.assertTrue(bool(jnp.all(jnp.isfinite(x))))

  @parameterized.parameters(1e-37, 1e-30, 1e3)
  def test_extreme_learning_rates_stay_finite(self, lr):
    grad, _, w0 = _problem(6)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3')
    out, state = _train(optax_q.eco(_inject(optax.adam, lr)), qp, grad, 4)
    for x in jax.tree.leaves((out, state)):
      self.assertTrue(bool(jnp.all(jnp.isfinite(x))))

  @parameterized.parameters(1e30, 1e-30, 3e38)
  def test_extreme_gradients_stay_finite(self, scale):
    _, _, w0 = _problem(7)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3')
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax_q.eco(_inject(optax.adamw, 1e-3)))
    state = tx.init(qp)
    g = {'kernel': jnp.full(w0.shape, scale, jnp.float32)}
    for _ in range(3):
      updates, state = jax.jit(tx.update)(g, state, qp)
      qp = optax_q.apply_updates(qp, updates)
    for x in jax.tree.leaves((qp, state)):
      self.assertTrue(bool(jnp.all(jnp.isfinite(x))))

  def test_bf16_rounding_is_not_elided_under_jit(self):
    # openxla/xla#41605: a float32 -> bf16 -> float32 round trip may be
    # dropped as excess precision. The residual must be the real one.
    _, _, w0 = _problem(8)
    qp = optax_q.quantize_params({'kernel': w0 * 1.0001}, 'bf16')
    w = optax_q.dequantize_params(qp)['kernel']
    u = jnp.full(w.shape, 1e-4)

    def residual(w):
      return qarray_lib.encode_like(qp['kernel'], w + u, key=None)

    compiled = jax.jit(lambda w: (w + u) - qarray_lib.decode(residual(w)))
    self.assertIn('reduce-precision', compiled.lower(w).compile().as_text())
    got = compiled(w)
    want = np.asarray(w + u) - np.asarray(w + u).astype(
        ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    self.assertGreater(float(jnp.abs(got).max()), 0)
    # And through eco: the feedback sees that residual.
    tx = optax_q.eco(_sgd(1.0, 0.5), rounding='nearest')
    state = tx.init(qp)
    _, state = jax.jit(tx.update)({'kernel': -u}, state, qp)
    trace = state.inner_state.inner_state[0].trace['kernel']
    np.testing.assert_allclose(trace, -u + (1 - 1 / 0.5) * want, rtol=1e-6)

  def test_hyperparameters_stay_float32_with_bf16_weights(self):
    # optax.inject_hyperparams casts hyperparameters to the parameters'
    # dtype: b2 = 0.999 would become 1.0 in bf16.
    params = {'kernel': jnp.ones((4, 8), jnp.bfloat16)}
    plain = optax.inject_hyperparams(optax.adam)(1e-3, b2=0.999)
    st = plain.init(params)
    _, st = plain.update(params, st, params)
    self.assertEqual(float(st.hyperparams['b2']), 1.0)  # The trap.
    q = optax_q.quantize_params(params, 'fp8_e4m3')
    tx = optax_q.eco(optax.inject_hyperparams(optax.adam)(1e-3, b2=0.999))
    state = tx.init(q)
    _, state = tx.update(params, state, q)
    self.assertEqual(state.inner_state.hyperparams['b2'].dtype, jnp.float32)
    self.assertAlmostEqual(float(state.inner_state.hyperparams['b2']), 0.999,
                           places=6)


class EcoIntegrationTest(parameterized.TestCase):

  def test_low_bit_moments_and_no_float32_weights(self):
    # Arrays alive before the test (other tests' constants) are not its own.
    before = jax.live_arrays()
    params = _gpt_like()
    qparams = optax_q.quantize_params(params, filter='matrices')
    del params
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax_q.quantize_state(
            optax_q.eco(optax.inject_hyperparams(
                optax.adamw, static_args=('mask',))(
                    1e-3, mask=lambda p: jax.tree.map(
                        lambda x: x.ndim >= 2, p))),
            {'mu': 'int8', 'nu': 'ue4m0'}, min_size=0))
    # Compiled: run op by op, the init of this chain alone takes seconds.
    state = jax.jit(tx.init)(qparams)
    self.assertTrue(all(x.fmt.bits <= 8 for x in
                        optax_q.quantized_leaves(state).values()))

    def loss(p):
      return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(p))

    @jax.jit
    def step(qp, st):
      g = jax.grad(loss)(optax_q.dequantize_params(qp))
      up, st = tx.update(g, st, qp)
      return optax_q.apply_updates(qp, up), st

    step = jax.jit(step, donate_argnums=(0, 1))
    for _ in range(3):
      qparams, state = step(qparams, state)
    jax.block_until_ready((qparams, state))
    # Live buffers: no float32 array of a quantized kernel's shape (a
    # master copy or a decoded weight) survives the step.
    shapes = {q.shape for q in optax_q.quantized_leaves(qparams).values()}
    stale = [a for a in jax.live_arrays() if a.dtype == jnp.float32
             and a.shape in shapes and not a.is_deleted()
             and not any(a is b for b in before)]
    self.assertEqual(stale, [])
    total = optax_q.state_nbytes(qparams) + optax_q.state_nbytes(state)
    n = sum(x.size for x in jax.tree.leaves(_gpt_like()))
    self.assertLess(total / n, 2.7)

  def test_checkpoint_round_trip_resumes_bit_exactly(self):
    grad, _, w0 = _problem(9)
    qp = optax_q.quantize_params({'kernel': w0}, 'fp8_e4m3')
    tx = optax_q.quantize_state(
        optax_q.eco(_inject(optax.adamw, 1e-2)), {'mu': 'int8'},
        min_size=0)
    mid, mid_state = _train(tx, qp, grad, 3)
    whole, whole_state = _train(tx, qp, grad, 6)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'ckpt')
      helpers.save(path, {'params': mid, 'opt_state': mid_state})
      abstract = {'params': jax.eval_shape(lambda: qp),
                  'opt_state': jax.eval_shape(tx.init, qp)}
      restored = helpers.restore(path, abstract)
    helpers.assert_bits_equal(restored, {'params': mid,
                                         'opt_state': mid_state})

    def step(qp, st):
      g = {'kernel': grad(optax_q.dequantize_params(qp)['kernel'])}
      up, st = tx.update(g, st, qp)
      return optax_q.apply_updates(qp, up), st

    p, s = restored['params'], restored['opt_state']
    for _ in range(3):
      p, s = jax.jit(step)(p, s)
    helpers.assert_bits_equal((p, s), (whole, whole_state))

  def test_harness_trains_quantized_gpt(self):
    from models import data  # pylint: disable=g-import-not-at-top
    from models import gpt  # pylint: disable=g-import-not-at-top
    from models import sharding  # pylint: disable=g-import-not-at-top
    from models import train  # pylint: disable=g-import-not-at-top
    model = gpt.GPT(d_model=32, num_layers=1, num_heads=2, max_len=16)
    params = sharding.init_params(model, jnp.zeros((1, 16), jnp.int32))
    qparams = optax_q.quantize_params(params, 'fp8_e4m3')
    corpus = data.load_corpus(None, max_bytes=20000)
    tx = optax_q.eco(_inject(optax.adamw, 3e-3))
    with tempfile.TemporaryDirectory() as tmp:
      kwargs = dict(steps=6, progress=False, ckpt_dir=tmp, ckpt_every=3,
                    eval_fn=train.make_eval_fn(data.lm_eval_batches(
                        corpus.val, 4, 16, num_batches=2)), eval_every=3)
      batches = data.lm_batches(corpus.train, 4, 16, seed=0)
      whole = train.train(model, qparams, tx, batches, **kwargs)
      self.assertTrue(optax_q.is_qarray(
          whole.params['block_0']['mlp']['fc_in']['kernel']))
      self.assertTrue(np.all(np.isfinite(whole.eval_losses)))
    with tempfile.TemporaryDirectory() as tmp:
      kwargs['ckpt_dir'] = tmp
      train.train(model, qparams, tx, batches, **dict(kwargs, steps=3))
      resumed = train.train(model, qparams, tx, batches, resume=True,
                            **kwargs)
    helpers.assert_bits_equal(resumed.params, whole.params)


if __name__ == '__main__':
  absltest.main()
