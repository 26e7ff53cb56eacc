use super::*;

fn cuda(batch: usize, seq: usize, in_flight: usize) -> Workload {
    Workload::of(ComputeBackend::CudaBf16Gemm, batch, seq, in_flight)
}

#[test]
fn parameter_counts_are_the_layouts() {
    for (preset, stages) in [("tiny", 3), ("1.5b", 3), ("15b", 8)] {
        let c = ModelConfig::preset(preset).unwrap();
        let plan = plan_memory(&c, stages, &cuda(1, 64, 2)).unwrap();
        let counts = c.stage_param_counts(stages).unwrap();
        assert_eq!(plan.iter().map(|m| m.params).collect::<Vec<_>>(), counts);
        for m in &plan {
            assert_eq!(m.weights, 4 * m.params as u64);
            assert_eq!(m.grads, m.weights);
            assert_eq!(m.optimizer_state, 2 * m.weights);
        }
    }
    let c = ModelConfig::preset("1.5b").unwrap();
    assert!(plan_memory(&c, 17, &cuda(1, 64, 2)).is_err());
}

#[test]
fn totals_grow_with_batch_and_in_flight() {
    let c = ModelConfig::preset("1.5b").unwrap();
    for stage in 0..3 {
        let at = |batch, in_flight| plan_memory(&c, 3, &cuda(batch, 1024, in_flight)).unwrap()[stage].peak();
        for in_flight in 1..4 {
            assert!(at(2, in_flight) < at(4, in_flight), "stage {stage}");
            assert!(at(1, in_flight) < at(2, in_flight), "stage {stage}");
        }
        for batch in [1, 2, 4] {
            let (one, two, three) = (at(batch, 1), at(batch, 2), at(batch, 3));
            if stage < 2 {
                assert!(one < two && two < three, "stage {stage} batch {batch}");
            } else {
                // The tail holds one micro-batch whatever is in flight.
                assert!(one == two && two == three, "tail batch {batch}");
            }
        }
    }
}

#[test]
fn activations_count_every_saved_buffer() {
    // One body block of a hand-checkable shape, no bottleneck: x, xn1, x2,
    // xn2 (4 x 8 x 16), rstd1/2 (2 x 8), qkv (8 x 32), probs (2 x 4 x 4 x 4),
    // att (8 x 16), gu (8 x 64), m (8 x 32), plus h_out (8 x 16).
    let mut c = ModelConfig::preset("tiny").unwrap();
    (c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.ffn_hidden, c.bottleneck) = (16, 3, 4, 2, 32, 0);
    let spec = StageSpec::split(&c, 3).unwrap()[1].clone();
    let w = Workload { backend: ComputeBackend::Cpu, ..cuda(2, 4, 1) };
    let m = stage_memory(&c, &spec, &w);
    let block = 4 * 8 * 16 + 2 * 8 + 8 * 32 + 2 * 4 * 4 * 4 + 8 * 16 + 8 * 64 + 8 * 32;
    assert_eq!(m.activations_per_micro_batch, 4 * (block + 8 * 16) as u64);
    assert_eq!(m.attention_probs_per_micro_batch, 4 * 128);
    assert_eq!(m.weight_stashes, 0);
    assert_eq!((m.bf16_operands, m.runtime), (0, 0), "no GPU pieces on the CPU");
}

