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
"""The library's shape: the linter's structure limits, exports, docstrings,
renamed arguments, declared non-negative fields, the storage config,
``encode_like`` and the sharding of per-parameter state of other shapes."""

import dataclasses
import inspect
import pathlib
import subprocess
import sys
import tempfile
from typing import NamedTuple
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import optax_q
from optax_q._src.codec import qarray as qarray_lib
import optax_q.quant

try:
  import griffe  # Comes with mkdocstrings (the docs extra).
except ImportError:
  griffe = None

SRC = pathlib.Path(optax_q.__file__).parent / '_src'
ROOT = SRC.parent.parent
# The structure checks of the linter, at the limits of Optax's configuration
# (pylint's defaults; [tool.pylint] in pyproject.toml). Length alone is
# fine: a function may be long where it reads as one idea.
STRUCTURE_CHECKS = ('too-many-branches', 'too-many-nested-blocks',
                    'too-many-return-statements',
                    'too-many-boolean-expressions')


def lint(*paths: str) -> subprocess.CompletedProcess:
  """Runs pylint's structure checks on ``paths`` with the project's limits."""
  return subprocess.run(
      [sys.executable, '-m', 'pylint', f'--rcfile={ROOT / "pyproject.toml"}',
       '--disable=all', f'--enable={",".join(STRUCTURE_CHECKS)}',
       '--score=n', *paths],
      cwd=ROOT, capture_output=True, text=True, check=False, timeout=600)


class StructureLintTest(absltest.TestCase):

  def test_within_the_linter_limits(self):
    result = lint('optax_q')
    self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

  def test_the_linter_sees_a_function_over_the_limits(self):
    source = 'def f(x):\n' + ''.join(
        f'  if x == {i}:\n    return {i}\n' for i in range(14)) + '  return x\n'
    with tempfile.TemporaryDirectory() as tmp:
      path = pathlib.Path(tmp) / 'branchy.py'
      path.write_text('"""A function with too many branches."""\n' + source)
      result = lint(str(path))
    self.assertNotEqual(result.returncode, 0)
    self.assertIn('too-many-branches', result.stdout)
    self.assertIn('too-many-return-statements', result.stdout)


class PublicApiTest(absltest.TestCase):

  def test_exports_sorted_and_present(self):
    names = list(optax_q.__all__)
    self.assertEqual(names, sorted(names))
    for name in names:
      self.assertTrue(hasattr(optax_q, name), name)
    self.assertIn('adam_with_resets', names)

  def test_every_public_function_documented(self):
    missing = []
    for module in (optax_q, optax_q.quant):
      for name in module.__all__:
        obj = getattr(module, name)
        doc = inspect.getdoc(obj) or ''
        where = f'{module.__name__}.{name}'
        if inspect.isfunction(obj):
          missing += [f'{where}: {s}' for s in ('Args:', 'Returns:',
                                                'Examples:') if s not in doc]
        elif inspect.isclass(obj) and 'Attributes:' not in doc:
          missing.append(f'{where}: Attributes:')
    self.assertEmpty(missing, '\n'.join(missing))

  def test_every_public_constant_documented(self):
    # A constant's docstring is the string literal after its assignment,
    # which only a static reader (griffe, as the API reference uses) sees.
    if griffe is None:
      self.skipTest('griffe (mkdocstrings) is not installed')
    package = griffe.load('optax_q', search_paths=[str(SRC.parent.parent)])
    constants, missing = [], []
    for module, loaded in ((optax_q, package), (optax_q.quant,
                                                package['quant'])):
      for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
          continue
        where = f'{module.__name__}.{name}'
        constants.append(where)
        member = loaded[name]
        target = member.final_target if member.is_alias else member
        if not (target.docstring and target.docstring.value.strip()):
          missing.append(where)
    self.assertIn('optax_q.NONNEGATIVE_FIELDS', constants)
    self.assertEmpty(missing, f'no docstring: {missing}')


