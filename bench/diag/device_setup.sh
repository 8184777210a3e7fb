# Sourced by the device-call wrappers (bench/diag/*.sh): the lent machines' settings (NVLink
# multicast off), the package installed from the working tree, that interpreter first on PATH.
: "${OUT:?OUT must name the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "install failed"
PATH="$(dirname "$(command -v python3)"):$PATH"
