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
"""Orbax checkpoints of quantized optimizer state, and exact resumption.

The state is plain arrays (codes, float32 scales, counters) in pytree
containers whose formats are static, and stochastic rounding draws its bits
from ``(seed, step, leaf, element)``, with no PRNG key in the state. So a run
that is saved, restored into the abstract state of ``jax.eval_shape`` and
continued must repeat the uninterrupted run bit for bit.
"""

import functools
import os
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
import pytest

import optax_q

import helpers

STEPS = 4
SAVE_AT = 2


def _params():
  k1, k2 = jax.random.split(jax.random.key(0))
  return {
      'w': jax.random.normal(k1, (16, 256)) * 0.1,
      'b': jax.random.normal(k2, (256,)) * 0.1,  # Small: stays float32.
  }


class CheckpointTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('int8_dynamic', 'int8_dynamic', 'int8_dynamic', 'stochastic'),
      ('fp8', 'fp8_e4m3', 'fp8_e5m2', 'stochastic'),
      ('int4_packed', 'int4', 'fp4_e2m2u', 'stochastic'),
      ('fp4_nearest', 'fp4_e2m1', 'int4', 'nearest'),
      # Rounding in preconditioner space: its eps is part of the format's
      # name, and so of the checkpoint's keys (a '.' and a '-' in them).
      ('preconditioner', 'nf4', 'ue4m0', 'preconditioner', 2.5e-7),
  )
  def test_resumed_run_is_bit_identical(self, mu, nu, rounding, eps=1e-8):
    tx = optax_q.adamw(1e-2, mu_format=mu, nu_format=nu, rounding=rounding,
                       seed=7, min_size=1024, eps=eps)
    params = _params()

    @jax.jit
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state

    def train(params, state, start, stop):
      for i in range(start, stop):
        params, state = step(params, state, helpers.grads(i, params))
      return params, state

    init = jax.jit(tx.init)
    want = train(params, init(params), 0, STEPS)

    p, s = train(params, init(params), 0, SAVE_AT)
    self.assertLen(optax_q.quantized_leaves(s), 2)
    abstract = jax.eval_shape(
        lambda p: {'params': p, 'opt_state': tx.init(p)}, params)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, f'step_{SAVE_AT}')
      helpers.save(path, {'params': p, 'opt_state': s})
      restored = helpers.restore(path, abstract)
    # Codes (uint8 nibble pairs, float8, ...), scales and counters come back
    # exactly, with their dtypes, into the layout of the abstract state.
    helpers.assert_trees_equal(restored, {'params': p, 'opt_state': s},
                               dtypes=True)
    q = restored['opt_state'][0].inner_state.mu['w']
    self.assertTrue(optax_q.is_qarray(q))
    self.assertEqual(q.fmt, optax_q.get_format(mu))
    got = train(restored['params'], restored['opt_state'], SAVE_AT, STEPS)
    helpers.assert_trees_equal(got, want, dtypes=True)
    self.assertEqual(int(got[1][0].count), STEPS)

  def test_checkpoint_manager_and_state_bytes(self):
    tx = optax_q.adamw(1e-2, mu_format='int4', nu_format='int8_dynamic',
                       min_size=1024)
    params = _params()
    state = jax.jit(tx.init)(params)
    _, state = jax.jit(tx.update)(helpers.grads(0, params), state, params)
    with tempfile.TemporaryDirectory() as tmp:
      with ocp.CheckpointManager(
          tmp, options=ocp.CheckpointManagerOptions(max_to_keep=1)) as mngr:
        mngr.save(1, args=ocp.args.StandardSave(state))
        mngr.wait_until_finished()
        self.assertEqual(mngr.latest_step(), 1)
        restored = mngr.restore(
            1, args=ocp.args.StandardRestore(
                jax.eval_shape(tx.init, params)))
    helpers.assert_trees_equal(restored, state, dtypes=True)
    # 4-bit codes stay packed: half a byte per element, plus the scales.
    self.assertEqual(optax_q.state_nbytes(restored),
                     optax_q.state_nbytes(state))
    self.assertEqual(restored[0].inner_state.mu['w'].codes.shape, (16, 128))

  def test_nnx_optimizer_roundtrip(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top

    def make():
      model = nnx.Linear(8, 256, rngs=nnx.Rngs(0))
      tx = optax_q.adamw(1e-2, mu_format='fp8_e4m3', nu_format='int4',
                         min_size=1024)
      return model, nnx.jit(
          lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(model)

    x = jax.random.normal(jax.random.key(2), (16, 8))

    @nnx.jit
    def train_step(model, opt):
      grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
      opt.update(model, grads)

    model, opt = make()
    for _ in range(SAVE_AT):
      train_step(model, opt)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'nnx')
      helpers.save(path, nnx.state((model, opt)))
      model2, opt2 = make()
      abstract = jax.tree.map(
          lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
          nnx.state((model2, opt2)))
      nnx.update((model2, opt2), helpers.restore(path, abstract))
    for _ in range(STEPS - SAVE_AT):
      train_step(model, opt)
      train_step(model2, opt2)
    helpers.assert_trees_equal(nnx.state((model2, opt2)),
                               nnx.state((model, opt)), dtypes=True)
    q = opt2.opt_state[0].inner_state.nu['kernel']
    self.assertTrue(optax_q.is_qarray(q))
    self.assertEqual(q.codes.get_value().shape, (8, 128))


# Packed formats, one of each packing (two codes per byte, eight per three
# bytes) and kind (integer, signed and unsigned codebooks, float and
# power-of-two grids); the others of the family in the slow suite.
_PACKED = ('int4', 'nf4', 'nf3', 'fp4_e2m1', 'fp4_e2m2u', 'ue2m1')
_PACKED_SLOW = ('ue2m2', 'ue3m1', 'ue1m2', 'ue3m0', 'e2m1', 'int4_unsigned',
                'int4_sqrt', 'int3_sqrt', 'int4_mulaw', 'int3_mulaw',
                'int4_softsign', 'int3_softsign')
_MODES = ('block', 'row', 'tensor', 'rank1', 'block_pow2')
# Last axes whose neighbours pack into as many bytes as they do: 13 and 14
# codes of 4 bits take 7 bytes, 12 to 14 codes of 3 bits 6 bytes.
_SAVED = ((5, 13), (5, 14))


# Compiled: eager quantization dispatches each of its small operations.
_quantize = jax.jit(optax_q.quantize,
                    static_argnames=('fmt', 'scale_mode', 'block_size'))


@functools.cache
def _abstract(fmt, mode, shape):
  return jax.eval_shape(lambda x: _quantize(
      x, fmt, scale_mode=mode, block_size=8), jnp.zeros(shape))


def _tag(shape):
  return str(tuple(shape)).replace(' ', '')


class ShapeChangeTest(parameterized.TestCase):
  """A checkpoint never restores into a state of another shape.

  Packed codes keep the rank and hide the length of the last axis (two
  codes per byte, eight per three bytes), so a restore must not rely on
  their shape: the logical shape is checked for every layout.
  """

  def _assert_refused(self, path, saved, leaf, old, new):
    target = dict(saved)
    target[leaf] = jax.eval_shape(lambda x: x, new)
    with self.assertRaises(ValueError) as cm:
      helpers.restore(path, target)
    message = str(cm.exception)
    self.assertIn(_tag(old.shape), message)
    self.assertIn(_tag(new.shape), message)
    self.assertIn(leaf, message)

  def _check(self, fmt, modes):
    values = jax.random.normal(jax.random.key(3), (5, 14))
    if not optax_q.get_format(fmt).signed:
      values = jnp.abs(values)
    saved = {f'{mode}{shape[-1]}': _quantize(
        values[:, :shape[-1]], fmt, scale_mode=mode, block_size=8)
             for mode in modes for shape in _SAVED}
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, fmt)
      helpers.save(path, saved)
      abstract = jax.eval_shape(lambda t: t, saved)
      # The same shapes restore exactly.
      helpers.assert_trees_equal(helpers.restore(path, abstract), saved,
                                 dtypes=True)
      for leaf, q in abstract.items():
        for axis in range(q.ndim):
          for step in (-1, 1):
            shape = list(q.shape)
            shape[axis] += step
            self._assert_refused(
                path, abstract, leaf, q,
                _abstract(fmt, q.scale_mode, tuple(shape)))

  @parameterized.parameters(*_PACKED)
  def test_packed_codes_refuse_another_shape(self, fmt):
    self._check(fmt, ('block',))

  def test_every_layout_refuses_another_shape(self):
    self._check('nf3', _MODES)

  @parameterized.parameters(*_PACKED, *_PACKED_SLOW)
  @pytest.mark.slow
  def test_packed_codes_refuse_another_shape_slow(self, fmt):
    self._check(fmt, _MODES)

  @parameterized.named_parameters(
      ('adamw_nf4', lambda: optax_q.adamw(
          1e-3, mu_format='nf4', nu_format='int4_unsigned', min_size=0)),
      ('adaptive', lambda: optax.chain(
          optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                                min_size=0),
          optax.scale_by_learning_rate(1e-3))),
      ('muon_int4', lambda: optax_q.muon(1e-3, mu_format='int4', min_size=0)),
      ('shampoo_nf4', lambda: optax_q.shampoo(
          1e-3, mu_format='nf4', nu_format='int4_unsigned',
          stats_format='int4', eigvecs_format='int4', min_size=0)),
  )
  def test_optimizer_state_refuses_another_shape(self, make):
    tx = make()
    params = {'w': jnp.ones((36, 129)) * 0.1}
    state = jax.jit(tx.init)(params)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'state')
      helpers.save(path, state)
      for cols in (130, 128):
        target = jax.eval_shape(tx.init, {'w': jnp.ones((36, cols))})
        with self.assertRaisesRegex(ValueError, r'\(36,129\)'):
          helpers.restore(path, target)

  @parameterized.parameters('nf4', 'nf3', 'int4')
  def test_quantized_weights_refuse_another_shape(self, fmt):
    params = {'w': jax.random.normal(jax.random.key(0), (36, 129))}
    qparams = optax_q.quantize_params(params, fmt, filter='all')
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'weights')
      helpers.save(path, qparams)
      for cols in (130, 127):
        target = jax.eval_shape(
            lambda p: optax_q.quantize_params(p, fmt, filter='all'),
            {'w': jnp.zeros((36, cols))})
        with self.assertRaisesRegex(ValueError, r'\(36,129\)'):
          helpers.restore(path, target)


if __name__ == '__main__':
  absltest.main()
