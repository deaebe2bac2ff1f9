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
"""Smoke tests of the example scripts, in a tiny setting.

The demo and the precision study run in one process with the same tiny
model, schedule and optimizers, so the compiled train steps are shared (the
scripts cache their transforms and model); the whole module takes a few
seconds of training plus two compilations. Every script writes only to its
``--out`` folder, ``runs/<script>/`` by default: these tests give it a
temporary one and check that nothing under ``docs/`` changes. Runs of the
scripts that take longer than a few seconds are marked ``slow``.
"""

import contextlib
import io
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import optax_q

_ROOT = pathlib.Path(__file__).resolve().parents[2]
_EXAMPLES = _ROOT / 'examples'
sys.path.insert(0, str(_EXAMPLES))

# pylint: disable=g-import-not-at-top,wrong-import-position
import _common  # noqa: E402
import bench_step  # noqa: E402
import demo  # noqa: E402
import gpu_check  # noqa: E402
import profile_step  # noqa: E402
import roofline  # noqa: E402
import scale_calibration  # noqa: E402
import staleness_simulation  # noqa: E402
import study_bits  # noqa: E402
import study_eco  # noqa: E402
import study_fidelity  # noqa: E402
import study_fp_convergence  # noqa: E402
import study_optimizers_quantization  # noqa: E402
import study_lowbit  # noqa: E402
import study_precision  # noqa: E402
import study_second_order  # noqa: E402
import study_staleness  # noqa: E402
import update_error  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position

SCRIPTS = (bench_step, demo, profile_step, roofline, staleness_simulation,
           study_bits, study_eco, study_fidelity, study_lowbit,
           study_precision,
           study_optimizers_quantization, study_second_order, study_staleness,
           update_error)

# The same model and schedule for both scripts: compiled steps are shared.
TINY = ['--d-model', '32', '--num-layers', '1', '--num-heads', '2',
        '--seq-len', '32', '--batch-size', '4', '--steps', '4',
        '--eval-every', '2', '--eval-batches', '1']
CONFIGS = ['fp32', 'fp8_e4m3/rn']


def _quiet(fn, *args):
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(
      io.StringIO()):
    result = fn(*args)
  return result, out.getvalue()


