"""The compiled kernel of the fast software aggregator, beside pyproject.toml (which holds everything else).

`optional=True`: where no C compiler is found the install goes on and `inwire.fastpath` uses numpy."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("inwire._fastpath", ["sw/inwire/_fastpath.c"], optional=True,
                             extra_compile_args=["-O2"])])
