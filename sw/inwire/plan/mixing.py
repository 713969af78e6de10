"""Mixing: the averaging product of a period, its norm, its spectral radius and how many periods reach
epsilon.

Two measures of one period P (J = 11^T/n): the norm rho = ||P - J||_2 bounds every period,
||P^m - J|| <= rho^m (a guarantee from the first period on); the spectral radius lambda of P - J is the
asymptotic rate, ||P^m - J||^(1/m) -> lambda, and lambda <= rho (equal when P is symmetric).
"""

import math
from collections.abc import Collection, Iterable, Sequence

import numpy as np

Rounds = Iterable[Iterable[Collection[str]]]
"""Rounds given as collections of member groups, each group a collection of island names."""

RHO_ZERO = 1e-9
"""rho at or below this counts as exact consensus after one period (round-off of an exact average)."""
RHO_ONE = 1 - 1e-12
"""rho at or above this never reaches consensus."""


def mixing_product(islands: Sequence[str], rounds_of_groups: Rounds) -> np.ndarray:
    """W_T ... W_1 for rounds given as collections of member groups; unlisted islands keep their value."""
    index = {name: i for i, name in enumerate(islands)}
    product = np.eye(len(islands))
    for groups in rounds_of_groups:
        for group in groups:
            if len(group) > 1:
                rows = [index[member] for member in group]
                product[rows] = product[rows].mean(axis=0)
    return product


def mixing_rate(islands: Sequence[str], rounds_of_groups: Rounds) -> float:
    """rho = ||W_T ... W_1 - 11^T/n||_2: how much one period shrinks the disagreement, at worst."""
    product = mixing_product(islands, rounds_of_groups)
    return float(np.linalg.norm(product - 1.0 / len(islands), 2))


def periods_to_epsilon(rho: float, epsilon: float) -> float:
    """Periods until rho**periods <= epsilon: one for an exact average, infinity when rho is 1."""
    if rho <= RHO_ZERO:
        return 1
    if rho >= RHO_ONE:
        return math.inf
    return max(1, math.ceil(math.log(epsilon) / math.log(rho) - 1e-9))


def time_to_epsilon_ms(rho: float, period_ms: float, epsilon: float) -> float:
    periods = periods_to_epsilon(rho, epsilon)
    return math.inf if math.isinf(periods) else periods * period_ms




def spectral_radius(islands: Sequence[str], rounds_of_groups: Rounds) -> float:
    """lambda = the largest |eigenvalue| of W_T ... W_1 - 11^T/n: the disagreement's decay per period in the
    long run (equal to rho for a symmetric product, below it otherwise)."""
    product = mixing_product(islands, rounds_of_groups)
    return float(np.max(np.abs(np.linalg.eigvals(product - 1.0 / len(islands)))))


def reach_periods(islands: Sequence[str], rounds_of_groups: Rounds) -> float:
    """The fewest periods after which every island holds part of every other's value (inf if never)."""
    product = mixing_product(islands, rounds_of_groups)
    power = product.copy()
    for periods in range(1, len(islands) + 1):
        if np.all(power > 1e-12):
            return periods
        power = product @ power
    return math.inf


def progress_periods(spectral: float, epsilon: float, reach: float) -> float:
    """Periods to epsilon at the asymptotic rate, fractional (training does not stop at a period's end):
    log(epsilon) / log(lambda), one when lambda <= epsilon, and at least the periods every island needs to
    hear from every other."""
    if spectral >= RHO_ONE or math.isinf(reach):
        return math.inf
    per_period = -math.log(max(spectral, epsilon))
    return max(math.log(1 / epsilon) / per_period, float(reach))
