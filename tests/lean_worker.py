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
"""The library with its required dependencies alone: jax, optax, numpy.

Run as a script in a fresh interpreter, by ``tests/project/test_lean_import.py``
(with ``--block``: every optional package refused by a meta-path finder, so
an import of one fails as on a machine without it) and by ``.ci/run`` (in a
fresh virtual environment where ``pip install .`` installed no extra, with
``--installed``: the package must come from that environment, not from the
source tree). It checks that ``import optax_q`` loads none of the optional
packages, that ``optax_q.quant`` names the extra to install when they are
missing, and runs ``init`` and one ``update`` of every drop-in and wrapper.
Prints one line per optimizer, then ``ok``; fails with a traceback.
"""

import argparse
import importlib.abc
import pathlib
import sys
import time

# Optional: extras, the examples' and tests' dependencies. Neither
# `import optax_q` nor an optimizer may import one. SciPy is one of jax's own
# dependencies (jaxlib takes its CPU LAPACK from it), so only imports by jax
# itself are let through.
OPTIONAL = ('flax', 'scipy', 'matplotlib', 'orbax', 'sklearn', 'tqdm',
            'torch', 'hypothesis', 'pytest', 'models')
JAX_OWN = {'scipy': ('jax', 'jaxlib')}


def _importer() -> str:
  """The module whose code runs the import being resolved."""
  frame = sys._getframe(2)  # pylint: disable=protected-access
  while frame is not None and (
      frame.f_code.co_filename.startswith('<frozen importlib')
      or frame.f_globals.get('__name__') == __name__):
    frame = frame.f_back
  return '' if frame is None else frame.f_globals.get('__name__', '')


class _Refuse(importlib.abc.MetaPathFinder):
  """Refuses the ``OPTIONAL`` packages, as if they were not installed."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    top = fullname.partition('.')[0]
    if top not in OPTIONAL:
      return None
    importer = _importer().partition('.')[0]
    if importer == top or importer in JAX_OWN.get(top, ()):
      return None
    raise ModuleNotFoundError(f'No module named {fullname!r} (refused)',
                              name=fullname)


def _loaded_optional() -> list[str]:
  return sorted(m for m in sys.modules if m.partition('.')[0] in OPTIONAL)


def _drop_ins(optax, optax_q, jnp):
  """``(name, transformation, params)`` for every drop-in and wrapper."""
  params = {'w': jnp.linspace(-1.0, 1.0, 16 * 256).reshape(16, 256),
            'b': jnp.linspace(0.5, 1.0, 256)}
  small = {'min_size': 0}  # Quantize every leaf, however small.
  qparams = optax_q.quantize_params(
      {'kernel': params['w'], 'bias': params['b']}, 'int8')
  return [
      ('adam', optax_q.adam(1e-3, **small), params),
      ('adamw', optax_q.adamw(1e-3, **small), params),
      ('lion', optax_q.lion(1e-3, **small), params),
      ('sgd', optax_q.sgd(1e-2, momentum=0.9, **small), params),
      ('muon', optax_q.muon(1e-3, **small), params),
      ('shampoo', optax_q.shampoo(1e-3, **small), params),
      ('soap', optax_q.soap(1e-3, **small), params),
      ('adam_with_resets', optax_q.adam_with_resets(
          10, formats={'mu': 'int8', 'nu': 'int8_dynamic'}, **small), params),
      ('adamw_adaptive', optax.chain(
          optax_q.adaptive_bits(optax.scale_by_adam(), elementwise=True,
                                track_stalls=False, **small),
          optax.add_decayed_weights(1e-4),
          optax.scale_by_learning_rate(1e-3)), params),
      ('adaptive_bits', optax_q.adaptive_bits(
          optax.scale_by_adam(), period=1, **small), params),
      ('eco', optax_q.eco(optax.inject_hyperparams(optax.adamw)(1e-3)),
       qparams),
      ('quantize_state', optax_q.quantize_state(
          optax.scale_by_adam(), 'fp8_e4m3', **small), params),
      ('quantize_gradients', optax.chain(
          optax_q.quantize_gradients('e4m3'), optax.adam(1e-3)), params),
  ]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--block', action='store_true',
                      help='refuse the optional packages')
  parser.add_argument('--installed', action='store_true',
                      help='require an install with no extra: optax_q from '
                      'site-packages, not a source tree, and no Flax')
  parser.add_argument('--only', default='',
                      help='comma-separated names of the optimizers to run '
                      '(default: all)')
  args = parser.parse_args()
  if args.block:
    sys.meta_path.insert(0, _Refuse())

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  import optax_q  # pylint: disable=g-import-not-at-top

  where = pathlib.Path(optax_q.__file__).resolve()
  print(f'optax_q from {where}')
  if args.installed and 'site-packages' not in where.parts:
    raise AssertionError(f'optax_q imported from {where}, not an install')
  loaded = _loaded_optional()
  if loaded:
    raise AssertionError(f'import optax_q loaded {loaded}')

  try:
    getattr(optax_q, 'quant')
  except ImportError as e:
    if "pip install 'optax_q[quant]'" not in str(e):
      raise AssertionError(f'optax_q.quant: unclear error {e!r}') from e
    print(f'optax_q.quant: {e}')
  else:
    if args.block or args.installed:
      raise AssertionError('optax_q.quant imported without Flax')
    print('optax_q.quant: available')

  cases = _drop_ins(optax, optax_q, jnp)
  only = [n for n in args.only.split(',') if n]
  unknown = set(only) - {name for name, _, _ in cases}
  if unknown:
    raise SystemExit(f'--only: unknown optimizers {sorted(unknown)}')
  for name, tx, params in cases:
    if only and name not in only:
      continue
    start = time.perf_counter()
    before = optax_q.dequantize_params(params)
    grads = jax.tree.map(lambda p: jnp.full(p.shape, 0.1, p.dtype), before)

    @jax.jit
    def two_steps(params, state, tx=tx, grads=grads):
      for _ in range(2):  # SOAP's first step only sets up its bases.
        updates, state = tx.update(grads, state, params)
        # optax_q.apply_updates also applies eco's new quantized weights.
        params = optax_q.apply_updates(params, updates)
      return optax_q.dequantize_params(params)

    after = two_steps(params, tx.init(params))
    moved = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                for a, b in zip(jax.tree.leaves(after),
                                jax.tree.leaves(before)))
    if not (np.isfinite(moved) and moved > 0):
      raise AssertionError(f'{name}: two steps moved the parameters by {moved}')
    print(f'{name}: ok (largest change {moved:.3g}, '
          f'{time.perf_counter() - start:.1f} s)')
  loaded = [m for m in _loaded_optional()
            if m.partition('.')[0] not in JAX_OWN]
  if loaded:
    raise AssertionError(f'the optimizers loaded {loaded}')
  print('ok')


if __name__ == '__main__':
  main()
