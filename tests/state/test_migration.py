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
"""``from_optax`` and ``to_optax``: migration from and to plain Optax.

A plain state encoded by ``from_optax`` and decoded by ``to_optax`` comes
back within half a grid step of each block (the largest distance from a
point of the block's range to the format's grid, times the block's scale),
and exactly where the state is float32; the counts carry over; a plain
Orbax checkpoint resumes under optax_q with the loss going on as it would
have under Optax.
"""

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
import pytest

import optax_q
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.state import migration

import helpers

# An odd layout: a matrix whose rows are not a whole number of blocks, a
# vector shorter than a block, and a scalar.
SHAPES = {'w': (16, 200), 'b': (24,), 's': ()}


def _params():
  keys = jax.random.split(jax.random.key(0), len(SHAPES))
  return {n: jax.random.normal(k, s) for k, (n, s) in
          zip(keys, sorted(SHAPES.items()))}


def _trained(tx, params, steps=2):
  """The state of ``tx`` after ``steps`` jitted updates on normal grads."""
  state = jax.jit(tx.init)(params)
  step = jax.jit(helpers.step_fn(tx))
  for i in range(steps):
    params, state = step(params, state, helpers.grads(i, params))
  return params, state


PLAIN = {
    'adam': lambda: optax.adam(1e-2),
    'adamw': lambda: optax.adamw(1e-2),
    'lion': lambda: optax.lion(1e-3),
    'sgd': lambda: optax.sgd(1e-2, momentum=0.9),
    'muon': lambda: optax.contrib.muon(1e-2),
}


@functools.cache
def _plain(name, steps=3):
  """``(params, state)`` of the plain optimizer ``name`` after ``steps``
  updates (made once per test process: several tests start from it)."""
  return _trained(PLAIN[name](), _params(), steps)


def _optimizers(bits):
  """``{name: optax_q tx}``, the drop-ins of `PLAIN`, at 8 or 4 bits
  (rounding stochastically in their steps; from_optax rounds to nearest)."""
  signed = {8: 'int8', 4: 'int4'}[bits]
  second = {8: 'int8_dynamic', 4: 'fp4_e2m1'}[bits]
  kw = dict(min_size=0, block_size=64)
  return {
      'adam': optax_q.adam(1e-2, mu_format=signed, nu_format=second, **kw),
      'adamw': optax_q.adamw(1e-2, mu_format=signed, nu_format=second, **kw),
      'lion': optax_q.lion(1e-3, mu_format=signed, **kw),
      'sgd': optax_q.sgd(1e-2, momentum=0.9, mu_format=signed, **kw),
      'muon': optax_q.muon(1e-2, mu_format=signed, **kw),
  }


def _grid(fmt: optax_q.Format) -> np.ndarray:
  """The sorted values of a (narrow) format's grid."""
  if fmt.table is not None:
    return np.unique(np.asarray(fmt.table, np.float64))
  if fmt.kind == 'int':
    return np.arange(-fmt.max_value, fmt.max_value + 1)
  codes = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes,
                                                      fmt.storage_dtype))
  values = codes.astype(np.float64)
  return np.unique(values[np.isfinite(values)])


def _half_step(fmt: optax_q.Format) -> float:
  """The farthest a point of the scaled range is from the grid, in grid
  units: half the widest gap, or an end of the range the grid misses."""
  grid = _grid(fmt)
  top = qarray_lib.scale_target(fmt)
  bottom = -top if fmt.signed else 0.0
  return max(np.max(np.diff(grid)) / 2, grid[0] - bottom, top - grid[-1])


def _element_scales(q: optax_q.QArray) -> np.ndarray:
  """Each element's block scale."""
  scale = np.asarray(q.scale, np.float64)
  if not q.shape:
    return scale.reshape(())
  full = np.repeat(scale, q.block_size, axis=-1)
  return full[..., :q.shape[-1]]


def _bound(q: optax_q.QArray) -> np.ndarray:
  """Each element's largest nearest-rounding error: half a grid step of its
  block, plus the float32 rounding of ``x / s`` (a few ulps of the range)."""
  slack = qarray_lib.scale_target(q.fmt) * 2.0**-21
  return _element_scales(q) * (_half_step(q.fmt) + slack)


