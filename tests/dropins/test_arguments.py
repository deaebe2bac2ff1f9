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
"""Bad arguments fail early and clearly: a table over the public API.

Each row of ``CASES`` calls one public function of ``optax_q`` with one bad
argument (the others good). It must raise a ValueError or TypeError in that
call (the construction of a transform, never its ``init`` or ``update``),
and the message must name the argument. ``GOOD`` lists arguments that must
still be accepted (NumPy scalars, jax scalars, schedules): each builds and
runs one jitted update.

``python tests/dropins/test_arguments.py`` prints how many rows there are and how
many of them raise a clear early error.
"""

import dataclasses
import re
from typing import Any, Callable

from absl.testing import absltest
from absl.testing import parameterized
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp
import numpy as np
import optax

import helpers
import optax_q

_X = jnp.linspace(-1.0, 1.0, 256).reshape(2, 128)
_PARAMS = {'w': jnp.linspace(-1.0, 1.0, 4 * 256).reshape(4, 256)}


def _param_shardings():
  mesh = jax.make_mesh((1,), ('data',))
  return {'w': NamedSharding(mesh, P())}


# Each public function, called with good arguments and ``**kw`` over them.
BUILDERS: dict[str, Callable[..., Any]] = {
    'adam': lambda **kw: optax_q.adam(**{'learning_rate': 1e-3, **kw}),
    'adamw': lambda **kw: optax_q.adamw(**{'learning_rate': 1e-3, **kw}),
    'lion': lambda **kw: optax_q.lion(**{'learning_rate': 1e-3, **kw}),
    'sgd': lambda **kw: optax_q.sgd(
        **{'learning_rate': 1e-3, 'momentum': 0.9, **kw}),
    # Without momentum there is no state, but the arguments still count.
    'sgd(momentum=None)': lambda **kw: optax_q.sgd(
        **{'learning_rate': 1e-3, **kw}),
    'quantize_state': lambda **kw: optax_q.quantize_state(
        **{'inner': optax.scale_by_adam(), **kw}),
    'quantize': lambda **kw: optax_q.quantize(
        **{'x': _X, 'fmt': 'int8', 'rounding': 'stochastic', **kw}),
    'dequantize': lambda **kw: optax_q.dequantize(
        **{'q': optax_q.quantize(_X, 'int8'), **kw}),
    'get_format': lambda **kw: optax_q.get_format(**kw),
    'unsigned_variant': lambda **kw: optax_q.unsigned_variant(**kw),
    'in_preconditioner_space': lambda **kw: optax_q.in_preconditioner_space(
        **{'fmt': 'ue4m0', 'eps': 1e-8, **kw}),
    'state_bits_per_element': lambda **kw: optax_q.state_bits_per_element(
        **{'state': {}, **kw}),
    # Checked by their own modules; only the rows that pass are listed.
    'cycle_staleness': lambda **kw: optax_q.cycle_staleness(
        **{'fmt': 'fp8_e4m3', 'period': 100, **kw}),
    'effective_decay': lambda **kw: optax_q.effective_decay(
        **{'fmt': 'fp8_e4m3', **kw}),
    'effective_precision_ratio': lambda **kw: (
        optax_q.effective_precision_ratio(**{'fmt': 'fp8_e4m3', **kw})),
    'effective_sample_size': lambda **kw: optax_q.effective_sample_size(
        **{'age': 10, **kw}),
    'format_epsilon': lambda **kw: optax_q.format_epsilon(**kw),
    'reset_period': lambda **kw: optax_q.reset_period(
        **{'fmt': 'fp8_e4m3', **kw}),
    'stall_probability': lambda **kw: optax_q.stall_probability(
        **{'fmt': 'fp8_e4m3', **kw}),
    'startup_window': lambda **kw: optax_q.startup_window(
        **{'fmt': 'fp8_e4m3', **kw}),
    'statistical_error': lambda **kw: optax_q.statistical_error(
        **{'age': 10, **kw}),
    'transient_stall_probability': lambda **kw: (
        optax_q.transient_stall_probability(
            **{'fmt': 'fp8_e4m3', 'j': 3, **kw})),
    'reset_state': lambda **kw: optax_q.reset_state(
        **{'inner': optax.scale_by_adam(), **kw}),
    'state_shardings': lambda **kw: optax_q.state_shardings(
        **{'state': {}, 'param_shardings': _param_shardings(), **kw}),
}


@dataclasses.dataclass(frozen=True)
class Case:
  """One bad argument of one public function."""

  func: str  # A key of BUILDERS.
  arg: str  # The bad argument; the error message must name it.
  kind: str  # What is wrong with it.
  value: Any

  @property
  def name(self) -> str:
    return re.sub(r'\W+', '_', f'{self.func}_{self.arg}_{self.kind}')

  def call(self) -> Any:
    return BUILDERS[self.func](**{self.arg: self.value})


def problem(case: Case) -> str | None:
  """Why ``case`` gives no clear early error, or None if it does."""
  try:
    case.call()
  except (ValueError, TypeError) as e:
    if re.search(rf'\b{re.escape(case.arg)}\b', str(e)):
      return None
    return f'the message does not name {case.arg!r}: {e}'
  except Exception as e:  # pylint: disable=broad-except
    return f'{type(e).__name__} (not ValueError or TypeError): {e}'
  return 'no error'


def _rows(funcs, args, values: dict[str, Any]) -> list[Case]:
  return [Case(f, a, kind, v) for f in funcs for a in args
          for kind, v in values.items()]


def _without(values: dict[str, Any], *kinds: str) -> dict[str, Any]:
  assert set(kinds) <= set(values), set(kinds) - set(values)
  return {k: v for k, v in values.items() if k not in kinds}


_WRONG_TYPES = {'str': '0.5', 'None': None, 'list': [0.5], 'bool': True,
                'dict': {'a': 0.5}}
# Real hyperparameters >= 0 (learning_rate, eps, weight_decay).
NONNEGATIVE = dict(
    _WRONG_TYPES, negative=-1e-3, nan=float('nan'), inf=float('inf'),
    minus_inf=float('-inf'), huge=10**400, numpy_nan=np.float32('nan'),
    numpy_negative=np.float64(-1.0), numpy_inf=np.array(np.inf),
    vector=np.array([1e-3, 1e-3]), complex=1e-3 + 1j)
# Decay rates in [0, 1) (b1, b2, momentum).
UNIT = dict(
    _WRONG_TYPES, negative=-0.1, one=1.0, above_one=1.5, nan=float('nan'),
    inf=float('inf'), huge=10**400, numpy_one=np.float32(1.0),
    numpy_nan=np.float64('nan'), vector=np.array([0.9]))


