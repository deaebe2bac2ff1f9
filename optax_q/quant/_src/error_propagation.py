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
"""How quantization error accumulates through a network (Vlassis et al.).

With layers ``h_l = f_l(h_{l-1})`` and their quantized versions
``hq_l = fq_l(hq_{l-1})``, the change of a layer's output splits
(Shapley: the average over both orders) into a propagated part and a local
part:

```python
a = ((fq(hq) - fq(h)) + (f(hq) - f(h))) / 2      # the input's error
b = ((fq(hq) - f(hq)) + (fq(h) - f(h))) / 2      # the layer's own error
```

and its relative squared error ``R = |hq_l - h_l|^2 / |h_l|^2`` into
``A + B + C`` (``A = |a|^2 / |h_l|^2``, ``B = |b|^2 / |h_l|^2``,
``C = 2 <a, b> / |h_l|^2``). Norms are over the whole array (every token of
the batch). The gain of a layer is ``G = A / R_in``; for a linear layer it
factors into a spectral and an alignment ratio, ``G = G1 G2`` (exact when the
layer's quantized map is ``x -> x (W + eps_W)^T``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from optax_q.quant._src import linear_quant
from optax_q.quant._src import outliers
from optax_q.quant._src import quantizers

LayerChoice = Callable[[tuple[str, ...]], bool]
METHODS = ('__call__', 'attend')


class LayerError(NamedTuple):
  """The error decomposition of one layer (float32 scalars).

  Attributes:
    r_in: Relative squared error of the layer's input, ``R_{l-1}``.
    r: Relative squared error of its output, ``R_l = A + B + C``.
    a: Accumulated (propagated) part ``A_l``.
    b: Local part ``B_l``.
    c: Interaction ``C_l``.
  """

  r_in: jax.Array
  r: jax.Array
  a: jax.Array
  b: jax.Array
  c: jax.Array


class LinearGain(NamedTuple):
  """A linear layer's gain ``G = A / R_in`` and its factors.

  Attributes:
    gain: ``A_l / R_{l-1}`` as measured.
    spectral: ``G1 = (|W + eps_W / 2|_2 / |W|_2)^2``.
    alignment: ``G2 = (cos phi / cos psi)^2``, with
      ``cos(M, x) = |x M^T| / (|M|_2 |x|)``, ``phi`` between the input's
      error and ``W + eps_W / 2``, ``psi`` between the input and ``W``.
  """

  gain: jax.Array
  spectral: jax.Array
  alignment: jax.Array


def _sq(x) -> jax.Array:
  x = jnp.asarray(x, jnp.float32)
  return jnp.sum(x * x)


def relative_error(reference: jax.Array, approx: jax.Array) -> jax.Array:
  """``|approx - reference|^2 / |reference|^2`` over the whole array.

  Of a model's outputs (logits) this is the study's predictor ``R_L``:
  it needs only the full-precision and the quantized forward pass.

  Args:
    reference: The full-precision values.
    approx: The quantized model's values, same shape.

  Returns:
    A float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> quant.relative_error(jnp.array([3., 4.]), jnp.array([3., 5.]))
    Array(0.04, dtype=float32)
  """
  reference, approx = jnp.asarray(reference), jnp.asarray(approx)
  if reference.shape != approx.shape:
    raise ValueError(f'reference and approx must have one shape, got '
                     f'{reference.shape} and {approx.shape}.')
  reference = jnp.asarray(reference, jnp.float32)
  approx = jnp.asarray(approx, jnp.float32)
  # Both divided by the reference's maximum: nothing overflows.
  absmax = jnp.max(jnp.abs(reference))
  pre = quantizers.prescale(absmax)
  scale = jnp.where(absmax > 0, absmax * pre, 1.0)
  return (_sq((approx * pre - reference * pre) / scale)
          / _sq(reference * pre / scale))


def split(h_in, hq_in, f_h, f_hq, fq_h, fq_hq) -> LayerError:
  """The decomposition from the four evaluations of one layer."""
  a = 0.5 * ((fq_hq - fq_h) + (f_hq - f_h))
  b = 0.5 * ((fq_hq - f_hq) + (fq_h - f_h))
  norm = _sq(f_h)
  a32, b32 = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
  r_in = (relative_error(h_in, hq_in)
          if jnp.issubdtype(jnp.asarray(h_in).dtype, jnp.floating)
          else jnp.float32(0))
  return LayerError(
      r_in=r_in, r=relative_error(f_h, fq_hq), a=_sq(a32) / norm,
      b=_sq(b32) / norm, c=2 * jnp.sum(a32 * b32) / norm)


def error_decomposition(
    layers: Sequence[tuple[Callable[[Any], Any], Callable[[Any], Any]]],
    x: Any,
) -> list[LayerError]:
  """``R = A + B + C`` for each layer of a sequential network.

  Runs the full-precision chain ``h_l = f_l(h_{l-1})`` and the quantized
  chain ``hq_l = fq_l(hq_{l-1})`` from the same input, and evaluates each
  layer on the other chain's input for the cross terms (four evaluations
  per layer).

  Args:
    layers: ``(f, fq)`` pairs: each layer and its quantized version.
    x: The network's input.

  Returns:
    One [`LayerError`][optax_q.quant.LayerError] per layer.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> w = jnp.array([[1.0, 0.3], [-0.2, 0.9]])
    >>> q = quant.rtn(3)
    >>> layer = (lambda h: h @ w.T, lambda h: q(h) @ q(w).T)
    >>> errs = quant.error_decomposition([layer, layer], jnp.ones((4, 2)))
    >>> e = errs[1]
    >>> bool(jnp.isclose(e.a + e.b + e.c, e.r, rtol=1e-5))
    True

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025
  """
  if not isinstance(layers, (list, tuple)):
    raise ValueError(f'layers must be a list of (f, fq) pairs, got '
                     f'{type(layers).__name__}.')
  if not layers:
    raise ValueError('layers must hold at least one (f, fq) pair, got an '
                     f'empty {type(layers).__name__}.')
  h = hq = x
  out = []
  for i, pair in enumerate(layers):
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
        or not all(callable(f) for f in pair)):
      raise ValueError(f'layers[{i}] must be a pair (f, fq) of functions.')
    f, fq = pair
    f_h, fq_hq = f(h), fq(hq)
    out.append(split(h, hq, f_h, f(hq), fq(h), fq_hq))
    h, hq = f_h, fq_hq
  return out


def _spectral(m: jax.Array) -> jax.Array:
  return jnp.linalg.norm(m, 2)


def linear_gain(w: jax.Array, w_q: jax.Array, h: jax.Array,
                hq: jax.Array) -> tuple[jax.Array, jax.Array]:
  """A linear layer's spectral and alignment ratios ``(G1, G2)``.

  For ``x -> x W^T`` quantized as ``x -> x (W + eps_W)^T`` the propagated
  error is ``a = dh (W + eps_W / 2)^T`` and ``A / R_in = G1 G2`` exactly,
  with the cosine of a matrix and a vector ``|x M^T| / (|M|_2 |x|)``.

  Args:
    w: The weight as ``(outputs, inputs)``.
    w_q: The quantized weight, same shape.
    h: The layer's full-precision input, ``(..., inputs)``.
    hq: Its input in the quantized network.

  Returns:
    ``(G1, G2)``, float32 scalars (``G2`` is NaN when ``hq == h``).

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> w = jnp.eye(2)
    >>> g1, g2 = quant.linear_gain(w, w, jnp.ones((1, 2)),
    ...                            jnp.array([[1., 1.5]]))
    >>> float(g1), float(g2)
    (1.0, 1.0)
  """
  w, w_q = jnp.asarray(w, jnp.float32), jnp.asarray(w_q, jnp.float32)
  if w.ndim != 2 or w_q.shape != w.shape:
    raise ValueError(f'w must be a matrix and w_q of its shape, got '
                     f'{w.shape} and {w_q.shape}.')
  if jnp.shape(h) != jnp.shape(hq) or jnp.shape(h)[-1:] != w.shape[1:]:
    raise ValueError(f'h and hq must have one shape ending in w\'s inputs '
                     f'{w.shape[1]}, got {jnp.shape(h)} and {jnp.shape(hq)}.')
  m = 0.5 * (w + w_q)
  h = jnp.asarray(h, jnp.float32)
  dh = jnp.asarray(hq, jnp.float32) - h
  norm_w, norm_m = _spectral(w), _spectral(m)
  cos_phi = jnp.sqrt(_sq(dh @ m.T) / _sq(dh)) / norm_m
  cos_psi = jnp.sqrt(_sq(h @ w.T) / _sq(h)) / norm_w
  return (norm_m / norm_w) ** 2, (cos_phi / cos_psi) ** 2


def _input(args, kwargs, context):
  """A layer's input: its one positional argument, or a linear layer's
  input by keyword."""
  if linear_quant.is_linear(context.module, context.method_name):
    return linear_quant.linear_input(args, kwargs, context)
  return args[0]


def _with_input(args, kwargs, context, x):
  """``(args, kwargs)`` with the input replaced by ``x``."""
  if args:
    return (x,) + tuple(args[1:]), kwargs
  name = 'query' if context.method_name == 'attend' else 'inputs'
  return (), {**kwargs, name: x}


def _chosen(layers: LayerChoice | None, context, args, kwargs) -> bool:
  """Whether a call is a recorded layer: a chosen module (not while it is
  being set up) called with one positional array (keywords pass through),
  or a linear layer called with its input by keyword."""
  module, method = context.module, context.method_name
  if method not in METHODS or module.is_initializing():
    return False
  linear = linear_quant.is_linear(module, method)
  if not (layers(module.path) if layers is not None else linear):
    return False
  if len(args) == 1:
    return True
  return linear and not args and len(kwargs) == 1


def _linear_record(quantization, context, h, hq, err: LayerError):
  module, method = context.module, context.method_name
  hm, w, _, _ = linear_quant.operands(module, method, h)
  hqm = hq.reshape(hm.shape)
  w_q = (quantization.kernel(module, method, h)
         if quantization.active(module, method) else w)
  g1, g2 = linear_gain(w, w_q, hm, hqm)
  return LinearGain(gain=err.a / err.r_in, spectral=g1, alignment=g2)


def _call_again(module: nn.Module, call, x):
  """Calls a module's method again within the same call.

  A compact method reserves its submodules' names on each call; Flax
  rewinds the scope after a call returns, which the interceptor has to do
  between its calls for a module with submodules (as a transformer block).
  """
  # pylint: disable=protected-access
  if module.scope is not None and module._state.in_compact_method:
    object.__setattr__(module, 'scope', module.scope.rewound())
    module._state.autoname_cursor = {}
  return call(x)


def layer_errors(
    fn: Callable[..., Any],
    quantization: linear_quant.LinearQuantization,
    *,
    layers: LayerChoice | None = None,
) -> Callable[..., tuple[Any, Any, dict[str, Any], dict[str, Any]]]:
  """The error decomposition of every chosen layer of a Flax model.

  The wrapped function runs ``fn`` in full precision, recording each
  chosen layer's input and output, then under ``quantization``, where each
  chosen layer is also evaluated on the full-precision input and without
  quantization (four evaluations per layer). Layers must be modules
  called with the input as the one positional argument (other keyword
  arguments pass through unchanged; a linear layer may take its input by
  keyword); a chosen layer inside another chosen one is not recorded. The
  full-precision pass is full precision even inside another active
  quantization.

  Args:
    fn: A function that applies a Flax Linen model (``model.apply``).
    quantization: From [`quantize_linear`][optax_q.quant.quantize_linear],
      [`ptq`][optax_q.quant.ptq] or [`qat`][optax_q.quant.qat].
    layers: ``layers(path) -> bool`` choosing modules by path, e.g.
      ``lambda p: len(p) == 1`` for the residual stream of a GPT (every
      top-level block). None: the linear layers.

  Returns:
    A function with ``fn``'s arguments returning ``(output, quantized
    output, {layer: LayerError}, {linear layer: LinearGain})``, the layers
    by path (``jit`` returns dicts with sorted keys). A layer whose input
    has no error (``r_in = 0``) has a NaN gain. ``relative_error`` of the
    two outputs is ``R_L``.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from optax_q import quant
    >>> model = nn.Dense(4, use_bias=False)
    >>> x = jnp.linspace(-1, 1, 12).reshape(3, 4)
    >>> params = model.init(jax.random.key(0), x)
    >>> run = quant.layer_errors(model.apply, quant.ptq(4))
    >>> _, _, errors, gains = run(params, x)
    >>> err = errors['<root>']
    >>> bool(jnp.isclose(err.a + err.b + err.c, err.r, rtol=1e-4))
    True

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025
  """
  if not isinstance(quantization, linear_quant.LinearQuantization):
    raise ValueError('quantization must be an optax_q.quant.'
                     'LinearQuantization (from quant.quantize_linear, '
                     f'quant.ptq or quant.qat), got {type(quantization)}.')
  if layers is not None and not callable(layers):
    raise ValueError('layers must be a function of the module path or None.')

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    seen, counts, busy = {}, {}, [False]

    def record(next_fun, args_, kwargs_, context):
      if busy[0] or not _chosen(layers, context, args_, kwargs_):
        return next_fun(*args_, **kwargs_)
      busy[0] = True
      try:
        out = next_fun(*args_, **kwargs_)
      finally:
        busy[0] = False
      key = outliers.layer_key(context.module.path, context.method_name,
                               counts)
      seen[key] = (_input(args_, kwargs_, context), out)
      return out

    # Full precision even inside another active quantization.
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    with nn.intercept_methods(record), linear_quant.suspended():
      out = fn(*args, **kwargs)
    records, gains, counts = {}, {}, {}

    def cross(next_fun, args_, kwargs_, context):
      if busy[0] or not _chosen(layers, context, args_, kwargs_):
        return next_fun(*args_, **kwargs_)
      key = outliers.layer_key(context.module.path, context.method_name,
                               counts)
      h, f_h = seen[key]
      hq = _input(args_, kwargs_, context)

      def call(x):
        a, k = _with_input(args_, kwargs_, context, x)
        return next_fun(*a, **k)

      busy[0] = True
      try:
        fq_hq = call(hq)
        fq_h = _call_again(context.module, call, h)
        with linear_quant.suspended():
          f_hq = _call_again(context.module, call, hq)
      finally:
        busy[0] = False
      err = records[key] = split(h, hq, f_h, f_hq, fq_h, fq_hq)
      if linear_quant.is_linear(context.module, context.method_name):
        gains[key] = _linear_record(quantization, context, h, hq, err)
      return fq_hq

    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    with nn.intercept_methods(cross), quantization:
      out_q = fn(*args, **kwargs)
    order = [k for k in seen if k in records]
    return (out, out_q, {k: records[k] for k in order},
            {k: gains[k] for k in order if k in gains})
  return wrapped
