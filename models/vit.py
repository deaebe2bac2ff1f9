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
"""A small Vision Transformer for 8x8 single-channel images (sklearn digits).

The image is cut into non-overlapping ``patch_size x patch_size`` patches
(``patch_size`` must divide the image side: 2 gives 16 patches of 4 pixels,
4 gives 4 patches of 16 pixels), each patch is projected to ``d_model``, a
learned positional embedding is added, ``num_layers`` non-causal pre-LayerNorm
blocks follow, and the mean-pooled tokens go through a LayerNorm and a linear
classifier.
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers

Dtype = Any


class ViT(nn.Module):
  """Vision Transformer classifier.

  Attributes:
    num_classes: number of output classes.
    image_size: side of the (square) image.
    channels: number of image channels.
    patch_size: side of a patch; must divide ``image_size``.
    d_model: model width.
    num_layers: number of transformer blocks.
    num_heads: attention heads per block.
    mlp_ratio: MLP hidden width as a multiple of ``d_model``.
    dtype: compute dtype.

  Accepts images shaped ``(batch, image_size**2 * channels)`` (flat, as
  sklearn returns them), ``(batch, H, W)`` or ``(batch, H, W, C)``; returns
  float32 logits ``(batch, num_classes)``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from models import sharding, vit
    >>> model = vit.ViT(d_model=32, num_layers=1, num_heads=2)
    >>> x = jnp.zeros((3, 64))
    >>> params = sharding.init_params(model, x)
    >>> model.apply({'params': params}, x).shape
    (3, 10)
  """

  num_classes: int = 10
  image_size: int = 8
  channels: int = 1
  patch_size: int = 2
  d_model: int = 64
  num_layers: int = 2
  num_heads: int = 4
  mlp_ratio: int = 4
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    s, c, p = self.image_size, self.channels, self.patch_size
    if s % p:
      raise ValueError(f'patch_size {p} does not divide image_size {s}')
    x = jnp.reshape(images, (images.shape[0], s, s, c)).astype(self.dtype)
    n = s // p
    x = x.reshape(x.shape[0], n, p, n, p, c).transpose(0, 1, 3, 2, 4, 5)
    x = x.reshape(x.shape[0], n * n, p * p * c)
    x = nn.Dense(
        self.d_model, dtype=self.dtype, name='patch_embed',
        kernel_init=layers.kernel_init(('patch', 'embed')),
        bias_init=layers.zeros_init(('embed',)))(x)
    pos = self.param(
        'pos_embed', layers.kernel_init(('length', 'embed')),
        (n * n, self.d_model))
    x = x + pos.astype(self.dtype)
    for i in range(self.num_layers):
      x = layers.TransformerBlock(
          self.num_heads, self.mlp_ratio, causal=False, dtype=self.dtype,
          name=f'block_{i}')(x)
    x = layers.layer_norm('ln_final', self.dtype)(jnp.mean(x, axis=1))
    logits = nn.Dense(
        self.num_classes, dtype=self.dtype, name='head',
        kernel_init=layers.kernel_init(('embed', 'classes')),
        bias_init=layers.zeros_init(('classes',)))(x)
    return logits.astype(jnp.float32)
