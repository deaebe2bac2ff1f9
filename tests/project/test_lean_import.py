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
"""``pip install optax_q`` with no extra: jax, optax, numpy and ml_dtypes.

``import optax_q`` and every optimizer must work without Flax, SciPy (as a
library of ours; jax uses it for itself), Orbax or matplotlib, and
``optax_q.quant``, which needs Flax and SciPy, is imported on first use and
says which extra to install when they are missing. Each check runs in a
fresh interpreter (``tests/lean_worker.py``), since this one has them all
loaded. ``.ci/run`` runs the same worker in a fresh environment where
``pip install .`` installed no extra.
"""

import ast
import os
import pathlib
import re
import subprocess
import sys

from absl.testing import absltest
import pytest

try:
  import tomllib  # pylint: disable=g-import-not-at-top
except ImportError:  # Python 3.10
  tomllib = None

import lean_worker  # pylint: disable=g-bad-import-order

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / 'optax_q'
WORKER = pathlib.Path(lean_worker.__file__)


def _python(*args: str) -> str:
  """Runs Python on ``args`` in a fresh interpreter; returns its stdout."""
  env = dict(os.environ, PYTHONPATH=str(ROOT),
             # Compiling less: the worker checks what runs, not how fast.
             JAX_DISABLE_MOST_OPTIMIZATIONS='1', JAX_PLATFORMS='cpu')
  done = subprocess.run([sys.executable, *args], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=600)
  if done.returncode:
    raise AssertionError(f'exit {done.returncode}\n{done.stdout}\n'
                         f'{done.stderr}')
  return done.stdout


def _imports(path: pathlib.Path) -> set[str]:
  """Every module ``path`` imports, at top level or inside a function."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0:
      out.add(node.module)
      out.update(f'{node.module}.{alias.name}' for alias in node.names)
  return out


class LeanImportTest(absltest.TestCase):

  def test_import_loads_no_optional_package(self):
    out = _python('-c', (
        'import sys, optax_q\n'
        f'optional = {lean_worker.OPTIONAL!r}\n'
        'print(sorted(m for m in sys.modules'
        ' if m.partition(".")[0] in optional))\n'
        'print("quant" in sys.modules, "quant" in dir(optax_q))\n'
        'print(optax_q.quant.__name__, callable(optax_q.quant.ptq),'
        ' "flax" in sys.modules)\n'
        'with optax_q.quant.ptq(4):\n'
        '  print("flax" in sys.modules)\n'))
    self.assertEqual(out.splitlines(), [
        '[]',                            # No optional package...
        'False True',                    # ... optax_q.quant not loaded ...
        'optax_q.quant True False',      # ... until first used, and Flax
        'True',                          # where a tool uses it.
    ])

  def test_core_modules_import_no_optional_package(self):
    # Static: every import statement, those inside functions included, of
    # every module but the ones behind `optax_q.quant` (which `optax_q`
    # loads on first use, not with an import statement).
    # The tools are the package optax_q.quant, modules and all.
    self.assertTrue((PACKAGE / 'quant' / '_src' / 'linear_quant.py').exists())
    bad = []
    for path in sorted(PACKAGE.rglob('*.py')):
      module = '.'.join(path.relative_to(ROOT).with_suffix('').parts)
      if module.startswith('optax_q.quant'):
        continue
      for name in sorted(_imports(path)):
        if (name.partition('.')[0] in lean_worker.OPTIONAL
            or name.startswith('optax_q.quant')):
          bad.append(f'{module} imports {name}')
    self.assertEmpty(bad, '\n'.join(bad))

  def test_extras_named_are_declared(self):
    # The extra the ImportError names installs what optax_q.quant imports,
    # and every extra the README, the docs and CI name exists.
    if tomllib is None:
      self.skipTest('tomllib needs Python 3.11')
    extras = tomllib.loads((ROOT / 'pyproject.toml').read_text())[
        'project']['optional-dependencies']
    quant = {re.match(r'[A-Za-z0-9_.-]+', r).group() for r in extras['quant']}
    self.assertEqual(quant, {'flax', 'scipy'})
    self.assertIn('quant', re.findall(r'[a-z]+', extras['dev'][0]))
    texts = [ROOT / 'README.md', ROOT / '.ci' / 'run', PACKAGE / 'quant' / '__init__.py',
             *sorted((ROOT / 'docs').glob('*.md'))]
    named = set()
    for path in texts:
      for group in re.findall(r"(?:\.|optax_q)\[([a-z,]+)\]",
                              path.read_text()):
        named.update(group.split(','))
    self.assertContainsSubset({'quant', 'dev', 'docs', 'models'}, named)
    self.assertContainsSubset(named, set(extras))

  def test_drop_ins_run_without_optional_packages(self):
    # A representative few (one quantized drop-in, a wrapper around an
    # injected optimizer, a second-order one); all of them in the slow test
    # and in .ci/run.
    out = _python(str(WORKER), '--block', '--only', 'adamw,eco,muon')
    self.assertIn("pip install 'optax_q[quant]'", out)
    for name in ('adamw', 'eco', 'muon'):
      self.assertIn(f'{name}: ok', out)
    self.assertEqual(out.splitlines()[-1], 'ok')


@pytest.mark.slow
class LeanImportSlowTest(absltest.TestCase):

  def test_every_drop_in_runs_without_optional_packages(self):
    out = _python(str(WORKER), '--block')
    names = [line.split(':')[0] for line in out.splitlines()
             if ': ok' in line]
    self.assertContainsSubset(
        ['adam', 'adamw', 'lion', 'sgd', 'muon', 'shampoo', 'soap',
         'adam_with_resets', 'adamw_adaptive', 'adaptive_bits', 'eco',
         'quantize_state', 'quantize_gradients'], names)
    self.assertEqual(out.splitlines()[-1], 'ok')


if __name__ == '__main__':
  absltest.main()
