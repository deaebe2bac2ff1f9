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
"""A multi-layer perceptron classifier with sharding annotations.

Hidden kernels alternate ``('embed', 'mlp')`` and ``('mlp', 'embed')`` so that
under the ``'model'`` rules consecutive layers are column- then row-parallel
(Megatron style), and no kernel names the same mesh axis twice.
"""

from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers

Dtype = Any


class MLP(nn.Module):
  """MLP classifier on flattened inputs.

  Attributes:
    features: hidden layer widths.
    num_classes: number of output classes.
    activation: nonlinearity between layers.
    dtype: compute dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> from models import mlp, sharding
    >>> model = mlp.MLP(features=(32, 32))
    >>> x = jnp.zeros((5, 64))
    >>> params = sharding.init_params(model, x)
    >>> model.apply({'params': params}, x).shape
    (5, 10)
  """

  features: Sequence[int] = (128, 128)
  num_classes: int = 10
  activation: Callable[[jax.Array], jax.Array] = nn.gelu
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    x = jnp.reshape(x, (x.shape[0], -1)).astype(self.dtype)
    names = ('embed', 'mlp')
    for i, width in enumerate(self.features):
      x = nn.Dense(
          width, dtype=self.dtype, name=f'dense_{i}',
          kernel_init=layers.kernel_init(
              names, std=1.0 / max(x.shape[-1], 1) ** 0.5),
          bias_init=layers.zeros_init(names[1:]))(x)
      x = self.activation(x)
      names = names[::-1]
    logits = nn.Dense(
        self.num_classes, dtype=self.dtype, name='head',
        kernel_init=layers.kernel_init(
            (names[0], 'classes'), std=1.0 / max(x.shape[-1], 1) ** 0.5),
        bias_init=layers.zeros_init(('classes',)))(x)
    return logits.astype(jnp.float32)
