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
"""Tests for the stall model and reset period in ``optax_q._src.resets.theory``.

Paper values are from Topollai & Choromanska, arXiv 2603.16731 (Tables 1-3,
the theory column of Table 8, and the prediction row of the multi-model stall
table, Tables 8-9 of the EMNLP version). Values marked "derived" are not
printed in the paper; they are the same formulas at other settings and pin
the implementation down.
"""

import dataclasses
import doctest
import math
import sys
import types
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import ml_dtypes
import numpy as np

import optax_q
from optax_q._src.resets import theory

PAPER_FORMATS = ('bf16', 'fp8_e4m3', 'fp4')


def _as_printed(x, printed):
  """``x`` rounded to as many decimals as ``printed`` shows."""
  text = repr(printed)
  digits = len(text.split('.')[1]) if '.' in text else 0
  return round(x, digits)


@dataclasses.dataclass(frozen=True)
class _Fmt:
  """Stand-in for ``optax_q.Format``: the two attributes the model reads."""

  name: str
  mantissa_bits: int | None


class FormatTest(parameterized.TestCase):

  @parameterized.parameters(
      ('bf16', 2.0**-7),
      ('bfloat16', 2.0**-7),
      ('fp16', 2.0**-10),
      ('fp8_e4m3', 2.0**-3),
      ('fp8', 2.0**-3),
      ('e4m3', 2.0**-3),
      ('fp8_e5m2', 2.0**-2),
      # A second moment in fp4_e2m1 is stored in unsigned E2M2.
      ('fp4_e2m1', 2.0**-2),
      ('fp4_e2m2u', 2.0**-2),
      ('fp4', 2.0**-2),  # = fp4_e2m1: the paper's FP4, an E2M2 v grid.
      ('e3m2', 2.0**-2),
      ('e2m1', 2.0**-2),  # = fp4_e2m1 (FORMAT_ALIASES).
      ('e3m1', 2.0**-1),
      ('e5m0', 1.0),
      ('e8m23', 2.0**-23),
      (' BF16 ', 2.0**-7),
  )
  def test_epsilon_from_name(self, name, eps):
    self.assertEqual(theory.format_epsilon(name), eps)

  @parameterized.parameters(
      ('bf16', 7), ('fp8_e4m3', 3), ('fp4_e2m1', 2), ('fp4_e2m2u', 2),
      ('e3m2', 2), ('fp16', 10),
  )
  def test_format_object_matches_name(self, name, mbits):
    obj = _Fmt(name, mbits)
    self.assertEqual(theory.format_epsilon(obj), theory.format_epsilon(name))
    self.assertEqual(theory.reset_period(obj), theory.reset_period(name))
    self.assertEqual(
        theory.stall_probability(obj, rounding='stochastic'),
        theory.stall_probability(name, rounding='stochastic'))

  def test_numpy_int_mantissa_bits(self):
    self.assertEqual(theory.format_epsilon(_Fmt('x', np.int32(3))), 0.125)

  @parameterized.parameters(
      'fp32', 'float32', 'int8', 'int4', 'int8_dynamic',
      'int8_dynamic_unsigned',
  )
  def test_unsupported_name_raises(self, name):
    with self.assertRaisesRegex(ValueError, 'supported: bf16, fp16') as cm:
      theory.stall_probability(name)
    self.assertIn(repr(name), str(cm.exception))

  @parameterized.parameters(
      _Fmt('int8', None), _Fmt('int8_dynamic', None), _Fmt('int4', None),
      _Fmt('fp32', None),
      _Fmt('fp32', 23),  # fp32 is the working precision, never rounded.
  )
  def test_unsupported_object_raises(self, fmt):
    with self.assertRaisesRegex(ValueError, f"fmt='{fmt.name}'.*supported"):
      theory.reset_period(fmt)

  @parameterized.parameters(
      'fp6', 'e9m2', 'e0m3', 'e3m24', 'nope', 3, None, 0.5,
      'e04m3',  # Refused by get_format: theory had a parser of its own.
      'nf4',  # A table without a mantissa.
      _Fmt('bad', -1), _Fmt('bad', 2.0), _Fmt('bad', True),
  )
  def test_bad_format_raises(self, fmt):
    with self.assertRaisesRegex(ValueError, 'fmt.*supported: '):
      theory.effective_precision_ratio(fmt)


