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
"""Shampoo and SOAP: NumPy references, low-bit state, resets, bad input."""

from __future__ import annotations

import functools
import tempfile

import helpers

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q

from optax_q._src.second_order import preconditioner as pc

STEPS = 20
FREQUENCY = 8  # Refreshes at updates 1, 9 and 17.
MAX_DIM = 8
# A ragged 12 x 20 matrix (blocks 8|4 by 8|8|4), a 3-D kernel read as
# 6 x 6, and a vector.
SHAPES = {'w': (12, 20), 'k': (6, 2, 3), 'b': (7,)}


# SOAP's basis is not unique where a statistic is rank-deficient (the first
# one of an 8 x 4 block has rank 4), so its reference runs square blocks.
SOAP_SHAPES = {'w': (16, 24), 'k': (6, 2, 3), 'b': (7,)}


def _grads(seed: int = 0, shapes=None) -> list[dict[str, np.ndarray]]:
  rng = np.random.default_rng(seed)
  return [{k: rng.normal(size=s).astype(np.float32)
           for k, s in (shapes or SHAPES).items()} for _ in range(STEPS)]


def _blocks(n: int) -> list[slice]:
  return [slice(i, min(i + MAX_DIM, n)) for i in range(0, n, MAX_DIM)]


def _as_matrix(name: str, x: np.ndarray) -> np.ndarray:
  return x.reshape(6, 6) if name == 'k' else x


def _inv_root(mat: np.ndarray, eps: float, correction: float):
  w, v = np.linalg.eigh(mat)
  w = np.maximum(w, 0.0) / correction
  d = (w + eps * w.max()) ** -0.25
  return (v * d) @ v.T


class _RefShampoo:
  """Shampoo with Adam grafting, written plainly (float64, ragged blocks,
  statistics in the original basis, inverse roots recomputed from them)."""

  def __init__(self, b1=0.9, b2=0.999, eps=1e-8, beta=0.99, meps=1e-3):
    self.b1, self.b2, self.eps, self.beta, self.meps = b1, b2, eps, beta, meps
    self.t = 0
    self.mu, self.nu, self.stats, self.roots = {}, {}, {}, {}

  def update(self, grads):
    self.t += 1
    t, out = self.t, {}
    for name, g in grads.items():
      g = g.astype(np.float64)
      mu = self.mu[name] = self.b1 * self.mu.get(name, 0) + (1 - self.b1) * g
      nu = self.nu[name] = (self.b2 * self.nu.get(name, 0)
                            + (1 - self.b2) * g * g)
      m_hat = mu / (1 - self.b1**t)
      adam = m_hat / (np.sqrt(nu / (1 - self.b2**t)) + self.eps)
      if g.ndim < 2:
        out[name] = adam
        continue
      gm, mm, am = (_as_matrix(name, x) for x in (g, m_hat, adam))
      upd = np.zeros_like(gm)
      for rs in _blocks(gm.shape[0]):
        for cs in _blocks(gm.shape[1]):
          key = (name, rs.start, cs.start)
          gb = gm[rs, cs]
          l, r = self.stats.get(key, (0.0, 0.0))
          l = self.beta * l + (1 - self.beta) * gb @ gb.T
          r = self.beta * r + (1 - self.beta) * gb.T @ gb
          self.stats[key] = (l, r)
          if (t - 1) % FREQUENCY == 0:
            c = 1 - self.beta**t
            self.roots[key] = (_inv_root(l, self.meps, c),
                               _inv_root(r, self.meps, c))
          pl, pr = self.roots[key]
          d = pl @ mm[rs, cs] @ pr
          upd[rs, cs] = d * np.linalg.norm(am[rs, cs]) / np.linalg.norm(d)
      out[name] = upd.reshape(g.shape)
    return out


