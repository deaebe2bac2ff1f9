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
"""Code shared by ``examples/demo.py`` and ``examples/study_precision.py``.

One language-model training run: the small GPT of :mod:`models.gpt` on the
byte-level standard-library corpus, AdamW (b1 0.9, b2 0.999, eps 1e-8) after
gradient clipping at 1.0, linear warm-up then cosine decay, decoupled weight
decay on matrices only. The optimizer is ``optax.adamw`` for the ``fp32``
baseline and ``optax_q.adamw`` for every low-precision configuration; the
seed sets the parameter init, the batch order and the stochastic rounding.
"""

from collections.abc import Callable, Sequence
import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import os
import pathlib
import platform
import shlex
import statistics
import subprocess
import sys
from typing import Any

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import optax

# Run as `python examples/<script>.py` from a fresh clone: make the repository
# root importable even when the package is not installed.
ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

# pylint: disable=g-import-not-at-top,wrong-import-position
import optax_q  # noqa: E402
from models import data  # noqa: E402
from models import gpt  # noqa: E402
from models import train  # noqa: E402
# pylint: enable=g-import-not-at-top,wrong-import-position


# ----------------------------------------------------------------------------
# Configurations.
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OptConfig:
  """How the two Adam moments are stored.

  Attributes:
    name: row label, e.g. ``'fp8_e4m3/sr'``.
    mu_format: first-moment format (``'fp32'`` with ``nu_format='fp32'``
      and ``rounding=None`` means plain ``optax.adamw``).
    nu_format: second-moment format.
    rounding: ``'nearest'``, ``'stochastic'``, ``'hybrid'`` (first moment
      to nearest, second moment stochastic), ``'preconditioner'`` (the
      second moment rounded in preconditioner space, the first
      stochastically) or ``None`` (fp32).
    scale_mode: ``optax_q.adamw``'s ``scale_mode`` (None: the formats'),
      or ``(field, mode)`` pairs for a mode per moment (hashable, unlike a
      dict).
  """

  name: str
  mu_format: str
  nu_format: str
  rounding: str | None
  scale_mode: str | tuple[tuple[str, str], ...] | None = None

  @property
  def is_baseline(self) -> bool:
    return self.rounding is None


FP32 = OptConfig('fp32', 'fp32', 'fp32', None)

# The 4-bit pair: fp4 e2m1 for the signed first moment and the zero-free
# unsigned e2m2 grid for the second moment (Li et al, 2023, drop zero from the
# second-moment grid). Measured against int4/int4 and mixed pairs with
# `study_precision.py --configs` (see docs/precision.md).
FOUR_BIT = ('fp4_e2m1', 'fp4_e2m2u')

_ROUNDING_TAG = {'nearest': 'rn', 'stochastic': 'sr', 'hybrid': 'mix',
                 'preconditioner': 'pc'}

# 'hybrid': mu rounded to nearest (it is rewritten every step at b1 = 0.9,
# so it does not stall), nu stochastically (it stalls under round-to-nearest
# at b2 = 0.999).
HYBRID_ROUNDING = {'mu': 'nearest', 'nu': 'stochastic'}


def opt_config(mu_format: str, nu_format: str | None = None,
               rounding: str | None = 'stochastic',
               name: str | None = None) -> OptConfig:
  """An :class:`OptConfig` named ``'<mu>[+<nu>]/<rn|sr>'``."""
  nu_format = nu_format or mu_format
  if mu_format == nu_format == 'fp32':
    return FP32
  if name is None:
    fmt = mu_format if mu_format == nu_format else f'{mu_format}+{nu_format}'
    name = f'{fmt}/{_ROUNDING_TAG[rounding]}'
  return OptConfig(name, mu_format, nu_format, rounding)


