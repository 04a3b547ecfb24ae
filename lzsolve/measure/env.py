"""Environment sensing: what the GPU and the host were doing while a record was measured.

NVML (nvidia-ml-py) gives temperature, clocks, power and the reasons clocks
were held down. Every record stores them with a temperature bucket and a
`throttled` flag. Without NVML (CPU, containers without the library, no
permission) every field is None and nothing fails.

Who else was using the machine goes with each timing too (`contention`): the host's load
average per core, and on a GPU the compute processes of other programs there. A busy host
shows in the timings' spread, which the solver and `compare` judge (solve.decision_noise); these
say why.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

# NVML clock-event (throttle) reason bits, from nvml.h. Only these mean the
# clocks were lowered against the workload's will; idle and application-clock
# settings are not throttling.
SW_POWER_CAP = 0x4
HW_SLOWDOWN = 0x8
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
THROTTLE_MASK = SW_POWER_CAP | HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE
THERMAL_OR_POWER = {"sw_power_cap": SW_POWER_CAP, "hw_slowdown": HW_SLOWDOWN, "sw_thermal": SW_THERMAL,
                    "hw_thermal": HW_THERMAL, "hw_power_brake": HW_POWER_BRAKE}

COLD_BELOW_C = 45  # idle H100s sit at 30-40 C
HOT_FROM_C = 75  # sustained load on air-cooled parts; thermal slowdown starts in the 80s


@dataclass(frozen=True)
class EnvReading:
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    throttle_reasons: int | None = None


def bucket(temp_c: float | None) -> str | None:
    if temp_c is None:
        return None
    return "cold" if temp_c < COLD_BELOW_C else "hot" if temp_c >= HOT_FROM_C else "warm"


def reasons_text(mask: int | None) -> str | None:
    if mask is None:
        return None
    return ",".join(name for name, bit in THERMAL_OR_POWER.items() if mask & bit) or ""


def combine(before: EnvReading, after: EnvReading) -> dict:
    """Record fields for a measurement bracketed by two readings (worst case of the two)."""
    def pick(a, b, f):
        values = [v for v in (a, b) if v is not None]
        return f(values) if values else None

    mask = pick(before.throttle_reasons, after.throttle_reasons, lambda v: v[0] | v[-1])
    temp = pick(before.temp_c, after.temp_c, max)
    return {
        "temp_c": temp,
        "sm_clock_mhz": pick(before.sm_clock_mhz, after.sm_clock_mhz, min),
        "mem_clock_mhz": pick(before.mem_clock_mhz, after.mem_clock_mhz, min),
        "power_w": pick(before.power_w, after.power_w, max),
        "throttle_reasons": reasons_text(mask),
        "env_bucket": bucket(temp),
        "throttled": None if mask is None else bool(mask & THROTTLE_MASK),
    }


class Sensor:
    """Reads NVML for one CUDA device; a no-op (every field None) on CPU or without NVML."""

    def __init__(self, nvml=None, handle=None):
        self._nvml, self._handle = nvml, handle

    @classmethod
    def for_device(cls, device: torch.device) -> Sensor:
        if device.type != "cuda":
            return cls()
        try:
            import pynvml

            pynvml.nvmlInit()
            return cls(pynvml, cls._find(pynvml, device))
        except Exception:  # no NVML library, driver or permission: the fields stay empty
            return cls()

    @staticmethod
    def _find(pynvml, device: torch.device):
        """NVML's handle for the torch device: by PCI address (CUDA_VISIBLE_DEVICES may renumber)."""
        props = torch.cuda.get_device_properties(device)
        try:
            address = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return pynvml.nvmlDeviceGetHandleByPciBusId(address.encode())
        except Exception:
            return pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def other_processes(self) -> int | None:
        """How many compute processes on this GPU are not this run's (this process, its parent the
        tune, and the tune's other children: builders, warmers). None without NVML, or where NVML's
        process ids are not this namespace's (a container): this process is then not among them."""
        if self._nvml is None:
            return None
        try:
            pids = {p.pid for p in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)}
        except Exception:
            return None
        me, tune = os.getpid(), os.getppid()
        if me not in pids:
            return None
        return sum(pid not in (me, tune) and _parent(pid) != tune for pid in pids)

    def read(self) -> EnvReading:
        if self._nvml is None:
            return EnvReading()
        n, h = self._nvml, self._handle

        def safe(f):
            try:
                return f()
            except Exception:
                return None

        reasons = safe(lambda: n.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:
            reasons = safe(lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        return EnvReading(
            temp_c=safe(lambda: float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU))),
            sm_clock_mhz=safe(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_SM))),
            mem_clock_mhz=safe(lambda: float(n.nvmlDeviceGetClockInfo(h, n.NVML_CLOCK_MEM))),
            power_w=safe(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0),
            throttle_reasons=reasons,
        )


def _parent(pid: int) -> int | None:
    """The parent of a process (Linux's /proc/<pid>/stat: the field after the command's name,
    which may hold spaces and parentheses), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def host_load() -> float | None:
    """The host's 1-minute load average per core this process may run on: above 1, more processes
    wanted a core than there were (a timing then measures its share of one); None where unknown."""
    try:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        return round(os.getloadavg()[0] / max(1, cores or 1), 3)
    except OSError:
        return None


BUSY_LOAD = 1.0  # a host load per core past this: more processes wanted a core than there were


def busy(record: dict) -> bool:
    """Whether a record was timed on a busy machine: a CPU timing while the host's load per core was
    past BUSY_LOAD (it timed the share of a core the scheduler gave it), a GPU timing beside other
    programs' processes on the GPU. Records older than these fields are not judged."""
    if str(record.get("device") or "").startswith("cuda"):
        return (record.get("gpu_others") or 0) > 0
    return (record.get("host_load") or 0.0) > BUSY_LOAD


def contention(sensor: Sensor) -> dict:
    """Record fields: the host's load per core and the GPU's other processes, when a timing ended."""
    return {"host_load": host_load(), "gpu_others": sensor.other_processes()}
