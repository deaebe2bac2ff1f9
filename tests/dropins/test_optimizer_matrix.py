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
"""One matrix every optimizer and wrapper of the library goes through.

As Optax's ``contrib/_common_test.py``: each case below is checked for parity
with Optax at fp32, dtype preservation, ``optax.MultiSteps``,
``optax.inject_hyperparams`` without ``static_args``, state stability under
``lax.cond``, abstract init, sharding on 8 simulated devices and an Orbax
round trip. A new optimizer or wrapper is added to ``CASES``. Donation of
the init state (two steps in a row) and an injected learning rate are
checked for ``CASES`` and every other drop-in, wrapper and documented
composition (``COMPOSITIONS``).
"""

import helpers  # noqa: E402

import dataclasses  # noqa: E402
import functools  # noqa: E402
import tempfile  # noqa: E402
from typing import Any, Callable  # noqa: E402
import warnings  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import optax  # noqa: E402
import optax_q  # noqa: E402
import pytest  # noqa: E402

LR = 1e-2
# 'w' (4096 elements) is quantized, 'b' (128) stays as the inner transform
# made it.
MIN_SIZE = 1024
STEPS = 3


@dataclasses.dataclass(frozen=True)
class Case:
  """One optimizer or wrapper of the library.

  Attributes:
    name: The case's name.
    make: ``make(fp32: bool)``: the transform, with every state format
      ``'fp32'`` or with its quantized defaults.
    reference: The Optax transform ``make(True)`` must equal bit for bit.
    factory: For ``inject_hyperparams``: ``(factory, kwargs, static_args)``
      whose ``learning_rate`` is injected (with the default ``min_size``,
      which ``'w'`` reaches); None where there is none. Only arguments that
      set the state's structure are static, as Optax lists ``rank``.
  """

  name: str
  make: Callable[[bool], optax.GradientTransformation]
  reference: Callable[[], optax.GradientTransformation]
  factory: tuple[Callable[..., Any], dict[str, Any]] | None = None


def _moments(fp32: bool, *names: str) -> dict[str, str]:
  return {n: 'fp32' if fp32 else 'int8_dynamic' for n in names}


def _drop_in(name, fn, reference, fields, **kw):
  static = ('reset_every',) if 'reset_every' in kw else ()
  return Case(
      name,
      lambda fp32: fn(LR, **_moments(fp32, *fields), min_size=MIN_SIZE, **kw),
      reference, (fn, kw, static))


def _adam_state(fp32: bool) -> dict[str, str]:
  fmt = 'fp32' if fp32 else 'fp8_e4m3'
  return {'mu': fmt, 'nu': fmt}


def _codecs(name, mu, nu, **extra):
  """AdamW with the low-bit codecs (3- and 4-bit packed codes)."""
  kw = dict(mu_format=mu, nu_format=nu, **{'rounding': 'stochastic', **extra})
  return Case(
      name, lambda fp32: optax_q.adamw(
          LR, **(_moments(fp32, 'mu_format', 'nu_format') if fp32 else kw),
          min_size=MIN_SIZE),
      # Rounding in preconditioner space puts eps in the format: static.
      lambda: optax.adamw(LR), (optax_q.adamw, kw, (
          ('eps',) if kw['rounding'] == 'preconditioner' else ())))


