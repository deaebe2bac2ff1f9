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
"""Every drop-in on one grid of shapes and specs, Explicit and Auto meshes.

A 4 x 2 mesh of 8 simulated CPU devices; the parameters below are tall and
wide, sharded over both axes, one or none, ragged against the blocks of the
second-order optimizers, and vectors of odd length. Each drop-in runs
three updates with its default (quantized) state, on the mesh and on one
device, with the parameters' shardings given to nothing but the inputs (the
state follows them as the update computes it, as a user's ``jit`` does).
The parameters after the run must agree with the unsharded run's to
``TOLERANCE`` of the accumulated update: bit for bit for the elementwise
optimizers; Muon's Newton-Schulz runs on the gathered matrix; Shampoo and
SOAP are not bit-identical off one device (see docs/second_order.md).

The default suite runs a representative slice (the layouts that failed on
Explicit axes: Muon on every layout, Shampoo and SOAP on a row-sharded
matrix whose block grid keeps no mesh axis and SOAP on a sharded vector;
the elementwise drop-ins are sharded bit for bit in
test_optimizer_matrix.py's default suite); ``-m slow`` runs the whole
grid, with ECO's mesh tests in test_eco_mesh.py.
"""

# pylint: disable=g-import-not-at-top,wrong-import-position

from absl.testing import absltest  # noqa: E402
from absl.testing import parameterized  # noqa: E402
import jax  # noqa: E402
from jax.sharding import AxisType  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402

import optax_q  # noqa: E402

# name -> (shape, spec) on a ('x': 4, 'y': 2) mesh; sharded axes divide by
# their mesh axes (an explicit mesh requires it), blocks often do not.
LAYOUTS = {
    'tall_both': ((256, 64), P('x', 'y')),
    'wide_rows': ((64, 256), P('x', None)),
    'wide_cols': ((64, 256), P(None, 'y')),
    'ragged_both': ((36, 130), P('x', 'y')),
    'replicated': ((48, 96), P()),
    'vector': ((4104,), P('x')),
    'vector_odd': ((129,), P()),
    'vector_odd_y': ((130,), P('y')),
}

LR = 1e-3
DROP_INS = {
    'adam': lambda: optax_q.adam(LR, min_size=0),
    'adamw': lambda: optax_q.adamw(LR, min_size=0),
    'lion': lambda: optax_q.lion(LR, min_size=0),
    'sgd_momentum': lambda: optax_q.sgd(LR, momentum=0.9, min_size=0),
    'adamw_resets': lambda: optax_q.adamw(LR, min_size=0, reset_every=2),
    'adamw_adaptive_bits': lambda: optax.chain(
        optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                              track_stalls=False, min_size=0),
        optax.add_decayed_weights(1e-4), optax.scale_by_learning_rate(LR)),
    'muon': lambda: optax_q.muon(LR, min_size=0),
    'muon_int4': lambda: optax_q.muon(LR, min_size=0, mu_format='int4',
                                      block_size=128),
    'shampoo': lambda: optax_q.shampoo(LR, min_size=0),
    'soap': lambda: optax_q.soap(LR, min_size=0),
}
# Relative to the accumulated update's largest entry; (name, axis type)
# before name. Muon: float32 rounding of the Newton-Schulz products (and of
# the codes it moves). SOAP's 8-bit state on Auto axes: XLA partitions the
# block matmuls, a rounding difference flips a stochastically rounded code
# and Adam in the rotated basis amplifies it (docs/second_order.md).
TOLERANCE = {'muon': 1e-4, 'muon_int4': 1e-4, 'shampoo': 5e-5, 'soap': 5e-5,
             ('soap', 'auto'): 0.1}
AXIS_TYPES = {'explicit': AxisType.Explicit, 'auto': AxisType.Auto}
STEPS = 3

GRID = [(f'{n}_{a}', n, a) for n in DROP_INS for a in AXIS_TYPES]
# The default slice (test name -> the layouts it runs): the layouts that
# failed on Explicit axes, each optimizer once (resets: zeros written into
# a state sharded over both axes). Compiling Shampoo and SOAP
# per layout is what costs.
DEFAULT = {'muon_explicit': tuple(LAYOUTS),
           'adamw_resets_explicit': ('tall_both',),
           'shampoo_explicit': ('wide_rows',),
           'soap_explicit': ('wide_rows', 'vector')}


def _params(names):
  key = jax.random.key(0)
  return {n: jax.random.normal(jax.random.fold_in(key, i), LAYOUTS[n][0])
          * 0.1 for i, n in enumerate(sorted(names))}


def _grads(step, names):
  key = jax.random.fold_in(jax.random.key(1), step)
  return {n: jax.random.normal(jax.random.fold_in(key, i), LAYOUTS[n][0])
          for i, n in enumerate(sorted(names))}


def _run(tx, params, put=lambda t: t):
  step = jax.jit(lambda p, s, g: (lambda u, s: (
      optax.apply_updates(p, u), s))(*tx.update(g, s, p)))
  p = put(params)
  s = jax.jit(tx.init)(p)
  for i in range(STEPS):
    p, s = step(p, s, put(_grads(i, params)))
  return jax.tree.map(np.asarray, p)


def check_sharded_matches_unsharded(test, name, axis_type,
                                    names=tuple(LAYOUTS)):
  """The drop-in ``name`` on the layouts ``names`` of the grid: sharded
  params after the run agree with unsharded ones."""
  mesh = jax.make_mesh((4, 2), ('x', 'y'),
                       axis_types=(AXIS_TYPES[axis_type],) * 2)
  shardings = {n: NamedSharding(mesh, LAYOUTS[n][1]) for n in names}
  tx = DROP_INS[name]()
  params = _params(names)
  want = _run(tx, params)
  with jax.set_mesh(mesh):
    got = _run(tx, params, lambda t: jax.device_put(t, shardings))
  tol = TOLERANCE.get((name, axis_type), TOLERANCE.get(name, 0.0))
  for n in names:
    moved = np.max(np.abs(want[n] - np.asarray(params[n])))
    err = np.max(np.abs(got[n] - want[n]))
    test.assertGreater(moved, 0.0, n)
    test.assertLessEqual(err, tol * moved,
                         f'{name} {axis_type} {n}: {err / moved:.3g}')


class MeshGridTest(parameterized.TestCase):
  """Every drop-in, sharded against unsharded, on the grid."""

  def setUp(self):
    super().setUp()

  @parameterized.named_parameters(
      (t, n, a, DEFAULT[t]) for t, n, a in GRID if t in DEFAULT)
  def test_sharded_matches_unsharded(self, name, axis_type, names):
    check_sharded_matches_unsharded(self, name, axis_type, names)

  @parameterized.named_parameters(GRID)
  @pytest.mark.slow
  def test_sharded_matches_unsharded_slow(self, name, axis_type):
    check_sharded_matches_unsharded(self, name, axis_type)



if __name__ == '__main__':
  absltest.main()