def parse_config(spec: str) -> OptConfig:
  """``'fp32'``, ``'fp8_e4m3/sr'``, ``'int4+fp4_e2m2u/rn'``, ``'4bit/sr'``,
  ``'nf4+int4_mulaw/pc'`` (preconditioner-space rounding);
  a trailing ``'/pow2'`` (``'nf4+ue4m0/sr/pow2'``) stores power-of-two
  scales, a trailing ``'/rank1'`` the second moment with rank-1 scales
  (``scale_mode={'nu': 'rank1'}``)."""
  for suffix, mode in (('/pow2', 'block_pow2'),
                       ('/rank1', (('nu', 'rank1'),))):
    if spec.endswith(suffix):
      opt = parse_config(spec[:-len(suffix)])
      return dataclasses.replace(opt, name=opt.name + suffix,
                                 scale_mode=mode)
  fmt, _, tag = spec.partition('/')
  if fmt == 'fp32':
    return FP32
  rounding = {'rn': 'nearest', 'nearest': 'nearest', 'sr': 'stochastic',
              'stochastic': 'stochastic', '': 'stochastic',
              'mix': 'hybrid', 'hybrid': 'hybrid', 'pc': 'preconditioner',
              'preconditioner': 'preconditioner'}.get(tag)
  if rounding is None:
    raise ValueError(
        f'bad rounding {tag!r} in {spec!r}: use /rn, /sr, /mix or /pc')
  if fmt == '4bit':
    return opt_config(*FOUR_BIT, rounding,
                      name=f'4bit/{_ROUNDING_TAG[rounding]}')
  mu, _, nu = fmt.partition('+')
  return opt_config(mu, nu or None, rounding)


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """Model, data and schedule of one run (shared by every optimizer)."""

  d_model: int = 128
  num_layers: int = 2
  num_heads: int = 4
  seq_len: int = 64
  batch_size: int = 16
  steps: int = 500
  learning_rate: float = 3e-3
  warmup_steps: int = 50
  final_lr_fraction: float = 0.1
  weight_decay: float = 0.1
  clip_norm: float = 1.0
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  block_size: int = 128
  min_size: int = 4096
  eval_every: int = 100
  eval_batches: int = 24
  max_bytes: int = data.DEFAULT_MAX_BYTES


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """Every script's help: each flag's default appended once, unless its
  help already says it (or it is a switch, or None)."""

  def _get_help_string(self, action):
    text = action.help or ''
    if ('default' in text.lower() or action.default is None
        or action.default is False or action.default is argparse.SUPPRESS):
      return text
    return text + ' (default: %(default)s)'


_RUN_HELP = {
    'd_model': 'model width',
    'num_layers': 'transformer layers',
    'num_heads': 'attention heads',
    'seq_len': 'bytes per training sequence',
    'batch_size': 'sequences per batch',
    'steps': 'training steps',
    'learning_rate': 'peak learning rate',
    'warmup_steps': 'linear warm-up steps',
    'final_lr_fraction': 'final learning rate of the cosine decay, as a '
                         'fraction of the peak',
    'weight_decay': 'decoupled weight decay (matrices only)',
    'clip_norm': 'global gradient-norm clip',
    'b1': "Adam's first-moment decay",
    'b2': "Adam's second-moment decay",
    'eps': "Adam's eps",
    'block_size': 'elements per scale of the quantized moments',
    'min_size': 'smaller tensors keep float32 state',
    'eval_every': 'steps between validation evaluations',
    'eval_batches': 'validation batches per evaluation',
    'max_bytes': 'bytes of the corpus read',
}


def add_run_args(parser: argparse.ArgumentParser, defaults: RunConfig):
  """Flags for every :class:`RunConfig` field, e.g. ``--d-model 64``."""
  group = parser.add_argument_group('model, data and schedule')
  for field in dataclasses.fields(RunConfig):
    value = getattr(defaults, field.name)
    group.add_argument(
        '--' + field.name.replace('_', '-'), type=type(value), default=value,
        help=f'{_RUN_HELP[field.name]} (default: {value})')
  parser.add_argument(
      '--data', default=None,
      help='train on this text file instead of the standard library sources')


