"""What a replayed call costs in pure Python on this host, piece by piece (issue 17).

The Dispatcher's hot path per call: bind the method's arguments, build the key from tensor
attributes, one dict read, one count, the kernel's call. Each piece is timed alone with timeit
(best of 7 repeats, ns per operation), on tensors of the device given, so a host's floor for
a pure-Python dispatcher can be read off: the sum of the pieces a call needs. --cpp also builds
(torch.utils.cpp_extension: a C++ compiler and torch's headers) and times the same key computed in
C++ from the tensor's sizes, dtype and device: what a C++ key would save over the Python one.

    python benchmarks/host_floor.py --device cuda [--cpp]
"""
from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import timeit

import torch

from runtime_loader.ops import OPS, Signature, example_args

# key(tensor, flag) -> (*sizes, scalar type, is_cuda, flag): the dispatcher's key, read in C++ from the
# tensor (THPVariable_Unpack), called through CPython's fast path (METH_FASTCALL, not pybind11's).
CPP_KEY = r"""
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>

static PyObject* key(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs != 2 || !THPVariable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "key(tensor, flag)");
        return nullptr;
    }
    const at::Tensor& t = THPVariable_Unpack(args[0]);
    auto sizes = t.sizes();
    Py_ssize_t n = (Py_ssize_t)sizes.size();
    PyObject* out = PyTuple_New(n + 3);
    for (Py_ssize_t i = 0; i < n; ++i) PyTuple_SET_ITEM(out, i, PyLong_FromLongLong(sizes[i]));
    PyTuple_SET_ITEM(out, n, PyLong_FromLong((long)t.scalar_type()));
    PyTuple_SET_ITEM(out, n + 1, PyBool_FromLong(t.is_cuda()));
    Py_INCREF(args[1]);
    PyTuple_SET_ITEM(out, n + 2, args[1]);
    return out;
}

static PyMethodDef key_def = {"key", (PyCFunction)(void (*)(void))key, METH_FASTCALL, nullptr};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.attr("key") = pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(&key_def, nullptr));
}
"""


def cpp_key():
    """The C++ key function, and the seconds its build took (0 when torch's extension cache had it)."""
    from torch.utils.cpp_extension import load_inline

    start = timeit.default_timer()
    module = load_inline("lzsolve_host_floor_key", cpp_sources=CPP_KEY, extra_cflags=["-O2"])
    return module.key, timeit.default_timer() - start


def ns(stmt: str, env: dict, number: int = 200_000) -> float:
    return min(timeit.repeat(stmt, globals=env, number=number, repeat=7)) / number * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cpp", action="store_true", help="also time the key computed in C++ (builds it first)")
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device(args.device)
    sig = Signature.make("norm.rms", {"hidden": 8192}, (), "bf16")
    x, weight, *_ = example_args(sig, {"tokens": 1}, device)
    key = (x.shape, x.dtype, x.is_cuda, False)
    env = {"x": x, "weight": weight, "key": key, "cache": {key: 1}, "count": itertools.count(),
           "front": OPS["norm.rms"].front, "noop": lambda *a: None, "kwargs_noop": lambda x, weight, eps=1e-6, unit_offset=False: None}
    env["get"] = env["cache"].get
    pieces = {
        "x.shape": "x.shape",
        "x.dtype": "x.dtype",
        "x.is_cuda": "x.is_cuda",
        "key tuple (shape, dtype, is_cuda, flag)": "(x.shape, x.dtype, x.is_cuda, False)",
        "dict get of a built key": "get(key)",
        "next(count)": "next(count)",
        "call of a 4-parameter function (2 passed)": "kwargs_noop(x, weight)",
        "call of f(*args) with a 3-tuple": "noop(*(x, weight, 1e-6))",
        "call of f(a, b, c)": "noop(x, weight, 1e-6)",
        "front (key and kernel args)": "front(x, weight)",
        "build key + get + count (inlined hot path)": "get((x.shape, x.dtype, x.is_cuda, False)); next(count)",
    }
    info = {"python": sys.version.split()[0], "machine": platform.processor() or platform.machine(), "device": str(device)}
    if args.cpp:
        env["cpp_key"], info["cpp_build_s"] = cpp_key()
        env["cpp_cache"] = {env["cpp_key"](x, False): 1}
        env["cpp_get"] = env["cpp_cache"].get
        assert env["cpp_get"](env["cpp_key"](x, False)) == 1
        pieces["c++ key (sizes, scalar type, is_cuda, flag)"] = "cpp_key(x, False)"
        pieces["c++ key + get + count"] = "cpp_get(cpp_key(x, False)); next(count)"
    rows = {name: ns(stmt, env) for name, stmt in pieces.items()}
    width = max(map(len, rows))
    for name, value in rows.items():
        print(f"{name:{width}}  {value:7.1f} ns")
    print(info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**info, "ns": rows}, f, indent=1)


if __name__ == "__main__":
    main()
