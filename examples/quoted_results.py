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
"""The results the README and the documentation quote, written from the JSON.

A page quotes a result between two comments::

  <!-- results: step_cost_table -->

  ...

  <!-- /results -->

and this script writes the text between them from ``docs/results/*.json``
(the same files the results pages are rendered from), so that a quoted
number is never typed by hand and never outlives the run it comes from.
After a new run, re-write every quote (``--check`` only reports the ones
that differ, and the test suite fails on them)::

  python examples/quoted_results.py
  python examples/quoted_results.py --check
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import textwrap
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / 'docs' / 'results'
PAGES = (ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md')))
BLOCK = re.compile(r'(<!-- results: (\S+) -->\n)(.*?)(<!-- /results -->)',
                   re.S)

BASELINE = 'optax.adamw fp32'
FP8_NEAREST = 'optax_q fp8_e4m3 nearest'
FP8_STOCHASTIC = 'optax_q fp8_e4m3 stochastic'
DEFAULT = 'optax_q int8_dynamic stochastic'
NF4 = 'optax_q nf4/ue4m0 stochastic'
# The precision study's full-mode runs that measured the drop-ins' defaults.
PRECISION_RUNS = ('precision_full', 'precision_seeds_floor',
                  'precision_layouts')


def _load(name: str) -> dict:
  return json.loads((RESULTS / f'{name}.json').read_text())


def _bench() -> tuple[dict, dict[str, dict]]:
  result = _load('bench_step')
  return result, {r['config']: r for r in result['rows']}


def _ms(row) -> str:
  return f"{row['step_ms_median']:.2f} ms"


def _mib(row) -> str:
  return f"{row['state_bytes'] / 2**20:.1f} MiB"


def _ratio(row) -> str:
  return f"{row['ratio_to_optax_adamw']:.2f}x"


def _span(values, spec: str, unit: str = '') -> str:
  low, high = min(values), max(values)
  if format(low, spec) == format(high, spec):
    return format(low, spec) + unit
  return f'{low:{spec}}{unit} to {high:{spec}}{unit}'


def _faster(ours: dict, theirs: dict) -> str:
  """How ours compares with theirs, in times ('1.26x faster')."""
  a, b = ours['step_ms_median'], theirs['step_ms_median']
  return f'{b / a:.2f}x faster' if a <= b else f'{a / b:.2f}x slower'


def _setup(result) -> str:
  return (f"AdamW on a {result['params'] / 1e6:.1f}M-parameter tree "
          f"({result['layers']} layers, width {result['d']}) on "
          f"{result['machine'].split(';')[0]}")


def step_cost_summary() -> str:
  """The README's paragraph on step time and state memory."""
  result, rows = _bench()
  eight = [rows[c] for c in (FP8_NEAREST, FP8_STOCHASTIC, DEFAULT)]
  return (
      f"The optimizer step of {_setup(result)} "
      f"(`examples/bench_step.py`, `docs/results/bench_step.md`) takes "
      f"{_ms(rows[BASELINE])} with float32 `optax.adamw` and "
      f"{_mib(rows[BASELINE])} of state. With 8-bit state "
      f"({_mib(rows[DEFAULT])}) it takes {_ms(rows[FP8_NEAREST])} for fp8 "
      f"with nearest rounding, {_ms(rows[FP8_STOCHASTIC])} for fp8 with "
      f"stochastic rounding and {_ms(rows[DEFAULT])} for the default "
      f"int8_dynamic with stochastic rounding "
      f"({_span([r['ratio_to_optax_adamw'] for r in eight], '.1f', 'x')} "
      f"the float32 step). With 4-bit `nf4`/`ue4m0` state "
      f"({_mib(rows[NF4])}, stochastic) it takes {_ms(rows[NF4])}. "
      f"torchao's `AdamWFp8` takes {_ms(rows['torchao AdamWFp8'])} in the "
      f"same run.\n")


