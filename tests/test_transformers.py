"""FP4 layers in a Hugging Face decoder on an H200: greedy generation with a static cache under
``torch.compile(mode="reduce-overhead")`` (CUDA-graph trees, as transformers' compiled generate
uses them) against the same FP4 model run eagerly, W4A16 and W4A4."""

from __future__ import annotations

import pytest
import torch

import fp4_ops

transformers = pytest.importorskip("transformers", reason="transformers is not installed")

needs_sm90 = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
    reason="needs an sm_90 GPU (H100 / H200)",
)


def _tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()


def _generate(model, ids, compile_config=None, path=None):
    """Greedy generate with a static cache: its tokens and step logits (twice when compiled,
    the second call replaying the first's graphs, which must give the same). ``path``: another
    generate's output, whose tokens this one is made to take (teacher forcing; the step logits
    are the model's own)."""
    kwargs = dict(max_new_tokens=12, do_sample=False, cache_implementation="static")
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    if path is not None:
        tokens = path.sequences.tolist()
        kwargs["prefix_allowed_tokens_fn"] = lambda row, prefix: [tokens[row][len(prefix)]]
    if compile_config is None:
        return model.generate(ids, disable_compile=True, **kwargs)
    torch._dynamo.reset()
    first = model.generate(ids, compile_config=compile_config, **kwargs)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > 0, "nothing was compiled"
    again = model.generate(ids, compile_config=compile_config, **kwargs)  # graph replays
    assert _same(again, first)
    return first


def _same(out, other) -> bool:
    same_logits = all(map(torch.equal, out.logits, other.logits))
    return torch.equal(out.sequences, other.sequences) and same_logits


def _logits(out) -> torch.Tensor:
    return torch.stack(out.logits, 1).float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.gpu
@pytest.mark.timeout(600, method="thread")
@needs_sm90
@pytest.mark.parametrize("activations", ["bf16", "dynamic"])
def test_compiled_static_cache_generate(activations):
    """transformers' own compiled generate (static cache, fullgraph, CUDA graphs) against the same
    FP4 model's eager generate. CUDA graphs alone (backend "cudagraphs") replay eager's kernels:
    its tokens and step logits exactly, W4A16 and W4A4. Inductor's reduce-overhead keeps fp32
    intermediates where eager rounds to BF16, so its greedy path may part from eager's at a near
    tie: along its own path, its step logits must be the eager model's (made to generate the
    same tokens) within a few BF16 roundings (2^-6 of their norm), W4A16; W4A4 re-quantizes
    activations that those roundings move across FP4 boundaries, so there they must stay closer
    to the eager FP4 model's than those are to the BF16 model's."""
    model = _tiny_llama()
    reference = _tiny_llama()
    report = fp4_ops.quantize_model(model, include=["model.layers.*"], activations=activations)
    assert len(report.replaced) == 2 * 7 and not report.unmatched
    gen = torch.Generator("cuda").manual_seed(1)
    ids = torch.randint(0, 512, (2, 8), device="cuda", generator=gen)
    eager = _generate(model, ids)
    graphs_only = transformers.CompileConfig(fullgraph=True, backend="cudagraphs", mode=None)
    assert _same(_generate(model, ids, graphs_only), eager)
    inductor = transformers.CompileConfig(fullgraph=True, mode="reduce-overhead")
    compiled = _generate(model, ids, inductor)
    got = _logits(compiled)
    forced = _generate(model, ids, path=compiled)
    assert torch.equal(forced.sequences, compiled.sequences)
    want = _logits(forced)
    fp4_error = _rel(want, _logits(_generate(reference, ids, path=compiled)))
    tol = 2.0**-6 if activations == "bf16" else fp4_error
    print(f"{activations}: |compiled - eager| / |eager| = {_rel(got, want):.5f} ({tol:.5f})")
    assert _rel(got, want) <= tol
    with torch.no_grad():
        logits = model(ids).logits.float()
        fused = torch.compile(model.forward, fullgraph=True)(ids).logits.float()
        bf16 = reference(ids).logits.float()
    assert (fused - logits).abs().max() < (logits - bf16).abs().max()
