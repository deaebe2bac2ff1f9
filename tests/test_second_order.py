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

import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q

from optax_q._src import preconditioner as pc

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


if __name__ == '__main__':
  absltest.main()
