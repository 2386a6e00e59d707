"""The C kernels (adaflash.models.native): the product of a few rows and the RMS norm equal torch's, each row
computed alike alone or among others, chosen by `Joined` and `rms_norm` at inference, and left aside where a
gradient must flow (the switch and the build, in a fresh interpreter: tests/integration/test_native_subprocess.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from adaflash.decoding.sampling import History, SamplingParams
from adaflash.decoding.steps import step_batch
from adaflash.models import native, target as target_module
from adaflash.models.cache import Paging
from adaflash.models.layers import Layout, RopeConfig, apply_rope, rms_norm, rope_cos_sin
from adaflash.models.target import TargetConfig, Transformer
from helpers import joined_product_in

needs_native = pytest.mark.skipif(not native.available(), reason="no AVX2/FMA x86-64 CPU or no C compiler here")


def _product(x: torch.Tensor, w: torch.Tensor, wide: bool | None = None) -> torch.Tensor:
    return native.product(x, native.panels(w), w.shape[0], wide)


@needs_native
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16, 70])
@pytest.mark.parametrize(("out", "inner"), [(1, 8), (3, 20), (48, 37), (513, 384), (64, 1152)])
def test_the_native_product_equals_torch(rows, out, inner):
    torch.manual_seed(rows * out + inner)
    x, w = torch.randn(rows, inner), torch.randn(out, inner)
    assert torch.allclose(_product(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


@needs_native
@pytest.mark.parametrize(("out", "inner"), [(513, 384), (48, 37), (7, 70), (384, 1152)])
def test_a_row_is_summed_alike_alone_or_among_others_at_either_width(out, inner):
    """Bitwise: tiles of one to six rows and of one or four panels, 16 lanes wide or 8, all sum in one order."""
    torch.manual_seed(out)
    x, w = torch.randn(70, inner), torch.randn(out, inner)
    alone = torch.cat([_product(x[i:i + 1].contiguous(), w, wide=False) for i in range(70)])
    for rows in (2, 3, 5, 6, 7, 16, 70):
        assert torch.equal(_product(x[:rows].contiguous(), w, wide=False), alone[:rows])
        if native.WIDE:
            assert torch.equal(_product(x[:rows].contiguous(), w, wide=True), alone[:rows])


@needs_native
def test_the_native_product_runs_on_any_thread_count():
    torch.manual_seed(3)
    x, w, threads = torch.randn(9, 64), torch.randn(100, 64), torch.get_num_threads()
    expected = _product(x, w)
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            assert torch.equal(_product(x, w), expected)
    finally:
        torch.set_num_threads(threads)


@needs_native
@pytest.mark.parametrize("rows", [1, 16, 300, 3000])
def test_joined_multiplies_every_row_count_natively(rows):
    """Decode, verify and prefill rows alike: the C product is as fast as oneDNN's from one row to thousands."""
    holder, lin, joined, _ = joined_product_in(Layout.NATIVE, rows)
    with torch.inference_mode():
        strided = torch.randn(rows, 256)[:, :128]  # rows 256 apart: made contiguous before the call
        assert torch.allclose(joined.linear(holder, strided, lin.bias), lin(strided), atol=1e-5)
    assert set(joined._copies) == {Layout.NATIVE}  # one copy, in panels


def _reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Hugging Face's Qwen3RMSNorm in fp32."""
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@needs_native
@pytest.mark.parametrize("dim", [64, 384, 37])
@pytest.mark.parametrize("tokens", [1, 5, 300])
def test_the_native_norm_equals_torch(tokens, dim):
    torch.manual_seed(tokens + dim)
    x, weight = torch.randn(tokens, dim) * 3, torch.randn(dim)
    with torch.inference_mode():
        assert native.can_norm(x, weight)
        assert torch.allclose(rms_norm(x, weight, 1e-6), _reference_norm(x, weight, 1e-6), rtol=1e-5, atol=1e-5)
        # q and k heads as a slice of the joined q/k/v product, one weight row per head
        qkv = torch.randn(tokens, 6 + 2 + 2, dim)
        qk, per_head = qkv[:, :8], torch.randn(8, dim)
        assert native.can_norm(qk, per_head) and (tokens == 1 or not qk.is_contiguous())
        assert torch.allclose(rms_norm(qk, per_head, 1e-6), _reference_norm(qk, per_head, 1e-6), rtol=1e-5, atol=1e-5)