class _RefSoap:
  """SOAP, written plainly (float64, ragged blocks, statistics in the
  original basis, moments in the rotated one)."""

  def __init__(self, b1=0.95, b2=0.95, eps=1e-8, beta=0.95):
    self.b1, self.b2, self.eps, self.beta = b1, b2, eps, beta
    self.t = 0
    self.blocks, self.mu, self.nu = {}, {}, {}

  def _refresh(self, key, mu, nu):
    l, r, ql, qr = self.blocks[key]
    if self.t == 1:
      ql = np.linalg.eigh(l)[1][:, ::-1]
      qr = np.linalg.eigh(r)[1][:, ::-1]
      self.blocks[key] = (l, r, ql, qr)
      return mu, nu
    new = []
    orders = []
    for stat, q in ((l, ql), (r, qr)):
      order = np.argsort(-np.diag(q.T @ stat @ q), kind='stable')
      new.append(np.linalg.qr(stat @ q[:, order])[0])
      orders.append(order)
    mu = new[0].T @ ql @ mu @ qr.T @ new[1]
    nu = nu[orders[0]][:, orders[1]]
    self.blocks[key] = (l, r, new[0], new[1])
    return mu, nu

  def _block(self, key, gb):
    n, m = gb.shape
    l, r, ql, qr = self.blocks.get(
        key, (np.zeros((n, n)), np.zeros((m, m)), np.eye(n), np.eye(m)))
    l = self.beta * l + (1 - self.beta) * gb @ gb.T
    r = self.beta * r + (1 - self.beta) * gb.T @ gb
    self.blocks[key] = (l, r, ql, qr)
    mu = self.mu.get(key, np.zeros_like(gb))
    nu = self.nu.get(key, np.zeros_like(gb))
    if (self.t - 1) % FREQUENCY == 0:
      mu, nu = self._refresh(key, mu, nu)
    _, _, ql, qr = self.blocks[key]
    if self.t == 1:  # The first update sets up the bases only.
      return np.zeros_like(gb)
    k = self.t - 1
    g_rot = ql.T @ gb @ qr
    mu = self.mu[key] = self.b1 * mu + (1 - self.b1) * g_rot
    nu = self.nu[key] = self.b2 * nu + (1 - self.b2) * g_rot**2
    n_rot = (mu / (1 - self.b1**k)) / (
        np.sqrt(nu / (1 - self.b2**k)) + self.eps)
    return ql @ n_rot @ qr.T

  def update(self, grads):
    self.t += 1
    out = {}
    for name, g in grads.items():
      g = g.astype(np.float64)
      if g.ndim < 2:
        out[name] = self._adam(name, g)
        continue
      gm = _as_matrix(name, g)
      upd = np.zeros_like(gm)
      for rs in _blocks(gm.shape[0]):
        for cs in _blocks(gm.shape[1]):
          upd[rs, cs] = self._block((name, rs.start, cs.start), gm[rs, cs])
      out[name] = upd.reshape(g.shape)
    return out

  def _adam(self, name, g):
    if self.t == 1:
      return np.zeros_like(g)
    k = self.t - 1
    mu = self.mu[name] = self.b1 * self.mu.get(name, 0) + (1 - self.b1) * g
    nu = self.nu[name] = self.b2 * self.nu.get(name, 0) + (1 - self.b2) * g * g
    return (mu / (1 - self.b1**k)) / (np.sqrt(nu / (1 - self.b2**k))
                                      + self.eps)


def _run(tx, grads):
  params = jax.tree.map(jnp.zeros_like, grads[0])
  state = tx.init(params)
  step = jax.jit(tx.update)
  out = []
  for g in grads:
    u, state = step(jax.tree.map(jnp.asarray, g), state, params)
    out.append(jax.tree.map(np.asarray, u))
  return out, state


def _worst(ours, ref) -> float:
  """Largest error relative to each update's own largest entry."""
  worst = 0.0
  for u, r in zip(ours, ref):
    for k in r:
      scale = max(np.max(np.abs(r[k])), 1e-30)
      worst = max(worst, float(np.max(np.abs(u[k] - r[k])) / scale))
  return worst


