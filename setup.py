"""The compiled kernel of the hosts (`inwire._kernel`), beside pyproject.toml (which holds everything else).

One extension from the C files beside the modules they speed up (sw/inwire/_*.c, sharing _kernel.h).
`optional=True`: where no C compiler is found the install goes on and the Python paths run instead. -O3 lets the
codec's loops vectorize, -fno-trapping-math lets their selects do so (no program here traps on a float
exception); -ffp-contract=off keeps their float operations exactly the definition's (no fused multiply-add)."""

from setuptools import Extension, setup

KERNEL_SOURCES = [f"sw/inwire/{part}.c" for part in ("_kernel", "_codec", "_transport", "_fastpath", "_client")]

setup(ext_modules=[Extension("inwire._kernel", KERNEL_SOURCES, depends=["sw/inwire/_kernel.h"], optional=True,
                             extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math"])])