@needs_native
def test_a_row_is_normed_alike_alone_or_among_others():
    torch.manual_seed(5)
    qk, weight = torch.randn(16, 10, 64)[:, :8], torch.randn(8, 64)
    with torch.inference_mode():
        batch = rms_norm(qk, weight, 1e-6)
        assert all(torch.equal(rms_norm(qk[i:i + 1], weight, 1e-6), batch[i:i + 1]) for i in range(16))


@needs_native
@pytest.mark.parametrize("tokens", [1, 5])
def test_norm_and_rope_in_one_call_equal_them_apart(tokens):
    """Bitwise: the fused call rounds as the native norm followed by torch's rotary embedding."""
    torch.manual_seed(tokens)
    qk, weight = torch.randn(tokens, 10, 64)[:, :8], torch.randn(8, 64)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 64, 2).float() / 64))
    cos, sin = rope_cos_sin(inv_freq, torch.arange(40, 40 + tokens))
    with torch.inference_mode():
        assert native.can_norm_rope(qk, weight, cos, sin)
        assert torch.equal(native.norm_rope(qk, weight, cos, sin, 1e-6), apply_rope(rms_norm(qk, weight, 1e-6), cos, sin))


def test_a_norm_that_carries_gradients_stays_in_torch():
    x, weight = torch.randn(3, 64, requires_grad=True), torch.ones(64, requires_grad=True)
    assert not native.can_norm(x, weight)
    rms_norm(x, weight, 1e-6).sum().backward()
    assert x.grad is not None and weight.grad is not None


@pytest.fixture(scope="module")
def target() -> Transformer:
    """Random, with every weight large enough for the native product (256 KiB and more)."""
    torch.manual_seed(0)
    cfg = TargetConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope=RopeConfig(64, 10000.0))
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.05) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model


def _prefilled(target: Transformer, prompts: list[list[int]], paging: Paging | None = None):
    cache = target.new_cache(len(prompts), 256, paging)
    with torch.inference_mode():
        target.forward(cache, list(range(len(prompts))), prompts)
    return cache