#[test]
fn stashes_follow_in_flight_and_switch() {
    let c = ModelConfig::preset("1.5b").unwrap();
    let plan = plan_memory(&c, 3, &cuda(2, 1024, 3)).unwrap();
    assert_eq!(plan[0].stashed_versions, 2);
    assert_eq!(plan[0].weight_stashes, 2 * plan[0].weights);
    assert_eq!(plan[2].stashed_versions, 0, "the tail steps with nothing in flight");
    let off = plan_memory(&c, 3, &Workload { weight_stashing: false, ..cuda(2, 1024, 3) }).unwrap();
    assert_eq!(off[0].weight_stashes, 0);
    // Stashes are fp32 copies, and their bf16 copies count up to the limit.
    let copies = plan[0].bf16_weight_copies - off[0].bf16_weight_copies;
    assert_eq!(plan[0].peak() - off[0].peak(), plan[0].weight_stashes + copies);
    assert_eq!(plan[0].bf16_weight_copies, BF16_WEIGHT_COPIES_LIMIT, "three versions of 1.5b's head exceed it");
    assert!(off[0].bf16_weight_copies < BF16_WEIGHT_COPIES_LIMIT);
    // Recomputing, the head's stashes leave its embedding table out and
    // are swapped into the weights' buffer (no bf16 copies of their own);
    // the body's stay whole.
    let lean = plan_memory(&c, 3, &cuda(2, 1024, 3).recomputing(true)).unwrap();
    let embedding = 4 * (c.vocab_size * c.d_model) as u64;
    assert_eq!(lean[0].weight_stashes, 2 * (lean[0].weights - embedding));
    assert_eq!(lean[0].bf16_weight_copies, off[0].bf16_weight_copies);
    assert_eq!(lean[1].weight_stashes, 2 * lean[1].weights);
    assert_eq!(lean[1].bf16_weight_copies, plan[1].bf16_weight_copies);
}

#[test]
fn the_bf16_copies_take_what_the_card_leaves() {
    let c = ModelConfig::preset("1.5b").unwrap();
    let plan = plan_memory(&c, 3, &cuda(2, 1024, 2)).unwrap();
    for m in &plan {
        assert!(m.optional_copies() > 0);
        assert_eq!(m.required_peak() + m.optional_copies(), m.peak());
        // A big card keeps every copy.
        assert_eq!(m.copy_limits(80 * GIB), (m.bf16_weight_copies, m.bf16_activation_copies));
        // A card that only just holds the required peak keeps none.
        let tight = (m.required_peak() as f64 / (1.0 - FIT_RESERVE)).ceil() as u64;
        assert!(m.fits(tight));
        assert_eq!(m.copy_limits(tight), (0, 0));
        // In between: the weights' copies first.
        let half = tight + ((m.bf16_weight_copies / 2) as f64 / (1.0 - FIT_RESERVE)) as u64;
        let (w, a) = m.copy_limits(half);
        assert!(w > 0 && w < m.bf16_weight_copies && a == 0, "{w} {a}");
    }
}

#[test]
fn bf16_copies_of_weights_and_attention_operands_are_counted() {
    let c = ModelConfig::preset("small").unwrap();
    let w = Workload { weight_stashing: false, ..cuda(2, 64, 1) };
    let plan = plan_memory(&c, 2, &w).unwrap();
    for (m, spec) in plan.iter().zip(crate::layout::StageSpec::split(&c, 2).unwrap()) {
        let layout = ParamLayout::for_stage(&c, &spec);
        // Every 2-D tensor but the embedding table is a GEMM weight.
        let embed = if spec.has_embedding() { c.vocab_size * c.d_model } else { 0 };
        let norms: usize = layout.entries.iter().filter(|e| e.shape.len() == 1).map(|e| e.len()).sum();
        assert_eq!(m.bf16_weight_copies, 2 * (m.params - embed - norms) as u64);
        let (n, t) = (2 * 64, 64);
        let attention = n * c.qkv_dim() + 2 * c.n_heads * t * t + n * c.q_dim() + c.n_kv_heads * t * t;
        assert_eq!(m.bf16_attention, 2 * attention as u64);
        let block = 2 * n * c.d_model + n * c.q_dim() + n * c.ffn_hidden + n * c.qkv_dim() + 2 * c.n_heads * t * t;
        assert_eq!(m.bf16_activation_copies, 2 * (spec.layers.len() * block) as u64);
    }
    let cpu = plan_memory(&c, 2, &Workload { backend: ComputeBackend::Cpu, ..w }).unwrap();
    assert!(cpu.iter().all(|m| m.bf16_weight_copies == 0 && m.bf16_attention == 0 && m.bf16_activation_copies == 0));
    // Past the limit the copies stop growing: 1.5b's head holds two
    // micro-batches of 4 x 1024.
    let big = plan_memory(&ModelConfig::preset("1.5b").unwrap(), 3, &cuda(4, 1024, 2)).unwrap();
    assert_eq!(big[0].bf16_activation_copies, BF16_ACTIVATION_COPIES_LIMIT);
    assert!(big.iter().all(|m| m.bf16_activation_copies <= BF16_ACTIVATION_COPIES_LIMIT));
}

