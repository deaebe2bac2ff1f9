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
"""Dynamic bit-widths against fixed 8-bit, fixed 4-bit and float32 states.

Trains the precision study's byte-level GPT and a small ViT on the digits
data with AdamW whose moments are stored in float32, fixed 8-bit
(``int8_dynamic``), fixed 4-bit (``nf4`` + ``ue4m0``) or formats chosen per
leaf as training goes (``optax_q.adaptive_bits``), 3 seeds each, and
writes ``bits.json``, ``bits.md`` and the bit-width-by-layer plots
(``bits_<task>.png``, as Fig. 6 of the STQuant paper) to ``--out``.

Bits per state element are measured on the real buffers (codes and scales;
``optax_q.state_bits_per_element``), averaged over the steps of the run
(each layout weighted by the steps it was held) and at the end. The
statistics' step-time overhead is timed on the same formats held fixed, in
one interleaved run.

Beside the loss, every run that is not float32 reports its fidelity to the
study's float32 AdamW of the same chain, fed the same gradients and params
(``optax_q.track_fidelity``, off with ``--no-fidelity``): the update-norm
ratio and cosine (medians over the steps) and the final weight distance.
``--add-fidelity`` adds them to a published result from reruns of some of
its seeds, with the settings recorded in its JSON.

  python examples/study_bits.py                          # quick, minutes
  python examples/study_bits.py --mode full --out docs/results
  python examples/study_bits.py --add-fidelity --seeds 0 --out docs/results
"""

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import statistics
import time

import _common  # pylint: disable=g-bad-import-order

import jax
import numpy as np
import optax

import optax_q
from models import data
from models import sharding as model_sharding
from models import train
from models import vit

# The path of an adapted leaf below its AdaptiveBitsState in bit_layout.
SEGMENT = 'inner_state/inner_state/'

NAME = 'bits'

# Ladders. 'adaptive': the library's defaults (3.25, 4.25 and 8.25 bits);
# 'adaptive_pow2': the same codes with power-of-two scales (3.06, 4.06,
# 8.06 bits), for the 4-bit goal; 'adaptive_16': the defaults with a 16-bit
# rung (bf16) on top.
POW2 = {
    'mu': (('nf3', 'block_pow2'), ('nf4', 'block_pow2'),
           ('int8_dynamic', 'block_pow2')),
    'nu': (('int3_mulaw', 'block_pow2'), ('ue4m0', 'block_pow2'),
           ('int8_dynamic', 'block_pow2')),
}
WITH_16 = {
    'mu': ('nf3', 'nf4', 'int8_dynamic', 'bf16'),
    'nu': ('int3_mulaw', 'ue4m0', 'int8_dynamic', 'bf16'),
}
CONFIGS = ('fp32', 'int8', '4bit', 'adaptive', 'adaptive_pow2',
           'adaptive_16')
FIXED = {
    'fp32': _common.FP32,
    'int8': _common.opt_config('int8_dynamic', name='int8'),
    '4bit': _common.opt_config('nf4', 'ue4m0', name='4bit'),
}


@dataclasses.dataclass(frozen=True)
class Mode:
  lm: _common.RunConfig
  vit_steps: int
  period: int


MODES = {
    'quick': Mode(
        lm=_common.RunConfig(
            d_model=64, num_layers=1, num_heads=4, seq_len=64, batch_size=16,
            steps=200, learning_rate=3e-3, warmup_steps=20, eval_every=50,
            eval_batches=16),
        vit_steps=200, period=10),
    'full': Mode(
        lm=_common.RunConfig(
            d_model=128, num_layers=2, num_heads=4, seq_len=64, batch_size=16,
            steps=1000, learning_rate=3e-3, warmup_steps=100, eval_every=200,
            eval_batches=32),
        vit_steps=1000, period=25),
}
VIT = dict(d_model=64, num_layers=2, num_heads=4)
VIT_BATCH = 64
VIT_LR = 1e-3

TARGETS = dict(bits_paper=5.1, bits_goal=4.0, rel_gap=0.005,
               overhead=0.05)


# ----------------------------------------------------------------------------
# Optimizers.
# ----------------------------------------------------------------------------


