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
"""Tests of ``Codec``: one layout (format, scale mode, block size) as an
object, and its answers against the state and the codec functions."""

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q
from optax_q._src.codec import codec as codec_lib
from optax_q._src.codec import formats as formats_lib
from optax_q._src.codec import qarray as qarray_lib
from optax_q._src.codec import rounding as rounding_lib

Codec = codec_lib.Codec
fmt_of = formats_lib.get_format


def _layout(mode: str) -> tuple[str, str]:
  """A format that can be stored with ``mode`` and the mode."""
  return ('bf16' if mode == 'none' else 'int8', mode)


def _assert_same(test, a: qarray_lib.QArray, b: qarray_lib.QArray):
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class ForLeafTest(parameterized.TestCase):

  @parameterized.parameters(('int8', 'block'), ('nf4', 'block'),
                            ('bf16', 'none'), ('fp16', 'none'))
  def test_none_takes_the_format_default(self, name, mode):
    codec = Codec.for_leaf(fmt_of(name), None, 128, (4, 256))
    self.assertEqual(codec.scale_mode, mode)
    self.assertEqual(codec.scale_mode, qarray_lib.default_scale_mode(
        fmt_of(name)))

  @parameterized.parameters(((),), ((7,),))
  def test_rank1_on_a_vector_falls_back_to_block(self, shape):
    codec = Codec.for_leaf(fmt_of('int8'), 'rank1', 64, shape)
    self.assertEqual(codec, Codec(fmt_of('int8'), 'block', 64))

  def test_rank1_on_a_matrix_stays(self):
    codec = Codec.for_leaf(fmt_of('int8'), 'rank1', 64, (3, 5))
    self.assertEqual(codec.scale_mode, 'rank1')
    self.assertEqual(codec.block_size, 0)

  def test_unscaled_integer_format_is_refused(self):
    with self.assertRaisesRegex(ValueError, "'none' is only valid for float"):
      Codec.for_leaf(fmt_of('int8'), 'none', 128, (4, 256))

  def test_range_expansion_refuses_pow2_scales(self):
    with self.assertRaisesRegex(ValueError, 'dynamic range expansion'):
      Codec.for_leaf(fmt_of('fp8_e4m3_dre'), 'block_pow2', 128, (4, 256))

  def test_block_size_only_kept_by_block_modes(self):
    fmt = fmt_of('int8')
    self.assertEqual(Codec(fmt, 'row', 256), Codec(fmt, 'row', 32))
    self.assertEqual(Codec(fmt, 'row', 256).block_size, 0)
    self.assertEqual(Codec(fmt, 'block_pow2', 32).block_size, 32)


class PropertiesTest(parameterized.TestCase):

  @parameterized.parameters(
      ('none', True, False, False), ('tensor', False, True, False),
      ('row', False, False, False), ('block', False, False, False),
      ('block_pow2', False, False, False), ('rank1', False, True, True))
  def test_layout_answers(self, mode, unscaled, whole, replicated):
    codec = Codec(fmt_of(_layout(mode)[0]), mode, 128)
    self.assertEqual(codec.unscaled, unscaled)
    self.assertEqual(codec.needs_whole_leaf, whole)
    self.assertEqual(codec.replicated_scales, replicated)

  @parameterized.product(
      name=('int8', 'int4', 'nf4', 'nf3', 'fp8_e4m3', 'fp8_e4m3_dre'),
      mode=('block', 'block_pow2'),
      block_size=(32, 128))
  def test_stored_bits_of_a_zero_state(self, name, mode, block_size):
    if mode == 'block_pow2' and fmt_of(name).expand:
      self.skipTest('range expansion keeps float32 scales')
    tx = optax_q.quantize_state(
        optax.scale_by_adam(), formats=name, scale_mode=mode,
        block_size=block_size, min_size=0)
    state = jax.jit(tx.init)({'w': jnp.zeros((4, 256)),
                              'v': jnp.zeros((512,))})
    bits = optax_q.state_bits_per_element(state, quantized_only=True)
    self.assertAlmostEqual(
        Codec(fmt_of(name), mode, block_size).stored_bits, bits)

  def test_stored_bits_leave_out_shape_dependent_scales(self):
    for mode in ('none', 'tensor', 'row', 'rank1'):
      name = _layout(mode)[0]
      self.assertEqual(Codec(fmt_of(name), mode, 128).stored_bits,
                       fmt_of(name).bits)


