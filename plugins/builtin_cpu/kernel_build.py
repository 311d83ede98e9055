"""What the CPU kernel module is made of, for both ways it is built: by ``pip install`` (the
project's ``setup.py``, one prebuilt module per instruction set) and on first use
(:func:`host.plugins.builtin_cpu.kernels.cpu_kernels`, when no prebuilt module fits).

Pure Python without torch: ``setup.py`` loads this file by its path while the package is not
installed yet. One source for every fact of the build: the translation units, the shared headers,
the bound functions, the instruction-set candidates (their ``-m`` flags and the check that proves
they run), the compiler flags, the generated bindings and the hash of the sources a module was
built from.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile

SOURCES = ("quant_linear.cpp", "llama_decode.cpp", "elementwise.cpp", "paged_decode.cpp", "fused_moe.cpp", "linear_small_m.cpp")
"""The C++ translation units (package data under ``csrc/``), each compiled on its own; the longest
to compile first, so ninja starts them first."""
HEADERS = ("host_cpu.h", "vector_math.h")
"""The headers they share (every unit includes host_cpu.h, which includes vector_math.h)."""
BINDINGS = "bindings.cpp"
"""Generated beside the staged sources from :data:`FUNCTIONS` (:func:`bindings_source`)."""

FUNCTIONS = (
    "paged_decode", "linear_small_m", "gguf_linear", "gguf_linear_q8", "quantize_q8", "int8_linear", "kernels_isa",
    "rms_norm", "fused_add_rms_norm_", "rotary_neox_", "silu_and_mul", "llama_decode_plan", "llama_decode_step",
    "llama_decode_release", "fused_moe",
)
"""The C++ functions the module binds under their own names."""

# Each candidate: its name, the -m flags of the build, and a check that executes instructions of
# that set (a function body returning 1 when the arithmetic came out right). The check runs as a
# tiny program before a first-use build and, compiled into a prebuilt module as ``isa_probe``, in a
# child process before that module is imported: a virtual machine's /proc/cpuinfo may list
# features (AVX-512, AMX) whose instructions trap.
ISA_CANDIDATES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "avx512",
        ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"),
        """volatile float s = 1.5f; __m512 a = _mm512_set1_ps(s); a = _mm512_fmadd_ps(a, a, a);
  __m512i b = _mm512_dpbusd_epi32(_mm512_castps_si512(a), _mm512_set1_epi8(1), _mm512_set1_epi8(2));
  __m256 c = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_set1_ps(s), _mm256_set1_ps(_cvtsh_ss(0x3c00)));
  return (_mm512_reduce_add_ps(a) > 0.f && _mm512_reduce_add_epi32(b) != 0 && _mm256_cvtss_f32(c) > 0.f) ? 1 : 0;""",
    ),
    (
        "avx2",
        ("-mavx2", "-mfma", "-mf16c"),
        """volatile float s = 1.5f; __m256 a = _mm256_fmadd_ps(_mm256_set1_ps(s), _mm256_set1_ps(s), _mm256_set1_ps(_cvtsh_ss(0x3c00)));
  __m256i b = _mm256_add_epi32(_mm256_cvtepi8_epi32(_mm_set1_epi8(3)), _mm256_set1_epi32(1));
  return (_mm256_cvtss_f32(a) > 0.f && _mm256_extract_epi32(b, 7) == 4) ? 1 : 0;""",
    ),
)
SCALAR = "scalar"
"""The build without ``-m`` flags (the kernels' scalar loops)."""

# -g0: no debug information (Python's own CFLAGS, which setuptools adds, ask for -g: it triples
# the compile of torch's headers). -fopenmp: at::parallel_for is an OpenMP region compiled into the module. -fno-associative-math:
# the compiler may not regroup float sums, which it would do differently in each batch-size
# variant of a kernel (a row's result must not depend on the rows computed beside it; the vector
# code is written out by hand). -mtune=native only tunes; the -m flags of the instruction set come
# from the candidate.
CFLAGS = ("-O3", "-g0", "-mtune=native", "-ffast-math", "-fno-finite-math-only", "-fno-associative-math", "-fopenmp")
LDFLAGS = ("-fopenmp",)


def isa_names() -> list[str]:
    """Every instruction-set name, widest first, ``scalar`` last."""
    return [name for name, _, _ in ISA_CANDIDATES] + [SCALAR]


def isa_flags_of(name: str) -> tuple[str, ...]:
    """The ``-m`` flags of the instruction set ``name`` (none for ``scalar``)."""
    for candidate, flags, _ in ISA_CANDIDATES:
        if candidate == name:
            return flags
    if name == SCALAR:
        return ()
    raise ValueError(f"instruction set {name!r} is not one of {', '.join(isa_names())}")


def probe_program(name: str) -> str:
    """A program that exits 0 when the instructions of ``name`` run here."""
    body = next(check for candidate, _, check in ISA_CANDIDATES if candidate == name)
    return f"#include <immintrin.h>\nstatic int check() {{\n  {body}\n}}\nint main() {{ return check() ? 0 : 1; }}\n"


def probe_runs(name: str) -> bool:
    """Whether :func:`probe_program` of ``name``, compiled with its flags (``$CXX``, else ``c++``),
    runs here and exits 0."""
    compiler = os.environ.get("CXX", "c++")
    with tempfile.TemporaryDirectory(prefix="host_isa_") as tmp:
        src, exe = os.path.join(tmp, "probe.cpp"), os.path.join(tmp, "probe")
        with open(src, "w", encoding="utf-8") as f:
            f.write(probe_program(name))
        try:
            subprocess.run([compiler, "-O1", *isa_flags_of(name), src, "-o", exe], check=True, capture_output=True, timeout=60)
            return subprocess.run([exe], capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def widest_running_isa() -> str:
    """The widest instruction set whose probe program runs here, else :data:`SCALAR`."""
    return next((name for name, _, _ in ISA_CANDIDATES if probe_runs(name)), SCALAR)


def sources_hash(texts: list[str]) -> str:
    """The hash of the source texts (:data:`SOURCES` then :data:`HEADERS`, as read) and of the
    bound functions: a prebuilt module older than the installed sources is not used."""
    digest = hashlib.sha256()
    for text in (*texts, *FUNCTIONS):
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def bindings_source(source_hash: str) -> str:
    """The pybind11 module: every function of :data:`FUNCTIONS` under its name (torch's error
    handling around each call, as ``load_inline(functions=...)`` writes it), the attribute
    ``sources_hash``, and ``isa_probe()``, which executes the widest instruction set the module
    was compiled for (call it in a child process: on a machine without it, it traps)."""
    lines = ["#include <torch/extension.h>", "#if defined(__x86_64__)", "#include <immintrin.h>", "#endif", '#include "host_cpu.h"', ""]
    lines.append("static int isa_probe() {")
    for i, (name, flags, check) in enumerate(ISA_CANDIDATES):
        macros = " && ".join(f"defined(__{flag[2:].upper().replace('-', '_')}__)" for flag in flags)
        lines += [f"#{'if' if i == 0 else 'elif'} {macros}", f"  {check}"]
    lines += ["#else", "  return 1;", "#endif", "}", ""]
    lines.append("PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {")
    lines += [f'  m.def("{name}", torch::wrap_pybind_function({name}), "{name}");' for name in FUNCTIONS]
    lines.append('  m.def("isa_probe", &isa_probe, "Executes the widest instruction set this module was compiled for.");')
    lines.append(f'  m.attr("sources_hash") = "{source_hash}";')
    return "\n".join([*lines, "}", ""])


def write_if_changed(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` unless it already holds it (an unchanged file keeps its time, so
    ninja does not rebuild it), through a temporary file: a process starting beside this one
    never compiles half a file."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return
    except OSError:
        pass
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def stage_sources(folder: str, texts: list[str]) -> list[str]:
    """Writes ``texts`` (:data:`SOURCES` then :data:`HEADERS`) and the bindings generated for them
    into ``folder``; returns the paths of the translation units to compile (the bindings first:
    with all of ``torch/extension.h`` to parse, they take about as long as quant_linear.cpp)."""
    os.makedirs(folder, exist_ok=True)
    for name, text in zip((*SOURCES, *HEADERS), texts):
        write_if_changed(os.path.join(folder, name), text)
    write_if_changed(os.path.join(folder, BINDINGS), bindings_source(sources_hash(texts)))
    return [os.path.join(folder, name) for name in (BINDINGS, *SOURCES)]


PREBUILT_PREFIX = "_kernels_"
"""A prebuilt module is ``host.plugins.builtin_cpu._kernels_<isa>``."""
