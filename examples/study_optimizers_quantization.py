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
"""AdamW, Muon, Shampoo and SOAP under 4-bit PTQ and 4-bit QAT.

After "Beyond Outliers: A Study of Optimizers Under Quantization" (Vlassis
et al., arXiv 2509.23500), at the scale of this repository: small GPTs on
the byte-level corpus at several widths, each optimizer float32, with a
small learning-rate sweep per size.

For every trained model:

* **PTQ**: W4A4 round to nearest (``quant.ptq(4)``: symmetric absmax, per
  output row and per token, mid-rise grid) on every linear layer; the
  validation loss before and after, at the end of training and at the
  *common loss* checkpoint (the first evaluation where each optimizer's
  best run reaches the loss that all of them reach at that size);
* **metrics** on validation batches, averaged over the linear layers'
  inputs: max-to-median and max-to-mean ratios, kurtosis (flat and of the
  per-channel RMS), and the output error ``R_L`` (logits);
  and the error decomposition ``R = A + B + C`` of the residual stream
  (every block) with the linear layers' gains.

Then **QAT**: each optimizer, at its best float32 learning rate, trains the
model from scratch under ``quant.qat(4)`` (QuEST: Hadamard blocks of 128,
Gaussian-optimal clipping, trust-mask STE, weights and activations), and
the scaling law ``L = A / (N rho)^alpha + E`` is fitted per optimizer to
its float32 and QAT losses.

Claims checked: Muon degrades most under PTQ; Shampoo least under QAT;
``R_L`` predicts the post-PTQ loss better than MMR and kurtosis (Spearman
correlation over the sweep's models).

Modes: ``full`` (three widths, three learning rates, 1000 steps), ``quick``
(two widths, one learning rate, 150 steps) and ``smoke`` (a few steps of a
tiny model, for the tests).

Usage::

  python examples/study_optimizers_quantization.py --out docs/results
  python examples/study_optimizers_quantization.py --mode quick
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import time
from typing import Any

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from optax_q import quant
from scipy import stats

from models import data
from models import train

OPTIMIZERS = ('adamw', 'muon', 'shampoo', 'soap')
BITS = 4
B2 = 0.95  # The optimizer study's beta2 for every optimizer.
MAX_DIM = 128


@dataclasses.dataclass(frozen=True)
class Mode:
  steps: int
  widths: tuple[int, ...]
  lrs: dict[str, tuple[float, ...]]
  eval_every: int
  eval_batches: int
  metric_batches: int = 2
  num_layers: int = 2
  num_heads: int = 4


FULL_LRS = dict(adamw=(1e-3, 3e-3, 1e-2), muon=(5e-3, 2e-2, 5e-2),
                shampoo=(1e-3, 3e-3, 1e-2), soap=(3e-3, 1e-2, 3e-2))
MODES = {
    'full': Mode(1000, (64, 128, 192), FULL_LRS, eval_every=50,
                 eval_batches=16),
    'quick': Mode(150, (64, 128), {k: (v[1],) for k, v in FULL_LRS.items()},
                  eval_every=50, eval_batches=8),
    'smoke': Mode(4, (32, 48), {k: (v[1],) for k, v in FULL_LRS.items()},
                  eval_every=2, eval_batches=2, metric_batches=1,
                  num_layers=1, num_heads=2),
}


def run_config(mode: Mode, width: int, lr: float) -> _common.RunConfig:
  return _common.RunConfig(
      d_model=width, num_layers=mode.num_layers, num_heads=mode.num_heads,
      steps=mode.steps, learning_rate=lr, b2=B2, eval_every=mode.eval_every,
      eval_batches=mode.eval_batches, warmup_steps=max(mode.steps // 20, 1))


def make_optimizer(name: str, cfg: _common.RunConfig, params
                   ) -> optax.GradientTransformation:
  """Clipping, then the float32 optimizer ``name``."""
  lr = _common.schedule(cfg)
  mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)
  common = dict(b1=cfg.b1, b2=B2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                weight_decay_mask=mask, max_preconditioner_dim=MAX_DIM,
                mu_format='fp32', nu_format='fp32', stats_format='fp32',
                eigvecs_format='fp32')
  if name == 'adamw':
    tx = optax.adamw(lr, b1=cfg.b1, b2=B2, eps=cfg.eps,
                     weight_decay=cfg.weight_decay, mask=mask)
  elif name == 'muon':
    # The auxiliary AdamW (embeddings, head, vectors) at AdamW's middle
    # learning rate, as the study's code does.
    adam_cfg = dataclasses.replace(cfg, learning_rate=FULL_LRS['adamw'][1])
    tx = optax.contrib.muon(
        lr, adam_learning_rate=_common.schedule(adam_cfg), beta=cfg.b1,
        adam_b1=cfg.b1, adam_b2=B2, weight_decay=cfg.weight_decay,
        weight_decay_mask=mask,
        muon_weight_dimension_numbers=_common.gpt_dims(params))
  elif name == 'shampoo':
    tx = optax_q.shampoo(lr, precondition_frequency=20, **common)
  else:
    tx = optax_q.soap(lr, precondition_frequency=10, **common)
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)


def quantized_lm_loss(quantization):
  def loss(model, params, batch):
    inputs, targets = batch
    logits = quantization(model.apply)({'params': params}, inputs)
    return optax.softmax_cross_entropy_with_integer_labels(
        logits, targets).mean()
  return loss


PTQ = quant.ptq(BITS)
QAT = quant.qat(BITS)


class Evaluator:
  """Validation loss, float32 and PTQ, and the metrics of one model."""

  def __init__(self, mode: Mode, corpus: data.Corpus):
    cfg = run_config(mode, mode.widths[0], 1e-3)
    self.batches = list(_common.eval_batches(cfg, corpus))
    self.fp = train.make_eval_fn(self.batches)
    self.ptq = train.make_eval_fn(self.batches, quantized_lm_loss(PTQ))
    self.qat = train.make_eval_fn(self.batches, quantized_lm_loss(QAT))
    self.metric_tokens = jnp.concatenate(
        [b[0] for b in self.batches[:mode.metric_batches]])
    self._metrics = {}

  def metrics(self, model, params) -> dict[str, float]:
    if model not in self._metrics:
      self._metrics[model] = jax.jit(
          lambda p, x: model_metrics(model, p, x))
    out = self._metrics[model](params, self.metric_tokens)
    return jax.tree.map(float, out)


def model_metrics(model, params, tokens) -> dict[str, Any]:
  """Outlier metrics of the linear inputs, R_L, and the decomposition."""
  apply = lambda p, x: model.apply({'params': p}, x)
  _, inputs = quant.linear_inputs(apply)(params, tokens)
  acts = list(inputs.values())
  mean = lambda f: jnp.mean(jnp.stack([f(h) for h in acts]))
  out, out_q, blocks, _ = quant.layer_errors(
      apply, PTQ, layers=lambda path: len(path) == 1)(params, tokens)
  _, _, _, gains = quant.layer_errors(apply, PTQ)(params, tokens)
  linear = [g for g in gains.values()]
  finite_mean = lambda xs: jnp.nanmean(jnp.stack(xs))
  return dict(
      mmr_median=mean(quant.max_to_median), mmr_mean=mean(quant.max_to_mean),
      kurtosis=mean(quant.kurtosis),
      kurtosis_rms=mean(lambda h: quant.kurtosis(h, kind='rms')),
      r_l=quant.relative_error(out, out_q),
      blocks={k: v._asdict() for k, v in blocks.items()},
      gain=finite_mean([g.gain for g in linear]),
      gain_spectral=finite_mean([g.spectral for g in linear]),
      gain_alignment=finite_mean([g.alignment for g in linear]))


def train_one(mode: Mode, corpus, evaluator: Evaluator, name: str,
              width: int, lr: float, qat: bool = False) -> dict[str, Any]:
  """One run; returns its row (and keeps evaluation checkpoints)."""
  cfg = run_config(mode, width, lr)
  model = _common.make_model(cfg)
  params = _common.init_params(model, 0)
  checkpoints = []

  def eval_fn(model, params):
    fp = (evaluator.qat if qat else evaluator.fp)(model, params)['loss']
    checkpoints.append((fp, jax.tree.map(np.asarray, params)))
    return fp

  result = train.train(
      model, params, make_optimizer(name, cfg, params),
      data.lm_batches(corpus.train, cfg.batch_size, cfg.seq_len, seed=0),
      steps=cfg.steps,
      loss_fn=quantized_lm_loss(QAT) if qat else train.lm_loss,
      eval_fn=eval_fn, eval_every=cfg.eval_every, progress=False, seed=0)
  times = (result.step_times[1:] if len(result.step_times) > 1
           else result.step_times)
  row = dict(optimizer=name, width=width, lr=lr, qat=qat, steps=cfg.steps,
             num_params=int(sum(x.size for x in jax.tree.leaves(params))),
             eval_steps=[int(s) for s in result.eval_steps],
             val_curve=[float(c[0]) for c in checkpoints],
             val_loss=float(checkpoints[-1][0]),
             step_ms=1e3 * float(np.median(times)))
  if not qat:
    final = checkpoints[-1][1]
    row['ptq_loss'] = evaluator.ptq(model, final)['loss']
    row['metrics'] = evaluator.metrics(model, final)
  print(f"{name:8s} d{width:<4d} lr {lr:<7g} {'QAT' if qat else 'fp32'}: "
        f"{row['val_loss']:.4f}"
        + (f" PTQ {row['ptq_loss']:.4f} R_L {row['metrics']['r_l']:.4f}"
           if not qat else '') + f" ({row['step_ms']:.1f} ms/step)",
        flush=True)
  return row, model, checkpoints


def common_loss_ptq(mode, evaluator, best: dict, rows: list) -> None:
  """PTQ at the first checkpoint where each best run reaches the loss all
  of them reach (per width)."""
  for width in mode.widths:
    mine = {k: v for k, v in best.items() if k[1] == width}
    if not mine:
      continue
    common = max(min(c[0] for c in ckpts) for _, _, ckpts in mine.values())
    for (name, _), (row, model, ckpts) in mine.items():
      i = next(i for i, c in enumerate(ckpts) if c[0] <= common)
      row['common_loss'] = common
      row['cl_step'] = row['eval_steps'][i]
      row['cl_val_loss'] = ckpts[i][0]
      row['cl_ptq_loss'] = evaluator.ptq(model, ckpts[i][1])['loss']
      print(f'{name:8s} d{width}: common loss {common:.4f} at step '
            f"{row['cl_step']}: PTQ {row['cl_ptq_loss']:.4f}", flush=True)


# ----------------------------------------------------------------------------
# Summary and claims.
# ----------------------------------------------------------------------------

METRICS = ('mmr_median', 'mmr_mean', 'kurtosis', 'kurtosis_rms', 'r_l')


def best_rows(rows) -> dict[tuple[str, int], dict[str, Any]]:
  out = {}
  for r in rows:
    if r['qat']:
      continue
    key = (r['optimizer'], r['width'])
    if key not in out or r['val_loss'] < out[key]['val_loss']:
      out[key] = r
  return out


def degradation_table(rows) -> list[dict[str, Any]]:
  best = best_rows(rows)
  qat = {(r['optimizer'], r['width']): r for r in rows if r['qat']}
  table = []
  for (name, width), r in sorted(best.items(), key=lambda kv: (
      kv[0][1], OPTIMIZERS.index(kv[0][0]))):
    q = qat.get((name, width))
    table.append(dict(
        optimizer=name, width=width, num_params=r['num_params'], lr=r['lr'],
        fp32=r['val_loss'], ptq=r['ptq_loss'],
        ptq_delta=r['ptq_loss'] - r['val_loss'],
        cl_step=r.get('cl_step'), cl_fp32=r.get('cl_val_loss'),
        cl_ptq_delta=(r['cl_ptq_loss'] - r['cl_val_loss']
                      if 'cl_ptq_loss' in r else None),
        qat=q['val_loss'] if q else None,
        qat_delta=(q['val_loss'] - r['val_loss']) if q else None,
        r_l=r['metrics']['r_l'], mmr=r['metrics']['mmr_median'],
        kurtosis=r['metrics']['kurtosis']))
  return table


def correlations(rows) -> dict[str, Any]:
  """Spearman correlation of each metric with the post-PTQ loss and with
  the PTQ degradation, over every float32 model of a width (and the mean
  over widths)."""
  out = {}
  fp = [r for r in rows if not r['qat']]
  for width in sorted({r['width'] for r in fp}):
    mine = [r for r in fp if r['width'] == width]
    if len(mine) < 3:
      continue
    post = [r['ptq_loss'] for r in mine]
    delta = [r['ptq_loss'] - r['val_loss'] for r in mine]
    out[str(width)] = {
        m: dict(post_ptq=_spearman([r['metrics'][m] for r in mine], post),
                degradation=_spearman([r['metrics'][m] for r in mine],
                                      delta))
        for m in METRICS}
  if out:
    out['mean'] = {m: {k: float(np.mean([out[w][m][k] for w in out]))
                       for k in ('post_ptq', 'degradation')}
                   for m in METRICS}
  return out


def _spearman(x, y) -> float:
  rho = stats.spearmanr(x, y).statistic
  return float(rho) if np.isfinite(rho) else math.nan


def scaling_fits(rows) -> dict[str, Any]:
  best = best_rows(rows)
  out = {}
  for name in OPTIMIZERS:
    pts = [(r['num_params'], r['val_loss'], False)
           for (n, _), r in best.items() if n == name]
    pts += [(r['num_params'], r['val_loss'], True)
            for r in rows if r['qat'] and r['optimizer'] == name]
    # The fit needs 4 points at 3 sizes or more (quick mode has two).
    if (len(pts) < 4 or len({p[0] for p in pts}) < 3
        or not any(p[2] for p in pts)):
      continue
    n, loss, q = map(np.asarray, zip(*pts))
    fit = quant.fit_scaling_law(n, loss, q)
    out[name] = dict(a=fit.a, alpha=fit.alpha, e=fit.e, rho=fit.rho,
                     intervals=fit.intervals, residual=fit.residual)
  return out


def claims(table, corr, fits) -> dict[str, Any]:
  """The paper's three qualitative claims, read off our numbers."""
  out = {}
  widths = sorted({t['width'] for t in table})
  worst_ptq, best_qat = {}, {}
  for w in widths:
    mine = [t for t in table if t['width'] == w]
    key = 'cl_ptq_delta' if all(t['cl_ptq_delta'] is not None
                                for t in mine) else 'ptq_delta'
    worst_ptq[str(w)] = max(mine, key=lambda t: t[key])['optimizer']
    if all(t['qat_delta'] is not None for t in mine):
      best_qat[str(w)] = min(mine, key=lambda t: t['qat_delta'])['optimizer']
  out['muon degrades most under PTQ'] = dict(
      worst_per_width=worst_ptq,
      holds=bool(worst_ptq) and all(v == 'muon' for v in worst_ptq.values()))
  out['shampoo degrades least under QAT'] = dict(
      best_per_width=best_qat,
      holds=bool(best_qat) and all(v == 'shampoo' for v in best_qat.values()))
  if 'mean' in corr:
    # Judged on the degradation (post-PTQ minus float32 loss): the study
    # compares models of matched quality (its common-loss checkpoints); the
    # post-PTQ loss of our final models mostly ranks their float32 quality.
    for target in ('degradation', 'post_ptq'):
      rho = {m: abs(corr['mean'][m][target]) for m in METRICS}
      others = {m: v for m, v in rho.items() if m != 'r_l'}
      out[f'R_L predicts the {target.replace("_", "-")} better than MMR '
          'and kurtosis'] = dict(
              abs_rho_r_l=rho['r_l'], abs_rho_others=others,
              holds=bool(all(rho['r_l'] > v for v in others.values())))
  if fits:
    out['shampoo has the highest rho'] = dict(
        rho={k: v['rho'] for k, v in fits.items()},
        holds=max(fits, key=lambda k: fits[k]['rho']) == 'shampoo')
  return out


