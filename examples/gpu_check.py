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
"""The GPU run: the kernel path against the XLA path, then step times.

Meant for a machine with a GPU and no network, run from the repository
without installing (the machine needs jax with CUDA, optax and ml_dtypes)::

  PYTHONPATH=. python examples/gpu_check.py --out docs/results

It does two things, in at most a few minutes on one GPU:

1. **Codes.** For the formats whose kernel Triton lowers (fp8 e4m3 and
   e5m2, int8) and one it does not (the dynamic map, which takes the XLA
   path), both roundings, five AdamW steps on a 1024 x 1024 leaf with
   ``kernel='xla'`` and with ``kernel='pallas'``, fed the same gradients;
   it records whether the compiled step holds the Triton kernel, counts
   the state elements that differ (a compiled kernel may form fused
   multiply-adds where XLA does not, which moves a last bit) or records
   why the kernel did not run.
2. **Speed.** `bench_step.py` on the GPU tree (width 1024, 24 layers, about
   302M parameters): ``optax.adamw`` in float32 and with a bfloat16 first
   moment, optax_q's XLA and kernel paths for 8-bit and 4-bit states, and a
   plain copy measured in the same run, whose bandwidth each row is
   compared with for the bytes it must move.

With ``--profile``, instead: where each row's step time goes, on a tree of
``--layers`` layers (12 is enough, and compiles in half the time): the
step's median wall time, the GPU's kernel time per step from a profiler
trace (``jax.profiler``), the kernels launched per step and the longest
ones by name, and, from the compiled program, the outputs of its reduction
kernels that are float32 arrays of a matrix parameter's size (new moments
written to memory beside their block maxima, and read back to be encoded).
Writes ``gpu_profile.json``.

Writes ``gpu_check.json`` (the codes) and ``bench_step_gpu.{json,md,png}``
to ``--out`` (default ``runs/gpu_check``). ``--publish DIR`` copies the
files a GPU run wrote to ``DIR`` into ``--out`` (``docs/results``), with the
output folder in their recorded commands replaced by ``--out``, and
re-renders the table and the plot.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import sys
import tempfile
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

import optax_q

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_step  # pylint: disable=g-import-not-at-top,wrong-import-position

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The formats whose kernel lowers with Triton (the others take the XLA path
# on a GPU even with kernel='pallas'), and one that does not, as a check.
CODE_FORMATS = ('fp8_e4m3', 'fp8_e5m2', 'int8', 'int8_dynamic')
BENCH_ROWS = frozenset([
    'optax.adamw mu_dtype=bf16',
    'optax_q fp32/fp32',
    'optax_q int8_dynamic nearest',
    'optax_q int8_dynamic stochastic',
    'optax_q fp8_e4m3 stochastic',
    'optax_q nf4/ue4m0 stochastic',
    'optax_q int4 nearest',
    'optax_q int8_dynamic nearest, kernel=xla',
] + [f'optax_q {fmt} nearest, kernel=pallas'
     for fmt in ('fp8_e4m3', 'int8')])


def compare_codes(mu: str, nu: str, rounding: str, steps: int = 5,
                  shape=(1024, 1024)) -> dict:
  """Runs the XLA and the kernel path side by side; counts differences."""
  rng = np.random.default_rng(0)
  params = {'w': jnp.asarray(rng.standard_normal(shape, np.float32)),
            'b': jnp.zeros(shape[-1:], jnp.float32)}
  grads = [jax.tree.map(
      lambda p: jnp.asarray(rng.standard_normal(p.shape, np.float32)), params)
           for _ in range(steps)]
  out = {}
  for kernel in ('xla', 'pallas'):
    tx = optax_q.adamw(1e-3, mu_format=mu, nu_format=nu, rounding=rounding,
                       kernel=kernel)

    @jax.jit
    def step(p, s, g, tx=tx):
      u, s = tx.update(g, s, p)
      return jax.tree.map(jnp.add, p, u), s

    p, s = params, tx.init(params)
    t0 = time.perf_counter()
    try:
      if kernel == 'pallas':
        # Whether the compiled step holds the Triton kernel at all.
        in_program = 'triton' in step.lower(p, s, grads[0]).as_text()
      for g in grads:
        p, s = step(p, s, g)
      jax.block_until_ready((p, s))
    except Exception as e:  # pylint: disable=broad-except
      msg = f'{type(e).__name__}: {e}'
      return dict(kernel_ran=False, error=msg.splitlines()[0][:400],
                  error_tail=msg[-1200:])
    out[kernel] = (p, s, time.perf_counter() - t0)
  (px, sx, tx_s), (pp, sp, tp_s) = out['xla'], out['pallas']
  # Elements whose bits differ (NaN-safe): codes, scales and counters.
  pairs = [(np.asarray(a), np.asarray(b))
           for a, b in zip(jax.tree.leaves(sx), jax.tree.leaves(sp))]
  state_total = sum(a.size for a, _ in pairs)
  state_diff = sum(int(np.sum(a.view(f'u{a.itemsize}')
                              != b.view(f'u{b.itemsize}')))
                   for a, b in pairs)
  param_gap = max(float(jnp.max(jnp.abs(a - b)))
                  for a, b in zip(jax.tree.leaves(px), jax.tree.leaves(pp)))
  return dict(kernel_ran=in_program, kernel_in_program=in_program,
              state_elements=state_total,
              state_elements_differing=state_diff,
              param_max_abs_difference=param_gap,
              first_run_seconds={'xla': round(tx_s, 3),
                                 'pallas': round(tp_s, 3)})


def profile_row(name: str, tx, shapes, steps: int = 5) -> dict:
  """Where one row's step time goes on this machine's first GPU."""
  t0 = time.perf_counter()
  row = bench_step.jax_row(
      name, tx, bench_step.host_arrays(shapes, 0),
      jax.tree.map(jnp.asarray, bench_step.host_arrays(shapes, 1)),
      sum(int(np.prod(s)) for s in shapes.values()))
  compile_s = time.perf_counter() - t0
  hlo = row.program()
  for _ in range(3):
    row.step()
  bench_step.measure([row], rounds=1, steps=10)
  trace_dir = tempfile.mkdtemp()
  jax.profiler.start_trace(trace_dir)
  for _ in range(steps):
    row.step()
  jax.profiler.stop_trace()
  kernels = collections.defaultdict(lambda: [0.0, 0])
  for path in glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                        recursive=True):
    for plane in jax.profiler.ProfileData.from_file(path).planes:
      if not plane.name.startswith('/device:'):
        continue
      for line in plane.lines:
        if 'Stream' not in line.name:  # The kernels, by stream.
          continue
        for event in line.events:
          kernels[event.name][0] += event.duration_ns / 1e3 / steps
          kernels[event.name][1] += 1 / steps
  entry = hlo[hlo.index('\nENTRY'):]
  n = {int(np.prod(s)) for s in shapes.values() if len(s) > 1}
  # Outputs of the compiled program's reduction kernels that are float32
  # arrays as large as a matrix parameter: new moments written to memory
  # beside their block maxima, and read back to be encoded.
  written = 0
  for fusion, outs in re.findall(
      r'%(\w+)(?:\.\d+)? = \(([^)]*)\) fusion\(', entry):
    for dims in re.findall(r'f32\[([\d,]+)\]', outs):
      written += ('reduce' in fusion
                  and int(np.prod([int(d) for d in dims.split(',')])) in n)
  longest = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:8]
  return dict(
      row=name, compile_seconds=round(compile_s, 1),
      step_ms_median=round(float(np.median(row.times)) * 1e3, 3),
      kernel_ms_per_step=round(sum(v[0] for v in kernels.values()) / 1e3, 3),
      kernels_per_step=round(sum(v[1] for v in kernels.values()), 1),
      fusions_in_program=entry.count(' fusion('),
      reduction_kernel_moment_outputs=written,
      longest_kernels_us_per_step=[
          dict(name=k, us=round(v[0], 1), launches=round(v[1], 1))
          for k, v in longest])


def publish(src: str, out: str) -> None:
  """Copies a GPU run's JSON results from ``src`` into ``out``."""
  stems = [stem for stem in ('gpu_check', 'bench_step_gpu', 'gpu_profile')
           if os.path.exists(os.path.join(src, stem + '.json'))]
  if not stems:
    raise SystemExit(f'--publish {src}: no gpu_check.json, '
                     'bench_step_gpu.json or gpu_profile.json there')
  for stem in stems:
    with open(os.path.join(src, stem + '.json')) as f:
      result = json.load(f)
    words = result['command'].split()
    if '--out' in words:
      words[words.index('--out') + 1] = os.path.relpath(out, _ROOT)
    result['command'] = ' '.join(words)
    with open(os.path.join(out, stem + '.json'), 'w') as f:
      json.dump(result, f, indent=2)
      f.write('\n')
    if stem == 'bench_step_gpu':
      bench_step.write_outputs(result, out, stem)
    print(f'published {stem} to {out}')


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--out', default=os.path.join(_ROOT, 'runs',
                                                    'gpu_check'),
                      help='directory for the result files (default: '
                      'runs/gpu_check; docs/results for the published ones)')
  parser.add_argument('--revision', default=None,
                      help='the commit measured, where the copy has no .git')
  parser.add_argument('--d', type=int, default=1024,
                      help='model width of the benchmark tree (default: '
                      '%(default)s)')
  parser.add_argument('--layers', type=int, default=24,
                      help='layers of the benchmark tree (default: '
                      '%(default)s)')
  parser.add_argument('--publish', default=None, metavar='DIR',
                      help='no measurement: publish the results in DIR')
  parser.add_argument('--skip-bench', action='store_true',
                      help='only compare the kernel with the XLA loop')
  parser.add_argument('--skip-codes', action='store_true',
                      help='only run the benchmark')
  parser.add_argument('--max-setup-seconds', type=float, default=240,
                      help="bench_step's budget for compiling its rows "
                      '(default: %(default)s; the rows ready by then are '
                      'measured, the others noted as not run)')
  parser.add_argument('--profile', action='store_true',
                      help='where the step time goes, row by row (see above; '
                      'with --layers 12)')
  parser.add_argument('--rows', default='',
                      help='semicolon-separated exact row names of bench_step '
                      '(default: the 8-bit and 4-bit rows above)')
  args = parser.parse_args(argv)
  os.makedirs(args.out, exist_ok=True)
  if args.publish:
    publish(args.publish, args.out)
    return
  dev = jax.devices()[0]
  print(f'{dev.platform} {getattr(dev, "device_kind", "")}; '
        f'jax {jax.__version__}', flush=True)
  revision = args.revision or bench_step.git_revision()
  header = dict(
      command='python examples/gpu_check.py ' + ' '.join(
          sys.argv[1:] if argv is None else argv),
      git_revision=revision,
      date=datetime.datetime.now(datetime.timezone.utc).strftime(
          '%Y-%m-%dT%H:%M:%SZ'),
      machine=bench_step.machine_line(),
      versions=bench_step.package_versions())
  if args.profile:
    wanted = (args.rows.split(';') if args.rows
              else [bench_step.BASELINE] + sorted(BENCH_ROWS))
    configs = dict(bench_step.jax_configs())
    unknown = [r for r in wanted if r not in configs]
    if unknown:
      raise SystemExit(f'--rows: unknown rows {unknown}')
    shapes = bench_step.param_shapes(args.d, args.layers)
    rows = []
    for name in wanted:
      rows.append(profile_row(name, configs[name](), shapes))
      print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(args.out, 'gpu_profile.json'), 'w') as f:
      json.dump(dict(header, d=args.d, layers=args.layers, rows=rows), f,
                indent=2)
      f.write('\n')
    return

  codes = []
  for fmt in () if args.skip_codes else CODE_FORMATS:
    mu, nu = fmt if isinstance(fmt, tuple) else (fmt, fmt)
    for rounding in ('nearest', 'stochastic'):
      t0 = time.perf_counter()
      try:
        r = compare_codes(mu, nu, rounding)
      except Exception:  # pylint: disable=broad-except
        r = dict(kernel_ran=False, error=traceback.format_exc()[-600:])
      r.update(mu_format=mu, nu_format=nu, rounding=rounding,
               seconds=round(time.perf_counter() - t0, 2))
      codes.append(r)
      print(json.dumps({k: v for k, v in r.items() if k != 'error_tail'}),
            flush=True)
  check = dict(header, codes=codes)
  if codes:
    with open(os.path.join(args.out, 'gpu_check.json'), 'w') as f:
      json.dump(check, f, indent=2)
      f.write('\n')
  if args.skip_bench:
    return
  # bench_step's main table, narrowed to these rows (exact names).
  bench_step.MAIN_ROWS = (frozenset(args.rows.split(';')) if args.rows
                          else BENCH_ROWS)
  bench_step.git_revision = lambda: revision
  bench_step.main(['--d', str(args.d), '--layers', str(args.layers),
                   '--no-peers', '--max-setup-seconds',
                   str(args.max_setup_seconds), '--name', 'bench_step_gpu',
                   '--out', args.out])


if __name__ == '__main__':
  main()
