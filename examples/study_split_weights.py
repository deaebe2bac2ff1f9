"""Split master weights against float32 master weights and ECO.

The small GPT of the ECO study (:mod:`models.gpt` on the byte-level corpus,
AdamW b1 0.9, b2 0.999, eps 1e-8, weight decay 0.1 on matrices, clipping at
1.0, warm-up then cosine; the same seeds and steps), with 8-bit moments
(``int8_dynamic``, block 128) throughout:

* ``fp32 MW + m8/v8``: float32 weights (the master weights), the forward
  pass on them;
* ``bf16 w/ MW + m8/v8``: float32 master weights, the forward pass on their
  bf16 rounding (gradient straight through): mixed precision;
* ``split int16 + m8/v8`` and ``split int8 + m8/v8``: every float weight
  (``filter='all'``) held as bf16 plus an int16 or int8 remainder
  (``optax_q.split_weights`` around ``optax_q.adamw``); the forward pass
  computes in float32 from the bf16 weights, whose gradients are bf16;
* ``fp8 ECO sr + m8/v4``: the ECO study's 2.59-byte row, rerun (fp8
  weights without master copies, an 8-bit first and a 4-bit second
  moment).

For each: final validation loss (mean and spread over seeds) and bytes per
parameter from the real buffers: weights, remainders, moments, their total,
and the total with a gradient of the weights' dtype (FlashOptim's 7 bytes
count a bf16 gradient). Before training, the split's exactness: over every
float32 bit pattern (``--no-exhaustive`` skips it), on normal weights over
72 decades of magnitude, and on the trained float32 weights of the first
row.

  python examples/study_split_weights.py --quick          # runs/...
  python examples/study_split_weights.py --out docs/results
"""

import argparse
import dataclasses
import functools
import json
import pathlib
import statistics
import time

import _common  # pylint: disable=g-bad-import-order
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax_q
from models import data
from models import train
import study_eco

M8 = 'int8_dynamic'
REFERENCE = 'fp32 MW + m8/v8'
ECO = 'fp8 ECO sr + m8/v4'
# The smallest float32 magnitude whose bf16 nearest value overflows.
OVERFLOW = 0x7F7F8000


@dataclasses.dataclass(frozen=True)
class Config:
  """One row: ``weights`` is 'fp32', 'bf16' (float32 master, bf16 forward
  pass), 'int16' or 'int8' (split), or 'eco' (the ECO study's row)."""

  name: str
  weights: str


CONFIGS = (
    Config(REFERENCE, 'fp32'),
    Config('bf16 w/ MW + m8/v8', 'bf16'),
    Config('split int16 + m8/v8', 'int16'),
    Config('split int8 + m8/v8', 'int8'),
    Config(ECO, 'eco'),
)


@functools.lru_cache(maxsize=32)
def make_optimizer(cfg: Config, run: _common.RunConfig, seed: int):
  """Clipping, then AdamW with 8-bit moments (split around it), or the
  ECO study's transform (cached per seed)."""
  if cfg.weights == 'eco':
    eco = {c.name: c for c in study_eco.CONFIGS}[ECO]
    return study_eco.make_optimizer(eco, run, seed)
  adamw = optax_q.adamw(
      _common.schedule(run), b1=run.b1, b2=run.b2, eps=run.eps,
      weight_decay=run.weight_decay, mask=_decay_mask,
      mu_format=M8, nu_format=M8, rounding='stochastic', seed=seed,
      min_size=run.min_size, block_size=run.block_size)
  if cfg.weights in ('int16', 'int8'):
    adamw = optax_q.split_weights(adamw, cfg.weights, filter='all')
  return optax.chain(optax.clip_by_global_norm(run.clip_norm), adamw)


def _decay_mask(params):
  """Weight decay on matrices only (the ECO study's mask)."""
  return jax.tree.map(lambda p: p.ndim >= 2, params)


def _float32_loss(model, params, batch):
  """The LM loss computed in float32 from bf16 (split) weights."""
  params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  return train.lm_loss(model, params, batch)


def _bf16_forward_loss(model, params, batch):
  """float32 master weights, the forward pass on their bf16 rounding."""
  params = optax_q.fake_quantize_params(params, 'bf16', filter='all')
  return train.lm_loss(model, params, batch)


def _initial(cfg: Config, params):
  """The params the run trains (the split's bf16 weights, ECO's fp8)."""
  if cfg.weights in ('int16', 'int8'):
    return optax_q.split_params(params, cfg.weights, filter='all')
  if cfg.weights == 'eco':
    return optax_q.quantize_params(params, study_eco.FP8, filter='matrices')
  return params


