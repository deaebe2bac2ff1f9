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
"""Blocks holding an infinity on grids whose largest value is a power of two.

In such a block the finite values are scaled to the grid value just below
the largest (the end codes are the infinities'). On a grid without mantissa
bits (``e2m0``, ``e8m0``, ``e3m0_ieee``) that value is half the largest, not
the largest less one step of its binade (which is zero: a division by zero
on the host, and every finite value of the block decoded as zero).
"""

import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax.numpy as jnp
import numpy as np

import optax_q
from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray


# pylint: disable=protected-access


class InnerTargetTest(parameterized.TestCase):

  @parameterized.parameters('e2m0', 'e3m0', 'e5m0', 'e3m0_ieee', 'e2m0fn',
                            'e3m1fn', 'e2m1', 'e3m2', 'fp8_e4m3',
                            'fp8_e5m2', 'fp4_e2m1')
  def test_inner_is_the_grid_value_below_the_top(self, name):
    fmt = optax_q.get_format(name)
    grid = sorted({abs(v) for v in formats_lib._float_grid(
        fmt.exponent_bits, fmt.mantissa_bits, fmt.max_value)})
    _, hi, inner = qarray.grid_extremes(fmt)
    self.assertEqual(hi, grid[-1])
    self.assertEqual(inner, min(grid[-2], qarray.scale_target(fmt)))

  @parameterized.parameters('e2m0', 'e3m0', 'e3m0_ieee')
  def test_finite_values_next_to_an_infinity_survive(self, name):
    x = jnp.array([1.0, -4.0, jnp.inf, 2.0, -jnp.inf, 4.0, 0.0, -2.0])
    with warnings.catch_warnings():
      warnings.simplefilter('error', RuntimeWarning)
      y = np.asarray(optax_q.dequantize(optax_q.quantize(
          x, name, scale_mode='block', block_size=8, rounding='nearest')))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(x))
    # -4, 2, 4 and -2 are on the block's grid (scale 2: 0, 2, 4, 8, ...).
    np.testing.assert_array_equal(y[[1, 3, 5, 7]], [-4.0, 2.0, 4.0, -2.0])


if __name__ == '__main__':
  absltest.main()
