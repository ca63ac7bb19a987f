"""What only the NPD005 tests share (imported as ``npd005_support``: pytest puts this folder on
``sys.path`` for its test modules)."""

# NPD005: the line of the NPU pool's get_cpu_copy each deployment kind reaches, on the releases
# where the truth says it refuses the allocator's keyword (the truths' evidence names them).
NPD005_POOL_DEFS = {
    "0.5.13": {"mla": "memory_pool_npu.py:483", "gqa": "memory_pool_npu.py:224"},
    "0.5.14": {"mla": "memory_pool_npu.py:508"},
}