def adaptive_kwargs(config: str, cfg: _common.RunConfig, period: int,
                    steps: int) -> dict:
  """The ``adaptive_bits`` arguments of an adaptive configuration."""
  kwargs = dict(period=period, patience=2, anneal=1.0, anneal_steps=steps,
                min_size=cfg.min_size, block_size=cfg.block_size,
                elementwise=True)
  if config == 'adaptive_pow2':
    kwargs.update(candidates=POW2)
  elif config == 'adaptive_16':
    kwargs.update(candidates=WITH_16)
  return kwargs


@functools.lru_cache(maxsize=64)
def make_tx(config: str, cfg: _common.RunConfig, lr: float, steps: int,
            warmup: int, period: int, seed: int):
  """Clipping, then AdamW with its moments stored as ``config`` says."""
  if config in FIXED:
    cfg = dataclasses.replace(cfg, learning_rate=lr, steps=steps,
                              warmup_steps=warmup)
    return _common.make_optimizer(FIXED[config], cfg, seed)
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, lr, warmup, steps, lr * cfg.final_lr_fraction)
  adam = optax_q.adaptive_bits(
      optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps), seed=seed,
      **adaptive_kwargs(config, cfg, period, steps))
  return optax.chain(
      optax.clip_by_global_norm(cfg.clip_norm), adam,
      optax.add_decayed_weights(cfg.weight_decay,
                                lambda p: jax.tree.map(lambda x: x.ndim >= 2,
                                                       p)),
      optax.scale_by_learning_rate(schedule))


# ----------------------------------------------------------------------------
# Runs.
# ----------------------------------------------------------------------------


class Recorder:
  """Relayouts between steps and the bits they leave, step by step.

  The bits are those of the optimizer's own state: a float32 twin's
  (``track_fidelity``) is left out.
  """

  def __init__(self, initial_state):
    self.events = [self._snapshot(0, initial_state)]

  @staticmethod
  def _snapshot(step, state):
    state = _common.inner_state(state)
    return dict(
        step=step,
        bits=optax_q.state_bits_per_element(state),
        bits_quantized=optax_q.state_bits_per_element(
            state, quantized_only=True),
        leaves=optax_q.bit_widths(state))

  def __call__(self, step, state):
    new = optax_q.relayout(state, step=step)
    if new is not state:
      self.events.append(self._snapshot(step, new))
    return new

  def time_average(self, key: str, steps: int) -> float:
    total = 0.0
    for e, nxt in zip(self.events, self.events[1:] + [dict(step=steps)]):
      total += e[key] * (nxt['step'] - e['step'])
    return total / max(steps, 1)


