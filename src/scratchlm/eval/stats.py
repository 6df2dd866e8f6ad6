"""Statistics of evaluation results: the unbiased pass@k estimator and 95% confidence intervals.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv 2107.03374, Eq. 1):
with n samples of which c are correct, the probability that at least one of k samples drawn without
replacement is correct,
    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)      (k <= n)
(the product form avoids huge binomials; it is exactly 1 when n - c < k). Averaged over problems.

Intervals over N problems (95%, z = 1.959964):
    one 0/1 score per problem:  Wilson score interval (Wilson 1927), p = mean,
        (p + z^2/2N -+ z sqrt(p(1-p)/N + z^2/4N^2)) / (1 + z^2/N)
    fractional scores (pass@k from n > 1 samples):  mean -+ z s / sqrt(N), s the sample std, clipped to [0, 1]
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with c correct among n samples (module docstring)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion."""
    if n <= 0:
        raise ValueError(f"an interval needs at least one trial, got n={n}")
    p = successes / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    den = 1 + z * z / n
    lo = 0.0 if successes == 0 else max(0.0, (centre - half) / den)
    hi = 1.0 if successes == n else min(1.0, (centre + half) / den)
    return lo, hi


def mean_interval(scores: list[float], z: float = Z95) -> tuple[float, float]:
    """95% interval of the mean of per-problem scores in [0, 1] (Wilson when they are all 0 or 1)."""
    n = len(scores)
    if n == 0:
        raise ValueError("an interval needs at least one score")
    if all(s in (0.0, 1.0) for s in scores):
        return wilson_interval(int(sum(scores)), n, z)
    mean = sum(scores) / n
    sd = math.sqrt(sum((s - mean) ** 2 for s in scores) / (n - 1)) if n > 1 else 0.0
    half = z * sd / math.sqrt(n)
    return max(0.0, mean - half), min(1.0, mean + half)