#[test]
fn the_tail_casts_its_lm_head_and_chunks_its_logits() {
    let c = ModelConfig::preset("1.5b").unwrap();
    let plan = plan_memory(&c, 3, &cuda(2, 1024, 2)).unwrap();
    let tail = &plan[2];
    // The largest bf16 cast at the tail is the LM head's [vocab, d] weight.
    assert!(tail.bf16_operands >= 2 * (c.vocab_size * c.d_model) as u64);
    assert!(plan[1].bf16_operands < tail.bf16_operands / 4);
    // 8M logits over a 128,256 vocabulary: 65 rows at a time.
    assert_eq!(logit_rows_per_chunk(2048, c.vocab_size), 65);
    assert_eq!(logit_rows_per_chunk(10, c.vocab_size), 10);
    assert_eq!(logit_rows_per_chunk(4, 1 << 30), 1);
    // Between micro-batches the tail holds no activations; a head does.
    assert_eq!(tail.training_peak() - tail.between_micro_batches(), tail.saved_activations() + tail.workspace);
    assert_eq!(plan[0].training_peak() - plan[0].between_micro_batches(), plan[0].workspace);
    let lines: u64 = tail.lines().iter().map(|(_, b)| b).sum();
    assert_eq!(lines, tail.training_peak());
    assert_eq!(tail.peak(), tail.training_peak());
}

#[test]
fn reloading_merged_weights_sets_the_peak_when_activations_are_small() {
    // One token a micro-batch: the merge's upload of a second weights copy
    // outweighs a forward and backward.
    let c = ModelConfig::preset("1.5b").unwrap();
    let tail = &plan_memory(&c, 3, &cuda(1, 1, 1)).unwrap()[2];
    assert!(tail.reload_peak() > tail.training_peak());
    assert_eq!(tail.peak(), tail.reload_peak());
    assert_eq!(tail.reload_peak() - tail.between_micro_batches(), tail.weights);
}

#[test]
fn the_1_5b_tail_does_not_fit_16_gib_at_batch_4() {
    // The measurement: the tail needed 21.6 GB at batch 4 x 1024.
    let c = ModelConfig::preset("1.5b").unwrap();
    let plan = plan_memory(&c, 3, &cuda(4, 1024, 2)).unwrap();
    assert!(!plan[2].fits(16 * GIB));
    assert!(plan[2].fits(80 * GIB));
    // The 15b head at 3 stages does not fit even an 80 GiB card: its fp32
    // weights, gradients and moments alone (16 bytes a parameter) take more
    // than the 90% a plan may use.
    let c15 = ModelConfig::preset("15b").unwrap();
    let p15 = plan_memory(&c15, 3, &cuda(1, 1024, 2)).unwrap();
    assert!(p15[0].weights * 4 > 72 * GIB);
    assert!(!p15[0].fits(80 * GIB));
}