def _prompts(lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(sum(lengths))
    return [torch.randint(0, 1024, (n,), generator=g).tolist() for n in lengths]


@needs_native
@pytest.mark.parametrize("paging", [None, Paging(page=16, pages=64)])
def test_native_attention_equals_torch(target, paging, monkeypatch):
    """Prefills, decode and verify steps of sequences of different lengths, unpaged and paged: the logits of torch's
    path."""
    prompts, steps = _prompts([37, 5, 90]), _prompts([1, 4, 2])
    logits = {}
    for in_c in (True, False):
        if not in_c:
            monkeypatch.setattr(native, "attends_over", lambda store: False)
        with torch.inference_mode():
            cache = target.new_cache(len(prompts), 256, paging)
            prefilled = target.forward(cache, list(range(len(prompts))), prompts).logits
            alone = target.forward(cache, [1], [steps[0]]).logits
            batch = target.forward(cache, [0, 1, 2], steps).logits
        logits[in_c] = torch.cat([prefilled, alone, batch])
    assert torch.allclose(logits[True], logits[False], atol=1e-4, rtol=1e-4)


def _attention_case(heads: int, kv_heads: int, dim: int, starts: list[int], counts: list[int], page: int):
    """Random caches ([pages, kv_heads, page, dim], each sequence's pages shuffled) and new tokens' q, k, v."""
    g = torch.Generator().manual_seed(heads * 1000 + dim)
    per_seq = -(-(max(starts) + max(counts)) // page)
    order = torch.randperm(len(starts) * per_seq, generator=g).tolist()
    tables = [order[b * per_seq:(b + 1) * per_seq] for b in range(len(starts))]
    caches = [torch.randn(len(order), kv_heads, page, dim, generator=g) for _ in range(2)]
    tokens = sum(counts)
    q, k, v = (torch.randn(tokens, n, dim, generator=g) for n in (heads, kv_heads, kv_heads))
    return tables, caches, q, k, v


def _attention_in_torch(tables, caches, q, k, v, starts, counts, causal):
    """Each new token's attention over its sequence's cached positions and the new ones up to it (`causal`), or all
    of them."""
    out, row = [], 0
    for table, start, count in zip(tables, starts, counts):
        keys, values = (c[table].transpose(0, 1).reshape(c.shape[1], -1, c.shape[3])[:, :start] for c in caches)
        keys = torch.cat([keys, k[row:row + count].transpose(0, 1)], dim=1)
        values = torch.cat([values, v[row:row + count].transpose(0, 1)], dim=1)
        group = q.shape[1] // keys.shape[0]
        keys, values = keys.repeat_interleave(group, 0), values.repeat_interleave(group, 0)
        mask = torch.ones(count, start + count, dtype=torch.bool)
        mask = mask.tril(start) if causal else mask
        out.append(F.scaled_dot_product_attention(q[row:row + count].transpose(0, 1), keys, values, attn_mask=mask,
                                                  scale=q.shape[2] ** -0.5).transpose(0, 1))
        row += count
    return torch.cat(out)


@needs_native
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(6, 2, 64), (4, 4, 24), (8, 2, 128), (5, 1, 40)])
@pytest.mark.parametrize(("page", "causal"), [(16, True), (12, True), (12, False)])
def test_native_attention_is_torchs_and_the_same_at_either_width(heads, kv_heads, dim, page, causal, monkeypatch):
    """`native.attend` on decodes, verifies and a prefill longer than a task's tokens, paged: torch's attention, and
    bit for bit the same with AVX-512's blocks of queries and eight keys at a time as without (query heads per kv
    head from 1 to 5, so that blocks span tokens; head sizes with and without a rest under 16 and under 64; pages
    that eight keys do and do not cross); causal, and over every new position (a drafter's block)."""
    starts, counts = [300, 17, 0, 90], [1, 5, 40, 16]
    tables, caches, q, k, v = _attention_case(heads, kv_heads, dim, starts, counts, page)
    batch = native.attention_batch(tables, starts, counts)
    expected = _attention_in_torch(tables, caches, q, k, v, starts, counts, causal)
    results = []
    for wide in sorted({False, native.WIDE}):
        monkeypatch.setattr(native, "WIDE", wide)
        k_cache, v_cache = (c.clone() for c in caches)
        results.append(native.attend(q, k, v, k_cache, v_cache, batch, dim**-0.5, causal))
    assert torch.allclose(results[0], expected, atol=1e-5, rtol=1e-4)
    assert all(torch.equal(r, results[0]) for r in results)


@needs_native
def test_a_prompt_is_prefilled_alike_alone_or_beside_verifies(target):
    """Bitwise, in the native kernels: a prompt's logits, features and cache entries whether it is prefilled alone
    or in one forward with other sequences' verify feeds, and those verifies' logits the same as verified alone:
    what lets `steps.step_batch` join an admission to a step without changing a token."""
    prompt, others, feeds = _prompts([70])[0], _prompts([30, 12]), _prompts([5, 1])
    with torch.inference_mode():
        apart = target.new_cache(3, 256)
        target.forward(apart, [1, 2], others)
        alone = target.forward(apart, [0], [prompt], capture_layers=[0, 1])
        verified = target.forward(apart, [1, 2], feeds).logits
        joined = target.new_cache(3, 256)
        target.forward(joined, [1, 2], others)
        both = target.forward(joined, [0, 1, 2], [prompt, *feeds], capture_layers=[0, 1])
    assert target.batch_invariant(joined)
    assert torch.equal(both.logits[: len(prompt)], alone.logits)
    assert torch.equal(both.hidden[: len(prompt)], alone.hidden)
    assert torch.equal(both.logits[len(prompt):], verified)
    assert torch.equal(joined.k, apart.k) and torch.equal(joined.v, apart.v)


@needs_native
def test_a_layer_in_one_call_equals_the_layer_in_python(target, monkeypatch):
    """`native.decode_layers` against `DecoderLayer` (whose pieces are the same kernels, silu aside): logits and the
    captured hidden states a drafter reads."""
    prompts, steps = _prompts([30, 12]), _prompts([3, 1])
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(Transformer, "_fused_layers", lambda self, fb: None)
        cache = _prefilled(target, prompts)
        with torch.inference_mode():
            results.append(target.forward(cache, [0, 1], steps, capture_layers=[1, 0]))
    assert torch.allclose(results[0].logits, results[1].logits, atol=1e-4, rtol=1e-4)
    assert torch.allclose(results[0].hidden, results[1].hidden, atol=1e-4, rtol=1e-4)