class PaperTablesTest(parameterized.TestCase):
  """Tables 1-3 (and Table 9, the K* table) at b2 = 0.999."""

  @parameterized.parameters(
      # fmt, rho-hat, P_NR, P_SR (Tables 1-2).
      ('bf16', 2.71, 0.946, 0.825),
      ('fp8_e4m3', 43.3, 1.000, 0.989),
      ('fp4', 86.6, 1.000, 0.994),
      ('fp4_e2m2u', 86.6, 1.000, 0.994),
  )
  def test_tables_1_2(self, fmt, rho, p_nr, p_sr):
    r = theory.effective_precision_ratio(fmt, b2=0.999)
    self.assertEqual(_as_printed(r, rho), rho)
    self.assertEqual(
        round(theory.stall_probability(fmt, 0.999, 'nearest'), 3), p_nr)
    self.assertEqual(
        round(theory.stall_probability(fmt, 0.999, 'stochastic'), 3), p_sr)

  @parameterized.parameters(
      # Large-rho SR approximation 1 - mu1 / (2 rho): 0.821 / 0.9888 / 0.9944.
      ('bf16', 0.821, 3), ('fp8_e4m3', 0.9888, 4), ('fp4', 0.9944, 4),
  )
  def test_sr_large_ratio_approximation(self, fmt, value, digits):
    p = theory.stall_probability(fmt, 0.999, 'stochastic', asymptotic=True)
    self.assertEqual(round(p, digits), value)

  def test_prediction_row_of_multi_model_table(self):
    # [NR, SR] predictions at b2 = 0.999: bf16 [0.946, 0.825],
    # fp8 [1.000, 0.989].
    got = [
        [round(theory.stall_probability(f, 0.999, r), 3)
         for r in ('nearest', 'stochastic')]
        for f in ('bf16', 'fp8_e4m3')
    ]
    self.assertEqual(got, [[0.946, 0.825], [1.0, 0.989]])

  @parameterized.parameters(
      # Table 3 / Table 9: K* for s0 = 0.5, 0.6, 0.7.
      ('bf16', (1004, 1116, 1262)),
      ('fp8_e4m3', (295, 320, 351)),
      ('fp4', (206, 224, 246)),
  )
  def test_table_3_reset_period(self, fmt, periods):
    got = tuple(theory.reset_period(fmt, 0.999, s0) for s0 in (0.5, 0.6, 0.7))
    self.assertEqual(got, periods)
    # The defaults are b2 = 0.999 and s0 = 0.6.
    self.assertEqual(theory.reset_period(fmt), periods[1])
    # For rho >= 1 the paper's large-rho form is the same function.
    self.assertEqual(theory.reset_period(fmt, asymptotic=True), periods[1])

  def test_table_8_theory_startup_windows(self):
    # Theory column of Table 8 (b2 = 0.999, NR) with the measured floors
    # P_init = 0.17 / 0.53 / 0.97, for P0 = 0.5, 0.8, 0.9, 0.95.
    p0s = (0.5, 0.8, 0.9, 0.95)
    windows = {
        fmt: [theory.startup_window(fmt, 0.999, p0, p_init=p_init)
              for p0 in p0s]
        for fmt, p_init in (('bf16', 0.17), ('fp8_e4m3', 0.53), ('fp4', 0.97))
    }
    self.assertEqual(windows['fp8_e4m3'], [0, 15, 36, 61])
    self.assertEqual(windows['fp4'], [0, 0, 0, 0])
    self.assertEqual(windows['bf16'][:3], [76, 464, 1051])
    # The paper prints 3044. With P_init = 0.17 the formula gives 3042; no
    # single P_init gives 76 at P0 = 0.5 and 3044 at P0 = 0.95 together
    # (3044 needs P_init ~ 0.1698, which moves j*(0.5) to 77), so the paper's
    # last digit comes from its unrounded measured P_init.
    self.assertEqual(windows['bf16'][3], 3042)
    self.assertLessEqual(abs(windows['bf16'][3] - 3044), 2)

  def test_bf16_window_unreachable_without_floor(self):
    # Without P_init, P0 = 0.95 is above the bf16 steady state (0.946).
    self.assertIsNone(theory.startup_window('bf16', 0.999, 0.95))
    self.assertEqual(theory.startup_window('bf16', 0.999, 0.95, p_init=0.17),
                     3042)


