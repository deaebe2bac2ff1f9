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
"""Outlier metrics of activations and the inputs of a model's linear layers.

An activation is read as ``(tokens, features)``: every axis but the last
is a token axis (a 1-D activation is one token). The optimizer study reports the max-to-median (or
max-to-mean) ratio per token, averaged over tokens, and the excess
kurtosis of all entries or of the per-channel RMS.
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import jax
import jax.numpy as jnp

from optax_q._src.core import validation
from optax_q.quant._src import linear_quant
from optax_q.quant._src import quantizers

KURTOSIS_KINDS = ('flat', 'rms')


def _tokens(h) -> jax.Array:
  """``|h|`` as ``(tokens, features)``, each token divided by its maximum
  (the ratios do not change; nothing overflows)."""
  h = jnp.asarray(h, jnp.float32)
  if h.ndim == 0 or h.size == 0:
    raise ValueError(f'h (an activation) needs a non-empty feature axis, '
                     f'got shape {h.shape}.')
  return unit(jnp.abs(h.reshape(-1, h.shape[-1])), axis=-1)


def unit(x: jax.Array, axis=None) -> jax.Array:
  """``x`` divided by its maximum magnitude (along ``axis``), without
  overflow or subnormal reciprocals."""
  absmax = jnp.max(jnp.abs(x), axis=axis, keepdims=True)
  pre = quantizers.prescale(absmax)
  return (x * pre) / (absmax * pre)


def max_to_median(h: jax.Array) -> jax.Array:
  """Max-to-median ratio of ``|h|`` per token, averaged over tokens (MMR).

  A token whose median magnitude is zero gives ``inf`` (an all-zero token:
  NaN).

  Args:
    h: Activations, ``(..., features)`` (1-D: one token).

  Returns:
    A float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> quant.max_to_median(jnp.array([[1., 2., 8.], [1., 1., 1.]]))
    Array(2.5, dtype=float32)

  References:
    Vlassis et al, [Beyond Outliers: A Study of Optimizers Under
    Quantization](https://arxiv.org/abs/2509.23500), 2025
  """
  return jnp.mean(1 / jnp.median(_tokens(h), axis=-1))


def max_to_mean(h: jax.Array) -> jax.Array:
  """Max-to-mean ratio of ``|h|`` per token, averaged over tokens.

  Args:
    h: Activations, ``(..., features)`` (1-D: one token).

  Returns:
    A float32 scalar (an all-zero token gives NaN).

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> round(float(quant.max_to_mean(jnp.array([[1., 2., 9.],
    ...                                          [1., 1., 1.]]))), 4)
    1.625
  """
  return jnp.mean(1 / jnp.mean(_tokens(h), axis=-1))


def kurtosis(h: jax.Array, *, kind: str = 'flat') -> jax.Array:
  """Excess (Fisher) kurtosis ``E[(x - mean)^4] / var^2 - 3``.

  ``'flat'``: of every entry of ``h``; ``'rms'``: of the per-channel root
  mean squares ``sqrt(mean over tokens of h_j^2)`` (He et al., 2024).
  A Gaussian gives 0. A constant gives NaN (zero variance).

  Args:
    h: Activations, ``(..., features)``: any shape for ``'flat'`` (a 1-D
      ``h`` is one token); at least two tokens for ``'rms'``, whose
      per-channel average over a single token would be just ``|h|``.
    kind: ``'flat'`` or ``'rms'``.

  Returns:
    A float32 scalar.

  Examples:
    >>> import jax.numpy as jnp
    >>> from optax_q import quant
    >>> quant.kurtosis(jnp.array([-1., 1., -1., 1.]))
    Array(-2., dtype=float32)

  References:
    He et al, [Understanding and Minimising Outlier Features in Transformer
    Training](https://arxiv.org/abs/2405.19279), 2024
  """
  kind = validation.check_choice(kind, 'kind', KURTOSIS_KINDS)
  h = jnp.asarray(h, jnp.float32)
  if h.size == 0 or (kind == 'rms' and h.ndim == 0):
    raise ValueError(f'kurtosis needs a non-empty h (with a feature '
                     f"axis for kind='rms'), got shape {h.shape}.")
  if kind == 'rms' and h.size // h.shape[-1] < 2:
    raise ValueError(
        f"kind='rms' averages each channel over tokens and needs h of shape "
        f"(tokens, features) with at least 2 tokens, got shape {h.shape}; "
        "kind='flat' takes one token.")
  if kind == 'rms':
    rows = h.reshape(-1, h.shape[-1])
    rows = unit(rows)  # Scale-free; nothing overflows.
    x = jnp.sqrt(jnp.mean(rows * rows, axis=0))
  else:
    x = h.reshape(-1)
  x = unit(x)
  d = unit(x - jnp.mean(x))
  var = jnp.mean(d * d)
  return jnp.mean(d**4) / (var * var) - 3.0


def layer_key(path: tuple[str, ...], method_name: str,
              counts: dict[str, int]) -> str:
  """``'block_0/mlp/fc_in'`` (``'#k'`` appended to a repeated call)."""
  key = '/'.join(path) or '<root>'
  if method_name not in ('__call__',):
    key += f'.{method_name}'
  n = counts.get(key, 0)
  counts[key] = n + 1
  return key if n == 0 else f'{key}#{n}'


def linear_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
  """Wraps ``fn`` to also return the input of every linear layer it calls.

  The wrapped function returns ``(fn's output, {layer: input})``, the
  layers keyed by module path (``'block_0/attn/query'``); it works under
  ``jit``. Feed the inputs to [`max_to_median`][optax_q.quant.max_to_median] and
  [`kurtosis`][optax_q.quant.kurtosis]. Inside an active
  [`quantize_linear`][optax_q.quant.quantize_linear] the inputs are those the
  quantized model produces (before the layer's own quantization).

  Args:
    fn: A function that applies a Flax Linen model.

  Returns:
    The wrapped function.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from optax_q import quant
    >>> model = nn.Dense(3)
    >>> params = model.init(jax.random.key(0), jnp.ones((2, 4)))
    >>> _, inputs = quant.linear_inputs(model.apply)(params, jnp.ones((2, 4)))
    >>> list(inputs)
    ['<root>']
  """
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    inputs, counts = {}, {}

    def record(module, method_name, x):
      inputs[layer_key(module.path, method_name, counts)] = x

    with linear_quant.observing(record):
      out = fn(*args, **kwargs)
    return out, inputs
  return wrapped