def _ints(low: int, high: int | None = None) -> dict[str, Any]:
  """Bad values of an int argument in ``[low, high]``."""
  out = {'str': '8', 'None': None, 'list': [8], 'bool': True,
         'below': low - 1, 'float': 8.5, 'integral_float': 8.0,
         'numpy_float': np.float32(8.0), 'nan': float('nan'),
         'inf': float('inf'), 'vector': np.array([8, 8])}
  if high is not None:
    out.update(above=high + 1, huge=2**64, numpy_above=np.uint64(high + 1))
  return out


SEED = _ints(0, 2**32 - 1)  # Hashed as uint32: seed, step, stream.
BLOCK_SIZE = dict(_ints(2, 2**20), zero=0, odd=65, negative=-128,
                  huge=2**40)
MIN_SIZE = _ints(0)
TILE_SIZE = _without(_ints(1), 'None')  # None turns tiling off.
BOOL = {'str': 'yes', 'None': None, 'int': 1, 'list': [True]}
ROUNDING = {'unknown': 'floor', 'None': None, 'int': 1,
            'list': ['nearest'], 'array': jnp.zeros(2)}
SCALE = {'unknown': 'col', 'int': 1, 'list': ['block']}  # None: default.
FORMAT = {'unknown': 'fp7', 'int': 3, 'nan': float('nan'),
          'list': ['int8'], 'simulated_range': 'e9m3'}
OPTIMIZERS = ('adam', 'adamw', 'lion', 'sgd')
_INTEGRAL = ('integral_float', 'numpy_float')
WRAPPED = OPTIMIZERS + ('sgd(momentum=None)', 'quantize_state')

CASES: list[Case] = (
    # The drop-in optimizers.
    _rows(OPTIMIZERS + ('sgd(momentum=None)',), ['learning_rate'],
          NONNEGATIVE)
    + _rows(('adam', 'adamw'), ['eps', 'eps_root'], NONNEGATIVE)
    + _rows(('adamw', 'lion'), ['weight_decay'], NONNEGATIVE)
    + _rows(('adam', 'adamw', 'lion'), ['b1', 'b2'], UNIT)
    + _rows(('sgd',), ['momentum'], _without(UNIT, 'None'))
    + _rows(OPTIMIZERS + ('sgd(momentum=None)',), ['mu_format'],
            dict(FORMAT, unsigned='fp4_e2m2u'))  # None keeps float32.
    + _rows(('adam', 'adamw'), ['nu_format'], FORMAT)
    + _rows(('adam', 'adamw', 'sgd', 'sgd(momentum=None)'), ['nesterov'],
            BOOL)
    + _rows(OPTIMIZERS + ('sgd(momentum=None)',), ['track_stalls'], BOOL)
    # Storage arguments, shared by the optimizers and quantize_state (None
    # stands for the default of the layout arguments, so that it is static
    # under optax.inject_hyperparams).
    + _rows(WRAPPED, ['seed'], _without(SEED, 'None'))
    + _rows(WRAPPED, ['block_size'], _without(BLOCK_SIZE, 'None'))
    + _rows(WRAPPED, ['min_size'], _without(MIN_SIZE, 'None'))
    + _rows(WRAPPED, ['rounding'], ROUNDING)
    # quantize_state.
    + _rows(('quantize_state',), ['inner'],
            {'None': None, 'int': 3, 'str': 'adam',
             'factory': optax.scale_by_adam})
    + _rows(('quantize_state',), ['formats'],
            dict(_without(FORMAT, 'nan'), mapping_value={'mu': 'fp7'},
                 mapping_key={3: 'int8'}, unknown_field={'nuu': 'int8'},
                 unsigned_field={'mu': 'fp4_e2m2u'}))
    + _rows(('quantize_state',), ['tile_size'], TILE_SIZE)
    + _rows(('quantize_state',), ['scale_mode', 'scale'], SCALE)
    + _rows(('quantize_state',), ['nonnegative_fields'],
            {'str': 'nu', 'int': 3, 'list_of_ints': [1]})
    + _rows(('quantize_state',), ['track_stalls', 'elementwise'], BOOL)
    # quantize, dequantize and formats.
    + _rows(('quantize',), ['x'],
            {'None': None, 'str': 'abc', 'complex': jnp.ones(4, jnp.complex64),
             'object': object()})
    + _rows(('quantize',), ['fmt'], {**FORMAT, 'None': None})
    + _rows(('quantize',), ['scale_mode', 'scale'], SCALE)
    + _rows(('quantize',), ['block_size'], BLOCK_SIZE)
    + _rows(('quantize',), ['rounding'], ROUNDING)
    + _rows(('quantize',), ['seed', 'step', 'stream'], SEED)
    + _rows(('quantize',), ['step'],
            {'float_array': jnp.float32(3.0), 'jax_vector': jnp.arange(2)})
    + _rows(('dequantize',), ['q'], {'None': None, 'array': _X})
    + _rows(('dequantize',), ['dtype'],
            {'int': 'int8', 'unknown': 'nope', 'number': 3})
    + _rows(('get_format', 'unsigned_variant'), ['fmt'],
            {**FORMAT, 'None': None})
    + _rows(('in_preconditioner_space',), ['fmt'],
            {**FORMAT, 'None': None, 'float_grid': 'fp8_e4m3'})
    + _rows(('in_preconditioner_space',), ['eps'], NONNEGATIVE)
    + _rows(('quantize_state',), ['preconditioner'],
            {'list': [1e-8], 'negative': {'nu': -1.0}, 'key': {3: 1e-8},
             'nan': {'nu': float('nan')}, 'unknown_field': {'nuu': 1e-8}})
    + _rows(('quantize_state',), ['rounding'],
            {'undeclared': 'preconditioner',
             'undeclared_field': {'nu': 'preconditioner'}})
    + _rows(('state_bits_per_element',), ['quantized_only'], BOOL)
    # Checked by their own modules: the rows that already pass (their
    # integer arguments also take integral floats).
    + _rows(('cycle_staleness',), ['period'],
            _without(MIN_SIZE, 'list', 'vector', *_INTEGRAL))
    + _rows(('cycle_staleness', 'reset_period'), ['b2', 's0'],
            _without(UNIT, 'huge', 'vector'))
    + _rows(('effective_decay', 'effective_precision_ratio',
             'stall_probability', 'startup_window', 'statistical_error',
             'effective_sample_size', 'transient_stall_probability'), ['b2'],
            _without(UNIT, 'huge', 'vector'))
    + _rows(('cycle_staleness', 'effective_decay', 'effective_precision_ratio',
             'format_epsilon', 'reset_period', 'stall_probability',
             'startup_window', 'transient_stall_probability'), ['fmt'],
            _without(FORMAT, 'nan'))
    + _rows(('effective_decay', 'stall_probability'), ['rounding'],
            _without(ROUNDING, 'array'))
    + _rows(('effective_sample_size', 'statistical_error'), ['age'],
            _without(MIN_SIZE, 'list', 'vector', *_INTEGRAL))
    + _rows(('transient_stall_probability',), ['j'],
            _without(MIN_SIZE, 'list', 'vector', *_INTEGRAL))
    + _rows(('reset_period',), ['max_period'],
            _without(_ints(1), 'list', 'vector'))
    + _rows(('startup_window',), ['p0'], _without(UNIT, 'huge', 'vector'))
    + _rows(('reset_state',), ['reset_every', 'every'],
            _without(_ints(1), 'None', 'vector'))
    + _rows(('reset_state',), ['decay', 's0'],
            _without(UNIT, 'huge', 'vector'))
    + _rows(('state_shardings',), ['param_shardings'],
            {'None': None, 'int': 3, 'not_shardings': {'w': 3}})
)
NAMES = [c.name for c in CASES]
assert len(set(NAMES)) == len(NAMES), 'duplicate case names'


