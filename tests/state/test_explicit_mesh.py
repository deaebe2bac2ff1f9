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
"""Every layout on meshes of 8 simulated CPU devices, Explicit and Auto axes.

On a mesh with ``Explicit`` axes (``jax.make_mesh``'s default) every array's
type carries its sharding, and the reshapes that block, pack and tile the
state must say how their results are sharded. The grid below holds leaves
whose state can't simply follow the parameter: three blocks per row on a
4-way axis, a padded last block, an odd last axis (a pad nibble), a packed
length the mesh axis does not divide, ranks 1 to 3. Codes, scales, updates
and new parameters must be the bits of an unsharded run, and on an explicit
mesh the state's types must be those that ``optax_q.state_shardings``
gives.

XLA reads ``--xla_force_host_platform_device_count`` when the CPU backend is
first created, so the flag is set here, before jax is imported; when another
module created the backend first, ``SubprocessTest`` runs these tests again
in a fresh interpreter (as ``test_sharding.py`` does).
"""

# pylint: disable=g-import-not-at-top,wrong-import-position
import helpers  # noqa: E402
import functools  # noqa: E402

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import pytest  # noqa: E402
import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

import optax_q  # noqa: E402

MESHES = {'2x4': ((2, 4), ('x', 'y')), '8': ((8,), ('x',))}

# Per mesh: name -> (shape, the parameter's spec), with block_size=128. A
# parameter's sharded axes divide by their mesh axes (an explicit mesh
# requires it); its blocks, or its packed 4-bit bytes, often do not.
LAYOUTS = {
    '2x4': {
        'three_blocks': ((8, 384), P('x', 'y')),  # 3 blocks, 4-way axis.
        'four_blocks': ((8, 512), P('x', 'y')),  # Scales sharded too.
        'padded': ((16, 200), P('x', 'y')),  # 2 blocks, the last padded.
        'odd': ((8, 129), P('x', None)),  # A pad nibble in 4-bit codes.
        'packed_odd': ((36, 130), P('y', 'x')),  # 65 packed bytes, 2-way.
        'rank3': ((4, 8, 256), P(None, 'x', 'y')),
        'rank1': ((4100,), P('x')),  # 33 blocks, the last padded.
        'one_block': ((64, 64), P('y', 'x')),  # 1 block on a 2-way axis.
        'replicated': ((16, 256), P()),
    },
    '8': {
        'rank1': ((4096,), P('x')),
        'rank1_padded': ((4104,), P('x')),  # 33 blocks, 8-way axis.
        'three_blocks': ((8, 384), P(None, 'x')),
        'odd': ((16, 131), P('x', None)),
        'rank3': ((2, 8, 96), P(None, None, 'x')),  # 1 short block.
    },
}

AXIS_TYPES = {'explicit': AxisType.Explicit, 'auto': AxisType.Auto}




def _mesh(mesh_name, axis_type):
  shape, names = MESHES[mesh_name]
  return jax.make_mesh(shape, names,
                       axis_types=(AXIS_TYPES[axis_type],) * len(shape))


def _params(mesh_name):
  key = jax.random.key(0)
  return {name: jax.random.normal(jax.random.fold_in(key, i), shape)
          for i, (name, (shape, _)) in enumerate(
              sorted(LAYOUTS[mesh_name].items()))}


def _grads(step, params):
  key = jax.random.fold_in(jax.random.key(1), step)
  return {name: jax.random.normal(jax.random.fold_in(key, i), p.shape)
          for i, (name, p) in enumerate(sorted(params.items()))}


def _param_shardings(mesh, mesh_name):
  return {name: NamedSharding(mesh, spec)
          for name, (_, spec) in LAYOUTS[mesh_name].items()}


def _assert_bits_equal(test, got, want):
  flat_got, def_got = jax.tree_util.tree_flatten_with_path(got)
  flat_want, def_want = jax.tree_util.tree_flatten_with_path(want)
  test.assertEqual(def_got, def_want)
  for (path, a), (_, b) in zip(flat_got, flat_want, strict=True):
    np.testing.assert_array_equal(helpers.bits(a), helpers.bits(b),
                                  err_msg=jax.tree_util.keystr(path))


def _spec(x):
  """The spec of an (abstract) array's type, one entry per axis."""
  spec = tuple(jax.typeof(x).sharding.spec)
  return spec + (None,) * (x.ndim - len(spec))


