"""KVCache: equivalence with uncached forwards, rollback, fork, ragged batches, hooks, errors."""

import copy
import pickle

import pytest
import torch

from beliefscope.cache import CacheConfig, KVCache, Provenance, Snapshot, Tag
from beliefscope.cache.testing import tiny_cache
from beliefscope.models.testing import tiny_gpt2, tiny_llama

TOL = 1e-4


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def bridge(request):
    return tiny_gpt2() if request.param == "gpt2" else tiny_llama()


def fwd(bridge, toks, **kw):
    with torch.no_grad():
        return bridge(toks, return_type="logits", **kw)


def ref(bridge, toks):  # uncached forward, [batch, seq, vocab]
    return fwd(bridge, toks)


def decode(bridge, cache, toks):  # token-by-token cached decode, returns [1, n, vocab]
    return torch.cat([fwd(bridge, toks[:, i : i + 1], past_key_values=cache) for i in range(toks.shape[1])], 1)


def test_prefill_decode_matches_uncached(bridge):
    toks = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(1))
    cache = KVCache.for_model(bridge, capacity=4)  # forces several geometric growths
    out = torch.cat([fwd(bridge, toks[:, :7], past_key_values=cache), decode(bridge, cache, toks[:, 7:])], 1)
    assert (out - ref(bridge, toks)).abs().max() <= TOL
    assert cache.seq_len == 20 and cache.capacity >= 20
    assert [e.kind for e in cache.recorder.events[:2]] == ["prefill", "decode"]


def test_toy_target_decode_rollback_fork_match_uncached():
    """The trained toy target (checkpoints/coinflip-target, GPT-2, 4 layers) on a real coin-flip
    prompt: cached decode, rollback + re-decode and a fork all equal uncached forwards."""
    from beliefscope.models.load import load_model_cached

    from .helpers import TARGET

    bridge, tok = load_model_cached(TARGET)
    ids = tok("Coin starts heads . Ann flips it . Bob leaves it . Cal flips it . Q : heads or tails ?",
              return_tensors="pt").input_ids  # [1, seq]
    assert ids.shape[1] >= 16
    other = ids[:, 3:7].flip(1)  # [1, 4] different continuation
    cache = KVCache.for_model(bridge, capacity=8)  # grows twice
    out = torch.cat([fwd(bridge, ids[:, :10], past_key_values=cache), decode(bridge, cache, ids[:, 10:])], 1)
    assert (out - ref(bridge, ids)).abs().max() <= TOL
    n = ids.shape[1]
    cache.rollback(n - 3)
    redo = decode(bridge, cache, other)
    assert (redo - ref(bridge, torch.cat([ids[:, : n - 3], other], 1))[:, n - 3 :]).abs().max() <= TOL
    parent = [cache.keys(l).clone() for l in range(cache.config.n_layers)], cache.lengths
    with cache.fork() as branch:
        got = decode(bridge, branch, ids[:, :3])
        full = torch.cat([ids[:, : n - 3], other, ids[:, :3]], 1)
        assert (got - ref(bridge, full)[:, -3:]).abs().max() <= TOL
    assert cache.lengths == parent[1]
    assert all(torch.equal(cache.keys(l), k) for l, k in enumerate(parent[0]))


def test_update_returns_views_of_the_buffers(bridge):
    cache = KVCache.for_model(bridge, capacity=32)
    fwd(bridge, torch.tensor([[1, 2, 3]]), past_key_values=cache)
    k = cache.layers[0].keys
    assert k._base is not None and k.data_ptr() == cache.storage.k[0].data_ptr()
    assert cache.keys(0).data_ptr() == cache.storage.k[0].data_ptr()  # contiguous row -> view


def test_rollback_then_redecode_matches_fresh_run(bridge):
    g = torch.Generator().manual_seed(2)
    toks, other = torch.randint(0, 50, (1, 14), generator=g), torch.randint(0, 50, (1, 5), generator=g)
    cache = KVCache.for_model(bridge, capacity=8)
    fwd(bridge, toks[:, :6], past_key_values=cache)
    decode(bridge, cache, toks[:, 6:])
    cache.rollback(9)
    assert cache.seq_len == 9 and cache.get_seq_length() == 9
    out = decode(bridge, cache, other)
    final = torch.cat([toks[:, :9], other], 1)
    assert (out - ref(bridge, final)[:, 9:]).abs().max() <= TOL
    assert cache.recorder.events[-6] == ("rollback", 0, 9, 14, cache.recorder.events[-6].step)


