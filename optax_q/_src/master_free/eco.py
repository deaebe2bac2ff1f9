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
"""ECO: training quantized weights without master weights.

After an ordinary optimizer step on the quantized weights ``w``, the new
weights ``w~ = w + u`` are quantized again and the residual
``e = w~ - q(w~)`` is injected into the momentum buffer, scaled so that the
momentum's future steps re-apply ``e`` in total (Nikdan et al., 2026,
Algorithms 2 and 3):

* SGD with momentum ``beta``: ``m <- m~ + (1 - 1/beta) / lr * e``;
* Adam: ``m <- m~ + (1 - b1**t) / lr * (1 - 1/b1) * (sqrt(v_hat) + eps) * e``;

times ``(1 - lr * weight_decay)`` with decoupled weight decay. The residual
displaces future iterates by ``-lr * coefficient * e * sum_k beta**k = +e``.
The memory-ful variant (Appendix A) keeps ``e_t`` and injects
``(1 - lr wd) / lr * e_t - (1 - lr wd) / (lr beta) * e_{t+1}``, which
reproduces SGD with momentum and master weights exactly for a fixed
learning rate and a deterministic quantizer.
"""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.core import validation
from optax_q._src.master_free import weights
from optax_q._src.state import state_tree
from optax_q._src.state import transform

VARIANTS = ('eco', 'exact', 'naive')
_MOMENTS = (optax.ScaleByAdamState, optax.TraceState)


class EcoState(NamedTuple):
  """State of [`eco`][optax_q.eco].

  Attributes:
    count: Steps taken (int32), mixed into the weights' rounding bits.
    inner_state: The inner optimizer's state (its first moment carries the
      fed-back residuals).
    error: The memory-ful variant's last residual per quantized parameter
      (float32; None elsewhere), or None.
  """

  count: jax.Array
  inner_state: Any
  error: Any = None


def _children(node: Any) -> list[Any]:
  if isinstance(node, dict):
    return list(node.values())
  if isinstance(node, (tuple, list)):
    return list(node)
  return []


def _find_all(node: Any, test: Callable[[Any], bool]) -> list[Any]:
  if test(node):
    return [node]
  return [x for c in _children(node) for x in _find_all(c, test)]


def _is_moment(x: Any) -> bool:
  return isinstance(x, _MOMENTS)


def _has_hyperparams(x: Any) -> bool:
  return state_tree.is_namedtuple(x) and isinstance(
      getattr(x, 'hyperparams', None), dict)


@dataclasses.dataclass(frozen=True)
class EcoConfig:
  """The static settings of one `eco` transform, checked by `eco`."""

  fmt: formats_lib.Format | None  # The weights' format (None: as stored).
  rounding: str  # 'nearest' or 'stochastic' requantization.
  variant: str  # One of VARIANTS.
  decay_factor: bool  # Coefficient times 1 - lr * weight_decay.
  seed: int  # Of the weights' stochastic rounding.
  quantizer: Any  # None, or the simulation mode's (w, key) -> w_hat.


class _Hyper(NamedTuple):
  """The inner optimizer's hyperparameters of one step (float32)."""

  learning_rate: jax.Array
  beta: jax.Array
  weight_decay: jax.Array
  b2: jax.Array | None
  eps: jax.Array | None
  eps_root: jax.Array | None


def _hyper(state: Any, adam: bool) -> _Hyper:
  hp = _find_all(state, _has_hyperparams)[0].hyperparams
  f32 = lambda k, d=0.0: jnp.asarray(hp.get(k, d), jnp.float32)
  return _Hyper(
      learning_rate=f32('learning_rate'),
      beta=f32('b1') if adam else f32('momentum'),
      weight_decay=f32('weight_decay'),
      b2=f32('b2') if adam else None,
      eps=f32('eps') if adam else None,
      eps_root=f32('eps_root') if adam else None)


