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
"""Quantized linear layers for any Flax Linen model, without rewriting it.

`quantize_linear` intercepts the calls of every ``nn.Dense``,
``nn.DenseGeneral`` (contracting trailing axes, no batch dimensions) and
``nn.Embed.attend`` (a tied output head) made while it is active, and
computes them from quantized operands: the input ``x`` read as
``(tokens, K)`` and the kernel as ``(outputs, K)``, both rotated by the
block Hadamard matrix when a quantizer asks for it, each quantized along
``K`` (per token, per output row), then multiplied; the bias is added in
full precision. Attention products, softmax, norms and embeddings lookups
stay in full precision.

Interception happens when the model is traced, so the same object works
eagerly, under ``jit`` and under ``grad`` (QAT), provided the function is
traced while it is active: wrap the function before compiling it
(``jax.jit(q(model.apply))``); a function already compiled outside is not
traced again inside a ``with`` block. Nested settings: the innermost wins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
import contextlib
import contextvars
import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from optax_q._src.core import validation
from optax_q.quant._src import quantizers

LayerFilter = Callable[[tuple[str, ...]], bool]

# What the linear layers do, innermost last: a LinearQuantization, or None
# (full precision). Every entry installs one dispatcher; only the innermost
# dispatcher acts (the others pass the call on), so the innermost setting
# wins and interceptors installed in between see every call.
_STACK = contextvars.ContextVar('optax_q_linear_stack', default=())
# Callbacks ``(module, method_name, x)`` told of every linear call.
_OBSERVERS = contextvars.ContextVar('optax_q_linear_observers', default=())
# The contexts a LinearQuantization used as ``with`` holds open (it is
# frozen, so they are kept here).
_OPEN: dict[int, list[Any]] = {}


def current() -> Any:
  """The innermost active setting (a LinearQuantization or None)."""
  stack = _STACK.get()
  return stack[-1] if stack else None


@contextlib.contextmanager
def active_setting(setting: Any) -> Iterator[None]:
  """Makes ``setting`` (a LinearQuantization or None) the innermost."""
  level = len(_STACK.get())
  token = _STACK.set(_STACK.get() + (setting,))
  try:
    import flax.linen as nn  # pylint: disable=g-import-not-at-top
    with nn.intercept_methods(functools.partial(_dispatch, level)):
      yield
  finally:
    _STACK.reset(token)


def suspended():
  """Full-precision linear layers inside, whatever is active outside."""
  return active_setting(None)


@contextlib.contextmanager
def observing(callback: Callable[..., None]) -> Iterator[None]:
  """Calls ``callback(module, method_name, x)`` for every linear call
  inside, the active setting unchanged."""
  token = _OBSERVERS.set(_OBSERVERS.get() + (callback,))
  try:
    with active_setting(current()):
      yield
  finally:
    _OBSERVERS.reset(token)


def linear_input(args, kwargs, context) -> jax.Array:
  """The input of a linear call (positional, or by its keyword)."""
  name = 'query' if context.method_name == 'attend' else 'inputs'
  if len(args) == 1 and not kwargs:
    return args[0]
  if not args and set(kwargs) == {name}:
    return kwargs[name]
  raise ValueError(
      f'optax_q.quant: {"/".join(context.module.path) or "the root module"}'
      f' ({type(context.module).__name__}) called with arguments other '
      f'than its input {name!r}.')


def _dispatch(level, next_fun, args, kwargs, context):
  module, method = context.module, context.method_name
  if (level != len(_STACK.get()) - 1 or not is_linear(module, method)
      or module.is_initializing()):
    return next_fun(*args, **kwargs)
  x = linear_input(args, kwargs, context)
  for callback in _OBSERVERS.get():
    callback(module, method, x)
  setting = current()
  if setting is None or not setting.active(module, method):
    return next_fun(*args, **kwargs)
  return setting.linear(module, method, x)


def is_linear(module: nn.Module, method_name: str) -> bool:
  """Whether a call is one `quantize_linear` handles."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  if isinstance(module, nn.Embed):
    return method_name == 'attend'
  return (isinstance(module, (nn.Dense, nn.DenseGeneral))
          and method_name == '__call__')


