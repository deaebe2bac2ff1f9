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
"""Drop-in optimizers with low-precision state.

Each is the Optax optimizer of the same name with its moment transform
wrapped in `quantize_state`. With ``fp32`` formats they are the Optax
optimizers, bit for bit.

Their storage arguments that set a layout (``block_size``, ``min_size``,
``seed``) default to None, which stands for 128, 4096 and 0: with nothing
given they stay static under ``optax.inject_hyperparams`` without
``static_args``. Given explicitly, ``block_size`` and ``min_size`` must be
listed in ``static_args`` (they set shapes at ``init``).
"""

from __future__ import annotations

from collections.abc import Mapping
import inspect
from typing import Any
import warnings

import optax

from optax_q._src.adaptive import adaptive
from optax_q._src.codec import formats as formats_lib
from optax_q._src.core import validation
from optax_q._src.resets import resets
from optax_q._src.state import transform

ScalarOrSchedule = optax.ScalarOrSchedule
Periods = int | str | dict[str, int | str | None] | None


def _check_decay(value: Any, name: str) -> Any:
  """A decay rate in [0, 1): a Python or NumPy number, or a jax.Array."""
  return validation.check_number(value, name, high=1.0)


def _check_nonnegative(value: Any, name: str, *,
                       schedule: bool = False) -> Any:
  """A finite number >= 0 (or a schedule, where Optax takes one)."""
  return validation.check_number(value, name, schedule=schedule)


def _moment_formats(field_formats: dict[str, Any]) -> dict[str, Any]:
  """``{field: Format or None}`` from ``{argname: (field, format)}``."""
  out = {}
  for argname, (field, fmt) in field_formats.items():
    check = (formats_lib.check_second_moment_format if field == 'nu'
             else formats_lib.check_signed_format)
    out[field] = None if fmt is None else check(fmt, argname)
  return out


def _wrap(inner, formats, **storage):
  """``inner`` with its state quantized (it is elementwise)."""
  return transform.quantize_state(inner, formats, elementwise=True, **storage)


_STORAGE_ARGS = ('rounding', 'seed', 'min_size', 'block_size',
                 'track_stalls', 'kernel')
_DEFAULT_FORMAT = 'int8_dynamic'


def _adaptive_kwargs(bits: Any, reset_every: Any, scale_mode: Any
                     ) -> dict[str, Any]:
  """The `adaptive_bits` keyword arguments of ``bits``."""
  if isinstance(bits, str) and bits == 'adaptive':
    kwargs = {}
  elif isinstance(bits, Mapping) and all(isinstance(k, str) for k in bits):
    kwargs = dict(bits)
  else:
    raise ValueError(
        "bits must be None, 'adaptive' or a dict of adaptive_bits keyword "
        f'arguments, got {validation.short(bits)}.')
  allowed = [k for k in inspect.signature(adaptive.adaptive_bits).parameters
             if k != 'inner']
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f'bits has unknown keys {unknown}; allowed: {allowed}.')
  own = sorted(set(kwargs) & set(_STORAGE_ARGS))
  if own:
    raise ValueError(
        f'bits sets {own}, which are arguments of the optimizer itself: '
        'pass them there (e.g. adamw(lr, block_size=64, bits=...)).')
  if reset_every is not None:
    raise ValueError(
        f'bits={validation.short(bits)} does not take reset_every (got '
        f'{validation.short(reset_every)}): formats that change per leaf and '
        'resets are not combined yet.')
  if scale_mode is not None:
    raise ValueError(
        f'bits={validation.short(bits)} does not take scale_mode (got '
        f'{validation.short(scale_mode)}): give candidates as (format, '
        "scale_mode) pairs, e.g. bits={'candidates': {'mu': (('nf4', "
        "'block_pow2'), ...)}}.")
  return kwargs


def _bits_composition(optimizer: str, kwargs: Mapping[str, Any]) -> str:
  """The ``optax.chain`` that ``optimizer(..., bits=...)`` builds."""
  defaults = {k: p.default for k, p in inspect.signature(
      adaptive.adaptive_bits).parameters.items()}
  args = ''.join(f', {k}={v!r}' for k, v in kwargs.items()
                 if not (k in defaults and _same(v, defaults[k])))
  decay = ('optax.add_decayed_weights(weight_decay, mask), '
           if optimizer == 'adamw' else '')
  return (
      'optax.chain(optax_q.adaptive_bits(optax.scale_by_adam(b1, b2, eps, '
      f'eps_root, nesterov=nesterov){args}), {decay}'
      'optax.scale_by_learning_rate(learning_rate))')


