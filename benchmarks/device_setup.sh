# Sourced at the start of every device call: unpack the carried packages (.devsite/site.tar.xz,
# made by benchmarks/pack_site.sh: duckdb, optuna, flashinfer, fa3-fwd, liger, fla...) and put them first.
# Unpacked once per machine: two scripts on the two GPUs of one machine share it.
[ -f /tmp/site/.unpacked ] || { mkdir -p /tmp/site && tar xJf .devsite/site.tar.xz -C /tmp/site && touch /tmp/site/.unpacked; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 - <<'PY'
import torch
from runtime_loader import registry
print("torch", torch.__version__, torch.cuda.get_device_name())
for spec in registry.REGISTRY.values():
    if spec.requires:
        print(f"  {spec.kernel_id:<24} {spec.version() or '-':<10} {spec.installed() or 'available'}")
PY
