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
"""Dynamic bit-widths: statistics, decisions, re-layout, checkpoints, meshes.

The mesh tests run on the 8 simulated devices every test process has
(``conftest.py``); the two-process test runs two ``jax.distributed`` workers
of ``adaptive_worker.py`` on localhost.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402
from collections.abc import Mapping  # noqa: E402
import functools  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402
from optax_q._src.adaptive import adaptive  # noqa: E402

import adaptive_worker  # noqa: E402

ADAM = optax.scale_by_adam()


def _tx(**kwargs):
  kwargs.setdefault('period', 2)
  kwargs.setdefault('patience', 2)
  kwargs.setdefault('min_size', 0)
  kwargs.setdefault('block_size', 32)
  return optax.chain(optax_q.adaptive_bits(ADAM, **kwargs), optax.scale(-1e-2))


@functools.cache
def _jitted_step(tx):
  """One jitted step per transform (compiled once per layout it meets)."""
  return jax.jit(adaptive_worker.step_fn(tx))


def _train(tx, params, steps, *, start=0, state=None, relayout=True,
           grads=adaptive_worker.grads):
  """``steps`` jitted steps with a relayout after each; returns the run."""
  step = _jitted_step(tx)
  state = tx.init(params) if state is None else state
  layouts = []
  for i in range(start, start + steps):
    params, state = step(params, state, grads(i))
    if relayout:
      state = optax_q.relayout(state, step=i + 1)
      layouts.append(optax_q.bit_layout(state))
  return params, state, layouts, step


@functools.cache
def _annealed_tx():
  """The transform of the checkpoint and mesh tests (one object, so that
  its compiled steps are shared)."""
  return _tx(anneal=1.0, anneal_steps=8)


@functools.cache
def _annealed_run():
  """Its unsharded 12-step run (run once): params, state, layouts."""
  p, s, layouts, _ = _train(_annealed_tx(), adaptive_worker.params(), 12)
  return p, s, layouts


class ArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('unknown_format', dict(candidates={'mu': ('int9',)}), 'candidates'),
      ('empty', dict(candidates={}), 'candidates'),
      ('not_a_dict', dict(candidates=['int8']), 'candidates'),
      ('empty_ladder', dict(candidates={'mu': ()}), r"candidates\['mu'\]"),
      ('bare_string', dict(candidates={'mu': 'int8'}), r"candidates\['mu'\]"),
      ('fp32', dict(candidates={'mu': ('int8', 'fp32')}), 'float32'),
      ('unordered', dict(candidates={'mu': ('int8', 'int4')}),
       'fewest to most stored bits'),
      ('twice', dict(candidates={'mu': ('int8', 'int8')}), 'twice'),
      ('unsigned_mu', dict(candidates={'mu': ('fp4_e2m2u',)}), 'unsigned'),
      ('bad_mode', dict(candidates={'mu': (('int8', 'blocks'),)}),
       'scale mode'),
      ('period_zero', dict(period=0), 'period'),
      ('period_float', dict(period=2.5), 'period'),
      ('patience_zero', dict(patience=0), 'patience'),
      ('margin_one', dict(margin=1.0), 'margin.*settle'),
      ('margin_negative', dict(margin=-0.1), 'margin'),
      ('margin_nan', dict(margin=float('nan')), 'margin'),
      ('threshold_zero', dict(thresholds=(0.0, 1.0)), r'thresholds\[0\]'),
      ('threshold_inf', dict(thresholds=(1.0, float('inf'))),
       r'thresholds\[1\]'),
      ('threshold_len', dict(thresholds=(1.0,)), 'thresholds'),
      ('threshold_key', dict(thresholds={'size': 1.0}), 'thresholds'),
      ('decay_one', dict(decay=1.0), 'decay'),
      ('anneal_negative', dict(anneal=-1.0), 'anneal'),
      ('anneal_steps_zero', dict(anneal_steps=0), 'anneal_steps'),
      ('initial_range', dict(initial=5), r"initial\['mu'\]"),
      ('initial_field', dict(initial={'trace': 0}), 'initial'),
      ('zone_unknown', dict(zone_levels={'hot': {'mu': 0}}), 'zone_levels'),
      ('zone_level_range', dict(zone_levels={'critical': {'mu': 9}}),
       'zone_levels'),
      ('zone_field', dict(zone_levels={'critical': {'trace': 0}}),
       'no candidates'),
      ('factor', dict(factors={'mu': 'size'}), 'factors'),
      ('factors_word', dict(factors='magnitude'), 'factors must be a dict'),
      ('factors_field', dict(factors={'trace': 'magnitude'}),
       'no candidates'),
      ('array_decay', dict(decay=jnp.array(5.0)), 'decay'),
      ('array_margin', dict(margin=jnp.array(5.0)), 'margin'),
      ('array_threshold', dict(thresholds=(jnp.array(-1.0), 1.0)),
       r'thresholds\[0\]'),
      ('array_anneal', dict(anneal=jnp.array(-3.0)), 'anneal'),
      ('scales_shrink', dict(candidates={'mu': (('nf4', 'block'),
                                                ('nf4', 'block_pow2'))}),
       'stored bits'),
      ('sample_every', dict(sample_every=0), 'sample_every'),
      ('rounding', dict(rounding='up'), 'rounding'),
      ('block_size', dict(block_size=3), 'block_size'),
  )
  def test_bad_arguments_raise_at_construction(self, kwargs, match):
    with self.assertRaisesRegex(ValueError, match):
      optax_q.adaptive_bits(ADAM, **kwargs)

  @parameterized.named_parameters(
      ('word', dict(bits='yes'), 'bits must be'),
      ('unknown_key', dict(bits={'perod': 5}), 'unknown keys'),
      ('bad_value', dict(bits={'period': 0}), 'period'),
      ('with_resets', dict(bits='adaptive', reset_every=10), 'reset_every'),
      ('with_scale_mode', dict(bits='adaptive', scale_mode='rank1'),
       'scale_mode'),
  )
  def test_drop_in_bits_argument(self, kwargs, match):
    with self.assertRaisesRegex(ValueError, match), warnings.catch_warnings():
      warnings.simplefilter('ignore', DeprecationWarning)
      optax_q.adamw(1e-3, **kwargs)

  def test_explicit_chain_adapts(self):
    params = adaptive_worker.params()
    tx = optax.chain(
        optax_q.adaptive_bits(
            optax.scale_by_adam(), elementwise=True, track_stalls=False,
            block_size=32, min_size=0, period=2, anneal=0.0),
        optax.add_decayed_weights(1e-4),
        optax.scale_by_learning_rate(1e-2))
    _, state, _, _ = _train(tx, params, 8)
    zones = [optax_q.ZONES[z] for z in state[0].stats.zone.tolist()]
    self.assertEqual(zones, ['magnitude', 'redundant', 'structural'])
    self.assertEqual(
        optax_q.bit_widths(state)['0/inner_state/inner_state/mu/calm'],
        3.0 + 1.0)  # nf3 with a float32 scale per 32.

  @parameterized.parameters('adamw', 'adam')
  def test_deprecated_bits_is_the_explicit_chain(self, name):
    params = adaptive_worker.params()
    lr, b1, b2, eps, eps_root, wd = 1e-2, 0.8, 0.95, 1e-7, 1e-9, 1e-3
    bits = {'period': 2, 'anneal': 0.0}
    storage = dict(block_size=32, min_size=0, seed=3, rounding='stochastic')
    decay = {'weight_decay': wd} if name == 'adamw' else {}
    with self.assertWarnsRegex(DeprecationWarning,
                               r'optax_q\.adaptive_bits\(') as caught:
      old = getattr(optax_q, name)(lr, b1, b2, eps, eps_root, **decay,
                                   nesterov=True, bits=bits, **storage)
    self.assertEqual(caught.filename, __file__)
    self.assertLen(caught.warnings, 1)
    new = optax.chain(
        optax_q.adaptive_bits(
            optax.scale_by_adam(b1, b2, eps, eps_root, nesterov=True),
            elementwise=True, track_stalls=False, **storage, **bits),
        *([optax.add_decayed_weights(wd)] if name == 'adamw' else []),
        optax.scale_by_learning_rate(lr))
    self.assertEqual(optax_q.bit_layout(old.init(params)),
                     optax_q.bit_layout(new.init(params)))
    p_old, s_old, layouts_old, _ = _train(old, params, 8)
    p_new, s_new, layouts_new, _ = _train(new, params, 8)
    helpers.assert_bits_equal(p_new, p_old)
    helpers.assert_bits_equal(s_new, s_old)
    self.assertEqual(layouts_new, layouts_old)
    self.assertNotEqual(layouts_new[0], layouts_new[-1])  # relayout acted.

  def test_candidates_the_inner_state_lacks(self):
    with self.assertRaisesRegex(ValueError, r"candidates names .*'trace'"):
      optax_q.adaptive_bits(optax.trace(0.9))
    optax_q.adaptive_bits(optax.trace(0.9), {'trace': ('nf4', 'int8')})

  def test_parameters_that_cannot_be_adapted_raise_at_init(self):
    with self.assertRaisesRegex(ValueError, 'more than one leaf'):
      _tx().init({'a': {'b': jnp.ones((4, 64))}, 'a/b': jnp.ones((8, 64))})

    class Params(NamedTuple):
      a: jax.Array
      w: jax.Array

    with self.assertRaisesRegex(ValueError, 'pass them as a dict'):
      _tx().init(Params(jnp.ones((8, 128)), jnp.ones((8, 128))))

  def test_relayout_misuse_raises(self):
    tx = _tx()
    params = adaptive_worker.params()
    state = tx.init(params)
    with self.assertRaisesRegex(ValueError, 'outside jax.jit'):
      jax.jit(optax_q.relayout)(state)
    with self.assertRaisesRegex(ValueError, 'abstract state'):
      optax_q.relayout(jax.eval_shape(tx.init, params))
    with self.assertRaisesRegex(ValueError, 'not adapted leaves'):
      optax_q.relayout(state, {'opt_state/0/inner_state/inner_state/mu/big':
                               'nf3/block'})
    with self.assertRaisesRegex(ValueError, 'step'):
      optax_q.relayout(state, step=-1)
    self.assertIs(optax_q.relayout(state), state)  # Nothing to change.

  def test_drop_in_conflicts(self):
    with self.assertRaisesRegex(ValueError, 'mu_format.*unused'):
      optax_q.adamw(1e-3, bits='adaptive', mu_format='nf4')
    with self.assertRaisesRegex(ValueError, 'arguments of the optimizer'):
      optax_q.adamw(1e-3, bits={'block_size': 64})
    with self.assertWarns(DeprecationWarning):  # Warns only when it builds.
      optax_q.adam(1e-3, bits='adaptive')

  def test_bad_inner_raises(self):
    with self.assertRaisesRegex(ValueError, 'inner'):
      optax_q.adaptive_bits(lambda x: x)

  def test_bad_layout_raises(self):
    state = _tx().init({'w': jnp.zeros((8, 64))})
    path = next(iter(optax_q.bit_layout(state)))
    with self.assertRaisesRegex(ValueError, 'not a candidate'):
      optax_q.relayout(state, {path: 'int4/block'})
    with self.assertRaisesRegex(ValueError, 'layout'):
      optax_q.relayout(state, ['nf4/block'])

  def test_default_levels(self):
    # Zones: redundant, structural (dispersion), magnitude, critical.
    self.assertEqual(adaptive._default_levels(3, 'magnitude'), (0, 1, 1, 2))
    self.assertEqual(adaptive._default_levels(4, 'magnitude'), (0, 1, 2, 3))
    self.assertEqual(adaptive._default_levels(4, 'dispersion'), (0, 2, 1, 3))
    self.assertEqual(adaptive._default_levels(2, 'dispersion'), (0, 1, 0, 1))
    self.assertEqual(adaptive._default_levels(1, 'magnitude'), (0, 0, 0, 0))


class StatisticsTest(parameterized.TestCase):

  @parameterized.parameters(1.0, 1e-25, 1e30, 3.4e38)
  def test_factors_match_numpy_at_any_magnitude(self, peak):
    g = np.random.default_rng(0).standard_t(3, size=(64, 96))
    g = g / np.max(np.abs(g)) * peak  # Largest magnitude: `peak`.
    n, r = jax.jit(adaptive._moments)(jnp.asarray(g, jnp.float32))
    g32 = g.astype(np.float32).astype(np.float64)
    want_n = np.sqrt(np.mean(g32**2))
    a = np.abs(g32)
    want_r = np.std(a) / np.mean(a)
    self.assertTrue(np.isfinite(n) and np.isfinite(r))
    np.testing.assert_allclose(float(n), want_n, rtol=1e-5)
    np.testing.assert_allclose(float(r), want_r, rtol=1e-4)

  def test_gaussian_dispersion(self):
    g = jax.random.normal(jax.random.key(0), (1000, 1000))
    _, r = adaptive._moments(g)
    np.testing.assert_allclose(float(r), np.sqrt(np.pi / 2 - 1), rtol=1e-2)

  def test_zero_and_nonfinite_gradients(self):
    n, r = adaptive._moments(jnp.zeros((8, 64)))
    self.assertEqual((float(n), float(r)), (0.0, 0.0))
    tx = _tx(period=1, patience=1)
    params = {'w': jnp.ones((8, 64)), 'v': jnp.ones((8, 64))}
    state = jax.jit(tx.init)(params)  # Compiled: op by op takes seconds.
    bad = {'w': jnp.full((8, 64), jnp.nan), 'v': jnp.ones((8, 64))}
    _, state = jax.jit(tx.update)(bad, state, params)
    stats = state[0].stats
    self.assertEqual(stats.samples.tolist(), [1, 0])  # ('v', 'w') order.
    self.assertTrue(np.all(np.isfinite(stats.magnitude)))
    self.assertTrue(np.all(np.isfinite(stats.dispersion)))

  def test_statistics_are_not_state_bits(self):
    params = {'w': jnp.zeros((8, 256))}
    state = optax_q.adaptive_bits(ADAM, min_size=0).init(params)
    # 4-bit defaults: nf4 and ue4m0 with float32 scales per 128.
    self.assertEqual(optax_q.state_bits_per_element(state), 4.25)


class DecisionTest(parameterized.TestCase):

  def _params(self):
    # 'big' has 30x larger gradients (magnitude), 'spiky' heavy tails
    # (dispersion), 'calm' neither: see adaptive_worker.grads.
    return adaptive_worker.params()

  def test_quadrants_map_to_formats(self):
    _, state, _, _ = _train(_tx(anneal=0.0), self._params(), 8)
    zones = state[0].stats.zone.tolist()  # ('big', 'calm', 'spiky').
    self.assertEqual([optax_q.ZONES[z] for z in zones],
                     ['magnitude', 'redundant', 'structural'])
    layout = {k.split('inner_state/')[-1]: v
              for k, v in optax_q.bit_layout(state).items()}
    self.assertEqual(layout, {  # Three rungs: one factor high -> 4-bit.
        'mu/big': 'nf4/block', 'mu/calm': 'nf3/block',
        'mu/spiky': 'nf4/block', 'nu/big': 'ue4m0/block',
        'nu/calm': 'int3_mulaw_unsigned/block', 'nu/spiky': 'ue4m0/block'})
    # Four rungs: a field's primary factor alone one below the top.
    ladder = {'mu': ('nf3', 'nf4', 'int8_dynamic', 'bf16'),
              'nu': ('int3_mulaw', 'ue4m0', 'int8_dynamic', 'bf16')}
    _, state, _, _ = _train(_tx(candidates=ladder, anneal=0.0),
                            self._params(), 8)
    layout = {k.split('inner_state/')[-1]: v
              for k, v in optax_q.bit_layout(state).items()}
    self.assertEqual(layout, {
        'mu/big': 'int8_dynamic/block', 'mu/calm': 'nf3/block',
        'mu/spiky': 'nf4/block', 'nu/big': 'ue4m0/block',
        'nu/calm': 'int3_mulaw_unsigned/block',
        'nu/spiky': 'int8_dynamic_unsigned/block'})
    # And the table can be overridden: critical and magnitude to bf16.
    _, state, _, _ = _train(
        _tx(candidates=ladder, anneal=0.0,
            zone_levels={'magnitude': {'mu': 3, 'nu': 3}}), self._params(), 8)
    self.assertEqual(
        optax_q.bit_widths(state)['0/inner_state/inner_state/mu/big'], 16.0)

  def test_commits_only_every_period_times_patience(self):
    tx = _tx(period=3, patience=2, anneal=0.0, margin=0.0)
    # Gradients whose scale flips every step: proposals flap.
    _, _, layouts, step = _train(
        tx, self._params(), 30, grads=adaptive_worker.flapping_grads)
    changes = [i + 1 for i in range(1, len(layouts))
               if layouts[i] != layouts[i - 1]]
    self.assertTrue(all(s % 6 == 0 for s in changes), changes)
    self.assertLessEqual(step._cache_size(), 1 + 30 // 6)  # pylint: disable=protected-access

  def test_dead_band_holds_a_leaf_near_its_threshold(self):
    cfg = adaptive._config(
        None, period=1, patience=1, margin=0.2, thresholds=(1.0, 1.0),
        decay=0.0, anneal=0.0, anneal_steps=1, initial=None,
        zone_levels=None, factors=None, sample_every=1, min_size=0,
        block_size=32, nonnegative=frozenset({'nu'}))
    stats = adaptive.BitStatistics(
        magnitude=jnp.array([1.1, 0.9]), dispersion=jnp.array([1.0, 1.0]),
        samples=jnp.array([1, 1]), zone=jnp.array([2, 0]),
        pending=jnp.array([2, 0]), streak=jnp.array([1, 1]),
        levels=jnp.zeros((2, 2), jnp.int32))
    eligible, sizes = np.array([True, True]), np.array([1.0, 1.0])
    out = adaptive._decide(cfg, ('mu', 'nu'), eligible, sizes, stats,
                           jnp.int32(1))
    # Reference 1.0: 1.1 is high and stays high (above 0.8); 0.9 low, and
    # stays low until above 1.2.
    self.assertEqual(out.zone.tolist(), [2, 0])
    no_band = adaptive._decide(
        cfg.__class__(**{**cfg.__dict__, 'margin': 0.0}), ('mu', 'nu'),
        eligible, sizes, dataclasses_replace(stats, zone=jnp.array([0, 2])),
        jnp.int32(1))
    self.assertEqual(no_band.zone.tolist(), [2, 0])

  def test_annealing_lowers_levels_over_training(self):
    early, late = [], []
    for anneal in (0.0, 50.0):
      _, state, _, _ = _train(_tx(anneal=anneal, anneal_steps=4),
                              self._params(), 12)
      (early if anneal == 0 else late).append(
          optax_q.state_bits_per_element(state))
    self.assertLess(late[0], early[0])
    self.assertAlmostEqual(late[0], 3.0 + 32 / 32, places=6)  # All 3-bit.

  def test_single_rung_is_quantize_state(self):
    params = self._params()
    ladder = {'mu': ('int8_dynamic',), 'nu': ('int8_dynamic',)}
    a = optax.chain(optax_q.adaptive_bits(ADAM, ladder, period=2,
                                          min_size=0, block_size=32, seed=3),
                    optax.scale(-1e-2))
    b = optax.chain(optax_q.quantize_state(ADAM, 'int8_dynamic', min_size=0,
                                           block_size=32, seed=3),
                    optax.scale(-1e-2))
    pa, sa, _, _ = _train(a, params, 1)
    pb, sb, _, _ = _train(b, params, 1, relayout=False)
    helpers.assert_bits_equal(pa, pb)
    helpers.assert_bits_equal(sa[0].inner_state.inner_state, sb[0].inner_state)
    # Later steps: the two programs fuse differently (the statistics read
    # the gradients too), so float32 results may differ in the last bit and
    # a stochastic rounding flip by one code.
    pa, _, _, _ = _train(a, params, 6)
    pb, _, _, _ = _train(b, params, 6, relayout=False)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5),
                 pa, pb)

  @parameterized.parameters(True, False)
  def test_relayout_changes_real_bytes_and_keeps_values(self, elementwise):
    params = self._params()
    tx = _tx(anneal=0.0, elementwise=elementwise)
    _, state, _, _ = _train(tx, params, 3)  # Before the first commit.
    before = optax_q.state_nbytes(state)
    decoded = {k: optax_q.dequantize(q) for k, q in
               optax_q.quantized_leaves(state).items()}
    state = optax_q.relayout(state, {
        k: ('nf3/block' if '/mu/' in k else 'int3_mulaw_unsigned/block')
        for k in optax_q.bit_layout(state)})
    self.assertLess(optax_q.state_nbytes(state), before)
    for k, q in optax_q.quantized_leaves(state).items():
      self.assertEqual(q.fmt.bits, 3)
      x, y = decoded[k], optax_q.dequantize(q)
      self.assertLess(float(jnp.max(jnp.abs(x - y))),
                      0.35 * float(jnp.max(jnp.abs(x))))
    # The step runs on (and keeps) the new layout.
    _, state, _, _ = _train(tx, params, 1, start=3, state=state,
                            relayout=False)
    self.assertTrue(all(q.fmt.bits == 3 for q in
                        optax_q.quantized_leaves(state).values()))

  def test_relayout_skips_off_period_steps(self):
    tx = _tx(period=2, patience=2)
    state = tx.init(self._params())
    state = optax_q.relayout(state, {k: 'nf3/block' for k in
                                     optax_q.bit_layout(state)
                                     if '/mu/' in k})
    self.assertIs(optax_q.relayout(state, step=3), state)

  def test_one_spike_does_not_hold_a_leaf(self):
    # One finite step 1e15 times the usual on 'calm': its average may rise
    # by at most OUTLIER times per sample, and decays back.
    def spiky(i):
      g = adaptive_worker.grads(i)
      if i == 4:
        g['calm'] = g['calm'] * 1e15
      return g
    _, state, _, _ = _train(_tx(anneal=0.0), self._params(), 40,
                            grads=spiky)
    zones = [optax_q.ZONES[z] for z in state[0].stats.zone.tolist()]
    self.assertEqual(zones, ['magnitude', 'redundant', 'structural'])

  def test_finite_state_under_huge_and_tiny_gradients(self):
    params = self._params()
    tx = _tx()  # One transform: its steps compile once per layout.
    for scale in (1e-30, 1e17):  # (Larger: float32 Adam overflows in g**2.)
      _, state, _, _ = _train(
          tx, params, 8,
          grads=lambda i, s=scale: jax.tree.map(
              lambda g: g * s, adaptive_worker.grads(i)))
      for q in optax_q.quantized_leaves(state).values():
        self.assertTrue(bool(jnp.all(jnp.isfinite(optax_q.dequantize(q)))))
      self.assertTrue(bool(jnp.all(jnp.isfinite(state[0].stats.magnitude))))


def dataclasses_replace(x, **kwargs):
  import dataclasses  # pylint: disable=import-outside-toplevel
  return dataclasses.replace(x, **kwargs)


class CheckpointTest(absltest.TestCase):

  def test_resumed_run_is_bit_identical_formats_included(self):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    params = adaptive_worker.params()
    tx = _annealed_tx()
    want_p, want_s, _ = _annealed_run()
    p, s, _, _ = _train(tx, params, 6)
    layout = optax_q.bit_layout(s)
    self.assertNotEqual(layout, optax_q.bit_layout(tx.init(params)))
    with tempfile.TemporaryDirectory() as tmp:
      with ocp.CheckpointManager(tmp) as mgr:
        mgr.save(6, args=ocp.args.Composite(
            state=ocp.args.StandardSave({'params': p, 'opt': s}),
            layout=ocp.args.JsonSave(layout)))
        mgr.wait_until_finished()
      with ocp.CheckpointManager(tmp) as mgr:
        saved = mgr.restore(6, args=ocp.args.Composite(
            layout=ocp.args.JsonRestore()))['layout']
        abstract = {'params': jax.eval_shape(lambda: params),
                    'opt': optax_q.relayout(jax.eval_shape(tx.init, params),
                                            saved)}
        restored = mgr.restore(6, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract)))['state']
    self.assertEqual(optax_q.bit_layout(restored['opt']), layout)
    got_p, got_s, _, _ = _train(tx, restored['params'], 6, start=6,
                                state=restored['opt'])
    helpers.assert_bits_equal(got_p, want_p)
    helpers.assert_bits_equal(got_s, want_s)
    self.assertEqual(optax_q.bit_layout(got_s), optax_q.bit_layout(want_s))

  def test_checkpoint_saved_under_the_old_field_name(self):
    import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
    params = adaptive_worker.params()
    tx = _annealed_tx()
    want_p, want_s, _ = _annealed_run()
    p, s, _, _ = _train(tx, params, 6)
    layout = _old_layout(optax_q.bit_layout(s))
    with tempfile.TemporaryDirectory() as tmp:
      with ocp.CheckpointManager(tmp) as mgr:
        mgr.save(6, args=ocp.args.Composite(
            state=ocp.args.StandardSave({'params': p, 'opt': _old_names(s)}),
            layout=ocp.args.JsonSave(layout)))
        mgr.wait_until_finished()
      with ocp.CheckpointManager(tmp) as mgr:
        saved = mgr.restore(6, args=ocp.args.Composite(
            layout=ocp.args.JsonRestore()))['layout']
        with self.assertWarns(DeprecationWarning):
          opt = optax_q.relayout(jax.eval_shape(tx.init, params), saved)
        abstract = {'params': jax.eval_shape(lambda: params), 'opt': opt}
        # Into today's target it does not restore.
        with self.assertRaises(ValueError):
          mgr.restore(6, args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract)))
        raw = mgr.restore(6, args=ocp.args.Composite(
            state=ocp.args.StandardRestore()))['state']
    self.assertIn('inner', raw['opt'][0])
    restored = ocp.tree.deserialize_tree(optax_q.upgrade_checkpoint(raw),
                                         abstract)
    helpers.assert_bits_equal(restored, {'params': p, 'opt': s})
    got_p, got_s, _, _ = _train(tx, restored['params'], 6, start=6,
                                state=restored['opt'])
    helpers.assert_bits_equal(got_p, want_p)
    helpers.assert_bits_equal(got_s, want_s)


class _OldAdaptiveBitsState(NamedTuple):
  """`AdaptiveBitsState` as it was saved before ``inner`` was renamed."""

  count: Any
  stats: Any
  inner: Any
  policy: Any


def _old_names(tree):
  """``tree`` as earlier versions held it: states with the field ``inner``."""
  is_node = lambda x: isinstance(x, optax_q.AdaptiveBitsState)
  return jax.tree.map(
      lambda x: _OldAdaptiveBitsState(x.count, x.stats, x.inner_state,
                                      x.policy) if is_node(x) else x,
      tree, is_leaf=is_node)


def _old_layout(layout):
  return {k.replace('inner_state/inner_state/', 'inner/inner_state/'): v
          for k, v in layout.items()}


class DeprecatedNameTest(absltest.TestCase):

  def test_inner_reads_inner_state_and_warns_at_the_caller(self):
    state = _tx().init({'w': jnp.zeros((4, 64))})[0]
    with self.assertWarnsRegex(DeprecationWarning, 'inner_state') as caught:
      inner = state.inner
    self.assertIs(inner, state.inner_state)
    self.assertEqual(caught.filename, __file__)

  def test_layout_of_earlier_versions_is_read_and_warns(self):
    tx = _tx()
    state = tx.init({'w': jnp.zeros((4, 64))})
    layout = {'0/inner_state/inner_state/mu/w': 'nf3/block'}
    want = optax_q.relayout(state, layout)
    with self.assertWarnsRegex(DeprecationWarning, 'bit_layout') as caught:
      got = optax_q.relayout(state, _old_layout(layout))
    self.assertEqual(caught.filename, __file__)
    self.assertEqual(optax_q.bit_layout(got), optax_q.bit_layout(want))
    helpers.assert_bits_equal(got, want)

  def test_upgrade_checkpoint_leaves_other_trees_alone(self):
    tree = {'inner': {'a': 1}, 'count': 2, 'stats': {'x': [3]},
            'b': [{'inner_state': 4}]}
    self.assertEqual(optax_q.upgrade_checkpoint(tree), tree)


class NnxTest(absltest.TestCase):

  def test_nnx_optimizer_relayout(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    from flax.nnx.training import optimizer as nnx_optimizer  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    model, opt, step = helpers.nnx_adaptive_adamw()

    x = jnp.ones((4, 64))
    before = optax_q.bit_layout(opt.opt_state)
    for i in range(3):
      step(model, opt, x)
      new = optax_q.relayout(opt.opt_state, step=i + 1)
      if new is not opt.opt_state:
        opt.opt_state = nnx.data(nnx_optimizer.to_opt_state(new))
    self.assertNotEqual(optax_q.bit_layout(opt.opt_state), before)
    step(model, opt, x)  # Runs on the new layout.
    self.assertTrue(bool(jnp.all(jnp.isfinite(model.kernel[...]))))

  def test_nnx_checkpoint_saved_under_the_old_field_name(self):
    from flax import nnx  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    from flax.nnx.training import optimizer as nnx_optimizer  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top,import-outside-toplevel
    tx = _tx(period=1, patience=1)

    def make(layout):
      model = nnx.Linear(64, 128, rngs=nnx.Rngs(0))
      opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
      new = optax_q.relayout(opt.opt_state, layout)
      if new is not opt.opt_state:
        opt.opt_state = nnx.data(nnx_optimizer.to_opt_state(new))
      return model, opt

    @nnx.jit
    def step(model, opt, x):
      grads = nnx.grad(lambda m: jnp.mean(m(x) ** 2))(model)
      opt.update(model, grads)

    def old_names(tree):  # The NNX state as earlier versions named it.
      if isinstance(tree, Mapping):
        return {('inner' if k == 'inner_state' and 'stats' in tree else k):
                old_names(v) for k, v in tree.items()}
      return tree

    x = jnp.ones((4, 64))
    model, opt = make({})
    step(model, opt, x)
    layout = optax_q.bit_layout(opt.opt_state)
    with tempfile.TemporaryDirectory() as tmp:
      path = tmp + '/state'
      helpers.save(path, old_names(nnx.state((model, opt))))
      with ocp.StandardCheckpointer() as ckptr:
        raw = ckptr.restore(path)
    self.assertIn('inner', raw['1']['opt_state']['0'])
    model2, opt2 = make(layout)
    nnx.update((model2, opt2), ocp.tree.deserialize_tree(
        optax_q.upgrade_checkpoint(raw), nnx.state((model2, opt2))))
    for m, o in ((model, opt), (model2, opt2)):
      step(m, o, x)
    helpers.assert_bits_equal(nnx.state((model2, opt2)),
                              nnx.state((model, opt)))


class MeshTest(parameterized.TestCase):

  @parameterized.parameters(AxisType.Auto, AxisType.Explicit)
  def test_sharded_run_matches_unsharded(self, axis_type):
    mesh = jax.make_mesh((4, 2), ('data', 'model'),
                         axis_types=(axis_type, axis_type))
    params = adaptive_worker.params()
    specs = {'big': P('data', 'model'), 'calm': P('model', None),
             'spiky': P(None, 'data')}
    shardings = {k: NamedSharding(mesh, s) for k, s in specs.items()}
    tx = _annealed_tx()
    want_p, _, want_layouts = _annealed_run()

    sharded = jax.device_put(params, shardings)
    state = jax.tree.map(
        jax.device_put, tx.init(params),
        optax_q.state_shardings(jax.eval_shape(tx.init, params), shardings))
    step = jax.jit(adaptive_worker.step_fn(tx))
    layouts = []
    with jax.set_mesh(mesh):
      for i in range(12):
        g = jax.device_put(adaptive_worker.grads(i), shardings)
        sharded, state = step(sharded, state, g)
        state = optax_q.relayout(state, step=i + 1, param_shardings=shardings)
        layouts.append(optax_q.bit_layout(state))
        want = optax_q.state_shardings(state, shardings)
        for x, s in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
          self.assertTrue(x.sharding.is_equivalent_to(s, x.ndim),
                          (x.sharding, s))
    # The same decisions, step by step. The values agree to float32
    # rounding: on CPUs with FMA, LLVM may contract a multiply-add in one
    # shard shape's loop and not in another's, a last-bit difference that a
    # block scale then carries (with --xla_cpu_max_isa=AVX, no FMA, the
    # runs agree bit for bit).
    self.assertEqual(layouts, want_layouts)
    self.assertNotEqual(layouts[0], layouts[-1])
    jax.tree.map(lambda x, y: np.testing.assert_allclose(
        np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=1e-5,
        atol=1e-6), sharded, want_p)

  def test_strict_state_shardings(self):
    mesh = jax.make_mesh((1,), ('x',))
    params = adaptive_worker.params()
    shardings = {k: NamedSharding(mesh, P()) for k in params}
    out = optax_q.state_shardings(jax.eval_shape(_tx().init, params),
                                  shardings, strict=True)
    self.assertLen(jax.tree.leaves(out), len(jax.tree.leaves(
        jax.eval_shape(_tx().init, params))))



class TwoProcessTest(absltest.TestCase):

  # Slow: about 15 s of the default suite (two worker processes and a
  # reference run). The default suite keeps a multi-process run in
  # test_howtos.py (shard_state_multihost, bit-identical to the unsharded
  # run), and MeshTest takes the same decisions sharded as unsharded.
  @pytest.mark.slow
  def test_two_processes_decide_alike(self):
    with tempfile.TemporaryDirectory() as tmp:
      outs = adaptive_worker.launch(tmp, num_processes=2)
      single = adaptive_worker.run_single()
    self.assertEqual(outs[0]['layouts'], outs[1]['layouts'])
    self.assertEqual(outs[0]['layouts'], single['layouts'])
    self.assertNotEqual(outs[0]['layouts'][0], outs[0]['layouts'][-1])
    # Both processes hold the same global state, bit for bit.
    self.assertEqual(outs[0]['digest'], outs[1]['digest'])
    for k, v in single['params'].items():  # (See MeshTest on FMA.)
      np.testing.assert_allclose(outs[0]['params'][k], v, rtol=1e-5,
                                 atol=1e-6)


if __name__ == '__main__':
  absltest.main()