def _docs_status():
  """``git status`` of ``docs/``, untracked files included.

  ``None`` outside a git checkout, where the checks then compare nothing.
  """
  try:
    return subprocess.run(
        ['git', 'status', '--porcelain', '--untracked-files=all', 'docs'],
        cwd=_ROOT, capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return None


class _DocsUnchanged(absltest.TestCase):
  """Runs a script in a temporary ``--out`` and checks ``docs/`` after."""

  def setUp(self):
    super().setUp()
    tmp = tempfile.TemporaryDirectory()
    self.addCleanup(tmp.cleanup)
    self.out = pathlib.Path(tmp.name)
    self.docs_before = _docs_status()

  def assert_wrote(self, *names):
    self.assertEqual(_docs_status(), self.docs_before)
    for name in names:
      self.assertTrue((self.out / name).is_file(), name)


class ExamplesTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tmp = tempfile.TemporaryDirectory()
    cls.dir = pathlib.Path(cls.tmp.name)
    cls.docs_before = _docs_status()
    # A small corpus: reading 8 MB is not what is being tested.
    small = ['--max-bytes', '200000']
    cls.demo, cls.demo_out = _quiet(demo.main, [
        '--out', str(cls.dir / 'demo'), '--configs', *CONFIGS,
        '--no-progress', *TINY, *small])
    doc = cls.dir / 'precision.md'
    doc.write_text(f'intro\n{study_precision.DOC_BEGIN}\nold\n'
                   f'{study_precision.DOC_END}\noutro\n')
    cls.doc = doc
    cls.study, cls.study_out = _quiet(study_precision.main, [
        '--mode', 'quick', '--seeds', '0', '1', '--configs', *CONFIGS,
        '--out', str(cls.dir / 'results'), '--doc', str(doc),
        '--no-progress', '--note', 'smoke test', *TINY, *small])

  @classmethod
  def tearDownClass(cls):
    cls.tmp.cleanup()
    super().tearDownClass()

  def test_demo_table_and_files(self):
    lines = self.demo_out.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith('optimizer'))
    rows = [l.split() for l in lines[header + 2:header + 2 + len(CONFIGS)]]
    self.assertEqual([r[0] for r in rows], CONFIGS)
    self.assertEqual(rows[0][2], '+0.00%')
    for r in rows:
      self.assertGreater(float(r[1]), 0.0)  # final validation loss
    out = self.dir / 'demo'
    self.assertGreater((out / 'loss_curves.png').stat().st_size, 1000)
    metrics = json.loads((out / 'metrics.json').read_text())
    for key in ('command', 'git_revision', 'date', 'machine', 'rows'):
      self.assertIn(key, metrics)
    fp32, fp8 = metrics['rows']
    self.assertEqual(fp32['state_bits_per_element'], 32.0)
    self.assertLess(fp8['state_bytes'], fp32['state_bytes'])
    self.assertGreater(fp8['quantized_elements'], 0.5)
    self.assertTrue((out / 'fp8_e4m3_rn.json').exists())

  def test_study_json(self):
    res = json.loads(
        (self.dir / 'results' / 'precision.json').read_text())
    for key in ('command', 'git_revision', 'date', 'machine', 'mode', 'rows',
                'summary'):
      self.assertIn(key, res)
    self.assertEqual(res['mode'], 'quick')
    self.assertIn('study_precision.py', res['command'])
    self.assertLen(res['rows'], len(CONFIGS) * 2)
    for row in res['rows']:
      for key in ('config', 'seed', 'final_val_loss', 'state_bytes',
                  'state_bits_per_element', 'step_ms_median'):
        self.assertIn(key, row)
    self.assertEqual({r['config'] for r in res['rows']}, set(CONFIGS))
    self.assertEqual({r['seed'] for r in res['rows']}, {0, 1})
    fp32 = res['summary'][0]
    self.assertEqual(fp32['config'], 'fp32')
    self.assertEqual(fp32['mean_gap'], 0.0)
    # Fidelity to the float32 twin (on by default); fp32 is its own twin.
    self.assertEqual((fp32['norm_ratio'], fp32['cosine'],
                      fp32['weight_distance']), (1.0, 1.0, 0.0))
    for row in res['rows']:
      self.assertGreater(row['norm_ratio'], 0.0)
      self.assertLessEqual(row['cosine'], 1.0)
      self.assertGreaterEqual(row['weight_distance'], 0.0)
    # The memory columns count the optimizer's state, not the twin's (with
    # it, the fp8 state would outweigh fp32's).
    by_config = {r['config']: r for r in res['rows']}
    self.assertLess(by_config['fp8_e4m3/rn']['state_bytes'],
                    by_config['fp32']['state_bytes'] // 2)
    self.assertLess(by_config['fp8_e4m3/rn']['state_bits_per_element'], 16.0)

  def test_study_markdown_plot_and_doc(self):
    out = self.dir / 'results'
    self.assertGreater((out / 'precision.png').stat().st_size, 1000)
    self.assertFalse((out / 'precision.partial.json').exists())
    md = (out / 'precision.md').read_text()
    self.assertIn('| `fp8_e4m3/rn` |', md)
    self.assertIn('| norm ratio | cosine | weight distance |', md)
    self.assertIn('larger effective step, not more precision', md)
    self.assertIn('Command: `python examples/study_precision.py', md)
    doc = self.doc.read_text()
    self.assertNotIn('old', doc)
    self.assertIn('| `fp32` |', doc)
    self.assertTrue(doc.startswith('intro\n') and doc.endswith('outro\n'))

  def test_study_add_fidelity_reproduces_the_published_runs(self):
    # A result written without fidelity gets it from reruns of one seed:
    # the reruns reproduce the published losses bit for bit, and their
    # fidelity is what the tracked study itself measured.
    out = self.dir / 'add_fidelity'
    out.mkdir()
    published = json.loads(
        (self.dir / 'results' / 'precision.json').read_text())
    stripped = json.loads(json.dumps(published))
    for row in stripped['rows']:
      for key in ('norm_ratio', 'cosine', 'weight_distance'):
        row.pop(key)
    (out / 'precision.json').write_text(json.dumps(stripped))
    _quiet(study_precision.main, [
        '--add-fidelity', '--seeds', '1', '--out', str(out), '--no-progress'])
    res = json.loads((out / 'precision.json').read_text())
    self.assertEqual(res['fidelity']['rows'], 1)
    self.assertEqual(res['fidelity']['loss_equal'], 1)
    self.assertEqual(res['fidelity']['seeds'], [1])
    for row, before in zip(res['rows'], published['rows']):
      if row['seed'] == 1:
        self.assertEqual(row['norm_ratio'], before['norm_ratio'])
        self.assertEqual(row['weight_distance'], before['weight_distance'])
      else:
        self.assertNotIn('norm_ratio', row)
      self.assertEqual(row['final_val_loss'], before['final_val_loss'])
      self.assertEqual(row['step_ms_median'], before['step_ms_median'])
    md = (out / 'precision.md').read_text()
    self.assertIn('| norm ratio | cosine | weight distance |', md)
    self.assertIn('all 1 reruns reproduced the published loss bit for bit',
                  md)
    self.assertIn("The step times are the published runs'", md)
    with self.assertRaisesRegex(ValueError, 'no configurations'):
      study_precision.main(['--add-fidelity', '--configs', 'int4/sr',
                            '--out', str(out), '--no-progress'])
    with self.assertRaisesRegex(ValueError, 'no seeds'):
      study_precision.main(['--add-fidelity', '--seeds', '7',
                            '--out', str(out), '--no-progress'])
    # A second merge adds to the first one's record.
    _quiet(study_precision.main, [
        '--add-fidelity', '--seeds', '0', '--out', str(out), '--no-progress'])
    res = json.loads((out / 'precision.json').read_text())
    self.assertEqual(res['fidelity']['seeds'], [0, 1])
    self.assertEqual(res['fidelity']['rows'], 2)
    self.assertEqual(res['fidelity']['loss_equal'], 2)
    self.assertIn('; python examples/study_precision.py',
                  res['fidelity']['command'])

  def test_study_render_refreshes_a_page_only_when_named(self):
    out = self.dir / 'render'
    out.mkdir()
    (out / 'precision.json').write_text(
        (self.dir / 'results' / 'precision.json').read_text())
    doc = self.doc.read_text()
    _quiet(study_precision.main, ['--render', '--out', str(out)])
    self.assertEqual(self.doc.read_text(), doc)
    self.assertEqual(_docs_status(), self.docs_before)
    for name in ('precision.md', 'precision.png'):
      self.assertTrue((out / name).is_file(), name)

  def test_docs_unchanged(self):
    self.assertEqual(_docs_status(), self.docs_before)

  def test_staleness_merge(self):
    cfg = {'steps': 10, 'b2': 0.999}

    def row(config, seed, loss, period=None, fmt='fp8'):
      return dict(config=config, format=fmt, rounding='stochastic',
                  resets=period is not None, reset_period=period, seed=seed,
                  final_val_loss=loss, final_train_loss=loss,
                  nu_stalled_last_step=None, resets_done=None, state_bytes=1)

    def write(name, seeds, rows, run_config=cfg):
      meta = dict(command=f'run {name}', git_revision='abc', date='d',
                  mode='paper', run_config=run_config, seeds=seeds,
                  reset_fields=['mu', 'nu'], seconds=1.0)
      path = self.dir / f'{name}.json'
      path.write_text(json.dumps(dict(meta=meta, rows=rows)))
      return str(path)

    err = io.StringIO()
    with self.assertRaises(SystemExit), contextlib.redirect_stderr(err):
      study_staleness.main(['--reset-every', '0'])
    self.assertIn('--reset-every must be positive integers', err.getvalue())
    a = write('a', [0], [row('fp32', 0, 1.0, fmt='fp32'),
                         row('fp8/stochastic+resets', 0, 1.5, 320)])
    b = write('b', [0, 1], [
        row('fp32', 0, 9.0, fmt='fp32'),  # repeated: the first file wins
        row('fp32', 1, 2.0, fmt='fp32'),
        row('fp8/stochastic+resets', 0, 1.25, 1000),
        row('fp8/stochastic+resets', 1, 2.75, 1000)])
    out = self.dir / 'staleness'
    _quiet(study_staleness.main,
           ['--merge', a, b, '--name', 'pooled', '--out', str(out)])
    result = json.loads((out / 'pooled.json').read_text())
    summary = {s['config']: s for s in result['summary']}
    self.assertEqual(list(summary), ['fp32', 'fp8/stochastic+resets@320',
                                     'fp8/stochastic+resets@1000'])
    self.assertEqual(summary['fp32']['seeds'], 2)
    self.assertAlmostEqual(summary['fp32']['mean_val_loss'], 1.5)
    self.assertAlmostEqual(summary['fp8/stochastic+resets@1000'][
        'mean_gap_to_fp32'], 0.5)
    self.assertIn('From `b.json`: `run b`', (out / 'pooled.md').read_text())
    self.assertTrue((out / 'pooled.png').is_file())
    c = write('c', [0], [row('fp32', 0, 1.0, fmt='fp32')], {'steps': 20})
    with self.assertRaisesRegex(ValueError, 'run configuration'):
      study_staleness.merge([a, c], out, 'bad')


class ConfigTest(absltest.TestCase):
  """The scripts' shared helpers; nothing here needs ExamplesTest's runs."""

  def test_verdicts(self):
    rows = []
    for seed, base in enumerate((2.00, 2.02, 1.98)):
      rows += [
          dict(config='fp32', seed=seed, final_val_loss=base),
          dict(config='fp8_e4m3/sr', seed=seed, final_val_loss=base + 0.03),
          dict(config='4bit/sr', seed=seed, final_val_loss=base * 1.005),
      ]
    for r in rows:
      r.update(state_bytes=1, state_bits_per_element=1.0,
               quantized_elements=1.0, step_ms_median=1.0)
    summary = {s['config']: s for s in study_precision.summarize(rows)}
    self.assertAlmostEqual(summary['fp32']['fp32_seed_spread'], 0.02)
    # +1.5 % and outside the seed spread: fails the 0.5 % target.
    self.assertFalse(summary['fp8_e4m3/sr']['met'])
    self.assertTrue(summary['4bit/sr']['met'])
    self.assertIsNone(summary['fp32']['met'])

  def test_precision_fidelity_columns_only_with_fidelity(self):
    meta = dict(mode='quick', run_config=dict(
        d_model=8, num_layers=1, steps=4, batch_size=2, seq_len=4,
        learning_rate=1e-3, clip_norm=1.0, weight_decay=0.1, min_size=4096),
                num_params=10, seeds=[0, 1], quantized_elements=1.0,
                command='c', git_revision='r', date='d', wall_s=1.0,
                machine='m', load_average_start='0',
                load_average_end='0')
    rows = []
    for seed in (0, 1):
      rows += [dict(config='fp32', seed=seed, final_val_loss=2.0),
               dict(config='fp8_e4m3/sr', seed=seed, final_val_loss=2.0)]
    for r in rows:
      r.update(state_bytes=1, state_bits_per_element=1.0,
               quantized_elements=1.0, step_ms_median=1.0)
    # Rows without fidelity (results written before it): no columns, no
    # fidelity fields in the summary.
    summary = study_precision.summarize(rows)
    self.assertNotIn('norm_ratio', summary[1])
    md = study_precision.render_markdown(meta, summary)
    self.assertNotIn('norm ratio', md)
    self.assertNotIn('track_fidelity', md)
    # With fidelity: means over the seeds that have it, '-' where none do.
    rows[0].update(norm_ratio=1.0, cosine=1.0, weight_distance=0.0)
    rows[1].update(norm_ratio=1.25, cosine=0.875, weight_distance=0.25)
    rows[3].update(norm_ratio=1.5, cosine=0.625, weight_distance=0.75)
    summary = study_precision.summarize(rows)
    self.assertEqual((summary[1]['norm_ratio'], summary[1]['cosine'],
                      summary[1]['weight_distance']), (1.375, 0.75, 0.5))
    md = study_precision.render_markdown(meta, summary)
    self.assertIn('| rel. gap | norm ratio | cosine | weight distance |',
                  md)
    self.assertIn('| +0.00% | 1.375 | 0.750 | 0.500 |', md)
    summary[0].pop('norm_ratio')
    md = study_precision.render_markdown(meta, summary)
    self.assertIn('| — | — | - | 1.000 | 0.000 |', md)

  def test_tracked_optimizer_is_cached_and_exact(self):
    cfg = _common.RunConfig(steps=3, min_size=0)
    rn, sr = _common.parse_config('fp8_e4m3/rn'), _common.parse_config(
        'fp8_e4m3/sr')
    # The same object for runs that share the inner transform (train.train
    # compiles its step once per transform object).
    self.assertIs(_common.make_tracked_optimizer(rn, cfg, 0),
                  _common.make_tracked_optimizer(rn, cfg, 1))
    self.assertIs(_common.make_tracked_optimizer(sr, cfg, 1),
                  _common.make_tracked_optimizer(sr, cfg, 1))
    tx = _common.make_tracked_optimizer(rn, cfg, 0)
    inner = _common.make_optimizer(rn, cfg, 0)
    params = {'w': jnp.linspace(-1.0, 1.0, 8192).reshape(64, 128)}
    grads = jax.tree.map(lambda p: 0.1 * p, params)
    state = jax.jit(tx.init)(params)
    self.assertEqual(
        optax_q.state_nbytes(_common.inner_state(state)),
        optax_q.state_nbytes(inner.init(params)))
    updates, state = jax.jit(tx.update)(grads, state, params)
    expected, _ = jax.jit(inner.update)(grads, inner.init(params), params)
    np.testing.assert_array_equal(updates['w'], expected['w'])
    fields = _common.fidelity_fields(state)
    self.assertEqual(sorted(fields),
                     ['cosine', 'norm_ratio', 'weight_distance'])
    self.assertGreater(fields['cosine'], 0.9)

  def test_parse_config(self):
    self.assertEqual(_common.parse_config('fp32'), _common.FP32)
    four = _common.parse_config('4bit/sr')
    self.assertEqual((four.mu_format, four.nu_format, four.rounding),
                     (*_common.FOUR_BIT, 'stochastic'))
    mixed = _common.parse_config('int4+fp4_e2m2u/rn')
    self.assertEqual((mixed.nu_format, mixed.rounding),
                     ('fp4_e2m2u', 'nearest'))
    with self.assertRaises(ValueError):
      _common.parse_config('int4/xx')

  def test_mixed_rounding_config(self):
    mix = _common.parse_config('fp8_e4m3/mix')
    self.assertEqual((mix.name, mix.rounding), ('fp8_e4m3/mix', 'hybrid'))
    tx = _common.make_optimizer(mix, _common.RunConfig(), seed=1)
    params = {'w': jnp.ones((64, 128)), 'b': jnp.ones((64,))}
    state = jax.jit(tx.init)(params)  # Compiled: op by op takes seconds.
    grads = jax.tree.map(lambda p: 0.1 * p, params)
    _, state = jax.jit(tx.update)(grads, state, params)
    leaves = optax_q.quantized_leaves(state)
    self.assertLen(leaves, 2)  # mu and nu of 'w'

  def test_staleness_reset_period_override(self):
    cfg = study_staleness.MODES['paper']
    params = {'w': jnp.ones((64, 128)), 'b': jnp.ones((64,))}
    grads = jax.tree.map(lambda p: 0.1 * p, params)
    # Default: K* of the second moment's format at the run's b2.
    _, period = study_staleness.make_optimizer(
        'fp8', 'stochastic', True, cfg, seed=0)
    self.assertEqual(period, optax_q.reset_period('fp8_e4m3', b2=cfg.b2))
    _, period = study_staleness.make_optimizer(
        'fp8', 'stochastic', True, cfg, seed=0, reset_every=1000)
    self.assertEqual(period, 1000)
    # Float32 moments with resets: after `period` steps both moments are
    # zero again, as Table 5's FP32 column needs.
    with self.assertWarnsRegex(UserWarning, 'float32 moments'):
      tx, period = study_staleness.make_optimizer(
          'fp32', None, True, cfg, seed=0, reset_every=2)
    self.assertEqual(period, 2)
    state = tx.init(params)
    for _ in range(2):
      _, state = tx.update(grads, state, params)
    mus = [x for x in jax.tree.leaves(state) if getattr(x, 'shape', None)
           == (64, 128)]
    self.assertNotEmpty(mus)
    for x in mus:
      self.assertEqual(float(jnp.abs(x).max()), 0.0)

  @pytest.mark.slow  # Half a minute: the study's smoke run.
  def test_update_error_sees_the_zero_second_moment(self):
    import optax  # pylint: disable=g-import-not-at-top
    g = jax.random.normal(jax.random.key(0), (32, 256))
    g = g.at[:, ::16].multiply(1e-5)  # tiny coordinates next to large ones
    adam = optax.ScaleByAdamState(
        count=jnp.asarray(100, jnp.int32), mu={'w': 0.1 * g},
        nu={'w': 1e-3 * g * g})
    cfg = _common.RunConfig(min_size=0)
    rows = {(r['mu_format'], r['rounding'], r['positive_floor']): r
            for floor in (True, False)
            for r in update_error.measure(adam, cfg, floor=floor,
                                          block_size=128)}
    with_floor = rows[('fp8_e4m3', 'nearest', True)]
    without = rows[('fp8_e4m3', 'nearest', False)]
    self.assertEqual(with_floor['nu_zero_fraction'], 0.0)
    self.assertGreater(without['nu_zero_fraction'], 0.05)
    # The grid cannot hold both magnitudes of a block: with the floor the
    # tiny coordinates' updates come out too small (bounded error), without
    # it they blow up.
    self.assertEqual(with_floor['blown_up_fraction'], 0.0)
    self.assertLess(with_floor['relative_error'], 0.5)
    self.assertGreater(without['blown_up_fraction'], 0.01)
    self.assertGreater(without['relative_error'], 100.0)


class DefaultOutTest(absltest.TestCase):

  def test_every_script_writes_under_runs_by_default(self):
    for script in SCRIPTS:
      name = pathlib.Path(script.__file__).stem
      with self.subTest(name):
        args = script.make_parser().parse_args([])
        self.assertEqual(pathlib.Path(args.out).resolve(),
                         _ROOT / 'runs' / name)

  def test_no_page_is_refreshed_by_default(self):
    self.assertFalse(study_precision.make_parser().parse_args([]).doc)


class StalenessRenderTest(_DocsUnchanged):

  def test_published_page_is_its_json_rendered(self):
    # The committed page is what --render writes from the committed JSON,
    # the committed plots embedded.
    results = _ROOT / 'docs' / 'results'
    for name in ('staleness_sim.json', 'staleness_sim_tracking.png',
                 'staleness_sim_stalls.png'):
      shutil.copy(results / name, self.out / name)
    _quiet(staleness_simulation.main, ['--render', '--out', str(self.out)])
    self.assert_wrote('staleness_sim.md')
    self.assertEqual((self.out / 'staleness_sim.md').read_text(),
                     (results / 'staleness_sim.md').read_text())
    self.assertIn('![Stored v over time](staleness_sim_tracking.png)',
                  (self.out / 'staleness_sim.md').read_text())


class PrecisionRenderTest(_DocsUnchanged):

  def test_published_pages_are_their_json_rendered(self):
    # Results written before the fidelity columns render as published.
    results = _ROOT / 'docs' / 'results'
    for path in sorted(results.glob('precision*.json')):
      with self.subTest(path.name):
        shutil.copy(path, self.out / path.name)
        _quiet(study_precision.main, ['--render', '--out', str(self.out),
                                      '--name', path.stem])
        self.assertEqual((self.out / f'{path.stem}.md').read_text(),
                         (results / f'{path.stem}.md').read_text())
    self.assertEqual(_docs_status(), self.docs_before)


class StudyLowbitTest(_DocsUnchanged):

  @pytest.mark.slow  # 45 s: the teacher-student runs and the merge.
  def test_writes_its_files_recommends_and_merges(self):
    common = ['--seeds', '0', '--steps', '3', '--codec-shape', '4', '256',
              '--no-peers', '--out', str(self.out)]
    result, _ = _quiet(study_lowbit.main, common + [
        '--only', 'nf4 + ue4m0', 'nf3 + int3_mulaw'])
    self.assert_wrote('lowbit.json', 'lowbit.md', 'lowbit.png')
    rows = {s['config']: s for s in result['summary']}
    self.assertEqual(rows['nf3 + int3_mulaw']['bits'], 3.25)
    # Fidelity beside the loss: float32 is its own twin.
    self.assertEqual((rows['fp32']['norm_ratio'], rows['fp32']['cosine']),
                     (1.0, 1.0))
    self.assertLess(rows['nf4 + ue4m0']['cosine'], 1.0)
    self.assertNotIn('recommended_4bit', result)  # study_fidelity's now.
    json.loads((self.out / 'lowbit.json').read_text())  # Strict JSON.
    # --merge: new rows in place, the others kept with their command.
    result, _ = _quiet(study_lowbit.main, common + [
        '--merge', '--only', 'fp8_e4m3_dre', 'nf4 + ue4m0, rank-1 nu'])
    self.assertEqual([r['config'] for r in result['rows']],
                     ['fp32', 'nf4 + ue4m0', 'nf3 + int3_mulaw',
                      'fp8_e4m3_dre', 'nf4 + ue4m0, rank-1 nu'])
    self.assertEqual(result['rows'][4]['scale_mode'], {'nu': 'rank1'})
    self.assertLen(result['meta']['earlier'], 1)
    self.assertIn('Rows of the other configurations',
                  (self.out / 'lowbit.md').read_text())
    for bad in (['--merge'], ['--only', 'no such config']):
      with self.assertRaises(SystemExit):
        _quiet(study_lowbit.main, common + bad)

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'lowbit.json', self.out / 'lowbit.json')
    _quiet(study_lowbit.main, ['--render', '--out', str(self.out)])
    self.assert_wrote('lowbit.md', 'lowbit.png')
    self.assertEqual((self.out / 'lowbit.md').read_text(),
                     (results / 'lowbit.md').read_text())


