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
"""Where the compiled step is cut into fusions of its own.

XLA fuses elementwise work into every consumer that reads it. On XLA:CPU a
value read by several fusions (a tile's new moments: by the block maxima,
the infinity flags and the encoder; a block's scale: by each of its
elements in the encoder) is then computed once per reader, or per element.
`apart` computes such a value once, into buffers of its own. It changes
where values are computed, not which operations compute them; but XLA:CPU
may contract a multiply and an add into a fused multiply-add on one side of
the boundary and not on the other, so a step with `apart` and one without
can differ in a last bit. The leafwise pass therefore uses it on every
leaf on CPU, sharded on an Explicit mesh or not (the skipped branch's zeros
take the sharding of the values' type), so that sharded and unsharded runs
agree bit for bit (``tests/state/test_properties.py``, ``ExplicitRank3Test``).
"""

from __future__ import annotations

from collections.abc import Callable
import functools
from typing import Any

import jax
from jax import lax
from jax.extend import core as jax_core
from jax.extend.core import primitives
from jax.interpreters import ad
from jax.interpreters import batching
from jax.interpreters import mlir
import jax.numpy as jnp

from optax_q._src.core import explicit


def apart(fn: Callable[[], Any], token: jax.Array) -> Any:
  """``fn()``, computed into buffers of its own where the step is lowered
  for CPU (``token`` is never negative: a loop index, say).

  Lowered for CPU, a conditional whose predicate always holds, but which
  the compiler cannot decide: XLA:CPU materializes its results instead of
  fusing ``fn``'s work into each consumer, where it would be computed again
  per consumer (and an in-place fusion runs on one core).
  ``lax.optimization_barrier`` does not do this on XLA:CPU. Lowered for a
  GPU or TPU, where a conditional may cost a host round trip, ``fn()``
  plainly.

  ``fn`` is traced once, into one operation whose lowering depends on the
  platform. Under ``jax.vmap`` or differentiation it is that operation
  written with Jax's own (`_portable`), whose rules apply.
  """
  closed, shapes = jax.make_jaxpr(fn, return_shape=True)()
  taken = jax_core.ClosedJaxpr(closed.jaxpr.replace(
      constvars=[], invars=[*closed.jaxpr.constvars, *closed.jaxpr.invars]),
                               ())
  outs = _apart_p.bind(token, *closed.consts, jaxpr=taken)
  return jax.tree.unflatten(jax.tree.structure(shapes), outs)


def _plain(token, *args, jaxpr):
  del token
  return jax_core.jaxpr_as_fun(jaxpr)(*args)


def _conditional(token, *args, jaxpr):
  # The branches are the traced program itself and zeros, which take the
  # type of the values, as the branches of a conditional must agree: their
  # sharding on an Explicit mesh, and under ``shard_map`` the manual axes
  # they vary over.
  skipped = jax.make_jaxpr(lambda *_: [explicit.vary_like(jnp.zeros(
      a.shape, a.dtype, out_sharding=explicit.type_sharding(a)), a)
                                       for a in jaxpr.out_avals])(*args)
  index = lax.convert_element_type(token >= 0, jnp.int32)
  return primitives.cond_p.bind(index, *args, branches=(skipped, jaxpr))


def _portable(token, *args, jaxpr):
  """The operation written with Jax's primitives."""
  return lax.platform_dependent(
      cpu=lambda: _conditional(token, *args, jaxpr=jaxpr),
      default=lambda: _plain(token, *args, jaxpr=jaxpr))


def _batched(args, dims, *, jaxpr):
  outs = jax.vmap(functools.partial(_portable, jaxpr=jaxpr),
                  in_axes=dims)(*args)
  return outs, [0] * len(outs)


def _jvp(primals, tangents, *, jaxpr):
  return jax.jvp(functools.partial(_portable, jaxpr=jaxpr), tuple(primals),
                 tuple(ad.instantiate_zeros(t) for t in tangents))


_apart_p = jax_core.Primitive('optax_q_apart')
_apart_p.multiple_results = True
_apart_p.def_effectful_abstract_eval(
    lambda token, *args, jaxpr: (jaxpr.out_avals, jaxpr.effects))
_apart_p.def_impl(_plain)
mlir.register_lowering(_apart_p, mlir.lower_fun(_plain, True))
mlir.register_lowering(_apart_p, mlir.lower_fun(_conditional, True),
                       platform='cpu')
batching.primitive_batchers[_apart_p] = _batched
ad.primitive_jvps[_apart_p] = _jvp


def apart_with(token: jax.Array | None
               ) -> Callable[[Callable[[], Any]], Any] | None:
  """``fn -> apart(fn, token)``, the codec's ``materialize`` argument; None
  (compute in place) when ``token`` is None."""
  if token is None:
    return None
  return lambda fn: apart(fn, token)


def token() -> jax.Array:
  """A non-negative int32 scalar for `apart` outside a loop: zero, behind
  an optimization barrier, which the compiler does not fold through (a
  plain constant would let it decide the conditional and inline it)."""
  return lax.optimization_barrier(jnp.int32(0))