def _probe(inner: optax.GradientTransformation) -> tuple[bool, dict]:
  """Checks ``inner`` at construction; whether it is Adam, and its
  hyperparameters at step 0."""
  state = inner.init({'w': jnp.zeros((2, 2), jnp.float32)})
  found = _find_all(state, _has_hyperparams)
  moments = _find_all(state, _is_moment)
  supported = ('eco supports SGD with momentum (optax.sgd with momentum) '
               'and Adam/AdamW (optax.adam, optax.adamw)')
  if _find_all(state, lambda x: isinstance(x, transform.QuantizedState)
               or qarray_lib.is_qarray(x)):
    raise ValueError(
        'inner keeps quantized state (an optax_q optimizer or '
        'quantize_state), but eco reads and writes its float32 first '
        'moment. For low-bit moments, quantize around eco: '
        'optax_q.quantize_state(optax_q.eco(optax.inject_hyperparams('
        "optax.adamw)(1e-3)), {'mu': 'int8', 'nu': 'ue4m0'}).")
  if len(found) != 1:
    raise ValueError(
        f'inner must expose its hyperparameters exactly once ({len(found)} '
        'sets found): build it with optax.inject_hyperparams, e.g. '
        'optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3)), so that '
        'eco reads the learning rate and momentum of every step.')
  if _find_all(state, lambda x: state_tree.is_namedtuple(x)
               and 'muon' in type(x).__name__.lower()):
    raise ValueError(
        f'inner is Muon, which eco does not support: {supported}. Muon '
        'orthogonalises its momentum before the step, so a residual fed '
        'into the momentum is not re-applied as it is.')
  if len(moments) != 1:
    raise ValueError(
        f'inner must be SGD with momentum or Adam/AdamW; its state holds '
        f'{len(moments)} momentum states (optax.ScaleByAdamState or '
        f'optax.TraceState): {supported}.')
  adam = isinstance(moments[0], optax.ScaleByAdamState)
  hp = {k: np.asarray(v) for k, v in found[0].hyperparams.items()}
  beta_name = 'b1' if adam else 'momentum'
  if 'learning_rate' not in hp or beta_name not in hp:
    raise ValueError(
        f'inner has no numeric learning_rate or {beta_name} among its '
        f'hyperparameters {sorted(hp)} (each a number, a scalar array or a '
        f'schedule): {supported}.')
  for name, value in hp.items():
    if np.ndim(value) != 0:
      raise ValueError(f'{name} must be a scalar, got shape '
                       f'{np.shape(value)}.')
  lr = float(hp['learning_rate'])
  if not np.isfinite(lr) or lr < 0:
    raise ValueError(
        f'learning_rate must be a finite number >= 0, got {lr} (at step 0).')
  beta = float(hp[beta_name])
  if not 0.0 < beta < 1.0:
    raise ValueError(
        f'{beta_name} must be in (0, 1) for ECO, got {beta}: the feedback '
        f'coefficient (1 - 1/{beta_name}) / learning_rate needs momentum '
        '(plain SGD has no buffer to carry the residual).')
  # The other hyperparameters eco reads, as the optimizers check them.
  for name, high in (('b2', 1.0), ('eps', None), ('eps_root', None),
                     ('weight_decay', None)):
    if name in hp:
      validation.check_number(hp[name], f"inner's {name}", high=high)
  _check_update_rule(inner, adam)
  return adam, hp


