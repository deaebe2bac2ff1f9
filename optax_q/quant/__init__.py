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
"""Model quantization: PTQ and QAT of Flax linear layers, outlier metrics,
error propagation and quantized scaling laws.

Not Optax transforms: tools to quantize a model's weights and activations
and to study how the optimizer that trained it shapes the damage (Vlassis
et al., "Beyond Outliers: A Study of Optimizers Under Quantization",
arXiv 2509.23500).

Needs Flax and SciPy, which ``pip install optax_q`` does not install (the
optimizers need neither): ``pip install 'optax_q[quant]'``. ``import optax_q``
does not import this module; ``optax_q.quant`` does, on first use.
"""

import importlib.util as _util


def _missing(names):
  """The packages of ``names`` that cannot be imported here."""
  out = []
  for name in names:
    try:
      if _util.find_spec(name) is None:
        out.append(name)
    except ImportError:
      out.append(name)
  return out


# The tools import Flax and SciPy where they use them; the extra is checked
# once, here, so that a missing one is named with how to install it.
if _missing(('flax', 'scipy')):
  raise ImportError(
      f'optax_q.quant needs Flax and SciPy ({_missing(("flax", "scipy"))} '
      "not installed); install them with: pip install 'optax_q[quant]'")

# pylint: disable=g-import-not-at-top,wrong-import-position
from optax_q.quant._src.error_propagation import error_decomposition
from optax_q.quant._src.error_propagation import layer_errors
from optax_q.quant._src.error_propagation import LayerError
from optax_q.quant._src.error_propagation import linear_gain
from optax_q.quant._src.error_propagation import LinearGain
from optax_q.quant._src.error_propagation import relative_error
from optax_q.quant._src.linear_quant import LinearQuantization
from optax_q.quant._src.linear_quant import ptq
from optax_q.quant._src.linear_quant import qat
from optax_q.quant._src.linear_quant import quantize_linear
from optax_q.quant._src.outliers import kurtosis
from optax_q.quant._src.outliers import linear_inputs
from optax_q.quant._src.outliers import max_to_mean
from optax_q.quant._src.outliers import max_to_median
from optax_q.quant._src.quantizers import gaussian_clip
from optax_q.quant._src.quantizers import hadamard
from optax_q.quant._src.quantizers import Quantizer
from optax_q.quant._src.quantizers import quest
from optax_q.quant._src.quantizers import rtn
from optax_q.quant._src.scaling_law import fit_scaling_law
from optax_q.quant._src.scaling_law import ScalingLawFit
# pylint: enable=g-import-not-at-top

__all__ = (
    'LayerError',
    'LinearGain',
    'LinearQuantization',
    'Quantizer',
    'ScalingLawFit',
    'error_decomposition',
    'fit_scaling_law',
    'gaussian_clip',
    'hadamard',
    'kurtosis',
    'layer_errors',
    'linear_gain',
    'linear_inputs',
    'max_to_mean',
    'max_to_median',
    'ptq',
    'qat',
    'quantize_linear',
    'quest',
    'relative_error',
    'rtn',
)