def run_config_from_args(args: argparse.Namespace) -> RunConfig:
  return RunConfig(**{f.name: getattr(args, f.name)
                      for f in dataclasses.fields(RunConfig)})


def _schedule_args(cfg: RunConfig) -> tuple[float, int, int, float]:
  # The warm-up is capped at a fifth of the run, so tiny smoke runs work.
  warmup = min(cfg.warmup_steps, cfg.steps // 5)
  return (cfg.learning_rate, warmup, max(cfg.steps, warmup + 1),
          cfg.learning_rate * cfg.final_lr_fraction)


def schedule(cfg: RunConfig) -> optax.Schedule:
  """Linear warm-up to ``learning_rate``, then cosine to a fraction of it."""
  return _schedule(*_schedule_args(cfg))


def _schedule(peak, warmup, decay_steps, end):
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=peak, warmup_steps=warmup,
      decay_steps=decay_steps, end_value=end)


def _decay_mask(params):
  """Weight decay on matrices only (not on biases and LayerNorm scales)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def make_optimizer(opt: OptConfig, cfg: RunConfig,
                   seed: int) -> optax.GradientTransformation:
  """Clipping, then AdamW with the moments stored as ``opt`` says.

  Cached: calls that would build the same transform get the same object, so
  the training harness reuses its compiled step (only stochastic rounding
  depends on ``seed``).
  """
  return _make_optimizer(
      opt, _schedule_args(cfg), cfg.weight_decay, cfg.clip_norm, cfg.b1,
      cfg.b2, cfg.eps, cfg.block_size, cfg.min_size,
      seed if opt.rounding in ('stochastic', 'hybrid', 'preconditioner')
      else 0)


@functools.lru_cache(maxsize=64)
def _make_optimizer(opt, schedule_args, weight_decay, clip_norm, b1, b2, eps,
                    block_size, min_size, seed):
  common = dict(b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                mask=_decay_mask)
  lr = _schedule(*schedule_args)
  if opt.is_baseline:
    adamw = optax.adamw(lr, **common)
  else:
    adamw = optax_q.adamw(
        lr, **common, mu_format=opt.mu_format, nu_format=opt.nu_format,
        rounding=(HYBRID_ROUNDING if opt.rounding == 'hybrid'
                  else opt.rounding), block_size=block_size, seed=seed,
        min_size=min_size,
        scale_mode=(dict(opt.scale_mode)
                    if isinstance(opt.scale_mode, tuple) else opt.scale_mode))
  return optax.chain(optax.clip_by_global_norm(clip_norm), adamw)


def make_tracked_optimizer(opt: OptConfig, cfg: RunConfig,
                           seed: int) -> optax.GradientTransformation:
  """:func:`make_optimizer`'s transform beside its float32 twin.

  The twin is the same chain (clipping, schedule, weight decay) with float32
  moments, ``make_optimizer(FP32, cfg, seed)``, fed the same gradients and
  params by ``optax_q.track_fidelity`` for the whole run; the updates
  applied are ``opt``'s, bit for bit. Cached like :func:`make_optimizer`:
  runs whose inner transform is the same object get the same wrapper, so
  they share a compiled step.
  """
  return _track_fidelity(make_optimizer(opt, cfg, seed),
                         make_optimizer(FP32, cfg, seed), cfg.steps)


# Keyed on the two transforms themselves (tuples of functions: equal only
# when they are the same objects), which `_make_optimizer` caches.
@functools.lru_cache(maxsize=64)
def _track_fidelity(tx, reference, steps):
  return optax_q.track_fidelity(tx, reference, steps=steps)


def inner_state(state: Any) -> Any:
  """The state of the optimizer itself, without a float32 twin's.

  ``state`` itself unless it is a ``track_fidelity`` state
  (:func:`make_tracked_optimizer`), whose twin's float32 state and params
  copies are not the optimizer's memory.
  """
  if isinstance(state, optax_q.FidelityState):
    return state.inner_state
  return state


# The fidelity of a float32 run to its own twin, without running the twin.
BASELINE_FIDELITY = dict(norm_ratio=1.0, cosine=1.0, weight_distance=0.0)
FIDELITY = tuple(BASELINE_FIDELITY)


def fidelity_means(rows) -> dict[str, float]:
  """Mean over ``rows`` of each fidelity field they have: rows written
  without fidelity (older results, the peers) have none of them, and a
  field no row has is left out."""
  out = {}
  for key in FIDELITY:
    xs = [r[key] for r in rows if r.get(key) is not None]
    if xs:
      out[key] = statistics.fmean(xs)
  return out


def by_config(rows, reference: str):
  """``rows`` grouped by their ``config``, in order, and the mean final
  validation loss of the ``reference`` config (None when it did not run)."""
  by = {}
  for r in rows:
    by.setdefault(r['config'], []).append(r)
  ref = by.get(reference)
  return by, (statistics.mean(r['final_val_loss'] for r in ref)
              if ref else None)


def loss_fields(rows, ref_loss: float | None) -> dict[str, Any]:
  """Mean and spread over the seeds' final validation losses, whether any
  diverged, and the mean's difference from ``ref_loss`` in percent."""
  losses = [r['final_val_loss'] for r in rows]
  finite = all(np.isfinite(losses))
  mean = statistics.mean(losses) if finite else float('nan')
  return dict(
      mean_loss=mean,
      std_loss=(statistics.stdev(losses) if finite and len(losses) > 1
                else 0.0),
      diverged=not finite,
      delta_pct=(100 * (mean / ref_loss - 1) if ref_loss and finite
                 else float('nan')))