def step_cost_table() -> str:
  """The quick start's table of step time and state memory."""
  result, rows = _bench()
  shown = ((BASELINE, '`optax.adamw`, float32'),
           (FP8_NEAREST, 'fp8 e4m3, nearest'),
           (FP8_STOCHASTIC, 'fp8 e4m3, stochastic'),
           (DEFAULT, 'int8_dynamic, stochastic (the default)'),
           (NF4, '`nf4`/`ue4m0`, stochastic'))
  lines = ['| state | step (median) | against `optax.adamw` | state memory |',
           '|---|---:|---:|---:|']
  lines += [f'| {label} | {_ms(rows[c])} | {_ratio(rows[c])} | '
            f'{_mib(rows[c])} |' for c, label in shown]
  eight = [rows[c] for c in (FP8_NEAREST, FP8_STOCHASTIC, DEFAULT)]
  saved = 1 - rows[DEFAULT]['state_bytes'] / rows[BASELINE]['state_bytes']
  return (
      f"The optimizer step alone, for {_setup(result)}, measured in one "
      f"interleaved run (`{result['command']}`; "
      f"[table](results/bench_step.md)):\n\n" + '\n'.join(lines) +
      f"\n\nSo on CPU the smaller state costs step time: with 8-bit state, "
      f"{saved:.0%} less memory for "
      f"{_span([r['ratio_to_optax_adamw'] for r in eight], '.1f')} times "
      f"the optimizer step (the forward and backward passes of a real model "
      f"come on top of it and are unchanged).\n")


def peers_step_table() -> str:
  """The comparison page's table of optax_q and its peers, and the ratios."""
  result, rows = _bench()
  shown = ((BASELINE, '`optax.adamw` (fp32)'),
           ('optax.adamw mu_dtype=bf16', '`optax.adamw`, `mu_dtype=bf16`'),
           ('torch.optim.AdamW fused', '`torch.optim.AdamW` fused (fp32)'),
           ('optax_q bf16 stochastic', 'optax_q bf16, stochastic'),
           (FP8_NEAREST, 'optax_q fp8 e4m3, nearest'),
           (FP8_STOCHASTIC, 'optax_q fp8 e4m3, stochastic'),
           ('optax_q int8_dynamic nearest', 'optax_q int8_dynamic, nearest'),
           (DEFAULT, 'optax_q int8_dynamic, stochastic'),
           ('torchao AdamWFp8', 'torchao `AdamWFp8`'),
           ('torchao AdamW8bit', 'torchao `AdamW8bit`'),
           ('bitsandbytes Adam8bit', 'bitsandbytes `Adam8bit`'),
           ('optax_q int4 stochastic', 'optax_q int4, stochastic'),
           (NF4, 'optax_q `nf4`/`ue4m0`, stochastic'),
           ('torchao AdamW4bit', 'torchao `AdamW4bit`'))
  lines = ['| optimizer | state bits per element | step (median) | '
           'against `optax.adamw` |', '|---|---:|---:|---:|']
  lines += [f"| {label} | {rows[c]['state_bits_per_element']:.2f} | "
            f"{_ms(rows[c])} | {_ratio(rows[c])} |" for c, label in shown]
  eight = [c for c, _ in shown if 8 <= rows[c]['state_bits_per_element'] < 9]
  fastest = min(eight, key=lambda c: rows[c]['step_ms_median'])
  fp8_n, fp8_s = rows[FP8_NEAREST], rows[FP8_STOCHASTIC]
  int8_n, int8_s = rows['optax_q int8_dynamic nearest'], rows[DEFAULT]
  tao8, bnb = rows['torchao AdamW8bit'], rows['bitsandbytes Adam8bit']
  tao_fp8, tao4 = rows['torchao AdamWFp8'], rows['torchao AdamW4bit']
  ours4 = [rows['optax_q int4 stochastic'], rows[NF4]]
  return (
      f"From `{result['command']}` ([table](results/bench_step.md)), with "
      f"every row measured in one interleaved run on "
      f"{result['machine'].split(',')[0]}:\n\n" + '\n'.join(lines) +
      f"\n\nOn CPU every quantized optimizer costs step time against its "
      f"float32 counterpart. In this run the fastest 8-bit step is "
      f"{dict(shown)[fastest]}. Against torchao's `AdamWFp8` (which rounds "
      f"to nearest), optax_q's fp8 is {_faster(fp8_n, tao_fp8)} to nearest "
      f"and {_faster(fp8_s, tao_fp8)} with stochastic rounding. optax_q's "
      f"int8_dynamic is {_faster(int8_s, tao8)} than torchao's `AdamW8bit` "
      f"with stochastic rounding ({_faster(int8_n, tao8)} to nearest) and "
      f"{_faster(int8_s, bnb)} than bitsandbytes' `Adam8bit` "
      f"({_faster(int8_n, bnb)} to nearest). At 4 bits optax_q's int4 and "
      f"`nf4`/`ue4m0` are "
      f"{_span([tao4['step_ms_median'] / r['step_ms_median'] for r in ours4], '.2f', 'x')}"
      f" faster than torchao's `AdamW4bit`.\n")