def _split_state(state):
  found = [x for x in jax.tree.leaves(
      state, is_leaf=lambda x: isinstance(x, optax_q.SplitWeightsState))
           if isinstance(x, optax_q.SplitWeightsState)]
  return found[0] if found else None


def run_one(cfg: Config, run: _common.RunConfig, corpus, seed: int,
            progress: bool = False):
  """One row: losses, bytes, and the final params (float32 masters)."""
  model = _common.make_model(run)
  params = _common.init_params(model, seed)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  tx = make_optimizer(cfg, run, seed)
  loss_fn = {'bf16': _bf16_forward_loss, 'int16': _float32_loss,
             'int8': _float32_loss}.get(cfg.weights, train.lm_loss)
  # The split's remainders come from the float32 params (the harness would
  # initialise from the bf16 weights, with zero remainders).
  init_state = (jax.jit(tx.init)(params) if cfg.weights in ('int16', 'int8')
                else None)
  result = train.train(
      model, _initial(cfg, params), tx,
      data.lm_batches(corpus.train, run.batch_size, run.seq_len, seed=seed),
      steps=run.steps, loss_fn=loss_fn, opt_state=init_state,
      eval_fn=_common.make_eval_fn(run, corpus), eval_every=run.eval_every,
      progress=progress, desc=cfg.name, seed=seed)
  split_state = _split_state(result.opt_state)
  weight_bytes = optax_q.state_nbytes(result.params)
  state_bytes = optax_q.state_nbytes(result.opt_state)
  remainder_bytes = (optax_q.state_nbytes(split_state.remainder)
                     if split_state is not None else 0)
  final = float(result.eval_losses[-1])
  times = (result.step_times[1:] if len(result.step_times) > 1
           else result.step_times)
  row = dict(
      config=cfg.name, seed=seed, final_val_loss=final,
      finite=bool(np.isfinite(final)), params=n_params,
      weight_bytes=weight_bytes, remainder_bytes=remainder_bytes,
      moment_bytes=state_bytes - remainder_bytes,
      bytes_per_param=(weight_bytes + state_bytes) / n_params,
      # A gradient of each weight's dtype (bf16 for split weights; fp8
      # weights take float32 gradients from the decoded weights).
      grad_bytes=sum(
          4 * x.size if optax_q.is_qarray(x) else x.nbytes
          for x in jax.tree.leaves(result.params,
                                   is_leaf=optax_q.is_qarray)),
      step_ms_median=1e3 * float(np.median(times)))
  masters = result.params
  if split_state is not None:
    masters = optax_q.master_weights(result.params, result.opt_state)
  return row, masters


def _bits(x):
  return jax.lax.bitcast_convert_type(jnp.asarray(x, jnp.float32),
                                      jnp.uint32)


def _round_trip(remainder: str, x):
  """``x`` through split_weights' init, split_params and master_weights."""
  tx = optax_q.split_weights(optax.identity(), remainder)
  params = {'w': x}
  return optax_q.master_weights(optax_q.split_params(params, remainder),
                                tx.init(params))['w']


_CHUNK = 1 << 24


@jax.jit
def _exhaustive_chunk(start):
  """Over ``_CHUNK`` bit patterns from ``start``: int16's finite values
  below the overflow threshold not exact, those above it, its worst
  relative error above it, NaNs not NaN; int8's worst relative error on
  normal values below the threshold."""
  u = start + jnp.arange(_CHUNK, dtype=jnp.uint32)
  x = jax.lax.bitcast_convert_type(u, jnp.float32)
  mag = u & jnp.uint32(0x7FFFFFFF)
  finite = jnp.isfinite(x)
  below = mag < jnp.uint32(OVERFLOW)
  back16 = _round_trip('int16', x)
  back8 = _round_trip('int8', x)
  wrong = finite & below & (_bits(back16) != u)
  over = finite & ~below
  rel16 = jnp.where(over, jnp.abs(back16 - x) / jnp.abs(x), 0.0)
  normal = below & (mag >= jnp.uint32(0x00800000))
  rel8 = jnp.where(normal, jnp.abs(back8.astype(jnp.float32) - x)
                   / jnp.abs(x), 0.0)
  nan_lost = jnp.isnan(x) & ~jnp.isnan(back16)
  return (jnp.sum(wrong), jnp.sum(over), jnp.max(rel16), jnp.sum(nan_lost),
          jnp.max(rel8), jnp.sum(finite))