def _assert_within_grid(plain, state):
  """``to_optax(state)`` is ``plain`` to half a grid step per block, and
  exactly ``plain`` at every unquantized leaf."""
  back = optax_q.to_optax(state)
  assert jax.tree.structure(back) == jax.tree.structure(plain)
  # Each plain leaf's QArray (or array), in the plain state's order.
  flat_q = jax.tree.leaves(_stripped_qarrays(state),
                           is_leaf=optax_q.is_qarray)
  flat_plain = jax.tree.leaves(plain)
  flat_back = jax.tree.leaves(back)
  assert len(flat_q) == len(flat_plain) == len(flat_back)
  quantized = 0
  for q, x, y in zip(flat_q, flat_plain, flat_back):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if not optax_q.is_qarray(q):
      np.testing.assert_array_equal(y, x)
      continue
    quantized += 1
    bound = _bound(q)
    err = np.abs(y - x)
    assert np.all(err <= bound), (q.fmt.name, float(np.max(err - bound)))
  assert quantized >= 2


def _stripped_qarrays(state):
  """``state`` stripped of wrappers as ``to_optax`` does, with the QArrays
  kept (so that each plain leaf's codec can be read)."""
  # pylint: disable-next=protected-access
  return migration._strip(state, lambda q: q)


class RoundTripTest(parameterized.TestCase):

  def _round_trip(self, name, bits):
    tx = _optimizers(bits)[name]
    params, plain = _plain(name)
    state = optax_q.from_optax(plain, tx, params)
    self.assertEqual(jax.tree.structure(state),
                     jax.tree.structure(jax.eval_shape(tx.init, params)))
    _assert_within_grid(plain, state)

  @parameterized.parameters(('adamw', 8), ('muon', 4))
  def test_within_half_a_grid_step(self, name, bits):
    self._round_trip(name, bits)

  @parameterized.product(name=('adam', 'adamw', 'lion', 'sgd', 'muon'),
                         bits=(8, 4))
  @pytest.mark.slow
  def test_within_half_a_grid_step_all(self, name, bits):
    self._round_trip(name, bits)

  def test_fp32_formats_are_exact(self):
    params, plain = _plain('adamw')
    tx = optax_q.adamw(1e-2, mu_format='fp32', nu_format='fp32', min_size=0)
    state = optax_q.from_optax(plain, tx, params)
    self.assertEmpty(optax_q.quantized_leaves(state))
    helpers.assert_bits_equal(optax_q.to_optax(state), plain)

  def test_bfloat16_moments_are_cast(self):
    # optax.adam(mu_dtype='bfloat16') keeps mu in bfloat16; the quantized
    # leaf's logical dtype is the params' (float32).
    params, plain = _plain('adam')
    mu = jax.tree.map(lambda x: x.astype(jnp.bfloat16), plain[0].mu)
    plain = (plain[0]._replace(mu=mu), *plain[1:])
    state = optax_q.from_optax(plain, _optimizers(8)['adam'], params)
    self.assertEqual(state[0].inner_state.mu['w'].dtype, 'float32')
    _assert_within_grid(plain, state)

  def test_counts_carry_over(self):
    params, plain = _plain('adamw')
    state = optax_q.from_optax(plain, optax_q.adamw(1e-2, min_size=0), params)
    self.assertEqual(int(state[0].count), 3)  # The wrapper's own count.
    self.assertEqual(int(state[0].inner_state.count), 3)
    # optax.trace has no count: the wrapper starts at 0, or as told.
    plain = optax.sgd(1e-2, momentum=0.9).init(params)
    tx = optax_q.sgd(1e-2, momentum=0.9, min_size=0)
    self.assertEqual(int(optax_q.from_optax(plain, tx, params)[0].count), 0)
    self.assertEqual(
        int(optax_q.from_optax(plain, tx, params, count=7)[0].count), 7)

  def test_own_decoded_state_gives_the_codes_back(self):
    self._codes_back('fp4_e2m1')

  @parameterized.parameters('int8', 'int4', 'fp8_e4m3')
  @pytest.mark.slow
  def test_own_decoded_state_gives_the_codes_back_all(self, fmt):
    self._codes_back(fmt)

  def _codes_back(self, fmt):
    # A state of our own with nearest rounding (from_optax rounds to
    # nearest), decoded and encoded again: the same codes bit for bit, but
    # for the sign of zero (fp4_e2m1 has two zeros; -0 comes back as +0);
    # scales differ by at most one float32 step (max * (1/g_max) need not
    # give the scale back exactly).
    tx = optax.chain(
        optax_q.quantize_state(optax.scale_by_adam(), fmt, min_size=0,
                               rounding='nearest', block_size=64),
        optax.scale(-1e-2))
    params, plain = _plain('adam')
    state = optax_q.from_optax(plain, tx, params)
    decoded = optax_q.to_optax(state)
    again = optax_q.from_optax(decoded, tx, params)
    pairs = zip(jax.tree.leaves(_stripped_qarrays(state),
                                is_leaf=optax_q.is_qarray),
                jax.tree.leaves(_stripped_qarrays(again),
                                is_leaf=optax_q.is_qarray),
                jax.tree.leaves(decoded),
                jax.tree.leaves(optax_q.to_optax(again)))
    checked = 0
    for q, r, x, y in pairs:
      if not optax_q.is_qarray(q):
        continue
      checked += 1
      x, y = np.asarray(x), np.asarray(y)
      np.testing.assert_allclose(y, x, rtol=2**-22, atol=0)
      same = np.ones(q.codes.shape, bool)
      if q.fmt.packed:  # Bytes holding no zero (two elements each).
        same = (x[..., 0::2] != 0) & (x[..., 1::2] != 0)
      self.assertGreater(same.mean(), 0.5)
      np.testing.assert_array_equal(helpers.bits(r.codes)[same],
                                    helpers.bits(q.codes)[same])
      np.testing.assert_allclose(r.scale, q.scale, rtol=2**-23)
    self.assertEqual(checked, 4)
    self.assertEqual(int(again[0].count), int(state[0].count))

  def test_to_optax_under_jit_and_abstract(self):
    tx = optax_q.adamw(1e-2, min_size=0, mu_format='int4')
    params, plain = _plain('adamw')
    state = optax_q.from_optax(plain, tx, params)
    helpers.assert_bits_equal(jax.jit(optax_q.to_optax)(state),
                              optax_q.to_optax(state))
    abstract = optax_q.to_optax(jax.eval_shape(tx.init, params))
    self.assertEqual(abstract,
                     jax.eval_shape(optax.adamw(1e-2).init, params))

  def test_plain_state_passes_to_optax_unchanged(self):
    plain = optax.adamw(1e-2).init(_params())
    helpers.assert_bits_equal(optax_q.to_optax(plain), plain)


