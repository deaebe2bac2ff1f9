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
"""Every test process runs on 8 simulated CPU devices.

XLA reads ``--xla_force_host_platform_device_count`` when it first creates
the CPU backend. pytest imports this file before any test module (in every
pytest-xdist worker too), so the flag is set before anything imports jax,
and the mesh tests run in the same processes as all the others: no test
module sets the flag itself or runs itself again in a subprocess.
"""

import os

FLAG = '--xla_force_host_platform_device_count=8'
if FLAG not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' ' + FLAG).strip()