class DerivedValuesTest(parameterized.TestCase):
  """Same formulas at settings the paper does not print (derived values)."""

  @parameterized.parameters(
      # b2, then (rho, P_NR, P_SR) for bf16, fp8_e4m3, fp4.
      (0.9, (0.027, 0.013, 0.013), (0.433, 0.220, 0.235),
       (0.866, 0.543, 0.537)),
      (0.95, (0.054, 0.026, 0.026), (0.866, 0.543, 0.537),
       (1.73, 0.902, 0.738)),
      (0.98, (0.135, 0.066, 0.066), (2.17, 0.925, 0.785),
       (4.33, 0.979, 0.889)),
      (0.99, (0.271, 0.134, 0.136), (4.33, 0.979, 0.889),
       (8.66, 0.998, 0.944)),
      (0.995, (0.542, 0.284, 0.333), (8.66, 0.998, 0.944),
       (17.3, 1.000, 0.972)),
      (0.999, (2.71, 0.946, 0.825), (43.3, 1.000, 0.989),
       (86.6, 1.000, 0.994)),
      (0.9999, (27.1, 1.000, 0.982), (433, 1.000, 0.999),
       (866, 1.000, 0.999)),
  )
  def test_stall_probability_other_b2(self, b2, *rows):
    for fmt, (rho, p_nr, p_sr) in zip(PAPER_FORMATS, rows):
      r = theory.effective_precision_ratio(fmt, b2)
      self.assertEqual(_as_printed(r, rho), rho, msg=(fmt, b2))
      self.assertEqual(round(theory.stall_probability(fmt, b2), 3), p_nr,
                       msg=(fmt, b2))
      self.assertEqual(
          round(theory.stall_probability(fmt, b2, 'stochastic'), 3), p_sr,
          msg=(fmt, b2))

  @parameterized.parameters(
      # b2, then (paper's large-rho form, general form) for bf16, fp8, fp4.
      (0.95, (28, 20), (26, 23), (24, 24)),
      (0.98, (71, 51), (58, 58), (48, 48)),
      (0.99, (141, 103), (97, 97), (72, 72)),
      (0.995, (275, 216), (145, 145), (102, 102)),
      (0.998, (634, 634), (228, 228), (159, 159)),
      (0.999, (1116, 1116), (320, 320), (224, 224)),
      (0.9995, (1788, 1788), (449, 449), (315, 315)),
      (0.9999, (4086, 4086), (999, 999), (703, 703)),
  )
  def test_reset_period_other_b2(self, b2, *rows):
    for fmt, (k_asym, k_general) in zip(PAPER_FORMATS, rows):
      self.assertEqual(
          theory.reset_period(fmt, b2, asymptotic=True), k_asym,
          msg=(fmt, b2))
      self.assertEqual(theory.reset_period(fmt, b2), k_general,
                       msg=(fmt, b2))

  @parameterized.parameters(
      # Ideal windows (P_init = 0) for P0 = 0.5, 0.8, 0.9, 0.95.
      ('bf16', (131, 585, 1308, None)),
      ('fp8_e4m3', (11, 38, 63, 91)),
      ('fp4', (6, 19, 32, 45)),
  )
  def test_ideal_startup_windows(self, fmt, windows):
    got = tuple(theory.startup_window(fmt, 0.999, p0)
                for p0 in (0.5, 0.8, 0.9, 0.95))
    self.assertEqual(got, windows)

  def test_effective_memory_of_bf16_nearest(self):
    # tau_eff = tau / (1 - P) ~ 18,500 steps instead of 1,000.
    b2_eff = theory.effective_decay('bf16', 0.999)
    self.assertAlmostEqual(1.0 / (1.0 - b2_eff), 1000 / (1 - 0.94583), -1)
    self.assertEqual(round(1.0 / (1.0 - b2_eff), -2), 18500)

  def test_fp4_names_mean_the_stored_grid(self):
    # 'fp4' is 'fp4_e2m1' everywhere, and a second moment in fp4_e2m1 is
    # stored in unsigned E2M2: one K* for every spelling (it depended on the
    # spelling before). A grid with one mantissa bit (e3m1) has twice the
    # rho-hat and a shorter K*.
    for name in ('fp4', 'fp4_e2m1', 'e2m1', 'fp4_e2m2u'):
      self.assertEqual(theory.reset_period(name), 224, name)
    self.assertEqual(theory.reset_period(optax_q.get_format('fp4_e2m1')), 224)
    self.assertAlmostEqual(
        theory.effective_precision_ratio('e3m1'),
        2 * theory.effective_precision_ratio('fp4'))
    self.assertEqual(theory.reset_period('e3m1'), 156)

  def test_nearest_rounding_bf16_moment_never_decreases(self):
    # Downward NR moves need |Delta| > v eps / 4, but (1 - b2) v is the
    # largest downward step: bf16 at b2 = 0.999 (1/1000 < 1/512) never
    # decreases. Check with real bf16 rounding over one binade.
    b2 = 0.999
    v = np.arange(0x3F80, 0x4000, dtype=np.uint16).view(ml_dtypes.bfloat16)
    v = v.astype(np.float32)
    new = (b2 * v).astype(ml_dtypes.bfloat16).astype(np.float32)  # g = 0
    np.testing.assert_array_equal(new, v)
    self.assertLess(1 - b2, theory.format_epsilon('bf16') / 4)