def _f(v, digits=4):
  return '' if v is None else f'{v:.{digits}f}'


COLORS = dict(adamw='0.35', muon='C3', shampoo='C0', soap='C1')


def plot(result, path) -> pathlib.Path:
  """Four panels: the degradation per optimizer and width; the PTQ
  degradation against R_L and against MMR over every float32 model; the
  scaling-law fits."""
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  meta, table, rows = result['meta'], result['table'], result['rows']
  fig = Figure(figsize=(11, 8), layout='constrained')
  (bars, r_l), (mmr, law) = fig.subplots(2, 2)
  widths = sorted({t['width'] for t in table})
  kinds = (('ptq_delta', 'PTQ (end)', ''), ('cl_ptq_delta', 'PTQ (CL)', '//'),
           ('qat_delta', 'QAT', '..'))
  names = [n for n in OPTIMIZERS if any(t['optimizer'] == n for t in table)]
  slot = 0.8 / max(len(names) * len(kinds), 1)
  for i, w in enumerate(widths):
    for j, name in enumerate(names):
      t = next((t for t in table if t['width'] == w
                and t['optimizer'] == name), None)
      for k, (key, label, hatch) in enumerate(kinds):
        if t is None or t[key] is None:
          continue
        x = i - 0.4 + slot * (j * len(kinds) + k + 0.5)
        bars.bar(x, t[key], slot, color=COLORS[name], hatch=hatch,
                 edgecolor='white', lw=0,
                 label=f'{name} {label}' if i == 0 else None)
  bars.set_xticks(range(len(widths)))
  bars.set_xticklabels([f'd {w}' for w in widths])
  bars.set_ylabel('loss increase (nats/byte)')
  bars.set_title('Degradation at 4 bits, best learning rate per width',
                 fontsize=9)
  bars.legend(fontsize=6, ncol=len(names), loc='upper center',
              bbox_to_anchor=(0.5, -0.08))
  bars.grid(axis='y', alpha=0.3)
  fp = [r for r in rows if not r['qat']]
  markers = dict(zip(widths, 'os^Dv'))
  for ax, metric, label in ((r_l, 'r_l', 'R_L (output error of W4A4)'),
                            (mmr, 'mmr_median', 'MMR (max / median)')):
    for r in fp:
      ax.plot(r['metrics'][metric], r['ptq_loss'] - r['val_loss'],
              markers.get(r['width'], 'o'), color=COLORS[r['optimizer']],
              ms=5, alpha=0.8)
    ax.set_xscale('log')
    ax.set_xlabel(label)
    ax.set_ylabel('PTQ degradation (nats/byte)')
    rho = result['correlations'].get('mean', {}).get(metric, {})
    shapes = ', '.join(f'{markers[w]} d {w}' for w in widths)
    ax.set_title(f'every float32 model ({shapes}); mean Spearman rho '
                 f"{rho.get('degradation', math.nan):.2f}", fontsize=9)
    ax.grid(alpha=0.3)
  for name in names:
    r_l.plot([], [], 'o', color=COLORS[name], label=name)
  r_l.legend(fontsize=7)
  for name, fit in result['scaling'].items():
    pts = [(r['num_params'], r['val_loss'], r['qat']) for r in rows
           if r['optimizer'] == name and (r['qat'] or any(
               t['optimizer'] == name and t['width'] == r['width']
               and t['lr'] == r['lr'] for t in table))]
    n_grid = np.geomspace(min(p[0] for p in pts), max(p[0] for p in pts))
    for q, style, rho in ((False, '-', 1.0), (True, '--', fit['rho'])):
      law.plot(n_grid, fit['a'] / (n_grid * rho) ** fit['alpha'] + fit['e'],
               style, color=COLORS[name], lw=1)
      law.plot([p[0] for p in pts if p[2] == q],
               [p[1] for p in pts if p[2] == q], 'o' if not q else 'x',
               color=COLORS[name],
               label=f"{name} {'QAT' if q else 'fp32'}"
               + (f" (rho {fit['rho']:.2f})" if q else ''))
  law.set_xscale('log')
  law.set_xlabel('parameters N')
  law.set_ylabel('validation loss (nats/byte)')
  law.set_title('L = A / (N rho)^alpha + E: fp32 (solid), 4-bit QAT (dashed)',
                fontsize=9)
  law.grid(alpha=0.3)
  if result['scaling']:
    law.legend(fontsize=6, ncol=2)
  else:
    law.text(0.5, 0.5, 'no fit: it needs three widths or more',
             ha='center', va='center', transform=law.transAxes)
  fig.suptitle(f"Optimizers under 4-bit quantization, {meta['mode']} mode: "
               f"{meta['steps']} steps, widths {meta['widths']}", fontsize=10)
  fig.savefig(path, dpi=100)
  return pathlib.Path(path)