def fidelity_fields(state: Any) -> dict[str, float]:
  """``norm_ratio`` and ``cosine`` (medians over the steps) and
  ``weight_distance`` (after the last step) of a tracked run's state."""
  summary = optax_q.fidelity_summary(state)
  return dict(norm_ratio=summary['norm_ratio']['median'],
              cosine=summary['cosine']['median'],
              weight_distance=summary['weight_distance']['last'])


def add_fidelity_arguments(parser: argparse.ArgumentParser) -> None:
  """Adds the studies' ``--fidelity/--no-fidelity`` (each run that is not
  float32 trains beside its float32 twin) and ``--add-fidelity`` (a
  published result gets fidelity columns without rerunning every seed; see
  :func:`merge_fidelity`)."""
  parser.add_argument(
      '--fidelity', action=argparse.BooleanOptionalAction, default=True,
      help='train each run that is not float32 beside its float32 twin '
      '(optax_q.track_fidelity) and report the norm ratio, cosine and '
      'weight distance; the step times then include the twin')
  parser.add_argument(
      '--add-fidelity', action='store_true',
      help='rerun the given --seeds (and configurations) beside their '
      'float32 twins and add their fidelity (update-norm ratio, cosine, '
      'weight distance) to the published rows of the same configuration and '
      'seed in <out>/<name>.json, checking that each rerun reproduces the '
      'published loss; the other fields of the published result are kept')