class SimulationTest(parameterized.TestCase):
  """The formulas against Monte Carlo and against real bf16 rounding."""

  @parameterized.parameters(0.2, 0.7, 1.0, 2.71, 10.0)
  def test_formulas_match_monte_carlo(self, rho):
    # Choose b2 so that bf16 has the requested rho-hat.
    b2 = 1.0 - 2.0**-7 * math.log(2.0) / (2.0 * rho)
    self.assertAlmostEqual(theory.effective_precision_ratio('bf16', b2), rho)
    z = np.random.default_rng(0).chisquare(1, 400_000)
    p_nr = np.mean(np.abs(z - 1) < rho)
    p_sr = np.mean(np.maximum(0.0, 1.0 - np.abs(z - 1) / (2 * rho)))
    self.assertAlmostEqual(theory.stall_probability('bf16', b2), p_nr,
                           delta=4e-3)
    self.assertAlmostEqual(
        theory.stall_probability('bf16', b2, 'stochastic'), p_sr, delta=4e-3)

  def _bf16_state(self, n, rng):
    m = np.exp2(rng.uniform(0.0, 1.0, n))
    e = rng.integers(-10, 10, n)
    v = (m * np.exp2(e)).astype(np.float32)
    return v.astype(ml_dtypes.bfloat16).astype(np.float32)

  def test_bf16_nearest_rounding_stalls_as_predicted(self):
    rng = np.random.default_rng(1)
    n, b2 = 400_000, 0.999
    v = self._bf16_state(n, rng)
    z = rng.chisquare(1, n).astype(np.float32)
    new = (b2 * v + (1 - b2) * v * z).astype(np.float32)
    stored = new.astype(ml_dtypes.bfloat16).astype(np.float32)
    self.assertAlmostEqual(np.mean(stored == v),
                           theory.stall_probability('bf16', b2), delta=0.01)

  def test_bf16_stochastic_rounding_stalls_as_predicted(self):
    rng = np.random.default_rng(2)
    n, b2 = 400_000, 0.999
    v = self._bf16_state(n, rng)
    z = rng.chisquare(1, n).astype(np.float32)
    new = (b2 * v + (1 - b2) * v * z).astype(np.float32)
    noise = rng.integers(0, 1 << 16, n, dtype=np.uint32)
    stored = ((new.view(np.uint32) + noise) & np.uint32(0xFFFF0000)).view(
        np.float32)
    self.assertAlmostEqual(
        np.mean(stored == v),
        theory.stall_probability('bf16', b2, 'stochastic'), delta=0.01)