class StudyFidelityTest(_DocsUnchanged):

  @pytest.mark.slow  # A minute: every problem, two states, compiled once.
  def test_writes_its_files_and_recommends(self):
    result, _ = _quiet(study_fidelity.main, [
        '--steps', '4', '--seeds', '0', '--multipliers', '0.5', '1', '2',
        '--configs', 'nf4 + int4_mulaw, preconditioner',
        'nf3 + int3_mulaw@sqrt', 'nf4 + ue4m0', '--out', str(self.out)])
    self.assert_wrote('fidelity.json', 'fidelity.md', 'fidelity.png')
    json.loads((self.out / 'fidelity.json').read_text())  # Strict JSON.
    self.assertEqual({s['problem'] for s in result['summary']},
                     {'teacher_student', 'digits', 'lm'})
    self.assertEqual(result['recommended_4bit']['bits'], 4.25)
    self.assertEqual(result['recommended_3bit']['bits'], 3.25)
    with self.assertRaises(SystemExit):
      _quiet(study_fidelity.main, ['--configs', 'no such state',
                                   '--out', str(self.out)])

  def test_window(self):
    # Within 2x of the best (1.0 at x1): x0.5 at 1.5 and the edges
    # interpolated in log-log between the multipliers.
    best, loss, width, low, high = study_fidelity.window(
        {0.25: 8.0, 0.5: 1.5, 1.0: 1.0, 2.0: 4.0})
    self.assertEqual((best, loss), (1.0, 1.0))
    self.assertAlmostEqual(high, 2 ** 0.5)
    f = (np.log(2.0) - np.log(1.5)) / (np.log(8.0) - np.log(1.5))
    self.assertAlmostEqual(low, 2.0 ** (-1 - f))
    self.assertAlmostEqual(width, 0.5 + 1 + f)

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'fidelity.json', self.out / 'fidelity.json')
    _quiet(study_fidelity.main, ['--render', '--out', str(self.out)])
    self.assert_wrote('fidelity.md', 'fidelity.png')
    self.assertEqual((self.out / 'fidelity.md').read_text(),
                     (results / 'fidelity.md').read_text())
    published = json.loads((results / 'fidelity.json').read_text())
    for key in ('recommended_4bit', 'recommended_3bit'):
      kwargs = published[key]['adamw_kwargs']
      optax_q.adamw(1e-3, **kwargs)  # The exact keyword arguments.