def count() -> tuple[int, int]:
  """(rows of CASES, rows that raise a clear early error)."""
  return len(CASES), sum(problem(c) is None for c in CASES)


# Good arguments: (builder, kwargs). NumPy scalars wherever Python numbers
# are accepted; jax scalars and schedules where Optax accepts them.
_NP_FLOATS = dict(learning_rate=np.float32(1e-3), b1=np.float64(0.9),
                  b2=np.array(0.99, np.float32))
_NP_STORAGE = dict(block_size=np.int32(64), seed=np.uint32(2**32 - 1),
                   min_size=np.int64(0))
GOOD = [
    ('adamw', dict(_NP_FLOATS, eps=np.float32(1e-8), eps_root=np.float16(0),
                   weight_decay=np.array(1e-4), **_NP_STORAGE)),
    ('adamw', dict(learning_rate=jnp.float32(1e-3), b1=jnp.float32(0.9),
                   b2=jnp.asarray(0.999), eps=jnp.float32(1e-8),
                   weight_decay=jnp.float32(1e-4), min_size=0)),
    ('adamw', dict(learning_rate=optax.linear_schedule(1e-3, 0.0, 10),
                   weight_decay=optax.constant_schedule(1e-4), min_size=0)),
    ('adamw', dict(learning_rate=1, b1=0, b2=0, eps=0, eps_root=0,
                   weight_decay=0, block_size=2, seed=2**32 - 1,
                   min_size=0, nesterov=np.bool_(True))),
    ('adamw', dict(learning_rate=1e-3, reset_every=10, b2=np.float32(0.99),
                   block_size=np.int64(64), min_size=np.array(0))),
    ('adam', dict(_NP_FLOATS, eps=np.float64(1e-8), **_NP_STORAGE)),
    ('lion', dict(_NP_FLOATS, weight_decay=np.float32(1e-3), **_NP_STORAGE)),
    ('lion', dict(learning_rate=optax.cosine_decay_schedule(1e-3, 10),
                  weight_decay=jnp.float32(1e-3), min_size=0)),
    ('sgd', dict(learning_rate=np.float32(1e-2), momentum=np.float32(0.9),
                 nesterov=np.bool_(True), **_NP_STORAGE)),
    ('sgd', dict(learning_rate=jnp.float32(1e-2), momentum=jnp.float32(0.9),
                 min_size=0)),
    ('sgd(momentum=None)', dict(learning_rate=np.float64(1e-2),
                                **_NP_STORAGE)),
    ('quantize_state', dict(formats='int8', seed=np.int64(7),
                            min_size=np.int32(0), block_size=np.int16(64),
                            tile_size=np.int64(256), elementwise=True,
                            track_stalls=np.bool_(True))),
    ('quantize_state', dict(formats={'mu': 'fp8_e4m3', 'nu': 'int4'},
                            seed=2**32 - 1, min_size=0, tile_size=None)),
]


class BadArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters((c.name, c) for c in CASES)
  def test_clear_early_error(self, case):
    self.assertIsNone(problem(case))

  def test_every_public_function_with_checked_arguments_has_rows(self):
    funcs = {c.func.split('(')[0] for c in CASES}
    self.assertContainsSubset(
        {'adam', 'adamw', 'lion', 'sgd', 'quantize_state', 'quantize',
         'dequantize', 'get_format', 'unsigned_variant',
         'state_bits_per_element'}, funcs)
    self.assertContainsSubset(funcs, set(optax_q.__all__))

  def test_count(self):
    n, clear = count()
    self.assertGreater(n, 400)
    self.assertEqual(clear, n)


def _step(tx):
  """init and one jitted update on a quantized-size parameter."""
  state = jax.jit(tx.init)(_PARAMS)
  grads = jax.tree.map(lambda p: 0.1 * p + 0.01, _PARAMS)
  updates, state = jax.jit(tx.update)(grads, state, _PARAMS)
  return updates, state


