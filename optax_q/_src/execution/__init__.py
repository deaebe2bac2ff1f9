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
"""Execution: how a step is computed on the machine that runs it.

- `tiling`: how one parameter's update runs (one call or tiles of rows, a
  loop or a kernel, with or without the fusion device), per platform the
  step is lowered for: the seam the state layer's leafwise pass calls.
- `fusion`: the CPU fusion device (`apart`), which makes XLA:CPU compute a
  value into buffers of its own instead of once per consumer.
- `kernels`: the Pallas tile kernel.

Imports nothing above `core`; the state layer calls it.
"""
