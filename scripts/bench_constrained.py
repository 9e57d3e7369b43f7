"""Constrained vs unconstrained decode speed, and what jump-forward buys.

    python scripts/bench_constrained.py [MODEL ...] [-t 2] [-r 5]

For each model, an object of a schema with fixed keys is generated greedily from a chat prompt
through the API (llm.generate(..., json_schema=...): grammar checks plus jump-forward, forced
tokens evaluated in one batch). Then the same text is generated twice more, token by token from
the same prompt: "plain", sampling each token with no grammar (unconstrained generation of the
same text: one decode step and one draw per token), and "grammar", sampling each under the
grammar without jump-forward (the mask cost alone). Modes alternate within each round; the
table gives median tokens/s over the rounds and the ratios to plain. Every mode is credited
with the same count, the tokens of the text (tokenized afresh; forced ones included), over its
own decode time after the prompt: so the ratios are ratios of time to produce the same text.
The last column is the time spent in the grammar (checks, masks when a draw is rejected,
accepting the token) as a share of the "grammar" mode's decode time.

    python scripts/bench_constrained.py --tool-masks [-r 5]

A required call of a 10-argument tool in Qwen3-Coder's XML format, token by token in three
vocabularies: the time of a full mask and of a one-token check + accept, per token (median over
the tokens of the call, then over rounds), with the grammar that writes the arguments in the
schema's order (all a grammar can do beyond common.MAX_ANY_ORDER arguments without 2^n rules)
and with the any-order grammar and its ArgumentGuard, on the same text; and the any-order
grammar on the arguments shuffled.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from edgellm import LLM
from edgellm.constrain import Grammar, Guide
from edgellm.sampling import Sampler, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "first_name": {"type": "string", "maxLength": 16},
        "last_name": {"type": "string", "maxLength": 16},
        "birth_year": {"type": "integer", "minimum": 1000, "maximum": 2025},
        "country_of_birth": {"type": "string", "maxLength": 20},
        "field_of_work": {"type": "string", "maxLength": 24},
        "is_still_alive": {"type": "boolean"},
        "number_of_children": {"type": "integer", "minimum": 0, "maximum": 20},
    },
    "required": ["first_name", "last_name", "birth_year", "country_of_birth", "field_of_work",
                 "is_still_alive", "number_of_children"],
    "additionalProperties": False,
}
PROMPT = [{"role": "user", "content": "Give a famous scientist as JSON."}]


def api_run(llm, prompt_ids, grammar):
    text = llm.generate(prompt_ids, grammar=grammar, temperature=0, max_tokens=200)
    s = llm.last_stats
    return text, s.generated_tokens, s.decode_seconds, s.forced_tokens


def stepwise(llm, prompt_ids, target_ids, grammar=None):
    """Generate target_ids one decode at a time (sampling each, greedy); with a grammar, under it
    without jump-forward. Returns (tokens, seconds)."""
    llm.reset()
    s = llm.session()
    logits = s.feed(prompt_ids)
    sampler = Sampler(SamplingParams(temperature=0), llm.n_vocab)
    guide = Guide(grammar.constraint(llm.tokenizer), jump_forward=False) if grammar else None
    history = list(prompt_ids)
    in_grammar = 0.0
    t0 = time.perf_counter()
    for tok in target_ids:
        if guide is None:
            sampler.sample(logits, history)
        else:
            t1 = time.perf_counter()
            guide.sample(sampler, logits, history)
            guide.advance(tok)
            in_grammar += time.perf_counter() - t1
        history.append(tok)
        logits = s.feed([tok])
    return len(target_ids), time.perf_counter() - t0, in_grammar


TOOL = [{"type": "function", "function": {"name": "book_trip", "parameters": {"type": "object", "properties": {
    "origin": {"type": "string"}, "destination": {"type": "string"}, "date": {"type": "string", "format": "date"},
    "return_date": {"type": "string", "format": "date"}, "adults": {"type": "integer", "minimum": 1, "maximum": 9},
    "children": {"type": "integer", "minimum": 0, "maximum": 9}, "cabin": {"type": "string", "enum": ["economy", "business", "first"]},
    "max_price": {"type": "number"}, "direct_only": {"type": "boolean"}, "notes": {"type": "string", "maxLength": 80}},
    "required": ["origin", "destination", "date", "adults"]}}}]
ARGS = {"origin": "Lisbon", "destination": "Oslo", "date": "2026-03-14", "return_date": "2026-03-21", "adults": 2,
        "children": 1, "cabin": "economy", "max_price": 420.5, "direct_only": True, "notes": "window seats if possible"}


def walk(constraint, ids):
    """Per token: (full mask seconds, check + accept seconds)."""
    out = []
    for t in ids:
        t0 = time.perf_counter()
        constraint.compute_mask()
        t1 = time.perf_counter()
        assert constraint.allows(t)
        constraint.accept(t)
        out.append((t1 - t0, time.perf_counter() - t1))
    return out


def tool_masks(rounds: int):
    from edgellm.gguf_file import GGUFFile
    from edgellm.tokenizer import Tokenizer
    from edgellm.tool_calls import ToolFormat, call_grammar, write_calls, xml

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from llamacpp_source import models_dir

    f = ToolFormat("qwen3_coder", True)
    ordered = Grammar.from_lark("start: one\n" + xml.call_rules("qwen3_coder", TOOL))
    free = Grammar.from_lark(call_grammar(f, TOOL))
    assert free.guard is not None and ordered.guard is None
    keys = list(ARGS)
    random.Random(1).shuffle(keys)
    texts = {"schema order": write_calls(f, [{"name": "book_trip", "arguments": ARGS}]),
             "shuffled": write_calls(f, [{"name": "book_trip", "arguments": {k: ARGS[k] for k in keys}}])}
    vocabs = {"Qwen3.5 (ggml-vocab-qwen35)": Tokenizer.from_metadata(dict(GGUFFile(models_dir() / "ggml-vocab-qwen35.gguf").metadata))}
    for model in ("smollm2-135m-instruct", "gemma3-270m"):
        vocabs[model] = LLM(model, n_ctx=256).tokenizer
    print(f"{rounds} rounds, median per token (us)")
    print("| vocabulary | tokens | text | mask: in order | mask: any order + guard | ratio "
          "| check+accept: in order | check+accept: any order + guard |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name, tok in vocabs.items():
        for label, text in texts.items():
            ids = tok.encode(text, add_bos=False)
            runs = {"in order": [], "any order": []}
            for _ in range(rounds):
                for mode, g in (("in order", ordered), ("any order", free)):
                    if mode == "in order" and label == "shuffled":
                        continue  # (the in-order grammar refuses it)
                    per = walk(g.constraint(tok), ids)
                    runs[mode].append((statistics.median(p[0] for p in per), statistics.median(p[1] for p in per)))
            med = {m: (statistics.median(r[0] for r in v) * 1e6, statistics.median(r[1] for r in v) * 1e6)
                   for m, v in runs.items() if v}
            a = med["any order"]
            o = med.get("in order")
            print(f"| {name} | {len(ids)} | {label} | {f'{o[0]:.0f}' if o else '-'} | {a[0]:.0f} "
                  f"| {f'{a[0] / o[0]:.2f}' if o else '-'} | {f'{o[1]:.1f}' if o else '-'} | {a[1]:.1f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=["smollm2-135m-instruct", "gemma3-270m"])
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--rounds", type=int, default=5)
    ap.add_argument("--tool-masks", action="store_true", help="mask time of a 10-argument XML tool call (above)")
    args = ap.parse_args()
    if args.tool_masks:
        return tool_masks(args.rounds)
    grammar = Grammar.from_json_schema(SCHEMA)
    print(f"threads {args.threads}, {args.rounds} alternating rounds, median tok/s")
    print("| model | API tokens (forced) | plain | grammar | grammar + jump-forward | grammar / plain "
          "| jump-forward / plain | grammar's share of a step |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for model in args.models:
        llm = LLM(model, n_threads=args.threads, n_ctx=1024)
        prompt_ids = llm.chat_tokens(llm.template.render(PROMPT))
        text, n, _, forced = api_run(llm, prompt_ids, grammar)  # warm-up; fixes the text
        target = llm.tokenize(text, add_bos=False)
        rates = {"plain": [], "grammar": [], "jump": []}
        share = []
        for _ in range(args.rounds):
            llm.reset()
            _, _, secs, _ = api_run(llm, prompt_ids, grammar)
            rates["jump"].append(len(target) / secs)
            k, secs, _ = stepwise(llm, prompt_ids, target)
            rates["plain"].append(k / secs)
            k, secs, in_grammar = stepwise(llm, prompt_ids, target, grammar)
            rates["grammar"].append(k / secs)
            share.append(in_grammar / secs)
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(f"| {model} | {n} ({forced}) | {med['plain']:.1f} | {med['grammar']:.1f} | {med['jump']:.1f} "
              f"| {med['grammar'] / med['plain']:.2f} | {med['jump'] / med['plain']:.2f} "
              f"| {100 * statistics.median(share):.1f}% |", flush=True)
        print(f"  text: {text}")


if __name__ == "__main__":
    main()