class GoodArgumentsTest(parameterized.TestCase):

  @parameterized.parameters(*GOOD)
  def test_builds_and_updates(self, func, kwargs):
    updates, _ = _step(BUILDERS[func](**kwargs))
    self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))

  def test_numpy_scalars_match_python_numbers(self):
    plain = dict(learning_rate=1e-3, b1=0.9, b2=0.99, eps=1e-8,
                 weight_decay=1e-4, block_size=64, seed=3, min_size=0)
    numpy = dict(learning_rate=np.float64(1e-3), b1=np.float64(0.9),
                 b2=np.array(0.99), eps=np.float64(1e-8),
                 weight_decay=np.float64(1e-4), block_size=np.int64(64),
                 seed=np.uint32(3), min_size=np.int32(0))
    want, _ = _step(optax_q.adamw(**plain))
    got, _ = _step(optax_q.adamw(**numpy))
    np.testing.assert_array_equal(got['w'], want['w'])

  def test_inject_hyperparams(self):
    static = ('mu_format', 'nu_format', 'rounding', 'block_size', 'seed',
              'min_size')
    tx = optax.inject_hyperparams(optax_q.adamw, static_args=static)(
        learning_rate=np.float32(1e-3), b1=np.float32(0.9),
        b2=optax.constant_schedule(0.99), weight_decay=np.float32(1e-4),
        seed=np.int64(1), block_size=np.int32(64), min_size=0)
    updates, state = _step(tx)
    self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))
    self.assertIn('b2', state.hyperparams)

  def test_hyperparameters_injected_in_bfloat16(self):
    # inject_hyperparams casts numeric hyperparameters to the params' dtype:
    # bfloat16 params give bfloat16 scalars, which construct (b2=0.999
    # becomes 1.0, so the step is NaN, as in optax.adamw; the remedy is
    # hyperparam_dtype=jnp.float32) instead of failing as not numbers.
    params = {'w': jnp.ones((64, 256), jnp.bfloat16)}
    state = optax.inject_hyperparams(optax_q.adamw)(
        learning_rate=1e-3).init(params)
    self.assertEqual(state.hyperparams['eps'].dtype, jnp.bfloat16)
    tx = optax.inject_hyperparams(
        optax_q.adamw, hyperparam_dtype=jnp.float32)(learning_rate=1e-3)
    updates, _ = tx.update(params, tx.init(params), params)
    self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))
    with self.assertRaisesRegex(ValueError, 'eps must be a real number'):
      optax_q.adamw(1e-3, eps=np.array(np.nan, jnp.bfloat16))

  def test_quantize_accepts_numpy_and_traced_integers(self):
    q = optax_q.quantize(_X, np.str_('int8'), rounding='stochastic',
                         block_size=np.int64(64), seed=np.uint32(2**32 - 1),
                         step=np.int32(5), stream=np.array(2))
    self.assertEqual(q.scale.shape, (2, 2))

    @jax.jit
    def encode(x, seed, step):
      q = optax_q.quantize(x, 'int8', rounding='stochastic', seed=seed,
                           step=step)
      return optax_q.dequantize(q, jnp.bfloat16)

    y = encode(_X, jnp.uint32(2**32 - 1), jnp.int32(5))
    self.assertEqual(y.dtype, jnp.bfloat16)
    y = optax_q.dequantize(q, np.dtype('float16'))
    self.assertEqual(y.dtype, jnp.float16)

  def test_formats_by_name(self):
    self.assertEqual(optax_q.unsigned_variant('int4').name, 'int4_unsigned')
    self.assertEqual(optax_q.unsigned_variant('int8_dynamic'),
                     optax_q.unsigned_variant(
                         optax_q.get_format('int8_dynamic')))
    self.assertTrue(optax_q.unsigned_variant('fp8_e4m3').positive_floor)

  def test_telemetry_takes_any_state(self):
    _, state = _step(optax_q.adamw(1e-3, min_size=0, track_stalls=True))
    self.assertGreater(optax_q.state_nbytes(state), 0)
    self.assertLess(optax_q.state_bits_per_element(
        state, quantized_only=np.bool_(True)), 9)
    self.assertLen(optax_q.quantized_leaves(state), 2)
    self.assertLen(optax_q.stall_fraction(state), 2)
    self.assertTrue(optax_q.is_qarray(optax_q.quantize(_X, 'int8')))
    for empty in (None, {}, ()):
      self.assertEqual(optax_q.state_nbytes(empty), 0)
      self.assertEqual(optax_q.quantized_leaves(empty), {})
      self.assertEqual(optax_q.stall_fraction(empty), {})
      self.assertFalse(optax_q.is_qarray(empty))



# Muon's arguments: checked at construction (the dimension numbers against
# the parameters at init, where they are first seen), and accepted as
# optax.inject_hyperparams passes them (numbers as arrays, maybe traced).

_MUON_PARAMS = {'w': jnp.ones((8, 16)), 'b': jnp.ones((16,)),
                'k': jnp.ones((2, 8, 16))}
_DIMS = optax.contrib.MuonDimensionNumbers


class MuonArgumentsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('learning_rate_none', dict(learning_rate=None), 'learning_rate'),
      ('learning_rate_string', dict(learning_rate='1e-3'), 'learning_rate'),
      ('ns_steps_zero', dict(ns_steps=0), 'ns_steps'),
      ('ns_steps_negative', dict(ns_steps=-1), 'ns_steps'),
      ('ns_steps_float', dict(ns_steps=2.5), 'ns_steps'),
      ('ns_steps_bool', dict(ns_steps=True), 'ns_steps'),
      ('ns_steps_float_array', dict(ns_steps=jnp.float32(5)), 'ns_steps'),
      ('ns_steps_zero_array', dict(ns_steps=jnp.int32(0)), 'ns_steps'),
      ('dims_string', dict(muon_weight_dimension_numbers='abc'),
       'muon_weight_dimension_numbers must be None, an '
       'optax.contrib.MuonDimensionNumbers'),
      ('dims_int_leaf', dict(muon_weight_dimension_numbers={'w': 3}),
       r"muon_weight_dimension_numbers\['w'\] is 3"),
      ('dims_same_axis', dict(muon_weight_dimension_numbers=_DIMS(0, 0)),
       'as both reduction and output axes'),
      ('dims_axis_string', dict(muon_weight_dimension_numbers=_DIMS('a', 1)),
       'reduction_axis must be an int or a non-empty sequence'),
      ('dims_no_axes', dict(muon_weight_dimension_numbers=_DIMS((), 1)),
       'reduction_axis must be an int or a non-empty sequence'),
      ('dims_repeated_axis',
       dict(muon_weight_dimension_numbers=_DIMS(1, (0, 0))),
       'output_axis must be an int or a non-empty sequence of distinct'),
      ('options_not_a_dict', dict(muon_options=3), 'muon_options'),
  )
  def test_bad_argument_at_construction(self, kwargs, message):
    with self.assertRaisesRegex(ValueError, message):
      optax_q.muon(**{'learning_rate': 1e-3, **kwargs})

  @parameterized.named_parameters(
      # One MuonDimensionNumbers for every leaf: the 1-D bias too.
      ('rank_1_leaf', _DIMS(), r"parameter \['b'\] of shape \(16,\).*rank "
       '>= 2'),
      ('out_of_range', {'w': _DIMS(0, 2), 'b': None, 'k': None},
       r"\['w'\] of shape \(8, 16\).*axes \[2\] are out of range"),
      ('same_axis_once_normalised',
       {'w': None, 'b': None, 'k': _DIMS(-1, 2)},
       r"\['k'\] of rank 3 the axes \[2\] as both"),
      ('callable', lambda params: {'w': _DIMS(0, 5), 'b': None, 'k': None},
       r"muon_weight_dimension_numbers\(params\) gives Muon the parameter "
       r"\['w'\]"),
      ('structure', {'w': _DIMS(), 'x': None}, 'structure of the parameters'),
  )
  def test_dimension_numbers_checked_against_params_at_init(self, dims,
                                                            message):
    tx = optax_q.muon(1e-3, muon_weight_dimension_numbers=dims)
    with self.assertRaisesRegex(ValueError, message):
      tx.init(_MUON_PARAMS)

  def test_good_dimension_numbers_as_optax(self):
    dims = {'w': _DIMS(), 'b': None, 'k': _DIMS(-2, 2)}
    grads = jax.tree.map(lambda p: 0.1 * p, _MUON_PARAMS)
    for given in (dims, lambda params: dims):
      tx = optax_q.muon(1e-3, muon_weight_dimension_numbers=given,
                        mu_format='fp32', adam_mu_format='fp32',
                        adam_nu_format='fp32')
      ref = optax.contrib.muon(1e-3, muon_weight_dimension_numbers=dims)
      got = tx.update(grads, tx.init(_MUON_PARAMS), _MUON_PARAMS)[0]
      want = ref.update(grads, ref.init(_MUON_PARAMS), _MUON_PARAMS)[0]
      jax.tree.map(np.testing.assert_array_equal, got, want)

  def test_injected_and_traced_numbers(self):
    grads = jax.tree.map(lambda p: 0.1 * p, _PARAMS)
    # Every number injected, muon_options passed back as one keyword.
    tx = optax.inject_hyperparams(optax_q.muon)(
        learning_rate=optax.linear_schedule(1e-2, 0.0, 10), ns_steps=3,
        beta=0.9, consistent_rms=0.2)
    updates, state = _step(tx)
    self.assertEqual(int(state.hyperparams['ns_steps']), 3)
    self.assertTrue(bool(jnp.all(jnp.isfinite(updates['w']))))
    # An injected number is checked where it is concrete.
    tx = optax.inject_hyperparams(optax_q.muon)(learning_rate=1e-2,
                                                ns_steps=0)
    with self.assertRaisesRegex(ValueError, 'ns_steps'):
      tx.init(_PARAMS)

    # Traced numbers are accepted as they are.
    @jax.jit
    def update(ns_steps, lr):
      tx = optax_q.muon(lr, ns_steps=ns_steps, min_size=0)
      return tx.update(grads, tx.init(_PARAMS), _PARAMS)[0]

    traced = update(jnp.int32(5), jnp.float32(1e-2))
    plain = optax_q.muon(1e-2, min_size=0)
    want = plain.update(grads, plain.init(_PARAMS), _PARAMS)[0]
    np.testing.assert_allclose(traced['w'], want['w'], rtol=1e-3, atol=1e-6)


