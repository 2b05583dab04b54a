"""Throughput of the math verifier on a realistic eval round (1,040 responses).

A round: the 130-prompt suite (AIME 24/25, AMC 23, HMMT Feb 25) x 8 samples, each response a
few hundred tokens of reasoning ending in a DAPO ``Answer:`` line or a ``\\boxed{}``, with a
mix of correct answers (as written, and in other equivalent forms), wrong answers and
missing answers. Gold answers come from ../shared/data/math when present, else from a small
built-in list with the same mix of integers and LaTeX.

Printed: responses/s of ``math_rewards`` (process isolation on, fast path on), of the same
with every pair forced through math-verify in the workers, and of the baseline: math-verify
called in-process on the main thread with its own signal timeouts (unsafe off the main
thread, which is why it is not used). Target: >= 200 responses/s with 2 workers on 2 cores.

    python bench/reward_bench.py [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from epic_slime.reward import RewardPool, extract_final_answer, judge, math_rewards, normalize_answer  # noqa: E402

SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "data", "math")
FILES = {"aime_2024": 30, "aime_2025": 30, "amc_2023": 40, "hmmt_feb_2025": 30}
FALLBACK_GOLDS = [
    "204",
    "25",
    "\\frac{1}{576}",
    "-984",
    "\\frac{9 \\sqrt{23}}{23}",
    "1-\\frac{2}{\\pi}",
    "2^{25} \\cdot 26!",
    "8\\sqrt{10}",
    "\\sqrt{\\frac{95}{24}}",
    "14+4\\sqrt{37}",
]
WORDS = (
    "we",
    "have",
    "so",
    "then",
    "the",
    "sum",
    "of",
    "roots",
    "is",
    "equal",
    "to",
    "since",
    "hence",
    "therefore",
    "let",
    "consider",
    "triangle",
    "area",
    "integer",
    "divisible",
    "by",
    "case",
)


def load_golds() -> list[str]:
    golds = []
    if os.path.isdir(SHARED):
        for name in FILES:
            with open(os.path.join(SHARED, f"{name}.jsonl")) as handle:
                golds += [json.loads(line)["answer"] for line in handle if line.strip()]
        return golds
    return [FALLBACK_GOLDS[i % len(FALLBACK_GOLDS)] for i in range(130)]


def reasoning(rng: random.Random, n_tokens: int) -> str:
    pieces = []
    for i in range(n_tokens):
        if i % 25 == 24:
            pieces.append(f"$x_{{{rng.randint(1, 9)}}} = \\frac{{{rng.randint(1, 99)}}}{{{rng.randint(2, 99)}}}$\n")
        else:
            pieces.append(rng.choice(WORDS))
    return " ".join(pieces)


def equivalent_form(gold: str, rng: random.Random) -> str:
    if gold.lstrip("-").isdigit():
        return rng.choice([gold, f"${gold}$", f"\\boxed{{{gold}}}", gold.zfill(3), f"{gold}.0"])
    return rng.choice([gold, gold.replace(" ", ""), gold.replace("\\frac", "\\dfrac"), f"${gold}$"])


def wrong_form(gold: str, rng: random.Random) -> str:
    if gold.lstrip("-").isdigit():
        return str(int(gold) + rng.randint(1, 50))
    return rng.choice([gold + "+1", f"2\\left({gold}\\right)", "\\frac{1}{2}"])


def build_round(seed: int = 0, samples_per_prompt: int = 8):
    rng = random.Random(seed)
    responses, labels = [], []
    for gold in load_golds():
        for _ in range(samples_per_prompt):
            roll = rng.random()
            if roll < 0.45:
                answer = equivalent_form(gold, rng)
            elif roll < 0.95:
                answer = wrong_form(gold, rng)
            else:
                answer = None
            body = reasoning(rng, rng.randint(200, 500))
            if answer is None:
                tail = "I could not finish."
            elif rng.random() < 0.8:
                tail = f"Answer: {answer}"
            else:
                tail = f"The final answer is $\\boxed{{{answer}}}$."
            responses.append(body + "\n\n" + tail)
            labels.append(gold)
    return responses, labels


def forced_through_pool(pool: RewardPool, responses, labels) -> list[float]:
    """Every pair to math-verify in the workers (no fast path): the worst case of the isolation."""
    from concurrent.futures import ThreadPoolExecutor

    def one(pair):
        extracted = extract_final_answer(pair[0])
        if extracted is None:
            return 0.0
        return 1.0 if pool.verify(normalize_answer(extracted), normalize_answer(pair[1])) else 0.0

    with ThreadPoolExecutor(max_workers=pool.num_workers) as executor:
        return list(executor.map(one, zip(responses, labels)))


def baseline_in_process(responses, labels) -> list[float]:
    from math_verify import parse, verify

    rewards = []
    for response, label in zip(responses, labels):
        extracted = extract_final_answer(response)
        if extracted is None:
            rewards.append(0.0)
            continue
        gold = parse("\\boxed{" + label + "}")
        pred = parse("\\boxed{" + extracted + "}")
        rewards.append(1.0 if verify(gold, pred) else 0.0)
    return rewards


def timed(fn, rounds):
    """Median seconds of ``fn(responses, labels)`` over rounds. Each round has fresh responses
    (another seed), so parse caches help with the gold answers only, as in training."""
    times, results = [], []
    for responses, labels in rounds:
        start = time.perf_counter()
        results.append(fn(responses, labels))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2], results[0], times[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rounds = [build_round(seed) for seed in range(args.repeats)]
    responses, labels = rounds[0]
    n = len(responses)
    fast = sum(judge(r, label)[0] is not None for r, label in zip(responses, labels))
    print(
        f"{len(rounds)} rounds (median reported) of {n} responses, mean {sum(map(len, responses)) / n:.0f} chars, "
        f"{fast} decided by the fast path, {n - fast} need math-verify; cpu_count={os.cpu_count()}"
    )
    with RewardPool(num_workers=args.workers) as pool:
        math_rewards(responses[:8], labels[:8], pool=pool)  # workers are started; touch them once
        t_ours, ours, cold_ours = timed(lambda r, gold: math_rewards(r, gold, pool=pool), rounds)
        t_forced, forced, cold_forced = timed(lambda r, gold: forced_through_pool(pool, r, gold), rounds)
        pool_stats = pool.stats()
    t_base, base, cold_base = timed(baseline_in_process, rounds)
    disagreements = sum(a != b for a, b in zip(ours, base))
    print("                                    median responses/s   first round (coldest caches)")
    print(
        f"math_rewards (isolated, fast path): {n / t_ours:8.0f}             {n / cold_ours:8.0f}   (mean reward {sum(ours) / n:.3f})"
    )
    print(f"all pairs through worker pool:      {n / t_forced:8.0f}             {n / cold_forced:8.0f}")
    print(f"baseline in-process math-verify:    {n / t_base:8.0f}             {n / cold_base:8.0f}")
    print(f"ratio isolated/baseline: {t_base / t_ours:.2f}x   forced-pool/baseline: {t_base / t_forced:.2f}x")
    print(f"verdict disagreements with baseline: {disagreements}; pool stats: {pool_stats}")
    print(f"target >= 200 responses/s (coldest round, isolated): {'MET' if n / cold_ours >= 200 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