def render_markdown(result) -> str:
  meta = result['meta']
  lines = [
      '# Optimizers under 4-bit model quantization', '',
      'Generated by `examples/study_optimizers_quantization.py`; do not '
      'edit by hand.', '',
      f"- Command: `{meta['command']}`"
      + (f" ({meta['note']})" if meta.get('note') else ''),
      f"- Git revision: `{meta['git_revision']}`",
      f"- Date: {meta['date']}",
      f"- Machine: {meta['machine']}",
      f"- Mode: {meta['mode']}: {meta['steps']} steps, widths "
      f"{meta['widths']}, learning rates "
      + '; '.join(f"{', '.join(f'{lr:g}' for lr in lrs)} ({name})"
                  for name, lrs in meta['lrs'].items()) + '; '
      f"{meta['seconds']:.0f} s in all.",
      f'- Settings: GPT with {meta["num_layers"]} layers, batch 16 x 64 '
      f'bytes, warm-up then cosine, b2 {B2}, weight decay 0.1 (matrices), '
      f'clip 1.0; Shampoo and SOAP with blocks of {MAX_DIM}, refresh every '
      '20 / 10 steps, float32 state. PTQ: W4A4 RTN absmax per row / per '
      'token, mid-rise. QAT: QuEST 4-bit weights and activations (Hadamard '
      '128, trust-mask STE), trained from scratch at the best float32 '
      'learning rate.', '',
      f'![degradation, metrics and scaling laws]({NAME}.png)', '',
      '## Degradation per optimizer (best learning rate per width)', '',
      'Validation loss (nats per byte). PTQ delta: at the end of training; '
      'CL delta: at the common-loss checkpoint (the first evaluation where '
      'the run reaches the loss that every optimizer reaches at that '
      'width). QAT delta: QAT loss minus float32 loss.', '',
  ]
  table = result['table']
  # Three narrow tables (the content column shows about seven columns).
  lines.append(_common.markdown_table(
      ['optimizer', 'width', 'params', 'lr', 'fp32', 'PTQ', 'QAT'],
      [[t['optimizer'], str(t['width']), str(t['num_params']),
        f"{t['lr']:g}", _f(t['fp32']), _f(t['ptq']), _f(t['qat'])]
       for t in table]))
  lines += ['', 'Degradation: the quantized loss minus the float32 loss.', '']
  lines.append(_common.markdown_table(
      ['optimizer', 'width', 'PTQ delta', 'CL step', 'CL delta',
       'QAT delta'],
      [[t['optimizer'], str(t['width']), _f(t['ptq_delta']),
        str(t['cl_step'] or ''), _f(t['cl_ptq_delta']), _f(t['qat_delta'])]
       for t in table]))
  lines += ['', 'Outlier metrics of the float32 model: `R_L`, the relative '
            'error of its output under PTQ; MMR, the max-to-median ratio, and '
            'the kurtosis of the linear layers\' inputs (mean over the '
            'layers).', '']
  lines.append(_common.markdown_table(
      ['optimizer', 'width', 'R_L', 'MMR', 'kurtosis'],
      [[t['optimizer'], str(t['width']), _f(t['r_l']), _f(t['mmr'], 2),
        _f(t['kurtosis'], 2)] for t in table]))
  lines += ['', '## Rank correlation with the post-PTQ loss', '',
            'Spearman over every float32 model of a width (optimizers x '
            'learning rates); `mean` averages the widths.', '']
  corr = result['correlations']
  rows = [[w, m, _f(v[m]['post_ptq'], 3), _f(v[m]['degradation'], 3)]
          for w, v in corr.items() for m in METRICS]
  lines.append(_common.markdown_table(
      ['width', 'metric', 'rho (post-PTQ loss)', 'rho (degradation)'], rows))
  lines += ['', '## QAT scaling law per optimizer', '',
            '`L = A / (N rho)^alpha + E` fitted (Huber on log losses) to the '
            'float32 and QAT losses of the best runs; intervals: range over '
            'leave-one-out fits.', '']
  rows = []
  for name, f in result['scaling'].items():
    iv = f['intervals'] or {}
    rng = lambda k, iv=iv: (f'[{iv[k][0]:.3g}, {iv[k][1]:.3g}]'
                            if k in iv else '')
    rows.append([name, f"{f['rho']:.3f}", rng('rho'), f"{f['alpha']:.3f}",
                 f"{f['e']:.3f}", f"{f['residual']:.4f}"])
  lines.append(_common.markdown_table(
      ['optimizer', 'rho', 'rho LOO range', 'alpha', 'E', 'rms log resid'],
      rows))
  lines += ['', '## Claims', '']
  for key, c in result['claims'].items():
    lines.append(f"- **{key}**: {'holds' if c['holds'] else 'does not hold'}"
                 f"; {claim_evidence(c)}.")
  return '\n'.join(lines) + '\n'