def precision_summary() -> str:
  """The loss of the drop-ins' 8-bit states against float32 AdamW."""
  parts = []
  for config, label in (('int8_dynamic/sr', 'int8_dynamic'),
                        ('fp8_e4m3/sr', 'fp8 e4m3')):
    found = []
    for run in PRECISION_RUNS:
      summary = {s['config']: s for s in _load(run)['summary']}
      if config in summary:
        found.append(summary[config])
    gaps = [100 * s['mean_rel_gap'] for s in found]
    missed = [g for s, g in zip(found, gaps) if s['met'] is False]
    note = ''.join(f'; the {g:+.2f}% one misses the +0.5% target'
                   for g in missed)
    parts.append(f"{label} with stochastic rounding "
                 f"{_span(gaps, '+.2f', '%')} ({len(found)} runs{note})")
  return (f"On the small GPT in full mode, the loss against float32 AdamW "
          f"is: {parts[0]}; {parts[1]}.\n")


def eco_summary() -> str:
  """The README's sentence on ECO with 8- and 4-bit moments."""
  result = _load('eco')
  summary = {s['config']: s for s in result['summary']}
  # The configuration the sentence describes: fp8 weights without master
  # copies, first moment in 8 bits and second moment in 4.
  ours, fp32 = summary['fp8 ECO sr + m8/v4'], summary['fp32']
  reference = next(c for c, s in summary.items() if s['delta_pct'] == 0.0)
  run = result['meta']['run_config']
  return (
      f"ECO with `optax_q.quantize_state` keeping the moments in 8 and 4 "
      f"bits takes {ours['bytes_per_param']:.2f} bytes per parameter instead of "
      f"{fp32['bytes_per_param']:.0f} for float32 AdamW, with a validation "
      f"loss {ours['delta_pct']:+.2f}% from `{reference}` (master weights) "
      f"on a small GPT (width {run['d_model']}, {run['num_layers']} layers, "
      f"{result['meta']['steps']} steps, {len(result['meta']['seeds'])} "
      f"seeds; `docs/results/eco.md`)."
      f"{_eco_fidelity(ours, result['meta'].get('fidelity'))}\n")


def _eco_fidelity(summary: dict, record: dict | None) -> str:
  """The sentence on the fidelity of an ECO row ('' where not measured);
  ``record``: how it was added to the published runs, if it was."""
  if summary.get('cosine') is None:
    return ''
  seeds = (f"seed{'s' if len(record['seeds']) > 1 else ''} "
           f"{', '.join(map(str, record['seeds']))}" if record else
           'mean over the seeds')
  return (f" Beside float32 AdamW fed the same gradients, the update it "
          f"applies has a norm ratio of {_fid(summary, 'norm_ratio')} and a "
          f"cosine of {_fid(summary, 'cosine')} (medians over the steps, "
          f"{seeds}), "
          f"and its weights end {_fid(summary, 'weight_distance')} from the "
          f"float32 run's, relative to how far that run moved "
          f"(`docs/fidelity.md`).")