def merge_fidelity(published: list[dict[str, Any]],
                   measured: Sequence[dict[str, Any]], *,
                   keys: Sequence[str] = ('config', 'seed'),
                   loss: str = 'final_val_loss',
                   command: str, seeds: Sequence[int],
                   float32: Callable[[dict[str, Any]], bool],
                   previous: dict[str, Any] | None = None) -> dict[str, Any]:
  """Copies the fidelity fields of ``measured`` rows into ``published``.

  Each measured row (a rerun of one published run beside its float32 twin,
  ``optax_q.track_fidelity``, whose applied updates are the optimizer's bit
  for bit) is matched with the published row of the same ``keys``; the
  rerun's ``loss`` is compared with the published one, so a result page can
  say whether its fidelity comes from the very runs it quotes (equal
  losses) or from reruns that moved (different code since, or a
  nondeterministic step). Rows without a match raise: fidelity is never
  attached to a run that was not published. The published rows of
  ``seeds`` for which ``float32(row)`` holds are their own twins and get
  :data:`BASELINE_FIDELITY` without a rerun.

  Returns the record to keep in the result's metadata: the command, the
  revision, the date, the seeds, how many rows got fidelity, how many of
  their losses were equal and the largest relative difference; with the
  ``previous`` record of an earlier merge into the same result, the two
  combined (commands joined, seeds and counts added up).
  """
  if not measured:
    raise ValueError('no rerun rows to merge: every configuration asked '
                     'for is float32 or not tracked')
  for rows, what in ((published, 'published'), (measured, 'rerun')):
    keyed = [tuple(r[k] for k in keys) for r in rows]
    if len(set(keyed)) != len(keyed):
      raise ValueError(f'{what} rows are not told apart by {list(keys)}')
  index = {tuple(r[k] for k in keys): r for r in published}
  for row in published:
    if float32(row) and row['seed'] in seeds:
      row.update(BASELINE_FIDELITY)
  equal, worst = 0, 0.0
  for row in measured:
    key = tuple(row[k] for k in keys)
    if key not in index:
      raise KeyError(f'no published row for {dict(zip(keys, key))}')
    target = index[key]
    for field in FIDELITY:
      target[field] = row[field]
    before, after = target.get(loss), row.get(loss)
    if before is not None and after is not None:
      if before == after:
        equal += 1
      elif np.isfinite(before) and np.isfinite(after):
        worst = max(worst, abs(after - before) / max(abs(before), 1e-30))
      else:
        worst = float('inf')
  record = dict(command=command, git_revision=git_revision(),
                date=now_utc(), machine=machine(), seeds=list(seeds),
                rows=len(measured), loss_equal=equal,
                loss_max_relative_difference=worst)
  if previous:
    record.update(
        command=f"{previous['command']}; {command}",
        seeds=sorted(set(previous['seeds']) | set(seeds)),
        rows=previous['rows'] + record['rows'],
        loss_equal=previous['loss_equal'] + equal,
        loss_max_relative_difference=max(
            previous['loss_max_relative_difference'], worst))
  return record


def fidelity_cell(x: float | None) -> str:
  """A fidelity value in a results table: three decimals, '-' for none."""
  return '-' if x is None or x != x else f'{x:.3f}'


def fidelity_provenance(record: dict[str, Any] | None) -> str:
  """One sentence for a results page on where its fidelity columns come
  from: the published runs themselves, or reruns added later
  (:func:`merge_fidelity`'s record)."""
  if not record:
    return ''
  same = record['loss_equal'] == record['rows']
  return (
      f"Fidelity was added by `{record['command']}` "
      f"({record['git_revision']}, {record['date'][:10]}): seeds "
      f"{record['seeds']} rerun beside their float32 twins; "
      + (f"all {record['rows']} reruns reproduced the published loss bit for "
         'bit, so the fidelity is that of the runs in the table'
         if same else
         f"{record['loss_equal']} of {record['rows']} reruns reproduced the "
         'published loss bit for bit, the others within a relative '
         f"{record['loss_max_relative_difference']:.1e}")
      + '. Columns without a value: runs not rerun.')


# ----------------------------------------------------------------------------
# Memory accounting.
# ----------------------------------------------------------------------------