def _by_width(per_width: dict[str, str]) -> str:
  return ', '.join(f"{name}'s at width {w}" for w, name in per_width.items())


def claim_evidence(claim: dict[str, Any]) -> str:
  """What a claim of ``claims`` was judged on, as a sentence."""
  if 'worst_per_width' in claim:
    return ('the largest PTQ degradation (at the common-loss checkpoint '
            'where every run has one) is '
            + _by_width(claim['worst_per_width']))
  if 'best_per_width' in claim:
    return ('the smallest QAT degradation is '
            + _by_width(claim['best_per_width']))
  if 'abs_rho_r_l' in claim:
    others = ', '.join(f'{v:.3f} for {m}'
                       for m, v in claim['abs_rho_others'].items())
    return (f"the rho averaged over the widths, in absolute value, is "
            f"{claim['abs_rho_r_l']:.3f} "
            f'for R_L against {others}')
  if 'rho' in claim:
    return 'the fitted rho is ' + ', '.join(
        f'{v:.3f} for {name}' for name, v in claim['rho'].items())
  return ', '.join(f'{k} {v}' for k, v in claim.items() if k != 'holds')


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=_common.HelpFormatter)
  parser.add_argument('--mode', choices=sorted(MODES), default='full',
                      help='full: three widths, three learning rates, 1000 '
                      'steps; quick: two widths, one learning rate, 150 '
                      'steps; smoke: a few steps of a tiny model (for the '
                      'tests)')
  parser.add_argument('--optimizers', nargs='+', choices=OPTIMIZERS,
                      default=list(OPTIMIZERS),
                      help='optimizers trained (float32, then PTQ and QAT)')
  parser.add_argument('--render', action='store_true',
                      help='only re-write optimizers_quantization.{json,md} '
                      'from the rows of the optimizers_quantization.json in '
                      '--out (no training)')
  parser.add_argument('--data', default=None,
                      help='train on this text file (default: the Python '
                      "standard library's own sources); its first "
                      '8,000,000 bytes either way')
  _common.add_out_argument(parser, __file__)
  return parser