def exhaustive() -> dict:
  """Every float32 bit pattern through the split (int16 and int8)."""
  totals = np.zeros(6, np.float64)
  maxes = [0.0, 0.0]
  for i in range((1 << 32) // _CHUNK):
    wrong, over, rel16, nan_lost, rel8, finite = _exhaustive_chunk(
        jnp.uint32(i * _CHUNK))
    totals += [int(wrong), int(over), 0, int(nan_lost), 0, int(finite)]
    maxes = [max(maxes[0], float(rel16)), max(maxes[1], float(rel8))]
  finite = int(totals[5])
  return dict(
      finite_patterns=finite,
      int16_exact=finite - int(totals[0]) - int(totals[1]),
      int16_exact_fraction=(finite - totals[0] - totals[1]) / finite,
      int16_not_exact_below_threshold=int(totals[0]),
      int16_beyond_threshold=int(totals[1]),
      int16_beyond_max_relative_error=maxes[0],
      nan_kept=int(totals[3]) == 0,
      int8_max_relative_error_normal=maxes[1])


def on_weights(x) -> dict:
  """Exactness of the int16 split and int8 error on the values ``x``."""
  x = jnp.asarray(x, jnp.float32)
  back16 = _round_trip('int16', x)
  back8 = _round_trip('int8', x)
  nz = x != 0
  return dict(
      values=int(x.size),
      int16_exact_fraction=float(jnp.mean(_bits(back16) == _bits(x))),
      int8_exact_fraction=float(jnp.mean(_bits(back8) == _bits(x))),
      int8_max_relative_error=float(jnp.max(jnp.where(
          nz, jnp.abs(back8 - x) / jnp.where(nz, jnp.abs(x), 1.0), 0.0))))


def random_weights(n: int = 1 << 22) -> jax.Array:
  """Normal values times 10**U(-36, 36): 72 decades of magnitude."""
  k = jax.random.split(jax.random.key(0), 2)
  return jax.random.normal(k[0], (n,)) * 10.0 ** jax.random.uniform(
      k[1], (n,), minval=-36.0, maxval=36.0)


def _per_param(rows, key: str) -> float:
  return statistics.mean(r[key] for r in rows) / rows[0]['params']


def summarize(rows, configs):
  by, ref_loss = _common.by_config(rows, REFERENCE)
  out = []
  for cfg in configs:
    rs = by.get(cfg.name)
    if not rs:
      continue
    losses = [r['final_val_loss'] for r in rs]
    per = functools.partial(_per_param, rs)
    fields = _common.loss_fields(rs, ref_loss)
    out.append(dict(
        config=cfg.name, weights=cfg.weights, mean_loss=fields['mean_loss'],
        std_loss=fields['std_loss'],
        min_loss=min(losses), max_loss=max(losses),
        diverged=fields['diverged'], delta_pct=fields['delta_pct'],
        weight_bytes_per_param=per('weight_bytes'),
        remainder_bytes_per_param=per('remainder_bytes'),
        moment_bytes_per_param=per('moment_bytes'),
        bytes_per_param=per('weight_bytes') + per('remainder_bytes')
        + per('moment_bytes'),
        with_gradient_bytes_per_param=per('weight_bytes')
        + per('remainder_bytes') + per('moment_bytes') + per('grad_bytes'),
        step_ms=statistics.median(r['step_ms_median'] for r in rs)))
  return out


def _f(x, spec='.4f'):
  return 'diverged' if x != x else format(x, spec)


def render_markdown(result) -> str:
  meta, summary, ex = result['meta'], result['summary'], result['exactness']
  table = _common.markdown_table(
      ('config', 'weights', 'remainder', 'moments', 'total',
       '+ gradient', 'val loss', f'Δ vs {REFERENCE} %'),
      [(s['config'], f'{s["weight_bytes_per_param"]:.2f}',
        f'{s["remainder_bytes_per_param"]:.2f}',
        f'{s["moment_bytes_per_param"]:.2f}', f'{s["bytes_per_param"]:.2f}',
        f'{s["with_gradient_bytes_per_param"]:.2f}',
        _f(s['mean_loss']) + ('' if s['diverged']
                              else f' ± {s["std_loss"]:.4f}'),
        '-' if s['delta_pct'] != s['delta_pct']
        else f'{s["delta_pct"]:+.2f}') for s in summary])
  lines = []
  full = ex.get('exhaustive')
  if full:
    lines.append(
        f'- Every float32 bit pattern ({full["finite_patterns"]} finite): '
        f'int16 gives back {full["int16_exact"]} bit for bit '
        f'({100 * full["int16_exact_fraction"]:.4f}%); not exact: '
        f'{full["int16_not_exact_below_threshold"]} below bf16\'s overflow '
        f'threshold and the {full["int16_beyond_threshold"]} finite values '
        'at or beyond it (magnitude >= 2**128 - 2**119, where bf16 rounds to '
        'infinity), which keep a finite bf16 weight and lose at most '
        f'{full["int16_beyond_max_relative_error"]:.2e} relative. NaN '
        f'stays NaN: {full["nan_kept"]}. int8: largest relative error on '
        f'normal values {full["int8_max_relative_error_normal"]:.3e} '
        '(2**-16 = 1.526e-05).')
  for key, label in (('random', 'Normal values over 72 decades'),
                     ('trained', f'The trained float32 weights of '
                      f'`{REFERENCE}` (seed {meta["seeds"][0]})')):
    w = ex[key]
    lines.append(
        f'- {label} ({w["values"]} values): int16 exact '
        f'{100 * w["int16_exact_fraction"]:.4f}%; int8 exact '
        f'{100 * w["int8_exact_fraction"]:.2f}%, largest relative error '
        f'{w["int8_max_relative_error"]:.3e}.')
  exact = '\n'.join(lines)
  return f"""# Split master weights against float32 master weights and ECO

Written by `examples/study_split_weights.py`; do not edit.

- Command: `{meta['command']}`
- Revision: `{meta['git_revision']}`; date: {meta['date']}
- Machine: {meta['machine']}
- Seeds: {meta['seeds']}; {meta['steps']} steps; model d_model
  {meta['run_config']['d_model']}, {meta['run_config']['num_layers']} layers;
  {meta['seconds']:.0f} s

## Exactness of the split

{exact}

## Training

Bytes per parameter over all parameters, from the real buffers: the
weights as the model holds them, the split's remainders, the moments
(codes, scales, counters), their total, and the total with a gradient of
the weights' dtype (float32 for fp8 weights, whose gradient is taken at
the decoded ones). Loss: final validation loss, mean ± standard deviation
over seeds (per seed in the JSON).

{table}
"""


def make_parser():
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=_common.HelpFormatter)
  p.add_argument('--quick', action='store_true',
                 help='a smoke run: few steps, one seed, no exhaustive '
                 'check')
  p.add_argument('--seeds', type=int, nargs='+', default=None,
                 help='seeds (default: 0 1 2; --quick: 0)')
  p.add_argument('--configs', nargs='+', default=None,
                 help='configuration names (default: all)')
  p.add_argument('--no-exhaustive', dest='exhaustive', action='store_false',
                 help='skip the check over every float32 bit pattern')
  _common.add_run_args(p, _common.RunConfig(steps=500))
  _common.add_out_argument(p, __file__)
  return p