def _check_update_rule(inner, adam: bool) -> None:
  """Runs ``inner`` for a few steps on a small problem and checks that its
  updates are what the feedback coefficient assumes: ``-lr m`` for SGD with
  heavy-ball momentum, ``-lr (m_hat / (sqrt(v_hat + eps_root) + eps) +
  wd w)`` for Adam/AdamW. Nesterov momentum, NAdam, AdaMax, RAdam, LAMB or a
  transform after the optimizer's step fail here: their momentum re-applies
  an injected residual differently."""
  params = {'w': jnp.array([[0.5, -1.0, 2.0], [-0.25, 1.5, -3.0]],
                           jnp.float32)}
  state = inner.init(params)
  for step in range(3):
    grads = {'w': jnp.array([[1.0, -2.0, 0.5], [3.0, -0.5, 0.25]],
                            jnp.float32) * (1.0 + 0.5 * step)}
    updates, state = optax.with_extra_args_support(inner).update(
        grads, state, params)
    h = _hyper(state, adam)
    moment = _find_all(state, _is_moment)[0]
    lr = float(h.learning_rate)
    if adam:
      t = float(moment.count)
      m_hat = moment.mu['w'] / (1 - float(h.beta) ** t)
      v_hat = moment.nu['w'] / (1 - float(h.b2) ** t)
      direction = m_hat / (jnp.sqrt(v_hat + h.eps_root) + h.eps)
      # With or without decay: a weight-decay mask may leave the probe out.
      wants = [-lr * (direction + h.weight_decay * params['w']),
               -lr * direction]
    else:
      wants = [-lr * moment.trace['w']]
    if not any(np.allclose(updates['w'], w, rtol=1e-4, atol=1e-7)
               for w in wants):
      raise ValueError(
          'inner is not SGD with momentum or Adam/AdamW as eco expects: its '
          'update is not -lr * momentum (SGD) or -lr * (m_hat / (sqrt(v_hat)'
          ' + eps) + weight_decay * w) (Adam). Nesterov momentum, NAdam, '
          'AdaMax, RAdam, LAMB and transforms after the optimizer are not '
          'supported: put clipping and scaling before eco, and use '
          'optax.sgd(lr, momentum) or optax.adam/adamw without nesterov.')
    params = jax.tree.map(lambda p, u: p + u, params, updates)


def _as_float32(tree: Any) -> Any:
  return jax.tree.map(
      lambda x: qarray_lib.decode(x, jnp.float32) if qarray_lib.is_qarray(x)
      else (x.astype(jnp.float32) if state_tree.is_float_array(x) else x),
      tree, is_leaf=qarray_lib.is_qarray)


def _check_formats(config, params) -> None:
  """Every quantized parameter is stored in ``weight_format`` (if given)."""
  if config.fmt is None:
    return
  flat = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=qarray_lib.is_qarray)[0]
  for path, p in flat:
    if qarray_lib.is_qarray(p) and p.fmt != config.fmt:
      raise ValueError(
          f'weight_format={config.fmt.name!r}, but parameter '
          f'{state_tree.path_str(path)!r} is stored as {p.fmt.name!r}: '
          'quantize_params with the same format, or pass '
          f'weight_format={p.fmt.name!r} (or None to accept each '
          "parameter's own).")


def _init(inner, config, params) -> EcoState:
  _check_formats(config, params)
  # The inner optimizer runs in float32 whatever the weights' dtype: its
  # moments are float32 (quantize_state shrinks them), and
  # ``optax.inject_hyperparams``, which casts hyperparameters to the
  # parameters' dtype, keeps b2 = 0.999 (bf16 would round it to 1.0).
  inner_state = inner.init(_as_float32(params))
  error = None
  if config.variant == 'exact':
    error = jax.tree.map(
        lambda x: jnp.zeros(x.shape, jnp.float32)
        if _is_quantized(config, x) else None,
        params, is_leaf=qarray_lib.is_qarray)
  return EcoState(count=jnp.zeros([], jnp.int32), inner_state=inner_state,
                  error=error)


def _is_quantized(config, p) -> bool:
  """Whether parameter ``p`` takes the feedback: a QArray, or any float
  leaf when a ``quantizer`` simulates the weights' format."""
  return qarray_lib.is_qarray(p) or (
      config.quantizer is not None and state_tree.is_float_array(p))