class CodecArraysTest(parameterized.TestCase):

  @parameterized.product(
      mode=formats_lib.SCALE_MODES,
      shape=((), (5,), (3, 200), (2, 3, 130)))
  def test_scale_shape_is_the_encoded_one(self, mode, shape):
    name, mode = _layout(mode)
    codec = Codec.for_leaf(fmt_of(name), mode, 64, shape)
    x = jax.random.normal(jax.random.key(0), shape)
    # The shapes the encoder gives, traced without running it.
    q = jax.eval_shape(lambda x: codec.encode(x, key=None), x)
    self.assertEqual(q.codec, codec)
    if codec.unscaled:
      self.assertIsNone(q.scale)
      self.assertEqual(codec.buffer_shapes(shape)[1], None)
    else:
      self.assertEqual(codec.scale_shape(shape), q.scale.shape)
      self.assertEqual(codec.buffer_shapes(shape)[1], q.scale.shape)
    self.assertEqual(codec.buffer_shapes(shape)[0], q.codes.shape)

  @parameterized.product(
      mode=formats_lib.SCALE_MODES, name=('int4', 'nf4', 'fp8_e4m3', 'bf16'),
      stochastic=(False, True))
  def test_encode_decode_are_qarrays(self, mode, name, stochastic):
    fmt = fmt_of(name)
    if mode == 'none' and fmt.kind != 'float':
      self.skipTest('only float formats are stored unscaled')
    codec = Codec.for_leaf(fmt, mode, 32, (6, 70))
    x = 3.0 * jax.random.normal(jax.random.key(1), (6, 70))
    key = rounding_lib.stream_key(0, 1, 2) if stochastic else None
    q = codec.encode(x, key=key)
    _assert_same(self, q, qarray_lib.encode(
        x, fmt, scale_mode=codec.scale_mode, block_size=32, key=key))
    _assert_same(self, codec.encode_compiled(x, key=key), q)
    np.testing.assert_array_equal(codec.decode(q), qarray_lib.decode(q))

  @parameterized.parameters(*formats_lib.SCALE_MODES)
  def test_zeros_are_encoded_zeros(self, mode):
    name, mode = _layout(mode)
    codec = Codec.for_leaf(fmt_of(name), mode, 64, (3, 130))
    zeros = codec.zeros((3, 130), jnp.bfloat16)
    self.assertEqual(zeros.dtype, 'bfloat16')
    _assert_same(self, zeros, codec.encode(
        jnp.zeros((3, 130), jnp.bfloat16), key=None))

  def test_decode_refuses_another_layout(self):
    q = Codec(fmt_of('int8'), 'row', 0).encode(jnp.ones((2, 8)), key=None)
    with self.assertRaisesRegex(ValueError, 'cannot decode'):
      Codec(fmt_of('int8'), 'block', 4).decode(q)


class ShardingsTest(parameterized.TestCase):
  """``Codec.shardings``: the layout each buffer gets on a mesh, which
  ``state_shardings`` and ``init`` on an Explicit mesh both ask for."""

  def setUp(self):
    super().setUp()
    self.mesh = jax.make_mesh((4, 2), ('data', 'model'))
    self.param = jax.sharding.NamedSharding(
        self.mesh, jax.sharding.PartitionSpec('data', 'model'))

  @parameterized.parameters(
      ('block', 'int8', ('data', 'model')), ('block', 'int4', ('data', 'model')),
      ('block_pow2', 'nf4', ('data', 'model')),
      ('row', 'int8', ('data', None)))  # One scale per row: length 1.
  def test_codes_and_scales_follow_the_parameter(self, mode, name, scales):
    codec = Codec(fmt_of(name), mode, 32)
    codes, scale = codec.shardings((16, 256), self.param)
    self.assertEqual(tuple(codes.spec), ('data', 'model'))
    self.assertEqual(tuple(scale.spec), scales)

  def test_rank1_scales_are_replicated(self):
    codes, scale = Codec(fmt_of('int8'), 'rank1').shardings(
        (16, 256), self.param)
    self.assertEqual(tuple(codes.spec), ('data', 'model'))
    self.assertEqual(tuple(scale.spec), ())

  def test_unscaled_has_no_scale_sharding(self):
    codes, scale = Codec(fmt_of('bf16'), 'none').shardings(
        (16, 256), self.param)
    self.assertEqual(tuple(codes.spec), ('data', 'model'))
    self.assertIsNone(scale)

  def test_an_axis_that_does_not_divide_is_replicated(self):
    # 3 blocks of 32 along the last axis: 'model' (2) does not divide them.
    codes, scale = Codec(fmt_of('int8'), 'block', 32).shardings(
        (16, 96), self.param)
    self.assertEqual(tuple(codes.spec), ('data', 'model'))
    self.assertEqual(tuple(scale.spec), ('data', None))

  def test_agrees_with_state_shardings(self):
    params = {'w': jnp.zeros((16, 256))}
    tx = optax_q.adamw(1e-3, mu_format='int4', nu_format='int8_dynamic',
                       min_size=0, block_size=64)
    state = tx.init(params)
    out = optax_q.state_shardings(state, {'w': self.param})
    for q, sharding in ((state[0].inner_state.mu['w'],
                         out[0].inner_state.mu['w']),
                        (state[0].inner_state.nu['w'],
                         out[0].inner_state.nu['w'])):
      codes, scale = q.codec.shardings(q.shape, self.param)
      self.assertEqual(sharding.codes, codes)
      self.assertEqual(sharding.scale, scale)


if __name__ == '__main__':
  absltest.main()
