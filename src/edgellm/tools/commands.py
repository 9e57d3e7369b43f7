"""click commands `quantize`, `perplexity`, `info`; cli.py adds them to the `edgellm` group.

User errors (bad options, bad files, refused conversions) end as one-line ClickExceptions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ..cli_options import cache_type_options, cache_types
from ..errors import EdgeLLMError
from ..gguf_file import GGUFFile
from . import info as info_mod
from . import perplexity as ppl_mod
from .quant_mix import FILE_TYPE_ALIASES, FILE_TYPES, parse_file_type, parse_override
from .quantize import Progress, default_threads, plan_quantization, quantize_model

_TYPE_HELP = ", ".join(FILE_TYPES) + " (aliases: " + ", ".join(f"{a}={b}" for a, b in FILE_TYPE_ALIASES.items()) + ")"


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


@click.command(short_help="Quantize a GGUF model (llama.cpp's type mixes).", help=f"""Quantize the GGUF model SRC into DST as TYPE, with llama.cpp's tensor type mixes.

TYPE: {_TYPE_HELP}.""")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("dst", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("type_", metavar="TYPE")
@click.option("--pure", is_flag=True, help="One type for every tensor that allows it (no mix).")
@click.option("--tensor-type", "tensor_types", multiple=True, metavar="PATTERN=TYPE",
              help="Type for tensors whose name matches the regular expression PATTERN (repeatable).")
@click.option("--allow-requantize", is_flag=True, help="Allow converting tensors that are already quantized.")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="Threads (default: all).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def quantize(src, dst, type_, pure, tensor_types, allow_requantize, threads, quiet):
    try:
        ft = parse_file_type(type_)
        overrides = [parse_override(s) for s in tensor_types]
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    if overrides and not ft.is_quantized:
        click.echo(f"warning: --tensor-type applies only to quantized types (as in llama.cpp), not {ft.name}",
                   err=True)
    kw = dict(pure=pure, overrides=overrides, allow_requantize=allow_requantize)
    try:
        with GGUFFile(src) as g:  # plan first: refusals and fallbacks are said before any work
            decisions = plan_quantization(g, ft, **kw)
            total = sum(t.nbytes for t in g.tensors.values())
    except EdgeLLMError as e:
        raise click.ClickException(str(e)) from None
    _say_notes(decisions)
    progress = Progress()
    try:
        if quiet or not sys.stderr.isatty():
            result = quantize_model(src, dst, ft, n_threads=threads, progress=progress, **kw)
        else:
            with click.progressbar(length=total, file=sys.stderr, show_pos=False, width=30) as bar:
                progress.advance = bar.update
                progress.tensor = lambda i, n, d, *_: setattr(bar, "label", f"[{i + 1}/{n}] {d.name[:32]:<32}")
                result = quantize_model(src, dst, ft, n_threads=threads, progress=progress, **kw)
    except EdgeLLMError as e:
        raise click.ClickException(str(e)) from None
    n = max(result.n_elements, 1)
    click.echo(f"{src} -> {dst} as {ft.name} ({_threads_text(threads)}): "
               f"{_mib(result.bytes_in)} ({8 * result.bytes_in / n:.2f} bpw) -> "
               f"{_mib(result.bytes_out)} ({8 * result.bytes_out / n:.2f} bpw)")


def _say_notes(decisions) -> None:
    """Fallbacks and overrides, one line per kind (naming the first tensor it concerns)."""
    notes: dict[str, list[str]] = {}
    for d in decisions:
        if d.note:
            notes.setdefault(d.note, []).append(d.name)
    for note, names in notes.items():
        more = f" and {len(names) - 1} more" if len(names) > 1 else ""
        click.echo(f"note: {names[0]}{more}: {note}", err=True)
    n_fb = sum("falling back" in d.note for d in decisions)
    if n_fb:
        click.echo(f"warning: {n_fb} of {len(decisions)} tensors needed a fallback type", err=True)


def _threads_text(threads) -> str:
    n = threads or default_threads()
    return f"{n} thread{'s' if n != 1 else ''}"


@click.command(short_help="Perplexity (or KL divergence) on a text.")
@click.argument("model")
@click.option("-f", "--file", "text_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Text to score (UTF-8).")
@click.option("-c", "--ctx-size", "n_ctx", type=click.IntRange(min=4), default=None,
              help="Tokens per chunk (default 512; with --kl-divergence, the saved run's).")
@click.option("-b", "--batch-size", "n_batch", type=click.IntRange(min=1), default=None,
              help="Tokens per engine call (default: the whole chunk).")
@click.option("-t", "--threads", type=click.IntRange(min=1), default=None, help="Threads.")
@click.option("--chunks", "n_chunks", type=click.IntRange(min=1), default=None, help="Score at most this many chunks.")
@click.option("--save-logits", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Save the scored log-probabilities (llama.cpp's format) for a later --kl-divergence.")
@click.option("--kl-divergence", "kl_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="Compare with a base model's saved logits file (its tokens are used).")
@cache_type_options
def perplexity(model, text_file, n_ctx, n_batch, threads, n_chunks, save_logits, kl_file, **kw):
    """Perplexity of MODEL on a text, as llama-perplexity computes it (second half of each chunk
    scored), or its KL divergence from a saved base model run."""
    from ..api import LLM  # the model runtime loads only when a command needs it

    if kl_file and save_logits:
        raise click.ClickException("--save-logits and --kl-divergence cannot be combined")
    if not kl_file and text_file is None:
        raise click.ClickException("give the text to score with -f FILE")
    try:
        base = ppl_mod.LogitsFile.open(kl_file) if kl_file else None
        if base is not None and n_ctx is not None and n_ctx != base.n_ctx:
            raise click.ClickException(f"{kl_file} was saved with -c {base.n_ctx}, not {n_ctx}")
        ctx = base.n_ctx if base is not None else (n_ctx or 512)
        llm = LLM(model, n_ctx=ctx, n_batch=n_batch or ctx, n_threads=threads, **cache_types(kw))
        if llm.tokenizer.add_eos:  # llama-perplexity asserts the same
            raise click.ClickException("this model's tokenizer appends EOS to every text; perplexity cannot use it")
        bos = llm.tokenizer.bos_id if llm.tokenizer.add_bos else None
        if base is not None:
            _run_kl(llm, base, bos, n_chunks)
        else:
            tokens = llm.tokenize(ppl_mod.read_text(text_file), add_bos=bos is not None)
            _run_ppl(llm, tokens, ctx, bos, n_chunks, save_logits)
    except EdgeLLMError as e:
        raise click.ClickException(str(e)) from None


def _run_ppl(llm, tokens, n_ctx, bos, n_chunks, save_logits):
    n = ppl_mod.n_chunks_for(len(tokens), n_ctx, n_chunks)
    click.echo(f"{len(tokens)} tokens, {n} chunks of {n_ctx}, scoring the last {n_ctx - 1 - n_ctx // 2} of each",
               err=True)

    def on_chunk(i, res):
        click.echo(f"[{i + 1}]{res.chunk_ppl[-1]:.4f},", nl=False)

    def run(writer=None):
        return ppl_mod.perplexity(llm, tokens, n_ctx, bos=bos, n_chunks=n, save=writer, on_chunk=on_chunk)

    if save_logits:
        from ..gguf_writer import open_atomic

        try:
            with open_atomic(save_logits) as f:
                res = run(ppl_mod.LogitsWriter(f, n_ctx, llm.n_vocab, n, tokens))
        except OSError as e:
            raise click.ClickException(f"cannot write {save_logits}: {e.strerror or e}") from None
    else:
        res = run()
    click.echo()
    click.echo(f"Final estimate: PPL = {res.ppl:.4f} +/- {res.ppl_stderr:.5f}  ({res.n_chunks} chunks, "
               f"{res.nll.count} tokens scored)")


def _run_kl(llm, base, bos, n_chunks):
    click.echo(f"{base.n_chunk} chunks of {base.n_ctx} tokens from {base.path}", err=True)

    def on_chunk(i, res):
        click.echo(f"[{i + 1}] PPL {res.ppl:.4f}  KLD {res.kld.mean:.6f}  same top {100 * res.top1[0]:.2f}%")

    res = ppl_mod.kl_divergence(llm, base, bos=bos, n_chunks=n_chunks, on_chunk=on_chunk)
    ratio, ratio_unc = res.log_ppl_ratio
    p, p_unc = res.top1
    click.echo(f"Mean PPL(Q)               : {res.ppl:10.6f} ± {res.ppl * res.nll.stderr:10.6f}")
    click.echo(f"Mean PPL(base)            : {res.ppl_base:10.6f} ± {res.ppl_base * res.nll_base.stderr:10.6f}")
    click.echo(f"Mean ln(PPL(Q)/PPL(base)) : {ratio:10.6f} ± {ratio_unc:10.6f}")
    click.echo(f"Mean    KLD               : {res.kld.mean:10.6f} ± {res.kld.stderr:10.6f}")
    click.echo(f"Median  KLD               : {res.kld_quantile(0.5):10.6f}")
    click.echo(f"99.0%   KLD               : {res.kld_quantile(0.99):10.6f}")
    click.echo(f"Maximum KLD               : {res.kld_quantile(1.0):10.6f}")
    click.echo(f"RMS Δp                    : {100 * res.rms_p_diff:6.3f} %")
    click.echo(f"Same top p                : {100 * p:6.3f} ± {100 * p_unc:5.3f} %")


@click.command(short_help="Architecture, size, quant mix, metadata of a model.")
@click.argument("model")
@click.option("--all", "all_keys", is_flag=True, help="Every metadata key (long arrays abbreviated).")
@click.option("--tensors", is_flag=True, help="The tensor table.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def info(model, all_keys, tensors, output):
    """What MODEL (a .gguf path or a model alias) holds: architecture, size, quant mix, tokenizer, metadata."""
    from ..registry import resolve

    try:
        data = info_mod.model_info(resolve(model, progress=False), all_keys=all_keys, tensors=tensors)
    except EdgeLLMError as e:
        raise click.ClickException(str(e)) from None
    if output == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        click.echo(info_mod.format_text(data))