class ReferenceTest(absltest.TestCase):
  """float32 Shampoo and SOAP against plain NumPy (float64) over 20 updates
  and three refreshes, ragged blocks included."""

  def test_shampoo_matches_numpy(self):
    # The first statistics have rank 4 in 8 x 8 blocks; their null space
    # holds float32 eigenvalues of about 1e-7 of the largest, which a
    # matrix_eps of 1e-6 would amplify into 1e-2 differences with float64.
    grads = _grads()
    ours, state = _run(optax_q.scale_by_shampoo(
        max_preconditioner_dim=MAX_DIM, precondition_frequency=FREQUENCY,
        shampoo_beta=0.99, matrix_eps=1e-3), grads)
    ref = _RefShampoo()
    self.assertLess(_worst(ours, [ref.update(g) for g in grads]), 2e-4)
    self.assertEqual(int(state.count), STEPS)

  def test_soap_matches_numpy(self):
    grads = _grads(1, SOAP_SHAPES)
    ours, _ = _run(optax_q.scale_by_soap(
        max_preconditioner_dim=MAX_DIM, precondition_frequency=FREQUENCY),
                   grads)
    ref = _RefSoap()
    self.assertLess(_worst(ours, [ref.update(g) for g in grads]), 2e-4)

  def test_padded_block_computes_the_unpadded_one(self):
    # The 4 x 4 corner of a 12 x 12 matrix is padded to 8 x 8.
    grads = _grads(3, {'w': (12, 12)})
    tx = optax_q.scale_by_soap(max_preconditioner_dim=MAX_DIM,
                               precondition_frequency=FREQUENCY)
    whole, _ = _run(tx, grads)
    corner, _ = _run(tx, [{'w': g['w'][8:, 8:]} for g in grads])
    worst = max(float(np.max(np.abs(a['w'][8:, 8:] - b['w'])))
                / float(np.max(np.abs(b['w'])) or 1.0)
                for a, b in zip(whole, corner))
    self.assertLess(worst, 1e-4)

  def test_padding_keeps_unit_basis_vectors(self):
    _, state = _run(optax_q.scale_by_soap(
        max_preconditioner_dim=MAX_DIM, precondition_frequency=FREQUENCY),
                    _grads(2))
    q = np.asarray(state.eigvecs_r['w'][0, 2])  # Columns 16..19 + padding.
    np.testing.assert_array_equal(np.abs(q[4:, 4:]) @ np.ones(4), np.ones(4))
    np.testing.assert_array_equal(q[:4, 4:], 0.0)


# -----------------------------------------------------------------------------
# The constructors: low-bit state, resets, guards, checkpoints, bad input.
# -----------------------------------------------------------------------------

OPTIMIZERS = {'shampoo': (optax_q.shampoo, optax_q.scale_by_shampoo),
              'soap': (optax_q.soap, optax_q.scale_by_soap)}
BIG = {'w': (256, 256), 'v': (128, 384), 'b': (256,)}
FP32 = dict(mu_format='fp32', nu_format='fp32', stats_format='fp32',
            eigvecs_format='fp32')


def _params(shapes=None):
  return {k: jnp.zeros(s) for k, s in (shapes or BIG).items()}


@functools.cache
def _jitted_step(tx):
  """One compiled step per transform, however many runs it makes."""
  return jax.jit(helpers.step_fn(tx))


def _train(tx, params, steps, start=0, state=None, scale=1.0):
  state = tx.init(params) if state is None else state
  step = _jitted_step(tx)
  for i in range(start, start + steps):
    g = jax.tree.map(lambda x: x * scale, helpers.grads(i, params))
    params, state = step(params, state, g)
  return params, state