class StudyBitsTest(_DocsUnchanged):

  @pytest.mark.slow  # A minute: two runs and three compiled benchmarks.
  def test_writes_its_files(self):
    result, text = _quiet(study_bits.main, [
        '--steps', '4', '--seeds', '0', '--tasks', 'lm', '--configs', 'fp32',
        'adaptive', '--overhead-reps', '2', '--no-progress',
        '--out', str(self.out)])
    self.assert_wrote('bits.json', 'bits.md', 'bits_lm_adaptive.png')
    saved = json.loads((self.out / 'bits.json').read_text())
    rows = {r['config']: r for r in saved['rows']}
    self.assertEqual(rows['fp32']['bits_mean'], 32.0)
    self.assertLess(rows['adaptive']['bits_final_quantized'], 8.3)
    self.assertGreaterEqual(rows['adaptive']['compiled_steps'], 1)
    # Fidelity to the float32 twin (on by default); fp32 is its own twin.
    self.assertEqual(rows['fp32']['cosine'], 1.0)
    self.assertGreater(rows['adaptive']['cosine'], 0.0)
    self.assertGreater(rows['adaptive']['norm_ratio'], 0.0)
    self.assertIn('| rel. gap | norm ratio | cosine | weight distance |',
                  text)
    self.assertIn('adaptive', saved['overhead']['overhead'])
    self.assertIn('python examples/study_bits.py', saved['command'])
    self.assertIn('| lm | `adaptive` |', text)
    md, _ = _quiet(study_bits.main, ['--render', '--out', str(self.out)])
    self.assertIn('| lm | `adaptive` |', md)
    self.assertIn('re-rendered with', md)


