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
"""Argument checks shared by every constructor of the library.

Each check takes the argument and its name, returns the value in canonical
form (Python ``int``/``float``/``bool``/``tuple``), and raises a
``ValueError`` that names the argument and the allowed values. Python and
NumPy numbers (0-d NumPy arrays too) are accepted alike; bools are not
numbers. A ``jax.Array`` hyperparameter (as ``optax.inject_hyperparams``
injects it, maybe traced) is accepted unchecked where Optax accepts one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import math
import numbers
import reprlib
import sys
from typing import Any
import warnings

import jax
import jax.numpy as jnp
import numpy as np

ROUNDING_MODES = ('nearest', 'stochastic')
# A stored optimizer state may also round in its preconditioner's space.
STATE_ROUNDING_MODES = ROUNDING_MODES + ('preconditioner',)
SCALE_MODES = ('none', 'tensor', 'row', 'block', 'block_pow2', 'rank1')
# Stochastic-rounding seeds, steps and streams are hashed as uint32.
UINT32_MAX = 2**32 - 1
# A larger block pads every row to it: 2**40 would allocate terabytes.
MAX_BLOCK_SIZE = 2**20
# Ages and periods are int32 counters: a longer period could never be reached.
MAX_PERIOD = 2**31 - 1

STATIC_HINT = (' (Under optax.inject_hyperparams, list it in static_args: it '
               'decides the state layout.)')


def short(value: Any) -> str:
  """A repr of ``value`` short enough for an error message."""
  return reprlib.repr(value)


def bound_str(n: int) -> str:
  """``n`` as ``2**k`` or ``2**k - 1`` where that reads better."""
  for k in range(16, 65):
    if n == 2**k:
      return f'2**{k}'
    if n == 2**k - 1:
      return f'2**{k} - 1'
  return str(n)


def scalar(value: Any) -> Any:
  """A 0-d NumPy array as its NumPy scalar, a floating one of a type NumPy
  does not count as real (bfloat16, the float8 types of ``ml_dtypes``) as
  a ``np.float32``; anything else unchanged."""
  if isinstance(value, np.ndarray) and value.ndim == 0:
    value = value[()]
  if (isinstance(value, np.generic) and not isinstance(value, np.floating)
      and jnp.issubdtype(value.dtype, jnp.floating)):
    return np.float32(value)
  return value


def is_int(value: Any) -> bool:
  """A Python or NumPy int (not a bool)."""
  return (isinstance(value, (int, np.integer))
          and not isinstance(value, (bool, np.bool_)))


class ArgumentTypeError(TypeError, ValueError):
  """An argument of the wrong type: a ``TypeError``, and a ``ValueError``
  as every other bad argument of the library."""


def check_transform(inner: Any, name: str = 'inner') -> Any:
  """An Optax gradient transformation (with ``init`` and ``update``)."""
  if not (callable(getattr(inner, 'init', None))
          and callable(getattr(inner, 'update', None))):
    got = type(inner).__name__
    if callable(inner):
      got = (f'the callable {getattr(inner, "__qualname__", got)} (a '
             'factory? call it first, e.g. optax.adamw(1e-3))')
    raise ArgumentTypeError(
        f'{name} must be an Optax GradientTransformation (with init and '
        f'update), got {got}.')
  return inner


def check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
  """One of the strings ``choices``."""
  if not isinstance(value, str) or value not in choices:
    raise ValueError(f'{name} must be one of {choices}, got {short(value)}.')
  return value


def check_rounding(rounding: Any, name: str = 'rounding', *,
                   modes: tuple[str, ...] = ROUNDING_MODES) -> str:
  """``'nearest'`` or ``'stochastic'`` (or one of ``modes``)."""
  return check_choice(rounding, name, modes)


def check_scale(scale: Any, name: str = 'scale_mode') -> str:
  """A scale mode: ``'none'``, ``'tensor'``, ``'row'``, ``'block'``,
  ``'block_pow2'`` or ``'rank1'``."""
  return check_choice(scale, name, SCALE_MODES)


def check_scale_map(scale: Any, name: str = 'scale_mode') -> Any:
  """A scale mode, or ``{field: scale mode}`` (a mode per state field)."""
  if isinstance(scale, Mapping):
    return check_field_map(scale, name, lambda key, v: check_scale(
        v, f'{name}[{key!r}]'), 'a scale mode or a mapping')
  return check_scale(scale, name)


def check_bool(value: Any, name: str) -> bool:
  """A Python or NumPy bool, as a Python bool."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f'{name} must be a bool, got {short(value)}.')
  return bool(value)