def test_fork_decodes_independently_parent_bit_identical(bridge):
    g = torch.Generator().manual_seed(3)
    toks, a, b = (torch.randint(0, 50, (1, n), generator=g) for n in (8, 4, 3))
    parent = KVCache.for_model(bridge, capacity=8)
    fwd(bridge, toks, past_key_values=parent)
    before = [(parent.keys(l).clone(), parent.values(l).clone()) for l in range(parent.config.n_layers)]
    nbytes = parent.nbytes
    child = parent.fork()
    assert child.storage is parent.storage and parent.nbytes == nbytes  # zero-copy: same buffers
    out_child = decode(bridge, child, a)
    assert (out_child - ref(bridge, torch.cat([toks, a], 1))[:, 8:]).abs().max() <= TOL
    for l, (k, v) in enumerate(before):
        assert torch.equal(parent.keys(l), k) and torch.equal(parent.values(l), v)
    assert parent.seq_len == 8 and child.seq_len == 12
    out_parent = decode(bridge, parent, b)  # parent writes second: moves to its own buffer
    assert (out_parent - ref(bridge, torch.cat([toks, b], 1))[:, 8:]).abs().max() <= TOL
    out_child2 = decode(bridge, child, b)  # child still sees its own branch
    assert (out_child2 - ref(bridge, torch.cat([toks, a, b], 1))[:, 12:]).abs().max() <= TOL


def test_fork_at_earlier_position_zero_copy_forced_answers(bridge):
    g = torch.Generator().manual_seed(4)
    toks, question = torch.randint(0, 50, (1, 12), generator=g), torch.randint(0, 50, (1, 3), generator=g)
    parent = KVCache.for_model(bridge, capacity=32)
    fwd(bridge, toks, past_key_values=parent)
    before = parent.keys(0).clone()
    for i in (2, 5, 12):
        with parent.fork(at=i) as branch:
            out = fwd(bridge, question, **branch.forward_kwargs(3))
            want = ref(bridge, torch.cat([toks[:, :i], question], 1))[:, i:]
            assert (out - want).abs().max() <= TOL
            assert branch.storage is parent.storage  # never copied the prefix
            assert not any(e.kind == "relocate" for e in branch.recorder.events)
    assert torch.equal(parent.keys(0), before) and parent.capacity == 32 and len(parent.storage.holders) == 1
    # without masks the branch copies its prefix once and stays correct
    branch = parent.fork(at=5)
    out = fwd(bridge, question, past_key_values=branch)
    assert (out - ref(bridge, torch.cat([toks[:, :5], question], 1))[:, 5:]).abs().max() <= TOL
    assert branch.storage is not parent.storage


def _ragged_setup(bridge, seqs, pad=0):
    """Right-padded prefill of ragged rows, then rollback each row to its true length."""
    width = max(len(s) for s in seqs)
    toks = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
    cache = KVCache.for_model(bridge, batch=len(seqs), capacity=8)
    logits = fwd(bridge, toks, past_key_values=cache)
    cache.rollback([len(s) for s in seqs])
    return cache, logits