def _fid(summary: dict, key: str) -> str:
  """A fidelity number of a summary row, or '-' where it was not measured."""
  return '-' if summary.get(key) is None else f'{summary[key]:.3f}'


def lowbit_quality_table() -> str:
  """The comparison page's teacher-student table of 8- and 4-bit states."""
  result = _load('lowbit')
  summary = {s['config']: s for s in result['summary']}
  meta = result['meta']
  shown = (('torch.optim.AdamW', '`torch.optim.AdamW` (fp32)'),
           ('torchao AdamW8bit', 'torchao `AdamW8bit`'),
           ('int8_dynamic', 'optax_q int8_dynamic'),
           ('torchao AdamW4bit', 'torchao `AdamW4bit`'),
           ('4bit (fp4_e2m1 + fp4_e2m2u)',
            'optax_q `fp4_e2m1` + `fp4_e2m2u`'),
           ('nf4 + ue4m0', 'optax_q `nf4` + `ue4m0`'),
           ('nf4 + ue4m0, pow2 scales',
            'optax_q `nf4` + `ue4m0`, power-of-two scales'),
           ('nf4 + int4_mulaw, preconditioner rounding',
            "optax_q `nf4` + `int4_mulaw`, `rounding='preconditioner'` "
            '(recommended)'),
           ('nf3 + int3_mulaw, pow2 scales',
            'optax_q `nf3` + `int3_mulaw`, power-of-two scales'))
  lines = ['| optimizer | state bits per element (all moments) | '
           'final loss / `optax.adamw` | update-norm ratio | update cosine |',
           '|---|---:|---:|---:|---:|']
  lines += [f"| {label} | {summary[c]['all_bits']:.2f} | "
            f"{summary[c]['ratio']:.2f} | {_fid(summary[c], 'norm_ratio')} | "
            f"{_fid(summary[c], 'cosine')} |" for c, label in shown]
  return (
      f"From `examples/study_lowbit.py` ([results](results/lowbit.md), with "
      f"the command of each run): a tanh MLP 64-256-256-10 learning a "
      f"teacher of the same shape, AdamW, {meta['steps']} steps, "
      f"{len(meta['seeds'])} seeds; each peer trains the same data from the "
      f"same initial weights, copied into PyTorch. Final loss over "
      f"`optax.adamw`'s (mean over seeds), and fidelity to a float32 twin "
      f"fed the same gradients (medians over the steps; not measured for "
      f"the peers): an update-norm ratio above one is a larger effective "
      f"step than float32 AdamW's, which lowers this problem's loss without "
      f"being more precise ([Fidelity](fidelity.md)):\n\n"
      + '\n'.join(lines) + '\n')


def lowbit_table() -> str:
  """The low-bit page's teacher-student table: every state's loss ratio
  beside its fidelity to the float32 twin."""
  result = _load('lowbit')
  lines = ['| state | bits per element (quantized) | final loss / fp32 | '
           'update-norm ratio | update cosine | weight distance |',
           '|---|---:|---:|---:|---:|---:|']
  for s in result['summary']:
    if s['config'] == 'fp32' or s['bits'] is None:
      continue  # float32 itself, and the peers (their own rows below).
    lines.append(f"| {s['config']} | {s['bits']:.2f} | {s['ratio']:.2f} | "
                 f"{_fid(s, 'norm_ratio')} | {_fid(s, 'cosine')} | "
                 f"{_fid(s, 'weight_distance')} |")
  for s in result['summary']:
    if s['bits'] is None and s['config'] != 'fp32':
      lines.append(f"| {s['config']} (peer) | {s['all_bits']:.2f} (all "
                   f"moments) | {s['ratio']:.2f} | - | - | - |")
  return '\n'.join(lines) + '\n'