class ConstructorTest(parameterized.TestCase):

  @parameterized.parameters('shampoo', 'soap')
  def test_fp32_formats_are_the_plain_chain(self, name):
    make, scale_by = OPTIMIZERS[name]
    params = _params({'w': (24, 40), 'b': (40,)})
    ours = make(1e-2, weight_decay=0.1, max_preconditioner_dim=16,
                precondition_frequency=3, **FP32)
    plain = optax.chain(
        scale_by(max_preconditioner_dim=16, precondition_frequency=3,
                 **({} if name == 'soap' else {})),
        optax.add_decayed_weights(0.1), optax.scale_by_learning_rate(1e-2))
    helpers.assert_bits_equal(_train(ours, params, 7)[0],
                              _train(plain, params, 7)[0])

  @parameterized.parameters('shampoo', 'soap')
  def test_8bit_state_is_under_30_percent_and_trains_close(self, name):
    make, _ = OPTIMIZERS[name]
    params = _params()
    low = make(1e-3, max_preconditioner_dim=128, precondition_frequency=4)
    full = make(1e-3, max_preconditioner_dim=128, precondition_frequency=4,
                **FP32)
    low_state, full_state = low.init(params), full.init(params)
    ratio = (optax_q.state_nbytes(low_state)
             / optax_q.state_nbytes(full_state))
    self.assertLess(ratio, 0.30)
    p_low, s_low = _train(low, params, 9, state=low_state)
    p_full, _ = _train(full, params, 9, state=full_state)
    for a, b in zip(jax.tree.leaves(p_low), jax.tree.leaves(p_full)):
      self.assertTrue(np.all(np.isfinite(a)))
      # Nine steps of at most lr per coordinate: the paths agree to a few
      # percent of the distance travelled.
      self.assertLess(float(jnp.max(jnp.abs(a - b))), 0.1 * 9e-3)
    leaves = optax_q.quantized_leaves(s_low)
    self.assertTrue(any('stats_l' in k for k in leaves))
    self.assertTrue(any('eigvecs_r' in k for k in leaves))
    self.assertFalse(any('eigvals' in k for k in leaves))

  def test_stored_bases_do_not_drift_between_refreshes(self):
    params = _params({'w': (128, 128)})
    tx = optax_q.soap(1e-3, precondition_frequency=5, min_size=0)
    codes = []
    state = tx.init(params)
    step = jax.jit(helpers.step_fn(tx))
    for i in range(4):
      params, state = step(params, state, helpers.grads(i, params))
      codes.append(np.asarray(state[0].inner_state.eigvecs_l['w'].codes))
    for c in codes[1:]:  # Refreshed at the first update only.
      np.testing.assert_array_equal(c, codes[0])

  def test_rectification_restores_orthogonality(self):
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.normal(size=(64, 64)))[0].astype(np.float32)
    err = lambda x: float(jnp.max(jnp.abs(x.T @ x - jnp.eye(64))))
    for fmt, factor in (('int8', 0.05), ('int4', 0.3)):
      coded = optax_q.dequantize(optax_q.quantize(jnp.asarray(q), fmt))
      self.assertLess(err(pc.rectify(coded, 1)), factor * err(coded))


class GuardTest(parameterized.TestCase):

  @parameterized.parameters('shampoo', 'soap')
  def test_non_finite_statistics_keep_the_last_good_basis(self, name):
    _, scale_by = OPTIMIZERS[name]
    tx = scale_by(max_preconditioner_dim=8, precondition_frequency=2)
    params = {'w': jnp.zeros((8, 16))}
    state = tx.init(params)
    update = jax.jit(tx.update)
    for i in range(3):
      _, state = update(helpers.grads(i, params), state)
    # A NaN in the first of the two 8 x 8 blocks, before the refresh of
    # the fifth update (count 4): that block keeps its bases, the other
    # one refreshes.
    block = lambda st: (st.eigvecs_l['w'][0, 0], st.eigvecs_r['w'][0, 0])
    before, other = block(state), state.eigvecs_l['w'][0, 1]
    bad = {'w': helpers.grads(3, params)['w'].at[0, 0].set(jnp.nan)}
    _, state = update(bad, state)
    _, state = update(bad, state)
    helpers.assert_bits_equal(block(state), before)
    self.assertFalse(np.array_equal(state.eigvecs_l['w'][0, 1], other))
    self.assertTrue(np.all(np.isfinite(state.eigvecs_l['w'])))
    if name == 'shampoo':
      self.assertTrue(np.all(np.isfinite(state.eigvals_l['w'])))

  @parameterized.parameters('shampoo', 'soap')
  def test_huge_and_tiny_gradients_stay_finite(self, name):
    make, _ = OPTIMIZERS[name]
    params = _params({'w': (64, 64), 'b': (64,)})
    # One transform (the gradients are scaled outside the compiled step).
    tx = make(1e-3, max_preconditioner_dim=32, precondition_frequency=2,
              min_size=0)
    initial = tx.init(params)
    for scale in (1e15, 1e-30):
      p, state = _train(tx, params, 4, state=initial, scale=scale)
      for leaf in jax.tree.leaves((p, state)):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
          self.assertTrue(np.all(np.isfinite(leaf)), (scale, leaf.shape))


