"""Mixing: the averaging product of a period, its norm and how many periods reach epsilon."""

import math

import numpy as np

RHO_ZERO = 1e-9
"""rho at or below this counts as exact consensus after one period (round-off of an exact average)."""
RHO_ONE = 1 - 1e-12
"""rho at or above this never reaches consensus."""


def mixing_product(islands, rounds_of_groups):
    """W_T ... W_1 for rounds given as collections of member groups; unlisted islands keep their value."""
    index = {name: i for i, name in enumerate(islands)}
    product = np.eye(len(islands))
    for groups in rounds_of_groups:
        for group in groups:
            if len(group) > 1:
                rows = [index[member] for member in group]
                product[rows] = product[rows].mean(axis=0)
    return product


def mixing_rate(islands, rounds_of_groups):
    """rho = ||W_T ... W_1 - 11^T/n||_2: how much one period shrinks the disagreement, at worst."""
    product = mixing_product(islands, rounds_of_groups)
    return float(np.linalg.norm(product - 1.0 / len(islands), 2))


def periods_to_epsilon(rho, epsilon):
    """Periods until rho**periods <= epsilon: one for an exact average, infinity when rho is 1."""
    if rho <= RHO_ZERO:
        return 1
    if rho >= RHO_ONE:
        return math.inf
    return max(1, math.ceil(math.log(epsilon) / math.log(rho) - 1e-9))


def time_to_epsilon_ms(rho, period_ms, epsilon):
    periods = periods_to_epsilon(rho, epsilon)
    return math.inf if math.isinf(periods) else periods * period_ms


