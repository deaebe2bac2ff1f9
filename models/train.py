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
"""A small training harness for the examples and studies.

It lives outside the core library on purpose: :mod:`optax_q` transforms are
plain Optax transforms and need no special loop. This harness adds what the
examples share: a jitted, donating train step; a tqdm progress bar with loss
and throughput; metrics as JSON and CSV; loss-curve plots; Orbax checkpoints
with bit-identical resume; and data-parallel, tensor-parallel and
multi-process (``jax.distributed``) runs on a ``('data', 'model')`` mesh.

Step numbering: update ``s`` (1-based) uses the batch ``batches(s - 1)`` and
the PRNG key ``fold_in(key(seed), s - 1)``; ``losses[s - 1]`` is its loss and
an evaluation "at step ``s``" sees the params after ``s`` updates. Because the
batch and key are functions of the step number only, a run resumed from a
checkpoint at step ``k`` repeats the uninterrupted run exactly.

Example::

  from models import data, gpt, sharding, train
  corpus = data.stdlib_corpus()
  model = gpt.GPT(d_model=128, num_layers=2, num_heads=4, max_len=128)
  params = sharding.init_params(model, jnp.zeros((1, 128), jnp.int32))
  result = train.train(
      model, params, optax.adamw(1e-3),
      data.lm_batches(corpus.train, 16, 128, seed=0),
      steps=500, loss_fn=train.lm_loss, eval_every=100,
      eval_fn=train.make_eval_fn(
          data.lm_eval_batches(corpus.val, 16, 128, num_batches=8)),
      metadata={'corpus': corpus.fingerprint})
  train.plot_curves({'adamw': result}, 'curves.png')
"""

from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
import csv
import dataclasses
import inspect
import json
import math
import os
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import numpy as np
import optax
import optax_q

from models import sharding as sharding_lib

Batch = Any
LossFn = Callable[..., Any]
EvalFn = Callable[[Any, Any], float | Mapping[str, float]]


# ----------------------------------------------------------------------------
# Losses and evaluation.
# ----------------------------------------------------------------------------


def lm_loss(model, params, batch) -> jax.Array:
  """Mean next-token cross entropy (nats per token) of ``(inputs, targets)``."""
  inputs, targets = batch
  logits = model.apply({'params': params}, inputs)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, targets).mean()


def classification_loss(model, params, batch) -> jax.Array:
  """Mean softmax cross entropy of ``(x, labels)``."""
  x, labels = batch
  logits = model.apply({'params': params}, x)
  return optax.softmax_cross_entropy_with_integer_labels(
      logits, labels).mean()


def accuracy(model, params, batch) -> jax.Array:
  """Top-1 accuracy of ``(x, labels)``."""
  x, labels = batch
  logits = model.apply({'params': params}, x)
  return jnp.mean(jnp.argmax(logits, axis=-1) == labels)


def _scalar(out):
  return out[0] if isinstance(out, tuple) else out


def place_batch(batch: Batch, mesh: Mesh | None) -> Batch:
  """Put a *global* host batch on ``mesh``, leading axis split over ``'data'``.

  Every process passes the same global batch and contributes the rows of its
  own devices (:func:`jax.make_array_from_callback`), so the same code runs
  on one device, on a single-process mesh and under ``jax.distributed``.
  Without a mesh the batch goes to the default device.
  """
  if mesh is None:
    return jax.tree.map(jnp.asarray, batch)
  shard = NamedSharding(mesh, P('data'))
  n_data = mesh.shape['data']

  def put(a):
    a = np.asarray(a)
    if a.ndim == 0 or a.shape[0] % n_data:
      raise ValueError(
          f'batch axis {a.shape[:1]} is not divisible by the data axis '
          f'({n_data})')
    return jax.make_array_from_callback(a.shape, shard, lambda idx: a[idx])

  return jax.tree.map(put, batch)