class PropertiesTest(parameterized.TestCase):

  @parameterized.parameters('nearest', 'stochastic')
  def test_stalling_grows_with_b2_and_coarser_formats(self, rounding):
    b2s = (0.9, 0.95, 0.99, 0.995, 0.999, 0.9999)
    for fmt in ('bf16', 'fp16', 'fp8_e4m3', 'e3m4'):
      p = [theory.stall_probability(fmt, b2, rounding) for b2 in b2s]
      self.assertTrue(np.all(np.diff(p) > 0), msg=(fmt, p))
    fmts = ('fp16', 'e5m8', 'bf16', 'e4m5', 'fp8_e4m3', 'fp4', 'e3m1')
    p = [theory.stall_probability(f, 0.99, rounding) for f in fmts]
    self.assertTrue(np.all(np.diff(p) > 0), msg=p)
    self.assertTrue(all(0.0 <= x <= 1.0 for x in p))

  def test_stochastic_rounding_moves_more_at_large_ratio(self):
    for fmt in PAPER_FORMATS:
      self.assertLess(theory.stall_probability(fmt, 0.999, 'stochastic'),
                      theory.stall_probability(fmt, 0.999, 'nearest'))

  def test_asymptotic_forms_agree_at_large_ratio(self):
    for rounding, tol in (('nearest', 1e-12), ('stochastic', 1e-9)):
      for fmt in ('fp8_e4m3', 'fp4'):
        self.assertAlmostEqual(
            theory.stall_probability(fmt, 0.999, rounding),
            theory.stall_probability(fmt, 0.999, rounding, asymptotic=True),
            delta=tol)

  @parameterized.parameters('bf16', 'fp16', 'fp8_e4m3', 'fp4')
  def test_transient_builds_up_to_steady_state(self, fmt):
    j = np.arange(0, 20_000)
    p = theory.transient_stall_probability(fmt, j, 0.999)
    self.assertEqual(p.shape, j.shape)
    self.assertEqual(p[0], 0.0)
    self.assertTrue(np.all(np.diff(p) >= 0))
    self.assertAlmostEqual(p[-1], theory.stall_probability(fmt, 0.999),
                           places=6)
    floored = theory.transient_stall_probability(fmt, j, 0.999, p_init=0.3)
    np.testing.assert_allclose(floored, 0.3 + 0.7 * p)
    self.assertIsInstance(theory.transient_stall_probability(fmt, 5), float)

  def test_transient_is_not_a_rescaled_ratio(self):
    # Substituting rho -> rho phi_j would be wrong: the interval is centred at
    # z = phi_j and scaled by phi_j.
    rho = theory.effective_precision_ratio('bf16')
    phi = 1 - 0.999**100
    expected = math.erf(math.sqrt(phi * (1 + rho) / 2))
    self.assertAlmostEqual(
        theory.transient_stall_probability('bf16', 100), expected, places=12)

  @parameterized.parameters(
      ('bf16', 0.0), ('bf16', 0.17), ('fp8_e4m3', 0.0), ('fp8_e4m3', 0.53),
      ('fp4', 0.0), ('fp16', 0.0), ('e5m4', 0.1),
  )
  def test_startup_window_is_first_crossing(self, fmt, p_init):
    for b2 in (0.99, 0.999):
      steady = p_init + (1 - p_init) * theory.stall_probability(fmt, b2)
      for p0 in (0.05, 0.2, 0.5, 0.8, 0.9, 0.95, 0.99):
        j = theory.startup_window(fmt, b2, p0, p_init=p_init)
        if p0 >= steady:
          self.assertIsNone(j)
          continue
        p = theory.transient_stall_probability(fmt, [max(j - 1, 0), j], b2,
                                               p_init=p_init)
        self.assertGreaterEqual(p[1], p0 - 1e-12, msg=(fmt, b2, p0))
        if j > 0:
          self.assertLess(p[0], p0, msg=(fmt, b2, p0))

  def test_startup_window_grows_with_tolerance(self):
    for fmt in PAPER_FORMATS:
      w = [theory.startup_window(fmt, 0.999, p0) for p0 in (0.3, 0.6, 0.9)]
      self.assertEqual(w, sorted(w))

  @parameterized.parameters(
      ('bf16', 0.999), ('fp8_e4m3', 0.999), ('fp4', 0.999), ('bf16', 0.95),
      ('fp16', 0.999), ('fp8_e5m2', 0.99),
  )
  def test_reset_period_is_first_crossing(self, fmt, b2):
    for asymptotic in (False, True):
      k = theory.reset_period(fmt, b2, asymptotic=asymptotic)
      staleness = [
          theory.cycle_staleness(fmt, kk, b2, asymptotic=asymptotic)
          for kk in (k - 1, k)
      ]
      error = theory.statistical_error(np.array([k - 1, k]), b2)
      self.assertGreaterEqual(staleness[1], error[1])
      self.assertLess(staleness[0], error[0])

  def test_reset_period_ordering(self):
    # Coarser formats reset sooner; larger b2 and larger s0 reset later.
    k = [theory.reset_period(f) for f in ('fp16', 'bf16', 'fp8_e4m3', 'fp4',
                                          'e3m1')]
    self.assertEqual(k[1:], sorted(k[1:], reverse=True))
    for fmt in PAPER_FORMATS:
      k = [theory.reset_period(fmt, b2) for b2 in (0.99, 0.995, 0.999, 0.9999)]
      self.assertEqual(k, sorted(k))
      k = [theory.reset_period(fmt, 0.999, s0) for s0 in (0.2, 0.5, 0.8)]
      self.assertEqual(k, sorted(k))

  def test_reset_period_for_b2_close_to_one(self):
    k = theory.reset_period('bf16', 0.99999)
    self.assertGreater(k, theory.reset_period('bf16', 0.9999))
    with self.assertRaisesRegex(ValueError, 'max_period'):
      theory.reset_period('bf16', 0.99999, max_period=1000)

  def test_statistical_error_and_sample_size(self):
    b2 = 0.999
    k = np.arange(1, 10_000)
    n = theory.effective_sample_size(k, b2)
    e = theory.statistical_error(k, b2)
    self.assertEqual(theory.effective_sample_size(1, b2), 1.0)
    self.assertTrue(np.all(np.diff(n) > 0) and np.all(np.diff(e) < 0))
    n_inf = (1 + b2) / (1 - b2)
    np.testing.assert_allclose(e, 1 - n / n_inf, rtol=1e-9, atol=1e-12)
    # N_stat is 1 / sum(w^2) with w_t = (1 - b2) b2**(K - t) / (1 - b2**K).
    for kk in (1, 7, 500):
      w = (1 - b2) * b2 ** np.arange(kk) / (1 - b2**kk)
      self.assertAlmostEqual(theory.effective_sample_size(kk, b2),
                             1 / np.sum(w**2), places=6)

  def test_cycle_staleness_nondecreasing(self):
    s = [theory.cycle_staleness('bf16', k) for k in (1, 10, 100, 1000, 10_000)]
    self.assertEqual(s, sorted(s))
    self.assertEqual(s[0], 0.0)
    self.assertLess(s[-1], 1.0)