def fidelity_recommendations() -> str:
  """The recommended 4- and 3-bit states, chosen on fidelity."""
  result = _load('fidelity')
  by = {(s['problem'], s['config']): s for s in result['summary']}
  parts = []
  for key, label in (('recommended_4bit', '4-bit'),
                     ('recommended_3bit', '3-bit')):
    rec = result.get(key)
    if rec is None:
      parts.append(f'No {label} state met the window rule.')
      continue
    kwargs = ', '.join(f'{k}={v!r}' for k, v in rec['adamw_kwargs'].items())
    other = '; '.join(
        f"{p.replace('_', '-')} {by[(p, rec['config'])]['norm_ratio']:.3f} "
        f"and {by[(p, rec['config'])]['cosine']:.3f}"
        for p in ('digits', 'lm') if (p, rec['config']) in by)
    parts.append(
        f"{label} (`{key}`, {rec['bits']:.2f} bits per moment element): "
        f"`optax_q.adamw(lr, {kwargs})`. On the teacher-student problem its "
        f"update-norm ratio to the float32 twin is {rec['norm_ratio']:.3f} "
        f"and its update cosine {rec['cosine']:.3f} (median over steps, "
        f"mean over seeds; {other}), its final loss "
        f"{rec['loss_ratio']:.2f}x float32's, its learning-rate window "
        f"{rec['window_vs_fp32']:.2f}x as wide as float32's and its best "
        f"loss over the sweep {rec['best_vs_fp32']:.2f}x float32's best.")
  meta, rule = result['meta'], result['rule']
  problems = sorted({s['problem'].replace('_', '-')
                     for s in result['summary']})
  return (
      f"From `examples/study_fidelity.py` ([results](results/fidelity.md), "
      f"revision {meta['git_revision']}): per bit class, among the swept "
      f"states whose learning-rate window on the teacher-student problem is "
      f"at least {rule['min_window']:.0%} of float32's, the one whose updates "
      f"follow float32 AdamW's most closely (highest mean update cosine over "
      f"the problems: {', '.join(problems)}).\n"
      f"\n" + '\n\n'.join(parts) + '\n')


def leafwise_summary() -> str:
  """The guide's comparison of the tiled leafwise path with the whole tree."""
  result, rows = _bench()
  parts = []
  for fmt, label in (('int8_dynamic', 'int8_dynamic'), ('fp8_e4m3', 'fp8')):
    tiled = rows[f'optax_q {fmt} stochastic']
    whole = rows[f'optax_q {fmt} stochastic, whole-tree path']
    parts.append(
        f"for {label}, {tiled['temp_bytes'] / 2**20:.0f} MiB of compiled "
        f"temporaries instead of {whole['temp_bytes'] / 2**20:.0f} MiB and "
        f"{_faster(tiled, whole)}")
  return (
      f"On AdamW's step for a {result['params'] / 1e6:.0f}M-parameter tree "
      f"with stochastic rounding ([results](results/bench_step.md)), the "
      f"compiled step then holds one tile of float32 moments instead of the "
      f"whole state: {parts[0]}; {parts[1]} (see "
      f"[Performance](performance.md)).\n")


def positive_floor_effect() -> str:
  """The guide's measure of a second moment stored as zero."""
  rows = {(r['mu_format'], r['rounding']): r
          for r in _load('update_error_no_floor')['rows']}
  nearest, stochastic = (rows[('fp8_e4m3', r)]['relative_error']
                         for r in ('nearest', 'stochastic'))
  return (
      f"Measured in `precision.md` (`docs/results/update_error_no_floor.md`): "
      f"without the floor, one fp8 e4m3 write-back of a real Adam state "
      f"changed the next update by {nearest:.1f} (nearest) and "
      f"{stochastic:.1f} (stochastic) times its norm.\n")