def test_ragged_batch_matches_unbatched_runs(bridge):
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 50, (n,), generator=g).tolist() for n in (8, 5, 7)]
    cache, _ = _ragged_setup(bridge, seqs)
    assert cache.lengths == [8, 5, 7] and not cache.is_clean
    with pytest.raises(RuntimeError, match="forward_kwargs"):
        fwd(bridge, torch.tensor([[1], [2], [3]]), past_key_values=cache)
    nxt = [torch.randint(0, 50, (4,), generator=g).tolist() for _ in seqs]
    # one decode step, then a 3-token window (verify-sized) per row
    out1 = fwd(bridge, torch.tensor([[n[0]] for n in nxt]), **cache.forward_kwargs(1))
    snap_other = cache.fork()  # same state, for the "others unchanged" comparison
    out3 = fwd(bridge, torch.tensor([n[1:] for n in nxt]), **cache.forward_kwargs(3))
    for r, s in enumerate(seqs):
        full = torch.tensor([s + nxt[r]])
        want = ref(bridge, full)[0, len(s):]
        got = torch.cat([out1[r], out3[r]], 0)
        assert (got - want).abs().max() <= TOL, r
    # roll back row 1 only; decode once more: rows 0 and 2 are unchanged vs the un-rolled-back run
    cache.rollback(cache.lengths[1] - 2, row=1)
    assert cache.lengths == [12, 7, 11]
    step = torch.tensor([[7], [9], [11]])
    out_rb = fwd(bridge, step, **cache.forward_kwargs(1))
    fwd(bridge, torch.tensor([n[1:] for n in nxt]), **snap_other.forward_kwargs(3))
    out_keep = fwd(bridge, step, **snap_other.forward_kwargs(1))
    for r in (0, 2):
        assert torch.allclose(out_rb[r], out_keep[r], atol=1e-5)
        full = torch.tensor([seqs[r] + nxt[r] + [int(step[r])]])
        assert (out_rb[r, -1] - ref(bridge, full)[0, -1]).abs().max() <= TOL
    full1 = torch.tensor([seqs[1] + nxt[1][:2] + [9]])
    assert (out_rb[1, -1] - ref(bridge, full1)[0, -1]).abs().max() <= TOL
    assert cache.position_ids(1).flatten().tolist() == [13, 8, 12]


def test_write_hook_patch_is_causal_and_unpatched_equals_reference(bridge):
    toks = torch.randint(0, 50, (1, 10), generator=torch.Generator().manual_seed(6))
    want = ref(bridge, toks)

    def patch(k, v, *, layer, positions):
        if layer == 0 and (positions == 3).any():
            v = v.clone()
            v[..., (positions[0] == 3).nonzero().item(), :] = 0.0
            return k, v
        return None

    cache = KVCache.for_model(bridge)
    with cache.write_hook(patch):
        out = fwd(bridge, toks, past_key_values=cache)
    assert torch.allclose(out[:, :3], want[:, :3], atol=TOL)  # positions before the patch: unchanged
    assert (out[:, 3:] - want[:, 3:]).abs().amax(-1).min() > 1e-4  # the patched position and all later ones
    assert not cache._hooks
    clean = KVCache.for_model(bridge)
    assert (fwd(bridge, toks, past_key_values=clean) - want).abs().max() <= TOL
    # overwrite(): patching committed entries changes the next token's logits; restoring undoes it
    nxt = torch.tensor([[5]])
    base = fwd(bridge, nxt, past_key_values=clean.fork())
    k0, v0 = clean.keys(0, [3]).clone(), clean.values(0, [3]).clone()
    clean.overwrite(0, [3], k0, torch.zeros_like(v0), provenance=Provenance.VERIFIED)
    assert (fwd(bridge, nxt, past_key_values=clean.fork()) - base).abs().max() > 1e-4
    clean.overwrite(0, [3], k0, v0)
    assert torch.equal(fwd(bridge, nxt, past_key_values=clean.fork()), base)
    assert [e.kind for e in clean.recorder.events[-3:]] == ["fork", "overwrite", "fork"]


def test_overwrite_is_copy_on_write_for_forks(bridge):
    cache = KVCache.for_model(bridge)
    fwd(bridge, torch.tensor([[1, 2, 3, 4]]), past_key_values=cache)
    child = cache.fork()
    v = cache.values(0, [1]).clone()
    child.overwrite(0, [1], child.keys(0, [1]), torch.zeros_like(v))
    assert torch.equal(cache.values(0, [1]), v) and child.values(0, [1]).abs().sum() == 0