CASES = (
    # ue4m0 rounded in Adam's preconditioner space (ue4m0@rsqrt+1e-08).
    _codecs('adamw_nf4_ue4m0_preconditioner', 'nf4', 'ue4m0',
            rounding='preconditioner'),
    _codecs('adamw_nf3_ue3m0', 'nf3', 'ue3m0'),
    _codecs('adamw_pow2_scales', 'nf4', 'ue4m0', scale_mode='block_pow2'),
    _codecs('adamw_dre_rank1', 'fp8_e4m3_dre', 'ue4m0',
            scale_mode={'nu': 'rank1'}),
    _drop_in('adam', optax_q.adam, lambda: optax.adam(LR),
             ('mu_format', 'nu_format')),
    _drop_in('adamw', optax_q.adamw, lambda: optax.adamw(LR),
             ('mu_format', 'nu_format')),
    _drop_in('lion', optax_q.lion, lambda: optax.lion(LR), ('mu_format',)),
    _drop_in('sgd_momentum', optax_q.sgd,
             lambda: optax.sgd(LR, momentum=0.9), ('mu_format',),
             momentum=0.9),
    _drop_in('sgd', optax_q.sgd, lambda: optax.sgd(LR), ('mu_format',)),
    # A period longer than the run: Adam bit for bit.
    _drop_in('adamw_reset_periodic', optax_q.adamw, lambda: optax.adamw(LR),
             ('mu_format', 'nu_format'), reset_every=1000),
    _drop_in('adamw_reset_adaptive', optax_q.adamw, lambda: optax.adamw(LR),
             ('mu_format', 'nu_format'), reset_every='adaptive'),
    Case('quantize_state', lambda fp32: optax_q.quantize_state(
        optax.scale_by_adam(), _adam_state(fp32), min_size=MIN_SIZE),
         optax.scale_by_adam),
    Case('quantize_state_elementwise', lambda fp32: optax_q.quantize_state(
        optax.scale_by_adam(), _adam_state(fp32), min_size=MIN_SIZE,
        elementwise=True, tile_size=1024), optax.scale_by_adam),
    Case('reset_state', lambda fp32: optax_q.reset_state(
        optax_q.quantize_state(
            optax_q.scale_by_adam_local_age(), _adam_state(fp32),
            min_size=MIN_SIZE, elementwise=True), 1000,
        groups=(('mu', 'nu'),)), optax.scale_by_adam),
    Case('scale_by_adam_local_age',
         lambda fp32: optax_q.scale_by_adam_local_age(), optax.scale_by_adam),
)
NAMED = [(c.name, c) for c in CASES]
# Checks of the wrapping, not of each layout: every other case by default.
HALF = NAMED[::2]
# Sharded runs on 8 devices: the default suite leaves out the cases whose
# sharded state another case already covers: Adam (AdamW's machinery), SGD
# without momentum (no state), AdamW with a reset period longer than the run
# (AdamW's state and steps) and scale_by_adam_local_age (nothing quantized;
# reset_state wraps it, quantized). They run with -m slow.
_SHARDED_SLOW = ('adam', 'sgd', 'adamw_reset_periodic',
                 'scale_by_adam_local_age')
SHARDED = [(n, c) for n, c in NAMED if n not in _SHARDED_SLOW]
SHARDED_SLOW = [(n, c) for n, c in NAMED if n in _SHARDED_SLOW]


def _params(dtype=jnp.float32):
  key = jax.random.key(0)
  return {'w': (jax.random.normal(key, (16, 256)) * 0.1).astype(dtype),
          'b': jnp.linspace(-0.1, 0.1, 128, dtype=dtype)}


def _grads(step, params):
  return jax.tree.map(lambda g, p: g.astype(p.dtype),
                      helpers.grads(step, params), params)


_TRANSFORMS: dict[tuple[str, bool], optax.GradientTransformation] = {}


def _make(case: Case, fp32: bool) -> optax.GradientTransformation:
  """The case's transform, one object per (case, fp32) for the whole run:
  `_step` compiles one step per transform, so the tests of a case share
  their compiled steps instead of each compiling its own."""
  key = (case.name, fp32)
  if key not in _TRANSFORMS:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # Resets on fp32 moments warn.
      _TRANSFORMS[key] = case.make(fp32)
  return _TRANSFORMS[key]


@functools.cache
def _step(tx):
  """One compiled step per transform, however many runs it makes."""
  return jax.jit(lambda p, s, g: (lambda u, s: (
      optax.apply_updates(p, u), s, u))(*tx.update(g, s, p)))


@functools.cache
def _init(tx):
  return jax.jit(tx.init)


_REFERENCES: dict[str, optax.GradientTransformation] = {}


def _reference(case: Case) -> optax.GradientTransformation:
  """The case's Optax reference, one object per case (as `_make`)."""
  if case.name not in _REFERENCES:
    _REFERENCES[case.name] = case.reference()
  return _REFERENCES[case.name]


def _run(tx, params, steps=STEPS, start=0, state=None):
  state = _init(tx)(params) if state is None else state
  step = _step(tx)
  updates = []
  for i in range(start, start + steps):
    params, state, u = step(params, state, _grads(i, params))
    updates.append(u)
  return params, state, updates