class ResetTest(parameterized.TestCase):

  @parameterized.parameters(('shampoo', 'int8'), ('soap', 'fp32'))
  def test_statistics_reset_to_a_scaled_identity(self, name, fmt):
    make, _ = OPTIMIZERS[name]
    params = _params({'w': (32, 64)})
    tx = make(1e-3, max_preconditioner_dim=32, precondition_frequency=2,
              min_size=0, reset_every=3, shampoo_beta=0.9,
              stats_format=fmt)
    _, state = _train(tx, params, 3)
    reset = state[0]
    self.assertEqual(int(reset.resets['stats_l']), 1)
    self.assertEqual(int(reset.ages['stats_r']), 0)
    inner = reset.inner_state
    inner = inner.inner_state if hasattr(inner, 'stalled') else inner
    self.assertEqual(int(inner.count_stats_l), 0)
    self.assertEqual(int(inner.count_mu), 0)
    stats = np.asarray(optax_q.dequantize(inner.stats_l['w'])
                       if optax_q.is_qarray(inner.stats_l['w'])
                       else inner.stats_l['w'])
    diag = np.diagonal(stats, axis1=-2, axis2=-1)
    self.assertTrue(np.all(diag > 0))
    np.testing.assert_allclose(diag, diag[..., :1] * np.ones_like(diag),
                               rtol=1e-2)
    off = stats - diag[..., None] * np.eye(32)
    np.testing.assert_array_equal(off, 0.0)
    mu = inner.mu['w']
    mu = optax_q.dequantize(mu) if optax_q.is_qarray(mu) else mu
    np.testing.assert_array_equal(np.asarray(mu), 0.0)
    # And training goes on, finite.
    p, state = _train(tx, params, 4, start=3, state=state)
    self.assertTrue(all(np.all(np.isfinite(x)) for x in jax.tree.leaves(p)))

  def test_reset_to_identity_needs_square_matrices(self):
    with self.assertRaisesRegex(ValueError, 'square'):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), {'mu': 1},
                          reset_to={'mu': 'identity'})

  @parameterized.parameters('shampoo', 'soap')
  def test_identity_reset_clears_non_finite_statistics(self, name):
    make, _ = OPTIMIZERS[name]
    params = _params({'w': (16, 16)})
    tx = make(1e-3, max_preconditioner_dim=16, min_size=0, reset_every=2,
              **FP32)
    state = tx.init(params)
    step = jax.jit(tx.update)
    bad = {'w': jnp.full((16, 16), jnp.nan)}
    _, state = step(bad, state, params)
    _, state = step(helpers.grads(1, params), state, params)  # Reset.
    _, state = step(helpers.grads(2, params), state, params)
    stats = state[0].inner_state.inner_state.stats_l['w']
    self.assertTrue(bool(jnp.all(jnp.isfinite(stats))))

  def test_reset_to_checks_its_fields(self):
    with self.assertRaisesRegex(ValueError, 'reset_to'):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), {'mu': 1},
                          reset_to={'nu': 'identity'})
    with self.assertRaisesRegex(ValueError, r"reset_to\['mu'\]"):
      optax_q.reset_state(optax_q.scale_by_adam_local_age(), {'mu': 1},
                          reset_to={'mu': 'ones'})


class CheckpointTest(parameterized.TestCase):

  @parameterized.parameters('shampoo', 'soap')
  def test_resume_is_bit_identical(self, name):
    make, _ = OPTIMIZERS[name]
    params = _params({'w': (64, 128), 'b': (128,)})
    tx = make(1e-3, max_preconditioner_dim=64, precondition_frequency=3,
              min_size=0, reset_every=4)
    p2, s2 = _train(tx, params, 2)
    with tempfile.TemporaryDirectory() as tmp:
      helpers.save(f'{tmp}/ckpt', {'params': p2, 'state': s2})
      restored = helpers.restore(f'{tmp}/ckpt', {
          'params': p2, 'state': jax.eval_shape(tx.init, params)})
    resumed = _train(tx, restored['params'], 5, start=2,
                     state=restored['state'])
    straight = _train(tx, params, 7)
    helpers.assert_bits_equal(resumed, straight)


