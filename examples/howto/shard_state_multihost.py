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
"""How-to: shard quantized optimizer state across processes (hosts).

Every process calls ``jax.distributed.initialize``, then runs the same
program: a mesh over every process's devices, parameters sharded on it
(each process builds only its own shards, with
``jax.make_array_from_callback``), and ``init`` and the step jitted with
``optax_q.state_shardings``. Each process then holds only its slice of the
codes and scales. No process can read a global array whole, so the check is
local: every process compares each of its shards, bit for bit, with the
same slice of an unsharded run it computes itself, and the verdicts are
gathered with ``multihost_utils.process_allgather``.

On one machine, over 127.0.0.1 (the script starts the processes itself,
each with ``--local-devices`` CPU devices, on a free port; exits 1 if a
shard differs or a process fails)::

  python examples/howto/shard_state_multihost.py --num-processes 2

On real hosts, one process per host, the same command on each with its own
``--process-id`` and the address of process 0's host (``--local-devices 0``
keeps the host's own devices, GPUs say, instead of simulated CPU ones)::

  python examples/howto/shard_state_multihost.py --num-processes 2 \\
      --process-id 0 --coordinator host0.example:12355 --local-devices 0
  python examples/howto/shard_state_multihost.py --num-processes 2 \\
      --process-id 1 --coordinator host0.example:12355 --local-devices 0

Every process stops by itself after ``--timeout`` seconds.
"""

import argparse
import faulthandler
import os
import socket
import subprocess
import sys
import tempfile
import time

import jax
from jax.experimental import multihost_utils
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import optax_q


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def make_params(columns: int):
  return {'w': np.linspace(-1.0, 1.0, 64 * columns,
                           dtype=np.float32).reshape(64, columns),
          'b': np.zeros((columns,), np.float32)}


def step_fn(tx):
  def step(p, state, i):
    g = jax.tree.map(lambda x: jnp.sin(3.0 * x + i), p)
    updates, state = tx.update(g, state, p)
    return optax.apply_updates(p, updates), state
  return step


def worker(args) -> bool:
  """One process: a sharded run, checked shard by shard."""
  jax.distributed.initialize(
      coordinator_address=args.coordinator,
      num_processes=args.num_processes, process_id=args.process_id,
      initialization_timeout=args.timeout)
  try:
    return _train_and_check(args)
  finally:
    jax.distributed.shutdown()


def _train_and_check(args) -> bool:
  n = jax.device_count()  # Every process's devices.
  mesh = jax.make_mesh((n,), ('model',))
  # 128 columns (one scale block) per device: codes and scales both split.
  host_params = make_params(128 * n)
  param_shardings = {'w': NamedSharding(mesh, P(None, 'model')),
                     'b': NamedSharding(mesh, P('model'))}
  # Each process gives only the slices its own devices hold.
  p = jax.tree.map(
      lambda x, s: jax.make_array_from_callback(
          x.shape, s, lambda idx, x=x: x[idx]),
      host_params, param_shardings)
  tx = optax_q.adamw(1e-3, mu_format=args.mu_format,
                     nu_format=args.nu_format, min_size=0)
  abstract = jax.eval_shape(tx.init, host_params)
  shardings = optax_q.state_shardings(abstract, param_shardings)
  state = jax.jit(tx.init, out_shardings=shardings)(p)
  step = step_fn(tx)
  sharded_step = jax.jit(step, in_shardings=(param_shardings, shardings, None),
                         out_shardings=(param_shardings, shardings))
  # The reference: the same run, unsharded, on this process's first device.
  want_p = jax.device_put(host_params, jax.local_devices()[0])
  want_state = jax.jit(tx.init)(want_p)
  plain_step = jax.jit(step)
  for i in range(args.steps):
    p, state = sharded_step(p, state, i)
    want_p, want_state = plain_step(want_p, want_state, i)

  got, want = jax.tree.leaves((p, state)), jax.tree.leaves((want_p, want_state))
  ok = len(got) == len(want)
  for a, b in zip(got, want):
    b = np.asarray(b)
    for shard in a.addressable_shards:
      ok &= np.array_equal(np.asarray(shard.data), b[shard.index])
  held = sum(shard.data.nbytes for x in jax.tree.leaves(state)
             for shard in x.addressable_shards)
  total = optax_q.state_nbytes(abstract)
  mu = state[0].inner_state.mu['w']
  print(f'process {jax.process_index()}: {jax.local_device_count()} of {n} '
        f'devices; state bytes on them {held} of {total} global; mu codes '
        f'{mu.codes.sharding.spec}, scales {mu.scale.sharding.spec}; own '
        f'shards bit-identical: {ok}',
        flush=True)
  oks = multihost_utils.process_allgather(np.array(ok))
  if jax.process_index() == 0:
    print(f'{jax.process_count()} processes, {n} devices: '
          f'every shard bit-identical to the unsharded run: {bool(oks.all())}',
          flush=True)
  return bool(oks.all())