def _trailing_axes(module: nn.Module, x: jax.Array) -> int:
  """How many trailing axes of ``x`` the layer contracts."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  if isinstance(module, nn.Dense):
    return 1
  if module.batch_dims:
    raise ValueError(
        f'quantize_linear: {"/".join(module.path)} has batch_dims '
        f'{module.batch_dims}; only layers without batch dimensions can be '
        'quantized (exclude it with layers=).')
  axis = module.axis if isinstance(module.axis, tuple) else (module.axis,)
  axis = sorted(a % x.ndim for a in axis)
  if axis != list(range(x.ndim - len(axis), x.ndim)):
    raise ValueError(
        f'quantize_linear: {"/".join(module.path)} contracts axes '
        f'{module.axis}; only trailing axes in order can be quantized '
        '(exclude it with layers=).')
  return len(axis)


def operands(module: nn.Module, method_name: str, x: jax.Array
             ) -> tuple[jax.Array, jax.Array, Any, tuple[int, ...]]:
  """``(x as (..., K), kernel as (N, K), bias or None, output features)``."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  params = module.variables['params']
  if method_name == 'attend':
    table = nn.meta.unbox(params['embedding'])
    return x, table, None, (table.shape[0],)
  kernel = nn.meta.unbox(params['kernel'])
  n_in = _trailing_axes(module, x)
  k = math.prod(kernel.shape[:n_in])
  features = kernel.shape[n_in:]
  bias = nn.meta.unbox(params['bias']) if module.use_bias else None
  xm = x.reshape(x.shape[:x.ndim - n_in] + (k,))
  return xm, kernel.reshape(k, -1).T, bias, features


@dataclasses.dataclass(frozen=True)
class LinearQuantization:
  """Quantizers for the linear layers of a Flax model.

  Use it as a context manager (``with q: model.apply(...)``) or as a
  wrapper (``q(model.apply)``); see
  [`quantize_linear`][optax_q.quant.quantize_linear].

  Attributes:
    weights: The kernels' [`Quantizer`][optax_q.quant.Quantizer] (None: full
      precision).
    activations: The inputs' [`Quantizer`][optax_q.quant.Quantizer] (None: full
      precision).
    layers: ``layers(path) -> bool`` on the module path (a tuple of
      names), choosing the layers to quantize (None: all).
    enabled: False makes every layer run unchanged (the plain model).
  """

  weights: quantizers.Quantizer | None = None
  activations: quantizers.Quantizer | None = None
  layers: LayerFilter | None = None
  enabled: bool = True

  def __post_init__(self):
    check_setting(self.weights, self.activations, self.layers, self.enabled)

  @property
  def hadamard_block(self) -> int | None:
    blocks = {q.hadamard_block for q in (self.weights, self.activations)
              if q is not None} - {None}
    return blocks.pop() if blocks else None

  def active(self, module: nn.Module, method_name: str) -> bool:
    """Whether this call is quantized."""
    return (self.enabled
            and (self.weights is not None or self.activations is not None)
            and is_linear(module, method_name)
            and not module.is_initializing()
            and (self.layers is None or bool(self.layers(module.path))))

  def kernel(self, module: nn.Module, method_name: str, x: jax.Array
             ) -> jax.Array:
    """The kernel the quantized layer multiplies by, as ``(N, K)`` in the
    original coordinates (rotated back): ``W + eps_W``."""
    _, w, _, _ = operands(module, method_name, x)
    return self._unrotate(self._weight(w), w.shape[-1])

  def _weight(self, w: jax.Array) -> jax.Array:
    block = self.hadamard_block
    w = quantizers.rotate(w, block) if block else w
    return self.weights(w) if self.weights is not None else w

  def _unrotate(self, w: jax.Array, k: int) -> jax.Array:
    block = self.hadamard_block
    return quantizers.rotate(w, block)[..., :k] if block else w

  def linear(self, module: nn.Module, method_name: str, x: jax.Array
             ) -> jax.Array:
    """The quantized layer's output."""
    xm, w, bias, features = operands(module, method_name, x)
    dtype = getattr(module, 'dtype', None) or jnp.promote_types(
        xm.dtype, w.dtype)
    xm, w = xm.astype(dtype), w.astype(dtype)
    block = self.hadamard_block
    if block:
      xm = quantizers.rotate(xm, block)
    if self.activations is not None:
      xm = self.activations(xm)
    y = jnp.einsum('...k,nk->...n', xm, self._weight(w),
                   precision=getattr(module, 'precision', None))
    y = y.reshape(y.shape[:-1] + tuple(features))
    return y if bias is None else y + bias.astype(dtype)

  def __enter__(self):
    context = active_setting(self)
    context.__enter__()
    _OPEN.setdefault(id(self), []).append(context)
    return self

  def __exit__(self, *exc):
    contexts = _OPEN[id(self)]
    context = contexts.pop()
    if not contexts:
      del _OPEN[id(self)]
    return context.__exit__(*exc)

  def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
      with active_setting(self):
        return fn(*args, **kwargs)
    return wrapped


