"""DFlash drafter: published checkpoints load unchanged, configs round-trip, the cached path equals recomputation."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adaflash.models import native
from adaflash.models.bundle import tiny_random_bundle
from adaflash.models.cache import Paging
from adaflash.models.checkpoint import EXTENSION
from adaflash.models.drafter import DFlashDrafter, DrafterConfig, default_target_layer_ids
from adaflash.models.layers import RopeConfig
from adaflash.models.target import Transformer
from adaflash.training.dflash import target_features

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "reference"  # published config.json files (README there)
TOL = 1e-5

# A published-style config.json scaled down (same keys as the z-lab / AdaFlash files).
H, LAYERS, HEADS, KV, HD, INTER, HEAD_DIM_LEN = 64, 2, 4, 2, 16, 96, 24
TARGET_IDS = [0, 2, 3]


def tiny_published_config(length_head: bool) -> dict:
    dflash = {"mask_token_id": 250, "target_layer_ids": TARGET_IDS}
    if length_head:
        dflash.update(use_thresh_head_two_model=True, thresh_head_bottleneck_dim=HEAD_DIM_LEN, thresh_head_direct_len=True)
    return {
        "architectures": ["DFlashDraftModel"], "attention_bias": False, "attention_dropout": 0.0,
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, "block_size": 8, "bos_token_id": 1,
        "dflash_config": dflash, "dtype": "bfloat16", "eos_token_id": 2, "head_dim": HD, "hidden_act": "silu",
        "hidden_size": H, "initializer_range": 0.02, "intermediate_size": INTER,
        "layer_types": ["full_attention"] * LAYERS, "max_position_embeddings": 4096, "max_window_layers": LAYERS,
        "model_type": "qwen3", "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "num_key_value_heads": KV,
        "num_target_layers": 4, "rms_norm_eps": 1e-6, "rope_scaling": None, "rope_theta": 1000000,
        "sliding_window": None, "tie_word_embeddings": False, "use_cache": True, "use_sliding_window": False,
        "vocab_size": 259,
    }


def published_state_dict(length_head: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Tensors named and shaped as in checkpoint-format.md, written by hand (not from the module)."""
    g = torch.Generator().manual_seed(seed)

    def t(*shape):
        return torch.randn(*shape, generator=g)

    sd = {"fc.weight": t(H, len(TARGET_IDS) * H), "hidden_norm.weight": t(H), "norm.weight": t(H)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        sd[p + "self_attn.q_proj.weight"] = t(HEADS * HD, H)
        sd[p + "self_attn.k_proj.weight"] = t(KV * HD, H)
        sd[p + "self_attn.v_proj.weight"] = t(KV * HD, H)
        sd[p + "self_attn.o_proj.weight"] = t(H, HEADS * HD)
        sd[p + "self_attn.q_norm.weight"] = t(HD)
        sd[p + "self_attn.k_norm.weight"] = t(HD)
        sd[p + "mlp.gate_proj.weight"] = t(INTER, H)
        sd[p + "mlp.up_proj.weight"] = t(INTER, H)
        sd[p + "mlp.down_proj.weight"] = t(H, INTER)
        sd[p + "input_layernorm.weight"] = t(H)
        sd[p + "post_attention_layernorm.weight"] = t(H)
    if length_head:
        sd["thresh_head_two_model.down.weight"] = t(HEAD_DIM_LEN, 2 * H)
        sd["thresh_head_two_model.down.bias"] = t(HEAD_DIM_LEN)
        sd["thresh_head_two_model.res.0.weight"] = t(HEAD_DIM_LEN, HEAD_DIM_LEN)
        sd["thresh_head_two_model.res.0.bias"] = t(HEAD_DIM_LEN)
        sd["thresh_head_two_model.out.weight"] = t(1, HEAD_DIM_LEN)
        sd["thresh_head_two_model.out.bias"] = t(1)
    return sd


def write_checkpoint(path: Path, cfg: dict, state: dict[str, torch.Tensor], dtype=torch.float32) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.to(dtype).contiguous() for k, v in state.items()}, str(path / "model.safetensors"))


