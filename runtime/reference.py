"""One torch reference per operation, runnable on the CPU.

Tests compare the kernels with these, the host ops' exact fallbacks call them,
and the benchmarks time them as a peer. Each op keeps its functions together
under its own heading.
"""

from __future__ import annotations

import torch
