//! The kernel sources, embedded. Each file is one NVRTC program; its entry
//! points are `extern "C"` so their names survive compilation unmangled.

/// One `.cu` source and the functions it defines.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub name: &'static str,
    pub source: &'static str,
    pub functions: &'static [&'static str],
    /// Compiled on first use instead of when the GPU is opened (a large
    /// program only some runs launch: NVRTC takes seconds over it, which
    /// every miner's start-up would pay).
    pub lazy: bool,
}

pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "codec",
        source: include_str!("../kernels/codec.cu"),
        functions: &["encode_int8_rows", "decode_int8_rows", "encode_bf16", "decode_bf16"],
        lazy: false,
    },
    Kernel {
        name: "butterfly",
        source: include_str!("../kernels/butterfly.cu"),
        functions: &[
            "nonfinite_partials",
            "weighted_mean",
            "coord_median",
            "sq_dist_partials",
            "clip_step",
            "nesterov",
            "apply_update",
        ],
        lazy: false,
    },
    Kernel {
        name: "flash",
        source: include_str!("../kernels/flash.cu"),
        functions: &[
            "flash_fwd_16",
            "flash_fwd_32",
            "flash_fwd_64",
            "flash_fwd_128",
            "flash_bwd_prep",
            "flash_bwd_dq_16",
            "flash_bwd_dq_32",
            "flash_bwd_dq_64",
            "flash_bwd_dq_128",
            "flash_bwd_dkv_16",
            "flash_bwd_dkv_32",
            "flash_bwd_dkv_64",
            "flash_bwd_dkv_128",
        ],
        lazy: true,
    },
    Kernel {
        name: "ops",
        source: include_str!("../kernels/ops.cu"),
        functions: &[
            "embedding",
            "embedding_bwd",
            "rmsnorm",
            "rmsnorm_bwd_dx",
            "rmsnorm_bwd_dw_partials",
            "sum_rows",
            "rope",
            "swiglu",
            "swiglu_bwd",
            "causal_softmax",
            "causal_softmax_bwd",
            "cross_entropy",
            "adamw",
            "sum_squares_partials",
            "fill",
            "add_assign",
            "scale",
            "scatter_cols",
            "gather_cols",
            "cast_bf16",
        ],
        lazy: false,
    },
];