class RenamedArgumentTest(absltest.TestCase):

  def test_quantize_scale(self):
    x = jnp.linspace(-1.0, 1.0, 300)
    new = optax_q.quantize(x, 'int8', scale_mode='row')
    with self.assertWarnsRegex(DeprecationWarning, 'scale_mode'):
      old = optax_q.quantize(x, 'int8', scale='row')
    np.testing.assert_array_equal(old.codes, new.codes)
    np.testing.assert_array_equal(old.scale, new.scale)
    self.assertEqual(old.scale_mode, 'row')
    with self.assertRaisesRegex(ValueError, 'pass only scale_mode'):
      optax_q.quantize(x, 'int8', scale='row', scale_mode='row')

  def test_quantize_state_scale(self):
    with self.assertWarnsRegex(DeprecationWarning, 'scale_mode'):
      tx = optax_q.quantize_state(optax.scale_by_adam(), 'int8',
                                  min_size=0, scale='tensor')
    state = tx.init({'w': jnp.ones((4, 64))})
    self.assertEqual(state.inner_state.mu['w'].scale_mode, 'tensor')
    with self.assertRaisesRegex(ValueError, 'scale must be one of'):
      optax_q.quantize_state(optax.scale_by_adam(), scale='col')

  def test_reset_state_every(self):
    inner = optax_q.scale_by_adam_local_age()
    with self.assertWarnsRegex(DeprecationWarning, 'reset_every'):
      old = optax_q.reset_state(inner, every=3)
    new = optax_q.reset_state(inner, reset_every=3)
    params = {'w': jnp.ones(3)}
    s_old, s_new = old.init(params), new.init(params)
    for _ in range(4):
      u_old, s_old = old.update(params, s_old)
      u_new, s_new = new.update(params, s_new)
    np.testing.assert_array_equal(u_old['w'], u_new['w'])
    self.assertEqual(int(s_old.resets['mu']), 1)
    with self.assertRaisesRegex(ValueError, 'pass only reset_every'):
      optax_q.reset_state(inner, 3, every=3)


class _Stats(NamedTuple):
  stats: dict  # {param: (left, right)}: non-negative entries.
  drift: dict  # params-shaped, signed.


def _factored() -> optax.GradientTransformation:
  """A toy preconditioner: per-parameter factor EMAs of another shape."""

  def init(params):
    return _Stats(
        stats=jax.tree.map(lambda p: (jnp.zeros((p.shape[0],) * 2),
                                      jnp.zeros((p.shape[1],) * 2)), params),
        drift=jax.tree.map(jnp.zeros_like, params))

  def update(updates, state, params=None):
    del params
    stats = jax.tree.map(
        lambda g, s: (0.9 * s[0] + abs(g) @ abs(g).T,
                      0.9 * s[1] + abs(g).T @ abs(g)), updates,
        state.stats, is_leaf=lambda x: isinstance(x, tuple))
    drift = jax.tree.map(lambda g, d: 0.9 * d + g, updates, state.drift)
    return updates, _Stats(stats, drift)

  return optax.GradientTransformation(init, update)


class NonnegativeFieldsTest(absltest.TestCase):

  def test_declared_field_gets_the_unsigned_variant(self):
    tx = optax_q.quantize_state(
        _factored(), 'int8_dynamic', min_size=0,
        nonnegative_fields=('stats',))
    state = tx.init({'w': jnp.ones((16, 32))})
    left, _ = state.inner_state.stats['w']
    self.assertEqual(left.fmt.name, 'int8_dynamic_unsigned')
    self.assertEqual(state.inner_state.drift['w'].fmt.name, 'int8_dynamic')
    g = {'w': jnp.linspace(-1.0, 1.0, 512).reshape(16, 32)}
    _, state = jax.jit(tx.update)(g, state)
    got = optax_q.dequantize(state.inner_state.stats['w'][0])
    want = abs(g['w']) @ abs(g['w']).T
    self.assertLess(float(jnp.max(jnp.abs(got - want))),
                    0.05 * float(jnp.max(want)))

  def test_default_set_applies_without_declaration(self):
    tx = optax_q.quantize_state(_factored(), 'int8_dynamic', min_size=0)
    state = tx.init({'w': jnp.ones((16, 32))})
    self.assertEqual(state.inner_state.stats['w'][0].fmt.name, 'int8_dynamic')

  def test_unsigned_format_only_on_declared_fields(self):
    with self.assertRaisesRegex(ValueError, "'stats' is a signed"):
      optax_q.quantize_state(_factored(), {'stats': 'fp4_e2m2u'})
    optax_q.quantize_state(_factored(), {'stats': 'fp4_e2m2u'},
                           nonnegative_fields=('stats',))

  def test_bad_declaration_named(self):
    with self.assertRaisesRegex(ValueError, r"nonnegative_fields.*'statz'"):
      optax_q.quantize_state(_factored(), nonnegative_fields=('statz',))
    for bad in ('stats', 3, [1]):
      with self.assertRaisesRegex(ValueError, 'nonnegative_fields'):
        optax_q.quantize_state(_factored(), nonnegative_fields=bad)