def _task_setup(task: str, mode: Mode, corpus):
  """``(model, loss_fn, eval_fn, params_of(seed), batches_of(seed), steps,
  lr, warmup, run_config)`` of a task."""
  cfg = mode.lm
  if task == 'lm':
    model = _common.make_model(cfg)
    return (model, train.lm_loss, _common.make_eval_fn(cfg, corpus),
            lambda s: _common.init_params(model, s),
            lambda s: data.lm_batches(corpus.train, cfg.batch_size,
                                      cfg.seq_len, seed=s),
            cfg.steps, cfg.learning_rate, cfg.warmup_steps, cfg)
  digits = corpus
  model = vit.ViT(**VIT)
  eval_fn = train.make_eval_fn(
      data.array_eval_batches(digits.x_val, digits.y_val),
      train.classification_loss, metrics={'accuracy': train.accuracy})
  steps = mode.vit_steps
  return (model, train.classification_loss, eval_fn,
          lambda s: model_sharding.init_params(model, digits.x_train[:1],
                                               seed=s),
          lambda s: data.array_batches(digits.x_train, digits.y_train,
                                       VIT_BATCH, seed=s),
          steps, VIT_LR, steps // 10, cfg)


def run_one(task, config, seed, mode: Mode, setup, progress,
            fidelity=False):
  """One training run; returns its row, the events of an adaptive run (or
  None) and the optimizer's own final state.

  With ``fidelity``, a run that is not fp32 trains beside its float32 twin,
  the study's fp32 AdamW of the same chain (``optax_q.track_fidelity``:
  the updates applied are the run's own, bit for bit), and its row gets
  the norm ratio, cosine and weight distance; an fp32 row gets 1, 1 and 0
  without a twin. Bits and bytes count the optimizer's own state; the step
  times include the twin.
  """
  (model, loss_fn, eval_fn, params_of, batches_of, steps, lr, warmup,
   cfg) = setup
  tx = make_tx(config, cfg, lr, steps, warmup, mode.period, seed)
  tracked = fidelity and config != 'fp32'
  if tracked:
    tx = _common._track_fidelity(  # pylint: disable=protected-access
        tx, make_tx('fp32', cfg, lr, steps, warmup, mode.period, seed),
        steps)
  params = params_of(seed)
  recorder = None
  if config not in FIXED:
    recorder = Recorder(jax.eval_shape(tx.init, params))
  result = train.train(
      model, params, tx, batches_of(seed), steps=steps, loss_fn=loss_fn,
      eval_fn=eval_fn, eval_every=max(steps // 5, 1), progress=progress,
      desc=f'{task} {config}', after_step=recorder)
  state = _common.inner_state(result.opt_state)
  times = result.step_times[1:]
  # pylint: disable-next=protected-access
  step_fn = train._train_step_fn(model, tx, loss_fn, 0, None)
  final = result.evals[-1]
  row = dict(
      task=task, config=config, seed=seed,
      final_val_loss=final['loss'], val_accuracy=final.get('accuracy'),
      final_train_loss=float(result.final_loss),
      bits_final=optax_q.state_bits_per_element(state),
      bits_final_quantized=optax_q.state_bits_per_element(
          state, quantized_only=True),
      state_bytes=int(optax_q.state_nbytes(state)),
      step_ms_median=1e3 * float(np.median(times)),
      # pylint: disable-next=protected-access
      compiled_steps=int(step_fn._cache_size()),
  )
  if tracked:
    row.update(_common.fidelity_fields(result.opt_state))
  elif fidelity:
    row.update(_common.BASELINE_FIDELITY)
  if recorder is None:
    row.update(bits_mean=row['bits_final'],
               bits_mean_quantized=row['bits_final_quantized'],
               relayouts=0)
    return row, None, state
  row.update(
      bits_mean=recorder.time_average('bits', steps),
      bits_mean_quantized=recorder.time_average('bits_quantized', steps),
      bits_peak=max(e['bits'] for e in recorder.events),
      relayouts=count_changes(recorder.events),
      commit_bound=1 + steps // (mode.period * 2))
  return row, recorder.events, state


def count_changes(events) -> int:
  """Layout changes in a run's events (the bits of some leaf changed)."""
  return sum(a['leaves'] != b['leaves'] for a, b in zip(events, events[1:]))


# ----------------------------------------------------------------------------
# Overhead of the statistics.
# ----------------------------------------------------------------------------


def measure_overhead(state, params, config, cfg, mode: Mode, reps: int):
  """Optimizer step with statistics against the same formats held fixed.

  Both steps decode, update and encode the same leaves in the same formats
  (those of ``state``, the end of an adaptive run); the adaptive one also
  gathers the statistics (every step, and every ``period`` steps) and
  decides at its period. Interleaved; medians of ``reps`` calls each.
  """
  layout = optax_q.bit_layout(state)
  adam = optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  kwargs = adaptive_kwargs(config, cfg, mode.period, 10**6)
  prefix = next(iter(layout)).split(SEGMENT)[0]
  inner_layout = {k[len(prefix) + len(SEGMENT):]: v
                  for k, v in layout.items()}

  def fmt_of(path, leaf):
    del leaf
    entry = inner_layout.get(path)
    return None if entry is None else entry.split('/')[0]

  modes = {p: v.split('/')[1] for p, v in inner_layout.items()}
  scale_modes = {}
  for p, m in modes.items():
    scale_modes.setdefault(p.split('/')[0], set()).add(m)
  scale_mode = {f: m.pop() for f, m in scale_modes.items() if len(m) == 1}
  txs = {
      'fixed': optax_q.quantize_state(
          adam, formats=fmt_of, scale_mode=scale_mode or None,
          min_size=cfg.min_size, block_size=cfg.block_size,
          elementwise=True),
      'adaptive': optax_q.adaptive_bits(adam, **kwargs),
      f'adaptive, statistics every {mode.period}': optax_q.adaptive_bits(
          adam, sample_every=mode.period, **kwargs),
  }
  grads = jax.tree.map(
      lambda p, k: 1e-3 * jax.random.normal(k, p.shape, p.dtype), params,
      jax.tree.unflatten(jax.tree.structure(params), list(jax.random.split(
          jax.random.key(0), len(jax.tree.leaves(params))))))
  steps, states = {}, {}
  for name, tx in txs.items():
    s = tx.init(params)
    if name != 'fixed':
      s = optax_q.relayout(s, {prefix_free(k): v for k, v in layout.items()})
    else:
      got = {k: v for k, v in ((p, f'{q.fmt.name}/{q.scale_mode}')
                               for p, q in optax_q.quantized_leaves(
                                   s).items())}
      want = {'inner_state/' + k: v for k, v in inner_layout.items()}
      assert got == want, (got, want)

    @jax.jit
    def step(p, s, g, tx=tx):
      u, s = tx.update(g, s, p)
      return optax.apply_updates(p, u), s

    steps[name], states[name] = step, s
  times = {name: [] for name in txs}
  for name in txs:  # Compile and warm up.
    out = steps[name](params, states[name], grads)
    jax.block_until_ready(out)
  for _ in range(reps):
    for name in txs:
      t0 = time.perf_counter()
      jax.block_until_ready(steps[name](params, states[name], grads))
      times[name].append(time.perf_counter() - t0)
  med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
  return dict(
      reps=reps, step_ms={k: v for k, v in med.items()},
      overhead={k: med[k] / med['fixed'] - 1 for k in med if k != 'fixed'})


def prefix_free(path: str) -> str:
  """A layout path of a chained state as seen from the adaptive state."""
  return SEGMENT + path.split(SEGMENT, 1)[1]


# ----------------------------------------------------------------------------
# Summary and outputs.
# ----------------------------------------------------------------------------


def _std(xs):
  return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(rows):
  out = []
  for task in dict.fromkeys(r['task'] for r in rows):
    by = {}
    for r in rows:
      if r['task'] == task:
        by.setdefault(r['config'], {})[r['seed']] = r
    base = by.get('fp32', {})
    spread = _std([r['final_val_loss'] for r in base.values()])
    for config, seeds in by.items():
      paired = sorted(set(seeds) & set(base))
      gaps = [seeds[s]['final_val_loss'] - base[s]['final_val_loss']
              for s in paired]
      rel = [g / base[s]['final_val_loss'] for g, s in zip(gaps, paired)]
      rs = list(seeds.values())
      acc = [r['val_accuracy'] for r in rs if r['val_accuracy'] is not None]
      s = dict(
          task=task, config=config, seeds=sorted(seeds),
          mean_val_loss=statistics.fmean(r['final_val_loss'] for r in rs),
          std_val_loss=_std([r['final_val_loss'] for r in rs]),
          mean_accuracy=statistics.fmean(acc) if acc else None,
          mean_gap=statistics.fmean(gaps) if gaps else math.nan,
          std_gap=_std(gaps),
          mean_rel_gap=statistics.fmean(rel) if rel else math.nan,
          fp32_seed_spread=spread,
          bits_mean=statistics.fmean(r['bits_mean'] for r in rs),
          bits_mean_quantized=statistics.fmean(
              r['bits_mean_quantized'] for r in rs),
          bits_final=statistics.fmean(r['bits_final'] for r in rs),
          bits_peak=max(r.get('bits_peak', r['bits_final']) for r in rs),
          relayouts=max(r['relayouts'] for r in rs),
          compiled_steps=max(r['compiled_steps'] for r in rs),
          step_ms_median=statistics.median(r['step_ms_median'] for r in rs),
          **_common.fidelity_means(rs),
      )
      within = (abs(s['mean_gap']) <= spread or s['mean_gap'] <= 0
                or s['mean_rel_gap'] <= TARGETS['rel_gap'])
      s['quality_met'] = None if config == 'fp32' else bool(within)
      out.append(s)
  return out


def plot_bits(events, steps, path, title):
  """Bits per element of every adapted leaf over training (Fig. 6)."""
  # pylint: disable-next=import-outside-toplevel
  from matplotlib.figure import Figure
  names = list(events[0]['leaves'])
  grid = np.zeros((len(names), steps))
  for e, nxt in zip(events, events[1:] + [dict(step=steps)]):
    for i, n in enumerate(names):
      grid[i, e['step']:nxt['step']] = e['leaves'][n]
  # Results recorded before AdaptiveBitsState.inner became inner_state
  # name the leaves .../inner/inner_state/...
  labels = [n.split(SEGMENT)[-1].split('inner/inner_state/')[-1]
            for n in names]
  fig = Figure(figsize=(10, 0.22 * len(names) + 1.6), layout='constrained')
  ax = fig.subplots()
  im = ax.imshow(grid, aspect='auto', interpolation='nearest', cmap='viridis',
                 extent=(0, steps, len(names) - 0.5, -0.5), vmin=3, vmax=16)
  ax.set_yticks(range(len(names)))
  ax.set_yticklabels(labels, fontsize=6)
  ax.set_xlabel('step')
  fig.colorbar(im, ax=ax, label='stored bits per element')
  ax.set_title(title, fontsize=9)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110)
  return path


def _yes_no(all_bits, quantized_bits, bound):
  if all_bits <= bound:
    return 'yes'
  if quantized_bits <= bound:
    return 'quantized leaves only'
  return '**no**'



def render_markdown(meta, summary):
  """The results page. The fidelity columns (and the sentences on them)
  appear only when a configuration has fidelity, so results written
  without it render as they always did."""
  # Two narrow tables (the content column shows about seven columns).
  fidelity = any(s.get(key) is not None for s in summary
                 for key in _common.FIDELITY)
  bits_header = ('task', 'config', 'bits/elem (mean over steps)',
                 'quantized leaves only', 'final', 'peak',
                 'layouts (compiled steps)')
  loss_header = ('task', 'config', 'final val loss', 'gap to fp32',
                 'rel. gap', 'step ms', "loss within fp32's")
  fidelity_header = ('task', 'config', 'rel. gap', 'norm ratio', 'cosine',
                     'weight distance')
  bits_rows, loss_rows, fidelity_rows = [], [], []
  for s in summary:
    met = {None: '', True: 'yes', False: '**no**'}[s['quality_met']]
    loss = f"{s['mean_val_loss']:.4f} ± {s['std_val_loss']:.4f}"
    if s['mean_accuracy'] is not None:
      loss += f" (acc {100 * s['mean_accuracy']:.1f}%)"
    bits_rows.append((
        s['task'], f"`{s['config']}`", f"{s['bits_mean']:.2f}",
        '—' if s['config'] == 'fp32' else
        f"{s['bits_mean_quantized']:.2f}", f"{s['bits_final']:.2f}",
        f"{s['bits_peak']:.2f}",
        f"{s['relayouts'] + 1} ({s['compiled_steps']})"))
    loss_rows.append((
        s['task'], f"`{s['config']}`", loss,
        '—' if s['config'] == 'fp32' else
        f"{s['mean_gap']:+.4f} ± {s['std_gap']:.4f}",
        '—' if s['config'] == 'fp32' else f"{100 * s['mean_rel_gap']:+.2f}%",
        f"{s['step_ms_median']:.0f}", met))
    fidelity_rows.append((
        s['task'], f"`{s['config']}`",
        '—' if s['config'] == 'fp32' else f"{100 * s['mean_rel_gap']:+.2f}%",
        *(_common.fidelity_cell(s.get(key)) for key in _common.FIDELITY)))
  record = meta.get('fidelity')
  fidelity_text = ''
  if fidelity:
    fidelity_text = (
        ' Fidelity to the fp32 AdamW of the same chain fed the same '
        'gradients and params (`optax_q.track_fidelity`, mean over the '
        'seeds that have it): the median over steps of the update-norm '
        "ratio and of the update cosine, and the final distance from the "
        "twin's weights relative to how far the twin moved; fp32 is its "
        'own twin (1, 1, 0). ')
    fidelity_text += (_common.fidelity_provenance(record) if record else
                      "The step times include the twin's.")
  lm = meta['lm_config']
  tasks = []
  if 'lm' in meta['num_params']:
    tasks.append(
        f"LM: the precision study's GPT (d_model {lm['d_model']}, "
        f"{lm['num_layers']} layer(s), {meta['num_params']['lm']:,} params),"
        f" {lm['steps']} steps of {lm['batch_size']}x{lm['seq_len']} bytes.")
  if 'vit' in meta['num_params']:
    tasks.append(
        f"ViT: d_model {VIT['d_model']}, {VIT['num_layers']} layers "
        f"({meta['num_params']['vit']:,} params) on the 8x8 digits, "
        f"{meta['vit_steps']} steps of {VIT_BATCH}.")
  lines = [
      f"Mode `{meta['mode']}`, seeds {', '.join(map(str, meta['seeds']))}. "
      + ' '.join(tasks) + ' AdamW after clipping; adaptive runs decide '
      f"every {meta['period']} steps, commit every second decision, anneal "
      'over the whole run.',
      '',
      'Bits: stored bits per moment element from the real buffers (codes '
      'and scales), all moment leaves (leaves under 4096 elements stay '
      'float32) and the quantized leaves only; mean over the steps of each '
      'run (every layout weighted by the steps it was held), at the end, '
      'and the largest over the run. Layouts: distinct state layouts in '
      'the run (compiled train steps in parentheses, measured from the jit '
      'cache).',
      '',
      _common.markdown_table(bits_header, bits_rows),
      '',
      'Loss: validation cross entropy after the last step, mean ± std over '
      'seeds; gap: paired by seed with fp32. "loss within fp32\'s": the '
      'mean gap within the fp32 seed spread, below zero, or at most +0.5% '
      '(a loss criterion, not fidelity'
      + ('; see the fidelity table).' if fidelity else ').'),
      '',
      _common.markdown_table(loss_header, loss_rows),
      '',
      *(('**Fidelity**' + fidelity_text.removeprefix(' Fidelity'), '',
         _common.markdown_table(fidelity_header, fidelity_rows), '')
        if fidelity else ()),
      '**Targets** (adaptive configurations; bits as the mean over the '
      'steps, all moment leaves / quantized leaves only):',
      '',
      _common.markdown_table(
          ('task', 'config', 'bits', f"<= {TARGETS['bits_paper']}",
           f"<= {TARGETS['bits_goal']}", "loss within fp32's"),
          [(s['task'], f"`{s['config']}`",
            f"{s['bits_mean']:.2f} / {s['bits_mean_quantized']:.2f}",
            _yes_no(s['bits_mean'], s['bits_mean_quantized'],
                    TARGETS['bits_paper']),
            _yes_no(s['bits_mean'], s['bits_mean_quantized'],
                    TARGETS['bits_goal']),
            'yes' if s['quality_met'] else '**no**')
           for s in summary if s['config'].startswith('adaptive')]),
      '',
      '**Statistics overhead** (optimizer update + apply on the LM '
      'parameters in the final layout of an adaptive run, against the same '
      f"formats held fixed; interleaved, median of {meta['overhead']['reps']}"
      ' calls each):',
      '',
      _common.markdown_table(
          ('step', 'ms', 'overhead'),
          [(k, f'{v:.2f}', '—' if k == 'fixed' else
            f"{100 * meta['overhead']['overhead'][k]:+.1f}%")
           for k, v in meta['overhead']['step_ms'].items()]),
      '',
      f"- Command: `{meta['command']}`",
      f"- Revision: `{meta['git_revision']}`; date: {meta['date']}; "
      f"wall time {meta['wall_s'] / 60:.1f} min",
      f"- Machine: {meta['machine']}",
  ]
  if meta.get('modified_paths'):
    lines.append('- Uncommitted changes at run time in: ' + ', '.join(
        f'`{p}`' for p in meta['modified_paths']))
  if meta.get('rendered'):
    r = meta['rendered']
    lines.append(f"- Page and derived fields (layout changes counted from "
                 f"the recorded events) re-rendered with `{r['command']}` "
                 f"at `{r['git_revision']}`, {r['date']}")
  return '\n'.join(lines) + '\n'


def make_parser():
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n')[0],
      formatter_class=_common.HelpFormatter)
  parser.add_argument('--mode', choices=sorted(MODES), default='quick',
                      help='quick: a 1-layer GPT and the ViT, 200 steps '
                      'each (minutes); full: a 2-layer GPT and the ViT, '
                      '1000 steps each')
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2],
                      help='seeds; each runs every task and config')
  parser.add_argument('--tasks', nargs='+', default=['lm', 'vit'],
                      choices=['lm', 'vit'],
                      help='lm: the byte-level GPT; vit: the small ViT on '
                      'the digits')
  parser.add_argument('--configs', nargs='+', default=None,
                      choices=list(CONFIGS),
                      help='state formats compared: fixed (fp32, int8, '
                      '4bit = nf4 + ue4m0) and adaptive ladders; must '
                      'include fp32, the baseline (default: all; with '
                      "--add-fidelity, the result's configurations other "
                      'than fp32)')
  parser.add_argument('--steps', type=int, default=None,
                      help="override both tasks' steps (smoke tests; "
                      "default: the mode's)")
  parser.add_argument('--overhead-reps', type=int, default=100,
                      help='timed calls of each step in the step-time '
                      'overhead measurement (needs the lm task and the '
                      'adaptive config)')
  parser.add_argument('--no-progress', action='store_true',
                      help='no progress bars (for logs)')
  _common.add_fidelity_arguments(parser)
  parser.add_argument(
      '--render', action='store_true',
      help='only re-render the page and plots from the JSON in --out')
  _common.add_out_argument(parser, __file__)
  return parser