# ----------------------------------------------------------------------------
# Public functions added after the table above was written: the same rule
# (a clear ValueError or TypeError in the call, naming the argument).
# ----------------------------------------------------------------------------

_P2 = {'dense': {'kernel': jnp.linspace(-1.0, 1.0, 8 * 256).reshape(8, 256),
                 'bias': jnp.zeros(256)}}


def _qparams():
  return optax_q.quantize_params(_P2, 'int8')


def _adaptive_state():
  return optax_q.adaptive_bits(optax.scale_by_adam(), min_size=0).init(
      {'w': jnp.zeros((8, 256))})


def _adam_state():
  return optax.scale_by_adam().init({'w': jnp.zeros((8, 256))})


def _injected(opt, **kw):
  return optax.inject_hyperparams(opt)(**{'learning_rate': 1e-3, **kw})


_H = jnp.linspace(-1.0, 1.0, 64).reshape(4, 16)
_LAYER = (jnp.tanh, jnp.tanh)

LATER_BUILDERS: dict[str, Callable[..., Any]] = {
    'shampoo': lambda **kw: optax_q.shampoo(**{'learning_rate': 1e-3, **kw}),
    'soap': lambda **kw: optax_q.soap(**{'learning_rate': 1e-3, **kw}),
    'scale_by_shampoo': lambda **kw: optax_q.scale_by_shampoo(**kw),
    'scale_by_soap': lambda **kw: optax_q.scale_by_soap(**kw),
    'adam_with_resets': lambda **kw: optax_q.adam_with_resets(
        **{'reset_every': 100, 'formats': {'mu': 'int8', 'nu': 'int8'},
           **kw}),
    'scale_by_adam_local_age': lambda **kw: (
        optax_q.scale_by_adam_local_age(**kw)),
    'reset_where': lambda **kw: optax_q.reset_where(
        **{'state': _adam_state(), 'where': True, **kw}),
    'adaptive_bits': lambda **kw: optax_q.adaptive_bits(
        **{'inner': optax.scale_by_adam(), **kw}),
    'quantize_gradients': lambda **kw: optax_q.quantize_gradients(**kw),
    'eco': lambda **kw: optax_q.eco(
        **{'inner': _injected(optax.adamw), **kw}),
    # eco reads the inner optimizer's hyperparameters: they are checked too.
    'eco(adamw)': lambda **kw: optax_q.eco(_injected(optax.adamw, **kw)),
    'eco(sgd)': lambda **kw: optax_q.eco(
        _injected(optax.sgd, **{'momentum': 0.9, **kw})),
    'quantize_params': lambda **kw: optax_q.quantize_params(
        **{'params': _P2, **kw}),
    'fake_quantize_params': lambda **kw: optax_q.fake_quantize_params(
        **{'params': _P2, **kw}),
    'dequantize_params': lambda **kw: optax_q.dequantize_params(
        **{'params': _qparams(), **kw}),
    'apply_updates': lambda **kw: optax_q.apply_updates(
        **{'params': _qparams(), **kw}),
    'relayout': lambda **kw: optax_q.relayout(
        **{'state': _adaptive_state(), **kw}),
    'bit_layout': lambda **kw: optax_q.bit_layout(
        **{'state': _adaptive_state(), **kw}),
    'bit_widths': lambda **kw: optax_q.bit_widths(
        **{'state': _adaptive_state(), **kw}),
    'quantized_training': lambda **kw: optax_q.quantized_training(
        **{'formats': 'e4m3', **kw}),
    'quantized_training.optimizer': lambda **kw: (
        optax_q.quantized_training({'v': 'e4m3'}).optimizer(
            **{'tx': optax.adam(1e-3), **kw})),
    # Fidelity.
    'track_fidelity': lambda **kw: optax_q.track_fidelity(
        **{'tx': optax.sgd(0.1), 'reference': optax.sgd(0.1), 'steps': 4,
           **kw}),
    'update_fidelity': lambda **kw: optax_q.update_fidelity(
        **{'updates': _P2, 'reference_updates': _P2, **kw}),
    'weight_distance': lambda **kw: optax_q.weight_distance(
        **{'params': _P2, 'reference_params': _P2, 'initial_params': _P2,
           **kw}),
    'fidelity_summary': lambda **kw: optax_q.fidelity_summary(**kw),
    # optax_q.quant.
    'rtn': lambda **kw: optax_q.quant.rtn(**kw),
    'quest': lambda **kw: optax_q.quant.quest(**kw),
    'Quantizer': lambda **kw: optax_q.quant.Quantizer(**kw),
    'gaussian_clip': lambda **kw: optax_q.quant.gaussian_clip(
        **{'bits': 4, **kw}),
    'hadamard': lambda **kw: optax_q.quant.hadamard(**kw),
    'kurtosis': lambda **kw: optax_q.quant.kurtosis(**{'h': _H, **kw}),
    'kurtosis(rms)': lambda **kw: optax_q.quant.kurtosis(
        **{'h': _H, 'kind': 'rms', **kw}),
    'max_to_median': lambda **kw: optax_q.quant.max_to_median(**kw),
    'max_to_mean': lambda **kw: optax_q.quant.max_to_mean(**kw),
    'error_decomposition': lambda **kw: optax_q.quant.error_decomposition(
        **{'layers': [_LAYER], 'x': _H, **kw}),
    'linear_gain': lambda **kw: optax_q.quant.linear_gain(
        **{'w': jnp.eye(16), 'w_q': jnp.eye(16), 'h': _H, 'hq': _H, **kw}),
    'fit_scaling_law': lambda **kw: optax_q.quant.fit_scaling_law(
        **{'num_params': [1e6, 1e7, 1e8, 1e9],
           'loss': [4.0, 3.5, 3.1, 2.8], **kw}),
    'ptq': lambda **kw: optax_q.quant.ptq(**kw),
    'qat': lambda **kw: optax_q.quant.qat(**kw),
    'quantize_linear': lambda **kw: optax_q.quant.quantize_linear(**kw),
    'LinearQuantization': lambda **kw: optax_q.quant.LinearQuantization(
        **kw),
    # Migration, split weights and numerics checks.
    'from_optax': lambda **kw: optax_q.from_optax(
        **{'optax_state': _adam_state(), 'tx': optax_q.adam(1e-3),
           'params': {'w': jnp.zeros((8, 256))}, **kw}),
    'split_weights': lambda **kw: optax_q.split_weights(
        **{'inner': optax.adam(1e-3), **kw}),
    'split_params': lambda **kw: optax_q.split_params(
        **{'params': _P2, **kw}),
    'master_weights': lambda **kw: optax_q.master_weights(
        **{'params': _P2, 'state': _adam_state(), **kw}),
    'check_numerics': lambda **kw: optax_q.check_numerics(
        **{'params': _P2, 'learning_rate': 1e-3, **kw}),
}


