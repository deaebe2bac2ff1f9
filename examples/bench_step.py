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
"""Optimizer-step speed and memory: optax_q against Optax and its peers.

One parameter tree shaped like a transformer (per layer the four matrices
d x 3d, d x d, d x 4d, 4d x d, their biases and two norms), one jitted
function per optimizer (``update`` then ``optax.apply_updates``, params and
state donated), measured round-robin over several rounds so that machine
noise hits every row alike. Each row reports the median step time, its
ratio to ``optax.adamw`` in float32 measured in the same run, the state's
real bytes, bits per moment element, and the memory traffic the step must
do (read params, grads and state; write params and state) against a plain
copy measured in the same run.

PyTorch, torchao and bitsandbytes rows are optional: each is skipped with a
note when its package does not import or its optimizer fails on this
machine.

Writes ``bench_step.json``, ``bench_step.md`` and ``bench_step.png`` (each
row's step time against ``optax.adamw`` in float32; ``bench_step_quick.*``
with ``--quick``, so that a smoke test never overwrites a full run) to
``--out``, by default ``runs/bench_step/`` in the repository (git-ignored).
The published results are written only when asked for, with
``--out docs/results``; ``--render`` re-writes the table and the plot from
the saved JSON without measuring.

Usage::

  python examples/bench_step.py                      # CPU: d=512, 8 layers
  python examples/bench_step.py --d 1024 --layers 24 # GPU size
  python examples/bench_step.py --quick              # smoke test
  python examples/bench_step.py --out docs/results   # the published table
  python examples/bench_step.py --render --name bench_step_lowbit \
      --out docs/results                             # re-render from JSON
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import optax_q

import _common  # pylint: disable=g-bad-import-order

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = 'optax.adamw fp32'
LR = 1e-3
WEIGHT_DECAY = 1e-4


def param_shapes(d: int, layers: int) -> dict[str, tuple[int, ...]]:
  """Shapes of a transformer's parameters (no embeddings), by name."""
  shapes = {}
  for i in range(layers):
    p = f'layer{i:02d}/'
    shapes[p + 'attn_qkv/w'] = (d, 3 * d)
    shapes[p + 'attn_qkv/b'] = (3 * d,)
    shapes[p + 'attn_out/w'] = (d, d)
    shapes[p + 'attn_out/b'] = (d,)
    shapes[p + 'mlp_in/w'] = (d, 4 * d)
    shapes[p + 'mlp_in/b'] = (4 * d,)
    shapes[p + 'mlp_out/w'] = (4 * d, d)
    shapes[p + 'mlp_out/b'] = (d,)
    for norm in ('ln1', 'ln2'):
      shapes[p + norm + '/scale'] = (d,)
      shapes[p + norm + '/bias'] = (d,)
  return shapes


