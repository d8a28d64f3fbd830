"""The cases Megatron-LM's second extraction added to ``golden/megatron/`` (the snapshot
README's "The families added in the second extraction"), each with the feature families
its ``model_config.yaml`` turns on, read by hand from the files: the expected values of
the recordings' and the tier's tests."""

from __future__ import annotations

# The second extraction's cases and the features each one's model_config.yaml turns on,
# read by hand from the files (the flags named in cpmem.golden.megatron_features).
SECOND_EXTRACTION: dict[str, tuple[str, ...]] = {
    "gpt/gpt3_15b_8t_release": ("release-15b",),  # TEST_TYPE: "release"
    "gpt/gpt3_15b_8t_release_sm": ("release-15b",),
    "gpt/gpt3_mcore_te_tp2_pp2_mla": ("mla",),
    "gpt/gpt3_mcore_te_tp2_pp2_mla_1node": ("mla",),
    "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor": ("fsdp",),  # --use-megatron-fsdp
    "gpt/gpt3_mcore_te_tp2_zp_z3_resume_fsdp_dtensor_1node": ("fsdp",),
    # --fp8-format hybrid, --fp8-recipe tensorwise, --fp8-param-gather
    "gpt/gpt3_weekly_mcore_tp2_pp2_current_scaling_native_fp8_tp_pp_sp_tp_overlap": ("fp8",),
    "hybrid/hybrid_flextron_nightly_tp2_pp1_ep2_dgx_h100_1N8G": ("hybrid",),
    "hybrid/hybrid_mr_mcore_te_tp1_pp1_cp1_dgx_a100_1N8G": ("hybrid",),
    "hybrid/hybrid_mr_mcore_te_tp1_pp4_cp1_dgx_a100_1N8G": ("hybrid",),
    "hybrid/hybrid_mr_mcore_te_tp2_pp1_cp1_dgx_a100_1N8G": ("hybrid",),
    "moe/deepseek_proxy_fsdp_ep2_fsdp2": ("mla", "fp8", "fsdp"),
    "moe/deepseek_proxy_fsdp_ep2_fsdp2_1node": ("mla", "fp8", "fsdp"),
    "moe/deepseek_proxy_fsdp_ep2_fsdp2_ep_overlap": ("mla", "fsdp"),  # no --fp8-* flag
    "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon": ("muon",),
    "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_dist_muon_1node": ("muon",),
    "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon": ("muon",),
    "moe/gpt3_moe_mcore_te_ep8_resume_torch_dist_muon_1node": ("muon",),
    # --multi-latent-attention, --mtp-num-layers 1, --fine-grained-activation-offloading
    "moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_fine_grained_offloading": ("mla", "mtp", "offloading"),
    # --mtp-num-layers 1, --fp8-format hybrid, --cuda-graph-impl transformer_engine
    "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph": ("mtp", "fp8", "cudagraph"),
    "moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph_1node": ("mtp", "fp8", "cudagraph"),
    # --hybrid-layer-pattern ...E/*E, --mtp-num-layers 2
    "nemotron/nemotron3_5_lightning_nightly_tp1_pp1_cp1_ep8_dgx_gb200": ("hybrid", "mtp"),
    "nemotron/nemotron3_5_lightning_no_load_optim_tp1_pp1_cp1_ep4_dgx_gb200_1N4G": (
        "hybrid",
        "mtp",
    ),
}
