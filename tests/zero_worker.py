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
"""ZeRO-1 in a two-process ``jax.distributed`` run.

Replicated parameters, the 8-bit AdamW state split over the ``'data'`` axis
of a mesh of every process's devices (two CPU devices per process), in
host memory between steps if asked. Each process writes the digest of the
gathered result and the bytes of the state it holds. As a script, one
worker::

  python tests/zero_worker.py --process-id 0 --port 12355 --out runs/zero &
  python tests/zero_worker.py --process-id 1 --port 12355 --out runs/zero
"""

import argparse
import json
import pathlib

import jax
import numpy as np

import adaptive_worker

STEPS = 3
LOCAL_DEVICES = 2


def params():
  """A matrix, a vector of 32-element blocks, and a (7,) bias."""
  rng = np.random.default_rng(0)
  return {'w': rng.standard_normal((64, 256)).astype(np.float32),
          'v': rng.standard_normal((512,)).astype(np.float32),
          'b': rng.standard_normal((7,)).astype(np.float32)}


def grads(i):
  rng = np.random.default_rng(100 + i)
  return {k: rng.standard_normal(v.shape).astype(np.float32)
          for k, v in params().items()}


def make_tx():
  import optax_q  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  return optax_q.adamw(1e-2, mu_format='int8', nu_format='int4',
                       block_size=32, min_size=0)


def train(mesh=None, memory_kind=None):
  """The run: the digest of (params, state) and the state's bytes on this
  process's devices."""
  import optax_q  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  tx = make_tx()
  p = params()
  step = adaptive_worker.step_fn(tx)
  if mesh is None:
    state = jax.jit(tx.init)(p)
    for i in range(STEPS):
      p, state = jax.jit(step)(p, state, grads(i))
    return dict(digest=adaptive_worker.digest((p, state)),
                state_bytes=optax_q.state_nbytes(state))
  replicated = {k: NamedSharding(mesh, P()) for k in p}
  abstract = jax.eval_shape(tx.init, p)
  on_device = optax_q.state_shardings(abstract, replicated,
                                      shard_over='data')
  stored = optax_q.state_shardings(abstract, replicated, shard_over='data',
                                   memory_kind=memory_kind)

  def offloaded(p, state, g):
    p, state = step(p, jax.device_put(state, on_device), g)
    return p, jax.device_put(state, stored)

  sharded_step = jax.jit(offloaded, in_shardings=(replicated, stored,
                                                  replicated),
                         out_shardings=(replicated, stored))
  p = jax.tree.map(lambda x, s: jax.make_array_from_callback(
      x.shape, s, lambda idx, x=x: x[idx]), p, replicated)
  state = jax.jit(tx.init, out_shardings=stored)(p)
  for i in range(STEPS):
    g = jax.tree.map(lambda x, s: jax.make_array_from_callback(
        x.shape, s, lambda idx, x=x: x[idx]), grads(i), replicated)
    p, state = sharded_step(p, state, g)
  leaves = jax.tree.leaves(state)
  return dict(
      digest=adaptive_worker.digest((p, state)),
      local_bytes=sum(s.data.nbytes for x in leaves
                      for s in x.addressable_shards),
      device_bytes=[sum(s.data.nbytes for x in leaves
                        for s in x.addressable_shards if s.device == d)
                    for d in jax.local_devices()],
      memory_kinds=sorted({x.sharding.memory_kind for x in leaves}),
      mu_spec=str(state[0].inner_state.mu['w'].codes.sharding.spec))


def worker(process_id, num_processes, port, out, memory_kind):
  jax.distributed.initialize(
      coordinator_address=f'localhost:{port}', num_processes=num_processes,
      process_id=process_id, initialization_timeout=120)
  try:
    mesh = jax.make_mesh((jax.device_count(),), ('data',))
    result = train(mesh, memory_kind)
    pathlib.Path(out, f'worker{process_id}.json').write_text(
        json.dumps(result))
  finally:
    jax.distributed.shutdown()


def launch(out, num_processes=2, timeout=240, memory_kind=None):
  """Runs the workers; returns their results in process order."""
  return adaptive_worker.launch(
      out, num_processes, timeout, script=__file__,
      local_devices=LOCAL_DEVICES,
      args=['--memory-kind', memory_kind] if memory_kind else [])


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--process-id', type=int, required=True)
  parser.add_argument('--num-processes', type=int, default=2)
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--memory-kind', default=None)
  args = parser.parse_args()
  worker(args.process_id, args.num_processes, args.port, args.out,
         args.memory_kind)
