"""Exceptions raised by edgellm. Every user-facing failure is one of these."""


class EdgeLLMError(Exception):
    """Base class of every edgellm error."""


class GGUFError(EdgeLLMError):
    """A GGUF file is missing, truncated, corrupt or inconsistent."""


class UnsupportedModelError(EdgeLLMError):
    """The file is valid GGUF but uses an architecture, tokenizer or tensor type we do not run."""


class ContextOverflowError(EdgeLLMError):
    """The prompt does not fit in the context window."""


class ModelNotFoundError(EdgeLLMError):
    """A model alias or path could not be resolved to a file."""


class DownloadError(ModelNotFoundError):
    """A model source was reachable but the download failed or its checksum did not match."""


class TokenizerError(EdgeLLMError):
    """The tokenizer metadata in the GGUF file is missing or inconsistent."""


class TemplateError(EdgeLLMError):
    """A chat template failed to render."""


class GrammarError(EdgeLLMError):
    """A JSON schema, grammar or regex given to constrain generation is invalid or unsupported."""


class MemoryLockError(EdgeLLMError):
    """mlock could not lock the weights in RAM (usually: the RLIMIT_MEMLOCK limit is too low)."""
