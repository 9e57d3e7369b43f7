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


def replay(prompt: list[int], gen: list[int], table: list[float], oracle: bool) -> tuple[float, int, int, int]:
    from edgellm import speculative as sp
    from edgellm.sampling import SamplingParams

    def cost(rows: int) -> float:
        return table[rows - 1] if rows <= len(table) else table[-1] + (rows - len(table)) * (table[-1] - 1) / (
            len(table) - 1)

    class Target:  # costs_for keys on it; nothing else is used
        pass

    st = sp.SpecState(Target(), sp.Speculative("lookup"), SamplingParams(temperature=0))
    st.costs = sp.StepCosts.known([cost(r) for r in range(1, len(table) + 1)])
    history, i, t, steps, drafted, taken_all = list(prompt) + [gen[0]], 1, 0.0, 0, 0, 0
    n = len(gen)
    while i < n:
        if oracle:
            m, e = st.lookup.match(history)
            good = 0
            if m:
                prop = st.lookup.draft(e, min(n - i, sp.MAX_DRAFT_LIMIT))
                while good < len(prop) and prop[good] == gen[i + good]:
                    good += 1
            drafts = gen[i:i + max(range(good + 1), key=lambda j: (j + 1) / cost(j + 1))]
        else:
            drafts = sp.propose([(st, history, history, n - i)])[0]
        k, taken = len(drafts), 0
        while taken < k and drafts[taken] == gen[i + taken]:
            taken += 1
        if k and not oracle:
            st.lctl.observe(range(st._m, st._m + k), taken)
        st.costs.observe(k + 1, cost(k + 1))
        history += gen[i:i + taken + 1]
        i += taken + 1
        t += cost(k + 1)
        steps += 1
        drafted += k
        taken_all += taken
    return (n - 1) / t, steps, drafted, taken_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m-instruct")
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--costs", default=None, help="comma-separated step costs of 1, 2, ... rows (one row = 1)")
    args = ap.parse_args()
    import edgellm

    llm = edgellm.LLM(args.model, n_ctx=4096, n_threads=args.threads)
    table = [float(x) for x in args.costs.split(",")] if args.costs else measured_costs(llm, 17)
    print("step costs by rows:", " ".join(f"{r}: {c:.2f}" for r, c in enumerate(table, 1)))
    groups = {"input-grounded": bs.GROUNDED, "free-form": bs.FREE}
    for title, prompts in groups.items():
        print(f"\n{title}: | prompt | tokens | policy | steps | drafted | taken | oracle |")
        ratios, best = [], []
        for name, make in prompts.items():
            _, ids = bs._rendered(llm, make())
            llm.reset()
            llm.generate(ids, max_tokens=args.n, temperature=0, speculative="lookup")  # its tokens are greedy's
            gen = llm._session.tokens[len(ids):]  # (all but the reply's last token, never fed)
            r, steps, drafted, taken = replay(ids, gen, table, oracle=False)
            o = replay(ids, gen, table, oracle=True)[0]
            ratios.append(r)
            best.append(o)
            print(f"| {name} | {len(gen)} | {r:.2f}x | {steps} | {drafted} | {taken} | {o:.2f}x |")
        print(f"policy median {statistics.median(ratios):.2f}x, min {min(ratios):.2f}x; "
              f"oracle median {statistics.median(best):.2f}x")


if __name__ == "__main__":
    main()