def main(argv=None):
  args = make_parser().parse_args(argv)
  out = pathlib.Path(args.out)
  seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
  run = _common.run_config_from_args(args)
  if args.quick and run.steps == 500:
    run = dataclasses.replace(run, steps=40, eval_batches=8)
  if run.eval_every == 100:
    run = dataclasses.replace(run, eval_every=max(run.steps // 5, 1))
  names = args.configs or [c.name for c in CONFIGS]
  unknown = set(names) - {c.name for c in CONFIGS}
  if unknown:
    raise SystemExit(f'unknown configs {sorted(unknown)}; known: '
                     f'{[c.name for c in CONFIGS]}')
  configs = [c for c in CONFIGS if c.name in names]
  corpus = _common.load_corpus(run, args.data)
  revision = _common.git_revision()
  start = time.time()
  exactness = dict(random=on_weights(random_weights()))
  if args.exhaustive and not args.quick:
    exactness['exhaustive'] = exhaustive()
  print(json.dumps(exactness), flush=True)
  rows = []
  for cfg in configs:
    for seed in seeds:
      row, masters = run_one(cfg, run, corpus, seed)
      rows.append(row)
      if cfg.weights == 'fp32' and seed == seeds[0]:
        exactness['trained'] = on_weights(jnp.concatenate(
            [x.ravel() for x in jax.tree.leaves(masters)]))
      print(f'{cfg.name:22s} seed {seed}: loss {row["final_val_loss"]:.4f} '
            f'{row["bytes_per_param"]:.2f} B/param '
            f'{row["step_ms_median"]:.1f} ms/step', flush=True)
    jax.clear_caches()
  if 'trained' not in exactness:
    model = _common.make_model(run)
    exactness['trained'] = on_weights(jnp.concatenate(
        [x.ravel() for x in jax.tree.leaves(
            _common.init_params(model, seeds[0]))]))
  meta = dict(command=_common.command_line(__file__, argv),
              git_revision=revision, date=_common.now_utc(),
              machine=_common.machine(), seeds=seeds, steps=run.steps,
              run_config=dataclasses.asdict(run),
              seconds=time.time() - start)
  result = dict(meta=meta, exactness=exactness, rows=rows,
                summary=summarize(rows, configs))
  out.mkdir(parents=True, exist_ok=True)
  (out / 'split_weights.json').write_text(
      json.dumps(result, indent=1, allow_nan=True) + '\n')
  md = render_markdown(result)
  (out / 'split_weights.md').write_text(md)
  print(md)
  return result


if __name__ == '__main__':
  main()