def gpu_summary() -> str:
  """The performance page's GPU section: step times and the kernel's fate."""
  bench = _load('bench_step_gpu')
  check = _load('gpu_check')
  rows = {r['config']: r for r in bench['rows']}
  ours = [r['ratio_to_optax_adamw'] for c, r in rows.items()
          if c.startswith('optax_q')]
  lines = ['| state | step (median) | against `optax.adamw` | state memory '
           '| fraction of copy bandwidth |', '|---|---:|---:|---:|---:|']
  lines += [f"| {r['config']} | {_ms(r)} | {_ratio(r)} | {_mib(r)} | "
            f"{r['frac_of_copy']:.2f} |" for r in bench['rows']]
  cases = ['| moments | rounding | kernel on the GPU |', '|---|---|---|']
  cases += [f"| {c['mu_format']}/{c['nu_format']} | {c['rounding']} | "
            + ('ran' if c['kernel_ran'] else
               'refused: `' + c['error'].split('. ')[0][:110] + '`') + ' |'
            for c in check['codes']]
  ran = sum(c['kernel_ran'] for c in check['codes'])
  return (
      f"Measured once, on {bench['machine'].split(' on ')[-1]} with jax "
      f"{bench['versions']['jax']} (revision {bench['git_revision']}, "
      f"[table](results/bench_step_gpu.md)): the optimizer step of AdamW on "
      f"a {bench['params'] / 1e6:.1f}M-parameter tree ({bench['layers']} "
      f"layers, width {bench['d']}), with a plain copy measured in the "
      f"same run ({bench['copy_gbps']:.0f} GB/s read + write).\n\n"
      + '\n'.join(lines) +
      f"\n\nThe XLA path of that revision, which updated every large "
      f"parameter in a loop over tiles of rows (the CPU's plan), ran on the "
      f"GPU but slowly: {_span(ours, '.2f', 'x')} "
      f"the float32 step, where float32 `optax.adamw` reaches "
      f"{rows[BASELINE]['frac_of_copy']:.0%} of the copy bandwidth. The "
      f"Pallas kernel (`{check['command']}`, five steps on a 1024 x 1024 "
      f"leaf against the XLA loop) ran in {ran} of the "
      f"{len(check['codes'])} cases; Pallas' Triton lowering refused the "
      f"others:\n\n" + '\n'.join(cases) + '\n')


def roofline_summary() -> str:
  """The performance page's roofline: bytes per parameter, least times."""
  result = _load('roofline')
  names = list(result['bandwidths'])
  lines = ['| state | state bytes / param | bytes moved / param | '
           + ' | '.join(f'least ms per 1B params, {k}' for k in names)
           + ' |', '|---|---:|---:|' + '---:|' * len(names)]
  lines += [f"| {r['config']} | {r['state_bytes_per_param']:.2f} | "
            f"{r['moved_bytes_per_param']:.2f} | "
            + ' | '.join(f"{r['ms_per_billion'][k]:.2f}" for k in names)
            + ' |' for r in result['rows']]
  measured = [r for r in result['rows'] if 'gpu_measured_ms' in r]
  text = (f"From `{result['command']}` (revision {result['git_revision']}, "
          "[table](results/roofline.md)): the gradient read "
          f"({result['grad_bytes']} bytes, float32), the parameter read and "
          f"written (2 x {result['param_bytes']}), and the whole state read "
          "and written, per parameter and step; the state's bytes are its "
          "real layout on the GPU benchmark tree (codes, block scales, "
          "counters).\n\n" + '\n'.join(lines) + '\n')
  if measured:
    text += (
        f"\nOn one {result['measured_on'].rsplit('(', 1)[-1].rstrip(')')} "
        f"(revision "
        f"{result['measured_revision']}) the measured step of the "
        f"{result['params'] / 1e6:.1f}M-parameter tree was "
        + ', '.join(f"{c} {ms:.2f} ms ({ms / r['gpu_bound_ms']:.1f}x "
                    f"its {r['gpu_bound_ms']:.2f} ms bound)"
                    for r in measured
                    for c, ms in r['gpu_measured_ms'].items())
        + f". A plain copy in the same run moved "
        f"{result['measured_copy_gbps']:.0f} GB/s (read + write), against "
        f"the 3.0 TB/s the bound assumes.\n")
  return text