def host_arrays(shapes, seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {k: (rng.standard_normal(s, dtype=np.float32) * 0.02)
          for k, s in shapes.items()}


class Row:
  """One optimizer under test: a ``step()`` callable and its accounting."""

  def __init__(self, name: str, step: Callable[[], None], state_bytes: int,
               moment_elements: int, param_elements: int,
               bits_per_element: float | None = None):
    self.name = name
    self.step = step
    self.state_bytes = int(state_bytes)
    self.bits = (bits_per_element if bits_per_element is not None
                 else 8.0 * state_bytes / max(moment_elements, 1))
    # Read params, grads and state; write params and state.
    self.traffic = 3 * 4 * param_elements + 2 * self.state_bytes
    self.times: list[float] = []
    self.temp_bytes: int | None = None  # The compiled step's temporaries.
    self.setup_s: float | None = None  # Tracing, compiling, the state's init.
    self.program: Callable[[], str] | None = None  # Its compiled text.


# --------------------------------------------------------------------------
# JAX rows.


def jax_row(name, tx, params_np, grads, param_elements) -> Row:
  """A donated, jitted ``update`` + ``apply_updates`` step for ``tx``."""
  params = jax.tree.map(jnp.asarray, params_np)
  state = tx.init(params)  # Eager, as a training loop initialises.

  def step_fn(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  step = jax.jit(step_fn, donate_argnums=(0, 1))
  compiled = step.lower(params, state, grads).compile()
  holder = {'params': params, 'state': state}
  state_bytes = optax_q.state_nbytes(state)
  bits = optax_q.state_bits_per_element(state)

  def run():
    p, s = step(holder['params'], holder['state'], grads)
    jax.block_until_ready((p, s))
    holder['params'], holder['state'] = p, s

  row = Row(name, run, state_bytes, 2 * param_elements, param_elements,
            bits_per_element=bits)
  row.temp_bytes = int(compiled.memory_analysis().temp_size_in_bytes)
  row.program = compiled.as_text
  return row


def copy_row(n_bytes: int) -> Row:
  """An in-place negation of ``n_bytes`` of float32 (read + write once)."""
  x = jnp.ones((max(n_bytes // 4, 1),), jnp.float32)
  neg = jax.jit(lambda v: -v, donate_argnums=0)
  holder = {'x': x}

  def run():
    holder['x'] = neg(holder['x'])
    holder['x'].block_until_ready()

  row = Row('copy (read + write, float32)', run, 0, 1, 0)
  row.traffic = 2 * x.size * 4
  return row


def jax_configs() -> list[tuple[str, Callable[[], Any]]]:
  q = optax_q.adamw
  kw = dict(learning_rate=LR, weight_decay=WEIGHT_DECAY)
  configs = [
      (BASELINE, lambda: optax.adamw(**kw)),
      ('optax.adamw mu_dtype=bf16',
       lambda: optax.adamw(mu_dtype=jnp.bfloat16, **kw)),
      ('optax_q fp32/fp32', lambda: q(mu_format='fp32', nu_format='fp32',
                                      rounding='nearest', **kw)),
  ]
  formats = [
      ('bf16', 'bf16', 'bf16'),
      ('fp8_e4m3', 'fp8_e4m3', 'fp8_e4m3'),
      ('int8_dynamic', 'int8_dynamic', 'int8_dynamic'),
      ('fp4_e2m1/fp4_e2m2u', 'fp4_e2m1', 'fp4_e2m2u'),
      ('int4', 'int4', 'int4'),
      # The low-bit codecs (study_lowbit.py).
      ('nf4/ue4m0', 'nf4', 'ue4m0'),
      ('nf4/ue4m0@rsqrt', 'nf4', 'ue4m0@rsqrt'),
      ('nf4/int4_mulaw', 'nf4', 'int4_mulaw'),
      ('nf3/ue3m0', 'nf3', 'ue3m0'),
      # fp8 with dynamic range expansion; rank-1 second moments.
      ('fp8_e4m3_dre', 'fp8_e4m3_dre', 'fp8_e4m3_dre'),
      ('nf4/ue4m0 rank-1 nu', 'nf4', 'ue4m0', {'nu': 'rank1'}),
      ('int4 rank-1 nu', 'int4', 'int4', {'nu': 'rank1'}),
  ]
  for label, mu, nu, *mode in formats:
    for rounding in ('nearest', 'stochastic'):
      configs.append((
          f'optax_q {label} {rounding}',
          lambda mu=mu, nu=nu, rounding=rounding, mode=mode: q(
              mu_format=mu, nu_format=nu, rounding=rounding,
              scale_mode=mode[0] if mode else None, **kw)))
  # What the optional stall telemetry costs (off by default in the
  # drop-ins; quantize_state records it).
  for fmt in ('bf16', 'fp8_e4m3'):
    configs.append((
        f'optax_q {fmt} stochastic, track_stalls=True',
        lambda fmt=fmt: q(mu_format=fmt, nu_format=fmt, track_stalls=True,
                          **kw)))
  # The same moments through the whole-tree path (an inner transform not
  # declared elementwise), to show what the leafwise tiled pass changes.
  for fmt in ('fp8_e4m3', 'int8_dynamic'):
    configs.append((
        f'optax_q {fmt} stochastic, whole-tree path',
        lambda fmt=fmt: optax.chain(
            optax_q.quantize_state(optax.scale_by_adam(), fmt,
                                   track_stalls=False),
            optax.add_decayed_weights(WEIGHT_DECAY),
            optax.scale_by_learning_rate(LR))))
  # On a GPU or TPU: the moments by the XLA path and by the Pallas kernel,
  # side by side (on CPU the kernel only runs interpreted; on a GPU, Triton
  # lowers it for the one-byte float and integer grids).
  if jax.default_backend() in ('gpu', 'tpu'):
    for fmt in ('fp8_e4m3', 'int8', 'int8_dynamic'):
      for kernel in ('xla', 'pallas'):
        configs.append((
            f'optax_q {fmt} nearest, kernel={kernel}',
            lambda fmt=fmt, kernel=kernel: q(
                mu_format=fmt, nu_format=fmt, rounding='nearest',
                kernel=kernel, **kw)))
  configs += second_order_configs(kw)
  return configs


PEERS = ('torch.optim.AdamW fused', 'torchao AdamW8bit', 'torchao AdamW4bit',
         'torchao AdamWFp8', 'bitsandbytes Adam8bit')
# The rows of the main table (docs/results/bench_step.md), the default; the
# others (low-bit codecs, layouts, Shampoo and SOAP) are chosen with --only.
MAIN_ROWS = frozenset(
    ['optax.adamw fp32', 'optax.adamw mu_dtype=bf16', 'optax_q fp32/fp32']
    + [f'optax_q {label} {rounding}'
       for label in ('bf16', 'fp8_e4m3', 'int8_dynamic', 'fp4_e2m1/fp4_e2m2u',
                     'int4', 'nf4/ue4m0')
       for rounding in ('nearest', 'stochastic')]
    + [f'optax_q {fmt} stochastic, track_stalls=True'
       for fmt in ('bf16', 'fp8_e4m3')]
    + [f'optax_q {fmt} stochastic, whole-tree path'
       for fmt in ('fp8_e4m3', 'int8_dynamic')]
    + [f'optax_q {fmt} nearest, kernel={kernel}'
       for fmt in ('fp8_e4m3', 'int8', 'int8_dynamic')
       for kernel in ('xla', 'pallas')])


def retain_freed_memory() -> str:
  """Makes glibc serve every allocation from its heap and keep freed memory.

  By default glibc maps each large block (a compiled step's temporaries)
  fresh from the kernel and unmaps it when freed, so every step faults its
  temporaries' pages in again; in a virtual machine that can cost more than
  the step's arithmetic. Returns what was done, for the result's notes.
  """
  import ctypes  # pylint: disable=g-import-not-at-top
  try:
    libc = ctypes.CDLL('libc.so.6')
  except OSError as e:
    return f'not glibc ({e}): allocator unchanged'
  m_trim_threshold, m_mmap_max = -1, -4
  ok = (libc.mallopt(m_mmap_max, 0)
        and libc.mallopt(m_trim_threshold, 2**31 - 1))
  return ('glibc mallopt(M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1): freed '
          'memory stays in the heap' if ok else 'mallopt refused: allocator '
          'unchanged')


def second_order_configs(kw) -> list[tuple[str, Callable[[], Any]]]:
  """Shampoo and SOAP: steps between refreshes (one refresh, before the
  measured steps), and steps that all refresh (``precondition_frequency``
  1), in float32 and in the 8-bit defaults, blocks of 128 and 64."""
  fp32 = dict(mu_format='fp32', nu_format='fp32', stats_format='fp32',
              eigvecs_format='fp32')
  configs = []
  for opt, make in (('shampoo', optax_q.shampoo), ('soap', optax_q.soap)):
    for dim in (128, 64):
      for label, formats in (('8-bit', {}), ('fp32', fp32)):
        for when, freq in (('between refreshes', 10**9),
                           ('refresh every step', 1)):
          configs.append((
              f'optax_q {opt} {label} dim {dim}, {when}',
              lambda make=make, dim=dim, formats=formats, freq=freq: make(
                  **kw, max_preconditioner_dim=dim,
                  precondition_frequency=freq, **formats)))
  return configs


# --------------------------------------------------------------------------
# PyTorch rows (optional).


def torch_rows(shapes, params_np, grads_np, param_elements, which):
  """Rows for the PyTorch peers; returns (rows, notes)."""
  rows, notes = [], {}
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except Exception as e:  # pylint: disable=broad-except
    for name in which:
      notes[name] = f'not run: torch does not import ({e!r})'
    return rows, notes

  def make_params():
    ps = []
    for k in shapes:
      p = torch.nn.Parameter(torch.from_numpy(params_np[k].copy()))
      p.grad = torch.from_numpy(grads_np[k].copy())
      ps.append(p)
    return ps

  def fused_adamw(ps):
    try:
      return torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY,
                               fused=True), 'fused'
    except Exception:  # pylint: disable=broad-except
      return torch.optim.AdamW(ps, lr=LR, weight_decay=WEIGHT_DECAY,
                               foreach=True), 'foreach'

  def torchao(cls_name):
    def make(ps):
      import torchao.optim  # pylint: disable=g-import-not-at-top
      cls = getattr(torchao.optim, cls_name)
      return cls(ps, lr=LR, weight_decay=WEIGHT_DECAY), None
    return make

  def bnb_adam8bit(ps):
    import bitsandbytes  # pylint: disable=g-import-not-at-top
    return bitsandbytes.optim.Adam8bit(ps, lr=LR), None

  makers = {
      'torch.optim.AdamW fused': fused_adamw,
      'torchao AdamW8bit': torchao('AdamW8bit'),
      'torchao AdamW4bit': torchao('AdamW4bit'),
      'torchao AdamWFp8': torchao('AdamWFp8'),
      'bitsandbytes Adam8bit': bnb_adam8bit,
  }
  for name in which:
    try:
      ps = make_params()
      opt, variant = makers[name](ps)
      label = name
      if variant == 'foreach':
        label = 'torch.optim.AdamW foreach'
        notes[name] = 'fused=True unavailable on this machine; used foreach'
      t0 = time.perf_counter()
      opt.step()  # Creates the state (and compiles torchao's kernels).
      opt.step()
      warm = time.perf_counter() - t0

      def run(opt=opt):
        with torch.no_grad():
          opt.step()

      row = Row(label, run, _common.torch_state_bytes(opt), 2 * param_elements,
                param_elements)
      row.warmup_s = warm
      rows.append(row)
    except Exception as e:  # pylint: disable=broad-except
      msg = f'{type(e).__name__}: {e}'.splitlines()[0][:300]
      notes[name] = f'not run: {msg}'
  return rows, notes


# --------------------------------------------------------------------------
# Measurement and reporting.


def measure(rows: list[Row], rounds: int, steps: int) -> None:
  """Round-robin: every round runs ``steps // rounds`` steps of each row."""
  per_round = max(1, -(-steps // rounds))
  for _ in range(rounds):
    for row in rows:
      for _ in range(per_round):
        t0 = time.perf_counter()
        row.step()
        row.times.append(time.perf_counter() - t0)


def machine_line() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          cpu = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  dev = jax.devices()[0]
  kind = getattr(dev, 'device_kind', dev.platform)
  return (f'{cpu}, {os.cpu_count()} cores; jax {jax.__version__} on '
          f'{dev.platform} ({kind})')


def package_versions() -> dict[str, str]:
  """Versions of the packages the rows ran on (peers: where installed)."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  out = {}
  for name in ('jax', 'jaxlib', 'optax', 'torch', 'torchao', 'bitsandbytes'):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def git_revision() -> str:
  try:
    rev = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=_ROOT,
                         capture_output=True, text=True,
                         check=True).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--', 'optax_q',
                            'examples/bench_step.py'], cwd=_ROOT,
                           capture_output=True, text=True).stdout.strip()
    return rev + ('-dirty' if dirty else '')
  except Exception:  # pylint: disable=broad-except
    return 'unknown'


def _mib(n: int | None) -> str:
  return '-' if n is None else f'{n / 2**20:.1f}'


def render_table(result: dict[str, Any]) -> str:
  lines = [
      '| optimizer | median ms | ratio to optax.adamw fp32 | state MiB | '
      'bits/elem | compiled temp MiB | GB/s | frac of copy |',
      '|---|---:|---:|---:|---:|---:|---:|---:|',
  ]
  for r in result['rows']:
    lines.append(
        f"| {r['config']} | {r['step_ms_median']:.2f} | "
        f"{r['ratio_to_optax_adamw']:.2f}x | "
        f"{r['state_bytes'] / 2**20:.1f} | "
        f"{r['state_bits_per_element']:.2f} | "
        f"{_mib(r.get('temp_bytes'))} | {r['gbps']:.1f} | "
        f"{r['frac_of_copy']:.2f} |")
  out = '\n'.join(lines) + '\n'
  if result.get('notes'):
    out += '\n' + '\n'.join(
        f'- {k}: {v}' for k, v in result['notes'].items()) + '\n'
  return out


_BITS_COLORS = {32: '0.45', 24: '0.7', 16: 'C0', 8: 'C2', 4: 'C1', 3: 'C3'}


def plot(result: dict[str, Any], path: str) -> str:
  """Horizontal bars: each row's median step time over the baseline's
  (log scale), coloured by bits per moment element, state MiB annotated."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = result['rows']
  bits = [round(r['state_bits_per_element']) for r in rows]
  color = lambda b: _BITS_COLORS.get(b, 'C4')
  ratios = [r['ratio_to_optax_adamw'] for r in rows]
  fig, ax = plt.subplots(figsize=(9, 0.3 * len(rows) + 1.6))
  y = list(range(len(rows)))
  # Bars grow from 1x: left for faster than the baseline, right for slower.
  ax.barh(y, [r - 1 for r in ratios], left=1, color=[color(b) for b in bits])
  ax.set_yticks(y)
  ax.set_yticklabels([r['config'] for r in rows], fontsize=7)
  ax.invert_yaxis()
  ax.set_xscale('log')
  ax.axvline(1.0, color='k', lw=0.8)
  ax.set_xlim(min(0.5, min(ratios) / 1.5), max(ratios) * 4)
  ticks = [t for t in (0.5, 1, 2, 5, 10, 20, 50, 100, 200)
           if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
  ax.set_xticks(ticks)
  ax.set_xticklabels([f'{t:g}x' for t in ticks])
  ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
  for i, r in enumerate(rows):
    ax.text(max(ratios[i], 1.0) * 1.06, i,
            f"{r['ratio_to_optax_adamw']:.2f}x, "
            f"{r['state_bytes'] / 2**20:.1f} MiB", va='center', fontsize=6)
  ax.set_xlabel(f'median step time / {BASELINE} (log scale); '
                'labels: ratio, optimizer state MiB')
  for b in sorted(set(bits), reverse=True):
    ax.barh([0], [0], left=1, color=color(b), label=f'~{b}')
  ax.legend(fontsize=7, loc='upper right', title='state bits/element',
            title_fontsize=7)
  ax.set_title(
      f"Optimizer step time, {result['mode']} mode: d={result['d']}, "
      f"{result['layers']} layers, {result['params'] / 1e6:.1f}M params; "
      f"{result['steps_per_optimizer']} steps in {result['rounds']} rounds"
      f"\n{result['machine']}", fontsize=8)
  ax.grid(axis='x', alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def render_markdown(result: dict[str, Any], stem: str) -> str:
  """The results page: provenance, the plot, the table."""
  versions = result.get('versions') or {}
  packages = (f"Packages: {', '.join(f'{k} {v}' for k, v in versions.items())}"
              '.  \n' if versions else '')
  return (
      f"Command: `{result['command']}`  \n"
      f"Revision {result['git_revision']}, {result['date']}, "
      f"{result['mode']} mode, d={result['d']}, {result['layers']} layers, "
      f"{result['params'] / 1e6:.1f}M params.  \n"
      f"Machine: {result['machine']}.  \n"
      + (f"Allocator: {result['allocator']}.  \n"
         if 'allocator' in result else '')
      + packages +
      f'Copy bandwidth (read + write) measured in the same run: '
      f"{result['copy_gbps']:.1f} GB/s.\n\n"
      f'![step time against {BASELINE}, state MiB]({stem}.png)\n\n'
      + render_table(result))


def write_outputs(result: dict[str, Any], out: str, stem: str) -> str:
  """``<stem>.md`` and ``<stem>.png`` in ``out`` from ``result``."""
  md = render_markdown(result, stem)
  with open(os.path.join(out, stem + '.md'), 'w') as f:
    f.write(md)
  plot(result, os.path.join(out, stem + '.png'))
  return md


def make_parser() -> argparse.ArgumentParser:
  """The flags of :func:`main`."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--d', type=int, default=512, help='model width (default: %(default)s)')
  parser.add_argument('--layers', type=int, default=8,
                      help='layers of the benchmark tree (default: %(default)s)')
  parser.add_argument('--steps', type=int, default=20,
                      help='measured steps per optimizer (>= 20 for docs) (default: %(default)s)')
  parser.add_argument('--rounds', type=int, default=5,
                      help='round-robin rounds the steps are split into (default: %(default)s)')
  parser.add_argument('--warmup', type=int, default=2,
                      help='unmeasured steps per optimizer after compiling (default: %(default)s)')
  parser.add_argument('--quick', action='store_true',
                      help='smoke test: tiny model, no torchao/bitsandbytes')
  parser.add_argument('--no-peers', action='store_true',
                      help='skip PyTorch, torchao and bitsandbytes')
  parser.add_argument(
      '--allocator', choices=('default', 'retain'), default='default',
      help="'retain': glibc keeps freed memory in its heap, so that a "
      "step's temporaries are not faulted in afresh every step (default: "
      '%(default)s)')
  parser.add_argument('--only', default='',
                      help='comma-separated substrings; keep the rows of the full '
                      'list (low-bit codecs, layouts, Shampoo and SOAP included) '
                      'whose names contain one (default: the main table)')
  parser.add_argument(
      '--max-setup-seconds', type=float, default=None,
      help='stop compiling further optimizers once their setup (compile and '
      'first steps) has taken this long; those are noted as not run, and '
      'the ones ready are measured (a time-limited accelerator run)')
  parser.add_argument(
      '--render', action='store_true',
      help='no measurement: re-write <name>.md and <name>.png from the '
      '<name>.json in --out')
  parser.add_argument(
      '--name', default='',
      help='stem of the result files (default: bench_step, or '
      'bench_step_quick with --quick)')
  parser.add_argument(
      '--out', default=os.path.join(_ROOT, 'runs', 'bench_step'),
      help='directory for bench_step.json, .md and .png (default: runs/bench_step; '
      'docs/results for the published ones)')
  return parser


def main(argv=None) -> dict[str, Any]:
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.max_setup_seconds is not None and not args.max_setup_seconds >= 0:
    parser.error('--max-setup-seconds must be a non-negative number of '
                 f'seconds, got {args.max_setup_seconds}')
  # A smoke test never overwrites the documented full-mode results.
  stem = args.name or ('bench_step_quick' if args.quick else 'bench_step')
  if args.render:
    with open(os.path.join(args.out, stem + '.json')) as f:
      result = json.load(f)
    write_outputs(result, args.out, stem)
    print(f'wrote {args.out}/{stem}.{{md,png}}')
    return result
  if args.quick:
    args.d, args.layers, args.rounds = 64, 2, 2
  mode = 'quick' if args.quick else 'full'
  allocator = ('default' if args.allocator == 'default'
               else retain_freed_memory())

  shapes = param_shapes(args.d, args.layers)
  n = sum(math.prod(s) for s in shapes.values())
  print(f'{len(shapes)} leaves, {n / 1e6:.2f}M params, {mode} mode; '
        f'{jax.devices()[0]}', flush=True)
  params_np = host_arrays(shapes, 0)
  grads_np = host_arrays(shapes, 1)
  grads = jax.tree.map(jnp.asarray, grads_np)

  keep = [s for s in args.only.split(',') if s]
  # Without --only, the main table: every row of the full list at once
  # does not fit in 24 GiB (each holds its own parameters and state).
  wanted = lambda name: (any(s in name for s in keep) if keep
                         else name in MAIN_ROWS or name in PEERS)

  rows, failed = [], {}
  setup_start = time.perf_counter()
  for name, make in jax_configs():
    if name != BASELINE and not wanted(name):
      continue
    if (name != BASELINE and args.max_setup_seconds is not None
        and time.perf_counter() - setup_start > args.max_setup_seconds):
      failed[name] = (f'not run: setup past --max-setup-seconds '
                      f'{args.max_setup_seconds:g}')
      print(f'  {name}: {failed[name]}', flush=True)
      continue
    t0 = time.perf_counter()
    try:
      rows.append(jax_row(name, make(), params_np, grads, n))
      rows[-1].setup_s = time.perf_counter() - t0
    except Exception as e:  # pylint: disable=broad-except
      if name == BASELINE:
        raise
      # A Pallas kernel that does not lower on this accelerator, say.
      failed[name] = f'not run: {type(e).__name__}: {e}'.splitlines()[0][:300]
      print(f'  {name}: {failed[name]}', flush=True)
      continue
    print(f'  compiled {name} ({time.perf_counter() - t0:.1f}s)', flush=True)

  notes = dict(failed)
  peers = [p for p in PEERS if wanted(p)]
  if args.no_peers:
    notes.update({p: 'skipped (--no-peers)' for p in peers})
  else:
    if args.quick:
      notes.update({p: 'skipped in --quick mode' for p in peers[1:]})
      peers = peers[:1]
    prows, pnotes = torch_rows(shapes, params_np, grads_np, n, peers)
    rows += prows
    notes.update(pnotes)
    for r in prows:
      print(f'  ready {r.name} (first two steps {r.warmup_s:.1f}s)',
            flush=True)

  copy = copy_row(rows[0].traffic // 2)
  rows.append(copy)
  for row in rows:
    for _ in range(args.warmup):
      row.step()
  measure(rows, args.rounds, args.steps)

  copy_ms = 1e3 * statistics.median(copy.times)
  copy_gbps = copy.traffic / copy_ms / 1e6
  base_ms = 1e3 * statistics.median(rows[0].times)
  out_rows = []
  for row in rows[:-1]:
    ms = 1e3 * statistics.median(row.times)
    gbps = row.traffic / ms / 1e6
    out_rows.append(dict(
        config=row.name,
        step_ms_median=round(ms, 4),
        ratio_to_optax_adamw=round(ms / base_ms, 4),
        state_bytes=row.state_bytes,
        state_bits_per_element=round(row.bits, 4),
        temp_bytes=row.temp_bytes,
        gbps=round(gbps, 3),
        frac_of_copy=round(gbps / copy_gbps, 4),
        traffic_bytes=row.traffic,
        lower_bound_ms=round(row.traffic / copy_gbps / 1e6, 4),
        steps=len(row.times),
    ))
    if row.setup_s is not None:
      out_rows[-1]['setup_s'] = round(row.setup_s, 2)
    print(f'  {row.name:50s} {ms:9.2f} ms  {ms / base_ms:6.2f}x  '
          f'{gbps:6.1f} GB/s', flush=True)
  print(f'  {copy.name:50s} {copy_ms:9.2f} ms  {copy_gbps:6.1f} GB/s')

  result = dict(
      command=' '.join(['python examples/bench_step.py'] + list(
          sys.argv[1:] if argv is None else argv)),
      git_revision=git_revision(),
      date=datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      machine=machine_line(),
      mode=mode,
      d=args.d, layers=args.layers, params=n,
      rounds=args.rounds, steps_per_optimizer=args.steps,
      copy_gbps=round(copy_gbps, 3),
      copy_bytes=copy.traffic,
      allocator=allocator,
      versions=package_versions(),
      rows=out_rows,
      notes=notes,
  )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, stem + '.json'), 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')
  write_outputs(result, args.out, stem)
  return result


if __name__ == '__main__':
  main()
