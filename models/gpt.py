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
"""A small decoder-only GPT (byte-level by default) in Flax Linen.

Architecture: token embedding plus learned positional embedding, ``num_layers``
pre-LayerNorm transformer blocks (causal multi-head attention, GELU MLP of
width ``mlp_ratio * d_model``), a final LayerNorm and an output head.

The output head is **untied** by default (``tie_embeddings=False``): a
separate ``head`` kernel of shape ``(d_model, vocab_size)``, annotated
``('embed', 'vocab')``. An untied head is its own optimizer-state leaf, so
studies of per-tensor statistics (outliers, stall fractions) see the input
embedding and the output head separately. ``tie_embeddings=True`` reuses the
embedding matrix (``logits = h @ E^T``) as in GPT-2.

Residual output projections are initialised with std ``0.02 / sqrt(2 L)``
(GPT-2); all other kernels with std 0.02.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models import sharding

Dtype = Any


class GPT(nn.Module):
  """Decoder-only transformer language model.

  Attributes:
    vocab_size: number of tokens (256 for bytes).
    d_model: model width.
    num_layers: number of transformer blocks.
    num_heads: attention heads per block.
    max_len: context length (size of the positional embedding).
    mlp_ratio: MLP hidden width as a multiple of ``d_model``.
    tie_embeddings: reuse the token embedding as the output head.
    dtype: compute dtype (params are always float32).

  Call with ``tokens`` of shape ``(batch, length)``, ``length <= max_len``;
  returns float32 logits of shape ``(batch, length, vocab_size)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from models import gpt, sharding
    >>> model = gpt.GPT(d_model=32, num_layers=1, num_heads=2, max_len=16)
    >>> tokens = jnp.zeros((2, 16), jnp.int32)
    >>> params = sharding.init_params(model, tokens)
    >>> model.apply({'params': params}, tokens).shape
    (2, 16, 256)
  """

  vocab_size: int = 256
  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  max_len: int = 128
  mlp_ratio: int = 4
  tie_embeddings: bool = False
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    length = tokens.shape[-1]
    if length > self.max_len:
      raise ValueError(f'sequence length {length} > max_len {self.max_len}')
    embed = nn.Embed(
        self.vocab_size, self.d_model, name='embed',
        embedding_init=layers.kernel_init(('vocab', 'embed')))
    pos = self.param(
        'pos_embed', layers.kernel_init(('length', 'embed')),
        (self.max_len, self.d_model))
    x = embed(tokens).astype(self.dtype) + pos[:length].astype(self.dtype)
    out_std = layers.INIT_STD / math.sqrt(2 * self.num_layers)
    for i in range(self.num_layers):
      x = layers.TransformerBlock(
          self.num_heads, self.mlp_ratio, causal=True, out_std=out_std,
          dtype=self.dtype, name=f'block_{i}')(x)
    x = layers.layer_norm('ln_final', self.dtype)(x)
    if self.tie_embeddings:
      logits = embed.attend(x)
    else:
      logits = nn.Dense(
          self.vocab_size, use_bias=False, dtype=self.dtype, name='head',
          kernel_init=layers.kernel_init(('embed', 'vocab')))(x)
    return logits.astype(jnp.float32)

  def num_params(self) -> int:
    """Number of parameters (computed from shapes, no allocation)."""
    shapes = sharding.abstract_params(
        self, jnp.zeros((1, self.max_len), jnp.int32))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(
        nn.meta.unbox(shapes)))