# ---- checkpoint format ----------------------------------------------------------------------

@pytest.mark.parametrize("length_head", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_published_checkpoint_loads(tmp_path, length_head, dtype):
    state = published_state_dict(length_head)
    write_checkpoint(tmp_path, tiny_published_config(length_head), state, dtype)
    model = DFlashDrafter.from_pretrained(tmp_path)  # raises on missing / unexpected keys

    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (
        H, LAYERS, HEADS, KV, HD)
    assert cfg.block_size == 8 and cfg.num_target_layers == 4
    assert cfg.target_layer_ids == TARGET_IDS and cfg.mask_token_id == 250
    assert cfg.length_head is length_head
    assert (model.length_head is not None) is length_head
    if length_head:
        assert cfg.length_head_dim == HEAD_DIM_LEN

    loaded = model.state_dict()
    assert set(loaded) == set(state)
    for name, value in state.items():
        assert loaded[name].dtype == torch.float32
        assert torch.equal(loaded[name], value.to(dtype).float()), name


@pytest.mark.parametrize("change", ["missing", "extra"])
def test_checkpoint_key_mismatch_names_the_key(tmp_path, change):
    state = published_state_dict(length_head=True)
    if change == "missing":
        key = "layers.1.mlp.up_proj.weight"
        del state[key]
    else:
        key = "layers.0.self_attn.rotary_emb.extra_weight"
        state[key] = torch.zeros(3)
    write_checkpoint(tmp_path, tiny_published_config(length_head=True), state)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        DFlashDrafter.from_pretrained(tmp_path)


def test_length_head_weights_without_config_flag_are_rejected(tmp_path):
    """A DFlash config (no use_thresh_head_two_model) with AdaFlash head tensors: unexpected keys."""
    write_checkpoint(tmp_path, tiny_published_config(length_head=False), published_state_dict(length_head=True))
    with pytest.raises(ValueError, match=r"thresh_head_two_model\.down\.weight"):
        DFlashDrafter.from_pretrained(tmp_path)


def test_save_load_round_trip(tmp_path):
    drafter = tiny_random_bundle(seed=3, length_head=True, block_size=8).drafter
    drafter.config.hf["my_extra_key"] = {"nested": [1, 2, 3]}
    drafter.config.hf.setdefault("dflash_config", {})["thresh_head_direct_len"] = True
    drafter.save_pretrained(tmp_path, dtype=torch.float32)

    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == ["DFlashDraftModel"] and written["model_type"] == "qwen3"
    assert written["dflash_config"]["use_thresh_head_two_model"] is True
    assert written["dflash_config"]["thresh_head_bottleneck_dim"] == drafter.config.length_head_dim
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(drafter.state_dict())

    loaded = DFlashDrafter.from_pretrained(tmp_path)
    a, b = drafter.config, loaded.config
    for f in dataclasses.fields(DrafterConfig):
        if f.name != "hf":
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert b.length_head and b.length_head_dim == 32
    assert b.hf["my_extra_key"] == {"nested": [1, 2, 3]}
    assert b.hf["dflash_config"]["thresh_head_direct_len"] is True
    ours, theirs = drafter.state_dict(), loaded.state_dict()
    assert set(ours) == set(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def test_round_trip_without_length_head_drops_head_keys(tmp_path):
    drafter = tiny_random_bundle(seed=4, length_head=False).drafter
    drafter.config.hf["dflash_config"] = {"use_thresh_head_two_model": True, "thresh_head_bottleneck_dim": 7}
    drafter.save_pretrained(tmp_path, dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(tmp_path)  # would miss head tensors if the stale flag were kept
    assert not loaded.config.length_head and loaded.length_head is None


def test_round_trip_of_a_config_built_in_code(tmp_path):
    """A DrafterConfig built field by field (hf holds only an unrelated key) saves a config.json that
    loads back to the same fields: save_pretrained must write every field it reads back."""
    cfg = DrafterConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, rope=RopeConfig(head_dim=16, theta=5000.0), rms_norm_eps=1e-5, block_size=4,
        num_target_layers=3, target_layer_ids=[1], mask_token_id=9, length_head=False, length_head_dim=256,
        hf={"note": "built in code"},
    )
    DFlashDrafter(cfg).save_pretrained(tmp_path, dtype=torch.float32)
    loaded = DFlashDrafter.from_pretrained(tmp_path).config
    for f in dataclasses.fields(DrafterConfig):
        if f.name != "hf":
            assert getattr(loaded, f.name) == getattr(cfg, f.name), f.name


@pytest.mark.parametrize("name", ["adaflash-qwen3-8b-thresh-head", "dflash-qwen3-0.6b", "dflash-qwen3-8b-b16"])
def test_published_configs_parse(name):
    raw = json.loads((CONFIGS / f"{name}.json").read_text())
    cfg = DrafterConfig.from_hf(raw)
    assert cfg.block_size == 16
    assert cfg.num_hidden_layers == 5 and cfg.head_dim == 128
    assert cfg.mask_token_id == 151669
    assert cfg.rope.theta == 1000000.0
    expected_ids = {"adaflash-qwen3-8b-thresh-head": [1, 9, 17, 25, 33], "dflash-qwen3-0.6b": [1, 7, 13, 19, 25],
                    "dflash-qwen3-8b-b16": [1, 9, 17, 25, 33]}[name]
    assert cfg.target_layer_ids == expected_ids
    assert cfg.length_head is (name.startswith("adaflash"))
    if cfg.length_head:
        assert cfg.length_head_dim == 256
    # The published ids are the published default spread for that depth.
    assert default_target_layer_ids(cfg.num_target_layers, cfg.num_hidden_layers) == expected_ids
    # Writing the config back keeps it as published.
    assert cfg.to_hf() == raw


def test_default_target_layer_ids():
    raw = json.loads((CONFIGS / "dflash-qwen3-8b-b16.json").read_text())
    del raw["dflash_config"]["target_layer_ids"]
    assert DrafterConfig.from_hf(raw).target_layer_ids == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layer_ids(28, 5) == [1, 7, 13, 19, 25]
    assert default_target_layer_ids(36, 1) == [18]  # the middle layer
    ids = default_target_layer_ids(40, 3)
    assert ids[0] == 1 and ids[-1] == 37 and ids == sorted(set(ids))


def test_missing_mask_token_id_is_an_error():
    raw = json.loads((CONFIGS / "dflash-qwen3-8b-b16.json").read_text())
    del raw["dflash_config"]["mask_token_id"]
    with pytest.raises(ValueError, match="mask_token_id"):
        DrafterConfig.from_hf(raw)


# ---- cached drafting equals recomputation ----------------------------------------------------

def _cached_vs_uncached(length_head: bool):
    bundle = tiny_random_bundle(seed=5, length_head=length_head)
    target, drafter = bundle.target, bundle.drafter
    ids = drafter.config.target_layer_ids
    g = torch.Generator().manual_seed(11)
    seqs = {3: torch.randint(0, 256, (40,), generator=g).tolist(), 1: torch.randint(0, 256, (25,), generator=g).tolist()}
    feats = {s: target_features(target, toks, ids) for s, toks in seqs.items()}
    chunks = {3: [12, 1, 17], 1: [0, 10, 7]}  # uneven, ragged, one empty; contexts of 30 and 17 positions
    cache = drafter.new_cache(num_slots=5, max_len=64)
    done = {s: 0 for s in seqs}
    for c in range(3):
        parts, counts = [], []
        for s in seqs:
            n = chunks[s][c]
            parts.append(feats[s][done[s] : done[s] + n])
            counts.append(n)
            done[s] += n
        drafter.append_context(cache, list(seqs), torch.cat(parts), counts)
    assert cache.lengths[3] == 30 and cache.lengths[1] == 17
    return target, drafter, cache, seqs, feats, done


def _compare(target, drafter, cache, seqs, feats, ctx):
    slots = list(seqs)
    anchors = [seqs[s][ctx[s]] for s in slots]
    cached = drafter.draft(target, cache, slots, anchors)
    assert cached.tokens.shape == (len(slots), drafter.config.block_size - 1)
    for i, s in enumerate(slots):
        ref = drafter.draft_uncached(target, feats[s][: ctx[s]], anchors[i])
        assert (cached.hidden[i] - ref.hidden[0]).abs().max().item() <= TOL
        assert torch.equal(cached.tokens[i], ref.tokens[0])
    return cached


def test_cached_draft_equals_recomputation():
    target, drafter, cache, seqs, feats, ctx = _cached_vs_uncached(length_head=False)
    cached = _compare(target, drafter, cache, seqs, feats, ctx)
    assert cached.accept_ratio is None
    # The drafts depend on the context: another slot's context gives other hidden states.
    other = drafter.draft_uncached(target, feats[1][: ctx[1]], seqs[3][ctx[3]])
    assert (other.hidden[0] - cached.hidden[0]).abs().max().item() > 1e-3
    # Truncating a slot (rejected tokens) and appending again equals recomputation on the new context.
    cache.truncate(3, 22)
    new = torch.tensor([7, 8, 9, 10])
    seqs[3] = seqs[3][:22] + new.tolist() + seqs[3][26:]
    feats[3] = target_features(target, seqs[3], drafter.config.target_layer_ids)
    drafter.append_context(cache, [3], feats[3][22:26], [4])
    ctx[3] = 26
    _compare(target, drafter, cache, seqs, feats, ctx)


def test_cached_draft_equals_recomputation_with_length_head():
    target, drafter, cache, seqs, feats, ctx = _cached_vs_uncached(length_head=True)
    cached = _compare(target, drafter, cache, seqs, feats, ctx)
    assert cached.accept_ratio is not None and cached.accept_ratio.shape == (2,)
    for i, s in enumerate(seqs):
        ref = drafter.draft_uncached(target, feats[s][: ctx[s]], seqs[s][ctx[s]])
        r = cached.accept_ratio[i].item()
        assert abs(r - ref.accept_ratio[0].item()) <= TOL
        assert 0.0 < r < 1.0


def _contexts_in(cache, target, drafter, lengths: list[int]):
    """Random sequences of `lengths` + 1 tokens, all but their anchors appended to `cache`; their features and
    anchors."""
    g = torch.Generator().manual_seed(sum(lengths))
    seqs = [torch.randint(0, 256, (n + 1,), generator=g).tolist() for n in lengths]
    feats = [target_features(target, toks, drafter.config.target_layer_ids) for toks in seqs]
    for slot, (f, n) in enumerate(zip(feats, lengths)):
        drafter.append_context(cache, [slot], f[:n], [n])
    return feats, [toks[-1] for toks in seqs]


@pytest.mark.skipif(not native.available(), reason="no AVX2/FMA x86-64 CPU or no C compiler here")
def test_a_draft_in_a_paged_cache_gives_back_the_pages_its_block_took():
    """On the native kernels a draft writes its blocks past the contexts in the drafter's own cache: the pages that
    took go back after, the contexts stay as they were (a second draft, and recomputation, agree)."""
    bundle = tiny_random_bundle(seed=5)
    target, drafter = bundle.target, bundle.drafter
    cache = drafter.new_cache(num_slots=2, max_len=64, paging=Paging(page=4, pages=40))
    feats, anchors = _contexts_in(cache, target, drafter, [13, 30])
    free, tables = len(cache.free), [list(t) for t in cache.tables]
    assert drafter._drafts_in_cache(cache, [0, 1], drafter.config.block_size)
    first = drafter.draft(target, cache, [0, 1], anchors)
    assert len(cache.free) == free and cache.tables == tables and cache.lengths[:2] == [13, 30]
    again = drafter.draft(target, cache, [0, 1], anchors)
    assert torch.equal(first.tokens, again.tokens) and torch.equal(first.hidden, again.hidden)
    for i, (f, n) in enumerate(zip(feats, [13, 30])):
        ref = drafter.draft_uncached(target, f[:n], anchors[i])
        assert (first.hidden[i] - ref.hidden[0]).abs().max().item() <= TOL
        assert torch.equal(first.tokens[i], ref.tokens[0])


@pytest.mark.parametrize("room", ["cache length", "pages"])
def test_a_block_without_room_in_the_cache_drafts_from_the_gathered_context(room):
    """Where a block would pass the cache's length or need pages none has free, the draft reads the gathered
    context instead, and is still the draft recomputation gives."""
    bundle = tiny_random_bundle(seed=5)
    target, drafter = bundle.target, bundle.drafter
    if room == "cache length":  # 24 positions and a block of 16 in 32
        cache, length = drafter.new_cache(num_slots=1, max_len=32), 24
    else:  # 30 positions fill the 8 pages of 4
        cache, length = drafter.new_cache(num_slots=1, max_len=64, paging=Paging(page=4, pages=8)), 30
    feats, anchors = _contexts_in(cache, target, drafter, [length])
    assert not drafter._drafts_in_cache(cache, [0], drafter.config.block_size)
    drafted = drafter.draft(target, cache, [0], anchors)
    ref = drafter.draft_uncached(target, feats[0][: cache.lengths[0]], anchors[0])
    assert (drafted.hidden[0] - ref.hidden[0]).abs().max().item() <= TOL
    assert torch.equal(drafted.tokens[0], ref.tokens[0])


def test_check_target_rejects_other_hidden_size():
    bundle = tiny_random_bundle(seed=0)
    bundle.drafter.check_target(bundle.target)  # the matching target passes
    cfg = dataclasses.replace(bundle.target.config, hidden_size=32, num_attention_heads=2, num_key_value_heads=1)
    other = Transformer(cfg)
    with pytest.raises(ValueError, match="hidden_size"):
        bundle.drafter.check_target(other)
    deeper = Transformer(dataclasses.replace(bundle.target.config, num_hidden_layers=6))
    with pytest.raises(ValueError, match="num_target_layers"):
        bundle.drafter.check_target(deeper)


def test_a_shorter_block_drafts_as_a_drafter_run_at_that_block_size():
    """adaflash drafts shorter blocks under load: the same draft as the drafter run at that block size."""
    target, drafter, cache, seqs, feats, ctx = _cached_vs_uncached(length_head=False)
    slots = list(seqs)
    anchors = [seqs[s][ctx[s]] for s in slots]
    short = drafter.draft(target, cache, slots, anchors, block_length=4)
    assert short.tokens.shape == (2, 3) and short.hidden.shape[:2] == (2, 4)
    full = drafter.draft(target, cache, slots, anchors)
    drafter.config = dataclasses.replace(drafter.config, block_size=4)
    at_four = drafter.draft(target, cache, slots, anchors)
    assert torch.equal(short.tokens, at_four.tokens)
    assert (short.hidden - at_four.hidden).abs().max().item() <= TOL
    assert (short.hidden - full.hidden[:, :4]).abs().max().item() > 1e-4  # the later masks do take part
    with pytest.raises(ValueError, match="block_length"):
        drafter.draft(target, cache, slots, anchors, block_length=5)


# ---- what the published files hold ----------------------------------------------------------------------

MODELS = Path(__file__).resolve().parents[2] / "models" / "default"


def published_names(layers: int, length_head: bool) -> set[str]:
    """The tensor names of tests/fixtures/reference/checkpoint-format.md, transcribed."""
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(layers):
        p = f"layers.{i}."
        names |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"} | {p + f"self_attn.{x}_norm.weight" for x in "qk"}
        names |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
        names |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    if length_head:
        names |= {f"thresh_head_two_model.{x}.{y}" for x in ("down", "res.0", "out") for y in ("weight", "bias")}
    return names


def test_the_published_file_holds_the_published_tensors_and_ours_lie_apart(tmp_path):
    drafter = tiny_random_bundle(seed=6, length_head=True).drafter
    cfg = dataclasses.replace(drafter.config, position_head=True, position_head_dim=8)
    with_position = DFlashDrafter(cfg)
    with_position.load_state_dict(drafter.state_dict(), strict=False)
    with_position.save_pretrained(tmp_path, dtype=torch.float32)

    assert set(load_file(str(tmp_path / "model.safetensors"))) == published_names(cfg.num_hidden_layers, True)
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]  # what loaders glob
    ours = load_file(str(tmp_path / EXTENSION))
    assert ours and all(k.startswith("position_head.") for k in ours)
    loaded = DFlashDrafter.from_pretrained(tmp_path)  # one loader finds both files
    assert loaded.config.position_head
    for name, value in with_position.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name

    drafter.save_pretrained(tmp_path, dtype=torch.float32)  # the same folder without the position head
    assert not (tmp_path / EXTENSION).exists()
    assert not DFlashDrafter.from_pretrained(tmp_path).config.position_head


@pytest.mark.skipif(not (MODELS / "drafter" / "config.json").exists(), reason="models/default not built")
def test_the_default_drafter_publishes_exactly_the_published_tensors():
    cfg = DrafterConfig.from_hf(json.loads((MODELS / "drafter" / "config.json").read_text()))
    names = set(load_file(str(MODELS / "drafter" / "model.safetensors")))
    assert names == published_names(cfg.num_hidden_layers, cfg.length_head)
    assert cfg.length_head and cfg.hf["dflash_config"]["thresh_head_direct_len"] is True


def test_a_length_head_that_predicts_a_threshold_is_refused():
    """Without `thresh_head_direct_len` AdaFlash's head output is a confidence threshold, which no published
    serving path turns into a verify length."""
    raw = json.loads((CONFIGS / "adaflash-qwen3-8b-thresh-head.json").read_text())
    del raw["dflash_config"]["thresh_head_direct_len"]
    with pytest.raises(ValueError, match="thresh_head_direct_len"):
        DrafterConfig.from_hf(raw)


# ---- sliding-window layers --------------------------------------------------------------------------------

def test_sliding_layers_are_read_as_transformers_reads_a_qwen3_config():
    raw = json.loads((CONFIGS / "dflash-qwen3-8b-b16.json").read_text())
    assert [DrafterConfig.from_hf(raw).window(i) for i in range(5)] == [None] * 5
    raw.update(layer_types=["sliding_attention"] * 2 + ["full_attention"] * 3, use_sliding_window=True,
               sliding_window=2048)
    cfg = DrafterConfig.from_hf(raw)
    assert [cfg.window(i) for i in range(5)] == [2048, 2048, None, None, None]
    assert DrafterConfig.from_hf(cfg.to_hf()) == cfg
    # Transformers' Qwen3Config drops the window unless use_sliding_window: the layers attend fully.
    raw["use_sliding_window"] = False
    assert [DrafterConfig.from_hf(raw).window(i) for i in range(5)] == [None] * 5
    # Without layer_types, the layers from max_window_layers on slide (with the default window when unset).
    del raw["layer_types"], raw["sliding_window"]
    raw.update(use_sliding_window=True, max_window_layers=3)
    assert [DrafterConfig.from_hf(raw).window(i) for i in range(5)] == [None] * 3 + [4096] * 2
    raw["layer_types"] = ["full_attention"] * 4
    with pytest.raises(ValueError, match="layer_types"):
        DrafterConfig.from_hf(raw)
