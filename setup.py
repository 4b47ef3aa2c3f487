"""The probe's compiled parts; everything else is declared in pyproject.toml.

* ``_fast``: the probe's wrapper in C. Where no C compiler exists the install goes on and the
  probe runs its Python wrapper (same records, a few microseconds more per collective).
* ``_fr_scan``: reads a flight-recorder pickle's entries straight into columns, ten times faster
  than unpickling them. Without a C compiler, dumps are read with the restricted unpickler and the
  same code in Python (the same tables, slower).
* ``_meta``: reads a tensor's sizes and dtype for that wrapper without torch's getters (about a
  microsecond less per collective). It is C++ against torch's headers, so it is built only when
  torch is importable here: ``pip install --no-build-isolation`` into an environment that has
  torch (``make install`` does). It records the torch it was built for, and the probe uses it
  only under that torch; otherwise, or where it was not built, the wrapper calls the getters.
"""

from setuptools import Extension, setup


def meta_extension() -> list[Extension]:
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        return []
    build = f"{torch.__version__} {torch.version.git_version}"  # _core._meta_reader compares
    return [
        Extension(
            "rankscope.probe._meta",
            ["src/rankscope/probe/_meta.cpp"],
            depends=["src/rankscope/probe/_tensor_meta.h"],
            include_dirs=cpp_extension.include_paths(),
            library_dirs=cpp_extension.library_paths(),
            libraries=["c10"],
            define_macros=[
                ("RANKSCOPE_TORCH_BUILD", f'"{build}"'),
                ("_GLIBCXX_USE_CXX11_ABI", str(int(torch._C._GLIBCXX_USE_CXX11_ABI))),
            ],
            extra_compile_args=["-std=c++20"],  # as torch.utils.cpp_extension
            language="c++",
            optional=True,
        )
    ]


setup(
    ext_modules=[
        Extension(
            "rankscope.probe._fast",
            ["src/rankscope/probe/_fast.c"],
            depends=["src/rankscope/probe/_tensor_meta.h"],
            libraries=["m"],
            optional=True,
        ),
        Extension(
            "rankscope.collect._fr_scan",
            ["src/rankscope/collect/_fr_scan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        *meta_extension(),
    ]
)