class ArgumentErrorsTest(parameterized.TestCase):

  @parameterized.parameters(0.0, 1.0, -0.5, 1.5, float('nan'), '0.6', True)
  def test_bad_s0(self, s0):
    with self.assertRaisesRegex(ValueError, r's0 must .*\(0, 1\)'):
      theory.reset_period('bf16', 0.999, s0)
    with self.assertRaisesRegex(ValueError, r's0 must .*\(0, 1\)'):
      theory.cycle_staleness('bf16', 10, 0.999, s0)

  @parameterized.parameters(0.0, 1.0, -0.1, 1.001, float('nan'),
                            float('inf'), '0.999', None, ([0.9],))
  def test_bad_b2(self, b2):
    for fn in (
        lambda: theory.effective_precision_ratio('bf16', b2),
        lambda: theory.stall_probability('bf16', b2),
        lambda: theory.transient_stall_probability('bf16', 1, b2),
        lambda: theory.startup_window('bf16', b2),
        lambda: theory.reset_period('bf16', b2),
        lambda: theory.effective_decay('bf16', b2),
        lambda: theory.statistical_error(1, b2),
        lambda: theory.effective_sample_size(1, b2),
    ):
      with self.assertRaisesRegex(ValueError, r'b2 must .*\(0, 1\)'):
        fn()

  def test_traced_b2(self):
    import jax  # pylint: disable=g-import-not-at-top

    @jax.jit
    def f(b2):
      return theory.reset_period('bf16', b2)

    with self.assertRaisesRegex(ValueError, 'b2 must be a concrete'):
      f(0.999)

  @parameterized.parameters('floor', 'NR', 'Nearest', None, 1)
  def test_bad_rounding(self, rounding):
    with self.assertRaisesRegex(
        ValueError, r"rounding must be one of \('nearest', 'stochastic'\)"):
      theory.stall_probability('bf16', 0.999, rounding)
    with self.assertRaisesRegex(ValueError, 'rounding must be one of'):
      theory.effective_decay('bf16', 0.999, rounding)

  @parameterized.parameters(-1, 1.5, 'a', ([1, -2],), (np.array([0.5]),),
                            True)
  def test_bad_steps(self, j):
    with self.assertRaisesRegex(ValueError, 'j must be'):
      theory.transient_stall_probability('bf16', j)

  @parameterized.parameters(0, -3, 2.5)
  def test_bad_period_and_age(self, k):
    with self.assertRaisesRegex(ValueError, 'period must be'):
      theory.cycle_staleness('bf16', k)
    with self.assertRaisesRegex(ValueError, 'age must be'):
      theory.statistical_error(k)
    with self.assertRaisesRegex(ValueError, 'max_period must be'):
      theory.reset_period('bf16', max_period=k)

  @parameterized.parameters(0.0, 1.0, -0.2, 2.0)
  def test_bad_p0(self, p0):
    with self.assertRaisesRegex(ValueError, r'p0 must .*\(0, 1\)'):
      theory.startup_window('bf16', 0.999, p0)

  @parameterized.parameters(1.0, -0.1, 1.5, 'x')
  def test_bad_p_init(self, p_init):
    with self.assertRaisesRegex(ValueError, r'p_init must .*\[0, 1\)'):
      theory.startup_window('bf16', 0.999, 0.5, p_init=p_init)
    with self.assertRaisesRegex(ValueError, r'p_init must .*\[0, 1\)'):
      theory.transient_stall_probability('bf16', 3, p_init=p_init)