class ResumeTest(absltest.TestCase):

  def test_plain_orbax_checkpoint_resumes_under_optax_q(self):
    # Optax's AdamW for 6 steps, saved by Orbax, restored into the plain
    # optimizer's abstract state, continued for 4 steps under optax_q at 8
    # bits: the loss follows what Optax itself would have given.
    x = jax.random.normal(jax.random.key(1), (64, 32))
    y = jnp.sin(x @ jax.random.normal(jax.random.key(2), (32, 8)))
    loss = lambda p: jnp.mean((jnp.tanh(x @ p['w1']) @ p['w2'] - y) ** 2)
    params = {'w1': jax.random.normal(jax.random.key(3), (32, 128)) * 0.2,
              'w2': jax.random.normal(jax.random.key(4), (128, 8)) * 0.1}

    def stepper(tx):
      @jax.jit
      def step(params, state):
        value, grads = jax.value_and_grad(loss)(params)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value
      return step

    def train(step, params, state, steps):
      values = []
      for _ in range(steps):
        params, state, value = step(params, state)
        values.append(float(value))
      return params, state, values

    plain_tx = optax.adamw(3e-3)
    plain_step = stepper(plain_tx)
    params, plain, _ = train(plain_step, params, plain_tx.init(params), 6)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'ckpt')
      helpers.save(path, {'params': params, 'opt_state': plain})
      abstract = jax.eval_shape(
          lambda p: {'params': p, 'opt_state': plain_tx.init(p)}, params)
      restored = helpers.restore(path, abstract)
    helpers.assert_bits_equal(restored['opt_state'], plain)
    tx = optax_q.adamw(3e-3, mu_format='int8', nu_format='int8_dynamic',
                       min_size=0)
    state = optax_q.from_optax(restored['opt_state'], tx, restored['params'])
    _, _, expected = train(plain_step, params, plain, 4)
    _, state, got = train(stepper(tx), restored['params'], state, 4)
    np.testing.assert_allclose(got, expected, rtol=2e-3)
    self.assertLess(got[-1], got[0])
    self.assertEqual(int(state[0].inner_state.count), 10)

  def test_optax_q_state_through_orbax(self):
    params, plain = _plain('lion')
    tx = optax_q.lion(1e-3, mu_format='int4', min_size=0)
    state = optax_q.from_optax(plain, tx, params)
    with tempfile.TemporaryDirectory() as tmp:
      path = os.path.join(tmp, 'ckpt')
      helpers.save(path, state)
      restored = helpers.restore(path, jax.eval_shape(tx.init, params))
    helpers.assert_bits_equal(restored, state)
    helpers.assert_bits_equal(optax_q.to_optax(restored),
                              optax_q.to_optax(state))


