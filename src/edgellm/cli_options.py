"""click options shared by several commands (kept apart from cli.py, which imports the tools'
commands, so that every command module can use them). Their values go to `edgellm.LLM` as the
keyword arguments of the same names: the LLM's signature is the one place they are defined."""

from __future__ import annotations

import click

from .kv_cache import CACHE_TYPES, DEFAULT_CACHE_TYPE


def cache_type_options(fn):
    """-ctk / -ctv: the KV cache types of keys and values (llama.cpp's flags); passed on as
    cache_type_k / cache_type_v."""
    choice = click.Choice(list(CACHE_TYPES), case_sensitive=False)
    fn = click.option("-ctv", "--cache-type-v", "cache_type_v", type=choice, default=DEFAULT_CACHE_TYPE,
                      show_default=True, help="KV cache type of the values.")(fn)
    return click.option("-ctk", "--cache-type-k", "cache_type_k", type=choice, default=DEFAULT_CACHE_TYPE,
                        show_default=True, help="KV cache type of the keys (q8_0 halves the cache, q4_0 quarters it).")(fn)


def cache_types(kw: dict) -> dict:
    """The cache-type options popped from a command's keyword arguments, as LLM arguments."""
    return {k: kw.pop(k) for k in ("cache_type_k", "cache_type_v") if k in kw}
