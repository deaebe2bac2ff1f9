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

``python tests/test_arguments.py`` prints how many rows there are and how
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


if __name__ == '__main__':
  n, clear = count()
  print(f'{n} cases, {clear} raise a clear early error')