def test_provenance_snapshot_diff_keep_rejected(bridge):
    cache = KVCache.for_model(bridge, keep_rejected=True)
    fwd(bridge, torch.tensor([[1, 2, 3, 4]]), past_key_values=cache)
    snap = cache.recorder.snapshot()
    assert isinstance(snap, Snapshot) and snap.lengths == (4,)
    with cache.recorder.tagging(Provenance.DRAFT):
        fwd(bridge, torch.tensor([[5, 6, 7]]), past_key_values=cache)
    cache.recorder.mark(4, 5, Provenance.VERIFIED)
    assert cache.recorder.provenance.tolist() == [0, 0, 0, 0, 2, 1, 1]
    cache.rollback(5)
    span = cache.recorder.rejected[-1]
    assert (span.start, span.end) == (5, 7) and span.provenance.tolist() == [1, 1]
    assert span.keys[0].shape == (cache.config.kv_heads, 2, cache.config.d_head)
    cache.recorder.next_provenance = Provenance.VERIFIED
    fwd(bridge, torch.tensor([[8, 9]]), past_key_values=cache)
    assert cache.recorder.events[-1].kind == "verify" and cache.recorder.provenance.tolist()[-2:] == [2, 2]
    d = cache.recorder.diff(snap)
    assert list(d.added) == [4, 5, 6] and list(d.removed) == [] and d.overwritten == ()
    snap2 = cache.recorder.snapshot()
    cache.rollback(5)
    fwd(bridge, torch.tensor([[3]]), past_key_values=cache)
    d2 = cache.recorder.diff(snap2)
    assert list(d2.removed) == [6] and d2.overwritten == (5,) and list(d2.added) == []
    assert "REJECTED" in cache.recorder.summary() and "rollback" in cache.recorder.summary()
    # the table's counts sit under their own columns: live positions by provenance, rolled-back spans as REJECTED
    head, row = cache.recorder.summary().splitlines()[1:3]
    table = dict(zip(head.split(), row.split()))
    live = cache.recorder.provenance.tolist()
    assert int(table["PREFILL"]) == live.count(0) and int(table["VERIFIED"]) == live.count(2)
    assert int(table["REJECTED"]) == sum(s.end - s.start for s in cache.recorder.rejected) == 4  # two rollbacks of 2
    assert "THOUGHT" not in table  # an owner's tag is not the cache's: no column until a write carries one