class WrappersTest(absltest.TestCase):

  def test_switch_precision_through_the_plain_state(self):
    params, plain = _plain('adamw')
    state8 = optax_q.from_optax(plain, optax_q.adamw(1e-2, min_size=0),
                                params)
    tx4 = optax_q.adamw(1e-2, mu_format='int4', nu_format='fp4_e2m1',
                        min_size=0)
    state4 = optax_q.from_optax(optax_q.to_optax(state8), tx4, params)
    self.assertEqual({q.fmt.name for q in
                      optax_q.quantized_leaves(state4).values()},
                     {'int4', 'fp4_e2m2u'})  # nu: the unsigned variant.
    _assert_within_grid(optax_q.to_optax(state8), state4)
    self.assertEqual(int(state4[0].count), 3)

  def test_adaptive_bits_start_at_their_initial_layout(self):
    params, plain = _plain('adam')
    tx = optax.chain(
        optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0,
                              block_size=64),
        optax.scale_by_learning_rate(1e-2))
    state = optax_q.from_optax(plain, tx, params)
    fresh = tx.init(params)
    self.assertEqual(optax_q.bit_layout(state), optax_q.bit_layout(fresh))
    self.assertEqual(int(state[0].count), 3)
    self.assertEqual(int(state[0].inner_state.count), 3)
    helpers.assert_bits_equal(state[0].stats, fresh[0].stats)
    _assert_within_grid(plain, state)

  def test_masked_and_injected(self):
    params = _params()
    mask = {'w': True, 'b': False, 's': False}
    pairs = [
        (optax.masked(optax.adam(1e-2), mask),
         optax.masked(optax_q.adam(1e-2, min_size=0), mask)),
        (optax.inject_hyperparams(optax.adamw)(learning_rate=1e-2),
         optax.inject_hyperparams(optax_q.adamw, static_args='min_size')(
            learning_rate=1e-2, min_size=0)),
    ]
    for plain_tx, tx in pairs:
      params, plain = _trained(plain_tx, params)
      state = optax_q.from_optax(plain, tx, params)
      _assert_within_grid(plain, state)


class NnxTest(absltest.TestCase):

  @pytest.mark.slow  # About 6 s, most of it compiling two NNX steps.
  def test_nnx_optimizer_moves_to_optax_q_and_back(self):
    try:
      # pylint: disable=g-import-not-at-top
      from flax import nnx
      from flax.nnx.training import optimizer as nnx_optimizer
    except ImportError:
      self.skipTest('needs flax')
    model = nnx.Linear(64, 128, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (32, 64))
    step = nnx.jit(lambda m, opt: opt.update(
        m, nnx.grad(lambda m: jnp.mean(m(x) ** 2))(m)))
    plain_opt = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    step(model, plain_opt)
    tx = optax_q.adamw(1e-2, min_size=0)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    plain = nnx.as_pure(plain_opt.opt_state)
    state = optax_q.from_optax(plain, tx,
                               nnx.as_pure(nnx.state(model, nnx.Param)))
    _assert_within_grid(plain, state)
    opt.opt_state = nnx.data(nnx_optimizer.to_opt_state(state))
    step(model, opt)
    self.assertEqual(int(nnx.as_pure(opt.opt_state)[0].count), 2)
    with self.assertRaisesRegex(ValueError, r'nnx.as_pure\(opt.opt_state\)'):
      optax_q.to_optax(opt.opt_state)
    with self.assertRaisesRegex(ValueError, r'OptArray.*nnx.as_pure'):
      optax_q.from_optax(plain_opt.opt_state, tx,
                         nnx.as_pure(nnx.state(model, nnx.Param)))
    back = optax_q.to_optax(nnx.as_pure(opt.opt_state))
    self.assertEqual(jax.tree.structure(back), jax.tree.structure(plain))


class ErrorsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.params = _params()
    self.tx = optax_q.adamw(1e-2, min_size=0)
    self.plain = optax.adamw(1e-2).init(self.params)

  def test_not_a_transform(self):
    with self.assertRaisesRegex(ValueError, 'tx must be an Optax'):
      optax_q.from_optax(self.plain, optax_q.adamw, self.params)

  def test_another_optimizer(self):
    lion = optax.lion(1e-2).init(self.params)
    with self.assertRaisesRegex(
        ValueError, r'at 0 the state of tx has a ScaleByAdamState with '
        r"\['count', 'mu', 'nu'\], optax_state has a ScaleByLionState"):
      optax_q.from_optax(lion, self.tx, self.params)

  def test_other_params(self):
    other = dict(self.params, w=jnp.zeros((16, 100)))
    with self.assertRaisesRegex(
        ValueError, r'at 0/mu/w the state of tx has float32\[16, 200\], '
        r'optax_state has float32\[16, 100\]'):
      optax_q.from_optax(optax.adamw(1e-2).init(other), self.tx, self.params)
    fewer = {'w': self.params['w']}
    with self.assertRaisesRegex(ValueError, r"\['b', 's', 'w'\].*\['w'\]"):
      optax_q.from_optax(optax.adamw(1e-2).init(fewer), self.tx, self.params)

  def test_integer_where_float(self):
    bad = jax.tree.map(lambda x: x.astype(jnp.int32), self.plain)
    with self.assertRaisesRegex(ValueError, r'at 0/mu/b .* int32\[24\]'):
      optax_q.from_optax(bad, self.tx, self.params)

  def test_checkpoint_restored_without_a_target(self):
    raw = jax.tree.map(np.asarray, list(self.plain))  # As Orbax gives it.
    with self.assertRaisesRegex(ValueError, 'has a list.*without a target'):
      optax_q.from_optax(raw, self.tx, self.params)

  def test_already_quantized(self):
    state = self.tx.init(self.params)
    with self.assertRaisesRegex(ValueError, r'pass to_optax\(state\)'):
      optax_q.from_optax(state, self.tx, self.params)

  def test_bad_count(self):
    for count in (-1, 1.5, 'ten', 2**31, np.int64(2**40)):
      with self.assertRaisesRegex(ValueError, 'count must be an int'):
        optax_q.from_optax(self.plain, self.tx, self.params, count=count)


class ExtremeValuesTest(absltest.TestCase):

  def test_huge_tiny_and_non_finite_moments(self):
    params = _params()
    plain = optax.adam(1e-2).init(params)
    w = np.array(jax.random.normal(jax.random.key(5), (16, 200)))
    w[0, :64] *= 1e30   # A block of huge values.
    w[1, :64] *= 1e-30  # A block of tiny ones.
    w[2, 3] = np.inf
    w[3, 5] = np.nan
    mu = dict(plain[0].mu, w=jnp.asarray(w, jnp.float32))
    plain = (plain[0]._replace(mu=mu), plain[1])
    tx = optax_q.adam(1e-2, mu_format='int8', min_size=0, block_size=64)
    state = optax_q.from_optax(plain, tx, params)
    q = state[0].inner_state.mu['w']
    back = np.asarray(optax_q.to_optax(state)[0].mu['w'], np.float64)
    w = w.astype(np.float64)
    finite = np.ones(w.shape, bool)
    finite[2:4, :64] = False  # The blocks holding the inf and the NaN.
    bound = _bound(q)
    err = np.abs(back[finite] - w[finite])
    self.assertTrue(np.all(err <= bound[finite]))
    self.assertGreater(float(np.min(bound[0, :64])), 1e26)
    self.assertLess(float(np.max(bound[1, :64])), 1e-28)
    self.assertTrue(np.isposinf(back[2, 3]))
    self.assertTrue(np.isnan(back[3, 5]))


if __name__ == '__main__':
  absltest.main()