class LimitsAndNumpyTest(parameterized.TestCase):
  """Huge, non-finite and NumPy arguments: a clear error or the same value."""

  def test_huge_period_is_rejected_not_allocated(self):
    # Regression: cycle_staleness('bf16', 10**9) allocated until killed.
    for period in (10**9, 10**30, 1e300):
      with self.assertRaisesRegex(
          ValueError, r'period must be an integer in \[1, 10\*\*8\]'):
        theory.cycle_staleness('bf16', period)
    with self.assertRaisesRegex(
        ValueError, r'max_period must be an integer in \[1, 10\*\*8\]'):
      theory.reset_period('bf16', max_period=10**9)

  def test_large_periods_in_constant_memory(self):
    # The terms become constant once b2**j underflows against 1; the sum up
    # to there is chunked, the rest is one product.
    k = 100_000  # More than one chunk, and past the flat point at b2=0.999.
    j = np.arange(1, k + 1)
    for fmt, b2 in (('bf16', 0.999), ('fp8_e4m3', 0.9), ('fp16', 0.99999)):
      direct = np.mean(theory._normalized_excess(
          theory.effective_precision_ratio(fmt, b2), b2, 0.6, j, False))
      self.assertAlmostEqual(theory.cycle_staleness(fmt, k, b2), direct,
                             places=12)
    s = theory.cycle_staleness('bf16', 10**8)
    self.assertGreater(s, theory.cycle_staleness('bf16', 10**6))
    self.assertLessEqual(s, 1.0)

  @parameterized.parameters(10**30, 2**60, float('inf'), float('nan'),
                            1e300, -(2**70), ([1, 2**70],), ([1, None],),
                            np.bool_(True), 1 + 2j)
  def test_bad_step_counts(self, value):
    with self.assertRaisesRegex(ValueError, 'age must be an integer'):
      theory.statistical_error(value)
    with self.assertRaisesRegex(ValueError, 'j must be an integer'):
      theory.transient_stall_probability('bf16', value)

  @parameterized.parameters(24, 10**6, np.int64(-1))
  def test_mantissa_bits_out_of_range(self, mbits):
    with self.assertRaisesRegex(ValueError, r'mantissa_bits.*\[0, 23\]'):
      theory.reset_period(_Fmt('custom', mbits))

  @parameterized.parameters((np.array([0.999]),), (np.array([[0.999]]),))
  def test_b2_arrays_are_not_scalars(self, b2):
    with self.assertRaisesRegex(ValueError, r'b2 must be a real number'):
      theory.reset_period('bf16', b2)
    with self.assertRaisesRegex(ValueError, r'p_init must be a real number'):
      theory.startup_window('bf16', 0.999, 0.5, p_init=b2 * 0.1)

  def test_numpy_scalars_match_python_numbers(self):
    b2 = float(np.float32(0.999))
    for np_b2 in (np.float32(0.999), np.array(np.float32(0.999))):
      self.assertEqual(theory.reset_period('fp8_e4m3', np_b2),
                       theory.reset_period('fp8_e4m3', b2))
      self.assertEqual(theory.stall_probability('bf16', np_b2),
                       theory.stall_probability('bf16', b2))
    self.assertEqual(
        theory.startup_window('bf16', np.float64(0.999), np.float32(0.8),
                              p_init=np.float64(0.17)), 464)
    self.assertEqual(theory.cycle_staleness('bf16', np.int64(1116),
                                            s0=np.float64(0.6)),
                     theory.cycle_staleness('bf16', 1116))
    self.assertEqual(theory.reset_period('bf16', max_period=np.int32(2000)),
                     1116)
    self.assertEqual(theory.statistical_error(np.uint16(1000)),
                     theory.statistical_error(1000))
    self.assertEqual(theory.transient_stall_probability('bf16', np.int8(100)),
                     theory.transient_stall_probability('bf16', 100))
    self.assertEqual(theory.format_epsilon(_Fmt('x', np.uint8(3))), 0.125)


class DocstringExamplesTest(absltest.TestCase):

  def test_docstring_examples(self):
    # The examples use the public ``optax_q.<name>`` spelling; run them
    # against this module so they are checked whatever the package exports.
    public = types.ModuleType('optax_q')
    public.__dict__.update(
        {k: v for k, v in vars(theory).items() if not k.startswith('_')})
    with mock.patch.dict(sys.modules, {'optax_q': public}):
      result = doctest.testmod(theory, verbose=False, report=True)
    self.assertGreater(result.attempted, 10)
    self.assertEqual(result.failed, 0)


if __name__ == '__main__':
  absltest.main()