class MatrixTest(parameterized.TestCase):

  @parameterized.named_parameters(NAMED)
  def test_fp32_parity_with_optax(self, case):
    params = _params()
    got = _run(_make(case, True), params)
    want = _run(_reference(case), params)
    helpers.assert_trees_equal(got[0], want[0])
    helpers.assert_trees_equal(got[2], want[2])

  @parameterized.named_parameters(NAMED)
  def test_dtypes_preserved(self, case):
    params = _params(jnp.bfloat16)
    new_params, _, updates = _run(_make(case, False), params, steps=2)
    for u, p in zip(jax.tree.leaves(updates[-1]), jax.tree.leaves(new_params)):
      self.assertEqual(u.dtype, jnp.bfloat16)
      self.assertEqual(p.dtype, jnp.bfloat16)

  @parameterized.named_parameters(HALF)
  def test_multisteps(self, case):
    tx = optax.MultiSteps(_make(case, False), every_k_schedule=2)
    params = _params()
    state0 = jax.jit(tx.init)(params)
    _, state, updates = _run(tx, params, steps=4, state=state0)
    helpers.assert_same_types(state, state0)
    self.assertTrue(all(bool(jnp.all(u == 0))
                        for u in jax.tree.leaves(updates[0])))
    self.assertTrue(any(bool(jnp.any(u != 0))
                        for u in jax.tree.leaves(updates[1])))

  @parameterized.named_parameters(NAMED)
  def test_inject_hyperparams_layout_static_by_default(self, case):
    if case.factory is None:
      self.skipTest('a wrapper of a transform: no learning rate to inject')
    fn, kw, static = case.factory
    schedule = optax.linear_schedule(LR, 0.0, 10)
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')
      tx = optax.inject_hyperparams(
          fn, static_args=static, hyperparam_dtype=jnp.float32)(
              learning_rate=schedule, **kw)
      plain = fn(schedule, **kw)
    params = _params()
    _, state, updates = _run(tx, params)
    _, _, want = _run(plain, params)
    self.assertEqual(float(state.hyperparams['learning_rate']),
                     float(schedule(STEPS - 1)))
    for got_u, want_u in zip(updates, want):
      for a, b in zip(jax.tree.leaves(got_u), jax.tree.leaves(want_u)):
        # Injected decays are float32 arrays, not Python floats: the same
        # arithmetic to float32 rounding (a code may round the other way).
        self.assertLess(float(jnp.mean(jnp.abs(a - b) > 1e-3 * LR)), 1e-3)

  @parameterized.named_parameters(HALF)
  def test_state_stable_under_cond(self, case):
    tx = _make(case, False)
    params = _params()
    state = tx.init(params)

    @jax.jit
    def maybe_step(pred, state):
      return jax.lax.cond(
          pred, lambda s: tx.update(_grads(0, params), s, params)[1],
          lambda s: s, state)

    for pred in (True, False):
      helpers.assert_same_types(maybe_step(pred, state), state)

  @parameterized.named_parameters(HALF)
  def test_abstract_init(self, case):
    tx = _make(case, False)
    params = _params()
    abstract = jax.eval_shape(
        tx.init, jax.tree.map(
            lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params))
    helpers.assert_same_types(abstract, tx.init(params))
    self.assertEqual(optax_q.state_nbytes(abstract),
                     optax_q.state_nbytes(tx.init(params)))

  @parameterized.named_parameters(HALF)
  def test_orbax_round_trip_resumes_bit_identically(self, case):
    self._check_orbax(case)

  @parameterized.named_parameters(NAMED[1::2])
  @pytest.mark.slow
  def test_orbax_round_trip_other_half(self, case):
    self._check_orbax(case)

  def _check_orbax(self, case):
    tx = _make(case, False)
    params = _params()
    p2, s2, _ = _run(tx, params, steps=2)
    with tempfile.TemporaryDirectory() as tmp:
      helpers.save(f'{tmp}/ckpt', {'params': p2, 'state': s2})
      restored = helpers.restore(f'{tmp}/ckpt', {
          'params': p2, 'state': jax.eval_shape(tx.init, params)})
    resumed = _run(tx, restored['params'], steps=2, start=2,
                   state=restored['state'])
    straight = _run(tx, params, steps=4)
    helpers.assert_bits_equal(resumed[:2], straight[:2])