@dataclasses.dataclass(frozen=True)
class LaterCase(Case):
  """A row of ``LATER_CASES`` (built by ``LATER_BUILDERS``)."""

  def call(self) -> Any:
    return LATER_BUILDERS[self.func](**{self.arg: self.value})


def _later(funcs, args, values: dict[str, Any]) -> list[Case]:
  return [LaterCase(f, a, kind, v) for f in funcs for a in args
          for kind, v in values.items()]


_NOT_A_TREE = {'None': None, 'str': 'abc', 'int': 3}
_NOT_A_STATE = dict(_NOT_A_TREE, adam_state=_adam_state())
SECOND_ORDER = ('shampoo', 'soap')
_NOT_A_QUANTIZER = {'str': 'rtn', 'int': 4, 'callable': jnp.tanh}

LATER_CASES: list[Case] = (
    # Shampoo and SOAP.
    _later(SECOND_ORDER, ['learning_rate'], NONNEGATIVE)
    + _later(SECOND_ORDER + ('scale_by_shampoo', 'scale_by_soap'),
             ['b1', 'b2'], _without(UNIT, 'None'))
    + _later(SECOND_ORDER + ('scale_by_shampoo', 'scale_by_soap'), ['eps'],
             _without(NONNEGATIVE, 'None'))
    + _later(SECOND_ORDER, ['weight_decay'], _without(NONNEGATIVE, 'None'))
    + _later(SECOND_ORDER, ['mu_format', 'stats_format', 'eigvecs_format'],
             dict(FORMAT, unsigned='fp4_e2m2u'))
    + _later(SECOND_ORDER, ['nu_format'],
             dict(FORMAT, nf4='nf4', nf3='nf3'))
    + _later(SECOND_ORDER, ['seed'], _without(SEED, 'None'))
    + _later(SECOND_ORDER, ['block_size'], _without(BLOCK_SIZE, 'None'))
    + _later(SECOND_ORDER, ['rounding'], ROUNDING)
    # Resets.
    + _later(('adam_with_resets',), ['reset_every'],
             {'str': '8', 'zero': 0, 'negative': -1, 'float': 8.5})
    + _later(('adam_with_resets', 'scale_by_adam_local_age'), ['b1', 'b2'],
             _without(UNIT, 'None', 'huge', 'vector'))
    + _later(('reset_where',), ['state'], {'None': None, 'str': 'abc'})
    # Adaptive bits.
    + _later(('adaptive_bits',), ['inner'],
             {'None': None, 'int': 3, 'factory': optax.scale_by_adam})
    + _later(('adaptive_bits',), ['period', 'patience'],
             {'str': '8', 'zero': 0, 'negative': -1, 'float': 8.5})
    + _later(('relayout', 'bit_layout', 'bit_widths'), ['state'],
             _NOT_A_STATE)
    + _later(('relayout',), ['layout'], {'str': 'nf4/block', 'list': [1]})
    + _later(('relayout',), ['step'], {'negative': -1, 'str': '3'})
    # Gradient quantization.
    + _later(('quantize_gradients',), ['fmt'], {**FORMAT, 'None': None})
    + _later(('quantize_gradients',), ['rounding'], ROUNDING)
    + _later(('quantize_gradients',), ['seed'], _without(SEED, 'None'))
    + _later(('quantize_gradients',), ['block_size'],
             _without(BLOCK_SIZE, 'None'))
    # Quantized weights and ECO.
    + _later(('quantize_params', 'fake_quantize_params'), ['fmt'],
             {**_without(FORMAT, 'nan'), 'None': None,
              'unsigned': 'fp4_e2m2u'})
    + _later(('quantize_params',), ['fmt'],
             {'fp32': 'fp32', 'float32': 'float32'})
    + _later(('quantize_params', 'fake_quantize_params'), ['filter'],
             {'unknown': 'dense', 'int': 3,
              'returns_str': lambda path, leaf: 'yes',
              'returns_none': lambda path, leaf: None,
              'returns_int': lambda path, leaf: 1})
    + _later(('quantize_params', 'fake_quantize_params'), ['rounding'],
             ROUNDING)
    + _later(('quantize_params', 'fake_quantize_params'), ['seed'],
             _without(SEED, 'None'))
    + _later(('quantize_params',), ['params'], _NOT_A_TREE)
    + _later(('dequantize_params',), ['params'], {'str': 'abc'})
    + _later(('apply_updates',), ['updates'],
             {'None': None, 'other_tree': {'w': jnp.zeros(3)},
              'plain_arrays': _P2})
    + _later(('dequantize_params',), ['dtype'], {'int': 'int8', 'number': 3})
    + _later(('eco',), ['inner'],
             {'None': None, 'plain_adamw': optax.adamw(1e-3),
              'lion': _injected(optax.lion),
              'muon': _injected(optax.contrib.muon),
              'nesterov': _injected(optax.sgd, momentum=0.9, nesterov=True)})
    + _later(('eco',), ['weight_format'],
             {**_without(FORMAT, 'nan'), 'fp32': 'fp32',
              'unsigned': 'fp4_e2m2u'})
    + _later(('eco',), ['rounding'], ROUNDING)
    + _later(('eco',), ['variant'], {'unknown': 'fast', 'None': None})
    + _later(('eco',), ['seed'], _without(SEED, 'None'))
    + _later(('eco(adamw)',), ['b1'], {'zero': 0.0, 'one': 1.0})
    + _later(('eco(adamw)',), ['b2'],
             {'one': 1.0, 'above_one': 1.5, 'negative': -0.1,
              'nan': float('nan')})
    + _later(('eco(adamw)',), ['eps', 'weight_decay'],
             {'negative': -1.0, 'nan': float('nan'), 'inf': float('inf')})
    + _later(('eco(adamw)', 'eco(sgd)'), ['learning_rate'],
             {'negative': -1e-3, 'nan': float('nan')})
    + _later(('eco(sgd)',), ['momentum'],
             {'zero': 0.0, 'one': 1.0, 'negative': -0.5})
    # The four quantized components.
    + _later(('quantized_training',), ['formats'],
             {**_without(FORMAT, 'nan'), 'None': None,
              'unknown_component': {'x': 'e4m3'},
              'unsigned_moment': {'m': 'ue4m0'},
              'nf4_second_moment': {'v': 'nf4'}})
    + _later(('quantized_training',), ['rounding'], ROUNDING)
    + _later(('quantized_training',), ['seed'], _without(SEED, 'None'))
    + _later(('quantized_training',), ['block_size'],
             _without(BLOCK_SIZE, 'None'))
    + _later(('quantized_training.optimizer',), ['tx'],
             {'None': None, 'sgd_without_nu': optax.sgd(1e-3, momentum=0.9),
              'lion_without_nu': optax.lion(1e-3)})
    # Fidelity.
    + _later(('track_fidelity',), ['steps'],
             {'zero': 0, 'negative': -1, 'bool': True, 'float': 4.0,
              'str': '4', 'None': None, 'huge': 2**31})
    + _later(('track_fidelity',), ['tx', 'reference'],
             {'None': None, 'int': 3, 'factory': optax.adamw})
    + _later(('update_fidelity',), ['reference_updates'],
             {'other_tree': {'w': jnp.zeros(3)}, 'None': None})
    + _later(('weight_distance',), ['reference_params', 'initial_params'],
             {'other_tree': {'w': jnp.zeros(3)}, 'None': None})
    + _later(('fidelity_summary',), ['state'], _NOT_A_STATE)
    # optax_q.quant.
    + _later(('rtn', 'quest', 'gaussian_clip'), ['bits'],
             {'one': 1, 'above': 17, 'str': '4', 'float': 4.5, 'None': None})
    + _later(('rtn', 'quest'), ['granularity'], {'unknown': 'col', 'int': 1})
    + _later(('rtn', 'quest', 'gaussian_clip'), ['grid'],
             {'unknown': 'floor', 'int': 1})
    + _later(('quest',), ['hadamard_block'],
             {'odd': 96, 'zero': 0, 'huge': 2**15, 'str': '128'})
    + _later(('Quantizer',), ['method'], {'unknown': 'gptq', 'None': None})
    + _later(('Quantizer',), ['hadamard_block'], {'with_rtn': 128})
    + _later(('hadamard',), ['n'], {'odd': 6, 'zero': 0, 'str': '4'})
    + _later(('kurtosis',), ['kind'], {'unknown': 'pearson', 'None': None})
    + _later(('kurtosis', 'kurtosis(rms)'), ['h'], {'empty': jnp.zeros((0,))})
    # One token: 'flat' takes it (see OneDimensionalTest), 'rms' cannot
    # average a channel over it.
    + _later(('kurtosis(rms)',), ['h'],
             {'one_token': _H[0], 'one_token_2d': _H[:1]})
    + _later(('max_to_median', 'max_to_mean'), ['h'],
             {'scalar': jnp.float32(1.0), 'empty': jnp.zeros((3, 0))})
    + _later(('error_decomposition',), ['layers'],
             {'None': None, 'empty': [], 'not_pairs': [(jnp.tanh,)]})
    + _later(('linear_gain',), ['h'], {'wrong_width': jnp.ones((4, 3))})
    + _later(('fit_scaling_law',), ['loss'],
             {'negative': [4.0, -3.5, 3.1, 2.8], 'short': [4.0, 3.5]})
    + _later(('ptq', 'qat'), ['bits'], {'one': 1, 'str': '4'})
    + _later(('qat',), ['method'], {'unknown': 'gptq'})
    + _later(('quantize_linear', 'LinearQuantization'),
             ['weights', 'activations'], _NOT_A_QUANTIZER)
    + _later(('quantize_linear',), ['enabled'], {'str': 'no', 'int': 2})
    # Migration, split weights and numerics checks.
    + _later(('from_optax',), ['optax_state'], _NOT_A_STATE)
    + _later(('from_optax',), ['tx'],
             {'None': None, 'int': 3, 'factory': optax.adam})
    + _later(('from_optax',), ['count'],
             {'str': '3', 'negative': -1, 'float': 2.5})
    + _later(('split_weights',), ['inner'],
             {'None': None, 'int': 3, 'factory': optax.adam})
    + _later(('split_weights', 'split_params'), ['remainder'],
             {'None': None, 'unknown': 'int4', 'int': 16})
    + _later(('split_weights', 'split_params'), ['filter'],
             {'unknown': 'dense', 'int': 3})
    + _later(('master_weights',), ['state'], _NOT_A_TREE)
    + _later(('check_numerics',), ['learning_rate'],
             _without(NONNEGATIVE, 'None', 'vector'))
    + _later(('check_numerics',), ['eps'],
             _without(NONNEGATIVE, 'None', 'vector'))
    + _later(('check_numerics',), ['rounding'], ROUNDING)
)
LATER_NAMES = [c.name for c in LATER_CASES]
assert len(set(LATER_NAMES)) == len(LATER_NAMES), 'duplicate case names'
assert not set(LATER_NAMES) & set(NAMES), 'case names shared with CASES'

