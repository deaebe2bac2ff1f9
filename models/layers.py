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
"""Transformer blocks shared by :mod:`models.gpt` and :mod:`models.vit`.

Every parameter is created through :func:`flax.linen.with_logical_partitioning`
so that :mod:`models.sharding` can place it on a mesh.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any

INIT_STD = 0.02


def kernel_init(names: tuple[str | None, ...], std: float = INIT_STD):
  """Normal(0, std) initialiser annotated with logical axis ``names``."""
  return nn.with_logical_partitioning(nn.initializers.normal(std), names)


def zeros_init(names: tuple[str | None, ...]):
  """Zeros initialiser annotated with logical axis ``names``."""
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names: tuple[str | None, ...]):
  """Ones initialiser annotated with logical axis ``names``."""
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def layer_norm(name: str | None = None, dtype: Dtype = jnp.float32):
  """Pre-LayerNorm over ``embed`` with annotated scale and bias."""
  return nn.LayerNorm(
      epsilon=1e-5, dtype=dtype, name=name,
      scale_init=ones_init(('embed',)), bias_init=zeros_init(('embed',)))


class MultiHeadAttention(nn.Module):
  """Multi-head self-attention with optional causal mask.

  Attributes:
    num_heads: number of heads; ``d_model`` must be divisible by it.
    causal: mask future positions (decoder) when True.
    out_std: init std of the output projection (GPT-2 scales it by depth).
    dtype: compute dtype; softmax always runs in float32.
  """

  num_heads: int
  causal: bool = True
  out_std: float = INIT_STD
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d_model = x.shape[-1]
    if d_model % self.num_heads:
      raise ValueError(
          f'd_model={d_model} is not divisible by num_heads={self.num_heads}')
    head_dim = d_model // self.num_heads
    proj = lambda name: nn.DenseGeneral(
        (self.num_heads, head_dim), dtype=self.dtype, name=name,
        kernel_init=kernel_init(('embed', 'heads', 'kv')),
        bias_init=zeros_init(('heads', 'kv')))
    q, k, v = proj('query')(x), proj('key')(x), proj('value')(x)
    logits = jnp.einsum('bthd,bshd->bhts', q, k).astype(jnp.float32)
    logits = logits / jnp.sqrt(jnp.float32(head_dim))
    if self.causal:
      t = x.shape[-2]
      mask = jnp.tril(jnp.ones((t, t), dtype=bool))
      logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(logits, axis=-1).astype(self.dtype)
    out = jnp.einsum('bhts,bshd->bthd', weights, v)
    return nn.DenseGeneral(
        d_model, axis=(-2, -1), dtype=self.dtype, name='out',
        kernel_init=kernel_init(('heads', 'kv', 'embed'), self.out_std),
        bias_init=zeros_init(('embed',)))(out)


class MlpBlock(nn.Module):
  """Feed-forward block ``embed -> mlp -> embed`` with GELU."""

  hidden: int
  out_std: float = INIT_STD
  dtype: Dtype = jnp.float32
  activation: Callable[[jax.Array], jax.Array] = nn.gelu

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d_model = x.shape[-1]
    h = nn.Dense(
        self.hidden, dtype=self.dtype, name='fc_in',
        kernel_init=kernel_init(('embed', 'mlp')),
        bias_init=zeros_init(('mlp',)))(x)
    h = self.activation(h)
    return nn.Dense(
        d_model, dtype=self.dtype, name='fc_out',
        kernel_init=kernel_init(('mlp', 'embed'), self.out_std),
        bias_init=zeros_init(('embed',)))(h)


class TransformerBlock(nn.Module):
  """Pre-LN transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

  num_heads: int
  mlp_ratio: int = 4
  causal: bool = True
  out_std: float = INIT_STD
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    d_model = x.shape[-1]
    x = x + MultiHeadAttention(
        self.num_heads, causal=self.causal, out_std=self.out_std,
        dtype=self.dtype, name='attn')(layer_norm('ln_attn', self.dtype)(x))
    x = x + MlpBlock(
        self.mlp_ratio * d_model, out_std=self.out_std, dtype=self.dtype,
        name='mlp')(layer_norm('ln_mlp', self.dtype)(x))
    return x
