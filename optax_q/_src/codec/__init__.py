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
"""Codecs: how one array is stored in few bits.

- `formats`: the registry of number formats (`get_format`, one parser).
- `codebooks`: the tables of the table formats (NF4, NF3, the dynamic map).
- `minifloat`: float formats of any width (e{E}m{M}) by bit arithmetic.
- `rounding`: nearest and stochastic rounding; counter-based random bits.
- `packing`: 4- and 3-bit codes packed into bytes.
- `qarray`: the `QArray` container (codes, scales, format, logical shape)
  and its encoder and decoder, for every scale layout.
- `codec`: `Codec`, one layout (format, scale mode, block size) as a static
  object: the scale mode a leaf gets, whether it can be tiled, whether its
  scales are replicated, its bits per element, and its encoder and decoder.

Imports only `core`. Knows no backend: how a value is computed (the CPU
fusion device, a kernel) is the caller's choice (``materialize``).
A new format goes in `formats` (and `codebooks` for a table); a new scale
layout in `qarray`.
"""