def make_eval_fn(
    batches: Iterable[Batch],
    loss_fn: LossFn = lm_loss,
    *,
    metrics: Mapping[str, LossFn] | None = None,
    mesh: Mesh | None = None,
) -> EvalFn:
  """An ``eval_fn(model, params) -> dict`` averaging over fixed batches.

  Args:
    batches: the validation batches (a list; iterated on every call).
    loss_fn: reported as ``'loss'``.
    metrics: more ``name -> fn(model, params, batch)`` to average, e.g.
      ``{'accuracy': accuracy}``.
    mesh: place each batch over ``'data'`` of this mesh (as in training).

  Returns:
    A function returning ``{'loss': ..., **metrics}`` as Python floats.
  """
  batches = list(batches)
  fns = {'loss': loss_fn, **(metrics or {})}
  cache = {}

  def eval_fn(model, params):
    if model not in cache:
      def evaluate(p, batch):
        p = optax_q.dequantize_params(p)  # Quantized params: decoded here.
        return {k: _scalar(f(model, p, batch)) for k, f in fns.items()}
      cache[model] = jax.jit(evaluate)
    totals = {k: 0.0 for k in fns}
    for batch in batches:
      out = cache[model](params, place_batch(batch, mesh))
      for k, v in out.items():
        totals[k] += float(v)
    return {k: v / len(batches) for k, v in totals.items()}

  return eval_fn


# ----------------------------------------------------------------------------
# Results and metrics files.
# ----------------------------------------------------------------------------


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  Attributes:
    losses: float64 ``(final_step,)``: training loss of every update
      (including updates restored from a checkpoint's history).
    step_times: float64 ``(final_step,)``: wall seconds per update
      (the first update of a call includes compilation).
    eval_steps: steps at which ``eval_fn`` ran.
    evals: one dict of metrics per entry of ``eval_steps``.
    train_metrics: auxiliary per-update metrics returned by ``loss_fn``.
    params: final params (``jax.Array``s, placed as in training).
    opt_state: final optimizer state.
    start_step: the step this call started from (> 0 after a resume).
    final_step: number of updates applied.
    unit: ``'tokens'`` or ``'examples'``.
    items_per_step: tokens or examples per update.
    metadata: user metadata (config, corpus fingerprint, ...).
  """

  losses: np.ndarray
  step_times: np.ndarray
  eval_steps: list[int]
  evals: list[dict[str, float]]
  train_metrics: dict[str, list[float]]
  params: Any
  opt_state: Any
  start_step: int
  final_step: int
  unit: str
  items_per_step: int
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def eval_losses(self) -> np.ndarray:
    """``evals[i]['loss']`` as an array."""
    return np.asarray([e.get('loss', np.nan) for e in self.evals])

  @property
  def final_loss(self) -> float:
    """Training loss of the last update."""
    return float(self.losses[-1]) if len(self.losses) else math.nan

  def throughput(self, skip: int = 1) -> float:
    """Items/second over this call's updates, skipping ``skip`` (compile)."""
    times = self.step_times[self.start_step:][skip:]
    if not len(times):
      times = self.step_times[self.start_step:]
    return self.items_per_step * len(times) / max(float(np.sum(times)), 1e-12)

  def to_dict(self) -> dict[str, Any]:
    """JSON-serialisable summary (no params, no state)."""
    return dict(
        metadata=self.metadata,
        unit=self.unit,
        items_per_step=self.items_per_step,
        start_step=self.start_step,
        final_step=self.final_step,
        final_loss=self.final_loss,
        throughput=self.throughput(),
        steps=list(range(1, self.final_step + 1)),
        losses=[float(x) for x in self.losses],
        step_times=[float(x) for x in self.step_times],
        eval_steps=list(self.eval_steps),
        evals=self.evals,
        train_metrics=self.train_metrics,
    )


def _history(result_like) -> dict[str, Any]:
  if isinstance(result_like, TrainResult):
    return result_like.to_dict()
  if isinstance(result_like, (str, os.PathLike)):
    path = pathlib.Path(result_like)
    if path.suffix != '.json':
      path = path.with_suffix('.json')
    return json.loads(path.read_text())
  return dict(result_like)


def _stem(path: str | os.PathLike[str]) -> pathlib.Path:
  path = pathlib.Path(path)
  return path.with_suffix('') if path.suffix in ('.json', '.csv') else path


def write_metrics(result: TrainResult, path: str | os.PathLike[str]) -> None:
  """Write ``<path>.json`` (full history) and ``<path>.csv`` (one row/step).

  ``path`` may end in ``.json`` or ``.csv``; both files are written. Only
  process 0 writes.
  """
  if jax.process_index() != 0:
    return
  stem = _stem(path)
  stem.parent.mkdir(parents=True, exist_ok=True)
  hist = result.to_dict()
  stem.with_suffix('.json').write_text(json.dumps(hist, indent=1) + '\n')
  eval_keys = sorted({k for e in hist['evals'] for k in e})
  aux_keys = sorted(hist['train_metrics'])
  evals = dict(zip(hist['eval_steps'], hist['evals']))
  with stem.with_suffix('.csv').open('w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['step', 'loss', 'step_time', *aux_keys,
                     *(f'eval_{k}' for k in eval_keys)])
    for i, step in enumerate(hist['steps']):
      e = evals.get(step, {})
      writer.writerow([
          step, hist['losses'][i], hist['step_times'][i],
          *(hist['train_metrics'][k][i] for k in aux_keys),
          *(e.get(k, '') for k in eval_keys)])