# Public callables without rows, and why.
UNCHECKED = {
    'is_linear_kernel': 'a predicate: any (path, leaf) gives a bool',
    'is_qarray': 'a predicate: any value gives a bool',
    'state_nbytes': 'takes any pytree (0 for no arrays)',
    'stall_fraction': 'takes any pytree ({} without stall counters)',
    'quantized_leaves': 'takes any pytree ({} without QArrays)',
    'relative_error': 'two arrays; shapes are checked by broadcasting',
    'linear_inputs': 'wraps any function',
    'layer_errors': 'wraps any function; its quantization is checked when '
                    'the wrapped function runs',
    'muon': 'its rows are in the Muon block',
    'to_optax': 'takes any pytree (a state with no optax_q nodes comes back '
                'as it is)',
    'upgrade_checkpoint': 'takes any pytree (renames only adaptive-bits '
                          'nodes)',
}


def _public_callables() -> set[str]:
  out = set()
  for module in (optax_q, optax_q.quant):
    for name in module.__all__:
      obj = getattr(module, name)
      if (callable(obj) and not isinstance(obj, type)) or name in (
          'Quantizer', 'LinearQuantization'):
        out.add(name)
  return out


class LaterFunctionsTest(parameterized.TestCase):
  """The bad-input table of the functions added after ``CASES``."""

  @parameterized.named_parameters((c.name, c) for c in LATER_CASES)
  def test_clear_early_error(self, case):
    self.assertIsNone(problem(case))

  def test_every_public_function_has_rows(self):
    covered = {c.func.split('(')[0].split('.')[0]
               for c in CASES + LATER_CASES}
    missing = _public_callables() - covered - set(UNCHECKED)
    self.assertEmpty(missing, f'public functions without rows: {missing}')
    self.assertEmpty(set(UNCHECKED) & covered)


