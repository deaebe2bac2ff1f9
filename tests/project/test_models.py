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
"""Tests for the models in :mod:`models` (shapes, causality, annotations)."""

from absl.testing import absltest
from absl.testing import parameterized
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import numpy as np
import optax

from models import gpt
from models import mlp
from models import sharding
from models import vit


def _small_gpt(**kw):
  return gpt.GPT(**{**dict(d_model=32, num_layers=2, num_heads=4,
                           max_len=16), **kw})


def _output_shape(model, x):
  """Output shape from shapes alone (tracing, no compilation)."""
  params = nn.meta.unbox(sharding.abstract_params(model, x))
  return jax.eval_shape(model.apply, {'params': params}, x)


class GPTTest(parameterized.TestCase):

  @parameterized.named_parameters(('untied', False), ('tied', True))
  def test_output_shape(self, tie):
    model = _small_gpt(tie_embeddings=tie)
    tokens = jnp.zeros((3, 16), jnp.int32)
    out = _output_shape(model, tokens)
    self.assertEqual(out.shape, (3, 16, 256))
    self.assertEqual(out.dtype, jnp.float32)
    params = sharding.abstract_params(model, tokens)
    self.assertEqual('head' in params, not tie)
    # Shorter sequences use a prefix of the positional embedding.
    self.assertEqual(_output_shape(model, tokens[:, :5]).shape, (3, 5, 256))

  def test_causal_and_initial_loss(self):
    model = _small_gpt(num_layers=1)
    a = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
    b = a.at[:, 10:].set(7)
    params = sharding.init_params(model, a)
    logits = jax.jit(model.apply)({'params': params}, jnp.concatenate([a, b]))
    la, lb = logits[:2], logits[2:]
    np.testing.assert_allclose(la[:, :10], lb[:, :10], atol=1e-6)
    self.assertGreater(float(jnp.max(jnp.abs(la[:, 10:] - lb[:, 10:]))), 0)
    # Small init: the initial loss is close to that of a uniform guess.
    loss = optax.softmax_cross_entropy_with_integer_labels(la, a).mean()
    self.assertAlmostEqual(float(loss), np.log(256), delta=0.1)

  def test_num_params(self):
    model = _small_gpt()
    params = sharding.abstract_params(model, jnp.zeros((1, 16), jnp.int32))
    d, v, t, layers = 32, 256, 16, 2
    per_block = 4 * (d * d + d) + 2 * (4 * d * d) + 4 * d + d + 4 * d
    expected = v * d + t * d + layers * per_block + 2 * d + d * v
    self.assertEqual(model.num_params(), expected)
    self.assertLen(jax.tree.leaves(nn.meta.unbox(params)), 5 + 16 * layers)

  def test_too_long_raises(self):
    model = _small_gpt(max_len=8)
    with self.assertRaisesRegex(ValueError, 'max_len'):
      sharding.abstract_params(model, jnp.zeros((1, 9), jnp.int32))