def _same(a: Any, b: Any) -> bool:
  try:
    return type(a) is type(b) and bool(a == b)
  except Exception:  # pylint: disable=broad-exception-caught
    return False


def _adam_moments(learning_rate, b1, b2, eps, eps_root, *, mu_format,
                  nu_format, reset_every, nesterov, bits=None,
                  optimizer='adam', **storage):
  """Checks Adam's arguments; the (quantized, maybe resetting) moments."""
  b1 = _check_decay(b1, 'b1')
  b2 = _check_decay(b2, 'b2')
  _check_nonnegative(learning_rate, 'learning_rate', schedule=True)
  eps = _check_nonnegative(eps, 'eps')
  eps_root = _check_nonnegative(eps_root, 'eps_root')
  nesterov = validation.check_bool(nesterov, 'nesterov')
  if bits is not None:
    kwargs = _adaptive_kwargs(bits, reset_every, storage.pop('scale_mode'))
    for name, value in (('mu_format', mu_format), ('nu_format', nu_format)):
      if not (isinstance(value, str) and value == _DEFAULT_FORMAT):
        raise ValueError(
            f'{name}={validation.short(value)} is unused with bits='
            f'{validation.short(bits)}, which chooses the formats: give '
            "them as bits={'candidates': {'mu': (...), 'nu': (...)}}.")
    kwargs = {'elementwise': True, **storage, **kwargs}
    warnings.warn(
        f'optax_q.{optimizer}(..., bits=...) is deprecated: it is the one '
        'mode that rules out the formats, scale_mode and reset_every. '
        'Compose the transforms instead, '
        f'{_bits_composition(optimizer, kwargs)}, where b1, b2, ... stand '
        f'for the values given to {optimizer}: the same optimizer, bit for '
        'bit.', DeprecationWarning, stacklevel=3)
    inner = optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                                nesterov=nesterov)
    return adaptive.adaptive_bits(inner, **kwargs)
  formats = _moment_formats(
      {'mu_format': ('mu', mu_format), 'nu_format': ('nu', nu_format)})
  if reset_every is None:
    return _wrap(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                            nesterov=nesterov), formats,
        preconditioner={'nu': eps}, **storage)
  return adam_with_resets(
      reset_every=reset_every, b1=b1, b2=b2, eps=eps, eps_root=eps_root,
      nesterov=nesterov, formats=formats, **storage)