class ShardedMatrixTest(parameterized.TestCase):
  """The matrix on 8 devices: sharded runs equal unsharded ones."""

  @parameterized.named_parameters(SHARDED)
  def test_sharded_matches_unsharded(self, case):
    self._check_sharded(case)

  @parameterized.named_parameters(SHARDED_SLOW)
  @pytest.mark.slow
  def test_sharded_matches_unsharded_slow(self, case):
    self._check_sharded(case)

  def _check_sharded(self, case):
    tx = _make(case, False)
    params = _params()
    mesh = jax.make_mesh((8,), ('data',))
    param_shardings = {'w': NamedSharding(mesh, P('data', None)),
                       'b': NamedSharding(mesh, P('data'))}
    shardings = optax_q.state_shardings(
        jax.eval_shape(tx.init, params), param_shardings)
    step = jax.jit(
        helpers.step_fn(tx),
        in_shardings=(param_shardings, shardings, param_shardings),
        out_shardings=(param_shardings, shardings))
    p = jax.device_put(params, param_shardings)
    s = jax.jit(tx.init, out_shardings=shardings)(p)
    want_p, want_s, _ = _run(tx, params)
    for i in range(STEPS):
      p, s = step(p, s, jax.device_put(_grads(i, params), param_shardings))
    helpers.assert_bits_equal(p, want_p)
    helpers.assert_bits_equal(s, want_s)


# Training-loop conventions: donating the optimizer state, and a learning
# rate injected without static_args. Beyond CASES, every drop-in and wrapper
# not in it and the documented compositions.


def _quantized_params():
  """``_params()`` with 'w' stored in fp8, for the master-free wrapper."""
  return optax_q.quantize_params(_params(), 'fp8_e4m3',
                                 filter=lambda path, x: x.ndim == 2)


def _eco(inner, **kw):
  return optax_q.eco(optax.inject_hyperparams(inner[0])(LR, **inner[1]),
                     'fp8_e4m3', **kw)


@dataclasses.dataclass(frozen=True)
class Composition:
  """A transform (built by ``make()``) and the parameters it trains."""

  name: str
  make: Callable[[], optax.GradientTransformation]
  quantized_params: bool = False  # QArray weights, optax_q.apply_updates.


COMPOSITIONS = (
    Composition('muon', lambda: optax_q.muon(LR, min_size=MIN_SIZE)),
    Composition('muon_int4', lambda: optax_q.muon(
        LR, mu_format='int4', block_size=128, min_size=MIN_SIZE)),
    Composition('shampoo', lambda: optax_q.shampoo(LR, min_size=MIN_SIZE)),
    Composition('soap', lambda: optax_q.soap(
        LR, min_size=MIN_SIZE, reset_every=10)),
    Composition('scale_by_shampoo', optax_q.scale_by_shampoo),
    Composition('scale_by_soap', optax_q.scale_by_soap),
    Composition('adamw_adaptive_bits', lambda: optax.chain(
        optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                              track_stalls=False, min_size=MIN_SIZE),
        optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(LR))),
    Composition('adaptive_bits_sgd_momentum', lambda: optax_q.adaptive_bits(
        optax.sgd(LR, momentum=0.9), {'trace': ('int8', 'fp8_e4m3')},
        min_size=MIN_SIZE)),
    Composition('adaptive_bits_resets', lambda: optax_q.adaptive_bits(
        optax_q.reset_state(optax_q.scale_by_adam_local_age(), 10,
                            groups=(('mu', 'nu'),)), min_size=MIN_SIZE)),
    Composition('adam_with_resets_adaptive', lambda: optax.chain(
        optax_q.adam_with_resets('adaptive', min_size=MIN_SIZE),
        optax.scale(-LR))),
    Composition('quantized_training', lambda: optax_q.quantized_training(
        {'g': 'e5m2', 'm': 'e4m3', 'v': 'e5m2'}).optimizer(optax.adam(LR))),
    Composition('quantize_gradients', lambda: optax.chain(
        optax_q.quantize_gradients('e4m3'),
        optax_q.adamw(LR, min_size=MIN_SIZE))),
    # As the ECO page: clipping, then eco with low-bit moments.
    Composition('eco_low_bit_moments', lambda: optax.chain(
        optax.clip_by_global_norm(1.0),
        optax_q.quantize_state(_eco((optax.adamw, {})),
                               {'mu': 'int8_dynamic', 'nu': 'ue4m0'},
                               min_size=0)), quantized_params=True),
    Composition('eco_exact_sgd', lambda: _eco(
        (optax.sgd, {'momentum': 0.9}), variant='exact'),
                quantized_params=True),
)
LOOP = NAMED + [(c.name, c) for c in COMPOSITIONS]
# The default suite donates the state of every other case of CASES (HALF:
# their state machinery is shared) and of the compositions but for those
# whose state another one already covers: 4-bit Muon (Muon's), Shampoo and
# the float32 factor transforms (SOAP's). They run with -m slow.
_LOOP_SLOW = {n for n, _ in NAMED[1::2]} | {
    'muon_int4', 'shampoo', 'scale_by_shampoo', 'scale_by_soap'}