def _update(  # pylint: disable=too-many-branches
    inner, config, updates, state, params=None, **extra_args):
  """One step of `eco`: the inner update, then per quantized parameter the
  requantized weights and the residual fed into the first moment."""
  if params is None:
    raise ValueError('eco needs params in update(updates, state, params).')
  _check_formats(config, params)  # init may have seen float params.
  treedef = jax.tree.structure(params, is_leaf=qarray_lib.is_qarray)
  flat_p = jax.tree.leaves(params, is_leaf=qarray_lib.is_qarray)
  try:
    flat_g = treedef.flatten_up_to(updates)
  except (ValueError, TypeError) as e:
    raise ValueError(
        f'eco: the gradients do not have the structure of params: {e}'
        ) from None
  theta = [qarray_lib.decode(p, jnp.float32) if qarray_lib.is_qarray(p)
           else p for p in flat_p]
  grads32 = [g.astype(jnp.float32) if state_tree.is_float_array(g) else g
             for g in flat_g]
  u, inner_state = optax.with_extra_args_support(inner).update(
      treedef.unflatten(grads32), state.inner_state,
      _as_float32(treedef.unflatten(theta)), **extra_args)

  # This step's feedback: the coefficient (1 - lr wd) / lr, 0 where the
  # learning rate is 0, negative or not finite (no feedback), and Adam's
  # bias corrections at this step's t.
  moment = _find_all(inner_state, _is_moment)[0]
  adam = isinstance(moment, optax.ScaleByAdamState)
  h = _hyper(inner_state, adam)
  lr = h.learning_rate
  active = jnp.isfinite(lr) & (lr > 0)
  decay = (1 - lr * h.weight_decay if config.decay_factor
           else jnp.float32(1))
  coeff = jnp.where(active, decay / jnp.where(active, lr, jnp.float32(1)),
                    jnp.float32(0))
  bias1 = bias2 = None
  if adam:
    t = moment.count.astype(jnp.float32)
    bias1, bias2 = 1 - h.beta ** t, 1 - h.b2 ** t

  def gain(nu: jax.Array | None) -> jax.Array:
    r"""Per element, the step the momentum is taken with (`\gamma_t` of
    `eco`'s docstring; 1 for SGD)."""
    if nu is None:
      return jnp.float32(1)
    nu_hat = nu.astype(jnp.float32) / bias2
    return bias1 * (jnp.sqrt(nu_hat + h.eps_root) + h.eps)

  flat_m = treedef.flatten_up_to(moment.mu if adam else moment.trace)
  flat_nu = (treedef.flatten_up_to(moment.nu) if adam
             else [None] * len(flat_p))
  flat_err = [None] * len(flat_p)
  if state.error is not None:
    flat_err = jax.tree.leaves(state.error, is_leaf=lambda x: x is None)
    if len(flat_err) != len(flat_p):
      raise ValueError('eco: the state was initialised with other params.')
  # Per parameter: (update, new first moment, residual).
  out = []
  for i, (p, w, du, m, nu, err) in enumerate(zip(
      flat_p, theta, treedef.flatten_up_to(u), flat_m, flat_nu, flat_err)):
    if not _is_quantized(config, p):
      out.append((du if du is None else jnp.asarray(du).astype(
          jnp.asarray(p).dtype), m, None))
      continue
    key = None
    if config.rounding == 'stochastic' or not qarray_lib.is_qarray(p):
      key = weights.param_key(config.seed, state.count, i)
    # The new weights w~ = w + u, requantized, and the residual
    # e = w~ - D(Q(w~)): the codec's encode and decode for a QArray (whose
    # update is the new QArray), else the quantizer's values.
    w = w.astype(jnp.float32)
    w_new = w + du.astype(jnp.float32)
    if qarray_lib.is_qarray(p):
      q = qarray_lib.encode_like(p, w_new, key=key)
      update = weights.NewWeights.of(q)
      e = w_new - qarray_lib.decode(q, jnp.float32)
    else:
      w_hat = jnp.asarray(config.quantizer(w_new, jax.random.key(key)),
                          jnp.float32)
      update = (w_hat - w).astype(p.dtype)
      e = w_new - w_hat
    m32 = m.astype(jnp.float32)
    if config.variant == 'exact':
      if err is None:
        raise ValueError(
            'eco: the state holds no residual for a quantized parameter; '
            'initialise it with the quantized params (tx.init(qparams)).')
      inject = coeff * gain(nu) * (err - e / h.beta)
      # A step without feedback (learning rate 0) keeps the residual due.
      err = jnp.where(active, e, err + e)
    elif config.variant == 'eco':
      inject = coeff * gain(nu) * (1 - 1 / h.beta) * e
    else:
      out.append((update, m, None))
      continue
    # A learning rate so small that the injection overflows float32 (or a
    # non-finite residual) skips the feedback of that element.
    fed = m32 + inject
    m32 = jnp.where(jnp.isfinite(fed) | ~jnp.isfinite(m32), fed, m32)
    out.append((update, m32.astype(m.dtype), err))
  new_u, new_m, new_err = zip(*out) if out else ((), (), ())
  new_m_tree = treedef.unflatten(list(new_m))
  moment = (moment._replace(mu=new_m_tree) if adam
            else moment._replace(trace=new_m_tree))
  inner_state = jax.tree.map(
      lambda x: moment if _is_moment(x) else x, inner_state,
      is_leaf=_is_moment)
  error = (treedef.unflatten(list(new_err)) if config.variant == 'exact'
           else None)
  return treedef.unflatten(list(new_u)), EcoState(
      count=optax.safe_increment(state.count), inner_state=inner_state,
      error=error)