def _ema(x: np.ndarray, decay: float) -> np.ndarray:
  """Debiased exponential moving average (as TensorBoard's smoothing)."""
  out, acc = np.empty_like(x), 0.0
  for i, v in enumerate(x):
    acc = decay * acc + (1 - decay) * v
    out[i] = acc / (1 - decay ** (i + 1))
  return out


def plot_curves(
    results: Mapping[str, Any],
    path: str | os.PathLike[str],
    *,
    smoothing: float = 0.9,
    title: str | None = None,
    log_y: bool = False,
    labels: Mapping[str, str] | None = None,
) -> pathlib.Path:
  """Plot training and evaluation loss curves of several runs into one image.

  Uses Matplotlib's Agg canvas directly (no pyplot, no global backend).

  Args:
    results: ``name -> TrainResult``, a :meth:`TrainResult.to_dict` dict, or
      the path of a metrics JSON written by :func:`write_metrics`.
    path: output image (``.png``, ``.pdf``, ``.svg``).
    smoothing: EMA decay applied to the training loss (0 disables); the raw
      curve is drawn faintly behind.
    title: figure title.
    log_y: logarithmic loss axis.
    labels: ``name -> legend text`` (e.g. with the state memory of each
      run); the name by default.

  Returns:
    The path written.
  """
  # pylint: disable-next=import-outside-toplevel
  from matplotlib.figure import Figure

  fig = Figure(figsize=(11, 4), layout='constrained')
  ax_train, ax_eval = fig.subplots(1, 2)
  styles = ('-', '--', ':', '-.')
  for i, (name, res) in enumerate(results.items()):
    hist = _history(res)
    # Curves that nearly coincide stay visible: each its own line style and
    # marker, the first run (the reference) drawn on top.
    line = dict(color=f'C{i % 10}', ls=styles[i % len(styles)],
                zorder=3 if i == 0 else 2,
                label=(labels or {}).get(name, name))
    steps = np.asarray(hist['steps'])
    losses = np.asarray(hist['losses'], dtype=np.float64)
    if smoothing:
      ax_train.plot(steps, losses, color=line['color'], alpha=0.15, lw=0.8)
      ax_train.plot(steps, _ema(losses, smoothing), **line)
    else:
      ax_train.plot(steps, losses, **line)
    if hist['evals']:
      ev = [e.get('loss', np.nan) for e in hist['evals']]
      ax_eval.plot(hist['eval_steps'], ev, marker='osD^'[i % 4],
                   markerfacecolor='none', **line)
  train_label = (f'train loss (EMA {smoothing:g} of the per-step loss; raw '
                 'faint)' if smoothing else 'train loss')
  for ax, label in ((ax_train, train_label), (ax_eval, 'validation loss')):
    ax.set_xlabel('step')
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    if log_y:
      ax.set_yscale('log')
    if ax.has_data():
      ax.legend()
  if title:
    fig.suptitle(title)
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  return path


# ----------------------------------------------------------------------------
# Checkpoints.
# ----------------------------------------------------------------------------


def _abstract(tree: Any) -> Any:
  return jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      tree)


def _checkpoint_manager(ckpt_dir, keep: int | None):
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  # Synchronous saves: the next (donating) step may reuse the buffers.
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=False)
  return ocp.CheckpointManager(
      os.path.abspath(os.fspath(ckpt_dir)), options=options)