#[test]
fn host_memory_of_the_merge() {
    let h1 = host_memory(1_000_000, 1, WireCodec::Bf16);
    assert_eq!(h1.merge, 0, "one replica does not merge");
    let h2 = host_memory(1 << 20, 2, WireCodec::Bf16);
    // R = 2: four fp32 vectors, 2 B a value for own (P) + received (P)
    // contributions + results (P) + nothing else, momentum 2 x 4 B x P.
    let p = (1u64 << 20) as f64;
    assert_eq!(h2.merge as f64, 16.0 * p + 2.0 * 3.0 * p + 8.0 * p);
    assert!(host_memory(1 << 20, 8, WireCodec::Int8Row).merge < host_memory(1 << 20, 8, WireCodec::Bf16).merge);
    assert_eq!(h2.total(), h2.receive_pool + h2.evidence_log + h2.merge);
}

#[test]
fn backends_parse_by_name() {
    for b in [ComputeBackend::Cpu, ComputeBackend::CudaF32Gemm, ComputeBackend::CudaBf16Gemm] {
        assert_eq!(ComputeBackend::parse(b.name()), Some(b));
    }
    assert_eq!(ComputeBackend::parse("tpu"), None);
}

#[test]
fn fused_attention_saves_a_log_sum_exp_per_query_and_only_on_cuda() {
    let c = ModelConfig::preset("1.5b").unwrap();
    let spec = StageSpec::split(&c, 3).unwrap()[1].clone();
    let (kept, fused) =
        (stage_memory(&c, &spec, &cuda(4, 1024, 2)), stage_memory(&c, &spec, &cuda(4, 1024, 2).fusing(true)));
    let layers = spec.layers.len() as u64;
    assert_eq!(kept.attention_probs_per_micro_batch, 4 * layers * 4 * 32 * 1024 * 1024);
    assert_eq!(fused.attention_probs_per_micro_batch, 4 * layers * 4 * 32 * 1024);
    assert_eq!(
        kept.activations_per_micro_batch - fused.activations_per_micro_batch,
        kept.attention_probs_per_micro_batch - fused.attention_probs_per_micro_batch
    );
    assert!(fused.bf16_attention < kept.bf16_attention && fused.required_peak() < kept.required_peak());
    // The CPU has no fused kernels: asking for them changes nothing.
    let cpu = Workload { backend: ComputeBackend::Cpu, ..cuda(4, 1024, 2) };
    assert_eq!(stage_memory(&c, &spec, &cpu.fusing(true)), stage_memory(&c, &spec, &cpu));
    // Fused and recomputing, every 1.5b stage fits a 16 GiB card at batch 4
    // with 2 in flight (docs/BENCHMARKS.md, scale --plan-only).
    let both = plan_memory(&c, 3, &cuda(4, 1024, 2).fusing(true).recomputing(true)).unwrap();
    assert!(
        both.iter().all(|m| m.fits(16 << 30)),
        "{:?}",
        both.iter().map(|m| m.required_peak() >> 20).collect::<Vec<_>>()
    );
}

#[test]
fn muon_plans_the_scratch_of_its_largest_matrix_on_top_of_two_moments() {
    let cfg = ModelConfig::preset("1.5b").unwrap();
    let spec = StageSpec::split(&cfg, 3).unwrap().remove(1);
    let adam = stage_memory(&cfg, &spec, &Workload::of(ComputeBackend::CudaBf16Gemm, 4, 1024, 2));
    let muon_w = Workload { optimizer: InnerOptimizer::Muon, ..Workload::of(ComputeBackend::CudaBf16Gemm, 4, 1024, 2) };
    let muon = stage_memory(&cfg, &spec, &muon_w);
    // The MLP's [8192, 2048] matrices are the largest a body stage updates
    // with Muon: three copies and two 2048^2 Gram matrices, in fp32.
    let (f, d) = (cfg.ffn_hidden as u64, cfg.d_model as u64);
    assert_eq!(muon.optimizer_state - adam.optimizer_state, 4 * (3 * f * d + 2 * d * d));
    assert_eq!(InnerOptimizer::NAdam.step_scratch(&ParamLayout::for_stage(&cfg, &spec)), 0);
}