def adam_with_resets(
    reset_every: Any,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    nesterov: bool = False,
    formats: Mapping[str, Any] | None = None,
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | Mapping[str, str] | None = None,
    decay: float | None = None,
    s0: float = 0.6,
    track_stalls: bool = False,
    kernel: str = 'auto',
) -> optax.GradientTransformationExtraArgs:
  r"""Adam's quantized moments with periodic, asymmetric or adaptive resets.

  ``reset_state(quantize_state(scale_by_adam_local_age(...), formats), ...)``:
  the moment transform behind ``optax_q.adamw(..., reset_every=...)``. With
  no moment reset (or a period longer than the run) the updates equal those
  of ``quantize_state(optax.scale_by_adam(...))`` bit for bit.

  Moments given the same policy (an int, ``'auto'`` or ``'adaptive'`` for
  both, or equal dict entries) are reset **together**: when the rule fires
  for either, both moments and both ages restart, so every update after a
  reset is a fresh Adam step. Moments with different policies are reset
  separately; then a second moment may restart under an old first moment,
  and [`scale_by_adam_local_age`][optax_q.scale_by_adam_local_age] clips that
  update to Adam's bound ``C`` (see there), with a warning at construction.

  Args:
    reset_every: ``None``, a positive int period for both moments,
      ``'auto'`` (the stall model's ``K*`` for the format the second moment
      is stored in and ``b2``, used for both moments), ``'adaptive'``
      (Algorithm 2 on each moment's measured stall fraction; both moments
      reset when either rule fires), or a dict such as ``{'nu': 300}`` (the
      paper's asymmetric FP8 policy: ``mu`` never reset; its updates after
      a reset are bounded by ``C`` only, see the warning it raises).
    b1: First-moment decay.
    b2: Second-moment decay.
    eps: Added to the denominator.
    eps_root: Added inside the square root.
    nesterov: Nesterov momentum.
    formats: ``{'mu': format, 'nu': format}`` as for
      [`quantize_state`][optax_q.quantize_state].
    rounding: ``'nearest'``, ``'stochastic'`` or ``'preconditioner'``, or
      a dict per moment, as for [`adamw`][optax_q.adamw].
    block_size: Elements per scale along the last axis (None: 128).
    seed: Seed of the stochastic rounding (None: 0).
    min_size: Leaves with fewer elements keep float32 state (they are still
      reset with the rest).
    scale_mode: How quantized leaves are scaled; None: by format (see
      [`quantize_state`][optax_q.quantize_state]).
    decay: `\beta` of the adaptive rule; ``b2`` by default.
    s0: Staleness tolerance of the adaptive rule.
    track_stalls: Record per-leaf stalled fractions for
      [`stall_fraction`][optax_q.stall_fraction] (the adaptive rule does not
      need them).
    kernel: ``'auto'``, ``'xla'`` or ``'pallas'``: how the tiled moments
      are updated (see [`quantize_state`][optax_q.quantize_state]).

  Returns:
    A gradient transformation whose state is a
      [`ResetState`][optax_q.ResetState].

  Raises:
    ValueError: at construction, naming the argument: see
      [`reset_state`][optax_q.reset_state] and `resolve_reset_every`; with
      ``'adaptive'`` and no ``decay``, ``b2`` must lie in ``(0, 1)``.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> tx = optax.chain(
    ...     optax_q.adam_with_resets(
    ...         300, formats={'mu': 'fp8_e4m3', 'nu': 'fp8_e4m3'}, min_size=0),
    ...     optax.scale(-1e-3))
    >>> state = tx.init({'w': jnp.zeros((4, 128))})
    >>> state[0].ages
    {'mu': Array(0, dtype=int32), 'nu': Array(0, dtype=int32)}

  References:
    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets](https://arxiv.org/abs/2603.16731), 2026
  """
  formats = dict(formats or {})
  nu_format = formats.get('nu')
  if nu_format is not None:
    nu_format = formats_lib.get_format(nu_format)
  periods = resets.resolve_reset_every(
      reset_every, nu_format, b2,
      # The stall model knows two roundings; preconditioner space is a
      # stochastic one.
      'nearest' if transform.leaf_rounding(rounding, 'nu') == 'nearest'
      else 'stochastic', eps, b1=b1)
  groups = ((resets.ADAM_MOMENTS,) if 'mu' in periods
            and periods.get('mu') == periods.get('nu') else ())
  if decay is None:
    decay = resets.default_decay(b2, resets.ADAPTIVE in periods.values())
  inner = transform.quantize_state(
      resets.scale_by_adam_local_age(b1=b1, b2=b2, eps=eps, eps_root=eps_root,
                              nesterov=nesterov),
      formats, rounding=rounding, block_size=block_size, seed=seed,
      min_size=min_size, scale_mode=scale_mode, elementwise=True,
      track_stalls=track_stalls, kernel=kernel, preconditioner={'nu': eps})
  return resets.reset_state(inner, periods, decay=decay, s0=s0, groups=groups)


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    weight_decay: float = 1e-4,
    mask: Any = None,
    *,
    mu_format: Any = 'int8_dynamic',
    nu_format: Any = 'int8_dynamic',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | Mapping[str, str] | None = None,
    reset_every: Periods = None,
    nesterov: bool = False,
    track_stalls: bool = False,
    kernel: str = 'auto',
    bits: str | Mapping[str, Any] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""AdamW with its moments stored in low precision.

  ``optax.chain(quantize_state(scale_by_adam(...)), add_decayed_weights,
  scale_by_learning_rate)``: the same chain as ``optax.adamw``, with the
  moments decoded to float32 for the update and encoded after it. With
  `D` the decoder and `Q_\mu`, `Q_\nu` the encoders of the moments'
  formats (their scales and rounding; see
  [`quantize_state`][optax_q.quantize_state]):

  ```tex
  m_t = \beta_1 D(\mu_{t-1}) + (1 - \beta_1) g_t, \qquad
  v_t = \beta_2 D(\nu_{t-1}) + (1 - \beta_2) g_t^2, \\
  u_t = -\eta_t \Big(\frac{m_t / (1 - \beta_1^t)}
    {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}
    + \lambda w_{t-1}\Big), \qquad
  \mu_t = Q_\mu(m_t), \quad \nu_t = Q_\nu(v_t).
  ```

  The update is computed from the float32 moments `m_t`, `v_t`; only the
  stored state `\mu_t`, `\nu_t` is quantized.

  Args:
    learning_rate: A float or an Optax schedule.
    b1: First-moment decay, in [0, 1).
    b2: Second-moment decay, in [0, 1).
    eps: Added to the denominator, >= 0.
    eps_root: Added inside the square root, >= 0.
    weight_decay: Decoupled weight decay, >= 0, or an Optax schedule.
    mask: As in ``optax.adamw``.
    mu_format: Format of the first moment (see
      [`get_format`][optax_q.get_format]); ``'fp32'`` keeps it in float32.
    nu_format: Format of the second moment; signed codebooks become their
      unsigned variant, and unsigned formats such as ``'fp4_e2m2u'`` are
      allowed here (the first-moment grids ``'nf4'`` and ``'nf3'`` are not).
    rounding: ``'nearest'``, ``'stochastic'``, or ``'preconditioner'``
      (the second moment rounded stochastically so that Adam's
      ``1/(sqrt(v) + eps)``, not ``v``, is unbiased: see
      [`in_preconditioner_space`][optax_q.in_preconditioner_space]; its
      format must be a codebook, such as ``ue4m0``, ``int3_mulaw`` or
      ``int8_dynamic``), or a dict per moment.
    block_size: Elements per scale along the last axis, an even int in
      ``[2, 2**20]``; None: 128.
    seed: Seed of the stochastic rounding, an int in ``[0, 2**32 - 1]``;
      None: 0.
    min_size: Leaves with fewer elements keep float32 state; None: 4096.
    scale_mode: None (the formats' default: ``'block'`` float32 scales for
      narrow grids), or ``'block'``, ``'block_pow2'`` (shared power-of-two
      scales, one byte per block as OCP MX: 4.06 bits per element for a
      4-bit state at block 128), ``'row'``, ``'tensor'``, ``'rank1'`` (a
      scale per row and per column, Li et al., 2023), ``'none'``, or a dict
      per moment such as ``{'nu': 'rank1'}``; see
      [`quantize_state`][optax_q.quantize_state].
    reset_every: ``None`` (no resets), a positive int period for both
      moments, ``'auto'`` (the stall model's ``K*`` for ``nu_format`` and
      ``b2``, see [`reset_period`][optax_q.reset_period]), ``'adaptive'`` (reset
      both moments when the measured stalled fraction of either builds up;
      Algorithm 2 of the staleness paper), or a dict per moment such as
      ``{'nu': 300}`` (the paper's best fp8 policy: ``mu`` never reset; use it
      with ``eps >= 1e-6``). Each
      moment is bias-corrected by its local age since its last reset. See
      [`reset_state`][optax_q.reset_state].
    nesterov: Nesterov momentum, as in ``optax.adamw``.
    track_stalls: Record each quantized leaf's stalled fraction (the share
      of stored codes an update left unchanged) for
      [`stall_fraction`][optax_q.stall_fraction]. Off by default: comparing
      every stored code costs a pass over the state, up to several times the
      step on CPU (see the performance page). Resets with
      ``reset_every='adaptive'`` measure their own stalls and do not need it.
    kernel: How the moments of a large parameter (updated in tiles of rows)
      are made: ``'auto'`` (a Pallas kernel where its run is verified for
      the platform, none yet: XLA), ``'xla'`` or ``'pallas'`` (interpreted
      on CPU, for tests; Triton on a GPU and Mosaic on a TPU for matrices
      in one-byte float and integer grids, whose rows suit the blocks;
      exported with ``jax.export.DisabledSafetyCheck.custom_call(
      '__gpu$xla.gpu.triton')``; not with ``track_stalls``); see
      [`quantize_state`][optax_q.quantize_state].
    bits: Deprecated: compose [`adaptive_bits`][optax_q.adaptive_bits]
      instead (below). None (the moments in ``mu_format`` and
      ``nu_format``), or ``'adaptive'`` or a dict of ``adaptive_bits``
      keyword arguments (``{'period': 50, 'candidates': ...}``): each moment
      leaf's format is then chosen as training goes, among 3-, 4- and 8-bit
      candidates by default; call [`relayout`][optax_q.relayout] between steps.
      Not with ``reset_every`` or ``scale_mode`` (candidates carry their scale
      modes); ``mu_format`` and ``nu_format`` are then unused. Given, it
      warns once at construction (``DeprecationWarning``) and builds

      ```python
      optax.chain(
          optax_q.adaptive_bits(
              optax.scale_by_adam(b1, b2, eps, eps_root, nesterov=nesterov),
              elementwise=True, track_stalls=track_stalls, rounding=rounding,
              block_size=block_size, seed=seed, min_size=min_size,
              kernel=kernel, **bits_kwargs),
          optax.add_decayed_weights(weight_decay, mask),
          optax.scale_by_learning_rate(learning_rate))
      ```

      (``bits_kwargs``: the dict, or none for ``'adaptive'``), which is
      what to write instead.

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.adamw(1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3')
    >>> state = tx.init({'w': jnp.zeros((64, 128))})

  References:
    Loshchilov & Hutter, [Decoupled Weight Decay
    Regularization](https://arxiv.org/abs/1711.05101), 2019

    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022

    Topollai & Choromanska, [Understanding Quantization of Optimizer States
    in LLM Pre-training: Dynamics of State Staleness and Effectiveness of
    State Resets](https://arxiv.org/abs/2603.16731), 2026
  """
  weight_decay = _check_nonnegative(weight_decay, 'weight_decay',
                                    schedule=True)
  return optax.chain(
      _adam_moments(
          learning_rate, b1, b2, eps, eps_root, mu_format=mu_format,
          nu_format=nu_format, rounding=rounding, block_size=block_size,
          seed=seed, min_size=min_size, scale_mode=scale_mode, reset_every=reset_every,
          nesterov=nesterov, track_stalls=track_stalls, kernel=kernel,
          bits=bits, optimizer='adamw'),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def adam(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_format: Any = 'int8_dynamic',
    nu_format: Any = 'int8_dynamic',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | Mapping[str, str] | None = None,
    reset_every: Periods = None,
    nesterov: bool = False,
    track_stalls: bool = False,
    kernel: str = 'auto',
    bits: str | Mapping[str, Any] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Adam with its moments stored in low precision.

  ``optax.chain(quantize_state(scale_by_adam(...)),
  scale_by_learning_rate)``: ``optax.adam`` with the moments decoded to
  float32 for the update and encoded after it; the math of
  [`adamw`][optax_q.adamw] with `\lambda = 0`:

  ```tex
  u_t = -\eta_t \frac{m_t / (1 - \beta_1^t)}
    {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}, \qquad
  \mu_t = Q_\mu(m_t), \quad \nu_t = Q_\nu(v_t).
  ```

  Args:
    learning_rate: A float or an Optax schedule.
    b1: First-moment decay, in [0, 1).
    b2: Second-moment decay, in [0, 1).
    eps: Added to the denominator, >= 0.
    eps_root: Added inside the square root, >= 0.
    mu_format: Format of the first moment (see
      [`get_format`][optax_q.get_format]).
    nu_format: Format of the second moment (unsigned variants allowed;
      not the first-moment grids ``'nf4'`` and ``'nf3'``).
    rounding: ``'nearest'``, ``'stochastic'`` or ``'preconditioner'``, or
      a dict per moment, as for [`adamw`][optax_q.adamw].
    block_size: Elements per scale along the last axis; None: 128.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements keep float32 state; None: 4096.
    scale_mode: None (the formats' default: ``'block'`` float32 scales for
      narrow grids), or ``'block'``, ``'block_pow2'`` (shared power-of-two
      scales, one byte per block as OCP MX: 4.06 bits per element for a
      4-bit state at block 128), ``'row'``, ``'tensor'``, ``'rank1'`` (a
      scale per row and per column, Li et al., 2023), ``'none'``, or a dict
      per moment such as ``{'nu': 'rank1'}``; see
      [`quantize_state`][optax_q.quantize_state].
    reset_every: Moment resets, as for [`adamw`][optax_q.adamw].
    nesterov: Nesterov momentum, as in ``optax.adam``.
    track_stalls: Record each quantized leaf's stalled fraction, as for
      [`adamw`][optax_q.adamw].
    kernel: How tiled moments are updated, as for [`adamw`][optax_q.adamw].
    bits: Deprecated: formats chosen per leaf as training goes, as for
      [`adamw`][optax_q.adamw]; write instead ``optax.chain(
      optax_q.adaptive_bits(optax.scale_by_adam(...), elementwise=True,
      track_stalls=False, ...), optax.scale_by_learning_rate(learning_rate))``
      (the chain of ``adamw``'s ``bits`` without the weight decay).

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.adam(1e-3, mu_format='int4', nu_format='fp8_e4m3',
    ...                   min_size=0)
    >>> params = {'w': jnp.ones((8, 256))}
    >>> updates, state = tx.update(params, tx.init(params))
    >>> updates['w'].shape
    (8, 256)

  References:
    Kingma & Ba, [Adam: A Method for Stochastic
    Optimization](https://arxiv.org/abs/1412.6980), 2014

    Dettmers et al, [8-bit Optimizers via Block-wise
    Quantization](https://arxiv.org/abs/2110.02861), 2022
  """
  return optax.chain(
      _adam_moments(
          learning_rate, b1, b2, eps, eps_root, mu_format=mu_format,
          nu_format=nu_format, rounding=rounding, block_size=block_size,
          seed=seed, min_size=min_size, scale_mode=scale_mode, reset_every=reset_every,
          nesterov=nesterov, track_stalls=track_stalls, kernel=kernel,
          bits=bits),
      optax.scale_by_learning_rate(learning_rate),
  )


def lion(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 1e-3,
    mask: Any = None,
    *,
    mu_format: Any = 'int8',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | Mapping[str, str] | None = None,
    track_stalls: bool = False,
    kernel: str = 'auto',
) -> optax.GradientTransformationExtraArgs:
  r"""Lion with its momentum stored in low precision.

  ``optax.chain(quantize_state(scale_by_lion(...)), add_decayed_weights,
  scale_by_learning_rate)``, the chain of ``optax.lion``. With `D` the
  decoder and `Q` the encoder of ``mu_format``:

  ```tex
  c_t = \beta_1 D(\mu_{t-1}) + (1 - \beta_1) g_t, \qquad
  u_t = -\eta_t \big(\operatorname{sign}(c_t) + \lambda w_{t-1}\big), \\
  \mu_t = Q\big(\beta_2 D(\mu_{t-1}) + (1 - \beta_2) g_t\big).
  ```

  Args:
    learning_rate: A float or an Optax schedule.
    b1: Decay of the momentum used in the update, in [0, 1).
    b2: Decay of the stored momentum, in [0, 1).
    weight_decay: Decoupled weight decay, >= 0, or an Optax schedule.
    mask: As in ``optax.lion``.
    mu_format: Format of the momentum (see [`get_format`][optax_q.get_format]);
      signed. Linear ``'int8'`` by default, not the dynamic map of the other
      drop-ins: Lion's update is the sign of a mix of the momentum and the
      gradient, decided by the values near the block maximum, where linear
      int8's spacing (0.8% of the maximum) is finer than the dynamic map's
      (2.8%). On Optax's Rosenbrock test (10,000 steps, within 3e-2) linear
      int8 passes for 4 seeds (0.32-0.66 of the tolerance, as float32's
      0.66), ``'int8_dynamic'`` fails all 4 (1.95-3.62x the tolerance) and
      ``'fp8_e4m3'`` 2 of 4; 8-bit Muon stores its momentum in linear int8
      for the same reason.
    rounding: ``'nearest'`` or ``'stochastic'``.
    block_size: Elements per scale along the last axis; None: 128.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements keep float32 state; None: 4096.
    scale_mode: None (the formats' default: ``'block'`` float32 scales for
      narrow grids), or ``'block'``, ``'block_pow2'`` (shared power-of-two
      scales, one byte per block as OCP MX: 4.06 bits per element for a
      4-bit state at block 128), ``'row'``, ``'tensor'``, ``'rank1'`` (a
      scale per row and per column, Li et al., 2023), ``'none'``, or a dict
      per moment such as ``{'nu': 'rank1'}``; see
      [`quantize_state`][optax_q.quantize_state].
    track_stalls: Record each quantized leaf's stalled fraction, as for
      [`adamw`][optax_q.adamw].
    kernel: How tiled moments are updated, as for [`adamw`][optax_q.adamw].

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.lion(1e-4, mu_format='fp8_e4m3', min_size=0)
    >>> state = tx.init({'w': jnp.zeros((8, 256))})
    >>> optax_q.state_bits_per_element(state)
    8.25

  References:
    Chen et al, [Symbolic Discovery of Optimization
    Algorithms](https://arxiv.org/abs/2302.06675), 2023
  """
  b1 = _check_decay(b1, 'b1')
  b2 = _check_decay(b2, 'b2')
  _check_nonnegative(learning_rate, 'learning_rate', schedule=True)
  weight_decay = _check_nonnegative(weight_decay, 'weight_decay',
                                    schedule=True)
  formats = _moment_formats({'mu_format': ('mu', mu_format)})
  return optax.chain(
      _wrap(optax.scale_by_lion(b1=b1, b2=b2), formats, rounding=rounding,
            block_size=block_size, seed=seed, min_size=min_size, scale_mode=scale_mode,
            track_stalls=track_stalls, kernel=kernel),
      optax.add_decayed_weights(weight_decay, mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    *,
    mu_format: Any = 'int8_dynamic',
    rounding: str = 'stochastic',
    block_size: int | None = None,
    seed: int | None = None,
    min_size: int | None = None,
    scale_mode: str | Mapping[str, str] | None = None,
    track_stalls: bool = False,
    kernel: str = 'auto',
) -> optax.GradientTransformationExtraArgs:
  r"""SGD with momentum (the ``trace``) stored in low precision.

  With `D` the decoder and `Q` the encoder of ``mu_format``, momentum
  `\beta`:

  ```tex
  m_t = g_t + \beta D(\mu_{t-1}), \qquad \mu_t = Q(m_t), \qquad
  u_t = -\eta_t\, m_t \quad\text{(Nesterov: } -\eta_t (g_t + \beta m_t)
  \text{)}.
  ```

  Without ``momentum`` there is no state, and this is ``optax.sgd`` (the
  storage arguments are still checked).

  Args:
    learning_rate: A float or an Optax schedule.
    momentum: Decay of the momentum, in [0, 1), or None for plain SGD.
    nesterov: Nesterov momentum, as in ``optax.sgd``.
    mu_format: Format of the momentum (see [`get_format`][optax_q.get_format]);
      signed.
    rounding: ``'nearest'`` or ``'stochastic'``.
    block_size: Elements per scale along the last axis; None: 128.
    seed: Seed of the stochastic rounding; None: 0.
    min_size: Leaves with fewer elements keep float32 state; None: 4096.
    scale_mode: None (the formats' default: ``'block'`` float32 scales for
      narrow grids), or ``'block'``, ``'block_pow2'`` (shared power-of-two
      scales, one byte per block as OCP MX: 4.06 bits per element for a
      4-bit state at block 128), ``'row'``, ``'tensor'``, ``'rank1'`` (a
      scale per row and per column, Li et al., 2023), ``'none'``, or a dict
      per moment such as ``{'nu': 'rank1'}``; see
      [`quantize_state`][optax_q.quantize_state].
    track_stalls: Record each quantized leaf's stalled fraction, as for
      [`adamw`][optax_q.adamw].
    kernel: How tiled moments are updated, as for [`adamw`][optax_q.adamw].

  Returns:
    An Optax gradient transformation.

  Raises:
    ValueError: at construction, naming the bad argument and the allowed
      values.

  Examples:
    >>> import jax.numpy as jnp, optax_q
    >>> tx = optax_q.sgd(1e-2, momentum=0.9, mu_format='int8', min_size=0)
    >>> state = tx.init({'w': jnp.zeros((8, 256))})
    >>> sorted(optax_q.quantized_leaves(state))
    ['0/inner_state/trace/w']

  References:
    Sutskever et al, [On the importance of initialization and momentum in
    deep learning](http://proceedings.mlr.press/v28/sutskever13.html), 2013
  """
  _check_nonnegative(learning_rate, 'learning_rate', schedule=True)
  if momentum is not None:
    momentum = _check_decay(momentum, 'momentum')
  nesterov = validation.check_bool(nesterov, 'nesterov')
  formats = _moment_formats({'mu_format': ('trace', mu_format)})
  storage = dict(rounding=rounding, block_size=block_size, seed=seed,
                 min_size=min_size, scale_mode=scale_mode, track_stalls=track_stalls,
                 kernel=kernel)
  if momentum is None:  # No state to store, but the arguments still count.
    transform.StorageConfig(formats=formats, elementwise=True, **storage)
    return optax.chain(optax.identity(),
                       optax.scale_by_learning_rate(learning_rate))
  return optax.chain(
      _wrap(optax.trace(decay=momentum, nesterov=nesterov), formats,
            **storage),
      optax.scale_by_learning_rate(learning_rate))