def save_checkpoint(mgr, step: int, params, opt_state, history) -> None:
  """Save params, opt_state and the JSON history at ``step``."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  mgr.save(step, args=ocp.args.Composite(
      params=ocp.args.StandardSave(params),
      opt_state=ocp.args.StandardSave(opt_state),
      history=ocp.args.JsonSave(history)), force=True)
  mgr.wait_until_finished()


def restore_checkpoint(mgr, step: int, abstract_params, abstract_state):
  """Restore ``(params, opt_state, history)`` into abstract targets."""
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  out = mgr.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract_params),
      opt_state=ocp.args.StandardRestore(abstract_state),
      history=ocp.args.JsonRestore()))
  return out['params'], out['opt_state'], out['history']


# ----------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------


def _count_items(batch: Batch, unit: str | None) -> tuple[str, int]:
  first = np.asarray(jax.tree.leaves(batch)[0])
  if unit is None:
    unit = ('tokens' if np.issubdtype(first.dtype, np.integer)
            and first.ndim >= 2 else 'examples')
  if unit == 'tokens':
    return unit, int(first.size)
  if unit == 'examples':
    return unit, int(first.shape[0])
  raise ValueError(f"unit must be 'tokens' or 'examples', got {unit!r}")


def _copy(tree: Any) -> Any:
  return jax.tree.map(jnp.copy, tree)


def _copy_tree(tree: Any, shardings: Any | None) -> Any:
  """Fresh buffers (placed with ``shardings``), so donation never deletes
  the caller's arrays."""
  if shardings is None:
    return jax.jit(_copy)(tree)
  return jax.jit(_copy, out_shardings=shardings)(tree)


def _wants_rng(loss_fn: LossFn) -> bool:
  try:
    return 'rng' in inspect.signature(loss_fn).parameters
  except (TypeError, ValueError):
    return False


def _hashable(tree: Any) -> Any:
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(leaves)


# Compiled train steps, reused across `train` calls with the same model,
# transform, loss and shardings (e.g. a run and its resumption). Entries hold
# strong references, so the ids in a key cannot be reused while cached.
_STEP_CACHE: dict[Any, Any] = {}
_STEP_CACHE_SIZE = 16


def _train_step_fn(model, tx, loss_fn, seed, out_shardings):
  """The jitted, donating train step (cached)."""
  key = (id(model), id(tx), id(loss_fn), seed,
         None if out_shardings is None else _hashable(out_shardings))
  hit = _STEP_CACHE.get(key)
  if hit is not None and all(
      a is b for a, b in zip(hit[0], (model, tx, loss_fn))):
    return hit[1]

  wants_rng = _wants_rng(loss_fn)
  base_key = jax.random.key(seed)

  def train_step(p, s, batch, step):
    def objective(p_):
      kwargs = {'rng': jax.random.fold_in(base_key, step)} if wants_rng else {}
      out = loss_fn(model, p_, batch, **kwargs)
      return out if isinstance(out, tuple) else (out, {})
    # Quantized parameters (optax_q.QArray leaves) are decoded here, inside
    # the compiled step, and replaced by the new ones the optimizer
    # returns; plain parameters take optax.apply_updates.
    (loss, aux), grads = jax.value_and_grad(objective, has_aux=True)(
        optax_q.dequantize_params(p))
    updates, s = tx.update(grads, s, p)
    p = optax_q.apply_updates(p, updates)
    return p, s, (loss, aux)

  kwargs = {} if out_shardings is None else {'out_shardings': out_shardings}
  fn = jax.jit(train_step, donate_argnums=(0, 1), **kwargs)
  if len(_STEP_CACHE) >= _STEP_CACHE_SIZE:
    _STEP_CACHE.pop(next(iter(_STEP_CACHE)))
  _STEP_CACHE[key] = ((model, tx, loss_fn), fn)
  return fn