def main(argv=None):
  args = make_parser().parse_args(argv)
  mode = MODES[args.mode]
  if args.steps is not None:
    mode = dataclasses.replace(
        mode, lm=dataclasses.replace(mode.lm, steps=args.steps,
                                     warmup_steps=max(args.steps // 10, 1),
                                     eval_every=args.steps),
        vit_steps=args.steps)
  out = pathlib.Path(args.out)
  if args.render:
    result = json.loads((out / f'{NAME}.json').read_text())
    for row in result['rows']:  # Derived fields, from the recorded events.
      events = result['timelines'].get(row['task'], {}).get(
          row['config'], {}).get(str(row['seed']))
      if events is not None:
        row['relayouts'] = count_changes(events)
    result['summary'] = summarize(result['rows'])
    result['rendered'] = dict(command=_common.command_line(__file__, argv),
                              git_revision=_common.git_revision(),
                              date=_common.now_utc())
    (out / f'{NAME}.json').write_text(json.dumps(result, indent=1) + '\n')
    return write_outputs(result, out)
  if args.add_fidelity:
    return add_fidelity(args, argv, out)
  args.configs = args.configs or list(CONFIGS)
  if 'fp32' not in args.configs:
    raise SystemExit('--configs must include fp32 (the baseline)')
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  t_start = time.perf_counter()
  meta = dict(
      command=_common.command_line(__file__, argv),
      git_revision=_common.git_revision(),
      modified_paths=_common.git_modified_paths(),
      date=_common.now_utc(), machine=_common.machine(), mode=args.mode,
      seeds=list(args.seeds), tasks=list(args.tasks),
      configs=list(args.configs), period=mode.period,
      lm_config=dataclasses.asdict(mode.lm), vit_steps=mode.vit_steps,
      vit_config=dict(VIT, batch_size=VIT_BATCH, learning_rate=VIT_LR),
      targets=TARGETS, num_params={})
  rows, timelines = [], {}
  last_state = None
  for task in args.tasks:
    source = (_common.load_corpus(mode.lm) if task == 'lm'
              else data.load_digits())
    setup = _task_setup(task, mode, source)
    meta['num_params'][task] = int(sum(
        x.size for x in jax.tree.leaves(setup[3](0))))
    for seed in args.seeds:
      for config in args.configs:
        row, events, state = run_one(task, config, seed, mode, setup,
                                     not args.no_progress, args.fidelity)
        _clear_caches()
        rows.append(row)
        if events is not None:
          timelines.setdefault(task, {}).setdefault(config, {})[seed] = events
          if task == 'lm' and config == 'adaptive':
            last_state = (state, setup[3](seed))
        print(f"[{len(rows)}] {task} {config:14s} seed {seed}: val "
              f"{row['final_val_loss']:.4f}, {_fidelity_text(row)}"
              f"bits {row['bits_mean']:.2f} "
              f"(final {row['bits_final']:.2f}), "
              f"{row['step_ms_median']:.0f} ms/step, "
              f"{row['compiled_steps']} compiled "
              f"({time.perf_counter() - t_start:.0f} s)", flush=True)
        (out / f'{NAME}.partial.json').write_text(json.dumps(
            dict(meta, rows=rows, timelines=timelines), indent=1) + '\n')
  if last_state is not None:
    meta['overhead'] = measure_overhead(
        last_state[0], last_state[1], 'adaptive', mode.lm, mode,
        args.overhead_reps)
  else:
    meta['overhead'] = dict(reps=0, step_ms={'fixed': math.nan},
                            overhead={})
  summary = summarize(rows)
  meta.update(wall_s=time.perf_counter() - t_start)
  result = dict(meta, summary=summary, rows=rows, timelines=timelines)
  (out / f'{NAME}.json').write_text(json.dumps(result, indent=1) + '\n')
  write_outputs(result, out)
  (out / f'{NAME}.partial.json').unlink(missing_ok=True)
  return result


def _clear_caches():
  # Every layout of every run compiles its own step: free them, or a full
  # study runs out of memory.
  train._STEP_CACHE.clear()  # pylint: disable=protected-access
  make_tx.cache_clear()
  _common._track_fidelity.cache_clear()  # pylint: disable=protected-access
  jax.clear_caches()


def _fidelity_text(row):
  if row.get('norm_ratio') is None:
    return ''
  return (f"norm ratio {row['norm_ratio']:.3f}, cosine {row['cosine']:.3f}, "
          f"weight distance {row['weight_distance']:.3f}, ")


def add_fidelity(args, argv, out):
  """Adds fidelity to the published ``<out>/bits.json`` from reruns.

  Reruns the given seeds of the given configurations (default: every one
  but fp32) beside their float32 twins with the settings recorded in the
  JSON (mode, steps, period, tasks), copies their fidelity into the
  published rows of the same task, configuration and seed
  (``_common.merge_fidelity``, which checks the reruns' losses against the
  published ones), gives the fp32 rows 1, 1 and 0, adds the fidelity means
  to the summary and rewrites the JSON, the page and the plots. Every other
  field of the result is kept.
  """
  path = out / f'{NAME}.json'
  result = json.loads(path.read_text())
  vit_config = dict(VIT, batch_size=VIT_BATCH, learning_rate=VIT_LR)
  if 'vit' in result['tasks'] and result['vit_config'] != vit_config:
    raise SystemExit(f"{path} ran the ViT as {result['vit_config']}, this "
                     f'script runs it as {vit_config}: not the same runs')
  configs = [c for c in args.configs or result['configs'] if c != 'fp32']
  missing = ([f'seed {s}' for s in args.seeds if s not in result['seeds']]
             + [c for c in configs if c not in result['configs']])
  if missing:
    raise SystemExit(f'{path} has no runs of {", ".join(map(str, missing))}')
  mode = Mode(lm=_common.RunConfig(**result['lm_config']),
              vit_steps=result['vit_steps'], period=result['period'])
  t_start = time.perf_counter()
  measured = []
  for task in result['tasks']:
    source = (_common.load_corpus(mode.lm) if task == 'lm'
              else data.load_digits())
    setup = _task_setup(task, mode, source)
    for seed in args.seeds:
      for config in configs:
        row, _, _ = run_one(task, config, seed, mode, setup,
                            not args.no_progress, fidelity=True)
        _clear_caches()
        measured.append(row)
        print(f"[{len(measured)}] {task} {config:14s} seed {seed}: val "
              f"{row['final_val_loss']:.4f}, {_fidelity_text(row)}"
              f"({time.perf_counter() - t_start:.0f} s)", flush=True)
  record = _common.merge_fidelity(
      result['rows'], measured, keys=('task', 'config', 'seed'),
      command=_common.command_line(__file__, argv), seeds=args.seeds,
      float32=lambda row: row['config'] == 'fp32',
      previous=result.get('fidelity'))
  for s in result['summary']:
    s.update(_common.fidelity_means(
        [r for r in result['rows']
         if (r['task'], r['config']) == (s['task'], s['config'])]))
  # The record goes with the metadata, before the summary.
  at = list(result).index('summary')
  items = list(result.items())
  result = dict(items[:at] + [('fidelity', record)] + [
      (k, v) for k, v in items[at:] if k != 'fidelity'])
  path.write_text(json.dumps(result, indent=1) + '\n')
  return write_outputs(result, out)


def write_outputs(result, out):
  """``bits.md`` and the plots from a result; prints and returns the page."""
  md = render_markdown(result, result['summary'])
  plots = []
  for task, configs in result['timelines'].items():
    for config, seeds in configs.items():
      seed = min(seeds, key=int)
      steps = (result['lm_config']['steps'] if task == 'lm'
               else result['vit_steps'])
      name = f'{NAME}_{task}_{config}.png'
      plot_bits(seeds[seed], steps, out / name,
                f'{config} on the {task.upper()}, seed {seed}: stored bits '
                'per element by leaf over training')
      plots.append(f'![{config}, {task}]({name})')
  (out / f'{NAME}.md').write_text(
      '# Dynamic bit-widths\n\nWritten by `examples/study_bits.py`; do not '
      'edit.\n\n' + md + '\n' + '\n\n'.join(plots) + '\n')
  print(md)
  return md


if __name__ == '__main__':
  main()
