"""The compiled part of the package: the CPU kernels, one extension module per instruction set
(``host.plugins.builtin_cpu._kernels_<isa>``), built by ``pip install`` with torch's
``BuildExtension``. Everything else about the package is in pyproject.toml.

What is compiled and how (sources, flags, bindings) comes from
``plugins/builtin_cpu/kernel_build.py``, loaded here by its path. Building needs torch importable,
so ``make install`` installs with ``--no-build-isolation``; without torch (an isolated build), or
with ``HOST_BUILD_CPU_KERNELS=0``, no module is prebuilt and the kernels are built on first use as
before. By default the module is built for the widest instruction set whose probe program runs on
the building machine (AVX-512, AVX2, else the plain build); ``HOST_CPU_KERNEL_ISAS=avx512,avx2,scalar``
builds those instead (a wheel for other machines). At run time the widest prebuilt module that runs
is taken, and a machine none fits builds its own on first use.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from setuptools import setup

ROOT = os.path.dirname(os.path.abspath(__file__))
CPU = os.path.join("plugins", "builtin_cpu")


def _kernel_build():
    spec = importlib.util.spec_from_file_location("_host_kernel_build", os.path.join(ROOT, CPU, "kernel_build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_kernel_extensions() -> tuple[list, dict]:
    """The extension modules and the ``cmdclass`` that builds them (both empty when not built)."""
    if os.environ.get("HOST_BUILD_CPU_KERNELS", "1") == "0":
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("host: torch is not importable while building (an isolated build?): the CPU kernels will be "
              "built on first use instead (pip install --no-build-isolation prebuilds them)", file=sys.stderr)
        return [], {}
    kb = _kernel_build()
    # torch's ninja check runs `ninja`, which pip's ninja package puts beside the interpreter: on
    # PATH only in an activated virtual environment
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    names = (*kb.SOURCES, *kb.HEADERS)
    texts = []
    for name in names:
        with open(os.path.join(ROOT, CPU, "csrc", name), encoding="utf-8") as f:
            texts.append(f.read())
    wanted = os.environ.get("HOST_CPU_KERNEL_ISAS", "").strip()
    if wanted:
        isas = [name.strip().lower() for name in wanted.split(",") if name.strip()]
        for isa in isas:
            kb.isa_flags_of(isa)  # a ValueError names the choices
    else:
        isas = [kb.widest_running_isa()]
    extensions = []
    for isa in isas:
        # each instruction set compiles its own copy of the sources (object files apart)
        stage = os.path.join("build", "host_cpu_kernels", isa)
        sources = kb.stage_sources(stage, texts)
        extensions.append(CppExtension(
            name=f"host.plugins.builtin_cpu.{kb.PREBUILT_PREFIX}{isa}",
            sources=sources,
            include_dirs=[os.path.join(ROOT, stage)],
            extra_compile_args=[*kb.CFLAGS, *kb.isa_flags_of(isa)],
            extra_link_args=list(kb.LDFLAGS),
        ))
    return extensions, {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = cpu_kernel_extensions()
setup(ext_modules=ext_modules, cmdclass=cmdclass)