def train(
    model: Any,
    params: Any,
    tx: optax.GradientTransformation,
    batches: Callable[[int], Batch] | Iterable[Batch],
    *,
    steps: int,
    loss_fn: LossFn = lm_loss,
    eval_fn: EvalFn | None = None,
    eval_every: int | None = None,
    ckpt_dir: str | os.PathLike[str] | None = None,
    ckpt_every: int | None = None,
    keep_checkpoints: int | None = 2,
    resume: bool = False,
    mesh: Mesh | None = None,
    param_shardings: Any | None = None,
    opt_state: Any | None = None,
    opt_state_shardings: Any | None = None,
    metrics_path: str | os.PathLike[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool = True,
    desc: str | None = None,
    unit: str | None = None,
    seed: int = 0,
    after_step: Callable[[int, Any], Any] | None = None,
) -> TrainResult:
  """Train ``model`` with ``tx`` for ``steps`` updates.

  Args:
    model: a Flax module (passed to ``loss_fn`` and ``eval_fn``).
    params: initial params: plain arrays, or with ``optax_q.QArray`` leaves
      (from ``optax_q.quantize_params``, trained with ``optax_q.eco``),
      which the step decodes for the forward pass. They are copied, so the
      caller's arrays survive the donating train step. With a ``mesh``,
      quantized params take ``param_shardings`` and
      ``opt_state_shardings`` from ``optax_q.state_shardings``.
    tx: any Optax transform; its state may hold custom pytree nodes.
    batches: ``step -> batch`` (e.g. :func:`models.data.lm_batches`), which
      makes resume exact; or an iterable of batches, of which the first
      ``start_step`` are skipped on resume. Batches are *global* (every
      process passes the same batch under ``jax.distributed``).
    steps: total number of updates (counting those before a resume).
    loss_fn: ``loss_fn(model, params, batch) -> loss`` or ``(loss, aux)``
      with ``aux`` a dict of scalars. If it has an ``rng`` parameter it gets
      ``rng=jax.random.fold_in(jax.random.key(seed), step)``.
    eval_fn: ``eval_fn(model, params) -> float | dict`` (see
      :func:`make_eval_fn`), run every ``eval_every`` steps and at the end.
    eval_every: evaluation period in steps.
    ckpt_dir: Orbax checkpoint directory (params, opt_state, history).
    ckpt_every: checkpoint period; a checkpoint is also written at the end.
    keep_checkpoints: how many checkpoints to keep (``None``: all).
    resume: restore the latest checkpoint in ``ckpt_dir`` if there is one.
    mesh: a ``('data', 'model')`` mesh; batches are split over ``'data'``.
    param_shardings: shardings of ``params`` on ``mesh`` (e.g. from
      :func:`models.sharding.init_sharded`); replicated if omitted.
    opt_state: initial optimizer state; ``tx.init(params)`` if omitted.
    opt_state_shardings: shardings (or a prefix tree) for the state; by
      default each state leaf follows its param
      (:func:`models.sharding.opt_state_shardings`).
    metrics_path: write ``<path>.json`` and ``<path>.csv`` at the end.
    metadata: recorded in the result and the metrics files.
    progress: show a tqdm bar (process 0 only).
    desc: progress-bar label.
    unit: ``'tokens'`` or ``'examples'`` for the throughput; inferred from
      the batch (integer ``(batch, length)`` inputs count tokens).
    seed: seed of the per-step PRNG key given to ``loss_fn``.
    after_step: ``after_step(step, opt_state) -> opt_state``, called after
      each update with the number of updates applied, outside the compiled
      step (e.g. ``optax_q.relayout(state, step=step)``). A state of a new
      structure compiles the step once for it; with a ``mesh`` its
      buffers keep the placement ``after_step`` gave them (pass
      ``param_shardings`` to ``optax_q.relayout``).

  Returns:
    A :class:`TrainResult`.
  """
  if steps < 0:
    raise ValueError(f'steps must be >= 0, got {steps}')
  get_batch = batches if callable(batches) else None
  batch_iter = None

  # Placement. Copies protect the caller's buffers from donation.
  if mesh is not None:
    rep = sharding_lib.replicated(mesh)
    if param_shardings is None:
      param_shardings = jax.tree.map(lambda _: rep, params)
    params = _copy_tree(params, param_shardings)
    if opt_state_shardings is None:
      opt_state_shardings = sharding_lib.opt_state_shardings(
          tx, params, param_shardings, mesh)
    if opt_state is None:
      opt_state = jax.jit(tx.init, out_shardings=opt_state_shardings)(params)
    else:
      opt_state = _copy_tree(opt_state, opt_state_shardings)
    out_shardings = (param_shardings, opt_state_shardings, rep)
  else:
    rep = None
    params = _copy_tree(params, None)
    opt_state = (jax.jit(tx.init)(params) if opt_state is None
                 else _copy_tree(opt_state, None))
    out_shardings = None
  # Full-structure shardings of the actual state (prefix trees resolved).
  state_shardings = jax.tree.map(lambda x: x.sharding, opt_state)

  step_fn = _train_step_fn(model, tx, loss_fn, seed, out_shardings)

  # History (restored on resume).
  unit_name, items = 'examples', 0
  losses, times, evals, eval_steps = [], [], [], []
  aux_hist: dict[str, list[float]] = {}
  start_step = 0
  mgr = None
  if ckpt_dir is not None:
    mgr = _checkpoint_manager(ckpt_dir, keep_checkpoints)
    latest = mgr.latest_step() if resume else None
    if latest is not None:
      abstract_state = jax.tree.map(
          lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
          jax.eval_shape(tx.init, params), state_shardings)
      params, opt_state, hist = restore_checkpoint(
          mgr, latest, _abstract(params), abstract_state)
      start_step = int(latest)
      losses = list(hist['losses'])[:start_step]
      times = list(hist['step_times'])[:start_step]
      keep = [i for i, e in enumerate(hist['eval_steps']) if e <= start_step]
      eval_steps = [hist['eval_steps'][i] for i in keep]
      evals = [hist['evals'][i] for i in keep]
      unit_name, items = hist['unit'], int(hist['items_per_step'])
      aux_hist = {k: list(v)[:start_step]
                  for k, v in hist['train_metrics'].items()}

  def next_batch(step):
    nonlocal batch_iter
    if get_batch is not None:
      return get_batch(step)
    if batch_iter is None:
      batch_iter = iter(batches)
      for _ in range(step):
        next(batch_iter)
    return next(batch_iter)

  metadata = dict(metadata or {})

  def snapshot(final_step):
    return TrainResult(
        losses=np.asarray(losses, np.float64),
        step_times=np.asarray(times, np.float64),
        eval_steps=list(eval_steps), evals=list(evals),
        train_metrics={k: list(v) for k, v in aux_hist.items()},
        params=params, opt_state=opt_state, start_step=start_step,
        final_step=final_step, unit=unit_name, items_per_step=items,
        metadata=metadata)

  def run_eval(step):
    out = eval_fn(model, params)
    out = dict(out) if isinstance(out, Mapping) else {'loss': float(out)}
    eval_steps.append(step)
    evals.append({k: float(v) for k, v in out.items()})
    return evals[-1]

  show = progress and jax.process_index() == 0
  bar = None
  if show and steps > start_step:
    from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
    # Redirected to a log, the bar updates every 30 s instead of twice a
    # second, so the log does not fill with progress lines.
    interactive = getattr(sys.stderr, 'isatty', lambda: False)()
    bar = tqdm(total=steps, initial=start_step, desc=desc, dynamic_ncols=True,
               mininterval=0.5 if interactive else 30.0)
  postfix = {}
  step = start_step
  try:
    if step < steps:
      host_batch = next_batch(step)
      unit_name, items = _count_items(host_batch, unit)
      batch = place_batch(host_batch, mesh)
    while step < steps:
      t0 = time.perf_counter()
      params, opt_state, (loss, aux) = step_fn(
          params, opt_state, batch, jnp.asarray(step, jnp.int32))
      step += 1
      if after_step is not None:
        before = jax.tree.structure(opt_state)
        opt_state = after_step(step, opt_state)
        if mesh is not None and jax.tree.structure(opt_state) != before:
          out_shardings = (param_shardings, jax.tree.map(
              lambda x: x.sharding, opt_state), rep)
          step_fn = _train_step_fn(model, tx, loss_fn, seed, out_shardings)
      if step < steps:  # Overlap host-side batch preparation with compute.
        batch = place_batch(next_batch(step), mesh)
      loss = float(loss)
      dt = time.perf_counter() - t0
      losses.append(loss)
      times.append(dt)
      for k, v in aux.items():
        aux_hist.setdefault(k, []).append(float(v))
      if eval_fn is not None and (
          step == steps or (eval_every and step % eval_every == 0)):
        postfix['val'] = f"{run_eval(step).get('loss', math.nan):.4f}"
      if mgr is not None and (
          step == steps or (ckpt_every and step % ckpt_every == 0)):
        save_checkpoint(mgr, step, params, opt_state,
                        snapshot(step).to_dict())
      if bar is not None:
        postfix['loss'] = f'{loss:.4f}'
        unit_short = 'tok' if unit_name == 'tokens' else 'ex'
        postfix[f'{unit_short}/s'] = f'{items / max(dt, 1e-9):,.0f}'
        bar.set_postfix(postfix, refresh=False)
        bar.update(1)
  finally:
    if bar is not None:
      bar.close()
    if mgr is not None:
      mgr.close()

  result = snapshot(step)
  if metrics_path is not None:
    write_metrics(result, metrics_path)
  return result