def offload_summary() -> str:
  """The performance page's host offload: steps side by side, PCIe bytes."""
  result = _load('bench_offload')
  rows = {r['config']: r for r in result['rows']}
  states = [c.rsplit(', ', 1)[0] for c in rows if c.endswith('on device')]
  per_s = result['pcie_gen5_x16_bytes_per_s']
  lines = ['| state | state bytes | moved per step (in + out) | on device | '
           'offloaded | PCIe gen5 x16, per direction | the same for 1B '
           'params |', '|---|---:|---:|---:|---:|---:|---:|']
  for state in states:
    on, off = rows[f'{state}, on device'], rows[f'{state}, offloaded']
    per_param = off['state_bytes'] / result['params']
    lines.append(
        f"| {state} | {off['state_bytes'] / 1e6:.1f} MB | "
        f"{off['bytes_moved_per_step'] / 1e6:.1f} MB | {_ms(on)} | "
        f"{_ms(off)} | {off['pcie_gen5_x16_ms_per_direction']:.2f} ms | "
        f"{1e3 * per_param * 1e9 / per_s:.1f} ms |")
  return (
      f"From `{result['command']}` (revision {result['git_revision']}, "
      f"{result['date'][:10]}, {result['machine']}): AdamW on the bench's "
      f"transformer tree at d={result['d']} and {result['layers']} layers "
      f"({result['params'] / 1e6:.2f}M parameters), medians of "
      f"{on['steps']} steps taken round-robin over {result['rounds']} "
      "rounds. The PCIe columns divide the bytes by "
      f"{per_s / 1e9:.0f} GB/s ({result['pcie_note']}).\n\n"
      + '\n'.join(lines) + '\n')


RENDERERS: dict[str, Callable[[], str]] = {
    f.__name__: f for f in (step_cost_summary, step_cost_table, gpu_summary,
                            peers_step_table, precision_summary,
                            eco_summary, lowbit_quality_table,
                            fidelity_recommendations, lowbit_table,
                            leafwise_summary, positive_floor_effect,
                            roofline_summary, offload_summary)
}


def _wrap(text: str) -> str:
  """Prose paragraphs wrapped at 76 columns; tables as they are."""
  return '\n\n'.join(
      p if p.startswith('|') else textwrap.fill(
          p, 76, break_long_words=False, break_on_hyphens=False)
      for p in text.strip('\n').split('\n\n')) + '\n'


def render(text: str) -> str:
  """``text`` with every quote block re-written from the results."""
  def block(match):
    name = match.group(2)
    if name not in RENDERERS:
      raise ValueError(f'unknown quote {name!r}; known: {sorted(RENDERERS)}')
    return (match.group(1) + '\n' + _wrap(RENDERERS[name]()) + '\n' +
            match.group(4))
  return BLOCK.sub(block, text)


def blocks(text: str) -> list[str]:
  """The names of the quote blocks in ``text``, in order."""
  return [m.group(2) for m in BLOCK.finditer(text)]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='write nothing; exit 1 if a quote differs')
  args = parser.parse_args(argv)
  stale = []
  for page in PAGES:
    text = page.read_text()
    new = render(text)
    if new != text:
      stale.append(str(page.relative_to(ROOT)))
      if not args.check:
        page.write_text(new)
  verb = 'differ' if args.check else 're-written'
  print(f"{verb}: {', '.join(stale)}" if stale else 'every quote is current')
  return 1 if args.check and stale else 0


if __name__ == '__main__':
  sys.exit(main())