def check_int(value: Any, name: str, *, low: int = 0, high: int | None = None,
              what: str | None = None, traced: bool = False,
              hint: str = '') -> Any:
  """Checks an integer argument: a Python or NumPy int in ``[low, high]``.

  Args:
    value: The argument. Python ints, NumPy integer scalars and 0-d NumPy
      integer arrays are accepted (not bools or floats, even integral ones).
    name: The argument's name, for the error message.
    low: Smallest allowed value.
    high: Largest allowed value, or None for no bound.
    what: What the argument must be, for the error message (by default
      ``'an int >= {low}'`` or ``'an int in [{low}, {high}]'``).
    traced: Also accept a scalar integer ``jax.Array``, traced or not (its
      value is checked where concrete), and return it as it is.
    hint: Added to the message when a ``jax.Array`` is rejected.

  Returns:
    ``value`` as a Python int (or the accepted ``jax.Array``).

  Raises:
    ValueError: naming ``name`` and the allowed values.
  """
  if what is None:
    what = (f'an int >= {low}' if high is None
            else f'an int in [{bound_str(low)}, {bound_str(high)}]')
  want = f'{name} must be {what}'
  if (traced and isinstance(value, jax.Array) and value.shape == ()
      and jnp.issubdtype(value.dtype, jnp.integer)):
    if not isinstance(value, jax.core.Tracer):
      check_int(int(value), name, low=low, high=high, what=what)
    return value
  if not is_int(scalar(value)):
    raise ValueError(f'{want}, got {short(value)}.'
                     + (hint if isinstance(value, jax.Array) else ''))
  n = int(scalar(value))
  if n < low or (high is not None and n > high):
    raise ValueError(f'{want}, got {n}.')
  return n


def check_seed(seed: Any, name: str = 'seed', *, traced: bool = False,
               hint: str = '') -> Any:
  """A stochastic-rounding seed: an int in ``[0, 2**32 - 1]``."""
  return check_int(seed, name, high=UINT32_MAX, traced=traced, hint=hint)


def check_block_size(block_size: Any, name: str = 'block_size') -> int:
  """Elements per block: an even int in ``[2, MAX_BLOCK_SIZE]``."""
  what = f'an even int in [2, {bound_str(MAX_BLOCK_SIZE)}]'
  block_size = check_int(block_size, name, low=2, high=MAX_BLOCK_SIZE,
                         what=what, hint=STATIC_HINT)
  if block_size % 2:
    raise ValueError(f'{name} must be {what}, got {block_size}.')
  return block_size


def _interval(low: float, high: float | None, closed: str) -> str:
  if high is None:
    return ('>= ' if closed[0] == '[' else '> ') + f'{low:g}'
  return f'in {closed[0]}{low:g}, {high:g}{closed[1]}'


def check_number(value: Any, name: str, *, low: float = 0.0,
                 high: float | None = None, closed: str = '[)',
                 schedule: bool = False, concrete: bool = False,
                 hint: str = '') -> Any:
  """Checks a real hyperparameter: finite, in an interval.

  Args:
    value: The argument. Python and NumPy numbers (0-d NumPy arrays too) are
      checked; a ``jax.Array`` (such as a hyperparameter injected by
      ``optax.inject_hyperparams``, maybe traced) is accepted unchecked
      unless ``concrete``, and so is a callable when ``schedule``.
    name: The argument's name, for the error message.
    low: The lower end of the allowed interval.
    high: Its upper end; None for no bound.
    closed: Which ends belong to the interval: ``'[)'`` (the default),
      ``'()'``, ``'(]'`` or ``'[]'``.
    schedule: Whether an Optax schedule (a callable) is allowed.
    concrete: The value is needed as a number now (to compute something at
      construction): a concrete 0-d ``jax.Array`` is checked and converted,
      a traced one is rejected with ``hint``.
    hint: Added to the message for a traced value when ``concrete``.

  Returns:
    A number as a Python float; an array or schedule as it is.

  Raises:
    ValueError: naming ``name`` and the allowed values.
  """
  allowed = _interval(low, high, closed)
  if schedule and callable(value) and not isinstance(value, jax.Array):
    return value
  if isinstance(value, jax.Array):
    if value.ndim:  # Known even when traced; it would broadcast silently.
      raise ValueError(
          f'{name} must be a scalar {allowed}, got an array of shape '
          f'{value.shape}.')
    if not concrete:
      return value
    if isinstance(value, jax.core.Tracer):
      raise ValueError(
          f'{name} must be a concrete real number {allowed}, got a traced '
          f'value.{hint}')
    value = np.asarray(value)
  want = (f'{name} must be a real number {allowed}'
          + (' or an Optax schedule' if schedule else ''))
  x = scalar(value)
  if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
    raise ValueError(
        f'{want}, got {short(value)} of type {type(value).__name__}.')
  try:
    f = float(x)
  except OverflowError:  # An int beyond the float range.
    f = math.inf
  above = f >= low if closed[0] == '[' else f > low
  below = high is None or (f <= high if closed[1] == ']' else f < high)
  if not (math.isfinite(f) and above and below):
    raise ValueError(f'{want}, got {short(value)}.')
  return f


def check_names(value: Any, name: str) -> tuple[str, ...]:
  """A sequence of state field names as a tuple (not a bare string)."""
  if isinstance(value, str):
    raise ValueError(
        f'{name} must be a sequence of state field names, got the string '
        f'{value!r}; write ({value!r},).')
  try:
    out = tuple(value)
  except TypeError:
    out = None
  if out is None or not all(isinstance(f, str) for f in out):
    raise ValueError(
        f'{name} must be a sequence of state field names (str), got '
        f'{short(value)}.')
  return out