class StudyEcoTest(_DocsUnchanged):

  @pytest.mark.slow  # A minute: three configurations compiled.
  def test_writes_its_files_and_measures_real_bytes(self):
    names = ['fp32', 'fp8 naive rn', 'fp8 ECO sr + m8/v4']
    result, text = _quiet(study_eco.main, [
        *TINY, '--seeds', '0', '--configs', *names, '--out', str(self.out)])
    self.assert_wrote('eco.json', 'eco.md', 'eco.png')
    saved = json.loads((self.out / 'eco.json').read_text())
    summary = {s['config']: s for s in saved['summary']}
    self.assertEqual(list(summary), names)
    self.assertAlmostEqual(summary['fp32']['bytes_per_param'], 12.0,
                           delta=0.05)
    self.assertLess(summary['fp8 ECO sr + m8/v4']['bytes_per_param'], 4.0)
    self.assertGreater(
        summary['fp8 ECO sr + m8/v4']['quantized_weight_fraction'], 0.5)
    self.assertIn('python examples/study_eco.py', saved['meta']['command'])
    self.assertIn('fp8 ECO sr + m8/v4', text)
    md, _ = _quiet(study_eco.main, ['--render', '--out', str(self.out)])
    self.assertEqual(md, (self.out / 'eco.md').read_text())
    # Fidelity to the float32 twin, by default; fp32 is its own.
    self.assertEqual([summary['fp32'][k] for k in _common.FIDELITY],
                     [1.0, 1.0, 0.0])
    self.assertLess(summary['fp8 naive rn']['cosine'], 1.0)
    self.assertIn('| norm ratio |', md)
    # Fidelity added to a result by reruns: the same losses, bit for bit.
    _quiet(study_eco.main, ['--add-fidelity', '--seeds', '0',
                            '--out', str(self.out)])
    again = json.loads((self.out / 'eco.json').read_text())
    record = again['meta']['fidelity']
    self.assertEqual((record['rows'], record['loss_equal']), (2, 2))
    self.assertEqual(again['summary'], saved['summary'])

  def test_published_pages_are_their_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    for name in ('eco', 'eco_first_moment', 'eco_long'):
      shutil.copy(results / f'{name}.json', self.out / f'{name}.json')
      md, _ = _quiet(study_eco.main, ['--render', '--name', name,
                                      '--out', str(self.out)])
      self.assertEqual(md, (results / f'{name}.md').read_text(), name)


