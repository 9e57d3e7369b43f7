#!/usr/bin/env python3
"""Prompt lookup's draft policy replayed offline, so policies can be compared on a machine too
busy to time them:

    python scripts/replay_speculative.py [MODEL] [-n 256] [--costs 1,1.21,1.42,...]

Greedy decoding is exact, so a reply's tokens do not depend on the drafts: the model's greedy
replies to scripts/bench_speculative.py's prompts are made once (plain decoding), then
edgellm.speculative's drafter and controller are run over them, each step charged the engine's
seconds for its rows from a cost table: by default this engine's, measured like
StepCosts.calibrate with more rounds; or --costs, one-row-relative costs of 1, 2, ... rows.
Printed per prompt: the decode speed-up over plain decoding under that table (no Python
overhead on either side), steps, drafts and drafts taken, beside an oracle that drafts exactly
the lookup proposal's correct prefix (its best length under the table) each step.

    python scripts/replay_speculative.py TARGET --draft DRAFT [--draft-cost 0.25] [--costs ...]

adds a draft model's policy (with prompt lookup's drafts where they promise more, and its
drafts only) over TARGET's greedy replies: the draft model runs (its drafts are real), each of
its draft steps charged --draft-cost one-row target steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_speculative as bs  # noqa: E402


def measured_costs(llm, max_rows: int, rounds: int = 15) -> list[float]:
    """Seconds of a step of 1 .. max_rows rows relative to one row: the median over rounds of
    each step timed against the one-row steps around it."""
    from edgellm.speculative import StepCosts

    c = StepCosts()
    c.CALIBRATION_ROWS = tuple(range(2, max_rows + 1))
    c.CALIBRATION_PAIRS, c.CALIBRATION_SECONDS = rounds, 1e9
    c.calibrate(llm, max_rows)
    one = c.predict(1)
    return [c.predict(r) / one for r in range(1, max_rows + 1)]


def _cost_fn(table: list[float]):
    def cost(rows: int) -> float:
        return table[rows - 1] if rows <= len(table) else table[-1] + (rows - len(table)) * (table[-1] - 1) / (
            len(table) - 1)
    return cost


class _Target:  # costs_for keys on it; nothing else is used
    pass


def replay(prompt: list[int], gen: list[int], table: list[float], spec=None, oracle: bool = False,
           draft_cost: float = 0.0) -> tuple[float, int, int, int]:
    """(speed-up, steps, drafts, drafts taken) of spec's policy (default prompt lookup) over a
    greedy reply gen, or of the lookup oracle. Each step is verified by SpecState.verify on rows
    whose argmax is the reply's token; a draft model's drafts are its real ones (it runs), each
    charged draft_cost one-row target steps (its catch-up on tokens that came by prompt lookup
    included in the first)."""
    import numpy as np

    from edgellm import speculative as sp
    from edgellm.sampling import Sampler, SamplingParams

    greedy = SamplingParams(temperature=0)
    cost = _cost_fn(table)
    st = sp.SpecState(_Target(), spec or sp.Speculative("lookup"), greedy)
    st.costs = sp.StepCosts.known([cost(r) for r in range(1, len(table) + 1)])
    if st.model is not None:
        dllm = st.model.llm
        dc = sp._costs[dllm] = sp.StepCosts.known([draft_cost * cost(1)])
        dc.observe = lambda rows, seconds: None  # (the draft steps run: their real times stay out)
        sampler = Sampler(greedy, dllm.n_vocab)
    history, i, t, steps, drafted, taken_all = list(prompt) + [gen[0]], 1, 0.0, 0, 0, 0
    n = len(gen)
    try:
        while i < n:
            if oracle:
                m, e = st.lookup.match(history)
                good = 0
                if m:
                    prop = st.lookup.draft(e, min(n - i - 1, sp.MAX_DRAFT_LIMIT))
                    while good < len(prop) and prop[good] == gen[i + good]:
                        good += 1
                k = taken = max(range(good + 1), key=lambda j: (j + 1) / cost(j + 1))
            else:
                drafts = sp.propose([(st, history, history, n - i - 1)])[0]
                k, taken = len(drafts), 0
                if k and st.model is None:
                    while taken < k and drafts[taken] == gen[i + taken]:
                        taken += 1
                    st.lctl.observe(range(st._m, st._m + k), taken)
                elif k:
                    rows = np.zeros((k + 1, dllm.n_vocab), dtype=np.float32)
                    rows[np.arange(k + 1), gen[i:i + k + 1]] = 1.0
                    out, taken = st.verify(sampler, rows, history, drafts)
                    assert out == gen[i:i + taken + 1]
                    t += (0 if st._by_lookup else k) * draft_cost
            history += gen[i:i + taken + 1]
            i += taken + 1
            t += cost(k + 1)
            steps += 1
            drafted += k
            taken_all += taken
    finally:
        st.close()
    return (n - 1) / t, steps, drafted, taken_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--costs", default=None, help="comma-separated step costs of 1, 2, ... rows (one row = 1)")
    ap.add_argument("--draft", default=None, help="a draft model: its policy replayed too (MODEL the target)")
    ap.add_argument("--draft-cost", type=float, default=0.25, help="a draft step in one-row target steps")
    args = ap.parse_args()
    import edgellm
    from edgellm.speculative import Speculative

    llm = edgellm.LLM(args.model, n_ctx=4096, n_threads=args.threads)
    table = [float(x) for x in args.costs.split(",")] if args.costs else measured_costs(llm, 17)
    print("step costs by rows:", " ".join(f"{r}: {c:.2f}" for r, c in enumerate(table, 1)))
    cols = {"policy": {}, "oracle": dict(oracle=True)}
    if args.draft:
        dllm = edgellm.LLM(args.draft, n_ctx=4096, n_threads=args.threads)
        print(f"draft model {dllm.path.name}, a draft step = {args.draft_cost} one-row target steps")
        cols["draft"] = dict(spec=Speculative(dllm), draft_cost=args.draft_cost)
        cols["draft-only"] = dict(spec=Speculative(dllm, with_lookup=False), draft_cost=args.draft_cost)
    groups = {"input-grounded": bs.GROUNDED, "free-form": bs.FREE}
    every = {c: [] for c in cols}
    for title, prompts in groups.items():
        print(f"\n{title}: | prompt | tokens | policy | steps | drafted | taken | oracle |"
              + "".join(f" {c} |" for c in cols if c not in ("policy", "oracle")))
        ratios = {c: [] for c in cols}
        for name, make in prompts.items():
            _, ids = bs._rendered(llm, make())
            llm.reset()
            llm.generate(ids, max_tokens=args.n, temperature=0, speculative="lookup")  # its tokens are greedy's
            gen = llm._session.tokens[len(ids):]  # (all but the reply's last token, never fed)
            got = {c: replay(ids, gen, table, **kw) for c, kw in cols.items()}
            for c, g in got.items():
                ratios[c].append(g[0])
                every[c].append(g[0])
            r, steps, drafted, taken = got["policy"]
            print(f"| {name} | {len(gen)} | {r:.2f}x | {steps} | {drafted} | {taken} | {got['oracle'][0]:.2f}x |"
                  + "".join(f" {g[0]:.2f}x |" for c, g in got.items() if c not in ("policy", "oracle")))
        print("; ".join(f"{c} median {statistics.median(x):.2f}x, min {min(x):.2f}x" for c, x in ratios.items()))
    if args.draft:
        print("\nall prompts: " + "; ".join(f"{c} median {statistics.median(x):.2f}x" for c, x in every.items()))


if __name__ == "__main__":
    main()