class LaterEarlyChecksTest(absltest.TestCase):
  """Errors that can only come at init or update come there, clearly; and
  what the table's refusals leave accepted."""

  def test_eco_weight_format_checked_at_init_and_update(self):
    params = _qparams()
    tx = optax_q.eco(_injected(optax.adamw), weight_format='fp8_e4m3')
    with self.assertRaisesRegex(ValueError, "weight_format='fp8_e4m3'.*"
                                "'dense/kernel'.*'int8'"):
      tx.init(params)
    # Initialised on the float parameters, it refuses at the first update.
    state = tx.init(_P2)
    with self.assertRaisesRegex(ValueError, "weight_format='fp8_e4m3'.*"
                                "'int8'"):
      tx.update(_P2, state, params)

  def test_eco_says_muon_is_not_supported(self):
    with self.assertRaisesRegex(ValueError, 'Muon') as e:
      optax_q.eco(_injected(optax.contrib.muon))
    self.assertNotIn('build it with optax.inject_hyperparams',
                     str(e.exception))

  def test_optax_apply_updates_names_optax_q_apply_updates(self):
    params = _qparams()
    tx = optax_q.eco(_injected(optax.adamw), weight_format='int8')
    updates, _ = tx.update(_P2, tx.init(params), params)
    with self.assertRaisesRegex(ValueError, r'optax_q\.apply_updates'):
      optax.apply_updates(params, updates)
    new = optax_q.apply_updates(params, updates)
    self.assertEqual(new['dense']['kernel'].fmt.name, 'int8')

  def test_one_token_metrics(self):
    h = _H[1]
    self.assertEqual(float(optax_q.quant.max_to_median(h)),
                     float(optax_q.quant.max_to_median(h[None])))
    self.assertEqual(float(optax_q.quant.max_to_mean(h)),
                     float(optax_q.quant.max_to_mean(h[None])))
    x = np.asarray(h, np.float64)
    d = x - x.mean()
    want = np.mean(d**4) / np.mean(d**2) ** 2 - 3
    self.assertAlmostEqual(float(optax_q.quant.kurtosis(h)), want, places=4)

  def test_second_moment_grids_still_accepted(self):
    for fmt in ('int4', 'ue4m0', 'int4_sqrt', 'fp4_e2m1', 'fp8_e4m3'):
      optax_q.soap(1e-3, nu_format=fmt)
      optax_q.adamw(1e-3, nu_format=fmt)
    optax_q.quantized_training({})  # The float32 baseline.

  def test_relayout_result_assigns_into_an_nnx_optimizer(self):
    model, opt, step = helpers.nnx_adaptive_adamw()

    x = jnp.ones((4, 64))
    step(model, opt, x)
    layout = optax_q.bit_layout(opt.opt_state)
    opt.opt_state = optax_q.relayout(opt.opt_state, {
        k: 'nf3/block' if '/mu/' in k else v for k, v in layout.items()})
    self.assertIn('nf3/block', optax_q.bit_layout(opt.opt_state).values())
    step(model, opt, x)  # Failed: immutable node of type QArray.
    self.assertTrue(bool(jnp.all(jnp.isfinite(model.kernel[...]))))


class ArrayHyperparametersTest(parameterized.TestCase):
  """A non-scalar array hyperparameter broadcast against the parameters
  and failed at the update without naming the argument."""

  @parameterized.named_parameters(
      ('adamw_lr', lambda a: optax_q.adamw(a), 'learning_rate'),
      ('adamw_b1', lambda a: optax_q.adamw(1e-3, b1=a), 'b1'),
      ('lion_weight_decay', lambda a: optax_q.lion(1e-3, weight_decay=a),
       'weight_decay'),
      ('sgd_momentum', lambda a: optax_q.sgd(1e-3, momentum=a), 'momentum'),
      ('muon_lr', lambda a: optax_q.muon(a), 'learning_rate'),
      ('shampoo_lr', lambda a: optax_q.shampoo(a), 'learning_rate'),
      ('soap_b2', lambda a: optax_q.soap(1e-3, b2=a), 'b2'),
  )
  def test_non_scalar_array_refused(self, make, name):
    with self.assertRaisesRegex(ValueError, f'{name} must be a scalar'):
      make(jnp.full((2,), 0.5))
    make(jnp.asarray(0.5))  # A scalar array is a hyperparameter.


if __name__ == '__main__':
  n, clear = count()
  print(f'{n} cases, {clear} raise a clear early error')