@needs_native
def test_a_verify_gives_the_logits_of_decoding_bitwise(target, monkeypatch):
    """With the native kernels a decode or verify forward, each sequence adding at most a block, is batch-invariant:
    verifying a block (alone, or beside others, up to hundreds of tokens in the call) gives, bit for bit, the logits
    of decoding its tokens one at a time, so greedy speculative decoding commits exactly what plain decoding would."""
    block = target_module.STEP_MAX_NEW
    prompts = _prompts([60, 23, 31, 45] * 5)
    fused_calls = []
    decode_layers = native.decode_layers
    monkeypatch.setattr(native, "decode_layers", lambda x, *a: fused_calls.append(x.shape[0]) or decode_layers(x, *a))
    for blocks in (_prompts([block]), _prompts([block, 5, 11]), _prompts([block] * 20)):
        one_by_one = _prefilled(target, prompts[:1])
        with torch.inference_mode():
            decoded = torch.cat([target.forward(one_by_one, [0], [[t]]).logits for t in blocks[0]])
            verified = target.forward(_prefilled(target, prompts[:len(blocks)]), list(range(len(blocks))), blocks)
        assert fused_calls[-1] == sum(map(len, blocks))  # the verify ran the fused layers
        assert torch.equal(verified.logits[:len(blocks[0])], decoded)


@needs_native
def test_layers_changed_in_place_are_gathered_again(monkeypatch):
    """The fused layers' weights are gathered once, then again when one changes: a forward after an in-place update
    of a joined part (q's projection) equals the Python layers on the updated weights."""
    torch.manual_seed(1)
    cfg = TargetConfig(vocab_size=1024, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope=RopeConfig(64, 10000.0))
    model = Transformer(cfg).eval()
    prompts, steps = _prompts([20, 9]), _prompts([2, 1])
    with torch.inference_mode():
        model.forward(_prefilled(model, prompts), [0, 1], steps)  # gathers the layers
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.mul_(-1.5)
    with torch.inference_mode():
        fused = model.forward(_prefilled(model, prompts), [0, 1], steps).logits
        monkeypatch.setattr(Transformer, "_fused_layers", lambda self, fb: None)
        python = model.forward(_prefilled(model, prompts), [0, 1], steps).logits
    assert torch.allclose(fused, python, atol=1e-4, rtol=1e-4)


@needs_native
def test_an_admitting_step_is_one_forward_with_the_results_of_two(target, monkeypatch):
    """`steps.step_batch` prefilling one sequence while verifying two (greedy with a logits processor, and sampled
    with log-probabilities) runs one target forward, and every result (tokens, acceptance, features, log-probs)
    and the caches' lengths equal those of the prefill and the verify as two forwards."""
    prompts, drafts = _prompts([40, 25]), _prompts([4, 2])
    admitted = _prompts([33])
    feeds = [admitted[0], *([p[-1], *d] for p, d in zip(prompts, drafts))]
    sampling = [SamplingParams(), SamplingParams(repetition_penalty=1.3),
                SamplingParams(temperature=0.8, seed=7, log_probs=True)]
    histories = [None, History(prompts[0], len(prompts[0])), History(prompts[1], len(prompts[1]))]
    calls = []
    forward = Transformer.forward
    monkeypatch.setattr(Transformer, "forward", lambda self, *a, **k: calls.append(1) or forward(self, *a, **k))
    results, lengths = {}, {}
    for joined in (True, False):
        if not joined:
            monkeypatch.setattr(Transformer, "batch_invariant", lambda self, cache: False)
        cache = target.new_cache(3, 256)
        with torch.inference_mode():
            target.forward(cache, [1, 2], [p[:-1] for p in prompts])
            calls.clear()
            results[joined], _ = step_batch(target, cache, 1, [0, 1, 2], feeds, sampling,
                                            [torch.Generator().manual_seed(s.seed) for s in sampling], [0, 1],
                                            histories=histories)
        assert len(calls) == (1 if joined else 2)
        lengths[joined] = cache.lengths[:3]
    assert lengths[True] == lengths[False]
    for one, two in zip(results[True], results[False]):
        assert (one.committed, one.accepted, one.expected_accepted, one.log_probs) == \
            (two.committed, two.accepted, two.expected_accepted, two.log_probs)
        assert torch.equal(one.features, two.features)