def check_setting(weights, activations, layers, enabled) -> None:
  """The checks of `LinearQuantization`'s fields."""
  for name, q in (('weights', weights), ('activations', activations)):
    if q is not None and not isinstance(q, quantizers.Quantizer):
      raise ValueError(
          f'{name} must be an optax_q.quant.Quantizer (from quant.rtn or '
          f'quant.quest) or None, got {type(q).__name__}.')
  blocks = {q.hadamard_block for q in (weights, activations)
            if q is not None and q.hadamard_block is not None}
  if len(blocks) > 1:
    raise ValueError(
        f'weights and activations must share one hadamard_block (the '
        f'rotation cancels only when both operands get the same one), got '
        f'{sorted(blocks)}.')
  if layers is not None and not callable(layers):
    raise ValueError(f'layers must be a function of the module path or '
                     f'None, got {type(layers).__name__}.')
  validation.check_bool(enabled, 'enabled')


def quantize_linear(
    weights: quantizers.Quantizer | None = None,
    activations: quantizers.Quantizer | None = None,
    *,
    layers: LayerFilter | None = None,
    enabled: bool = True,
) -> LinearQuantization:
  """Quantize every linear layer of a Flax Linen model while active.

  PTQ: evaluate a trained model under ``quantize_linear(rtn(4), rtn(4))``
  (W4A4, round to nearest, per row and per token). QAT: train under
  ``quantize_linear(quest(4), quest(4))``; the straight-through gradient
  reaches the float32 weights. With ``enabled=False`` (or no quantizers) the
  model runs unchanged, bit for bit.

  Covered: ``nn.Dense``, ``nn.DenseGeneral`` contracting trailing axes
  (several, as an attention output projection) without batch dimensions,
  and ``nn.Embed.attend``. The product is computed as ``x (N, K)^T`` from
  the kernel read as ``(N, K)``; with a Hadamard quantizer both operands
  are rotated (and zero-padded to a multiple of the block). When both
  quantizers set a Hadamard block they must set the same one.

  Settings nest: inside another active one, the innermost decides (an
  inner ``enabled=False`` gives the plain layers). Quantization is decided
  when the model is traced: wrap a function before ``jax.jit``
  (``jax.jit(q(model.apply))``); a function compiled outside is not traced
  again inside a ``with`` block.

  Args:
    weights: A [`Quantizer`][optax_q.quant.Quantizer] for the kernels (None:
      full precision).
    activations: A [`Quantizer`][optax_q.quant.Quantizer] for the layers' inputs
      (None: full precision).
    layers: ``layers(path) -> bool`` on the module path (a tuple of
      names; ``()`` for a root module), e.g.
      ``lambda path: 'head' not in path`` (None: every linear layer).
    enabled: False turns it off (the plain model).

  Returns:
    A [`LinearQuantization`][optax_q.quant.LinearQuantization]: a context
    manager and a function wrapper.

  Raises:
    ValueError: a quantizer that is not a
      [`Quantizer`][optax_q.quant.Quantizer], two different Hadamard blocks, or
      a ``layers`` that is not callable.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from optax_q import quant
    >>> model = nn.Dense(3)
    >>> x = jnp.linspace(-1, 1, 8).reshape(2, 4)
    >>> params = model.init(jax.random.key(0), x)
    >>> w4a4 = quant.quantize_linear(quant.rtn(4), quant.rtn(4))
    >>> y = w4a4(model.apply)(params, x)
    >>> float(quant.relative_error(model.apply(params, x), y)) < 0.05
    True

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025
  """
  return LinearQuantization(weights, activations, layers,
                            validation.check_bool(enabled, 'enabled'))