def _assert_types_follow(test, tree, shardings):
  """Each array's type is sharded as ``shardings`` says (explicit mesh)."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  for (path, x), s in zip(flat, jax.tree.leaves(shardings), strict=True):
    want = tuple(s.spec) + (None,) * (x.ndim - len(s.spec))
    test.assertEqual(_spec(x), want, jax.tree_util.keystr(path))


def _codec(fmt, scale, rounding):
  def encode(x):
    if scale == 'rank1' and x.ndim < 2:  # Rank-1 scales need a matrix.
      return x
    return optax_q.quantize(x, fmt, scale_mode=scale, rounding=rounding,
                            seed=3, step=1)

  def run(tree):
    qs = jax.tree.map(encode, tree)
    return qs, jax.tree.map(
        lambda q: optax_q.dequantize(q) if optax_q.is_qarray(q) else q, qs,
        is_leaf=optax_q.is_qarray)
  return run


@functools.cache
def _codec_reference(mesh_name, fmt, scale, rounding):
  return jax.jit(_codec(fmt, scale, rounding))(_params(mesh_name))


# (format, scale mode, rounding): every format and scale mode on the 2x4
# explicit mesh; on the others, one of each kind of code path (packed 4-bit,
# a 256-entry codebook, a tensor scale, packed 3-bit rounded in a space),
# to keep the compile time down.
ALL_CODECS = (
    [(f, None, 'stochastic') for f in (
        'bf16', 'fp16', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e2m1', 'fp4_e2m2u',
        'int8', 'int8_dynamic', 'int4', 'e3m2')]
    + [('int4', 'row', 'nearest'), ('int4', 'tensor', 'stochastic'),
       ('fp8_e4m3', 'tensor', 'nearest'), ('fp8_e4m3', 'none', 'nearest'),
       ('nf4', None, 'stochastic'), ('nf3', 'row', 'nearest'),
       ('int4_mulaw@sqrt', None, 'stochastic'), ('ue5m3', None, 'nearest'),
       ('fp8_e5m2_dre', 'row', 'nearest'), ('int4', 'rank1', 'nearest'),
       ('ue4m0', 'rank1', 'stochastic')])
SOME_CODECS = (('int4', None, 'stochastic'), ('int8_dynamic', None, 'nearest'),
               ('fp8_e4m3', 'tensor', 'stochastic'),
               ('ue3m0@rsqrt', None, 'stochastic'),
               ('nf4', 'block_pow2', 'stochastic'),
               ('fp8_e4m3_dre', None, 'stochastic'))
# The default suite keeps the tensor scale and ue3m0@rsqrt. The others are
# quantized on sharded leaves, bit for bit against unsharded runs, by other
# default tests: packed int4 and the int8_dynamic codebook in
# test_sharding.py (int4 also in the whole-tree optimizer test below), nf4
# with power-of-two scales and fp8_e4m3_dre in test_optimizer_matrix.py
# (ShardedMatrixTest, on 8 devices).
DEFAULT_CODECS = SOME_CODECS[2:4]


class CodecTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  # The default suite: one mesh and axis type, two of the six codecs
  # (explicit codecs also run eagerly in test_eager_on_explicit_mesh); every
  # pair, with all six, slow.
  @parameterized.named_parameters(
      (f'{m}_{a}', m, a) for m, a in list(zip(MESHES, AXIS_TYPES))[1:])
  def test_quantize_dequantize_match_unsharded(self, mesh_name, axis_type):
    self._check_codecs(mesh_name, axis_type, DEFAULT_CODECS)

  @parameterized.named_parameters(
      (f'{m}_{a}', m, a) for m in MESHES for a in AXIS_TYPES)
  @pytest.mark.slow
  def test_quantize_dequantize_match_unsharded_every_pair(self, mesh_name,
                                                          axis_type):
    self._check_codecs(mesh_name, axis_type, SOME_CODECS)

  @pytest.mark.slow
  def test_every_codec_on_explicit_2x4(self):
    self._check_codecs('2x4', 'explicit', ALL_CODECS)

  def _check_codecs(self, mesh_name, axis_type, codecs):
    mesh = _mesh(mesh_name, axis_type)
    param_shardings = _param_shardings(mesh, mesh_name)
    params = jax.device_put(_params(mesh_name), param_shardings)
    for fmt, scale, rounding in codecs:
      with self.subTest(fmt=fmt, scale=scale, rounding=rounding):
        want = _codec_reference(mesh_name, fmt, scale, rounding)
        with jax.set_mesh(mesh):
          got = jax.jit(_codec(fmt, scale, rounding))(params)
        _assert_bits_equal(self, got, want)
        if axis_type == 'explicit':
          # Codes and scales: the types state_shardings says.
          shardings = optax_q.state_shardings(
              jax.eval_shape(lambda q=got[0]: q), param_shardings)
          _assert_types_follow(self, got[0], shardings)

  def test_eager_on_explicit_mesh(self):
    mesh = _mesh('2x4', 'explicit')
    x = jax.device_put(_params('2x4')['three_blocks'],
                       NamedSharding(mesh, P('x', 'y')))
    q = optax_q.quantize(x, 'int4', rounding='stochastic')
    self.assertEqual(str(jax.typeof(q.codes)), 'uint8[8@x,192@y]')
    # Three blocks per row: the 'y' axis of the scales is replicated.
    self.assertEqual(str(jax.typeof(q.scale)), 'float32[8@x,3]')
    self.assertEqual(str(jax.typeof(optax_q.dequantize(q))),
                     'float32[8@x,384@y]')
    want = optax_q.quantize(np.asarray(x), 'int4', rounding='stochastic')
    _assert_bits_equal(self, q, want)


def _step_fn(tx):
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state, updates
  return step


def _optimizer(name):
  """The optimizers under test: the drop-in and both quantize_state paths."""
  if name == 'adamw':
    return optax_q.adamw(1e-2, mu_format='int4', nu_format='fp8_e4m3',
                         min_size=0, track_stalls=True)
  if name == 'adamw_codebooks':
    return optax_q.adamw(1e-2, mu_format='int8_dynamic',
                         nu_format='fp4_e2m2u', rounding='nearest',
                         min_size=0)
  elementwise = name == 'tiled'
  return optax.chain(
      optax_q.quantize_state(
          optax.scale_by_adam(),
          {'mu': 'fp4_e2m1' if elementwise else 'int8',
           'nu': 'int8_dynamic' if elementwise else 'int4'},
          min_size=0, elementwise=elementwise, tile_size=512),
      optax.scale(-1e-2))


_STEPS = 2


@functools.cache
def _optimizer_reference(mesh_name, name):
  tx = _optimizer(name)
  params = _params(mesh_name)
  state = jax.jit(tx.init)(params)
  step = jax.jit(_step_fn(tx))
  out = [(params, state)]
  for i in range(_STEPS):
    out.append(step(params, state, _grads(i, _params(mesh_name))))
    params, state = out[-1][:2]
  return out


class OptimizerTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()

  # The default suite: the whole-tree path on explicit axes; the rest is
  # slow. The tiled path on this grid (33 s, the slowest test of the default
  # suite) is slow too: the elementwise path on explicit axes stays in the
  # default suite, bit for bit against unsharded runs, in test_sharding.py
  # (ExplicitMeshTest), test_properties.py (random shapes) and
  # test_fp_mesh.py (quantized moments).
  @parameterized.named_parameters(
      (f'{n}_{m}_{a}', m, a, n) for m, a, names in (
          ('8', 'explicit', ('whole_tree',)),)
      for n in names)
  def test_init_and_update_match_unsharded(self, mesh_name, axis_type, name):
    self._check_optimizer(mesh_name, axis_type, name)

  @parameterized.named_parameters(
      (f'{n}_{m}_{a}', m, a, n) for m, a, names in (
          ('2x4', 'explicit', ('tiled', 'adamw', 'adamw_codebooks',
                               'whole_tree')),
          ('8', 'explicit', ('adamw', 'tiled')),
          ('2x4', 'auto', ('adamw', 'tiled')),
          ('8', 'auto', ('adamw_codebooks', 'whole_tree')))
      for n in names)
  @pytest.mark.slow
  def test_more_layouts_match_unsharded(self, mesh_name, axis_type, name):
    self._check_optimizer(mesh_name, axis_type, name)

  def _check_optimizer(self, mesh_name, axis_type, name):
    tx = _optimizer(name)
    mesh = _mesh(mesh_name, axis_type)
    param_shardings = _param_shardings(mesh, mesh_name)
    params = _params(mesh_name)
    shardings = optax_q.state_shardings(
        jax.eval_shape(tx.init, params), param_shardings)
    reference = _optimizer_reference(mesh_name, name)
    with jax.set_mesh(mesh):
      p = jax.device_put(params, param_shardings)
      if axis_type == 'explicit':
        # The types decide: no shardings given to jit.
        init, step = jax.jit(tx.init), jax.jit(_step_fn(tx))
      else:
        init = jax.jit(tx.init, out_shardings=shardings)
        step = jax.jit(_step_fn(tx), out_shardings=(
            param_shardings, shardings, param_shardings))
      state = init(p)
      _assert_bits_equal(self, state, reference[0][1])
      if axis_type == 'explicit':
        _assert_types_follow(self, state, shardings)
        types = jax.tree.map(jax.typeof, state)
      for i in range(_STEPS):
        out = step(p, state, jax.device_put(_grads(i, params),
                                            param_shardings))
        _assert_bits_equal(self, out, reference[i + 1])
        p, state = out[:2]
        if axis_type == 'explicit':
          self.assertEqual(jax.tree.map(jax.typeof, state), types)
          _assert_types_follow(self, p, param_shardings)  # New params.
          _assert_types_follow(self, out[2], param_shardings)  # Updates.



if __name__ == '__main__':
  absltest.main()
