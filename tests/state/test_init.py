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
"""Cheap init: zero states from the known codes and scales of zero.

`qarray.zeros` against the codec's encoding of zeros for every format
family and scale mode; ``init`` of every drop-in against the encoded init
(``zero_leaves`` switched off), eager, abstract and sharded on a 4x2 mesh
of 8 simulated CPU devices (``SubprocessTest`` runs the mesh tests in a
fresh interpreter where this one has fewer devices); no encoder compiled
at init, none traced into a reset.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import itertools  # noqa: E402
from unittest import mock  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402
from optax_q._src.codec import formats as formats_lib  # noqa: E402
from optax_q._src.codec import packing  # noqa: E402
from optax_q._src.codec import qarray as qarray_lib  # noqa: E402
from optax_q._src.state import transform  # noqa: E402

# One format per family (the default suite), then the others (slow).
FAMILIES = ('fp8_e4m3', 'int8', 'int8_dynamic', 'int4', 'nf4', 'nf3',
            'fp4_e2m1', 'fp4_e2m2u', 'ue4m3', 'int4_sqrt', 'int3_mulaw',
            'fp8_e4m3_dre', 'bf16', 'fp16', 'e3m2')
MORE = ('fp8_e5m2', 'fp8_e5m2_dre', 'ue8m0', 'ue4m0', 'ue3m2', 'e5m10',
        'e4m3fn', 'e5m2_ieee', 'e2m0', 'int3_sqrt', 'int4_mulaw',
        'int4_softsign', 'int3_softsign', 'int8_dynamic_unsigned',
        'int4_unsigned', 'int3_mulaw_unsigned', 'ue4m3@log', 'ue4m3@sqrt',
        'int4_sqrt_unsigned@rsqrt', 'fp4_e2m2u@sqrt', 'nf4@sqrt')
MODES = ('none', 'tensor', 'row', 'block', 'block_pow2', 'rank1')
SHAPES = ((), (5,), (3, 13), (2, 3, 16))
# A mode each family is stored in by default, or the one it can't use.
_FAST_MODE = {'fp8_e4m3': 'rank1', 'int8': 'block_pow2', 'int4': 'row',
              'bf16': 'none', 'e3m2': 'tensor'}


def _layouts(names, modes, shapes):
  for name, mode, shape in itertools.product(names, modes, shapes):
    fmt = formats_lib.get_format(name)
    if mode == 'rank1' and len(shape) < 2:
      continue
    try:
      qarray_lib.check_layout(fmt, mode)
    except ValueError:
      continue
    yield name, mode, shape


FAST = [(n, _FAST_MODE.get(n, 'block'), (3, 13)) for n in FAMILIES]
FULL = [c for c in _layouts(FAMILIES + MORE, MODES, SHAPES) if c not in FAST]


def _bits(x) -> tuple:
  """dtype, shape and bytes of an array (None stays None)."""
  if x is None:
    return None
  a = np.asarray(x)
  return (str(a.dtype), a.shape, a.reshape(-1).view(np.uint8).tobytes())


def assert_same_state(test, got, want, shardings: bool = False):
  """The same tree, and every leaf bit for bit (and sharded alike)."""
  test.assertEqual(jax.tree.structure(got), jax.tree.structure(want))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got),
                          jax.tree.leaves(want)):
    name = jax.tree_util.keystr(path)
    test.assertEqual(_bits(a), _bits(b), name)
    if shardings:
      test.assertTrue(
          a.sharding.is_equivalent_to(b.sharding, a.ndim),
          f'{name}: {a.sharding} != {b.sharding}')


def encoded_init(tx, params):
  """``tx.init`` with every quantized leaf encoded (the init before zero
  states were built from constants)."""
  with mock.patch.object(transform, 'zero_leaves', lambda *_: None):
    return tx.init(params)


class ZerosTest(parameterized.TestCase):

  def _check(self, name, mode, shape):
    fmt = formats_lib.get_format(name)
    want = qarray_lib.encode_compiled(jnp.zeros(shape), fmt, scale_mode=mode,
                                      block_size=4, key=None)
    got = qarray_lib.zeros(shape, fmt, scale_mode=mode, block_size=4)
    assert_same_state(self, got, want)

  @parameterized.parameters(*FAST)
  def test_zeros_are_the_encoding_of_zeros(self, name, mode, shape):
    self._check(name, mode, shape)

  @pytest.mark.slow
  def test_zeros_every_format_mode_and_shape(self):
    for case in FULL:
      with self.subTest(case=case):
        self._check(*case)

  @parameterized.product(bits=(3, 4), n=(1, 5, 8, 13, 16))
  def test_packed_row_is_what_pack_gives(self, bits, n):
    code = 5
    want = packing.pack(jnp.full((n,), code, jnp.uint8), bits)
    np.testing.assert_array_equal(packing.packed_row(code, n, bits), want)


def _params():
  key = jax.random.key(0)
  shapes = {'w': (16, 256), 'v': (3, 129), 'b': (256,), 's': (7,)}
  return {k: jax.random.normal(jax.random.fold_in(key, i), s)
          for i, (k, s) in enumerate(shapes.items())}


def _eco():
  return optax_q.quantize_state(
      optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3), 'fp8_e4m3'),
      {'mu': 'int8_dynamic', 'nu': 'ue4m0'}, min_size=0)


# Every drop-in (formats of each family among them); MIN_SIZE 0 quantizes
# the vectors too.
DROP_INS = {
    'adamw_int8_dynamic': lambda: optax_q.adamw(1e-3, min_size=0),
    'adamw_fp8_rank1': lambda: optax_q.adamw(
        1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3', scale_mode='rank1',
        min_size=0),
    'adam_int4_nf4': lambda: optax_q.adam(
        1e-3, mu_format='nf4', nu_format='int4', block_size=32, min_size=0),
    'adam_nf3_fp4u': lambda: optax_q.adam(
        1e-3, mu_format='nf3', nu_format='fp4_e2m2u', block_size=32,
        min_size=0),
    'adam_pow2_dre': lambda: optax_q.adam(
        1e-3, mu_format='fp8_e4m3_dre', nu_format='int8',
        scale_mode={'mu': 'block', 'nu': 'block_pow2'}, min_size=0),
    'adamw_int4': lambda: optax_q.adamw(
        1e-3, mu_format='int4', nu_format='int4', min_size=0),
    'lion': lambda: optax_q.lion(1e-3, min_size=0),
    'sgd': lambda: optax_q.sgd(1e-3, momentum=0.9, mu_format='int3_mulaw',
                               min_size=0),
    'muon': lambda: optax_q.muon(1e-3, min_size=0),
    'shampoo': lambda: optax_q.shampoo(1e-3, min_size=0),
    'soap': lambda: optax_q.soap(1e-3, min_size=0, reset_every=10),
    'adam_with_resets': lambda: optax_q.adam_with_resets(
        'adaptive', formats={'mu': 'int8_dynamic', 'nu': 'ue4m3'},
        min_size=0),
    'adaptive_bits': lambda: optax.chain(
        optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                              track_stalls=False, min_size=0),
        optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(1e-3)),
    'quantize_state_bf16_e3m2': lambda: optax_q.quantize_state(
        optax.adam(1e-3), {'mu': 'e3m2', 'nu': 'bf16'}, min_size=0),
}
_FAST_DROP_INS = ('adamw_int8_dynamic', 'adam_nf3_fp4u', 'soap',
                  'adaptive_bits')


class InitTest(parameterized.TestCase):

  def _check(self, name):
    tx = DROP_INS[name]()
    params = _params()
    assert_same_state(self, tx.init(params), encoded_init(tx, params))
    abstract = jax.eval_shape(tx.init, params)
    want = jax.eval_shape(lambda p: encoded_init(tx, p), params)
    self.assertEqual(jax.tree.structure(abstract), jax.tree.structure(want))
    self.assertEqual(jax.tree.leaves(abstract), jax.tree.leaves(want))

  @parameterized.parameters(*_FAST_DROP_INS)
  def test_init_is_the_encoded_init(self, name):
    self._check(name)

  @pytest.mark.slow
  def test_every_drop_in(self):
    for name in DROP_INS:
      with self.subTest(name=name):
        self._check(name)

  def test_eco_init(self):
    params = optax_q.quantize_params(_params(), 'fp8_e4m3',
                                     filter=lambda path, x: x.ndim == 2)
    tx = _eco()
    assert_same_state(self, tx.init(params), encoded_init(tx, params))

  def test_init_encodes_nothing(self):
    # Moments are zeros: their codes and scales are constants. A leaf
    # that is not zero (an identity basis) is still encoded.
    with mock.patch.object(qarray_lib, 'encode_compiled',
                           wraps=qarray_lib.encode_compiled) as encode:
      optax_q.adamw(1e-3, min_size=0).init(_params())
    encode.assert_not_called()
    zero = transform.zero_leaves(
        optax_q.scale_by_soap().init, {'w': jnp.ones((4, 8))})
    self.assertFalse(zero.eigvecs_l['w'])
    self.assertTrue(zero.mu['w'])

  def test_a_nonzero_init_is_encoded(self):
    # optax's adagrad starts its sum of squares at 0.1: not zero.
    tx = optax_q.quantize_state(optax.adagrad(1e-2), 'int8_dynamic',
                                min_size=0, nonnegative_fields=('sum_of_squares',))
    state = tx.init(_params())
    q = jax.tree.leaves(state, is_leaf=optax_q.is_qarray)
    decoded = [optax_q.dequantize(x) for x in q if optax_q.is_qarray(x)]
    self.assertNotEmpty(decoded)
    for x in decoded:
      np.testing.assert_allclose(x, 0.1, rtol=1e-2)

  def test_reset_traces_no_encoder(self):
    tx = optax_q.adamw(1e-3, reset_every=2, min_size=0)
    params = _params()
    state = tx.init(params)
    with mock.patch.object(qarray_lib, 'encode', wraps=qarray_lib.encode) as e:
      jax.eval_shape(lambda s: optax_q.reset_where(s, True), state)
    e.assert_not_called()


def _mesh(axis_type):
  return jax.make_mesh((4, 2), ('data', 'model'),
                       axis_types=(axis_type, axis_type))


# Tall, wide, ragged (blocks or packed bytes that don't divide), vectors.
LAYOUTS = {
    'w': ((64, 256), P('data', 'model')),
    'r': ((8, 258), P('data', 'model')),
    'o': ((6, 130), P(None, 'model')),
    't': ((256, 64), P('model', 'data')),
    'b': ((512,), P('data')),
    'n': ((24,), P()),
}
MESH_TXS = {
    'adamw_int4': lambda: optax_q.adamw(
        1e-3, mu_format='int4', nu_format='int4', block_size=32, min_size=0),
    'adamw_fp8_rank1': lambda: optax_q.adamw(
        1e-3, mu_format='fp8_e4m3', nu_format='fp8_e4m3', scale_mode='rank1',
        min_size=0),
    'adam_nf3_int8_dynamic': lambda: optax_q.adam(
        1e-3, mu_format='nf3', block_size=32, min_size=0),
}


class MeshInitTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  def _params(self, mesh):
    params = _params_of(LAYOUTS)
    return {k: jax.device_put(v, NamedSharding(mesh, LAYOUTS[k][1]))
            for k, v in params.items()}

  @parameterized.parameters(*MESH_TXS)
  def test_sharded_init(self, name):
    mesh = _mesh(AxisType.Auto)
    tx = MESH_TXS[name]()
    params = self._params(mesh)
    assert_same_state(self, tx.init(params), encoded_init(tx, params),
                      shardings=True)
    want = encoded_init(tx, params)
    out = jax.tree.map(
        lambda x: x.sharding if isinstance(x.sharding, NamedSharding)
        else NamedSharding(mesh, P()), want)
    got = jax.jit(tx.init, out_shardings=out)(params)
    want = jax.jit(lambda p: encoded_init(tx, p), out_shardings=out)(params)
    assert_same_state(self, got, want, shardings=True)
    got = jax.jit(tx.init)(params)
    want = jax.jit(lambda p: encoded_init(tx, p))(params)
    assert_same_state(self, got, want, shardings=True)

  @parameterized.parameters(*MESH_TXS)
  def test_explicit_mesh_init(self, name):
    mesh = _mesh(AxisType.Explicit)
    tx = MESH_TXS[name]()
    with jax.set_mesh(mesh):
      params = self._params(mesh)
      got = jax.jit(tx.init)(params)
      want = jax.jit(lambda p: encoded_init(tx, p))(params)
      assert_same_state(self, got, want, shardings=True)
      abstract = jax.eval_shape(tx.init, params)
      self.assertEqual(
          jax.tree.leaves(abstract),
          jax.tree.leaves(jax.eval_shape(
              lambda p: encoded_init(tx, p), params)))


def _params_of(layouts):
  key = jax.random.key(1)
  return {k: jax.random.normal(jax.random.fold_in(key, i), s)
          for i, (k, (s, _)) in enumerate(layouts.items())}



if __name__ == '__main__':
  absltest.main()