def launch(args) -> bool:
  """Starts ``--num-processes`` workers on 127.0.0.1; prints their output."""
  coordinator = args.coordinator or f'127.0.0.1:{free_port()}'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  procs, logs = [], []
  try:
    for i in range(args.num_processes):
      logs.append(tempfile.TemporaryFile(mode='w+'))
      procs.append(subprocess.Popen(
          [sys.executable, os.path.abspath(__file__),
           '--num-processes', str(args.num_processes), '--process-id', str(i),
           '--coordinator', coordinator,
           '--local-devices', str(args.local_devices),
           '--steps', str(args.steps), '--timeout', str(args.timeout),
           '--mu-format', args.mu_format, '--nu-format', args.nu_format],
          env=env, stdout=logs[-1], stderr=subprocess.STDOUT))
    deadline = time.monotonic() + args.timeout + 10
    while (any(q.poll() is None for q in procs)
           and time.monotonic() < deadline):
      if any(q.poll() for q in procs):
        # One failed: the others would wait for it. Stop them soon.
        deadline = min(deadline, time.monotonic() + 5)
      time.sleep(0.1)
  finally:
    for q in procs:
      if q.poll() is None:
        q.kill()
      q.wait()
    for i, log in enumerate(logs):
      log.seek(0)
      text = log.read()
      log.close()
      if procs[i].returncode:
        print(f'--- process {i} exited with {procs[i].returncode}:\n{text}')
      else:
        print(text, end='')
  return all(q.returncode == 0 for q in procs)


def main(argv=None) -> bool:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--num-processes', type=int, default=2,
                      help='processes in the run, one per host')
  parser.add_argument('--process-id', type=int, default=None,
                      help='this process\'s index, 0 to num-processes - 1; '
                      'None: start every process here, on 127.0.0.1')
  parser.add_argument('--coordinator', default=None,
                      help='host:port of process 0, which every process '
                      'reaches; None: 127.0.0.1 and a free port (only '
                      'without --process-id)')
  parser.add_argument('--local-devices', type=int, default=4,
                      help='simulated CPU devices per process; 0: the '
                      'host\'s own devices')
  parser.add_argument('--steps', type=int, default=3,
                      help='optimizer steps')
  parser.add_argument('--mu-format', default='fp8_e4m3',
                      help='format of the first moment')
  parser.add_argument('--nu-format', default='int8_dynamic',
                      help='format of the second moment')
  parser.add_argument('--timeout', type=int, default=120,
                      help='seconds after which every process stops itself')
  args = parser.parse_args(argv)
  for flag, value, low in (('--num-processes', args.num_processes, 1),
                           ('--local-devices', args.local_devices, 0),
                           ('--steps', args.steps, 1),
                           ('--timeout', args.timeout, 1)):
    if value < low:
      parser.error(f'{flag} must be at least {low}, got {value}')
  if args.process_id is not None and not (
      0 <= args.process_id < args.num_processes):
    parser.error(f'--process-id must be in [0, {args.num_processes}), got '
                 f'{args.process_id}')
  if args.process_id is None:
    return launch(args)
  if args.coordinator is None:
    parser.error('--process-id needs --coordinator host:port')
  # Bounded: a process whose peers never come (or hang) exits by itself.
  faulthandler.dump_traceback_later(args.timeout, exit=True)
  if args.local_devices:
    # Before anything touches a device (jax reads it at backend start).
    jax.config.update('jax_platforms', 'cpu')
    jax.config.update('jax_num_cpu_devices', args.local_devices)
  return worker(args)


if __name__ == '__main__':
  sys.exit(0 if main() else 1)
