"""The one-rank Pairformer ops against a plain transcription of the AlphaFold3 supplement's
algorithms (full N x N x N tensors, torch.softmax, no layouts or partials), the knobs' validation,
inference chunking and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from cpbench.models.pairformer import PairformerBlock, PairformerConfig, PairformerStack, PairLayout
from cpbench.models.pairformer.modules import (
    AttentionPairBias,
    Transition,
    TriangleAttention,
    TriangleMultiplication,
)

N, C_Z, C_S = 10, 8, 12
SMALL = dict(c_s=C_S, c_z=C_Z, n_blocks=1, tri_mul_hidden=6, tri_heads=2, tri_head_width=4, single_heads=3,
             transition_factor=2)  # fmt: skip


@pytest.fixture
def data():
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(N, C_S, generator=gen)
    z = torch.randn(N, N, C_Z, generator=gen)
    mask = torch.ones(N)
    mask[-3:] = 0
    return s, z, mask


def _ln(x, norm):
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _lin(x, linear):
    return x @ linear.weight.T + (0 if linear.bias is None else linear.bias)


# --- transcriptions of the supplement -------------------------------------------------------------------


def ref_triangle_multiplication(m: TriangleMultiplication, z, mask, outgoing: bool):
    """Algorithms 12 / 13, with a and b multiplied by the pair mask."""
    pair = (mask[:, None] * mask[None, :])[..., None]
    x = _ln(z, m.norm_in)
    a = pair * torch.sigmoid(_lin(x, m.a_gate)) * _lin(x, m.a_proj)
    b = pair * torch.sigmoid(_lin(x, m.b_gate)) * _lin(x, m.b_proj)
    g = torch.sigmoid(_lin(x, m.gate))
    t = torch.einsum("ikc,jkc->ijc", a, b) if outgoing else torch.einsum("kic,kjc->ijc", a, b)
    return g * _lin(_ln(t, m.norm_out), m.out)


def ref_triangle_attention(m: TriangleAttention, z, mask, starting: bool):
    """Algorithms 14 / 15: starting node a_ijk = softmax_k(q_ij.k_ik / sqrt(c) + b_jk), ending node
    a_ijk = softmax_k(q_ij.k_kj / sqrt(c) + b_ki); keys masked by the pair mask of (i,k) / (k,j)."""
    h, c = m.heads, m.width
    pair = mask[:, None] * mask[None, :]
    x = _ln(z, m.norm)
    q, k, v = (_lin(x, lin).reshape(N, N, h, c) for lin in (m.q, m.k, m.v))
    b = _lin(x, m.bias)  # [N, N, h]
    g = torch.sigmoid(_lin(x, m.gate)).reshape(N, N, h, c)
    if starting:
        logits = torch.einsum("ijhc,ikhc->ijkh", q, k) / math.sqrt(c) + b[None, :, :, :]
        logits = logits + 1e9 * (pair[:, None, :, None] - 1)
        o = torch.einsum("ijkh,ikhc->ijhc", torch.softmax(logits, dim=2), v)
    else:
        logits = torch.einsum("ijhc,kjhc->ijkh", q, k) / math.sqrt(c) + b.transpose(0, 1)[:, None, :, :]
        logits = logits + 1e9 * (pair.T[None, :, :, None] - 1)
        o = torch.einsum("ijkh,kjhc->ijhc", torch.softmax(logits, dim=2), v)
    return _lin((g * o).reshape(N, N, h * c), m.out)


def ref_transition(m: Transition, x):
    """Algorithm 11: x <- LayerNorm(x); LinearNoBias(swish(a) * b)."""
    x = _ln(x, m.norm)
    return _lin(F.silu(_lin(x, m.a)) * _lin(x, m.b), m.out)


def ref_attention_pair_bias(m: AttentionPairBias, s, z, mask):
    """Algorithm 24 without conditioning: q = Linear(a), k, v, g = LinearNoBias(a),
    b_ij = LinearNoBias(LayerNorm(z_ij)), softmax over j with padded tokens masked."""
    h, c = m.heads, m.width
    a = _ln(s, m.norm_s)
    q, k, v = _lin(a, m.q).reshape(N, h, c), _lin(a, m.k).reshape(N, h, c), _lin(a, m.v).reshape(N, h, c)
    b = _lin(_ln(z, m.norm_z), m.bias)  # [i, j, h]
    logits = torch.einsum("ihc,jhc->ijh", q, k) / math.sqrt(c) + b + 1e9 * (mask[None, :, None] - 1)
    o = torch.einsum("ijh,jhc->ihc", torch.softmax(logits, dim=1), v).reshape(N, h * c)
    return _lin(torch.sigmoid(_lin(a, m.gate)) * o, m.out)


def ref_block(blk: PairformerBlock, s, z, mask):
    """Algorithm 17's order: four triangle updates, pair transition, then the single track."""
    z = z + ref_triangle_multiplication(blk.tri_mul_out, z, mask, True)
    z = z + ref_triangle_multiplication(blk.tri_mul_in, z, mask, False)
    z = z + ref_triangle_attention(blk.tri_att_start, z, mask, True)
    z = z + ref_triangle_attention(blk.tri_att_end, z, mask, False)
    z = z + ref_transition(blk.pair_transition, z)
    s = s + ref_attention_pair_bias(blk.single_attention, s, z, mask)
    s = s + ref_transition(blk.single_transition, s)
    return s, z


