"""edgellm: run GGUF quantized language models fast on ordinary CPUs."""

from . import errors
from .errors import (
    ContextOverflowError,
    EdgeLLMError,
    GGUFError,
    GrammarError,
    ModelNotFoundError,
    StateFileError,
    UnsupportedModelError,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "BatchEngine",
    "Speculative",
    "errors",
    "EdgeLLMError",
    "GGUFError",
    "GrammarError",
    "UnsupportedModelError",
    "ContextOverflowError",
    "ModelNotFoundError",
    "StateFileError",
    "__version__",
]


def __getattr__(name):  # keep `import edgellm` light: the engine loads on first use
    if name == "LLM":
        from .api import LLM

        return LLM
    if name == "BatchEngine":
        from .scheduler import BatchEngine

        return BatchEngine
    if name == "Speculative":
        from .speculative import Speculative

        return Speculative
    raise AttributeError(name)
