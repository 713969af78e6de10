"""The compiled kernel of the fast software aggregator, beside pyproject.toml (which holds everything else).

`optional=True`: where no C compiler is found the install goes on and `inwire.fastpath` uses numpy. -O3 lets the
codec's loops vectorize, -fno-trapping-math lets their selects do so (no program here traps on a float
exception); -ffp-contract=off keeps their float operations exactly the definition's (no fused multiply-add)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("inwire._fastpath", ["sw/inwire/_fastpath.c"], optional=True,
                             extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math"])])