def check_field_keys(mapping: Mapping[Any, Any], name: str) -> None:
  """Raises unless every key of ``mapping`` is a string (a field name)."""
  for key in mapping:
    if not isinstance(key, str):
      raise ValueError(
          f'{name} keys must be state field names (str), got {key!r}.')


def check_field_map(value: Any, name: str, check: Any, what: str
                    ) -> dict[str, Any]:
  """``{field: check(field, v)}`` for a mapping keyed by state field names.

  ``what`` says what ``name`` must be when ``value`` is not a mapping.
  """
  if not isinstance(value, Mapping):
    raise ValueError(f'{name} must be {what}, got {short(value)}.')
  check_field_keys(value, name)
  return {key: check(key, v) for key, v in value.items()}


def check_known(name: str, names, known: set[str] | None, kind: str) -> None:
  """Raises if ``names`` holds fields that ``known`` (when given) lacks."""
  if known is None:
    return
  unknown = sorted(set(names) - known)
  if unknown:
    raise ValueError(
        f'{name} names unknown state field(s) {unknown}; the state of '
        f'this transform has {kind} fields {sorted(known)}.')


def check_period(value: Any, name: str, allowed: tuple[str, ...]) -> Any:
  """None, one of the strings ``allowed`` or an int in ``[1, 2**31 - 1]``."""
  value = scalar(value)
  if value is None or (isinstance(value, str) and value in allowed):
    return value
  if not is_int(value) or not 1 <= value <= MAX_PERIOD:
    hint = (' (Under optax.inject_hyperparams, list it in static_args.)'
            if isinstance(value, jax.Array) else '')
    options = ' or '.join(repr(a) for a in allowed)
    raise ValueError(
        f'{name} must be None, an int in [1, 2**31 - 1], or {options}; got '
        f'{short(value)}.{hint}')
  return int(value)


def check_flag(flag: Any, name: str) -> jax.Array:
  """A boolean scalar (Python, NumPy or a possibly traced array)."""
  shape = getattr(flag, 'shape', ())
  dtype = getattr(flag, 'dtype', None)
  ok = (isinstance(flag, (bool, np.bool_)) if dtype is None
        else shape == () and dtype == np.bool_)
  if not ok:
    raise ValueError(
        f'{name} must be a boolean scalar (a bool or a bool array of shape '
        f'()), got {short(flag)}.')
  return jnp.asarray(flag, bool)


def check_groups(groups: Any, known: Sequence[str], name: str = 'groups'
                 ) -> tuple[tuple[str, ...], ...]:
  """Disjoint tuples of names from ``known`` (fields handled together)."""
  what = (f'{name} must be a sequence of tuples of fields to reset together, '
          "e.g. (('mu', 'nu'),)")
  if isinstance(groups, str) or not isinstance(groups, Sequence):
    raise ValueError(f'{what}; got {short(groups)}.')
  out, seen = [], set()
  for g in groups:
    if (isinstance(g, str) or not isinstance(g, Sequence)
        or not all(isinstance(f, str) for f in g)):
      raise ValueError(f'{what}; got the group {short(g)}.')
    unknown = sorted(set(g) - set(known))
    if unknown:
      raise ValueError(
          f'{name} names field(s) {unknown} that are not reset; the fields '
          f'reset are {sorted(known)}.')
    twice = sorted(seen & set(g))
    if twice:
      raise ValueError(f'{name} names field(s) {twice} in more than one group.')
    seen |= set(g)
    out.append(tuple(dict.fromkeys(g)))
  return tuple(out)


_UNSET = object()


def renamed(old_name: str, old_value: Any, new_name: str, new_value: Any,
            default: Any = None) -> tuple[str, Any]:
  """Resolves a renamed keyword argument: ``(name used, value)``.

  ``old_value`` is the value given under the deprecated name (``_UNSET``
  or ``default`` when not given); using it warns with a
  ``DeprecationWarning``. Giving both names is an error.
  """
  if old_value is _UNSET or old_value is default:
    return new_name, new_value
  if new_value is not default:
    raise ValueError(
        f'{old_name} is the deprecated name of {new_name}; pass only '
        f'{new_name}.')
  warn(f'{old_name}= is deprecated; use {new_name}= instead.',
       DeprecationWarning)
  return old_name, old_value


UNSET = _UNSET


def warn(message: str, category: type[Warning] = UserWarning) -> None:
  """``warnings.warn`` at the first caller outside optax_q: the user's line.

  A fixed ``stacklevel`` points at whichever library frame happens to be
  that many calls up (a drop-in, a wrapper, ``optax.inject_hyperparams``
  calling the factory), so the frames of this package are skipped instead.
  """
  frame, level = sys._getframe(1), 2  # pylint: disable=protected-access
  while frame is not None and frame.f_globals.get(
      '__name__', '').partition('.')[0] == 'optax_q':
    frame, level = frame.f_back, level + 1
  warnings.warn(message, category, stacklevel=level)
