"""relgrad: a reverse-mode autograd engine with Transformer layers and relative positions.

The C++ engine, layers and trainer do the work (relgrad._relgrad); this package re-exports them
and adds draw(), the picture of the graph a backward pass walks, and explore(), the explorer's
view of trained runs. docs/python.md is the guide.
"""
import sys

from ._relgrad import *  # noqa: F401,F403  (Tensor, tensor, float32 ..., the ops, no_grad, gradcheck, train, Run)
from ._relgrad import nn  # noqa: F401
from .explorer import ExplorerView, explore  # noqa: F401
from .graph import Graph, draw  # noqa: F401

# `import relgrad.nn` works as for a package's own module
sys.modules[__name__ + ".nn"] = nn