def quantized_fraction(state: Any) -> dict[str, float]:
  """How much of the moment state is stored in a low-precision format.

  Returns:
    ``elements``: fraction of moment elements held in :class:`optax_q.QArray`
    leaves; ``leaves``: fraction of moment leaves that are quantized.
  """
  q_elems = total_elems = q_leaves = total_leaves = 0
  for x in jax.tree.leaves(state, is_leaf=optax_q.is_qarray):
    if optax_q.is_qarray(x):
      size, quantized = int(np.prod(x.shape)), True
    elif (hasattr(x, 'shape') and len(x.shape) >= 1
          and jnp.issubdtype(x.dtype, jnp.floating)):
      size, quantized = int(np.prod(x.shape)), False
    else:
      continue  # counters and other scalars
    total_elems += size
    total_leaves += 1
    if quantized:
      q_elems += size
      q_leaves += 1
  return dict(elements=q_elems / max(total_elems, 1),
              leaves=q_leaves / max(total_leaves, 1))


# ----------------------------------------------------------------------------
# Runs.
# ----------------------------------------------------------------------------


def load_corpus(cfg: RunConfig, path: str | None = None) -> data.Corpus:
  return data.load_corpus(path, max_bytes=cfg.max_bytes)


def make_model(cfg: RunConfig) -> gpt.GPT:
  """The GPT of ``cfg`` (cached, so runs share compiled steps)."""
  return _make_model(cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.seq_len)


@functools.lru_cache(maxsize=8)
def _make_model(d_model, num_layers, num_heads, seq_len):
  return gpt.GPT(d_model=d_model, num_layers=num_layers,
                 num_heads=num_heads, max_len=seq_len)


@functools.lru_cache(maxsize=8)
def _param_init_fn(model: gpt.GPT):
  tokens = jnp.zeros((1, model.max_len), jnp.int32)
  return jax.jit(
      lambda rng: flax.linen.meta.unbox(model.init(rng, tokens)['params']))


def init_params(model: gpt.GPT, seed: int) -> Any:
  """The params of ``seed`` (as :func:`models.sharding.init_params`, but the
  jitted initialiser is compiled once per model)."""
  return _param_init_fn(model)(jax.random.key(seed))


def gpt_dims(params):
  """Muon's axes for the GPT: the blocks' kernels (3-D attention kernels
  reduce over the model axis); embeddings, head, biases and norms: Adam."""
  dims = optax.contrib.MuonDimensionNumbers

  def rule(path, leaf):
    names = [getattr(k, 'key', '') for k in path]
    if not names[0].startswith('block_') or names[-1] != 'kernel':
      return None
    if leaf.ndim == 2:
      return dims(0, 1)
    if names[-2] == 'out':
      return dims((0, 1), 2)
    return dims(0, (1, 2))

  return jax.tree_util.tree_map_with_path(rule, params)


def eval_batches(cfg: RunConfig, corpus: data.Corpus):
  return data.lm_eval_batches(corpus.val, cfg.batch_size, cfg.seq_len,
                              num_batches=cfg.eval_batches)


_EVAL_FNS = {}


def make_eval_fn(cfg: RunConfig, corpus: data.Corpus) -> train.EvalFn:
  """Validation loss on fixed batches (cached: it compiles once)."""
  key = (corpus.fingerprint['sha256'], cfg.batch_size, cfg.seq_len,
         cfg.eval_batches)
  if key not in _EVAL_FNS:
    _EVAL_FNS[key] = train.make_eval_fn(eval_batches(cfg, corpus))
  return _EVAL_FNS[key]