class ViTTest(parameterized.TestCase):

  @parameterized.product(patch_size=(2, 4), layout=('flat', 'hw', 'hwc'))
  def test_output_shape(self, patch_size, layout):
    shape = dict(flat=(5, 64), hw=(5, 8, 8), hwc=(5, 8, 8, 1))[layout]
    model = vit.ViT(patch_size=patch_size, d_model=32, num_layers=1,
                    num_heads=2)
    x = jnp.ones(shape)
    self.assertEqual(_output_shape(model, x).shape, (5, 10))
    params = sharding.abstract_params(model, x)
    n_patches = (8 // patch_size) ** 2
    self.assertEqual(params['pos_embed'].value.shape, (n_patches, 32))

  def test_patches_are_equivariant_to_layout(self):
    model = vit.ViT(patch_size=4, d_model=16, num_layers=1, num_heads=2)
    x = jax.random.normal(jax.random.key(0), (2, 64))
    params = sharding.init_params(model, x)
    apply = jax.jit(model.apply)
    np.testing.assert_allclose(
        apply({'params': params}, x),
        apply({'params': params}, x.reshape(2, 8, 8, 1)), atol=1e-6)

  def test_bad_patch_raises(self):
    with self.assertRaisesRegex(ValueError, 'patch_size'):
      sharding.abstract_params(vit.ViT(patch_size=3), jnp.ones((1, 64)))


class MLPTest(absltest.TestCase):

  def test_output_shape(self):
    model = mlp.MLP(features=(32, 16, 8), num_classes=7)
    self.assertEqual(_output_shape(model, jnp.ones((4, 8, 8))).shape, (4, 7))
    params = sharding.abstract_params(model, jnp.ones((4, 8, 8)))
    self.assertEqual(params['dense_0']['kernel'].names, ('embed', 'mlp'))
    self.assertEqual(params['dense_1']['kernel'].names, ('mlp', 'embed'))
    self.assertEqual(params['head']['kernel'].names, ('mlp', 'classes'))


class AnnotationTest(parameterized.TestCase):

  # Inputs are built inside the test: no jax arrays at import time, so that
  # the mesh test module can still choose the number of CPU devices.
  @parameterized.named_parameters(
      ('gpt', lambda: _small_gpt(), ((1, 16), 'int32')),
      ('gpt_tied', lambda: _small_gpt(tie_embeddings=True),
       ((1, 16), 'int32')),
      ('vit', lambda: vit.ViT(d_model=32, num_layers=1, num_heads=2),
       ((1, 64), 'float32')),
      ('mlp', lambda: mlp.MLP(features=(32, 32, 32)), ((1, 64), 'float32')),
  )
  def test_every_param_is_annotated(self, make, x):
    x = jnp.zeros(*x)
    model = make()
    boxed = sharding.abstract_params(model, x)
    leaves = jax.tree.leaves(
        boxed, is_leaf=lambda l: isinstance(l, nn.LogicallyPartitioned))
    for leaf in leaves:
      self.assertIsInstance(leaf, nn.LogicallyPartitioned)
      self.assertLen(leaf.names, leaf.value.ndim)
      self.assertTrue(set(leaf.names) <= set(sharding.LOGICAL_AXES))
    # No kernel uses one mesh axis twice under any rules.
    specs = sharding.param_logical_specs(model, x)
    for mode in ('data', 'model', 'fsdp'):
      rules = dict(sharding.logical_rules(mode))
      for spec in jax.tree.leaves(
          specs, is_leaf=lambda s: isinstance(s, P)):
        axes = [rules[n] for n in spec if rules[n] is not None]
        self.assertLen(set(axes), len(axes))

  def test_rules(self):
    data = dict(sharding.logical_rules('data'))
    model = dict(sharding.logical_rules('model'))
    fsdp = dict(sharding.logical_rules('fsdp'))
    self.assertEqual(data['batch'], 'data')
    self.assertIsNone(data['mlp'])
    self.assertEqual(model['mlp'], 'model')
    self.assertEqual(model['heads'], 'model')
    self.assertEqual(model['vocab'], 'model')
    self.assertIsNone(model['embed'])
    self.assertEqual(fsdp['embed'], 'data')
    with self.assertRaisesRegex(ValueError, 'mode'):
      sharding.logical_rules('pipeline')

  def test_init_sharded_matches_init_params(self):
    model = _small_gpt(num_layers=1)
    x = jnp.zeros((2, 16), jnp.int32)
    mesh = sharding.make_mesh(1, 1)
    params, shardings = sharding.init_sharded(
        model, x, mesh, sharding.logical_rules('model'), seed=3)
    ref = sharding.init_params(model, x, seed=3)
    self.assertEqual(jax.tree.structure(params), jax.tree.structure(ref))
    self.assertEqual(
        jax.tree.structure(params), jax.tree.structure(shardings))
    jax.tree.map(np.testing.assert_array_equal, params, ref)
    self.assertEqual(shardings['block_0']['mlp']['fc_in']['kernel'].spec,
                     P(None, 'model'))
    self.assertEqual(shardings['head']['kernel'].spec, P(None, 'model'))


if __name__ == '__main__':
  absltest.main()
