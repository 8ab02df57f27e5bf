"""Chi-square goodness of fit for sampled tokens against an expected distribution."""

from __future__ import annotations

import numpy as np
from scipy import stats


def chi_square_pvalue(samples, probs, min_expected: float = 5.0) -> float:
    """p-value of samples (token ids) under `probs` (a vector over the vocabulary).

    Cells with small expected counts are pooled into one, as the test requires; a sample that
    falls on a zero-probability token fails outright (p = 0).
    """
    probs = np.asarray(probs, dtype=np.float64)
    probs = probs / probs.sum()
    counts = np.bincount(np.asarray(samples, dtype=np.int64), minlength=len(probs)).astype(np.float64)
    n = counts.sum()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    if (~big).any() and expected[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(expected[~big].sum())
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)
