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
"""Fidelity: how faithfully a low-bit optimizer follows its float32 twin.

- `fidelity`: `update_fidelity` and `weight_distance` (pure functions of
  pytrees), `track_fidelity` (a wrapper that runs a float32 reference on
  the same gradients and records both, step by step) and
  `fidelity_summary` (host-side statistics of what it recorded).

Imports `core`, and from the codecs only `QArray` and its decoding: it
compares any two transforms through their updates, and decodes quantized
(master-free) params, whose updates are new quantized weights, to compare
the steps that land them on their grid. No other feature: a quantized
parameter's update is read through its own ``weights`` method, as
`optax_q.apply_updates` applies it.
"""