def ptq(bits: int = 4, *, weights: bool = True, activations: bool = True,
        granularity: str = 'row', grid: str = 'midrise',
        layers: LayerFilter | None = None) -> LinearQuantization:
  """Post-training round-to-nearest quantization of the linear layers.

  ``ptq(4)`` is the optimizer study's W4A4 RTN: symmetric absmax, per
  output row for the weights and per token for the activations, mid-rise
  grid.

  Args:
    bits: 2 to 16.
    weights: Quantize the kernels.
    activations: Quantize the layers' inputs.
    granularity: ``'row'`` or ``'tensor'``.
    grid: ``'midrise'`` or ``'midtread'``.
    layers: As for [`quantize_linear`][optax_q.quant.quantize_linear].

  Returns:
    A [`LinearQuantization`][optax_q.quant.LinearQuantization].

  Examples:
    >>> from optax_q import quant
    >>> quant.ptq(4).weights
    Quantizer(bits=4, method='rtn', granularity='row', grid='midrise', gradient='ste', hadamard_block=None)
  """
  q = quantizers.rtn(bits, granularity=granularity, grid=grid)
  return quantize_linear(q if _flag(weights, 'weights') else None,
                         q if _flag(activations, 'activations') else None,
                         layers=layers)


def qat(bits: int = 4, *, method: str = 'quest',
        hadamard_block: int | None = 128, weights: bool = True,
        activations: bool = True, enabled: bool = True,
        layers: LayerFilter | None = None) -> LinearQuantization:
  """Quantization-aware training of the linear layers.

  ``qat(4)`` is the optimizer study's 4-bit QuEST (Hadamard blocks of 128,
  Gaussian-optimal clipping, trust-mask STE) on weights and activations;
  ``method='ste'`` is absmax round to nearest with a plain straight-through
  gradient. ``enabled=False`` gives the plain model bit for bit.

  Args:
    bits: 2 to 16.
    method: ``'quest'`` or ``'ste'``.
    hadamard_block: QuEST's rotation block, a power of two (None: no
      rotation); ignored by ``'ste'``.
    weights: Quantize the kernels.
    activations: Quantize the layers' inputs.
    enabled: False turns it off.
    layers: As for [`quantize_linear`][optax_q.quant.quantize_linear].

  Returns:
    A [`LinearQuantization`][optax_q.quant.LinearQuantization].

  Examples:
    >>> from optax_q import quant
    >>> quant.qat(4).activations.hadamard_block
    128
  """
  hadamard_block = quantizers.check_hadamard_block(hadamard_block)
  if method == 'quest':
    q = quantizers.quest(bits, hadamard_block=hadamard_block)
  elif method == 'ste':
    q = quantizers.rtn(bits)
  else:
    raise ValueError(f"method must be one of ('quest', 'ste'), got "
                     f'{method!r}.')
  return quantize_linear(q if _flag(weights, 'weights') else None,
                         q if _flag(activations, 'activations') else None,
                         layers=layers, enabled=enabled)


def _flag(value, name: str) -> bool:
  return validation.check_bool(value, name)