class StudyFpConvergenceTest(_DocsUnchanged):

  @pytest.mark.slow  # About 20 s; the published page's render stays fast.
  def test_sweep_writes_its_files(self):
    md, text = _quiet(study_fp_convergence.main, [
        '--mode', 'smoke', '--sections', 'rosenbrock',
        '--out', str(self.out)])
    self.assert_wrote('fp_convergence.json', 'fp_convergence.md',
                      'fp_convergence_rosenbrock.png')
    saved = json.loads((self.out / 'fp_convergence.json').read_text())
    components = {(r['optimizer'], r['component']) for r in saved['rows']
                  if r['problem'] == 'rosenbrock'}
    self.assertIn(('adam', 'v'), components)
    self.assertIn(('muon', 'all'), components)
    self.assertNotIn(('muon', 'v'), components)  # No second moment there.
    self.assertIn('python examples/study_fp_convergence.py',
                  saved['meta']['command'])
    self.assertIn('needed_mantissa_all', text)
    again, _ = _quiet(study_fp_convergence.main,
                      ['--render', '--out', str(self.out)])
    self.assertEqual(again, md)

  @pytest.mark.slow  # Two minutes: every section compiled.
  def test_every_section(self):
    _quiet(study_fp_convergence.main, ['--mode', 'smoke',
                                       '--out', str(self.out)])
    saved = json.loads((self.out / 'fp_convergence.json').read_text())
    muon8 = saved['claims']['muon8']
    # The smoke model's small leaves stay float32 (min_size): fewer bits
    # in 8 and in 4 than in float32, not 8 and 4 themselves.
    self.assertEqual(muon8['muon fp32']['bits'], 32.0)
    self.assertLess(muon8['muon 8-bit']['bits'], 32.0)
    self.assertLess(muon8['muon 4-bit']['bits'], muon8['muon 8-bit']['bits'])
    self.assertEqual({r['problem'] for r in saved['rows']},
                     {'rosenbrock', 'mlp', 'gpt', 'scaling', 'muon8'})
    self.assertIn('adam all', saved['claims']['scaling'])
    # --update replaces one section's rows and records both runs.
    _quiet(study_fp_convergence.main, ['--mode', 'smoke', '--update',
                                       '--sections', 'mlp',
                                       '--out', str(self.out)])
    updated = json.loads((self.out / 'fp_convergence.json').read_text())
    self.assertLen(updated['meta']['runs'], 2)
    self.assertEqual(len(updated['rows']), len(saved['rows']))

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'fp_convergence.json',
                self.out / 'fp_convergence.json')
    md, _ = _quiet(study_fp_convergence.main,
                   ['--render', '--out', str(self.out)])
    self.assertEqual(md, (results / 'fp_convergence.md').read_text())


class StudySecondOrderTest(_DocsUnchanged):

  @pytest.mark.slow  # A minute: three optimizers compiled.
  def test_smoke_writes_its_files(self):
    configs = ['adamw fp32', 'soap fp8+resets', 'shampoo 4-bit']
    md, _ = _quiet(study_second_order.main, [
        '--mode', 'smoke', '--configs', *configs, '--out', str(self.out)])
    self.assert_wrote('second_order.json', 'second_order.md',
                      'second_order.png')
    saved = json.loads((self.out / 'second_order.json').read_text())
    self.assertEqual([s['config'] for s in saved['summary']],
                     ['adamw fp32', 'shampoo 4-bit', 'soap fp8+resets'])
    self.assertAlmostEqual(saved['summary'][0]['bytes_per_param'], 8.0, 2)
    self.assertIn('python examples/study_second_order.py',
                  saved['meta']['command'])
    self.assertIn('| soap fp8+resets |', md)
    self.assertIn('| norm ratio | cosine | weight distance |', md)
    self.assertEqual(saved['rows'][0]['cosine'], 1.0)  # Its own twin.
    self.assertLess(saved['rows'][1]['cosine'], 1.0)
    again, _ = _quiet(study_second_order.main,
                      ['--render', '--out', str(self.out)])
    self.assertEqual(again, md)
    # --add-fidelity reruns a seed of the written result beside the twin:
    # the same losses, the rest of the result kept.
    md, _ = _quiet(study_second_order.main, [
        '--add-fidelity', '--seeds', '0', '--configs', 'shampoo 4-bit',
        '--out', str(self.out)])
    added = json.loads((self.out / 'second_order.json').read_text())
    record = added['meta'].pop('fidelity')
    self.assertEqual((record['rows'], record['loss_equal']), (1, 1))
    self.assertEqual(added, saved)
    self.assertIn('all 1 reruns reproduced the published loss', md)

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'second_order.json', self.out / 'second_order.json')
    md, _ = _quiet(study_second_order.main,
                   ['--render', '--out', str(self.out)])
    self.assert_wrote('second_order.png')
    self.assertEqual(md, (results / 'second_order.md').read_text())


