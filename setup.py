"""The probe's wrapper in C; everything else is declared in pyproject.toml.

``optional``: where no C compiler exists the install goes on and the probe runs its Python
wrapper (same records, a few microseconds more per collective).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rankscope.probe._fast",
            ["src/rankscope/probe/_fast.c"],
            libraries=["m"],
            optional=True,
        )
    ]
)
