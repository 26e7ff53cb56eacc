# Sourced by the GPU scripts: where the CUDA libraries, headers and NCCL
# are on a device machine (the toolkit in /usr/local/cuda, or the Python
# wheels' nvidia/ folders).
SP=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
export LD_LIBRARY_PATH="${SP:+$SP/nvidia/cu13/lib:$SP/nvidia/nccl/lib:}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for inc in /usr/local/cuda/include "${SP:+$SP/nvidia/cu13/include}"; do
    if [ -n "$inc" ] && [ -f "$inc/cuda_bf16.h" ]; then
        export IOTA_CUDA_INCLUDE="$inc"
        break
    fi
done
# NCCL ships only libnccl.so.2: point at it where the wheel put it.
if [ -z "${IOTA_NCCL_LIB:-}" ] && [ -n "$SP" ] && [ -f "$SP/nvidia/nccl/lib/libnccl.so.2" ]; then
    export IOTA_NCCL_LIB="$SP/nvidia/nccl/lib/libnccl.so.2"
fi