NAME = 'optimizers_quantization'


def _finish(out: pathlib.Path, result) -> str:
  rows = result['rows']
  result['table'] = degradation_table(rows)
  result['correlations'] = correlations(rows)
  if 'scaling' not in result:  # --render keeps the saved fits (20 s).
    result['scaling'] = scaling_fits(rows)
  result['claims'] = claims(result['table'], result['correlations'],
                            result['scaling'])
  (out / f'{NAME}.json').write_text(
      json.dumps(result, indent=1, allow_nan=True) + '\n')
  md = render_markdown(result)
  (out / f'{NAME}.md').write_text(md)
  plot(result, out / f'{NAME}.png')
  return md


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  if args.render:
    return _finish(out, json.loads((out / f'{NAME}.json').read_text()))
  mode = MODES[args.mode]
  start = time.time()
  corpus = data.load_corpus(args.data)
  out.mkdir(parents=True, exist_ok=True)
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=_common.git_revision(), date=_common.now_utc(),
              machine=_common.machine(), mode=args.mode, steps=mode.steps,
              widths=list(mode.widths), num_layers=mode.num_layers,
              lrs={k: list(v) for k, v in mode.lrs.items()
                   if k in args.optimizers})
  evaluator = Evaluator(mode, corpus)
  rows, best = [], {}
  md = ''
  for width in mode.widths:
    for name in args.optimizers:
      for lr in mode.lrs[name]:
        row, model, ckpts = train_one(mode, corpus, evaluator, name, width,
                                      lr)
        rows.append(row)
        if (name, width) not in best or row['val_loss'] < best[
            (name, width)][0]['val_loss']:
          best[(name, width)] = (row, model, ckpts)
      jax.clear_caches()
    common_loss_ptq(mode, evaluator, best, rows)
    for name in args.optimizers:
      row, _, _ = train_one(mode, corpus, evaluator, name, width,
                            best[(name, width)][0]['lr'], qat=True)
      rows.append(row)
    best = {k: v for k, v in best.items() if k[1] != width}  # Free memory.
    # Written after every width, so a long run keeps what it measured.
    meta['seconds'] = time.time() - start
    md = _finish(out, dict(meta=meta, rows=rows))
  print(json.dumps(json.loads((out / f'{NAME}.json').read_text())['claims'],
                   indent=1))
  print(f'wrote {out}/{NAME}.{{json,md}}')
  return md


if __name__ == '__main__':
  main()