class StorageConfigTest(parameterized.TestCase):

  def test_defaults_and_canonical_values(self):
    config = optax_q.StorageConfig(seed=np.uint32(7), min_size=np.int64(0))
    self.assertEqual((config.seed, config.min_size, config.block_size),
                     (7, 0, 128))
    self.assertIsInstance(config.seed, int)
    self.assertEqual(config.formats, optax_q.get_format('int8_dynamic'))
    with self.assertRaises(dataclasses.FrozenInstanceError):
      config.seed = 3  # pytype: disable=attribute-error

  @parameterized.parameters(
      ('block_size', 3), ('seed', -1), ('min_size', 1.5), ('tile_size', 0),
      ('rounding', 'up'), ('scale_mode', 'col'), ('formats', 'int3'),
      ('track_stalls', 1), ('elementwise', 'yes'))
  def test_bad_values_named(self, name, value):
    with self.assertRaisesRegex(ValueError, name):
      optax_q.StorageConfig(**{name: value})

  def test_layout_defaults_are_static_under_inject_hyperparams(self):
    params = {'w': jnp.ones((8, 512))}
    tx = optax.inject_hyperparams(optax_q.adamw, hyperparam_dtype=jnp.float32)(
        learning_rate=optax.linear_schedule(1e-3, 0.0, 10))
    state = jax.jit(tx.init)(params)
    updates, state = jax.jit(tx.update)(params, state, params)
    # The same optimizer given the float32 values inject_hyperparams holds.
    f32 = jnp.float32
    plain = optax_q.adamw(
        optax.linear_schedule(1e-3, 0.0, 10), b1=f32(0.9), b2=f32(0.999),
        eps=f32(1e-8), eps_root=f32(0.0), weight_decay=f32(1e-4))
    want, _ = jax.jit(plain.update)(params, plain.init(params), params)
    np.testing.assert_array_equal(updates['w'], want['w'])
    self.assertNotIn('block_size', state.hyperparams)


class EncodeLikeTest(parameterized.TestCase):

  @parameterized.parameters(
      ('int8_dynamic', 'block'), ('int4', 'row'), ('fp8_e4m3', 'tensor'),
      ('bf16', 'none'))
  def test_same_layout_as_encode(self, fmt, mode):
    x = jnp.linspace(-3.0, 3.0, 6 * 200).reshape(6, 200)
    q = optax_q.quantize(x, fmt, scale_mode=mode, block_size=64)
    y = 0.5 * x + 0.25
    key = jax.random.key_data(jax.random.key(1))[0]  # Any uint32 key.
    got = qarray_lib.encode_like(q, y, key=key)
    want = qarray_lib.encode(y, q.fmt, scale_mode=mode, block_size=64,
                             key=key, dtype=q.dtype)
    self.assertEqual(jax.tree.structure(got), jax.tree.structure(q))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(a, b)


class PerParameterShardingTest(absltest.TestCase):

  def test_slots_of_other_shapes_follow_their_parameter(self):
    mesh = jax.make_mesh((1,), ('data',))
    params = {'w': jnp.ones((16, 32)), 'v': jnp.ones((8, 24))}
    specs = {'w': P('data', None), 'v': P(None, 'data')}
    shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
    tx = optax_q.quantize_state(_factored(), 'int8', min_size=0,
                                nonnegative_fields=('stats',))
    abstract = jax.eval_shape(tx.init, params)
    out = optax_q.state_shardings(abstract, shardings, strict=True)
    left, right = out.inner_state.stats['w']
    self.assertEqual(left.codes.spec, P('data', None))
    self.assertEqual(right.codes.spec, P('data', None))
    self.assertEqual(out.inner_state.stats['v'][1].scale.spec,
                     P(None, 'data'))
    self.assertEqual(out.inner_state.drift['w'].codes.spec, P('data', None))
    self.assertEqual(out.count.spec, P())
    state = jax.device_put(tx.init(params), out)
    _, state = jax.jit(tx.update)(params, state)



class ExplicitShortLastAxisTest(parameterized.TestCase):
  """A last axis shorter than one block, on an Explicit mesh axis.

  Its one padded block used to be laid out with the mesh axis inside the
  block (encode failed on an unsharded reshape, decode on a mul of
  mismatched shardings).
  """

  @parameterized.parameters(((8, 8),), ((8, 100),), ((3, 8, 8),))
  def test_matches_unsharded(self, shape):
    mesh = jax.make_mesh((1,), ('data',),
                         axis_types=(jax.sharding.AxisType.Explicit,))
    x = jnp.linspace(-2.0, 2.0, np.prod(shape)).reshape(shape)
    spec = P(*(None,) * (len(shape) - 1), 'data')
    xs = jax.device_put(x, NamedSharding(mesh, spec))

    def roundtrip(v):
      q = optax_q.quantize(v, 'int8', rounding='stochastic', seed=3)
      return q, optax_q.dequantize(q)

    want_q, want = jax.jit(roundtrip)(x)
    with jax.set_mesh(mesh):
      got_q, got = jax.jit(roundtrip)(xs)
    np.testing.assert_array_equal(got_q.codes, want_q.codes)
    np.testing.assert_array_equal(got_q.scale, want_q.scale)
    np.testing.assert_array_equal(got, want)


if __name__ == '__main__':
  with warnings.catch_warnings():
    absltest.main()