class BadInputTest(parameterized.TestCase):

  @parameterized.product(
      name=('shampoo', 'soap'),
      kwargs=(
          dict(precondition_frequency=0), dict(precondition_frequency=1.5),
          dict(max_preconditioner_dim=0), dict(max_preconditioner_dim=-4),
          dict(b1=1.0), dict(b2=-0.1), dict(shampoo_beta=1.0),
          dict(eigvecs_format='fp4_e2m2u'), dict(eigvecs_format='e1m1'),
          dict(stats_format='fp4_e2m2u'), dict(mu_format='nope'),
          dict(reset_every=0), dict(reset_every={'m': 3}),
          dict(rounding='up'), dict(learning_rate=-1.0),
          dict(weight_decay=float('nan'))))
  def test_refused_at_construction(self, name, kwargs):
    make, _ = OPTIMIZERS[name]
    kwargs = dict(kwargs)
    lr = kwargs.pop('learning_rate', 1e-3)
    with self.assertRaises(ValueError) as err:
      make(lr, **kwargs)
    arg = next(iter(kwargs)) if kwargs else 'learning_rate'
    self.assertIn(arg, str(err.exception))

  @parameterized.parameters(
      dict(grafting='adagrad'), dict(matrix_eps=0.0), dict(rectify_steps=9))
  def test_scale_by_shampoo_refuses(self, **kwargs):
    with self.assertRaisesRegex(ValueError, next(iter(kwargs))):
      optax_q.scale_by_shampoo(**kwargs)

  def test_bad_reset_combinations(self):
    with self.assertRaisesRegex(ValueError, 'shampoo_beta'):
      optax_q.soap(1e-3, shampoo_beta=0.0, reset_every=3)
    with self.assertRaisesRegex(ValueError, "'nu'"):
      optax_q.shampoo(1e-3, grafting='sgd', reset_every={'nu': 5})

  def test_inject_hyperparams_with_the_defaults(self):
    for make in (optax_q.shampoo, optax_q.soap):
      tx = optax.inject_hyperparams(make)(learning_rate=1e-2)
      params = {'w': jnp.zeros((8, 8))}
      updates, _ = tx.update({'w': jnp.ones((8, 8))}, tx.init(params), params)
      self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))

  def test_masked_and_degenerate_leaves(self):
    params = {'w': jnp.ones((8, 6)), 'b': jnp.ones(6), 'r': jnp.ones((1, 64))}
    for scale_by in (optax_q.scale_by_shampoo, optax_q.scale_by_soap):
      tx = optax.masked(scale_by(), {'w': True, 'b': False, 'r': True})
      state = tx.init(params)
      updates, _ = tx.update(params, state, params)
      self.assertEqual(updates['w'].shape, (8, 6))
      # A one-row matrix is taken as a vector: no 64 x 64 statistic.
      self.assertIsInstance(state.inner_state.stats_r['r'], optax.MaskedNode)

  def test_zero_statistics_do_not_precondition(self):
    tx = optax_q.scale_by_shampoo(grafting='none', precondition_frequency=5)
    params = {'w': jnp.zeros((8, 8))}
    state = tx.init(params)
    _, state = tx.update({'w': jnp.zeros((8, 8))}, state)
    updates, _ = tx.update({'w': jnp.ones((8, 8))}, state)
    self.assertLess(float(jnp.max(jnp.abs(updates['w']))), 10.0)

  def test_non_adam_grafting_keeps_no_second_moment(self):
    tx = optax_q.shampoo(1e-3, grafting='sgd', min_size=0)
    state = tx.init({'w': jnp.zeros((64, 64))})
    self.assertIsInstance(state[0].inner_state.nu['w'], optax.MaskedNode)


if __name__ == '__main__':
  absltest.main()