# --- tests ----------------------------------------------------------------------------------------------


def test_ops_match_the_supplement(data):
    s, z, mask = data
    torch.manual_seed(0)
    blk = PairformerBlock(PairformerConfig(**SMALL))
    one = PairLayout()
    with torch.no_grad():
        for name, outgoing in (("tri_mul_out", True), ("tri_mul_in", False)):
            ref = ref_triangle_multiplication(getattr(blk, name), z, mask, outgoing)
            torch.testing.assert_close(getattr(blk, name)(z, mask, one), ref, msg=name)
        for name, starting in (("tri_att_start", True), ("tri_att_end", False)):
            ref = ref_triangle_attention(getattr(blk, name), z, mask, starting)
            torch.testing.assert_close(getattr(blk, name)(z, mask, one), ref, msg=name)
        torch.testing.assert_close(blk.pair_transition(z), ref_transition(blk.pair_transition, z))
        torch.testing.assert_close(blk.single_transition(s), ref_transition(blk.single_transition, s))
        torch.testing.assert_close(
            blk.single_attention(s, z, mask, one), ref_attention_pair_bias(blk.single_attention, s, z, mask)
        )
        got, ref = blk(s, z, mask, one), ref_block(blk, s, z, mask)
    torch.testing.assert_close(got, ref)


def test_incoming_and_ending_differ_from_outgoing_and_starting(data):
    """The two directions of each triangle op are different functions (a transposition slip would
    make them agree on a symmetric input only)."""
    _, z, mask = data
    torch.manual_seed(0)
    blk = PairformerBlock(PairformerConfig(**SMALL))
    blk.tri_mul_in.load_state_dict(blk.tri_mul_out.state_dict())
    blk.tri_att_end.load_state_dict(blk.tri_att_start.state_dict())
    with torch.no_grad():
        one = PairLayout()
        assert not torch.allclose(blk.tri_mul_in(z, mask, one), blk.tri_mul_out(z, mask, one))
        assert not torch.allclose(blk.tri_att_end(z, mask, one), blk.tri_att_start(z, mask, one))


