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
"""Number formats for optimizer state: the registry behind ``get_format``.

A `Format` says how one value is stored:

* ``kind='float'``: a floating-point grid with ``exponent_bits`` and
  ``mantissa_bits``, stored in a native dtype (``fp32``, ``bf16``, ``fp16``,
  ``fp8_e4m3``, ``fp8_e5m2``) or, for simulated ``e{E}m{M}`` formats, rounded
  to the grid in fp32 and kept in the smallest native container that holds
  the grid exactly (``bfloat16`` when ``E <= 8`` and ``M <= 7``, else
  ``float32``). Simulated formats are reported as the container's bytes.
  Three variants per ``(E, M)``: finite-only (``e{E}m{M}``, every code a
  number, as OCP MX's e2m3 and e3m2), ``e{E}m{M}fn`` (one NaN code, as
  ``float8_e4m3fn``) and ``e{E}m{M}_ieee`` (the top exponent reserved for
  infinities and NaN, as IEEE 754). ``e4m3`` and ``e5m2`` name the native
  fp8 formats (``e4m3fn`` and ``e5m2_ieee`` grids, one byte per value).
* ``kind='int'``: a signed linear integer grid ``{-q, ..., q}`` with
  ``q = 2**(bits-1) - 1`` (``int8``: 127, ``int4``: 7).
* ``kind='codebook'``: a sorted table of values (``fp4_e2m1``,
  ``fp4_e2m2u``, ``int8_dynamic``, and the low-bit codecs: ``nf4``/``nf3``,
  the unsigned power-of-two grids ``ue{E}m{M}``, and the companded grids
  ``int{4,3}_sqrt``, ``int{4,3}_mulaw``, ``int{4,3}_softsign``); a code is
  an index into the table. A codebook rounds linearly in its
  `Format.space` (``'linear'`` unless named ``<codec>@<space>``).

Four-bit codes are packed two per byte and three-bit codes eight per three
bytes (see ``packing.py``), so a 4-bit state really takes half a byte per
element plus its scales, and a 3-bit state three eighths.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import re
import types
from typing import Any

import jax.numpy as jnp
import numpy as np

from optax_q._src.codec import codebooks
from optax_q._src.core import validation

PACKED_BITS = (3, 4)
ROUNDING_SPACES = ('linear', 'sqrt', 'log', 'rsqrt')
ROUNDING_MODES = validation.ROUNDING_MODES
SCALE_MODES = validation.SCALE_MODES
UINT32_MAX = validation.UINT32_MAX


@dataclasses.dataclass(frozen=True)
class Format:
  """A storage format for one state leaf (hashable, static).

  Attributes:
    name: Canonical name, e.g. ``'fp8_e4m3'``.
    kind: ``'float'``, ``'int'`` or ``'codebook'``.
    bits: Bits of one code (the packed width: 4 for 4-bit formats).
    storage_dtype: Name of the dtype the codes are kept in (``'uint8'`` for
      packed 4-bit codes and codebook indices).
    exponent_bits: Exponent bits of a float grid (``None`` otherwise).
    mantissa_bits: Stored mantissa bits of a float grid (``None`` for
      integer and table formats without a mantissa).
    max_value: Largest finite magnitude of the grid (before scaling).
    signed: Whether the grid holds negative values.
    scaled: Whether values are divided by a per-block/row/tensor scale
      before encoding by default.
    table: Sorted grid values for ``kind='codebook'``.
    min_normal: Smallest normal magnitude of a float grid.
    positive_floor: Encode positive inputs to at least the grid's smallest
      positive value (`min_positive`), never to zero. Set by
      [`unsigned_variant`][optax_q.unsigned_variant] for second moments: a
      positive second moment stored as zero makes the next Adam update
      ``m / (sqrt(v) + eps)`` blow up by orders of magnitude (Li et al., 2023).
      Zero inputs (a fresh or reset state) still encode to zero.
    space: Where a codebook's rounding is linear: ``'linear'`` (the value
      itself: stochastic rounding is unbiased in ``x``), ``'sqrt'``
      (``sign(x) sqrt|x|``: storing ``sqrt(v)`` on the grid's square
      roots), ``'log'``, or ``'rsqrt'`` (``-1/sqrt(x)``: rounding chosen by
      its effect on Adam's preconditioner ``1/sqrt(v)``, unbiased there).
      Nearest rounding takes the bracketing value nearer in that space; a
      stochastic one rounds up with probability equal to the fractional
      position in that space. ``'log'`` and ``'rsqrt'`` need a table of
      positive values, unless ``space_offset`` is set.
    space_offset: The ``eps`` of Adam's preconditioner ``1/(sqrt(v) + eps)``
      for ``space='rsqrt'`` (named ``<codec>@rsqrt+<eps>``, made by
      [`in_preconditioner_space`][optax_q.in_preconditioner_space]):
      stochastic rounding is then unbiased in ``-1/(sqrt(v) + eps)`` of the
      stored value ``v`` (scales included), and a grid may hold zero.
    expand: Dynamic range expansion (COAT, Xi et al., 2024; formats
      ``fp8_e4m3_dre`` and ``fp8_e5m2_dre``): each scale group's
      magnitudes, divided by the group's absolute maximum, are raised to a
      per-group power ``k`` before rounding, the largest power of two up to
      4 that keeps the group's range inside the grid's range; ``k``
      is kept in the two low mantissa bits of the group's float32 maximum.
  """

  name: str
  kind: str
  bits: int
  storage_dtype: str
  exponent_bits: int | None = None
  mantissa_bits: int | None = None
  max_value: float = 1.0
  signed: bool = True
  scaled: bool = True
  table: tuple[float, ...] | None = None
  min_normal: float | None = None
  positive_floor: bool = False
  space: str = 'linear'
  expand: bool = False
  space_offset: float = 0.0

  @property
  def min_positive(self) -> float | None:
    """The smallest positive value of the grid (before scaling)."""
    if self.kind == 'codebook':
      return min(v for v in self.table if v > 0)
    if self.kind == 'int':
      return 1.0
    if self.min_normal is None or self.mantissa_bits is None:
      return None
    # Float grids have subnormals: the last mantissa step below min_normal.
    return self.min_normal * 2.0 ** -self.mantissa_bits

  @property
  def packed(self) -> bool:
    """Whether codes are packed (4-bit two per byte, 3-bit eight per three
    bytes). Codes of simulated float grids are values in their container
    (bf16), never packed, however few bits the grid has."""
    return self.bits in PACKED_BITS and self.kind != 'float'

  @property
  def dtype(self) -> np.dtype:
    return jnp.dtype(self.storage_dtype)

  @property
  def is_identity(self) -> bool:
    """``fp32``, and the float grids with float32's exponent and mantissa
    (``e8m23``, ``e8m23_ieee``), whose rounding changes no finite float32:
    the leaf is kept as a plain float32 array."""
    return self.name == 'fp32' or (
        self.kind == 'float' and self.exponent_bits == 8
        and self.mantissa_bits == 23)

  @property
  def ties_to_even(self) -> bool:
    """Nearest rounding breaks exact ties to the even mantissa, as IEEE:
    float grids stored as a signed table (``fp4_e2m1``, which then equals
    ml_dtypes' ``float4_e2m1fn`` cast). Other tables break ties down."""
    return (self.kind == 'codebook' and self.mantissa_bits is not None
            and self.signed)

  @property
  def simulated(self) -> bool:
    """A float grid narrower than its container (``e{E}m{M}`` other than
    the native bf16/fp8 layouts): values are rounded to the grid, memory
    is the container's."""
    return self.kind == 'float' and self.bits < 8 * self.dtype.itemsize

  @property
  def container_bits(self) -> int:
    """Bits per element actually held in memory (before scales)."""
    return self.bits if self.packed else 8 * self.dtype.itemsize

  def __repr__(self) -> str:
    if self.positive_floor:
      return f'Format({self.name!r}, positive_floor=True)'
    return f'Format({self.name!r})'


def _float_grid(ebits: int, mbits: int, finite_max: float) -> tuple:
  """All non-negative values of a small float grid, sorted."""
  bias = 2 ** (ebits - 1) - 1
  emin = 1 - bias
  values = set()
  for e_field in range(2**ebits):
    for m in range(2**mbits):
      if e_field == 0:
        v = m * 2.0 ** (emin - mbits)
      else:
        v = (1 + m / 2**mbits) * 2.0 ** (e_field - bias)
      if v <= finite_max:
        values.add(v)
  return tuple(sorted(values))


def _ieee_float(name, ebits, mbits, storage, max_value, *,
                scaled: bool = False) -> Format:
  """A float format of ``ebits`` exponent and ``mbits`` mantissa bits."""
  bias = 2 ** (ebits - 1) - 1
  return Format(
      name=name,
      kind='float',
      bits=1 + ebits + mbits,
      storage_dtype=storage,
      exponent_bits=ebits,
      mantissa_bits=mbits,
      max_value=float(max_value),
      scaled=scaled,
      min_normal=2.0 ** (1 - bias),
  )


def _fma32(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
  """``a * b + c`` rounded once to float32 (a fused multiply-add)."""
  exact = fractions.Fraction(float(a)) * fractions.Fraction(float(b)) + (
      fractions.Fraction(float(c)))
  x = np.float32(float(exact))  # Within one float32 step of the exact value.
  candidates = (np.nextafter(x, np.float32(-np.inf)), x,
                np.nextafter(x, np.float32(np.inf)))
  # Nearest, ties to the even bit pattern.
  return min(candidates, key=lambda v: (
      abs(fractions.Fraction(float(v)) - exact),
      int(np.asarray(v, np.float32).view(np.uint32)) & 1))


def _linspace32(start: float, end: float, steps: int) -> np.ndarray:
  """``torch.linspace(start, end, steps)`` in float32, value for value.

  The first half counts up from ``start``, the second half down from
  ``end``, each point one fused multiply-add of the float32 step.
  """
  start, end = np.float32(start), np.float32(end)
  step = (end - start) / np.float32(steps - 1)
  half = steps // 2
  return np.array(
      [_fma32(step, np.float32(i), start) if i < half
       else _fma32(-step, np.float32(steps - 1 - i), end)
       for i in range(steps)], np.float32)


def dynamic_map(*, signed: bool, total_bits: int = 8,
                max_exponent_bits: int = 7) -> tuple[float, ...]:
  """The dynamic (tree) quantization map of 8-bit optimizers.

  The map of bitsandbytes' ``create_dynamic_map``, value for value in
  float32: for each decade ``10**(i - max_exponent_bits + 1)``,
  ``i = 0 .. max_exponent_bits - 1``, the midpoints of a float32 linspace
  of [0.1, 1] with ``2**i`` bins (signed, both signs) or ``2**(i + 1)``
  bins (unsigned: the sign bit becomes one more fraction bit), then 0 and
  1. Both maps have 256 distinct values in [-1, 1] (signed; the most
  negative is -0.99297) or [0, 1] (unsigned; the smallest positive is
  3.25e-7).

  References:
    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022
  """
  # bitsandbytes counts the sign bit out in both cases (its unsigned map
  # spends it on a doubled fraction instead).
  non_sign_bits = total_bits - 1
  extra = 2 ** (non_sign_bits - max_exponent_bits) - 1
  if extra:
    raise ValueError(
        'dynamic_map supports total_bits - 1 == max_exponent_bits, got '
        f'total_bits={total_bits}, max_exponent_bits={max_exponent_bits}.')
  levels = []
  for i in range(max_exponent_bits):
    bins = 2 ** (i + non_sign_bits - max_exponent_bits + (0 if signed else 1))
    bounds = _linspace32(0.1, 1.0, bins + 1)
    mids = (bounds[:-1] + bounds[1:]) / np.float32(2.0)
    scale = np.float32(10.0 ** (i - (max_exponent_bits - 1)))
    levels.extend((scale * mids).tolist())
    if signed:
      levels.extend((-scale * mids).tolist())
  levels.extend([0.0, 1.0])
  values = np.sort(np.array(levels, np.float32))
  if values.size != 2**total_bits:
    raise AssertionError(f'{values.size} != {2**total_bits} map values')
  return tuple(float(v) for v in values)


def _codebook(name, table, *, bits, signed) -> Format:
  table = tuple(float(np.float32(v)) for v in table)
  return Format(
      name=name,
      kind='codebook',
      bits=bits,
      storage_dtype='uint8',
      max_value=max(abs(table[0]), abs(table[-1])),
      signed=signed,
      table=table,
  )


_BUILTIN = {
    'fp32': Format('fp32', 'float', 32, 'float32', 8, 23,
                   float(np.finfo(np.float32).max), scaled=False,
                   min_normal=float(np.finfo(np.float32).tiny)),
    'bf16': _ieee_float('bf16', 8, 7, 'bfloat16',
                        float(jnp.finfo(jnp.bfloat16).max)),
    'fp16': _ieee_float('fp16', 5, 10, 'float16', 65504.0),
    'fp8_e4m3': dataclasses.replace(
        _ieee_float('fp8_e4m3', 4, 3, 'float8_e4m3fn', 448.0), scaled=True),
    'fp8_e5m2': dataclasses.replace(
        _ieee_float('fp8_e5m2', 5, 2, 'float8_e5m2', 57344.0), scaled=True),
    'int8': Format('int8', 'int', 8, 'int8', max_value=127.0),
    'int4': Format('int4', 'int', 4, 'uint8', max_value=7.0),
}


@functools.cache
def _fp4_e2m1() -> Format:
  pos = _float_grid(2, 1, 6.0)  # 0, .5, 1, 1.5, 2, 3, 4, 6
  neg = tuple(-v for v in reversed(pos[1:]))
  # 15 distinct values; the 16th code (negative zero) duplicates zero.
  table = neg + (0.0, 0.0) + pos[1:]
  f = _codebook('fp4_e2m1', table, bits=4, signed=True)
  return dataclasses.replace(f, exponent_bits=2, mantissa_bits=1,
                             min_normal=1.0)


@functools.cache
def _fp4_e2m2u() -> Format:
  # Unsigned E2M2 (bias 1, subnormals, no inf/NaN) with zero excluded, as
  # the second-moment grid of the staleness paper (after Li et al.'s
  # zero-point fix). The paper does not give the exact grid; ours is
  # {0.25, 0.5, 0.75, 1, 1.25, ..., 7}: 15 values, the 16th code repeats
  # the largest.
  values = _float_grid(2, 2, 7.0)[1:]
  f = _codebook('fp4_e2m2u', values + (values[-1],), bits=4, signed=False)
  return dataclasses.replace(f, exponent_bits=2, mantissa_bits=2,
                             min_normal=1.0)


@functools.cache
def _int4_unsigned() -> Format:
  # Linear without zero, {1/16, 2/16, ..., 1}: Li et al.'s fix of the
  # zero-point problem, where second moments rounded to zero make
  # ``m / (sqrt(v) + eps)`` explode.
  return _codebook('int4_unsigned', [(i + 1) / 16 for i in range(16)],
                   bits=4, signed=False)


@functools.cache
def _int8_dynamic(signed: bool) -> Format:
  name = 'int8_dynamic' if signed else 'int8_dynamic_unsigned'
  return _codebook(name, dynamic_map(signed=signed), bits=8, signed=signed)


# Suffixes of the simulated float grids: how the top of the exponent range
# is used. '' (finite-only, every code a number, as OCP MX's e2m1, e2m3,
# e3m2), 'fn' (finite with one NaN code per sign: the all-ones pattern, as
# e4m3fn), '_ieee' (the all-ones exponent reserved for infinities and NaNs,
# as IEEE 754: e5m2, fp16, bf16).
FLOAT_VARIANTS = ('', 'fn', '_ieee')


@functools.cache
def _simulated(ebits: int, mbits: int, variant: str = '') -> Format | None:
  """``e{E}m{M}[fn|_ieee]``: a float grid with subnormals, saturating;
  None when ``E``, ``M`` or the variant is out of range."""
  if not (1 <= ebits <= 8 and 0 <= mbits <= 23):
    return None
  if variant == '_ieee' and ebits < 2:
    return None  # No normal exponent would be left.
  if variant == 'fn' and not 2 <= ebits <= 7:
    return None  # e1: no normal values; e8: past float32's range.
  bias = 2 ** (ebits - 1) - 1
  # The top exponent field: every field is finite, except with 8 exponent
  # bits, where the top one stays reserved so that the grid fits its
  # float32/bf16 container, and for IEEE-style grids.
  top = 2**ebits - 1 - (1 if ebits == 8 or variant == '_ieee' else 0)
  if variant == 'fn':
    # The all-ones pattern is NaN: the top field loses its last mantissa
    # step (and with no mantissa bits, the whole field).
    if mbits == 0:
      max_value = 2.0 ** (top - 1 - bias)
    else:
      max_value = (2 - 2.0 ** (1 - mbits)) * 2.0 ** (top - bias)
  else:
    max_value = (2 - 2.0**-mbits) * 2.0 ** (top - bias)
  container = 'bfloat16' if ebits <= 8 and mbits <= 7 else 'float32'
  return _ieee_float(f'e{ebits}m{mbits}{variant}', ebits, mbits, container,
                     max_value, scaled=ebits < 8)


@functools.cache
def _normal_float(bits: int) -> Format:
  return _codebook(f'nf{bits}', codebooks.normal_float(bits), bits=bits,
                   signed=True)


@functools.cache
def _unsigned_float(ebits: int, mbits: int) -> Format:
  f = _codebook(f'ue{ebits}m{mbits}', codebooks.unsigned_float(ebits, mbits),
                bits=ebits + mbits, signed=False)
  return dataclasses.replace(f, exponent_bits=ebits, mantissa_bits=mbits)


@functools.cache
def _companded(kind: str, bits: int, signed: bool) -> Format:
  name = f'int{bits}_{kind}' + ('' if signed else '_unsigned')
  return _codebook(name, codebooks.companded(kind, bits, signed=signed),
                   bits=bits, signed=signed)


@functools.cache
def _expanded(fmt: Format) -> Format:
  """``fmt`` with dynamic range expansion (named ``<name>_dre``)."""
  if fmt.name not in ('fp8_e4m3', 'fp8_e5m2'):
    raise ValueError(
        f'Dynamic range expansion (_dre) is an option of the fp8 formats '
        f'(fp8_e4m3_dre, fp8_e5m2_dre), and {fmt.name!r} is not one.')
  return dataclasses.replace(fmt, name=f'{fmt.name}_dre', expand=True)


@functools.cache
def _in_space(fmt: Format, space: str, offset: float = 0.0) -> Format:
  """``fmt`` rounding linearly in ``space`` (named ``<name>@<space>``, or
  ``<name>@rsqrt+<offset>``)."""
  if space == 'linear':
    return fmt
  if fmt.kind != 'codebook':
    raise ValueError(
        f'A rounding space (@{space}) needs a codebook format, and '
        f'{fmt.name!r} is a {fmt.kind} grid; codebooks: fp4_e2m1, '
        'fp4_e2m2u, int8_dynamic, int4_unsigned, nf4, nf3, ue{E}m{M}, '
        'int{3,4}_{sqrt,mulaw,softsign}[_unsigned].')
  if offset:
    if min(fmt.table) < 0:
      raise ValueError(
          f'Rounding in preconditioner space needs a grid of non-negative '
          f'values, and {fmt.name!r} holds {min(fmt.table)}: use a second '
          'moment grid (ue{E}m{M}, int8_dynamic, int4, fp4_e2m2u, '
          'int{3,4}_{sqrt,mulaw,softsign}).')
    # repr: the shortest text that reads back as the same float.
    base = fmt.name.split('@')[0]
    return dataclasses.replace(
        fmt, name=f'{base}@rsqrt+{float(offset)!r}', space='rsqrt',
        space_offset=float(offset))
  if space in ('log', 'rsqrt') and min(fmt.table) <= 0:
    raise ValueError(
        f'Rounding space @{space} needs a grid of positive values, and '
        f'{fmt.name!r} holds {min(fmt.table)}: use an unsigned grid without '
        "zero (ue{E}m{M}, fp4_e2m2u, int4_unsigned, int{3,4}_<compander>"
        '_unsigned).')
  base = fmt.name.split('@')[0]
  return dataclasses.replace(fmt, name=f'{base}@{space}', space=space)


FORMAT_NAMES = (
    'fp32', 'bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e2m1', 'fp4_e2m2u',
    'int8', 'int8_dynamic', 'int4', 'e{E}m{M}', 'nf4', 'nf3', 'ue{E}m{M}',
    'int4_sqrt', 'int3_sqrt', 'int4_mulaw', 'int3_mulaw', 'int4_softsign',
    'int3_softsign', 'fp8_e4m3_dre', 'fp8_e5m2_dre',
)
"""The canonical format names that [`get_format`][optax_q.get_format]
accepts, as a tuple of strings.

Any of them can be passed wherever a format is taken (``formats`` of
[`quantize_state`][optax_q.quantize_state], ``mu_format`` and
``nu_format`` of the optimizers, [`quantize`][optax_q.quantize], ...).
``'e{E}m{M}'`` and ``'ue{E}m{M}'`` stand for families, with the exponent
and mantissa bits filled in (``'e3m2'``, ``'ue4m0'``). Also accepted: the
spellings in [`FORMAT_ALIASES`][optax_q.FORMAT_ALIASES], the second-moment
variants that [`unsigned_variant`][optax_q.unsigned_variant] makes
(``'int8_dynamic_unsigned'``, ``'int4_unsigned'``, ...) and a codebook
followed by ``'@<space>'``; ``get_format``'s ``fmt`` argument lists them.
"""
FORMAT_ALIASES = types.MappingProxyType({
    'float32': 'fp32', 'bfloat16': 'bf16', 'float16': 'fp16',
    'fp8': 'fp8_e4m3', 'e4m3': 'fp8_e4m3', 'e5m2': 'fp8_e5m2',
    'e4m3fn': 'fp8_e4m3', 'e5m2_ieee': 'fp8_e5m2',
    'fp4': 'fp4_e2m1', 'e2m1': 'fp4_e2m1', 'e2m2u': 'fp4_e2m2u',
})
"""Other spellings of the names in [`FORMAT_NAMES`][optax_q.FORMAT_NAMES]:
a read-only mapping ``{alias: canonical name}``.

An alias has one meaning everywhere a format is named, the stall model's
functions ([`format_epsilon`][optax_q.format_epsilon], ...) included:
``'fp8'`` is ``'fp8_e4m3'``, ``'fp4'`` is ``'fp4_e2m1'``, ``'bfloat16'`` is
``'bf16'``. The format an alias names carries the canonical name
(``get_format('fp8').name`` is ``'fp8_e4m3'``).
"""
# The second-moment variants that `unsigned_variant` makes are named too,
# so that a stored state's format can be named back.
VARIANT_NAMES = ('int8_dynamic_unsigned', 'int4_unsigned',
                 'int{3,4}_{sqrt,mulaw,softsign}_unsigned')


def _allowed() -> str:
  aliases = ', '.join(f'{a!r} = {n!r}' for a, n in FORMAT_ALIASES.items())
  return (f'{", ".join(FORMAT_NAMES)} (simulated e{{E}}m{{M}} with '
          f'1 <= E <= 8, 0 <= M <= 23: finite-only, or with the suffix '
          f"'fn' (2 <= E <= 7: the all-ones code is NaN, as e4m3fn) or "
          f"'_ieee' (E >= 2: the top exponent holds inf/NaN, as e5m2); "
          f'unsigned power-of-two grids '
          f'ue{{E}}m{{M}} with E >= 1, 3 <= E + M <= 8; fp8_e4m3_dre and '
          f'fp8_e5m2_dre for dynamic range expansion); second-moment '
          f'variants {", ".join(VARIANT_NAMES)}; a codebook followed by '
          f'@<space> rounds in that space, one of {ROUNDING_SPACES}; '
          f'aliases {aliases}')
_SIMULATED = re.compile(r'^e([1-9]\d*)m(0|[1-9]\d*)(fn|_ieee)?$')
_UNSIGNED_FLOAT = re.compile(r'^ue(\d+)m(\d+)$')
_COMPANDED = re.compile(r'^int([34])_(sqrt|mulaw|softsign)(_unsigned)?$')


_NAMED = types.MappingProxyType({
    'fp4_e2m1': _fp4_e2m1, 'fp4_e2m2u': _fp4_e2m2u,
    'int8_dynamic': functools.partial(_int8_dynamic, True),
    'int8_dynamic_unsigned': functools.partial(_int8_dynamic, False),
    'int4_unsigned': _int4_unsigned,
    'nf4': functools.partial(_normal_float, 4),
    'nf3': functools.partial(_normal_float, 3),
})


def _named(key: str) -> Format | None:
  """The format of a canonical lower-case name, or None."""
  if key in _BUILTIN:
    return _BUILTIN[key]
  if key in _NAMED:
    return _NAMED[key]()
  m = _SIMULATED.match(key)
  if m:
    return _simulated(int(m.group(1)), int(m.group(2)), m.group(3) or '')
  m = _UNSIGNED_FLOAT.match(key)
  if m and int(m.group(1)) >= 1 and 3 <= int(m.group(1)) + int(
      m.group(2)) <= 8:
    return _unsigned_float(int(m.group(1)), int(m.group(2)))
  m = _COMPANDED.match(key)
  if m:
    return _companded(m.group(2), int(m.group(1)), not m.group(3))
  return None


def get_format(fmt: str | Format) -> Format:
  """Returns the [`Format`][optax_q.Format] for a name, or ``fmt`` itself.

  Args:
    fmt: A format name (``'fp32'``, ``'bf16'``, ``'fp16'``, ``'fp8_e4m3'``,
      ``'fp8_e5m2'``, ``'fp4_e2m1'``, ``'fp4_e2m2u'``, ``'int8'``,
      ``'int8_dynamic'``, ``'int4'``, or a simulated ``'e{E}m{M}'`` with
      ``1 <= E <= 8`` and ``0 <= M <= 23``: finite-only (every code a
      number), or ``'e{E}m{M}fn'`` (the all-ones code is NaN, as
      ``float8_e4m3fn``; ``2 <= E <= 7``) or ``'e{E}m{M}_ieee'`` (the top
      exponent holds infinities and NaN, as IEEE 754; ``E >= 2``), all
      with subnormals and saturating at their largest finite value; the
      second-moment variants
      ``'int8_dynamic_unsigned'`` and ``'int4_unsigned'``; the low-bit
      codecs ``'nf4'``, ``'nf3'``, ``'ue{E}m{M}'``,
      ``'int{3,4}_{sqrt,mulaw,softsign}'``, a codebook followed by
      ``'@<space>'``; ``'fp8_e4m3_dre'`` and ``'fp8_e5m2_dre'`` (dynamic
      range expansion, COAT); or an alias of
      [`FORMAT_ALIASES`][optax_q.FORMAT_ALIASES]: ``'fp8'`` is ``'fp8_e4m3'``
      and ``'fp4'`` is ``'fp4_e2m1'``, everywhere) or a
      [`Format`][optax_q.Format].

  Returns:
    The format.

  Raises:
    ValueError: for an unknown name or a value that is neither a string nor
      a [`Format`][optax_q.Format], naming the allowed values.

  Examples:
    >>> import optax_q
    >>> optax_q.get_format('fp8_e4m3').max_value
    448.0
    >>> optax_q.get_format('fp8_e4m3_dre').expand
    True

  References:
    Xi et al, [COAT: Compressing Optimizer states and Activation for
    Memory-Efficient FP8 Training](https://arxiv.org/abs/2410.19313), 2024
  """
  return check_format(fmt, 'fmt')


def check_format(fmt: Any, name: str) -> Format:  # pylint: disable=too-many-branches
  """`get_format`, with errors that name the argument ``name``."""
  if isinstance(fmt, Format):
    return fmt
  if not isinstance(fmt, str):
    raise ValueError(
        f'{name}={validation.short(fmt)}: a format must be a string or '
        'optax_q.Format. '
        f'Allowed: {_allowed()}. (Under '
        'optax.inject_hyperparams, list format arguments in static_args.)')
  key = fmt.strip().lower()
  if '@' in key:
    base, _, space = key.partition('@')
    space, plus, offset = space.partition('+')
    if space not in ROUNDING_SPACES or (plus and space != 'rsqrt'):
      raise ValueError(
          f'{name}={fmt!r}: unknown rounding space {space + plus!r}; '
          f'allowed: {ROUNDING_SPACES}, or rsqrt+<eps>.')
    try:
      if plus:
        try:
          eps = float(offset)
        except ValueError:
          raise ValueError(f'{offset!r} is not a number') from None
        return in_preconditioner_space(check_format(base, name), eps)
      return _in_space(check_format(base, name), space)
    except ValueError as e:
      raise ValueError(f'{name}={fmt!r}: {e}') from None
  found = _named(FORMAT_ALIASES.get(key, key))
  if found is not None:
    return found
  if key.endswith('_dre'):
    base = key[:-len('_dre')]
    found = _named(FORMAT_ALIASES.get(base, base))
    if found is not None:
      try:
        return _expanded(found)
      except ValueError as e:
        raise ValueError(f'{name}={fmt!r}: {e}') from None
  m = _SIMULATED.match(key)
  if m:
    ebits, mbits, variant = int(m.group(1)), int(m.group(2)), m.group(3)
    if not 1 <= ebits <= 8:
      why = f'E={ebits} exponent bits: allowed 1 <= E <= 8'
    elif not 0 <= mbits <= 23:
      why = f'M={mbits} mantissa bits: allowed 0 <= M <= 23'
    elif variant == 'fn':
      why = (f'the suffix fn (one NaN code) needs 2 <= E <= 7, got E='
             f'{ebits}')
    else:
      why = f'the suffix _ieee needs E >= 2, got E={ebits}'
    raise ValueError(
        f'Unknown format {name}={fmt!r}: a float grid e{{E}}m{{M}}[fn|_ieee] '
        f'with {why}.')
  raise ValueError(f'Unknown format {name}={fmt!r}. Allowed: {_allowed()}.')


def check_signed_format(fmt: Any, name: str) -> Format:
  """`check_format` for values that may be negative (gradients,
  weights, first moments): an unsigned grid is a ``ValueError`` naming
  ``name``."""
  fmt = check_format(fmt, name)
  if not fmt.signed:
    raise ValueError(
        f'{name}={fmt.name!r} is unsigned (no negative values); {name} '
        'needs a signed format such as e4m3, int8, int8_dynamic, nf4 or '
        'bf16.')
  return fmt


def check_second_moment_format(fmt: Any, name: str) -> Format:
  """`check_format` for a second moment (non-negative values).

  A signed codebook that [`unsigned_variant`][optax_q.unsigned_variant]
  keeps signed (the normal-quantile grids ``nf4`` and ``nf3``, made for
  first moments) would spend the codes of its negative half on values a
  second moment never takes: a ``ValueError`` naming ``name`` and the
  second-moment grids instead.
  """
  fmt = check_format(fmt, name)
  if fmt.kind == 'codebook' and min(unsigned_variant(fmt).table) < 0:
    raise ValueError(
        f'{name}={fmt.name!r} is a signed first-moment grid: a second moment '
        'is never negative and would use half of its codes. Use a '
        'second-moment grid such as ue4m0, int4 (stored unsigned), '
        'int4_sqrt, int3_mulaw, fp4_e2m1, int8_dynamic or fp8_e4m3.')
  return fmt


def unsigned_variant(fmt: str | Format) -> Format:  # pylint: disable=too-many-return-statements
  """The variant of ``fmt`` used for non-negative states (second moments).

  ``int8_dynamic`` becomes the unsigned dynamic map (its sign bit becomes an
  extra fraction bit, as in bitsandbytes); ``int4`` becomes the linear grid
  without zero and ``fp4_e2m1`` the unsigned E2M2 grid without zero
  (``fp4_e2m2u``), since a second moment decoded as zero makes the Adam
  update explode (Li et al., 2023). Every other grid that holds zero (the
  unsigned dynamic map, fp8, bf16, fp16, int8, simulated ``e{E}m{M}``) keeps
  its codes but gets ``positive_floor=True``: a positive value far below its
  block's maximum (for fp8 e4m3 with block scales, a coordinate whose
  gradients are about 500 times smaller than the largest in its block) is
  stored as the smallest positive grid value instead of zero. ``fp32`` is
  returned as is.

  Args:
    fmt: A format name or [`Format`][optax_q.Format] (see
      [`get_format`][optax_q.get_format]).

  Returns:
    The format to store non-negative values in.

  Examples:
    >>> import optax_q
    >>> optax_q.unsigned_variant('int4').name
    'int4_unsigned'

  References:
    Li et al, [Memory Efficient Optimizers with 4-bit
    States](https://arxiv.org/abs/2309.01507), 2023
  """
  fmt = check_format(fmt, 'fmt')
  if fmt.space != 'linear':
    return _in_space(unsigned_variant(fmt.name.split('@')[0]), fmt.space,
                     fmt.space_offset)
  if fmt.kind == 'codebook' and fmt.name.startswith('int') and fmt.signed:
    m = _COMPANDED.match(fmt.name)
    if m:
      return _companded(m.group(2), int(m.group(1)), False)
  if fmt.name == 'int8_dynamic':
    fmt = _int8_dynamic(False)
  elif fmt.name == 'int4':
    return _int4_unsigned()
  elif fmt.name == 'fp4_e2m1':
    return _fp4_e2m2u()
  if fmt.is_identity or fmt.positive_floor or fmt.min_positive is None:
    return fmt
  if fmt.kind == 'codebook' and min(fmt.table) > 0:
    return fmt  # A grid without zero needs no floor.
  return dataclasses.replace(fmt, positive_floor=True)


def in_preconditioner_space(fmt: Any, eps: float) -> Format:
  r"""A second moment's format whose rounding is unbiased in the update.

  Adam steps by :math:`m / (\sqrt{v} + \epsilon)`, a convex, decreasing
  function of the stored second moment :math:`v`. Stochastic rounding that
  is unbiased in :math:`v` (:math:`E[\hat v] = v`) is biased in that map
  (Jensen): :math:`E[1/(\sqrt{\hat v} + \epsilon)] > 1/(\sqrt v +
  \epsilon)`, so a coarse grid makes every later step larger on average.
  This format rounds :math:`v` between its bracketing grid values
  :math:`g_- \le v \le g_+` (scales included) up with probability

  .. math::

    p = \frac{f(v) - f(g_-)}{f(g_+) - f(g_-)}, \qquad
    f(x) = -\frac{1}{\sqrt{x} + \epsilon},

  so that :math:`E[f(\hat v)] = f(v)`: the preconditioner, and with it the
  update, is unbiased instead ("rounding in preconditioner space"). The
  map is Adam's with its bias correction left out: the exact offset is
  :math:`\epsilon \sqrt{1 - \beta_2^t}`, which reaches ``eps`` within a
  few thousand steps and only matters where :math:`\sqrt v` is within a
  few ``eps`` of zero. Nearest rounding with this format takes the nearer
  value in the same space.

  Args:
    fmt: A codebook format for non-negative values (see
      [`get_format`][optax_q.get_format]), or one whose unsigned variant is:
      ``ue{E}m{M}``, ``int8_dynamic``, ``int4``, ``fp4_e2m2u``,
      ``int{3,4}_{sqrt,mulaw,softsign}`` (not the first-moment grids
      ``nf4`` and ``nf3``).
    eps: Adam's ``eps``, a finite positive float (``0`` gives the space
      ``-1/sqrt(v)``, ``<codec>@rsqrt``, which needs a grid without zero).

  Returns:
    The format, named ``<codec>@rsqrt+<eps>``.

  Raises:
    ValueError: for a grid that is not a codebook, or a bad ``eps``.

  Examples:
    >>> import optax_q
    >>> optax_q.in_preconditioner_space('ue4m0', 1e-8).name
    'ue4m0@rsqrt+1e-08'

  References:
    Li et al, Rounding in Preconditioner Space: Redesigning 4-bit AdamW
    Optimizer-State Quantization, 2026

    Croci et al, [Stochastic rounding: implementation, error analysis and
    applications](https://doi.org/10.1098/rsos.211631), 2022
  """
  fmt = check_format(fmt, 'fmt')
  eps = validation.check_number(
      eps, 'eps', concrete=True,
      hint=' It sets the stored format: make it static.')
  base = unsigned_variant(fmt.name.split('@')[0])
  if base.kind != 'codebook':
    raise ValueError(
        f'fmt={fmt.name!r}: rounding in preconditioner space needs a codebook '
        f'format, and this is a {base.kind} grid; codebooks: ue{{E}}m{{M}}, '
        'int8_dynamic, int4, fp4_e2m2u, '
        'int{3,4}_{sqrt,mulaw,softsign}[_unsigned].')
  return _in_space(base, 'rsqrt', eps)