def eco(
    inner: optax.GradientTransformation,
    weight_format: str | formats_lib.Format | None = None,
    *,
    rounding: str = 'stochastic',
    variant: str = 'eco',
    decay_factor: bool = True,
    seed: int = 0,
    quantizer: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> optax.GradientTransformationExtraArgs:
  r"""Trains quantized parameters without master weights (ECO).

  ``update(grads, state, params)`` takes ``params`` with
  [`QArray`][optax_q.QArray] leaves (from
  [`quantize_params`][optax_q.quantize_params]), runs ``inner`` in float32 on
  the decoded weights, quantizes each new weight ``w~ = w + u`` in its own
  layout (format, scales) with ``rounding``, and injects the residual
  ``e = w~ - q(w~)`` into ``inner``'s first moment with the paper's coefficient,
  so no float32 copy of the weights outlives the step. Its updates hold, for a
  quantized parameter, the new [`QArray`][optax_q.QArray] (apply them with
  [`optax_q.apply_updates`][optax_q.apply_updates]), for a plain one the inner
  update: ``eco`` goes last in an ``optax.chain`` (clipping before it).

  Step `t` (Adam's bias-correction count) takes the stored weights
  `\hat\theta_{t-1}` to `\hat\theta_t`: ``inner`` runs on
  `\theta_{t-1} = D(\hat\theta_{t-1})` and gives the update `u_t` and its
  first moment `\tilde m_t`, then

  ```tex
  \tilde\theta_t = \theta_{t-1} + u_t, \qquad
  \hat\theta_t = Q(\tilde\theta_t), \qquad
  e_t = \tilde\theta_t - D(\hat\theta_t),
  \\
  m_t = \tilde m_t + \frac{1 - \eta_t \lambda}{\eta_t}\, \gamma_t
    \Big(1 - \frac{1}{\beta}\Big)\, e_t, \qquad
  \gamma_t = \begin{cases}
    1 & \text{SGD with momentum,} \\
    (1 - \beta_1^t) \Big(\sqrt{\dfrac{v_t}{1 - \beta_2^t}
      + \epsilon_{root}} + \epsilon\Big) & \text{Adam,}
  \end{cases}
  ```

  where `Q` encodes in the parameter's own layout (format, scales) with
  ``rounding`` and `D` decodes (as in
  [`quantize_state`][optax_q.quantize_state]), `\eta_t`, `\lambda` and
  `\beta` (``momentum`` or ``b1``) are this step's hyperparameters of
  ``inner``, `v_t` is Adam's second moment after the step, and `m_t`
  replaces `\tilde m_t` in ``inner``'s state (the paper's Algorithms 2
  and 3, with the factor `1 - \eta_t \lambda` of decoupled weight decay;
  1 with ``decay_factor=False``). For SGD with a constant learning rate,
  the residual comes back whole through the momentum's future steps:
  `-\eta \sum_{k \ge 1} \beta^k \cdot \frac{1}{\eta}
  (1 - \frac{1}{\beta})\, e_t = e_t` (without weight decay); for Adam
  this holds while `\gamma_t` changes slowly. ``variant='exact'``
  keeps `e_t` in the state and injects
  `\frac{1 - \eta_t \lambda}{\eta_t} \gamma_t (e_{t-1} - e_t / \beta)`
  instead; ``'naive'`` injects nothing (`m_t = \tilde m_t`).

  ``inner`` is SGD with momentum or Adam/AdamW built with
  ``optax.inject_hyperparams`` (``optax.sgd``, ``optax.adam``,
  ``optax.adamw``, schedules welcome), from whose state ``eco`` reads the
  learning rate, momentum and weight decay of every step. A step whose
  learning rate is 0 (or negative, or not finite) skips the feedback
  instead of dividing by it, and so does an element whose injection would
  overflow float32 (a learning rate near float32's smallest normal). Wrap the
  result in [`quantize_state`][optax_q.quantize_state] to store the moments in
  low precision: the feedback then happens before the first moment is encoded,
  once per step. Keep that first moment at 8 bits or more (it carries residuals
  of the size of a weight's rounding step divided by the learning rate); the
  second moment may go lower (see the docs' ECO page for the measurements).

  Args:
    inner: ``optax.inject_hyperparams(optax.adamw)(...)``,
      ``...(optax.adam)(...)`` or ``...(optax.sgd)(lr, momentum=...)``, with
      momentum (``b1`` or ``momentum``) in (0, 1).
    weight_format: The format the quantized parameters are stored in
      (checked at ``init`` and ``update``, naming both formats); None
      accepts that of each parameter.
    rounding: ``'stochastic'`` (unbiased; the paper's recommendation) or
      ``'nearest'``: how new weights are quantized.
    variant: ``'eco'`` (the paper's memory-free rule), ``'exact'`` (the
      memory-ful variant of Appendix A: one float32 residual per quantized
      weight in the state; equal to master-weight training for SGD with a
      fixed learning rate and nearest rounding) or ``'naive'`` (no
      feedback: master weights simply removed, the paper's baseline).
    decay_factor: Multiply the coefficient by ``1 - lr * weight_decay``
      (the exact factor with decoupled weight decay).
    seed: Seed of the weights' stochastic rounding, an int in
      ``[0, 2**32 - 1]``.
    quantizer: Simulation mode, for research: a callable ``(w, key) ->
      w_hat`` (float32 in and out, ``key`` a ``jax.random`` key fresh for
      every step and leaf) that stands for the weights' format on the
      *plain* float leaves, which then stay float arrays holding
      ``w_hat`` (e.g. the paper's additive-noise model ``w + sigma *
      normal``). [`QArray`][optax_q.QArray] leaves keep their codec.

  Returns:
    A gradient transformation whose state is an [`EcoState`][optax_q.EcoState].

  Raises:
    ValueError: at construction, naming the argument: an unknown weight
      format, rounding or variant; ``inner`` without injected
      hyperparameters or without momentum, or Muon (not supported);
      ``b1`` or ``momentum`` not in (0, 1) (0 would make the coefficient
      infinite); a negative learning rate; ``b2`` not in [0, 1), a negative
      or non-finite ``eps``, ``eps_root`` or ``weight_decay``;
      ``nesterov=True``.

  Examples:
    >>> import jax.numpy as jnp, optax, optax_q
    >>> params = optax_q.quantize_params({'kernel': jnp.ones((4, 8))})
    >>> tx = optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3),
    ...                  weight_format='fp8_e4m3')
    >>> state = tx.init(params)
    >>> updates, state = tx.update({'kernel': jnp.ones((4, 8))}, state,
    ...                            params)
    >>> params = optax_q.apply_updates(params, updates)
    >>> params['kernel'].codes.dtype
    dtype(float8_e4m3fn)

  References:
    Nikdan et al, [ECO: Quantized Training without Full-Precision Master
    Weights](https://arxiv.org/abs/2601.22101), 2026
  """
  validation.check_transform(inner)
  fmt = (None if weight_format is None
         else weights.check_weight_format(weight_format, 'weight_format'))
  if fmt is not None:
    weights.check_stored_format(fmt, 'weight_format')
  validation.check_rounding(rounding)
  validation.check_choice(variant, 'variant', VARIANTS)
  decay_factor = validation.check_bool(decay_factor, 'decay_factor')
  seed = validation.check_seed(seed)
  _probe(inner)
  if quantizer is not None and not callable(quantizer):
    raise ValueError('quantizer must be None or a callable (w, key) -> '
                     f'w_hat, got {validation.short(quantizer)}.')
  config = EcoConfig(fmt=fmt, rounding=rounding, variant=variant,
                     decay_factor=decay_factor, seed=seed,
                     quantizer=quantizer)
  return optax.GradientTransformationExtraArgs(
      functools.partial(_init, inner, config),
      functools.partial(_update, inner, config))