class StudyOptimizersQuantizationTest(_DocsUnchanged):

  @pytest.mark.slow  # About a minute: eight models trained and quantized.
  def test_smoke_writes_its_files(self):
    md, _ = _quiet(study_optimizers_quantization.main, [
        '--mode', 'smoke', '--optimizers', 'adamw', 'muon',
        '--out', str(self.out)])
    self.assert_wrote('optimizers_quantization.json',
                      'optimizers_quantization.md',
                      'optimizers_quantization.png')
    saved = json.loads(
        (self.out / 'optimizers_quantization.json').read_text())
    self.assertEqual(
        [(t['optimizer'], t['width']) for t in saved['table']],
        [('adamw', 32), ('muon', 32), ('adamw', 48), ('muon', 48)])
    for t in saved['table']:
      self.assertIsNotNone(t['qat_delta'])
      self.assertIsNotNone(t['cl_ptq_delta'])
    self.assertIn('python examples/study_optimizers_quantization.py',
                  saved['meta']['command'])
    self.assertIn('muon degrades most under PTQ', saved['claims'])
    self.assertIn('| muon | 48 |', md)
    again, _ = _quiet(study_optimizers_quantization.main,
                      ['--render', '--out', str(self.out)])
    self.assertEqual(again, md)

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'optimizers_quantization.json',
                self.out / 'optimizers_quantization.json')
    md, _ = _quiet(study_optimizers_quantization.main,
                   ['--render', '--out', str(self.out)])
    self.assertEqual(md, (results / 'optimizers_quantization.md').read_text())


class ProfileStepTest(_DocsUnchanged):

  # About 10 s: four sections of compiled steps. The published page's render
  # below stays in the default suite.
  @pytest.mark.slow
  def test_quick_profile_prints_and_writes_every_section(self):
    path, text = _quiet(profile_step.main, [
        '--quick', '--formats', 'fp8_e4m3', '--out', str(self.out)])
    for title in ('1. Params only', '2. Codecs alone', '3. Tile size',
                  '4. Stall telemetry'):
      self.assertIn(title, text)
    self.assertIn('| fp8_e4m3, tile_size=2^18 |', text)
    self.assertIn('| optax_q fp8_e4m3 stochastic, track_stalls=True |', text)
    self.assert_wrote('profile_step_quick.md', 'profile_step_quick.json',
                      'profile_step_quick.png')
    self.assertEqual(pathlib.Path(path), self.out / 'profile_step_quick.md')
    written = pathlib.Path(path).read_text()
    self.assertIn('### 4. Stall telemetry', written)
    self.assertIn(written, text)
    saved = json.loads((self.out / 'profile_step_quick.json').read_text())
    self.assertIn('python examples/profile_step.py --quick', saved['command'])
    self.assertIn('Command: `python examples/profile_step.py --quick',
                  written)
    _quiet(profile_step.main, ['--quick', '--render', '--out', str(self.out)])
    self.assertEqual(pathlib.Path(path).read_text(), written)

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'profile_step.json', self.out / 'profile_step.json')
    _quiet(profile_step.main, ['--render', '--out', str(self.out)])
    self.assert_wrote('profile_step.md', 'profile_step.png')
    self.assertEqual((self.out / 'profile_step.md').read_text(),
                     (results / 'profile_step.md').read_text())


class BenchStepTest(_DocsUnchanged):

  def test_quick_bench_writes_its_files(self):
    result, _ = _quiet(bench_step.main, [
        '--quick', '--no-peers', '--only', 'optax_q fp8_e4m3 nearest',
        '--steps', '2', '--rounds', '1', '--warmup', '1',
        '--out', str(self.out)])
    self.assert_wrote('bench_step_quick.json', 'bench_step_quick.md',
                      'bench_step_quick.png')
    self.assertEqual(
        [r['config'] for r in result['rows']],
        [bench_step.BASELINE, 'optax_q fp8_e4m3 nearest'])
    written = json.loads((self.out / 'bench_step_quick.json').read_text())
    self.assertEqual(written['mode'], 'quick')
    self.assertIn('| optax_q fp8_e4m3 nearest |',
                  (self.out / 'bench_step_quick.md').read_text())

  def test_published_pages_are_their_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    for name in ('bench_step', 'bench_step_layouts', 'bench_step_lowbit'):
      shutil.copy(results / f'{name}.json', self.out / f'{name}.json')
      _quiet(bench_step.main, ['--render', '--name', name,
                               '--out', str(self.out)])
      self.assert_wrote(f'{name}.md', f'{name}.png')
      self.assertEqual((self.out / f'{name}.md').read_text(),
                       (results / f'{name}.md').read_text(), name)