def run(
    opt: OptConfig,
    cfg: RunConfig,
    corpus: data.Corpus,
    *,
    seed: int = 0,
    model: gpt.GPT | None = None,
    eval_fn: train.EvalFn | None = None,
    progress: bool = True,
    metrics_path: str | os.PathLike[str] | None = None,
    fidelity: bool = False,
) -> tuple[dict[str, Any], train.TrainResult]:
  """Train once; returns ``(row, result)``.

  ``row`` holds the measured fields of one table row: ``config``, ``seed``,
  ``final_val_loss``, ``final_train_loss``, ``state_bytes``,
  ``state_bits_per_element``, ``quantized_elements``, ``quantized_leaves``,
  ``step_ms_median`` (compilation step excluded) and ``compile_s`` (the
  first step, including compilation).

  With ``fidelity``, a low-precision run trains beside its float32 twin
  (:func:`make_tracked_optimizer`) and ``row`` also holds ``norm_ratio``
  and ``cosine`` (medians over the steps) and ``weight_distance`` (after
  the last step), as ``optax_q.fidelity_summary`` gives them; the fp32
  baseline runs alone and gets 1, 1 and 0. The memory fields count the
  optimizer's own state, not the twin's; the step times include the twin.

  Pass the same ``model`` and ``eval_fn`` objects to several runs so that
  the forward pass and the evaluation compile once.
  """
  model = model or make_model(cfg)
  eval_fn = eval_fn or make_eval_fn(cfg, corpus)
  params = init_params(model, seed)
  tracked = fidelity and not opt.is_baseline
  tx = (make_tracked_optimizer if tracked else make_optimizer)(opt, cfg, seed)
  result = train.train(
      model, params, tx,
      data.lm_batches(corpus.train, cfg.batch_size, cfg.seq_len, seed=seed),
      steps=cfg.steps, loss_fn=train.lm_loss, eval_fn=eval_fn,
      eval_every=cfg.eval_every, progress=progress, desc=opt.name,
      # `seed` here only keys an `rng` for the loss, which `lm_loss` does
      # not take; a fixed value lets seeds share one compiled step.
      metrics_path=metrics_path, seed=0,
      metadata=dict(config=opt.name, seed=seed,
                    run_config=dataclasses.asdict(cfg),
                    opt_config=dataclasses.asdict(opt),
                    corpus=corpus.fingerprint))
  state = inner_state(result.opt_state)
  times = result.step_times[1:] if len(result.step_times) > 1 else (
      result.step_times)
  frac = quantized_fraction(state)
  row = dict(
      config=opt.name,
      seed=seed,
      mu_format=opt.mu_format,
      nu_format=opt.nu_format,
      rounding=opt.rounding or 'none',
      final_val_loss=float(result.eval_losses[-1]),
      final_train_loss=float(result.final_loss),
      state_bytes=int(optax_q.state_nbytes(state)),
      state_bits_per_element=float(optax_q.state_bits_per_element(state)),
      quantized_elements=frac['elements'],
      quantized_leaves=frac['leaves'],
      step_ms_median=1e3 * float(np.median(times)),
      compile_s=float(result.step_times[0]),
  )
  if tracked:
    row.update(fidelity_fields(result.opt_state))
  elif fidelity:
    row.update(BASELINE_FIDELITY)
  return row, result


# ----------------------------------------------------------------------------
# Where results go.
# ----------------------------------------------------------------------------


def default_out(script: str) -> str:
  """``runs/<script name>`` in the repository: every script's ``--out``.

  ``runs/`` is git-ignored, so trying a script never edits the checkout.
  The published results are written only when asked for, with
  ``--out docs/results`` (and ``--doc docs/<page>.md`` for a page that
  quotes them), as the commands in ``docs/`` do.
  """
  return str(ROOT / 'runs' / pathlib.Path(script).stem)


def add_out_argument(parser, script: str) -> None:
  """Adds every script's ``--out`` (default :func:`default_out`)."""
  name = pathlib.Path(script).stem
  parser.add_argument(
      '--out', default=default_out(script),
      help=f'output directory (default: runs/{name}; docs/results for the '
      'published results)')


# ----------------------------------------------------------------------------
# Provenance.
# ----------------------------------------------------------------------------


def command_line(script: str | None = None,
                 argv: Sequence[str] | None = None) -> str:
  """``python <script relative to the repo> <args>``, shell-quoted.

  Defaults to ``sys.argv``; scripts whose ``main(argv)`` is called directly
  (as the tests do) pass ``__file__`` and ``argv``.
  """
  path = pathlib.Path(script or sys.argv[0]).resolve()
  try:
    path = path.relative_to(ROOT)
  except ValueError:
    path = pathlib.Path(path.name)
  argv = sys.argv[1:] if argv is None else argv
  return shlex.join(['python', path.as_posix(), *argv])