def test_padded_tokens_change_no_valid_output(data):
    s, z, mask = data
    torch.manual_seed(0)
    stack = PairformerStack(PairformerConfig(**{**SMALL, "n_blocks": 2}))
    pad = mask == 0
    s2, z2 = s.clone(), z.clone()
    s2[pad], z2[pad], z2[:, pad] = 50.0, -30.0, 70.0
    with torch.no_grad():
        (a_s, a_z), (b_s, b_z) = (stack(x, y, mask, PairLayout()) for x, y in ((s, z), (s2, z2)))
    keep = mask == 1
    torch.testing.assert_close(b_s[keep], a_s[keep])
    torch.testing.assert_close(b_z[keep][:, keep], a_z[keep][:, keep])
    assert not torch.allclose(b_z[pad], a_z[pad])  # the perturbation did reach the padded outputs


def test_inference_chunking_equals_unchunked(data):
    s, z, mask = data
    torch.manual_seed(0)
    plain = PairformerStack(PairformerConfig(**SMALL))
    chunked = PairformerStack(PairformerConfig(**SMALL, chunk_size=3))
    chunked.load_state_dict(plain.state_dict())
    with torch.no_grad():  # the chunked form updates z in place: it gets a copy of its own
        torch.testing.assert_close(chunked(s, z.clone(), mask, PairLayout()), plain(s, z, mask, PairLayout()))


def test_checkpointing_gives_the_same_gradients(data):
    s, z, mask = data
    torch.manual_seed(0)
    plain = PairformerStack(PairformerConfig(**{**SMALL, "n_blocks": 2}))
    ckpt = PairformerStack(PairformerConfig(**{**SMALL, "n_blocks": 2}, checkpoint=True))
    ckpt.load_state_dict(plain.state_dict())
    grads = []
    for model in (plain, ckpt):
        zz = z.clone().requires_grad_()
        out_s, out_z = model(s, zz, mask, PairLayout())
        (out_s.square().mean() + out_z.square().mean()).backward()
        grads.append([zz.grad, *(p.grad for p in model.parameters())])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("compile", "fast", "compile='fast': allowed values are off, default, max-autotune"),
        ("dtype", "fp16", "dtype='fp16': allowed values are fp32, bf16"),
        ("chunk_size", 0, "chunk_size=0"),
        ("single_heads", 5, "single_heads=5: must divide c_s=12"),
        ("c_z", -1, "c_z=-1: must be a positive integer"),
        ("checkpoint", "yes", "checkpoint='yes'"),
        ("fullgraph", 1, "fullgraph=1"),
    ],
)
def test_bad_knobs_fail_by_name(key, value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        PairformerConfig(**{**SMALL, key: value})


def test_max_autotune_needs_inductor():
    with pytest.raises(ValueError, match="compile=max-autotune needs compile_backend=inductor"):
        PairformerConfig(**SMALL, compile="max-autotune", compile_backend="aot_eager")


def test_inductor_compile_matches_eager(data, tmp_path, monkeypatch):
    """The real default backend on the smallest op that has every compiled method kind. Inductor's
    cache goes under the test's folder and it precompiles no headers, which it would keep in
    /tmp/torchinductor_<user> (importing inductor's config still makes that folder, empty). Its C++
    kernels are scalar: with the probe of the machine's vector ISAs and vectorized kernels (g++ at -O3)
    the test took 12.8 s here, with scalar ones 4.9 s; what is checked, the op compiled whole by
    inductor and run against eager, is the same."""
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    if hasattr(torch._inductor.config, "cpp_cache_precompile_headers"):  # torch 2.6 precompiles none
        monkeypatch.setattr(torch._inductor.config, "cpp_cache_precompile_headers", False)
    monkeypatch.setattr(torch._inductor.config.cpp, "vec_isa_ok", False)
    s, _, _ = data
    torch.manual_seed(0)
    eager = Transition(C_S, 2)
    compiled = Transition(C_S, 2)
    compiled.load_state_dict(eager.state_dict())
    compiled._run = torch.compile(compiled._run, fullgraph=True)
    torch.testing.assert_close(compiled(s), eager(s))