class RooflineTest(_DocsUnchanged):

  def test_writes_its_files_and_counts_the_real_layout(self):
    result, _ = _quiet(roofline.main, ['--d', '256', '--layers', '1',
                                       '--out', str(self.out)])
    self.assert_wrote('roofline.json', 'roofline.md')
    rows = {r['config']: r for r in result['rows']}
    fp32 = rows['optax.adamw fp32']
    # Two float32 moments (and a step count, shared by the tree).
    self.assertAlmostEqual(fp32['state_bytes_per_param'], 8.0, places=3)
    self.assertAlmostEqual(fp32['moved_bytes_per_param'], 4 + 8 + 16,
                           places=2)
    # Two one-byte codes and a float32 scale per block of 128 (and the
    # vectors' block padding): a little over 2 bytes.
    int8 = rows['optax_q int8_dynamic']['state_bytes_per_param']
    self.assertGreater(int8, 2.0)
    self.assertLess(int8, 2.2)
    four = rows['optax_q nf4/ue4m0']['state_bytes_per_param']
    self.assertLess(four, int8 / 1.8)
    h100 = 'H100 (3.0 TB/s copy)'
    self.assertAlmostEqual(fp32['ms_per_billion'][h100],
                           fp32['moved_bytes_per_param'] / 3.0, places=2)

  def test_bad_sizes_and_budgets_are_refused(self):
    for argv in (['--d', '0'], ['--layers', '-1']):
      with self.assertRaises(SystemExit):
        _quiet(roofline.main, argv + ['--out', str(self.out)])
    for budget in ('-1', 'nan'):
      with self.assertRaises(SystemExit):
        _quiet(bench_step.main, ['--quick', '--max-setup-seconds', budget,
                                 '--out', str(self.out)])
    self.assertEqual(list(self.out.iterdir()), [])

  def test_published_page_is_its_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    shutil.copy(results / 'roofline.json', self.out / 'roofline.json')
    _quiet(roofline.main, ['--render', '--out', str(self.out)])
    self.assertEqual((self.out / 'roofline.md').read_text(),
                     (results / 'roofline.md').read_text())


class UpdateErrorRenderTest(_DocsUnchanged):

  def test_published_pages_are_their_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    for name in ('update_error', 'update_error_no_floor'):
      shutil.copy(results / f'{name}.json', self.out / f'{name}.json')
    _quiet(update_error.main, ['--render', '--out', str(self.out)])
    _quiet(update_error.main, ['--render', '--name', 'update_error_no_floor',
                               '--compare', 'update_error',
                               '--out', str(self.out)])
    for name in ('update_error', 'update_error_no_floor'):
      self.assert_wrote(f'{name}.md', f'{name}.png')
      self.assertEqual((self.out / f'{name}.md').read_text(),
                       (results / f'{name}.md').read_text(), name)


class StudyStalenessRenderTest(_DocsUnchanged):

  def test_published_pages_are_their_json_rendered(self):
    results = _ROOT / 'docs' / 'results'
    names = [p.stem for p in sorted(results.glob('staleness*.json'))
             if p.stem != 'staleness_sim']  # staleness_simulation.py's.
    self.assertIn('staleness_paper_pooled', names)
    for name in names:
      shutil.copy(results / f'{name}.json', self.out / f'{name}.json')
      _quiet(study_staleness.main, ['--render', '--name', name,
                                    '--out', str(self.out)])
      self.assert_wrote(f'{name}.md', f'{name}.png')
      self.assertEqual((self.out / f'{name}.md').read_text(),
                       (results / f'{name}.md').read_text(), name)


@pytest.mark.slow
class SlowScriptsTest(_DocsUnchanged):
  """Each about half a minute or more on two CPU cores."""

  def test_staleness_simulation_writes_its_files(self):
    _quiet(staleness_simulation.main, [
        '--quick', '--dim', '256', '--steps', '20', '--extra-b2',
        '--out', str(self.out)])
    self.assert_wrote('staleness_sim.json', 'staleness_sim.md',
                      'staleness_sim_tracking.png', 'staleness_sim_stalls.png')

  def test_study_staleness_writes_its_files(self):
    _quiet(study_staleness.main, [
        '--steps', '2', '--seeds', '0', '--formats', 'fp8', '--variants',
        'nearest', '--name', 'tiny', '--out', str(self.out)])
    self.assert_wrote('tiny.json', 'tiny.md', 'tiny.png')
    rows = json.loads((self.out / 'tiny.json').read_text())['rows']
    self.assertEqual([r['config'] for r in rows], ['fp32', 'fp8/nearest'])

  def test_scale_calibration_writes_its_files(self):
    result = _quiet(scale_calibration.main, [
        '--steps', '3', '--seeds', '0', '--formats', 'nf4', '--out',
        str(self.out)])[0]
    self.assert_wrote('scale_calibration.json', 'scale_calibration.md')
    self.assertLen(result['summary'], 4)  # 2 roundings, with and without.
    for row in result['rows']:
      self.assertGreater(row['cosine'], 0.0)

  def test_update_error_writes_its_files(self):
    # One format pair: measuring all of them takes minutes.
    with mock.patch.object(update_error, 'PAIRS',
                           (('fp8_e4m3', 'fp8_e4m3'),)):
      rows, _ = _quiet(update_error.main,
                       ['--steps', '2', '--out', str(self.out)])
    self.assert_wrote('update_error.json', 'update_error.md',
                      'update_error.png')
    self.assertLen(rows, 2)  # nearest, stochastic



class GpuProfileTest(_DocsUnchanged):
  """``gpu_check.py --profile`` runs anywhere (its kernel times are a GPU's:
  none here) and writes its record."""

  def test_writes_its_record(self):
    rows = 'optax.adamw fp32;optax_q int8_dynamic nearest'
    _quiet(gpu_check.main, ['--profile', '--d', '128', '--layers', '1',
                            '--rows', rows, '--revision', 'abc1234',
                            '--out', str(self.out)])
    self.assert_wrote('gpu_profile.json')
    record = json.loads((self.out / 'gpu_profile.json').read_text())
    self.assertEqual(record['git_revision'], 'abc1234')
    self.assertIn('--profile', record['command'])
    self.assertEqual([r['row'] for r in record['rows']], rows.split(';'))
    for row in record['rows']:
      self.assertGreater(row['step_ms_median'], 0)
      self.assertGreater(row['fusions_in_program'], 0)
      self.assertEqual(row['reduction_kernel_moment_outputs'], 0)

  def test_unknown_rows_are_refused(self):
    with self.assertRaisesRegex(SystemExit, 'unknown rows'):
      _quiet(gpu_check.main, ['--profile', '--rows', 'optax.adamw fp64',
                              '--out', str(self.out)])
    self.assertEqual(list(self.out.iterdir()), [])


if __name__ == '__main__':
  absltest.main()