def git_revision() -> str:
  """``git describe``-like revision of the checkout, ``+dirty`` if edited."""
  def git(*args):
    return subprocess.run(
        ['git', *args], cwd=ROOT, capture_output=True, text=True,
        check=True).stdout.strip()
  try:
    rev = git('rev-parse', '--short=12', 'HEAD')
    dirty = git('status', '--porcelain', '--untracked-files=no')
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return rev + ('+dirty' if dirty else '')


def git_modified_paths() -> list[str]:
  """Tracked files that differ from the revision (so results can say so)."""
  try:
    out = subprocess.run(
        ['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
        capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return []
  return sorted(line[3:] for line in out.splitlines() if line.strip())


def _cpu_model() -> str:
  try:
    for line in pathlib.Path('/proc/cpuinfo').read_text().splitlines():
      if line.startswith('model name'):
        return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _available_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def load_average() -> str:
  try:
    return '/'.join(f'{x:.1f}' for x in os.getloadavg())
  except OSError:
    return 'n/a'


def package_versions() -> str:
  """Versions of the packages whose numerics a training run depends on.

  Losses are reproducible bit for bit only with the same versions: a
  different flax, optax or jaxlib can change rounding, and training
  amplifies it.
  """
  out = []
  for name in ('jaxlib', 'optax', 'flax', 'numpy', 'ml_dtypes'):
    try:
      out.append(f'{name} {importlib.metadata.version(name)}')
    except importlib.metadata.PackageNotFoundError:
      pass
  return ', '.join(out)


def machine() -> str:
  """One line: CPU, cores, OS, Python, jax and backend (no host names)."""
  dev = jax.devices()[0]
  return (f'{_cpu_model()}, {_available_cores()} cores, '
          f'{platform.system()} {platform.machine()}, '
          f'Python {platform.python_version()}, jax {jax.__version__} '
          f'({dev.platform}); {package_versions()}')


def now_utc() -> str:
  return datetime.datetime.now(datetime.timezone.utc).strftime(
      '%Y-%m-%dT%H:%M:%SZ')


# ----------------------------------------------------------------------------
# Tables.
# ----------------------------------------------------------------------------


def markdown_table(header: Sequence[str],
                   rows: Sequence[Sequence[Any]]) -> str:
  """A GitHub markdown table; a ``|`` in a cell is escaped (``\\|``)."""
  cells = lambda r: ' | '.join(str(c).replace('|', r'\|') for c in r)
  lines = ['| ' + cells(header) + ' |',
           '|' + '|'.join('---' for _ in header) + '|']
  lines += ['| ' + cells(r) + ' |' for r in rows]
  return '\n'.join(lines)


def text_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  """A fixed-width text table for the terminal."""
  cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
  fmt = lambda r: '  '.join(
      c.ljust(w) if i == 0 else c.rjust(w)
      for i, (c, w) in enumerate(zip(r, widths)))
  rule = '-' * len(fmt(cells[0]))
  return '\n'.join([fmt(cells[0]), rule] + [fmt(r) for r in cells[1:]])


def torch_state_bytes(opt) -> int:
  """Bytes of every distinct tensor buffer in a torch optimizer's state."""
  import torch  # pylint: disable=g-import-not-at-top
  seen, total = set(), 0

  def add(t):
    nonlocal total
    if hasattr(t, '__tensor_flatten__') and type(t) is not torch.Tensor:
      names, _ = t.__tensor_flatten__()
      for n in names:
        add(getattr(t, n))
      return
    key = (t.untyped_storage().data_ptr(), t.numel(), t.dtype)
    if key not in seen:
      seen.add(key)
      total += t.numel() * t.element_size()

  for s in opt.state.values():
    for v in s.values():
      if isinstance(v, torch.Tensor):
        add(v)
  return total