LOOP_DEFAULT = [(n, c) for n, c in LOOP if n not in _LOOP_SLOW]
LOOP_SLOW = [(n, c) for n, c in LOOP if n in _LOOP_SLOW]


class LoopConventionsTest(parameterized.TestCase):
  """Donation of the state and injected learning rates, for every case."""

  @parameterized.named_parameters(LOOP_DEFAULT)
  def test_init_state_survives_donation(self, case):
    self._check_donation(case)

  @parameterized.named_parameters(LOOP_SLOW)
  @pytest.mark.slow
  def test_init_state_survives_donation_slow(self, case):
    self._check_donation(case)

  def _check_donation(self, case):
    # jax.jit(update, donate_argnums=...) on the fresh init state, as Flax
    # and large-model loops do, two steps in a row.
    quantized = getattr(case, 'quantized_params', False)
    params = _quantized_params() if quantized else _params()
    apply = optax_q.apply_updates if quantized else optax.apply_updates
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # Resets on fp32 moments warn.
      tx = (case.make() if isinstance(case, Composition)
            else _make(case, False))
    state = tx.init(params)
    arrays = [x for x in jax.tree.leaves(state) if isinstance(x, jax.Array)]
    # One array per leaf, none of them a parameter: donating the state must
    # free each buffer once and leave the parameters alone.
    self.assertLen({id(x) for x in arrays}, len(arrays))
    self.assertEmpty({id(x) for x in arrays}
                     & {id(x) for x in jax.tree.leaves(params)})

    @functools.partial(jax.jit, donate_argnums=1)
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return apply(params, updates), state

    with warnings.catch_warnings():
      # Buffers XLA can't reuse in place (scalars, other dtypes) warn.
      warnings.filterwarnings('ignore', 'Some donated buffers were not usable')
      for i in range(2):
        new_params, state = step(params, state, _grads(i, _params()))
        params = new_params
    # Donated, but for leaves the step never reads (stall telemetry it
    # overwrites), which jit leaves alone.
    self.assertTrue(not arrays or any(x.is_deleted() for x in arrays))
    self.assertEqual(jax.tree.structure(state),
                     jax.tree.structure(jax.eval_shape(tx.init, params)))
    for x in jax.tree.leaves(optax_q.dequantize_params(params)):
      self.assertTrue(bool(jnp.all(jnp.isfinite(x))))

  def test_inject_learning_rate_without_static_args(self):
    self._check_inject(optax_q.muon)

  @parameterized.named_parameters(
      ('shampoo', optax_q.shampoo), ('soap', optax_q.soap))
  @pytest.mark.slow
  def test_inject_learning_rate_without_static_args_slow(self, fn):
    self._check_inject(fn)

  def _check_inject(self, fn):
    # The drop-ins outside CASES (test_inject_hyperparams_layout_static_by_
    # default covers those in it). Only the learning rate, as a schedule:
    # every other argument keeps its default (numbers among them become
    # injected arrays; Muon's ns_steps an integer one).
    schedule = optax.linear_schedule(LR, 0.0, 10)
    params = _params()
    tx = optax.inject_hyperparams(fn)(learning_rate=schedule)
    _, state, updates = _run(tx, params)
    _, _, want = _run(fn(schedule), params)
    self.assertEqual(float(state.hyperparams['learning_rate']),
                     float(schedule(STEPS - 1)))
    self.assertNotEmpty(optax_q.quantized_leaves(state))
    for step, (got_u, want_u) in enumerate(zip(updates, want)):
      for a, b in zip(jax.tree.leaves(got_u), jax.tree.leaves(want_u)):
        # Injected numbers are float32 arrays, not Python floats: the same
        # arithmetic to float32 rounding at the first step. Later, a
        # stochastic rounding may go the other way on a code, and an
        # orthogonalisation or an eigenbasis (of a degenerate factor: SOAP's
        # rank-1 statistics after one step) spreads that over the matrix:
        # the updates keep their size.
        if step == 0:
          self.assertLessEqual(float(jnp.max(jnp.abs(a - b))),
                               1e-4 * float(jnp.max(jnp.abs(b))))
        self.assertAlmostEqual(float(jnp.linalg.norm(a)),
                               float(jnp.linalg.norm(b)),
                               delta=1e-2 * float(jnp.linalg.norm(b)))



if __name__ == '__main__':
  absltest.main()