def test_an_owners_tag_labels_writes_logs_its_event_and_gets_a_column(bridge):
    note = Tag(9, "NOTE", event="note")
    cache = KVCache.for_model(bridge, keep_rejected=True)
    fwd(bridge, torch.tensor([[1, 2, 3]]), past_key_values=cache)
    with cache.recorder.tagging(note):
        fwd(bridge, torch.tensor([[4, 5]]), past_key_values=cache)
    cache.recorder.next_provenance = note
    fwd(bridge, torch.tensor([[6]]), past_key_values=cache)
    assert cache.recorder.provenance.tolist() == [0, 0, 0, 9, 9, 9]
    assert [e.kind for e in cache.recorder.events] == ["prefill", "note", "note"]
    cache.recorder.mark(1, 2, note)
    head, row = cache.recorder.summary().splitlines()[1:3]
    table = dict(zip(head.split(), row.split()))
    assert int(table["NOTE"]) == 4 and int(table["PREFILL"]) == 2 and int(table["VERIFIED"]) == 0
    cache.rollback(4)
    assert cache.recorder.rejected[-1].provenance.tolist() == [9, 9]
    for other in (cache.fork(), copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert other.recorder.owner_tags == {9: note} and "NOTE" in other.recorder.summary().splitlines()[1]
    assert pickle.loads(pickle.dumps(note)).event == "note"
    with pytest.raises(ValueError, match="reuses code 9"):
        cache.recorder.mark(0, 1, Tag(9, "OTHER", event="other"))
    with pytest.raises(ValueError, match="neither a Provenance"):
        cache.recorder.mark(0, 1, 7)
    for bad, match in (((2, "X", "x"), "must be in"), ((10, "", "x"), "needs a name"),
                       ((10, "X", "rollback"), "own event")):
        with pytest.raises(ValueError, match=match):
            Tag(*bad)


def test_memory_flat_over_1000_decode_rollback_cycles():
    cache = tiny_cache(capacity=16)
    kv = lambda n: torch.randn(1, 2, n, 8)
    for l in range(2):
        cache.update(kv(10), kv(10), l)
    high = cache.nbytes
    for i in range(1000):
        for _ in range(3):
            for l in range(2):
                cache.update(kv(1), kv(1), l)
        cache.rollback(10)
        with cache.fork(at=i % 10) as branch:  # forced-answer pattern
            branch.attention_mask(2)
            for l in range(2):
                branch.update(kv(2), kv(2), l)
    assert cache.nbytes == high and cache.seq_len == 10


def test_rollback_does_no_tensor_work_at_any_length():
    """O(1) rollback, checked structurally (timings belong in benchmarks/cache.py): rolling back runs no
    tensor operation at all, at length 16 or 8192."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    for n in (16, 8192):
        c = tiny_cache(capacity=n + 8)
        for l in range(2):
            c.update(torch.zeros(1, 2, n, 8), torch.zeros(1, 2, n, 8), l)
        for l in range(2):
            c.update(torch.zeros(1, 2, 4, 8), torch.zeros(1, 2, 4, 8), l)
        with Count() as mode:
            c.rollback(n)
        assert mode.ops == [] and c.seq_len == n and c.layout.segments == [[[0, n]]]


def test_lazy_provenance_and_stamps_survive_long_uninspected_runs():
    """Provenance and write stamps are recorded lazily; after 600 writes (past the log's flush bound),
    rollbacks and rewrites, they equal a hand-kept reference."""
    c = tiny_cache(capacity=8)
    kv = lambda n: torch.randn(1, 2, n, 8)
    want: list[int] = []
    for l in range(2):
        c.update(kv(3), kv(3), l)
    want += [int(Provenance.PREFILL)] * 3
    snap = None
    for i in range(600):
        tag = Provenance.DRAFT if i % 3 else Provenance.VERIFIED
        with c.recorder.tagging(tag):
            for l in range(2):
                c.update(kv(1), kv(1), l)
        want.append(int(tag))
        if i % 7 == 6:  # a rejected draft: roll back 2, then the verifier rewrites 1
            c.rollback(c.seq_len - 2)
            del want[-2:]
            if i == 300:
                snap = c.recorder.snapshot()
            c.recorder.next_provenance = Provenance.VERIFIED
            for l in range(2):
                c.update(kv(1), kv(1), l)
            want.append(int(Provenance.VERIFIED))
    assert c.recorder.provenance.tolist() == want
    d = c.recorder.diff(snap)
    assert d.overwritten == () and list(d.added) == list(range(snap.lengths[0], c.seq_len))
    c.rollback(snap.lengths[0] - 1)
    for l in range(2):
        c.update(kv(1), kv(1), l)
    assert c.recorder.diff(snap).overwritten == (snap.lengths[0] - 1,)


def test_errors_name_range_and_fix(bridge):
    cache = KVCache.for_model(bridge)
    fwd(bridge, torch.tensor([[1, 2, 3]]), past_key_values=cache)
    with pytest.raises(ValueError, match=r"valid range is 0\.\.3"):
        cache.rollback(5)
    with pytest.raises(ValueError, match=r"valid range is 0\.\.3"):
        cache.rollback(-1)
    with pytest.raises(IndexError, match="rows 0..0"):
        cache.rollback(0, row=2)
    with pytest.raises(ValueError, match="fork"):
        cache.fork(at=9)
    other = tiny_llama(kv_heads=1) if cache.config.kv_heads != 1 else tiny_gpt2()
    with pytest.raises(ValueError, match="KVCache.for_model"):
        fwd(other, torch.tensor([[1]]), past_key_values=KVCache.for_model(bridge))
    c = tiny_cache()
    with pytest.raises(TypeError, match="dtype mismatch"):
        c.update(torch.zeros(1, 2, 1, 8, dtype=torch.float64), torch.zeros(1, 2, 1, 8, dtype=torch.float64), 0)
    with pytest.raises(TypeError, match="device mismatch"):
        c.update(torch.zeros(1, 2, 1, 8, device="meta"), torch.zeros(1, 2, 1, 8, device="meta"), 0)
    with pytest.raises(ValueError, match="valid layers are 0..1"):
        c.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), 5)
    with pytest.raises(ValueError, match="d_head=8"):
        c.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
    with pytest.raises(IndexError, match="valid positions"):
        cache.keys(0, [7])
    with c.fork() as f:
        pass
    with pytest.raises(RuntimeError, match="closed"):
        f.update(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 8), 0)


def test_config_and_hf_protocol():
    cfg = CacheConfig(n_layers=2)
    assert cfg.capacity > 0
    c = tiny_cache(batch=2)
    for l in range(2):
        c.update(torch.ones(2, 2, 4, 8), torch.ones(2, 2, 4, 8), l)
    c.crop(-1)
    assert c.lengths == [3, 3] and c.get_mask_sizes(2, 0) == (5, 0)
    c.reset()
    assert c.lengths == [0, 0]


def test_a_cache_that_records_nothing_computes_the_same_and_refuses_to_report(bridge):
    """record=False drops the recorder (provenance, events, snapshots): a ragged decode with a rollback and
    a fork still equals uncached forwards; it has no recorder."""
    toks = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(5))
    cache = KVCache.for_model(bridge, capacity=4, record=False)
    assert cache.recorder is None
    out = torch.cat([fwd(bridge, toks[:, :5], past_key_values=cache), decode(bridge, cache, toks[:, 5:9])], 1)
    cache.rollback(7)
    with cache.fork() as branch:
        again = decode(bridge, branch, toks[:, 7:12])
    assert (out - ref(bridge, toks[:, :9])).abs().max() <= TOL
    assert (again - ref(bridge, toks)[:, 7:12]).abs().max() <= TOL
    assert cache.recorder is None
    with pytest.raises(ValueError, match="record=True"):
        cache.overwrite(0, [0], cache.keys(0)[:, :1], cache.values(0)[:, :1], provenance=Provenance.VERIFIED)
    with pytest.raises(ValueError, match="keep_rejected"):
        KVCache.for_model(bridge, record=False, keep_rejected=True)


def test_the_recorder_frees_its_cache_without_the_garbage_collector(bridge):
    """The recorder holds its cache weakly, so a cache's buffers go when its last reference does (a cycle
    would keep GPU memory until gc ran). The recorder of a cache already freed refuses, naming the fix."""
    import gc
    import weakref

    with pytest.raises(ReferenceError, match="keep the cache in a variable"):
        KVCache.for_model(bridge).recorder.summary()  # the temporary cache is gone before summary() runs
    gc.disable()
    try:
        cache = KVCache.for_model(bridge)
        fwd(bridge, torch.tensor([[1, 2, 3]]), past_key_values=cache)
        with cache.recorder.tagging(Provenance.DRAFT):
            fwd(bridge, torch.tensor([[4]]), past_key_values=cache)
        assert cache.recorder.provenance.tolist() == [int(Provenance.PREFILL)] * 3 + [int(Provenance.DRAFT)]
        assert cache.recorder.events == cache.recorder.events and len(cache.recorder.events) == 2
        gone = weakref.ref(cache)
        del cache
        assert gone() is None
    finally:
        gc.enable()


def test_the_cache_forwards_no_recorder_name():
    """What a cache recorded is read from ``cache.recorder`` alone: KVCache defines no ``__getattr__`` and none of
    the recorder's public names, so ``cache.events`` is an AttributeError, not a second door to the same list."""
    from beliefscope.cache.recorder import Recorder

    own = {n for k in KVCache.__mro__ for n in vars(k)}
    public = {n for n in vars(Recorder) if not n.startswith("_")} | {"events", "rejected", "next_provenance"}
    assert "__getattr__" not in own and not public & own, public & own
    c = tiny_cache()
    for layer in range(2):
        c.update(torch.ones(1, 2, 3, 8), torch.ones(1, 2, 3, 8), layer)
    assert [e.kind for e in c.recorder.events] == ["prefill"]
    for name in ("events", "summary", "provenance"):
        with pytest.raises(AttributeError):
            getattr(c, name)
